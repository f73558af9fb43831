"""analyze's memory view against torch.profiler's own memory timeline (torch.profiler.
_memory_profiler.MemoryProfileTimeline, which follows each tensor's storage through the profile:
an independent reading of the same allocations), on a small MLP trained with AdamW.

- A torch.profiler trace: the CPU allocator counts only what it was asked for while profiling, so
  analyze's peak is the peak of what the profile allocated; torch's timeline also places the
  tensors that existed before it (parameters, optimizer state, the input), which are taken off.
- opfuse.profile: it writes what the model held before the profile into the trace, so analyze's
  peak is the whole of torch's.
"""
import json

import pytest
import torch

import opfuse

pytest.importorskip("torch.profiler._memory_profiler")
from torch.profiler._memory_profiler import Action, MemoryProfileTimeline  # noqa: E402

STEPS = 3


def workload(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(192, 768), torch.nn.GELU(), torch.nn.LayerNorm(768),
                                torch.nn.Linear(768, 192))
    return model, torch.randn(48, 192), lambda out: out.pow(2).mean()


def step(model, x, loss_fn, optimizer):
    # As opfuse's workload steps: the gradients are dropped first.
    optimizer.zero_grad(set_to_none=True)
    loss_fn(model(x)).backward()
    optimizer.step()


def torch_profile(tmp_path, seed):
    """torch.profiler over STEPS steps after one untimed: the trace and torch's timeline peaks
    (whole, and less the tensors that existed before the profile)."""
    model, x, loss_fn = workload(seed)
    optimizer = torch.optim.AdamW(model.parameters())
    step(model, x, loss_fn, optimizer)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                record_shapes=True, with_stack=True) as prof:
        for i in range(STEPS):
            with torch.profiler.record_function(f"ProfilerStep#{i + 1}"):
                step(model, x, loss_fn, optimizer)
    path = tmp_path / "torch.json"
    prof.export_chrome_trace(str(path))
    timeline = MemoryProfileTimeline(prof._memory_profile())
    _, sizes = timeline._coalesce_timeline("cpu")
    peak = max(sum(at) for at in sizes)
    before = sum(n for t, action, (key, _), n in timeline.timeline
                 if t == -1 and action == Action.PREEXISTING and key.device.type == "cpu")
    return path, peak, before, model


def memory_of(path):
    memory = opfuse.analyze(str(path)).memory
    assert len(memory) == 1 and memory[0]["device"] == "cpu"
    return memory[0]


def test_a_torch_profiler_trace_peaks_where_torch_says(tmp_path):
    path, peak, before, _ = torch_profile(tmp_path, seed=1)
    assert before > 0
    got = memory_of(path)
    want = peak - before
    assert abs(got["peak_bytes"] - want) <= 0.01 * want, (got["peak_bytes"], want)
    assert got["peak_step"].startswith("ProfilerStep#")
    assert got["allocations"] > 0 and got["frees"] > 0
    # What is live at the peak adds up to it: nothing held before is known here.
    held = sum(row["bytes"] for row in got["by_phase"] if row["name"] != "before the profile (other)")
    assert held == got["peak_bytes"]


def test_opfuse_profile_counts_what_the_model_held_before(tmp_path):
    _, peak, _, _ = torch_profile(tmp_path, seed=2)
    model, x, loss_fn = workload(seed=2)
    path = opfuse.profile(model, (x,), loss_fn, steps=STEPS, path=str(tmp_path / "opfuse.json"),
                          optimizer=lambda ps: torch.optim.AdamW(ps))
    got = memory_of(path)
    assert abs(got["peak_bytes"] - peak) <= 0.01 * peak, (got["peak_bytes"], peak)
    rows = {row["name"]: row["bytes"] for row in got["by_phase"]}
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    assert rows["parameters"] == parameters
    assert rows["optimizer state"] >= 2 * parameters  # AdamW's two moments, and its step counters
    assert rows["inputs"] == x.numel() * x.element_size()
    with open(path) as f:
        assert json.load(f)["opfuse"]["memory_before"]["parameters"] == parameters
    timeline = got["timeline"]
    assert 0 < len(timeline) <= 400
    assert max(bytes_ for _, bytes_ in timeline) == got["peak_bytes"]
