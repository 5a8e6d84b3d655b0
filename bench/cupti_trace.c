/* A kernel timeline for any CUDA program, by CUPTI injection: every kernel's start and end on the GPU's clock,
 * with its stream and, inside a CUDA graph, the graph and node it came from. Used to see how the block's kernels
 * overlap under graph replay (`k3 bench block`), which stage times alone cannot show.
 *
 *   nvcc -O2 -shared -Xcompiler -fPIC bench/cupti_trace.c -lcupti -o build/libk3trace.so
 *   K3_TRACE_OUT=trace.tsv CUDA_INJECTION64_PATH=$PWD/build/libk3trace.so build/k3 bench block --m 1 --reps 7
 *   python3 bench/cupti_timeline.py trace.tsv
 *
 * One line per kernel: graph id, graph node id, stream id, start ns, end ns, grid size, block size, mangled name.
 * This is a measurement probe, not library code: its record buffer is process-wide by CUPTI's design (the
 * callbacks take no user pointer). */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TRACE_BUF = 8 << 20 };

static FILE *g_out; /* the TSV file, opened at injection */
static unsigned long long g_dropped;

static void CUPTIAPI trace_buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = (uint8_t *)aligned_alloc(8, TRACE_BUF);
    *size = *buffer ? TRACE_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI trace_buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t *buffer, size_t size,
                                            size_t valid) {
    (void)ctx, (void)stream_id, (void)size;
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        if (g_out)
            fprintf(g_out, "%u\t%llu\t%u\t%llu\t%llu\t%d\t%d\t%s\n", k->graphId, (unsigned long long)k->graphNodeId,
                    k->streamId, (unsigned long long)k->start, (unsigned long long)k->end,
                    k->gridX * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ, k->name ? k->name : "?");
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream_id, &dropped) == CUPTI_SUCCESS) g_dropped += dropped;
    free(buffer);
}

static void trace_finish(void) {
    cuptiActivityFlushAll(1);
    if (g_out) {
        if (g_dropped) fprintf(stderr, "k3trace: %llu records dropped\n", g_dropped);
        fclose(g_out);
        g_out = NULL;
    }
}

/* The entry point the CUDA driver calls for a library named by CUDA_INJECTION64_PATH. */
int InitializeInjection(void) {
    const char *path = getenv("K3_TRACE_OUT");
    g_out = fopen(path ? path : "k3trace.tsv", "w");
    if (!g_out) {
        fprintf(stderr, "k3trace: cannot open %s\n", path ? path : "k3trace.tsv");
        return 0;
    }
    if (cuptiActivityRegisterCallbacks(trace_buffer_requested, trace_buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "k3trace: CUPTI activity tracing could not be enabled\n");
        return 0;
    }
    atexit(trace_finish);
    return 1;
}
