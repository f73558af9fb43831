"""analyze's memory view against torch.profiler's own memory timeline (torch.profiler.
_memory_profiler.MemoryProfileTimeline, which follows each tensor's storage through the profile:
an independent reading of the same allocations), on a small MLP trained with AdamW.

- A torch.profiler trace: the CPU allocator counts only what it was asked for while profiling, so
  analyze's peak is the peak of what the profile allocated: torch's peak less what the model held
  before (parameters, optimizer state, the input). Not less the tensors torch's timeline places
  before the profile: those include the last step's gradients exactly when torch reports their free
  (when an earlier profile in the process saw a block at the same address), so that sum, unlike the
  peak, depends on the process's history. Each test runs fresh and after earlier profiles.
- opfuse.profile: it writes what the model held before the profile into the trace, so analyze's
  peak is the whole of torch's.
"""
import json

import pytest
import torch

import opfuse

pytest.importorskip("torch.profiler._memory_profiler")
from torch.profiler._memory_profiler import MemoryProfileTimeline  # noqa: E402

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


def held(model, x, optimizer):
    """The bytes of the parameters, the optimizer's state and the input."""
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *state, x])


def torch_profile(tmp_path, seed):
    """torch.profiler over STEPS steps after one untimed: the trace, torch's timeline peak and the
    bytes the model held before the profile."""
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
    return path, peak, held(model, x, optimizer), model


def memory_of(path):
    memory = opfuse.analyze(str(path)).memory
    assert len(memory) == 1 and memory[0]["device"] == "cpu"
    return memory[0]


@pytest.mark.parametrize("profiles_before", [0, 2])
def test_a_torch_profiler_trace_peaks_where_torch_says(tmp_path, profiles_before):
    for k in range(profiles_before):
        (tmp_path / str(k)).mkdir()
        torch_profile(tmp_path / str(k), seed=1)
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


@pytest.mark.parametrize("profiles_before", [0, 2])
def test_opfuse_profile_counts_what_the_model_held_before(tmp_path, profiles_before):
    _, peak, _, _ = torch_profile(tmp_path, seed=2)
    for k in range(profiles_before):
        opfuse.profile(*workload(seed=2), steps=STEPS, path=str(tmp_path / f"earlier{k}.json"),
                       optimizer=lambda ps: torch.optim.AdamW(ps))
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
