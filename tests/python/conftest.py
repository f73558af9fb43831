"""What the Python tests share: the op library, from OPFUSE_OPS_LIBRARY (set by CTest) or the
default build folder, loaded by the `ops_library` fixture."""
import os
import pathlib

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIBRARY = os.environ.get("OPFUSE_OPS_LIBRARY", str(ROOT / "build" / "src" / "ops" / "libopfuse_ops.so"))


@pytest.fixture(scope="module")
def ops_library():
    if not os.path.exists(LIBRARY):
        pytest.fail(f"{LIBRARY}: not built (run scripts/build.sh first)")
    torch.ops.load_library(LIBRARY)
    return LIBRARY
