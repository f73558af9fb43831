"""Module swaps: a submodule whose whole recorded forward is one of a rule's chains replaced by the
rule's opfuse.nn module (its parameters and buffers kept)."""

from .. import nn as opfuse_nn


def computes(rule, path, module, calls):
    """Whether the module's whole recorded forward is one of the rule's chains."""
    call = calls.get(path)
    if call is None or call.ops is None or isinstance(module, opfuse_nn.Fused):
        return False
    return rule.matches_whole(call.ops)


def set_submodule(model, path, module):
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, module)


def swap_modules(model, rule, calls, left):
    """Replaces each submodule that computes the rule's chain; returns how many. One that the
    replacement cannot take (it lacks an eps, a weight) goes into left {path: reason}."""
    cls = getattr(opfuse_nn, rule.python_module)
    swapped = 0
    for path, module in list(model.named_modules()):
        if path and computes(rule, path, module, calls):
            why = cls.cannot_take(module)
            if why is not None:
                left[path] = f"computes {rule.name}, but opfuse.nn.{cls.__name__} cannot take it: {why}"
                continue
            set_submodule(model, path, cls.from_module(module, calls[path].ops))
            swapped += 1
    return swapped
