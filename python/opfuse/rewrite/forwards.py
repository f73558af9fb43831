"""The fx rewrite of a model: every user module's forward traced once and rewritten by a rule's
patterns."""

import operator

from .tracing import is_library_leaf
from .fx_match import _MatchContext, _compiled_pattern
from .specialise import FusedForward


def rewrite_forwards(model, rule, rules, calls, not_traced, escapes=None):
    """Applies the rule's fx pairs to every user module's forward; returns how many chains were
    replaced. Modules that do not trace go into not_traced {path: reason}; chains matched in a
    module where none could be replaced, because a value of theirs is used outside them, into
    `escapes` (described, one per module)."""
    patterns = [_compiled_pattern(p.pattern, p.replacement, tuple(p.outputs)) for p in rule.python_fx]
    replaced, traced = 0, {}
    for path, module in list(model.named_modules()):
        call = calls.get(path)
        if is_library_leaf(module) or call is None:
            continue
        fused = module.__dict__.get("forward")
        if not isinstance(fused, FusedForward):
            fused = FusedForward(module, path)
            try:
                fused.specialise(fused.binder(call.args, call.kwargs))
            except Exception as e:
                not_traced[path or "(model)"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                continue
        traced[path] = fused
        fused.read_only(_read_outputs(path, calls, traced))
        ctx = _MatchContext(module, path, rules, calls)
        count = fused.rewrite(patterns, ctx)
        if count:
            replaced += count
            module.forward = fused
        elif ctx.escape is not None and escapes is not None:
            escapes.append(ctx.escape)
    return replaced


def _read_outputs(path, calls, traced):
    """The items of the module's output tuple its callers read, or None for all: known when every
    call of it in the recorded forward came from its parent's traced graph (past containers that
    are never called, a ModuleList), which takes items out of it and passes the tuple nowhere
    (Hugging Face's attention returns its probabilities beside its output, and the decoder layer
    drops them: `hidden_states, _ = self.self_attn(...)`). An item the parent returns counts as
    read only where the parent's own callers read it (its graph returns None there already)."""
    caller = _caller(path, calls, traced)
    if caller is None:
        return None
    parent_path, name = caller
    parent = traced[parent_path]
    read, sites = set(), 0
    for training, graph in parent.graphs.items():
        for node in graph.nodes:
            if node.op != "call_module" or node.target != name:
                continue
            sites += training  # the recorded forward ran in training mode
            for user in node.users:
                if user.op != "call_function" or user.target is not operator.getitem or not isinstance(user.args[1], int):
                    return None
                if user.users:  # `hidden_states, _ = …` takes out an item it never uses
                    read.add(user.args[1])
    return frozenset(read) if calls[path].count == calls[parent_path].count * sites else None


def _caller(path, calls, traced):
    """(the path of the traced module whose graph calls this one, the call's target there), or None
    where that is not known: the module is the model, or the nearest ancestor that was called did
    not trace."""
    parts = path.split(".") if path else []
    for cut in range(len(parts) - 1, -1, -1):
        parent_path = ".".join(parts[:cut])
        if parent_path in traced:
            return parent_path, ".".join(parts[cut:])
        if parent_path in calls:
            return None
    return None
