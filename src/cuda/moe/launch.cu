/*
 * The routed experts' launchers: the registry of compiled instances (src/plan/moe_configs.def) as kernel pointers,
 * and the run of one planned launch (src/plan/moe_plan.h: the plan resolved every launch-shape choice per m; a run
 * looks nothing up but its row). The kernels, their data flow and why they are shaped so: docs/moe-kernels.md;
 * the measurements behind every choice: bench/NOTES-moe.md.
 *
 * Launch sequence (the caller's stream, no host sync, grids from the plan, so the launches need no knowledge of
 * the routing and are CUDA-graph capturable): [dispatch] -> [W4A4 x quantization] -> GEMM1 -> GEMM2 -> [combine].
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "cuda/common/check.cuh"
#include "cuda/common/ptr_check.h"
#include "cuda/moe/moe.h"
#include "cuda/moe/combine.cuh"
#include "cuda/moe/gemm1.cuh"
#include "cuda/moe/gemm2.cuh"
#include "cuda/moe/quant_x.cuh"
#include "cuda/moe/workspace.cuh"
#include "cuda/common/pdl.cuh"
#include "plan/moe_configs.h"

namespace {

static_assert(K3_MOE_G1_WARPS == G1_WARPS && K3_MOE_G2_WARPS == G2_WARPS && K3_MOE_G2_WIDE_KS == G2_WIDE_KS,
              "src/plan/moe_configs.h: the plan's kernel facts");
static_assert(K3_MOE_FOLD_NP == FOLD_NP && K3_MOE_FOLD_E == FOLD_E, "src/plan/moe_configs.h: the fold's limits");
static_assert((int)K3_WEIGHT_BF16 == FMT_BF16 && (int)K3_WEIGHT_NVFP4 == FMT_NVFP4 &&
                  (int)K3_WEIGHT_MXFP4 == FMT_MXFP4,
              "the registry's format column is k3_weight_format");

/* A cp.async GEMM1's dynamic shared memory: its ring, plus the routing state where it routes itself. */
template <bool GATED, bool ASYNC, bool FOLD, bool PAIR, bool EARLY>
constexpr size_t g1_instance_smem() {
    if constexpr (!ASYNC) return 0;
    else return g1_smem_bytes<GATED && !PAIR ? 2 : 1, FOLD || EARLY>();
}
template <int NT, int KS, bool ASYNC, bool FOLD, int TILES>
constexpr size_t g2_instance_smem() {
    if constexpr (!ASYNC) return 0;
    else return g2_smem_bytes<NT, KS, FOLD, TILES>();
}

struct g1_instance {
    void (*kernel)(moe_params);
    size_t smem;
    bool async, fold;
};
struct g2_instance {
    void (*kernel)(moe_params);
    size_t smem;
    int threads;
    bool async;
};

/* The registry's blocks_per_sm column is the instance's launch bounds (the plan counts waves with it). */
#define K3_MOE_G1(name, fmt, gated, nt, async, fold, pair, early, bpsm)                                            \
    static_assert(g1_min_blocks((async) != 0, nt) == (bpsm), #name ": blocks_per_sm is its launch bounds");
#define K3_MOE_G2(name, fmt, nt, ks, async, fold, minb, direct, tiles, bpsm)                                       \
    static_assert(((minb) ? (minb) : g2_min_blocks((async) != 0, nt, ks)) == (bpsm),                              \
                  #name ": blocks_per_sm is its launch bounds");
#include "plan/moe_configs.def"
#undef K3_MOE_G1
#undef K3_MOE_G2

const g1_instance g1_instances[] = {
#define K3_MOE_G1(name, fmt, gated, nt, async, fold, pair, early, bpsm)                                            \
    {k3_moe_gemm1_kernel<fmt, (gated) != 0, nt, (async) != 0, (fold) != 0, (pair) != 0, (early) != 0>,              \
     g1_instance_smem<(gated) != 0, (async) != 0, (fold) != 0, (pair) != 0, (early) != 0>(), (async) != 0,         \
     (fold) != 0},
#define K3_MOE_G2(name, fmt, nt, ks, async, fold, minb, direct, tiles, bpsm)
#include "plan/moe_configs.def"
#undef K3_MOE_G1
#undef K3_MOE_G2
};

const g2_instance g2_instances[] = {
#define K3_MOE_G1(name, fmt, gated, nt, async, fold, pair, early, bpsm)
#define K3_MOE_G2(name, fmt, nt, ks, async, fold, minb, direct, tiles, bpsm)                                       \
    {k3_moe_gemm2_kernel<fmt, nt, ks, (async) != 0, (fold) != 0, minb, (direct) != 0, tiles>,                      \
     g2_instance_smem<nt, ks, (async) != 0, (fold) != 0, tiles>(), g2_warps<ks>() * 32, (async) != 0},
#include "plan/moe_configs.def"
#undef K3_MOE_G1
#undef K3_MOE_G2
};

constexpr int32_t N_G1 = (int32_t)(sizeof g1_instances / sizeof g1_instances[0]);
constexpr int32_t N_G2 = (int32_t)(sizeof g2_instances / sizeof g2_instances[0]);

/* The folded GEMM1's dynamic shared memory when it is held to `cap` blocks per SM (k3_moe_launch.g1_per_sm): enough
 * that cap + 1 blocks do not fit on an SM. The kernel uses its own bytes; the rest only bounds residency. */
size_t g1_held_smem(const k3_cuda_moe *p, size_t own, int32_t cap) {
    if (cap <= 0 || p->smem_per_sm <= 0) return own;
    const size_t need = (size_t)p->smem_per_sm / (size_t)(cap + 1) + 16u - (size_t)p->smem_reserved;
    return need > own ? need : own;
}

/* GEMM1: with PDL behind the dispatch (or the W4A4 quantization); plainly where it is the call's first kernel (the
 * fold), fully ordered after whatever the caller ran, as the dispatch kernel is (pdl.cuh). */
cudaError_t launch_g1(const g1_instance &k, dim3 grid, bool fold, size_t smem, cudaStream_t s, const moe_params &P) {
    if (!fold) return k3_launch_pdl(k.kernel, grid, dim3(G1_WARPS * 32), k.smem, s, P);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = dim3(G1_WARPS * 32), cfg.dynamicSmemBytes = smem, cfg.stream = s;
    return cudaLaunchKernelEx(&cfg, k.kernel, P);
}

/* The cp.async instances use more than the default 48 KB of dynamic shared memory: allowed once per plan (the folded
 * GEMM1 up to what holding it to one block per SM asks). */
cudaError_t allow_async_smem(const k3_cuda_moe *p) {
    for (const g1_instance &k : g1_instances)
        if (k.async) {
            const size_t most = k.fold ? g1_held_smem(p, k.smem, 1) : k.smem;
            const cudaError_t e =
                cudaFuncSetAttribute(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most);
            if (e != cudaSuccess) return e;
        }
    for (const g2_instance &k : g2_instances)
        if (k.async) {
            const cudaError_t e =
                cudaFuncSetAttribute(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)k.smem);
            if (e != cudaSuccess) return e;
        }
    return cudaSuccess;
}

} // namespace

extern "C" k3_status k3_cuda_moe_prepare(k3_ctx *ctx, k3_cuda_moe *p, const k3_moe_desc *d) {
    memset(p, 0, sizeof *p);
    p->d = *d;
    int32_t n1 = 0, n2 = 0;
    k3_moe_g1_configs(&n1), k3_moe_g2_configs(&n2);
    if (n1 != N_G1 || n2 != N_G2)
        return k3_fail(ctx, K3_STATUS_INTERNAL_ERROR, "moe plan: the registry (%d, %d) and the compiled instances "
                       "(%d, %d) differ", (int)n1, (int)n2, (int)N_G1, (int)N_G2);
    const int64_t l = d->hidden, inter = d->inter;
    if (l % 32 != 0 || inter % 32 != 0)
        return k3_fail(ctx, K3_STATUS_UNSUPPORTED,
                       "moe plan: the CUDA kernels need hidden (L) and inter (I) to be multiples of 32 (got L = %lld, "
                       "I = %lld)",
                       (long long)l, (long long)inter);
    if (inter / 16 > 65535 || l / 16 > 65535)
        return k3_fail(ctx, K3_STATUS_UNSUPPORTED, "moe plan: L = %lld or I = %lld is too large for the CUDA grid",
                       (long long)l, (long long)inter);
    if ((int64_t)d->max_tokens * d->top_k > INT32_MAX / 2)
        return k3_fail(ctx, K3_STATUS_UNSUPPORTED, "moe plan: max_tokens * top_k is too large for the CUDA kernels");
    p->w1_rows = k3_act_width_factor(d->act.kind) * inter;
    if (d->format == K3_WEIGHT_NVFP4) {
        int dev = 0;
        cudaError_t e = cudaGetDevice(&dev);
        if (e == cudaSuccess)
            e = cudaDeviceGetAttribute(&p->smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
        if (e == cudaSuccess)
            e = cudaDeviceGetAttribute(&p->smem_reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev);
        if (e != cudaSuccess)
            return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "moe plan: cannot read the device's shared memory per SM: %s",
                           cudaGetErrorString(e));
        e = allow_async_smem(p);
        if (e != cudaSuccess)
            return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "moe plan: cannot raise the shared-memory limit of the NVFP4 "
                           "expert kernels: %s", cudaGetErrorString(e));
    }
    if (d->format == K3_WEIGHT_BF16) {
        p->w13_expert_bytes = (size_t)(p->w1_rows * l) * 2u;
        p->w2_expert_bytes = (size_t)(l * inter) * 2u;
        return K3_STATUS_SUCCESS;
    }
    const k3_fp4_format fmt = d->format == K3_WEIGHT_NVFP4 ? K3_FP4_NVFP4 : K3_FP4_MXFP4;
    p->w13_expert_bytes = (size_t)(p->w1_rows * l / 2);
    p->w2_expert_bytes = (size_t)(l * inter / 2);
    k3_status st = k3_fp4_scale_bytes(fmt, d->scale_layout, p->w1_rows, l, &p->w13_scale_bytes);
    if (st == K3_STATUS_SUCCESS) st = k3_fp4_scale_bytes(fmt, d->scale_layout, l, inter, &p->w2_scale_bytes);
    if (st != K3_STATUS_SUCCESS) return k3_fail(ctx, st, "moe plan: cannot size the block scales");
    return K3_STATUS_SUCCESS;
}

extern "C" size_t k3_cuda_moe_ws_bytes(const k3_cuda_moe *p) { return layout_of(p).total + ALIGN_BUF; }

extern "C" k3_status k3_cuda_moe_run(k3_ctx *ctx, const k3_cuda_moe *p, const k3_moe_launch *l, int64_t m,
                                     const void *x, const int32_t *topk_ids, const float *topk_weights,
                                     const k3_moe_weights *w, void *out, float *out_f32, void *ws, void *stream) {
    return k3_cuda_moe_run_stages(ctx, p, l, m, x, topk_ids, topk_weights, w, out, out_f32, ws, stream,
                                  K3_CUDA_MOE_STAGE_ALL);
}

extern "C" k3_status k3_cuda_moe_run_stages(k3_ctx *ctx, const k3_cuda_moe *p, const k3_moe_launch *l, int64_t m,
                                            const void *x, const int32_t *topk_ids, const float *topk_weights,
                                            const k3_moe_weights *w, void *out, float *out_f32, void *ws,
                                            void *stream, int32_t stages) {
    const k3_moe_desc *d = &p->d;
    cudaStream_t s = (cudaStream_t)stream;
    const ws_layout L = layout_of(p);
    uint8_t *base = (uint8_t *)(((uintptr_t)ws + (ALIGN_BUF - 1)) & ~(uintptr_t)(ALIGN_BUF - 1));
    const int32_t np = (int32_t)(m * d->top_k);

    /* 16-byte loads: the weight bases (every expert's slice and row is then aligned, L and I being multiples
     * of 32) and x; the cp.async ring copies 4-byte NVFP4 scale words */
    if ((((uintptr_t)w->w13 | (uintptr_t)w->w2 | (uintptr_t)x) & 15u) != 0)
        return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT, "moe run: x, w13 and w2 must be 16-byte aligned on CUDA");
    if (d->format == K3_WEIGHT_NVFP4 && (((uintptr_t)w->w13_scale | (uintptr_t)w->w2_scale) & 3u) != 0)
        return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT,
                       "moe run: the NVFP4 block scales w13_scale and w2_scale must be 4-byte aligned on CUDA");
    if (l->g1 < 0 || l->g1 >= N_G1 || l->g2 < 0 || l->g2 >= N_G2)
        return k3_fail(ctx, K3_STATUS_INTERNAL_ERROR, "moe run: the plan names an instance that is not compiled");

    {
        const void *ptrs[] = {x, topk_ids, topk_weights, out, out_f32, ws, w->w13, w->w2, w->w13_scale, w->w2_scale,
                              w->w13_scale_2, w->w2_scale_2, w->w13_input_scale, w->w2_input_scale};
        const char *names[] = {"x", "topk_ids", "topk_weights", "out", "out_f32", "ws", "w13", "w2", "w13_scale",
                               "w2_scale", "w13_scale_2", "w2_scale_2", "w13_input_scale", "w2_input_scale"};
        K3_TRY(k3_cuda_check_device_ptrs(ctx, stream, "moe run", (int32_t)(sizeof ptrs / sizeof ptrs[0]), ptrs, names));
    }
    moe_params P;
    memset(&P, 0, sizeof P);
    P.L = d->hidden, P.I = d->inter;
    P.top_k = d->top_k, P.ne = d->num_experts, P.layout = (int32_t)d->scale_layout;
    P.sep = d->w13_separate_scale_2, P.interleaved = d->act.kind == K3_ACT_SWIGLUOAI, P.w4a4 = d->mode == K3_MOE_W4A4;
    P.act = d->act;
    P.x = (const uint16_t *)x, P.ids = topk_ids, P.wts = topk_weights;
    P.offs = (const int32_t *)(base + L.offs), P.active = (const int32_t *)(base + L.active);
    P.act_off = (const int32_t *)(base + L.act_off);
    P.n_active = (const int32_t *)(base + L.n_active), P.list = (const int32_t *)(base + L.list);
    P.wsort = (const float *)(base + L.wsort);
    P.xq = P.w4a4 ? (const uint16_t *)(base + L.xq) : nullptr;
    P.a = (uint16_t *)(base + L.a);
    P.pair_out = (float *)(base + L.pair_out);
    P.out = (uint16_t *)out, P.out_f32 = out_f32;
    P.w13 = (const uint8_t *)w->w13, P.w13s = (const uint8_t *)w->w13_scale;
    P.w2 = (const uint8_t *)w->w2, P.w2s = (const uint8_t *)w->w2_scale;
    P.w13_eb = p->w13_expert_bytes, P.w13_sb = p->w13_scale_bytes;
    P.w2_eb = p->w2_expert_bytes, P.w2_sb = p->w2_scale_bytes;
    P.w13_s2 = w->w13_scale_2, P.w2_s2 = w->w2_scale_2, P.w13_in = w->w13_input_scale, P.w2_in = w->w2_input_scale;
    P.np = np;
    P.direct = l->direct;
    P.early_blocks = l->early_blocks;
    P.tpu = l->tpu;

    /* With the fold the dispatch kernel is not part of the call; the stage cut after it still runs it alone, for
     * reference (the benchmark's breakdown). */
    if (l->dispatch || stages <= K3_CUDA_MOE_STAGE_DISPATCH)
        K3_TRY(k3_cuda_moe_dispatch(ctx, topk_ids, np, d->num_experts, l->tpu, (int32_t *)(base + L.offs),
                                    (int32_t *)(base + L.cur), (int32_t *)(base + L.active),
                                    (int32_t *)(base + L.act_off), (int32_t *)(base + L.n_active),
                                    (int32_t *)(base + L.list), topk_weights, (float *)(base + L.wsort), stream));
    if (stages <= K3_CUDA_MOE_STAGE_DISPATCH) return K3_STATUS_SUCCESS;
    if (P.w4a4) {
        const cudaError_t qe = k3_launch_pdl(k3_moe_quant_x_kernel, dim3((unsigned)np), dim3(128), 0, s, P);
        if (qe != cudaSuccess)
            return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "launch of the moe W4A4 x quantization kernel failed: %s",
                           cudaGetErrorString(qe));
    }
    const g1_instance &k1 = g1_instances[l->g1];
    cudaError_t err = launch_g1(k1, dim3(l->g1_grid[0], l->g1_grid[1]), l->fold != 0,
                                g1_held_smem(p, k1.smem, l->g1_per_sm), s, P);
    if (err == cudaSuccess && stages >= K3_CUDA_MOE_STAGE_GEMM2) {
        const g2_instance &k2 = g2_instances[l->g2];
        err = k3_launch_pdl(k2.kernel, dim3(l->g2_grid[0], l->g2_grid[1]), dim3(k2.threads), k2.smem, s, P);
    }
    if (err != cudaSuccess)
        return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "launch of the moe expert GEMMs failed: %s", cudaGetErrorString(err));
    if (stages < K3_CUDA_MOE_STAGE_ALL || !l->combine) return K3_STATUS_SUCCESS;
    const int64_t total = m * d->hidden;
    err = k3_launch_pdl(k3_moe_combine_kernel, dim3((unsigned)((total + 255) / 256)), dim3(256), 0, s, P, m,
                        (uint16_t *)out, out_f32);
    if (err != cudaSuccess)
        return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "launch of the moe combine kernel failed: %s", cudaGetErrorString(err));
    return K3_STATUS_SUCCESS;
}

#ifdef K3_MOE_TRACE
extern "C" int k3x_moe_trace(int reset, unsigned long long *g1, unsigned *g1n, unsigned long long *g2, unsigned *g2n,
                             unsigned long long *cb, unsigned *cbn) {
    if (reset) {
        void *a1 = NULL, *a2 = NULL, *a3 = NULL;
        return cudaGetSymbolAddress(&a1, mt_g1n) != cudaSuccess || cudaGetSymbolAddress(&a2, mt_g2n) != cudaSuccess ||
               cudaGetSymbolAddress(&a3, mt_cbn) != cudaSuccess || cudaMemset(a1, 0, sizeof mt_g1n) != cudaSuccess ||
               cudaMemset(a2, 0, sizeof mt_g2n) != cudaSuccess || cudaMemset(a3, 0, sizeof mt_cbn) != cudaSuccess ||
               cudaDeviceSynchronize() != cudaSuccess;
    }
    return cudaMemcpyFromSymbol(g1, mt_g1, sizeof mt_g1) != cudaSuccess ||
           cudaMemcpyFromSymbol(g1n, mt_g1n, sizeof mt_g1n) != cudaSuccess ||
           cudaMemcpyFromSymbol(g2, mt_g2, sizeof mt_g2) != cudaSuccess ||
           cudaMemcpyFromSymbol(g2n, mt_g2n, sizeof mt_g2n) != cudaSuccess ||
           cudaMemcpyFromSymbol(cb, mt_cb, sizeof mt_cb) != cudaSuccess ||
           cudaMemcpyFromSymbol(cbn, mt_cbn, sizeof mt_cbn) != cudaSuccess;
}
#endif
