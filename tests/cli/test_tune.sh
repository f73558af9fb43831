#!/bin/sh
# opfuse tune and opfuse rewrite end to end: EfficientNet-B0 at a tiny size, a TorchScript model
# built in Python, a deliberately wrong rule rejected by verification, numbered output folders,
# report.json's keys, and one-line errors with exit 2.
set -eu
opfuse="$1"
data="$2"
library="$3"
python=python3
here=$(dirname "$0")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$here/lib.sh"

"$opfuse" tune --help | grep -q -- --min-gain
"$opfuse" rewrite --help | grep -q -- --input-shape
expect_usage_error tune --model nosuch-net
grep -q "nosuch-net: no such file (nor a built-in model" "$tmp/err"
expect_usage_error tune --model "$tmp/missing.pt" --input-shape 2,3,32,32
expect_usage_error tune --image-size 16
expect_usage_error rewrite "$data/rules/wrong_silu.yaml" "$tmp/x.pt" --input-shape 2,3,32,32
small="--image-size 32 --batch-size 2 --num-classes 10 --steps 1 --warmup 1 --profile-steps 1 --threads 1"
tiny="$small --rounds 2 --min-gain -1"

# Output paths are checked before any training, with the OS's reason; no folder is left behind.
expect_usage_error tune $tiny --json "$tmp/nodir/t.json" --out "$tmp/never"
grep -q "nodir/t.json: cannot write into .*/nodir/ (No such file or directory)$" "$tmp/err"
[ ! -e "$tmp/never" ] && [ ! -s "$tmp/out" ]
: > "$tmp/a-file"
expect_usage_error tune $tiny --out "$tmp/a-file/run"
grep -q "a-file/run: cannot create the folder (Not a directory)$" "$tmp/err"

# An earlier run's folder is left alone: this run goes to run-2.
mkdir "$tmp/run" && echo '{}' > "$tmp/run/report.json"
"$opfuse" tune $tiny --out "$tmp/run" --json "$tmp/tune.json" > "$tmp/tune.txt"
[ "$(cat "$tmp/run/report.json")" = '{}' ]
for f in report.json report.html baseline.trace.json tuned.trace.json tuned.pt tuned.json; do
  [ -s "$tmp/run-2/$f" ] || { echo "missing run-2/$f"; exit 1; }
done
grep -q "images/s (from step time)" "$tmp/tune.txt"
grep -q "^environment: BLAS " "$tmp/tune.txt"
"$python" - "$tmp/run-2/report.json" "$tmp/tune.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r == json.load(open(sys.argv[2]))
for key in ("model", "baseline", "tuned", "speedup", "replacements", "rejected"):
    assert key in r, key
assert r["sample_unit"] == "images", r["sample_unit"]  # EfficientNet's [N, 3, H, W] batch
for side in ("baseline", "tuned"):
    s = r[side]
    assert s["images_per_sec"] > 0 and s["ops_per_step"] > 0, side
    # images/s is derived from the step time, never measured apart
    assert abs(s["images_per_sec"] - 1000 * r["batch_size"] / s["step_ms"]) < 1e-6 * s["images_per_sec"], s
    assert len(s["step_ms_rounds"]) >= r["rounds"] and len(s["step_ms_ci"]) == 2, s
lo, hi = r["speedup_ci"]
assert lo <= r["speedup"] <= hi, (lo, r["speedup"], hi)
for key in ("busy_share_of_others", "busy", "warning", "cores"):
    assert key in r["machine"], key
for key in ("blas", "reference_blas", "threads", "cpu_capability", "torch", "warnings"):
    assert key in r["environment"], key
assert r["environment"]["threads"] == 1
silu = [x for x in r["replacements"] if x["rule"] == "silu"][0]
for key in ("rule", "rewrite", "verified", "max_rel_error", "gain", "gain_ci", "rounds", "decision",
            "estimated_gain", "estimate_disagrees", "kept"):
    assert key in silu, key
assert silu["decision"] == "kept" and silu["rounds"] >= 2, silu
assert silu["verified"] and silu["kept"], silu
times = {t["rule"]: t for t in r["rule_times"]}
assert times["silu"]["ops_per_step_before"] > 0 and times["silu"]["ops_per_step_after"] == 0, times
assert r["tuned"]["ops_per_step"] < r["baseline"]["ops_per_step"]
PY
grep -q '"tune"' "$tmp/run-2/report.html"
# The page draws a step of the baseline and of the tuned model, one above the other.
python3 - "$tmp/run-2/report.html" <<'PY'
import json, sys
html = open(sys.argv[1]).read()
start = html.index('id="analysis">') + len('id="analysis">')
page = json.JSONDecoder().raw_decode(html[start:])[0]
assert page["timeline"]["slices"] and page["diff"]["after"]["timeline"]["slices"], page.keys()
PY

# Decisions follow the interval: nothing gains 500%, so every measured replacement is rolled back
# (its interval lies below) and none is inconclusive; the rounds stop at --rounds, or at twice
# that when other processes (a parallel ctest) kept the machine busy.
"$opfuse" tune $small --min-gain 5 --rounds 3 --max-rounds 6 --out "$tmp/high" > "$tmp/high.txt"
"$python" - "$tmp/high/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
measured = [x for x in r["replacements"] if x["measured"]]
assert measured, r["replacements"]
for x in measured:
    assert x["decision"] == "rolled back" and not x["kept"] and x["gain_ci"][1] < 5, x
    assert 3 <= x["rounds"] <= 6 and "below --min-gain" in x["why"], x
PY
expect_usage_error tune $small --rounds 5 --max-rounds 3 --out "$tmp/bad-rounds"
[ ! -e "$tmp/bad-rounds" ]

# A TorchScript model from Python: rewrite, check in Python, tune.
"$python" "$here/../python/tiny_effnet.py" "$tmp/net.pt"
"$opfuse" rewrite "$tmp/net.pt" "$tmp/net.fused.pt" --input-shape 4,3,32,32 > "$tmp/rewrite.txt"
grep -q "opfuse::silu" "$tmp/rewrite.txt"
# BatchNorm2d then a Swish module, across two module calls: all five (the stem, two per block).
grep -q "^batch_norm_silu .*opfuse::batch_norm_silu (4 patterns) *5  yes" "$tmp/rewrite.txt"
"$python" "$here/../python/check_rewritten.py" "$library" "$tmp/net.pt" "$tmp/net.fused.pt" same-parameters | grep -q ok
expect_usage_error rewrite "$tmp/net.pt" "$tmp/net.fused.pt" --input-shape 4,3,32,32

"$opfuse" tune --model "$tmp/net.pt" --input-shape 4,3,32,32 --steps 1 --rounds 2 --warmup 1 --profile-steps 1 \
  --min-gain -1 --threads 1 --out "$tmp/ts" --json - > "$tmp/ts.json" 2> "$tmp/ts.txt"
"$python" "$here/../python/check_rewritten.py" "$library" "$tmp/net.pt" "$tmp/ts/tuned.pt" | grep -q ok
# --json -: stdout is report.json alone; the stages and the summary went to stderr.
"$python" -c "import json, sys; assert json.load(open(sys.argv[1])) == json.load(open(sys.argv[2]))" \
  "$tmp/ts.json" "$tmp/ts/report.json"
grep -q "^\[1\] " "$tmp/ts.txt" && grep -q "^wrote .*/ts/report.json" "$tmp/ts.txt"

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
# minGPT's hand-written attention in a scripted GPT: matched in the inlined forward, one per block,
# verified (dropout passes through in verification: the fused op draws its own mask).
"$python" "$here/../python/tiny_gpt.py" "$tmp/gpt.pt"
"$opfuse" rewrite "$tmp/gpt.pt" "$tmp/gpt.fused.pt" --input-shape 4,64,64 --loss mse > "$tmp/gpt.txt"
grep -q "^attention .*opfuse::attention (2 patterns) *2  yes" "$tmp/gpt.txt"
"$python" - "$library" "$tmp/gpt.pt" "$tmp/gpt.fused.pt" <<'PY'
import sys
import torch
torch.ops.load_library(sys.argv[1])
original, fused = (torch.jit.load(p) for p in sys.argv[2:4])
assert "ops.opfuse.attention" in fused.code and "ops.opfuse" not in original.code
x = torch.randn(3, 40, 64, dtype=torch.float64)
ref = original.double().eval()(x)
got = fused.double().eval()(x)
assert torch.allclose(got, ref, rtol=1e-10, atol=1e-12), (got - ref).abs().max()
fused.float().train()(x.float()).square().mean().backward()  # dropout on: the fused op's own mask
assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in fused.parameters())
PY
# A model of two inputs, neither float: token ids below the vocabulary and a bool mask.
"$python" "$here/../python/tiny_gpt.py" "$tmp/lm.pt" --tokens 100
"$opfuse" tune --model "$tmp/lm.pt" --input-shape 4,64:int64:100 --input-shape 4,64:bool --loss mse --steps 1 \
  --rounds 1 --warmup 0 --profile-steps 1 --min-gain -1 --threads 1 --out "$tmp/lm" > "$tmp/lm.txt"
grep -q "inputs 4,64:int64:100 4,64:bool" "$tmp/lm.txt"
"$python" - "$tmp/lm/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["inputs"] == ["4,64:int64:100", "4,64:bool"], r["inputs"]
attention = [x for x in r["replacements"] if x["rule"] == "attention"]
assert attention and attention[0]["verified"] and attention[0]["places"] == 2, r["replacements"]
PY
expect_usage_error tune --model "$tmp/lm.pt" --input-shape 4,64:int64 --out "$tmp/no-bound"
grep -q "an int64 input needs its values' bound, e.g. 4,64:int64:32000" "$tmp/err"
expect_usage_error tune --model "$tmp/lm.pt" --input-shape 4,6x:int64:9 --out "$tmp/bad-dim"
grep -q "input-shape 4,6x:int64:9: '6x' is not a positive dimension" "$tmp/err"
expect_usage_error tune --model "$tmp/lm.pt" --input-shape 4,64:half --out "$tmp/bad-dtype"
grep -q "unknown dtype 'half'" "$tmp/err"
# too few inputs: the interpreter's own words
expect_usage_error tune --model "$tmp/lm.pt" --input-shape 4,64:int64:100 --out "$tmp/one-input"
grep -q "keep" "$tmp/err"
# Llama's RMSNorm in three spellings (llama2.c's, Hugging Face's, without casts), every norm but the
# first after a residual add: those four become opfuse::add_rms_norm, then the first opfuse::rms_norm;
# verified, float32 runs the fused ops, float64 keeps the float32 composite of the spellings that
# cast (there is no float64 arithmetic in them to fuse) and matches the original, gradients included.
"$python" "$here/../python/tiny_llama.py" "$tmp/llama.pt"
"$opfuse" rewrite "$tmp/llama.pt" "$tmp/llama.fused.pt" --input-shape 2,8,32 --loss mse > "$tmp/llama.txt"
grep -q "^add_rms_norm .*opfuse::add_rms_norm (3 patterns) *4  yes" "$tmp/llama.txt"
grep -q "^rms_norm .*opfuse::rms_norm (3 patterns) *1  yes" "$tmp/llama.txt"
"$python" - "$library" "$tmp/llama.pt" "$tmp/llama.fused.pt" <<'PY'
import sys
import torch
torch.ops.load_library(sys.argv[1])
original, fused = (torch.jit.load(p) for p in sys.argv[2:4])
code = fused.code
assert code.count("ops.opfuse.add_rms_norm(") == 4 and code.count("ops.opfuse.rms_norm(") == 1, code
assert "ops.opfuse" not in original.code
x = torch.randn(3, 5, 32)
with torch.autograd.profiler.profile() as prof:
    y = fused(x)
names = [e.name for e in prof.function_events]
assert names.count("opfuse::add_rms_norm") == 4 and names.count("opfuse::rms_norm") == 1, names
assert "aten::rsqrt" not in names, names
assert torch.allclose(y, original(x), rtol=1e-5, atol=1e-6)
ref, got = original.double(), fused.double()
xa, xb = x.double().requires_grad_(), x.double().requires_grad_()
a, b = ref(xa), got(xb)
assert torch.allclose(b, a, rtol=1e-12, atol=1e-12), (b - a).abs().max()
a.square().sum().backward()
b.square().sum().backward()
# upstream of a casting norm the gradients pass through its float32 arithmetic, where a 1e-16
# difference from the fused float64 norm after it may flip a float32 rounding: bound 1e-6 of the
# tensor's largest value
for n, g, r in [("x", xb.grad, xa.grad)] + [(n, q.grad, p.grad) for (n, p), (_, q) in
                                             zip(ref.named_parameters(), got.named_parameters())]:
    assert (g - r).abs().max() <= 1e-6 * r.abs().max(), (n, (g - r).abs().max())
PY
# A TorchScript file is one whatever its name (torch.jit.save writes any).
cp "$tmp/net.pt" "$tmp/net.pth"
"$opfuse" tune --model "$tmp/net.pth" --input-shape 4,3,32,32 --steps 1 --rounds 1 --warmup 0 --profile-steps 1 \
  --min-gain -1 --threads 1 --out "$tmp/pth" > /dev/null
grep -q '"rule": "silu"' "$tmp/pth/report.json"
# A model that fails on its input: the interpreter's cause, not its first line, and no empty folder.
expect_usage_error tune --model "$tmp/net.pth" --input-shape 4,3,32 --out "$tmp/bad-shape"
grep -q "expected input\[1, 4, 3, 32\] to have 3 channels" "$tmp/err"
[ ! -e "$tmp/bad-shape" ]
if "$opfuse" tune $ts_tiny --no-default-rules --rules "$data/rules/wrong_silu.yaml" --out "$tmp/only-wrong" \
  > "$tmp/only-wrong.txt"; then echo "tune exited 0 with nothing verified"; exit 1; fi
grep -q "no replacement verified" "$tmp/only-wrong.txt"
echo "tune ok"
