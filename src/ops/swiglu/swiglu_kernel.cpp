// The gated units a(gate) · up, SwiGLU (silu) and GeGLU (gelu's tanh form): one pass forward
// (reads gate and up, writes y) and one backward (reads dy, gate, up; writes dgate, dup), the
// activation recomputed from gate rather than stored.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <tuple>
#include <type_traits>

#include "ops/cpu/capability.h"
#include "ops/cpu/grain.h"
#include "ops/cpu/lanes.h"
#include "ops/cpu/paths.h"
#include "ops/swiglu/swiglu_kernel.h"

namespace opfuse::cpu {
namespace {

// rows of d outputs; a row's gate and up start in_stride elements after the previous row's
// (d for two tensors, 2d for one packed tensor), and its dgate, dup likewise.
struct Layout {
  int64_t rows, d, in_stride;
  // Long rows are cut so even a single row gives every thread work.
  static constexpr int64_t kPiece = 16384;
  int64_t pieces() const { return (d + kPiece - 1) / kPiece; }
  int64_t tasks() const { return rows * pieces(); }
  int64_t task_elements() const { return std::min(d, kPiece); }
  std::tuple<int64_t, int64_t, int64_t> task(int64_t t) const {
    const int64_t row = t / pieces(), col = (t % pieces()) * kPiece;
    return {row, col, std::min(kPiece, d - col)};
  }
};

#define OPFUSE_LOOPS "ops/swiglu/swiglu_loops.h"
#include "ops/cpu/per_path.h"

// The layout of gate and up: two same-shaped contiguous tensors are one row; a packed tensor
// (gate = up's storage offset − d) is rows of 2d.
Layout layout_of(const at::Tensor& out, int64_t in_stride) {
  const int64_t d = out.dim() == 0 ? 1 : out.size(-1), rows = d == 0 ? 0 : out.numel() / d;
  return in_stride == d ? Layout{1, out.numel(), out.numel()} : Layout{rows, d, in_stride};
}

}  // namespace

namespace {

// f(std::integral_constant<Gate, gate>{}): the loops are compiled per gate.
template <typename F>
void with_gate(Gate gate, const F& f) {
  if (gate == Gate::silu) return f(std::integral_constant<Gate, Gate::silu>{});
  f(std::integral_constant<Gate, Gate::gelu_tanh>{});
}

}  // namespace

void gated_forward_kernel(Gate gate, const at::Tensor& g, const at::Tensor& up, int64_t in_stride, at::Tensor& y) {
  const Layout l = layout_of(y, in_stride);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, y.scalar_type(), "opfuse::gated_forward", [&] {
    const scalar_t *gp = g.data_ptr<scalar_t>(), *u = up.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    with_gate(gate, [&](auto kind) { OPFUSE_ON_PATH(scalar_t, forward_all, (l, gp, u, yp, kind)); });
  });
}

void gated_backward_kernel(Gate gate, const at::Tensor& dy, const at::Tensor& g, const at::Tensor& up,
                           int64_t in_stride, at::Tensor& dgate, at::Tensor& dup) {
  const Layout l = layout_of(dy, in_stride);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, dy.scalar_type(), "opfuse::gated_backward", [&] {
    const scalar_t *dyp = dy.data_ptr<scalar_t>(), *gp = g.data_ptr<scalar_t>(), *u = up.data_ptr<scalar_t>();
    scalar_t *dg = dgate.data_ptr<scalar_t>(), *du = dup.data_ptr<scalar_t>();
    with_gate(gate, [&](auto kind) { OPFUSE_ON_PATH(scalar_t, backward_all, (l, dyp, gp, u, dg, du, kind)); });
  });
}

}  // namespace opfuse::cpu
