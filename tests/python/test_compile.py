"""torch.compile takes opfuse-tuned models whole: the test models (EfficientNet's memory-efficient
Swish, the Llama-style stack) patched by opfuse compile with fullgraph=True (zero graph breaks)
and give the eager tuned model's outputs and every gradient in the model's own float32, within
1e-4 of the tensor's largest magnitude plus the largest of all, as the verifier allows (compile reorders sums; a wrong fake kernel or a lost
rewrite misses by far more)."""
import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "models"))
import efficientnet  # noqa: E402
import llama  # noqa: E402

import opfuse  # noqa: E402

TOLERANCE = 1e-4


def small_efficientnet():
    """Without dropout or drop connect: compiled code draws its random numbers from its own
    generator, so only a model without them can be compared draw for draw. 64 px, 8 images: at
    32 px and 2 images the last BatchNorms normalise two values a channel, so ill-conditioned that
    compile's reordered sums alone move the unpatched model's output by 8 %."""
    model, inputs, loss_fn = efficientnet.factory(image_size=64, batch_size=8, num_classes=10)
    model.drop_connect_rate, model._dropout.p = 0.0, 0.0
    return model, inputs, loss_fn


def small_llama():
    return llama.factory(batch_size=2, seq_len=16, vocab_size=64)


def outputs_and_grads(run, model, inputs, loss_fn):
    model.zero_grad(set_to_none=True)
    out = run(*inputs)
    loss_fn(out).backward()
    return out.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def relative_error(got, want, floor):
    """As the verifier scores: against the tensor's largest magnitude plus the largest of all, so
    a gradient that is zero in exact arithmetic (a bias feeding a BatchNorm) is not judged by its
    own rounding noise."""
    return ((got - want).abs().max() / (want.abs().max() + floor)).item()


# EfficientNet's ops are torch's own under compile (functional.py: inductor fuses them); the
# Llama-style model's stay opfuse's.
@pytest.mark.parametrize("factory, expected, compiled_opfuse",
                         [(small_efficientnet, {"silu"}, False), (small_llama, {"attention", "rotary_embedding", "swiglu"}, True)],
                         ids=["efficientnet", "llama"])
def test_tuned_model_compiles_whole_and_matches_eager(factory, expected, compiled_opfuse):
    model, inputs, loss_fn = factory()
    model.train()
    done = dict(opfuse.patch(model, inputs, loss_fn))
    assert expected <= set(done), done

    explanation = torch._dynamo.explain(model)(*inputs)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    traced = {str(n.target) for g in explanation.graphs for n in g.graph.nodes if n.op == "call_function"}
    assert any(t.startswith("opfuse.") for t in traced) == compiled_opfuse, sorted(traced)

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    want_out, want_grads = outputs_and_grads(model, model, inputs, loss_fn)
    got_out, got_grads = outputs_and_grads(compiled, model, inputs, loss_fn)
    floor = max(t.abs().max().item() for t in [want_out, *want_grads.values()])
    assert relative_error(got_out, want_out, floor) < TOLERANCE
    assert got_grads.keys() == want_grads.keys()
    for name, want in want_grads.items():
        assert relative_error(got_grads[name], want, floor) < TOLERANCE, name


class Swish(torch.nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


def test_tune_measures_torch_compile_beside_it(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), Swish(), torch.nn.Linear(256, 8))
    x = torch.randn(32, 64)
    result = opfuse.tune(model, (x,), lambda out: out.square().mean(), out=str(tmp_path / "run"), steps=1, rounds=2,
                         warmup=1, profile_steps=1, min_gain=-1, quiet=True, measure_ops=False, compare_compile=True)
    peer = result.to_json()["compile"]
    assert [v["variant"] for v in peer["variants"]] == ["eager", "opfuse", "compile", "opfuse + compile"]
    for v in peer["variants"]:
        assert v["error"] is None and v["ms"] > 0 and v["ms_ci"][0] <= v["ms"] <= v["ms_ci"][1], v
        assert len(v["ms_rounds"]) == peer["rounds"] >= 2
    assert peer["rounds"] == max([2] + [r.rounds for r in result.replacements if r.measured])  # as tune's took
    assert peer["variants"][0]["speedup_vs_first"] == 1
    assert all(v["ready_s"] > 0 for v in peer["variants"][1:])  # tune's time, then compile's first steps
    # Each variant's memory peak, from a profiled step: at least what the model holds between steps.
    held = sum(p.numel() * p.element_size() for p in model.parameters()) * 2 + x.numel() * x.element_size()
    assert all(v["peak_memory_bytes"] >= held for v in peer["variants"]), [v["peak_memory_bytes"] for v in peer["variants"]]
    paired = peer["opfuse_compile_vs_compile"]
    assert paired["ci"][0] <= paired["estimate"] <= paired["ci"][1]
    assert "torch.compile beside the tune" in result.text
    saved = json.loads((tmp_path / "run" / "report.json").read_text())
    assert saved["compile"]["variants"][3]["variant"] == "opfuse + compile"
    page = (tmp_path / "run" / "report.html").read_text()  # the page draws its embedded data (test_analysis_html.sh)
    assert '"opfuse_compile_vs_compile":{"ci":' in page and '"measured_under":"eager"' in page


def test_tune_for_compile_times_every_variant_compiled_and_profiles_eager(tmp_path, monkeypatch):
    """for_compile: the rewrites are found in an eager profile (Swish's sigmoid and mul), but the
    baseline and each variant are timed under torch.compile, each compiled once."""
    compiled = []

    def counting_compile(model, **kwargs):
        compiled.append(model)
        return real_compile(model, **kwargs)

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", counting_compile)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), Swish(), torch.nn.Linear(256, 8))
    result = opfuse.tune(model, (torch.randn(32, 64),), lambda out: out.square().mean(), out=str(tmp_path / "run"),
                         steps=1, rounds=2, max_rounds=2, warmup=1, profile_steps=1, min_gain=-1, quiet=True,
                         measure_ops=False, for_compile=True)
    silu = next(r for r in result.replacements if r.rule == "silu")
    assert silu.verified and silu.measured and silu.kept
    # the check before the work, then the baseline and each variant (cumulative, all kept) once
    measured = [r.rule for r in result.replacements if r.measured]
    assert len(compiled) == 2 + len(measured) and len({id(m) for m in compiled}) == len(compiled), measured
    swish = [isinstance(m[1], Swish) for m in compiled]
    assert swish[:2] == [True, True] and swish[1 + measured.index("silu") + 1] is False
    assert result.to_json()["measured_under"] == "torch.compile"
    assert "ran under torch.compile (for_compile)" in result.text
    assert '"measured_under":"torch.compile"' in (tmp_path / "run" / "report.html").read_text()


@torch.library.custom_op("opfuse_tests::no_fake", mutates_args=())
def _no_fake(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


def test_tune_for_compile_refuses_a_model_compile_cannot_train_before_the_work(tmp_path):
    """A custom op of the user's with no fake implementation: eager runs it, compile cannot."""

    class FailsCompiled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x):
            y = self.linear(x)
            return _no_fake(torch.sigmoid(y) * y)

    with pytest.raises(ValueError, match="for_compile: torch.compile cannot train this model: .*fake"):
        opfuse.tune(FailsCompiled(), (torch.randn(4, 8),), lambda out: out.sum(), out=str(tmp_path / "run"),
                    quiet=True, for_compile=True)
    assert not (tmp_path / "run" / "report.json").exists()


def test_under_compile_efficientnets_ops_are_torchs_own_for_inductor_to_fuse():
    """Eager runs opfuse's ops; torch.compile sees torch's, which inductor fuses into neighbours
    (a convolution, a BatchNorm): opfuse's would be calls it cannot see into."""

    class Gated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.act = torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), opfuse.nn.SiLU()

        def forward(self, x):
            y = self.act(opfuse.functional.batch_norm_silu(self.conv(x), self.bn))
            return opfuse.functional.se_gate(y, y.mean((2, 3), keepdim=True))

    model, x = Gated(), torch.randn(2, 3, 8, 8)
    eager = opfuse._C.top_level_ops(lambda: model(x))
    assert {"opfuse::batch_norm_silu", "opfuse::silu", "opfuse::se_gate"} <= set(eager), eager
    explanation = torch._dynamo.explain(model)(x)
    traced = {str(n.target) for g in explanation.graphs for n in g.graph.nodes if n.op == "call_function"}
    assert explanation.graph_break_count == 0 and not any(t.startswith("opfuse.") for t in traced), sorted(traced)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    want_out, want_grads = outputs_and_grads(model, model, (x,), lambda out: out.square().sum())
    got_out, got_grads = outputs_and_grads(compiled, model, (x,), lambda out: out.square().sum())
    floor = max(t.abs().max().item() for t in [want_out, *want_grads.values()])
    assert relative_error(got_out, want_out, floor) < TOLERANCE
    for name, want in want_grads.items():
        assert relative_error(got_grads[name], want, floor) < TOLERANCE, name


def test_the_command_line_tunes_for_compile(tmp_path):
    from opfuse.__main__ import main
    factory = tmp_path / "net.py"
    factory.write_text(
        "import torch\n"
        "class Swish(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x * torch.sigmoid(x)\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(16, 32), Swish(), torch.nn.Linear(32, 4))\n"
        "    return m, (torch.randn(8, 16),), lambda out: out.square().mean()\n")
    assert main(["tune", f"{factory}:make", "--out", str(tmp_path / "o"), "--steps", "1", "--rounds", "2",
                 "--max-rounds", "2", "--warmup", "1", "--min-gain", "-1", "--for-compile",
                 "--json", str(tmp_path / "r.json")]) == 0
    report = json.load(open(tmp_path / "r.json"))
    assert report["measured_under"] == "torch.compile"
    assert any(r["rule"] == "silu" and r["measured"] for r in report["replacements"]), report["replacements"]
