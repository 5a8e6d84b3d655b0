/*
 * An independent fp64 evaluation of the routed experts and of the latent-MoE block, written from the format
 * definitions and docs/model.md sections 2-5, NOT from the library's code: its own E2M1 table, its own swizzle
 * offset, its own activation formulas, per-element dequantization, fp64 dot products. It uses only the public
 * scalar codecs (e4m3/e2m1/bf16 encode and decode). The rounding points are the documented ones (moe.c,
 * latent.c): GEMM1 output -> bf16; activation -> bf16 (W4A16) or NVFP4 fake-quant (W4A4); x fake-quantized in
 * W4A4; expert outputs summed unrounded; the latent block's roundings as listed in src/cpu/latent.c.
 * Used by tests/test_moe.c, tests/test_latent.c, tests/test_run_moe_file.c and the demo's correctness line.
 */
#ifndef K3_TESTS_REF_MOE_H
#define K3_TESTS_REF_MOE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "k3.h"

static inline double ref_bf16(double v) { return (double)k3_bf16_to_f32(k3_bf16_from_f32((float)v)); }

static inline double ref_e2m1(uint8_t c) {
    static const double mag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    return (c & 8) ? -mag[c & 7] : mag[c & 7];
}

/* The 128x4 swizzle from its definition: rows padded to 128, scale columns to 4. */
static inline int64_t ref_swizzle(int64_t r, int64_t c, int64_t scale_cols) {
    const int64_t kp = (scale_cols + 3) / 4 * 4;
    return ((r / 128) * (kp / 4) + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}

/* Scale bytes of one [rows, cols] matrix. */
static inline int64_t ref_scale_bytes(k3_scale_layout lay, int64_t rows, int64_t cols, int64_t bs) {
    if (lay == K3_SCALE_LINEAR) return rows * (cols / bs);
    return (rows + 127) / 128 * 128 * ((cols / bs + 3) / 4 * 4);
}

/* Element (r, c) of expert e's W13 (which = 0) or W2 (which = 1), fully dequantized in fp64. */
static inline double ref_weight(const k3_moe_desc *d, const k3_moe_weights *w, int which, int64_t e, int64_t r,
                                int64_t c) {
    const int gated = d->act.kind != K3_ACT_RELU2_NO_MUL;
    const int64_t rows = which == 0 ? (gated ? 2 : 1) * d->inter : d->hidden;
    const int64_t cols = which == 0 ? d->hidden : d->inter;
    const void *wt = which == 0 ? w->w13 : w->w2;
    if (d->format == K3_WEIGHT_BF16) return k3_bf16_to_f32(((const uint16_t *)wt)[(e * rows + r) * cols + c]);
    const int64_t bs = d->format == K3_WEIGHT_NVFP4 ? 16 : 32, sc = cols / bs;
    const uint8_t byte = ((const uint8_t *)wt)[(e * rows + r) * (cols / 2) + c / 2];
    const double q = ref_e2m1((uint8_t)((c & 1) ? byte >> 4 : byte & 15));
    const int64_t off = d->scale_layout == K3_SCALE_LINEAR ? r * sc + c / bs : ref_swizzle(r, c / bs, sc);
    const uint8_t *scales = (const uint8_t *)(which == 0 ? w->w13_scale : w->w2_scale);
    const uint8_t s = scales[e * ref_scale_bytes(d->scale_layout, rows, cols, bs) + off];
    if (d->format == K3_WEIGHT_MXFP4) return q * (s == 0xff ? NAN : ldexp(1.0, (int)s - 127));
    double g2;
    if (which == 1)
        g2 = w->w2_scale_2[e];
    else if (!d->w13_separate_scale_2)
        g2 = w->w13_scale_2[e];
    else {
        const int up = d->act.kind == K3_ACT_SWIGLUOAI ? (int)(r & 1) : r >= d->inter;
        g2 = w->w13_scale_2[2 * e + up];
    }
    return q * (double)k3_e4m3_to_f32(s) * g2;
}

static inline double ref_sigmoid(double v) { return 1.0 / (1.0 + exp(-v)); }

/* One gated pair or relu2 value, from the formulas of docs/model.md section 2. */
static inline double ref_act_value(const k3_act_desc *a, double g, double u) {
    const double lim = a->limit;
    switch (a->kind) {
    case K3_ACT_SILU:
        if (lim > 0) {
            g = g < lim ? g : lim;
            u = u < -lim ? -lim : (u > lim ? lim : u);
        }
        return g * ref_sigmoid(g) * u;
    case K3_ACT_SWIGLUOAI:
    case K3_ACT_SWIGLUOAI_UNINTERLEAVE:
        if (lim > 0) {
            g = g < lim ? g : lim;
            u = u < -lim ? -lim : (u > lim ? lim : u);
        }
        return (u + a->beta) * g * ref_sigmoid(a->alpha * g);
    case K3_ACT_SITU: {
        const double b = a->situ_beta, lb = a->situ_linear_beta;
        const double up = lb > 0 ? lb * tanh(u / lb) : u;
        return b * tanh(g / b) * ref_sigmoid(g) * up;
    }
    case K3_ACT_RELU2_NO_MUL:
    default: return g > 0 ? g * g : 0.0;
    }
}

/* in [width * dim] -> out [dim] (not rounded). */
static inline void ref_act_row(const k3_act_desc *a, const double *in, double *out, int64_t dim) {
    for (int64_t i = 0; i < dim; i++) {
        if (a->kind == K3_ACT_RELU2_NO_MUL)
            out[i] = ref_act_value(a, in[i], 0);
        else if (a->kind == K3_ACT_SWIGLUOAI)
            out[i] = ref_act_value(a, in[2 * i], in[2 * i + 1]);
        else
            out[i] = ref_act_value(a, in[i], in[dim + i]);
    }
}

/* NVFP4 quantize-dequantize of n values (blocks of 16) with global scale gs, from the definition in
 * docs/model.md section 5 (sf = e4m3(gs amax / 6), q = e2m1(x gs / sf), x' = q sf / gs), in place. */
static inline void ref_fake_quant(double *x, int64_t n, double gs) {
    for (int64_t b = 0; b < n; b += 16) {
        double amax = 0;
        for (int i = 0; i < 16; i++) amax = fmax(amax, fabs(x[b + i]));
        const double sf = k3_e4m3_to_f32(k3_e4m3_from_f32((float)(gs * amax / 6.0)));
        for (int i = 0; i < 16; i++) {
            const double q = sf == 0 ? 0 : ref_e2m1(k3_e2m1_from_f32((float)(x[b + i] * gs / sf)));
            x[b + i] = q * sf / gs;
        }
    }
}

/* out[m, L] (fp64, unrounded) = sum over slots of w * expert(x); slots with ids outside [0, E) add nothing. */
static inline void ref_moe(const k3_moe_desc *d, const k3_moe_weights *w, int64_t m, const uint16_t *x,
                           const int32_t *ids, const float *wts, double *out) {
    const int64_t l = d->hidden, in = d->inter, w1 = (d->act.kind == K3_ACT_RELU2_NO_MUL ? 1 : 2) * in;
    double *xv = (double *)malloc(sizeof(double) * (size_t)l);
    double *h = (double *)malloc(sizeof(double) * (size_t)w1);
    double *a = (double *)malloc(sizeof(double) * (size_t)in);
    for (int64_t t = 0; t < m; t++) {
        for (int64_t c = 0; c < l; c++) out[t * l + c] = 0;
        for (int32_t j = 0; j < d->top_k; j++) {
            const int64_t e = ids[t * d->top_k + j];
            if (e < 0 || e >= d->num_experts) continue; /* -1: an expert on another rank; out of range: the same */
            for (int64_t c = 0; c < l; c++) xv[c] = k3_bf16_to_f32(x[t * l + c]);
            if (d->mode == K3_MOE_W4A4) ref_fake_quant(xv, l, 1.0 / w->w13_input_scale[e]);
            for (int64_t r = 0; r < w1; r++) {
                double s = 0;
                for (int64_t c = 0; c < l; c++) s += xv[c] * ref_weight(d, w, 0, e, r, c);
                h[r] = ref_bf16(s);
            }
            ref_act_row(&d->act, h, a, in);
            if (d->mode == K3_MOE_W4A4)
                ref_fake_quant(a, in, 1.0 / w->w2_input_scale[e]);
            else
                for (int64_t c = 0; c < in; c++) a[c] = ref_bf16(a[c]);
            for (int64_t r = 0; r < l; r++) {
                double s = 0;
                for (int64_t c = 0; c < in; c++) s += a[c] * ref_weight(d, w, 1, e, r, c);
                out[t * l + r] += (double)wts[t * d->top_k + j] * s;
            }
        }
    }
    free(xv);
    free(h);
    free(a);
}

/* The router in fp64 (docs/model.md section 3, or softmax top-k): ids (descending key, ties to the lower id), weights. */
static inline void ref_router(const k3_router_desc *d, int64_t m, const uint16_t *x, const void *gate,
                              const float *bias, int32_t *ids, double *wts) {
    const int64_t hd = d->hidden;
    const int32_t ne = d->num_experts, k = d->top_k;
    double *score = (double *)malloc(sizeof(double) * (size_t)ne), *key = (double *)malloc(sizeof(double) * (size_t)ne);
    char *taken = (char *)malloc((size_t)ne);
    for (int64_t t = 0; t < m; t++) {
        double mx = -INFINITY;
        for (int32_t e = 0; e < ne; e++) {
            double s = 0;
            for (int64_t c = 0; c < hd; c++) {
                const double g = d->gate_dtype == K3_DTYPE_F32 ? ((const float *)gate)[e * hd + c]
                                                               : k3_bf16_to_f32(((const uint16_t *)gate)[e * hd + c]);
                s += (double)k3_bf16_to_f32(x[t * hd + c]) * g;
            }
            score[e] = s;
            mx = fmax(mx, s);
        }
        if (d->kind == K3_ROUTER_SOFTMAX) {
            double z = 0;
            for (int32_t e = 0; e < ne; e++) z += exp(score[e] - mx);
            for (int32_t e = 0; e < ne; e++) key[e] = score[e] = exp(score[e] - mx) / z;
        } else {
            for (int32_t e = 0; e < ne; e++) {
                score[e] = ref_sigmoid(score[e]);
                key[e] = score[e] + (bias ? bias[e] : 0.0);
            }
        }
        memset(taken, 0, (size_t)ne);
        double sum = 0;
        for (int32_t j = 0; j < k; j++) {
            int32_t best = -1;
            for (int32_t e = 0; e < ne; e++)
                if (!taken[e] && (best < 0 || key[e] > key[best])) best = e;
            taken[best] = 1;
            ids[t * k + j] = best;
            wts[t * k + j] = score[best];
            sum += score[best];
        }
        for (int32_t j = 0; j < k; j++)
            wts[t * k + j] = (d->renormalize ? wts[t * k + j] / (sum + 1e-20) : wts[t * k + j]) * d->scaling_factor;
    }
    free(score);
    free(key);
    free(taken);
}

/* y = x . W^T for BF16 W [n, k] and x [m, k] given as doubles, fp64 sums, left unrounded. */
static inline void ref_linear_f64(int64_t m, int64_t n, int64_t k, const double *x, const uint16_t *wt, double *y) {
    for (int64_t t = 0; t < m; t++)
        for (int64_t r = 0; r < n; r++) {
            double s = 0;
            for (int64_t c = 0; c < k; c++) s += x[t * k + c] * k3_bf16_to_f32(wt[r * k + c]);
            y[t * n + r] = s;
        }
}

/* ref_linear_f64 with each output rounded to bf16 (returned as doubles). */
static inline void ref_linear_bf16(int64_t m, int64_t n, int64_t k, const double *x, const uint16_t *wt, double *y) {
    ref_linear_f64(m, n, k, x, wt, y);
    for (int64_t i = 0; i < m * n; i++) y[i] = ref_bf16(y[i]);
}

/* The whole latent block (docs/model.md section 4: t = bf16(s + residual), y = bf16(v . W_up^T + t)); y [m, H]
 * receives the final bf16 values as doubles; ids/wts the fp64 routing. */
static inline void ref_latent(const k3_latent_moe_desc *d, const k3_latent_moe_weights *w, int64_t m, const uint16_t *x,
                              const uint16_t *residual, double *y, int32_t *ids, double *wts) {
    const int64_t hd = d->hidden, l = d->experts.hidden, is = d->shared_inter;
    const int64_t sr = (d->shared_act.kind == K3_ACT_RELU2_NO_MUL ? 1 : 2) * is;
    const int32_t k = d->experts.top_k;
    double *xd = (double *)malloc(sizeof(double) * (size_t)(m * hd));
    double *xl = (double *)malloc(sizeof(double) * (size_t)(m * l));
    double *u = (double *)malloc(sizeof(double) * (size_t)(m * l));
    double *v = (double *)malloc(sizeof(double) * (size_t)(m * l));
    double *z = (double *)malloc(sizeof(double) * (size_t)(m * hd));
    double *g = (double *)malloc(sizeof(double) * (size_t)(m * (sr > 0 ? sr : 1)));
    double *a = (double *)malloc(sizeof(double) * (size_t)(m * (is > 0 ? is : 1)));
    double *s = (double *)malloc(sizeof(double) * (size_t)(m * hd));
    uint16_t *xlb = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(m * l));
    float *wf = (float *)malloc(sizeof(float) * (size_t)(m * k));
    for (int64_t i = 0; i < m * hd; i++) xd[i] = k3_bf16_to_f32(x[i]);
    ref_router(&d->router, m, x, w->gate, w->bias, ids, wts);
    ref_linear_bf16(m, l, hd, xd, (const uint16_t *)w->down_proj, xl);
    for (int64_t i = 0; i < m * l; i++) xlb[i] = k3_bf16_from_f32((float)xl[i]); /* exact: xl is bf16 */
    /* the routing weights enter the experts as fp32 values, as they do in the library */
    for (int64_t i = 0; i < m * k; i++) wf[i] = (float)wts[i];
    ref_moe(&d->experts, &w->experts, m, xlb, ids, wf, u);
    const uint16_t *nw = (const uint16_t *)w->norm;
    for (int64_t t = 0; t < m; t++) {
        double ss = 0;
        for (int64_t c = 0; c < l; c++) ss += u[t * l + c] * u[t * l + c];
        const double r = 1.0 / sqrt(ss / (double)l + d->rms_eps);
        for (int64_t c = 0; c < l; c++) v[t * l + c] = ref_bf16(ref_bf16(u[t * l + c] * r) * k3_bf16_to_f32(nw[c]));
    }
    ref_linear_f64(m, hd, l, v, (const uint16_t *)w->up_proj, z);
    for (int64_t i = 0; i < m * hd; i++) s[i] = 0;
    if (is > 0) {
        ref_linear_bf16(m, sr, hd, xd, (const uint16_t *)w->shared_gate_up, g);
        for (int64_t t = 0; t < m; t++) {
            ref_act_row(&d->shared_act, g + t * sr, a + t * is, is);
            for (int64_t c = 0; c < is; c++) a[t * is + c] = ref_bf16(a[t * is + c]);
        }
        ref_linear_bf16(m, hd, is, a, (const uint16_t *)w->shared_down, s);
    }
    for (int64_t i = 0; i < m * hd; i++) {
        const double r = residual ? (double)k3_bf16_to_f32(residual[i]) : 0.0;
        const double t = is > 0 && residual ? ref_bf16(s[i] + r) : s[i] + r; /* one of the two is 0 otherwise */
        y[i] = ref_bf16(z[i] + t);
    }
    free(xd);
    free(xl);
    free(u);
    free(v);
    free(z);
    free(g);
    free(a);
    free(s);
    free(xlb);
    free(wf);
}

/* ||a - b|| / ||b|| over n values (0 when both are zero). */
static inline double ref_rel_l2(const double *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
