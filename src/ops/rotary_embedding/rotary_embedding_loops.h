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

// The angles of pairs i … i + m of one table row: cos and sin at x_a's place and at x_b's. A
// per-pair table (width P) has one angle for both; a per-element one (width 2P, Hugging Face's
// cat(freqs, freqs)) has its own at each element, laid out like x.
template <typename V, bool kPerPair, bool kInterleaved>
__attribute__((always_inline)) inline void angles(const typename V::A* cos, const typename V::A* sin, int64_t P,
                                                  int64_t i, int64_t m, typename V::F& ca, typename V::F& sa,
                                                  typename V::F& cb, typename V::F& sb) {
  if constexpr (kPerPair) {
    ca = cb = load_part<V>(cos + i, m, 0);
    sa = sb = load_part<V>(sin + i, m, 0);
  } else if constexpr (kInterleaved) {
    load_pairs_part<V>(cos + 2 * i, m, ca, cb);
    load_pairs_part<V>(sin + 2 * i, m, sa, sb);
  } else {
    ca = load_part<V>(cos + i, m, 0), cb = load_part<V>(cos + P + i, m, 0);
    sa = load_part<V>(sin + i, m, 0), sb = load_part<V>(sin + P + i, m, 0);
  }
}

// Pairs i … i + m of a row: forward y_a = cos_a·x_a − sin_a·x_b, y_b = cos_b·x_b + sin_b·x_a;
// the backward applies the transposed matrix, y_a = cos_a·x_a + sin_b·x_b,
// y_b = cos_b·x_b − sin_a·x_a. One fma over one rounded product per output: every path rounds
// alike, so every path gives the same bits. The angles are read from cos and sin as they are
// (no coefficient table is built per call). Forced inline: GCC left such a helper a call, its
// vectors passed through memory, and the forward took 3× a copy's time.
template <typename V, bool kPerPair, bool kInterleaved, bool kTransposed>
__attribute__((always_inline)) inline void rotate(const typename V::A* cos, const typename V::A* sin, int64_t P,
                                                  int64_t i, int64_t m, typename V::F& xa, typename V::F& xb) {
  using F = typename V::F;
  F ca, sa, cb, sb;
  angles<V, kPerPair, kInterleaved>(cos, sin, P, i, m, ca, sa, cb, sb);
  const F zero = V::set1(0);
  const F b = kTransposed ? sb : zero - sa, c = kTransposed ? zero - sa : sb;
  const F ya = V::fmadd(ca, xa, b * xb);
  xb = V::fmadd(cb, xb, c * xa);
  xa = ya;
}

// One row of d = 2P elements: rotate-half pairs (x[i], x[P + i]) or interleaved (x[2i], x[2i + 1]).
template <typename V, typename T, bool kPerPair, bool kInterleaved, bool kTransposed>
void rotate_row(const T* x, const typename V::A* cos, const typename V::A* sin, int64_t P, T* y) {
  for_each_vector<V>(P, [&](int64_t i, int64_t m) {
    typename V::F xa, xb;
    if constexpr (kInterleaved) {
      load_pairs_part<V>(x + 2 * i, m, xa, xb);
    } else {
      xa = load_part<V>(x + i, m, 0), xb = load_part<V>(x + P + i, m, 0);
    }
    rotate<V, kPerPair, kInterleaved, kTransposed>(cos, sin, P, i, m, xa, xb);
    if constexpr (kInterleaved) {
      store_pairs_part<V>(y + 2 * i, m, xa, xb);
    } else {
      store_part<V>(y + i, m, xa);
      store_part<V>(y + P + i, m, xb);
    }
  });
}

// Rows in parallel, each taking its table row of cos and sin (TableRows); every element is
// computed alone, so any split gives the same bits.
template <typename V, typename T, bool kPerPair, bool kInterleaved, bool kTransposed>
void rotate_rows(const T* x, const RotaryTables<typename V::A>& t, at::IntArrayRef row_sizes, int64_t rows, int64_t P,
                 T* y) {
  const int64_t d = 2 * P;
  at::parallel_for(0, rows, grain_for(d), [&](int64_t begin, int64_t end) {
    TableRows table_rows(row_sizes, t.row_strides, begin);
    for (int64_t r = begin; r < end; ++r, table_rows.next()) {
      const int64_t offset = table_rows.row() * t.width;
      rotate_row<V, T, kPerPair, kInterleaved, kTransposed>(x + r * d, t.cos + offset, t.sin + offset, P, y + r * d);
    }
  });
}

// The eight loops, one per table width, layout and direction, chosen once per call.
template <typename V, typename T>
void rotate_all(const T* x, const RotaryTables<typename V::A>& t, at::IntArrayRef row_sizes, int64_t rows, int64_t P,
                bool interleaved, bool transposed, T* y) {
  const bool per_pair = t.width == P;
  auto run = [&](auto per_pair_c, auto interleaved_c, auto transposed_c) {
    rotate_rows<V, T, decltype(per_pair_c)::value, decltype(interleaved_c)::value, decltype(transposed_c)::value>(
        x, t, row_sizes, rows, P, y);
  };
  auto with_transposed = [&](auto pp, auto il) {
    transposed ? run(pp, il, std::true_type{}) : run(pp, il, std::false_type{});
  };
  auto with_layout = [&](auto pp) {
    interleaved ? with_transposed(pp, std::true_type{}) : with_transposed(pp, std::false_type{});
  };
  per_pair ? with_layout(std::true_type{}) : with_layout(std::false_type{});
}
