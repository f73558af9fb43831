#!/bin/sh
# opfuse analyze end to end: the reference case on opfuse's own traces (memory-efficient Swish
# before, fused after), the sample traces of other tools, the Ascend advisor's rule file, the
# JSON keys, the HTML page, and one-line errors with exit 2 for bad input.
set -eu
opfuse="$1"
data="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"

"$opfuse" analyze --help | grep -q -- --rules
"$opfuse" analyze --help | grep -q "analyze \[OPTIONS\] TRACE \[TRACE2\]$"

for fuse in "" silu; do
  "$opfuse" train --image-size 64 --batch-size 4 --steps 1 --warmup 1 --num-classes 10 --fuse "$fuse" \
    --profile "$tmp/${fuse:-memory-efficient}.json" --profile-steps 2 > /dev/null
done
mv "$tmp/silu.json" "$tmp/fused.json"
"$opfuse" analyze "$tmp/memory-efficient.json" "$tmp/fused.json" --json "$tmp/a.json" --html "$tmp/a.html" > "$tmp/a.txt"
grep -q "opfuse profiler" "$tmp/a.txt"
grep -q "^silu .*opfuse::silu" "$tmp/a.txt"
python3 - "$tmp/a.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))
t = a["trace"]
for key in ("path", "dialect", "events", "duration_us", "steps"):
    assert key in t, key
assert t["dialect"] == "opfuse profiler" and t["steps"] == 2 and t["events"] > 1000
for key in ("name", "count", "total_us", "self_us"):
    assert key in a["ops"][0], key
elementwise = [f for f in a["findings"] if f["kind"] in ("elementwise", "mined")]
top = elementwise[0]
for key in ("rule", "pattern", "replacement", "backend", "occurrences", "time_us", "est_saving_us", "locations"):
    assert key in top, key
assert top["rule"] == "silu", [f["rule"] for f in elementwise]
# The trainer's SGD steps parameter by parameter, under PyTorch's scope name.
assert any(f["rule"] == "fused_sgd" for f in a["findings"]), [f["rule"] for f in a["findings"]]
assert top["replacement"] == "opfuse::silu" and top["backend"] == "cpu"
# B0 has 49 Swish modules: a backward chain each, and a forward chain for the 16 in the SE
# branches (the 33 after a BatchNorm are claimed whole by batch_norm_silu), for each of 2 steps.
assert top["occurrences"] == 2 * (49 + 16), top["occurrences"]
bn = [f for f in a["findings"] if f["rule"] == "batch_norm_silu"][0]
assert bn["occurrences"] == 2 * 33 and bn["replacement"] == "opfuse::batch_norm_silu", bn
assert any(f["rule"] == "drop_connect_add" for f in a["findings"]), [f["rule"] for f in a["findings"]]
assert 0 < top["est_saving_us"] < top["time_us"]
places = [l["location"] for l in top["locations"]]
assert all("_swish" in p for p in places), places
assert any(p.endswith("(backward)") for p in places), places
d = a["diff"]
assert [f["rule"] for f in d["findings_vanished"]].count("silu") == 1, d["findings_vanished"]
assert all(f["rule"] != "silu" for f in d["after"]["findings"])
sig = {o["name"]: o for o in d["ops"]}["aten::sigmoid"]
assert sig["count_after"] < sig["count_before"]
PY
grep -q '"rule":"silu"' "$tmp/a.html"  # drawn by the page's script: see tests/report

# Savings come from bandwidth unless --measure times the opfuse ops here, on CPU traces only.
"$opfuse" analyze "$tmp/memory-efficient.json" --measure --json "$tmp/m.json" > /dev/null
python3 - "$tmp/a.json" "$tmp/m.json" <<'PY'
import json, sys
bandwidth, measured = ({f["rule"]: f for f in json.load(open(p))["findings"]} for p in sys.argv[1:])
assert "measured" not in bandwidth["silu"]["estimate"], bandwidth["silu"]
assert "opfuse::silu timed against reference" in measured["silu"]["estimate"], measured["silu"]
# train --profile records the step's unprofiled time, so the profiler's cost can be left out of the
# saving (", less profiling's cost", when the profiled steps ran slower: not always on a busy machine).
assert measured["batch_norm_silu"]["estimate"].startswith("opfuse::batch_norm_silu timed against"), measured["batch_norm_silu"]
assert json.load(open(sys.argv[2]))["trace"]["plain_step_us"] > 0
assert 0 < measured["silu"]["est_saving_us"] < measured["silu"]["time_us"]
PY
# The warning is the analysis' own: in the tables and the JSON, from either face.
"$opfuse" analyze "$data/traces/kineto_rocm_minitoy.json.gz" --measure --json "$tmp/warn.json" > "$tmp/warn"
grep -q "warning: .*kineto_rocm_minitoy.json.gz: opfuse ops are timed on CPU traces only" "$tmp/warn"
grep -q "opfuse ops are timed on CPU traces only" "$tmp/warn.json"

# Other tools' traces: each read with its dialect; the Ascend one gives its torch_npu replacements.
"$opfuse" analyze "$data/traces/ascend_style_sample.json" --json "$tmp/npu.json" > /dev/null
python3 - "$tmp/npu.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))
assert a["trace"]["dialect"].startswith("Ascend"), a["trace"]["dialect"]
by_rule = {f["rule"]: f for f in a["findings"]}
assert by_rule["silu"]["replacement"] == "torch_npu.npu_silu" and by_rule["silu"]["backend"] == "npu"
assert by_rule["fused_adam"]["replacement"] == "torch_npu.optim.NpuFusedAdam"
assert by_rule["fused_adam"]["occurrences"] == 2
assert not any(f["kind"] == "mined" for f in a["findings"]), "ops inside the optimizer step are taken"
PY
# The sample as the profiler writes it with communication on: the Overlap Analysis lanes and an
# HCCL process, uncategorised, and half the tasks linked only from their CANN API call
# (async_acl_npu). The lanes are a summary, not ops; every aten op keeps its device time.
python3 - "$data/traces/ascend_style_sample.json" "$tmp/npu-overlap.json" <<'PY'
import json, sys
events = json.load(open(sys.argv[1]))
meta = lambda pid, name: {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
tasks = [e for e in events if e.get("pid") == 800 and e["ph"] == "X"]
start, end = float(tasks[0]["ts"]), max(float(t["ts"]) + t["dur"] for t in tasks)
out = [meta(900, "Overlap Analysis"), meta(901, "HCCL")]
at = start  # the lanes tile the device's time, one after the other here
for tid, name, share in ((0, "Computing", 0.6), (3, "Free", 0.3), (1, "Communication", 0.1)):
    out.append({"ph": "X", "name": name, "pid": 900, "tid": tid, "ts": "%.3f" % at, "dur": share * (end - start)})
    at += share * (end - start)
out.append({"ph": "X", "name": "hcom_allReduce__7_0_1", "pid": 901, "tid": 0, "ts": "%.3f" % start, "dur": 50})
api = {}  # the CANN call made inside each op: the last one starting at or after the op
for e in events:
    if e.get("pid") == 12340002 and e["ph"] == "X":
        api[e["ts"]] = e
for e in events:
    if e["ph"] in "sf" and e["id"] % 2 == 0:
        e["cat"] = e["name"] = "async_acl_npu"
        if e["ph"] == "s":  # from the API call inside the op, on the CANN process
            call = min((c for c in api.values() if float(c["ts"]) >= float(e["ts"])), key=lambda c: float(c["ts"]))
            e.update(pid=12340002, ts=call["ts"])
json.dump(events + out, open(sys.argv[2], "w"))
PY
"$opfuse" analyze "$tmp/npu-overlap.json" --json "$tmp/npu-overlap-out.json" > "$tmp/npu-overlap.txt"
grep -q "^          the profiler's Overlap Analysis over the trace (.* ms): Computing .* ms (60.0%), Communication .* ms (10.0%), Free .* ms (30.0%)$" "$tmp/npu-overlap.txt"
python3 - "$tmp/npu.json" "$tmp/npu-overlap-out.json" <<'PY'
import json, sys
plain, overlap = (json.load(open(p)) for p in sys.argv[1:])
names = {o["name"] for o in overlap["ops"]}
assert names == {o["name"] for o in plain["ops"]}, names ^ {o["name"] for o in plain["ops"]}
device = {o["name"]: o["device_us"] for o in plain["ops"]}
for o in overlap["ops"]:
    assert abs(o["device_us"] - device[o["name"]]) < 1e-6, (o["name"], o["device_us"], device[o["name"]])
assert device["aten::convolution"] > 0 and device["aten::add_"] > 0
lanes = {l["name"]: l for l in overlap["device"]["overlap_analysis"]["lanes"]}
assert set(lanes) == {"Computing", "Free", "Communication"} and abs(lanes["Computing"]["pct"] - 60) < 0.1, lanes
assert overlap["device"]["overlap_analysis"]["per"] == "total" and plain["device"]["overlap_analysis"] is None
assert overlap["device"]["device"] == plain["device"]["device"] and overlap["device"]["busy_us"] == plain["device"]["busy_us"]
PY
"$opfuse" analyze "$data/traces/ascend_style_sample.json" --no-default-rules \
  --rules "$data/rules/ascend_advisor_timeline_fusion_ops.yaml" | grep -q "torch_npu.optim.NpuFusedAdam"
"$opfuse" analyze "$data/traces/kineto_rocm_minitoy.json.gz" --json "$tmp/gpu.json" > "$tmp/gpu.txt"
grep -q "dialect   PyTorch Kineto, backend cuda" "$tmp/gpu.txt"
# Device time: the union over streams in the kernel window (HTA's convention; the figures
# themselves are checked against a reference script in tests/analyze/check_device_time.py).
grep -q "^device    2: 8.91 ms window per step, 0.15 ms busy (1.7%), 8.76 ms idle (98.3%)" "$tmp/gpu.txt"
grep -q "compute 1.2%, communication 0.0%, memcpy/memset 0.4% of the window" "$tmp/gpu.txt"
grep -q "8 of 14 kernels shorter than their launch" "$tmp/gpu.txt"
python3 - "$tmp/gpu.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))
d = a["device"]
for key in ("window_us", "busy_us", "idle_us", "breakdown", "streams", "launch", "per"):
    assert key in d, key
assert set(d["breakdown"]) == {"compute_pct", "communication_pct", "memory_pct", "idle_pct"}, d["breakdown"]
assert d["per"] == "step" and d["steps"] == 1, d
assert abs(d["busy_us"] + d["idle_us"] - d["window_us"]) < 1e-6
assert d["streams"][0]["stream"] == "0" and "busy_us" in d["streams"][0]
assert a["devices"][0] == d
assert a["trace"]["steps"] == 2  # the GPU's copy of ProfilerStep#1 is no third step
assert any(o["device_us"] for o in a["ops"]), "ops carry the device time of their kernels"
PY
# Meta's MTIA: mtia_ccp_events are its device (the synthetic layout of make_gpu_trace.py).
python3 "$(dirname "$0")/../analyze/make_gpu_trace.py" "$tmp/mtia.json" --layout mtia --steps 3 --ops 20
"$opfuse" analyze "$tmp/mtia.json" > "$tmp/mtia.txt"
grep -q "dialect   PyTorch Kineto, backend mtia" "$tmp/mtia.txt"
grep -q "^device    0: .* ms window per step" "$tmp/mtia.txt"
"$opfuse" analyze "$data/traces/kineto_cpu_only.json.gz" --json "$tmp/cpu.json" > /dev/null
python3 -c "import json, sys; a = json.load(open(sys.argv[1])); assert a['device'] is None and a['devices'] == []" "$tmp/cpu.json"
"$opfuse" analyze "$data/traces/kineto_cpu_only.json.gz" | grep -q "backend cpu"

# Nothing is overwritten without --force.
expect_usage_error analyze "$data/traces/kineto_cpu_only.json.gz" --json "$tmp/a.json"
grep -q "already exists" "$tmp/err"

# Outputs are checked before a trace is read: one line with the OS's reason, and no tables.
cpu="$data/traces/kineto_cpu_only.json.gz"
expect_usage_error analyze "$cpu" --json "$tmp/nodir/x.json"
grep -q "nodir/x.json: cannot write into .*/nodir/ (No such file or directory)$" "$tmp/err"
[ ! -s "$tmp/out" ]
expect_usage_error analyze "$cpu" --html "$tmp/a.json/x.html"
grep -q "a.json/x.html: cannot write into .*/a.json/ (Not a directory)$" "$tmp/err"
[ ! -s "$tmp/out" ]
expect_usage_error analyze "$cpu" --json "$tmp" --force
grep -q ": is a folder, not a file name$" "$tmp/err"
if [ "$(id -u)" -ne 0 ]; then  # root writes anywhere
  mkdir "$tmp/read-only" && chmod 555 "$tmp/read-only"
  expect_usage_error analyze "$cpu" --json "$tmp/read-only/x.json"
  grep -q "(Permission denied)$" "$tmp/err"
fi
expect_usage_error analyze "$cpu" --json "$tmp/same.json" --html "$tmp/./same.json"
grep -q "same.json: given for both --json and --html" "$tmp/err"
[ ! -e "$tmp/same.json" ] && [ ! -s "$tmp/out" ]
expect_usage_error analyze "$cpu" --json - --html -
grep -q "given for both --json and --html" "$tmp/err"

# --json -: stdout holds the JSON alone (no file named '-'); the tables go to stderr.
(cd "$tmp" && "$opfuse" analyze "$cpu" "$data/traces/kineto_rocm_minitoy.json.gz" --json - > stdout.json 2> tables.txt)
python3 -c "import json, sys; a = json.load(open(sys.argv[1])); assert a['diff']['after']" "$tmp/stdout.json"
grep -q "^findings" "$tmp/tables.txt" && grep -q "^before -> after" "$tmp/tables.txt"
[ ! -e "$tmp/-" ]

# Findings that save nothing come last and are left out of the table unless --all.
printf '{"traceEvents": [
{"ph":"X","cat":"cpu_op","name":"aten::softplus","pid":1,"tid":1,"ts":0,"dur":10,"args":{"Input Dims":[[64,64]]}},
{"ph":"X","cat":"cpu_op","name":"aten::tanh","pid":1,"tid":1,"ts":20,"dur":10,"args":{"Input Dims":[[64,64]]}},
{"ph":"X","cat":"cpu_op","name":"aten::mul","pid":1,"tid":1,"ts":40,"dur":10,"args":{"Input Dims":[[64,64],[64,64]]}},
{"ph":"X","cat":"cpu_op","name":"aten::sigmoid","pid":1,"tid":2,"ts":100,"dur":10,"args":{"Input Dims":[[64,64]]}},
{"ph":"X","cat":"cpu_op","name":"aten::mul","pid":1,"tid":2,"ts":120,"dur":0,"args":{"Input Dims":[[64,64],[64,64]]}}]}' \
  > "$tmp/zero.json"
"$opfuse" analyze "$tmp/zero.json" --json "$tmp/zero-out.json" > "$tmp/zero.txt"
grep -q "^findings: 2 (1 shown" "$tmp/zero.txt" && grep -q "^mish " "$tmp/zero.txt" && ! grep -q "^silu " "$tmp/zero.txt"
grep -q "^1 with no estimated saving not listed (--all lists them)" "$tmp/zero.txt"
"$opfuse" analyze "$tmp/zero.json" --all | sed -n '/^findings/,$p' | grep -A1 "^mish " | grep -q "^silu .* 0.00 "
python3 -c "import json, sys; f = json.load(open(sys.argv[1]))['findings']; assert [(x['rule'], x['est_saving_us']) for x in f] == [('mish', 20.0), ('silu', 0.0)], f" "$tmp/zero-out.json"

# Bad input: one line naming the file (and the byte offset for malformed JSON), exit 2.
: > "$tmp/empty.json"
expect_usage_error analyze "$tmp/empty.json"
grep -q "empty.json: .*at byte 0" "$tmp/err"
# A cut file is truncated where it stops (simdjson alone says byte 0 for a string left open).
head -c 2040 "$data/traces/kineto_backward_thread.json" > "$tmp/truncated.json"
expect_usage_error analyze "$tmp/truncated.json"
grep -q "truncated.json: truncated at byte 2040 (the file ends inside a string)" "$tmp/err"
head -c 3000 "$data/traces/kineto_rocm_minitoy.json.gz" > "$tmp/truncated.json.gz"
expect_usage_error analyze "$tmp/truncated.json.gz"
grep -q "truncated.json.gz: truncated at byte 3000 (the gzip stream ends early" "$tmp/err"
# Both traces are read before anything is printed: a bad second one gives only its line.
expect_usage_error analyze "$cpu" "$tmp/truncated.json"
[ ! -s "$tmp/out" ]
printf '[{"ph":"X","name":"a","ts":1,"dur":1,"cat":"whatever"}]' > "$tmp/unknown.json"
expect_usage_error analyze "$tmp/unknown.json"
grep -q "not a trace opfuse recognises" "$tmp/err"
printf '[{"ph":"X","cat":"cpu_op","name":"\377","ts":1,"dur":1}]' > "$tmp/utf8.json"
expect_usage_error analyze "$tmp/utf8.json"
grep -q "utf8.json: .*at byte 34" "$tmp/err"
printf 'rules: [{name: x, patterns: ["a-(b"], replacement: {cpu: y}}]\n' > "$tmp/bad.yaml"
expect_usage_error analyze "$data/traces/kineto_cpu_only.json.gz" --rules "$tmp/bad.yaml"
grep -q "bad.yaml: pattern 'a-(b': expected ')' at character 5 at line 1" "$tmp/err"

# A recoverable event is skipped with a warning; overlapping slices are counted, not fatal.
printf '[{"ph":"X","cat":"cpu_op","name":"aten::sigmoid","pid":1,"tid":1,"ts":0,"dur":5},
{"ph":"X","cat":"cpu_op","name":"aten::mul","pid":1,"tid":1,"ts":6,"dur":"x"},
{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":10,"dur":10},
{"ph":"X","cat":"cpu_op","name":"b","pid":1,"tid":1,"ts":15,"dur":10}]' > "$tmp/odd.json"
"$opfuse" analyze "$tmp/odd.json" > "$tmp/odd.txt"
grep -q "1 skipped" "$tmp/odd.txt"
grep -q "1 overlapping" "$tmp/odd.txt"
grep -q "warning: .*odd.json: event skipped: .*at byte" "$tmp/odd.txt"
# Many ranks: a folder of eight rank traces made from one, rank 5 delayed by 25%.
python3 "$(dirname "$0")/../analyze/make_gpu_trace.py" "$tmp/gpu.json" --steps 6
python3 "$(dirname "$0")/../analyze/make_rank_traces.py" "$tmp/gpu.json" "$tmp/ranks" --ranks 8 --delayed 5 --delay 0.25
"$opfuse" analyze "$tmp/ranks" --json "$tmp/ranks.json" --html "$tmp/ranks.html" > "$tmp/ranks.txt"
grep -q "^slowest rank 5: 25.0% behind the median rank" "$tmp/ranks.txt"
grep -q "^8 traces analysed in" "$tmp/ranks.txt"
python3 - "$tmp/ranks.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))
assert [r["rank"] for r in a["ranks"]] == list(range(8)), a["ranks"]
assert a["slowest_rank"]["rank"] == 5 and abs(a["slowest_rank"]["behind_pct"] - 25) < 0.01, a["slowest_rank"]
steps = {r["rank"]: r["step_us"] for r in a["ranks"]}
assert abs(steps[5] / steps[0] - 1.25) < 1e-6 and a["ranks_per"] == "step"
assert a["trace"]["path"].endswith("worker5.trace.json")  # the full analysis is the slowest rank's
PY
# A glob names the ranks too; two traces of one rank are refused; a folder is not diffed.
"$opfuse" analyze "$tmp/ranks/worker[0-3].trace.json" | grep -q "^4 traces analysed"
cp "$tmp/ranks/worker1.trace.json" "$tmp/ranks/copy.trace.json"
expect_usage_error analyze "$tmp/ranks"
grep -q "are both rank 1" "$tmp/err"
expect_usage_error analyze "$tmp/ranks" "$tmp/gpu.json"
grep -q "a folder of ranks is analysed alone" "$tmp/err"
expect_usage_error analyze "$tmp/nothing*.json"
grep -q "no trace matches" "$tmp/err"

# Units: without ProfilerStep markers, a training loop's steps come from its repeating top-level
# ops, said so; a trace that does not repeat (one step) gives totals, said so; --steps N makes
# them per step, in the tables and in JSON; a count that contradicts the markers is refused.
python3 - "$tmp/memory-efficient.json" "$tmp/unmarked.json" "$tmp/one-step.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
events = t["traceEvents"] if isinstance(t, dict) else t
marker = lambda e: str(e.get("name", "")).startswith("ProfilerStep#")
second = sorted(float(e["ts"]) for e in events if marker(e))[1]
kept = [e for e in events if not marker(e)]
one = [e for e in kept if e.get("ph") == "M" or float(e.get("ts", 0)) < second]
assert len(one) < len(kept) < len(events)
for path, evs in ((sys.argv[2], kept), (sys.argv[3], one)):
    json.dump({"traceEvents": evs} if isinstance(t, dict) else evs, open(path, "w"))
PY
"$opfuse" analyze "$tmp/unmarked.json" --json "$tmp/inferred.json" > "$tmp/inferred.txt"
grep -q ", 2 steps (no ProfilerStep markers: the top-level ops repeat 2 times), .* ms per step (median)" "$tmp/inferred.txt"
grep -q "^findings: .*times per step" "$tmp/inferred.txt"
"$opfuse" analyze "$tmp/one-step.json" --json "$tmp/total.json" > "$tmp/total.txt"
grep -q "no ProfilerStep markers: times are totals over the trace" "$tmp/total.txt"
grep -q "^findings: .*times in the trace" "$tmp/total.txt"
"$opfuse" analyze "$tmp/unmarked.json" --steps 2 --json "$tmp/per.json" --html "$tmp/per.html" > "$tmp/per.txt"
grep -q ", 2 steps (--steps), .* ms per step" "$tmp/per.txt"
grep -q "^findings: .*times per step" "$tmp/per.txt"
grep -q "ms per step)" "$tmp/per.txt"
python3 - "$tmp/total.json" "$tmp/per.json" "$tmp/inferred.json" <<'PY'
import json, sys
total, per, inferred = (json.load(open(p)) for p in sys.argv[1:])
assert total["trace"]["steps"] == 0 and total["trace"]["steps_from"] == ""
assert all(f["time_us_per_step"] is None for f in total["findings"]) and total["ops"][0]["self_us_per_step"] is None
assert per["trace"]["steps"] == 2 and per["trace"]["steps_from"] == "given"
assert abs(per["trace"]["step_us"] - per["trace"]["duration_us"] / 2) < 1e-6
assert inferred["trace"]["steps"] == 2 and inferred["trace"]["steps_from"] == "repeated pattern", inferred["trace"]
assert 0.3 < inferred["trace"]["step_us"] / per["trace"]["step_us"] < 1.5
for a, b in zip(inferred["findings"], per["findings"]):
    assert a["time_us"] == b["time_us"] and a["time_us_per_step"] == b["time_us_per_step"]
    assert abs(b["time_us_per_step"] - b["time_us"] / 2) < 1e-6 and abs(b["est_saving_us_per_step"] - b["est_saving_us"] / 2) < 1e-6
op = per["ops"][0]
assert abs(op["self_us_per_step"] - op["self_us"] / 2) < 1e-6 and inferred["ops"][0]["self_us_per_step"] == op["self_us_per_step"]
PY
expect_usage_error analyze "$tmp/memory-efficient.json" --steps 3
grep -q "marks 2 steps (ProfilerStep#), not the 3 given with --steps" "$tmp/err"
"$opfuse" analyze "$tmp/memory-efficient.json" --steps 2 | grep -q ", 2 steps, .* ms per step (median)"
echo ok
