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

// s = sigmoid(gate), a vector at a time: one scalar sigmoid per (n, c) had cost more than the
// multiplications themselves at [16, 1152, 3, 3].
template <typename V, typename T>
void gate_sigmoid_all(const T* gate, typename V::A* s, int64_t n) {
  for_each_vector<V>(n, [&](int64_t j, int64_t m) { store_part<V>(s + j, m, V::sigmoid(load_part<V>(gate + j, m, 0))); });
}

// dgate = sigmoid(g)·sigmoid(−g) · Σ dy·x: unlike s(1 − s) it does not cancel where s rounds to 1.
template <typename V, typename T>
void gate_gradient_all(const T* gate, const typename V::A* sum, T* dgate, int64_t n) {
  for_each_vector<V>(n, [&](int64_t j, int64_t m) {
    const typename V::F g = load_part<V>(gate + j, m, 0);
    store_part<V>(dgate + j, m, V::sigmoid(g) * V::sigmoid(V::set1(0) - g) * load_part<V>(sum + j, m, 0));
  });
}

// NCHW planes this small (a late layer's 6×6 or 3×3) are mostly a partial vector each, loaded
// and stored through a buffer: at [16, 1152, 3, 3] the op ran at half the speed of x · sigmoid(g).
// A task takes a stretch of whole planes as one run of vectors instead, each plane's s spread
// over its elements in a buffer that stays in L1 (and, backward, dy·x kept there to be summed
// per plane, in order).
constexpr int64_t kStretch = 1024;  // elements: the spread and the products fit in L1

inline bool small_planes(const Geometry& g) { return !g.channels_last && g.hw > 0 && g.hw < kSmallPlane; }

// Calls body(first plane, planes, spread) for each stretch of planes, in parallel.
template <typename V, typename Body>
void for_stretches(const Geometry& g, const typename V::A* s, const Body& body) {
  const int64_t per = kStretch / g.hw, planes = g.n * g.c;
  at::parallel_for(0, (planes + per - 1) / per, grain_for(per * g.hw), [&](int64_t begin, int64_t end) {
    alignas(64) typename V::A spread[kStretch];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t p0 = t * per, count = std::min(per, planes - p0);
      for (int64_t p = 0; p < count; ++p) std::fill(spread + p * g.hw, spread + (p + 1) * g.hw, s[p0 + p]);
      body(p0, count, spread);
    }
  });
}

template <typename V, typename T>
void forward_all(const Geometry& g, const T* x, const typename V::A* s, T* out) {
  if (small_planes(g)) {
    for_stretches<V>(g, s, [&](int64_t p0, int64_t count, const typename V::A* spread) {
      const T* xs = x + p0 * g.hw;
      T* os = out + p0 * g.hw;
      for_each_vector<V>(count * g.hw, [&](int64_t j, int64_t m) {
        store_part<V>(os + j, m, load_part<V>(xs + j, m, 0) * load_part<V>(spread + j, m, 0));
      });
    });
    return;
  }
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
  if (small_planes(g)) {
    for_stretches<V>(g, s, [&](int64_t p0, int64_t count, const A* spread) {
      alignas(64) A products[kStretch];
      const int64_t at = p0 * g.hw;
      for_each_vector<V>(count * g.hw, [&](int64_t j, int64_t m) {
        const typename V::F d = load_part<V>(dy + at + j, m, 0);
        store_part<V>(dx + at + j, m, d * load_part<V>(spread + j, m, 0));
        store_part<V>(products + j, m, d * load_part<V>(x + at + j, m, 0));
      });
      for (int64_t p = 0; p < count; ++p) {
        A total = 0;
        for (int64_t k = 0; k < g.hw; ++k) total += products[p * g.hw + k];
        sum[p0 + p] = total;
      }
    });
    return;
  }
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
