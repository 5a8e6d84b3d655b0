/*
 * `k3 run moe --tp N` and `--ep N` on the CPU backend: the ranks' shards are cut by the CLI from one full weights file (written
 * and quantized by `k3 quant` as in test_run_moe_file.c), reduced through the stage API (the latent block) or by
 * summing the experts' fp32 outputs, and the output must be the unsharded block's within the fp32 summation-order
 * budget: compared with an fp64 evaluation of the unsharded block written in the tests (tests/ref_moe.h) and with
 * the CLI's own unsharded output; routing identical. Also the splits the command must refuse.
 * Needs K3_BINARY_DIR (set by CMake for tests) to find the k3 binary.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, access */
#include "run_moe_files.h"

#define TOL 1e-3 /* the latent block's budget against fp64 (test_latent.c) */
#define GPU_TOL 1e-2 /* the CUDA block against the CPU backend (tests/k3t_harness.h, latent_moe) */

/* 1 when the last command's stderr contains s (no message otherwise). */
static int stderr_says(const char *s) {
    char p[128], buf[8192];
    path_of(p, sizeof p, "stderr.txt");
    FILE *f = fopen(p, "rb");
    if (!f) return 0;
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, s) != NULL;
}

/* The output tensor (and the routing) of a CLI output file, as doubles; 0 when it is not there. */
static int read_output(const char *name, int64_t cols, double *y, int32_t *ids) {
    k3_st_file *f = open_file(name);
    if (!f) return 0;
    const k3_st_tensor *t = k3_st_find(f, "output"), *ti = k3_st_find(f, "topk_ids");
    int ok = t && t->dtype == K3_ST_BF16 && t->nbytes == sizeof(uint16_t) * (size_t)(M * cols);
    if (ok)
        for (int64_t i = 0; i < M * cols; i++) y[i] = k3_bf16_to_f32(((const uint16_t *)t->data)[i]);
    if (ok && ids) {
        ok = ti && ti->nbytes == sizeof(int32_t) * M * K;
        if (ok) memcpy(ids, ti->data, ti->nbytes);
    }
    k3_st_close(f);
    return ok;
}

static void test_latent_tp(void) {
    k3_st_file *q = open_file("q_latent.safetensors");
    if (!q) return;
    k3_latent_moe_desc d;
    k3_latent_moe_desc_init(&d);
    d.hidden = d.router.hidden = H;
    d.router.num_experts = d.experts.num_experts = E;
    d.router.top_k = d.experts.top_k = K;
    d.experts.hidden = L, d.experts.inter = I, d.experts.format = K3_WEIGHT_NVFP4;
    d.shared_inter = IS, d.max_tokens = M;
    k3_latent_moe_weights w;
    memset(&w, 0, sizeof w);
    w.experts.w13 = data_of(q, "w13_weight"), w.experts.w13_scale = data_of(q, "w13_weight_scale");
    w.experts.w13_scale_2 = (const float *)data_of(q, "w13_weight_scale_2");
    w.experts.w2 = data_of(q, "w2_weight"), w.experts.w2_scale = data_of(q, "w2_weight_scale");
    w.experts.w2_scale_2 = (const float *)data_of(q, "w2_weight_scale_2");
    w.gate = data_of(q, "gate_weight"), w.bias = (const float *)data_of(q, "e_score_correction_bias");
    w.down_proj = data_of(q, "down_proj_weight"), w.norm = data_of(q, "norm_weight");
    w.up_proj = data_of(q, "up_proj_weight");
    w.shared_gate_up = data_of(q, "shared_gate_up_weight"), w.shared_down = data_of(q, "shared_down_weight");
    static double ref[M * H], y1[M * H], yn[M * H], rw[M * K];
    int32_t rids[M * K], ids1[M * K], idsn[M * K];
    ref_latent(&d, &w, M, xh, NULL, ref, rids, rw);
    const char *run = "%s run moe --top-k %d --weights %s/q_latent.safetensors --input %s/x_h.safetensors --output "
                      "%s/%s --tp %d";
    CHECK(sh(run, g_k3, K, g_dir, g_dir, g_dir, "y1.safetensors", 1) == 0 && read_output("y1.safetensors", H, y1, ids1),
          "latent block --tp 1");
    for (int n = 2; n <= 2; n++) { /* I = 32: --tp 4 would leave 8 columns, less than an NVFP4 block */
        char out[48];
        snprintf(out, sizeof out, "y%d.safetensors", n);
        const int ran = sh(run, g_k3, K, g_dir, g_dir, g_dir, out, n) == 0 && read_output(out, H, yn, idsn);
        CHECK(ran, "latent block --tp %d: exit 0 and an output", n);
        if (!ran) continue;
        const double e_ref = ref_rel_l2(yn, ref, M * H), e_one = ref_rel_l2(yn, y1, M * H);
        CHECK(!memcmp(idsn, rids, sizeof rids), "latent --tp %d: routing equal to the fp64 router", n);
        CHECK(!memcmp(idsn, ids1, sizeof rids), "latent --tp %d: routing equal to --tp 1", n);
        CHECK(e_ref <= TOL, "latent --tp %d: rel-L2 %.3g vs the fp64 unsharded block (budget %g)", n, e_ref, TOL);
        CHECK(e_one <= TOL, "latent --tp %d: rel-L2 %.3g vs the CLI's unsharded output (budget %g)", n, e_one, TOL);
        printf("  latent block --tp %d: rel-L2 %.2e vs fp64, %.2e vs --tp 1\n", n, e_ref, e_one);
    }
    /* the same block as EP ranks: whole experts each, the shared experts split */
    for (int n = 2; n <= 4; n *= 2) {
        char out[48], opt[48];
        snprintf(out, sizeof out, "ye%d.safetensors", n);
        snprintf(opt, sizeof opt, "--ep %d", n);
        const int ran = sh("%s run moe --top-k %d --weights %s/q_latent.safetensors --input %s/x_h.safetensors "
                           "--output %s/%s %s",
                           g_k3, K, g_dir, g_dir, g_dir, out, opt) == 0 &&
                        read_output(out, H, yn, idsn);
        CHECK(ran, "latent block --ep %d: exit 0 and an output", n);
        if (!ran) continue;
        const double e_ref = ref_rel_l2(yn, ref, M * H), e_one = ref_rel_l2(yn, y1, M * H);
        CHECK(!memcmp(idsn, rids, sizeof rids), "latent --ep %d: routing equal to the fp64 router", n);
        CHECK(e_ref <= TOL, "latent --ep %d: rel-L2 %.3g vs the fp64 unsharded block (budget %g)", n, e_ref, TOL);
        CHECK(e_one <= TOL, "latent --ep %d: rel-L2 %.3g vs the CLI's unsharded output (budget %g)", n, e_one, TOL);
        printf("  latent block --ep %d: rel-L2 %.2e vs fp64, %.2e vs --tp 1\n", n, e_ref, e_one);
    }
    /* the same splits on GPUs, one per rank, reduced by the library through NCCL: against fp64 and the CPU ranks
       (each skipped where this process sees fewer GPUs than ranks, or has no CUDA or NCCL) */
    static double yc[M * H];
    const char *gpu_opts[] = {"--tp 1", "--ep 1", "--tp 2", "--ep 2"}; /* 1: a one-rank communicator */
    for (int j = 0; j < 4; j++) {
        const char *opt = gpu_opts[j];
        const char *gpu = "%s run moe --top-k %d --weights %s/q_latent.safetensors --input %s/x_h.safetensors "
                          "--output %s/%s %s --device %s";
        const int cpu_ran = sh(gpu, g_k3, K, g_dir, g_dir, g_dir, "yc.safetensors", opt, "cpu") == 0 &&
                            read_output("yc.safetensors", H, yc, NULL);
        CHECK(cpu_ran, "latent block %s --device cpu: exit 0 and an output", opt);
        const int rc = sh(gpu, g_k3, K, g_dir, g_dir, g_dir, "yg.safetensors", opt, "cuda");
        if (rc == 1 && (stderr_says("this process sees") || stderr_says("no NCCL") || stderr_says("no CUDA") ||
                        stderr_says("cannot be opened"))) {
            printf("  SKIP latent block %s --device cuda: not enough GPUs, or no CUDA or NCCL here\n", opt);
            continue;
        }
        const int ran = rc == 0 && read_output("yg.safetensors", H, yn, idsn);
        CHECK(ran, "latent block %s --device cuda: exit 0 and an output (exit %d)", opt, rc);
        if (!ran || !cpu_ran) continue;
        const double e_ref = ref_rel_l2(yn, ref, M * H), e_cpu = ref_rel_l2(yn, yc, M * H);
        CHECK(!memcmp(idsn, ids1, sizeof rids), "latent %s on GPUs: routing equal to the CPU's", opt);
        CHECK(e_ref <= GPU_TOL, "latent %s on GPUs: rel-L2 %.3g vs fp64 (budget %g)", opt, e_ref, GPU_TOL);
        CHECK(e_cpu <= GPU_TOL, "latent %s on GPUs: rel-L2 %.3g vs the CPU ranks (budget %g)", opt, e_cpu, GPU_TOL);
        printf("  latent block %s on GPUs: rel-L2 %.2e vs fp64, %.2e vs the CPU ranks\n", opt, e_ref, e_cpu);
    }
    k3_st_close(q);
}

static void test_experts_tp(const char *file, k3_weight_format fmt) {
    k3_st_file *q = open_file(file);
    if (!q) return;
    k3_moe_desc d;
    k3_moe_desc_init(&d);
    d.num_experts = E, d.top_k = K, d.hidden = L, d.inter = I, d.format = fmt, d.max_tokens = M;
    k3_moe_weights w;
    memset(&w, 0, sizeof w);
    w.w13 = data_of(q, "w13_weight"), w.w13_scale = data_of(q, "w13_weight_scale");
    w.w13_scale_2 = (const float *)data_of(q, "w13_weight_scale_2");
    w.w2 = data_of(q, "w2_weight"), w.w2_scale = data_of(q, "w2_weight_scale");
    w.w2_scale_2 = (const float *)data_of(q, "w2_weight_scale_2");
    static double ref[M * L], y[M * L];
    ref_moe(&d, &w, M, xl, ids_in, wts_in, ref);
    for (int64_t i = 0; i < M * L; i++) ref[i] = ref_bf16(ref[i]);
    const char *opts[] = {"--tp 2", "--ep 2", "--ep 5"}; /* --ep 5: 16 experts as 3, 3, 3, 3, 4 */
    for (int j = 0; j < 3; j++) {
        const int ran = sh("%s run moe --weights %s/%s --input %s/x_ids.safetensors --output %s/ye.safetensors %s",
                           g_k3, g_dir, file, g_dir, g_dir, opts[j]) == 0 &&
                        read_output("ye.safetensors", L, y, NULL);
        CHECK(ran, "%s experts %s: exit 0 and an output", file, opts[j]);
        if (ran) {
            const double e = ref_rel_l2(y, ref, M * L);
            CHECK(e <= TOL, "%s experts %s: rel-L2 %.3g vs fp64 (budget %g)", file, opts[j], e, TOL);
            printf("  %s experts %s: rel-L2 %.2e vs fp64\n", file, opts[j], e);
        }
    }
    k3_st_close(q);
}

static void test_refusals(void) {
    const char *run = "%s run moe --weights %s/%s --input %s/%s --output %s/yr.safetensors %s";
    CHECK(sh(run, g_k3, g_dir, "q_mx.safetensors", g_dir, "x_ids.safetensors", g_dir, "--tp 2") == 1 &&
              stderr_has("multiple of 32"),
          "MXFP4 with I / 2 = 16: refused, naming the block size");
    CHECK(sh(run, g_k3, g_dir, "q_latent.safetensors", g_dir, "x_h.safetensors", g_dir, "--tp 4") == 1 &&
              stderr_has("multiple of 16"),
          "NVFP4 with I / 4 = 8: refused, naming the block size");
    CHECK(sh(run, g_k3, g_dir, "q_swz.safetensors", g_dir, "x_ids.safetensors", g_dir, "--tp 2") == 1 &&
              stderr_has("swizzled"),
          "swizzled scales: refused");
    CHECK(sh(run, g_k3, g_dir, "q_experts.safetensors", g_dir, "x_ids.safetensors", g_dir, "--tp 3") == 1 &&
              stderr_has("I = 32"),
          "--tp 3 with I = 32: refused");
    CHECK(sh(run, g_k3, g_dir, "q_experts.safetensors", g_dir, "x_ids.safetensors", g_dir, "--tp 0") == 2 &&
              stderr_has("1..64"),
          "--tp 0: usage error");
    CHECK(sh(run, g_k3, g_dir, "q_experts.safetensors", g_dir, "x_ids.safetensors", g_dir, "--tp 64 --device cuda") ==
                  1 &&
              stderr_has("needs 64 GPUs; this process sees "),
          "--tp 64 on CUDA: refused, naming the GPUs it needs and the GPUs there are");
    CHECK(sh(run, g_k3, g_dir, "q_experts.safetensors", g_dir, "x_ids.safetensors", g_dir, "--tp 2 --device auto") ==
                  2 &&
              stderr_has("not auto"),
          "--tp 2 --device auto: usage error");
    const int alone = sh(run, g_k3, g_dir, "q_experts.safetensors", g_dir, "x_ids.safetensors", g_dir,
                         "--tp 2 --device cuda");
    CHECK(alone == 1 && (stderr_says("needs 2 GPUs") || stderr_says("no NCCL") || stderr_says("cannot be opened") ||
                         stderr_has("the experts alone split N ways run with --device cpu")),
          "--tp 2 --device cuda on the experts alone: refused (exit %d)", alone);
    CHECK(sh(run, g_k3, g_dir, "q_experts.safetensors", g_dir, "x_ids.safetensors", g_dir, "--ep 17") == 1 &&
              stderr_has("more ranks than"),
          "--ep 17 with 16 experts: refused");
    CHECK(sh(run, g_k3, g_dir, "q_experts.safetensors", g_dir, "x_ids.safetensors", g_dir, "--ep 2 --tp 2") == 2 &&
              stderr_has("exclusive"),
          "--ep with --tp: usage error");
    char yr[128];
    path_of(yr, sizeof yr, "yr.safetensors");
    CHECK(access(yr, F_OK) != 0, "no output written by a refused run");
}

int main(void) {
    const int st = run_moe_files_setup();
    if (st) return st;
    test_latent_tp();
    test_experts_tp("q_experts.safetensors", K3_WEIGHT_NVFP4);
    test_experts_tp("bf16_experts.safetensors", K3_WEIGHT_BF16);
    test_refusals();
    run_moe_files_done();
    return k3t_finish();
}
