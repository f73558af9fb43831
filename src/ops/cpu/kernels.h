// CPU kernels of the opfuse operators. Shapes, dtypes and layouts are checked by the callers
// in src/ops/*.cpp; a kernel only computes.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace at {
struct TensorIteratorBase;
}

namespace opfuse::cpu {

// out = x · sigmoid(βx)
void swish_forward_kernel(at::TensorIteratorBase& iter, double beta);
// dx = dy · s · (1 + βx(1 − s)),  s = sigmoid(βx)
void swish_backward_kernel(at::TensorIteratorBase& iter, double beta);

// out = x · sigmoid(gate) with gate [N·C] broadcast over each plane; x contiguous or
// channels_last, out alike.
void se_gate_forward_kernel(const at::Tensor& x, const at::Tensor& gate, at::Tensor& out);
// dx = dy · sigmoid(gate);  dgate = s(1 − s) · Σ_hw dy·x
void se_gate_backward_kernel(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& gate,
                             at::Tensor& dx, at::Tensor& dgate);

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

// Drop connect + residual over x, residual and out of one dense layout, sample n being the
// n-th contiguous block of numel / N elements:
//   out = (x / keep) · mask[n] + residual       mask [N] of 0 and 1 in x's dtype
void drop_connect_add_forward_kernel(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& mask,
                                     double keep, at::Tensor& out);
//   dx = dy · mask[n] / keep
void drop_connect_add_backward_kernel(const at::Tensor& dy, const at::Tensor& mask, double keep, at::Tensor& dx);

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

// The activation of a gated unit's gate: silu (SwiGLU) or gelu's tanh form (GeGLU).
enum class Gate { silu, gelu_tanh };

// A gated unit over rows of y's last dimension d: y = a(gate) · up, dgate = dy · u · a'(g),
// dup = dy · a(g). y and dy are contiguous; a row's gate and up (and dgate, dup) start
// in_stride elements after the previous row's: d for two contiguous tensors, 2d for the halves
// of one packed tensor.
void gated_forward_kernel(Gate gate, const at::Tensor& g, const at::Tensor& up, int64_t in_stride, at::Tensor& y);
void gated_backward_kernel(Gate gate, const at::Tensor& dy, const at::Tensor& g, const at::Tensor& up,
                           int64_t in_stride, at::Tensor& dgate, at::Tensor& dup);

// Rotary embedding over rows of x's last dimension d = 2P (x and y contiguous, one dtype): pair i
// of a row is (x[i], x[P + i]) (rotate-half) or (x[2i], x[2i + 1]) (interleaved), mapped by
//   y_a = cos_a·x_a − sin_a·x_b,   y_b = sin_b·x_a + cos_b·x_b   (transposed: the matrix's transpose)
// with the angles of the row's table row: cos and sin [n, width] contiguous in the accumulation
// dtype (float, double for float64), width P (one angle per pair) or d (one per element, laid out
// like x). table_row_strides, one per leading dimension of x, is how many table rows a step along
// it moves (0 where the table broadcasts).
void rotary_embedding_kernel(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                             at::IntArrayRef table_row_strides, bool interleaved, bool transposed, at::Tensor& y);

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

// One SGD step over tensors i, each of p, g and (with momentum) b contiguous, of one size and of
// one dtype (all tensors alike), updated in place (see sgd_loops.h for the order of operations):
//   d ← g + wd·p;  b ← momentum·b + (1 − dampening)·d (b ← d when fresh);  d ← nesterov ? d + momentum·b : b
//   p ← p − lr·d                                                            g negated if maximize
// momentum_buffers empty: no momentum (d is g + wd·p).
struct SgdCoefficients {
  double lr, momentum, dampening, weight_decay;
  bool nesterov, maximize;
  bool fresh_buffers;  // the buffers' first step: they take d, whatever they hold
};
void sgd_kernel(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
                const SgdCoefficients& coefficients);

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
