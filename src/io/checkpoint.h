/*
 * Checkpoint reader (internal): the published MoE checkpoint layouts, read into this library's stacked layout.
 *
 * A checkpoint is one of
 *   - a folder holding model.safetensors.index.json, or else exactly one *.safetensors file;
 *   - an index file ({"weight_map": {"tensor name": "shard file", ...}, ...}); shards are resolved relative to
 *     the index's folder, and a shard path that is absolute or has a ".." component is refused (an index must not
 *     make the reader open files outside its checkpoint);
 *   - one safetensors file.
 * Shards are opened on demand and a few stay open (a small least-recently-used cache of descriptors), so a lookup
 * costs one header read at most. A k3_ckpt is for one thread at a time (the cache changes on lookups). Only
 * headers are kept (k3_st_open_header): tensor bytes are read when asked for, into the caller's buffer
 * (k3_ckpt_read) or into one reusable buffer (k3_ckpt_find), so host memory is the buffers asked for plus the
 * largest tensor found, never a shard.
 *
 * The MoE of one layer n is found under the first prefix that has it: "model.layers.<n>.mlp.",
 * "language_model.model.layers.<n>.mlp.", or none (a file holding one layer). Formats:
 *   compressed-tensors MXFP4   experts.<e>.{gate,up,down}_proj.weight_packed U8 [N, K/2], .weight_scale U8 [N, K/32]
 *   compressed-tensors NVFP4   ... .weight_scale F8_E4M3 [N, K/16], .weight_global_scale, .input_global_scale
 *                              (F32 scalars or [1]: the reciprocals of ModelOpt's weight_scale_2 / input_scale)
 *   ModelOpt NVFP4             experts.<e>.{gate,up,down}_proj.{weight, weight_scale, weight_scale_2, input_scale}
 *   stacked (this library)     [experts.]{w13,w2}_weight, _weight_scale, _weight_scale_2, _input_scale
 * Block scales are row-major [N, K/block] in all of them: K3_SCALE_LINEAR.
 */
#ifndef K3_IO_CHECKPOINT_H
#define K3_IO_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"
#include "k3.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k3_ckpt k3_ckpt;

/* Opens a checkpoint (see above). Reads the index (or the single file) now, shards later. IO_ERROR / FORMAT_ERROR
   with a message in err; *out is NULL on failure. */
k3_status k3_ckpt_open(const char *path, k3_ckpt **out, char *err, size_t err_size);
void k3_ckpt_close(k3_ckpt *ck); /* NULL is accepted */

/* The tensor names of the checkpoint (the index's weight_map, or the single file's tensors). */
int32_t k3_ckpt_count(const k3_ckpt *ck);
const char *k3_ckpt_name_at(const k3_ckpt *ck, int32_t i); /* NULL when out of range */
int k3_ckpt_has(const k3_ckpt *ck, const char *name);     /* no file is opened */
/* The index file or single safetensors file the checkpoint was opened from (messages). */
const char *k3_ckpt_path(const k3_ckpt *ck);
/* The layout of a stacked file's 3-D block scales where the file does not say it (k3.quant.scale_layout) and the
   shape fits both layouts: K3_SCALE_LINEAR or K3_SCALE_SWIZZLED, -1 = not given (then such a file is refused). */
void k3_ckpt_set_scale_layout(k3_ckpt *ck, int layout);
int k3_ckpt_scale_layout(const k3_ckpt *ck);
/* A __metadata__ value of a single-file checkpoint (the files k3 writes), or NULL. */
const char *k3_ckpt_metadata(const k3_ckpt *ck, const char *key);

/* The tensor `name` with its bytes, opening its shard when needed. The bytes are read into one buffer of the
   checkpoint, so *out stays valid until the next k3_ckpt_find, k3_ckpt_lookup, k3_ckpt_read or k3_ckpt_close.
   FORMAT_ERROR when the checkpoint has no such tensor or the shard the index names does not hold it; IO_ERROR /
   FORMAT_ERROR when the shard cannot be read. */
k3_status k3_ckpt_find(k3_ckpt *ck, const char *name, const k3_st_tensor **out, char *err, size_t err_size);
/* The same, header only: dtype, shape and nbytes; data is NULL. Valid as k3_ckpt_find's. */
k3_status k3_ckpt_lookup(k3_ckpt *ck, const char *name, const k3_st_tensor **out, char *err, size_t err_size);
/* Bytes [offset, offset + n) of tensor `name` into dst (k3_st_read's checks and messages). */
k3_status k3_ckpt_read(k3_ckpt *ck, const char *name, uint64_t offset, void *dst, size_t n, char *err,
                       size_t err_size);

typedef enum k3_ckpt_moe_format {
    K3_CKPT_MOE_CT_MXFP4 = 0,       /* compressed-tensors, per expert, MXFP4 */
    K3_CKPT_MOE_CT_NVFP4 = 1,       /* compressed-tensors, per expert, NVFP4 (global scales) */
    K3_CKPT_MOE_MODELOPT_NVFP4 = 2, /* ModelOpt, per expert, NVFP4 */
    K3_CKPT_MOE_STACKED = 3         /* w13_weight / w2_weight stacked over the experts */
} k3_ckpt_moe_format;

/* "compressed-tensors MXFP4", "compressed-tensors NVFP4", "ModelOpt NVFP4", "stacked" */
const char *k3_ckpt_moe_format_name(k3_ckpt_moe_format f);

typedef struct k3_ckpt_moe_info {
    k3_ckpt_moe_format format;
    char prefix[160]; /* the names' common prefix ("model.layers.3.mlp.", ""; for stacked ones it may end in
                         "experts.") */
    int32_t num_experts;
    int has_input_scale; /* the checkpoint carries activation (input) scales */
} k3_ckpt_moe_info;

/* Finds layer `layer`'s MoE experts: the prefix, the format and the expert count (experts 0..E-1 must all be
   there: a gap is a FORMAT_ERROR naming the missing expert and tensor). */
k3_status k3_ckpt_moe_detect(const k3_ckpt *ck, int32_t layer, k3_ckpt_moe_info *info, char *err, size_t err_size);

/* One layer's experts in this library's layout, in host memory owned by the struct (k3_ckpt_moe_free):
   w13 = [gate; up] per expert. Scales are K3_SCALE_LINEAR. */
typedef struct k3_ckpt_moe {
    k3_ckpt_moe_info info;
    k3_fp4_format fp4;
    int64_t num_experts, hidden /* L */, inter /* I */;
    uint8_t *w13;         /* [E, 2I, L/2] */
    uint8_t *w13_scale;   /* [E, 2I, L/block] */
    uint8_t *w2;          /* [E, L, I/2] */
    uint8_t *w2_scale;    /* [E, L, I/block] */
    size_t w13_bytes, w13_scale_bytes, w2_bytes, w2_scale_bytes;
    float *w13_scale_2;     /* [E, 2] (gate, up); NVFP4 only, else NULL */
    float *w2_scale_2;      /* [E]; NVFP4 only */
    float *w13_input_scale; /* [E, 2]; NULL when the checkpoint has none */
    float *w2_input_scale;  /* [E] */
    int pair13_scale_2, pair13_input; /* stacked input: w13's scale_2 / input scale is [E, 2] (1) or [E] (0) */
} k3_ckpt_moe;

/* Detects layer `layer`'s experts and checks their layout from the headers, reading no expert bytes: fills info,
   fp4, num_experts, hidden, inter and the four *_bytes (the whole layer's stacked sizes); the buffers stay NULL.
   The per-expert tensors other than expert 0's gate_proj are checked when k3_ckpt_moe_read_expert reads them. */
k3_status k3_ckpt_moe_describe(k3_ckpt *ck, int32_t layer, k3_ckpt_moe *out, char *err, size_t err_size);

/* One expert in this library's layout, read into the caller's buffers (a NULL buffer is not read; its tensors are
   still checked): w13 [2I, L/2] and w13_scale [2I, L/block] = [gate; up], w2 [L, I/2], w2_scale [L, I/block]. */
typedef struct k3_ckpt_expert {
    uint8_t *w13, *w13_scale, *w2, *w2_scale;
    float w13_scale_2[2], w2_scale_2;         /* NVFP4: (gate, up), down */
    float w13_input_scale[2], w2_input_scale; /* when info.has_input_scale */
} k3_ckpt_expert;
/* Reads expert e of a layer described by k3_ckpt_moe_describe (m); the same checks and messages as
   k3_ckpt_load_moe. Host memory: the caller's buffers only (the bytes are read straight into them). */
k3_status k3_ckpt_moe_read_expert(k3_ckpt *ck, const k3_ckpt_moe *m, int64_t e, k3_ckpt_expert *x, char *err,
                                  size_t err_size);

/* Detects and loads layer `layer`'s experts into *out (zeroed first; freed again on failure), each expert read
   straight into its place in the stacked buffers. Every missing tensor,
   wrong dtype or shape, inconsistency between experts, or non-finite / non-positive global scale is a
   FORMAT_ERROR naming the tensor and what was expected. compressed-tensors global scales are converted to
   scale_2 = 1 / global_scale (fp32 division). Stacked files with 128x4-swizzled scales are UNSUPPORTED here. */
k3_status k3_ckpt_load_moe(k3_ckpt *ck, int32_t layer, k3_ckpt_moe *out, char *err, size_t err_size);
void k3_ckpt_moe_free(k3_ckpt_moe *m); /* frees the buffers, zeroes the struct; NULL is accepted */

/* ---- the block's other tensors (checkpoint_block.c) ------------------------------------------------------
 * Layer n's router, shared experts and latent projections, under the same prefixes as its experts
 * ("model.layers.<n>.mlp.", "language_model.model.layers.<n>.mlp.", none), by either naming:
 *   group     published names                          this library's (stacked) names
 *   router    gate.weight [E, H] BF16/F32,             gate_weight, e_score_correction_bias
 *             gate.e_score_correction_bias [E] F32 (optional: a router may run without it)
 *   shared    shared_experts.{gate,up}_proj.weight     shared_gate_up_weight [2 Is, H] = [gate; up],
 *             [Is, H], shared_experts.down_proj.weight shared_down_weight [H, Is]
 *             [H, Is]
 *   latent    routed_expert_down_proj.weight [L, H],   down_proj_weight, norm_weight, up_proj_weight
 *             routed_expert_norm.weight [L],
 *             routed_expert_up_proj.weight [H, L]
 * All BF16 unless said. A group is all or nothing: a partial group, or one named both ways, is a FORMAT_ERROR
 * naming the tensor that is missing (or both names). E must be the experts' E, L the experts' L, and every H the
 * same (H = L when the layer has no latent projections). */
typedef enum k3_ckpt_block_group {
    K3_CKPT_BLOCK_ROUTER = 0,
    K3_CKPT_BLOCK_SHARED = 1,
    K3_CKPT_BLOCK_LATENT = 2
} k3_ckpt_block_group;
#define K3_CKPT_BLOCK_GROUPS 3

/* One tensor of the block: its full name, dtype and shape (name[0] == '\0' when absent). */
typedef struct k3_ckpt_block_tensor {
    char name[400];
    k3_st_dtype dtype;
    int32_t ndim;
    int64_t shape[2];
} k3_ckpt_block_tensor;

typedef struct k3_ckpt_block_info {
    char prefix[160];                  /* where the block's tensors were found ("" for none) */
    int has[K3_CKPT_BLOCK_GROUPS];     /* which groups the layer has */
    int stacked[K3_CKPT_BLOCK_GROUPS]; /* 1: the group uses this library's names */
    int has_bias;                      /* the router has e_score_correction_bias */
    k3_ckpt_block_tensor gate, bias, shared_gate, shared_up, shared_down, down_proj, norm, up_proj;
    /* shared_gate holds shared_gate_up_weight for stacked names (shared_up is then absent) */
    int64_t num_experts, latent /* L */, hidden /* H */, shared_inter /* Is; 0 without shared experts */;
} k3_ckpt_block_info;

/* Finds layer `layer`'s block tensors (headers only: no tensor data is copied). num_experts and latent are the
   experts' E and L (k3_ckpt_load_moe), which the shapes must agree with. A layer with none of the groups is not
   an error (every has[] is 0). */
k3_status k3_ckpt_block_detect(k3_ckpt *ck, int32_t layer, int64_t num_experts, int64_t latent,
                               k3_ckpt_block_info *info, char *err, size_t err_size);

/* The groups' tensors as host copies owned by the struct (k3_ckpt_block_free); NULL for an absent group.
   BF16 tensors are uint16_t bit patterns; gate is BF16 or F32 as gate_dtype says. shared_gate_up is stacked
   [gate; up] = [2 Is, H]. NaN/Inf in gate, bias or norm is a FORMAT_ERROR naming the tensor and element. */
typedef struct k3_ckpt_block {
    k3_ckpt_block_info info;
    k3_st_dtype gate_dtype;
    void *gate;               /* [E, H] */
    float *bias;              /* [E] or NULL */
    uint16_t *shared_gate_up; /* [2 Is, H] */
    uint16_t *shared_down;    /* [H, Is] */
    uint16_t *down_proj;      /* [L, H] */
    uint16_t *norm;           /* [L] */
    uint16_t *up_proj;        /* [H, L] */
    size_t gate_bytes, bias_bytes, shared_gate_up_bytes, shared_down_bytes, down_proj_bytes, norm_bytes,
        up_proj_bytes;
} k3_ckpt_block;

/* Detects and loads; *out is zeroed first and freed again on failure. */
k3_status k3_ckpt_load_block(k3_ckpt *ck, int32_t layer, int64_t num_experts, int64_t latent, k3_ckpt_block *out,
                             char *err, size_t err_size);
void k3_ckpt_block_free(k3_ckpt_block *b); /* NULL is accepted */

#ifdef __cplusplus
}
#endif
#endif
