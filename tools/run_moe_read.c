/* k3 run moe: the weights and input files read into a run_setup, every tensor checked by name, dtype and
 * shape (a mismatch is an error naming the tensor and what was expected). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "io/safetensors.h" /* internals: the file format (no public call yet) */
#include "core/formats.h"
#include "run_moe.h"

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

/* " [3, 1]": the coordinates of flat element i of t */
static void fmt_index(char *buf, size_t n, const k3_st_tensor *t, size_t i) {
    int64_t c[K3_ST_MAX_DIMS];
    for (int32_t d = t->ndim - 1; d >= 0; d--) {
        c[d] = t->shape[d] ? (int64_t)(i % (size_t)t->shape[d]) : 0;
        i = t->shape[d] ? i / (size_t)t->shape[d] : 0;
    }
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int32_t d = 0; d < t->ndim && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", d ? ", " : "", (long long)c[d]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* NaN or Inf in a tensor the run reads (a scale, a routing weight, an activation) would silently become NaN
 * outputs, so each is checked on load: 0 after naming the tensor and the first bad element. positive: the values
 * must also be > 0 (global and input scales). */
static int check_values(const k3_st_tensor *t, const char *label, int positive) {
    const size_t n = t->nbytes / k3_st_dtype_size(t->dtype);
    char at[200];
    for (size_t i = 0; i < n; i++) {
        float v;
        const char *bad = NULL;
        if (t->dtype == K3_ST_F32) {
            v = ((const float *)t->data)[i];
        } else if (t->dtype == K3_ST_BF16) {
            const uint32_t b = (uint32_t)((const uint16_t *)t->data)[i] << 16;
            memcpy(&v, &b, sizeof v);
        } else if (t->dtype == K3_ST_F8_E4M3) { /* block scales: 0x7F and 0xFF are E4M3's NaN codes */
            const uint8_t c = ((const uint8_t *)t->data)[i];
            if ((c & 0x7Fu) == 0x7Fu) bad = "0x7F/0xFF, an E4M3 NaN code";
            v = 0.0f;
        } else { /* U8 UE8M0 block scales: 0xFF is NaN */
            if (((const uint8_t *)t->data)[i] == 0xFFu) bad = "0xFF, a UE8M0 NaN code";
            v = 0.0f;
        }
        if (!bad && isnan(v)) bad = "NaN";
        else if (!bad && isinf(v)) bad = v > 0 ? "+Inf" : "-Inf";
        else if (!bad && positive && !(v > 0.0f)) bad = "not positive (a scale must be > 0)";
        if (bad) {
            fmt_index(at, sizeof at, t, i);
            if (positive && !isnan(v) && !isinf(v))
                fprintf(stderr, CMD ": %s: tensor '%s' element %s is %g: %s\n", label, t->name, at, (double)v, bad);
            else
                fprintf(stderr, CMD ": %s: tensor '%s' element %s is %s\n", label, t->name, at, bad);
            return 0;
        }
    }
    return 1;
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

int k3_run_read_experts(const k3_st_file *wf, run_setup *s, const k3_act_desc *act, k3_moe_mode mode) {
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
        k3_scale_layout lay = s13->ndim == 2 ? K3_SCALE_SWIZZLED : K3_SCALE_LINEAR;
        const char *meta_lay = k3_st_metadata_get(wf, "k3.quant.scale_layout");
        const char *opt_lay = s->scale_layout_given == K3_SCALE_LINEAR     ? "linear"
                              : s->scale_layout_given == K3_SCALE_SWIZZLED ? "swizzled"
                                                                            : NULL;
        if (meta_lay && opt_lay && strcmp(meta_lay, opt_lay)) {
            fprintf(stderr, CMD ": weights: __metadata__ k3.quant.scale_layout is '%s' but --scale-layout says %s\n",
                    meta_lay, opt_lay);
            return 0;
        }
        int swizzled_3d = 0; /* swizzled bytes kept in the linear layout's 3-D shape (as engines store them) */
        if (s13->ndim != 2 && k3_scale_shape_ambiguous(rows13, l / bs) && k3_scale_shape_ambiguous(l, inter / bs)) {
            const char *given = meta_lay ? meta_lay : opt_lay;
            if (!given) {
                fprintf(stderr,
                        CMD ": weights: w13_weight_scale [%d, %lld, %lld] and w2_weight_scale [%d, %lld, %lld] have the "
                            "same shapes in the linear and the 128x4-swizzled scale layouts (engines keep swizzled "
                            "scales in these 3-D shapes too), and the file does not say which (__metadata__ "
                            "k3.quant.scale_layout, which k3 writes): give --scale-layout linear|swizzled\n",
                        (int)e, (long long)rows13, (long long)(l / bs), (int)e, (long long)l, (long long)(inter / bs));
                return 0;
            }
            if (!strcmp(given, "swizzled")) lay = K3_SCALE_SWIZZLED, swizzled_3d = 1;
        }
        const char *lay_s = lay == K3_SCALE_LINEAR ? "linear" : "swizzled";
        if (!swizzled_3d && opt_lay && strcmp(opt_lay, lay_s)) {
            fprintf(stderr, CMD ": weights: --scale-layout %s, but w13_weight_scale's %d-D shape is the %s layout's\n",
                    opt_lay, (int)s13->ndim, lay_s);
            return 0;
        }
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
        if (lay == K3_SCALE_SWIZZLED && !swizzled_3d) sh13[1] = (int64_t)b13, sh2[1] = (int64_t)b2;
        const int32_t sn = lay == K3_SCALE_LINEAR || swizzled_3d ? 3 : 2;
        const k3_st_tensor *t13 = want(wf, W, "w13_weight_scale", sdt, sn, sh13);
        const k3_st_tensor *t2 = want(wf, W, "w2_weight_scale", sdt, sn, sh2);
        if (!t13 || !t2 || !check_values(t13, W, 0) || !check_values(t2, W, 0)) return 0;
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
            if (!g2 || !check_values(g13, W, 1) || !check_values(g2, W, 1)) return 0;
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
        if (!i2 || !check_values(i13, W, 1) || !check_values(i2, W, 1)) return 0;
        s->mw.w13_input_scale = (const float *)i13->data;
        s->mw.w2_input_scale = (const float *)i2->data;
    }
    return 1;
}

int k3_run_read_input(const k3_st_file *xf, run_setup *s, const run_opts *o) {
    const char *X = "input";
    const k3_st_tensor *x = k3_st_find(xf, "hidden_states");
    if (!x || x->dtype != K3_ST_BF16 || x->ndim != 2 || x->shape[0] < 1) {
        int64_t shp[2] = {-1, -1};
        want(xf, X, "hidden_states", K3_ST_BF16, 2, shp);
        if (x && x->ndim == 2 && x->shape[0] < 1) fprintf(stderr, CMD ": input: hidden_states has no rows\n");
        return 0;
    }
    if (!check_values(x, X, 0)) return 0;
    s->x = x;
    s->m = x->shape[0];
    s->width = x->shape[1];
    const k3_st_tensor *ids = k3_st_find(xf, "topk_ids");
    if (ids) {
        int64_t shp[2] = {s->m, -1};
        if (!(ids = want(xf, X, "topk_ids", K3_ST_I32, 2, shp))) return 0;
        const int64_t k = ids->shape[1];
        int64_t shw[2] = {s->m, k};
        if (!(s->wts = want(xf, X, "topk_weights", K3_ST_F32, 2, shw)) || !check_values(s->wts, X, 0)) return 0;
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
        /* -1 marks an expert on another rank (the library skips it, as any id outside [0, E)); any other id out
         * of range in a file is a mistake, refused here */
        for (int64_t t = 0; t < s->m; t++)
            for (int64_t j = 0; j < k; j++) {
                int32_t id;
                memcpy(&id, (const unsigned char *)ids->data + (size_t)(t * k + j) * sizeof id, sizeof id);
                if (id < -1 || id >= s->e) {
                    fprintf(stderr,
                            CMD ": input: topk_ids[token %lld][slot %lld] = %d is out of range: an id is -1 (not on "
                                "this rank) or in [0, %d)\n",
                            (long long)t, (long long)j, (int)id, (int)s->e);
                    return 0;
                }
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
    return 2;
}

/* The input tensors and, when routing, the router (and latent block) tensors of the weights. */
int k3_run_read_routing(const k3_st_file *wf, const k3_st_file *xf, run_setup *s, const run_opts *o) {
    const char *W = "weights";
    const int in = k3_run_read_input(xf, s, o);
    if (in != 2) return in;
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
    if (!(gate = want(wf, W, "gate_weight", gate->dtype == K3_ST_F32 ? K3_ST_F32 : K3_ST_BF16, 2, shg)) ||
        !check_values(gate, W, 0))
        return 0;
    s->gate = gate;
    if (k3_st_find(wf, "e_score_correction_bias")) {
        int64_t shb[1] = {s->e};
        if (!(s->bias = want(wf, W, "e_score_correction_bias", K3_ST_F32, 1, shb)) || !check_values(s->bias, W, 0))
            return 0;
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
    if (!up || !check_values(norm, W, 0)) return 0;
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
        if (!sgu) return 0;
        if (s->is < 1) {
            fprintf(stderr, CMD ": weights: shared_down_weight [%lld, 0] has no shared experts; leave both shared "
                    "tensors out to run the block without them\n", (long long)h);
            return 0;
        }
        s->lw.shared_gate_up = sgu->data;
        s->lw.shared_down = sd->data;
    }
    s->lw.down_proj = down->data;
    s->lw.norm = norm->data;
    s->lw.up_proj = up->data;
    return 1;
}

int k3_run_only_known_input(const k3_st_file *xf) {
    return only_known(xf, "input", input_names, (int)(sizeof input_names / sizeof input_names[0]));
}

int k3_run_only_known(const k3_st_file *wf, const k3_st_file *xf) {
    return only_known(wf, "weights", weight_names, (int)(sizeof weight_names / sizeof weight_names[0])) &&
           only_known(xf, "input", input_names, (int)(sizeof input_names / sizeof input_names[0]));
}
