"""The Python face of the opfuse operators: torch.ops.load_library, then torch.ops.opfuse.*.

Runs with the project's venv python (torch from pip, scripts/setup.sh); the
library path comes from OPFUSE_OPS_LIBRARY (set by CTest) or the default build folder.
"""
import pytest

import torch

pytestmark = pytest.mark.usefixtures("ops_library")


def test_silu_forward_and_backward_match_float64():
    x = (torch.randn(10007) * 4).requires_grad_()
    g = torch.randn(10007)
    y = torch.ops.opfuse.silu(x)
    y.backward(g)
    xd = x.detach().double().requires_grad_()
    yd = xd * torch.sigmoid(xd)
    yd.backward(g.double())
    assert torch.all((y.double() - yd).abs() <= 2.4e-7 * yd.abs() + 1e-30)
    assert torch.all((x.grad.double() - xd.grad).abs() <= 1e-6 * g.double().abs() * (1 + xd.abs()))


def test_gradcheck_float64():
    x = torch.randn(40, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(torch.ops.opfuse.silu, (x,))
    assert torch.autograd.gradcheck(lambda v: torch.ops.opfuse.swish(v, 1.702), (x,))
    xs = torch.randn(2, 3, 4, 5, dtype=torch.double, requires_grad=True)
    gate = torch.randn(2, 3, 1, 1, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(torch.ops.opfuse.se_gate, (xs, gate))
    h = torch.randn(3, 4, 7, dtype=torch.double, requires_grad=True)
    w = (torch.rand(7, dtype=torch.double) + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: torch.ops.opfuse.rms_norm(a, b, 1e-5), (h, w))
    u = torch.randn(3, 4, 7, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(torch.ops.opfuse.swiglu, (h, u))
    packed = torch.randn(3, 8, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(torch.ops.opfuse.swiglu_packed, (packed,))


def test_add_rms_norm_gradcheck_float64_both_outputs():
    x, r = (torch.randn(3, 4, 7, dtype=torch.double, requires_grad=True) for _ in range(2))
    w = (torch.rand(7, dtype=torch.double) + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b, c: torch.ops.opfuse.add_rms_norm(a, b, c, 1e-5), (x, r, w))
    # y alone and h alone: the other output's gradient undefined
    assert torch.autograd.gradcheck(lambda a, b, c: torch.ops.opfuse.add_rms_norm(a, b, c, 1e-5)[0], (x, r, w))
    assert torch.autograd.gradcheck(lambda a, b, c: torch.ops.opfuse.add_rms_norm(a, b, c, 1e-5)[1], (x, r, w))


def test_add_rms_norm_bfloat16_is_llamas_add_then_float_arithmetic_rounded_once():
    """Against `h = x + r; (h.float() … ).type_as(h) * w` in bfloat16: h bit for bit, y within one
    bfloat16 rounding of the float64 norm of that h."""
    x, r = ((torch.randn(16, 288) * 2).bfloat16() for _ in range(2))
    w = (torch.rand(288) + 0.5).bfloat16()
    y, h = torch.ops.opfuse.add_rms_norm(x, r, w, 1e-5)
    assert torch.equal(h, x + r)
    hd = h.double()
    ref = hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    assert y.dtype == torch.bfloat16
    assert torch.all((y.double() - ref).abs() <= 2 ** -8 * ref.abs() + 1e-30)


def test_rms_norm_bfloat16_is_float_arithmetic_rounded_once():
    """Llama's `x.float() … .type_as(x) * w` in bfloat16, against float64: the fused op rounds once."""
    x = (torch.randn(64, 288) * 2).bfloat16()
    w = (torch.rand(288) + 0.5).bfloat16()
    y = torch.ops.opfuse.rms_norm(x, w, 1e-5)
    xd, wd = x.double(), w.double()
    ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * wd
    assert y.dtype == torch.bfloat16
    assert torch.all((y.double() - ref).abs() <= 2 ** -8 * ref.abs() + 1e-30)


def test_swish_default_beta_is_silu():
    x = torch.randn(333)
    assert torch.equal(torch.ops.opfuse.swish(x), torch.ops.opfuse.silu(x))


def test_se_gate_channels_last_keeps_layout():
    x = torch.randn(2, 40, 6, 6).contiguous(memory_format=torch.channels_last)
    gate = torch.randn(2, 40, 1, 1)
    y = torch.ops.opfuse.se_gate(x, gate)
    assert y.is_contiguous(memory_format=torch.channels_last)
    ref = x.double() * torch.sigmoid(gate.double())
    assert torch.all((y.double() - ref).abs() <= 2.4e-7 * ref.abs() + 1e-37)


def test_torchscript_sees_the_op_and_its_backward():
    @torch.jit.script
    def block(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return torch.ops.opfuse.se_gate(torch.ops.opfuse.silu(x), gate)

    assert "opfuse::silu" in str(block.graph)
    x = torch.randn(2, 4, 5, 5, dtype=torch.double, requires_grad=True)
    gate = torch.randn(2, 4, 1, 1, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(block, (x, gate))


def test_bad_input_is_a_runtime_error_naming_the_op():
    with pytest.raises(RuntimeError, match="opfuse::swish: x must be float32, float64 or bfloat16"):
        torch.ops.opfuse.silu(torch.arange(4))
    with pytest.raises(RuntimeError, match=r"gate must have shape \[2, 3, 1, 1\]"):
        torch.ops.opfuse.se_gate(torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 1))


def test_attention_from_python_gradchecks_and_takes_a_generator():
    q, k, v = (torch.randn(1, 2, 9, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.rand(9, 9) > 0.3
    mask.fill_diagonal_(True)
    for causal, m in ((True, None), (False, mask), (False, torch.randn(9, 9, dtype=torch.float64))):
        assert torch.autograd.gradcheck(lambda a, b, c: torch.ops.opfuse.attention(a, b, c, causal, None, m, 0.0, None),
                                        (q, k, v))
    # Dropout draws from the generator given, so equal seeds give equal outputs.
    x = torch.randn(2, 3, 40, 16)
    a = torch.ops.opfuse.attention(x, x, x, True, None, None, 0.5, torch.Generator().manual_seed(7))
    b = torch.ops.opfuse.attention(x, x, x, True, None, None, 0.5, torch.Generator().manual_seed(7))
    c = torch.ops.opfuse.attention(x, x, x, True, None, None, 0.5, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def _rotate_half(x, cos, sin):
    """Hugging Face's apply_rotary_pos_emb for one tensor: per-element cat(freqs, freqs) tables."""
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


def _llama2c(x, cos, sin, arithmetic=torch.float):
    """llama2.c's apply_rotary_emb for one tensor: interleaved pairs in real arithmetic (float)."""
    xr, xi = x.to(arithmetic).reshape(x.shape[:-1] + (-1, 2)).unbind(-1)
    return torch.stack([xr * cos - xi * sin, xr * sin + xi * cos], dim=-1).flatten(3).type_as(x)


def test_rotary_embedding_is_both_spellings_and_gradchecks():
    """float32 against the float64 composites at the C++ tests' bound, 2^-23·(|x_a·cos| + |x_b·sin|)."""
    B, T, H, D = 2, 9, 3, 16
    theta = torch.rand(T, 1, D // 2, dtype=torch.double) * 100
    cos, sin = theta.cos().float(), theta.sin().float()
    x = torch.randn(B, T, H, D, requires_grad=True)
    terms_bound = 1.25e-7 * x.detach().double().abs().reshape(B, T, H, D // 2, 2).sum(-1, keepdim=True)

    y = torch.ops.opfuse.rotary_embedding(x, cos, sin, True)
    ref = _llama2c(x.detach().double(), cos.double(), sin.double(), torch.double)
    assert torch.all((y.double() - ref).abs() <= terms_bound.expand(B, T, H, D // 2, 2).reshape(B, T, H, D))

    y = torch.ops.opfuse.rotary_embedding(x, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1))
    ref = _rotate_half(x.detach().double(), torch.cat((cos, cos), -1).double(), torch.cat((sin, sin), -1).double())
    half = x.detach().double().abs()
    bound = 1.25e-7 * (half + torch.cat((half[..., D // 2:], half[..., :D // 2]), -1))
    assert torch.all((y.double() - ref).abs() <= bound)

    xd = torch.randn(2, 4, 3, 6, dtype=torch.double, requires_grad=True)
    c, s = torch.randn(4, 1, 3, dtype=torch.double), torch.randn(4, 1, 3, dtype=torch.double)
    for interleaved in (False, True):
        assert torch.autograd.gradcheck(lambda v: torch.ops.opfuse.rotary_embedding(v, c, s, interleaved), (xd,))
    with pytest.raises(RuntimeError, match="cos and sin are constant tables"):
        torch.ops.opfuse.rotary_embedding(xd, c.requires_grad_(), s)
