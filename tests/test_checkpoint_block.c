/* The block tensors of a checkpoint layer (router, shared experts, latent projections): synthetic checkpoints in
 * both namings, with and without prefixes, one file and sharded with an index, read back through
 * k3_ckpt_load_block and compared byte for byte with what was written; and every defect refused with a message
 * naming the tensor. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "test_util.h"

static char g_dir[256];
static char g_err[1024];

enum { BE = 8, BL = 32, BH = 48, BIS = 16 };

/* The tensors written, in host order; data differs per tensor so a swap is seen. */
static uint16_t gate_b[BE * BH], sg[BIS * BH], su[BIS * BH], sd[BH * BIS], dp[BL * BH], nw[BL], up[BH * BL];
static float gate_f[BE * BL], bias[BE];

static void fill16(uint16_t *p, size_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 7u;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (uint16_t)(0x3C00u + ((x >> 16) & 0x7FFu)); /* finite BF16 values near 0.01 .. 2 */
    }
}

static void make_data(void) {
    fill16(gate_b, BE * BH, 1), fill16(sg, BIS * BH, 2), fill16(su, BIS * BH, 3), fill16(sd, BH * BIS, 4);
    fill16(dp, BL * BH, 5), fill16(nw, BL, 6), fill16(up, BH * BL, 7);
    for (int i = 0; i < BE * BL; i++) gate_f[i] = 0.01f * (float)(i % 37) - 0.1f;
    for (int e = 0; e < BE; e++) bias[e] = 0.001f * (float)e;
}

typedef struct spec {
    const char *name; /* after the prefix */
    k3_st_dtype dt;
    int32_t nd;
    int64_t sh[2];
    const void *data;
    int shard; /* 0 or 1 */
} spec;

/* Writes the specs under prefix: one file (nshards 1) or two shards and an index. Returns the path to open. */
static int write_ckpt(const char *sub, const char *prefix, const spec *s, int n, int nshards, char *path, size_t pn) {
    char dir[400], file[600], err[256];
    snprintf(dir, sizeof dir, "%s/%s", g_dir, sub);
    if (mkdir(dir, 0755) != 0) return 0;
    k3_st_writer *w[2] = {NULL, NULL};
    k3_st_writer_create(&w[0]);
    k3_st_writer_create(&w[1]);
    FILE *ix = NULL;
    if (nshards == 2) {
        snprintf(file, sizeof file, "%s/model.safetensors.index.json", dir);
        if (!(ix = fopen(file, "w"))) return 0;
        fprintf(ix, "{\"metadata\": {}, \"weight_map\": {");
    }
    int ok = 1;
    for (int i = 0; i < n; i++) {
        char name[300];
        snprintf(name, sizeof name, "%s%s", prefix, s[i].name);
        const int k = nshards == 2 ? s[i].shard : 0;
        ok = ok && k3_st_writer_add(w[k], name, s[i].dt, s[i].nd, s[i].sh, s[i].data, err, sizeof err) ==
                       K3_STATUS_SUCCESS;
        if (ix) fprintf(ix, "%s\"%s\": \"part-%d.safetensors\"", i ? ", " : "", name, k);
    }
    for (int k = 0; k < nshards; k++) {
        snprintf(file, sizeof file, "%s/part-%d.safetensors", dir, k);
        ok = ok && k3_st_writer_save(w[k], file, err, sizeof err) == K3_STATUS_SUCCESS;
    }
    if (ix) {
        fprintf(ix, "}}\n");
        ok = fclose(ix) == 0 && ok;
    }
    k3_st_writer_destroy(w[0]);
    k3_st_writer_destroy(w[1]);
    snprintf(path, pn, "%s", dir);
    if (!ok) fprintf(stderr, "cannot write %s: %s\n", dir, err);
    return ok;
}

static k3_status load(const char *path, int32_t layer, int64_t e, int64_t l, k3_ckpt_block *b) {
    k3_ckpt *ck = NULL;
    g_err[0] = '\0';
    memset(b, 0, sizeof *b);
    k3_status st = k3_ckpt_open(path, &ck, g_err, sizeof g_err);
    if (st == K3_STATUS_SUCCESS) st = k3_ckpt_load_block(ck, layer, e, l, b, g_err, sizeof g_err);
    k3_ckpt_close(ck);
    return st;
}

/* The published names, all three groups, sharded: router in one shard, the rest in the other. */
static const spec published[] = {
    {"gate.weight", K3_ST_BF16, 2, {BE, BH}, gate_b, 0},
    {"gate.e_score_correction_bias", K3_ST_F32, 1, {BE, 0}, bias, 0},
    {"shared_experts.gate_proj.weight", K3_ST_BF16, 2, {BIS, BH}, sg, 1},
    {"shared_experts.up_proj.weight", K3_ST_BF16, 2, {BIS, BH}, su, 1},
    {"shared_experts.down_proj.weight", K3_ST_BF16, 2, {BH, BIS}, sd, 0},
    {"routed_expert_down_proj.weight", K3_ST_BF16, 2, {BL, BH}, dp, 1},
    {"routed_expert_norm.weight", K3_ST_BF16, 1, {BL, 0}, nw, 1},
    {"routed_expert_up_proj.weight", K3_ST_BF16, 2, {BH, BL}, up, 0},
};
#define NPUB ((int)(sizeof published / sizeof published[0]))

static void test_published(const char *sub, const char *prefix, int nshards) {
    char path[512];
    CHECK(write_ckpt(sub, prefix, published, NPUB, nshards, path, sizeof path), "%s: written", sub);
    k3_ckpt_block b;
    const k3_status st = load(path, 2, BE, BL, &b);
    CHECK(st == K3_STATUS_SUCCESS, "%s: %s", sub, g_err);
    if (st != K3_STATUS_SUCCESS) return;
    const k3_ckpt_block_info *in = &b.info;
    CHECK(!strcmp(in->prefix, prefix), "%s: prefix '%s'", sub, in->prefix);
    CHECK(in->has[K3_CKPT_BLOCK_ROUTER] && in->has[K3_CKPT_BLOCK_SHARED] && in->has[K3_CKPT_BLOCK_LATENT] &&
              in->has_bias && !in->stacked[0] && !in->stacked[1] && !in->stacked[2],
          "%s: groups", sub);
    CHECK(in->hidden == BH && in->latent == BL && in->shared_inter == BIS && in->num_experts == BE,
          "%s: H %lld L %lld Is %lld", sub, (long long)in->hidden, (long long)in->latent,
          (long long)in->shared_inter);
    char want[300];
    snprintf(want, sizeof want, "%sshared_experts.up_proj.weight", prefix);
    CHECK(!strcmp(in->shared_up.name, want), "%s: shared_up named '%s'", sub, in->shared_up.name);
    CHECK(b.gate_dtype == K3_ST_BF16 && b.gate_bytes == sizeof gate_b && !memcmp(b.gate, gate_b, sizeof gate_b),
          "%s: gate", sub);
    CHECK(b.bias && !memcmp(b.bias, bias, sizeof bias), "%s: bias", sub);
    CHECK(b.shared_gate_up_bytes == 2 * sizeof sg && !memcmp(b.shared_gate_up, sg, sizeof sg) &&
              !memcmp(b.shared_gate_up + BIS * BH, su, sizeof su),
          "%s: shared_gate_up = [gate; up]", sub);
    CHECK(b.shared_down_bytes == sizeof sd && !memcmp(b.shared_down, sd, sizeof sd), "%s: shared_down", sub);
    CHECK(!memcmp(b.down_proj, dp, sizeof dp) && !memcmp(b.norm, nw, sizeof nw) && !memcmp(b.up_proj, up, sizeof up),
          "%s: latent projections", sub);
    k3_ckpt_block_free(&b);
    CHECK(b.gate == NULL && b.info.has[0] == 0, "%s: freed and zeroed", sub);
}

/* This library's names, no prefix, an F32 gate and no bias, the latent projections, no shared experts. */
static void test_stacked_names(void) {
    static float gf[BE * BH];
    static uint16_t sgu[2 * BIS * BH];
    for (int i = 0; i < BE * BH; i++) gf[i] = 0.01f * (float)(i % 29);
    fill16(sgu, 2 * BIS * BH, 11);
    const spec t[] = {
        {"gate_weight", K3_ST_F32, 2, {BE, BH}, gf, 0},
        {"down_proj_weight", K3_ST_BF16, 2, {BL, BH}, dp, 0},
        {"norm_weight", K3_ST_BF16, 1, {BL, 0}, nw, 0},
        {"up_proj_weight", K3_ST_BF16, 2, {BH, BL}, up, 0},
        {"shared_gate_up_weight", K3_ST_BF16, 2, {2 * BIS, BH}, sgu, 0},
        {"shared_down_weight", K3_ST_BF16, 2, {BH, BIS}, sd, 0},
    };
    char path[512];
    CHECK(write_ckpt("stacked", "", t, 6, 1, path, sizeof path), "stacked: written");
    k3_ckpt_block b;
    k3_status st = load(path, 0, BE, BL, &b);
    CHECK(st == K3_STATUS_SUCCESS, "stacked names: %s", g_err);
    if (st == K3_STATUS_SUCCESS) {
        CHECK(b.info.has[0] && b.info.has[1] && b.info.has[2] && b.info.stacked[0] && b.info.stacked[1] &&
                  b.info.stacked[2] && !b.info.has_bias && b.bias == NULL,
              "stacked: groups");
        CHECK(b.gate_dtype == K3_ST_F32 && b.gate_bytes == sizeof gf && !memcmp(b.gate, gf, sizeof gf),
              "stacked: F32 gate");
        CHECK(b.shared_gate_up_bytes == sizeof sgu && !memcmp(b.shared_gate_up, sgu, sizeof sgu),
              "stacked: shared_gate_up as written");
        CHECK(b.info.hidden == BH && b.info.shared_inter == BIS, "stacked: H, Is");
    }
    k3_ckpt_block_free(&b);
}

/* A router alone reads the experts' input: [E, L]; a layer without any block tensor has no groups. */
static void test_router_only(void) {
    const spec s[] = {{"gate.weight", K3_ST_F32, 2, {BE, BL}, gate_f, 0},
                      {"gate.e_score_correction_bias", K3_ST_F32, 1, {BE, 0}, bias, 1}};
    char path[512];
    CHECK(write_ckpt("router", "language_model.model.layers.4.mlp.", s, 2, 2, path, sizeof path), "router: written");
    k3_ckpt_block b;
    k3_status st = load(path, 4, BE, BL, &b);
    CHECK(st == K3_STATUS_SUCCESS && b.info.has[0] && !b.info.has[1] && !b.info.has[2] && b.info.hidden == BL &&
              b.shared_down == NULL && b.down_proj == NULL && !memcmp(b.gate, gate_f, sizeof gate_f),
          "router only: %d %s", (int)st, g_err);
    k3_ckpt_block_free(&b);
    st = load(path, 5, BE, BL, &b); /* another layer: nothing there */
    CHECK(st == K3_STATUS_SUCCESS && !b.info.has[0] && !b.info.has[1] && !b.info.has[2] && b.gate == NULL,
          "layer 5 has no block tensors: %d %s", (int)st, g_err);
    k3_ckpt_block_free(&b);
    st = load(path, 4, BE, 2 * BL, &b); /* experts of another L: the router's width disagrees */
    CHECK(st == K3_STATUS_FORMAT_ERROR && strstr(g_err, "'language_model.model.layers.4.mlp.gate.weight'") &&
              strstr(g_err, "expected BF16 or F32 [8, 64]"),
          "gate [E, L] vs another L: %d %s", (int)st, g_err);
    k3_ckpt_block_free(&b);
}

/* One defect per checkpoint: the status and the words the message must hold. */
static void refused(const char *sub, const spec *s, int n, int64_t e, const char *w1, const char *w2) {
    char path[512];
    CHECK(write_ckpt(sub, "model.layers.2.mlp.", s, n, 1, path, sizeof path), "%s: written", sub);
    k3_ckpt_block b;
    const k3_status st = load(path, 2, e, BL, &b);
    CHECK(st == K3_STATUS_FORMAT_ERROR && strstr(g_err, w1) && (!w2 || strstr(g_err, w2)), "%s: %d '%s'", sub,
          (int)st, g_err);
    CHECK(b.gate == NULL && b.shared_gate_up == NULL && b.down_proj == NULL, "%s: nothing left allocated", sub);
}

static void test_refusals(void) {
    spec s[NPUB];
    memcpy(s, published, sizeof s);
    /* a partial group: the norm left out */
    spec p[NPUB - 1];
    for (int i = 0, j = 0; i < NPUB; i++)
        if (strcmp(published[i].name, "routed_expert_norm.weight")) p[j++] = published[i];
    refused("no_norm", p, NPUB - 1, BE, "latent-projection tensors are incomplete",
            "tensor 'model.layers.2.mlp.routed_expert_norm.weight' is missing");
    /* shared up_proj left out */
    for (int i = 0, j = 0; i < NPUB; i++)
        if (strcmp(published[i].name, "shared_experts.up_proj.weight")) p[j++] = published[i];
    refused("no_shared_up", p, NPUB - 1, BE, "shared-expert tensors are incomplete", "shared_experts.up_proj.weight'");
    /* the router for another expert count */
    refused("gate_e", s, NPUB, BE + 1, "'model.layers.2.mlp.gate.weight'", "expected BF16 or F32 [9, 48]");
    /* norm as F32 */
    memcpy(s, published, sizeof s);
    s[6].dt = K3_ST_F32, s[6].sh[0] = BL / 2;
    refused("norm_f32", s, NPUB, BE, "'model.layers.2.mlp.routed_expert_norm.weight'", "expected BF16 [32], found F32");
    /* up_proj of another H */
    memcpy(s, published, sizeof s);
    s[7].sh[0] = BH / 2, s[7].sh[1] = 2 * BL;
    refused("up_h", s, NPUB, BE, "routed_expert_up_proj.weight'", "expected BF16 [48, 32], found BF16 [24, 64]");
    /* the shared experts' width disagreeing between gate and down */
    memcpy(s, published, sizeof s);
    s[2].sh[0] = BIS / 2, s[2].sh[1] = 2 * BH;
    refused("shared_is", s, NPUB, BE, "shared_experts.gate_proj.weight'", "expected BF16 [16, 48]");
    /* the bias of another length */
    memcpy(s, published, sizeof s);
    s[1].sh[0] = BE / 2;
    refused("bias_len", s, NPUB, BE, "gate.e_score_correction_bias'", "expected F32 [8]");
    /* NaN in the gate */
    static uint16_t gnan[BE * BH];
    memcpy(gnan, gate_b, sizeof gnan);
    gnan[5] = 0x7FC0u;
    memcpy(s, published, sizeof s);
    s[0].data = gnan;
    refused("gate_nan", s, NPUB, BE, "'model.layers.2.mlp.gate.weight': element 5 is NaN", NULL);
    /* a group named both ways */
    spec m[NPUB + 1];
    memcpy(m, published, sizeof published);
    m[NPUB] = (spec){"norm_weight", K3_ST_BF16, 1, {BL, 0}, nw, 0};
    refused("mixed", m, NPUB + 1, BE, "named both ways", "'model.layers.2.mlp.norm_weight'");
    /* quantized shared experts: the message says why the BF16 name is missing */
    static uint8_t packed[BIS * BH / 2];
    memcpy(m, published, sizeof published);
    m[2] = (spec){"shared_experts.gate_proj.weight_packed", K3_ST_U8, 2, {BIS, BH / 2}, packed, 0};
    refused("quantized_shared", m, NPUB, BE, "shared_experts.gate_proj.weight' is missing", "must be BF16");
    /* a bias without its gate */
    const spec nb[] = {{"gate.e_score_correction_bias", K3_ST_F32, 1, {BE, 0}, bias, 0}};
    refused("bias_alone", nb, 1, BE, "router tensors are incomplete", "'model.layers.2.mlp.gate.weight' is missing");
    /* a bad argument */
    k3_ckpt_block b;
    k3_status st = load(g_dir, -1, BE, BL, &b);
    CHECK(st != K3_STATUS_SUCCESS, "layer -1 refused");
    CHECK(k3_ckpt_load_block(NULL, 0, BE, BL, &b, g_err, sizeof g_err) == K3_STATUS_INVALID_ARGUMENT,
          "NULL checkpoint");
}

/* The public API (k3.h): stacked MXFP4 experts with the published block tensors, under the layer prefix. */
enum { BI = 32 };
static uint8_t xw13[BE * 2 * BI * BL / 2], xs13[BE * 2 * BI * BL / 32], xw2[BE * BL * BI / 2], xs2[BE * BL * BI / 32];

static void test_public_api(void) {
    for (size_t i = 0; i < sizeof xw13; i++) xw13[i] = (uint8_t)(i * 7u + 1u);
    for (size_t i = 0; i < sizeof xw2; i++) xw2[i] = (uint8_t)(i * 13u + 5u);
    for (size_t i = 0; i < sizeof xs13; i++) xs13[i] = (uint8_t)(120u + i % 9u);
    for (size_t i = 0; i < sizeof xs2; i++) xs2[i] = (uint8_t)(121u + i % 5u);
    spec s[NPUB + 4];
    memcpy(s, published, sizeof published);
    s[NPUB + 0] = (spec){"w13_weight", K3_ST_U8, 3, {0}, xw13, 0};
    s[NPUB + 1] = (spec){"w13_weight_scale", K3_ST_U8, 3, {0}, xs13, 1};
    s[NPUB + 2] = (spec){"w2_weight", K3_ST_U8, 3, {0}, xw2, 1};
    s[NPUB + 3] = (spec){"w2_weight_scale", K3_ST_U8, 3, {0}, xs2, 0};
    /* 3-D shapes do not fit spec's two dims: written here by hand */
    char dir[400], file[600], err[256];
    snprintf(dir, sizeof dir, "%s/api", g_dir);
    CHECK(mkdir(dir, 0755) == 0, "mkdir api");
    k3_st_writer *w = NULL;
    k3_st_writer_create(&w);
    const int64_t sh[4][3] = {{BE, 2 * BI, BL / 2}, {BE, 2 * BI, BL / 32}, {BE, BL, BI / 2}, {BE, BL, BI / 32}};
    for (int i = 0; i < NPUB + 4; i++) {
        char name[300];
        snprintf(name, sizeof name, "model.layers.7.mlp.%s", s[i].name);
        const int k = i - NPUB;
        CHECK(k3_st_writer_add(w, name, s[i].dt, k >= 0 ? 3 : s[i].nd, k >= 0 ? sh[k] : s[i].sh, s[i].data, err,
                               sizeof err) == K3_STATUS_SUCCESS,
              "add %s: %s", name, err);
    }
    snprintf(file, sizeof file, "%s/one.safetensors", dir);
    CHECK(k3_st_writer_save(w, file, err, sizeof err) == K3_STATUS_SUCCESS, "save: %s", err);
    k3_st_writer_destroy(w);

    k3_checkpoint *ck = NULL;
    k3_moe_layer *ly = NULL;
    k3_status st = k3_checkpoint_open(dir, &ck, g_err, sizeof g_err);
    CHECK(st == K3_STATUS_SUCCESS, "k3_checkpoint_open: %s", g_err);
    if (st != K3_STATUS_SUCCESS) return;
    st = k3_checkpoint_load_moe_layer(ck, 7, &ly, g_err, sizeof g_err);
    CHECK(st == K3_STATUS_SUCCESS && ly, "load layer 7: %s", g_err);
    if (ly) {
        CHECK(ly->layer == 7 && ly->source_format == K3_CHECKPOINT_STACKED && ly->fp4 == K3_FP4_MXFP4 &&
                  ly->num_experts == BE && ly->latent == BL && ly->inter == BI && ly->hidden == BH &&
                  ly->shared_inter == BIS,
              "layer facts: fmt %d E %d L %lld I %lld H %lld Is %lld", (int)ly->source_format, ly->num_experts,
              (long long)ly->latent, (long long)ly->inter, (long long)ly->hidden, (long long)ly->shared_inter);
        CHECK(ly->w13_bytes == sizeof xw13 && !memcmp(ly->w13, xw13, sizeof xw13) && !memcmp(ly->w2, xw2, sizeof xw2) &&
                  !memcmp(ly->w13_scale, xs13, sizeof xs13) && !memcmp(ly->w2_scale, xs2, sizeof xs2),
              "experts as written");
        CHECK(!ly->w13_scale_2 && !ly->w2_scale_2 && !ly->w13_input_scale, "MXFP4: no global or input scales");
        CHECK(ly->gate_dtype == K3_DTYPE_BF16 && ly->gate_bytes == sizeof gate_b &&
                  !memcmp(ly->gate, gate_b, sizeof gate_b) &&
                  ly->bias && !memcmp(ly->bias, bias, sizeof bias),
              "router as written");
        CHECK(ly->shared_gate_up && !memcmp(ly->shared_gate_up, sg, sizeof sg) &&
                  !memcmp(ly->shared_gate_up + BIS * BH, su, sizeof su) && !memcmp(ly->shared_down, sd, sizeof sd),
              "shared experts stacked [gate; up]");
        CHECK(!memcmp(ly->down_proj, dp, sizeof dp) && !memcmp(ly->norm, nw, sizeof nw) &&
                  !memcmp(ly->up_proj, up, sizeof up) && ly->norm_bytes == sizeof nw,
              "latent projections as written");
    }
    k3_moe_layer_free(ly);
    ly = NULL;
    st = k3_checkpoint_load_moe_layer(ck, 8, &ly, NULL, 0); /* err may be NULL */
    CHECK(st == K3_STATUS_FORMAT_ERROR && ly == NULL, "layer 8 has no experts: %d", (int)st);
    st = k3_checkpoint_load_moe_layer(ck, 8, &ly, g_err, sizeof g_err);
    CHECK(st == K3_STATUS_FORMAT_ERROR && strstr(g_err, "layer 8"), "layer 8 message: %s", g_err);
    st = k3_checkpoint_load_moe_layer(ck, -2, &ly, g_err, sizeof g_err);
    CHECK(st == K3_STATUS_INVALID_ARGUMENT && strstr(g_err, "layer -2"), "layer -2: %s", g_err);
    k3_checkpoint_close(ck);
    /* experts without a prefix, the block under the layer's: one layer's tensors must share a prefix */
    snprintf(dir, sizeof dir, "%s/api_mixed", g_dir);
    CHECK(mkdir(dir, 0755) == 0, "mkdir api_mixed");
    k3_st_writer_create(&w);
    for (int i = 0; i < NPUB + 4; i++) {
        char name[300];
        const int k = i - NPUB;
        snprintf(name, sizeof name, "%s%s", k >= 0 ? "" : "model.layers.7.mlp.", s[i].name);
        k3_st_writer_add(w, name, s[i].dt, k >= 0 ? 3 : s[i].nd, k >= 0 ? sh[k] : s[i].sh, s[i].data, err,
                         sizeof err);
    }
    snprintf(file, sizeof file, "%s/one.safetensors", dir);
    CHECK(k3_st_writer_save(w, file, err, sizeof err) == K3_STATUS_SUCCESS, "save: %s", err);
    k3_st_writer_destroy(w);
    st = k3_checkpoint_open(dir, &ck, g_err, sizeof g_err);
    if (st == K3_STATUS_SUCCESS) st = k3_checkpoint_load_moe_layer(ck, 7, &ly, g_err, sizeof g_err);
    CHECK(st == K3_STATUS_FORMAT_ERROR && ly == NULL && strstr(g_err, "must share a prefix"), "mixed prefixes: %s",
          g_err);
    k3_checkpoint_close(ck);
    /* stacked experts under "<layer prefix>experts.", the block under the layer prefix: one layer */
    snprintf(dir, sizeof dir, "%s/api_experts_dot", g_dir);
    CHECK(mkdir(dir, 0755) == 0, "mkdir api_experts_dot");
    k3_st_writer_create(&w);
    for (int i = 0; i < NPUB + 4; i++) {
        char name[300];
        const int k = i - NPUB;
        snprintf(name, sizeof name, "model.layers.7.mlp.%s%s", k >= 0 ? "experts." : "", s[i].name);
        k3_st_writer_add(w, name, s[i].dt, k >= 0 ? 3 : s[i].nd, k >= 0 ? sh[k] : s[i].sh, s[i].data, err,
                         sizeof err);
    }
    snprintf(file, sizeof file, "%s/one.safetensors", dir);
    CHECK(k3_st_writer_save(w, file, err, sizeof err) == K3_STATUS_SUCCESS, "save: %s", err);
    k3_st_writer_destroy(w);
    ly = NULL;
    st = k3_checkpoint_open(dir, &ck, g_err, sizeof g_err);
    if (st == K3_STATUS_SUCCESS) st = k3_checkpoint_load_moe_layer(ck, 7, &ly, g_err, sizeof g_err);
    CHECK(st == K3_STATUS_SUCCESS && ly && ly->gate && ly->down_proj && ly->num_experts == BE,
          "stacked experts under 'experts.', block beside them: %s", g_err);
    k3_moe_layer_free(ly);
    ly = NULL;
    k3_checkpoint_close(ck);
    CHECK(k3_checkpoint_open(NULL, &ck, g_err, sizeof g_err) == K3_STATUS_INVALID_ARGUMENT && ck == NULL,
          "NULL path: %s", g_err);
    char tiny[8];
    CHECK(k3_checkpoint_open("/nonexistent/ck", &ck, tiny, sizeof tiny) == K3_STATUS_IO_ERROR &&
              strlen(tiny) == sizeof tiny - 1,
          "a short err buffer is filled and terminated");
    k3_checkpoint_close(NULL);
    k3_moe_layer_free(NULL);
}

int main(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/k3_ckblk_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    make_data();
    test_published("pub_sharded", "model.layers.2.mlp.", 2);
    test_published("pub_single", "", 1);
    test_published("pub_lm", "language_model.model.layers.2.mlp.", 1);
    test_stacked_names();
    test_router_only();
    test_refusals();
    test_public_api();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return k3t_finish();
}
