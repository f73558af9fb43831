// The loop of one SGD step over a run of elements, written once against the Lanes interface
// (lanes.h). No include guard: sgd_kernel.cpp compiles this once per CPU path (per_path.h).

#include "ops/cpu/partial_vectors.h"

// In torch.optim.SGD's order (foreach=False), the coefficients in the accumulation type:
//   d ← g + weight_decay·p                        (g negated if maximize)
//   b ← b·momentum + (1 − dampening)·d            (b ← d on the buffer's first step)
//   d ← d + momentum·b if nesterov, else b
//   p ← p + (−lr)·d
// Each product and sum rounded once; torch's vectorised add fuses the product into the sum
// (one rounding fewer, ≤ 1 ulp apart). bfloat16 is computed in float and rounded once per stored
// tensor, where torch 1.13 rounds the coefficients and every intermediate to bfloat16: more
// accurate, and a few bfloat16 ulps from torch's trajectory. b is null without momentum.
template <typename V, typename T>
void sgd_run(const SgdCoefficients& c, T* p, const T* g, T* b, int64_t n) {
  using F = typename V::F;
  using A = typename V::A;
  const F weight_decay = V::set1(A(c.weight_decay)), momentum = V::set1(A(c.momentum)),
          one_minus_dampening = V::set1(A(1 - c.dampening)), neg_lr = V::set1(A(-c.lr)),
          grad_sign = V::set1(A(c.maximize ? -1 : 1));
  for (int64_t j = 0; j < n; j += V::kLanes) {
    const int64_t k = std::min<int64_t>(V::kLanes, n - j);
    const F pv = load_part<V>(p + j, k, 0);
    F d = load_part<V>(g + j, k, 0) * grad_sign;
    if (c.weight_decay != 0) d = d + weight_decay * pv;
    if (b != nullptr) {
      const F bv = c.fresh_buffers ? d : load_part<V>(b + j, k, 0) * momentum + one_minus_dampening * d;
      store_part<V>(b + j, k, bv);
      d = c.nesterov ? d + momentum * bv : bv;
    }
    store_part<V>(p + j, k, pv + neg_lr * d);
  }
}

template <typename V, typename T>
void sgd_all(const std::vector<SgdTensor<T>>& tensors, const SgdCoefficients& c, const std::vector<Piece>& pieces) {
  for_each_piece(pieces, [&](const Piece& piece) {
    const SgdTensor<T>& t = tensors[piece.tensor];
    const int64_t at = piece.begin;
    sgd_run<V>(c, t.p + at, t.g + at, t.b == nullptr ? nullptr : t.b + at, piece.n);
  });
}
