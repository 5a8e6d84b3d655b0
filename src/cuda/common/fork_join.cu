#include <cstdlib>

#include "cuda/common/check.cuh"
#include "cuda/common/fork_join.h"

struct k3_fork_join {
    cudaStream_t aux;
    cudaEvent_t fork;
    cudaEvent_t join;
};

extern "C" k3_status k3_fork_join_create(k3_ctx *ctx, k3_fork_join **out) {
    *out = NULL;
    k3_fork_join *fj = (k3_fork_join *)calloc(1, sizeof *fj);
    if (!fj) return k3_fail(ctx, K3_STATUS_OUT_OF_MEMORY, "out of host memory");
    /* The branch is short: the highest priority lets the block scheduler place its blocks ahead of the main
     * stream's later waves. (For the KDA overlap, highest and lowest measured the same: its QKVG is one wave.) */
    int least = 0, greatest = 0;
    cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (e == cudaSuccess) e = cudaStreamCreateWithPriority(&fj->aux, cudaStreamNonBlocking, greatest);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&fj->fork, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&fj->join, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        k3_fork_join_destroy(fj);
        return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "creating the fork/join stream and events failed: %s",
                       cudaGetErrorString(e));
    }
    *out = fj;
    return K3_STATUS_SUCCESS;
}

extern "C" void k3_fork_join_destroy(k3_fork_join *fj) {
    if (!fj) return;
    if (fj->join) cudaEventDestroy(fj->join);
    if (fj->fork) cudaEventDestroy(fj->fork);
    if (fj->aux) cudaStreamDestroy(fj->aux);
    free(fj);
}

extern "C" void *k3_fork_join_aux(const k3_fork_join *fj) { return (void *)fj->aux; }

extern "C" k3_status k3_fork_join_fork(k3_ctx *ctx, k3_fork_join *fj, void *main_stream) {
    K3_CUDA_TRY(ctx, cudaEventRecord(fj->fork, (cudaStream_t)main_stream));
    K3_CUDA_TRY(ctx, cudaStreamWaitEvent(fj->aux, fj->fork, 0));
    return K3_STATUS_SUCCESS;
}

extern "C" k3_status k3_fork_join_join(k3_ctx *ctx, k3_fork_join *fj, void *main_stream) {
    K3_CUDA_TRY(ctx, cudaEventRecord(fj->join, fj->aux));
    K3_CUDA_TRY(ctx, cudaStreamWaitEvent((cudaStream_t)main_stream, fj->join, 0));
    return K3_STATUS_SUCCESS;
}
