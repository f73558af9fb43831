// The loops of Swish / SiLU, written once against the Lanes interface (lanes.h). No include
// guard: silu_kernel.cpp compiles this once per CPU path (per_path.h).

#include "ops/cpu/partial_vectors.h"

// One run of a TensorIterator loop: out = formula(a[, b]) over n elements, kLanes at a time,
// direct when every operand is contiguous, through a gather buffer otherwise and for the tail —
// so an element's result never depends on where a thread's chunk starts. strides: in bytes, out's
// first.
template <typename V, int kInputs, typename T, typename Formula>
void map_run(T* out, const T* a, const T* b, const int64_t* strides, int64_t n, const Formula& formula) {
  char* const base[3] = {reinterpret_cast<char*>(out), reinterpret_cast<char*>(const_cast<T*>(a)),
                         reinterpret_cast<char*>(const_cast<T*>(b))};
  bool contiguous = true;
  for (int k = 0; k <= kInputs; ++k) contiguous &= strides[k] == sizeof(T);
  auto at = [&](int k, int64_t i) { return reinterpret_cast<T*>(base[k] + i * strides[k]); };
  auto apply = [&](const T* x0, const T* x1, T* y) {
    if constexpr (kInputs == 1) V::store(y, formula(V::load(x0)));
    else V::store(y, formula(V::load(x0), V::load(x1)));
  };
  int64_t i = 0;
  if (contiguous)
    for (; i + V::kLanes <= n; i += V::kLanes) apply(at(1, i), at(kInputs, i), at(0, i));
  for (; i < n; i += V::kLanes) {
    const int64_t m = std::min<int64_t>(V::kLanes, n - i);
    T in[2][V::kLanes] = {}, y[V::kLanes];
    for (int64_t j = 0; j < m; ++j)
      for (int k = 1; k <= kInputs; ++k) in[k - 1][j] = *at(k, i + j);
    apply(in[0], in[kInputs - 1], y);
    for (int64_t j = 0; j < m; ++j) *at(0, i + j) = y[j];
  }
}

// y = x · sigmoid(βx)
template <typename V, typename T>
void swish_forward_run(T* y, const T* x, const int64_t* strides, int64_t n, double beta) {
  using F = typename V::F;
  const F b = V::set1(typename V::A(beta));
  map_run<V, 1>(y, x, x, strides, n, [&](F xv) { return xv * V::sigmoid(b * xv); });
}

// dx = dy · s · (1 + βx(1 − s)),  s = sigmoid(βx)
template <typename V, typename T>
void swish_backward_run(T* dx, const T* dy, const T* x, const int64_t* strides, int64_t n, double beta) {
  using F = typename V::F;
  const F b = V::set1(typename V::A(beta)), one = V::set1(1);
  map_run<V, 2>(dx, dy, x, strides, n, [&](F dyv, F xv) {
    const F s = V::sigmoid(b * xv);
    return dyv * (s * (one + b * xv * (one - s)));
  });
}
