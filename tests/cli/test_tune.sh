#!/bin/sh
# opfuse tune and opfuse rewrite end to end: EfficientNet-B0 at a tiny size, a TorchScript model
# built in Python, a deliberately wrong rule rejected by verification, numbered output folders,
# report.json's keys, and one-line errors with exit 2.
set -eu
opfuse="$1"
data="$2"
library="$3"
python=/usr/bin/python3
here=$(dirname "$0")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$here/lib.sh"

"$opfuse" tune --help | grep -q -- --min-gain
"$opfuse" rewrite --help | grep -q -- --input-shape
expect_usage_error tune --model nosuch-net
expect_usage_error tune --model "$tmp/missing.pt" --input-shape 2,3,32,32
expect_usage_error tune --image-size 16
expect_usage_error rewrite "$data/rules/wrong_silu.yaml" "$tmp/x.pt" --input-shape 2,3,32,32
tiny="--image-size 32 --batch-size 2 --num-classes 10 --steps 1 --rounds 2 --warmup 1 --profile-steps 1 --min-gain -1 --threads 1"

# An earlier run's folder is left alone: this run goes to run-2.
mkdir "$tmp/run" && echo '{}' > "$tmp/run/report.json"
"$opfuse" tune $tiny --out "$tmp/run" --json "$tmp/tune.json" > "$tmp/tune.txt"
[ "$(cat "$tmp/run/report.json")" = '{}' ]
for f in report.json report.html baseline.trace.json tuned.trace.json tuned.pt tuned.json; do
  [ -s "$tmp/run-2/$f" ] || { echo "missing run-2/$f"; exit 1; }
done
grep -q "images/s (median)" "$tmp/tune.txt"
"$python" - "$tmp/run-2/report.json" "$tmp/tune.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r == json.load(open(sys.argv[2]))
for key in ("model", "baseline", "tuned", "speedup", "replacements", "rejected"):
    assert key in r, key
for side in ("baseline", "tuned"):
    assert r[side]["images_per_sec"] > 0 and r[side]["ops_per_step"] > 0, side
silu = [x for x in r["replacements"] if x["rule"] == "silu"][0]
for key in ("rule", "rewrite", "verified", "max_rel_error", "kept"):
    assert key in silu, key
assert silu["verified"] and silu["kept"], silu
times = {t["rule"]: t for t in r["rule_times"]}
assert times["silu"]["ops_per_step_before"] > 0 and times["silu"]["ops_per_step_after"] == 0, times
assert r["tuned"]["ops_per_step"] < r["baseline"]["ops_per_step"]
PY
grep -q '"tune"' "$tmp/run-2/report.html"

# A TorchScript model from Python: rewrite, check in Python, tune.
"$python" "$here/../python/tiny_effnet.py" "$tmp/net.pt"
"$opfuse" rewrite "$tmp/net.pt" "$tmp/net.fused.pt" --input-shape 4,3,32,32 > "$tmp/rewrite.txt"
grep -q "opfuse::silu" "$tmp/rewrite.txt"
"$python" "$here/../python/check_rewritten.py" "$library" "$tmp/net.pt" "$tmp/net.fused.pt" same-parameters | grep -q ok
expect_usage_error rewrite "$tmp/net.pt" "$tmp/net.fused.pt" --input-shape 4,3,32,32

"$opfuse" tune --model "$tmp/net.pt" --input-shape 4,3,32,32 --steps 1 --rounds 2 --warmup 1 --profile-steps 1 \
  --min-gain -1 --threads 1 --out "$tmp/ts" > "$tmp/ts.txt"
"$python" "$here/../python/check_rewritten.py" "$library" "$tmp/net.pt" "$tmp/ts/tuned.pt" | grep -q ok

# A wrong rewrite is rejected by verification and nothing is kept: exit 1.
if "$opfuse" rewrite "$tmp/net.pt" "$tmp/wrong.pt" --input-shape 4,3,32,32 --no-default-rules \
  --rules "$data/rules/wrong_silu.yaml" > "$tmp/wrong.txt"; then echo "wrong rewrite accepted"; exit 1; fi
grep -q "failed verification" "$tmp/wrong.txt"
[ ! -e "$tmp/wrong.pt" ]
ts_tiny="--model $tmp/net.pt --input-shape 4,3,32,32 --steps 1 --rounds 2 --warmup 1 --profile-steps 1 --min-gain -1 --threads 1"
"$opfuse" tune $ts_tiny --rules "$data/rules/wrong_silu.yaml" --out "$tmp/wrong" > "$tmp/wrong-tune.txt"
"$python" - "$tmp/wrong/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
wrong = [x for x in r["replacements"] if x["rule"] == "wrong_silu"]
assert wrong and not wrong[0]["verified"] and not wrong[0]["kept"], r["replacements"]
assert any(x["rule"] == "wrong_silu" for x in r["rejected"]), r["rejected"]
assert all(x["verified"] for x in r["replacements"] if x["kept"])
PY
if "$opfuse" tune $ts_tiny --no-default-rules --rules "$data/rules/wrong_silu.yaml" --out "$tmp/only-wrong" \
  > "$tmp/only-wrong.txt"; then echo "tune exited 0 with nothing verified"; exit 1; fi
grep -q "no replacement verified" "$tmp/only-wrong.txt"
echo "tune ok"
