#!/bin/sh
# The transformer ops' targets (issue 16: every op but attention, which has its own), each checked
# by `opfuse bench-op` (variants interleaved in one run) and printed as a table: the figure, its
# 95% interval where it is a paired ratio, and whether it meets the target. A % of copy is a
# ratio of medians measured in the same run, so it has no interval; a read-heavy op (swiglu,
# adamw) passes 100 %: half the copy's bytes are writes, which cost more.
#   bench/transformer_targets.sh [build/opfuse] [THREADS] [ROUNDS ≥ 2]
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
opfuse="${1:-$root/build/opfuse}" threads="${2:-2}" rounds="${3:-15}"
[ "$rounds" -ge 2 ] 2>/dev/null || { echo "transformer_targets.sh: ROUNDS must be a number of at least 2 (a ratio's interval needs two), got '$rounds'" >&2; exit 2; }
out="$(mktemp -d /tmp/opfuse-targets.XXXXXX)"
top -bn1 | sed -n '7,12p'   # others busy? (a figure from a busy machine means little)
for op in rms_norm add_rms_norm swiglu geglu rotary_embedding cross_entropy linear_cross_entropy adamw; do
  echo "bench-op $op …" >&2
  "$opfuse" bench-op "$op" --threads "$threads" --rounds "$rounds" --json "$out/$op.json" > "$out/$op.txt"
done
python3 - "$out" <<'PY'
import json, sys

def load(op):
    with open(f"{sys.argv[1]}/{op}.json") as f:
        return json.load(f)

def ratio(value, ci, target, what):
    # met only when the whole interval clears the target; inside it, the run cannot tell
    verdict = "met" if ci[0] >= target else "not met" if ci[1] < target else "inside noise"
    return what, f">= x{target:.3g}", f"x{value:.2f} [x{ci[0]:.2f}, x{ci[1]:.2f}]", verdict

def share(part, whole, target, what):
    pct = 100 * part / whole
    return what, f">= {100 * target:g} %", f"{pct:.0f} %", "met" if part >= target * whole else "not met"

def peak(d, name):
    return next(v["peak_bytes"] for v in d["variants"] if v["name"] == name)

rows = []
for op in ("rms_norm", "add_rms_norm", "swiglu", "geglu", "rotary_embedding", "cross_entropy", "adamw"):
    d = load(op)
    against = "foreach=False" if op == "adamw" else "the composite"
    rows.append((op, d["shape"]) + ratio(d["speedup_vs_reference"], d["speedup_vs_reference_ci"], 3, f"speed vs {against}"))
    if op in ("rms_norm", "swiglu", "rotary_embedding", "adamw"):
        rows.append((op, "") + share(d["opfuse_gbps"], d["copy_gbps"], 0.7, "bandwidth, % of copy"))
        if d["aten_step_gbps"]:
            rows.append((op, "", "(ATen x*2 step, % of copy)", "", f"{100 * d['aten_step_gbps'] / d['copy_gbps']:.0f} %", ""))
    if op == "cross_entropy":
        rows.append((op, "", "peak memory / F.cross_entropy's", "<= 1/2", f"{peak(d, 'opfuse') / peak(d, 'aten'):.2f}",
                     "met" if 2 * peak(d, "opfuse") <= peak(d, "aten") else "not met"))
d = load("linear_cross_entropy")
rows.append(("linear_cross_entropy", d["shape"], "peak memory / linear + F.cross_entropy's", "<= 1/4",
             f"{peak(d, 'opfuse') / peak(d, 'aten'):.2f}", "met" if 4 * peak(d, "opfuse") <= peak(d, "aten") else "not met"))
rows.append(("linear_cross_entropy", "") + ratio(d["speedup_vs_aten"], d["speedup_vs_aten_ci"], 1 / 1.1,
                                                  "speed vs linear + F.cross_entropy (within 10 %)"))

head = ("op", "shape", "what", "target", "figure", "verdict")
widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
for r in [head, tuple("-" * w for w in widths)] + rows:
    print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
d = load("rms_norm")
print(f"\nthreads {d['threads']}, {d['rounds']} rounds, CPU path {d['cpu_capability']}, torch {d['environment']['torch']}, "
      f"BLAS {d['environment']['blas'].split(' (')[0]}; machine busy: {d['machine']['busy']}")
print(f"each op's table: {sys.argv[1]}/OP.txt")
PY
