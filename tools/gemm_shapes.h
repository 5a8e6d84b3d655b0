/* The Kimi-K3 decode GEMM shape sets (docs/model.md, section 1) and the parser of --shapes, shared by
 * `k3 plan`, `k3 bench gemm` and `k3 tune`. */
#ifndef K3_TOOLS_GEMM_SHAPES_H
#define K3_TOOLS_GEMM_SHAPES_H

#include <stdint.h>

#define K3_SHAPES_MAX 256

typedef struct k3_shape {
    int64_t n, k;
} k3_shape;

/*
 * Fills out[] from a --shapes value and returns the count (0 after printing an error to stderr):
 *   "tp8"            the 14 TP8 decode shapes of docs/model.md (the GEMM bars' set, docs/benchmarks.md)
 *   "all"            tp8 plus the 13 TP4/TP16 shapes listed there (27)
 *   "k3"             default_set ("tp8" for the benchmark, "all" for the tuner)
 *   "N,K[,N,K...]"   explicit shapes (also "NxK,NxK")
 *   FILE             when allow_file and the value names a readable file: one "N K" (or N,K / NxK) per line,
 *                    '#' comments
 * Duplicates are dropped.
 */
int k3_shapes_parse(const char *value, const char *default_set, int allow_file, k3_shape *out, int cap);

#endif
