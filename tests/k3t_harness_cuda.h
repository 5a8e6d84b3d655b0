/* The harness's device layer (tests/k3t_harness.h has the checks): device outputs allocated with guard bytes on
 * both sides, poisoned with cudaMemset, copied back whole and judged on the host; CUDA error helpers; device
 * copies of inputs. Include only under K3_HAVE_CUDA. */
#ifndef K3_TEST_HARNESS_CUDA_H
#define K3_TEST_HARNESS_CUDA_H

#ifndef K3_HAVE_CUDA
#error "k3t_harness_cuda.h is for the CUDA build"
#endif

#include <cuda_runtime.h>

#include "k3t_harness.h"

/* A failed CUDA call is a recorded failure naming the call and the case. Returns 1 when it succeeded. */
static inline int k3t_cuda_ok(cudaError_t e, const char *what) {
    char where[160];
    CHECK(e == cudaSuccess, "%s: %s; %s", what, cudaGetErrorString(e), k3t_where(where, sizeof where));
    return e == cudaSuccess;
}

/* A CUDA call whose failure ends the test (exit status 1): setup that everything after it needs. */
#define K3T_CU(call)                                                                                         \
    do {                                                                                                     \
        const cudaError_t e_ = (call);                                                                       \
        if (e_ != cudaSuccess) {                                                                             \
            char w_[160];                                                                                    \
            fprintf(stderr, "FATAL %s:%d: %s: %s; %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_),   \
                    k3t_where(w_, sizeof w_));                                                               \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

/* cudaMalloc of at least 16 bytes (a zero-sized buffer still gets a valid pointer); NULL (recorded) on failure. */
static inline void *k3t_dalloc(size_t bytes) {
    void *p = NULL;
    if (!k3t_cuda_ok(cudaMalloc(&p, bytes ? bytes : 16), "cudaMalloc")) return NULL;
    return p;
}

/* Host memory copied to device memory d, and waited for: a pageable cudaMemcpy may return before its DMA lands,
 * and the tests' streams do not wait for the legacy stream. 1 on success (a failure is recorded). */
static inline int k3t_to_device(void *d, const void *h, size_t bytes) {
    return k3t_cuda_ok(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), "copy to device") &&
           k3t_cuda_ok(cudaDeviceSynchronize(), "copy to device (sync)");
}

/* A device copy of host memory (k3t_to_device into a new buffer). */
static inline void *k3t_dup(const void *h, size_t bytes) {
    void *d = k3t_dalloc(bytes);
    if (d && bytes) (void)k3t_to_device(d, h, bytes);
    return d;
}

/* A device output: its device image mirrors the host image of h, [guard][body][guard]. */
typedef struct k3t_dout {
    k3t_out h;
    unsigned char *dimg;
} k3t_dout;

static inline int k3t_dout_alloc(k3t_dout *d, const char *name, k3t_type type, int64_t n) {
    memset(d, 0, sizeof *d);
    if (!k3t_out_init(&d->h, name, type, n)) return 0;
    if (!k3t_cuda_ok(cudaMalloc((void **)&d->dimg, k3t_out_img_bytes(&d->h)), name)) {
        d->dimg = NULL;
        return 0;
    }
    return 1;
}

static inline void k3t_dout_free(k3t_dout *d) {
    cudaFree(d->dimg);
    k3t_out_free(&d->h);
    d->dimg = NULL;
}

/* The body on the device: what the op under test is given. */
static inline void *k3t_dout_ptr(const k3t_dout *d) { return d->dimg ? d->dimg + K3T_GUARD_BYTES : NULL; }
/* The body of the host copy (after k3t_dout_fetch). */
static inline void *k3t_dout_host(const k3t_dout *d) { return k3t_out_body(&d->h); }
static inline size_t k3t_dout_bytes(const k3t_dout *d) { return k3t_out_body_bytes(&d->h); }

/* Guards and poison, on `stream` (capturable). */
static inline int k3t_dout_poison(k3t_dout *d, cudaStream_t stream) {
    if (!d->dimg) return 0;
    const size_t body = k3t_out_body_bytes(&d->h);
    return k3t_cuda_ok(cudaMemsetAsync(d->dimg, (int)K3T_GUARD_BYTE, K3T_GUARD_BYTES, stream), "guard before") &&
           k3t_cuda_ok(cudaMemsetAsync(d->dimg + K3T_GUARD_BYTES, (int)k3t_poison_byte(d->h.type), body, stream),
                       "poison") &&
           k3t_cuda_ok(cudaMemsetAsync(d->dimg + K3T_GUARD_BYTES + body, (int)K3T_GUARD_BYTE, K3T_GUARD_BYTES, stream),
                       "guard after");
}

/* The whole device image into the host image, ordered after the work on `stream`, then waited for. */
static inline int k3t_dout_fetch(k3t_dout *d, cudaStream_t stream) {
    if (!d->dimg) return 0;
    return k3t_cuda_ok(cudaMemcpyAsync(d->h.img, d->dimg, k3t_out_img_bytes(&d->h), cudaMemcpyDeviceToHost, stream),
                       "copy back") &&
           k3t_cuda_ok(cudaStreamSynchronize(stream), "copy back (sync)");
}

/* Fetch, then k3t_check_out: guards, region r written (and finite unless K3T_NONFINITE_OK), the rest of the body
 * equal to `outside` (poison when NULL; unchecked with K3T_OUTSIDE_ANY). Returns 1 when all passed. */
static inline int k3t_dout_check(k3t_dout *d, cudaStream_t stream, k3t_region r, unsigned flags,
                                 const void *outside) {
    if (!k3t_dout_fetch(d, stream)) return 0;
    return k3t_check_out(&d->h, r, flags, outside);
}

/* The kernel nodes of captured graph g (*kernels, may be NULL) and how many of them carry a priority other than
 * want: the per-node priority that a graph instantiated with cudaGraphInstantiateFlagUseNodePriority (as PyTorch's
 * CUDA graphs are) runs each kernel at. -1 (recorded) when the graph cannot be read. */
static inline int k3t_graph_priority_mismatches(cudaGraph_t g, int want, int *kernels) {
    size_t n = 0;
    if (kernels) *kernels = 0;
    if (!k3t_cuda_ok(cudaGraphGetNodes(g, NULL, &n), "graph nodes (count)")) return -1;
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)calloc(n ? n : 1, sizeof *nodes);
    if (!nodes || !k3t_cuda_ok(cudaGraphGetNodes(g, nodes, &n), "graph nodes")) {
        free(nodes);
        return -1;
    }
    int bad = 0, k = 0;
    for (size_t i = 0; i < n && bad >= 0; i++) {
        enum cudaGraphNodeType t;
        if (!k3t_cuda_ok(cudaGraphNodeGetType(nodes[i], &t), "graph node type")) bad = -1;
        if (bad < 0 || t != cudaGraphNodeTypeKernel) continue;
        cudaKernelNodeAttrValue v;
        memset(&v, 0, sizeof v);
        if (!k3t_cuda_ok(cudaGraphKernelNodeGetAttribute(nodes[i], cudaKernelNodeAttributePriority, &v),
                         "kernel node priority"))
            bad = -1;
        else
            k++, bad += v.priority != want;
    }
    free(nodes);
    if (kernels) *kernels = k;
    return bad;
}

#endif
