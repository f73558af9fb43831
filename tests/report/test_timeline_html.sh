#!/bin/sh
# The timeline in the analysis page, end to end on a real trace: opfuse analyze --html, headless
# Chromium runs the page's script, and the screenshot must show the silu finding's colour inside
# the timeline's box; the same trace analysed with no rules must show none of it there.
# usage: test_timeline_html.sh OPFUSE DATA_DIR   (leaves timeline*.html/.png in the cwd)
set -eu
opfuse="$1"
traces="$2/traces"
here=$(dirname "$0")
command -v chromium > /dev/null || {
  echo "timeline_html: chromium is not on PATH; install it with scripts/setup.sh" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "timeline_html: $*" >&2; exit 1; }

browse() {  # PAGE, then chromium's flags
  page="$1"; shift
  HOME="$tmp" timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync --hide-scrollbars \
    --force-device-scale-factor=1 --window-size=1280,1000 --user-data-dir="$tmp/profile" \
    --virtual-time-budget=5000 "$@" "file://$PWD/$page" 2>> "$tmp/chromium.log"
}
# What the script drew: the DOM before the two script elements (which hold the data).
drawn() { browse "$1" --dump-dom > "$tmp/dom.html" || { cat "$tmp/chromium.log" >&2; fail "chromium --dump-dom failed on $1"; }
          sed '/<script/,$d' "$tmp/dom.html"; }
attr() { sed -n "s/.*$1=\"\([^\"]*\)\".*/\1/p" | head -n 1; }
shot() { rm -f "$2"; browse "$1" --screenshot="$PWD/$2" > /dev/null || { cat "$tmp/chromium.log" >&2; fail "screenshot of $1 failed"; }
         [ -s "$2" ] || fail "empty screenshot $2"; }

# The Ascend sample: Swish as sigmoid + mul six times, so the silu finding has chains in the step.
"$opfuse" analyze "$traces/ascend_style_sample.json" --html timeline.html --force > /dev/null
drawn timeline.html > "$tmp/drawn.html"
grep -qF 'id="timeline"' "$tmp/drawn.html" || fail "no timeline section"
grep -qF 'ProfilerStep#' "$tmp/drawn.html" || fail "the caption does not name the step shown"
figure=$(grep -o '<figure class="timeline"[^>]*>' "$tmp/drawn.html" | head -n 1)
[ -n "$figure" ] || fail "no timeline figure"
highlighted=$(echo "$figure" | attr data-highlighted)
slices=$(echo "$highlighted" | sed -n 's/.*silu:\([0-9]*\).*/\1/p')
[ -n "$slices" ] && [ "$slices" -ge 12 ] || fail "expected 12 or more silu slices (6 chains of 2 ops), data-highlighted=$highlighted"
swatch=$(grep -o '<span class="swatch timeline-finding"[^>]*data-rule="silu"[^>]*>' "$tmp/drawn.html" | head -n 1)
[ -n "$swatch" ] || fail "no legend entry for silu"
colour=$(echo "$swatch" | attr data-colour)
box=$(echo "$figure" | attr data-box)
echo "$box" | grep -qE '^[0-9]+,[0-9]+,[0-9]+,[0-9]+$' || fail "the figure reports no box: '$box'"

shot timeline.html timeline.png
lit=$(python3 "$here/count_colour.py" timeline.png "$box" "$colour")
# 12 slices of at least 1 px by 13 px rows; far more in practice.
[ "$lit" -ge 150 ] || fail "only $lit pixels of $colour inside the timeline ($box)"

# The control: the same page with every slice's finding mark cleared must draw none of it there.
python3 - timeline.html timeline_plain.html <<'PY'
import json, re, sys
page = open(sys.argv[1], encoding="utf-8").read()
m = re.search(r'(<script type="application/json" id="analysis">)(.*?)(</script>)', page, re.S)
data = json.loads(m.group(2))
for s in data["timeline"]["slices"]:
    s[6] = -1
text = json.dumps(data).replace("</", "<\\/")
open(sys.argv[2], "w", encoding="utf-8").write(page[:m.start(2)] + text + page[m.end(2):])
PY
box_plain=$(drawn timeline_plain.html | grep -o '<figure class="timeline"[^>]*>' | attr data-box)
shot timeline_plain.html timeline_plain.png
plain=$(python3 "$here/count_colour.py" timeline_plain.png "$box_plain" "$colour")
[ "$plain" -eq 0 ] || fail "$plain pixels of $colour in the timeline with no slice marked"

# Two traces: two timelines, before and after, one time scale, and the page survives both.
"$opfuse" analyze "$traces/kineto_compare_base.json.gz" "$traces/kineto_compare_test.json.gz" --html timeline_diff.html --force > /dev/null
drawn timeline_diff.html > "$tmp/drawn.html"
grep -qF 'data-trace="before"' "$tmp/drawn.html" || fail "no before timeline"
grep -qF 'data-trace="after"' "$tmp/drawn.html" || fail "no after timeline"

# A GPU trace: device streams as lanes, the device section charts the temporal breakdown and kernels.
"$opfuse" analyze "$traces/kineto_rocm_minitoy.json.gz" --html timeline_gpu.html --force > /dev/null
drawn timeline_gpu.html > "$tmp/drawn.html"
grep -qF 'id="device"' "$tmp/drawn.html" || fail "no device section on a GPU trace"
grep -qF 'Temporal breakdown' "$tmp/drawn.html" || fail "no temporal breakdown"
grep -qF 'Kernel time, top' "$tmp/drawn.html" || fail "no kernel time chart"
grep -qF 'Device time per op' "$tmp/drawn.html" || fail "the op chart is not by device time on a GPU trace"
echo "timeline_html: ok ($lit pixels of $colour in the timeline; $PWD/timeline.png)"
