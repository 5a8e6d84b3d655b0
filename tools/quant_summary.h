/* k3 quant / k3 dequant --json: the one JSON object that summarizes a conversion (tools/quant_summary.c). */
#ifndef K3_TOOLS_QUANT_SUMMARY_H
#define K3_TOOLS_QUANT_SUMMARY_H

#include <stdint.h>

#include "io/safetensors.h"

/* What became of one input tensor. */
enum { K3_QS_COPIED = 0, K3_QS_CONVERTED = 1, K3_QS_DROPPED = 2 };

typedef struct k3_quant_summary {
    const char *command;        /* "quant" or "dequant" */
    const char *converted_key;  /* "quantized" or "dequantized" */
    const char *input, *output;
    const char *format;         /* nvfp4, mxfp4, "mixed" (dequant of both) or NULL (dequant of none) */
    const char *scale_layout;   /* linear, swizzled, "mixed" or NULL */
    const char *dtype;          /* dequant's output dtype; NULL for quant */
    const k3_st_file *in;       /* the input file, still open: the names are its tensors' */
    const unsigned char *fate;  /* per input tensor, in file order: K3_QS_* */
    int64_t tensors_out;        /* tensors in the output file */
    int64_t bytes_in, bytes_out; /* file sizes */
    double seconds;             /* wall time of the whole command */
} k3_quant_summary;

/* The size of the file at path in bytes, or -1 when it cannot be read (stat fails). */
int64_t k3_quant_file_bytes(const char *path);
/* Prints the summary as one JSON object and a newline on stdout. */
void k3_quant_summary_print(const k3_quant_summary *s);

#endif
