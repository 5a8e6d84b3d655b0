/*
 * The MoE plan chooses exactly the launch shapes that the per-call heuristic of the CUDA launcher chose before the
 * choices became plan data. The oracle below is that heuristic as it was written in the launcher (the thresholds
 * as the constants it had), applied to the same descriptor, m and SM count; the subject is k3_moe_plan_kernel on a
 * simulated SM90 context, whose plan resolves every m from tables/sm90.txt's moe rows and the registry.
 * Also: the forced shapes, the simulated SM count, the generic fallback, the validation of force_shape.
 */
#include <stdio.h>
#include <string.h>

#include "plan/moe_configs.h"
#include "test_util.h"

/* ---- the oracle: the launcher's former shape_of() and launch_fmt() instance choice --------------------------- */
enum { O_G1_WARPS = 4, O_G2_WARPS = 4, O_G1_MIN_BLOCKS = 3, O_G2_MIN_BLOCKS = 3, O_G2_WIDE_KS = 8 };
enum { O_G2_T2_MINB = 5, O_G2_T4_MINB = 4, O_G2_DENSE_SPLIT = 7, O_G2_DENSE_K1 = 8 };
enum { O_FOLD_NP = 256, O_FOLD_E = 4096, O_FOLD_WAVES = 2, O_EARLY_WAVES = 8, O_NT1_MAX_M = 64, O_G2_T4_WAVES = 6 };

static int o_g1_min_blocks(int async, int nt) { return async && nt == 1 ? 4 : O_G1_MIN_BLOCKS; }
static int o_g2_min_blocks(int async, int nt, int ks) {
    return !async ? O_G2_MIN_BLOCKS : (ks == O_G2_WIDE_KS ? 2 : (ks == 1 && nt == 1 ? 6 : 5));
}
static int64_t o_g2_block_rows(int64_t hidden, int tiles) {
    return (hidden / 16 + tiles * O_G2_WARPS - 1) / (tiles * O_G2_WARPS);
}
static int64_t o_max_units(int64_t e, int64_t np, int64_t tpu) { return (e < np ? e : np) + np / tpu; }
/* (the pointer half of the old alignment test is now a run-time requirement: aligned pointers here) */
static int o_async_ok(int layout, int64_t cols) { return layout == K3_SCALE_SWIZZLED || (cols / 16) % 4 == 0; }

typedef struct oshape {
    int nt, gated, g2_split, as1, as2, fold, pair, early, wide, g2_dense, direct, g2_tiles, tpu;
    int64_t g1x, g1y, g2x, g2y, early_blocks, g1_per_sm;
    /* the instance launch_fmt picked: GEMM1 (async, fold, pair, early), GEMM2 (nt, ks, async, fold, minb, tiles) */
    int i1_async, i1_fold, i1_pair, i1_early;
    int i2_nt, i2_ks, i2_async, i2_fold, i2_minb, i2_direct, i2_tiles;
} oshape;

static oshape oracle(const k3_moe_desc *d, int64_t sms, int64_t m, uint32_t no) {
    const int no_fold = (no & K3_MOE_FORCE_NO_FOLD) != 0, no_pair = (no & K3_MOE_FORCE_NO_PAIR) != 0;
    const int no_t2 = (no & K3_MOE_FORCE_NO_TILES) != 0, no_early = (no & K3_MOE_FORCE_NO_EARLY) != 0;
    const int no_balance = (no & K3_MOE_FORCE_NO_BALANCE) != 0;
    const int32_t np = (int32_t)(m * d->top_k);
    const int32_t slots = np < d->num_experts ? np : d->num_experts;
    oshape sh;
    memset(&sh, 0, sizeof sh);
    const int nv = d->format == K3_WEIGHT_NVFP4;
    const int al1 = nv && o_async_ok(d->scale_layout, d->hidden);
    const int al2 = nv && o_async_ok(d->scale_layout, d->inter);
    const int nv_ok = al1 && al2;
    sh.nt = nv_ok ? (m <= O_NT1_MAX_M ? 1 : 2) : (m <= 8 ? 1 : (m <= 16 ? 2 : 4));
    sh.gated = d->act.kind != K3_ACT_RELU2_NO_MUL;
    sh.g1x = slots, sh.g1y = d->inter / 16;
    sh.g2_split = d->inter / 128 >= 2 * O_G2_WARPS;
    sh.g2x = slots, sh.g2y = sh.g2_split ? d->hidden / 16 : o_g2_block_rows(d->hidden, 1);
    sh.as1 = al1 && sh.nt <= 2;
    sh.as2 = al2 && sh.nt <= 2;
    const int64_t per1 = o_g1_min_blocks(sh.as1, sh.nt);
    const int64_t per2 = o_g2_min_blocks(sh.as2, sh.nt, sh.g2_split ? O_G2_WARPS : 1);
    sh.pair = !no_pair && sh.gated && sh.as1 && sh.nt == 1 && d->mode != K3_MOE_W4A4 &&
              sh.g1x * (d->inter / 8) <= sms * per1;
    if (sh.pair) sh.g1y = d->inter / 8;
    sh.wide = sh.g2_split && sh.as2 && sh.nt == 1 && sh.g2x * sh.g2y <= 2 * sms;
    const int64_t blocks2 = sh.g2x * sh.g2y;
    const int small = sh.g1x * sh.g1y <= O_FOLD_WAVES * sms * per1 && blocks2 <= O_FOLD_WAVES * sms * per2;
    sh.fold = !no_fold && d->mode != K3_MOE_W4A4 && sh.as1 && sh.as2 && np <= O_FOLD_NP &&
              d->num_experts <= O_FOLD_E && small;
    sh.g2_dense = sh.as2 && sh.nt == 1 && !sh.wide && blocks2 > (sh.g2_split ? 1 : 2) * sms * per2 &&
                  (sh.g2_split || !sh.fold);
    sh.direct = d->top_k == 1 && sh.as2;
    sh.tpu = m > 8 * sh.nt ? 8 * sh.nt : (np > 0 ? np : 1);
    if (!sh.fold) sh.g1x = sh.g2x = o_max_units(d->num_experts, np, sh.tpu);
    sh.early = !no_early && !sh.fold && !sh.pair && d->mode != K3_MOE_W4A4 && sh.as1 && sh.nt == 1 &&
               np <= O_FOLD_NP && d->num_experts <= O_FOLD_E && sh.g1x * sh.g1y <= O_EARLY_WAVES * sms * per1;
    sh.early_blocks = sh.early ? sms * per1 : 0;
    sh.g2_tiles = 1;
    if (!no_t2 && !sh.g2_split && sh.as2 && sh.nt == 1 && !sh.fold && !sh.wide) {
        const int four =
            d->hidden % 64 == 0 && sh.g2x * o_g2_block_rows(d->hidden, 2) > O_G2_T4_WAVES * sms * O_G2_T2_MINB;
        sh.g2_tiles = four ? 4 : 2;
        sh.g2y = o_g2_block_rows(d->hidden, sh.g2_tiles);
    }
    /* the folded GEMM1 at its grid's share of the SMs (blocks per SM, rounded up) where fewer than fit */
    const int64_t share = (sh.g1x * sh.g1y + sms - 1) / sms;
    sh.g1_per_sm = sh.fold && !no_balance && share < per1 ? share : 0;
    /* launch_fmt: which instance runs */
    sh.i1_async = nv && sh.as1 && (sh.nt == 1 || sh.nt == 2);
    sh.i1_fold = sh.i1_async && !sh.early && sh.fold;
    sh.i1_pair = sh.i1_async && !sh.early && sh.pair;
    sh.i1_early = sh.i1_async && sh.early;
    sh.i2_direct = sh.direct;
    if (sh.g2_tiles > 1) {
        sh.i2_nt = 1, sh.i2_ks = 1, sh.i2_async = 1, sh.i2_fold = 0, sh.i2_tiles = sh.g2_tiles;
        sh.i2_minb = sh.g2_tiles == 4 ? O_G2_T4_MINB : O_G2_T2_MINB;
    } else if (sh.wide) {
        sh.i2_nt = 1, sh.i2_ks = O_G2_WIDE_KS, sh.i2_async = 1, sh.i2_fold = sh.fold, sh.i2_minb = 0, sh.i2_tiles = 1;
    } else {
        const int ks = sh.g2_split ? O_G2_WARPS : 1;
        sh.i2_nt = sh.nt, sh.i2_ks = ks, sh.i2_tiles = 1, sh.i2_minb = 0;
        sh.i2_async = nv && sh.as2 && (sh.nt == 1 || sh.nt == 2);
        sh.i2_fold = sh.i2_async && sh.fold;
        if (sh.i2_async && sh.nt == 1 && sh.g2_dense) sh.i2_minb = ks == 1 ? O_G2_DENSE_K1 : O_G2_DENSE_SPLIT;
        if (!sh.i2_async) sh.i2_direct = 0;
    }
    return sh;
}

/* ---- the subject ----------------------------------------------------------------------------------------- */
static k3_ctx *sim_ctx(int32_t sms) {
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    opt.backend = K3_BACKEND_CPU;
    opt.sim_major = 9, opt.sim_minor = 0, opt.sim_sm_count = sms;
    k3_ctx *ctx = NULL;
    return k3_ctx_create(&opt, &ctx) == K3_STATUS_SUCCESS ? ctx : NULL;
}

static const k3_moe_g1_config *g1_by_name(const char *name) {
    int32_t n = 0;
    const k3_moe_g1_config *c = k3_moe_g1_configs(&n);
    for (int32_t i = 0; i < n; i++)
        if (!strcmp(c[i].name, name)) return &c[i];
    return NULL;
}
static const k3_moe_g2_config *g2_by_name(const char *name) {
    int32_t n = 0;
    const k3_moe_g2_config *c = k3_moe_g2_configs(&n);
    for (int32_t i = 0; i < n; i++)
        if (!strcmp(c[i].name, name)) return &c[i];
    return NULL;
}

static int64_t n_compared, n_mismatch;

/* Every m of one descriptor against the oracle; returns 0 when all agree. */
static int compare_plan(k3_ctx *ctx, const k3_moe_desc *d, int64_t sms, const int64_t *ms, int nm) {
    k3_moe_plan *plan = NULL;
    const k3_status st = k3_moe_plan_create(ctx, d, &plan);
    if (st != K3_STATUS_SUCCESS) {
        CHECK(0, "plan E %d k %d L %lld I %lld fmt %d: %s", (int)d->num_experts, (int)d->top_k, (long long)d->hidden,
              (long long)d->inter, (int)d->format, k3_ctx_last_error(ctx));
        return 1;
    }
    int bad = 0;
    for (int i = 0; i < nm && !bad; i++) {
        const int64_t m = ms[i];
        if (m > d->max_tokens) continue;
        k3_moe_launch_info info;
        if (k3_moe_plan_kernel(plan, m, &info) != K3_STATUS_SUCCESS) {
            bad = 1;
            break;
        }
        const oshape o = oracle(d, sms, m, (uint32_t)d->force_shape);
        const k3_moe_g1_config *c1 = g1_by_name(info.gemm1);
        const k3_moe_g2_config *c2 = g2_by_name(info.gemm2);
        const int same =
            c1 && c2 && info.token_tiles == o.nt && info.fold == o.fold && info.dispatch == !o.fold &&
            info.pair == o.pair && info.early == o.early && info.early_blocks == o.early_blocks &&
            info.wide == o.wide && info.dense == o.g2_dense && info.direct == o.direct &&
            info.combine == !o.direct && info.gemm2_tiles == o.g2_tiles && info.gemm2_split_k == o.g2_split &&
            info.tokens_per_unit == o.tpu && info.gemm1_blocks_per_sm == o.g1_per_sm &&
            info.gemm1_grid[0] == o.g1x && info.gemm1_grid[1] == o.g1y &&
            info.gemm2_grid[0] == o.g2x && info.gemm2_grid[1] == o.g2y && c1->format == (int)d->format &&
            c1->gated == o.gated && c1->nt == o.nt && c1->async == o.i1_async && c1->fold == o.i1_fold &&
            c1->pair == o.i1_pair && c1->early == o.i1_early && c2->format == (int)d->format && c2->nt == o.i2_nt &&
            c2->ks == o.i2_ks && c2->async == o.i2_async && c2->fold == o.i2_fold && c2->min_blocks == o.i2_minb &&
            c2->direct == o.i2_direct && c2->tiles == o.i2_tiles;
        n_compared++;
        if (!same) {
            n_mismatch++;
            bad = 1;
            CHECK(0,
                  "E %d k %d L %lld I %lld fmt %d layout %d mode %d act %d sms %lld force %d m %lld: plan %s %s "
                  "grid %lldx%lld %lldx%lld fold %d pair %d early %d wide %d dense %d tiles %d nt %d; oracle grid "
                  "%lldx%lld %lldx%lld fold %d pair %d early %d wide %d dense %d tiles %d nt %d",
                  (int)d->num_experts, (int)d->top_k, (long long)d->hidden, (long long)d->inter, (int)d->format,
                  (int)d->scale_layout, (int)d->mode, (int)d->act.kind, (long long)sms, (int)d->force_shape,
                  (long long)m, info.gemm1, info.gemm2, (long long)info.gemm1_grid[0], (long long)info.gemm1_grid[1],
                  (long long)info.gemm2_grid[0], (long long)info.gemm2_grid[1], info.fold, info.pair, info.early,
                  info.wide, info.dense, info.gemm2_tiles, info.token_tiles, (long long)o.g1x, (long long)o.g1y,
                  (long long)o.g2x, (long long)o.g2y, o.fold, o.pair, o.early, o.wide, o.g2_dense, o.g2_tiles, o.nt);
        }
    }
    k3_moe_plan_destroy(plan);
    return bad;
}

typedef struct shape { int32_t e, k; int64_t l, i; } shape;

/* The shapes of gpu_moe's cases and the benchmark's configurations (tp8, ep16), and a few edges. */
static const shape k_shapes[] = {
    {1, 1, 128, 128},    {8, 2, 256, 128},    {56, 8, 224, 96},   {56, 1, 256, 128},  {56, 16, 256, 128},
    {56, 8, 256, 128},   {896, 16, 128, 64},  {56, 4, 256, 128},  {56, 2, 256, 128},  {56, 8, 256, 64},
    {56, 8, 256, 160},   {8, 2, 384, 256},    {8, 2, 128, 64},    {8, 2, 224, 96},    {8, 2, 256, 1024},
    {56, 8, 128, 1152},  {56, 1, 3584, 3072}, {896, 16, 256, 128}, {8, 4, 512, 256},  {8, 4, 384, 128},
    {8, 3, 256, 256},    {56, 16, 128, 64},   {896, 16, 3584, 384}, {56, 16, 3584, 3072}, {896, 1, 3584, 384},
    {5000, 8, 256, 128}, {64, 32, 256, 128},
};

static void test_against_oracle(void) {
    static const int32_t sm_counts[] = {132, 78, 170};
    static const k3_weight_format formats[] = {K3_WEIGHT_NVFP4, K3_WEIGHT_MXFP4, K3_WEIGHT_BF16};
    static const k3_act_kind acts[] = {K3_ACT_SITU, K3_ACT_RELU2_NO_MUL, K3_ACT_SWIGLUOAI};
    static const int32_t forces[] = {0, K3_MOE_FORCE_NO_FOLD, K3_MOE_FORCE_NO_PAIR, K3_MOE_FORCE_NO_TILES,
                                     K3_MOE_FORCE_NO_EARLY, K3_MOE_FORCE_NO_BALANCE, 31};
    int64_t ms[80];
    int nm = 0;
    for (int64_t m = 1; m <= 64; m++) ms[nm++] = m;
    static const int64_t big[] = {65, 96, 100, 128, 200, 256, 512};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) ms[nm++] = big[i];
    for (size_t si = 0; si < sizeof sm_counts / sizeof sm_counts[0]; si++) {
        k3_ctx *ctx = sim_ctx(sm_counts[si]);
        CHECK(ctx != NULL, "simulated sm90 context with %d SMs", (int)sm_counts[si]);
        if (!ctx) continue;
        int failures = 0;
        for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0] && failures < 5; s++)
            for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++)
                for (int layout = 0; layout < 2; layout++)
                    for (int mode = 0; mode < 2; mode++)
                        for (size_t a = 0; a < sizeof acts / sizeof acts[0]; a++)
                            for (size_t fo = 0; fo < sizeof forces / sizeof forces[0]; fo++) {
                                if (mode == K3_MOE_W4A4 && formats[f] != K3_WEIGHT_NVFP4) continue;
                                if (formats[f] == K3_WEIGHT_BF16 && layout) continue;
                                k3_moe_desc d;
                                k3_moe_desc_init(&d);
                                d.num_experts = k_shapes[s].e, d.top_k = k_shapes[s].k;
                                d.hidden = k_shapes[s].l, d.inter = k_shapes[s].i;
                                d.format = formats[f], d.scale_layout = (k3_scale_layout)layout;
                                d.mode = (k3_moe_mode)mode;
                                k3_act_desc_init(&d.act, acts[a]);
                                if (acts[a] == K3_ACT_SITU) k3_act_desc_k3(&d.act);
                                d.max_tokens = 512;
                                d.force_shape = forces[fo];
                                failures += compare_plan(ctx, &d, sm_counts[si], ms, nm);
                            }
        k3_ctx_destroy(ctx);
    }
    CHECK(n_compared > 100000 && n_mismatch == 0, "%lld (descriptor, m) points compared, %lld differ",
          (long long)n_compared, (long long)n_mismatch);
    printf("moe plan vs the former per-call heuristic: %lld points, %lld differ\n", (long long)n_compared,
           (long long)n_mismatch);
}

/* A forced shape changes only what it names, and every printed name is in the registry. */
static void test_forced_and_info(void) {
    k3_ctx *ctx = sim_ctx(132);
    if (!ctx) return;
    k3_moe_desc d;
    k3_moe_desc_init(&d); /* K3 TP8: at m 1 the GEMMs route themselves */
    k3_moe_plan *p = NULL, *q = NULL;
    CHECK(k3_moe_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "%s", k3_ctx_last_error(ctx));
    d.force_shape = K3_MOE_FORCE_NO_FOLD;
    CHECK(k3_moe_plan_create(ctx, &d, &q) == K3_STATUS_SUCCESS, "%s", k3_ctx_last_error(ctx));
    k3_moe_launch_info a, b;
    if (p && q) {
        CHECK(k3_moe_plan_kernel(p, 1, &a) == K3_STATUS_SUCCESS && a.fold == 1 && a.dispatch == 0,
              "TP8 m 1 folds (%s, dispatch %d)", a.gemm1, a.dispatch);
        CHECK(k3_moe_plan_kernel(q, 1, &b) == K3_STATUS_SUCCESS && b.fold == 0 && b.dispatch == 1,
              "NO_FOLD keeps the dispatch kernel (%s)", b.gemm1);
        CHECK(strstr(a.gemm1, "fold") != NULL && strstr(b.gemm1, "fold") == NULL, "%s / %s", a.gemm1, b.gemm1);
        /* 16 experts x 24 row tiles = 384 blocks on 132 SMs: 3 per SM (4 fit); the dispatch path has no cap */
        CHECK(k3_moe_plan_kernel(p, 1, &a) == K3_STATUS_SUCCESS && a.gemm1_blocks_per_sm == 3,
              "TP8 m 1: the folded GEMM1 at 3 blocks per SM (got %d)", (int)a.gemm1_blocks_per_sm);
        CHECK(b.gemm1_blocks_per_sm == 0, "NO_FOLD: no cap (got %d)", (int)b.gemm1_blocks_per_sm);
        CHECK(k3_moe_plan_kernel(p, 0, &a) == K3_STATUS_INVALID_ARGUMENT, "m 0 refused");
        CHECK(k3_moe_plan_kernel(p, 17, &a) == K3_STATUS_INVALID_ARGUMENT &&
                  strstr(k3_ctx_last_error(ctx), "max_tokens") != NULL,
              "m past max_tokens refused: %s", k3_ctx_last_error(ctx));
        CHECK(k3_moe_plan_kernel(p, 1, NULL) == K3_STATUS_INVALID_ARGUMENT, "NULL out refused");
    }
    k3_moe_plan_destroy(p);
    k3_moe_plan_destroy(q);
    d.force_shape = K3_MOE_FORCE_NO_BALANCE;
    q = NULL;
    CHECK(k3_moe_plan_create(ctx, &d, &q) == K3_STATUS_SUCCESS && k3_moe_plan_kernel(q, 1, &b) == K3_STATUS_SUCCESS &&
              b.fold == 1 && b.gemm1_blocks_per_sm == 0,
          "NO_BALANCE: folded, no cap (%d)", (int)b.gemm1_blocks_per_sm);
    k3_moe_plan_destroy(q);
    d.force_shape = 0x100;
    q = NULL;
    CHECK(k3_moe_plan_create(ctx, &d, &q) == K3_STATUS_INVALID_ARGUMENT && q == NULL &&
              strstr(k3_ctx_last_error(ctx), "force_shape") != NULL,
          "unknown force bits refused: %s", k3_ctx_last_error(ctx));
    k3_ctx_destroy(ctx);

    /* a plain CPU context reports the reference; a simulated one without a count takes the table's key (132) */
    k3_ctx *cpu = k3t_cpu_ctx();
    k3_moe_desc_init(&d);
    p = NULL;
    if (cpu && k3_moe_plan_create(cpu, &d, &p) == K3_STATUS_SUCCESS) {
        CHECK(k3_moe_plan_kernel(p, 1, &a) == K3_STATUS_SUCCESS && !strcmp(a.gemm1, "cpu"), "cpu: %s", a.gemm1);
        k3_moe_plan_destroy(p);
    }
    k3_ctx_destroy(cpu);
    k3_ctx *dflt = sim_ctx(0), *sized = sim_ctx(132);
    k3_moe_plan *pd = NULL, *ps = NULL;
    if (dflt && sized && k3_moe_plan_create(dflt, &d, &pd) == K3_STATUS_SUCCESS &&
        k3_moe_plan_create(sized, &d, &ps) == K3_STATUS_SUCCESS) {
        for (int64_t m = 1; m <= 16; m++) {
            CHECK(k3_moe_plan_kernel(pd, m, &a) == K3_STATUS_SUCCESS && k3_moe_plan_kernel(ps, m, &b) == K3_STATUS_SUCCESS &&
                      !memcmp(&a, &b, sizeof a),
                  "m %lld: the table key's SM count is 132", (long long)m);
        }
    }
    k3_moe_plan_destroy(pd);
    k3_moe_plan_destroy(ps);
    k3_ctx_destroy(dflt);
    k3_ctx_destroy(sized);
}

/* The simulated count is validated. */
static void test_sim_count(void) {
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    opt.backend = K3_BACKEND_CPU;
    opt.sim_major = 9, opt.sim_sm_count = -1;
    k3_ctx *ctx = NULL;
    CHECK(k3_ctx_create(&opt, &ctx) == K3_STATUS_INVALID_ARGUMENT && ctx == NULL, "negative sim_sm_count refused");
    opt.sim_major = 0, opt.sim_sm_count = 100;
    CHECK(k3_ctx_create(&opt, &ctx) == K3_STATUS_INVALID_ARGUMENT && ctx == NULL, "sim_sm_count without sim_major");
}

int main(void) {
    test_against_oracle();
    test_forced_and_info();
    test_sim_count();
    return k3t_finish();
}
