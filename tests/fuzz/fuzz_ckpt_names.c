/*
 * libFuzzer target: the checkpoint name mapper (MoE detection and stacking). The input bytes describe a small
 * safetensors file: records separated by '\n', each
 *     byte 0        bits 0-2 dtype (U8, F8_E4M3, F32, BF16, I32, F16, F32, U8), bits 3-4 rank 0..3,
 *                   bits 5-6 fill (0 plausible values, 1 zeros, 2 0xFF bytes: NaN codes, 3 pseudo-random)
 *     rank bytes    the dimensions, each byte & 0x7F (so 10 is written 0x8A: no byte of a record is '\n')
 *     the rest      the tensor's name (any bytes; escaped into the header)
 * Tensors are tiny (at most 32 KiB each, 48 of them); records that do not fit are skipped. The file goes to the
 * scratch memfd and is opened with k3_ckpt_open; k3_ckpt_moe_detect runs for layers 0..2 and, where it succeeds,
 * k3_ckpt_load_moe, then, after a loaded MoE, k3_ckpt_load_block (the router, shared and latent tensors). A success
 * must be consistent: the detected format, prefix and expert count kept, sizes that
 * are E x the per-expert shapes, block sizes dividing L and I, global and input scales finite and > 0, no NaN
 * block-scale code, and every expert's bytes equal to the file's tensors it was stacked from (per-expert formats:
 * gate, up, down; stacked: the four tensors as they are). A failure must come with a message.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "io/checkpoint.h"

#define TARGET "fuzz_ckpt_names"
#define MAX_TENSORS 48
#define MAX_TENSOR_BYTES 32768

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* F32 twice: 0x0A (F32 at index 2, rank 1, plausible) is the record separator, 0x0E says the same */
static const k3_st_dtype k_dtypes[8] = {K3_ST_U8,  K3_ST_F8_E4M3, K3_ST_F32, K3_ST_BF16,
                                        K3_ST_I32, K3_ST_F16,     K3_ST_F32, K3_ST_U8};

/* A growing byte buffer; out of memory aborts (the fuzzer's inputs are small). */
typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *s, size_t n) {
    if (n == 0) return; /* b->p may still be NULL */
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 4096;
        while (c < b->n + n) c *= 2;
        uint8_t *q = realloc(b->p, c);
        if (!q) abort();
        b->p = q, b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }

/* name as a JSON string (quotes, backslash and control bytes escaped; other bytes raw: the reader checks UTF-8) */
static void put_name(buf *b, const uint8_t *s, size_t n) {
    puts_(b, "\"");
    for (size_t i = 0; i < n; i++) {
        char e[8];
        if (s[i] == '"' || s[i] == '\\') {
            e[0] = '\\', e[1] = (char)s[i];
            put(b, e, 2);
        } else if (s[i] < 0x20) {
            snprintf(e, sizeof e, "\\u%04x", (unsigned)s[i]);
            puts_(b, e);
        } else {
            put(b, &s[i], 1);
        }
    }
    puts_(b, "\"");
}

/* The tensor's bytes for fill mode `fill`: plausible values are an E2M1 pair / UE8M0 1.0 (0x7F) for U8, 1.0 for
   F8_E4M3 (0x38), 0.5 for F32, BF16 and F16, 1 for I32. */
static void fill_bytes(uint8_t *d, size_t n, k3_st_dtype dt, int fill, uint32_t seed) {
    if (fill == 1) {
        memset(d, 0, n);
    } else if (fill == 2) {
        memset(d, 0xFF, n);
    } else if (fill == 3) {
        uint32_t s = seed * 2654435761u + 1u;
        for (size_t i = 0; i < n; i++) {
            s ^= s << 13, s ^= s >> 17, s ^= s << 5;
            d[i] = (uint8_t)s;
        }
    } else {
        const float half = 0.5f;
        const int32_t one = 1;
        for (size_t i = 0; i < n;) {
            switch (dt) {
            case K3_ST_F32: memcpy(d + i, &half, 4), i += 4; break;
            case K3_ST_I32: memcpy(d + i, &one, 4), i += 4; break;
            case K3_ST_BF16: d[i] = 0x00, d[i + 1] = 0x3F, i += 2; break;
            case K3_ST_F16: d[i] = 0x00, d[i + 1] = 0x38, i += 2; break;
            case K3_ST_F8_E4M3: d[i++] = 0x38; break;
            default: d[i++] = 0x7F; break;
            }
        }
    }
}

/* The safetensors file the records describe (header padded to 8 bytes; tensors back to back, as the reader wants
   no holes). */
static void build_file(const uint8_t *data, size_t size, buf *file) {
    buf hdr = {0}, body = {0};
    puts_(&hdr, "{");
    int count = 0;
    size_t pos = 0;
    while (pos < size && count < MAX_TENSORS) {
        const uint8_t *end = memchr(data + pos, '\n', size - pos);
        const size_t len = end ? (size_t)(end - (data + pos)) : size - pos;
        const uint8_t *r = data + pos;
        pos += len + 1;
        if (len < 1) continue;
        const k3_st_dtype dt = k_dtypes[r[0] & 7];
        const int ndim = (r[0] >> 3) & 3, fill = (r[0] >> 5) & 3;
        if (len < (size_t)(1 + ndim)) continue;
        size_t elems = 1;
        int64_t dims[3];
        for (int d = 0; d < ndim; d++) dims[d] = r[1 + d] & 0x7F, elems *= (size_t)dims[d];
        const size_t nbytes = elems * k3_st_dtype_size(dt);
        if (nbytes > MAX_TENSOR_BYTES) continue;
        const size_t off = body.n;
        uint8_t *tmp = malloc(nbytes ? nbytes : 1);
        if (!tmp) abort();
        fill_bytes(tmp, nbytes, dt, fill, (uint32_t)count);
        put(&body, tmp, nbytes);
        free(tmp);
        char meta[256];
        if (count) puts_(&hdr, ",");
        put_name(&hdr, r + 1 + ndim, len - 1 - (size_t)ndim);
        snprintf(meta, sizeof meta, ":{\"dtype\":\"%s\",\"shape\":[", k3_st_dtype_name(dt));
        puts_(&hdr, meta);
        for (int d = 0; d < ndim; d++) {
            snprintf(meta, sizeof meta, "%s%lld", d ? "," : "", (long long)dims[d]);
            puts_(&hdr, meta);
        }
        snprintf(meta, sizeof meta, "],\"data_offsets\":[%zu,%zu]}", off, off + nbytes);
        puts_(&hdr, meta);
        count++;
    }
    puts_(&hdr, "}");
    while ((8 + hdr.n) % 8) puts_(&hdr, " ");
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hdr.n >> (8 * i));
    put(file, len8, 8);
    put(file, hdr.p, hdr.n);
    if (body.n) put(file, body.p, body.n);
    free(hdr.p);
    free(body.p);
}

/* The file's tensor `name` has exactly the n bytes at p. */
static int same_as_file(k3_ckpt *ck, const char *name, const uint8_t *p, size_t n) {
    const k3_st_tensor *t = NULL;
    char err[512];
    if (k3_ckpt_find(ck, name, &t, err, sizeof err) != K3_STATUS_SUCCESS) return 0;
    return t->nbytes == n && (n == 0 || memcmp(t->data, p, n) == 0);
}

static int scales_ok(const float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!(isfinite(v[i]) && v[i] > 0.0f)) return 0;
    return 1;
}

static void check_load(k3_ckpt *ck, const k3_ckpt_moe_info *info, const k3_ckpt_moe *m) {
    fuzz_check(TARGET, m->info.format == info->format && !strcmp(m->info.prefix, info->prefix), "detection changed");
    const int64_t E = m->num_experts, L = m->hidden, I = m->inter;
    fuzz_check(TARGET, E >= 1 && L >= 1 && I >= 1 && m->info.num_experts == E, "sizes");
    if (info->format != K3_CKPT_MOE_STACKED) fuzz_check(TARGET, E == info->num_experts, "expert count changed");
    const int nv = m->fp4 == K3_FP4_NVFP4;
    fuzz_check(TARGET, nv || m->fp4 == K3_FP4_MXFP4, "fp4 format");
    if (info->format == K3_CKPT_MOE_CT_MXFP4) fuzz_check(TARGET, !nv, "compressed-tensors MXFP4 read as NVFP4");
    if (info->format == K3_CKPT_MOE_CT_NVFP4 || info->format == K3_CKPT_MOE_MODELOPT_NVFP4)
        fuzz_check(TARGET, nv, "an NVFP4 format read as MXFP4");
    const int64_t bs = nv ? 16 : 32;
    fuzz_check(TARGET, L % bs == 0 && I % bs == 0, "L and I multiples of the block");
    fuzz_check(TARGET, m->w13_bytes == (size_t)(E * 2 * I * (L / 2)) && m->w2_bytes == (size_t)(E * L * (I / 2)),
               "weight byte counts");
    fuzz_check(TARGET, m->w13_scale_bytes == (size_t)(E * 2 * I * (L / bs)) &&
                           m->w2_scale_bytes == (size_t)(E * L * (I / bs)),
               "scale byte counts");
    fuzz_check(TARGET, m->w13 && m->w2 && m->w13_scale && m->w2_scale, "buffers");
    const uint8_t *sc[2] = {m->w13_scale, m->w2_scale};
    const size_t sn[2] = {m->w13_scale_bytes, m->w2_scale_bytes};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sn[k]; i++)
            fuzz_check(TARGET, nv ? (sc[k][i] & 0x7F) != 0x7F : sc[k][i] != 0xFF, "a NaN block-scale code loaded");
    if (nv) {
        fuzz_check(TARGET, m->w13_scale_2 && m->w2_scale_2, "NVFP4 without scale_2");
        fuzz_check(TARGET, scales_ok(m->w13_scale_2, 2 * E) && scales_ok(m->w2_scale_2, E), "scale_2 not > 0");
    } else {
        fuzz_check(TARGET, !m->w13_scale_2 && !m->w2_scale_2, "MXFP4 with scale_2");
    }
    fuzz_check(TARGET, !m->info.has_input_scale == !m->w13_input_scale && !m->w13_input_scale == !m->w2_input_scale,
               "input scales present iff announced");
    if (m->w13_input_scale)
        fuzz_check(TARGET, scales_ok(m->w13_input_scale, 2 * E) && scales_ok(m->w2_input_scale, E),
                   "input scales not > 0");
    char name[400];
    if (info->format == K3_CKPT_MOE_STACKED) {
        static const char *const sfx[4] = {"w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale"};
        const uint8_t *p[4] = {m->w13, m->w13_scale, m->w2, m->w2_scale};
        const size_t n[4] = {m->w13_bytes, m->w13_scale_bytes, m->w2_bytes, m->w2_scale_bytes};
        for (int k = 0; k < 4; k++) {
            snprintf(name, sizeof name, "%s%s", m->info.prefix, sfx[k]);
            fuzz_check(TARGET, same_as_file(ck, name, p[k], n[k]), "a stacked tensor not loaded as it is");
        }
        return;
    }
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    const char *wsfx = info->format == K3_CKPT_MOE_MODELOPT_NVFP4 ? "weight" : "weight_packed";
    for (int64_t e = 0; e < E; e++)
        for (int pj = 0; pj < 3; pj++) {
            const size_t wb = (size_t)((pj < 2 ? I : L) * ((pj < 2 ? L : I) / 2));
            const size_t sb = (size_t)((pj < 2 ? I : L) * ((pj < 2 ? L : I) / bs));
            const uint8_t *w = pj < 2 ? m->w13 + (size_t)(e * 2 + pj) * wb : m->w2 + (size_t)e * wb;
            const uint8_t *s = pj < 2 ? m->w13_scale + (size_t)(e * 2 + pj) * sb : m->w2_scale + (size_t)e * sb;
            snprintf(name, sizeof name, "%sexperts.%lld.%s.%s", m->info.prefix, (long long)e, proj[pj], wsfx);
            fuzz_check(TARGET, same_as_file(ck, name, w, wb), "an expert's weight is not its tensor's bytes");
            snprintf(name, sizeof name, "%sexperts.%lld.%s.weight_scale", m->info.prefix, (long long)e, proj[pj]);
            fuzz_check(TARGET, same_as_file(ck, name, s, sb), "an expert's block scales are not its tensor's bytes");
        }
}

/* The layer's router, shared and latent tensors: a success has each present group's buffers at its shapes' sizes
 * and nothing for an absent one; a failure says why and keeps nothing. */
static void check_block(k3_ckpt *ck, int32_t layer, const k3_ckpt_moe *m) {
    k3_ckpt_block b;
    char err[512] = "";
    const k3_status st = k3_ckpt_load_block(ck, layer, m->num_experts, m->hidden, &b, err, sizeof err);
    FUZZ_TRACE_PRINT("layer %d: block: %s\n", (int)layer, st == K3_STATUS_SUCCESS ? "success" : err);
    if (st != K3_STATUS_SUCCESS) {
        fuzz_check(TARGET, err[0] != '\0', "a failed block load without a message");
        fuzz_check(TARGET, !b.gate && !b.bias && !b.shared_gate_up && !b.shared_down && !b.down_proj && !b.norm &&
                               !b.up_proj,
                   "a failed block load kept buffers");
        return;
    }
    const k3_ckpt_block_info *in = &b.info;
    const size_t e = (size_t)m->num_experts, l = (size_t)m->hidden, h = (size_t)in->hidden, is = (size_t)in->shared_inter;
    if (in->has[K3_CKPT_BLOCK_ROUTER]) {
        const size_t es = b.gate_dtype == K3_ST_F32 ? 4 : 2;
        fuzz_check(TARGET, b.gate && b.gate_bytes == e * h * es, "the router gate is not [E, H]");
        fuzz_check(TARGET, !b.bias || b.bias_bytes == e * 4, "the correction bias is not [E]");
    } else {
        fuzz_check(TARGET, !b.gate && !b.bias, "a router without its group");
    }
    if (in->has[K3_CKPT_BLOCK_SHARED])
        fuzz_check(TARGET, b.shared_gate_up && b.shared_down && b.shared_gate_up_bytes == 2 * is * h * 2 &&
                               b.shared_down_bytes == h * is * 2,
                   "the shared experts are not [2 Is, H] and [H, Is]");
    else
        fuzz_check(TARGET, !b.shared_gate_up && !b.shared_down, "shared experts without their group");
    if (in->has[K3_CKPT_BLOCK_LATENT])
        fuzz_check(TARGET, b.down_proj && b.norm && b.up_proj && b.down_proj_bytes == l * h * 2 && b.norm_bytes == l * 2 &&
                               b.up_proj_bytes == h * l * 2,
                   "the latent projections are not [L, H], [L] and [H, L]");
    else
        fuzz_check(TARGET, !b.down_proj && !b.norm && !b.up_proj, "latent tensors without their group");
    k3_ckpt_block_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    buf file = {0};
    build_file(data, size, &file);
    char path[64], err[512];
    fuzz_scratch_write(TARGET, file.p, file.n, path, sizeof path);
    free(file.p);
    k3_ckpt *ck = NULL;
    err[0] = '\0';
    if (k3_ckpt_open(path, &ck, err, sizeof err) != K3_STATUS_SUCCESS) {
        FUZZ_TRACE_PRINT("open: %s\n", err);
        fuzz_check(TARGET, ck == NULL && err[0] != '\0', "a failed open without a message, or with a checkpoint");
        return 0;
    }
    for (int32_t layer = 0; layer < 3; layer++) {
        k3_ckpt_moe_info info;
        err[0] = '\0';
        if (k3_ckpt_moe_detect(ck, layer, &info, err, sizeof err) != K3_STATUS_SUCCESS) {
            FUZZ_TRACE_PRINT("layer %d: detect: %s\n", (int)layer, err);
            fuzz_check(TARGET, err[0] != '\0', "a failed detection without a message");
            continue;
        }
        k3_ckpt_moe m;
        err[0] = '\0';
        const k3_status st = k3_ckpt_load_moe(ck, layer, &m, err, sizeof err);
        FUZZ_TRACE_PRINT("layer %d: load: %s\n", (int)layer, st == K3_STATUS_SUCCESS ? "success" : err);
        if (st == K3_STATUS_SUCCESS) {
            check_load(ck, &info, &m);
            check_block(ck, layer, &m);
        } else {
            fuzz_check(TARGET, err[0] != '\0', "a failed load without a message");
            fuzz_check(TARGET, !m.w13 && !m.w2 && !m.w13_scale && !m.w2_scale, "a failed load kept buffers");
        }
        k3_ckpt_moe_free(&m);
    }
    k3_ckpt_close(ck);
    return 0;
}
