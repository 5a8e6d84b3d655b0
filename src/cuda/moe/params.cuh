/* The kernel parameters of one routed-experts call, and the layout contract of GEMM1's output `a`. */
#ifndef K3_CUDA_MOE_PARAMS_CUH
#define K3_CUDA_MOE_PARAMS_CUH

#include <stdint.h>
#include "core/act.h"
#include "cuda/moe/config.cuh"

namespace {

/* Everything a GEMM1 / GEMM2 launch needs (by value: kernel parameters). */
struct moe_params {
    int64_t L, I;
    int32_t top_k, ne, layout, sep, interleaved, w4a4;
    k3_act_desc act;
    const uint16_t *x;                       /* [m, L] */
    const int32_t *ids;                      /* [m, top_k] */
    const float *wts;                        /* [m, top_k] */
    const int32_t *offs, *active, *act_off, *n_active, *list;
    const float *wsort;                      /* [np] wts[list[p]] (the dispatch path) */
    int32_t np;                              /* pairs (m * top_k) */
    const uint16_t *xq;                      /* W4A4: [np, L] grouped, q * sf */
    uint16_t *a;                             /* [np, I] grouped */
    float *pair_out;                         /* [np, L] by pair index */
    int32_t direct;                          /* the plan's direct: GEMM2 writes out (and out_f32), not pair_out */
    uint16_t *out;                           /* [m, L] (direct) */
    float *out_f32;                          /* [m, L] or NULL (direct) */
    const uint8_t *w13, *w13s, *w2, *w2s;
    size_t w13_eb, w13_sb, w2_eb, w2_sb;
    const float *w13_s2, *w2_s2, *w13_in, *w2_in;
    int64_t early_blocks;                    /* GEMM1 EARLY: blocks below this linear index route themselves */
    int32_t tpu;                             /* the dispatch's pairs per unit (GEMM1 EARLY) */
};

/* GEMM2's activations (GEMM1's output `a`, FP4 formats) are stored pair-permuted: in each 8-element group,
 * element e at position e < 4 ? 2e : 2e - 7, so the 32-bit words of a 16-byte load are the B fragments of the FP4
 * chunk map's pairs (p + i, p + i + 4) as they stand (mma_fp4_tile XP): GEMM2 saves the 16 byte permutations per
 * chunk that the user's activations cost GEMM1, a sizeable part of its integer work (bench/NOTES-moe.md). BF16
 * weights pair elements (p, p + 1): no permutation. `a` is internal to a call, so its layout is free. */
template <int FMT>
constexpr bool A_PERM = FMT != FMT_BF16;
template <int FMT>
__device__ __forceinline__ int64_t a_col(int64_t i) {
    if constexpr (!A_PERM<FMT>) return i;
    const int64_t e = i & 7;
    return (i & ~(int64_t)7) | (e < 4 ? 2 * e : 2 * e - 7);
}

} // namespace

#endif
