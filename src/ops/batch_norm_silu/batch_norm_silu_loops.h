// The loops of the fused BatchNorm + SiLU, written once against the Lanes interface (lanes.h).
// No include guard: batch_norm_silu_kernel.cpp includes this once per CPU path, each time in
// its own namespace and, for the vector paths, under `#pragma GCC target`, so every function
// here is compiled for the path that runs it.
//
// A run is a stretch of x whose per-channel values are known:
//   a plane run  n elements of one channel (NCHW): the channel's values broadcast to every lane
//   a row        the C channels of one pixel (channels_last, or [N, C]): loaded lane by lane
// Per-channel arrays are padded to g.cp so a row's last, partial vector stays in bounds.

#include "ops/cpu/partial_vectors.h"

template <typename V, bool kRow>
struct Sums {
  using F = typename V::F;
  double* m1;
  double* m2;
  typename V::D r1 = V::dzero(), r2 = V::dzero();
  // A plane keeps its sums in registers; a row adds each lane into its channel's slot.
  void add(int64_t j, F a, F b) {
    if constexpr (kRow) V::accumulate(m1 + j, m2 + j, a, b);
    else V::accumulate(r1, r2, a, b);
  }
  void finish() {
    if constexpr (!kRow) *m1 += V::hsum(r1), *m2 += V::hsum(r2);
  }
};

template <typename V, bool kRow>
typename V::F coef(const typename V::A* c, int64_t j) {
  if constexpr (kRow) return V::load(c + j);
  else return V::set1(*c);
}

// Σ(x − k) and Σ(x − k)², k a sample of the channel: shifting by it keeps the variance
// E[(x − k)²] − E[x − k]² free of cancellation when |mean| ≫ std.
template <typename V, bool kRow, typename T>
void moments(const T* x, int64_t n, const typename V::A* k, Sums<V, kRow>& sums) {
  for (int64_t j = 0; j < n; j += V::kLanes) {
    const int64_t m = std::min<int64_t>(V::kLanes, n - j);
    const typename V::F d = load_part<V>(x + j, m, *k) - coef<V, kRow>(k, j);
    sums.add(j, d, d);
  }
}

// y = z · sigmoid(z),  z = x · scale + shift  (scale = w·invstd, shift = b − mean·scale)
template <typename V, bool kRow, typename T>
void silu_affine(const T* x, int64_t n, const typename V::A* scale, const typename V::A* shift, T* out) {
  for (int64_t j = 0; j < n; j += V::kLanes) {
    const int64_t m = std::min<int64_t>(V::kLanes, n - j);
    const typename V::F z = load_part<V>(x + j, m, 0) * coef<V, kRow>(scale, j) + coef<V, kRow>(shift, j);
    store_part<V>(out + j, m, z * V::sigmoid(z));
  }
}

// dz = dy · s(1 + z(1 − s)), the SiLU backward at z recomputed from x; sums Σdz and
// Σdz·(x − mean) for BatchNorm's backward, and stores dz · store_scale.
template <typename V, bool kRow, typename T, typename Z>
void grad_sums(const T* dy, const T* x, int64_t n, const typename V::A* scale, const typename V::A* shift,
               const typename V::A* mean, const typename V::A* store_scale, Z* dz_out, Sums<V, kRow>& sums) {
  using F = typename V::F;
  const F one = V::set1(1);
  for (int64_t j = 0; j < n; j += V::kLanes) {
    const int64_t m = std::min<int64_t>(V::kLanes, n - j);
    const F xv = load_part<V>(x + j, m, *mean);
    const F z = xv * coef<V, kRow>(scale, j) + coef<V, kRow>(shift, j);
    const F s = V::sigmoid(z);
    const F dz = load_part<V>(dy + j, m, 0) * (s * (one + z * (one - s)));  // 0 in missing lanes
    sums.add(j, dz, xv - coef<V, kRow>(mean, j));
    store_part<V>(dz_out + j, m, dz * coef<V, kRow>(store_scale, j));
  }
}

// dx = alpha·dz + beta·(x − mean) + delta; dz may be dx's own memory.
template <typename V, bool kRow, typename T, typename Z>
void grad_input(const Z* dz, const T* x, int64_t n, const typename V::A* alpha, const typename V::A* beta,
                const typename V::A* delta, const typename V::A* mean, T* dx) {
  for (int64_t j = 0; j < n; j += V::kLanes) {
    const int64_t m = std::min<int64_t>(V::kLanes, n - j);
    const typename V::F xc = load_part<V>(x + j, m, 0) - coef<V, kRow>(mean, j);
    store_part<V>(dx + j, m,
                  coef<V, kRow>(alpha, j) * load_part<V>(dz + j, m, 0) + coef<V, kRow>(beta, j) * xc +
                      coef<V, kRow>(delta, j));
  }
}

// Calls run(offset, length, channel, sums) on every run of x. Each task owns fixed partials (a
// plane segment, or a block of rows) and the partials of each channel are added in a fixed
// order into s1, s2: the same bits whatever the thread count.
template <typename V, typename Run>
void reduce_runs(const Geometry& g, double* s1, double* s2, const Run& run) {
  std::fill(s1, s1 + g.c, 0.0);
  std::fill(s2, s2 + g.c, 0.0);
  if (!g.rows) {
    const int64_t segs = segments_per_plane(g), tasks = g.n * g.c * segs;
    std::vector<double> p1(tasks, 0.0), p2(tasks, 0.0);
    at::parallel_for(0, tasks, grain_for(std::min(g.hw, kSegment)), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t plane = t / segs, start = (t % segs) * kSegment;
        Sums<V, false> sums{&p1[t], &p2[t]};
        run(plane * g.hw + start, std::min(kSegment, g.hw - start), plane % g.c, sums);
        sums.finish();
      }
    });
    for (int64_t n = 0; n < g.n; ++n)
      for (int64_t c = 0; c < g.c; ++c)
        for (int64_t s = 0; s < segs; ++s) {
          s1[c] += p1[(n * g.c + c) * segs + s];
          s2[c] += p2[(n * g.c + c) * segs + s];
        }
    return;
  }
  const int64_t rows = g.n * g.hw, per_block = rows_per_block(g), blocks = (rows + per_block - 1) / per_block;
  if (per_block <= 2) {
    // Long rows (a sample's slots, kernel.cpp): a task owns a stretch of columns and walks down
    // every row, its sums in that stretch's own slots, which stay in cache. A partial per block
    // of rows was as large as x and took longer to fault in than to fill.
    constexpr int64_t kColumns = 256;
    const int64_t stretches = (g.c + kColumns - 1) / kColumns;
    at::parallel_for(0, stretches, grain_for(rows * kColumns), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t col = t * kColumns, width = std::min(kColumns, g.c - col);
        Sums<V, true> sums{s1 + col, s2 + col};
        for (int64_t r = 0; r < rows; ++r) run(r * g.c + col, width, col, sums);
      }
    });
    return;
  }
  AlignedVector<double> p1(blocks * g.cp, 0.0), p2(blocks * g.cp, 0.0);
  at::parallel_for(0, blocks, grain_for(per_block * g.c), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      Sums<V, true> sums{&p1[b * g.cp], &p2[b * g.cp]};
      for (int64_t r = b * per_block; r < std::min(rows, (b + 1) * per_block); ++r) run(r * g.c, g.c, 0, sums);
    }
  });
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t c = 0; c < g.c; ++c) {
      s1[c] += p1[b * g.cp + c];
      s2[c] += p2[b * g.cp + c];
    }
}

// Calls run(offset, length, channel) on every run of x, in parallel.
template <typename Run>
void for_runs(const Geometry& g, const Run& run) {
  if (!g.rows) {
    const int64_t segs = segments_per_plane(g);
    at::parallel_for(0, g.n * g.c * segs, grain_for(std::min(g.hw, kSegment)), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t plane = t / segs, start = (t % segs) * kSegment;
        run(plane * g.hw + start, std::min(kSegment, g.hw - start), plane % g.c);
      }
    });
    return;
  }
  at::parallel_for(0, g.n * g.hw, grain_for(g.c), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) run(r * g.c, g.c, 0);
  });
}

// The four passes over a whole tensor. Per-channel arrays (k, scale, …) have g.cp entries.
// A row's run starts at channel 0 (c = 0), a stretch of columns at its first (c = col).
template <typename V, typename T>
void moments_all(const Geometry& g, const T* x, const typename V::A* k, double* s1, double* s2) {
  reduce_runs<V>(g, s1, s2, [&](int64_t at, int64_t n, int64_t c, auto& sums) { moments(x + at, n, k + c, sums); });
}

template <typename V, typename T>
void silu_affine_all(const Geometry& g, const T* x, const typename V::A* scale, const typename V::A* shift, T* out) {
  for_runs(g, [&](int64_t at, int64_t n, int64_t c) {
    if (g.rows) silu_affine<V, true>(x + at, n, scale, shift, out + at);
    else silu_affine<V, false>(x + at, n, scale + c, shift + c, out + at);
  });
}

template <typename V, typename T, typename Z>
void grad_sums_all(const Geometry& g, const T* dy, const T* x, const typename V::A* scale,
                   const typename V::A* shift, const typename V::A* mean, const typename V::A* store_scale,
                   Z* dz, double* s1, double* s2) {
  reduce_runs<V>(g, s1, s2, [&](int64_t at, int64_t n, int64_t c, auto& sums) {
    grad_sums(dy + at, x + at, n, scale + c, shift + c, mean + c, store_scale + c, dz + at, sums);
  });
}

template <typename V, typename T, typename Z>
void grad_input_all(const Geometry& g, const Z* dz, const T* x, const typename V::A* alpha,
                    const typename V::A* beta, const typename V::A* delta, const typename V::A* mean, T* dx) {
  for_runs(g, [&](int64_t at, int64_t n, int64_t c) {
    if (g.rows) grad_input<V, true>(dz + at, x + at, n, alpha, beta, delta, mean, dx + at);
    else grad_input<V, false>(dz + at, x + at, n, alpha + c, beta + c, delta + c, mean + c, dx + at);
  });
}
