// bench-op: forward+backward of the reference composite, ATen and the opfuse op, interleaved in
// one process (measure::interleave), each ratio from paired rounds — an absolute time on a shared
// 2-core machine means little, the ratio within one run does.
#include <ATen/Parallel.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <thread>

#include "opfuse/bench.h"
#include "opfuse/measure.h"
#include "opfuse/op_spec.h"
#include "opfuse/stats.h"
#include "opfuse/ops.h"

namespace opfuse::bench {
namespace {

using Clock = std::chrono::steady_clock;

// A case as the op's spec makes it (include/opfuse/op_spec.h), at bench-op's size.
using Variant = OpVariant;
using Case = OpCase;

Case make_case(const OpBenchOptions& options) {
  const OpSpec* spec = find_op_spec(options.op);
  if (spec == nullptr)
    throw std::invalid_argument(
        fmt::format("unknown op '{}' (expected {})", options.op, fmt::join(benchmarked_ops(), ", ")));
  OpArgs args;
  args.shapes = spec->bench_shapes({options.numel, options.seq_len, options.head_dim});
  args.dropout_p = options.dropout_p;
  return spec->make(args);
}

double elapsed_ms(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void clear_grads(const Case& c) {
  for (const auto& leaf : c.leaves) leaf.mutable_grad() = at::Tensor();
}

// One forward+backward from fresh leaves, or the variant's step.
void run_variant(const Case& c, const Variant& v) {
  if (v.step) return v.step();
  v.forward().backward(c.grad_output);
}

double time_step(const Case& c, const Variant& v) {
  clear_grads(c);
  const auto start = Clock::now();
  run_variant(c, v);
  return elapsed_ms(start);
}

// Follows the bytes torch's CPU allocator holds: c10 reports each allocation and free to the
// memory hook installed on the thread (the profiler's mechanism; the autograd engine carries
// it into the backward).
class PeakMemory : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void*, int64_t bytes, size_t, size_t, c10::Device) override {
    held_ += bytes;
    peak_ = std::max(peak_, held_);
  }
  bool memoryProfilingEnabled() const override { return true; }
  int64_t peak() const { return peak_; }

 private:
  int64_t held_ = 0, peak_ = 0;
};

int64_t peak_bytes(const Case& c, const Variant& v) {
  clear_grads(c);
  auto memory = std::make_shared<PeakMemory>();
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, memory);
    run_variant(c, v);
  }
  return memory->peak();
}

// Five calls per round: a call that stalls (see measure::Options::calls) is not the round's figure.
constexpr int kCallsPerRound = 5;

// A call repeats a short variant until it lasts about this long: a 0.2 ms op timed once per call
// met the host's stalls and timer ticks unaveraged (rms_norm's rounds spread 1.40×).
constexpr double kMinCallMs = 5;

// A Run of enough repetitions of `once` (returning its ms) to last kMinCallMs; its ms per repetition.
measure::Run repeated_to_last(const std::function<double()>& once) {
  once();  // first-call costs (lazy initialisation, cold caches) are not the op's
  const double ms = std::min(once(), once());
  const int reps = static_cast<int>(std::clamp(std::ceil(kMinCallMs / std::max(ms, 1e-3)), 1.0, 1000.0));
  return measure::per_step(once, reps);
}

std::string shape_string(at::IntArrayRef sizes) {
  return fmt::format("[{}]", fmt::join(sizes, ", "));
}

}  // namespace

const std::vector<std::string>& benchmarked_ops() {
  static const std::vector<std::string> ops = [] {
    std::vector<std::string> names;
    for (const OpSpec& spec : op_specs()) names.push_back(spec.name);
    return names;
  }();
  return ops;
}

OpBenchResult bench_op(const OpBenchOptions& options) {
  if (options.numel < 0) throw std::invalid_argument("--numel must be positive");
  if (options.rounds < 1) throw std::invalid_argument("--rounds must be at least 1");
  const int threads = options.threads > 0 ? options.threads
                                          : static_cast<int>(std::thread::hardware_concurrency());
  at::set_num_threads(threads);
  torch::manual_seed(0);
  const Case c = make_case(options);

  // The copy runs as a fourth variant, so memory's bandwidth is measured under the same
  // conditions, and moves as many bytes as the op must (half read, half written): a copy of one
  // input would find a nearer cache than the op's data does (swiglu's 8 tensors of gate's size
  // spill the L3 its 2 would fit).
  const at::Tensor src = torch::randn({std::max<int64_t>(1, std::llround(c.bytes_per_step / (2 * sizeof(float))))});
  at::Tensor dst = torch::empty_like(src);
  measure::keep_freed_memory();  // before the calibration's calls, so they allocate as rounds will
  std::vector<measure::Run> runs;
  for (const auto& v : c.variants) runs.push_back(repeated_to_last([&c, &v] { return time_step(c, v); }));
  runs.push_back(repeated_to_last([&] {
    const auto start = Clock::now();
    dst.copy_(src);
    return elapsed_ms(start);
  }));
  // A fifth variant for forward+backward ops: ATen's x · 2 through torch's autograd, moving as many
  // bytes (the forward reads x and writes y, the backward reads dy and writes dx). It is how near
  // to the copy one of ATen's own ops comes once the engine, its allocations and its two parallel
  // regions are in the step: the yardstick for an op's % of copy.
  const bool autograd_step = !c.variants[0].step;
  const int64_t step_numel = std::max<int64_t>(1, std::llround(c.bytes_per_step / (4 * sizeof(float))));
  const at::Tensor step_x = torch::randn({autograd_step ? step_numel : 1}).requires_grad_(),
                   step_dy = torch::randn_like(step_x);
  if (autograd_step)
    runs.push_back(repeated_to_last([&] {
      step_x.mutable_grad() = at::Tensor();
      const auto start = Clock::now();
      (step_x * 2).backward(step_dy);
      return elapsed_ms(start);
    }));
  measure::Options m;
  m.warmup = options.warmup;
  m.rounds = options.rounds;
  m.calls = kCallsPerRound;
  m.progress = options.progress;
  const measure::Measurement timing = measure::interleave(runs, m);

  OpBenchResult result;
  result.op = options.op;
  result.shape = c.shape.empty() ? shape_string(c.leaves[0].sizes()) : c.shape;
  result.capability = cpu_kernel_path();
  result.timed = c.variants[0].step ? "one optimizer step" : "forward+backward";
  // elements of the op's first input, or of all the parameters a step updates
  result.numel = c.leaves[0].numel();
  if (c.variants[0].step)
    for (size_t i = 1; i < c.leaves.size(); ++i) result.numel += c.leaves[i].numel();
  result.threads = threads;
  result.rounds = timing.rounds;
  result.machine = timing.machine;
  result.environment = measure::environment();
  for (size_t i = 0; i < c.variants.size(); ++i) {
    const measure::Series& s = timing.variants[i];
    result.variants.push_back({c.variants[i].name, c.variants[i].what, s, s.max / s.min, peak_bytes(c, c.variants[i])});
  }
  result.speedup_vs_reference = measure::ratio(timing, 0, 2);
  result.speedup_vs_aten = measure::ratio(timing, 1, 2);
  result.opfuse_gbps = c.bytes_per_step / (timing.variants[2].median * 1e6);
  result.copy_gbps = 2.0 * src.numel() * sizeof(float) / (timing.variants[3].median * 1e6);
  if (autograd_step) result.aten_step_gbps = 4.0 * step_numel * sizeof(float) / (timing.variants[4].median * 1e6);
  return result;
}

}  // namespace opfuse::bench
