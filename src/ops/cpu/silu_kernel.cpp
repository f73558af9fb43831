// Swish / SiLU, forward and fused backward: one pass over memory each way.
//   forward   y  = x · s,                    s = sigmoid(βx)
//   backward  dx = dy · s · (1 + βx(1 − s))  (d/dx of x·sigmoid(βx); recomputing s costs one
//             exp per element but saves storing s, so backward reads x and dy only)
// SiLU is β = 1, where multiplying by β is exact: silu and swish(β=1) agree bit for bit.
#include <ATen/Dispatch.h>

#include "ops/cpu/elementwise.h"
#include "ops/cpu/kernels.h"

namespace opfuse::cpu {
namespace {

// beta is kept in both precisions so the 8-lane loop does not convert it per vector.
struct SwishForward {
  double beta;
  float beta_f = float(beta);
  template <typename A>
  A scalar(A x) const {
    return x * sigmoid(A(beta) * x);
  }
  OPFUSE_AVX2 __m256 vec(__m256 x) const {
    const __m256 b = _mm256_set1_ps(beta_f);
    return x * sigmoid8(b * x);
  }
  OPFUSE_AVX512 __m512 vec(__m512 x) const {
    const __m512 b = _mm512_set1_ps(beta_f);
    return x * sigmoid16(b * x);
  }
};

struct SwishBackward {
  double beta;
  float beta_f = float(beta);
  template <typename A>
  A scalar(A dy, A x) const {
    const A s = sigmoid(A(beta) * x);
    return dy * (s * (A(1) + A(beta) * x * (A(1) - s)));
  }
  OPFUSE_AVX2 __m256 vec(__m256 dy, __m256 x) const {
    const __m256 b = _mm256_set1_ps(beta_f);
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 s = sigmoid8(b * x);
    return dy * (s * (one + b * x * (one - s)));
  }
  OPFUSE_AVX512 __m512 vec(__m512 dy, __m512 x) const {
    const __m512 b = _mm512_set1_ps(beta_f);
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 s = sigmoid16(b * x);
    return dy * (s * (one + b * x * (one - s)));
  }
};

}  // namespace

void swish_forward_kernel(at::TensorIteratorBase& iter, double beta) {
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, iter.common_dtype(), "opfuse::swish", [&] {
    run_elementwise<scalar_t, 1>(iter, SwishForward{beta, float(beta)});
  });
}

void swish_backward_kernel(at::TensorIteratorBase& iter, double beta) {
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, iter.common_dtype(), "opfuse::swish_backward", [&] {
    run_elementwise<scalar_t, 2>(iter, SwishBackward{beta, float(beta)});
  });
}

}  // namespace opfuse::cpu
