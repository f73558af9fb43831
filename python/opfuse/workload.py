"""A Python model as a tune Workload: the C++ loop clones, steps, probes and rewrites it through
these methods."""
import time

import torch

from . import rewrite


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


def make(native):
    """The Workload class over this process's opfuse._C."""

    class PythonWorkload(native.Workload):
        def __init__(self, model, inputs, loss_fn, optimizer, rules, calls=None, applied=(), not_traced=None):
            native.Workload.__init__(self)
            self.model, self.inputs, self.loss_fn = model, tuple(inputs), loss_fn
            self.optimizer_factory = optimizer or default_optimizer
            self.optimizer = self.optimizer_factory(self.model.parameters())
            self.rules = rules
            self.calls = calls if calls is not None else rewrite.record_calls(model, self.inputs, native)
            self.applied = list(applied)
            self.not_traced = not_traced if not_traced is not None else {}
            self._hooks = []

        def name(self):
            return type(self.model).__name__

        def describe(self):
            return ", ".join(self.applied) if self.applied else "as written"

        def _first_input(self):
            return next((x for x in self.inputs if isinstance(x, torch.Tensor) and x.dim() > 0), None)

        def samples_per_step(self):
            first = self._first_input()
            return int(first.shape[0]) if first is not None else 1

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
                                  self.rules, self.calls, self.applied, self.not_traced)

        def step(self):
            start = time.perf_counter()
            self.optimizer.zero_grad(set_to_none=True)
            self.loss_fn(self.model(*self.inputs)).backward()
            self.optimizer.step()  # torch's profiler scope "Optimizer.step#SGD.step" comes with it
            return (time.perf_counter() - start) * 1000

        def probe(self, dtype, seed, nudge):
            model = self.model.to(dtype)
            model.train()
            # Dropout modules pass through: a fused op draws its own mask (attention's is never
            # stored), so two models agree on the mathematics only with nothing dropped.
            for m in model.modules():
                if isinstance(m, torch.nn.modules.dropout._DropoutNd):
                    m.eval()
            inputs = [self._input(x, dtype, seed, nudge) for x in self.inputs]
            for p in model.parameters():
                p.grad = None
            torch.manual_seed(seed)
            out = model(*inputs)
            loss = self.loss_fn(out)
            loss.backward()
            grads = [(n, p.grad) for n, p in model.named_parameters()]
            return [t.detach() for t in flatten_tensors(out)], grads

        @staticmethod
        def _input(x, dtype, seed, nudge):
            if not isinstance(x, torch.Tensor) or not x.is_floating_point():
                return x
            x = x.to(dtype)
            if nudge > 0:
                gen = torch.Generator().manual_seed(seed + 1)
                x = x * (1 + nudge * torch.randn(x.shape, generator=gen, dtype=dtype))
            return x

        def rewrites_for(self, rule):
            parts = []
            if rule.python_module:
                parts.append(f"submodules computing {rule.name} -> opfuse.nn.{rule.python_module}")
            if rule.python_fx:
                parts.append(f"torch.fx: {len(rule.python_fx)} chain pattern(s) in forwards")
            if not parts:
                return []

            def apply(workload):
                return workload.apply(rule)

            return [(" + ".join(parts), apply)]

        def apply(self, rule):
            """The rule's Python rewrites on this workload's model; returns the places changed."""
            places = 0
            if rule.python_module:
                places += rewrite.swap_modules(self.model, rule, self.calls)
            if rule.python_fx:
                places += rewrite.rewrite_forwards(self.model, rule, self.rules, self.calls, self.not_traced)
            if places:
                self.applied.append(rule.name)
                self.optimizer = self.optimizer_factory(self.model.parameters())
            return places

        def set_profiling(self, on):
            for h in self._hooks:
                h.remove()
            self._hooks = []
            if on:
                for path, module in self.model.named_modules():
                    if path:
                        self._hooks.append(module.register_forward_pre_hook(_open_scope(native, path)))
                        self._hooks.append(module.register_forward_hook(_close_scope(native)))

        def save(self, path):
            torch.save(self.model.state_dict(), path + ".state_dict.pt")
            return [path + ".state_dict.pt"]

    return PythonWorkload


def _open_scope(native, path):
    def hook(module, args):
        native.push_scope(path)
    return hook


def _close_scope(native):
    def hook(module, args, out):
        native.pop_scope()
    return hook
