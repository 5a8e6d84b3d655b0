/* The latent-MoE block's elementwise kernels (the block is composed in src/api/latent.c, which calls these
 * launchers between its router, linear and MoE plans): the RMSNorm of the experts' fp32 sum, the shared
 * experts' activation, and the addend t of the shared output and the residual (the up projection adds it). Each
 * rounds where the CPU block (src/cpu/latent.c) rounds. Launched with PDL: each waits before it reads the previous
 * kernel's output (through L2, __ldcg: pdl.cuh's rule for outputs of a kernel still running at launch); the
 * activation and the addend then let the next kernel come up, the RMSNorm where its caller asks (see there). */
#include <cuda_runtime.h>
#include <stdint.h>

#include "core/act.h"
#include "core/bf16.h"
#include "cuda/common/check.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/latent/kernels.h"

namespace {

constexpr int NORM_PIECE = 8;          /* consecutive elements a thread takes at a time */
constexpr int NORM_MAX_THREADS = 1024;

/* The RMSNorm's block size for rows of l elements: one thread per 8-element piece up to 1024 (whole warps). The
 * summation order depends on it, so it is a function of l alone. */
inline int norm_threads(int64_t l) {
    const int64_t pieces = (l + NORM_PIECE - 1) / NORM_PIECE;
    const int64_t t = (pieces + 31) / 32 * 32;
    return (int)(t < NORM_MAX_THREADS ? t : NORM_MAX_THREADS);
}

/* v[t, c] = bf16(bf16(u * r) * norm[c]), r = 1 / sqrt(mean(u^2) + eps), one block per token. The sum of squares
 * in a fixed order (deterministic; not the CPU's sequential order, so r may differ from it in the last bit):
 * thread j adds the squares of pieces j, j + T, ... (8 consecutive elements each, in order), then a warp tree by
 * xor shuffles, then the warps' sums in warp order. VEC (l % 8 == 0, u, norm and v 16-byte aligned): a piece is
 * two 16-byte loads of u and one of norm, and a thread's pieces are all asked for before the sums (at L 3584 one
 * piece per thread: a single round trip); otherwise element by element, in the same order. Why one thread per
 * piece: the row is a decode step's latency-bound link (one block per token), so its time is the number of
 * dependent round trips, not bytes. norm (a weight) is asked for before the PDL wait in the source, u after it. */
template <bool VEC>
__global__ void __launch_bounds__(NORM_MAX_THREADS)
    k3_latent_rmsnorm_kernel(const float *u, const uint16_t *__restrict__ norm, int64_t l, float eps,
                             uint16_t *__restrict__ v, int trigger) {
    __shared__ float part[NORM_MAX_THREADS / 32];
    const int64_t t = blockIdx.x;
    const int nt = blockDim.x, j = threadIdx.x;
    const int64_t npieces = (l + NORM_PIECE - 1) / NORM_PIECE;
    const float *ut = u + t * l;
    constexpr int HELD = 2; /* pieces a thread keeps in registers between the two passes (L <= 2 x 8 x 1024) */
    uint4 nw[HELD];
#pragma unroll
    for (int h = 0; h < HELD; h++) {
        const int64_t p = j + (int64_t)h * nt;
        if (VEC && p < npieces) nw[h] = __ldg(reinterpret_cast<const uint4 *>(norm) + p);
    }
    /* u: the experts' combine (or the cross-rank sum). The trigger lets the up projection come up while this kernel
     * runs: its weight requests then hide its ramp, or slow this latency-bound kernel more than they hide; which one
     * depends on m (the caller's choice, from the plan's data) */
    k3_pdl_wait();
    if (trigger) k3_pdl_launch();
    float uv[HELD][NORM_PIECE];
    float ss = 0.0f;
    if constexpr (VEC) {
#pragma unroll
        for (int h = 0; h < HELD; h++) {
            const int64_t p = j + (int64_t)h * nt;
            if (p < npieces) {
                const float4 a = __ldcg(reinterpret_cast<const float4 *>(ut) + 2 * p);
                const float4 b = __ldcg(reinterpret_cast<const float4 *>(ut) + 2 * p + 1);
                uv[h][0] = a.x, uv[h][1] = a.y, uv[h][2] = a.z, uv[h][3] = a.w;
                uv[h][4] = b.x, uv[h][5] = b.y, uv[h][6] = b.z, uv[h][7] = b.w;
            }
        }
#pragma unroll
        for (int h = 0; h < HELD; h++)
            if (j + (int64_t)h * nt < npieces)
#pragma unroll
                for (int i = 0; i < NORM_PIECE; i++) ss = __fadd_rn(ss, __fmul_rn(uv[h][i], uv[h][i]));
    }
    /* the pieces not held in registers (rows past 16384 elements), or every piece without VEC, in the same order */
    for (int64_t p = j + (VEC ? (int64_t)HELD * nt : 0); p < npieces; p += nt)
        for (int64_t c = p * NORM_PIECE; c < p * NORM_PIECE + NORM_PIECE && c < l; c++) {
            const float x = __ldcg(ut + c);
            ss = __fadd_rn(ss, __fmul_rn(x, x));
        }
    for (int o = 16; o >= 1; o /= 2) ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, o));
    if ((j & 31) == 0) part[j >> 5] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int w = 0; w < nt / 32; w++) tot = __fadd_rn(tot, part[w]);
    const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(tot, (float)l), eps)));
    uint16_t *vt = v + t * l;
    if constexpr (VEC) {
#pragma unroll
        for (int h = 0; h < HELD; h++) {
            const int64_t p = j + (int64_t)h * nt;
            if (p >= npieces) continue;
            const uint32_t nb[4] = {nw[h].x, nw[h].y, nw[h].z, nw[h].w};
            uint32_t o[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float n0 = __uint_as_float(nb[i] << 16), n1 = __uint_as_float(nb[i] & 0xffff0000u);
                const uint32_t lo = k3_f32_to_bf16_bits(__fmul_rn(k3_round_bf16(__fmul_rn(uv[h][2 * i], r)), n0));
                const uint32_t hi = k3_f32_to_bf16_bits(__fmul_rn(k3_round_bf16(__fmul_rn(uv[h][2 * i + 1], r)), n1));
                o[i] = lo | (hi << 16);
            }
            reinterpret_cast<uint4 *>(vt)[p] = make_uint4(o[0], o[1], o[2], o[3]);
        }
    }
    for (int64_t p = j + (VEC ? (int64_t)HELD * nt : 0); p < npieces; p += nt)
        for (int64_t c = p * NORM_PIECE; c < p * NORM_PIECE + NORM_PIECE && c < l; c++)
            vt[c] = k3_f32_to_bf16_bits(
                __fmul_rn(k3_round_bf16(__fmul_rn(__ldcg(ut + c), r)), k3_bf16_bits_to_f32(norm[c])));
}

/* a[t, c] = bf16(act(g row t)) in the kind's layout ([gate; up], interleaved, or relu2 of one half). */
__global__ void k3_latent_act_kernel(const uint16_t *g, int64_t m, int64_t is, int64_t sr, const k3_act_desc act,
                                     uint16_t *__restrict__ a) {
    k3_pdl_wait(); /* g: the shared gate_up projection */
    k3_pdl_launch();
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= m * is) return;
    const int64_t t = idx / is, c = idx % is;
    const uint16_t *gt = g + t * sr;
    float v;
    if (act.kind == K3_ACT_RELU2_NO_MUL) v = k3_act_relu2(k3_bf16_bits_to_f32(__ldcg(gt + c)));
    else if (act.kind == K3_ACT_SWIGLUOAI)
        v = k3_act_gated(&act, k3_bf16_bits_to_f32(__ldcg(gt + 2 * c)), k3_bf16_bits_to_f32(__ldcg(gt + 2 * c + 1)));
    else v = k3_act_gated(&act, k3_bf16_bits_to_f32(__ldcg(gt + c)), k3_bf16_bits_to_f32(__ldcg(gt + is + c)));
    a[idx] = k3_f32_to_bf16_bits(v);
}

/* t = bf16(bf16(s) + r), r optional: the shared experts' fp32 output (or the cross-rank sum of their partials)
 * rounded where the CPU block rounds it, plus the residual, one more rounding: the up projection's residual. */
__global__ void k3_latent_addend_kernel(const float *s, const uint16_t *r, int64_t n, uint16_t *t) {
    k3_pdl_wait(); /* s: the shared down projection, or the reduced partial */
    k3_pdl_launch();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float acc = k3_round_bf16(__ldcg(s + i));
    if (r) acc = __fadd_rn(acc, k3_bf16_bits_to_f32(__ldcg(r + i)));
    t[i] = k3_f32_to_bf16_bits(acc);
}

k3_status latent_launch_status(k3_ctx *ctx, cudaError_t e, const char *what) {
    if (e != cudaSuccess)
        return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "launch of %s failed: %s", what, cudaGetErrorString(e));
    return K3_STATUS_SUCCESS;
}

} // namespace

extern "C" k3_status k3_cuda_latent_rmsnorm_launch(k3_ctx *ctx, const float *u, const uint16_t *norm, int64_t m,
                                                   int64_t l, float eps, uint16_t *v, int32_t trigger,
                                                   void *stream) {
    const bool vec = l % NORM_PIECE == 0 && ((uintptr_t)u | (uintptr_t)norm | (uintptr_t)v) % 16 == 0;
    const dim3 grid((unsigned)m), block((unsigned)norm_threads(l));
    const cudaStream_t s = (cudaStream_t)stream;
    const int tr = trigger != 0;
    const cudaError_t e = vec ? k3_launch_pdl(k3_latent_rmsnorm_kernel<true>, grid, block, 0, s, u, norm, l, eps, v, tr)
                              : k3_launch_pdl(k3_latent_rmsnorm_kernel<false>, grid, block, 0, s, u, norm, l, eps, v, tr);
    return latent_launch_status(ctx, e, "the latent rmsnorm kernel");
}

extern "C" k3_status k3_cuda_latent_act_launch(k3_ctx *ctx, const uint16_t *g, int64_t m, int64_t inter,
                                               int64_t g_stride, const k3_act_desc *act, uint16_t *a, void *stream) {
    const int64_t n = m * inter;
    const cudaError_t e = k3_launch_pdl(k3_latent_act_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0,
                                        (cudaStream_t)stream, g, m, inter, g_stride, *act, a);
    return latent_launch_status(ctx, e, "the latent shared activation kernel");
}

extern "C" k3_status k3_cuda_latent_addend_launch(k3_ctx *ctx, const float *s, const uint16_t *r, int64_t n,
                                                  uint16_t *t, void *stream) {
    const cudaError_t e = k3_launch_pdl(k3_latent_addend_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0,
                                        (cudaStream_t)stream, s, r, n, t);
    return latent_launch_status(ctx, e, "the latent addend kernel (shared output + residual)");
}

extern "C" k3_status k3_cuda_latent_copy(k3_ctx *ctx, void *dst, const void *src, size_t bytes, void *stream) {
    K3_CUDA_TRY(ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream));
    return K3_STATUS_SUCCESS;
}
