#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */
#include "bench_graph.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int32_t k3_bench_cold_copies(double bytes, int64_t l2_bytes) {
    double need = 3.0 * (double)l2_bytes;
    if (need < K3_BENCH_COLD_MIN_BYTES) need = K3_BENCH_COLD_MIN_BYTES;
    const double n = ceil(need / (bytes > 1 ? bytes : 1));
    return n < 2 ? 2 : (n > 4096 ? 4096 : (int32_t)n); /* two copies each larger than the L2 alternate: cold */
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double k3_bench_median(double *v, int32_t n) {
    if (n <= 0) return 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

#ifdef K3_HAVE_CUDA
#include <cuda_runtime.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static cudaError_t wait_event(cudaEvent_t e) {
    const double t0 = now_s();
    for (;;) {
        const cudaError_t q = cudaEventQuery(e);
        if (q != cudaErrorNotReady) return q;
        if (now_s() - t0 > K3_BENCH_TIMEOUT_S) return cudaErrorLaunchTimeout;
        const struct timespec nap = {0, 20000};
        nanosleep(&nap, NULL);
    }
}

#define BG_CUDA(call)                                                                                        \
    do {                                                                                                     \
        const cudaError_t e_ = (call);                                                                       \
        if (e_ != cudaSuccess) {                                                                             \
            snprintf(err, err_size, "%s failed: %s", #call, cudaGetErrorString(e_));                        \
            st = K3_STATUS_CUDA_ERROR;                                                                       \
            goto done;                                                                                       \
        }                                                                                                    \
    } while (0)

k3_status k3_bench_sync(void *stream, char *err, size_t err_size) {
    cudaEvent_t e = NULL;
    k3_status st = K3_STATUS_SUCCESS;
    BG_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    BG_CUDA(cudaEventRecord(e, (cudaStream_t)stream));
    BG_CUDA(wait_event(e));
done:
    if (e) cudaEventDestroy(e);
    return st;
}

/* Captures variant v's calls into an instantiated graph. */
static k3_status capture(const k3_bench_variant *v, const k3_bench_timing *t, cudaStream_t s, cudaGraphExec_t *exec,
                         char *err, size_t err_size) {
    cudaGraph_t graph = NULL;
    int capturing = 0;
    k3_status st = K3_STATUS_SUCCESS;
    BG_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    capturing = 1;
    for (int32_t i = 0; i < t->calls; i++)
        if ((st = v->fn(v->user, i % t->copies, s, err, err_size)) != K3_STATUS_SUCCESS) goto done;
    capturing = 0;
    BG_CUDA(cudaStreamEndCapture(s, &graph));
    /* per-node priorities, as torch.cuda.CUDAGraph instantiates: what an engine's replay of the block runs */
    BG_CUDA(cudaGraphInstantiate(exec, graph, cudaGraphInstantiateFlagUseNodePriority));
done:
    if (capturing) { /* leave the stream usable after a failed capture */
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(s, &g);
        if (g) cudaGraphDestroy(g);
        (void)cudaGetLastError();
    }
    if (graph) cudaGraphDestroy(graph);
    return st;
}

k3_status k3_bench_graph_capture(const k3_bench_variant *v, const k3_bench_timing *t, void *stream, void **exec,
                                 char *err, size_t err_size) {
    cudaGraphExec_t e = NULL;
    const k3_status st = capture(v, t, (cudaStream_t)stream, &e, err, err_size);
    *exec = (void *)e;
    return st;
}

k3_status k3_bench_graph_replay(void *exec, void *stream, float *ms, char *err, size_t err_size) {
    const cudaStream_t s = (cudaStream_t)stream;
    cudaEvent_t e0 = NULL, e1 = NULL;
    k3_status st = K3_STATUS_SUCCESS;
    BG_CUDA(cudaEventCreate(&e0));
    BG_CUDA(cudaEventCreate(&e1));
    BG_CUDA(cudaEventRecord(e0, s));
    BG_CUDA(cudaGraphLaunch((cudaGraphExec_t)exec, s));
    BG_CUDA(cudaEventRecord(e1, s));
    BG_CUDA(wait_event(e1));
    BG_CUDA(cudaEventElapsedTime(ms, e0, e1));
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return st;
}

void k3_bench_graph_destroy(void *exec) {
    if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

k3_status k3_bench_graph_time_n(const k3_bench_variant *v, int32_t n, const k3_bench_timing *t, void *stream,
                                double *us, char *err, size_t err_size) {
    const cudaStream_t s = (cudaStream_t)stream;
    cudaGraphExec_t *exec = (cudaGraphExec_t *)calloc((size_t)(n > 0 ? n : 1), sizeof *exec);
    cudaEvent_t e0 = NULL, e1 = NULL;
    k3_status st = K3_STATUS_SUCCESS;
    const int32_t reps = t->reps > 0 ? t->reps : 1;
    double *times = (double *)calloc((size_t)reps * (size_t)(n > 0 ? n : 1), sizeof *times);
    if (!times || !exec) {
        snprintf(err, err_size, "out of host memory");
        st = K3_STATUS_OUT_OF_MEMORY;
        goto done;
    }
    BG_CUDA(cudaEventCreate(&e0));
    BG_CUDA(cudaEventCreate(&e1));
    for (int32_t j = 0; j < n; j++)
        if ((st = capture(&v[j], t, s, &exec[j], err, err_size)) != K3_STATUS_SUCCESS) goto done;
    for (int32_t j = 0; j < n; j++)
        for (int32_t i = 0; i < t->warmup; i++) BG_CUDA(cudaGraphLaunch(exec[j], s));
    /* round robin: every variant sees the same clock and thermal drift */
    for (int32_t r = 0; r < reps; r++)
        for (int32_t j = 0; j < n; j++) {
            float ms = 0;
            BG_CUDA(cudaEventRecord(e0, s));
            BG_CUDA(cudaGraphLaunch(exec[j], s));
            BG_CUDA(cudaEventRecord(e1, s));
            BG_CUDA(wait_event(e1));
            BG_CUDA(cudaEventElapsedTime(&ms, e0, e1));
            times[(size_t)j * reps + r] = 1000.0 * (double)ms / (double)t->calls;
        }
    for (int32_t j = 0; j < n; j++) us[j] = k3_bench_median(times + (size_t)j * reps, reps);
done:
    for (int32_t j = 0; exec && j < n; j++)
        if (exec[j]) cudaGraphExecDestroy(exec[j]);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    free(exec);
    free(times);
    return st;
}

k3_status k3_bench_graph_time(k3_bench_call_fn fn, void *user, const k3_bench_timing *t, void *stream, double *us,
                              char *err, size_t err_size) {
    const k3_bench_variant v = {fn, user};
    return k3_bench_graph_time_n(&v, 1, t, stream, us, err, err_size);
}
#else
k3_status k3_bench_graph_time(k3_bench_call_fn fn, void *user, const k3_bench_timing *t, void *stream, double *us,
                              char *err, size_t err_size) {
    (void)fn, (void)user, (void)t, (void)stream, (void)us;
    snprintf(err, err_size, "this build has no CUDA backend");
    return K3_STATUS_NOT_AVAILABLE;
}

k3_status k3_bench_graph_time_n(const k3_bench_variant *v, int32_t n, const k3_bench_timing *t, void *stream,
                                double *us, char *err, size_t err_size) {
    (void)v, (void)n, (void)t, (void)stream, (void)us;
    snprintf(err, err_size, "this build has no CUDA backend");
    return K3_STATUS_NOT_AVAILABLE;
}

k3_status k3_bench_graph_capture(const k3_bench_variant *v, const k3_bench_timing *t, void *stream, void **exec,
                                 char *err, size_t err_size) {
    (void)v, (void)t, (void)stream;
    *exec = NULL;
    snprintf(err, err_size, "this build has no CUDA backend");
    return K3_STATUS_NOT_AVAILABLE;
}

k3_status k3_bench_graph_replay(void *exec, void *stream, float *ms, char *err, size_t err_size) {
    (void)exec, (void)stream, (void)ms;
    snprintf(err, err_size, "this build has no CUDA backend");
    return K3_STATUS_NOT_AVAILABLE;
}

void k3_bench_graph_destroy(void *exec) { (void)exec; }

k3_status k3_bench_sync(void *stream, char *err, size_t err_size) {
    (void)stream;
    snprintf(err, err_size, "this build has no CUDA backend");
    return K3_STATUS_NOT_AVAILABLE;
}
#endif
