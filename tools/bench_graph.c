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

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
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

k3_status k3_bench_graph_time(k3_bench_call_fn fn, void *user, const k3_bench_timing *t, void *stream, double *us,
                              char *err, size_t err_size) {
    const cudaStream_t s = (cudaStream_t)stream;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    int capturing = 0;
    k3_status st = K3_STATUS_SUCCESS;
    double *times = (double *)calloc((size_t)(t->reps > 0 ? t->reps : 1), sizeof *times);
    if (!times) {
        snprintf(err, err_size, "out of host memory");
        return K3_STATUS_OUT_OF_MEMORY;
    }
    BG_CUDA(cudaEventCreate(&e0));
    BG_CUDA(cudaEventCreate(&e1));
    BG_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    capturing = 1;
    for (int32_t i = 0; i < t->calls; i++)
        if ((st = fn(user, i % t->copies, stream, err, err_size)) != K3_STATUS_SUCCESS) goto done;
    capturing = 0;
    BG_CUDA(cudaStreamEndCapture(s, &graph));
    BG_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int32_t i = 0; i < t->warmup; i++) BG_CUDA(cudaGraphLaunch(exec, s));
    for (int32_t r = 0; r < t->reps; r++) {
        float ms = 0;
        BG_CUDA(cudaEventRecord(e0, s));
        BG_CUDA(cudaGraphLaunch(exec, s));
        BG_CUDA(cudaEventRecord(e1, s));
        BG_CUDA(wait_event(e1));
        BG_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        times[r] = 1000.0 * (double)ms / (double)t->calls;
    }
    qsort(times, (size_t)t->reps, sizeof *times, cmp_double);
    *us = times[t->reps / 2];
done:
    if (capturing) { /* leave the stream usable after a failed capture */
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(s, &g);
        if (g) cudaGraphDestroy(g);
        (void)cudaGetLastError();
    }
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    free(times);
    return st;
}
#else
k3_status k3_bench_graph_time(k3_bench_call_fn fn, void *user, const k3_bench_timing *t, void *stream, double *us,
                              char *err, size_t err_size) {
    (void)fn, (void)user, (void)t, (void)stream, (void)us;
    snprintf(err, err_size, "this build has no CUDA backend");
    return K3_STATUS_NOT_AVAILABLE;
}

k3_status k3_bench_sync(void *stream, char *err, size_t err_size) {
    (void)stream;
    snprintf(err, err_size, "this build has no CUDA backend");
    return K3_STATUS_NOT_AVAILABLE;
}
#endif
