// Drop connect + residual add, forward and backward, one pass each:
//   forward   out = (x / keep) · mask[n] + residual
//   backward  dx  = dy · mask[n] / keep          (dresidual = dy needs no pass)
// The roundings are the composite's (x / keep, then · mask, then + residual, each in the
// storage type), so the fused op gives the reference's drop_connect bits for the same mask.
// The loops are plain C++ compiled three times (scalar, AVX2, AVX-512) and vectorized by the
// compiler: there is no transcendental here, only a division, and memory bounds the speed.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "ops/cpu/capability.h"
#include "ops/cpu/grain.h"
#include "ops/cpu/kernels.h"

namespace opfuse::cpu {
namespace {

template <typename T, typename A>
inline __attribute__((always_inline)) void forward_run(const T* x, const T* r, A keep, A m, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = T(A(T(A(x[i]) / keep)) * m + A(r[i]));
}

template <typename T, typename A>
inline __attribute__((always_inline)) void backward_run(const T* dy, A keep, A m, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = T(A(T(A(dy[i]) * m)) / keep);
}

template <typename T, typename A>
void forward_scalar(const T* x, const T* r, A keep, A m, T* out, int64_t n) { forward_run(x, r, keep, m, out, n); }
template <typename T, typename A>
__attribute__((target("avx2,fma"))) void forward_avx2(const T* x, const T* r, A keep, A m, T* out, int64_t n) {
  forward_run(x, r, keep, m, out, n);
}
template <typename T, typename A>
__attribute__((target("avx512f,avx2,fma"))) void forward_avx512(const T* x, const T* r, A keep, A m, T* out,
                                                                 int64_t n) {
  forward_run(x, r, keep, m, out, n);
}

template <typename T, typename A>
void backward_scalar(const T* dy, A keep, A m, T* dx, int64_t n) { backward_run(dy, keep, m, dx, n); }
template <typename T, typename A>
__attribute__((target("avx2,fma"))) void backward_avx2(const T* dy, A keep, A m, T* dx, int64_t n) {
  backward_run(dy, keep, m, dx, n);
}
template <typename T, typename A>
__attribute__((target("avx512f,avx2,fma"))) void backward_avx512(const T* dy, A keep, A m, T* dx, int64_t n) {
  backward_run(dy, keep, m, dx, n);
}

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

}  // namespace

void drop_connect_add_forward_kernel(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& mask,
                                     double keep, at::Tensor& out) {
  if (x.numel() == 0) return;
  const int64_t per_sample = x.numel() / x.size(0);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "opfuse::drop_connect_add", [&] {
    using A = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* rp = residual.data_ptr<scalar_t>();
    const scalar_t* mp = mask.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const A k = A(scalar_t(keep));  // the composite divides by keep rounded to the tensor's dtype
    const Capability cap = cpu_capability();
    for_samples(x.numel(), per_sample, [&](int64_t at, int64_t len, int64_t n) {
      const A m = A(mp[n]);
      if (cap == Capability::avx512) forward_avx512(xp + at, rp + at, k, m, op + at, len);
      else if (cap == Capability::avx2) forward_avx2(xp + at, rp + at, k, m, op + at, len);
      else forward_scalar(xp + at, rp + at, k, m, op + at, len);
    });
  });
}

void drop_connect_add_backward_kernel(const at::Tensor& dy, const at::Tensor& mask, double keep, at::Tensor& dx) {
  if (dy.numel() == 0) return;
  const int64_t per_sample = dy.numel() / dy.size(0);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, dy.scalar_type(), "opfuse::drop_connect_add_backward", [&] {
    using A = at::opmath_type<scalar_t>;
    const scalar_t* dyp = dy.data_ptr<scalar_t>();
    const scalar_t* mp = mask.data_ptr<scalar_t>();
    scalar_t* dxp = dx.data_ptr<scalar_t>();
    const A k = A(scalar_t(keep));
    const Capability cap = cpu_capability();
    for_samples(dy.numel(), per_sample, [&](int64_t at, int64_t len, int64_t n) {
      const A m = A(mp[n]);
      if (cap == Capability::avx512) backward_avx512(dyp + at, k, m, dxp + at, len);
      else if (cap == Capability::avx2) backward_avx2(dyp + at, k, m, dxp + at, len);
      else backward_scalar(dyp + at, k, m, dxp + at, len);
    });
  });
}

}  // namespace opfuse::cpu
