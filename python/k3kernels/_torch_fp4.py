"""NVFP4 / MXFP4 (de)quantization on torch tensors: k3kernels::quantize_nvfp4, ::quantize_mxfp4,
::dequantize_nvfp4, ::dequantize_mxfp4 (with fake implementations for torch.compile).

The C API quantizes on the host (k3_fp4_quantize). CPU tensors are handed to it without a copy (zero-copy numpy
views). CUDA tensors are refused with a ValueError rather than copied behind the caller's back: a hidden
device-to-host copy would synchronize the stream and could not be captured into a CUDA graph. Weight preparation
is a host step: `quantize_nvfp4(w.cpu())`, then `.to(device)` on the results."""
import ctypes
from typing import Tuple

import torch

from . import _capi as C
from . import _fp4 as F
from . import _ops as O

_lib = O._lib
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)  # each converts to float32 exactly


def _host(op, name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s must be a torch tensor (got %s)" % (name, type(t).__name__))
    if t.device.type != "cpu":
        raise ValueError("%s is on %s: %s runs on the host (the C API's k3_fp4_%s); pass %s.cpu() and move the "
                         "results with .to(device)" % (name, t.device, op, "quantize" if op.startswith("quantize")
                                                       else "dequantize", name))
    return t


def _float_input(op, x):
    _host(op, "x", x)
    if x.dtype not in _FLOATS:
        raise TypeError("x must be float32, bfloat16 or float16 (got %s)" % x.dtype)
    return x.detach().to(torch.float32).contiguous().numpy()


def _u8(op, name, t):
    _host(op, name, t)
    if t.dtype != torch.uint8:
        raise TypeError("%s must be torch.uint8 (got %s)" % (name, t.dtype))
    return t.detach().contiguous().numpy()


def _scale_bytes(fmt, scale_layout, rows, cols):
    n = ctypes.c_size_t()
    st = _lib.k3_fp4_scale_bytes(fmt, O._layout(scale_layout), int(rows), int(cols), ctypes.byref(n))
    if st != C.STATUS_SUCCESS:
        raise ValueError("cannot size the block scales of [%d, %d] (cols must be a whole number of blocks)" %
                         (rows, cols))
    return n.value


def _scale_shape(x, fmt, scale_layout):
    rows, cols = x.shape[-2], x.shape[-1]
    sb = _scale_bytes(fmt, scale_layout, rows, cols)
    return (sb,) if x.dim() == 2 else (x.shape[0], sb)


@torch.library.custom_op("k3kernels::quantize_nvfp4", mutates_args=())
def quantize_nvfp4_op(x: torch.Tensor, scale_layout: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    packed, scale, scale_2 = F.quantize_nvfp4(_float_input("quantize_nvfp4", x), scale_layout)
    return torch.from_numpy(packed), torch.from_numpy(scale), torch.from_numpy(scale_2)


@quantize_nvfp4_op.register_fake
def _(x, scale_layout):
    shape = tuple(x.shape)
    batch = 1 if x.dim() == 2 else shape[0]
    return (x.new_empty(shape[:-1] + (shape[-1] // 2,), dtype=torch.uint8),
            x.new_empty(_scale_shape(x, C.FP4_NVFP4, scale_layout), dtype=torch.uint8),
            x.new_empty((batch,), dtype=torch.float32))


@torch.library.custom_op("k3kernels::quantize_mxfp4", mutates_args=())
def quantize_mxfp4_op(x: torch.Tensor, scale_layout: str) -> Tuple[torch.Tensor, torch.Tensor]:
    packed, scale = F.quantize_mxfp4(_float_input("quantize_mxfp4", x), scale_layout)
    return torch.from_numpy(packed), torch.from_numpy(scale)


@quantize_mxfp4_op.register_fake
def _(x, scale_layout):
    shape = tuple(x.shape)
    return (x.new_empty(shape[:-1] + (shape[-1] // 2,), dtype=torch.uint8),
            x.new_empty(_scale_shape(x, C.FP4_MXFP4, scale_layout), dtype=torch.uint8))


@torch.library.custom_op("k3kernels::dequantize_nvfp4", mutates_args=())
def dequantize_nvfp4_op(packed: torch.Tensor, scale: torch.Tensor, scale_2: torch.Tensor,
                        scale_layout: str) -> torch.Tensor:
    op = "dequantize_nvfp4"
    _host(op, "scale_2", scale_2)
    if scale_2.dtype != torch.float32:
        raise TypeError("scale_2 must be torch.float32 (got %s)" % scale_2.dtype)
    out = F.dequantize_nvfp4(_u8(op, "packed", packed), _u8(op, "scale", scale),
                             scale_2.detach().contiguous().numpy(), scale_layout)
    return torch.from_numpy(out)


@dequantize_nvfp4_op.register_fake
def _(packed, scale, scale_2, scale_layout):
    shape = tuple(packed.shape)
    return packed.new_empty(shape[:-1] + (2 * shape[-1],), dtype=torch.float32)


@torch.library.custom_op("k3kernels::dequantize_mxfp4", mutates_args=())
def dequantize_mxfp4_op(packed: torch.Tensor, scale: torch.Tensor, scale_layout: str) -> torch.Tensor:
    op = "dequantize_mxfp4"
    return torch.from_numpy(F.dequantize_mxfp4(_u8(op, "packed", packed), _u8(op, "scale", scale), scale_layout))


@dequantize_mxfp4_op.register_fake
def _(packed, scale, scale_layout):
    shape = tuple(packed.shape)
    return packed.new_empty(shape[:-1] + (2 * shape[-1],), dtype=torch.float32)
