#include <fmt/format.h>

#include "opfuse/report.h"

namespace opfuse::report {

nlohmann::json train_json(const train::TrainResult& r) {
  nlohmann::json j{{"model", r.model},
                   {"parameters", r.parameters},
                   {"swish", r.swish},
                   {"se_gate", r.se_gate},
                   {"bn_swish", r.bn_swish},
                   {"drop_connect", r.drop_connect},
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
                        {"swish / se-gate", r.swish + " / " + r.se_gate},
                        {"bn-swish / drop", r.bn_swish + " / " + r.drop_connect},
                        {"data", r.data},
                        {"batch x image", fmt::format("{} x {}x{}, {} threads", r.batch_size, r.image_size, r.image_size, r.threads)},
                        {"throughput", fmt::format("{:.1f} images/s over {} timed steps", r.images_per_sec, r.steps)},
                        {"step time", fmt::format("{:.1f} ms median, {:.2f} s per 10 steps", r.step_ms_median, r.step_ms_median / 100)},
                        {"loss", fmt::format("{:.4f} -> {:.4f}", r.loss_first, r.loss_last)},
                        {"peak RSS", fmt::format("{:.0f} MB", r.peak_rss_mb)}};
  std::string out = "\n";
  for (const auto& row : rows) out += fmt::format("{:<16} {}\n", row[0], row[1]);
  return out;
}

std::string format_compare(const train::CompareResult& c, int batch_size, int steps) {
  std::vector<Row> rows;
  for (size_t v = 0; v < c.variants.size(); ++v) {
    const auto [lo, hi] = std::minmax_element(c.images_per_sec[v].begin(), c.images_per_sec[v].end());
    rows.push_back({c.variants[v], fmt::format("{:.1f}", c.median[v]), fmt::format("{:.1f}-{:.1f}", *lo, *hi),
                    fmt::format("x{:.3f}", c.ratio[v])});
  }
  return fmt::format("\n{} rounds of {} steps x {} images per variant, alternating\n", c.images_per_sec.front().size(),
                     steps, batch_size) +
         format_table({"variant", "images/s (median)", "range", fmt::format("vs {}", c.variants.front())}, rows);
}

nlohmann::json compare_json(const train::CompareResult& c) {
  nlohmann::json variants = nlohmann::json::array();
  for (size_t v = 0; v < c.variants.size(); ++v)
    variants.push_back({{"variant", c.variants[v]},
                        {"swish", c.variants[v]},  // the key before variants other than Swish kinds
                        {"images_per_sec", c.median[v]},
                        {"rounds", c.images_per_sec[v]},
                        {"ratio", c.ratio[v]}});
  return {{"baseline", c.variants.front()}, {"variants", variants}};
}

}  // namespace opfuse::report
