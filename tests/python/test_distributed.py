"""opfuse.tune among torch.distributed ranks: real processes over Gloo on this machine."""
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "ranks", "job.py")


def private_tmp(tmp_path):
    """An environment whose temp folder is tmp_path/tmp, to check a run leaves nothing there."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return tmp, dict(os.environ, TMPDIR=str(tmp))


def launcher_leftovers(tmp):
    """What the launcher left in TMPDIR (torchelastic_* by default). Not the launcher's: torch 2.x's
    own compile cache (torchinductor_<user>, kept on purpose between runs), and the folder torch
    2.7's torch.distributed.nn.jit writes its remote-module template into on import and removes at
    exit, which a killed rank never reaches."""
    def torchs(p):
        return p.name.startswith("torchinductor_") or (
            p.is_dir() and [c.name for c in p.iterdir()] == ["_remote_module_non_scriptable.py"])
    return [p for p in tmp.iterdir() if not torchs(p)]


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_ranks_tune_one_model_alike(tmp_path):
    out = tmp_path / "run"
    tmp, env = private_tmp(tmp_path)
    done = subprocess.run([sys.executable, "-m", "opfuse", "tune", f"{JOB}:factory", "--nproc", "2", "--threads", "1",
                           "--out", str(out), "--steps", "1", "--rounds", "2", "--max-rounds", "2", "--warmup", "1",
                           "--profile-steps", "1", "--min-gain", "-1"],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert launcher_leftovers(tmp) == []  # the launcher's folders (torchelastic_* by default) are gone
    report = json.loads((out / "report.json").read_text())
    assert report["ranks"] == 2 and report["batch_size"] == 8  # samples of both ranks
    for side in ("baseline", "tuned"):
        assert len(report[side]["rank_step_ms"]) == 2
        # A step lasts as long as the slowest rank's: no rank's own median exceeds it by much.
        assert report[side]["slowest_rank"] in (0, 1)
        for r in range(2):
            assert (out / f"rank{r}.{side}.trace.json").is_file()
    kept = {r["rule"] for r in report["replacements"] if r["kept"]}
    assert "silu" in kept and "batch_norm_silu" in kept
    assert len(report["model_sha256"]) == 64  # every rank's tuned model had these bytes
    assert "over 2 ranks" in done.stderr and "ranks: each one's own median step time" in done.stderr
    assert not (out / "baseline.trace.json").exists()


def test_a_rank_killed_mid_run_is_named_by_the_others_within_the_timeout(tmp_path):
    env = dict(os.environ, MASTER_ADDR="localhost", MASTER_PORT=str(free_port()), WORLD_SIZE="2",
               TIMEOUT_S="60", DIE_AFTER_STEPS="12", DYING_RANK="1")
    ranks = [subprocess.Popen([sys.executable, JOB, str(tmp_path / "run")], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    start = time.monotonic()
    _, err = ranks[0].communicate(timeout=240)
    took = time.monotonic() - start
    ranks[1].wait(timeout=30)
    assert ranks[1].returncode == -9  # it did die
    assert ranks[0].returncode == 3, err[-3000:]
    assert "rank 1 (pid" in err and "ended" in err, err[-3000:]
    assert took < 60 + 120  # the collective timeout plus the run up to the kill, never a hang


def test_the_launcher_names_a_rank_that_was_killed(tmp_path):
    tmp, env = private_tmp(tmp_path)
    env.update(DIE_AFTER_STEPS="12", DYING_RANK="1")
    done = subprocess.run([sys.executable, "-m", "opfuse", "tune", f"{JOB}:factory", "--nproc", "2", "--threads", "1",
                           "--out", str(tmp_path / "run"), "--steps", "1", "--rounds", "20", "--warmup", "1",
                           "--profile-steps", "1"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 3, done.stderr[-3000:]
    assert "rank 1 (killed by SIGKILL) ended the job" in done.stderr, done.stderr[-3000:]
    assert launcher_leftovers(tmp) == []
