/* CPU-only builds: the CUDA backend's entry points, each answering "not available". */
#include "cuda/common/backend.h"
#include "cuda/common/fork_join.h"
#include "cuda/kda/proj.h"

int32_t k3_cuda_built(void) { return 0; }

int32_t k3_cuda_device_count(void) { return 0; }

k3_status k3_cuda_device_query(k3_ctx *ctx, int32_t device, k3_arch_info *out) {
    (void)device;
    (void)out;
    return k3_fail(ctx, K3_STATUS_NOT_AVAILABLE, "this build of k3kernels has no CUDA backend (built without nvcc)");
}

k3_status k3_cuda_state_create(k3_ctx *ctx) {
    return k3_fail(ctx, K3_STATUS_NOT_AVAILABLE, "this build of k3kernels has no CUDA backend (built without nvcc)");
}

void k3_cuda_state_destroy(struct k3_cuda_state *state) { (void)state; }

/* ---- KDA projection kernels and the fork/join primitive (src/cuda/kda/proj.cu, src/cuda/common/fork_join.cu) ---- */

k3_status k3_cuda_kda_sliced_create(k3_ctx *ctx, int64_t hidden, int64_t rows, k3_cuda_kda_sliced **out) {
    (void)hidden, (void)rows;
    *out = NULL;
    return k3_fail(ctx, K3_STATUS_NOT_AVAILABLE, "this build of k3kernels has no CUDA backend");
}

void k3_cuda_kda_sliced_destroy(k3_cuda_kda_sliced *sl) { (void)sl; }

k3_status k3_cuda_kda_run_n(k3_ctx *ctx, int64_t m, const void *x, int64_t hidden, const void *w, int64_t rows,
                            int32_t shape, const k3_cuda_kda_sliced *sl, void *fab, void *stream) {
    (void)m, (void)x, (void)hidden, (void)w, (void)rows, (void)shape, (void)sl, (void)fab, (void)stream;
    return k3_fail(ctx, K3_STATUS_NOT_AVAILABLE, "this build of k3kernels has no CUDA backend");
}

k3_status k3_cuda_kda_run_k(k3_ctx *ctx, int64_t m, const void *fa, int64_t fa_stride, const void *w, int64_t rows,
                            int32_t after_shape, void *g1, void *stream) {
    return k3_fail(ctx, K3_STATUS_NOT_AVAILABLE, "this build of k3kernels has no CUDA backend");
}

k3_status k3_fork_join_create(k3_ctx *ctx, k3_fork_join **out) {
    *out = NULL;
    return k3_fail(ctx, K3_STATUS_NOT_AVAILABLE, "this build of k3kernels has no CUDA backend");
}

void k3_fork_join_destroy(k3_fork_join *fj) { (void)fj; }

void *k3_fork_join_aux(const k3_fork_join *fj) { return (void *)fj; }

k3_status k3_fork_join_fork(k3_ctx *ctx, k3_fork_join *fj, void *main_stream) {
    return k3_fail(ctx, K3_STATUS_NOT_AVAILABLE, "this build of k3kernels has no CUDA backend");
}

k3_status k3_fork_join_join(k3_ctx *ctx, k3_fork_join *fj, void *main_stream) {
    return k3_fail(ctx, K3_STATUS_NOT_AVAILABLE, "this build of k3kernels has no CUDA backend");
}

k3_status k3_cuda_kda_fused_create(k3_ctx *ctx, const k3_kda_fused_layout *layout, k3_cuda_kda_fused **out) {
    (void)layout;
    *out = NULL;
    return k3_fail(ctx, K3_STATUS_NOT_AVAILABLE, "this build of k3kernels has no CUDA backend");
}

void k3_cuda_kda_fused_destroy(k3_cuda_kda_fused *f) { (void)f; }

k3_status k3_cuda_kda_fused_run(k3_ctx *ctx, const k3_cuda_kda_fused *f, int64_t m, int32_t head_steps,
                                const void *x, const void *w_packed, const void *w_fb, void *qkvg, void *fab,
                                void *g1, void *stream) {
    (void)f, (void)m, (void)head_steps, (void)x, (void)w_packed, (void)w_fb, (void)qkvg, (void)fab, (void)g1;
    (void)stream;
    return k3_fail(ctx, K3_STATUS_NOT_AVAILABLE, "this build of k3kernels has no CUDA backend");
}
