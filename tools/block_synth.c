/* Synthetic latent-MoE block weights (see block_synth.h). */
#include "block_synth.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

uint64_t k3_synth_next(k3_synth_rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1DULL;
}
/* uniform in [-1, 1) */
float k3_synth_unit(k3_synth_rng *r) { return (float)((double)(k3_synth_next(r) >> 40) * (2.0 / 16777216.0) - 1.0); }

void k3_synth_bytes(k3_synth_rng *r, uint8_t *p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = k3_synth_next(r);
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++) p[i] = (uint8_t)(k3_synth_next(r) >> 56);
}

/* e4m3 codes 0x30..0x3f: 0.5 .. 1.875 (mean ~1.08, rms ~1.14) */
void k3_synth_scales(k3_synth_rng *r, uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        uint64_t v = k3_synth_next(r);
        for (size_t j = 0; j < 16 && i + j < n; j++) p[i + j] = (uint8_t)(0x30 + ((v >> (4 * j)) & 15));
    }
}

/* BF16 uniform values with standard deviation sd. */
void k3_synth_bf16(k3_synth_rng *r, uint16_t *p, size_t n, double sd) {
    const float a = (float)(sd * sqrt(3.0));
    for (size_t i = 0; i < n; i++) p[i] = k3_bf16_from_f32(a * k3_synth_unit(r));
}


static void *synth_alloc(k3_synth_block *b, size_t n) {
    void *p = malloc(n ? n : 1);
    if (p) {
        b->size[b->nbuf] = n;
        b->buf[b->nbuf++] = p;
    }
    return p;
}

void k3_synth_block_free(k3_synth_block *b) {
    for (int i = 0; i < b->nbuf; i++) free(b->buf[i]);
    b->nbuf = 0;
}

/* The size of the block's host buffer p (0 when p is not one of them, e.g. NULL). */
size_t k3_synth_block_size_of(const k3_synth_block *b, const void *p) {
    for (int i = 0; p && i < b->nbuf; i++)
        if (b->buf[i] == p) return b->size[i];
    return 0;
}

/* The block's weights as the context sees them (device copies on CUDA, the host buffers on the CPU). */
int k3_synth_block_weights_in(const k3_synth_block *b, k3_cli_mem *mm, k3_latent_moe_weights *dw) {
    int ok = 1;
#define K3_DEMO_IN(field) (field) = k3_cli_mem_in(mm, (field), k3_synth_block_size_of(b, (field)), &ok)
    *dw = b->w;
    K3_DEMO_IN(dw->gate);
    K3_DEMO_IN(dw->bias);
    K3_DEMO_IN(dw->down_proj);
    K3_DEMO_IN(dw->norm);
    K3_DEMO_IN(dw->up_proj);
    K3_DEMO_IN(dw->shared_gate_up);
    K3_DEMO_IN(dw->shared_down);
    K3_DEMO_IN(dw->experts.w13);
    K3_DEMO_IN(dw->experts.w13_scale);
    K3_DEMO_IN(dw->experts.w13_scale_2);
    K3_DEMO_IN(dw->experts.w2);
    K3_DEMO_IN(dw->experts.w2_scale);
    K3_DEMO_IN(dw->experts.w2_scale_2);
#undef K3_DEMO_IN
    return ok;
}

/* Synthesizes the weights of descriptor b->d (NVFP4 experts, linear scales, shared scale_2). */
int k3_synth_block_make(k3_synth_block *b, k3_synth_rng *r) {
    const k3_latent_moe_desc *d = &b->d;
    const int64_t e = d->experts.num_experts, l = d->experts.hidden, in = d->experts.inter, h = d->hidden;
    const int64_t is = d->shared_inter, eg = d->router.num_experts; /* eg > e: an EP rank's router */
    const size_t w13n = (size_t)(e * 2 * in * l), w2n = (size_t)(e * l * in);
    uint8_t *w13 = synth_alloc(b, w13n / 2), *w2 = synth_alloc(b, w2n / 2);
    uint8_t *s13 = synth_alloc(b, w13n / 16), *s2 = synth_alloc(b, w2n / 16);
    float *g13 = synth_alloc(b, sizeof(float) * (size_t)e), *g2 = synth_alloc(b, sizeof(float) * (size_t)e);
    uint16_t *gate = synth_alloc(b, 2 * (size_t)(eg * h)), *down = synth_alloc(b, 2 * (size_t)(l * h));
    uint16_t *norm = synth_alloc(b, 2 * (size_t)l), *up = synth_alloc(b, 2 * (size_t)(h * l));
    uint16_t *sgu = synth_alloc(b, 2 * (size_t)(2 * is * h)), *sd = synth_alloc(b, 2 * (size_t)(h * is));
    float *bias = synth_alloc(b, sizeof(float) * (size_t)eg);
    if (b->nbuf != 13) return 0;
    k3_synth_bytes(r, w13, w13n / 2);
    k3_synth_bytes(r, w2, w2n / 2);
    k3_synth_scales(r, s13, w13n / 16);
    k3_synth_scales(r, s2, w2n / 16);
    /* rms(code value) ~ 2.93 and rms(block scale) ~ 1.14: scale_2 = target / (2.93 * 1.14) */
    for (int64_t i = 0; i < e; i++) {
        g13[i] = (float)(1.0 / sqrt((double)l) / 3.34 * (0.9 + 0.1 * k3_synth_unit(r)));
        g2[i] = (float)(1.0 / sqrt((double)in) / 3.34 * (0.9 + 0.1 * k3_synth_unit(r)));
    }
    for (int64_t i = 0; i < eg; i++) bias[i] = 0.01f * k3_synth_unit(r);
    k3_synth_bf16(r, gate, (size_t)(eg * h), 1.0 / sqrt((double)h));
    k3_synth_bf16(r, down, (size_t)(l * h), 1.0 / sqrt((double)h));
    for (int64_t i = 0; i < l; i++) norm[i] = k3_bf16_from_f32(1.0f + 0.1f * k3_synth_unit(r));
    k3_synth_bf16(r, up, (size_t)(h * l), 1.0 / sqrt((double)l));
    k3_synth_bf16(r, sgu, (size_t)(2 * is * h), 1.0 / sqrt((double)h));
    k3_synth_bf16(r, sd, (size_t)(h * is), 1.0 / sqrt((double)is));
    memset(&b->w, 0, sizeof b->w);
    b->w.gate = gate;
    b->w.bias = bias;
    b->w.down_proj = down;
    b->w.norm = norm;
    b->w.up_proj = up;
    b->w.shared_gate_up = sgu;
    b->w.shared_down = sd;
    b->w.experts.w13 = w13;
    b->w.experts.w13_scale = s13;
    b->w.experts.w13_scale_2 = g13;
    b->w.experts.w2 = w2;
    b->w.experts.w2_scale = s2;
    b->w.experts.w2_scale_2 = g2;
    b->bytes_fp4 = (w13n + w2n) / 2 + (w13n + w2n) / 16 + 8 * (size_t)e;
    b->bytes_dense = 2 * (size_t)(eg * h + 2 * l * h + l + 3 * is * h) + 4 * (size_t)eg;
    return 1;
}

void k3_synth_block_desc(k3_latent_moe_desc *d, int32_t e, int32_t k, int64_t h, int64_t l, int64_t in, int64_t is,
                       int64_t max_m) {
    k3_latent_moe_desc_init(d);
    d->hidden = d->router.hidden = h;
    d->router.num_experts = d->experts.num_experts = e;
    d->router.top_k = d->experts.top_k = k;
    d->experts.hidden = l;
    d->experts.inter = in;
    d->shared_inter = is;
    d->max_tokens = max_m;
}
