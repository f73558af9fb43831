// Drop connect + residual add, forward and backward, one pass each:
//   forward   out = (x / keep) · mask[n] + residual
//   backward  dx  = dy · mask[n] / keep          (dresidual = dy needs no pass)
// The roundings are the composite's (x / keep, then · mask, then + residual, each in the
// storage type), so the fused op gives the reference's drop_connect bits for the same mask.
// The loops are written once in drop_connect_add_loops.h and compiled per CPU path (per_path.h).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "ops/cpu/capability.h"
#include "ops/cpu/grain.h"
#include "ops/cpu/lanes.h"
#include "ops/cpu/paths.h"
#include "ops/drop_connect_add/drop_connect_add_kernel.h"

namespace opfuse::cpu {
namespace {

#define OPFUSE_LOOPS "ops/drop_connect_add/drop_connect_add_loops.h"
#include "ops/cpu/per_path.h"

// Calls run(begin, length, sample) over [0, numel) cut at sample boundaries, in parallel.
template <typename Run>
void for_samples(int64_t numel, int64_t per_sample, const Run& run) {
  at::parallel_for(0, numel, kGrain, [&](int64_t begin, int64_t end) {
    while (begin < end) {
      const int64_t n = begin / per_sample, stop = std::min(end, (n + 1) * per_sample);
      run(begin, stop - begin, n);
      begin = stop;
    }
  });
}

// (templates, so that OPFUSE_ON_PATH's vector paths are not compiled for float64)
template <typename T>
void forward_impl(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& mask, double keep,
                  at::Tensor& out) {
  using A = at::opmath_type<T>;
  const T *xp = x.data_ptr<T>(), *rp = residual.data_ptr<T>(), *mp = mask.data_ptr<T>();
  T* op = out.data_ptr<T>();
  // The composite divides by keep in the op-math type (torch 2.x's division of a bfloat16 tensor
  // by a scalar keeps the scalar in float; torch 1.13 rounded it to bfloat16 first).
  const A k = A(keep);
  for_samples(x.numel(), x.numel() / x.size(0), [&](int64_t at, int64_t len, int64_t n) {
    OPFUSE_ON_PATH(T, forward_run, (xp + at, rp + at, k, A(mp[n]), op + at, len));
  });
}

template <typename T>
void backward_impl(const at::Tensor& dy, const at::Tensor& mask, double keep, at::Tensor& dx) {
  using A = at::opmath_type<T>;
  const T *dyp = dy.data_ptr<T>(), *mp = mask.data_ptr<T>();
  T* dxp = dx.data_ptr<T>();
  const A k = A(keep);
  for_samples(dy.numel(), dy.numel() / dy.size(0), [&](int64_t at, int64_t len, int64_t n) {
    OPFUSE_ON_PATH(T, backward_run, (dyp + at, k, A(mp[n]), dxp + at, len));
  });
}

}  // namespace

void drop_connect_add_forward_kernel(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& mask,
                                     double keep, at::Tensor& out) {
  if (x.numel() == 0) return;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "opfuse::drop_connect_add",
                                 [&] { forward_impl<scalar_t>(x, residual, mask, keep, out); });
}

void drop_connect_add_backward_kernel(const at::Tensor& dy, const at::Tensor& mask, double keep, at::Tensor& dx) {
  if (dy.numel() == 0) return;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, dy.scalar_type(), "opfuse::drop_connect_add_backward",
                                 [&] { backward_impl<scalar_t>(dy, mask, keep, dx); });
}

}  // namespace opfuse::cpu
