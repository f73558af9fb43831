#!python3
"""Device time of a GPU (or MTIA) trace, computed straight from its raw JSON events, for checking opfuse.

Written apart from opfuse's C++ (stdlib only, no shared code) and following the convention of
HolisticTraceAnalysis' get_temporal_breakdown:
  - device events are kernels, memcpys and memsets (ph "X"), and MTIA's mtia_ccp_events;
  - with two or more ProfilerStep# markers, only the device events whose launching runtime call
    (cuda_runtime / cuda_driver / Runtime / mtia_runtime, same args.correlation) starts before the last step
    begins are kept (the last step is usually cut short); otherwise all are kept;
  - window = first kept start .. last kept end; busy = union of the kept intervals over all the
    device's streams; idle = window - busy; compute / communication / memory = the union of the
    computation kernels / nccl and gloo kernels / memcpys and memsets, each as % of the window.
Launch statistics use the kept kernels (not memcpy/memset) whose launch call is in the trace.

Usage: hta_breakdown_reference.py TRACE [TRACE ...]  -> one JSON object per trace, by path.
"""
import gzip
import json
import sys

DEVICE_CATEGORIES = {"kernel", "Kernel", "gpu_memcpy", "gpu_memset", "Memcpy", "Memset", "mtia_ccp_events"}
MEMORY_CATEGORIES = {"gpu_memcpy", "gpu_memset", "Memcpy", "Memset"}
LAUNCH_CATEGORIES = {"cuda_runtime", "cuda_driver", "Runtime", "mtia_runtime"}
SMALL_KERNEL_US = 10.0


def load_events(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def number(v):
    return float(v) if v is not None else 0.0


def union_length(intervals):
    """Total length covered by [start, end) intervals."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def quantile(values, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    xs = sorted(values)
    if not xs:
        return 0.0
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def is_communication(name):
    return name.startswith("nccl") or "gloo:" in name


def breakdown(path):
    events = [e for e in load_events(path) if e.get("ph") == "X"]
    launches = {}
    step_starts, step_names = [], set()
    for e in events:
        cat, name, args = e.get("cat", ""), str(e.get("name", "")), e.get("args") or {}
        if cat in LAUNCH_CATEGORIES and "correlation" in args:
            launches[args["correlation"]] = e
        if name.startswith("ProfilerStep#") and cat != "gpu_user_annotation":
            step_starts.append(number(e["ts"]))
            step_names.add(name)
    filtered = len(step_names) >= 2
    last_step = max(step_starts) if step_starts else None

    devices = {}
    for e in events:
        if e.get("cat") not in DEVICE_CATEGORIES:
            continue
        launch = launches.get((e.get("args") or {}).get("correlation"))
        if filtered and (launch is None or number(launch["ts"]) >= last_step):
            continue
        devices.setdefault(e.get("pid"), []).append((e, launch))

    result = {}
    for device, kept in devices.items():
        spans = [(number(e["ts"]), number(e["ts"]) + number(e.get("dur"))) for e, _ in kept]
        window = max(end for _, end in spans) - min(start for start, _ in spans)
        busy = union_length(spans)

        def union_of(pred):
            return union_length([s for s, (e, _) in zip(spans, kept) if pred(e)])

        def is_kernel(e):
            return e.get("cat") not in MEMORY_CATEGORIES

        compute = union_of(lambda e: is_kernel(e) and not is_communication(e["name"]))
        communication = union_of(lambda e: is_kernel(e) and is_communication(e["name"]))
        memory = union_of(lambda e: not is_kernel(e))
        streams = {}
        for s, (e, _) in zip(spans, kept):
            stream = (e.get("args") or {}).get("stream", e.get("tid"))
            streams.setdefault(str(stream), []).append(s)
        kernels = [(e, l) for e, l in kept if is_kernel(e)]
        launched = [(e, l) for e, l in kernels if l is not None]
        delays = [number(e["ts"]) - number(l["ts"]) for e, l in launched]
        kernel_time = sum(number(e.get("dur")) for e, _ in kernels)
        small_time = sum(number(e.get("dur")) for e, _ in kernels if number(e.get("dur")) < SMALL_KERNEL_US)
        pct = lambda us: 100.0 * us / window if window > 0 else 0.0
        result[str(device)] = {
            "events": len(kept),
            "steps_filtered": filtered,
            "window_us": window,
            "busy_us": busy,
            "idle_us": window - busy,
            "busy_pct": pct(busy),
            "breakdown": {
                "compute_pct": pct(compute),
                "communication_pct": pct(communication),
                "memory_pct": pct(memory),
                "idle_pct": pct(window - busy),
            },
            "streams": {k: union_length(v) for k, v in streams.items()},
            "launch": {
                "kernels": len(kernels),
                "launched": len(launched),
                "delay_median_us": quantile(delays, 0.5),
                "delay_p90_us": quantile(delays, 0.9),
                "shorter_than_launch": sum(1 for e, l in launched if number(e.get("dur")) < number(l.get("dur"))),
                "small_kernel_time_pct": 100.0 * small_time / kernel_time if kernel_time > 0 else 0.0,
            },
        }
    return result


if __name__ == "__main__":
    json.dump({p: breakdown(p) for p in sys.argv[1:]}, sys.stdout, indent=1)
    print()
