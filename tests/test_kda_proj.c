/* KDA projection on the CPU backend: plan/run validation and results vs an independent fp64 evaluation. */
#include <string.h>

#include "k3.h"
#include "kda_ref.h"
#include "plan/kda_tuning.h"
#include "test_util.h"

static void expect_plan_error(k3_ctx *ctx, const k3_kda_proj_desc *d, const char *what, const char *needle) {
    k3_kda_proj_plan *p = NULL;
    k3_status st = k3_kda_proj_plan_create(ctx, d, &p);
    CHECK(st == K3_STATUS_INVALID_ARGUMENT && p == NULL, "%s: status %s", what, k3_status_string(st));
    CHECK(strstr(k3_ctx_last_error(ctx), needle) != NULL, "%s: message '%s' lacks '%s'", what,
          k3_ctx_last_error(ctx), needle);
}

static void test_validation(k3_ctx *ctx) {
    k3_kda_proj_desc d;
    k3_kda_proj_desc_init(&d);
    k3_kda_proj_desc bad = d;
    bad.hidden = 7000;
    expect_plan_error(ctx, &bad, "hidden", "hidden");
    bad = d;
    bad.fa_dim = 64;
    expect_plan_error(ctx, &bad, "fa_dim", "fa_dim");
    bad = d;
    bad.packed_rows = 6144 + 100;
    expect_plan_error(ctx, &bad, "packed too small", "F_AB rows");
    bad = d;
    bad.packed_rows = 6288 + 4;
    expect_plan_error(ctx, &bad, "fab not multiple of 8", "multiple of 8");
    bad = d;
    bad.max_tokens = 0;
    expect_plan_error(ctx, &bad, "max_tokens 0", "max_tokens");
    bad.max_tokens = 17;
    expect_plan_error(ctx, &bad, "max_tokens 17", "max_tokens");
    bad = d;
    bad.overlap_max_tokens = 17;
    expect_plan_error(ctx, &bad, "overlap > max", "overlap_max_tokens");
    bad.overlap_max_tokens = -2;
    expect_plan_error(ctx, &bad, "overlap -2", "overlap_max_tokens");
    bad = d;
    bad.run_n_shape = 6; /* one past K3_KDA_RUN_N_FUSED */
    expect_plan_error(ctx, &bad, "run_n shape 6", "run_n_shape");
    bad.run_n_shape = -1;
    expect_plan_error(ctx, &bad, "run_n shape -1", "run_n_shape");
    bad.run_n_shape = K3_KDA_RUN_N_NARROW; /* 128 threads x 8-element vectors must tile hidden */
    bad.hidden = 1536;
    expect_plan_error(ctx, &bad, "narrow with hidden 1536", "hidden % 1024");
    bad = d;
    bad.qkvg_kernel = K3_KERNEL_SKINNY;
    expect_plan_error(ctx, &bad, "qkvg_kernel SKINNY", "qkvg_kernel");
    bad.qkvg_kernel = -2;
    expect_plan_error(ctx, &bad, "qkvg_kernel -2", "qkvg_kernel");
    bad = d;
    bad.local_heads = 0;
    expect_plan_error(ctx, &bad, "heads 0", "local_heads");
    k3_kda_proj_plan *p = NULL;
    CHECK(k3_kda_proj_plan_create(ctx, NULL, &p) == K3_STATUS_INVALID_ARGUMENT, "NULL desc");
    CHECK(k3_kda_proj_plan_create(ctx, &d, NULL) == K3_STATUS_INVALID_ARGUMENT, "NULL out");

    /* the other TP degrees plan (K3-MODEL.md section 2): TP4 24 heads / 12448 rows, TP16 6 heads / 3216 */
    k3_kda_proj_desc tp4 = d, tp16 = d;
    tp4.local_heads = 24;
    tp4.packed_rows = 12448;
    tp16.local_heads = 6;
    tp16.packed_rows = 3216;
    CHECK(k3_kda_proj_plan_create(ctx, &tp4, &p) == K3_STATUS_SUCCESS, "TP4 plans: %s", k3_ctx_last_error(ctx));
    k3_kda_proj_plan_destroy(p);
    CHECK(k3_kda_proj_plan_create(ctx, &tp16, &p) == K3_STATUS_SUCCESS, "TP16 plans: %s", k3_ctx_last_error(ctx));
    k3_kda_proj_plan_destroy(p);
    k3_kda_proj_plan_destroy(NULL);
    /* the one-launch projection is a CUDA kernel: on the CPU backend a forced FUSED plans and runs the reference */
    k3_kda_proj_desc fused = d;
    fused.run_n_shape = K3_KDA_RUN_N_FUSED;
    CHECK(k3_kda_proj_plan_create(ctx, &fused, &p) == K3_STATUS_SUCCESS, "FUSED on the CPU backend plans: %s",
          k3_ctx_last_error(ctx));
    k3_kda_proj_plan_destroy(p);
}

/* Where the one-launch projection fits (K3_KDA_RUN_N_FUSED): the grid from the SM count and the shape. */
static void test_fused_layout(void) {
    k3_kda_fused_layout l;
    const char *why = NULL;
    /* TP8 on 132 SMs: 6144 / 48 = 128 QKVG blocks, 4 branch blocks of 56 K chunks each (x slice rows of 1792
     * elements padded to 1824: 64 mod 128 bytes) */
    CHECK(k3_kda_fused_layout_for(132, 7168, 6144, 144, 1536, 128, &l, &why) == 1, "TP8 on 132 SMs: %s",
          why ? why : "");
    CHECK(l.qkvg_blocks == 128 && l.branch_blocks == 4 && l.xs_stride == 1824 && l.xs_bytes == 16 * 1824 * 2,
          "TP8 grid %d + %d, x rows %d", (int)l.qkvg_blocks, (int)l.branch_blocks, (int)l.xs_stride);
    /* at least two branch blocks, and two f_b tiles per branch warp at most */
    CHECK(k3_kda_fused_layout_for(129, 7168, 6144, 144, 1536, 128, &l, &why) == 0 && why && strstr(why, "SMs"),
          "TP8 on 129 SMs refused with a reason");
    CHECK(k3_kda_fused_layout_for(131, 7168, 6144, 144, 1536, 128, &l, &why) == 0 && why && strstr(why, "f_b"),
          "TP8 on 131 SMs (36 branch warps for 96 f_b tiles) refused with a reason");
    /* TP16 (3072 QKVG rows): 64 + 4 blocks (at most 4 branch blocks); TP4 (12288 rows, F_AB 160): refused */
    CHECK(k3_kda_fused_layout_for(132, 7168, 3072, 144, 768, 128, &l, &why) == 1 && l.branch_blocks == 4 &&
              l.xs_stride == 1824,
          "TP16 on 132 SMs");
    CHECK(k3_kda_fused_layout_for(132, 7168, 12288, 160, 3072, 128, &l, &why) == 0, "TP4 refused");
    CHECK(k3_kda_fused_layout_for(132, 7168, 6144 + 16, 144, 1536, 128, &l, &why) == 0 && why &&
              strstr(why, "48"),
          "QKVG rows not a multiple of 48 refused");
    CHECK(k3_kda_fused_layout_for(132, 7168, 6144, 160, 1536, 128, &l, &why) == 0 && why && strstr(why, "144"),
          "more than 144 F_AB rows refused");
}

/* Every architecture's tuning names, for every m, a head prefetch the one-launch kernel was compiled with (an
 * uncompiled value would make every such run fail), and a run_n shape the plan knows. */
static void test_tuning_data(void) {
    const k3_table_id ids[] = {K3_TABLE_NONE, K3_TABLE_SM90, K3_TABLE_SM100, K3_TABLE_SM103};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        k3_kda_tuning t;
        k3_kda_tuning_for(ids[i], &t);
        CHECK(t.overlap_max_tokens >= 0 && t.overlap_max_tokens <= 16, "table %d: overlap through %lld", (int)ids[i],
              (long long)t.overlap_max_tokens);
        for (int m = 1; m <= 16; m++) {
            CHECK(t.fused_head_steps[m] >= 1 && t.fused_head_steps[m] <= K3_KDA_FUSED_MAX_HEAD_STEPS,
                  "table %d m %d: head steps %d", (int)ids[i], m, (int)t.fused_head_steps[m]);
            CHECK(t.run_n_shape[m] >= K3_KDA_RUN_N_ROWS1 && t.run_n_shape[m] <= K3_KDA_RUN_N_FUSED,
                  "table %d m %d: run_n shape %d", (int)ids[i], m, (int)t.run_n_shape[m]);
        }
    }
}

/* A small instance (hidden 512, 2 heads of 64: qkvg 512 rows, F_AB 136 rows) on the CPU backend. */
static void test_cpu_results(k3_ctx *ctx, uint64_t seed) {
    k3_kda_proj_desc d;
    k3_kda_proj_desc_init(&d);
    d.hidden = 512;
    d.local_heads = 2;
    d.head_dim = 64;
    d.packed_rows = 512 + 136;
    const int64_t H = d.hidden, Q = 512, F = 136, G = 128, M = 16;
    k3_kda_proj_plan *p = NULL;
    CHECK(k3_kda_proj_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "plan: %s", k3_ctx_last_error(ctx));
    if (!p) return;
    k3t_rng rng = {seed};
    uint16_t *x = aligned_alloc(16, (size_t)(M * H * 2)), *wp = aligned_alloc(16, (size_t)((Q + F) * H * 2));
    uint16_t *wfb = aligned_alloc(16, (size_t)(G * 128 * 2));
    uint16_t *qkvg = aligned_alloc(16, (size_t)(M * Q * 2)), *fab = aligned_alloc(16, (size_t)(M * F * 2));
    uint16_t *g1 = aligned_alloc(16, (size_t)(M * G * 2));
    double *rq = malloc(sizeof(double) * M * Q), *rf = malloc(sizeof(double) * M * F),
           *rg = malloc(sizeof(double) * M * G);
    for (int64_t i = 0; i < M * H; i++) x[i] = k3_bf16_from_f32(k3t_uniform(&rng));
    for (int64_t i = 0; i < (Q + F) * H; i++) wp[i] = k3_bf16_from_f32(0.05f * k3t_uniform(&rng));
    for (int64_t i = 0; i < G * 128; i++) wfb[i] = k3_bf16_from_f32(0.1f * k3t_uniform(&rng));
    kref_kda(M, H, Q, F, G, x, wp, wfb, rq, rf, rg);
    const int64_t ms[] = {1, 3, 14, 16};
    for (int t = 0; t < 4; t++) {
        const int64_t m = ms[t];
        memset(qkvg, 0xff, (size_t)(M * Q * 2));
        memset(fab, 0xff, (size_t)(M * F * 2));
        memset(g1, 0xff, (size_t)(M * G * 2));
        k3_status st = k3_kda_proj_run(p, m, x, wp, wfb, qkvg, fab, g1, NULL, 0, NULL);
        CHECK(st == K3_STATUS_SUCCESS, "run m=%lld: %s", (long long)m, k3_ctx_last_error(ctx));
        double eq = kref_rel_l2(m, 0, Q, qkvg, Q, rq, Q), ef = kref_rel_l2(m, 0, F, fab, F, rf, F),
               eg = kref_rel_l2(m, 0, G, g1, G, rg, G);
        CHECK(eq <= 2e-3 && ef <= 2e-3 && eg <= 2e-3, "m=%lld rel-L2 qkvg %.3g fab %.3g g1 %.3g", (long long)m, eq,
              ef, eg);
        /* rows past m stay poisoned: the run writes exactly m rows */
        CHECK(m == M || qkvg[m * Q] == 0xffff, "row m of qkvg untouched");
    }
    /* run-time validation */
    CHECK(k3_kda_proj_run(p, 0, x, wp, wfb, qkvg, fab, g1, NULL, 0, NULL) == K3_STATUS_INVALID_ARGUMENT, "m=0");
    CHECK(k3_kda_proj_run(p, 17, x, wp, wfb, qkvg, fab, g1, NULL, 0, NULL) == K3_STATUS_INVALID_ARGUMENT, "m=17");
    CHECK(k3_kda_proj_run(p, 1, NULL, wp, wfb, qkvg, fab, g1, NULL, 0, NULL) == K3_STATUS_INVALID_ARGUMENT, "NULL");
    CHECK(k3_kda_proj_run(p, 1, (const char *)x + 2, wp, wfb, qkvg, fab, g1, NULL, 0, NULL) ==
              K3_STATUS_INVALID_ARGUMENT, "misaligned x");
    CHECK(strstr(k3_ctx_last_error(ctx), "aligned") != NULL, "message names alignment: %s", k3_ctx_last_error(ctx));
    CHECK(k3_kda_proj_run(NULL, 1, x, wp, wfb, qkvg, fab, g1, NULL, 0, NULL) == K3_STATUS_INVALID_ARGUMENT, "NULL plan");
    k3_kda_proj_plan_destroy(p);
    free(x), free(wp), free(wfb), free(qkvg), free(fab), free(g1), free(rq), free(rf), free(rg);
}

int main(void) {
    const uint64_t seed = 0x6b6461u;
    printf("seed %llu\n", (unsigned long long)seed);
    k3_ctx *ctx = k3t_cpu_ctx();
    CHECK(ctx != NULL, "cpu context");
    if (!ctx) return k3t_finish();
    test_validation(ctx);
    test_fused_layout();
    test_tuning_data();
    test_cpu_results(ctx, seed);
    k3_ctx_destroy(ctx);
    return k3t_finish();
}
