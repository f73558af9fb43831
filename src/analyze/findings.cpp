// Findings: each rule's matches and each mined chain tallied into one Finding, with its time,
// estimated saving and locations. The work is done by the op index (op_index.h), rule matching
// (match.h), chain mining (mine.h), the cost model (cost.h) and locations (locate.h).
#include "analyze/findings.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>

#include "analyze/cost.h"
#include "analyze/locate.h"
#include "analyze/match.h"
#include "analyze/mine.h"

namespace opfuse::analyze {
namespace {

using trace::Links;
using trace::Trace;

std::string join(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : separator) + p;
  return out;
}

// A new finding's rule, kind and replacement, from its first match.
void describe(Finding& f, const Match& mt, Backend backend) {
  if (!mt.readings.empty()) {
    f.rule = mt.key;
    f.kind = mt.rule->kind;
    f.shape_unknown = true;
    std::vector<std::string> each;
    for (const auto& [rule, rp] : mt.readings) {
      const auto it = rule->replacement.find(backend);
      each.push_back(fmt::format("{} where {}", it == rule->replacement.end() ? rule->name : it->second,
                                 rp->shapes == Shapes::same ? "the inputs have one shape" : "an input broadcasts"));
    }
    f.replacement = "shape unknown: " + join(each, "; ");
  } else if (mt.rule != nullptr) {
    f.rule = mt.rule->name;
    f.kind = mt.rule->kind;
    const auto r = mt.rule->replacement.find(backend);
    f.replacement = r == mt.rule->replacement.end() ? "" : r->second;
  } else {
    f.rule = "unnamed chain";
    f.kind = "mined";
    f.mined = true;
    f.pattern = mt.key;
  }
}

// "_blocks.2" before "_blocks.10": digits compare as numbers.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ei = i, ej = j;
      while (ei < a.size() && std::isdigit(static_cast<unsigned char>(a[ei]))) ++ei;
      while (ej < b.size() && std::isdigit(static_cast<unsigned char>(b[ej]))) ++ej;
      if (ei - i != ej - j) return ei - i < ej - j;
      if (const int c = a.compare(i, ei - i, b, j, ej - j); c != 0) return c < 0;
      i = ei, j = ej;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i, ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

// Each match's events marked with its finding's final index (findings dropped: −1).
void mark_matches(const std::vector<const std::vector<Match>*>& lists, const std::map<std::string, int32_t>& position,
                  std::vector<int32_t>& finding_of_event) {
  for (const auto* list : lists)
    for (const Match& mt : *list) {
      const auto it = position.find(mt.key);
      if (it == position.end()) continue;
      for (int32_t e : mt.ops) finding_of_event[e] = it->second;
      if (mt.parent >= 0) finding_of_event[mt.parent] = it->second;
    }
}

}  // namespace

std::vector<Finding> find_fusions(const Trace& trace, const Links& links, const std::vector<Rule>& rules,
                                  const Options& options, double profiler_us_per_event,
                                  std::vector<int32_t>* finding_of_event) {
  OpIndex index(trace, links, options.backend, profiler_us_per_event);
  std::vector<char> claimed(trace.events.size(), 0);
  const std::vector<Match> matches = match_rules(index, rules, claimed);
  const std::vector<Match> mined = mine_chains(index, claimed);
  CostModel costs(index, options.measure);
  Locator locator(trace, links);

  struct Tally {
    Finding f;
    std::map<uint32_t, Location> where;             // by place: count and saving (`where` filled last)
    std::vector<std::string> patterns, estimates;   // distinct, in order seen
  };
  std::map<std::string, Tally> by_key;
  auto add_once = [](std::vector<std::string>& list, const std::string& s) {
    if (std::find(list.begin(), list.end(), s) == list.end()) list.push_back(s);
  };
  for (auto* list : {&matches, &mined})
    for (const Match& mt : *list) {
      auto [it, fresh] = by_key.try_emplace(mt.key);
      Tally& tally = it->second;
      Finding& f = tally.f;
      if (fresh) describe(f, mt, options.backend);
      if (fresh && f.mined) f.replacement = chain_advice(index, mt);
      const MatchCost cost = costs.of(mt);
      f.occurrences += 1;
      f.ops += cost.ops;
      f.time_us += cost.recorded_us;
      f.host_us += cost.host_us;
      f.device_us += cost.device_us;
      f.est_saving_us += cost.saving_us();
      if (mt.pattern != nullptr) add_once(tally.patterns, mt.pattern->pattern->text());
      add_once(tally.estimates, cost.how);
      // a layout change is estimated where its convolutions could be timed: any of them will do
      f.estimated = f.occurrences == 1 ? cost.estimated : f.estimated || cost.estimated;
      Location& here = tally.where[locator.location(mt.ops[0])];
      here.count += 1;
      here.ops += cost.ops;
      here.est_saving_us += cost.saving_us();
    }
  std::vector<Finding> out;
  std::vector<std::string> keys;  // per finding in `out`, before sorting
  for (auto& [key, tally] : by_key) {
    Finding& f = tally.f;
    if (f.mined && f.occurrences < options.min_chain_occurrences) continue;
    if (!f.mined) f.pattern = join(tally.patterns, " | ");
    f.estimate = join(tally.estimates, ", ") + (f.estimated && index.less_profiling() ? ", less profiling's cost" : "");
    for (auto& [loc, here] : tally.where) {
      here.where = locator.where(loc);
      f.locations.push_back(std::move(here));
    }
    std::stable_sort(f.locations.begin(), f.locations.end(),
                     [](const Location& a, const Location& b) {
                       return a.count != b.count ? a.count > b.count : natural_less(a.where, b.where);
                     });
    out.push_back(std::move(f));
    keys.push_back(key);
  }
  std::vector<size_t> order(out.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // By saving; a finding with no estimate (a layout change not timed) after those that save, before those that save nothing.
  auto rank = [&](size_t i) { return out[i].est_saving_us > 0 ? 0 : out[i].estimated ? 2 : 1; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return rank(a) != rank(b) ? rank(a) < rank(b) : out[a].est_saving_us > out[b].est_saving_us;
  });
  std::vector<Finding> sorted;
  std::map<std::string, int32_t> position;  // key → place in `sorted`
  for (size_t i : order) {
    position[keys[i]] = static_cast<int32_t>(sorted.size());
    sorted.push_back(std::move(out[i]));
  }
  if (finding_of_event != nullptr) {
    finding_of_event->assign(trace.events.size(), -1);
    mark_matches({&matches, &mined}, position, *finding_of_event);
  }
  return sorted;
}

}  // namespace opfuse::analyze
