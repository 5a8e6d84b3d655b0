/* The latent block with data-parallel attention (parallel.tokens = K3_TOKENS_PER_RANK) on the CPU backend: size TP
 * or EP ranks cut from one full block, each with its own m tokens. The test is the engine of the header's recipe:
 * it gathers the ranks' x in rank order, runs every rank's PRE_REDUCE on all size * m rows, sums the partials in
 * fp32 in rank order, cuts rank r's rows of u and of the shared output into a local partial and runs that rank's
 * POST_REDUCE on m rows. Every rank's y is checked against the unsharded block run on the gathered tokens, against
 * the fp64 evaluation of tests/ref_moe.h, and bit for bit against the replicated-token ranks finishing all the
 * gathered rows (POST is row by row). Also: an EP rank whose experts no token picks, the capacity status, and the
 * descriptor rules of the new field. */
#include <string.h>

#include "moe_data.h"
#include "latent_data.h"
#include "latent_shard.h"
#include "ref_moe.h"
#include "test_util.h"

#define SEED 0x44506174ull /* "DPat" */
#define TOL_REF 1e-3  /* vs the fp64 evaluation: the block's budget, as in test_latent_tp */
#define TOL_FULL 1e-5 /* vs the unsharded block, unless every difference is a BF16 rounding flip (flip_worst) */
#define MAX_RANKS 4
#define M_MAX 3 /* tokens per rank the plans are made for: max_tokens = size * M_MAX */

static k3_ctx *g_ctx;

static k3_latent_moe_desc make_desc(k3_weight_format f, int32_t e, int32_t k, int shared, int32_t size) {
    k3_latent_moe_desc d;
    k3_latent_moe_desc_init(&d);
    d.hidden = d.router.hidden = 128;
    d.router.num_experts = d.experts.num_experts = e;
    d.router.top_k = d.experts.top_k = k;
    d.experts.hidden = 64;
    d.experts.inter = 128;
    d.experts.format = f;
    d.shared_inter = shared ? 64 : 0;
    d.max_tokens = (int64_t)size * M_MAX;
    return d;
}

static double rel_l2_bf16(const uint16_t *a, const uint16_t *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        const double x = k3_bf16_to_f32(a[i]), y = k3_bf16_to_f32(b[i]);
        num += (x - y) * (x - y);
        den += y * y;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The largest |a - b| of m rows of h BF16 values in units of one BF16 ulp (2^-7 relative, the coarse end) of the
 * row's largest |b|; *ndiff counts the values that differ. */
static double flip_worst(const uint16_t *a, const uint16_t *b, int64_t m, int64_t h, int64_t *ndiff) {
    double worst = 0;
    for (int64_t t = 0; t < m; t++) {
        double big = 0;
        for (int64_t c = 0; c < h; c++) big = fmax(big, fabs((double)k3_bf16_to_f32(b[t * h + c])));
        for (int64_t c = 0; c < h; c++) {
            const double dv = fabs((double)k3_bf16_to_f32(a[t * h + c]) - (double)k3_bf16_to_f32(b[t * h + c]));
            if (dv > 0) (*ndiff)++;
            if (dv > 0) worst = fmax(worst, big > 0 ? dv / (big * 0x1p-7) : INFINITY);
        }
    }
    return worst;
}

/* The worst rel-L2 of one case over its ranks (printed at the end). */
static double g_worst_full, g_worst_ref;
static int g_idle_pairs; /* (token owner, expert holder) pairs of EP ranks with no routed slot between them */

typedef struct dp_case {
    const char *name;
    k3_weight_format format;
    int32_t e, k;
    int shared, ep, size;
    int64_t m;      /* tokens per rank */
    int idle_rank; /* EP: bias the experts of this rank out of every token's top-k (-1: none) */
} dp_case;

static void run_case(const dp_case *c, k3t_rng *r) {
    const int32_t size = c->size;
    k3_latent_moe_desc d = make_desc(c->format, c->e, c->k, c->shared, size);
    lat_data b;
    ld_make(&b, &d, r, 1);
    const int64_t h = d.hidden, l = d.experts.hidden, k = d.experts.top_k, m = c->m, mg = size * m;
    const int32_t e = d.router.num_experts;
    if (c->idle_rank >= 0) /* the noaux_tc selection key is score + bias, with score in (0, 1) */
        for (int32_t g = c->idle_rank * e / size; g < (c->idle_rank + 1) * e / size; g++) b.bias[g] = -4.0f;
    /* rank r's own tokens and residual are rows [r m, (r + 1) m) of the gathered ones */
    uint16_t *xg = md_bf16_normal(r, mg * h, 1.0), *resg = md_bf16_normal(r, mg * h, 1.0);
    uint16_t *yfull = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(mg * h));
    uint16_t *yrep = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(mg * h));
    uint16_t *ydp = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(mg * h));
    double *ref = (double *)malloc(sizeof(double) * (size_t)(mg * h));
    double *got = (double *)malloc(sizeof(double) * (size_t)(mg * h));
    int32_t *rids = (int32_t *)malloc(sizeof(int32_t) * (size_t)(mg * k));
    int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)(mg * k));
    double *rw = (double *)malloc(sizeof(double) * (size_t)(mg * k));
    ref_latent(&d, &b.w, mg, xg, resg, ref, rids, rw);

    /* the unsharded block on all the gathered tokens */
    k3_latent_moe_plan *pf = NULL;
    size_t wsf = 0;
    void *wf = NULL;
    int ok = k3_latent_moe_plan_create(g_ctx, &d, &pf) == K3_STATUS_SUCCESS;
    CHECK(ok, "%s: unsharded plan: %s", c->name, k3_ctx_last_error(g_ctx));
    if (ok) {
        wf = ld_ws(pf, &wsf);
        ok = k3_latent_moe_run(pf, mg, xg, &b.w, resg, yfull, NULL, NULL, wf, wsf, NULL) == K3_STATUS_SUCCESS;
        CHECK(ok, "%s: unsharded run: %s", c->name, k3_ctx_last_error(g_ctx));
    }

    k3t_tp_shard sh[MAX_RANKS];
    k3_latent_moe_weights sw[MAX_RANKS];
    k3_latent_moe_plan *p[MAX_RANKS] = {0};
    float *part[MAX_RANKS] = {0}, *sum = NULL, *local = NULL;
    void *ws[MAX_RANKS] = {0};
    size_t wsb[MAX_RANKS] = {0}, count = 0, lcount = 0;
    int ids_same = 1;
    for (int32_t rk = 0; rk < size; rk++) {
        if (c->ep)
            k3t_ep_cut(&sh[rk], &d, &b.w.experts, b.sgu, b.sdown, rk, size);
        else
            k3t_tp_cut(&sh[rk], &d, &b.w.experts, b.sgu, b.sdown, rk, size);
        sh[rk].d.parallel.tokens = K3_TOKENS_PER_RANK;
        sw[rk] = k3t_tp_weights(&sh[rk], &b.w);
    }
    for (int32_t rk = 0; rk < size && ok; rk++) {
        k3_status st = k3_latent_moe_plan_create(g_ctx, &sh[rk].d, &p[rk]);
        CHECK(st == K3_STATUS_SUCCESS, "%s: rank %d plan: %s", c->name, (int)rk, k3_ctx_last_error(g_ctx));
        if (st != K3_STATUS_SUCCESS) {
            ok = 0;
            break;
        }
        ws[rk] = ld_ws(p[rk], &wsb[rk]);
        /* PRE_REDUCE runs on every gathered row: its partial is that of size * m tokens */
        k3_latent_moe_partial_count(p[rk], mg, &count);
        part[rk] = (float *)malloc(sizeof(float) * count);
        st = k3_latent_moe_run_stage(p[rk], K3_LATENT_PRE_REDUCE, mg, xg, &sw[rk], NULL, NULL, part[rk], ids, NULL,
                                     ws[rk], wsb[rk], NULL);
        CHECK(st == K3_STATUS_SUCCESS, "%s: rank %d pre: %s", c->name, (int)rk, k3_ctx_last_error(g_ctx));
        ok &= st == K3_STATUS_SUCCESS;
        ids_same &= !memcmp(ids, rids, sizeof(int32_t) * (size_t)(mg * k));
    }
    if (ok) {
        CHECK(ids_same, "%s: every rank's routing of the gathered tokens equals the fp64 router's", c->name);
        CHECK(count == (size_t)(mg * (l + (c->shared ? h : 0))), "%s: partial count %zu of %lld gathered rows",
              c->name, count, (long long)mg);
        k3_latent_moe_partial_count(p[0], m, &lcount);
        CHECK(lcount == (size_t)(m * (l + (c->shared ? h : 0))), "%s: local partial count %zu of m = %lld", c->name,
              lcount, (long long)m);
        /* the engine's reduction: an elementwise fp32 sum in rank order */
        sum = (float *)calloc(count, sizeof(float));
        local = (float *)malloc(sizeof(float) * (lcount ? lcount : 1));
        for (int32_t rk = 0; rk < size; rk++)
            for (size_t i = 0; i < count; i++) sum[i] += part[rk][i];
        /* replicated tokens: every rank finishes all the gathered rows (rank 0's POST stands for any) */
        k3_status st = k3_latent_moe_run_stage(p[0], K3_LATENT_POST_REDUCE, mg, NULL, &sw[0], resg, yrep, sum, NULL,
                                               NULL, ws[0], wsb[0], NULL);
        CHECK(st == K3_STATUS_SUCCESS, "%s: post of the gathered rows: %s", c->name, k3_ctx_last_error(g_ctx));
        int bitwise = st == K3_STATUS_SUCCESS;
        double worst_full = 0, worst_ref = 0;
        int64_t ndiff = 0;
        for (int32_t rk = 0; rk < size; rk++) {
            /* the reduce-scatter: rank rk's rows of u, then its rows of the shared output */
            memcpy(local, sum + rk * m * l, sizeof(float) * (size_t)(m * l));
            if (c->shared) memcpy(local + m * l, sum + mg * l + rk * m * h, sizeof(float) * (size_t)(m * h));
            uint16_t *yr = ydp + rk * m * h;
            memset(yr, 0xff, sizeof(uint16_t) * (size_t)(m * h));
            st = k3_latent_moe_run_stage(p[rk], K3_LATENT_POST_REDUCE, m, NULL, &sw[rk], resg + rk * m * h, yr, local,
                                         NULL, NULL, ws[rk], wsb[rk], NULL);
            CHECK(st == K3_STATUS_SUCCESS, "%s: rank %d post: %s", c->name, (int)rk, k3_ctx_last_error(g_ctx));
            if (st != K3_STATUS_SUCCESS) {
                bitwise = 0;
                continue;
            }
            bitwise &= !memcmp(yr, yrep + rk * m * h, sizeof(uint16_t) * (size_t)(m * h));
            const double ef = rel_l2_bf16(yr, yfull + rk * m * h, m * h);
            int finite = 1;
            for (int64_t i = 0; i < m * h; i++) {
                got[i] = k3_bf16_to_f32(yr[i]);
                finite &= isfinite(got[i]) != 0;
            }
            const double er = ref_rel_l2(got, ref + rk * m * h, m * h);
            CHECK(finite, "%s: rank %d y finite", c->name, (int)rk);
            CHECK(er <= TOL_REF, "%s: rank %d y rel-L2 vs fp64 %.3g > %g", c->name, (int)rk, er, TOL_REF);
            /* the ranks sum u and the shared output in another fp32 order than the unsharded block: equal but for
             * an occasional BF16 rounding that falls the other way, one ulp of an intermediate (z, s) */
            int64_t nd = 0;
            const double flip = flip_worst(yr, yfull + rk * m * h, m, h, &nd);
            ndiff += nd;
            CHECK(ef <= TOL_FULL || flip <= 1.0,
                  "%s: rank %d y vs the unsharded block: rel-L2 %.3g > %g, and a difference of %.3g ulps of its row's "
                  "largest |y|",
                  c->name, (int)rk, ef, TOL_FULL, flip);
            worst_full = ef > worst_full ? ef : worst_full;
            worst_ref = er > worst_ref ? er : worst_ref;
        }
        CHECK(bitwise, "%s: each rank's y = the replicated ranks' y of its rows, bit for bit", c->name);
        CHECK(ndiff * 100 <= mg * h, "%s: %lld of %lld values differ from the unsharded block (at most 1%%)", c->name,
              (long long)ndiff, (long long)(mg * h));
        if (c->ep) {
            /* which ranks' experts a rank's own tokens reach: a rank with none still joins the reduce-scatter */
            int idle = 0;
            for (int32_t ro = 0; ro < size; ro++)
                for (int32_t q = 0; q < size; q++) {
                    int hit = 0;
                    for (int64_t i = ro * m * k; i < (ro + 1) * m * k; i++)
                        hit |= rids[i] >= q * e / size && rids[i] < (q + 1) * e / size;
                    idle += !hit;
                }
            g_idle_pairs += idle;
            if (c->idle_rank >= 0) {
                const int32_t q = c->idle_rank;
                int zero = 1, routed = 0;
                for (size_t i = 0; i < (size_t)(mg * l); i++) zero &= part[q][i] == 0.0f;
                for (int64_t i = 0; i < mg * k; i++) routed |= rids[i] >= q * e / size && rids[i] < (q + 1) * e / size;
                CHECK(!routed, "%s: no token routes to rank %d's experts", c->name, (int)q);
                CHECK(zero, "%s: rank %d's u partial is zero (its experts got no token)", c->name, (int)q);
            }
            printf("  %-40s EP%d m=%lld rel-L2 vs unsharded %.2e (%lld differ), vs fp64 %.2e; %d idle "
                   "pairs\n",
                   c->name, (int)size, (long long)m, worst_full, (long long)ndiff, worst_ref, idle);
        } else {
            printf("  %-40s TP%d m=%lld rel-L2 vs unsharded %.2e (%lld differ), vs fp64 %.2e\n", c->name,
                   (int)size, (long long)m, worst_full, (long long)ndiff, worst_ref);
        }
        g_worst_full = worst_full > g_worst_full ? worst_full : g_worst_full;
        g_worst_ref = worst_ref > g_worst_ref ? worst_ref : g_worst_ref;

        /* capacity: the gathered tokens beyond the plan are refused by PRE_REDUCE with the block's message */
        const int64_t over = (int64_t)size * (M_MAX + 1);
        uint16_t *xo = md_bf16_normal(r, over * h, 1.0);
        float *po = (float *)malloc(sizeof(float) * (size_t)(over * (l + h)));
        st = k3_latent_moe_run_stage(p[0], K3_LATENT_PRE_REDUCE, over, xo, &sw[0], NULL, NULL, po, NULL, NULL, ws[0],
                                     wsb[0], NULL);
        CHECK(st == K3_STATUS_INVALID_ARGUMENT && strstr(k3_ctx_last_error(g_ctx), "too many tokens for this plan"),
              "%s: pre of %lld gathered tokens on a plan of %lld: %s (%s)", c->name, (long long)over,
              (long long)d.max_tokens, k3_status_string(st), k3_ctx_last_error(g_ctx));
        free(xo);
        free(po);
        /* and the one-call run of a rank of several without a communicator is refused */
        if (size > 1) {
            st = k3_latent_moe_run(p[0], m, xg, &sw[0], NULL, ydp, NULL, NULL, ws[0], wsb[0], NULL);
            CHECK(st == K3_STATUS_INVALID_ARGUMENT && strstr(k3_ctx_last_error(g_ctx), "PRE_REDUCE"),
                  "%s: k3_latent_moe_run on a rank of %d refused (%s)", c->name, (int)size, k3_ctx_last_error(g_ctx));
        }
    }
    for (int32_t rk = 0; rk < size; rk++) {
        k3_latent_moe_plan_destroy(p[rk]);
        free(ws[rk]);
        free(part[rk]);
        k3t_tp_free(&sh[rk]);
    }
    k3_latent_moe_plan_destroy(pf);
    free(wf);
    free(sum);
    free(local);
    free(xg);
    free(resg);
    free(yfull);
    free(yrep);
    free(ydp);
    free(ref);
    free(got);
    free(rids);
    free(ids);
    free(rw);
    ld_free(&b);
}

/* The field's rules, and the one-call run of a rank of one (the same block as REPLICATED) and of several. */
static void test_rules(k3t_rng *r) {
    k3_latent_moe_desc d = make_desc(K3_WEIGHT_NVFP4, 16, 4, 1, 1);
    k3_latent_moe_desc e = d;
    e.parallel.tokens = K3_TOKENS_PER_RANK;
    ld_expect_plan(g_ctx, "NONE with PER_RANK tokens", &e, K3_STATUS_INVALID_ARGUMENT,
                   "PER_RANK is for a TP or EP layout");
    e.parallel.tokens = (k3_parallel_tokens)2;
    e.parallel.layout = K3_PARALLEL_TP;
    ld_expect_plan(g_ctx, "unknown tokens", &e, K3_STATUS_INVALID_ARGUMENT, "parallel.tokens must be");
    e.parallel.tokens = K3_TOKENS_PER_RANK;
    e.parallel.size = 4;
    e.max_tokens = 3;
    e.experts.inter /= 4, e.shared_inter /= 4;
    ld_expect_plan(g_ctx, "PER_RANK with max_tokens < size", &e, K3_STATUS_INVALID_ARGUMENT, "at least size");
    e.max_tokens = 4;
    ld_expect_plan(g_ctx, "PER_RANK with max_tokens = size", &e, K3_STATUS_SUCCESS, "");
    k3_latent_moe_desc dflt;
    k3_latent_moe_desc_init(&dflt);
    CHECK(dflt.parallel.tokens == K3_TOKENS_REPLICATED, "desc_init: tokens REPLICATED");

    /* TP of size 1 with PER_RANK: k3_latent_moe_run on its own m tokens, bit for bit the unsharded block */
    lat_data b;
    ld_make(&b, &d, r, 1);
    const int64_t h = d.hidden, m = M_MAX;
    uint16_t *x = md_bf16_normal(r, (M_MAX + 1) * h, 1.0), *res = md_bf16_normal(r, m * h, 1.0);
    uint16_t *y1 = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(m * h));
    uint16_t *y2 = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(m * h));
    k3_latent_moe_desc one = d;
    one.parallel.layout = K3_PARALLEL_TP;
    one.parallel.tokens = K3_TOKENS_PER_RANK;
    k3_latent_moe_plan *pn = NULL, *po = NULL;
    const int ok = k3_latent_moe_plan_create(g_ctx, &d, &pn) == K3_STATUS_SUCCESS &&
                   k3_latent_moe_plan_create(g_ctx, &one, &po) == K3_STATUS_SUCCESS;
    CHECK(ok, "rules: plans: %s", k3_ctx_last_error(g_ctx));
    if (ok) {
        size_t wn = 0, wo = 0;
        void *wsn = ld_ws(pn, &wn), *wso = ld_ws(po, &wo);
        k3_status st1 = k3_latent_moe_run(pn, m, x, &b.w, res, y1, NULL, NULL, wsn, wn, NULL);
        k3_status st2 = k3_latent_moe_run(po, m, x, &b.w, res, y2, NULL, NULL, wso, wo, NULL);
        CHECK(st1 == K3_STATUS_SUCCESS && st2 == K3_STATUS_SUCCESS, "rules: runs: %s", k3_ctx_last_error(g_ctx));
        CHECK(!memcmp(y1, y2, sizeof(uint16_t) * (size_t)(m * h)), "TP1 PER_RANK run = the unsharded block bitwise");
        st2 = k3_latent_moe_run(po, M_MAX + 1, x, &b.w, NULL, y2, NULL, NULL, wso, wo, NULL);
        CHECK(st2 == K3_STATUS_INVALID_ARGUMENT && strstr(k3_ctx_last_error(g_ctx), "too many tokens for this plan"),
              "TP1 PER_RANK run of max_tokens + 1: %s (%s)", k3_status_string(st2), k3_ctx_last_error(g_ctx));
        free(wsn);
        free(wso);
    }
    k3_latent_moe_plan_destroy(pn);
    k3_latent_moe_plan_destroy(po);

    /* TP2 PER_RANK: m within max_tokens but size * m beyond it is the capacity status, naming the gathered count
     * (the check comes before the refusal of a run without a communicator) */
    k3t_tp_shard sh;
    k3_latent_moe_desc full = make_desc(K3_WEIGHT_NVFP4, 16, 4, 1, 2);
    full.max_tokens = 4;
    lat_data b2;
    ld_make(&b2, &full, r, 1);
    k3t_tp_cut(&sh, &full, &b2.w.experts, b2.sgu, b2.sdown, 0, 2);
    sh.d.parallel.tokens = K3_TOKENS_PER_RANK;
    k3_latent_moe_weights sw = k3t_tp_weights(&sh, &b2.w);
    k3_latent_moe_plan *p2 = NULL;
    if (k3_latent_moe_plan_create(g_ctx, &sh.d, &p2) == K3_STATUS_SUCCESS) {
        size_t wb = 0;
        void *w2 = ld_ws(p2, &wb);
        k3_status st = k3_latent_moe_run(p2, 3, x, &sw, NULL, y2, NULL, NULL, w2, wb, NULL);
        CHECK(st == K3_STATUS_INVALID_ARGUMENT && strstr(k3_ctx_last_error(g_ctx), "too many tokens for this plan") &&
                  strstr(k3_ctx_last_error(g_ctx), "gather 6"),
              "TP2 PER_RANK run of m = 3 on max_tokens 4: %s (%s)", k3_status_string(st), k3_ctx_last_error(g_ctx));
        printf("  capacity: \"%s\"\n", k3_ctx_last_error(g_ctx));
        st = k3_latent_moe_run(p2, 2, x, &sw, NULL, y2, NULL, NULL, w2, wb, NULL);
        CHECK(st == K3_STATUS_INVALID_ARGUMENT && strstr(k3_ctx_last_error(g_ctx), "PRE_REDUCE"),
              "TP2 PER_RANK run of m = 2 without a communicator refused (%s)", k3_ctx_last_error(g_ctx));
        free(w2);
    } else {
        CHECK(0, "rules: TP2 plan: %s", k3_ctx_last_error(g_ctx));
    }
    k3_latent_moe_plan_destroy(p2);
    k3t_tp_free(&sh);
    ld_free(&b2);
    free(x);
    free(res);
    free(y1);
    free(y2);
    ld_free(&b);
}

int main(void) {
    printf("seed 0x%llx\n", (unsigned long long)SEED);
    k3t_rng r = {SEED};
    if (!(g_ctx = k3t_cpu_ctx())) {
        printf("cannot create a CPU context\n");
        return 1;
    }
    const k3_weight_format nv = K3_WEIGHT_NVFP4, mx = K3_WEIGHT_MXFP4;
    const dp_case cases[] = {
        {"tp nvfp4 E16 k4 shared", nv, 16, 4, 1, 0, 2, 1, -1},
        {"tp nvfp4 E32 k8 no shared", nv, 32, 8, 0, 0, 2, 2, -1},
        {"tp mxfp4 E16 k4 shared", mx, 16, 4, 1, 0, 2, 3, -1},
        {"ep nvfp4 E16 k4 shared", nv, 16, 4, 1, 1, 2, 1, -1},
        {"ep mxfp4 E32 k8 no shared", mx, 32, 8, 0, 1, 2, 2, -1},
        {"ep nvfp4 E64 k8 shared", nv, 64, 8, 1, 1, 2, 3, -1},
        {"ep nvfp4 E64 k4 shared", nv, 64, 4, 1, 1, 4, 1, -1},
        {"ep mxfp4 E16 k4 no shared", mx, 16, 4, 0, 1, 4, 2, -1},
        {"ep nvfp4 E32 k8 shared", nv, 32, 8, 1, 1, 4, 3, -1},
        {"ep nvfp4 E64 k4 shared, rank 2 idle", nv, 64, 4, 1, 1, 4, 2, 2},
        {"ep mxfp4 E32 k4 shared, rank 1 idle", mx, 32, 4, 1, 1, 2, 3, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], &r);
    CHECK(g_idle_pairs > 0, "some rank's own tokens route to no expert of some rank (%d pairs)", g_idle_pairs);
    printf("worst rel-L2: %.2e vs the unsharded block, %.2e vs fp64; %d idle (owner, holder) pairs\n", g_worst_full,
           g_worst_ref, g_idle_pairs);
    test_rules(&r);
    k3_ctx_destroy(g_ctx);
    return k3t_finish();
}
