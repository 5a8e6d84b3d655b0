/* The linear plan end to end on the GPU: every (shape, M) row of the context's checked-in table, every
 * registry configuration on a few shapes, the cuBLASLt fallback, strided x/y, residual (also aliasing y),
 * CUDA-graph capture and replay, plan/run validation - against an fp64 loop written here, through the harness
 * (tests/k3t_harness.h): rel-L2 within the linear budget, no NaN/Inf, y poisoned so that every element must be
 * written, guard bytes around y, and the rest of y (stride gaps, rows past m) as it was before the call. Exits 77
 * without a CUDA device. K3T_SEED=<n> changes the base seed. */
#include <stdint.h>
#include <string.h>

#include "k3.h"
#include "test_util.h"

#ifndef K3_HAVE_CUDA
int main(void) { K3T_SKIP("built without CUDA"); }
#else

#include "k3t_harness_cuda.h"
#include "plan/linear_plan.h"

#define DEFAULT_SEED 0x6E4A11u

/* One shape's data: host x [max_m, xs], w [n, k], residual [max_m, ys], the fp64 sums, device copies; y is a
 * harness output of [max_m, ys] elements. */
typedef struct shape_data {
    int64_t n, k, max_m, xs, ys;
    uint16_t *hx, *hw, *hr;
    double *sum; /* [max_m, n] exact-ish x . w^T in fp64 */
    double *exp; /* [max_m, n] the expected y before its BF16 rounding */
    uint16_t *dx, *dw, *dr;
    k3t_dout y;
    void *ws;
    size_t ws_cap;
} shape_data;

static void shape_free(shape_data *s) {
    free(s->hx);
    free(s->hw);
    free(s->hr);
    free(s->sum);
    free(s->exp);
    cudaFree(s->dx);
    cudaFree(s->dw);
    cudaFree(s->dr);
    k3t_dout_free(&s->y);
    cudaFree(s->ws);
    memset(s, 0, sizeof *s);
}

/* fp64 reference: sum[i, j] = x[i] . w[j] over the bf16 values. A product of two bf16 values is exact in fp32
 * (8-bit significands), and eight fp64 partial sums per dot product keep the adds independent. The weight row is
 * the outer loop, widened once and reused by every token: a token-outer loop would read all of w max_m times,
 * and the table's shapes make that most of the test's time. */
static int reference_sums(shape_data *s) {
    const int64_t n = s->n, k = s->k, m = s->max_m;
    float *xf = (float *)malloc((size_t)(m * k) * sizeof(float)), *wf = (float *)malloc((size_t)k * sizeof(float));
    if (!xf || !wf) {
        free(xf), free(wf);
        return 0;
    }
    for (int64_t i = 0; i < m; i++)
        for (int64_t kk = 0; kk < k; kk++) xf[i * k + kk] = k3t_bf16_to_f32(s->hx[i * s->xs + kk]);
    for (int64_t j = 0; j < n; j++) {
        for (int64_t kk = 0; kk < k; kk++) wf[kk] = k3t_bf16_to_f32(s->hw[j * k + kk]);
        for (int64_t i = 0; i < m; i++) {
            const float *xr = xf + i * k;
            double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            int64_t kk = 0;
            for (; kk + 8 <= k; kk += 8)
                for (int u = 0; u < 8; u++) a[u] += (double)(xr[kk + u] * wf[kk + u]);
            for (; kk < k; kk++) a[0] += (double)(xr[kk] * wf[kk]);
            s->sum[i * n + j] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        }
    }
    free(xf), free(wf);
    return 1;
}

static int shape_init(shape_data *s, int64_t n, int64_t k, int64_t max_m, int64_t xs, int64_t ys, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->n = n, s->k = k, s->max_m = max_m, s->xs = xs, s->ys = ys;
    k3t_rng rng = {seed};
    s->hx = (uint16_t *)malloc((size_t)(max_m * xs) * 2);
    s->hw = (uint16_t *)malloc((size_t)(n * k) * 2);
    s->hr = (uint16_t *)malloc((size_t)(max_m * ys) * 2);
    s->sum = (double *)malloc((size_t)(max_m * n) * sizeof(double));
    s->exp = (double *)malloc((size_t)(max_m * n) * sizeof(double));
    if (!s->hx || !s->hw || !s->hr || !s->sum || !s->exp) {
        CHECK(0, "out of host memory");
        return 0;
    }
    for (int64_t i = 0; i < max_m * xs; i++) s->hx[i] = k3t_rand_bf16(&rng, 1.0f);
    for (int64_t i = 0; i < n * k; i++) s->hw[i] = k3t_rand_bf16(&rng, 1.0f);
    for (int64_t i = 0; i < max_m * ys; i++) s->hr[i] = k3t_rand_bf16(&rng, 8.0f);
    if (!reference_sums(s)) {
        CHECK(0, "out of host memory");
        return 0;
    }
    int ok = k3t_cuda_ok(cudaMalloc((void **)&s->dx, (size_t)(max_m * xs) * 2), "malloc x") &&
             k3t_cuda_ok(cudaMalloc((void **)&s->dw, (size_t)(n * k) * 2), "malloc w") &&
             k3t_cuda_ok(cudaMalloc((void **)&s->dr, (size_t)(max_m * ys) * 2), "malloc r") &&
             k3t_dout_alloc(&s->y, "y", K3T_BF16, max_m * ys) &&
             k3t_cuda_ok(cudaMemcpy(s->dx, s->hx, (size_t)(max_m * xs) * 2, cudaMemcpyHostToDevice), "copy x") &&
             k3t_cuda_ok(cudaMemcpy(s->dw, s->hw, (size_t)(n * k) * 2, cudaMemcpyHostToDevice), "copy w") &&
             k3t_cuda_ok(cudaMemcpy(s->dr, s->hr, (size_t)(max_m * ys) * 2, cudaMemcpyHostToDevice), "copy r");
    return ok;
}

static int ensure_ws(shape_data *s, k3_linear_plan *p) {
    size_t need = 0;
    CHECK(k3_linear_workspace_size(p, &need) == K3_STATUS_SUCCESS, "workspace size");
    if (need <= s->ws_cap) return 1;
    cudaFree(s->ws);
    s->ws = NULL;
    s->ws_cap = 0;
    if (!k3t_cuda_ok(cudaMalloc(&s->ws, need), "malloc ws")) return 0;
    s->ws_cap = need;
    return 1;
}

/* y after a call at m (residual_mode: 0 none, 1 separate, 2 aliased y), once the work on `stream` is done: guards
 * intact, y[m, n] written and finite, the rest of y as it was before the call (poison, or the residual when
 * aliased: the stride gaps and the rows past m), and y[m, n] within the linear budget of the fp64 sums (plus the
 * residual) rounded to BF16. */
static void compare(shape_data *s, int64_t m, int residual_mode, cudaStream_t stream, const char *what) {
    char w[256];
    snprintf(w, sizeof w, "%s: %lldx%lld m=%lld xs=%lld ys=%lld residual %d", what, (long long)s->n, (long long)s->k,
             (long long)m, (long long)s->xs, (long long)s->ys, residual_mode);
    const k3t_region r = k3t_rows(m, s->n, s->ys);
    s->y.h.name = w; /* the failures name the call */
    k3t_dout_check(&s->y, stream, r, 0, residual_mode == 2 ? s->hr : NULL);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < s->n; j++)
            s->exp[i * s->n + j] =
                s->sum[i * s->n + j] + (residual_mode ? (double)k3t_bf16_to_f32(s->hr[i * s->ys + j]) : 0.0);
    k3t_check_close(w, k3t_view_out(&s->y.h, r), k3t_rounded(k3t_view2(s->exp, K3T_F64, m, s->n, s->n)),
                    K3T_OP_LINEAR);
    s->y.h.name = "y";
}

/* Runs plan p at m in the three residual modes and compares each. */
static void run_and_compare(k3_ctx *ctx, shape_data *s, k3_linear_plan *p, int64_t m, const char *what) {
    if (!ensure_ws(s, p)) return;
    for (int mode = 0; mode < 3; mode++) {
        k3t_dout_poison(&s->y, NULL);
        if (mode == 2)
            k3t_cuda_ok(cudaMemcpy(k3t_dout_ptr(&s->y), s->dr, k3t_dout_bytes(&s->y), cudaMemcpyDeviceToDevice),
                        "residual into y");
        void *dy = k3t_dout_ptr(&s->y);
        const void *res = mode == 0 ? NULL : mode == 1 ? (const void *)s->dr : (const void *)dy;
        k3_status st = k3_linear_run(p, m, s->dx, s->dw, res, dy, s->ws, s->ws_cap, NULL);
        CHECK(st == K3_STATUS_SUCCESS, "%s run m=%lld: %s", what, (long long)m, k3_ctx_last_error(ctx));
        if (st != K3_STATUS_SUCCESS) return;
        if (!k3t_cuda_ok(cudaDeviceSynchronize(), what)) return;
        compare(s, m, mode, NULL, what);
    }
}

static k3_linear_plan *make_plan(k3_ctx *ctx, const shape_data *s, k3_kernel kernel, const char *config,
                                 int64_t max_m) {
    k3_linear_desc d;
    k3_linear_desc_init(&d, s->n, s->k);
    d.max_m = max_m;
    d.x_stride = s->xs;
    d.y_stride = s->ys;
    d.force_kernel = kernel;
    d.force_config = config;
    k3_linear_plan *p = NULL;
    k3_status st = k3_linear_plan_create(ctx, &d, &p);
    CHECK(st == K3_STATUS_SUCCESS, "plan %lldx%lld kernel %d %s: %s", (long long)s->n, (long long)s->k, (int)kernel,
          config ? config : "-", k3_ctx_last_error(ctx));
    return p;
}

/* Graph capture of one call, replayed twice on a poisoned output. */
static void check_graph(k3_ctx *ctx, shape_data *s, k3_linear_plan *p, int64_t m) {
    if (!ensure_ws(s, p)) return;
    cudaStream_t st;
    if (!k3t_cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream")) return;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    if (k3t_cuda_ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "begin capture")) {
        k3_status rs = k3_linear_run(p, m, s->dx, s->dw, s->dr, k3t_dout_ptr(&s->y), s->ws, s->ws_cap, st);
        CHECK(rs == K3_STATUS_SUCCESS, "run under capture: %s", k3_ctx_last_error(ctx));
        k3t_cuda_ok(cudaStreamEndCapture(st, &g), "end capture");
    }
    if (g && k3t_cuda_ok(cudaGraphInstantiate(&ge, g, 0), "instantiate")) {
        for (int rep = 0; rep < 2; rep++) {
            k3t_dout_poison(&s->y, st);
            k3t_cuda_ok(cudaGraphLaunch(ge, st), "graph launch");
            k3t_cuda_ok(cudaStreamSynchronize(st), "graph sync");
            compare(s, m, 1, st, "graph replay");
        }
    }
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    cudaStreamDestroy(st);
}

/* Every (shape, M) row of the context's table through an AUTO plan, dense and strided. The cases come from the
 * table at run time: row i's seed offset is 2 i (dense) and 2 i + 1 (strided). */
static void test_table_rows(k3_ctx *ctx) {
    const k3_table *t = NULL;
    CHECK(k3_linear_ctx_table(ctx, &t) == K3_STATUS_SUCCESS, "context table: %s", k3_ctx_last_error(ctx));
    if (!t) {
        printf("no table for this device's architecture: rows skipped (the fallback tests still run)\n");
        return;
    }
    printf("table %s: %d shapes\n", t->source, (int)t->n_rows);
    int points = 0;
    for (int32_t i = 0; i < t->n_rows; i++) {
        const k3_table_row *row = &t->rows[i];
        int64_t max_m = 0;
        for (int m = 1; m <= K3_TABLE_MAX_M; m++)
            if (row->m[m].kernel != K3_KERNEL_AUTO) max_m = m;
        if (!max_m) continue;
        for (int strided = 0; strided < 2; strided++) {
            shape_data s;
            /* strided: rows of x 64 elements apart beyond k (16-byte rows), y rows 8 beyond n */
            const int64_t xs = row->k + (strided ? 64 : 0), ys = row->n + (strided ? 8 : 0);
            char name[96];
            snprintf(name, sizeof name, "table row %lldx%lld%s m 1..%lld", (long long)row->n, (long long)row->k,
                     strided ? " strided" : "", (long long)max_m);
            const uint64_t seed = k3t_case_enter(name, (uint64_t)i * 2 + (uint64_t)strided);
            if (!shape_init(&s, row->n, row->k, max_m, xs, ys, seed)) {
                shape_free(&s);
                return;
            }
            k3_linear_plan *p = make_plan(ctx, &s, K3_KERNEL_AUTO, NULL, max_m);
            for (int64_t m = 1; p && m <= max_m; m++) {
                if (row->m[m].kernel == K3_KERNEL_AUTO) continue;
                k3_choice_source src;
                const k3_table_choice *c = k3_linear_plan_choice(p, m, &src);
                if (src == K3_CHOICE_TABLE)
                    CHECK(c->kernel == row->m[m].kernel && c->cfg == row->m[m].cfg, "%lldx%lld m=%lld uses the row",
                          (long long)row->n, (long long)row->k, (long long)m);
                char kname[160], what[200];
                k3_linear_plan_kernel(p, m, kname, sizeof kname);
                snprintf(what, sizeof what, "table row (%s)", kname);
                /* strided: every M is checked too (the plan may demote a kernel that cannot read the stride) */
                run_and_compare(ctx, &s, p, m, what);
                points++;
            }
            if (p && !strided) check_graph(ctx, &s, p, max_m);
            k3_linear_plan_destroy(p);
            shape_free(&s);
        }
    }
    printf("table rows checked: %d (shape, M, layout) points\n", points);
}

/* Every registry configuration on a few shapes, at m = 1 and its largest m (at most the case's m).
 * shape = {n, k, x_stride, y_stride}. */
static const k3t_case k_config_cases[] = {
    {"configs", {1536, 7168, 7168, 1536}, 16, 0, 100, K3T_OP_LINEAR},
    {"configs", {144, 7168, 7168, 144}, 16, 0, 101, K3T_OP_LINEAR},
    {"configs", {2304, 1536, 1536, 2304}, 16, 0, 102, K3T_OP_LINEAR},
    {"configs", {1536, 128, 128, 1536}, 16, 0, 103, K3T_OP_LINEAR},
    {"configs", {1000, 7176, 7176, 1000}, 16, 0, 104, K3T_OP_LINEAR},
};

static void test_configs(k3_ctx *ctx) {
    int32_t count = 0;
    const k3_gemm_config *all = k3_gemm_configs(&count);
    for (size_t si = 0; si < sizeof k_config_cases / sizeof k_config_cases[0]; si++) {
        const k3t_case *kc = &k_config_cases[si];
        shape_data s;
        const uint64_t seed = k3t_case_begin(kc);
        if (!shape_init(&s, kc->shape[0], kc->shape[1], kc->m, kc->shape[2], kc->shape[3], seed)) {
            shape_free(&s);
            return;
        }
        for (int32_t c = 0; c < count; c++) {
            const int64_t top = all[c].max_m < kc->m ? all[c].max_m : kc->m;
            if (!k3_gemm_config_supports(&all[c], s.n, s.k, top, s.k, NULL)) {
                /* must be refused at plan time, never mis-run */
                k3_linear_desc d;
                k3_linear_desc_init(&d, s.n, s.k);
                d.max_m = top;
                d.force_kernel = all[c].kernel;
                d.force_config = all[c].name;
                k3_linear_plan *p = NULL;
                CHECK(k3_linear_plan_create(ctx, &d, &p) == K3_STATUS_INVALID_ARGUMENT && !p,
                      "%s on %lldx%lld refused", all[c].name, (long long)s.n, (long long)s.k);
                continue;
            }
            k3_linear_plan *p = make_plan(ctx, &s, all[c].kernel, all[c].name, top);
            char what[96];
            snprintf(what, sizeof what, "config %s", all[c].name);
            if (p) {
                run_and_compare(ctx, &s, p, 1, what);
                if (top > 1) run_and_compare(ctx, &s, p, top, what);
            }
            k3_linear_plan_destroy(p);
        }
        shape_free(&s);
    }
}

/* The cuBLASLt fallback: forced, on unlisted and awkward shapes, every kept heuristic algorithm, at m = 1, 3, 8,
 * 16. shape = {n, k, x_stride, y_stride}; m: the data's rows (the plan's default max_m, 16). */
static const k3t_case k_fallback_cases[] = {
    {"cublaslt", {1536, 7168, 7168, 1536}, 16, 0, 200, K3T_OP_LINEAR},
    {"cublaslt", {144, 7168, 7168 + 64, 144 + 8}, 16, 0, 201, K3T_OP_LINEAR},
    {"cublaslt", {1536, 128, 144, 1536}, 16, 0, 202, K3T_OP_LINEAR}, /* the KDA f_a slice: x rows 144 apart */
    {"cublaslt", {257, 136, 136, 264}, 16, 0, 203, K3T_OP_LINEAR},
    {"cublaslt", {7168, 1536, 1536, 7168}, 16, 0, 204, K3T_OP_LINEAR},
};

static void test_fallback(k3_ctx *ctx) {
    for (size_t ci = 0; ci < sizeof k_fallback_cases / sizeof k_fallback_cases[0]; ci++) {
        const k3t_case *kc = &k_fallback_cases[ci];
        shape_data s;
        const uint64_t seed = k3t_case_begin(kc);
        if (!shape_init(&s, kc->shape[0], kc->shape[1], kc->m, kc->shape[2], kc->shape[3], seed)) {
            shape_free(&s);
            return;
        }
        for (int a = 0; a < 4; a++) {
            char cfg[4];
            snprintf(cfg, sizeof cfg, "h%d", a);
            k3_linear_desc d;
            k3_linear_desc_init(&d, s.n, s.k);
            d.x_stride = s.xs;
            d.y_stride = s.ys;
            d.force_kernel = K3_KERNEL_FALLBACK;
            d.force_config = cfg;
            k3_linear_plan *p = NULL;
            k3_status st = k3_linear_plan_create(ctx, &d, &p);
            if (a > 0 && st == K3_STATUS_INVALID_ARGUMENT) continue; /* fewer heuristic algorithms: refused, fine */
            CHECK(st == K3_STATUS_SUCCESS, "fallback %s plan: %s", cfg, k3_ctx_last_error(ctx));
            if (!p) continue;
            char what[64];
            snprintf(what, sizeof what, "cublaslt %s", cfg);
            const int64_t ms[] = {1, 3, 8, 16};
            for (size_t mi = 0; mi < 4; mi++) run_and_compare(ctx, &s, p, ms[mi], what);
            if (a == 0) {
                check_graph(ctx, &s, p, 16);
                size_t need = 0;
                k3_linear_workspace_size(p, &need);
                if (need > 0) {
                    k3t_dout_poison(&s.y, NULL);
                    CHECK(k3_linear_run(p, 1, s.dx, s.dw, NULL, k3t_dout_ptr(&s.y), s.ws, need - 1, NULL) ==
                              K3_STATUS_INVALID_ARGUMENT,
                          "a workspace smaller than needed is refused");
                    if (k3t_cuda_ok(cudaDeviceSynchronize(), "after the refused call"))
                        k3t_dout_check(&s.y, NULL, k3t_rows(0, 0, 0), 0, NULL); /* and nothing written */
                }
            }
            k3_linear_plan_destroy(p);
        }
        shape_free(&s);
    }
}

/* M = 1..16 on a K that is not a multiple of the MMA kernel's K chunk: AUTO falls back (or uses a kernel
 * that supports it) and stays correct; forcing MMA is refused at plan time. shape = {n, k, x_stride, y_stride}. */
static const k3t_case k_awkward_case = {"awkward K", {2112, 7176, 7176, 2112}, 16, 0, 300, K3T_OP_LINEAR};

static void test_awkward_k(k3_ctx *ctx) {
    const k3t_case *kc = &k_awkward_case;
    shape_data s;
    const uint64_t seed = k3t_case_begin(kc);
    if (!shape_init(&s, kc->shape[0], kc->shape[1], kc->m, kc->shape[2], kc->shape[3], seed)) {
        shape_free(&s);
        return;
    }
    k3_linear_plan *p = make_plan(ctx, &s, K3_KERNEL_AUTO, NULL, kc->m);
    for (int64_t m = 1; p && m <= kc->m; m++) run_and_compare(ctx, &s, p, m, "K 7176 auto");
    k3_linear_plan_destroy(p);
    k3_linear_desc d;
    k3_linear_desc_init(&d, s.n, s.k);
    d.force_kernel = K3_KERNEL_MMA;
    p = NULL;
    CHECK(k3_linear_plan_create(ctx, &d, &p) == K3_STATUS_INVALID_ARGUMENT && !p, "forced mma on K 7176 refused: %s",
          k3_ctx_last_error(ctx));
    shape_free(&s);
}

/* Plan and run validation; refused calls write nothing. shape = {n, k, x_stride, y_stride}. */
static const k3t_case k_validation_case = {"validation", {256, 512, 512, 256}, 4, 0, 400, K3T_OP_LINEAR};

static void test_validation(k3_ctx *ctx) {
    k3_linear_desc d;
    k3_linear_desc_init(&d, 1536, 7168);
    d.accum = K3_ACCUM_FP64;
    k3_linear_plan *p = NULL;
    CHECK(k3_linear_plan_create(ctx, &d, &p) == K3_STATUS_INVALID_ARGUMENT && !p, "FP64 refused on CUDA");
    CHECK(strstr(k3_ctx_last_error(ctx), "FP64") != NULL, "message: %s", k3_ctx_last_error(ctx));
    const k3t_case *kc = &k_validation_case;
    shape_data s;
    const uint64_t seed = k3t_case_begin(kc);
    if (!shape_init(&s, kc->shape[0], kc->shape[1], kc->m, kc->shape[2], kc->shape[3], seed)) {
        shape_free(&s);
        return;
    }
    p = make_plan(ctx, &s, K3_KERNEL_AUTO, NULL, kc->m);
    if (p && ensure_ws(&s, p)) {
        void *dy = k3t_dout_ptr(&s.y);
        k3t_dout_poison(&s.y, NULL);
        CHECK(k3_linear_run(p, 0, s.dx, s.dw, NULL, dy, s.ws, s.ws_cap, NULL) == K3_STATUS_INVALID_ARGUMENT, "m 0");
        CHECK(k3_linear_run(p, 5, s.dx, s.dw, NULL, dy, s.ws, s.ws_cap, NULL) == K3_STATUS_INVALID_ARGUMENT, "m 5");
        CHECK(k3_linear_run(p, 1, s.dx + 1, s.dw, NULL, dy, s.ws, s.ws_cap, NULL) == K3_STATUS_INVALID_ARGUMENT,
              "misaligned x");
        CHECK(k3_linear_run(p, 1, s.dx, NULL, NULL, dy, s.ws, s.ws_cap, NULL) == K3_STATUS_INVALID_ARGUMENT, "NULL w");
        CHECK(k3t_cuda_ok(cudaDeviceSynchronize(), "no launch happened on refused calls"), "sync");
        k3t_dout_check(&s.y, NULL, k3t_rows(0, 0, 0), 0, NULL); /* nothing written by the refused calls */
    }
    k3_linear_plan_destroy(p);
    shape_free(&s);
}

int main(void) {
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    opt.backend = K3_BACKEND_CUDA;
    k3_ctx *ctx = NULL;
    k3_status st = k3_ctx_create(&opt, &ctx);
    if (st == K3_STATUS_NOT_AVAILABLE) K3T_SKIP("no CUDA device");
    CHECK(st == K3_STATUS_SUCCESS, "CUDA context: %s", k3_status_string(st));
    if (!ctx) return k3t_finish();
    k3_arch_info a;
    k3_ctx_arch(ctx, &a);
    printf("device %s (sm_%d)\n", a.device_name, (int)a.sm_version);
    k3t_seed_init("gpu_linear", DEFAULT_SEED);
    test_table_rows(ctx);
    test_configs(ctx);
    test_fallback(ctx);
    test_awkward_k(ctx);
    test_validation(ctx);
    k3_ctx_destroy(ctx);
    return k3t_finish();
}
#endif
