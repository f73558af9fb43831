"""opfuse.functional.cross_entropy and linear_cross_entropy against F.cross_entropy in float64
(the C++ tests state the per-dtype bounds; here the Python face: arguments as F.cross_entropy
takes them, gradients through autograd, the composite where the op does not apply)."""
import pytest

import torch
opfuse = pytest.importorskip("opfuse")
F = torch.nn.functional


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_cross_entropy_is_f_cross_entropy_over_the_last_dimension(reduction, label_smoothing):
    logits = torch.randn(2, 6, 50, requires_grad=True)
    target = torch.randint(50, (2, 6))
    target[0, 1] = -100
    loss = opfuse.functional.cross_entropy(logits, target, reduction=reduction, label_smoothing=label_smoothing)
    dy = torch.randn(loss.shape)
    loss.backward(dy)
    xd = logits.detach().double().requires_grad_()
    ref = F.cross_entropy(xd.view(-1, 50), target.view(-1), reduction=reduction, label_smoothing=label_smoothing)
    ref = ref.view(2, 6) if reduction == "none" else ref
    ref.backward(dy.double())
    assert loss.shape == ref.shape and loss.grad_fn is not None
    assert torch.allclose(loss.double(), ref, rtol=1e-6, atol=1e-6)
    assert torch.allclose(logits.grad.double(), xd.grad, rtol=1e-5, atol=1e-7)


def test_cross_entropy_gradcheck_float64():
    x = torch.randn(4, 7, dtype=torch.double, requires_grad=True)
    t = torch.tensor([1, -100, 6, 0])
    assert torch.autograd.gradcheck(lambda v: opfuse.functional.cross_entropy(v, t, label_smoothing=0.2), (x,))
    assert torch.autograd.gradcheck(lambda v: opfuse.functional.cross_entropy(v, t, reduction="none"), (x,))


def test_linear_cross_entropy_matches_linear_then_cross_entropy():
    h = torch.randn(3, 5, 16, requires_grad=True)
    w = (torch.randn(300, 16) / 4).requires_grad_()
    t = torch.randint(300, (3, 5))
    loss = opfuse.functional.linear_cross_entropy(h, w, t, label_smoothing=0.1)
    loss.backward()
    hd, wd = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = F.cross_entropy(F.linear(hd, wd).view(-1, 300), t.view(-1), label_smoothing=0.1)
    ref.backward()
    assert torch.allclose(loss.double(), ref, rtol=1e-6)
    assert torch.allclose(h.grad.double(), hd.grad, rtol=1e-4, atol=1e-6)
    assert torch.allclose(w.grad.double(), wd.grad, rtol=1e-4, atol=1e-6)
    x = torch.randn(3, 4, dtype=torch.double, requires_grad=True)
    v = torch.randn(6, 4, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b: opfuse.functional.linear_cross_entropy(a, b, torch.tensor([0, 5, -100]), reduction="sum"), (x, v))


def test_where_the_op_does_not_apply_the_composite_runs():
    h, w, t = torch.randn(4, 8), torch.randn(10, 8), torch.randint(10, (4,))
    per_row = opfuse.functional.linear_cross_entropy(h, w, t, reduction="none")
    assert per_row.shape == (4,)
    assert torch.allclose(per_row, F.cross_entropy(h @ w.T, t, reduction="none"))


def test_bad_target_is_named():
    with pytest.raises(RuntimeError, match="out of range"):
        opfuse.functional.cross_entropy(torch.randn(2, 3), torch.tensor([0, 3]))
