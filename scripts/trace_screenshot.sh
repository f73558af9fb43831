#!/bin/sh
# Screenshots one profiled step of an opfuse trace in headless Chromium (Debian's package),
# drawn by scripts/trace_view.html, so a person can look at what the profiler wrote.
# usage: scripts/trace_screenshot.sh TRACE.json[.gz] OUT.png [STEP]   (STEP: e.g. ProfilerStep#4)
set -eu
[ $# -ge 2 ] || { echo "usage: $0 TRACE.json[.gz] OUT.png [STEP]" >&2; exit 2; }
trace="$1"; out="$2"; step="${3:-}"
[ -r "$trace" ] || { echo "$trace: cannot read" >&2; exit 2; }
command -v chromium > /dev/null || { echo "chromium is not installed (apt-get install chromium)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$(dirname "$0")/trace_view.html" "$work/index.html"
python3 - "$trace" "$step" > "$work/trace-data.js" <<'PY'
import gzip, json, sys
path, step = sys.argv[1], sys.argv[2]
opener = gzip.open if path.endswith(".gz") else open
with opener(path, "rt") as f:
    events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
steps = sorted((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
if not steps:
    sys.exit(f"{path}: no ProfilerStep# events")
chosen = next((s for s in steps if s["name"] == step), None) if step else steps[0]
if chosen is None:
    sys.exit(f"{path}: no {step}")
lo, hi = chosen["ts"], chosen["ts"] + chosen["dur"]
inside = [e for e in events if e["tid"] == chosen["tid"] and lo <= e["ts"] and e["ts"] + e["dur"] <= hi + 1e-3]
inside.sort(key=lambda e: (e["ts"], -e["dur"]))
rows = [[e["name"], e.get("cat", ""), e["ts"], e["dur"]] for e in inside]
print("window.TRACE = " + json.dumps({"step": chosen["name"], "events": rows}) + ";")
PY
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir="$work/profile" --hide-scrollbars \
  --window-size=1600,1000 --screenshot="$work/shot.png" "file://$work/index.html" > "$work/chromium.log" 2>&1 || {
  cat "$work/chromium.log" >&2; exit 1; }
mv "$work/shot.png" "$out"
echo "$out"
