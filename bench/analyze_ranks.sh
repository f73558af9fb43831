#!/bin/sh
# opfuse analyze on a folder of 8 rank traces against the 8 single-trace analyses, side by side:
# the folder's wall time over the sum of the singles' (target ≤ 1.1) and its peak RSS over the
# largest file (target ≤ 1.5). The ranks are made from bench/analyze_speed.sh's ~100 MB trace
# (rank 5 stretched by 25 %), written once into $OUT (default /tmp).
#   bench/analyze_ranks.sh [build/opfuse]
set -eu
opfuse="${1:-build/opfuse}"
out="${OUT:-/tmp}"
here="$(dirname "$0")"
trace="$out/opfuse-speed.trace.json"
ranks="$out/opfuse-ranks"
if [ ! -f "$trace" ]; then
  "$opfuse" train --swish memory-efficient --image-size 32 --batch-size 2 --steps 1 --warmup 1 \
    --profile "$trace" --profile-steps 48 > /dev/null
fi
if [ ! -d "$ranks" ]; then
  python3 "$here/../tests/analyze/make_rank_traces.py" "$trace" "$ranks" --ranks 8 --delayed 5 --delay 0.25
fi
largest=$(stat -c %s "$ranks"/* | sort -n | tail -1)
echo "ranks: $ranks ($(ls "$ranks" | wc -l) traces, largest $((largest / 1000000)) MB), $(nproc) cores"
run() {  # prints "seconds kilobytes"
  /usr/bin/time -f "%e %M" -o "$out/time.txt" "$@" > /dev/null
  cat "$out/time.txt"
}
for round in 1 2 3; do
  singles=0
  single_rss=0
  for f in "$ranks"/*; do
    set -- $(run "$opfuse" analyze "$f")
    singles=$(echo "$singles $1" | awk '{print $1 + $2}')
    single_rss=$(echo "$single_rss $2" | awk '{print ($2 > $1) ? $2 : $1}')
  done
  set -- $(run "$opfuse" analyze "$ranks")
  echo "$round $singles $single_rss $1 $2 $largest" | awk '{
    printf "round %d: 8 singles %6.2f s (largest RSS %4.0f MB)   folder %6.2f s  %4.0f MB peak RSS   time x%.2f of the singles, RSS x%.2f the largest file\n",
      $1, $2, $3 / 1024, $4, $5 / 1024, $4 / $2, $5 * 1024 / $6
  }'
done
