#!/bin/sh
# How close analyze's estimated savings come to what the fusions actually save, side by side in one
# run on EfficientNet-B0 (opfuse's profiler, memory-efficient Swish, this machine):
#   1. profile a few training steps of the reference model and analyze the trace (bandwidth
#      estimates, and --measure: opfuse ops timed here at the recorded shapes);
#   2. train the reference, --fuse silu and --fuse all alternating (train --compare);
#   3. print each estimate per step beside the actual saving per step, and their ratio.
# Three comparisons:
#   silu (default rules)  the silu finding as analyze reports it; BatchNorm + Swish pairs go to
#                         batch_norm_silu, so it covers the backward chains and the SE-branch Swish;
#   silu (silu rule only) every Swish chain, forward and backward: what --fuse silu replaces;
#   all opfuse findings   silu + batch_norm_silu + se_gate + drop_connect_add: what --fuse all replaces.
#   bench/analyze_estimate.sh [build/opfuse] [IMAGE_SIZE=224] [BATCH=8]
set -eu
opfuse="${1:-build/opfuse}"
size="${2:-224}"
batch="${3:-8}"
out="${OUT:-/tmp}/opfuse-estimate"
rm -rf "$out" && mkdir -p "$out"
cat > "$out/silu.yaml" <<'EOF'
rules:
  - name: silu
    kind: elementwise
    patterns:
      - {match: "sigmoid-mul", shapes: same, measure: silu}
      - {match: "mul-sigmoid", shapes: same, measure: silu}
      - {match: "sigmoid-((empty_like)?-fill_-sub_|ones_like-sub|rsub)-mul-add-mul-mul", shapes: same,
         measure: silu_backward, passes: 3}
    replacement: {cpu: opfuse::silu, cuda: torch.nn.functional.silu, npu: torch_npu.npu_silu}
EOF
echo "EfficientNet-B0, ${size}x${size}, batch $batch"
"$opfuse" train --swish memory-efficient --image-size "$size" --batch-size "$batch" --steps 1 --warmup 3 \
  --profile "$out/trace.json" --profile-steps 4 > /dev/null
"$opfuse" analyze "$out/trace.json" --json "$out/bandwidth.json" > /dev/null
"$opfuse" analyze "$out/trace.json" --measure --json "$out/measured.json" > /dev/null
"$opfuse" analyze "$out/trace.json" --no-default-rules --rules "$out/silu.yaml" --json "$out/silu-bandwidth.json" > /dev/null
"$opfuse" analyze "$out/trace.json" --no-default-rules --rules "$out/silu.yaml" --measure --json "$out/silu-measured.json" > /dev/null
"$opfuse" train --image-size "$size" --batch-size "$batch" --steps 3 --warmup 2 --rounds 5 \
  --compare memory-efficient,silu,all --json "$out/actual.json" > /dev/null
python3 - "$out" "$batch" <<'EOF'
import json, sys
out, batch = sys.argv[1], int(sys.argv[2])
load = lambda name: json.load(open(f"{out}/{name}.json"))
step_ms = {v["variant"]: 1000 * batch / v["images_per_sec"] for v in load("actual")["variants"]}
def saving_ms(name, rules):
    a = load(name)
    return sum(f["est_saving_us"] for f in a["findings"] if f["rule"] in rules) / a["trace"]["steps"] / 1000
traced = load("bandwidth")["trace"]
print(f"step time: profiled {traced['step_us'] / 1000:.1f} ms, unprofiled {step_ms['memory-efficient']:.1f} ms")
opfuse_ops = {"silu", "batch_norm_silu", "se_gate", "drop_connect_add"}
rows = [("silu (default rules)", "", {"silu"}, "silu"),
        ("silu (silu rule only)", "silu-", {"silu"}, "silu"),
        ("all opfuse findings", "", opfuse_ops, "all")]
print(f"{'finding':24}{'actual ms/step':>16}{'bandwidth':>12}{'ratio':>8}{'measured':>12}{'ratio':>8}")
for label, prefix, rules, variant in rows:
    actual = step_ms["memory-efficient"] - step_ms[variant]
    bw, me = saving_ms(prefix + "bandwidth", rules), saving_ms(prefix + "measured", rules)
    print(f"{label:24}{actual:16.1f}{bw:12.1f}{bw / actual:8.2f}{me:12.1f}{me / actual:8.2f}")
EOF
