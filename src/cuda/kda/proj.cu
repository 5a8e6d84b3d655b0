/* KDA projection kernels: run_n (N small, K long) and run_k (K short). Both accumulate in fp32 through the
 * one FMA header (portable widen+fma on SM90, the mixed-precision bf16 FMA on SM100+).
 * Their inputs (x, and f_a from run_n) go through the read-only (.nc) path where the kernel is launched WITHOUT
 * programmatic dependent launch (after an event or a plain same-stream predecessor), so its producer has completed
 * before it starts. The one PDL launch (run_k after the sliced run_n) reads f_a with coherent loads after its wait. */
#include <stdint.h>
#include <stdlib.h>

#include <type_traits>

#include "cuda/common/check.cuh"
#include "cuda/common/fma.cuh"
#include "cuda/gemm/kernels.cuh"
#include "cuda/kda/proj.h"
#include "cuda/common/pdl.cuh"


namespace {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* One block per rows_per_block (R) output rows; thread t owns K elements [16t, 16t + 16) of every row. */
template <int M, int R>
__global__ void __launch_bounds__(512) kda_run_n_kernel(const uint16_t *__restrict__ x, int hidden,
                                                         const uint16_t *__restrict__ w, int rows,
                                                         uint16_t *__restrict__ fab) {
    __shared__ float partial[16][M * R];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, nwarps = blockDim.x >> 5;
    const int row0 = blockIdx.x * R;

    const uint64_t pol = k3_policy_evict_first();
    k3_bf16x8 wv[R][2];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int row = min(row0 + r, rows - 1); /* clamp: the duplicate row's result is never stored */
        const uint16_t *p = w + (size_t)row * hidden + (size_t)t * 16;
        wv[r][0] = k3_bf16x8_from_u4(k3_ld_stream(p, pol));
        wv[r][1] = k3_bf16x8_from_u4(k3_ld_stream(p + 8, pol));
    }
    float acc[M][R];
#pragma unroll
    for (int i = 0; i < M; i++) {
        const uint16_t *p = x + (size_t)i * hidden + (size_t)t * 16;
        const k3_bf16x8 x0 = k3_bf16x8_from_u4(k3_ld_cached(p));
        const k3_bf16x8 x1 = k3_bf16x8_from_u4(k3_ld_cached(p + 8));
#pragma unroll
        for (int r = 0; r < R; r++) acc[i][r] = k3_dot8_bf16(wv[r][1], x1, k3_dot8_bf16(wv[r][0], x0, 0.0f));
    }
#pragma unroll
    for (int i = 0; i < M; i++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float s = warp_sum(acc[i][r]);
            if (lane == 0) partial[warp][i * R + r] = s;
        }
    __syncthreads();
    /* fixed summation order over warps: bitwise reproducible */
    for (int j = t; j < M * R; j += blockDim.x) {
        const int i = j / R, r = j % R;
        if (row0 + r >= rows) continue;
        float s = 0.0f;
        for (int q = 0; q < nwarps; q++) s += partial[q][j];
        fab[(size_t)i * rows + row0 + r] = k3_f32_to_bf16_dev(s);
    }
}

/* The narrow shape of run_n (K3_KDA_RUN_N_NARROW): one row per block of 128 threads, thread t owning the V = hidden
 * / 1024 vectors of 8 elements at (128 v + t) * 8 (each load instruction of the block reads 2 KB contiguous). Why:
 * the table's QKVG kernel fills every SM in one wave, and a wide block (hidden / 16 threads) does not fit beside it;
 * a 128-thread block of <= 80 registers (m <= 4: __launch_bounds__(128, 6)) fits beside three 138-register
 * 128-thread blocks, one of <= 104 (m > 4: (128, 5)) beside six 136-register 64-thread blocks (the QKVG kernels
 * the SM90 table has chosen at M 1-8). It first asks for all of its x in L1 (prefetch.global.L1); those requests
 * come back while QKVG streams, when every round trip takes microseconds (bench/NOTES-kda.md, the narrow shape),
 * so the token loop is unrolled (m <= 4) or takes two tokens per iteration, their loads issued together. */
template <int M, int V>
__global__ void __launch_bounds__(128, M <= 4 ? 6 : 5)
    kda_run_n_narrow_kernel(const uint16_t *__restrict__ x, int hidden, const uint16_t *__restrict__ w, int rows,
                            uint16_t *__restrict__ fab) {
    __shared__ float partial[4][M];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, row = blockIdx.x;
    const uint16_t *wp = w + (size_t)row * hidden + (size_t)t * 8;
    k3_bf16x8 wv[V];
    const uint64_t pol = k3_policy_evict_first();
#pragma unroll
    for (int v = 0; v < V; v++) wv[v] = k3_bf16x8_from_u4(k3_ld_stream(wp + v * 1024, pol));
    for (int i = 0; i < M; i++) {
        const uint16_t *p = x + (size_t)i * hidden + (size_t)t * 8;
#pragma unroll
        for (int v = 0; v < V; v++) asm volatile("prefetch.global.L1 [%0];" ::"l"(p + v * 1024));
    }
    if constexpr (M <= 4) { /* every token's x loads issued together */
#pragma unroll
        for (int i = 0; i < M; i++) {
            const uint16_t *p = x + (size_t)i * hidden + (size_t)t * 8;
            float acc = 0.0f;
#pragma unroll
            for (int v = 0; v < V; v++) acc = k3_dot8_bf16(wv[v], k3_bf16x8_from_u4(k3_ld_cached(p + v * 1024)), acc);
            acc = warp_sum(acc);
            if (lane == 0) partial[warp][i] = acc;
        }
    } else {
        /* Two tokens per iteration, their x loads issued together (unrolled further, the compiler hoists every
         * token's x loads and spills; one token per iteration waits a round trip per token beside QKVG,
         * bench/NOTES-kda.md). An odd m's last pair repeats token m - 1 (not stored): its loads need no predicate. */
#pragma unroll 1
        for (int i0 = 0; i0 < M; i0 += 2) {
            float acc[2];
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const uint16_t *p = x + (size_t)min(i0 + j, M - 1) * hidden + (size_t)t * 8;
                acc[j] = 0.0f;
#pragma unroll
                for (int v = 0; v < V; v++)
                    acc[j] = k3_dot8_bf16(wv[v], k3_bf16x8_from_u4(k3_ld_cached(p + v * 1024)), acc[j]);
            }
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const float s = warp_sum(acc[j]);
                if (lane == 0 && i0 + j < M) partial[warp][i0 + j] = s;
            }
        }
    }
    __syncthreads();
    if (t < M) /* fixed summation order over the 4 warps: bitwise reproducible */
        fab[(size_t)t * rows + row] =
            k3_f32_to_bf16_dev(((partial[0][t] + partial[1][t]) + partial[2][t]) + partial[3][t]);
}

/* The sliced shape of run_n (K3_KDA_RUN_N_SLICED): blocks of 128 threads = 16 output rows x 8 lanes, each block one
 * K slice (S of them) of its 16 rows, so that groups x slices is about one block per SM. Why: beside the one-wave
 * QKVG kernel each SM serves its warps' memory requests in turn (bench/NOTES-kda.md, the sliced F_AB), so the
 * branch costs QKVG about what it adds to the busiest SM. A narrow block (one row over all of K) adds 14 KB of
 * weights and 14 KB x m of x to its SM (twice that on the SMs that get two of the 144); a sliced block adds 16 KB of
 * weights and 1 KB x m of x (TP8 on 132 SMs: 9 groups x 14 slices = 126 blocks).
 * <= 104 registers (__launch_bounds__(128, 5)): one block fits beside six of the table's 136-register 64-thread QKVG
 * blocks. A block stages its x slice in shared memory, eight tokens at a time (<= 8 KB; 10 KB did not fit beside the
 * QKVG tiles), each lane dots its vectors (v = lane, lane + 8, ..., in order) for every token, a butterfly adds the
 * 8 lanes, and the slice's partial sums go to part[slice][token][row]. The last block of a group to arrive (a count
 * per group, release / acquire by one thread) adds the S partials in slice order and stores the group's fab rows:
 * bitwise reproducible; it also returns the count to zero, so the next launch (ordered after this one on the GPU)
 * starts from zero. It triggers its PDL successor (run_k) at its start, so f_b's weights load while it runs rather
 * than after it, which the overlap needs at the larger m (bench/NOTES-kda.md). */
constexpr int SL_ROWS = 16, SL_LANES = 8, SL_VMAX = 8, SL_SMAX = 16, SL_TG = 8;

template <int M>
__global__ void __launch_bounds__(128, 5) kda_run_n_sliced_kernel(const uint16_t *__restrict__ x, int hidden,
                                                                const uint16_t *__restrict__ w, int rows, int slices,
                                                                float *__restrict__ part, uint32_t *count,
                                                                uint16_t *__restrict__ fab) {
    extern __shared__ uint4 xs[]; /* [SL_TG][nv] */
    __shared__ int last;
    const int t = threadIdx.x, r = t / SL_LANES, l = t % SL_LANES;
    const int grp = blockIdx.x / slices, s = blockIdx.x % slices, row = grp * SL_ROWS + r;
    const int nvec = hidden / 8, v_lo = (int)((int64_t)s * nvec / slices), v_hi = (int)((int64_t)(s + 1) * nvec / slices);
    const int nv = v_hi - v_lo;
    const uint16_t *wr = w + (size_t)min(row, rows - 1) * hidden + (size_t)v_lo * 8; /* clamp: never stored */
    k3_pdl_launch(); /* f_b (run_k, launched with PDL after this kernel) may start loading its weights */
    const uint64_t pol = k3_policy_evict_first();
    uint4 wv[SL_VMAX];
#pragma unroll
    for (int j = 0; j < SL_VMAX; j++) {
        const int v = l + SL_LANES * j;
        wv[j] = v < nv ? k3_ld_stream(wr + (size_t)v * 8, pol) : make_uint4(0, 0, 0, 0);
    }
    float acc[M];
#pragma unroll
    for (int i = 0; i < M; i++) acc[i] = 0.0f;
    /* SL_TG tokens' x slices at a time (<= 8 KB of shared memory at TP8: more did not fit beside the QKVG tiles) */
#pragma unroll
    for (int i0 = 0; i0 < M; i0 += SL_TG) {
        constexpr int TG = M < SL_TG ? M : SL_TG;
        if (i0) __syncthreads(); /* the previous group's x is consumed */
        /* every load of the group issued before the first store: one L2 round trip, not one per 128 vectors
         * (each takes microseconds beside QKVG) */
        constexpr int XPT = (SL_TG * SL_LANES * SL_VMAX + 127) / 128;
        const int n = min(TG, M - i0) * nv;
        uint4 xr[XPT];
#pragma unroll
        for (int k = 0; k < XPT; k++) {
            const int i = t + 128 * k, tk = i / nv, v = i - tk * nv;
            xr[k] = i < n ? k3_ld_cached(x + (size_t)(i0 + tk) * hidden + (size_t)(v_lo + v) * 8) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int k = 0; k < XPT; k++)
            if (t + 128 * k < n) xs[t + 128 * k] = xr[k];
        __syncthreads();
#pragma unroll
        for (int j = 0; j < SL_VMAX; j++) {
            const int v = l + SL_LANES * j;
            if (v < nv) {
                const k3_bf16x8 wf = k3_bf16x8_from_u4(wv[j]);
#pragma unroll
                for (int i = 0; i < TG; i++)
                    if (i0 + i < M) acc[i0 + i] = k3_dot8_bf16(wf, k3_bf16x8_from_u4(xs[i * nv + v]), acc[i0 + i]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < M; i++)
#pragma unroll
        for (int o = SL_LANES / 2; o > 0; o >>= 1) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o, SL_LANES);
    if (row < rows)
#pragma unroll
        for (int i = 0; i < M; i++) /* lane (i % SL_LANES) stores token i, spreading the stores */
            if (l == i % SL_LANES) __stcg(part + ((size_t)s * M + i) * rows + row, acc[i]);
    __syncthreads();
    if (t == 0) {
        asm volatile("fence.acq_rel.gpu;" ::: "memory"); /* release: the block's partials before its arrival */
        last = atomicAdd(&count[grp], 1u) == (uint32_t)slices - 1u;
        if (last) asm volatile("fence.acq_rel.gpu;" ::: "memory"); /* acquire: the other slices' partials */
    }
    __syncthreads();
    if (!last) return;
    for (int e = t; e < M * SL_ROWS; e += 128) {
        const int i = e / SL_ROWS, rr = grp * SL_ROWS + e % SL_ROWS;
        float p[SL_SMAX]; /* every slice's load issued before the first add: one L2 round trip */
#pragma unroll
        for (int k = 0; k < SL_SMAX; k++) p[k] = k < slices && rr < rows ? __ldcg(part + ((size_t)k * M + i) * rows + rr) : 0.0f;
        float v = p[0];
#pragma unroll
        for (int k = 1; k < SL_SMAX; k++) v += p[k]; /* absent slices add +0.0: exact */
        if (rr < rows) fab[(size_t)i * rows + rr] = k3_f32_to_bf16_dev(v);
    }
    if (t == 0) count[grp] = 0; /* every slice of this launch has arrived */
}

/* 16 lanes per output row, 8 K elements each (K = 128), butterfly reduction over the 16 lanes; every lane ends
 * with every token's sum and lane (i % 16) stores token i, spreading the stores. */
template <int M, bool PDL>
__global__ void __launch_bounds__(256) kda_run_k_kernel(const uint16_t *__restrict__ fa, int fa_stride,
                                                        const uint16_t *__restrict__ w, int rows,
                                                        uint16_t *__restrict__ g1) {
    const int gid = blockIdx.x * blockDim.x + threadIdx.x;
    const int row = gid >> 4, sub = gid & 15;
    const bool valid = row < rows;
    const k3_bf16x8 wv =
        k3_bf16x8_from_u4(valid ? k3_ld_stream(w + (size_t)row * K3_KDA_FA_DIM + sub * 8, k3_policy_evict_first()) : make_uint4(0, 0, 0, 0));
    /* PDL (after the sliced F_AB): the weights above load while run_n finishes; f_a only after its completion, and
     * through the coherent path (run_n wrote it) */
    if constexpr (PDL) k3_pdl_wait();
    float acc[M];
#pragma unroll
    for (int i = 0; i < M; i++) {
        const uint16_t *fp = fa + (size_t)i * fa_stride + sub * 8;
        const k3_bf16x8 av = k3_bf16x8_from_u4(PDL ? k3_ld_act(fp) : k3_ld_cached(fp));
        acc[i] = k3_dot8_bf16(wv, av, 0.0f);
    }
#pragma unroll
    for (int i = 0; i < M; i++)
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o, 16);
    if (!valid) return;
#pragma unroll
    for (int i = 0; i < M; i++)
        if (sub == (i & 15)) g1[(size_t)i * rows + row] = k3_f32_to_bf16_dev(acc[i]);
}

template <int M>
cudaError_t launch_run_n_narrow(const uint16_t *x, int hidden, const uint16_t *w, int rows, uint16_t *fab,
                                cudaStream_t s) {
    switch (hidden / 1024) { /* hidden % 1024 == 0, <= 8192 */
#define K3_RUN_N_NARROW(V) \
    case V: kda_run_n_narrow_kernel<M, V><<<rows, 128, 0, s>>>(x, hidden, w, rows, fab); break;
        K3_RUN_N_NARROW(1) K3_RUN_N_NARROW(2) K3_RUN_N_NARROW(3) K3_RUN_N_NARROW(4) K3_RUN_N_NARROW(5)
        K3_RUN_N_NARROW(6) K3_RUN_N_NARROW(7) K3_RUN_N_NARROW(8)
#undef K3_RUN_N_NARROW
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

template <int M>
cudaError_t launch_run_n(const uint16_t *x, int hidden, const uint16_t *w, int rows, int shape,
                         const k3_cuda_kda_sliced *sl, uint16_t *fab, cudaStream_t s) {
    if (shape == K3_KDA_RUN_N_NARROW) return launch_run_n_narrow<M>(x, hidden, w, rows, fab, s);
    if (shape == K3_KDA_RUN_N_SLICED) {
        kda_run_n_sliced_kernel<M><<<sl->groups * sl->slices, 128, (size_t)(M < SL_TG ? M : SL_TG) * sl->nv_max * 16, s>>>(
            x, hidden, w, rows, sl->slices, sl->part, sl->count, fab);
        return cudaGetLastError();
    }
    const dim3 block(hidden / 16);
    if (shape == K3_KDA_RUN_N_ROWS2)
        kda_run_n_kernel<M, 2><<<(rows + 1) / 2, block, 0, s>>>(x, hidden, w, rows, fab);
    else
        kda_run_n_kernel<M, 1><<<rows, block, 0, s>>>(x, hidden, w, rows, fab);
    return cudaGetLastError();
}

template <int M>
cudaError_t launch_run_k(const uint16_t *fa, int fa_stride, const uint16_t *w, int rows, uint16_t *g1, bool pdl,
                         cudaStream_t s) {
    const int threads = 256, blocks = (rows * 16 + threads - 1) / threads;
    if (pdl) return k3_launch_pdl(kda_run_k_kernel<M, true>, dim3(blocks), dim3(threads), 0, s, fa, fa_stride, w, rows, g1);
    kda_run_k_kernel<M, false><<<blocks, threads, 0, s>>>(fa, fa_stride, w, rows, g1);
    return cudaGetLastError();
}

/* Token count as a template argument so the accumulators stay in registers. */
template <typename F>
cudaError_t dispatch_m(int64_t m, F f) {
    switch (m) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 8: return f(std::integral_constant<int, 8>{});
    case 9: return f(std::integral_constant<int, 9>{});
    case 10: return f(std::integral_constant<int, 10>{});
    case 11: return f(std::integral_constant<int, 11>{});
    case 12: return f(std::integral_constant<int, 12>{});
    case 13: return f(std::integral_constant<int, 13>{});
    case 14: return f(std::integral_constant<int, 14>{});
    case 15: return f(std::integral_constant<int, 15>{});
    default: return f(std::integral_constant<int, 16>{});
    }
}

} // namespace

extern "C" k3_status k3_cuda_kda_sliced_create(k3_ctx *ctx, int64_t hidden, int64_t rows, k3_cuda_kda_sliced **out) {
    *out = NULL;
    /* the plan bounds both (src/api/kda_proj.c); checked here too since the int casts and the division by the
     * group count below are only defined inside these ranges */
    if (hidden < 8 || hidden > 8192 || rows < 1 || rows > (INT64_C(1) << 24))
        return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT, "kda sliced run_n: hidden %lld or rows %lld out of range",
                       (long long)hidden, (long long)rows);
    k3_cuda_kda_sliced *sl = (k3_cuda_kda_sliced *)calloc(1, sizeof *sl);
    if (!sl) return k3_fail(ctx, K3_STATUS_OUT_OF_MEMORY, "out of host memory");
    /* about one block per SM (groups x slices <= SMs), and at most SL_LANES x SL_VMAX = 64 vectors per slice: what
     * a block's lanes hold, which also keeps the shared x of SL_TG tokens at <= 8 KB */
    const int nvec = (int)(hidden / 8), sms = ctx->arch.sm_count > 0 ? ctx->arch.sm_count : 132;
    sl->groups = (int)((rows + SL_ROWS - 1) / SL_ROWS);
    sl->slices = sms / sl->groups;
    const int need = (nvec + SL_LANES * SL_VMAX - 1) / (SL_LANES * SL_VMAX);
    if (sl->slices < need) sl->slices = need;
    sl->nv_max = (nvec + sl->slices - 1) / sl->slices;
    if (sl->slices > SL_SMAX) {
        free(sl);
        return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT,
                       "kda: run_n_shape K3_KDA_RUN_N_SLICED takes hidden <= %d (got %lld)",
                       SL_SMAX * SL_LANES * SL_VMAX * 8, (long long)hidden);
    }
    const size_t part = (size_t)sl->slices * K3_KDA_MAX_TOKENS * (size_t)rows * sizeof(float);
    cudaError_t e = cudaMalloc((void **)&sl->part, part);
    if (e == cudaSuccess) e = cudaMalloc((void **)&sl->count, (size_t)sl->groups * sizeof(uint32_t));
    if (e == cudaSuccess) e = cudaMemset(sl->count, 0, (size_t)sl->groups * sizeof(uint32_t));
    if (e == cudaSuccess) e = cudaDeviceSynchronize(); /* plan time: the counts are zero before any run */
    if (e != cudaSuccess) {
        k3_cuda_kda_sliced_destroy(sl);
        return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "kda sliced run_n: device buffers (%zu bytes): %s", part,
                       cudaGetErrorString(e));
    }
    *out = sl;
    return K3_STATUS_SUCCESS;
}

extern "C" void k3_cuda_kda_sliced_destroy(k3_cuda_kda_sliced *sl) {
    if (!sl) return;
    if (sl->part) cudaFree(sl->part);
    if (sl->count) cudaFree(sl->count);
    free(sl);
}

extern "C" k3_status k3_cuda_kda_run_n(k3_ctx *ctx, int64_t m, const void *x, int64_t hidden, const void *w,
                                       int64_t rows, int32_t shape, const k3_cuda_kda_sliced *sl, void *fab,
                                       void *stream) {
    const bool narrow = shape == K3_KDA_RUN_N_NARROW, sliced = shape == K3_KDA_RUN_N_SLICED;
    if (m < 1 || m > K3_KDA_MAX_TOKENS || hidden % 512 != 0 || hidden > 8192 || rows < 1 ||
        (shape != K3_KDA_RUN_N_ROWS1 && shape != K3_KDA_RUN_N_ROWS2 && !narrow && !sliced) ||
        (narrow && hidden % 1024 != 0) || (sliced && !sl))
        return k3_fail(ctx, K3_STATUS_INTERNAL_ERROR, "kda run_n: unchecked arguments reached the launcher");
    const cudaError_t e = dispatch_m(m, [&](auto mc) {
        return launch_run_n<decltype(mc)::value>((const uint16_t *)x, (int)hidden, (const uint16_t *)w, (int)rows,
                                                 shape, sl, (uint16_t *)fab, (cudaStream_t)stream);
    });
    if (e != cudaSuccess)
        return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "launch of kda run_n failed: %s", cudaGetErrorString(e));
    return K3_STATUS_SUCCESS;
}

extern "C" k3_status k3_cuda_kda_run_k(k3_ctx *ctx, int64_t m, const void *fa, int64_t fa_stride, const void *w,
                                       int64_t rows, int32_t after_shape, void *g1, void *stream) {
    /* only the sliced run_n triggers its successor early (k3_pdl_launch at its start) */
    const bool pdl = after_shape == K3_KDA_RUN_N_SLICED;
    if (m < 1 || m > K3_KDA_MAX_TOKENS || fa_stride < K3_KDA_FA_DIM || fa_stride % 8 != 0 || rows < 1)
        return k3_fail(ctx, K3_STATUS_INTERNAL_ERROR, "kda run_k: unchecked arguments reached the launcher");
    const cudaError_t e = dispatch_m(m, [&](auto mc) {
        return launch_run_k<decltype(mc)::value>((const uint16_t *)fa, (int)fa_stride, (const uint16_t *)w,
                                                 (int)rows, (uint16_t *)g1, pdl, (cudaStream_t)stream);
    });
    if (e != cudaSuccess)
        return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "launch of kda run_k failed: %s", cudaGetErrorString(e));
    return K3_STATUS_SUCCESS;
}
