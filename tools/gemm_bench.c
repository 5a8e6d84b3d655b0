/* The GEMM measurement harness (see gemm_bench.h): CUDA runtime API from C, CUDA builds only. */
#include "gemm_bench.h"

#include "bench_graph.h"
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/gemm_configs.h" /* internals: the registry's configurations, timed one by one */

double k3b_bytes(int64_t n, int64_t k, int64_t m) { return 2.0 * ((double)n * (double)k + (double)m * (double)k + (double)m * (double)n); }

double k3b_percent_of_ceiling(int64_t n, int64_t k, int64_t m, double us) {
    if (!(us > 0)) return 0;
    return 100.0 * k3b_bytes(n, k, m) / (us * 1e-6) / K3_BENCH_READ_CEILING;
}

int k3b_parse_sweep_arg(int argc, char **argv, int *i, k3b_sweep_args *a) {
    const char *opt = argv[*i], *v = NULL;
    if (!strcmp(opt, "--shapes")) return (a->shapes = k3_cli_value(argc, argv, i, opt)) ? 1 : -1;
    if (!strcmp(opt, "--m")) return (a->m = k3_cli_value(argc, argv, i, opt)) ? 1 : -1;
    if (!strcmp(opt, "--reps"))
        return (v = k3_cli_value(argc, argv, i, opt)) && k3_cli_parse_i64(v, opt, &a->reps) ? 1 : -1;
    if (!strcmp(opt, "--seed"))
        return (v = k3_cli_value(argc, argv, i, opt)) && k3_cli_parse_i64(v, opt, &a->seed) ? 1 : -1;
    return 0;
}

int k3b_parse_m(const char *arg, const char *cmd, int64_t limit, int64_t *ms, int cap, int64_t *max_m) {
    const int n = k3_cli_parse_list(arg, "--m", ms, cap);
    *max_m = 0;
    for (int i = 0; i < n; i++) {
        if (ms[i] < 1 || ms[i] > limit) {
            fprintf(stderr, "%s: --m values must be 1..%lld\n", cmd, (long long)limit);
            return 0;
        }
        if (ms[i] > *max_m) *max_m = ms[i];
    }
    return n;
}

k3_ctx *k3b_open_cuda(const char *cmd) {
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    opt.backend = K3_BACKEND_CUDA;
    k3_ctx *ctx = NULL;
    const k3_status st = k3_ctx_create(&opt, &ctx);
    if (st != K3_STATUS_SUCCESS) {
        fprintf(stderr, "%s: needs a CUDA GPU and a CUDA build of k3 (%s); nothing was measured\n", cmd,
                k3_status_string(st));
        return NULL;
    }
    return ctx;
}

_Static_assert(K3_GEMM_CONFIG_COUNT + K3B_LT_ALGOS <= K3B_MAX_CAND,
               "K3B_MAX_CAND (tools/gemm_bench.h) must hold every registry configuration and the cuBLASLt candidates");

int k3b_candidates(int64_t n, int64_t k, int64_t m, int with_cublaslt, k3b_candidate out[K3B_MAX_CAND]) {
    int32_t count = 0;
    const k3_gemm_config *all = k3_gemm_configs(&count);
    int c = 0;
    for (int32_t i = 0; i < count; i++) {
        if (!k3_gemm_config_supports(&all[i], n, k, m, k, NULL)) continue;
        out[c].kernel = all[i].kernel;
        snprintf(out[c].config, sizeof out[c].config, "%s", all[i].name);
        c++;
    }
    for (int a = 0; with_cublaslt && a < K3B_LT_ALGOS; a++) {
        out[c].kernel = K3_KERNEL_FALLBACK;
        snprintf(out[c].config, sizeof out[c].config, "h%d", a);
        c++;
    }
    return c;
}

void k3b_candidate_desc(const k3b_candidate *c, int64_t n, int64_t k, k3_linear_desc *d) {
    k3_linear_desc_init(d, n, k);
    d->force_kernel = c->kernel;
    d->force_config = c->config;
}

#ifndef K3_HAVE_CUDA

k3_status k3b_shape_open(k3_ctx *ctx, int64_t n, int64_t k, int64_t max_m, const k3b_options *o, k3b_shape **out,
                         char *err, size_t err_size) {
    (void)ctx, (void)n, (void)k, (void)max_m, (void)o;
    *out = NULL;
    snprintf(err, err_size, "this build of k3 has no CUDA backend");
    return K3_STATUS_NOT_AVAILABLE;
}
void k3b_shape_close(k3b_shape *s) { (void)s; }
int32_t k3b_shape_copies(const k3b_shape *s) { (void)s; return 0; }
int32_t k3b_shape_calls(const k3b_shape *s) { (void)s; return 0; }
void k3b_measure(k3b_shape *s, const k3_linear_desc *d, int64_t m, k3b_result *r) {
    (void)s, (void)d, (void)m;
    memset(r, 0, sizeof *r);
    r->status = K3_STATUS_NOT_AVAILABLE;
    snprintf(r->message, sizeof r->message, "this build of k3 has no CUDA backend");
}

#else

#include <cuda_runtime.h>

#include "cpu/cpu.h" /* internals: the reference loop checks each candidate before it is timed */


struct k3b_shape {
    k3_ctx *ctx;
    int64_t n, k, max_m;
    k3b_options o;
    int32_t copies, calls;
    size_t w_pitch;    /* bytes between weight copies (256-byte aligned) */
    char *w;           /* device: copies x [n, k] */
    uint16_t *x, *y;   /* device: [max_m, k], [max_m, n] */
    void *ws;          /* device workspace, grown on demand outside capture */
    size_t ws_cap;
    uint16_t *ref;     /* host: CPU reference [max_m, n] */
    uint16_t *yh;      /* host: device output copied back */
    cudaStream_t stream;
};

static cudaError_t sync_stream(k3b_shape *s) {
    char err[160];
    if (k3_bench_sync(s->stream, err, sizeof err) == K3_STATUS_SUCCESS) return cudaSuccess;
    const cudaError_t e = cudaGetLastError(); /* the kernel's own error, else it hung */
    return e != cudaSuccess ? e : cudaErrorLaunchTimeout;
}

static uint64_t splitmix(uint64_t *st) {
    uint64_t z = (*st += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void fill_random(uint16_t *v, size_t count, uint64_t seed) {
    uint64_t st = seed;
    for (size_t i = 0; i < count; i++) {
        float u = (float)((double)(splitmix(&st) >> 40) * (2.0 / 16777216.0) - 1.0); /* [-1, 1) */
        v[i] = k3_bf16_from_f32(u);
    }
}

#define OPEN_CUDA(call)                                                                                      \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            snprintf(err, err_size, "%s failed: %s", #call, cudaGetErrorString(e_));                        \
            k3b_shape_close(s);                                                                              \
            return K3_STATUS_CUDA_ERROR;                                                                     \
        }                                                                                                    \
    } while (0)

k3_status k3b_shape_open(k3_ctx *ctx, int64_t n, int64_t k, int64_t max_m, const k3b_options *o, k3b_shape **out,
                         char *err, size_t err_size) {
    *out = NULL;
    if (max_m < 1 || max_m > K3B_MAX_M || n < 1 || k < 1) {
        snprintf(err, err_size, "bad shape %lld x %lld, max_m %lld", (long long)n, (long long)k, (long long)max_m);
        return K3_STATUS_INVALID_ARGUMENT;
    }
    k3b_shape *s = (k3b_shape *)calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, err_size, "out of host memory");
        return K3_STATUS_OUT_OF_MEMORY;
    }
    s->ctx = ctx;
    s->n = n;
    s->k = k;
    s->max_m = max_m;
    s->o = *o;
    k3_arch_info a;
    k3_ctx_arch(ctx, &a);
    const size_t w_bytes = (size_t)n * (size_t)k * 2;
    s->w_pitch = (w_bytes + 255) / 256 * 256;
    s->copies = k3_bench_cold_copies((double)w_bytes, a.l2_bytes);
    s->calls = s->copies < K3B_MIN_CALLS ? K3B_MIN_CALLS : s->copies;
    /* K3_BENCH_GEMM_CALLS (an experiment knob, not part of the method): more calls per graph, to separate the
     * replay's own launch cost (amortized over the calls) from the per-kernel cost. */
    const char *calls_env = getenv("K3_BENCH_GEMM_CALLS");
    if (calls_env) {
        const long v = strtol(calls_env, NULL, 10);
        if (v > s->calls && v <= 4096) s->calls = (int32_t)v;
    }

    size_t free_b = 0, total_b = 0;
    OPEN_CUDA(cudaMemGetInfo(&free_b, &total_b));
    const double need = (double)s->w_pitch * s->copies + 64.0 * 1024 * 1024;
    if (need > 0.85 * (double)free_b) {
        snprintf(err, err_size, "%lld x %lld needs %.0f MB of device memory for %d cold weight copies, %.0f MB free",
                 (long long)n, (long long)k, need / 1e6, (int)s->copies, (double)free_b / 1e6);
        k3b_shape_close(s);
        return K3_STATUS_OUT_OF_MEMORY;
    }
    uint16_t *wh = (uint16_t *)malloc(w_bytes);
    uint16_t *xh = (uint16_t *)malloc((size_t)max_m * (size_t)k * 2);
    s->ref = (uint16_t *)malloc((size_t)max_m * (size_t)n * 2);
    s->yh = (uint16_t *)malloc((size_t)max_m * (size_t)n * 2);
    if (!wh || !xh || !s->ref || !s->yh) {
        free(wh);
        free(xh);
        snprintf(err, err_size, "out of host memory for %lld x %lld", (long long)n, (long long)k);
        k3b_shape_close(s);
        return K3_STATUS_OUT_OF_MEMORY;
    }
    fill_random(wh, (size_t)n * (size_t)k, o->seed ^ ((uint64_t)n << 32) ^ (uint64_t)k);
    fill_random(xh, (size_t)max_m * (size_t)k, ~o->seed ^ ((uint64_t)k << 32) ^ (uint64_t)n);
    /* The reference: the library's CPU backend (fp32 accumulation) on the same BF16 data. */
    k3_cpu_linear(max_m, n, k, xh, k, wh, NULL, s->ref, n, K3_ACCUM_FP32);

    cudaError_t e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc((void **)&s->w, s->w_pitch * (size_t)s->copies);
    if (e == cudaSuccess) e = cudaMalloc((void **)&s->x, (size_t)max_m * (size_t)k * 2);
    if (e == cudaSuccess) e = cudaMalloc((void **)&s->y, (size_t)max_m * (size_t)n * 2);
    if (e == cudaSuccess) e = cudaMemcpy(s->w, wh, w_bytes, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(s->x, xh, (size_t)max_m * (size_t)k * 2, cudaMemcpyHostToDevice);
    for (int32_t c = 1; c < s->copies && e == cudaSuccess; c++)
        e = cudaMemcpy(s->w + (size_t)c * s->w_pitch, s->w, w_bytes, cudaMemcpyDeviceToDevice);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    free(wh);
    free(xh);
    if (e != cudaSuccess) {
        snprintf(err, err_size, "device setup for %lld x %lld failed: %s", (long long)n, (long long)k,
                 cudaGetErrorString(e));
        k3b_shape_close(s);
        return K3_STATUS_CUDA_ERROR;
    }
    *out = s;
    return K3_STATUS_SUCCESS;
}

void k3b_shape_close(k3b_shape *s) {
    if (!s) return;
    if (s->w) cudaFree(s->w);
    if (s->x) cudaFree(s->x);
    if (s->y) cudaFree(s->y);
    if (s->ws) cudaFree(s->ws);
    if (s->stream) cudaStreamDestroy(s->stream);
    free(s->ref);
    free(s->yh);
    free(s);
}

int32_t k3b_shape_copies(const k3b_shape *s) { return s ? s->copies : 0; }
int32_t k3b_shape_calls(const k3b_shape *s) { return s ? s->calls : 0; }

/* rel-L2 of the device output's first m rows against the reference; NaN/Inf counted apart. */
static cudaError_t check_output(k3b_shape *s, int64_t m, double *rel, int32_t *nans) {
    const size_t count = (size_t)m * (size_t)s->n;
    cudaError_t e = cudaMemcpyAsync(s->yh, s->y, count * 2, cudaMemcpyDeviceToHost, s->stream);
    if (e == cudaSuccess) e = sync_stream(s);
    if (e != cudaSuccess) return e;
    double num = 0, den = 0;
    int32_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        const double g = k3_bf16_to_f32(s->yh[i]), r = k3_bf16_to_f32(s->ref[i]);
        if (!isfinite(g)) {
            bad++;
            continue;
        }
        num += (g - r) * (g - r);
        den += r * r;
    }
    *rel = den > 0 ? sqrt(num / den) : sqrt(num);
    *nans = bad;
    return cudaSuccess;
}

typedef struct measure_call {
    k3b_shape *s;
    k3_linear_plan *plan;
    int64_t m;
} measure_call;

static k3_status measure_one(void *user, int32_t copy, void *stream, char *err, size_t err_size) {
    const measure_call *c = (const measure_call *)user;
    k3b_shape *s = c->s;
    const k3_status st = k3_linear_run(c->plan, c->m, s->x, s->w + (size_t)copy * s->w_pitch, NULL, s->y, s->ws,
                                       s->ws_cap, stream);
    if (st != K3_STATUS_SUCCESS) snprintf(err, err_size, "%s: %s", k3_status_string(st), k3_ctx_last_error(s->ctx));
    return st;
}

#define M_CUDA(call)                                                                                         \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            r->status = K3_STATUS_CUDA_ERROR;                                                                \
            snprintf(r->message, sizeof r->message, "%s failed: %s", #call, cudaGetErrorString(e_));        \
            goto done;                                                                                       \
        }                                                                                                    \
    } while (0)

#define M_K3(call)                                                                                           \
    do {                                                                                                     \
        k3_status st_ = (call);                                                                              \
        if (st_ != K3_STATUS_SUCCESS) {                                                                      \
            r->status = st_;                                                                                 \
            snprintf(r->message, sizeof r->message, "%s: %s", k3_status_string(st_), k3_ctx_last_error(s->ctx)); \
            goto done;                                                                                       \
        }                                                                                                    \
    } while (0)

void k3b_measure(k3b_shape *s, const k3_linear_desc *d, int64_t m, k3b_result *r) {
    memset(r, 0, sizeof *r);
    r->status = K3_STATUS_SUCCESS;
    k3_linear_plan *plan = NULL;
    if (m < 1 || m > s->max_m || d->n != s->n || d->k != s->k) {
        r->status = K3_STATUS_INVALID_ARGUMENT;
        snprintf(r->message, sizeof r->message, "measure: m %lld or the shape does not match the prepared one",
                 (long long)m);
        return;
    }
    k3_linear_desc dd = *d;
    dd.max_m = m;
    dd.x_stride = 0;
    dd.y_stride = 0;
    M_K3(k3_linear_plan_create(s->ctx, &dd, &plan));
    M_K3(k3_linear_plan_kernel(plan, m, r->kernel, sizeof r->kernel));
    size_t ws_need = 0;
    M_K3(k3_linear_workspace_size(plan, &ws_need));
    if (ws_need > s->ws_cap) {
        if (s->ws) M_CUDA(cudaFree(s->ws));
        s->ws = NULL;
        s->ws_cap = 0;
        M_CUDA(cudaMalloc(&s->ws, ws_need));
        s->ws_cap = ws_need;
    }
    const size_t y_bytes = (size_t)m * (size_t)s->n * 2;

    /* 1. correct first: one call on poisoned output (0xFFFF is a BF16 NaN) */
    M_CUDA(cudaMemsetAsync(s->y, 0xFF, y_bytes, s->stream));
    M_K3(k3_linear_run(plan, m, s->x, s->w, NULL, s->y, s->ws, s->ws_cap, s->stream));
    double rel1 = 0;
    int32_t nan1 = 0;
    M_CUDA(check_output(s, m, &rel1, &nan1));

    /* 2. a graph of `calls` calls rotating the cold weight copies, warmed up, then timed replays */
    M_CUDA(cudaMemsetAsync(s->y, 0xFF, y_bytes, s->stream));
    {
        measure_call c = {s, plan, m};
        const k3_bench_timing t = {s->copies, s->calls, s->o.warmup, s->o.reps};
        const k3_status st = k3_bench_graph_time(measure_one, &c, &t, s->stream, &r->us, r->message, sizeof r->message);
        if (st != K3_STATUS_SUCCESS) {
            r->status = st;
            goto done;
        }
    }

    /* 4. the replayed graph's output must be right too */
    double rel2 = 0;
    int32_t nan2 = 0;
    M_CUDA(check_output(s, m, &rel2, &nan2));
    r->rel_l2 = rel1 > rel2 ? rel1 : rel2;
    r->nan_count = nan1 > nan2 ? nan1 : nan2;
    r->correct = r->nan_count == 0 && r->rel_l2 <= K3B_REL_L2_MAX;
done:
    k3_linear_plan_destroy(plan);
}

#endif
