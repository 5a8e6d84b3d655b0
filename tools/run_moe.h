/* k3 run moe, shared by its command (tools/cmd_run.c) and its file reader (tools/run_moe_read.c). */
#ifndef K3_TOOLS_RUN_MOE_H
#define K3_TOOLS_RUN_MOE_H

#include "io/safetensors.h"
#include "k3.h"

#define CMD "k3 run moe"

typedef struct run_opts {
    const char *weights, *input, *output, *device;
    const char *act;
    float situ_beta, situ_lb, limit, scaling;
    int has_situ_beta, has_situ_lb, has_limit;
    k3_moe_mode mode;
    int64_t top_k;
    int has_top_k;
    int32_t layer; /* --layer: the weights are a checkpoint and this its layer */
    int has_layer;
    int json;
    int32_t tp; /* --tp N / --ep N: N ranks on the CPU (0 or 1: one) */
    int ep;     /* --ep: the N ranks are expert-parallel */
    k3_scale_layout scale_layout; /* --scale-layout, when has_scale_layout */
    int has_scale_layout;
} run_opts;

/* Everything one run reads, resolved from the two files. */
typedef struct run_setup {
    k3_moe_desc md;
    k3_moe_weights mw;
    int32_t e;
    int64_t l, inter, m, width; /* width: the hidden_states row length (L, or H for the latent block) */
    const k3_st_tensor *x, *ids, *wts, *gate, *bias;
    int latent;
    int64_t h, is;
    k3_latent_moe_weights lw;
    const k3_moe_layer *layer; /* --layer: the tensors come from this checkpoint layer (not a file) */
    k3_st_tensor gate_t, bias_t; /* the layer's router as tensors (gate and bias point here) */
    float *w13_in_max;         /* --layer --mode w4a4: per expert max(gate, up) input scale (owned) */
    int scale_layout_given;    /* --scale-layout: K3_SCALE_LINEAR or K3_SCALE_SWIZZLED, -1 = not given */
} run_setup;

/* 1 when every tensor of the weights and input files has a name k3 run moe knows, else 0 after printing the first
 * unknown one. */
int k3_run_only_known(const k3_st_file *wf, const k3_st_file *xf);
/* The experts' tensors of the weights file into s (format, layout and sizes from the dtypes and shapes); 0 after
 * printing what was wrong. */
int k3_run_read_experts(const k3_st_file *wf, run_setup *s, const k3_act_desc *act, k3_moe_mode mode);
/* The input tensors and, when routing, the router (and latent block) tensors of the weights; 0 after printing. */
int k3_run_read_routing(const k3_st_file *wf, const k3_st_file *xf, run_setup *s, const run_opts *o);
/* The input tensors alone: 1 when the input gives the routing (topk_ids), 2 when the run must route, 0 after
 * printing what was wrong. */
int k3_run_read_input(const k3_st_file *xf, run_setup *s, const run_opts *o);
/* 1 when every tensor of the input file has a name k3 run moe knows. */
int k3_run_only_known_input(const k3_st_file *xf);

/* Plans and runs what the files describe and writes the output file (tools/run_moe_exec.c); t0: when the command
   started (k3_cli_now, for --json). Returns the exit status. */
int k3_run_execute(k3_ctx *ctx, const run_opts *o, run_setup *s, const k3_st_file *wf, const k3_st_file *xf,
                   double t0);

/* The router's descriptor and the whole (unsplit) latent block's, from the options and the files. */
void k3_run_router_desc(const run_opts *o, const run_setup *s, k3_router_desc *rd);
void k3_run_latent_desc(const run_opts *o, const run_setup *s, k3_latent_moe_desc *ld);
/* The output y [M, H or L] (and the routing, when ids is not NULL) checked for NaN / Inf, written to --output, and
   the summary line or --json object; device: "cpu" or "cuda". Returns the exit status. */
int k3_run_finish(const run_opts *o, const run_setup *s, const uint16_t *y, const int32_t *ids, const float *wts,
                  const char *device, double t0);

/* The --help text (tools/run_moe_help.c). */
void k3_run_moe_help(void);

/* ---- --layer (tools/run_moe_ckpt.c) ---- */
/* The experts of a checkpoint layer into s (NVFP4 or MXFP4, linear scales, [E, 2] scale_2); 0 after printing. */
int k3_run_read_layer(const k3_moe_layer *ly, run_setup *s, const k3_act_desc *act, const run_opts *o);
/* For an input without topk_ids: the layer's router and, when it has them, its latent block; 0 after printing. */
int k3_run_layer_routing(const k3_moe_layer *ly, run_setup *s, const run_opts *o);
/* Bytes of the layer's buffer p (0 when p is none of them). */
size_t k3_run_layer_bytes(const run_setup *s, const void *p);
/* 1 when path is a folder or a .json index (a checkpoint that needs --layer). */
int k3_run_is_checkpoint_path(const char *path);
/* 0 after printing when output would land in the checkpoint folder, or be a shard the index lists. */
int k3_run_output_outside(const char *weights, const char *output);
/* The --json summary: one object on stdout. */
void k3_run_print_json(const run_opts *o, const run_setup *s, const char *ran, const char *device, double seconds);

/* ---- --tp N / --ep N (tools/run_moe_tp.c) ---- */
/* 0 after printing why the weights cannot be split n ways (activation layout, scale layout, divisibility; ep:
   by whole experts). */
int k3_run_tp_check(const run_setup *s, int32_t n, int ep);
#define K3_RUN_SHARD_BUFS 16
/* One rank's shard, cut from s's host weights (buffers owned; mw / lw point into them and at s's whole tensors). */
typedef struct k3_run_shard {
    uint8_t *w13, *w13s, *w2, *w2s, *sgu, *sdown, *g13, *g2, *in13, *in2;
    int32_t *map;   /* EP: global id -> this rank's */
    int32_t e0, ne; /* EP: its experts [e0, e0 + ne) */
    k3_moe_weights mw;
    k3_latent_moe_weights lw;
    const void *own[K3_RUN_SHARD_BUFS]; /* the buffers above that were cut, and their bytes */
    size_t own_bytes[K3_RUN_SHARD_BUFS];
    int nown;
} k3_run_shard;
/* Rank `rank` of n's shard of s's host weights (TP slices, or EP whole experts); 0 when out of host memory (free
   it either way). */
int k3_run_shard_cut(const run_setup *s, int32_t rank, int32_t n, int ep, k3_run_shard *r);
void k3_run_shard_free(k3_run_shard *r);
/* Bytes of the shard's own buffer p; 0 when p is not one (a whole tensor of s, or NULL). */
size_t k3_run_shard_bytes(const k3_run_shard *r, const void *p);
/* The rank's descriptor: ld (the whole block's) with the rank's layout, rank, size and slices of I / Is or experts;
   nccl_comm as ld has it. */
void k3_run_shard_desc(const k3_latent_moe_desc *ld, const run_setup *s, const k3_run_shard *cut, int32_t rank,
                       int32_t n, int ep, k3_latent_moe_desc *out);
/* n CPU ranks on shards cut from s's host weights: the latent block ld (its router and latent weights in s->lw;
   routing into out_ids / out_wts), or with ld NULL the experts alone on the given routing; y [m, H or L]. 0 after
   printing. */
int k3_run_tp(k3_ctx *ctx, const k3_latent_moe_desc *ld, const run_setup *s, int32_t n, int ep, const void *x,
              const int32_t *ids, const float *wts, uint16_t *y, int32_t *out_ids, float *out_wts);

/* ---- --tp N / --ep N with --device cuda (tools/run_moe_gpu.c) ---- */
/* 0 after printing when the N GPU ranks cannot run here: fewer GPUs than ranks, no CUDA or NCCL in the build, or
   libnccl.so.2 not loadable. Needs no files. */
int k3_run_gpus_ready(const run_opts *o);
/* The latent block as o->tp ranks on GPUs 0..N-1, one host thread each, reduced by the library through NCCL
   communicators made here; rank 0's output written as k3_run_finish does. Returns the exit status. */
int k3_run_gpus(const run_opts *o, run_setup *s, const k3_st_file *wf, const k3_st_file *xf, double t0);
/* Bytes of the tensor whose data is p (either file, or the checkpoint layer); 0 when none (tools/run_moe_exec.c). */
size_t k3_run_data_bytes(const run_setup *s, const k3_st_file *wf, const k3_st_file *xf, const void *p);

#endif
