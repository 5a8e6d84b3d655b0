/*
 * The GPU router: the CPU router (src/cpu/router.c) reproduced bit for bit.
 *
 * 1. Logits: 16 lanes per (token, expert) dot product, lane l summing the products of elements l, l + 16, ...
 *    in order (the CPU's K3_RT_LANES partial sums, the tail included, since element hv + i is lane i's last
 *    term), then the CPU's tree (lane l += lane l + w for w = 8, 4, 2, 1) through shuffles. Every product and
 *    sum is a separate __fmul_rn / __fadd_rn, so nvcc cannot fuse them (the host side is -ffp-contract=off).
 * 2. Selection, one block per token: keys as on the CPU (sigmoid from core/router_math.h, + bias, NaN -> -inf;
 *    or softmax probabilities with the CPU's sequential sum), then top_k rounds of an exact arg-max with ties to
 *    the lower id: the same sequence the CPU's stable insertion selection produces. The weights' short sums
 *    run on one thread in the CPU's order.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "core/router_math.h"
#include "cuda/check.cuh"
#include "cuda/moe.h"

namespace {

constexpr int RT_LANES = 16;     /* the CPU's K3_RT_LANES */
constexpr int RT_EXPERTS = 16;   /* experts per logits block (16 groups of 16 lanes = 256 threads) */
constexpr int RT_TOKENS = 4;     /* tokens per logits block: each gate element loaded once serves 4 tokens */
constexpr int RT_UNROLL = 32;    /* gate elements in flight per lane */
constexpr int SEL_THREADS = 128;

__device__ __forceinline__ float bf16f(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

template <bool GATE_F32>
__global__ void __launch_bounds__(RT_LANES * RT_EXPERTS)
    k3_router_logits_kernel(const uint16_t *__restrict__ x, const void *__restrict__ gate, int32_t m, int32_t ne,
                            int64_t h, float *__restrict__ logits) {
    const int lane = threadIdx.x % RT_LANES;
    const int e = blockIdx.x * RT_EXPERTS + threadIdx.x / RT_LANES;
    const int t0 = blockIdx.y * RT_TOKENS;
    /* no early return: the whole 16-lane group must reach the shuffles (e is uniform within a group) */
    const bool active = e < ne;
    float acc[RT_TOKENS];
#pragma unroll
    for (int t = 0; t < RT_TOKENS; t++) acc[t] = 0.0f;
    if (active) {
        /* RT_UNROLL gate loads issued before the (strictly ordered) adds consume them: memory-level parallelism
         * for a kernel whose order of summation is fixed */
        for (int64_t k0 = lane; k0 < h; k0 += (int64_t)RT_LANES * RT_UNROLL) {
            float g[RT_UNROLL];
#pragma unroll
            for (int u = 0; u < RT_UNROLL; u++) {
                const int64_t k = k0 + (int64_t)RT_LANES * u;
                g[u] = k >= h ? 0.0f
                              : GATE_F32 ? __ldg((const float *)gate + (int64_t)e * h + k)
                                         : bf16f(__ldg((const uint16_t *)gate + (int64_t)e * h + k));
            }
#pragma unroll
            for (int u = 0; u < RT_UNROLL; u++) {
                const int64_t k = k0 + (int64_t)RT_LANES * u;
                if (k >= h) break;
#pragma unroll
                for (int t = 0; t < RT_TOKENS; t++)
                    if (t0 + t < m)
                        acc[t] = __fadd_rn(acc[t], __fmul_rn(bf16f(__ldg(x + (int64_t)(t0 + t) * h + k)), g[u]));
            }
        }
    }
#pragma unroll
    for (int t = 0; t < RT_TOKENS; t++) {
        float v = acc[t];
#pragma unroll
        for (int w = RT_LANES / 2; w >= 1; w /= 2) v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, w, RT_LANES));
        if (active && lane == 0 && t0 + t < m) logits[(int64_t)(t0 + t) * ne + e] = v;
    }
}

/* (value, id) arg-max with ties to the lower id; a NaN value marks an expert already taken. */
__device__ __forceinline__ bool better(float v, int id, float bv, int bid) {
    return bid < 0 || v > bv || (v == bv && id < bid);
}

__global__ void __launch_bounds__(SEL_THREADS)
    k3_router_select_kernel(const float *__restrict__ logits, const float *__restrict__ bias, int32_t ne,
                            int32_t k, int32_t softmax, int32_t renorm, float scaling, int32_t *__restrict__ ids,
                            float *__restrict__ wts) {
    extern __shared__ float keys[]; /* [ne] */
    __shared__ float red_v[SEL_THREADS / 32];
    __shared__ int red_i[SEL_THREADS / 32];
    __shared__ int sel[32];
    __shared__ float sel_v[32];
    __shared__ float s_scalar;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t t = blockIdx.x;
    const float *lg = logits + t * ne;

    if (!softmax) {
        for (int e = tid; e < ne; e += SEL_THREADS) {
            float key = __fadd_rn(k3_rm_sigmoid(lg[e]), bias ? bias[e] : 0.0f);
            keys[e] = isnan(key) ? -INFINITY : key;
        }
    } else {
        /* NaN logits -> -inf; the maximum (exact, so any reduction order gives it) */
        float mx = -INFINITY;
        for (int e = tid; e < ne; e += SEL_THREADS) {
            float l = lg[e];
            l = isnan(l) ? -INFINITY : l;
            keys[e] = l;
            mx = fmaxf(mx, l);
        }
        for (int o = 16; o >= 1; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        if (lane == 0) red_v[warp] = mx;
        __syncthreads();
        mx = red_v[0];
        for (int w = 1; w < SEL_THREADS / 32; w++) mx = fmaxf(mx, red_v[w]);
        for (int e = tid; e < ne; e += SEL_THREADS) keys[e] = keys[e] == mx ? 1.0f : k3_rm_exp(__fsub_rn(keys[e], mx));
        __syncthreads();
        if (tid == 0) { /* the CPU's sequential sum, then its reciprocal */
            float sum = 0.0f;
            for (int e = 0; e < ne; e++) sum = __fadd_rn(sum, keys[e]);
            s_scalar = __fdiv_rn(1.0f, sum);
        }
        __syncthreads();
        const float inv = s_scalar;
        for (int e = tid; e < ne; e += SEL_THREADS) keys[e] = __fmul_rn(keys[e], inv);
    }
    __syncthreads();

    for (int j = 0; j < k; j++) {
        float bv = 0.0f;
        int bid = -1;
        for (int e = tid; e < ne; e += SEL_THREADS) {
            const float v = keys[e];
            if (!isnan(v) && better(v, e, bv, bid)) bv = v, bid = e;
        }
        for (int o = 16; o >= 1; o /= 2) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bid, o);
            if (oi >= 0 && better(ov, oi, bv, bid)) bv = ov, bid = oi;
        }
        if (lane == 0) red_v[warp] = bv, red_i[warp] = bid;
        __syncthreads();
        if (tid == 0) {
            for (int w = 1; w < SEL_THREADS / 32; w++)
                if (red_i[w] >= 0 && better(red_v[w], red_i[w], bv, bid)) bv = red_v[w], bid = red_i[w];
            sel[j] = bid; /* k <= E, so an untaken expert always exists */
            sel_v[j] = bv;
            keys[bid] = __int_as_float(0x7fc00000); /* taken */
        }
        __syncthreads();
    }

    if (tid == 0) {
        float w[32];
        float sum = 0.0f;
        for (int j = 0; j < k; j++) {
            if (softmax) {
                w[j] = sel_v[j];
            } else {
                const float l = lg[sel[j]];
                w[j] = isnan(l) ? 0.0f : k3_rm_sigmoid(l);
            }
            sum = __fadd_rn(sum, w[j]);
        }
        if (softmax) {
            const float scale = renorm ? __fdiv_rn(scaling, sum) : scaling;
            for (int j = 0; j < k; j++) w[j] = __fmul_rn(w[j], scale);
        } else if (renorm) {
            const float den = __fadd_rn(sum, 1e-20f);
            for (int j = 0; j < k; j++) w[j] = __fmul_rn(__fdiv_rn(w[j], den), scaling);
        } else {
            for (int j = 0; j < k; j++) w[j] = __fmul_rn(w[j], scaling);
        }
        for (int j = 0; j < k; j++) {
            ids[t * k + j] = sel[j];
            wts[t * k + j] = w[j];
        }
    }
}

} // namespace

extern "C" size_t k3_cuda_router_ws_bytes(const k3_router_desc *d) {
    return (size_t)d->max_tokens * (size_t)d->num_experts * sizeof(float);
}

extern "C" k3_status k3_cuda_router_run(k3_ctx *ctx, const k3_router_desc *d, int64_t m, const void *x,
                                        const void *gate, const float *bias, int32_t *topk_ids,
                                        float *topk_weights, void *ws, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    const int32_t ne = d->num_experts;
    if (m > (int64_t)65535 * RT_TOKENS)
        return k3_fail(ctx, K3_STATUS_UNSUPPORTED, "router run: the CUDA router takes at most %d tokens per call (got %lld)",
                       65535 * RT_TOKENS, (long long)m);
    {
        const void *ptrs[] = {x, gate, bias, topk_ids, topk_weights, ws};
        const char *names[] = {"x", "gate", "bias", "topk_ids", "topk_weights", "ws"};
        K3_TRY(k3_cuda_check_device_ptrs(ctx, stream, "router run", 6, ptrs, names));
    }
    float *logits = (float *)ws;
    dim3 grid1((unsigned)((ne + RT_EXPERTS - 1) / RT_EXPERTS), (unsigned)((m + RT_TOKENS - 1) / RT_TOKENS));
    if (d->gate_dtype == K3_DTYPE_F32)
        k3_router_logits_kernel<true><<<grid1, RT_LANES * RT_EXPERTS, 0, s>>>((const uint16_t *)x, gate, (int32_t)m,
                                                                              ne, d->hidden, logits);
    else
        k3_router_logits_kernel<false><<<grid1, RT_LANES * RT_EXPERTS, 0, s>>>((const uint16_t *)x, gate,
                                                                               (int32_t)m, ne, d->hidden, logits);
    K3_CUDA_LAUNCH_CHECK(ctx, "router logits kernel");
    k3_router_select_kernel<<<(unsigned)m, SEL_THREADS, (size_t)ne * sizeof(float), s>>>(
        logits, d->kind == K3_ROUTER_SIGMOID_NOAUX_TC ? bias : NULL, ne, d->top_k, d->kind == K3_ROUTER_SOFTMAX,
        d->renormalize, d->scaling_factor, topk_ids, topk_weights);
    K3_CUDA_LAUNCH_CHECK(ctx, "router select kernel");
    return K3_STATUS_SUCCESS;
}
