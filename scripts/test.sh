#!/bin/sh
# Builds opfuse and runs every test: the C++ suites, the Python face and the command line.
set -eu
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure -j 2 "$@"
