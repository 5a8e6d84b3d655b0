"""The numpy front end: argument checks, BF16 conversion, cached contexts and plans, the calls."""
import atexit
import ctypes
import threading

import numpy as np

from . import _capi as C

_lib, _lib_path = C.load()
C.check_layouts(_lib)
_fastcall = C.load_fastcall()  # (module, path): the compiled run calls of the torch front end; None: ctypes


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
    """A plan handle, its destroy function and one workspace per thread (numpy bytes, 64-byte aligned): ctypes lets
    go of the GIL during the call, and the C API lets threads run one plan at once, each with its own workspace."""

    def __init__(self, handle, destroy, ws_bytes):
        self.handle, self.destroy, self.ws_bytes = handle, destroy, ws_bytes
        self._local = threading.local()

    def ws_ptr(self):
        if not self.ws_bytes:
            return None
        ws = getattr(self._local, "ws", None)
        if ws is None:
            buf = np.zeros(self.ws_bytes + 64, dtype=np.uint8)
            off = (-buf.ctypes.data) % 64
            ws = self._local.ws = buf[off:off + self.ws_bytes]
        return ws.ctypes.data


def _plan(key, make):
    with _lock:
        p = _plans.get(key)
    if p is None:
        mine = make()
        with _lock:
            p = _plans.setdefault(key, mine)
        if p is not mine:  # another thread made the same plan first: keep one, free the other
            mine.destroy(mine.handle)
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
            "has_fp4_mma": bool(a.has_fp4_mma),
            "binding": "ctypes + compiled run calls (%s)" % _fastcall[1] if _fastcall else "ctypes"}


def _is_torch(a):
    return type(a).__module__.startswith("torch")


TORCH_IMPLS = {}  # "direct" and each op's implementation on torch tensors, filled by _torch*.py at package import


def _torch_call(name, tensors, *args):
    """A torch call: the implementation directly when nothing traces or intercepts the call (eager inference),
    otherwise the registered op torch.ops.k3kernels.<name> (torch.compile, export, dispatch modes, autograd). The
    table is filled once at import, so torch.compile sees no state change between calls (no recompilation)."""
    if TORCH_IMPLS["direct"](tensors):
        return TORCH_IMPLS[name](*args)
    return getattr(_torch_ops(), name)(*args)


def linear(x, weight, residual=None, out=None):
    """y = bf16(x) bf16(weight)^T (+ bf16(residual)), fp32 accumulation, one BF16 rounding. numpy: x [M, K] float32,
    weight [N, K] float32; returns (or writes into `out`, float32 [M, N]) float32 holding BF16 values. torch: bfloat16
    tensors on one device (CPU: the CPU backend; CUDA: that GPU, torch's current stream); returns bfloat16 [M, N]
    (or copies into `out`)."""
    if _is_torch(x):
        y = _torch_call("linear", (x, weight, residual), x, weight, residual)
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
        if scoring not in ("sigmoid", "softmax"):
            raise ValueError("scoring must be 'sigmoid' or 'softmax' (got %r)" % (scoring,))
        return _torch_call("router", (x, gate_weight, e_score_correction_bias), x, gate_weight,
                           e_score_correction_bias, int(top_k), bool(renormalize),
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


def _torch_ops():
    import torch
    return torch.ops.k3kernels


_QUANT = {"nvfp4": C.WEIGHT_NVFP4, "mxfp4": C.WEIGHT_MXFP4, "bf16": C.WEIGHT_BF16}
_MODES = {"w4a16": C.MOE_W4A16, "w4a4": C.MOE_W4A4}


def _expert_scale_bytes(fmt, layout, rows13, l, inter):
    """(w13, w2) block-scale bytes of one expert, as the C API counts them (k3_fp4_scale_bytes); (0, 0) for BF16."""
    if fmt == C.WEIGHT_BF16:
        return 0, 0
    f4 = C.FP4_NVFP4 if fmt == C.WEIGHT_NVFP4 else C.FP4_MXFP4
    out = []
    for rows, cols in ((rows13, l), (l, inter)):
        n = ctypes.c_size_t()
        if _lib.k3_fp4_scale_bytes(f4, layout, rows, cols, ctypes.byref(n)) != C.STATUS_SUCCESS:
            raise ValueError("the experts' [%d, %d] matrices are not a whole number of %s blocks" %
                             (rows, cols, "NVFP4 (16)" if f4 == C.FP4_NVFP4 else "MXFP4 (32)"))
        out.append(n.value)
    return tuple(out)


def _check_expert_scales(e, per_expert, scales):
    """The block scales hold exactly E times the bytes the C API reads for each expert, and the per-expert fp32
    scales have their shapes: a short buffer would be read past its end. scales: (name, shape, size) of each
    given one, in the order w13_scale, w2_scale, w13_scale_2, w2_scale_2, w13_input_scale, w2_input_scale."""
    allowed = {"w13_scale_2": [(e,), (e, 2)], "w2_scale_2": [(e,)], "w13_input_scale": [(e,)],
               "w2_input_scale": [(e,)]}
    for name, shape, size in scales:
        if name in allowed:
            if tuple(shape) not in allowed[name]:
                raise ValueError("%s must have shape %s (got %s)" % (name, " or ".join(map(str, allowed[name])),
                                                                     tuple(shape)))
            continue
        per = per_expert[0] if name == "w13_scale" else per_expert[1]
        if len(shape) < 1 or shape[0] != e or size != e * per:
            raise ValueError("%s must hold %d bytes for each of the E = %d experts, [E, %d] (got shape %s)" %
                             (name, per, e, per, tuple(shape)))


def _tokens(m):
    """The plan's max_tokens for a batch of m: a power of two of at least 16, so a few plans serve every m."""
    return max(16, 1 << (m - 1).bit_length())


def kda_proj(x, packed_weight, f_b_weight, head_dim=128):
    """Kimi-K3's KDA input projection: qkvg = x W[:Q]^T, fab = x W[Q:]^T, g1 = fab[:, :fa] f_b^T, all BF16 with
    fp32 sums (x, weights rounded to BF16). packed_weight [P, H] (rows q, k, v, g, then f_a, beta, padding),
    f_b_weight [Q / 4, fa] with Q = 4 * local_heads * head_dim. Returns (qkvg [M, Q], fab [M, P - Q], g1 [M, Q / 4]),
    float32 holding BF16 values. M <= 16. torch: bfloat16 tensors on one device (CPU: the CPU backend; CUDA: that
    GPU, torch's current stream, the aux branch forked from it and joined back by events); returns bfloat16."""
    if _is_torch(x):
        return _torch_call("kda_proj", (x, packed_weight, f_b_weight), x, packed_weight, f_b_weight, int(head_dim))
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
