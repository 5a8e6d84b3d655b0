"""Builds libk3 through the project's CMake build (the CUDA backend when nvcc is found, as `make` decides; extra
arguments from K3KERNELS_CMAKE_ARGS, e.g. -DK3_CUDA=OFF) and puts libk3.so inside the package (k3kernels/_lib),
with the compiled run calls (k3kernels/_fastcall*.so) when CMake found this interpreter's headers. The CMake build
folder is build-python in the source tree, or K3KERNELS_BUILD_DIR."""
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        root = os.path.dirname(os.path.abspath(__file__))
        build = os.environ.get("K3KERNELS_BUILD_DIR") or os.path.join(root, "build-python")
        args = shlex.split(os.environ.get("K3KERNELS_CMAKE_ARGS", ""))
        subprocess.check_call(["cmake", "-S", root, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                               "-DPython3_EXECUTABLE=" + sys.executable] + args)
        ext_list = os.path.join(build, "k3_python_ext.txt")
        targets = ["k3"] + (["k3_fastcall"] if os.path.exists(ext_list) else [])
        subprocess.check_call(["cmake", "--build", build, "-j", str(os.cpu_count() or 2), "--target"] + targets)
        lib = os.path.realpath(os.path.join(build, "libk3.so"))
        pkg = os.path.join(self.build_lib, "k3kernels")
        dest = os.path.join(pkg, "_lib")
        os.makedirs(dest, exist_ok=True)
        shutil.copyfile(lib, os.path.join(dest, "libk3.so"))
        if os.path.exists(ext_list):
            with open(ext_list) as f:
                name = f.read().strip()
            shutil.copyfile(os.path.join(build, name), os.path.join(pkg, name))
        else:
            print("k3kernels: Python's headers were not found; the package calls libk3 through ctypes alone")


class BinaryDistribution(Distribution):
    """The wheel carries a shared library: platform-specific."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithCMake}, distclass=BinaryDistribution)
