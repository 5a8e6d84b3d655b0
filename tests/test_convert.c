/* k3 convert end to end: synthetic checkpoints in each published layout (tests/ckpt_synth.h), sharded with an
 * index or single-file, with and without prefixes, are converted by the built k3; the output is read back and
 * checked against what the test wrote: bytes for --format keep, and for format changes an fp64 dequantization
 * written here (E2M1, E4M3, UE8M0 decoded from their definitions) of input and output that must agree exactly.
 * Inputs that cannot convert exactly, truncated, mistyped or mis-shaped inputs fail naming the tensor, and
 * leave no output (and an existing output unchanged). */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, truncate */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt_synth.h"
#include "io/safetensors.h"
#include "test_util.h"

static char g_k3[512];
static char g_msg[4096]; /* the last run's stderr */
static char g_out[4096]; /* and its stdout */

static void slurp(const char *path, char *buf, size_t n) {
    buf[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) return;
    const size_t got = fread(buf, 1, n - 1, f);
    buf[got] = '\0';
    fclose(f);
}

/* Runs `k3 convert ARGS`; returns its exit status (-1 when it did not exit normally). */
static int convert(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' convert %s >'%s/stdout.txt' 2>'%s/stderr.txt'", g_k3, args, g_dir, g_dir);
    const int rc = system(cmd);
    char p[400];
    snprintf(p, sizeof p, "%s/stderr.txt", g_dir);
    slurp(p, g_msg, sizeof g_msg);
    snprintf(p, sizeof p, "%s/stdout.txt", g_dir);
    slurp(p, g_out, sizeof g_out);
    return rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* ---- the independent fp64 reference ---- */
static double e2m1(unsigned c) {
    static const double mag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    return (c & 8u ? -1.0 : 1.0) * mag[c & 7u];
}
static double e4m3(uint8_t c) {
    const int e = (c >> 3) & 15, m = c & 7;
    const double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp((double)m, -9);
    return c & 0x80 ? -v : v;
}
/* Element (r, k) of a [rows, cols] FP4 matrix: codes [rows, cols/2], scales [rows, cols/block], scale_2. */
static double deq(int nv, const uint8_t *codes, const uint8_t *sc, double s2, int64_t cols, int64_t r, int64_t k) {
    const uint8_t byte = codes[r * (cols / 2) + k / 2];
    const unsigned c = k & 1 ? byte >> 4 : byte & 15u;
    const int64_t bs = nv ? 16 : 32;
    const uint8_t s = sc[r * (cols / bs) + k / bs];
    return e2m1(c) * (nv ? e4m3(s) * s2 : ldexp(1.0, (int)s - 127));
}

/* The output file's tensor `name`, checked for dtype and shape. */
static const k3_st_tensor *tensor(const k3_st_file *f, const char *name, k3_st_dtype dt, int32_t nd, int64_t a,
                                  int64_t b, int64_t c) {
    const k3_st_tensor *t = k3_st_find(f, name);
    const int64_t sh[3] = {a, b, c};
    int ok = t && t->dtype == dt && t->ndim == nd;
    for (int32_t i = 0; ok && i < nd; i++) ok = t->shape[i] == sh[i];
    CHECK(ok, "output tensor %s: missing or not %s with the expected %d-D shape", name, k3_st_dtype_name(dt), nd);
    return ok ? t : NULL;
}

/* Every element of every expert matrix of the output equals the input's (x, nv_in), exactly. */
static void check_values(const k3_st_file *f, const expect *x, int nv_in, int nv_out, const char *what) {
    const int64_t E = x->E, I = x->I, L = x->L, ob = nv_out ? 16 : 32, ib = nv_in ? 16 : 32;
    const k3_st_dtype sdt = nv_out ? K3_ST_F8_E4M3 : K3_ST_U8;
    const k3_st_tensor *w13 = tensor(f, "w13_weight", K3_ST_U8, 3, E, 2 * I, L / 2);
    const k3_st_tensor *s13 = tensor(f, "w13_weight_scale", sdt, 3, E, 2 * I, L / ob);
    const k3_st_tensor *w2 = tensor(f, "w2_weight", K3_ST_U8, 3, E, L, I / 2);
    const k3_st_tensor *s2 = tensor(f, "w2_weight_scale", sdt, 3, E, L, I / ob);
    const k3_st_tensor *g13 = nv_out ? tensor(f, "w13_weight_scale_2", K3_ST_F32, 2, E, 2, 0) : NULL;
    const k3_st_tensor *g2 = nv_out ? tensor(f, "w2_weight_scale_2", K3_ST_F32, 1, E, 0, 0) : NULL;
    CHECK(nv_out || (!k3_st_find(f, "w13_weight_scale_2") && !k3_st_find(f, "w2_weight_scale_2")),
          "%s: MXFP4 output has no scale_2", what);
    if (!w13 || !s13 || !w2 || !s2 || (nv_out && (!g13 || !g2))) return;
    int64_t bad = 0;
    for (int64_t e = 0; e < E; e++)
        for (int j = 0; j < 3; j++) {
            const int64_t rows = j < 2 ? I : L, cols = j < 2 ? L : I;
            const uint8_t *ic = j < 2 ? x->w13 + (size_t)((e * 2 + j) * rows * cols / 2) : x->w2 + (size_t)(e * rows * cols / 2);
            const uint8_t *is = j < 2 ? x->s13 + (size_t)((e * 2 + j) * rows * cols / ib) : x->s2 + (size_t)(e * rows * cols / ib);
            const double is2 = nv_in ? (double)(j < 2 ? x->g13[e * 2 + j] : x->g2[e]) : 1.0;
            const uint8_t *oc = (const uint8_t *)(j < 2 ? w13->data : w2->data) +
                                (size_t)((j < 2 ? e * 2 + j : e) * rows * cols / 2);
            const uint8_t *os = (const uint8_t *)(j < 2 ? s13->data : s2->data) +
                                (size_t)((j < 2 ? e * 2 + j : e) * rows * cols / ob);
            const double os2 = nv_out ? (double)((const float *)(j < 2 ? g13->data : g2->data))[j < 2 ? e * 2 + j : e]
                                      : 1.0;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t k = 0; k < cols; k++) {
                    const double a = deq(nv_in, ic, is, is2, cols, r, k), b = deq(nv_out, oc, os, os2, cols, r, k);
                    if (a != b && bad++ < 3)
                        CHECK(0, "%s: expert %lld matrix %d (%lld, %lld): input %.17g, output %.17g", what,
                              (long long)e, j, (long long)r, (long long)k, a, b);
                }
        }
    CHECK(bad == 0, "%s: %lld elements differ", what, (long long)bad);
    CHECK(!memcmp(w13->data, x->w13, w13->nbytes) && !memcmp(w2->data, x->w2, w2->nbytes),
          "%s: the E2M1 codes are unchanged", what);
}

/* --format keep: every byte as written, and the fp32 scales as the reader defines them. */
static void check_bytes(const k3_st_file *f, const expect *x, int nv, int inputs, const char *what) {
    const int64_t E = x->E, I = x->I, L = x->L, bs = nv ? 16 : 32;
    const k3_st_dtype sdt = nv ? K3_ST_F8_E4M3 : K3_ST_U8;
    const k3_st_tensor *t[4] = {tensor(f, "w13_weight", K3_ST_U8, 3, E, 2 * I, L / 2),
                                tensor(f, "w13_weight_scale", sdt, 3, E, 2 * I, L / bs),
                                tensor(f, "w2_weight", K3_ST_U8, 3, E, L, I / 2),
                                tensor(f, "w2_weight_scale", sdt, 3, E, L, I / bs)};
    const uint8_t *want[4] = {x->w13, x->s13, x->w2, x->s2};
    for (int k = 0; k < 4; k++)
        if (t[k]) CHECK(!memcmp(t[k]->data, want[k], t[k]->nbytes), "%s: %s bytes", what, t[k]->name);
    if (nv) {
        const k3_st_tensor *g13 = tensor(f, "w13_weight_scale_2", K3_ST_F32, 2, E, 2, 0);
        const k3_st_tensor *g2 = tensor(f, "w2_weight_scale_2", K3_ST_F32, 1, E, 0, 0);
        if (g13) CHECK(!memcmp(g13->data, x->g13, (size_t)E * 2 * 4), "%s: w13_weight_scale_2 (gate, up)", what);
        if (g2) CHECK(!memcmp(g2->data, x->g2, (size_t)E * 4), "%s: w2_weight_scale_2", what);
    }
    if (inputs) {
        const k3_st_tensor *i13 = tensor(f, "w13_input_scale", K3_ST_F32, 2, E, 2, 0);
        const k3_st_tensor *i2 = tensor(f, "w2_input_scale", K3_ST_F32, 1, E, 0, 0);
        if (i13) CHECK(!memcmp(i13->data, x->in13, (size_t)E * 2 * 4), "%s: w13_input_scale", what);
        if (i2) CHECK(!memcmp(i2->data, x->in2, (size_t)E * 4), "%s: w2_input_scale", what);
    } else {
        CHECK(!k3_st_find(f, "w13_input_scale"), "%s: no input scales", what);
    }
    const char *lay = k3_st_metadata_get(f, "k3.quant.scale_layout"), *fm = k3_st_metadata_get(f, "k3.quant.format");
    CHECK(lay && !strcmp(lay, "linear") && fm && !strcmp(fm, nv ? "nvfp4" : "mxfp4"), "%s: metadata %s %s", what,
          lay ? lay : "-", fm ? fm : "-");
}

static k3_st_file *open_out(const char *file) {
    char p[512], err[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, file);
    k3_st_file *f = NULL;
    if (k3_st_open(p, &f, err, sizeof err) != K3_STATUS_SUCCESS) CHECK(0, "open %s: %s", file, err);
    return f;
}

/* No file of the test folder's `sub` has ".k3tmp" in its name (a failed write removes its temporary). */
static int no_temporaries(void) {
    DIR *d = opendir(g_dir);
    if (!d) return 0;
    int clean = 1;
    for (struct dirent *e; (e = readdir(d)) != NULL;) clean &= strstr(e->d_name, ".k3tmp") == NULL;
    closedir(d);
    return clean;
}

static int exists(const char *file) {
    char p[512];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", g_dir, file);
    return stat(p, &sb) == 0;
}

/* The block tensors of a latent-MoE layer: router, shared experts, latent projections (BF16 bit patterns). */
enum { H = 96, IS = 32 };
typedef struct block_data {
    uint16_t gate[8 * H], sg[IS * H], su[IS * H], sd[H * IS], dn[64 * H], norm[64], up[H * 64];
    float bias[8];
} block_data;

static void write_block(k3_st_writer *w, const char *P, int64_t E, int64_t L, block_data *b) {
    fill((uint8_t *)b, sizeof *b, 77);
    for (size_t i = 0; i < sizeof b->gate / 2; i++) b->gate[i] &= 0x3FFF; /* finite BF16 */
    for (size_t i = 0; i < 64; i++) b->norm[i] &= 0x3FFF;
    for (int e = 0; e < 8; e++) b->bias[e] = 0.25f * (float)e;
    char n[300];
    const int64_t g[2] = {E, H}, s[2] = {IS, H}, d[2] = {H, IS}, dn[2] = {L, H}, nm[1] = {L}, up[2] = {H, L};
    snprintf(n, sizeof n, "%sgate.weight", P), add(w, n, K3_ST_BF16, 2, g, b->gate);
    snprintf(n, sizeof n, "%sgate.e_score_correction_bias", P), add(w, n, K3_ST_F32, 1, g, b->bias);
    snprintf(n, sizeof n, "%sshared_experts.gate_proj.weight", P), add(w, n, K3_ST_BF16, 2, s, b->sg);
    snprintf(n, sizeof n, "%sshared_experts.up_proj.weight", P), add(w, n, K3_ST_BF16, 2, s, b->su);
    snprintf(n, sizeof n, "%sshared_experts.down_proj.weight", P), add(w, n, K3_ST_BF16, 2, d, b->sd);
    snprintf(n, sizeof n, "%srouted_expert_down_proj.weight", P), add(w, n, K3_ST_BF16, 2, dn, b->dn);
    snprintf(n, sizeof n, "%srouted_expert_norm.weight", P), add(w, n, K3_ST_BF16, 1, nm, b->norm);
    snprintf(n, sizeof n, "%srouted_expert_up_proj.weight", P), add(w, n, K3_ST_BF16, 2, up, b->up);
}

static void check_block(const k3_st_file *f, const block_data *b, int64_t E, int64_t L, const char *what) {
    const k3_st_tensor *t;
    if ((t = tensor(f, "gate_weight", K3_ST_BF16, 2, E, H, 0))) CHECK(!memcmp(t->data, b->gate, t->nbytes), "%s: gate", what);
    if ((t = tensor(f, "e_score_correction_bias", K3_ST_F32, 1, E, 0, 0)))
        CHECK(!memcmp(t->data, b->bias, t->nbytes), "%s: bias", what);
    if ((t = tensor(f, "shared_gate_up_weight", K3_ST_BF16, 2, 2 * IS, H, 0)))
        CHECK(!memcmp(t->data, b->sg, sizeof b->sg) && !memcmp((const uint8_t *)t->data + sizeof b->sg, b->su, sizeof b->su),
              "%s: shared_gate_up_weight = [gate; up]", what);
    if ((t = tensor(f, "shared_down_weight", K3_ST_BF16, 2, H, IS, 0))) CHECK(!memcmp(t->data, b->sd, t->nbytes), "%s: shared_down", what);
    if ((t = tensor(f, "down_proj_weight", K3_ST_BF16, 2, L, H, 0))) CHECK(!memcmp(t->data, b->dn, t->nbytes), "%s: down_proj", what);
    if ((t = tensor(f, "norm_weight", K3_ST_BF16, 1, L, 0, 0))) CHECK(!memcmp(t->data, b->norm, t->nbytes), "%s: norm", what);
    if ((t = tensor(f, "up_proj_weight", K3_ST_BF16, 2, H, L, 0))) CHECK(!memcmp(t->data, b->up, t->nbytes), "%s: up_proj", what);
}

/* Writes a per-expert checkpoint: one file (split 0) or two shards with an index in folder `sub`. */
static void write_ckpt(const pe_opts *o, const char *sub, expect *x, block_data *b) {
    k3_st_writer *w[2] = {NULL, NULL};
    k3_st_writer_create(&w[0]);
    k3_st_writer_create(&w[1]);
    write_per_expert(w, o, x);
    if (b) write_block(w[0], o->prefix, o->E, o->L, b);
    char dir[300], file[400], path[512];
    snprintf(dir, sizeof dir, "%s/%s", g_dir, sub);
    CHECK(mkdir_p(dir), "mkdir %s", sub);
    if (!o->split) {
        snprintf(file, sizeof file, "%s/model.safetensors", sub);
        CHECK(save(w[0], file, path, sizeof path), "save %s", file);
    } else {
        const char *files[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
        for (int k = 0; k < 2; k++) {
            snprintf(file, sizeof file, "%s/%s", sub, files[k]);
            CHECK(save(w[k], file, path, sizeof path), "save %s", file);
        }
        snprintf(file, sizeof file, "%s/model.safetensors.index.json", sub);
        CHECK(index_of(file, sub, files, 2, NULL), "index %s", file);
    }
    k3_st_writer_destroy(w[0]);
    k3_st_writer_destroy(w[1]);
}

/* Converts g_dir/in (layer) to g_dir/out with --format fmt; 1 when it succeeded. */
static int convert_to(const char *in, int layer, const char *out, const char *fmt, const char *extra) {
    char args[1600];
    snprintf(args, sizeof args, "--input '%s/%s' --layer %d --output '%s/%s' --format %s %s", g_dir, in, layer, g_dir,
             out, fmt, extra ? extra : "");
    const int rc = convert(args);
    CHECK(rc == 0, "convert %s -> %s (%s): exit %d: %s", in, out, fmt, rc, g_msg);
    return rc == 0;
}

static void test_mxfp4_sharded(void) {
    pe_opts o = {CT_MX, "model.layers.3.mlp.", 4, 32, 64, -1, 2, 0, 0.0f, 0, 1, 0};
    expect x;
    block_data *b = calloc(1, sizeof *b);
    write_ckpt(&o, "mx", &x, b);
    k3_st_file *f;
    if (convert_to("mx", 3, "mx_keep.safetensors", "keep", "--json")) {
        CHECK(strstr(g_out, "\"experts\": 4") && strstr(g_out, "\"lossless\": true") &&
                  strstr(g_out, "\"source_format\": \"compressed-tensors MXFP4\"") &&
                  strstr(g_out, "\"block_tensors\": [\"gate_weight\", \"e_score_correction_bias\""),
              "--json summary: %s", g_out);
        if ((f = open_out("mx_keep.safetensors"))) {
            check_bytes(f, &x, 0, 0, "mxfp4 keep");
            check_block(f, b, 4, 64, "mxfp4 keep");
            const char *src = k3_st_metadata_get(f, "k3.convert.source_format"), *ly = k3_st_metadata_get(f, "k3.convert.layer");
            CHECK(src && strstr(src, "MXFP4") && ly && !strcmp(ly, "3"), "source metadata");
            k3_st_close(f);
        }
    }
    if (convert_to("mx", 3, "mx_nv.safetensors", "nvfp4", "--quiet")) {
        CHECK(g_msg[0] == '\0', "--quiet prints nothing: %s", g_msg);
        if ((f = open_out("mx_nv.safetensors"))) {
            check_values(f, &x, 0, 1, "mxfp4 -> nvfp4");
            check_block(f, b, 4, 64, "mxfp4 -> nvfp4");
            const k3_st_tensor *s = k3_st_find(f, "w13_weight_scale");
            if (s) CHECK(((const uint8_t *)s->data)[64 / 16] == 0, "an all-zero block far outside the range: scale 0");
            k3_st_close(f);
        }
        /* and back: the stacked file k3 wrote is an input too; the codes and (non-zero blocks') scales return */
        if (convert_to("mx_nv.safetensors", 3, "mx_back.safetensors", "mxfp4", NULL) &&
            (f = open_out("mx_back.safetensors"))) {
            check_values(f, &x, 0, 0, "mxfp4 -> nvfp4 -> mxfp4");
            check_block(f, b, 4, 64, "round trip");
            k3_st_close(f);
        }
    }
    expect_free(&x);
    free(b);
}

static void test_nvfp4_formats(void) {
    /* compressed-tensors NVFP4, no prefix, one file, with activation scales */
    pe_opts ct = {CT_NV, "", 3, 32, 64, -1, 0, 0, 0.0f, 0, 1, 0};
    expect x;
    write_ckpt(&ct, "ctnv", &x, NULL);
    k3_st_file *f;
    if (convert_to("ctnv", 0, "ctnv_keep.safetensors", "keep", NULL) && (f = open_out("ctnv_keep.safetensors"))) {
        check_bytes(f, &x, 1, 1, "ct nvfp4 keep");
        k3_st_close(f);
    }
    if (convert_to("ctnv/model.safetensors", 7, "ctnv_mx.safetensors", "mxfp4", NULL) &&
        (f = open_out("ctnv_mx.safetensors"))) {
        check_values(f, &x, 1, 0, "ct nvfp4 -> mxfp4");
        CHECK(!k3_st_find(f, "w13_input_scale") && strstr(g_msg, "input) scales"), "input scales dropped, said: %s",
              g_msg);
        k3_st_close(f);
    }
    expect_free(&x);
    /* ModelOpt NVFP4 under the language_model prefix, sharded, gate and up with different global scales */
    pe_opts mo = {MO_NV, "language_model.model.layers.1.mlp.", 4, 32, 64, -1, 3, 0, 0.0f, 0, 1, 0};
    write_ckpt(&mo, "mo", &x, NULL);
    CHECK(x.g13[0] != x.g13[1], "the test writes different gate and up weight_scale_2");
    if (convert_to("mo/model.safetensors.index.json", 1, "mo_keep.safetensors", "nvfp4", NULL) &&
        (f = open_out("mo_keep.safetensors"))) {
        check_bytes(f, &x, 1, 1, "modelopt keep");
        k3_st_close(f);
    }
    if (convert_to("mo", 1, "mo_mx.safetensors", "mxfp4", NULL) && (f = open_out("mo_mx.safetensors"))) {
        check_values(f, &x, 1, 0, "modelopt -> mxfp4");
        k3_st_close(f);
    }
    expect_free(&x);
}

/* A conversion that must fail: exit 1, the words expected, no output, no temporary, `old` left as it was. */
static void expect_fail(const char *in, int layer, const char *fmt, const char *w1, const char *w2) {
    char p[512];
    snprintf(p, sizeof p, "%s/old.safetensors", g_dir);
    FILE *fo = fopen(p, "w");
    if (fo) fputs("old", fo), fclose(fo);
    char args[1600];
    snprintf(args, sizeof args, "--input '%s/%s' --layer %d --output '%s/old.safetensors' --format %s", g_dir, in,
             layer, g_dir, fmt);
    const int rc = convert(args);
    CHECK(rc == 1 && strstr(g_msg, w1) && (!w2 || strstr(g_msg, w2)), "%s (%s): exit %d, message '%s'", in, fmt, rc,
          g_msg);
    char old[16];
    slurp(p, old, sizeof old);
    CHECK(!strcmp(old, "old") && no_temporaries(), "%s: the existing output is unchanged and no temporary is left", in);
    snprintf(args, sizeof args, "--input '%s/%s' --layer %d --output '%s/new.safetensors' --format %s", g_dir, in,
             layer, g_dir, fmt);
    CHECK(convert(args) == 1 && !exists("new.safetensors"), "%s: no output file is left behind", in);
}

/* The E4M3 bound exactly: 17 binades convert, 18 do not. */
static void test_span_bound(void) {
    expect x;
    pe_opts s17 = {CT_MX, "", 2, 32, 64, -1, 0, 0, 0.0f, 0, 2, 0};
    write_ckpt(&s17, "s17", &x, NULL);
    k3_st_file *f;
    if (convert_to("s17", 0, "s17.safetensors", "nvfp4", NULL) && (f = open_out("s17.safetensors"))) {
        check_values(f, &x, 0, 1, "a 17-binade span");
        k3_st_close(f);
    }
    expect_free(&x);
    pe_opts s18 = {CT_MX, "", 2, 32, 64, -1, 0, 0, 0.0f, 0, 3, 0};
    write_ckpt(&s18, "s18", &x, NULL);
    expect_fail("s18", 0, "nvfp4", "experts.0.gate_proj.weight_scale (expert 0)", "18 binades");
    expect_free(&x);
}

static void test_refusals(void) {
    expect x;
    pe_opts wide = {CT_MX, "model.layers.2.mlp.", 2, 32, 64, -1, 0, 0, 0.0f, 0, 0, 0};
    write_ckpt(&wide, "wide", &x, NULL);
    expect_fail("wide", 2, "nvfp4", "'model.layers.2.mlp.experts.0.gate_proj.weight_scale (expert 0)'", "binades");
    CHECK(strstr(g_msg, "not exact") != NULL, "the inexact message says so: %s", g_msg);
    expect_free(&x);
    pe_opts nv = {CT_NV, "", 2, 32, 64, -1, 0, 0, 0.0f, 0, 0, 0};
    write_ckpt(&nv, "nvwide", &x, NULL);
    expect_fail("nvwide", 0, "mxfp4", "experts.0.gate_proj.weight_scale (expert 0)", "not exact");
    expect_free(&x);
    pe_opts dt = {CT_NV, "model.layers.2.mlp.", 2, 32, 64, -1, 0, 1, 0.0f, 0, 1, 0};
    write_ckpt(&dt, "dtype", &x, NULL);
    expect_fail("dtype", 2, "keep", "'model.layers.2.mlp.experts.1.down_proj.weight_scale'", "expected F8_E4M3");
    expect_free(&x);
    pe_opts sh = {CT_MX, "model.layers.2.mlp.", 2, 32, 64, -1, 0, 0, 0.0f, 0, 1, 1};
    write_ckpt(&sh, "shape", &x, NULL);
    expect_fail("shape", 2, "nvfp4", "'model.layers.2.mlp.experts.1.down_proj.weight_packed'", "expected U8 [64, 16]");
    expect_free(&x);
    /* a shard cut short: the header no longer fits the file */
    pe_opts tr = {CT_MX, "model.layers.2.mlp.", 4, 32, 64, -1, 2, 0, 0.0f, 0, 1, 0};
    write_ckpt(&tr, "trunc", &x, NULL);
    char p[512];
    snprintf(p, sizeof p, "%s/trunc/model-00002-of-00002.safetensors", g_dir);
    struct stat sb;
    CHECK(stat(p, &sb) == 0 && truncate(p, sb.st_size - 100) == 0, "truncate");
    expect_fail("trunc", 2, "keep", "model-00002-of-00002.safetensors", "truncated");
    CHECK(strstr(g_msg, "experts.3.down_proj") != NULL, "the truncated tensor is named: %s", g_msg);
    expect_free(&x);
    expect_fail("trunc", 9, "keep", "layer 9", "no MoE");
    expect_fail("does-not-exist", 0, "keep", "does-not-exist", NULL);
}

static void test_usage(void) {
    CHECK(convert("--help") == 0 && strstr(g_out, "--progress") && strstr(g_out, "w13_weight_scale_2") &&
              strstr(g_out, "exit status"),
          "--help: %s", g_out);
    CHECK(convert("") == 2 && strstr(g_msg, "required"), "no arguments: %s", g_msg);
    CHECK(convert("--input a --layer 0 --output b --format fp8") == 2 && strstr(g_msg, "keep, nvfp4 or mxfp4"),
          "bad --format: %s", g_msg);
    CHECK(convert("--input a --layer -1 --output b") == 2, "negative layer: %s", g_msg);
    CHECK(convert("--input a --layer 0 --output b --bogus") == 2 && strstr(g_msg, "--bogus"), "unknown option: %s",
          g_msg);
}

static void run_cases(void) {
    test_usage();
    test_mxfp4_sharded();
    test_nvfp4_formats();
    test_span_bound();
    test_refusals();
}

int main(int argc, char **argv) {
    const char *bin = getenv("K3_BINARY_DIR");
    if (argc > 1) snprintf(g_k3, sizeof g_k3, "%s", argv[1]);
    else if (bin && bin[0]) snprintf(g_k3, sizeof g_k3, "%s/k3", bin);
    else {
        fprintf(stderr, "usage: test_convert PATH/TO/k3 (or K3_BINARY_DIR set)\n");
        return 1;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/k3_convert_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    run_cases();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return k3t_finish();
}
