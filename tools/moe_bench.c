/* k3 bench moe: the routed experts (NVFP4, SiTU, W4A16) timed as docs/benchmarks.md says (graph replay, cold
 * weights, medians), with the routing of the real router on random inputs; side by side with the same touched
 * experts held in BF16 and run through cuBLASLt per expert (two GEMMs per expert, activation left out, which
 * favours the baseline). Each M's output is first checked against the CPU reference (M <= 16). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_graph.h"
#include "cli.h"

#define MB_H 7168         /* router input width (the K3 hidden size) */
#define MB_MAX_M 4096     /* prefill sizes: throughput only */
#define MB_MAX_LIST 16
#define MB_MAX_WS_OFFSET (64 << 20) /* --ws-offset: placement studies */
#define MB_DECODE_MAX_M 64 /* up to here the read-ceiling bar applies (M >= 4); above, TFLOP/s is the measure */
#define MB_CHECK_MAX_M 16  /* the CPU reference check (its time grows with M) */
#define MB_BASE_MAX_M 16  /* the baseline's linear plans take <= 32 tokens per expert: measured for M <= 16 */

static void moe_bench_help(void) {
    printf("usage: k3 bench moe [--config tp8|ep16|both] [--m LIST] [--top-k K] [--reps R] [--hot] [--stages]\n"
           "                   [--ws-offset N] [--json]\n\n"
           "Times the GPU routed experts (NVFP4 weights, linear scales, SiTU 4/25, W4A16) per call, for each M:\n"
           "  tp8   896 experts, L = 3584, I = 384, top-k 16 (default)\n"
           "  ep16  56 local experts, L = 3584, I = 3072, top-k 1 (the average local share of a top-16 token at\n"
           "        EP16: 16 * 56 / 896; --top-k changes it)\n"
           "Routing comes from the router (sigmoid noaux_tc) on random x [M, 7168]. Bytes = weights + block\n"
           "scales of the distinct experts touched + x + out; percent of the 4.37 TB/s read ceiling. Baseline:\n"
           "the same touched experts in BF16, GEMM1 and GEMM2 per expert through cuBLASLt (M <= 16).\n"
           "Method: calls captured into a CUDA graph over weight copies exceeding 3x the L2, replayed R times\n"
           "(default 11), median per call. Bars judged here: %% of ceiling >= 60 (tp8) / 70 (ep16) at M >= 4;\n"
           "speedup over the baseline >= 2.5x at M <= 16. Every row also gives TFLOP/s (2 x M x top-k x 3 x I x L\n"
           "flops): the measure at prefill sizes (M > %d: no bandwidth bar, no CPU check above M = %d).\n"
           "  --m LIST    token counts (default 1,2,4,8,16,32,64; 1..%d, at most %d values; e.g. 512,4096)\n"
           "  --hot       skewed routing: every token's lowest-ranked choice becomes expert 0 (unless it chose it\n"
           "              already), so expert 0 gets all M tokens: the worst case of the kernels' tokens per pass\n"
           "  --ws-offset N\n"
           "              the MoE workspace starts N bytes (a multiple of 256) into its allocation, for placement\n"
           "              studies (the library puts its a and pair_out buffers on 64 KB boundaries inside it)\n"
           "  --stages    also time the pipeline cut after each stage (graph replay, median): the router alone,\n"
           "              dispatch, + GEMM1 (with the activation), + GEMM2 (weighted pair outputs), + combine (the\n"
           "              whole call); the differences are each stage's share of the call\n"
           "  --reps R    graph replays per point (7..1000; the median is reported)\n"
           "  --json      one JSON object: a row per (config, M) with the columns above\n"
           "exit status: 0 measured and correct, 1 failure or an incorrect result, 2 usage\n",
           MB_DECODE_MAX_M, MB_CHECK_MAX_M, MB_MAX_M, MB_MAX_LIST);
}

/* The options of `k3 bench moe`, parsed and checked the same way in every build (usage errors: exit 2). */
typedef struct mb_opts {
    int64_t ms[MB_MAX_LIST];
    int nm, json, stages, hot;
    int64_t reps, topk, ws_offset;
    const char *config;
} mb_opts;

static int mb_parse(int argc, char **argv, mb_opts *o) {
    static const int64_t def_ms[] = {1, 2, 4, 8, 16, 32, 64};
    memset(o, 0, sizeof *o);
    memcpy(o->ms, def_ms, sizeof def_ms);
    o->nm = (int)(sizeof def_ms / sizeof def_ms[0]), o->reps = 11, o->config = "both";
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--json")) o->json = 1;
        else if (!strcmp(argv[i], "--stages")) o->stages = 1;
        else if (!strcmp(argv[i], "--hot")) o->hot = 1;
        else if (!strcmp(argv[i], "--m")) {
            if (!(v = k3_cli_value(argc, argv, &i, "--m")) || !(o->nm = k3_cli_parse_list(v, "--m", o->ms, MB_MAX_LIST)))
                return K3_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--reps")) {
            if (!(v = k3_cli_value(argc, argv, &i, "--reps")) || !k3_cli_parse_i64(v, "--reps", &o->reps))
                return K3_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--top-k")) {
            if (!(v = k3_cli_value(argc, argv, &i, "--top-k")) || !k3_cli_parse_i64(v, "--top-k", &o->topk))
                return K3_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--ws-offset")) {
            if (!(v = k3_cli_value(argc, argv, &i, "--ws-offset")) ||
                !k3_cli_parse_i64(v, "--ws-offset", &o->ws_offset))
                return K3_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--config")) {
            if (!(o->config = k3_cli_value(argc, argv, &i, "--config"))) return K3_EXIT_USAGE;
        } else {
            fprintf(stderr, "k3 bench moe: unknown option '%s' (see k3 bench moe --help)\n", argv[i]);
            return K3_EXIT_USAGE;
        }
    }
    if (strcmp(o->config, "tp8") && strcmp(o->config, "ep16") && strcmp(o->config, "both")) {
        fprintf(stderr, "k3 bench moe: --config must be tp8, ep16 or both (got '%s')\n", o->config);
        return K3_EXIT_USAGE;
    }
    for (int i = 0; i < o->nm; i++)
        if (o->ms[i] < 1 || o->ms[i] > MB_MAX_M) {
            fprintf(stderr, "k3 bench moe: --m values must be in 1..%d\n", MB_MAX_M);
            return K3_EXIT_USAGE;
        }
    if (o->reps < 7 || o->reps > 1000) {
        fprintf(stderr, "k3 bench moe: --reps must be in 7..1000 (docs/benchmarks.md: the median of >= 7 replays)\n");
        return K3_EXIT_USAGE;
    }
    if (o->ws_offset < 0 || o->ws_offset > MB_MAX_WS_OFFSET || o->ws_offset % 256 != 0) {
        fprintf(stderr, "k3 bench moe: --ws-offset must be a multiple of 256 in 0..%d\n", MB_MAX_WS_OFFSET);
        return K3_EXIT_USAGE;
    }
    if (o->topk != 0 && (o->topk < 1 || o->topk > 16)) {
        fprintf(stderr, "k3 bench moe: --top-k must be in 1..16\n");
        return K3_EXIT_USAGE;
    }
    return K3_EXIT_OK;
}

#ifndef K3_HAVE_CUDA
int k3_bench_moe(int argc, char **argv) {
    if (k3_cli_wants_help(argc, argv)) {
        moe_bench_help();
        return K3_EXIT_OK;
    }
    mb_opts o;
    const int pr = mb_parse(argc, argv, &o);
    if (pr != K3_EXIT_OK) return pr;
    fprintf(stderr, "k3 bench moe: this build has no CUDA backend\n");
    return K3_EXIT_FAIL;
}
#else
#include <cuda_runtime.h>

/* internals: the per-stage breakdown cuts the plan's own launch sequence after each stage */
#include "api/moe_internal.h"
#include "cuda/moe/moe.h"

typedef struct moe_bench {
    k3_ctx *ctx;
    k3_moe_desc d;
    int64_t m;
    int32_t copies;
    size_t w13_b, w2_b, w13s_b, w2s_b; /* per expert */
    k3_moe_weights *w;                 /* [copies], device */
    uint16_t **bw13, **bw2;            /* [copies] BF16 experts, device */
    uint16_t *x, *out, *h1, *o1;
    int32_t *ids;
    float *wts;
    void *ws, *lws;
    uint8_t *ws_alloc; /* ws = ws_alloc + --ws-offset */
    size_t ws_bytes, lws_bytes;
    k3_moe_plan *plan;
    k3_linear_plan *lt1, *lt2;
    int32_t n_touched;
    int32_t *touched, *cnt; /* [E] */
    k3_cuda_moe cm;         /* the same MoE as plan, for the per-stage cuts */
    int32_t stages;
    k3_router_plan *rp;
    uint16_t *dxr, *dgate;
    float *dbias;
    void *rws;
    size_t rws_bytes;
} moe_bench;

/* The inputs come from fixed seeds: one stream per configuration for the weights and the router's gate, and one per
 * token row for x and the router input, so a token's routing does not depend on the --m list or --config. */
#define MB_SEED 0x6d6f6542u
static uint64_t mb_next(uint64_t *rng) {
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    return *rng;
}
static float mb_uniform(uint64_t *rng) { return (float)((mb_next(rng) >> 40) * (2.0 / 16777216.0) - 1.0); }
static uint64_t mb_row_seed(uint64_t salt, int64_t row) {
    return MB_SEED ^ salt ^ (0x9e3779b97f4a7c15ull * (uint64_t)(row + 1));
}

static k3_status mb_report(moe_bench *b, k3_status st, const char *what) {
    if (st != K3_STATUS_SUCCESS)
        fprintf(stderr, "k3 bench moe: %s: %s: %s\n", what, k3_status_string(st), k3_ctx_last_error(b->ctx));
    return st;
}

static k3_status call_moe(void *u, int32_t c, void *s, char *err, size_t err_size) {
    moe_bench *b = (moe_bench *)u;
    (void)err, (void)err_size;
    return mb_report(b, k3_moe_run(b->plan, b->m, b->x, b->ids, b->wts, &b->w[c], b->out, NULL, b->ws, b->ws_bytes, s),
                     "moe run");
}

static k3_status call_stages(void *u, int32_t c, void *s, char *err, size_t err_size) {
    moe_bench *b = (moe_bench *)u;
    (void)err, (void)err_size;
    return mb_report(b,
                     k3_cuda_moe_run_stages(b->ctx, &b->cm, k3_moe_plan_launch(b->plan, b->m), b->m, b->x, b->ids,
                                            b->wts, &b->w[c], b->out, NULL, b->ws, s, b->stages),
                     "moe stages");
}

static k3_status call_router(void *u, int32_t c, void *s, char *err, size_t err_size) {
    moe_bench *b = (moe_bench *)u;
    (void)c, (void)err, (void)err_size;
    return mb_report(b, k3_router_run(b->rp, b->m, b->dxr, b->dgate, b->dbias, b->ids, b->wts, b->rws, b->rws_bytes, s),
                     "router");
}

static k3_status call_base(void *u, int32_t c, void *s, char *err, size_t err_size) {
    moe_bench *b = (moe_bench *)u;
    (void)err, (void)err_size;
    const int64_t L = b->d.hidden, I = b->d.inter;
    for (int32_t i = 0; i < b->n_touched; i++) {
        const int32_t e = b->touched[i];
        const int64_t n = b->cnt[e] < 32 ? b->cnt[e] : 32;
        k3_status st = k3_linear_run(b->lt1, n, b->x, b->bw13[c] + (size_t)e * (size_t)(2 * I * L), NULL, b->h1,
                                     b->lws, b->lws_bytes, s);
        if (st == K3_STATUS_SUCCESS)
            st = k3_linear_run(b->lt2, n, b->h1, b->bw2[c] + (size_t)e * (size_t)(L * I), NULL, b->o1, b->lws,
                               b->lws_bytes, s);
        if (st != K3_STATUS_SUCCESS) return mb_report(b, st, "baseline");
    }
    return K3_STATUS_SUCCESS;
}

static void fill_bytes(uint64_t *rng, uint8_t *p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint64_t v = mb_next(rng);
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++) p[i] = (uint8_t)(mb_next(rng) >> 56);
}

static int bench_config(const char *name, int32_t E, int32_t k, int64_t I, const int64_t *ms, int nm, int64_t reps,
                        int json, int stages, int hot, int64_t ws_offset, int *first_row) {
    const int64_t L = 3584;
    int64_t max_m = 1;
    for (int i = 0; i < nm; i++) max_m = ms[i] > max_m ? ms[i] : max_m;
    moe_bench b;
    memset(&b, 0, sizeof b);
    int rc = K3_EXIT_FAIL;
    k3_ctx *cpu = NULL;
    k3_router_plan *rp = NULL;
    k3_moe_plan *cpu_plan = NULL;
    uint8_t *h13 = NULL, *h2 = NULL, *h13s = NULL, *h2s = NULL;
    float *hs13 = NULL, *hs2 = NULL, *dsc = NULL;
    uint16_t *hx = NULL, *hxr = NULL, *hgate = NULL, *dxr = NULL, *dgate = NULL, *hout = NULL;
    float *hbias = NULL, *dbias = NULL, *href = NULL, *hwts = NULL;
    int32_t *hids = NULL;
    void *rws = NULL, *cws = NULL;
    cudaStream_t s = NULL;
    if (!(b.ctx = k3_cli_ctx("cuda"))) return K3_EXIT_FAIL;
    k3_ctx_options o;
    k3_ctx_options_init(&o);
    o.backend = K3_BACKEND_CPU;
    if (k3_ctx_create(&o, &cpu) != K3_STATUS_SUCCESS) goto done;
    k3_arch_info arch;
    k3_ctx_arch(b.ctx, &arch);

    k3_moe_desc_init(&b.d);
    b.d.num_experts = E, b.d.top_k = k, b.d.hidden = L, b.d.inter = I, b.d.max_tokens = max_m;
    b.w13_b = (size_t)(2 * I * L / 2), b.w2_b = (size_t)(L * I / 2);
    b.w13s_b = (size_t)(2 * I * L / 16), b.w2s_b = (size_t)(L * I / 16);
    const size_t per_expert = b.w13_b + b.w2_b + b.w13s_b + b.w2s_b;
    const size_t all_fp4 = per_expert * (size_t)E;
    b.copies = k3_bench_cold_copies((double)all_fp4, arch.l2_bytes);
    b.w = (k3_moe_weights *)calloc((size_t)b.copies, sizeof *b.w);
    b.bw13 = (uint16_t **)calloc((size_t)b.copies, sizeof *b.bw13);
    b.bw2 = (uint16_t **)calloc((size_t)b.copies, sizeof *b.bw2);
    b.touched = (int32_t *)calloc((size_t)E, 4), b.cnt = (int32_t *)calloc((size_t)E, 4);
    h13 = (uint8_t *)malloc(b.w13_b * E), h2 = (uint8_t *)malloc(b.w2_b * E);
    h13s = (uint8_t *)malloc(b.w13s_b * E), h2s = (uint8_t *)malloc(b.w2s_b * E);
    hs13 = (float *)malloc((size_t)E * 4), hs2 = (float *)malloc((size_t)E * 4);
    hx = (uint16_t *)malloc((size_t)(max_m * L) * 2), hxr = (uint16_t *)malloc((size_t)max_m * MB_H * 2);
    hgate = (uint16_t *)malloc((size_t)E * MB_H * 2), hbias = (float *)malloc((size_t)E * 4);
    hids = (int32_t *)malloc((size_t)(max_m * k) * 4), hwts = (float *)malloc((size_t)(max_m * k) * 4);
    hout = (uint16_t *)malloc((size_t)(max_m * L) * 2), href = (float *)malloc((size_t)(max_m * L) * 4);
    if (!b.w || !b.bw13 || !b.bw2 || !b.touched || !b.cnt || !h13 || !h2 || !h13s || !h2s || !hs13 || !hs2 || !hx ||
        !hxr || !hgate || !hbias || !hids || !hwts || !hout || !href) {
        fprintf(stderr, "k3 bench moe: out of host memory\n");
        goto done;
    }
    /* random FP4 codes, e4m3 scales 0.25 .. 2, global scales keeping the dot products O(1) */
    uint64_t rng = MB_SEED;
    fill_bytes(&rng, h13, b.w13_b * E);
    fill_bytes(&rng, h2, b.w2_b * E);
    for (size_t i = 0; i < b.w13s_b * E; i++) h13s[i] = (uint8_t)(0x28 + mb_next(&rng) % 25);
    for (size_t i = 0; i < b.w2s_b * E; i++) h2s[i] = (uint8_t)(0x28 + mb_next(&rng) % 25);
    for (int32_t e = 0; e < E; e++) {
        hs13[e] = (0.7f + 0.3f * mb_uniform(&rng)) / sqrtf((float)L);
        hs2[e] = (0.7f + 0.3f * mb_uniform(&rng)) / sqrtf((float)I);
        hbias[e] = 0.02f * mb_uniform(&rng);
    }
    for (int64_t i = 0; i < (int64_t)E * MB_H; i++) hgate[i] = k3_bf16_from_f32(0.05f * mb_uniform(&rng));
    for (int64_t t = 0; t < max_m; t++) {
        uint64_t rx = mb_row_seed(0x78, t), rr = mb_row_seed(0x72, t);
        for (int64_t c = 0; c < L; c++) hx[t * L + c] = k3_bf16_from_f32(mb_uniform(&rx));
        for (int64_t c = 0; c < MB_H; c++) hxr[t * MB_H + c] = k3_bf16_from_f32(mb_uniform(&rr));
    }
    if (cudaMalloc((void **)&dsc, (size_t)E * 8) != cudaSuccess ||
        cudaMemcpy(dsc, hs13, (size_t)E * 4, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(dsc + E, hs2, (size_t)E * 4, cudaMemcpyHostToDevice) != cudaSuccess)
        goto done;
    for (int32_t c = 0; c < b.copies; c++) {
        void *p13 = NULL, *p2 = NULL, *p13s = NULL, *p2s = NULL;
        if (cudaMalloc(&p13, b.w13_b * E) != cudaSuccess || cudaMalloc(&p2, b.w2_b * E) != cudaSuccess ||
            cudaMalloc(&p13s, b.w13s_b * E) != cudaSuccess || cudaMalloc(&p2s, b.w2s_b * E) != cudaSuccess ||
            cudaMemcpy(p13, h13, b.w13_b * E, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaMemcpy(p2, h2, b.w2_b * E, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaMemcpy(p13s, h13s, b.w13s_b * E, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaMemcpy(p2s, h2s, b.w2s_b * E, cudaMemcpyHostToDevice) != cudaSuccess) {
            fprintf(stderr, "k3 bench moe: device allocation of weight copy %d failed\n", (int)c);
            cudaFree(p13), cudaFree(p2), cudaFree(p13s), cudaFree(p2s);
            goto done;
        }
        b.w[c].w13 = p13, b.w[c].w2 = p2, b.w[c].w13_scale = p13s, b.w[c].w2_scale = p2s;
        b.w[c].w13_scale_2 = dsc, b.w[c].w2_scale_2 = dsc + E;
        /* the BF16 baseline's experts: a non-zero constant pattern (timing only; cuBLASLt is not data dependent) */
        if (cudaMalloc((void **)&b.bw13[c], (size_t)(2 * I * L) * 2 * E) != cudaSuccess ||
            cudaMalloc((void **)&b.bw2[c], (size_t)(L * I) * 2 * E) != cudaSuccess ||
            cudaMemset(b.bw13[c], 0x3c, (size_t)(2 * I * L) * 2 * E) != cudaSuccess ||
            cudaMemset(b.bw2[c], 0x3c, (size_t)(L * I) * 2 * E) != cudaSuccess) {
            fprintf(stderr, "k3 bench moe: device allocation of BF16 copy %d failed\n", (int)c);
            goto done;
        }
    }
    if (mb_report(&b, k3_moe_plan_create(b.ctx, &b.d, &b.plan), "moe plan") ||
        mb_report(&b, k3_moe_workspace_size(b.plan, &b.ws_bytes), "moe workspace"))
        goto done;
    {
        k3_linear_desc l1, l2;
        k3_linear_desc_init(&l1, 2 * I, L);
        k3_linear_desc_init(&l2, L, I);
        l1.max_m = l2.max_m = 32;
        l2.x_stride = 2 * I; /* the first I columns of GEMM1's output stand in for the activation */
        l1.force_kernel = l2.force_kernel = K3_KERNEL_FALLBACK;
        size_t s1 = 0, s2 = 0;
        if (mb_report(&b, k3_linear_plan_create(b.ctx, &l1, &b.lt1), "baseline plan") ||
            mb_report(&b, k3_linear_plan_create(b.ctx, &l2, &b.lt2), "baseline plan"))
            goto done;
        k3_linear_workspace_size(b.lt1, &s1);
        k3_linear_workspace_size(b.lt2, &s2);
        b.lws_bytes = s1 > s2 ? s1 : s2;
    }
    k3_router_desc rd;
    k3_router_desc_init(&rd);
    rd.num_experts = E, rd.top_k = k, rd.hidden = MB_H, rd.max_tokens = max_m;
    size_t rws_b = 0;
    if (mb_report(&b, k3_router_plan_create(b.ctx, &rd, &rp), "router plan")) goto done;
    k3_router_workspace_size(rp, &rws_b);
    if (mb_report(&b, k3_cuda_moe_prepare(b.ctx, &b.cm, &b.d), "moe stages plan")) goto done;
    if (cudaMalloc((void **)&b.x, (size_t)(max_m * L) * 2) != cudaSuccess ||
        cudaMalloc((void **)&b.out, (size_t)(max_m * L) * 2) != cudaSuccess ||
        cudaMalloc((void **)&b.h1, (size_t)(32 * 2 * I) * 2) != cudaSuccess ||
        cudaMalloc((void **)&b.o1, (size_t)(32 * L) * 2) != cudaSuccess ||
        cudaMalloc((void **)&b.ids, (size_t)(max_m * k) * 4) != cudaSuccess ||
        cudaMalloc((void **)&b.wts, (size_t)(max_m * k) * 4) != cudaSuccess ||
        cudaMalloc((void **)&b.ws_alloc, b.ws_bytes + (size_t)ws_offset) != cudaSuccess ||
        (b.lws_bytes && cudaMalloc(&b.lws, b.lws_bytes) != cudaSuccess) ||
        cudaMalloc(&rws, rws_b ? rws_b : 16) != cudaSuccess ||
        cudaMalloc((void **)&dxr, (size_t)max_m * MB_H * 2) != cudaSuccess ||
        cudaMalloc((void **)&dgate, (size_t)E * MB_H * 2) != cudaSuccess ||
        cudaMalloc((void **)&dbias, (size_t)E * 4) != cudaSuccess ||
        cudaMemcpy(b.x, hx, (size_t)(max_m * L) * 2, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(dxr, hxr, (size_t)max_m * MB_H * 2, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(dgate, hgate, (size_t)E * MB_H * 2, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(dbias, hbias, (size_t)E * 4, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        fprintf(stderr, "k3 bench moe: device allocation failed\n");
        goto done;
    }
    b.rp = rp, b.dxr = dxr, b.dgate = dgate, b.dbias = dbias, b.rws = rws, b.rws_bytes = rws_b;
    b.ws = b.ws_alloc + ws_offset;
    if (mb_report(&b, k3_moe_plan_create(cpu, &b.d, &cpu_plan), "cpu moe plan")) goto done;
    size_t cws_b = 0;
    k3_moe_workspace_size(cpu_plan, &cws_b);
    if (!(cws = malloc(cws_b))) goto done;
    if (!json)
        printf("k3 bench moe %s on %s: E=%d top-k=%d L=%lld I=%lld, NVFP4 SiTU W4A16, %s routing, %d weight copies "
               "(%.0f MB FP4, %.0f MB BF16 baseline), %lld replays, median us per call, workspace offset %lld\n"
               "%4s %8s %9s %10s %8s %8s %8s %11s %8s %10s %s\n",
               name, arch.device_name, (int)E, (int)k, (long long)L, (long long)I, hot ? "hot" : "router",
               (int)b.copies,
               b.copies * all_fp4 / 1e6, b.copies * (double)(3 * I * L) * 2 * E / 1e6, (long long)reps,
               (long long)ws_offset, "M", "experts", "MB", "moe us", "TB/s", "%ceil", "TFLOP/s", "bf16-lt us",
               "speedup", "check", "bars");
    int all_ok = 1;
    for (int i = 0; i < nm; i++) {
        b.m = ms[i];
        char err[320] = "";
        /* routing from the router on random x; then the touched experts on the host (baseline and bytes) */
        if (mb_report(&b, k3_router_run(rp, b.m, dxr, dgate, dbias, b.ids, b.wts, rws, rws_b, s), "router") ||
            k3_bench_sync(s, err, sizeof err) != K3_STATUS_SUCCESS ||
            cudaMemcpy(hids, b.ids, (size_t)(b.m * k) * 4, cudaMemcpyDeviceToHost) != cudaSuccess ||
            cudaMemcpy(hwts, b.wts, (size_t)(b.m * k) * 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
            fprintf(stderr, "k3 bench moe: routing failed %s\n", err);
            goto done;
        }
        if (hot) { /* a token's ids stay distinct: 0 replaces its last choice only when it is absent */
            for (int64_t t = 0; t < b.m; t++) {
                int has0 = 0;
                for (int32_t j = 0; j < k; j++) has0 |= hids[t * k + j] == 0;
                if (!has0) hids[t * k + k - 1] = 0;
            }
            if (cudaMemcpy(b.ids, hids, (size_t)(b.m * k) * 4, cudaMemcpyHostToDevice) != cudaSuccess) {
                fprintf(stderr, "k3 bench moe: copying the skewed routing failed\n");
                goto done;
            }
        }
        memset(b.cnt, 0, (size_t)E * 4);
        for (int64_t j = 0; j < b.m * k; j++) b.cnt[hids[j]]++;
        b.n_touched = 0;
        for (int32_t e = 0; e < E; e++)
            if (b.cnt[e]) b.touched[b.n_touched++] = e;
        const double bytes = (double)b.n_touched * (double)per_expert + 2.0 * 2.0 * (double)(b.m * L);
        /* correctness of copy 0 against the CPU reference (M <= 16 keeps the CPU time small) */
        double rel = -1.0;
        if (call_moe(&b, 0, s, err, sizeof err) != K3_STATUS_SUCCESS || k3_bench_sync(s, err, sizeof err)) goto done;
        if (b.m <= MB_CHECK_MAX_M) {
            k3_moe_weights hw;
            memset(&hw, 0, sizeof hw);
            hw.w13 = h13, hw.w2 = h2, hw.w13_scale = h13s, hw.w2_scale = h2s, hw.w13_scale_2 = hs13, hw.w2_scale_2 = hs2;
            if (mb_report(&b, k3_moe_run(cpu_plan, b.m, hx, hids, hwts, &hw, hout, href, cws, cws_b, NULL), "cpu ref"))
                goto done;
            if (cudaMemcpy(hout, b.out, (size_t)(b.m * L) * 2, cudaMemcpyDeviceToHost) != cudaSuccess) goto done;
            double num = 0, den = 0;
            for (int64_t j = 0; j < b.m * L; j++) {
                const double g = k3_bf16_to_f32(hout[j]), r = href[j];
                num += (g - r) * (g - r), den += r * r;
            }
            rel = isfinite(num) ? sqrt(num / (den > 0 ? den : 1)) : INFINITY;
        }
        const int correct = rel < 0 || rel <= 1e-2;
        const k3_bench_timing tm = {b.copies, b.copies * 4, 3, (int32_t)reps};
        double t_moe = 0, t_base = 0;
        if (k3_bench_graph_time(call_moe, &b, &tm, s, &t_moe, err, sizeof err)) {
            fprintf(stderr, "k3 bench moe: m=%lld: %s\n", (long long)b.m, err);
            goto done;
        }
        const int base = b.m <= MB_BASE_MAX_M;
        if (base && k3_bench_graph_time(call_base, &b, &tm, s, &t_base, err, sizeof err)) {
            fprintf(stderr, "k3 bench moe: m=%lld baseline: %s\n", (long long)b.m, err);
            goto done;
        }
        const double pct = 100.0 * bytes / (t_moe * 1e-6) / K3_BENCH_READ_CEILING;
        const double tflops = 2.0 * (double)(b.m * k) * 3.0 * (double)I * (double)L / (t_moe * 1e-6) / 1e12;
        const double need = E >= 896 ? 60.0 : 70.0;
        const int bar_bw = b.m < 4 || b.m > MB_DECODE_MAX_M || pct >= need, bar_sp = !base || t_base / t_moe >= 2.5;
        all_ok = all_ok && correct && bar_bw && bar_sp;
        if (json)
            printf("%s{\"config\": \"%s\", \"routing\": \"%s\", \"m\": %lld, \"experts_touched\": %d, \"bytes\": %.0f, "
                   "\"moe_us\": %.3f, \"pct_ceiling\": %.2f, \"tflops\": %.3f, \"tokens_per_s\": %.0f, "
                   "\"bf16_cublaslt_us\": %.3f, \"speedup\": %.3f, \"rel_l2\": %.3e, \"correct\": %s",
                   *first_row ? "" : ", ", name, hot ? "hot" : "router", (long long)b.m, (int)b.n_touched, bytes,
                   t_moe, pct, tflops,
                   (double)b.m / (t_moe * 1e-6), base ? t_base : -1.0, base ? t_base / t_moe : -1.0, rel,
                   correct ? "true" : "false");
        else
            printf("%4lld %8d %9.1f %10.2f %8.2f %8.1f %8.2f %11.2f %8.2f %10s %s%s\n", (long long)b.m,
                   (int)b.n_touched, bytes / 1e6, t_moe, bytes / (t_moe * 1e-6) / 1e12, pct, tflops, base ? t_base : NAN,
                   base ? t_base / t_moe : NAN, rel < 0 ? "skipped" : correct ? "ok" : "WRONG",
                   bar_bw ? "" : "FAIL(%ceil) ", bar_sp ? (correct ? "ok" : "") : "FAIL(speedup)");
        if (stages) {
            /* the call cut after each stage; with PDL a later stage overlaps an earlier one's tail, so the
             * differences are marginal costs */
            double t_st[5] = {0, 0, 0, 0, 0};
            if (k3_bench_graph_time(call_router, &b, &tm, s, &t_st[0], err, sizeof err)) {
                fprintf(stderr, "k3 bench moe: m=%lld router: %s\n", (long long)b.m, err);
                goto done;
            }
            for (int32_t st = K3_CUDA_MOE_STAGE_DISPATCH; st <= K3_CUDA_MOE_STAGE_ALL; st++) {
                b.stages = st;
                if (k3_bench_graph_time(call_stages, &b, &tm, s, &t_st[st], err, sizeof err)) {
                    fprintf(stderr, "k3 bench moe: m=%lld stage %d: %s\n", (long long)b.m, (int)st, err);
                    goto done;
                }
            }
            if (json)
                printf(", \"stages_us\": {\"router\": %.3f, \"dispatch\": %.3f, \"to_gemm1\": %.3f, \"to_gemm2\": %.3f, "
                       "\"all\": %.3f}",
                       t_st[0], t_st[1], t_st[2], t_st[3], t_st[4]);
            else
                printf("     stages (us, cumulative): router alone %.2f | dispatch %.2f | +gemm1 %.2f (%.2f) | +gemm2 %.2f "
                       "(%.2f) | +combine %.2f (%.2f)\n",
                       t_st[0], t_st[1], t_st[2], t_st[2] - t_st[1], t_st[3], t_st[3] - t_st[2], t_st[4],
                       t_st[4] - t_st[3]);
        }
        if (json) printf("}");
        *first_row = 0;
        fflush(stdout);
    }
    rc = all_ok ? K3_EXIT_OK : K3_EXIT_FAIL;
done:
    if (s) cudaStreamDestroy(s);
    k3_router_plan_destroy(rp);
    k3_moe_plan_destroy(b.plan);
    k3_moe_plan_destroy(cpu_plan);
    k3_linear_plan_destroy(b.lt1);
    k3_linear_plan_destroy(b.lt2);
    for (int32_t c = 0; b.w && c < b.copies; c++) {
        cudaFree((void *)b.w[c].w13), cudaFree((void *)b.w[c].w2);
        cudaFree((void *)b.w[c].w13_scale), cudaFree((void *)b.w[c].w2_scale);
    }
    for (int32_t c = 0; b.bw13 && c < b.copies; c++) cudaFree(b.bw13[c]);
    for (int32_t c = 0; b.bw2 && c < b.copies; c++) cudaFree(b.bw2[c]);
    cudaFree(dsc), cudaFree(b.x), cudaFree(b.out), cudaFree(b.h1), cudaFree(b.o1), cudaFree(b.ids), cudaFree(b.wts);
    cudaFree(b.ws_alloc), cudaFree(b.lws), cudaFree(rws), cudaFree(dxr), cudaFree(dgate), cudaFree(dbias);
    free(b.w), free(b.bw13), free(b.bw2), free(b.touched), free(b.cnt), free(h13), free(h2), free(h13s), free(h2s);
    free(hs13), free(hs2), free(hx), free(hxr), free(hgate), free(hbias), free(hids), free(hwts), free(hout);
    free(href), free(cws);
    k3_ctx_destroy(cpu);
    k3_ctx_destroy(b.ctx);
    return rc;
}

int k3_bench_moe(int argc, char **argv) {
    if (k3_cli_wants_help(argc, argv)) {
        moe_bench_help();
        return K3_EXIT_OK;
    }
    mb_opts o;
    const int pr = mb_parse(argc, argv, &o);
    if (pr != K3_EXIT_OK) return pr;
    int rc = K3_EXIT_OK, first = 1;
    if (o.json) printf("{\"rows\": [");
    if (strcmp(o.config, "ep16")) {
        const int r = bench_config("tp8", 896, o.topk ? (int32_t)o.topk : 16, 384, o.ms, o.nm, o.reps, o.json,
                                   o.stages, o.hot, o.ws_offset, &first);
        rc = r != K3_EXIT_OK ? r : rc;
    }
    if (strcmp(o.config, "tp8")) {
        const int r = bench_config("ep16", 56, o.topk ? (int32_t)o.topk : 1, 3072, o.ms, o.nm, o.reps, o.json,
                                   o.stages, o.hot, o.ws_offset, &first);
        rc = r != K3_EXIT_OK ? r : rc;
    }
    if (o.json) printf("], \"ok\": %s}\n", rc == K3_EXIT_OK ? "true" : "false");
    return rc;
}
#endif
