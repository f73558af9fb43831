"""Optimizers whose step is one fused opfuse op per parameter group.

``opfuse.optim.AdamW`` is a drop-in for ``torch.optim.AdamW``: the same constructor, the same
param_groups and state (``step``, ``exp_avg``, ``exp_avg_sq``, with torch's dtypes), so a
state_dict saved by either loads in the other, and the same arithmetic (float64 agrees to
rounding). Its step calls ``torch.ops.opfuse.adamw_`` once per group (per dtype, if a group mixes them):
one pass over each parameter's p, g, m, v where torch's per-tensor loop makes ~20.
"""
import inspect

import torch

__all__ = ["AdamW", "fused_factory"]


class AdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's algorithm (decoupled weight decay) with a fused CPU step.

    amsgrad is refused (torch's default is off); CUDA and other devices keep torch's own step
    (``torch.optim.AdamW(foreach=True)``'s functional form), since opfuse's op is CPU-only.
    bfloat16 parameters keep bfloat16 state, as torch does, computed in float32 and rounded once.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False):
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
        # foreach and capturable are kept only so param_groups match torch's key for key.
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, foreach=foreach,
                        maximize=maximize, capturable=capturable)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)
            group.setdefault("maximize", False)
            group.setdefault("foreach", None)
            group.setdefault("capturable", False)
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


def fused_factory(optimizer_factory):
    """The factory (params -> optimizer) that builds what optimizer_factory builds, with a
    torch.optim.AdamW (amsgrad off) replaced by opfuse's, on the same param groups and
    hyperparameters; any other optimizer is returned as built. What a rewrite of a
    ``fused_adamw`` finding swaps into a training loop."""

    def make(params):
        built = optimizer_factory(params)
        if type(built) is not torch.optim.AdamW or any(g["amsgrad"] or g.get("differentiable") for g in built.param_groups):
            return built
        # torch 2's groups also carry options of its own (fused, differentiable) that ours has not.
        ours = inspect.signature(AdamW).parameters
        options = {k: v for k, v in built.defaults.items() if k in ours}
        groups = [{k: v for k, v in g.items() if k == "params" or k in ours} for g in built.param_groups]
        return AdamW(groups, **options)

    return make
