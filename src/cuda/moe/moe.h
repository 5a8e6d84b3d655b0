/* C-callable launchers of the routed-experts (MoE) kernels, called by src/api/moe.c for CUDA contexts.
 * Only compiled into CUDA builds: the API files call them under
 * #ifdef K3_HAVE_CUDA (a CPU-only build cannot create a CUDA context, so it never needs them).
 * None of them allocates, synchronizes or reads device data on the host (CUDA-graph capturable). */
#ifndef K3_CUDA_MOE_MOE_H
#define K3_CUDA_MOE_MOE_H

#include <stddef.h>

#include "core/internal.h"
#include "plan/moe_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- routed experts (src/cuda/moe/dispatch.cu, src/cuda/moe/) ------------------------------------------- */

/* What the CUDA MoE needs beyond the validated descriptor. */
typedef struct k3_cuda_moe {
    k3_moe_desc d;
    int64_t w1_rows;                          /* 2I (gated) or I (RELU2_NO_MUL) */
    size_t w13_expert_bytes, w2_expert_bytes; /* weight bytes of one expert */
    size_t w13_scale_bytes, w2_scale_bytes;   /* block-scale bytes of one expert (swizzle padding included) */
    int32_t smem_per_sm, smem_reserved;       /* the device's shared memory per SM and reserved per block */
} k3_cuda_moe;

/* Plan-time check of what the CUDA kernels support beyond the descriptor rules (UNSUPPORTED + message when
 * not: L and I must be multiples of 32), and fills p. */
k3_status k3_cuda_moe_prepare(k3_ctx *ctx, k3_cuda_moe *p, const k3_moe_desc *d);
/* Device workspace for d.max_tokens tokens (dispatch lists, activations, per-(token, slot) outputs). */
size_t k3_cuda_moe_ws_bytes(const k3_cuda_moe *p);
/* The routed experts of k3_moe_run on `stream`, launched as the plan's row `l` for this m says
 * (src/plan/moe_plan.h). Ids outside [0, E) cannot be reported without a host sync: such (token, slot) pairs are
 * skipped (they contribute nothing). Pointers were checked by the caller. */
k3_status k3_cuda_moe_run(k3_ctx *ctx, const k3_cuda_moe *p, const k3_moe_launch *l, int64_t m, const void *x,
                          const int32_t *topk_ids, const float *topk_weights, const k3_moe_weights *w, void *out,
                          float *out_f32, void *ws, void *stream);

/* The launch sequence cut after a stage (the per-stage breakdown of `k3 bench moe`): stages =
 * K3_CUDA_MOE_STAGE_DISPATCH runs the dispatch only (also where the plan folds it into the GEMMs: then it is not
 * part of the call and runs for reference), _GEMM1 adds the W4A4 quantization and GEMM1 (with the activation),
 * _GEMM2 adds GEMM2 (the weighted per-pair outputs), _ALL the combine (= k3_cuda_moe_run). */
enum { K3_CUDA_MOE_STAGE_DISPATCH = 1, K3_CUDA_MOE_STAGE_GEMM1 = 2, K3_CUDA_MOE_STAGE_GEMM2 = 3, K3_CUDA_MOE_STAGE_ALL = 4 };
k3_status k3_cuda_moe_run_stages(k3_ctx *ctx, const k3_cuda_moe *p, const k3_moe_launch *l, int64_t m,
                                 const void *x, const int32_t *topk_ids, const float *topk_weights,
                                 const k3_moe_weights *w, void *out, float *out_f32, void *ws, void *stream,
                                 int32_t stages);

/* The dispatch step alone (exposed for tests and the benchmark): from ids [np] in [0, E), writes
 * offs [E + 1] (prefix offsets of the per-expert counts); the units: each touched expert's pairs cut into runs of
 * at most tokens_per_unit, in ascending expert id then pair order, *n_active of them, active [u] = the unit's
 * expert and act_off [u] = its first pair, act_off[*n_active] = offs[E] (both arrays hold at least
 * min(E, np) + np / tokens_per_unit + 1 entries); and list [np] (pair indices grouped by expert, ascending pair
 * index within an expert); with wts [np] given, also wsort [np] = wts [list [p]] (the routing weight of each grouped
 * pair: GEMM2 reads it without a round trip through list). wts and wsort: both or neither (NULL).
 * cur [E] is scratch (used past 8192 experts; fewer fit in shared memory). One block; bounded loops; no host
 * knowledge of the ids. */
k3_status k3_cuda_moe_dispatch(k3_ctx *ctx, const int32_t *ids, int32_t np, int32_t num_experts,
                               int32_t tokens_per_unit, int32_t *offs, int32_t *cur, int32_t *active,
                               int32_t *act_off, int32_t *n_active, int32_t *list, const float *wts, float *wsort,
                               void *stream);

/* Expert parallelism: local[i] = map[ids[i]] for ids in [0, global_experts), else -1 (i < n), on `stream`; the
 * map is device memory (checked here: host memory is refused outside graph capture). One small kernel before the
 * experts' launches, which then take local ids. */
k3_status k3_cuda_moe_map_ids_launch(k3_ctx *ctx, const int32_t *ids, int32_t n, const int32_t *map,
                                     int32_t global_experts, int32_t *local, void *stream);

#ifdef K3_MOE_TRACE
/* Diagnostic builds only (-DK3_MOE_TRACE, src/cuda/moe/trace.cuh): blocks traced per kernel (GEMM1, GEMM2, the
 * combine) and stamp words per block. k3x_moe_trace (launch.cu): reset != 0 zeroes the launch counts (before the
 * traced replays); else copies the stamps ([2][MT_*_BLOCKS][MT_WORDS] each) and the counts ([MT_*_BLOCKS]) out.
 * 0 on success. */
enum { MT_G1_BLOCKS = 4096, MT_G2_BLOCKS = 8192, MT_CB_BLOCKS = 256, MT_WORDS = 8 };
int k3x_moe_trace(int reset, unsigned long long *g1, unsigned *g1n, unsigned long long *g2, unsigned *g2n,
                  unsigned long long *cb, unsigned *cbn);
#endif

#ifdef __cplusplus
}
#endif
#endif
