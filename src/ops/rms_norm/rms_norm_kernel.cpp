// RMSNorm over the last dimension, forward and fused backward, one pass over x per direction
// plus the row's sum:
//   forward   rstd = 1 / sqrt(Σx² / d + eps)           y = x · rstd · w
//   backward  c = Σ (dy·w)·x                            dx = dy·w·rstd − x·rstd³·c/d
//             dw = Σ_rows dy · x · rstd                (partials per 16 rows, then double)
// Row sums are fma partials of 4 vectors added in double (row_dot); bfloat16 rows are computed
// in float and rounded once, on the store.
// add_rms_norm runs the same loops on h = x + residual, written (rounded) just before its row is
// normalized, and adds h's own gradient into dx in the same pass.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/aligned_vector.h"
#include "ops/cpu/capability.h"
#include "ops/cpu/grain.h"
#include "ops/cpu/lanes.h"
#include "ops/cpu/paths.h"
#include "ops/rms_norm/rms_norm_kernel.h"

namespace opfuse::cpu {
namespace {

#define OPFUSE_LOOPS "ops/rms_norm/rms_norm_loops.h"
#include "ops/cpu/per_path.h"

// An undefined tensor's data: null (rms_norm has no residual, a backward may have no dh).
template <typename T>
T* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// residual and h undefined: rms_norm.
template <typename T>
void forward_impl(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& w, double eps, at::Tensor& h,
                  at::Tensor& y, at::Tensor& rstd) {
  using A = at::opmath_type<T>;
  const int64_t d = x.size(-1), rows = d == 0 ? 0 : x.numel() / d;
  const T *xp = x.data_ptr<T>(), *resp = data_or_null<T>(residual), *wp = w.data_ptr<T>();
  T *hp = data_or_null<T>(h), *yp = y.data_ptr<T>();
  A* rp = rstd.data_ptr<A>();
  OPFUSE_ON_PATH(T, forward_all, (xp, resp, wp, rows, d, eps, hp, yp, rp));
}

template <typename T>
void backward_impl(const at::Tensor& dy, const at::Tensor& dh, const at::Tensor& x, const at::Tensor& w,
                   const at::Tensor& rstd, at::Tensor& dx, at::Tensor& dw) {
  using A = at::opmath_type<T>;
  const int64_t d = x.size(-1), rows = d == 0 ? 0 : x.numel() / d;
  const T *dyp = dy.data_ptr<T>(), *dhp = data_or_null<T>(dh), *xp = x.data_ptr<T>(), *wp = w.data_ptr<T>();
  const A* rp = rstd.data_ptr<A>();
  T* dxp = dx.data_ptr<T>();
  std::vector<double> sums(d);
  OPFUSE_ON_PATH(T, backward_all, (dyp, xp, wp, rp, rows, d, dhp, dxp, sums.data()));
  T* dwp = dw.data_ptr<T>();
  for (int64_t j = 0; j < d; ++j) dwp[j] = T(sums[j]);
}

}  // namespace

void rms_norm_forward_kernel(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& y,
                             at::Tensor& rstd) {
  at::Tensor none;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "opfuse::rms_norm",
                                 [&] { forward_impl<scalar_t>(x, none, weight, eps, none, y, rstd); });
}

void rms_norm_backward_kernel(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
                              const at::Tensor& rstd, at::Tensor& dx, at::Tensor& dweight) {
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "opfuse::rms_norm_backward",
                                 [&] { backward_impl<scalar_t>(dy, at::Tensor(), x, weight, rstd, dx, dweight); });
}

void add_rms_norm_forward_kernel(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps,
                                 at::Tensor& h, at::Tensor& y, at::Tensor& rstd) {
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "opfuse::add_rms_norm",
                                 [&] { forward_impl<scalar_t>(x, residual, weight, eps, h, y, rstd); });
}

void add_rms_norm_backward_kernel(const at::Tensor& dy, const at::Tensor& dh, const at::Tensor& h,
                                  const at::Tensor& weight, const at::Tensor& rstd, at::Tensor& dx,
                                  at::Tensor& dweight) {
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, h.scalar_type(), "opfuse::add_rms_norm_backward",
                                 [&] { backward_impl<scalar_t>(dy, dh, h, weight, rstd, dx, dweight); });
}

}  // namespace opfuse::cpu
