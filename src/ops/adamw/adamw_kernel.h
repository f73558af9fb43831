// adamw's CPU kernel (adamw_kernel.cpp). Shapes, dtypes and layouts are checked by the front end
// (adamw.cpp); the kernel only computes.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace opfuse::cpu {

// One AdamW step over tensors i, each of p, g, m, v contiguous, of one size and of one dtype
// (all tensors alike), updated in place with tensor i's coefficients (its step's bias
// corrections; see adamw_loops.h for the order of operations):
//   p ← p·decay;  m ← β1·m + (1 − β1)·g;  v ← β2·v + (1 − β2)·g²
//   p ← p − step_size · m / (sqrt(v) / bias_correction2_sqrt + eps)        g negated if maximize
struct AdamWCoefficients {
  double decay;         // 1 − lr·weight_decay
  double beta1, beta2, eps;
  double step_size;     // lr / (1 − β1^t)
  double bias_correction2_sqrt;  // sqrt(1 − β2^t)
  bool maximize;
};
void adamw_kernel(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                  const std::vector<AdamWCoefficients>& coefficients);

}  // namespace opfuse::cpu
