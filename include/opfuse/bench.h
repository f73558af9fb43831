// Side-by-side timing of a fused operator against the composite it replaces and ATen.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "opfuse/analyze.h"
#include "opfuse/measure.h"

namespace opfuse::bench {

struct OpBenchOptions {
  std::string op = "silu";  // one of benchmarked_ops()
  // 0: the op's default, 6'400'000 elements, or [16, 96, 56, 56] for batch_norm_silu and
  // drop_connect_add; se_gate and those two take [16, C, 56, 56] of about numel elements.
  // adamw always steps stories15M's 56 parameter tensors (15.2M parameters).
  int64_t numel = 0;
  // attention: q, k, v [4, 6, seq_len, head_dim], causal, dropout_p on the probabilities.
  int64_t seq_len = 256;
  int64_t head_dim = 64;
  double dropout_p = 0;
  int threads = 0;  // 0: all hardware threads
  int rounds = 15;
  int warmup = 2;
  std::function<void(int done, int total)> progress;  // optional
};

struct VariantTiming {
  std::string name;  // reference | aten | opfuse
  std::string what;  // the code it runs, for the table
  measure::Series ms;  // forward+backward, one per round
  double spread = 0;   // slowest round / fastest
  // Most bytes held through torch's CPU allocator during one forward+backward beyond what was
  // held before it (gradients included, inputs not).
  int64_t peak_bytes = 0;
};

struct OpBenchResult {
  std::string op;
  std::string shape;  // e.g. [6400000] or [16, 128, 56, 56]
  std::string timed = "forward+backward";  // what one call does: forward+backward, or one optimizer step
  std::string capability;  // the CPU path the opfuse kernels took
  int64_t numel = 0;
  // attention: q, k, v [4, 6, seq_len, head_dim], causal, dropout_p on the probabilities.
  int64_t seq_len = 256;
  int64_t head_dim = 64;
  double dropout_p = 0;
  int threads = 0;
  std::vector<VariantTiming> variants;  // reference, aten, opfuse
  measure::Ratio speedup_vs_reference;  // paired rounds
  measure::Ratio speedup_vs_aten;
  double opfuse_gbps = 0;  // bytes the fused forward+backward (or step) must move / its median time
  double copy_gbps = 0;    // tensor copy in the same run, interleaved with the variants: what memory can do
  // ATen's x · 2 forward+backward through autograd over as many bytes, in the same run: what one
  // of torch's own ops reaches in an autograd step; 0 for an optimizer step, which has none
  double aten_step_gbps = 0;
  int rounds = 0;
  measure::Machine machine;
  measure::Environment environment;
};

const std::vector<std::string>& benchmarked_ops();

// Throws std::invalid_argument for an unknown op or a non-positive size.
OpBenchResult bench_op(const OpBenchOptions& options);

}  // namespace opfuse::bench

namespace opfuse::bench {

// Microseconds one call of opfuse op `op` (any OpSpec's name: its forward, or its optimizer
// step; "<name>_backward": its backward; "<name>@reference" or "@aten": that variant of its
// spec, what the chain it replaces costs) takes here at the tensor shapes of a trace's "Input
// Dims" ("16,32,56,56;16,32,1,1": largest first), on inputs its spec makes from them (e.g.
// batch_norm_silu in training mode, drop_connect_add with p = 0.2), median of repeated calls;
// −1 for an op, variant or shape it cannot time; each (op, shapes, threads) is timed once per
// process, in tune's memory regime (measure::keep_freed_memory). analyze uses it for its
// estimates. A recorded convolution in a memory format
// ("conv2d@channels_last", "conv2d_backward@contiguous"; dims "x;w;y;stride;padding;groups") is
// timed too, for a layout change's estimate.
double time_fused_op(const std::string& op, const std::string& dims);

// This machine's peak compute and memory bandwidth at `threads` intra-op threads, for the op
// table's roofline: measured once (about a second) and cached (analyze::cache_roofline).
analyze::Roofline machine_roofline(int threads);

}  // namespace opfuse::bench
