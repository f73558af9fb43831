"""The fx rewrite of a model: every user module's forward traced once and rewritten by a rule's
patterns."""

from .tracing import is_library_leaf
from .fx_match import _MatchContext, _compiled_pattern
from .specialise import FusedForward


def rewrite_forwards(model, rule, rules, calls, not_traced):
    """Applies the rule's fx pairs to every user module's forward; returns how many chains were
    replaced. Modules that do not trace go into not_traced {path: reason}."""
    patterns = [_compiled_pattern(p.pattern, p.replacement, tuple(p.outputs)) for p in rule.python_fx]
    replaced = 0
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
        count = fused.rewrite(patterns, _MatchContext(module, path, rules, calls))
        if count:
            replaced += count
            module.forward = fused
    return replaced
