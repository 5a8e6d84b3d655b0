/*
 * `k3 run moe --weights CKPT --layer N` end to end: the experts `k3 quant` wrote (tests/run_moe_files.h) are
 * rewritten by this test into every published checkpoint layout (compressed-tensors MXFP4 and NVFP4, ModelOpt
 * NVFP4 with gate and up carrying their own weight_scale_2 and input_scale, this library's stacked names), with
 * and without the two prefixes, in one file or sharded with an index, some with the router and the latent block's
 * tensors under their published names. The CLI's output is compared with an fp64 evaluation of the same math
 * (tests/ref_moe.h; rel-L2 <= 1e-2, routing identical), and broken checkpoints must fail with exit 1, a message
 * naming the tensor, and no output file.
 * The device comes from K3_TEST_DEVICE (cpu, the default, or cuda; skipped when cuda has no GPU).
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, access, truncate */
#include <sys/stat.h>

#include "run_moe_files.h"

static const char *g_dev = "cpu";

enum { CT_MX, CT_NV, MO_NV, STACKED };
enum { BLOCK_NONE, BLOCK_ROUTER, BLOCK_LATENT, BLOCK_ROUTER_SHARED /* shared experts without latent tensors */ };

/* One tensor to write: a name (prefix included), its header and a private copy of its data. */
typedef struct out_tensor {
    char name[200];
    k3_st_dtype dt;
    int32_t nd;
    int64_t sh[3];
    void *data;
    int shard;
} out_tensor;

typedef struct layer_files {
    out_tensor t[512];
    int n;
} layer_files;

static void put(layer_files *lf, int shard, const char *prefix, const char *name, k3_st_dtype dt, int32_t nd,
                int64_t d0, int64_t d1, int64_t d2, const void *src, size_t bytes) {
    if (lf->n >= 512) return;
    out_tensor *o = &lf->t[lf->n++];
    snprintf(o->name, sizeof o->name, "%s%s", prefix, name);
    o->dt = dt, o->nd = nd, o->sh[0] = d0, o->sh[1] = d1, o->sh[2] = d2, o->shard = shard;
    o->data = malloc(bytes ? bytes : 1);
    if (o->data) memcpy(o->data, src, bytes);
}

static void put_f32(layer_files *lf, int shard, const char *prefix, const char *name, float v, int as_one) {
    put(lf, shard, prefix, name, K3_ST_F32, as_one, 1, 0, 0, &v, sizeof v);
}

static void free_files(layer_files *lf) {
    for (int i = 0; i < lf->n; i++) free(lf->t[i].data);
    lf->n = 0;
}

/* The case a checkpoint is written for, and what the reference must use. */
typedef struct ckpt_case {
    const char *what;
    int layout;
    const char *prefix;
    int32_t layer;
    int shards;      /* 1: one file in its folder; 2: two shards and an index */
    int block;       /* BLOCK_* tensors written under their published names */
    int path_index;  /* open the index file rather than the folder */
    const char *src; /* the k3 quant file the experts come from */
} ckpt_case;

/* The reference's view of the case: the stacked tensors of src with the scales the layout gives. */
typedef struct ref_weights {
    k3_moe_desc d;
    k3_moe_weights w;
    float g13[E * 2], in13max[E];
} ref_weights;

static const char *const projs[3] = {"gate_proj", "up_proj", "down_proj"};

/* The per-expert tensors of layout c->layout from the stacked file q; rw receives the reference's weights. */
static void split_experts(const ckpt_case *c, const k3_st_file *q, layer_files *lf, ref_weights *rw) {
    const int nv = c->layout != CT_MX, ct = c->layout != MO_NV;
    const int64_t bs = nv ? 16 : 32;
    const uint8_t *w13 = data_of(q, "w13_weight"), *s13 = data_of(q, "w13_weight_scale");
    const uint8_t *w2 = data_of(q, "w2_weight"), *s2 = data_of(q, "w2_weight_scale");
    const float *g13 = data_of(q, "w13_weight_scale_2"), *g2 = data_of(q, "w2_weight_scale_2");
    const float *i13 = data_of(q, "w13_input_scale"), *i2 = data_of(q, "w2_input_scale");
    char name[160];
    for (int e = 0; e < E; e++) {
        const int shard = c->shards == 2 && e >= E / 2;
        for (int pj = 0; pj < 3; pj++) {
            const int64_t rows = pj < 2 ? I : L, cols = pj < 2 ? L : I;
            const size_t wb = (size_t)(rows * cols / 2), sb = (size_t)(rows * cols / bs);
            const uint8_t *wsrc = pj < 2 ? w13 + ((size_t)e * 2 + (size_t)pj) * wb : w2 + (size_t)e * wb;
            const uint8_t *ssrc = pj < 2 ? s13 + ((size_t)e * 2 + (size_t)pj) * sb : s2 + (size_t)e * sb;
            snprintf(name, sizeof name, "experts.%d.%s.%s", e, projs[pj], ct ? "weight_packed" : "weight");
            put(lf, shard, c->prefix, name, K3_ST_U8, 2, rows, cols / 2, 0, wsrc, wb);
            snprintf(name, sizeof name, "experts.%d.%s.weight_scale", e, projs[pj]);
            put(lf, shard, c->prefix, name, nv ? K3_ST_F8_E4M3 : K3_ST_U8, 2, rows, cols / bs, 0, ssrc, sb);
            if (!nv) continue;
            /* ModelOpt: up gets twice the gate's scale_2 (and its codes stay, so its rows scale by 2) and half
               the gate's input scale; the run takes the larger input scale, the gate's */
            const float base2 = pj < 2 ? g13[e] : g2[e];
            const float s2v = c->layout == MO_NV && pj == 1 ? 2.0f * base2 : base2;
            snprintf(name, sizeof name, "experts.%d.%s.%s", e, projs[pj],
                     ct ? "weight_global_scale" : "weight_scale_2");
            put_f32(lf, shard, c->prefix, name, ct ? (float)(1.0 / (double)s2v) : s2v, e & 1);
            if (pj < 2) rw->g13[e * 2 + pj] = s2v;
            if (!i13 || !i2) continue; /* the source has no activation scales: neither has the checkpoint */
            const float basein = pj < 2 ? i13[e] : i2[e];
            const float inv = c->layout == MO_NV && pj == 1 ? 0.5f * basein : basein;
            snprintf(name, sizeof name, "experts.%d.%s.%s", e, projs[pj], ct ? "input_global_scale" : "input_scale");
            put_f32(lf, shard, c->prefix, name, ct ? (float)(1.0 / (double)inv) : inv, 0);
        }
        rw->in13max[e] = i13 ? i13[e] : 0.0f;
    }
    k3_moe_desc *d = &rw->d;
    k3_moe_desc_init(d);
    d->num_experts = E, d->top_k = K, d->hidden = L, d->inter = I, d->max_tokens = M;
    d->format = nv ? K3_WEIGHT_NVFP4 : K3_WEIGHT_MXFP4;
    d->scale_layout = K3_SCALE_LINEAR;
    d->w13_separate_scale_2 = nv;
    memset(&rw->w, 0, sizeof rw->w);
    rw->w.w13 = w13, rw->w.w13_scale = s13, rw->w.w2 = w2, rw->w.w2_scale = s2;
    rw->w.w13_scale_2 = nv ? rw->g13 : NULL, rw->w.w2_scale_2 = g2;
    rw->w.w13_input_scale = rw->in13max, rw->w.w2_input_scale = i2;
}

/* The router and latent-block tensors of q under their published names (shard 1 when sharded). */
static void put_block(const ckpt_case *c, const k3_st_file *q, layer_files *lf) {
    if (c->block == BLOCK_NONE) return;
    const int sh = c->shards == 2;
    const int64_t w = c->block == BLOCK_LATENT ? H : L;
    put(lf, 0, c->prefix, "gate.weight", K3_ST_BF16, 2, E, w, 0, data_of(q, "gate_weight"), sizeof(uint16_t) * E * w);
    put(lf, sh, c->prefix, "gate.e_score_correction_bias", K3_ST_F32, 1, E, 0, 0,
        data_of(q, "e_score_correction_bias"), sizeof(float) * E);
    if (c->block == BLOCK_ROUTER_SHARED) { /* width L: the experts' own input */
        put(lf, sh, c->prefix, "shared_experts.gate_proj.weight", K3_ST_BF16, 2, IS, L, 0, sguw,
            sizeof(uint16_t) * IS * L);
        put(lf, 0, c->prefix, "shared_experts.up_proj.weight", K3_ST_BF16, 2, IS, L, 0, sguw + IS * L,
            sizeof(uint16_t) * IS * L);
        put(lf, sh, c->prefix, "shared_experts.down_proj.weight", K3_ST_BF16, 2, L, IS, 0, sdw,
            sizeof(uint16_t) * L * IS);
    }
    if (c->block != BLOCK_LATENT) return;
    put(lf, sh, c->prefix, "routed_expert_down_proj.weight", K3_ST_BF16, 2, L, H, 0, downw, sizeof downw);
    put(lf, 0, c->prefix, "routed_expert_norm.weight", K3_ST_BF16, 1, L, 0, 0, normw, sizeof normw);
    put(lf, sh, c->prefix, "routed_expert_up_proj.weight", K3_ST_BF16, 2, H, L, 0, upw, sizeof upw);
    put(lf, sh, c->prefix, "shared_experts.gate_proj.weight", K3_ST_BF16, 2, IS, H, 0, sguw, sizeof(uint16_t) * IS * H);
    put(lf, 0, c->prefix, "shared_experts.up_proj.weight", K3_ST_BF16, 2, IS, H, 0, sguw + IS * H,
        sizeof(uint16_t) * IS * H);
    put(lf, sh, c->prefix, "shared_experts.down_proj.weight", K3_ST_BF16, 2, H, IS, 0, sdw, sizeof sdw);
}

/* Writes lf into folder sub of g_dir: part-<k>.safetensors and, for two shards, the index. */
static int write_layer(const char *sub, const layer_files *lf, int shards) {
    char dir[160], p[256], err[512];
    snprintf(dir, sizeof dir, "%s/%s", g_dir, sub);
    if (mkdir(dir, 0755) != 0) return 0;
    int ok = 1;
    for (int k = 0; k < shards; k++) {
        k3_st_writer *w = NULL;
        ok = ok && k3_st_writer_create(&w) == K3_STATUS_SUCCESS;
        for (int i = 0; ok && i < lf->n; i++)
            if (lf->t[i].shard == k)
                ok = k3_st_writer_add(w, lf->t[i].name, lf->t[i].dt, lf->t[i].nd, lf->t[i].sh, lf->t[i].data, err,
                                      sizeof err) == K3_STATUS_SUCCESS;
        snprintf(p, sizeof p, "%s/part-%d.safetensors", dir, k);
        ok = ok && k3_st_writer_save(w, p, err, sizeof err) == K3_STATUS_SUCCESS;
        k3_st_writer_destroy(w);
    }
    if (ok && shards == 2) {
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
        FILE *f = fopen(p, "w");
        ok = f != NULL;
        if (f) {
            fprintf(f, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
            for (int i = 0; i < lf->n; i++)
                fprintf(f, "%s\n  \"%s\": \"part-%d.safetensors\"", i ? "," : "", lf->t[i].name, lf->t[i].shard);
            fprintf(f, "\n}}\n");
            ok = fclose(f) == 0;
        }
    }
    if (!ok) fprintf(stderr, "cannot write %s: %s\n", dir, err);
    return ok;
}

/* Runs the CLI on weights (relative to g_dir) with --layer; removes y.safetensors first. */
static int run_layer(const char *weights, int32_t layer, const char *input, const char *extra) {
    char y[128];
    path_of(y, sizeof y, "y.safetensors");
    remove(y);
    return sh("%s run moe --device %s --json --top-k %d %s --weights %s/%s --layer %d --input %s/%s --output %s", g_k3,
              g_dev, K, extra, g_dir, weights, (int)layer, g_dir, input, y);
}

/* rel-L2 of the CLI's output against ref (fp64, rounded to bf16 here) and, when ids is given, the routing. */
static void check_output(const char *what, const double *ref, int64_t cols, const int32_t *ids) {
    k3_st_file *f = open_file("y.safetensors");
    CHECK(f != NULL, "%s: output written", what);
    if (!f) return;
    const k3_st_tensor *t = k3_st_find(f, "output");
    CHECK(t && t->dtype == K3_ST_BF16 && t->nbytes == sizeof(uint16_t) * (size_t)(M * cols), "%s: output [%d, %lld]",
          what, M, (long long)cols);
    if (t && t->nbytes == sizeof(uint16_t) * (size_t)(M * cols)) {
        double *got = malloc(sizeof(double) * (size_t)(M * cols)), *rb = malloc(sizeof(double) * (size_t)(M * cols));
        for (int64_t i = 0; got && rb && i < M * cols; i++) {
            got[i] = k3_bf16_to_f32(((const uint16_t *)t->data)[i]);
            rb[i] = ref_bf16(ref[i]);
        }
        const double rel = got && rb ? ref_rel_l2(got, rb, M * cols) : 1.0;
        printf("  %-58s rel-L2 %.3g\n", what, rel);
        CHECK(rel <= 1e-2, "%s: rel-L2 %.3g vs the fp64 reference", what, rel);
        free(got);
        free(rb);
    }
    const k3_st_tensor *ti = k3_st_find(f, "topk_ids");
    if (ids) {
        CHECK(ti && ti->dtype == K3_ST_I32 && ti->nbytes == sizeof(int32_t) * M * K &&
                  !memcmp(ti->data, ids, ti->nbytes),
              "%s: routing identical to the reference's", what);
    } else {
        CHECK(!ti, "%s: no routing when the input gave it", what);
    }
    k3_st_close(f);
}

/* Writes the case's checkpoint and runs what it can: experts alone (x_ids), router + experts (x_l) or the latent
 * block (x_h), each against the reference. */
static void run_case(const ckpt_case *c) {
    k3_st_file *q = open_file(c->src);
    CHECK(q != NULL, "%s: open %s", c->what, c->src);
    if (!q) return;
    static layer_files lf;
    static ref_weights rw;
    memset(&rw, 0, sizeof rw);
    split_experts(c, q, &lf, &rw);
    put_block(c, q, &lf);
    char sub[64], weights[160];
    snprintf(sub, sizeof sub, "ck_%s", c->what);
    for (char *p = sub; *p; p++)
        if (*p == ' ' || *p == '/') *p = '_';
    CHECK(write_layer(sub, &lf, c->shards), "%s: checkpoint written", c->what);
    free_files(&lf);
    snprintf(weights, sizeof weights, "%s%s", sub, c->path_index ? "/model.safetensors.index.json" : "");
    char what[128];
    static double ref[M * H];
    snprintf(what, sizeof what, "%s: experts alone", c->what);
    CHECK(run_layer(weights, c->layer, "x_ids.safetensors", "") == 0, "%s: exit 0", what);
    ref_moe(&rw.d, &rw.w, M, xl, ids_in, wts_in, ref);
    check_output(what, ref, L, NULL);
    if (c->layout == MO_NV && data_of(q, "w13_input_scale")) {
        snprintf(what, sizeof what, "%s: experts alone, w4a4", c->what);
        CHECK(run_layer(weights, c->layer, "x_ids.safetensors", "--mode w4a4") == 0, "%s: exit 0", what);
        rw.d.mode = K3_MOE_W4A4;
        ref_moe(&rw.d, &rw.w, M, xl, ids_in, wts_in, ref);
        rw.d.mode = K3_MOE_W4A16;
        check_output(what, ref, L, NULL);
    }
    int32_t ids[M * K];
    double wd[M * K];
    if (c->block == BLOCK_ROUTER || c->block == BLOCK_ROUTER_SHARED) {
        k3_router_desc rd;
        k3_router_desc_init(&rd);
        rd.num_experts = E, rd.top_k = K, rd.hidden = L, rd.max_tokens = M;
        ref_router(&rd, M, xl, data_of(q, "gate_weight"), data_of(q, "e_score_correction_bias"), ids, wd);
        float wf[M * K];
        for (int i = 0; i < M * K; i++) wf[i] = (float)wd[i];
        snprintf(what, sizeof what, "%s: router + experts", c->what);
        CHECK(run_layer(weights, c->layer, "x_l.safetensors", "") == 0, "%s: exit 0", what);
        if (c->block == BLOCK_ROUTER_SHARED)
            CHECK(stderr_has("has shared experts but no latent projections"), "%s: the note on shared experts", what);
        ref_moe(&rw.d, &rw.w, M, xl, ids, wf, ref);
        check_output(what, ref, L, ids);
    } else if (c->block == BLOCK_LATENT) {
        k3_latent_moe_desc ld;
        k3_latent_moe_desc_init(&ld);
        ld.hidden = H, ld.router.hidden = H, ld.router.num_experts = E, ld.router.top_k = K;
        ld.experts = rw.d, ld.shared_inter = IS, ld.max_tokens = M;
        k3_latent_moe_weights lw = {data_of(q, "gate_weight"), data_of(q, "e_score_correction_bias"), downw, rw.w,
                                    normw, upw, sguw, sdw};
        ref_latent(&ld, &lw, M, xh, NULL, ref, ids, wd);
        snprintf(what, sizeof what, "%s: latent block", c->what);
        CHECK(run_layer(weights, c->layer, "x_h.safetensors", "") == 0, "%s: exit 0", what);
        /* ref_latent returns y already rounded to bf16; check_output rounds again (exact) */
        check_output(what, ref, H, ids);
    }
    k3_st_close(q);
}

/* A stacked file that `k3 quant` wrote is a checkpoint of one layer: --layer 0 gives the bytes of the plain run. */
static void test_stacked_file(void) {
    char y0[128], y1[128];
    path_of(y0, sizeof y0, "y_plain.safetensors");
    path_of(y1, sizeof y1, "y.safetensors");
    CHECK(sh("%s run moe --device %s --top-k %d --weights %s/q_latent.safetensors --input %s/x_h.safetensors "
             "--output %s",
             g_k3, g_dev, K, g_dir, g_dir, y0) == 0,
          "stacked file without --layer: exit 0");
    CHECK(run_layer("q_latent.safetensors", 0, "x_h.safetensors", "") == 0, "stacked file --layer 0: exit 0");
    CHECK(same_bytes("y_plain.safetensors", "y.safetensors"), "stacked file: --layer 0 gives the same bytes");
    /* braces: the command's own stdout redirection wins over the one sh() appends to the group */
    CHECK(sh("{ %s run moe --device %s --json --top-k %d --weights %s/q_latent.safetensors --layer 0 --input "
             "%s/x_h.safetensors --output %s >%s/summary.json; }",
             g_k3, g_dev, K, g_dir, g_dir, y1, g_dir) == 0,
          "--json: exit 0");
    char p[128], buf[2048];
    path_of(p, sizeof p, "summary.json");
    FILE *f = fopen(p, "rb");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = '\0';
    CHECK(strstr(buf, "\"layer\": 0") && strstr(buf, "\"format\": \"stacked\"") && strstr(buf, "\"E\": 16") &&
              strstr(buf, "\"ran\": \"latent block\"") && strstr(buf, "\"M\": 5") && strstr(buf, "\"seconds\": ") &&
              buf[0] == '{' && strchr(buf, '\n') == buf + n - 1,
          "--json summary is one object: %s", buf);
}

/* Writes ModelOpt layer 0 (router and latent block, two shards) into sub with one defect applied by patch. */
typedef void (*patch_fn)(layer_files *lf);
static void write_modelopt(const char *sub, patch_fn patch) {
    ckpt_case c = {sub, MO_NV, "model.layers.0.mlp.", 0, 2, BLOCK_LATENT, 0, "q_latent.safetensors"};
    k3_st_file *q = open_file(c.src);
    if (!q) return;
    static layer_files lf;
    static ref_weights rw;
    split_experts(&c, q, &lf, &rw);
    put_block(&c, q, &lf);
    if (patch) patch(&lf);
    CHECK(write_layer(sub, &lf, 2), "%s: written", sub);
    free_files(&lf);
    k3_st_close(q);
}

/* The defect's run: exit 1, the message's words, no output file. */
static void refused(const char *sub, patch_fn patch, const char *input, const char *w1, const char *w2) {
    write_modelopt(sub, patch);
    char y[128];
    path_of(y, sizeof y, "y.safetensors");
    CHECK(run_layer(sub, 0, input, "") == 1 && stderr_has(w1) && (!w2 || stderr_has(w2)), "%s: exit 1 naming it",
          sub);
    CHECK(access(y, F_OK) != 0, "%s: no output file left", sub);
}

static out_tensor *find_t(layer_files *lf, const char *name) {
    for (int i = 0; i < lf->n; i++)
        if (!strcmp(lf->t[i].name, name)) return &lf->t[i];
    return NULL;
}
static void drop(layer_files *lf, const char *name) {
    out_tensor *t = find_t(lf, name);
    if (t) snprintf(t->name, sizeof t->name, "%s_dropped", name); /* the expected name is then missing */
}
static void p_gap(layer_files *lf) { drop(lf, "model.layers.0.mlp.experts.5.down_proj.weight_scale"); }
static void p_no_up(layer_files *lf) { drop(lf, "model.layers.0.mlp.routed_expert_up_proj.weight"); }
static void p_gate_shape(layer_files *lf) {
    out_tensor *t = find_t(lf, "model.layers.0.mlp.gate.weight");
    if (t) t->sh[0] = E / 2, t->sh[1] = 2 * H;
}
static void p_norm_dtype(layer_files *lf) {
    out_tensor *t = find_t(lf, "model.layers.0.mlp.routed_expert_norm.weight");
    if (t) t->dt = K3_ST_F32, t->sh[0] = L / 2;
}
static void p_w_dtype(layer_files *lf) {
    out_tensor *t = find_t(lf, "model.layers.0.mlp.experts.3.gate_proj.weight");
    if (t) t->dt = K3_ST_BF16, t->sh[1] = L / 4;
}
static void p_scale2(layer_files *lf) {
    out_tensor *t = find_t(lf, "model.layers.0.mlp.experts.2.up_proj.weight_scale_2");
    if (t) ((float *)t->data)[0] = -1.0f;
}

static void test_refusals(void) {
    refused("bad_gap", p_gap, "x_ids.safetensors", "expert 5 is missing",
            "'model.layers.0.mlp.experts.5.down_proj.weight_scale'");
    refused("bad_no_up", p_no_up, "x_h.safetensors", "latent-projection tensors are incomplete",
            "'model.layers.0.mlp.routed_expert_up_proj.weight' is missing");
    refused("bad_gate_shape", p_gate_shape, "x_h.safetensors", "'model.layers.0.mlp.gate.weight'",
            "expected BF16 or F32 [16, 128], found BF16 [8, 256]");
    refused("bad_norm_dtype", p_norm_dtype, "x_h.safetensors", "'model.layers.0.mlp.routed_expert_norm.weight'",
            "expected BF16 [64], found F32 [32]");
    refused("bad_w_dtype", p_w_dtype, "x_ids.safetensors", "'model.layers.0.mlp.experts.3.gate_proj.weight'",
            "expected U8");
    refused("bad_scale2", p_scale2, "x_ids.safetensors", "experts.2.up_proj.weight_scale_2'", "positive finite");
    /* a truncated shard: the file named, exit 1, no output */
    write_modelopt("bad_truncated", NULL);
    char p[160], y[128];
    snprintf(p, sizeof p, "%s/bad_truncated/part-1.safetensors", g_dir);
    path_of(y, sizeof y, "y.safetensors");
    struct stat sb;
    CHECK(stat(p, &sb) == 0 && truncate(p, sb.st_size - 7) == 0, "truncate a shard");
    CHECK(run_layer("bad_truncated", 0, "x_ids.safetensors", "") == 1 && stderr_has("part-1.safetensors"),
          "truncated shard: exit 1 naming the shard");
    CHECK(access(y, F_OK) != 0, "truncated shard: no output file left");
    /* a layer the checkpoint does not have; an input that needs a router the layer lacks */
    CHECK(run_layer("ck_ct_mxfp4_sharded", 9, "x_ids.safetensors", "") == 1 && stderr_has("layer 9") &&
              stderr_has("no MoE experts"),
          "absent layer");
    CHECK(run_layer("ck_ct_mxfp4_sharded", 3, "x_l.safetensors", "") == 1 && stderr_has("'gate.weight'"),
          "routing without a router");
    CHECK(run_layer("ck_ct_mxfp4_sharded", 3, "x_ids.safetensors", "--act relu2") == 1 && stderr_has("[gate; up]"),
          "relu2 refused for a [gate; up] checkpoint");
    /* --output inside the checkpoint folder, or a shard of the index: refused before anything is read */
    CHECK(sh("%s run moe --weights %s/ck_ct_mxfp4_sharded --layer 3 --input %s/x_ids.safetensors --output "
             "%s/ck_ct_mxfp4_sharded/y.safetensors",
             g_k3, g_dir, g_dir, g_dir) == 2 &&
              stderr_has("inside the checkpoint folder"),
          "--output inside the checkpoint folder");
    CHECK(sh("%s run moe --weights %s/ck_ct_mxfp4_sharded/model.safetensors.index.json --layer 3 --input "
             "%s/x_ids.safetensors --output %s/ck_ct_mxfp4_sharded/part-1.safetensors",
             g_k3, g_dir, g_dir, g_dir) == 2 &&
              stderr_has("a shard that the index"),
          "--output a shard of the index");
    CHECK(sh("%s run moe --weights %s/ck_ct_mxfp4_sharded/model.safetensors.index.json --layer 3 --input "
             "%s/x_ids.safetensors --output %s/ck_ct_mxfp4_sharded/model.safetensors.index.json",
             g_k3, g_dir, g_dir, g_dir) == 2,
          "--output the index itself");
    CHECK(sh("%s run moe --weights %s/ck_ct_mxfp4_sharded --input %s/x_ids.safetensors --output %s/y.safetensors",
             g_k3, g_dir, g_dir, g_dir) == 2 &&
              stderr_has("give --layer N"),
          "a checkpoint folder without --layer");
    CHECK(sh("%s run moe --weights %s/ck_ct_mxfp4_sharded --layer -1 --input a --output b", g_k3, g_dir) == 2 &&
              stderr_has("--layer must be"),
          "--layer -1");
}

/* k3 convert writes the stacked layout this command reads: running the converted file (with --layer 0, and as a
 * plain weights file) gives the bytes of running the checkpoint itself. */
static void test_convert(const char *ckpt, int32_t layer, const char *input) {
    char what[160], conv[160], y[128];
    snprintf(what, sizeof what, "convert %s layer %d, %s", ckpt, (int)layer, input);
    snprintf(conv, sizeof conv, "conv_%s.safetensors", ckpt);
    path_of(y, sizeof y, "y.safetensors");
    CHECK(run_layer(ckpt, layer, input, "") == 0, "%s: direct run", what);
    CHECK(sh("mv %s %s/y_direct.safetensors", y, g_dir) == 0, "%s: keep the direct output", what);
    CHECK(sh("%s convert --quiet --input %s/%s --layer %d --output %s/%s", g_k3, g_dir, ckpt, (int)layer, g_dir,
             conv) == 0,
          "%s: k3 convert exit 0", what);
    CHECK(run_layer(conv, 0, input, "") == 0, "%s: run --layer 0 on the converted file", what);
    CHECK(same_bytes("y_direct.safetensors", "y.safetensors"), "%s: --layer 0 on it gives the same bytes", what);
    remove(y);
    CHECK(sh("%s run moe --device %s --top-k %d --weights %s/%s --input %s/%s --output %s", g_k3, g_dev, K, g_dir,
             conv, g_dir, input, y) == 0,
          "%s: plain run on the converted file", what);
    CHECK(same_bytes("y_direct.safetensors", "y.safetensors"), "%s: the plain run gives the same bytes", what);
}

int main(void) {
    const char *dev = getenv("K3_TEST_DEVICE");
    if (dev && dev[0]) g_dev = dev;
    if (strcmp(g_dev, "cpu") && strcmp(g_dev, "cuda")) {
        printf("K3_TEST_DEVICE must be cpu or cuda (got '%s')\n", g_dev);
        return 1;
    }
    if (!strcmp(g_dev, "cuda")) {
        k3_ctx_options opt;
        k3_ctx_options_init(&opt);
        opt.backend = K3_BACKEND_CUDA;
        k3_ctx *c = NULL;
        if (k3_ctx_create(&opt, &c) != K3_STATUS_SUCCESS) {
            printf("SKIPPED: K3_TEST_DEVICE=cuda but no CUDA device or backend\n");
            return 77;
        }
        k3_ctx_destroy(c);
    }
    const int st = run_moe_files_setup();
    if (st) return st;
    printf("device %s\n", g_dev);
    const ckpt_case cases[] = {
        {"ct_mxfp4_sharded", CT_MX, "model.layers.3.mlp.", 3, 2, BLOCK_NONE, 0, "q_mx.safetensors"},
        {"ct_nvfp4_router", CT_NV, "language_model.model.layers.1.mlp.", 1, 1, BLOCK_ROUTER, 0,
         "q_experts.safetensors"},
        {"ct_nvfp4_latent_index", CT_NV, "model.layers.2.mlp.", 2, 2, BLOCK_LATENT, 1, "q_latent.safetensors"},
        {"modelopt_latent_sharded", MO_NV, "model.layers.0.mlp.", 0, 2, BLOCK_LATENT, 0, "q_latent.safetensors"},
        {"modelopt_noprefix", MO_NV, "", 6, 1, BLOCK_ROUTER_SHARED, 0, "q_experts.safetensors"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
    test_stacked_file();
    test_refusals();
    test_convert("ck_ct_mxfp4_sharded", 3, "x_ids.safetensors");
    test_convert("ck_modelopt_latent_sharded", 0, "x_h.safetensors");
    test_convert("ck_ct_nvfp4_router", 1, "x_l.safetensors");
    run_moe_files_done();
    return k3t_finish();
}
