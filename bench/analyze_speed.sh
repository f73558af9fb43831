#!/bin/sh
# opfuse analyze against Python's json.load (parsing alone) on a ~100 MB trace, side by side:
# wall time and peak RSS of each, 3 runs, and the ratios. The trace is opfuse's own profile of
# 48 EfficientNet-B0 steps (real events, ~400k of them), written once into $OUT (default /tmp).
#   bench/analyze_speed.sh [build/opfuse]
set -eu
opfuse="${1:-build/opfuse}"
out="${OUT:-/tmp}"
trace="$out/opfuse-speed.trace.json"
if [ ! -f "$trace" ]; then
  "$opfuse" train --swish memory-efficient --image-size 32 --batch-size 2 --steps 1 --warmup 1 \
    --profile "$trace" --profile-steps 48 > /dev/null
fi
size=$(stat -c %s "$trace")
echo "trace: $trace ($((size / 1000000)) MB)"
measure() {  # prints "seconds kilobytes" of the best of 3 runs
  best=""
  for _ in 1 2 3; do
    /usr/bin/time -f "%e %M" -o "$out/time.txt" "$@" > /dev/null
    line=$(cat "$out/time.txt")
    if [ -z "$best" ] || [ "$(echo "$line $best" | awk '{print ($1 < $3)}')" = 1 ]; then best="$line"; fi
  done
  echo "$best"
}
py=$(measure python3 -c "import json, sys; json.load(open(sys.argv[1]))" "$trace")
nm=$(measure "$opfuse" analyze "$trace")
me=$(measure "$opfuse" analyze "$trace" --measure)
echo "$py $nm $me $size" | awk '{
  printf "python json.load        %6.2f s  %5.0f MB peak RSS\n", $1, $2 / 1024
  printf "opfuse analyze          %6.2f s  %5.0f MB peak RSS   x%.1f faster, RSS %.2f x file (bandwidth estimates)\n", $3, $4 / 1024, $1 / $3, $4 * 1024 / $7
  printf "opfuse analyze --measure%6.2f s  %5.0f MB peak RSS   x%.1f faster (opfuse ops timed here at recorded shapes)\n", $5, $6 / 1024, $1 / $5
}'
