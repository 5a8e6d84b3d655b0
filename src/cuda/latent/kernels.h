/* C-callable launchers of the latent-MoE block's elementwise kernels (src/cuda/latent/kernels.cu); the
 * block itself is composed in src/api/latent.c. BF16 tensors are uint16_t bit patterns, rows dense unless a
 * stride is given. Arguments were validated by the caller. Each launcher queues one kernel on `stream` (a
 * cudaStream_t), checks the launch and returns CUDA_ERROR with a message when it failed; none allocates or
 * synchronizes, so they record into a CUDA graph. Only compiled into CUDA builds. */
#ifndef K3_CUDA_LATENT_KERNELS_H
#define K3_CUDA_LATENT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* v[t, c] = bf16(bf16(u[t, c] * r_t) * norm[c]) for t < m, c < l, with r_t = 1 / sqrt(mean_c(u[t, c]^2) + eps):
 * the RMSNorm of the experts' fp32 sum. One block per token; the sum of squares in a fixed tree order
 * (deterministic run to run; it may differ from a sequential sum in the last bit). m >= 1. trigger != 0: the
 * kernel lets the next kernel on the stream (launched with PDL) come up once its own wait returned, instead of when
 * it ends (the bits do not depend on it). */
k3_status k3_cuda_latent_rmsnorm_launch(k3_ctx *ctx, const float *u, const uint16_t *norm, int64_t m, int64_t l,
                                        float eps, uint16_t *v, int32_t trigger, void *stream);

/* a[t, c] = bf16(act(g row t)) for t < m, c < inter, g rows g_stride elements apart, in the layout of act->kind:
 * RELU2_NO_MUL reads g[t, c]; SWIGLUOAI the interleaved pair (g[t, 2c], g[t, 2c + 1]); the other gated kinds
 * (g[t, c], g[t, inter + c]). The descriptor is passed to the kernel by value. m * inter >= 1. */
k3_status k3_cuda_latent_act_launch(k3_ctx *ctx, const uint16_t *g, int64_t m, int64_t inter, int64_t g_stride,
                                    const k3_act_desc *act, uint16_t *a, void *stream);

/* t[i] = bf16(bf16(s[i]) + r[i]) with s in fp32 (the shared experts' output, or a cross-rank sum of their partials,
 * rounded where the CPU block rounds its shared output); r may be NULL (then t = bf16(s)). n >= 1. The block's up
 * projection adds t as its residual. */
k3_status k3_cuda_latent_addend_launch(k3_ctx *ctx, const float *s, const uint16_t *r, int64_t n, uint16_t *t,
                                       void *stream);

/* dst[bytes] = src[bytes], device to device, queued on `stream` (a memcpy node when captured). */
k3_status k3_cuda_latent_copy(k3_ctx *ctx, void *dst, const void *src, size_t bytes, void *stream);

#ifdef __cplusplus
}
#endif
#endif
