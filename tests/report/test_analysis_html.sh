#!/bin/sh
# The analysis page end to end: render a hand-written analysis, let headless Chromium run its
# script, and check the drawn DOM (finding rows, SVG charts, before/after, escaping of names).
# usage: test_analysis_html.sh OPFUSE_RENDER_HTML   (leaves report_html.html/.png in the cwd)
set -eu
render="$1"
command -v chromium > /dev/null || {
  echo "report_html: chromium is not on PATH; install it with scripts/setup.sh" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "report_html: $*" >&2; exit 1; }

# Twenty ops so the chart needs an "other" bar; one name tries to close the JSON's script element.
cat > "$tmp/analysis.json" <<'JSON'
{"trace": {"path": "runs/b0/before.json.gz", "dialect": "PyTorch Kineto", "backend": "cpu", "events": 8187,
           "duration_us": 75717.7, "steps": 1, "step_us": 75717.7, "skipped_events": 3},
 "ops": [
  {"name": "aten::mkldnn_convolution", "count": 81, "total_us": 30100.0, "self_us": 29800.0, "mean_us": 371.6, "device_us": null},
  {"name": "aten::mul", "count": 477, "total_us": 9234.5, "self_us": 9000.1, "mean_us": 19.36, "device_us": 120.0},
  {"name": "aten::sigmoid", "count": 65, "total_us": 6100.0, "self_us": 6050.0, "mean_us": 93.85, "device_us": null},
  {"name": "aten::native_batch_norm", "count": 49, "total_us": 5200.0, "self_us": 5100.0, "mean_us": 106.1, "device_us": null},
  {"name": "aten::add_", "count": 120, "total_us": 2400.0, "self_us": 2400.0, "mean_us": 20.0, "device_us": null},
  {"name": "aten::mean", "count": 16, "total_us": 1900.0, "self_us": 1800.0, "mean_us": 118.8, "device_us": null},
  {"name": "aten::addmm", "count": 1, "total_us": 1500.0, "self_us": 1450.0, "mean_us": 1500.0, "device_us": null},
  {"name": "my_ext::op</script><b>bold", "count": 2, "total_us": 1300.0, "self_us": 1290.0, "mean_us": 650.0, "device_us": null},
  {"name": "aten::copy_", "count": 40, "total_us": 1100.0, "self_us": 1100.0, "mean_us": 27.5, "device_us": null},
  {"name": "aten::empty", "count": 500, "total_us": 900.0, "self_us": 900.0, "mean_us": 1.8, "device_us": null},
  {"name": "aten::relu", "count": 10, "total_us": 700.0, "self_us": 700.0, "mean_us": 70.0, "device_us": null},
  {"name": "aten::view", "count": 300, "total_us": 600.0, "self_us": 600.0, "mean_us": 2.0, "device_us": null},
  {"name": "aten::flatten", "count": 1, "total_us": 500.0, "self_us": 480.0, "mean_us": 500.0, "device_us": null},
  {"name": "aten::dropout", "count": 1, "total_us": 450.0, "self_us": 440.0, "mean_us": 450.0, "device_us": null},
  {"name": "aten::contiguous", "count": 20, "total_us": 400.0, "self_us": 400.0, "mean_us": 20.0, "device_us": null},
  {"name": "aten::as_strided", "count": 200, "total_us": 300.0, "self_us": 300.0, "mean_us": 1.5, "device_us": null},
  {"name": "aten::resize_", "count": 30, "total_us": 200.0, "self_us": 200.0, "mean_us": 6.7, "device_us": null},
  {"name": "aten::zeros", "count": 5, "total_us": 150.0, "self_us": 150.0, "mean_us": 30.0, "device_us": null},
  {"name": "aten::fill_", "count": 5, "total_us": 100.0, "self_us": 100.0, "mean_us": 20.0, "device_us": null},
  {"name": "aten::detach", "count": 8, "total_us": 50.0, "self_us": 50.0, "mean_us": 6.25, "device_us": null}],
 "device": {"kernel_us": 123.0, "idle_us": 45.0},
 "critical_path": {"length_us": 75000.0, "host_us": 70000.0, "device_us": 0, "idle_us": 5000.0, "predicted_us": 60000.0},
 "memory": [{"device": "cpu", "peak_bytes": 12500000, "peak_at_us": 40.0, "peak_step": "ProfilerStep#2", "peak_op": "aten::mm",
             "allocations": 300, "frees": 290, "by_phase": [{"name": "optimizer state", "bytes": 8000000, "blocks": 0},
             {"name": "backward", "bytes": 4500000, "blocks": 12}], "by_module": [], "by_op": [{"name": "aten::mm", "bytes": 4500000, "blocks": 12}],
             "timeline": [[0, 8000000], [40, 12500000], "bad", [90, 8000000]]}, null],
 "timeline": {"step": "", "dur_us": 10, "lanes": [{"name": "thread 1", "rows": 1}, null], "names": ["aten::mul"],
              "slices": [[0, 0, 1, 2, 0, -1, 7], "bad", [9, 0, 0, 1, 0, -1, -1], [0, 0, "x", 1], [0, 5, 1, 1, 0, -1, -1], [0, 0, 4, 1, 0, 99, 0]]},
 "findings": [
  {"rule": "silu", "kind": "rule", "pattern": "sigmoid-mul", "replacement": "opfuse::silu", "backend": "cpu",
   "occurrences": 49, "time_us": 3000.0, "est_saving_us": 1800.0,
   "locations": [{"location": "_blocks.3._swish", "count": 3}, {"location": "_blocks.4._swish", "count": 3},
                 {"location": "_blocks.5._swish", "count": 3}, {"location": "_blocks.6._swish", "count": 3},
                 {"location": "_blocks.7._swish", "count": 3}, {"location": "_blocks.8._swish", "count": 3}]},
  {"rule": "se_gate", "kind": "rule", "pattern": "mean-conv-silu-conv-sigmoid-mul", "replacement": "opfuse::se_gate",
   "backend": "cpu", "occurrences": 16, "time_us": 2500.0, "est_saving_us": 900.0,
   "locations": [{"location": "_blocks.1._se", "count": 1}]},
  {"rule": "", "kind": "mined", "pattern": "add_-relu", "replacement": "", "backend": "cpu",
   "occurrences": 10, "time_us": 400.0, "est_saving_us": 150.0, "locations": null}],
 "diff": {"after": {"trace": {"path": "runs/b0/after.json.gz", "dialect": "PyTorch Kineto", "backend": "cpu"},
                    "ops": [], "findings": []},
          "step_us_before": 75717.7, "step_us_after": 60574.2,
          "ops": [{"name": "aten::mul", "count_before": 477, "count_after": 200, "total_us_before": 9234.5, "total_us_after": 3000.0},
                  {"name": "aten::sigmoid", "count_before": 65, "count_after": 0, "total_us_before": 6100.0, "total_us_after": 0.0},
                  {"name": "opfuse::silu", "count_before": 0, "count_after": 49, "total_us_before": 0.0, "total_us_after": 1200.0},
                  {"name": "aten::mkldnn_convolution", "count_before": 81, "count_after": 81, "total_us_before": 30100.0, "total_us_after": 30050.0}],
          "findings_vanished": [{"rule": "silu", "kind": "rule", "pattern": "sigmoid-mul", "replacement": "opfuse::silu",
                                 "backend": "cpu", "occurrences": 49, "time_us": 3000.0, "est_saving_us": 1800.0, "locations": []}],
          "findings_appeared": []},
 "ranks": [{"rank": 0, "trace": "r0.json", "steps": 4, "step_us": 1000}, {"rank": 1, "trace": "r1.json", "steps": 4, "step_us": 1250}],
 "ranks_per": "step", "slowest_rank": {"rank": 1, "behind_pct": 11.1},
 "rank_findings": [{"rule": "silu", "pattern": "sigmoid-mul", "replacement": "opfuse::silu", "mined": false, "ranks": 2,
                    "time_us_median": 300, "saving_us_median": 200, "saving_us_min": 150, "saving_us_max": 250}],
 "tune": {"model": "EfficientNet", "batch_size": 8, "ranks": 2, "steps": 1, "rounds": 5, "sample_unit": "images",
          "measured_under": "torch.compile",
          "compile": {"rounds": 5, "threads": 2, "opfuse_compile_vs_compile": {"estimate": 0.97, "ci": [0.903, 1.039]},
                      "variants": [{"variant": "eager", "ms": 17.07, "ms_ci": [16.72, 17.49], "speedup_vs_first": 1,
                                    "speedup_vs_first_ci": [1, 1], "ready_s": null, "peak_memory_bytes": 20600000, "error": null},
                                   {"variant": "compile", "ms": 13.11, "ms_ci": [12.92, 13.58], "speedup_vs_first": 1.289,
                                    "speedup_vs_first_ci": [1.277, 1.321], "ready_s": 24.5, "peak_memory_bytes": 18000000, "error": null},
                                   {"variant": "opfuse + compile", "ready_s": null, "error": "TorchRuntimeError: <b>no fake</b>"},
                                   "bad"]},
          "speedup": 1.2, "speedup_ci": [1.1, 1.3], "environment": {}, "machine": {}, "replacements": [], "rule_times": [],
          "baseline": {"step_ms": 100.0, "step_ms_ci": [98, 102], "images_per_sec": 80, "ops_per_step": 10000,
                       "rank_step_ms": [97.5, 100.0], "slowest_rank": 1},
          "tuned": {"step_ms": 83.3, "step_ms_ci": [82, 85], "images_per_sec": 96, "ops_per_step": 9000,
                    "rank_step_ms": [83.25, 81.0], "slowest_rank": 0}}}
JSON

"$render" "$tmp/analysis.json" report_html.html
grep -qF '<\/script><b>' report_html.html || fail "the op name was not escaped in the embedded JSON"
! grep -qF '</script><b>' report_html.html || fail "a raw </script><b> reached the page source"

# HOME and the profile in $tmp: Chromium writes caches and crash reports there.
browse() {
  HOME="$tmp" timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync --hide-scrollbars \
    --user-data-dir="$tmp/profile" --virtual-time-budget=5000 "$@" "file://$PWD/report_html.html" 2>> "$tmp/chromium.log"
}
browse --dump-dom > "$tmp/dom.html" || { cat "$tmp/chromium.log" >&2; fail "chromium --dump-dom failed"; }
# What the script drew comes before the two script elements, which hold the same words as data.
sed '/<script/,$d' "$tmp/dom.html" > "$tmp/drawn.html"

expect() { grep -qF -- "$1" "$tmp/drawn.html" || fail "rendered page lacks: $1"; }
expect 'class="finding" data-rule="silu"'
expect 'class="finding" data-rule="se_gate"'
expect '<svg'
expect '<rect'
expect 'id="diff"'
expect 'id="memory-cpu"'
expect 'Critical path: 75.00 ms (per step; host ops 93%, device 0%, gaps 7%)'
expect 'Peak 12.5 MB at 0.04 ms (ProfilerStep#2, aten::mm)'
expect 'optimizer state: 8.0 MB'
expect 'Findings that vanished'
# Malformed slices (unknown lane or row, non-numbers, a finding index out of range) are dropped, not drawn.
expect 'class="timeline" data-trace="trace" data-slices="2"'
expect 'other (5 ops)'
expect '_blocks.7._swish ×3'
expect '&lt;/script&gt;&lt;b&gt;bold'
[ "$(grep -o 'class="finding" data-rule=' "$tmp/drawn.html" | wc -l)" -eq 3 ] || fail "expected 3 finding rows"
expect 'batch 8 over 2 ranks'
expect 'ran under torch.compile (for_compile)'
expect 'id="compile"'
expect 'class="compile-variant" data-variant="opfuse + compile"'
expect '×1.289 [1.277, 1.321]'
expect 'TorchRuntimeError: &lt;b&gt;no fake&lt;/b&gt;'
expect 'opfuse + compile against compile alone: ×0.970 [0.903, 1.039]'
[ "$(grep -o 'class="compile-variant"' "$tmp/drawn.html" | wc -l)" -eq 3 ] || fail "expected a row per compile variant"
expect 'id="ranks"'
expect 'rank 1 is the slowest, 11.1% behind the median rank'
expect 'class="rank-finding" data-rule="silu"'
expect '0.15 … 0.25'
[ "$(grep -o 'class="rank-row"' "$tmp/drawn.html" | wc -l)" -eq 2 ] || fail "expected a row per rank trace"
expect '83.25 (slowest)'
[ "$(grep -o 'class="rank"' "$tmp/drawn.html" | wc -l)" -eq 2 ] || fail "expected a row per rank"
! grep -qF '_blocks.8._swish' "$tmp/drawn.html" || fail "more than 5 locations shown"
! grep -qF '</script><b>' "$tmp/dom.html" || fail "the op name became markup"
# -20.0%: 60574.2 / 75717.7 - 1, printed with a true minus sign.
grep -q '(−20\.0%)' "$tmp/drawn.html" || fail "step time change is not -20.0%"

rm -f report_html.png
browse --window-size=1280,2000 --screenshot="$PWD/report_html.png" > /dev/null ||
  { cat "$tmp/chromium.log" >&2; fail "chromium --screenshot failed"; }
[ -s report_html.png ] || fail "empty screenshot"
[ "$(head -c 4 report_html.png | tail -c 3)" = PNG ] || fail "screenshot is not a PNG"
echo "report_html: ok ($PWD/report_html.png)"
