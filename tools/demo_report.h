/* k3 demo --json: what the demo measured, gathered as it runs and printed as one JSON object
 * (tools/demo_report.c). */
#ifndef K3_TOOLS_DEMO_REPORT_H
#define K3_TOOLS_DEMO_REPORT_H

#include <stdint.h>

#include "block_bench.h"

#define K3_DEMO_MAX_M 64
#define K3_DEMO_STAGES 5 /* router, down, experts, norm+up, shared */

/* One block's shape: E experts top-k, hidden H, latent L, expert width I, shared width Is. */
typedef struct k3_demo_shape {
    int32_t e, k;
    int64_t h, l, i, is;
} k3_demo_shape;

/* The correctness line. */
typedef struct k3_demo_check {
    int ran;            /* 0: it failed before a verdict (a message said why) */
    int against_cpu;    /* 1: CUDA vs the CPU reference backend; 0: the CPU batch vs token by token */
    k3_demo_shape shape;
    int64_t m;
    int ids_identical;  /* routing ids equal (CUDA) / every row bitwise equal (CPU) */
    int finite;
    double rel_l2, bar; /* CUDA only */
    int pass;
} k3_demo_check;

typedef struct k3_demo_report {
    const char *backend, *device;
    int fell_back;            /* a CUDA context without the MoE: the CPU ran instead */
    uint64_t seed;
    k3_demo_shape shape;
    double synth_s, copy_s;   /* copy_s < 0: no device copy (CPU) */
    double bytes_fp4, bytes_dense;
    int nm;                   /* token counts run so far */
    int64_t m[K3_DEMO_MAX_M];
    int has_stages;           /* per-stage times exist (CPU form of the plan) */
    double stage_ms[K3_DEMO_MAX_M][K3_DEMO_STAGES], total_ms[K3_DEMO_MAX_M];
    int graph;                /* CUDA: pt[] holds `k3 bench block`'s measurement instead of the host-clock times */
    int32_t copies;           /* graph: weight copies rotated */
    int64_t reps;             /* graph: timed replays per variant */
    bb_point pt[K3_DEMO_MAX_M];
    k3_demo_check check;
    double total_s;
    int pass;
} k3_demo_report;

/* Prints the report as one JSON object and a newline on stdout. */
void k3_demo_report_print(const k3_demo_report *r);

#endif
