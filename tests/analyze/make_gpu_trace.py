#!python3
"""Writes a synthetic GPU (or MTIA) training trace, for device-time tests and timing.

Steps of host ops, each launching a kernel, a memcpy or a memset through a runtime call with a
correlation id; compute kernels on two streams, NCCL kernels on a third, overlapping them; kernels
shorter than their launch call; a queue that spills past the start of the last step (kept:
launched before it) and kernels launched inside the last step (left out). Deterministic per seed.

--layout mtia writes what Kineto writes on Meta's MTIA as we understand it (no sample at hand):
the device's work as mtia_ccp_events (kernels, copies and fills alike), submitted by mtia_runtime
calls named as HolisticTraceAnalysis expects an MTIA launch, joined by correlation id.

  make_gpu_trace.py OUT.json[.gz] [--layout kineto|kineto-1.8|mtia] [--steps N] [--ops N] [--seed S]
"""
import argparse
import gzip
import json
import random


def write(path, doc):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt") as f:
        json.dump(doc, f, separators=(",", ":"))


def trace(layout, steps, ops_per_step, seed):
    rng = random.Random(seed)
    legacy, mtia = layout == "kineto-1.8", layout == "mtia"
    cat = {
        "op": "Operator" if legacy else "cpu_op",
        "runtime": "Runtime" if legacy else "cuda_runtime",
        "kernel": "Kernel" if legacy else "kernel",
        "memcpy": "Memcpy" if legacy else "gpu_memcpy",
        "memset": "Memset" if legacy else "gpu_memset",
    }
    if mtia:
        cat.update(runtime="mtia_runtime", kernel="mtia_ccp_events", memcpy="mtia_ccp_events", memset="mtia_ccp_events")
    host_pid, host_tid, device = 4242, 4242, 0
    events = []
    t = 1_700_000_000_000.0  # µs
    gpu_free = {}  # stream -> when it is next free
    correlation = 1000
    for step in range(steps):
        step_start = t
        t += 5.0
        for k in range(ops_per_step):
            correlation += 1
            what = rng.random()
            if what < 0.08:
                kind, name, stream, launch = "memcpy", "Memcpy HtoD (Pinned -> Device)", 7, "cudaMemcpyAsync"
            elif what < 0.12:
                kind, name, stream, launch = "memset", "Memset (Device)", 7, "cudaMemsetAsync"
            elif what < 0.2:
                kind, name, stream, launch = "kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 20, "cudaLaunchKernel"
            else:
                kind, stream, launch = "kernel", rng.choice([7, 7, 7, 13]), "cudaLaunchKernel"
                name = rng.choice(["void at::native::vectorized_elementwise_kernel<4, sigmoid>", "ampere_sgemm_128x64_nn",
                                   "void at::native::reduce_kernel<512, 1>", "void at::native::elementwise_kernel<128, 2, mul>"])
            op_start = t
            op_dur = round(rng.uniform(8, 30), 3)
            events.append({"ph": "X", "cat": cat["op"], "name": "aten::op%d" % (k % 7), "pid": host_pid, "tid": host_tid,
                           "ts": op_start, "dur": op_dur, "args": {"External id": correlation}})
            if mtia:
                launch = "runFunction - job_prep_and_submit_for_execution"
            launch_ts = round(op_start + 2.0, 3)
            launch_dur = round(rng.uniform(3, 9), 3)
            events.append({"ph": "X", "cat": cat["runtime"], "name": launch, "pid": host_pid, "tid": host_tid,
                           "ts": launch_ts, "dur": launch_dur, "args": {"correlation": correlation, "external id": correlation}})
            dur = round(rng.choice([rng.uniform(1, 9), rng.uniform(1, 9), rng.uniform(10, 200)]), 3)
            if stream == 20:
                dur = round(rng.uniform(30, 300), 3)
            start = round(max(launch_ts + rng.uniform(4, 20), gpu_free.get(stream, 0) + rng.uniform(0.5, 3)), 3)
            gpu_free[stream] = start + dur
            args = {"correlation": correlation, "device": device, "stream": stream}
            if legacy:
                args["external id"] = correlation
            events.append({"ph": "X", "cat": cat[kind], "name": name, "pid": device,
                           "tid": "stream %d" % stream if legacy else stream, "ts": start, "dur": dur, "args": args})
            if not legacy:
                events.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": correlation, "pid": host_pid, "tid": host_tid, "ts": launch_ts})
                events.append({"ph": "f", "cat": "ac2g", "name": "ac2g", "id": correlation, "pid": device, "tid": stream, "ts": start, "bp": "e"})
            t = op_start + op_dur + rng.uniform(0.5, 40)
        events.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#%d" % (10 + step), "pid": host_pid,
                       "tid": host_tid, "ts": step_start, "dur": round(t - step_start, 3), "args": {}})
        t += 2.0
    rng.shuffle(events)  # file order is no promise of time order
    events.sort(key=lambda e: (e["pid"] != host_pid, e["ts"]))
    return {"schemaVersion": 1, "traceEvents": events}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--layout", choices=["kineto", "kineto-1.8", "mtia"], default="kineto")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--ops", type=int, default=60)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    write(a.out, trace(a.layout, a.steps, a.ops, a.seed))
