// The loops of fused attention over one (batch, head), written once against the Lanes interface
// (lanes.h). No include guard: attention_kernel.cpp compiles this once per CPU path
// (per_path.h). Types Head, Problem, Scores and the helpers they use are defined there.
//
// Forward, per block of query rows (FlashAttention's online softmax):
//   for each key tile:  s = scale·q kᵀ + bias     m' = max(m, max s)      p = exp(s − m')
//                       l = l·exp(m − m') + Σp    o = o·exp(m − m') + (p·z) v
//   o /= l, the row's m and l kept            (z: the dropout multipliers, 0 or 1/(1 − p))
// Backward, per key tile, over the query blocks that see it (FlashAttention-2):
//   p = exp(s − m) / l  dv += (p·z)ᵀ do    dp = do vᵀ    ds = p·(dp·z − Σ do·o)
//   dq += scale·ds k    dk += scale·dsᵀ q
// m and l are kept apart, not as FlashAttention's lse = m + log l: a row masked whole by a large
// finite value (−1e9, finfo.min) has m near it, which absorbs log l, and exp(s − lse) was then 1
// for every key instead of 1/l (its gradients off by O(1); at −1e4, by 5e-4 in float).
// Products are BLAS calls on tiles (blas.h); the passes between them are these vector loops.

#include "ops/cpu/partial_vectors.h"

// z[j] = 1/(1 − p) or 0 for keys j0 … j0 + n − 1 of query row i: a hash of (seed, head, row,
// key), so the backward redraws the forward's mask and no mask is ever stored. The loop is
// plain 32-bit integer arithmetic, which the compiler vectorises for the path.
template <typename V>
void dropout_multipliers(const Problem& p, int64_t bh, int64_t i, int64_t j0, int64_t n, typename V::A* z) {
  using A = typename V::A;
  const uint64_t key = mix64(p.seed ^ mix64(uint64_t(bh * p.T + i)));
  const uint32_t lo = uint32_t(key), hi = uint32_t(key >> 32);
  const A keep = A(p.keep_scale);
  for (int64_t j = 0; j < n; ++j) z[j] = mix32(lo + mix32(uint32_t(j0 + j) ^ hi)) >= p.threshold ? keep : A(0);
}

// s[j] += bias[j]
template <typename V>
void add_to_row(typename V::A* s, const typename V::A* bias, int64_t n) {
  for (int64_t j = 0; j < n; j += V::kLanes) {
    const int64_t m = std::min<int64_t>(V::kLanes, n - j);
    store_part<V>(s + j, m, load_part<V>(s + j, m, 0) + load_part<V>(bias + j, m, 0));
  }
}

// max_j s[j]
template <typename V>
typename V::A row_max(const typename V::A* s, int64_t n) {
  using A = typename V::A;
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  typename V::F top = V::set1(kNegInf);
  for (int64_t j = 0; j < n; j += V::kLanes) top = V::max(top, load_part<V>(s + j, std::min<int64_t>(V::kLanes, n - j), kNegInf));
  return V::hmax(top);
}

// s[j] = exp(s[j] − shift); returns Σ_j s[j].
template <typename V>
typename V::A exp_and_sum(typename V::A* s, typename V::A shift, int64_t n) {
  using A = typename V::A;
  const typename V::F sv = V::set1(shift);
  typename V::F sum = V::set1(0);
  for (int64_t j = 0; j < n; j += V::kLanes) {
    const int64_t m = std::min<int64_t>(V::kLanes, n - j);
    const typename V::F p = V::exp(load_part<V>(s + j, m, -std::numeric_limits<A>::infinity()) - sv);
    store_part<V>(s + j, m, p);
    sum = sum + p;
  }
  return V::hsumf(sum);
}

// The shift of a row's exponentials from its max m: 0 for a row masked so far (m = −inf), whose
// every p is then exp(−inf) = 0 rather than exp(−inf + inf) = NaN.
template <typename A>
A shift_of(A m) {
  return m == -std::numeric_limits<A>::infinity() ? A(0) : m;
}

// s[j] = exp(s[j] − shift) · c
template <typename V>
void exp_scaled(typename V::A* s, typename V::A shift, typename V::A c, int64_t n) {
  const typename V::F sv = V::set1(shift), cv = V::set1(c);
  for (int64_t j = 0; j < n; j += V::kLanes) {
    const int64_t m = std::min<int64_t>(V::kLanes, n - j);
    store_part<V>(s + j, m, V::exp(load_part<V>(s + j, m, -std::numeric_limits<typename V::A>::infinity()) - sv) * cv);
  }
}

// out[j] = x[j] · c   (out may be x)
template <typename V>
void scale_row(const typename V::A* x, typename V::A c, int64_t n, typename V::A* out) {
  const typename V::F cv = V::set1(c);
  for (int64_t j = 0; j < n; j += V::kLanes) {
    const int64_t m = std::min<int64_t>(V::kLanes, n - j);
    store_part<V>(out + j, m, load_part<V>(x + j, m, 0) * cv);
  }
}

// out[j] = x[j] · z[j]
template <typename V>
void multiply_row(const typename V::A* x, const typename V::A* z, int64_t n, typename V::A* out) {
  for (int64_t j = 0; j < n; j += V::kLanes) {
    const int64_t m = std::min<int64_t>(V::kLanes, n - j);
    store_part<V>(out + j, m, load_part<V>(x + j, m, 0) * load_part<V>(z + j, m, 0));
  }
}

// p[j] = p[j] · (dp[j] · z[j] − d)   (z null: no dropout)
template <typename V>
void softmax_grad_row(typename V::A* p, const typename V::A* dp, const typename V::A* z, typename V::A d, int64_t n) {
  const typename V::F dv = V::set1(d);
  for (int64_t j = 0; j < n; j += V::kLanes) {
    const int64_t m = std::min<int64_t>(V::kLanes, n - j);
    typename V::F g = load_part<V>(dp + j, m, 0);
    if (z) g = g * load_part<V>(z + j, m, 0);
    store_part<V>(p + j, m, load_part<V>(p + j, m, 0) * (g - dv));
  }
}

// Σ_j x[j] · y[j]
template <typename V, typename T>
typename V::A dot_row(const T* x, const T* y, int64_t n) {
  typename V::F sum = V::set1(0);
  for (int64_t j = 0; j < n; j += V::kLanes) {
    const int64_t m = std::min<int64_t>(V::kLanes, n - j);
    sum = sum + load_part<V>(x + j, m, 0) * load_part<V>(y + j, m, 0);
  }
  return V::hsumf(sum);
}

// rows × n of src (accumulation type) into dst (storage type), rounding once.
template <typename V, typename T>
void store_rows(const typename V::A* src, int64_t ld_src, int64_t rows, int64_t n, T* dst, int64_t ld_dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; j += V::kLanes) {
      const int64_t m = std::min<int64_t>(V::kLanes, n - j);
      store_part<V>(dst + r * ld_dst + j, m, load_part<V>(src + r * ld_src + j, m, 0));
    }
}

// The scores of query rows [i0, i0 + rows) against key tile [j0, j0 + n), bias and causal
// limit applied: s = scale · q kᵀ + bias, −inf above the diagonal. Returns nothing; row r is
// s + r·p.tile.
template <typename V>
void tile_scores(const Head<typename V::A>& h, const Problem& p, int64_t i0, int64_t rows, int64_t j0, int64_t n,
                 typename V::A* s, typename V::A* bias) {
  using A = typename V::A;
  gemm<A>(false, true, rows, n, p.D, A(p.scale), h.q + i0 * h.ldq, h.ldq, h.k + j0 * h.ldk, h.ldk, A(0), s, p.tile);
  for (int64_t r = 0; r < rows; ++r) {
    A* row = s + r * p.tile;
    if (h.mask.row_bias(i0 + r, j0, n, bias)) add_to_row<V>(row, bias, n);
    if (p.causal)
      for (int64_t j = std::max<int64_t>(0, i0 + r + 1 - j0); j < n; ++j) row[j] = -std::numeric_limits<A>::infinity();
  }
}

// One block of query rows [i0, i0 + rows): o (rows × Dv, written as T) and each row's (m, l).
template <typename V, typename T>
void forward_block(const Head<typename V::A>& h, const Problem& p, int64_t bh, int64_t i0, int64_t rows,
                   Scratch<typename V::A>& w, T* out, int64_t ldo, typename V::A* stats) {
  using A = typename V::A;
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  std::fill_n(w.o, rows * p.Dv, A(0));
  std::fill_n(w.m, rows, kNegInf);
  std::fill_n(w.l, rows, A(0));
  const int64_t keys = p.causal ? std::min(p.S, i0 + rows) : p.S;
  for (int64_t j0 = 0; j0 < keys; j0 += p.tile) {
    const int64_t n = std::min(p.tile, keys - j0);
    tile_scores<V>(h, p, i0, rows, j0, n, w.s, w.bias);
    for (int64_t r = 0; r < rows; ++r) {
      A* row = w.s + r * p.tile;
      const A top = std::max(w.m[r], row_max<V>(row, n));
      const A shift = shift_of(top);
      const A rescale = std::exp(w.m[r] - shift);
      w.l[r] = w.l[r] * rescale + exp_and_sum<V>(row, shift, n);
      w.m[r] = top;
      if (rescale != A(1)) scale_row<V>(&w.o[r * p.Dv], rescale, p.Dv, &w.o[r * p.Dv]);
      if (p.dropout) {
        dropout_multipliers<V>(p, bh, i0 + r, j0, n, w.z);
        multiply_row<V>(row, w.z, n, row);
      }
    }
    gemm<A>(false, false, rows, p.Dv, n, A(1), w.s, p.tile, h.v + j0 * h.ldv, h.ldv, A(1), w.o, p.Dv);
  }
  for (int64_t r = 0; r < rows; ++r) {
    scale_row<V>(&w.o[r * p.Dv], A(1) / w.l[r], p.Dv, &w.o[r * p.Dv]);  // l = 0 (all masked): NaN, as softmax
    stats[2 * (i0 + r)] = w.m[r], stats[2 * (i0 + r) + 1] = w.l[r];
  }
  store_rows<V>(w.o, p.Dv, rows, p.Dv, out + i0 * ldo, ldo);
}

// The gradients of one (batch, head). g holds do and o (accumulation type, rows of Dv) and
// the head's row stats (m, l); dq, dk, dv are written as T with leading dimensions D, D, Dv.
template <typename V, typename T>
void backward_head(const Head<typename V::A>& h, const Grad<typename V::A>& g, const Problem& p, int64_t bh,
                   Scratch<typename V::A>& w, T* dq, T* dk, T* dv, typename V::A* dscores) {
  using A = typename V::A;
  for (int64_t i = 0; i < p.T; ++i) w.delta[i] = dot_row<V>(g.dout + i * g.ld_dout, g.out + i * g.ld_out, p.Dv);
  std::fill_n(w.dq, p.T * p.D, A(0));
  const A scale = A(p.scale);
  for (int64_t j0 = 0; j0 < p.S; j0 += p.tile) {
    const int64_t n = std::min(p.tile, p.S - j0);
    std::fill_n(w.dk, p.tile * p.D, A(0));
    std::fill_n(w.dv, p.tile * p.Dv, A(0));
    for (int64_t i0 = p.causal ? j0 / p.tile * p.tile : 0; i0 < p.T; i0 += p.tile) {
      const int64_t rows = std::min(p.tile, p.T - i0);
      A *s = w.s, *dp = w.dp, *pz = p.dropout ? w.pz : s;
      tile_scores<V>(h, p, i0, rows, j0, n, s, w.bias);
      for (int64_t r = 0; r < rows; ++r) {
        A* row = s + r * p.tile;
        // a row masked whole by −inf (sum 0): every p is 0, as the composite's masked_fill passes
        // no gradient to its places (its softmax's output there is NaN, not its gradient)
        const A m = g.stats[2 * (i0 + r)], l = g.stats[2 * (i0 + r) + 1];
        exp_scaled<V>(row, shift_of(m), l > 0 ? A(1) / l : A(0), n);
        if (p.dropout) {
          dropout_multipliers<V>(p, bh, i0 + r, j0, n, &w.z[r * p.tile]);
          multiply_row<V>(row, &w.z[r * p.tile], n, pz + r * p.tile);
        }
      }
      const A* dout = g.dout + i0 * g.ld_dout;
      gemm<A>(true, false, n, p.Dv, rows, A(1), pz, p.tile, dout, g.ld_dout, A(1), w.dv, p.Dv);
      gemm<A>(false, true, rows, n, p.Dv, A(1), dout, g.ld_dout, h.v + j0 * h.ldv, h.ldv, A(0), dp, p.tile);
      for (int64_t r = 0; r < rows; ++r)
        softmax_grad_row<V>(s + r * p.tile, dp + r * p.tile, p.dropout ? &w.z[r * p.tile] : nullptr, w.delta[i0 + r], n);
      if (dscores)  // the additive mask's gradient is the scores' (T5's trained position bias)
        for (int64_t r = 0; r < rows; ++r) std::copy_n(s + r * p.tile, n, dscores + (i0 + r) * p.S + j0);
      gemm<A>(false, false, rows, p.D, n, scale, s, p.tile, h.k + j0 * h.ldk, h.ldk, A(1), &w.dq[i0 * p.D], p.D);
      gemm<A>(true, false, n, p.D, rows, scale, s, p.tile, h.q + i0 * h.ldq, h.ldq, A(1), w.dk, p.D);
    }
    store_rows<V>(w.dk, p.D, n, p.D, dk + j0 * p.D, p.D);
    store_rows<V>(w.dv, p.Dv, n, p.Dv, dv + j0 * p.Dv, p.Dv);
  }
  store_rows<V>(w.dq, p.D, p.T, p.D, dq, p.D);
}
