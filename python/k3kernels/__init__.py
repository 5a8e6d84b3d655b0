"""k3kernels: the decode kernels of Kimi-K3-class models (BF16 GEMM plan, router, NVFP4/MXFP4 routed experts) from
Python, over the library's C API.

This first slice takes numpy arrays and runs the CPU backend. numpy has no BF16 type: inputs are float32 arrays,
rounded to BF16 once (round to nearest even) exactly where the C API takes BF16, and BF16 outputs come back as
float32 arrays holding BF16 values. Every bad argument raises ValueError or TypeError naming it; a library failure
raises K3Error with the library's message.

    import numpy as np, k3kernels
    x = np.random.randn(4, 512).astype(np.float32)
    w = np.random.randn(256, 512).astype(np.float32)
    y = k3kernels.linear(x, w)                     # y = bf16(x) bf16(w)^T, one BF16 rounding
"""
from ._ops import (K3Error, dequantize_mxfp4, dequantize_nvfp4, fused_moe, info, kda_proj, latent_moe, linear,
                   quantize_mxfp4, quantize_nvfp4, round_bf16, router)

__all__ = ["K3Error", "info", "linear", "router", "fused_moe", "quantize_nvfp4", "quantize_mxfp4",
           "dequantize_nvfp4", "dequantize_mxfp4", "round_bf16", "kda_proj", "latent_moe"]
