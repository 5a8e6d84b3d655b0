#!/usr/bin/env bash
# The Python package (python/k3kernels) over this build's libk3.so: the tests of python/tests (pytest): numpy, torch
# (skipped inside pytest without torch), the GPU set (skipped without a CUDA device), the bitwise checks against
# this build's `k3 run moe` (K3_CLI). Skipped (77) without python3, numpy or pytest, and in the sanitizer build (an
# ASan libk3 cannot be loaded into a python that was not started with the ASan runtime). The compiled run calls
# (k3kernels._fastcall) of this build are used when CMake built them for this python3, ctypes alone otherwise.
# usage: bash tests/cli_python.sh path/to/k3
set -u
src=${K3_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
bin=${K3_BINARY_DIR:-$(dirname "$1")}
PY_NEEDS="numpy, pytest"
. "$src/tests/lib_python.sh"
lib="$bin/libk3.so"
[ -f "$lib" ] || { echo "FAIL: $lib not built"; exit 1; }
cli=${1:-$bin/k3}
# the compiled run calls of this build, when CMake built them for this python3 (named explicitly: a module that
# does not load fails the tests instead of falling back to ctypes unseen)
fast=
if [ -f "$bin/k3_python_ext.txt" ]; then
    fast="$bin/$(cat "$bin/k3_python_ext.txt")"
    "$py" -c 'import importlib.machinery as m, sys; sys.exit(not any(sys.argv[1].endswith(s) for s in m.EXTENSION_SUFFIXES))' "$fast" ||
        { echo "FAIL: $fast was built for another python than $py"; exit 1; }
fi
cd "$src" && K3KERNELS_LIB="$lib" K3KERNELS_FASTCALL="${fast:-0}" K3_CLI="$cli" PYTHONPATH="$src/python" "$py" -m pytest -q -p no:cacheprovider -rs \
    python/tests
