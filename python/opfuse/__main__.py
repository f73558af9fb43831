"""python3 -m opfuse tune FILE.py:FACTORY [--out DIR] [--nproc N] …: the tune loop on a Python model,
no code edit. FACTORY() returns (model, inputs, loss_fn[, optimizer_factory]); with --nproc N (or
under torchrun) it runs on every rank, which may call torch.distributed.get_rank() to pick its
shard of the data."""
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
    t.add_argument("--profiler", choices=("opfuse", "torch"), default="opfuse",
                   help="what records the profiles: opfuse's own profiler or torch.profiler (Kineto)")
    t.add_argument("--threads", type=int, default=0, help="intra-op threads (0: all cores)")
    t.add_argument("--json", help="also write report.json's content to FILE")
    t.add_argument("--compare-compile", action="store_true",
                   help="also measure the baseline and the tuned model under torch.compile, in the same rounds")
    t.add_argument("--for-compile", action="store_true",
                   help="time every variant under torch.compile: keep what pays for a model trained compiled")
    t.add_argument("--nproc", type=int, default=1,
                   help="ranks on this machine, started by torch's launcher (torch.distributed.run), Gloo between them")
    t.add_argument("--timeout", type=float, default=600,
                   help="seconds a rank waits for the others in a collective before giving up (with --nproc)")
    a = sub.add_parser("analyze", help="the analysis of a trace (or two, with their diff)")
    a.add_argument("traces", nargs="+")
    a.add_argument("--rules", action="append", default=[])
    args = parser.parse_args(argv)

    if args.command == "tune" and args.nproc > 1 and "RANK" not in os.environ:
        return launch(args.nproc, sys.argv[1:] if argv is None else argv)

    import torch
    import opfuse

    try:
        if args.command == "analyze":
            print(opfuse.analyze(args.traces, rules=args.rules))
            return 0
        if args.json:
            opfuse._C.check_output_path(args.json, args.force)
        ranks = opfuse.distributed.init_from_environment(args.timeout)
        per_rank = max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        torch.set_num_threads(args.threads or per_rank)
        model, inputs, loss_fn, *optimizer = load_factory(args.factory)
        result = opfuse.tune(model, inputs, loss_fn, optimizer[0] if optimizer else None, rules=args.rules,
                             no_default_rules=args.no_default_rules, out=args.out, force=args.force,
                             min_gain=args.min_gain, steps=args.steps, rounds=args.rounds,
                             max_rounds=args.max_rounds, keep_inconclusive=args.keep_inconclusive, warmup=args.warmup,
                             profile_steps=args.profile_steps, compare_compile=args.compare_compile,
                             for_compile=args.for_compile,
                             profiler=args.profiler)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"opfuse: {e}", file=sys.stderr)
        return 2
    except opfuse.distributed.RankFailed as e:
        print(f"opfuse: {e}", file=sys.stderr)
        return 3
    if args.json and (not ranks or torch.distributed.get_rank() == 0):
        import json
        with open(args.json, "w") as f:
            json.dump(result.to_json(), f, indent=2)
    code = 0 if any(r.verified for r in result.replacements) else 1
    if ranks:
        leave_together(result)
    return code


def leave_together(result):
    """Every rank leaves together, holding nothing of the process group. The tuned model's
    DistributedDataParallel keeps the group alive past destroy_process_group; freed later, during
    the interpreter's shutdown, Gloo's threads abort the rank ("terminate called without an
    active exception"). So the model goes first, then the group, while Python is whole."""
    import gc
    import torch
    result.model = None
    gc.collect()
    torch.distributed.barrier()  # rank 0 holds the rendezvous store: no rank may still use it
    torch.distributed.destroy_process_group()
    gc.collect()


def launch(nproc, argv):
    """Starts nproc ranks of this command on this machine through torch's own launcher (the
    elastic agent torchrun runs); returns the job's exit status, naming a rank that failed."""
    import socket
    import tempfile
    import uuid
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    with socket.socket() as s:  # a free port for the rendezvous: runs side by side do not collide
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    # The agent's per-rank folders (error files) go to a folder removed when the job ends: left
    # to itself it makes a /tmp/torchelastic_* folder per run and never removes it.
    with tempfile.TemporaryDirectory(prefix="opfuse-launch-") as log_dir:
        logs = DefaultLogsSpecs(log_dir=log_dir, redirects=Std.NONE, tee=Std.NONE)
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                              rdzv_backend="c10d", rdzv_endpoint=f"localhost:{port}", max_restarts=0,
                              monitor_interval=1, logs_specs=logs)
        try:
            elastic_launch(config, sys.executable)("-m", "opfuse", *argv)
        except ChildFailedError as e:
            failures = sorted(e.failures.items())  # by global rank
            causes = [(r, f) for r, f in failures if f.exitcode not in (1, 2, 3)]  # 1-3: opfuse's own ends, said already
            if not causes:
                return max(f.exitcode for _, f in failures)
            names = ", ".join(f"rank {r} ({_ending(f.exitcode)})" for r, f in causes)
            print(f"opfuse: {names} ended the job; the other ranks were stopped", file=sys.stderr)
            return 3
    return 0


def _ending(exitcode):
    if exitcode < 0:
        import signal
        return f"killed by {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"


if __name__ == "__main__":
    sys.exit(main())
