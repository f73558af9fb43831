"""opfuse.analyze from Python reads each trace as what it is, as the command line does: an Ascend
trace (tests/data/traces/ascend_task_queue.json, the task-queue layout) is an NPU trace whose
findings carry device time and name torch_npu's replacements. Both faces run one code path, and
give one object for a GPU, an Ascend and a CPU trace."""
import json
import os
import subprocess

import pytest

import opfuse

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "traces")


def test_an_ascend_trace_is_analysed_as_one():
    a = opfuse.analyze(os.path.join(DATA, "ascend_task_queue.json"))
    assert a.trace["backend"] == "npu"
    findings = {f["rule"]: f for f in a.findings}
    assert findings["silu"]["replacement"] == "torch_npu.npu_silu"
    assert findings["silu"]["device_us"] > 0 and findings["silu"]["est_saving_us"] > 0
    assert findings["fused_adam"]["device_us"] > 0
    assert a.roofline is None  # this machine's peaks say nothing of an NPU
    ops = {o["name"]: o for o in a.ops}
    assert ops["aten::mul"]["device_us"] == ops["aclnnMul"]["device_us"] > 0


@pytest.mark.parametrize("trace", ["kineto_rocm_minitoy.json.gz", "ascend_task_queue.json", "kineto_cpu_only.json.gz"])
def test_python_and_the_command_line_give_one_object(trace, tmp_path, monkeypatch):
    # Both read this machine's cached peaks: one cache of their own, so no other run changes it between them.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = os.path.join(DATA, trace)
    cli = os.path.join(os.environ.get("OPFUSE_BUILD_DIR", "build"), "opfuse")
    written = tmp_path / "a.json"
    subprocess.run([cli, "analyze", path, "--json", str(written)], check=True, capture_output=True)
    from_cli = json.loads(written.read_text())
    from_python = opfuse.analyze(path).to_json()
    assert from_python["trace"]["backend"] == {"kineto_rocm_minitoy.json.gz": "cuda", "ascend_task_queue.json": "npu",
                                               "kineto_cpu_only.json.gz": "cpu"}[trace]
    assert from_python == from_cli


def test_a_file_that_is_no_trace_is_refused_naming_it(tmp_path):
    path = tmp_path / "notes.json"
    path.write_text('{"traceEvents": [{"ph": "X", "name": "something", "ts": 0, "dur": 1}]}')
    with pytest.raises(ValueError, match="notes.json: not a trace opfuse recognises"):
        opfuse.analyze(str(path))
