"""One checkpoint layer's MoE block as numpy arrays, read by the C API (k3_checkpoint_open,
k3_checkpoint_load_moe_layer): the per-expert layouts stacked, in the arrays fused_moe and latent_moe take."""
import ctypes
import os

import numpy as np

from . import _capi as C
from ._ops import K3Error, _bf16_to_f32, _lib

_ERR_BYTES = 1024
# k3_checkpoint_format, in enum order
SOURCE_FORMATS = ("compressed-tensors-mxfp4", "compressed-tensors-nvfp4", "modelopt-nvfp4", "stacked")
_INTERNAL_ERROR = 10  # K3_STATUS_INTERNAL_ERROR


def _copy(ptr, nbytes, dtype, shape, what):
    """The library's buffer copied into a new array of `shape`; its byte count must be the shape's."""
    want = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if nbytes != want:
        raise K3Error(_INTERNAL_ERROR, "the layer's %s holds %d bytes where its shape %s needs %d (a k3_moe_layer "
                      "mirror that does not match this libk3?)" % (what, nbytes, tuple(shape), want))
    raw = ctypes.string_at(ptr, nbytes) if nbytes else b""
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def load_moe_layer(path, layer):
    """Reads layer `layer` of the checkpoint at `path` (a folder with model.safetensors.index.json or one
    .safetensors file, an index file, or one safetensors file; the compressed-tensors MXFP4/NVFP4, ModelOpt NVFP4
    and stacked layouts, see include/k3.h) and returns a dict of numpy arrays named as fused_moe's and latent_moe's
    arguments: w13 uint8 [E, 2I, L/2] (gate; up), w13_scale uint8 [E, 2I * L / block] (linear layout), w2 uint8
    [E, L, I/2], w2_scale uint8 [E, L * I / block]; NVFP4 (block 16): w13_scale_2 float32 [E, 2] (gate, up) and
    w2_scale_2 float32 [E]; w13_input_scale [E, 2] (gate, up) and w2_input_scale [E] when the checkpoint has them
    (as stored: fused_moe's w4a4 mode takes one w13 input scale per expert, [E]); and the
    block's tensors when present: gate_weight float32 [E, H], e_score_correction_bias float32 [E], shared_gate_up
    [2Is, H], shared_down [H, Is], down_proj [L, H], norm_weight [L], up_proj [H, L] (BF16 tensors as float32 arrays
    holding their values). It also says what it read: layer, source_format (one of SOURCE_FORMATS), fp4 ("nvfp4" or
    "mxfp4"), num_experts, latent (L), inter (I), hidden (H, 0 without block tensors), shared_inter (Is). The format is NVFP4 when w13_scale_2 is present (quant="nvfp4"), else MXFP4. A missing,
    mis-shaped or mistyped tensor raises K3Error naming it."""
    if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < 2 ** 31:
        raise ValueError("layer must be an int in [0, 2^31) (got %r)" % (layer,))
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError("path must be a str or os.PathLike (got %s)" % type(path).__name__)
    err = ctypes.create_string_buffer(_ERR_BYTES)
    ck = ctypes.c_void_p()
    st = _lib.k3_checkpoint_open(os.fsencode(path), ctypes.byref(ck), err, _ERR_BYTES)
    if st != C.STATUS_SUCCESS:
        raise K3Error(st, err.value.decode(errors="replace"))
    lp = ctypes.POINTER(C.MoeLayer)()
    try:
        st = _lib.k3_checkpoint_load_moe_layer(ck, layer, ctypes.byref(lp), err, _ERR_BYTES)
    finally:
        _lib.k3_checkpoint_close(ck)
    if st != C.STATUS_SUCCESS:
        raise K3Error(st, err.value.decode(errors="replace"))
    try:
        return _arrays(lp.contents)
    finally:
        _lib.k3_moe_layer_free(lp)


def _arrays(m):
    e, l, i, h, si = m.num_experts, m.latent, m.inter, m.hidden, m.shared_inter
    block = 16 if m.fp4 == C.FP4_NVFP4 else 32
    out = {"layer": m.layer, "source_format": SOURCE_FORMATS[m.source_format] if 0 <= m.source_format < 4 else
           "unknown", "fp4": "nvfp4" if m.fp4 == C.FP4_NVFP4 else "mxfp4", "num_experts": e, "latent": l,
           "inter": i, "hidden": h, "shared_inter": si}
    out.update({"w13": _copy(m.w13, m.w13_bytes, np.uint8, (e, 2 * i, l // 2), "w13"),
           "w13_scale": _copy(m.w13_scale, m.w13_scale_bytes, np.uint8, (e, 2 * i * (l // block)), "w13_scale"),
           "w2": _copy(m.w2, m.w2_bytes, np.uint8, (e, l, i // 2), "w2"),
           "w2_scale": _copy(m.w2_scale, m.w2_scale_bytes, np.uint8, (e, l * (i // block)), "w2_scale")})
    f = np.dtype(np.float32).itemsize
    if m.fp4 == C.FP4_NVFP4:
        out["w13_scale_2"] = _copy(m.w13_scale_2, e * 2 * f, np.float32, (e, 2), "w13_scale_2")
        out["w2_scale_2"] = _copy(m.w2_scale_2, e * f, np.float32, (e,), "w2_scale_2")
    if m.w13_input_scale:
        out["w13_input_scale"] = _copy(m.w13_input_scale, e * 2 * f, np.float32, (e, 2), "w13_input_scale")
        out["w2_input_scale"] = _copy(m.w2_input_scale, e * f, np.float32, (e,), "w2_input_scale")
    if m.gate:
        if m.gate_dtype == C.DTYPE_F32:
            out["gate_weight"] = _copy(m.gate, m.gate_bytes, np.float32, (e, h), "gate")
        else:
            out["gate_weight"] = _bf16_to_f32(_copy(m.gate, m.gate_bytes, np.uint16, (e, h), "gate"))
    if m.bias:
        out["e_score_correction_bias"] = _copy(m.bias, m.bias_bytes, np.float32, (e,), "bias")
    for key, ptr, nbytes, shape in (("shared_gate_up", m.shared_gate_up, m.shared_gate_up_bytes, (2 * si, h)),
                                    ("shared_down", m.shared_down, m.shared_down_bytes, (h, si)),
                                    ("down_proj", m.down_proj, m.down_proj_bytes, (l, h)),
                                    ("norm_weight", m.norm, m.norm_bytes, (l,)),
                                    ("up_proj", m.up_proj, m.up_proj_bytes, (h, l))):
        if ptr:
            out[key] = _bf16_to_f32(_copy(ptr, nbytes, np.uint16, shape, key))
    return out
