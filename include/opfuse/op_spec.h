// One description per fused op (as PyTorch's OpInfo): its name, how to make its inputs from
// recorded shapes, the composite it replaces, the best ATen alternative, the opfuse call and the
// bytes it must move. bench-op, analyze --measure and the op tests read this one table; each spec
// lives beside its op (src/ops/<op>/<op>_spec.cpp) and registers itself.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace opfuse {

// Tensor shapes, the largest tensor's first, as a trace's "Input Dims" records a call's inputs.
using InputShapes = std::vector<std::vector<int64_t>>;

// One way to compute the op: from the case's leaves, forward (its output, for a backward from
// grad_output), or, for an optimizer, an in-place step.
struct OpVariant {
  std::string name, what;  // reference | aten | opfuse; the code it runs
  std::function<at::Tensor()> forward = {};
  std::function<void()> step = {};  // set instead of forward
};

// The op's inputs made once, and its three variants over them.
struct OpCase {
  std::vector<at::Tensor> leaves;  // inputs that receive gradients (or that a step updates)
  at::Tensor grad_output;
  std::vector<OpVariant> variants;  // reference, aten, opfuse, in that order
  double bytes_per_step = 0;  // bytes a single-pass forward+backward (or step) of the fused op moves
  std::string shape;  // for reports (default leaves[0]'s shape)
};

// bench-op's size options: --numel (0: the op's default), attention's --seq-len and --head-dim.
struct BenchSize {
  int64_t numel = 0;
  int64_t seq_len = 256, head_dim = 64;
};

// What a case is made at: shapes as the spec's bench_shapes gives them or a trace recorded them
// (the spec derives the rest: a weight from x's last dimension, a gate from [N, C], targets, tables).
struct OpArgs {
  InputShapes shapes;
  at::ScalarType dtype = at::kFloat;  // of the floating-point inputs
  double dropout_p = 0;               // attention's
  // The activations' dimensions in memory, outermost first, as a trace recorded them ({0, 2, 3, 1}:
  // channels-last); empty: torch's default. For the tensors of its rank.
  std::vector<int64_t> dim_order;
};

struct OpSpec {
  std::string name;  // bench-op's NAME and a rule's `measure:`
  // bench-op's shapes for a size; throws std::invalid_argument for one the op does not take.
  std::function<InputShapes(const BenchSize&)> bench_shapes;
  // Throws std::invalid_argument (or c10::Error) for shapes that do not fit the op.
  std::function<OpCase(const OpArgs&)> make;
  // Small shapes for the tests: odd sizes, tails of vectors, one row.
  std::vector<InputShapes> samples;
};

// Every registered op, by name.
const std::vector<OpSpec>& op_specs();
// nullptr for a name no spec has.
const OpSpec* find_op_spec(const std::string& name);

// How a spec joins op_specs(): `const OpSpecRegistration silu_registered{silu_spec};` beside it,
// in the ops library, whose static objects all run as it loads.
struct OpSpecRegistration {
  explicit OpSpecRegistration(OpSpec (*make)());
};

}  // namespace opfuse
