"""NVFP4 / MXFP4 (de)quantization on the host over the C API (k3_fp4_quantize, k3_fp4_dequantize): numpy arrays,
or CPU torch tensors through the k3kernels:: ops of _torch_fp4.py."""
import ctypes

import numpy as np

from . import _capi as C
from ._ops import K3Error, _array, _is_torch, _layout, _lib, _p, _torch_ops


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
    """NVFP4 quantization on the host (k3_fp4_quantize): x [rows, cols] or [batch, rows, cols] float32, cols a
    multiple of 16 -> (packed uint8 [..., cols/2], element 2j in the low nibble; scale uint8 E4M3 codes, [bytes] or
    [batch, bytes] (k3_fp4_scale_bytes per matrix, "linear" or "swizzled" 128x4 layout); scale_2 float32 [batch]
    (1/gs, ModelOpt's weight_scale_2; [1] for a 2-D x)). NaN or Inf in x raises K3Error. torch: a CPU tensor
    (float32, bfloat16 or float16) gives CPU tensors; a CUDA tensor raises ValueError (pass x.cpu())."""
    if _is_torch(x):
        return _torch_ops().quantize_nvfp4(x, scale_layout)
    return _quantize(C.FP4_NVFP4, x, scale_layout)


def quantize_mxfp4(x, scale_layout="linear"):
    """MXFP4 quantization on the host: x float32 [rows, cols] or [batch, rows, cols], cols a multiple of 32 ->
    (packed uint8 [..., cols/2], scale uint8 UE8M0 codes per matrix); no global scale. torch as quantize_nvfp4."""
    if _is_torch(x):
        return _torch_ops().quantize_mxfp4(x, scale_layout)
    packed, scales, _ = _quantize(C.FP4_MXFP4, x, scale_layout)
    return packed, scales


def dequantize_nvfp4(packed, scale, scale_2, scale_layout="linear"):
    """The inverse of quantize_nvfp4 on the host: float32 [..., 2 * packed.shape[-1]] = E2M1 code * E4M3 block
    scale * scale_2. torch: CPU uint8 tensors and a float32 scale_2 tensor; CUDA tensors raise ValueError."""
    if _is_torch(packed):
        return _torch_ops().dequantize_nvfp4(packed, scale, scale_2, scale_layout)
    return _dequantize(C.FP4_NVFP4, packed, scale, scale_2, scale_layout)


def dequantize_mxfp4(packed, scale, scale_layout="linear"):
    """The inverse of quantize_mxfp4 on the host: E2M1 code * 2^(scale - 127). torch as dequantize_nvfp4."""
    if _is_torch(packed):
        return _torch_ops().dequantize_mxfp4(packed, scale, scale_layout)
    return _dequantize(C.FP4_MXFP4, packed, scale, None, scale_layout)
