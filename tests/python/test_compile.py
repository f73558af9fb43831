"""torch.compile takes opfuse-tuned models whole: the test models (EfficientNet's memory-efficient
Swish, the Llama-style stack) patched by opfuse compile with fullgraph=True (zero graph breaks)
and give the eager tuned model's outputs and every gradient, in float64, where only the order of
sums may differ."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "models"))
import efficientnet  # noqa: E402
import llama  # noqa: E402

import opfuse  # noqa: E402

# float64 from both sides: a rewrite or a fake kernel that is wrong misses by far more.
TOLERANCE = 1e-9


def small_efficientnet():
    return efficientnet.factory(image_size=32, batch_size=2, num_classes=10)


def small_llama():
    return llama.factory(batch_size=2, seq_len=16, vocab_size=64)


def outputs_and_grads(model, inputs, loss_fn):
    model.zero_grad(set_to_none=True)
    out = model(*inputs)
    loss_fn(out).backward()
    return out.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def relative_error(got, want):
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("factory, expected", [(small_efficientnet, {"silu"}), (small_llama, {"attention", "rotary_embedding", "swiglu"})],
                         ids=["efficientnet", "llama"])
def test_tuned_model_compiles_whole_and_matches_eager(factory, expected):
    model, inputs, loss_fn = factory()
    model.train()
    done = dict(opfuse.patch(model, inputs, loss_fn))
    assert expected <= set(done), done
    model = model.double()
    inputs = tuple(x.double() if x.is_floating_point() else x for x in inputs)

    explanation = torch._dynamo.explain(model)(*inputs)
    assert explanation.graph_break_count == 0, explanation.break_reasons

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    torch.manual_seed(0)
    want_out, want_grads = outputs_and_grads(model, inputs, lambda out: loss_fn(out).double())
    torch.manual_seed(0)
    got_out, got_grads = outputs_and_grads(compiled, inputs, lambda out: loss_fn(out).double())
    assert relative_error(got_out, want_out) < TOLERANCE
    assert got_grads.keys() == want_grads.keys()
    for name, want in want_grads.items():
        assert relative_error(got_grads[name], want) < TOLERANCE, name
