// Squeeze-and-excitation gate, forward and fused backward, for x [N, C, H·W] (NCHW) or
// [N, H·W, C] (channels_last) and a gate of N·C values, s = sigmoid(gate):
//   forward   y     = x · s[n,c]
//   backward  dx    = dy · s[n,c]
//             dgate = s(1 − s) · Σ_hw dy·x      (the reduction rides along the dx pass)
//             with s(1 − s) taken as sigmoid(g)·sigmoid(−g), exact where s rounds to 1
// The loops are written once in se_gate_loops.h and compiled per CPU path (per_path.h).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <vector>

#include "ops/cpu/aligned_vector.h"
#include "ops/cpu/capability.h"
#include "ops/cpu/grain.h"
#include "ops/cpu/lanes.h"
#include "ops/cpu/paths.h"
#include "ops/layout.h"
#include "ops/se_gate/se_gate_kernel.h"

namespace opfuse::cpu {
namespace {

struct Geometry {
  int64_t n, c, hw;
  bool channels_last;
};

Geometry geometry_of(const at::Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1);
  const int64_t hw = n * c == 0 ? 0 : x.numel() / (n * c);
  return {n, c, hw, is_channels_last(x)};
}

// Channel blocks for the channels_last reduction: enough tasks for every thread even at N = 1.
constexpr int64_t kChannelBlock = 64;

#define OPFUSE_LOOPS "ops/se_gate/se_gate_loops.h"
#include "ops/cpu/per_path.h"

template <typename A, typename T>
AlignedVector<A> gate_sigmoid(const at::Tensor& gate) {
  AlignedVector<A> s(gate.numel());
  const T* gp = gate.data_ptr<T>();
  OPFUSE_ON_PATH(T, gate_sigmoid_all, (gp, s.data(), gate.numel()));
  return s;
}

// (templates, so that OPFUSE_ON_PATH's vector paths are not compiled for float64)
template <typename T>
void forward_impl(const at::Tensor& x, const at::Tensor& gate, at::Tensor& out) {
  using A = at::opmath_type<T>;
  const Geometry g = geometry_of(x);
  const AlignedVector<A> s = gate_sigmoid<A, T>(gate);
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  OPFUSE_ON_PATH(T, forward_all, (g, xp, s.data(), op));
}

template <typename T>
void backward_impl(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& gate, at::Tensor& dx,
                   at::Tensor& dgate) {
  using A = at::opmath_type<T>;
  const Geometry g = geometry_of(x);
  const AlignedVector<A> s = gate_sigmoid<A, T>(gate);
  AlignedVector<A> sum(s.size(), A(0));
  const T *dyp = dy.data_ptr<T>(), *xp = x.data_ptr<T>();
  T* dxp = dx.data_ptr<T>();
  OPFUSE_ON_PATH(T, backward_all, (g, dyp, xp, s.data(), dxp, sum.data()));
  const T* gp = gate.data_ptr<T>();
  T* dg = dgate.data_ptr<T>();
  OPFUSE_ON_PATH(T, gate_gradient_all, (gp, sum.data(), dg, gate.numel()));
}

}  // namespace

void se_gate_forward_kernel(const at::Tensor& x, const at::Tensor& gate, at::Tensor& out) {
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "opfuse::se_gate",
                                 [&] { forward_impl<scalar_t>(x, gate, out); });
}

void se_gate_backward_kernel(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& gate,
                             at::Tensor& dx, at::Tensor& dgate) {
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "opfuse::se_gate_backward",
                                 [&] { backward_impl<scalar_t>(dy, x, gate, dx, dgate); });
}

}  // namespace opfuse::cpu
