"""Modules that replace a submodule whose whole forward is a rule's chain (rules' `python.module`)."""
import torch

from . import functional


class Fused(torch.nn.Module):
    """A replacement keeps the parameters and buffers of the module it replaces."""

    @classmethod
    def cannot_take(cls, module):
        """Why this replacement cannot take the module (which computes its chain), or None."""
        return None

    @classmethod
    def from_module(cls, module, ops=()):
        """ops: the module's recorded forward chain, for replacements that follow its dtypes."""
        fused = cls()
        for name, p in module.named_parameters(recurse=False):
            fused.register_parameter(name, p)
        for name, b in module.named_buffers(recurse=False):
            fused.register_buffer(name, b)
        fused.train(module.training)
        fused.replaced = type(module).__name__
        return fused

    def extra_repr(self):
        return f"replaces {getattr(self, 'replaced', '?')}"


class SiLU(Fused):
    """x · sigmoid(x) as one fused op forward and one backward (opfuse::silu on the CPU)."""

    def forward(self, x):
        return functional.silu(x)


class RMSNorm(Fused):
    """RMSNorm over the last dimension in one fused op forward and one backward (opfuse::rms_norm
    on the CPU). The epsilon is the replaced module's: `eps` (Meta's Llama, llama2.c),
    `variance_epsilon` (Hugging Face) or `epsilon`.

    A module that normalises `x.float()` (its chain starts with a cast) computes in float32
    whatever x's dtype; so does its replacement: float32 and bfloat16 x take the fused op (float
    arithmetic, one rounding), float64 x the module's own composite (all in float32 for Llama's;
    T5's takes only the variance in float32), since there is no float64 computation to fuse."""

    EPS_NAMES = ("eps", "variance_epsilon", "epsilon")

    @classmethod
    def _eps_of(cls, module):
        return next((getattr(module, n) for n in cls.EPS_NAMES if isinstance(getattr(module, n, None), float)), None)

    @classmethod
    def cannot_take(cls, module):
        if cls._eps_of(module) is None:
            return f"it holds no float eps under {', '.join(cls.EPS_NAMES)}"
        if not isinstance(getattr(module, "weight", None), torch.nn.Parameter):
            return "it has no weight parameter"
        return None

    @classmethod
    def from_module(cls, module, ops=()):
        fused = super().from_module(module)
        fused.eps = cls._eps_of(module)
        casts = [op in ("aten::to", "aten::_to_copy", "aten::type_as") for op in ops]
        fused.in_float = bool(ops) and casts[0]
        # T5's LayerNorm casts only what it takes the variance of (its one cast): x · rstd is in
        # x's dtype, where Llama's (a second cast, back to x's dtype) is in float32.
        fused.variance_in_float = fused.in_float and sum(casts) == 1
        return fused

    def forward(self, x):
        if getattr(self, "in_float", False) and x.dtype == torch.float64:
            if getattr(self, "variance_in_float", False):
                return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
            return functional.rms_norm_composite(x, None, self.eps, in_float=True) * self.weight
        return functional.rms_norm(x, self.weight, self.eps)

    def extra_repr(self):
        return f"{super().extra_repr()}, eps={self.eps}, in_float={getattr(self, 'in_float', False)}"
