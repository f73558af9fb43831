// The opfuse operator schemas, in one place (as ATen's native_functions.yaml). Kernels and
// autograd are registered beside each operator's code in src/ops/<op>.cpp.
#include <dlfcn.h>
#include <torch/library.h>

#include "opfuse/ops.h"

TORCH_LIBRARY(opfuse, m) {
  m.def("silu(Tensor x) -> Tensor");
  m.def("silu_backward(Tensor grad, Tensor x) -> Tensor");
  m.def("swish(Tensor x, float beta=1.0) -> Tensor");
  m.def("swish_backward(Tensor grad, Tensor x, float beta) -> Tensor");
  m.def("se_gate(Tensor x, Tensor gate) -> Tensor");
  m.def("se_gate_backward(Tensor grad, Tensor x, Tensor gate) -> (Tensor, Tensor)");
  // silu(batch_norm(x)); running stats are updated in place when training. _forward also
  // returns the per-channel mean and invstd that _backward takes.
  m.def("batch_norm_silu(Tensor x, Tensor? weight, Tensor? bias, Tensor(a!)? running_mean, "
        "Tensor(b!)? running_var, bool training, float momentum, float eps) -> Tensor");
  m.def("batch_norm_silu_forward(Tensor x, Tensor? weight, Tensor? bias, Tensor(a!)? running_mean, "
        "Tensor(b!)? running_var, bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("batch_norm_silu_backward(Tensor grad, Tensor x, Tensor? weight, Tensor? bias, Tensor mean, "
        "Tensor invstd, bool training) -> (Tensor, Tensor, Tensor)");
  // x / (1 − p) · mask[n] + residual with a per-sample mask drawn from the default generator;
  // _forward also returns the [N] mask (undefined when nothing is dropped).
  m.def("drop_connect_add(Tensor x, Tensor residual, float p, bool training) -> Tensor");
  m.def("drop_connect_add_forward(Tensor x, Tensor residual, float p, bool training) -> (Tensor, Tensor)");
  m.def("drop_connect_add_backward(Tensor grad, Tensor? mask, float p) -> Tensor");
  // x · rsqrt(mean(x², -1) + eps) · weight over the last dimension; _forward also returns the
  // per-row rstd (float for bfloat16 x) that _backward takes.
  m.def("rms_norm(Tensor x, Tensor weight, float eps=1e-6) -> Tensor");
  m.def("rms_norm_forward(Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rms_norm_backward(Tensor grad, Tensor x, Tensor weight, Tensor rstd) -> (Tensor, Tensor)");
  // h = x + residual, then rms_norm(h); returns (y, h). _forward also returns rstd; _backward
  // takes both outputs' gradients (grad_h undefined when h got none) and returns (dh, dweight),
  // dh being both x's and residual's gradient.
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps=1e-6) -> (Tensor, Tensor)");
  m.def("add_rms_norm_forward(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("add_rms_norm_backward(Tensor grad, Tensor? grad_h, Tensor h, Tensor weight, Tensor rstd) -> (Tensor, Tensor)");
  // silu(gate) · up; _packed takes one tensor whose last dimension holds gate, then up.
  m.def("swiglu(Tensor gate, Tensor up) -> Tensor");
  m.def("swiglu_backward(Tensor grad, Tensor gate, Tensor up) -> (Tensor, Tensor)");
  m.def("swiglu_packed(Tensor x) -> Tensor");
  m.def("swiglu_packed_backward(Tensor grad, Tensor x) -> Tensor");
  // gelu(gate, approximate='tanh') · up (Gemma's, T5 v1.1's gated GELU)
  m.def("geglu(Tensor gate, Tensor up) -> Tensor");
  m.def("geglu_backward(Tensor grad, Tensor gate, Tensor up) -> (Tensor, Tensor)");
  // Each pair of x's last dimension, (x[i], x[i + D/2]) or interleaved (x[2i], x[2i + 1]), rotated
  // by its angle: y_a = x_a·cos − x_b·sin, y_b = x_b·cos + x_a·sin; cos and sin [..., D/2] or
  // [..., D], broadcast to x's leading dimensions. _backward rotates grad back (the transpose).
  m.def("rotary_embedding(Tensor x, Tensor cos, Tensor sin, bool interleaved=False) -> Tensor");
  m.def("rotary_embedding_backward(Tensor grad, Tensor cos, Tensor sin, bool interleaved) -> Tensor");
  // Cross entropy over rows of logits [..., classes] with a class index (int64) per row, as
  // F.cross_entropy(logits.view(-1, classes), target.view(-1), ...) (reduction 0 none, 1 mean,
  // 2 sum). _forward also returns the loss's gradient wrt the logits (for a loss gradient of 1),
  // which _backward_ scales by the loss's gradient in place (returning nothing, so that
  // functionalization, torch.compile's, can take it).
  m.def("cross_entropy(Tensor logits, Tensor target, int ignore_index=-100, int reduction=1, "
        "float label_smoothing=0.0) -> Tensor");
  m.def("cross_entropy_forward(Tensor logits, Tensor target, int ignore_index, int reduction, "
        "float label_smoothing) -> (Tensor, Tensor)");
  m.def("cross_entropy_backward_(Tensor(a!) grad_logits, Tensor grad) -> ()");
  // cross_entropy(h @ weight.T, target, ...) without the logits ever held whole; _forward also
  // returns grad_h and grad_weight (undefined where not asked for), each scaled by
  // cross_entropy_backward_ in the backward. Reduction mean or sum.
  m.def("linear_cross_entropy(Tensor h, Tensor weight, Tensor target, int ignore_index=-100, int reduction=1, "
        "float label_smoothing=0.0) -> Tensor");
  m.def("linear_cross_entropy_forward(Tensor h, Tensor weight, Tensor target, int ignore_index, int reduction, "
        "float label_smoothing, bool grad_h, bool grad_weight) -> (Tensor, Tensor, Tensor)");
  // One AdamW step (torch.optim.AdamW's formula) for a parameter group, in place: p, m, v
  // updated in one pass over p, g, m, v; steps[i] counts params[i]'s steps (torch.optim's
  // state['step']) and is incremented first, as torch's loop increments it.
  m.def("adamw_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
        "Tensor(d!)[] steps, float lr, float beta1, float beta2, float eps, float weight_decay, bool maximize=False) -> ()");
  // One SGD step (torch.optim.SGD's formula) for a parameter group, in place: p and its momentum
  // buffer updated in one pass over p, g, b; momentum_buffers empty when momentum is 0, and taking
  // the step's direction, whatever they hold, when fresh_buffers (a buffer's first step).
  m.def("sgd_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, float lr, float momentum=0.0, "
        "float dampening=0.0, float weight_decay=0.0, bool nesterov=False, bool maximize=False, "
        "bool fresh_buffers=False) -> ()");
  // softmax(scale · q kᵀ + mask) · v over q [B, H, T, D], k, v [B, H, S, *], tiled (no [T, S]
  // matrix stored); scale defaults to 1/sqrt(D); attn_mask is bool (true takes part) or
  // additive, broadcast to [B, H, T, S]. _forward also returns each row's score max and sum
  // and the dropout seed that _backward takes; _backward's fourth result, with mask_grad, is the
  // scores' gradient [B, H, T, S] (the additive mask's before its broadcast is summed), in the
  // accumulation dtype; without it, an undefined tensor (None in Python).
  m.def("attention(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None, Tensor? attn_mask=None, "
        "float dropout_p=0.0, Generator? generator=None) -> Tensor");
  m.def("attention_forward(Tensor q, Tensor k, Tensor v, bool causal, float? scale, Tensor? attn_mask, "
        "float dropout_p, Generator? generator) -> (Tensor, Tensor, Tensor)");
  m.def("attention_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor stats, Tensor seed, "
        "bool causal, float? scale, Tensor? attn_mask, float dropout_p, bool mask_grad=False) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
}

namespace opfuse {

const char* ops_library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ops_library_path), &info) == 0) return "";
  return info.dli_fname;
}

}  // namespace opfuse
