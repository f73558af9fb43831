// The loops of drop connect + residual add, written once against the Lanes interface (lanes.h).
// No include guard: drop_connect_add_kernel.cpp compiles this once per CPU path (per_path.h).
// keep and m (the sample's mask value) are in the accumulation type.

#include "ops/cpu/partial_vectors.h"

// out = (x / keep) · m + residual over a run of one sample, x / keep rounded to T as the
// composite rounds it.
template <typename V, typename T>
void forward_run(const T* x, const T* residual, typename V::A keep, typename V::A m, T* out, int64_t n) {
  using F = typename V::F;
  const F k = V::set1(keep), mv = V::set1(m);
  for_each_vector<V>(n, [&](int64_t j, int64_t len) {
    const F scaled = V::template round_as<T>(load_part<V>(x + j, len, 0) / k);
    store_part<V>(out + j, len, scaled * mv + load_part<V>(residual + j, len, 0));
  });
}

// dx = (dy · m) / keep over a run of one sample, dy · m rounded to T.
template <typename V, typename T>
void backward_run(const T* dy, typename V::A keep, typename V::A m, T* dx, int64_t n) {
  using F = typename V::F;
  const F k = V::set1(keep), mv = V::set1(m);
  for_each_vector<V>(n, [&](int64_t j, int64_t len) {
    store_part<V>(dx + j, len, V::template round_as<T>(load_part<V>(dy + j, len, 0) * mv) / k);
  });
}
