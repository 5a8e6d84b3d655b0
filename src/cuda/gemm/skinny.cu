/* CUDA-core skinny BF16 GEMM for decode: y[m, n] = x[m, k] w[n, k]^T (+ residual), fp32 accumulation.
 *
 * Each block owns ROWS weight rows; its THREADS threads stride over K in 16-byte vectors (8 BF16), UNROLL
 * vectors per row in flight per thread, and the next batch of weight vectors is loaded before the current
 * one is consumed (register double buffer) so the memory pipe never drains. M (tokens) is a template
 * parameter so the M x ROWS fp32 accumulators stay in registers. Reduction: warp shuffles, then one
 * shared-memory pass across warps, in a fixed order (bitwise reproducible).
 * With PDL the first weight batch is issued before griddepcontrol.wait: it overlaps the previous kernel. */
#include "cuda/common/fma.cuh"
#include "cuda/gemm/kernels.cuh"

namespace {

template <int THREADS, int ROWS, int UNROLL, int STATIC_K, int M>
__global__ void __launch_bounds__(THREADS)
    k3_skinny_kernel(const uint16_t *__restrict__ x, int64_t x_stride, const uint16_t *__restrict__ w,
                     const uint16_t *residual, uint16_t *y, int64_t y_stride, int32_t n, int32_t k_dyn) {
    constexpr int WARPS = THREADS / 32;
    const int k = STATIC_K ? STATIC_K : k_dyn;
    const int kv = k / 8; /* 16-byte vectors per row */
    const int row0 = blockIdx.x * ROWS;
    const int tid = threadIdx.x;
    const uint64_t pol = k3_policy_evict_first();

    /* Rows past n (last block) read row n-1 (valid memory) and are never stored. */
    const uint4 *wrow[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        int row = row0 + r < n ? row0 + r : n - 1;
        wrow[r] = reinterpret_cast<const uint4 *>(w + (size_t)row * (size_t)k);
    }

    float acc[M][ROWS];
#pragma unroll
    for (int mi = 0; mi < M; mi++)
#pragma unroll
        for (int r = 0; r < ROWS; r++) acc[mi][r] = 0.0f;

    uint4 wcur[UNROLL][ROWS];
#pragma unroll
    for (int j = 0; j < UNROLL; j++) {
        const int v = tid + j * THREADS;
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            wcur[j][r] = v < kv ? k3_ld_stream(wrow[r] + v, pol) : make_uint4(0, 0, 0, 0);
    }
    /* Let the next kernel launch now: it fires only once every block of this grid has reached this point (so
     * it never takes slots our blocks need), and the next kernel's own wait still orders its reads after our
     * completion; its blocks then prefetch their weights while ours finish. */
    k3_pdl_launch();
    k3_pdl_wait(); /* x and residual come from the previous kernel */

    for (int v0 = tid; v0 < kv; v0 += THREADS * UNROLL) {
        uint4 wnext[UNROLL][ROWS];
#pragma unroll
        for (int j = 0; j < UNROLL; j++) {
            const int v = v0 + (UNROLL + j) * THREADS;
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                wnext[j][r] = v < kv ? k3_ld_stream(wrow[r] + v, pol) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < UNROLL; j++) {
            const int v = v0 + j * THREADS;
            if (v < kv) {
                k3_bf16x8 xo[M];
#pragma unroll
                for (int mi = 0; mi < M; mi++)
                    xo[mi] = k3_bf16x8_from_u4(k3_ld_act(x + (size_t)mi * (size_t)x_stride + (size_t)v * 8));
#pragma unroll
                for (int r = 0; r < ROWS; r++) {
                    const k3_bf16x8 wo = k3_bf16x8_from_u4(wcur[j][r]);
#pragma unroll
                    for (int mi = 0; mi < M; mi++) acc[mi][r] = k3_dot8_bf16(wo, xo[mi], acc[mi][r]);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < UNROLL; j++)
#pragma unroll
            for (int r = 0; r < ROWS; r++) wcur[j][r] = wnext[j][r];
    }

    /* Warp reduction (butterfly), then across warps through shared memory. */
    __shared__ float red[WARPS][M * ROWS];
    const int lane = tid & 31, warp = tid >> 5;
#pragma unroll
    for (int mi = 0; mi < M; mi++)
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            float s = acc[mi][r];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
            if (lane == 0) red[warp][mi * ROWS + r] = s;
        }
    __syncthreads();
    for (int e = tid; e < M * ROWS; e += THREADS) {
        const int mi = e / ROWS, r = e % ROWS, row = row0 + r;
        if (row < n) {
            float s = 0.0f;
#pragma unroll
            for (int wi = 0; wi < WARPS; wi++) s += red[wi][e];
            const size_t o = (size_t)mi * (size_t)y_stride + (size_t)row;
            if (residual) s += k3_bf16_to_f32_dev(residual[o]); /* plain load: residual may alias y */
            y[o] = k3_f32_to_bf16_dev(s);
        }
    }
}

template <int THREADS, int ROWS, int UNROLL, int STATIC_K, int M>
cudaError_t k3_skinny_launch_m(const k3_gemm_args *a, cudaStream_t stream, int pdl) {
    cudaLaunchConfig_t lc;
    cudaLaunchAttribute attr[1];
    k3_gemm_launch_cfg_init(&lc, attr, dim3((unsigned)((a->n + ROWS - 1) / ROWS)), dim3(THREADS), stream, pdl);
    return cudaLaunchKernelEx(&lc, k3_skinny_kernel<THREADS, ROWS, UNROLL, STATIC_K, M>,
                              static_cast<const uint16_t *>(a->x), (int64_t)a->x_stride,
                              static_cast<const uint16_t *>(a->w), static_cast<const uint16_t *>(a->residual),
                              static_cast<uint16_t *>(a->y), (int64_t)a->y_stride, (int32_t)a->n, (int32_t)a->k);
}

} // namespace

template <int THREADS, int ROWS, int UNROLL, int STATIC_K>
cudaError_t k3_skinny_launch(const k3_gemm_args *a, cudaStream_t stream, int pdl) {
    static_assert(THREADS % 32 == 0 && THREADS <= 1024, "THREADS must be whole warps");
    static_assert(STATIC_K % 8 == 0, "STATIC_K must be a multiple of 8");
    switch (a->m) { /* M 1..8: the registry's max_m for this family */
    case 1: return k3_skinny_launch_m<THREADS, ROWS, UNROLL, STATIC_K, 1>(a, stream, pdl);
    case 2: return k3_skinny_launch_m<THREADS, ROWS, UNROLL, STATIC_K, 2>(a, stream, pdl);
    case 3: return k3_skinny_launch_m<THREADS, ROWS, UNROLL, STATIC_K, 3>(a, stream, pdl);
    case 4: return k3_skinny_launch_m<THREADS, ROWS, UNROLL, STATIC_K, 4>(a, stream, pdl);
    case 5: return k3_skinny_launch_m<THREADS, ROWS, UNROLL, STATIC_K, 5>(a, stream, pdl);
    case 6: return k3_skinny_launch_m<THREADS, ROWS, UNROLL, STATIC_K, 6>(a, stream, pdl);
    case 7: return k3_skinny_launch_m<THREADS, ROWS, UNROLL, STATIC_K, 7>(a, stream, pdl);
    case 8: return k3_skinny_launch_m<THREADS, ROWS, UNROLL, STATIC_K, 8>(a, stream, pdl);
    default: return cudaErrorInvalidValue;
    }
}

#define K3_GEMM_SKINNY(nm, thr, rows, unroll, sk) \
    template cudaError_t k3_skinny_launch<thr, rows, unroll, sk>(const k3_gemm_args *, cudaStream_t, int);
#define K3_GEMM_MMA(nm, warps, tiles, unroll, cluster_k, pf, minb, l2b, pipe)
#define K3_GEMM_MMA_WT(nm, warps, tiles, unroll, minb)
#define K3_GEMM_MMA_BULK(nm, warps, bk, smem_kb, cluster_k)
#include "plan/gemm_configs.def"
#undef K3_GEMM_SKINNY
#undef K3_GEMM_MMA
#undef K3_GEMM_MMA_WT
#undef K3_GEMM_MMA_BULK
