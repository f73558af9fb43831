#!/bin/sh
# Installs everything opfuse needs on a fresh Debian 12 machine, from Debian's packages only.
# Skips apt entirely when all packages are already there. Debian's Chromium is always installed:
# a test renders the analyze report in it. --fuzz also installs clang for scripts/fuzz.sh.
set -eu
packages="cmake ninja-build g++ pkg-config libtorch-dev python3-torch python3-pytest libsimdjson-dev
  nlohmann-json3-dev libyaml-cpp-dev libcli11-dev libfmt-dev zlib1g-dev googletest libgtest-dev
  libbenchmark-dev libturbojpeg0-dev libpng-dev chromium pybind11-dev python3-venv python3-pip
  python3-dev python3-setuptools python3-wheel libopenblas0-openmp"
[ "${1:-}" = "--fuzz" ] && packages="$packages clang libclang-rt-14-dev"
missing=""
for p in $packages; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing$missing"
  as_root=""
  [ "$(id -u)" -eq 0 ] || as_root="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $as_root apt-get update -q || echo "setup: apt-get update failed; trying the cached package lists"
  # shellcheck disable=SC2086
  $as_root apt-get install -y -q --no-install-recommends $missing
fi
