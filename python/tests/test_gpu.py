"""Every k3kernels function on CUDA tensors (run by the coordinator on the GPU machine; skipped here), against the
fp64 references of k3refs.py. The same reference checks also run on CPU tensors, so that the references themselves
are exercised everywhere. The GPU-only part: a non-default current stream is honoured (the work is ordered after
what the stream already holds; nothing goes to the legacy stream, which capture in global mode would refuse),
CUDA-graph capture and replay with different routing, torch.compile(fullgraph=True) of the layer module, and
torch.cuda memory flat across calls. The bitwise comparison with the C API is test_c_api_bitwise.py."""
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import k3kernels as k3  # noqa: E402
from k3refs import (b64, kda_ref, latent_ref, moe_ref, nvfp4_dense, rel_l2, router_ref)  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=cuda)]


def f64(t):
    return t.detach().cpu().to(torch.float64).numpy()


def close_bf16(got, ref, floor):
    """One BF16 step (2^-8 relative, twice for a different fp32 summation order) above an absolute floor."""
    got = f64(got)
    return bool(np.all(np.abs(got - ref) <= 2.0 ** -7 * np.maximum(np.abs(ref), floor)))


def experts(gen, e, l, inter):
    w13 = 0.1 * torch.randn(e, 2 * inter, l, generator=gen)
    w2 = 0.1 * torch.randn(e, l, inter, generator=gen)
    return k3.quantize_nvfp4(w13) + k3.quantize_nvfp4(w2)


def moe_kwargs(ex, dev):
    p13, s13, g13, p2, s2, g2 = (t.to(dev) for t in ex)
    return (p13, p2), dict(quant="nvfp4", w13_scale=s13, w13_scale_2=g13, w2_scale=s2, w2_scale_2=g2)


# ---------------------------------------------------------------- every function against fp64
@pytest.mark.parametrize("device", DEVICES)
def test_linear_against_fp64(device):
    gen = torch.Generator().manual_seed(71)
    for m in (1, 5, 40):
        x = torch.randn(m, 512, generator=gen).to(torch.bfloat16)
        w = (0.05 * torch.randn(256, 512, generator=gen)).to(torch.bfloat16)
        r = torch.randn(m, 256, generator=gen).to(torch.bfloat16)
        y = k3.linear(x.to(device), w.to(device), residual=r.to(device))
        assert y.device.type == device and close_bf16(y, f64(x) @ f64(w).T + f64(r), 1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_router_against_fp64(device):
    gen = torch.Generator().manual_seed(72)
    x = torch.randn(6, 256, generator=gen).to(torch.bfloat16)
    g = 0.1 * torch.randn(64, 256, generator=gen)
    b = 0.01 * torch.randn(64, generator=gen)
    wts, ids = k3.router(x.to(device), g.to(device), b.to(device), top_k=8)
    rw, rids = router_ref(f64(x), f64(g), f64(b), 8)
    assert np.array_equal(ids.cpu().numpy(), rids) and np.allclose(wts.cpu().numpy(), rw, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_moe_against_fp64(device):
    gen = torch.Generator().manual_seed(73)
    e, l, inter, m, k = 8, 128, 64, 4, 2
    ex = experts(gen, e, l, inter)
    x = torch.randn(m, l, generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(m)]).to(torch.int32)
    wts = torch.rand(m, k, generator=gen) + 0.1
    (p13, p2), kw = moe_kwargs(ex, device)
    y = k3.fused_moe(x.to(device), p13, p2, wts.to(device), ids.to(device), **kw)
    ref = moe_ref(f64(x), nvfp4_dense(*ex[:3]), nvfp4_dense(*ex[3:]), wts.double().numpy(), ids.numpy())
    assert y.dtype == torch.bfloat16 and rel_l2(f64(y), ref) <= 1e-2


def latent_setup(gen, h=512, l=256, e=32, inter=64, shared=128):
    r = lambda *shape, s: (s * torch.randn(*shape, generator=gen)).to(torch.bfloat16)  # noqa: E731
    return {"gate": r(e, h, s=h ** -0.5), "bias": 0.01 * torch.randn(e, generator=gen), "down": r(l, h, s=h ** -0.5),
            "norm": (1.0 + 0.1 * torch.randn(l, generator=gen)).to(torch.bfloat16), "up": r(h, l, s=l ** -0.5),
            "sgu": r(2 * shared, h, s=h ** -0.5), "sdn": r(h, shared, s=shared ** -0.5)}, experts(gen, e, l, inter)


def latent_call(w, ex, x, top_k=4):
    dev = x.device
    d = {n: t.to(dev) for n, t in w.items()}
    (p13, p2), kw = moe_kwargs(ex, dev)
    return k3.latent_moe(x, d["gate"], d["down"], p13, p2, d["norm"], d["up"], e_score_correction_bias=d["bias"],
                         shared_gate_up=d["sgu"], shared_down=d["sdn"], top_k=top_k, **kw)


@pytest.mark.parametrize("device", DEVICES)
def test_latent_moe_against_fp64(device):
    gen = torch.Generator().manual_seed(74)
    w, ex = latent_setup(gen)
    x = (0.5 * torch.randn(3, 512, generator=gen)).to(torch.bfloat16)
    y, wts, ids = latent_call(w, ex, x.to(device))
    ref, rw, rids = latent_ref(f64(x), f64(w["gate"].float()), f64(w["bias"]), f64(w["down"]),
                               nvfp4_dense(*ex[:3]), nvfp4_dense(*ex[3:]), f64(w["norm"]), f64(w["up"]),
                               f64(w["sgu"]), f64(w["sdn"]), 4)
    assert np.array_equal(ids.cpu().numpy(), rids) and np.allclose(wts.cpu().numpy(), rw, rtol=1e-5, atol=1e-7)
    assert rel_l2(f64(y), ref) <= 1e-2


@pytest.mark.parametrize("device", DEVICES)
def test_latent_moe_scale_checks(device):
    gen = torch.Generator().manual_seed(77)
    w, ex = latent_setup(gen)
    x = torch.randn(2, 512, generator=gen).to(torch.bfloat16).to(device)
    p13, s13, g13, p2, s2, g2 = (t.to(device) for t in ex)
    d = {n: t.to(device) for n, t in w.items()}
    args = (x, d["gate"], d["down"], p13, p2, d["norm"], d["up"])
    with pytest.raises(TypeError, match="w13_scale must be torch.uint8"):
        k3.latent_moe(*args, top_k=4, w13_scale=s13.float(), w13_scale_2=g13, w2_scale=s2, w2_scale_2=g2)
    with pytest.raises(ValueError, match="w13_scale_2 and w2_scale_2 are required"):
        k3.latent_moe(*args, top_k=4, w13_scale=s13, w2_scale=s2)
    if device == "cuda":
        with pytest.raises(ValueError, match="w2_scale is on cpu"):
            k3.latent_moe(*args, top_k=4, w13_scale=s13, w13_scale_2=g13, w2_scale=s2.cpu(), w2_scale_2=g2)


@pytest.mark.parametrize("device", DEVICES)
def test_kda_proj_against_fp64(device):
    gen = torch.Generator().manual_seed(75)
    heads, head_dim, fa, h = 2, 128, 128, 1024
    g = heads * head_dim
    q = 4 * g
    p = q + fa + heads + 14
    w = (0.05 * torch.randn(p, h, generator=gen)).to(torch.bfloat16)
    w[q + fa + heads:] = 0
    fb = (0.1 * torch.randn(g, fa, generator=gen)).to(torch.bfloat16)
    for m in (1, 4, 16):
        x = torch.randn(m, h, generator=gen).to(torch.bfloat16)
        got = k3.kda_proj(x.to(device), w.to(device), fb.to(device), head_dim=head_dim)
        ref = kda_ref(f64(x), f64(w), f64(fb), q, fa)
        assert close_bf16(got[0], ref[0], 1e-2) and close_bf16(got[1], ref[1], 1e-2)
        assert rel_l2(f64(got[2]), ref[2]) <= 1e-2  # f_a rounded to BF16 on the device: a tie may go either way


@cuda
def test_fp4_refuses_cuda_tensors():
    x = torch.randn(16, 32, device="cuda")
    with pytest.raises(ValueError, match="x is on cuda.*pass x.cpu"):
        k3.quantize_nvfp4(x)
    with pytest.raises(ValueError, match="x is on cuda"):
        k3.quantize_mxfp4(x)
    p, s, s2 = k3.quantize_nvfp4(x.cpu())
    with pytest.raises(ValueError, match="packed is on cuda"):
        k3.dequantize_nvfp4(p.cuda(), s, s2)
    pm, sm = k3.quantize_mxfp4(x.cpu())
    with pytest.raises(ValueError, match="scale is on cuda"):
        k3.dequantize_mxfp4(pm, sm.cuda())


# ---------------------------------------------------------------- streams, graphs, compile, memory (GPU)
def gpu_calls(seed=76):
    """Each CUDA op as a function of one input x [4, 512] (bf16) returning a tuple of tensors, every weight already
    on the device (so that a call queues nothing but its own work)."""
    gen = torch.Generator().manual_seed(seed)
    w, ex = latent_setup(gen)
    w = {n: t.cuda() for n, t in w.items()}
    ex = tuple(t.cuda() for t in ex)
    lin_w = (0.05 * torch.randn(256, 512, generator=gen)).to(torch.bfloat16).cuda()
    gate, bias = w["gate"].float(), w["bias"]
    gate8, bias8 = gate[:8].contiguous(), bias[:8].contiguous()
    kda_w = (0.05 * torch.randn(4 * 128 + 128 + 1 + 15, 512, generator=gen)).to(torch.bfloat16).cuda()
    kda_fb = (0.1 * torch.randn(128, 128, generator=gen)).to(torch.bfloat16).cuda()
    (p13, p2), kw = moe_kwargs(experts(gen, 8, 512, 64), "cuda")

    def moe(x):
        wts, ids = k3.router(x, gate8, bias8, top_k=2)
        return k3.fused_moe(x, p13, p2, wts, ids, **kw), ids

    return {"linear": lambda x: (k3.linear(x, lin_w),),
            "router": lambda x: k3.router(x, gate, bias, top_k=4),
            "router+fused_moe": moe,
            "latent_moe": lambda x: latent_call(w, ex, x),
            "kda_proj": lambda x: k3.kda_proj(x, kda_w, kda_fb, head_dim=128)}


def same(a, b):
    return len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b))


@cuda
@pytest.mark.parametrize("name", ["linear", "router", "router+fused_moe", "latent_moe", "kda_proj"])
def test_current_stream_is_honoured(name):
    fn = gpu_calls()[name]
    x_old = torch.randn(4, 512, device="cuda").to(torch.bfloat16)
    x_new = torch.randn(4, 512, device="cuda").to(torch.bfloat16)
    ref = [t.clone() for t in fn(x_new)]  # also makes the plans, so the call below only queues work
    x = x_old.clone()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()  # non-blocking: the legacy stream does not wait for it
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keeps the side stream busy for tens of milliseconds
        x.copy_(x_new)  # queued behind the sleep: a call on another stream would read x_old
        y = fn(x)
    assert not side.query(), "the side stream finished during the queueing (a call synchronized?)"
    side.synchronize()
    assert same(y, ref)


@cuda
@pytest.mark.parametrize("name", ["linear", "router+fused_moe", "latent_moe", "kda_proj"])
def test_graph_capture_replay_new_routing(name):
    fn = gpu_calls()[name]
    static_x = torch.randn(4, 512, device="cuda").to(torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(static_x)  # plans, contexts and workspaces are made off the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):  # global capture mode: a launch on the legacy stream would fail the capture
        static_out = fn(static_x)
    routes = set()
    for seed in range(3):
        xs = torch.randn(4, 512, generator=torch.Generator().manual_seed(100 + seed)).to(torch.bfloat16).cuda()
        static_x.copy_(xs)
        g.replay()
        torch.cuda.synchronize()
        assert same(static_out, fn(xs)), "replay %d differs from the eager call" % seed
        routes.add(tuple(static_out[-1].flatten().tolist()))
    if name in ("router+fused_moe", "latent_moe"):
        assert len(routes) == 3, "the replays must route differently"


@cuda
def test_memory_flat_across_calls():
    calls = gpu_calls()
    x = torch.randn(4, 512, device="cuda").to(torch.bfloat16)
    for fn in calls.values():
        fn(x)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    reserved = torch.cuda.memory_reserved()
    for _ in range(10):
        for fn in calls.values():
            fn(x)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    assert torch.cuda.memory_reserved() == reserved


@cuda
def test_compile_layer_module_fullgraph():
    from torch._dynamo.utils import counters
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    import k3_latent_moe as ex
    w = ex.make_weights(512, 256, 32, 64, 128, "cuda")
    mod = ex.K3LatentMoE(w, 4)
    x = (torch.randn(4, 512) * 0.5).to(torch.bfloat16).cuda()
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(mod, fullgraph=True)
    y = compiled(x)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert torch.equal(y, mod(x))
    x2 = (torch.randn(4, 512) * 0.5).to(torch.bfloat16).cuda()
    assert torch.equal(compiled(x2), mod(x2))
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("device", DEVICES)
def test_expert_shapes_and_scale_sizes_checked(device):
    """A short scale buffer or mismatched expert shapes are refused before the C API would read past them."""
    gen = torch.Generator().manual_seed(78)
    w, ex = latent_setup(gen)
    p13, s13, g13, p2, s2, g2 = (t.to(device) for t in ex)
    x = torch.randn(2, 256, generator=gen).to(torch.bfloat16).to(device)
    ids = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=device)
    wts = torch.full((2, 2), 0.5, device=device)
    kw = dict(quant="nvfp4", w13_scale=s13, w13_scale_2=g13, w2_scale=s2, w2_scale_2=g2)
    k3.fused_moe(x, p13, p2, wts, ids, **kw)  # the valid call
    with pytest.raises(ValueError, match="w13_scale must hold 2048 bytes for each of the E = 32 experts"):
        k3.fused_moe(x, p13, p2, wts, ids, **dict(kw, w13_scale=s13[:, :-16].contiguous()))
    with pytest.raises(ValueError, match="w2_scale_2 must have shape"):
        k3.fused_moe(x, p13, p2, wts, ids, **dict(kw, w2_scale_2=g2[:-1].contiguous()))
    d = {n: t.to(device) for n, t in w.items()}
    xh = torch.randn(2, 512, generator=gen).to(torch.bfloat16).to(device)
    args = (xh, d["gate"], d["down"])
    with pytest.raises(ValueError, match="w2_scale must hold"):
        k3.latent_moe(*args, p13, p2, d["norm"], d["up"], top_k=4, **dict(kw, w2_scale=s2[:, :8].contiguous()))
    with pytest.raises(ValueError, match="w13 must be \\[E, 2I, L/2\\]"):
        k3.latent_moe(*args, p13[:16].contiguous(), p2, d["norm"], d["up"], top_k=4, **kw)
    if device == "cpu":  # the numpy front end checks the same
        n = {k: v.numpy() for k, v in kw.items() if k != "quant"}
        with pytest.raises(ValueError, match="w13_scale must hold"):
            k3.fused_moe(x.float().numpy(), p13.numpy(), p2.numpy(), wts.numpy(), ids.numpy(), quant="nvfp4",
                         **dict(n, w13_scale=n["w13_scale"][:, :-16]))
    with pytest.raises(ValueError, match="e_score_correction_bias must be \\[E\\] = \\[32\\]"):
        k3.latent_moe(*args, p13, p2, d["norm"], d["up"], top_k=4, e_score_correction_bias=d["bias"][:-1], **kw)
    with pytest.raises(ValueError, match="residual must be of shape"):
        k3.latent_moe(*args, p13, p2, d["norm"], d["up"], top_k=4, residual=xh[:1], **kw)
    with pytest.raises(ValueError, match="e_score_correction_bias must be \\[E\\] = \\[32\\]"):
        k3.router(xh, d["gate"], d["bias"][:-1], top_k=4)
