#!/bin/sh
# The README's install of the Python package, offline: a venv that sees Debian's torch, pip
# without build isolation; then the package imports from outside the source tree and its ops run.
set -eu
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="$(mktemp -d)/venv"
trap 'rm -rf "$(dirname "$venv")"' EXIT
python3 -m venv --system-site-packages "$venv"
OPFUSE_BUILD_DIR="$1" "$venv/bin/pip" install -q --no-build-isolation --no-index "$root/python"
cd "$(dirname "$venv")"
"$venv/bin/python" -c "
import opfuse, torch
assert opfuse._C.__file__.startswith('$venv'), opfuse._C.__file__
x = torch.randn(5, dtype=torch.float64)
assert torch.allclose(torch.ops.opfuse.silu(x), x * torch.sigmoid(x))
"
"$venv/bin/python" -m opfuse tune --help | grep -q "FILE.py:FACTORY"
echo "install ok"
