/* k3 bench block's options, shared by its one-GPU run (tools/block_bench.c) and its N-GPU run over NCCL
 * (tools/block_bench_ranks.c). */
#ifndef K3_TOOLS_BLOCK_BENCH_H
#define K3_TOOLS_BLOCK_BENCH_H

#include <stdint.h>
#include <stdio.h>

#include "block_synth.h"
#include "k3.h"

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
    int trace;      /* --trace (builds with -DK3_MOE_TRACE only): 1 block, 2 the experts alone */
    const char *table; /* --table FILE: the plan table every context loads (NULL: the embedded one) */
    int force;         /* --force: load it whatever its device key */
} bb_opts;

/* The N-GPU run (o->ranks > 0): exit status. */
int k3_bench_block_ranks(const bb_opts *o);

#define BB_VARIANTS 6 /* block, router, down, experts, norm+up, shared */

/* One token count of the one-GPU measurement: median microseconds per call under graph replay. */
typedef struct bb_point {
    int64_t m;
    double us[BB_VARIANTS]; /* the block, then each stage alone: router, down, experts, norm+up, shared */
    double sum_us;          /* the five stages' sum */
    double main_us;         /* the main path's: router + down + experts + norm+up (the shared experts hidden) */
    int32_t touched;        /* distinct routed experts the block's routing reads on this rank */
    double bytes, floor_us; /* bytes the block reads and writes; their time at the HBM read ceiling */
    k3_latent_schedule schedule; /* the schedule the block ran at this m */
} bb_point;

typedef struct bb_measure bb_measure;
/* Called once the weights are on the device, before the first point (out fields set). */
typedef void (*bb_ready_fn)(void *user, const bb_measure *bm);
/* Called after each point j (0-based), in the order of ms. */
typedef void (*bb_point_fn)(void *user, const bb_measure *bm, const bb_point *p, int j);

/* What `k3 bench block` measures on one GPU, for its own rank shapes and for `k3 demo` on CUDA. */
struct bb_measure {
    /* in */
    const char *who;           /* prefix of the error messages ("k3 bench block") */
    k3_ctx *ctx;               /* a CUDA context */
    const k3_synth_block *hb;  /* host weights; hb->d is the rank (its max_tokens bounds every M) */
    const int32_t *expert_map; /* host [hb->d.router.num_experts]: global id -> local expert or -1; NULL: none */
    k3_synth_rng *rng;         /* draws x: max_tokens rows of BF16 */
    const int64_t *ms;
    int nm;
    int64_t reps;              /* timed replays per variant (the median is reported) */
    int32_t max_copies;        /* at most this many weight copies (the cold rule asks for more on small ranks;
                                  0: no cap) */
    FILE *progress;            /* the copies line before copying them, or NULL */
    bb_ready_fn on_ready;      /* optional */
    bb_point_fn on_point;      /* optional */
    void *user;
    k3_latent_schedule schedule; /* the block's schedule (AUTO: the plan's choice) */
    int trace;                 /* builds with -DK3_MOE_TRACE: 1 / 2 = the block / the experts traced per point */
    /* out */
    k3_arch_info arch;
    int32_t copies;            /* weight copies rotated */
    int32_t calls;             /* back-to-back calls captured per graph (4 per copy) */
    double copy_s;             /* seconds to copy every weight copy to the device */
};

/* The host weights copied to the device bm->copies times, plans for the block and each stage, then for each M
   the six variants timed together (k3_bench_graph_time_n, interleaved). 1 on success; else a message on stderr
   and 0 (a build without CUDA always fails). */
int k3_bench_block_measure(bb_measure *bm);
/* The table's column header and one row (text), and one row as a JSON object, as `k3 bench block` prints them. */
void k3_bench_block_header(FILE *f);
void k3_bench_block_row(FILE *f, const bb_point *p);
void k3_bench_block_row_json(FILE *f, const bb_point *p);
/* "shared-beside", "router-beside", "serial", "select-beside", "logits-first" (or "auto"), as --schedule spells
 * them. */
const char *k3_bench_schedule_name(k3_latent_schedule s);

#endif
