#!/bin/sh
# Fuzzes the trace reader, op model and analysis with libFuzzer (Debian's clang, with
# AddressSanitizer and UBSan) for SECONDS (default 600), one worker; the reader's chunked path
# is checked against the one-piece parse on every input. Seeds: tests/data/traces
# and the cases in tests/data/fuzz. Crashers land in build-fuzz/crashes/ and make it exit 1;
# minimise one with `build-fuzz/fuzz_reader -minimize_crash=1 FILE` and add it to tests/data/fuzz.
#   scripts/setup.sh --fuzz && scripts/fuzz.sh [SECONDS]
set -eu
cd "$(dirname "$0")/.."
seconds="${1:-600}"
command -v clang++ > /dev/null || { echo "fuzz: clang++ missing: run scripts/setup.sh --fuzz" >&2; exit 2; }
[ -f build/src/analyze/default_rules.cpp ] || scripts/build.sh > /dev/null
out=build-fuzz
mkdir -p "$out/corpus" "$out/crashes"
flags="-std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -Iinclude -Isrc"
objs=""
for kernel in generic haswell; do
  extra=""; [ $kernel = haswell ] && extra="-mavx2 -mbmi -mbmi2 -mlzcnt -mpclmul -mpopcnt"
  # shellcheck disable=SC2086
  clang++ $flags -fsanitize=fuzzer-no-link $extra -DOPFUSE_KERNEL=$kernel -DOPFUSE_ENTRY=parse_document_$kernel \
    -c src/trace/document.cpp -o "$out/document_$kernel.o"
  objs="$objs $out/document_$kernel.o"
done
# shellcheck disable=SC2086
clang++ $flags tests/fuzz/fuzz_reader.cpp src/trace/reader.cpp src/trace/model.cpp src/analyze/*.cpp \
  build/src/analyze/default_rules.cpp $objs -lsimdjson -lfmt -lyaml-cpp -lz -lpthread -o "$out/fuzz_reader"
for f in tests/data/traces/*.json tests/data/fuzz/*; do [ -f "$f" ] && cp "$f" "$out/corpus/"; done
for f in tests/data/traces/*.json.gz; do gzip -dc "$f" > "$out/corpus/$(basename "$f" .gz)"; done
"$out/fuzz_reader" "$out/corpus" -dict=tests/fuzz/trace.dict -max_len=65536 -timeout=10 -rss_limit_mb=4096 \
  -max_total_time="$seconds" -artifact_prefix="$out/crashes/" -print_final_stats=1
[ -z "$(ls -A "$out/crashes")" ] || { echo "fuzz: crashers in $out/crashes" >&2; exit 1; }
