// The loop of one AdamW step over a run of elements, written once against the Lanes interface
// (lanes.h). No include guard: adamw_kernel.cpp compiles this once per CPU path (per_path.h).

#include "ops/cpu/partial_vectors.h"

// In torch.optim.AdamW's order (foreach=False), each product and sum rounded as its ATen op
// rounds it, with the coefficients cast to the accumulation type as ATen casts a Scalar:
//   p ← p·decay
//   m ← m·β1 + (1 − β1)·g
//   v ← v·β2 + ((1 − β2)·g)·g
//   p ← p + (−step_size·m) / (sqrt(v) · (1 / sqrt(1 − β2^t)) + eps)
// save one thing: torch divides sqrt(v) by sqrt(1 − β2^t); this multiplies by the reciprocal
// (one rounding more, ≤ 1 ulp of the denominator). The divider is the loop's bottleneck in
// cache (sqrt and two divisions: ~1 ns an element on one EPYC core, AVX-512), one fewer is a
// third off. bfloat16 is computed in float and rounded once per stored tensor.
template <typename V, typename T>
void adamw_run(const AdamWCoefficients& c, T* p, const T* g, T* m, T* v, int64_t n) {
  using F = typename V::F;
  using A = typename V::A;
  const F decay = V::set1(A(c.decay)), beta1 = V::set1(A(c.beta1)), one_minus_beta1 = V::set1(A(1 - c.beta1)),
          beta2 = V::set1(A(c.beta2)), one_minus_beta2 = V::set1(A(1 - c.beta2)),
          inv_bias_correction2_sqrt = V::set1(A(1 / c.bias_correction2_sqrt)), eps = V::set1(A(c.eps)),
          neg_step_size = V::set1(A(-c.step_size)), grad_sign = V::set1(A(c.maximize ? -1 : 1));
  for (int64_t j = 0; j < n; j += V::kLanes) {
    const int64_t k = std::min<int64_t>(V::kLanes, n - j);
    // Missing lanes of a partial vector read 1 so their (unstored) arithmetic stays finite.
    const F gv = load_part<V>(g + j, k, 1) * grad_sign;
    const F pv = load_part<V>(p + j, k, 1) * decay;
    const F mv = load_part<V>(m + j, k, 1) * beta1 + one_minus_beta1 * gv;
    const F vv = load_part<V>(v + j, k, 1) * beta2 + one_minus_beta2 * gv * gv;
    const F denom = V::sqrt(vv) * inv_bias_correction2_sqrt + eps;
    store_part<V>(p + j, k, pv + neg_step_size * mv / denom);
    store_part<V>(m + j, k, mv);
    store_part<V>(v + j, k, vv);
  }
}

template <typename V, typename T>
void adamw_all(const std::vector<AdamWTensor<T>>& tensors, const std::vector<Piece>& pieces) {
  for_each_piece(pieces, [&](const Piece& piece) {
    const AdamWTensor<T>& t = tensors[piece.tensor];
    const int64_t at = piece.begin;
    adamw_run<V>(t.coefficients, t.p + at, t.g + at, t.m + at, t.v + at, piece.n);
  });
}
