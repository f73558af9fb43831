"""The zoo's table: every model of tests/python/models/zoo.py trained eager, opfuse-tuned, under
torch.compile, and opfuse + torch.compile, the four in the same paired rounds (opfuse.tune with
compare_compile), each model in its own process (so its peak RSS is its own).

    .venv/bin/python bench/zoo.py [--models llama_sdpa,timm_resnet50] [--size bench] [--rounds 5]
                                  [--out zoo-run]

Writes OUT/zoo.json, OUT/zoo.csv, OUT/zoo.md (the README's table) and OUT/zoo.png, plus each
model's tune folder (report.json, report.html, traces). Check first that nothing else is busy.
`--merge A/zoo.json B/zoo.json --out DIR` makes one table of runs made apart.
"""
import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python", "models"))
VARIANTS = ("eager", "opfuse", "compile", "opfuse + compile")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    p.add_argument("--size", default="bench", choices=("test", "bench"), help="the zoo's model size")
    p.add_argument("--rounds", type=int, default=5, help="paired rounds (tune's --rounds; --max-rounds is 4x)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: one per core)")
    p.add_argument("--for-compile", action="store_true",
                   help="tune for compiled training (opfuse.tune's for_compile): what opfuse keeps is what pays under compile")
    p.add_argument("--out", default="zoo-run", help="results folder (a numbered sibling if it exists)")
    p.add_argument("--merge", nargs="+", metavar="ZOO.JSON",
                   help="measure nothing: write the table, CSV and plot of earlier runs' zoo.json files into --out "
                        "(a model measured twice keeps its later row)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # a child: one model, its row as JSON on stdout
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args)))
        return 0
    if args.merge:
        return merge(args)
    import zoo
    names = [n for n in args.models.split(",") if n] or zoo.names()
    unknown = [n for n in names if n not in zoo.CATALOGUE]
    if unknown:
        p.error(f"not in the zoo: {', '.join(unknown)}")
    out = free_folder(args.out)
    rows = []
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name}", file=sys.stderr, flush=True)
        rows.append(run_child(name, args, out))
        write(rows, out, args)
    print(f"wrote {out}/zoo.json, zoo.csv, zoo.md and zoo.png", file=sys.stderr)
    return 0


def merge(args):
    runs = []
    for path in args.merge:
        with open(path) as f:
            runs.append(json.load(f))
    if len({(r["size"], r["rounds"]) for r in runs}) > 1:
        sys.exit(f"zoo.py: {', '.join(args.merge)}: runs of different sizes or rounds do not make one table")
    rows = {}
    for run in runs:
        for row in run["rows"]:
            row.setdefault("cpu", run["machine"]["cpu"])  # rows of runs before rows named their machine
        rows.update((row["model"], row) for row in run["rows"])
    args.size, args.rounds = runs[0]["size"], runs[0]["rounds"]
    out = free_folder(args.out)
    write(list(rows.values()), out, args)
    print(f"wrote {out}/zoo.json, zoo.csv, zoo.md and zoo.png ({len(rows)} models)", file=sys.stderr)
    return 0


def free_folder(path):
    folder, n = path, 2
    while os.path.exists(folder):
        folder, n = f"{path}-{n}", n + 1
    os.makedirs(folder)
    return folder


def run_child(name, args, out):
    cmd = [sys.executable, os.path.abspath(__file__), "--one", name, "--size", args.size, "--rounds", str(args.rounds),
           "--threads", str(args.threads), "--out", os.path.join(out, name)] + (["--for-compile"] if args.for_compile else [])
    # A fresh compile cache per model: "compile s" is what a first run waits, not a cache hit.
    with tempfile.TemporaryDirectory(prefix="opfuse-zoo-inductor-") as cache:
        done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache))
    if done.returncode != 0:
        return {"model": name, "error": (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(name, args):
    """One model: tune with torch.compile beside it; the row of the table."""
    import torch
    import zoo
    import opfuse
    if args.threads:
        torch.set_num_threads(args.threads)
    elif torch.get_num_threads() < (os.cpu_count() or 1):
        torch.set_num_threads(os.cpu_count())
    library, _, unit = zoo.CATALOGUE[name]
    model, inputs, loss, optimizer = zoo.build(name, args.size)
    samples = inputs[0].numel() if unit == "sequences" else inputs[0].shape[0]  # tokens, or images
    start = time.perf_counter()
    result = opfuse.tune(model, inputs, loss, optimizer, out=args.out, rounds=args.rounds, max_rounds=4 * args.rounds,
                         compare_compile=True, for_compile=args.for_compile, quiet=True)
    peer = result.to_json()["compile"]
    row = {"model": name, "library": library, "unit": "tokens" if unit == "sequences" else "images",
           "samples_per_step": samples, "threads": torch.get_num_threads(), "torch": torch.__version__,
           "cpu": machine()["cpu"],
           "for_compile": args.for_compile, "tune_s": time.perf_counter() - start, "rounds": peer["rounds"], "machine_busy": peer["machine_busy"],
           "kept": sorted(r.rule for r in result.replacements if r.kept),
           "kept_as_group": sorted(r["rule"] for r in result.to_json()["replacements"] if r.get("kept_as_group")),
           "not_kept": {r.rule: r.why for r in result.replacements if not r.kept},
           "opfuse_compile_vs_compile": peer["opfuse_compile_vs_compile"],
           # this process's peak: the model, its copies and the compiled variants (ru_maxrss is in KiB)
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    for v in peer["variants"]:
        key = v["variant"]
        row[key] = {"error": v["error"], "ready_s": v["ready_s"]}
        if "ms" in v:
            row[key].update(ms=v["ms"], ms_ci=v["ms_ci"], per_s=1000 * samples / v["ms"],
                            speedup=v["speedup_vs_first"], speedup_ci=v["speedup_vs_first_ci"])
    return row


def write(rows, out, args):
    with open(os.path.join(out, "zoo.json"), "w") as f:
        json.dump({"size": args.size, "rounds": args.rounds, "machine": machine(), "rows": rows}, f, indent=2)
    with open(os.path.join(out, "zoo.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "unit"] + [f"{v} {k}" for v in VARIANTS for k in ("per_s", "speedup", "lo", "hi")] +
                   ["opfuse+compile vs compile", "lo", "hi", "tune_s", "compile_ready_s", "peak_rss_mb", "kept",
                    "error"])
        for r in rows:
            cells = [r["model"], r.get("unit", "")]
            for v in VARIANTS:
                m = r.get(v, {})
                cells += [m.get("per_s", ""), m.get("speedup", ""), *(m.get("speedup_ci") or ("", ""))]
            pair = r.get("opfuse_compile_vs_compile") or {}
            cells += [pair.get("estimate", ""), *(pair.get("ci") or ("", "")), r.get("tune_s", ""),
                      r.get("compile", {}).get("ready_s", ""), r.get("peak_rss_mb", ""), " ".join(r.get("kept", [])),
                      r.get("error", "")]
            w.writerow(cells)
    with open(os.path.join(out, "zoo.md"), "w") as f:
        f.write(table(rows, args))
    plot(rows, os.path.join(out, "zoo.png"))


def machine():
    import platform
    import torch
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version()}


def cell(m):
    if "speedup" not in m:
        return "fails" if m.get("error") else "-"
    lo, hi = m["speedup_ci"]
    return f"x{m['speedup']:.2f} [{lo:.2f}, {hi:.2f}]"


def table(rows, args):
    """The README's table; a table of rows measured on several CPUs (merged runs) names each row's."""
    info = machine()
    cpus = sorted({r.get("cpu", info["cpu"]) for r in rows})
    several = len(cpus) > 1
    lines = [f"{' and '.join(cpus) or info['cpu']}, {rows[0].get('threads', '?') if rows else '?'} threads, "
             f"torch {info['torch']}, size \"{args.size}\", {args.rounds}+ paired rounds; speed-up over eager [95% interval]", "",
             "| model | eager | opfuse | compile | opfuse + compile | opfuse+compile / compile | tune s | compile s | peak RSS MB | kept |"
             + (" cpu |" if several else ""),
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if several else "")]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | failed: {r['error']} | | | | | | | | |" + (f" {r.get('cpu', info['cpu'])} |" if several else ""))
            continue
        eager = r["eager"]
        pair = r.get("opfuse_compile_vs_compile")
        pair_cell = f"x{pair['estimate']:.2f} [{pair['ci'][0]:.2f}, {pair['ci'][1]:.2f}]" if pair else "-"
        ready, rss = r["compile"].get("ready_s"), r.get("peak_rss_mb")
        lines.append(f"| {r['model']} | {eager['per_s']:.0f} {r['unit']}/s | {cell(r['opfuse'])} | {cell(r['compile'])} | "
                     f"{cell(r['opfuse + compile'])} | {pair_cell} | {r['tune_s']:.0f} | "
                     f"{'-' if ready is None else round(ready)} | {'-' if rss is None else round(rss)} | "
                     f"{', '.join(r['kept']) or 'nothing'}{' (tuned for compile)' if r.get('for_compile') else ''} |" + (f" {r.get('cpu', info['cpu'])} |" if several else ""))
    return "\n".join(lines) + "\n"


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in rows if "error" not in r]
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4))
    width = 0.26
    for k, variant in enumerate(VARIANTS[1:]):
        xs, ys, errs = [], [], [[], []]
        for i, r in enumerate(rows):
            m = r[variant]
            if "speedup" not in m:
                continue
            xs.append(i + (k - 1) * width)
            ys.append(m["speedup"])
            errs[0].append(m["speedup"] - m["speedup_ci"][0])
            errs[1].append(m["speedup_ci"][1] - m["speedup"])
        ax.bar(xs, ys, width, yerr=errs, capsize=2, label=variant)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), [r["model"] for r in rows], rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("speed-up over eager (95% interval)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
