/*
 * Activation math (docs/model.md section 2) shared by host C and CUDA device code: one definition, so the CPU
 * reference and the GPU epilogues cannot drift apart. Everything is fp32 with no rounding; callers round once.
 * Descriptors must have passed k3_act_desc_validate (these functions do not check them).
 */
#ifndef K3_CORE_ACT_H
#define K3_CORE_ACT_H

#include <math.h>
#include <stdint.h>

#include "k3.h"

/* Same definition as in core/bf16.h (an identical redefinition is legal, so include order does not matter). */
#if defined(__CUDACC__)
#define K3_HD __host__ __device__ __forceinline__
#else
#define K3_HD static inline
#endif

/* 1 / (1 + e^-x) without overflow: the exponential is only ever taken of a non-positive number, so large |x|
 * gives exactly 0 or 1 (or a tiny denormal) and never inf/inf. */
K3_HD float k3_act_sigmoid(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

K3_HD float k3_act_relu2(float x) {
    float r = x > 0.0f ? x : 0.0f;
    return r * r;
}

/* One gated pair (g, u) -> value, for fused epilogues; not for RELU2_NO_MUL (returns relu2(g) there so the
 * function stays total). */
K3_HD float k3_act_gated(const k3_act_desc *d, float g, float u) {
    const float lim = d->limit;
    switch (d->kind) {
    case K3_ACT_SILU:
        if (lim > 0.0f) {
            g = fminf(g, lim);
            u = fminf(fmaxf(u, -lim), lim);
        }
        return g * k3_act_sigmoid(g) * u;
    case K3_ACT_SWIGLUOAI:
    case K3_ACT_SWIGLUOAI_UNINTERLEAVE:
        if (lim > 0.0f) {
            g = fminf(g, lim);
            u = fminf(fmaxf(u, -lim), lim);
        }
        /* g * sigmoid first: for g near -FLT_MAX it is 0, where (u + beta) * g would already be inf */
        return (u + d->beta) * (g * k3_act_sigmoid(d->alpha * g));
    case K3_ACT_SITU: {
        const float b = d->situ_beta;
        const float lb = d->situ_linear_beta;
        float a = b * tanhf(g / b) * k3_act_sigmoid(g);
        float up = lb > 0.0f ? lb * tanhf(u / lb) : u;
        return a * up;
    }
    case K3_ACT_RELU2_NO_MUL:
    default:
        return k3_act_relu2(g);
    }
}

/* Width of the GEMM1 output a kind needs per output element: 2 for gated kinds, 1 for RELU2_NO_MUL. */
K3_HD int32_t k3_act_width_factor(k3_act_kind kind) { return kind == K3_ACT_RELU2_NO_MUL ? 1 : 2; }

/* Gated kinds read in[0..2*dim) in the kind's layout ([gate(dim), up(dim)], or interleaved g = in[2i],
 * u = in[2i+1] for SWIGLUOAI); RELU2_NO_MUL reads in[0..dim). Writes out[0..dim). */
K3_HD void k3_act_row(const k3_act_desc *d, const float *in, float *out, int64_t dim) {
    if (d->kind == K3_ACT_RELU2_NO_MUL) {
        for (int64_t i = 0; i < dim; i++) out[i] = k3_act_relu2(in[i]);
    } else if (d->kind == K3_ACT_SWIGLUOAI) {
        for (int64_t i = 0; i < dim; i++) out[i] = k3_act_gated(d, in[2 * i], in[2 * i + 1]);
    } else {
        for (int64_t i = 0; i < dim; i++) out[i] = k3_act_gated(d, in[i], in[dim + i]);
    }
}

#endif
