/*
 * The Kimi-K3 latent-MoE block on the GPU (the CPU order of src/cpu/latent.c, the same rounding points):
 *   main stream:  router -> down = bf16(x W_down^T) -> experts (fp32 sum u) -> RMSNorm -> up = bf16(v W_up^T)
 *   aux stream:   shared gate_up = bf16(x W_gu^T) -> bf16(act) -> s = bf16(a W_sd^T)
 *   join, then    y = bf16((up + s) + residual)
 * The BF16 projections go through the linear plan (src/api/linear.c), the routed experts through the MoE plan,
 * the router through the router plan: this file only orchestrates them and adds three small elementwise
 * kernels. The shared branch depends on x alone, so it runs concurrently with the routed path through the
 * fork/join primitive (events and the aux stream made at plan time: capturable, no host decisions).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/act.h"
#include "core/bf16.h"
#include "cuda/check.cuh"
#include "cuda/fork_join.h"
#include "cuda/moe.h"

namespace {

constexpr size_t ALIGN = 256;
constexpr int NORM_THREADS = 256;

size_t align_up(size_t v) { return (v + (ALIGN - 1)) & ~(ALIGN - 1); }

/* v[t, c] = bf16(bf16(u * r) * norm[c]), r = 1 / sqrt(mean(u^2) + eps); the sum of squares in a fixed tree
 * order (deterministic; not the CPU's sequential order, so r may differ from it in the last bit). */
__global__ void __launch_bounds__(NORM_THREADS)
    k3_latent_rmsnorm_kernel(const float *__restrict__ u, const uint16_t *__restrict__ norm, int64_t l, float eps,
                             uint16_t *__restrict__ v) {
    __shared__ float part[NORM_THREADS / 32];
    const int64_t t = blockIdx.x;
    const float *ut = u + t * l;
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < l; c += NORM_THREADS) ss = __fadd_rn(ss, __fmul_rn(ut[c], ut[c]));
    for (int o = 16; o >= 1; o /= 2) ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, o));
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int w = 0; w < NORM_THREADS / 32; w++) tot = __fadd_rn(tot, part[w]);
    const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(tot, (float)l), eps)));
    for (int64_t c = threadIdx.x; c < l; c += NORM_THREADS)
        v[t * l + c] =
            k3_f32_to_bf16_bits(__fmul_rn(k3_round_bf16(__fmul_rn(ut[c], r)), k3_bf16_bits_to_f32(norm[c])));
}

/* a[t, c] = bf16(act(g row t)) in the kind's layout ([gate; up], interleaved, or relu2 of one half). */
__global__ void k3_latent_act_kernel(const uint16_t *__restrict__ g, int64_t m, int64_t is, int64_t sr,
                                     const k3_act_desc act, uint16_t *__restrict__ a) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= m * is) return;
    const int64_t t = idx / is, c = idx % is;
    const uint16_t *gt = g + t * sr;
    float v;
    if (act.kind == K3_ACT_RELU2_NO_MUL) v = k3_act_relu2(k3_bf16_bits_to_f32(gt[c]));
    else if (act.kind == K3_ACT_SWIGLUOAI)
        v = k3_act_gated(&act, k3_bf16_bits_to_f32(gt[2 * c]), k3_bf16_bits_to_f32(gt[2 * c + 1]));
    else v = k3_act_gated(&act, k3_bf16_bits_to_f32(gt[c]), k3_bf16_bits_to_f32(gt[is + c]));
    a[idx] = k3_f32_to_bf16_bits(v);
}

/* y = bf16((z + s) + r) with s and r optional: the CPU's fp32 adds in its order, one rounding. */
__global__ void k3_latent_sum_kernel(const uint16_t *__restrict__ z, const uint16_t *__restrict__ s,
                                     const uint16_t *r, int64_t n, uint16_t *y) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float acc = k3_bf16_bits_to_f32(z[i]);
    if (s) acc = __fadd_rn(acc, k3_bf16_bits_to_f32(s[i]));
    if (r) acc = __fadd_rn(acc, k3_bf16_bits_to_f32(r[i]));
    y[i] = k3_f32_to_bf16_bits(acc);
}

} // namespace

struct k3_cuda_latent {
    k3_ctx *ctx;
    k3_latent_moe_desc d;
    int64_t sr; /* rows of shared_gate_up */
    k3_router_plan *router;
    k3_moe_plan *moe;
    k3_linear_plan *down, *up, *sgu, *sdown;
    k3_fork_join *fj;
    size_t ws_router, ws_moe, ws_down, ws_up, ws_sgu, ws_sdown;
    /* workspace offsets */
    size_t o_ids, o_wts, o_router, o_xl, o_u, o_mo, o_moe, o_v, o_z, o_g, o_a, o_s, o_down, o_up, o_sgu, o_sdown,
        total;
};

extern "C" void k3_cuda_latent_destroy(k3_cuda_latent *p) {
    if (!p) return;
    k3_router_plan_destroy(p->router);
    k3_moe_plan_destroy(p->moe);
    k3_linear_plan_destroy(p->down);
    k3_linear_plan_destroy(p->up);
    k3_linear_plan_destroy(p->sgu);
    k3_linear_plan_destroy(p->sdown);
    k3_fork_join_destroy(p->fj);
    free(p);
}

static k3_status make_linear(k3_ctx *ctx, int64_t n, int64_t k, int64_t max_m, k3_linear_plan **plan, size_t *ws,
                             const char *what) {
    k3_linear_desc ld;
    k3_linear_desc_init(&ld, n, k);
    ld.max_m = max_m;
    k3_status st = k3_linear_plan_create(ctx, &ld, plan);
    if (st == K3_STATUS_SUCCESS) st = k3_linear_workspace_size(*plan, ws);
    if (st != K3_STATUS_SUCCESS) {
        char msg[K3_ERROR_MAX];
        memcpy(msg, ctx->last_error, sizeof msg);
        return k3_fail(ctx, st, "latent plan: %s projection: %s", what, msg);
    }
    return K3_STATUS_SUCCESS;
}

extern "C" k3_status k3_cuda_latent_create(k3_ctx *ctx, const k3_latent_moe_desc *d, k3_cuda_latent **out) {
    *out = NULL;
    if (d->max_tokens > 32)
        return k3_fail(ctx, K3_STATUS_UNSUPPORTED,
                       "latent plan: the CUDA block runs up to 32 tokens (its BF16 projections use the linear plan, "
                       "max_m <= 32); got max_tokens = %lld",
                       (long long)d->max_tokens);
    k3_cuda_latent *p = (k3_cuda_latent *)calloc(1, sizeof *p);
    if (!p) return k3_fail(ctx, K3_STATUS_OUT_OF_MEMORY, "latent plan: out of host memory");
    p->ctx = ctx;
    p->d = *d;
    const int64_t mt = d->max_tokens, h = d->hidden, l = d->experts.hidden, is = d->shared_inter;
    p->sr = is > 0 ? k3_act_width_factor(d->shared_act.kind) * is : 0;
    k3_status st = k3_router_plan_create(ctx, &d->router, &p->router);
    if (st == K3_STATUS_SUCCESS) st = k3_router_workspace_size(p->router, &p->ws_router);
    if (st == K3_STATUS_SUCCESS) st = k3_moe_plan_create(ctx, &d->experts, &p->moe);
    if (st == K3_STATUS_SUCCESS) st = k3_moe_workspace_size(p->moe, &p->ws_moe);
    if (st == K3_STATUS_SUCCESS) st = make_linear(ctx, l, h, mt, &p->down, &p->ws_down, "down");
    if (st == K3_STATUS_SUCCESS) st = make_linear(ctx, h, l, mt, &p->up, &p->ws_up, "up");
    if (st == K3_STATUS_SUCCESS && is > 0) st = make_linear(ctx, p->sr, h, mt, &p->sgu, &p->ws_sgu, "shared gate_up");
    if (st == K3_STATUS_SUCCESS && is > 0) st = make_linear(ctx, h, is, mt, &p->sdown, &p->ws_sdown, "shared down");
    if (st == K3_STATUS_SUCCESS && is > 0) st = k3_fork_join_create(ctx, &p->fj);
    if (st != K3_STATUS_SUCCESS) {
        k3_cuda_latent_destroy(p);
        return st;
    }
    const size_t k = (size_t)d->experts.top_k;
    size_t o = 0;
    p->o_ids = o, o += align_up((size_t)mt * k * 4);
    p->o_wts = o, o += align_up((size_t)mt * k * 4);
    p->o_router = o, o += align_up(p->ws_router);
    p->o_xl = o, o += align_up((size_t)(mt * l) * 2);
    p->o_u = o, o += align_up((size_t)(mt * l) * 4);
    p->o_mo = o, o += align_up((size_t)(mt * l) * 2);
    p->o_moe = o, o += align_up(p->ws_moe);
    p->o_v = o, o += align_up((size_t)(mt * l) * 2);
    p->o_z = o, o += align_up((size_t)(mt * h) * 2);
    p->o_g = o, o += align_up((size_t)(mt * p->sr) * 2);
    p->o_a = o, o += align_up((size_t)(mt * is) * 2);
    p->o_s = o, o += align_up((size_t)(mt * h) * 2);
    p->o_down = o, o += align_up(p->ws_down);
    p->o_up = o, o += align_up(p->ws_up);
    p->o_sgu = o, o += align_up(p->ws_sgu);
    p->o_sdown = o, o += align_up(p->ws_sdown);
    p->total = o;
    *out = p;
    return K3_STATUS_SUCCESS;
}

extern "C" size_t k3_cuda_latent_ws_bytes(const k3_cuda_latent *p) { return p->total + ALIGN; }

extern "C" k3_status k3_cuda_latent_run(k3_cuda_latent *p, int64_t m, const void *x, const k3_latent_moe_weights *w,
                                        const void *residual, void *y, int32_t *topk_ids, float *topk_weights,
                                        void *ws, void *stream) {
    k3_ctx *ctx = p->ctx;
    const k3_latent_moe_desc *d = &p->d;
    const int64_t h = d->hidden, l = d->experts.hidden, is = d->shared_inter;
    cudaStream_t s = (cudaStream_t)stream;
    uint8_t *base = (uint8_t *)(((uintptr_t)ws + (ALIGN - 1)) & ~(uintptr_t)(ALIGN - 1));
    int32_t *ids = topk_ids ? topk_ids : (int32_t *)(base + p->o_ids);
    float *wts = topk_weights ? topk_weights : (float *)(base + p->o_wts);
    uint16_t *xl = (uint16_t *)(base + p->o_xl), *mo = (uint16_t *)(base + p->o_mo), *v = (uint16_t *)(base + p->o_v);
    uint16_t *z = (uint16_t *)(base + p->o_z), *g = (uint16_t *)(base + p->o_g), *a = (uint16_t *)(base + p->o_a);
    uint16_t *sh = (uint16_t *)(base + p->o_s);
    float *u = (float *)(base + p->o_u);

    {
        const void *ptrs[] = {x, y, residual, ws, w->gate, w->down_proj, w->norm, w->up_proj, w->shared_gate_up,
                              w->shared_down};
        const char *names[] = {"x", "y", "residual", "ws", "gate", "down_proj", "norm", "up_proj", "shared_gate_up",
                               "shared_down"};
        K3_TRY(k3_cuda_check_device_ptrs(ctx, stream, "latent run", 10, ptrs, names));
    }
    k3_status st = K3_STATUS_SUCCESS;
    if (is > 0) { /* the shared experts: on the aux stream, concurrent with the routed path */
        st = k3_fork_join_fork(ctx, p->fj, stream);
        if (st != K3_STATUS_SUCCESS) return st;
        void *aux = k3_fork_join_aux(p->fj);
        st = k3_linear_run(p->sgu, m, x, w->shared_gate_up, NULL, g, base + p->o_sgu, p->ws_sgu, aux);
        if (st == K3_STATUS_SUCCESS) {
            const int64_t n = m * is;
            k3_latent_act_kernel<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)aux>>>(g, m, is, p->sr,
                                                                                             d->shared_act, a);
            const cudaError_t e = cudaGetLastError();
            if (e != cudaSuccess)
                st = k3_fail(ctx, K3_STATUS_CUDA_ERROR, "launch of the latent shared activation kernel failed: %s",
                             cudaGetErrorString(e));
        }
        if (st == K3_STATUS_SUCCESS)
            st = k3_linear_run(p->sdown, m, a, w->shared_down, NULL, sh, base + p->o_sdown, p->ws_sdown, aux);
    }
    if (st == K3_STATUS_SUCCESS)
        st = k3_router_run(p->router, m, x, w->gate, w->bias, ids, wts, base + p->o_router, p->ws_router, stream);
    if (st == K3_STATUS_SUCCESS)
        st = k3_linear_run(p->down, m, x, w->down_proj, NULL, xl, base + p->o_down, p->ws_down, stream);
    if (st == K3_STATUS_SUCCESS)
        st = k3_moe_run(p->moe, m, xl, ids, wts, &w->experts, mo, u, base + p->o_moe, p->ws_moe, stream);
    if (st == K3_STATUS_SUCCESS) {
        k3_latent_rmsnorm_kernel<<<(unsigned)m, NORM_THREADS, 0, s>>>(u, (const uint16_t *)w->norm, l, d->rms_eps, v);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            st = k3_fail(ctx, K3_STATUS_CUDA_ERROR, "launch of the latent rmsnorm kernel failed: %s",
                         cudaGetErrorString(e));
    }
    if (st == K3_STATUS_SUCCESS) st = k3_linear_run(p->up, m, v, w->up_proj, NULL, z, base + p->o_up, p->ws_up, stream);
    if (is > 0) { /* always join, so a capture is never left with an open branch */
        const k3_status js = k3_fork_join_join(ctx, p->fj, stream);
        if (st == K3_STATUS_SUCCESS) st = js;
    }
    if (st != K3_STATUS_SUCCESS) return st;
    const int64_t n = m * h;
    k3_latent_sum_kernel<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(z, is > 0 ? sh : NULL,
                                                                     (const uint16_t *)residual, n, (uint16_t *)y);
    K3_CUDA_LAUNCH_CHECK(ctx, "latent sum kernel");
    return K3_STATUS_SUCCESS;
}
