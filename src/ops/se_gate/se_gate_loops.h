// The loops of the squeeze-and-excitation gate, written once against the Lanes interface
// (lanes.h). No include guard: se_gate_kernel.cpp compiles this once per CPU path (per_path.h).
// A is the accumulation type, s the gate's sigmoid per (n, c).

#include "ops/cpu/partial_vectors.h"

// out = x · s over a plane (NCHW: one s per plane).
template <typename V, typename T>
void scale_plane(const T* x, typename V::A s, T* out, int64_t n) {
  const typename V::F sv = V::set1(s);
  for_each_vector<V>(n, [&](int64_t j, int64_t m) { store_part<V>(out + j, m, load_part<V>(x + j, m, 0) * sv); });
}

// dx = dy · s over a plane, and its Σ dy·x. Two accumulators hide the fma latency; they are
// combined in a fixed order (hsumf), so the sum depends on the data and the path only.
template <typename V, typename T>
typename V::A scale_dot_plane(const T* dy, const T* x, typename V::A s, T* dx, int64_t n) {
  using F = typename V::F;
  const F sv = V::set1(s);
  F acc0 = V::set1(0), acc1 = V::set1(0);
  int64_t j = 0;
  for (; j + 2 * V::kLanes <= n; j += 2 * V::kLanes) {
    const F d0 = V::load(dy + j), d1 = V::load(dy + j + V::kLanes);
    V::store(dx + j, d0 * sv);
    V::store(dx + j + V::kLanes, d1 * sv);
    acc0 = V::fmadd(d0, V::load(x + j), acc0);
    acc1 = V::fmadd(d1, V::load(x + j + V::kLanes), acc1);
  }
  for (; j < n; j += V::kLanes) {  // the rest, the last vector maybe partial (its missing lanes add 0)
    const int64_t m = std::min<int64_t>(V::kLanes, n - j);
    const F d0 = load_part<V>(dy + j, m, 0);
    store_part<V>(dx + j, m, d0 * sv);
    acc0 = V::fmadd(d0, load_part<V>(x + j, m, 0), acc0);
  }
  return V::hsumf(acc0 + acc1);
}

// out = x · s[c] over a row of channels (channels_last).
template <typename V, typename T>
void multiply_row(const T* x, const typename V::A* s, T* out, int64_t c) {
  for_each_vector<V>(c, [&](int64_t j, int64_t m) {
    store_part<V>(out + j, m, load_part<V>(x + j, m, 0) * load_part<V>(s + j, m, 0));
  });
}

// dx = dy · s[c] over a row of channels, and acc[c] += dy·x.
template <typename V, typename T>
void multiply_accumulate_row(const T* dy, const T* x, const typename V::A* s, T* dx, typename V::A* acc, int64_t c) {
  for_each_vector<V>(c, [&](int64_t j, int64_t m) {
    const typename V::F d = load_part<V>(dy + j, m, 0);
    store_part<V>(dx + j, m, d * load_part<V>(s + j, m, 0));
    store_part<V>(acc + j, m, V::fmadd(d, load_part<V>(x + j, m, 0), load_part<V>(acc + j, m, 0)));
  });
}

template <typename V, typename T>
void forward_all(const Geometry& g, const T* x, const typename V::A* s, T* out) {
  if (!g.channels_last) {
    at::parallel_for(0, g.n * g.c, grain_for(g.hw), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) scale_plane<V>(x + p * g.hw, s[p], out + p * g.hw, g.hw);
    });
    return;
  }
  at::parallel_for(0, g.n * g.hw, grain_for(g.c), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) multiply_row<V>(x + r * g.c, s + (r / g.hw) * g.c, out + r * g.c, g.c);
  });
}

// Each (n, c) sum is owned by one task and summed in a fixed order, so the result does not
// depend on the thread count. channels_last: a task is one sample's block of kChannelBlock
// channels, its rows in order.
template <typename V, typename T>
void backward_all(const Geometry& g, const T* dy, const T* x, const typename V::A* s, T* dx, typename V::A* sum) {
  using A = typename V::A;
  if (!g.channels_last) {
    at::parallel_for(0, g.n * g.c, grain_for(g.hw), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p)
        sum[p] = scale_dot_plane<V>(dy + p * g.hw, x + p * g.hw, s[p], dx + p * g.hw, g.hw);
    });
    return;
  }
  const int64_t blocks = (g.c + kChannelBlock - 1) / kChannelBlock;
  at::parallel_for(0, g.n * blocks, grain_for(g.hw * kChannelBlock), [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t n = task / blocks, c0 = (task % blocks) * kChannelBlock;
      const int64_t width = std::min(kChannelBlock, g.c - c0);
      A* acc = sum + n * g.c + c0;
      std::fill(acc, acc + width, A(0));
      for (int64_t r = n * g.hw; r < (n + 1) * g.hw; ++r) {
        const int64_t at = r * g.c + c0;
        multiply_accumulate_row<V>(dy + at, x + at, s + n * g.c + c0, dx + at, acc, width);
      }
    }
  });
}
