"""opfuse in a Hugging Face Trainer:

    trainer = Trainer(model, args, train_dataset=..., callbacks=[OpfuseCallback(out="opfuse-run")])
    trainer.train()

At the start of training the callback tunes a copy of the model on the first batch (profile,
rewrite, verify, measure, as `opfuse.tune`), then applies the rewrites it kept to the Trainer's own
model in place and, when a fused optimizer was kept, steps the Trainer's own optimizer fused: the
parameters, the optimizer's state and its learning-rate schedule stay the objects the Trainer holds,
so training goes on as it would have, faster. The random streams are as they would have been without
the callback (tuning runs under a fork of them), so a run with it matches one without.
"""
import inspect

import torch
from transformers import TrainerCallback

import opfuse

class OpfuseCallback(TrainerCallback):
    """Tunes the Trainer's model on its first batch and trains on with what was kept.

    options: `opfuse.tune`'s keywords (out, min_gain, rounds, max_rounds, rules, quiet, ...).
    After training begins, `.result` is the TuneResult (its text, report.json, what was kept)."""

    def __init__(self, **options):
        unknown = set(options) - set(inspect.signature(opfuse.tune).parameters)
        if unknown:
            raise TypeError(f"OpfuseCallback: unknown opfuse.tune option(s): {', '.join(sorted(unknown))}")
        self.options = options
        self.result = None

    def on_train_begin(self, args, state, control, model=None, optimizer=None, train_dataloader=None, **kwargs):
        if self.result is not None:
            return  # tuned already: a second train() on the same Trainer goes on as tuned
        if model is None or optimizer is None or train_dataloader is None:
            raise ValueError("OpfuseCallback needs the Trainer's model, optimizer and train_dataloader at on_train_begin")
        optimizer = _unwrapped(optimizer)
        with torch.random.fork_rng(devices=[]):
            inputs = _positional(model, _first_batch(train_dataloader, model))
            self.result = opfuse.tune(model, inputs, _loss_of_output, _factory_of(optimizer), **self.options)
        kept = {r.rule for r in self.result.replacements if r.kept}
        with torch.random.fork_rng(devices=[]):
            opfuse.patch(model, inputs, _loss_of_output, rules=self.options.get("rules"), only=kept)
        # A kept optimizer rule (its `optimizer:` names torch's class it takes over) fuses the
        # Trainer's own optimizer in place: the object the Trainer and its scheduler hold, its
        # state and param_groups kept, steps fused from here on.
        rules = opfuse._rules(self.options.get("rules"), not self.options.get("no_default_rules", False))
        stepped = {r.optimizer for r in rules if r.name in kept and r.optimizer}
        if any(type(optimizer) is getattr(torch.optim, name, None) for name in stepped):
            opfuse.optim.fuse_in_place(optimizer)


def _first_batch(dataloader, model):
    """The loader's first batch (a dict of tensors, as the Trainer's collators make), on the model's device."""
    batch = next(iter(dataloader))
    if not isinstance(batch, dict):
        raise TypeError(f"OpfuseCallback: a batch is a {type(batch).__name__}; it takes the Trainer's dict batches")
    if "labels" not in batch:
        raise ValueError("OpfuseCallback: the batch has no 'labels', so the model computes no loss to tune on")
    device = next(model.parameters()).device
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _positional(model, batch):
    """The batch as model.forward's positional arguments (opfuse.tune calls model(*inputs)), with
    the defaults of the parameters the batch skips."""
    bound = inspect.signature(model.forward).bind(**batch)
    bound.apply_defaults()
    if bound.kwargs:
        raise TypeError(f"OpfuseCallback: {', '.join(bound.kwargs)} can only be passed by keyword to "
                        f"{type(model).__name__}.forward")
    return bound.args


def _loss_of_output(output):
    return output.loss


def _unwrapped(optimizer):
    """The torch optimizer inside accelerate's AcceleratedOptimizer (an Optimizer itself, which
    the Trainer hands callbacks), whose step it calls."""
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        optimizer = optimizer.optimizer
    return optimizer


def _factory_of(optimizer):
    """A factory making another optimizer like the Trainer's: its class and those of its defaults
    its constructor takes (torch 2.x's AdamW keeps `decoupled_weight_decay` among them, fixed)."""
    takes = inspect.signature(type(optimizer)).parameters
    settings = {k: v for k, v in optimizer.defaults.items() if k in takes}
    return lambda params: type(optimizer)(params, **settings)
