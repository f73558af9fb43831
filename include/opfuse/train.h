// Training a built-in model and measuring its throughput the way the reference's script does:
// per-step time, data time and loss; steady-state images/s with the warm-up excluded.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "opfuse/measure.h"

namespace opfuse::train {

struct TrainOptions {
  std::string model = "efficientnet-b0";
  std::string swish = "memory-efficient";  // how the model spells Swish: memory-efficient | composite | aten
  std::vector<std::string> fuse;           // rule names of rewrite::efficientnet_fusions(), applied in order
  int image_size = 0;                      // 0: the model's own resolution
  int batch_size = 16;
  int steps = 20;   // timed steps, after the warm-up
  int warmup = 3;
  std::string optimizer = "sgd";  // sgd | opfuse-sgd | rmsprop | adamw | opfuse-adamw (opfuse::optim's)
  double lr = 0.01;
  int threads = 0;  // 0: all cores
  uint64_t seed = 0;
  int num_classes = 1000;
  std::string data;  // image folder; empty: synthetic
  std::string profile;    // write a trace of extra steps after the timed ones (.json or .json.gz)
  int profile_steps = 2;
};

struct StepRecord {
  int step = 0;  // 1-based, warm-up steps included
  bool warmup = false;
  double step_ms = 0, data_ms = 0, loss = 0;
};

struct TrainResult {
  std::string model, swish, data;
  std::vector<std::string> fusions;  // the rules applied
  int64_t parameters = 0;
  int image_size = 0, batch_size = 0, steps = 0, threads = 0;
  double images_per_sec = 0;  // timed steps only
  double step_ms_median = 0;
  double loss_first = 0, loss_last = 0;
  double peak_rss_mb = 0;
  std::vector<StepRecord> records;
  size_t profile_events = 0;  // events written to options.profile
  double profile_step_ms_median = 0;  // the profiled steps, to set beside step_ms_median
  measure::Environment environment;
};

// Throws std::invalid_argument for bad options or data (the message names the file).
// on_step sees every step as it finishes, for progress and per-step lines.
TrainResult train(const TrainOptions& options, const std::function<void(const StepRecord&)>& on_step = {});

// The --fuse and --compare name for every fusion at once.
inline constexpr const char* kAllFusions = "all";

// options as a --compare variant runs them: a Swish spelling replaces options.swish, a fusion's
// rule name is added to options.fuse, kAllFusions fuses everything. Throws std::invalid_argument
// for an unknown variant.
TrainOptions variant_options(const TrainOptions& options, const std::string& variant);

struct CompareResult {
  std::vector<std::string> variants;  // as given to compare, the first the baseline
  int batch_size = 0, steps = 0;
  measure::Measurement timing;         // ms per step, per variant and round
  std::vector<measure::Ratio> speedup;  // the baseline's step time over each variant's, paired rounds
  measure::Environment environment;
};

// Interleaves the variants in one process (measure::interleave), `rounds` rounds of
// options.steps timed steps each after options.warmup, every model built from the same seed.
CompareResult compare(const TrainOptions& options, const std::vector<std::string>& variants, int rounds,
                      const std::function<void(int round, int rounds)>& on_round = {});

struct OverheadResult {
  double plain_ms = 0, profiled_ms = 0;  // median step time
  double overhead = 0;                   // profiled / plain − 1, paired rounds
  measure::Interval overhead_ci;
  size_t events_per_step = 0;
  measure::Machine machine;
};

// The profiler's cost: one model, rounds interleaving options.steps plain and options.steps
// profiled steps (shapes recorded, nothing written).
OverheadResult profiler_overhead(const TrainOptions& options, int rounds);

double peak_rss_mb();

}  // namespace opfuse::train
