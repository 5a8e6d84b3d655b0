"""examples/k3_latent_moe.py at small shapes: the k3kernels module and the pure-torch module agree (CPU tensors, or
the GPU when there is one). Skipped without torch."""
import os
import sys

import pytest

pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import k3_latent_moe  # noqa: E402


def test_layer_example_small_cpu():
    assert k3_latent_moe.main(["--small", "--device", "cpu"]) == 0
