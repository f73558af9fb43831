// The loops of RMSNorm over rows of d elements, written once against the Lanes interface
// (lanes.h). No include guard: rms_norm_kernel.cpp compiles this once per CPU path (per_path.h).

#include "ops/cpu/partial_vectors.h"

// Σ x² over a row.
template <typename V, typename T>
double sum_of_squares(const T* x, int64_t d) {
  return row_dot<V>(d, [&](int64_t j, int64_t m, typename V::F& a, typename V::F& b) {
    a = b = load_part<V>(x + j, m, 0);
  });
}

// h = x + residual, rounded to T as ATen's add rounds it (the norm then reads the rounded h).
template <typename V, typename T>
void add_row(const T* x, const T* residual, int64_t d, T* h) {
  for_each_vector<V>(d, [&](int64_t j, int64_t m) {
    store_part<V>(h + j, m, load_part<V>(x + j, m, 0) + load_part<V>(residual + j, m, 0));
  });
}

// y = x · rstd · w
template <typename V, typename T>
void normalize_row(const T* x, const T* w, typename V::A rstd, int64_t d, T* y) {
  const typename V::F r = V::set1(rstd);
  for_each_vector<V>(d, [&](int64_t j, int64_t m) {
    store_part<V>(y + j, m, load_part<V>(x + j, m, 0) * r * load_part<V>(w + j, m, 0));
  });
}

// With g = dy · w and c = Σ g·x:  dx = g · rstd − x · rstd³ · c / d (+ dh, the gradient x
// receives besides, when add_rms_norm's h has one: kDh), and into the row block's partial dw
// (padded to whole vectors): dy · x · rstd.
template <typename V, bool kDh, typename T>
void backward_row(const T* dy, const T* x, const T* w, typename V::A rstd, int64_t d, const T* dh, T* dx,
                  typename V::A* dw_part) {
  using F = typename V::F;
  using A = typename V::A;
  const double c = row_dot<V>(d, [&](int64_t j, int64_t m, F& a, F& b) {
    a = load_part<V>(dy + j, m, 0) * load_part<V>(w + j, m, 0);  // g, rounded once as in dx
    b = load_part<V>(x + j, m, 0);
  });
  const F r = V::set1(rstd), kv = V::set1(A(double(rstd) * rstd * rstd * c / d));
  for_each_vector<V>(d, [&](int64_t j, int64_t m) {
    const F g = load_part<V>(dy + j, m, 0), xv = load_part<V>(x + j, m, 0);
    F dxv = g * load_part<V>(w + j, m, 0) * r - xv * kv;
    if constexpr (kDh) dxv = dxv + load_part<V>(dh + j, m, 0);  // rounded once, with the rest
    store_part<V>(dx + j, m, dxv);
    V::store(dw_part + j, V::load(dw_part + j) + g * (xv * r));  // missing lanes add 0
  });
}

// Rows are cut into blocks of about kBlockElements elements; each block is one task and keeps
// its own dw partials, added in block order: the same bits for any thread count.
// With a residual (add_rms_norm), each row's h = x + residual is written first and normalized
// while it is in cache; residual and h are null for rms_norm.
template <typename V, typename T>
void forward_all(const T* x, const T* residual, const T* w, int64_t rows, int64_t d, double eps, T* h, T* y,
                 typename V::A* rstd) {
  using A = typename V::A;
  const int64_t per_block = rows_per_block(d), blocks = (rows + per_block - 1) / per_block;
  at::parallel_for(0, blocks, grain_for(per_block * d), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      for (int64_t r = b * per_block; r < std::min(rows, (b + 1) * per_block); ++r) {
        const T* row = x + r * d;
        if (residual != nullptr) {
          add_row<V>(row, residual + r * d, d, h + r * d);
          row = h + r * d;
        }
        const A inv = A(1.0 / std::sqrt(sum_of_squares<V>(row, d) / d + eps));
        rstd[r] = inv;
        normalize_row<V>(row, w, inv, d, y + r * d);
      }
  });
}

// dw's partials are kept per block of at most kDwRows rows in the accumulation type (a float
// sum of ≤ 16 terms), then the blocks are added in double, in block order. dh is null, or
// add_rms_norm's gradient of h, added into dx.
template <typename V, typename T>
void backward_all(const T* dy, const T* x, const T* w, const typename V::A* rstd, int64_t rows, int64_t d,
                  const T* dh, T* dx, double* dw) {
  using A = typename V::A;
  const int64_t per_block = std::min(kDwRows, rows_per_block(d)), blocks = (rows + per_block - 1) / per_block;
  const int64_t dp = padded_length(d);
  AlignedVector<A> parts(blocks * dp, A(0));
  at::parallel_for(0, blocks, grain_for(per_block * d), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      for (int64_t r = b * per_block; r < std::min(rows, (b + 1) * per_block); ++r) {
        T* dxr = dx + r * d;
        A* part = &parts[b * dp];
        if (dh == nullptr) backward_row<V, false>(dy + r * d, x + r * d, w, rstd[r], d, dh, dxr, part);
        else backward_row<V, true>(dy + r * d, x + r * d, w, rstd[r], d, dh + r * d, dxr, part);
      }
  });
  std::fill(dw, dw + d, 0.0);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t j = 0; j < d; ++j) dw[j] += double(parts[b * dp + j]);
}
