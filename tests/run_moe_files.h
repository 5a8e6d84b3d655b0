/* The files of the `k3 run moe` tests (test_run_moe_file.c, test_run_moe_audit.c): a temporary folder, the k3
 * binary, small F32 sources written as safetensors and quantized by `k3 quant` itself, and shell helpers. */
#ifndef K3_TESTS_RUN_MOE_FILES_H
#define K3_TESTS_RUN_MOE_FILES_H

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

static inline void path_of(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", g_dir, name); }

/* Runs a shell command (stdout to /dev/null, stderr to g_dir/stderr.txt); returns its exit status. */
static inline int sh(const char *fmt, ...) {
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
static inline int stderr_has(const char *s) {
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

static inline int write_file(const char *name, const tensor_spec *ts, int n) {
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

static inline k3_st_file *open_file(const char *name) {
    char p[128], err[512];
    path_of(p, sizeof p, name);
    k3_st_file *f = NULL;
    if (k3_st_open(p, &f, err, sizeof err) != K3_STATUS_SUCCESS) fprintf(stderr, "cannot open %s: %s\n", p, err);
    return f;
}

static inline const void *data_of(const k3_st_file *f, const char *name) {
    const k3_st_tensor *t = f ? k3_st_find(f, name) : NULL;
    return t ? t->data : NULL;
}

/* The source tensors (F32 experts before quantization, BF16 dense tensors). */
static float w13f[E * 2 * I * L], w2f[E * L * I], in13[E], in2[E], biasv[E];
static uint16_t gate_l[E * L], gate_h[E * H], downw[L * H], normw[L], upw[H * L], sguw[2 * IS * H], sdw[H * IS];
static uint16_t xl[M * L], xh[M * H];
static int32_t ids_in[M * K];
static float wts_in[M * K];

static inline void make_sources(k3t_rng *r) {
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

/* Copies file src to dst with n bytes at byte offset off of tensor tname replaced by bytes; 1 on success. */
static inline int copy_patched(const char *src, const char *dst, const char *tname, size_t off, const void *bytes, size_t n) {
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
static inline int same_bytes(const char *a, const char *b) {
    char c[512];
    snprintf(c, sizeof c, "cmp -s %s/%s %s/%s", g_dir, a, g_dir, b);
    return system(c) == 0;
}

/* Makes the folder, finds k3, writes and quantizes the source files. 0 when ready, 77 (skip) without
 * K3_BINARY_DIR, 1 on failure. */
static inline int run_moe_files_setup(void) {
    const char *bin = getenv("K3_BINARY_DIR");
    if (!bin) {
        printf("SKIPPED: K3_BINARY_DIR is not set (run through ctest)\n");
        return 77;
    }
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
    return 0;
}

/* Removes the temporary folder (kept when K3_TEST_KEEP_FILES is set). */
static inline void run_moe_files_done(void) {
    k3_ctx_destroy(g_ctx);
    if (!getenv("K3_TEST_KEEP_FILES")) sh("rm -rf %s", g_dir); /* our own temporary directory (kept on request) */
}

#endif
