// Squeeze-and-excitation gate, forward and fused backward, for x [N, C, H·W] (NCHW) or
// [N, H·W, C] (channels_last) and a gate of N·C values, s = sigmoid(gate):
//   forward   y     = x · s[n,c]
//   backward  dx    = dy · s[n,c]
//             dgate = s(1 − s) · Σ_hw dy·x      (the reduction rides along the dx pass)
//             with s(1 − s) taken as sigmoid(g)·sigmoid(−g), exact where s rounds to 1
// Each (n, c) sum is owned by one task and summed in a fixed order, so the result does not
// depend on the thread count.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <vector>

#include "ops/cpu/capability.h"
#include "ops/cpu/grain.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/vec_math.h"

namespace opfuse::cpu {
namespace {

#define OPFUSE_AVX2_FN __attribute__((target("avx2,fma")))

// The four inner loops, written once per path. A is the accumulation type.
template <typename T, typename A>
struct ScalarLoops {
  static void scale(const T* x, A s, T* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = T(A(x[i]) * s);
  }
  static A scale_dot(const T* dy, const T* x, A s, T* dx, int64_t n) {
    A sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      dx[i] = T(A(dy[i]) * s);
      sum += A(dy[i]) * A(x[i]);
    }
    return sum;
  }
  static void multiply(const T* x, const A* s, T* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = T(A(x[i]) * s[i]);
  }
  static void multiply_accumulate(const T* dy, const T* x, const A* s, T* dx, A* acc, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      dx[i] = T(A(dy[i]) * s[i]);
      acc[i] += A(dy[i]) * A(x[i]);
    }
  }
};

// Float32 lanes for float32 and bfloat16 storage.
template <typename T>
struct Avx2Loops {
  OPFUSE_AVX2_FN static void scale(const T* x, float s, T* out, int64_t n) {
    const __m256 sv = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) store8(out + i, load8(x + i) * sv);
    for (; i < n; ++i) out[i] = T(float(x[i]) * s);
  }
  // Two accumulators hide the FMA latency; they are combined in a fixed order.
  OPFUSE_AVX2_FN static float scale_dot(const T* dy, const T* x, float s, T* dx, int64_t n) {
    const __m256 sv = _mm256_set1_ps(s);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m256 d0 = load8(dy + i), d1 = load8(dy + i + 8);
      store8(dx + i, d0 * sv);
      store8(dx + i + 8, d1 * sv);
      acc0 = _mm256_fmadd_ps(d0, load8(x + i), acc0);
      acc1 = _mm256_fmadd_ps(d1, load8(x + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) {
      const __m256 d0 = load8(dy + i);
      store8(dx + i, d0 * sv);
      acc0 = _mm256_fmadd_ps(d0, load8(x + i), acc0);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc0 + acc1);
    float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    for (; i < n; ++i) {
      dx[i] = T(float(dy[i]) * s);
      sum += float(dy[i]) * float(x[i]);
    }
    return sum;
  }
  OPFUSE_AVX2_FN static void multiply(const T* x, const float* s, T* out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) store8(out + i, load8(x + i) * _mm256_loadu_ps(s + i));
    for (; i < n; ++i) out[i] = T(float(x[i]) * s[i]);
  }
  OPFUSE_AVX2_FN static void multiply_accumulate(const T* dy, const T* x, const float* s, T* dx,
                                                 float* acc, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 d = load8(dy + i);
      store8(dx + i, d * _mm256_loadu_ps(s + i));
      _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(d, load8(x + i), _mm256_loadu_ps(acc + i)));
    }
    for (; i < n; ++i) {
      dx[i] = T(float(dy[i]) * s[i]);
      acc[i] += float(dy[i]) * float(x[i]);
    }
  }
};

struct Geometry {
  int64_t n, c, hw;
  bool channels_last;
};

Geometry geometry_of(const at::Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1);
  const int64_t hw = n * c == 0 ? 0 : x.numel() / (n * c);
  const bool cl = x.dim() == 4 && !x.is_contiguous() && x.is_contiguous(at::MemoryFormat::ChannelsLast);
  return {n, c, hw, cl};
}

// Channel blocks for the channels_last reduction: enough tasks for every thread even at N = 1.
constexpr int64_t kChannelBlock = 64;

template <typename Loops, typename T, typename A>
void forward(const Geometry& g, const T* x, const A* s, T* out) {
  if (!g.channels_last) {
    at::parallel_for(0, g.n * g.c, grain_for(g.hw), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) Loops::scale(x + p * g.hw, s[p], out + p * g.hw, g.hw);
    });
    return;
  }
  at::parallel_for(0, g.n * g.hw, grain_for(g.c), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      Loops::multiply(x + r * g.c, s + (r / g.hw) * g.c, out + r * g.c, g.c);
  });
}

template <typename Loops, typename T, typename A>
void backward(const Geometry& g, const T* dy, const T* x, const A* s, T* dx, A* sum) {
  if (!g.channels_last) {
    at::parallel_for(0, g.n * g.c, grain_for(g.hw), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p)
        sum[p] = Loops::scale_dot(dy + p * g.hw, x + p * g.hw, s[p], dx + p * g.hw, g.hw);
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
        Loops::multiply_accumulate(dy + at, x + at, s + n * g.c + c0, dx + at, acc, width);
      }
    }
  });
}

template <typename A, typename T>
std::vector<A> gate_sigmoid(const at::Tensor& gate) {
  const T* g = gate.data_ptr<T>();
  std::vector<A> s(gate.numel());
  for (size_t i = 0; i < s.size(); ++i) s[i] = sigmoid(A(g[i]));
  return s;
}

// sigmoid'(g) = sigmoid(g)·sigmoid(−g): unlike s(1 − s) it does not cancel when s → 1.
template <typename A, typename T>
A sigmoid_derivative(T g) {
  return sigmoid(A(g)) * sigmoid(-A(g));
}

template <typename T>
constexpr bool has_avx2_loops = !std::is_same_v<T, double>;

}  // namespace

void se_gate_forward_kernel(const at::Tensor& x, const at::Tensor& gate, at::Tensor& out) {
  const Geometry g = geometry_of(x);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "opfuse::se_gate", [&] {
    using A = at::opmath_type<scalar_t>;
    const std::vector<A> s = gate_sigmoid<A, scalar_t>(gate);
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    if constexpr (has_avx2_loops<scalar_t>) {
      if (cpu_capability() != Capability::scalar) return forward<Avx2Loops<scalar_t>>(g, xp, s.data(), op);
    }
    forward<ScalarLoops<scalar_t, A>>(g, xp, s.data(), op);
  });
}

void se_gate_backward_kernel(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& gate,
                             at::Tensor& dx, at::Tensor& dgate) {
  const Geometry g = geometry_of(x);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "opfuse::se_gate_backward", [&] {
    using A = at::opmath_type<scalar_t>;
    const std::vector<A> s = gate_sigmoid<A, scalar_t>(gate);
    std::vector<A> sum(s.size(), A(0));
    const scalar_t* dyp = dy.data_ptr<scalar_t>();
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* dxp = dx.data_ptr<scalar_t>();
    bool done = false;
    if constexpr (has_avx2_loops<scalar_t>) {
      if (cpu_capability() != Capability::scalar) {
        backward<Avx2Loops<scalar_t>>(g, dyp, xp, s.data(), dxp, sum.data());
        done = true;
      }
    }
    if (!done) backward<ScalarLoops<scalar_t, A>>(g, dyp, xp, s.data(), dxp, sum.data());
    const scalar_t* gp = gate.data_ptr<scalar_t>();
    scalar_t* dg = dgate.data_ptr<scalar_t>();
    for (size_t i = 0; i < s.size(); ++i) dg[i] = scalar_t(sigmoid_derivative<A>(gp[i]) * sum[i]);
  });
}

}  // namespace opfuse::cpu
