#!python3
"""opfuse analyze's device time against hta_breakdown_reference.py, an independent reading of
the raw events in HolisticTraceAnalysis' get_temporal_breakdown convention.

On every GPU sample in DATA/traces and on synthetic traces (Kineto 2.x gzipped, the 1.8-era
layout, MTIA's mtia_ccp_events) it runs `opfuse analyze --json` and asserts busy, idle, compute, communication and
memory shares of the window within 1 percentage point of the reference (they should agree to
rounding), the window and busy time per step, per-stream busy time, and the launch statistics.

  check_device_time.py OPFUSE DATA_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOLERANCE_PP = 1.0


def reference(paths):
    out = subprocess.run(["python3", os.path.join(HERE, "hta_breakdown_reference.py")] + paths,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def opfuse_devices(opfuse, path, tmp):
    out = os.path.join(tmp, os.path.basename(path) + ".analysis.json")
    subprocess.run([opfuse, "analyze", path, "--json", out, "--force"], check=True, capture_output=True)
    with open(out) as f:
        a = json.load(f)
    return a


def close(a, b, tol, what):
    assert abs(a - b) <= tol, f"{what}: opfuse {a} vs reference {b}"


def compare(path, got, want):
    devices = got["devices"]
    assert {d["device"] for d in devices} == set(want), (path, [d["device"] for d in devices], list(want))
    if want:
        busiest = max(want, key=lambda k: want[k]["busy_us"])
        assert got["device"]["device"] == busiest, (path, got["device"]["device"], busiest)
    for d in devices:
        w = want[d["device"]]
        steps = d["steps"] if d["per"] == "step" else 1
        assert (d["per"] == "step") == (d["steps"] > 0), d
        pct = lambda us: 100.0 * us / w["window_us"] if w["window_us"] > 0 else 0.0
        close(pct(d["busy_us"] * steps), w["busy_pct"], TOLERANCE_PP, f"{path} busy %")
        for key in ("compute_pct", "communication_pct", "memory_pct", "idle_pct"):
            close(d["breakdown"][key], w["breakdown"][key], TOLERANCE_PP, f"{path} {key}")
        # Same events, same arithmetic: the times themselves agree to float rounding.
        for key in ("window_us", "busy_us", "idle_us"):
            close(d[key] * steps, w[key], 1e-6 * max(1.0, w[key]) + 1e-3, f"{path} {key}")
        assert d["events"] == w["events"], (path, d["events"], w["events"])
        streams = {s["stream"]: s["busy_us"] * steps for s in d["streams"]}
        assert set(streams) == set(w["streams"]), (path, streams, w["streams"])
        for s, busy in w["streams"].items():
            close(streams[s], busy, 1e-3 + 1e-6 * busy, f"{path} stream {s}")
        gl, wl = d["launch"], w["launch"]
        for key in ("kernels", "launched", "shorter_than_launch"):
            assert gl[key] == wl[key], (path, key, gl[key], wl[key])
        for key in ("delay_median_us", "delay_p90_us", "small_kernel_time_pct"):
            close(gl[key], wl[key], 1e-3 + 1e-6 * abs(wl[key]), f"{path} {key}")
    return devices


def main(opfuse, data):
    traces = os.path.join(data, "traces")
    samples = [os.path.join(traces, f) for f in sorted(os.listdir(traces)) if ".json" in f]
    with tempfile.TemporaryDirectory() as tmp:
        made = []
        for layout, name in (("kineto", "synthetic_kineto.json.gz"), ("kineto-1.8", "synthetic_kineto_1_8.json"),
                             ("mtia", "synthetic_mtia.json")):
            path = os.path.join(tmp, name)
            subprocess.run(["python3", os.path.join(HERE, "make_gpu_trace.py"), path, "--layout", layout,
                            "--steps", "5", "--ops", "80"], check=True)
            made.append(path)
        want = reference(samples + made)
        gpu = [p for p in samples + made if want[p]]
        assert len(gpu) >= 7, gpu  # four samples with kernels, three synthetic traces
        for path in samples + made:
            got = opfuse_devices(opfuse, path, tmp)
            if got["trace"]["dialect"].startswith("Ascend"):
                continue  # device tasks, not kernels: the GPU reference does not read them
            if path.endswith("synthetic_mtia.json"):
                assert got["trace"]["backend"] == "mtia", got["trace"]
            devices = compare(path, got, want[path])
            for d in devices:
                b = d["breakdown"]
                print(f"{os.path.basename(path)} device {d['device']}: busy {100 - b['idle_pct']:.2f}% "
                      f"compute {b['compute_pct']:.2f}% comm {b['communication_pct']:.2f}% memory {b['memory_pct']:.2f}% "
                      f"idle {b['idle_pct']:.2f}% (reference idle {want[path][d['device']]['breakdown']['idle_pct']:.2f}%)")
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
