#include <cstdlib>
#include <cstring>

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
    /* The branch's priority is set at each fork from the forking stream's (k3_fork_join_fork). */
    cudaError_t e = cudaStreamCreateWithFlags(&fj->aux, cudaStreamNonBlocking);
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

/* The branch runs at the priority of the stream it forks from: a branch above the caller's work slows the main
 * path the caller asked for, and a graph instantiated with per-node priorities (as PyTorch's are) keeps what the
 * streams had at capture. The attribute is set only on a change, so a capture (one priority throughout) never
 * touches the branch stream while it is being captured. */
static cudaError_t fork_join_match_priority(cudaStream_t aux, cudaStream_t main_stream) {
    int want = 0, have = 0;
    cudaError_t e = cudaStreamGetPriority(main_stream, &want);
    if (e == cudaSuccess) e = cudaStreamGetPriority(aux, &have);
    if (e != cudaSuccess || want == have) return e;
    cudaStreamAttrValue v;
    memset(&v, 0, sizeof v);
    v.priority = want;
    return cudaStreamSetAttribute(aux, cudaStreamAttributePriority, &v);
}

extern "C" k3_status k3_fork_join_fork(k3_ctx *ctx, k3_fork_join *fj, void *main_stream) {
    K3_CUDA_TRY(ctx, fork_join_match_priority(fj->aux, (cudaStream_t)main_stream));
    K3_CUDA_TRY(ctx, cudaEventRecord(fj->fork, (cudaStream_t)main_stream));
    K3_CUDA_TRY(ctx, cudaStreamWaitEvent(fj->aux, fj->fork, 0));
    return K3_STATUS_SUCCESS;
}

extern "C" k3_status k3_fork_join_join(k3_ctx *ctx, k3_fork_join *fj, void *main_stream) {
    K3_CUDA_TRY(ctx, cudaEventRecord(fj->join, fj->aux));
    K3_CUDA_TRY(ctx, cudaStreamWaitEvent((cudaStream_t)main_stream, fj->join, 0));
    return K3_STATUS_SUCCESS;
}
