/* k3 quant: NVFP4 and MXFP4 conversion of safetensors files (ModelOpt-style tensor names); k3 dequant is
 * tools/cmd_dequant.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant_common.h"
#include "quant_summary.h"

#define MAX_NAMED 256

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
        "The format and layout are recorded in __metadata__ (" K3_QUANT_META_FORMAT ", " K3_QUANT_META_LAYOUT
        ") for k3 dequant;\nexisting metadata is kept.\n\n"
        "  --input PATH          safetensors file to read\n"
        "  --output PATH         safetensors file to write (may be the input: it is read whole first, and the\n"
        "                        output goes to a temporary file renamed over PATH only once it is complete)\n"
        "  --tensor NAME         quantize only this tensor (repeatable)\n"
        "  --scale-layout L      linear (default) or swizzled\n"
        K3_QUANT_OUTPUT_HELP("quantized")
        "exit status: 0 success, 1 failure (unreadable or malformed file, bad tensor), 2 usage error\n");
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
    if (cols == 0 || cols % blk != 0 || k3_quant_elems(t->shape, t->ndim) <= 0) {
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

/* Quantizes tensor t into NAME, NAME_scale (and NAME_scale_2) of the writer. */
static int quantize_tensor(k3_st_writer *w, const k3_st_tensor *t, k3_fp4_format fmt, k3_scale_layout layout) {
    const int64_t blk = fmt == K3_FP4_NVFP4 ? K3_NVFP4_BLOCK : K3_MXFP4_BLOCK;
    const int32_t nb = t->ndim - 2;
    const int64_t rows = t->shape[nb], cols = t->shape[nb + 1], batch = k3_quant_elems(t->shape, nb);
    const int64_t n = batch * rows * cols;
    int ok = 0;
    char err[512];
    size_t sbytes = 0;
    float *owned = NULL, *gsi = NULL;
    uint8_t *packed = NULL, *scales = NULL;
    char *sname = k3_quant_suffixed(t->name, "_scale"), *s2name = k3_quant_suffixed(t->name, "_scale_2");
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

static int quant_main(int argc, char **argv) {
    const double t_start = k3_cli_now();
    const char *fmt_s = NULL, *in = NULL, *out = NULL, *layout_s = "linear";
    const char *named[MAX_NAMED];
    int n_named = 0;
    k3_quant_opts oo = {0, 0, 1.0f};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int oc = k3_quant_opts_parse(argc, argv, &i, &oo);
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
    k3_st_file *f = k3_quant_open(in, "quant");
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
    if (k3_st_writer_set_metadata(w, K3_QUANT_META_FORMAT, fmt_s, err, sizeof err) != K3_STATUS_SUCCESS ||
        k3_st_writer_set_metadata(w, K3_QUANT_META_LAYOUT, layout_s, err, sizeof err) != K3_STATUS_SUCCESS)
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
            if (!k3_quant_copy_tensor(w, t, "quant")) goto done;
            continue;
        }
        /* refuse to shadow an existing tensor with a companion name */
        const char *sfx[2] = {"_scale", "_scale_2"};
        for (int k = 0; k < (fmt == K3_FP4_NVFP4 ? 2 : 1); k++) {
            char *cn = k3_quant_suffixed(t->name, sfx[k]);
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
    if (!k3_quant_save(w, out, "quant")) goto done;
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

int k3_cmd_quant(int argc, char **argv) {
    int de = !strcmp(argv[0], "dequant");
    if (k3_cli_wants_help(argc, argv)) {
        if (de) k3_dequant_help();
        else quant_help();
        return K3_EXIT_OK;
    }
    return de ? k3_dequant_main(argc, argv) : quant_main(argc, argv);
}
