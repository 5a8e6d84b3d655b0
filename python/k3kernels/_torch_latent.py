"""k3kernels::latent_moe: Kimi-K3's latent-MoE block on torch tensors (CPU backend for CPU tensors, the CUDA
backend on the tensor's device and torch's current stream), with a fake implementation for torch.compile."""
import ctypes
from typing import Optional, Tuple

import torch

from . import _capi as C
from . import _ops as O
from ._torch import _device_key, _make, _plan, _ptr, _stream, _t, _ws

_lib = O._lib


def latent_moe_impl(x, gate_weight, bias, down_proj, w13, w2, norm_weight, up_proj, shared_gate_up, shared_down,
                    residual, top_k, renormalize, routed_scaling_factor, quant, w13_scale, w13_scale_2, w2_scale,
                    w2_scale_2, scale_layout, activation, situ_beta, situ_linear_beta, rms_eps):
    dev = _device_key(x)
    _t("hidden_states", x, torch.bfloat16, 2, dev)
    m, h = x.shape
    if gate_weight.dtype not in (torch.bfloat16, torch.float32):
        raise TypeError("gate_weight must be bfloat16 or float32 (got %s)" % gate_weight.dtype)
    _t("gate_weight", gate_weight, gate_weight.dtype, 2, dev)
    for name, t, nd in (("down_proj", down_proj, 2), ("norm_weight", norm_weight, 1), ("up_proj", up_proj, 2)):
        _t(name, t, torch.bfloat16, nd, dev)
    l = down_proj.shape[0]
    e = gate_weight.shape[0]
    if (tuple(gate_weight.shape) != (e, h) or tuple(down_proj.shape) != (l, h) or tuple(norm_weight.shape) != (l,) or
            tuple(up_proj.shape) != (h, l)):
        raise ValueError("gate_weight [E, H], down_proj [L, H], norm_weight [L], up_proj [H, L] must agree with "
                         "hidden_states [M, H = %d]" % h)
    if (shared_gate_up is None) != (shared_down is None):
        raise ValueError("shared_gate_up and shared_down come together (both or neither)")
    width = 1 if activation == "relu2_no_mul" else 2
    shared_inter = 0
    if shared_gate_up is not None:
        _t("shared_gate_up", shared_gate_up, torch.bfloat16, 2, dev)
        _t("shared_down", shared_down, torch.bfloat16, 2, dev)
        shared_inter = shared_down.shape[1]
        if tuple(shared_gate_up.shape) != (width * shared_inter, h) or tuple(shared_down.shape) != (h, shared_inter):
            raise ValueError("shared_gate_up must be [%dIs, H] and shared_down [H, Is]" % width)
    if bias is not None:
        _t("e_score_correction_bias", bias, torch.float32, 1, dev)
        if bias.shape[0] != e:
            raise ValueError("e_score_correction_bias must be [E] = [%d] (got %s)" % (e, tuple(bias.shape)))
    if residual is not None:
        _t("residual", residual, torch.bfloat16, 2, dev)
        if residual.shape != x.shape:
            raise ValueError("residual must be of shape %s (got %s)" % (tuple(x.shape), tuple(residual.shape)))
    fmt = O._QUANT.get(quant)
    if fmt is None or activation not in C.ACT:
        raise ValueError("quant %r or activation %r is unknown" % (quant, activation))
    wdt = torch.bfloat16 if fmt == C.WEIGHT_BF16 else torch.uint8
    _t("w13", w13, wdt, 3, dev)
    _t("w2", w2, wdt, 3, dev)
    inter = w13.shape[1] // width
    lw = l if fmt == C.WEIGHT_BF16 else l // 2
    iw = inter if fmt == C.WEIGHT_BF16 else inter // 2
    if (w13.shape[0] != e or w13.shape[1] != width * inter or w13.shape[2] != lw or
            tuple(w2.shape) != (e, l, iw)):
        raise ValueError("w13 must be [E, %dI, %s] and w2 [E, L, %s] with E = %d (gate_weight) and L = %d (down_proj) "
                         "(got %s and %s)" % (width, "L" if lw == l else "L/2", "I" if iw == inter else "I/2", e, l,
                                              tuple(w13.shape), tuple(w2.shape)))
    for name, t, dt, nd in (("w13_scale", w13_scale, torch.uint8, (1, 2)), ("w2_scale", w2_scale, torch.uint8, (1, 2)),
                            ("w13_scale_2", w13_scale_2, torch.float32, (1, 2)),
                            ("w2_scale_2", w2_scale_2, torch.float32, 1)):
        if t is not None:
            _t(name, t, dt, nd, dev)
    if fmt != C.WEIGHT_BF16 and (w13_scale is None or w2_scale is None):
        raise ValueError("w13_scale and w2_scale are required for quant=%r" % quant)
    if fmt == C.WEIGHT_NVFP4 and (w13_scale_2 is None or w2_scale_2 is None):
        raise ValueError("w13_scale_2 and w2_scale_2 are required for quant='nvfp4'")
    max_tokens = O._tokens(m)
    gate_dtype = C.DTYPE_BF16 if gate_weight.dtype == torch.bfloat16 else C.DTYPE_F32
    layout = O._layout(scale_layout)
    separate = int(w13_scale_2 is not None and w13_scale_2.dim() == 2)

    def make(ctx):  # the descriptor is built only when the plan is not cached yet
        d = C.LatentMoeDesc()
        _lib.k3_latent_moe_desc_init(ctypes.byref(d))
        d.hidden = h
        d.router.num_experts, d.router.top_k, d.router.hidden, d.router.gate_dtype = e, top_k, h, gate_dtype
        d.router.renormalize, d.router.scaling_factor, d.router.max_tokens = (int(bool(renormalize)),
                                                                              float(routed_scaling_factor), max_tokens)
        ex = d.experts
        ex.num_experts, ex.top_k, ex.hidden, ex.inter, ex.format = e, top_k, l, inter, fmt
        ex.scale_layout, ex.mode, ex.max_tokens, ex.w13_separate_scale_2 = layout, C.MOE_W4A16, max_tokens, separate
        _lib.k3_act_desc_init(ctypes.byref(ex.act), C.ACT[activation])
        if activation == "situ":
            ex.act.situ_beta, ex.act.situ_linear_beta = float(situ_beta), float(situ_linear_beta)
        d.shared_inter, d.shared_act, d.rms_eps, d.max_tokens = shared_inter, ex.act, float(rms_eps), max_tokens
        p = _make(ctx, _lib.k3_latent_moe_plan_create, _lib.k3_latent_moe_plan_destroy,
                  _lib.k3_latent_moe_workspace_size, d)
        p.scale_bytes = O._expert_scale_bytes(fmt, layout, width * inter, l, inter)
        return p

    key = ("latent", h, e, top_k, l, inter, fmt, layout, separate, gate_dtype, bool(renormalize),
           float(routed_scaling_factor), activation, float(situ_beta), float(situ_linear_beta), shared_inter,
           float(rms_eps), max_tokens)
    plan = _plan(dev, key, make)
    if fmt != C.WEIGHT_BF16:
        O._check_expert_scales(e, plan.scale_bytes, [(n, t.shape, t.numel()) for n, t in (
            ("w13_scale", w13_scale), ("w2_scale", w2_scale), ("w13_scale_2", w13_scale_2),
            ("w2_scale_2", w2_scale_2)) if t is not None])
    ctx = plan.ctx
    mw = C.MoeWeights(_ptr(w13), _ptr(w13_scale), _ptr(w13_scale_2), None, _ptr(w2), _ptr(w2_scale), _ptr(w2_scale_2),
                      None)
    lw = C.LatentMoeWeights(_ptr(gate_weight), _ptr(bias), _ptr(down_proj), mw, _ptr(norm_weight), _ptr(up_proj),
                            _ptr(shared_gate_up), _ptr(shared_down))
    y = torch.empty((m, h), dtype=torch.bfloat16, device=x.device)
    ids = torch.empty((m, top_k), dtype=torch.int32, device=x.device)
    wts = torch.empty((m, top_k), dtype=torch.float32, device=x.device)
    ws = _ws(plan, x)
    O._check(_lib.k3_latent_moe_run(plan.handle, m, _ptr(x), ctypes.byref(lw), _ptr(residual), _ptr(y), _ptr(ids),
                                    _ptr(wts), _ptr(ws), plan.ws_bytes, _stream(dev)), ctx)
    return y, wts, ids


@torch.library.custom_op("k3kernels::latent_moe", mutates_args=())
def latent_moe_op(x: torch.Tensor, gate_weight: torch.Tensor, bias: Optional[torch.Tensor], down_proj: torch.Tensor,
                  w13: torch.Tensor, w2: torch.Tensor, norm_weight: torch.Tensor, up_proj: torch.Tensor,
                  shared_gate_up: Optional[torch.Tensor], shared_down: Optional[torch.Tensor],
                  residual: Optional[torch.Tensor], top_k: int, renormalize: bool, routed_scaling_factor: float,
                  quant: str, w13_scale: Optional[torch.Tensor], w13_scale_2: Optional[torch.Tensor],
                  w2_scale: Optional[torch.Tensor], w2_scale_2: Optional[torch.Tensor], scale_layout: str,
                  activation: str, situ_beta: float, situ_linear_beta: float,
                  rms_eps: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return latent_moe_impl(x, gate_weight, bias, down_proj, w13, w2, norm_weight, up_proj, shared_gate_up,
                           shared_down, residual, top_k, renormalize, routed_scaling_factor, quant, w13_scale,
                           w13_scale_2, w2_scale, w2_scale_2, scale_layout, activation, situ_beta, situ_linear_beta,
                           rms_eps)


@latent_moe_op.register_fake
def _(x, gate_weight, bias, down_proj, w13, w2, norm_weight, up_proj, shared_gate_up, shared_down, residual, top_k,
      renormalize, routed_scaling_factor, quant, w13_scale, w13_scale_2, w2_scale, w2_scale_2, scale_layout,
      activation, situ_beta, situ_linear_beta, rms_eps):
    m = x.shape[0]
    return (x.new_empty(x.shape), x.new_empty((m, top_k), dtype=torch.float32),
            x.new_empty((m, top_k), dtype=torch.int32))


O.TORCH_IMPLS["latent_moe"] = latent_moe_impl
