/*
 * k3 demo: the Kimi-K3 latent-MoE block at its real TP8 shapes (H 7168, 896 experts top-16, L 3584, I 384,
 * shared Is 768, NVFP4 experts) on synthetic weights, timed per stage for a few token counts, then a
 * correctness line on a smaller block (see check_small). On CUDA the times are `k3 bench block`'s measurement
 * (k3_bench_block_measure: graph replay, cold weights, each stage alone beside the block); on the CPU a host clock
 * per stage of one call.
 *
 * Weights are drawn directly in storage form from a fixed seed: FP4 codes are uniformly random bytes, e4m3 block
 * scales random codes in [0.5, 1.875], and scale_2 per expert makes the dequantized rms 1/sqrt(K) (0.017 for
 * W13, 0.051 for W2); BF16 dense weights are uniform with std 1/sqrt(K). Quantizing 5e9 fp32 values would
 * take minutes and tell nothing more about speed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/moe_internal.h" /* the plan's CPU form: the per-stage timings have no public call */
#include "cli.h"
#include "cli_mem.h"
#include "block_bench.h"
#include "block_synth.h"
#include "demo_report.h"

#define DEMO_SEED 0x4b33446d6fULL /* "K3Dmo" */
#define MAX_M K3_DEMO_MAX_M
/* CUDA: `k3 bench block`'s defaults; at the TP8 rank's 2.2 GB the cold rule asks for 2 copies, and the replays
   of the six variants take well under a second per M, so the weights' synthesis and copies dominate the run. */
#define DEMO_REPS 11
#define DEMO_MAX_COPIES 8

static double now_s(void) { return k3_cli_now(); }

_Static_assert(K3_LATENT_STAGE_COUNT == K3_DEMO_STAGES, "the report has one time per stage");

typedef struct stage_clock {
    double last, t[K3_LATENT_STAGE_COUNT];
} stage_clock;

static void on_stage(void *user, int32_t stage) {
    stage_clock *c = (stage_clock *)user;
    const double t = now_s();
    c->t[stage] += t - c->last;
    c->last = t;
}

static void demo_help(void) {
    printf("usage: k3 demo [--device cpu|cuda|auto] [--m LIST] [--json]\n\n"
           "Runs the Kimi-K3 latent-MoE block at its TP8 shapes (H 7168, 896 experts top-16, L 3584, I 384, shared\n"
           "Is 768; NVFP4 experts, W4A16, SiTU 4/25; weights synthesized from a fixed printed seed) for each token\n"
           "count M (default 1,4,16), printing per-stage times (router, down, experts, norm+up, shared) and the\n"
           "total; then a correctness line on a smaller block (E 16, top-4, L 256, I 64, H 512, Is 128): on CUDA\n"
           "the block against the CPU reference backend (routing identical, rel-L2 <= 1e-2); on the CPU (the\n"
           "reference itself) the batch against each token run alone (bitwise). It ends in PASS or FAIL.\n"
           "On the CPU each stage of one call is timed with the host clock. On a CUDA context the block is timed\n"
           "as `k3 bench block` times it, by the same code: the weights copied to the device as often as the cold\n"
           "rule of docs/benchmarks.md asks (2 copies of the 2.2 GB rank on an H200), 4 back-to-back calls per\n"
           "copy captured into a CUDA graph, 3 warm-up and %d timed replays, the median per call; the block and\n"
           "each stage alone (router, down, experts, norm+up, shared) interleaved in the same run, printed in\n"
           "microseconds with the stages' sum, the bytes read and %% of the HBM read floor (bytes / 4.37 TB/s\n"
           "over the block's time).\n"
           "A backend without the MoE falls back to the CPU.\n\n"
           "  --device D   cpu, cuda or auto (default auto)\n"
           "  --m LIST     token counts, e.g. 1,4,16 or 1-8 (each 1..%d; on CUDA at most 32, the GPU block's limit)\n"
           "  --json       one JSON object on stdout at the end (the lines above go to stderr instead): backend,\n"
           "               device, cpu_fallback, seed, format, shape (experts, top_k, hidden, latent, inter,\n"
           "               shared_inter), weights_seconds, weights_bytes_fp4 / _dense, copy_seconds (every copy;\n"
           "               null on the CPU), copies and reps (CUDA only), m, runs (per M; on the CPU: router_ms,\n"
           "               down_ms, experts_ms, norm_up_ms, shared_ms, total_ms; on CUDA the row of `k3 bench block\n"
           "               --json`: block_us, router_us, down_us, experts_us, norm_up_us, shared_us, stages_sum_us,\n"
           "               composition_us, main_path_us, block_over_main_path, experts_touched, bytes, floor_us,\n"
           "               percent_of_floor, schedule), correctness\n"
           "               (against, shape, m, ids_identical or bitwise_identical, finite, rel_l2 and bar (CUDA;\n"
           "               null on the CPU), pass), total_seconds, pass\n\n"
           "exit status: 0 success, 1 failure (including a failed correctness check), 2 usage error\n",
           DEMO_REPS, MAX_M);
}

/* Runs the small block once on ctx: m tokens of host x -> host y, ids, wts. 1 on success. */
static int small_run(k3_ctx *ctx, const k3_synth_block *b, int64_t m, const uint16_t *x, uint16_t *y, int32_t *ids,
                     float *wts) {
    const int64_t h = b->d.hidden, k = b->d.router.top_k;
    const size_t xb = sizeof(uint16_t) * (size_t)(m * h), ib = sizeof(int32_t) * (size_t)(m * k);
    const size_t wb = sizeof(float) * (size_t)(m * k);
    k3_latent_moe_plan *p = NULL;
    size_t wsb = 0;
    int ok = 0, in_ok = 1;
    k3_cli_mem mm;
    k3_cli_mem_init(&mm, ctx);
    if (k3_latent_moe_plan_create(ctx, &b->d, &p) != K3_STATUS_SUCCESS ||
        k3_latent_moe_workspace_size(p, &wsb) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 demo: correctness plan: %s\n", k3_ctx_last_error(ctx));
        goto done;
    }
    k3_latent_moe_weights cw; /* the weights as the context sees them */
    void *cws = k3_cli_mem_alloc(&mm, wsb), *cy = k3_cli_mem_alloc(&mm, xb);
    int32_t *cids = k3_cli_mem_alloc(&mm, ib);
    float *cwts = k3_cli_mem_alloc(&mm, wb);
    const void *cx = k3_cli_mem_in(&mm, x, xb, &in_ok);
    if (!k3_synth_block_weights_in(b, &mm, &cw) || !in_ok || !cws || !cy || !cids || !cwts) {
        fprintf(stderr, "k3 demo: correctness run: out of memory\n");
        goto done;
    }
    if (k3_latent_moe_run(p, m, cx, &cw, NULL, cy, cids, cwts, cws, wsb, NULL) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 demo: correctness run: %s\n", k3_ctx_last_error(ctx));
        goto done;
    }
    if (!k3_cli_mem_out(&mm, y, cy, xb) || !k3_cli_mem_out(&mm, ids, cids, ib) ||
        !k3_cli_mem_out(&mm, wts, cwts, wb)) {
        fprintf(stderr, "k3 demo: correctness run: copying the results back failed (CUDA error)\n");
        goto done;
    }
    ok = 1;
done:
    k3_latent_moe_plan_destroy(p);
    k3_cli_mem_free(&mm);
    return ok;
}

/* ||a - b|| / ||b|| over n BF16 values (0 when both are zero). */
static double rel_l2_bf16(const uint16_t *a, const uint16_t *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        const double x = k3_bf16_to_f32(a[i]), r = k3_bf16_to_f32(b[i]);
        num += (x - r) * (x - r);
        den += r * r;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/*
 * The correctness line. The CPU backend is the library's reference (its tests hold it to an independent fp64
 * evaluation), so a CUDA context is checked against a CPU context through the public API. On a CPU context that
 * comparison would be the code against itself; the line then checks what the reference promises beyond that:
 * finite output, and each token's row the same, bit for bit, whether run in the batch or alone.
 */
static int check_small(k3_ctx *ctx, FILE *hu, k3_demo_check *rep) {
    enum { M = 4, E = 16, TOPK = 4, H = 512, L = 256, I = 64, IS = 128 };
    k3_synth_block b;
    memset(&b, 0, sizeof b);
    k3_synth_block_desc(&b.d, E, TOPK, H, L, I, IS, M);
    k3_synth_rng r = {DEMO_SEED ^ 0x5a5a5a5aULL};
    uint16_t x[M * H], y[M * H], yr[M * H]; /* 4 KB each */
    int32_t ids[M * TOPK], rids[M * TOPK];
    float wts[M * TOPK], rwts[M * TOPK];
    const int on_dev = k3_ctx_backend(ctx) == K3_BACKEND_CUDA;
    int ok = 0;
    memset(rep, 0, sizeof *rep);
    rep->shape = (k3_demo_shape){E, TOPK, H, L, I, IS};
    rep->m = M;
    rep->against_cpu = on_dev;
    if (!k3_synth_block_make(&b, &r)) {
        fprintf(stderr, "k3 demo: out of memory\n");
        goto done;
    }
    k3_synth_bf16(&r, x, (size_t)(M * H), 1.0);
    if (!small_run(ctx, &b, M, x, y, ids, wts)) goto done;
    int finite = 1;
    for (int i = 0; i < M * H; i++) finite &= isfinite(k3_bf16_to_f32(y[i])) != 0;
    if (on_dev) {
        k3_ctx *cpu = k3_cli_ctx("cpu");
        const int ran = cpu && small_run(cpu, &b, M, x, yr, rids, rwts);
        k3_ctx_destroy(cpu);
        if (!ran) goto done;
        const double rel = rel_l2_bf16(y, yr, M * H);
        const int ids_ok = !memcmp(ids, rids, sizeof ids);
        const double bar = 1e-2; /* the GPU-vs-reference bar of the W4A16 experts */
        ok = finite && ids_ok && rel <= bar;
        rep->ran = 1, rep->ids_identical = ids_ok, rep->finite = finite, rep->rel_l2 = rel, rep->bar = bar;
        rep->pass = ok;
        fprintf(hu, "correctness (cuda): E %d top-%d L %d I %d H %d Is %d M %d vs the CPU reference backend: routing "
                "ids %s, output %s, rel-L2 %.2e <= %.0e: %s\n",
                E, TOPK, L, I, H, IS, M, ids_ok ? "identical" : "DIFFER", finite ? "finite" : "NOT FINITE", rel, bar,
                ok ? "PASS" : "FAIL");
    } else {
        int rows_ok = 1;
        for (int t = 0; t < M && rows_ok; t++) {
            if (!small_run(ctx, &b, 1, x + t * H, yr + t * H, rids + t * TOPK, rwts + t * TOPK)) goto done;
            rows_ok = !memcmp(yr + t * H, y + t * H, sizeof(uint16_t) * H) &&
                      !memcmp(rids + t * TOPK, ids + t * TOPK, sizeof(int32_t) * TOPK) &&
                      !memcmp(rwts + t * TOPK, wts + t * TOPK, sizeof(float) * TOPK);
        }
        ok = finite && rows_ok;
        rep->ran = 1, rep->ids_identical = rows_ok, rep->finite = finite, rep->pass = ok;
        fprintf(hu, "correctness (cpu, the reference backend): E %d top-%d L %d I %d H %d Is %d, M %d at once vs token "
                "by token: %s, output %s: %s\n",
                E, TOPK, L, I, H, IS, M, rows_ok ? "bitwise identical" : "DIFFER", finite ? "finite" : "NOT FINITE",
                ok ? "PASS" : "FAIL");
    }
done:
    k3_synth_block_free(&b);
    return ok;
}

/* CUDA: the demo's lines as `k3 bench block`'s measurement reaches each step. */
typedef struct demo_gpu {
    FILE *hu;
    k3_demo_report *rep;
} demo_gpu;

static void demo_gpu_ready(void *user, const bb_measure *bm) {
    demo_gpu *g = (demo_gpu *)user;
    g->rep->graph = 1, g->rep->copy_s = bm->copy_s, g->rep->copies = bm->copies, g->rep->reps = bm->reps;
    fprintf(g->hu, "weights copied to the device %d times in %.2f s (calls rotate through the copies: cold weights)\n",
            (int)bm->copies, bm->copy_s);
    fprintf(g->hu, "\nk3_latent_moe_run and each stage alone, as `k3 bench block` times them: CUDA-graph replay of %d "
                   "back-to-back calls, median of %lld replays, us per call\n",
            (int)bm->calls, (long long)bm->reps);
    k3_bench_block_header(g->hu);
}

static void demo_gpu_point(void *user, const bb_measure *bm, const bb_point *p, int j) {
    demo_gpu *g = (demo_gpu *)user;
    k3_demo_report *rep = g->rep;
    (void)bm, (void)j;
    if (rep->nm >= K3_DEMO_MAX_M) return;
    rep->m[rep->nm] = p->m, rep->total_ms[rep->nm] = 1e-3 * p->us[0], rep->pt[rep->nm] = *p;
    rep->nm++;
    k3_bench_block_row(g->hu, p);
    fflush(g->hu);
}

int k3_cmd_demo(int argc, char **argv) {
    const char *device = "auto";
    int64_t ms[MAX_M] = {1, 4, 16};
    int nm = 3, json = 0;
    if (k3_cli_wants_help(argc, argv)) {
        demo_help();
        return K3_EXIT_OK;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device")) {
            if (!(device = k3_cli_value(argc, argv, &i, "--device")) || !k3_cli_device_name_ok(device, "--device"))
                return K3_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--m")) {
            const char *v = k3_cli_value(argc, argv, &i, "--m");
            if (!v || !(nm = k3_cli_parse_list(v, "--m", ms, MAX_M))) return K3_EXIT_USAGE;
        } else {
            fprintf(stderr, "k3 demo: unknown option '%s' (see k3 demo --help)\n", argv[i]);
            return K3_EXIT_USAGE;
        }
    }
    int64_t max_m = 0;
    for (int i = 0; i < nm; i++) {
        if (ms[i] < 1 || ms[i] > MAX_M) {
            fprintf(stderr, "k3 demo: --m values must be in 1..%d (got %lld)\n", MAX_M, (long long)ms[i]);
            return K3_EXIT_USAGE;
        }
        if (ms[i] > max_m) max_m = ms[i];
    }
    const double t_start = now_s();
    FILE *hu = json ? stderr : stdout; /* the human-readable lines */
    k3_demo_report rep;
    memset(&rep, 0, sizeof rep);
    rep.seed = DEMO_SEED;
    rep.shape = (k3_demo_shape){896, 16, 7168, 3584, 384, 768};
    rep.copy_s = -1.0;
    k3_ctx *ctx = k3_cli_ctx(device);
    if (!ctx) return K3_EXIT_FAIL;

    k3_synth_block b;
    memset(&b, 0, sizeof b);
    k3_synth_block_desc(&b.d, 896, 16, 7168, 3584, 384, 768, max_m);
    k3_latent_moe_plan *plan = NULL;
    k3_status st = k3_latent_moe_plan_create(ctx, &b.d, &plan);
    if (st == K3_STATUS_UNSUPPORTED && k3_ctx_backend(ctx) != K3_BACKEND_CPU) {
        rep.fell_back = 1;
        fprintf(hu, "note: this build's CUDA backend has no MoE yet (%s); running the CPU reference backend instead\n",
                k3_ctx_last_error(ctx));
        k3_ctx_destroy(ctx);
        if (!(ctx = k3_cli_ctx("cpu"))) return K3_EXIT_FAIL;
        st = k3_latent_moe_plan_create(ctx, &b.d, &plan);
    }
    if (st != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 demo: plan: %s: %s\n", k3_status_string(st), k3_ctx_last_error(ctx));
        k3_ctx_destroy(ctx);
        return K3_EXIT_FAIL;
    }
    k3_arch_info arch;
    k3_ctx_arch(ctx, &arch);
    const int on_cpu = k3_ctx_backend(ctx) == K3_BACKEND_CPU;
    rep.backend = on_cpu ? "cpu" : "cuda";
    rep.device = arch.device_name;
    fprintf(hu, "k3 demo: Kimi-K3 latent-MoE block, TP8 slice: H 7168, E 896 top-16, L 3584, I 384, shared Is 768\n"
            "         NVFP4 experts (linear scales), W4A16, SiTU 4/25, sigmoid noaux_tc router, RMSNorm eps 1e-5\n"
            "backend: %s (%s)\n",
            on_cpu ? "cpu" : "cuda", arch.device_name);

    int rc = K3_EXIT_FAIL;
    k3_cli_mem mm;
    k3_cli_mem_init(&mm, ctx);
    uint16_t *x = NULL;
    size_t wsb = 0;
    k3_synth_rng r = {DEMO_SEED};
    double t0 = now_s();
    if (!k3_synth_block_make(&b, &r)) goto oom;
    rep.synth_s = now_s() - t0;
    rep.bytes_fp4 = (double)b.bytes_fp4, rep.bytes_dense = (double)b.bytes_dense;
    fprintf(hu, "weights: synthesized from seed 0x%llx in %.2f s (%.2f GB NVFP4 experts + %.2f GB BF16 dense)\n",
            (unsigned long long)DEMO_SEED, rep.synth_s, (double)b.bytes_fp4 / 1e9, (double)b.bytes_dense / 1e9);
    if (!on_cpu) {
        demo_gpu g = {hu, &rep};
        bb_measure bm;
        memset(&bm, 0, sizeof bm);
        bm.who = "k3 demo", bm.ctx = ctx, bm.hb = &b, bm.rng = &r, bm.ms = ms, bm.nm = nm;
        bm.reps = DEMO_REPS, bm.max_copies = DEMO_MAX_COPIES;
        bm.on_ready = demo_gpu_ready, bm.on_point = demo_gpu_point, bm.user = &g;
        if (!k3_bench_block_measure(&bm)) goto done;
    } else {
        k3_latent_moe_workspace_size(plan, &wsb);
        const size_t xb = sizeof(uint16_t) * (size_t)(max_m * 7168);
        if (!(x = malloc(xb))) goto oom;
        k3_synth_bf16(&r, x, (size_t)(max_m * 7168), 1.0);
        void *cws = k3_cli_mem_alloc(&mm, wsb), *cy = k3_cli_mem_alloc(&mm, xb);
        if (!cws || !cy) goto oom;
        rep.has_stages = 1;
        fprintf(hu, "\n%5s %9s %9s %9s %9s %9s %10s   %s\n", "M", "router", "down", "experts", "norm+up", "shared",
                "total ms", "(k3_latent_moe_run)");
        const k3_cpu_latent *cpu = k3_latent_moe_plan_cpu(plan);
        for (int i = 0; i < nm; i++) {
            const int64_t m = ms[i];
            t0 = now_s();
            st = k3_latent_moe_run(plan, m, x, &b.w, NULL, cy, NULL, NULL, cws, wsb, NULL);
            const double total = now_s() - t0;
            if (st != K3_STATUS_SUCCESS) {
                fprintf(stderr, "k3 demo: run M=%lld: %s\n", (long long)m, k3_ctx_last_error(ctx));
                goto done;
            }
            /* the same block again, stage by stage, for the breakdown (the CPU form of the plan) */
            stage_clock c;
            memset(&c, 0, sizeof c);
            c.last = now_s();
            k3_cpu_latent_run(cpu, m, x, &b.w, NULL, (uint16_t *)cy, NULL, NULL, cws, on_stage, &c);
            rep.m[rep.nm] = m, rep.total_ms[rep.nm] = 1e3 * total;
            for (int s = 0; s < K3_DEMO_STAGES; s++) rep.stage_ms[rep.nm][s] = 1e3 * c.t[s];
            rep.nm++;
            fprintf(hu, "%5lld %9.1f %9.1f %9.1f %9.1f %9.1f %10.1f\n", (long long)m, 1e3 * c.t[0], 1e3 * c.t[1],
                    1e3 * c.t[2], 1e3 * c.t[3], 1e3 * c.t[4], 1e3 * total);
        }
    }
    fprintf(hu, "\n");
    rep.pass = check_small(ctx, hu, &rep.check);
    rc = rep.pass ? K3_EXIT_OK : K3_EXIT_FAIL;
    rep.total_s = now_s() - t_start;
    fprintf(hu, "demo total %.1f s\n", rep.total_s);
    if (json) k3_demo_report_print(&rep);
    goto done;
oom:
    fprintf(stderr, "k3 demo: out of memory (the TP8 block needs about 2.1 GB of host memory)\n");
done:
    k3_cli_mem_free(&mm);
    free(x);
    k3_synth_block_free(&b);
    k3_latent_moe_plan_destroy(plan);
    k3_ctx_destroy(ctx);
    return rc;
}
