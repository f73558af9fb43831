// The loops of the gated units a(gate) · up, SwiGLU (a = silu) and GeGLU (a = gelu, tanh form),
// over rows of d elements, written once against the Lanes interface (lanes.h). No include guard:
// swiglu_kernel.cpp compiles this once per CPU path (per_path.h). A row's gate and up are d
// elements each at any offsets: two tensors, or the two halves of one tensor's last dimension.

#include "ops/cpu/partial_vectors.h"

// gelu's tanh form 0.5·g·(1 + tanh(c·(g + k·g³))) is g·σ(2c·(g + k·g³)), since
// 0.5·(1 + tanh(z/2)) = σ(z): it takes the sigmoid every path computes alike.
inline constexpr double kGeluC = 0.7978845608028654, kGeluK = 0.044715;  // c = sqrt(2/π)

// a(g), and with slope its derivative a'(g):
//   silu: s = σ(g), a = g·s, a' = s·(1 + g·(1 − s))
//   gelu: s = σ(z), z = 2c·g·(1 + k·g²), a = g·s, a' = s + g·s·(1 − s)·2c·(1 + 3k·g²)
template <typename V, Gate kGate>
__attribute__((always_inline)) inline typename V::F activate(typename V::F g, typename V::F* slope) {
  using F = typename V::F;
  const F one = V::set1(1);
  if constexpr (kGate == Gate::silu) {
    const F s = V::sigmoid(g);
    if (slope != nullptr) *slope = s * (one + g * (one - s));
    return g * s;
  } else {
    const F g2 = g * g, two_c = V::set1(2 * kGeluC);
    const F s = V::sigmoid(two_c * g * (one + V::set1(kGeluK) * g2));
    if (slope != nullptr) *slope = s + g * s * (one - s) * (two_c * (one + V::set1(3 * kGeluK) * g2));
    return g * s;
  }
}

// y = a(g) · u
template <typename V, Gate kGate, typename T>
void forward_row(const T* g, const T* u, int64_t d, T* y) {
  for_each_vector<V>(d, [&](int64_t j, int64_t m) {
    const typename V::F gv = load_part<V>(g + j, m, 0);
    store_part<V>(y + j, m, activate<V, kGate>(gv, nullptr) * load_part<V>(u + j, m, 0));
  });
}

// dg = dy · u · a'(g),  du = dy · a(g)
template <typename V, Gate kGate, typename T>
void backward_row(const T* dy, const T* g, const T* u, int64_t d, T* dg, T* du) {
  using F = typename V::F;
  for_each_vector<V>(d, [&](int64_t j, int64_t m) {
    F slope;
    const F a = activate<V, kGate>(load_part<V>(g + j, m, 0), &slope), dyv = load_part<V>(dy + j, m, 0);
    store_part<V>(dg + j, m, dyv * load_part<V>(u + j, m, 0) * slope);
    store_part<V>(du + j, m, dyv * a);
  });
}

// Rows (or, for long rows, pieces of kPiece elements) in parallel; every element is computed
// alone, so any split gives the same bits.
template <typename V, typename T, Gate kGate>
void forward_all(const Layout& l, const T* gate, const T* up, T* y, std::integral_constant<Gate, kGate>) {
  at::parallel_for(0, l.tasks(), grain_for(l.task_elements()), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const auto [row, col, n] = l.task(t);
      forward_row<V, kGate>(gate + row * l.in_stride + col, up + row * l.in_stride + col, n, y + row * l.d + col);
    }
  });
}

template <typename V, typename T, Gate kGate>
void backward_all(const Layout& l, const T* dy, const T* gate, const T* up, T* dgate, T* dup,
                  std::integral_constant<Gate, kGate>) {
  at::parallel_for(0, l.tasks(), grain_for(l.task_elements()), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const auto [row, col, n] = l.task(t);
      const int64_t in = row * l.in_stride + col;
      backward_row<V, kGate>(dy + row * l.d + col, gate + in, up + in, n, dgate + in, dup + in);
    }
  });
}
