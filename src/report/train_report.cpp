#include <fmt/format.h>
#include <fmt/ranges.h>

#include "opfuse/report.h"

namespace opfuse::report {

nlohmann::json train_json(const train::TrainResult& r) {
  nlohmann::json j{{"model", r.model},
                   {"parameters", r.parameters},
                   {"swish", r.swish},
                   {"fusions", r.fusions},
                   {"data", r.data},
                   {"image_size", r.image_size},
                   {"batch_size", r.batch_size},
                   {"steps", r.steps},
                   {"threads", r.threads},
                   {"images_per_sec", r.images_per_sec},
                   {"step_ms_median", r.step_ms_median},
                   {"loss_first", r.loss_first},
                   {"loss_last", r.loss_last},
                   {"peak_rss_mb", r.peak_rss_mb}};
  j["environment"] = environment_json(r.environment);
  if (r.profile_events > 0) j["profile"] = {{"events", r.profile_events}, {"step_ms_median", r.profile_step_ms_median}};
  return j;
}

std::string format_step(const train::StepRecord& s, int total, double mean_step_ms, double mean_data_ms,
                        double mean_loss) {
  return fmt::format("Step: [{:>{}}/{}]{}  Time {:7.3f} ({:7.3f})  Data {:7.3f} ({:7.3f})  Loss {:.4e} ({:.4e})\n",
                     s.step, std::to_string(total).size(), total, s.warmup ? " warm-up" : "        ",
                     s.step_ms / 1000, mean_step_ms / 1000, s.data_ms / 1000, mean_data_ms / 1000, s.loss, mean_loss);
}

std::string format_train_summary(const train::TrainResult& r) {
  std::vector<Row> rows{{"model", fmt::format("{} ({} parameters)", r.model, r.parameters)},
                        {"swish", r.swish},
                        {"fusions", r.fusions.empty() ? "none" : fmt::format("{}", fmt::join(r.fusions, ", "))},
                        {"data", r.data},
                        {"batch x image", fmt::format("{} x {}x{}, {} threads", r.batch_size, r.image_size, r.image_size, r.threads)},
                        {"throughput", fmt::format("{:.1f} images/s over {} timed steps", r.images_per_sec, r.steps)},
                        {"step time", fmt::format("{:.1f} ms median, {:.2f} s per 10 steps", r.step_ms_median, r.step_ms_median / 100)},
                        {"loss", fmt::format("{:.4f} -> {:.4f}", r.loss_first, r.loss_last)},
                        {"peak RSS", fmt::format("{:.0f} MB", r.peak_rss_mb)}};
  std::string out = "\n";
  for (const auto& row : rows) out += fmt::format("{:<16} {}\n", row[0], row[1]);
  return out + format_environment(r.environment);
}

std::string format_compare(const train::CompareResult& c) {
  std::vector<Row> rows;
  const double per_s = 1000.0 * c.batch_size;
  for (size_t v = 0; v < c.variants.size(); ++v) {
    const measure::Series& s = c.timing.variants[v];
    const measure::Ratio& r = c.speedup[v];
    rows.push_back({c.variants[v], fmt::format("{:.1f} {}", s.median, measure::format_interval(s.ci, "{:.1f}")),
                    fmt::format("{:.1f}", per_s / s.median),
                    v == 0 ? "" : measure::format_gain(r.estimate - 1, {r.ci.lo - 1, r.ci.hi - 1})});
  }
  return fmt::format("\n{} rounds of {} steps x {} images per variant, interleaved\n", c.timing.rounds, c.steps,
                     c.batch_size) +
         format_environment(c.environment) + format_machine(c.timing.machine) + "\n" +
         format_table({"variant", "step ms (median [95% CI])", "images/s (from step time)",
                       fmt::format("images/s vs {} (paired rounds)", c.variants.front())},
                      rows);
}

nlohmann::json compare_json(const train::CompareResult& c) {
  nlohmann::json variants = nlohmann::json::array();
  for (size_t v = 0; v < c.variants.size(); ++v) {
    const measure::Series& s = c.timing.variants[v];
    variants.push_back({{"variant", c.variants[v]},
                        {"swish", c.variants[v]},  // the key before variants other than Swish kinds
                        {"step_ms", s.median},
                        {"step_ms_ci", interval_json(s.ci)},
                        {"step_ms_rounds", s.ms},
                        {"images_per_sec", 1000.0 * c.batch_size / s.median},
                        {"speedup", c.speedup[v].estimate},
                        {"speedup_ci", interval_json(c.speedup[v].ci)}});
  }
  return {{"baseline", c.variants.front()},
          {"batch_size", c.batch_size},
          {"steps", c.steps},
          {"rounds", c.timing.rounds},
          {"variants", variants},
          {"machine", machine_json(c.timing.machine)},
          {"environment", environment_json(c.environment)}};
}

}  // namespace opfuse::report
