/* Every compiled GEMM configuration (skinny CUDA-core, tensor-core MMA) against two independent references:
 * the CPU backend's k3_cpu_linear (fp64 accumulation) and an fp64 loop written here. Covers M = 1..max_m,
 * every K3 K value, strided x, residual (separate and aliasing y), partial row blocks, rejected shapes and
 * arguments, bitwise reproducibility, programmatic dependent launch on a producer -> consumer chain, and
 * CUDA-graph replay. Through the harness (tests/k3t_harness.h): y poisoned before every launch (every element of
 * y[m, n] must be written, nothing else in y may change), guard bytes around it, no NaN/Inf, rel-L2 within the
 * GEMM budget. K3T_GEMM_QUICK=1 (for compute-sanitizer runs) tests a subset of M; K3T_GEMM_ONLY=TEXT tests only
 * the configurations whose name contains TEXT (the per-configuration checks; the chain test is always run);
 * K3T_SEED=<n> changes the base seed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#ifdef K3_HAVE_CUDA
#include "cpu/cpu.h"
#include "cuda/gemm/gemm.h"
#include "k3t_harness_cuda.h"
#include "plan/gemm_configs.h"

#define DEFAULT_SEED 0x4b3c1e55ull
#define MAXM 16

/* Case options: which of the per-shape tests run on a shape besides every configuration. */
enum { OPT_REJECTIONS = 1, OPT_BITWISE = 2 };

typedef struct {
    int64_t n, k, x_stride;
} shape;

/* One shape's data on host and device, and its references for all MAXM tokens (rows are independent, so the
 * first m rows of the MAXM-row reference are the m-token reference). */
typedef struct {
    shape s;
    int64_t y_stride;
    size_t y_elems;                /* MAXM * y_stride: y's body (the harness adds the guards) */
    uint16_t *hx, *hw, *hres;      /* host inputs; hres has y's layout */
    double *ref, *ref_res;         /* fp64 loop: [MAXM, n] without / with residual */
    uint16_t *cpu, *cpu_res;       /* k3_cpu_linear (fp64 accumulation), [MAXM, y_stride] */
    void *dx, *dw, *dres;          /* device inputs */
    k3t_dout y;                    /* device output and its host copy */
} problem;

static void problem_init(problem *p, shape s, uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->s = s;
    p->y_stride = s.n + 8; /* row padding: elements between rows must stay untouched too */
    k3t_rng r = {seed};
    const size_t nx = (size_t)MAXM * (size_t)s.x_stride, nw = (size_t)s.n * (size_t)s.k;
    p->y_elems = (size_t)MAXM * (size_t)p->y_stride;
    p->hx = malloc(nx * 2);
    p->hw = malloc(nw * 2);
    p->hres = malloc(p->y_elems * 2);
    p->ref = malloc((size_t)MAXM * (size_t)s.n * sizeof(double));
    p->ref_res = malloc((size_t)MAXM * (size_t)s.n * sizeof(double));
    p->cpu = malloc(p->y_elems * 2);
    p->cpu_res = malloc(p->y_elems * 2);
    if (!p->hx || !p->hw || !p->hres || !p->ref || !p->ref_res || !p->cpu || !p->cpu_res) {
        fprintf(stderr, "FATAL: out of host memory\n");
        exit(1);
    }
    /* padding columns of x hold huge values: reading them would wreck the result */
    for (size_t i = 0; i < nx; i++)
        p->hx[i] = (i % (size_t)s.x_stride) < (size_t)s.k ? k3t_rand_bf16(&r, 1.0f) : 0x7f00;
    for (size_t i = 0; i < nw; i++) p->hw[i] = k3t_rand_bf16(&r, 0.05f);
    for (size_t i = 0; i < p->y_elems; i++) p->hres[i] = k3t_rand_bf16(&r, 2.0f);
    for (int64_t mi = 0; mi < MAXM; mi++)
        for (int64_t j = 0; j < s.n; j++) {
            double acc = 0.0;
            const uint16_t *xr = p->hx + mi * s.x_stride, *wr = p->hw + j * s.k;
            for (int64_t kk = 0; kk < s.k; kk++)
                acc += (double)k3t_bf16_to_f32(xr[kk]) * (double)k3t_bf16_to_f32(wr[kk]);
            p->ref[mi * s.n + j] = acc;
            p->ref_res[mi * s.n + j] = acc + (double)k3t_bf16_to_f32(p->hres[mi * p->y_stride + j]);
        }
    k3_cpu_linear(MAXM, s.n, s.k, p->hx, s.x_stride, p->hw, NULL, p->cpu, p->y_stride, K3_ACCUM_FP64);
    k3_cpu_linear(MAXM, s.n, s.k, p->hx, s.x_stride, p->hw, p->hres, p->cpu_res, p->y_stride, K3_ACCUM_FP64);
    K3T_CU(cudaMalloc(&p->dx, nx * 2));
    K3T_CU(cudaMalloc(&p->dw, nw * 2));
    K3T_CU(cudaMalloc(&p->dres, p->y_elems * 2));
    if (!k3t_dout_alloc(&p->y, "y", K3T_BF16, (int64_t)p->y_elems)) exit(1);
    K3T_CU(cudaMemcpy(p->dx, p->hx, nx * 2, cudaMemcpyHostToDevice));
    K3T_CU(cudaMemcpy(p->dw, p->hw, nw * 2, cudaMemcpyHostToDevice));
    K3T_CU(cudaMemcpy(p->dres, p->hres, p->y_elems * 2, cudaMemcpyHostToDevice));
}

static void problem_free(problem *p) {
    free(p->hx);
    free(p->hw);
    free(p->hres);
    free(p->ref);
    free(p->ref_res);
    free(p->cpu);
    free(p->cpu_res);
    cudaFree(p->dx);
    cudaFree(p->dw);
    cudaFree(p->dres);
    k3t_dout_free(&p->y);
}

static void poison(problem *p) {
    if (!k3t_dout_poison(&p->y, NULL)) exit(1);
}

static k3_gemm_args args_of(const problem *p, int64_t m, int with_res) {
    k3_gemm_args a;
    a.m = m;
    a.n = p->s.n;
    a.k = p->s.k;
    a.x = p->dx;
    a.x_stride = p->s.x_stride;
    a.w = p->dw;
    a.residual = with_res ? p->dres : NULL;
    a.y = k3t_dout_ptr(&p->y);
    a.y_stride = p->y_stride;
    return a;
}

/* y (fetched) after a launch at m: guards intact, y[m, n] written and finite, every other element of y as it
 * was before the launch (`outside`: poison when NULL), and y[m, n] within the GEMM budget of both references.
 * m = 0: a rejected launch, where only "nothing written" applies. */
static void check_output(problem *p, int64_t m, int with_res, const uint16_t *outside, const char *what) {
    char w[224];
    snprintf(w, sizeof w, "%s m=%lld", what, (long long)m);
    const k3t_region r = k3t_rows(m, p->s.n, p->y_stride);
    p->y.h.name = w;
    k3t_check_out(&p->y.h, r, 0, outside);
    p->y.h.name = "y";
    if (m == 0) return;
    char w2[256];
    snprintf(w2, sizeof w2, "%s: vs the fp64 loop", w);
    k3t_check_close(w2, k3t_view_out(&p->y.h, r), k3t_view2(with_res ? p->ref_res : p->ref, K3T_F64, m, p->s.n, p->s.n),
                    K3T_OP_GEMM);
    snprintf(w2, sizeof w2, "%s: vs k3_cpu_linear", w);
    k3t_check_close(w2, k3t_view_out(&p->y.h, r),
                    k3t_view2(with_res ? p->cpu_res : p->cpu, K3T_BF16, m, p->s.n, p->y_stride), K3T_OP_GEMM);
}

static void fetch(problem *p) {
    K3T_CU(cudaDeviceSynchronize());
    if (!k3t_dout_fetch(&p->y, NULL)) exit(1);
}

static int quick_m(int64_t m, int64_t max_m) {
    return m == 1 || m == 2 || m == 3 || m == 8 || m == 9 || m == max_m;
}

/* Every configuration that supports p's shape, every m, with and without residual. */
static void test_configs_on(k3_ctx *ctx, problem *p, int quick) {
    int32_t count = 0;
    const k3_gemm_config *cfgs = k3_gemm_configs(&count);
    const char *only = getenv("K3T_GEMM_ONLY");
    for (int32_t c = 0; c < count; c++) {
        const k3_gemm_config *cfg = &cfgs[c];
        if (only && !strstr(cfg->name, only)) continue;
        const char *why = NULL;
        const int ok = k3_gemm_config_supports(cfg, p->s.n, p->s.k, cfg->max_m, p->s.x_stride, &why);
        char what[160];
        snprintf(what, sizeof what, "%s %s n=%lld k=%lld xs=%lld", cfg->kernel == K3_KERNEL_MMA ? "mma" : "skinny",
                 cfg->name, (long long)p->s.n, (long long)p->s.k, (long long)p->s.x_stride);
        /* What must be rejected: K not a multiple of the K step, a static-K mismatch, or K over a whole-K warp
         * tile's max_k. */
        const int expect_ok = p->s.k % cfg->k_align == 0 && (cfg->static_k == 0 || cfg->static_k == p->s.k) &&
                              (cfg->max_k == 0 || p->s.k <= cfg->max_k);
        CHECK(ok == expect_ok, "%s: supports %d, expected %d (%s)", what, ok, expect_ok, why ? why : "");
        if (!ok) {
            CHECK(why != NULL && why[0] != '\0', "%s: rejection without a reason", what);
            poison(p);
            k3_gemm_args a = args_of(p, 1, 0);
            CHECK(k3_cuda_gemm_launch(ctx, cfg, &a, NULL, 0) == K3_STATUS_INVALID_ARGUMENT,
                  "%s: unsupported shape launched", what);
            fetch(p);
            check_output(p, 0, 0, NULL, what); /* nothing written */
            continue;
        }
        for (int64_t m = 1; m <= cfg->max_m; m++) {
            if (quick && !quick_m(m, cfg->max_m)) continue;
            for (int res = 0; res < 2; res++) {
                poison(p);
                k3_gemm_args a = args_of(p, m, res);
                const k3_status st = k3_cuda_gemm_launch(ctx, cfg, &a, NULL, (int32_t)(m & 1));
                CHECK(st == K3_STATUS_SUCCESS, "%s m=%lld: launch: %s", what, (long long)m, k3_ctx_last_error(ctx));
                fetch(p);
                char w2[200];
                snprintf(w2, sizeof w2, "%s%s", what, res ? " +residual" : "");
                check_output(p, m, res, NULL, w2);
            }
        }
        /* residual aliasing y: y starts as the residual, and only y[m, n] may change */
        const int64_t m = cfg->max_m;
        poison(p); /* the guards */
        K3T_CU(cudaMemcpy(k3t_dout_ptr(&p->y), p->dres, p->y_elems * 2, cudaMemcpyDeviceToDevice));
        k3_gemm_args a = args_of(p, m, 1);
        a.residual = a.y;
        CHECK(k3_cuda_gemm_launch(ctx, cfg, &a, NULL, 0) == K3_STATUS_SUCCESS, "%s aliased: launch", what);
        fetch(p);
        char w3[200];
        snprintf(w3, sizeof w3, "%s aliased residual", what);
        check_output(p, m, 1, p->hres, w3);
    }
}

/* Bad arguments are rejected with INVALID_ARGUMENT and write nothing. */
static void test_rejections(k3_ctx *ctx, problem *p) {
    const k3_gemm_config *sk = k3_gemm_config_find(K3_KERNEL_SKINNY, "b128_o2_u4");
    const k3_gemm_config *mm = k3_gemm_config_find(K3_KERNEL_MMA, "w8_t1_u4");
    CHECK(sk != NULL && mm != NULL, "registry names");
    CHECK(k3_gemm_config_find(K3_KERNEL_MMA, "b128_o2_u4") == NULL, "name looked up under the wrong kernel");
    CHECK(k3_gemm_config_find(K3_KERNEL_SKINNY, NULL) == NULL, "NULL name");
    CHECK(k3_cuda_gemm_prepare(ctx, NULL) == K3_STATUS_INVALID_ARGUMENT, "prepare of a NULL configuration");
    if (mm) {
        const k3_gemm_config copy = *mm; /* equal contents, but not the registry's entry */
        CHECK(k3_cuda_gemm_prepare(ctx, &copy) == K3_STATUS_INVALID_ARGUMENT, "prepare of a configuration not in the registry");
    }
    if (!sk || !mm) return;
    const k3_gemm_config *both[2] = {sk, mm};
    for (int i = 0; i < 2; i++) {
        const k3_gemm_config *cfg = both[i];
        k3_gemm_args a;
        poison(p);
        a = args_of(p, 0, 0);
        CHECK(k3_cuda_gemm_launch(ctx, cfg, &a, NULL, 0) == K3_STATUS_INVALID_ARGUMENT, "%s m=0", cfg->name);
        a = args_of(p, cfg->max_m + 1, 0);
        CHECK(k3_cuda_gemm_launch(ctx, cfg, &a, NULL, 0) == K3_STATUS_INVALID_ARGUMENT, "%s m>max", cfg->name);
        CHECK(strstr(k3_ctx_last_error(ctx), "m = ") != NULL, "message names m: %s", k3_ctx_last_error(ctx));
        a = args_of(p, 1, 0);
        a.x = (const char *)p->dx + 2;
        CHECK(k3_cuda_gemm_launch(ctx, cfg, &a, NULL, 0) == K3_STATUS_INVALID_ARGUMENT, "%s misaligned x", cfg->name);
        CHECK(strstr(k3_ctx_last_error(ctx), "x must be") != NULL, "message names x: %s", k3_ctx_last_error(ctx));
        a = args_of(p, 1, 0);
        a.w = (const char *)p->dw + 8;
        CHECK(k3_cuda_gemm_launch(ctx, cfg, &a, NULL, 0) == K3_STATUS_INVALID_ARGUMENT, "%s misaligned w", cfg->name);
        a = args_of(p, 1, 0);
        a.y = NULL;
        CHECK(k3_cuda_gemm_launch(ctx, cfg, &a, NULL, 0) == K3_STATUS_INVALID_ARGUMENT, "%s NULL y", cfg->name);
        a = args_of(p, 1, 0);
        a.x_stride = p->s.k - 8;
        CHECK(k3_cuda_gemm_launch(ctx, cfg, &a, NULL, 0) == K3_STATUS_INVALID_ARGUMENT, "%s x_stride<k", cfg->name);
        a = args_of(p, 1, 0);
        a.x_stride = p->s.k + 4;
        CHECK(k3_cuda_gemm_launch(ctx, cfg, &a, NULL, 0) == K3_STATUS_INVALID_ARGUMENT, "%s x_stride%%8", cfg->name);
        a = args_of(p, 1, 0);
        a.y_stride = p->s.n - 1;
        CHECK(k3_cuda_gemm_launch(ctx, cfg, &a, NULL, 0) == K3_STATUS_INVALID_ARGUMENT, "%s y_stride<n", cfg->name);
        a = args_of(p, 1, 0);
        CHECK(k3_cuda_gemm_launch(ctx, cfg, &a, NULL, 2) == K3_STATUS_INVALID_ARGUMENT, "%s pdl=2", cfg->name);
        CHECK(k3_cuda_gemm_launch(ctx, cfg, NULL, NULL, 0) == K3_STATUS_INVALID_ARGUMENT, "%s NULL args", cfg->name);
        fetch(p);
        check_output(p, 0, 0, NULL, "rejected launches"); /* nothing written */
    }
    /* a whole-K warp tile refuses K over its max_k, naming it */
    const k3_gemm_config *wt = k3_gemm_config_find(K3_KERNEL_MMA, "n1_t2_u4");
    CHECK(wt != NULL && wt->max_k == 128 && wt->k_split == 1, "registry: n1_t2_u4 with max_k 128");
    if (wt) {
        const char *why = NULL;
        CHECK(!k3_gemm_config_supports(wt, 1536, 160, 8, 160, &why) && why && strstr(why, "max_k"),
              "n1_t2_u4 accepted k=160 (%s)", why ? why : "");
        CHECK(k3_gemm_config_supports(wt, 1536, 128, 16, 144, &why), "n1_t2_u4 refused k=128: %s", why ? why : "");
        k3_gemm_args a = args_of(p, 1, 0); /* p: k = 7168 */
        poison(p);
        CHECK(k3_cuda_gemm_launch(ctx, wt, &a, NULL, 0) == K3_STATUS_INVALID_ARGUMENT, "n1_t2_u4 launched k=7168");
        CHECK(strstr(k3_ctx_last_error(ctx), "max_k") != NULL, "message names max_k: %s", k3_ctx_last_error(ctx));
        fetch(p);
        check_output(p, 0, 0, NULL, "rejected whole-K launch"); /* nothing written */
    }
    k3_gemm_config fake = *sk; /* a copy is not a registry entry: its instance cannot be trusted */
    k3_gemm_args a = args_of(p, 1, 0);
    CHECK(k3_cuda_gemm_launch(ctx, &fake, &a, NULL, 0) == K3_STATUS_INVALID_ARGUMENT, "config outside registry");
    CHECK(k3_cuda_gemm_launch(ctx, NULL, &a, NULL, 0) == K3_STATUS_INVALID_ARGUMENT, "NULL config");
    /* K that is a multiple of nothing the kernels step by: every configuration refuses it */
    int32_t count = 0;
    const k3_gemm_config *cfgs = k3_gemm_configs(&count);
    for (int32_t c = 0; c < count; c++) {
        const char *why = NULL;
        CHECK(!k3_gemm_config_supports(&cfgs[c], 64, 7170, 1, 7170, &why), "%s accepted k=7170", cfgs[c].name);
        CHECK(!k3_gemm_config_supports(&cfgs[c], 64, 7168, cfgs[c].max_m + 1, 7168, &why), "%s accepted m>max",
              cfgs[c].name);
    }
}

/* Producer -> consumer chain with PDL, run directly and replayed from a captured graph: y1 = x w1^T (n1 = k2),
 * then y2 = y1 w2^T + res. If the consumer read y1 before griddepcontrol.wait, the result would be wrong or
 * would differ run to run. Outputs must be bitwise identical across direct runs and graph replays.
 * The case's shape = {k1, n1, n2}, m = the tokens. */
static void test_chain_graph(k3_ctx *ctx, const k3t_case *kc) {
    const uint64_t seed = k3t_case_begin(kc);
    const int64_t k1 = kc->shape[0], n1 = kc->shape[1], n2 = kc->shape[2], m = kc->m;
    k3t_rng r = {seed};
    uint16_t *hx = malloc((size_t)m * k1 * 2), *hw1 = malloc((size_t)n1 * k1 * 2), *hw2 = malloc((size_t)n2 * n1 * 2);
    uint16_t *hres = malloc((size_t)m * n2 * 2), *hy2 = malloc((size_t)m * n2 * 2);
    double *ref1 = malloc((size_t)m * n1 * sizeof(double)), *ref2 = malloc((size_t)m * n2 * sizeof(double));
    if (!hx || !hw1 || !hw2 || !hres || !hy2 || !ref1 || !ref2) {
        fprintf(stderr, "FATAL: out of host memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < m * k1; i++) hx[i] = k3t_rand_bf16(&r, 1.0f);
    for (int64_t i = 0; i < n1 * k1; i++) hw1[i] = k3t_rand_bf16(&r, 0.05f);
    for (int64_t i = 0; i < n2 * n1; i++) hw2[i] = k3t_rand_bf16(&r, 0.05f);
    for (int64_t i = 0; i < m * n2; i++) hres[i] = k3t_rand_bf16(&r, 1.0f);
    void *dx, *dw1, *dw2, *dres;
    k3t_dout y1, y2;
    K3T_CU(cudaMalloc(&dx, (size_t)m * k1 * 2));
    K3T_CU(cudaMalloc(&dw1, (size_t)n1 * k1 * 2));
    K3T_CU(cudaMalloc(&dw2, (size_t)n2 * n1 * 2));
    K3T_CU(cudaMalloc(&dres, (size_t)m * n2 * 2));
    if (!k3t_dout_alloc(&y1, "chain y1", K3T_BF16, m * n1) || !k3t_dout_alloc(&y2, "chain y2", K3T_BF16, m * n2))
        exit(1);
    K3T_CU(cudaMemcpy(dx, hx, (size_t)m * k1 * 2, cudaMemcpyHostToDevice));
    K3T_CU(cudaMemcpy(dw1, hw1, (size_t)n1 * k1 * 2, cudaMemcpyHostToDevice));
    K3T_CU(cudaMemcpy(dw2, hw2, (size_t)n2 * n1 * 2, cudaMemcpyHostToDevice));
    K3T_CU(cudaMemcpy(dres, hres, (size_t)m * n2 * 2, cudaMemcpyHostToDevice));
    K3T_CU(cudaDeviceSynchronize()); /* pageable copies may still be landing; the chain's stream is non-blocking */
    for (int64_t i = 0; i < m; i++) /* step 1 reference, fp64 */
        for (int64_t j = 0; j < n1; j++) {
            double acc = 0;
            for (int64_t kk = 0; kk < k1; kk++)
                acc += (double)k3t_bf16_to_f32(hx[i * k1 + kk]) * (double)k3t_bf16_to_f32(hw1[j * k1 + kk]);
            ref1[i * n1 + j] = acc;
        }
    cudaStream_t s;
    K3T_CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const uint16_t *hy1 = (const uint16_t *)k3t_dout_host(&y1);
    const k3t_region r1 = k3t_rows(m, n1, n1), r2 = k3t_rows(m, n2, n2);

    int32_t count = 0;
    const k3_gemm_config *cfgs = k3_gemm_configs(&count);
    for (int32_t c = 0; c < count; c++) {
        /* every configuration that can consume, after the next one in the registry that can produce (mixes the
         * kernel families) */
        const k3_gemm_config *c2 = &cfgs[c], *c1 = NULL;
        if (!k3_gemm_config_supports(c2, n2, n1, m, n1, NULL)) continue;
        for (int32_t d = 1; d <= count && !c1; d++)
            if (k3_gemm_config_supports(&cfgs[(c + d) % count], n1, k1, m, k1, NULL)) c1 = &cfgs[(c + d) % count];
        CHECK(c1 != NULL, "no producer configuration for the chain %lldx%lld", (long long)n1, (long long)k1);
        if (!c1) continue;
        k3_gemm_args a1 = {m, n1, k1, dx, k1, dw1, NULL, k3t_dout_ptr(&y1), n1};
        k3_gemm_args a2 = {m, n2, n1, k3t_dout_ptr(&y1), n1, dw2, dres, k3t_dout_ptr(&y2), n2};
        char w[160];
        /* direct, PDL on both */
        if (!k3t_dout_poison(&y1, s) || !k3t_dout_poison(&y2, s)) exit(1);
        CHECK(k3_cuda_gemm_launch(ctx, c1, &a1, s, 1) == K3_STATUS_SUCCESS, "chain %s: %s", c1->name,
              k3_ctx_last_error(ctx));
        CHECK(k3_cuda_gemm_launch(ctx, c2, &a2, s, 1) == K3_STATUS_SUCCESS, "chain %s: %s", c2->name,
              k3_ctx_last_error(ctx));
        K3T_CU(cudaStreamSynchronize(s));
        k3t_dout_check(&y1, s, r1, 0, NULL);
        k3t_dout_check(&y2, s, r2, 0, NULL);
        memcpy(hy2, k3t_dout_host(&y2), (size_t)m * n2 * 2);
        /* reference of the second step on the GPU's first-step output (fp64 loop) */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n2; j++) {
                double acc = k3t_bf16_to_f32(hres[i * n2 + j]);
                for (int64_t kk = 0; kk < n1; kk++)
                    acc += (double)k3t_bf16_to_f32(hy1[i * n1 + kk]) * (double)k3t_bf16_to_f32(hw2[j * n1 + kk]);
                ref2[i * n2 + j] = acc;
            }
        snprintf(w, sizeof w, "chain %s step 1", c1->name);
        k3t_check_close(w, k3t_view_out(&y1.h, r1), k3t_view2(ref1, K3T_F64, m, n1, n1), K3T_OP_GEMM);
        snprintf(w, sizeof w, "chain %s -> %s step 2", c1->name, c2->name);
        k3t_check_close(w, k3t_view2(hy2, K3T_BF16, m, n2, n2), k3t_view2(ref2, K3T_F64, m, n2, n2), K3T_OP_GEMM);

        /* captured graph (the poisoning captured too), replayed 3 times: bitwise equal to the direct run */
        cudaGraph_t g;
        cudaGraphExec_t ge;
        K3T_CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        const int poisoned = k3t_dout_poison(&y1, s) && k3t_dout_poison(&y2, s);
        const k3_status st1 = k3_cuda_gemm_launch(ctx, c1, &a1, s, 1);
        const k3_status st2 = k3_cuda_gemm_launch(ctx, c2, &a2, s, 1);
        K3T_CU(cudaStreamEndCapture(s, &g));
        CHECK(poisoned && st1 == K3_STATUS_SUCCESS && st2 == K3_STATUS_SUCCESS, "capture %s -> %s: %s", c1->name,
              c2->name, k3_ctx_last_error(ctx));
        K3T_CU(cudaGraphInstantiate(&ge, g, 0));
        for (int rep = 0; rep < 3; rep++) {
            K3T_CU(cudaGraphLaunch(ge, s));
            K3T_CU(cudaStreamSynchronize(s));
            k3t_dout_check(&y2, s, r2, 0, NULL);
            snprintf(w, sizeof w, "graph replay %d of %s -> %s vs the direct run", rep, c1->name, c2->name);
            k3t_check_same(w, k3t_dout_host(&y2), hy2, K3T_BF16, m * n2);
        }
        K3T_CU(cudaGraphExecDestroy(ge));
        K3T_CU(cudaGraphDestroy(g));
    }
    K3T_CU(cudaStreamDestroy(s));
    cudaFree(dx);
    cudaFree(dw1);
    cudaFree(dw2);
    cudaFree(dres);
    k3t_dout_free(&y1);
    k3t_dout_free(&y2);
    free(hx);
    free(hw1);
    free(hw2);
    free(hres);
    free(hy2);
    free(ref1);
    free(ref2);
}

/* Same geometry: configurations that differ only in what the registry does not describe (L2 prefetch, the L2
 * fetch-size hint, the register cap for resident blocks) run the same arithmetic in the same order. */
static int same_geometry(const k3_gemm_config *a, const k3_gemm_config *b) {
    return a->kernel == b->kernel && a->threads == b->threads && a->rows_per_block == b->rows_per_block &&
           a->k_unroll == b->k_unroll && a->k_split == b->k_split && a->max_m == b->max_m &&
           a->static_k == b->static_k && a->cluster_k == b->cluster_k && a->max_k == b->max_k;
}

/* Two runs of every configuration on the same inputs: bitwise identical. Configurations of the same geometry
 * (e.g. w8_t1_u4, w8_t1_u4_l, w8_t1_u4_o2): bitwise identical to each other too. */
static void test_bitwise(k3_ctx *ctx, problem *p) {
    int32_t count = 0;
    const k3_gemm_config *cfgs = k3_gemm_configs(&count);
    uint16_t *first = malloc(p->y_elems * 2);
    uint16_t *outs = malloc((size_t)count * p->y_elems * 2);
    if (!first || !outs) {
        fprintf(stderr, "FATAL: out of host memory\n");
        exit(1);
    }
    const uint16_t *hy = (const uint16_t *)k3t_dout_host(&p->y);
    int32_t pairs = 0;
    for (int32_t c = 0; c < count; c++) {
        if (!k3_gemm_config_supports(&cfgs[c], p->s.n, p->s.k, cfgs[c].max_m, p->s.x_stride, NULL)) continue;
        k3_gemm_args a = args_of(p, cfgs[c].max_m, 1);
        poison(p);
        CHECK(k3_cuda_gemm_launch(ctx, &cfgs[c], &a, NULL, 0) == K3_STATUS_SUCCESS, "bitwise run 1");
        fetch(p);
        memcpy(first, hy, p->y_elems * 2);
        poison(p);
        CHECK(k3_cuda_gemm_launch(ctx, &cfgs[c], &a, NULL, 1) == K3_STATUS_SUCCESS, "bitwise run 2");
        fetch(p);
        char w[160];
        snprintf(w, sizeof w, "%s: second run vs the first", cfgs[c].name);
        k3t_check_same(w, hy, first, K3T_BF16, (int64_t)p->y_elems);
        memcpy(outs + (size_t)c * p->y_elems, hy, p->y_elems * 2);
        for (int32_t d = 0; d < c; d++)
            if (same_geometry(&cfgs[d], &cfgs[c])) {
                pairs++;
                snprintf(w, sizeof w, "%s vs %s (same geometry)", cfgs[c].name, cfgs[d].name);
                k3t_check_same(w, hy, outs + (size_t)d * p->y_elems, K3T_BF16, (int64_t)p->y_elems);
                break;
            }
    }
    CHECK(pairs > 0, "no two configurations share a geometry (the prefetch / register-cap variants are gone?)");
    free(outs);
    free(first);
}

/* Every K of the K3 shape set; strided x (the KDA f_a slice: k 128 in rows of 144); row counts that leave partial
 * row blocks; a K that only the 8-element step divides (7176: MMA must refuse, skinny must work). shape = {n, k,
 * x_stride}; every configuration runs at m = 1..its max_m (at most MAXM); options: OPT_*. */
static const k3t_case k_shape_cases[] = {
    {"shape", {144, 7168, 7168}, MAXM, OPT_REJECTIONS | OPT_BITWISE, 0, K3T_OP_GEMM},
    {"shape", {200, 1536, 1560}, MAXM, 0, 1, K3T_OP_GEMM},
    {"shape", {1536, 128, 144}, MAXM, OPT_BITWISE, 2, K3T_OP_GEMM}, /* k 128: where the whole-K warp tiles run */
    {"shape", {96, 768, 768}, MAXM, 0, 3, K3T_OP_GEMM},
    {"shape", {72, 3584, 3648}, MAXM, 0, 4, K3T_OP_GEMM},
    {"shape", {48, 4224, 4224}, MAXM, 0, 5, K3T_OP_GEMM},
    {"shape", {40, 7176, 7176}, MAXM, 0, 6, K3T_OP_GEMM},
    {"shape", {24, 32, 32}, MAXM, 0, 7, K3T_OP_GEMM},
    {"shape", {40, 96, 104}, MAXM, 0, 8, K3T_OP_GEMM}, /* K under a whole-K warp tile's 128: chunks past K are 0 */
    /* the bulk ring: a partial last row tile, K of 4 stages (2 per cluster rank, fewer than the ring holds), a strided x */
    {"shape", {200, 2048, 2056}, MAXM, 0, 9, K3T_OP_GEMM},
};

/* The PDL chains: shape = {k1, n1, n2}, m tokens. The K3 shapes (x w(1536x7168) then 2304x1536), then a K = 128
 * consumer (the whole-K warp tiles read x after the wait too) over two token tiles. */
static const k3t_case k_chain_cases[] = {
    {"chain", {7168, 1536, 2304}, 5, 0, 100, K3T_OP_GEMM},
    {"chain", {7168, 128, 1536}, 12, 0, 101, K3T_OP_GEMM},
};

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) K3T_SKIP("no CUDA device");
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    opt.backend = K3_BACKEND_CUDA;
    k3_ctx *ctx = NULL;
    if (k3_ctx_create(&opt, &ctx) != K3_STATUS_SUCCESS) K3T_SKIP("no usable CUDA context");
    const int quick = getenv("K3T_GEMM_QUICK") != NULL;
    const char *only = getenv("K3T_GEMM_ONLY");
    printf("gpu_gemm_kernels%s%s%s\n", quick ? " (quick: M subset)" : "", only ? ", configurations matching " : "",
           only ? only : "");
    k3t_seed_init("gpu_gemm_kernels", DEFAULT_SEED);
    /* the launches below go straight to k3_cuda_gemm_launch: set every configuration up first, as a plan would */
    int32_t n_cfgs = 0;
    const k3_gemm_config *all = k3_gemm_configs(&n_cfgs);
    for (int32_t c = 0; c < n_cfgs; c++)
        CHECK(k3_cuda_gemm_prepare(ctx, &all[c]) == K3_STATUS_SUCCESS, "prepare %s: %s", all[c].name,
              k3_ctx_last_error(ctx));
    for (size_t i = 0; i < sizeof k_shape_cases / sizeof k_shape_cases[0]; i++) {
        const k3t_case *kc = &k_shape_cases[i];
        const shape sh = {kc->shape[0], kc->shape[1], kc->shape[2]};
        problem p;
        problem_init(&p, sh, k3t_case_begin(kc));
        test_configs_on(ctx, &p, quick);
        if (kc->options & OPT_REJECTIONS) test_rejections(ctx, &p);
        if (kc->options & OPT_BITWISE) test_bitwise(ctx, &p);
        problem_free(&p);
    }
    for (size_t i = 0; i < sizeof k_chain_cases / sizeof k_chain_cases[0]; i++)
        test_chain_graph(ctx, &k_chain_cases[i]);
    k3_ctx_destroy(ctx);
    return k3t_finish();
}

#else
int main(void) {
    K3T_SKIP("built without CUDA");
}
#endif
