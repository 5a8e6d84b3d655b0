/* Lossless FP4 format changes for `k3 convert`: the E2M1 codes stay, only the block scales are re-expressed.
 * A matrix is [rows, cols] elements, its codes [rows, cols/2] bytes (two codes a byte), its scales row-major. */
#ifndef K3_TOOLS_CONVERT_FP4_H
#define K3_TOOLS_CONVERT_FP4_H

#include <stddef.h>
#include <stdint.h>

/* The binades of one MXFP4 matrix's blocks that hold a non-zero code (all-zero blocks are exact at any scale). */
typedef struct k3_convert_span {
    int any;                        /* some block has a non-zero code */
    int emin, emax;                 /* unbiased exponents (UE8M0 byte - 127) */
    int64_t min_row, min_blk, max_row, max_blk; /* where they are (messages) */
} k3_convert_span;

/* The E4M3 exponents 2^-9 .. 2^8 are exact, so a matrix converts exactly when emax - emin <= this. */
#define K3_CONVERT_MAX_SPAN 17

void k3_convert_mx_span(const uint8_t *codes, const uint8_t *scales, int64_t rows, int64_t cols,
                        k3_convert_span *span);
/* The scale_2 exponent for a span: emax - 8 (so the largest block scale is E4M3 2^8), 0 for an all-zero matrix.
   Returns 0 when the span is wider than K3_CONVERT_MAX_SPAN. */
int k3_convert_mx_base(const k3_convert_span *span, int *base);
/* Each 32-block's 2^e becomes two 16-block E4M3 scales 2^(e - base); an all-zero block whose 2^(e - base) is not
   exact gets scale 0. out holds rows * cols/16 bytes. */
void k3_convert_mx_to_nv(const uint8_t *scales, int64_t rows, int64_t cols, int base, uint8_t *out);

/* Why an NVFP4 matrix has no exact MXFP4 form: the first 32-block that fails. */
typedef struct k3_convert_inexact {
    int64_t row, blk; /* 32-block index */
    double s0, s1;    /* the two 16-blocks' effective scales e4m3 * scale_2 */
    const char *why;
} k3_convert_inexact;
/* NVFP4 scales (rows * cols/16, E4M3) with scale_2 to UE8M0 (rows * cols/32): exact when every 32-block's
   non-zero-code halves share one power-of-two effective scale 2^k, -127 <= k <= 127 (an all-zero block gets 0).
   Returns 0 with *bad filled otherwise. */
int k3_convert_nv_to_mx(const uint8_t *codes, const uint8_t *scales, float scale_2, int64_t rows, int64_t cols,
                        uint8_t *out, k3_convert_inexact *bad);

#endif
