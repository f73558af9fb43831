// Two analyses → what changed: per op count and time, findings gone or new, step time.
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

}  // namespace

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
