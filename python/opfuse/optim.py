"""Optimizers whose step is one fused opfuse op per parameter group.

``opfuse.optim.AdamW`` and ``opfuse.optim.SGD`` are drop-ins for torch's: the same constructor,
the same param_groups and state (AdamW's ``step``, ``exp_avg``, ``exp_avg_sq``, with torch's
dtypes; SGD's ``momentum_buffer``), so a state_dict saved by either loads in the other, and the
same arithmetic in float32 and float64 (float64 agrees to rounding; bfloat16 is computed in float
and rounded once per stored tensor). Their step calls ``torch.ops.opfuse.adamw_`` or
``sgd_`` once per group (per dtype, if a group mixes them): one pass over each parameter's
tensors where torch's per-tensor loop makes ~20 (AdamW) or 11 (SGD with momentum and weight decay)
accesses.
"""
import inspect

import torch
from torch.optim import sgd as torch_sgd
from torch.optim.optimizer import required

__all__ = ["AdamW", "SGD", "fused_factory"]

_OPFUSE_DTYPES = (torch.float32, torch.float64, torch.bfloat16)


class AdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's algorithm (decoupled weight decay) with a fused CPU step.

    amsgrad is refused (torch's default is off); CUDA and other devices keep torch's own step
    (``torch.optim.AdamW(foreach=True)``'s functional form), since opfuse's op is CPU-only.
    bfloat16 parameters keep bfloat16 state, as torch does, computed in float32 and rounded once.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if amsgrad:
            raise ValueError("opfuse.optim.AdamW: amsgrad is not supported (use torch.optim.AdamW for it)")
        if differentiable:
            raise ValueError("opfuse.optim.AdamW: differentiable is not supported (use torch.optim.AdamW for it)")
        # foreach, capturable, fused and decoupled_weight_decay (torch 2.x's AdamW is Adam with it
        # on) are kept only so param_groups match torch's key for key; the step is always fused.
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, foreach=foreach,
                        maximize=maximize, capturable=capturable, differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=True)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)
            group.setdefault("maximize", False)
            group.setdefault("foreach", None)
            group.setdefault("capturable", False)
            group.setdefault("differentiable", False)
            group.setdefault("fused", None)
            group.setdefault("decoupled_weight_decay", True)
        for s in self.state.values():  # checkpoints of torch < 1.12 hold the step as a number
            if "step" in s and not torch.is_tensor(s["step"]):
                s["step"] = torch.tensor(float(s["step"]))

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        if any(group.get("amsgrad") for group in self.param_groups):
            raise ValueError("opfuse.optim.AdamW: this state_dict was saved with amsgrad=True, which is not supported")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, weight_decay, maximize = group["lr"], group["eps"], group["weight_decay"], group["maximize"]
            for (device, _), (params, grads, exp_avgs, exp_avg_sqs, steps) in self._buckets(group).items():
                if device.type == "cpu":  # the op counts the step too
                    torch.ops.opfuse.adamw_(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps,
                                            weight_decay, maximize)
                else:  # torch's own step
                    torch.optim.adamw.adamw(params, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=True,
                                            amsgrad=False, beta1=beta1, beta2=beta2, lr=lr,
                                            weight_decay=weight_decay, eps=eps, maximize=maximize)
        return loss

    def _buckets(self, group):
        """The group's parameters that have gradients, with their state (made on first use), by
        device and dtype: one opfuse call takes tensors of one dtype."""
        buckets = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("AdamW does not support sparse gradients")
            state = self.state[p]
            if len(state) == 0:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            lists = buckets.setdefault((p.device, p.dtype), ([], [], [], [], []))
            for items, t in zip(lists, (p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"])):
                items.append(t)
        return buckets


class SGD(torch.optim.SGD):
    """torch.optim.SGD (momentum, dampening, Nesterov, weight decay, maximize) with a fused CPU
    step: ``torch.ops.opfuse.sgd_`` once per group and dtype, the buffers made on their first step
    in a call of their own (torch clones d there). Sparse gradients, other devices and dtypes, and
    a group listing a tensor twice keep torch's own step; ``differentiable=True`` is refused.
    bfloat16 is computed in float and rounded once per stored tensor, where torch rounds every
    intermediate: a few bfloat16 ulps from torch's trajectory, nearer the exact one."""

    def __init__(self, params, lr=required, momentum=0, dampening=0, weight_decay=0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False):
        if differentiable:
            raise ValueError("opfuse.optim.SGD: differentiable=True is not supported (use torch.optim.SGD for it)")
        super().__init__(params, lr, momentum, dampening, weight_decay, nesterov, maximize=maximize,
                         foreach=foreach, differentiable=differentiable)

    @torch.no_grad()
    def step(self, closure=None):
        # A group listing a tensor twice is stepped twice by torch's loop; one fused call would
        # have two threads update it at once.
        if any(len({id(p) for p in g["params"]}) != len(g["params"]) for g in self.param_groups):
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._step_group(group)
        return loss

    def _step_group(self, group):
        momentum = group["momentum"]
        buckets, torchs = {}, ([], [], [])
        for p in group["params"]:
            if p.grad is None:
                continue
            buffer = self.state[p].get("momentum_buffer")
            if p.grad.layout != torch.strided or p.device.type != "cpu" or p.dtype not in _OPFUSE_DTYPES:
                for items, t in zip(torchs, (p, p.grad, buffer)):
                    items.append(t)
                continue
            fresh = momentum != 0 and buffer is None
            if fresh:  # written whole by the op, kept once it has run
                buffer = torch.empty_like(p, memory_format=torch.preserve_format)
            lists = buckets.setdefault((p.dtype, fresh), ([], [], []))
            for items, t in zip(lists, (p, p.grad, buffer)):
                items.append(t)
        for (_, fresh), (params, grads, buffers) in buckets.items():
            torch.ops.opfuse.sgd_(params, grads, buffers if momentum != 0 else [], group["lr"], momentum,
                                  group["dampening"], group["weight_decay"], group["nesterov"], group["maximize"],
                                  fresh)
            for p, buffer in zip(params, buffers):
                self.state[p]["momentum_buffer"] = buffer  # None without momentum, as torch keeps it
        if torchs[0]:
            params, grads, buffers = torchs
            torch_sgd.sgd(params, grads, buffers, has_sparse_grad=any(g.is_sparse for g in grads), foreach=False,
                          weight_decay=group["weight_decay"], momentum=momentum, lr=group["lr"],
                          dampening=group["dampening"], nesterov=group["nesterov"], maximize=group["maximize"])
            for p, buffer in zip(params, buffers):
                self.state[p]["momentum_buffer"] = buffer


# torch's optimizer -> the name of opfuse's (looked up when used, as the rewrite looks it up), and
# what a group may ask for that opfuse's refuses.
_FUSED = {torch.optim.AdamW: ("AdamW", ("amsgrad", "differentiable")), torch.optim.SGD: ("SGD", ("differentiable",))}


def fused_factory(optimizer_factory):
    """The factory (params -> optimizer) that builds what optimizer_factory builds, with a
    torch.optim.AdamW (amsgrad off) or torch.optim.SGD replaced by opfuse's, on the same param
    groups and hyperparameters; any other optimizer is returned as built. What a rewrite of a
    ``fused_adamw`` or ``fused_sgd`` finding swaps into a training loop."""

    def make(params):
        built = optimizer_factory(params)
        name, refused = _FUSED.get(type(built), (None, ()))
        if name is None or any(g.get(k) for g in built.param_groups for k in refused):
            return built
        fused = globals()[name]
        # torch 2's groups also carry options of its own (fused, differentiable) that ours has not.
        ours = inspect.signature(fused).parameters
        options = {k: v for k, v in built.defaults.items() if k in ours}
        groups = [{k: v for k, v in g.items() if k == "params" or k in ours} for g in built.param_groups]
        return fused(groups, **options)

    return make
