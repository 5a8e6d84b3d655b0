/* NCCL through the caller's communicator (see nccl.h). The entry points are resolved per k3_nccl (no global
 * state): dlopen keeps one copy of the library per process, so a plan reaches the libnccl its communicator was
 * made by whenever that one is loaded under its usual soname. */
#include "comm/nccl.h"

#include <stdlib.h>

#ifdef K3_HAVE_NCCL
#include <dlfcn.h>
/* nccl.h declares a few functions as f() */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

typedef ncclResult_t (*k3_nccl_allreduce_fn)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                             cudaStream_t);
typedef ncclResult_t (*k3_nccl_allgather_fn)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*k3_nccl_reduce_scatter_fn)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                                  ncclComm_t, cudaStream_t);
typedef ncclResult_t (*k3_nccl_group_fn)(void);
typedef ncclResult_t (*k3_nccl_comm_int_fn)(const ncclComm_t, int *);
typedef const char *(*k3_nccl_error_string_fn)(ncclResult_t);
typedef ncclResult_t (*k3_nccl_version_fn)(int *);

struct k3_nccl {
    void *lib;
    ncclComm_t comm;
    int version;
    k3_nccl_allreduce_fn all_reduce;
    k3_nccl_allgather_fn all_gather;
    k3_nccl_reduce_scatter_fn reduce_scatter;
    k3_nccl_group_fn group_start, group_end;
    k3_nccl_error_string_fn error_string;
};

static const char *k3_nccl_err(const k3_nccl *n, ncclResult_t r) {
    const char *s = n->error_string ? n->error_string(r) : NULL;
    return s ? s : "unknown NCCL error";
}

k3_status k3_nccl_open(k3_ctx *ctx, void *comm, int32_t rank, int32_t size, const char *what, k3_nccl **out) {
    *out = NULL;
    if (!comm) return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT, "%s: the NCCL communicator is NULL", what);
    /* the copy the caller's communicator came from, if the process has it; else the system's */
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!lib) lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return k3_fail(ctx, K3_STATUS_NOT_AVAILABLE,
                       "%s: NCCL is not loaded in this process and libnccl.so.2 cannot be opened (%s)", what,
                       dlerror());
    k3_nccl *n = (k3_nccl *)calloc(1, sizeof *n);
    if (!n) {
        dlclose(lib);
        return k3_fail(ctx, K3_STATUS_OUT_OF_MEMORY, "%s: out of host memory", what);
    }
    n->lib = lib;
    n->comm = (ncclComm_t)comm;
    n->all_reduce = (k3_nccl_allreduce_fn)dlsym(lib, "ncclAllReduce");
    n->all_gather = (k3_nccl_allgather_fn)dlsym(lib, "ncclAllGather");
    n->reduce_scatter = (k3_nccl_reduce_scatter_fn)dlsym(lib, "ncclReduceScatter");
    n->group_start = (k3_nccl_group_fn)dlsym(lib, "ncclGroupStart");
    n->group_end = (k3_nccl_group_fn)dlsym(lib, "ncclGroupEnd");
    n->error_string = (k3_nccl_error_string_fn)dlsym(lib, "ncclGetErrorString");
    k3_nccl_comm_int_fn count = (k3_nccl_comm_int_fn)dlsym(lib, "ncclCommCount");
    k3_nccl_comm_int_fn user_rank = (k3_nccl_comm_int_fn)dlsym(lib, "ncclCommUserRank");
    k3_nccl_comm_int_fn cu_device = (k3_nccl_comm_int_fn)dlsym(lib, "ncclCommCuDevice");
    k3_nccl_version_fn get_version = (k3_nccl_version_fn)dlsym(lib, "ncclGetVersion");
    k3_status st = K3_STATUS_SUCCESS;
    if (!n->all_reduce || !n->all_gather || !n->reduce_scatter || !n->group_start || !n->group_end || !count ||
        !user_rank || !cu_device || !get_version) {
        st = k3_fail(ctx, K3_STATUS_NOT_AVAILABLE,
                     "%s: the loaded libnccl lacks ncclAllReduce, ncclAllGather, ncclReduceScatter, ncclGroupStart, "
                     "ncclGroupEnd or a communicator query",
                     what);
        goto fail;
    }
    get_version(&n->version);
    int c = 0, r = 0, dev = -1;
    ncclResult_t e = count(n->comm, &c);
    if (e == ncclSuccess) e = user_rank(n->comm, &r);
    if (e == ncclSuccess) e = cu_device(n->comm, &dev);
    if (e != ncclSuccess) {
        st = k3_fail(ctx, K3_STATUS_COMM_ERROR, "%s: the communicator cannot be queried: %s", what, k3_nccl_err(n, e));
        goto fail;
    }
    if (c != size || r != rank || dev != ctx->device) {
        st = k3_fail(ctx, K3_STATUS_COMM_ERROR,
                     "%s: the communicator is rank %d of %d on device %d; the plan is rank %d of %d on device %d", what,
                     r, c, dev, (int)rank, (int)size, (int)ctx->device);
        goto fail;
    }
    *out = n;
    return K3_STATUS_SUCCESS;
fail:
    k3_nccl_close(n);
    return st;
}

void k3_nccl_close(k3_nccl *n) {
    if (!n) return;
    if (n->lib) dlclose(n->lib);
    free(n);
}

k3_status k3_nccl_allreduce_f32(k3_ctx *ctx, const k3_nccl *n, float *buf, size_t count, void *stream) {
    const ncclResult_t e = n->all_reduce(buf, buf, count, ncclFloat32, ncclSum, n->comm, (cudaStream_t)stream);
    if (e != ncclSuccess)
        return k3_fail(ctx, K3_STATUS_COMM_ERROR, "ncclAllReduce of %zu floats failed: %s", count, k3_nccl_err(n, e));
    return K3_STATUS_SUCCESS;
}

k3_status k3_nccl_allgather_bf16(k3_ctx *ctx, const k3_nccl *n, const void *send, void *recv, size_t count,
                                 void *stream) {
    const ncclResult_t e = n->all_gather(send, recv, count, ncclBfloat16, n->comm, (cudaStream_t)stream);
    if (e != ncclSuccess)
        return k3_fail(ctx, K3_STATUS_COMM_ERROR, "ncclAllGather of %zu BF16 per rank failed: %s", count,
                       k3_nccl_err(n, e));
    return K3_STATUS_SUCCESS;
}

k3_status k3_nccl_reduce_scatter2_f32(k3_ctx *ctx, const k3_nccl *n, const float *send0, float *recv0, size_t count0,
                                      const float *send1, float *recv1, size_t count1, void *stream) {
    ncclResult_t e = n->group_start();
    if (e != ncclSuccess)
        return k3_fail(ctx, K3_STATUS_COMM_ERROR, "ncclGroupStart failed: %s", k3_nccl_err(n, e));
    k3_status st = K3_STATUS_SUCCESS;
    e = n->reduce_scatter(send0, recv0, count0, ncclFloat32, ncclSum, n->comm, (cudaStream_t)stream);
    if (e != ncclSuccess)
        st = k3_fail(ctx, K3_STATUS_COMM_ERROR, "ncclReduceScatter of %zu floats per rank failed: %s", count0,
                     k3_nccl_err(n, e));
    if (st == K3_STATUS_SUCCESS && count1 > 0) {
        e = n->reduce_scatter(send1, recv1, count1, ncclFloat32, ncclSum, n->comm, (cudaStream_t)stream);
        if (e != ncclSuccess)
            st = k3_fail(ctx, K3_STATUS_COMM_ERROR, "ncclReduceScatter of %zu floats per rank failed: %s", count1,
                         k3_nccl_err(n, e));
    }
    /* the group is closed whatever happened inside it, so NCCL is not left in an open group */
    e = n->group_end();
    if (e != ncclSuccess && st == K3_STATUS_SUCCESS)
        st = k3_fail(ctx, K3_STATUS_COMM_ERROR, "ncclGroupEnd of the reduce-scatters failed: %s", k3_nccl_err(n, e));
    return st;
}

int32_t k3_nccl_version(const k3_nccl *n) { return n ? n->version : 0; }

#else /* no NCCL header at configure time */

struct k3_nccl {
    int unused;
};

k3_status k3_nccl_open(k3_ctx *ctx, void *comm, int32_t rank, int32_t size, const char *what, k3_nccl **out) {
    (void)comm, (void)rank, (void)size;
    *out = NULL;
    return k3_fail(ctx, K3_STATUS_NOT_AVAILABLE,
                   "%s: this build has no NCCL (configure found no nccl.h; the engine-driven stages need none)", what);
}

void k3_nccl_close(k3_nccl *n) { (void)n; }

k3_status k3_nccl_allreduce_f32(k3_ctx *ctx, const k3_nccl *n, float *buf, size_t count, void *stream) {
    (void)n, (void)buf, (void)count, (void)stream;
    return k3_fail(ctx, K3_STATUS_NOT_AVAILABLE, "this build has no NCCL");
}

k3_status k3_nccl_allgather_bf16(k3_ctx *ctx, const k3_nccl *n, const void *send, void *recv, size_t count,
                                 void *stream) {
    (void)n, (void)send, (void)recv, (void)count, (void)stream;
    return k3_fail(ctx, K3_STATUS_NOT_AVAILABLE, "this build has no NCCL");
}

k3_status k3_nccl_reduce_scatter2_f32(k3_ctx *ctx, const k3_nccl *n, const float *send0, float *recv0, size_t count0,
                                      const float *send1, float *recv1, size_t count1, void *stream) {
    (void)n, (void)send0, (void)recv0, (void)count0, (void)send1, (void)recv1, (void)count1, (void)stream;
    return k3_fail(ctx, K3_STATUS_NOT_AVAILABLE, "this build has no NCCL");
}

int32_t k3_nccl_version(const k3_nccl *n) {
    (void)n;
    return 0;
}
#endif
