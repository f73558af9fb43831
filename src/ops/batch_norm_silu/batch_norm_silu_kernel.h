// batch_norm_silu's CPU kernel (batch_norm_silu_kernel.cpp). Shapes, dtypes and layouts are checked by the front end
// (batch_norm_silu.cpp); the kernel only computes.
#pragma once

#include <ATen/core/Tensor.h>

namespace opfuse::cpu {

// BatchNorm + SiLU over x [N, C, H·W] (NCHW) or rows of C channels (channels_last, [N, C]);
// per-channel tensors are [C], in the accumulation dtype (float, double for float64) unless
// said double. See batch_norm_silu_kernel.cpp for the passes.
// mean (double) and Σ(x − mean)² (double) of each channel.
void batch_norm_moments_kernel(const at::Tensor& x, at::Tensor& mean, at::Tensor& var_sum);
// out = silu(x·scale + shift)
void batch_norm_silu_forward_kernel(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
                                    at::Tensor& out);
// dz = dy · silu'(x·scale + shift) stored as dz·store_scale (in x's dtype, or float for
// bfloat16); sum_dz = Σdz, sum_dz_xc = Σdz·(x − mean), both double.
void batch_norm_silu_grad_sums_kernel(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& scale,
                                      const at::Tensor& shift, const at::Tensor& mean, const at::Tensor& store_scale,
                                      at::Tensor& dz, at::Tensor& sum_dz, at::Tensor& sum_dz_xc);
// dx = alpha·dz + beta·(x − mean) + delta; dz may share dx's memory.
void batch_norm_silu_grad_input_kernel(const at::Tensor& dz, const at::Tensor& x, const at::Tensor& alpha,
                                       const at::Tensor& beta, const at::Tensor& delta, const at::Tensor& mean,
                                       at::Tensor& dx);

}  // namespace opfuse::cpu
