/* The engine of `k3 convert` (tools/convert_run.c): plan the output, then stream it expert by expert. */
#ifndef K3_TOOLS_CONVERT_RUN_H
#define K3_TOOLS_CONVERT_RUN_H

#include <stdint.h>

typedef enum k3_convert_format { K3_CONVERT_KEEP = 0, K3_CONVERT_NVFP4, K3_CONVERT_MXFP4 } k3_convert_format;

typedef struct k3_convert_opts {
    const char *input, *output;
    int32_t layer;
    k3_convert_format format;
    int json, quiet, progress;
    int scale_layout; /* --scale-layout: a stacked input's layout when it does not record it; -1 = not given */
} k3_convert_opts;

#define K3_CONVERT_MAX_BLOCK 8
typedef struct k3_convert_result {
    const char *source_format, *output_format; /* static strings */
    int64_t experts, hidden, inter;
    uint64_t bytes_written; /* the data section */
    int input_scales_dropped;
    int block_count;
    const char *block_names[K3_CONVERT_MAX_BLOCK];
} k3_convert_result;

/* Writes the file; 1 on success, 0 after printing the failure (nothing is left at o->output but what was there). */
int k3_convert_layer(const k3_convert_opts *o, k3_convert_result *r);

#endif
