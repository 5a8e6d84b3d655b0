/* Synthetic latent-MoE block weights for the CLI's demo and block benchmark: drawn directly in storage form from a
 * fixed seed (FP4 codes uniformly random bytes, e4m3 block scales random codes in [0.5, 1.875], scale_2 per expert
 * so a dequantized weight has rms 1/sqrt(K); BF16 dense weights uniform with std 1/sqrt(K)). Quantizing billions
 * of fp32 values would take minutes and tell nothing more about speed. */
#ifndef K3_TOOLS_BLOCK_SYNTH_H
#define K3_TOOLS_BLOCK_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "cli_mem.h"
#include "k3.h"

/* xorshift64*: fast enough to fill 2 GB in about a second. */
typedef struct {
    uint64_t s;
} k3_synth_rng;
uint64_t k3_synth_next(k3_synth_rng *r);
float k3_synth_unit(k3_synth_rng *r); /* uniform in [-1, 1) */
void k3_synth_bytes(k3_synth_rng *r, uint8_t *p, size_t n);
void k3_synth_scales(k3_synth_rng *r, uint8_t *p, size_t n); /* e4m3 codes 0x30..0x3f */
void k3_synth_bf16(k3_synth_rng *r, uint16_t *p, size_t n, double sd);

/* A block's host weights: d says the shapes (the router's E may exceed the experts', for an EP rank). */
typedef struct k3_synth_block {
    k3_latent_moe_desc d;
    k3_latent_moe_weights w;
    void *buf[16];
    size_t size[16];
    int nbuf;
    size_t bytes_fp4, bytes_dense;
} k3_synth_block;

/* The K3-style descriptor (router and experts with e experts, top-k, ...). */
void k3_synth_block_desc(k3_latent_moe_desc *d, int32_t e, int32_t k, int64_t h, int64_t l, int64_t in, int64_t is,
                         int64_t max_m);
/* Synthesizes the weights of b->d (NVFP4 experts, linear scales, shared scale_2); 0 when out of memory. */
int k3_synth_block_make(k3_synth_block *b, k3_synth_rng *r);
void k3_synth_block_free(k3_synth_block *b);
/* The size of the block's host buffer p (0 when p is none of them, e.g. NULL). */
size_t k3_synth_block_size_of(const k3_synth_block *b, const void *p);
/* The block's weights as the context sees them (device copies on CUDA, the host buffers on the CPU). */
int k3_synth_block_weights_in(const k3_synth_block *b, k3_cli_mem *mm, k3_latent_moe_weights *dw);

#endif
