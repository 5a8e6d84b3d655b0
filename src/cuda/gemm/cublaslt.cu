/* The cuBLASLt fallback: y = x W^T in row-major terms, which in cuBLASLt's column-major terms is
 * D[n, m] = op(A)[n, k] . B[k, m] with A = W viewed as [k, n] (ld k, transposed) and B = x viewed as [k, m]
 * (ld x_stride). The residual enters as C with beta = 1 (a residual aliasing y is staged in the workspace first). */
#include <cstdlib>
#include <cstring>

#include "cuda/common/check.cuh"
#include "cuda/gemm/cublaslt.h"
#include "cuda/common/state.cuh"

/* Upper bound offered to the heuristic; the plan reports what its kept algorithms actually need. */
#define K3_LT_MAX_WORKSPACE ((size_t)32 << 20)

struct k3_lt_plan {
    int64_t n, k, max_m;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a;                    /* W, [k, n] ld k */
    cublasLtMatrixLayout_t b[K3_LT_MAX_M + 1];   /* x, [k, m] ld x_stride */
    cublasLtMatrixLayout_t c[K3_LT_MAX_M + 1];   /* y and the residual, [n, m] ld y_stride */
    cublasLtMatmulAlgo_t algo[K3_LT_MAX_M + 1][K3_LT_KEEP_ALGOS];
    int32_t n_algo[K3_LT_MAX_M + 1];
    size_t ws_bytes;      /* cuBLASLt's own workspace (stage_off) + the residual staging area */
    size_t stage_off;     /* where the staged copy of an aliased residual starts in the workspace */
    int64_t y_stride;
    size_t y_elem;        /* bytes of one element of y: 2 (BF16) or 4 (fp32) */
};

#define K3_LT_TRY(ctx, call)                                                                                 \
    do {                                                                                                     \
        cublasStatus_t k3_s_ = (call);                                                                       \
        if (k3_s_ != CUBLAS_STATUS_SUCCESS) {                                                                \
            st = k3_fail((ctx), K3_STATUS_CUBLAS_ERROR, "%s failed: cuBLAS status %d (%s)", #call, (int)k3_s_, \
                         cublasLtGetStatusString(k3_s_));                                                    \
            goto done;                                                                                       \
        }                                                                                                    \
    } while (0)

extern "C" void k3_lt_plan_destroy(k3_lt_plan *p) {
    if (!p) return;
    for (int64_t m = 1; m <= K3_LT_MAX_M; m++) {
        if (p->b[m]) cublasLtMatrixLayoutDestroy(p->b[m]);
        if (p->c[m]) cublasLtMatrixLayoutDestroy(p->c[m]);
    }
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    free(p);
}

extern "C" k3_status k3_lt_plan_create(k3_ctx *ctx, int64_t n, int64_t k, int64_t max_m, int64_t x_stride,
                                       int64_t y_stride, int32_t y_f32, k3_lt_plan **out) {
    k3_status st = K3_STATUS_SUCCESS;
    cublasLtMatmulPreference_t pref = NULL;
    *out = NULL;
    if (!ctx->cuda) return k3_fail(ctx, K3_STATUS_INTERNAL_ERROR, "cuBLASLt plan on a context without CUDA state");
    if (max_m < 1 || max_m > K3_LT_MAX_M)
        return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT, "max_m %lld outside 1..%d", (long long)max_m, K3_LT_MAX_M);
    cublasLtHandle_t lt = ctx->cuda->lt;
    k3_lt_plan *p = (k3_lt_plan *)calloc(1, sizeof *p);
    if (!p) return k3_fail(ctx, K3_STATUS_OUT_OF_MEMORY, "out of host memory (cuBLASLt plan)");
    p->n = n;
    p->k = k;
    p->max_m = max_m;
    p->y_elem = y_f32 ? 4 : 2;
    const cudaDataType_t y_type = y_f32 ? CUDA_R_32F : CUDA_R_16BF;
    {
        const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        const uint32_t align = 16; /* the run call guarantees 16-byte aligned pointers */
        const size_t max_ws = K3_LT_MAX_WORKSPACE;
        K3_LT_TRY(ctx, cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        K3_LT_TRY(ctx, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        K3_LT_TRY(ctx, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        K3_LT_TRY(ctx, cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, (uint64_t)k, (uint64_t)n, k));
        K3_LT_TRY(ctx, cublasLtMatmulPreferenceCreate(&pref));
        K3_LT_TRY(ctx, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws,
                                                            sizeof max_ws));
        K3_LT_TRY(ctx, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align,
                                                            sizeof align));
        K3_LT_TRY(ctx, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align,
                                                            sizeof align));
        K3_LT_TRY(ctx, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align,
                                                            sizeof align));
        K3_LT_TRY(ctx, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align,
                                                            sizeof align));
        /* Split-K partial sums must stay in fp32: reductions in the output type (BF16) or in place in the output
         * buffer round every partial, which broke the single-rounding contract (seen on the H200 with a residual
         * aliasing y: bench/NOTES-gemm.md). Algorithms without split-K are always allowed. */
        const uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        K3_LT_TRY(ctx, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                            &reduction_mask, sizeof reduction_mask));
        for (int64_t m = 1; m <= max_m; m++) {
            K3_LT_TRY(ctx, cublasLtMatrixLayoutCreate(&p->b[m], CUDA_R_16BF, (uint64_t)k, (uint64_t)m, x_stride));
            K3_LT_TRY(ctx, cublasLtMatrixLayoutCreate(&p->c[m], y_type, (uint64_t)n, (uint64_t)m, y_stride));
            cublasLtMatmulHeuristicResult_t res[K3_LT_KEEP_ALGOS];
            int returned = 0;
            memset(res, 0, sizeof res);
            K3_LT_TRY(ctx, cublasLtMatmulAlgoGetHeuristic(lt, p->desc, p->a, p->b[m], p->c[m], p->c[m], pref,
                                                          K3_LT_KEEP_ALGOS, res, &returned));
            int kept = 0;
            for (int i = 0; i < returned && i < K3_LT_KEEP_ALGOS; i++) {
                if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
                p->algo[m][kept++] = res[i].algo;
                if (res[i].workspaceSize > p->ws_bytes) p->ws_bytes = res[i].workspaceSize;
            }
            if (kept == 0) {
                st = k3_fail(ctx, K3_STATUS_UNSUPPORTED,
                             "cuBLASLt has no algorithm for BF16 n=%lld k=%lld m=%lld (x_stride %lld, y_stride %lld, %s y)",
                             (long long)n, (long long)k, (long long)m, (long long)x_stride, (long long)y_stride,
                             y_f32 ? "fp32" : "BF16");
                goto done;
            }
            p->n_algo[m] = kept;
        }
        /* A residual that aliases y is first copied to the workspace: on the H200, cuBLASLt with C == D (in place)
         * misses the single-rounding accuracy with every algorithm while C != D meets it (bench/NOTES-gemm.md), so
         * the fallback never runs in place. */
        p->y_stride = y_stride;
        p->stage_off = (p->ws_bytes + 255) / 256 * 256;
        p->ws_bytes = p->stage_off + (size_t)max_m * (size_t)y_stride * p->y_elem;
    }
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (st != K3_STATUS_SUCCESS) {
        k3_lt_plan_destroy(p);
        return st;
    }
    *out = p;
    return K3_STATUS_SUCCESS;
}

extern "C" int32_t k3_lt_algo_count(const k3_lt_plan *p, int64_t m) {
    if (!p || m < 1 || m > p->max_m) return 0;
    return p->n_algo[m];
}

extern "C" int32_t k3_lt_algo_id(const k3_lt_plan *p, int64_t m, int32_t algo) {
    if (!p || m < 1 || m > p->max_m || algo < 0 || algo >= p->n_algo[m]) return -1;
    int id = -1;
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&p->algo[m][algo], CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id,
                                             &written) != CUBLAS_STATUS_SUCCESS)
        return -1;
    return id;
}

extern "C" size_t k3_lt_workspace_size(const k3_lt_plan *p) { return p ? p->ws_bytes : 0; }

extern "C" k3_status k3_lt_run(k3_ctx *ctx, const k3_lt_plan *p, int64_t m, int32_t algo, const void *x,
                               const void *w, const void *residual, void *y, void *ws, size_t ws_bytes,
                               void *stream) {
    /* The caller (k3_linear_run) validated m, algo and the pointers; these guards only keep a bug harmless. */
    if (!p || m < 1 || m > p->max_m || algo < 0 || algo >= p->n_algo[m])
        return k3_fail(ctx, K3_STATUS_INTERNAL_ERROR, "cuBLASLt run outside its plan (m %lld, algo %d)",
                       (long long)m, (int)algo);
    if (residual && residual == y) {
        void *stage = (char *)ws + p->stage_off;
        const size_t pitch = (size_t)p->y_stride * p->y_elem;
        K3_CUDA_TRY(ctx, cudaMemcpy2DAsync(stage, pitch, y, pitch, (size_t)p->n * p->y_elem, (size_t)m, cudaMemcpyDeviceToDevice,
                                           (cudaStream_t)stream));
        residual = stage;
    }
    const float alpha = 1.0f, beta = residual ? 1.0f : 0.0f;
    cublasStatus_t s = cublasLtMatmul(ctx->cuda->lt, p->desc, &alpha, w, p->a, x, p->b[m], &beta,
                                      residual ? residual : y, p->c[m], y, p->c[m], &p->algo[m][algo], ws, p->stage_off,
                                      (cudaStream_t)stream);
    if (s != CUBLAS_STATUS_SUCCESS)
        return k3_fail(ctx, K3_STATUS_CUBLAS_ERROR, "cublasLtMatmul failed: cuBLAS status %d (%s), n=%lld k=%lld m=%lld",
                       (int)s, cublasLtGetStatusString(s), (long long)p->n, (long long)p->k, (long long)m);
    K3_CUDA_LAUNCH_CHECK(ctx, "cublasLtMatmul");
    return K3_STATUS_SUCCESS;
}
