/* k3 quant and k3 dequant: what both commands share (tools/quant_common.c); the commands are tools/cmd_quant.c and
 * tools/cmd_dequant.c. */
#ifndef K3_TOOLS_QUANT_COMMON_H
#define K3_TOOLS_QUANT_COMMON_H

#include <stdint.h>

#include "cli.h"
/* internals: the file format and the codecs (the checkpoint reader will give these a public call) */
#include "core/formats.h"
#include "io/safetensors.h"

#define K3_QUANT_META_FORMAT "k3.quant.format"
#define K3_QUANT_META_LAYOUT "k3.quant.scale_layout"

/* The options both commands share, and their help (KEY: the JSON key of the converted tensors' names). */
typedef struct k3_quant_opts {
    int json, quiet;
    float progress_after;
} k3_quant_opts;
#define K3_QUANT_OUTPUT_HELP(KEY)                                                                                   \
    "  --json                one JSON object on stdout when done: command, input, output, format, scale_layout,\n" \
    "                        (dequant: dtype), tensors_in, " KEY "_count and " KEY " (names), copied_count and\n"   \
    "                        copied (dequant: dropped_count, dropped: the scale tensors), tensors_out, bytes_in and\n" \
    "                        bytes_out (file sizes), seconds; nothing else goes to stdout, messages to stderr\n"    \
    "  --quiet               no progress lines and no closing summary line on stderr (notes and errors stay)\n"  \
    "  --progress-after S    progress lines on stderr ('tensor I of N: NAME', at most two a second) start once\n" \
    "                        the command has run S seconds (default 1; 0: a line for every tensor)\n\n"

/* Parses --json, --quiet and --progress-after at argv[*i]: 1 when it was one (advancing *i), 0 when not, -1 on
   a usage error (printed). */
int k3_quant_opts_parse(int argc, char **argv, int *i, k3_quant_opts *o);
/* The product of d[0..n), or -1 when it overflows int64 (possible when another dimension is 0, so the reader's
   byte-size check passed). */
int64_t k3_quant_elems(const int64_t *d, int32_t n);
/* "[2, 64]" into buf; returns buf. */
const char *k3_quant_shape_str(const k3_st_tensor *t, char *buf, size_t n);
/* name + suffix ("_scale", "_scale_2") in a fresh string, or NULL when out of memory. */
char *k3_quant_suffixed(const char *name, const char *suffix);
/* Adds t unchanged to the writer; 0 after printing "k3 CMD: ..." on failure. */
int k3_quant_copy_tensor(k3_st_writer *w, const k3_st_tensor *t, const char *cmd);
/* Saves the writer to path (temporary file, fsync, rename); 0 after printing on failure. */
int k3_quant_save(k3_st_writer *w, const char *path, const char *cmd);
/* Opens the input file; NULL after printing on failure. */
k3_st_file *k3_quant_open(const char *path, const char *cmd);
/* k3 dequant (tools/cmd_dequant.c): its help and its main, argv[0] = "dequant". */
void k3_dequant_help(void);
int k3_dequant_main(int argc, char **argv);

#endif
