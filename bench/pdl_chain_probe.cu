/* A probe, not part of the library or of the build (nvcc -arch=sm_90a -o pdl_chain_probe pdl_chain_probe.cu):
 * does a kernel launched after a PDL secondary that never executes griddepcontrol.wait wait for the PRIMARY too?
 *
 *   P (primary): every block triggers its dependents at its start, spins ~spin_us, then writes data[i] = i.
 *   S (secondary, launched with programmatic stream serialization): no griddepcontrol.wait; returns at once.
 *   C (consumer): reads data[i] into seen[i]; launched plainly ("plain") or with PDL and a griddepcontrol.wait
 *                 at its start ("pdl-wait").
 * If S's completion does not imply P's, C runs while P spins and seen[i] holds the old value. Checked on direct
 * launches and on a captured graph. Prints one line per mode: iterations whose C saw P's write. */
#include <cstdio>
#include <cstdint>

#include <cuda_runtime.h>

#include "probe_check.h"

__device__ __forceinline__ uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void primary(int *data, int i, int spin_us) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const uint64_t t0 = now_ns();
    while (now_ns() - t0 < (uint64_t)spin_us * 1000u) {
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) data[i] = i;
}

__global__ void secondary(int *sink) {
    if (blockIdx.x == 0 && threadIdx.x == 0 && sink[0] == 12345) sink[1] = 1; /* never true: keeps the kernel */
}

template <bool WAIT>
__global__ void consumer(const int *data, int *seen, int i) {
    if (WAIT) asm volatile("griddepcontrol.wait;" ::: "memory");
    if (blockIdx.x == 0 && threadIdx.x == 0) seen[i] = *(volatile const int *)&data[i];
}

/* A launch config with programmatic stream serialization (at must outlive the launch). */
static cudaLaunchConfig_t pdl_config(cudaLaunchAttribute *at, unsigned blocks, cudaStream_t s) {
    cudaLaunchConfig_t lc = {};
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    lc.gridDim = dim3(blocks);
    lc.blockDim = dim3(32);
    lc.stream = s;
    lc.attrs = at;
    lc.numAttrs = 1;
    return lc;
}

static cudaError_t launch_pdl(void (*k)(int *), int *arg, cudaStream_t s) {
    cudaLaunchAttribute at[1];
    const cudaLaunchConfig_t lc = pdl_config(at, 132, s);
    return cudaLaunchKernelEx(&lc, k, arg);
}

static cudaError_t launch_consumer(bool pdl, const int *data, int *seen, int i, cudaStream_t s) {
    if (!pdl) {
        consumer<false><<<1, 32, 0, s>>>(data, seen, i);
        return cudaGetLastError();
    }
    cudaLaunchAttribute at[1];
    const cudaLaunchConfig_t lc = pdl_config(at, 1, s);
    return cudaLaunchKernelEx(&lc, consumer<true>, data, seen, i);
}

int main() {
    const int n = 200, spin_us = 40;
    int *data, *seen, *sink;
    CK(cudaMalloc(&data, n * sizeof(int)));
    CK(cudaMalloc(&seen, n * sizeof(int)));
    CK(cudaMalloc(&sink, 2 * sizeof(int)));
    CK(cudaMemset(sink, 0, 2 * sizeof(int)));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int host[n];
    for (int graph = 0; graph < 2; graph++)
        for (int pdl_c = 0; pdl_c < 2; pdl_c++) {
            CK(cudaMemset(data, 0xff, n * sizeof(int)));
            CK(cudaMemset(seen, 0xff, n * sizeof(int)));
            CK(cudaDeviceSynchronize());
            cudaGraph_t g = nullptr;
            if (graph) CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            for (int i = 0; i < n; i++) {
                primary<<<132, 32, 0, s>>>(data, i, spin_us);
                CK(cudaGetLastError());
                CK(launch_pdl(secondary, sink, s));
                CK(launch_consumer(pdl_c, data, seen, i, s));
            }
            if (graph) {
                CK(cudaStreamEndCapture(s, &g));
                cudaGraphExec_t ge;
                CK(cudaGraphInstantiate(&ge, g, 0));
                CK(cudaGraphLaunch(ge, s));
                CK(cudaStreamSynchronize(s));
                CK(cudaGraphExecDestroy(ge));
                CK(cudaGraphDestroy(g));
            }
            CK(cudaStreamSynchronize(s));
            CK(cudaMemcpy(host, seen, sizeof host, cudaMemcpyDeviceToHost));
            int ok = 0;
            for (int i = 0; i < n; i++) ok += host[i] == i;
            printf("pdl_chain_probe: %s, consumer %s: %d of %d saw the primary's write\n",
                   graph ? "graph" : "direct", pdl_c ? "pdl-wait" : "plain", ok, n);
        }
    return 0;
}
