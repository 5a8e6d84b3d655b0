/* W4A4: the activations of every (expert, token) pair quantized to NVFP4 ahead of GEMM1. */
#ifndef K3_CUDA_MOE_QUANT_X_CUH
#define K3_CUDA_MOE_QUANT_X_CUH

#include <stdint.h>
#include "core/bf16.h"
#include "core/formats.h"
#include "cuda/common/pdl.cuh"
#include "cuda/moe/fp4_decode.cuh"
#include "cuda/moe/params.cuh"

namespace {

/* W4A4: x of every grouped (expert, token) pair NVFP4-quantized with gs = 1 / w13_input_scale[e]; one block
 * per pair slot (slots past the valid count exit), one thread per 16-element block. Stores q * sf (exact in
 * BF16): the 1 / gs factor is applied after GEMM1. */
__global__ void __launch_bounds__(128) k3_moe_quant_x_kernel(const moe_params P) {
    k3_pdl_wait();
    k3_pdl_launch();
    const int32_t pp = blockIdx.x;
    if (pp >= __ldcg(P.offs + P.ne)) return;
    const int32_t pair = __ldcg(P.list + pp), e = __ldg(P.ids + pair);
    const float gs = 1.0f / __ldg(P.w13_in + e);
    const uint16_t *xr = P.x + (int64_t)(pair / P.top_k) * P.L;
    uint16_t *out = const_cast<uint16_t *>(P.xq) + (int64_t)pp * P.L;
    for (int64_t b = threadIdx.x; b < P.L / 16; b += blockDim.x) {
        float v[16], amax = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            v[i] = k3_bf16_bits_to_f32(__ldg(xr + b * 16 + i));
            const float a = fabsf(v[i]);
            amax = a > amax ? a : amax;
        }
        const float sf = k3_e4m3_decode(k3_e4m3_encode(__fdiv_rn(__fmul_rn(gs, amax), 6.0f)));
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const float qv = sf == 0.0f ? 0.0f : __fmul_rn(e2m1f(k3_e2m1_encode(__fdiv_rn(__fmul_rn(v[i], gs), sf))), sf);
            out[b * 16 + i] = k3_f32_to_bf16_bits(qv);
        }
    }
}

} // namespace

#endif
