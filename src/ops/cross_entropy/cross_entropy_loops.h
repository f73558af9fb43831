// The loops of cross entropy over rows of n logits, written once against the Lanes interface
// (lanes.h). No include guard: cross_entropy_kernel.cpp compiles this once per CPU path
// (per_path.h).

#include "ops/cpu/partial_vectors.h"

// max_j x_j and, for label smoothing, Σ_j x_j (double), in one pass; the missing lanes of the
// last vector read −inf for the max and 0 for the sum.
template <typename V, typename T>
typename V::A row_max(const T* x, int64_t n, bool with_sum, double& sum) {
  using F = typename V::F;
  const typename V::A lowest = -std::numeric_limits<typename V::A>::infinity();
  F top = V::set1(lowest);
  typename V::D s1 = V::dzero(), s2 = V::dzero();
  const F one = V::set1(1);
  for (int64_t j = 0; j < n; j += V::kLanes) {
    const int64_t m = std::min<int64_t>(V::kLanes, n - j);
    top = V::max(top, load_part<V>(x + j, m, lowest));
    if (with_sum) V::accumulate(s1, s2, load_part<V>(x + j, m, 0), one);
  }
  sum = with_sum ? V::hsum(s1) : 0;
  return V::hmax(top);
}

// Σ_j e_j in double, e_j = exp(x_j − max), each e_j also stored when e is given (it may be x's
// own memory: each vector is loaded before it is overwritten). Missing lanes read −inf: e = 0.
template <typename V, typename T>
double row_exp_sum(const T* x, int64_t n, typename V::A max, typename V::A* e) {
  using F = typename V::F;
  const typename V::A lowest = -std::numeric_limits<typename V::A>::infinity();
  const F mv = V::set1(max), one = V::set1(1);
  typename V::D s1 = V::dzero(), s2 = V::dzero();
  for (int64_t j = 0; j < n; j += V::kLanes) {
    const int64_t m = std::min<int64_t>(V::kLanes, n - j);
    const F ej = V::exp(load_part<V>(x + j, m, lowest) - mv);
    if (e != nullptr) store_part<V>(e + j, m, ej);
    V::accumulate(s1, s2, ej, one);
  }
  return V::hsum(s1);
}

// One row, target t (ignore_index: loss 0 and a zero gradient row):
//   lse = max + log Σ_j exp(x_j − max)
//   loss = lse − (1 − ε)·x_t − ε/n · Σ_j x_j                         (double)
//   g_j = c·(e_j / Σe − ε/n) − c·(1 − ε)·[j = t]                       (c: the reduction's scale)
// g_j is one fma of the stored e_j; g_t is computed in double and rounded once. With g null
// only the loss is computed. e (the accumulation type) may share memory with x and g: the
// float32 and float64 rows are computed where g lies, bfloat16 rows through a float row.
template <typename V, typename T>
double row_forward(const T* x, int64_t n, int64_t t, int64_t ignore_index, double smoothing, double c,
                   typename V::A* e, T* g) {
  using A = typename V::A;
  using F = typename V::F;
  if (t == ignore_index) {
    if (g != nullptr) std::fill(g, g + n, T(0));
    return 0;
  }
  double sum_x = 0;
  const A max = row_max<V>(x, n, smoothing != 0, sum_x);
  const double x_t = double(x[t]);
  const double sum_e = row_exp_sum<V>(x, n, max, g == nullptr ? nullptr : e);
  const double loss = double(max) + std::log(sum_e) - (1 - smoothing) * x_t - smoothing / n * sum_x;
  if (g == nullptr) return loss;
  const double e_t = double(e[t]);
  const F k = V::set1(A(c / sum_e)), shift = V::set1(A(-c * smoothing / n));
  for (int64_t j = 0; j < n; j += V::kLanes) {
    const int64_t m = std::min<int64_t>(V::kLanes, n - j);
    store_part<V>(g + j, m, V::fmadd(load_part<V>(e + j, m, 0), k, shift));
  }
  g[t] = T(c * (e_t / sum_e - smoothing / n - (1 - smoothing)));
  return loss;
}

// Rows in parallel (row r at x + r·row_stride, its gradient at g + r·n); each row is computed
// alone, so the bits do not depend on the thread count. losses[r] is row r's loss.
template <typename V, typename T>
void forward_all(const T* x, int64_t rows, int64_t n, int64_t row_stride, const int64_t* target, int64_t ignore_index,
                 double smoothing, double c, double* losses, T* g) {
  using A = typename V::A;
  at::parallel_for(0, rows, grain_for(n), [&](int64_t begin, int64_t end) {
    AlignedVector<A> scratch(std::is_same_v<T, A> || g == nullptr ? 0 : n);
    for (int64_t r = begin; r < end; ++r) {
      T* gr = g == nullptr ? nullptr : g + r * n;
      A* e = nullptr;
      if constexpr (std::is_same_v<T, A>)
        e = gr;
      else
        e = scratch.data();
      losses[r] = row_forward<V>(x + r * row_stride, n, target[r], ignore_index, smoothing, c, e, gr);
    }
  });
}
