"""One OpenMP runtime: a process that imports torch and opfuse (the op library and the package's
compiled core) and runs a multi-threaded opfuse op maps exactly one libgomp, the one pip's torch
ships beside libtorch_cpu (tests/ops/test_openmp.cpp checks the C++ side)."""
import os
import pathlib

import torch

TORCH_LIB = pathlib.Path(torch.__file__).resolve().parent / "lib"


def openmp_runtimes(maps_text):
    """The distinct files named like an OpenMP runtime (GNU, LLVM, Intel) in /proc/PID/maps."""
    names = ("libgomp", "libomp", "libiomp")
    paths = {line.split()[-1] for line in maps_text.splitlines() if len(line.split()) >= 6}
    return {os.path.realpath(p) for p in paths if any(n in os.path.basename(p) for n in names)}


def test_python_process_maps_torchs_libgomp_only(ops_library):
    import opfuse  # noqa: F401  (its compiled core links the op library and the rest of opfuse)
    x = torch.randn(1 << 22)
    with torch.no_grad():
        torch.ops.opfuse.silu(x)  # large enough for at::parallel_for to open a parallel region
    runtimes = openmp_runtimes(pathlib.Path("/proc/self/maps").read_text())
    assert runtimes == {os.path.realpath(TORCH_LIB / "libgomp.so.1")}, runtimes

