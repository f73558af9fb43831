"""Each opfuse op against torch's own spelling of its chain, eager and under torch.compile: what
decides which one `opfuse.functional` hands inductor (its is_compiling branches).

For every op, four training steps of a one-op model (the op's inputs are its parameters, so its
whole backward runs; loss = Σ out·g for a fixed g; SGD fused) are measured together in tune's
paired rounds: torch's chain eager, opfuse's op eager, the chain compiled, the op compiled. Only
the op is compiled, not the loss: in a model its neighbours are mostly matmuls, which inductor
calls rather than fuses, and a loss fused into the chain's kernel would favour the chain. The
table gives opfuse's speed-up over the chain, eager and compiled, with 95% intervals.

    .venv/bin/python bench/compile_ops.py [--ops rms_norm,swiglu] [--size llama|large] [--rounds 10]

Sizes: "llama" is the Llama-style test model's (512 tokens of 128, 4 heads), "large" a 7B-class
layer's rows (2048 tokens of 1024, 8 heads); "b0-mid" and "b0-late" time EfficientNet-B0's ops
(silu, se_gate, batch_norm_silu) on its small planes at 96 px, [16, 672, 6, 6] and
[16, 1152, 3, 3] (bench-op's shapes keep 56×56). Check first that nothing else is busy (it prints
`top`'s head). A cold inductor compile takes tens of seconds per variant.
"""
import argparse
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

import opfuse  # noqa: E402
from opfuse import compile_peer, functional as OF  # noqa: E402

SIZES = {"llama": dict(tokens=512, dim=128, heads=4, hidden=320, vocab=512),
         "large": dict(tokens=2048, dim=1024, heads=8, hidden=2816, vocab=32000),
         "b0-mid": dict(planes=(16, 672, 6, 6)),
         "b0-late": dict(planes=(16, 1152, 3, 3))}


def _rand(*shape, grad=True):
    return torch.nn.Parameter(torch.randn(*shape)) if grad else torch.randn(*shape)


def plane_cases(n, c, h, w):
    """EfficientNet's ops on [n, c, h, w] activations; BatchNorm in training, its running
    statistics buffers."""
    ops = torch.ops.opfuse
    stats = (torch.zeros(c), torch.ones(c))
    return {
        "silu": ([_rand(n, c, h, w)], (), lambda x: F.silu(x), lambda x: ops.silu(x)),
        "se_gate": ([_rand(n, c, h, w), _rand(n, c, 1, 1)], (), lambda x, g: x * torch.sigmoid(g),
                    lambda x, g: ops.se_gate(x, g)),
        "batch_norm_silu": ([_rand(n, c, h, w), _rand(c), _rand(c)], stats,
                            lambda x, wt, b, m, v: F.silu(F.batch_norm(x, m, v, wt, b, True, 0.1, 1e-3)),
                            lambda x, wt, b, m, v: ops.batch_norm_silu(x, wt, b, m, v, True, 0.1, 1e-3)),
    }


def cases(s):
    """name -> (inputs that train, constants, torch's chain, opfuse's op)."""
    if "planes" in s:
        return plane_cases(*s["planes"])
    t, d, h, f = s["tokens"], s["dim"], s["heads"], s["hidden"]
    hd = d // h
    eps = 1e-5
    angles = torch.randn(t // 8, 1, hd // 2)  # x [8, T, H, D]: an angle per position and pair
    tables = (angles.cos(), angles.sin())
    logits_target = torch.randint(s["vocab"], (t,))
    ops = torch.ops.opfuse
    return {
        "rms_norm": ([_rand(t, d), _rand(d)], (),
                     lambda x, w: OF.rms_norm_composite(x, w, eps), lambda x, w: ops.rms_norm(x, w, eps)),
        "add_rms_norm": ([_rand(t, d), _rand(t, d), _rand(d)], (),
                         lambda x, r, w: (OF.rms_norm_composite(x + r, w, eps), x + r),
                         lambda x, r, w: ops.add_rms_norm(x, r, w, eps)),
        "swiglu": ([_rand(t, f), _rand(t, f)], (), lambda g, u: F.silu(g) * u, lambda g, u: ops.swiglu(g, u)),
        "geglu": ([_rand(t, f), _rand(t, f)], (), lambda g, u: F.gelu(g, approximate="tanh") * u,
                  lambda g, u: ops.geglu(g, u)),
        "rotary_embedding": ([_rand(8, t // 8, h, hd)], tables,
                             lambda x, c, sn: OF.rotary_embedding_composite(x, c, sn),
                             lambda x, c, sn: ops.rotary_embedding(x, c, sn, False)),
        "add_layer_norm": ([_rand(t, d), _rand(t, d), _rand(d), _rand(d)], (),
                           lambda x, r, w, b: (F.layer_norm(x + r, (d,), w, b, eps), x + r),
                           lambda x, r, w, b: ops.add_layer_norm(x, r, w, b, eps)),
        "cross_entropy": ([_rand(t, s["vocab"])], (logits_target,),
                          lambda z, y: F.cross_entropy(z, y), lambda z, y: ops.cross_entropy(z, y, -100, 1, 0.0)),
        "silu": ([_rand(t, f)], (), lambda x: F.silu(x), lambda x: ops.silu(x)),
    }


class OneOp(torch.nn.Module):
    """The op as a model: its trained inputs are parameters, its constants buffers; fn compiled
    (forward and backward) when asked."""

    def __init__(self, fn, params, constants, compiled):
        super().__init__()
        self.fn = torch.compile(fn, fullgraph=True) if compiled else fn
        self.params = torch.nn.ParameterList([torch.nn.Parameter(p.detach().clone()) for p in params])
        for i, c in enumerate(constants):
            self.register_buffer(f"c{i}", c.clone())
        self.n_constants = len(constants)

    def forward(self, g):
        out = self.fn(*self.params, *(getattr(self, f"c{i}") for i in range(self.n_constants)))
        outs = out if isinstance(out, tuple) else (out,)
        return sum((o * g[: o.numel()].view(o.shape)).sum() for o in outs)


def workloads(params, constants, chain, op):
    """torch's chain eager, opfuse's op eager, the chain compiled, the op compiled."""
    g = torch.randn(max(p.numel() for p in params) * 2)
    made = []
    for fn, compiled in ((chain, False), (op, False), (chain, True), (op, True)):
        model = OneOp(fn, params, constants, compiled)
        made.append(opfuse.PythonWorkload(model, (g,), lambda loss: loss,
                                          lambda ps: torch.optim.SGD(ps, lr=1e-6, fused=True), [], calls={}))
    return made


def paired(rounds_a, rounds_b):
    """b's speed-up over a: the median of the paired ratios and its bootstrap interval."""
    return compile_peer._paired({"a": {"ms": 0, "ms_rounds": rounds_a}, "b": {"ms": 0, "ms_rounds": rounds_b}},
                                       "a", "b")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default=None, help="comma-separated ops (default: all)")
    p.add_argument("--size", choices=sorted(SIZES), default="llama")
    p.add_argument("--rounds", type=int, default=10, help="paired rounds")
    p.add_argument("--steps", type=int, default=20, help="training steps per variant and round")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print("\n".join(subprocess.run(["top", "-bn1"], capture_output=True, text=True).stdout.splitlines()[6:12]))
    table = cases(SIZES[args.size])
    names = args.ops.split(",") if args.ops else list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        p.error(f"unknown op(s) {', '.join(unknown)}; known: {', '.join(table)}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, size {args.size} {SIZES[args.size]}, "
          f"{args.rounds} paired rounds of {args.steps} steps")
    print(f"{'op':<18} {'chain eager':>11} {'op eager':>9} {'eager: op over chain':>28} "
          f"{'chain compiled':>14} {'op compiled':>11} {'compiled: op over chain':>28}")
    for name in names:
        torch._dynamo.reset()  # each op compiles afresh, within dynamo's limit of recompilations
        made = workloads(*table[name])
        for w in made:
            w.step()  # compiles outside the rounds
        got = opfuse._C.interleave(made, args.steps, args.rounds, 2)["variants"]
        eager, compiled = paired(got[0]["ms_rounds"], got[1]["ms_rounds"]), paired(got[2]["ms_rounds"],
                                                                                 got[3]["ms_rounds"])
        print(f"{name:<18} {got[0]['ms']:>9.3f}ms {got[1]['ms']:>7.3f}ms "
              f"{'x%.3f [%.3f, %.3f]' % (eager['estimate'], *eager['ci']):>28} "
              f"{got[2]['ms']:>12.3f}ms {got[3]['ms']:>9.3f}ms "
              f"{'x%.3f [%.3f, %.3f]' % (compiled['estimate'], *compiled['ci']):>28}", flush=True)


if __name__ == "__main__":
    main()
