/* CUDA-graph timing shared by every benchmark (the method of docs/benchmarks.md): capture `calls` back-to-back
 * calls (call i uses weight copy i % copies, so the weights read are cold when the copies together exceed the L2),
 * warm up, replay `reps` times timed with events, report the median per-call time. Waits never block forever: a
 * replay that takes longer than K3_BENCH_TIMEOUT_S is reported as hung. */
#ifndef K3_TOOLS_BENCH_GRAPH_H
#define K3_TOOLS_BENCH_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "k3.h"

#define K3_BENCH_TIMEOUT_S 30.0
#define K3_BENCH_COLD_MIN_BYTES 180e6 /* >= 3 x the H200's 60 MB L2 */
/* The H200's measured HBM read ceiling, bytes/s (docs/benchmarks.md): every benchmark's "% of the ceiling" and
 * read floor, on any GPU. */
#define K3_BENCH_READ_CEILING 4.37e12

/* Queues one call using weight copy `copy` on `stream`; a failure's message goes to err. */
typedef k3_status (*k3_bench_call_fn)(void *user, int32_t copy, void *stream, char *err, size_t err_size);

typedef struct k3_bench_timing {
    int32_t copies; /* weight copies rotated */
    int32_t calls;  /* calls captured into the graph */
    int32_t warmup; /* untimed replays */
    int32_t reps;   /* timed replays (>= 1; the median is reported) */
} k3_bench_timing;

/* Returns K3_STATUS_SUCCESS with the median microseconds per call in *us; otherwise a status and err. The
 * stream is left usable after a failed capture. CUDA builds only (else K3_STATUS_NOT_AVAILABLE). */
k3_status k3_bench_graph_time(k3_bench_call_fn fn, void *user, const k3_bench_timing *t, void *stream, double *us,
                              char *err, size_t err_size);
/* One variant of a benchmark: its call function and that function's user pointer. */
typedef struct k3_bench_variant {
    k3_bench_call_fn fn;
    void *user;
} k3_bench_variant;
/* Times n variants with the same method, their replays interleaved round robin (replay r of every variant before
 * replay r + 1 of any), so that clock and thermal drift during the run affect all of them alike; us[j] is
 * variant j's median. Use it when variants are compared with each other (a bar on their difference or ratio). */
k3_status k3_bench_graph_time_n(const k3_bench_variant *v, int32_t n, const k3_bench_timing *t, void *stream,
                                double *us, char *err, size_t err_size);
/* The pieces of the method, for callers that pace the replays themselves (several GPUs replaying together):
   variant v's t->calls calls captured into an instantiated graph (*exec, a cudaGraphExec_t); one replay of it on
   stream timed with events (*ms for the whole graph, waited for at most K3_BENCH_TIMEOUT_S); its release. */
k3_status k3_bench_graph_capture(const k3_bench_variant *v, const k3_bench_timing *t, void *stream, void **exec,
                                 char *err, size_t err_size);
k3_status k3_bench_graph_replay(void *exec, void *stream, float *ms, char *err, size_t err_size);
void k3_bench_graph_destroy(void *exec);
/* The median of n values (sorted in place). */
double k3_bench_median(double *v, int32_t n);
/* Waits for everything queued on stream, at most K3_BENCH_TIMEOUT_S. */
k3_status k3_bench_sync(void *stream, char *err, size_t err_size);
/* Copies of `bytes` needed so that they total at least max(3 x L2, 180 MB); at least 2. */
int32_t k3_bench_cold_copies(double bytes, int64_t l2_bytes);

#endif
