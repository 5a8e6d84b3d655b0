// Diagnostic probe (not part of the library or its build): would one persistent launch of the routed experts at
// K3 TP8 M 1 stream its weights without the latency steps of today's three kernels (GEMM1, GEMM2, the combine)?
// bench/NOTES-moe.md (2026-12-07) estimates ~15-16 us for such a form against ~25 us today; this measures the
// form's skeleton with the same bytes and the same per-word work, before anyone builds the real kernel.
//
// The call's bytes are those of 16 touched experts at TP8 (L 3584, I 384, NVFP4 with e4m3 scales): W13 rows of
// 1,792 bytes (gate and up), W2 rows of 192 bytes, 37.2 MB in all. Work items, claimed in order by one atomic
// counter from a grid of exactly the resident blocks:
//   G1  8 gate + 8 up rows of one expert (32 KB with scales; 48 per expert, 768 in all),
//   G2  64 W2 rows of one expert (13.5 KB; 56 per expert, 896 in all): waits for its expert's 48 G1 items
//       (a per-expert counter, released by each G1 item), then reads the expert's activations,
//   C   256 output rows (14 items): waits for the 64 G2 items of those rows, sums 16 experts' fp32 rows.
// A block keeps PROBE_STAGES items in flight (default 2: 63 KB of shared memory at 32 KB items): while it computes
// one, the next ones' weights are on their way (bulk copies into the other stages). With W2 early, a G2 item's
// weights are asked for when it is claimed, before its wait. Deadlock-free by the order: a block takes a G2 item
// only after every G1 item has been claimed by a running block, and G1 items wait for nothing (likewise C after
// G2); a block's current item is always its oldest claim. The fixed-stride variant (block b takes items b, b + grid,
// ...) is deadlock-free too: every item waits only on items of lower index, and each block takes its items in
// increasing order.
// The per-word work (WORK) is the library's: E2M1 decode (k3_nv_decode_word), the BF16x2 scale multiply and one
// m16n8k16 MMA per 32-bit word, as in bench/moe_ws_probe.cu; here it runs on the scale bytes too, about 11 % more
// work than the library does for the same weights. Outputs are not checked: a timing skeleton.
// The counters are zeroed by a memset node before every launch (the caller's workspace is not zeroed).
// Method: 8 sets of the 16 experts' bytes (297 MB, each call reads a cold set), one graph of 8 (memset, launch)
// pairs, 3 warm-up and 15 timed replays, median per call.
// Then reference streams, to tell this form's rate from what the GPU reads at these sizes with no items at all: a
// plain 16-byte-load kernel and a per-block contiguous bulk-copy ring (ldg_kernel, ring_kernel), each with and
// without the per-word work, at this call's 37.2 MB and at TP8 M 4's and M 16's expert bytes (141.7, 511.2 MB).
// Build: nvcc [-DPROBE_R1=4 -DPROBE_STAGES=4] -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a
//            -o moe_persistent_probe bench/moe_persistent_probe.cu
// Run:   ./moe_persistent_probe [blocks per SM, default: as many as fit] [items | ref | ldg | regs]
//        (one half; ldg: the plain-load references only; regs: items read into registers by 256 threads, beside
//        the stage items and the plain-load, per-block slice and ring references at this call's bytes)
// Measured (s41d, an H100): bench/RESULTS.md; what it means: bench/NOTES-moe.md, 2026-12-07. s41d ran the
// defaults (R1 8, two stages) before PROBE_R1 and PROBE_STAGES were added (commit 31aaf0b's form); the
// parameterized form builds for R1 4 and 8 with 2-4 stages and has not run on a GPU yet.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "probe_check.h"
#include "../src/cuda/common/bulk_copy.cuh" /* the library's mbarrier and bulk-copy helpers */
#include "probe_fp4_work.cuh"                /* the library's decode and the per-word work */

constexpr int L = 3584, I = 384, NE = 16;
constexpr int W13_ROW = L / 2, W13_SROW = L / 16; /* bytes per W13 row and per its scale row */
constexpr int W2_ROW = I / 2, W2_SROW = I / 16;
constexpr size_t W13_B = (size_t)2 * I * W13_ROW, W13S_B = (size_t)2 * I * W13_SROW;
constexpr size_t W2_B = (size_t)L * W2_ROW, W2S_B = (size_t)L * W2_SROW;
constexpr size_t EXPERT_B = W13_B + W13S_B + W2_B + W2S_B; /* 2,322,432 */
#ifndef PROBE_R1
#define PROBE_R1 8 /* gate rows (and as many up rows) per G1 item */
#endif
#ifndef PROBE_STAGES
#define PROBE_STAGES 2 /* items a block has in flight */
#endif
constexpr int R1 = PROBE_R1, G1_PER_E = I / R1, NSTG = PROBE_STAGES;
constexpr int R2 = 64, G2_PER_E = L / R2;                /* G2: 64 W2 rows */
constexpr int RC = 256, NC = L / RC;                     /* C: 256 output rows */
constexpr int N_G1 = NE * G1_PER_E, N_G2 = NE * G2_PER_E, N_ITEMS = N_G1 + N_G2 + NC;
constexpr int STAGE = 2 * R1 * W13_ROW + 2 * R1 * W13_SROW; /* 32,256 bytes at R1 8 */
constexpr int G2_BYTES = R2 * (W2_ROW + W2_SROW);           /* 13,824 */
constexpr int RB_TARGET = NE * (RC / R2);                   /* G2 items per combine row block */
constexpr int THREADS = 128, NSET = 8;
static_assert(G2_BYTES <= STAGE && STAGE % 16 == 0 && I % R1 == 0 && NSTG >= 2 && NSTG <= 8, "stage layout");

struct Ctl {
    unsigned claim;
    unsigned ready[NE]; /* G1 items done per expert */
    unsigned rb[NC];    /* G2 items done per combine row block */
};
struct Args {
    const uint8_t *w; /* this call's set: NE experts of EXPERT_B bytes */
    float *a;         /* [NE][I] G1 outputs */
    float *pair;      /* [NE][L] G2 outputs */
    float *out;       /* [L] */
    Ctl *ctl;
    int deps, w2_early;
    int stat; /* items by a fixed stride (block b: b, b + grid, ...) instead of the claim counter */
};

extern __shared__ __align__(128) uint4 dyn[];

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"((uint32_t)__cvta_generic_to_shared(bar)) : "memory");
}

/* kind 1 G1, 2 G2, 3 C; e the expert, t the item within it (C: the row block) */
__device__ __forceinline__ int decode(int it, int &e, int &t) {
    if (it < N_G1) { e = it / G1_PER_E, t = it % G1_PER_E; return 1; }
    if (it < N_G1 + N_G2) { const int j = it - N_G1; e = j / G2_PER_E, t = j % G2_PER_E; return 2; }
    e = 0, t = it - N_G1 - N_G2;
    return 3;
}
/* thread 0: the copies of item it into stage st, completing bar's next phase (C: an arrival without bytes) */
__device__ void issue(const Args &A, int it, uint8_t *st, uint64_t *bar, uint64_t pol) {
    int e, t;
    const int kind = decode(it, e, t);
    const uint8_t *eb = A.w + (size_t)e * EXPERT_B;
    if (kind == 1) {
        constexpr uint32_t RB = R1 * W13_ROW, SB = R1 * W13_SROW;
        k3_mbar_arrive_expect_tx(bar, STAGE);
        k3_bulk_copy_g2s_tx(st, eb + (size_t)t * RB, RB, bar, pol);
        k3_bulk_copy_g2s_tx(st + RB, eb + (size_t)(I + t * R1) * W13_ROW, RB, bar, pol);
        k3_bulk_copy_g2s_tx(st + 2 * RB, eb + W13_B + (size_t)t * SB, SB, bar, pol);
        k3_bulk_copy_g2s_tx(st + 2 * RB + SB, eb + W13_B + (size_t)(I + t * R1) * W13_SROW, SB, bar, pol);
    } else if (kind == 2) {
        constexpr uint32_t RB = R2 * W2_ROW, SB = R2 * W2_SROW;
        k3_mbar_arrive_expect_tx(bar, G2_BYTES);
        k3_bulk_copy_g2s_tx(st, eb + W13_B + W13S_B + (size_t)t * RB, RB, bar, pol);
        k3_bulk_copy_g2s_tx(st + RB, eb + W13_B + W13S_B + W2_B + (size_t)t * SB, SB, bar, pol);
    } else {
        mbar_arrive(bar);
    }
}

/* A C item: after its wait, the 16 experts' fp32 rows of its row block summed (NT threads). */
template <int NT>
__device__ __forceinline__ void combine_item(const Args &A, int t, int tid) {
    if (tid == 0 && A.deps)
        while (ld_acquire(&A.ctl->rb[t]) < (unsigned)RB_TARGET) __nanosleep(64);
    __syncthreads();
    for (int c = tid; c < RC; c += NT) {
        float v = 0.f;
#pragma unroll
        for (int x = 0; x < NE; x++) v += __ldcg(A.pair + (size_t)x * L + t * RC + c);
        A.out[t * RC + c] = v;
    }
}
/* Thread 0, after the barrier that follows an item's output writes: its counter for the items that wait on it. */
__device__ __forceinline__ void release_item(const Args &A, int kind, int e, int t) {
    if (kind == 1) { __threadfence(); atomicAdd(&A.ctl->ready[e], 1u); }
    if (kind == 2) { __threadfence(); atomicAdd(&A.ctl->rb[(t * R2) / RC], 1u); }
}

/* n bytes of a stage through the per-word work, NT threads: every lane of a warp takes the same number of steps
 * (the work's MMA needs the whole warp), lanes past n with zeros. */
template <bool WORK, int NT>
__device__ __forceinline__ void use_bytes(const uint8_t *p, int n, int tid, uint32_t sc, float (&acc)[4]) {
    const int lane0 = tid & ~31;
    for (int off = lane0 * 16; off < n; off += NT * 16) {
        const int o = off + (tid - lane0) * 16;
        use16<WORK>(o < n ? *reinterpret_cast<const uint4 *>(p + o) : make_uint4(0u, 0u, 0u, 0u), sc, acc);
    }
}

template <bool WORK>
__global__ void __launch_bounds__(THREADS, 3) persist_kernel(const Args A) {
    __shared__ uint64_t bar[NSTG];
    __shared__ int item[NSTG];
    const int tid = threadIdx.x;
    uint8_t *const stage = reinterpret_cast<uint8_t *>(dyn);
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    /* claim: thread 0 takes the next item for stage s and (unless it is a G2 item whose copies wait) asks for it */
    unsigned taken = 0u; /* thread 0: items this block has taken (stat) */
    auto claim = [&](int s) {
        const int it = A.stat ? (int)(blockIdx.x + taken++ * gridDim.x) : (int)atomicAdd(&A.ctl->claim, 1u);
        item[s] = it;
        int e, t;
        if (it < N_ITEMS && (decode(it, e, t) != 2 || A.w2_early)) issue(A, it, stage + s * STAGE, &bar[s], pol);
    };
    if (tid == 0) {
        for (int s = 0; s < NSTG; s++) k3_mbar_init(&bar[s]);
        k3_mbar_init_fence();
        for (int s = 0; s < NSTG; s++) claim(s);
    }
    __syncthreads();
    uint32_t phases = 0u; /* bit s: the parity stage s waits for next */
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const uint32_t sc = 0x3f803f80u + (uint32_t)tid;
    for (int s = 0;; s = s + 1 == NSTG ? 0 : s + 1) {
        const int it = item[s];
        if (it >= N_ITEMS) break; /* block-uniform: read after a barrier */
        int e, t;
        const int kind = decode(it, e, t);
        if (kind == 2) {
            if (tid == 0) {
                if (A.deps)
                    while (ld_acquire(&A.ctl->ready[e]) < (unsigned)G1_PER_E) __nanosleep(64);
                if (!A.w2_early) issue(A, it, stage + s * STAGE, &bar[s], pol);
            }
            __syncthreads();
            acc[1] += __ldcg(A.a + e * I + (tid * 3) % I); /* the expert's activations, after the wait */
        } else if (kind == 3) {
            combine_item<THREADS>(A, t, tid);
        }
        k3_mbar_wait(&bar[s], (phases >> s) & 1u);
        phases ^= 1u << s;
        if (kind != 3) {
            const int n = kind == 1 ? STAGE : G2_BYTES;
            const uint8_t *st = stage + s * STAGE;
            use_bytes<WORK, THREADS>(st, n, tid, sc, acc);
        }
        if (kind == 1 && tid < R1) A.a[e * I + t * R1 + tid] = acc[0] + acc[2];
        if (kind == 2 && tid < R2) A.pair[(size_t)e * L + t * R2 + tid] = acc[0] + acc[1] + acc[3];
        __syncthreads(); /* stage s read by every thread, the item's outputs written */
        if (tid == 0) {
            release_item(A, kind, e, t);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* the reads above before the new copies */
            claim(s);
        }
        __syncthreads(); /* item[s] */
    }
    if (acc[0] + acc[1] + acc[2] + acc[3] == 12345.f) A.out[0] = acc[1];
}

/* The same items, claims and waits with no shared-memory stages: the block's LT threads read an item's bytes with
 * 16-byte loads into registers (LPT per thread), the next item's while the current one is waited for and worked
 * on, as the plain-load reference reads. Claims run two items ahead (one in registers, one named); deadlock-free as
 * above, since a block's current item is still the lowest of its claims. */
constexpr int LT = 256, LPT = (STAGE / 16 + LT - 1) / LT;
__device__ __forceinline__ void item_load(const Args &A, int it, int tid, uint4 (&r)[LPT]) {
    int e = 0, t = 0;
    const int kind = it < N_ITEMS ? decode(it, e, t) : 3;
    const uint8_t *eb = A.w + (size_t)e * EXPERT_B;
#pragma unroll
    for (int j = 0; j < LPT; j++) {
        const int off = (tid + j * LT) * 16;
        const uint8_t *src = nullptr;
        if (kind == 1) {
            constexpr int RB = R1 * W13_ROW, SB = R1 * W13_SROW;
            if (off < RB) src = eb + (size_t)t * RB + off;
            else if (off < 2 * RB) src = eb + (size_t)(I + t * R1) * W13_ROW + (off - RB);
            else if (off < 2 * RB + SB) src = eb + W13_B + (size_t)t * SB + (off - 2 * RB);
            else if (off < STAGE) src = eb + W13_B + (size_t)(I + t * R1) * W13_SROW + (off - 2 * RB - SB);
        } else if (kind == 2) {
            constexpr int RB = R2 * W2_ROW, SB = R2 * W2_SROW;
            if (off < RB) src = eb + W13_B + W13S_B + (size_t)t * RB + off;
            else if (off < G2_BYTES) src = eb + W13_B + W13S_B + W2_B + (size_t)t * SB + (off - RB);
        }
        r[j] = src ? __ldcs(reinterpret_cast<const uint4 *>(src)) : make_uint4(0u, 0u, 0u, 0u);
    }
}
template <bool WORK>
__global__ void __launch_bounds__(LT, 2) persist_ldg_kernel(const Args A) {
    __shared__ int item[3];
    const int tid = threadIdx.x;
    unsigned taken = 0u;
    auto next_id = [&]() {
        return A.stat ? (int)(blockIdx.x + taken++ * gridDim.x) : (int)atomicAdd(&A.ctl->claim, 1u);
    };
    if (tid == 0) item[0] = next_id(), item[1] = next_id();
    __syncthreads();
    int cur = item[0], nxt = item[1];
    uint4 rc[LPT], rn[LPT];
    item_load(A, cur, tid, rc);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const uint32_t sc = 0x3f803f80u + (uint32_t)tid;
    for (int k = 0; cur < N_ITEMS; k++) {
        if (tid == 0) item[(k + 2) % 3] = next_id();
        item_load(A, nxt, tid, rn);
        int e, t;
        const int kind = decode(cur, e, t);
        if (kind == 2) {
            if (tid == 0 && A.deps)
                while (ld_acquire(&A.ctl->ready[e]) < (unsigned)G1_PER_E) __nanosleep(64);
            __syncthreads();
            acc[1] += __ldcg(A.a + e * I + (tid * 3) % I);
        } else if (kind == 3) {
            combine_item<LT>(A, t, tid);
        }
        if (kind != 3) {
            const int n = kind == 1 ? STAGE : G2_BYTES;
#pragma unroll
            for (int j = 0; j < LPT; j++)
                if (((tid & ~31) + j * LT) * 16 < n) use16<WORK>(rc[j], sc, acc); /* warp-uniform */
        }
        if (kind == 1 && tid < R1) A.a[e * I + t * R1 + tid] = acc[0] + acc[2];
        if (kind == 2 && tid < R2) A.pair[(size_t)e * L + t * R2 + tid] = acc[0] + acc[1] + acc[3];
        __syncthreads(); /* the item's outputs written; item[(k + 2) % 3] visible */
        if (tid == 0) release_item(A, kind, e, t);
        cur = nxt;
        nxt = item[(k + 2) % 3];
#pragma unroll
        for (int j = 0; j < LPT; j++) rc[j] = rn[j];
    }
    if (acc[0] + acc[1] + acc[2] + acc[3] == 12345.f) A.out[0] = acc[1];
}

/* Reference streams of the same bytes, to tell the probe's form from what the device does at this size:
 * ldg_kernel reads the call's set with 16-byte loads (4 in flight per thread, grid-strided);
 * ring_kernel gives each block one contiguous slice and streams it through a RING_STG-stage ring of STAGE-byte bulk
 * copies (thread 0 issues, every thread reads; RING_STG x blocks per SM x STAGE within the SM's shared memory), with
 * no claims, no waits and the same per-word work switch. */
template <bool WORK>
__global__ void __launch_bounds__(256) ldg_kernel(const uint4 *w, size_t n16, float *out) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const uint32_t sc = 0x3f803f80u + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        const uint4 v0 = __ldcs(w + i), v1 = __ldcs(w + i + stride), v2 = __ldcs(w + i + 2 * stride),
                    v3 = __ldcs(w + i + 3 * stride);
        use16<WORK>(v0, sc, acc), use16<WORK>(v1, sc, acc), use16<WORK>(v2, sc, acc), use16<WORK>(v3, sc, acc);
    }
    for (; i < n16; i += stride) use16<WORK>(__ldcs(w + i), sc, acc);
    if (acc[0] + acc[1] + acc[2] + acc[3] == 12345.f) out[0] = acc[1];
}

/* slice_kernel: each block one contiguous slice, read with 16-byte loads (4 in flight per thread), warp-uniform. */
template <bool WORK>
__global__ void __launch_bounds__(256) slice_kernel(const uint4 *w, size_t n16, float *out) {
    const size_t per = (n16 + gridDim.x - 1) / gridDim.x, b0 = per * blockIdx.x;
    const size_t b1 = b0 + per < n16 ? b0 + per : n16;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const uint32_t sc = 0x3f803f80u + threadIdx.x;
    const int lane = threadIdx.x & 31;
    size_t wb = b0 + (threadIdx.x & ~31u); /* the warp's first piece: the loop conditions are the warp's */
    for (; wb + 3 * 256 + 32 <= b1; wb += 4 * 256) {
        const size_t i = wb + lane;
        const uint4 v0 = __ldcs(w + i), v1 = __ldcs(w + i + 256), v2 = __ldcs(w + i + 512), v3 = __ldcs(w + i + 768);
        use16<WORK>(v0, sc, acc), use16<WORK>(v1, sc, acc), use16<WORK>(v2, sc, acc), use16<WORK>(v3, sc, acc);
    }
    for (; wb < b1; wb += 256)
        use16<WORK>(wb + lane < b1 ? __ldcs(w + wb + lane) : make_uint4(0u, 0u, 0u, 0u), sc, acc);
    if (acc[0] + acc[1] + acc[2] + acc[3] == 12345.f) out[0] = acc[1];
}

/* band_kernel: the library's GEMM1 access pattern with no items: 16-row bands of W13-sized rows (1,792 bytes), a
 * block's 4 warps on chunks of 64 bytes per row (warp w: chunks w, w + 4, ...), lane (g, q) 16 bytes of rows g and
 * g + 8 at 16 q in the chunk, two chunks (4 loads) in flight per lane; bands grid-strided. */
template <bool WORK, bool SCALES = false>
__global__ void __launch_bounds__(128) band_kernel(const uint8_t *w, size_t bytes, float *out) {
    constexpr int ROW = W13_ROW, BAND = 16 * ROW, CH = ROW / 64;
    /* SCALES: the first 8/9 of the bytes are the rows, the rest their scale rows (224 bytes each, as NVFP4's one
     * byte per 16 elements); lane (g, q) also reads the 4-byte word holding its two scale bytes of rows g, g + 8
     * per chunk, as GEMM1's cp.async ring does */
    const size_t nb = (SCALES ? bytes / 9 * 8 : bytes) / BAND;
    const uint8_t *sreg = w + nb * BAND;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const uint32_t sc = 0x3f803f80u + threadIdx.x;
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
    for (size_t b = blockIdx.x; b < nb; b += gridDim.x) {
        const uint8_t *r0 = w + b * BAND + (size_t)g * ROW + q * 16, *r1 = r0 + 8 * ROW;
        for (int c = warp; c < CH; c += 8) {
            const bool two = c + 4 < CH;
            const uint4 v0 = __ldcs(reinterpret_cast<const uint4 *>(r0 + c * 64));
            const uint4 v1 = __ldcs(reinterpret_cast<const uint4 *>(r1 + c * 64));
            const uint4 v2 = two ? __ldcs(reinterpret_cast<const uint4 *>(r0 + (c + 4) * 64)) : z;
            const uint4 v3 = two ? __ldcs(reinterpret_cast<const uint4 *>(r1 + (c + 4) * 64)) : z;
            use16<WORK>(v0, sc, acc), use16<WORK>(v1, sc, acc), use16<WORK>(v2, sc, acc), use16<WORK>(v3, sc, acc);
            if (SCALES) {
                const uint8_t *s0 = sreg + (b * 16 + g) * W13_SROW + 4 * (q / 2), *s1 = s0 + 8 * W13_SROW;
                uint32_t t = __ldcs(reinterpret_cast<const unsigned *>(s0 + c * 8)) ^
                             __ldcs(reinterpret_cast<const unsigned *>(s1 + c * 8));
                if (two)
                    t ^= __ldcs(reinterpret_cast<const unsigned *>(s0 + (c + 4) * 8)) ^
                         __ldcs(reinterpret_cast<const unsigned *>(s1 + (c + 4) * 8));
                acc[3] += __uint_as_float(t & 0x3f800000u);
            }
        }
    }
    if (acc[0] + acc[1] + acc[2] + acc[3] == 12345.f) out[0] = acc[1];
}
template <bool WORK, int RING_STG>
__global__ void __launch_bounds__(THREADS, 3) ring_kernel(const uint8_t *w, size_t bytes, float *out) {
    __shared__ uint64_t bar[RING_STG];
    uint8_t *const stage = reinterpret_cast<uint8_t *>(dyn);
    const int tid = threadIdx.x;
    const size_t per = (bytes / gridDim.x + 15) & ~(size_t)15, b0 = per * blockIdx.x;
    const size_t b1 = b0 + per < bytes ? b0 + per : bytes;
    const int n = b0 < b1 ? (int)((b1 - b0 + STAGE - 1) / STAGE) : 0;
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    auto ask = [&](int c) {
        const size_t o = b0 + (size_t)c * STAGE;
        const uint32_t len = (uint32_t)(b1 - o < (size_t)STAGE ? b1 - o : (size_t)STAGE);
        k3_bulk_copy_g2s(stage + (c % RING_STG) * STAGE, w + o, len, &bar[c % RING_STG], pol);
    };
    if (tid == 0) {
        for (int s = 0; s < RING_STG; s++) k3_mbar_init(&bar[s]);
        k3_mbar_init_fence();
        for (int c = 0; c < RING_STG && c < n; c++) ask(c);
    }
    __syncthreads();
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const uint32_t sc = 0x3f803f80u + (uint32_t)tid;
    for (int c = 0; c < n; c++) {
        const int s = c % RING_STG;
        k3_mbar_wait(&bar[s], (uint32_t)(c / RING_STG) & 1u);
        const size_t o = b0 + (size_t)c * STAGE;
        const int len = (int)(b1 - o < (size_t)STAGE ? b1 - o : (size_t)STAGE);
        use_bytes<WORK, THREADS>(stage + s * STAGE, len, tid, sc, acc);
        __syncthreads();
        if (tid == 0 && c + RING_STG < n) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            ask(c + RING_STG);
        }
    }
    if (acc[0] + acc[1] + acc[2] + acc[3] == 12345.f) out[0] = acc[1];
}

/* Replays the captured graph g (NSET calls) 3 + 15 times; t gets the 15 timed replays' us per call, sorted. */
static int replay_times(cudaGraph_t g, cudaStream_t st, std::vector<float> &t) {
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int r = 0; r < 18; r++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0.f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 3) t.push_back(ms * 1000.f / NSET);
    }
    std::sort(t.begin(), t.end());
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return 0;
}

/* Times one of the reference streams like run(): kind 0 ldg (blocks per SM bps, 256 threads), 1 ring, 2 slice,
 * 3 band, 4 band with its scale words. */
template <bool WORK, int RING_STG = 2>
static int run_ref(int kind, int bps, const uint8_t *w, size_t bytes, float *out, cudaStream_t st) {
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int smem = RING_STG * STAGE;
    if (kind == 1)
        CK(cudaFuncSetAttribute(ring_kernel<WORK, RING_STG>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int k = 0; k < NSET; k++) {
        const uint8_t *wk = w + (size_t)k * bytes;
        if (kind == 0)
            ldg_kernel<WORK><<<sms * bps, 256, 0, st>>>(reinterpret_cast<const uint4 *>(wk), bytes / 16, out);
        else if (kind == 2)
            slice_kernel<WORK><<<sms * bps, 256, 0, st>>>(reinterpret_cast<const uint4 *>(wk), bytes / 16, out);
        else if (kind == 3)
            band_kernel<WORK><<<sms * bps, 128, 0, st>>>(wk, bytes, out);
        else if (kind == 4)
            band_kernel<WORK, true><<<sms * bps, 128, 0, st>>>(wk, bytes, out);
        else
            ring_kernel<WORK, RING_STG><<<sms * bps, THREADS, smem, st>>>(wk, bytes, out);
        CK(cudaGetLastError());
    }
    CK(cudaStreamEndCapture(st, &g));
    std::vector<float> t;
    if (replay_times(g, st, t)) return 1;
    const float med = t[t.size() / 2];
    printf("  %6.1f MB %-4s %d stg %-8s blocks %d x %d per SM %8.2f us per call (min %.2f, max %.2f) %5.2f TB/s\n",
           bytes / 1e6, kind == 1 ? "ring" : kind == 2 ? "slice" : kind == 3 ? "band" : kind == 4 ? "bandS" : "ldg", kind == 1 ? RING_STG : 0, WORK ? "work" : "no work", sms, bps, med,
           t.front(), t.back(), bytes / (med * 1e6));
    return 0;
}

__global__ void fill_kernel(uint32_t *p, size_t n, uint32_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 15, x *= 2246822519u, x ^= x >> 13;
        p[i] = x & 0x77777777u; /* E2M1 codes below 8 and small e4m3 scales: finite values */
    }
}

template <bool WORK>
static int run(int bps, int deps, int w2_early, int stat, int memset_only, const uint8_t *w, float *a, float *pair,
               float *out, Ctl *ctl, cudaStream_t st, float *us, int regs = 0) {
    const int smem = regs ? 0 : NSTG * STAGE, nt = regs ? LT : THREADS;
    CK(cudaFuncSetAttribute(persist_kernel<WORK>, cudaFuncAttributeMaxDynamicSharedMemorySize, NSTG * STAGE));
    int dev = 0, sms = 0, fit = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    if (regs) CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, persist_ldg_kernel<WORK>, nt, 0));
    else CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, persist_kernel<WORK>, nt, smem));
    if (bps <= 0 || bps > fit) bps = fit;
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int k = 0; k < NSET; k++) {
        CK(cudaMemsetAsync(ctl + k, 0, sizeof(Ctl), st));
        if (memset_only) continue;
        Args A{w + (size_t)k * NE * EXPERT_B, a, pair, out, ctl + k, deps, w2_early, stat};
        if (regs) persist_ldg_kernel<WORK><<<sms * bps, nt, 0, st>>>(A);
        else persist_kernel<WORK><<<sms * bps, nt, smem, st>>>(A);
        CK(cudaGetLastError());
    }
    CK(cudaStreamEndCapture(st, &g));
    std::vector<float> t;
    if (replay_times(g, st, t)) return 1;
    *us = t[t.size() / 2];
    printf("  %-34s blocks %d x %d per SM   %7.2f us per call (min %.2f, max %.2f)\n",
           memset_only ? "memsets alone" : "", sms, bps, *us, t.front(), t.back());
    return 0;
}

int main(int argc, char **argv) {
    /* argv[1]: blocks per SM (0: the occupancy's); argv[2]: "items" or "ref" runs only that half, "ldg" only the
     * reference's plain loads, "regs" the register-load items beside the stage items and the references */
    const int bps = argc > 1 ? atoi(argv[1]) : 0;
    const char *only = argc > 2 ? argv[2] : "";
    setvbuf(stdout, NULL, _IOLBF, 0); /* a run killed by a timeout keeps what it printed */
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("moe_persistent_probe: %s, %d SMs; %d items (G1 %d of %d KB, G2 %d, C %d), %d in flight per block, "
           "%.1f MB per call, %d sets\n",
           prop.name, prop.multiProcessorCount, N_ITEMS, N_G1, STAGE / 1024, N_G2, NC, NSTG, NE * EXPERT_B / 1e6,
           NSET);
    uint8_t *w;
    float *a, *pair, *out;
    Ctl *ctl;
    const size_t wb = (size_t)NSET * NE * EXPERT_B;
    CK(cudaMalloc(&w, wb));
    CK(cudaMalloc(&a, sizeof(float) * NE * I));
    CK(cudaMalloc(&pair, sizeof(float) * NE * L));
    CK(cudaMalloc(&out, sizeof(float) * L));
    CK(cudaMalloc(&ctl, sizeof(Ctl) * NSET));
    fill_kernel<<<1024, 256>>>(reinterpret_cast<uint32_t *>(w), wb / 4, 20261207u);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    float us = 0.f;
    struct V { const char *name; int work, deps, w2_early, stat; } vs[] = {
        {"design (work, deps, W2 early)", 1, 1, 1, 0},
        {"W2 asked for after the wait", 1, 1, 0, 0},
        {"no waits (the stream's bound)", 1, 0, 1, 0},
        {"no per-word work", 0, 1, 1, 0},
        {"no waits, no per-word work", 0, 0, 1, 0},
        {"fixed stride: design", 1, 1, 1, 1},
        {"fixed stride: no waits, no per-word work", 0, 0, 1, 1},
    };
    if (strcmp(only, "regs") == 0) { /* the register-load items against the bulk-stage items and plain loads */
        for (int round = 0; round < 2; round++) {
            for (const V &v : vs) {
                if (!v.w2_early) continue; /* the register form always asks for W2 early: the design's twin */
                printf("registers, %s:\n", v.name);
                const int rc = v.work ? run<true>(bps, v.deps, v.w2_early, v.stat, 0, w, a, pair, out, ctl, st, &us, 1)
                                      : run<false>(bps, v.deps, v.w2_early, v.stat, 0, w, a, pair, out, ctl, st, &us, 1);
                if (rc) return rc;
            }
            printf("stages, %s:\n", vs[0].name);
            if (run<true>(bps, 1, 1, 0, 0, w, a, pair, out, ctl, st, &us)) return 1;
            printf("stages, %s:\n", vs[4].name);
            if (run<false>(bps, 0, 1, 0, 0, w, a, pair, out, ctl, st, &us)) return 1;
            const size_t b16 = NE * EXPERT_B / 16 * 16;
            for (int b : {1, 2}) /* fewer bytes in flight per SM: 16 and 32 KB */
                if (run_ref<false>(0, b, w, b16, out, st) || run_ref<true>(0, b, w, b16, out, st)) return 1;
            for (int b : {4, 8})
                if (run_ref<false>(0, b, w, b16, out, st) || run_ref<true>(0, b, w, b16, out, st) ||
                    run_ref<false>(2, b, w, b16, out, st) || run_ref<true>(2, b, w, b16, out, st))
                    return 1;
            for (int b : {4, 8})
                if (run_ref<false>(3, b, w, b16, out, st) || run_ref<true>(3, b, w, b16, out, st) ||
                    run_ref<false>(4, b, w, b16, out, st) || run_ref<true>(4, b, w, b16, out, st))
                    return 1;
            if (run_ref<false, 4>(1, 1, w, b16, out, st) || run_ref<true, 4>(1, 1, w, b16, out, st)) return 1;
        }
        return 0;
    }
    const bool items = strcmp(only, "ref") != 0 && strcmp(only, "ldg") != 0;
    for (int round = 0; round < 2 && items; round++)
        for (const V &v : vs) {
            printf("%s:\n", v.name);
            const int rc = v.work ? run<true>(bps, v.deps, v.w2_early, v.stat, 0, w, a, pair, out, ctl, st, &us)
                                  : run<false>(bps, v.deps, v.w2_early, v.stat, 0, w, a, pair, out, ctl, st, &us);
            if (rc) return rc;
        }
    if (items && run<true>(bps, 1, 1, 0, 1, w, a, pair, out, ctl, st, &us)) return 1;
    /* the reference streams at this call's bytes and at TP8 M 4's and M 16's (141.7 and 511.2 MB), cold sets */
    if (strcmp(only, "items") != 0) {
        CK(cudaFree(w));
        const size_t ref_bytes[] = {NE * EXPERT_B, 141700000, 511200000};
        CK(cudaMalloc(&w, (size_t)NSET * ref_bytes[2]));
        fill_kernel<<<1024, 256>>>(reinterpret_cast<uint32_t *>(w), (size_t)NSET * ref_bytes[2] / 4, 20261208u);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        printf("reference streams (no claims, no waits):\n");
        for (size_t rb : ref_bytes) {
            const size_t b16 = rb / 16 * 16;
            for (int b : {4, 8})
                if (run_ref<false>(0, b, w, b16, out, st) || run_ref<true>(0, b, w, b16, out, st)) return 1;
            if (strcmp(only, "ldg") == 0) continue; /* the plain loads only */
            if (run_ref<false, 4>(1, 1, w, b16, out, st) || run_ref<true, 4>(1, 1, w, b16, out, st)) return 1;
            if (run_ref<false, 6>(1, 1, w, b16, out, st) || run_ref<true, 6>(1, 1, w, b16, out, st)) return 1;
            for (int b : {2, 3})
                if (run_ref<false, 2>(1, b, w, b16, out, st) || run_ref<true, 2>(1, b, w, b16, out, st)) return 1;
        }
    }
    printf("floor: %.1f MB at 4.37 TB/s = %.2f us\n", NE * EXPERT_B / 1e6, NE * EXPERT_B / 4.37e6);
    CK(cudaStreamDestroy(st));
    CK(cudaFree(w));
    CK(cudaFree(a));
    CK(cudaFree(pair));
    CK(cudaFree(out));
    CK(cudaFree(ctl));
    return 0;
}
