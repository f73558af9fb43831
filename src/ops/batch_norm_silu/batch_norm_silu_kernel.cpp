// BatchNorm + SiLU, forward and fused backward, over x [N, C, H·W] (NCHW) or rows of C channels
// (channels_last, and [N, C]). With x̂ = (x − mean)·invstd, z = w·x̂ + b = x·scale + shift:
//   forward   moments  mean, Σ(x − mean)²                     one read of x (training only)
//             apply    y = z · sigmoid(z)                      one read of x, one write
//   backward  sums     dz = dy · s(1 + z(1 − s)), s = sigmoid(z)   (z recomputed from x)
//                      Σdz, Σdz·(x − mean); dz kept in dx's memory  one read of dy and x
//             input    dx = alpha·dz + beta·(x − mean) + delta      one read of dz and x
// x̂ is never stored: every pass recomputes it from x and the per-channel mean and invstd.
// Per-channel sums are double; each task owns fixed partials added in a fixed order, so the
// result is the same for any thread count.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "ops/batch_norm_silu/batch_norm_silu_kernel.h"
#include "ops/cpu/aligned_vector.h"
#include "ops/cpu/capability.h"
#include "ops/cpu/grain.h"
#include "ops/cpu/lanes.h"
#include "ops/cpu/paths.h"
#include "ops/layout.h"

namespace opfuse::cpu {
namespace {

struct Geometry {
  int64_t n, c, hw;
  bool rows;   // channels innermost: channels_last, or one pixel per sample
  int64_t cp;  // c rounded up to the widest vector, the length of per-channel arrays
};

Geometry geometry_of(const at::Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1);
  const int64_t hw = n * c == 0 ? 0 : x.numel() / (n * c);
  return {n, c, hw, is_channels_last(x) || hw == 1, (c + 15) / 16 * 16};
}

// NCHW planes this small (a late layer's 6×6 or 3×3) are mostly a partial vector each, loaded
// and stored through a buffer: 4× slower than ATen at [16, 1152, 3, 3]. Such an x runs as rows
// instead, a sample's C·H·W elements each, every per-channel value repeated H·W times along the
// row ("slots"), and a reduction's slots are folded back into their channels.
bool in_slots(const Geometry& g) { return !g.rows && g.hw > 1 && g.hw < kSmallPlane; }
Geometry slot_geometry(const Geometry& g) {
  const int64_t slots = g.c * g.hw;
  return {g.n, slots, 1, true, (slots + 15) / 16 * 16};
}

// A plane is cut into segments of this many elements, so even one huge plane gives every
// thread work; rows are grouped into blocks of about as many elements.
constexpr int64_t kSegment = 16384;
int64_t segments_per_plane(const Geometry& g) { return (g.hw + kSegment - 1) / kSegment; }
int64_t rows_per_block(const Geometry& g) { return std::max<int64_t>(1, kSegment / std::max<int64_t>(1, g.c)); }

#define OPFUSE_LOOPS "ops/batch_norm_silu/batch_norm_silu_loops.h"
#include "ops/cpu/per_path.h"


// A [C] tensor of the accumulation type, copied into an array padded to g.cp; for x in slots,
// each channel's value repeated over its plane's slots.
template <typename A>
AlignedVector<A> padded(const A* values, const Geometry& g) {
  if (in_slots(g)) {
    AlignedVector<A> v(slot_geometry(g).cp, A(0));
    for (int64_t k = 0; k < g.c; ++k) std::fill(v.begin() + k * g.hw, v.begin() + (k + 1) * g.hw, values[k]);
    return v;
  }
  AlignedVector<A> v(g.cp, A(0));
  std::copy(values, values + g.c, v.begin());
  return v;
}

template <typename A>
AlignedVector<A> padded(const at::Tensor& t, const Geometry& g) {
  return padded<A>(t.contiguous().data_ptr<A>(), g);
}

// The geometry the loops run: x's own, or its slots.
Geometry run_geometry(const Geometry& g) { return in_slots(g) ? slot_geometry(g) : g; }

// Per-channel sums from what the loops summed per slot (or per channel already).
void fold_slots(const Geometry& g, const std::vector<double>& slots, double* sums) {
  const int64_t per = in_slots(g) ? g.hw : 1;
  for (int64_t c = 0; c < g.c; ++c) {
    double s = 0.0;
    for (int64_t k = 0; k < per; ++k) s += slots[c * per + k];
    sums[c] = s;
  }
}

template <typename T>
void moments_impl(const Geometry& g, const at::Tensor& x, at::Tensor& mean, at::Tensor& var_sum) {
  using A = at::opmath_type<T>;
  const int64_t count = g.n * g.hw;
  const T* xp = x.data_ptr<T>();
  std::vector<A> first(g.c, A(0));
  if (count > 0)
    for (int64_t c = 0; c < g.c; ++c) first[c] = A(xp[g.rows ? c : c * g.hw]);  // sample 0's first pixel
  const AlignedVector<A> k = padded<A>(first.data(), g);
  const Geometry run = run_geometry(g);
  std::vector<double> slot1(run.cp), slot2(run.cp), s1(g.c), s2(g.c);  // a stretch's last vector writes past c
  OPFUSE_ON_PATH(T, moments_all, (run, xp, k.data(), slot1.data(), slot2.data()));
  fold_slots(g, slot1, s1.data());
  fold_slots(g, slot2, s2.data());
  double* m = mean.data_ptr<double>();
  double* v = var_sum.data_ptr<double>();
  for (int64_t c = 0; c < g.c; ++c) {
    const double d = count > 0 ? s1[c] / count : 0.0;
    m[c] = first[c] + d;
    v[c] = std::max(0.0, s2[c] - s1[c] * d);  // Σ(x − k)² − (Σ(x − k))²/M
  }
}

template <typename T>
void forward_impl(const Geometry& g, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                  at::Tensor& out) {
  using A = at::opmath_type<T>;
  const AlignedVector<A> sc = padded<A>(scale, g), sh = padded<A>(shift, g);
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  OPFUSE_ON_PATH(T, silu_affine_all, (run_geometry(g), xp, sc.data(), sh.data(), op));
}

// Z: where dz is kept, dx's own memory or (bfloat16 x) a float buffer.
template <typename T, typename Z>
void grad_sums_impl(const Geometry& g, const at::Tensor& dy, const at::Tensor& x, const at::Tensor& scale,
                    const at::Tensor& shift, const at::Tensor& mean, const at::Tensor& store_scale, at::Tensor& dz,
                    at::Tensor& sum_dz, at::Tensor& sum_dz_xc) {
  using A = at::opmath_type<T>;
  const AlignedVector<A> sc = padded<A>(scale, g), sh = padded<A>(shift, g), mu = padded<A>(mean, g),
                         st = padded<A>(store_scale, g);
  const T* dyp = dy.data_ptr<T>();
  const T* xp = x.data_ptr<T>();
  Z* dzp = dz.data_ptr<Z>();
  const Geometry run = run_geometry(g);
  std::vector<double> slot1(run.cp), slot2(run.cp);
  OPFUSE_ON_PATH(T, grad_sums_all, (run, dyp, xp, sc.data(), sh.data(), mu.data(), st.data(), dzp, slot1.data(),
                                    slot2.data()));
  fold_slots(g, slot1, sum_dz.data_ptr<double>());
  fold_slots(g, slot2, sum_dz_xc.data_ptr<double>());
}

template <typename T, typename Z>
void grad_input_impl(const Geometry& g, const at::Tensor& dz, const at::Tensor& x, const at::Tensor& alpha,
                     const at::Tensor& beta, const at::Tensor& delta, const at::Tensor& mean, at::Tensor& dx) {
  using A = at::opmath_type<T>;
  const AlignedVector<A> al = padded<A>(alpha, g), be = padded<A>(beta, g), de = padded<A>(delta, g),
                         mu = padded<A>(mean, g);
  const Z* dzp = dz.data_ptr<Z>();
  const T* xp = x.data_ptr<T>();
  T* dxp = dx.data_ptr<T>();
  OPFUSE_ON_PATH(T, grad_input_all, (run_geometry(g), dzp, xp, al.data(), be.data(), de.data(), mu.data(), dxp));
}

}  // namespace

void batch_norm_moments_kernel(const at::Tensor& x, at::Tensor& mean, at::Tensor& var_sum) {
  const Geometry g = geometry_of(x);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "opfuse::batch_norm_moments",
                                 [&] { moments_impl<scalar_t>(g, x, mean, var_sum); });
}

void batch_norm_silu_forward_kernel(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                                    at::Tensor& out) {
  const Geometry g = geometry_of(x);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "opfuse::batch_norm_silu",
                                 [&] { forward_impl<scalar_t>(g, x, scale, shift, out); });
}

void batch_norm_silu_grad_sums_kernel(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& scale,
                                      const at::Tensor& shift, const at::Tensor& mean, const at::Tensor& store_scale,
                                      at::Tensor& dz, at::Tensor& sum_dz, at::Tensor& sum_dz_xc) {
  const Geometry g = geometry_of(x);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "opfuse::batch_norm_silu_backward", [&] {
    if (dz.scalar_type() == x.scalar_type())
      grad_sums_impl<scalar_t, scalar_t>(g, dy, x, scale, shift, mean, store_scale, dz, sum_dz, sum_dz_xc);
    else
      grad_sums_impl<scalar_t, float>(g, dy, x, scale, shift, mean, store_scale, dz, sum_dz, sum_dz_xc);
  });
}

void batch_norm_silu_grad_input_kernel(const at::Tensor& dz, const at::Tensor& x, const at::Tensor& alpha,
                                       const at::Tensor& beta, const at::Tensor& delta, const at::Tensor& mean,
                                       at::Tensor& dx) {
  const Geometry g = geometry_of(x);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "opfuse::batch_norm_silu_backward", [&] {
    if (dz.scalar_type() == x.scalar_type())
      grad_input_impl<scalar_t, scalar_t>(g, dz, x, alpha, beta, delta, mean, dx);
    else
      grad_input_impl<scalar_t, float>(g, dz, x, alpha, beta, delta, mean, dx);
  });
}

}  // namespace opfuse::cpu
