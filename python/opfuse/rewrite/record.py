"""Copying a model, and recording how each of its modules is called: its arguments, and a leaf's
top-level ops."""

import copy
import types

import torch


def copy_model(model):
    """copy.deepcopy, plus what deepcopy leaves shared: a function stored on a module (minGPT's
    `self.mlpf = lambda x: m.dropout(m.c_proj(...))`) still closes over the original's
    submodules; the copy's closes over the copy's, so converting or training it stays within it."""
    memo = {}
    twin = copy.deepcopy(model, memo)
    for module in twin.modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, types.FunctionType) and value.__closure__:
                cells = tuple(types.CellType(memo.get(id(c.cell_contents), c.cell_contents)) for c in value.__closure__)
                rebound = types.FunctionType(value.__code__, value.__globals__, value.__name__, value.__defaults__, cells)
                rebound.__kwdefaults__ = value.__kwdefaults__
                setattr(module, name, rebound)
    return twin


# ---- recording how each module is called ------------------------------------------------------

class Call:
    """The first call of a module in a recorded forward: its arguments and, for a module without
    children, the top-level ops its forward ran; `count`: how many times the forward called it."""

    def __init__(self, args, kwargs, ops):
        self.args, self.kwargs, self.ops, self.count = args, kwargs, ops, 1


def record_calls(model, inputs, native):
    """Runs one training-mode forward of a copy of the model and returns {path: Call}."""
    model = copy_model(model)
    model.train()
    calls = {}

    def recorder(path, module):
        original = module.forward
        leaf = not any(True for _ in module.children())

        def forward(*args, **kwargs):
            if path in calls:
                calls[path].count += 1
                return original(*args, **kwargs)
            if not leaf:
                calls[path] = Call(args, kwargs, None)
                return original(*args, **kwargs)
            out = []
            ops = native.top_level_ops(lambda: out.append(original(*args, **kwargs)))
            calls[path] = Call(args, kwargs, ops)
            return out[0]

        return forward

    for path, module in model.named_modules():
        module.forward = recorder(path, module)
    with torch.no_grad():
        model(*inputs)
    return calls
