"""The fused operators as functions, per backend: on the CPU the opfuse op; on CUDA the best torch
op until opfuse has CUDA kernels; on an Ascend NPU the torch_npu op the rule names (that path is
untested here: no NPU). The fx rewrites call these, so a rewritten model runs on any device."""
import torch
import torch.nn.functional as F


def _npu():
    import torch_npu  # noqa: F401  (only where an NPU tensor exists)

    return torch_npu


def silu(x):
    """x · sigmoid(x), forward and backward in one pass each."""
    if x.device.type == "cpu":
        return torch.ops.opfuse.silu(x)
    if x.device.type == "npu":
        return _npu().npu_silu(x)
    return F.silu(x)


def se_gate(x, gate):
    """x · sigmoid(gate), gate [N, C, 1, 1] broadcast over x [N, C, H, W]."""
    if x.device.type == "cpu" and gate.dim() == 4 and x.dim() == 4:
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
    if x.device.type == "cpu" and x.dim() in (2, 4):
        return torch.ops.opfuse.batch_norm_silu(x, bn.weight, bn.bias, mean, var, training, momentum, bn.eps)
    y = F.batch_norm(x, mean, var, bn.weight, bn.bias, training, momentum, bn.eps)
    return silu(y)


def swiglu(gate, up):
    """silu(gate) · up in one pass forward and one backward (nothing saved but the inputs)."""
    if gate.device.type == "cpu" and gate.shape == up.shape and gate.dtype == up.dtype:
        return torch.ops.opfuse.swiglu(gate, up)
    return F.silu(gate) * up


def rms_norm(x, weight, eps):
    """x · rsqrt(mean(x², -1) + eps) · weight, computed in float for bfloat16 x and rounded once.
    The CPU op takes weight of x's dtype; other combinations keep the composite (and its dtype
    promotion)."""
    if x.device.type == "cpu" and weight is not None and weight.dtype == x.dtype and weight.dim() == 1:
        return torch.ops.opfuse.rms_norm(x, weight, float(eps))
    return rms_norm_composite(x, weight, eps)


def rms_norm_composite(x, weight, eps):
    """The chain as Llama writes it (in float, rounded back to x's dtype, times weight)."""
    y = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).type_as(x)
    return y * weight if weight is not None else y
