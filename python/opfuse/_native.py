"""Finds opfuse._C: next to this file in an installed package, else in the source tree's build
folder (``scripts/build.sh`` puts it in ``build/python/opfuse``) or ``$OPFUSE_BUILD_DIR``."""
import importlib
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    if os.environ.get("OPFUSE_BUILD_DIR"):
        yield os.path.join(os.environ["OPFUSE_BUILD_DIR"], "python", "opfuse")
    yield os.path.join(os.path.dirname(os.path.dirname(_HERE)), "build", "python", "opfuse")


def load(package_path):
    """Imports opfuse._C, extending the package's search path to the build folder if needed."""
    import torch  # noqa: F401  (LibTorch's libraries before ours)

    try:
        return importlib.import_module("opfuse._C")
    except ImportError as e:
        # Built here but not loadable (built against another torch, or half rebuilt): say why.
        if _built_in(_HERE):
            raise ImportError(f"{_HERE}: opfuse's compiled core (_C) is there but does not load: {e}") from e
    for folder in _candidates():
        if _built_in(folder):
            package_path.append(folder)
            return importlib.import_module("opfuse._C")
    raise ImportError(
        "opfuse's compiled core (_C) is not built: run scripts/build.sh in the source tree, or "
        "install the package with `pip install --no-build-isolation ./python`")


def _built_in(folder):
    return any(f.startswith("_C.") and f.endswith(".so") for f in _listdir(folder))


def _listdir(folder):
    try:
        return os.listdir(folder)
    except OSError:
        return []
