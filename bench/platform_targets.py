"""Issue 36's targets on the two test models, each trained with its usual recipe and torch 2.x's
best built-in options as the baseline (the Python EfficientNet-B0 with SGD(fused=True), as
written and again with its weights channels-last; the Llama-style model with
F.scaled_dot_product_attention and AdamW(fused=True)): opfuse-tuned eager
against that eager, and opfuse + torch.compile against torch.compile alone, all four measured in
the same paired rounds (opfuse.tune with compare_compile).

    .venv/bin/python bench/platform_targets.py [--rounds 5] [--threads 2] [--only TEXT] [--for-compile]

With --for-compile, tune times every variant under torch.compile (opfuse.tune's for_compile), so
the rewrites it keeps are those that pay for a model trained compiled: the "opfuse + compile" row
is then that model, and the eager target does not apply.

Check first that nothing else is busy (it prints `top`'s head).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python", "models"))
sys.path.insert(0, os.path.join(ROOT, "python"))

import efficientnet  # noqa: E402
import llama  # noqa: E402
import opfuse  # noqa: E402

TARGET_EAGER = 1.20  # opfuse-tuned eager over the best built-in eager


def recipes():
    """(name, (model, inputs, loss_fn), optimizer factory) with torch's best built-in options."""
    yield ("EfficientNet-B0 (Python), SGD fused", efficientnet.factory(image_size=96, batch_size=16),
           lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9, fused=True))
    # channels-last is a built-in option too: the same model with its weights moved there first,
    # where opfuse's channels_last rule has nothing left to do
    model, inputs, loss = efficientnet.factory(image_size=96, batch_size=16)
    yield ("EfficientNet-B0 (Python), SGD fused, channels-last", (model.to(memory_format=torch.channels_last), inputs, loss),
           lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9, fused=True))
    yield ("Llama-style, SDPA, AdamW fused, loss inside", llama.factory(attention="sdpa", loss_inside=True),
           lambda params: torch.optim.AdamW(params, lr=3e-4, fused=True))


def interval(pair):
    return f"[{pair[0]:.3f}, {pair[1]:.3f}]"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="paired rounds (tune's --rounds)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads")
    p.add_argument("--only", metavar="TEXT", help="only the recipes whose name holds TEXT (efficientnet, channels-last, llama)")
    p.add_argument("--for-compile", action="store_true", help="tune for a model trained under torch.compile")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("\n".join(subprocess.run(["top", "-bn1"], capture_output=True, text=True).stdout.splitlines()[6:12]))
    rows = []
    for name, (model, inputs, loss), optimizer in recipes():
        if args.only and args.only.lower() not in name.lower():
            continue
        out = tempfile.mkdtemp(prefix="opfuse-targets-")
        # up to tune's 20 rounds while a gain is unclear, or exactly --rounds where that is more
        r = opfuse.tune(model, inputs, loss, optimizer, rounds=args.rounds, max_rounds=max(args.rounds, 20),
                        compare_compile=True, for_compile=args.for_compile, quiet=True, out=out)
        print(f"\n## {name}\n{r.text}\nkept: {[x.rule for x in r.replacements if x.kept]}; folder {out}")
        compiled = r.to_json()["compile"]
        by_variant = {v["variant"]: v for v in compiled["variants"]}
        rows.append((name, r, by_variant, compiled["opfuse_compile_vs_compile"]))
    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} threads; speed-ups over the best built-in eager, "
          "medians of paired rounds [95% interval]")
    for name, r, by_variant, paired in rows:
        eager = by_variant["eager"]
        target = ("tune's ratio, both under compile" if args.for_compile else
                  f"{'meets' if r.speedup_ci[0] >= TARGET_EAGER else 'below'} x{TARGET_EAGER:.2f}")
        line = [f"{name}: eager {eager['ms']:.2f} ms/step", f"opfuse x{r.speedup:.3f} {interval(r.speedup_ci)} ({target})"]
        for variant in ("compile", "opfuse + compile"):
            v = by_variant[variant]
            line.append(f"{variant} " + (f"x{v['speedup_vs_first']:.3f} {interval(v['speedup_vs_first_ci'])}"
                                         if "ms" in v else f"failed: {v['error']}"))
        if paired is not None:
            line.append(f"opfuse + compile vs compile x{paired['estimate']:.3f} {interval(paired['ci'])}")
        print("  " + "; ".join(line))


if __name__ == "__main__":
    main()
