"""The compiled run calls (k3kernels._fastcall) against the ctypes calls they replace: the torch front end's linear,
router and fused_moe give bit-identical results through either (CPU tensors here, CUDA tensors too on a GPU); the
module refuses malformed arguments with TypeError instead of calling the library; the loader's explicit choices
(K3KERNELS_FASTCALL naming a file, or 0) are honoured. Skipped where the module was not built (no Python headers):
then the package runs on ctypes alone, which the rest of the suite covers."""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import k3kernels as k3  # noqa: E402
from k3kernels import _capi as C  # noqa: E402
from k3kernels import _ops as O  # noqa: E402
from k3kernels import _torch as T  # noqa: E402

built = pytest.mark.skipif(O._fastcall is None, reason="k3kernels._fastcall was not built (no Python headers)")
K3_STATUS_INVALID_ARGUMENT = 1  # include/k3.h
devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def test_make_test_uses_the_module_it_built():
    """tests/cli_python.sh names this build's module whenever CMake built one: the suite must then run on it."""
    named = os.environ.get("K3KERNELS_FASTCALL")
    if not named or named == "0":
        pytest.skip("no compiled run calls were named for this run")
    assert O._fastcall is not None and os.path.samefile(O._fastcall[1], named)
    assert "compiled run calls" in k3.info()["binding"]


@pytest.fixture
def ctypes_only(monkeypatch):
    """The torch front end with the compiled calls swapped for the ctypes ones."""
    def use():
        monkeypatch.setattr(T, "_fc", None)
        monkeypatch.setattr(T, "_linear_run", T._linear_run_ctypes)
        monkeypatch.setattr(T, "_router_run", T._router_run_ctypes)
        monkeypatch.setattr(T, "_moe_run", T._moe_run_ctypes)
    return use


def bf16(a, dev):
    return torch.from_numpy(k3.round_bf16(a)).to(torch.bfloat16).to(dev)


@built
@pytest.mark.parametrize("dev", devices)
def test_linear_and_router_bitwise_through_either(dev, ctypes_only):
    rng = np.random.default_rng(11)
    x = bf16(rng.standard_normal((40, 256)).astype(np.float32), dev)  # 40 > 32: the row-chunk loop too
    w = bf16(0.05 * rng.standard_normal((96, 256)).astype(np.float32), dev)
    r = bf16(rng.standard_normal((40, 96)).astype(np.float32), dev)
    g = bf16(0.1 * rng.standard_normal((32, 256)).astype(np.float32), dev)
    b = torch.from_numpy((0.01 * rng.standard_normal(32)).astype(np.float32)).to(dev)
    fast = (k3.linear(x, w), k3.linear(x, w, r), *k3.router(x[:5], g, b, top_k=4))
    ctypes_only()
    slow = (k3.linear(x, w), k3.linear(x, w, r), *k3.router(x[:5], g, b, top_k=4))
    for a, c in zip(fast, slow):
        assert a.dtype == c.dtype and torch.equal(a.cpu(), c.cpu())


@built
@pytest.mark.parametrize("dev", devices)
@pytest.mark.parametrize("quant", ["nvfp4", "mxfp4"])
def test_fused_moe_bitwise_through_either(dev, quant, ctypes_only):
    rng = np.random.default_rng(12)
    e, l, inter, m, k = 8, 128, 64, 3, 2
    w13 = (0.1 * rng.standard_normal((e, 2 * inter, l))).astype(np.float32)
    w2 = (0.1 * rng.standard_normal((e, l, inter))).astype(np.float32)
    q = k3.quantize_nvfp4 if quant == "nvfp4" else k3.quantize_mxfp4
    a13, a2 = q(w13), q(w2)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dev)  # noqa: E731
    x = bf16(rng.standard_normal((m, l)).astype(np.float32), dev)
    ids = t(np.stack([rng.choice(e, k, replace=False) for _ in range(m)]).astype(np.int32))
    wts = t(rng.uniform(0.1, 1.0, (m, k)).astype(np.float32))
    kw = dict(quant=quant, w13_scale=t(a13[1]), w2_scale=t(a2[1]))
    if quant == "nvfp4":
        kw.update(w13_scale_2=t(a13[2]), w2_scale_2=t(a2[2]))
    fast = k3.fused_moe(x, t(a13[0]), t(a2[0]), wts, ids, **kw)
    ctypes_only()
    slow = k3.fused_moe(x, t(a13[0]), t(a2[0]), wts, ids, **kw)
    assert torch.equal(fast.cpu(), slow.cpu()) and fast.abs().sum() > 0


@built
def test_malformed_arguments_are_refused():
    fc = O._fastcall[0]
    fn = ctypes.cast(O._lib.k3_moe_run, ctypes.c_void_p).value
    with pytest.raises(TypeError, match="takes 20 arguments"):
        fc.moe_run(fn, None, 1)
    with pytest.raises(TypeError, match="must be an int"):
        fc.linear_run(fn, None, "1", 0, 0, None, 0, None, 0, None)
    with pytest.raises(TypeError, match="pointer argument"):
        fc.router_run(fn, None, 1, 1.5, 0, None, 0, 0, None, 0, None)
    with pytest.raises(ValueError, match="fn is NULL"):
        fc.linear_run(None, None, 1, 0, 0, None, 0, None, 0, None)
    with pytest.raises(OverflowError):
        fc.linear_run(fn, None, 1 << 70, 0, 0, None, 0, None, 0, None)
    # a well-formed call reaches the library, which answers a NULL plan with its status (no crash)
    assert fc.moe_run(fn, None, 1, *([None] * 15), 0, None) == K3_STATUS_INVALID_ARGUMENT


def run_import(env_value):
    env = dict(os.environ, K3KERNELS_FASTCALL=env_value)
    return subprocess.run([sys.executable, "-c", "import k3kernels; print(k3kernels.info()['binding'])"],
                          env=env, capture_output=True, text=True)


def test_loader_honours_an_explicit_choice(tmp_path):
    off = run_import("0")
    assert off.returncode == 0 and off.stdout.strip() == "ctypes", off.stderr
    missing = run_import(str(tmp_path / "no_such_module.so"))
    assert missing.returncode != 0 and "does not exist" in missing.stderr
    junk = tmp_path / ("_fastcall" + C.importlib.machinery.EXTENSION_SUFFIXES[0])
    junk.write_bytes(b"not a shared object")
    bad = run_import(str(junk))
    assert bad.returncode != 0 and "cannot load the compiled run calls" in bad.stderr
