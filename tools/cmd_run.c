/* k3 run moe: the routed experts (optionally routed, optionally the whole latent-MoE block) on safetensors files. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_mem.h"
#include "io/safetensors.h" /* internals: the file format (no public call yet) */
#include "run_moe.h"


static void run_help(FILE *f) {
    fprintf(f, "usage: k3 run OPERATION [OPTIONS]\n\n"
               "operations:\n"
               "  moe    the Kimi-K3 routed experts (and, when the weights hold them, the router and the latent-MoE\n"
               "         block) on safetensors inputs: k3 run moe --help\n");
}



static int parse_act(const char *s, k3_act_kind *out) {
    static const struct {
        const char *name;
        k3_act_kind kind;
    } acts[] = {{"situ", K3_ACT_SITU},
                {"silu", K3_ACT_SILU},
                {"swigluoai", K3_ACT_SWIGLUOAI},
                {"swigluoai_uninterleave", K3_ACT_SWIGLUOAI_UNINTERLEAVE},
                {"relu2", K3_ACT_RELU2_NO_MUL}};
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++)
        if (!strcmp(s, acts[i].name)) {
            *out = acts[i].kind;
            return 1;
        }
    return 0;
}

/* A beta or limit: > 0, or exactly 0 where zero_unset (0 = unset: no clamp). A negative value is refused
   rather than read as "unset", which would silently drop a clamp the user meant to set. */
static int parse_nonneg(const char *v, const char *what, int zero_unset, float *out) {
    if (!k3_cli_parse_f32(v, what, out)) return 0;
    if (*out > 0.0f || (zero_unset && *out == 0.0f)) return 1;
    fprintf(stderr, CMD ": %s must be > 0%s (got %s)\n", what, zero_unset ? ", or 0 for no clamp" : "", v);
    return 0;
}

static int parse_opts(int argc, char **argv, run_opts *o) {
    memset(o, 0, sizeof *o);
    o->device = "cpu";
    o->act = "situ";
    o->scaling = 1.0f;
    o->mode = K3_MOE_W4A16;
    o->top_k = 16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, CMD ": unexpected argument '%s' (see k3 run moe --help)\n", a);
            return 0;
        }
        if (!(v = k3_cli_value(argc, argv, &i, a))) return 0;
        if (!strcmp(a, "--weights"))
            o->weights = v;
        else if (!strcmp(a, "--input"))
            o->input = v;
        else if (!strcmp(a, "--output"))
            o->output = v;
        else if (!strcmp(a, "--device")) {
            if (!k3_cli_device_name_ok(v, a)) return 0;
            o->device = v;
        }
        else if (!strcmp(a, "--act"))
            o->act = v;
        else if (!strcmp(a, "--situ-beta")) {
            if (!parse_nonneg(v, a, 0, &o->situ_beta)) return 0;
            o->has_situ_beta = 1;
        } else if (!strcmp(a, "--situ-linear-beta")) {
            if (!parse_nonneg(v, a, 1, &o->situ_lb)) return 0;
            o->has_situ_lb = 1;
        } else if (!strcmp(a, "--limit")) {
            if (!parse_nonneg(v, a, 1, &o->limit)) return 0;
            o->has_limit = 1;
        } else if (!strcmp(a, "--scaling-factor")) {
            if (!k3_cli_parse_f32(v, a, &o->scaling)) return 0;
        } else if (!strcmp(a, "--top-k")) {
            if (!k3_cli_parse_i64(v, a, &o->top_k)) return 0;
            o->has_top_k = 1;
        } else if (!strcmp(a, "--layer")) {
            int64_t n = 0;
            if (!k3_cli_parse_i64(v, a, &n)) return 0;
            if (n < 0 || n > INT32_MAX) {
                fprintf(stderr, CMD ": --layer must be a layer number >= 0 (got %s)\n", v);
                return 0;
            }
            o->layer = (int32_t)n;
            o->has_layer = 1;
        } else if (!strcmp(a, "--scale-layout")) {
            if (!strcmp(v, "linear"))
                o->scale_layout = K3_SCALE_LINEAR;
            else if (!strcmp(v, "swizzled"))
                o->scale_layout = K3_SCALE_SWIZZLED;
            else {
                fprintf(stderr, CMD ": --scale-layout must be linear or swizzled (got '%s')\n", v);
                return 0;
            }
            o->has_scale_layout = 1;
        } else if (!strcmp(a, "--tp") || !strcmp(a, "--ep")) {
            int64_t n = 0;
            if (!k3_cli_parse_i64(v, a, &n)) return 0;
            if (n < 1 || n > 64) {
                fprintf(stderr, CMD ": %s must be a rank count in 1..64 (got %s)\n", a, v);
                return 0;
            }
            if (o->tp && (o->ep != (a[2] == 'e'))) {
                fprintf(stderr, CMD ": --tp and --ep are exclusive\n");
                return 0;
            }
            o->tp = (int32_t)n;
            o->ep = a[2] == 'e';
        } else if (!strcmp(a, "--mode")) {
            if (!strcmp(v, "w4a16"))
                o->mode = K3_MOE_W4A16;
            else if (!strcmp(v, "w4a4"))
                o->mode = K3_MOE_W4A4;
            else {
                fprintf(stderr, CMD ": --mode must be w4a16 or w4a4 (got '%s')\n", v);
                return 0;
            }
        } else {
            fprintf(stderr, CMD ": unknown option '%s' (see k3 run moe --help)\n", a);
            return 0;
        }
    }
    if (!o->weights || !o->input || !o->output) {
        fprintf(stderr, CMD ": --weights, --input and --output are required (see k3 run moe --help)\n");
        return 0;
    }
    if (k3_cli_same_file(o->output, o->weights) || k3_cli_same_file(o->output, o->input)) {
        fprintf(stderr, CMD ": --output %s is the %s file; refusing to replace it (write the output elsewhere)\n",
                o->output, k3_cli_same_file(o->output, o->weights) ? "--weights" : "--input");
        return 0;
    }
    if (!k3_run_output_outside(o->weights, o->output)) return 0;
    if (!o->has_layer && k3_run_is_checkpoint_path(o->weights)) {
        fprintf(stderr, CMD ": --weights %s is a checkpoint folder or index: give --layer N to say which layer\n",
                o->weights);
        return 0;
    }
    if (o->tp > 1 && !strcmp(o->device, "auto")) {
        fprintf(stderr, CMD ": --%s %d needs --device cpu (N ranks on the CPU backend) or --device cuda (one rank per "
                            "GPU, reduced through NCCL), not auto\n",
                o->ep ? "ep" : "tp", (int)o->tp);
        return 0;
    }
    if (o->top_k < 1 || o->top_k > 32) {
        fprintf(stderr, CMD ": --top-k must be in 1..32 (got %lld)\n", (long long)o->top_k);
        return 0;
    }
    return 1;
}


static int run_moe(int argc, char **argv) {
    if (k3_cli_wants_help(argc, argv)) {
        k3_run_moe_help();
        return K3_EXIT_OK;
    }
    run_opts o;
    if (!parse_opts(argc, argv, &o)) return K3_EXIT_USAGE;
    /* --tp 1 included: one rank with a one-rank communicator, the same path on one GPU */
    const int on_gpus = o.tp >= 1 && !strcmp(o.device, "cuda");
    if (on_gpus && !k3_run_gpus_ready(&o)) return K3_EXIT_FAIL; /* before reading any file */
    k3_act_desc act;
    k3_act_kind kind;
    if (!parse_act(o.act, &kind)) {
        fprintf(stderr, CMD ": --act must be situ, silu, swigluoai, swigluoai_uninterleave or relu2 (got '%s')\n",
                o.act);
        return K3_EXIT_USAGE;
    }
    if (kind == K3_ACT_SITU)
        k3_act_desc_k3(&act);
    else
        k3_act_desc_init(&act, kind);
    if (o.has_situ_beta) act.situ_beta = o.situ_beta;
    if (o.has_situ_lb) act.situ_linear_beta = o.situ_lb;
    if (o.has_limit) act.limit = o.limit;
    char msg[256];
    if (k3_act_desc_validate(&act, msg, sizeof msg) != K3_STATUS_SUCCESS) {
        fprintf(stderr, CMD ": activation: %s\n", msg);
        return K3_EXIT_USAGE;
    }

    const double t0 = k3_cli_now();
    int rc = K3_EXIT_FAIL;
    char err[512];
    k3_st_file *wf = NULL, *xf = NULL;
    k3_checkpoint *ck = NULL;
    k3_moe_layer *ly = NULL;
    k3_ctx *ctx = NULL;
    run_setup s;
    memset(&s, 0, sizeof s);
    s.scale_layout_given = o.has_scale_layout ? (int)o.scale_layout : -1;
    if (k3_st_open(o.input, &xf, err, sizeof err) != K3_STATUS_SUCCESS) {
        fprintf(stderr, CMD ": %s\n", err);
        goto done;
    }
    if (o.has_layer) {
        if (!k3_run_only_known_input(xf)) goto done;
        fprintf(stderr, CMD ": reading layer %d of %s\n", (int)o.layer, o.weights);
        if (k3_checkpoint_open(o.weights, &ck, err, sizeof err) != K3_STATUS_SUCCESS ||
            (o.has_scale_layout && k3_checkpoint_set_scale_layout(ck, o.scale_layout) != K3_STATUS_SUCCESS) ||
            k3_checkpoint_load_moe_layer(ck, o.layer, &ly, err, sizeof err) != K3_STATUS_SUCCESS) {
            fprintf(stderr, CMD ": %s: %s\n", o.weights, err);
            goto done;
        }
        k3_checkpoint_close(ck);
        ck = NULL;
        if (!k3_run_read_layer(ly, &s, &act, &o)) goto done;
        const int in = k3_run_read_input(xf, &s, &o);
        if (!in || (in == 2 && !k3_run_layer_routing(ly, &s, &o))) goto done;
    } else {
        if (k3_st_open(o.weights, &wf, err, sizeof err) != K3_STATUS_SUCCESS) {
            fprintf(stderr, CMD ": %s\n", err);
            goto done;
        }
        if (!k3_run_only_known(wf, xf)) goto done;
        if (!k3_run_read_experts(wf, &s, &act, o.mode) || !k3_run_read_routing(wf, xf, &s, &o)) goto done;
    }
    if (on_gpus) {
        rc = k3_run_gpus(&o, &s, wf, xf, t0);
        goto done;
    }
    if (!(ctx = k3_cli_ctx(o.device))) goto done;
    rc = k3_run_execute(ctx, &o, &s, wf, xf, t0);
done:
    k3_ctx_destroy(ctx);
    k3_st_close(wf);
    k3_st_close(xf);
    k3_checkpoint_close(ck);
    k3_moe_layer_free(ly);
    free(s.w13_in_max);
    return rc;
}

int k3_cmd_run(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        run_help(argc < 2 ? stderr : stdout);
        return argc < 2 ? K3_EXIT_USAGE : K3_EXIT_OK;
    }
    if (!strcmp(argv[1], "moe")) return run_moe(argc - 1, argv + 1);
    fprintf(stderr, "k3 run: unknown operation '%s' (operations: moe; see k3 run --help)\n", argv[1]);
    return K3_EXIT_USAGE;
}
