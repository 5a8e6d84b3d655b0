/* The engine of `k3 convert`: the layer is described from the headers, every expert checked (and, for a format
 * change, proven exact) before the output is opened, then each output tensor is streamed expert by expert from
 * one expert's worth of buffers. */
#define _POSIX_C_SOURCE 200809L
#include "convert_run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "convert_fp4.h"
#include "core/formats.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"

enum { MODE_KEEP = 0, MODE_MX2NV, MODE_NV2MX };
#define CHUNK_BYTES ((size_t)4 << 20) /* block tensors are copied in pieces of this size */

typedef struct cv {
    const k3_convert_opts *o;
    k3_ckpt *ck;
    k3_ckpt_moe m; /* described: sizes and format, no buffers */
    k3_ckpt_block_info b;
    int mode, out_nv, inputs;
    int in13_pair; /* gate and up input scales differ somewhere: w13_input_scale is [E, 2], else [E] */
    int64_t E, L, I;
    float *s2, *in;                    /* [E, 3] (gate, up, down): the output's scale_2 and input scales */
    int *base;                         /* [E, 3]: MXFP4 -> NVFP4 scale_2 exponents */
    uint8_t *codes, *scales, *oscales; /* one expert: [w13 | w2] codes, input scales, output scales */
    size_t c13, c2, s13, s2b, o13, o2; /* per-expert bytes */
    float *small;                      /* [E, 2] staging for the F32 tensors */
    unsigned char *chunk;
    k3_st_stream *st;
    uint64_t total;
    double t0, last;
    char err[1024];
} cv;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void progress(cv *c, const char *what, int64_t e) {
    if (!c->o->progress) return;
    const double t = now_s();
    if (t - c->last < 1.0 || t - c->t0 < 1.0) return;
    c->last = t;
    fprintf(stderr, "convert: %s expert %lld/%lld, %.2f of %.2f GB\n", what, (long long)e + 1, (long long)c->E,
            (double)k3_st_stream_written(c->st) / 1e9, (double)c->total / 1e9);
}

static int fail(cv *c) {
    fprintf(stderr, "k3 convert: %s\n", c->err);
    return 0;
}

static const char *const proj_names[3] = {"gate_proj", "up_proj", "down_proj"};

/* The input tensor holding matrix j (0 gate, 1 up, 2 down) of expert e's block scales (messages). */
static void scale_name(const cv *c, int64_t e, int j, char *buf, size_t n) {
    if (c->m.info.format == K3_CKPT_MOE_STACKED)
        snprintf(buf, n, "%s%s (expert %lld, %s rows)", c->m.info.prefix,
                 j < 2 ? "w13_weight_scale" : "w2_weight_scale", (long long)e, proj_names[j]);
    else
        snprintf(buf, n, "%sexperts.%lld.%s.weight_scale (expert %lld)", c->m.info.prefix, (long long)e, proj_names[j],
                 (long long)e);
}

/* Matrix j of one expert's buffers: codes, input scales, output scales; rows and columns (elements). */
static void matrix(const cv *c, int j, const uint8_t **codes, const uint8_t **sc, uint8_t **osc, int64_t *rows,
                   int64_t *cols) {
    const int in_nv = c->m.fp4 == K3_FP4_NVFP4;
    *rows = j < 2 ? c->I : c->L;
    *cols = j < 2 ? c->L : c->I;
    const size_t cb = (size_t)(*rows * (*cols / 2)), sb = (size_t)(*rows * (*cols / (in_nv ? 16 : 32)));
    const size_t ob = (size_t)(*rows * (*cols / (c->out_nv ? 16 : 32)));
    *codes = j < 2 ? c->codes + (size_t)j * cb : c->codes + c->c13;
    *sc = j < 2 ? c->scales + (size_t)j * sb : c->scales + c->s13;
    *osc = j < 2 ? c->oscales + (size_t)j * ob : c->oscales + c->o13;
}

/* Expert e's buffers read (w13 / w2 parts as asked); the scalars recorded. */
static int read_expert(cv *c, int64_t e, int codes13, int sc13, int codes2, int sc2) {
    k3_ckpt_expert x;
    memset(&x, 0, sizeof x);
    if (codes13) x.w13 = c->codes;
    if (sc13) x.w13_scale = c->scales;
    if (codes2) x.w2 = c->codes + c->c13;
    if (sc2) x.w2_scale = c->scales + c->s13;
    if (k3_ckpt_moe_read_expert(c->ck, &c->m, e, &x, c->err, sizeof c->err) != K3_STATUS_SUCCESS) return 0;
    if (c->m.fp4 == K3_FP4_NVFP4) /* kept, or the input's for NVFP4 -> MXFP4 */
        c->s2[e * 3] = x.w13_scale_2[0], c->s2[e * 3 + 1] = x.w13_scale_2[1], c->s2[e * 3 + 2] = x.w2_scale_2;
    if (c->m.info.has_input_scale)
        c->in[e * 3] = x.w13_input_scale[0], c->in[e * 3 + 1] = x.w13_input_scale[1],
                  c->in[e * 3 + 2] = x.w2_input_scale;
    return 1;
}

/* Converts matrix j of the expert in the buffers into c->oscales; 0 with a message when it is not exact. */
static int convert_matrix(cv *c, int64_t e, int j) {
    const uint8_t *codes, *sc;
    uint8_t *osc;
    int64_t rows, cols;
    matrix(c, j, &codes, &sc, &osc, &rows, &cols);
    char nm[480];
    if (c->mode == MODE_MX2NV) {
        k3_convert_mx_to_nv(sc, rows, cols, c->base[e * 3 + j], osc);
        return 1;
    }
    k3_convert_inexact bad;
    if (k3_convert_nv_to_mx(codes, sc, c->s2[e * 3 + j], rows, cols, osc, &bad)) return 1;
    scale_name(c, e, j, nm, sizeof nm);
    snprintf(c->err, sizeof c->err,
             "tensor '%s': row %lld, 32-block %lld: effective scales %.9g and %.9g (e4m3 x scale_2 %.9g): %s, so "
             "NVFP4 -> MXFP4 is not exact (no output written)",
             nm, (long long)bad.row, (long long)bad.blk, bad.s0, bad.s1, (double)c->s2[e * 3 + j], bad.why);
    return 0;
}

/* Every expert read once: tensors checked, scalars kept, a format change proven exact (before any output). */
static int prepass(cv *c) {
    const int full = c->mode != MODE_KEEP;
    for (int64_t e = 0; e < c->E; e++) {
        if (!read_expert(c, e, full, full, full, full)) return 0;
        for (int j = 0; full && j < 3; j++) {
            if (c->mode == MODE_NV2MX) {
                if (!convert_matrix(c, e, j)) return 0;
                continue;
            }
            const uint8_t *codes, *sc;
            uint8_t *osc;
            int64_t rows, cols;
            matrix(c, j, &codes, &sc, &osc, &rows, &cols);
            k3_convert_span sp;
            k3_convert_mx_span(codes, sc, rows, cols, &sp);
            int base = 0;
            if (!k3_convert_mx_base(&sp, &base)) {
                char nm[480];
                scale_name(c, e, j, nm, sizeof nm);
                snprintf(c->err, sizeof c->err,
                         "tensor '%s': its blocks with non-zero codes have scales 2^%d (row %lld, block %lld) .. 2^%d "
                         "(row %lld, block %lld), %d binades; NVFP4's E4M3 block scales under one scale_2 hold %d "
                         "exactly, so MXFP4 -> NVFP4 is not exact (no output written)",
                         nm, sp.emin, (long long)sp.min_row, (long long)sp.min_blk, sp.emax, (long long)sp.max_row,
                         (long long)sp.max_blk, sp.emax - sp.emin, K3_CONVERT_MAX_SPAN);
                return 0;
            }
            c->base[e * 3 + j] = base;
            c->s2[e * 3 + j] = ldexpf(1.0f, base);
        }
        if (c->o->progress && now_s() - c->last >= 1.0) {
            c->last = now_s();
            fprintf(stderr, "convert: checking expert %lld/%lld\n", (long long)e + 1, (long long)c->E);
        }
    }
    return 1;
}

static int put(cv *c, const void *p, size_t n) {
    return k3_st_stream_write(c->st, p, n, c->err, sizeof c->err) == K3_STATUS_SUCCESS;
}

/* w13 (half 0) or w2 (half 1): codes, then block scales, streamed expert by expert. */
static int emit_half(cv *c, int half) {
    const char *nm_w = half ? "w2_weight" : "w13_weight", *nm_s = half ? "w2_weight_scale" : "w13_weight_scale";
    for (int64_t e = 0; e < c->E; e++) {
        if (!read_expert(c, e, !half, 0, half, 0)) return 0;
        if (!put(c, half ? c->codes + c->c13 : c->codes, half ? c->c2 : c->c13)) return 0;
        progress(c, nm_w, e);
    }
    for (int64_t e = 0; e < c->E; e++) {
        const int need_codes = c->mode == MODE_NV2MX;
        if (!read_expert(c, e, !half && need_codes, !half, half && need_codes, half)) return 0;
        if (c->mode == MODE_KEEP) {
            if (!put(c, half ? c->scales + c->s13 : c->scales, half ? c->s2b : c->s13)) return 0;
        } else {
            for (int j = half ? 2 : 0; j < (half ? 3 : 2); j++)
                if (!convert_matrix(c, e, j)) return 0;
            if (!put(c, half ? c->oscales + c->o13 : c->oscales, half ? c->o2 : c->o13)) return 0;
        }
        progress(c, nm_s, e);
    }
    return 1;
}

/* An [E, 2] (half 0, pair: gate, up), [E] (half 0: gate = up) or [E] (half 1: down) F32 tensor from v [E, 3]. */
static int emit_f32(cv *c, const float *v, int half, int pair) {
    for (int64_t e = 0; e < c->E; e++) {
        if (half)
            c->small[e] = v[e * 3 + 2];
        else if (pair)
            c->small[e * 2] = v[e * 3], c->small[e * 2 + 1] = v[e * 3 + 1];
        else
            c->small[e] = v[e * 3];
    }
    return put(c, c->small, (size_t)c->E * (!half && pair ? 2 : 1) * sizeof(float));
}

/* ---- the block's tensors ---- */

typedef struct block_out {
    const char *name;
    const k3_ckpt_block_tensor *src[2]; /* src[1]: rows appended (published shared gate, up) */
    int finite;                         /* NaN/Inf is an error (router gate, bias, norm) */
} block_out;

static int block_list(const cv *c, block_out *out) {
    const k3_ckpt_block_info *b = &c->b;
    int n = 0;
    if (b->has[K3_CKPT_BLOCK_ROUTER]) {
        out[n++] = (block_out){"gate_weight", {&b->gate, NULL}, 1};
        if (b->has_bias) out[n++] = (block_out){"e_score_correction_bias", {&b->bias, NULL}, 1};
    }
    if (b->has[K3_CKPT_BLOCK_SHARED]) {
        out[n++] = (block_out){
            "shared_gate_up_weight", {&b->shared_gate, b->stacked[K3_CKPT_BLOCK_SHARED] ? NULL : &b->shared_up}, 0};
        out[n++] = (block_out){"shared_down_weight", {&b->shared_down, NULL}, 0};
    }
    if (b->has[K3_CKPT_BLOCK_LATENT]) {
        out[n++] = (block_out){"down_proj_weight", {&b->down_proj, NULL}, 0};
        out[n++] = (block_out){"norm_weight", {&b->norm, NULL}, 1};
        out[n++] = (block_out){"up_proj_weight", {&b->up_proj, NULL}, 0};
    }
    return n;
}

/* The file's reader checked that this byte count fits (it is the tensor's span in its shard). */
static size_t bt_bytes(const k3_ckpt_block_tensor *t) {
    size_t n = k3_st_dtype_size(t->dtype);
    for (int32_t i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

static int check_finite(cv *c, const k3_ckpt_block_tensor *t, const unsigned char *p, size_t n, uint64_t at) {
    const size_t es = t->dtype == K3_ST_F32 ? 4 : 2;
    for (size_t i = 0; i < n / es; i++) {
        float v;
        if (es == 4) {
            memcpy(&v, p + i * 4, 4);
        } else {
            uint16_t h;
            memcpy(&h, p + i * 2, 2);
            v = k3_bf16_bits_to_f32(h);
        }
        if (!isfinite(v)) {
            snprintf(c->err, sizeof c->err, "tensor '%s': element %llu is %g (a router or norm weight must be finite)",
                     t->name, (unsigned long long)(at / es + i), (double)v);
            return 0;
        }
    }
    return 1;
}

static int emit_block(cv *c, const block_out *bo) {
    for (int k = 0; k < 2 && bo->src[k]; k++) {
        const k3_ckpt_block_tensor *t = bo->src[k];
        const size_t nb = bt_bytes(t);
        for (size_t off = 0; off < nb; off += CHUNK_BYTES) {
            const size_t n = nb - off < CHUNK_BYTES ? nb - off : CHUNK_BYTES;
            if (k3_ckpt_read(c->ck, t->name, off, c->chunk, n, c->err, sizeof c->err) != K3_STATUS_SUCCESS) return 0;
            if (bo->finite && !check_finite(c, t, c->chunk, n, off)) return 0;
            if (!put(c, c->chunk, n)) return 0;
        }
    }
    return 1;
}

/* ---- planning ---- */

static int declare(cv *c, k3_st_writer *w, const char *name, k3_st_dtype dt, int32_t nd, int64_t a, int64_t b,
                   int64_t d) {
    const int64_t sh[3] = {a, b, d};
    return k3_st_writer_declare(w, name, dt, nd, sh, c->err, sizeof c->err) == K3_STATUS_SUCCESS;
}

static int plan_output(cv *c, k3_st_writer *w, const block_out *blocks, int nblocks) {
    const int64_t E = c->E, L = c->L, I = c->I, ob = c->out_nv ? 16 : 32;
    const k3_st_dtype sdt = c->out_nv ? K3_ST_F8_E4M3 : K3_ST_U8;
    for (int half = 0; half < 2; half++) {
        const int64_t N = half ? L : 2 * I, K = half ? I : L;
        const char *p = half ? "w2_" : "w13_";
        char nm[64];
        snprintf(nm, sizeof nm, "%sweight", p);
        if (!declare(c, w, nm, K3_ST_U8, 3, E, N, K / 2)) return 0;
        snprintf(nm, sizeof nm, "%sweight_scale", p);
        if (!declare(c, w, nm, sdt, 3, E, N, K / ob)) return 0;
        snprintf(nm, sizeof nm, "%sweight_scale_2", p);
        if (c->out_nv && !declare(c, w, nm, K3_ST_F32, half ? 1 : 2, E, 2, 0)) return 0;
        snprintf(nm, sizeof nm, "%sinput_scale", p);
        if (c->inputs && !declare(c, w, nm, K3_ST_F32, half || !c->in13_pair ? 1 : 2, E, 2, 0)) return 0;
    }
    for (int i = 0; i < nblocks; i++) {
        const k3_ckpt_block_tensor *t = blocks[i].src[0];
        int64_t rows = t->shape[0];
        if (blocks[i].src[1]) rows += blocks[i].src[1]->shape[0];
        if (!declare(c, w, blocks[i].name, t->dtype, t->ndim, rows, t->ndim > 1 ? t->shape[1] : 0, 0)) return 0;
    }
    char layer[24];
    snprintf(layer, sizeof layer, "%d", (int)c->o->layer);
    const char *kv[5][2] = {{"k3.quant.format", c->out_nv ? "nvfp4" : "mxfp4"},
                            {"k3.quant.scale_layout", "linear"},
                            {"k3.convert.source", c->o->input},
                            {"k3.convert.source_format", k3_ckpt_moe_format_name(c->m.info.format)},
                            {"k3.convert.layer", layer}};
    for (int k = 0; k < 5; k++)
        if (k3_st_writer_set_metadata(w, kv[k][0], kv[k][1], c->err, sizeof c->err) != K3_STATUS_SUCCESS) return 0;
    return 1;
}

static int alloc_buffers(cv *c) {
    const int in_nv = c->m.fp4 == K3_FP4_NVFP4;
    const size_t E = (size_t)c->E;
    c->c13 = c->m.w13_bytes / E, c->c2 = c->m.w2_bytes / E;
    c->s13 = c->m.w13_scale_bytes / E, c->s2b = c->m.w2_scale_bytes / E;
    /* the output's scales: the same count of bytes per 16 or 32 elements */
    c->o13 = c->out_nv == in_nv ? c->s13 : c->out_nv ? c->s13 * 2 : c->s13 / 2;
    c->o2 = c->out_nv == in_nv ? c->s2b : c->out_nv ? c->s2b * 2 : c->s2b / 2;
    c->codes = malloc(c->c13 + c->c2);
    c->scales = malloc(c->s13 + c->s2b);
    c->oscales = malloc(c->o13 + c->o2);
    c->s2 = calloc(E * 3, sizeof(float));
    c->in = calloc(E * 3, sizeof(float));
    c->base = calloc(E * 3, sizeof(int));
    c->small = malloc(E * 2 * sizeof(float));
    c->chunk = malloc(CHUNK_BYTES);
    if (!c->codes || !c->scales || !c->oscales || !c->s2 || !c->in || !c->base || !c->small || !c->chunk) {
        snprintf(c->err, sizeof c->err, "out of memory for one expert's buffers");
        return 0;
    }
    return 1;
}

static void cv_free(cv *c) {
    k3_st_stream_abort(c->st);
    free(c->codes), free(c->scales), free(c->oscales), free(c->s2), free(c->in), free(c->base), free(c->small);
    free(c->chunk);
    k3_ckpt_close(c->ck);
}

static int run(cv *c, k3_convert_result *r) {
    const k3_convert_opts *o = c->o;
    if (k3_ckpt_open(o->input, &c->ck, c->err, sizeof c->err) != K3_STATUS_SUCCESS) return 0;
    k3_ckpt_set_scale_layout(c->ck, o->scale_layout);
    if (k3_ckpt_moe_describe(c->ck, o->layer, &c->m, c->err, sizeof c->err) != K3_STATUS_SUCCESS) return 0;
    c->E = c->m.num_experts, c->L = c->m.hidden, c->I = c->m.inter;
    const int in_nv = c->m.fp4 == K3_FP4_NVFP4;
    c->out_nv = o->format == K3_CONVERT_KEEP ? in_nv : o->format == K3_CONVERT_NVFP4;
    c->mode = c->out_nv == in_nv ? MODE_KEEP : c->out_nv ? MODE_MX2NV : MODE_NV2MX;
    if (c->mode == MODE_NV2MX && (c->L % 32 || c->I % 32)) {
        snprintf(c->err, sizeof c->err, "L = %lld and I = %lld must be multiples of MXFP4's block size 32",
                 (long long)c->L, (long long)c->I);
        return 0;
    }
    c->inputs = c->m.info.has_input_scale && c->mode != MODE_NV2MX;
    r->input_scales_dropped = c->m.info.has_input_scale && !c->inputs;
    if (k3_ckpt_block_detect(c->ck, o->layer, c->E, c->L, &c->b, c->err, sizeof c->err) != K3_STATUS_SUCCESS) return 0;
    block_out blocks[K3_CONVERT_MAX_BLOCK];
    const int nblocks = block_list(c, blocks);
    if (!alloc_buffers(c) || !prepass(c)) return 0;
    /* gate and up read the same activation, so one input scale each is what `k3 run moe` takes ([E]); a
       checkpoint that gives them different ones keeps both ([E, 2]) rather than lose one */
    for (int64_t e = 0; c->inputs && e < c->E; e++) c->in13_pair |= c->in[e * 3] != c->in[e * 3 + 1];
    k3_st_writer *w = NULL;
    if (k3_st_writer_create(&w) != K3_STATUS_SUCCESS) {
        snprintf(c->err, sizeof c->err, "out of memory");
        return 0;
    }
    int ok = plan_output(c, w, blocks, nblocks) &&
             k3_st_stream_open(w, o->output, &c->st, c->err, sizeof c->err) == K3_STATUS_SUCCESS;
    k3_st_writer_destroy(w);
    if (!ok) return 0;
    c->total = (uint64_t)(c->c13 + c->c2 + c->o13 + c->o2) * (uint64_t)c->E +
               (uint64_t)c->E * sizeof(float) *
                   (3u * (uint64_t)c->out_nv + (2u + (uint64_t)c->in13_pair) * (uint64_t)c->inputs);
    for (int i = 0; i < nblocks; i++)
        for (int k = 0; k < 2 && blocks[i].src[k]; k++) c->total += bt_bytes(blocks[i].src[k]);
    for (int half = 0; half < 2; half++) {
        if (!emit_half(c, half)) return 0;
        if (c->out_nv && !emit_f32(c, c->s2, half, 1)) return 0;
        if (c->inputs && !emit_f32(c, c->in, half, c->in13_pair)) return 0;
    }
    for (int i = 0; i < nblocks; i++) {
        if (!emit_block(c, &blocks[i])) return 0;
        r->block_names[r->block_count++] = blocks[i].name;
    }
    r->bytes_written = k3_st_stream_written(c->st);
    const k3_status st = k3_st_stream_commit(c->st, c->err, sizeof c->err);
    c->st = NULL;
    return st == K3_STATUS_SUCCESS;
}

int k3_convert_layer(const k3_convert_opts *o, k3_convert_result *r) {
    memset(r, 0, sizeof *r);
    cv c;
    memset(&c, 0, sizeof c);
    c.o = o;
    c.t0 = c.last = now_s();
    const int ok = run(&c, r);
    if (ok) {
        r->source_format = k3_ckpt_moe_format_name(c.m.info.format);
        r->output_format = c.out_nv ? "nvfp4" : "mxfp4";
        r->experts = c.E, r->hidden = c.L, r->inter = c.I;
        if (r->input_scales_dropped && !o->quiet)
            fprintf(stderr, "k3 convert: note: the input's activation (input) scales have no MXFP4 form and were "
                            "not written\n");
    }
    cv_free(&c);
    return ok ? 1 : fail(&c);
}
