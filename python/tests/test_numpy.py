"""k3kernels' numpy front end on the CPU backend, against fp64 references written here (not the library's code)."""
import numpy as np
import pytest

import k3kernels as k3
from k3refs import bf16_ref, rel_l2, situ

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def test_info():
    i = k3.info()
    assert i["backend"] == "cpu" and i["version"].count(".") == 2


def test_round_bf16():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(100000) * np.exp(rng.uniform(-20, 20, 100000))).astype(np.float32)
    x[:4] = [0.0, -0.0, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8]  # two exact ties: to even (down, then up)
    assert np.array_equal(k3.round_bf16(x).view(np.uint32), bf16_ref(x).view(np.uint32))
    assert np.isnan(k3.round_bf16(np.array([np.nan], np.float32)))[0]


@pytest.mark.parametrize("m", [1, 4, 16, 40])
def test_linear(m):
    rng = np.random.default_rng(m)
    n, k = 96, 256
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (0.05 * rng.standard_normal((n, k))).astype(np.float32)
    r = rng.standard_normal((m, n)).astype(np.float32)
    ref = bf16_ref(x).astype(np.float64) @ bf16_ref(w).astype(np.float64).T
    y = k3.linear(x, w)
    # fp32 accumulation against fp64: at most one BF16 step apart
    assert np.all(np.abs(y - ref) <= 2.0 ** -7 * np.maximum(np.abs(ref), 1e-3))
    out = np.zeros((m, n), np.float32)
    y2 = k3.linear(x, w, residual=r, out=out)
    assert y2 is out
    ref2 = ref + bf16_ref(r)
    assert np.all(np.abs(out - ref2) <= 2.0 ** -7 * np.maximum(np.abs(ref2), 1e-3))


def test_linear_errors():
    x = np.zeros((2, 64), np.float32)
    with pytest.raises(TypeError, match="x must be a numpy array"):
        k3.linear([[1.0]], np.zeros((8, 64), np.float32))
    with pytest.raises(ValueError, match="weight must be \\[N, K\\]"):
        k3.linear(x, np.zeros((8, 32), np.float32))
    with pytest.raises(ValueError, match="residual must be"):
        k3.linear(x, np.zeros((8, 64), np.float32), residual=np.zeros((2, 9), np.float32))
    with pytest.raises(TypeError, match="x must be a float array"):
        k3.linear(np.zeros((2, 64), np.int32), np.zeros((8, 64), np.float32))


def router_ref(x, gate, bias, top_k, renorm, scale, scoring):
    logits = bf16_ref(x).astype(np.float64) @ gate.astype(np.float64).T
    if scoring == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-logits))
        choice = s + (bias if bias is not None else 0.0)
    else:
        s = np.exp(logits - logits.max(axis=1, keepdims=True))
        s /= s.sum(axis=1, keepdims=True)
        choice = s
    ids = np.argsort(-choice, axis=1, kind="stable")[:, :top_k]  # ties to the lower id
    w = np.take_along_axis(s, ids, axis=1)
    if renorm:
        w = w / w.sum(axis=1, keepdims=True)
    return w * scale, ids


@pytest.mark.parametrize("scoring", ["sigmoid", "softmax"])
def test_router(scoring):
    rng = np.random.default_rng(7)
    m, h, e, top_k = 5, 256, 64, 8
    x = rng.standard_normal((m, h)).astype(np.float32)
    gate = (0.1 * rng.standard_normal((e, h))).astype(np.float32)
    bias = (0.01 * rng.standard_normal(e)).astype(np.float32) if scoring == "sigmoid" else None
    wts, ids = k3.router(x, gate, bias, top_k=top_k, routed_scaling_factor=2.5, scoring=scoring)
    rw, rids = router_ref(x, gate, bias, top_k, True, 2.5, scoring)
    assert ids.dtype == np.int32 and wts.dtype == np.float32
    assert np.array_equal(ids, rids)
    assert np.allclose(wts, rw, rtol=1e-5, atol=1e-7)


def test_router_errors():
    x = np.zeros((2, 32), np.float32)
    g = np.zeros((8, 32), np.float32)
    with pytest.raises(ValueError, match="top_k"):
        k3.router(x, g, top_k=9)
    with pytest.raises(ValueError, match="scoring"):
        k3.router(x, g, top_k=2, scoring="relu")
    with pytest.raises(ValueError, match="e_score_correction_bias must be"):
        k3.router(x, g, np.zeros(7, np.float32), top_k=2)


def grid_matrix(rng, rows, cols, block, block_exp):
    """A matrix whose every block holds E2M1 values times 2^block_exp[r, b], each block reaching its maximum 6."""
    codes = rng.integers(0, 16, (rows, cols))
    codes[:, ::block] = 7  # the block's maximum, 6
    x = E2M1[codes] * np.repeat(2.0 ** block_exp, block, axis=1)
    return x.astype(np.float32)


def test_nvfp4_round_trip_exact():
    rng = np.random.default_rng(3)
    rows, cols = 32, 128
    exp = -rng.integers(0, 5, (rows, cols // 16)).astype(np.float64)
    exp[0, 0] = 0  # the matrix maximum is 6: gs = 448, block scales 448 * 2^-j, all exact in E4M3
    x = grid_matrix(rng, rows, cols, 16, exp)
    for layout in ("linear", "swizzled"):
        packed, scale, s2 = k3.quantize_nvfp4(x, scale_layout=layout)
        assert packed.shape == (rows, cols // 2) and packed.dtype == np.uint8 and s2.shape == (1,)
        assert s2[0] == np.float32(1.0 / 448.0)  # ModelOpt's weight_scale_2 = 1 / gs, gs = 448 * 6 / amax
        # the codes and block scales are exact; only the fp32 product with 1/448 (inexact) rounds
        back = k3.dequantize_nvfp4(packed, scale, s2, scale_layout=layout)
        assert np.all(np.abs(back - x) <= 2.0 ** -22 * np.abs(x))
    # element 2j is the low nibble: E2M1 code of x[0, 0] (6.0 = code 7) sits in packed[0, 0] & 0xF
    packed, _, _ = k3.quantize_nvfp4(x)
    assert packed[0, 0] & 0xF == 7


def test_mxfp4_round_trip_exact():
    rng = np.random.default_rng(4)
    x = grid_matrix(rng, 16, 128, 32, rng.integers(-6, 4, (16, 4)).astype(np.float64))
    packed, scale = k3.quantize_mxfp4(x)
    assert np.array_equal(k3.dequantize_mxfp4(packed, scale), x)


def test_quantize_errors():
    with pytest.raises(ValueError, match="multiple of 16"):
        k3.quantize_nvfp4(np.zeros((4, 24), np.float32))
    with pytest.raises(ValueError, match="scale_2 is required"):
        k3.dequantize_nvfp4(np.zeros((4, 8), np.uint8), np.zeros(4, np.uint8), None)
    with pytest.raises(k3.K3Error):
        k3.quantize_nvfp4(np.full((4, 16), np.nan, np.float32))


def pack_codes(codes):
    """E2M1 codes [..., n] -> bytes [..., n/2], element 2j in the low nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def e4m3_pow2(e):
    """The E4M3 code of 2^e, e in the normal range -6 .. 8."""
    assert np.all((e >= -6) & (e <= 8))
    return ((e + 7) << 3).astype(np.uint8)


def moe_ref(x, w13, w2, wts, ids):
    inter = w13.shape[1] // 2
    out = np.zeros((x.shape[0], w2.shape[1]))
    xb = bf16_ref(x).astype(np.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            gu = bf16_ref((w13[e] @ xb[t]).astype(np.float32)).astype(np.float64)
            a = bf16_ref(situ(gu[:inter], gu[inter:]).astype(np.float32)).astype(np.float64)
            out[t] += wts[t, j] * (w2[e] @ a)
    return out


def test_fused_moe_nvfp4():
    rng = np.random.default_rng(11)
    e, l, inter, m, k = 8, 128, 64, 3, 2
    c13 = rng.integers(0, 16, (e, 2 * inter, l))
    c2 = rng.integers(0, 16, (e, l, inter))
    x13 = -rng.integers(1, 6, (e, 2 * inter, l // 16))  # block scales 2^-1 .. 2^-5 (E4M3 normals)
    x2 = -rng.integers(1, 6, (e, l, inter // 16))
    s13_2 = np.full(e, 0.5, np.float32)
    s2_2 = np.full(e, 0.25, np.float32)
    w13 = E2M1[c13] * np.repeat(2.0 ** x13, 16, axis=2) * 0.5
    w2 = E2M1[c2] * np.repeat(2.0 ** x2, 16, axis=2) * 0.25
    x = rng.standard_normal((m, l)).astype(np.float32)
    ids = np.stack([rng.choice(e, k, replace=False) for _ in range(m)]).astype(np.int32)
    wts = rng.uniform(0.1, 1.0, (m, k)).astype(np.float32)
    out = k3.fused_moe(x, pack_codes(c13), pack_codes(c2), wts, ids, quant="nvfp4",
                       w13_scale=e4m3_pow2(x13).reshape(e, -1), w13_scale_2=s13_2,
                       w2_scale=e4m3_pow2(x2).reshape(e, -1), w2_scale_2=s2_2)
    ref = moe_ref(x, w13, w2, wts, ids)
    assert out.shape == (m, l) and out.dtype == np.float32
    assert rel_l2(out, ref) <= 1e-2
    # a row does not depend on the other tokens of the batch
    one = k3.fused_moe(x[1:2], pack_codes(c13), pack_codes(c2), wts[1:2], ids[1:2], quant="nvfp4",
                       w13_scale=e4m3_pow2(x13).reshape(e, -1), w13_scale_2=s13_2,
                       w2_scale=e4m3_pow2(x2).reshape(e, -1), w2_scale_2=s2_2)
    assert np.array_equal(one[0], out[1])


def test_fused_moe_bf16_and_errors():
    rng = np.random.default_rng(12)
    e, l, inter, m, k = 4, 64, 32, 2, 2
    w13 = (0.1 * rng.standard_normal((e, 2 * inter, l))).astype(np.float32)
    w2 = (0.1 * rng.standard_normal((e, l, inter))).astype(np.float32)
    x = rng.standard_normal((m, l)).astype(np.float32)
    ids = np.array([[0, 3], [2, 1]], np.int32)
    wts = np.array([[0.7, 0.3], [0.5, 0.5]], np.float32)
    out = k3.fused_moe(x, w13, w2, wts, ids, quant="bf16")
    ref = moe_ref(x, bf16_ref(w13).astype(np.float64), bf16_ref(w2).astype(np.float64), wts, ids)
    assert rel_l2(out, ref) <= 1e-2
    with pytest.raises(ValueError, match="quant must be"):
        k3.fused_moe(x, w13, w2, wts, ids, quant="fp8")
    with pytest.raises(ValueError, match="w13_scale is required"):
        k3.fused_moe(x, np.zeros((e, 2 * inter, l // 2), np.uint8), np.zeros((e, l, inter // 2), np.uint8), wts, ids)
    with pytest.raises(TypeError, match="topk_ids must be int32"):
        k3.fused_moe(x, w13, w2, wts, ids.astype(np.int64), quant="bf16")
    # ids outside [0, E) (-1: an expert on another rank) drop their slot: the reference with that weight zeroed
    dropped = k3.fused_moe(x, w13, w2, wts, np.array([[0, 4], [-1, 1]], np.int32), quant="bf16")
    wz = wts.copy()
    wz[0, 1] = wz[1, 0] = 0.0
    ref = moe_ref(x, bf16_ref(w13).astype(np.float64), bf16_ref(w2).astype(np.float64), wz, ids)
    assert rel_l2(dropped, ref) <= 1e-2


def test_kda_proj():
    rng = np.random.default_rng(21)
    heads, head_dim, fa, h, m = 1, 32, 128, 512, 3
    g = heads * head_dim
    q = 4 * g
    p = q + fa + heads + 15  # q, k, v, g; f_a; beta; zero padding
    x = rng.standard_normal((m, h)).astype(np.float32)
    w = (0.05 * rng.standard_normal((p, h))).astype(np.float32)
    w[q + fa + heads:] = 0.0
    fb = (0.1 * rng.standard_normal((g, fa))).astype(np.float32)
    qkvg, fab, g1 = k3.kda_proj(x, w, fb, head_dim=head_dim)
    xb, wb = bf16_ref(x).astype(np.float64), bf16_ref(w).astype(np.float64)
    ref_q, ref_f = xb @ wb[:q].T, xb @ wb[q:].T
    ref_g = bf16_ref(ref_f[:, :fa].astype(np.float32)).astype(np.float64) @ bf16_ref(fb).astype(np.float64).T
    for got, ref in ((qkvg, ref_q), (fab, ref_f), (g1, ref_g)):
        assert got.shape == ref.shape
        assert np.all(np.abs(got - ref) <= 2.0 ** -7 * np.maximum(np.abs(ref), 1e-3))
    with pytest.raises(ValueError, match="1 to 16 rows"):
        k3.kda_proj(np.zeros((17, h), np.float32), w, fb, head_dim=head_dim)


def test_latent_moe_bf16_experts():
    rng = np.random.default_rng(31)
    h, l, e, inter, top_k, shared, m = 256, 128, 16, 32, 4, 64, 3
    x = rng.standard_normal((m, h)).astype(np.float32)
    gate = (0.1 * rng.standard_normal((e, h))).astype(np.float32)
    bias = (0.01 * rng.standard_normal(e)).astype(np.float32)
    down = (0.06 * rng.standard_normal((l, h))).astype(np.float32)
    w13 = (0.1 * rng.standard_normal((e, 2 * inter, l))).astype(np.float32)
    w2 = (0.1 * rng.standard_normal((e, l, inter))).astype(np.float32)
    norm = (1.0 + 0.1 * rng.standard_normal(l)).astype(np.float32)
    up = (0.08 * rng.standard_normal((h, l))).astype(np.float32)
    sgu = (0.06 * rng.standard_normal((2 * shared, h))).astype(np.float32)
    sdn = (0.1 * rng.standard_normal((h, shared))).astype(np.float32)
    res = rng.standard_normal((m, h)).astype(np.float32)
    y, wts, ids = k3.latent_moe(x, gate, down, w13, w2, norm, up, e_score_correction_bias=bias, shared_gate_up=sgu,
                                shared_down=sdn, residual=res, top_k=top_k, quant="bf16")
    # fp64 reference of the block, the library's rounding points (include/k3.h, k3_latent_moe_run)
    b = lambda a: bf16_ref(np.asarray(a, np.float32)).astype(np.float64)  # noqa: E731
    rw, rids = router_ref(x, gate, bias, top_k, True, 1.0, "sigmoid")
    assert np.array_equal(ids, rids) and np.allclose(wts, rw, rtol=1e-5, atol=1e-7)
    xl = b(b(x) @ b(down).T)
    u = np.zeros((m, l))
    for t in range(m):
        for j in range(top_k):
            ex = rids[t, j]
            gu = b(b(w13[ex]) @ xl[t])
            a = b(situ(gu[:inter], gu[inter:]))
            u[t] += rw[t, j] * (b(w2[ex]) @ a)
    v = b(b(u / np.sqrt(np.mean(u * u, axis=1, keepdims=True) + 1e-5)) * b(norm))
    upo = b(v @ b(up).T)
    g = b(b(x) @ b(sgu).T)
    sh = b(b(situ(g[:, :shared], g[:, shared:])) @ b(sdn).T)
    ref = upo + sh + b(res)
    assert y.shape == (m, h) and rel_l2(y, ref) <= 1e-2
    with pytest.raises(ValueError, match="both or neither"):
        k3.latent_moe(x, gate, down, w13, w2, norm, up, shared_gate_up=sgu, top_k=top_k, quant="bf16")


def test_threads_share_a_plan_not_a_workspace():
    """Calls of one plan from several threads at once (ctypes releases the GIL) give each call's own answer."""
    import threading
    rng = np.random.default_rng(41)
    m, h, e, top_k = 4, 512, 256, 8
    gate = (0.1 * rng.standard_normal((e, h))).astype(np.float32)
    bias = (0.01 * rng.standard_normal(e)).astype(np.float32)
    xs = [rng.standard_normal((m, h)).astype(np.float32) for _ in range(8)]
    want = [k3.router(x, gate, bias, top_k=top_k) for x in xs]
    bad = []

    def work(t):
        for i in range(40):
            j = (t + i) % len(xs)
            w, ids = k3.router(xs[j], gate, bias, top_k=top_k)
            if not (np.array_equal(ids, want[j][1]) and np.array_equal(w, want[j][0])):
                bad.append((t, i))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
