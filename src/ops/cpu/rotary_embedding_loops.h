// The loops of the rotary embedding over rows of d = 2P elements, written once against the Lanes
// interface (lanes.h). No include guard: rotary_embedding_kernel.cpp compiles this once per CPU
// path (per_path.h).

#include "ops/cpu/partial_vectors.h"

// The last block of a row may hold m < kLanes pairs; missing pairs read 0 and are not stored.
template <typename V, typename T>
void load_pairs_part(const T* p, int64_t m, typename V::F& even, typename V::F& odd) {
  if (m == V::kLanes) return V::load_pairs(p, even, odd);
  T buf[2 * V::kLanes];
  for (int64_t j = 0; j < 2 * V::kLanes; ++j) buf[j] = j < 2 * m ? p[j] : T(0);
  V::load_pairs(buf, even, odd);
}

template <typename V, typename T>
void store_pairs_part(T* p, int64_t m, typename V::F even, typename V::F odd) {
  if (m == V::kLanes) return V::store_pairs(p, even, odd);
  T buf[2 * V::kLanes];
  V::store_pairs(buf, even, odd);
  for (int64_t j = 0; j < 2 * m; ++j) p[j] = buf[j];
}

// (x_a, x_b) ← (a·x_a + b·x_b, c·x_a + d·x_b) for pairs i … i + m of a row whose coefficients
// k = [a | b | c | d] are P each. One fma over one rounded product per output: every path rounds
// alike, so every path gives the same bits. Forced inline: GCC left it a call, its vectors passed
// through memory, and the forward took 3× a copy's time (178 µs against 54 for [4, 256, 8, 64]).
template <typename V>
__attribute__((always_inline)) inline void rotate(const typename V::A* k, int64_t P, int64_t i, int64_t m, typename V::F& xa, typename V::F& xb) {
  using F = typename V::F;
  const F a = load_part<V>(k + i, m, 0), b = load_part<V>(k + P + i, m, 0);
  const F c = load_part<V>(k + 2 * P + i, m, 0), d = load_part<V>(k + 3 * P + i, m, 0);
  const F ya = V::fmadd(a, xa, b * xb);
  xb = V::fmadd(d, xb, c * xa);
  xa = ya;
}

// Rotate-half: pair i is (x[i], x[P + i]).
template <typename V, typename T>
void rotate_half_row(const T* x, const typename V::A* k, int64_t P, T* y) {
  for (int64_t i = 0; i < P; i += V::kLanes) {
    const int64_t m = std::min<int64_t>(V::kLanes, P - i);
    typename V::F xa = load_part<V>(x + i, m, 0), xb = load_part<V>(x + P + i, m, 0);
    rotate<V>(k, P, i, m, xa, xb);
    store_part<V>(y + i, m, xa);
    store_part<V>(y + P + i, m, xb);
  }
}

// Interleaved: pair i is (x[2i], x[2i + 1]).
template <typename V, typename T>
void rotate_interleaved_row(const T* x, const typename V::A* k, int64_t P, T* y) {
  for (int64_t i = 0; i < P; i += V::kLanes) {
    const int64_t m = std::min<int64_t>(V::kLanes, P - i);
    typename V::F xa, xb;
    load_pairs_part<V>(x + 2 * i, m, xa, xb);
    rotate<V>(k, P, i, m, xa, xb);
    store_pairs_part<V>(y + 2 * i, m, xa, xb);
  }
}

// Rows in parallel, each taking its table row (TableRows); every element is computed alone, so any
// split gives the same bits.
template <typename V, typename T>
void rotate_all(const T* x, const typename V::A* table, at::IntArrayRef row_sizes, at::IntArrayRef table_row_strides,
                int64_t rows, int64_t P, bool interleaved, T* y) {
  const int64_t d = 2 * P;
  at::parallel_for(0, rows, grain_for(d), [&](int64_t begin, int64_t end) {
    TableRows table_rows(row_sizes, table_row_strides, begin);
    for (int64_t r = begin; r < end; ++r, table_rows.next()) {
      const typename V::A* k = table + table_rows.row() * 4 * P;
      if (interleaved)
        rotate_interleaved_row<V>(x + r * d, k, P, y + r * d);
      else
        rotate_half_row<V>(x + r * d, k, P, y + r * d);
    }
  });
}
