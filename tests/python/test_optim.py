"""opfuse.optim.AdamW against torch.optim.AdamW: the same trajectory, the same state_dict layout
(a checkpoint of either loads in the other), the same errors, and one fused op per step.

Bounds: float64 agrees to 1e-12 after 10 steps (each step's arithmetic is torch's, to rounding;
torch's vectorised add fuses a multiply, ours does not); float32 to 5e-6 (|p| ~ 1, lr 1e-2, a
few ulp per step through 10 steps).
"""
import copy

import pytest

import torch
opfuse = pytest.importorskip("opfuse")
from opfuse.optim import AdamW  # noqa: E402


def small_model(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.LayerNorm(32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 4)).to(dtype)


def param_groups(model, **kw):
    """Two groups, as a Llama recipe makes them: matrices decayed, biases and norms not."""
    decayed = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [dict(params=decayed, weight_decay=0.1, **kw), dict(params=rest, weight_decay=0.0, lr=3e-2)]


def train(model, optimizer, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    for _ in range(steps):
        x = torch.randn(16, 8, generator=gen, dtype=torch.float64).to(dtype)
        optimizer.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        optimizer.step()


def max_difference(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("dtype, bound", [(torch.float64, 1e-12), (torch.float32, 5e-6)])
@pytest.mark.parametrize("maximize", [False, True])
def test_tracks_torch_adamw_over_ten_steps(dtype, bound, maximize):
    ours, theirs = small_model(dtype), small_model(dtype)
    train(ours, AdamW(param_groups(ours, maximize=maximize), lr=1e-2), 10, seed=1)
    train(theirs, torch.optim.AdamW(param_groups(theirs, maximize=maximize), lr=1e-2, foreach=False), 10, seed=1)
    assert max_difference(ours, small_model(dtype)) > 1e-2, "the parameters moved"
    assert max_difference(ours, theirs) <= bound


def test_the_state_dict_layout_is_torchs():
    ours, theirs = small_model(torch.float64), small_model(torch.float64)
    a, b = AdamW(param_groups(ours)), torch.optim.AdamW(param_groups(theirs))
    train(ours, a, 2, seed=3)
    train(theirs, b, 2, seed=3)
    sa, sb = a.state_dict(), b.state_dict()
    assert [sorted(g) for g in sa["param_groups"]] == [sorted(g) for g in sb["param_groups"]]
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    for k, state in sa["state"].items():
        assert state.keys() == sb["state"][k].keys() == {"step", "exp_avg", "exp_avg_sq"}
        assert state["step"].dtype == sb["state"][k]["step"].dtype and state["step"].item() == 2
        assert state["exp_avg"].dtype == torch.float64


@pytest.mark.parametrize("first, then", [(AdamW, torch.optim.AdamW), (torch.optim.AdamW, AdamW)])
def test_a_checkpoint_of_either_continues_in_the_other(first, then):
    model = small_model(torch.float64)
    optimizer = first(param_groups(model), lr=1e-2)
    train(model, optimizer, 3, seed=4)
    checkpoint = copy.deepcopy(optimizer.state_dict())
    reference = copy.deepcopy(model)
    train(model, optimizer, 3, seed=5)
    resumed = then(param_groups(reference), lr=1e-2)
    resumed.load_state_dict(checkpoint)
    train(reference, resumed, 3, seed=5)
    assert max_difference(model, reference) <= 1e-12


def test_mixed_dtypes_bfloat16_state_and_a_closure():
    model = small_model(torch.float32)
    model[3].to(torch.bfloat16)
    optimizer = AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(4, 8)

    def closure():
        optimizer.zero_grad()
        h = model[2](model[1](model[0](x)))
        loss = model[3](h.bfloat16()).float().pow(2).mean()
        loss.backward()
        return loss

    before = model[3].weight.detach().clone()
    assert torch.is_tensor(optimizer.step(closure))
    assert optimizer.state[model[3].weight]["exp_avg"].dtype == torch.bfloat16
    assert not torch.equal(model[3].weight, before)


def test_a_profiled_step_is_one_fused_op():
    model = small_model(torch.float32)
    optimizer = AdamW(param_groups(model))
    train(model, optimizer, 1, seed=6)  # the state is made on the first step
    model(torch.randn(2, 8)).sum().backward()
    with torch.autograd.profiler.profile() as prof:
        optimizer.step()
    step = next(e for e in prof.function_events if e.name == "Optimizer.step#AdamW.step")
    ops = [e.name for e in prof.function_events if e.cpu_parent is step and e.name != "aten::empty"]
    assert ops == ["opfuse::adamw_", "opfuse::adamw_"], ops  # one per group (empty: the profiler's own handle)


def test_errors_are_torchs_or_name_the_op():
    model = small_model(torch.float32)
    with pytest.raises(ValueError, match="amsgrad is not supported"):
        AdamW(model.parameters(), amsgrad=True)
    with pytest.raises(ValueError, match="Invalid learning rate"):
        AdamW(model.parameters(), lr=-1)
    with pytest.raises(ValueError, match="saved with amsgrad=True"):
        AdamW(model.parameters()).load_state_dict(torch.optim.AdamW(model.parameters(), amsgrad=True).state_dict())
    emb = torch.nn.Embedding(10, 3, sparse=True)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="does not support sparse gradients"):
        AdamW(emb.parameters()).step()
    p, m = torch.zeros(3), torch.zeros(3)
    with torch.no_grad():
        with pytest.raises(RuntimeError, match=r"opfuse::adamw_: params\[0\] and grads\[0\] must have the same shape"):
            torch.ops.opfuse.adamw_([p], [torch.zeros(4)], [m], [m.clone()], [torch.tensor(1.0)], 1e-3, 0.9, 0.999,
                                    1e-8, 0.0)
        with pytest.raises(RuntimeError, match="must have one entry per parameter, got 1, 1, 0, 1, 1"):
            torch.ops.opfuse.adamw_([p], [p], [], [m], [torch.tensor(1.0)], 1e-3, 0.9, 0.999, 1e-8, 0.0)


def _without_step_options(groups):
    return [{k: v for k, v in g.items() if k not in ("fused", "foreach")} for g in groups]


def test_fused_factory_steps_torchs_adamw_fused_and_leaves_others():
    model = small_model(torch.float64)
    swapped = opfuse.optim.fused_factory(lambda params: torch.optim.AdamW(param_groups(model), lr=2e-3, eps=1e-7))
    optimizer = swapped(model.parameters())
    reference = torch.optim.AdamW(param_groups(model), lr=2e-3, eps=1e-7)
    # torch's own fused step (opfuse's measured no faster), on the same groups and options
    assert type(optimizer) is torch.optim.AdamW and opfuse.optim.is_fused(optimizer)
    assert all(g["fused"] for g in optimizer.param_groups)
    assert _without_step_options(optimizer.state_dict()["param_groups"]) == \
        _without_step_options(reference.state_dict()["param_groups"])
    rmsprop = opfuse.optim.fused_factory(lambda params: torch.optim.RMSprop(params, lr=0.1))(model.parameters())
    assert type(rmsprop) is torch.optim.RMSprop and not opfuse.optim.is_fused(rmsprop)
    differentiable = opfuse.optim.fused_factory(lambda params: torch.optim.AdamW(params, differentiable=True))
    assert not opfuse.optim.is_fused(differentiable(model.parameters()))


def test_fused_factory_takes_opfuses_step_where_torch_has_no_fused_one(monkeypatch):
    monkeypatch.setattr(opfuse.optim, "_torchs_fused", lambda built: None)  # as a torch without one
    model = small_model(torch.float64)
    optimizer = opfuse.optim.fused_factory(lambda params: torch.optim.AdamW(param_groups(model), lr=2e-3))(
        model.parameters())
    assert type(optimizer) is AdamW
    reference = torch.optim.AdamW(param_groups(model), lr=2e-3)
    assert optimizer.state_dict()["param_groups"] == reference.state_dict()["param_groups"]
    amsgrad = opfuse.optim.fused_factory(lambda params: torch.optim.AdamW(params, amsgrad=True))(model.parameters())
    assert type(amsgrad) is torch.optim.AdamW and not opfuse.optim.is_fused(amsgrad)
    sgd = opfuse.optim.fused_factory(lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9))(model.parameters())
    assert type(sgd) is opfuse.optim.SGD


def test_fused_factory_steps_torchs_sgd_fused():
    model = small_model(torch.float64)
    make = opfuse.optim.fused_factory(lambda params: torch.optim.SGD(param_groups(model), lr=0.1, momentum=0.9,
                                                                       nesterov=True))
    optimizer = make(model.parameters())
    assert type(optimizer) is torch.optim.SGD and opfuse.optim.is_fused(optimizer)
    reference = torch.optim.SGD(param_groups(model), lr=0.1, momentum=0.9, nesterov=True)
    assert _without_step_options(optimizer.state_dict()["param_groups"]) == \
        _without_step_options(reference.state_dict()["param_groups"])


@pytest.mark.parametrize("torch_has_one", [True, False])
def test_fuse_in_place_keeps_the_object_its_state_and_its_trajectory(monkeypatch, torch_has_one):
    """A Trainer holds its optimizer (and its scheduler holds it too): fused in place after some
    steps, it goes on from its state as a fresh unfused copy would, to rounding."""
    if not torch_has_one:
        monkeypatch.setattr(opfuse.optim, "_torchs_fused", lambda built: None)
    ours, theirs = small_model(torch.float64), small_model(torch.float64)
    theirs.load_state_dict(ours.state_dict())
    a = torch.optim.AdamW(param_groups(ours), lr=5e-2)
    b = torch.optim.AdamW(param_groups(theirs), lr=5e-2)
    train(ours, a, 3, seed=1)
    train(theirs, b, 3, seed=1)
    assert opfuse.optim.fuse_in_place(a) and opfuse.optim.is_fused(a)
    assert type(a) is (torch.optim.AdamW if torch_has_one else AdamW)
    train(ours, a, 3, seed=2)
    train(theirs, b, 3, seed=2)
    for (n, p), q in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.allclose(p, q, rtol=1e-12, atol=1e-14), n


# opfuse.optim.SGD against torch.optim.SGD: the same bounds as AdamW's (each step is torch's
# arithmetic to rounding; torch's vectorised add fuses a multiply, ours does not). The first group
# decays its weights, the second not and without momentum (param_groups).
SGD_OPTIONS = [dict(momentum=0.9), dict(momentum=0.9, nesterov=True), dict(momentum=0.8, dampening=0.3, maximize=True),
               dict()]


@pytest.mark.parametrize("dtype, bound", [(torch.float64, 1e-12), (torch.float32, 5e-6)])
@pytest.mark.parametrize("options", SGD_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_sgd_tracks_torch_sgd_over_ten_steps(dtype, bound, options):
    ours, theirs = small_model(dtype), small_model(dtype)
    train(ours, opfuse.optim.SGD(param_groups(ours, **options), lr=5e-2), 10, seed=1)
    train(theirs, torch.optim.SGD(param_groups(theirs, **options), lr=5e-2, foreach=False), 10, seed=1)
    assert max_difference(ours, small_model(dtype)) > 1e-2, "the parameters moved"
    assert max_difference(ours, theirs) <= bound


@pytest.mark.parametrize("first, then", [(opfuse.optim.SGD, torch.optim.SGD), (torch.optim.SGD, opfuse.optim.SGD)])
def test_an_sgd_checkpoint_of_either_continues_in_the_other(first, then):
    model = small_model(torch.float64)
    optimizer = first(param_groups(model, momentum=0.9), lr=1e-2)
    train(model, optimizer, 3, seed=4)
    checkpoint = copy.deepcopy(optimizer.state_dict())
    buffers = [state["momentum_buffer"] for state in checkpoint["state"].values()]
    assert all(b.dtype == torch.float64 for b in buffers if b is not None) and any(b is not None for b in buffers)
    reference = copy.deepcopy(model)
    train(model, optimizer, 3, seed=5)
    resumed = then(param_groups(reference, momentum=0.9), lr=1e-2)
    resumed.load_state_dict(checkpoint)
    train(reference, resumed, 3, seed=5)
    assert max_difference(model, reference) <= 1e-12


def test_sgd_steps_a_tensor_listed_twice_and_bfloat16_as_torch_does():
    w, v = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    for make in (opfuse.optim.SGD, torch.optim.SGD):
        p = torch.nn.Parameter(w.clone())
        with pytest.warns(UserWarning, match="duplicate parameters"):
            optimizer = make([p, p], lr=0.1, momentum=0.9)
        for _ in range(3):
            p.grad = v.clone()
            optimizer.step()
        if make is opfuse.optim.SGD:
            ours = p.detach().clone()
    assert torch.allclose(ours, p.detach(), rtol=0, atol=1e-15)
    # bfloat16 computed in float: within a few of its ulps of torch's, which rounds every step
    a, b = (torch.nn.Parameter(torch.randn(1000).bfloat16()) for _ in range(2))
    b.data.copy_(a.data)
    steps = [(opfuse.optim.SGD([a], lr=0.1, momentum=0.9, weight_decay=1e-2), a),
             (torch.optim.SGD([b], lr=0.1, momentum=0.9, weight_decay=1e-2), b)]
    for k in range(5):
        g = torch.randn(1000, generator=torch.Generator().manual_seed(k)).bfloat16()
        for optimizer, p in steps:
            p.grad = g.clone()
            optimizer.step()
    assert (a.float() - b.float()).abs().max() <= 4 * 2 ** -8 * b.float().abs().max()


def test_sgd_steps_sparse_gradients_as_torch_does_and_a_profiled_step_is_one_fused_op():
    torch.manual_seed(0)
    emb, theirs = torch.nn.Embedding(10, 3, sparse=True), torch.nn.Embedding(10, 3, sparse=True)
    theirs.load_state_dict(emb.state_dict())
    for module, make in ((emb, opfuse.optim.SGD), (theirs, torch.optim.SGD)):
        optimizer = make(module.parameters(), lr=0.1, momentum=0.9)
        for _ in range(2):
            optimizer.zero_grad()
            module(torch.tensor([1, 2])).sum().backward()
            optimizer.step()
    assert torch.equal(emb.weight, theirs.weight)
    model = small_model(torch.float32)
    optimizer = opfuse.optim.SGD(param_groups(model, momentum=0.9), lr=1e-2)
    train(model, optimizer, 1, seed=6)
    model(torch.randn(2, 8)).sum().backward()
    with torch.autograd.profiler.profile() as prof:
        optimizer.step()
    step = next(e for e in prof.function_events if e.name == "Optimizer.step#SGD.step")
    ops = [e.name for e in prof.function_events if e.cpu_parent is step and e.name != "aten::empty"]
    assert ops == ["opfuse::sgd_", "opfuse::sgd_"], ops  # one per group
    with pytest.raises(ValueError, match="differentiable=True is not supported"):
        opfuse.optim.SGD(model.parameters(), lr=0.1, differentiable=True)
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero dampening"):
        opfuse.optim.SGD(model.parameters(), lr=0.1, nesterov=True)
