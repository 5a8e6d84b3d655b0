/* The latent-MoE block (k3_latent_moe_*) against the independent fp64 evaluation of tests/ref_moe.h: routing
 * ids identical, routing weights within 1e-6, the block output within rel-L2 1e-3; several formats, routers,
 * activations, with and without shared experts and residual; determinism; every validation error. */
#include <string.h>

#include "latent_data.h"
#include "plan/latent_tuning.h"
#include "moe_data.h"
#include "ref_moe.h"
#include "test_util.h"

#define SEED 0x4c6174656e74ull /* "Latent" */
#define TOL 1e-3

static k3_ctx *g_ctx;

static k3_latent_moe_desc make_desc(int32_t e, int32_t k, int64_t h, int64_t l, int64_t in, int64_t is,
                                    k3_weight_format f) {
    k3_latent_moe_desc d;
    k3_latent_moe_desc_init(&d);
    d.hidden = h;
    d.router.hidden = h;
    d.router.num_experts = d.experts.num_experts = e;
    d.router.top_k = d.experts.top_k = k;
    d.experts.hidden = l;
    d.experts.inter = in;
    d.experts.format = f;
    d.shared_inter = is;
    return d;
}

static void check_block(const char *name, const k3_latent_moe_desc *d, int64_t m, k3t_rng *r, int with_bias,
                        int with_residual) {
    lat_data ld;
    ld_make(&ld, d, r, with_bias);
    const int64_t h = d->hidden, k = d->experts.top_k, n = m * h;
    uint16_t *x = md_bf16_normal(r, n, 1.0);
    uint16_t *res = with_residual ? md_bf16_normal(r, n, 1.0) : NULL;
    k3_latent_moe_plan *plan = NULL;
    k3_status st = k3_latent_moe_plan_create(g_ctx, d, &plan);
    CHECK(st == K3_STATUS_SUCCESS, "%s: plan: %s", name, k3_ctx_last_error(g_ctx));
    if (st != K3_STATUS_SUCCESS) {
        free(x);
        free(res);
        ld_free(&ld);
        return;
    }
    size_t wsb = 0;
    k3_latent_moe_workspace_size(plan, &wsb);
    unsigned char *ws = (unsigned char *)malloc(wsb);
    uint16_t *y = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)n),
             *y2 = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)n);
    int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)(m * k)),
            *rids = (int32_t *)malloc(sizeof(int32_t) * (size_t)(m * k));
    float *wts = (float *)malloc(sizeof(float) * (size_t)(m * k));
    double *rw = (double *)malloc(sizeof(double) * (size_t)(m * k));
    double *ref = (double *)malloc(sizeof(double) * (size_t)n), *got = (double *)malloc(sizeof(double) * (size_t)n);
    memset(ws, 0xa5, wsb);
    memset(y, 0xff, sizeof(uint16_t) * (size_t)n);
    st = k3_latent_moe_run(plan, m, x, &ld.w, res, y, ids, wts, ws, wsb, NULL);
    CHECK(st == K3_STATUS_SUCCESS, "%s: run: %s", name, k3_ctx_last_error(g_ctx));

    /* second run without routing outputs, re-poisoned workspace: bitwise the same */
    memset(ws, 0x5a, wsb);
    st = k3_latent_moe_run(plan, m, x, &ld.w, res, y2, NULL, NULL, ws, wsb, NULL);
    CHECK(st == K3_STATUS_SUCCESS && !memcmp(y, y2, sizeof(uint16_t) * (size_t)n), "%s: second run identical", name);
    /* in place: the residual buffer is the output */
    if (res) {
        memcpy(y2, res, sizeof(uint16_t) * (size_t)n);
        st = k3_latent_moe_run(plan, m, x, &ld.w, y2, y2, NULL, NULL, ws, wsb, NULL);
        CHECK(st == K3_STATUS_SUCCESS && !memcmp(y, y2, sizeof(uint16_t) * (size_t)n), "%s: residual aliasing y", name);
    }

    ref_latent(d, &ld.w, m, x, res, ref, rids, rw);
    int ids_same = !memcmp(ids, rids, sizeof(int32_t) * (size_t)(m * k));
    double wmax = 0;
    for (int64_t i = 0; i < m * k; i++) wmax = fmax(wmax, fabs(wts[i] - rw[i]));
    int finite = 1;
    for (int64_t i = 0; i < n; i++) {
        got[i] = k3_bf16_to_f32(y[i]);
        finite &= isfinite(got[i]);
    }
    const double e16 = ref_rel_l2(got, ref, n);
    CHECK(ids_same, "%s: routing ids identical to the fp64 router", name);
    CHECK(wmax <= 1e-6, "%s: routing weights within 1e-6 (max diff %.3g)", name, wmax);
    CHECK(finite, "%s: output finite", name);
    CHECK(e16 <= TOL, "%s: block output rel-L2 %.3g > %g", name, e16, TOL);
    printf("  %-46s m=%-3lld rel-L2 %.2e  max |dw| %.1e\n", name, (long long)m, e16, wmax);

    free(ws);
    free(y);
    free(y2);
    free(ids);
    free(rids);
    free(wts);
    free(rw);
    free(ref);
    free(got);
    free(x);
    free(res);
    ld_free(&ld);
    k3_latent_moe_plan_destroy(plan);
}

static void test_blocks(k3t_rng *r) {
    k3_latent_moe_desc d = make_desc(16, 4, 128, 64, 32, 64, K3_WEIGHT_NVFP4);
    check_block("nvfp4 situ, bias, shared, residual", &d, 5, r, 1, 1);
    check_block("nvfp4 situ, no bias, shared, no residual", &d, 1, r, 0, 0);

    d = make_desc(8, 2, 96, 48, 24, 0, K3_WEIGHT_BF16);
    d.router.kind = K3_ROUTER_SOFTMAX;
    d.router.gate_dtype = K3_DTYPE_F32;
    check_block("bf16 experts, softmax f32 gate, no shared", &d, 3, r, 0, 0);

    d = make_desc(32, 8, 128, 64, 48, 32, K3_WEIGHT_NVFP4);
    d.experts.mode = K3_MOE_W4A4;
    d.experts.scale_layout = K3_SCALE_SWIZZLED;
    d.experts.w13_separate_scale_2 = 1;
    d.router.scaling_factor = 2.5f;
    check_block("nvfp4 w4a4 swizzled separate, scaling 2.5", &d, 16, r, 1, 1);

    d = make_desc(12, 3, 64, 64, 32, 48, K3_WEIGHT_MXFP4);
    k3_act_desc_init(&d.experts.act, K3_ACT_RELU2_NO_MUL);
    k3_act_desc_init(&d.shared_act, K3_ACT_SILU);
    d.rms_eps = 1e-3f;
    check_block("mxfp4 relu2 experts, silu shared, eps 1e-3", &d, 2, r, 1, 0);

    d = make_desc(8, 2, 64, 32, 32, 32, K3_WEIGHT_NVFP4);
    k3_act_desc_init(&d.shared_act, K3_ACT_RELU2_NO_MUL);
    d.max_tokens = 24; /* the block's max_tokens governs the router's and experts' */
    check_block("relu2 shared ([Is, H] gate_up), m = 24 > 16", &d, 24, r, 1, 1);
}

#define EXPECT_INVALID(call, needle, ...)                                                                              \
    do {                                                                                                               \
        k3_status st_ = (call);                                                                                        \
        const char *msg_ = k3_ctx_last_error(g_ctx);                                                                   \
        CHECK(st_ == K3_STATUS_INVALID_ARGUMENT && strstr(msg_, needle) != NULL, __VA_ARGS__);                         \
        if (st_ != K3_STATUS_INVALID_ARGUMENT || !strstr(msg_, needle))                                                \
            fprintf(stderr, "   status %s, message '%s', wanted '%s'\n", k3_status_string(st_), msg_, needle);         \
    } while (0)

static void test_errors(k3t_rng *r) {
    k3_latent_moe_desc d;
    k3_latent_moe_plan *p = NULL;
    k3_latent_moe_desc_init(&d);
    CHECK(k3_latent_moe_plan_create(NULL, &d, &p) == K3_STATUS_INVALID_ARGUMENT, "NULL ctx");
    EXPECT_INVALID(k3_latent_moe_plan_create(g_ctx, &d, NULL), "out is NULL", "NULL out");
    EXPECT_INVALID(k3_latent_moe_plan_create(g_ctx, NULL, &p), "descriptor is NULL", "NULL desc");
#define BAD(stmt, needle)                                                                                              \
    do {                                                                                                               \
        k3_latent_moe_desc_init(&d);                                                                                   \
        stmt;                                                                                                          \
        p = NULL;                                                                                                      \
        EXPECT_INVALID(k3_latent_moe_plan_create(g_ctx, &d, &p), needle, #stmt);                                       \
        CHECK(p == NULL, "no plan on failure");                                                                        \
    } while (0)
    BAD(d.hidden = 0, "hidden must be");
    BAD(d.hidden = 4096, "router.hidden (7168) must equal hidden (4096)");
    BAD(d.router.num_experts = 64, "router.num_experts (64) must equal experts.num_experts (896)");
    BAD(d.experts.top_k = 8, "router.top_k (16) must equal experts.top_k (8)");
    BAD(d.experts.inter = 100, "latent plan: experts: inter (I) must be a multiple");
    BAD(d.experts.act.situ_beta = -1.0f, "latent plan: experts: act: activation_situ_beta must be finite and > 0");
    BAD(d.experts.act.situ_beta = 0.0f, "latent plan: experts: act: SITU activation requires");
    BAD(d.shared_act.situ_beta = 0.0f, "latent plan: shared_act: SITU activation requires");
    BAD(d.shared_inter = -1, "shared_inter");
    BAD(d.rms_eps = 0.0f, "rms_eps");
    BAD(d.rms_eps = NAN, "rms_eps");
    BAD(d.max_tokens = 0, "max_tokens");
    BAD(d.router.gate_dtype = (k3_dtype)7, "latent plan: router gate_dtype");
    BAD(d.router.scaling_factor = -1.0f, "scaling_factor");
#undef BAD
    /* shared_inter = 0 ignores shared_act */
    k3_latent_moe_desc_init(&d);
    d.shared_inter = 0;
    d.shared_act.situ_beta = 0.0f;
    CHECK(k3_latent_moe_plan_create(g_ctx, &d, &p) == K3_STATUS_SUCCESS, "no shared experts: shared_act unused");
    k3_latent_moe_plan_destroy(p);

    d = make_desc(8, 2, 64, 32, 32, 32, K3_WEIGHT_NVFP4);
    d.max_tokens = 4;
    lat_data ld;
    ld_make(&ld, &d, r, 1);
    p = NULL;
    CHECK(k3_latent_moe_plan_create(g_ctx, &d, &p) == K3_STATUS_SUCCESS, "plan for run errors");
    size_t wsb = 0;
    EXPECT_INVALID(k3_latent_moe_workspace_size(p, NULL), "out_bytes", "NULL out_bytes");
    CHECK(k3_latent_moe_workspace_size(NULL, &wsb) == K3_STATUS_INVALID_ARGUMENT, "NULL plan workspace");
    k3_latent_moe_workspace_size(p, &wsb);
    void *ws = malloc(wsb);
    uint16_t *x = md_bf16_normal(r, 4 * 64, 1.0), y[4 * 64];
    k3_latent_moe_weights w = ld.w;
    CHECK(k3_latent_moe_run(p, 2, x, &w, NULL, y, NULL, NULL, ws, wsb, NULL) == K3_STATUS_SUCCESS, "valid run");
    CHECK(k3_latent_moe_run(NULL, 2, x, &w, NULL, y, NULL, NULL, ws, wsb, NULL) == K3_STATUS_INVALID_ARGUMENT,
          "NULL plan");
    EXPECT_INVALID(k3_latent_moe_run(p, 0, x, &w, NULL, y, NULL, NULL, ws, wsb, NULL), "m must be in", "m = 0");
    EXPECT_INVALID(k3_latent_moe_run(p, 5, x, &w, NULL, y, NULL, NULL, ws, wsb, NULL), "too many tokens for this plan: m = 5", "m > max");
    EXPECT_INVALID(k3_latent_moe_run(p, 2, NULL, &w, NULL, y, NULL, NULL, ws, wsb, NULL), "x is NULL", "x NULL");
    EXPECT_INVALID(k3_latent_moe_run(p, 2, x, &w, NULL, NULL, NULL, NULL, ws, wsb, NULL), "y is NULL", "y NULL");
    EXPECT_INVALID(k3_latent_moe_run(p, 2, x, NULL, NULL, y, NULL, NULL, ws, wsb, NULL), "weights is NULL", "w NULL");
    EXPECT_INVALID(k3_latent_moe_run(p, 2, x, &w, NULL, y, NULL, NULL, NULL, wsb, NULL), "ws is NULL", "ws NULL");
    EXPECT_INVALID(k3_latent_moe_run(p, 2, x, &w, NULL, y, NULL, NULL, ws, wsb - 1, NULL), "ws_bytes", "ws small");
#define BADW(stmt, needle)                                                                                             \
    do {                                                                                                               \
        w = ld.w;                                                                                                      \
        stmt;                                                                                                          \
        EXPECT_INVALID(k3_latent_moe_run(p, 2, x, &w, NULL, y, NULL, NULL, ws, wsb, NULL), needle, #stmt);             \
    } while (0)
    BADW(w.gate = NULL, "gate is NULL");
    BADW(w.down_proj = NULL, "down_proj is NULL");
    BADW(w.norm = NULL, "norm is NULL");
    BADW(w.up_proj = NULL, "up_proj is NULL");
    BADW(w.shared_gate_up = NULL, "shared_gate_up is NULL");
    BADW(w.shared_down = NULL, "shared_down is NULL");
    BADW(w.experts.w13 = NULL, "latent run: experts: weights w13 is NULL");
    BADW(w.experts.w2_scale_2 = NULL, "w2_scale_2 is NULL");
    /* misaligned tensors are refused, naming the pointer */
    BADW(w.gate = (const char *)ld.w.gate + 1, "weights gate (");
    BADW(w.bias = (const float *)(const void *)((const char *)ld.w.bias + 2), "weights bias (");
    BADW(w.down_proj = (const char *)ld.w.down_proj + 1, "weights down_proj (");
    BADW(w.norm = (const char *)ld.w.norm + 1, "weights norm (");
    BADW(w.up_proj = (const char *)ld.w.up_proj + 1, "weights up_proj (");
    BADW(w.shared_gate_up = (const char *)ld.w.shared_gate_up + 1, "weights shared_gate_up (");
    BADW(w.shared_down = (const char *)ld.w.shared_down + 1, "weights shared_down (");
    BADW(w.experts.w13_scale_2 = (const float *)(const void *)((const char *)ld.w.experts.w13_scale_2 + 1),
         "latent run: experts: weights w13_scale_2 (");
#undef BADW
    w = ld.w;
    EXPECT_INVALID(k3_latent_moe_run(p, 2, (const char *)x + 1, &w, NULL, y, NULL, NULL, ws, wsb, NULL), "x (",
                   "x misaligned");
    EXPECT_INVALID(k3_latent_moe_run(p, 2, x, &w, NULL, (char *)y + 1, NULL, NULL, ws, wsb, NULL), "y (",
                   "y misaligned");
    EXPECT_INVALID(k3_latent_moe_run(p, 2, x, &w, (const char *)y + 1, y, NULL, NULL, ws, wsb, NULL), "residual (",
                   "residual misaligned");
    {
        int32_t rid[4 * 2 + 1];
        float rwt[4 * 2 + 1];
        int32_t *rid_odd = (int32_t *)(void *)((char *)rid + 2);
        EXPECT_INVALID(k3_latent_moe_run(p, 2, x, &w, NULL, y, rid_odd, rwt, ws, wsb, NULL), "topk_ids (",
                       "topk_ids misaligned");
        EXPECT_INVALID(k3_latent_moe_run(p, 2, x, &w, NULL, y, rid, (float *)(void *)((char *)rwt + 1), ws, wsb, NULL),
                       "topk_weights (", "topk_weights misaligned");
        CHECK(k3_latent_moe_run(p, 2, x, &w, NULL, y, rid, rwt, ws, wsb, NULL) == K3_STATUS_SUCCESS,
              "aligned routing outputs run: %s", k3_ctx_last_error(g_ctx));
    }
    free(ws);
    k3_latent_moe_plan_destroy(p);

    /* a bias with a softmax router is refused, not ignored */
    d.router.kind = K3_ROUTER_SOFTMAX;
    CHECK(k3_latent_moe_plan_create(g_ctx, &d, &p) == K3_STATUS_SUCCESS, "softmax plan");
    k3_latent_moe_workspace_size(p, &wsb);
    ws = malloc(wsb);
    w = ld.w;
    EXPECT_INVALID(k3_latent_moe_run(p, 2, x, &w, NULL, y, NULL, NULL, ws, wsb, NULL), "bias", "bias with softmax");
    w.bias = NULL;
    CHECK(k3_latent_moe_run(p, 2, x, &w, NULL, y, NULL, NULL, ws, wsb, NULL) == K3_STATUS_SUCCESS, "softmax run");
    free(ws);
    free(x);
    ld_free(&ld);
    k3_latent_moe_plan_destroy(p);
}

static void test_defaults(void) {
    k3_latent_moe_desc d;
    k3_latent_moe_desc_init(&d);
    CHECK(d.hidden == 7168 && d.router.hidden == 7168 && d.router.num_experts == 896 && d.router.top_k == 16 &&
              d.experts.num_experts == 896 && d.experts.hidden == 3584 && d.experts.inter == 384 &&
              d.shared_inter == 768 && d.rms_eps == 1e-5f && d.max_tokens == 16,
          "K3 TP8 block defaults");
    CHECK(d.shared_act.kind == K3_ACT_SITU && d.shared_act.situ_beta == 4.0f && d.shared_act.situ_linear_beta == 25.0f,
          "shared SiTU 4/25");
    k3_latent_moe_plan *p = NULL;
    CHECK(k3_latent_moe_plan_create(g_ctx, &d, &p) == K3_STATUS_SUCCESS, "the K3 block plans: %s",
          k3_ctx_last_error(g_ctx));
    size_t wsb = 0;
    k3_latent_moe_workspace_size(p, &wsb);
    CHECK(wsb > 0 && wsb < (size_t)16 << 20, "K3 block workspace %zu bytes", wsb);
    printf("  K3 TP8 block: workspace %zu bytes for 16 tokens\n", wsb);
    k3_latent_schedule sch = K3_LATENT_SCHEDULE_AUTO;
    CHECK(d.schedule == K3_LATENT_SCHEDULE_AUTO && k3_latent_moe_plan_schedule(p, &sch) == K3_STATUS_SUCCESS &&
              sch == K3_LATENT_SCHEDULE_SERIAL,
          "schedule AUTO by default; the CPU plan runs SERIAL (got %d)", (int)sch);
    EXPECT_INVALID(k3_latent_moe_plan_schedule(p, NULL), "out is NULL", "schedule NULL out");
    CHECK(k3_latent_moe_plan_schedule(NULL, &sch) == K3_STATUS_INVALID_ARGUMENT, "schedule NULL plan");
    sch = K3_LATENT_SCHEDULE_AUTO;
    CHECK(k3_latent_moe_plan_schedule_at(p, 1, &sch) == K3_STATUS_SUCCESS && sch == K3_LATENT_SCHEDULE_SERIAL,
          "schedule at m 1 on the CPU: SERIAL (got %d)", (int)sch);
    EXPECT_INVALID(k3_latent_moe_plan_schedule_at(p, 0, &sch), "m must be in", "schedule at m 0");
    EXPECT_INVALID(k3_latent_moe_plan_schedule_at(p, d.max_tokens + 1, &sch), "m must be in",
                   "schedule past max_tokens");
    k3_latent_moe_plan_destroy(p);
    /* a forced schedule plans on the CPU too (one order there) */
    for (int s = K3_LATENT_SCHEDULE_SHARED_BESIDE; s <= K3_LATENT_SCHEDULE_LAST; s++) {
        d.schedule = (k3_latent_schedule)s;
        p = NULL;
        CHECK(k3_latent_moe_plan_create(g_ctx, &d, &p) == K3_STATUS_SUCCESS, "forced schedule %d plans: %s", s,
              k3_ctx_last_error(g_ctx));
        k3_latent_moe_plan_destroy(p);
    }
    d.schedule = (k3_latent_schedule)6;
    p = NULL;
    EXPECT_INVALID(k3_latent_moe_plan_create(g_ctx, &d, &p), "schedule must be", "schedule 6 refused");
    CHECK(p == NULL, "no plan for a bad schedule");
}

/* The per-architecture data: every table gives a schedule the CUDA block runs (never AUTO) and 0/1 triggers; an
 * architecture without measurements the documented defaults. */
static void test_tuning(void) {
    const k3_table_id tables[] = {K3_TABLE_NONE, K3_TABLE_SM90, K3_TABLE_SM100, K3_TABLE_SM103};
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        k3_latent_tuning t;
        memset(&t, 0xA5, sizeof t);
        k3_latent_tuning_for_table(tables[i], &t);
        int bad = t.norm_trigger[0] != 0, bad_m = 0;
        for (int m = 1; m <= K3_LATENT_TUNING_MAX_M; m++) {
            bad |= t.norm_trigger[m] > 1;
            if (t.schedule[m] < K3_LATENT_SCHEDULE_SHARED_BESIDE || t.schedule[m] > K3_LATENT_SCHEDULE_LAST)
                bad_m = m;
        }
        CHECK(!bad, "table %s: triggers are 0 or 1 (index 0 unused)", k3_table_name(tables[i]));
        CHECK(bad_m == 0, "table %s: a schedule for every m (m %d: %d)", k3_table_name(tables[i]), bad_m,
              bad_m ? (int)t.schedule[bad_m] : 0);
    }
    k3_latent_tuning t;
    k3_latent_tuning_for_table(K3_TABLE_NONE, &t);
    int any = 0;
    for (int m = 1; m <= K3_LATENT_TUNING_MAX_M; m++)
        any |= t.norm_trigger[m] || t.schedule[m] != K3_LATENT_SCHEDULE_SHARED_BESIDE;
    CHECK(!any, "no table: SHARED_BESIDE and no early up projection at every m");
}

int main(void) {
    printf("seed 0x%llx\n", (unsigned long long)SEED);
    k3t_rng r = {SEED};
    if (!(g_ctx = k3t_cpu_ctx())) {
        printf("cannot create a CPU context\n");
        return 1;
    }
    test_defaults();
    test_tuning();
    test_blocks(&r);
    test_errors(&r);
    k3_ctx_destroy(g_ctx);
    return k3t_finish();
}
