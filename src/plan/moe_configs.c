#include "plan/moe_configs.h"

#include <stddef.h>

static const k3_moe_g1_config g1_configs[] = {
#define K3_MOE_G1(name, fmt, gated, nt, async, fold, pair, early, bpsm) {#name, fmt, gated, nt, async, fold, pair, early, bpsm},
#define K3_MOE_G2(name, fmt, nt, ks, async, fold, minb, direct, tiles, bpsm)
#include "plan/moe_configs.def"
#undef K3_MOE_G1
#undef K3_MOE_G2
};

static const k3_moe_g2_config g2_configs[] = {
#define K3_MOE_G1(name, fmt, gated, nt, async, fold, pair, early, bpsm)
#define K3_MOE_G2(name, fmt, nt, ks, async, fold, minb, direct, tiles, bpsm) {#name, fmt, nt, ks, async, fold, minb, direct, tiles, bpsm},
#include "plan/moe_configs.def"
#undef K3_MOE_G1
#undef K3_MOE_G2
};

const k3_moe_g1_config *k3_moe_g1_configs(int32_t *count) {
    if (count) *count = (int32_t)(sizeof g1_configs / sizeof g1_configs[0]);
    return g1_configs;
}

const k3_moe_g2_config *k3_moe_g2_configs(int32_t *count) {
    if (count) *count = (int32_t)(sizeof g2_configs / sizeof g2_configs[0]);
    return g2_configs;
}

int32_t k3_moe_g1_find(int32_t format, int32_t gated, int32_t nt, int32_t async, int32_t fold, int32_t pair,
                       int32_t early) {
    for (size_t i = 0; i < sizeof g1_configs / sizeof g1_configs[0]; i++) {
        const k3_moe_g1_config *c = &g1_configs[i];
        if (c->format == format && c->gated == gated && c->nt == nt && c->async == async && c->fold == fold &&
            c->pair == pair && c->early == early)
            return (int32_t)i;
    }
    return -1;
}

int32_t k3_moe_g2_find(int32_t format, int32_t nt, int32_t ks, int32_t async, int32_t fold, int32_t min_blocks,
                       int32_t direct, int32_t tiles) {
    for (size_t i = 0; i < sizeof g2_configs / sizeof g2_configs[0]; i++) {
        const k3_moe_g2_config *c = &g2_configs[i];
        if (c->format == format && c->nt == nt && c->ks == ks && c->async == async && c->fold == fold &&
            c->min_blocks == min_blocks && c->direct == direct && c->tiles == tiles)
            return (int32_t)i;
    }
    return -1;
}
