/* The latent block split over tensor-parallel ranks (k3_latent_moe_run_stage): every rank's shard is cut here from
 * one full block, each rank runs PRE_REDUCE, the test sums the fp32 partials (the all-reduce an engine does) and
 * runs POST_REDUCE. Checked against the independent fp64 evaluation of the unsharded block (tests/ref_moe.h):
 * routing identical on every rank, output within the block's rel-L2 budget; on one rank PRE then POST gives
 * k3_latent_moe_run's bits. Also every misuse the stage API and the parallel descriptor refuse. */
#include <string.h>

#include "moe_data.h"
#include "latent_data.h"
#include "latent_shard.h"
#include "ref_moe.h"
#include "test_util.h"

#define SEED 0x54507261ull /* "TPra" */
#define TOL 1e-3
#define MAX_RANKS 8
#define TOL_UNSHARDED 1e-5 /* against the unsharded CPU block: only the fp32 summation order differs */

static k3_ctx *g_ctx;

/* A K3-shaped block scaled down: E experts top_k, shared experts (Is 64) or none. */
static k3_latent_moe_desc make_desc_ek(k3_weight_format f, int32_t e, int32_t top_k, int shared) {
    k3_latent_moe_desc d;
    k3_latent_moe_desc_init(&d);
    d.hidden = d.router.hidden = 128;
    d.router.num_experts = d.experts.num_experts = e;
    d.router.top_k = d.experts.top_k = top_k;
    d.experts.hidden = 64;
    d.experts.inter = 128;
    d.experts.format = f;
    d.shared_inter = shared ? 64 : 0;
    d.max_tokens = 8;
    return d;
}

static k3_latent_moe_desc make_desc(k3_weight_format f) {
    k3_latent_moe_desc d;
    k3_latent_moe_desc_init(&d);
    d.hidden = d.router.hidden = 128;
    d.router.num_experts = d.experts.num_experts = 16;
    d.router.top_k = d.experts.top_k = 4;
    d.experts.hidden = 64;
    d.experts.inter = 128;
    d.experts.format = f;
    d.shared_inter = 64;
    d.max_tokens = 8;
    return d;
}

/* One rank (size 1): PRE then POST equals k3_latent_moe_run bit for bit, with and without a residual. */
static void test_one_rank(const char *name, const k3_latent_moe_desc *d, k3t_rng *r) {
    lat_data b;
    ld_make(&b, d, r, 1);
    const int64_t m = 5, h = d->hidden;
    uint16_t *x = md_bf16_normal(r, m * h, 1.0), *res = md_bf16_normal(r, m * h, 1.0);
    uint16_t *y1 = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(m * h));
    uint16_t *y2 = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(m * h));
    k3_latent_moe_plan *p = NULL;
    k3_status st = k3_latent_moe_plan_create(g_ctx, d, &p);
    CHECK(st == K3_STATUS_SUCCESS, "%s: plan: %s", name, k3_ctx_last_error(g_ctx));
    size_t wsb = 0, count = 0;
    void *ws = p ? ld_ws(p, &wsb) : NULL;
    if (p && k3_latent_moe_partial_count(p, m, &count) == K3_STATUS_SUCCESS) {
        CHECK(count == (size_t)(m * (d->experts.hidden + h)), "%s: partial count %zu = m (L + H)", name, count);
        float *part = (float *)malloc(sizeof(float) * count);
        for (int with_res = 0; with_res < 2; with_res++) {
            const uint16_t *rr = with_res ? res : NULL;
            st = k3_latent_moe_run(p, m, x, &b.w, rr, y1, NULL, NULL, ws, wsb, NULL);
            CHECK(st == K3_STATUS_SUCCESS, "%s: run: %s", name, k3_ctx_last_error(g_ctx));
            memset(y2, 0xff, sizeof(uint16_t) * (size_t)(m * h));
            st = k3_latent_moe_run_stage(p, K3_LATENT_PRE_REDUCE, m, x, &b.w, NULL, NULL, part, NULL, NULL, ws, wsb,
                                         NULL);
            CHECK(st == K3_STATUS_SUCCESS, "%s: pre: %s", name, k3_ctx_last_error(g_ctx));
            st = k3_latent_moe_run_stage(p, K3_LATENT_POST_REDUCE, m, NULL, &b.w, rr, y2, part, NULL, NULL, ws, wsb,
                                         NULL);
            CHECK(st == K3_STATUS_SUCCESS, "%s: post: %s", name, k3_ctx_last_error(g_ctx));
            CHECK(!memcmp(y1, y2, sizeof(uint16_t) * (size_t)(m * h)), "%s: PRE + POST = run bitwise (residual %d)",
                  name, with_res);
        }
        free(part);
    }
    free(ws);
    k3_latent_moe_plan_destroy(p);
    free(x);
    free(res);
    free(y1);
    free(y2);
    ld_free(&b);
}

static void test_split(const char *name, const k3_latent_moe_desc *d, int32_t size, int64_t m, int ep, k3t_rng *r);

static void test_tp(const char *name, const k3_latent_moe_desc *d, int32_t size, int64_t m, k3t_rng *r) {
    test_split(name, d, size, m, 0, r);
}

static void test_ep(const char *name, const k3_latent_moe_desc *d, int32_t size, int64_t m, k3t_rng *r) {
    test_split(name, d, size, m, 1, r);
}

/* size ranks (TP, or EP with ep) from one full block, against the fp64 reference of the unsharded block. */
static void test_split(const char *name, const k3_latent_moe_desc *d, int32_t size, int64_t m, int ep, k3t_rng *r) {
    lat_data b;
    ld_make(&b, d, r, 1);
    const int64_t h = d->hidden, k = d->experts.top_k;
    uint16_t *x = md_bf16_normal(r, m * h, 1.0), *res = md_bf16_normal(r, m * h, 1.0);
    uint16_t *y = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(m * h));
    double *ref = (double *)malloc(sizeof(double) * (size_t)(m * h)), *got = (double *)malloc(sizeof(double) * (size_t)(m * h));
    int32_t *rids = (int32_t *)malloc(sizeof(int32_t) * (size_t)(m * k)), *ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)(m * k));
    double *rw = (double *)malloc(sizeof(double) * (size_t)(m * k));
    float *wts = (float *)malloc(sizeof(float) * (size_t)(m * k));
    ref_latent(d, &b.w, m, x, res, ref, rids, rw);
    /* the unsharded block on the same backend: the sharded result differs from it only by fp32 sum order */
    uint16_t *yu = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(m * h));
    int have_unsharded = 0;
    {
        k3_latent_moe_plan *pu = NULL;
        size_t wub = 0;
        if (k3_latent_moe_plan_create(g_ctx, d, &pu) == K3_STATUS_SUCCESS) {
            void *wsu = ld_ws(pu, &wub);
            have_unsharded = k3_latent_moe_run(pu, m, x, &b.w, res, yu, NULL, NULL, wsu, wub, NULL) ==
                             K3_STATUS_SUCCESS;
            free(wsu);
        }
        k3_latent_moe_plan_destroy(pu);
        CHECK(have_unsharded, "%s: the unsharded block runs: %s", name, k3_ctx_last_error(g_ctx));
    }

    k3t_tp_shard sh[MAX_RANKS];
    k3_latent_moe_weights sw[MAX_RANKS];
    k3_latent_moe_plan *p[MAX_RANKS] = {0};
    float *part[MAX_RANKS] = {0}, *sum = NULL;
    void *ws[MAX_RANKS] = {0};
    size_t wsb[MAX_RANKS] = {0}, count = 0;
    int ok = 1, ids_same = 1;
    for (int32_t rk = 0; rk < size; rk++) {
        if (ep)
            k3t_ep_cut(&sh[rk], d, &b.w.experts, b.sgu, b.sdown, rk, size);
        else
            k3t_tp_cut(&sh[rk], d, &b.w.experts, b.sgu, b.sdown, rk, size);
        sw[rk] = k3t_tp_weights(&sh[rk], &b.w);
        k3_status st = k3_latent_moe_plan_create(g_ctx, &sh[rk].d, &p[rk]);
        CHECK(st == K3_STATUS_SUCCESS, "%s: rank %d plan: %s", name, (int)rk, k3_ctx_last_error(g_ctx));
        if (st != K3_STATUS_SUCCESS) {
            ok = 0;
            continue;
        }
        ws[rk] = ld_ws(p[rk], &wsb[rk]);
        k3_latent_moe_partial_count(p[rk], m, &count);
        part[rk] = (float *)malloc(sizeof(float) * count);
        st = k3_latent_moe_run_stage(p[rk], K3_LATENT_PRE_REDUCE, m, x, &sw[rk], NULL, NULL, part[rk], ids, wts,
                                     ws[rk], wsb[rk], NULL);
        CHECK(st == K3_STATUS_SUCCESS, "%s: rank %d pre: %s", name, (int)rk, k3_ctx_last_error(g_ctx));
        ok &= st == K3_STATUS_SUCCESS;
        ids_same &= !memcmp(ids, rids, sizeof(int32_t) * (size_t)(m * k));
    }
    if (ok) {
        /* the all-reduce: an elementwise fp32 sum in rank order */
        sum = (float *)calloc(count, sizeof(float));
        for (int32_t rk = 0; rk < size; rk++)
            for (size_t i = 0; i < count; i++) sum[i] += part[rk][i];
        k3_status st = k3_latent_moe_run_stage(p[0], K3_LATENT_POST_REDUCE, m, NULL, &sw[0], res, y, sum, NULL,
                                               NULL, ws[0], wsb[0], NULL);
        CHECK(st == K3_STATUS_SUCCESS, "%s: post: %s", name, k3_ctx_last_error(g_ctx));
        int finite = 1;
        for (int64_t i = 0; i < m * h; i++) {
            got[i] = k3_bf16_to_f32(y[i]);
            finite &= isfinite(got[i]) != 0;
        }
        const double e = ref_rel_l2(got, ref, m * h);
        double eu = INFINITY;
        if (have_unsharded) {
            double *un = (double *)malloc(sizeof(double) * (size_t)(m * h));
            for (int64_t i = 0; i < m * h; i++) un[i] = k3_bf16_to_f32(yu[i]);
            eu = ref_rel_l2(got, un, m * h);
            free(un);
        }
        CHECK(ids_same, "%s: routing ids of every rank identical to the fp64 router", name);
        CHECK(finite, "%s: output finite", name);
        CHECK(e <= TOL, "%s: %s%d block output rel-L2 %.3g > %g", name, ep ? "EP" : "TP", (int)size, e, TOL);
        CHECK(eu <= TOL_UNSHARDED, "%s: %s%d block output vs the unsharded CPU block rel-L2 %.3g > %g", name,
              ep ? "EP" : "TP", (int)size, eu, TOL_UNSHARDED);
        printf("  %-34s %s%d m=%-2lld rel-L2 vs fp64 %.2e, vs the unsharded block %.2e\n", name, ep ? "EP" : "TP",
               (int)size, (long long)m, e, eu);
        /* a rank's plan holds part of the block: the one-call run is refused */
        if (size > 1) {
            st = k3_latent_moe_run(p[0], m, x, &sw[0], NULL, y, NULL, NULL, ws[0], wsb[0], NULL);
            CHECK(st == K3_STATUS_INVALID_ARGUMENT && strstr(k3_ctx_last_error(g_ctx), "PRE_REDUCE"),
                  "%s: k3_latent_moe_run on a rank of %d refused, naming the stages (%s)", name, (int)size,
                  k3_ctx_last_error(g_ctx));
        }
    }
    for (int32_t rk = 0; rk < size; rk++) {
        k3_latent_moe_plan_destroy(p[rk]);
        free(ws[rk]);
        free(part[rk]);
        k3t_tp_free(&sh[rk]);
    }
    free(sum);
    free(x);
    free(res);
    free(y);
    free(yu);
    free(ref);
    free(got);
    free(rids);
    free(ids);
    free(rw);
    free(wts);
    ld_free(&b);
}

static void test_errors(k3t_rng *r) {
    k3_latent_moe_desc d = make_desc(K3_WEIGHT_NVFP4);
    k3_latent_moe_desc e = d;
    e.parallel.layout = K3_PARALLEL_EP;
    e.parallel.size = 2;
    ld_expect_plan(g_ctx, "EP without global_experts", &e, K3_STATUS_INVALID_ARGUMENT, "global_experts");
    e.experts.global_experts = 8; /* not the router's 16 */
    ld_expect_plan(g_ctx, "EP with global_experts != the router's", &e, K3_STATUS_INVALID_ARGUMENT,
                   "router.num_experts");
    e = d;
    e.parallel.rank = 1;
    ld_expect_plan(g_ctx, "NONE with rank 1", &e, K3_STATUS_INVALID_ARGUMENT, "rank 0 of size 1");
    e = d;
    e.parallel.layout = K3_PARALLEL_TP;
    e.parallel.size = 2;
    e.parallel.rank = 2;
    ld_expect_plan(g_ctx, "TP rank >= size", &e, K3_STATUS_INVALID_ARGUMENT, "0 <= rank < size");
    e.parallel.rank = 0;
    e.parallel.size = 0;
    ld_expect_plan(g_ctx, "TP size 0", &e, K3_STATUS_INVALID_ARGUMENT, "1 <= size");
    e = d;
    e.parallel.layout = (k3_parallel_layout)7;
    ld_expect_plan(g_ctx, "unknown layout", &e, K3_STATUS_INVALID_ARGUMENT, "parallel.layout");

    lat_data b;
    ld_make(&b, &d, r, 1);
    k3_latent_moe_plan *p = NULL;
    if (k3_latent_moe_plan_create(g_ctx, &d, &p) != K3_STATUS_SUCCESS) {
        CHECK(0, "errors: plan: %s", k3_ctx_last_error(g_ctx));
        ld_free(&b);
        return;
    }
    size_t wsb = 0, count = 0;
    void *ws = ld_ws(p, &wsb);
    const int64_t m = 2;
    k3_latent_moe_partial_count(p, m, &count);
    float *part = (float *)malloc(sizeof(float) * count);
    uint16_t *x = md_bf16_normal(r, m * d.hidden, 1.0), *y = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(m * d.hidden));
    struct {
        const char *what, *needle;
        k3_status st;
    } c[8];
    int n = 0;
#define TRY(label, call, want, text)                                                                                    \
    do {                                                                                                                \
        c[n].st = (call);                                                                                               \
        CHECK(c[n].st == (want) && strstr(k3_ctx_last_error(g_ctx), (text)), "%s: %s (%s)", (label),                    \
              k3_status_string(c[n].st), k3_ctx_last_error(g_ctx));                                                     \
        n = (n + 1) % 8;                                                                                                \
    } while (0)
    TRY("stage 0", k3_latent_moe_run_stage(p, (k3_latent_stage)0, m, x, &b.w, NULL, y, part, NULL, NULL, ws, wsb, NULL),
        K3_STATUS_INVALID_ARGUMENT, "stage must be");
    TRY("pre without partial",
        k3_latent_moe_run_stage(p, K3_LATENT_PRE_REDUCE, m, x, &b.w, NULL, NULL, NULL, NULL, NULL, ws, wsb, NULL),
        K3_STATUS_INVALID_ARGUMENT, "partial is NULL");
    TRY("pre without x",
        k3_latent_moe_run_stage(p, K3_LATENT_PRE_REDUCE, m, NULL, &b.w, NULL, NULL, part, NULL, NULL, ws, wsb, NULL),
        K3_STATUS_INVALID_ARGUMENT, "x is NULL");
    TRY("post without y",
        k3_latent_moe_run_stage(p, K3_LATENT_POST_REDUCE, m, NULL, &b.w, NULL, NULL, part, NULL, NULL, ws, wsb, NULL),
        K3_STATUS_INVALID_ARGUMENT, "y is NULL");
    TRY("pre with m 0",
        k3_latent_moe_run_stage(p, K3_LATENT_PRE_REDUCE, 0, x, &b.w, NULL, NULL, part, NULL, NULL, ws, wsb, NULL),
        K3_STATUS_INVALID_ARGUMENT, "m must be");
    TRY("post with a small workspace",
        k3_latent_moe_run_stage(p, K3_LATENT_POST_REDUCE, m, NULL, &b.w, NULL, y, part, NULL, NULL, ws, wsb - 1, NULL),
        K3_STATUS_INVALID_ARGUMENT, "ws_bytes");
    TRY("misaligned partial",
        k3_latent_moe_run_stage(p, K3_LATENT_POST_REDUCE, m, NULL, &b.w, NULL, y, (float *)(void *)((char *)part + 2),
                                NULL, NULL, ws, wsb, NULL),
        K3_STATUS_INVALID_ARGUMENT, "partial");
    k3_latent_moe_weights nw = b.w;
    nw.norm = NULL;
    TRY("post without norm",
        k3_latent_moe_run_stage(p, K3_LATENT_POST_REDUCE, m, NULL, &nw, NULL, y, part, NULL, NULL, ws, wsb, NULL),
        K3_STATUS_INVALID_ARGUMENT, "norm is NULL");
    TRY("partial count of m 9", k3_latent_moe_partial_count(p, 9, &count), K3_STATUS_INVALID_ARGUMENT, "m must be");
    TRY("partial count NULL", k3_latent_moe_partial_count(p, 1, NULL), K3_STATUS_INVALID_ARGUMENT, "out_count");
#undef TRY
    free(part);
    free(x);
    free(y);
    free(ws);
    k3_latent_moe_plan_destroy(p);
    ld_free(&b);
}

int main(void) {
    printf("seed 0x%llx\n", (unsigned long long)SEED);
    k3t_rng r = {SEED};
    if (!(g_ctx = k3t_cpu_ctx())) {
        printf("cannot create a CPU context\n");
        return 1;
    }
    k3_latent_moe_desc nv = make_desc(K3_WEIGHT_NVFP4), bf = make_desc(K3_WEIGHT_BF16),
                       mx = make_desc(K3_WEIGHT_MXFP4);
    test_one_rank("nvfp4, one rank", &nv, &r);
    test_one_rank("bf16, one rank", &bf, &r);
    for (int32_t size = 1; size <= MAX_RANKS; size *= 2) {
        test_tp("nvfp4 experts", &nv, size, 3, &r);
        test_tp("bf16 experts", &bf, size, 8, &r);
    }
    test_tp("mxfp4 experts", &mx, 4, 1, &r); /* I / 4 = 32: one MXFP4 block per row of w2 */
    {
        /* E 64 top-8 with and without shared experts, up to TP8 (I / 8 = 16: one NVFP4 block per row of w2) */
        const k3_latent_moe_desc e64 = make_desc_ek(K3_WEIGHT_NVFP4, 64, 8, 1);
        const k3_latent_moe_desc e64n = make_desc_ek(K3_WEIGHT_NVFP4, 64, 8, 0);
        const k3_latent_moe_desc e32m = make_desc_ek(K3_WEIGHT_MXFP4, 32, 6, 0);
        for (int32_t size = 2; size <= MAX_RANKS; size *= 2) {
            test_tp("nvfp4 E64 top-8 shared", &e64, size, 4, &r);
            test_tp("nvfp4 E64 top-8 no shared", &e64n, size, 2, &r);
        }
        test_tp("mxfp4 E32 top-6 no shared", &e32m, 2, 3, &r);
        test_ep("nvfp4 E64 top-8 no shared", &e64n, 4, 3, &r);
        test_ep("mxfp4 E32 top-6 no shared", &e32m, 2, 2, &r);
    }
    for (int32_t size = 2; size <= MAX_RANKS; size *= 2) {
        test_ep("nvfp4 experts", &nv, size, 5, &r);
        test_ep("bf16 experts", &bf, size, 8, &r);
    }
    test_ep("mxfp4 experts", &mx, 4, 4, &r);
    test_errors(&r);
    k3_ctx_destroy(g_ctx);
    return k3t_finish();
}
