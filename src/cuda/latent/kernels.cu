/* The latent-MoE block's elementwise kernels (the block is composed in src/api/latent.c, which calls these
 * launchers between its router, linear and MoE plans): the RMSNorm of the experts' fp32 sum, the shared
 * experts' activation, and the final sum with the shared output and the residual. Each rounds where the CPU
 * block (src/cpu/latent.c) rounds. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "core/act.h"
#include "core/bf16.h"
#include "cuda/common/check.cuh"
#include "cuda/latent/kernels.h"

namespace {

constexpr int NORM_THREADS = 256;

/* v[t, c] = bf16(bf16(u * r) * norm[c]), r = 1 / sqrt(mean(u^2) + eps); the sum of squares in a fixed tree
 * order (deterministic; not the CPU's sequential order, so r may differ from it in the last bit). */
__global__ void __launch_bounds__(NORM_THREADS)
    k3_latent_rmsnorm_kernel(const float *__restrict__ u, const uint16_t *__restrict__ norm, int64_t l, float eps,
                             uint16_t *__restrict__ v) {
    __shared__ float part[NORM_THREADS / 32];
    const int64_t t = blockIdx.x;
    const float *ut = u + t * l;
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < l; c += NORM_THREADS) ss = __fadd_rn(ss, __fmul_rn(ut[c], ut[c]));
    for (int o = 16; o >= 1; o /= 2) ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, o));
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int w = 0; w < NORM_THREADS / 32; w++) tot = __fadd_rn(tot, part[w]);
    const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(tot, (float)l), eps)));
    for (int64_t c = threadIdx.x; c < l; c += NORM_THREADS)
        v[t * l + c] =
            k3_f32_to_bf16_bits(__fmul_rn(k3_round_bf16(__fmul_rn(ut[c], r)), k3_bf16_bits_to_f32(norm[c])));
}

/* a[t, c] = bf16(act(g row t)) in the kind's layout ([gate; up], interleaved, or relu2 of one half). */
__global__ void k3_latent_act_kernel(const uint16_t *__restrict__ g, int64_t m, int64_t is, int64_t sr,
                                     const k3_act_desc act, uint16_t *__restrict__ a) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= m * is) return;
    const int64_t t = idx / is, c = idx % is;
    const uint16_t *gt = g + t * sr;
    float v;
    if (act.kind == K3_ACT_RELU2_NO_MUL) v = k3_act_relu2(k3_bf16_bits_to_f32(gt[c]));
    else if (act.kind == K3_ACT_SWIGLUOAI)
        v = k3_act_gated(&act, k3_bf16_bits_to_f32(gt[2 * c]), k3_bf16_bits_to_f32(gt[2 * c + 1]));
    else v = k3_act_gated(&act, k3_bf16_bits_to_f32(gt[c]), k3_bf16_bits_to_f32(gt[is + c]));
    a[idx] = k3_f32_to_bf16_bits(v);
}

/* y = bf16((z + bf16(s)) + r) with s and r optional: the shared experts' fp32 output (or the cross-rank sum of
 * their partials) rounded to BF16 where the CPU block rounds it, then the CPU's fp32 adds in its order, one
 * rounding. */
__global__ void k3_latent_sum_kernel(const uint16_t *__restrict__ z, const float *__restrict__ s, const uint16_t *r,
                                     int64_t n, uint16_t *y) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float acc = k3_bf16_bits_to_f32(z[i]);
    if (s) acc = __fadd_rn(acc, k3_round_bf16(s[i]));
    if (r) acc = __fadd_rn(acc, k3_bf16_bits_to_f32(r[i]));
    y[i] = k3_f32_to_bf16_bits(acc);
}

} // namespace

extern "C" k3_status k3_cuda_latent_rmsnorm_launch(k3_ctx *ctx, const float *u, const uint16_t *norm, int64_t m,
                                                   int64_t l, float eps, uint16_t *v, void *stream) {
    k3_latent_rmsnorm_kernel<<<(unsigned)m, NORM_THREADS, 0, (cudaStream_t)stream>>>(u, norm, l, eps, v);
    K3_CUDA_LAUNCH_CHECK(ctx, "the latent rmsnorm kernel");
    return K3_STATUS_SUCCESS;
}

extern "C" k3_status k3_cuda_latent_act_launch(k3_ctx *ctx, const uint16_t *g, int64_t m, int64_t inter,
                                               int64_t g_stride, const k3_act_desc *act, uint16_t *a, void *stream) {
    const int64_t n = m * inter;
    k3_latent_act_kernel<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(g, m, inter, g_stride, *act,
                                                                                         a);
    K3_CUDA_LAUNCH_CHECK(ctx, "the latent shared activation kernel");
    return K3_STATUS_SUCCESS;
}

extern "C" k3_status k3_cuda_latent_sum_f32_launch(k3_ctx *ctx, const uint16_t *z, const float *s, const uint16_t *r,
                                                   int64_t n, uint16_t *y, void *stream) {
    k3_latent_sum_kernel<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(z, s, r, n, y);
    K3_CUDA_LAUNCH_CHECK(ctx, "latent sum kernel (fp32 shared)");
    return K3_STATUS_SUCCESS;
}

extern "C" k3_status k3_cuda_latent_copy(k3_ctx *ctx, void *dst, const void *src, size_t bytes, void *stream) {
    K3_CUDA_TRY(ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream));
    return K3_STATUS_SUCCESS;
}
