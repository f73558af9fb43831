// tune's results: the terminal summary and report.json.
#include <algorithm>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "opfuse/report.h"

namespace opfuse::report {
namespace {

using tune::Replacement;
using tune::TuneResult;

std::string percent(double ratio) { return fmt::format("{:+.1f}%", 100 * (ratio - 1)); }

std::string verdict_cell(const Replacement& r) {
  if (!r.verdict.error.empty()) return "failed to run";
  if (!r.verdict.float64_skipped.empty())
    return fmt::format("{} (rel err {:.1e} f32; f32 only)", r.verdict.passed ? "yes" : "no", r.verdict.float32_error);
  return fmt::format("{} (rel err {:.1e} f32, {:.1e} f64)", r.verdict.passed ? "yes" : "no", r.verdict.float32_error,
                     r.verdict.float64_error);
}

// The rank with the longest own step time, or -1 for a lone process.
int slowest_rank(const tune::Side& s) {
  if (s.rank_step_ms.empty()) return -1;
  return static_cast<int>(std::max_element(s.rank_step_ms.begin(), s.rank_step_ms.end()) - s.rank_step_ms.begin());
}

nlohmann::json peak_memory_json(const analyze::Analysis& a) {
  const int64_t peak = analyze::cpu_peak_bytes(a.memory);
  return peak >= 0 ? nlohmann::json(peak) : nlohmann::json(nullptr);
}
std::string mb(int64_t bytes) { return fmt::format("{:.1f}", static_cast<double>(bytes) / 1e6); }

nlohmann::json side_json(const tune::Side& s) {
  nlohmann::json j = {{"variant", s.variant},
          {"step_ms", s.step_ms.median},
          {"step_ms_ci", interval_json(s.step_ms.ci)},
          {"step_ms_rounds", s.step_ms.ms},
          {"images_per_sec", s.images_per_sec},
          {"images_per_sec_ci", interval_json(s.images_per_sec_ci)},
          {"ops_per_step", s.ops_per_step},
          {"peak_memory_bytes", peak_memory_json(s.analysis)},
          {"profiled_step_ms", s.analysis.trace.step_us / 1000},
          {"trace", s.trace}};
  if (!s.rank_step_ms.empty()) j["rank_step_ms"] = s.rank_step_ms, j["slowest_rank"] = slowest_rank(s);
  return j;
}

// Each rank's own median step time before and after; a step takes as long as the slowest rank.
std::string format_ranks(const TuneResult& r) {
  if (r.baseline.rank_step_ms.empty()) return "";
  std::vector<Row> rows;
  const int slow_before = slowest_rank(r.baseline), slow_after = slowest_rank(r.tuned);
  for (size_t k = 0; k < r.baseline.rank_step_ms.size(); ++k) {
    auto cell = [k](const tune::Side& s, int slowest) {
      if (k >= s.rank_step_ms.size()) return std::string("-");
      return fmt::format("{:.2f}{}", s.rank_step_ms[k], static_cast<int>(k) == slowest ? " (slowest)" : "");
    };
    rows.push_back({std::to_string(k), cell(r.baseline, slow_before), cell(r.tuned, slow_after)});
  }
  return "\nranks: each one's own median step time, ms (a step lasts as long as the slowest)\n" +
         format_table({"rank", "baseline", "tuned"}, rows);
}

std::string gain_cell(const Replacement& r) { return r.measured ? measure::format_gain(r.gain, r.gain_ci) : "-"; }

std::string result_cell(const Replacement& r) {
  if (!r.measured) return r.kept ? "kept" : "rolled back";
  if (r.kept_as_group) return "kept (group)";
  return r.kept && r.decision != tune::Decision::kept ? "kept (inconclusive)" : tune::decision_name(r.decision);
}

std::string ms_cell(const measure::Series& s) { return fmt::format("{:.2f} {}", s.median, measure::format_interval(s.ci, "{:.2f}")); }

}  // namespace

std::string format_replacements(const std::vector<Replacement>& replacements) {
  std::vector<Row> rows;
  for (const auto& r : replacements)
    rows.push_back({r.rule, r.rewrite, std::to_string(r.places), verdict_cell(r), gain_cell(r),
                    r.measured ? std::to_string(r.rounds) : "-", result_cell(r), r.why});
  return format_table({"rule", "rewrite", "places", "verified", "gain [95% CI]", "rounds", "result", "why"}, rows);
}

// Where the analysis' estimate lies outside what was measured: the estimate (or the cost model
// behind it) is off for this model, worth knowing before trusting the next estimate.
std::string estimate_notes(const std::vector<Replacement>& replacements) {
  std::string out;
  for (const auto& r : replacements)
    if (r.estimate_disagrees)
      out += fmt::format("note: {}: the analysis estimated {:+.1f}%, outside the measured interval {}\n", r.rule,
                         100 * r.estimated_gain, measure::format_interval({100 * r.gain_ci.lo, 100 * r.gain_ci.hi}, "{:+.1f}%"));
  // said once: the reason is the model's, the same for every rule
  const auto f32_only = std::find_if(replacements.begin(), replacements.end(),
                                     [](const Replacement& r) { return !r.verdict.float64_skipped.empty(); });
  if (f32_only != replacements.end())
    out += fmt::format("note: verified in float32 only ({}): a small error a float64 run would show may pass\n",
                       f32_only->verdict.float64_skipped);
  return out;
}

std::string format_tune(const TuneResult& r) {
  const std::string input = r.inputs.size() > 1    ? fmt::format("inputs {}", fmt::join(r.inputs, " "))
                            : !r.input_shape.empty() ? fmt::format("input {}", fmt::join(r.input_shape, "x"))
                            : r.image_size > 0     ? fmt::format("at {}x{}, batch {}", r.image_size, r.image_size, r.batch_size)
                                                   : fmt::format("batch {}", r.batch_size);
  const std::string ranks = r.ranks > 1 ? fmt::format(" over {} ranks", r.ranks) : "";
  std::string out = fmt::format("\nopfuse tune: {} {}{}, {} threads, {} rounds of {} steps (more while a gain is unclear)\n",
                                r.model, input, ranks, r.threads, r.rounds, r.steps);
  out += format_environment(r.environment) + format_machine(r.machine);
  out += "\nreplacements\n" + format_replacements(r.replacements) + estimate_notes(r.replacements);
  for (const auto& n : r.not_applied) out += fmt::format("not applied: {}: {}\n", n.rule, n.why);
  if (!r.any_verified)
    return out + fmt::format("\nno replacement verified: the model is left as it was; it runs {} ms per step "
                             "({:.1f} {}/s)\n",
                             ms_cell(r.baseline.step_ms), r.baseline.images_per_sec, r.sample_unit) +
           format_ranks(r);

  std::vector<Row> rows;
  rows.push_back({"step time, ms (median [95% CI])", ms_cell(r.baseline.step_ms), ms_cell(r.tuned.step_ms),
                  measure::format_gain(1 / r.speedup - 1, {1 / r.speedup_ci.hi - 1, 1 / r.speedup_ci.lo - 1})});
  if (r.predicted_step_ms > 0)
    rows.push_back({"step time the critical path predicts, ms", "", fmt::format("{:.2f}", r.predicted_step_ms),
                    fmt::format("measured {:+.1f}% from it", 100 * (r.tuned.step_ms.median / r.predicted_step_ms - 1))});
  else if (!r.not_predicted.empty())
    rows.push_back({"step time the critical path predicts, ms", "", "-", "not predicted: " + r.not_predicted});
  rows.push_back({fmt::format("{}/s (from step time)", r.sample_unit), fmt::format("{:.1f}", r.baseline.images_per_sec),
                  fmt::format("{:.1f}", r.tuned.images_per_sec), measure::format_gain(r.speedup - 1, {r.speedup_ci.lo - 1, r.speedup_ci.hi - 1})});
  rows.push_back({"ops per step", fmt::format("{:.0f}", r.baseline.ops_per_step),
                  fmt::format("{:.0f}", r.tuned.ops_per_step),
                  percent(r.tuned.ops_per_step / std::max(1.0, r.baseline.ops_per_step))});
  const int64_t peak_before = analyze::cpu_peak_bytes(r.baseline.analysis.memory),
                peak_after = analyze::cpu_peak_bytes(r.tuned.analysis.memory);
  if (peak_before > 0 && peak_after >= 0)
    rows.push_back({"peak memory, MB (profiled)", mb(peak_before), mb(peak_after),
                    percent(static_cast<double>(peak_after) / static_cast<double>(peak_before))});
  for (const auto& t : r.rule_times) {
    rows.push_back({fmt::format("{} small ops per step", t.rule), fmt::format("{:.0f}", t.ops_per_step_before),
                    fmt::format("{:.0f}", t.ops_per_step_after), ""});
    rows.push_back({fmt::format("time under {} per step (ms, profiled)", t.rule), fmt::format("{:.2f}", t.us_per_step_before / 1000),
                    fmt::format("{:.2f}", t.us_per_step_after / 1000),
                    t.us_per_step_before > 0 ? percent(t.us_per_step_after / t.us_per_step_before) : ""});
  }
  out += "\nbaseline -> tuned (changes from paired rounds)\n" + format_table({"", "baseline", "tuned", "change"}, rows);
  for (const auto& rep : r.replacements)
    if (rep.kept && rep.peak_memory_bytes >= 0 && peak_before > 0)
      out += fmt::format("memory: with {} alone, peak {} MB -> {} MB ({}), profiled\n", rep.rule, mb(peak_before),
                         mb(rep.peak_memory_bytes), percent(static_cast<double>(rep.peak_memory_bytes) / static_cast<double>(peak_before)));
  out += format_ranks(r);
  out += fmt::format("baseline: {}\ntuned:    {}\n", r.baseline.variant, r.tuned.variant);
  return out;
}

nlohmann::json replacement_json(const Replacement& r) {
  return {{"rule", r.rule},
          {"rewrite", r.rewrite},
          {"places", r.places},
          {"verified", r.verdict.passed},
          {"max_rel_error", r.verdict.float32_error},
          {"float64_rel_error", r.verdict.float64_skipped.empty() ? nlohmann::json(r.verdict.float64_error)
                                                                  : nlohmann::json(nullptr)},
          {"float64_skipped", r.verdict.float64_skipped},
          {"margin", r.verdict.margin},
          {"worst", r.verdict.worst},
          {"error", r.verdict.error},
          {"measured", r.measured},
          {"gain", r.measured ? nlohmann::json(r.gain) : nlohmann::json(nullptr)},
          {"gain_ci", r.measured ? interval_json(r.gain_ci) : nlohmann::json(nullptr)},
          {"rounds", r.rounds},
          {"decision", r.measured ? tune::decision_name(r.decision) : nlohmann::json(nullptr)},
          {"estimated_gain", r.has_estimate ? nlohmann::json(r.estimated_gain) : nlohmann::json(nullptr)},
          {"estimate_disagrees", r.estimate_disagrees},
          {"kept", r.kept},
          {"kept_as_group", r.kept_as_group},
          {"peak_memory_bytes", r.peak_memory_bytes >= 0 ? nlohmann::json(r.peak_memory_bytes) : nlohmann::json(nullptr)},
          {"memory_trace", r.memory_trace},
          {"why", r.why}};
}

nlohmann::json tune_json(const TuneResult& r) {
  nlohmann::json replacements = nlohmann::json::array(), rejected = nlohmann::json::array();
  for (const auto& rep : r.replacements) {
    replacements.push_back(replacement_json(rep));
    if (!rep.kept) rejected.push_back({{"rule", rep.rule}, {"rewrite", rep.rewrite}, {"why", rep.why}});
  }
  for (const auto& n : r.not_applied) rejected.push_back({{"rule", n.rule}, {"rewrite", nullptr}, {"why", n.why}});
  nlohmann::json times = nlohmann::json::array();
  for (const auto& t : r.rule_times)
    times.push_back({{"rule", t.rule},
                     {"ops_per_step_before", t.ops_per_step_before},
                     {"ops_per_step_after", t.ops_per_step_after},
                     {"us_per_step_before", t.us_per_step_before},
                     {"us_per_step_after", t.us_per_step_after}});
  return {{"model", r.model},
          {"image_size", r.image_size},
          {"batch_size", r.batch_size},
          {"sample_unit", r.sample_unit},
          {"input_shape", r.input_shape},
          {"inputs", r.inputs},
          {"steps", r.steps},
          {"rounds", r.rounds},
          {"threads", r.threads},
          {"ranks", r.ranks},
          {"baseline", side_json(r.baseline)},
          {"tuned", side_json(r.tuned)},
          {"speedup", r.speedup},
          {"predicted_step_ms", r.predicted_step_ms > 0 ? nlohmann::json(r.predicted_step_ms) : nlohmann::json(nullptr)},
          {"not_predicted", r.not_predicted.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.not_predicted)},
          {"speedup_ci", interval_json(r.speedup_ci)},
          {"machine", machine_json(r.machine)},
          {"environment", environment_json(r.environment)},
          {"replacements", replacements},
          {"rejected", rejected},
          {"rule_times", times},
          {"tolerance", {{"float32", tune::kFloat32Tolerance},
                         {"float64", tune::kFloat64Tolerance},
                         {"rounding_nudge", tune::kRoundingNudge},
                         {"rounding_factor", tune::kRoundingFactor}}},
          {"saved", r.saved}};
}

nlohmann::json tune_page(const TuneResult& r) {
  nlohmann::json page = analysis_json(r.baseline.analysis);
  if (r.any_verified) add_diff(page, r.diff, r.tuned.analysis);
  add_timelines(page, r.baseline.analysis, r.any_verified ? &r.tuned.analysis : nullptr);
  page["tune"] = tune_json(r);
  return page;
}

}  // namespace opfuse::report
