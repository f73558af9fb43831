// Time per module scope. opfuse's profiler and record_function write scopes as user annotations
// that enclose their ops, so a scope's time is its slice; Kineto's with_modules writes only a
// "Module Hierarchy" string on each op, so there a module's time is that of its outermost ops.
#include <algorithm>
#include <unordered_map>

#include "opfuse/analyze.h"

namespace opfuse::analyze {
namespace {

using trace::Kind;

// Inclusive and self time per annotation name; self leaves out the annotations nested in it.
std::vector<ModuleTime> from_scopes(const trace::Trace& t, const trace::Links& m) {
  std::unordered_map<int32_t, double> nested;  // per annotation: time of the annotations directly in it
  for (size_t i = 0; i < t.events.size(); ++i)
    if (m.kind[i] == Kind::annotation && m.annotation[i] >= 0) nested[m.annotation[i]] += t.events[i].dur;
  std::vector<int32_t> row(t.strings.size(), -1);  // per name id
  std::vector<ModuleTime> out;
  for (size_t i = 0; i < t.events.size(); ++i) {
    if (m.kind[i] != Kind::annotation) continue;
    const trace::Event& e = t.events[i];
    int32_t& r = row[e.name];
    if (r < 0) r = static_cast<int32_t>(out.size()), out.push_back({t.strings[e.name]});
    const auto it = nested.find(static_cast<int32_t>(i));
    out[r].calls += 1;
    out[r].total_us += e.dur;
    out[r].self_us += std::max(0.0, e.dur - (it == nested.end() ? 0.0 : it->second));
  }
  return out;
}

// Per "Module Hierarchy" string: the ops whose parent op is in another module (or none), so an
// op's children are not counted twice. `calls` counts those outermost ops.
std::vector<ModuleTime> from_hierarchy(const trace::Trace& t, const trace::Links& m) {
  std::vector<int32_t> row(t.strings.size(), -1);
  std::vector<ModuleTime> out;
  for (size_t i = 0; i < t.events.size(); ++i) {
    const trace::Event& e = t.events[i];
    if (m.kind[i] != Kind::op || e.module == 0) continue;
    const int32_t p = m.op_parent[i];
    if (p >= 0 && t.events[p].module == e.module) continue;
    int32_t& r = row[e.module];
    if (r < 0) r = static_cast<int32_t>(out.size()), out.push_back({t.strings[e.module]});
    out[r].calls += 1;
    out[r].total_us += e.dur;
    out[r].self_us += e.dur;
  }
  return out;
}

}  // namespace

std::vector<ModuleTime> module_time(const trace::Trace& t, const trace::Links& m) {
  const bool scopes = std::find(m.kind.begin(), m.kind.end(), Kind::annotation) != m.kind.end();
  std::vector<ModuleTime> out = scopes ? from_scopes(t, m) : from_hierarchy(t, m);
  std::stable_sort(out.begin(), out.end(), [](const ModuleTime& a, const ModuleTime& b) { return a.total_us > b.total_us; });
  return out;
}

}  // namespace opfuse::analyze
