#define _POSIX_C_SOURCE 200809L /* setenv */
#include "cli_nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef K3_HAVE_CUDA
#include <cuda_runtime.h>
int32_t k3_cli_gpu_count(void) {
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return (int32_t)c;
}
#else
int32_t k3_cli_gpu_count(void) { return 0; }
#endif

#if defined(K3_HAVE_CUDA) && defined(K3_HAVE_NCCL)
#include <dlfcn.h>
/* nccl.h declares a few functions as f() */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

typedef ncclResult_t (*init_all_fn)(ncclComm_t *, int, const int *);
typedef ncclResult_t (*comm_fn)(ncclComm_t);
typedef ncclResult_t (*all_reduce_fn)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                      cudaStream_t);
typedef const char *(*error_string_fn)(ncclResult_t);

static const char *nccl_err(const k3_cli_nccl *n, ncclResult_t r) {
    const char *s = n->error_string ? ((error_string_fn)n->error_string)(r) : NULL;
    return s ? s : "unknown NCCL error";
}

int k3_cli_nccl_open(k3_cli_nccl *n, const char *cmd) {
    memset(n, 0, sizeof *n);
    /* before the first NCCL call: the machines this runs on keep NVLink multicast off; a user's value stays */
    if (setenv("NCCL_NVLS_ENABLE", "0", 0) != 0) {
        fprintf(stderr, "%s: cannot set NCCL_NVLS_ENABLE in the environment\n", cmd);
        return 0;
    }
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "%s: NCCL is needed for ranks on several GPUs and libnccl.so.2 cannot be opened (%s)\n", cmd,
                dlerror());
        return 0;
    }
    n->lib = lib;
    /* function pointers through void *: dlsym's own convention */
    n->init_all = dlsym(lib, "ncclCommInitAll");
    n->destroy = dlsym(lib, "ncclCommDestroy");
    n->abort_comm = dlsym(lib, "ncclCommAbort");
    n->all_reduce = dlsym(lib, "ncclAllReduce");
    n->error_string = dlsym(lib, "ncclGetErrorString");
    if (!n->init_all || !n->destroy || !n->abort_comm || !n->all_reduce) {
        fprintf(stderr, "%s: the libnccl.so.2 found lacks ncclCommInitAll, ncclCommDestroy, ncclCommAbort or "
                        "ncclAllReduce\n",
                cmd);
        k3_cli_nccl_close(n);
        return 0;
    }
    return 1;
}

void k3_cli_nccl_close(k3_cli_nccl *n) {
    if (n->lib) dlclose(n->lib);
    memset(n, 0, sizeof *n);
}

int k3_cli_nccl_comms(const k3_cli_nccl *n, int32_t count, void **comms, const char *cmd) {
    ncclComm_t *c = (ncclComm_t *)calloc((size_t)count, sizeof *c);
    int *dev = (int *)calloc((size_t)count, sizeof *dev);
    int ok = c && dev;
    if (!ok) fprintf(stderr, "%s: out of host memory\n", cmd);
    for (int32_t r = 0; ok && r < count; r++) dev[r] = (int)r;
    if (ok) {
        const ncclResult_t e = ((init_all_fn)n->init_all)(c, (int)count, dev);
        if (e != ncclSuccess) {
            fprintf(stderr, "%s: ncclCommInitAll over GPUs 0..%d failed: %s\n", cmd, (int)count - 1, nccl_err(n, e));
            ok = 0;
        }
    }
    for (int32_t r = 0; ok && r < count; r++) comms[r] = c[r];
    free(c), free(dev);
    return ok;
}

void k3_cli_nccl_free(const k3_cli_nccl *n, void **comms, int32_t count, int abort) {
    for (int32_t r = 0; r < count; r++)
        if (comms[r]) {
            ((comm_fn)(abort ? n->abort_comm : n->destroy))((ncclComm_t)comms[r]);
            comms[r] = NULL;
        }
}

int k3_cli_nccl_allreduce_f32(const k3_cli_nccl *n, float *buf, size_t count, void *comm, void *stream, char *err,
                              size_t err_size) {
    const ncclResult_t e = ((all_reduce_fn)n->all_reduce)(buf, buf, count, ncclFloat32, ncclSum, (ncclComm_t)comm,
                                                           (cudaStream_t)stream);
    if (e == ncclSuccess) return 1;
    snprintf(err, err_size, "ncclAllReduce of %zu floats: %s", count, nccl_err(n, e));
    return 0;
}

#else /* no CUDA or no nccl.h at configure time */

int k3_cli_nccl_open(k3_cli_nccl *n, const char *cmd) {
    memset(n, 0, sizeof *n);
    fprintf(stderr, "%s: this build has no %s (ranks on several GPUs reduce through NCCL; configure with CUDA and "
                    "nccl.h)\n",
            cmd,
#ifdef K3_HAVE_CUDA
            "NCCL"
#else
            "CUDA backend"
#endif
    );
    return 0;
}

void k3_cli_nccl_close(k3_cli_nccl *n) { memset(n, 0, sizeof *n); }

int k3_cli_nccl_comms(const k3_cli_nccl *n, int32_t count, void **comms, const char *cmd) {
    (void)n, (void)count, (void)comms;
    fprintf(stderr, "%s: this build has no NCCL\n", cmd);
    return 0;
}

void k3_cli_nccl_free(const k3_cli_nccl *n, void **comms, int32_t count, int abort) {
    (void)n, (void)comms, (void)count, (void)abort;
}

int k3_cli_nccl_allreduce_f32(const k3_cli_nccl *n, float *buf, size_t count, void *comm, void *stream, char *err,
                              size_t err_size) {
    (void)n, (void)buf, (void)count, (void)comm, (void)stream;
    snprintf(err, err_size, "this build has no NCCL");
    return 0;
}
#endif
