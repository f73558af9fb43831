"""pip install ./python: builds opfuse._C against the torch of the interpreter pip runs (any torch
>= 2.7 in your environment; pip install --no-build-isolation so the build sees it) with the
project's CMake build, and installs it with libopfuse_ops.so beside the package.

The build folder is the source tree's build/ when that was configured for this same torch
(scripts/build.sh), else build-python/<torch version>/, configured here."""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def torch_of_this_python():
    try:
        import torch
    except ImportError:
        sys.exit("opfuse: this python has no torch; install torch >= 2.7 first, then "
                 "pip install --no-build-isolation ./python")
    if not torch._C._GLIBCXX_USE_CXX11_ABI:
        sys.exit(f"opfuse: torch {torch.__version__} here was built with the pre-C++11 std::string ABI "
                 "(pip's wheels before 2.7), which opfuse's C++ core cannot link with; install torch >= 2.7")
    return os.path.dirname(os.path.realpath(torch.__file__)), torch.__version__.split("+")[0]


def check_wheel_support():
    """pip builds a wheel through setuptools' bdist_wheel, in setuptools itself only since 70.1
    (before, in the separate `wheel` package); --no-build-isolation installs neither. A venv made
    by Python 3.11's venv module holds setuptools 65."""
    import setuptools
    try:
        import wheel  # noqa: F401
    except ImportError:
        if tuple(int(p) for p in setuptools.__version__.split(".")[:2] if p.isdigit()) < (70, 1):
            sys.exit(f"opfuse: this environment's setuptools {setuptools.__version__} cannot build a wheel "
                     "without the wheel package; run: pip install 'setuptools>=70.1', then "
                     "pip install --no-build-isolation ./python again")


def configured_torch(build):
    """The torch folder a CMake build folder was configured with, or None."""
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as cache:
            for line in cache:
                if line.startswith("OPFUSE_LIB_torch_cpu:"):
                    return os.path.dirname(os.path.dirname(os.path.realpath(line.split("=", 1)[1].strip())))
    except OSError:
        pass
    return None


def build_folder(torch_dir, version):
    if os.environ.get("OPFUSE_BUILD_DIR"):
        return os.environ["OPFUSE_BUILD_DIR"]
    default = os.path.join(ROOT, "build")
    return default if configured_torch(default) == torch_dir else os.path.join(ROOT, "build-python", version)


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        torch_dir, version = torch_of_this_python()
        build = build_folder(torch_dir, version)
        if configured_torch(build) != torch_dir:
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                                   f"-DPython3_EXECUTABLE={sys.executable}", "-DOPFUSE_BUILD_TESTS=OFF"])
        subprocess.check_call(["cmake", "--build", build, "--target", "opfuse_python"])
        target = os.path.join(self.build_lib, "opfuse")
        for lib in glob.glob(os.path.join(build, "python", "opfuse", "_C*.so")) + [
                os.path.join(build, "src", "ops", "libopfuse_ops.so")]:
            shutil.copy2(lib, target)  # _C's RPATH includes $ORIGIN, where libopfuse_ops.so now is


check_wheel_support()
setup(
    name="opfuse",
    version="0.1.0",
    description="Find chains of small ops in PyTorch training, replace them with fused ops, verify, measure",
    packages=find_packages(HERE, include=["opfuse", "opfuse.*"]),
    cmdclass={"build_py": BuildWithCMake},
    python_requires=">=3.9",
    install_requires=["torch>=2.7"],
    zip_safe=False,
)
