// cross_entropy's CPU kernel (cross_entropy_kernel.cpp). Shapes, dtypes and layouts are checked by the front end
// (cross_entropy.cpp); the kernel only computes.
#pragma once

#include <ATen/core/Tensor.h>

namespace opfuse::cpu {

// Cross entropy over rows of n logits (row r at logits' data + r·row_stride, its n elements
// contiguous; rows = target.numel(), target int64 contiguous, every entry ignore_index or in
// [0, n)), ε the label smoothing, c = grad_scale:
//   losses[r] = lse_r − (1 − ε)·x_t − ε/n·Σ_j x_j                    losses double [rows]
//   grad[r, j] = c·(softmax_j − (1 − ε)·[j = t] − ε/n)               grad contiguous [rows, n]
// both 0 on a row whose target is ignore_index. grad undefined: the losses only.
struct CrossEntropyRule {
  int64_t ignore_index;
  double label_smoothing;
};
void cross_entropy_forward_kernel(const at::Tensor& logits, int64_t row_stride, const at::Tensor& target,
                                  const CrossEntropyRule& rule, double grad_scale, at::Tensor& losses,
                                  at::Tensor& grad);
// The same with logits = h·weightᵀ (h [rows, H], weight [n, H], both contiguous, float32 or
// float64), never all held: per chunk of rows, the logits, then grad_h = g·weight and
// grad_weight = Σ gᵀ·h of those rows (each undefined when not wanted).
void linear_cross_entropy_kernel(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& target,
                                 const CrossEntropyRule& rule, double grad_scale, at::Tensor& losses,
                                 at::Tensor& grad_h, at::Tensor& grad_weight);

}  // namespace opfuse::cpu
