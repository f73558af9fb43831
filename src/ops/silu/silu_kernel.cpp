// Swish / SiLU, forward and fused backward: one pass over memory each way.
//   forward   y  = x · s,                    s = sigmoid(βx)
//   backward  dx = dy · s · (1 + βx(1 − s))  (d/dx of x·sigmoid(βx); recomputing s costs one
//             exp per element but saves storing s, so backward reads x and dy only)
// SiLU is β = 1, where multiplying by β is exact: silu and swish(β=1) agree bit for bit.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/native/TensorIterator.h>

#include <algorithm>

#include "ops/cpu/capability.h"
#include "ops/cpu/grain.h"
#include "ops/cpu/lanes.h"
#include "ops/cpu/paths.h"
#include "ops/silu/silu_kernel.h"

namespace opfuse::cpu {
namespace {

#define OPFUSE_LOOPS "ops/silu/silu_loops.h"
#include "ops/cpu/per_path.h"

// run(pointers, strides, n) for each row of the iterator's 2-D loop: the output, then kInputs inputs.
template <int kInputs, typename Run>
void for_each_row(at::TensorIteratorBase& iter, const Run& run) {
  iter.for_each([&](char** data, const int64_t* strides, int64_t size0, int64_t size1) {
    char* row[kInputs + 1];
    for (int64_t j = 0; j < size1; ++j) {
      for (int k = 0; k <= kInputs; ++k) row[k] = data[k] + j * strides[kInputs + 1 + k];
      run(row, strides, size0);
    }
  }, kGrain);
}

}  // namespace

void swish_forward_kernel(at::TensorIteratorBase& iter, double beta) {
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, iter.common_dtype(), "opfuse::swish", [&] {
    for_each_row<1>(iter, [&](char** row, const int64_t* strides, int64_t n) {
      auto* y = reinterpret_cast<scalar_t*>(row[0]);
      const auto* x = reinterpret_cast<const scalar_t*>(row[1]);
      OPFUSE_ON_PATH(scalar_t, swish_forward_run, (y, x, strides, n, beta));
    });
  });
}

void swish_backward_kernel(at::TensorIteratorBase& iter, double beta) {
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, iter.common_dtype(), "opfuse::swish_backward", [&] {
    for_each_row<2>(iter, [&](char** row, const int64_t* strides, int64_t n) {
      auto* dx = reinterpret_cast<scalar_t*>(row[0]);
      const auto *dy = reinterpret_cast<const scalar_t*>(row[1]), *x = reinterpret_cast<const scalar_t*>(row[2]);
      OPFUSE_ON_PATH(scalar_t, swish_backward_run, (dx, dy, x, strides, n, beta));
    });
  });
}

}  // namespace opfuse::cpu
