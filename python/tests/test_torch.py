"""k3kernels with torch tensors: CPU tensors give bitwise the numpy path's results (the same C calls on the same
BF16 inputs); CUDA tensors run the CUDA backend on torch's current stream, against the CPU backend's results;
torch.compile(fullgraph=True) traces the ops; CUDA graphs capture them and replay with new inputs. kda_proj and the
FP4 (de)quantization on CPU tensors against fp64 references (k3refs.py). Skipped without torch (and the CUDA part
without a GPU; python/tests/test_gpu.py has the full GPU set)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import k3kernels as k3  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def bf16_tensor(a, device="cpu"):
    return torch.from_numpy(k3.round_bf16(a)).to(torch.bfloat16).to(device)


def data(seed, m=4, n=96, k=256):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)).astype(np.float32), (0.05 * rng.standard_normal((n, k))).astype(np.float32)


def test_linear_cpu_matches_numpy():
    x, w = data(1)
    y_np = k3.linear(x, w)
    y_t = k3.linear(bf16_tensor(x), bf16_tensor(w))
    assert y_t.dtype == torch.bfloat16 and tuple(y_t.shape) == y_np.shape
    assert np.array_equal(y_t.float().numpy(), y_np)


def test_router_cpu_matches_numpy():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 128)).astype(np.float32)
    g = (0.1 * rng.standard_normal((32, 128))).astype(np.float32)
    b = (0.01 * rng.standard_normal(32)).astype(np.float32)
    w_np, i_np = k3.router(x, g, b, top_k=4)
    w_t, i_t = k3.router(bf16_tensor(x), torch.from_numpy(g), torch.from_numpy(b), top_k=4)
    assert i_t.dtype == torch.int32 and np.array_equal(i_t.numpy(), i_np) and np.array_equal(w_t.numpy(), w_np)


def moe_inputs(seed, e=8, l=128, inter=64, m=3, k=2):
    rng = np.random.default_rng(seed)
    w13 = (0.1 * rng.standard_normal((e, 2 * inter, l))).astype(np.float32)
    w2 = (0.1 * rng.standard_normal((e, l, inter))).astype(np.float32)
    p13, s13, g13 = k3.quantize_nvfp4(w13)
    p2, s2, g2 = k3.quantize_nvfp4(w2)
    x = rng.standard_normal((m, l)).astype(np.float32)
    ids = np.stack([rng.choice(e, k, replace=False) for _ in range(m)]).astype(np.int32)
    wts = rng.uniform(0.1, 1.0, (m, k)).astype(np.float32)
    return x, p13, s13, g13, p2, s2, g2, ids, wts


def moe_call(args, to):
    x, p13, s13, g13, p2, s2, g2, ids, wts = args
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(to)  # noqa: E731
    return k3.fused_moe(bf16_tensor(x, to), t(p13), t(p2), t(wts), t(ids), quant="nvfp4", w13_scale=t(s13),
                        w13_scale_2=t(g13), w2_scale=t(s2), w2_scale_2=t(g2))


def test_fused_moe_cpu_matches_numpy():
    args = moe_inputs(3)
    x, p13, s13, g13, p2, s2, g2, ids, wts = args
    y_np = k3.fused_moe(x, p13, p2, wts, ids, quant="nvfp4", w13_scale=s13, w13_scale_2=g13, w2_scale=s2,
                        w2_scale_2=g2)
    assert np.array_equal(moe_call(args, "cpu").float().numpy(), y_np)


def test_fused_moe_checks_every_call():
    """A call that passed the checks does not wave the next one through: each bad argument after a good call of
    the same shapes still raises, naming it, and a good call after the bad ones gives the same bits."""
    args = moe_inputs(7)
    x, p13, s13, g13, p2, s2, g2, ids, wts = args
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    good = dict(quant="nvfp4", w13_scale=t(s13), w13_scale_2=t(g13), w2_scale=t(s2), w2_scale_2=t(g2))
    xt, w13, w2, tw, ti = bf16_tensor(x), t(p13), t(p2), t(wts), t(ids)
    y0 = k3.fused_moe(xt, w13, w2, tw, ti, **good)
    bad = [
        (TypeError, "topk_ids must be torch.int32", lambda: k3.fused_moe(xt, w13, w2, tw, ti.long(), **good)),
        (ValueError, "w2_scale must hold",
         lambda: k3.fused_moe(xt, w13, w2, tw, ti, **dict(good, w2_scale=t(s2[:, 1:])))),
        (ValueError, "w2_scale must be contiguous",
         lambda: k3.fused_moe(xt, w13, w2, tw, ti, **dict(good, w2_scale=t(np.repeat(s2, 2, axis=1))[:, ::2]))),
        (ValueError, "w13_scale_2 and w2_scale_2 are required",
         lambda: k3.fused_moe(xt, w13, w2, tw, ti, **dict(good, w2_scale_2=None))),
        (ValueError, "topk_ids and topk_weights", lambda: k3.fused_moe(xt, w13, w2, tw[:, :1].contiguous(), ti,
                                                                             **good)),
        (TypeError, "hidden_states must be torch.bfloat16",
         lambda: k3.fused_moe(xt.float(), w13, w2, tw, ti, **good)),
        (ValueError, "quant", lambda: k3.fused_moe(xt, w13, w2, tw, ti, **dict(good, quant="fp8"))),
    ]
    for exc, msg, call in bad:
        with pytest.raises(exc, match=msg):
            call()
    assert torch.equal(k3.fused_moe(xt, w13, w2, tw, ti, **good), y0)


def test_errors_name_the_argument():
    x, w = data(4)
    with pytest.raises(TypeError, match="weight must be torch.bfloat16"):
        k3.linear(bf16_tensor(x), torch.from_numpy(w))
    with pytest.raises(ValueError, match="weight must be \\[N, K\\]"):
        k3.linear(bf16_tensor(x), bf16_tensor(w[:, :128]))


def test_torch_compile_fullgraph_cpu():
    x, w = data(5)
    xt, wt = bf16_tensor(x), bf16_tensor(w)

    def f(a, b):
        return k3.linear(a, b) * 2

    compiled = torch.compile(f, fullgraph=True)
    assert torch.equal(compiled(xt, wt), f(xt, wt))


@cuda
def test_cuda_linear_router_moe_against_cpu():
    x, w = data(6)
    y_cpu = k3.linear(bf16_tensor(x), bf16_tensor(w)).float()
    y_gpu = k3.linear(bf16_tensor(x, "cuda"), bf16_tensor(w, "cuda")).float().cpu()
    assert torch.linalg.norm(y_gpu - y_cpu) / torch.linalg.norm(y_cpu) <= 1e-2
    rng = np.random.default_rng(7)
    xr = rng.standard_normal((5, 256)).astype(np.float32)
    g = (0.1 * rng.standard_normal((64, 256))).astype(np.float32)
    b = (0.01 * rng.standard_normal(64)).astype(np.float32)
    w_c, i_c = k3.router(bf16_tensor(xr), torch.from_numpy(g), torch.from_numpy(b), top_k=8)
    w_g, i_g = k3.router(bf16_tensor(xr, "cuda"), torch.from_numpy(g).cuda(), torch.from_numpy(b).cuda(), top_k=8)
    assert torch.equal(i_g.cpu(), i_c) and torch.equal(w_g.cpu(), w_c)  # the router is bitwise across backends
    args = moe_inputs(8)
    m_c, m_g = moe_call(args, "cpu").float(), moe_call(args, "cuda").float().cpu()
    assert torch.linalg.norm(m_g - m_c) / torch.linalg.norm(m_c) <= 1e-2


@cuda
def test_cuda_current_stream_graph_and_no_allocation_growth():
    x, w = data(9, m=2)
    xt, wt = bf16_tensor(x, "cuda"), bf16_tensor(w, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y_side = k3.linear(xt, wt)
    side.synchronize()
    ref = k3.linear(bf16_tensor(x), bf16_tensor(w))
    assert torch.equal(y_side.cpu(), k3.linear(xt, wt).cpu())
    assert torch.linalg.norm(y_side.float().cpu() - ref.float()) / torch.linalg.norm(ref.float()) <= 1e-2
    # memory stays flat across calls (workspaces from the caching allocator, nothing held per call)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(20):
        k3.linear(xt, wt)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    # capture into a CUDA graph, then replay with new inputs copied into the captured buffers
    static_x = xt.clone()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        k3.linear(static_x, wt)  # warm-up off the capture (plans and contexts are made here)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        static_y = k3.linear(static_x, wt)
    x2, _ = data(10, m=2)
    static_x.copy_(bf16_tensor(x2, "cuda"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_y.cpu(), k3.linear(bf16_tensor(x2, "cuda"), wt).cpu())


# ---------------------------------------------------------------- kda_proj and FP4 on CPU tensors, against fp64
from k3refs import (b64, e2m1_value, kda_ref, mxfp4_ref, nvfp4_ref, swizzle_index, unpack,  # noqa: E402
                    within_bf16_step, E4M3)


def f64(t):
    return t.detach().to(torch.float64).numpy()


def test_kda_proj_cpu_against_fp64():
    gen = torch.Generator().manual_seed(21)
    heads, head_dim, fa, h, m = 2, 32, 128, 512, 3
    g = heads * head_dim
    q = 4 * g
    p = q + fa + heads + 14  # q, k, v, g; f_a; beta; zero padding
    x = torch.randn(m, h, generator=gen).to(torch.bfloat16)
    w = (0.05 * torch.randn(p, h, generator=gen)).to(torch.bfloat16)
    w[q + fa + heads:] = 0
    fb = (0.1 * torch.randn(g, fa, generator=gen)).to(torch.bfloat16)
    got = k3.kda_proj(x, w, fb, head_dim=head_dim)
    ref = kda_ref(f64(x), f64(w), f64(fb), q, fa)
    for t, r in zip(got, ref):
        assert t.dtype == torch.bfloat16 and tuple(t.shape) == r.shape and within_bf16_step(f64(t), r)
    with pytest.raises(ValueError, match="1 to 16 rows"):
        k3.kda_proj(torch.zeros(17, h, dtype=torch.bfloat16), w, fb, head_dim=head_dim)
    with pytest.raises(TypeError, match="f_b_weight must be torch.bfloat16"):
        k3.kda_proj(x, w, fb.float(), head_dim=head_dim)


def check_nvfp4(x64, packed, scale, scale_2, layout):
    codes, sc, s2, near = nvfp4_ref(x64)
    rows, cols = x64.shape
    if layout == "swizzled":
        idx = swizzle_index(rows, cols // 16)
        assert scale.size >= idx.max() + 1
        lin = np.asarray(scale)[idx]
    else:
        lin = np.asarray(scale).reshape(rows, cols // 16)
    assert abs(scale_2 - s2) <= 2.0 ** -23 * s2
    assert ((lin == sc) | near.reshape(rows, cols // 16, 16).any(axis=2)).all()
    got = unpack(packed)
    assert ((got == codes) | near).all()
    assert near.mean() < 1e-2  # near ties are rare (a block or two here): the comparison is nearly exact


@pytest.mark.parametrize("layout", ["linear", "swizzled"])
def test_quantize_nvfp4_torch_against_fp64(layout):
    gen = torch.Generator().manual_seed(41)
    x = torch.randn(2, 160, 96, generator=gen) * torch.exp(torch.randn(2, 160, 1, generator=gen))
    x[0, 0, :16] = 0.0  # a zero block
    packed, scale, scale_2 = k3.quantize_nvfp4(x, scale_layout=layout)
    assert packed.dtype == torch.uint8 and tuple(packed.shape) == (2, 160, 48) and scale.shape[0] == 2
    assert scale_2.dtype == torch.float32 and tuple(scale_2.shape) == (2,)
    for b in range(2):
        check_nvfp4(f64(x[b]), packed[b].numpy(), scale[b].numpy(), float(scale_2[b]), layout)
    # bfloat16 input is the same values as float32
    xb = x[1].to(torch.bfloat16)
    p2, s2, g2 = k3.quantize_nvfp4(xb, scale_layout=layout)
    check_nvfp4(f64(xb), p2.numpy(), s2.numpy(), float(g2[0]), layout)


def test_quantize_mxfp4_torch_against_fp64():
    gen = torch.Generator().manual_seed(42)
    x = torch.randn(64, 128, generator=gen) * torch.exp(2 * torch.randn(64, 1, generator=gen))
    x[3, 32:64] = 0.0
    packed, scale = k3.quantize_mxfp4(x)
    codes, sc = mxfp4_ref(f64(x))
    assert torch.equal(torch.from_numpy(unpack(packed.numpy())), torch.from_numpy(codes))
    assert np.array_equal(scale.numpy().reshape(64, 4), sc)


def test_dequantize_torch_against_fp64():
    gen = torch.Generator().manual_seed(43)
    rows, cols = 32, 64
    packed = torch.randint(0, 256, (rows, cols // 2), generator=gen, dtype=torch.uint8)
    nv_scale = torch.randint(0x08, 0x7F, (rows * cols // 16,), generator=gen, dtype=torch.uint8)
    s2 = torch.tensor([0.0123], dtype=torch.float32)
    got = k3.dequantize_nvfp4(packed, nv_scale, s2)
    ref = (e2m1_value(unpack(packed.numpy())) * np.repeat(E4M3[nv_scale.numpy().reshape(rows, -1)], 16, axis=1) *
           float(s2[0]))
    assert got.dtype == torch.float32 and np.all(np.abs(f64(got) - ref) <= 2.0 ** -22 * np.abs(ref))
    mx_scale = torch.randint(100, 150, (rows * cols // 32,), generator=gen, dtype=torch.uint8)
    got = k3.dequantize_mxfp4(packed, mx_scale)
    ref = e2m1_value(unpack(packed.numpy())) * np.repeat(2.0 ** (mx_scale.numpy().reshape(rows, -1) - 127.0), 32,
                                                         axis=1)
    assert np.array_equal(f64(got), ref)


def test_fp4_torch_errors():
    with pytest.raises(TypeError, match="x must be float32, bfloat16 or float16"):
        k3.quantize_nvfp4(torch.zeros(4, 16, dtype=torch.int32))
    with pytest.raises(ValueError, match="multiple of 32"):
        k3.quantize_mxfp4(torch.zeros(4, 48))
    with pytest.raises(TypeError, match="scale must be torch.uint8"):
        k3.dequantize_mxfp4(torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(4, dtype=torch.int32))
    with pytest.raises(TypeError, match="scale_2 must be torch.float32"):
        k3.dequantize_nvfp4(torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(4, dtype=torch.uint8),
                            torch.ones(1, dtype=torch.float64))
    with pytest.raises(k3.K3Error):
        k3.quantize_nvfp4(torch.full((4, 16), float("nan")))


# ---------------------------------------------------------------- torch.compile(fullgraph=True) of a module
class SmallDecode(torch.nn.Module):
    """A router, the routed experts and a projection, each a k3kernels op: the graph torch.compile must trace."""

    def __init__(self, args, gate, bias):
        super().__init__()
        x, p13, s13, g13, p2, s2, g2, ids, wts = args
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
        self.ws = [t(p13), t(s13), t(g13), t(p2), t(s2), t(g2)]
        self.gate, self.bias = gate, bias

    def forward(self, x, w_out):
        p13, s13, g13, p2, s2, g2 = self.ws
        wts, ids = k3.router(x, self.gate, self.bias, top_k=2)
        y = k3.fused_moe(x, p13, p2, wts, ids, quant="nvfp4", w13_scale=s13, w13_scale_2=g13, w2_scale=s2,
                         w2_scale_2=g2)
        return k3.linear(y, w_out, residual=x[:, :w_out.shape[0]].contiguous())


def test_torch_compile_fullgraph_module_cpu():
    from torch._dynamo.utils import counters
    from torch._inductor.compile_fx import compile_fx
    args = moe_inputs(51)
    rng = np.random.default_rng(52)
    gate = torch.from_numpy((0.1 * rng.standard_normal((8, 128))).astype(np.float32))
    bias = torch.from_numpy((0.01 * rng.standard_normal(8)).astype(np.float32))
    mod = SmallDecode(args, gate, bias)
    x = bf16_tensor(args[0])
    w_out = bf16_tensor((0.05 * rng.standard_normal((96, 128))).astype(np.float32))
    seen = []

    def backend(gm, example_inputs):  # records the traced graph, then compiles it with inductor
        seen.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return compile_fx(gm, example_inputs)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(mod, backend=backend, fullgraph=True)
    y = compiled(x, w_out)
    assert len(seen) == 1, "one graph, no breaks"
    assert not counters["graph_break"], dict(counters["graph_break"])
    ops = [t.split(".")[1] for t in seen[0] if t.startswith("k3kernels.")]
    assert ops == ["router", "fused_moe", "linear"], seen[0]
    assert torch.equal(y, mod(x, w_out))
    y2 = compiled(bf16_tensor(args[0] * 0.5), w_out)  # a second call reuses the graph: no recompilation
    assert len(seen) == 1 and torch.equal(y2, mod(bf16_tensor(args[0] * 0.5), w_out))
    assert counters["stats"]["unique_graphs"] == 1


def test_torch_compile_kda_and_fp4_ops():
    gen = torch.Generator().manual_seed(53)
    x = torch.randn(2, 512, generator=gen).to(torch.bfloat16)
    w = (0.05 * torch.randn(4 * 32 + 128 + 1 + 15, 512, generator=gen)).to(torch.bfloat16)
    fb = (0.1 * torch.randn(32, 128, generator=gen)).to(torch.bfloat16)
    wf = torch.randn(64, 64, generator=gen)

    def f(x, w, fb, wf):
        qkvg, fab, g1 = k3.kda_proj(x, w, fb, head_dim=32)
        p, s, s2 = k3.quantize_nvfp4(wf)
        return qkvg.float().sum() + fab.float().sum() + g1.float().sum(), k3.dequantize_nvfp4(p, s, s2)

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True)(x, w, fb, wf)
    ref = f(x, w, fb, wf)
    assert torch.equal(got[1], ref[1]) and torch.allclose(got[0], ref[0])


def test_eager_fast_path_only_when_nothing_observes():
    """Eager calls run the implementation directly; a dispatch mode, autograd or tracing sees the registered op."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    x, w = data(61)
    xt, wt = bf16_tensor(x), bf16_tensor(w)
    fast = k3.linear(xt, wt)
    with Log() as log:
        seen = k3.linear(xt, wt)
    assert log.ops == ["k3kernels.linear.default"] and torch.equal(seen, fast)
    wp = torch.nn.Parameter(wt)
    assert k3.linear(xt, wp).grad_fn is not None  # through the op: autograd sees it (and has no formula)
    with torch.no_grad():
        y = k3.linear(xt, wp)
    assert y.grad_fn is None and torch.equal(y, fast)
    with pytest.raises(TypeError, match="weight must be a torch tensor"):
        k3.linear(xt, w)  # a numpy weight with a torch x: named by the implementation's checks
