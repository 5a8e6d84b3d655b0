/* The public BF16 linear API: validation, plan creation (table resolution + the cuBLASLt fallback), run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "plan/linear_plan.h"
#ifdef K3_HAVE_CUDA
#include "cuda/gemm/cublaslt.h"
#include "cuda/gemm/gemm.h"
#endif

/* Shapes beyond this are rejected: the kernels index within a row with 32-bit integers. */
#define K3_LINEAR_MAX_DIM ((int64_t)1 << 30)
#define K3_LINEAR_ALIGN 16 /* bytes: every kernel (and the cuBLASLt algorithms we ask for) read 16-byte vectors */

void k3_linear_desc_init(k3_linear_desc *d, int64_t n, int64_t k) {
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->n = n;
    d->k = k;
    d->max_m = 16;
    d->accum = K3_ACCUM_FP32;
    d->force_kernel = K3_KERNEL_AUTO;
}

void k3_linear_plan_destroy(k3_linear_plan *plan) {
    if (!plan) return;
#ifdef K3_HAVE_CUDA
    k3_lt_plan_destroy(plan->lt);
#endif
    free(plan);
}

static k3_status validate_desc(k3_ctx *ctx, const k3_linear_desc *d) {
    K3_CHECK_ARG(ctx, d->n >= 1 && d->n <= K3_LINEAR_MAX_DIM, "linear desc: n = %lld, expected 1..%lld",
                 (long long)d->n, (long long)K3_LINEAR_MAX_DIM);
    K3_CHECK_ARG(ctx, d->k >= 1 && d->k <= K3_LINEAR_MAX_DIM, "linear desc: k = %lld, expected 1..%lld",
                 (long long)d->k, (long long)K3_LINEAR_MAX_DIM);
    K3_CHECK_ARG(ctx, d->max_m >= 1 && d->max_m <= K3_LINEAR_MAX_M, "linear desc: max_m = %lld, expected 1..%d",
                 (long long)d->max_m, K3_LINEAR_MAX_M);
    K3_CHECK_ARG(ctx, d->x_stride == 0 || (d->x_stride >= d->k && d->x_stride <= K3_LINEAR_MAX_DIM),
                 "linear desc: x_stride = %lld, expected 0 (= k) or k (%lld) .. %lld", (long long)d->x_stride,
                 (long long)d->k, (long long)K3_LINEAR_MAX_DIM);
    K3_CHECK_ARG(ctx, d->y_stride == 0 || (d->y_stride >= d->n && d->y_stride <= K3_LINEAR_MAX_DIM),
                 "linear desc: y_stride = %lld, expected 0 (= n) or n (%lld) .. %lld", (long long)d->y_stride,
                 (long long)d->n, (long long)K3_LINEAR_MAX_DIM);
    K3_CHECK_ARG(ctx, d->accum == K3_ACCUM_FP32 || d->accum == K3_ACCUM_FP64,
                 "linear desc: accum = %d, expected K3_ACCUM_FP32 or K3_ACCUM_FP64", (int)d->accum);
    K3_CHECK_ARG(ctx, d->accum == K3_ACCUM_FP32 || ctx->backend == K3_BACKEND_CPU,
                 "linear desc: accum FP64 exists only on the CPU backend (the test oracle); use FP32 on CUDA");
    K3_CHECK_ARG(ctx, d->force_kernel >= K3_KERNEL_AUTO && d->force_kernel <= K3_KERNEL_MMA,
                 "linear desc: force_kernel = %d, expected AUTO, FALLBACK, SKINNY or MMA", (int)d->force_kernel);
    return K3_STATUS_SUCCESS;
}

#ifdef K3_HAVE_CUDA
/* The one-time set-up of every specialized configuration the plan chooses (k3_cuda_gemm_prepare), so that runs only
 * launch. */
static k3_status plan_prepare_kernels(k3_ctx *ctx, const k3_linear_plan *p) {
    for (int64_t m = 1; m <= p->max_m; m++)
        if (p->choice[m].cfg) K3_TRY(k3_cuda_gemm_prepare(ctx, p->choice[m].cfg));
    return K3_STATUS_SUCCESS;
}

/* The cuBLASLt part of a CUDA plan: made only when some M uses the fallback. */
static k3_status plan_fallback(k3_ctx *ctx, k3_linear_plan *p) {
    int any = 0;
    for (int64_t m = 1; m <= p->max_m; m++) any |= p->choice[m].kernel == K3_KERNEL_FALLBACK;
    if (!any) return K3_STATUS_SUCCESS;
    K3_TRY(k3_lt_plan_create(ctx, p->n, p->k, p->max_m, p->x_stride, p->y_stride, 0, &p->lt));
    for (int64_t m = 1; m <= p->max_m; m++) {
        k3_table_choice *c = &p->choice[m];
        if (c->kernel != K3_KERNEL_FALLBACK) continue;
        int32_t have = k3_lt_algo_count(p->lt, m);
        if (c->algo < have) continue;
        if (p->source[m] == K3_CHOICE_FORCED)
            return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT,
                           "forced cublaslt h%d: cuBLASLt's heuristic offers only %d algorithm(s) for n=%lld "
                           "k=%lld m=%lld",
                           (int)c->algo, (int)have, (long long)p->n, (long long)p->k, (long long)m);
        k3_log(ctx, K3_LOG_WARN, "%s: cublaslt h%d for %lld x %lld m=%lld but the heuristic offers %d: using h0",
               p->table, (int)c->algo, (long long)p->n, (long long)p->k, (long long)m, (int)have);
        c->algo = 0;
    }
    p->ws_bytes = k3_lt_workspace_size(p->lt);
    return K3_STATUS_SUCCESS;
}
#endif

k3_status k3_linear_plan_create(k3_ctx *ctx, const k3_linear_desc *d, k3_linear_plan **out) {
    if (!ctx) return K3_STATUS_INVALID_ARGUMENT;
    k3_clear_error(ctx);
    K3_CHECK_ARG(ctx, out != NULL, "k3_linear_plan_create: out is NULL");
    *out = NULL;
    K3_CHECK_ARG(ctx, d != NULL, "k3_linear_plan_create: desc is NULL");
    K3_TRY(validate_desc(ctx, d));

    k3_linear_plan *p = (k3_linear_plan *)calloc(1, sizeof *p);
    if (!p) return k3_fail(ctx, K3_STATUS_OUT_OF_MEMORY, "out of host memory (linear plan)");
    p->ctx = ctx;
    p->n = d->n;
    p->k = d->k;
    p->max_m = d->max_m;
    p->x_stride = d->x_stride ? d->x_stride : d->k;
    p->y_stride = d->y_stride ? d->y_stride : d->n;
    p->accum = d->accum;
    p->force_kernel = d->force_kernel;
    p->pdl = 1;
    k3_status st = k3_linear_plan_resolve(ctx, d, p);
#ifdef K3_HAVE_CUDA
    if (st == K3_STATUS_SUCCESS && ctx->backend == K3_BACKEND_CUDA) st = plan_prepare_kernels(ctx, p);
    if (st == K3_STATUS_SUCCESS && ctx->backend == K3_BACKEND_CUDA) st = plan_fallback(ctx, p);
#endif
    if (st != K3_STATUS_SUCCESS) {
        k3_linear_plan_destroy(p);
        return st;
    }
    *out = p;
    return K3_STATUS_SUCCESS;
}

k3_status k3_linear_workspace_size(const k3_linear_plan *plan, size_t *out_bytes) {
    if (!plan) return K3_STATUS_INVALID_ARGUMENT;
    k3_clear_error(plan->ctx);
    K3_CHECK_ARG(plan->ctx, out_bytes != NULL, "linear workspace size: out_bytes is NULL");
    *out_bytes = plan->ws_bytes;
    return K3_STATUS_SUCCESS;
}

k3_status k3_linear_plan_kernel(const k3_linear_plan *plan, int64_t m, char *buf, size_t buf_size) {
    if (!plan) return K3_STATUS_INVALID_ARGUMENT;
    k3_ctx *ctx = plan->ctx;
    k3_clear_error(ctx);
    K3_CHECK_ARG(ctx, buf != NULL && buf_size > 0, "k3_linear_plan_kernel: buf is NULL or buf_size is 0");
    K3_CHECK_ARG(ctx, m >= 1 && m <= plan->max_m, "k3_linear_plan_kernel: m = %lld, expected 1..%lld",
                 (long long)m, (long long)plan->max_m);
    const k3_table_choice c = plan->choice[m];
    char what[96];
    k3_table_choice_string(c, what, sizeof what);
    const char *why = "";
    switch (plan->source[m]) {
    case K3_CHOICE_TABLE: why = ""; break;
    case K3_CHOICE_UNLISTED: why = " [not in table]"; break;
    case K3_CHOICE_FORCED: why = " [forced]"; break;
    case K3_CHOICE_DEMOTED: why = " [table's kernel cannot run this stride]"; break;
    }
    if (ctx->backend == K3_BACKEND_CPU) {
        snprintf(buf, buf_size, "cpu reference (%s); table %s: %s%s", plan->accum == K3_ACCUM_FP64 ? "fp64" : "fp32",
                 plan->table, what, why);
        return K3_STATUS_SUCCESS;
    }
#ifdef K3_HAVE_CUDA
    if (c.kernel == K3_KERNEL_FALLBACK) {
        snprintf(buf, buf_size, "%s (algo id %d)%s", what, (int)k3_lt_algo_id(plan->lt, m, c.algo), why);
        return K3_STATUS_SUCCESS;
    }
#endif
    snprintf(buf, buf_size, "%s%s", what, why);
    return K3_STATUS_SUCCESS;
}

static int misaligned(const void *p) { return ((uintptr_t)p % K3_LINEAR_ALIGN) != 0; }

k3_status k3_linear_run(k3_linear_plan *plan, int64_t m, const void *x, const void *w, const void *residual,
                        void *y, void *ws, size_t ws_bytes, void *stream) {
    if (!plan) return K3_STATUS_INVALID_ARGUMENT;
    k3_ctx *ctx = plan->ctx;
    k3_clear_error(ctx);
    K3_CHECK_ARG(ctx, m >= 1 && m <= plan->max_m, "k3_linear_run: m = %lld, expected 1..max_m (%lld)",
                 (long long)m, (long long)plan->max_m);
    K3_CHECK_ARG(ctx, x != NULL && w != NULL && y != NULL, "k3_linear_run: x, w and y must be non-NULL (x %s, w %s, y %s)",
                 x ? "ok" : "NULL", w ? "ok" : "NULL", y ? "ok" : "NULL");
    K3_CHECK_ARG(ctx, !misaligned(x) && !misaligned(w) && !misaligned(y) && !misaligned(residual),
                 "k3_linear_run: x, w, y and residual must be 16-byte aligned (misaligned:%s%s%s%s)",
                 misaligned(x) ? " x" : "", misaligned(w) ? " w" : "", misaligned(y) ? " y" : "",
                 misaligned(residual) ? " residual" : "");
    K3_CHECK_ARG(ctx, ws_bytes >= plan->ws_bytes && (plan->ws_bytes == 0 || ws != NULL),
                 "k3_linear_run: workspace of %zu bytes at %p, the plan needs %zu (k3_linear_workspace_size)",
                 ws_bytes, ws, plan->ws_bytes);

    if (ctx->backend == K3_BACKEND_CPU) {
        k3_cpu_linear(m, plan->n, plan->k, (const uint16_t *)x, plan->x_stride, (const uint16_t *)w,
                      (const uint16_t *)residual, (uint16_t *)y, plan->y_stride, plan->accum);
        return K3_STATUS_SUCCESS;
    }
#ifdef K3_HAVE_CUDA
    const k3_table_choice *c = &plan->choice[m];
    if (c->kernel == K3_KERNEL_FALLBACK)
        return k3_lt_run(ctx, plan->lt, m, c->algo, x, w, residual, y, ws, ws_bytes, stream);
    const k3_gemm_args a = {m, plan->n, plan->k, x, plan->x_stride, w, residual, y, plan->y_stride};
    return k3_cuda_gemm_launch(ctx, c->cfg, &a, stream, plan->pdl);
#else
    (void)stream;
    return k3_fail(ctx, K3_STATUS_INTERNAL_ERROR, "a CUDA plan in a build without CUDA");
#endif
}

k3_status k3_ctx_load_table(k3_ctx *ctx, const char *path, int32_t force) {
    if (!ctx) return K3_STATUS_INVALID_ARGUMENT;
    k3_clear_error(ctx);
    if (!path) return k3_linear_ctx_parse_embedded(ctx); /* back to the embedded table */
    FILE *f = fopen(path, "rb");
    if (!f) return k3_fail(ctx, K3_STATUS_IO_ERROR, "cannot open table file '%s'", path);
    const size_t max_bytes = (size_t)16 << 20; /* a table is a few KB; refuse anything absurd */
    char *text = (char *)malloc(max_bytes + 1);
    if (!text) {
        fclose(f);
        return k3_fail(ctx, K3_STATUS_OUT_OF_MEMORY, "out of host memory reading '%s'", path);
    }
    size_t len = fread(text, 1, max_bytes + 1, f);
    int read_error = ferror(f);
    fclose(f);
    if (read_error) {
        free(text);
        return k3_fail(ctx, K3_STATUS_IO_ERROR, "error reading table file '%s'", path);
    }
    if (len > max_bytes) {
        free(text);
        return k3_fail(ctx, K3_STATUS_FORMAT_ERROR, "table file '%s' is larger than %zu bytes", path, max_bytes);
    }
    text[len] = '\0';
    if (strlen(text) != len) {
        free(text);
        return k3_fail(ctx, K3_STATUS_FORMAT_ERROR, "table file '%s' contains a NUL byte (not a text table)", path);
    }
    char err[512];
    k3_table *t = NULL;
    k3_status st = k3_table_parse(text, path, &t, err, sizeof err);
    free(text);
    if (st == K3_STATUS_OUT_OF_MEMORY) return k3_fail(ctx, st, "out of host memory parsing '%s'", path);
    if (st != K3_STATUS_SUCCESS) return k3_fail(ctx, st, "%s", err);
    st = k3_table_check_key(ctx, t, force);
    if (st != K3_STATUS_SUCCESS) {
        k3_table_destroy(t);
        return st;
    }
    k3_table_destroy(ctx->table);
    ctx->table = t;
    k3_log(ctx, K3_LOG_INFO, "loaded GEMM table %s (%d shapes)", path, (int)t->n_rows);
    return K3_STATUS_SUCCESS;
}
