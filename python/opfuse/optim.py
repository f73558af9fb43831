"""Optimizers whose step is one fused opfuse op per parameter group.

``opfuse.optim.AdamW`` and ``opfuse.optim.SGD`` are drop-ins for torch's: the same constructor,
the same param_groups and state (AdamW's ``step``, ``exp_avg``, ``exp_avg_sq``, with torch's
dtypes; SGD's ``momentum_buffer``), so a state_dict saved by either loads in the other, and the
same arithmetic in float32 and float64 (float64 agrees to rounding; bfloat16 is computed in float
and rounded once per stored tensor). Their step calls ``torch.ops.opfuse.adamw_`` or
``sgd_`` once per group (per dtype, if a group mixes them): one pass over each parameter's
tensors where torch's per-tensor loop makes ~20 (AdamW) or 11 (SGD with momentum and weight decay)
accesses. The ``fused_adamw`` and ``fused_sgd`` rewrites step with torch's own fused step where torch
has one for the parameters (``fused_factory``), with these where it has not.
"""
import inspect

import torch
from torch.optim import sgd as torch_sgd
from torch.optim.optimizer import required

__all__ = ["AdamW", "SGD", "fused_factory", "is_fused", "fuse_in_place"]

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


# torch's optimizer -> the name of opfuse's, and what a group may ask for that opfuse's refuses.
_FUSED = {torch.optim.AdamW: ("AdamW", ("amsgrad", "differentiable")), torch.optim.SGD: ("SGD", ("differentiable",))}


def fused_factory(optimizer_factory):
    """The factory (params -> optimizer) that builds what optimizer_factory builds with the step of
    a torch.optim.AdamW or torch.optim.SGD fused, on the same param groups and hyperparameters:
    torch's own fused step (``fused=True``) where torch takes these parameters, else opfuse's
    class; any other optimizer is returned as built. What a rewrite of a ``fused_adamw`` or
    ``fused_sgd`` finding swaps into a training loop.

    torch (2.4 on) steps AdamW and SGD fused on the CPU itself, and opfuse's ops were not shown
    faster than its steps (``opfuse bench-op``, stories15M's 56 tensors, 2 threads, 30 paired
    rounds, opfuse's speed over torch's: adamw x1.02 [0.97, 1.04], sgd x0.99 [0.98, 1.02], both
    intervals holding 1), so torch's, which needs nothing of opfuse, is the choice."""

    def make(params):
        built = optimizer_factory(params)
        if type(built) not in _FUSED or is_fused(built):
            return built
        torchs = _torchs_fused(built)
        if torchs is not None:
            return torchs
        fused = _opfuse_class(built)
        if fused is None:
            return built
        # torch 2's groups also carry options of its own (fused, differentiable) that ours has not.
        ours = inspect.signature(fused).parameters
        options = {k: v for k, v in built.defaults.items() if k in ours}
        groups = [{k: v for k, v in g.items() if k == "params" or k in ours} for g in built.param_groups]
        return fused(groups, **options)

    return make


def is_fused(optimizer):
    """Whether the optimizer steps its parameters fused: opfuse's, or torch's with fused=True."""
    if isinstance(optimizer, (AdamW, SGD)):
        return True
    return type(optimizer) in _FUSED and all(g.get("fused") for g in optimizer.param_groups)


def fuse_in_place(optimizer):
    """Makes the optimizer (a torch.optim.AdamW or SGD others hold, a Trainer and its scheduler)
    step fused from now on, its state and param_groups kept: torch's fused step where torch takes
    its parameters, else opfuse's class. Returns whether it now steps fused."""
    if type(optimizer) not in _FUSED or is_fused(optimizer):
        return is_fused(optimizer)
    if _torchs_fused(optimizer) is not None:
        for group in optimizer.param_groups:
            group["fused"], group["foreach"] = True, None
        optimizer.defaults["fused"], optimizer.defaults["foreach"] = True, None
        return True
    fused = _opfuse_class(optimizer)
    if fused is None:
        return False
    optimizer.__class__ = fused  # same state and param_groups, key for key
    return True


def _opfuse_class(optimizer):
    """opfuse's class for a torch.optim.AdamW or SGD, or None where a group asks for what it
    refuses (amsgrad, differentiable)."""
    name, refused = _FUSED[type(optimizer)]
    if any(g.get(k) for g in optimizer.param_groups for k in refused):
        return None
    return globals()[name]


def _torchs_fused(built):
    """torch's own class with fused=True on the built optimizer's groups and options, or None where
    torch refuses it (a parameter of a device or dtype its fused kernels do not take, a torch
    without a fused CPU step, differentiable=True)."""
    cls = type(built)
    accepted = inspect.signature(cls).parameters
    options = {k: v for k, v in built.defaults.items() if k in accepted}
    options.update(fused=True, foreach=None)
    groups = [{**g, "fused": True, "foreach": None} for g in built.param_groups]
    try:
        return cls(groups, **options)
    except (RuntimeError, ValueError, TypeError):
        return None
