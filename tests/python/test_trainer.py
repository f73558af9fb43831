"""opfuse.integrations.transformers.OpfuseCallback in a real Hugging Face Trainer: a few training
steps of the zoo's Llama with and without it, the same losses within float32 rounding."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "models"))
import zoo  # noqa: E402

import opfuse  # noqa: E402

transformers = pytest.importorskip("transformers")
from opfuse.integrations.transformers import OpfuseCallback  # noqa: E402

QUICK = dict(steps=1, rounds=1, warmup=0, profile_steps=1, min_gain=-1, quiet=True, measure_ops=False)


class Tokens(torch.utils.data.Dataset):
    """Random token sequences, each its own label (the model shifts them)."""

    def __init__(self, n, seq, vocab):
        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(5))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def train(tmp_path, name, callbacks, optim="adamw_torch"):
    model = zoo.build("llama_sdpa")[0]
    size = zoo.TEXT["test"]
    args = transformers.TrainingArguments(output_dir=str(tmp_path / name), max_steps=4, per_device_train_batch_size=2,
                                          learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[],
                                          use_cpu=True, seed=3, optim=optim, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(16, size["seq"], size["vocab"]),
                                   callbacks=callbacks)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return trainer, losses


def test_the_callback_tunes_on_the_first_batch_and_training_goes_on_alike(tmp_path, ops_library):
    _, plain = train(tmp_path, "plain", [])
    callback = OpfuseCallback(out=str(tmp_path / "opfuse"), **QUICK)
    trainer, tuned = train(tmp_path, "tuned", [callback])
    kept = {r.rule for r in callback.result.replacements if r.kept}
    assert {"rms_norm", "swiglu", "rotary_embedding", "fused_adamw"} <= kept, callback.result.text
    # The Trainer's own model and optimizer are the tuned ones: the modules swapped in place, the
    # optimizer (held by the Trainer and its scheduler) stepping fused.
    assert isinstance(trainer.model.model.norm, opfuse.nn.RMSNorm)
    assert opfuse.optim.is_fused(trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer")
                                 else trainer.optimizer)
    assert (tmp_path / "opfuse" / "report.json").is_file()
    assert len(plain) == len(tuned) == 4
    for a, b in zip(plain, tuned):
        assert abs(a - b) <= 1e-3 * abs(a), (plain, tuned)


def test_an_option_tune_does_not_take_is_refused_at_once():
    with pytest.raises(TypeError, match="min_gian"):
        OpfuseCallback(min_gian=0.05)
