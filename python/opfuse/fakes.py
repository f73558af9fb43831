"""The fake (meta) kernel of every opfuse op: the shapes, dtypes and strides its CPU front end
(src/ops/<op>.cpp) returns, computed without data, for FakeTensor, AOTAutograd and torch.compile.

Written in Python so that sizes may be symbolic (torch.compile's dynamic shapes); each mirrors the
layout its C++ front end allocates: `like(x)` a dense copy of x's layout, `dense(x)` row-major,
`kernel_layout(x)` channels_last for a channels_last 4-D x, else row-major.
"""
import torch
from torch.library import register_fake

_CL = torch.channels_last


def _opmath(dtype):
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _dense(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _kernel_layout(x):
    channels_last = x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=_CL)
    return _CL if channels_last else torch.contiguous_format


def _in_layout(x, layout):
    return torch.empty_like(x, memory_format=layout)


def _rows(x, dtype):
    return x.new_empty(x.shape[:-1], dtype=dtype)


# Elementwise activations: empty_like(x), the input's own dense layout.
@register_fake("opfuse::silu")
def _silu(x):
    return torch.empty_like(x)


@register_fake("opfuse::silu_backward")
def _silu_backward(grad, x):
    return torch.empty_like(x)


@register_fake("opfuse::swish")
def _swish(x, beta=1.0):
    return torch.empty_like(x)


@register_fake("opfuse::swish_backward")
def _swish_backward(grad, x, beta):
    return torch.empty_like(x)


@register_fake("opfuse::se_gate")
def _se_gate(x, gate):
    return _in_layout(x, _kernel_layout(x))


@register_fake("opfuse::se_gate_backward")
def _se_gate_backward(grad, x, gate):
    return _in_layout(x, _kernel_layout(x)), gate.new_empty(gate.shape)


@register_fake("opfuse::batch_norm_silu")
def _batch_norm_silu(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _in_layout(x, _kernel_layout(x))


@register_fake("opfuse::batch_norm_silu_forward")
def _batch_norm_silu_forward(x, weight, bias, running_mean, running_var, training, momentum, eps):
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    return _in_layout(x, _kernel_layout(x)), x.new_empty(x.shape[1], dtype=acc), x.new_empty(x.shape[1], dtype=acc)


@register_fake("opfuse::batch_norm_silu_backward")
def _batch_norm_silu_backward(grad, x, weight, bias, mean, invstd, training):
    def channel_grad(t):
        return None if t is None else t.new_empty(x.shape[1])
    return _in_layout(x, _kernel_layout(x)), channel_grad(weight), channel_grad(bias)


def _drop_connect_layout(x, residual):
    return _CL if _kernel_layout(x) == _CL and residual.is_contiguous(memory_format=_CL) else torch.contiguous_format


@register_fake("opfuse::drop_connect_add")
def _drop_connect_add(x, residual, p, training):
    return _drop_connect_add_forward(x, residual, p, training)[0]


@register_fake("opfuse::drop_connect_add_forward")
def _drop_connect_add_forward(x, residual, p, training):
    if not training or p == 0:
        return x + residual, None
    return _in_layout(x, _drop_connect_layout(x, residual)), x.new_empty(x.shape[0])


@register_fake("opfuse::drop_connect_add_backward")
def _drop_connect_add_backward(grad, mask, p):
    return grad.clone() if mask is None else _in_layout(grad, _drop_connect_layout(grad, grad))


# Row-wise norms: dense outputs, a per-row rstd in the op-math dtype.
@register_fake("opfuse::rms_norm")
def _rms_norm(x, weight, eps=1e-6):
    return _dense(x)


@register_fake("opfuse::rms_norm_forward")
def _rms_norm_forward(x, weight, eps):
    return _dense(x), _rows(x, _opmath(x.dtype))


@register_fake("opfuse::rms_norm_backward")
def _rms_norm_backward(grad, x, weight, rstd):
    return _dense(x), torch.empty_like(weight)


@register_fake("opfuse::add_rms_norm")
def _add_rms_norm(x, residual, weight, eps=1e-6):
    return _dense(x), _dense(x)


@register_fake("opfuse::add_rms_norm_forward")
def _add_rms_norm_forward(x, residual, weight, eps):
    return _dense(x), _dense(x), _rows(x, _opmath(x.dtype))


@register_fake("opfuse::add_rms_norm_backward")
def _add_rms_norm_backward(grad, grad_h, h, weight, rstd):
    return _dense(h), torch.empty_like(weight)


# Gated activations.
def _gated(gate, up):
    return _dense(gate)


def _gated_backward(grad, gate, up):
    return _dense(gate), _dense(gate)


for _name in ("swiglu", "geglu"):
    register_fake(f"opfuse::{_name}")(_gated)
    register_fake(f"opfuse::{_name}_backward")(_gated_backward)


@register_fake("opfuse::swiglu_packed")
def _swiglu_packed(x):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@register_fake("opfuse::swiglu_packed_backward")
def _swiglu_packed_backward(grad, x):
    return _dense(x)


@register_fake("opfuse::rotary_embedding")
def _rotary_embedding(x, cos, sin, interleaved=False):
    return _dense(x)


@register_fake("opfuse::rotary_embedding_backward")
def _rotary_embedding_backward(grad, cos, sin, interleaved):
    return _dense(grad)


# Losses: a scalar (mean, sum) or one per row (none); the forward's saved gradient is dense.
def _loss(x, target, reduction):
    return x.new_empty(target.shape) if reduction == 0 else x.new_empty(())


@register_fake("opfuse::cross_entropy")
def _cross_entropy(logits, target, ignore_index=-100, reduction=1, label_smoothing=0.0):
    return _loss(logits, target, reduction)


@register_fake("opfuse::cross_entropy_forward")
def _cross_entropy_forward(logits, target, ignore_index, reduction, label_smoothing):
    return _loss(logits, target, reduction), _dense(logits)


@register_fake("opfuse::cross_entropy_backward_")
def _cross_entropy_backward_(grad_logits, grad):
    return None


@register_fake("opfuse::linear_cross_entropy")
def _linear_cross_entropy(h, weight, target, ignore_index=-100, reduction=1, label_smoothing=0.0):
    return h.new_empty(())


@register_fake("opfuse::linear_cross_entropy_forward")
def _linear_cross_entropy_forward(h, weight, target, ignore_index, reduction, label_smoothing, grad_h, grad_weight):
    return h.new_empty(()), _dense(h) if grad_h else None, _dense(weight) if grad_weight else None


# Optimizer steps write in place and return nothing.
@register_fake("opfuse::adamw_")
def _adamw_(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps, weight_decay, maximize=False):
    return None


@register_fake("opfuse::sgd_")
def _sgd_(params, grads, momentum_buffers, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
          maximize=False, fresh_buffers=False):
    return None


# Attention over [B, H, T, D] heads, or [B·H, T, D] (the front end works on them as [B·H, 1, T, D]).
def _attention_outputs(q, k, v):
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    stats = q.new_empty((*q.shape[:-1], 2), dtype=_opmath(q.dtype))
    return out, stats


@register_fake("opfuse::attention")
def _attention(q, k, v, causal=False, scale=None, attn_mask=None, dropout_p=0.0, generator=None):
    return _attention_outputs(q, k, v)[0]


@register_fake("opfuse::attention_forward")
def _attention_forward(q, k, v, causal, scale, attn_mask, dropout_p, generator):
    out, stats = _attention_outputs(q, k, v)
    return out, stats, q.new_empty(1, dtype=torch.int64)


@register_fake("opfuse::attention_backward")
def _attention_backward(grad, q, k, v, out, stats, seed, causal, scale, attn_mask, dropout_p, mask_grad=False):
    dscores = q.new_empty((*q.shape[:-1], k.shape[-2]), dtype=_opmath(q.dtype)) if mask_grad else None
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dscores
