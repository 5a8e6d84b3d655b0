/* The MoE block's tensors besides the experts: the router, the shared experts and the latent projections of one
 * layer, found by either naming and checked against the experts' E and L; see io/checkpoint.h. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "io/st_common.h"

/* A group's member names: published (index 0) and this library's stacked names (index 1); NULL = none. */
typedef struct block_member {
    const char *names[2];
    int optional; /* the router's bias */
} block_member;

#define BLOCK_MEMBERS 4
static const block_member k3_block_groups[K3_CKPT_BLOCK_GROUPS][BLOCK_MEMBERS] = {
    /* router */
    {{{"gate.weight", "gate_weight"}, 0}, {{"gate.e_score_correction_bias", "e_score_correction_bias"}, 1}},
    /* shared experts: the published gate and up are one stacked tensor here */
    {{{"shared_experts.gate_proj.weight", "shared_gate_up_weight"}, 0},
     {{"shared_experts.up_proj.weight", NULL}, 0},
     {{"shared_experts.down_proj.weight", "shared_down_weight"}, 0}},
    /* latent projections */
    {{{"routed_expert_down_proj.weight", "down_proj_weight"}, 0},
     {{"routed_expert_norm.weight", "norm_weight"}, 0},
     {{"routed_expert_up_proj.weight", "up_proj_weight"}, 0}},
};
static const char *const k3_group_names[K3_CKPT_BLOCK_GROUPS] = {"router tensors", "shared-expert tensors",
                                                                  "latent-projection tensors"};

static int has_name(const k3_ckpt *ck, const char *prefix, const char *suffix, char *name, size_t n) {
    if (!suffix) return 0;
    snprintf(name, n, "%s%s", prefix, suffix);
    return k3_ckpt_has(ck, name);
}

/* 1 when any member of any group is there under prefix. */
static int prefix_has_block(const k3_ckpt *ck, const char *prefix) {
    char name[400];
    for (int g = 0; g < K3_CKPT_BLOCK_GROUPS; g++)
        for (int m = 0; m < BLOCK_MEMBERS; m++)
            for (int s = 0; s < 2; s++)
                if (has_name(ck, prefix, k3_block_groups[g][m].names[s], name, sizeof name)) return 1;
    return 0;
}

static void shape_text(char *buf, size_t n, int32_t ndim, const int64_t *shape) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int32_t i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* The header of tensor `name` into *bt, checked against the dtype (or either of two, dt2 >= 0) and shape
   (a dim < 0 is taken from the file). */
static k3_status member_header(k3_ckpt *ck, const char *name, k3_st_dtype dt, int dt2, int32_t ndim,
                               const int64_t *shape, k3_ckpt_block_tensor *bt, char *err, size_t err_size) {
    const k3_st_tensor *t = NULL;
    ST_TRY(k3_ckpt_lookup(ck, name, &t, err, err_size));
    int ok = (t->dtype == dt || (dt2 >= 0 && t->dtype == (k3_st_dtype)dt2)) && t->ndim == ndim;
    for (int32_t i = 0; ok && i < ndim; i++) ok = t->shape[i] > 0 && (shape[i] < 0 || t->shape[i] == shape[i]);
    if (!ok) {
        char want_s[160], got_s[160], dts[40];
        int64_t shown[2] = {0, 0};
        for (int32_t i = 0; i < ndim; i++) shown[i] = shape[i];
        shape_text(want_s, sizeof want_s, ndim, shown);
        shape_text(got_s, sizeof got_s, t->ndim, t->shape);
        snprintf(dts, sizeof dts, "%s%s%s", k3_st_dtype_name(dt), dt2 >= 0 ? " or " : "",
                 dt2 >= 0 ? k3_st_dtype_name((k3_st_dtype)dt2) : "");
        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR, "tensor '%.200s': expected %s %s%s, found %s %s",
                         name, dts, want_s, strstr(want_s, "-1") ? " (-1: any size > 0)" : "",
                         k3_st_dtype_name(t->dtype), got_s);
    }
    snprintf(bt->name, sizeof bt->name, "%s", name);
    bt->dtype = t->dtype;
    bt->ndim = t->ndim;
    for (int32_t i = 0; i < ndim; i++) bt->shape[i] = t->shape[i];
    return K3_STATUS_SUCCESS;
}

/* Which naming group g uses under prefix (-1: absent); a group named both ways or only partly is an error. */
static k3_status group_naming(const k3_ckpt *ck, int32_t layer, const char *prefix, int g, int *naming, char *err,
                              size_t err_size) {
    char name[400], other[400];
    int count[2] = {0, 0}, first[2] = {-1, -1};
    for (int s = 0; s < 2; s++)
        for (int m = 0; m < BLOCK_MEMBERS; m++)
            if (has_name(ck, prefix, k3_block_groups[g][m].names[s], name, sizeof name)) {
                count[s]++;
                if (first[s] < 0) first[s] = m;
            }
    *naming = -1;
    if (count[0] && count[1]) {
        snprintf(name, sizeof name, "%s%s", prefix, k3_block_groups[g][first[0]].names[0]);
        snprintf(other, sizeof other, "%s%s", prefix, k3_block_groups[g][first[1]].names[1]);
        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                         "layer %d: the %s are named both ways ('%.200s' and '%.200s'): which one is meant is "
                         "ambiguous",
                         (int)layer, k3_group_names[g], name, other);
    }
    const int s = count[0] ? 0 : count[1] ? 1 : -1;
    if (s < 0) return K3_STATUS_SUCCESS;
    for (int m = 0; m < BLOCK_MEMBERS; m++) {
        const block_member *bm = &k3_block_groups[g][m];
        if (!bm->names[s] || bm->optional || has_name(ck, prefix, bm->names[s], name, sizeof name)) continue;
        snprintf(other, sizeof other, "%s%s", prefix, k3_block_groups[g][first[s]].names[s]);
        /* a quantized shared expert ("...weight_packed") is not the BF16 one this library runs */
        char packed[420];
        snprintf(packed, sizeof packed, "%s_packed", name);
        const int quantized = k3_ckpt_has(ck, packed);
        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                         "layer %d: the %s are incomplete: '%.200s' is there but tensor '%.200s' is missing%s",
                         (int)layer, k3_group_names[g], other, name,
                         quantized ? " (it is quantized, '..._packed': shared experts must be BF16)" : "");
    }
    *naming = s;
    return K3_STATUS_SUCCESS;
}

k3_status k3_ckpt_block_detect(k3_ckpt *ck, int32_t layer, int64_t num_experts, int64_t latent,
                               k3_ckpt_block_info *info, char *err, size_t err_size) {
    if (!ck || !info)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_ckpt_block_detect: NULL argument");
    memset(info, 0, sizeof *info);
    if (layer < 0)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "layer %d: a layer number is >= 0", (int)layer);
    if (num_experts < 1 || latent < 1)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT,
                         "k3_ckpt_block_detect: the experts' E = %lld and L = %lld must be >= 1",
                         (long long)num_experts, (long long)latent);
    char prefixes[3][160];
    snprintf(prefixes[0], sizeof prefixes[0], "model.layers.%d.mlp.", (int)layer);
    snprintf(prefixes[1], sizeof prefixes[1], "language_model.model.layers.%d.mlp.", (int)layer);
    prefixes[2][0] = '\0';
    int pi = 0;
    while (pi < 3 && !prefix_has_block(ck, prefixes[pi])) pi++;
    info->num_experts = num_experts;
    info->latent = latent;
    if (pi == 3) return K3_STATUS_SUCCESS;
    const char *P = prefixes[pi];
    snprintf(info->prefix, sizeof info->prefix, "%s", P);
    int naming[K3_CKPT_BLOCK_GROUPS];
    for (int g = 0; g < K3_CKPT_BLOCK_GROUPS; g++) {
        ST_TRY(group_naming(ck, layer, P, g, &naming[g], err, err_size));
        info->has[g] = naming[g] >= 0;
        info->stacked[g] = naming[g] == 1;
    }
    char name[400];
    const k3_st_dtype BF = K3_ST_BF16;
    int64_t H = -1; /* from the first tensor that has it; every later one must agree */
    if (info->has[K3_CKPT_BLOCK_LATENT]) {
        const int s = naming[K3_CKPT_BLOCK_LATENT];
        const int64_t sd[2] = {latent, -1};
        snprintf(name, sizeof name, "%s%s", P, k3_block_groups[2][0].names[s]);
        ST_TRY(member_header(ck, name, BF, -1, 2, sd, &info->down_proj, err, err_size));
        H = info->down_proj.shape[1];
        const int64_t sn[1] = {latent}, su[2] = {H, latent};
        snprintf(name, sizeof name, "%s%s", P, k3_block_groups[2][1].names[s]);
        ST_TRY(member_header(ck, name, BF, -1, 1, sn, &info->norm, err, err_size));
        snprintf(name, sizeof name, "%s%s", P, k3_block_groups[2][2].names[s]);
        ST_TRY(member_header(ck, name, BF, -1, 2, su, &info->up_proj, err, err_size));
    }
    if (info->has[K3_CKPT_BLOCK_ROUTER]) {
        const int s = naming[K3_CKPT_BLOCK_ROUTER];
        /* without latent projections the router reads the experts' own input: H = L */
        const int64_t sg[2] = {num_experts, H > 0 ? H : latent}, sb[1] = {num_experts};
        snprintf(name, sizeof name, "%s%s", P, k3_block_groups[0][0].names[s]);
        ST_TRY(member_header(ck, name, BF, K3_ST_F32, 2, sg, &info->gate, err, err_size));
        H = info->gate.shape[1];
        snprintf(name, sizeof name, "%s%s", P, k3_block_groups[0][1].names[s]);
        if (k3_ckpt_has(ck, name)) {
            ST_TRY(member_header(ck, name, K3_ST_F32, -1, 1, sb, &info->bias, err, err_size));
            info->has_bias = 1;
        }
    }
    if (info->has[K3_CKPT_BLOCK_SHARED]) {
        const int s = naming[K3_CKPT_BLOCK_SHARED];
        const int64_t hh = H > 0 ? H : latent;
        const int64_t sd[2] = {hh, -1};
        snprintf(name, sizeof name, "%s%s", P, k3_block_groups[1][2].names[s]);
        ST_TRY(member_header(ck, name, BF, -1, 2, sd, &info->shared_down, err, err_size));
        const int64_t is = info->shared_down.shape[1];
        if (is > INT64_MAX / 2)
            return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR, "tensor '%.200s': Is = %lld is too large",
                             info->shared_down.name, (long long)is);
        const int64_t sg[2] = {s ? 2 * is : is, hh};
        snprintf(name, sizeof name, "%s%s", P, k3_block_groups[1][0].names[s]);
        ST_TRY(member_header(ck, name, BF, -1, 2, sg, &info->shared_gate, err, err_size));
        if (!s) {
            snprintf(name, sizeof name, "%s%s", P, k3_block_groups[1][1].names[0]);
            ST_TRY(member_header(ck, name, BF, -1, 2, sg, &info->shared_up, err, err_size));
        }
        info->shared_inter = is;
        H = hh;
    }
    info->hidden = H > 0 ? H : latent;
    return K3_STATUS_SUCCESS;
}

void k3_ckpt_block_free(k3_ckpt_block *b) {
    if (!b) return;
    free(b->gate);
    free(b->bias);
    free(b->shared_gate_up);
    free(b->shared_down);
    free(b->down_proj);
    free(b->norm);
    free(b->up_proj);
    memset(b, 0, sizeof *b);
}

/* NaN or Inf in the router or the norm would spread silently into every output. */
static k3_status check_finite(const k3_st_tensor *t, char *err, size_t err_size) {
    const size_t n = t->nbytes / k3_st_dtype_size(t->dtype);
    for (size_t i = 0; i < n; i++) {
        float v;
        if (t->dtype == K3_ST_F32) {
            memcpy(&v, (const float *)t->data + i, sizeof v);
        } else {
            uint16_t h;
            memcpy(&h, (const uint16_t *)t->data + i, sizeof h);
            const uint32_t b = (uint32_t)h << 16;
            memcpy(&v, &b, sizeof v);
        }
        if (!isfinite(v))
            return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR, "tensor '%.200s': element %zu is %s", t->name, i,
                             isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf");
    }
    return K3_STATUS_SUCCESS;
}

/* A copy of the tensor bt names into dst + off (dst allocated with `total` bytes on first use). */
static k3_status copy_member(k3_ckpt *ck, const k3_ckpt_block_tensor *bt, int finite, void **dst, size_t total,
                             size_t off, size_t *bytes, char *err, size_t err_size) {
    const k3_st_tensor *t = NULL;
    ST_TRY(k3_ckpt_find(ck, bt->name, &t, err, err_size));
    if (finite) ST_TRY(check_finite(t, err, err_size));
    if (off > total || t->nbytes > total - off)
        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR, "tensor '%.200s': %zu bytes do not fit (%zu)",
                         bt->name, t->nbytes, total);
    if (!*dst && !(*dst = malloc(total ? total : 1)))
        return k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "tensor '%.200s': out of memory (%zu bytes)",
                         bt->name, total);
    memcpy((uint8_t *)*dst + off, t->data, t->nbytes);
    *bytes = total;
    return K3_STATUS_SUCCESS;
}

static size_t bytes_of(const k3_ckpt_block_tensor *bt) {
    int ok = 1;
    const size_t n = k3_st_tensor_bytes(bt->dtype, bt->ndim, bt->shape, &ok);
    return ok ? n : 0;
}

static k3_status load_groups(k3_ckpt *ck, k3_ckpt_block *b, char *err, size_t err_size) {
    const k3_ckpt_block_info *in = &b->info;
    if (in->has[K3_CKPT_BLOCK_ROUTER]) {
        b->gate_dtype = in->gate.dtype;
        ST_TRY(copy_member(ck, &in->gate, 1, &b->gate, bytes_of(&in->gate), 0, &b->gate_bytes, err, err_size));
        if (in->has_bias)
            ST_TRY(copy_member(ck, &in->bias, 1, (void **)&b->bias, bytes_of(&in->bias), 0, &b->bias_bytes, err,
                               err_size));
    }
    if (in->has[K3_CKPT_BLOCK_SHARED]) {
        const int stacked = in->stacked[K3_CKPT_BLOCK_SHARED];
        const size_t g = bytes_of(&in->shared_gate), u = stacked ? 0 : bytes_of(&in->shared_up);
        if (!g || (!stacked && (!u || g > SIZE_MAX - u)))
            return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR, "tensor '%.200s': the byte size overflows",
                             in->shared_gate.name);
        ST_TRY(copy_member(ck, &in->shared_gate, 0, (void **)&b->shared_gate_up, g + u, 0, &b->shared_gate_up_bytes,
                           err, err_size));
        if (u)
            ST_TRY(copy_member(ck, &in->shared_up, 0, (void **)&b->shared_gate_up, g + u, g, &b->shared_gate_up_bytes,
                               err, err_size));
        ST_TRY(copy_member(ck, &in->shared_down, 0, (void **)&b->shared_down, bytes_of(&in->shared_down), 0,
                           &b->shared_down_bytes, err, err_size));
    }
    if (in->has[K3_CKPT_BLOCK_LATENT]) {
        ST_TRY(copy_member(ck, &in->down_proj, 0, (void **)&b->down_proj, bytes_of(&in->down_proj), 0,
                           &b->down_proj_bytes, err, err_size));
        ST_TRY(copy_member(ck, &in->norm, 1, (void **)&b->norm, bytes_of(&in->norm), 0, &b->norm_bytes, err,
                           err_size));
        ST_TRY(copy_member(ck, &in->up_proj, 0, (void **)&b->up_proj, bytes_of(&in->up_proj), 0, &b->up_proj_bytes,
                           err, err_size));
    }
    return K3_STATUS_SUCCESS;
}

k3_status k3_ckpt_load_block(k3_ckpt *ck, int32_t layer, int64_t num_experts, int64_t latent, k3_ckpt_block *out,
                             char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!out) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_ckpt_load_block: out must not be NULL");
    memset(out, 0, sizeof *out);
    if (!ck) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_ckpt_load_block: ck must not be NULL");
    k3_status st = k3_ckpt_block_detect(ck, layer, num_experts, latent, &out->info, err, err_size);
    if (st == K3_STATUS_SUCCESS) st = load_groups(ck, out, err, err_size);
    if (st != K3_STATUS_SUCCESS) k3_ckpt_block_free(out);
    return st;
}
