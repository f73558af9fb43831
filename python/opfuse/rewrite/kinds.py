"""The submodule kinds an fx pattern may name (`silu_module(x)`, `rms_norm_module(x)` …): what makes
a submodule of a kind, and the fused form a replacement takes it in."""

import torch

from .. import nn as opfuse_nn
from .swap import computes


def _computes_kind(kind, module, rules, calls, path):
    """Whether the module's whole recorded forward is the chain of a rule whose modules are of
    that kind (the rule's `python: {kind: …}`)."""
    return any(r.python_kind == kind and computes(r, path, module, calls) for r in rules)


def _computes_lone(op, module, calls, path):
    """Whether the module's recorded forward is that one op and nothing else, with no submodules
    (Hugging Face's activation classes: SiLUActivation, GELUTanh)."""
    call = calls.get(path)
    return call is not None and call.ops == [op] and not any(True for _ in module.children())


def _is_silu_module(module, rules, calls, path):
    return (isinstance(module, (torch.nn.SiLU, opfuse_nn.SiLU)) or _computes_lone("aten::silu", module, calls, path)
            or _computes_kind("silu_module", module, rules, calls, path))


def _is_gelu_tanh_module(module, rules, calls, path):
    """nn.GELU(approximate='tanh'), a module computing the gelu_tanh rule's written-out chain
    (T5's NewGELUActivation), or one whose forward is a lone gelu (Hugging Face's GELUTanh: which
    gelu it is, verification tells)."""
    if isinstance(module, torch.nn.GELU):
        return module.approximate == "tanh"
    return _computes_lone("aten::gelu", module, calls, path) or _computes_kind("gelu_tanh_module", module, rules, calls, path)


def _fused_rms_norm(module, rules, calls, path):
    """The module as an opfuse.nn.RMSNorm (itself, or built from it when it computes the chain of
    a rule of rms_norm_module's kind and has a weight and an eps), or None."""
    if isinstance(module, opfuse_nn.RMSNorm):
        return module
    if not _computes_kind("rms_norm_module", module, rules, calls, path) or opfuse_nn.RMSNorm.cannot_take(module):
        return None
    return opfuse_nn.RMSNorm.from_module(module, calls[path].ops)


def _is_last_dim_layer_norm(module, rules, calls, path):
    """An nn.LayerNorm over the last dimension with weight and bias, running its own forward (or
    one whose recorded forward is a lone layer_norm: timm's subclass)."""
    if not isinstance(module, torch.nn.LayerNorm) or len(module.normalized_shape) != 1:
        return False
    if module.weight is None or getattr(module, "bias", None) is None:
        return False
    return type(module).forward is torch.nn.LayerNorm.forward or _computes_lone("aten::layer_norm", module, calls, path)


# Submodule kinds a pattern may name: a call of a submodule of that kind.
MODULE_KINDS = {
    "batch_norm": lambda module, rules, calls, path: isinstance(module, torch.nn.modules.batchnorm._BatchNorm),
    "silu_module": _is_silu_module,
    "gelu_tanh_module": _is_gelu_tanh_module,
    "dropout_module": lambda module, rules, calls, path: isinstance(module, torch.nn.Dropout),
    "rms_norm_module": lambda module, rules, calls, path: _fused_rms_norm(module, rules, calls, path) is not None,
    "layer_norm_module": _is_last_dim_layer_norm,
    "cross_entropy_module": lambda module, rules, calls, path: (isinstance(module, torch.nn.CrossEntropyLoss) and
                                                                type(module).forward is torch.nn.CrossEntropyLoss.forward),
}

# Kinds whose submodule the replacement takes in its fused form: it is put in place of the user's
# before the replacement is built (the replacement reads its weight and eps).
FUSED_FORM = {"rms_norm_module": _fused_rms_norm}
