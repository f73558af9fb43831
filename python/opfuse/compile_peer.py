"""torch.compile as the peer of every tune: the baseline and the tuned model, each eager and under
torch.compile, measured in the same interleaved paired rounds (tune's measurement), with the time
each compiled variant took to be ready (its first steps, which compile), each one's memory peak
(a step profiled after the rounds) and compile's reason where it cannot take a model."""
import json
import os
import random
import statistics
import tempfile
import time

import torch

VARIANTS = ("eager", "opfuse", "compile", "opfuse + compile")


def _compiled(workload, warmup):
    """A copy of the workload whose model runs under torch.compile, its first `warmup` steps (where
    compilation happens) timed, or the error compile raised."""
    twin = workload.clone()
    twin.model = torch.compile(twin.model)
    start = time.perf_counter()
    try:
        for _ in range(max(1, warmup)):
            twin.step()
    except Exception as e:  # compile's failure on this model is the finding, not a crash
        return None, None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return twin, time.perf_counter() - start, None


def check_compiles(workload):
    """Raises ValueError with compile's reason where torch.compile cannot train the workload's
    model (one step of a copy), before a tune for compile starts its long work."""
    _, _, error = _compiled(workload, 1)
    if error is not None:
        raise ValueError(f"for_compile: torch.compile cannot train this model: {error}")


def recompiles_allowed():
    """Dynamo's limit on compiles of one function raised for the length of a tune: each variant
    is another module object, and past the limit (8) dynamo would quietly run the rest eager."""
    import torch._dynamo.config as config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    return config.patch(**{name: 256})


def _peak_memory(native, workload):
    """The CPU memory peak (bytes) of one more step of the workload, from opfuse's profile of it
    (with what the model held before), as analyze reads it; None when none was recorded."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "step.trace.json")
        held = workload.held_memory()
        profiler = native.opfuse_recorder()  # no module scopes: hooks would make compile recompile
        profiler.start()
        try:
            workload.step()
        finally:
            profiler.stop()
        profiler.write(path, json.dumps({"memory_before": held}))
        memory = json.loads(native.analyze([path], [], False, 1)["json"])["memory"]
    return next((m["peak_bytes"] for m in memory if m["device"] == "cpu"), None)


def compare(native, baseline, tuned, steps, rounds, warmup, tune_seconds):
    """The four variants measured together: JSON-ready dict and a text table."""
    tuned = tuned if tuned is not None else baseline
    compiled, tuned_compiled = _compiled(baseline, warmup), _compiled(tuned, warmup)
    workloads = [baseline, tuned] + [w for w, _, _ in (compiled, tuned_compiled) if w is not None]
    got = native.interleave(workloads, steps, rounds, warmup)
    measured = iter(got["variants"])
    rows = []
    for name, (workload, ready, error) in zip(VARIANTS, [(baseline, None, None), (tuned, tune_seconds, None),
                                                         compiled, tuned_compiled]):
        row = {"variant": name, "ready_s": ready, "error": error}
        if workload is not None:
            row.update(next(measured))
            row["peak_memory_bytes"] = _peak_memory(native, workload)  # after the rounds: no timed step sees it
        rows.append(row)
    by_name = {r["variant"]: r for r in rows}
    result = {"variants": rows, "rounds": got["rounds"], "threads": torch.get_num_threads(),
              "machine_busy": got["machine_busy"], "machine_warning": got["machine_warning"],
              "opfuse_compile_vs_compile": _paired(by_name, "compile", "opfuse + compile")}
    return result, _table(result)


def _paired(by_name, base, other):
    """other's speed-up over base: the median of the paired rounds' ratios, with a percentile
    bootstrap interval of that median (as tune's ratios)."""
    b, o = by_name[base], by_name[other]
    if "ms" not in b or "ms" not in o:
        return None
    ratios = [x / y for x, y in zip(b["ms_rounds"], o["ms_rounds"])]
    draw = random.Random(0)
    medians = sorted(statistics.median(draw.choices(ratios, k=len(ratios))) for _ in range(2000))
    return {"estimate": statistics.median(ratios), "ci": (medians[50], medians[1949])}


def _table(result):
    lines = [f"torch.compile beside the tune ({result['rounds']} paired rounds, {result['threads']} threads):",
             f"  {'variant':<18} {'ms/step':>9} {'95% interval':>19} {'vs eager':>9} {'interval':>17} {'ready':>9}"
             f" {'peak MB':>9}"]
    for r in result["variants"]:
        if "ms" not in r:
            lines.append(f"  {r['variant']:<18} not measured: {r['error']}")
            continue
        lo, hi = r["ms_ci"]
        slo, shi = r["speedup_vs_first_ci"]
        ready = f"{r['ready_s']:.1f} s" if r["ready_s"] is not None else "-"
        peak = f"{r['peak_memory_bytes'] / 1e6:.1f}" if r.get("peak_memory_bytes") is not None else "-"
        lines.append(f"  {r['variant']:<18} {r['ms']:9.2f} [{lo:8.2f}, {hi:8.2f}] {r['speedup_vs_first']:8.3f}x "
                     f"[{slo:6.3f}, {shi:6.3f}] {ready:>9} {peak:>9}")
    paired = result["opfuse_compile_vs_compile"]
    if paired is not None:
        lines.append(f"  opfuse + compile vs compile alone: {paired['estimate']:.3f}x "
                     f"[{paired['ci'][0]:.3f}, {paired['ci'][1]:.3f}]")
    if result["machine_busy"]:
        lines.append(f"  warning: {result['machine_warning']}")
    return "\n".join(lines)
