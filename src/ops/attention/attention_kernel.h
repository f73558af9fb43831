// attention's CPU kernel (attention_kernel.cpp). Shapes, dtypes and layouts are checked by the front end
// (attention.cpp); the kernel only computes.
#pragma once

#include <ATen/core/Tensor.h>

namespace opfuse::cpu {

// Attention over heads: q [B, H, T, D], k [B, H, S, D], v [B, H, S, Dv] of one dtype, any
// strides; mask undefined or a [B, H, T, S] view (strides may be 0) of bool (true takes part)
// or of the accumulation dtype (added to the scores). out [B, H, T, Dv] and stats [B, H, T, 2]
// (each row's score max and Σ exp(s − max), accumulation dtype) are contiguous, as are dq, dk, dv;
// dscores, when defined, is the scores' gradient [B, H, T, S] in the accumulation dtype, zeroed.
struct AttentionOptions {
  bool causal = false;  // key j takes part in query row i only when j ≤ i
  double scale = 1;
  double dropout_p = 0;
  uint64_t seed = 0;  // of the dropout mask, drawn once per forward
};
void attention_forward_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                              const AttentionOptions& options, at::Tensor& out, at::Tensor& stats);
void attention_backward_kernel(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& out, const at::Tensor& stats, const at::Tensor& mask,
                               const AttentionOptions& options, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
                               at::Tensor& dscores);

}  // namespace opfuse::cpu
