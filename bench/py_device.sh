#!/usr/bin/env bash
# The Python package on the GPU machine, after a CUDA build in build/ (make): the Python tests (GPU ones included),
# then the two Python benchmarks, each result kept as JSON under the given folder (default bench/out-py).
# usage: bash bench/py_device.sh [OUT_DIR]
set -u
cd "$(dirname "$0")/.."
out=${1:-bench/out-py}
mkdir -p "$out" || { echo "py_device: cannot make $out" >&2; exit 1; }
export K3KERNELS_LIB=$PWD/build/libk3.so K3_CLI=$PWD/build/k3 PYTHONPATH=$PWD/python
[ -f "$K3KERNELS_LIB" ] && [ -x "$K3_CLI" ] || { echo "py_device: build/libk3.so and build/k3 are needed" >&2; exit 1; }
# the build's compiled run calls when it has them (as tests/cli_python.sh names them), else ctypes alone
if [ -f build/k3_python_ext.txt ]; then export K3KERNELS_FASTCALL=$PWD/build/$(cat build/k3_python_ext.txt); else export K3KERNELS_FASTCALL=0; fi
rc=0
python3 -m pytest -q -p no:cacheprovider -rs python/tests 2>&1 | tee "$out/pytest.txt" | tail -40
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
python3 bench/py_overhead.py > "$out/py_overhead.json" || rc=1
python3 bench/py_graph.py > "$out/py_graph.json" || rc=1
echo "py_device: results in $out (exit $rc)" >&2
exit $rc
