"""One MoE layer of a checkpoint on disk (k3_checkpoint_load_moe_layer of include/k3.h) as numpy arrays."""
import ctypes
import os

import numpy as np

from ._ops import K3Error, _bf16_to_f32, _lib

c_int32, c_int64, c_size_t, c_void_p = ctypes.c_int32, ctypes.c_int64, ctypes.c_size_t, ctypes.c_void_p

SOURCE_FORMATS = ("compressed-tensors-mxfp4", "compressed-tensors-nvfp4", "modelopt-nvfp4", "stacked")


class MoeLayer(ctypes.Structure):
    """The mirror of k3_moe_layer (fields are appended there, never moved)."""
    _fields_ = [("layer", c_int32), ("source_format", ctypes.c_int), ("fp4", ctypes.c_int), ("num_experts", c_int32),
                ("latent", c_int64), ("inter", c_int64),
                ("w13", c_void_p), ("w13_scale", c_void_p), ("w2", c_void_p), ("w2_scale", c_void_p),
                ("w13_bytes", c_size_t), ("w13_scale_bytes", c_size_t), ("w2_bytes", c_size_t),
                ("w2_scale_bytes", c_size_t),
                ("w13_scale_2", c_void_p), ("w2_scale_2", c_void_p), ("w13_input_scale", c_void_p),
                ("w2_input_scale", c_void_p),
                ("hidden", c_int64), ("shared_inter", c_int64), ("gate_dtype", ctypes.c_int),
                ("gate", c_void_p), ("bias", c_void_p), ("shared_gate_up", c_void_p), ("shared_down", c_void_p),
                ("down_proj", c_void_p), ("norm", c_void_p), ("up_proj", c_void_p),
                ("gate_bytes", c_size_t), ("bias_bytes", c_size_t), ("shared_gate_up_bytes", c_size_t),
                ("shared_down_bytes", c_size_t), ("down_proj_bytes", c_size_t), ("norm_bytes", c_size_t),
                ("up_proj_bytes", c_size_t)]


_P = ctypes.POINTER
_lib.k3_checkpoint_open.restype = ctypes.c_int
_lib.k3_checkpoint_open.argtypes = [ctypes.c_char_p, _P(c_void_p), ctypes.c_char_p, c_size_t]
_lib.k3_checkpoint_close.restype = None
_lib.k3_checkpoint_close.argtypes = [c_void_p]
_lib.k3_checkpoint_load_moe_layer.restype = ctypes.c_int
_lib.k3_checkpoint_load_moe_layer.argtypes = [c_void_p, c_int32, _P(_P(MoeLayer)), ctypes.c_char_p, c_size_t]
_lib.k3_moe_layer_free.restype = None
_lib.k3_moe_layer_free.argtypes = [_P(MoeLayer)]


def _copy(ptr, nbytes, dtype, shape):
    """A numpy copy of nbytes at ptr (the library's buffer is freed afterwards), or None for NULL."""
    if not ptr:
        return None
    want = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if nbytes != want:
        raise RuntimeError("k3kernels: k3_moe_layer says %d bytes where shape %s needs %d: the ctypes mirror does not "
                           "match this libk3 (rebuild the package from the same source tree)" % (nbytes, shape, want))
    return np.ctypeslib.as_array(ctypes.cast(ptr, _P(ctypes.c_uint8)), (nbytes,)).copy().view(dtype).reshape(shape)


def load_moe_layer(path, layer):
    """Layer `layer` of the checkpoint at `path` (a folder, an index .json or a safetensors file) as a dict:

    fp4 ("nvfp4" or "mxfp4"), source_format, num_experts, latent (L), inter (I), hidden (H), shared_inter (Is);
    w13 uint8 [E, 2I, L/2] (rows [gate; up]), w13_scale uint8 [E, 2I, L/block] (E4M3 or UE8M0 bytes, linear layout),
    w2 uint8 [E, L, I/2], w2_scale; w13_scale_2 float32 [E, 2] and w2_scale_2 [E] (NVFP4, else None);
    w13_input_scale [E, 2] and w2_input_scale [E] (or None); gate float32 [E, H] (BF16 values, or F32), bias [E];
    shared_gate_up [2 Is, H], shared_down [H, Is], down_proj [L, H], norm [L], up_proj [H, L] as float32 holding
    BF16 values; None for the groups the layer does not have. A bad checkpoint raises K3Error naming the tensor.
    """
    if not isinstance(layer, int) or isinstance(layer, bool) or layer < 0 or layer > 2 ** 31 - 1:
        raise ValueError("layer must be an int >= 0 (got %r)" % (layer,))
    err = ctypes.create_string_buffer(1024)
    ck = c_void_p()
    st = _lib.k3_checkpoint_open(os.fsencode(path), ctypes.byref(ck), err, len(err))
    if st != 0:
        raise K3Error(st, err.value.decode(errors="replace"))
    ly = _P(MoeLayer)()
    try:
        st = _lib.k3_checkpoint_load_moe_layer(ck, layer, ctypes.byref(ly), err, len(err))
    finally:
        _lib.k3_checkpoint_close(ck)
    if st != 0:
        raise K3Error(st, err.value.decode(errors="replace"))
    try:
        m = ly.contents
        e, el, i, h, s = m.num_experts, m.latent, m.inter, m.hidden, m.shared_inter
        bs = 16 if m.fp4 == 0 else 32
        f4 = np.float32
        out = {"layer": m.layer, "source_format": SOURCE_FORMATS[m.source_format],
               "fp4": "nvfp4" if m.fp4 == 0 else "mxfp4", "num_experts": e, "latent": el, "inter": i, "hidden": h,
               "shared_inter": s,
               "w13": _copy(m.w13, m.w13_bytes, np.uint8, (e, 2 * i, el // 2)),
               "w13_scale": _copy(m.w13_scale, m.w13_scale_bytes, np.uint8, (e, 2 * i, el // bs)),
               "w2": _copy(m.w2, m.w2_bytes, np.uint8, (e, el, i // 2)),
               "w2_scale": _copy(m.w2_scale, m.w2_scale_bytes, np.uint8, (e, el, i // bs)),
               "w13_scale_2": _copy(m.w13_scale_2, 8 * e, f4, (e, 2)),
               "w2_scale_2": _copy(m.w2_scale_2, 4 * e, f4, (e,)),
               "w13_input_scale": _copy(m.w13_input_scale, 8 * e, f4, (e, 2)),
               "w2_input_scale": _copy(m.w2_input_scale, 4 * e, f4, (e,)),
               "bias": _copy(m.bias, m.bias_bytes, f4, (e,))}
        gate = _copy(m.gate, m.gate_bytes, f4 if m.gate_dtype == 1 else np.uint16, (e, h))
        out["gate"] = None if gate is None else gate if m.gate_dtype == 1 else _bf16_to_f32(gate)
        for name, shape in (("shared_gate_up", (2 * s, h)), ("shared_down", (h, s)), ("down_proj", (el, h)),
                            ("norm", (el,)), ("up_proj", (h, el))):
            b = _copy(getattr(m, name), getattr(m, name + "_bytes"), np.uint16, shape)
            out[name] = None if b is None else _bf16_to_f32(b)
        return out
    finally:
        _lib.k3_moe_layer_free(ly)
