// opfuse's fused operators, as C++ functions.
//
// Each call goes through the dispatcher (`opfuse::<name>` registered with TORCH_LIBRARY), so
// C++ code, TorchScript graphs and Python's torch.ops.opfuse.* all reach the same kernels and
// the same fused backward.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <tuple>

namespace opfuse {

// The vector path opfuse's CPU kernels take on this machine: "scalar", "avx2" or "avx512"
// (OPFUSE_CPU_CAPABILITY caps it, as ATEN_CPU_CAPABILITY caps ATen's).
const char* cpu_kernel_path();

// silu(x) = x * sigmoid(x); backward is one fused pass.
at::Tensor silu(const at::Tensor& x);

// swish(x, beta) = x * sigmoid(beta * x); silu is beta = 1.
at::Tensor swish(const at::Tensor& x, double beta = 1.0);

// se_gate(x, gate) = x * sigmoid(gate), gate [N, C, 1, 1] broadcast over x [N, C, H, W]:
// the squeeze-and-excitation tail of an EfficientNet block.
at::Tensor se_gate(const at::Tensor& x, const at::Tensor& gate);

// silu(batch_norm(x)) for x [N, C, H, W] (NCHW, channels_last or any layout) or [N, C]: one
// statistics pass and one output pass forward, two passes backward (the SiLU backward fused
// into BatchNorm's), x̂ recomputed from x rather than stored. Arguments as torch::batch_norm:
// weight, bias, running_mean, running_var are [C] or undefined; when training, the batch's
// statistics are used and the running ones (if defined) updated in place as torch::batch_norm
// updates them (running = (1 − momentum)·running + momentum·batch, the variance unbiased);
// otherwise the running statistics are used. Gradients flow to x, weight and bias.
at::Tensor batch_norm_silu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                           const at::Tensor& running_mean, const at::Tensor& running_var, bool training,
                           double momentum, double eps);

// EfficientNet's drop connect and residual add: x / (1 − p) · mask[n] + residual, mask[n] =
// floor(1 − p + U[0, 1)) drawn per sample from torch's default generator, as the reference's
// drop_connect draws it (a seed gives the same mask). Not training, or p = 0: x + residual.
at::Tensor drop_connect_add(const at::Tensor& x, const at::Tensor& residual, double p, bool training);

// RMSNorm over the last dimension: x · rsqrt(mean(x², -1) + eps) · weight, weight [x.size(-1)] of
// x's dtype. Sums in double, bfloat16 computed in float and rounded once (the `x.float() …
// .type_as(x)` form's numerics, one rounding fewer); one pass forward, one fused pass backward
// (dx and dweight). Strided x is made contiguous first.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps = 1e-6);

// The residual add then RMSNorm of every Llama block: h = x + residual, y = rms_norm(h, weight,
// eps); returns (y, h). One pass forward (h and y written, x and residual read once); one fused
// backward: dx = dresidual = d(rms_norm)/dh·dy + dh (both outputs may receive gradients), dweight
// as rms_norm's. x and residual of one shape and dtype; bfloat16 h is rounded as `x + residual`
// rounds it and normalized in float (the `h.float() … .type_as(h)` form).
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps = 1e-6);

// SwiGLU: silu(gate) · up, one pass forward and one backward (sigmoid recomputed, nothing but
// the inputs saved); gate and up of one shape and dtype.
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);
// The packed form: x [..., 2d] holds gate then up in its last dimension (x.chunk(2, -1)).
at::Tensor swiglu(const at::Tensor& x);
// GeGLU: gelu(gate, approximate='tanh') · up (Gemma's, T5 v1.1's), one pass each way like swiglu.
at::Tensor geglu(const at::Tensor& gate, const at::Tensor& up);

// Rotary position embedding: each pair of x's last dimension D rotated by its angle θ,
//   (x_a, x_b) → (x_a·cos θ − x_b·sin θ, x_b·cos θ + x_a·sin θ)
// the pairs being (x[i], x[i + D/2]) (rotate-half, x·cos + cat(−x₂, x₁)·sin: Hugging Face, litgpt,
// GPT-NeoX) or, interleaved, (x[2i], x[2i + 1]) (Meta's complex form, llama2.c's real arithmetic).
// cos and sin (one shape) are [..., D/2], an angle per pair, or [..., D], a value per element as in
// Hugging Face's cat(freqs, freqs) tables (then y = x·cos + rot(x)·sin element by element, as the
// composite computes it, duplicated or not); their leading dimensions broadcast to x's as torch
// broadcasts: for x [B, T, H, D] pass [T, 1, D/2], for x [B, H, T, D] pass [T, D/2]. They have x's
// dtype (or float32 for bfloat16 x) and are constants: tables that require grad are refused.
// float32 and bfloat16 computed in float, each output one fma over one rounded product (bfloat16
// rounded once); one pass forward, one backward (the rotation by −θ; nothing of x saved). Strided
// x is made contiguous first.
at::Tensor rotary_embedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool interleaved = false);

// Attention, softmax(scale · q kᵀ + mask) · v, as F.scaled_dot_product_attention: q [B, H, T, D]
// (or [B·H, T, D]), k [.., S, D], v [.., S, Dv], any strides; scale defaults to 1/sqrt(D);
// causal keeps key j for query row i only when j ≤ i; attn_mask (optional) is bool (true takes
// part) or additive, broadcast to [B, H, T, S] (an additive one that requires grad, T5's trained
// position bias, gets the scores' gradient summed over its broadcast); dropout_p drops
// probabilities with a mask drawn from generator (default: torch's), never stored. Tiled with an
// online softmax: extra memory O(T) per head, not O(T·S); the backward recomputes the tiles.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal = false,
                     c10::optional<double> scale = c10::nullopt, const c10::optional<at::Tensor>& attn_mask = {},
                     double dropout_p = 0, c10::optional<at::Generator> generator = c10::nullopt);

// One AdamW step for a parameter group, in place, exactly torch.optim.AdamW's formula (amsgrad
// off) in one pass over each parameter's p, g, m, v:
//   p ← p·(1 − lr·wd);  m ← β1·m + (1 − β1)·g;  v ← β2·v + (1 − β2)·g²
//   p ← p − lr/(1 − β1^t) · m / (sqrt(v)/sqrt(1 − β2^t) + eps)        t = steps[i], g → −g if maximize
// params[i], grads[i], exp_avgs[i], exp_avg_sqs[i] share a shape; every tensor one dtype (float32,
// float64, or bfloat16, computed in float and rounded once per store). steps[i] is a one-element
// tensor counting params[i]'s steps so far (torch.optim's state['step']); it is incremented in
// place and its new value is t, as torch's loop does, so a step is this one call.
// Any dense layout shared by a parameter's four tensors is updated where it lies; others go
// through a copy. Threads share pieces of every tensor; the bits do not depend on their number.
void adamw_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
            at::TensorList steps, double lr, double beta1, double beta2, double eps, double weight_decay,
            bool maximize = false);

// One SGD step for a parameter group, in place, torch.optim.SGD's formula in one pass over each
// parameter's p, g and momentum buffer b:
//   d ← g + wd·p;  b ← momentum·b + (1 − dampening)·d;  d ← nesterov ? d + momentum·b : b;  p ← p − lr·d
// (g → −g if maximize). momentum_buffers is empty when momentum is 0, else one per parameter; with
// fresh_buffers (each buffer's first step, where torch clones d) they take d, whatever they hold.
// Dtypes and layouts as adamw_.
void sgd_(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers, double lr,
          double momentum = 0, double dampening = 0, double weight_decay = 0, bool nesterov = false,
          bool maximize = false, bool fresh_buffers = false);

// Cross entropy, as F.cross_entropy(logits.view(-1, V), target.view(-1), ignore_index=…,
// reduction=…, label_smoothing=ε): logits [..., V] (the classes last), target [...] of int64
// class indices in [0, V) or ignore_index; reduction at::Reduction::None (a loss per row, of
// target's shape), Mean (over the rows not ignored) or Sum. Per row,
//   loss = lse − (1 − ε)·x_t − ε/V · Σ_j x_j,   lse = log Σ_j exp(x_j)
// (0 on an ignored row). float32, float64, or bfloat16 computed in float and rounded once; sums
// in double. The forward also computes the gradient wrt the logits and keeps it instead of the
// log-probabilities; the backward scales it by the loss's gradient in place: one [N, V] tensor
// held from forward to backward, where log_softmax + nll_loss hold three at their peak. Logits
// whose rows are dense in memory (a slice of a wider matrix) are read where they lie; others
// are made contiguous first.
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index = -100,
                         int64_t reduction = 1, double label_smoothing = 0);

// cross_entropy(h @ weight.T, target, …) for h [..., H] and weight [V, H] (an output layer
// without bias), never holding the [N, V] logits: rows go in chunks of about 48 MB of logits,
// each chunk's logits are made by one matmul, turned into their gradient in place, and give
// grad_h = g·weight and grad_weight += gᵀ·h right in the forward (Liger-Kernel's fused linear
// cross entropy); the backward scales the two. Reduction Mean or Sum (not None: grad_weight is
// summed over the rows before any per-row gradient is known). bfloat16 is computed from float
// copies of h and weight, grad_weight summed in float.
at::Tensor linear_cross_entropy(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& target,
                                int64_t ignore_index = -100, int64_t reduction = 1, double label_smoothing = 0);

// Path of the shared library holding the operators, for torch.ops.load_library.
const char* ops_library_path();

}  // namespace opfuse
