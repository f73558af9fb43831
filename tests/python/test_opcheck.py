"""torch.library.opcheck over every opfuse operator, its _forward/_backward halves included: the
schema's mutation and aliasing claims, the autograd registration, the fake (meta) kernels and AOT
dispatch with dynamic shapes, each on a few small sample calls (contiguous and strided inputs).
"""
import pytest

import torch


@pytest.fixture(scope="module", autouse=True)
def load_ops(ops_library):
    import opfuse  # noqa: F401  (loads the ops, each with its Meta kernel: src/ops/<op>/<op>.cpp)


def op(name):
    return getattr(torch.ops.opfuse, name).default


# Inputs. `grad=True` makes a leaf that requires grad (a strided view of a plain tensor may be one).

def rand(*shape, grad=False):
    return torch.randn(*shape).requires_grad_(grad)


def positive(*shape):
    return torch.rand(*shape) + 0.5


def leaf(t, grad=True):
    return t.detach().requires_grad_(grad)


def channels_last(*shape, grad=False):
    return leaf(torch.randn(*shape).contiguous(memory_format=torch.channels_last), grad)


def transposed(*shape, grad=False):
    """A [..., a, b] tensor whose last two dimensions are swapped in memory (not contiguous)."""
    return leaf(torch.randn(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2), grad)


def heads_last(b, h, t, d, grad=False):
    """[B, H, T, D] viewed from a [B, T, H, D] tensor (as a model's split heads are): not contiguous."""
    return leaf(torch.randn(b, t, h, d).transpose(1, 2), grad)


def every_other_column(*shape, grad=False):
    """Rows of a twice-wider matrix: the last dimension is dense, the rows are strided."""
    return leaf(torch.randn(*shape[:-1], 2 * shape[-1])[..., : shape[-1]], grad)


def call(name, *args, **kwargs):
    """An op's outputs without autograd: the inputs of a _backward sample."""
    with torch.no_grad():
        return op(name)(*args, **kwargs)


def rotary_tables(*shape):
    """cos, sin of a position x frequency angle table, shape [..., pairs]."""
    angles = torch.rand(*shape) * 6.0
    return angles.cos(), angles.sin()


def targets(classes, *rows, ignore=None):
    t = torch.randint(classes, rows)
    if ignore is not None:
        t.view(-1)[1] = ignore
    return t


def random_bool_mask(t, s):
    """A random boolean mask that keeps every row's diagonal key (no row is all masked)."""
    return (torch.rand(t, s) > 0.5) | torch.eye(t, s, dtype=torch.bool)


# Samples: op name -> [(pytest id, () -> (args, kwargs))], built fresh for each test.

def case(label, make):
    return (label, make)


def bn_forward(x, affine=True, stats=True, training=True):
    c = x.shape[1]
    grad = x.requires_grad
    weight, bias = (positive(c).requires_grad_(grad), rand(c, grad=grad)) if affine else (None, None)
    running = (torch.zeros(c), torch.ones(c)) if stats else (None, None)
    return (x, weight, bias, *running, training, 0.1, 1e-5), {}


def bn_backward(x, training):
    args, _ = bn_forward(x, training=training)
    y, mean, invstd = call("batch_norm_silu_forward", *args)
    return (torch.randn_like(y), x, args[1], args[2], mean, invstd, training), {}


def rms_norm_backward(x, weight):
    _, rstd = call("rms_norm_forward", x, weight, 1e-6)
    return (torch.randn_like(x), x, weight, rstd), {}


def add_rms_norm_backward(with_grad_h):
    weight = positive(16)
    y, h, rstd = call("add_rms_norm_forward", rand(3, 5, 16), rand(3, 5, 16), weight, 1e-6)
    return (torch.randn_like(y), torch.randn_like(h) if with_grad_h else None, h, weight, rstd), {}


def add_layer_norm_backward(with_grad_h):
    weight = positive(16)
    y, h, mean, rstd = call("add_layer_norm_forward", rand(3, 5, 16), rand(3, 5, 16), weight, rand(16), 1e-5)
    return (torch.randn_like(y), torch.randn_like(h) if with_grad_h else None, h, weight, mean, rstd), {}


def attention_backward(q, k, v, causal=False, scale=None, mask=None, mask_grad=False):
    out, stats, seed = call("attention_forward", q, k, v, causal, scale, mask, 0.0, None)
    return (torch.randn_like(out), q, k, v, out, stats, seed, causal, scale, mask, 0.0, mask_grad), {}


def cross_entropy_grad(logits, target, reduction, grad):
    _, grad_logits = call("cross_entropy_forward", logits, target, -100, reduction, 0.0)
    return (grad_logits, grad), {}


def optimizer_lists(n_state):
    """Two parameters (a channels_last conv weight, a bias), their gradients and n_state zeroed states each."""
    params = [channels_last(4, 3, 2, 2), rand(4)]
    grads = [torch.randn_like(p) for p in params]
    states = [[torch.zeros_like(p) for p in params] for _ in range(n_state)]
    return params, grads, states


def adamw(steps, **kwargs):
    params, grads, (exp_avgs, exp_avg_sqs) = optimizer_lists(2)
    exp_avg_sqs = [s + torch.rand_like(s) for s in exp_avg_sqs]  # non-negative, as a second moment is
    return (params, grads, exp_avgs, exp_avg_sqs, steps, 1e-3, 0.9, 0.999, 1e-8, 0.01), kwargs


def sgd(momentum, **kwargs):
    params, grads, (buffers,) = optimizer_lists(1)
    buffers = [torch.randn_like(b) for b in buffers] if momentum else []
    return (params, grads, buffers, 0.1), dict(momentum=momentum, **kwargs)


SAMPLES = {
    "silu": [
        case("contiguous", lambda: ((rand(4, 50, grad=True),), {})),
        case("transposed", lambda: ((transposed(6, 40, grad=True),), {})),
        case("channels_last", lambda: ((channels_last(2, 3, 4, 5, grad=True),), {})),
    ],
    "silu_backward": [
        case("contiguous", lambda: ((rand(4, 50), rand(4, 50)), {})),
        case("channels_last", lambda: ((channels_last(2, 3, 4, 5), channels_last(2, 3, 4, 5)), {})),
    ],
    "swish": [
        case("default_beta", lambda: ((rand(200, grad=True),), {})),
        case("beta_1.702", lambda: ((rand(4, 50, grad=True), 1.702), {})),
        case("transposed", lambda: ((transposed(6, 40, grad=True),), {"beta": 0.5})),
    ],
    "swish_backward": [
        case("contiguous", lambda: ((rand(4, 50), rand(4, 50), 1.702), {})),
        case("transposed", lambda: ((transposed(6, 40), transposed(6, 40), 0.5), {})),
    ],
    "se_gate": [
        case("nchw", lambda: ((rand(2, 4, 5, 5, grad=True), rand(2, 4, 1, 1, grad=True)), {})),
        case("channels_last", lambda: ((channels_last(2, 4, 5, 5, grad=True), rand(2, 4, 1, 1, grad=True)), {})),
        case("3d", lambda: ((rand(2, 8, 16, grad=True), rand(2, 8, 1, grad=True)), {})),
    ],
    "se_gate_backward": [
        case("nchw", lambda: ((rand(2, 4, 5, 5), rand(2, 4, 5, 5), rand(2, 4, 1, 1)), {})),
        case("channels_last", lambda: ((channels_last(2, 4, 5, 5), channels_last(2, 4, 5, 5), rand(2, 4, 1, 1)), {})),
    ],
    "batch_norm_silu": [
        case("training", lambda: bn_forward(rand(4, 3, 5, 5, grad=True))),
        case("eval", lambda: bn_forward(rand(4, 3, 5, 5, grad=True), training=False)),
        case("channels_last", lambda: bn_forward(channels_last(4, 3, 5, 5, grad=True))),
        case("2d_no_running_stats", lambda: bn_forward(rand(16, 6, grad=True), stats=False)),
        case("no_affine", lambda: bn_forward(rand(4, 3, 5, 5, grad=True), affine=False)),
    ],
    "batch_norm_silu_forward": [
        case("training", lambda: bn_forward(rand(4, 3, 5, 5))),
        case("eval_channels_last", lambda: bn_forward(channels_last(4, 3, 5, 5), training=False)),
    ],
    "batch_norm_silu_backward": [
        case("training", lambda: bn_backward(rand(4, 3, 5, 5), True)),
        case("eval_channels_last", lambda: bn_backward(channels_last(4, 3, 5, 5), False)),
    ],
    "drop_connect_add": [
        case("eval", lambda: ((rand(4, 3, 5, 5, grad=True), rand(4, 3, 5, 5, grad=True), 0.2, False), {})),
        case("p0_training", lambda: ((rand(4, 60, grad=True), rand(4, 60, grad=True), 0.0, True), {})),
        case("channels_last_eval",
             lambda: ((channels_last(4, 3, 5, 5, grad=True), channels_last(4, 3, 5, 5, grad=True), 0.2, False), {})),
    ],
    "drop_connect_add_forward": [
        case("eval", lambda: ((rand(4, 3, 5, 5), rand(4, 3, 5, 5), 0.2, False), {})),
        case("p0_training", lambda: ((rand(4, 60), rand(4, 60), 0.0, True), {})),
    ],
    "drop_connect_add_backward": [
        case("mask", lambda: ((rand(4, 3, 5, 5), call("drop_connect_add_forward", rand(4, 3, 5, 5),
                                                       rand(4, 3, 5, 5), 0.5, True)[1], 0.5), {})),
        case("no_mask", lambda: ((rand(4, 3, 5, 5), None, 0.0), {})),
    ],
    "rms_norm": [
        case("contiguous", lambda: ((rand(3, 5, 16, grad=True), positive(16).requires_grad_()), {})),
        case("transposed", lambda: ((transposed(12, 16, grad=True), positive(16).requires_grad_(), 1e-5), {})),
    ],
    "rms_norm_forward": [
        case("contiguous", lambda: ((rand(3, 5, 16), positive(16), 1e-6), {})),
    ],
    "rms_norm_backward": [
        case("contiguous", lambda: rms_norm_backward(rand(3, 5, 16), positive(16))),
    ],
    "add_rms_norm": [
        case("contiguous", lambda: ((rand(3, 5, 16, grad=True), rand(3, 5, 16, grad=True),
                                     positive(16).requires_grad_()), {})),
        case("transposed", lambda: ((transposed(12, 16, grad=True), rand(12, 16, grad=True),
                                     positive(16).requires_grad_(), 1e-5), {})),
    ],
    "add_rms_norm_forward": [
        case("contiguous", lambda: ((rand(3, 5, 16), rand(3, 5, 16), positive(16), 1e-6), {})),
    ],
    "add_rms_norm_backward": [
        case("grad_h", lambda: add_rms_norm_backward(with_grad_h=True)),
        case("no_grad_h", lambda: add_rms_norm_backward(with_grad_h=False)),
    ],
    "add_layer_norm": [
        case("contiguous", lambda: ((rand(3, 5, 16, grad=True), rand(3, 5, 16, grad=True),
                                     positive(16).requires_grad_(), rand(16, grad=True)), {})),
        case("transposed", lambda: ((transposed(12, 16, grad=True), rand(12, 16, grad=True),
                                     positive(16).requires_grad_(), rand(16, grad=True), 1e-6), {})),
    ],
    "add_layer_norm_forward": [
        case("contiguous", lambda: ((rand(3, 5, 16), rand(3, 5, 16), positive(16), rand(16), 1e-5), {})),
    ],
    "add_layer_norm_backward": [
        case("grad_h", lambda: add_layer_norm_backward(with_grad_h=True)),
        case("no_grad_h", lambda: add_layer_norm_backward(with_grad_h=False)),
    ],
    "swiglu": [
        case("contiguous", lambda: ((rand(4, 48, grad=True), rand(4, 48, grad=True)), {})),
        case("strided_rows",
             lambda: ((every_other_column(4, 48, grad=True), every_other_column(4, 48, grad=True)), {})),
    ],
    "swiglu_backward": [
        case("contiguous", lambda: ((rand(4, 48), rand(4, 48), rand(4, 48)), {})),
    ],
    "swiglu_packed": [
        case("contiguous", lambda: ((rand(2, 3, 64, grad=True),), {})),
        case("transposed", lambda: ((transposed(3, 8, 32, grad=True),), {})),
    ],
    "swiglu_packed_backward": [
        case("contiguous", lambda: ((rand(2, 3, 32), rand(2, 3, 64)), {})),
    ],
    "geglu": [
        case("contiguous", lambda: ((rand(4, 48, grad=True), rand(4, 48, grad=True)), {})),
        case("transposed", lambda: ((transposed(48, 4, grad=True), transposed(48, 4, grad=True)), {})),
    ],
    "geglu_backward": [
        case("contiguous", lambda: ((rand(4, 48), rand(4, 48), rand(4, 48)), {})),
    ],
    # x [B, H, T, D] with tables [T, D/2]; x [B, T, H, D] with [T, 1, D/2]; per-element tables [T, D].
    "rotary_embedding": [
        case("bhtd_half_tables", lambda: ((rand(2, 2, 6, 8, grad=True), *rotary_tables(6, 4)), {})),
        case("bthd_interleaved", lambda: ((rand(2, 6, 2, 8, grad=True), *rotary_tables(6, 1, 4), True), {})),
        case("heads_last_full_tables",
             lambda: ((heads_last(2, 2, 6, 8, grad=True), *(torch.cat([t, t], -1) for t in rotary_tables(6, 4))), {})),
    ],
    "rotary_embedding_backward": [
        case("bhtd", lambda: ((rand(2, 2, 6, 8), *rotary_tables(6, 4), False), {})),
        case("bthd_interleaved", lambda: ((rand(2, 6, 2, 8), *rotary_tables(6, 1, 4), True), {})),
    ],
    "cross_entropy": [
        case("mean", lambda: ((rand(8, 20, grad=True), targets(20, 8)), {})),
        case("3d_none_ignore", lambda: ((rand(2, 4, 20, grad=True), targets(20, 2, 4, ignore=-100)),
                                        {"reduction": 0})),
        case("strided_rows_sum_smoothing", lambda: ((every_other_column(8, 20, grad=True), targets(20, 8)),
                                                    {"reduction": 2, "label_smoothing": 0.1})),
        case("custom_ignore_index", lambda: ((rand(8, 20, grad=True), targets(20, 8, ignore=3)), {"ignore_index": 3})),
    ],
    "cross_entropy_forward": [
        case("mean", lambda: ((rand(8, 20), targets(20, 8, ignore=-100), -100, 1, 0.0), {})),
        case("none_smoothing", lambda: ((rand(2, 4, 20), targets(20, 2, 4), -100, 0, 0.1), {})),
    ],
    "cross_entropy_backward_": [
        case("scalar_grad", lambda: cross_entropy_grad(rand(8, 20), targets(20, 8), 1, torch.tensor(0.5))),
        case("per_row_grad", lambda: cross_entropy_grad(rand(2, 4, 20), targets(20, 2, 4), 0, rand(2, 4))),
    ],
    "linear_cross_entropy": [
        case("mean", lambda: ((rand(8, 16, grad=True), rand(30, 16, grad=True), targets(30, 8)), {})),
        case("3d_sum_ignore_smoothing",
             lambda: ((rand(2, 4, 16, grad=True), rand(30, 16, grad=True), targets(30, 2, 4, ignore=-100)),
                      {"reduction": 2, "label_smoothing": 0.1})),
        case("transposed_h_frozen_weight",
             lambda: ((transposed(8, 16, grad=True), rand(30, 16), targets(30, 8)), {})),
    ],
    "linear_cross_entropy_forward": [
        case("both_grads", lambda: ((rand(8, 16), rand(30, 16), targets(30, 8), -100, 1, 0.0, True, True), {})),
        case("grad_h_only", lambda: ((rand(8, 16), rand(30, 16), targets(30, 8), -100, 2, 0.1, True, False), {})),
        case("no_grads", lambda: ((rand(8, 16), rand(30, 16), targets(30, 8), -100, 1, 0.0, False, False), {})),
    ],
    "adamw_": [
        case("fresh_state", lambda: adamw([torch.tensor(0.0), torch.tensor(0.0)])),
        case("later_steps_maximize", lambda: adamw([torch.tensor([3.0]), torch.tensor(7.0)], maximize=True)),
    ],
    "sgd_": [
        case("no_momentum", lambda: sgd(0.0)),
        case("momentum", lambda: sgd(0.9, dampening=0.1, weight_decay=1e-4)),
        case("nesterov_fresh_buffers", lambda: sgd(0.9, nesterov=True, fresh_buffers=True)),
    ],
    # q [B, H, T, D], k and v [B, H, S, *].
    "attention": [
        case("plain", lambda: ((rand(2, 2, 6, 8, grad=True), rand(2, 2, 6, 8, grad=True),
                                rand(2, 2, 6, 8, grad=True)), {})),
        case("causal", lambda: ((rand(2, 2, 6, 8, grad=True), rand(2, 2, 6, 8, grad=True),
                                 rand(2, 2, 6, 8, grad=True)), {"causal": True})),
        case("additive_mask", lambda: ((rand(2, 2, 6, 8, grad=True), rand(2, 2, 5, 8, grad=True),
                                        rand(2, 2, 5, 4, grad=True)), {"attn_mask": rand(6, 5)})),
        case("additive_mask_grad_scale", lambda: ((rand(1, 2, 6, 8, grad=True), rand(1, 2, 6, 8, grad=True),
                                                   rand(1, 2, 6, 8, grad=True)),
                                                  {"attn_mask": rand(2, 6, 6, grad=True), "scale": 0.3})),
        case("bool_mask", lambda: ((rand(2, 2, 6, 8, grad=True), rand(2, 2, 6, 8, grad=True),
                                    rand(2, 2, 6, 8, grad=True)), {"attn_mask": random_bool_mask(6, 6)})),
        case("heads_last_causal", lambda: ((heads_last(2, 2, 6, 8, grad=True), heads_last(2, 2, 6, 8, grad=True),
                                            heads_last(2, 2, 6, 8, grad=True)), {"causal": True})),
        case("3d_heads", lambda: ((rand(4, 6, 8, grad=True), rand(4, 6, 8, grad=True), rand(4, 6, 8, grad=True)), {})),
    ],
    "attention_forward": [
        case("plain",
             lambda: ((rand(2, 2, 6, 8), rand(2, 2, 6, 8), rand(2, 2, 6, 8), False, None, None, 0.0, None), {})),
        case("causal_additive_mask", lambda: ((rand(2, 2, 6, 8), rand(2, 2, 6, 8), rand(2, 2, 6, 8), True, 0.3,
                                               rand(6, 6), 0.0, None), {})),
    ],
    "attention_backward": [
        case("plain", lambda: attention_backward(rand(2, 2, 6, 8), rand(2, 2, 5, 8), rand(2, 2, 5, 4))),
        case("causal", lambda: attention_backward(rand(2, 2, 6, 8), rand(2, 2, 6, 8), rand(2, 2, 6, 8), causal=True)),
        case("additive_mask_grad", lambda: attention_backward(rand(1, 2, 6, 8), rand(1, 2, 6, 8), rand(1, 2, 6, 8),
                                                              scale=0.3, mask=rand(2, 6, 6), mask_grad=True)),
    ],
}

# op -> (the opcheck utilities it is run with, why not all of them). Only ops that cannot pass a
# utility by their nature belong here, never ones merely missing a kernel.
KNOWN_LIMITS: dict[str, tuple[tuple[str, ...], str]] = {}


def test_every_op_has_samples():
    registered = {name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("opfuse::")}
    assert registered, "no opfuse ops registered"
    assert sorted(registered - SAMPLES.keys()) == [], "ops without opcheck samples"
    assert sorted(SAMPLES.keys() - registered) == [], "samples for ops that are not registered"
    assert all(SAMPLES.values()), "an op with an empty sample list"
    assert KNOWN_LIMITS.keys() <= registered


@pytest.mark.parametrize("name, index", [pytest.param(name, i, id=f"{name}-{label}")
                                         for name, cases in SAMPLES.items()
                                         for i, (label, _) in enumerate(cases)])
def test_opcheck(name, index):
    torch.manual_seed(index)
    args, kwargs = SAMPLES[name][index][1]()
    if name in KNOWN_LIMITS:
        test_utils, _reason = KNOWN_LIMITS[name]
        torch.library.opcheck(op(name), args, kwargs, test_utils=test_utils)
    else:
        torch.library.opcheck(op(name), args, kwargs)
