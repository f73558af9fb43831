// Two analyses → what changed: per op count and time, findings gone or new, step time, and what
// the analysis says the change saved.
#include <algorithm>
#include <cmath>
#include <map>

#include "opfuse/analyze.h"

namespace opfuse::analyze {
namespace {

std::string key(const Finding& f) { return f.mined ? f.pattern : f.rule; }

std::vector<Finding> missing_from(const std::vector<Finding>& from, const std::vector<Finding>& in) {
  std::vector<Finding> out;
  for (const Finding& f : from)
    if (std::none_of(in.begin(), in.end(), [&](const Finding& g) { return key(g) == key(f); })) out.push_back(f);
  return out;
}

// A finding's chains at one place, per step.
struct Here {
  double count = 0, ops = 0, saving_us = 0;
};

std::map<std::pair<std::string, std::string>, Here> by_place(const Analysis& a) {
  std::map<std::pair<std::string, std::string>, Here> out;
  const double steps = static_cast<double>(std::max<int64_t>(1, a.trace.steps));
  for (const Finding& f : a.findings)
    for (const Location& l : f.locations) {
      Here& here = out[{key(f), l.where}];
      here.count += static_cast<double>(l.count) / steps;
      here.ops += static_cast<double>(l.ops) / steps;
      here.saving_us += l.est_saving_us / steps;
    }
  return out;
}

}  // namespace

double saving_between(const Analysis& before, const Analysis& after) {
  const auto now = by_place(after);
  double saved = 0;
  for (const auto& [place, was] : by_place(before)) {
    const auto it = now.find(place);
    const Here is = it == now.end() ? Here{} : it->second;
    if (is.count != was.count || is.ops != was.ops) saved += std::max(0.0, was.saving_us - is.saving_us);
  }
  return saved;
}

double unprofiled_step_us(const Analysis& a) {
  return a.trace.plain_step_us > 0 ? std::min(a.trace.plain_step_us, a.trace.step_us) : a.trace.step_us;
}

Diff diff(const Analysis& before, const Analysis& after) {
  Diff d;
  d.step_us_before = before.trace.step_us;
  d.step_us_after = after.trace.step_us;
  std::map<std::string, OpChange> ops;
  for (const OpStat& s : before.ops) {
    OpChange& c = ops[s.name];
    c.name = s.name, c.count_before = s.count, c.total_us_before = s.total_us;
  }
  for (const OpStat& s : after.ops) {
    OpChange& c = ops[s.name];
    c.name = s.name, c.count_after = s.count, c.total_us_after = s.total_us;
  }
  for (auto& [name, c] : ops) d.ops.push_back(c);
  std::stable_sort(d.ops.begin(), d.ops.end(), [](const OpChange& a, const OpChange& b) {
    return std::abs(a.total_us_after - a.total_us_before) > std::abs(b.total_us_after - b.total_us_before);
  });
  d.vanished = missing_from(before.findings, after.findings);
  d.appeared = missing_from(after.findings, before.findings);
  return d;
}

}  // namespace opfuse::analyze
