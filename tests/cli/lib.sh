# Shared by the CLI tests: run opfuse expecting a usage error — exit code 2 and exactly one
# line on stderr (left in $tmp/err for further checks). Needs $opfuse and $tmp.
expect_usage_error() {
  if "$opfuse" "$@" > "$tmp/out" 2> "$tmp/err"; then echo "expected failure: $*"; exit 1; else code=$?; fi
  [ "$code" -eq 2 ] || { echo "exit $code, expected 2: $*"; cat "$tmp/err"; exit 1; }
  [ "$(wc -l < "$tmp/err")" -eq 1 ] || { echo "error is not one line: $*"; cat "$tmp/err"; exit 1; }
}
