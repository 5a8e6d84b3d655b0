/* Routing derived from topk_ids inside the GEMM blocks (the "fold"): no dispatch kernel at decode sizes. */
#ifndef K3_CUDA_MOE_FOLD_CUH
#define K3_CUDA_MOE_FOLD_CUH

#include <stdint.h>
#include "cuda/moe/params.cuh"

namespace {

/*
 * The dispatch folded into the GEMMs at decode sizes. Why: the dispatch kernel is a whole launch (a large share
 * of a decode call: bench/NOTES-moe.md) in front of GEMM1, which cannot start its weight stream before it ends. At
 * np <= FOLD_NP pairs each GEMM1 / GEMM2 block (NTH = 128 or 256 threads) derives what it needs from topk_ids
 * itself (FOLD_NP / NTH pairs per thread, kept in registers), with the dispatch kernel's exact order:
 *   fold_find: the touched experts as a bitmap (integer atomicOr in shared memory), the slot-th set bit = the
 *              slot-th active expert in ascending id order, and their count (= n_active);
 *   fold_list: p0 = valid pairs with a smaller id (= offs[e]), cnt = pairs of e, and e's pair indices ascending
 *              (= list[p0 ..]): ballots over 32-pair chunks in pair order.
 * So p0, cnt and the list (hence every output row and every sum) are the dispatch's: bitwise the same results.
 * GEMM2 recomputes them before its PDL wait (topk_ids is two or more kernels back: complete, see pdl.cuh).
 * The bitmap is dead before the weight ring fills, so it lives in the ring: the fold exists only in the NVFP4 cp.async
 * kernels, as their FOLD instances. Why instances and not a run-time flag: the flag's branches changed the code of
 * the launches that do not fold, and they ran slower (bench/NOTES-moe.md), so those run kernels without a line of
 * the fold's code.
 */
constexpr int FOLD_NP = 256;  /* pair indices fit a byte; two pairs per thread of a 128-thread block, one of 256 */
constexpr int FOLD_E = 4096;  /* bitmap words: 128, at most 4 per lane of the warp that scans them */
static_assert(G1_WARPS * 32 * 2 == FOLD_NP && G2_WARPS * 32 * 2 == FOLD_NP, "two pairs per thread");
template <int NTH>
__host__ __device__ constexpr int fold_ppt() { /* pairs per thread */
    static_assert(NTH == FOLD_NP / 2 || NTH == FOLD_NP, "fold: 128- or 256-thread blocks");
    return FOLD_NP / NTH;
}

struct fold_smem {
    int32_t cc[FOLD_NP / 32]; /* pairs of e in each 32-pair chunk */
    int32_t lt[FOLD_NP / 32]; /* per warp: valid pairs with an id below e */
    int32_t e, n_act;
    uint8_t list[FOLD_NP];    /* e's pair indices, ascending */
    int32_t over;             /* fold_find COUNT: an expert has more than P.tpu pairs */
};
/* Dynamic shared memory a folded launch adds after its ring: fold_smem. As static shared memory it was in every
 * launch, folded or not, and cost the cp.async GEMM2 a block per SM (bench/NOTES-moe.md). */
constexpr size_t fold_dyn_bytes() { return (sizeof(fold_smem) + 15) / 16 * 16; }

/* Block-wide (every thread of an NTH-thread block calls it). id[h]: this thread's pair h * NTH + tid (h < PPT), -1
 * when absent or out of [0, E) (and for h >= PPT). Returns the touched-expert count; fs.e holds the slot-th touched
 * expert when slot < that count.
 * COUNT (GEMM1's early routing): also fs.over = 1 when an expert has more than P.tpu pairs, i.e. when the dispatch's
 * units are not the touched experts (per-expert counts as 16-bit halves of the words after the bitmap). */
template <int NTH, bool COUNT = false>
__device__ __forceinline__ int32_t fold_find(const moe_params &P, int slot, uint32_t *bm, fold_smem &fs,
                                             int32_t (&id)[2]) {
    constexpr int PPT = fold_ppt<NTH>();
    const int tid = threadIdx.x, lane = tid & 31;
    const int nw = (P.ne + 31) >> 5;
    for (int i = tid; i < nw; i += NTH) bm[i] = 0u;
    uint32_t *const cw = bm + FOLD_E / 32;
    if constexpr (COUNT) {
        for (int i = tid; i < (P.ne + 1) >> 1; i += NTH) cw[i] = 0u;
        if (tid == 0) fs.over = 0;
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int i = h * NTH + tid;
        const int32_t v = h < PPT && i < P.np ? __ldcg(P.ids + i) : -1;
        id[h] = v >= 0 && v < P.ne ? v : -1;
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < PPT; h++)
        if (id[h] >= 0) {
            atomicOr(&bm[id[h] >> 5], 1u << (id[h] & 31));
            if constexpr (COUNT) {
                const uint32_t sh = (uint32_t)(id[h] & 1) * 16u, old = atomicAdd(&cw[id[h] >> 1], 1u << sh) >> sh;
                if ((int32_t)(old & 0xffffu) >= P.tpu) atomicOr(&fs.over, 1); /* atomic: racecheck-clean */
            }
        }
    __syncthreads();
    if (tid < 32) {
        const int wpl = (nw + 31) >> 5, w0 = lane * wpl;
        int c = 0;
        for (int j = 0; j < wpl; j++)
            if (w0 + j < nw) c += __popc(bm[w0 + j]);
        int incl = c;
#pragma unroll
        for (int o = 1; o < 32; o *= 2) {
            const int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        if (slot >= incl - c && slot < incl) { /* this lane's words hold the slot-th set bit */
            int r = slot - (incl - c);
            for (int j = 0; j < wpl; j++) {
                uint32_t w = bm[w0 + j];
                const int pc = __popc(w);
                if (r < pc) {
                    for (; r > 0; r--) w &= w - 1u;
                    fs.e = (w0 + j) * 32 + __ffs(w) - 1;
                    break;
                }
                r -= pc;
            }
        }
        if (lane == 31) fs.n_act = incl;
    }
    __syncthreads();
    return fs.n_act;
}

/* Block-wide, after fold_find (e = fs.e valid). p0, cnt and fs.list as the dispatch's offs / list. */
template <int NTH>
__device__ __forceinline__ void fold_list(int32_t e, fold_smem &fs, const int32_t (&id)[2], int32_t &p0,
                                          int32_t &cnt) {
    constexpr int PPT = fold_ppt<NTH>(), W = NTH / 32;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    unsigned b[2];
    int nlt = 0;
#pragma unroll
    for (int h = 0; h < PPT; h++) {
        b[h] = __ballot_sync(0xffffffffu, id[h] == e);
        nlt += __popc(__ballot_sync(0xffffffffu, id[h] >= 0 && id[h] < e));
    }
    if (lane == 0) {
#pragma unroll
        for (int h = 0; h < PPT; h++) fs.cc[h * W + warp] = __popc(b[h]);
        fs.lt[warp] = nlt;
    }
    __syncthreads();
    /* chunk c = pairs 32 c .. 32 c + 31: this thread's pair h lies in chunk h * W + warp */
    int base[2] = {0, 0}, tot = 0;
#pragma unroll
    for (int c = 0; c < FOLD_NP / 32; c++) {
        const int v = fs.cc[c];
#pragma unroll
        for (int h = 0; h < PPT; h++) base[h] += c < h * W + warp ? v : 0;
        tot += v;
    }
    p0 = 0;
#pragma unroll
    for (int w = 0; w < W; w++) p0 += fs.lt[w];
    cnt = tot;
    const unsigned below = (1u << lane) - 1u;
#pragma unroll
    for (int h = 0; h < PPT; h++)
        if (id[h] == e) fs.list[base[h] + __popc(b[h] & below)] = (uint8_t)(h * NTH + tid);
    __syncthreads();
}

/* Block-wide: e = the expert of this block's slot (fold_find: a touched expert; the dispatch path: a unit); true
 * when the slot is past them and the block leaves (block-uniform, before any barrier of the caller). The dispatch
 * path also gives the unit's first pair p0 and pair count (the fold: fold_list, later); its four loads go out
 * together (act_off holds an entry past the grid's last slot: layout_of). */
template <bool FOLD, int NTH>
__device__ __forceinline__ bool slot_leaves(const moe_params &P, int slot, uint32_t *bm, fold_smem &fs,
                                            int32_t (&fid)[2], int32_t &e, int32_t &p0, int32_t &cnt) {
    if constexpr (FOLD) {
        if (fold_find<NTH>(P, slot, bm, fs, fid) <= slot) return true;
        e = fs.e;
        return false;
    } else {
        const int32_t n_act = __ldcg(P.n_active);
        e = __ldcg(P.active + slot);
        p0 = __ldcg(P.act_off + slot);
        cnt = __ldcg(P.act_off + slot + 1) - p0;
        return slot >= n_act;
    }
}

} // namespace

#endif
