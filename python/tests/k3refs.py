"""fp64 references for the torch and GPU tests, written from the rules stated in include/k3.h (not from the
library's code): BF16 rounding, E2M1 / E4M3 / UE8M0 quantization, the KDA projection, the routed experts."""
import numpy as np

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # codes 0..7; bit 3 is the sign


def _e4m3_values():
    """The 127 non-negative finite E4M3FN values, code 0x00..0x7E (bias 7, subnormals; 0x7F is NaN)."""
    c = np.arange(0x7F)
    e, m = c >> 3, c & 7
    return np.where(e == 0, m / 8.0 * 2.0 ** -6, (1.0 + m / 8.0) * 2.0 ** (e - 7.0))


E4M3 = _e4m3_values()


def bf16_ref(x):
    """Round to the nearest BF16 value, ties to even, by comparing the two neighbours in fp64."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    lo = (u & 0xFFFF0000).astype(np.uint32).view(np.float32).astype(np.float64)
    hi = ((u & 0xFFFF0000) + 0x10000).astype(np.uint32).view(np.float32).astype(np.float64)
    xd = x.astype(np.float64)
    d_lo, d_hi = np.abs(xd - lo), np.abs(hi - xd)
    pick_lo = (d_lo < d_hi) | ((d_lo == d_hi) & (((u >> 16) & 1) == 0))
    return np.where(pick_lo, lo, hi).astype(np.float32)


def b64(a):
    """BF16-rounded, as fp64."""
    return bf16_ref(np.asarray(a, np.float32)).astype(np.float64)


def round_to_grid(v, grid):
    """Non-negative v to the nearest grid value (ascending grid; beyond the end: the last value), ties to the even
    code. Returns (codes, near): near marks values within 2^-18 of a midpoint, where the library's fp32 arithmetic
    may round the other way."""
    v = np.asarray(v, np.float64)
    hi = np.clip(np.searchsorted(grid, v), 1, len(grid) - 1)
    lo = hi - 1
    d_lo, d_hi = v - grid[lo], grid[hi] - v
    code = np.where((d_lo < d_hi) | ((d_lo == d_hi) & (lo % 2 == 0)), lo, hi)
    code = np.where(v >= grid[-1], len(grid) - 1, code)
    mid = 0.5 * (grid[lo] + grid[hi])
    near = (np.abs(v - mid) <= 2.0 ** -18 * np.maximum(np.abs(v), 1e-30)) & (v < grid[-1])
    return code.astype(np.int64), near


def e2m1_codes(v):
    """Signed values -> E2M1 codes with the sign of zero kept (bit 3), and the near-tie mask."""
    mag, near = round_to_grid(np.abs(v), E2M1)
    return mag | np.where(np.signbit(v), 8, 0), near


def nvfp4_ref(x):
    """One matrix [rows, cols]: (codes [rows, cols], E4M3 scale codes [rows, cols/16], scale_2 = 1/gs, near mask of
    the elements whose code or block scale may legitimately differ)."""
    x = np.asarray(x, np.float64)
    rows, cols = x.shape
    amax = np.abs(x).max()
    gs = 448.0 * 6.0 / amax if amax > 0 else 1.0
    blocks = np.abs(x).reshape(rows, cols // 16, 16).max(axis=2)
    sc, near_s = round_to_grid(gs * blocks / 6.0, E4M3)
    sf = np.repeat(E4M3[sc], 16, axis=1)
    v = np.divide(x * gs, sf, out=np.zeros_like(x), where=sf > 0)
    codes, near = e2m1_codes(v)
    codes = np.where(sf > 0, codes, 0)  # a zero block: all-zero codes
    return codes, sc, 1.0 / gs, near | np.repeat(near_s, 16, axis=1)


def mxfp4_ref(x):
    """One matrix: (codes, UE8M0 scale bytes [rows, cols/32]); exact in fp64 (the scales are powers of two)."""
    x = np.asarray(x, np.float64)
    rows, cols = x.shape
    blocks = np.abs(x).reshape(rows, cols // 32, 32).max(axis=2)
    _, e = np.frexp(np.where(blocks > 0, blocks, 1.0))  # blocks = f * 2^e, f in [0.5, 1): floor(log2) = e - 1
    biased = np.clip(e - 1 - 2 + 127, 0, 254)
    biased = np.where(blocks > 0, biased, 0)
    scale = np.repeat(2.0 ** (biased - 127.0), 32, axis=1)
    codes, _ = e2m1_codes(x / scale)
    return codes, biased.astype(np.int64)


def swizzle_index(rows, scale_cols):
    """The swizzled 128x4 byte offset of every linear scale (r, b), from the formula in include/k3.h."""
    kp = (scale_cols + 3) // 4 * 4
    r = np.arange(rows)[:, None]
    b = np.arange(scale_cols)[None, :]
    return ((r // 128) * (kp // 4) + b // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + b % 4


def unpack(packed):
    """Packed bytes [..., n/2] -> codes [..., n], element 2j in the low nibble."""
    p = np.asarray(packed, np.int64)
    out = np.empty(p.shape[:-1] + (2 * p.shape[-1],), np.int64)
    out[..., 0::2], out[..., 1::2] = p & 0xF, p >> 4
    return out


def e2m1_value(codes):
    return np.where(codes & 8, -1.0, 1.0) * E2M1[codes & 7]


def kda_ref(x, w, fb, q, fa):
    """(qkvg, fab, g1) in fp64 from BF16 inputs (given as fp64 values): fab's f_a part rounded to BF16 before g1."""
    ref_q, ref_f = x @ w[:q].T, x @ w[q:].T
    return ref_q, ref_f, b64(ref_f[:, :fa]) @ fb.T


def situ(g, u, beta=4.0, lb=25.0):
    return beta * np.tanh(g / beta) / (1.0 + np.exp(-g)) * (lb * np.tanh(u / lb))


def moe_ref(x, w13, w2, wts, ids):
    """The routed experts from BF16 x and dense (dequantized) expert weights, fp64, the C API's rounding points."""
    inter = w13.shape[1] // 2
    out = np.zeros((x.shape[0], w2.shape[1]))
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            gu = b64(w13[e] @ x[t])
            a = b64(situ(gu[:inter], gu[inter:]))
            out[t] += wts[t, j] * (w2[e] @ a)
    return out


def router_ref(x, gate, bias, top_k):
    """Sigmoid noaux_tc routing in fp64, renormalized: (weights, ids), ties to the lower id."""
    s = 1.0 / (1.0 + np.exp(-(x @ gate.T)))
    ids = np.argsort(-(s + bias), axis=1, kind="stable")[:, :top_k]
    w = np.take_along_axis(s, ids, axis=1)
    return w / w.sum(axis=1, keepdims=True), ids


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def within_bf16_step(got, ref):
    """fp32 sums rounded once to BF16 against fp64: at most one BF16 step apart."""
    got = np.asarray(got, np.float64)
    return bool(np.all(np.abs(got - ref) <= 2.0 ** -7 * np.maximum(np.abs(ref), 1e-3)))


def nvfp4_dense(packed, scale, scale_2):
    """Dequantized NVFP4 experts [E, rows, cols] in fp64 from packed codes, linear E4M3 scales [E, bytes] and
    scale_2 [E] (the rule of include/k3.h: code * block scale * scale_2)."""
    packed, scale, scale_2 = (np.asarray(a) for a in (packed, scale, scale_2))
    e, rows = packed.shape[:2]
    codes = unpack(packed)
    sf = E4M3[scale.reshape(e, rows, -1).astype(np.int64)]
    return e2m1_value(codes) * np.repeat(sf, 16, axis=2) * scale_2.astype(np.float64).reshape(e, 1, 1)


def latent_ref(x, gate, bias, down, w13, w2, norm, up, sgu, sdn, top_k, eps=1e-5):
    """The latent-MoE block in fp64 at the library's rounding points (include/k3.h, k3_latent_moe_run), from
    BF16 / dense fp64 inputs: (out, routing weights, ids)."""
    rw, rids = router_ref(x, gate, bias, top_k)
    xl = b64(x @ down.T)
    u = moe_ref(xl, w13, w2, rw, rids)
    v = b64(b64(u / np.sqrt(np.mean(u * u, axis=1, keepdims=True) + eps)) * norm)
    shared = sdn.shape[1]
    g = b64(x @ sgu.T)
    sh = b64(b64(situ(g[:, :shared], g[:, shared:])) @ sdn.T)
    return b64(v @ up.T) + sh, rw, rids
