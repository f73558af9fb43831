"""python3 -m opfuse tune FILE.py:FACTORY [--out DIR] …: the tune loop on a Python model, no code
edit. FACTORY() returns (model, inputs, loss_fn[, optimizer_factory])."""
import argparse
import importlib.util
import os
import sys


def load_factory(spec):
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise SystemExit(f"opfuse: {spec}: expected FILE.py:FACTORY")
    if not os.path.isfile(path):
        raise SystemExit(f"opfuse: {path}: no such file")
    module_spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    module_spec.loader.exec_module(module)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise SystemExit(f"opfuse: {path}: no function {name}")
    made = factory()
    if not isinstance(made, tuple) or len(made) not in (3, 4):
        raise SystemExit(f"opfuse: {spec}() must return (model, inputs, loss_fn[, optimizer])")
    return made


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m opfuse", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tune", help="profile, find chains, replace, verify, measure, report")
    t.add_argument("factory", metavar="FILE.py:FACTORY")
    t.add_argument("--out", default="opfuse-out", help="folder for the report and traces (a numbered sibling if it holds a run)")
    t.add_argument("--force", action="store_true", help="write into --out even if it holds an earlier run")
    t.add_argument("--rules", action="append", default=[], help="also use the rules in FILE (first)")
    t.add_argument("--no-default-rules", action="store_true")
    t.add_argument("--min-gain", type=float, default=0.02)
    t.add_argument("--steps", type=int, default=3)
    t.add_argument("--rounds", type=int, default=5)
    t.add_argument("--max-rounds", type=int, default=20, help="more rounds while a gain's interval straddles --min-gain")
    t.add_argument("--keep-inconclusive", action="store_true", help="keep replacements still unclear after --max-rounds")
    t.add_argument("--warmup", type=int, default=2)
    t.add_argument("--profile-steps", type=int, default=2)
    t.add_argument("--threads", type=int, default=0, help="intra-op threads (0: all cores)")
    t.add_argument("--json", help="also write report.json's content to FILE")
    a = sub.add_parser("analyze", help="the analysis of a trace (or two, with their diff)")
    a.add_argument("traces", nargs="+")
    a.add_argument("--rules", action="append", default=[])
    args = parser.parse_args(argv)

    import torch
    import opfuse

    try:
        if args.command == "analyze":
            print(opfuse.analyze(args.traces, rules=args.rules))
            return 0
        if args.json:
            opfuse._C.check_output_path(args.json, args.force)
        torch.set_num_threads(args.threads or os.cpu_count() or 1)
        model, inputs, loss_fn, *optimizer = load_factory(args.factory)
        result = opfuse.tune(model, inputs, loss_fn, optimizer[0] if optimizer else None, rules=args.rules,
                             no_default_rules=args.no_default_rules, out=args.out, force=args.force,
                             min_gain=args.min_gain, steps=args.steps, rounds=args.rounds,
                             max_rounds=args.max_rounds, keep_inconclusive=args.keep_inconclusive, warmup=args.warmup,
                             profile_steps=args.profile_steps)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"opfuse: {e}", file=sys.stderr)
        return 2
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump(result.to_json(), f, indent=2)
    return 0 if any(r.verified for r in result.replacements) else 1


if __name__ == "__main__":
    sys.exit(main())
