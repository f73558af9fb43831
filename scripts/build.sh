#!/bin/sh
# Configures and builds opfuse (and its tests) in ./build with Ninja.
set -eu
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > build.cmake.log 2>&1 || { cat build.cmake.log; exit 1; }
rm -f build.cmake.log
cmake --build build
