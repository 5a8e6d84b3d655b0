/* k3 dequant: packed NVFP4 / MXFP4 tensors of a safetensors file (ModelOpt-style names) back to F32 or BF16. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/formats.h"
#include "quant_common.h"
#include "quant_summary.h"

void k3_dequant_help(void) {
    printf("usage: k3 dequant --input IN.safetensors --output OUT.safetensors [--dtype f32|bf16] [--json]\n"
           "                  [--scale-layout linear|swizzled] [--quiet] [--progress-after S]\n\n"
           "The inverse of k3 quant. Every U8 tensor NAME of shape [B..., R, P] that has a NAME_scale companion\n"
           "(F8_E4M3 scales -> nvfp4, which also needs an F32 NAME_scale_2; U8 scales -> mxfp4) is expanded to\n"
           "[B..., R, 2P] in the chosen dtype; NAME_scale and NAME_scale_2 are dropped. The scale layout is the\n"
           "file's " K3_QUANT_META_LAYOUT " metadata (k3 writes it) or --scale-layout; a shape only one layout\n"
           "can have decides it too ([B..., S] = swizzled; [B..., R, 2P/block] with R not a multiple of 128 or\n"
           "2P/block not of 4 = linear); [B..., R, 2P/block] with both multiples fits both layouts and, with\n"
           "neither the metadata nor the option, is an error. The format must agree with " K3_QUANT_META_FORMAT "\n"
           "when present (the k3.quant.* keys are removed from the output; other metadata is kept). NAME_scale_2 may hold one value per matrix or a\n"
           "single shared one. Every other tensor is copied unchanged.\n"
           "Values: nvfp4 x = q * e4m3(scale) * scale_2; mxfp4 x = q * 2^(scale - 127); a BF16 output is the\n"
           "round-to-nearest-even of that fp32 value. A NaN scale code (E4M3 0x7F/0xFF, UE8M0 0xFF), a scale_2\n"
           "that is not finite and positive, or a value that overflows fp32 is an error naming the tensor and\n"
           "element (nothing is written).\n\n"
           "  --input PATH     safetensors file to read\n"
           "  --output PATH    safetensors file to write\n"
           "  --dtype D        f32 (default) or bf16\n"
           "  --scale-layout L linear or swizzled, for a file that does not record its layout\n"
           K3_QUANT_OUTPUT_HELP("dequantized")
           "exit status: 0 success, 1 failure (unreadable or malformed file, inconsistent tensors), 2 usage error\n");
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
    char *sn = k3_quant_suffixed(t->name, "_scale"), *s2n = k3_quant_suffixed(t->name, "_scale_2");
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
        fprintf(stderr, "k3 dequant: %s: its scale dtype %s means %s but the file's " K3_QUANT_META_FORMAT " is '%s'\n",
                t->name, k3_st_dtype_name(q->scale->dtype), fs, meta_fmt);
        return -1;
    }
    const int32_t nb = t->ndim - 2;
    const int64_t blk = q->fmt == K3_FP4_NVFP4 ? K3_NVFP4_BLOCK : K3_MXFP4_BLOCK;
    char shp[200];
    q->batch = k3_quant_elems(t->shape, nb);
    q->rows = t->shape[nb];
    if (t->shape[nb + 1] > INT64_MAX / 2) { /* 2 FP4 values per byte: the column count would not fit int64 */
        fprintf(stderr, "k3 dequant: %s: shape %s: the last dimension %lld (bytes, 2 columns each) is too large: "
                        "its column count overflows int64\n",
                t->name, k3_quant_shape_str(t, shp, sizeof shp), (long long)t->shape[nb + 1]);
        return -1;
    }
    q->cols = t->shape[nb + 1] * 2;
    if (q->batch < 1) {
        fprintf(stderr, "k3 dequant: %s: shape %s: the leading (batch) dimensions %s\n", t->name,
                k3_quant_shape_str(t, shp, sizeof shp),
                q->batch < 0 ? "overflow int64" : "hold no matrix (a dimension is 0)");
        return -1;
    }
    if (q->rows < 1) {
        fprintf(stderr, "k3 dequant: %s: shape %s has 0 rows; a packed %s tensor needs at least one row\n", t->name,
                k3_quant_shape_str(t, shp, sizeof shp), fs);
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
    if (q->layout == K3_SCALE_LINEAR && k3_scale_shape_ambiguous(q->rows, q->cols / blk)) {
        /* a shape both layouts have: only the file (or --scale-layout) may say which */
        if (!meta_layout) {
            fprintf(stderr,
                    "k3 dequant: %s: %s [..., %lld, %lld] has the same shape in the linear and the 128x4-swizzled "
                    "layouts (engines keep swizzled scales in this shape too), and the file does not say which "
                    "(" K3_QUANT_META_LAYOUT ", which k3 writes): give --scale-layout linear|swizzled\n",
                    t->name, s->name, (long long)q->rows, (long long)(q->cols / blk));
            return -1;
        }
        if (!strcmp(meta_layout, "swizzled")) q->layout = K3_SCALE_SWIZZLED;
    }
    const char *ls = q->layout == K3_SCALE_LINEAR ? "linear" : "swizzled";
    if (meta_layout && strcmp(meta_layout, ls)) {
        fprintf(stderr, "k3 dequant: %s: %s's shape is the %s layout but the file's " K3_QUANT_META_LAYOUT " is '%s'\n",
                t->name, s->name, ls, meta_layout);
        return -1;
    }
    if (q->fmt == K3_FP4_NVFP4) {
        if (!q->scale_2 || q->scale_2->dtype != K3_ST_F32) {
            fprintf(stderr, "k3 dequant: %s: nvfp4 needs an F32 %s_scale_2 tensor\n", t->name, t->name);
            return -1;
        }
        int64_t n2 = k3_quant_elems(q->scale_2->shape, q->scale_2->ndim);
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
        int shared = k3_quant_elems(q->scale_2->shape, q->scale_2->ndim) == 1;
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

int k3_dequant_main(int argc, char **argv) {
    const double t_start = k3_cli_now();
    const char *in = NULL, *out = NULL, *dtype = "f32", *opt_layout = NULL;
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
        } else if (!strcmp(a, "--dtype")) {
            if (!(dtype = k3_cli_value(argc, argv, &i, a))) return K3_EXIT_USAGE;
        } else if (!strcmp(a, "--scale-layout")) {
            if (!(opt_layout = k3_cli_value(argc, argv, &i, a))) return K3_EXIT_USAGE;
            if (strcmp(opt_layout, "linear") && strcmp(opt_layout, "swizzled")) {
                fprintf(stderr, "k3 dequant: --scale-layout must be linear or swizzled (got '%s')\n", opt_layout);
                return K3_EXIT_USAGE;
            }
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
    k3_st_file *f = k3_quant_open(in, "dequant");
    if (!f) return K3_EXIT_FAIL;
    int rc = K3_EXIT_FAIL, expanded = 0;
    unsigned seen_fmt = 0, seen_layout = 0; /* bit 0 nvfp4 / linear, bit 1 mxfp4 / swizzled */
    k3_cli_progress pg;
    k3_cli_progress_init(&pg, "k3 dequant", oo.quiet ? -1.0 : oo.progress_after);
    char err[512];
    unsigned char *role = NULL; /* per tensor: K3_QS_CONVERTED = packed FP4, K3_QS_DROPPED = a scale companion */
    k3_st_writer *w = NULL;
    const char *mf = k3_st_metadata_get(f, K3_QUANT_META_FORMAT), *ml = k3_st_metadata_get(f, K3_QUANT_META_LAYOUT);
    if (ml && opt_layout && strcmp(ml, opt_layout)) {
        fprintf(stderr, "k3 dequant: %s: the file's " K3_QUANT_META_LAYOUT " is '%s' but --scale-layout says %s\n", in,
                ml, opt_layout);
        goto done;
    }
    if (!ml) ml = opt_layout;
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
            if (!k3_quant_copy_tensor(w, t, "dequant")) goto done;
        }
    }
    if (mf && expanded == 0) {
        fprintf(stderr, "k3 dequant: %s says " K3_QUANT_META_FORMAT "=%s but holds no NAME + NAME_scale pair\n", in,
                mf);
        goto done;
    }
    k3_cli_progress_step(&pg, "writing the output file");
    if (!k3_quant_save(w, out, "dequant")) goto done;
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
