/* Shared by the specialized BF16 GEMM kernels: the launch templates that src/cuda/gemm/launch.cu dispatches to
 * (instantiated from src/plan/gemm_configs.def in skinny.cu, mma.cu and mma_wt.cu). */
#ifndef K3_CUDA_GEMM_KERNELS_CUH
#define K3_CUDA_GEMM_KERNELS_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/gemm/gemm.h"
#include "cuda/common/loads.cuh"
#include "cuda/common/pdl.cuh"

/* Launch configuration shared by both kernel families. */
static inline cudaError_t k3_gemm_launch_cfg_init(cudaLaunchConfig_t *lc, cudaLaunchAttribute *attr, dim3 grid,
                                                  dim3 block, cudaStream_t stream, int pdl) {
    lc->gridDim = grid;
    lc->blockDim = block;
    lc->dynamicSmemBytes = 0;
    lc->stream = stream;
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    lc->attrs = attr;
    lc->numAttrs = pdl ? 1 : 0;
    return cudaSuccess;
}

/* A K split over cluster_k blocks of a cluster (cluster_k > 1): the grid's y dimension is the cluster's. attr has
 * room for the attribute (k3_gemm_launch_cfg_init's array of 2). */
static inline void k3_gemm_launch_cfg_cluster_k(cudaLaunchConfig_t *lc, cudaLaunchAttribute *attr, int cluster_k) {
    if (cluster_k <= 1) return;
    attr[lc->numAttrs].id = cudaLaunchAttributeClusterDimension;
    attr[lc->numAttrs].val.clusterDim.x = 1;
    attr[lc->numAttrs].val.clusterDim.y = (unsigned)cluster_k;
    attr[lc->numAttrs].val.clusterDim.z = 1;
    lc->numAttrs++;
}

/* The tensor-core kernels' parameter list (gemm_mma.cu and gemm_mma_wt.cu): x, x_stride, w, residual, y,
 * y_stride, m, n, k; k3_mma_launch_ex launches one of them with lc on the call's arguments. */
typedef void (*k3_mma_kernel_fn)(const uint16_t *, int64_t, const uint16_t *, const uint16_t *, uint16_t *, int64_t,
                                 int32_t, int32_t, int32_t);
static inline cudaError_t k3_mma_launch_ex(const cudaLaunchConfig_t *lc, k3_mma_kernel_fn kernel,
                                           const k3_gemm_args *a) {
    return cudaLaunchKernelEx(lc, kernel, static_cast<const uint16_t *>(a->x), (int64_t)a->x_stride,
                              static_cast<const uint16_t *>(a->w), static_cast<const uint16_t *>(a->residual),
                              static_cast<uint16_t *>(a->y), (int64_t)a->y_stride, (int32_t)a->m, (int32_t)a->n,
                              (int32_t)a->k);
}

/* One per configuration in src/plan/gemm_configs.def. The args were validated by k3_cuda_gemm_launch. */
template <int THREADS, int ROWS, int UNROLL, int STATIC_K>
cudaError_t k3_skinny_launch(const k3_gemm_args *a, cudaStream_t stream, int pdl);
template <int WARPS, int TILES, int UNROLL, int CLUSTER_K, int PF, int MINB, int L2B, int PIPE>
cudaError_t k3_mma_launch(const k3_gemm_args *a, cudaStream_t stream, int pdl);
template <int WARPS, int TILES, int UNROLL, int MINB>
cudaError_t k3_mma_wt_launch(const k3_gemm_args *a, cudaStream_t stream, int pdl);
template <int WARPS, int BK, int SMEM_KB, int CLUSTER_K>
cudaError_t k3_mma_bulk_launch(const k3_gemm_args *a, cudaStream_t stream, int pdl);
/* The set-up a configuration needs before its first launch on a device (k3_cuda_gemm_prepare); only the bulk kernels
 * have one. */
template <int WARPS, int BK, int SMEM_KB, int CLUSTER_K>
cudaError_t k3_mma_bulk_prepare(void);

/* L2B (mma): the L2 prefetch size of the weight loads (k3_ld_stream_pf): 0 or 256 bytes. (Not on the skinny kernel,
 * where it measured slower: its warps already ask for 512 contiguous bytes; bench/NOTES-gemm.md.)
 * PF (mma): L2 prefetch of the weights ahead of the demand loads. 0 = none; K3_PF_ALL = the block's whole weight
 * slice, requested at its start; 1..K3_PF_ALL-1 = this many K steps ahead of the step being loaded into registers;
 * K3_PF_HEAD + H = the H steps after those loaded into registers at the start only, requested once at the block's
 * start (before griddepcontrol.wait, so under PDL while the previous kernel's last blocks drain), nothing in the
 * loop. */
#define K3_PF_ALL 99
#define K3_PF_HEAD 100

#endif
