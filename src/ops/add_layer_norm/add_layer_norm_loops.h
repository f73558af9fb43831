// The loops of add + LayerNorm over rows of d elements, written once against the Lanes interface
// (lanes.h). No include guard: add_layer_norm_kernel.cpp compiles this once per CPU path (per_path.h).

#include "ops/cpu/partial_vectors.h"

// h = x + residual, rounded to T as ATen's add rounds it; returns Σh (the norm reads the rounded h).
template <typename V, typename T>
double add_row(const T* x, const T* residual, int64_t d, T* h) {
  for_each_vector<V>(d, [&](int64_t j, int64_t m) {
    store_part<V>(h + j, m, load_part<V>(x + j, m, 0) + load_part<V>(residual + j, m, 0));
  });
  const typename V::F one = V::set1(1);
  return row_dot<V>(d, [&](int64_t j, int64_t m, typename V::F& a, typename V::F& b) {
    a = load_part<V>(h + j, m, 0);
    b = one;
  });
}

// Σ (h − mean)² over a row: the variance's sum from centred values, so it keeps its digits when
// |mean| ≫ std.
template <typename V, typename T>
double centred_squares(const T* h, typename V::A mean, int64_t d) {
  const typename V::F mu = V::set1(mean);
  return row_dot<V>(d, [&](int64_t j, int64_t m, typename V::F& a, typename V::F& b) {
    a = b = load_part<V>(h + j, m, mean) - mu;  // missing lanes: mean − mean = 0
  });
}

// y = (h − mean) · rstd · w + b
template <typename V, typename T>
void normalize_row(const T* h, const T* w, const T* bias, typename V::A mean, typename V::A rstd, int64_t d, T* y) {
  const typename V::F mu = V::set1(mean), r = V::set1(rstd);
  for_each_vector<V>(d, [&](int64_t j, int64_t m) {
    const typename V::F xhat = (load_part<V>(h + j, m, 0) - mu) * r;
    store_part<V>(y + j, m, V::fmadd(xhat, load_part<V>(w + j, m, 0), load_part<V>(bias + j, m, 0)));
  });
}

// With x̂ = (h − mean)·rstd and g = dy·w:  dx = rstd·(g − Σg/d − x̂·Σg·x̂/d) (+ dh, h's own
// gradient, when it has one), and into the row block's partials (padded to whole vectors)
// dw += dy·x̂, db += dy.
template <typename V, typename T>
void backward_row(const T* dy, const T* h, const T* w, typename V::A mean, typename V::A rstd, int64_t d, const T* dh,
                  T* dx, typename V::A* dw_part, typename V::A* db_part) {
  using F = typename V::F;
  using A = typename V::A;
  const F mu = V::set1(mean), r = V::set1(rstd), one = V::set1(1);
  const double sum_g = row_dot<V>(d, [&](int64_t j, int64_t m, F& a, F& b) {
    a = load_part<V>(dy + j, m, 0) * load_part<V>(w + j, m, 0);
    b = one;
  });
  const double sum_g_xhat = row_dot<V>(d, [&](int64_t j, int64_t m, F& a, F& b) {
    a = load_part<V>(dy + j, m, 0) * load_part<V>(w + j, m, 0);
    b = (load_part<V>(h + j, m, mean) - mu) * r;
  });
  const F mean_g = V::set1(A(sum_g / d)), mean_g_xhat = V::set1(A(sum_g_xhat / d));
  for_each_vector<V>(d, [&](int64_t j, int64_t m) {
    const F g = load_part<V>(dy + j, m, 0), xhat = (load_part<V>(h + j, m, mean) - mu) * r;
    F dxv = (g * load_part<V>(w + j, m, 0) - mean_g - xhat * mean_g_xhat) * r;
    if (dh != nullptr) dxv = dxv + load_part<V>(dh + j, m, 0);
    store_part<V>(dx + j, m, dxv);
    V::store(dw_part + j, V::load(dw_part + j) + g * xhat);  // missing lanes add 0 (g is 0 there)
    V::store(db_part + j, V::load(db_part + j) + g);
  });
}

// Rows in blocks of about kBlockElements elements, one task each.
template <typename V, typename T>
void forward_all(const T* x, const T* residual, const T* w, const T* bias, int64_t rows, int64_t d, double eps, T* h,
                 T* y, typename V::A* mean, typename V::A* rstd) {
  using A = typename V::A;
  const int64_t per_block = rows_per_block(d), blocks = (rows + per_block - 1) / per_block;
  at::parallel_for(0, blocks, grain_for(per_block * d), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      for (int64_t r = b * per_block; r < std::min(rows, (b + 1) * per_block); ++r) {
        T* hr = h + r * d;
        const A mu = A(add_row<V>(x + r * d, residual + r * d, d, hr) / d);
        const A inv = A(1.0 / std::sqrt(centred_squares<V>(hr, mu, d) / d + eps));
        mean[r] = mu;
        rstd[r] = inv;
        normalize_row<V>(hr, w, bias, mu, inv, d, y + r * d);
      }
  });
}

// dw's and db's partials are kept per block of at most kDwRows rows in the accumulation type,
// then added in double in block order: the same bits for any thread count. dh may be null.
template <typename V, typename T>
void backward_all(const T* dy, const T* h, const T* w, const typename V::A* mean, const typename V::A* rstd,
                  int64_t rows, int64_t d, const T* dh, T* dx, double* dw, double* db) {
  using A = typename V::A;
  const int64_t per_block = std::min(kDwRows, rows_per_block(d)), blocks = (rows + per_block - 1) / per_block;
  const int64_t dp = padded_length(d);
  AlignedVector<A> dw_parts(blocks * dp, A(0)), db_parts(blocks * dp, A(0));
  at::parallel_for(0, blocks, grain_for(per_block * d), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      for (int64_t r = b * per_block; r < std::min(rows, (b + 1) * per_block); ++r)
        backward_row<V>(dy + r * d, h + r * d, w, mean[r], rstd[r], d, dh == nullptr ? nullptr : dh + r * d,
                        dx + r * d, &dw_parts[b * dp], &db_parts[b * dp]);
  });
  std::fill(dw, dw + d, 0.0);
  std::fill(db, db + d, 0.0);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t j = 0; j < d; ++j) {
      dw[j] += double(dw_parts[b * dp + j]);
      db[j] += double(db_parts[b * dp + j]);
    }
}
