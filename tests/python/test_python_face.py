"""The Python face: opfuse.tune / patch / profile / analyze on unmodified eager models, the fx and
module rewrites, and bad input. Numerics are checked against float64 on fresh random data."""
import copy
import json
import math
import os
import random
import sys
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "models"))
import efficientnet  # noqa: E402
import gpt  # noqa: E402
import gpt2  # noqa: E402
import gpt_neox  # noqa: E402
import llama  # noqa: E402
import t5  # noqa: E402

import opfuse  # noqa: E402

SEED = random.SystemRandom().randrange(1 << 30)
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")
QUICK = dict(steps=1, rounds=1, warmup=0, profile_steps=1, min_gain=-1, quiet=True, measure_ops=False)


@pytest.fixture(autouse=True)
def fresh_seed():
    torch.manual_seed(SEED)
    print(f"seed {SEED}")


def tiny_effnet():
    # 64 px, batch 4: at 32 px the last blocks are 1x1 with 2 samples per BatchNorm channel,
    # where float32 rounding alone exceeds the verification allowance (as in tests/tune).
    return efficientnet.factory(image_size=64, batch_size=4, num_classes=10, seed=SEED)


def test_tune_replaces_swish_and_batchnorm_swish_and_leaves_the_model_alone(tmp_path):
    model, inputs, loss = tiny_effnet()
    before = copy.deepcopy(model.state_dict())
    result = opfuse.tune(model, inputs, loss, out=str(tmp_path / "run"), **QUICK)
    by_rule = {r.rule: r for r in result.replacements}
    assert by_rule["silu"].verified and by_rule["silu"].kept and by_rule["silu"].places == 17
    assert by_rule["batch_norm_silu"].verified and by_rule["batch_norm_silu"].places == 33
    assert by_rule["silu"].max_rel_error < 1e-4
    # The user's model is untouched; the result's is a patched copy.
    assert type(model._swish) is efficientnet.MemoryEfficientSwish
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert isinstance(result.model._swish, opfuse.nn.SiLU)
    # The tuned model computes the same function, forward and backward, in float64.
    x = torch.randn(4, 3, 64, 64, dtype=torch.float64)
    ref, got = copy.deepcopy(model).double(), copy.deepcopy(result.model).double()
    torch.manual_seed(1)
    a = ref(x)
    a.sum().backward()
    torch.manual_seed(1)
    b = got(x)
    b.sum().backward()
    # tune's bound: 1e-9 of (max |reference| + the largest magnitude of all), so a gradient that
    # is zero in exact arithmetic (a bias before a BatchNorm) is not judged by its own rounding.
    largest = max([a.abs().max().item()] + [p.grad.abs().max().item() for p in ref.parameters()])
    assert (a - b).abs().max().item() <= 1e-9 * (a.abs().max().item() + largest)
    for (n, p), (_, q) in zip(ref.named_parameters(), got.named_parameters()):
        assert (p.grad - q.grad).abs().max().item() <= 1e-9 * (p.grad.abs().max().item() + largest), n
    # The same report as the CLI, with both traces, written where asked.
    report = json.load(open(tmp_path / "run" / "report.json"))
    assert report == result.to_json()
    for key in ("baseline", "tuned", "speedup", "replacements", "rejected", "tolerance"):
        assert key in report
    for f in ("report.html", "baseline.trace.json", "tuned.trace.json"):
        assert (tmp_path / "run" / f).exists()


def test_an_earlier_run_is_never_overwritten(tmp_path):
    model, inputs, loss = tiny_effnet()
    first = opfuse.tune(model, inputs, loss, out=str(tmp_path / "o"), **QUICK)
    second = opfuse.tune(model, inputs, loss, out=str(tmp_path / "o"), **QUICK)
    assert first.out == str(tmp_path / "o") and second.out == str(tmp_path / "o-2")


def test_channels_last_is_found_by_the_strides_applied_and_verified_with_a_fused_optimizer(tmp_path):
    model, inputs, loss = tiny_effnet()
    fused_sgd = lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9, fused=True)  # noqa: E731
    result = opfuse.tune(model, inputs, loss, fused_sgd, out=str(tmp_path / "run"), **QUICK)
    layout = next(r for r in result.replacements if r.rule == "channels_last")
    # the 4-d parameters not channels-last already moved (a 1x1 or depthwise weight is both
    # layouts: the stem's 3x3 over RGB alone); the user's model did not
    four_d = [n for n, p in model.named_parameters() if p.dim() == 4]
    moved = [n for n in four_d if not model.get_parameter(n).is_contiguous(memory_format=torch.channels_last)]
    assert moved == ["_conv_stem.weight"]
    assert layout.verified and layout.kept and layout.places == len(moved)
    # torch's fused SGD misreads a gradient whose strides differ from its parameter's: the
    # verifier's gradients are laid out as autograd lays them out, so the update agrees
    assert layout.max_rel_error < 1e-4
    assert all(p.is_contiguous() for p in model.parameters())
    tuned = dict(result.model.named_parameters())
    assert all(tuned[n].is_contiguous(memory_format=torch.channels_last) for n in four_d)
    # NCHW inputs as they come: the first convolution's channels-last weight carries the layout on
    out = {}
    result.model._conv_stem.register_forward_hook(lambda m, args, y: out.setdefault("stem", y))
    result.model(inputs[0])
    assert out["stem"].is_contiguous(memory_format=torch.channels_last) and not out["stem"].is_contiguous()
    # The analysis advises it from the baseline's strides, and no longer after it; without the
    # convolutions timed (opfuse.analyze's measure=False), with no estimate.
    before = opfuse.analyze(str(tmp_path / "run" / "baseline.trace.json"))
    advice = next(f for f in before.findings if f["rule"] == "channels_last")
    assert advice["estimated"] is False and advice["est_saving_us"] == 0
    # one per convolution over a feature map (the SE gate's over 1x1 pixels is either layout)
    assert advice["occurrences"] == len(four_d) - len([n for n in four_d if "_se_" in n])
    row = next(line for line in before.text.splitlines() if line.startswith("channels_last "))
    assert "not estimated: tune measures a layout change" in row, row
    after = opfuse.analyze(str(tmp_path / "run" / "tuned.trace.json"))
    assert not any(f["rule"] == "channels_last" for f in after.findings)
    # nor does the critical path predict the tuned step without it (measure_ops off), and the report says so
    assert result.to_json()["predicted_step_ms"] is None
    assert result.to_json()["not_predicted"] == "channels_last has no estimate"
    assert "not predicted: channels_last has no estimate" in result.text
    # With the convolutions timed here in both layouts (forward and backward, at the sizes the
    # trace recorded), every one has an estimate.
    timed = opfuse.analyze(str(tmp_path / "run" / "baseline.trace.json"), measure=True)
    advice = next(f for f in timed.findings if f["rule"] == "channels_last")
    assert advice["estimated"] is True and advice["estimate"].startswith("convolutions timed in both layouts"), advice


def test_profile_and_analyze_name_module_paths_forward_and_backward(tmp_path):
    model, inputs, loss = tiny_effnet()
    path = opfuse.profile(model, inputs, loss, steps=1, path=str(tmp_path / "t.json"))
    trace = json.load(open(path))
    scopes = {e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"}
    assert "_blocks.1._swish" in scopes and "_blocks.1._bn0" in scopes
    a = opfuse.analyze(path)
    silu = next(f for f in a.findings if f["rule"] == "silu")
    wheres = [l["location"] for l in silu["locations"]]
    assert any(w.endswith("._swish (backward)") for w in wheres), wheres
    bn = next(f for f in a.findings if f["rule"] == "batch_norm_silu")
    assert all(l["location"].startswith(("_blocks.", "_bn")) for l in bn["locations"]), bn["locations"]
    with pytest.raises(FileNotFoundError):
        opfuse.analyze(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="already exists"):
        opfuse.profile(model, inputs, loss, path=path)


class InlineNet(nn.Module):
    """Chains written inside forwards, a module that does not trace, and one called with two
    different non-tensor arguments."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.se = nn.Conv2d(8, 8, 1)
        self.head = nn.Linear(8, 4)
        self.scaled = Scaled()
        self.branchy = Branchy()

    def forward(self, x):
        y = F.silu(self.bn(self.conv(x)))
        y = y * torch.sigmoid(y)
        y = self.scaled(y, 2.0) + self.scaled(y, 3.0)
        g = self.se(y.mean((2, 3), keepdim=True))
        y = torch.sigmoid(g) * y
        y = self.branchy(y)
        return self.head(y.mean((2, 3)))


class Scaled(nn.Module):
    def forward(self, x, k):
        return k * (x * torch.sigmoid(x))


class Branchy(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: fx cannot trace it
            return x * torch.sigmoid(x)
        return x


def test_patch_rewrites_inline_chains_in_place_and_reports_what_does_not_trace():
    model = InlineNet()
    x = torch.randn(2, 3, 6, 6)
    reference = copy.deepcopy(model)
    done = dict(opfuse.patch(model, (x,), lambda out: out.square().mean()))
    assert done.get("silu", 0) >= 2 and done.get("se_gate") == 1 and done.get("batch_norm_silu") == 1, done
    assert "opfuse" in str(model.forward.graphs[True])
    assert "forward" not in model.branchy.__dict__, "a module that does not trace is left as it was"
    # Same function, in float64, forward and backward; the other argument value runs the original.
    model.double()
    reference.double()
    xd = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    a, b = reference(xd), model(xd)
    assert torch.allclose(a, b, rtol=0, atol=1e-10)
    assert torch.allclose(reference.scaled(xd, 5.0), model.scaled(xd, 5.0), rtol=0, atol=1e-12)
    a.sum().backward()
    b.sum().backward()
    for (n, p), (_, q) in zip(reference.named_parameters(), model.named_parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=0, atol=1e-9), n
    model.eval()
    reference.eval()
    assert torch.allclose(reference(xd), model(xd), rtol=0, atol=1e-10)


class Swish(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


def test_patch_verifies_in_float32_as_well_as_float64(monkeypatch):
    def swish_net():
        torch.manual_seed(SEED)
        return nn.Sequential(nn.Linear(8, 8), Swish(), nn.Linear(8, 4))

    x = torch.randn(4, 8)
    loss = lambda out: out.square().mean()  # noqa: E731
    assert "silu" in dict(opfuse.patch(swish_net(), (x,), loss))

    class HalfwaySiLU(opfuse.nn.SiLU):
        """Exact in float64, but float32 rounded through bfloat16 (~3e-3 relative, 30× the
        allowance): only a float32 check sees it."""

        def forward(self, x):
            y = super().forward(x)
            return y if y.dtype == torch.float64 else y.bfloat16().to(y.dtype)

    monkeypatch.setattr(opfuse.nn, "SiLU", HalfwaySiLU)
    model = swish_net()
    assert "silu" not in dict(opfuse.patch(model, (x,), loss))
    assert type(model[1]) is Swish, "a rewrite that failed verification leaves the model as it was"


def test_the_tuned_model_copies_and_pickles_its_state():
    model = InlineNet()
    x = torch.randn(2, 3, 6, 6)
    opfuse.patch(model, (x,))
    twin = copy.deepcopy(model)
    assert twin.forward.module is twin
    assert torch.allclose(twin(x), model(x))


def test_the_llama_style_model_trained_as_llama2c_trains_it_has_the_loss_in_its_forward_fused(tmp_path):
    model, inputs, loss = llama.factory(batch_size=2, seq_len=16, vocab_size=64, seed=SEED, loss_inside=True)
    _, (tokens,), outside = llama.factory(batch_size=2, seq_len=16, vocab_size=64, seed=SEED)
    # the same loss as the one computed from the logits outside the model (ignore_index -1 ignores none)
    assert torch.equal(inputs[0], tokens) and torch.equal(loss(model(*inputs)), outside(model(tokens)))
    result = opfuse.tune(model, inputs, loss, out=str(tmp_path / "inside"), **QUICK)
    ce = next(r for r in result.replacements if r.rule == "cross_entropy")
    assert ce.verified and ce.kept and ce.places == 1, ce


def test_llama_rms_norm_and_swiglu_are_replaced_and_verified_with_module_paths(tmp_path):
    model, inputs, loss = llama.factory(batch_size=2, seq_len=16, vocab_size=64, seed=SEED)
    result = opfuse.tune(model, inputs, loss, out=str(tmp_path / "llama"), **QUICK)
    # Each block's `h = x + attention(…)` then ffn_norm(h), h on to the last add: add_rms_norm (fx).
    add = next(r for r in result.replacements if r.rule == "add_rms_norm")
    assert add.verified and add.kept and add.places == 2, add
    # Alone on the model, rms_norm swaps every norm; after add_rms_norm, the ones left: each block's
    # attention_norm (its add is in the block before, across the call) and the final norm.
    rms = next(r for r in result.replacements if r.rule == "rms_norm")
    assert rms.verified and rms.kept and rms.places == 5, rms  # 2 layers × 2 norms + the final norm
    assert isinstance(result.model.layers[1].forward, opfuse.rewrite.FusedForward)
    assert isinstance(result.model.layers[1].ffn_norm, opfuse.nn.RMSNorm)
    # llama2.c's feed-forward, w2(F.silu(w1(x)) * w3(x)): the fx pass finds silu(·) · (·) per layer.
    swiglu = next(r for r in result.replacements if r.rule == "swiglu")
    assert swiglu.verified and swiglu.kept and swiglu.places == 2, swiglu
    norm = result.model.layers[0].attention_norm
    assert isinstance(norm, opfuse.nn.RMSNorm) and norm.eps == model.layers[0].attention_norm.eps and norm.in_float
    assert norm.weight is not model.layers[0].attention_norm.weight  # a copy's parameter
    # The tuned model trains as the original: float32 outputs and gradients within float32 rounding.
    tokens = inputs[0]
    ref, got = copy.deepcopy(model), copy.deepcopy(result.model)
    a, b = ref(tokens), got(tokens)
    a.float().pow(2).mean().backward()
    b.float().pow(2).mean().backward()
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    for (n, p), (_, q) in zip(ref.named_parameters(), got.named_parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-3, atol=1e-6), n
    an = opfuse.analyze(str(tmp_path / "llama" / "baseline.trace.json"))
    finding = next(f for f in an.findings if f["rule"] == "rms_norm")
    wheres = [l["location"] for l in finding["locations"]]
    assert any(w.startswith("layers.0.") and w.endswith("_norm") for w in wheres), wheres


class _Residual(nn.Module):
    """A residual add into an RMSNorm, its sum used again: after the norm (`late`) or before it."""

    def __init__(self, late):
        super().__init__()
        self.norm, self.late = llama.RMSNorm(24), late

    def forward(self, x, r):
        h = x + r
        if self.late:
            return self.norm(h) * 2 + h
        early = h * 3
        return self.norm(h) + early


def test_add_rms_norm_fx_lets_the_sum_escape_only_to_uses_after_the_norm():
    x, r = torch.randn(2, 5, 24), torch.randn(2, 5, 24)
    late = _Residual(late=True)
    reference = opfuse.rewrite.copy_model(late)
    done = dict(opfuse.patch(late, (x, r)))
    assert done.get("add_rms_norm") == 1 and "rms_norm" not in done, done
    assert isinstance(late.norm, opfuse.nn.RMSNorm)
    # float64, forward and both inputs' gradients (the sum's from both of its uses)
    xd, rd = x.double().requires_grad_(), r.double().requires_grad_()
    xe, re = x.double().requires_grad_(), r.double().requires_grad_()
    (reference.double()(xd, rd) ** 2).sum().backward()
    (late.double()(xe, re) ** 2).sum().backward()
    assert torch.allclose(xd.grad, xe.grad, rtol=1e-12, atol=1e-12)
    assert torch.allclose(rd.grad, re.grad, rtol=1e-12, atol=1e-12)
    # A use of h before the norm would read a value not yet computed there: not rewritten.
    early = _Residual(late=False)
    done = dict(opfuse.patch(early, (x, r)))
    assert "add_rms_norm" not in done and done.get("rms_norm") == 1, done


class _PostNorm(nn.Module):
    """BERT's output: LayerNorm(dense(x) + residual), the sum used nowhere else; then GPT-2's
    pre-norm block, whose sum goes on as the residual after ln_2."""

    def __init__(self):
        super().__init__()
        self.dense, self.out_norm, self.ln_2 = nn.Linear(24, 24), nn.LayerNorm(24), nn.LayerNorm(24, eps=1e-6)
        for p in (self.out_norm.weight, self.out_norm.bias, self.ln_2.weight, self.ln_2.bias):
            nn.init.normal_(p)  # not ones and zeros: a swapped weight and bias would show

    def forward(self, x, r):
        y = self.out_norm(self.dense(x) + r)
        h = y + r
        return h + self.dense(self.ln_2(h))


def test_add_layer_norm_fx_fuses_post_norm_and_pre_norm_residuals_with_exact_numerics():
    x, r = torch.randn(2, 5, 24), torch.randn(2, 5, 24)
    model = _PostNorm()
    reference = opfuse.rewrite.copy_model(model)
    done = dict(opfuse.patch(model, (x, r)))
    assert done.get("add_layer_norm") == 2, done
    # float64 against the unrewritten module: output and every gradient
    xd, rd = x.double().requires_grad_(), r.double().requires_grad_()
    xe, re = x.double().requires_grad_(), r.double().requires_grad_()
    ref, got = reference.double(), model.double()
    (ref(xd, rd) ** 2).sum().backward()
    (got(xe, re) ** 2).sum().backward()
    assert torch.allclose(xd.grad, xe.grad, rtol=1e-10, atol=1e-10)
    assert torch.allclose(rd.grad, re.grad, rtol=1e-10, atol=1e-10)
    for (n, p), (_, q) in zip(ref.named_parameters(), got.named_parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-10, atol=1e-10), n


def test_a_layer_norm_over_two_dimensions_is_not_fused():
    class TwoDims(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm((5, 24))

        def forward(self, x, r):
            return self.norm(x + r)

    done = dict(opfuse.patch(TwoDims(), (torch.randn(2, 5, 24), torch.randn(2, 5, 24))))
    assert "add_layer_norm" not in done, done


def test_an_fx_output_must_be_named_in_its_pattern():
    with pytest.raises(ValueError, match="output 'h' is not named"):
        opfuse.rewrite.FxPattern("rms_norm_module(x + r)", "opfuse.add_rms_norm_chain(x, r, rms_norm_module)", ["h"])


def adamw_by_dim(params):
    """AdamW as Llama recipes build it: matrices decayed, norms not."""
    params = list(params)
    return torch.optim.AdamW([dict(params=[p for p in params if p.dim() >= 2], weight_decay=0.1),
                              dict(params=[p for p in params if p.dim() < 2], weight_decay=0.0)], lr=3e-3)


def test_torchs_adamw_is_swapped_for_the_fused_one_after_its_step_verifies(tmp_path):
    model, inputs, loss = llama.factory(batch_size=2, seq_len=16, vocab_size=64, seed=SEED)
    result = opfuse.tune(model, inputs, loss, adamw_by_dim, out=str(tmp_path / "adamw"), **QUICK)
    adamw = next(r for r in result.replacements if r.rule == "fused_adamw")
    assert adamw.verified and adamw.kept and adamw.places == 1, adamw
    optimizer = result.optimizer(result.model.parameters())
    reference = adamw_by_dim(result.model.parameters())
    assert type(optimizer) is torch.optim.AdamW and opfuse.optim.is_fused(optimizer)  # torch's own fused step

    def options(o):
        return [{k: v for k, v in g.items() if k not in ("fused", "foreach")} for g in o.state_dict()["param_groups"]]
    assert options(optimizer) == options(reference)
    # The tuned run's trace steps the parameters in one op per group, not torch's per-tensor loop.
    an = opfuse.analyze(str(tmp_path / "adamw" / "tuned.trace.json"))
    assert not any(f["rule"] == "fused_adamw" for f in an.findings)


def test_an_optimizer_whose_step_is_off_fails_verification(tmp_path, monkeypatch):
    class Sloppy(opfuse.optim.AdamW):
        """One step in a thousand too long: invisible beside the gradients, not beside the updates."""
        def step(self, closure=None):
            for g in self.param_groups:
                g["lr"] *= 1.001
            super().step(closure)
            for g in self.param_groups:
                g["lr"] /= 1.001

    monkeypatch.setattr(opfuse.optim, "_torchs_fused", lambda built: None)  # opfuse's class takes over
    monkeypatch.setattr(opfuse.optim, "AdamW", Sloppy)
    model, inputs, loss = llama.factory(batch_size=2, seq_len=16, vocab_size=64, seed=SEED)
    result = opfuse.tune(model, inputs, loss, adamw_by_dim, out=str(tmp_path / "sloppy"), **QUICK)
    adamw = next(r for r in result.replacements if r.rule == "fused_adamw")
    assert not adamw.verified and not adamw.kept, adamw
    assert "optimizer update of" in adamw.why, adamw.why
    assert type(result.optimizer(result.model.parameters())) is torch.optim.AdamW


def test_gpt_attention_written_as_mingpt_writes_it_is_replaced_and_verified(tmp_path):
    model, inputs, loss = gpt.factory(batch_size=2, seq_len=32, n_embd=64, dropout=0.1, seed=SEED)
    result = opfuse.tune(model, inputs, loss, out=str(tmp_path / "gpt"), **QUICK)
    attention = next(r for r in result.replacements if r.rule == "attention")
    assert attention.verified and attention.kept and attention.places == 2, attention  # one per block
    assert result.to_json()["sample_unit"] == "sequences" and "sequences/s" in str(result)
    # minGPT's NewGELU, spelled out with math.sqrt(2 / π): torch's tanh GELU in its place.
    gelu = next(r for r in result.replacements if r.rule == "gelu_tanh")
    assert gelu.verified and gelu.kept and gelu.places == 2, gelu
    tuned = result.model
    assert isinstance(tuned.transformer.h[0].attn.forward, opfuse.rewrite.FusedForward)
    # Without dropout, the tuned model computes what the original does, forward and backward.
    # (copy_model, not copy.deepcopy: minGPT's mlpf lambda would still call the original's MLP.)
    ref, got = opfuse.rewrite.copy_model(model).eval(), opfuse.rewrite.copy_model(tuned).eval()
    tokens = inputs[0]
    a, b = ref(tokens), got(tokens)
    a.pow(2).mean().backward()
    b.pow(2).mean().backward()
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    for (n, p), (_, q) in zip(ref.named_parameters(), got.named_parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-3, atol=1e-6), n
    # The graph was specialised to T = 32: a shorter sequence runs the original forward, correctly.
    short = tokens[:, :20]
    assert torch.allclose(ref(short), got(short), rtol=1e-5, atol=1e-6)
    # In training, attention dropout is drawn: two calls differ, a seed repeats one.
    got.train()
    torch.manual_seed(3)
    first = got(tokens)
    torch.manual_seed(3)
    assert torch.equal(first, got(tokens)) and not torch.equal(first, got(tokens))


class _PaddedGpt2Attention(nn.Module):
    """GPT-2's attention called as its block calls it, with a padding mask: 0 or finfo.min."""

    def __init__(self):
        super().__init__()
        self.attn = gpt2.GPT2Attention(32, 4, 16, dropout=0.1)

    def forward(self, x, attention_mask):
        return self.attn(x, attention_mask=attention_mask)[0]


def test_gpt2_attention_written_as_hugging_face_writes_it_is_replaced_and_verified():
    model, inputs, loss = gpt2.factory(batch_size=2, seq_len=16, n_embd=64, seed=SEED)
    reference = copy.deepcopy(model)
    done = dict(opfuse.patch(model, inputs, loss))
    assert done.get("attention") == 2 and done.get("cross_entropy") == 1, done  # one attention per block
    model.eval(), reference.eval()
    got, ran = _opfuse_ops_run(model, *inputs)
    assert "opfuse::attention" in ran
    want = reference(*inputs)
    got.backward(), want.backward()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    for (n, p), (_, q) in zip(reference.named_parameters(), model.named_parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), n
    # Padding: sample 0's last 3 keys masked, on top of the causal slice. (Left padding masks a
    # row's every kept key, and its softmax then spreads over the places torch.where filled, which
    # get no gradient there: attention_chain runs such calls as written.)
    padded, x = _PaddedGpt2Attention(), torch.randn(2, 8, 32)
    mask = torch.zeros(2, 1, 1, 8)
    mask[0, ..., 5:] = torch.finfo(torch.float32).min
    reference = copy.deepcopy(padded)
    assert dict(opfuse.patch(padded, (x, mask), lambda y: y.pow(2).sum())).get("attention") == 1
    padded.eval(), reference.eval()
    xs = [x.clone().requires_grad_() for _ in range(2)]
    got, want = padded(xs[0], mask), reference(xs[1], mask)
    got.pow(2).sum().backward(), want.pow(2).sum().backward()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    assert torch.allclose(xs[0].grad, xs[1].grad, rtol=1e-4, atol=1e-5)


def _unpadded_and_padded(padded_from):
    """Calls (x,) and (x, mask) on x [2, 8, 32], sample 0 padded from key `padded_from` on (finfo.min)."""
    x, mask = torch.randn(2, 8, 32), torch.zeros(2, 1, 1, 8)
    mask[0, ..., padded_from:] = torch.finfo(torch.float32).min
    return (x,), (x, mask)


def _fused_attention_agrees(make, args):
    """A make() patched on args (verified in float32 and float64, forward and gradients) whose fused
    attention runs in eval and computes what an unpatched copy does: (model, copy, output)."""
    model = make()
    reference = copy.deepcopy(model)
    assert dict(opfuse.patch(model, args, lambda y: y.pow(2).sum())).get("attention") == 1, args[1:]
    model.eval(), reference.eval()
    got, ran = _opfuse_ops_run(model, *args)
    assert "opfuse::attention" in ran
    assert torch.allclose(got, reference(*args), rtol=1e-5, atol=1e-6)
    return model, reference, got


class _GptNeoAttention(gpt2.GPT2Attention):
    """GPT-Neo's _attn (transformers 4.36): q and k in float32, no scale, torch.tensor fill."""

    def _attn(self, query, key, value, attention_mask=None):
        query, key = query.to(torch.float32), key.to(torch.float32)
        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length: key_length, :key_length]
        mask_value = torch.tensor(torch.finfo(attn_weights.dtype).min, dtype=attn_weights.dtype).to(attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights, mask_value)
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1).to(value.dtype)
        return torch.matmul(self.attn_dropout(attn_weights), value), attn_weights


class _GptJAttention(gpt2.GPT2Attention):
    """GPT-J's _attn (transformers 4.36): q and k in float32, divided by sqrt(d) after the where."""

    def __init__(self, *args):
        super().__init__(*args)
        self.scale_attn = torch.sqrt(torch.tensor(self.head_dim, dtype=torch.float32)).to(torch.get_default_dtype())

    def _attn(self, query, key, value, attention_mask=None):
        query, key = query.to(torch.float32), key.to(torch.float32)
        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        causal_mask = self.bias[:, :, key.size(-2) - query.size(-2): key.size(-2), :key.size(-2)]
        mask_value = torch.tensor(torch.finfo(attn_weights.dtype).min, dtype=attn_weights.dtype).to(attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights, mask_value)
        attn_weights = attn_weights / self.scale_attn
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1).to(value.dtype)
        return torch.matmul(self.attn_dropout(attn_weights), value), attn_weights


class _PhiAttention(gpt2.GPT2Attention):
    """Phi's attention core (transformers 4.36): q and k in float32, / sqrt(d), + the additive
    causal mask, softmax in float32 and back to v's dtype, the dropout module."""

    def _attn(self, query, key, value, attention_mask=None):
        query, key = query.to(torch.float32), key.to(torch.float32)
        attn_weights = torch.matmul(query, key.transpose(2, 3)) / math.sqrt(self.head_dim)
        attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(value.dtype)
        return torch.matmul(self.attn_dropout(attn_weights), value), attn_weights


@pytest.mark.parametrize("attention", [_GptNeoAttention, _GptJAttention, _PhiAttention])
def test_gpt_neo_gpt_j_and_phi_attention_upcast_to_float32_is_replaced_and_verified(attention):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = attention(32, 4, 16, 0.1)

        def forward(self, x, attention_mask=None):
            return self.attn(x, attention_mask=attention_mask)[0]

    x, lowest = torch.randn(2, 8, 32), torch.finfo(torch.float32).min
    mask = torch.zeros(2, 1, 1, 8)
    mask[0, ..., 5:] = lowest
    if attention is _PhiAttention:  # Phi's mask holds the causal part too (Hugging Face's 4-d mask)
        causal = torch.full((2, 1, 8, 8), lowest).triu(1)
        padded = causal.clone()
        padded[0, ..., 5:] = lowest
        calls = ((x, causal), (x, padded))
    else:
        calls = ((x,), (x, mask))
    for args in calls:
        # verified in float64 too: the float64 probe keeps the q and k that `.to(torch.float32)` asks
        model, reference, _ = _fused_attention_agrees(Block, args)
    # bfloat16 weights: q and k upcast, v not; the chain runs in float32 and returns bfloat16
    model.bfloat16(), reference.bfloat16()
    got, want = model(x.bfloat16(), args[1]), reference(x.bfloat16(), args[1])
    assert got.dtype == torch.bfloat16 and torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_gpt_neox_baddbmm_attention_is_replaced_and_verified():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = gpt_neox.GPTNeoXAttention(32, 4, 16, 0.1)

        def forward(self, x, attention_mask=None):
            return self.attn(x, attention_mask=attention_mask)[0]

    for args in _unpadded_and_padded(5):
        model, _, _ = _fused_attention_agrees(Block, args)
        code = str(model.attn.forward.graphs[True])
        assert "baddbmm" not in code and "zeros" not in code, code  # the [B·H, T, S] scores are never made


class _T5Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = t5.T5Attention()  # dropout 0.1, through F.dropout

    def forward(self, x, mask=None):
        return self.attention(x, mask)[0]


def test_t5_attention_with_its_trained_position_bias_is_replaced_and_its_gradient_kept():
    for args in _unpadded_and_padded(6):
        # the bias embedding's gradient verified among the others (F.dropout passing through)
        model, reference, got = _fused_attention_agrees(_T5Block, args)
        got.pow(2).sum().backward(), reference(*args).pow(2).sum().backward()
        bias, expected = (m.attention.relative_attention_bias.weight.grad for m in (model, reference))
        assert bias.abs().max() > 0 and torch.allclose(bias, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("factory", [t5.factory, gpt_neox.factory])
def test_the_t5_and_gpt_neox_test_models_have_every_attention_fused(factory):
    model, inputs, loss_fn = factory(batch_size=2, seq_len=16, n_layer=2, seed=SEED)
    assert dict(opfuse.patch(model, inputs, loss_fn)).get("attention") == 2


def test_a_bool_mask_added_to_the_scores_is_added_as_numbers():
    """`q @ kt + b` with a bool b adds 0 or 1 (torch promotes it); the op would read a bool mask as
    the places that take part."""
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float64) for _ in range(3))
    b = torch.rand(5, 5) > 0.5
    got = opfuse.functional.attention_chain(q, k.transpose(-2, -1), v, 1.0, None, b, None)
    want = torch.softmax(q @ k.transpose(-2, -1) + b, dim=-1) @ v
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    got32 = opfuse.functional.attention_chain(q.float(), k.float().transpose(-2, -1), v.float(), 1.0, None, b, None)
    assert torch.allclose(got32.double(), want, rtol=1e-5, atol=1e-5)


def test_a_loss_on_logits_cast_to_float_is_verified_in_float64():
    """Hugging Face's ForCausalLMLoss takes logits.float(): a downcast in the float64 probe, which
    now keeps float64 there, so the fused cross-entropy is checked in float64 rather than rejected."""

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.lm_head = nn.Linear(32, 100, bias=False)

        def forward(self, h, labels):
            logits = self.lm_head(h).float()
            shift_labels = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
            return F.cross_entropy(logits.view(-1, 100), shift_labels.view(-1), ignore_index=-100, reduction="mean")

    model, h, labels = Head(), torch.randn(2, 8, 32), torch.randint(100, (2, 8))
    workload = opfuse.PythonWorkload(model, (h, labels), lambda loss: loss, None, opfuse._rules(None))
    candidate = workload.clone()
    assert candidate.apply(next(r for r in opfuse._rules(None) if r.name == "cross_entropy")) == 1
    verdict = opfuse._C.verify(workload, candidate, 11)
    assert verdict[0], verdict
    # the float64 probe computed in float64: its outputs and gradients are float64 and agree closely
    outputs, grads, _ = workload.probe(torch.float64, 11, 0.0)
    fused, fused_grads, _ = candidate.probe(torch.float64, 11, 0.0)
    assert outputs[0].dtype == torch.float64
    assert torch.allclose(outputs[0], fused[0], rtol=1e-12, atol=0)
    assert torch.allclose(grads[0][1], fused_grads[0][1], rtol=1e-10, atol=1e-14)


def test_the_float64_probe_keeps_float64_only_where_the_model_still_runs():
    """Casts to float32 keep float64 in the float64 probe, but not a copy asked for, and a model
    that then mixes float64 with float32 tensors it made (index_put into a float32 buffer) runs as
    written rather than losing its float64 check."""
    from opfuse.workload import _KeepsFloat64

    x = torch.randn(3, dtype=torch.float64)
    with _KeepsFloat64():
        assert x.float() is x and x.to(torch.float32).dtype == torch.float64
        assert x.to(torch.float32, copy=True).dtype == torch.float32
        assert F.softmax(x, dim=0, dtype=torch.float32).dtype == torch.float64
        # q and k cast up beside v: no recursion through a cast the mode keeps
        q, v = torch.randn(1, 1, 4, 2), torch.randn(1, 1, 4, 2, dtype=torch.float64)
        out = opfuse.functional.attention_chain(q, q.transpose(-2, -1), v, 1.0, None, None, None)
        assert out.dtype == torch.float64

    class Buffered(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            buf = torch.zeros(x.shape[0], 4)
            buf[:, :] = self.lin(x).float()
            return buf

    workload = opfuse.PythonWorkload(Buffered(), (torch.randn(2, 4),), lambda y: y.sum(), None, [])
    outputs, grads, _ = workload.probe(torch.float64, 1, 0.0)
    assert outputs[0].dtype == torch.float32 and grads[0][1] is not None


def test_a_where_mask_is_fused_where_it_computes_what_is_written_and_runs_as_written_elsewhere():
    """torch.where(keep, scores, fill) + mask: forward and gradients as written, for a fill that
    absorbs the scores (fused) or not (-1e4), with a row masked whole, a left-padded sample (its
    first rows keep only padded keys) and a right-padded one."""
    T = 6
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scattered = torch.rand(T, T) > 0.5
    scattered[0] = False  # a row masked whole: uniform under a finite fill
    left, right = torch.zeros(2, 1, 1, T, dtype=torch.float64), torch.zeros(2, 1, 1, T, dtype=torch.float64)
    left[0, ..., :2] = right[0, ..., 4:] = torch.finfo(torch.float64).min
    for keep, extra in ((scattered | causal, None), (scattered, None), (causal, left), (causal, right)):
        for fill in (torch.finfo(torch.float64).min, -1e4):
            q, k, v = (torch.randn(2, 2, T, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
            f, g = torch.tensor(fill, dtype=torch.float64), torch.randn(2, 2, T, 4, dtype=torch.float64)
            got = opfuse.functional.attention_chain(q, k.transpose(-2, -1), v, 0.5, keep, extra, None, False, f)
            s = torch.where(keep, q @ k.transpose(-2, -1) * 0.5, f)
            want = torch.softmax(s if extra is None else s + extra, -1) @ v
            for a, b in zip((got,) + torch.autograd.grad(got, (q, k, v), g),
                            (want,) + torch.autograd.grad(want, (q, k, v), g)):
                assert torch.allclose(a, b, rtol=1e-10, atol=1e-12), (fill, extra)


def test_llama_attention_is_replaced_with_its_float_softmax_kept_for_float64(tmp_path):
    model, inputs, loss = llama.factory(batch_size=2, seq_len=16, vocab_size=64, seed=SEED)
    done = dict(opfuse.patch(model, inputs, loss))
    assert done.get("attention") == 2, done
    # The exact causal mask buffer became causal=True: the additive mask is not passed on.
    q = torch.randn(1, 2, 16, 8)
    mask = torch.full((1, 1, 16, 16), float("-inf")).triu(1)
    assert opfuse.functional._is_causal(mask, 16, 16, additive=True)
    assert not opfuse.functional._is_causal(mask.transpose(-1, -2), 16, 16, additive=True)
    out = opfuse.functional.attention_chain(q, q.transpose(-2, -1), q, 0.5, None, mask.transpose(-1, -2), None)
    ref = torch.softmax(q @ q.transpose(-2, -1) * 0.5 + mask.transpose(-1, -2), -1) @ q
    assert torch.allclose(out, ref, atol=1e-6)


class _HfEagerAttention(nn.Module):
    """Hugging Face's LlamaAttention (4.36) eager path, no rotary: scores / sqrt(head_dim) + mask,
    softmax(dtype=float32).to(q.dtype), F.dropout, @ v."""
    def __init__(self, dim, heads, dropout=0.0, scaling=False):
        super().__init__()
        self.heads, self.head_dim, self.attention_dropout, self.scaling = heads, dim // heads, dropout, scaling
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        bsz, q_len, _ = hidden_states.size()
        q = self.q_proj(hidden_states).view(bsz, q_len, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(bsz, q_len, self.heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(bsz, q_len, self.heads, self.head_dim).transpose(1, 2)
        if self.scaling:
            attn_weights = torch.matmul(q, k.transpose(2, 3)) * self.head_dim ** -0.5
        else:
            attn_weights = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(q.dtype)
        attn_weights = nn.functional.dropout(attn_weights, p=self.attention_dropout, training=self.training)
        attn_output = torch.matmul(attn_weights, v)
        attn_output = attn_output.transpose(1, 2).contiguous().reshape(bsz, q_len, -1)
        attn_output = self.o_proj(attn_output)
        if not output_attentions:
            attn_weights = None
        return attn_output, attn_weights

class _HfEagerModel(nn.Module):
    def __init__(self, dim=32, heads=4, **kw):
        super().__init__()
        self.attn = _HfEagerAttention(dim, heads, **kw)
    def forward(self, x):
        T = x.shape[1]
        mask = torch.full((T, T), torch.finfo(x.dtype).min, dtype=x.dtype, device=x.device).triu(1)[None, None]
        out, _ = self.attn(x, attention_mask=mask)
        return out


def _opfuse_ops_run(module, *args):
    with torch.autograd.profiler.profile() as prof:
        out = module(*args)
    return out, sorted({e.name for e in prof.function_events if e.name.startswith("opfuse::")})


@pytest.mark.parametrize("scaling", [False, True])
def test_hugging_face_eager_attention_is_replaced_with_its_mask_found_causal(scaling):
    model, x = _HfEagerModel(scaling=scaling), torch.randn(2, 8, 32)
    reference = copy.deepcopy(model)
    assert dict(opfuse.patch(model, (x,), lambda s: s.pow(2).mean())).get("attention") == 1
    got, ran = _opfuse_ops_run(model, x)
    assert "opfuse::attention" in ran
    assert torch.allclose(got, reference(x), rtol=1e-5, atol=1e-6)
    # finfo(dtype).min above the diagonal is the causal mask: the op skips those tiles
    mask = torch.full((8, 8), torch.finfo(torch.float32).min).triu(1)
    assert opfuse.functional._is_causal(mask, 8, 8, additive=True)
    assert not opfuse.functional._is_causal(mask.tril(-1), 8, 8, additive=True)
    # F.dropout's probability reaches the op in training only
    q = torch.randn(1, 2, 8, 4)
    torch.manual_seed(0)
    dropped = opfuse.functional.attention_chain(q, q.transpose(-2, -1), q, 0.5, None, mask, 0.9, True)
    kept = opfuse.functional.attention_chain(q, q.transpose(-2, -1), q, 0.5, None, mask, 0.0, True)
    assert not torch.allclose(dropped, kept)


class _Returns5(nn.Module):
    """An attention module that returns its probabilities (transformers 5's eager attention) inside
    a decoder layer that reads them or drops them, or whose parent also calls the module itself."""

    def __init__(self, dim=32, heads=4, uses_weights=False):
        super().__init__()
        self.attn, self.heads, self.uses_weights = _Eager5(dim, heads), heads, uses_weights

    def forward(self, x, mask):
        out, weights = self.attn(x, mask)
        return out + weights.mean() if self.uses_weights else out


class _Eager5(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(dim, dim, bias=False) for _ in range(3))

    def forward(self, x, mask):
        b, t, _ = x.size()
        q, k, v = (f(x).view(b, t, self.heads, self.head_dim).transpose(1, 2) for f in (self.q_proj, self.k_proj, self.v_proj))
        w = torch.matmul(q, k.transpose(2, 3)) * self.head_dim ** -0.5
        w = nn.functional.softmax(w + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        w = nn.functional.dropout(w, p=0.0, training=self.training)
        return torch.matmul(w, v).transpose(1, 2).reshape(b, t, -1), w


class _LayerReturningThem(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = _Eager5(32, 4)

    def forward(self, x, mask):
        out, weights = self.attn(x, mask)
        return x + out, weights


class _PassesThemOn(nn.Module):
    """T5's shape: the layer returns the attention's probabilities on up, from inside a ModuleList,
    to the block that drops them."""

    def __init__(self):
        super().__init__()
        self.layer = nn.ModuleList([_LayerReturningThem()])

    def forward(self, x, mask):
        out, _ = self.layer[0](x, mask)
        return out


class _CallsItsGrandchild(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = _Returns5()

    def forward(self, x, mask):
        _, weights = self.layer.attn(x, mask)  # read here, past the layer that drops them
        return self.layer(x, mask) + weights.mean()


@pytest.mark.parametrize("shape", ["drops them", "uses them", "passes them on"])
def test_attention_returning_its_probabilities_is_fused_only_where_every_caller_drops_them(shape):
    """transformers 5's eager attention returns its probabilities beside its output; a fused
    attention has none. Where every call of the module comes from its parent's graph, which takes
    them out and never uses them (or returns them to callers that do not), the rewrite returns
    None there (as transformers' SDPA does)."""
    x = torch.randn(2, 8, 32)
    mask = torch.full((8, 8), torch.finfo(torch.float32).min).triu(1)[None, None]
    model = _PassesThemOn() if shape == "passes them on" else _Returns5(uses_weights=shape == "uses them")
    reference = copy.deepcopy(model)
    fused = shape != "uses them"
    done = dict(opfuse.patch(model, (x, mask), lambda s: s.pow(2).mean()))
    assert done.get("attention", 0) == fused, done
    got, ran = _opfuse_ops_run(model, x, mask)
    assert ("opfuse::attention" in ran) == fused
    assert torch.allclose(got, reference(x, mask), rtol=1e-5, atol=1e-6)
    attention = model.get_submodule("layer.0.attn" if shape == "passes them on" else "attn")
    assert (attention(x, mask)[1] is None) == fused


def test_a_chain_whose_value_is_used_outside_it_is_named_in_the_reason(tmp_path):
    """The layer reads the probabilities its attention returns: tune says which value of the chain
    is used where, not only that nothing matched."""
    x = torch.randn(2, 8, 32)
    mask = torch.full((8, 8), torch.finfo(torch.float32).min).triu(1)[None, None]
    result = opfuse.tune(_Returns5(uses_weights=True), (x, mask), lambda s: s.pow(2).mean(), out=str(tmp_path / "run"),
                         **QUICK)
    why = next(n for n in result.not_applied if n["rule"] == "attention")["why"]
    assert "attn: the chain's dropout is also returned by the forward" in why, why


def test_attention_probabilities_read_by_another_caller_keep_the_attention_as_written(tmp_path):
    """The layer drops them, but its parent calls the attention module itself and reads them: the
    layer's graph is not every caller (one recorded call of the layer, two of the module), so no
    rewrite is tried, rather than one that fails to run and is rejected."""
    x = torch.randn(2, 8, 32)
    mask = torch.full((8, 8), torch.finfo(torch.float32).min).triu(1)[None, None]
    result = opfuse.tune(_CallsItsGrandchild(), (x, mask), lambda s: s.pow(2).mean(), out=str(tmp_path / "run"), **QUICK)
    assert "attention" not in {r.rule for r in result.replacements}
    attention = next(n for n in result.not_applied if n["rule"] == "attention")
    assert "layer.attn: the chain's dropout is also returned by the forward" in attention["why"], attention


def _rotary_ops_run(module, *args):
    """module(*args) and how many opfuse::rotary_embedding calls it made (torch 1.13's profiler
    now and then also records the call the autograd kernel makes inside: not counted)."""
    with torch.autograd.profiler.profile() as prof:
        out = module(*args)
    return out, sum(e.name == "opfuse::rotary_embedding" and not (e.cpu_parent and e.cpu_parent.name == e.name)
                    for e in prof.function_events)


def test_llama_rotary_embedding_is_replaced_and_computes_the_same(tmp_path):
    """llama2.c's real-arithmetic RoPE on interleaved pairs, per layer for q and k."""
    model, inputs, loss = llama.factory(batch_size=2, seq_len=16, vocab_size=64, seed=SEED)
    reference = opfuse.rewrite.copy_model(model)
    done = dict(opfuse.patch(model, inputs, loss))
    assert done.get("rotary_embedding") == 4, done  # 2 layers × (q, k)
    b, ran = _rotary_ops_run(model, *inputs)
    assert ran == 4  # float32: the fused op, not the chain
    assert torch.allclose(reference(*inputs), b, rtol=1e-5, atol=1e-6)


class _RotateHalf(nn.Module):
    """Hugging Face's apply_rotary_pos_emb (rotate_half with x[..., :h]) and litgpt's chunk spelling."""

    def __init__(self, dim):
        super().__init__()
        self.wq, self.wk = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x, cos, sin):
        q, k = self.wq(x), self.wk(x)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        h = q.shape[-1] // 2
        q_embed = (q * cos) + (torch.cat((-q[..., h:], q[..., :h]), dim=-1) * sin)
        k1, k2 = k.chunk(2, dim=-1)
        k_embed = k * cos + torch.cat((-k2, k1), dim=-1) * sin
        return q_embed @ k_embed.transpose(-1, -2)


def test_rotate_half_spellings_are_replaced_and_verified():
    B, H, T, D = 2, 3, 8, 16
    theta = torch.rand(B, T, D // 2) * 50
    cos, sin = torch.cat((theta.cos(), theta.cos()), -1), torch.cat((theta.sin(), theta.sin()), -1)
    x = torch.randn(B, H, T, D)
    model = _RotateHalf(D)
    expected = model(x, cos, sin)
    done = dict(opfuse.patch(model, (x, cos, sin), lambda s: s.pow(2).mean()))
    assert done.get("rotary_embedding") == 2, done
    got, ran = _rotary_ops_run(model, x, cos, sin)
    assert ran == 2
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)
    # A cut that is not D/2 is not the rotate-half pairing: the chain runs as written.
    y = torch.randn(2, 6)
    c, s = torch.randn(2, 6), torch.randn(2, 6)
    written = y * c + torch.cat((-y[..., 2:], y[..., :2]), dim=-1) * s
    assert torch.equal(opfuse.functional.rotate_half_chain(y, c, s, 2), written)


def _rotate_every_two(x):
    x1 = x[:, :, :, ::2]
    x2 = x[:, :, :, 1::2]
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)

def _gptj_rotary(tensor, sin, cos):
    sin = torch.repeat_interleave(sin[:, :, None, :], 2, 3)
    cos = torch.repeat_interleave(cos[:, :, None, :], 2, 3)
    return (tensor * cos) + (_rotate_every_two(tensor) * sin)

class _GptJAttention(nn.Module):
    """Hugging Face's GPT-J attention's rotary part: q and k [B, T, H, D], a partial rotary_dim."""
    def __init__(self, dim, heads, rotary_dim, max_pos=64):
        super().__init__()
        self.heads, self.rotary_dim = heads, rotary_dim
        self.q_proj, self.k_proj = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2) / rotary_dim))
        sinusoid = torch.einsum("i , j -> i j", torch.arange(max_pos).float(), inv_freq).float()
        self.register_buffer("embed_positions", torch.cat((torch.sin(sinusoid), torch.cos(sinusoid)), dim=1))

    def forward(self, hidden_states, position_ids):
        B, T, C = hidden_states.shape
        query = self.q_proj(hidden_states).view(B, T, self.heads, -1)
        key = self.k_proj(hidden_states).view(B, T, self.heads, -1)
        sincos = self.embed_positions[position_ids]
        sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)
        k_rot, k_pass = key[:, :, :, : self.rotary_dim], key[:, :, :, self.rotary_dim :]
        q_rot, q_pass = query[:, :, :, : self.rotary_dim], query[:, :, :, self.rotary_dim :]
        k_rot = _gptj_rotary(k_rot, sin, cos)
        q_rot = _gptj_rotary(q_rot, sin, cos)
        key = torch.cat([k_rot, k_pass], dim=-1).transpose(1, 2)
        query = torch.cat([q_rot, q_pass], dim=-1).transpose(1, 2)
        return query @ key.transpose(-1, -2)

def test_gpt_j_rotate_every_two_is_replaced_and_verified():
    model, x = _GptJAttention(32, 2, 8), torch.randn(2, 8, 32)
    positions = torch.arange(8)[None].expand(2, 8)
    reference = copy.deepcopy(model)
    assert dict(opfuse.patch(model, (x, positions), lambda s: s.pow(2).mean())).get("rotary_embedding") == 2
    got, fused = _rotary_ops_run(model, x, positions)
    assert fused == 2
    assert torch.allclose(got, reference(x, positions), rtol=1e-5, atol=1e-5)
    # the ellipsis spelling, and a table the op cannot take (it asks for a gradient): the chain
    y, c, s = torch.randn(3, 6), torch.randn(3, 6), torch.randn(3, 6, requires_grad=True)
    written = y * c + torch.stack((-y[..., 1::2], y[..., ::2]), dim=-1).flatten(-2) * s
    assert torch.equal(opfuse.functional.rotate_every_two_chain(y, c, s), written)


class _MetaRotary(nn.Module):
    """Meta's llama apply_rotary_emb: complex multiply on interleaved pairs."""

    def __init__(self, dim, heads, seq_len):
        super().__init__()
        self.heads = heads
        self.wq, self.wk = nn.Linear(dim, dim), nn.Linear(dim, dim)
        freqs = 1.0 / (10000.0 ** (torch.arange(0, dim // heads, 2).float() / (dim // heads)))
        angles = torch.outer(torch.arange(seq_len).float(), freqs)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles))

    def forward(self, x):
        B, T, C = x.shape
        xq, xk = self.wq(x).view(B, T, self.heads, -1), self.wk(x).view(B, T, self.heads, -1)
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        freqs_cis = self.freqs_cis[:T].view(1, T, 1, -1)
        xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3).type_as(xq)
        xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3).type_as(xk)
        return xq_out.transpose(1, 2) @ xk_out.transpose(1, 2).transpose(-1, -2)


def _patch_expecting_rotary(model, x, places):
    """Patches model, whose rotary chains must become `places` opfuse ops computing the same."""
    expected = model(x)
    done = dict(opfuse.patch(model, (x,), lambda s: s.pow(2).mean()))
    assert done.get("rotary_embedding") == places, done
    got, ran = _rotary_ops_run(model, x)
    assert ran == places
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_meta_complex_rotary_is_replaced_and_verified():
    _patch_expecting_rotary(_MetaRotary(32, 4, 8), torch.randn(2, 8, 32), 2)


def _reshape_for_broadcast(freqs_cis, x):
    """Meta's: the [T, D/2] table viewed to broadcast over x's batch and heads; it asks x.ndim."""
    return freqs_cis.view(*[d if i == 1 or i == x.ndim - 1 else 1 for i, d in enumerate(x.shape)])


class _MetaTransformerRotary(_MetaRotary):
    """Meta's apply_rotary_emb broadcasting its table with reshape_for_broadcast, in a forward
    that assigns to an attribute as Meta's Transformer does (`self.freqs_cis =
    self.freqs_cis.to(h.device)`; fx traces the module itself, so a proxy is assigned)."""

    def __init__(self, dim, heads, seq_len):
        super().__init__(dim, heads, seq_len)
        self.gain = torch.ones(dim // heads)  # a plain tensor attribute

    def forward(self, x):
        self.gain = self.gain.to(x.device)
        B, T, C = x.shape
        xq = self.wq(x).view(B, T, self.heads, -1)
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xq_out = torch.view_as_real(xq_ * _reshape_for_broadcast(self.freqs_cis[:T], xq_)).flatten(3).type_as(xq)
        return xq_out.transpose(1, 2) * self.gain


def test_a_forward_that_assigns_and_asks_ndim_traces_and_keeps_its_attributes():
    model = _MetaTransformerRotary(32, 4, 8)
    _patch_expecting_rotary(model, torch.randn(2, 8, 32), 1)
    assert type(model.gain) is torch.Tensor  # not the proxy fx assigned while tracing


def test_verification_casts_a_complex_table_to_the_complex_type_of_its_precision():
    """Module.to(float64) keeps only a complex buffer's real part: verification would then check a
    rotary rewrite on a table of cosines alone."""
    model = _MetaRotary(32, 4, 8)
    table = model.freqs_cis.clone()
    for dtype, complex_dtype in ((torch.float64, torch.complex128), (torch.float32, torch.complex64)):
        cast = opfuse.workload._cast(copy.deepcopy(model), dtype)
        assert cast.wq.weight.dtype == dtype and cast.freqs_cis.dtype == complex_dtype
        assert torch.equal(cast.freqs_cis.to(torch.complex64), table)


class _NormWithBroadcastWeight(nn.Module):
    """RMSNorm without a cast, its weight [1, 1, D]: the fused op takes a 1-D weight, so the
    replacement runs the composite, which must compute in x's dtype as the module does."""

    def __init__(self, dim):
        super().__init__()
        self.eps = 1e-5
        self.weight = nn.Parameter(torch.rand(1, 1, dim) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.weight


def test_an_rms_norm_the_fused_op_cannot_take_is_replaced_by_a_composite_of_its_precision():
    model = nn.Sequential(nn.Linear(16, 16), _NormWithBroadcastWeight(16), nn.Linear(16, 4))
    x = torch.randn(2, 5, 16)
    expected = model(x)
    done = dict(opfuse.patch(model, (x,), lambda s: s.pow(2).mean()))
    assert done.get("rms_norm") == 1, done  # verified in float64 too
    assert torch.allclose(model(x), expected, rtol=1e-5, atol=1e-6)
    x64 = torch.randn(3, 16, dtype=torch.float64)
    norm = model[1]
    reference = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight.double()
    assert torch.allclose(norm.double()(x64), reference, rtol=1e-13, atol=0)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _HfAttention(nn.Module):
    """Hugging Face's current attention forward: position_embeddings=(cos, sin), a tuple, and
    **kwargs, through which the decoder passes nothing here."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)

    def forward(self, hidden_states, position_embeddings, attention_mask=None, **kwargs):
        B, T, C = hidden_states.shape
        q = self.q_proj(hidden_states).view(B, T, self.heads, -1).transpose(1, 2)
        k = self.k_proj(hidden_states).view(B, T, self.heads, -1).transpose(1, 2)
        cos, sin = position_embeddings
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q @ k.transpose(-1, -2)


class _HfRotaryModel(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.attn = _HfAttention(dim, heads)
        half = torch.arange(0, dim // heads, 2).float() / (dim // heads)
        self.register_buffer("inv_freq", 1.0 / 10000 ** half)

    def forward(self, x):
        freqs = torch.outer(torch.arange(x.shape[1]).float(), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return self.attn(x, position_embeddings=(emb.cos()[None], emb.sin()[None]))


def test_hugging_face_position_embeddings_tuple_and_kwargs_trace():
    model, x = _HfRotaryModel(32, 4), torch.randn(2, 8, 32)
    _patch_expecting_rotary(model, x, 2)
    # What Hugging Face ≥ 4.48 passes through **kwargs (flags, a tensor): a graph of its own
    cos_sin = (torch.randn(1, 8, 8), torch.randn(1, 8, 8))
    positions = torch.arange(8)[None]
    for kwargs in ({"output_attentions": False}, {"use_cache": False, "position_ids": positions}):
        got, fused = _rotary_ops_run(lambda: model.attn(x, cos_sin, **kwargs))
        assert fused == 2, kwargs
        assert torch.allclose(got, _HfAttention.forward(model.attn, x, cos_sin), rtol=1e-5, atol=1e-6)
    # a key that cannot be a parameter, or a container of tensors: the module's own forward runs
    for kwargs in ({"class": 1}, {"extra": {"ids": positions}}):
        with pytest.warns(RuntimeWarning, match=r"attn does not trace for this call"):
            assert torch.equal(model.attn(x, cos_sin, **kwargs), _HfAttention.forward(model.attn, x, cos_sin))


def test_a_call_at_another_length_gets_its_own_fused_graphs_up_to_a_limit():
    """The graph asked T of its input: a call at another T is traced and rewritten alike when it
    first comes, computing what the original does; past MAX_SPECIALISATIONS the original runs."""
    model, x = _HfRotaryModel(32, 4), torch.randn(2, 8, 32)
    reference = copy.deepcopy(model)
    _patch_expecting_rotary(model, x, 2)
    limit = opfuse.rewrite.MAX_SPECIALISATIONS
    for T in range(9, 9 + limit - 1):
        other = torch.randn(2, T, 32)
        got, fused = _rotary_ops_run(model, other)
        assert fused == 2, T
        assert torch.allclose(got, reference(other), rtol=1e-5, atol=1e-5)
    assert len(model.attn.forward.specialisations) == limit
    other = torch.randn(3, 5, 32)
    with pytest.warns(RuntimeWarning, match=f"attn has been called with more than {limit}"):
        got, fused = _rotary_ops_run(model, other)
    assert fused == 0 and torch.allclose(got, reference(other), rtol=1e-5, atol=1e-5)
    twin = copy.deepcopy(model)  # the copy keeps its own graphs
    assert torch.allclose(twin(x), reference(x), rtol=1e-5, atol=1e-5)
    assert len(twin.attn.forward.specialisations) == limit


class _AsksDtypeAndDevice(nn.Module):
    """Hugging Face's additive mask from torch.finfo(x.dtype).min, Meta's torch.full(...,
    device=x.device), and a random keep mask drawn with x's shape and dtype, beside a Swish."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 3)

    def forward(self, x):
        x = self.proj(x)
        T = x.shape[1]
        mask = torch.full((T, T), torch.finfo(x.dtype).min, dtype=x.dtype, device=x.device).triu(1)
        keep = (torch.rand(x.shape[0], 1, 1, dtype=x.dtype, device=x.device) > 0.3).to(x.dtype)
        s = (x @ x.transpose(1, 2)).clamp(min=-1e4) + mask
        return s * torch.sigmoid(s) * keep


def test_a_forward_that_asks_dtype_and_device_traces_per_dtype_and_keeps_its_random_draws():
    model, x = _AsksDtypeAndDevice(), torch.randn(4, 5, 3)
    reference = copy.deepcopy(model)
    done = dict(opfuse.patch(model, (x,), lambda s: s.clamp(min=-1).pow(2).mean()))
    assert done.get("silu") == 1, done
    torch.manual_seed(2)
    first = model(x)
    torch.manual_seed(3)  # the keep mask is drawn at each call, not held from the trace
    assert not torch.equal(model(x), first)
    for dtype in (torch.float32, torch.float64):  # finfo(float64).min in float64's graph
        model.to(dtype), reference.to(dtype)
        torch.manual_seed(1)
        got = model(x.to(dtype))
        torch.manual_seed(1)
        assert torch.allclose(got, reference(x.to(dtype)), rtol=1e-6, atol=0), dtype
    assert len(model.forward.specialisations) == 2
    # What a graph holds of its tensors is what the forward asked: shapes alone do not make a
    # graph per dtype (verification's float64 pass runs the float32 call's graph)
    assert model.forward.specialisations[0].aspects == {"shape", "dtype", "device"}
    shapes_only = _HfRotaryModel(32, 4)
    _patch_expecting_rotary(shapes_only, torch.randn(2, 8, 32), 2)
    assert shapes_only.attn.forward.specialisations[0].aspects == {"shape"}
    shapes_only.double()(torch.randn(2, 8, 32, dtype=torch.float64))
    assert len(shapes_only.attn.forward.specialisations) == 1


class _NanoGptLoss(nn.Module):
    """nanoGPT's (and llama2.c's) loss in the forward: F.cross_entropy(logits.view(-1, V),
    targets.view(-1), ignore_index=-1), the logits returned too."""

    def __init__(self, vocab, dim):
        super().__init__()
        self.emb, self.lm_head = nn.Embedding(vocab, dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, idx, targets):
        logits = self.lm_head(self.emb(idx))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


class _HfLoss(_NanoGptLoss):
    """Hugging Face's: the logits shifted, a CrossEntropyLoss module (ignore_index -100)."""

    def __init__(self, vocab, dim):
        super().__init__(vocab, dim)
        self.loss_fct = nn.CrossEntropyLoss(label_smoothing=0.1)

    def forward(self, idx, labels):
        logits = self.lm_head(self.emb(idx))
        shift_logits, shift_labels = logits[..., :-1, :].contiguous(), labels[..., 1:].contiguous()
        return self.loss_fct(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))


class _Hf436Loss(_NanoGptLoss):
    """Hugging Face 4.36's: the CrossEntropyLoss made in the forward (not a submodule)."""

    def forward(self, idx, labels):
        logits = self.lm_head(self.emb(idx))
        shift_logits, shift_labels = logits[..., :-1, :].contiguous(), labels[..., 1:].contiguous()
        loss_fct = nn.CrossEntropyLoss()
        return loss_fct(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))


@pytest.mark.parametrize("model_class, ignored", [(_NanoGptLoss, -1), (_HfLoss, -100), (_Hf436Loss, -100)])
def test_a_loss_computed_in_the_forward_takes_the_fused_cross_entropy(model_class, ignored):
    model = model_class(50, 16)
    idx, targets = torch.randint(0, 50, (3, 9)), torch.randint(0, 50, (3, 9))
    targets[0, :4] = ignored
    loss_of = (lambda out: out[1]) if model_class is _NanoGptLoss else (lambda out: out)
    reference = copy.deepcopy(model)
    assert dict(opfuse.patch(model, (idx, targets), loss_of)).get("cross_entropy") == 1
    got, ran = _opfuse_ops_run(model, idx, targets)
    assert "opfuse::cross_entropy" in ran
    expected = reference(idx, targets)
    assert torch.allclose(loss_of(got), loss_of(expected), rtol=1e-5, atol=1e-6)
    loss_of(got).backward()
    loss_of(expected).backward()
    assert torch.allclose(model.lm_head.weight.grad, reference.lm_head.weight.grad, rtol=1e-5, atol=1e-7)
    # classes at dim 1 of a [N, C, T] input are F.cross_entropy's own case: it runs as written
    x, t = torch.randn(2, 5, 3), torch.randint(0, 5, (2, 3))
    assert torch.equal(opfuse.functional.cross_entropy_chain(x, t), F.cross_entropy(x, t))


class _ShiftsItsLabels(_NanoGptLoss):
    """T5's: the decoder's inputs made in the forward by assigning into a fresh tensor's slices
    (`_shift_right`), the loss from the labels by a CrossEntropyLoss made there."""

    def forward(self, idx, labels):
        shifted = labels.new_zeros(labels.shape)
        shifted[..., 1:] = labels[..., :-1].clone()
        shifted[..., 0] = 0
        shifted.masked_fill_(shifted == -100, 0)
        logits = self.lm_head(self.emb(idx) + self.emb(shifted))
        return nn.CrossEntropyLoss(ignore_index=-100)(logits.view(-1, logits.size(-1)), labels.view(-1))


def test_a_forward_that_assigns_into_a_tensor_traces_and_its_loss_takes_the_fused_op():
    model = _ShiftsItsLabels(50, 16)
    idx, labels = torch.randint(0, 50, (3, 9)), torch.randint(0, 50, (3, 9))
    labels[1, 2:5] = -100
    reference = copy.deepcopy(model)
    workload = opfuse.PythonWorkload(model, (idx, labels), lambda loss: loss, None, opfuse._rules(None))
    assert "(model)" not in workload.not_traced
    assert dict(opfuse.patch(model, (idx, labels), lambda loss: loss)).get("cross_entropy") == 1
    got, ran = _opfuse_ops_run(model, idx, labels)
    assert "opfuse::cross_entropy" in ran
    # fresh labels: the graph assigns into the tensor it makes at each call, not once at tracing
    labels = torch.randint(0, 50, (3, 9))
    got, expected = model(idx, labels), reference(idx, labels)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6)
    got.backward()
    expected.backward()
    assert torch.allclose(model.emb.weight.grad, reference.emb.weight.grad, rtol=1e-5, atol=1e-7)


class _NewGELU(nn.Module):
    """T5's (Hugging Face's gelu_new) tanh GELU written out."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class _GatedGelu(nn.Module):
    """Gemma's MLP (F.gelu(…, approximate='tanh') * up) or T5 v1.1's (an activation module)."""

    def __init__(self, dim, act=None):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(dim, 2 * dim, bias=False), nn.Linear(dim, 2 * dim, bias=False)
        self.down_proj, self.act = nn.Linear(2 * dim, dim, bias=False), act

    def forward(self, x):
        gate = self.act(self.gate_proj(x)) if self.act is not None else F.gelu(self.gate_proj(x), approximate="tanh")
        return self.down_proj(gate * self.up_proj(x))


@pytest.mark.parametrize("act", [None, _NewGELU(), nn.GELU(approximate="tanh")])
def test_gated_gelu_takes_the_fused_geglu(act):
    model, x = _GatedGelu(16, act), torch.randn(3, 5, 16)
    reference = copy.deepcopy(model)
    assert dict(opfuse.patch(model, (x,), lambda y: y.pow(2).mean())).get("geglu") == 1
    got, ran = _opfuse_ops_run(model, x)
    assert "opfuse::geglu" in ran
    assert torch.allclose(got, reference(x), rtol=1e-5, atol=1e-6)
    # exact GELU is not the fused op's: verification leaves it as written
    exact = _GatedGelu(16, nn.GELU())
    assert "geglu" not in dict(opfuse.patch(exact, (x,), lambda y: y.pow(2).mean()))


class _AssignsItsLoss(nn.Module):
    """llama2.c's Transformer: `self.last_loss = F.cross_entropy(...)` in the forward."""

    def __init__(self):
        super().__init__()
        self.lm_head, self.last_loss = nn.Linear(8, 10), None

    def forward(self, h, targets):
        logits = self.lm_head(h)
        self.last_loss = F.cross_entropy(logits.view(-1, 10), targets.view(-1), ignore_index=-1)
        return logits


def test_a_forward_that_assigns_to_its_module_is_not_traced():
    """fx records no assignment: a rewritten graph would leave last_loss unset."""
    model, h, t = _AssignsItsLoss(), torch.randn(2, 3, 8), torch.randint(0, 10, (2, 3))
    workload = opfuse.PythonWorkload(model, (h, t), lambda y: y.sum(), None, opfuse._rules(None))
    assert workload.apply(next(r for r in opfuse._rules(None) if r.name == "cross_entropy")) == 0
    assert "forward assigns self.last_loss" in workload.not_traced["(model)"]
    model.last_loss = None
    model(h, t)
    assert model.last_loss is not None


class _BuildsAConstant(nn.Module):
    """A tensor built outside the graph (the legacy constructor), which fx keeps as
    _tensor_constant0 on the module, and a shape asked, so a new batch size retraces."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6)

    def forward(self, x):
        y = self.proj(x).view(x.shape[0], -1)
        return y * torch.sigmoid(y) * torch.Tensor([0.5])


class _Cache:
    """A key/value cache as Hugging Face's DynamicCache: the forward changes it."""

    def __init__(self):
        self.seen = []

    def update(self, k):
        self.seen.append(k)
        return k


class _OptionalMaskAndCache(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x, mask=None, cache=None):
        y = self.proj(x)
        if mask is not None:
            y = y + mask
        if cache is not None:
            y = cache.update(y)
        return y * torch.sigmoid(y)


def test_calls_a_graph_cannot_take_run_the_original_and_constants_stay():
    model, x = _BuildsAConstant(), torch.randn(3, 6)
    reference = copy.deepcopy(model)
    assert dict(opfuse.patch(model, (x,), lambda y: y.sum())).get("silu") == 1
    for batch in (3, 5):
        other = torch.randn(batch, 6)
        assert torch.allclose(model(other), reference(other), rtol=1e-6, atol=1e-7)
    assert torch.allclose(copy.deepcopy(model)(x), reference(x), rtol=1e-6, atol=1e-7)

    model, mask = _OptionalMaskAndCache(), torch.randn(2, 4)
    reference = copy.deepcopy(model)
    assert dict(opfuse.patch(model, (x[:2, :4], mask), lambda y: y.sum())).get("silu") == 1
    # None where the graph took a tensor: another call, traced for itself
    assert torch.allclose(model(x[:2, :4]), reference(x[:2, :4]), rtol=1e-6, atol=1e-7)
    # an object the forward changes is never traced with: the caller's cache keeps real tensors
    cache = _Cache()
    with pytest.warns(RuntimeWarning, match="argument 'cache' is a _Cache, which a graph cannot hold fixed"):
        got = model(x[:2, :4], mask, cache)
    assert torch.allclose(got, reference(x[:2, :4], mask), rtol=1e-6, atol=1e-7)
    assert len(cache.seen) == 1 and type(cache.seen[0]) is torch.Tensor
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a call like one that did not trace: no second trace, no warning
        model(x[:2, :4], mask, _Cache())


class _EmbedsAndAsksDtype(nn.Module):
    """A dtype asked of a tensor made from the module's own parameters (not an argument)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6)

    def forward(self, idx):
        h = self.emb(idx)
        return (h * torch.sigmoid(h)).clamp(min=torch.finfo(h.dtype).min / 2) + torch.finfo(h.dtype).eps


class _ReadsSelfDtype(_EmbedsAndAsksDtype):
    """Hugging Face's `self.dtype` (next(self.parameters()).dtype): read from real state, never
    asked of a traced value, and held in the graph as a constant."""

    @property
    def dtype(self):
        return next(self.parameters()).dtype

    def forward(self, idx):
        h = self.emb(idx)
        return h * torch.sigmoid(h) + torch.zeros(1, dtype=self.dtype)


@pytest.mark.parametrize("model_class", [_EmbedsAndAsksDtype, _ReadsSelfDtype])
def test_a_graph_that_holds_a_dtype_is_traced_again_when_the_parameters_change_dtype(model_class):
    model, idx = model_class(), torch.randint(0, 10, (2, 5))
    reference = copy.deepcopy(model)
    assert dict(opfuse.patch(model, (idx,), lambda y: y.sum())).get("silu") == 1
    model.double(), reference.double()
    got = model(idx)
    assert got.dtype == torch.float64 and torch.allclose(got, reference(idx), rtol=1e-12, atol=0)
    assert len(model.forward.specialisations) == 2


class _Child(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        y = self.proj(x).reshape(x.shape[0], -1, 4)  # asks a shape: specialised
        return y * torch.sigmoid(y)


class _CallsChildForward(nn.Module):
    """llama2.c's blocks call `self.attention.forward(...)`, bypassing the module call."""

    def __init__(self):
        super().__init__()
        self.child = _Child()

    def forward(self, x):
        B, T, C = x.shape
        return self.child.forward(x).reshape(B, T * C) * 2


def test_a_child_called_through_its_forward_joins_its_parents_graph_at_every_length():
    model, reference = _CallsChildForward(), None
    reference = copy.deepcopy(model)
    assert dict(opfuse.patch(model, (torch.randn(2, 3, 4),), lambda y: y.sum())).get("silu") == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for T in (3, 5, 7):
            x = torch.randn(2, T, 4)
            got, ran = _opfuse_ops_run(model, x)
            assert "opfuse::silu" in ran and torch.allclose(got, reference(x), rtol=1e-6, atol=1e-7)


def test_causal_masks_are_found_per_sample_and_loss_subclasses_are_left_alone():
    mask = torch.full((8, 8), torch.finfo(torch.float32).min).triu(1)
    assert opfuse.functional._is_causal(mask[None, None].expand(3, 1, 8, 8), 8, 8, additive=True)
    padded = mask[None, None].repeat(2, 1, 1, 1)
    padded[1, 0, :, 0] = torch.finfo(torch.float32).min  # a left-padded sample
    assert not opfuse.functional._is_causal(padded, 8, 8, additive=True)

    class Weighted(nn.CrossEntropyLoss):
        def forward(self, x, t):
            return 2 * super().forward(x, t)

    kind = opfuse.rewrite.MODULE_KINDS["cross_entropy_module"]
    assert kind(nn.CrossEntropyLoss(), [], {}, "") and not kind(Weighted(), [], {}, "")


class _Hf436Mask(nn.Module):
    """Hugging Face 4.36's _make_causal_mask: torch.full((T, T), finfo(dtype).min) without a dtype,
    which overflows float32 when dtype is float64: the model as written cannot run in float64."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6)

    def forward(self, x):
        T = x.shape[1]
        mask = torch.full((T, T), torch.finfo(x.dtype).min).triu(1)
        s = self.proj(x) @ x.transpose(1, 2) + mask.to(x.dtype)
        return s * torch.sigmoid(s)


def test_a_model_that_cannot_run_in_float64_is_verified_in_float32_and_says_so(tmp_path):
    model, x = _Hf436Mask(), torch.randn(2, 4, 6)
    with pytest.raises(RuntimeError, match="overflow"):
        copy.deepcopy(model).double()(x.double())
    result = opfuse.tune(model, (x,), lambda y: y.clamp(min=-1).pow(2).mean(), out=str(tmp_path / "r"), **QUICK)
    silu = next(r for r in result.replacements if r.rule == "silu")
    assert silu.verified and silu.float64_rel_error is None
    assert "does not run in float64" in silu.float64_skipped and "overflow" in silu.float64_skipped
    assert "verified in float32 only" in result.text and "f32 only" in result.text


class _T5LayerNorm(nn.Module):
    """T5's: only what the variance is taken of is cast to float32; x · rstd stays in x's dtype."""

    def __init__(self, dim):
        super().__init__()
        self.variance_epsilon = 1e-6
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, hidden_states):
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def test_t5_layer_norm_is_replaced_with_its_float64_numerics_kept():
    model = nn.Sequential(nn.Linear(16, 16), _T5LayerNorm(16), nn.Linear(16, 4))
    reference = copy.deepcopy(model[1]).double()
    done = dict(opfuse.patch(model, (torch.randn(2, 5, 16),), lambda s: s.pow(2).mean()))
    assert done.get("rms_norm") == 1, done  # verified in float64 too
    x64 = torch.randn(3, 16, dtype=torch.float64)
    assert torch.equal(model[1].double()(x64), reference(x64))


class _WeightFirstNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.eps = 1e-6
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class _DividingNorm(_WeightFirstNorm):
    def forward(self, x):
        return x / torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True) + self.eps) * self.weight


@pytest.mark.parametrize("norm", [_WeightFirstNorm, _DividingNorm])
def test_rms_norm_spellings_are_swapped_and_compute_the_same(norm):
    model = nn.Sequential(nn.Linear(16, 16), norm(16), nn.Linear(16, 4))
    reference = copy.deepcopy(model)
    x = torch.randn(3, 5, 16)
    assert dict(opfuse.patch(model, (x,), lambda s: s.pow(2).mean())).get("rms_norm") == 1
    assert isinstance(model[1], opfuse.nn.RMSNorm)
    assert torch.allclose(model(x), reference(x), rtol=1e-5, atol=1e-6)


class _NormWithOtherEps(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.epsilon_value = 1e-5  # a name opfuse.nn.RMSNorm does not know
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.epsilon_value) * self.weight


def test_a_module_the_replacement_cannot_take_is_reported_with_the_reason():
    model = nn.Sequential(nn.Linear(8, 8), _NormWithOtherEps(8))
    workload = opfuse.PythonWorkload(model, (torch.randn(3, 8),), lambda y: y.sum(), None, opfuse._rules(None))
    rule = next(r for r in opfuse._rules(None) if r.name == "rms_norm")
    assert workload.apply(rule) == 0
    assert "holds no float eps under eps, variance_epsilon, epsilon" in workload.not_traced["1"]
    assert isinstance(model[1], _NormWithOtherEps)


def test_with_nothing_verified_the_baseline_is_still_measured(tmp_path):
    model, inputs, loss = llama.factory(batch_size=2, seq_len=16, vocab_size=64, seed=SEED)
    result = opfuse.tune(model, inputs, loss, out=str(tmp_path / "none"), no_default_rules=True,
                         rules=[os.path.join(DATA, "rules", "wrong_silu.yaml")], **QUICK)
    assert not any(r.kept for r in result.replacements)
    assert result.baseline["step_ms"] > 0 and result.baseline["images_per_sec"] > 0
    assert "no replacement verified" in result.text


def test_the_measurement_carries_intervals_decisions_and_its_conditions(tmp_path):
    model, inputs, loss = tiny_effnet()
    result = opfuse.tune(model, inputs, loss, out=str(tmp_path / "m"), **dict(QUICK, rounds=2))
    lo, hi = result.speedup_ci
    assert lo <= result.speedup <= hi
    for r in result.replacements:
        if r.measured:
            assert r.decision == "kept" and r.rounds >= 2 and len(r.gain_ci) == 2, r  # min_gain -1 keeps all
    env = result.environment
    assert env == opfuse.environment()
    assert env["threads"] == torch.get_num_threads() and env["blas"] and not env["reference_blas"]
    assert set(result.machine) >= {"busy", "busy_share_of_others", "warning"}
    # An interval that cannot hold is refused before any work.
    with pytest.raises(ValueError, match="max_rounds"):
        opfuse.tune(model, inputs, loss, out=str(tmp_path / "n"), **dict(QUICK, rounds=3, max_rounds=2))
    assert not (tmp_path / "n").exists()


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs a core torch leaves idle")
def test_fewer_threads_than_cores_is_a_runtime_warning(tmp_path):
    model, inputs, loss = tiny_effnet()
    with pytest.warns(RuntimeWarning, match="intra-op thread"):
        opfuse.tune(model, inputs, loss, out=str(tmp_path / "w"), **dict(QUICK, threads=1))


@pytest.mark.parametrize("case, error, match", [
    ("forward", ValueError, "model\\(\\*inputs\\) failed"),
    ("loss", ValueError, "scalar"),
    ("copy", TypeError, "deep-copied"),
    ("inputs", TypeError, "tuple"),
])
def test_bad_input_is_named_before_any_long_work(case, error, match, tmp_path):
    model, inputs, loss = tiny_effnet()
    if case == "forward":
        inputs = (torch.randn(4, 5, 64, 64),)
    elif case == "loss":
        loss = lambda out: out  # noqa: E731
    elif case == "copy":
        model.lock = __import__("threading").Lock()
    elif case == "inputs":
        inputs = "images"
    with pytest.raises(error, match=match):
        opfuse.tune(model, inputs, loss, out=str(tmp_path / "x"), **QUICK)
    assert not (tmp_path / "x").exists()


def test_the_command_line_tunes_a_factory(tmp_path):
    from opfuse.__main__ import main
    factory = tmp_path / "net.py"
    factory.write_text(
        "import torch\nfrom torch import nn\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.SiLU(), nn.Flatten(), nn.LazyLinear(3))\n"
        "    x = torch.randn(2, 3, 8, 8); m(x)\n"
        "    return m, (x,), lambda out: out.square().mean()\n")
    assert main(["tune", f"{factory}:make", "--out", str(tmp_path / "o"), "--steps", "1", "--rounds", "1",
                 "--min-gain", "-1", "--json", str(tmp_path / "r.json")]) == 0
    # the default optimizer, SGD with momentum, is swapped for opfuse's as well
    replacements = {r["rule"]: r for r in json.load(open(tmp_path / "r.json"))["replacements"]}
    assert "batch_norm_silu" in replacements, list(replacements)
    assert replacements["fused_sgd"]["verified"], replacements["fused_sgd"]
    with pytest.raises(SystemExit):
        main(["tune", f"{factory}:nope"])
