"""pip install --no-build-isolation ./python (offline): builds opfuse._C with the project's CMake
build (../build, reused when present) and installs it with libopfuse_ops.so beside the package."""
import glob
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        build = os.environ.get("OPFUSE_BUILD_DIR", os.path.join(ROOT, "build"))
        if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release"])
        subprocess.check_call(["cmake", "--build", build, "--target", "opfuse_python"])
        target = os.path.join(self.build_lib, "opfuse")
        for lib in glob.glob(os.path.join(build, "python", "opfuse", "_C*.so")) + [
                os.path.join(build, "src", "ops", "libopfuse_ops.so")]:
            shutil.copy2(lib, target)  # _C's RPATH includes $ORIGIN, where libopfuse_ops.so now is


setup(
    name="opfuse",
    version="0.1.0",
    description="Find chains of small ops in PyTorch training, replace them with fused ops, verify, measure",
    packages=["opfuse"],
    package_dir={"opfuse": "opfuse"},
    cmdclass={"build_py": BuildWithCMake},
    python_requires=">=3.9",
    zip_safe=False,
)
