"""Builds libk3 through the project's CMake build (the CUDA backend when nvcc is found, as `make` decides; extra
arguments from K3KERNELS_CMAKE_ARGS, e.g. -DK3_CUDA=OFF) and puts libk3.so inside the package (k3kernels/_lib)."""
import os
import shlex
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        root = os.path.dirname(os.path.abspath(__file__))
        build = os.path.join(root, "build-python")
        args = shlex.split(os.environ.get("K3KERNELS_CMAKE_ARGS", ""))
        subprocess.check_call(["cmake", "-S", root, "-B", build, "-DCMAKE_BUILD_TYPE=Release"] + args)
        subprocess.check_call(["cmake", "--build", build, "--target", "k3", "-j", str(os.cpu_count() or 2)])
        lib = os.path.realpath(os.path.join(build, "libk3.so"))
        dest = os.path.join(self.build_lib, "k3kernels", "_lib")
        os.makedirs(dest, exist_ok=True)
        shutil.copyfile(lib, os.path.join(dest, "libk3.so"))


class BinaryDistribution(Distribution):
    """The wheel carries a shared library: platform-specific."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithCMake}, distclass=BinaryDistribution)
