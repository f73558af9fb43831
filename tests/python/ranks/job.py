"""One rank of a distributed tune, for the tests: `factory` for `python3 -m opfuse tune
job.py:factory --nproc 2`, and run as a script (RANK, WORLD_SIZE, MASTER_ADDR/PORT set) a rank
that tunes inside its own process group, optionally killing itself mid-run (DIE_AFTER_STEPS)."""
import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn import functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models"))
import efficientnet  # noqa: E402


def factory():
    """The tiny EfficientNet, the same weights everywhere (DDP broadcasts rank 0's anyway), each
    rank its own shard of images and labels."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    model, (images,), _ = efficientnet.factory(image_size=64, batch_size=4, num_classes=10, seed=0)
    g = torch.Generator().manual_seed(1000 + rank)
    images = torch.randn(images.shape, generator=g)
    labels = torch.randint(10, (images.shape[0],), generator=g)
    return model, (images,), dying(lambda out: F.cross_entropy(out, labels), rank)


def dying(loss_fn, rank):
    """loss_fn, or on DYING_RANK one that kills its process after DIE_AFTER_STEPS calls."""
    die_after = int(os.environ.get("DIE_AFTER_STEPS", "0"))
    if not die_after or rank != int(os.environ.get("DYING_RANK", "1")):
        return loss_fn
    calls = [0]

    def loss_then_die(out):
        calls[0] += 1
        if calls[0] > die_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return loss_fn(out)
    return loss_then_die


def main():
    import opfuse
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("TIMEOUT_S", "60"))))
    torch.set_num_threads(1)
    model, inputs, loss_fn = factory()
    try:
        opfuse.tune(model, inputs, loss_fn, out=sys.argv[1], steps=1, rounds=20, max_rounds=20, warmup=1,
                    profile_steps=1, min_gain=-1, quiet=True, measure_ops=False)
    except opfuse.distributed.RankFailed as e:
        print(f"opfuse: {e}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
