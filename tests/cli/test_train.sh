#!/bin/sh
# opfuse train end to end: a tiny run with its JSON, --compare, and one-line errors with exit 2.
set -eu
opfuse="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"

"$opfuse" train --help | grep -q -- --swish
"$opfuse" train --help | grep -q -- --fuse

"$opfuse" train --image-size 32 --batch-size 2 --steps 2 --warmup 1 --num-classes 10 --swish aten \
  --fuse se_gate,batch_norm_silu,drop_connect_add --json "$tmp/train.json" > "$tmp/train.txt"
grep -q "images/s" "$tmp/train.txt"
grep -q "^Step: \[3/3\]" "$tmp/train.txt"
python3 - "$tmp/train.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for key in ("model", "parameters", "swish", "image_size", "batch_size", "steps", "images_per_sec",
            "step_ms_median", "loss_first", "loss_last", "peak_rss_mb", "environment"):
    assert key in r, key
assert r["model"] == "efficientnet-b0" and r["swish"] == "aten" and r["steps"] == 2
assert r["fusions"] == ["se_gate", "batch_norm_silu", "drop_connect_add"], r["fusions"]
assert r["parameters"] == 5288548 - (1000 - 10) * 1281  # the fc layer shrinks with 10 classes
assert r["images_per_sec"] > 0 and r["peak_rss_mb"] > 0
PY

"$opfuse" train --image-size 32 --batch-size 2 --steps 1 --warmup 0 --num-classes 10 \
  --profile "$tmp/trace.json.gz" --profile-steps 1 > "$tmp/profile.txt"
grep -q "profile .*trace.json.gz (.* events, 1 steps, .* ms per step: [-+][0-9]* % under the profiler)" "$tmp/profile.txt"
gzip -t "$tmp/trace.json.gz"

# AdamW and SGD stepped by torch are fused_adamw and fused_sgd findings; stepped by opfuse::adamw_
# and opfuse::sgd_ (one op under the same scope) they are not.
for optimizer in adamw opfuse-adamw sgd opfuse-sgd; do
  "$opfuse" train --image-size 32 --batch-size 2 --steps 1 --warmup 0 --num-classes 10 --optimizer "$optimizer" \
    --profile "$tmp/$optimizer.json" --profile-steps 1 > /dev/null
  "$opfuse" analyze "$tmp/$optimizer.json" --all --json "$tmp/$optimizer.analysis.json" > /dev/null
done
python3 - "$tmp/adamw.analysis.json" "$tmp/opfuse-adamw.analysis.json" <<'PY'
import json, sys
torch_rules, opfuse_rules = ([f["rule"] for f in json.load(open(p))["findings"]] for p in sys.argv[1:])
assert "fused_adamw" in torch_rules, torch_rules
assert "fused_adamw" not in opfuse_rules, opfuse_rules
PY
python3 - "$tmp/sgd.analysis.json" "$tmp/opfuse-sgd.analysis.json" <<'PY'
import json, sys
torch_rules, opfuse_rules = ([f["rule"] for f in json.load(open(p))["findings"]] for p in sys.argv[1:])
assert "fused_sgd" in torch_rules, torch_rules
assert "fused_sgd" not in opfuse_rules, opfuse_rules
PY

"$opfuse" train --image-size 32 --batch-size 2 --steps 1 --warmup 0 --num-classes 10 \
  --compare memory-efficient,silu,all --rounds 2 --json "$tmp/compare.json" > "$tmp/compare.txt"
grep -q "vs memory-efficient" "$tmp/compare.txt"
grep -q "^all " "$tmp/compare.txt"
python3 - "$tmp/compare.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["rounds"] == 2 and r["baseline"] == "memory-efficient" and "environment" in r and "machine" in r
for v in r["variants"]:
    assert len(v["step_ms_rounds"]) == 2 and v["images_per_sec"] > 0, v
    assert abs(v["images_per_sec"] - 1000 * r["batch_size"] / v["step_ms"]) < 1e-6 * v["images_per_sec"], v
assert r["variants"][0]["speedup"] == 1
PY

expect_usage_error train --model efficientnet-b9
expect_usage_error train --image-size 31
expect_usage_error train --batch-size 0
expect_usage_error train --swish relu
# --fuse names fusions as analyze and tune do, and nothing else does.
"$opfuse" train --image-size 32 --batch-size 2 --steps 1 --warmup 0 --num-classes 10 --fuse all --json "$tmp/all.json" > "$tmp/all.txt"
python3 -c "import json, sys; r = json.load(open(sys.argv[1])); assert (r['swish'], r['fusions']) == ('memory-efficient', ['silu', 'se_gate', 'batch_norm_silu', 'drop_connect_add']), r" "$tmp/all.json"
grep -q "^fusions *silu, se_gate, batch_norm_silu, drop_connect_add$" "$tmp/all.txt"
expect_usage_error train --fuse silu,gelu
grep -q -- "--fuse gelu: unknown fusion (silu, se_gate, batch_norm_silu, drop_connect_add, or all)" "$tmp/err"
expect_usage_error train --swish fused
expect_usage_error train --bn-swish fused
expect_usage_error train --compare memory-efficient,everything
expect_usage_error train --data "$tmp/missing"
mkdir -p "$tmp/empty"
expect_usage_error train --data "$tmp/empty"
mkdir -p "$tmp/bad/cat"
head -c 4096 /dev/urandom > "$tmp/bad/cat/broken.jpg"
expect_usage_error train --data "$tmp/bad" --image-size 32 --batch-size 1 --steps 1 --warmup 0
grep -q "broken.jpg" "$tmp/err"
expect_usage_error train --steps 1 --json "$tmp/train.json"
grep -q "already exists" "$tmp/err"
# An existing trace is not replaced without --force either.
expect_usage_error train --steps 1 --profile "$tmp/trace.json.gz"
grep -q "already exists" "$tmp/err"
echo ok
