/* Every compiled GEMM configuration (skinny CUDA-core, tensor-core MMA) against two independent references:
 * the CPU backend's k3_cpu_linear (fp64 accumulation) and an fp64 loop written here. Covers M = 1..max_m,
 * every K3 K value, strided x, residual (separate and aliasing y), partial row blocks, unwritten-element and
 * guard checks (outputs poisoned with the 0xFFFF NaN pattern), rejected shapes and arguments, bitwise
 * reproducibility, programmatic dependent launch on a producer -> consumer chain, and CUDA-graph replay.
 * K3T_GEMM_QUICK=1 (for compute-sanitizer runs) tests a subset of M; K3T_GEMM_ONLY=TEXT tests only the
 * configurations whose name contains TEXT (the per-configuration checks; the chain test is always run). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#ifdef K3_HAVE_CUDA
#include <cuda_runtime.h>

#include "core/bf16.h"
#include "cpu/cpu.h"
#include "cuda/gemm/gemm.h"
#include "plan/gemm_configs.h"

#define POISON 0xFFFFu
#define GUARD 64 /* elements after the last row of y */
#define MAXM 16

#define CUDA_OK(call)                                                                                        \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "FATAL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));     \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

typedef struct {
    int64_t n, k, x_stride;
} shape;

/* One shape's data on host and device, and its references for all MAXM tokens (rows are independent, so the
 * first m rows of the MAXM-row reference are the m-token reference). */
typedef struct {
    shape s;
    int64_t y_stride;
    uint16_t *hx, *hw, *hres;      /* host inputs */
    double *ref, *ref_res;         /* fp64 loop: [MAXM, n] without / with residual */
    uint16_t *cpu, *cpu_res;       /* k3_cpu_linear (fp64 accumulation), [MAXM, y_stride] */
    void *dx, *dw, *dres, *dy;     /* device */
    size_t y_elems;                /* MAXM * y_stride + GUARD */
    uint16_t *hy;                  /* host copy of dy */
} problem;

static uint16_t rand_bf16(k3t_rng *r, float scale) { return k3_f32_to_bf16_bits(k3t_uniform(r) * scale); }

static void problem_init(problem *p, shape s, uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->s = s;
    p->y_stride = s.n + 8; /* row padding: elements between rows must stay untouched too */
    k3t_rng r = {seed};
    const size_t nx = (size_t)MAXM * (size_t)s.x_stride, nw = (size_t)s.n * (size_t)s.k;
    p->y_elems = (size_t)MAXM * (size_t)p->y_stride + GUARD;
    p->hx = malloc(nx * 2);
    p->hw = malloc(nw * 2);
    p->hres = malloc(p->y_elems * 2);
    p->hy = malloc(p->y_elems * 2);
    p->ref = malloc((size_t)MAXM * (size_t)s.n * sizeof(double));
    p->ref_res = malloc((size_t)MAXM * (size_t)s.n * sizeof(double));
    p->cpu = malloc(p->y_elems * 2);
    p->cpu_res = malloc(p->y_elems * 2);
    /* padding columns of x hold huge values: reading them would wreck the result */
    for (size_t i = 0; i < nx; i++) p->hx[i] = (i % (size_t)s.x_stride) < (size_t)s.k ? rand_bf16(&r, 1.0f) : 0x7f00;
    for (size_t i = 0; i < nw; i++) p->hw[i] = rand_bf16(&r, 0.05f);
    for (size_t i = 0; i < p->y_elems; i++) p->hres[i] = rand_bf16(&r, 2.0f);
    for (int64_t mi = 0; mi < MAXM; mi++)
        for (int64_t j = 0; j < s.n; j++) {
            double acc = 0.0;
            const uint16_t *xr = p->hx + mi * s.x_stride, *wr = p->hw + j * s.k;
            for (int64_t kk = 0; kk < s.k; kk++)
                acc += (double)k3_bf16_bits_to_f32(xr[kk]) * (double)k3_bf16_bits_to_f32(wr[kk]);
            p->ref[mi * s.n + j] = acc;
            p->ref_res[mi * s.n + j] = acc + (double)k3_bf16_bits_to_f32(p->hres[mi * p->y_stride + j]);
        }
    k3_cpu_linear(MAXM, s.n, s.k, p->hx, s.x_stride, p->hw, NULL, p->cpu, p->y_stride, K3_ACCUM_FP64);
    k3_cpu_linear(MAXM, s.n, s.k, p->hx, s.x_stride, p->hw, p->hres, p->cpu_res, p->y_stride, K3_ACCUM_FP64);
    CUDA_OK(cudaMalloc(&p->dx, nx * 2));
    CUDA_OK(cudaMalloc(&p->dw, nw * 2));
    CUDA_OK(cudaMalloc(&p->dres, p->y_elems * 2));
    CUDA_OK(cudaMalloc(&p->dy, p->y_elems * 2));
    CUDA_OK(cudaMemcpy(p->dx, p->hx, nx * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(p->dw, p->hw, nw * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(p->dres, p->hres, p->y_elems * 2, cudaMemcpyHostToDevice));
}

static void problem_free(problem *p) {
    free(p->hx);
    free(p->hw);
    free(p->hres);
    free(p->hy);
    free(p->ref);
    free(p->ref_res);
    free(p->cpu);
    free(p->cpu_res);
    cudaFree(p->dx);
    cudaFree(p->dw);
    cudaFree(p->dres);
    cudaFree(p->dy);
}

static void poison(problem *p) { CUDA_OK(cudaMemset(p->dy, 0xFF, p->y_elems * 2)); }

static k3_gemm_args args_of(const problem *p, int64_t m, int with_res) {
    k3_gemm_args a;
    a.m = m;
    a.n = p->s.n;
    a.k = p->s.k;
    a.x = p->dx;
    a.x_stride = p->s.x_stride;
    a.w = p->dw;
    a.residual = with_res ? p->dres : NULL;
    a.y = p->dy;
    a.y_stride = p->y_stride;
    return a;
}

/* Checks the first m rows of p->hy against both references; every other element must still be poison. */
static void check_output(const problem *p, int64_t m, int with_res, const char *what) {
    const double *ref = with_res ? p->ref_res : p->ref;
    const uint16_t *cpu = with_res ? p->cpu_res : p->cpu;
    double num = 0, den = 0, num_cpu = 0, den_cpu = 0;
    int64_t bad = 0, unwritten = 0, touched = 0;
    for (size_t i = 0; i < p->y_elems; i++) {
        const int64_t row = (int64_t)(i / (size_t)p->y_stride), col = (int64_t)(i % (size_t)p->y_stride);
        if (row < m && col < p->s.n) {
            const uint16_t b = p->hy[i];
            const double v = k3_bf16_bits_to_f32(b);
            if (b == POISON) unwritten++;
            else if (v != v || v - v != 0) bad++;
            const double d = v - ref[row * p->s.n + col], c = k3_bf16_bits_to_f32(cpu[i]);
            num += d * d;
            den += ref[row * p->s.n + col] * ref[row * p->s.n + col];
            num_cpu += (v - c) * (v - c);
            den_cpu += c * c;
        } else if (p->hy[i] != POISON) {
            touched++;
        }
    }
    const double rel = den > 0 ? sqrt(num / den) : 1.0, rel_cpu = den_cpu > 0 ? sqrt(num_cpu / den_cpu) : 1.0;
    CHECK(unwritten == 0, "%s m=%lld: %lld outputs unwritten", what, (long long)m, (long long)unwritten);
    CHECK(bad == 0, "%s m=%lld: %lld NaN/Inf outputs", what, (long long)m, (long long)bad);
    CHECK(touched == 0, "%s m=%lld: %lld elements outside y[m, n] written", what, (long long)m, (long long)touched);
    if (m == 0) return; /* a rejected launch: only "nothing written" applies */
    CHECK(rel <= 2e-3, "%s m=%lld: rel-L2 vs fp64 loop %.3e", what, (long long)m, rel);
    CHECK(rel_cpu <= 2e-3, "%s m=%lld: rel-L2 vs k3_cpu_linear %.3e", what, (long long)m, rel_cpu);
}

static void fetch(problem *p) {
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(p->hy, p->dy, p->y_elems * 2, cudaMemcpyDeviceToHost));
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
            check_output(p, 0, 0, what); /* nothing written */
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
                check_output(p, m, res, w2);
            }
        }
        /* residual aliasing y: y starts as the residual, and only y[m, n] may change */
        const int64_t m = cfg->max_m;
        CUDA_OK(cudaMemcpy(p->dy, p->dres, p->y_elems * 2, cudaMemcpyDeviceToDevice));
        k3_gemm_args a = args_of(p, m, 1);
        a.residual = p->dy;
        CHECK(k3_cuda_gemm_launch(ctx, cfg, &a, NULL, 0) == K3_STATUS_SUCCESS, "%s aliased: launch", what);
        fetch(p);
        for (size_t i = 0; i < p->y_elems; i++) { /* turn the untouched region into poison for check_output */
            const int64_t row = (int64_t)(i / (size_t)p->y_stride), col = (int64_t)(i % (size_t)p->y_stride);
            if (!(row < m && col < p->s.n)) {
                CHECK(p->hy[i] == p->hres[i], "%s aliased: element %zu outside y[m, n] changed", what, i);
                p->hy[i] = POISON;
            }
        }
        char w3[200];
        snprintf(w3, sizeof w3, "%s aliased residual", what);
        check_output(p, m, 1, w3);
    }
}

/* Bad arguments are rejected with INVALID_ARGUMENT and write nothing. */
static void test_rejections(k3_ctx *ctx, problem *p) {
    const k3_gemm_config *sk = k3_gemm_config_find(K3_KERNEL_SKINNY, "b128_o2_u4");
    const k3_gemm_config *mm = k3_gemm_config_find(K3_KERNEL_MMA, "w8_t1_u4");
    CHECK(sk != NULL && mm != NULL, "registry names");
    CHECK(k3_gemm_config_find(K3_KERNEL_MMA, "b128_o2_u4") == NULL, "name looked up under the wrong kernel");
    CHECK(k3_gemm_config_find(K3_KERNEL_SKINNY, NULL) == NULL, "NULL name");
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
        check_output(p, 0, 0, "rejected launches"); /* nothing written */
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
        check_output(p, 0, 0, "rejected whole-K launch"); /* nothing written */
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
 * would differ run to run. Outputs must be bitwise identical across direct runs and graph replays. */
static void test_chain_graph(k3_ctx *ctx, uint64_t seed, int64_t m, int64_t k1, int64_t n1, int64_t n2) {
    k3t_rng r = {seed};
    uint16_t *hx = malloc((size_t)m * k1 * 2), *hw1 = malloc((size_t)n1 * k1 * 2), *hw2 = malloc((size_t)n2 * n1 * 2);
    uint16_t *hres = malloc((size_t)m * n2 * 2), *hy1 = malloc((size_t)m * n1 * 2), *hy2 = malloc((size_t)m * n2 * 2);
    uint16_t *hy2b = malloc((size_t)m * n2 * 2);
    double *ref1 = malloc((size_t)m * n1 * sizeof(double));
    for (int64_t i = 0; i < m * k1; i++) hx[i] = rand_bf16(&r, 1.0f);
    for (int64_t i = 0; i < n1 * k1; i++) hw1[i] = rand_bf16(&r, 0.05f);
    for (int64_t i = 0; i < n2 * n1; i++) hw2[i] = rand_bf16(&r, 0.05f);
    for (int64_t i = 0; i < m * n2; i++) hres[i] = rand_bf16(&r, 1.0f);
    void *dx, *dw1, *dw2, *dres, *dy1, *dy2;
    CUDA_OK(cudaMalloc(&dx, (size_t)m * k1 * 2));
    CUDA_OK(cudaMalloc(&dw1, (size_t)n1 * k1 * 2));
    CUDA_OK(cudaMalloc(&dw2, (size_t)n2 * n1 * 2));
    CUDA_OK(cudaMalloc(&dres, (size_t)m * n2 * 2));
    CUDA_OK(cudaMalloc(&dy1, (size_t)m * n1 * 2));
    CUDA_OK(cudaMalloc(&dy2, (size_t)m * n2 * 2));
    CUDA_OK(cudaMemcpy(dx, hx, (size_t)m * k1 * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dw1, hw1, (size_t)n1 * k1 * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dw2, hw2, (size_t)n2 * n1 * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dres, hres, (size_t)m * n2 * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize()); /* pageable copies may still be landing; the chain's stream is non-blocking */
    for (int64_t i = 0; i < m; i++) /* step 1 reference, fp64 */
        for (int64_t j = 0; j < n1; j++) {
            double acc = 0;
            for (int64_t kk = 0; kk < k1; kk++)
                acc += (double)k3_bf16_bits_to_f32(hx[i * k1 + kk]) * (double)k3_bf16_bits_to_f32(hw1[j * k1 + kk]);
            ref1[i * n1 + j] = acc;
        }
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

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
        k3_gemm_args a1 = {m, n1, k1, dx, k1, dw1, NULL, dy1, n1};
        k3_gemm_args a2 = {m, n2, n1, dy1, n1, dw2, dres, dy2, n2};
        /* direct, PDL on both */
        CUDA_OK(cudaMemsetAsync(dy1, 0xFF, (size_t)m * n1 * 2, s));
        CUDA_OK(cudaMemsetAsync(dy2, 0xFF, (size_t)m * n2 * 2, s));
        CHECK(k3_cuda_gemm_launch(ctx, c1, &a1, s, 1) == K3_STATUS_SUCCESS, "chain %s: %s", c1->name,
              k3_ctx_last_error(ctx));
        CHECK(k3_cuda_gemm_launch(ctx, c2, &a2, s, 1) == K3_STATUS_SUCCESS, "chain %s: %s", c2->name,
              k3_ctx_last_error(ctx));
        CUDA_OK(cudaStreamSynchronize(s));
        CUDA_OK(cudaMemcpy(hy1, dy1, (size_t)m * n1 * 2, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(hy2, dy2, (size_t)m * n2 * 2, cudaMemcpyDeviceToHost));
        /* reference of the second step on the GPU's first-step output (fp64 loop) */
        double num = 0, den = 0;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n2; j++) {
                double acc = k3_bf16_bits_to_f32(hres[i * n2 + j]);
                for (int64_t kk = 0; kk < n1; kk++)
                    acc += (double)k3_bf16_bits_to_f32(hy1[i * n1 + kk]) * (double)k3_bf16_bits_to_f32(hw2[j * n1 + kk]);
                const double d = k3_bf16_bits_to_f32(hy2[i * n2 + j]) - acc;
                num += d * d;
                den += acc * acc;
            }
        double num1 = 0, den1 = 0;
        for (int64_t i = 0; i < m * n1; i++) {
            const double d = k3_bf16_bits_to_f32(hy1[i]) - ref1[i];
            num1 += d * d;
            den1 += ref1[i] * ref1[i];
        }
        CHECK(sqrt(num1 / den1) <= 2e-3, "chain %s step 1 rel-L2 %.3e", c1->name, sqrt(num1 / den1));
        CHECK(sqrt(num / den) <= 2e-3, "chain %s -> %s step 2 rel-L2 %.3e", c1->name, c2->name, sqrt(num / den));

        /* captured graph, replayed 3 times: bitwise equal to the direct run */
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        CUDA_OK(cudaMemsetAsync(dy1, 0xFF, (size_t)m * n1 * 2, s));
        CUDA_OK(cudaMemsetAsync(dy2, 0xFF, (size_t)m * n2 * 2, s));
        const k3_status st1 = k3_cuda_gemm_launch(ctx, c1, &a1, s, 1);
        const k3_status st2 = k3_cuda_gemm_launch(ctx, c2, &a2, s, 1);
        CUDA_OK(cudaStreamEndCapture(s, &g));
        CHECK(st1 == K3_STATUS_SUCCESS && st2 == K3_STATUS_SUCCESS, "capture %s -> %s: %s", c1->name, c2->name,
              k3_ctx_last_error(ctx));
        CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
        for (int rep = 0; rep < 3; rep++) {
            CUDA_OK(cudaGraphLaunch(ge, s));
            CUDA_OK(cudaStreamSynchronize(s));
            CUDA_OK(cudaMemcpy(hy2b, dy2, (size_t)m * n2 * 2, cudaMemcpyDeviceToHost));
            CHECK(memcmp(hy2, hy2b, (size_t)m * n2 * 2) == 0, "graph replay %d of %s -> %s differs from direct run",
                  rep, c1->name, c2->name);
        }
        CUDA_OK(cudaGraphExecDestroy(ge));
        CUDA_OK(cudaGraphDestroy(g));
    }
    CUDA_OK(cudaStreamDestroy(s));
    cudaFree(dx);
    cudaFree(dw1);
    cudaFree(dw2);
    cudaFree(dres);
    cudaFree(dy1);
    cudaFree(dy2);
    free(hx);
    free(hw1);
    free(hw2);
    free(hres);
    free(hy1);
    free(hy2);
    free(hy2b);
    free(ref1);
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
    int32_t pairs = 0;
    for (int32_t c = 0; c < count; c++) {
        if (!k3_gemm_config_supports(&cfgs[c], p->s.n, p->s.k, cfgs[c].max_m, p->s.x_stride, NULL)) continue;
        k3_gemm_args a = args_of(p, cfgs[c].max_m, 1);
        poison(p);
        CHECK(k3_cuda_gemm_launch(ctx, &cfgs[c], &a, NULL, 0) == K3_STATUS_SUCCESS, "bitwise run 1");
        fetch(p);
        memcpy(first, p->hy, p->y_elems * 2);
        poison(p);
        CHECK(k3_cuda_gemm_launch(ctx, &cfgs[c], &a, NULL, 1) == K3_STATUS_SUCCESS, "bitwise run 2");
        fetch(p);
        CHECK(memcmp(first, p->hy, p->y_elems * 2) == 0, "%s: second run differs", cfgs[c].name);
        memcpy(outs + (size_t)c * p->y_elems, p->hy, p->y_elems * 2);
        for (int32_t d = 0; d < c; d++)
            if (same_geometry(&cfgs[d], &cfgs[c])) {
                pairs++;
                CHECK(memcmp(outs + (size_t)d * p->y_elems, p->hy, p->y_elems * 2) == 0,
                      "%s differs bitwise from %s (same geometry)", cfgs[c].name, cfgs[d].name);
                break;
            }
    }
    CHECK(pairs > 0, "no two configurations share a geometry (the prefetch / register-cap variants are gone?)");
    free(outs);
    free(first);
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) K3T_SKIP("no CUDA device");
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    opt.backend = K3_BACKEND_CUDA;
    k3_ctx *ctx = NULL;
    if (k3_ctx_create(&opt, &ctx) != K3_STATUS_SUCCESS) K3T_SKIP("no usable CUDA context");
    const int quick = getenv("K3T_GEMM_QUICK") != NULL;
    const uint64_t seed = 0x4b3c1e55ull;
    const char *only = getenv("K3T_GEMM_ONLY");
    printf("gpu_gemm_kernels: seed 0x%llx%s%s%s\n", (unsigned long long)seed, quick ? " (quick: M subset)" : "",
           only ? ", configurations matching " : "", only ? only : "");

    /* every K of the K3 shape set; strided x (the KDA f_a slice: k 128 in rows of 144); row counts that leave
     * partial row blocks; a K that only the 8-element step divides (7176: MMA must refuse, skinny must work) */
    const shape shapes[] = {
        {144, 7168, 7168}, {200, 1536, 1560}, {1536, 128, 144}, {96, 768, 768},
        {72, 3584, 3648},  {48, 4224, 4224},  {40, 7176, 7176}, {24, 32, 32},
        {40, 96, 104}, /* K under a whole-K warp tile's 128: the chunks past K hold zeros */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        problem p;
        problem_init(&p, shapes[i], seed + i);
        test_configs_on(ctx, &p, quick);
        if (i == 0) test_rejections(ctx, &p);
        if (i == 0 || shapes[i].k == 128) test_bitwise(ctx, &p); /* 128: the whole-K warp tiles run there */
        problem_free(&p);
    }
    test_chain_graph(ctx, seed + 100, 5, 7168, 1536, 2304); /* K3 shapes: x w(1536x7168) then 2304x1536 */
    /* then a K = 128 consumer (the whole-K warp tiles read x after the wait too), two token tiles */
    test_chain_graph(ctx, seed + 101, 12, 7168, 128, 1536);
    k3_ctx_destroy(ctx);
    return k3t_finish();
}

#else
int main(void) {
    K3T_SKIP("built without CUDA");
}
#endif
