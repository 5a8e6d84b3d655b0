/*
 * `k3 run moe` end to end: F32 expert weights are written to a safetensors file, quantized by `k3 quant nvfp4`
 * itself, and the quantized file is run both in-process (the public API on the tensors of that file) and by the
 * CLI; the CLI's output must be bit for bit the in-process result. Covers the experts alone, router + experts,
 * the whole latent block, W4A4, another activation, swizzled scales, and the CLI's error messages.
 * Needs K3_BINARY_DIR (set by CMake for tests) to find the k3 binary.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, access */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "moe_data.h"
#include "ref_moe.h"
#include "test_util.h"

#define SEED 0x52756e4d6f45ull /* "RunMoE" */
#define E 16
#define L 64
#define I 32
#define H 128
#define IS 32
#define M 5
#define K 4

static char g_dir[64], g_k3[1024];
static k3_ctx *g_ctx;

static void path_of(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", g_dir, name); }

/* Runs a shell command (stdout to /dev/null, stderr to g_dir/stderr.txt); returns its exit status. */
static int sh(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (n < 0 || n + 64 >= (int)sizeof cmd) return -1;
    snprintf(cmd + n, sizeof cmd - (size_t)n, " >/dev/null 2>%s/stderr.txt", g_dir);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* 1 when the last command's stderr contains s. */
static int stderr_has(const char *s) {
    char p[128], buf[8192];
    path_of(p, sizeof p, "stderr.txt");
    FILE *f = fopen(p, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    if (!strstr(buf, s)) {
        fprintf(stderr, "   stderr was: %s   wanted: %s\n", buf, s);
        return 0;
    }
    return 1;
}

typedef struct tensor_spec {
    const char *name;
    k3_st_dtype dt;
    int32_t ndim;
    int64_t shape[3];
    const void *data;
} tensor_spec;

static int write_file(const char *name, const tensor_spec *ts, int n) {
    char p[128], err[512];
    path_of(p, sizeof p, name);
    k3_st_writer *w = NULL;
    int ok = k3_st_writer_create(&w) == K3_STATUS_SUCCESS;
    for (int i = 0; ok && i < n; i++)
        ok = k3_st_writer_add(w, ts[i].name, ts[i].dt, ts[i].ndim, ts[i].shape, ts[i].data, err, sizeof err) ==
             K3_STATUS_SUCCESS;
    ok = ok && k3_st_writer_save(w, p, err, sizeof err) == K3_STATUS_SUCCESS;
    if (!ok) fprintf(stderr, "cannot write %s: %s\n", p, err);
    k3_st_writer_destroy(w);
    return ok;
}

static k3_st_file *open_file(const char *name) {
    char p[128], err[512];
    path_of(p, sizeof p, name);
    k3_st_file *f = NULL;
    if (k3_st_open(p, &f, err, sizeof err) != K3_STATUS_SUCCESS) fprintf(stderr, "cannot open %s: %s\n", p, err);
    return f;
}

static const void *data_of(const k3_st_file *f, const char *name) {
    const k3_st_tensor *t = f ? k3_st_find(f, name) : NULL;
    return t ? t->data : NULL;
}

/* The source tensors (F32 experts before quantization, BF16 dense tensors). */
static float w13f[E * 2 * I * L], w2f[E * L * I], in13[E], in2[E], biasv[E];
static uint16_t gate_l[E * L], gate_h[E * H], downw[L * H], normw[L], upw[H * L], sguw[2 * IS * H], sdw[H * IS];
static uint16_t xl[M * L], xh[M * H];
static int32_t ids_in[M * K];
static float wts_in[M * K];

static void make_sources(k3t_rng *r) {
    for (int i = 0; i < E * 2 * I * L; i++) w13f[i] = (float)(k3t_normal(r) / 8.0);
    for (int i = 0; i < E * L * I; i++) w2f[i] = (float)(k3t_normal(r) / 5.7);
    for (int e = 0; e < E; e++) {
        in13[e] = 4.0f / 2688.0f;
        in2[e] = 2.0f / 2688.0f;
        biasv[e] = 0.1f * k3t_uniform(r);
    }
    uint16_t *bufs[] = {gate_l, gate_h, downw, upw, sguw, sdw};
    const int sizes[] = {E * L, E * H, L * H, H * L, 2 * IS * H, H * IS};
    const double sds[] = {0.125, 0.09, 0.09, 0.125, 0.09, 0.18};
    for (int b = 0; b < 6; b++)
        for (int i = 0; i < sizes[b]; i++) bufs[b][i] = k3_bf16_from_f32((float)(k3t_normal(r) * sds[b]));
    for (int i = 0; i < L; i++) normw[i] = k3_bf16_from_f32((float)(1.0 + 0.2 * k3t_normal(r)));
    for (int i = 0; i < M * L; i++) xl[i] = k3_bf16_from_f32((float)k3t_normal(r));
    for (int i = 0; i < M * H; i++) xh[i] = k3_bf16_from_f32((float)k3t_normal(r));
    md_route(r, M, E, K, ids_in, wts_in);
}

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

/* Copies file src to dst with n bytes at byte offset off of tensor tname replaced by bytes; 1 on success. */
static int copy_patched(const char *src, const char *dst, const char *tname, size_t off, const void *bytes, size_t n) {
    k3_st_file *f = open_file(src);
    if (!f) return 0;
    char p[128], err[512];
    path_of(p, sizeof p, dst);
    k3_st_writer *w = NULL;
    int ok = k3_st_writer_create(&w) == K3_STATUS_SUCCESS, patched = 0;
    for (int32_t i = 0; ok && i < k3_st_count(f); i++) {
        const k3_st_tensor *t = k3_st_at(f, i);
        unsigned char *d = malloc(t->nbytes + 1);
        if (!d) {
            ok = 0;
            break;
        }
        memcpy(d, t->data, t->nbytes);
        if (!strcmp(t->name, tname) && off + n <= t->nbytes) memcpy(d + off, bytes, n), patched = 1;
        ok = k3_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, d, err, sizeof err) == K3_STATUS_SUCCESS;
        free(d);
    }
    ok = ok && patched && k3_st_writer_save(w, p, err, sizeof err) == K3_STATUS_SUCCESS;
    if (!ok) fprintf(stderr, "cannot write %s (patching %s)\n", p, tname);
    k3_st_writer_destroy(w);
    k3_st_close(f);
    return ok;
}

/* 1 when the two files have the same bytes. */
static int same_bytes(const char *a, const char *b) {
    char c[512];
    snprintf(c, sizeof c, "cmp -s %s/%s %s/%s", g_dir, a, g_dir, b);
    return system(c) == 0;
}

/* Audit regressions: the output never replaces an input, negative "unset" values are refused, NaN and Inf in
 * scales, routing weights and activations are named, and a non-finite output is an error, not a file. */
static void test_audit(void) {
    /* --output equal to --weights or --input: refused before anything is read, the file unchanged */
    sh("cp %s/q_experts.safetensors %s/keep_w.safetensors && cp %s/x_ids.safetensors %s/keep_x.safetensors", g_dir,
       g_dir, g_dir, g_dir);
    CHECK(sh("%s run moe --weights %s/keep_w.safetensors --input %s/keep_x.safetensors --output %s/keep_w.safetensors",
             g_k3, g_dir, g_dir, g_dir) == 2 &&
              stderr_has("is the --weights file") && same_bytes("keep_w.safetensors", "q_experts.safetensors"),
          "--output = --weights refused, weights unchanged");
    CHECK(sh("%s run moe --weights %s/keep_w.safetensors --input %s/keep_x.safetensors --output %s/./keep_x.safetensors",
             g_k3, g_dir, g_dir, g_dir) == 2 &&
              stderr_has("is the --input file") && same_bytes("keep_x.safetensors", "x_ids.safetensors"),
          "--output = --input by another path (same device and inode) refused, input unchanged");
    sh("ln -f %s/keep_w.safetensors %s/hardlink.safetensors", g_dir, g_dir);
    CHECK(sh("%s run moe --weights %s/keep_w.safetensors --input %s/keep_x.safetensors --output %s/hardlink.safetensors",
             g_k3, g_dir, g_dir, g_dir) == 2 &&
              stderr_has("is the --weights file") && same_bytes("keep_w.safetensors", "q_experts.safetensors"),
          "--output = a hard link of --weights refused");

    /* negative or zero betas and limits: usage errors, 0 only where it documents "no clamp" */
    const char *args = "--weights a --input b --output c";
    CHECK(sh("%s run moe --situ-linear-beta -3 %s", g_k3, args) == 2 &&
              stderr_has("--situ-linear-beta must be > 0, or 0 for no clamp (got -3)"),
          "--situ-linear-beta -3 refused");
    CHECK(sh("%s run moe --act silu --limit -5 %s", g_k3, args) == 2 &&
              stderr_has("--limit must be > 0, or 0 for no clamp (got -5)"),
          "--limit -5 refused");
    CHECK(sh("%s run moe --situ-beta -1 %s", g_k3, args) == 2 && stderr_has("--situ-beta must be > 0 (got -1)"),
          "--situ-beta -1 refused with a clear message");
    CHECK(sh("%s run moe --situ-beta 1e-45 %s", g_k3, args) == 2 && stderr_has("'1e-45' is too small") &&
              sh("grep -q 'not a finite' %s/stderr.txt", g_dir) == 1,
          "--situ-beta 1e-45 is called too small, not 'not a finite number'");
    CHECK(sh("%s run moe --situ-beta 1e39 %s", g_k3, args) == 2 && stderr_has("too large"), "1e39 too large");
    CHECK(sh("%s run moe --help | grep -q '0 = no clamp'", g_k3) == 0, "--help documents 0 = no clamp");
    char ypath[128];
    path_of(ypath, sizeof ypath, "y_audit.safetensors");
    const char *run = "%s run moe --weights %s/%s --input %s/%s --output %s";
    CHECK(sh(run, g_k3, g_dir, "q_experts.safetensors", g_dir, "x_ids.safetensors", ypath) == 0,
          "the unpatched files run (control)");
    CHECK(sh("%s run moe --situ-linear-beta 0 --weights %s/q_experts.safetensors --input %s/x_ids.safetensors "
             "--output %s",
             g_k3, g_dir, g_dir, ypath) == 0,
          "--situ-linear-beta 0 = no linear clamp is accepted");

    /* NaN / Inf on load, named by tensor and element */
    const float fnan = NAN, fbig = 3e38f;
    const unsigned char e4m3_nan = 0x7F, ue8m0_nan = 0xFF;
    const uint16_t bf_inf = 0x7F80;
    CHECK(copy_patched("q_experts.safetensors", "nan_s2.safetensors", "w13_weight_scale_2", 3 * sizeof(float),
                       &fnan, sizeof fnan),
          "write nan_s2");
    sh("rm -f %s", ypath);
    CHECK(sh(run, g_k3, g_dir, "nan_s2.safetensors", g_dir, "x_ids.safetensors", ypath) == 1 &&
              stderr_has("tensor 'w13_weight_scale_2' element [3] is NaN") && access(ypath, F_OK) != 0,
          "NaN in w13_weight_scale_2 named, no output");
    CHECK(copy_patched("q_experts.safetensors", "nan_bs.safetensors", "w2_weight_scale", 5, &e4m3_nan, 1),
          "write nan_bs");
    CHECK(sh(run, g_k3, g_dir, "nan_bs.safetensors", g_dir, "x_ids.safetensors", ypath) == 1 &&
              stderr_has("tensor 'w2_weight_scale' element [0, 2, 1]") /* [E, L, I/16] = [16, 64, 2] */ && stderr_has("E4M3 NaN code"),
          "E4M3 NaN code in a block scale named");
    CHECK(copy_patched("q_mx.safetensors", "nan_mx.safetensors", "w13_weight_scale", 2, &ue8m0_nan, 1),
          "write nan_mx");
    CHECK(sh(run, g_k3, g_dir, "nan_mx.safetensors", g_dir, "x_ids.safetensors", ypath) == 1 &&
              stderr_has("tensor 'w13_weight_scale' element [0, 1, 0]") /* [16, 64, 2] */ && stderr_has("UE8M0 NaN code"),
          "UE8M0 NaN code in a block scale named");
    CHECK(copy_patched("x_ids.safetensors", "nan_wts.safetensors", "topk_weights", 6 * sizeof(float), &fnan,
                       sizeof fnan),
          "write nan_wts");
    CHECK(sh(run, g_k3, g_dir, "q_experts.safetensors", g_dir, "nan_wts.safetensors", ypath) == 1 &&
              stderr_has("input: tensor 'topk_weights' element [1, 2] is NaN"),
          "NaN routing weight named");
    CHECK(copy_patched("x_ids.safetensors", "inf_x.safetensors", "hidden_states", 2 * (L + 1), &bf_inf,
                       sizeof bf_inf),
          "write inf_x");
    CHECK(sh(run, g_k3, g_dir, "q_experts.safetensors", g_dir, "inf_x.safetensors", ypath) == 1 &&
              stderr_has("input: tensor 'hidden_states' element [1, 1] is +Inf"),
          "Inf in hidden_states named");
    float big[E];
    for (int e = 0; e < E; e++) big[e] = fbig;
    CHECK(copy_patched("q_experts.safetensors", "big_s2.safetensors", "w2_weight_scale_2", 0, big, sizeof big),
          "write big_s2");
    CHECK(sh(run, g_k3, g_dir, "big_s2.safetensors", g_dir, "x_ids.safetensors", ypath) == 1 &&
              stderr_has("output element [") && stderr_has("not written") && access(ypath, F_OK) != 0,
          "an output that overflows to Inf/NaN is an error and is not written");
    const float fneg = -1.0f;
    CHECK(copy_patched("q_experts.safetensors", "neg_s2.safetensors", "w2_weight_scale_2", 0, &fneg, sizeof fneg),
          "write neg_s2");
    CHECK(sh(run, g_k3, g_dir, "neg_s2.safetensors", g_dir, "x_ids.safetensors", ypath) == 1 &&
              stderr_has("tensor 'w2_weight_scale_2' element [0] is -1: not positive"),
          "a negative scale_2 named");
}

int main(void) {
    const char *bin = getenv("K3_BINARY_DIR");
    if (!bin) K3T_SKIP("K3_BINARY_DIR is not set (run through ctest)");
    snprintf(g_k3, sizeof g_k3, "%s/k3", bin);
    if (access(g_k3, X_OK) != 0) {
        printf("no k3 binary at %s\n", g_k3);
        return 1;
    }
    snprintf(g_dir, sizeof g_dir, "/tmp/k3_run_moe_XXXXXX");
    if (!mkdtemp(g_dir)) {
        printf("cannot make a temporary directory\n");
        return 1;
    }
    printf("seed 0x%llx, files in %s\n", (unsigned long long)SEED, g_dir);
    k3t_rng r = {SEED};
    if (!(g_ctx = k3t_cpu_ctx())) return 1;
    make_sources(&r);

    /* F32 sources -> `k3 quant nvfp4` (only the two expert tensors; the rest is copied unchanged) */
    const tensor_spec experts[] = {
        {"w13_weight", K3_ST_F32, 3, {E, 2 * I, L}, w13f},  {"w2_weight", K3_ST_F32, 3, {E, L, I}, w2f},
        {"w13_input_scale", K3_ST_F32, 1, {E, 0, 0}, in13}, {"w2_input_scale", K3_ST_F32, 1, {E, 0, 0}, in2},
        {"gate_weight", K3_ST_BF16, 2, {E, L, 0}, gate_l},  {"e_score_correction_bias", K3_ST_F32, 1, {E, 0, 0}, biasv},
    };
    const tensor_spec latent[] = {
        {"w13_weight", K3_ST_F32, 3, {E, 2 * I, L}, w13f},
        {"w2_weight", K3_ST_F32, 3, {E, L, I}, w2f},
        {"gate_weight", K3_ST_BF16, 2, {E, H, 0}, gate_h},
        {"e_score_correction_bias", K3_ST_F32, 1, {E, 0, 0}, biasv},
        {"down_proj_weight", K3_ST_BF16, 2, {L, H, 0}, downw},
        {"norm_weight", K3_ST_BF16, 1, {L, 0, 0}, normw},
        {"up_proj_weight", K3_ST_BF16, 2, {H, L, 0}, upw},
        {"shared_gate_up_weight", K3_ST_BF16, 2, {2 * IS, H, 0}, sguw},
        {"shared_down_weight", K3_ST_BF16, 2, {H, IS, 0}, sdw},
    };
    const tensor_spec swz[] = {{"w13_weight", K3_ST_F32, 3, {E, 2 * I, L}, w13f},
                               {"w2_weight", K3_ST_F32, 3, {E, L, I}, w2f},
                               {"w13_input_scale", K3_ST_F32, 1, {E, 0, 0}, in13},
                               {"w2_input_scale", K3_ST_F32, 1, {E, 0, 0}, in2}};
    const tensor_spec x_ids[] = {{"hidden_states", K3_ST_BF16, 2, {M, L, 0}, xl},
                                 {"topk_ids", K3_ST_I32, 2, {M, K, 0}, ids_in},
                                 {"topk_weights", K3_ST_F32, 2, {M, K, 0}, wts_in}};
    const tensor_spec x_l[] = {{"hidden_states", K3_ST_BF16, 2, {M, L, 0}, xl}};
    const tensor_spec x_h[] = {{"hidden_states", K3_ST_BF16, 2, {M, H, 0}, xh}};
    int ok = write_file("experts_f32.safetensors", experts, 6) && write_file("latent_f32.safetensors", latent, 9) &&
             write_file("swz_f32.safetensors", swz, 4) && write_file("x_ids.safetensors", x_ids, 3) &&
             write_file("x_l.safetensors", x_l, 1) && write_file("x_h.safetensors", x_h, 1);
    CHECK(ok, "source files written");
    const char *q = "%s quant nvfp4 --tensor w13_weight --tensor w2_weight --input %s/%s --output %s/%s %s";
    CHECK(sh(q, g_k3, g_dir, "experts_f32.safetensors", g_dir, "q_experts.safetensors", "") == 0,
          "k3 quant nvfp4 (experts)");
    CHECK(sh(q, g_k3, g_dir, "latent_f32.safetensors", g_dir, "q_latent.safetensors", "") == 0,
          "k3 quant nvfp4 (latent)");
    CHECK(sh(q, g_k3, g_dir, "swz_f32.safetensors", g_dir, "q_swz.safetensors", "--scale-layout swizzled") == 0,
          "k3 quant nvfp4 --scale-layout swizzled");
    CHECK(sh("%s quant mxfp4 --tensor w13_weight --tensor w2_weight --input %s/swz_f32.safetensors --output "
             "%s/q_mx.safetensors",
             g_k3, g_dir, g_dir) == 0,
          "k3 quant mxfp4");
    /* BF16 experts need no quantization: the F32 values rounded to BF16 */
    static uint16_t w13b[E * 2 * I * L], w2b[E * L * I];
    for (int i = 0; i < E * 2 * I * L; i++) w13b[i] = k3_bf16_from_f32(w13f[i]);
    for (int i = 0; i < E * L * I; i++) w2b[i] = k3_bf16_from_f32(w2f[i]);
    const tensor_spec bf16_experts[] = {{"w13_weight", K3_ST_BF16, 3, {E, 2 * I, L}, w13b},
                                        {"w2_weight", K3_ST_BF16, 3, {E, L, I}, w2b}};
    CHECK(write_file("bf16_experts.safetensors", bf16_experts, 2), "BF16 experts file written");

    /* shared experts of width 0 ([2 * 0, H] and [H, 0]): an error that says what to do, not a silent exit 1 */
    const tensor_spec latent_is0[] = {
        {"w13_weight", K3_ST_F32, 3, {E, 2 * I, L}, w13f},
        {"w2_weight", K3_ST_F32, 3, {E, L, I}, w2f},
        {"gate_weight", K3_ST_BF16, 2, {E, H, 0}, gate_h},
        {"down_proj_weight", K3_ST_BF16, 2, {L, H, 0}, downw},
        {"norm_weight", K3_ST_BF16, 1, {L, 0, 0}, normw},
        {"up_proj_weight", K3_ST_BF16, 2, {H, L, 0}, upw},
        {"shared_gate_up_weight", K3_ST_BF16, 2, {0, H, 0}, sguw},
        {"shared_down_weight", K3_ST_BF16, 2, {H, 0, 0}, sdw},
    };
    CHECK(write_file("latent_is0_f32.safetensors", latent_is0, 8) &&
              sh(q, g_k3, g_dir, "latent_is0_f32.safetensors", g_dir, "q_latent_is0.safetensors", "") == 0,
          "k3 quant nvfp4 (latent, shared width 0)");
    CHECK(sh("%s run moe --weights %s/%s --input %s/%s --output %s/y0.safetensors", g_k3, g_dir,
             "q_latent_is0.safetensors", g_dir, "x_h.safetensors", g_dir) == 1 &&
              stderr_has("has no shared experts"),
          "shared experts of width 0 are refused with a message");

    test_experts("q_experts.safetensors", K3_SCALE_LINEAR);
    test_experts("q_swz.safetensors", K3_SCALE_SWIZZLED);
    test_experts("q_mx.safetensors", K3_SCALE_LINEAR);
    test_experts("bf16_experts.safetensors", K3_SCALE_LINEAR);
    test_separate_scale_2();
    test_routed();
    test_latent();
    test_errors();
    test_audit();

    k3_ctx_destroy(g_ctx);
    if (!getenv("K3_TEST_KEEP_FILES")) sh("rm -rf %s", g_dir); /* our own temporary directory (kept on request) */
    return k3t_finish();
}
