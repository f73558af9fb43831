"""A module's forward replaced by its rewritten graphs (FusedForward), one set per specialisation:
the non-tensor arguments, and what the forward asked of its tensors, it was traced with."""

import copy
import inspect
import itertools
import warnings

import torch
from torch.fx.proxy import Proxy

from .tracing import KEYWORDS, ReplacedForward, _flat_arguments, _holdable, _is_tensor_tuple, _same, trace
from .fx_match import _MatchedKinds, _compiled_pattern


ASPECTS = ("shape", "dtype", "device")


def _signature_of(value, aspects=ASPECTS):
    """What a specialised graph holds of a tensor argument (those of its shape, dtype and device
    the forward asked), or of a tuple of tensors; None for anything else."""
    if isinstance(value, torch.Tensor):
        return tuple(tuple(value.shape) if a == "shape" else getattr(value, a) for a in ASPECTS if a in aspects)
    if _is_tensor_tuple(value):
        return tuple(_signature_of(v, aspects) for v in value)
    return None


# Graphs a module's forward keeps, one per set of arguments that specialises it (a sequence length,
# a dtype, a start position): a model called with ever new ones runs its original forward past this.
MAX_SPECIALISATIONS = 8


def _state_of(module):
    """What a graph that asked dtypes or devices also depends on beyond its arguments: the dtypes
    and devices of the module's parameters and buffers (model.bfloat16(), `self.dtype`) and
    autocast's state."""
    held = dict.fromkeys((t.dtype, t.device) for t in itertools.chain(module.parameters(), module.buffers()))
    autocast = (torch.is_autocast_enabled(), torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
    return tuple(held), autocast  # in the module's own order, which torch.compile can trace


class _Specialisation:
    """The rewritten graphs for calls with these non-tensor arguments and these tensor signatures
    (what the forward asked of the tensors: aspects, and having asked dtypes or devices, the
    module's state)."""

    def __init__(self, concrete, aspects, flat, state, graphs):
        self.concrete, self.aspects, self.state, self.graphs, self.code = concrete, aspects, state, graphs, {}
        # every tensor argument at least as a tensor: a call passing None there is another call
        self.signatures = {k: _signature_of(v, aspects) for k, v in flat.items() if _signature_of(v, ()) is not None}

    def fits(self, flat, state_of):
        if any(k not in flat or not _same(flat[k], v) for k, v in self.concrete.items()):
            return False
        if any(_signature_of(flat.get(k), self.aspects) != v for k, v in self.signatures.items()):
            return False
        return self.state is None or self.state == state_of()

    def with_graphs(self, graphs):
        twin = copy.copy(self)
        twin.graphs, twin.code = graphs, {}
        return twin

    def compile_all(self):
        """Makes the forward of every graph now, in eager code: torch.compile can call it, not make it."""
        for training in self.graphs:
            self.compiled(training)
        return self

    def compiled(self, training):
        if training not in self.code:
            code = self.graphs[training].python_code(root_module="self")
            scope = dict(code.globals)
            exec(code.src, scope)
            self.code[training] = scope["forward"]
        return self.code[training]


def _unread_as_none(graph, read):
    """The graph's output tuple with None for the items not in `read`; whether it changed."""
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    value = out.args[0]
    if read is None or type(value) not in (tuple, list) or all(i in read or v is None for i, v in enumerate(value)):
        return False
    out.args = (type(value)(v if i in read else None for i, v in enumerate(value)),)
    return True


def _failure_key(flat):
    """A call that did not trace, as later calls are compared with it: tensors by signature,
    other arguments by value where a graph could hold them, else by type."""
    return {k: _signature_of(v) if _signature_of(v, ()) is not None else v if _holdable(v) else type(v)
            for k, v in flat.items()}


def _has_proxy(values):
    return any(isinstance(v, Proxy) or isinstance(v, (list, tuple)) and _has_proxy(v) for v in values)


class _Binder:
    """A call's flat arguments (_flat_arguments), without inspect's bind for a forward of plain
    parameters: a FusedForward binds every call, and bind costs tens of µs."""

    def __init__(self, signature):
        self.signature = signature
        params = list(signature.parameters.values())[1:]
        plain = [p for p in params if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
        self.var_keyword = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)
        self.simple = len(plain) + self.var_keyword == len(params)
        self.names = [p.name for p in plain]
        self.defaults = {p.name: p.default for p in plain if p.default is not inspect.Parameter.empty}

    def __call__(self, args, kwargs):
        if not self.simple or len(args) > len(self.names):
            return _flat_arguments(self.signature, args, kwargs)
        flat = dict(zip(self.names, args))
        for name in self.names[len(args):]:
            if name in kwargs:
                flat[name] = kwargs[name]
            elif name in self.defaults:
                flat[name] = self.defaults[name]
            else:
                return _flat_arguments(self.signature, args, kwargs)  # raises, naming the missing one
        extra = sorted(k for k in kwargs if k not in flat)
        if any(k in self.names[:len(args)] for k in kwargs) or (extra and not self.var_keyword):
            return _flat_arguments(self.signature, args, kwargs)
        if self.var_keyword:
            flat.update((k, kwargs[k]) for k in extra)
            flat[KEYWORDS] = tuple(extra)
        return flat


class FusedForward(ReplacedForward):
    """A module's forward replaced by rewritten fx graphs (one per training mode), for calls whose
    non-tensor arguments (and what the forward asked of its tensors: shapes, dtypes, devices) are
    those they were traced with. A call with other ones has its own graphs traced and rewritten by
    the patterns applied so far the first time it comes, up to MAX_SPECIALISATIONS; past that, and
    for calls like one that did not trace, the original forward runs (a RuntimeWarning says so)."""

    def __init__(self, module, path):
        self.module, self.path = module, path
        self.signature = inspect.signature(type(module).forward)
        self.binder = _Binder(self.signature)
        self.patterns = []  # (pattern, replacement, outputs), in the order they were applied
        self.kinds = set()  # (kind, submodule) pairs the patterns matched: a retrace matches these
        self.specialisations, self.failures = [], []
        self.warned = False
        self.read = None  # the items of its output tuple its callers read (None: all)

    @property
    def graphs(self):
        """The graphs of the call the module was first traced with."""
        return self.specialisations[0].graphs

    def specialise(self, flat):
        """Traces the forward for a call with these flat arguments (self.binder's), rewritten by
        the patterns applied so far, and keeps it; raises where it does not trace."""
        graphs, concrete, asked = trace(self.module, flat)
        state = _state_of(self.module) if asked & {"dtype", "device"} else None
        kept = _Specialisation(concrete, asked, flat, state, graphs)
        for graph in graphs.values():
            _unread_as_none(graph, self.read)
        ctx = _MatchedKinds(self.kinds)
        for source in self.patterns:
            pattern = _compiled_pattern(*source)
            for graph in graphs.values():
                pattern.rewrite(graph, ctx)
        self.specialisations.append(kept.compile_all())
        return kept

    def read_only(self, read):
        """Makes every graph return None for the items of its output tuple not in `read` (None: all
        are read), so a chain whose value only those took can be fused (a fused attention has no
        probabilities to return, as Hugging Face's SDPA attention returns None for them)."""
        if read is None:
            return
        self.read = read
        for s in self.specialisations:
            if any([_unread_as_none(g, read) for g in s.graphs.values()]):  # a list: every graph changes
                s.code = {}
                s.compile_all()

    def rewrite(self, patterns, ctx):
        """Applies the patterns to every graph kept; returns the places replaced in the first call's."""
        counts = [{training: sum(p.rewrite(g, ctx) for p in patterns) for training, g in s.graphs.items()}
                  for s in self.specialisations]
        replaced = counts[0].get(True, 0) or counts[0].get(False, 0)
        if replaced:
            self.patterns.extend((p.source, p.replacement, p.output_names) for p in patterns)
            self.kinds |= ctx.matched
            for s in self.specialisations:
                s.code = {}
                s.compile_all()
        return replaced

    @staticmethod
    def _graph_arguments(flat):
        """The values the graph takes, in order (_traceable_class's for a forward with **kwargs)."""
        return [v for k, v in flat.items() if k != KEYWORDS]

    def _fitting(self, flat, state):
        """The first specialisation made for calls like this one, or None. A loop, not next() over
        a generator, which torch.compile up to 2.7 cannot trace (a graph break per call)."""
        for s in self.specialisations:
            if s.fits(flat, state):
                return s
        return None

    def __call__(self, *args, **kwargs):
        m = self.module
        if _has_proxy(args) or _has_proxy(kwargs.values()):
            # called as self.child.forward(...) while its parent is traced: the parent's graph
            # takes the original code (a module call would have stayed a leaf)
            return type(m).forward(m, *args, **kwargs)
        flat, held = self.binder(args, kwargs), []

        def state():  # computed once, and only for a graph that asked dtypes or devices
            if not held:
                held.append(_state_of(m))
            return held[0]

        found = self._fitting(flat, state)
        if torch.compiler.is_compiling():
            # torch.compile traces the rewritten forward it finds made (an eager call made it), and
            # the original one otherwise: tracing and rewriting inside its trace would break it
            if found is None or m.training not in found.code:
                return type(m).forward(m, *args, **kwargs)
            return found.code[m.training](m, *self._graph_arguments(flat))
        if found is None:
            found = self._specialise_call(flat)
        if found is not None:
            return found.compiled(m.training)(m, *self._graph_arguments(flat))
        return type(m).forward(m, *args, **kwargs)

    def _specialise_call(self, flat):
        """The graphs for a call no specialisation fits, traced now; None to run the original."""
        key = _failure_key(flat)
        if any(len(key) == len(f) and all(k in f and _same(v, f[k]) for k, v in key.items()) for f in self.failures):
            return None
        if len(self.specialisations) >= MAX_SPECIALISATIONS or len(self.failures) >= MAX_SPECIALISATIONS:
            if not self.warned:
                self.warned = True
                warnings.warn(f"opfuse: {self.path or 'the model'} has been called with more than "
                              f"{MAX_SPECIALISATIONS} argument shapes or values; calls with new ones run its original, "
                              "unfused forward", RuntimeWarning)
            return None
        try:
            return self.specialise(flat)
        except Exception as e:  # tracing runs the user's code: any error means "does not trace"
            self.failures.append(key)
            warnings.warn(f"opfuse: {self.path or 'the model'} does not trace for this call, which runs its original "
                          f"forward: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", RuntimeWarning)
            return None

    def __deepcopy__(self, memo):
        twin = FusedForward.__new__(FusedForward)
        memo[id(self)] = twin
        twin.__dict__.update(self.__dict__)
        twin.module = copy.deepcopy(self.module, memo)
        twin.patterns, twin.kinds, twin.failures = list(self.patterns), set(self.kinds), list(self.failures)
        twin.specialisations = [s.with_graphs({k: copy.deepcopy(g, memo) for k, g in s.graphs.items()}).compile_all()
                                for s in self.specialisations]
        return twin

    def __getstate__(self):
        state = dict(self.__dict__)
        state["specialisations"] = [s.with_graphs(s.graphs) for s in self.specialisations]  # compiled code left out
        return state
