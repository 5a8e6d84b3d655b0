/* A probe, not part of the library or of the build (nvcc -arch=sm_90a -o pdl_edge_probe pdl_edge_probe.cu): which
 * edge types does stream capture give a kernel launched with PDL right after a cudaStreamWaitEvent on another
 * stream's event? The latent block joins its side streams that way, so the answer decides whether a PDL kernel after
 * a join may read the joined branch's output before its griddepcontrol.wait.
 *
 *   ka on s1; fork s2 (event) -> ksel on s2 (spins, then writes flag = 7); kdown on s1 with PDL;
 *   s1 waits for ksel's event; kg1 on s1 with PDL (reads flag before and after its griddepcontrol.wait).
 * Prints every edge of the captured graph (type 0 = full, 1 = programmatic; from_port 1 = programmatic port) and
 * what kg1 saw, eagerly and in three graph replays. Measured on the H200 (CUDA 13.0, bench/RESULTS.md s38a): both
 * edges into kg1 (from kdown and from ksel) are programmatic. */
#include <cstdio>

#include <cuda_runtime.h>

#include "probe_check.h"

__global__ void ka(int *p) { p[0] = 1; }
__global__ void ksel(int *p) {
    const long long t0 = clock64();
    while (clock64() - t0 < 200000000) {
    }
    p[1] = 7;
}
__global__ void kdown(int *p) {
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    p[2] = 3;
}
__global__ void kg1(int *p) {
    const int before = *(volatile int *)(p + 1);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    p[3] = before;
    p[4] = *(volatile int *)(p + 1);
}

static cudaError_t launch_pdl(void (*k)(int *), cudaStream_t s, int *p) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = 1, cfg.blockDim = 32, cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at, cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, k, p);
}

static int record(cudaStream_t s1, cudaStream_t s2, cudaEvent_t e1, cudaEvent_t e2, int *p) {
    ka<<<1, 32, 0, s1>>>(p);
    CK(cudaGetLastError());
    CK(cudaEventRecord(e1, s1));
    CK(cudaStreamWaitEvent(s2, e1, 0));
    ksel<<<1, 32, 0, s2>>>(p);
    CK(cudaGetLastError());
    CK(cudaEventRecord(e2, s2));
    CK(launch_pdl(kdown, s1, p));
    CK(cudaStreamWaitEvent(s1, e2, 0));
    CK(launch_pdl(kg1, s1, p));
    return 0;
}

static const char *node_name(cudaGraphNode_t n) {
    cudaKernelNodeParams kp;
    if (cudaGraphKernelNodeGetParams(n, &kp) != cudaSuccess) {
        (void)cudaGetLastError();
        return "(not a kernel)";
    }
    return kp.func == (void *)ka ? "ka" : kp.func == (void *)ksel ? "ksel" : kp.func == (void *)kdown ? "kdown"
                                                                         : kp.func == (void *)kg1 ? "kg1" : "?";
}

int main() {
    int *p, h[8];
    CK(cudaMalloc(&p, 64));
    cudaStream_t s1, s2;
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t e1, e2;
    CK(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming));
    CK(cudaMemset(p, 0, 64));
    CK(cudaDeviceSynchronize());
    if (record(s1, s2, e1, e2, p)) return 1;
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, p, 32, cudaMemcpyDeviceToHost));
    printf("eager: kg1 saw the flag %d before its wait, %d after\n", h[3], h[4]);
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal));
    if (record(s1, s2, e1, e2, p)) return 1;
    CK(cudaStreamEndCapture(s1, &g));
    size_t n = 32;
    cudaGraphNode_t from[32], to[32];
    cudaGraphEdgeData ed[32];
    CK(cudaGraphGetEdges(g, from, to, ed, &n));
    for (size_t i = 0; i < n; i++)
        printf("edge %s -> %s: type %d, from_port %d\n", node_name(from[i]), node_name(to[i]), ed[i].type,
               ed[i].from_port);
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int r = 0; r < 3; r++) {
        CK(cudaMemset(p, 0, 64));
        CK(cudaDeviceSynchronize());
        CK(cudaGraphLaunch(ge, s1));
        CK(cudaStreamSynchronize(s1));
        CK(cudaMemcpy(h, p, 32, cudaMemcpyDeviceToHost));
        printf("replay %d: kg1 saw the flag %d before its wait, %d after\n", r, h[3], h[4]);
    }
    return 0;
}
