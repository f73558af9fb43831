// rms_norm's CPU kernel (rms_norm_kernel.cpp). Shapes, dtypes and layouts are checked by the front end
// (rms_norm.cpp); the kernel only computes.
#pragma once

#include <ATen/core/Tensor.h>

namespace opfuse::cpu {

// RMSNorm over rows of x's last dimension d (x, dy, dx contiguous; weight [d], all one dtype):
//   y = x · rstd · w,  rstd = 1 / sqrt(mean(x²) + eps)   rstd [rows] in the accumulation dtype
void rms_norm_forward_kernel(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& y,
                             at::Tensor& rstd);
//   dx = rstd·(dy·w − x̂·mean(dy·w·x̂)),  dweight = Σ_rows dy·x̂,  x̂ = x·rstd
void rms_norm_backward_kernel(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
                              const at::Tensor& rstd, at::Tensor& dx, at::Tensor& dweight);
// The same on h = x + residual (x, residual, h contiguous, one shape), h written:
//   h = x + residual,  y = h · rstd · w;   dx = rstd·(dy·w − ĥ·mean(dy·w·ĥ)) + dh (dh may be undefined)
void add_rms_norm_forward_kernel(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps,
                                 at::Tensor& h, at::Tensor& y, at::Tensor& rstd);
void add_rms_norm_backward_kernel(const at::Tensor& dy, const at::Tensor& dh, const at::Tensor& h,
                                  const at::Tensor& weight, const at::Tensor& rstd, at::Tensor& dx,
                                  at::Tensor& dweight);

}  // namespace opfuse::cpu
