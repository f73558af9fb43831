"""A Python model as a tune Workload: the C++ loop clones, steps, probes and rewrites it through
these methods."""
import contextlib
import time

import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from . import optim, rewrite


def default_optimizer(params):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def flatten_tensors(value):
    """The tensors of a forward's output (a tensor, or tuples, lists and dicts of them), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flatten_tensors(v)]
    return []


def _nudged(t, nudge, gen):
    """t scaled element by element by (1 + nudge · noise): a rounding-sized change of it."""
    return t * (1 + nudge * torch.randn(t.shape, generator=gen, dtype=t.dtype))


def _cast(model, dtype):
    """model.to(dtype), but a complex parameter or buffer (Meta's freqs_cis table) becomes the
    complex type of dtype's precision, where Module.to would keep only its real part: a probe must
    run the model's own arithmetic."""
    complex_dtype = torch.complex128 if dtype == torch.float64 else torch.complex64
    return model._apply(lambda t: t.to(complex_dtype) if t.is_complex()
                        else t.to(dtype) if t.is_floating_point() else t)


class _KeepsFloat64(TorchFunctionMode):
    """torch as the float64 probe runs it: a cast of a float64 tensor to float32 (`.float()`,
    `.to(torch.float32)`, `.type(…)`, `.type_as(…)`) and a softmax asked to compute in float32
    keep float64. Models upcast to float32 for their numerics (Hugging Face's loss takes
    `logits.float()`, GPT-J's attention `query.to(torch.float32)`); in the float64 probe that
    upcast is a downcast, and the check of a rewrite's mathematics became a float32 computation
    judged against float64's allowance (every such rewrite rejected). The float32 probe runs the
    model exactly as written."""

    CASTS = {torch.Tensor.float, torch.Tensor.to, torch.Tensor.type, torch.Tensor.type_as}
    SOFTMAX = {F.softmax, F.log_softmax, torch.softmax, torch.log_softmax, torch.Tensor.softmax,
               torch.Tensor.log_softmax}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        first = args[0] if args else None
        wide = isinstance(first, torch.Tensor) and first.dtype == torch.float64
        if wide and func in self.SOFTMAX:
            args = tuple(None if a is torch.float32 else a for a in args)
            kwargs = {k: None if v is torch.float32 else v for k, v in kwargs.items()}
        out = func(*args, **kwargs)
        if (wide and func in self.CASTS and isinstance(out, torch.Tensor) and out.dtype == torch.float32
                and out.device == first.device and not kwargs.get("copy", False)):
            return first
        return out


class _PassesDropout(TorchFunctionMode):
    """torch as every probe runs it: nothing dropped. Dropout modules are set to eval, but
    F.dropout(p=…, training=self.training) (Hugging Face's eager attention, T5's) cannot be switched
    off from outside, nor can the mask an attention op draws for the dropout_p it was given
    (opfuse's, torch's SDPA): these pass through here, so the two models agree on the mathematics
    alone. (Dropout inside another torch function, nn.MultiheadAttention's, still draws: the same
    draws in both models.)"""

    DROPOUTS = {getattr(F, name) for name in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                                              "feature_alpha_dropout") if hasattr(F, name)} | {torch.dropout}
    # attention ops with the place of their dropout_p among the positional arguments
    ATTENTION_P = {torch.ops.opfuse.attention: 6, torch.ops.opfuse.attention.default: 6,
                   **({F.scaled_dot_product_attention: 4} if hasattr(F, "scaled_dot_product_attention") else {})}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.DROPOUTS:
            return args[0] if args else kwargs["input"]
        at = self.ATTENTION_P.get(func)
        if at is not None:
            if len(args) > at:
                args = args[:at] + (0.0,) + args[at + 1:]
            if "dropout_p" in kwargs:
                kwargs = dict(kwargs, dropout_p=0.0)
        return func(*args, **kwargs)


def make(native):
    """The Workload class over this process's opfuse._C."""

    class PythonWorkload(native.Workload):
        """ranks: the torch.distributed ranks training together (opfuse.distributed.Ranks) with
        ddp_settings for the DistributedDataParallel each step runs through; None alone."""

        def __init__(self, model, inputs, loss_fn, optimizer, rules, calls=None, applied=(), not_traced=None,
                     ranks=None, ddp_settings=None, samples=None, compiled=False):
            native.Workload.__init__(self)
            self.model, self.inputs, self.loss_fn = model, tuple(inputs), loss_fn
            self.optimizer_factory = optimizer or default_optimizer
            self.optimizer = self.optimizer_factory(self.model.parameters())
            self.rules = rules
            self.calls = calls if calls is not None else rewrite.record_calls(model, self.inputs, native)
            self.applied = list(applied)
            self.not_traced = not_traced if not_traced is not None else {}
            self.unchanged = ""  # why the last rewrite applied changed nothing, where more is known
            self._hooks = []
            self.group, self.ddp_settings, self._ddp = ranks, ddp_settings, None
            self.samples = samples if samples is not None else self._local_samples()
            # compiled: its timed steps run under torch.compile (set_measuring), compiled once
            # per state of the model
            self.compiled, self._measuring, self._compiled_model = compiled, False, None

        def name(self):
            return type(self.model).__name__

        def describe(self):
            return ", ".join(self.applied) if self.applied else "as written"

        def _first_input(self):
            return next((x for x in self.inputs if isinstance(x, torch.Tensor) and x.dim() > 0), None)

        def _local_samples(self):
            first = self._first_input()
            return int(first.shape[0]) if first is not None else 1

        def held_memory(self):
            """Bytes the model holds on the CPU between steps, by what, each storage counted once:
            what a profile's allocations cannot show, as it was allocated before the profile.
            Gradients are left out: the step drops them first."""
            seen, held = set(), {}

            def count(what, tensors):
                for t in tensors:
                    if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.numel() == 0:
                        continue
                    storage = t.untyped_storage()
                    if storage.data_ptr() in seen:
                        continue
                    seen.add(storage.data_ptr())
                    held[what] = held.get(what, 0) + storage.nbytes()

            params = list(self.model.parameters())
            count("parameters", params)
            count("parameters", self.model.buffers())
            count("optimizer state", (v for state in self.optimizer.state.values() for v in state.values()))
            count("inputs", self.inputs)
            return held

        def samples_per_step(self):
            """Among ranks, all of theirs (what tune hands in as samples)."""
            return self.samples

        def sample_unit(self):
            """[N, C, H, W] floats are images; [N, T] integers (token ids) are sequences."""
            x = self._first_input()
            if x is not None and x.dim() == 4 and x.is_floating_point():
                return "images"
            if x is not None and x.dim() == 2 and not x.is_floating_point():
                return "sequences"
            return "samples"

        def clone(self):
            return PythonWorkload(rewrite.copy_model(self.model), self.inputs, self.loss_fn, self.optimizer_factory,
                                  self.rules, self.calls, self.applied, self.not_traced, self.group,
                                  self.ddp_settings, self.samples, self.compiled)

        def rank(self):
            return self.group.rank if self.group else 0

        def ranks(self):
            return self.group.size if self.group else 1

        def gather(self, mine):
            return self.group.gather(mine) if self.group else [mine]

        def _trained(self):
            """What a step runs: among ranks, the model inside DistributedDataParallel, wrapped at
            the first step after the last rewrite (every rank wraps the same patched module)."""
            if self.group is None:
                return self.model
            if self._ddp is None:
                self._ddp = self.group.wrap(self.model, self.ddp_settings)
            return self._ddp

        def set_measuring(self, on):
            self._measuring = on

        def _stepped(self):
            """What a step runs: under torch.compile while a compiled workload's steps are timed."""
            if not (self.compiled and self._measuring):
                return self._trained()
            if self._compiled_model is None:
                self._compiled_model = torch.compile(self._trained())
            return self._compiled_model

        def step(self):
            trained = self._stepped()
            start = time.perf_counter()
            self.optimizer.zero_grad(set_to_none=True)
            self.loss_fn(trained(*self.inputs)).backward()
            self.optimizer.step()  # torch's profiler scope "Optimizer.step#SGD.step" comes with it
            return (time.perf_counter() - start) * 1000

        def probe(self, dtype, seed, nudge):
            model = _cast(self.model, dtype)
            model.train()
            # Dropout modules pass through (and F.dropout, _PassesDropout): a fused op draws its own
            # mask (attention's is never stored), so two models agree on the mathematics only with
            # nothing dropped.
            for m in model.modules():
                if isinstance(m, torch.nn.modules.dropout._DropoutNd):
                    m.eval()
            inputs = [self._input(x, dtype, seed, nudge) for x in self.inputs]
            try:
                out = self._forward_backward(model, inputs, seed, dtype == torch.float64)
            except Exception:  # code that mixes its float32 casts with float32 tensors it made: as written
                if dtype != torch.float64:
                    raise
                out = self._forward_backward(model, inputs, seed, False)
            grads = [(n, p.grad) for n, p in model.named_parameters()]
            return [t.detach() for t in flatten_tensors(out)], grads, self._updates(model, seed, nudge)

        def _forward_backward(self, model, inputs, seed, keep_float64):
            for p in model.parameters():
                p.grad = None
            torch.manual_seed(seed)
            with _PassesDropout(), _KeepsFloat64() if keep_float64 else contextlib.nullcontext():
                out = model(*inputs)
                self.loss_fn(out).backward()
            return out

        def _updates(self, model, seed, nudge):
            """What two steps of a fresh optimizer do to each parameter, from gradients drawn from
            `seed` (the same in both models): a rewrite of the optimizer is verified on these
            alone, whatever a model rewrite did to the computed gradients. Two steps, so the
            moments' decay and the bias corrections take part, not only step one's g/|g|. The
            nudged probe nudges the parameters too: an update read as p_after − p_before carries
            p's own rounding (a LayerNorm weight of 1 rounds a 1e-4 step to 1e-3 of itself)."""
            named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
            if nudge > 0:
                gen = torch.Generator().manual_seed(seed + 3)
                with torch.no_grad():
                    for _, p in named:
                        p.copy_(_nudged(p, nudge, gen))
            before = [p.detach().clone() for _, p in named]
            optimizer = self.optimizer_factory([p for _, p in named])
            gen = torch.Generator().manual_seed(seed + 2)
            for _ in range(2):
                for _, p in named:
                    p.grad = _gradient_like(p, torch.randn(p.shape, generator=gen, dtype=torch.float64))
                optimizer.step()
            return [(n, p.detach() - b) for (n, p), b in zip(named, before)]

        @staticmethod
        def _input(x, dtype, seed, nudge):
            if not isinstance(x, torch.Tensor) or not x.is_floating_point():
                return x
            x = x.to(dtype)
            if nudge > 0:
                x = _nudged(x, nudge, torch.Generator().manual_seed(seed + 1))
            return x

        def rewrites_for(self, rule):
            parts = []
            if rule.python_module:
                parts.append(f"submodules computing {rule.name} -> opfuse.nn.{rule.python_module}")
            if rule.python_fx:
                parts.append(f"torch.fx: {len(rule.python_fx)} chain pattern(s) in forwards")
            if rule.optimizer:
                parts.append(f"torch.optim.{rule.optimizer}'s per-tensor step -> fused (torch's fused=True, "
                             f"else opfuse.optim.{rule.optimizer})")
            if rule.memory_format:
                parts.append(f"the model's 4-d parameters and buffers -> torch.{rule.memory_format}")
            if not parts:
                return []

            def apply(workload):
                return workload.apply(rule)

            return [(" + ".join(parts), apply)]

        def apply(self, rule):
            """The rule's Python rewrites on this workload's model; returns the places changed."""
            places, escapes = 0, []
            if rule.python_module:
                places += rewrite.swap_modules(self.model, rule, self.calls, self.not_traced)
            if rule.python_fx:
                places += rewrite.rewrite_forwards(self.model, rule, self.rules, self.calls, self.not_traced, escapes)
            if rule.optimizer:
                places += self._swap_optimizer(rule.optimizer)
            if rule.memory_format:
                places += _to_memory_format(self.model, getattr(torch, rule.memory_format))
            n = len(escapes)
            self.unchanged = "" if places or not escapes else (
                f"its patterns match chains in {n} module{'s' if n > 1 else ''}, but each has a value also used "
                f"outside the chain, which the fused op does not give ({escapes[0]}{'; …' if n > 1 else ''})")
            if places:
                self.applied.append(rule.name)
                self.optimizer = self.optimizer_factory(self.model.parameters())
                self._ddp = self._compiled_model = None
            return places

        def why_unchanged(self):
            return self.unchanged

        def _swap_optimizer(self, name):
            """1 when the factory builds a torch.optim.<name> stepping tensor by tensor whose step
            a fused one can take over (same param groups and options: optim.fused_factory), which
            the factory then builds instead; else 0."""
            if type(self.optimizer) is not getattr(torch.optim, name, None) or optim.is_fused(self.optimizer):
                return 0
            fused = optim.fused_factory(self.optimizer_factory)
            if not optim.is_fused(fused(self.model.parameters())):
                return 0
            self.optimizer_factory = fused
            return 1

        def set_profiling(self, recorder):
            """Each submodule's forward in a scope named by its path, opened and closed by the
            recorder profiling the steps (opfuse's profiler or torch.profiler); None: no scopes."""
            for h in self._hooks:
                h.remove()
            self._hooks = []
            if recorder is not None:
                for path, module in self.model.named_modules():
                    if path:
                        self._hooks.append(module.register_forward_pre_hook(_open_scope(recorder, path)))
                        self._hooks.append(module.register_forward_hook(_close_scope(recorder)))

        def save(self, path):
            if self.rank() != 0:  # the model is the same on every rank
                return []
            torch.save(self.model.state_dict(), path + ".state_dict.pt")
            return [path + ".state_dict.pt"]

    return PythonWorkload


def _gradient_like(p, values):
    """values as p's gradient: in p's dtype and strides, as autograd lays out a gradient. torch's
    fused optimizers (SGD(fused=True) in 2.15) read a gradient as if it had its parameter's
    strides, so an NCHW gradient of a channels-last weight gives a wrong update, without an error."""
    return torch.empty_like(p).copy_(values)


def _to_memory_format(model, memory_format):
    """The model's 4-d parameters and buffers in that memory format, in place (Module.to's
    memory_format would, each parameter kept the same object); returns how many were not in it.
    The inputs may stay as they come: a convolution whose weight is channels-last computes
    channels-last, and the ops after it keep the layout they are given."""
    moved = sum(1 for t in list(model.parameters()) + list(model.buffers())
                if t.dim() == 4 and not t.is_contiguous(memory_format=memory_format))
    if moved:  # not Module.to, which would ask it of 5-d tensors too
        model._apply(lambda t: t.contiguous(memory_format=memory_format) if t.dim() == 4 else t)
    return moved


def _open_scope(recorder, path):
    def hook(module, args):
        recorder.push_scope(path)
    return hook


def _close_scope(recorder):
    def hook(module, args, out):
        recorder.pop_scope()
    return hook
