/* Routed experts (k3_moe_*) against the independent fp64 evaluation of tests/ref_moe.h: every format, scale
 * layout, mode and activation; top-k 1..16; E up to 896; empty and crowded experts; determinism, batch
 * invariance, SiTU vs SiLU, ids outside [0, E) dropped (expert parallelism), and every validation error. */
#include <string.h>

#include "moe_data.h"
#include "ref_moe.h"
#include "test_util.h"

#define SEED 0x4b334d6f45ull /* "K3MoE" */
#define TOL 1e-3

static k3_ctx *g_ctx;

static k3_moe_desc make_desc(k3_weight_format f, k3_scale_layout lay, int sep, k3_moe_mode mode, k3_act_kind act,
                             int32_t e, int32_t k, int64_t l, int64_t in, int64_t max_tokens) {
    k3_moe_desc d;
    k3_moe_desc_init(&d);
    d.format = f;
    d.scale_layout = lay;
    d.w13_separate_scale_2 = sep;
    d.mode = mode;
    if (act == K3_ACT_SITU)
        k3_act_desc_k3(&d.act);
    else
        k3_act_desc_init(&d.act, act);
    d.num_experts = e;
    d.top_k = k;
    d.hidden = l;
    d.inter = in;
    d.max_tokens = max_tokens;
    return d;
}

/* Runs the library twice (poisoned workspace each time) and checks it against the fp64 reference.
 * Returns the library's fp32 output (malloc'd) for callers that compare further, or NULL. */
static float *run_and_check(const char *name, const k3_moe_desc *d, const moe_data *md, int64_t m, const uint16_t *x,
                            const int32_t *ids, const float *wts) {
    k3_moe_plan *plan = NULL;
    k3_status st = k3_moe_plan_create(g_ctx, d, &plan);
    CHECK(st == K3_STATUS_SUCCESS, "%s: plan: %s", name, k3_ctx_last_error(g_ctx));
    if (st != K3_STATUS_SUCCESS) return NULL;
    size_t wsb = 0;
    CHECK(k3_moe_workspace_size(plan, &wsb) == K3_STATUS_SUCCESS && wsb > 0, "%s: workspace size", name);
    const int64_t l = d->hidden, n = m * l;
    unsigned char *ws = (unsigned char *)malloc(wsb);
    uint16_t *out = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)n),
             *out2 = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)n);
    float *of = (float *)malloc(sizeof(float) * (size_t)n), *of2 = (float *)malloc(sizeof(float) * (size_t)n);
    double *ref = (double *)malloc(sizeof(double) * (size_t)n), *got = (double *)malloc(sizeof(double) * (size_t)n);
    double *refb = (double *)malloc(sizeof(double) * (size_t)n), *gotb = (double *)malloc(sizeof(double) * (size_t)n);
    memset(ws, 0xa5, wsb);
    memset(out, 0xff, sizeof(uint16_t) * (size_t)n);
    memset(of, 0xff, sizeof(float) * (size_t)n);
    st = k3_moe_run(plan, m, x, ids, wts, &md->w, out, of, ws, wsb, NULL);
    CHECK(st == K3_STATUS_SUCCESS, "%s: run: %s", name, k3_ctx_last_error(g_ctx));
    memset(ws, 0x5a, wsb);
    memset(out2, 0, sizeof(uint16_t) * (size_t)n);
    st = k3_moe_run(plan, m, x, ids, wts, &md->w, out2, of2, ws, wsb, NULL);
    CHECK(st == K3_STATUS_SUCCESS, "%s: second run", name);
    CHECK(!memcmp(out, out2, sizeof(uint16_t) * (size_t)n) && !memcmp(of, of2, sizeof(float) * (size_t)n),
          "%s: second run is bitwise identical", name);

    ref_moe(d, &md->w, m, x, ids, wts, ref);
    int finite = 1, rounded = 1;
    for (int64_t i = 0; i < n; i++) {
        got[i] = of[i];
        gotb[i] = k3_bf16_to_f32(out[i]);
        refb[i] = ref_bf16(ref[i]);
        finite &= isfinite(of[i]) && isfinite(gotb[i]);
        rounded &= out[i] == k3_bf16_from_f32(of[i]);
    }
    const double e32 = ref_rel_l2(got, ref, n), e16 = ref_rel_l2(gotb, refb, n);
    double norm = 0;
    for (int64_t i = 0; i < n; i++) norm += ref[i] * ref[i];
    CHECK(finite, "%s: outputs finite (a NaN means padding or a bad scale was read)", name);
    CHECK(rounded, "%s: out == bf16(out_f32)", name);
    CHECK(norm > 0, "%s: the reference is not all zero", name);
    CHECK(e32 <= TOL, "%s: fp32 sum rel-L2 %.3g > %g", name, e32, TOL);
    CHECK(e16 <= TOL, "%s: bf16 output rel-L2 %.3g > %g", name, e16, TOL);
    printf("  %-44s m=%-3lld rel-L2 fp32 %.2e  bf16 %.2e\n", name, (long long)m, e32, e16);
    free(ws);
    free(out);
    free(out2);
    free(of2);
    free(ref);
    free(got);
    free(refb);
    free(gotb);
    k3_moe_plan_destroy(plan);
    return of;
}

/* One case: random weights, inputs and routing. */
static void check_case(const char *name, const k3_moe_desc *d, int64_t m, k3t_rng *r) {
    moe_data md;
    md_make(&md, d, r);
    uint16_t *x = md_bf16_normal(r, m * d->hidden, 1.0);
    int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)(m * d->top_k));
    float *wts = (float *)malloc(sizeof(float) * (size_t)(m * d->top_k));
    md_route(r, m, d->num_experts, d->top_k, ids, wts);
    free(run_and_check(name, d, &md, m, x, ids, wts));
    free(x);
    free(ids);
    free(wts);
    md_free(&md);
}

static void test_formats(k3t_rng *r) {
    const k3_scale_layout L = K3_SCALE_LINEAR, S = K3_SCALE_SWIZZLED;
    const k3_moe_mode A16 = K3_MOE_W4A16, A4 = K3_MOE_W4A4;
    k3_moe_desc d;
    d = make_desc(K3_WEIGHT_BF16, L, 0, A16, K3_ACT_SITU, 8, 2, 48, 40, 16);
    check_case("bf16 situ", &d, 5, r);
    d = make_desc(K3_WEIGHT_NVFP4, L, 0, A16, K3_ACT_SITU, 8, 2, 64, 48, 16);
    check_case("nvfp4 linear shared-scale_2 w4a16", &d, 5, r);
    d = make_desc(K3_WEIGHT_NVFP4, L, 1, A16, K3_ACT_SITU, 8, 2, 64, 48, 16);
    check_case("nvfp4 linear separate-scale_2 w4a16", &d, 5, r);
    d = make_desc(K3_WEIGHT_NVFP4, S, 0, A16, K3_ACT_SITU, 8, 3, 80, 48, 16);
    check_case("nvfp4 swizzled w4a16", &d, 4, r);
    d = make_desc(K3_WEIGHT_NVFP4, S, 1, A16, K3_ACT_SITU, 6, 2, 48, 160, 16);
    check_case("nvfp4 swizzled separate w4a16 (rows > 128)", &d, 3, r);
    d = make_desc(K3_WEIGHT_NVFP4, L, 0, A4, K3_ACT_SITU, 8, 2, 64, 48, 16);
    check_case("nvfp4 linear w4a4", &d, 5, r);
    d = make_desc(K3_WEIGHT_NVFP4, S, 1, A4, K3_ACT_SITU, 8, 2, 64, 48, 16);
    check_case("nvfp4 swizzled separate w4a4", &d, 5, r);
    d = make_desc(K3_WEIGHT_MXFP4, L, 0, A16, K3_ACT_SITU, 8, 2, 64, 64, 16);
    check_case("mxfp4 linear w4a16", &d, 5, r);
    d = make_desc(K3_WEIGHT_MXFP4, S, 0, A16, K3_ACT_SITU, 8, 2, 96, 160, 16);
    check_case("mxfp4 swizzled w4a16", &d, 3, r);
}

static void test_activations(k3t_rng *r) {
    static const struct {
        const char *name;
        k3_act_kind kind;
        float limit, lb;
    } acts[] = {
        {"silu", K3_ACT_SILU, 0.0f, 0.0f},
        {"silu limit 0.5", K3_ACT_SILU, 0.5f, 0.0f},
        {"swigluoai (interleaved)", K3_ACT_SWIGLUOAI, 7.0f, 0.0f},
        {"swigluoai limit 0.3", K3_ACT_SWIGLUOAI, 0.3f, 0.0f},
        {"swigluoai_uninterleave", K3_ACT_SWIGLUOAI_UNINTERLEAVE, 7.0f, 0.0f},
        {"relu2", K3_ACT_RELU2_NO_MUL, 0.0f, 0.0f},
        {"situ 4/25", K3_ACT_SITU, 0.0f, 25.0f},
        {"situ 4, no linear beta", K3_ACT_SITU, 0.0f, 0.0f},
        {"situ 0.2/0.1 (saturating)", K3_ACT_SITU, 0.0f, 0.1f},
    };
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
        for (int fmt = 0; fmt < 2; fmt++) {
            k3_moe_desc d =
                make_desc(fmt ? K3_WEIGHT_NVFP4 : K3_WEIGHT_BF16, K3_SCALE_LINEAR,
                          fmt && acts[i].kind != K3_ACT_RELU2_NO_MUL, K3_MOE_W4A16, acts[i].kind, 8, 2, 32, 32, 16);
            d.act.limit = acts[i].limit;
            if (acts[i].kind == K3_ACT_SITU) {
                d.act.situ_linear_beta = acts[i].lb;
                if (acts[i].lb == 0.1f) d.act.situ_beta = 0.2f;
            }
            char name[96];
            snprintf(name, sizeof name, "%s %s", fmt ? "nvfp4" : "bf16", acts[i].name);
            check_case(name, &d, 4, r);
        }
    }
    /* W4A4 with a non-SiTU activation as well */
    k3_moe_desc d = make_desc(K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A4, K3_ACT_RELU2_NO_MUL, 8, 2, 32, 32, 16);
    check_case("nvfp4 w4a4 relu2", &d, 4, r);
}

static void test_topk_and_experts(k3t_rng *r) {
    for (int32_t k = 1; k <= 16; k++) {
        k3_moe_desc d = make_desc(K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 32, k, 32, 16, 4);
        char name[64];
        snprintf(name, sizeof name, "top-%d of 32", (int)k);
        check_case(name, &d, 3, r);
    }
    k3_moe_desc d = make_desc(K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 896, 16, 32, 16, 16);
    check_case("E=896 top-16 (most experts idle)", &d, 16, r);
    d = make_desc(K3_WEIGHT_MXFP4, K3_SCALE_SWIZZLED, 0, K3_MOE_W4A16, K3_ACT_SITU, 896, 16, 32, 32, 16);
    check_case("E=896 top-16 mxfp4 swizzled", &d, 2, r);
    d = make_desc(K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 1, 1, 32, 16, 16);
    check_case("E=1 top-1", &d, 7, r);
}

/* Every token on one expert (top-1), and one expert shared by every token among other experts (top-4). */
static void test_crowded(k3t_rng *r) {
    const int64_t m = 9;
    for (int variant = 0; variant < 2; variant++) {
        const int32_t k = variant ? 4 : 1;
        k3_moe_desc d = make_desc(K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A16, K3_ACT_SITU, 12, k, 48, 32, 16);
        moe_data md;
        md_make(&md, &d, r);
        uint16_t *x = md_bf16_normal(r, m * d.hidden, 1.0);
        int32_t ids[9 * 4];
        float wts[9 * 4];
        md_route(r, m, d.num_experts, k, ids, wts);
        for (int64_t t = 0; t < m; t++) {
            /* put expert 7 in slot (t % k) and keep the others distinct from it */
            for (int32_t j = 0; j < k; j++)
                if (ids[t * k + j] == 7) ids[t * k + j] = ids[t * k + (t % k)];
            ids[t * k + (t % k)] = 7;
        }
        free(run_and_check(variant ? "expert 7 in every token (top-4)" : "all tokens on expert 7 (top-1)", &d, &md, m,
                           x, ids, wts));
        free(x);
        md_free(&md);
    }
}

/* A token's output row does not depend on the other tokens of the batch. */
static void test_batch_invariance(k3t_rng *r) {
    k3_moe_desc d = make_desc(K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 16, 4, 64, 32, 8);
    const int64_t m = 8, l = d.hidden;
    moe_data md;
    md_make(&md, &d, r);
    uint16_t *x = md_bf16_normal(r, m * l, 1.0);
    int32_t ids[8 * 4];
    float wts[8 * 4];
    md_route(r, m, d.num_experts, d.top_k, ids, wts);
    k3_moe_plan *plan = NULL;
    CHECK(k3_moe_plan_create(g_ctx, &d, &plan) == K3_STATUS_SUCCESS, "invariance plan");
    size_t wsb = 0;
    k3_moe_workspace_size(plan, &wsb);
    void *ws = malloc(wsb);
    uint16_t all[8 * 64], one[64];
    CHECK(k3_moe_run(plan, m, x, ids, wts, &md.w, all, NULL, ws, wsb, NULL) == K3_STATUS_SUCCESS, "batch run");
    int same = 1;
    for (int64_t t = 0; t < m; t++) {
        CHECK(k3_moe_run(plan, 1, x + t * l, ids + t * 4, wts + t * 4, &md.w, one, NULL, ws, wsb, NULL) ==
                  K3_STATUS_SUCCESS,
              "single-token run %lld", (long long)t);
        same &= !memcmp(one, all + t * l, sizeof one);
    }
    CHECK(same, "every row of an 8-token batch equals the row computed alone");
    free(ws);
    free(x);
    md_free(&md);
    k3_moe_plan_destroy(plan);
}

/* SiTU and SiLU experts on the same data give measurably different outputs (GEMM1 outputs of a few units). */
static void test_situ_vs_silu(k3t_rng *r) {
    k3_moe_desc ds = make_desc(K3_WEIGHT_BF16, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 8, 2, 64, 64, 16);
    k3_moe_desc dl = make_desc(K3_WEIGHT_BF16, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SILU, 8, 2, 64, 64, 16);
    const int64_t m = 6, l = ds.hidden;
    moe_data md;
    md_make(&md, &ds, r);
    uint16_t *x = md_bf16_normal(r, m * l, 5.0); /* |g| ~ 5: beyond SiTU's beta = 4, where it saturates */
    int32_t ids[6 * 2];
    float wts[6 * 2];
    md_route(r, m, ds.num_experts, ds.top_k, ids, wts);
    float *a = run_and_check("situ on large activations", &ds, &md, m, x, ids, wts);
    float *b = run_and_check("silu on the same data", &dl, &md, m, x, ids, wts);
    if (a && b) {
        double num = 0, den = 0;
        for (int64_t i = 0; i < m * l; i++) {
            num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
            den += (double)b[i] * b[i];
        }
        const double rd = sqrt(num / den);
        printf("  situ vs silu relative difference %.3f\n", rd);
        CHECK(rd > 0.05, "SiTU vs SiLU relative difference %.3f > 0.05", rd);
    }
    free(a);
    free(b);
    free(x);
    md_free(&md);
}

#define EXPECT_INVALID(call, needle, ...)                                                                              \
    do {                                                                                                               \
        k3_status st_ = (call);                                                                                        \
        const char *msg_ = k3_ctx_last_error(g_ctx);                                                                   \
        CHECK(st_ == K3_STATUS_INVALID_ARGUMENT && strstr(msg_, needle) != NULL, __VA_ARGS__);                         \
        if (st_ != K3_STATUS_INVALID_ARGUMENT || !strstr(msg_, needle))                                                \
            fprintf(stderr, "   status %s, message '%s', wanted '%s'\n", k3_status_string(st_), msg_, needle);         \
    } while (0)

static void test_plan_errors(void) {
    k3_moe_plan *p = (k3_moe_plan *)(uintptr_t)1;
    k3_moe_desc d;
    k3_moe_desc_init(&d);
    CHECK(k3_moe_plan_create(NULL, &d, &p) == K3_STATUS_INVALID_ARGUMENT, "NULL ctx");
    EXPECT_INVALID(k3_moe_plan_create(g_ctx, &d, NULL), "out is NULL", "NULL out");
    EXPECT_INVALID(k3_moe_plan_create(g_ctx, NULL, &p), "descriptor is NULL", "NULL desc");
    CHECK(p == NULL, "out cleared on failure");
#define BAD(field_stmt, needle, what)                                                                                  \
    do {                                                                                                               \
        k3_moe_desc_init(&d);                                                                                          \
        field_stmt;                                                                                                    \
        p = NULL;                                                                                                      \
        EXPECT_INVALID(k3_moe_plan_create(g_ctx, &d, &p), needle, what);                                               \
        k3_moe_plan_destroy(p);                                                                                        \
    } while (0)
    BAD(d.num_experts = 0, "num_experts", "E = 0");
    BAD(d.num_experts = -3, "num_experts", "E < 0");
    BAD(d.top_k = 0, "top_k", "top_k = 0");
    BAD(d.top_k = 33, "top_k", "top_k = 33");
    BAD((d.num_experts = 4, d.top_k = 5), "top_k", "top_k > E");
    BAD(d.hidden = 0, "hidden", "L = 0");
    BAD(d.inter = -16, "inter", "I < 0");
    BAD(d.hidden = 3590, "multiple of the NVFP4 block size 16", "L %% 16 (NVFP4)");
    BAD(d.inter = 40, "multiple of the NVFP4 block size 16", "I %% 16 (NVFP4)");
    BAD((d.format = K3_WEIGHT_MXFP4, d.inter = 48), "multiple of the MXFP4 block size 32", "I %% 32 (MXFP4)");
    BAD((d.format = K3_WEIGHT_MXFP4, d.hidden = 3600), "multiple of the MXFP4 block size 32", "L %% 32 (MXFP4)");
    BAD(d.format = (k3_weight_format)7, "format", "unknown format");
    BAD(d.scale_layout = (k3_scale_layout)5, "scale_layout", "unknown layout");
    BAD(d.mode = (k3_moe_mode)9, "mode", "unknown mode");
    BAD((d.format = K3_WEIGHT_MXFP4, d.mode = K3_MOE_W4A4), "W4A4 needs NVFP4", "W4A4 with MXFP4");
    BAD((d.format = K3_WEIGHT_BF16, d.mode = K3_MOE_W4A4), "W4A4 needs NVFP4", "W4A4 with BF16");
    BAD(d.act.situ_beta = 0.0f, "SITU activation requires activation_situ_beta", "SITU without beta");
    BAD(d.act.kind = (k3_act_kind)42, "activation kind", "unknown activation");
    BAD((d.format = K3_WEIGHT_MXFP4, d.w13_separate_scale_2 = 1), "needs NVFP4", "separate scale_2 with MXFP4");
    BAD((k3_act_desc_init(&d.act, K3_ACT_RELU2_NO_MUL), d.w13_separate_scale_2 = 1), "gated", "separate + relu2");
    BAD(d.w13_separate_scale_2 = 2, "w13_separate_scale_2", "separate = 2");
    BAD(d.max_tokens = 0, "max_tokens", "max_tokens = 0");
    BAD(d.max_tokens = 1 << 20, "max_tokens", "max_tokens huge");
#undef BAD
    /* BF16 experts have no block: any positive L and I plan */
    k3_moe_desc_init(&d);
    d.format = K3_WEIGHT_BF16;
    d.hidden = 33;
    d.inter = 7;
    p = NULL;
    CHECK(k3_moe_plan_create(g_ctx, &d, &p) == K3_STATUS_SUCCESS, "BF16 odd sizes plan: %s", k3_ctx_last_error(g_ctx));
    k3_moe_plan_destroy(p);
    CHECK(k3_moe_workspace_size(NULL, NULL) == K3_STATUS_INVALID_ARGUMENT, "workspace size of NULL plan");
    k3_moe_plan_destroy(NULL);
}

/* Expert parallelism: id -1 ("not on this rank") and any other id outside [0, E) drop their slot. The fp64
 * reference drops them too (ref_moe), and a token whose slots are all dropped must come out +0 exactly. */
static void test_dropped_ids(k3t_rng *r) {
    static const struct {
        k3_weight_format f;
        k3_moe_mode mode;
        int32_t k;
        const char *name;
    } cases[] = {{K3_WEIGHT_NVFP4, K3_MOE_W4A16, 4, "dropped ids nvfp4 w4a16 top-4"},
                 {K3_WEIGHT_NVFP4, K3_MOE_W4A4, 4, "dropped ids nvfp4 w4a4 top-4"},
                 {K3_WEIGHT_MXFP4, K3_MOE_W4A16, 3, "dropped ids mxfp4 top-3"},
                 {K3_WEIGHT_BF16, K3_MOE_W4A16, 1, "dropped ids bf16 top-1"}};
    enum { TM = 6, TE = 8 };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int32_t k = cases[c].k;
        k3_moe_desc d = make_desc(cases[c].f, K3_SCALE_LINEAR, 0, cases[c].mode, K3_ACT_SITU, TE, k, 64, 32, TM);
        moe_data md;
        md_make(&md, &d, r);
        uint16_t *x = md_bf16_normal(r, TM * 64, 1.0);
        int32_t ids[TM * 4];
        float wts[TM * 4];
        md_route(r, TM, TE, k, ids, wts);
        /* token 0: -1 in its last slot; 1: E; 2: every slot -1; 3: INT32_MIN; 4: INT32_MAX; 5: untouched */
        ids[0 * k + (k - 1)] = -1;
        ids[1 * k + 0] = TE;
        for (int32_t j = 0; j < k; j++) ids[2 * k + j] = -1;
        ids[3 * k + (k > 1 ? 1 : 0)] = INT32_MIN;
        ids[4 * k + (k > 2 ? 2 : 0)] = INT32_MAX;
        float *of = run_and_check(cases[c].name, &d, &md, TM, x, ids, wts);
        int zero_row = of != NULL;
        for (int64_t i = 0; of && i < 64; i++) zero_row &= of[2 * 64 + i] == 0.0f && !signbit(of[2 * 64 + i]);
        CHECK(zero_row, "%s: the token with every slot dropped is +0", cases[c].name);
        free(of);
        free(x);
        md_free(&md);
    }
}

static void test_run_errors(k3t_rng *r) {
    k3_moe_desc d = make_desc(K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A4, K3_ACT_SITU, 8, 3, 32, 16, 4);
    moe_data md;
    md_make(&md, &d, r);
    k3_moe_plan *p = NULL;
    CHECK(k3_moe_plan_create(g_ctx, &d, &p) == K3_STATUS_SUCCESS, "plan for run errors");
    size_t wsb = 0;
    EXPECT_INVALID(k3_moe_workspace_size(p, NULL), "out_bytes", "NULL out_bytes");
    k3_moe_workspace_size(p, &wsb);
    void *ws = malloc(wsb);
    uint16_t *x = md_bf16_normal(r, 4 * 32, 1.0), out[4 * 32];
    int32_t ids[4 * 3];
    float wts[4 * 3];
    md_route(r, 4, 8, 3, ids, wts);
    k3_moe_weights w = md.w;
    CHECK(k3_moe_run(p, 2, x, ids, wts, &w, out, NULL, ws, wsb, NULL) == K3_STATUS_SUCCESS, "valid run");
    CHECK(k3_moe_run(NULL, 2, x, ids, wts, &w, out, NULL, ws, wsb, NULL) == K3_STATUS_INVALID_ARGUMENT, "NULL plan");
    EXPECT_INVALID(k3_moe_run(p, 0, x, ids, wts, &w, out, NULL, ws, wsb, NULL), "m must be in [1, max_tokens = 4]",
                   "m=0");
    EXPECT_INVALID(k3_moe_run(p, 5, x, ids, wts, &w, out, NULL, ws, wsb, NULL), "too many tokens for this plan: m = 5", "m > max");
    EXPECT_INVALID(k3_moe_run(p, 2, NULL, ids, wts, &w, out, NULL, ws, wsb, NULL), "x is NULL", "x NULL");
    EXPECT_INVALID(k3_moe_run(p, 2, x, NULL, wts, &w, out, NULL, ws, wsb, NULL), "topk_ids is NULL", "ids NULL");
    EXPECT_INVALID(k3_moe_run(p, 2, x, ids, NULL, &w, out, NULL, ws, wsb, NULL), "topk_weights is NULL", "wts NULL");
    EXPECT_INVALID(k3_moe_run(p, 2, x, ids, wts, NULL, out, NULL, ws, wsb, NULL), "weights is NULL", "w NULL");
    EXPECT_INVALID(k3_moe_run(p, 2, x, ids, wts, &w, NULL, NULL, ws, wsb, NULL), "out is NULL", "out NULL");
    EXPECT_INVALID(k3_moe_run(p, 2, x, ids, wts, &w, out, NULL, NULL, wsb, NULL), "ws is NULL", "ws NULL");
    EXPECT_INVALID(k3_moe_run(p, 2, x, ids, wts, &w, out, NULL, ws, wsb - 1, NULL), "ws_bytes", "ws too small");
#define BADW(field, needle)                                                                                            \
    do {                                                                                                               \
        w = md.w;                                                                                                      \
        w.field = NULL;                                                                                                \
        EXPECT_INVALID(k3_moe_run(p, 2, x, ids, wts, &w, out, NULL, ws, wsb, NULL), needle, #field " NULL");           \
    } while (0)
    BADW(w13, "w13 is NULL");
    BADW(w2, "w2 is NULL");
    BADW(w13_scale, "w13_scale is NULL");
    BADW(w2_scale, "w2_scale is NULL");
    BADW(w13_scale_2, "w13_scale_2 is NULL");
    BADW(w2_scale_2, "w2_scale_2 is NULL");
    BADW(w13_input_scale, "w13_input_scale is NULL (required for W4A4)");
    BADW(w2_input_scale, "w2_input_scale is NULL (required for W4A4)");
#undef BADW
    /* misaligned tensors are refused, naming the pointer (the CPU backend reads them as uint16 / int32 / float) */
    {
        w = md.w;
        const char *xc = (const char *)x, *wc = (const char *)wts;
        EXPECT_INVALID(k3_moe_run(p, 2, xc + 1, ids, wts, &w, out, NULL, ws, wsb, NULL), "x (", "x misaligned");
        EXPECT_INVALID(k3_moe_run(p, 2, x, (const int32_t *)(const void *)(wc + 2), wts, &w, out, NULL, ws, wsb, NULL),
                       "topk_ids (", "ids misaligned");
        EXPECT_INVALID(k3_moe_run(p, 2, x, ids, (const float *)(const void *)(wc + 1), &w, out, NULL, ws, wsb, NULL),
                       "topk_weights (", "wts misaligned");
        EXPECT_INVALID(k3_moe_run(p, 2, x, ids, wts, &w, (char *)out + 1, NULL, ws, wsb, NULL), "out (",
                       "out misaligned");
        float *of = malloc(sizeof(float) * 4 * 32 + 8);
        EXPECT_INVALID(k3_moe_run(p, 2, x, ids, wts, &w, out, (float *)(void *)((char *)of + 2), ws, wsb, NULL),
                       "out_f32 (", "out_f32 misaligned");
        CHECK(k3_moe_run(p, 2, x, ids, wts, &w, out, of, ws, wsb, NULL) == K3_STATUS_SUCCESS, "aligned out_f32 runs");
        free(of);
        const char *s2 = (const char *)md.w.w13_scale_2;
        w = md.w;
        w.w13_scale_2 = (const float *)(const void *)(s2 + 1);
        EXPECT_INVALID(k3_moe_run(p, 2, x, ids, wts, &w, out, NULL, ws, wsb, NULL),
                       "weights w13_scale_2 (", "w13_scale_2 misaligned");
        w = md.w;
        w.w2_input_scale = (const float *)(const void *)((const char *)md.w.w2_input_scale + 2);
        EXPECT_INVALID(k3_moe_run(p, 2, x, ids, wts, &w, out, NULL, ws, wsb, NULL),
                       "weights w2_input_scale (", "w2_input_scale misaligned");
        w = md.w;
        /* an unaligned workspace is fine (the plan aligns inside it) */
        unsigned char *raw = malloc(wsb + 1);
        CHECK(raw && k3_moe_run(p, 2, x, ids, wts, &w, out, NULL, raw + 1, wsb, NULL) == K3_STATUS_SUCCESS,
              "unaligned workspace runs: %s", k3_ctx_last_error(g_ctx));
        free(raw);
    }
    /* BF16 experts are read as uint16 */
    {
        k3_moe_desc db = make_desc(K3_WEIGHT_BF16, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 8, 3, 32, 16, 4);
        moe_data mb;
        md_make(&mb, &db, r);
        k3_moe_plan *pb = NULL;
        CHECK(k3_moe_plan_create(g_ctx, &db, &pb) == K3_STATUS_SUCCESS, "bf16 plan");
        size_t wsbb = 0;
        k3_moe_workspace_size(pb, &wsbb);
        void *wsb2 = malloc(wsbb);
        k3_moe_weights wb = mb.w;
        wb.w13 = (const char *)mb.w.w13 + 1;
        EXPECT_INVALID(k3_moe_run(pb, 2, x, ids, wts, &wb, out, NULL, wsb2, wsbb, NULL), "weights w13 (",
                       "bf16 w13 misaligned");
        wb = mb.w;
        wb.w2 = (const char *)mb.w.w2 + 1;
        EXPECT_INVALID(k3_moe_run(pb, 2, x, ids, wts, &wb, out, NULL, wsb2, wsbb, NULL), "weights w2 (",
                       "bf16 w2 misaligned");
        free(wsb2);
        md_free(&mb);
        k3_moe_plan_destroy(pb);
    }
    /* ids are not checked (outside [0, E) means "not on this rank": test_dropped_ids); the last error of the
     * failed calls above is cleared by a good run */
    w = md.w;
    CHECK(k3_moe_run(p, 2, x, ids, wts, &w, out, NULL, ws, wsb, NULL) == K3_STATUS_SUCCESS, "valid run after errors");
    CHECK(!strcmp(k3_ctx_last_error(g_ctx), ""), "success clears the last error");
    free(ws);
    free(x);
    md_free(&md);
    k3_moe_plan_destroy(p);
}

static void test_defaults(void) {
    k3_moe_desc d;
    k3_moe_desc_init(&d);
    CHECK(d.num_experts == 896 && d.top_k == 16 && d.hidden == 3584 && d.inter == 384 && d.format == K3_WEIGHT_NVFP4 &&
              d.scale_layout == K3_SCALE_LINEAR && d.mode == K3_MOE_W4A16 && !d.w13_separate_scale_2 &&
              d.max_tokens == 16,
          "K3 TP8 defaults");
    CHECK(d.act.kind == K3_ACT_SITU && d.act.situ_beta == 4.0f && d.act.situ_linear_beta == 25.0f, "SiTU 4/25");
    k3_moe_plan *p = NULL;
    CHECK(k3_moe_plan_create(g_ctx, &d, &p) == K3_STATUS_SUCCESS, "the K3 defaults plan");
    size_t wsb = 0;
    k3_moe_workspace_size(p, &wsb);
    /* the scratch is per call, never the weights: a few MB at most for 16 tokens */
    CHECK(wsb > 0 && wsb < (size_t)16 << 20, "K3 workspace %zu bytes", wsb);
    printf("  K3 TP8 experts: workspace %zu bytes for 16 tokens\n", wsb);
    k3_moe_plan_destroy(p);
}

int main(void) {
    printf("seed 0x%llx\n", (unsigned long long)SEED);
    k3t_rng r = {SEED};
    if (!(g_ctx = k3t_cpu_ctx())) {
        printf("cannot create a CPU context\n");
        return 1;
    }
    test_defaults();
    test_formats(&r);
    test_activations(&r);
    test_topk_and_experts(&r);
    test_crowded(&r);
    test_batch_invariance(&r);
    test_situ_vs_silu(&r);
    test_plan_errors();
    test_run_errors(&r);
    test_dropped_ids(&r);
    k3_ctx_destroy(g_ctx);
    return k3t_finish();
}
