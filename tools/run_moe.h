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
} run_setup;

/* 1 when every tensor of the weights and input files has a name k3 run moe knows, else 0 after printing the first
 * unknown one. */
int k3_run_only_known(const k3_st_file *wf, const k3_st_file *xf);
/* The experts' tensors of the weights file into s (format, layout and sizes from the dtypes and shapes); 0 after
 * printing what was wrong. */
int k3_run_read_experts(const k3_st_file *wf, run_setup *s, const k3_act_desc *act, k3_moe_mode mode);
/* The input tensors and, when routing, the router (and latent block) tensors of the weights; 0 after printing. */
int k3_run_read_routing(const k3_st_file *wf, const k3_st_file *xf, run_setup *s, const run_opts *o);

#endif
