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
import ast
import builtins
import contextlib
import copy
import functools
import importlib
import inspect
import itertools
import keyword
import threading
import types
import warnings

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.proxy import GraphAppendingTracer, Proxy

from . import functional, nn as opfuse_nn


# ---- copying a model ---------------------------------------------------------------------------

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
    children, the top-level ops its forward ran."""

    def __init__(self, args, kwargs, ops):
        self.args, self.kwargs, self.ops = args, kwargs, ops


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


# ---- module swaps -----------------------------------------------------------------------------

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


# ---- torch.fx: tracing one module with its submodules as leaves ------------------------------

class LeafTracer(fx.Tracer):
    def is_leaf_module(self, m, qualified_name):
        return True


def is_library_leaf(module):
    """torch's and opfuse's own modules without children: their forwards hold no user chain."""
    library = type(module).__module__.startswith(("torch.", "opfuse.")) or isinstance(module, opfuse_nn.Fused)
    return library and not any(True for _ in module.children())


def _untraceable_callee(error, forward):
    """The free function called from `forward` in which tracing failed, if it is a plain function
    of forward's module: it can be kept whole (autowrapped) instead."""
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is forward.__code__ and tb.tb_next is not None:
            name = tb.tb_next.tb_frame.f_code.co_name
            fn = forward.__globals__.get(name)
            if isinstance(fn, types.FunctionType) and not fn.__module__.startswith("torch"):
                return fn
        tb = tb.tb_next
    return None


class ValueProxy(Proxy):
    """A proxy that answers shape questions with the recorded call's numbers: x.size(), x.shape,
    x.dim(), x.ndim, len(x) and unpacking (`B, T, C = x.size()`, `q, k, v = y.split(n, 2)`), which
    plain fx cannot trace (and on Python 3.11, torch 1.13's fx cannot unpack at all), and x.dtype
    and x.device. A graph that asked is specialised to what it asked of the call's tensors."""

    def _value(self, aspect="shape"):
        value = self.tracer.values.get(self.node)
        if value is None:
            raise fx.proxy.TraceError(f"the value of {self.node.name} is unknown, so its {aspect} cannot be asked")
        self.tracer.asked.add(aspect)
        return value

    def size(self, *dim):
        return self._value().size(*dim)

    @property
    def shape(self):
        return self._value().shape

    def dim(self):
        return self._value().dim()

    @property
    def ndim(self):
        return self._value().dim()

    # dtype and device are answered where the value is a known tensor (Hugging Face's
    # torch.finfo(h.dtype), Meta's torch.full(..., device=tokens.device) need real ones); else they
    # stay values in the graph, as plain fx makes them.
    @property
    def dtype(self):
        return self._attribute("dtype")

    @property
    def device(self):
        return self._attribute("device")

    def _attribute(self, name):
        if isinstance(self.tracer.values.get(self.node), torch.Tensor):
            return getattr(self._value(name), name)
        return self.__getattr__(name)

    def __len__(self):
        return len(self._value())

    def __iter__(self):
        return iter([self[i] for i in range(len(self._value()))])


# torch's functions that make a tensor from numbers alone (ValueTracer._factory)
TENSOR_FACTORIES = ("arange", "as_tensor", "empty", "eye", "full", "linspace", "logspace", "ones", "rand", "randint",
                    "randn", "randperm", "tensor", "zeros")


_TORCH_SWAPPED = threading.RLock()  # held while torch's functions are swapped: one tracer at a time


@contextlib.contextmanager
def _torch_functions_as(wrap, names=TENSOR_FACTORIES):
    """torch's functions of these names replaced by wrap(fn) meanwhile (process-wide, so traces in
    two threads take turns rather than save each other's wrappers as the originals)."""
    with _TORCH_SWAPPED:
        originals = {name: getattr(torch, name) for name in names}
        for name, fn in originals.items():
            setattr(torch, name, wrap(fn))
        try:
            yield
        finally:
            for name, fn in originals.items():
                setattr(torch, name, fn)


@functools.lru_cache(maxsize=None)
def _class_at(path):
    module, _, name = path.partition(":")
    value = importlib.import_module(module)
    for part in name.split("."):
        value = getattr(value, part)
    return value


def _rebuilt(path, **fields):
    """The mapping class at `path` ("module:Qualified.Name") made from its fields, as a traced
    forward returned it."""
    return _class_at(path)(**fields)


class ValueTracer(LeafTracer):
    """Traces a module with its recorded call's values beside the proxies: each node is also run,
    on a copy of the module (so running it changes nothing; the random state is restored after),
    and shape, dtype and device questions get answers. A graph that asked is specialised to the
    call's tensor shapes, dtypes and devices."""

    proxy_buffer_attributes = True  # self.bias[:, :, :T, :T] stays a graph node, not a constant

    def __init__(self, copy_of_root, inputs, **kwargs):
        super().__init__(**kwargs)
        self.copy_of_root, self.inputs, self.values, self.asked = copy_of_root, inputs, {}, set()
        self.running = False  # computing a value: module calls and attributes are the real ones

    def proxy(self, node):
        return ValueProxy(node, self)

    def trace(self, root, concrete_args=None):
        with _torch_functions_as(self._factory):
            return super().trace(root, concrete_args)

    def _factory(self, fn):
        """fn as a graph node even when every argument is known (the shape and dtype answered):
        plain fx would run it once and keep the tensor as a constant, a random mask drawn once."""

        @functools.wraps(fn)
        def factory(*args, **kwargs):
            return fn(*args, **kwargs) if self.running else self.create_proxy("call_function", fn, args, kwargs)

        return factory

    def create_arg(self, a):
        # A dict subclass (Hugging Face's ModelOutput, an OrderedDict) would become a plain dict,
        # and the rewritten forward would return what the original did not ("'dict' object has no
        # attribute 'loss'"): a node rebuilds it, its class named by its import path.
        if isinstance(a, dict) and type(a) is not dict and all(isinstance(k, str) for k in a):
            cls = type(a)
            return self.create_node("call_function", _rebuilt, (f"{cls.__module__}:{cls.__qualname__}",),
                                    {k: self.create_arg(v) for k, v in a.items()})
        return super().create_arg(a)

    def call_module(self, m, forward, args, kwargs):
        if self.running:
            return forward(*args, **kwargs)
        try:
            self.path_of_module(m)
        except NameError:  # a module made in the forward (4.36's `loss_fct = CrossEntropyLoss()`): traced through
            return forward(*args, **kwargs)
        return super().call_module(m, forward, args, kwargs)

    def getattr(self, attr, attr_val, parameter_proxy_cache):
        return attr_val if self.running else super().getattr(attr, attr_val, parameter_proxy_cache)

    def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None, proxy_factory_fn=None):
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
        if isinstance(proxy, Proxy):
            try:
                self.values[proxy.node] = self._run(kind, target, args, kwargs)
            except Exception:  # an op that fails on its own: its value stays unknown
                self.values[proxy.node] = None
        return proxy

    def _run(self, kind, target, args, kwargs):
        args, kwargs = fx.node.map_aggregate((args, kwargs), self._value_of)
        if kind == "placeholder":
            return self.inputs.get(target, self.inputs.get(target.rpartition("_")[0]))
        if kind == "get_attr":
            value = self.copy_of_root
            for part in target.split("."):
                value = getattr(value, part)
            return value
        self.running = True
        try:
            with torch.no_grad():
                if kind == "call_function":
                    return target(*args, **kwargs)
                if kind == "call_method":
                    return getattr(args[0], target)(*args[1:], **kwargs)
                if kind == "call_module":
                    return _without_fused_forward(self.copy_of_root.get_submodule(target), args, kwargs)
            return None
        finally:
            self.running = False

    def _value_of(self, a):
        return self.values.get(a.node) if isinstance(a, Proxy) else a


def _without_fused_forward(module, args, kwargs):
    """module(*args, **kwargs), a FusedForward of its own bypassed: a value computed while its
    parent is traced needs no graph of its own (nor a retrace for new shapes)."""
    if isinstance(module.__dict__.get("forward"), FusedForward):
        return type(module).forward(module, *args, **kwargs)
    return module(*args, **kwargs)


# The flat arguments' entry naming the keys a call passed through **kwargs (sorted): a graph is
# traced for, and runs, calls with those keys only.
KEYWORDS = "**"


def _flat_arguments(signature, args, kwargs):
    """A call's arguments by parameter name (defaults applied, `self` left out), those passed
    through **kwargs by their own keys after them, sorted, and under KEYWORDS those keys."""
    bound = signature.bind(None, *args, **kwargs)
    bound.apply_defaults()
    flat = {}
    for name, value in list(bound.arguments.items())[1:]:
        if signature.parameters[name].kind == inspect.Parameter.VAR_KEYWORD:
            flat.update((k, value[k]) for k in sorted(value))
            flat[KEYWORDS] = tuple(sorted(value))
        else:
            flat[name] = value
    return flat


def _split_arguments(signature, flat):
    """(concrete, inputs) of a call of a forward, given its flat arguments: the arguments that are
    not tensors (held at their values in a graph) and the values fx traces with, tensors cloned;
    raises for a call fx cannot take."""
    concrete, inputs = {}, {}
    for name, value in flat.items():
        parameter = signature.parameters.get(name)
        if name == KEYWORDS:
            concrete[name] = value
            continue
        if parameter is not None and parameter.kind == inspect.Parameter.VAR_POSITIONAL:
            raise TypeError(f"forward takes *{name}")
        if _is_tensor_tuple(value):  # Hugging Face's position_embeddings=(cos, sin)
            inputs[name] = type(value)(t.detach().clone() for t in value)
            continue
        if not isinstance(value, torch.Tensor):
            if isinstance(value, (list, tuple, dict)) and _holds_tensor(value):
                raise TypeError(f"argument '{name}' is a container of tensors")
            if not _holdable(value):
                # tracing would run the forward on proxies, in the caller's own object (a KV cache)
                raise TypeError(f"argument '{name}' is a {type(value).__name__}, which a graph cannot hold fixed")
            concrete[name] = value
        inputs[name] = value.detach().clone() if isinstance(value, torch.Tensor) else value
    return concrete, inputs


def trace(module, flat):
    """({training: fx.Graph}, concrete, asked) for the module's own forward called with these flat
    arguments (_flat_arguments), or raises with the reason it does not trace. Arguments that are not tensors are held
    at their values (concrete); asked: what of the tensors the graphs also hold ("shape", "dtype",
    "device"), because the forward asked it."""
    forward = type(module).forward
    signature = inspect.signature(forward)
    concrete, inputs = _split_arguments(signature, flat)
    graphs, wrapped, was, asked, constants = {}, [], module.training, set(), {}
    attributes, cls = _attributes_of(module), type(module)
    fx_concrete = {k: v for k, v in concrete.items() if k != KEYWORDS}  # the graph's arguments held at their values
    module.__class__ = _traceable_class(cls, signature, concrete.get(KEYWORDS, ()))
    try:
        for training in (True, False):
            module.training = training
            for _ in range(8):
                try:
                    with torch.random.fork_rng(devices=[]):
                        copy_of_module = copy_model(module)
                        copy_of_module.train(training)
                        tracer = ValueTracer(copy_of_module, dict(inputs), autowrap_functions=tuple(wrapped))
                        try:
                            graphs[training] = tracer.trace(module, concrete_args=dict(fx_concrete))
                            assigned, found = _changes(attributes)
                            constants.update(found)
                        finally:
                            _restore_attributes(attributes)
                            _set_constants(module, constants)
                        if assigned:
                            raise TypeError(f"forward assigns self.{assigned[0]}, which the rewritten graph would "
                                            "not repeat")
                    asked |= tracer.asked | _baked(graphs[training])
                    break
                except Exception as e:  # tracing runs the user's code: any error means "does not trace"
                    fn = _untraceable_callee(e, forward)
                    if fn is None or fn in wrapped:
                        raise
                    wrapped.append(fn)
    finally:
        module.training = was
        module.__class__ = cls
    return graphs, concrete, frozenset(asked)


def _baked(graph):
    """"dtype" and "device" where the graph holds one as a constant: read from the module's own
    state (Hugging Face's `self.dtype`, next(self.parameters()).dtype), which tracing cannot see
    being asked, such a graph is another one when the parameters' dtypes or devices change."""
    held = set()

    def note(value):
        if isinstance(value, torch.dtype):
            held.add("dtype")
        elif isinstance(value, torch.device):
            held.add("device")
        return value

    for node in graph.nodes:
        fx.node.map_aggregate((node.args, node.kwargs), note)
    return held


def _traceable_class(cls, signature, keys):
    """cls, or for a forward that takes **kwargs a subclass whose forward takes the same
    parameters but that one, then the call's **kwargs keys as parameters of their own, and calls
    cls's with them: torch 1.13's fx rebuilds a code object for a *args/**kwargs (or keyword-only)
    forward in a way Python 3.11 refuses ("code() argument 13 must be str")."""
    kept = [p for p in signature.parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD]
    if len(kept) == len(signature.parameters):
        return cls
    has_default = [p.default is not inspect.Parameter.empty for p in kept]
    if (any(p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL) for p in kept)
            or has_default != sorted(has_default)):
        raise TypeError("forward takes **kwargs beside positional-only, * or out-of-order default parameters")
    self_name, names = kept[0].name, [p.name for p in kept[1:]]
    odd = [k for k in keys if not k.isidentifier() or keyword.iskeyword(k) or k in ("original", self_name)]
    if odd:
        raise TypeError(f"forward is called with **kwargs key {odd[0]!r}, which cannot be a parameter")
    scope = {"original": cls.forward}
    call = ", ".join([self_name] + [f"{n}={n}" for n in names + list(keys)])
    exec(f"def forward({', '.join([self_name] + names + list(keys))}):\n    return original({call})\n", scope)
    forward = scope["forward"]
    defaults = [p.default for p in kept if p.default is not inspect.Parameter.empty] + [None] * len(keys)
    forward.__defaults__ = tuple(defaults) or None
    return type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__})


def _is_tensor_tuple(value):
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(v, torch.Tensor) for v in value)


def _attributes_of(module):
    """What each submodule holds, to put back after tracing: fx runs forward on the module itself,
    so a forward that assigns (Meta's `self.freqs_cis = self.freqs_cis.to(h.device)`) would leave
    a proxy there."""
    return [(m, dict(m.__dict__), dict(m._parameters), dict(m._buffers), dict(m._modules))
            for m in module.modules()]


def _changes(attributes):
    """(assigned, constants) after a trace: the names a forward assigned to its module or its
    submodules (fx records no assignment: the graph would not repeat it), and the tensors fx put
    on the root as _tensor_constantN for the graph to read (built outside the graph: GPT-J's
    torch.sqrt(torch.tensor(head_dim)))."""
    root, held = attributes[0][0], attributes[0][1]
    constants = {k: v for k, v in root.__dict__.items() if k.startswith("_tensor_constant") and k not in held}
    assigned = []
    for m, *before in attributes:
        for now, was in zip((m.__dict__, m._parameters, m._buffers, m._modules), before):
            assigned += [k for k, v in now.items()
                         if k != "training" and not (m is root and k in constants) and (k not in was or was[k] is not v)]
    return assigned, constants


def _set_constants(module, constants):
    for name, value in constants.items():
        object.__setattr__(module, name, value)


def _restore_attributes(attributes):
    for m, held, parameters, buffers, modules in attributes:
        m.__dict__.clear()
        m.__dict__.update(held)
        for now, before in ((m._parameters, parameters), (m._buffers, buffers), (m._modules, modules)):
            now.clear()
            now.update(before)


_HOLDABLE = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.layout,
             torch.memory_format, type(Ellipsis), slice, types.FunctionType, types.BuiltinFunctionType)


def _holdable(value):
    """A value a graph may hold fixed and compare calls' values with: a number, a string, a
    dtype … or a list, tuple or dict of such; not an object a forward may change (a cache)."""
    if isinstance(value, (list, tuple)):
        return all(_holdable(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _holdable(v) for k, v in value.items())
    return isinstance(value, _HOLDABLE)


def _holds_tensor(value):
    items = value.values() if isinstance(value, dict) else value
    return any(isinstance(v, torch.Tensor) for v in items)


def _same(a, b):
    if a is b:
        return True
    try:
        return bool(type(a) is type(b) and a == b)
    except Exception:
        return False


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


class FusedForward:
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
        ctx = _MatchedKinds(self.kinds)
        for source in self.patterns:
            pattern = _compiled_pattern(*source)
            for graph in graphs.values():
                pattern.rewrite(graph, ctx)
        self.specialisations.append(kept.compile_all())
        return kept

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

        found = next((s for s in self.specialisations if s.fits(flat, state)), None)
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


# ---- patterns ---------------------------------------------------------------------------------

def _computes_rule(name, module, rules, calls, path):
    """Whether the module's whole recorded forward is the chain of the rule of that name."""
    rule = next((r for r in rules if r.name == name), None)
    return rule is not None and computes(rule, path, module, calls)


def _computes_lone(op, module, calls, path):
    """Whether the module's recorded forward is that one op and nothing else, with no submodules
    (Hugging Face's activation classes: SiLUActivation, GELUTanh)."""
    call = calls.get(path)
    return call is not None and call.ops == [op] and not any(True for _ in module.children())


def _is_silu_module(module, rules, calls, path):
    return (isinstance(module, (torch.nn.SiLU, opfuse_nn.SiLU)) or _computes_lone("aten::silu", module, calls, path)
            or _computes_rule("silu", module, rules, calls, path))


def _is_gelu_tanh_module(module, rules, calls, path):
    """nn.GELU(approximate='tanh'), a module computing the gelu_tanh rule's written-out chain
    (T5's NewGELUActivation), or one whose forward is a lone gelu (Hugging Face's GELUTanh: which
    gelu it is, verification tells)."""
    if isinstance(module, torch.nn.GELU):
        return module.approximate == "tanh"
    return _computes_lone("aten::gelu", module, calls, path) or _computes_rule("gelu_tanh", module, rules, calls, path)


def _fused_rms_norm(module, rules, calls, path):
    """The module as an opfuse.nn.RMSNorm (itself, or built from it when it computes the rms_norm
    rule's chain and has a weight and an eps), or None."""
    if isinstance(module, opfuse_nn.RMSNorm):
        return module
    if not _computes_rule("rms_norm", module, rules, calls, path) or opfuse_nn.RMSNorm.cannot_take(module):
        return None
    return opfuse_nn.RMSNorm.from_module(module, calls[path].ops)


# Submodule kinds a pattern may name: a call of a submodule of that kind.
MODULE_KINDS = {
    "batch_norm": lambda module, rules, calls, path: isinstance(module, torch.nn.modules.batchnorm._BatchNorm),
    "silu_module": _is_silu_module,
    "gelu_tanh_module": _is_gelu_tanh_module,
    "dropout_module": lambda module, rules, calls, path: isinstance(module, torch.nn.Dropout),
    "rms_norm_module": lambda module, rules, calls, path: _fused_rms_norm(module, rules, calls, path) is not None,
    "cross_entropy_module": lambda module, rules, calls, path: (isinstance(module, torch.nn.CrossEntropyLoss) and
                                                                type(module).forward is torch.nn.CrossEntropyLoss.forward),
}

# Kinds whose submodule the replacement takes in its fused form: it is put in place of the user's
# before the replacement is built (the replacement reads its weight and eps).
FUSED_FORM = {"rms_norm_module": _fused_rms_norm}

COMMUTATIVE = {"mul", "add"}
ALIASES = {"truediv": "div", "__mul__": "mul", "__add__": "add", "__truediv__": "div"}


def op_name(node):
    if node.op == "call_function":
        name = getattr(node.target, "__name__", str(node.target))
    elif node.op == "call_method":
        name = node.target
    else:
        return None
    return ALIASES.get(name, name)


class _PatternTracer(fx.Tracer):
    """A pattern's factory call (NeoX's torch.zeros(n, T, S, dtype=…, device=…) scores) is a node
    whose arguments are placeholders, as the forward's own factory calls are (ValueTracer); so is a
    call whose number argument is one (its baddbmm's alpha=s), which torch would refuse as a Proxy."""

    def trace(self, root, concrete_args=None):
        def node_of(fn):
            return functools.wraps(fn)(lambda *args, **kwargs: self.create_proxy("call_function", fn, args, kwargs))

        with _torch_functions_as(node_of, TENSOR_FACTORIES + ("baddbmm",)):
            return super().trace(root, concrete_args)


def _kind_call(kind):
    def call(*args):
        return args[0].tracer.create_proxy("call_module", kind, args, {})
    return call


class FxPattern:
    """One {pattern, replacement} pair of a rule, compiled: the pattern as a small fx graph.

    `outputs` names values of the pattern (bound with `h := expr`) that the forward may use
    elsewhere too, as add_rms_norm's sum h = x + r is the block's residual: the replacement then
    returns a tuple, the pattern's value first and these after it, in order."""

    def __init__(self, pattern, replacement, outputs=()):
        self.source, self.replacement, self.output_names = pattern, replacement, tuple(outputs)
        namespace = self._namespace()
        tree = ast.parse(pattern, mode="eval")
        # `u := expr` names a value the pattern uses more than once (the pairs of x.unbind(-1)):
        # one node of the pattern's graph, so it must match one node of the forward's.
        named = {node.target.id for node in ast.walk(tree) if isinstance(node, ast.NamedExpr)}
        missing = [n for n in outputs if n not in named]
        if missing:
            raise ValueError(f"fx pattern {pattern!r}: output {missing[0]!r} is not named in it with :=")
        nodes_named = {}
        for node in ast.walk(tree):  # (h := expr) becomes (h := _named("h", expr)), to find h's node
            if isinstance(node, ast.NamedExpr) and node.target.id in outputs:
                node.value = ast.Call(ast.Name("_named", ast.Load()), [ast.Constant(node.target.id), node.value], [])
        ast.fix_missing_locations(tree)
        names = []
        for node in ast.walk(tree):
            if (isinstance(node, ast.Name) and node.id not in namespace and node.id not in names
                    and node.id not in named and not hasattr(builtins, node.id)):
                names.append(node.id)
        self.placeholders = names

        def record(name, value):
            nodes_named[name] = value.node
            return value

        scope = dict(namespace, _named=record, **{k: _kind_call(k) for k in MODULE_KINDS})
        fn = eval(f"lambda {', '.join(names)}: {ast.unparse(tree)}", scope)
        self.graph = _PatternTracer().trace(fn)
        self.output = next(n for n in self.graph.nodes if n.op == "output").args[0]
        self.outputs = [nodes_named[n] for n in outputs]

    @staticmethod
    def _namespace():
        return {"torch": torch, "F": F, "opfuse": functional, "_named": None, **{k: None for k in MODULE_KINDS}}

    # Matching: the pattern's output node anchored on a graph node, arguments matched backwards.
    # A placeholder binds a value node, or a constant the forward computed while it was traced:
    # a number or shape (llama2.c's `/ math.sqrt(self.head_dim)`, its `reshape(xq.shape[:-1] +
    # (-1, 2))`), a flag (`training=self.training`), a dtype (`.to(query_states.dtype)`), a
    # device (`device=key.device`), a string (`reduction="sum"`) or None (`weight=None`).
    def _match(self, p, t, env, ctx):
        if p.op == "placeholder" and _is_constant(t):
            if p not in env:
                yield {**env, p: t}
            elif _same(env[p], t):
                yield env
            return
        if not isinstance(t, fx.Node):
            return
        if p.op == "placeholder":
            if p in env:
                if env[p] is t:
                    yield env
            elif t not in env.values():
                yield {**env, p: t}
            return
        if p in env:  # a named value met again: the node it matched the first time
            if env[p] is t:
                yield env
            return
        if t in env.values() or len(p.args) != len(t.args) or set(p.kwargs) != set(t.kwargs):
            return
        if p.op == "call_module":
            if t.op != "call_module" or not ctx.is_kind(p.target, t.target):
                return
        elif op_name(p) is None or op_name(p) != op_name(t):
            return
        orders = [p.args]
        if op_name(p) in COMMUTATIVE and len(p.args) == 2:
            orders.append(p.args[::-1])
        keywords = [(p.kwargs[k], t.kwargs[k]) for k in sorted(p.kwargs)]  # F.dropout(x, p=dp, training=tr)
        for args in orders:
            yield from self._match_args(list(zip(args, t.args)) + keywords, {**env, p: t}, ctx)

    def _match_args(self, pairs, env, ctx):
        if not pairs:
            yield env
            return
        (pa, ta), rest = pairs[0], pairs[1:]
        if isinstance(pa, fx.Node):
            for e in self._match(pa, ta, env, ctx):
                yield from self._match_args(rest, e, ctx)
        elif type(pa) is type(ta) and isinstance(pa, (list, tuple)) and len(pa) == len(ta):
            # torch.cat((-x2, x1)), torch.stack([a, b]), x[..., :h]: the items matched in place
            yield from self._match_args(list(zip(pa, ta)) + rest, env, ctx)
        elif isinstance(pa, slice) and isinstance(ta, slice):
            yield from self._match_args([(pa.start, ta.start), (pa.stop, ta.stop), (pa.step, ta.step)] + rest, env, ctx)
        elif _same(pa, ta):
            yield from self._match_args(rest, env, ctx)

    def find(self, graph, ctx):
        """The first match in the graph whose inner values are used nowhere else (an output only
        after the anchor, where the replacement's value is ready), or None."""
        order = {n: i for i, n in enumerate(graph.nodes)}
        for anchor in graph.nodes:
            for env in self._match(self.output, anchor, {}, ctx):
                inner = [t for p, t in env.items() if p.op != "placeholder"]
                escaping = {env[p] for p in self.outputs}
                if all(t in escaping and all(order[u] > order[anchor] for u in set(t.users) - set(inner))
                       or set(t.users) <= set(inner) for t in inner if t is not anchor):
                    return anchor, env
        return None

    def replace(self, graph, anchor, env, ctx):
        tracer = GraphAppendingTracer(graph)
        scope = {"torch": torch, "F": F, "opfuse": _LeafCalls(tracer)}
        for p, t in env.items():
            if p.op == "placeholder":
                scope[p.name] = Proxy(t, tracer) if isinstance(t, fx.Node) else t
        with graph.inserting_before(anchor):
            for p, t in env.items():
                if p.op == "call_module":
                    ctx.use_fused_form(p.target, t.target)
                    scope[p.target] = Proxy(graph.get_attr(t.target), tracer)
            result = eval(self.replacement, scope)
            values = [result[i] for i in range(1 + len(self.outputs))] if self.outputs else [result]
        anchor.replace_all_uses_with(values[0].node)
        for p, value in zip(self.outputs, values[1:]):
            env[p].replace_all_uses_with(value.node)
        order = {n: i for i, n in enumerate(graph.nodes)}
        for t in sorted((t for p, t in env.items() if p.op != "placeholder"), key=order.get, reverse=True):
            graph.erase_node(t)

    def rewrite(self, graph, ctx):
        """Replaces every match; returns how many."""
        count = 0
        while (found := self.find(graph, ctx)) is not None:
            self.replace(graph, *found, ctx)
            count += 1
        if count:
            graph.lint()
        return count


def _is_constant(value):
    if isinstance(value, (list, tuple)):
        return all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    return value is None or isinstance(value, (int, float, bool, str, torch.dtype, torch.device))


class _LeafCalls:
    """opfuse.functional as seen by a replacement: each call becomes one graph node."""

    def __init__(self, tracer):
        self.tracer = tracer

    def __getattr__(self, name):
        fn = getattr(functional, name)
        return lambda *args: self.tracer.create_proxy("call_function", fn, args, {})


class _MatchContext:
    """What a pattern's submodule kinds are checked against: the module being rewritten. Remembers
    the (kind, submodule) pairs replaced, which a retrace of the forward matches again."""

    def __init__(self, root, root_path, rules, calls):
        self.root, self.root_path, self.rules, self.calls = root, root_path, rules, calls
        self.matched = set()

    def _path(self, target):
        return f"{self.root_path}.{target}" if self.root_path else target

    def is_kind(self, kind, target):
        return MODULE_KINDS[kind](self.root.get_submodule(target), self.rules, self.calls, self._path(target))

    def use_fused_form(self, kind, target):
        self.matched.add((kind, target))
        if kind in FUSED_FORM:
            fused = FUSED_FORM[kind](self.root.get_submodule(target), self.rules, self.calls, self._path(target))
            set_submodule(self.root, target, fused)


class _MatchedKinds:
    """The context of a retrace (FusedForward.specialise): a submodule is of a kind where the first
    trace's rewrite found it so, and is already in its fused form."""

    def __init__(self, matched):
        self.matched = matched

    def is_kind(self, kind, target):
        return (kind, target) in self.matched

    def use_fused_form(self, kind, target):
        pass


@functools.lru_cache(maxsize=None)
def _compiled_pattern(pattern, replacement, outputs):
    return FxPattern(pattern, replacement, outputs)


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
