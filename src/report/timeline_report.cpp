// The page's views that tables do not give: one step as a timeline, time per module, kernel time.
#include <cmath>

#include "opfuse/report.h"

namespace opfuse::report {
namespace {

// Hundredths of a µs are below any profiler's resolution; fewer digits keep the page small.
double rounded(double us) { return std::round(us * 100) / 100; }

double per_step(const analyze::Analysis& a, double us) { return a.trace.steps > 0 ? us / a.trace.steps : us; }
const char* unit(const analyze::Analysis& a) { return a.trace.steps > 0 ? "step" : "total"; }

constexpr size_t kTopRows = 50;

}  // namespace

nlohmann::json modules_json(const analyze::Analysis& a) {
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < a.modules.size() && i < kTopRows; ++i) {
    const auto& m = a.modules[i];
    rows.push_back({{"module", m.module}, {"calls", m.calls}, {"total_us", per_step(a, m.total_us)},
                    {"self_us", per_step(a, m.self_us)}});
  }
  return {{"per", unit(a)}, {"count", a.modules.size()}, {"top", rows}};
}

nlohmann::json kernels_json(const analyze::Analysis& a) {
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < a.kernels.size() && i < kTopRows; ++i) {
    const auto& k = a.kernels[i];
    rows.push_back({{"name", k.name}, {"count", k.count}, {"total_us", per_step(a, k.total_us)}});
  }
  return {{"per", unit(a)}, {"count", a.kernels.size()}, {"top", rows}};
}

// Slices as arrays [lane, row, start_us, dur_us, name, module, finding] rather than objects:
// thirty thousand of them are a third the size, and the page reads them by position.
nlohmann::json timeline_json(const analyze::Timeline& t) {
  nlohmann::json lanes = nlohmann::json::array(), slices = nlohmann::json::array();
  for (const auto& l : t.lanes) lanes.push_back({{"name", l.name}, {"device", l.device}, {"rows", l.rows}});
  for (const auto& s : t.slices)
    slices.push_back({s.lane, s.row, rounded(s.start_us), rounded(s.dur_us), s.name, s.module, s.finding});
  return {{"step", t.step},
          {"steps", t.steps},
          {"begin_us", t.begin_us},
          {"dur_us", t.dur_us},
          {"lanes", lanes},
          {"names", t.names},
          {"slices", slices},
          {"slices_left_out", t.left_out},
          {"max_slices", analyze::Timeline::kMaxSlices}};
}

void add_timelines(nlohmann::json& page, const analyze::Analysis& before, const analyze::Analysis* after) {
  if (before.timeline) page["timeline"] = timeline_json(*before.timeline);
  if (after != nullptr && after->timeline && page.contains("diff") && page["diff"].is_object())
    page["diff"]["after"]["timeline"] = timeline_json(*after->timeline);
}

}  // namespace opfuse::report
