#!/bin/sh
# The README's install of the Python package into a user's own environment, offline: a plain venv
# (no --system-site-packages, not the project's) that already holds torch, here the project's
# torch made visible through a .pth file; pip install --no-build-isolation builds against that
# torch (the build folder BUILD is reused: it was configured for the same torch). Then the package
# imports from outside the source tree, its ops run and `python -m opfuse tune` answers.
set -eu
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
venv="$tmp/venv"
python3 -m venv "$venv"
torch_site="$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')"
"$venv/bin/python" -c 'import site, sys; print(site.getsitepackages()[0])' > "$tmp/site"
echo "$torch_site" > "$(cat "$tmp/site")/users_torch.pth"
# The venv's own setuptools (ensurepip's 65) builds no wheel without the `wheel` package: the
# install says so in one line and what to run, before any build.
if OPFUSE_BUILD_DIR="$build" "$venv/bin/pip" install -q --no-build-isolation --no-index --no-deps "$root/python" \
    > "$tmp/old-setuptools.log" 2>&1; then
  echo "pip install with setuptools 65 and no wheel package should have failed"; exit 1
fi
grep -q "pip install 'setuptools>=70.1'" "$tmp/old-setuptools.log" || { cat "$tmp/old-setuptools.log"; exit 1; }
# With a current one (>= 70.1, as the project's venv has, seen through the .pth) it builds.
"$venv/bin/python" -m pip uninstall -q -y setuptools
OPFUSE_BUILD_DIR="$build" "$venv/bin/pip" install -q --no-build-isolation --no-index --no-deps "$root/python"
cd "$tmp"
"$venv/bin/python" -c "
import opfuse, torch
assert opfuse._C.__file__.startswith('$venv'), opfuse._C.__file__
x = torch.randn(5, dtype=torch.float64)
assert torch.allclose(torch.ops.opfuse.silu(x), x * torch.sigmoid(x))
"
"$venv/bin/python" -m opfuse tune --help | grep -q "FILE.py:FACTORY"
# A core that is there but does not load (built against another torch) is named, with the loader's
# reason, not called unbuilt.
core="$(ls "$(cat "$tmp/site")"/opfuse/_C.*.so)"
head -c 4096 /dev/zero > "$core"
if "$venv/bin/python" -c "import opfuse" > "$tmp/broken.log" 2>&1; then echo "a broken _C imported"; exit 1; fi
grep -q "opfuse's compiled core (_C) is there but does not load: .*invalid ELF header" "$tmp/broken.log" || { cat "$tmp/broken.log"; exit 1; }
echo "install ok"
