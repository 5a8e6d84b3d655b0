/* gpu_moe: what its files share (the program's contexts and stream, the experts' test data). One program of
 * several files: tests/gpu_moe.c (main, the groups, the experts' cases) and tests/gpu_moe/ (router, dispatch,
 * latent block, data), built together with K3T_SHARED_STATE so that they count into the same totals. */
#ifndef K3_TESTS_GPU_MOE_H
#define K3_TESTS_GPU_MOE_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "k3.h"
#include "k3t_harness_cuda.h"
#include "test_util.h"

extern k3_ctx *g_gpu, *g_cpu; /* a CUDA context and the CPU reference context of the running group */
extern cudaStream_t g_stream;
/* Seconds on the monotonic clock. */
double now_s(void);

/* ROUTE_DUP: every slot of a token names the same expert (3 % E): one expert gets M * k pairs, more than one
 * pass takes at decode sizes (a router never repeats an id; the kernels must still handle it) */
/* ROUTE_EP: random ids with some slots dropped as expert parallelism drops them: -1 (the expert is on another
 * rank), E and beyond, INT32_MIN; token 1 has every slot -1 (a zero row). The CPU reference drops them too. */
enum { ROUTE_RANDOM = 0, ROUTE_ONE_EXPERT = 1, ROUTE_LOW_EXPERTS = 2, ROUTE_DUP = 3, ROUTE_EP = 4 };

typedef struct mcase {
    k3t_case c; /* name: the tag; shape = {E, top_k, L, I}; m = M; options = the routing (ROUTE_*) */
    k3_weight_format fmt;
    k3_scale_layout layout;
    int32_t sep;
    k3_moe_mode mode;
    k3_act_kind act;
    int32_t graph; /* also capture + replay with new routing */
} mcase;

typedef struct moe_data {
    k3_moe_desc d;
    size_t w13_b, w2_b, w13s_b, w2s_b, s2_13;
    uint8_t *w13, *w2, *w13s, *w2s;
    float *s13, *s2, *in13, *in2;
    k3_moe_weights hw, dw; /* host and device pointers */
} moe_data;

/* The routing of case c (ROUTE_*) into ids [m, k] and weights. */
void fill_routing(const mcase *c, int32_t route, k3t_rng *rng, int32_t *ids, float *wts);
/* The case's weights quantized on the host and copied to the device; 0 on failure (counted). */
int moe_data_make(moe_data *md, const mcase *c, k3t_rng *rng);
void moe_data_free(moe_data *md);
const char *fmt_name(k3_weight_format f);

/* The groups that live in tests/gpu_moe/. */
void gpu_moe_router_group(void);
void gpu_moe_dispatch_group(void);
void gpu_moe_latent_group(int quick);

#endif
