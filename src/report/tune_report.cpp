// tune's results: the terminal summary and report.json.
#include <fmt/format.h>

#include "opfuse/report.h"

namespace opfuse::report {
namespace {

using tune::Replacement;
using tune::TuneResult;

std::string percent(double ratio) { return fmt::format("{:+.1f}%", 100 * (ratio - 1)); }

std::string verdict_cell(const Replacement& r) {
  if (!r.verdict.error.empty()) return "failed to run";
  return fmt::format("{} (rel err {:.1e} f32, {:.1e} f64)", r.verdict.passed ? "yes" : "no", r.verdict.float32_error,
                     r.verdict.float64_error);
}

nlohmann::json side_json(const tune::Side& s) {
  return {{"variant", s.variant},
          {"images_per_sec", s.median},
          {"images_per_sec_rounds", s.images_per_sec},
          {"images_per_sec_min", s.min},
          {"images_per_sec_max", s.max},
          {"ops_per_step", s.ops_per_step},
          {"step_us", s.analysis.trace.step_us},
          {"trace", s.trace}};
}

}  // namespace

std::string format_replacements(const std::vector<Replacement>& replacements) {
  std::vector<Row> rows;
  for (const auto& r : replacements)
    rows.push_back({r.rule, r.rewrite, std::to_string(r.places), verdict_cell(r),
                    r.measured ? fmt::format("{:+.1f}%", 100 * r.gain) : "-", r.kept ? "kept" : "rolled back",
                    r.why});
  return format_table({"rule", "rewrite", "places", "verified", "gain", "result", "why"}, rows);
}

std::string format_tune(const TuneResult& r) {
  const std::string input = !r.input_shape.empty() ? fmt::format("input {}", fmt::join(r.input_shape, "x"))
                            : r.image_size > 0     ? fmt::format("at {}x{}, batch {}", r.image_size, r.image_size, r.batch_size)
                                                   : fmt::format("batch {}", r.batch_size);
  std::string out = fmt::format("\nopfuse tune: {} {}, {} threads, {} rounds of {} steps\n", r.model, input, r.threads,
                                r.rounds, r.steps);
  out += "\nreplacements\n" + format_replacements(r.replacements);
  for (const auto& n : r.not_applied) out += fmt::format("not applied: {}: {}\n", n.rule, n.why);
  if (!r.any_verified) return out + "\nno replacement verified: the model is left as it was\n";

  std::vector<Row> rows;
  rows.push_back({"images/s (median)", fmt::format("{:.1f}", r.baseline.median), fmt::format("{:.1f}", r.tuned.median),
                  percent(r.speedup)});
  rows.push_back({"images/s (range)", fmt::format("{:.1f}-{:.1f}", r.baseline.min, r.baseline.max),
                  fmt::format("{:.1f}-{:.1f}", r.tuned.min, r.tuned.max), ""});
  rows.push_back({"ops per step", fmt::format("{:.0f}", r.baseline.ops_per_step),
                  fmt::format("{:.0f}", r.tuned.ops_per_step),
                  percent(r.tuned.ops_per_step / std::max(1.0, r.baseline.ops_per_step))});
  for (const auto& t : r.rule_times) {
    rows.push_back({fmt::format("{} small ops per step", t.rule), fmt::format("{:.0f}", t.ops_per_step_before),
                    fmt::format("{:.0f}", t.ops_per_step_after), ""});
    rows.push_back({fmt::format("time under {} per step (ms)", t.rule), fmt::format("{:.2f}", t.us_per_step_before / 1000),
                    fmt::format("{:.2f}", t.us_per_step_after / 1000),
                    t.us_per_step_before > 0 ? percent(t.us_per_step_after / t.us_per_step_before) : ""});
  }
  out += "\nbaseline -> tuned\n" + format_table({"", "baseline", "tuned", "change"}, rows);
  out += fmt::format("baseline: {}\ntuned:    {}\n", r.baseline.variant, r.tuned.variant);
  return out;
}

nlohmann::json replacement_json(const Replacement& r) {
  return {{"rule", r.rule},
          {"rewrite", r.rewrite},
          {"places", r.places},
          {"verified", r.verdict.passed},
          {"max_rel_error", r.verdict.float32_error},
          {"float64_rel_error", r.verdict.float64_error},
          {"margin", r.verdict.margin},
          {"worst", r.verdict.worst},
          {"error", r.verdict.error},
          {"measured", r.measured},
          {"gain", r.measured ? nlohmann::json(r.gain) : nlohmann::json(nullptr)},
          {"kept", r.kept},
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
          {"input_shape", r.input_shape},
          {"steps", r.steps},
          {"rounds", r.rounds},
          {"threads", r.threads},
          {"baseline", side_json(r.baseline)},
          {"tuned", side_json(r.tuned)},
          {"speedup", r.speedup},
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
  page["tune"] = tune_json(r);
  return page;
}

}  // namespace opfuse::report
