/* k3 quant / k3 dequant: NVFP4 and MXFP4 conversion of safetensors files (ModelOpt-style tensor names). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "quant_summary.h"
/* internals: the file format and the codecs (the checkpoint reader will give these a public call) */
#include "core/formats.h"
#include "io/safetensors.h"

#define META_FORMAT "k3.quant.format"
#define META_LAYOUT "k3.quant.scale_layout"
#define MAX_NAMED 256

/* The options both commands share, and their help (KEY: the JSON key of the converted tensors' names). */
typedef struct out_opts {
    int json, quiet;
    float progress_after;
} out_opts;
#define OUTPUT_OPTIONS_HELP(KEY)                                                                                   \
    "  --json                one JSON object on stdout when done: command, input, output, format, scale_layout,\n" \
    "                        (dequant: dtype), tensors_in, " KEY "_count and " KEY " (names), copied_count and\n"   \
    "                        copied (dequant: dropped_count, dropped: the scale tensors), tensors_out, bytes_in and\n" \
    "                        bytes_out (file sizes), seconds; nothing else goes to stdout, messages to stderr\n"    \
    "  --quiet               no progress lines and no closing summary line on stderr (notes and errors stay)\n"  \
    "  --progress-after S    progress lines on stderr ('tensor I of N: NAME', at most two a second) start once\n" \
    "                        the command has run S seconds (default 1; 0: a line for every tensor)\n\n"

/* Parses --json, --quiet and --progress-after at argv[*i]: 1 when it was one (advancing *i), 0 when not, -1 on
   a usage error (printed). */
static int out_option(int argc, char **argv, int *i, out_opts *o) {
    const char *a = argv[*i];
    if (!strcmp(a, "--json")) {
        o->json = 1;
        return 1;
    }
    if (!strcmp(a, "--quiet")) {
        o->quiet = 1;
        return 1;
    }
    if (strcmp(a, "--progress-after")) return 0;
    const char *v = k3_cli_value(argc, argv, i, a);
    if (!v || !k3_cli_parse_f32(v, a, &o->progress_after)) return -1;
    if (!(o->progress_after >= 0.0f)) {
        fprintf(stderr, "k3: --progress-after must be >= 0 seconds (got '%s')\n", v);
        return -1;
    }
    return 1;
}

static void quant_help(void) {
    printf(
        "usage: k3 quant nvfp4|mxfp4 --input IN.safetensors --output OUT.safetensors\n"
        "                [--tensor NAME ...] [--scale-layout linear|swizzled] [--json] [--quiet]\n"
        "                [--progress-after S]\n\n"
        "Quantizes every BF16, F16 or F32 tensor of rank >= 2 (or only the ones named with --tensor, which may be\n"
        "repeated) to packed FP4. A tensor of shape [B..., R, C] is treated as prod(B) matrices of [R, C] (leading\n"
        "dimensions are a batch, e.g. experts); C must be a multiple of the block size (16 for nvfp4, 32 for\n"
        "mxfp4). Unnamed tensors whose C is not are kept unchanged with a note on stderr; a named tensor that is\n"
        "missing or cannot be quantized is an error. Every other tensor is copied unchanged.\n\n"
        "Output tensors for an input tensor NAME (ModelOpt naming):\n"
        "  NAME          U8 [B..., R, C/2]   E2M1 codes, element 2j in the low nibble, 2j+1 in the high nibble\n"
        "  NAME_scale    block scales: F8_E4M3 (nvfp4) or U8 UE8M0 exponents (mxfp4)\n"
        "                  linear:   [B..., R, C/16 or C/32], scale (r, b) at r * (C/block) + b\n"
        "                  swizzled: [B..., S] flat bytes per matrix in the CUTLASS/FlashInfer 128x4 layout\n"
        "                            (rows padded to 128, scale columns to 4, padding bytes 0); S includes padding\n"
        "  NAME_scale_2  F32 [B...] (a scalar for a 2-D tensor): nvfp4 only, 1/gs per matrix (weight_scale_2)\n\n"
        "Rules: nvfp4: gs = 2688 / amax(matrix) (1 for an all-zero matrix), block scale sf = e4m3(gs*amax/6),\n"
        "q = e2m1(x*gs/sf); dequant x = q * sf * scale_2. mxfp4 (OCP MX): scale 2^(floor(log2(amax)) - 2) stored\n"
        "as the biased exponent byte (clamped to 0..254), q = e2m1(x / scale). Zero blocks get scale 0 and zero\n"
        "codes. Rounding is to nearest even everywhere; NaN or Inf in an input tensor is an error.\n"
        "The format and layout are recorded in __metadata__ (" META_FORMAT ", " META_LAYOUT ") for k3 dequant;\n"
        "existing metadata is kept.\n\n"
        "  --input PATH          safetensors file to read\n"
        "  --output PATH         safetensors file to write (may be the input: it is read whole first, and the\n"
        "                        output goes to a temporary file renamed over PATH only once it is complete)\n"
        "  --tensor NAME         quantize only this tensor (repeatable)\n"
        "  --scale-layout L      linear (default) or swizzled\n"
        OUTPUT_OPTIONS_HELP("quantized")
        "exit status: 0 success, 1 failure (unreadable or malformed file, bad tensor), 2 usage error\n");
}

static void dequant_help(void) {
    printf("usage: k3 dequant --input IN.safetensors --output OUT.safetensors [--dtype f32|bf16] [--json]\n"
           "                  [--quiet] [--progress-after S]\n\n"
           "The inverse of k3 quant. Every U8 tensor NAME of shape [B..., R, P] that has a NAME_scale companion\n"
           "(F8_E4M3 scales -> nvfp4, which also needs an F32 NAME_scale_2; U8 scales -> mxfp4) is expanded to\n"
           "[B..., R, 2P] in the chosen dtype; NAME_scale and NAME_scale_2 are dropped. The scale layout follows\n"
           "from NAME_scale's shape ([B..., R, 2P/block] = linear, [B..., S] = swizzled) and must agree with the\n"
           "file's " META_FORMAT " / " META_LAYOUT " metadata when present (those keys are\n"
           "removed from the output; other metadata is kept). NAME_scale_2 may hold one value per matrix or a\n"
           "single shared one. Every other tensor is copied unchanged.\n"
           "Values: nvfp4 x = q * e4m3(scale) * scale_2; mxfp4 x = q * 2^(scale - 127); a BF16 output is the\n"
           "round-to-nearest-even of that fp32 value. A NaN scale code (E4M3 0x7F/0xFF, UE8M0 0xFF), a scale_2\n"
           "that is not finite and positive, or a value that overflows fp32 is an error naming the tensor and\n"
           "element (nothing is written).\n\n"
           "  --input PATH     safetensors file to read\n"
           "  --output PATH    safetensors file to write\n"
           "  --dtype D        f32 (default) or bf16\n"
           OUTPUT_OPTIONS_HELP("dequantized")
           "exit status: 0 success, 1 failure (unreadable or malformed file, inconsistent tensors), 2 usage error\n");
}

/* The product of d[0..n), or -1 when it overflows int64 (possible when another dimension is 0, so the reader's
   byte-size check passed). */
static int64_t prod(const int64_t *d, int32_t n) {
    int64_t p = 1;
    for (int32_t i = 0; i < n; i++) {
        if (d[i] < 0 || (d[i] && p > INT64_MAX / d[i])) return -1;
        p *= d[i];
    }
    return p;
}

/* "[2, 64]" */
static const char *shape_str(const k3_st_tensor *t, char *buf, size_t n) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int32_t i = 0; i < t->ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
    return buf;
}

/* A NaN code among the block scales (e4m3: 0x7F / 0xFF; ue8m0: 0xFF) or a non-finite or non-positive scale_2:
   each would turn whole blocks of the output into NaN, so it is refused with the tensor and element named. */
static int scales_finite(const k3_st_tensor *scale, const k3_st_tensor *scale_2, int nvfp4) {
    const uint8_t *c = (const uint8_t *)scale->data;
    for (size_t i = 0; i < scale->nbytes; i++)
        if ((nvfp4 && (c[i] & 0x7Fu) == 0x7Fu) || (!nvfp4 && c[i] == 0xFFu)) {
            fprintf(stderr, "k3 dequant: %s: element %zu is 0x%02X, a NaN %s code\n", scale->name, i, c[i],
                    nvfp4 ? "E4M3" : "UE8M0");
            return 0;
        }
    if (scale_2) {
        const float *v = (const float *)scale_2->data;
        for (size_t i = 0; i < scale_2->nbytes / sizeof(float); i++)
            if (!isfinite(v[i]) || !(v[i] > 0.0f)) {
                fprintf(stderr, "k3 dequant: %s: element %zu is %g (a scale_2 must be finite and positive)\n",
                        scale_2->name, i, (double)v[i]);
                return 0;
            }
    }
    return 1;
}

static int is_float_dtype(k3_st_dtype t) { return t == K3_ST_BF16 || t == K3_ST_F16 || t == K3_ST_F32; }

/* Why tensor t cannot be quantized with block size blk, or NULL when it can. */
static const char *unquantizable(const k3_st_tensor *t, int64_t blk, char *why, size_t why_size) {
    if (!is_float_dtype(t->dtype)) {
        snprintf(why, why_size, "dtype %s is not BF16, F16 or F32", k3_st_dtype_name(t->dtype));
        return why;
    }
    if (t->ndim < 2) {
        snprintf(why, why_size, "rank %d is below 2", (int)t->ndim);
        return why;
    }
    int64_t cols = t->shape[t->ndim - 1];
    if (cols == 0 || cols % blk != 0 || prod(t->shape, t->ndim) <= 0) {
        snprintf(why, why_size, "last dimension %lld is not a positive multiple of %lld (or the tensor is empty)",
                 (long long)cols, (long long)blk);
        return why;
    }
    return NULL;
}

/* The tensor's values as fp32 (*owned set when a conversion buffer was allocated). */
static const float *as_f32(const k3_st_tensor *t, int64_t n, float **owned) {
    *owned = NULL;
    if (t->dtype == K3_ST_F32) return (const float *)t->data;
    float *buf = malloc((size_t)n * sizeof *buf);
    if (!buf) return NULL;
    const uint16_t *h = (const uint16_t *)t->data;
    if (t->dtype == K3_ST_BF16)
        for (int64_t i = 0; i < n; i++) buf[i] = k3_bf16_bits_to_f32(h[i]);
    else
        for (int64_t i = 0; i < n; i++) buf[i] = k3_f16_bits_to_f32(h[i]);
    *owned = buf;
    return buf;
}

/* Appends "_scale" / "_scale_2" to name. */
static char *suffixed(const char *name, const char *suffix) {
    size_t a = strlen(name), b = strlen(suffix);
    char *s = malloc(a + b + 1);
    if (s) {
        memcpy(s, name, a);
        memcpy(s + a, suffix, b + 1);
    }
    return s;
}

static int copy_tensor(k3_st_writer *w, const k3_st_tensor *t, const char *cmd) {
    char err[512];
    if (k3_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, err, sizeof err) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 %s: %s\n", cmd, err);
        return 0;
    }
    return 1;
}

/* Quantizes tensor t into NAME, NAME_scale (and NAME_scale_2) of the writer. */
static int quantize_tensor(k3_st_writer *w, const k3_st_tensor *t, k3_fp4_format fmt, k3_scale_layout layout) {
    const int64_t blk = fmt == K3_FP4_NVFP4 ? K3_NVFP4_BLOCK : K3_MXFP4_BLOCK;
    const int32_t nb = t->ndim - 2;
    const int64_t rows = t->shape[nb], cols = t->shape[nb + 1], batch = prod(t->shape, nb);
    const int64_t n = batch * rows * cols;
    int ok = 0;
    char err[512];
    size_t sbytes = 0;
    float *owned = NULL, *gsi = NULL;
    uint8_t *packed = NULL, *scales = NULL;
    char *sname = suffixed(t->name, "_scale"), *s2name = suffixed(t->name, "_scale_2");
    if (k3_fp4_scale_bytes(fmt, layout, rows, cols, &sbytes) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 quant: %s: shape [%lld, %lld] is too large\n", t->name, (long long)rows,
                (long long)cols);
        goto out;
    }
    const float *x = as_f32(t, n, &owned);
    packed = malloc((size_t)(n / 2));
    scales = malloc(sbytes * (size_t)batch);
    gsi = malloc((size_t)batch * sizeof *gsi);
    if (!x || !packed || !scales || !gsi || !sname || !s2name) {
        fprintf(stderr, "k3 quant: %s: out of memory\n", t->name);
        goto out;
    }
    k3_status st = k3_fp4_quantize(fmt, layout, batch, rows, cols, x, packed, scales,
                                   fmt == K3_FP4_NVFP4 ? gsi : NULL);
    if (st != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 quant: %s: cannot quantize (%s: does it contain NaN or Inf?)\n", t->name,
                k3_status_string(st));
        goto out;
    }
    int64_t shape[K3_ST_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[nb + 1] = cols / 2;
    if (k3_st_writer_add(w, t->name, K3_ST_U8, t->ndim, shape, packed, err, sizeof err) != K3_STATUS_SUCCESS)
        goto werr;
    int32_t sdim = t->ndim;
    if (layout == K3_SCALE_LINEAR) {
        shape[nb + 1] = cols / blk;
    } else {
        shape[nb] = (int64_t)sbytes;
        sdim = t->ndim - 1;
    }
    if (k3_st_writer_add(w, sname, fmt == K3_FP4_NVFP4 ? K3_ST_F8_E4M3 : K3_ST_U8, sdim, shape, scales, err,
                         sizeof err) != K3_STATUS_SUCCESS)
        goto werr;
    if (fmt == K3_FP4_NVFP4 &&
        k3_st_writer_add(w, s2name, K3_ST_F32, nb, t->shape, gsi, err, sizeof err) != K3_STATUS_SUCCESS)
        goto werr;
    ok = 1;
    goto out;
werr:
    fprintf(stderr, "k3 quant: %s\n", err);
out:
    free(owned);
    free(packed);
    free(scales);
    free(gsi);
    free(sname);
    free(s2name);
    return ok;
}

static int save(k3_st_writer *w, const char *path, const char *cmd) {
    char err[512];
    if (k3_st_writer_save(w, path, err, sizeof err) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 %s: %s\n", cmd, err);
        return 0;
    }
    return 1;
}

static k3_st_file *open_input(const char *path, const char *cmd) {
    char err[512];
    k3_st_file *f = NULL;
    if (k3_st_open(path, &f, err, sizeof err) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 %s: %s\n", cmd, err);
        return NULL;
    }
    return f;
}

static int quant_main(int argc, char **argv) {
    const double t_start = k3_cli_now();
    const char *fmt_s = NULL, *in = NULL, *out = NULL, *layout_s = "linear";
    const char *named[MAX_NAMED];
    int n_named = 0;
    out_opts oo = {0, 0, 1.0f};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int oc = out_option(argc, argv, &i, &oo);
        if (oc < 0) return K3_EXIT_USAGE;
        if (oc > 0) continue;
        if (!strcmp(a, "--input")) {
            if (!(in = k3_cli_value(argc, argv, &i, a))) return K3_EXIT_USAGE;
        } else if (!strcmp(a, "--output")) {
            if (!(out = k3_cli_value(argc, argv, &i, a))) return K3_EXIT_USAGE;
        } else if (!strcmp(a, "--scale-layout")) {
            if (!(layout_s = k3_cli_value(argc, argv, &i, a))) return K3_EXIT_USAGE;
        } else if (!strcmp(a, "--tensor")) {
            const char *v = k3_cli_value(argc, argv, &i, a);
            if (!v) return K3_EXIT_USAGE;
            if (n_named >= MAX_NAMED) {
                fprintf(stderr, "k3 quant: at most %d --tensor options\n", MAX_NAMED);
                return K3_EXIT_USAGE;
            }
            named[n_named++] = v;
        } else if (a[0] == '-') {
            fprintf(stderr, "k3 quant: unknown option '%s' (see k3 quant --help)\n", a);
            return K3_EXIT_USAGE;
        } else if (!fmt_s) {
            fmt_s = a;
        } else {
            fprintf(stderr, "k3 quant: unexpected argument '%s' (see k3 quant --help)\n", a);
            return K3_EXIT_USAGE;
        }
    }
    if (!fmt_s || (strcmp(fmt_s, "nvfp4") && strcmp(fmt_s, "mxfp4"))) {
        fprintf(stderr, "k3 quant: the first argument must be nvfp4 or mxfp4%s%s%s (see k3 quant --help)\n",
                fmt_s ? " (got '" : "", fmt_s ? fmt_s : "", fmt_s ? "')" : "");
        return K3_EXIT_USAGE;
    }
    if (!in || !out) {
        fprintf(stderr, "k3 quant: --input and --output are required (see k3 quant --help)\n");
        return K3_EXIT_USAGE;
    }
    k3_scale_layout layout;
    if (!strcmp(layout_s, "linear")) layout = K3_SCALE_LINEAR;
    else if (!strcmp(layout_s, "swizzled")) layout = K3_SCALE_SWIZZLED;
    else {
        fprintf(stderr, "k3 quant: --scale-layout must be linear or swizzled (got '%s')\n", layout_s);
        return K3_EXIT_USAGE;
    }
    const k3_fp4_format fmt = !strcmp(fmt_s, "nvfp4") ? K3_FP4_NVFP4 : K3_FP4_MXFP4;
    const int64_t blk = fmt == K3_FP4_NVFP4 ? K3_NVFP4_BLOCK : K3_MXFP4_BLOCK;

    const int64_t bytes_in = k3_quant_file_bytes(in); /* before the output may replace it */
    k3_st_file *f = open_input(in, "quant");
    if (!f) return K3_EXIT_FAIL;
    int rc = K3_EXIT_FAIL;
    k3_st_writer *w = NULL;
    char why[160], err[512];
    unsigned char *fate = calloc((size_t)(k3_st_count(f) ? k3_st_count(f) : 1), 1);
    k3_cli_progress pg;
    k3_cli_progress_init(&pg, "k3 quant", oo.quiet ? -1.0 : oo.progress_after);
    if (!fate) {
        fprintf(stderr, "k3 quant: out of memory\n");
        goto done;
    }
    for (int k = 0; k < n_named; k++) {
        const k3_st_tensor *t = k3_st_find(f, named[k]);
        if (!t) {
            fprintf(stderr, "k3 quant: --tensor %s: no such tensor in %s\n", named[k], in);
            goto done;
        }
        if (unquantizable(t, blk, why, sizeof why)) {
            fprintf(stderr, "k3 quant: --tensor %s: cannot quantize to %s: %s\n", named[k], fmt_s, why);
            goto done;
        }
    }
    if (k3_st_writer_create(&w) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 quant: out of memory\n");
        goto done;
    }
    for (int32_t i = 0; i < k3_st_metadata_count(f); i++) {
        const char *key, *val;
        k3_st_metadata_at(f, i, &key, &val);
        if (k3_st_writer_set_metadata(w, key, val, err, sizeof err) != K3_STATUS_SUCCESS) goto werr;
    }
    if (k3_st_writer_set_metadata(w, META_FORMAT, fmt_s, err, sizeof err) != K3_STATUS_SUCCESS ||
        k3_st_writer_set_metadata(w, META_LAYOUT, layout_s, err, sizeof err) != K3_STATUS_SUCCESS)
        goto werr;
    int quantized = 0;
    for (int32_t i = 0; i < k3_st_count(f); i++) {
        const k3_st_tensor *t = k3_st_at(f, i);
        k3_cli_progress_item(&pg, i + 1, k3_st_count(f), t->name);
        int want = 0;
        if (n_named) {
            for (int k = 0; k < n_named; k++) want |= k3_st_find(f, named[k]) == t; /* O(1) per name */
        } else if (is_float_dtype(t->dtype) && t->ndim >= 2) {
            want = 1;
            if (unquantizable(t, blk, why, sizeof why)) {
                fprintf(stderr, "k3 quant: note: keeping %s unquantized: %s\n", t->name, why);
                want = 0;
            }
        }
        if (!want) {
            if (!copy_tensor(w, t, "quant")) goto done;
            continue;
        }
        /* refuse to shadow an existing tensor with a companion name */
        const char *sfx[2] = {"_scale", "_scale_2"};
        for (int k = 0; k < (fmt == K3_FP4_NVFP4 ? 2 : 1); k++) {
            char *cn = suffixed(t->name, sfx[k]);
            int clash = cn && k3_st_find(f, cn) != NULL;
            if (clash) fprintf(stderr, "k3 quant: %s: the input already has a tensor named %s\n", t->name, cn);
            free(cn);
            if (clash) goto done;
        }
        if (!quantize_tensor(w, t, fmt, layout)) goto done;
        fate[i] = K3_QS_CONVERTED;
        quantized++;
    }
    k3_cli_progress_step(&pg, "writing the output file");
    if (!save(w, out, "quant")) goto done;
    if (!oo.quiet)
        fprintf(stderr, "k3 quant: %d tensor%s quantized to %s (%s scales), %d copied -> %s\n", quantized,
                quantized == 1 ? "" : "s", fmt_s, layout_s, (int)k3_st_count(f) - quantized, out);
    if (oo.json) {
        k3_quant_summary qs = {"quant", "quantized", in, out, fmt_s, layout_s, NULL, f, fate, 0, bytes_in, 0, 0.0};
        qs.tensors_out = (int64_t)k3_st_count(f) + (int64_t)quantized * (fmt == K3_FP4_NVFP4 ? 2 : 1);
        qs.bytes_out = k3_quant_file_bytes(out);
        qs.seconds = k3_cli_now() - t_start;
        k3_quant_summary_print(&qs);
    }
    rc = K3_EXIT_OK;
    goto done;
werr:
    fprintf(stderr, "k3 quant: %s\n", err);
done:
    free(fate);
    k3_st_writer_destroy(w);
    k3_st_close(f);
    return rc;
}

/* How a quantized tensor of the input is laid out (the dequant side). */
typedef struct qinfo {
    k3_fp4_format fmt;
    k3_scale_layout layout;
    int64_t batch, rows, cols;
    const k3_st_tensor *scale, *scale_2;
} qinfo;

/* Decides whether t is a quantized tensor; returns 1 (info filled), 0 (not one), -1 (inconsistent: message). */
static int quantized_info(const k3_st_file *f, const k3_st_tensor *t, const char *meta_fmt,
                          const char *meta_layout, qinfo *q) {
    if (t->dtype != K3_ST_U8 || t->ndim < 2) return 0;
    char *sn = suffixed(t->name, "_scale"), *s2n = suffixed(t->name, "_scale_2");
    if (!sn || !s2n) {
        free(sn);
        free(s2n);
        fprintf(stderr, "k3 dequant: out of memory\n");
        return -1;
    }
    q->scale = k3_st_find(f, sn);
    q->scale_2 = k3_st_find(f, s2n);
    free(sn);
    free(s2n);
    if (!q->scale) return 0;
    if (q->scale->dtype != K3_ST_F8_E4M3 && q->scale->dtype != K3_ST_U8) return 0;
    q->fmt = q->scale->dtype == K3_ST_F8_E4M3 ? K3_FP4_NVFP4 : K3_FP4_MXFP4;
    const char *fs = q->fmt == K3_FP4_NVFP4 ? "nvfp4" : "mxfp4";
    if (meta_fmt && strcmp(meta_fmt, fs)) {
        fprintf(stderr, "k3 dequant: %s: its scale dtype %s means %s but the file's " META_FORMAT " is '%s'\n",
                t->name, k3_st_dtype_name(q->scale->dtype), fs, meta_fmt);
        return -1;
    }
    const int32_t nb = t->ndim - 2;
    const int64_t blk = q->fmt == K3_FP4_NVFP4 ? K3_NVFP4_BLOCK : K3_MXFP4_BLOCK;
    char shp[200];
    q->batch = prod(t->shape, nb);
    q->rows = t->shape[nb];
    if (t->shape[nb + 1] > INT64_MAX / 2) { /* 2 FP4 values per byte: the column count would not fit int64 */
        fprintf(stderr, "k3 dequant: %s: shape %s: the last dimension %lld (bytes, 2 columns each) is too large: "
                        "its column count overflows int64\n",
                t->name, shape_str(t, shp, sizeof shp), (long long)t->shape[nb + 1]);
        return -1;
    }
    q->cols = t->shape[nb + 1] * 2;
    if (q->batch < 1) {
        fprintf(stderr, "k3 dequant: %s: shape %s: the leading (batch) dimensions %s\n", t->name,
                shape_str(t, shp, sizeof shp), q->batch < 0 ? "overflow int64" : "hold no matrix (a dimension is 0)");
        return -1;
    }
    if (q->rows < 1) {
        fprintf(stderr, "k3 dequant: %s: shape %s has 0 rows; a packed %s tensor needs at least one row\n", t->name,
                shape_str(t, shp, sizeof shp), fs);
        return -1;
    }
    size_t lin = 0, swz = 0;
    if (k3_fp4_scale_bytes(q->fmt, K3_SCALE_LINEAR, q->rows, q->cols, &lin) != K3_STATUS_SUCCESS ||
        k3_fp4_scale_bytes(q->fmt, K3_SCALE_SWIZZLED, q->rows, q->cols, &swz) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 dequant: %s: shape cannot hold %s data ([..., %lld, %lld] packed; columns must be a "
                        "multiple of %lld)\n",
                t->name, fs, (long long)q->rows, (long long)(q->cols / 2), (long long)blk);
        return -1;
    }
    const k3_st_tensor *s = q->scale;
    int lead_ok = s->ndim >= nb && memcmp(s->shape, t->shape, (size_t)nb * sizeof(int64_t)) == 0;
    if (lead_ok && s->ndim == t->ndim && s->shape[nb] == q->rows && s->shape[nb + 1] == q->cols / blk)
        q->layout = K3_SCALE_LINEAR;
    else if (lead_ok && s->ndim == nb + 1 && s->shape[nb] == (int64_t)swz)
        q->layout = K3_SCALE_SWIZZLED;
    else {
        fprintf(stderr, "k3 dequant: %s: %s's shape fits neither the linear [..., %lld, %lld] nor the swizzled "
                        "[..., %zu] %s scale layout\n",
                t->name, s->name, (long long)q->rows, (long long)(q->cols / blk), swz, fs);
        return -1;
    }
    (void)lin;
    const char *ls = q->layout == K3_SCALE_LINEAR ? "linear" : "swizzled";
    if (meta_layout && strcmp(meta_layout, ls)) {
        fprintf(stderr, "k3 dequant: %s: %s's shape is the %s layout but the file's " META_LAYOUT " is '%s'\n",
                t->name, s->name, ls, meta_layout);
        return -1;
    }
    if (q->fmt == K3_FP4_NVFP4) {
        if (!q->scale_2 || q->scale_2->dtype != K3_ST_F32) {
            fprintf(stderr, "k3 dequant: %s: nvfp4 needs an F32 %s_scale_2 tensor\n", t->name, t->name);
            return -1;
        }
        int64_t n2 = prod(q->scale_2->shape, q->scale_2->ndim);
        if (n2 != 1 && n2 != q->batch) {
            fprintf(stderr, "k3 dequant: %s: %s has %lld values; want 1 or %lld (one per matrix)\n", t->name,
                    q->scale_2->name, (long long)n2, (long long)q->batch);
            return -1;
        }
    } else {
        q->scale_2 = NULL;
    }
    if (!scales_finite(q->scale, q->scale_2, q->fmt == K3_FP4_NVFP4)) return -1;
    return 1;
}

static int dequantize_tensor(k3_st_writer *w, const k3_st_tensor *t, const qinfo *q, int bf16) {
    /* the packed tensor holds n / 2 bytes, so n cannot overflow */
    const int64_t n = q->batch * q->rows * q->cols;
    int ok = 0;
    char err[512];
    float *x = malloc((size_t)n * sizeof *x), *gsi = NULL;
    uint16_t *h = bf16 ? malloc((size_t)n * sizeof *h) : NULL;
    if (q->fmt == K3_FP4_NVFP4) gsi = malloc((size_t)q->batch * sizeof *gsi);
    if (!x || (bf16 && !h) || (q->fmt == K3_FP4_NVFP4 && !gsi)) {
        fprintf(stderr, "k3 dequant: %s: out of memory\n", t->name);
        goto out;
    }
    if (gsi) {
        const float *s2 = (const float *)q->scale_2->data;
        int shared = prod(q->scale_2->shape, q->scale_2->ndim) == 1;
        for (int64_t b = 0; b < q->batch; b++) gsi[b] = s2[shared ? 0 : b];
    }
    k3_status st = k3_fp4_dequantize(q->fmt, q->layout, q->batch, q->rows, q->cols, (const uint8_t *)t->data,
                                     (const uint8_t *)q->scale->data, gsi, x);
    if (st != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 dequant: %s: %s\n", t->name, k3_status_string(st));
        goto out;
    }
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) { /* finite codes and scales can still overflow fp32 (a huge scale_2) */
            fprintf(stderr, "k3 dequant: %s: element %lld dequantizes to %g (scale x scale_2 overflows fp32)\n",
                    t->name, (long long)i, (double)x[i]);
            goto out;
        }
    int64_t shape[K3_ST_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[t->ndim - 1] = q->cols;
    if (bf16)
        for (int64_t i = 0; i < n; i++) h[i] = k3_f32_to_bf16_bits(x[i]);
    if (k3_st_writer_add(w, t->name, bf16 ? K3_ST_BF16 : K3_ST_F32, t->ndim, shape, bf16 ? (void *)h : (void *)x,
                         err, sizeof err) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 dequant: %s\n", err);
        goto out;
    }
    ok = 1;
out:
    free(x);
    free(h);
    free(gsi);
    return ok;
}

static int dequant_main(int argc, char **argv) {
    const double t_start = k3_cli_now();
    const char *in = NULL, *out = NULL, *dtype = "f32";
    out_opts oo = {0, 0, 1.0f};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int oc = out_option(argc, argv, &i, &oo);
        if (oc < 0) return K3_EXIT_USAGE;
        if (oc > 0) continue;
        if (!strcmp(a, "--input")) {
            if (!(in = k3_cli_value(argc, argv, &i, a))) return K3_EXIT_USAGE;
        } else if (!strcmp(a, "--output")) {
            if (!(out = k3_cli_value(argc, argv, &i, a))) return K3_EXIT_USAGE;
        } else if (!strcmp(a, "--dtype")) {
            if (!(dtype = k3_cli_value(argc, argv, &i, a))) return K3_EXIT_USAGE;
        } else {
            fprintf(stderr, "k3 dequant: unexpected argument '%s' (see k3 dequant --help)\n", a);
            return K3_EXIT_USAGE;
        }
    }
    if (!in || !out) {
        fprintf(stderr, "k3 dequant: --input and --output are required (see k3 dequant --help)\n");
        return K3_EXIT_USAGE;
    }
    if (strcmp(dtype, "f32") && strcmp(dtype, "bf16")) {
        fprintf(stderr, "k3 dequant: --dtype must be f32 or bf16 (got '%s')\n", dtype);
        return K3_EXIT_USAGE;
    }
    const int64_t bytes_in = k3_quant_file_bytes(in); /* before the output may replace it */
    k3_st_file *f = open_input(in, "dequant");
    if (!f) return K3_EXIT_FAIL;
    int rc = K3_EXIT_FAIL, expanded = 0;
    unsigned seen_fmt = 0, seen_layout = 0; /* bit 0 nvfp4 / linear, bit 1 mxfp4 / swizzled */
    k3_cli_progress pg;
    k3_cli_progress_init(&pg, "k3 dequant", oo.quiet ? -1.0 : oo.progress_after);
    char err[512];
    unsigned char *role = NULL; /* per tensor: K3_QS_CONVERTED = packed FP4, K3_QS_DROPPED = a scale companion */
    k3_st_writer *w = NULL;
    const char *mf = k3_st_metadata_get(f, META_FORMAT), *ml = k3_st_metadata_get(f, META_LAYOUT);
    if (k3_st_writer_create(&w) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 dequant: out of memory\n");
        goto done;
    }
    for (int32_t i = 0; i < k3_st_metadata_count(f); i++) {
        const char *key, *val;
        k3_st_metadata_at(f, i, &key, &val);
        if (!strncmp(key, "k3.quant.", 9)) continue;
        if (k3_st_writer_set_metadata(w, key, val, err, sizeof err) != K3_STATUS_SUCCESS) {
            fprintf(stderr, "k3 dequant: %s\n", err);
            goto done;
        }
    }
    /* first find every quantized tensor and mark its companions, then write in file order */
    const int32_t count = k3_st_count(f);
    const k3_st_tensor *base = k3_st_at(f, 0); /* k3_st_at indexes one array */
    role = calloc((size_t)(count ? count : 1), 1);
    if (!role) {
        fprintf(stderr, "k3 dequant: out of memory\n");
        goto done;
    }
    for (int32_t i = 0; i < count; i++) {
        qinfo q;
        int r = quantized_info(f, k3_st_at(f, i), mf, ml, &q);
        if (r < 0) goto done;
        if (r == 0) continue;
        role[i] |= K3_QS_CONVERTED;
        role[q.scale - base] |= K3_QS_DROPPED;
        if (q.scale_2) role[q.scale_2 - base] |= K3_QS_DROPPED;
    }
    for (int32_t i = 0; i < count; i++) {
        const k3_st_tensor *t = k3_st_at(f, i);
        k3_cli_progress_item(&pg, i + 1, count, t->name);
        if (role[i] == (K3_QS_CONVERTED | K3_QS_DROPPED)) { /* both a quantized tensor and another's scale: ambiguous */
            fprintf(stderr, "k3 dequant: %s is both a packed tensor and a scale of another one\n", t->name);
            goto done;
        }
        if (role[i] == K3_QS_CONVERTED) {
            qinfo q;
            quantized_info(f, t, mf, ml, &q);
            if (!dequantize_tensor(w, t, &q, !strcmp(dtype, "bf16"))) goto done;
            seen_fmt |= q.fmt == K3_FP4_NVFP4 ? 1u : 2u;
            seen_layout |= q.layout == K3_SCALE_LINEAR ? 1u : 2u;
            expanded++;
        } else if (role[i] == K3_QS_COPIED) {
            if (!copy_tensor(w, t, "dequant")) goto done;
        }
    }
    if (mf && expanded == 0) {
        fprintf(stderr, "k3 dequant: %s says " META_FORMAT "=%s but holds no NAME + NAME_scale pair\n", in, mf);
        goto done;
    }
    k3_cli_progress_step(&pg, "writing the output file");
    if (!save(w, out, "dequant")) goto done;
    if (!oo.quiet)
        fprintf(stderr, "k3 dequant: %d tensor%s expanded to %s -> %s\n", expanded, expanded == 1 ? "" : "s", dtype,
                out);
    if (oo.json) {
        static const char *const fmts[4] = {NULL, "nvfp4", "mxfp4", "mixed"};
        static const char *const lays[4] = {NULL, "linear", "swizzled", "mixed"};
        k3_quant_summary qs = {"dequant", "dequantized", in, out, fmts[seen_fmt], lays[seen_layout], dtype, f, role,
                               0, bytes_in, 0, 0.0};
        for (int32_t i = 0; i < count; i++) qs.tensors_out += role[i] != K3_QS_DROPPED;
        qs.bytes_out = k3_quant_file_bytes(out);
        qs.seconds = k3_cli_now() - t_start;
        k3_quant_summary_print(&qs);
    }
    rc = K3_EXIT_OK;
done:
    free(role);
    k3_st_writer_destroy(w);
    k3_st_close(f);
    return rc;
}

int k3_cmd_quant(int argc, char **argv) {
    int de = !strcmp(argv[0], "dequant");
    if (k3_cli_wants_help(argc, argv)) {
        if (de) dequant_help();
        else quant_help();
        return K3_EXIT_OK;
    }
    return de ? dequant_main(argc, argv) : quant_main(argc, argv);
}
