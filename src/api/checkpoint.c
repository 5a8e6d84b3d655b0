/* The public checkpoint API: one layer's experts and block tensors read through the internal checkpoint reader
 * (io/checkpoint.h) into a library-allocated k3_moe_layer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "io/st_common.h"
#include "k3.h"

struct k3_checkpoint {
    k3_ckpt *ck;
};

/* The public struct first, so a k3_moe_layer pointer is the owner's pointer too. */
typedef struct moe_layer_owner {
    k3_moe_layer pub;
    k3_ckpt_moe moe;
    k3_ckpt_block block;
} moe_layer_owner;

k3_status k3_checkpoint_open(const char *path, k3_checkpoint **out, char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!out) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_checkpoint_open: out must not be NULL");
    *out = NULL;
    k3_checkpoint *c = calloc(1, sizeof *c);
    if (!c) return k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "k3_checkpoint_open: out of memory");
    const k3_status st = k3_ckpt_open(path, &c->ck, err, err_size);
    if (st != K3_STATUS_SUCCESS) {
        free(c);
        return st;
    }
    *out = c;
    return K3_STATUS_SUCCESS;
}

void k3_checkpoint_close(k3_checkpoint *ck) {
    if (!ck) return;
    k3_ckpt_close(ck->ck);
    free(ck);
}

k3_status k3_checkpoint_set_scale_layout(k3_checkpoint *ck, k3_scale_layout layout) {
    if (!ck || (layout != K3_SCALE_LINEAR && layout != K3_SCALE_SWIZZLED)) return K3_STATUS_INVALID_ARGUMENT;
    k3_ckpt_set_scale_layout(ck->ck, (int)layout);
    return K3_STATUS_SUCCESS;
}

void k3_moe_layer_free(k3_moe_layer *layer) {
    if (!layer) return;
    moe_layer_owner *o = (moe_layer_owner *)layer;
    k3_ckpt_moe_free(&o->moe);
    k3_ckpt_block_free(&o->block);
    free(o);
}

static k3_checkpoint_format public_format(k3_ckpt_moe_format f) {
    switch (f) {
    case K3_CKPT_MOE_CT_MXFP4: return K3_CHECKPOINT_CT_MXFP4;
    case K3_CKPT_MOE_CT_NVFP4: return K3_CHECKPOINT_CT_NVFP4;
    case K3_CKPT_MOE_MODELOPT_NVFP4: return K3_CHECKPOINT_MODELOPT_NVFP4;
    default: return K3_CHECKPOINT_STACKED;
    }
}

/* The block's tensors must sit under the experts' layer prefix (a stacked prefix may end in "experts."). */
static k3_status same_prefix(const k3_ckpt_moe *m, const k3_ckpt_block *b, int32_t layer, char *err,
                             size_t err_size) {
    const k3_ckpt_block_info *in = &b->info;
    if (!in->has[K3_CKPT_BLOCK_ROUTER] && !in->has[K3_CKPT_BLOCK_SHARED] && !in->has[K3_CKPT_BLOCK_LATENT])
        return K3_STATUS_SUCCESS;
    const char *ep = m->info.prefix;
    size_t n = strlen(ep);
    if (m->info.format == K3_CKPT_MOE_STACKED && n >= 8 && !strcmp(ep + n - 8, "experts.")) n -= 8;
    if (strlen(in->prefix) == n && !strncmp(in->prefix, ep, n)) return K3_STATUS_SUCCESS;
    return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                     "layer %d: the experts are under '%s' but the router / shared / latent tensors under '%s'; "
                     "one layer's tensors must share a prefix",
                     (int)layer, ep, in->prefix);
}

static void fill_public(moe_layer_owner *o, int32_t layer) {
    k3_moe_layer *p = &o->pub;
    const k3_ckpt_moe *m = &o->moe;
    const k3_ckpt_block *b = &o->block;
    p->layer = layer;
    p->source_format = public_format(m->info.format);
    p->fp4 = m->fp4;
    p->num_experts = (int32_t)m->num_experts;
    p->latent = m->hidden;
    p->inter = m->inter;
    p->w13 = m->w13, p->w13_scale = m->w13_scale, p->w2 = m->w2, p->w2_scale = m->w2_scale;
    p->w13_bytes = m->w13_bytes, p->w13_scale_bytes = m->w13_scale_bytes;
    p->w2_bytes = m->w2_bytes, p->w2_scale_bytes = m->w2_scale_bytes;
    p->w13_scale_2 = m->w13_scale_2, p->w2_scale_2 = m->w2_scale_2;
    p->w13_input_scale = m->w13_input_scale, p->w2_input_scale = m->w2_input_scale;
    p->hidden = b->info.hidden;
    p->shared_inter = b->info.shared_inter;
    p->gate_dtype = b->gate_dtype == K3_ST_F32 ? K3_DTYPE_F32 : K3_DTYPE_BF16;
    p->gate = b->gate, p->bias = b->bias;
    p->shared_gate_up = b->shared_gate_up, p->shared_down = b->shared_down;
    p->down_proj = b->down_proj, p->norm = b->norm, p->up_proj = b->up_proj;
    p->gate_bytes = b->gate_bytes, p->bias_bytes = b->bias_bytes;
    p->shared_gate_up_bytes = b->shared_gate_up_bytes, p->shared_down_bytes = b->shared_down_bytes;
    p->down_proj_bytes = b->down_proj_bytes, p->norm_bytes = b->norm_bytes, p->up_proj_bytes = b->up_proj_bytes;
}

k3_status k3_checkpoint_load_moe_layer(k3_checkpoint *ck, int32_t layer, k3_moe_layer **out, char *err,
                                       size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!out)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT,
                         "k3_checkpoint_load_moe_layer: out must not be NULL");
    *out = NULL;
    if (!ck)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT,
                         "k3_checkpoint_load_moe_layer: ck must not be NULL");
    if (layer < 0)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT,
                         "k3_checkpoint_load_moe_layer: layer %d: a layer number is >= 0", (int)layer);
    moe_layer_owner *o = calloc(1, sizeof *o);
    if (!o) return k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "k3_checkpoint_load_moe_layer: out of memory");
    k3_status st = k3_ckpt_load_moe(ck->ck, layer, &o->moe, err, err_size);
    if (st == K3_STATUS_SUCCESS)
        st = k3_ckpt_load_block(ck->ck, layer, o->moe.num_experts, o->moe.hidden, &o->block, err, err_size);
    if (st == K3_STATUS_SUCCESS) st = same_prefix(&o->moe, &o->block, layer, err, err_size);
    if (st != K3_STATUS_SUCCESS) {
        k3_moe_layer_free(&o->pub);
        return st;
    }
    fill_public(o, layer);
    *out = &o->pub;
    return K3_STATUS_SUCCESS;
}
