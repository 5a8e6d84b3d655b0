/* Launch-shape resolution of the routed experts (see moe_plan.h). The rules are the measured ones of
 * bench/NOTES-moe.md; their thresholds are the table's moe rows, the blocks per SM the registry's. */
#include "plan/moe_plan.h"

#include <stdio.h>
#include <string.h>

#include "plan/linear_plan.h"
#include "plan/moe_configs.h"
#include "plan/table.h"

k3_status k3_moe_ctx_tuning(k3_ctx *ctx, k3_table_moe *out) {
    memset(out, 0, sizeof *out);
    const k3_table *t = NULL;
    K3_TRY(k3_linear_ctx_table(ctx, &t));
    char err[256];
    const k3_status st = k3_table_sections_for(t, ctx->arch.table, out, NULL, err, sizeof err);
    if (st != K3_STATUS_SUCCESS) return k3_fail(ctx, st, "moe plan: the table's moe rows: %s", err);
    return K3_STATUS_SUCCESS;
}

/* GEMM2's block rows at KS 1: L / 16 row tiles, `tiles` per warp, K3_MOE_G2_WARPS warps per block. */
static int64_t g2_block_rows(int64_t hidden, int64_t tiles) {
    return (hidden / 16 + tiles * K3_MOE_G2_WARPS - 1) / (tiles * K3_MOE_G2_WARPS);
}

/* The dispatch path's block rows (units) for np pairs in runs of at most tpu: one per touched expert, plus at
 * most np / tpu more. */
static int64_t max_units(int64_t e, int64_t np, int64_t tpu) { return (e < np ? e : np) + np / tpu; }

/* The cp.async ring copies the 4-byte word holding a lane's two NVFP4 scale bytes: in the linear layout that
 * needs cols / 16 to be a multiple of 4 (the swizzled layout pads its columns to 4). The scale pointers' own
 * alignment is a run-time requirement of CUDA NVFP4 plans (k3_moe_run refuses unaligned ones). */
static int scale_words_aligned(k3_scale_layout layout, int64_t cols) {
    return layout == K3_SCALE_SWIZZLED || (cols / 16) % 4 == 0;
}

static int32_t g1_blocks(int32_t g1) {
    int32_t n = 0;
    return k3_moe_g1_configs(&n)[g1].blocks_per_sm;
}
static int32_t g2_blocks(int32_t g2) {
    int32_t n = 0;
    return k3_moe_g2_configs(&n)[g2].blocks_per_sm;
}

static k3_status missing(k3_ctx *ctx, const char *gemm, int64_t m) {
    return k3_fail(ctx, K3_STATUS_INTERNAL_ERROR,
                   "moe plan: no compiled %s instance for the launch shape of m = %lld (src/plan/moe_configs.def)",
                   gemm, (long long)m);
}

/* The generic launch (no tuning data): the dispatch kernel and the register-ring kernels at NT 4. */
static k3_status resolve_generic(k3_ctx *ctx, const k3_moe_desc *d, int64_t m, k3_moe_launch *l) {
    const int64_t np = m * d->top_k;
    const int32_t gated = d->act.kind != K3_ACT_RELU2_NO_MUL;
    l->nt = 4;
    l->tpu = m > 8 * l->nt ? 8 * l->nt : (int32_t)np;
    l->dispatch = 1, l->combine = 1, l->g2_tiles = 1;
    const int64_t units = max_units(d->num_experts, np, l->tpu);
    l->g1 = k3_moe_g1_find((int32_t)d->format, gated, 4, 0, 0, 0, 0);
    l->g2 = k3_moe_g2_find((int32_t)d->format, 4, 1, 0, 0, 0, 0, 1);
    if (l->g1 < 0) return missing(ctx, "GEMM1", m);
    if (l->g2 < 0) return missing(ctx, "GEMM2", m);
    l->g1_grid[0] = (uint32_t)units, l->g1_grid[1] = (uint32_t)(d->inter / 16);
    l->g2_grid[0] = (uint32_t)units, l->g2_grid[1] = (uint32_t)g2_block_rows(d->hidden, 1);
    return K3_STATUS_SUCCESS;
}

k3_status k3_moe_launch_resolve(k3_ctx *ctx, const k3_moe_desc *d, int32_t sm_count, const k3_table_moe *t,
                                int64_t m, k3_moe_launch *l) {
    memset(l, 0, sizeof *l);
    if (!t->present) return resolve_generic(ctx, d, m, l);
    const uint32_t force = (uint32_t)d->force_shape;
    const int no_fold = (force & K3_MOE_FORCE_NO_FOLD) != 0, no_pair = (force & K3_MOE_FORCE_NO_PAIR) != 0;
    const int no_tiles = (force & K3_MOE_FORCE_NO_TILES) != 0, no_early = (force & K3_MOE_FORCE_NO_EARLY) != 0;
    const int no_balance = (force & K3_MOE_FORCE_NO_BALANCE) != 0;
    const int64_t np = m * d->top_k;
    const int64_t slots = np < d->num_experts ? np : d->num_experts;
    const int64_t sms = sm_count;
    const int32_t fmt = (int32_t)d->format;
    const int w4a4 = d->mode == K3_MOE_W4A4;
    /* NVFP4 whose scale words the cp.async ring can copy (per GEMM) */
    const int nv = d->format == K3_WEIGHT_NVFP4;
    const int al1 = nv && scale_words_aligned(d->scale_layout, d->hidden);
    const int al2 = nv && scale_words_aligned(d->scale_layout, d->inter);
    /* token tiles per pass; an expert with more tokens takes more passes (or units) */
    if (al1 && al2) l->nt = m <= t->async_nt1_max_m ? 1 : 2;
    else l->nt = m <= t->ring_nt1_max_m ? 1 : (m <= t->ring_nt2_max_m ? 2 : 4);
    const int32_t nt = l->nt;
    const int32_t gated = d->act.kind != K3_ACT_RELU2_NO_MUL;
    int64_t g1x = slots, g1y = d->inter / 16;
    /* GEMM2's warps split K where K gives each of them g2_split_chunks chunks or more: more blocks, more bytes in
     * flight with few experts */
    l->g2_split = d->inter / 128 >= (int64_t)t->g2_split_chunks * K3_MOE_G2_WARPS;
    const int32_t ks = l->g2_split ? K3_MOE_G2_WARPS : 1;
    int64_t g2x = slots, g2y = l->g2_split ? d->hidden / 16 : g2_block_rows(d->hidden, 1);
    const int as1 = al1 && nt <= 2, as2 = al2 && nt <= 2;
    /* waves are counted in the blocks per SM of the plain instance of each GEMM */
    const int32_t base1 = k3_moe_g1_find(fmt, gated, nt, as1, 0, 0, 0);
    const int32_t base2 = k3_moe_g2_find(fmt, nt, ks, as2, 0, 0, 0, 1);
    if (base1 < 0) return missing(ctx, "GEMM1", m);
    if (base2 < 0) return missing(ctx, "GEMM2", m);
    const int64_t per1 = g1_blocks(base1), per2 = g2_blocks(base2);
    /* paired tiles where twice the blocks still fit the table's waves; not at W4A4, whose requantization needs a
     * block's 16 outputs in one half-warp */
    l->pair = !no_pair && gated && as1 && nt == 1 && !w4a4 && g1x * (d->inter / 8) <= t->pair_waves * sms * per1;
    if (l->pair) g1y = d->inter / 8;
    /* the wide split (8 warps over K) where the split-K grid leaves SMs idle */
    l->wide = l->g2_split && as2 && nt == 1 && g2x * g2y <= t->wide_blocks_per_sm * sms;
    const int64_t blocks2 = g2x * g2y;
    /* the fold where both grids are within fold_waves waves: there the dispatch launch is a large part of the call */
    const int small = g1x * g1y <= t->fold_waves * sms * per1 && blocks2 <= t->fold_waves * sms * per2;
    l->fold = !no_fold && !w4a4 && as1 && as2 && np <= K3_MOE_FOLD_NP && d->num_experts <= K3_MOE_FOLD_E && small;
    /* denser GEMM2 instances where its grid runs past the table's waves of the default instance */
    const int64_t dense_waves = l->g2_split ? t->dense_split_waves : t->dense_k1_waves;
    l->dense = as2 && nt == 1 && !l->wide && blocks2 > dense_waves * sms * per2 && (l->g2_split || !l->fold);
    /* top_k 1: GEMM2 writes out itself (the cp.async instances have that epilogue) */
    l->direct = d->top_k == 1 && as2;
    /* units of one pass where distinct ids can give an expert more than a pass, else a whole expert per unit */
    l->tpu = m > 8 * nt ? 8 * nt : (int32_t)(np > 0 ? np : 1);
    if (!l->fold) g1x = g2x = max_units(d->num_experts, np, l->tpu);
    /* early routing where GEMM1's grid is within early_waves waves: its first wave's weights stream during dispatch */
    l->early = !no_early && !l->fold && !l->pair && !w4a4 && as1 && nt == 1 && np <= K3_MOE_FOLD_NP &&
               d->num_experts <= K3_MOE_FOLD_E && g1x * g1y <= t->early_waves * sms * per1;
    l->early_blocks = l->early ? sms * per1 : 0;
    /* 2 or 4 row tiles per GEMM2 warp (unfolded KS 1, NT 1): four where the two-tile grid exceeds g2_t4_waves waves */
    l->g2_tiles = 1;
    if (!no_tiles && !l->g2_split && as2 && nt == 1 && !l->fold && !l->wide) {
        const int32_t t2 = k3_moe_g2_find(fmt, 1, 1, 1, 0, 5, 0, 2);
        if (t2 < 0) return missing(ctx, "GEMM2", m);
        const int four = d->hidden % 64 == 0 && g2x * g2_block_rows(d->hidden, 2) > t->g2_t4_waves * sms * g2_blocks(t2);
        l->g2_tiles = four ? 4 : 2;
        g2y = g2_block_rows(d->hidden, l->g2_tiles);
    }
    /* the folded GEMM1 (the call's first kernel, launched plainly: all its blocks are placed at once) held to its
     * grid's share of blocks per SM where that is below what fits: alone the placement is the same, and beside
     * another stream's kernel the blocks that find SMs busy wait for them instead of stacking on the free ones */
    if (l->fold && !no_balance) {
        const int64_t share = (g1x * g1y + sms - 1) / sms;
        if (share < per1) l->g1_per_sm = (int32_t)share;
    }
    l->dispatch = !l->fold;
    l->combine = !l->direct;
    /* the instances */
    if (as1) l->g1 = k3_moe_g1_find(fmt, gated, nt, 1, l->early ? 0 : l->fold, l->pair, l->early);
    else l->g1 = base1;
    const int32_t direct = l->direct;
    if (l->g2_tiles > 1) l->g2 = k3_moe_g2_find(fmt, 1, 1, 1, 0, l->g2_tiles == 4 ? 4 : 5, direct, l->g2_tiles);
    else if (l->wide) l->g2 = k3_moe_g2_find(fmt, 1, K3_MOE_G2_WIDE_KS, 1, l->fold, 0, direct, 1);
    else if (as2 && l->dense) l->g2 = k3_moe_g2_find(fmt, 1, ks, 1, l->fold, ks == 1 ? 8 : 7, direct, 1);
    else if (as2) l->g2 = k3_moe_g2_find(fmt, nt, ks, 1, l->fold, 0, direct, 1);
    else l->g2 = base2;
    if (l->g1 < 0) return missing(ctx, "GEMM1", m);
    if (l->g2 < 0) return missing(ctx, "GEMM2", m);
    l->g1_grid[0] = (uint32_t)g1x, l->g1_grid[1] = (uint32_t)g1y;
    l->g2_grid[0] = (uint32_t)g2x, l->g2_grid[1] = (uint32_t)g2y;
    return K3_STATUS_SUCCESS;
}

void k3_moe_launch_describe(const k3_moe_launch *l, k3_moe_launch_info *out) {
    memset(out, 0, sizeof *out);
    int32_t n = 0;
    snprintf(out->gemm1, sizeof out->gemm1, "%s", k3_moe_g1_configs(&n)[l->g1].name);
    snprintf(out->gemm2, sizeof out->gemm2, "%s", k3_moe_g2_configs(&n)[l->g2].name);
    out->dispatch = l->dispatch, out->combine = l->combine;
    out->token_tiles = l->nt, out->tokens_per_unit = l->tpu;
    out->fold = l->fold, out->pair = l->pair, out->early = l->early, out->wide = l->wide, out->dense = l->dense;
    out->direct = l->direct, out->gemm2_tiles = l->g2_tiles, out->gemm2_split_k = l->g2_split;
    out->early_blocks = l->early_blocks;
    out->gemm1_blocks_per_sm = l->g1_per_sm;
    out->gemm1_grid[0] = l->g1_grid[0], out->gemm1_grid[1] = l->g1_grid[1];
    out->gemm2_grid[0] = l->g2_grid[0], out->gemm2_grid[1] = l->g2_grid[1];
}
