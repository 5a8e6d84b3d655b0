#!/usr/bin/env bash
# `pip install .` as a user runs it, here for the CPU-only package (K3KERNELS_CMAKE_ARGS=-DK3_CUDA=OFF; setup.py
# builds the CUDA package the same way where nvcc is found, which the GPU machine checks): a copy of the source
# tree is installed into a temporary folder, then the README's numpy quick start runs from another folder against
# the installed package (no K3KERNELS_LIB, no PYTHONPATH into the source), with libk3.so inside the package, and
# the compiled run calls too where this build found Python's headers. Skipped (77) without python3 with pip,
# setuptools, wheel and numpy, and in the sanitizer build (the main build runs it).
# usage: bash tests/cli_pip_install.sh path/to/k3
set -u
src=${K3_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
bin=${K3_BINARY_DIR:-$(dirname "$1")}
PY_NEEDS="setuptools, wheel, pip, numpy"
. "$src/tests/lib_python.sh"
tmp=$(mktemp -d) || { echo "FAIL: mktemp"; exit 1; }
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/src" "$tmp/run"
(cd "$src" && tar --exclude=./.git --exclude=./build --exclude='./build-*' --exclude=./scratch -cf - .) |
    tar -xf - -C "$tmp/src" || { echo "FAIL: cannot copy the source tree"; exit 1; }
t0=$(date +%s)
if ! K3KERNELS_BUILD_DIR="$tmp/cmake" K3KERNELS_CMAKE_ARGS="-DK3_CUDA=OFF" "$py" -m pip install --no-build-isolation \
        --no-deps --no-index --target "$tmp/site" "$tmp/src" > "$tmp/pip.log" 2>&1; then
    tail -40 "$tmp/pip.log"
    echo "FAIL: pip install of the source tree"
    exit 1
fi
echo "pip install: $(( $(date +%s) - t0 )) s"
[ -f "$tmp/site/k3kernels/_lib/libk3.so" ] || { echo "FAIL: libk3.so is not inside the installed package"; exit 1; }
want_fast=0
[ -f "$bin/k3_python_ext.txt" ] && want_fast=1  # this build found this python3's headers: setup.py must too
cd "$tmp/run" && env -u K3KERNELS_LIB -u K3KERNELS_FASTCALL PYTHONPATH="$tmp/site" "$py" - "$tmp/site" "$want_fast" <<'PY'
import sys
import numpy as np
import k3kernels
site, want_fast = sys.argv[1], sys.argv[2] == "1"
info = k3kernels.info()
assert k3kernels.__file__.startswith(site), "imported %s, not the installed package" % k3kernels.__file__
assert info["library"].startswith(site), "loaded %s, not the package's libk3.so" % info["library"]
assert "compiled run calls" in info["binding"] or not want_fast, "no compiled run calls: " + info["binding"]
y = k3kernels.linear(np.ones((1, 64), np.float32), np.ones((8, 64), np.float32))  # the README's quick start
assert y.shape == (1, 8) and (y == 64).all(), y
print("installed package OK: %s, binding %s" % (k3kernels.__file__, info["binding"]))
PY
rc=$?
[ $rc -eq 0 ] || { echo "FAIL: the quick start against the installed package"; exit 1; }
echo "PASS"
