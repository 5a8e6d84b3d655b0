/* k3 run moe --layer N: one layer of a checkpoint (the public k3_checkpoint API) into a run_setup, the --output
 * checks against a checkpoint folder or index, and the --json summary. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "run_moe.h"

static const char *source_name(k3_checkpoint_format f) {
    switch (f) {
    case K3_CHECKPOINT_CT_MXFP4: return "compressed-tensors-mxfp4";
    case K3_CHECKPOINT_CT_NVFP4: return "compressed-tensors-nvfp4";
    case K3_CHECKPOINT_MODELOPT_NVFP4: return "modelopt-nvfp4";
    default: return "stacked";
    }
}

/* A tensor header over host data the layer owns, so the run reads the router as it reads a file's. */
static void fake_tensor(k3_st_tensor *t, const char *name, k3_st_dtype dt, int64_t rows, int64_t cols,
                        const void *data, size_t nbytes) {
    memset(t, 0, sizeof *t);
    t->name = name;
    t->dtype = dt;
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->data = data;
    t->nbytes = nbytes;
}

int k3_run_read_layer(const k3_moe_layer *ly, run_setup *s, const k3_act_desc *act, const run_opts *o) {
    if (act->kind == K3_ACT_RELU2_NO_MUL || act->kind == K3_ACT_SWIGLUOAI) {
        fprintf(stderr,
                CMD ": --act %s: a checkpoint layer's experts are stacked [gate; up] (w13 [E, 2I, L]), which %s; "
                    "use %s\n",
                k3_act_name(act->kind),
                act->kind == K3_ACT_RELU2_NO_MUL ? "relu2 (one up matrix, [E, I, L]) does not read"
                                                 : "swigluoai (interleaved gate/up rows) would misread",
                act->kind == K3_ACT_RELU2_NO_MUL ? "a stacked file without --layer" : "--act swigluoai_uninterleave");
        return 0;
    }
    const int nv = ly->fp4 == K3_FP4_NVFP4;
    k3_moe_desc *d = &s->md;
    k3_moe_desc_init(d);
    d->num_experts = ly->num_experts;
    d->hidden = ly->latent;
    d->inter = ly->inter;
    d->format = nv ? K3_WEIGHT_NVFP4 : K3_WEIGHT_MXFP4;
    d->scale_layout = K3_SCALE_LINEAR;
    d->w13_separate_scale_2 = nv;
    d->mode = o->mode;
    d->act = *act;
    s->layer = ly;
    s->e = ly->num_experts;
    s->l = ly->latent;
    s->inter = ly->inter;
    memset(&s->mw, 0, sizeof s->mw);
    s->mw.w13 = ly->w13;
    s->mw.w13_scale = ly->w13_scale;
    s->mw.w2 = ly->w2;
    s->mw.w2_scale = ly->w2_scale;
    s->mw.w13_scale_2 = ly->w13_scale_2;
    s->mw.w2_scale_2 = ly->w2_scale_2;
    if (o->mode == K3_MOE_W4A4) {
        if (!nv) {
            fprintf(stderr, CMD ": --mode w4a4 needs NVFP4 experts (layer %d's are MXFP4)\n", (int)ly->layer);
            return 0;
        }
        if (!ly->w13_input_scale || !ly->w2_input_scale) {
            fprintf(stderr,
                    CMD ": --mode w4a4: layer %d has no activation scales (the experts' input_scale / "
                        "input_global_scale tensors, or w13_input_scale / w2_input_scale, are missing)\n",
                    (int)ly->layer);
            return 0;
        }
        /* gate and up read the same x, which is quantized once: the larger scale keeps both in range */
        if (!(s->w13_in_max = malloc(sizeof(float) * (size_t)ly->num_experts))) {
            fprintf(stderr, CMD ": out of memory\n");
            return 0;
        }
        for (int32_t e = 0; e < ly->num_experts; e++) {
            const float g = ly->w13_input_scale[2 * e], u = ly->w13_input_scale[2 * e + 1];
            s->w13_in_max[e] = g > u ? g : u;
        }
        s->mw.w13_input_scale = s->w13_in_max;
        s->mw.w2_input_scale = ly->w2_input_scale;
    }
    return 1;
}

/* The router and, when the layer has them, the latent block, for an input that has no topk_ids. */
int k3_run_layer_routing(const k3_moe_layer *ly, run_setup *s, const run_opts *o) {
    if (!ly->gate) {
        fprintf(stderr,
                CMD ": input has no topk_ids, so layer %d must have a router: tensor 'gate.weight' (or "
                    "'gate_weight') [E, H] is missing under the layer's prefix\n",
                (int)ly->layer);
        return 0;
    }
    const int latent = ly->down_proj != NULL;
    const int64_t want = latent ? ly->hidden : ly->latent;
    if (s->width != want) {
        fprintf(stderr,
                CMD ": input: hidden_states is [%lld, %lld] but layer %d's router reads rows of %lld (%s)\n",
                (long long)s->m, (long long)s->width, (int)ly->layer, (long long)want,
                latent ? "H, the latent block's input" : "L, the experts' width: the layer has no latent projections");
        return 0;
    }
    fake_tensor(&s->gate_t, "gate.weight", ly->gate_dtype == K3_DTYPE_F32 ? K3_ST_F32 : K3_ST_BF16, s->e, want,
                ly->gate, ly->gate_bytes);
    s->gate = &s->gate_t;
    if (ly->bias) {
        fake_tensor(&s->bias_t, "gate.e_score_correction_bias", K3_ST_F32, s->e, 0, ly->bias, ly->bias_bytes);
        s->bias = &s->bias_t;
    }
    if (!latent) {
        if (ly->shared_gate_up)
            fprintf(stderr,
                    CMD ": note: layer %d has shared experts but no latent projections; k3 run moe runs shared "
                        "experts only inside the latent block, so the output holds the routed experts alone\n",
                    (int)ly->layer);
        return 1;
    }
    s->latent = 1;
    s->h = ly->hidden;
    s->is = ly->shared_gate_up ? ly->shared_inter : 0;
    memset(&s->lw, 0, sizeof s->lw);
    s->lw.down_proj = ly->down_proj;
    s->lw.norm = ly->norm;
    s->lw.up_proj = ly->up_proj;
    s->lw.shared_gate_up = ly->shared_gate_up;
    s->lw.shared_down = ly->shared_down;
    return 1;
}

size_t k3_run_layer_bytes(const run_setup *s, const void *p) {
    const k3_moe_layer *ly = s->layer;
    if (!ly || !p) return 0;
    const size_t e = (size_t)ly->num_experts;
    const struct {
        const void *p;
        size_t n;
    } map[] = {{ly->w13, ly->w13_bytes},
               {ly->w13_scale, ly->w13_scale_bytes},
               {ly->w2, ly->w2_bytes},
               {ly->w2_scale, ly->w2_scale_bytes},
               {ly->w13_scale_2, e * 2 * sizeof(float)},
               {ly->w2_scale_2, e * sizeof(float)},
               {s->w13_in_max, e * sizeof(float)},
               {ly->w2_input_scale, e * sizeof(float)},
               {ly->down_proj, ly->down_proj_bytes},
               {ly->norm, ly->norm_bytes},
               {ly->up_proj, ly->up_proj_bytes},
               {ly->shared_gate_up, ly->shared_gate_up_bytes},
               {ly->shared_down, ly->shared_down_bytes}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (map[i].p == p) return map[i].n;
    return 0;
}

/* "dir/name" resolved through the real path of dir (the file itself may not exist yet); NULL when dir cannot be. */
static char *resolve_parent(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    const char *base = slash ? slash + 1 : path;
    const size_t dn = !slash ? 1 : slash == path ? 1 : (size_t)(slash - path);
    if (dn >= sizeof dir) return NULL;
    memcpy(dir, !slash ? "." : slash == path ? "/" : path, dn);
    dir[dn] = '\0';
    char *real = realpath(dir, NULL);
    if (!real) return NULL;
    const size_t rn = strlen(real), bn = strlen(base);
    char *out = malloc(rn + bn + 2);
    if (out) {
        memcpy(out, real, rn);
        out[rn] = '/';
        memcpy(out + rn + 1, base, bn + 1);
    }
    free(real);
    return out;
}

/* 1 when the index's text names rel as a quoted string (a shard it lists). */
static int index_names(const char *index, const char *rel) {
    FILE *f = fopen(index, "rb");
    if (!f) return 0;
    const size_t n = strlen(rel);
    int found = 0, c;
    size_t at = 0; /* matched chars of '"' rel '"' */
    while (!found && (c = fgetc(f)) != EOF) {
        const int want = at == 0 || at == n + 1 ? '"' : (unsigned char)rel[at - 1];
        if (c == want) {
            if (++at == n + 2) found = 1;
        } else {
            at = c == '"' ? 1 : 0;
        }
    }
    fclose(f);
    return found;
}

static int is_index_path(const char *path) {
    const size_t n = strlen(path);
    return n >= 5 && !strcmp(path + n - 5, ".json");
}

int k3_run_is_checkpoint_path(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && (S_ISDIR(sb.st_mode) || is_index_path(path));
}

int k3_run_output_outside(const char *weights, const char *output) {
    struct stat sb;
    if (stat(weights, &sb) != 0) return 1; /* opening it reports the error */
    const int is_dir = S_ISDIR(sb.st_mode);
    const int is_index = !is_dir && is_index_path(weights);
    if (!is_dir && !is_index) return 1; /* one file: k3_cli_same_file checked it */
    char *out = resolve_parent(output);
    char *root = NULL;
    if (is_dir) {
        root = realpath(weights, NULL);
    } else {
        char *ix = resolve_parent(weights);
        if (ix) *strrchr(ix, '/') = '\0';
        root = ix;
    }
    int ok = 1;
    if (out && root) {
        const size_t rl = strlen(root);
        const int inside = !strncmp(out, root, rl) && (out[rl] == '/' || (rl == 1 && root[0] == '/'));
        if (is_dir && inside) {
            fprintf(stderr, CMD ": --output %s is inside the checkpoint folder %s; write the output elsewhere\n",
                    output, weights);
            ok = 0;
        } else if (is_index && inside && index_names(weights, out + rl + (rl > 1))) {
            fprintf(stderr, CMD ": --output %s is a shard that the index %s lists; write the output elsewhere\n",
                    output, weights);
            ok = 0;
        }
    }
    free(out);
    free(root);
    return ok;
}

static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20) printf("\\u%04x", (unsigned)(unsigned char)*s);
        else putchar(*s);
    }
    putchar('"');
}

void k3_run_print_json(const run_opts *o, const run_setup *s, const char *ran, const char *device, double seconds) {
    const char *fmt = s->md.format == K3_WEIGHT_BF16 ? "bf16" : s->md.format == K3_WEIGHT_NVFP4 ? "nvfp4" : "mxfp4";
    printf("{\"weights\": ");
    json_str(o->weights);
    if (o->has_layer) printf(", \"layer\": %d", (int)o->layer);
    else printf(", \"layer\": null");
    printf(", \"format\": \"%s\", \"fp4\": \"%s\"", s->layer ? source_name(s->layer->source_format) : "stacked", fmt);
    printf(", \"E\": %d, \"L\": %lld, \"I\": %lld", (int)s->e, (long long)s->l, (long long)s->inter);
    if (s->latent) printf(", \"H\": %lld, \"Is\": %lld", (long long)s->h, (long long)s->is);
    printf(", \"M\": %lld, \"top_k\": %d, \"act\": \"%s\", \"mode\": \"%s\", \"device\": \"%s\", \"ran\": \"%s\"",
           (long long)s->m, (int)s->md.top_k, k3_act_name(s->md.act.kind), s->md.mode == K3_MOE_W4A4 ? "w4a4" : "w4a16",
           device, ran);
    printf(", \"tp\": %d, \"ep\": %d, \"output\": ", o->tp > 1 && !o->ep ? (int)o->tp : 1,
           o->tp > 1 && o->ep ? (int)o->tp : 1);
    json_str(o->output);
    printf(", \"seconds\": %.6f}\n", seconds);
}
