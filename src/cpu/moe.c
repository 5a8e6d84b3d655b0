/*
 * The routed experts on the CPU (docs/model.md section 4): the reference every GPU MoE kernel is tested against.
 *
 * Per (token t, slot j) with expert e = ids[t, j] and weight p = weights[t, j]:
 *   x'  = bf16 x_t as fp32; W4A4: NVFP4 fake-quantized per row in blocks of 16 with gs = 1 / w13_input_scale[e]
 *   h   = bf16( (x' . Q13_e^T) * scale_2 )   Q = FP4 code * block scale (exact in fp32); BF16 weights: scale_2 = 1
 *   a   = act(h) in fp32, then bf16 (W4A16) or NVFP4 fake-quantized with gs = 1 / w2_input_scale[e] (W4A4)
 *   o   = (a . Q2_e^T) * w2_scale_2                                        (fp32, not rounded)
 *   acc[t] += p * o                                                        (fp32)
 * and out = bf16(acc). Dot products accumulate in fp32 in a fixed order (8 interleaved partial sums). A slot whose
 * id is outside [0, E) (-1: expert parallelism, the expert lives on another rank) is skipped.
 *
 * Work is grouped by expert, in ascending expert id: each touched expert's weights are decoded once per call,
 * one row at a time into a small fp32 buffer, and dotted with every (token, slot) routed to it. So a token's
 * sum runs over its own experts in ascending id order whatever the other tokens are: rows of the output do
 * not depend on the rest of the batch, and a second call gives bitwise the same output.
 */
#include "cpu/cpu.h"

#include <string.h>

#include "core/act.h"
#include "core/bf16.h"
#include "core/formats.h"

#define K3_MOE_ALIGN 64

static size_t align_up(size_t v) { return (v + (K3_MOE_ALIGN - 1)) & ~(size_t)(K3_MOE_ALIGN - 1); }

k3_status k3_cpu_moe_prepare(k3_cpu_moe *p, const k3_moe_desc *d) {
    memset(p, 0, sizeof *p);
    p->d = *d;
    const int64_t l = d->hidden, inter = d->inter;
    p->w1_rows = k3_act_width_factor(d->act.kind) * inter;
    if (d->format == K3_WEIGHT_BF16) {
        p->block = 0;
        p->w13_expert_bytes = (size_t)(p->w1_rows * l) * 2u;
        p->w2_expert_bytes = (size_t)(l * inter) * 2u;
        return K3_STATUS_SUCCESS;
    }
    const k3_fp4_format fmt = d->format == K3_WEIGHT_NVFP4 ? K3_FP4_NVFP4 : K3_FP4_MXFP4;
    p->block = fmt == K3_FP4_NVFP4 ? 16 : 32;
    p->w13_expert_bytes = (size_t)(p->w1_rows * l / 2);
    p->w2_expert_bytes = (size_t)(l * inter / 2);
    k3_status st = k3_fp4_scale_bytes(fmt, d->scale_layout, p->w1_rows, l, &p->w13_scale_bytes);
    if (st == K3_STATUS_SUCCESS) st = k3_fp4_scale_bytes(fmt, d->scale_layout, l, inter, &p->w2_scale_bytes);
    if (st != K3_STATUS_SUCCESS) return st;
    for (int c = 0; c < 16; c++) p->fp4_lut[c] = k3_e2m1_to_f32((uint8_t)c);
    for (int c = 0; c < 256; c++)
        p->scale_lut[c] = fmt == K3_FP4_NVFP4 ? k3_e4m3_to_f32((uint8_t)c) : k3_ue8m0_to_f32((uint8_t)c);
    return K3_STATUS_SUCCESS;
}

/* The carve-up of the workspace (offsets from the 64-byte aligned start). */
typedef struct moe_ws_layout {
    size_t offs, cur, pairs, acc, xg, h, a, row, total;
} moe_ws_layout;

static moe_ws_layout moe_layout(const k3_cpu_moe *p) {
    const k3_moe_desc *d = &p->d;
    const size_t e = (size_t)d->num_experts, g = (size_t)(d->max_tokens * d->top_k);
    const size_t l = (size_t)d->hidden, inter = (size_t)d->inter, w1 = (size_t)p->w1_rows;
    const size_t row = l > inter ? l : inter;
    moe_ws_layout s;
    size_t o = 0;
    s.offs = o, o += align_up((e + 1) * sizeof(int32_t));
    s.cur = o, o += align_up(e * sizeof(int32_t));
    s.pairs = o, o += align_up(g * sizeof(int32_t));
    s.acc = o, o += align_up((size_t)d->max_tokens * l * sizeof(float));
    s.xg = o, o += align_up(g * l * sizeof(float));
    s.h = o, o += align_up(g * w1 * sizeof(float));
    s.a = o, o += align_up(g * inter * sizeof(float));
    s.row = o, o += align_up(row * sizeof(float));
    s.total = o;
    return s;
}

/* + alignment slack: the caller's pointer need not be aligned */
size_t k3_cpu_moe_workspace_size(const k3_cpu_moe *p) { return moe_layout(p).total + K3_MOE_ALIGN; }

/* fp32 dot product in a fixed order: 8 interleaved partial sums (vectorizable), combined pairwise. */
static float dot_f32(const float *restrict a, const float *restrict b, int64_t n) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += a[i + k] * b[i + k];
    for (int k = 0; i < n; i++, k++) s[k] += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* Row r of one expert's [rows, cols] weight, decoded to fp32 without its global scale: BF16 as is; FP4 as
 * code * block scale (exact in fp32). */
static void decode_row(const k3_cpu_moe *p, const uint8_t *wq, const uint8_t *sc, int64_t r, int64_t rows, int64_t cols,
                       float *restrict out) {
    if (p->d.format == K3_WEIGHT_BF16) {
        const uint16_t *w = (const uint16_t *)(const void *)wq + r * cols;
        for (int64_t c = 0; c < cols; c++) out[c] = k3_bf16_bits_to_f32(w[c]);
        return;
    }
    const int64_t bs = p->block, nb = cols / bs, scale_cols = nb;
    const uint8_t *q = wq + r * (cols / 2);
    for (int64_t b = 0; b < nb; b++) {
        const int64_t so = p->d.scale_layout == K3_SCALE_LINEAR
                               ? r * scale_cols + b
                               : k3_scale_offset(p->d.scale_layout, r, b, rows, scale_cols);
        const float sf = p->scale_lut[sc[so]];
        const uint8_t *qb = q + b * (bs / 2);
        float *o = out + b * bs;
        for (int64_t j = 0; j < bs / 2; j++) {
            o[2 * j] = p->fp4_lut[qb[j] & 0x0f] * sf;
            o[2 * j + 1] = p->fp4_lut[qb[j] >> 4] * sf;
        }
    }
}

/* Which half of the W13 row space row r is in: 0 = gate, 1 = up (for the [E, 2] scale_2). */
static int w13_half(const k3_cpu_moe *p, int64_t r) {
    if (p->d.act.kind == K3_ACT_SWIGLUOAI) return (int)(r & 1);
    return r >= p->d.inter ? 1 : 0;
}

void k3_cpu_moe_run(const k3_cpu_moe *p, int64_t m, const uint16_t *x, const int32_t *ids, const float *wts,
                    const k3_moe_weights *w, uint16_t *out, float *out_f32, void *ws) {
    const k3_moe_desc *d = &p->d;
    const int64_t l = d->hidden, inter = d->inter, w1 = p->w1_rows, k = d->top_k, np = m * k;
    const int32_t ne = d->num_experts;
    const int fp4 = d->format != K3_WEIGHT_BF16, w4a4 = d->mode == K3_MOE_W4A4;
    const moe_ws_layout s = moe_layout(p);
    uint8_t *base = (uint8_t *)(((uintptr_t)ws + (K3_MOE_ALIGN - 1)) & ~(uintptr_t)(K3_MOE_ALIGN - 1));
    int32_t *offs = (int32_t *)(void *)(base + s.offs), *cur = (int32_t *)(void *)(base + s.cur);
    int32_t *pairs = (int32_t *)(void *)(base + s.pairs);
    float *acc = (float *)(void *)(base + s.acc), *xg = (float *)(void *)(base + s.xg);
    float *h = (float *)(void *)(base + s.h), *a = (float *)(void *)(base + s.a);
    float *row = (float *)(void *)(base + s.row);

    /* group the (token, slot) pairs by expert: a counting sort, stable in (token, slot) order; a pair whose id is
     * outside [0, E) (-1: the expert is on another rank) joins no group, so it adds nothing */
    memset(offs, 0, (size_t)(ne + 1) * sizeof *offs);
    for (int64_t i = 0; i < np; i++)
        if (ids[i] >= 0 && ids[i] < ne) offs[ids[i] + 1]++;
    for (int32_t e = 0; e < ne; e++) offs[e + 1] += offs[e];
    memcpy(cur, offs, (size_t)ne * sizeof *cur);
    for (int64_t i = 0; i < np; i++)
        if (ids[i] >= 0 && ids[i] < ne) pairs[cur[ids[i]]++] = (int32_t)i;

    memset(acc, 0, (size_t)(m * l) * sizeof *acc);
    const uint8_t *w13 = (const uint8_t *)w->w13, *w2 = (const uint8_t *)w->w2;
    const uint8_t *w13s = (const uint8_t *)w->w13_scale, *w2s = (const uint8_t *)w->w2_scale;
    for (int32_t e = 0; e < ne; e++) {
        const int32_t first = offs[e], cnt = offs[e + 1] - offs[e];
        if (cnt == 0) continue;
        const int32_t *grp = pairs + first;
        const uint8_t *e13 = w13 + (size_t)e * p->w13_expert_bytes;
        const uint8_t *e2 = w2 + (size_t)e * p->w2_expert_bytes;
        const uint8_t *e13s = fp4 ? w13s + (size_t)e * p->w13_scale_bytes : NULL;
        const uint8_t *e2s = fp4 ? w2s + (size_t)e * p->w2_scale_bytes : NULL;
        float alpha13[2] = {1.0f, 1.0f}, alpha2 = 1.0f;
        if (d->format == K3_WEIGHT_NVFP4) {
            if (d->w13_separate_scale_2) {
                alpha13[0] = w->w13_scale_2[2 * e];
                alpha13[1] = w->w13_scale_2[2 * e + 1];
            } else {
                alpha13[0] = alpha13[1] = w->w13_scale_2[e];
            }
            alpha2 = w->w2_scale_2[e];
        }

        /* the GEMM1 inputs of this expert's pairs */
        for (int32_t g = 0; g < cnt; g++) {
            const uint16_t *xt = x + (int64_t)(grp[g] / k) * l;
            float *xr = xg + (int64_t)g * l;
            if (w4a4) {
                for (int64_t c = 0; c < l; c++) row[c] = k3_bf16_bits_to_f32(xt[c]);
                k3_nvfp4_fake_quant(row, l, 1.0f / w->w13_input_scale[e], xr);
            } else {
                for (int64_t c = 0; c < l; c++) xr[c] = k3_bf16_bits_to_f32(xt[c]);
            }
        }
        /* GEMM1: one decoded row of W13 against every pair; output rounded to BF16 */
        for (int64_t r = 0; r < w1; r++) {
            decode_row(p, e13, e13s, r, w1, l, row);
            const float al = alpha13[w13_half(p, r)];
            for (int32_t g = 0; g < cnt; g++)
                h[(int64_t)g * w1 + r] = k3_round_bf16(dot_f32(xg + (int64_t)g * l, row, l) * al);
        }
        /* activation in fp32, then one rounding (BF16) or the W4A4 requantization */
        for (int32_t g = 0; g < cnt; g++) {
            float *ar = a + (int64_t)g * inter;
            if (w4a4) {
                k3_act_row(&d->act, h + (int64_t)g * w1, row, inter);
                k3_nvfp4_fake_quant(row, inter, 1.0f / w->w2_input_scale[e], ar);
            } else {
                k3_act_row(&d->act, h + (int64_t)g * w1, ar, inter);
                for (int64_t c = 0; c < inter; c++) ar[c] = k3_round_bf16(ar[c]);
            }
        }
        /* GEMM2 and the weighted fp32 sum */
        for (int64_t r = 0; r < l; r++) {
            decode_row(p, e2, e2s, r, l, inter, row);
            for (int32_t g = 0; g < cnt; g++) {
                const int32_t pr = grp[g];
                acc[(int64_t)(pr / k) * l + r] += wts[pr] * (dot_f32(a + (int64_t)g * inter, row, inter) * alpha2);
            }
        }
    }

    if (out_f32) memcpy(out_f32, acc, (size_t)(m * l) * sizeof *acc);
    if (out)
        for (int64_t i = 0; i < m * l; i++) out[i] = k3_f32_to_bf16_bits(acc[i]);
}

void k3_cpu_moe_map_ids(const int32_t *ids, int32_t n, const int32_t *map, int32_t global_experts, int32_t *local) {
    for (int32_t i = 0; i < n; i++) local[i] = ids[i] >= 0 && ids[i] < global_experts ? map[ids[i]] : -1;
}
