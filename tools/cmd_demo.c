/*
 * k3 demo: the Kimi-K3 latent-MoE block at its real TP8 shapes (H 7168, 896 experts top-16, L 3584, I 384,
 * shared Is 768, NVFP4 experts) on synthetic weights, timed per stage for a few token counts, then a
 * correctness line: the library against an independent fp64 evaluation (tests/ref_moe.h) on a smaller block.
 *
 * Weights are drawn directly in storage form from a fixed seed: FP4 codes are uniformly random bytes, e4m3 block
 * scales random codes in [0.5, 1.875], and scale_2 per expert makes the dequantized rms 1/sqrt(K) (0.017 for
 * W13, 0.051 for W2); BF16 dense weights are uniform with std 1/sqrt(K). Quantizing 5e9 fp32 values would
 * take minutes and tell nothing more about speed.
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef K3_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "api/moe_internal.h"
#include "cli.h"
#include "../tests/ref_moe.h"

#define DEMO_SEED 0x4b33446d6fULL /* "K3Dmo" */
#define MAX_M 64

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* xorshift64*: fast enough to fill 2 GB in about a second. */
typedef struct {
    uint64_t s;
} demo_rng;
static uint64_t rng_next(demo_rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1DULL;
}
/* uniform in [-1, 1) */
static float rng_unit(demo_rng *r) { return (float)((double)(rng_next(r) >> 40) * (2.0 / 16777216.0) - 1.0); }

static void fill_bytes(demo_rng *r, uint8_t *p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = rng_next(r);
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++) p[i] = (uint8_t)(rng_next(r) >> 56);
}

/* e4m3 codes 0x30..0x3f: 0.5 .. 1.875 (mean ~1.08, rms ~1.14) */
static void fill_scales(demo_rng *r, uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        uint64_t v = rng_next(r);
        for (size_t j = 0; j < 16 && i + j < n; j++) p[i + j] = (uint8_t)(0x30 + ((v >> (4 * j)) & 15));
    }
}

/* BF16 uniform values with standard deviation sd. */
static void fill_bf16(demo_rng *r, uint16_t *p, size_t n, double sd) {
    const float a = (float)(sd * sqrt(3.0));
    for (size_t i = 0; i < n; i++) p[i] = k3_bf16_from_f32(a * rng_unit(r));
}

typedef struct demo_block {
    k3_latent_moe_desc d;
    k3_latent_moe_weights w;
    void *buf[16];
    size_t size[16];
    void *dev[16]; /* device copies of buf[] when the block runs on a CUDA context */
    int nbuf;
    size_t bytes_fp4, bytes_dense;
} demo_block;

static void *block_alloc(demo_block *b, size_t n) {
    void *p = malloc(n ? n : 1);
    if (p) {
        b->size[b->nbuf] = n;
        b->buf[b->nbuf++] = p;
    }
    return p;
}

static void block_free(demo_block *b);

/* ---- device copies for a CUDA context (the library takes device pointers there) ---- */
#ifdef K3_HAVE_CUDA
static void *dev_alloc(size_t n) {
    void *d = NULL;
    return cudaMalloc(&d, n ? n : 1) == cudaSuccess ? d : NULL;
}
static void dev_free(void *d) {
    if (d) cudaFree(d);
}
static int dev_put(void *d, const void *h, size_t n) { return cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) == cudaSuccess; }
static int dev_get(void *h, const void *d, size_t n) { return cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) == cudaSuccess; }
static int dev_sync(void) { return cudaDeviceSynchronize() == cudaSuccess; }
#else
static void *dev_alloc(size_t n) { return (void)n, NULL; }
static void dev_free(void *d) { (void)d; }
static int dev_put(void *d, const void *h, size_t n) { return (void)d, (void)h, (void)n, 0; }
static int dev_get(void *h, const void *d, size_t n) { return (void)h, (void)d, (void)n, 0; }
static int dev_sync(void) { return 0; }
#endif

/* The device pointer mirroring host buffer p of the block (NULL stays NULL). */
static const void *dev_of(const demo_block *b, const void *p) {
    for (int i = 0; p && i < b->nbuf; i++)
        if (b->buf[i] == p) return b->dev[i];
    return NULL;
}

/* Copies every weight buffer to the device and returns the weights struct with device pointers in *dw. */
static int block_to_device(demo_block *b, k3_latent_moe_weights *dw) {
    for (int i = 0; i < b->nbuf; i++)
        if (!(b->dev[i] = dev_alloc(b->size[i])) || !dev_put(b->dev[i], b->buf[i], b->size[i])) return 0;
    const k3_latent_moe_weights *w = &b->w;
    *dw = *w;
    dw->gate = dev_of(b, w->gate);
    dw->bias = (const float *)dev_of(b, w->bias);
    dw->down_proj = dev_of(b, w->down_proj);
    dw->norm = dev_of(b, w->norm);
    dw->up_proj = dev_of(b, w->up_proj);
    dw->shared_gate_up = dev_of(b, w->shared_gate_up);
    dw->shared_down = dev_of(b, w->shared_down);
    dw->experts.w13 = dev_of(b, w->experts.w13);
    dw->experts.w13_scale = dev_of(b, w->experts.w13_scale);
    dw->experts.w13_scale_2 = (const float *)dev_of(b, w->experts.w13_scale_2);
    dw->experts.w2 = dev_of(b, w->experts.w2);
    dw->experts.w2_scale = dev_of(b, w->experts.w2_scale);
    dw->experts.w2_scale_2 = (const float *)dev_of(b, w->experts.w2_scale_2);
    return 1;
}

static void block_free(demo_block *b) {
    for (int i = 0; i < b->nbuf; i++) {
        free(b->buf[i]);
        dev_free(b->dev[i]);
        b->dev[i] = NULL;
    }
    b->nbuf = 0;
}

/* Buffers of a run: host memory on the CPU backend, device memory (plus a host copy of y) on CUDA. */
typedef struct demo_io {
    int on_dev;
    void *ws, *x, *y;
    int32_t *ids;
    float *wts;
} demo_io;

static int io_alloc(demo_io *io, int on_dev, size_t wsb, size_t xb, size_t yb, size_t routes) {
    memset(io, 0, sizeof *io);
    io->on_dev = on_dev;
    void *(*al)(size_t) = on_dev ? dev_alloc : malloc;
    io->ws = al(wsb ? wsb : 1);
    io->x = al(xb);
    io->y = al(yb);
    io->ids = (int32_t *)al(routes * sizeof(int32_t));
    io->wts = (float *)al(routes * sizeof(float));
    return io->ws && io->x && io->y && io->ids && io->wts;
}

static void io_free(demo_io *io) {
    void (*fr)(void *) = io->on_dev ? dev_free : free;
    fr(io->ws), fr(io->x), fr(io->y), fr(io->ids), fr(io->wts);
    memset(io, 0, sizeof *io);
}

/* Synthesizes the weights of descriptor b->d (NVFP4 experts, linear scales, shared scale_2). */
static int block_make(demo_block *b, demo_rng *r) {
    const k3_latent_moe_desc *d = &b->d;
    const int64_t e = d->experts.num_experts, l = d->experts.hidden, in = d->experts.inter, h = d->hidden;
    const int64_t is = d->shared_inter;
    const size_t w13n = (size_t)(e * 2 * in * l), w2n = (size_t)(e * l * in);
    uint8_t *w13 = block_alloc(b, w13n / 2), *w2 = block_alloc(b, w2n / 2);
    uint8_t *s13 = block_alloc(b, w13n / 16), *s2 = block_alloc(b, w2n / 16);
    float *g13 = block_alloc(b, sizeof(float) * (size_t)e), *g2 = block_alloc(b, sizeof(float) * (size_t)e);
    uint16_t *gate = block_alloc(b, 2 * (size_t)(e * h)), *down = block_alloc(b, 2 * (size_t)(l * h));
    uint16_t *norm = block_alloc(b, 2 * (size_t)l), *up = block_alloc(b, 2 * (size_t)(h * l));
    uint16_t *sgu = block_alloc(b, 2 * (size_t)(2 * is * h)), *sd = block_alloc(b, 2 * (size_t)(h * is));
    float *bias = block_alloc(b, sizeof(float) * (size_t)e);
    if (b->nbuf != 13) return 0;
    fill_bytes(r, w13, w13n / 2);
    fill_bytes(r, w2, w2n / 2);
    fill_scales(r, s13, w13n / 16);
    fill_scales(r, s2, w2n / 16);
    /* rms(code value) ~ 2.93 and rms(block scale) ~ 1.14: scale_2 = target / (2.93 * 1.14) */
    for (int64_t i = 0; i < e; i++) {
        g13[i] = (float)(1.0 / sqrt((double)l) / 3.34 * (0.9 + 0.1 * rng_unit(r)));
        g2[i] = (float)(1.0 / sqrt((double)in) / 3.34 * (0.9 + 0.1 * rng_unit(r)));
        bias[i] = 0.01f * rng_unit(r);
    }
    fill_bf16(r, gate, (size_t)(e * h), 1.0 / sqrt((double)h));
    fill_bf16(r, down, (size_t)(l * h), 1.0 / sqrt((double)h));
    for (int64_t i = 0; i < l; i++) norm[i] = k3_bf16_from_f32(1.0f + 0.1f * rng_unit(r));
    fill_bf16(r, up, (size_t)(h * l), 1.0 / sqrt((double)l));
    fill_bf16(r, sgu, (size_t)(2 * is * h), 1.0 / sqrt((double)h));
    fill_bf16(r, sd, (size_t)(h * is), 1.0 / sqrt((double)is));
    memset(&b->w, 0, sizeof b->w);
    b->w.gate = gate;
    b->w.bias = bias;
    b->w.down_proj = down;
    b->w.norm = norm;
    b->w.up_proj = up;
    b->w.shared_gate_up = sgu;
    b->w.shared_down = sd;
    b->w.experts.w13 = w13;
    b->w.experts.w13_scale = s13;
    b->w.experts.w13_scale_2 = g13;
    b->w.experts.w2 = w2;
    b->w.experts.w2_scale = s2;
    b->w.experts.w2_scale_2 = g2;
    b->bytes_fp4 = (w13n + w2n) / 2 + (w13n + w2n) / 16 + 8 * (size_t)e;
    b->bytes_dense = 2 * (size_t)(e * h + 2 * l * h + l + 3 * is * h) + 4 * (size_t)e;
    return 1;
}

static void block_desc(k3_latent_moe_desc *d, int32_t e, int32_t k, int64_t h, int64_t l, int64_t in, int64_t is,
                       int64_t max_m) {
    k3_latent_moe_desc_init(d);
    d->hidden = d->router.hidden = h;
    d->router.num_experts = d->experts.num_experts = e;
    d->router.top_k = d->experts.top_k = k;
    d->experts.hidden = l;
    d->experts.inter = in;
    d->shared_inter = is;
    d->max_tokens = max_m;
}

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
    printf("usage: k3 demo [--device cpu|cuda|auto] [--m LIST]\n\n"
           "Runs the Kimi-K3 latent-MoE block at its TP8 shapes (H 7168, 896 experts top-16, L 3584, I 384, shared\n"
           "Is 768; NVFP4 experts, W4A16, SiTU 4/25; weights synthesized from a fixed printed seed) for each token\n"
           "count M (default 1,4,16), printing per-stage times (router, down, experts, norm+up, shared) and the\n"
           "total; then checks the library against an independent fp64 evaluation on a smaller block (E 16,\n"
           "top-4, L 256, I 64, H 512, Is 128) and prints 'correctness: rel-L2 X <= 1e-3: PASS'.\n"
           "On a CUDA context the weights are copied to the device and the GPU block is timed (total only: the\n"
           "per-stage breakdown is measured on the CPU backend); a backend without the MoE falls back to the CPU.\n\n"
           "  --device D   cpu, cuda or auto (default auto)\n"
           "  --m LIST     token counts, e.g. 1,4,16 or 1-8 (each 1..%d)\n\n"
           "exit status: 0 success, 1 failure (including a failed correctness check), 2 usage error\n",
           MAX_M);
}

/* The correctness line: the library (on ctx) against tests/ref_moe.h's fp64 evaluation. */
static int check_small(k3_ctx *ctx) {
    demo_block b;
    memset(&b, 0, sizeof b);
    const int64_t m = 4;
    block_desc(&b.d, 16, 4, 512, 256, 64, 128, m);
    demo_rng r = {DEMO_SEED ^ 0x5a5a5a5aULL};
    k3_latent_moe_plan *p = NULL;
    void *ws = NULL;
    uint16_t *x = NULL, *y = NULL;
    int32_t ids[4 * 4], rids[4 * 4];
    float wts[4 * 4];
    double rw[4 * 4], *ref = NULL, *got = NULL;
    int ok = 0;
    size_t wsb = 0;
    const int on_dev = k3_ctx_backend(ctx) == K3_BACKEND_CUDA;
    demo_io io;
    memset(&io, 0, sizeof io);
    if (!block_make(&b, &r)) goto oom;
    if (k3_latent_moe_plan_create(ctx, &b.d, &p) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 demo: correctness plan: %s\n", k3_ctx_last_error(ctx));
        goto done;
    }
    k3_latent_moe_workspace_size(p, &wsb);
    ws = malloc(wsb);
    x = malloc(sizeof(uint16_t) * (size_t)(m * 512));
    y = malloc(sizeof(uint16_t) * (size_t)(m * 512));
    ref = malloc(sizeof(double) * (size_t)(m * 512));
    got = malloc(sizeof(double) * (size_t)(m * 512));
    if (!ws || !x || !y || !ref || !got) goto oom;
    fill_bf16(&r, x, (size_t)(m * 512), 1.0);
    if (on_dev) { /* the same block on the GPU: device copies in, results back */
        k3_latent_moe_weights dw;
        if (!block_to_device(&b, &dw) || !io_alloc(&io, 1, wsb, sizeof(uint16_t) * (size_t)(m * 512),
                                                   sizeof(uint16_t) * (size_t)(m * 512), sizeof ids / sizeof ids[0]) ||
            !dev_put(io.x, x, sizeof(uint16_t) * (size_t)(m * 512)))
            goto oom;
        if (k3_latent_moe_run(p, m, io.x, &dw, NULL, io.y, io.ids, io.wts, io.ws, wsb, NULL) != K3_STATUS_SUCCESS) {
            fprintf(stderr, "k3 demo: correctness run: %s\n", k3_ctx_last_error(ctx));
            goto done;
        }
        if (!dev_sync() || !dev_get(y, io.y, sizeof(uint16_t) * (size_t)(m * 512)) || !dev_get(ids, io.ids, sizeof ids) ||
            !dev_get(wts, io.wts, sizeof wts)) {
            fprintf(stderr, "k3 demo: correctness run on the GPU failed (CUDA error)\n");
            goto done;
        }
    } else if (k3_latent_moe_run(p, m, x, &b.w, NULL, y, ids, wts, ws, wsb, NULL) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 demo: correctness run: %s\n", k3_ctx_last_error(ctx));
        goto done;
    }
    ref_latent(&b.d, &b.w, m, x, NULL, ref, rids, rw);
    for (int64_t i = 0; i < m * 512; i++) got[i] = k3_bf16_to_f32(y[i]);
    const double rel = ref_rel_l2(got, ref, m * 512);
    const int ids_ok = !memcmp(ids, rids, sizeof ids);
    /* the CPU backend is held to the reference bar, the GPU to the GPU-vs-reference W4A16 bar (issue 6) */
    const double bar = on_dev ? 1e-2 : 1e-3;
    ok = ids_ok && rel <= bar;
    printf("correctness (%s): E 16 top-4 L 256 I 64 H 512 Is 128 M %lld vs an independent fp64 evaluation: routing "
           "ids %s, rel-L2 %.2e <= %.0e: %s\n",
           on_dev ? "cuda" : "cpu", (long long)m, ids_ok ? "identical" : "DIFFER", rel, bar, ok ? "PASS" : "FAIL");
    goto done;
oom:
    fprintf(stderr, "k3 demo: out of memory\n");
done:
    k3_latent_moe_plan_destroy(p);
    io_free(&io);
    free(ws);
    free(x);
    free(y);
    free(ref);
    free(got);
    block_free(&b);
    return ok;
}

int k3_cmd_demo(int argc, char **argv) {
    const char *device = "auto";
    int64_t ms[MAX_M] = {1, 4, 16};
    int nm = 3;
    if (k3_cli_wants_help(argc, argv)) {
        demo_help();
        return K3_EXIT_OK;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device")) {
            if (!(device = k3_cli_value(argc, argv, &i, "--device"))) return K3_EXIT_USAGE;
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
    k3_ctx *ctx = k3_cli_ctx(device);
    if (!ctx) return K3_EXIT_FAIL;

    demo_block b;
    memset(&b, 0, sizeof b);
    block_desc(&b.d, 896, 16, 7168, 3584, 384, 768, max_m);
    k3_latent_moe_plan *plan = NULL;
    k3_status st = k3_latent_moe_plan_create(ctx, &b.d, &plan);
    if (st == K3_STATUS_UNSUPPORTED && k3_ctx_backend(ctx) != K3_BACKEND_CPU) {
        printf("note: this build's CUDA backend has no MoE yet (%s); running the CPU reference backend instead\n",
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
    printf("k3 demo: Kimi-K3 latent-MoE block, TP8 slice: H 7168, E 896 top-16, L 3584, I 384, shared Is 768\n"
           "         NVFP4 experts (linear scales), W4A16, SiTU 4/25, sigmoid noaux_tc router, RMSNorm eps 1e-5\n"
           "backend: %s (%s)\n",
           on_cpu ? "cpu" : "cuda", arch.device_name);

    int rc = K3_EXIT_FAIL;
    demo_io io;
    memset(&io, 0, sizeof io);
    void *ws = NULL;
    uint16_t *x = NULL, *y = NULL;
    size_t wsb = 0;
    demo_rng r = {DEMO_SEED};
    double t0 = now_s();
    if (!block_make(&b, &r)) goto oom;
    printf("weights: synthesized from seed 0x%llx in %.2f s (%.2f GB NVFP4 experts + %.2f GB BF16 dense)\n",
           (unsigned long long)DEMO_SEED, now_s() - t0, (double)b.bytes_fp4 / 1e9, (double)b.bytes_dense / 1e9);
    k3_latent_moe_workspace_size(plan, &wsb);
    ws = malloc(wsb);
    x = malloc(sizeof(uint16_t) * (size_t)(max_m * 7168));
    y = malloc(sizeof(uint16_t) * (size_t)(max_m * 7168));
    if (!ws || !x || !y) goto oom;
    fill_bf16(&r, x, (size_t)(max_m * 7168), 1.0);
    k3_latent_moe_weights dw = b.w;
    if (!on_cpu) {
        t0 = now_s();
        if (!block_to_device(&b, &dw) ||
            !io_alloc(&io, 1, wsb, sizeof(uint16_t) * (size_t)(max_m * 7168), sizeof(uint16_t) * (size_t)(max_m * 7168),
                      (size_t)(max_m * 16)) ||
            !dev_put(io.x, x, sizeof(uint16_t) * (size_t)(max_m * 7168)))
            goto oom;
        printf("weights copied to the device in %.2f s\n", now_s() - t0);
    }

    printf("\n%5s %9s %9s %9s %9s %9s %10s   %s\n", "M", "router", "down", "experts", "norm+up", "shared", "total ms",
           "(k3_latent_moe_run)");
    const k3_cpu_latent *cpu = k3_latent_moe_plan_cpu(plan);
    for (int i = 0; i < nm; i++) {
        const int64_t m = ms[i];
        if (!on_cpu) { /* warm-up call (module load), then the timed one */
            st = k3_latent_moe_run(plan, m, io.x, &dw, NULL, io.y, NULL, NULL, io.ws, wsb, NULL);
            if (st == K3_STATUS_SUCCESS && !dev_sync()) st = K3_STATUS_CUDA_ERROR;
        }
        t0 = now_s();
        if (on_cpu) st = k3_latent_moe_run(plan, m, x, &b.w, NULL, y, NULL, NULL, ws, wsb, NULL);
        else if (st == K3_STATUS_SUCCESS) {
            st = k3_latent_moe_run(plan, m, io.x, &dw, NULL, io.y, NULL, NULL, io.ws, wsb, NULL);
            if (st == K3_STATUS_SUCCESS && !dev_sync()) st = K3_STATUS_CUDA_ERROR;
        }
        const double total = now_s() - t0;
        if (st != K3_STATUS_SUCCESS) {
            fprintf(stderr, "k3 demo: run M=%lld: %s\n", (long long)m, k3_ctx_last_error(ctx));
            goto done;
        }
        /* the same block again, stage by stage, for the breakdown (the CPU form of the plan) */
        stage_clock c;
        memset(&c, 0, sizeof c);
        c.last = now_s();
        if (on_cpu) k3_cpu_latent_run(cpu, m, x, &b.w, NULL, y, NULL, NULL, ws, on_stage, &c);
        if (on_cpu)
            printf("%5lld %9.1f %9.1f %9.1f %9.1f %9.1f %10.1f\n", (long long)m, 1e3 * c.t[0], 1e3 * c.t[1],
                   1e3 * c.t[2], 1e3 * c.t[3], 1e3 * c.t[4], 1e3 * total);
        else /* the per-stage breakdown exists for the CPU form of the plan only */
            printf("%5lld %9s %9s %9s %9s %9s %10.3f\n", (long long)m, "-", "-", "-", "-", "-", 1e3 * total);
    }
    printf("\n");
    rc = check_small(ctx) ? K3_EXIT_OK : K3_EXIT_FAIL;
    printf("demo total %.1f s\n", now_s() - t_start);
    goto done;
oom:
    fprintf(stderr, "k3 demo: out of memory (the TP8 block needs about 2.1 GB of host memory)\n");
done:
    io_free(&io);
    free(ws);
    free(x);
    free(y);
    block_free(&b);
    k3_latent_moe_plan_destroy(plan);
    k3_ctx_destroy(ctx);
    return rc;
}
