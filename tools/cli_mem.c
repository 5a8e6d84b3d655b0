#include "cli_mem.h"

#include <stdlib.h>
#include <string.h>

#ifdef K3_HAVE_CUDA
#include <cuda_runtime.h>
static void *dev_alloc(size_t n) {
    void *d = NULL;
    return cudaMalloc(&d, n ? n : 1) == cudaSuccess ? d : NULL;
}
static void dev_free(void *d) { cudaFree(d); }
static int dev_put(void *d, const void *h, size_t n) { return cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) == cudaSuccess; }
static int dev_get(void *h, const void *d, size_t n) { return cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) == cudaSuccess; }
static int dev_sync(void) { return cudaDeviceSynchronize() == cudaSuccess; }
#else
static void *dev_alloc(size_t n) { return (void)n, NULL; }
static void dev_free(void *d) { (void)d; }
static int dev_put(void *d, const void *h, size_t n) { return (void)d, (void)h, (void)n, 0; }
static int dev_get(void *h, const void *d, size_t n) { return (void)h, (void)d, (void)n, 0; }
static int dev_sync(void) { return 0; }
#endif

void k3_cli_mem_init(k3_cli_mem *mm, const k3_ctx *ctx) {
    memset(mm, 0, sizeof *mm);
    mm->on_device = k3_ctx_backend(ctx) == K3_BACKEND_CUDA;
}

void k3_cli_mem_free(k3_cli_mem *mm) {
    for (int i = 0; i < mm->n; i++) {
        if (mm->dev[i]) dev_free(mm->dev[i]);
        if (mm->owned_host[i]) free((void *)mm->host[i]);
    }
    mm->n = 0;
}

static int remember(k3_cli_mem *mm, const void *host, void *dev, int owned) {
    if (mm->n >= K3_CLI_MEM_MAX) return 0;
    mm->host[mm->n] = host;
    mm->dev[mm->n] = dev;
    mm->owned_host[mm->n] = owned;
    mm->n++;
    return 1;
}

void *k3_cli_mem_alloc(k3_cli_mem *mm, size_t n) {
    if (mm->on_device) {
        void *d = dev_alloc(n);
        if (d && !remember(mm, NULL, d, 0)) {
            dev_free(d);
            d = NULL;
        }
        return d;
    }
    void *h = calloc(1, n ? n : 1); /* zeroed: host scratch is never read before the library writes it */
    if (h && !remember(mm, h, NULL, 1)) {
        free(h);
        h = NULL;
    }
    return h;
}

const void *k3_cli_mem_in(k3_cli_mem *mm, const void *host, size_t n, int *ok) {
    if (!host || !mm->on_device) return host;
    for (int i = 0; i < mm->n; i++)
        if (mm->host[i] == host && mm->dev[i]) return mm->dev[i];
    void *d = dev_alloc(n);
    if (!d || !dev_put(d, host, n) || !remember(mm, host, d, 0)) {
        if (d) dev_free(d);
        *ok = 0;
        return NULL;
    }
    return d;
}

int k3_cli_mem_out(const k3_cli_mem *mm, void *dst, const void *src, size_t n) {
    if (!mm->on_device) {
        if (dst != src) memcpy(dst, src, n);
        return 1;
    }
    return dev_sync() && dev_get(dst, src, n);
}

int k3_cli_mem_sync(const k3_cli_mem *mm) { return mm->on_device ? dev_sync() : 1; }
