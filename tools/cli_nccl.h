/* The CLI's multi-GPU commands as the caller of the library: they count the GPUs, make the NCCL communicators the
 * plans take (k3_parallel_desc.nccl_comm) and time a bare all-reduce. libnccl is opened at run time
 * (libnccl.so.2), as the library does, so the k3 binary has no link dependency on it. */
#ifndef K3_TOOLS_CLI_NCCL_H
#define K3_TOOLS_CLI_NCCL_H

#include <stddef.h>
#include <stdint.h>

typedef struct k3_cli_nccl {
    void *lib;
    void *init_all, *destroy, *abort_comm, *all_reduce, *error_string; /* entry points */
} k3_cli_nccl;

/* CUDA devices this process sees (0 in a build without CUDA, or without a driver or device). */
int32_t k3_cli_gpu_count(void);
/* Sets NCCL_NVLS_ENABLE=0 unless the environment already has it (NVLink SHARP / multicast off), then opens
   libnccl; 0 after printing why not (a build without NCCL, or no libnccl.so.2), each line prefixed by cmd. */
int k3_cli_nccl_open(k3_cli_nccl *n, const char *cmd);
void k3_cli_nccl_close(k3_cli_nccl *n);
/* One communicator per GPU 0..count-1 (ncclCommInitAll), comms[r] for rank r; 0 after printing. */
int k3_cli_nccl_comms(const k3_cli_nccl *n, int32_t count, void **comms, const char *cmd);
/* Destroys the communicators (abort = 1: after a failure, without waiting for peers). */
void k3_cli_nccl_free(const k3_cli_nccl *n, void **comms, int32_t count, int abort);
/* ncclAllReduce(sum) of count floats in place on stream; 0 with the reason in err. */
int k3_cli_nccl_allreduce_f32(const k3_cli_nccl *n, float *buf, size_t count, void *comm, void *stream, char *err,
                              size_t err_size);

#endif
