"""Modules that replace a submodule whose whole forward is a rule's chain (rules' `python.module`)."""
import torch

from . import functional


class Fused(torch.nn.Module):
    """A replacement keeps the parameters and buffers of the module it replaces."""

    @classmethod
    def from_module(cls, module):
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
