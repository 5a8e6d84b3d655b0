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
    bad.run_n_shape = (k3_kda_run_n)6; /* one past K3_KDA_RUN_N_FUSED */
    expect_plan_error(ctx, &bad, "run_n shape 6", "run_n_shape");
    bad.run_n_shape = (k3_kda_run_n)-1;
    expect_plan_error(ctx, &bad, "run_n shape -1", "run_n_shape");
    bad.run_n_shape = K3_KDA_RUN_N_NARROW; /* 128 threads x 8-element vectors must tile hidden */
    bad.hidden = 1536;
    expect_plan_error(ctx, &bad, "narrow with hidden 1536", "hidden % 1024");
    bad = d;
    bad.qkvg_kernel = (k3_kda_qkvg)3; /* one past K3_KDA_QKVG_CUBLASLT */
    expect_plan_error(ctx, &bad, "qkvg_kernel 3", "qkvg_kernel");
    bad.qkvg_kernel = (k3_kda_qkvg)-1; /* the old "tuned" sentinel */
    expect_plan_error(ctx, &bad, "qkvg_kernel -1", "qkvg_kernel");
    bad = d;
    bad.local_heads = 0;
    expect_plan_error(ctx, &bad, "heads 0", "local_heads");
    /* 4 * local_heads * head_dim overflowed int64 (undefined) and wrapped into an accepted plan */
    bad = d;
    bad.local_heads = (INT64_C(1) << 59) + 192;
    bad.head_dim = 8;
    expect_plan_error(ctx, &bad, "heads 2^59 + 192", "local_heads must be in [1, 4096]");
    bad = d;
    bad.local_heads = 4097;
    expect_plan_error(ctx, &bad, "heads 4097", "local_heads must be in [1, 4096] (got 4097)");
    bad = d;
    bad.head_dim = INT64_C(1) << 60;
    expect_plan_error(ctx, &bad, "head_dim 2^60", "head_dim must be a multiple of 8 in [8, 1024]");
    bad = d;
    bad.head_dim = 0;
    expect_plan_error(ctx, &bad, "head_dim 0", "head_dim must be a multiple of 8");
    bad = d;
    bad.packed_rows = INT64_MAX;
    expect_plan_error(ctx, &bad, "packed_rows INT64_MAX", "packed_rows must be in [1, 16777216]");
    bad = d;
    bad.packed_rows = -6288;
    expect_plan_error(ctx, &bad, "packed_rows negative", "packed_rows must be in [1, 16777216] (got -6288)");
    k3_kda_proj_plan *p = NULL;
    CHECK(k3_kda_proj_plan_create(ctx, NULL, &p) == K3_STATUS_INVALID_ARGUMENT, "NULL desc");
    CHECK(k3_kda_proj_plan_create(ctx, &d, NULL) == K3_STATUS_INVALID_ARGUMENT, "NULL out");

    /* the other TP degrees plan: TP4 24 heads / 12448 rows, TP16 6 heads / 3216 */
    k3_kda_proj_desc tp4 = d, tp16 = d;
    tp4.local_heads = 24;
    tp4.packed_rows = 12448;
    tp16.local_heads = 6;
    tp16.packed_rows = 3216;
    CHECK(k3_kda_proj_plan_create(ctx, &tp4, &p) == K3_STATUS_SUCCESS, "TP4 plans: %s", k3_ctx_last_error(ctx));
    k3_kda_proj_plan_destroy(p);
    CHECK(k3_kda_proj_plan_create(ctx, &tp16, &p) == K3_STATUS_SUCCESS, "TP16 plans: %s", k3_ctx_last_error(ctx));
    /* a NULL out_bytes fails with a message (it used to leave none) */
    CHECK(k3_kda_proj_workspace_size(p, NULL) == K3_STATUS_INVALID_ARGUMENT &&
              strstr(k3_ctx_last_error(ctx), "out_bytes is NULL"),
          "kda workspace size NULL out_bytes: '%s'", k3_ctx_last_error(ctx));
    size_t kws = 1;
    CHECK(k3_kda_proj_workspace_size(p, &kws) == K3_STATUS_SUCCESS && !strcmp(k3_ctx_last_error(ctx), ""),
          "kda workspace size clears the message");
    CHECK(k3_kda_proj_workspace_size(NULL, &kws) == K3_STATUS_INVALID_ARGUMENT, "kda workspace size NULL plan");
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

/* A CPU context whose architecture facts (and so its table) are those of a simulated capability. */
static k3_ctx *sim_ctx(int major, int minor) {
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    opt.backend = K3_BACKEND_CPU;
    opt.sim_major = major;
    opt.sim_minor = minor;
    k3_ctx *ctx = NULL;
    return k3_ctx_create(&opt, &ctx) == K3_STATUS_SUCCESS ? ctx : NULL;
}

/* The choices every architecture made before they became table data, written out by hand: SM90 runs the one
 * launch at every m (two head steps through m 4, one from m 5) and, where it does not fit, the sliced F_AB blocks
 * with the table's QKVG through m 8 and the two-row blocks with cuBLASLt's from m 9, overlapping through 16; every
 * other architecture (and a context with no table) overlaps through 14 with one-row blocks and the table's QKVG. */
typedef struct kda_expect {
    int64_t overlap;
    k3_kda_run_n shape[17], unfused_shape[17];
    k3_kda_qkvg qkvg[17], unfused_qkvg[17];
    int32_t steps[17];
} kda_expect;

static void expect_sm90(kda_expect *e) {
    e->overlap = 16;
    for (int m = 1; m <= 16; m++) {
        e->shape[m] = K3_KDA_RUN_N_FUSED;
        e->qkvg[m] = K3_KDA_QKVG_TABLE;
        e->steps[m] = m <= 4 ? 2 : 1;
        e->unfused_shape[m] = m <= 8 ? K3_KDA_RUN_N_SLICED : K3_KDA_RUN_N_ROWS2;
        e->unfused_qkvg[m] = m <= 8 ? K3_KDA_QKVG_TABLE : K3_KDA_QKVG_CUBLASLT;
    }
}

static void expect_unmeasured(kda_expect *e) {
    e->overlap = 14;
    for (int m = 1; m <= 16; m++) {
        e->shape[m] = e->unfused_shape[m] = K3_KDA_RUN_N_ROWS1;
        e->qkvg[m] = e->unfused_qkvg[m] = K3_KDA_QKVG_TABLE;
        e->steps[m] = 2;
    }
}

static void check_tuning(const char *what, const k3_kda_tuning *t, const kda_expect *e) {
    CHECK(t->overlap_max_tokens == e->overlap, "%s: overlap through %lld, want %lld", what,
          (long long)t->overlap_max_tokens, (long long)e->overlap);
    int bad = 0;
    for (int m = 1; m <= 16; m++)
        if (t->run_n_shape[m] != e->shape[m] || t->qkvg_kernel[m] != e->qkvg[m] ||
            t->fused_head_steps[m] != e->steps[m] || t->unfused_shape[m] != e->unfused_shape[m] ||
            t->unfused_qkvg[m] != e->unfused_qkvg[m]) {
            if (!bad)
                fprintf(stderr, "%s m %d: shape %d qkvg %d steps %d unfused %d %d, want %d %d %d unfused %d %d\n",
                        what, m, (int)t->run_n_shape[m], (int)t->qkvg_kernel[m], (int)t->fused_head_steps[m],
                        (int)t->unfused_shape[m], (int)t->unfused_qkvg[m], (int)e->shape[m], (int)e->qkvg[m],
                        (int)e->steps[m], (int)e->unfused_shape[m], (int)e->unfused_qkvg[m]);
            bad++;
        }
    CHECK(bad == 0, "%s: %d m differ from the hand-written choices", what, bad);
    for (int m = 1; m <= 16; m++) /* an uncompiled head prefetch would make every one-launch run fail */
        CHECK(t->fused_head_steps[m] >= 1 && t->fused_head_steps[m] <= K3_KDA_FUSED_MAX_HEAD_STEPS,
              "%s m %d: head steps %d compiled", what, m, (int)t->fused_head_steps[m]);
}

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fputs(text, f);
    return fclose(f) == 0;
}

/* Each architecture's tuning, read from its embedded table, is the hand-written list above; where the one launch
 * does not fit, the unfused choices replace it; a loaded table's kda rows win, and one without them falls back to
 * the embedded table's. */
static void test_tuning_tables(void) {
    static const struct {
        int major, minor;
        const char *name;
        int sm90;
    } archs[] = {{9, 0, "sm90", 1}, {10, 0, "sm100", 0}, {10, 3, "sm103", 0}, {0, 0, "no table (CPU)", 0}};
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
        k3_ctx *ctx = archs[i].major ? sim_ctx(archs[i].major, archs[i].minor) : k3t_cpu_ctx();
        CHECK(ctx != NULL, "%s context", archs[i].name);
        if (!ctx) continue;
        k3_kda_tuning t;
        memset(&t, 0xa5, sizeof t);
        CHECK(k3_kda_tuning_for_ctx(ctx, &t) == K3_STATUS_SUCCESS, "%s tuning: %s", archs[i].name,
              k3_ctx_last_error(ctx));
        kda_expect e;
        if (archs[i].sm90) expect_sm90(&e);
        else expect_unmeasured(&e);
        check_tuning(archs[i].name, &t, &e);
        /* the choice where the one launch does not fit the device */
        k3_kda_tuning_drop_fused(&t);
        for (int m = 1; m <= 16; m++) {
            CHECK(t.run_n_shape[m] == e.unfused_shape[m] && t.qkvg_kernel[m] == e.unfused_qkvg[m],
                  "%s m %d unfused: shape %d qkvg %d", archs[i].name, m, (int)t.run_n_shape[m],
                  (int)t.qkvg_kernel[m]);
            CHECK(t.run_n_shape[m] != K3_KDA_RUN_N_FUSED, "%s m %d: nothing fused after the drop", archs[i].name, m);
        }
        k3_ctx_destroy(ctx);
    }

    /* loaded tables (a simulated sm90 context, so the key matches) */
    const char *path = "test_kda_proj_tmp_table.txt";
    k3_ctx *ctx = sim_ctx(9, 0);
    CHECK(ctx != NULL, "sm90 context");
    if (!ctx) return;
    k3_kda_tuning t;
    kda_expect e;
    CHECK(write_text(path, "arch sm90\n6144 7168 1-16 cublaslt\n"), "write %s", path);
    CHECK(k3_ctx_load_table(ctx, path, 0) == K3_STATUS_SUCCESS, "load: %s", k3_ctx_last_error(ctx));
    CHECK(k3_kda_tuning_for_ctx(ctx, &t) == K3_STATUS_SUCCESS, "tuning: %s", k3_ctx_last_error(ctx));
    expect_sm90(&e);
    check_tuning("loaded sm90 table without kda rows (the embedded sm90 rows)", &t, &e);
    CHECK(write_text(path, "arch sm90\n"
                           "kda overlap_max_tokens 3\n"
                           "kda 1-2 narrow cublaslt 1\n"
                           "kda 3-16 fused table 2\n"
                           "kda unfused 3-16 rows2 table\n"),
          "write %s", path);
    CHECK(k3_ctx_load_table(ctx, path, 0) == K3_STATUS_SUCCESS, "load: %s", k3_ctx_last_error(ctx));
    CHECK(k3_kda_tuning_for_ctx(ctx, &t) == K3_STATUS_SUCCESS, "tuning: %s", k3_ctx_last_error(ctx));
    e.overlap = 3;
    for (int m = 1; m <= 16; m++) {
        e.shape[m] = m <= 2 ? K3_KDA_RUN_N_NARROW : K3_KDA_RUN_N_FUSED;
        e.qkvg[m] = m <= 2 ? K3_KDA_QKVG_CUBLASLT : K3_KDA_QKVG_TABLE;
        e.steps[m] = m <= 2 ? 1 : 2;
        e.unfused_shape[m] = m <= 2 ? K3_KDA_RUN_N_NARROW : K3_KDA_RUN_N_ROWS2;
        e.unfused_qkvg[m] = m <= 2 ? K3_KDA_QKVG_CUBLASLT : K3_KDA_QKVG_TABLE;
    }
    check_tuning("loaded table with its own kda rows", &t, &e);
    /* a plan is made from it */
    k3_kda_proj_desc d;
    k3_kda_proj_desc_init(&d);
    k3_kda_proj_plan *p = NULL;
    CHECK(k3_kda_proj_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "plan on the loaded table: %s",
          k3_ctx_last_error(ctx));
    k3_kda_proj_plan_destroy(p);
    CHECK(k3_ctx_load_table(ctx, NULL, 0) == K3_STATUS_SUCCESS, "back to the embedded table");
    CHECK(k3_kda_tuning_for_ctx(ctx, &t) == K3_STATUS_SUCCESS, "tuning: %s", k3_ctx_last_error(ctx));
    expect_sm90(&e);
    check_tuning("embedded sm90 again", &t, &e);
    remove(path);
    k3_ctx_destroy(ctx);
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
    test_tuning_tables();
    test_cpu_results(ctx, seed);
    k3_ctx_destroy(ctx);
    return k3t_finish();
}
