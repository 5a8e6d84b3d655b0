"""bench/py_overhead.py and bench/py_graph.py in their CPU mode (small shapes, few repeats), run in this process:
they print one JSON object on stdout, and the graph script's C-API-only block gives bitwise the Python layer's
output (the GPU numbers come from the same scripts on the device). Skipped without torch."""
import json
import os
import sys

import pytest

pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import py_graph  # noqa: E402
import py_overhead  # noqa: E402


def run(main, capsys, *args):
    assert main(["--device", "cpu"] + list(args)) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def test_py_overhead_cpu_mode(capsys):
    res, table = run(py_overhead.main, capsys, "--calls", "5", "--reps", "2")
    assert "k3.linear / F.linear" in table and res["device"] == "cpu"
    assert set(res["linear_parts_us"]) == {"public_wrapper_us", "custom_op_layer_us", "checks_allocs_us",
                                           "ctypes_call_us", "bare_ctypes_us"}
    assert all(v > 0 for v in res["times_us"].values()), res["times_us"]


def test_py_graph_cpu_mode(capsys):
    res, _ = run(py_graph.main, capsys, "--m", "1,3", "--reps", "2")
    assert set(res["per_m"]) == {"1", "3"}
    assert all(v["outputs_bitwise_equal"] for v in res["per_m"].values())


def test_py_graph_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        py_graph.main(["--device", "cpu", "--m", "0"])
    assert e.value.code == 2 and "--m values must be in 1..16" in capsys.readouterr().err
