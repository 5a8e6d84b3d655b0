/* The MoE layer of a checkpoint: its names mapped (prefix, format, experts) and its tensors stacked into this
 * library's layout (w13 = [gate; up]); see io/checkpoint.h. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/formats.h"
#include "io/checkpoint.h"
#include "io/st_common.h"

/* ---- the MoE name mapper ---------------------------------------------------------------------------- */

static const char *const k3_projs[3] = {"gate_proj", "up_proj", "down_proj"};

/* Parses "experts.<e>.<rest>" after the prefix; returns rest or NULL. */
static const char *expert_of(const char *name, const char *prefix, size_t plen, int64_t *e) {
    if (strncmp(name, prefix, plen) || strncmp(name + plen, "experts.", 8)) return NULL;
    const char *c = name + plen + 8;
    int64_t v = 0;
    const char *d = c;
    while (*d >= '0' && *d <= '9') {
        if (v > (INT32_MAX - 9) / 10) return NULL;
        v = v * 10 + (*d - '0');
        d++;
    }
    if (d == c || *d != '.' || (d - c > 1 && c[0] == '0')) return NULL;
    *e = v;
    return d + 1;
}

static int expert_has(const k3_ckpt *ck, const char *prefix, int64_t e, const char *proj, const char *suffix,
                      char *name, size_t name_size) {
    snprintf(name, name_size, "%sexperts.%lld.%s.%s", prefix, (long long)e, proj, suffix);
    return k3_ckpt_has(ck, name);
}

/* The suffixes every expert of a format must have (input scales checked separately). */
static const char *const ct_mx_sfx[] = {"weight_packed", "weight_scale", NULL};
static const char *const ct_nv_sfx[] = {"weight_packed", "weight_scale", "weight_global_scale", NULL};
static const char *const mo_sfx[] = {"weight", "weight_scale", "weight_scale_2", NULL};

const char *k3_ckpt_moe_format_name(k3_ckpt_moe_format f) {
    switch (f) {
    case K3_CKPT_MOE_CT_MXFP4: return "compressed-tensors MXFP4";
    case K3_CKPT_MOE_CT_NVFP4: return "compressed-tensors NVFP4";
    case K3_CKPT_MOE_MODELOPT_NVFP4: return "ModelOpt NVFP4";
    default: return "stacked";
    }
}

k3_status k3_ckpt_moe_detect(const k3_ckpt *ck, int32_t layer, k3_ckpt_moe_info *info, char *err, size_t err_size) {
    if (!ck || !info) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_ckpt_moe_detect: NULL argument");
    memset(info, 0, sizeof *info);
    if (layer < 0)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "layer %d: a layer number is >= 0", (int)layer);
    char prefixes[3][160];
    snprintf(prefixes[0], sizeof prefixes[0], "model.layers.%d.mlp.", (int)layer);
    snprintf(prefixes[1], sizeof prefixes[1], "language_model.model.layers.%d.mlp.", (int)layer);
    prefixes[2][0] = '\0';
    char name[512]; /* a prefix (160) and the longest suffix, with room gcc can prove */
    const int32_t n = k3_ckpt_count(ck);
    for (int pi = 0; pi < 3; pi++) {
        const char *P = prefixes[pi];
        const size_t plen = strlen(P);
        /* stacked: <P>w13_weight or <P>experts.w13_weight */
        for (int ex = 0; ex < 2; ex++) {
            snprintf(name, sizeof name, "%s%sw13_weight", P, ex ? "experts." : "");
            if (k3_ckpt_has(ck, name)) {
                info->format = K3_CKPT_MOE_STACKED;
                snprintf(info->prefix, sizeof info->prefix, "%s%s", P, ex ? "experts." : "");
                return K3_STATUS_SUCCESS; /* E comes from the tensor's shape (k3_ckpt_load_moe) */
            }
        }
        int64_t max_e = -1;
        int packed = 0, plain = 0, global = 0;
        for (int32_t i = 0; i < n; i++) {
            int64_t e = 0;
            const char *rest = expert_of(k3_ckpt_name_at(ck, i), P, plen, &e);
            if (!rest) continue;
            if (e > max_e) max_e = e;
            const char *dot = strrchr(rest, '.');
            if (!dot) continue;
            if (!strcmp(dot, ".weight_packed")) packed = 1;
            else if (!strcmp(dot, ".weight")) plain = 1;
            else if (!strcmp(dot, ".weight_global_scale")) global = 1;
        }
        if (max_e < 0) continue;
        const char *const *sfx = NULL;
        if (packed && plain)
            return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                             "layer %d ('%s'): experts have both .weight_packed and .weight tensors: which format is "
                             "meant is ambiguous",
                             (int)layer, P);
        if (packed) {
            info->format = global ? K3_CKPT_MOE_CT_NVFP4 : K3_CKPT_MOE_CT_MXFP4;
            sfx = global ? ct_nv_sfx : ct_mx_sfx;
        } else if (plain) {
            info->format = K3_CKPT_MOE_MODELOPT_NVFP4;
            sfx = mo_sfx;
        } else {
            return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                             "layer %d ('%s'): expert tensors found, but no .weight_packed (compressed-tensors) or "
                             ".weight (ModelOpt) among them",
                             (int)layer, P);
        }
        snprintf(info->prefix, sizeof info->prefix, "%s", P);
        info->num_experts = (int32_t)(max_e + 1);
        info->has_input_scale =
            expert_has(ck, P, 0, k3_projs[0], global ? "input_global_scale" : "input_scale", name, sizeof name);
        const char *in_sfx = packed ? "input_global_scale" : "input_scale";
        const int need_in = info->format != K3_CKPT_MOE_CT_MXFP4 && info->has_input_scale;
        if (info->format == K3_CKPT_MOE_CT_MXFP4) info->has_input_scale = 0;
        for (int64_t e = 0; e <= max_e; e++)
            for (int pj = 0; pj < 3; pj++) {
                for (int s = 0; sfx[s]; s++)
                    if (!expert_has(ck, P, e, k3_projs[pj], sfx[s], name, sizeof name))
                        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                                         "layer %d: %s experts 0..%lld: expert %lld is missing (no tensor '%s')",
                                         (int)layer, k3_ckpt_moe_format_name(info->format), (long long)max_e,
                                         (long long)e, name);
                if (need_in && !expert_has(ck, P, e, k3_projs[pj], in_sfx, name, sizeof name))
                    return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                                     "layer %d: expert 0 has input scales but expert %lld has no tensor '%s'",
                                     (int)layer, (long long)e, name);
            }
        return K3_STATUS_SUCCESS;
    }
    return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                     "layer %d: no MoE experts found (looked for '%sexperts.<e>.*', '%sexperts.<e>.*', "
                     "'experts.<e>.*' and stacked 'w13_weight')",
                     (int)layer, prefixes[0], prefixes[1]);
}

/* ---- stacking into this library's layout ---------------------------------------------------------------- */

static void shape_str(char *buf, size_t n, int32_t ndim, const int64_t *shape) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int32_t i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* Looks `name` up (header only) and checks its dtype and shape (ndim < 0: a scalar, ndim 0 or [1]). */
static k3_status want(k3_ckpt *ck, const char *name, k3_st_dtype dt, int32_t ndim, const int64_t *shape,
                      const k3_st_tensor **out, char *err, size_t err_size) {
    ST_TRY(k3_ckpt_lookup(ck, name, out, err, err_size));
    const k3_st_tensor *t = *out;
    int ok = t->dtype == dt;
    if (ndim < 0) {
        ok = ok && (t->ndim == 0 || (t->ndim == 1 && t->shape[0] == 1));
    } else {
        ok = ok && t->ndim == ndim;
        for (int32_t i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    }
    if (ok) return K3_STATUS_SUCCESS;
    char want_s[160], got_s[160];
    if (ndim < 0) snprintf(want_s, sizeof want_s, "a scalar ([] or [1])");
    else shape_str(want_s, sizeof want_s, ndim, shape);
    shape_str(got_s, sizeof got_s, t->ndim, t->shape);
    *out = NULL;
    return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR, "tensor '%.200s': expected %s %s, found %s %s", name,
                     k3_st_dtype_name(dt), want_s, k3_st_dtype_name(t->dtype), got_s);
}

/* A positive finite fp32 scale; recip: the file stores its reciprocal (compressed-tensors global scales). */
static k3_status scale_value(const char *name, float v, int recip, float *out, char *err, size_t err_size) {
    if (!(isfinite(v) && v > 0.0f))
        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR, "tensor '%.200s': %g is not a positive finite scale",
                         name, (double)v);
    const float s = recip ? 1.0f / v : v;
    if (!(isfinite(s) && s > 0.0f))
        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                         "tensor '%.200s': the reciprocal of %g is not a finite fp32 scale", name, (double)v);
    *out = s;
    return K3_STATUS_SUCCESS;
}

static k3_status read_scalar(k3_ckpt *ck, const char *name, int recip, float *out, char *err, size_t err_size) {
    const k3_st_tensor *t = NULL;
    ST_TRY(want(ck, name, K3_ST_F32, -1, NULL, &t, err, err_size));
    float v;
    ST_TRY(k3_ckpt_read(ck, name, 0, &v, sizeof v, err, err_size));
    return scale_value(name, v, recip, out, err, err_size);
}

void k3_ckpt_moe_free(k3_ckpt_moe *m) {
    if (!m) return;
    free(m->w13);
    free(m->w13_scale);
    free(m->w2);
    free(m->w2_scale);
    free(m->w13_scale_2);
    free(m->w2_scale_2);
    free(m->w13_input_scale);
    free(m->w2_input_scale);
    memset(m, 0, sizeof *m);
}

/* The byte sizes of the stacked buffers for E experts of [2I, L] and [L, I]; overflow-checked. */
static k3_status moe_sizes(k3_ckpt_moe *m, char *err, size_t err_size) {
    const int64_t E = m->num_experts, L = m->hidden, I = m->inter, bs = m->fp4 == K3_FP4_NVFP4 ? 16 : 32;
    if (I > INT64_MAX / 2)
        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR, "experts of I = %lld are too large", (long long)I);
    const int64_t s13[3] = {E, 2 * I, L / 2}, c13[3] = {E, 2 * I, L / bs}, s2[3] = {E, L, I / 2},
                  c2[3] = {E, L, I / bs};
    int ok1 = 0, ok2 = 0, ok3 = 0, ok4 = 0;
    m->w13_bytes = k3_st_tensor_bytes(K3_ST_U8, 3, s13, &ok1);
    m->w13_scale_bytes = k3_st_tensor_bytes(K3_ST_U8, 3, c13, &ok2);
    m->w2_bytes = k3_st_tensor_bytes(K3_ST_U8, 3, s2, &ok3);
    m->w2_scale_bytes = k3_st_tensor_bytes(K3_ST_U8, 3, c2, &ok4);
    if (!ok1 || !ok2 || !ok3 || !ok4 || (uint64_t)E > SIZE_MAX / (2 * sizeof(float)))
        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                         "%lld experts of [2I, L] = [%lld, %lld]: the byte sizes overflow", (long long)E,
                         (long long)(2 * I), (long long)L);
    return K3_STATUS_SUCCESS;
}

/* Allocates the stacked buffers (sizes from moe_sizes). */
static k3_status alloc_moe(k3_ckpt_moe *m, char *err, size_t err_size) {
    const int64_t E = m->num_experts;
    const int nvfp4 = m->fp4 == K3_FP4_NVFP4;
    m->w13 = malloc(m->w13_bytes ? m->w13_bytes : 1);
    m->w13_scale = malloc(m->w13_scale_bytes ? m->w13_scale_bytes : 1);
    m->w2 = malloc(m->w2_bytes ? m->w2_bytes : 1);
    m->w2_scale = malloc(m->w2_scale_bytes ? m->w2_scale_bytes : 1);
    int fail = !m->w13 || !m->w13_scale || !m->w2 || !m->w2_scale;
    if (nvfp4) {
        m->w13_scale_2 = malloc((size_t)E * 2 * sizeof(float));
        m->w2_scale_2 = malloc((size_t)E * sizeof(float));
        fail = fail || !m->w13_scale_2 || !m->w2_scale_2;
    }
    if (m->info.has_input_scale) {
        m->w13_input_scale = malloc((size_t)E * 2 * sizeof(float));
        m->w2_input_scale = malloc((size_t)E * sizeof(float));
        fail = fail || !m->w13_input_scale || !m->w2_input_scale;
    }
    return fail ? k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "out of memory for %lld experts", (long long)E)
                : K3_STATUS_SUCCESS;
}

/* A NaN block scale would turn its whole block into NaN: E4M3 S.1111.111, UE8M0 0xFF. cols = scales per row;
   first = the index of p[0] in the tensor (messages count from the tensor's start). */
static k3_status check_block_scales(const char *name, const uint8_t *p, size_t n, size_t first, int64_t cols,
                                    int nvfp4, char *err, size_t err_size) {
    for (size_t i = 0; i < n; i++)
        if (nvfp4 ? (p[i] & 0x7Fu) == 0x7Fu : p[i] == 0xFFu) {
            const size_t at = first + i;
            return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                             "tensor '%.200s': block scale %zu (row %lld, block %lld) is NaN (0x%02X)", name, at,
                             (long long)(at / (size_t)cols), (long long)(at % (size_t)cols), (unsigned)p[i]);
        }
    return K3_STATUS_SUCCESS;
}

static const char *wsfx_of(k3_ckpt_moe_format f) {
    return f == K3_CKPT_MOE_MODELOPT_NVFP4 ? "weight" : "weight_packed";
}

/* Per-expert layouts: the shapes from expert 0's gate_proj (every other tensor is checked when it is read). */
static k3_status describe_per_expert(k3_ckpt *ck, k3_ckpt_moe *m, char *err, size_t err_size) {
    const int nvfp4 = m->info.format != K3_CKPT_MOE_CT_MXFP4;
    const int64_t bs = nvfp4 ? 16 : 32;
    m->fp4 = nvfp4 ? K3_FP4_NVFP4 : K3_FP4_MXFP4;
    m->num_experts = m->info.num_experts;
    char name[400];
    snprintf(name, sizeof name, "%sexperts.0.gate_proj.%s", m->info.prefix, wsfx_of(m->info.format));
    const k3_st_tensor *t = NULL;
    ST_TRY(k3_ckpt_lookup(ck, name, &t, err, err_size));
    if (t->dtype != K3_ST_U8 || t->ndim != 2 || t->shape[0] <= 0 || t->shape[1] <= 0 ||
        t->shape[1] > INT64_MAX / 2) {
        char got[160];
        shape_str(got, sizeof got, t->ndim, t->shape);
        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                         "tensor '%.200s': expected U8 [I, L/2] (packed FP4, two codes a byte), found %s %s", name,
                         k3_st_dtype_name(t->dtype), got);
    }
    m->inter = t->shape[0];
    m->hidden = t->shape[1] * 2;
    if (m->hidden % bs || m->inter % bs)
        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                         "tensor '%.200s': L = %lld and I = %lld must be multiples of the %s block size %lld", name,
                         (long long)m->hidden, (long long)m->inter, nvfp4 ? "NVFP4" : "MXFP4", (long long)bs);
    return moe_sizes(m, err, err_size);
}

/* Reads `name` (checked as dt [d0, d1]) into dst when dst is given; scales are checked for NaN codes. */
static k3_status read_matrix(k3_ckpt *ck, const char *name, k3_st_dtype dt, int64_t d0, int64_t d1, uint8_t *dst,
                             int scales, int nvfp4, char *err, size_t err_size) {
    const int64_t sh[2] = {d0, d1};
    const k3_st_tensor *t = NULL;
    ST_TRY(want(ck, name, dt, 2, sh, &t, err, err_size));
    if (!dst) return K3_STATUS_SUCCESS;
    const size_t n = (size_t)(d0 * d1);
    ST_TRY(k3_ckpt_read(ck, name, 0, dst, n, err, err_size));
    return scales ? check_block_scales(name, dst, n, 0, d1, nvfp4, err, err_size) : K3_STATUS_SUCCESS;
}

static k3_status read_per_expert(k3_ckpt *ck, const k3_ckpt_moe *m, int64_t e, k3_ckpt_expert *x, char *err,
                                 size_t err_size) {
    const k3_ckpt_moe_format fmt = m->info.format;
    const char *P = m->info.prefix;
    const int ct = fmt != K3_CKPT_MOE_MODELOPT_NVFP4, nvfp4 = m->fp4 == K3_FP4_NVFP4;
    const int64_t bs = nvfp4 ? 16 : 32, L = m->hidden, I = m->inter;
    const k3_st_dtype sdt = nvfp4 ? K3_ST_F8_E4M3 : K3_ST_U8;
    const char *s2sfx = ct ? "weight_global_scale" : "weight_scale_2";
    const char *insfx = ct ? "input_global_scale" : "input_scale";
    char name[400];
    for (int pj = 0; pj < 3; pj++) {
        const int64_t N = pj < 2 ? I : L, K = pj < 2 ? L : I;
        const size_t wb = (size_t)(N * (K / 2)), sb = (size_t)(N * (K / bs));
        uint8_t *wd = pj < 2 ? (x->w13 ? x->w13 + (size_t)pj * wb : NULL) : x->w2;
        uint8_t *sd = pj < 2 ? (x->w13_scale ? x->w13_scale + (size_t)pj * sb : NULL) : x->w2_scale;
        snprintf(name, sizeof name, "%sexperts.%lld.%s.%s", P, (long long)e, k3_projs[pj], wsfx_of(fmt));
        ST_TRY(read_matrix(ck, name, K3_ST_U8, N, K / 2, wd, 0, nvfp4, err, err_size));
        snprintf(name, sizeof name, "%sexperts.%lld.%s.weight_scale", P, (long long)e, k3_projs[pj]);
        ST_TRY(read_matrix(ck, name, sdt, N, K / bs, sd, 1, nvfp4, err, err_size));
        if (nvfp4) {
            snprintf(name, sizeof name, "%sexperts.%lld.%s.%s", P, (long long)e, k3_projs[pj], s2sfx);
            ST_TRY(read_scalar(ck, name, ct, pj < 2 ? &x->w13_scale_2[pj] : &x->w2_scale_2, err, err_size));
        }
        if (m->info.has_input_scale) {
            snprintf(name, sizeof name, "%sexperts.%lld.%s.%s", P, (long long)e, k3_projs[pj], insfx);
            ST_TRY(read_scalar(ck, name, ct, pj < 2 ? &x->w13_input_scale[pj] : &x->w2_input_scale, err, err_size));
        }
    }
    return K3_STATUS_SUCCESS;
}

/* A stacked [E] or [E, 2] (gate, up) F32 scale: checks the shape; *pair says which (two = 0 allows [E] only). */
static k3_status stacked_scale_shape(k3_ckpt *ck, const char *name, int64_t E, int two, int *pair, char *err,
                                     size_t err_size) {
    const k3_st_tensor *t = NULL;
    ST_TRY(k3_ckpt_lookup(ck, name, &t, err, err_size));
    *pair = two && t->ndim == 2;
    const int64_t sh[2] = {E, 2};
    return want(ck, name, K3_ST_F32, *pair ? 2 : 1, sh, &t, err, err_size);
}

/* Expert e's values of a stacked scale into dst[0..two ? 2 : 1) (an [E] one serves gate and up alike). */
static k3_status stacked_scale_read(k3_ckpt *ck, const char *name, int64_t e, int two, int pair, float *dst,
                                    char *err, size_t err_size) {
    float v[2];
    ST_TRY(k3_ckpt_read(ck, name, (uint64_t)e * (pair ? 2u : 1u) * sizeof(float), v, (pair ? 2u : 1u) * sizeof(float),
                        err, err_size));
    if (!pair) v[1] = v[0];
    for (int k = 0; k < (two ? 2 : 1); k++) {
        char what[440];
        snprintf(what, sizeof what, "%s[%lld%s]", name, (long long)e, pair ? (k ? ", 1" : ", 0") : "");
        ST_TRY(scale_value(what, v[k], 0, &dst[k], err, err_size));
    }
    return K3_STATUS_SUCCESS;
}

static const char *const stacked_parts[4] = {"w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale"};

static k3_status describe_stacked(k3_ckpt *ck, k3_ckpt_moe *m, char *err, size_t err_size) {
    const char *P = m->info.prefix;
    char name[400], got[160];
    const k3_st_tensor *t = NULL;
    snprintf(name, sizeof name, "%sw13_weight", P);
    ST_TRY(k3_ckpt_lookup(ck, name, &t, err, err_size));
    if (t->dtype != K3_ST_U8 || t->ndim != 3 || t->shape[0] <= 0 || t->shape[1] <= 0 || t->shape[1] % 2 ||
        t->shape[2] <= 0 || t->shape[2] > INT64_MAX / 2 || t->shape[0] > INT32_MAX) {
        shape_str(got, sizeof got, t->ndim, t->shape);
        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                         "tensor '%.200s': expected U8 [E, 2I, L/2] (packed FP4, 2I even), found %s %s", name,
                         k3_st_dtype_name(t->dtype), got);
    }
    m->num_experts = t->shape[0];
    m->info.num_experts = (int32_t)t->shape[0];
    m->inter = t->shape[1] / 2;
    m->hidden = t->shape[2] * 2;
    snprintf(name, sizeof name, "%sw13_weight_scale", P);
    ST_TRY(k3_ckpt_lookup(ck, name, &t, err, err_size));
    if (t->dtype != K3_ST_U8 && t->dtype != K3_ST_F8_E4M3)
        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                         "tensor '%.200s': expected U8 (MXFP4 UE8M0) or F8_E4M3 (NVFP4) block scales, found %s", name,
                         k3_st_dtype_name(t->dtype));
    if (t->ndim == 2)
        return k3_st_err(err, err_size, K3_STATUS_UNSUPPORTED,
                         "tensor '%.200s': 2-D scales are this library's 128x4-swizzled layout, which the checkpoint "
                         "reader does not take; write the layer with linear scales ([E, N, K/block])",
                         name);
    /* a file this library wrote says its layout; 3-D scales under a "swizzled" label contradict it */
    const char *lay = k3_ckpt_metadata(ck, "k3.quant.scale_layout");
    if (lay && strcmp(lay, "linear"))
        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                         "%s: __metadata__ k3.quant.scale_layout is '%.60s' but tensor '%.200s' has the linear "
                         "layout's 3-D shape",
                         k3_ckpt_path(ck), lay, name);
    const int nvfp4 = t->dtype == K3_ST_F8_E4M3;
    const k3_st_dtype sdt = t->dtype;
    const int64_t bs = nvfp4 ? 16 : 32, E = m->num_experts, L = m->hidden, I = m->inter;
    m->fp4 = nvfp4 ? K3_FP4_NVFP4 : K3_FP4_MXFP4;
    if (L % bs || I % bs)
        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                         "%sw13_weight: L = %lld and I = %lld must be multiples of the %s block size %lld", P,
                         (long long)L, (long long)I, nvfp4 ? "NVFP4" : "MXFP4", (long long)bs);
    if (!lay) { /* only a shape that one layout alone can have may decide it */
        const int hint = k3_ckpt_scale_layout(ck);
        if (hint == K3_SCALE_SWIZZLED)
            return k3_st_err(err, err_size, K3_STATUS_UNSUPPORTED,
                             "tensor '%.200s': the scales were given as 128x4-swizzled, which the checkpoint reader "
                             "does not take (it reads linear scales: k3 dequant, then k3 quant, rewrites them)",
                             name);
        if (hint < 0 && k3_scale_shape_ambiguous(2 * I, L / bs) && k3_scale_shape_ambiguous(L, I / bs))
            return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                             "%s: tensor '%.200s' [E, %lld, %lld] has the same shape in the linear and the "
                             "128x4-swizzled scale layouts (engines keep swizzled scales in this 3-D shape too), and "
                             "the file does not say which (__metadata__ k3.quant.scale_layout, which k3 writes): "
                             "give the layout (--scale-layout linear|swizzled; k3_checkpoint_set_scale_layout)",
                             k3_ckpt_path(ck), name, (long long)(2 * I), (long long)(L / bs));
    }
    ST_TRY(moe_sizes(m, err, err_size));
    char n13[400], n2[400];
    snprintf(n13, sizeof n13, "%sw13_input_scale", P);
    snprintf(n2, sizeof n2, "%sw2_input_scale", P);
    const int in13 = k3_ckpt_has(ck, n13), in2 = k3_ckpt_has(ck, n2);
    if (in13 != in2)
        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR, "tensor '%s' is there but '%s' is not",
                         in13 ? n13 : n2, in13 ? n2 : n13);
    m->info.has_input_scale = in13;
    const int64_t dims[4][2] = {{2 * I, L / 2}, {2 * I, L / bs}, {L, I / 2}, {L, I / bs}};
    for (int k = 0; k < 4; k++) {
        const int64_t sh[3] = {E, dims[k][0], dims[k][1]};
        snprintf(name, sizeof name, "%s%s", P, stacked_parts[k]);
        ST_TRY(want(ck, name, k % 2 ? sdt : K3_ST_U8, 3, sh, &t, err, err_size));
    }
    char g13[400], g2[400];
    snprintf(g13, sizeof g13, "%sw13_weight_scale_2", P);
    snprintf(g2, sizeof g2, "%sw2_weight_scale_2", P);
    int one = 0;
    if (nvfp4) {
        ST_TRY(stacked_scale_shape(ck, g13, E, 1, &m->pair13_scale_2, err, err_size));
        ST_TRY(stacked_scale_shape(ck, g2, E, 0, &one, err, err_size));
    } else if (k3_ckpt_has(ck, g13) || k3_ckpt_has(ck, g2)) {
        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                         "tensor '%s': MXFP4 experts (U8 block scales) take no global scale",
                         k3_ckpt_has(ck, g13) ? g13 : g2);
    }
    if (in13) {
        ST_TRY(stacked_scale_shape(ck, n13, E, 1, &m->pair13_input, err, err_size));
        ST_TRY(stacked_scale_shape(ck, n2, E, 0, &one, err, err_size));
    }
    return K3_STATUS_SUCCESS;
}

static k3_status read_stacked(k3_ckpt *ck, const k3_ckpt_moe *m, int64_t e, k3_ckpt_expert *x, char *err,
                              size_t err_size) {
    const char *P = m->info.prefix;
    const int nvfp4 = m->fp4 == K3_FP4_NVFP4;
    const int64_t E = m->num_experts, bs = nvfp4 ? 16 : 32;
    uint8_t *dst[4] = {x->w13, x->w13_scale, x->w2, x->w2_scale};
    const size_t per[4] = {m->w13_bytes / (size_t)E, m->w13_scale_bytes / (size_t)E, m->w2_bytes / (size_t)E,
                           m->w2_scale_bytes / (size_t)E};
    const int64_t cols[4] = {0, m->hidden / bs, 0, m->inter / bs};
    char name[400];
    for (int k = 0; k < 4; k++) {
        if (!dst[k]) continue;
        snprintf(name, sizeof name, "%s%s", P, stacked_parts[k]);
        ST_TRY(k3_ckpt_read(ck, name, (uint64_t)e * per[k], dst[k], per[k], err, err_size));
        if (k % 2)
            ST_TRY(check_block_scales(name, dst[k], per[k], (size_t)e * per[k], cols[k], nvfp4, err, err_size));
    }
    if (nvfp4) {
        snprintf(name, sizeof name, "%sw13_weight_scale_2", P);
        ST_TRY(stacked_scale_read(ck, name, e, 1, m->pair13_scale_2, x->w13_scale_2, err, err_size));
        snprintf(name, sizeof name, "%sw2_weight_scale_2", P);
        ST_TRY(stacked_scale_read(ck, name, e, 0, 0, &x->w2_scale_2, err, err_size));
    }
    if (m->info.has_input_scale) {
        snprintf(name, sizeof name, "%sw13_input_scale", P);
        ST_TRY(stacked_scale_read(ck, name, e, 1, m->pair13_input, x->w13_input_scale, err, err_size));
        snprintf(name, sizeof name, "%sw2_input_scale", P);
        ST_TRY(stacked_scale_read(ck, name, e, 0, 0, &x->w2_input_scale, err, err_size));
    }
    return K3_STATUS_SUCCESS;
}

k3_status k3_ckpt_moe_describe(k3_ckpt *ck, int32_t layer, k3_ckpt_moe *out, char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!out) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_ckpt_moe_describe: out is NULL");
    memset(out, 0, sizeof *out);
    if (!ck) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_ckpt_moe_describe: ck is NULL");
    k3_status st = k3_ckpt_moe_detect(ck, layer, &out->info, err, err_size);
    if (st == K3_STATUS_SUCCESS)
        st = out->info.format == K3_CKPT_MOE_STACKED ? describe_stacked(ck, out, err, err_size)
                                                     : describe_per_expert(ck, out, err, err_size);
    if (st != K3_STATUS_SUCCESS) memset(out, 0, sizeof *out);
    return st;
}

k3_status k3_ckpt_moe_read_expert(k3_ckpt *ck, const k3_ckpt_moe *m, int64_t e, k3_ckpt_expert *x, char *err,
                                  size_t err_size) {
    if (!ck || !m || !x)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_ckpt_moe_read_expert: NULL argument");
    if (e < 0 || e >= m->num_experts)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "expert %lld: the layer has experts 0..%lld",
                         (long long)e, (long long)m->num_experts - 1);
    return m->info.format == K3_CKPT_MOE_STACKED ? read_stacked(ck, m, e, x, err, err_size)
                                                 : read_per_expert(ck, m, e, x, err, err_size);
}

k3_status k3_ckpt_load_moe(k3_ckpt *ck, int32_t layer, k3_ckpt_moe *out, char *err, size_t err_size) {
    k3_status st = k3_ckpt_moe_describe(ck, layer, out, err, err_size);
    if (st == K3_STATUS_SUCCESS) st = alloc_moe(out, err, err_size);
    const int64_t E = out ? out->num_experts : 0;
    for (int64_t e = 0; st == K3_STATUS_SUCCESS && e < E; e++) {
        /* each expert lands in its place in the stacked buffers: no staging copy */
        k3_ckpt_expert x = {.w13 = out->w13 + (size_t)e * (out->w13_bytes / (size_t)E),
                            .w13_scale = out->w13_scale + (size_t)e * (out->w13_scale_bytes / (size_t)E),
                            .w2 = out->w2 + (size_t)e * (out->w2_bytes / (size_t)E),
                            .w2_scale = out->w2_scale + (size_t)e * (out->w2_scale_bytes / (size_t)E)};
        st = k3_ckpt_moe_read_expert(ck, out, e, &x, err, err_size);
        if (st != K3_STATUS_SUCCESS) break;
        if (out->w13_scale_2) {
            out->w13_scale_2[e * 2] = x.w13_scale_2[0], out->w13_scale_2[e * 2 + 1] = x.w13_scale_2[1];
            out->w2_scale_2[e] = x.w2_scale_2;
        }
        if (out->w13_input_scale) {
            out->w13_input_scale[e * 2] = x.w13_input_scale[0], out->w13_input_scale[e * 2 + 1] = x.w13_input_scale[1];
            out->w2_input_scale[e] = x.w2_input_scale;
        }
    }
    if (st != K3_STATUS_SUCCESS && out) k3_ckpt_moe_free(out);
    return st;
}
