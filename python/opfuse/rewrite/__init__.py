"""Rewrites of Python models, driven by the rules' `python:` sections.

Two kinds, both on data flow rather than on class names:
- a submodule whose whole forward op chain (recorded as it ran) is one of a rule's patterns is
  replaced by the rule's opfuse.nn module, which keeps its parameters and buffers;
- chains written inside a forward are rewritten with torch.fx: each module is traced on its own
  with its submodules as leaves, once per training mode, with the non-tensor arguments it was
  called with held fixed (and the tensors' shapes, dtypes and devices, where the forward asks
  them). A call with other ones gets its own graphs, traced and rewritten alike when it first comes
  (FusedForward). A module that does not trace is listed with the reason and left as it was.
"""
from .forwards import rewrite_forwards
from .fx_match import FxPattern
from .kinds import FUSED_FORM, MODULE_KINDS
from .record import Call, copy_model, record_calls
from .specialise import MAX_SPECIALISATIONS, FusedForward
from .swap import computes, set_submodule, swap_modules

__all__ = ["Call", "FUSED_FORM", "FusedForward", "FxPattern", "MAX_SPECIALISATIONS", "MODULE_KINDS", "computes",
           "copy_model", "record_calls", "rewrite_forwards", "set_submodule", "swap_modules"]
