// drop_connect_add's CPU kernel (drop_connect_add_kernel.cpp). Shapes, dtypes and layouts are checked by the front end
// (drop_connect_add.cpp); the kernel only computes.
#pragma once

#include <ATen/core/Tensor.h>

namespace opfuse::cpu {

// Drop connect + residual over x, residual and out of one dense layout, sample n being the
// n-th contiguous block of numel / N elements:
//   out = (x / keep) · mask[n] + residual       mask [N] of 0 and 1 in x's dtype
void drop_connect_add_forward_kernel(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& mask,
                                     double keep, at::Tensor& out);
//   dx = dy · mask[n] / keep
void drop_connect_add_backward_kernel(const at::Tensor& dy, const at::Tensor& mask, double keep, at::Tensor& dx);

}  // namespace opfuse::cpu
