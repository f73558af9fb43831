"""opfuse.tune among torch.distributed ranks (DDP over Gloo here; nothing assumes Gloo).

Every rank runs the same loop on its own copy of the model and its own inputs. The loop's
decisions go through `Ranks.gather`: one plan from every rank's findings, a rewrite kept only
where it verified on every rank, a step as long as the slowest rank's, all ranks stopping in the
same round. Each workload is wrapped in DistributedDataParallel only when it first steps, after it
has been rewritten, so every rank's DDP sees the same patched module.
"""
import datetime
import hashlib
import os
import socket
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

# The DistributedDataParallel arguments a user's wrapper is rebuilt with.
DDP_SETTINGS = ("broadcast_buffers", "find_unused_parameters", "gradient_as_bucket_view", "static_graph")


class RankFailed(RuntimeError):
    """A rank has gone or stopped answering; the message names it."""


def active():
    return dist.is_available() and dist.is_initialized()


def init_from_environment(timeout_s):
    """The process group torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT) describes,
    over Gloo, with collectives that give up after timeout_s. False outside torchrun."""
    if dist.is_initialized():
        return True
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return False
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return True


def _alive(pid):
    """Whether the process exists and is not a zombie (a killed child its parent has not reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


class Ranks:
    """This rank and the others, for the loop's collectives; a failure names the rank at fault."""

    def __init__(self, group=None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.host = socket.gethostname()
        self.calls = 0
        self.members = [(self.host, os.getpid())]  # what diagnose knows should this first gather fail
        self.members = [tuple(m) for m in self.gather_objects((self.host, os.getpid()))]

    def gather_objects(self, obj):
        """Every rank's obj, by rank."""
        out = [None] * self.size
        self._collective(lambda: dist.all_gather_object(out, obj, group=self.group))
        return out

    def gather(self, text):
        return [str(t) for t in self.gather_objects(text)]

    def from_first(self, obj):
        """Rank 0's obj on every rank."""
        box = [obj]
        self._collective(lambda: dist.broadcast_object_list(box, src=0, group=self.group))
        return box[0]

    def agree(self, check):
        """Runs check() on every rank; if it raised on any, raises that error on all, naming the rank."""
        error = None
        try:
            check()
        except Exception as e:  # noqa: BLE001 - passed on to every rank, then raised
            error = e
        said = self.gather_objects(None if error is None else (type(error).__name__, str(error)))
        for rank, failure in enumerate(said):
            if failure is not None:
                kind = {"TypeError": TypeError, "FileNotFoundError": FileNotFoundError}.get(failure[0], ValueError)
                raise kind(f"rank {rank}: {failure[1]}") from error

    def sync_model(self, model):
        """Rank 0's parameters and buffers on every rank, as DistributedDataParallel starts."""
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                self._collective(lambda t=t: dist.broadcast(t, src=0, group=self.group))

    def wrap(self, model, settings=None):
        return DistributedDataParallel(model, process_group=self.group, **(settings or {}))

    def check_identical(self, model):
        """Raises unless the model's parameters and buffers have the same bytes on every rank."""
        sums = self.gather(checksum(model))
        differ = [r for r, s in enumerate(sums) if s != sums[0]]
        if differ:
            raise RankFailed(f"the tuned model differs between ranks: rank 0 and rank(s) {differ} have other parameters")
        return sums[0]

    def _collective(self, run):
        self.calls += 1
        self._mark()
        try:
            return run()
        except RuntimeError as e:
            raise RankFailed(self.diagnose(e)) from e

    def _mark(self):
        """How far this rank has come, in the store, so a stalled rank can be told from the rest."""
        try:
            _store().set(f"opfuse/calls/{self.rank}", str(self.calls))
        except Exception:  # noqa: BLE001 - the store is a diagnosis aid; the collective reports failures
            pass

    def diagnose(self, error):
        """One line naming the ranks that have gone (same machine) or fell behind (the store)."""
        cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        gone = self._gone()
        if gone:
            names = ", ".join(f"rank {r} (pid {self.members[r][1]})" for r in gone)
            return f"{names} ended while the ranks tuned together; rank {self.rank} stops too ({cause})"
        behind = self._behind()
        if behind:
            return f"rank(s) {behind} did not reach opfuse's collective #{self.calls}; rank {self.rank} stops ({cause})"
        return f"a rank stopped answering; rank {self.rank} stops ({cause})"

    def _gone(self, wait=2.0):
        """The ranks on this machine whose process has ended. A killed process closes its sockets
        before it becomes a zombie, so the read error that brought us here can come first: they
        are given `wait` seconds to show as ended."""
        deadline = time.monotonic() + wait
        while True:
            gone = [r for r, (host, pid) in enumerate(self.members)
                    if host == self.host and r != self.rank and not _alive(pid)]
            if gone or time.monotonic() >= deadline:
                return gone
            time.sleep(0.05)

    def _behind(self):
        try:
            store = _store()
            return [r for r in range(self.size) if int(store.get(f"opfuse/calls/{r}")) < self.calls]
        except Exception:  # noqa: BLE001 - rank 0, which holds the store, may be the one gone
            return [0] if self.rank != 0 else []


def _store():
    return dist.distributed_c10d._get_default_store()


def checksum(model):
    """sha256 of every parameter's and buffer's bytes, in the module's order."""
    h = hashlib.sha256()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        h.update(name.encode())
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def unwrap(model):
    """The module inside a DistributedDataParallel, with the settings it was wrapped with."""
    if isinstance(model, DistributedDataParallel):
        return model.module, {k: getattr(model, k) for k in DDP_SETTINGS if hasattr(model, k)}
    return model, None
