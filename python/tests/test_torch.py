"""k3kernels with torch tensors: CPU tensors give bitwise the numpy path's results (the same C calls on the same
BF16 inputs); CUDA tensors run the CUDA backend on torch's current stream, against the CPU backend's results;
torch.compile(fullgraph=True) traces the ops; CUDA graphs capture them and replay with new inputs. Skipped without
torch (and the CUDA part without a GPU)."""
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
