/* k3 run moe: the routed experts (optionally routed, optionally the whole latent-MoE block) on safetensors files. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_mem.h"
#include "io/safetensors.h"

#define CMD "k3 run moe"

static void run_help(FILE *f) {
    fprintf(f, "usage: k3 run OPERATION [OPTIONS]\n\n"
               "operations:\n"
               "  moe    the Kimi-K3 routed experts (and, when the weights hold them, the router and the latent-MoE\n"
               "         block) on safetensors inputs: k3 run moe --help\n");
}

static void moe_help(void) {
    printf(
        "usage: k3 run moe --weights W.safetensors --input X.safetensors --output Y.safetensors\n"
        "                  [--device cpu|cuda|auto] [--act situ|silu|swigluoai|swigluoai_uninterleave|relu2]\n"
        "                  [--situ-beta B] [--situ-linear-beta LB] [--limit L] [--mode w4a16|w4a4]\n"
        "                  [--top-k K] [--scaling-factor S]\n\n"
        "Defaults: the Kimi-K3 activation (situ, beta 4.0, linear beta 25.0), w4a16, top-k 16, scaling factor 1.0,\n"
        "device cpu. E = experts, L = expert width (the latent width in K3), I = expert intermediate, W = 2I for\n"
        "gated activations and I for relu2, H = model hidden, M = tokens, k = top-k.\n\n"
        "weights (W.safetensors):\n"
        "  NVFP4 experts (the names and layout `k3 quant nvfp4` writes for w13_weight and w2_weight):\n"
        "    w13_weight          U8 [E, W, L/2]        packed E2M1, rows [gate; up] (swigluoai: interleaved)\n"
        "    w13_weight_scale    F8_E4M3 [E, W, L/16]  (linear layout; swizzled 128x4: [E, S] flat bytes)\n"
        "    w13_weight_scale_2  F32 [E] or [E, 2]     1/gs, shared by gate and up, or (gate, up)\n"
        "    w13_input_scale     F32 [E]               --mode w4a4 only (activation gs = 1 / input_scale)\n"
        "    w2_weight           U8 [E, L, I/2]\n"
        "    w2_weight_scale     F8_E4M3 [E, L, I/16]  (or swizzled [E, S])\n"
        "    w2_weight_scale_2   F32 [E]\n"
        "    w2_input_scale      F32 [E]               --mode w4a4 only\n"
        "  MXFP4 experts: as NVFP4 with U8 (UE8M0) scales [E, W, L/32] and [E, L, I/32], no scale_2.\n"
        "  BF16 experts: w13_weight BF16 [E, W, L], w2_weight BF16 [E, L, I].\n"
        "  The format follows from the dtypes: BF16 weights; U8 weights with F8_E4M3 scales = NVFP4, with U8\n"
        "  scales = MXFP4. The scale layout follows from the scale tensors' rank (3 = linear, 2 = swizzled) and must\n"
        "  agree with the k3.quant.format / k3.quant.scale_layout __metadata__ when present.\n"
        "  Optional router:        gate_weight [E, H] BF16 or F32, e_score_correction_bias [E] F32\n"
        "  Optional latent block:  down_proj_weight [L, H], norm_weight [L], up_proj_weight [H, L] (all BF16)\n"
        "                          shared_gate_up_weight [2 Is, H] (relu2: [Is, H]) and shared_down_weight\n"
        "                          [H, Is] (BF16, both or neither; the shared experts use the same --act)\n\n"
        "input (X.safetensors), one of:\n"
        "  hidden_states [M, L] BF16 + topk_ids [M, k] I32 + topk_weights [M, k] F32   the experts alone\n"
        "  hidden_states [M, L] BF16 with gate_weight [E, L] in the weights            router + experts\n"
        "  hidden_states [M, H] BF16 with gate_weight [E, H] and the latent tensors    the whole latent block\n\n"
        "output (Y.safetensors):\n"
        "  output [M, L] (experts) or [M, H] (latent block) BF16; topk_ids [M, k] I32 and topk_weights [M, k] F32\n"
        "  when it routed.\n\n"
        "Math: out = bf16(sum_j w_j W2_e(act(bf16(W13_e x)))), fp32 sums (see docs/run-moe.md). Any tensor with\n"
        "a wrong name, shape or dtype is an error naming the tensor and what was expected.\n\n"
        "exit status: 0 success, 1 failure (bad or inconsistent files, unsupported device), 2 usage error\n");
}

typedef struct run_opts {
    const char *weights, *input, *output, *device;
    const char *act;
    float situ_beta, situ_lb, limit, scaling;
    int has_situ_beta, has_situ_lb, has_limit;
    k3_moe_mode mode;
    int64_t top_k;
    int has_top_k;
} run_opts;

/* "U8 [16, 256, 32]" */
static void fmt_shape(char *buf, size_t n, k3_st_dtype dt, int32_t ndim, const int64_t *shape) {
    size_t o = (size_t)snprintf(buf, n, "%s [", k3_st_dtype_name(dt));
    for (int32_t i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* The tensor `name` of file `label` with exactly this dtype and shape (a dim < 0 matches anything), or NULL after
 * printing what was expected and what was found. */
static const k3_st_tensor *want(const k3_st_file *f, const char *label, const char *name, k3_st_dtype dt, int32_t ndim,
                                const int64_t *shape) {
    const k3_st_tensor *t = k3_st_find(f, name);
    char exp[160], got[160];
    int64_t shown[K3_ST_MAX_DIMS];
    for (int32_t i = 0; i < ndim; i++) shown[i] = shape[i];
    fmt_shape(exp, sizeof exp, dt, ndim, shown);
    if (!t) {
        fprintf(stderr, CMD ": %s: tensor '%s' is missing (expected %s)\n", label, name, exp);
        return NULL;
    }
    int ok = t->dtype == dt && t->ndim == ndim;
    for (int32_t i = 0; ok && i < ndim; i++) ok = shape[i] < 0 || t->shape[i] == shape[i];
    if (!ok) {
        fmt_shape(got, sizeof got, t->dtype, t->ndim, t->shape);
        fprintf(stderr, CMD ": %s: tensor '%s' is %s, expected %s%s\n", label, name, got, exp,
                strstr(exp, "-1") ? " (-1 = any size)" : "");
        return NULL;
    }
    return t;
}

static const char *const weight_names[] = {
    "w13_weight",       "w13_weight_scale",  "w13_weight_scale_2", "w13_input_scale",       "w2_weight",
    "w2_weight_scale",  "w2_weight_scale_2", "w2_input_scale",     "gate_weight",           "e_score_correction_bias",
    "down_proj_weight", "norm_weight",       "up_proj_weight",     "shared_gate_up_weight", "shared_down_weight"};
static const char *const input_names[] = {"hidden_states", "topk_ids", "topk_weights"};

/* Every tensor of f must be one of names[] (a misspelt name is an error, not silently ignored). */
static int only_known(const k3_st_file *f, const char *label, const char *const *names, int n) {
    for (int32_t i = 0; i < k3_st_count(f); i++) {
        const char *nm = k3_st_at(f, i)->name;
        int known = 0;
        for (int j = 0; j < n; j++) known |= !strcmp(nm, names[j]);
        if (!known) {
            fprintf(stderr, CMD ": %s: tensor '%s' is not one k3 run moe reads (see k3 run moe --help)\n", label, nm);
            return 0;
        }
    }
    return 1;
}

static int parse_act(const char *s, k3_act_kind *out) {
    static const struct {
        const char *name;
        k3_act_kind kind;
    } acts[] = {{"situ", K3_ACT_SITU},
                {"silu", K3_ACT_SILU},
                {"swigluoai", K3_ACT_SWIGLUOAI},
                {"swigluoai_uninterleave", K3_ACT_SWIGLUOAI_UNINTERLEAVE},
                {"relu2", K3_ACT_RELU2_NO_MUL}};
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++)
        if (!strcmp(s, acts[i].name)) {
            *out = acts[i].kind;
            return 1;
        }
    return 0;
}

static int parse_opts(int argc, char **argv, run_opts *o) {
    memset(o, 0, sizeof *o);
    o->device = "cpu";
    o->act = "situ";
    o->scaling = 1.0f;
    o->mode = K3_MOE_W4A16;
    o->top_k = 16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, CMD ": unexpected argument '%s' (see k3 run moe --help)\n", a);
            return 0;
        }
        if (!(v = k3_cli_value(argc, argv, &i, a))) return 0;
        if (!strcmp(a, "--weights"))
            o->weights = v;
        else if (!strcmp(a, "--input"))
            o->input = v;
        else if (!strcmp(a, "--output"))
            o->output = v;
        else if (!strcmp(a, "--device")) {
            if (!k3_cli_device_name_ok(v, a)) return 0;
            o->device = v;
        }
        else if (!strcmp(a, "--act"))
            o->act = v;
        else if (!strcmp(a, "--situ-beta")) {
            if (!k3_cli_parse_f32(v, a, &o->situ_beta)) return 0;
            o->has_situ_beta = 1;
        } else if (!strcmp(a, "--situ-linear-beta")) {
            if (!k3_cli_parse_f32(v, a, &o->situ_lb)) return 0;
            o->has_situ_lb = 1;
        } else if (!strcmp(a, "--limit")) {
            if (!k3_cli_parse_f32(v, a, &o->limit)) return 0;
            o->has_limit = 1;
        } else if (!strcmp(a, "--scaling-factor")) {
            if (!k3_cli_parse_f32(v, a, &o->scaling)) return 0;
        } else if (!strcmp(a, "--top-k")) {
            if (!k3_cli_parse_i64(v, a, &o->top_k)) return 0;
            o->has_top_k = 1;
        } else if (!strcmp(a, "--mode")) {
            if (!strcmp(v, "w4a16"))
                o->mode = K3_MOE_W4A16;
            else if (!strcmp(v, "w4a4"))
                o->mode = K3_MOE_W4A4;
            else {
                fprintf(stderr, CMD ": --mode must be w4a16 or w4a4 (got '%s')\n", v);
                return 0;
            }
        } else {
            fprintf(stderr, CMD ": unknown option '%s' (see k3 run moe --help)\n", a);
            return 0;
        }
    }
    if (!o->weights || !o->input || !o->output) {
        fprintf(stderr, CMD ": --weights, --input and --output are required (see k3 run moe --help)\n");
        return 0;
    }
    if (o->top_k < 1 || o->top_k > 32) {
        fprintf(stderr, CMD ": --top-k must be in 1..32 (got %lld)\n", (long long)o->top_k);
        return 0;
    }
    return 1;
}

/* Everything one run reads, resolved from the two files. */
typedef struct run_setup {
    k3_moe_desc md;
    k3_moe_weights mw;
    int32_t e;
    int64_t l, inter, m, width; /* width: the hidden_states row length (L, or H for the latent block) */
    const k3_st_tensor *x, *ids, *wts, *gate, *bias;
    int latent;
    int64_t h, is;
    k3_latent_moe_weights lw;
} run_setup;

static int read_experts(const k3_st_file *wf, run_setup *s, const k3_act_desc *act, k3_moe_mode mode) {
    const char *W = "weights";
    const k3_st_tensor *w13 = k3_st_find(wf, "w13_weight"), *w2 = k3_st_find(wf, "w2_weight");
    if (!w13 || !w2) {
        fprintf(stderr, CMD ": weights: tensor '%s' is missing (expected U8 packed FP4 or BF16 [E, rows, cols])\n",
                w13 ? "w2_weight" : "w13_weight");
        return 0;
    }
    if (w13->ndim != 3 || (w13->dtype != K3_ST_U8 && w13->dtype != K3_ST_BF16) || w13->shape[0] < 1) {
        char got[160];
        fmt_shape(got, sizeof got, w13->dtype, w13->ndim, w13->shape);
        fprintf(stderr, CMD ": weights: tensor 'w13_weight' is %s, expected U8 [E, W, L/2] (FP4) or BF16 [E, W, L]\n",
                got);
        return 0;
    }
    const int fp4 = w13->dtype == K3_ST_U8;
    k3_weight_format fmt = K3_WEIGHT_BF16;
    const k3_st_tensor *s13 = k3_st_find(wf, "w13_weight_scale");
    if (fp4) {
        if (!s13 || (s13->dtype != K3_ST_F8_E4M3 && s13->dtype != K3_ST_U8)) {
            fprintf(stderr,
                    CMD ": weights: w13_weight is U8 (packed FP4), so tensor 'w13_weight_scale' must exist "
                        "as F8_E4M3 (NVFP4) or U8 (MXFP4)%s\n",
                    s13 ? "" : " (it is missing)");
            return 0;
        }
        fmt = s13->dtype == K3_ST_F8_E4M3 ? K3_WEIGHT_NVFP4 : K3_WEIGHT_MXFP4;
    } else if (s13 || k3_st_find(wf, "w2_weight_scale")) {
        fprintf(stderr, CMD ": weights: w13_weight is BF16, so there must be no w13_weight_scale / w2_weight_scale\n");
        return 0;
    }
    const char *meta_fmt = k3_st_metadata_get(wf, "k3.quant.format");
    const char *fmt_s = fmt == K3_WEIGHT_NVFP4 ? "nvfp4" : "mxfp4";
    if (fp4 && meta_fmt && strcmp(meta_fmt, fmt_s)) {
        fprintf(stderr, CMD ": weights: __metadata__ k3.quant.format is '%s' but the scale dtype says %s\n", meta_fmt,
                fmt_s);
        return 0;
    }
    const int32_t e = (int32_t)w13->shape[0];
    const int64_t wfac = act->kind == K3_ACT_RELU2_NO_MUL ? 1 : 2, rows13 = w13->shape[1];
    const int64_t l = fp4 ? 2 * w13->shape[2] : w13->shape[2];
    if (w2->ndim != 3 || w2->dtype != w13->dtype || w2->shape[0] != e || w2->shape[1] != l) {
        int64_t shp[3] = {e, l, -1};
        want(wf, W, "w2_weight", w13->dtype, 3, shp);
        return 0;
    }
    const int64_t inter = fp4 ? 2 * w2->shape[2] : w2->shape[2];
    if (rows13 != wfac * inter) {
        int64_t shp[3] = {e, wfac * inter, fp4 ? l / 2 : l};
        fprintf(stderr, CMD ": weights: w13_weight has %lld rows but --act %s with w2_weight's I = %lld needs %lld\n",
                (long long)rows13, k3_act_name(act->kind), (long long)inter, (long long)(wfac * inter));
        want(wf, W, "w13_weight", w13->dtype, 3, shp);
        return 0;
    }
    k3_moe_desc *d = &s->md;
    k3_moe_desc_init(d);
    d->num_experts = e;
    d->hidden = l;
    d->inter = inter;
    d->format = fmt;
    d->mode = mode;
    d->act = *act;
    d->w13_separate_scale_2 = 0;
    s->e = e;
    s->l = l;
    s->inter = inter;
    memset(&s->mw, 0, sizeof s->mw);
    s->mw.w13 = w13->data;
    s->mw.w2 = w2->data;
    if (fp4) {
        const int64_t bs = fmt == K3_WEIGHT_NVFP4 ? 16 : 32;
        const k3_st_dtype sdt = s13->dtype;
        if (l % bs || inter % bs) {
            fprintf(stderr, CMD ": weights: L = %lld and I = %lld must be multiples of the %s block size %lld\n",
                    (long long)l, (long long)inter, fmt_s, (long long)bs);
            return 0;
        }
        const k3_scale_layout lay = s13->ndim == 2 ? K3_SCALE_SWIZZLED : K3_SCALE_LINEAR;
        const char *meta_lay = k3_st_metadata_get(wf, "k3.quant.scale_layout");
        const char *lay_s = lay == K3_SCALE_LINEAR ? "linear" : "swizzled";
        if (meta_lay && strcmp(meta_lay, lay_s)) {
            fprintf(stderr,
                    CMD ": weights: __metadata__ k3.quant.scale_layout is '%s' but w13_weight_scale's "
                        "shape says %s\n",
                    meta_lay, lay_s);
            return 0;
        }
        d->scale_layout = lay;
        const k3_fp4_format ff = fmt == K3_WEIGHT_NVFP4 ? K3_FP4_NVFP4 : K3_FP4_MXFP4;
        size_t b13 = 0, b2 = 0;
        if (k3_fp4_scale_bytes(ff, lay, rows13, l, &b13) != K3_STATUS_SUCCESS ||
            k3_fp4_scale_bytes(ff, lay, l, inter, &b2) != K3_STATUS_SUCCESS) {
            fprintf(stderr, CMD ": weights: expert shapes too large\n");
            return 0;
        }
        int64_t sh13[3] = {e, rows13, l / bs}, sh2[3] = {e, l, inter / bs};
        if (lay == K3_SCALE_SWIZZLED) sh13[1] = (int64_t)b13, sh2[1] = (int64_t)b2;
        const int32_t sn = lay == K3_SCALE_LINEAR ? 3 : 2;
        const k3_st_tensor *t13 = want(wf, W, "w13_weight_scale", sdt, sn, sh13);
        const k3_st_tensor *t2 = want(wf, W, "w2_weight_scale", sdt, sn, sh2);
        if (!t13 || !t2) return 0;
        s->mw.w13_scale = t13->data;
        s->mw.w2_scale = t2->data;
        if (fmt == K3_WEIGHT_NVFP4) {
            const k3_st_tensor *g13 = k3_st_find(wf, "w13_weight_scale_2");
            if (g13 && g13->ndim == 2) {
                int64_t shp[2] = {e, 2};
                if (!(g13 = want(wf, W, "w13_weight_scale_2", K3_ST_F32, 2, shp))) return 0;
                d->w13_separate_scale_2 = 1;
            } else {
                int64_t shp[1] = {e};
                if (!(g13 = want(wf, W, "w13_weight_scale_2", K3_ST_F32, 1, shp))) {
                    fprintf(stderr, CMD ": weights: (w13_weight_scale_2 may also be F32 [%d, 2]: gate, up)\n", (int)e);
                    return 0;
                }
            }
            int64_t shp[1] = {e};
            const k3_st_tensor *g2 = want(wf, W, "w2_weight_scale_2", K3_ST_F32, 1, shp);
            if (!g2) return 0;
            s->mw.w13_scale_2 = (const float *)g13->data;
            s->mw.w2_scale_2 = (const float *)g2->data;
        } else if (k3_st_find(wf, "w13_weight_scale_2") || k3_st_find(wf, "w2_weight_scale_2")) {
            fprintf(stderr, CMD ": weights: MXFP4 experts take no w13_weight_scale_2 / w2_weight_scale_2\n");
            return 0;
        }
    }
    if (mode == K3_MOE_W4A4) {
        if (fmt != K3_WEIGHT_NVFP4) {
            fprintf(stderr, CMD ": --mode w4a4 needs NVFP4 experts (these are %s)\n", fp4 ? fmt_s : "BF16");
            return 0;
        }
        int64_t shp[1] = {e};
        const k3_st_tensor *i13 = want(wf, W, "w13_input_scale", K3_ST_F32, 1, shp);
        const k3_st_tensor *i2 = i13 ? want(wf, W, "w2_input_scale", K3_ST_F32, 1, shp) : NULL;
        if (!i2) return 0;
        s->mw.w13_input_scale = (const float *)i13->data;
        s->mw.w2_input_scale = (const float *)i2->data;
    }
    return 1;
}

/* The input tensors and, when routing, the router (and latent block) tensors of the weights. */
static int read_routing(const k3_st_file *wf, const k3_st_file *xf, run_setup *s, const run_opts *o) {
    const char *X = "input", *W = "weights";
    const k3_st_tensor *x = k3_st_find(xf, "hidden_states");
    if (!x || x->dtype != K3_ST_BF16 || x->ndim != 2 || x->shape[0] < 1) {
        int64_t shp[2] = {-1, -1};
        want(xf, X, "hidden_states", K3_ST_BF16, 2, shp);
        if (x && x->ndim == 2 && x->shape[0] < 1) fprintf(stderr, CMD ": input: hidden_states has no rows\n");
        return 0;
    }
    s->x = x;
    s->m = x->shape[0];
    s->width = x->shape[1];
    const k3_st_tensor *ids = k3_st_find(xf, "topk_ids");
    if (ids) {
        int64_t shp[2] = {s->m, -1};
        if (!(ids = want(xf, X, "topk_ids", K3_ST_I32, 2, shp))) return 0;
        const int64_t k = ids->shape[1];
        int64_t shw[2] = {s->m, k};
        if (!(s->wts = want(xf, X, "topk_weights", K3_ST_F32, 2, shw))) return 0;
        if (o->has_top_k && o->top_k != k) {
            fprintf(stderr, CMD ": --top-k %lld disagrees with input topk_ids [%lld, %lld]\n", (long long)o->top_k,
                    (long long)s->m, (long long)k);
            return 0;
        }
        if (s->width != s->l) {
            int64_t shx[2] = {s->m, s->l};
            fprintf(stderr, CMD ": input: with topk_ids given, hidden_states must be the experts' width L = %lld\n",
                    (long long)s->l);
            want(xf, X, "hidden_states", K3_ST_BF16, 2, shx);
            return 0;
        }
        s->ids = ids;
        s->md.top_k = (int32_t)k;
        return 1;
    }
    if (k3_st_find(xf, "topk_weights")) {
        fprintf(stderr, CMD ": input: topk_weights is given without topk_ids (give both, or neither to route)\n");
        return 0;
    }
    s->md.top_k = (int32_t)o->top_k;
    const k3_st_tensor *gate = k3_st_find(wf, "gate_weight");
    if (!gate) {
        fprintf(stderr, CMD ": input has no topk_ids, so the weights must hold the router: tensor 'gate_weight' "
                            "[E, H] BF16/F32 is missing\n");
        return 0;
    }
    if (gate->ndim == 2 && gate->shape[1] != s->width) {
        fprintf(stderr,
                CMD ": input: hidden_states is [%lld, %lld] but weights: gate_weight is [%lld, %lld]: the "
                    "widths must agree (the experts' L = %lld without a latent block, H with one)\n",
                (long long)s->m, (long long)s->width, (long long)gate->shape[0], (long long)gate->shape[1],
                (long long)s->l);
        return 0;
    }
    int64_t shg[2] = {s->e, s->width};
    if (!(gate = want(wf, W, "gate_weight", gate->dtype == K3_ST_F32 ? K3_ST_F32 : K3_ST_BF16, 2, shg))) return 0;
    s->gate = gate;
    if (k3_st_find(wf, "e_score_correction_bias")) {
        int64_t shb[1] = {s->e};
        if (!(s->bias = want(wf, W, "e_score_correction_bias", K3_ST_F32, 1, shb))) return 0;
    }
    const int has_down = k3_st_find(wf, "down_proj_weight") != NULL, has_norm = k3_st_find(wf, "norm_weight") != NULL;
    const int has_up = k3_st_find(wf, "up_proj_weight") != NULL;
    const int has_sgu = k3_st_find(wf, "shared_gate_up_weight") != NULL;
    const int has_sd = k3_st_find(wf, "shared_down_weight") != NULL;
    if (!has_down && !has_norm && !has_up && !has_sgu && !has_sd) {
        if (s->width != s->l) {
            fprintf(stderr,
                    CMD ": input: hidden_states is [%lld, %lld] but the experts' width L is %lld and the "
                        "weights hold no latent block (down_proj_weight ...)\n",
                    (long long)s->m, (long long)s->width, (long long)s->l);
            return 0;
        }
        return 1;
    }
    /* the latent block: all of down/norm/up, and the shared experts both or neither */
    const int64_t h = s->width, l = s->l;
    int64_t shd[2] = {l, h}, shn[1] = {l}, shu[2] = {h, l};
    const k3_st_tensor *down = want(wf, W, "down_proj_weight", K3_ST_BF16, 2, shd);
    const k3_st_tensor *norm = down ? want(wf, W, "norm_weight", K3_ST_BF16, 1, shn) : NULL;
    const k3_st_tensor *up = norm ? want(wf, W, "up_proj_weight", K3_ST_BF16, 2, shu) : NULL;
    if (!up) return 0;
    s->latent = 1;
    s->h = h;
    s->is = 0;
    memset(&s->lw, 0, sizeof s->lw);
    if (has_sgu || has_sd) {
        int64_t shs[2] = {h, -1};
        const k3_st_tensor *sd = want(wf, W, "shared_down_weight", K3_ST_BF16, 2, shs);
        if (!sd) return 0;
        s->is = sd->shape[1];
        int64_t shg2[2] = {(o->act && !strcmp(o->act, "relu2") ? 1 : 2) * s->is, h};
        const k3_st_tensor *sgu = want(wf, W, "shared_gate_up_weight", K3_ST_BF16, 2, shg2);
        if (!sgu || s->is < 1) return 0;
        s->lw.shared_gate_up = sgu->data;
        s->lw.shared_down = sd->data;
    }
    s->lw.down_proj = down->data;
    s->lw.norm = norm->data;
    s->lw.up_proj = up->data;
    return 1;
}

static int save_output(const run_opts *o, const run_setup *s, const uint16_t *y, int64_t ycols, const int32_t *ids,
                       const float *wts) {
    k3_st_writer *w = NULL;
    char err[512];
    int ok = 0;
    if (k3_st_writer_create(&w) != K3_STATUS_SUCCESS) {
        fprintf(stderr, CMD ": out of memory\n");
        return 0;
    }
    int64_t shy[2] = {s->m, ycols}, shk[2] = {s->m, s->md.top_k};
    if (k3_st_writer_add(w, "output", K3_ST_BF16, 2, shy, y, err, sizeof err) != K3_STATUS_SUCCESS) goto fail;
    if (ids && (k3_st_writer_add(w, "topk_ids", K3_ST_I32, 2, shk, ids, err, sizeof err) != K3_STATUS_SUCCESS ||
                k3_st_writer_add(w, "topk_weights", K3_ST_F32, 2, shk, wts, err, sizeof err) != K3_STATUS_SUCCESS))
        goto fail;
    if (k3_st_writer_save(w, o->output, err, sizeof err) != K3_STATUS_SUCCESS) goto fail;
    ok = 1;
    goto done;
fail:
    fprintf(stderr, CMD ": %s\n", err);
done:
    k3_st_writer_destroy(w);
    return ok;
}

static int plan_fail(k3_ctx *ctx, const char *what, k3_status st) {
    fprintf(stderr, CMD ": %s: %s: %s\n", what, k3_status_string(st), k3_ctx_last_error(ctx));
    return K3_EXIT_FAIL;
}

/* Bytes of the tensor whose data is p (in either file), 0 when none. */
static size_t data_bytes(const k3_st_file *wf, const k3_st_file *xf, const void *p) {
    const k3_st_file *fs[2] = {wf, xf};
    for (int f = 0; p && f < 2; f++)
        for (int32_t i = 0; i < k3_st_count(fs[f]); i++)
            if (k3_st_at(fs[f], i)->data == p) return k3_st_at(fs[f], i)->nbytes;
    return 0;
}

/* The run's tensors as the context sees them: the file data itself on the CPU, device copies on CUDA. */
static int tensors_in(k3_cli_mem *mm, const k3_st_file *wf, const k3_st_file *xf, run_setup *s) {
    int ok = 1;
#define K3_RUN_IN(field) (field) = k3_cli_mem_in(mm, (field), data_bytes(wf, xf, (field)), &ok)
    K3_RUN_IN(s->mw.w13);
    K3_RUN_IN(s->mw.w13_scale);
    K3_RUN_IN(s->mw.w13_scale_2);
    K3_RUN_IN(s->mw.w13_input_scale);
    K3_RUN_IN(s->mw.w2);
    K3_RUN_IN(s->mw.w2_scale);
    K3_RUN_IN(s->mw.w2_scale_2);
    K3_RUN_IN(s->mw.w2_input_scale);
    K3_RUN_IN(s->lw.down_proj);
    K3_RUN_IN(s->lw.norm);
    K3_RUN_IN(s->lw.up_proj);
    K3_RUN_IN(s->lw.shared_gate_up);
    K3_RUN_IN(s->lw.shared_down);
#undef K3_RUN_IN
    return ok;
}

/* Plans and runs what the files describe; writes the output file. */
static int execute(k3_ctx *ctx, const run_opts *o, run_setup *s, const k3_st_file *wf, const k3_st_file *xf) {
    const int64_t m = s->m, k = s->md.top_k;
    const int routed = s->ids == NULL;
    const int64_t ycols = s->latent ? s->h : s->l;
    int rc = K3_EXIT_FAIL;
    k3_status st;
    k3_moe_plan *mp = NULL;
    k3_router_plan *rp = NULL;
    k3_latent_moe_plan *lp = NULL;
    void *ws = NULL, *rws = NULL;
    size_t wsb = 0, rwsb = 0;
    k3_cli_mem mm; /* context-side buffers: device memory on CUDA */
    k3_cli_mem_init(&mm, ctx);
    const size_t yb = sizeof(uint16_t) * (size_t)(m * ycols), ib = sizeof(int32_t) * (size_t)(m * k),
                 fb = sizeof(float) * (size_t)(m * k);
    uint16_t *y = (uint16_t *)malloc(yb);
    int32_t *ids = routed ? (int32_t *)malloc(ib) : NULL;
    float *wts = routed ? (float *)malloc(fb) : NULL;
    int in_ok = 1;
    void *cy = k3_cli_mem_alloc(&mm, yb);
    int32_t *cids = routed ? (int32_t *)k3_cli_mem_alloc(&mm, ib) : NULL;
    float *cwts = routed ? (float *)k3_cli_mem_alloc(&mm, fb) : NULL;
    const void *cx = k3_cli_mem_in(&mm, s->x->data, s->x->nbytes, &in_ok);
    const void *cgate = s->gate ? k3_cli_mem_in(&mm, s->gate->data, s->gate->nbytes, &in_ok) : NULL;
    const float *cbias = s->bias ? (const float *)k3_cli_mem_in(&mm, s->bias->data, s->bias->nbytes, &in_ok) : NULL;
    const int32_t *in_ids = s->ids ? (const int32_t *)k3_cli_mem_in(&mm, s->ids->data, s->ids->nbytes, &in_ok) : NULL;
    const float *in_wts = s->wts ? (const float *)k3_cli_mem_in(&mm, s->wts->data, s->wts->nbytes, &in_ok) : NULL;
    if (!y || !cy || (routed && (!ids || !wts || !cids || !cwts)) || !in_ok || !tensors_in(&mm, wf, xf, s)) {
        fprintf(stderr, CMD ": out of %s memory\n", mm.on_device ? "device" : "host");
        goto done;
    }
    s->md.max_tokens = m;
    k3_router_desc rd;
    k3_router_desc_init(&rd);
    rd.num_experts = s->e;
    rd.top_k = (int32_t)k;
    rd.hidden = s->width;
    rd.gate_dtype = s->gate && s->gate->dtype == K3_ST_F32 ? K3_DTYPE_F32 : K3_DTYPE_BF16;
    rd.scaling_factor = o->scaling;
    rd.max_tokens = m;
    if (s->latent) {
        k3_latent_moe_desc ld;
        k3_latent_moe_desc_init(&ld);
        ld.hidden = s->h;
        ld.router = rd;
        ld.experts = s->md;
        ld.shared_inter = s->is;
        ld.shared_act = s->md.act;
        ld.max_tokens = m;
        if ((st = k3_latent_moe_plan_create(ctx, &ld, &lp)) != K3_STATUS_SUCCESS) {
            rc = plan_fail(ctx, "latent-MoE plan", st);
            goto done;
        }
        k3_latent_moe_workspace_size(lp, &wsb);
        s->lw.gate = cgate;
        s->lw.bias = cbias;
        s->lw.experts = s->mw;
        if (!(ws = k3_cli_mem_alloc(&mm, wsb))) goto oom;
        if ((st = k3_latent_moe_run(lp, m, cx, &s->lw, NULL, cy, cids, cwts, ws, wsb, NULL)) !=
            K3_STATUS_SUCCESS) {
            rc = plan_fail(ctx, "latent-MoE run", st);
            goto done;
        }
    } else {
        if ((st = k3_moe_plan_create(ctx, &s->md, &mp)) != K3_STATUS_SUCCESS) {
            rc = plan_fail(ctx, "MoE plan", st);
            goto done;
        }
        k3_moe_workspace_size(mp, &wsb);
        if (!(ws = k3_cli_mem_alloc(&mm, wsb))) goto oom;
        const int32_t *run_ids = routed ? cids : in_ids;
        const float *run_wts = routed ? cwts : in_wts;
        if (routed) {
            if ((st = k3_router_plan_create(ctx, &rd, &rp)) != K3_STATUS_SUCCESS) {
                rc = plan_fail(ctx, "router plan", st);
                goto done;
            }
            k3_router_workspace_size(rp, &rwsb);
            if (!(rws = k3_cli_mem_alloc(&mm, rwsb))) goto oom;
            st = k3_router_run(rp, m, cx, cgate, cbias, cids, cwts, rws, rwsb, NULL);
            if (st != K3_STATUS_SUCCESS) {
                rc = plan_fail(ctx, "router run", st);
                goto done;
            }
        }
        st = k3_moe_run(mp, m, cx, run_ids, run_wts, &s->mw, cy, NULL, ws, wsb, NULL);
        if (st != K3_STATUS_SUCCESS) {
            rc = plan_fail(ctx, "MoE run", st);
            goto done;
        }
    }
    if (!k3_cli_mem_out(&mm, y, cy, yb) || (routed && (!k3_cli_mem_out(&mm, ids, cids, ib) ||
                                                        !k3_cli_mem_out(&mm, wts, cwts, fb)))) {
        fprintf(stderr, CMD ": copying the results back from the device failed\n");
        goto done;
    }
    if (save_output(o, s, y, ycols, ids, wts)) {
        printf("k3 run moe: %s%s, %s experts (E %d, L %lld, I %lld, top-%lld, %s, %s), M %lld -> %s\n",
               s->latent ? "latent-MoE block" : "routed experts", routed && !s->latent ? " with router" : "",
               s->md.format == K3_WEIGHT_BF16    ? "BF16"
               : s->md.format == K3_WEIGHT_NVFP4 ? "NVFP4"
                                                 : "MXFP4",
               (int)s->e, (long long)s->l, (long long)s->inter, (long long)k, k3_act_name(s->md.act.kind),
               s->md.mode == K3_MOE_W4A4 ? "w4a4" : "w4a16", (long long)m, o->output);
        rc = K3_EXIT_OK;
    }
    goto done;
oom:
    fprintf(stderr, CMD ": out of memory\n");
done:
    k3_moe_plan_destroy(mp);
    k3_router_plan_destroy(rp);
    k3_latent_moe_plan_destroy(lp);
    k3_cli_mem_free(&mm);
    free(y);
    free(ids);
    free(wts);
    return rc;
}

static int run_moe(int argc, char **argv) {
    if (k3_cli_wants_help(argc, argv)) {
        moe_help();
        return K3_EXIT_OK;
    }
    run_opts o;
    if (!parse_opts(argc, argv, &o)) return K3_EXIT_USAGE;
    k3_act_desc act;
    k3_act_kind kind;
    if (!parse_act(o.act, &kind)) {
        fprintf(stderr, CMD ": --act must be situ, silu, swigluoai, swigluoai_uninterleave or relu2 (got '%s')\n",
                o.act);
        return K3_EXIT_USAGE;
    }
    if (kind == K3_ACT_SITU)
        k3_act_desc_k3(&act);
    else
        k3_act_desc_init(&act, kind);
    if (o.has_situ_beta) act.situ_beta = o.situ_beta;
    if (o.has_situ_lb) act.situ_linear_beta = o.situ_lb;
    if (o.has_limit) act.limit = o.limit;
    char msg[256];
    if (k3_act_desc_validate(&act, msg, sizeof msg) != K3_STATUS_SUCCESS) {
        fprintf(stderr, CMD ": activation: %s\n", msg);
        return K3_EXIT_USAGE;
    }

    int rc = K3_EXIT_FAIL;
    char err[512];
    k3_st_file *wf = NULL, *xf = NULL;
    k3_ctx *ctx = NULL;
    if (k3_st_open(o.weights, &wf, err, sizeof err) != K3_STATUS_SUCCESS ||
        k3_st_open(o.input, &xf, err, sizeof err) != K3_STATUS_SUCCESS) {
        fprintf(stderr, CMD ": %s\n", err);
        goto done;
    }
    if (!only_known(wf, "weights", weight_names, (int)(sizeof weight_names / sizeof weight_names[0])) ||
        !only_known(xf, "input", input_names, (int)(sizeof input_names / sizeof input_names[0])))
        goto done;
    run_setup s;
    memset(&s, 0, sizeof s);
    if (!read_experts(wf, &s, &act, o.mode) || !read_routing(wf, xf, &s, &o)) goto done;
    if (!(ctx = k3_cli_ctx(o.device))) goto done;
    rc = execute(ctx, &o, &s, wf, xf);
done:
    k3_ctx_destroy(ctx);
    k3_st_close(wf);
    k3_st_close(xf);
    return rc;
}

int k3_cmd_run(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        run_help(argc < 2 ? stderr : stdout);
        return argc < 2 ? K3_EXIT_USAGE : K3_EXIT_OK;
    }
    if (!strcmp(argv[1], "moe")) return run_moe(argc - 1, argv + 1);
    fprintf(stderr, "k3 run: unknown operation '%s' (operations: moe; see k3 run --help)\n", argv[1]);
    return K3_EXIT_USAGE;
}
