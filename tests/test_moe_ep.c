/* Expert parallelism in the routed experts (k3_moe_desc.global_experts, k3_moe_weights.expert_map): a rank holds
 * some whole experts, in any order, and takes the router's global ids. Its output must be the fp64 reference of the
 * full expert set with every slot of another rank's expert dropped (tests/ref_moe.h); the ranks' fp32 outputs
 * summed are the full set's. Also the refusals. CPU backend (gpu_latent_tp runs the same map on CUDA). */
#include <string.h>

#include "moe_data.h"
#include "ref_moe.h"
#include "test_util.h"

#define SEED 0x45507261ull /* "EPra" */
#define EG 12 /* global experts */
#define M 6

static k3_ctx *g_ctx;

static k3_moe_desc full_desc(k3_weight_format f) {
    k3_moe_desc d;
    k3_moe_desc_init(&d);
    d.num_experts = EG, d.top_k = 4, d.hidden = 64, d.inter = 64, d.format = f, d.max_tokens = M;
    return d;
}

/* Bytes per expert of each of the stacked buffers (linear scales). */
static void per_expert(const k3_moe_desc *d, size_t sz[4]) {
    const int64_t l = d->hidden, in = d->inter;
    if (d->format == K3_WEIGHT_BF16) {
        sz[0] = (size_t)(2 * in * l) * 2, sz[1] = 0, sz[2] = (size_t)(l * in) * 2, sz[3] = 0;
        return;
    }
    const int64_t bs = d->format == K3_WEIGHT_NVFP4 ? 16 : 32;
    sz[0] = (size_t)(2 * in * l / 2), sz[1] = (size_t)(2 * in * l / bs), sz[2] = (size_t)(l * in / 2),
    sz[3] = (size_t)(l * in / bs);
}

static void *gather(const void *src, size_t per, const int32_t *experts, int32_t n) {
    if (!src || !per) return NULL;
    uint8_t *dst = (uint8_t *)malloc(per * (size_t)n);
    for (int32_t i = 0; i < n; i++) memcpy(dst + per * (size_t)i, (const uint8_t *)src + per * (size_t)experts[i], per);
    return dst;
}

/* One rank holding `experts` (n of them, local id i = experts[i]) of the full set: its output vs the fp64
 * reference with the other experts' slots dropped; adds its fp32 output to sum. */
static void rank_case(const char *name, const k3_moe_desc *fd, const moe_data *md, const int32_t *experts, int32_t n,
                      const uint16_t *x, const int32_t *ids, const float *wts, float *sum) {
    size_t sz[4];
    per_expert(fd, sz);
    k3_moe_desc d = *fd;
    d.num_experts = n;
    d.global_experts = EG;
    int32_t map[EG];
    for (int32_t g = 0; g < EG; g++) map[g] = -1;
    for (int32_t i = 0; i < n; i++) map[experts[i]] = i;
    void *w13 = gather(md->w.w13, sz[0], experts, n), *w13s = gather(md->w.w13_scale, sz[1], experts, n);
    void *w2 = gather(md->w.w2, sz[2], experts, n), *w2s = gather(md->w.w2_scale, sz[3], experts, n);
    void *s13 = gather(md->w.w13_scale_2, sizeof(float), experts, n);
    void *s2 = gather(md->w.w2_scale_2, sizeof(float), experts, n);
    k3_moe_weights w;
    memset(&w, 0, sizeof w);
    w.w13 = w13, w.w13_scale = w13s, w.w2 = w2, w.w2_scale = w2s;
    w.w13_scale_2 = (const float *)s13, w.w2_scale_2 = (const float *)s2;
    w.expert_map = map;
    /* the reference: the full set, the weights of the slots whose expert is elsewhere set to 0 */
    const int64_t k = fd->top_k, l = fd->hidden;
    float rw[M * 4];
    for (int64_t i = 0; i < M * k; i++) rw[i] = ids[i] >= 0 && ids[i] < EG && map[ids[i]] >= 0 ? wts[i] : 0.0f;
    double ref[M * 64];
    ref_moe(fd, &md->w, M, x, ids, rw, ref);
    k3_moe_plan *p = NULL;
    k3_status st = k3_moe_plan_create(g_ctx, &d, &p);
    CHECK(st == K3_STATUS_SUCCESS, "%s: plan: %s", name, k3_ctx_last_error(g_ctx));
    if (p) {
        size_t wsb = 0;
        k3_moe_workspace_size(p, &wsb);
        void *ws = malloc(wsb);
        uint16_t y[M * 64];
        float yf[M * 64];
        st = k3_moe_run(p, M, x, ids, wts, &w, y, yf, ws, wsb, NULL);
        CHECK(st == K3_STATUS_SUCCESS, "%s: run: %s", name, k3_ctx_last_error(g_ctx));
        double got[M * 64], refr[M * 64];
        for (int64_t i = 0; i < M * l; i++) got[i] = k3_bf16_to_f32(y[i]), refr[i] = ref_bf16(ref[i]);
        const double e = ref_rel_l2(got, refr, M * l);
        CHECK(e <= 1e-3, "%s: rel-L2 %.3g vs the fp64 reference of its experts", name, e);
        printf("  %-34s rel-L2 %.2e\n", name, e);
        for (int64_t i = 0; i < M * l; i++) sum[i] += yf[i];
        /* without the map: refused by name */
        w.expert_map = NULL;
        st = k3_moe_run(p, M, x, ids, wts, &w, y, NULL, ws, wsb, NULL);
        CHECK(st == K3_STATUS_INVALID_ARGUMENT && strstr(k3_ctx_last_error(g_ctx), "expert_map"),
              "%s: a run without expert_map refused (%s)", name, k3_ctx_last_error(g_ctx));
        free(ws);
    }
    k3_moe_plan_destroy(p);
    free(w13), free(w13s), free(w2), free(w2s), free(s13), free(s2);
}

static void test_split(const char *name, k3_weight_format f, k3t_rng *r) {
    const k3_moe_desc fd = full_desc(f);
    moe_data md;
    md_make(&md, &fd, r);
    uint16_t *x = md_bf16_normal(r, M * fd.hidden, 1.0);
    int32_t ids[M * 4];
    float wts[M * 4];
    md_route(r, M, EG, fd.top_k, ids, wts);
    ids[3] = -1; /* a slot the router left empty stays empty */
    static float sum[M * 64];
    memset(sum, 0, sizeof sum);
    /* three ranks of 5, 4 and 3 experts, not in id order */
    const int32_t r0[] = {7, 0, 11, 3, 5}, r1[] = {1, 9, 4, 8}, r2[] = {10, 2, 6};
    char what[96];
    snprintf(what, sizeof what, "%s rank 0 (5 experts)", name);
    rank_case(what, &fd, &md, r0, 5, x, ids, wts, sum);
    snprintf(what, sizeof what, "%s rank 1 (4 experts)", name);
    rank_case(what, &fd, &md, r1, 4, x, ids, wts, sum);
    snprintf(what, sizeof what, "%s rank 2 (3 experts)", name);
    rank_case(what, &fd, &md, r2, 3, x, ids, wts, sum);
    double ref[M * 64], got[M * 64];
    ref_moe(&fd, &md.w, M, x, ids, wts, ref);
    for (int64_t i = 0; i < M * fd.hidden; i++) got[i] = sum[i];
    const double e = ref_rel_l2(got, ref, M * fd.hidden);
    CHECK(e <= 1e-5, "%s: the ranks' fp32 outputs summed: rel-L2 %.3g vs the full set (fp64)", name, e);
    printf("  %-34s the three ranks summed: rel-L2 %.2e vs the full set\n", name, e);
    free(x);
    md_free(&md);
}

static void test_refusals(void) {
    k3_moe_desc d = full_desc(K3_WEIGHT_NVFP4);
    d.num_experts = 4;
    d.global_experts = 3;
    k3_moe_plan *p = NULL;
    k3_status st = k3_moe_plan_create(g_ctx, &d, &p);
    CHECK(st == K3_STATUS_INVALID_ARGUMENT && strstr(k3_ctx_last_error(g_ctx), "global_experts"),
          "global_experts < num_experts refused (%s)", k3_ctx_last_error(g_ctx));
    k3_moe_plan_destroy(p);
    d.num_experts = 2, d.global_experts = 896, d.top_k = 16;
    p = NULL;
    st = k3_moe_plan_create(g_ctx, &d, &p);
    CHECK(st == K3_STATUS_SUCCESS, "two local experts of 896 with top-16: %s", k3_ctx_last_error(g_ctx));
    k3_moe_plan_destroy(p);
}

int main(void) {
    printf("seed 0x%llx\n", (unsigned long long)SEED);
    k3t_rng r = {SEED};
    if (!(g_ctx = k3t_cpu_ctx())) return 1;
    test_split("nvfp4", K3_WEIGHT_NVFP4, &r);
    test_split("mxfp4", K3_WEIGHT_MXFP4, &r);
    test_split("bf16", K3_WEIGHT_BF16, &r);
    test_refusals();
    k3_ctx_destroy(g_ctx);
    return k3t_finish();
}
