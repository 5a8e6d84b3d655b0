/* A diagnostic, not part of the library or of the build: per-block globaltimer stamps of the one-launch KDA
 * projection (src/cuda/kda/fused.cu) for the last two launches of a graph of 24 back-to-back calls over 3 cold
 * weight copies (Kimi-K3 TP8 shapes, random bf16 data as in `k3 bench kda`: power, and so the clocks,
 * depend on the data; the timeline, not the values, is the output).
 * Build a trace library and link this against it:
 *   cmake -S . -B build-trace -DCMAKE_BUILD_TYPE=Release -DK3_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a" \
 *         -DCMAKE_CUDA_FLAGS=-DK3_KDA_FUSED_TRACE && cmake --build build-trace --target k3_static
 *   gcc -O2 -std=c11 -Iinclude bench/kda_fused_trace.c -o kda_fused_trace build-trace/libk3.a \
 *       -L/usr/local/cuda/lib64 -lcudart -lcublasLt -lstdc++ -lm -ldl -lpthread
 * Usage: kda_fused_trace [M...] (default 1 9 16). Prints, per m: the graph's time per call, and for each of the last
 * two launches the QKVG blocks' start and end spread and each branch block's phases (start, griddepcontrol.wait
 * returned, x staged, F_AB sums stored, their reads done, fab summed, end), in us from the earlier launch's first
 * block start. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3.h"

unsigned k3x_kda_fused_trace(unsigned long long *out);

enum { H = 7168, P = 6288, G = 1536, COPIES = 3, CALLS = 24 };

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    k3_ctx_options o;
    k3_ctx_options_init(&o);
    o.backend = K3_BACKEND_CUDA;
    k3_ctx *ctx = NULL;
    if (k3_ctx_create(&o, &ctx)) {
        fprintf(stderr, "no CUDA context\n");
        return 1;
    }
    k3_kda_proj_desc d;
    k3_kda_proj_desc_init(&d);
    d.run_n_shape = K3_KDA_RUN_N_FUSED;
    k3_kda_proj_plan *p = NULL;
    if (k3_kda_proj_plan_create(ctx, &d, &p)) {
        fprintf(stderr, "plan: %s\n", k3_ctx_last_error(ctx));
        return 1;
    }
    void *w[COPIES], *wfb[COPIES], *x, *q, *f, *g;
    /* random bf16 in [-scale, scale): a 64-bit xorshift, the top 24 bits as a uniform in [0, 1) */
    uint16_t *hw = malloc((size_t)2 * P * H), *hfb = malloc(2 * G * 128), *hx = malloc(2 * 16 * H);
    uint64_t r = 0x6b33u;
    const struct { uint16_t *p; size_t n; float scale; } fill[3] = {
        {hw, (size_t)P * H, 0.02f}, {hfb, (size_t)G * 128, 0.1f}, {hx, (size_t)16 * H, 1.0f}};
    for (int b = 0; b < 3; b++)
        for (size_t i = 0; i < fill[b].n; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            fill[b].p[i] = k3_bf16_from_f32(fill[b].scale * (2.0f * (float)(r >> 40) / 16777216.0f - 1.0f));
        }
    for (int c = 0; c < COPIES; c++) {
        cudaMalloc(&w[c], (size_t)2 * P * H);
        cudaMalloc(&wfb[c], 2 * G * 128);
        cudaMemcpy(w[c], hw, (size_t)2 * P * H, cudaMemcpyHostToDevice);
        cudaMemcpy(wfb[c], hfb, 2 * G * 128, cudaMemcpyHostToDevice);
    }
    cudaMalloc(&x, 2 * 16 * H), cudaMalloc(&q, 2 * 16 * 6144), cudaMalloc(&f, 2 * 16 * 144), cudaMalloc(&g, 2 * 16 * G);
    cudaMemcpy(x, hx, 2 * 16 * H, cudaMemcpyHostToDevice);
    free(hw), free(hfb), free(hx);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    for (int mi = 1; mi < (argc > 1 ? argc : 4); mi++) {
        const int m = argc > 1 ? atoi(argv[mi]) : (const int[]){0, 1, 9, 16}[mi];
        if (m < 1 || m > 16) {
            fprintf(stderr, "m must be 1..16: %s\n", argv[mi]);
            return 1;
        }
        cudaGraph_t gr;
        cudaGraphExec_t ex;
        cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
        for (int i = 0; i < CALLS; i++) k3_kda_proj_run(p, m, x, w[i % COPIES], wfb[i % COPIES], q, f, g, NULL, 0, s);
        cudaStreamEndCapture(s, &gr);
        cudaGraphInstantiate(&ex, gr, 0);
        for (int r = 0; r < 3; r++) cudaGraphLaunch(ex, s);
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        cudaEventRecord(e0, s);
        cudaGraphLaunch(ex, s);
        cudaEventRecord(e1, s);
        if (cudaStreamSynchronize(s) != cudaSuccess) return 2;
        float ms_ = 0;
        cudaEventElapsedTime(&ms_, e0, e1);
        static unsigned long long t[2][160][8];
        const unsigned n = k3x_kda_fused_trace(&t[0][0][0]);
        if (n < 2) return 3;
        const int qb = 128, grid = 132, last = (int)((n - 1) & 1u);
        unsigned long long t0 = ~0ull; /* the earlier launch's first block start */
        for (int b = 0; b < grid; b++) t0 = t[1 - last][b][0] < t0 ? t[1 - last][b][0] : t0;
        printf("M=%d graph %.2f us/call\n", m, 1000.0 * ms_ / CALLS);
        for (int l = 0; l < 2; l++) {
            const int sl = l ? last : 1 - last;
            double qs[128], qe[128];
            for (int b = 0; b < qb; b++) qs[b] = (t[sl][b][0] - t0) / 1e3, qe[b] = (t[sl][b][3] - t0) / 1e3;
            qsort(qs, qb, sizeof(double), cmp), qsort(qe, qb, sizeof(double), cmp);
            printf(" launch %s: QKVG blocks start min/med/max %.2f %.2f %.2f, end min/10%%/med/90%%/max %.2f %.2f %.2f "
                   "%.2f %.2f\n",
                   l ? "N  " : "N-1", qs[0], qs[64], qs[127], qe[0], qe[12], qe[64], qe[115], qe[127]);
            for (int b = qb; b < grid; b++) {
                const unsigned long long *u = t[sl][b];
                printf("  branch %d: start %.2f wait %.2f x %.2f F_AB %.2f reads %.2f fab %.2f end %.2f\n", b - qb,
                       (u[0] - t0) / 1e3, (u[5] - t0) / 1e3, (u[6] - t0) / 1e3, (u[1] - t0) / 1e3,
                       (u[2] - t0) / 1e3, (u[4] - t0) / 1e3, (u[3] - t0) / 1e3);
            }
        }
        cudaGraphExecDestroy(ex), cudaGraphDestroy(gr);
    }
    printf("done\n");
    return 0;
}
