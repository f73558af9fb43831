"""fx patterns: a rule's {pattern, replacement} pair compiled to a small graph, matched against a
forward's graph and replaced."""

import ast
import builtins
import functools

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.proxy import GraphAppendingTracer, Proxy

from .. import functional
from .swap import set_submodule
from .kinds import FUSED_FORM, MODULE_KINDS
from .tracing import TENSOR_FACTORIES, _same, _torch_functions_as


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
                within, escaping = set(inner), {env[p] for p in self.outputs}
                used_outside = [t for t in inner if t is not anchor and not (
                    t in escaping and all(order[u] > order[anchor] for u in set(t.users) - within)
                    or set(t.users) <= within)]
                if not used_outside:
                    return anchor, env
                ctx.used_outside(used_outside[0], set(used_outside[0].users) - within)
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
        self.escape = None  # the first chain matched whose value is used outside it, described

    def _path(self, target):
        return f"{self.root_path}.{target}" if self.root_path else target

    def is_kind(self, kind, target):
        return MODULE_KINDS[kind](self.root.get_submodule(target), self.rules, self.calls, self._path(target))

    def used_outside(self, node, users):
        """Notes a chain matched but not replaced: `node`'s value is also used by `users` (the first
        such chain only: each find() meets it again)."""
        if self.escape is None:
            uses = sorted("returned by the forward" if u.op == "output" else f"used by {u.name}" for u in users)
            self.escape = f"{self.root_path or 'the model'}: the chain's {node.name} is also {' and '.join(uses)}"

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

    def used_outside(self, node, users):
        pass

    def use_fused_form(self, kind, target):
        pass


@functools.lru_cache(maxsize=None)
def _compiled_pattern(pattern, replacement, outputs):
    return FxPattern(pattern, replacement, outputs)
