/* Programmatic dependent launch (PDL), for every kernel family (GEMM, MoE, router).
 * Why: decode steps are chains of short kernels; with PDL the next kernel's blocks come up (and may prefetch
 * weights, which never depend on the previous kernel) while the previous one drains, instead of after a launch
 * gap. Rules:
 * - every PDL kernel calls k3_pdl_wait() before reading anything the previous kernel wrote, and reads it only
 *   through coherent loads (plain ld.global, .cg, cp.async): a read-only (.nc) load may be served lines cached
 *   before the producer wrote them;
 * - the MoE and router kernels call k3_pdl_launch() only after k3_pdl_wait(), so when their successor starts,
 *   every kernel two or more steps back has completed and flushed (MoE GEMM2 reads the dispatch lists before its
 *   own wait); the GEMM kernels trigger before their wait (the next kernel's weight prefetch then overlaps their
 *   whole body), so a kernel after a GEMM may rely only on its own k3_pdl_wait();
 * - a MoE call's first kernel (the dispatch, or the folded GEMM1) is launched plainly, so the call's inputs
 *   (topk_ids, x) are complete when any of its kernels starts: GEMM1's early routing and the combine read topk_ids
 *   before their waits. Launching that first kernel with PDL would break this, even after an event join: stream
 *   capture makes every incoming edge of a PDL launch programmatic, the joined stream's too
 *   (bench/pdl_edge_probe.cu), so a joined branch's output is complete only after the wait;
 * - the latent block's elementwise kernels (RMSNorm, the shared activation, the shared addend) wait before reading
 *   anything the previous kernel wrote; the activation and the addend trigger after their wait, like the MoE
 *   kernels, and so does the RMSNorm at the token counts whose plan data ask for it (plan/latent_tuning.c). */
#ifndef K3_CUDA_PDL_CUH
#define K3_CUDA_PDL_CUH

#include <cuda_runtime.h>

/* Blocks until the previous kernel in the stream has completed and its writes are visible (a no-op when the
 * kernel was not launched with programmatic serialization). */
__device__ __forceinline__ void k3_pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Lets the next kernel (launched with programmatic serialization) start its blocks. */
__device__ __forceinline__ void k3_pdl_launch(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* A launch with programmatic stream serialization: the kernel may start before the previous kernel in the
 * stream completes, and must call k3_pdl_wait before reading that kernel's output. Captured into CUDA graphs as
 * a programmatic edge. */
template <typename... Params, typename... Args>
static inline cudaError_t k3_launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                        cudaStream_t s, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at, cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

#endif
