// The residual add then LayerNorm of a pre-norm transformer block (GPT-2, BERT's post-norm
// likewise), forward and fused backward, one pass over the row per direction plus its sums:
//   forward   h = x + residual (written), mean = Σh/d, rstd = 1/sqrt(Σ(h − mean)²/d + eps),
//             y = (h − mean)·rstd·w + b
//   backward  dx = rstd·(dy·w − Σdy·w/d − x̂·Σdy·w·x̂/d) (+ h's own gradient), dw = Σ dy·x̂, db = Σ dy
// Row sums are fma partials added in double (row_dot); the variance is summed from centred values;
// bfloat16 rows are computed in float and rounded once, on the store.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
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

namespace opfuse::cpu {

// The entry points at the end are declared by their one caller, the front end (add_layer_norm.cpp).
namespace {

#define OPFUSE_LOOPS "ops/add_layer_norm/add_layer_norm_loops.h"
#include "ops/cpu/per_path.h"

template <typename T>
void forward_impl(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& w, const at::Tensor& b,
                  double eps, at::Tensor& h, at::Tensor& y, at::Tensor& mean, at::Tensor& rstd) {
  using A = at::opmath_type<T>;
  const int64_t d = x.size(-1), rows = d == 0 ? 0 : x.numel() / d;
  const T *xp = x.data_ptr<T>(), *rp = residual.data_ptr<T>(), *wp = w.data_ptr<T>(), *bp = b.data_ptr<T>();
  T *hp = h.data_ptr<T>(), *yp = y.data_ptr<T>();
  A *mp = mean.data_ptr<A>(), *sp = rstd.data_ptr<A>();
  OPFUSE_ON_PATH(T, forward_all, (xp, rp, wp, bp, rows, d, eps, hp, yp, mp, sp));
}

template <typename T>
void backward_impl(const at::Tensor& dy, const at::Tensor& dh, const at::Tensor& h, const at::Tensor& w,
                   const at::Tensor& mean, const at::Tensor& rstd, at::Tensor& dx, at::Tensor& dw, at::Tensor& db) {
  using A = at::opmath_type<T>;
  const int64_t d = h.size(-1), rows = d == 0 ? 0 : h.numel() / d;
  const T *dyp = dy.data_ptr<T>(), *dhp = dh.defined() ? dh.data_ptr<T>() : nullptr, *hp = h.data_ptr<T>();
  const T* wp = w.data_ptr<T>();
  const A *mp = mean.data_ptr<A>(), *sp = rstd.data_ptr<A>();
  std::vector<double> dw_sums(d), db_sums(d);
  OPFUSE_ON_PATH(T, backward_all, (dyp, hp, wp, mp, sp, rows, d, dhp, dx.data_ptr<T>(), dw_sums.data(), db_sums.data()));
  T *dwp = dw.data_ptr<T>(), *dbp = db.data_ptr<T>();
  for (int64_t j = 0; j < d; ++j) dwp[j] = T(dw_sums[j]), dbp[j] = T(db_sums[j]);
}

}  // namespace

void add_layer_norm_forward_kernel(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                                   const at::Tensor& bias, double eps, at::Tensor& h, at::Tensor& y, at::Tensor& mean,
                                   at::Tensor& rstd) {
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "opfuse::add_layer_norm",
                                 [&] { forward_impl<scalar_t>(x, residual, weight, bias, eps, h, y, mean, rstd); });
}

void add_layer_norm_backward_kernel(const at::Tensor& dy, const at::Tensor& dh, const at::Tensor& h,
                                    const at::Tensor& weight, const at::Tensor& mean, const at::Tensor& rstd,
                                    at::Tensor& dx, at::Tensor& dweight, at::Tensor& dbias) {
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, h.scalar_type(), "opfuse::add_layer_norm_backward",
                                 [&] { backward_impl<scalar_t>(dy, dh, h, weight, mean, rstd, dx, dweight, dbias); });
}

}  // namespace opfuse::cpu
