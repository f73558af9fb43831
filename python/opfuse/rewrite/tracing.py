"""torch.fx tracing of one module with its submodules as leaves, each node also run on the recorded
call's values so the forward may ask shapes, dtypes and devices."""

import contextlib
import functools
import importlib
import inspect
import keyword
import operator
import threading
import types

import torch
import torch.fx as fx
from torch.fx.proxy import Proxy

from .. import nn as opfuse_nn
from .record import copy_model


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

    def __setitem__(self, index, value):
        # An assignment into a tensor (T5's _shift_right: `shifted[..., 1:] = ids[..., :-1]`), which
        # plain fx refuses, is a node of its own: fx keeps it as it keeps every in-place call, and
        # its value, the tensor changed, is what the graph's later reads of that tensor see.
        self.tracer.create_proxy("call_function", operator.setitem, (self, index, value), {})

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


class ReplacedForward:
    """A forward an instance holds in place of its class's (specialise.FusedForward)."""


def _without_fused_forward(module, args, kwargs):
    """module(*args, **kwargs), a FusedForward of its own bypassed: a value computed while its
    parent is traced needs no graph of its own (nor a retrace for new shapes)."""
    if isinstance(module.__dict__.get("forward"), ReplacedForward):
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
