#!/bin/sh
# bench-op end to end: exit codes, help, and the JSON keys scripts rely on.
set -eu
opfuse="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"

"$opfuse" --help | grep -q bench-op
"$opfuse" bench-op --help | grep -q -- --numel

for op in silu swish se_gate batch_norm_silu drop_connect_add; do
  "$opfuse" bench-op "$op" --numel 100000 --rounds 3 --warmup 1 --threads 1 --json "$tmp/$op.json" > "$tmp/$op.txt"
  grep -q "opfuse vs aten" "$tmp/$op.txt"
  /usr/bin/python3 - "$tmp/$op.json" "$op" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for key in ("op", "numel", "threads", "ms", "speedup_vs_reference", "speedup_vs_aten", "opfuse_gbps", "copy_gbps"):
    assert key in r, key
assert r["op"] == sys.argv[2] and r["threads"] == 1
assert set(r["ms"]) == {"reference", "aten", "opfuse"} and all(v > 0 for v in r["ms"].values())
PY
done

expect_usage_error bench-op gelu
expect_usage_error bench-op silu --numel 0
expect_usage_error bench-op silu --numel abc
expect_usage_error frobnicate
# An existing --json file is not replaced without --force.
expect_usage_error bench-op silu --numel 1000 --rounds 1 --json "$tmp/silu.json"
"$opfuse" bench-op silu --numel 1000 --rounds 1 --json "$tmp/silu.json" --force > /dev/null
echo ok
