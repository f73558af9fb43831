// opfuse::rotary_embedding: front end, autograd and the C++ API. The loops live in
// cpu/rotary_embedding_loops.h; this file checks the tables and finds which table row each row of
// x takes.
#include <ATen/ExpandUtils.h>
#include <ATen/OpMathType.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <vector>

#include "opfuse/ops.h"
#include "ops/checks.h"
#include "ops/dispatch.h"
#include "ops/meta.h"
#include "ops/rotary_embedding/rotary_embedding_kernel.h"

namespace opfuse {
namespace {

at::IntArrayRef leading(const at::Tensor& t) { return t.sizes().slice(0, t.dim() - 1); }

// x [..., d], d even; cos and sin one shape [..., d/2] (an angle per pair) or [..., d] (one per
// element, Hugging Face's cat(freqs, freqs)), of x's dtype or float32 for bfloat16 x, their
// leading dimensions broadcast to x's as torch broadcasts.
void check_arguments(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const char* op) {
  check_input(x, op, "x");
  check_input(cos, op, "cos");
  check_input(sin, op, "sin");
  check_same(cos, sin, op, "cos", "sin");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, op, ": x's last dimension must be even (pairs), got ", x.sizes());
  const bool float_tables = x.scalar_type() == at::kBFloat16 && cos.scalar_type() == at::kFloat;
  TORCH_CHECK(cos.scalar_type() == x.scalar_type() || float_tables, op,
              ": cos and sin must have x's dtype (or float32 for bfloat16 x), got ", cos.scalar_type(), " for ",
              x.scalar_type(), " x");
  const int64_t d = x.size(-1);
  TORCH_CHECK(cos.dim() >= 1 && (cos.size(-1) == d / 2 || cos.size(-1) == d), op,
              ": cos and sin's last dimension must be ", d / 2, " (an angle per pair) or ", d,
              " (one per element), got ", cos.sizes());
  TORCH_CHECK(cos.dim() <= x.dim() && at::is_expandable_to(leading(cos), leading(x)), op, ": cos and sin ",
              cos.sizes(), " do not broadcast to x ", x.sizes(),
              " over its leading dimensions (for x [B, T, H, D] pass [T, 1, D/2], for [B, H, T, D] pass [T, D/2])");
}

// For each of x's leading dimensions, how many table rows one step along it moves: the table's
// leading dimensions right-aligned to x's, 0 where the table broadcasts (size 1 or absent).
std::vector<int64_t> table_row_strides(const at::Tensor& cos, const at::Tensor& x) {
  const at::IntArrayRef table = leading(cos), rows = leading(x);
  std::vector<int64_t> strides(rows.size(), 0);
  int64_t stride = 1;
  for (int64_t k = int64_t(table.size()) - 1, j = int64_t(rows.size()) - 1; k >= 0; --k, --j) {
    if (table[k] != 1) strides[j] = stride;
    stride *= table[k];
  }
  return strides;
}

at::Tensor rotate(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin, bool interleaved,
                  bool transposed) {
  const at::Tensor x = x_in.contiguous();
  at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
  if (x.numel() == 0) return y;
  // The kernel reads the tables' rows in the accumulation dtype (a no-op for the usual tables).
  const at::ScalarType acc = at::toOpMathType(cos.scalar_type());
  const at::Tensor c = cos.to(acc).contiguous(), s = sin.to(acc).contiguous();
  cpu::rotary_embedding_kernel(x, c, s, table_row_strides(cos, x), interleaved, transposed, y);
  return y;
}

at::Tensor rotary_embedding_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool interleaved) {
  check_arguments(x, cos, sin, "opfuse::rotary_embedding");
  return rotate(x, cos, sin, interleaved, false);
}

// dx = Jᵀ·dy: the forward's matrices transposed. x is not needed.
at::Tensor rotary_embedding_backward_cpu(const at::Tensor& grad, const at::Tensor& cos, const at::Tensor& sin,
                                         bool interleaved) {
  check_arguments(grad, cos, sin, "opfuse::rotary_embedding_backward");
  return rotate(grad, cos, sin, interleaved, true);
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

auto rotary_op() {
  static auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool)>(
      "opfuse::rotary_embedding");
  return op;
}

auto backward_op() {
  static auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool)>(
      "opfuse::rotary_embedding_backward");
  return op;
}

// Saves the tables only: the backward is linear in dy and does not read x.
class RotaryEmbeddingFunction : public torch::autograd::Function<RotaryEmbeddingFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            bool interleaved) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["interleaved"] = interleaved;
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return rotary_op().call(x, cos, sin, interleaved);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    const bool interleaved = ctx->saved_data["interleaved"].toBool();
    return {backward_op().call(grads[0], saved[0], saved[1], interleaved), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// cos and sin are position tables, constants: a table that asks for a gradient is refused rather
// than silently left without one.
at::Tensor rotary_embedding_autograd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                     bool interleaved) {
  for (const at::Tensor* t : {&cos, &sin})
    TORCH_CHECK(!(t->defined() && t->requires_grad()), "opfuse::rotary_embedding: cos and sin are constant tables "
                "and get no gradient; pass them without requires_grad (detach them)");
  return RotaryEmbeddingFunction::apply(x, cos, sin, interleaved);
}

}  // namespace

at::Tensor rotary_embedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool interleaved) {
  return rotary_op().call(x, cos, sin, interleaved);
}

}  // namespace opfuse

TORCH_LIBRARY_FRAGMENT(opfuse, m) {
  // Each pair of x's last dimension, (x[i], x[i + D/2]) or interleaved (x[2i], x[2i + 1]), rotated
  // by its angle: y_a = x_a·cos − x_b·sin, y_b = x_b·cos + x_a·sin; cos and sin [..., D/2] or
  // [..., D], broadcast to x's leading dimensions. _backward rotates grad back (the transpose).
  m.def("rotary_embedding(Tensor x, Tensor cos, Tensor sin, bool interleaved=False) -> Tensor");
  m.def("rotary_embedding_backward(Tensor grad, Tensor cos, Tensor sin, bool interleaved) -> Tensor");
}

TORCH_LIBRARY_IMPL(opfuse, CPU, m) {
  m.impl("rotary_embedding", &opfuse::rotary_embedding_cpu);
  m.impl("rotary_embedding_backward", &opfuse::rotary_embedding_backward_cpu);
}

// Outputs as the CPU front end allocates them, without data (ops/meta.h): row-major.
TORCH_LIBRARY_IMPL(opfuse, Meta, m) {
  using opfuse::meta::dense;
  m.impl("rotary_embedding", [](const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool interleaved) {
    return dense(x);
  });
  m.impl("rotary_embedding_backward", [](const at::Tensor& grad, const at::Tensor& cos, const at::Tensor& sin,
                                         bool interleaved) { return dense(grad); });
}

// The backward has no derivative of its own: double backward raises.
TORCH_LIBRARY_IMPL(opfuse, Autograd, m) {
  m.impl("rotary_embedding", &opfuse::rotary_embedding_autograd);
  m.impl("rotary_embedding_backward", torch::autograd::autogradNotImplementedFallback());
}
