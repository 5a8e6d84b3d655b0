/* k3 run moe's run: the plans of what the files describe (the experts, router + experts, or the latent block, on
 * one rank or as --tp / --ep CPU ranks), the run, the output's checks and file. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_mem.h"
#include "io/safetensors.h" /* internals: the file format (no public call yet) */
#include "run_moe.h"

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
size_t k3_run_data_bytes(const run_setup *s, const k3_st_file *wf, const k3_st_file *xf, const void *p) {
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
#define K3_RUN_IN(field) (field) = k3_cli_mem_in(mm, (field), k3_run_data_bytes(s, wf, xf, (field)), &ok)
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


void k3_run_router_desc(const run_opts *o, const run_setup *s, k3_router_desc *rd) {
    k3_router_desc_init(rd);
    rd->num_experts = s->e;
    rd->top_k = (int32_t)s->md.top_k;
    rd->hidden = s->width;
    rd->gate_dtype = s->gate && s->gate->dtype == K3_ST_F32 ? K3_DTYPE_F32 : K3_DTYPE_BF16;
    rd->scaling_factor = o->scaling;
    rd->max_tokens = s->m;
}

void k3_run_latent_desc(const run_opts *o, const run_setup *s, k3_latent_moe_desc *ld) {
    k3_latent_moe_desc_init(ld);
    ld->hidden = s->h;
    k3_run_router_desc(o, s, &ld->router);
    ld->experts = s->md;
    ld->experts.max_tokens = s->m;
    ld->shared_inter = s->is;
    ld->shared_act = s->md.act;
    ld->max_tokens = s->m;
}

int k3_run_finish(const run_opts *o, const run_setup *s, const uint16_t *y, const int32_t *ids, const float *wts,
                  const char *device, double t0) {
    const int routed = ids != NULL;
    const int64_t ycols = s->latent ? s->h : s->l, m = s->m;
    for (size_t i = 0; i < (size_t)(m * ycols); i++)
        if ((y[i] & 0x7F80u) == 0x7F80u) { /* bf16 exponent all ones: Inf or NaN */
            fprintf(stderr, CMD ": output element [%lld, %lld] is %s (an overflow in the run, or extreme inputs); "
                                "%s not written\n",
                    (long long)(i / (size_t)ycols), (long long)(i % (size_t)ycols), (y[i] & 0x7Fu) ? "NaN" : "Inf",
                    o->output);
            return K3_EXIT_FAIL;
        }
    if (!save_output(o, s, y, ycols, ids, wts)) return K3_EXIT_FAIL;
    if (o->json) {
        const char *ran = s->latent ? "latent block" : routed ? "router+experts" : "experts";
        k3_run_print_json(o, s, ran, device, k3_cli_now() - t0);
    } else {
        char lay[32] = "";
        if (o->has_layer) snprintf(lay, sizeof lay, " (layer %d)", (int)o->layer);
        printf("k3 run moe: %s%s, %s experts%s (E %d, L %lld, I %lld, top-%lld, %s, %s), M %lld -> %s\n",
               s->latent ? "latent-MoE block" : "routed experts", routed && !s->latent ? " with router" : "",
               s->md.format == K3_WEIGHT_BF16    ? "BF16"
               : s->md.format == K3_WEIGHT_NVFP4 ? "NVFP4"
                                                 : "MXFP4",
               lay, (int)s->e, (long long)s->l, (long long)s->inter, (long long)s->md.top_k, k3_act_name(s->md.act.kind),
               s->md.mode == K3_MOE_W4A4 ? "w4a4" : "w4a16", (long long)s->m, o->output);
    }
    return K3_EXIT_OK;
}

/* Plans and runs what the files describe; writes the output file. t0: when the command started (--json). */
int k3_run_execute(k3_ctx *ctx, const run_opts *o, run_setup *s, const k3_st_file *wf, const k3_st_file *xf,
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
    k3_run_router_desc(o, s, &rd);
    if (o->tp > 1 && !k3_run_tp_check(s, o->tp, o->ep)) goto done;
    if (s->latent) {
        k3_latent_moe_desc ld;
        k3_run_latent_desc(o, s, &ld);
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
    rc = k3_run_finish(o, s, y, routed ? ids : NULL, routed ? wts : NULL, mm.on_device ? "cuda" : "cpu", t0);
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
