/* Buffers for CLI commands that run on either backend: on a CUDA context the library takes device pointers, so
 * host data is mirrored to the device (and results copied back); on a CPU context the host buffers are used
 * directly. Every mirror is owned by the k3_cli_mem and freed with it. */
#ifndef K3_TOOLS_CLI_MEM_H
#define K3_TOOLS_CLI_MEM_H

#include <stddef.h>

#include "k3.h"

#define K3_CLI_MEM_MAX 64

typedef struct k3_cli_mem {
    int on_device;
    int n;
    const void *host[K3_CLI_MEM_MAX];
    void *dev[K3_CLI_MEM_MAX];
    int owned_host[K3_CLI_MEM_MAX]; /* 1 when host[i] was allocated here (CPU scratch) */
} k3_cli_mem;

/* on_device = 1 for a CUDA context. */
void k3_cli_mem_init(k3_cli_mem *mm, const k3_ctx *ctx);
void k3_cli_mem_free(k3_cli_mem *mm);
/* Scratch of n bytes in the context's memory (device or host); NULL on failure. */
void *k3_cli_mem_alloc(k3_cli_mem *mm, size_t n);
/* The context-side view of host data: the same pointer on the CPU, a device copy (made once per host pointer)
 * on CUDA. NULL host gives NULL. On failure returns NULL and sets *ok = 0. */
const void *k3_cli_mem_in(k3_cli_mem *mm, const void *host, size_t n, int *ok);
/* Copies n bytes of context-side src to host dst (memcpy on the CPU; waits for the device first). */
int k3_cli_mem_out(const k3_cli_mem *mm, void *dst, const void *src, size_t n);
/* Waits for the device (no-op on the CPU); 1 on success. */
int k3_cli_mem_sync(const k3_cli_mem *mm);

#endif
