// silu's CPU kernel (silu_kernel.cpp). Shapes, dtypes and layouts are checked by the front end
// (silu.cpp); the kernel only computes.
#pragma once

#include <ATen/core/Tensor.h>

namespace at {
struct TensorIteratorBase;
}

namespace opfuse::cpu {

// out = x · sigmoid(βx)
void swish_forward_kernel(at::TensorIteratorBase& iter, double beta);
// dx = dy · s · (1 + βx(1 − s)),  s = sigmoid(βx)
void swish_backward_kernel(at::TensorIteratorBase& iter, double beta);

}  // namespace opfuse::cpu
