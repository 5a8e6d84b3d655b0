/* The checkpoint reader: synthetic checkpoints in each published MoE layout, written with the library's writer,
 * read back through k3_ckpt_load_moe and compared with what was written (byte for byte for codes and block scales,
 * exactly for the fp32 scales); and every bad input refused with a message. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "ckpt_synth.h"
#include "test_util.h"

static char g_err[1024];

static void compare(const k3_ckpt_moe *m, const expect *x, int nv, int inputs, const char *what) {
    const int64_t bs = nv ? 16 : 32;
    CHECK(m->num_experts == x->E && m->inter == x->I && m->hidden == x->L, "%s: E, I, L = %lld %lld %lld", what,
          (long long)m->num_experts, (long long)m->inter, (long long)m->hidden);
    if (m->num_experts != x->E || m->inter != x->I || m->hidden != x->L) return;
    const size_t b13 = (size_t)(x->E * 2 * x->I * x->L / 2), c13 = (size_t)(x->E * 2 * x->I * x->L / bs);
    const size_t b2 = (size_t)(x->E * x->L * x->I / 2), c2 = (size_t)(x->E * x->L * x->I / bs);
    CHECK(m->w13_bytes == b13 && m->w13_scale_bytes == c13 && m->w2_bytes == b2 && m->w2_scale_bytes == c2,
          "%s: buffer sizes", what);
    CHECK(!memcmp(m->w13, x->w13, b13), "%s: w13 codes differ", what);
    CHECK(!memcmp(m->w13_scale, x->s13, c13), "%s: w13 block scales differ", what);
    CHECK(!memcmp(m->w2, x->w2, b2), "%s: w2 codes differ", what);
    CHECK(!memcmp(m->w2_scale, x->s2, c2), "%s: w2 block scales differ", what);
    CHECK(m->fp4 == (nv ? K3_FP4_NVFP4 : K3_FP4_MXFP4), "%s: fp4 format", what);
    if (nv) {
        CHECK(m->w13_scale_2 && m->w2_scale_2, "%s: scale_2 buffers", what);
        if (m->w13_scale_2 && m->w2_scale_2) {
            CHECK(!memcmp(m->w13_scale_2, x->g13, (size_t)x->E * 2 * sizeof(float)), "%s: w13_scale_2 %g %g", what,
                  (double)m->w13_scale_2[0], (double)x->g13[0]);
            CHECK(!memcmp(m->w2_scale_2, x->g2, (size_t)x->E * sizeof(float)), "%s: w2_scale_2", what);
        }
    } else {
        CHECK(!m->w13_scale_2 && !m->w2_scale_2, "%s: MXFP4 has no scale_2", what);
    }
    CHECK(m->info.has_input_scale == inputs, "%s: has_input_scale %d", what, m->info.has_input_scale);
    if (inputs && m->w13_input_scale && m->w2_input_scale) {
        CHECK(!memcmp(m->w13_input_scale, x->in13, (size_t)x->E * 2 * sizeof(float)), "%s: w13_input_scale", what);
        CHECK(!memcmp(m->w2_input_scale, x->in2, (size_t)x->E * sizeof(float)), "%s: w2_input_scale", what);
    }
}

/* Opens path, loads layer; returns the status, message in g_err. */
static k3_status open_load(const char *path, int32_t layer, k3_ckpt_moe *m) {
    k3_ckpt *ck = NULL;
    g_err[0] = '\0';
    memset(m, 0, sizeof *m);
    k3_status st = k3_ckpt_open(path, &ck, g_err, sizeof g_err);
    if (st == K3_STATUS_SUCCESS) st = k3_ckpt_load_moe(ck, layer, m, g_err, sizeof g_err);
    k3_ckpt_close(ck);
    return st;
}

static void test_ct_mxfp4(void) {
    k3_st_writer *w[2] = {NULL, NULL};
    k3_st_writer_create(&w[0]);
    pe_opts o = {CT_MX, "model.layers.3.mlp.", 3, 32, 64, -1, 0, 0, 0.0f, 0, 0, 0};
    expect x;
    write_per_expert(w, &o, &x);
    char path[512];
    CHECK(save(w[0], "ct_mx.safetensors", path, sizeof path), "save");
    k3_ckpt_moe m;
    k3_status st = open_load(path, 3, &m);
    CHECK(st == K3_STATUS_SUCCESS, "ct mxfp4: %s", g_err);
    CHECK(m.info.format == K3_CKPT_MOE_CT_MXFP4 && m.info.num_experts == 3 &&
              !strcmp(m.info.prefix, "model.layers.3.mlp."),
          "ct mxfp4: detected %d E %d prefix '%s'", (int)m.info.format, m.info.num_experts, m.info.prefix);
    if (st == K3_STATUS_SUCCESS) compare(&m, &x, 0, 0, "ct mxfp4");
    k3_ckpt_moe_free(&m);
    st = open_load(path, 4, &m);
    CHECK(st == K3_STATUS_FORMAT_ERROR && strstr(g_err, "layer 4") && strstr(g_err, "no MoE"), "layer 4: %d %s",
          (int)st, g_err);
    k3_ckpt_moe_free(&m);
    expect_free(&x);
    k3_st_writer_destroy(w[0]);
}

static void test_ct_nvfp4(void) {
    k3_st_writer *w[2] = {NULL, NULL};
    k3_st_writer_create(&w[0]);
    pe_opts o = {CT_NV, "language_model.model.layers.1.mlp.", 2, 16, 32, -1, 0, 0, 0.0f, 0, 0, 0};
    expect x;
    write_per_expert(w, &o, &x);
    char sub[300], path[512];
    snprintf(sub, sizeof sub, "%s/ctnv", g_dir);
    CHECK(mkdir_p(sub), "mkdir");
    CHECK(save(w[0], "ctnv/only.safetensors", path, sizeof path), "save");
    k3_ckpt_moe m;
    k3_status st = open_load(sub, 1, &m); /* a folder with one safetensors file and no index */
    CHECK(st == K3_STATUS_SUCCESS, "ct nvfp4: %s", g_err);
    CHECK(m.info.format == K3_CKPT_MOE_CT_NVFP4 && m.info.num_experts == 2, "ct nvfp4: detected %d E %d",
          (int)m.info.format, m.info.num_experts);
    if (st == K3_STATUS_SUCCESS) {
        compare(&m, &x, 1, 1, "ct nvfp4");
        /* a global scale of 448 is a scale_2 of 1/448 in fp32: 0x3B124925 */
        uint32_t bits = 0;
        memcpy(&bits, &m.w13_scale_2[0], sizeof bits);
        CHECK(bits == 0x3B124925u, "1/448 as fp32: 0x%08X", (unsigned)bits);
        CHECK(m.w13_scale_2[0] == 1.0f / 448.0f, "1/448: %.9g", (double)m.w13_scale_2[0]);
        CHECK(m.w13_scale_2[1] != m.w13_scale_2[0], "gate and up scale_2 kept apart");
    }
    k3_ckpt_moe_free(&m);
    expect_free(&x);
    k3_st_writer_destroy(w[0]);
}


static void test_modelopt_sharded(void) {
    k3_st_writer *w[2] = {NULL, NULL};
    k3_st_writer_create(&w[0]);
    k3_st_writer_create(&w[1]);
    pe_opts o = {MO_NV, "model.layers.0.mlp.", 4, 16, 32, -1, 2, 0, 0.0f, 0, 0, 0};
    expect x;
    write_per_expert(w, &o, &x);
    char sub[300], path[512];
    snprintf(sub, sizeof sub, "%s/mo", g_dir);
    CHECK(mkdir_p(sub), "mkdir");
    CHECK(save(w[0], "mo/model-00001-of-00002.safetensors", path, sizeof path), "save 1");
    CHECK(save(w[1], "mo/model-00002-of-00002.safetensors", path, sizeof path), "save 2");
    const char *files[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    CHECK(index_of("mo/model.safetensors.index.json", "mo", files, 2, NULL), "index");
    CHECK(x.g13[0] != x.g13[1], "the test writes different gate and up weight_scale_2");
    k3_ckpt_moe m;
    k3_status st = open_load(sub, 0, &m); /* the folder: its index */
    CHECK(st == K3_STATUS_SUCCESS, "modelopt sharded (folder): %s", g_err);
    CHECK(m.info.format == K3_CKPT_MOE_MODELOPT_NVFP4 && m.info.num_experts == 4, "modelopt: detected %d E %d",
          (int)m.info.format, m.info.num_experts);
    if (st == K3_STATUS_SUCCESS) compare(&m, &x, 1, 1, "modelopt sharded");
    k3_ckpt_moe_free(&m);
    snprintf(path, sizeof path, "%s/mo/model.safetensors.index.json", g_dir);
    st = open_load(path, 0, &m); /* the index file itself */
    CHECK(st == K3_STATUS_SUCCESS, "modelopt sharded (index): %s", g_err);
    if (st == K3_STATUS_SUCCESS) compare(&m, &x, 1, 1, "modelopt via index");
    k3_ckpt_moe_free(&m);

    /* the same shards with an index that puts the second shard's tensors in a file that is not there */
    CHECK(index_of("mo/missing.index.json", "mo", files, 2, "absent-shard.safetensors"), "index");
    snprintf(path, sizeof path, "%s/mo/missing.index.json", g_dir);
    k3_ckpt *ck = NULL;
    st = k3_ckpt_open(path, &ck, g_err, sizeof g_err);
    CHECK(st == K3_STATUS_SUCCESS, "the index opens (shards are read on demand): %s", g_err);
    memset(&m, 0, sizeof m);
    if (st == K3_STATUS_SUCCESS) {
        st = k3_ckpt_load_moe(ck, 0, &m, g_err, sizeof g_err);
        CHECK(st == K3_STATUS_IO_ERROR && strstr(g_err, "absent-shard.safetensors"), "missing shard: %d %s", (int)st,
              g_err);
        CHECK(m.w13 == NULL, "nothing is left allocated on failure");
    }
    k3_ckpt_close(ck);
    /* a shard listed for a tensor it does not hold */
    const char *names[1] = {"model.layers.0.mlp.experts.0.gate_proj.weight"};
    const char *shards[1] = {"model-00002-of-00002.safetensors"};
    CHECK(write_index("mo/wrong.index.json", names, shards, 1), "index");
    snprintf(path, sizeof path, "%s/mo/wrong.index.json", g_dir);
    st = k3_ckpt_open(path, &ck, g_err, sizeof g_err);
    if (st == K3_STATUS_SUCCESS) {
        const k3_st_tensor *t = NULL;
        st = k3_ckpt_find(ck, names[0], &t, g_err, sizeof g_err);
        CHECK(st == K3_STATUS_FORMAT_ERROR && t == NULL && strstr(g_err, "does not hold"), "wrong shard: %d %s",
              (int)st, g_err);
        st = k3_ckpt_find(ck, "not.there", &t, g_err, sizeof g_err);
        CHECK(st == K3_STATUS_FORMAT_ERROR && strstr(g_err, "not.there"), "absent name: %d %s", (int)st, g_err);
    }
    k3_ckpt_close(ck);
    expect_free(&x);
    k3_st_writer_destroy(w[0]);
    k3_st_writer_destroy(w[1]);
}

static void test_stacked(int nv, int pair, const char *prefix, const char *layout_meta) {
    const int64_t E = 3, I = nv ? 16 : 32, L = nv ? 32 : 64, bs = nv ? 16 : 32;
    k3_st_writer *w = NULL;
    k3_st_writer_create(&w);
    expect x;
    memset(&x, 0, sizeof x);
    x.E = E, x.I = I, x.L = L;
    const size_t b13 = (size_t)(E * 2 * I * L / 2), c13 = (size_t)(E * 2 * I * L / bs);
    const size_t b2 = (size_t)(E * L * I / 2), c2 = (size_t)(E * L * I / bs);
    x.w13 = malloc(b13), x.s13 = malloc(c13), x.w2 = malloc(b2), x.s2 = malloc(c2);
    fill(x.w13, b13, 1), fill(x.s13, c13, 2), fill(x.w2, b2, 3), fill(x.s2, c2, 4);
    for (size_t i = 0; i < c13; i++) x.s13[i] &= 0x7E;
    for (size_t i = 0; i < c2; i++) x.s2[i] &= 0x7E;
    char name[300];
    const k3_st_dtype sdt = nv ? K3_ST_F8_E4M3 : K3_ST_U8;
    const int64_t sh_w13[3] = {E, 2 * I, L / 2}, sh_s13[3] = {E, 2 * I, L / bs}, sh_w2[3] = {E, L, I / 2},
                  sh_s2[3] = {E, L, I / bs};
    snprintf(name, sizeof name, "%sw13_weight", prefix), add(w, name, K3_ST_U8, 3, sh_w13, x.w13);
    snprintf(name, sizeof name, "%sw13_weight_scale", prefix), add(w, name, sdt, 3, sh_s13, x.s13);
    snprintf(name, sizeof name, "%sw2_weight", prefix), add(w, name, K3_ST_U8, 3, sh_w2, x.w2);
    snprintf(name, sizeof name, "%sw2_weight_scale", prefix), add(w, name, sdt, 3, sh_s2, x.s2);
    x.g13 = calloc((size_t)E * 2, sizeof(float)), x.g2 = calloc((size_t)E, sizeof(float));
    x.in13 = calloc((size_t)E * 2, sizeof(float)), x.in2 = calloc((size_t)E, sizeof(float));
    if (nv) {
        float g13[6], g2[3], i13[6], i2[3];
        for (int e = 0; e < 3; e++) {
            g13[e * 2] = 0.5f + (float)e, g13[e * 2 + 1] = pair ? 0.75f + (float)e : g13[e * 2];
            i13[e * 2] = 3.0f + (float)e, i13[e * 2 + 1] = pair ? 5.0f + (float)e : i13[e * 2];
            g2[e] = 0.125f * (float)(e + 1), i2[e] = 7.0f + (float)e;
        }
        float g13s[3] = {g13[0], g13[2], g13[4]}, i13s[3] = {i13[0], i13[2], i13[4]};
        const int64_t sp[2] = {E, 2};
        snprintf(name, sizeof name, "%sw13_weight_scale_2", prefix);
        add(w, name, K3_ST_F32, pair ? 2 : 1, sp, pair ? g13 : g13s);
        snprintf(name, sizeof name, "%sw2_weight_scale_2", prefix), add(w, name, K3_ST_F32, 1, sp, g2);
        snprintf(name, sizeof name, "%sw13_input_scale", prefix);
        add(w, name, K3_ST_F32, pair ? 2 : 1, sp, pair ? i13 : i13s);
        snprintf(name, sizeof name, "%sw2_input_scale", prefix), add(w, name, K3_ST_F32, 1, sp, i2);
        memcpy(x.g13, g13, sizeof g13), memcpy(x.g2, g2, sizeof g2);
        memcpy(x.in13, i13, sizeof i13), memcpy(x.in2, i2, sizeof i2);
    }
    if (layout_meta) {
        char err[128];
        CHECK(k3_st_writer_set_metadata(w, "k3.quant.scale_layout", layout_meta, err, sizeof err) == K3_STATUS_SUCCESS,
              "metadata: %s", err);
    }
    char path[512], what[96];
    snprintf(what, sizeof what, "stacked %s %s '%s'", nv ? "nvfp4" : "mxfp4", pair ? "[E,2]" : "[E]", prefix);
    char file[64];
    snprintf(file, sizeof file, "stacked_%d_%d_%d_%d.safetensors", nv, pair, prefix[0] != 0, layout_meta != NULL);
    CHECK(save(w, file, path, sizeof path), "save");
    k3_ckpt_moe m;
    k3_status st = open_load(path, 5, &m);
    if (layout_meta && strcmp(layout_meta, "linear")) {
        CHECK(st == K3_STATUS_FORMAT_ERROR && strstr(g_err, "scale_layout is 'swizzled'") && m.w13 == NULL,
              "%s labelled %s: %d '%s'", what, layout_meta, (int)st, g_err);
        k3_ckpt_moe_free(&m);
        expect_free(&x);
        k3_st_writer_destroy(w);
        return;
    }
    CHECK(st == K3_STATUS_SUCCESS, "%s: %s", what, g_err);
    CHECK(m.info.format == K3_CKPT_MOE_STACKED && m.info.num_experts == 3, "%s: detected %d E %d", what,
          (int)m.info.format, m.info.num_experts);
    if (st == K3_STATUS_SUCCESS) compare(&m, &x, nv, nv, what);
    k3_ckpt_moe_free(&m);
    expect_free(&x);
    k3_st_writer_destroy(w);
}

/* Writes a per-expert checkpoint with a defect and checks that loading it fails with the words expected. */
static void expect_refused(pe_opts o, const char *file, k3_status want_st, const char *w1, const char *w2) {
    k3_st_writer *w[2] = {NULL, NULL};
    k3_st_writer_create(&w[0]);
    expect x;
    write_per_expert(w, &o, &x);
    char path[512];
    CHECK(save(w[0], file, path, sizeof path), "save");
    k3_ckpt_moe m;
    const k3_status st = open_load(path, 2, &m);
    CHECK(st == want_st && strstr(g_err, w1) && (!w2 || strstr(g_err, w2)), "%s: status %d, message '%s'", file,
          (int)st, g_err);
    CHECK(m.w13 == NULL && m.w2_scale_2 == NULL, "%s: nothing left allocated", file);
    expect_free(&x);
    k3_st_writer_destroy(w[0]);
}

static void test_refusals(void) {
    pe_opts gap = {CT_MX, "model.layers.2.mlp.", 3, 32, 64, 1, 0, 0, 0.0f, 0, 0, 0};
    expect_refused(gap, "gap.safetensors", K3_STATUS_FORMAT_ERROR, "expert 1 is missing",
                   "model.layers.2.mlp.experts.1.");
    pe_opts dt = {CT_NV, "model.layers.2.mlp.", 2, 16, 32, -1, 0, 1, 0.0f, 0, 0, 0};
    expect_refused(dt, "dtype.safetensors", K3_STATUS_FORMAT_ERROR,
                   "'model.layers.2.mlp.experts.1.down_proj.weight_scale'", "expected F8_E4M3");
    pe_opts zero = {CT_NV, "", 2, 16, 32, -1, 0, 0, -1.0f, 0, 0, 0};
    expect_refused(zero, "zero_global.safetensors", K3_STATUS_FORMAT_ERROR, "experts.0.up_proj.weight_global_scale",
                   "positive finite");
    /* 1e-40 is an fp32 subnormal: its reciprocal is beyond fp32 */
    pe_opts tiny = {CT_NV, "", 2, 16, 32, -1, 0, 0, 1e-40f, 0, 0, 0};
    expect_refused(tiny, "tiny_global.safetensors", K3_STATUS_FORMAT_ERROR, "experts.0.up_proj.weight_global_scale",
                   "reciprocal");

    pe_opts nan_nv = {CT_NV, "", 2, 16, 32, -1, 0, 0, 0.0f, 1, 0, 0};
    expect_refused(nan_nv, "nan_nv.safetensors", K3_STATUS_FORMAT_ERROR, "'experts.0.up_proj.weight_scale'",
                   "row 15, block 1) is NaN (0x7F)");
    pe_opts nan_mx = {CT_MX, "model.layers.2.mlp.", 1, 32, 64, -1, 0, 0, 0.0f, 1, 0, 0};
    expect_refused(nan_mx, "nan_mx.safetensors", K3_STATUS_FORMAT_ERROR, "experts.0.up_proj.weight_scale'",
                   "row 31, block 1) is NaN (0xFF)");

    /* index shard paths that leave the folder */
    const char *names[2] = {"a", "b"};
    const char *evil1[2] = {"ok.safetensors", "../evil.safetensors"};
    const char *evil2[2] = {"/etc/evil.safetensors", "ok.safetensors"};
    const char *evil3[2] = {"sub/../../evil.safetensors", "ok.safetensors"};
    const char *const *sets[3] = {evil1, evil2, evil3};
    const char *words[3] = {"'..'", "absolute", "'..'"};
    for (int k = 0; k < 3; k++) {
        char file[64], path[512];
        snprintf(file, sizeof file, "evil%d.index.json", k);
        CHECK(write_index(file, names, sets[k], 2), "index");
        snprintf(path, sizeof path, "%s/%s", g_dir, file);
        k3_ckpt *ck = NULL;
        g_err[0] = '\0';
        const k3_status st = k3_ckpt_open(path, &ck, g_err, sizeof g_err);
        CHECK(st == K3_STATUS_FORMAT_ERROR && ck == NULL && strstr(g_err, words[k]) && strstr(g_err, "evil"),
              "shard path %d: %d '%s'", k, (int)st, g_err);
        k3_ckpt_close(ck);
    }
    /* malformed indexes */
    const char *bad[4] = {"{\"metadata\": {}}", "{\"weight_map\": {\"a\": 3}}",
                          "{\"weight_map\": {\"a\": \"x.safetensors\", \"a\": \"y.safetensors\"}}",
                          "{\"weight_map\": {\"a\": \"x.safetensors\"}"};
    const char *bad_words[4] = {"no weight_map", "must be strings", "twice", "expected"};
    for (int k = 0; k < 4; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/bad%d.json", g_dir, k);
        FILE *f = fopen(path, "w");
        if (f) fputs(bad[k], f), fclose(f);
        k3_ckpt *ck = NULL;
        const k3_status st = k3_ckpt_open(path, &ck, g_err, sizeof g_err);
        CHECK(st == K3_STATUS_FORMAT_ERROR && strstr(g_err, bad_words[k]) && strstr(g_err, "JSON at byte"),
              "bad index %d: %d '%s'", k, (int)st, g_err);
        k3_ckpt_close(ck);
    }
    /* a folder with two safetensors files and no index */
    char sub[300];
    snprintf(sub, sizeof sub, "%s/two", g_dir);
    CHECK(mkdir_p(sub), "mkdir");
    k3_st_writer *w = NULL;
    k3_st_writer_create(&w);
    const int64_t one[1] = {1};
    const float v = 1.0f;
    add(w, "x", K3_ST_F32, 1, one, &v);
    char path[512];
    CHECK(save(w, "two/a.safetensors", path, sizeof path) && save(w, "two/b.safetensors", path, sizeof path), "save");
    k3_st_writer_destroy(w);
    k3_ckpt *ck = NULL;
    k3_status st = k3_ckpt_open(sub, &ck, g_err, sizeof g_err);
    CHECK(st == K3_STATUS_FORMAT_ERROR && strstr(g_err, "2 *.safetensors"), "two files: %d '%s'", (int)st, g_err);
    k3_ckpt_close(ck);
    snprintf(path, sizeof path, "%s/does-not-exist", g_dir);
    st = k3_ckpt_open(path, &ck, g_err, sizeof g_err);
    CHECK(st == K3_STATUS_IO_ERROR && strstr(g_err, "does-not-exist"), "absent path: %d '%s'", (int)st, g_err);
}

int main(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/k3_ckpt_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_ct_mxfp4();
    test_ct_nvfp4();
    test_modelopt_sharded();
    test_stacked(1, 1, "", "linear");
    test_stacked(1, 0, "model.layers.5.mlp.experts.", NULL);
    test_stacked(0, 0, "model.layers.5.mlp.", NULL);
    test_stacked(0, 0, "", "swizzled");
    test_refusals();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return k3t_finish();
}
