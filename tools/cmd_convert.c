/* k3 convert: one layer's MoE (and its block tensors) from a published checkpoint layout to this library's stacked
 * layout, streamed expert by expert into one safetensors file. The lossless scale rules: tools/convert_fp4.c. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, isatty, fileno */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "convert_fp4.h"
#include "convert_run.h"
/* internals: the checkpoint reader and the file format */
#include "io/checkpoint.h"
#include "io/safetensors.h"

static void convert_help(void) {
    printf(
        "usage: k3 convert --input CKPT --layer N --output OUT.safetensors [--format keep|nvfp4|mxfp4]\n"
        "                  [--scale-layout linear|swizzled] [--json] [--quiet] [--progress]\n\n"
        "Writes layer N's MoE experts in this library's stacked layout (the names and layout `k3 run moe`\n"
        "reads), plus the layer's router, shared-expert and latent tensors when it has them, into one safetensors\n"
        "file. CKPT is a folder (its model.safetensors.index.json, or its only *.safetensors file), an index file,\n"
        "or one safetensors file (also one written by k3 quant or k3 convert). Layouts read: compressed-tensors\n"
        "MXFP4 and NVFP4 per expert (experts.<e>.{gate,up,down}_proj.weight_packed ...), ModelOpt NVFP4 per\n"
        "expert (... .weight, .weight_scale, .weight_scale_2, .input_scale) and stacked, under the prefix\n"
        "model.layers.N.mlp., language_model.model.layers.N.mlp. or none.\n\n"
        "Tensors written (E experts, I intermediate, L the experts' hidden size, H the block's hidden size):\n"
        "  w13_weight          U8 [E, 2I, L/2]     E2M1 codes, rows [gate; up], element 2j in the low nibble\n"
        "  w13_weight_scale    F8_E4M3 [E, 2I, L/16] (nvfp4) or U8 UE8M0 [E, 2I, L/32] (mxfp4), linear layout\n"
        "  w13_weight_scale_2  F32 [E, 2]          nvfp4 only: (gate, up) per expert\n"
        "  w13_input_scale     F32 [E]             when the input has activation scales (not for mxfp4); gate and up\n"
        "                                          read one activation, so one scale each; [E, 2] (gate, up) when\n"
        "                                          the input gives them different ones (k3 run moe reads [E])\n"
        "  w2_weight           U8 [E, L, I/2]\n"
        "  w2_weight_scale     as w13_weight_scale, [E, L, I/16] or [E, L, I/32]\n"
        "  w2_weight_scale_2   F32 [E]             nvfp4 only\n"
        "  w2_input_scale      F32 [E]             with w13_input_scale\n"
        "  gate_weight [E, H] (BF16 or F32), e_score_correction_bias F32 [E], shared_gate_up_weight BF16\n"
        "  [2Is, H] = [gate; up], shared_down_weight BF16 [H, Is], down_proj_weight BF16 [L, H], norm_weight\n"
        "  BF16 [L], up_proj_weight BF16 [H, L]: each when the layer has it, bytes unchanged.\n"
        "__metadata__: k3.quant.format (nvfp4|mxfp4), k3.quant.scale_layout = linear, k3.convert.source (CKPT),\n"
        "k3.convert.source_format, k3.convert.layer.\n\n"
        "Formats (every conversion is lossless or refused; values are identical, codes unchanged):\n"
        "  keep    the input's FP4 format, every byte unchanged (the default)\n"
        "  nvfp4   from MXFP4: each 32-block's 2^e becomes two 16-block E4M3 scales 2^(e - base), scale_2 =\n"
        "          2^base per matrix (gate, up and down each their own; base = the largest e - 8). E4M3 holds\n"
        "          2^-9 .. 2^8 exactly, so a matrix converts when its blocks with a non-zero code span at most 17\n"
        "          binades (an all-zero block is exact with scale 0); else an error names the tensor, expert and\n"
        "          exponent range, and nothing is written\n"
        "  mxfp4   from NVFP4: exact only where both 16-blocks of a 32-block (those with a non-zero code) have the\n"
        "          same power-of-two effective scale e4m3 x scale_2; else the same kind of error. Activation\n"
        "          (input) scales have no MXFP4 counterpart and are not written (a note says so)\n"
        "Memory: the input is read tensor by tensor (headers first, then each expert's bytes straight into\n"
        "buffers of one expert) and the output streamed in order, so host memory is about two experts plus a few\n"
        "MB, whatever the size of the layer or its shards. The output goes to a temporary file next to OUT that is\n"
        "fsynced and renamed over OUT only once complete; on any failure only the temporary is removed.\n\n"
        "  --input CKPT        the checkpoint (folder, index.json or safetensors file)\n"
        "  --layer N           the layer number (>= 0)\n"
        "  --output PATH       the safetensors file to write\n"
        "  --format F          keep (default), nvfp4 or mxfp4\n"
        "  --json              one JSON summary object on stdout: input, layer, source_format, output_format,\n"
        "                      experts, L, I, bytes_written, seconds, mb_per_s, lossless, block_tensors\n"
        "  --quiet             no progress and no notes on stderr (errors are still printed)\n"
        "  --scale-layout L    linear or swizzled: a stacked input's block-scale layout when the file does not\n"
        "                      record it (k3.quant.scale_layout) and its 3-D scale shapes fit both layouts (rows\n"
        "                      a multiple of 128, scale columns of 4); without it such an input is refused.\n"
        "                      Per-expert checkpoints are linear by their format; swizzled is not converted\n"
        "  --progress          progress on stderr about once a second even when stderr is not a terminal\n"
        "                      (by default it is shown on a terminal only, for runs longer than a second)\n\n"
        "exit status: 0 success, 1 failure (unreadable or malformed input, a tensor that cannot be converted\n"
        "exactly, a write error), 2 usage error\n");
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A JSON string (the input path may hold anything). */
static void json_str(const char *s) {
    putchar('"');
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            printf("\\%c", *c);
        else if (*c < 0x20)
            printf("\\u%04x", *c);
        else
            putchar(*c);
    }
    putchar('"');
}

int k3_cmd_convert(int argc, char **argv) {
    if (k3_cli_wants_help(argc, argv)) {
        convert_help();
        return K3_EXIT_OK;
    }
    k3_convert_opts o;
    memset(&o, 0, sizeof o);
    o.scale_layout = -1;
    const char *layer_s = NULL, *fmt_s = "keep";
    int progress_flag = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--input")) {
            if (!(o.input = k3_cli_value(argc, argv, &i, a))) return K3_EXIT_USAGE;
        } else if (!strcmp(a, "--output")) {
            if (!(o.output = k3_cli_value(argc, argv, &i, a))) return K3_EXIT_USAGE;
        } else if (!strcmp(a, "--layer")) {
            if (!(layer_s = k3_cli_value(argc, argv, &i, a))) return K3_EXIT_USAGE;
        } else if (!strcmp(a, "--format")) {
            if (!(fmt_s = k3_cli_value(argc, argv, &i, a))) return K3_EXIT_USAGE;
        } else if (!strcmp(a, "--json")) {
            o.json = 1;
        } else if (!strcmp(a, "--quiet")) {
            o.quiet = 1;
        } else if (!strcmp(a, "--progress")) {
            progress_flag = 1;
        } else if (!strcmp(a, "--scale-layout")) {
            const char *v = k3_cli_value(argc, argv, &i, a);
            if (!v) return K3_EXIT_USAGE;
            if (!strcmp(v, "linear")) o.scale_layout = K3_SCALE_LINEAR;
            else if (!strcmp(v, "swizzled")) o.scale_layout = K3_SCALE_SWIZZLED;
            else {
                fprintf(stderr, "k3 convert: --scale-layout must be linear or swizzled (got '%s')\n", v);
                return K3_EXIT_USAGE;
            }
        } else {
            fprintf(stderr, "k3 convert: unexpected argument '%s' (see k3 convert --help)\n", a);
            return K3_EXIT_USAGE;
        }
    }
    if (!o.input || !o.output || !layer_s) {
        fprintf(stderr, "k3 convert: --input, --layer and --output are required (see k3 convert --help)\n");
        return K3_EXIT_USAGE;
    }
    int64_t layer = 0;
    if (!k3_cli_parse_i64(layer_s, "--layer", &layer)) return K3_EXIT_USAGE;
    if (layer < 0 || layer > INT32_MAX) {
        fprintf(stderr, "k3 convert: --layer must be 0 .. %d (got %lld)\n", INT32_MAX, (long long)layer);
        return K3_EXIT_USAGE;
    }
    o.layer = (int32_t)layer;
    if (!strcmp(fmt_s, "keep"))
        o.format = K3_CONVERT_KEEP;
    else if (!strcmp(fmt_s, "nvfp4"))
        o.format = K3_CONVERT_NVFP4;
    else if (!strcmp(fmt_s, "mxfp4"))
        o.format = K3_CONVERT_MXFP4;
    else {
        fprintf(stderr, "k3 convert: --format must be keep, nvfp4 or mxfp4 (got '%s')\n", fmt_s);
        return K3_EXIT_USAGE;
    }
    o.progress = !o.quiet && (progress_flag || isatty(fileno(stderr)));
    k3_convert_result r;
    const double t0 = now_s();
    if (!k3_convert_layer(&o, &r)) return K3_EXIT_FAIL;
    const double secs = now_s() - t0;
    const double mbs = secs > 0 ? (double)r.bytes_written / 1e6 / secs : 0.0;
    if (o.json) {
        printf("{\"input\": ");
        json_str(o.input);
        printf(", \"output\": ");
        json_str(o.output);
        printf(", \"layer\": %d, \"source_format\": \"%s\", \"output_format\": \"%s\", \"experts\": %lld, \"L\": %lld, "
               "\"I\": %lld, \"bytes_written\": %llu, \"seconds\": %.3f, \"mb_per_s\": %.1f, \"lossless\": true, "
               "\"input_scales_dropped\": %s, \"block_tensors\": [",
               (int)o.layer, r.source_format, r.output_format, (long long)r.experts, (long long)r.hidden,
               (long long)r.inter, (unsigned long long)r.bytes_written, secs, mbs,
               r.input_scales_dropped ? "true" : "false");
        for (int i = 0; i < r.block_count; i++) printf("%s\"%s\"", i ? ", " : "", r.block_names[i]);
        printf("]}\n");
    }
    if (!o.quiet)
        fprintf(stderr, "k3 convert: layer %d, %lld experts (%s -> %s), %d block tensor%s -> %s (%.1f MB, %.2f s)\n",
                (int)o.layer, (long long)r.experts, r.source_format, r.output_format, r.block_count,
                r.block_count == 1 ? "" : "s", o.output, (double)r.bytes_written / 1e6, secs);
    return K3_EXIT_OK;
}
