"""The Python calls give bit for bit what the C API gives for the same inputs, on both backends: the C side is this
build's `k3 run moe` (K3_CLI; a C program over k3_moe_run, k3_router_run and k3_latent_moe_run) on safetensors
files holding the same bytes. The routed experts alone, router + experts, and the latent-MoE block. The CPU backend
runs everywhere; the CUDA one is skipped without a GPU. Skipped without torch or without the k3 binary."""
import os
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import k3kernels as k3  # noqa: E402
import st_io  # noqa: E402

CLI = os.environ.get("K3_CLI", os.path.join(os.path.dirname(__file__), "..", "..", "build", "k3"))
needs_cli = pytest.mark.skipif(not os.access(CLI, os.X_OK), reason="no k3 binary (set K3_CLI)")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                  reason="no CUDA device"))]


def bits(t):
    """BF16 tensor -> its uint16 bits on the host."""
    return t.detach().cpu().contiguous().view(torch.int16).numpy().view(np.uint16)


def st(dtype, t):
    """A safetensors entry from a CPU tensor (BF16 written as its bits)."""
    a = bits(t) if t.dtype == torch.bfloat16 else t.detach().cpu().contiguous().numpy()
    return dtype, tuple(t.shape), a


def run_cli(tmp_path, weights, inputs, device, top_k):
    w, x, y = (str(tmp_path / n) for n in ("w.safetensors", "x.safetensors", "y.safetensors"))
    st_io.write(w, weights)
    st_io.write(x, inputs)
    # the files carry no k3.quant.scale_layout metadata and their scale shapes fit both layouts: say it
    r = subprocess.run([CLI, "run", "moe", "--weights", w, "--input", x, "--output", y, "--device", device,
                        "--top-k", str(top_k), "--scale-layout", "linear"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return st_io.read(y)


def experts(gen, e, l, inter):
    """NVFP4 experts quantized from random weights: (w13, s13, g13, w2, s2, g2) CPU tensors."""
    w13 = 0.1 * torch.randn(e, 2 * inter, l, generator=gen)
    w2 = 0.1 * torch.randn(e, l, inter, generator=gen)
    return k3.quantize_nvfp4(w13) + k3.quantize_nvfp4(w2)


def expert_entries(ex, e, l, inter):
    p13, s13, g13, p2, s2, g2 = ex
    return {"w13_weight": st("U8", p13), "w13_weight_scale": ("F8_E4M3", (e, 2 * inter, l // 16), s13.numpy()),
            "w13_weight_scale_2": st("F32", g13), "w2_weight": st("U8", p2),
            "w2_weight_scale": ("F8_E4M3", (e, l, inter // 16), s2.numpy()), "w2_weight_scale_2": st("F32", g2)}


def on(dev, ts):
    return [t.to(dev) for t in ts]


@needs_cli
@pytest.mark.parametrize("device", DEVICES)
def test_fused_moe_bitwise(tmp_path, device):
    gen = torch.Generator().manual_seed(61)
    e, l, inter, m, k = 8, 128, 64, 5, 2
    ex = experts(gen, e, l, inter)
    x = torch.randn(m, l, generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(m)]).to(torch.int32)
    wts = torch.rand(m, k, generator=gen) + 0.1
    out = run_cli(tmp_path, expert_entries(ex, e, l, inter),
                  {"hidden_states": st("BF16", x), "topk_ids": st("I32", ids), "topk_weights": st("F32", wts)},
                  device, k)
    p13, s13, g13, p2, s2, g2 = on(device, ex)
    y = k3.fused_moe(x.to(device), p13, p2, wts.to(device), ids.to(device), quant="nvfp4", w13_scale=s13,
                     w13_scale_2=g13, w2_scale=s2, w2_scale_2=g2)
    assert np.array_equal(bits(y), out["output"])
    if device == "cpu":  # the numpy front end: the same call
        yn = k3.fused_moe(x.float().numpy(), p13.numpy(), p2.numpy(), wts.numpy(), ids.numpy(), quant="nvfp4",
                          w13_scale=s13.numpy(), w13_scale_2=g13.numpy(), w2_scale=s2.numpy(), w2_scale_2=g2.numpy())
        assert np.array_equal(yn.view(np.uint32) >> 16, out["output"].astype(np.uint32))


@needs_cli
@pytest.mark.parametrize("device", DEVICES)
def test_router_and_experts_bitwise(tmp_path, device):
    gen = torch.Generator().manual_seed(62)
    e, l, inter, m, k = 16, 128, 64, 4, 4
    ex = experts(gen, e, l, inter)
    gate = 0.1 * torch.randn(e, l, generator=gen)
    bias = 0.01 * torch.randn(e, generator=gen)
    x = torch.randn(m, l, generator=gen).to(torch.bfloat16)
    w = expert_entries(ex, e, l, inter)
    w.update({"gate_weight": st("F32", gate), "e_score_correction_bias": st("F32", bias)})
    out = run_cli(tmp_path, w, {"hidden_states": st("BF16", x)}, device, k)
    xd = x.to(device)
    wts, ids = k3.router(xd, gate.to(device), bias.to(device), top_k=k)
    assert np.array_equal(ids.cpu().numpy(), out["topk_ids"]) and np.array_equal(wts.cpu().numpy(),
                                                                                  out["topk_weights"])
    p13, s13, g13, p2, s2, g2 = on(device, ex)
    y = k3.fused_moe(xd, p13, p2, wts, ids, quant="nvfp4", w13_scale=s13, w13_scale_2=g13, w2_scale=s2,
                     w2_scale_2=g2)
    assert np.array_equal(bits(y), out["output"])


def latent_weights(gen, h, l, e, inter, shared):
    r = lambda *shape, s: (s * torch.randn(*shape, generator=gen)).to(torch.bfloat16)  # noqa: E731
    return {"gate": r(e, h, s=h ** -0.5), "bias": 0.01 * torch.randn(e, generator=gen), "down": r(l, h, s=h ** -0.5),
            "norm": (1.0 + 0.1 * torch.randn(l, generator=gen)).to(torch.bfloat16), "up": r(h, l, s=l ** -0.5),
            "sgu": r(2 * shared, h, s=h ** -0.5), "sdn": r(h, shared, s=shared ** -0.5),
            "ex": experts(gen, e, l, inter)}


@needs_cli
@pytest.mark.parametrize("device", DEVICES)
def test_latent_moe_bitwise(tmp_path, device):
    gen = torch.Generator().manual_seed(63)
    h, l, e, inter, k, shared, m = 512, 256, 32, 64, 4, 128, 3
    lw = latent_weights(gen, h, l, e, inter, shared)
    x = (0.5 * torch.randn(m, h, generator=gen)).to(torch.bfloat16)
    w = expert_entries(lw["ex"], e, l, inter)
    w.update({"gate_weight": st("BF16", lw["gate"]), "e_score_correction_bias": st("F32", lw["bias"]),
              "down_proj_weight": st("BF16", lw["down"]), "norm_weight": st("BF16", lw["norm"]),
              "up_proj_weight": st("BF16", lw["up"]), "shared_gate_up_weight": st("BF16", lw["sgu"]),
              "shared_down_weight": st("BF16", lw["sdn"])})
    out = run_cli(tmp_path, w, {"hidden_states": st("BF16", x)}, device, k)
    d = {n: t.to(device) for n, t in lw.items() if n != "ex"}
    p13, s13, g13, p2, s2, g2 = on(device, lw["ex"])
    y, wts, ids = k3.latent_moe(x.to(device), d["gate"], d["down"], p13, p2, d["norm"], d["up"],
                                e_score_correction_bias=d["bias"], shared_gate_up=d["sgu"], shared_down=d["sdn"],
                                top_k=k, quant="nvfp4", w13_scale=s13, w13_scale_2=g13, w2_scale=s2, w2_scale_2=g2)
    assert np.array_equal(ids.cpu().numpy(), out["topk_ids"])
    assert np.array_equal(wts.cpu().numpy(), out["topk_weights"])
    assert np.array_equal(bits(y), out["output"])
