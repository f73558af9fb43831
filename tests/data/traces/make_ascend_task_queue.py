#!/usr/bin/env python3
"""Writes ascend_task_queue.json: a trace_view.json laid out as torch_npu's profiler writes one
when ops run through its task queue (the default on Ascend), for the analyzer's tests.

The layout, event by event as the profiler's writer makes them (torch_npu/profiler/analysis):
- the framework process ("Python"): torch ops as `cpu_op` slices on the threads that ran them; an
  `Enqueue` slice (category `enqueue`) inside each op that queued work, its flow `enqueue_to_dequeue`
  (category `async_task_queue`, the id is the enqueue's correlation id) starting there;
- the task-queue thread of the same process: a `Dequeue@<name>` slice (category `dequeue`) ending
  that flow, holding the `aclnn*` call as a `cpu_op`;
- `torch_to_npu` flows (category `async_npu`) from the `aclnn*` call to each device task;
- the "CANN" process: `AscendCL@…` API calls on the task-queue thread's id, some with a
  `HostToDevice` flow to their task;
- "Ascend Hardware": the tasks on their streams. One task has no flow at all (the profiler drops
  some), and one task follows an op that queued nothing of its own in its `Enqueue`.
Timestamps are microseconds as decimal strings, as the profiler writes them.

Run: python3 make_ascend_task_queue.py > ascend_task_queue.json (stdlib only; fixed seed, so the
file is the same every run).
"""
import json
import random
import sys

PID = 2873411           # the training process
MAIN, BACKWARD, QUEUE = 2873411, 2873527, 2873530  # its main, autograd and task-queue threads
CANN_PID = (PID << 10) | (2 << 5) | 0
NPU_PID = (PID << 10) | (3 << 5) | 0
STREAM, COMM_STREAM = 2, 5
T0 = 1717400000000000.0  # µs


def us(t):
    return f"{t:.3f}"


class Writer:
    def __init__(self):
        self.events = []
        self.corr = 0
        self.flow = 0
        self.queue_free = T0   # when the task-queue thread is next idle
        self.device_free = T0  # when the stream is next idle
        self.rng = random.Random(20240603)

    def x(self, name, pid, tid, ts, dur, cat=None, args=None):
        e = {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": us(ts), "dur": round(dur, 3)}
        if cat:
            e["cat"] = cat
        e["args"] = args if args is not None else {}
        self.events.append(e)

    def flow_pair(self, name, cat, fid, start, end):
        for ph, (pid, tid, ts) in (("s", start), ("f", end)):
            self.events.append({"ph": ph, "bp": "e", "name": name, "id": fid, "pid": pid, "tid": tid,
                                "ts": us(ts), "cat": cat})

    def queue(self, tid, at, aclnn, device_us, flow="torch_to_npu"):
        """An op's enqueue at `at` on thread `tid`: the dequeue, the aclnn call, its API call and
        its device task. Returns when the enqueue ends."""
        self.corr += 1
        enqueue_dur = 1.2 + self.rng.random() * 0.6
        self.x("Enqueue", PID, tid, at, enqueue_dur, "enqueue", {"correlation_id": self.corr})
        self.events.append({"ph": "s", "bp": "e", "name": "enqueue_to_dequeue", "id": self.corr, "pid": PID,
                            "tid": tid, "ts": us(at), "cat": "async_task_queue"})
        dq = max(at + 3.0, self.queue_free)
        call_at, call_dur = dq + 0.8, 6.0 + self.rng.random() * 3
        dq_dur = call_dur + 1.6
        self.x(f"Dequeue@{aclnn}", PID, QUEUE, dq, dq_dur, "dequeue", {"correlation_id": self.corr})
        self.events.append({"ph": "f", "bp": "e", "name": "enqueue_to_dequeue", "id": self.corr, "pid": PID,
                            "tid": QUEUE, "ts": us(dq), "cat": "async_task_queue"})
        self.x(aclnn, PID, QUEUE, call_at, call_dur, "cpu_op", {"Sequence number": -1, "Fwd thread id": 0})
        api_at = call_at + 1.0
        self.x(f"AscendCL@{aclnn}", CANN_PID, QUEUE, api_at, call_dur - 2.0, None,
               {"Thread Id": QUEUE, "Mode": "ACL_OP", "level": "acl", "id": aclnn})
        self.queue_free = dq + dq_dur + 0.4
        task_at = max(api_at + 12.0, self.device_free + 0.6)
        self.x(f"{aclnn}_{aclnn[5:]}AiCore_{aclnn[5:]}", NPU_PID, STREAM, task_at, device_us, None,
               {"Model Id": 4294967295, "Task Type": "AI_VECTOR_CORE", "Stream Id": STREAM, "Task Id": self.corr,
                "Batch Id": 0, "Subtask Id": 4294967295, "connection_id": self.corr})
        self.device_free = task_at + device_us
        self.flow += 1
        if flow == "torch_to_npu":
            self.flow_pair("torch_to_npu", "async_npu", self.flow, (PID, QUEUE, call_at), (NPU_PID, STREAM, task_at))
        elif flow == "HostToDevice":  # only the API call's flow names this task
            self.flow_pair(f"HostToDevice{self.flow}", "HostToDevice", self.flow, (CANN_PID, QUEUE, api_at),
                           (NPU_PID, STREAM, task_at))
        return at + enqueue_dur

    def op(self, name, tid, at, children=(), launches=None, args=None, pad=1.0):
        """A cpu_op from `at` holding `children` (callables at → end) and, if `launches`, its own
        enqueue: (aclnn name, device µs[, flow kind]). Returns its end."""
        t = at + pad
        for child in children:
            t = child(t) + 0.3
        if launches:
            t = self.queue(tid, t, *launches) + 0.3
        end = t + pad
        a = {"Sequence number": -1, "Fwd thread id": 0}
        a.update(args or {})
        self.x(name, PID, tid, at, end - at, "cpu_op", a)
        return end


def leaf(w, name, aclnn, device_us, tid=MAIN, dims=None, flow="torch_to_npu", seq=None):
    args = {"Input Dims": dims} if dims else {}
    if seq is not None:
        args["Sequence number"] = seq
        args["Fwd thread id"] = 0 if tid == MAIN else 1
    return lambda at: w.op(name, tid, at, launches=(aclnn, device_us, flow), args=args)


def view(w, name, tid=MAIN):
    return lambda at: w.op(name, tid, at, pad=0.4)  # a view queues nothing


def step(w, n, at, blocks, params):
    seq = [n * 1000]

    def s():
        seq[0] += 1
        return seq[0]

    act = [64, 96, 28, 28]
    forward = []
    for b in range(blocks):
        forward.append(lambda t, b=b: w.op("aten::conv2d", MAIN, t, children=[
            lambda t: w.op("aten::convolution", MAIN, t, children=[
                leaf(w, "aten::_convolution", "aclnnConvolution", 38.0, dims=[act, [96, 1, 3, 3]], seq=s())])]))
        # Swish as efficientnet_pytorch spells it: sigmoid, then mul.
        forward.append(leaf(w, "aten::sigmoid", "aclnnSigmoid", 9.0, dims=[act], seq=s()))
        forward.append(leaf(w, "aten::mul", "aclnnMul", 11.0, dims=[act, act], seq=s()))
    forward.append(view(w, "aten::view"))
    forward.append(lambda t: w.op("aten::linear", MAIN, t, children=[
        view(w, "aten::t"), leaf(w, "aten::addmm", "aclnnAddmm", 24.0, dims=[[1000], [64, 1280], [1280, 1000]])]))
    forward.append(lambda t: w.op("aten::cross_entropy_loss", MAIN, t, children=[
        leaf(w, "aten::_log_softmax", "aclnnLogSoftmax", 6.0, dims=[[64, 1000]]),
        leaf(w, "aten::nll_loss_forward", "aclnnNLLLoss", 5.0, dims=[[64, 1000], [64]])]))
    backward = []
    for b in range(blocks):
        backward.append(lambda t: w.op("autograd::engine::evaluate_function: MulBackward0", BACKWARD, t, children=[
            lambda t: w.op("MulBackward0", BACKWARD, t, children=[
                leaf(w, "aten::mul", "aclnnMul", 11.0, BACKWARD, [act, act]),
                leaf(w, "aten::mul", "aclnnMul", 11.0, BACKWARD, [act, act])])]))
        backward.append(lambda t: w.op("autograd::engine::evaluate_function: SigmoidBackward0", BACKWARD, t, children=[
            lambda t: w.op("SigmoidBackward0", BACKWARD, t, children=[
                leaf(w, "aten::sigmoid_backward", "aclnnSigmoidBackward", 12.0, BACKWARD, [act, act])])]))
        backward.append(lambda t: w.op("autograd::engine::evaluate_function: ConvolutionBackward0", BACKWARD, t, children=[
            lambda t: w.op("ConvolutionBackward0", BACKWARD, t, children=[
                leaf(w, "aten::convolution_backward", "aclnnConvolutionBackward", 70.0, BACKWARD,
                     [act, act, [96, 1, 3, 3]])])]))
    adam = []
    for p in range(params):
        shape = [96, 1, 3, 3] if p % 2 == 0 else [96]
        # Adam's single-tensor step, op by op, as torch.optim.Adam(foreach=False) records it.
        for name, aclnn in (("aten::mul_", "aclnnInplaceMuls"), ("aten::add_", "aclnnInplaceAdd"),
                            ("aten::mul_", "aclnnInplaceMuls"), ("aten::addcmul_", "aclnnInplaceAddcmul"),
                            ("aten::sqrt", "aclnnSqrt"), ("aten::div", "aclnnDivs"), ("aten::add_", "aclnnInplaceAdds"),
                            ("aten::addcdiv_", "aclnnInplaceAddcdiv")):
            # One parameter's sqrt is linked only through its API call's HostToDevice flow.
            flow = "HostToDevice" if (p == 1 and name == "aten::sqrt") else "torch_to_npu"
            adam.append(leaf(w, name, aclnn, 2.5, dims=[shape, shape], flow=flow))

    def optimizer(t):
        return w.op("Optimizer.step#Adam.step", MAIN, t, children=adam)

    def body(t):
        for f in forward:
            t = f(t) + 0.3
        # backward runs on the autograd thread; the main thread waits in backward().
        end = t
        for f in backward:
            end = f(end) + 0.3
        t = w.op("aten::zero_", MAIN, end + 2.0, pad=0.5)
        return optimizer(t + 1.0)

    return w.op(f"ProfilerStep#{n}", MAIN, at, children=[body], pad=2.0)


def main():
    w = Writer()
    t = T0
    for n in (1, 2, 3):
        t = step(w, n, t, blocks=12, params=6) + 5.0
        if n == 2:  # a task no flow reaches (the profiler drops some), on the same stream
            w.x("aclnnCast_CastAiCore_Cast", NPU_PID, STREAM, w.device_free + 3.0, 1.0, None,
                {"Model Id": 4294967295, "Task Type": "AI_VECTOR_CORE", "Stream Id": STREAM, "Task Id": 99999,
                 "Batch Id": 0, "Subtask Id": 4294967295})
            w.device_free += 4.0
        t = max(t, w.device_free)  # the step syncs on the device (loss.item())
    meta = [
        {"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": "Python"}},
        {"ph": "M", "name": "process_labels", "pid": PID, "tid": 0, "args": {"labels": "CPU"}},
        {"ph": "M", "name": "process_sort_index", "pid": PID, "tid": 0, "args": {"sort_index": 0}},
        {"ph": "M", "name": "process_name", "pid": CANN_PID, "tid": 0, "args": {"name": "CANN"}},
        {"ph": "M", "name": "process_sort_index", "pid": CANN_PID, "tid": 0, "args": {"sort_index": 2}},
        {"ph": "M", "name": "process_name", "pid": NPU_PID, "tid": 0, "args": {"name": "Ascend Hardware"}},
        {"ph": "M", "name": "process_labels", "pid": NPU_PID, "tid": 0, "args": {"labels": "NPU"}},
        {"ph": "M", "name": "process_sort_index", "pid": NPU_PID, "tid": 0, "args": {"sort_index": 3}},
        {"ph": "M", "name": "thread_name", "pid": NPU_PID, "tid": STREAM, "args": {"name": f"Stream {STREAM}"}},
    ]
    for tid, queue in ((MAIN, False), (BACKWARD, False), (QUEUE, True)):
        meta.append({"ph": "M", "name": "thread_name", "pid": PID, "tid": tid, "args": {"name": f"Thread {tid}"}})
        meta.append({"ph": "M", "name": "thread_sort_index", "pid": PID, "tid": tid,
                     "args": {"sort_index": max(MAIN, BACKWARD, QUEUE) + 1 if queue else tid}})
    json.dump(meta + w.events, sys.stdout, indent=None, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
