// Loading and storing the last, partial vector of a run, against the Lanes interface (lanes.h).
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
