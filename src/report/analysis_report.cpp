// analyze's results as terminal tables and as the JSON the issue names.
#include <fmt/format.h>

#include <algorithm>

#include "opfuse/report.h"
#include "opfuse/report_html.h"

namespace opfuse::report {
namespace {

using analyze::Analysis;
using analyze::Finding;

std::string ms(double us) { return fmt::format("{:.2f}", us / 1000); }

// Per step when the trace has steps: that is the figure a user compares with step time.
double per_step(const Analysis& a, double us) { return a.trace.steps > 0 ? us / a.trace.steps : us; }

std::string places(const Finding& f, size_t show) {
  std::string out;
  for (size_t i = 0; i < f.locations.size() && i < show; ++i)
    out += fmt::format("{}{} x{}", i ? ", " : "", f.locations[i].where, f.locations[i].count);
  if (f.locations.size() > show) out += fmt::format(" (+{} more)", f.locations.size() - show);
  return out;
}

std::string clip(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(0, n - 3) + "..."; }

// us over the trace's steps, or null when it has none: JSON says per step only where it knows.
nlohmann::json per_step_json(int64_t steps, double us) {
  return steps > 0 ? nlohmann::json(us / static_cast<double>(steps)) : nlohmann::json(nullptr);
}

nlohmann::json finding_json(const Finding& f, analyze::Backend backend, int64_t steps) {
  nlohmann::json locations = nlohmann::json::array();
  for (const auto& l : f.locations)
    locations.push_back({{"location", l.where}, {"count", l.count}, {"ops", l.ops}, {"est_saving_us", l.est_saving_us}});
  return {{"rule", f.rule},
          {"kind", f.kind},
          {"pattern", f.pattern},
          {"replacement", f.replacement},
          {"shape_unknown", f.shape_unknown},
          {"backend", analyze::backend_name(backend)},
          {"occurrences", f.occurrences},
          {"ops", f.ops},
          {"time_us", f.time_us},  // over the whole trace
          {"host_us", f.host_us},
          {"device_us", f.device_us},
          {"est_saving_us", f.est_saving_us},
          {"estimated", f.estimated},
          {"time_us_per_step", per_step_json(steps, f.time_us)},
          {"est_saving_us_per_step", per_step_json(steps, f.est_saving_us)},
          {"estimate", f.estimate},
          {"critical_share", f.critical_share},
          {"saving_on_path_us", f.saving_on_path_us},
          {"locations", locations}};
}

nlohmann::json findings_json(const std::vector<Finding>& findings, analyze::Backend backend, int64_t steps) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& f : findings) out.push_back(finding_json(f, backend, steps));
  return out;
}

nlohmann::json summary_json(const analyze::Summary& s) {
  return {{"path", s.path},
          {"dialect", s.dialect},
          {"backend", analyze::backend_name(s.backend)},
          {"events", s.events},
          {"duration_us", s.duration_us},
          {"steps", s.steps},
          {"steps_from", s.steps_from},
          {"step_us", s.step_us},
          {"plain_step_us", s.plain_step_us > 0 ? nlohmann::json(s.plain_step_us) : nlohmann::json(nullptr)},
          {"profiler_us_per_event", s.profiler_us_per_event},
          {"skipped_events", s.skipped},
          {"overlapping_events", s.overlapping},
          {"warnings", s.warnings}};
}

// Device figures per step when the window's steps are known (HTA's window: every step but the
// last), totals otherwise; `per` in the JSON and the terminal says which.
double device_per(const analyze::DeviceTime& d, double us) { return d.steps > 0 ? us / d.steps : us; }
const char* device_unit(const analyze::DeviceTime& d) { return d.steps > 0 ? "step" : "total"; }
double pct(double us, double window_us) { return window_us > 0 ? 100 * us / window_us : 0; }

// The profiler's own summary lanes, as totals over the trace (they cover every step, the last too).
nlohmann::json overlap_json(const analyze::DeviceTime& d) {
  if (d.overlap_analysis.empty()) return nullptr;
  nlohmann::json lanes = nlohmann::json::array();
  for (const auto& l : d.overlap_analysis)
    lanes.push_back({{"name", l.name}, {"slices", l.slices}, {"total_us", l.total_us}, {"pct", pct(l.total_us, d.overlap_span_us)}});
  return {{"per", "total"}, {"span_us", d.overlap_span_us}, {"lanes", lanes}};
}

nlohmann::json device_json(const analyze::DeviceTime& d) {
  nlohmann::json streams = nlohmann::json::array();
  for (const auto& st : d.streams)
    streams.push_back({{"stream", st.stream}, {"events", st.events}, {"busy_us", device_per(d, st.busy_us)},
                       {"busy_pct", pct(st.busy_us, d.window_us)}});
  const auto& l = d.launch;
  return {{"device", d.device},
          {"per", device_unit(d)},
          {"steps", d.steps},
          {"events", d.events},
          {"events_left_out", d.left_out},
          {"window_us", device_per(d, d.window_us)},
          {"busy_us", device_per(d, d.busy_us)},
          {"idle_us", device_per(d, d.idle_us)},
          {"op_linked_pct", pct(d.op_linked_us, d.summed_us)},
          {"breakdown",
           {{"compute_pct", pct(d.compute_us, d.window_us)},
            {"communication_pct", pct(d.communication_us, d.window_us)},
            {"memory_pct", pct(d.memory_us, d.window_us)},
            {"idle_pct", pct(d.idle_us, d.window_us)}}},
          {"streams", streams},
          {"launch",
           {{"kernels", l.kernels},
            {"launched", l.launched},
            {"delay_median_us", l.delay_median_us},
            {"delay_p90_us", l.delay_p90_us},
            {"shorter_than_launch", l.shorter_than_launch},
            {"small_kernel_us", analyze::LaunchStats::kSmallKernelUs},
            {"small_kernel_time_pct", l.small_kernel_time_pct}}},
          {"overlap_analysis", overlap_json(d)}};
}

// A short block: the window and its breakdown, the busiest streams, how kernels were launched.
std::string format_device(const analyze::DeviceTime& d) {
  const std::string per = d.steps > 0 ? " per step" : " in the trace";
  std::string out = fmt::format("\ndevice    {}: {} ms window{}, {} ms busy ({:.1f}%), {} ms idle ({:.1f}%)",
                                d.device, ms(device_per(d, d.window_us)), per,
                                ms(device_per(d, d.busy_us)), pct(d.busy_us, d.window_us), ms(device_per(d, d.idle_us)),
                                pct(d.idle_us, d.window_us));
  out += fmt::format("\n          compute {:.1f}%, communication {:.1f}%, memcpy/memset {:.1f}% of the window",
                     pct(d.compute_us, d.window_us), pct(d.communication_us, d.window_us), pct(d.memory_us, d.window_us));
  std::string streams;
  for (size_t i = 0; i < d.streams.size() && i < 4; ++i)
    streams += fmt::format("{}{} {} ms", i ? ", " : "", d.streams[i].stream, ms(device_per(d, d.streams[i].busy_us)));
  if (d.streams.size() > 4) streams += fmt::format(" (+{} more)", d.streams.size() - 4);
  out += "\n          streams busy: " + streams;
  const auto& l = d.launch;
  if (l.launched > 0)
    out += fmt::format("\n          launch -> start {:.1f} us median, {:.1f} us p90; {} of {} kernels shorter than their launch",
                       l.delay_median_us, l.delay_p90_us, l.shorter_than_launch, l.launched);
  if (l.kernels > 0)
    out += fmt::format("\n          {:.1f}% of kernel time in kernels under {:.0f} us", l.small_kernel_time_pct,
                       analyze::LaunchStats::kSmallKernelUs);
  if (d.op_linked_us < d.summed_us)
    out += fmt::format("\n          {:.1f}% of device time reached no op (no launch call or flow links it)",
                       pct(d.summed_us - d.op_linked_us, d.summed_us));
  if (d.left_out > 0)
    out += fmt::format("\n          ({} device events launched in the last, cut-short step or with no launch left out)",
                       d.left_out);
  if (!d.overlap_analysis.empty()) {
    std::string lanes;
    for (const auto& l : d.overlap_analysis)
      lanes += fmt::format("{}{} {} ms ({:.1f}%)", lanes.empty() ? "" : ", ", l.name, ms(l.total_us), pct(l.total_us, d.overlap_span_us));
    out += fmt::format("\n          the profiler's Overlap Analysis over the trace ({} ms): {}", ms(d.overlap_span_us), lanes);
  }
  return out;
}

std::string mb(int64_t bytes) { return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6); }

// "forward 120.3 MB (58%), backward …": the first `show` holders, their share of the peak.
std::string holders(const std::vector<analyze::MemoryHolder>& rows, int64_t peak, size_t show) {
  std::string out;
  for (size_t i = 0; i < rows.size() && i < show; ++i)
    out += fmt::format("{}{} {} ({:.0f}%)", i ? ", " : "", rows[i].name, mb(rows[i].bytes),
                       peak > 0 ? 100.0 * static_cast<double>(rows[i].bytes) / static_cast<double>(peak) : 0.0);
  if (rows.size() > show) out += fmt::format(" (+{} more)", rows.size() - show);
  return out;
}

std::string format_memory(const analyze::MemoryTime& d) {
  std::string out = fmt::format("\nmemory    {}: peak {} at {} ms", d.device, mb(d.peak_bytes), ms(d.peak_at_us));
  std::string where;
  if (!d.peak_step.empty()) where = d.peak_step;
  if (!d.peak_op.empty()) where += (where.empty() ? "" : ", ") + d.peak_op;
  if (!where.empty()) out += " (" + where + ")";
  out += fmt::format("; {} allocations, {} frees recorded", d.allocations, d.frees);
  out += "\n          held at the peak: " + holders(d.by_phase, d.peak_bytes, 6);
  out += "\n          by module: " + holders(d.by_module, d.peak_bytes, 4);
  out += "\n          by op: " + holders(d.by_op, d.peak_bytes, 4);
  return out;
}

nlohmann::json memory_json(const analyze::MemoryTime& d) {
  auto rows = [](const std::vector<analyze::MemoryHolder>& list) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : list) out.push_back({{"name", r.name}, {"bytes", r.bytes}, {"blocks", r.blocks}});
    return out;
  };
  nlohmann::json timeline = nlohmann::json::array();
  for (const auto& [us, bytes] : d.timeline) timeline.push_back({us, bytes});
  return {{"device", d.device},          {"peak_bytes", d.peak_bytes}, {"peak_at_us", d.peak_at_us},
          {"peak_step", d.peak_step},    {"peak_op", d.peak_op},       {"allocations", d.allocations},
          {"frees", d.frees},            {"by_phase", rows(d.by_phase)}, {"by_module", rows(d.by_module)},
          {"by_op", rows(d.by_op)},      {"timeline", timeline}};
}

// Where an op sits on the roofline: its FLOPs per byte against the machine's balance (peak
// FLOP/s over peak bytes/s) says what bounds it, and its achieved rate that bound's share.
struct Bound {
  bool known = false, memory = false;
  double flops_per_s = 0, bytes_per_s = 0, intensity = 0, peak_pct = 0;  // peak_pct: −1 without peaks
};
Bound bound_of(const analyze::OpStat& o, const analyze::Roofline& r) {
  Bound b;
  if (o.work_us <= 0 || o.bytes <= 0) return b;
  b.known = true;
  b.flops_per_s = o.flops / (o.work_us * 1e-6);
  b.bytes_per_s = o.bytes / (o.work_us * 1e-6);
  b.intensity = o.flops / o.bytes;
  b.peak_pct = -1;
  if (r.known()) {
    b.memory = b.intensity < r.flops_per_s / r.bytes_per_s;
    b.peak_pct = 100 * (b.memory ? b.bytes_per_s / r.bytes_per_s : b.flops_per_s / r.flops_per_s);
  }
  return b;
}

std::string bound_cell(const Bound& b) {
  if (!b.known) return "";
  if (b.peak_pct < 0) return fmt::format("{:.2g} FLOP/B", b.intensity);
  // Past 100% of the bandwidth measured over 64 MB, an op's data sat in a cache.
  return fmt::format("{} {:.0f}%{}", b.memory ? "memory" : "compute", b.peak_pct, b.memory && b.peak_pct > 100 ? " (cache)" : "");
}

// The path per step, and what it would be with every finding's chains fused.
nlohmann::json critical_path_json(const Analysis& a) {
  const auto& p = a.critical_path;
  if (p.length_us <= 0) return nullptr;
  double saving = 0;
  for (const auto& f : a.findings) saving += f.saving_on_path_us;
  return {{"length_us", p.length_us},
          {"host_us", p.host_us},
          {"device_us", p.device_us},
          {"idle_us", p.idle_us},
          {"per_step_us", per_step_json(a.trace.steps, p.length_us)},
          {"predicted_us", p.length_us - saving},
          {"predicted_per_step_us", per_step_json(a.trace.steps, p.length_us - saving)}};
}

// "critical path: …" and what fusing each finding (and all of them) would leave of it.
std::string format_critical_path(const Analysis& a, size_t show) {
  const auto& p = a.critical_path;
  if (p.length_us <= 0) return "";
  auto share = [&](double us) { return 100 * us / p.length_us; };
  std::string out = fmt::format("\ncritical path: {} ms {} (host ops {:.0f}%, device {:.0f}%, gaps {:.0f}%)\n",
                                ms(per_step(a, p.length_us)), a.trace.steps > 0 ? "per step" : "in the trace",
                                share(p.host_us), share(p.device_us), share(p.idle_us));
  std::string each;
  double saving = 0;
  for (size_t i = 0; i < a.findings.size(); ++i) {
    const Finding& f = a.findings[i];
    saving += f.saving_on_path_us;
    if (i < show && f.saving_on_path_us > 0)
      each += fmt::format("{}{} {} ms ({:+.1f}%, {:.0f}% on the path)", each.empty() ? "" : ", ", f.mined ? f.pattern : f.rule,
                          ms(per_step(a, p.length_us - f.saving_on_path_us)), -share(f.saving_on_path_us),
                          100 * f.critical_share);
  }
  if (!each.empty())
    out += fmt::format("  fused, by the estimates: {}; all {} ms ({:+.1f}%)\n", each, ms(per_step(a, p.length_us - saving)),
                       -share(saving));
  return out;
}

nlohmann::json roofline_json(const analyze::Roofline& r) {
  if (!r.known()) return nullptr;
  return {{"flops_per_s", r.flops_per_s}, {"bytes_per_s", r.bytes_per_s}, {"threads", r.threads}, {"source", r.source}};
}

nlohmann::json ops_json(const Analysis& a) {
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& o : a.ops) {
    nlohmann::json row = {{"name", o.name},
                          {"count", o.count},
                          {"total_us", o.total_us},
                          {"self_us", o.self_us},
                          {"total_us_per_step", per_step_json(a.trace.steps, o.total_us)},
                          {"self_us_per_step", per_step_json(a.trace.steps, o.self_us)},
                          {"mean_us", o.total_us / static_cast<double>(std::max<int64_t>(1, o.count))}};
    row["device_us"] = a.trace.has_device ? nlohmann::json(o.device_us) : nlohmann::json(nullptr);
    row["flops"] = o.flops, row["bytes"] = o.bytes, row["work_us"] = o.work_us;
    const Bound b = bound_of(o, a.roofline);
    row["bound"] = !b.known || b.peak_pct < 0 ? nlohmann::json(nullptr) : nlohmann::json(b.memory ? "memory" : "compute");
    row["peak_pct"] = b.known && b.peak_pct >= 0 ? nlohmann::json(b.peak_pct) : nlohmann::json(nullptr);
    ops.push_back(row);
  }
  return ops;
}

}  // namespace

std::string format_analysis(const Analysis& a, int top, bool all) {
  const auto& s = a.trace;
  std::string out = fmt::format("trace     {}\ndialect   {}, backend {}\nevents    {}", s.path, s.dialect,
                                analyze::backend_name(s.backend), s.events);
  if (s.skipped > 0) out += fmt::format(" ({} skipped as unusable)", s.skipped);
  if (s.overlapping > 0) out += fmt::format(" ({} overlapping slices left out of the op trees)", s.overlapping);
  out += fmt::format("\nspan      {} ms", ms(s.duration_us));
  if (s.steps_from == "given")
    out += fmt::format(", {} step{} (--steps), {} ms per step (the span over them)", s.steps, s.steps == 1 ? "" : "s", ms(s.step_us));
  else if (s.steps_from == "repeated pattern")
    out += fmt::format(", {} steps (no ProfilerStep markers: the top-level ops repeat {} times), {} ms per step (median)",
                       s.steps, s.steps, ms(s.step_us));
  else if (s.steps > 0)
    out += fmt::format(", {} step{}, {} ms per step (median)", s.steps, s.steps == 1 ? "" : "s", ms(s.step_us));
  else
    out += " (no ProfilerStep markers: times are totals over the trace; --steps N divides them)";
  if (s.plain_step_us > 0)
    out += fmt::format("\nprofiler  the step took {} ms unprofiled just before: {:.1f} us per recorded op, left out of "
                       "the savings",
                       ms(s.plain_step_us), s.profiler_us_per_event);
  for (const auto& d : s.devices) out += format_device(d);
  for (const auto& d : a.memory) out += format_memory(d);
  out += "\n";
  for (const auto& w : s.warnings) out += "warning: " + w + "\n";

  std::vector<Row> rows;
  bool roofline = false;  // whether any listed op's work is known
  for (size_t i = 0; i < a.ops.size() && static_cast<int>(i) < top; ++i) roofline |= bound_of(a.ops[i], a.roofline).known;
  for (size_t i = 0; i < a.ops.size() && static_cast<int>(i) < top; ++i) {
    const auto& o = a.ops[i];
    Row r{clip(o.name, 60), std::to_string(o.count), ms(per_step(a, o.total_us)), ms(per_step(a, o.self_us)),
          fmt::format("{:.1f}", o.total_us / static_cast<double>(o.count))};
    if (s.has_device) r.push_back(ms(per_step(a, o.device_us)));
    if (roofline) {
      const Bound b = bound_of(o, a.roofline);
      r.push_back(b.known ? fmt::format("{:.1f}", b.flops_per_s / 1e9) : "");
      r.push_back(b.known ? fmt::format("{:.1f}", b.bytes_per_s / 1e9) : "");
      r.push_back(bound_cell(b));
    }
    rows.push_back(r);
  }
  Row header{"op", "calls", "total ms", "self ms", "mean us"};
  if (s.has_device) header.push_back("device ms");
  if (roofline) header.insert(header.end(), {"GFLOP/s", "GB/s", a.roofline.known() ? "bound, % of peak" : "intensity"});
  out += fmt::format("\ntop {} ops by self time (calls over the trace; ms {})\n", rows.size(),
                     s.steps > 0 ? "per step" : "in the trace") +
         format_table(header, rows);
  if (roofline && a.roofline.known())
    out += fmt::format("roofline: this machine's peaks at {} threads, {:.0f} GFLOP/s and {:.1f} GB/s ({}); an op below "
                       "{:.1f} FLOP per byte is bound by memory, which fusion helps\n",
                       a.roofline.threads, a.roofline.flops_per_s / 1e9, a.roofline.bytes_per_s / 1e9, a.roofline.source,
                       a.roofline.flops_per_s / a.roofline.bytes_per_s);
  else if (roofline)
    out += "roofline: FLOP per byte from the recorded shapes; `--measure` measures this machine's peaks (once, cached) to say "
           "which ops are bound by memory\n";

  // Findings come sorted by saving, so those that save nothing are the tail: a fusion that
  // saves nothing is no advice, and would read as one when it is the only row. One with no
  // estimate (a layout change not timed) is advice, its saving for tune to measure.
  const auto saving = std::find_if(a.findings.begin(), a.findings.end(),
                                   [](const Finding& f) { return f.estimated && f.est_saving_us <= 0; });
  const auto listed = all ? a.findings.size() : static_cast<size_t>(saving - a.findings.begin());
  rows.clear();
  for (size_t i = 0; i < listed && static_cast<int>(i) < top; ++i) {
    const auto& f = a.findings[i];
    rows.push_back({f.mined ? clip(f.pattern, 40) : f.rule, clip(f.replacement, 40), std::to_string(f.occurrences),
                    ms(per_step(a, f.time_us)), f.estimated ? ms(per_step(a, f.est_saving_us)) : "-", f.estimate,
                    places(f, 3)});
  }
  const char* unit = s.steps > 0 ? "per step" : "in the trace";
  out += fmt::format("\nfindings: {} ({} shown; times {})\n", a.findings.size(), rows.size(), unit);
  if (!rows.empty())
    out += format_table({"rule", "replacement", "occurrences", "time ms", "est. saving ms", "estimate", "where"}, rows);
  if (listed < a.findings.size())
    out += fmt::format("{} with no estimated saving not listed (--all lists them)\n", a.findings.size() - listed);
  out += format_critical_path(a, static_cast<size_t>(std::max(0, top)));
  // An unnamed chain's advice is too long for its cell, and is the part to act on.
  for (size_t i = 0; i < listed && static_cast<int>(i) < top; ++i)
    if (a.findings[i].mined) out += fmt::format("unnamed chain {}: {}\n", a.findings[i].pattern, a.findings[i].replacement);
  return out;
}

std::string format_ranks(const analyze::Ranks& r, int top) {
  const char* unit = r.per_step ? "per step (median)" : "per trace (no steps marked)";
  std::vector<Row> rows;
  for (const auto& k : r.ranks)
    rows.push_back({std::to_string(k.rank), ms(k.step_us), std::to_string(k.steps),
                    k.rank == r.slowest_rank ? fmt::format("slowest, {:+.1f}% of the median", r.behind_pct) : "", k.trace});
  std::string out = fmt::format("\n{} ranks: time {}\n", r.ranks.size(), unit) +
                    format_table({"rank", "ms", "steps", "", "trace"}, rows);
  out += fmt::format("slowest rank {}: {:.1f}% behind the median rank\n", r.slowest_rank, r.behind_pct);
  rows.clear();
  for (size_t i = 0; i < r.findings.size() && static_cast<int>(i) < top; ++i) {
    const auto& f = r.findings[i];
    rows.push_back({f.mined ? clip(f.pattern, 40) : f.rule, clip(f.replacement, 40), fmt::format("{}/{}", f.ranks, r.ranks.size()),
                    ms(f.time_us_median), ms(f.saving_us_median), fmt::format("{} .. {}", ms(f.saving_us_min), ms(f.saving_us_max))});
  }
  out += fmt::format("\nfindings across ranks: {} ({} shown; ms {})\n", r.findings.size(), rows.size(),
                     r.per_step ? "per step" : "per trace");
  if (!rows.empty())
    out += format_table({"rule", "replacement", "ranks", "time (median)", "est. saving (median)", "saving min .. max"}, rows);
  return out;
}

void add_ranks(nlohmann::json& analysis, const analyze::Ranks& r) {
  nlohmann::json ranks = nlohmann::json::array(), findings = nlohmann::json::array();
  for (const auto& k : r.ranks)
    ranks.push_back({{"rank", k.rank}, {"trace", k.trace}, {"steps", k.steps}, {"step_us", k.step_us}});
  for (const auto& f : r.findings)
    findings.push_back({{"rule", f.rule}, {"pattern", f.pattern}, {"replacement", f.replacement}, {"mined", f.mined},
                        {"ranks", f.ranks}, {"time_us_median", f.time_us_median}, {"saving_us_median", f.saving_us_median},
                        {"saving_us_min", f.saving_us_min}, {"saving_us_max", f.saving_us_max}});
  analysis["ranks"] = ranks;
  analysis["ranks_per"] = r.per_step ? "step" : "total";
  analysis["slowest_rank"] = {{"rank", r.slowest_rank}, {"behind_pct", r.behind_pct}};
  analysis["rank_findings"] = findings;
}

std::string format_diff(const analyze::Diff& d, const Analysis& after, int top) {
  std::string out = fmt::format("\nbefore -> after: {}\n", after.trace.path);
  if (d.step_us_before > 0 && d.step_us_after > 0)
    out += fmt::format("traced step time  {} -> {} ms ({:+.1f}%)\n", ms(d.step_us_before), ms(d.step_us_after),
                       100 * (d.step_us_after / d.step_us_before - 1));
  std::vector<Row> rows;
  for (size_t i = 0; i < d.ops.size() && static_cast<int>(i) < top; ++i) {
    const auto& c = d.ops[i];
    rows.push_back({clip(c.name, 60), std::to_string(c.count_before), std::to_string(c.count_after),
                    ms(c.total_us_before), ms(c.total_us_after), fmt::format("{:+.2f}", (c.total_us_after - c.total_us_before) / 1000)});
  }
  out += format_table({"op", "count before", "count after", "ms before", "ms after", "change ms"}, rows);
  for (const auto& f : d.vanished) out += fmt::format("gone: {} ({}) x{}\n", f.rule, clip(f.pattern, 50), f.occurrences);
  for (const auto& f : d.appeared) out += fmt::format("new:  {} ({}) x{}\n", f.rule, clip(f.pattern, 50), f.occurrences);
  return out;
}

nlohmann::json analysis_json(const Analysis& a) {
  // "device" is the busiest device (a rank drives one); "devices" lists them all.
  nlohmann::json device = nullptr, devices = nlohmann::json::array();
  for (const auto& d : a.trace.devices) devices.push_back(device_json(d));
  if (!devices.empty()) device = devices.front();
  nlohmann::json memory = nlohmann::json::array();  // per device, largest peak first
  for (const auto& d : a.memory) memory.push_back(memory_json(d));
  return {{"trace", summary_json(a.trace)},
          {"ops", ops_json(a)},
          {"device", device},
          {"devices", devices},
          {"findings", findings_json(a.findings, a.trace.backend, a.trace.steps)},
          {"modules", modules_json(a)},
          {"kernels", kernels_json(a)},
          {"memory", memory},
          {"roofline", roofline_json(a.roofline)},
          {"critical_path", critical_path_json(a)},
          {"diff", nullptr}};
}

void add_diff(nlohmann::json& analysis, const analyze::Diff& d, const Analysis& after) {
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& c : d.ops)
    ops.push_back({{"name", c.name},
                   {"count_before", c.count_before},
                   {"count_after", c.count_after},
                   {"total_us_before", c.total_us_before},
                   {"total_us_after", c.total_us_after}});
  nlohmann::json after_json = analysis_json(after);
  after_json.erase("diff");
  const int64_t steps_before = analysis["trace"].value("steps", int64_t{0});
  analysis["diff"] = {{"after", after_json},
                      {"step_us_before", d.step_us_before},
                      {"step_us_after", d.step_us_after},
                      {"ops", ops},
                      {"findings_vanished", findings_json(d.vanished, after.trace.backend, steps_before)},
                      {"findings_appeared", findings_json(d.appeared, after.trace.backend, after.trace.steps)}};
}

AnalysisOutputs analysis_outputs(const Analysis& before, const Analysis* after, int top, bool all, bool page) {
  AnalysisOutputs out;
  out.text = format_analysis(before, top, all);
  out.json = analysis_json(before);
  if (after != nullptr) {
    out.text += '\n';  // ("\n" + a temporary trips GCC 12's -Wrestrict, a false positive)
    out.text += format_analysis(*after, top, all);
    const analyze::Diff d = analyze::diff(before, *after);
    out.text += format_diff(d, *after, top);
    add_diff(out.json, d, *after);
  }
  if (page) {
    nlohmann::json with_timelines = out.json;
    add_timelines(with_timelines, before, after);
    out.html = analysis_html(with_timelines);
  }
  return out;
}

}  // namespace opfuse::report
