#!python3
"""Writes one trace per rank from a single trace, as a distributed job's ranks would: each an
object with "distributedInfo": {"rank": r, "world_size": N}; one rank delayed, every timestamp
and duration after its first event stretched by (1 + delay), so its steps take that much longer.

  make_rank_traces.py TRACE OUT_DIR [--ranks 8] [--delayed 5] [--delay 0.25] [--gzip]
"""
import argparse
import copy
import gzip
import json
import os


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    return doc if isinstance(doc, dict) else {"traceEvents": doc}


def stretched(events, factor):
    """Times measured from the first event, scaled: durations and gaps all longer by `factor`."""
    starts = [float(e["ts"]) for e in events if "ts" in e]
    origin = min(starts) if starts else 0.0
    out = []
    for e in events:
        e = dict(e)
        if "ts" in e:
            e["ts"] = origin + (float(e["ts"]) - origin) * factor
        if "dur" in e:
            e["dur"] = float(e["dur"]) * factor
        out.append(e)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace")
    p.add_argument("out_dir")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--delayed", type=int, default=5)
    p.add_argument("--delay", type=float, default=0.25)
    p.add_argument("--gzip", action="store_true")
    args = p.parse_args()
    doc = load(args.trace)
    os.makedirs(args.out_dir, exist_ok=True)
    for r in range(args.ranks):
        rank_doc = copy.copy(doc)
        rank_doc["distributedInfo"] = {"backend": "gloo", "rank": r, "world_size": args.ranks}
        if r == args.delayed:
            rank_doc["traceEvents"] = stretched(doc["traceEvents"], 1 + args.delay)
        # distributedInfo first, as Kineto writes it, before the events.
        ordered = {"distributedInfo": rank_doc.pop("distributedInfo"), **rank_doc}
        name = os.path.join(args.out_dir, f"worker{r}.trace.json" + (".gz" if args.gzip else ""))
        opener = gzip.open if args.gzip else open
        with opener(name, "wt") as f:
            json.dump(ordered, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
