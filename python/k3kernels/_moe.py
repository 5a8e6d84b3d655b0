"""The routed experts and the latent-MoE block on numpy arrays (the CPU backend) or torch tensors: fused_moe,
latent_moe, and the expert arguments' checks they share."""
import ctypes

import numpy as np

from . import _capi as C
from ._ops import (TORCH_IMPLS, _MODES, _QUANT, _array, _bf16_rows, _bf16_to_f32, _check, _check_expert_scales,
                   _cpu_ctx, _expert_scale_bytes, _f32_to_bf16, _is_torch, _layout, _lib, _make_plan, _p, _plan,
                   _tokens, _torch_call)


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
        _check_expert_scales(e, _expert_scale_bytes(fmt, d.scale_layout, rows13, l, inter),
                             [("w13_scale", s13.shape, s13.size), ("w2_scale", s2.shape, s2.size)])
    w = C.MoeWeights(_p(w13p), _p(s13), _p(s13_2), _p(in13), _p(w2p), _p(s2), _p(s2_2), _p(in2))
    key = (e, k, l, inter, fmt, d.scale_layout, d.w13_separate_scale_2, d.mode, activation, float(situ_beta),
           float(situ_linear_beta), max_tokens)
    return d, w, keep, key


def fused_moe(hidden_states, w13, w2, topk_weights, topk_ids, *, quant="nvfp4", w13_scale=None, w13_scale_2=None,
              w2_scale=None, w2_scale_2=None, scale_layout="linear", activation="situ", situ_beta=4.0,
              situ_linear_beta=25.0, mode="w4a16", w13_input_scale=None, w2_input_scale=None):
    """The routed experts: out[t] = bf16(sum_j w_j W2_e(act(bf16(W13_e x_t)))), e = topk_ids[t, j], fp32 sums.
    hidden_states [M, L] float32 (rounded to BF16); w13 = [gate; up]: packed uint8 [E, 2I, L/2] (nvfp4, mxfp4) or
    float32 [E, 2I, L] (bf16, rounded); w2 [E, L, I/2] or [E, L, I]; scales per expert as quantize_* returns them
    (w13_scale [E, bytes], w13_scale_2 [E] or [E, 2] (gate, up)); topk_ids int32 [M, k] (an id outside [0, E),
    such as -1 for an expert on another rank, drops its slot), topk_weights float32 [M, k]. Returns float32 [M, L]
    holding BF16 values. torch: hidden_states bfloat16, weights uint8 (packed) or bfloat16, scales uint8 / float32,
    topk_ids int32, topk_weights float32, all on one device; returns bfloat16."""
    if _is_torch(hidden_states):
        return TORCH_IMPLS["fused_moe_eager"](hidden_states, w13, w2, topk_weights, topk_ids, quant, w13_scale,
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
    [H, Is], same activation) and the residual, added to the up projection's fp32 sums as one BF16 term (their sum
    rounded once) before its one BF16 rounding (docs/model.md section 4). hidden_states [M, H] float32;
    gate_weight [E, H] (F32); down_proj [L, H]; norm_weight [L]; up_proj [H, L]; experts as fused_moe. Returns
    (out [M, H], topk_weights [M, k], topk_ids [M, k]). torch: bfloat16 tensors (gate_weight bfloat16 or float32,
    packed experts uint8, scales uint8 / float32) on one device; returns tensors there."""
    if _is_torch(hidden_states):
        return _torch_call("latent_moe", (hidden_states, gate_weight, e_score_correction_bias, down_proj, w13, w2,
                                          norm_weight, up_proj, shared_gate_up, shared_down, residual, w13_scale,
                                          w13_scale_2, w2_scale, w2_scale_2),
                           hidden_states, gate_weight, e_score_correction_bias, down_proj, w13, w2, norm_weight,
                           up_proj, shared_gate_up, shared_down, residual, int(top_k), bool(renormalize),
                           float(routed_scaling_factor), quant, w13_scale, w13_scale_2, w2_scale, w2_scale_2,
                           scale_layout, activation, float(situ_beta), float(situ_linear_beta), float(rms_eps))
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
