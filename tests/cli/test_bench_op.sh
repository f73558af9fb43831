#!/bin/sh
# bench-op end to end: exit codes, help, and the JSON keys scripts rely on.
set -eu
opfuse="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"

"$opfuse" --help | grep -q bench-op
"$opfuse" bench-op --help | grep -q -- --numel

for op in silu swish se_gate batch_norm_silu drop_connect_add rms_norm swiglu attention rotary_embedding adamw \
          cross_entropy linear_cross_entropy add_rms_norm sgd; do
  size="--numel 100000"
  [ "$op" = attention ] && size="--seq-len 70 --head-dim 32 --dropout 0.1"
  { [ "$op" = adamw ] || [ "$op" = sgd ]; } && size=""
  "$opfuse" bench-op "$op" $size --rounds 3 --warmup 1 --threads 1 --json "$tmp/$op.json" > "$tmp/$op.txt"
  grep -q "opfuse vs aten" "$tmp/$op.txt"
  { [ "$op" = adamw ] || [ "$op" = sgd ]; } || grep -q "^ATen x \* 2 step .* % of copy" "$tmp/$op.txt"
  python3 - "$tmp/$op.json" "$op" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for key in ("op", "numel", "threads", "rounds", "ms", "variants", "speedup_vs_reference", "speedup_vs_reference_ci",
            "speedup_vs_aten", "speedup_vs_aten_ci", "opfuse_gbps", "copy_gbps", "aten_step_gbps", "machine",
            "environment"):
    assert key in r, key
# the yardstick of an autograd step, for every op but the optimizers', which take no autograd step
assert (r["aten_step_gbps"] > 0) == (r["op"] not in ("adamw", "sgd")), r["aten_step_gbps"]
assert r["op"] == sys.argv[2] and r["threads"] == 1 and r["rounds"] == 3
assert set(r["ms"]) == {"reference", "aten", "opfuse"} and all(v > 0 for v in r["ms"].values())
for v in r["variants"]:
    assert len(v["ms_rounds"]) == 3 and v["spread"] >= 1 and v["ms_ci"][0] <= v["ms"] <= v["ms_ci"][1], v
    # the fused steps, torch's (fused=True) and opfuse's, allocate nothing
    assert v["peak_bytes"] > 0 or (r["op"] in ("adamw", "sgd") and v["name"] != "reference"), v
if r["op"] == "add_rms_norm":  # --numel 100000: 130 rows of 768
    assert r["shape"] == "[130, 768]", r["shape"]
if r["op"] == "rotary_embedding":
    assert r["shape"] == "[4, 48, 8, 64]", r["shape"]
if r["op"] in ("adamw", "sgd"):  # the per-tensor loop makes temporaries, the fused steps none
    assert r["shape"] == "56 tensors, 15191712 parameters (stories15M)" and r["numel"] == 15191712, r["shape"]
    assert [v["peak_bytes"] for v in r["variants"]][2] == 0
if r["op"] in ("cross_entropy", "linear_cross_entropy"):  # --numel 100000: 3 rows of 32000 logits
    assert r["shape"] == ("[3, 32000]" if r["op"] == "cross_entropy" else "h [3, 288], weight [32000, 288]"), r["shape"]
    peak = {v["name"]: v["peak_bytes"] for v in r["variants"]}
    # the saved gradient instead of the log-probabilities (linear: at 3 rows the weight's
    # gradient, which every variant makes, is nearly all of it)
    assert r["op"] == "linear_cross_entropy" or peak["opfuse"] < peak["aten"], peak
if r["op"] == "attention":
    assert r["shape"] == "[4, 6, 70, 32]", r["shape"]
    peak = {v["name"]: v["peak_bytes"] for v in r["variants"]}
    assert peak["opfuse"] < peak["reference"], peak
lo, hi = r["speedup_vs_aten_ci"]
assert lo <= r["speedup_vs_aten"] <= hi
assert r["environment"]["threads"] == 1 and r["environment"]["blas"]
PY
done

# pip's torch carries its BLAS (MKL inside libtorch_cpu), never the reference one.
python3 -c "import json, sys; e = json.load(open(sys.argv[1]))['environment']; assert not e['reference_blas'], e" "$tmp/silu.json"

expect_usage_error bench-op gelu
expect_usage_error bench-op silu --numel 0
expect_usage_error bench-op silu --numel abc
expect_usage_error bench-op attention --numel 1000
expect_usage_error bench-op attention --dropout 1
expect_usage_error bench-op adamw --numel 1000
expect_usage_error frobnicate
# An existing --json file is not replaced without --force.
expect_usage_error bench-op silu --numel 1000 --rounds 1 --json "$tmp/silu.json"
"$opfuse" bench-op silu --numel 1000 --rounds 1 --json "$tmp/silu.json" --force > /dev/null
echo ok
