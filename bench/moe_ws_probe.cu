// Diagnostic probe (not part of the library or its build), session 23: does a warp-specialized weight stream (one
// producer warp, a deep shared-memory ring filled by bulk copies, consumer warps that only decode and multiply)
// hide the FP4 decode under the DRAM stream better than the library's per-warp cp.async rings?
//
// Both kernels stream the same bytes in the same units as the library's GEMM1 at K3 TP8 (a unit = 16 gate rows and
// 16 up rows of 1,792 bytes: two contiguous 28 KB spans; 1,488 units = TP8 M 4's ~62 experts x 24 tiles, 85 MB) and
// run the same per-16-byte work on every weight byte: the library's E2M1 decode (k3_nv_decode_word's 11 integer ops
// per word), the BF16x2 scale multiply (4 per word) and one m16n8k16 MMA per word into a live accumulator.
//   ring  the library's structure: 4 warps per block, each its own S-stage cp.async ring of 2 KB chunks
//         (1 KB gate + 1 KB up; 4 x 16-byte copies per lane), __launch_bounds__(128, 4);
//   ws    1 producer warp + 4 consumer warps: NS stages of 8 KB (4 KB gate + 4 KB up), one cp.async.bulk per piece
//         on a full/empty mbarrier pair; every consumer lane takes 64 bytes of each stage, __launch_bounds__(160, 4).
// Each kernel also runs with the work off (compute 0: the stream alone). Cold weights: copies rotated, each > L2.
// Every variant asks for >= 52 KB of shared memory, so both run 4 blocks (16 working warps) per SM, as the library's
// TP8 GEMM1 does (its registers, not its shared memory, set that there).
// Build and run: nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o moe_ws_probe moe_ws_probe.cu
//                ./moe_ws_probe [KB: the shared memory every block asks for, default 52: 4 blocks per SM]
// Measured (calls s23e, s23f): bench/RESULTS.md session 23; what it means: bench/NOTES-moe.md session 23.
#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../src/cuda/common/bulk_copy.cuh"    /* the library's mbarrier wait */
#include "probe_fp4_work.cuh"                /* the library's decode and the per-word work */
#define CK(x)                                                                                                        \
    do {                                                                                                             \
        cudaError_t e_ = (x);                                                                                        \
        if (e_ != cudaSuccess) {                                                                                     \
            printf("CUDA %s line %d\n", cudaGetErrorString(e_), __LINE__);                                          \
            return 1;                                                                                                \
        }                                                                                                            \
    } while (0)

constexpr int ROWB = 1792;            /* bytes per FP4 row at K 3584 */
constexpr int SPAN = 16 * ROWB;       /* one row set of a unit: 28,672 bytes */
constexpr int UNIT = 2 * SPAN;        /* gate + up */
static int PIN_SMEM = 52 * 1024; /* every variant asks for at least this: 4 blocks per SM (argv[1]: another size) */
extern __shared__ __align__(128) uint4 dyn[];

/* ring: the library's structure. Warp w takes chunks w, w + 4, ... of its unit; a chunk is 1 KB of the gate span
 * and 1 KB of the up span at the same offset; lane l copies 16 B at 16 l and 512 + 16 l of each. */
template <int S, bool WORK>
__global__ void __launch_bounds__(128, 4) ring_kernel(const uint8_t *w, float *out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint8_t *u = w + (size_t)blockIdx.x * UNIT;
    uint4 *ring = dyn + warp * S * 128; /* 2 KB per stage */
    constexpr int CH = SPAN / 1024;     /* 28 chunks per unit, 7 per warp */
    const int n = (CH - warp + 3) / 4;
    auto issue = [&](int k) {
        uint4 *st = ring + (k % S) * 128;
        const int off = (warp + 4 * k) * 1024;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint8_t *g = u + (i >> 1) * SPAN + off + (i & 1) * 512 + 16 * lane;
            const uint32_t a = (uint32_t)__cvta_generic_to_shared(st + i * 32 + lane);
            asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(a), "l"(g) : "memory");
        }
    };
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const uint32_t sc = 0x3f803f80u + (uint32_t)lane;
    for (int k = 0; k < S - 1; k++) {
        if (k < n) issue(k);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    for (int k = 0; k < n; k++) {
        if (k + S - 1 < n) issue(k + S - 1);
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_group %0;" ::"n"(S - 1) : "memory");
        const uint4 *st = ring + (k % S) * 128;
#pragma unroll
        for (int i = 0; i < 4; i++) use16<WORK>(st[i * 32 + lane], sc, acc);
    }
    if (acc[0] + acc[1] + acc[2] + acc[3] == 12345.f) out[blockIdx.x] = acc[0];
}

__device__ __forceinline__ void mb_init(uint64_t *b, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"((uint32_t)__cvta_generic_to_shared(b)), "r"(count)
                 : "memory");
}
/* ws: warp 0 produces (lane 0 issues two 4 KB bulk copies per stage: gate and up at the same offset), warps 1-4
 * consume: consumer c's lane l reads the 16-byte words c * 32 + l and 128 + c * 32 + l of each 4 KB piece, 64 bytes
 * per stage in all, as a ring warp's lane reads per chunk. */
template <int NS, bool WORK>
__global__ void __launch_bounds__(160, 4) ws_kernel(const uint8_t *w, float *out) {
    constexpr int PIECE = 4096, STAGE = 2 * PIECE, N = SPAN / PIECE; /* 7 stages of 8 KB per unit */
    uint64_t *full = (uint64_t *)(dyn + NS * STAGE / 16), *empty = full + NS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint8_t *u = w + (size_t)blockIdx.x * UNIT;
    if (threadIdx.x == 0) {
        for (int s = 0; s < NS; s++) mb_init(&full[s], 1), mb_init(&empty[s], 4);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    if (warp == 0) {
        if (lane == 0)
            for (int k = 0; k < N; k++) {
                const int s = k % NS;
                if (k >= NS) k3_mbar_wait(&empty[s], ((k / NS) - 1) & 1);
                const uint32_t fb = (uint32_t)__cvta_generic_to_shared(&full[s]);
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(fb), "r"(STAGE) : "memory");
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint32_t dst = (uint32_t)__cvta_generic_to_shared(dyn + (s * STAGE + h * PIECE) / 16);
                    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                                 " [%0], [%1], %2, [%3];"
                                 ::"r"(dst), "l"(u + h * SPAN + (size_t)k * PIECE), "r"(PIECE), "r"(fb)
                                 : "memory");
                }
            }
        return;
    }
    const int c = warp - 1;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const uint32_t sc = 0x3f803f80u + (uint32_t)lane;
    for (int k = 0; k < N; k++) {
        const int s = k % NS;
        k3_mbar_wait(&full[s], (k / NS) & 1);
        const uint4 *st = dyn + s * STAGE / 16;
#pragma unroll
        for (int i = 0; i < 4; i++) use16<WORK>(st[(i >> 1) * (PIECE / 16) + ((i & 1) * 4 + c) * 32 + lane], sc, acc);
        __syncwarp();
        if (lane == 0)
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"((uint32_t)__cvta_generic_to_shared(&empty[s]))
                         : "memory");
    }
    if (acc[0] + acc[1] + acc[2] + acc[3] == 12345.f) out[blockIdx.x] = acc[0];
}

template <typename K>
static int timeit(const char *name, K kern, int threads, int smem, int units, const uint8_t *buf, int copies,
                  float *out) {
    smem = smem < PIN_SMEM ? PIN_SMEM : smem; /* 4 blocks per SM, as the library's TP8 GEMM1 */
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, threads, smem));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> t;
    for (int r = 0; r < 16; r++) {
        CK(cudaEventRecord(a));
        kern<<<units, threads, smem>>>(buf + (size_t)(r % copies) * units * UNIT, out);
        CK(cudaGetLastError());
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (r >= 2) t.push_back(ms * 1000.f);
    }
    std::sort(t.begin(), t.end());
    const double us = t[t.size() / 2], bytes = (double)units * UNIT;
    printf("%-22s units %5d occ %d smem %6d: %8.2f us  %5.2f TB/s\n", name, units, occ, smem, us, bytes / us * 1e-6);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1) PIN_SMEM = atoi(argv[1]) * 1024;
    const int unit_counts[] = {1488, 768, 3096};
    size_t big = (size_t)3 * 3096 * UNIT; /* 3 copies of the largest set: > 3 x the 60 MB L2 */
    uint8_t *buf = nullptr;
    float *out = nullptr;
    CK(cudaMalloc(&buf, big));
    CK(cudaMalloc(&out, 1 << 20));
    CK(cudaMemset(buf, 0x35, big));
    for (int units : unit_counts) {
        const int copies = 3;
        printf("-- %d units (%.1f MB)\n", units, units * (double)UNIT / 1e6);
        if (timeit("ring S3 stream", ring_kernel<3, false>, 128, 4 * 3 * 2048, units, buf, copies, out) ||
            timeit("ring S3 work", ring_kernel<3, true>, 128, 4 * 3 * 2048, units, buf, copies, out) ||
            timeit("ring S4 work", ring_kernel<4, true>, 128, 4 * 4 * 2048, units, buf, copies, out) ||
            timeit("ws NS3 stream", ws_kernel<3, false>, 160, 3 * 8192 + 64, units, buf, copies, out) ||
            timeit("ws NS3 work", ws_kernel<3, true>, 160, 3 * 8192 + 64, units, buf, copies, out) ||
            timeit("ws NS4 work", ws_kernel<4, true>, 160, 4 * 8192 + 64, units, buf, copies, out) ||
            timeit("ws NS6 work", ws_kernel<6, true>, 160, 6 * 8192 + 128, units, buf, copies, out) ||
            timeit("ws NS7 work", ws_kernel<7, true>, 160, 7 * 8192 + 128, units, buf, copies, out))
            return 1;
    }
    CK(cudaDeviceSynchronize());
    printf("done\n");
    return 0;
}
