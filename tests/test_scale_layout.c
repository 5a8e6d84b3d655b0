/*
 * No guessing of the block-scale layout: experts whose 3-D scale shapes fit both the linear and the 128x4-swizzled
 * layout (2I and L multiples of 128, the scale columns of 4, as every real K3 shape) in a file that does not
 * record its layout are refused by `k3 run moe` (file and --layer), `k3 dequant` and `k3 convert` with a message
 * that says so; --scale-layout decides, and must agree with the file's metadata when both are there. A swizzled
 * file kept in the 3-D shape (as engines keep it) run with --scale-layout swizzled gives the bits of the same
 * scales in k3's 2-D swizzled form; linear gives the bits of the file that records linear.
 * Needs K3_BINARY_DIR (set by CMake for tests) to find the k3 binary.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, access */
#include "run_moe_files.h"

#define EA 2
#define LA 128
#define IA 64
#define MA 3
#define KA 2

static float w13a[EA * 2 * IA * LA], w2a[EA * LA * IA];
static uint16_t xa[MA * LA];
static int32_t idsa[MA * KA];
static float wtsa[MA * KA];

/* A copy of `src` with no __metadata__, its two expert scale tensors given the 3-D shapes shapes3 (their bytes
 * unchanged), or left as they are when shapes3 is NULL. */
static int rewrite(const char *src, const char *dst, const int64_t (*shapes3)[3]) {
    k3_st_file *f = open_file(src);
    if (!f) return 0;
    k3_st_writer *w = NULL;
    char err[256], path[256];
    int ok = k3_st_writer_create(&w) == K3_STATUS_SUCCESS;
    for (int32_t i = 0; ok && i < k3_st_count(f); i++) {
        const k3_st_tensor *t = k3_st_at(f, i);
        const int scale = !strcmp(t->name, "w13_weight_scale") ? 0 : !strcmp(t->name, "w2_weight_scale") ? 1 : -1;
        if (shapes3 && scale >= 0)
            ok = k3_st_writer_add(w, t->name, t->dtype, 3, shapes3[scale], t->data, err, sizeof err) == K3_STATUS_SUCCESS;
        else
            ok = k3_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, err, sizeof err) == K3_STATUS_SUCCESS;
    }
    path_of(path, sizeof path, dst);
    ok = ok && k3_st_writer_save(w, path, err, sizeof err) == K3_STATUS_SUCCESS;
    if (!ok) printf("rewrite %s -> %s: %s\n", src, dst, err);
    k3_st_writer_destroy(w);
    k3_st_close(f);
    return ok;
}

static int run(const char *weights, const char *out, const char *extra) {
    return sh("%s run moe --weights %s/%s --input %s/xa.safetensors --output %s/%s %s", g_k3, g_dir, weights, g_dir,
              g_dir, out, extra);
}

int main(void) {
    const char *bin = getenv("K3_BINARY_DIR");
    if (!bin) {
        printf("SKIPPED: K3_BINARY_DIR is not set (run through ctest)\n");
        return 77;
    }
    snprintf(g_k3, sizeof g_k3, "%s/k3", bin);
    snprintf(g_dir, sizeof g_dir, "/tmp/k3_layout_XXXXXX");
    if (access(g_k3, X_OK) != 0 || !mkdtemp(g_dir)) {
        printf("no k3 binary at %s or no temporary folder\n", g_k3);
        return 1;
    }
    k3t_rng r = {0x4c61796f7574ull};
    for (int i = 0; i < EA * 2 * IA * LA; i++) w13a[i] = (float)(k3t_normal(&r) / sqrt((double)LA));
    for (int i = 0; i < EA * LA * IA; i++) w2a[i] = (float)(k3t_normal(&r) / sqrt((double)IA));
    for (int i = 0; i < MA * LA; i++) xa[i] = k3_bf16_from_f32((float)k3t_normal(&r));
    for (int i = 0; i < MA * KA; i++) idsa[i] = i % EA, wtsa[i] = 0.5f;
    const tensor_spec src[] = {{"w13_weight", K3_ST_F32, 3, {EA, 2 * IA, LA}, w13a},
                               {"w2_weight", K3_ST_F32, 3, {EA, LA, IA}, w2a}};
    const tensor_spec xs[] = {{"hidden_states", K3_ST_BF16, 2, {MA, LA, 0}, xa},
                              {"topk_ids", K3_ST_I32, 2, {MA, KA, 0}, idsa},
                              {"topk_weights", K3_ST_F32, 2, {MA, KA, 0}, wtsa}};
    CHECK(write_file("src.safetensors", src, 2) && write_file("xa.safetensors", xs, 3), "source files");
    CHECK(sh("%s quant nvfp4 --input %s/src.safetensors --output %s/lin.safetensors", g_k3, g_dir, g_dir) == 0 &&
              sh("%s quant nvfp4 --scale-layout swizzled --input %s/src.safetensors --output %s/swz.safetensors", g_k3,
                 g_dir, g_dir) == 0,
          "k3 quant nvfp4, linear and swizzled");
    /* the scale shapes: 2I = 128 rows x L/16 = 8 columns, L = 128 rows x I/16 = 4 columns: both layouts' shape */
    const int64_t shapes3[2][3] = {{EA, 2 * IA, LA / 16}, {EA, LA, IA / 16}};
    CHECK(rewrite("lin.safetensors", "lin_bare.safetensors", NULL), "linear file without metadata");
    CHECK(rewrite("swz.safetensors", "swz3d_bare.safetensors", shapes3), "swizzled bytes in the 3-D shape, no metadata");

    CHECK(run("lin.safetensors", "y_lin.safetensors", "") == 0, "the file that records linear runs");
    CHECK(run("swz.safetensors", "y_swz.safetensors", "") == 0, "k3's 2-D swizzled file runs");
    CHECK(run("lin_bare.safetensors", "y.safetensors", "") == 1 && stderr_has("does not say which") &&
              stderr_has("--scale-layout"),
          "k3 run moe: an ambiguous file without metadata is refused, naming the option");
    char y[256];
    path_of(y, sizeof y, "y.safetensors");
    CHECK(access(y, F_OK) != 0, "k3 run moe: no output left by the refusal");
    CHECK(run("lin_bare.safetensors", "y_lin2.safetensors", "--scale-layout linear") == 0 &&
              same_bytes("y_lin.safetensors", "y_lin2.safetensors"),
          "--scale-layout linear: the bits of the file that records linear");
    CHECK(run("swz3d_bare.safetensors", "y_swz2.safetensors", "--scale-layout swizzled") == 0 &&
              same_bytes("y_swz.safetensors", "y_swz2.safetensors"),
          "3-D swizzled scales with --scale-layout swizzled: the bits of k3's 2-D swizzled file");
    CHECK(run("lin.safetensors", "y.safetensors", "--scale-layout swizzled") == 1 && stderr_has("--scale-layout says"),
          "--scale-layout against the file's metadata: refused");
    CHECK(run("lin_bare.safetensors", "y.safetensors", "--scale-layout diagonal") == 2, "--scale-layout diagonal: usage");

    /* the checkpoint reader (--layer) and k3 convert */
    CHECK(run("lin_bare.safetensors", "y.safetensors", "--layer 0") == 1 && stderr_has("does not say which"),
          "k3 run moe --layer: refused without the layout");
    CHECK(run("lin_bare.safetensors", "y_l0.safetensors", "--layer 0 --scale-layout linear") == 0 &&
              same_bytes("y_lin.safetensors", "y_l0.safetensors"),
          "k3 run moe --layer --scale-layout linear: the same bits");
    CHECK(run("swz3d_bare.safetensors", "y.safetensors", "--layer 0 --scale-layout swizzled") == 1 &&
              stderr_has("does not take"),
          "k3 run moe --layer with swizzled: unsupported, said");
    CHECK(sh("%s convert --input %s/lin_bare.safetensors --layer 0 --output %s/c.safetensors", g_k3, g_dir, g_dir) ==
                  1 &&
              stderr_has("does not say which"),
          "k3 convert: refused without the layout");
    CHECK(sh("%s convert --input %s/lin_bare.safetensors --layer 0 --output %s/c.safetensors --scale-layout linear",
             g_k3, g_dir, g_dir) == 0 &&
              run("c.safetensors", "y_c.safetensors", "") == 0 && same_bytes("y_lin.safetensors", "y_c.safetensors"),
          "k3 convert --scale-layout linear, then k3 run moe: the same bits");

    /* k3 dequant */
    CHECK(sh("%s dequant --input %s/lin_bare.safetensors --output %s/d.safetensors", g_k3, g_dir, g_dir) == 1 &&
              stderr_has("does not say which"),
          "k3 dequant: refused without the layout");
    CHECK(sh("%s dequant --input %s/lin.safetensors --output %s/d_lin.safetensors", g_k3, g_dir, g_dir) == 0 &&
              sh("%s dequant --scale-layout linear --input %s/lin_bare.safetensors --output %s/d_lin2.safetensors",
                 g_k3, g_dir, g_dir) == 0 &&
              same_bytes("d_lin.safetensors", "d_lin2.safetensors"),
          "k3 dequant --scale-layout linear: the bytes of the file that records linear");
    CHECK(sh("%s dequant --input %s/swz.safetensors --output %s/d_swz.safetensors", g_k3, g_dir, g_dir) == 0 &&
              sh("%s dequant --scale-layout swizzled --input %s/swz3d_bare.safetensors --output %s/d_swz2.safetensors",
                 g_k3, g_dir, g_dir) == 0 &&
              same_bytes("d_swz.safetensors", "d_swz2.safetensors"),
          "k3 dequant of 3-D swizzled scales with --scale-layout swizzled: the bytes of k3's 2-D swizzled file");
    if (!getenv("K3_TEST_KEEP_FILES")) sh("rm -rf %s", g_dir);
    return k3t_finish();
}
