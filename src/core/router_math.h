/*
 * The router's transcendental math, one definition for host C and CUDA device code.
 *
 * Why not expf: glibc's expf (with or without its FMA variant) and CUDA's expf may differ by an ulp, and the
 * router must give bitwise the same weights on both backends. This exp uses only IEEE-correctly rounded
 * + - * / and exact integer exponent manipulation, with every operation spelled out (K3_RM_MUL etc.) so that
 * nvcc cannot fuse a product into an add (host C is compiled -std=c11, i.e. -ffp-contract=off). Accuracy:
 * within 2 ulp of exp over the whole fp32 range (checked against fp64 by tests/test_router.c's weights).
 */
#ifndef K3_CORE_ROUTER_MATH_H
#define K3_CORE_ROUTER_MATH_H

#include <stdint.h>

#include "core/bf16.h" /* K3_HD, k3_bits_f32 */

#if defined(__CUDA_ARCH__)
#define K3_RM_MUL(a, b) __fmul_rn((a), (b))
#define K3_RM_ADD(a, b) __fadd_rn((a), (b))
#define K3_RM_SUB(a, b) __fsub_rn((a), (b))
#define K3_RM_DIV(a, b) __fdiv_rn((a), (b))
#else
#define K3_RM_MUL(a, b) ((a) * (b))
#define K3_RM_ADD(a, b) ((a) + (b))
#define K3_RM_SUB(a, b) ((a) - (b))
#define K3_RM_DIV(a, b) ((a) / (b))
#endif

/* 2^n for n in [-126, 127], exact. */
K3_HD float k3_rm_pow2(int32_t n) { return k3_bits_f32((uint32_t)(n + 127) << 23); }

/*
 * e^x: x = n ln2 + r with |r| <= ln2/2 (Cody-Waite, ln2 split so n * LN2_HI is exact), e^r by a degree-7
 * Taylor polynomial (truncation error < 2^-27 on that interval), scaled by 2^n in two exact-or-once-rounded
 * steps so subnormal results round once. NaN -> NaN, +inf -> +inf, -inf -> 0.
 */
K3_HD float k3_rm_exp(float x) {
    if (x != x) return x;
    if (x > 88.72283935546875f) return k3_bits_f32(0x7f800000u);
    if (x < -104.0f) return 0.0f;
    /* n = nearest integer to x / ln2; the float -> int conversion truncates, so round half away by hand */
    const float t = K3_RM_MUL(x, 1.44269502162933349609375f);
    const int32_t n = (int32_t)(t >= 0.0f ? K3_RM_ADD(t, 0.5f) : K3_RM_SUB(t, 0.5f));
    const float fn = (float)n;
    const float ln2_hi = 0.693145751953125f;           /* 16 significant bits: fn * ln2_hi is exact */
    const float ln2_lo = 1.4286068203094172321e-06f;   /* ln2 - ln2_hi */
    const float r = K3_RM_SUB(K3_RM_SUB(x, K3_RM_MUL(fn, ln2_hi)), K3_RM_MUL(fn, ln2_lo));
    /* Horner: 1 + r(1 + r/2(1 + r/3(1 + r/4(1 + r/5(1 + r/6(1 + r/7)))))) in product form of coefficients */
    float p = 1.9841270e-4f;                           /* 1/5040 */
    p = K3_RM_ADD(K3_RM_MUL(p, r), 1.3888889e-3f);     /* 1/720 */
    p = K3_RM_ADD(K3_RM_MUL(p, r), 8.3333333e-3f);     /* 1/120 */
    p = K3_RM_ADD(K3_RM_MUL(p, r), 4.1666667e-2f);     /* 1/24 */
    p = K3_RM_ADD(K3_RM_MUL(p, r), 1.6666667e-1f);     /* 1/6 */
    p = K3_RM_ADD(K3_RM_MUL(p, r), 0.5f);
    p = K3_RM_ADD(K3_RM_MUL(p, r), 1.0f);
    p = K3_RM_ADD(K3_RM_MUL(p, r), 1.0f);
    /* n in [-150, 128]: split so each factor is a normal power of two */
    const int32_t n1 = n / 2, n2 = n - n1;
    return K3_RM_MUL(K3_RM_MUL(p, k3_rm_pow2(n1)), k3_rm_pow2(n2));
}

/* 1 / (1 + e^-x), exponential only of a non-positive number (no inf / inf). NaN -> NaN. */
K3_HD float k3_rm_sigmoid(float x) {
    if (x >= 0.0f) return K3_RM_DIV(1.0f, K3_RM_ADD(1.0f, k3_rm_exp(-x)));
    const float e = k3_rm_exp(x);
    return K3_RM_DIV(e, K3_RM_ADD(1.0f, e));
}

#endif
