/* The carve-up of the routed experts' device workspace (host code). */
#ifndef K3_CUDA_MOE_WORKSPACE_CUH
#define K3_CUDA_MOE_WORKSPACE_CUH

#include <stddef.h>
#include <stdint.h>
#include "cuda/moe/moe.h"

namespace {

size_t align_up(size_t v) { return (v + (ALIGN - 1)) & ~(size_t)(ALIGN - 1); }
/* a and pair_out start on 64 KB boundaries of the device address space (the workspace base is aligned so too) */
constexpr size_t ALIGN_BUF = 65536;
size_t align_buf(size_t v) { return (v + (ALIGN_BUF - 1)) & ~(size_t)(ALIGN_BUF - 1); }

/* The dispatch path's block rows (units) for `np` pairs in runs of at most `tpu` (k3_cuda_moe_dispatch): one per
 * touched expert, plus at most np / tpu more. The workspace is sized for the smallest tpu (8), the plan's grids
 * (src/plan/moe_plan.c, its own copy of this bound) for the call's. */
int64_t max_units(int64_t e, int64_t np, int64_t tpu) { return (e < np ? e : np) + np / tpu; }

/* The carve-up of the device workspace (offsets from its ALIGN_BUF-aligned start). */
struct ws_layout {
    size_t offs, cur, active, act_off, n_active, list, wsort, xq, a, pair_out, total;
};

ws_layout layout_of(const k3_cuda_moe *p) {
    const k3_moe_desc *d = &p->d;
    const size_t e = (size_t)d->num_experts, np = (size_t)(d->max_tokens * d->top_k);
    ws_layout s;
    size_t o = 0;
    s.offs = o, o += align_up((e + 1) * 4);
    s.cur = o, o += align_up(e * 4);
    s.n_active = o, o += align_up(4);
    s.list = o, o += align_up(np * 4);
    s.xq = o, o += d->mode == K3_MOE_W4A4 ? align_up(np * (size_t)d->hidden * 2) : 0;
    o = align_buf(o);
    s.a = o, o += align_up(np * (size_t)d->inter * 2);
    o = align_buf(o);
    s.pair_out = o, o += align_up(np * (size_t)d->hidden * 4);
    /* the dispatch's units, last: placed before a and pair_out they moved those buffers, which made the same work
     * measurably slower (bench/NOTES-moe.md); keep a and pair_out where they are */
    const size_t units = (size_t)max_units((int64_t)e, (int64_t)np, 8);
    s.active = o, o += align_up(units * 4);
    s.act_off = o, o += align_up((units + 1) * 4);
    s.wsort = o, o += align_up(np * 4);
    s.total = o;
    return s;
}

} // namespace

#endif
