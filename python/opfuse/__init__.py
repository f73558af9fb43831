"""opfuse for Python models: profile a training step, find chains of small ops, replace them with
fused ops, prove forward and backward unchanged, and measure the gain — on the model object you
already have, with your inputs, loss and optimizer.

    result = opfuse.tune(model, (images,), lambda out: F.cross_entropy(out, labels))
    model = result.model          # a patched copy; `model` itself is left as it was

The loop, the analysis and the profiler are opfuse's C++ core (opfuse._C), the same code the
`opfuse` command runs.
"""
import contextlib
import json
import os
import sys
import time

import torch

from . import _native

_C = _native.load(__path__)

from . import compile_peer, distributed, functional, nn, optim, rewrite  # noqa: E402
from .torch_profiler import make as _make_torch_profiler  # noqa: E402
from .workload import make as _make_workload  # noqa: E402

__all__ = ["tune", "patch", "profile", "analyze", "environment", "TuneResult", "Analysis", "functional", "nn", "optim"]
__version__ = "0.1.0"

PythonWorkload = _make_workload(_C)
TorchProfiler = _make_torch_profiler(_C)
PROFILERS = {"opfuse": None, "torch": TorchProfiler}  # what records a profile: None, opfuse's own

RUN_FILES = ("report.json", "report.html", "baseline.trace.json", "tuned.trace.json")


class _Record:
    """A JSON object with its keys as attributes."""

    def __init__(self, data):
        self._data = data
        for k, v in data.items():
            setattr(self, k, v)

    def to_json(self):
        return self._data

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._data.items() if not isinstance(v, (list, dict)))})"


class Replacement(_Record):
    """rule, rewrite, places, verified, max_rel_error, gain, gain_ci, rounds, decision, kept, why
    (and the verdict's details)."""


class TuneResult:
    """What opfuse.tune did. `.model` is a patched copy of the model given (that one is never
    changed), or that copy unpatched when nothing was kept; `.optimizer` is the optimizer factory
    to train it with: the one given, or one building opfuse.optim's fused class in place of
    torch.optim's when that replacement was kept."""

    def __init__(self, report, model, text, not_traced, optimizer):
        self._report = report
        self.model = model
        self.optimizer = optimizer
        self.text = text
        self.speedup = report["speedup"]
        self.speedup_ci = report["speedup_ci"]
        self.machine = report["machine"]
        self.environment = report["environment"]
        self.replacements = [Replacement(r) for r in report["replacements"]]
        self.not_applied = [r for r in report["rejected"] if r["rewrite"] is None]
        self.not_traced = dict(not_traced)
        self.baseline = report["baseline"]
        self.tuned = report["tuned"]

    def to_json(self):
        """The same object as the CLI's report.json."""
        return self._report

    def __str__(self):
        return self.text

    def __repr__(self):
        kept = [r.rule for r in self.replacements if r.kept]
        return f"TuneResult(speedup={self.speedup:.3f}, kept={kept})"


class Analysis(_Record):
    """The C++ analysis of a trace: .trace (summary), .ops, .findings, .memory, .diff; str() is the table."""

    def __init__(self, data, text, html):
        super().__init__(data)
        self.text, self.html = text, html

    def __str__(self):
        return self.text


# ---- checks that run before any long work ---------------------------------------------------

def _as_inputs(inputs):
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if not isinstance(inputs, (tuple, list)):
        raise TypeError(f"inputs must be the tuple of model(...)'s positional arguments, not {type(inputs).__name__}")
    return tuple(inputs)


def _copy_of(model):
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    try:
        return rewrite.copy_model(model)
    except Exception as e:
        raise TypeError(f"opfuse works on a copy of the model, and {type(model).__name__} cannot be deep-copied: {e}") from e


def _check_runs(model, inputs, loss_fn):
    """One forward (and the loss) on a throwaway copy, so a mismatch is named before long work."""
    trial = rewrite.copy_model(model)
    trial.train()
    try:
        out = trial(*inputs)
    except Exception as e:
        raise ValueError(f"model(*inputs) failed, so opfuse cannot run it: {type(e).__name__}: {e}") from e
    if loss_fn is None:
        return
    try:
        loss = loss_fn(out)
    except Exception as e:
        raise ValueError(f"loss_fn(output) failed: {type(e).__name__}: {e}") from e
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        what = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"loss_fn(output) must return a scalar floating tensor, not {what}")
    if not loss.requires_grad:
        raise ValueError("loss_fn(output) does not depend on the model's parameters (no gradient flows)")


def _rules(rules, with_defaults=True):
    files = [rules] if isinstance(rules, str) else list(rules or [])
    for f in files:
        if not os.path.isfile(f):
            raise FileNotFoundError(f"{f}: no such rule file")
    return _C.rule_set(files, with_defaults)


def _out_folder(out, force):
    """out itself, or its first free numbered sibling when it holds an earlier run (unless force)."""
    folder, n = out, 2
    while not force and any(os.path.exists(os.path.join(folder, f)) for f in RUN_FILES):
        folder, n = f"{out}-{n}", n + 1
    os.makedirs(folder, exist_ok=True)
    return folder


class _Progress:
    """Stage lines and a progress bar on stderr; the bar only on a terminal."""

    def __init__(self, quiet):
        self.quiet, self.tty = quiet, sys.stderr.isatty()

    def stage(self, what):
        if not self.quiet:
            print(f"opfuse: {what}", file=sys.stderr, flush=True)

    def progress(self, done, total):
        if self.quiet or not self.tty:
            return
        width = 30
        filled = width * done // max(total, 1)
        end = "\n" if done >= total else ""
        print(f"\r  [{'#' * filled}{'.' * (width - filled)}] {done}/{total}", end=end, file=sys.stderr, flush=True)


# ---- the API ----------------------------------------------------------------------------------

def environment():
    """What measured figures depend on, as torch runs in this process: {"blas", "reference_blas",
    "threads", "cores", "cpu_capability", "torch", "warnings"}. A reference BLAS (matmuls ~40x
    slower than OpenBLAS) or fewer threads than cores are named in "warnings" with the fix."""
    return json.loads(_C.environment())


def tune(model, inputs, loss_fn, optimizer=None, *, rules=None, no_default_rules=False, out=None, force=False,
         min_gain=0.02, steps=3, rounds=5, max_rounds=20, keep_inconclusive=False, warmup=2, profile_steps=2, seed=0,
         threads=0, measure_ops=True, quiet=False, group=None, compare_compile=False, for_compile=False,
         profiler="opfuse"):
    """Profiles training steps of `model`, finds the chains the rules name, replaces each on a copy
    with a fused op, verifies outputs and every gradient (float64 and float32), measures baseline
    and rewrites alternating in paired rounds, and keeps what verified and whose gain's 95%
    interval lies at or above `min_gain` (more rounds, up to `max_rounds`, while it straddles it;
    still unclear: not kept unless keep_inconclusive). A reference BLAS or other processes busy
    while measuring are reported as RuntimeWarnings and in the result's "environment"/"machine".

    inputs:    the tuple of model(...)'s positional arguments (any number, any dtype)
    loss_fn:   output -> scalar loss (a closure over the target)
    optimizer: params -> torch.optim.Optimizer (default SGD, lr 0.01, momentum 0.9)
    out:       folder for report.json, report.html and both traces (a numbered sibling when it
               holds an earlier run, unless force); default: a temporary folder
    threads:   intra-op threads (0: as torch is set)
    group:     inside an initialised torch.distributed process group (e.g. under torchrun) every
               rank calls tune with its own inputs; the ranks (of `group`, default the world)
               profile, verify and measure together and take the same decisions: one plan from
               every rank's findings, a rewrite kept only if it verified on every rank, a step as
               long as the slowest rank's, samples counted over all ranks. Traces are
               rank{r}.baseline.trace.json; rank 0 writes the report. `model` may be a
               DistributedDataParallel: its module is tuned and the result rewrapped alike.
    compare_compile: also measure the baseline and the tuned model under torch.compile, all four in
               the same paired rounds (as many as tune's own measurement took), with each compiled
               variant's time to be ready (report.json's "compile", a table in the text and the page)
    for_compile: for a model that will train under torch.compile: every variant's timed steps run
               compiled (profiles and verification stay eager), so a rewrite is kept only where it
               pays under compile; refused at once where compile cannot take the model
    profiler:  what records the profiles: "opfuse" (its own, compact) or "torch" (torch.profiler)
    """
    recorder = _recorder(profiler)
    for name, value in (("steps", steps), ("rounds", rounds), ("profile_steps", profile_steps)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1")
    if max_rounds and max_rounds < rounds:
        raise ValueError(f"max_rounds {max_rounds} is below rounds {rounds} (0 runs `rounds` only)")
    ranks = distributed.Ranks(group) if group is not None or distributed.active() else None
    model, ddp_settings = distributed.unwrap(model)
    inputs = _as_inputs(inputs)
    prepared = {}

    def prepare():
        prepared["model"] = _copy_of(model)
        _check_runs(prepared["model"], inputs, loss_fn)
        prepared["rules"] = _rules(rules, not no_default_rules)

    if ranks is None:
        prepare()
    else:
        ranks.agree(prepare)  # a bad input on one rank stops every rank, naming it
        ranks.sync_model(prepared["model"])
        quiet = quiet or ranks.rank != 0
    rule_list = prepared["rules"]
    folder = _run_folder(out, force, ranks)
    report = _Progress(quiet)
    pristine = PythonWorkload(prepared["model"], inputs, loss_fn, optimizer, rule_list, ranks=ranks,
                              ddp_settings=ddp_settings)
    if ranks is not None:
        pristine.samples = sum(int(n) for n in ranks.gather(str(pristine.samples)))
    options = dict(out_dir=folder, steps=steps, rounds=rounds, max_rounds=max_rounds, warmup=warmup,
                   profile_steps=profile_steps, min_gain=min_gain, keep_inconclusive=keep_inconclusive, seed=seed,
                   threads=threads, measure_ops=measure_ops, recorder=recorder)
    if (compare_compile or for_compile) and ranks is not None:
        raise ValueError("compare_compile and for_compile measure one process; run them without torch.distributed")
    if for_compile:
        compile_peer.check_compiles(pristine)
        pristine.compiled = True
    started = time.perf_counter()
    try:
        with compile_peer.recompiles_allowed() if for_compile else contextlib.nullcontext():
            got = _C.tune(pristine, rule_list, options, report.stage, report.progress)
    except distributed.RankFailed:
        raise
    except RuntimeError as e:
        if ranks is None:
            raise
        raise distributed.RankFailed(ranks.diagnose(e)) from e  # a DDP step failed: a rank has gone
    tune_seconds = time.perf_counter() - started
    data = json.loads(got["json"])
    data["where"] = "python"
    data["measured_under"] = "torch.compile" if for_compile else "eager"
    peer_text = ""
    if compare_compile:
        report.stage("measuring eager, opfuse, torch.compile and opfuse + torch.compile together")
        # as many rounds as tune's own measurement took to settle: 5 rounds' interval is coarse
        peer_rounds = max([rounds] + [r["rounds"] for r in data["replacements"] if r.get("measured")])
        data["compile"], peer_text = compile_peer.compare(_C, pristine, got["tuned"], steps, peer_rounds, warmup,
                                                          tune_seconds)
    data["not_traced"] = pristine.not_traced
    tuned = got["tuned"]
    tuned_model = tuned.model if tuned is not None else pristine.model
    tuned_optimizer = (tuned if tuned is not None else pristine).optimizer_factory
    if ranks is not None:
        data["model_sha256"] = ranks.check_identical(tuned_model)
    if ranks is None or ranks.rank == 0:
        _write(os.path.join(folder, "report.json"), json.dumps(data, indent=2))
        _write(os.path.join(folder, "report.html"), _page_html(got["page"], data))
    if ddp_settings is not None:
        tuned_model = ranks.wrap(tuned_model, ddp_settings)
    under = ("every variant's timed steps ran under torch.compile (for_compile); the analysis and its estimates "
             "are of eager steps\n" if for_compile else "")
    text = got["analysis_text"] + under + got["text"] + ("\n" + peer_text if peer_text else "")
    result = TuneResult(data, tuned_model, text, pristine.not_traced, tuned_optimizer)
    result.out = folder
    if not quiet:
        print(result.text + f"\nwrote {folder}/report.json, report.html and the traces", file=sys.stderr)
    return result


def _page_html(page_json, data):
    """tune's page, with what Python measured beside the loop (compile's four variants)."""
    page = json.loads(page_json)
    page["tune"]["measured_under"] = data["measured_under"]
    if "compile" in data:
        page["tune"]["compile"] = data["compile"]
    return _C.page_html(json.dumps(page))


def _run_folder(out, force, ranks):
    """The folder for this run; among ranks, the one rank 0 chose."""
    if ranks is not None and ranks.rank != 0:
        folder = ranks.from_first(None)
        os.makedirs(folder, exist_ok=True)  # ranks on other machines write their traces there too
        return folder
    if out is None:
        import tempfile
        folder = tempfile.mkdtemp(prefix="opfuse-")
    else:
        folder = _out_folder(out, force)
    return ranks.from_first(folder) if ranks is not None else folder


def _write(path, text):
    """Into the folder _out_folder chose: free of an earlier run, or force was given."""
    with open(path, "w") as f:
        f.write(text)


def patch(model, inputs, loss_fn=None, rules=None, only=None):
    """Applies to `model` itself, one after another, every rewrite whose result still verifies on
    these inputs (outputs and, with a loss_fn, every gradient, in float64 and in float32 as tune
    verifies), without measuring: tune's patch, from C++. only: the rule names to apply (say, those
    a tune kept); default all. Returns [(rule, places)] of what was replaced; a rewrite that fails
    verification leaves the model as it was. The model's parameters stay the same objects, so an
    optimizer made for it trains on."""
    inputs = _as_inputs(inputs)
    _copy_of(model)
    _check_runs(model, inputs, loss_fn)
    # The model's own rewrites: its optimizer is the caller's, not a factory opfuse may swap.
    rule_list = [r for r in _rules(rules) if (only is None or r.name in only) and (r.python_module or r.python_fx)]
    loss = loss_fn if loss_fn is not None else _sum_of_outputs
    work = PythonWorkload(model, inputs, loss, None, rule_list)
    return [(r["rule"], r["places"]) for r in _C.patch(work, rule_list, _VERIFY_SEED) if r["kept"]]


_VERIFY_SEED = 11


def _sum_of_outputs(out):
    from .workload import flatten_tensors
    return sum(t.float().sum() for t in flatten_tensors(out) if t.is_floating_point())


def profile(model, inputs, loss_fn, steps=2, path="opfuse.trace.json", optimizer=None, warmup=3, force=False,
            profiler="opfuse"):
    """Writes a Kineto-layout Chrome trace of `steps` training steps of a copy of the model, with
    module scopes named by the module tree (`features.3.block.1`), so analyze names the module of
    forward and backward findings: tune's profiling loop, from C++. The warm-up steps after the
    first give the step's unprofiled time, so analyze can leave what profiling adds out of its
    savings. profiler: "opfuse" (its own RecordFunction profiler: compact records) or "torch"
    (torch.profiler, Kineto's own trace with shapes and allocations). Returns the path."""
    recorder = _recorder(profiler)
    if steps < 1 or warmup < 0:
        raise ValueError(f"profile needs steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    inputs = _as_inputs(inputs)
    _C.check_output_path(path, force)
    work = PythonWorkload(_copy_of(model), inputs, loss_fn, optimizer, [], calls={})
    _check_runs(work.model, inputs, loss_fn)
    _C.profile(work, path, steps, warmup, recorder)
    return path


def _recorder(profiler):
    """What makes the Recorder of each profile (None: opfuse's own profiler)."""
    if profiler not in PROFILERS:
        raise ValueError(f"profiler must be 'opfuse' or 'torch', got {profiler!r}")
    return PROFILERS[profiler]


def analyze(path_or_paths, rules=None, no_default_rules=False, measure=False, top=15, backend="auto", steps=0):
    """The C++ analysis of one trace (or two, with their diff) as an Analysis: the same code, and
    the same object, as `opfuse analyze PATH --json`. backend: "auto" (what the trace shows),
    "cpu", "cuda", "npu" or "mtia"; steps: the training steps a trace without ProfilerStep
    markers holds (as --steps)."""
    paths = [path_or_paths] if isinstance(path_or_paths, (str, os.PathLike)) else list(path_or_paths)
    paths = [os.fspath(p) for p in paths]
    for p in paths:
        if not os.path.isfile(p):
            raise FileNotFoundError(f"{p}: no such trace")
    if backend not in ("auto", "cpu", "cuda", "npu", "mtia"):
        raise ValueError(f"backend must be auto, cpu, cuda, npu or mtia, not {backend!r}")
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a whole number of steps (0: not known), not {steps!r}")
    got = _C.analyze(paths, _rules(rules, not no_default_rules), measure, top, backend, steps)
    return Analysis(json.loads(got["json"]), got["text"], got["html"])
