"""opfuse.analyze from Python reads each trace as what it is, as the command line does: an Ascend
trace (tests/data/traces/ascend_task_queue.json, the task-queue layout) is an NPU trace whose
findings carry device time and name torch_npu's replacements."""
import os

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
