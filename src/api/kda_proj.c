/* The KDA projection (k3.h): QKVG through the linear plan on the caller's stream;
 * F_AB (run_n) then F_B (run_k) on an auxiliary stream, forked and joined by events made at plan time. Where the
 * tuning chooses K3_KDA_RUN_N_FUSED and the plan overlaps, the three instead run concurrently inside one launch on
 * the caller's stream, on disjoint SMs (src/cuda/kda/fused.cu). */
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "cuda/common/fork_join.h"
#include "cuda/kda/proj.h"
#include "plan/kda_tuning.h"

/* Bounds that keep every row count an int on CUDA and every product far from overflow: 4 * heads * head_dim
 * <= 2^22 QKVG rows, packed_rows * hidden <= 2^37 weight elements. */
#define K3_KDA_MAX_HEADS 4096
#define K3_KDA_MAX_HEAD_DIM 1024
#define K3_KDA_MAX_PACKED_ROWS (INT64_C(1) << 24)

struct k3_kda_proj_plan {
    k3_ctx *ctx;
    k3_kda_proj_desc d;
    int64_t qkvg_rows, fab_rows, fb_rows;
    k3_linear_plan *qkvg[3];  /* the big GEMM: [0] through the GEMM table, [1] through cuBLASLt, [2] the one-launch
                                 projection's tile configuration (each made if used) */
    k3_linear_plan *qkvg_for[K3_KDA_MAX_TOKENS + 1]; /* per m: one of the three */
    size_t ws_bytes;          /* what the QKVG plans need */
    k3_fork_join *fj;         /* CUDA only */
    k3_cuda_kda_sliced *sliced; /* CUDA only, when some m takes the SLICED F_AB shape */
    k3_cuda_kda_fused *fused;   /* CUDA only, when some m runs the whole projection in one launch (FUSED) */
    k3_kda_tuning tuning;
};

void k3_kda_proj_desc_init(k3_kda_proj_desc *d) {
    if (!d) return;
    d->hidden = 7168;
    d->local_heads = 12;
    d->head_dim = 128;
    d->fa_dim = 128;
    d->packed_rows = 6288;
    d->max_tokens = 16;
    d->overlap_max_tokens = -1;
    d->run_n_shape = K3_KDA_RUN_N_TUNED;
    d->qkvg_kernel = K3_KDA_QKVG_TUNED;
}

static k3_status kda_validate(k3_ctx *ctx, const k3_kda_proj_desc *d) {
    K3_CHECK_ARG(ctx, d->hidden >= 512 && d->hidden <= 8192 && d->hidden % 512 == 0,
                 "kda: hidden must be a multiple of 512 in [512, 8192] (one run_n block spans K), got %lld",
                 (long long)d->hidden);
    K3_CHECK_ARG(ctx, d->local_heads >= 1 && d->local_heads <= K3_KDA_MAX_HEADS,
                 "kda: local_heads must be in [1, %d] (got %lld)", K3_KDA_MAX_HEADS, (long long)d->local_heads);
    K3_CHECK_ARG(ctx, d->head_dim >= 8 && d->head_dim <= K3_KDA_MAX_HEAD_DIM && d->head_dim % 8 == 0,
                 "kda: head_dim must be a multiple of 8 in [8, %d] (got %lld)", K3_KDA_MAX_HEAD_DIM,
                 (long long)d->head_dim);
    K3_CHECK_ARG(ctx, d->packed_rows >= 1 && d->packed_rows <= K3_KDA_MAX_PACKED_ROWS,
                 "kda: packed_rows must be in [1, %lld] (got %lld)", (long long)K3_KDA_MAX_PACKED_ROWS,
                 (long long)d->packed_rows);
    K3_CHECK_ARG(ctx, d->fa_dim == K3_KDA_FA_DIM, "kda: fa_dim must be %d (run_k: 16 lanes x 8), got %lld",
                 K3_KDA_FA_DIM, (long long)d->fa_dim);
    const int64_t qkvg = 4 * d->local_heads * d->head_dim, fab = d->packed_rows - qkvg;
    K3_CHECK_ARG(ctx, fab >= d->fa_dim + d->local_heads,
                 "kda: packed_rows %lld leaves %lld F_AB rows after the %lld QKVG rows; need f_a (%lld) + beta "
                 "(%lld)", (long long)d->packed_rows, (long long)fab, (long long)qkvg, (long long)d->fa_dim,
                 (long long)d->local_heads);
    K3_CHECK_ARG(ctx, fab % 8 == 0,
                 "kda: the F_AB row count %lld (packed_rows - 4*heads*head_dim) must be a multiple of 8 so f_a rows "
                 "stay 16-byte aligned", (long long)fab);
    K3_CHECK_ARG(ctx, d->max_tokens >= 1 && d->max_tokens <= K3_KDA_MAX_TOKENS,
                 "kda: max_tokens must be in [1, %d], got %lld", K3_KDA_MAX_TOKENS, (long long)d->max_tokens);
    K3_CHECK_ARG(ctx, d->overlap_max_tokens >= -1 && d->overlap_max_tokens <= d->max_tokens,
                 "kda: overlap_max_tokens must be -1 (tuned) or in [0, max_tokens], got %lld",
                 (long long)d->overlap_max_tokens);
    K3_CHECK_ARG(ctx, (int)d->run_n_shape >= K3_KDA_RUN_N_TUNED && (int)d->run_n_shape <= K3_KDA_RUN_N_FUSED,
                 "kda: run_n_shape must be K3_KDA_RUN_N_TUNED (0), _ROWS1 (1), _ROWS2 (2), _NARROW (3), _SLICED (4) or "
                 "_FUSED (5), got %d",
                 (int)d->run_n_shape);
    K3_CHECK_ARG(ctx, d->run_n_shape != K3_KDA_RUN_N_NARROW || d->hidden % 1024 == 0,
                 "kda: run_n_shape K3_KDA_RUN_N_NARROW needs hidden %% 1024 == 0 (128 threads x 8-element vectors), "
                 "got hidden %lld", (long long)d->hidden);
    K3_CHECK_ARG(ctx, (int)d->qkvg_kernel >= K3_KDA_QKVG_TUNED && (int)d->qkvg_kernel <= K3_KDA_QKVG_CUBLASLT,
                 "kda: qkvg_kernel must be K3_KDA_QKVG_TUNED (0), _TABLE (1) or _CUBLASLT (2), got %d",
                 (int)d->qkvg_kernel);
    return K3_STATUS_SUCCESS;
}

k3_status k3_kda_proj_plan_create(k3_ctx *ctx, const k3_kda_proj_desc *d, k3_kda_proj_plan **out) {
    if (!ctx) return K3_STATUS_INVALID_ARGUMENT;
    k3_clear_error(ctx);
    K3_CHECK_ARG(ctx, d && out, "kda: desc and out must not be NULL");
    *out = NULL;
    K3_TRY(kda_validate(ctx, d));
    k3_kda_proj_plan *p = (k3_kda_proj_plan *)calloc(1, sizeof *p);
    if (!p) return k3_fail(ctx, K3_STATUS_OUT_OF_MEMORY, "out of host memory");
    p->ctx = ctx;
    p->d = *d;
    p->qkvg_rows = 4 * d->local_heads * d->head_dim;
    p->fab_rows = d->packed_rows - p->qkvg_rows;
    p->fb_rows = d->local_heads * d->head_dim;
    k3_status st = k3_kda_tuning_for_ctx(ctx, &p->tuning);
    if (st != K3_STATUS_SUCCESS) {
        free(p);
        return st;
    }
    if (p->d.overlap_max_tokens < 0) /* the table's crossover, never past what the plan accepts */
        p->d.overlap_max_tokens =
            p->tuning.overlap_max_tokens < d->max_tokens ? p->tuning.overlap_max_tokens : d->max_tokens;
    if (d->run_n_shape != K3_KDA_RUN_N_TUNED) /* a forced shape */
        for (int i = 1; i <= K3_KDA_MAX_TOKENS; i++) p->tuning.run_n_shape[i] = d->run_n_shape;
    /* The one-launch projection needs its grid to fit this device at once. Tuned and not fitting: the table's
     * unfused choice runs instead, in overlapped and sequential plans alike (so they stay bitwise equal).
     * Forced: refused where it would launch (m <= overlap_max_tokens); a sequential plan runs its sequential form. */
    int tuned_fused = 0;
    for (int64_t m = 1; m <= d->max_tokens; m++) tuned_fused |= p->tuning.run_n_shape[m] == K3_KDA_RUN_N_FUSED;
    k3_kda_fused_layout layout;
    memset(&layout, 0, sizeof layout);
    const char *why = NULL;
    const int fits = ctx->backend == K3_BACKEND_CUDA && tuned_fused &&
                     k3_kda_fused_layout_for(ctx->arch.sm_count, d->hidden, p->qkvg_rows, p->fab_rows, p->fb_rows,
                                             d->fa_dim, &layout, &why);
    if (ctx->backend == K3_BACKEND_CUDA && tuned_fused && !fits) {
        if (d->run_n_shape == K3_KDA_RUN_N_FUSED && p->d.overlap_max_tokens > 0) {
            const long long qkvg_rows = (long long)p->qkvg_rows;
            free(p);
            return k3_fail(ctx, K3_STATUS_UNSUPPORTED,
                           "kda: run_n_shape K3_KDA_RUN_N_FUSED does not fit this shape on this device (%d SMs, "
                           "%lld QKVG rows): %s",
                           (int)ctx->arch.sm_count, qkvg_rows, why);
        }
        if (d->run_n_shape != K3_KDA_RUN_N_FUSED) k3_kda_tuning_drop_fused(&p->tuning);
    }
    for (int i = 1; i <= K3_KDA_MAX_TOKENS; i++) /* NARROW only where hidden allows it */
        if (p->tuning.run_n_shape[i] == K3_KDA_RUN_N_NARROW && d->hidden % 1024 != 0)
            p->tuning.run_n_shape[i] = K3_KDA_RUN_N_ROWS1;
    int any_fused = 0; /* the one launch runs where it is chosen and the plan overlaps */
    for (int64_t m = 1; m <= p->d.overlap_max_tokens; m++)
        any_fused |= fits && p->tuning.run_n_shape[m] == K3_KDA_RUN_N_FUSED;

    /* the QKVG kernel per m (tuned, or the caller's for every m), the same for both paths; where the one-launch
     * projection runs on CUDA, the sequential path takes the linear plan's configuration of its QKVG tiles, so qkvg
     * has the same bits either way */
    for (int64_t m = 1; m <= d->max_tokens && st == K3_STATUS_SUCCESS; m++) {
        const k3_kda_qkvg kernel = d->qkvg_kernel != K3_KDA_QKVG_TUNED ? d->qkvg_kernel : p->tuning.qkvg_kernel[m];
        const int which = ctx->backend == K3_BACKEND_CUDA && p->tuning.run_n_shape[m] == K3_KDA_RUN_N_FUSED ? 2
                          : kernel == K3_KDA_QKVG_CUBLASLT                                                     ? 1
                                                                                                              : 0;
        if (!p->qkvg[which]) {
            k3_linear_desc ld;
            k3_linear_desc_init(&ld, p->qkvg_rows, d->hidden);
            ld.max_m = d->max_tokens;
            ld.force_kernel = which == 2 ? K3_KERNEL_MMA : which == 1 ? K3_KERNEL_FALLBACK : K3_KERNEL_AUTO;
            if (which == 2) ld.force_config = K3_KDA_FUSED_QKVG_CONFIG;
            size_t bytes = 0;
            st = k3_linear_plan_create(ctx, &ld, &p->qkvg[which]);
            if (st == K3_STATUS_SUCCESS) st = k3_linear_workspace_size(p->qkvg[which], &bytes);
            if (bytes > p->ws_bytes) p->ws_bytes = bytes;
        }
        p->qkvg_for[m] = p->qkvg[which];
    }
    if (st == K3_STATUS_SUCCESS && ctx->backend == K3_BACKEND_CUDA && p->d.overlap_max_tokens > 0)
        st = k3_fork_join_create(ctx, &p->fj);
    int any_sliced = 0;
    for (int64_t m = 1; m <= d->max_tokens; m++) any_sliced |= p->tuning.run_n_shape[m] == K3_KDA_RUN_N_SLICED;
    if (st == K3_STATUS_SUCCESS && ctx->backend == K3_BACKEND_CUDA && any_sliced)
        st = k3_cuda_kda_sliced_create(ctx, d->hidden, p->fab_rows, &p->sliced);
    if (st == K3_STATUS_SUCCESS && ctx->backend == K3_BACKEND_CUDA && any_fused)
        st = k3_cuda_kda_fused_create(ctx, &layout, &p->fused);
    if (st != K3_STATUS_SUCCESS) {
        k3_kda_proj_plan_destroy(p);
        return st;
    }
    *out = p;
    return K3_STATUS_SUCCESS;
}

void k3_kda_proj_plan_destroy(k3_kda_proj_plan *p) {
    if (!p) return;
    k3_fork_join_destroy(p->fj);
    k3_cuda_kda_sliced_destroy(p->sliced);
    k3_cuda_kda_fused_destroy(p->fused);
    k3_linear_plan_destroy(p->qkvg[0]);
    k3_linear_plan_destroy(p->qkvg[1]);
    k3_linear_plan_destroy(p->qkvg[2]);
    free(p);
}

k3_status k3_kda_proj_workspace_size(const k3_kda_proj_plan *p, size_t *out_bytes) {
    if (!p) return K3_STATUS_INVALID_ARGUMENT;
    k3_clear_error(p->ctx);
    K3_CHECK_ARG(p->ctx, out_bytes != NULL, "kda workspace size: out_bytes is NULL");
    *out_bytes = p->ws_bytes;
    return K3_STATUS_SUCCESS;
}

/* The aux branch: F_AB then F_B (which reads f_a back from the fab buffer, bf16-rounded as stored). */
static k3_status kda_branch(k3_kda_proj_plan *p, int64_t m, const uint16_t *x, const uint16_t *w_fab,
                            const void *w_fb, void *fab, void *g1, void *stream) {
    k3_ctx *ctx = p->ctx;
    if (ctx->backend == K3_BACKEND_CPU) {
        k3_cpu_linear(m, p->fab_rows, p->d.hidden, x, p->d.hidden, w_fab, NULL, (uint16_t *)fab, p->fab_rows,
                      K3_ACCUM_FP32);
        k3_cpu_linear(m, p->fb_rows, p->d.fa_dim, (const uint16_t *)fab, p->fab_rows, (const uint16_t *)w_fb, NULL,
                      (uint16_t *)g1, p->fb_rows, K3_ACCUM_FP32);
        return K3_STATUS_SUCCESS;
    }
    /* where the one-launch projection is tuned but this run is sequential: the two-row F_AB kernel */
    const k3_kda_run_n tuned = p->tuning.run_n_shape[m];
    const k3_kda_run_n shape = tuned == K3_KDA_RUN_N_FUSED ? K3_KDA_RUN_N_ROWS2 : tuned;
    K3_TRY(k3_cuda_kda_run_n(ctx, m, x, p->d.hidden, w_fab, p->fab_rows, shape, p->sliced, fab, stream));
    return k3_cuda_kda_run_k(ctx, m, fab, p->fab_rows, w_fb, p->fb_rows, shape, g1, stream);
}

static int misaligned(const void *ptr) { return ((uintptr_t)ptr & 15u) != 0; }

k3_status k3_kda_proj_run(k3_kda_proj_plan *p, int64_t m, const void *x, const void *w_packed, const void *w_fb,
                          void *qkvg, void *fab, void *g1, void *ws, size_t ws_bytes, void *stream) {
    if (!p) return K3_STATUS_INVALID_ARGUMENT;
    k3_ctx *ctx = p->ctx;
    k3_clear_error(ctx);
    K3_CHECK_ARG(ctx, m >= 1 && m <= p->d.max_tokens, "kda: m must be in [1, %lld], got %lld",
                 (long long)p->d.max_tokens, (long long)m);
    K3_CHECK_ARG(ctx, x && w_packed && w_fb && qkvg && fab && g1,
                 "kda: x, w_packed, w_fb, qkvg, fab and g1 must not be NULL");
    K3_CHECK_ARG(ctx,
                 !misaligned(x) && !misaligned(w_packed) && !misaligned(w_fb) && !misaligned(qkvg) &&
                     !misaligned(fab) && !misaligned(g1),
                 "kda: every pointer must be 16-byte aligned (x %p, w_packed %p, w_fb %p, qkvg %p, fab %p, g1 %p)",
                 x, w_packed, w_fb, qkvg, fab, g1);
    const uint16_t *w_fab = (const uint16_t *)w_packed + (size_t)p->qkvg_rows * (size_t)p->d.hidden;

    const int fused = p->tuning.run_n_shape[m] == K3_KDA_RUN_N_FUSED;
    if (ctx->backend == K3_BACKEND_CUDA && fused && m <= p->d.overlap_max_tokens) /* one launch, no fork */
        return k3_cuda_kda_fused_run(ctx, p->fused, m, p->tuning.fused_head_steps[m], x, w_packed, w_fb, qkvg, fab,
                                     g1, stream);
    if (p->fj && m <= p->d.overlap_max_tokens) {
        /* QKVG is queued before the branch (the fork is recorded first, so the branch still depends only on what
         * precedes this call): cuBLASLt's QKVG kernel takes a whole SM per block (96 blocks of 384 threads x 168
         * registers), so every branch block placed first delays one of them; queued second, the branch fills the
         * SMs QKVG leaves idle. Measured on the H200 (`k3 bench kda --diag`): +0.4..+0.8 us over QKVG alone at
         * M 1..14 instead of +0.9..+1.3 with the branch queued first. */
        K3_TRY(k3_fork_join_fork(ctx, p->fj, stream));
        K3_TRY(k3_linear_run(p->qkvg_for[m], m, x, w_packed, NULL, qkvg, ws, ws_bytes, stream));
        K3_TRY(kda_branch(p, m, (const uint16_t *)x, w_fab, w_fb, fab, g1, k3_fork_join_aux(p->fj)));
        return k3_fork_join_join(ctx, p->fj, stream);
    }
    K3_TRY(k3_linear_run(p->qkvg_for[m], m, x, w_packed, NULL, qkvg, ws, ws_bytes, stream));
    return kda_branch(p, m, (const uint16_t *)x, w_fab, w_fb, fab, g1, stream);
}
