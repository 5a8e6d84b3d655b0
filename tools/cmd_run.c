/* k3 run moe: the routed experts (optionally routed, optionally the whole latent-MoE block) on safetensors files. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    if (o->tp > 1 && strcmp(o->device, "cpu") != 0) {
        fprintf(stderr, CMD ": --%s %d runs the ranks on the CPU backend (give --device cpu); on GPUs, one per rank, "
                            "the block reduces through NCCL (k3_parallel_desc.nccl_comm), which this command does "
                            "not drive yet\n",
                o->ep ? "ep" : "tp", (int)o->tp);
        return 0;
    }
    if (o->top_k < 1 || o->top_k > 32) {
        fprintf(stderr, CMD ": --top-k must be in 1..32 (got %lld)\n", (long long)o->top_k);
        return 0;
    }
    return 1;
}


static int save_output(const run_opts *o, const run_setup *s, const uint16_t *y, int64_t ycols, const int32_t *ids,
                       const float *wts) {
    k3_st_writer *w = NULL;
    char err[512];
    int ok = 0;
    if (k3_st_writer_create(&w) != K3_STATUS_SUCCESS) {
        fprintf(stderr, CMD ": out of memory\n");
        return 0;
    }
    int64_t shy[2] = {s->m, ycols}, shk[2] = {s->m, s->md.top_k};
    if (k3_st_writer_add(w, "output", K3_ST_BF16, 2, shy, y, err, sizeof err) != K3_STATUS_SUCCESS) goto fail;
    if (ids && (k3_st_writer_add(w, "topk_ids", K3_ST_I32, 2, shk, ids, err, sizeof err) != K3_STATUS_SUCCESS ||
                k3_st_writer_add(w, "topk_weights", K3_ST_F32, 2, shk, wts, err, sizeof err) != K3_STATUS_SUCCESS))
        goto fail;
    if (k3_st_writer_save(w, o->output, err, sizeof err) != K3_STATUS_SUCCESS) goto fail;
    ok = 1;
    goto done;
fail:
    fprintf(stderr, CMD ": %s\n", err);
done:
    k3_st_writer_destroy(w);
    return ok;
}

static int plan_fail(k3_ctx *ctx, const char *what, k3_status st) {
    fprintf(stderr, CMD ": %s: %s: %s\n", what, k3_status_string(st), k3_ctx_last_error(ctx));
    return K3_EXIT_FAIL;
}

/* Bytes of the tensor whose data is p (in either file, or the checkpoint layer), 0 when none. */
static size_t data_bytes(const run_setup *s, const k3_st_file *wf, const k3_st_file *xf, const void *p) {
    if (s->layer) return k3_run_layer_bytes(s, p);
    const k3_st_file *fs[2] = {wf, xf};
    for (int f = 0; p && f < 2; f++)
        for (int32_t i = 0; i < k3_st_count(fs[f]); i++)
            if (k3_st_at(fs[f], i)->data == p) return k3_st_at(fs[f], i)->nbytes;
    return 0;
}

/* The run's tensors as the context sees them: the file data itself on the CPU, device copies on CUDA. */
static int tensors_in(k3_cli_mem *mm, const k3_st_file *wf, const k3_st_file *xf, run_setup *s) {
    int ok = 1;
#define K3_RUN_IN(field) (field) = k3_cli_mem_in(mm, (field), data_bytes(s, wf, xf, (field)), &ok)
    K3_RUN_IN(s->mw.w13);
    K3_RUN_IN(s->mw.w13_scale);
    K3_RUN_IN(s->mw.w13_scale_2);
    K3_RUN_IN(s->mw.w13_input_scale);
    K3_RUN_IN(s->mw.w2);
    K3_RUN_IN(s->mw.w2_scale);
    K3_RUN_IN(s->mw.w2_scale_2);
    K3_RUN_IN(s->mw.w2_input_scale);
    K3_RUN_IN(s->lw.down_proj);
    K3_RUN_IN(s->lw.norm);
    K3_RUN_IN(s->lw.up_proj);
    K3_RUN_IN(s->lw.shared_gate_up);
    K3_RUN_IN(s->lw.shared_down);
#undef K3_RUN_IN
    return ok;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double seconds_since(double t0) { return now_seconds() - t0; }

/* Plans and runs what the files describe; writes the output file. t0: when the command started (--json). */
static int execute(k3_ctx *ctx, const run_opts *o, run_setup *s, const k3_st_file *wf, const k3_st_file *xf,
                   double t0) {
    const int64_t m = s->m, k = s->md.top_k;
    const int routed = s->ids == NULL;
    const int64_t ycols = s->latent ? s->h : s->l;
    int rc = K3_EXIT_FAIL;
    k3_status st;
    k3_moe_plan *mp = NULL;
    k3_router_plan *rp = NULL;
    k3_latent_moe_plan *lp = NULL;
    void *ws = NULL, *rws = NULL;
    size_t wsb = 0, rwsb = 0;
    k3_cli_mem mm; /* context-side buffers: device memory on CUDA */
    k3_cli_mem_init(&mm, ctx);
    const size_t yb = sizeof(uint16_t) * (size_t)(m * ycols), ib = sizeof(int32_t) * (size_t)(m * k),
                 fb = sizeof(float) * (size_t)(m * k);
    uint16_t *y = (uint16_t *)malloc(yb);
    int32_t *ids = routed ? (int32_t *)malloc(ib) : NULL;
    float *wts = routed ? (float *)malloc(fb) : NULL;
    int in_ok = 1;
    void *cy = k3_cli_mem_alloc(&mm, yb);
    int32_t *cids = routed ? (int32_t *)k3_cli_mem_alloc(&mm, ib) : NULL;
    float *cwts = routed ? (float *)k3_cli_mem_alloc(&mm, fb) : NULL;
    const void *cx = k3_cli_mem_in(&mm, s->x->data, s->x->nbytes, &in_ok);
    const void *cgate = s->gate ? k3_cli_mem_in(&mm, s->gate->data, s->gate->nbytes, &in_ok) : NULL;
    const float *cbias = s->bias ? (const float *)k3_cli_mem_in(&mm, s->bias->data, s->bias->nbytes, &in_ok) : NULL;
    const int32_t *in_ids = s->ids ? (const int32_t *)k3_cli_mem_in(&mm, s->ids->data, s->ids->nbytes, &in_ok) : NULL;
    const float *in_wts = s->wts ? (const float *)k3_cli_mem_in(&mm, s->wts->data, s->wts->nbytes, &in_ok) : NULL;
    if (!y || !cy || (routed && (!ids || !wts || !cids || !cwts)) || !in_ok || !tensors_in(&mm, wf, xf, s)) {
        fprintf(stderr, CMD ": out of %s memory\n", mm.on_device ? "device" : "host");
        goto done;
    }
    s->md.max_tokens = m;
    k3_router_desc rd;
    k3_router_desc_init(&rd);
    rd.num_experts = s->e;
    rd.top_k = (int32_t)k;
    rd.hidden = s->width;
    rd.gate_dtype = s->gate && s->gate->dtype == K3_ST_F32 ? K3_DTYPE_F32 : K3_DTYPE_BF16;
    rd.scaling_factor = o->scaling;
    rd.max_tokens = m;
    if (o->tp > 1 && !k3_run_tp_check(s, o->tp, o->ep)) goto done;
    if (s->latent) {
        k3_latent_moe_desc ld;
        k3_latent_moe_desc_init(&ld);
        ld.hidden = s->h;
        ld.router = rd;
        ld.experts = s->md;
        ld.shared_inter = s->is;
        ld.shared_act = s->md.act;
        ld.max_tokens = m;
        if (o->tp > 1) {
            s->lw.gate = cgate;
            s->lw.bias = cbias;
            s->lw.experts = s->mw;
            if (!k3_run_tp(ctx, &ld, s, o->tp, o->ep, cx, NULL, NULL, (uint16_t *)cy, cids, cwts)) goto done;
        } else if ((st = k3_latent_moe_plan_create(ctx, &ld, &lp)) != K3_STATUS_SUCCESS) {
            rc = plan_fail(ctx, "latent-MoE plan", st);
            goto done;
        }
        if (lp) { /* one rank: the whole block in one call */
            k3_latent_moe_workspace_size(lp, &wsb);
            s->lw.gate = cgate;
            s->lw.bias = cbias;
            s->lw.experts = s->mw;
            if (!(ws = k3_cli_mem_alloc(&mm, wsb))) goto oom;
            if ((st = k3_latent_moe_run(lp, m, cx, &s->lw, NULL, cy, cids, cwts, ws, wsb, NULL)) !=
                K3_STATUS_SUCCESS) {
                rc = plan_fail(ctx, "latent-MoE run", st);
                goto done;
            }
        }
    } else {
        if (o->tp <= 1) {
            if ((st = k3_moe_plan_create(ctx, &s->md, &mp)) != K3_STATUS_SUCCESS) {
                rc = plan_fail(ctx, "MoE plan", st);
                goto done;
            }
            k3_moe_workspace_size(mp, &wsb);
            if (!(ws = k3_cli_mem_alloc(&mm, wsb))) goto oom;
        }
        const int32_t *run_ids = routed ? cids : in_ids;
        const float *run_wts = routed ? cwts : in_wts;
        if (routed) {
            if ((st = k3_router_plan_create(ctx, &rd, &rp)) != K3_STATUS_SUCCESS) {
                rc = plan_fail(ctx, "router plan", st);
                goto done;
            }
            k3_router_workspace_size(rp, &rwsb);
            if (!(rws = k3_cli_mem_alloc(&mm, rwsb))) goto oom;
            st = k3_router_run(rp, m, cx, cgate, cbias, cids, cwts, rws, rwsb, NULL);
            if (st != K3_STATUS_SUCCESS) {
                rc = plan_fail(ctx, "router run", st);
                goto done;
            }
        }
        if (o->tp > 1) {
            if (!k3_run_tp(ctx, NULL, s, o->tp, o->ep, cx, run_ids, run_wts, (uint16_t *)cy, NULL, NULL)) goto done;
            st = K3_STATUS_SUCCESS;
        } else {
            st = k3_moe_run(mp, m, cx, run_ids, run_wts, &s->mw, cy, NULL, ws, wsb, NULL);
        }
        if (st != K3_STATUS_SUCCESS) {
            rc = plan_fail(ctx, "MoE run", st);
            goto done;
        }
    }
    if (!k3_cli_mem_out(&mm, y, cy, yb) || (routed && (!k3_cli_mem_out(&mm, ids, cids, ib) ||
                                                        !k3_cli_mem_out(&mm, wts, cwts, fb)))) {
        fprintf(stderr, CMD ": copying the results back from the device failed\n");
        goto done;
    }
    for (size_t i = 0; i < (size_t)(m * ycols); i++)
        if ((y[i] & 0x7F80u) == 0x7F80u) { /* bf16 exponent all ones: Inf or NaN */
            fprintf(stderr, CMD ": output element [%lld, %lld] is %s (an overflow in the run, or extreme inputs); "
                                "%s not written\n",
                    (long long)(i / (size_t)ycols), (long long)(i % (size_t)ycols), (y[i] & 0x7Fu) ? "NaN" : "Inf",
                    o->output);
            goto done;
        }
    if (!save_output(o, s, y, ycols, ids, wts)) goto done;
    rc = K3_EXIT_OK;
    if (o->json) {
        const char *ran = s->latent ? "latent block" : routed ? "router+experts" : "experts";
        k3_run_print_json(o, s, ran, mm.on_device ? "cuda" : "cpu", seconds_since(t0));
    } else {
        char lay[32] = "";
        if (o->has_layer) snprintf(lay, sizeof lay, " (layer %d)", (int)o->layer);
        printf("k3 run moe: %s%s, %s experts%s (E %d, L %lld, I %lld, top-%lld, %s, %s), M %lld -> %s\n",
               s->latent ? "latent-MoE block" : "routed experts", routed && !s->latent ? " with router" : "",
               s->md.format == K3_WEIGHT_BF16    ? "BF16"
               : s->md.format == K3_WEIGHT_NVFP4 ? "NVFP4"
                                                 : "MXFP4",
               lay, (int)s->e, (long long)s->l, (long long)s->inter, (long long)k, k3_act_name(s->md.act.kind),
               s->md.mode == K3_MOE_W4A4 ? "w4a4" : "w4a16", (long long)m, o->output);
    }
    goto done;
oom:
    fprintf(stderr, CMD ": out of memory\n");
done:
    k3_moe_plan_destroy(mp);
    k3_router_plan_destroy(rp);
    k3_latent_moe_plan_destroy(lp);
    k3_cli_mem_free(&mm);
    free(y);
    free(ids);
    free(wts);
    return rc;
}

static int run_moe(int argc, char **argv) {
    if (k3_cli_wants_help(argc, argv)) {
        k3_run_moe_help();
        return K3_EXIT_OK;
    }
    run_opts o;
    if (!parse_opts(argc, argv, &o)) return K3_EXIT_USAGE;
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

    const double t0 = now_seconds();
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
    if (!(ctx = k3_cli_ctx(o.device))) goto done;
    rc = execute(ctx, &o, &s, wf, xf, t0);
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
