"""The fused operators as functions, per backend: on the CPU the opfuse op; on CUDA the best torch
op until opfuse has CUDA kernels; on an Ascend NPU the torch_npu op the rule names (that path is
untested here: no NPU). The fx rewrites call these, so a rewritten model runs on any device.

Under torch.compile the EfficientNet family's (silu, se_gate, batch_norm_silu) are torch's own
ops: inductor fuses those into their neighbours (a convolution, a BatchNorm), where opfuse's op is
a call it cannot see into. The Python EfficientNet-B0 with opfuse's SiLU and BatchNorm+SiLU
compiled ran at x0.82 [0.80, 0.88] of the model compiled as written (bench/platform_targets.py)."""
import torch
import torch.nn.functional as F


def _npu():
    import torch_npu  # noqa: F401  (only where an NPU tensor exists)

    return torch_npu


def silu(x):
    """x · sigmoid(x), forward and backward in one pass each."""
    if torch.compiler.is_compiling():
        return F.silu(x)
    if x.device.type == "cpu":
        return torch.ops.opfuse.silu(x)
    if x.device.type == "npu":
        return _npu().npu_silu(x)
    return F.silu(x)


def se_gate(x, gate):
    """x · sigmoid(gate), gate [N, C, 1, 1] broadcast over x [N, C, H, W]."""
    if x.device.type == "cpu" and gate.dim() == 4 and x.dim() == 4 and not torch.compiler.is_compiling():
        return torch.ops.opfuse.se_gate(x, gate)
    return x * torch.sigmoid(gate)


def _momentum(bn):
    """The momentum a BatchNorm module uses for this call, counting the batch as it does."""
    if bn.training and bn.track_running_stats and bn.num_batches_tracked is not None:
        bn.num_batches_tracked.add_(1)
        return 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum
    return 0.0 if bn.momentum is None else bn.momentum


def batch_norm_silu(x, bn):
    """silu(bn(x)) for a BatchNorm module, its running statistics updated as its own forward does."""
    momentum = _momentum(bn)
    training = bn.training or bn.running_mean is None
    stats = not bn.training or bn.track_running_stats
    mean = bn.running_mean if stats else None
    var = bn.running_var if stats else None
    if x.device.type == "cpu" and x.dim() in (2, 4) and not torch.compiler.is_compiling():
        return torch.ops.opfuse.batch_norm_silu(x, bn.weight, bn.bias, mean, var, training, momentum, bn.eps)
    y = F.batch_norm(x, mean, var, bn.weight, bn.bias, training, momentum, bn.eps)
    return silu(y)


def swiglu(gate, up):
    """silu(gate) · up in one pass forward and one backward (nothing saved but the inputs)."""
    if gate.device.type == "cpu" and gate.shape == up.shape and gate.dtype == up.dtype:
        return torch.ops.opfuse.swiglu(gate, up)
    return F.silu(gate) * up


def geglu(gate, up):
    """gelu(gate, approximate='tanh') · up in one pass forward and one backward (Gemma's, T5 v1.1's
    gated GELU; nothing saved but the inputs)."""
    if gate.device.type == "cpu" and gate.shape == up.shape and gate.dtype == up.dtype:
        return torch.ops.opfuse.geglu(gate, up)
    return F.gelu(gate, approximate="tanh") * up


def rms_norm(x, weight, eps):
    """x · rsqrt(mean(x², -1) + eps) · weight, computed in float for bfloat16 x and rounded once.
    The CPU op takes weight of x's dtype; other combinations keep the composite (and its dtype
    promotion)."""
    if x.device.type == "cpu" and weight is not None and weight.dtype == x.dtype and weight.dim() == 1:
        return torch.ops.opfuse.rms_norm(x, weight, float(eps))
    return rms_norm_composite(x, weight, eps)


def rms_norm_composite(x, weight, eps, in_float=False):
    """The chain as Llama writes it (computed, then rounded back to x's dtype, times weight): in
    float32 when in_float (Llama's `x.float()`, whatever x's dtype), else as the fused op computes,
    in float32 for bfloat16 and float16 x and in x's own dtype for float32 and float64."""
    a = x.float() if in_float else x.to(torch.promote_types(x.dtype, torch.float32))
    y = (a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + eps)).type_as(x)
    return y * weight if weight is not None else y


def add_rms_norm(x, residual, weight, eps):
    """(rms_norm(x + residual, weight, eps), x + residual): a Llama block's residual add and the norm
    after it, one pass forward and one backward on the CPU (gradients from both outputs)."""
    if (x.device.type == "cpu" and weight is not None and x.shape == residual.shape
            and x.dtype == residual.dtype == weight.dtype and weight.dim() == 1):
        return torch.ops.opfuse.add_rms_norm(x, residual, weight, float(eps))
    if x.device.type == "npu":
        y, _, h = _npu().npu_add_rms_norm(x, residual, weight, eps)
        return y, h
    h = x + residual
    return rms_norm_composite(h, weight, eps), h


def add_rms_norm_chain(x, residual, norm):
    """(norm(x + residual), x + residual) for an opfuse.nn.RMSNorm `norm`, as add_rms_norm: the
    fx rewrite of a residual add whose sum goes into an RMSNorm module and on to the next add. A
    norm that computes in float32 keeps its own composite for float64 x, as the module does."""
    if getattr(norm, "in_float", False) and x.dtype == torch.float64:
        h = x + residual
        return norm(h), h
    return add_rms_norm(x, residual, norm.weight, norm.eps)


def add_layer_norm(x, residual, weight, bias, eps):
    """(layer_norm(x + residual) over the last dimension, x + residual): a GPT-2 or BERT block's
    residual add and the LayerNorm after it, one pass forward and one backward on the CPU
    (gradients from both outputs). Elsewhere, and without weight or bias, the composite."""
    if (x.device.type == "cpu" and weight is not None and bias is not None and x.shape == residual.shape
            and x.dtype == residual.dtype == weight.dtype == bias.dtype and weight.dim() == 1):
        return torch.ops.opfuse.add_layer_norm(x, residual, weight, bias, float(eps))
    h = x + residual
    return F.layer_norm(h, h.shape[-1:], weight, bias, eps), h


def add_layer_norm_chain(x, residual, norm):
    """(norm(x + residual), x + residual) for an nn.LayerNorm `norm` over the last dimension: the
    fx rewrite of a residual add whose sum goes into the norm (and maybe on, as the residual)."""
    return add_layer_norm(x, residual, norm.weight, norm.bias, norm.eps)


_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def cross_entropy(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """F.cross_entropy(logits.view(-1, V), target.view(-1), ...) over logits [..., V] (the classes
    last) and int64 target [...]; reduction "none" gives target's shape. On the CPU the opfuse op:
    the forward computes the gradient wrt the logits and keeps it instead of the log-probabilities,
    the backward scales it in place (one [N, V] tensor held, not three). Elsewhere F.cross_entropy
    (on CUDA Liger-Kernel's LigerCrossEntropyLoss is the fused choice: not a dependency here)."""
    if logits.device.type == "cpu" and _loss_applies(logits, target) and reduction in _REDUCTIONS:
        return torch.ops.opfuse.cross_entropy(logits, target, ignore_index, _REDUCTIONS[reduction],
                                              float(label_smoothing))
    return _cross_entropy_rows(logits, target, ignore_index, reduction, label_smoothing)


def linear_cross_entropy(h, weight, target, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """cross_entropy(h @ weight.T, target, ...) for h [..., H], weight [V, H] (an output layer
    without bias). On the CPU the opfuse op never holds the [N, V] logits: chunks of rows, each
    chunk's logits turned into their gradient, grad_h and grad_weight made in the forward. Reduction
    "mean" or "sum"; "none", and other devices, take the composite."""
    if (h.device.type == weight.device.type == "cpu" and reduction in ("mean", "sum") and h.dtype == weight.dtype
            and weight.dim() == 2 and _loss_applies(h, target)):
        return torch.ops.opfuse.linear_cross_entropy(h, weight, target, ignore_index, _REDUCTIONS[reduction],
                                                     float(label_smoothing))
    return _cross_entropy_rows(F.linear(h, weight), target, ignore_index, reduction, label_smoothing)


def cross_entropy_chain(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0, weight=None):
    """F.cross_entropy as a forward called it, given what the fx pattern bound: the fused op for
    rows of classes (logits [N, V], class indices [N]) without class weights; F.cross_entropy
    itself otherwise (the classes at dim 1 of [N, C, d…], probabilities as targets, weights)."""
    if weight is None and logits.dim() == 2 and target.dim() == 1 and not target.is_floating_point():
        return cross_entropy(logits, target, ignore_index, reduction, label_smoothing)
    return F.cross_entropy(logits, target, weight=weight, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)


def cross_entropy_loss_module(logits, target, loss):
    """A torch.nn.CrossEntropyLoss module's call, its options read from it (cross_entropy_chain)."""
    return cross_entropy_chain(logits, target, loss.ignore_index, loss.reduction, loss.label_smoothing, loss.weight)


def _loss_applies(x, target):
    return (x.dtype in (torch.float32, torch.float64, torch.bfloat16) and x.dim() >= 1
            and target.dtype == torch.int64 and target.device.type == "cpu" and target.shape == x.shape[:-1])


def _cross_entropy_rows(logits, target, ignore_index, reduction, label_smoothing):
    """F.cross_entropy on the flattened rows, the classes last."""
    v = logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, v), target.reshape(-1), ignore_index=ignore_index,
                           reduction=reduction, label_smoothing=label_smoothing)
    return loss.view(target.shape) if reduction == "none" else loss


def rotary_embedding(x, cos, sin, interleaved=False):
    """Each pair of x's last dimension rotated by its angle: (x[i], x[i + D/2]) (rotate-half,
    x·cos + cat(−x₂, x₁)·sin) or, interleaved, (x[2i], x[2i + 1]). cos and sin are [..., D/2] (an
    angle per pair) or [..., D] (a value per element, Hugging Face's tables), broadcast to x's
    leading dimensions as torch broadcasts ([T, 1, D/2] for x [B, T, H, D]). The CPU op takes
    constant tables of x's dtype (float32 for bfloat16 x); anything else runs the composite."""
    if _rotary_applies(x, cos, sin):
        return torch.ops.opfuse.rotary_embedding(x, cos, sin, interleaved)
    return rotary_embedding_composite(x, cos, sin, interleaved)


def _rotary_applies(x, cos, sin):
    d = x.shape[-1] if x.dim() else 1
    if not (x.device.type == cos.device.type == sin.device.type == "cpu" and d % 2 == 0):
        return False
    if cos.shape != sin.shape or cos.dtype != sin.dtype or cos.requires_grad or sin.requires_grad:
        return False
    if cos.dtype != x.dtype and not (x.dtype == torch.bfloat16 and cos.dtype == torch.float32):
        return False
    if x.dtype not in (torch.float32, torch.float64, torch.bfloat16):
        return False
    if not 1 <= cos.dim() <= x.dim() or cos.shape[-1] not in (d // 2, d):
        return False
    try:
        return torch.broadcast_shapes(cos.shape[:-1], x.shape[:-1]) == x.shape[:-1]
    except RuntimeError:
        return False


def rotary_embedding_composite(x, cos, sin, interleaved=False):
    """x·cos + rot(x)·sin, the tables widened to a value per element as the spellings hold them."""
    d = x.shape[-1]
    if cos.shape[-1] != d:
        widen = (lambda t: t.repeat_interleave(2, -1)) if interleaved else (lambda t: torch.cat((t, t), -1))
        cos, sin = widen(cos), widen(sin)
    if interleaved:
        rotated = torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)
    else:
        rotated = torch.cat((-x[..., d // 2:], x[..., :d // 2]), -1)
    return x * cos + rotated * sin


def rotate_half_chain(x, cos, sin, half=None):
    """x·cos + cat(−x₂, x₁)·sin as a model wrote it, given what the fx pattern bound: x₁, x₂ cut at
    `half` (x[..., :half], x[..., half:]) or, with no half, x.chunk(2, dim=-1). The fused op where
    that is the rotate-half pairing and the op takes the tables, the chain itself otherwise."""
    d = x.shape[-1]
    if d % 2 == 0 and half in (None, d // 2) and _rotary_applies(x, cos, sin):
        return torch.ops.opfuse.rotary_embedding(x, cos, sin, False)
    x1, x2 = x.chunk(2, dim=-1) if half is None else (x[..., :half], x[..., half:])
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def rotate_every_two_chain(x, cos, sin):
    """GPT-J's x·cos + rotate_every_two(x)·sin, given what the fx pattern bound: the interleaved
    pairs (x[2i], x[2i + 1]) rotated, rotate_every_two(x) = stack((−x[..., 1::2], x[..., ::2]),
    −1).flatten(−2), the tables a value per element (repeat_interleave'd). The fused op where it
    takes the tables, the chain itself otherwise."""
    if x.dim() >= 1 and x.shape[-1] % 2 == 0 and _rotary_applies(x, cos, sin):
        return torch.ops.opfuse.rotary_embedding(x, cos, sin, True)
    return x * cos + torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2) * sin


def real_pairs_chain(x, cos, sin, shape, start):
    """llama2.c's interleaved rotation in real arithmetic, given what the fx pattern bound: x.float()
    viewed as `shape` and unbound into pairs, rotated by cos and sin, stacked, flattened from dim
    `start`, .type_as(x). The fused op where that is the rotation of x's last dimension (bfloat16 x:
    float arithmetic rounded once, as the chain's); float64 x runs the chain itself, since its
    float32 arithmetic is the numerics to keep (as attention_chain's in_float)."""
    shape = tuple(shape)
    pairs = shape[:-2] == tuple(x.shape[:-1]) and shape[-2:] in ((-1, 2), (x.shape[-1] // 2, 2))
    if pairs and start == x.dim() - 1 and x.dtype != torch.float64 and _rotary_applies(x, cos, sin):
        return torch.ops.opfuse.rotary_embedding(x, cos, sin, True)
    xr, xi = x.float().reshape(shape).unbind(-1)
    return torch.stack([xr * cos - xi * sin, xr * sin + xi * cos], dim=-1).flatten(start).type_as(x)


def complex_pairs_chain(x, freqs_cis, shape, start):
    """Meta's apply_rotary_emb, given what the fx pattern bound: x.float() viewed as `shape` (pairs
    last) and as complex numbers, times freqs_cis, back to real, flattened from dim `start`,
    .type_as(x). The fused op, with cos and sin the real and imaginary parts of complex64 freqs_cis,
    where that is the rotation of x's last dimension; the chain itself otherwise (float64 x keeps
    its float32 arithmetic)."""
    shape = tuple(shape)
    pairs = shape[:-2] == tuple(x.shape[:-1]) and shape[-2:] in ((-1, 2), (x.shape[-1] // 2, 2))
    if pairs and start == x.dim() - 1 and x.dtype != torch.float64 and freqs_cis.dtype == torch.complex64:
        cos, sin = freqs_cis.real, freqs_cis.imag
        if _rotary_applies(x, cos, sin):
            return torch.ops.opfuse.rotary_embedding(x, cos, sin, True)
    return torch.view_as_real(torch.view_as_complex(x.float().reshape(shape)) * freqs_cis).flatten(start).type_as(x)


def attention(q, k, v, causal=False, scale=None, attn_mask=None, dropout_p=0.0):
    """softmax(scale · q kᵀ + mask) · v over q [B, H, T, D], k, v [B, H, S, *], as
    F.scaled_dot_product_attention: attn_mask bool (true takes part) or additive. On the CPU,
    opfuse's tiled op (no [T, S] matrix stored; the dropout mask drawn from torch's generator but
    not the composite's draws)."""
    if q.device.type == "cpu" and q.dtype == k.dtype == v.dtype and q.dim() in (3, 4):
        return torch.ops.opfuse.attention(q, k, v, causal, scale, attn_mask, float(dropout_p), None)
    if hasattr(F, "scaled_dot_product_attention") and scale is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, causal)
    return attention_composite(q, k, v, causal, scale, attn_mask, dropout_p)


def attention_composite(q, k, v, causal=False, scale=None, attn_mask=None, dropout_p=0.0):
    s = torch.matmul(q, k.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
    return torch.matmul(F.dropout(torch.softmax(s, -1), dropout_p, True), v)


def attention_chain(q, kt, v, scale, zero_masked, additive, dropout, in_float=False, fill=None):
    """The attention chain a model wrote by hand, given what the fx pattern bound: the scores
    q @ kt · scale, masked where zero_masked == 0 (minGPT's tril buffer, filled with −inf; with
    `fill`, the value torch.where put there: GPT-2's finfo.min), plus the additive mask (llama2.c's,
    Hugging Face's), softmax (in float32 when in_float: llama2.c's `.float()` … `.type_as(q)`,
    Hugging Face's `softmax(…, dtype=torch.float32).to(q.dtype)`), dropout (a dropout module, the
    probability F.dropout was called with in training, or None), @ v. A mask that is exactly
    causal becomes causal=True, so the tiles above the diagonal are skipped.
    The chain runs as written for float64 input to an in_float chain (its float32 softmax is the
    numerics to keep, as nn.RMSNorm's in_float) and for a fill too small to absorb the scores.
    q and k in float32 beside v in the model's dtype (GPT-J's and GPT-Neo's upcast) run in the wider
    of the two and return v's dtype, as the chain's `.to(value.dtype)` does (the probabilities
    unrounded)."""
    if additive is not None and additive.dtype == torch.bool:  # `+ m` of a bool m adds 0 or 1, as torch promotes it
        additive = additive.to(q.dtype)
    if v.dtype != q.dtype:
        wide = torch.promote_types(q.dtype, v.dtype)
        return attention_chain(q.to(wide), kt.to(wide), v.to(wide), scale, zero_masked, additive, dropout,
                               in_float, fill).to(v.dtype)
    k = kt.transpose(-2, -1)
    if isinstance(dropout, (int, float)):
        p = float(dropout)
    else:
        p = dropout.p if dropout is not None and dropout.training else 0.0
    filled = None if fill is None else float(fill)
    if (in_float and q.dtype == torch.float64) or not (filled is None or filled <= ABSORBING):
        return _attention_as_written(q, kt, v, scale, zero_masked, additive, p, in_float, fill)
    T, S = q.shape[-2], k.shape[-2]
    if zero_masked is None:  # a mask that requires grad (T5's position bias) keeps its place, for its gradient
        causal = additive is not None and not additive.requires_grad and _is_causal(additive, T, S, additive=True)
        return attention(q, k, v, causal, float(scale), None if causal else additive, p)
    causal, keep = _is_causal(zero_masked, T, S, additive=False), zero_masked != 0
    if filled is None or filled == float("-inf"):  # a masked place weighs 0 whatever is added
        mask = additive if causal else keep if additive is None else additive.masked_fill(~keep, float("-inf"))
        return attention(q, k, v, causal, float(scale), mask, p)
    if causal and additive is None:  # each row keeps its diagonal: exp(fill − max) is 0 as exp(−inf) is
        return attention(q, k, v, True, float(scale), None, p)
    # The fill absorbs any score (s + fill rounds to fill), so where(keep, s, fill) + m is
    # s + where(keep, m, fill + m) exactly. But where passes no gradient to the places it fills,
    # and an added mask does: the same only while those places weigh 0, which a row whose kept
    # places are all absorbed too (a left-padded row, m = finfo.min on each key it keeps) breaks:
    # its softmax spreads over filled places as well. Such rows run the chain as written.
    extra = torch.zeros((), dtype=q.dtype, device=q.device) if additive is None else additive
    nowhere = torch.tensor(float("-inf"), dtype=extra.dtype, device=extra.device)
    if (torch.where(keep, extra, nowhere).amax(-1) <= ABSORBING).any():
        return _attention_as_written(q, kt, v, scale, zero_masked, additive, p, in_float, fill)
    if causal:  # every row keeps a place its mask does not absorb: the filled ones weigh 0
        return attention(q, k, v, True, float(scale), additive, p)
    return attention(q, k, v, False, float(scale), torch.where(keep, extra, fill + extra), p)


def _attention_as_written(q, kt, v, scale, zero_masked, additive, p, in_float, fill):
    s = torch.matmul(q, kt) * scale
    if zero_masked is not None:
        s = s.masked_fill(zero_masked == 0, float("-inf")) if fill is None else torch.where(zero_masked != 0, s, fill)
    if additive is not None:
        s = s + additive
    w = F.softmax(s.float(), dim=-1).type_as(q) if in_float else F.softmax(s, dim=-1)
    return torch.matmul(F.dropout(w, p, True), v)


# A torch.where fill at most this absorbs any score added to it, in float32 (its ulp there is
# 7.6e22) as in float64 (1.4e14): finfo.min, and GPT-J's finfo.min / sqrt(head_dim).
ABSORBING = -1e30

_causal_masks = {}


def _is_causal(mask, T, S, additive):
    """Whether the [.., T, S] mask is the causal one for every leading index (Hugging Face's
    [batch, 1, T, S] holds one per sample): additive 0 on and below the diagonal and −inf (or its
    dtype's lowest, Hugging Face's finfo.min) above, or non-zero exactly on and below it. Each row
    keeps its diagonal, so exp(lowest − max) is 0 as exp(−inf) is. Remembered per mask memory
    and version (the cache holds the tensor, so its memory cannot be reused for another mask
    meanwhile)."""
    if mask.dim() < 2 or mask.shape[-2:] != (T, S) or torch.compiler.is_compiling():
        return False  # under torch.compile: reading the mask's values would break the graph
    key = (mask.data_ptr(), tuple(mask.shape), tuple(mask.stride()), mask.dtype, mask._version, additive)
    if key not in _causal_masks:
        if len(_causal_masks) > 64:
            _causal_masks.clear()
        m = mask.reshape(-1, T, S)
        above = torch.ones(T, S, dtype=torch.bool, device=m.device).triu(1)
        if additive:
            masked = m[:, above]
            lowest = torch.finfo(m.dtype).min if m.is_floating_point() else float("-inf")
            causal = bool(((masked == float("-inf")) | (masked == lowest)).all()) and bool((m[:, ~above] == 0).all())
        else:
            causal = bool((m[:, above] == 0).all()) and bool((m[:, ~above] != 0).all())
        _causal_masks[key] = (mask, causal)
    return _causal_masks[key][1]
