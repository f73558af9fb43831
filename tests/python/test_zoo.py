"""opfuse.tune on the real models from pip (tests/python/models/zoo.py): transformers, timm,
efficientnet_pytorch, built from configurations at a small size. Each is tuned end to end: the
rewrites that apply are applied and verified, every other rule is reported with its reason, the
model given is left as it was, and the tuned one trains as the original did."""
import copy
import inspect
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "models"))
import zoo  # noqa: E402

import opfuse  # noqa: E402

QUICK = dict(steps=1, rounds=1, warmup=0, profile_steps=1, min_gain=-1, quiet=True, measure_ops=False)

LLAMA_LIKE = {"fused_adamw", "rms_norm", "add_rms_norm", "rotary_embedding", "swiglu"}
# What each model's tune replaces (min_gain -1 keeps every verified rewrite). A rule missing here
# that now applies, or one listed that no longer does, is a change to look at. Every transformer
# computes its loss from its labels, by F.cross_entropy or a CrossEntropyLoss made in the forward.
EXPECTED = {
    "llama": LLAMA_LIKE, "qwen2": LLAMA_LIKE, "mistral": LLAMA_LIKE,
    "gemma": {"fused_adamw", "rotary_embedding", "geglu"},
    "phi": {"fused_adamw", "gelu_tanh", "rotary_embedding"},
    "gpt2": {"fused_adamw", "gelu_tanh", "add_layer_norm"},
    "t5": {"fused_adamw", "rms_norm"},
    "bert": {"fused_adamw", "add_layer_norm"},
    "timm_efficientnet_b0": {"fused_adamw", "channels_last"},
    "timm_resnet50": {"fused_adamw", "channels_last"},
    "timm_convnext_tiny": {"fused_adamw", "channels_last"},
    "timm_vit_small_patch16_224": {"fused_adamw", "add_layer_norm", "channels_last"},
    "efficientnet_pytorch_b0": {"fused_adamw", "silu", "batch_norm_silu", "se_gate", "channels_last"},
}


def expected(name):
    """What the model keeps; the eager-attention transformers also their attention (transformers 5's
    returns its probabilities, which the decoder layer drops, or T5's layer passes on to the block
    that drops them)."""
    if not name.endswith(("_eager", "_sdpa")):
        return EXPECTED[name]
    family, attn = name.rsplit("_", 1)
    return EXPECTED[family] | {"cross_entropy"} | ({"attention"} if attn == "eager" else set())


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", zoo.names())
def test_tune_applies_what_fits_and_says_why_for_the_rest(name, tmp_path, ops_library):
    model, inputs, loss, optimizer = zoo.build(name)
    before, kinds = state(model), [type(m) for m in model.modules()]
    result = opfuse.tune(model, inputs, loss, optimizer, out=str(tmp_path / "run"), **QUICK)

    kept = {r.rule for r in result.replacements if r.kept}
    assert kept == expected(name), [(r.rule, r.why) for r in result.replacements]
    assert all(r.verified for r in result.replacements), [(r.rule, r.why) for r in result.replacements]
    for n in result.not_applied:
        assert n["why"], n  # every rule left alone says why
    # The model given is as it was: same modules, same parameters and buffers.
    assert [type(m) for m in model.modules()] == kinds
    after = state(model)
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    # The tuned model trains as the original: one float32 step, gradients alike on the scale of
    # the largest (as the verifier judges them: a gradient zero in exact arithmetic holds noise).
    ref, got = copy.deepcopy(model), copy.deepcopy(result.model)
    for m in (ref, got):
        torch.manual_seed(1)
        loss(m(*inputs)).backward()
    pairs = [(n, p.grad, q.grad) for (n, p), (_, q) in zip(ref.named_parameters(), got.named_parameters())
             if p.grad is not None]
    scale = max(a.abs().max().item() for _, a, _ in pairs)
    for n, a, b in pairs:
        assert (a - b).abs().max().item() <= 1e-3 * scale, n


def test_findings_are_named_by_the_libraries_module_paths(tmp_path, ops_library):
    model, inputs, loss, optimizer = zoo.build("llama_sdpa")
    opfuse.tune(model, inputs, loss, optimizer, out=str(tmp_path / "run"), **QUICK)
    analysis = opfuse.analyze(str(tmp_path / "run" / "baseline.trace.json"))
    wheres = {f["rule"]: [l["location"] for l in f["locations"]] for f in analysis.findings}
    assert any(w.startswith("model.layers.0.") and "norm" in w for w in wheres["rms_norm"]), wheres["rms_norm"]
    assert any(w.startswith("model.layers.1.self_attn") for w in wheres["rotary_embedding"]), wheres


def test_with_transformers_default_kv_cache_the_attention_modules_are_left_with_the_reason(tmp_path, ops_library):
    """transformers' default use_cache=True hands a training forward a fresh DynamicCache every
    step; no graph can hold it, so those modules run as written and tune names them and why."""
    model, inputs, loss, optimizer = zoo.build("llama_sdpa")
    model.config.use_cache = True
    result = opfuse.tune(model, inputs, loss, optimizer, out=str(tmp_path / "run"), **QUICK)
    assert "model.layers.0.self_attn" in result.not_traced
    assert "DynamicCache" in result.not_traced["model.layers.0.self_attn"]
    kept = {r.rule for r in result.replacements if r.kept}
    assert {"rms_norm", "swiglu", "fused_adamw"} <= kept and "rotary_embedding" not in kept


def test_eager_attention_returns_no_probabilities_once_fused_as_sdpa_returns_none(tmp_path, ops_library):
    """transformers 5's eager attention returns the softmax probabilities from the attention module
    and the decoder layer drops them; fused, the module returns None there, as the SDPA one does."""
    model, inputs, loss, optimizer = zoo.build("llama_eager")
    result = opfuse.tune(model, inputs, loss, optimizer, out=str(tmp_path / "llama"), **QUICK)
    assert "attention" in {r.rule for r in result.replacements if r.kept}
    seen = {}

    def keep(path):
        def hook(module, args, out):
            seen[path] = out[1]  # returns None: the output stays as it was
        return hook

    for path, m in (("as written", model), ("tuned", result.model)):
        m.model.layers[0].self_attn.register_forward_hook(keep(path))
        m(*inputs)
    assert seen["tuned"] is None and seen["as written"].shape[-2:] == (inputs[0].shape[1],) * 2


def test_a_model_computing_its_own_loss_keeps_returning_its_output_class(tmp_path, ops_library):
    """With labels, transformers computes the loss inside the forward and returns a ModelOutput
    (a dict subclass); a rewritten forward returns the same class, not a plain dict."""
    model, inputs, loss, optimizer = zoo.build("llama_sdpa")
    assert inputs[-1] is inputs[0]  # labels, by position: the tokens, shifted inside
    result = opfuse.tune(model, inputs, loss, optimizer, out=str(tmp_path / "run"), **QUICK)
    assert "cross_entropy" in {r.rule for r in result.replacements if r.kept}
    out = result.model(*inputs)
    assert type(out) is type(model(*inputs)) and out.loss is not None


def test_t5_given_only_its_labels_makes_its_decoder_inputs_in_a_traced_forward(tmp_path, ops_library):
    """T5 as its own docstring trains it, `model(input_ids=…, labels=…)`: the forward makes the
    decoder's inputs by assigning into a fresh tensor's slices (`_shift_right`), which the trace
    keeps, so the whole model traces and the loss computed there takes the fused op."""
    model, inputs, loss, optimizer = zoo.build("t5_sdpa")
    decoder_inputs = list(inspect.signature(model.forward).parameters).index("decoder_input_ids")
    inputs = tuple(None if i == decoder_inputs else x for i, x in enumerate(inputs))
    result = opfuse.tune(model, inputs, loss, optimizer, out=str(tmp_path / "run"), **QUICK)
    assert "(model)" not in result.not_traced, result.not_traced
    assert "cross_entropy" in {r.rule for r in result.replacements if r.kept}
    assert all(r.verified for r in result.replacements), [(r.rule, r.why) for r in result.replacements]
