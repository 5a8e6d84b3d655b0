/* k3 bench block's options, shared by its one-GPU run (tools/block_bench.c) and its N-GPU run over NCCL
 * (tools/block_bench_ranks.c). */
#ifndef K3_TOOLS_BLOCK_BENCH_H
#define K3_TOOLS_BLOCK_BENCH_H

#include <stdint.h>

#define BB_MAX_LIST 16
#define BB_MAX_M 16 /* the CUDA block's linear plans take up to 32 tokens; decode sizes */
#define BB_SEED 0x4b33426c6bULL /* "K3Blk" */
/* The full K3 block a rank's shard is cut from: experts, their intermediate, the shared experts' intermediate. */
#define BB_K3_EXPERTS 896
#define BB_K3_INTER 3072
#define BB_K3_SHARED 6144

typedef struct bb_opts {
    int64_t ms[BB_MAX_LIST];
    int nm, json, ep;
    int64_t reps;
    int has_config; /* --config given (ep: which) */
    int32_t ranks;  /* --tp N / --ep N: N GPUs over NCCL (0: the one-GPU rank bench) */
    int ranks_ep;   /* --ep N */
    int schedule;   /* --schedule: a k3_latent_schedule (0 = AUTO) */
} bb_opts;

/* The N-GPU run (o->ranks > 0): exit status. */
int k3_bench_block_ranks(const bb_opts *o);

#endif
