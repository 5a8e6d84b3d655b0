/*
 * `k3 run moe` end to end: F32 expert weights are written to a safetensors file, quantized by `k3 quant nvfp4`
 * itself, and the quantized file is run both in-process (the public API on the tensors of that file) and by the
 * CLI; the CLI's output must be bit for bit the in-process result. Covers the experts alone, router + experts,
 * the whole latent block, W4A4, another activation, swizzled scales, and the CLI's error messages (the audit's
 * cases: test_run_moe_audit.c).
 * Needs K3_BINARY_DIR (set by CMake for tests) to find the k3 binary.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, access */
#include "run_moe_files.h"

/* The experts' desc and weights as read from a `k3 quant` file. */
static void experts_from(const k3_st_file *q, k3_moe_desc *d, k3_moe_weights *w, k3_scale_layout lay) {
    k3_moe_desc_init(d);
    d->num_experts = E;
    d->top_k = K;
    d->hidden = L;
    d->inter = I;
    const k3_st_tensor *w13 = k3_st_find(q, "w13_weight"), *s13 = k3_st_find(q, "w13_weight_scale");
    d->format = w13 && w13->dtype == K3_ST_BF16 ? K3_WEIGHT_BF16
                : s13 && s13->dtype == K3_ST_U8 ? K3_WEIGHT_MXFP4
                                                : K3_WEIGHT_NVFP4;
    d->scale_layout = lay;
    d->max_tokens = M;
    memset(w, 0, sizeof *w);
    w->w13 = data_of(q, "w13_weight");
    w->w13_scale = data_of(q, "w13_weight_scale");
    w->w13_scale_2 = (const float *)data_of(q, "w13_weight_scale_2");
    w->w13_input_scale = (const float *)data_of(q, "w13_input_scale");
    w->w2 = data_of(q, "w2_weight");
    w->w2_scale = data_of(q, "w2_weight_scale");
    w->w2_scale_2 = (const float *)data_of(q, "w2_weight_scale_2");
    w->w2_input_scale = (const float *)data_of(q, "w2_input_scale");
}

/* Compares the CLI's output file with the in-process results; ids/wts NULL when it must not have routed. */
static void compare_output(const char *what, const uint16_t *y, int64_t cols, const int32_t *ids, const float *wts) {
    k3_st_file *f = open_file("y.safetensors");
    CHECK(f != NULL, "%s: the CLI wrote its output", what);
    if (!f) return;
    const k3_st_tensor *t = k3_st_find(f, "output");
    CHECK(t && t->dtype == K3_ST_BF16 && t->ndim == 2 && t->shape[0] == M && t->shape[1] == cols,
          "%s: output is BF16 [%d, %lld]", what, M, (long long)cols);
    if (t && t->nbytes == sizeof(uint16_t) * (size_t)(M * cols))
        CHECK(!memcmp(t->data, y, t->nbytes), "%s: CLI output bit for bit equal to the in-process result", what);
    const k3_st_tensor *ti = k3_st_find(f, "topk_ids"), *tw = k3_st_find(f, "topk_weights");
    if (ids) {
        CHECK(ti && ti->dtype == K3_ST_I32 && ti->nbytes == sizeof(int32_t) * M * K &&
                  !memcmp(ti->data, ids, ti->nbytes),
              "%s: topk_ids equal", what);
        CHECK(tw && tw->dtype == K3_ST_F32 && tw->nbytes == sizeof(float) * M * K && !memcmp(tw->data, wts, tw->nbytes),
              "%s: topk_weights equal", what);
    } else {
        CHECK(!ti && !tw, "%s: no routing tensors when the input gave them", what);
    }
    k3_st_close(f);
}

static int moe_in_process(const k3_moe_desc *d, const k3_moe_weights *w, const uint16_t *x, const int32_t *ids,
                          const float *wts, uint16_t *y) {
    k3_moe_plan *p = NULL;
    if (k3_moe_plan_create(g_ctx, d, &p) != K3_STATUS_SUCCESS) return 0;
    size_t wsb = 0;
    k3_moe_workspace_size(p, &wsb);
    void *ws = malloc(wsb);
    int ok = k3_moe_run(p, M, x, ids, wts, w, y, NULL, ws, wsb, NULL) == K3_STATUS_SUCCESS;
    free(ws);
    k3_moe_plan_destroy(p);
    return ok;
}

static void test_experts(const char *quant_file, k3_scale_layout lay) {
    k3_st_file *q = open_file(quant_file);
    CHECK(q != NULL, "open %s", quant_file);
    if (!q) return;
    k3_moe_desc d;
    k3_moe_weights w;
    experts_from(q, &d, &w, lay);
    uint16_t y[M * L];
    char what[96];

    /* 1. the experts alone, K3 defaults (situ 4/25, w4a16) */
    snprintf(what, sizeof what, "experts (%s)", quant_file);
    CHECK(moe_in_process(&d, &w, xl, ids_in, wts_in, y), "%s: in-process run: %s", what, k3_ctx_last_error(g_ctx));
    CHECK(sh("%s run moe --weights %s/%s --input %s/x_ids.safetensors --output %s/y.safetensors", g_k3, g_dir,
             quant_file, g_dir, g_dir) == 0,
          "%s: k3 run moe exit 0", what);
    compare_output(what, y, L, NULL, NULL);
    /* the in-process result is itself right: the fp64 reference on the same quantized tensors */
    double ref[M * L], got[M * L];
    ref_moe(&d, &w, M, xl, ids_in, wts_in, ref);
    for (int i = 0; i < M * L; i++) {
        got[i] = k3_bf16_to_f32(y[i]);
        ref[i] = ref_bf16(ref[i]);
    }
    const double rel = ref_rel_l2(got, ref, M * L);
    CHECK(rel <= 1e-3, "%s: vs fp64 reference rel-L2 %.3g", what, rel);

    /* 2. W4A4 (NVFP4 only) and 3. silu with a clamp, through the options */
    if (d.format == K3_WEIGHT_NVFP4) {
        d.mode = K3_MOE_W4A4;
        snprintf(what, sizeof what, "w4a4 (%s)", quant_file);
        CHECK(moe_in_process(&d, &w, xl, ids_in, wts_in, y), "%s: in-process", what);
        CHECK(sh("%s run moe --mode w4a4 --weights %s/%s --input %s/x_ids.safetensors --output %s/y.safetensors", g_k3,
                 g_dir, quant_file, g_dir, g_dir) == 0,
              "%s: exit 0", what);
        compare_output(what, y, L, NULL, NULL);
        d.mode = K3_MOE_W4A16;
    }
    k3_act_desc_init(&d.act, K3_ACT_SILU);
    d.act.limit = 0.75f;
    snprintf(what, sizeof what, "silu limit 0.75 (%s)", quant_file);
    CHECK(moe_in_process(&d, &w, xl, ids_in, wts_in, y), "%s: in-process", what);
    CHECK(sh("%s run moe --act silu --limit 0.75 --top-k %d --weights %s/%s --input %s/x_ids.safetensors --output "
             "%s/y.safetensors",
             g_k3, K, g_dir, quant_file, g_dir, g_dir) == 0,
          "%s: exit 0", what);
    compare_output(what, y, L, NULL, NULL);
    k3_st_close(q);
}

static void test_routed(void) {
    k3_st_file *q = open_file("q_experts.safetensors");
    if (!q) return;
    k3_moe_desc d;
    k3_moe_weights w;
    experts_from(q, &d, &w, K3_SCALE_LINEAR);
    k3_router_desc rd;
    k3_router_desc_init(&rd);
    rd.num_experts = E;
    rd.top_k = K;
    rd.hidden = L;
    rd.scaling_factor = 2.0f;
    rd.max_tokens = M;
    k3_router_plan *rp = NULL;
    int32_t ids[M * K];
    float wts[M * K];
    uint16_t y[M * L];
    CHECK(k3_router_plan_create(g_ctx, &rd, &rp) == K3_STATUS_SUCCESS, "router plan");
    size_t rws_bytes = 0;
    k3_router_workspace_size(rp, &rws_bytes);
    void *rws = malloc(rws_bytes);
    CHECK(k3_router_run(rp, M, xl, data_of(q, "gate_weight"), (const float *)data_of(q, "e_score_correction_bias"), ids,
                        wts, rws, rws_bytes, NULL) == K3_STATUS_SUCCESS,
          "router run: %s", k3_ctx_last_error(g_ctx));
    free(rws);
    k3_router_plan_destroy(rp);
    CHECK(moe_in_process(&d, &w, xl, ids, wts, y), "routed experts in-process");
    CHECK(sh("%s run moe --top-k %d --scaling-factor 2 --weights %s/q_experts.safetensors --input %s/x_l.safetensors "
             "--output %s/y.safetensors",
             g_k3, K, g_dir, g_dir, g_dir) == 0,
          "router + experts: exit 0");
    compare_output("router + experts", y, L, ids, wts);
    k3_st_close(q);
}

static void test_latent(void) {
    k3_st_file *q = open_file("q_latent.safetensors");
    if (!q) return;
    k3_latent_moe_desc d;
    k3_latent_moe_desc_init(&d);
    d.hidden = H;
    d.router.hidden = H;
    d.router.num_experts = E;
    d.router.top_k = K;
    k3_latent_moe_weights w;
    memset(&w, 0, sizeof w);
    experts_from(q, &d.experts, &w.experts, K3_SCALE_LINEAR);
    d.shared_inter = IS;
    d.max_tokens = M;
    w.gate = data_of(q, "gate_weight");
    w.bias = (const float *)data_of(q, "e_score_correction_bias");
    w.down_proj = data_of(q, "down_proj_weight");
    w.norm = data_of(q, "norm_weight");
    w.up_proj = data_of(q, "up_proj_weight");
    w.shared_gate_up = data_of(q, "shared_gate_up_weight");
    w.shared_down = data_of(q, "shared_down_weight");
    k3_latent_moe_plan *p = NULL;
    CHECK(k3_latent_moe_plan_create(g_ctx, &d, &p) == K3_STATUS_SUCCESS, "latent plan: %s", k3_ctx_last_error(g_ctx));
    size_t wsb = 0;
    k3_latent_moe_workspace_size(p, &wsb);
    void *ws = malloc(wsb);
    uint16_t y[M * H];
    int32_t ids[M * K];
    float wts[M * K];
    CHECK(k3_latent_moe_run(p, M, xh, &w, NULL, y, ids, wts, ws, wsb, NULL) == K3_STATUS_SUCCESS, "latent run");
    free(ws);
    k3_latent_moe_plan_destroy(p);
    CHECK(sh("%s run moe --top-k %d --weights %s/q_latent.safetensors --input %s/x_h.safetensors --output "
             "%s/y.safetensors",
             g_k3, K, g_dir, g_dir, g_dir) == 0,
          "latent block: exit 0");
    compare_output("latent block", y, H, ids, wts);
    k3_st_close(q);
}

/* w13_weight_scale_2 as [E, 2] (gate, up): with both halves equal to the shared [E] value the output must be
 * the shared-scale output bit for bit; with the up half doubled it must match the in-process result. */
static void test_separate_scale_2(void) {
    k3_st_file *q = open_file("q_experts.safetensors");
    if (!q) return;
    const float *g = (const float *)data_of(q, "w13_weight_scale_2");
    static float g2[E * 2];
    tensor_spec ts[16];
    int n = 0;
    for (int32_t i = 0; i < k3_st_count(q) && n < 16; i++) {
        const k3_st_tensor *t = k3_st_at(q, i);
        tensor_spec sp = {t->name,
                          t->dtype,
                          t->ndim,
                          {t->shape[0], t->ndim > 1 ? t->shape[1] : 0, t->ndim > 2 ? t->shape[2] : 0},
                          t->data};
        if (!strcmp(t->name, "w13_weight_scale_2")) sp = (tensor_spec){t->name, K3_ST_F32, 2, {E, 2, 0}, g2};
        ts[n++] = sp;
    }
    k3_moe_desc d;
    k3_moe_weights w;
    experts_from(q, &d, &w, K3_SCALE_LINEAR);
    uint16_t y[M * L];
    for (int variant = 0; variant < 2; variant++) {
        for (int e = 0; e < E; e++) {
            g2[2 * e] = g[e];
            g2[2 * e + 1] = variant ? 2.0f * g[e] : g[e];
        }
        const char *what = variant ? "[E, 2] scale_2, up doubled" : "[E, 2] scale_2, equal halves";
        CHECK(write_file("sep.safetensors", ts, n), "%s: file written", what);
        d.w13_separate_scale_2 = variant;
        if (variant) w.w13_scale_2 = g2;
        CHECK(moe_in_process(&d, &w, xl, ids_in, wts_in, y), "%s: in-process", what);
        CHECK(sh("%s run moe --weights %s/sep.safetensors --input %s/x_ids.safetensors --output %s/y.safetensors", g_k3,
                 g_dir, g_dir, g_dir) == 0,
              "%s: exit 0", what);
        compare_output(what, y, L, NULL, NULL);
    }
    k3_st_close(q);
}

/* Wrong files: each is an error (exit 1) whose message names the tensor and what was expected. */
static void test_errors(void) {
    const char *run = "%s run moe --weights %s/%s --input %s/%s --output %s/y.safetensors";
    CHECK(sh(run, g_k3, g_dir, "q_experts.safetensors", g_dir, "x_h.safetensors", g_dir) == 1 &&
              stderr_has("hidden_states is [5, 128] but weights: gate_weight is [16, 64]"),
          "hidden_states of the wrong width");
    /* w2_weight_scale_2 as BF16 instead of F32; a misspelt tensor; ids without weights */
    k3_st_file *q = open_file("q_experts.safetensors");
    if (!q) return;
    tensor_spec ts[16], nos[16];
    int n = 0, nn = 0;
    for (int32_t i = 0; i < k3_st_count(q) && n < 15; i++) {
        const k3_st_tensor *t = k3_st_at(q, i);
        if (strstr(t->name, "input_scale") == NULL)
            nos[nn++] = (tensor_spec){t->name,
                                      t->dtype,
                                      t->ndim,
                                      {t->shape[0], t->ndim > 1 ? t->shape[1] : 0, t->ndim > 2 ? t->shape[2] : 0},
                                      t->data};
        tensor_spec s = {t->name,
                         t->dtype,
                         t->ndim,
                         {t->shape[0], t->ndim > 1 ? t->shape[1] : 0, t->ndim > 2 ? t->shape[2] : 0},
                         t->data};
        if (!strcmp(t->name, "w2_weight_scale_2")) {
            s.dt = K3_ST_BF16;
            s.shape[0] = 2 * E; /* same byte count */
        }
        ts[n++] = s;
    }
    CHECK(write_file("bad_scale2.safetensors", ts, n), "write bad_scale2");
    CHECK(sh(run, g_k3, g_dir, "bad_scale2.safetensors", g_dir, "x_ids.safetensors", g_dir) == 1 &&
              stderr_has("tensor 'w2_weight_scale_2' is BF16 [32], expected F32 [16]"),
          "w2_weight_scale_2 with the wrong dtype and shape");
    ts[n++] = (tensor_spec){"w13_wieght", K3_ST_F32, 1, {E, 0, 0}, in13};
    CHECK(write_file("bad_name.safetensors", ts, n), "write bad_name");
    CHECK(sh(run, g_k3, g_dir, "bad_name.safetensors", g_dir, "x_ids.safetensors", g_dir) == 1 &&
              stderr_has("tensor 'w13_wieght' is not one k3 run moe reads"),
          "a misspelt weights tensor");
    tensor_spec xi[2] = {{"hidden_states", K3_ST_BF16, 2, {M, L, 0}, xl},
                         {"topk_ids", K3_ST_I32, 2, {M, K, 0}, ids_in}};
    CHECK(write_file("x_noweights.safetensors", xi, 2), "write x_noweights");
    CHECK(sh(run, g_k3, g_dir, "q_experts.safetensors", g_dir, "x_noweights.safetensors", g_dir) == 1 &&
              stderr_has("tensor 'topk_weights' is missing (expected F32 [5, 4])"),
          "topk_ids without topk_weights");
    CHECK(write_file("no_input_scale.safetensors", nos, nn), "write no_input_scale");
    CHECK(sh("%s run moe --mode w4a4 --weights %s/no_input_scale.safetensors --input %s/x_ids.safetensors --output "
             "%s/y.safetensors",
             g_k3, g_dir, g_dir, g_dir) == 1 &&
              stderr_has("tensor 'w13_input_scale' is missing (expected F32 [16])"),
          "w4a4 without input scales");
    k3_st_close(q);
    CHECK(sh(run, g_k3, g_dir, "q_experts.safetensors", g_dir, "nonexistent.safetensors", g_dir) == 1 &&
              stderr_has("nonexistent.safetensors"),
          "a missing input file is named");
    CHECK(sh("%s run moe --weights a --input b", g_k3) == 2 && stderr_has("--output are required"), "usage error");
    CHECK(sh("%s run moe --act gelu --weights a --input b --output c", g_k3) == 2 && stderr_has("--act must be"),
          "unknown activation");
    CHECK(sh("%s run moe --act situ --situ-beta 0 --weights a --input b --output c", g_k3) == 2 &&
              stderr_has("--situ-beta must be > 0 (got 0)"),
          "SiTU without beta");
    CHECK(sh("%s run moe --help", g_k3) == 0, "k3 run moe --help");
    CHECK(sh("%s run --help", g_k3) == 0, "k3 run --help");
    CHECK(sh("%s run frobnicate", g_k3) == 2 && stderr_has("unknown operation"), "unknown operation");
}

int main(void) {
    const int st = run_moe_files_setup();
    if (st) return st;
    test_experts("q_experts.safetensors", K3_SCALE_LINEAR);
    test_experts("q_swz.safetensors", K3_SCALE_SWIZZLED);
    test_experts("q_mx.safetensors", K3_SCALE_LINEAR);
    test_experts("bf16_experts.safetensors", K3_SCALE_LINEAR);
    test_separate_scale_2();
    test_routed();
    test_latent();
    test_errors();
    run_moe_files_done();
    return k3t_finish();
}
