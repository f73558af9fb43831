#!/bin/sh
# The Python face's target: opfuse.tune on the Python EfficientNet-B0 (efficientnet_pytorch's
# style), baseline and rewrites alternating in one process; prints the report.
#   bench/python_tune.sh [IMAGE_SIZE] [BATCH] [ROUNDS]
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
size="${1:-96}" batch="${2:-16}" rounds="${3:-5}"
top -bn1 | sed -n '7,12p'   # others busy? (a figure from a busy machine means little)
PYTHONPATH="$root/python" "$root/.venv/bin/python" - "$root" "$size" "$batch" "$rounds" <<'PY'
import sys, tempfile, torch
root, size, batch, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, root + "/tests/python/models")
import efficientnet, opfuse
torch.set_num_threads(torch.get_num_threads() if torch.get_num_threads() > 1 else 2)
model, inputs, loss = efficientnet.factory(image_size=size, batch_size=batch)
r = opfuse.tune(model, inputs, loss, out=tempfile.mkdtemp(prefix="opfuse-bench-"), rounds=rounds, quiet=True)
print(r.text)
lo, hi = r.speedup_ci
print(f"threads {torch.get_num_threads()}; speedup x{r.speedup:.3f} [{lo:.3f}, {hi:.3f}]; baseline "
      f"{r.baseline['images_per_sec']:.1f} -> tuned {r.tuned['images_per_sec']:.1f} images/s; machine {r.machine}")
PY
