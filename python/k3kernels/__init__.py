"""k3kernels: the decode kernels of Kimi-K3-class models (BF16 GEMM plan, router, NVFP4/MXFP4 routed experts) from
Python, over the library's C API.

numpy arrays run the CPU backend; torch tensors (when torch is installed) run the CPU backend for CPU tensors and the
CUDA backend for CUDA tensors, on torch's current stream (linear, router, fused_moe, latent_moe, kda_proj; registered
as torch.library ops k3kernels::linear, ... with fake implementations for torch.compile). The FP4 (de)quantization
runs on the host: CPU tensors only (k3kernels::quantize_nvfp4, ...; a CUDA tensor is refused with ValueError). numpy
has no BF16 type: inputs are float32 arrays, rounded to BF16 once (round to nearest even) exactly where the C API
takes BF16, and BF16 outputs come back as float32 arrays holding BF16 values. Every bad argument raises ValueError
or TypeError naming it; a library failure raises K3Error with the library's message. docs/python.md has the rules
(plan caching, streams, CUDA graphs, torch.compile).

    import numpy as np, k3kernels
    x = np.random.randn(4, 512).astype(np.float32)
    w = np.random.randn(256, 512).astype(np.float32)
    y = k3kernels.linear(x, w)                     # y = bf16(x) bf16(w)^T, one BF16 rounding
"""
from ._checkpoint import load_moe_layer
from ._fp4 import dequantize_mxfp4, dequantize_nvfp4, quantize_mxfp4, quantize_nvfp4
from ._moe import fused_moe, latent_moe
from ._ops import K3Error, info, kda_proj, linear, round_bf16, router

try:  # torch is optional: with it, torch tensors are taken and the ops are registered with torch.library
    import torch as _torch_mod  # noqa: F401
except ImportError:  # pragma: no cover - numpy only
    _torch_mod = None
if _torch_mod is not None:
    from . import _torch, _torch_fp4, _torch_kda, _torch_latent  # noqa: F401  (the k3kernels:: torch.library ops)

__all__ = ["K3Error", "info", "linear", "router", "fused_moe", "quantize_nvfp4", "quantize_mxfp4",
           "dequantize_nvfp4", "dequantize_mxfp4", "round_bf16", "kda_proj", "latent_moe", "load_moe_layer"]
