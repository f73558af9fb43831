// Loading and storing the last, partial vector of a run, and a row's dot product, against the
// Lanes interface (lanes.h).
// No include guard: each per-path loops header includes it inside its path's namespace and
// `#pragma GCC target`, so these are compiled for the path that calls them.

// The last vector of a run may be partial: its missing lanes read `fill`, chosen by the caller
// so they add nothing to what the loop sums.
template <typename V, typename T>
typename V::F load_part(const T* p, int64_t m, typename V::A fill) {
  if (m == V::kLanes) return V::load(p);
  T buf[V::kLanes];
  for (int64_t j = 0; j < V::kLanes; ++j) buf[j] = j < m ? p[j] : T(fill);
  return V::load(buf);
}

template <typename V, typename T>
void store_part(T* p, int64_t m, typename V::F v) {
  if (m == V::kLanes) return V::store(p, v);
  T buf[V::kLanes];
  V::store(buf, v);
  for (int64_t j = 0; j < m; ++j) p[j] = buf[j];
}


// body(j, m) for the vectors of a run of d elements: the whole ones with m = kLanes, a constant,
// so that inlined into the body load_part and store_part are plain loads and stores without a
// test; then the partial one, if any.
template <typename V, typename Body>
__attribute__((always_inline)) inline void for_each_vector(int64_t d, const Body& body) {
  int64_t j = 0;
  for (; j + V::kLanes <= d; j += V::kLanes) body(j, int64_t{V::kLanes});
  if (j < d) body(j, d - j);
}

// Σ a·b over a row, where pair(j, m, a, b) loads the vectors of elements j … j + m (m < kLanes:
// the last, its missing lanes 0). Products are summed with fma in the accumulation type over
// kPartial vectors, then each partial is added in double: a partial of n fmas is within
// n·2^-24 of Σ|a·b| over its terms, so the row's sum is within kPartial·2^-24 of Σ|a·b| before
// its own (double) rounding — a sum of squares within 2.4e-7 of itself. Two partials are
// formed side by side, so neither the fmas' nor the adds' latency bounds the loop.
constexpr int64_t kPartial = 4;

template <typename V, typename Pair>
__attribute__((always_inline)) inline double row_dot(int64_t d, const Pair& pair) {
  using F = typename V::F;
  constexpr int64_t kStep = 2 * kPartial * V::kLanes;
  typename V::D s0 = V::dzero(), s1 = V::dzero();
  int64_t j = 0;
  for (; j + kStep <= d; j += kStep) {
    F p0 = V::set1(0), p1 = V::set1(0), a, b;
#pragma GCC unroll 4
    for (int64_t k = 0; k < kPartial; ++k) {
      pair(j + 2 * k * V::kLanes, V::kLanes, a, b);
      p0 = V::fmadd(a, b, p0);
      pair(j + (2 * k + 1) * V::kLanes, V::kLanes, a, b);
      p1 = V::fmadd(a, b, p1);
    }
    V::add(s0, p0);
    V::add(s1, p1);
  }
  for (; j < d; j += V::kLanes) {  // the rest, a vector at a time
    F a, b;
    pair(j, std::min<int64_t>(V::kLanes, d - j), a, b);
    V::add(s0, a * b);
  }
  return V::hsum(s0) + V::hsum(s1);
}
