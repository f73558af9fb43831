#!/bin/sh
# Installs everything opfuse needs on a fresh Debian 12 machine: Debian's packages (compiler, build
# tools, libraries, Chromium for the report test) with apt-get, then the project's venv (.venv) with
# the pinned Python packages of requirements.txt (torch 2.x from pip) for PYTHON (default: the
# python3 on PATH). Each step is skipped when already done. --fuzz also installs clang.
set -eu
cd "$(dirname "$0")/.."
packages="cmake ninja-build g++ pkg-config libsimdjson-dev nlohmann-json3-dev libyaml-cpp-dev libcli11-dev
  libfmt-dev zlib1g-dev googletest libgtest-dev libbenchmark-dev libturbojpeg0-dev libpng-dev chromium
  python3-venv python3-dev"
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

python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
# pip answers quickly when every pin is already met; a dropped download is retried once.
if ! .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt; then
  echo "setup: pip install failed; retrying once"
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
fi
