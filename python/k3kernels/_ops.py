"""The numpy front end: argument checks, BF16 conversion, cached contexts and plans, the calls."""
import atexit
import ctypes
import threading

import numpy as np

from . import _capi as C

_lib, _lib_path = C.load()
C.check_layouts(_lib)


class K3Error(RuntimeError):
    """A failure reported by the library: the status and k3_ctx_last_error's message."""

    def __init__(self, status, message):
        super().__init__("%s: %s" % (_lib.k3_status_string(status).decode(), message))
        self.status = status


# ---------------------------------------------------------------- contexts and plans (cached, freed at exit)
_lock = threading.Lock()
_ctx = None
_plans = {}


def _cpu_ctx():
    global _ctx
    with _lock:
        if _ctx is None:
            opt = C.CtxOptions()
            _lib.k3_ctx_options_init(ctypes.byref(opt))
            opt.backend = C.BACKEND_CPU
            h = ctypes.c_void_p()
            st = _lib.k3_ctx_create(ctypes.byref(opt), ctypes.byref(h))
            if st != C.STATUS_SUCCESS:
                raise K3Error(st, "cannot create a CPU context")
            _ctx = h
        return _ctx


def _check(st, ctx):
    if st != C.STATUS_SUCCESS:
        raise K3Error(st, _lib.k3_ctx_last_error(ctx).decode(errors="replace"))


class _Plan:
    """A plan handle, its workspace (numpy bytes, 64-byte aligned) and its destroy function."""

    def __init__(self, handle, destroy, ws_bytes):
        self.handle, self.destroy, self.ws_bytes = handle, destroy, ws_bytes
        self._buf = np.zeros(ws_bytes + 64, dtype=np.uint8)
        off = (-self._buf.ctypes.data) % 64
        self.ws = self._buf[off:off + ws_bytes] if ws_bytes else None

    def ws_ptr(self):
        return self.ws.ctypes.data if self.ws is not None else None


def _plan(key, make):
    with _lock:
        p = _plans.get(key)
    if p is None:
        p = make()
        with _lock:
            p = _plans.setdefault(key, p)
    return p


@atexit.register
def _free_all():
    global _ctx
    with _lock:
        for p in _plans.values():
            p.destroy(p.handle)
        _plans.clear()
        if _ctx is not None:
            _lib.k3_ctx_destroy(_ctx)
            _ctx = None


def _make_plan(ctx, create, destroy, wsize, desc):
    h = ctypes.c_void_p()
    _check(create(ctx, ctypes.byref(desc), ctypes.byref(h)), ctx)
    n = ctypes.c_size_t()
    st = wsize(h, ctypes.byref(n))
    if st != C.STATUS_SUCCESS:
        destroy(h)
        _check(st, ctx)
    return _Plan(h, destroy, n.value)


# ---------------------------------------------------------------- conversions and argument checks
def round_bf16(x):
    """float32 -> float32 holding the nearest BF16 value (ties to even; NaN stays NaN)."""
    return _bf16_to_f32(_f32_to_bf16(np.asarray(x, dtype=np.float32)))


def _f32_to_bf16(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    r[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)  # quiet NaN, sign kept
    return r


def _bf16_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _array(name, a, ndim, dtype_kind, dtype=None):
    if not isinstance(a, np.ndarray):
        raise TypeError("%s must be a numpy array (got %s)" % (name, type(a).__name__))
    if a.ndim not in (ndim if isinstance(ndim, tuple) else (ndim,)):
        raise ValueError("%s must have %s dimensions (got shape %s)" % (name, ndim, a.shape))
    if dtype is not None and a.dtype != dtype:
        raise TypeError("%s must be %s (got %s)" % (name, np.dtype(dtype).name, a.dtype))
    if dtype is None and a.dtype.kind not in dtype_kind:
        raise TypeError("%s must be a float array (got %s)" % (name, a.dtype))
    return np.ascontiguousarray(a)


def _bf16_rows(name, a, shape):
    """An optional float32 array of exactly `shape` (a residual), as BF16 bits; None stays None."""
    if a is None:
        return None
    a = _array(name, a, 2, "f")
    if a.shape != shape:
        raise ValueError("%s must be of shape %s (got %s)" % (name, shape, a.shape))
    return _f32_to_bf16(a)


def _p(a):
    return None if a is None else a.ctypes.data


# ---------------------------------------------------------------- the functions
def info():
    """The facts of `k3 info --json`: version, backend, device, capability, architecture table."""
    ctx = _cpu_ctx()
    a = C.ArchInfo()
    _check(_lib.k3_ctx_arch(ctx, ctypes.byref(a)), ctx)
    return {"version": _lib.k3_version().decode(), "library": _lib_path, "backend": "cpu",
            "device": a.device_name.decode(), "capability": "%d.%d" % (a.cc_major, a.cc_minor),
            "table": _lib.k3_table_name(a.table).decode(), "has_mixed_bf16_fma": bool(a.has_mixed_bf16_fma),
            "has_fp4_mma": bool(a.has_fp4_mma)}


def _is_torch(a):
    return type(a).__module__.startswith("torch")


def linear(x, weight, residual=None, out=None):
    """y = bf16(x) bf16(weight)^T (+ bf16(residual)), fp32 accumulation, one BF16 rounding. numpy: x [M, K] float32,
    weight [N, K] float32; returns (or writes into `out`, float32 [M, N]) float32 holding BF16 values. torch: bfloat16
    tensors on one device (CPU: the CPU backend; CUDA: that GPU, torch's current stream); returns bfloat16 [M, N]
    (or copies into `out`)."""
    if _is_torch(x):
        import torch
        y = torch.ops.k3kernels.linear(x, weight, residual)
        if out is not None:
            out.copy_(y)
            return out
        return y
    x = _array("x", x, 2, "f")
    weight = _array("weight", weight, 2, "f")
    m, k = x.shape
    n, k2 = weight.shape
    if k != k2:
        raise ValueError("weight must be [N, K] with K = x.shape[1] = %d (got %s)" % (k, weight.shape))
    if m < 1:
        raise ValueError("x must have at least one row")
    xb, wb = _f32_to_bf16(x), _f32_to_bf16(weight)
    rb = _bf16_rows("residual", residual, (m, n))
    if out is not None and (not isinstance(out, np.ndarray) or out.shape != (m, n) or out.dtype != np.float32 or
                            not out.flags.c_contiguous):
        raise ValueError("out must be a C-contiguous float32 array of shape [%d, %d]" % (m, n))
    ctx = _cpu_ctx()

    def make():
        d = C.LinearDesc()
        _lib.k3_linear_desc_init(ctypes.byref(d), n, k)
        d.max_m = 32
        return _make_plan(ctx, _lib.k3_linear_plan_create, _lib.k3_linear_plan_destroy, _lib.k3_linear_workspace_size,
                          d)

    plan = _plan(("linear", n, k), make)
    y = np.empty((m, n), dtype=np.uint16)
    for r0 in range(0, m, 32):  # the plan takes up to 32 tokens a call
        r1 = min(m, r0 + 32)
        res = rb[r0:r1] if rb is not None else None
        _check(_lib.k3_linear_run(plan.handle, r1 - r0, _p(xb[r0:r1]), _p(wb), _p(res), _p(y[r0:r1]), plan.ws_ptr(),
                                  plan.ws_bytes, None), ctx)
    yf = _bf16_to_f32(y).reshape(m, n)
    if out is not None:
        out[...] = yf
        return out
    return yf


def router(x, gate_weight, e_score_correction_bias=None, top_k=16, renormalize=True, routed_scaling_factor=1.0,
           scoring="sigmoid"):
    """Kimi-K3's router: logits = bf16(x) gate^T in fp32, then sigmoid with the correction bias for the choice
    (scoring "sigmoid", noaux_tc) or softmax; top-k. x [M, H] float32 (rounded to BF16), gate_weight [E, H] float32
    (used as F32, not rounded). Returns (topk_weights float32 [M, k], topk_ids int32 [M, k]). torch: x bfloat16,
    gate_weight bfloat16 or float32, the bias float32, all on one device; returns tensors there."""
    if _is_torch(x):
        import torch
        if scoring not in ("sigmoid", "softmax"):
            raise ValueError("scoring must be 'sigmoid' or 'softmax' (got %r)" % (scoring,))
        return torch.ops.k3kernels.router(x, gate_weight, e_score_correction_bias, int(top_k), bool(renormalize),
                                          float(routed_scaling_factor), scoring == "softmax")
    x = _array("x", x, 2, "f")
    gate_weight = _array("gate_weight", gate_weight, 2, "f").astype(np.float32, copy=False)
    m, h = x.shape
    e, h2 = gate_weight.shape
    if h != h2:
        raise ValueError("gate_weight must be [E, H] with H = x.shape[1] = %d (got %s)" % (h, gate_weight.shape))
    if scoring not in ("sigmoid", "softmax"):
        raise ValueError("scoring must be 'sigmoid' or 'softmax' (got %r)" % (scoring,))
    if not isinstance(top_k, int) or not 1 <= top_k <= min(e, 32):
        raise ValueError("top_k must be an int in [1, min(E, 32)] = [1, %d] (got %r)" % (min(e, 32), top_k))
    bias = None
    if e_score_correction_bias is not None:
        if scoring != "sigmoid":
            raise ValueError("e_score_correction_bias is used by scoring='sigmoid' only")
        bias = _array("e_score_correction_bias", e_score_correction_bias, 1, "f").astype(np.float32, copy=False)
        if bias.shape != (e,):
            raise ValueError("e_score_correction_bias must be [E] = [%d] (got %s)" % (e, bias.shape))
    ctx = _cpu_ctx()
    kind = C.ROUTER_SIGMOID_NOAUX_TC if scoring == "sigmoid" else C.ROUTER_SOFTMAX
    max_tokens = max(16, 1 << (m - 1).bit_length())

    def make():
        d = C.RouterDesc()
        _lib.k3_router_desc_init(ctypes.byref(d))
        d.kind, d.num_experts, d.top_k, d.hidden = kind, e, top_k, h
        d.gate_dtype, d.renormalize, d.scaling_factor, d.max_tokens = (C.DTYPE_F32, 1 if renormalize else 0,
                                                                      float(routed_scaling_factor), max_tokens)
        return _make_plan(ctx, _lib.k3_router_plan_create, _lib.k3_router_plan_destroy, _lib.k3_router_workspace_size,
                          d)

    plan = _plan(("router", kind, e, top_k, h, bool(renormalize), float(routed_scaling_factor), max_tokens), make)
    xb = _f32_to_bf16(x)
    ids = np.empty((m, top_k), dtype=np.int32)
    wts = np.empty((m, top_k), dtype=np.float32)
    _check(_lib.k3_router_run(plan.handle, m, _p(xb), _p(gate_weight), _p(bias), _p(ids), _p(wts), plan.ws_ptr(),
                              plan.ws_bytes, None), ctx)
    return wts, ids


_LAYOUTS = {"linear": C.SCALE_LINEAR, "swizzled": C.SCALE_SWIZZLED}


def _layout(scale_layout):
    if scale_layout not in _LAYOUTS:
        raise ValueError("scale_layout must be 'linear' or 'swizzled' (got %r)" % (scale_layout,))
    return _LAYOUTS[scale_layout]


def _quantize(fmt, x, scale_layout):
    x = _array("x", x, (2, 3), "f").astype(np.float32, copy=False)
    lay = _layout(scale_layout)
    batch, rows, cols = (1,) + x.shape if x.ndim == 2 else x.shape
    block = 16 if fmt == C.FP4_NVFP4 else 32
    if cols % block:
        raise ValueError("x's last dimension must be a multiple of %d (got %d)" % (block, cols))
    sb = ctypes.c_size_t()
    st = _lib.k3_fp4_scale_bytes(fmt, lay, rows, cols, ctypes.byref(sb))
    if st != C.STATUS_SUCCESS:
        raise K3Error(st, "cannot size the block scales of [%d, %d]" % (rows, cols))
    packed = np.empty(x.shape[:-1] + (cols // 2,), dtype=np.uint8)
    scales = np.empty((batch, sb.value), dtype=np.uint8)
    gs = np.empty(batch, dtype=np.float32) if fmt == C.FP4_NVFP4 else None
    st = _lib.k3_fp4_quantize(fmt, lay, batch, rows, cols, _p(x), _p(packed), _p(scales), _p(gs))
    if st != C.STATUS_SUCCESS:
        raise K3Error(st, "k3_fp4_quantize refused x (NaN or Inf in x?)")
    if x.ndim == 2:
        scales = scales[0]
        if gs is not None:
            gs = gs[0:1]
    return packed, scales, gs


def _dequantize(fmt, packed, scale, scale_2, scale_layout):
    packed = _array("packed", packed, (2, 3), "u", np.uint8)
    scale = _array("scale", scale, (1, 2), "u", np.uint8)
    lay = _layout(scale_layout)
    batch, rows, half = (1,) + packed.shape if packed.ndim == 2 else packed.shape
    cols = half * 2
    sb = ctypes.c_size_t()
    st = _lib.k3_fp4_scale_bytes(fmt, lay, rows, cols, ctypes.byref(sb))
    if st != C.STATUS_SUCCESS:
        raise ValueError("packed's shape %s does not have whole %s blocks" % (packed.shape, "NVFP4" if
                                                                               fmt == C.FP4_NVFP4 else "MXFP4"))
    if scale.size != batch * sb.value:
        raise ValueError("scale must hold %d bytes per matrix for this shape and layout (got %d in all for %d)" %
                         (sb.value, scale.size, batch))
    gs = None
    if fmt == C.FP4_NVFP4:
        if scale_2 is None:
            raise ValueError("scale_2 is required for NVFP4 (the per-matrix global scale 1/gs)")
        gs = np.ascontiguousarray(np.asarray(scale_2, dtype=np.float32).reshape(-1))
        if gs.size != batch:
            raise ValueError("scale_2 must hold one value per matrix (%d; got %d)" % (batch, gs.size))
    out = np.empty(packed.shape[:-1] + (cols,), dtype=np.float32)
    st = _lib.k3_fp4_dequantize(fmt, lay, batch, rows, cols, _p(packed), _p(scale), _p(gs), _p(out))
    if st != C.STATUS_SUCCESS:
        raise K3Error(st, "k3_fp4_dequantize refused its arguments")
    return out


def quantize_nvfp4(x, scale_layout="linear"):
    """x [rows, cols] or [batch, rows, cols] float32 -> (packed uint8 [..., cols/2], scale uint8 (E4M3 codes, per
    matrix), scale_2 float32 [batch] (1/gs, ModelOpt's weight_scale_2))."""
    return _quantize(C.FP4_NVFP4, x, scale_layout)


def quantize_mxfp4(x, scale_layout="linear"):
    """x float32 -> (packed uint8, scale uint8 (UE8M0 codes)); no global scale."""
    packed, scales, _ = _quantize(C.FP4_MXFP4, x, scale_layout)
    return packed, scales


def dequantize_nvfp4(packed, scale, scale_2, scale_layout="linear"):
    """The inverse of quantize_nvfp4: float32 code * block scale * scale_2."""
    return _dequantize(C.FP4_NVFP4, packed, scale, scale_2, scale_layout)


def dequantize_mxfp4(packed, scale, scale_layout="linear"):
    """The inverse of quantize_mxfp4."""
    return _dequantize(C.FP4_MXFP4, packed, scale, None, scale_layout)


_QUANT = {"nvfp4": C.WEIGHT_NVFP4, "mxfp4": C.WEIGHT_MXFP4, "bf16": C.WEIGHT_BF16}
_MODES = {"w4a16": C.MOE_W4A16, "w4a4": C.MOE_W4A4}


def _experts(l, w13, w2, k, quant, w13_scale, w13_scale_2, w2_scale, w2_scale_2, scale_layout, activation, situ_beta,
             situ_linear_beta, mode, w13_input_scale, w2_input_scale, max_tokens):
    """The routed experts' arguments checked and converted: (a filled MoeDesc, MoeWeights, the arrays they point
    at, which must outlive the call, the plan cache key)."""
    if quant not in _QUANT:
        raise ValueError("quant must be one of %s (got %r)" % (sorted(_QUANT), quant))
    if activation not in C.ACT:
        raise ValueError("activation must be one of %s (got %r)" % (sorted(C.ACT), activation))
    if mode not in _MODES:
        raise ValueError("mode must be 'w4a16' or 'w4a4' (got %r)" % (mode,))
    fmt = _QUANT[quant]
    width = 1 if activation == "relu2_no_mul" else 2
    if fmt == C.WEIGHT_BF16:
        w13 = _array("w13", w13, 3, "f")
        w2 = _array("w2", w2, 3, "f")
        e, rows13, l13 = w13.shape
        if l13 != l:
            raise ValueError("w13 must be [E, %dI, L] with L = %d (got %s)" % (width, l, w13.shape))
        inter = rows13 // width
        if rows13 != width * inter or w2.shape != (e, l, inter):
            raise ValueError("w2 must be [E, L, I] = [%d, %d, %d] (got %s)" % (e, l, inter, w2.shape))
        w13p, w2p = _f32_to_bf16(w13), _f32_to_bf16(w2)
    else:
        w13p = _array("w13", w13, 3, "u", np.uint8)
        w2p = _array("w2", w2, 3, "u", np.uint8)
        e, rows13, half = w13p.shape
        if half * 2 != l:
            raise ValueError("w13 must be packed [E, %dI, L/2] with L = %d (got %s)" % (width, l, w13p.shape))
        inter = rows13 // width
        if rows13 != width * inter or w2p.shape != (e, l, inter // 2):
            raise ValueError("w2 must be packed [E, L, I/2] = [%d, %d, %d] (got %s)" % (e, l, inter // 2, w2p.shape))
        for name, sc in (("w13_scale", w13_scale), ("w2_scale", w2_scale)):
            if sc is None:
                raise ValueError("%s is required for quant=%r" % (name, quant))
    d = C.MoeDesc()
    _lib.k3_moe_desc_init(ctypes.byref(d))
    d.num_experts, d.top_k, d.hidden, d.inter, d.format = e, k, l, inter, fmt
    d.scale_layout, d.mode, d.max_tokens = _layout(scale_layout), _MODES[mode], max_tokens
    _lib.k3_act_desc_init(ctypes.byref(d.act), C.ACT[activation])
    if activation == "situ":
        d.act.situ_beta, d.act.situ_linear_beta = float(situ_beta), float(situ_linear_beta)
    keep = [w13p, w2p]

    def f32(name, a, shapes):
        if a is None:
            return None
        a = np.ascontiguousarray(np.asarray(a, dtype=np.float32))
        if a.shape not in shapes:
            raise ValueError("%s must have shape %s (got %s)" % (name, " or ".join(map(str, shapes)), a.shape))
        keep.append(a)
        return a

    s13_2 = s2_2 = in13 = in2 = s13 = s2 = None
    if fmt == C.WEIGHT_NVFP4:
        if w13_scale_2 is None or w2_scale_2 is None:
            raise ValueError("w13_scale_2 and w2_scale_2 are required for quant='nvfp4'")
        s13_2 = f32("w13_scale_2", w13_scale_2, [(e,), (e, 2)])
        d.w13_separate_scale_2 = 1 if s13_2.ndim == 2 else 0
        s2_2 = f32("w2_scale_2", w2_scale_2, [(e,)])
    if mode == "w4a4":
        in13 = f32("w13_input_scale", w13_input_scale, [(e,)])
        in2 = f32("w2_input_scale", w2_input_scale, [(e,)])
    if fmt != C.WEIGHT_BF16:
        s13 = np.ascontiguousarray(np.asarray(w13_scale, dtype=np.uint8))
        s2 = np.ascontiguousarray(np.asarray(w2_scale, dtype=np.uint8))
        keep += [s13, s2]
    w = C.MoeWeights(_p(w13p), _p(s13), _p(s13_2), _p(in13), _p(w2p), _p(s2), _p(s2_2), _p(in2))
    key = (e, k, l, inter, fmt, d.scale_layout, d.w13_separate_scale_2, d.mode, activation, float(situ_beta),
           float(situ_linear_beta), max_tokens)
    return d, w, keep, key


def _tokens(m):
    """The plan's max_tokens for a batch of m: a power of two of at least 16, so a few plans serve every m."""
    return max(16, 1 << (m - 1).bit_length())


def fused_moe(hidden_states, w13, w2, topk_weights, topk_ids, *, quant="nvfp4", w13_scale=None, w13_scale_2=None,
              w2_scale=None, w2_scale_2=None, scale_layout="linear", activation="situ", situ_beta=4.0,
              situ_linear_beta=25.0, mode="w4a16", w13_input_scale=None, w2_input_scale=None):
    """The routed experts: out[t] = bf16(sum_j w_j W2_e(act(bf16(W13_e x_t)))), e = topk_ids[t, j], fp32 sums.
    hidden_states [M, L] float32 (rounded to BF16); w13 = [gate; up]: packed uint8 [E, 2I, L/2] (nvfp4, mxfp4) or
    float32 [E, 2I, L] (bf16, rounded); w2 [E, L, I/2] or [E, L, I]; scales per expert as quantize_* returns them
    (w13_scale [E, bytes], w13_scale_2 [E] or [E, 2] (gate, up)); topk_ids int32 [M, k] (an id outside [0, E),
    such as -1 for an expert on another rank, drops its slot), topk_weights float32 [M, k]. Returns float32
    [M, L] holding BF16 values. torch: hidden_states bfloat16, weights uint8 (packed) or bfloat16, scales uint8 /
    float32, topk_ids int32, topk_weights float32, all on one device; returns bfloat16."""
    if _is_torch(hidden_states):
        import torch
        return torch.ops.k3kernels.fused_moe(hidden_states, w13, w2, topk_weights, topk_ids, quant, w13_scale,
                                             w13_scale_2, w2_scale, w2_scale_2, scale_layout, activation,
                                             float(situ_beta), float(situ_linear_beta), mode, w13_input_scale,
                                             w2_input_scale)
    x = _array("hidden_states", hidden_states, 2, "f")
    ids = _array("topk_ids", topk_ids, 2, "i", np.int32)
    wts = _array("topk_weights", topk_weights, 2, "f", np.float32)
    m, l = x.shape
    if ids.shape != wts.shape or ids.shape[0] != m:
        raise ValueError("topk_ids and topk_weights must both be [M, k] with M = %d (got %s and %s)" %
                         (m, ids.shape, wts.shape))
    d, w, keep, key = _experts(l, w13, w2, ids.shape[1], quant, w13_scale, w13_scale_2, w2_scale, w2_scale_2,
                               scale_layout, activation, situ_beta, situ_linear_beta, mode, w13_input_scale,
                               w2_input_scale, _tokens(m))
    ctx = _cpu_ctx()
    plan = _plan(("moe",) + key, lambda: _make_plan(ctx, _lib.k3_moe_plan_create, _lib.k3_moe_plan_destroy,
                                                    _lib.k3_moe_workspace_size, d))
    xb = _f32_to_bf16(x)
    out = np.empty((m, l), dtype=np.uint16)
    _check(_lib.k3_moe_run(plan.handle, m, _p(xb), _p(ids), _p(wts), ctypes.byref(w), _p(out), None, plan.ws_ptr(),
                           plan.ws_bytes, None), ctx)
    del keep
    return _bf16_to_f32(out).reshape(m, l)


def latent_moe(hidden_states, gate_weight, down_proj, w13, w2, norm_weight, up_proj, *, e_score_correction_bias=None,
               shared_gate_up=None, shared_down=None, residual=None, top_k=16, renormalize=True,
               routed_scaling_factor=1.0, quant="nvfp4", w13_scale=None, w13_scale_2=None, w2_scale=None,
               w2_scale_2=None, scale_layout="linear", activation="situ", situ_beta=4.0, situ_linear_beta=25.0,
               rms_eps=1e-5):
    """Kimi-K3's latent-MoE block: the router on x, the down projection to the latent width L, the routed experts
    summed in fp32 (u), RMSNorm(u), the up projection back to H, plus the shared experts (gate_up [2Is, H], down
    [H, Is], same activation) and the residual, one BF16 rounding at the end. hidden_states [M, H] float32;
    gate_weight [E, H] (F32); down_proj [L, H]; norm_weight [L]; up_proj [H, L]; experts as fused_moe. Returns
    (out [M, H], topk_weights [M, k], topk_ids [M, k]). torch: bfloat16 tensors (gate_weight bfloat16 or float32,
    packed experts uint8, scales uint8 / float32) on one device; returns tensors there."""
    if _is_torch(hidden_states):
        import torch
        return torch.ops.k3kernels.latent_moe(hidden_states, gate_weight, e_score_correction_bias, down_proj, w13, w2,
                                              norm_weight, up_proj, shared_gate_up, shared_down, residual, int(top_k),
                                              bool(renormalize), float(routed_scaling_factor), quant, w13_scale,
                                              w13_scale_2, w2_scale, w2_scale_2, scale_layout, activation,
                                              float(situ_beta), float(situ_linear_beta), float(rms_eps))
    x = _array("hidden_states", hidden_states, 2, "f")
    m, h = x.shape
    gate = _array("gate_weight", gate_weight, 2, "f").astype(np.float32, copy=False)
    down = _array("down_proj", down_proj, 2, "f")
    norm = _array("norm_weight", norm_weight, 1, "f")
    up = _array("up_proj", up_proj, 2, "f")
    l = down.shape[0]
    if gate.shape[1] != h or down.shape != (l, h) or norm.shape != (l,) or up.shape != (h, l):
        raise ValueError("gate_weight [E, H], down_proj [L, H], norm_weight [L] and up_proj [H, L] must agree with "
                         "hidden_states [M, H = %d] (got %s, %s, %s, %s)" % (h, gate.shape, down.shape, norm.shape,
                                                                             up.shape))
    e = gate.shape[0]
    if not isinstance(top_k, int) or not 1 <= top_k <= min(e, 32):
        raise ValueError("top_k must be an int in [1, min(E, 32)] = [1, %d] (got %r)" % (min(e, 32), top_k))
    if (shared_gate_up is None) != (shared_down is None):
        raise ValueError("shared_gate_up and shared_down come together (both or neither)")
    bias = None
    if e_score_correction_bias is not None:
        bias = _array("e_score_correction_bias", e_score_correction_bias, 1, "f").astype(np.float32, copy=False)
        if bias.shape != (e,):
            raise ValueError("e_score_correction_bias must be [E] = [%d] (got %s)" % (e, bias.shape))
    max_tokens = _tokens(m)
    dm, wm, keep, key = _experts(l, w13, w2, top_k, quant, w13_scale, w13_scale_2, w2_scale, w2_scale_2,
                                 scale_layout, activation, situ_beta, situ_linear_beta, "w4a16", None, None,
                                 max_tokens)
    if dm.num_experts != e:
        raise ValueError("w13 holds %d experts, gate_weight %d" % (dm.num_experts, e))
    width = 1 if activation == "relu2_no_mul" else 2
    sgu = sdn = None
    shared_inter = 0
    if shared_gate_up is not None:
        sgu = _array("shared_gate_up", shared_gate_up, 2, "f")
        sdn = _array("shared_down", shared_down, 2, "f")
        shared_inter = sgu.shape[0] // width
        if sgu.shape != (width * shared_inter, h) or sdn.shape != (h, shared_inter) or shared_inter < 1:
            raise ValueError("shared_gate_up must be [%dIs, H] and shared_down [H, Is] (got %s and %s)" %
                             (width, sgu.shape, sdn.shape))
        sgu, sdn = _f32_to_bf16(sgu), _f32_to_bf16(sdn)
    rb = _bf16_rows("residual", residual, (m, h))
    d = C.LatentMoeDesc()
    _lib.k3_latent_moe_desc_init(ctypes.byref(d))
    d.hidden = h
    d.router.num_experts, d.router.top_k, d.router.hidden, d.router.gate_dtype = e, top_k, h, C.DTYPE_F32
    d.router.renormalize, d.router.scaling_factor = 1 if renormalize else 0, float(routed_scaling_factor)
    d.router.max_tokens = max_tokens
    d.experts = dm
    d.shared_inter = shared_inter
    d.shared_act = dm.act
    d.rms_eps, d.max_tokens = float(rms_eps), max_tokens
    ctx = _cpu_ctx()
    plan = _plan(("latent", h, e, top_k, bool(renormalize), float(routed_scaling_factor), shared_inter,
                  float(rms_eps)) + key,
                 lambda: _make_plan(ctx, _lib.k3_latent_moe_plan_create, _lib.k3_latent_moe_plan_destroy,
                                    _lib.k3_latent_moe_workspace_size, d))
    downb, normb, upb = _f32_to_bf16(down), _f32_to_bf16(norm), _f32_to_bf16(up)
    lw = C.LatentMoeWeights(_p(gate), _p(bias), _p(downb), wm, _p(normb), _p(upb), _p(sgu), _p(sdn))
    xb = _f32_to_bf16(x)
    y = np.empty((m, h), np.uint16)
    ids = np.empty((m, top_k), np.int32)
    wts = np.empty((m, top_k), np.float32)
    _check(_lib.k3_latent_moe_run(plan.handle, m, _p(xb), ctypes.byref(lw), _p(rb), _p(y), _p(ids), _p(wts),
                                  plan.ws_ptr(), plan.ws_bytes, None), ctx)
    del keep
    return _bf16_to_f32(y).reshape(m, h), wts, ids

def kda_proj(x, packed_weight, f_b_weight, head_dim=128):
    """Kimi-K3's KDA input projection: qkvg = x W[:Q]^T, fab = x W[Q:]^T, g1 = fab[:, :fa] f_b^T, all BF16 with
    fp32 sums (x, weights rounded to BF16). packed_weight [P, H] (rows q, k, v, g, then f_a, beta, padding),
    f_b_weight [Q / 4, fa] with Q = 4 * local_heads * head_dim. Returns (qkvg [M, Q], fab [M, P - Q], g1 [M, Q / 4]),
    float32 holding BF16 values. M <= 16."""
    x = _array("x", x, 2, "f")
    packed_weight = _array("packed_weight", packed_weight, 2, "f")
    f_b_weight = _array("f_b_weight", f_b_weight, 2, "f")
    m, h = x.shape
    p, h2 = packed_weight.shape
    g, fa = f_b_weight.shape
    if h2 != h:
        raise ValueError("packed_weight must be [P, H] with H = x.shape[1] = %d (got %s)" % (h, packed_weight.shape))
    if not isinstance(head_dim, int) or head_dim < 1 or g % head_dim:
        raise ValueError("f_b_weight must be [local_heads * head_dim, fa] with head_dim = %r (got %s)" %
                         (head_dim, f_b_weight.shape))
    if not 1 <= m <= 16:
        raise ValueError("x must have 1 to 16 rows (got %d)" % m)
    q = 4 * g
    if p <= q:
        raise ValueError("packed_weight must have more than 4 * f_b rows = %d rows (got %d)" % (q, p))
    ctx = _cpu_ctx()

    def make():
        d = C.KdaProjDesc()
        _lib.k3_kda_proj_desc_init(ctypes.byref(d))
        d.hidden, d.local_heads, d.head_dim, d.fa_dim, d.packed_rows, d.max_tokens = h, g // head_dim, head_dim, fa, p, 16
        return _make_plan(ctx, _lib.k3_kda_proj_plan_create, _lib.k3_kda_proj_plan_destroy,
                          _lib.k3_kda_proj_workspace_size, d)

    plan = _plan(("kda", h, g // head_dim, head_dim, fa, p), make)
    xb, wb, fb = _f32_to_bf16(x), _f32_to_bf16(packed_weight), _f32_to_bf16(f_b_weight)
    qkvg = np.empty((m, q), np.uint16)
    fab = np.empty((m, p - q), np.uint16)
    g1 = np.empty((m, g), np.uint16)
    _check(_lib.k3_kda_proj_run(plan.handle, m, _p(xb), _p(wb), _p(fb), _p(qkvg), _p(fab), _p(g1), plan.ws_ptr(),
                                plan.ws_bytes, None), ctx)
    return (_bf16_to_f32(qkvg).reshape(m, q), _bf16_to_f32(fab).reshape(m, p - q), _bf16_to_f32(g1).reshape(m, g))
