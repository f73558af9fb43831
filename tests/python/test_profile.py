"""opfuse.profile with either profiler: opfuse's own, or torch.profiler (Kineto's trace, the
module and step scopes as user annotations). analyze reads both alike: the same findings, at the
same module paths, with the step's unprofiled time and the allocations."""
import json
import os
import sys

import pytest

import opfuse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "models"))
import llama  # noqa: E402


def rules_and_places(analysis):
    return {f["rule"]: sorted(l["location"] for l in f["locations"]) for f in analysis.findings
            if f["kind"] != "mined"}


def test_torch_profilers_trace_finds_what_opfuses_finds_where_it_finds_it(tmp_path):
    model, inputs, loss = llama.factory(batch_size=2, seq_len=16, vocab_size=64, seed=0)
    ours = opfuse.analyze(opfuse.profile(model, inputs, loss, path=str(tmp_path / "ours.json")))
    torchs = opfuse.analyze(opfuse.profile(model, inputs, loss, path=str(tmp_path / "torch.json"), profiler="torch"))
    assert ours.trace["dialect"] == "opfuse profiler"
    assert torchs.trace["dialect"] == "PyTorch Kineto"
    found = rules_and_places(torchs)
    assert found == rules_and_places(ours)
    assert {"rms_norm", "rotary_embedding", "swiglu", "fused_sgd"} <= set(found), found
    assert any(place.startswith("layers.0.") for place in found["rms_norm"]), found["rms_norm"]
    assert torchs.trace["steps"] == 2 and torchs.trace["plain_step_us"] > 0
    # The allocations, and what the model held before the profile (opfuse's metadata in torch's
    # trace): the peak holds at least that. (The two peaks are not equal: torch's trace gave
    # 4.42 MB where opfuse's gave 4.81 MB in one run, 8 % apart; not explained yet.)
    (mine,), (theirs,) = ours.memory, torchs.memory
    before = {r["name"]: r["bytes"] for r in theirs["by_phase"]}
    assert before["parameters"] == {r["name"]: r["bytes"] for r in mine["by_phase"]}["parameters"] > 0
    assert theirs["peak_bytes"] >= before["parameters"] + before["optimizer state"] + before["inputs"]


def test_tune_profiles_with_torch_profiler_when_asked(tmp_path):
    model, inputs, loss = llama.factory(batch_size=2, seq_len=16, vocab_size=64, seed=0)
    quick = dict(steps=1, rounds=1, warmup=0, profile_steps=1, min_gain=-1, quiet=True, measure_ops=False)
    result = opfuse.tune(model, inputs, loss, out=str(tmp_path / "run"), profiler="torch", **quick)
    for side in ("baseline", "tuned"):
        with open(tmp_path / "run" / f"{side}.trace.json") as f:
            trace = json.load(f)
        assert trace["opfuse"]["profiler"] == "torch.profiler", side
        scopes = {e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"}
        assert any(n.startswith("ProfilerStep#") for n in scopes) and "layers.0.attention" in scopes, sorted(scopes)
    assert opfuse.analyze(str(tmp_path / "run" / "baseline.trace.json")).trace["dialect"] == "PyTorch Kineto"
    verified = {r.rule for r in result.replacements if r.verified}
    assert {"rms_norm", "swiglu", "rotary_embedding"} <= verified, verified


def test_an_unknown_profiler_is_refused_before_any_step(tmp_path):
    model, inputs, loss = llama.factory(batch_size=2, seq_len=16, vocab_size=64, seed=0)
    with pytest.raises(ValueError, match="profiler must be 'opfuse' or 'torch', got 'kineto'"):
        opfuse.profile(model, inputs, loss, path=str(tmp_path / "t.json"), profiler="kineto")
    assert not (tmp_path / "t.json").exists()
    with pytest.raises(ValueError, match="profiler must be 'opfuse' or 'torch', got 'kineto'"):
        opfuse.tune(model, inputs, loss, out=str(tmp_path / "run"), profiler="kineto", quiet=True)
    assert not (tmp_path / "run").exists()


def test_torchs_own_attention_is_no_finding(tmp_path):
    """llama2.c's model.py calls F.scaled_dot_product_attention where torch has it: already fused."""
    found = {}
    for attention in ("manual", "sdpa"):
        model, inputs, loss = llama.factory(batch_size=2, seq_len=16, vocab_size=64, seed=0, attention=attention)
        path = opfuse.profile(model, inputs, loss, path=str(tmp_path / f"{attention}.json"))
        found[attention] = set(rules_and_places(opfuse.analyze(path)))
    assert "attention" in found["manual"] and "attention" not in found["sdpa"], found
    assert found["manual"] - {"attention"} == found["sdpa"], found
