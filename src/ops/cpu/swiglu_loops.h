// The loops of SwiGLU, silu(gate) · up, over rows of d elements, written once against the Lanes
// interface (lanes.h). No include guard: swiglu_kernel.cpp compiles this once per CPU path
// (per_path.h). A row's gate and up are d elements each at any offsets: two tensors, or the
// two halves of one tensor's last dimension.

#include "ops/cpu/partial_vectors.h"

// y = g · s · u,  s = sigmoid(g)
template <typename V, typename T>
void forward_row(const T* g, const T* u, int64_t d, T* y) {
  for_each_vector<V>(d, [&](int64_t j, int64_t m) {
    const typename V::F gv = load_part<V>(g + j, m, 0);
    store_part<V>(y + j, m, gv * V::sigmoid(gv) * load_part<V>(u + j, m, 0));
  });
}

// dg = dy · u · s · (1 + g · (1 − s)),  du = dy · g · s
template <typename V, typename T>
void backward_row(const T* dy, const T* g, const T* u, int64_t d, T* dg, T* du) {
  using F = typename V::F;
  const F one = V::set1(1);
  for_each_vector<V>(d, [&](int64_t j, int64_t m) {
    const F gv = load_part<V>(g + j, m, 0), s = V::sigmoid(gv), dyv = load_part<V>(dy + j, m, 0);
    store_part<V>(dg + j, m, dyv * load_part<V>(u + j, m, 0) * (s * (one + gv * (one - s))));
    store_part<V>(du + j, m, dyv * gv * s);
  });
}

// Rows (or, for long rows, pieces of kPiece elements) in parallel; every element is computed
// alone, so any split gives the same bits.
template <typename V, typename T>
void forward_all(const Layout& l, const T* gate, const T* up, T* y) {
  at::parallel_for(0, l.tasks(), grain_for(l.task_elements()), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const auto [row, col, n] = l.task(t);
      forward_row<V>(gate + row * l.in_stride + col, up + row * l.in_stride + col, n, y + row * l.d + col);
    }
  });
}

template <typename V, typename T>
void backward_all(const Layout& l, const T* dy, const T* gate, const T* up, T* dgate, T* dup) {
  at::parallel_for(0, l.tasks(), grain_for(l.task_elements()), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const auto [row, col, n] = l.task(t);
      const int64_t in = row * l.in_stride + col;
      backward_row<V>(dy + row * l.d + col, gate + in, up + in, n, dgate + in, dup + in);
    }
  });
}
