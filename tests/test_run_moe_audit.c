/* `k3 run moe` and `k3 quant` / `dequant` on the inputs an audit found mishandled: an output that is one of the
 * inputs, NaN / Inf / out-of-range scales and inputs, each refused with a message naming the tensor and element,
 * the files left as they were. Needs K3_BINARY_DIR (set by CMake for tests) to find the k3 binary. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, access */
#include "run_moe_files.h"

/* Audit regressions: the output never replaces an input, negative "unset" values are refused, NaN and Inf in
 * scales, routing weights and activations are named, and a non-finite output is an error, not a file. */
static void test_audit(void) {
    /* --output equal to --weights or --input: refused before anything is read, the file unchanged */
    sh("cp %s/q_experts.safetensors %s/keep_w.safetensors && cp %s/x_ids.safetensors %s/keep_x.safetensors", g_dir,
       g_dir, g_dir, g_dir);
    CHECK(sh("%s run moe --weights %s/keep_w.safetensors --input %s/keep_x.safetensors --output %s/keep_w.safetensors",
             g_k3, g_dir, g_dir, g_dir) == 2 &&
              stderr_has("is the --weights file") && same_bytes("keep_w.safetensors", "q_experts.safetensors"),
          "--output = --weights refused, weights unchanged");
    CHECK(sh("%s run moe --weights %s/keep_w.safetensors --input %s/keep_x.safetensors --output %s/./keep_x.safetensors",
             g_k3, g_dir, g_dir, g_dir) == 2 &&
              stderr_has("is the --input file") && same_bytes("keep_x.safetensors", "x_ids.safetensors"),
          "--output = --input by another path (same device and inode) refused, input unchanged");
    sh("ln -f %s/keep_w.safetensors %s/hardlink.safetensors", g_dir, g_dir);
    CHECK(sh("%s run moe --weights %s/keep_w.safetensors --input %s/keep_x.safetensors --output %s/hardlink.safetensors",
             g_k3, g_dir, g_dir, g_dir) == 2 &&
              stderr_has("is the --weights file") && same_bytes("keep_w.safetensors", "q_experts.safetensors"),
          "--output = a hard link of --weights refused");

    /* negative or zero betas and limits: usage errors, 0 only where it documents "no clamp" */
    const char *args = "--weights a --input b --output c";
    CHECK(sh("%s run moe --situ-linear-beta -3 %s", g_k3, args) == 2 &&
              stderr_has("--situ-linear-beta must be > 0, or 0 for no clamp (got -3)"),
          "--situ-linear-beta -3 refused");
    CHECK(sh("%s run moe --act silu --limit -5 %s", g_k3, args) == 2 &&
              stderr_has("--limit must be > 0, or 0 for no clamp (got -5)"),
          "--limit -5 refused");
    CHECK(sh("%s run moe --situ-beta -1 %s", g_k3, args) == 2 && stderr_has("--situ-beta must be > 0 (got -1)"),
          "--situ-beta -1 refused with a clear message");
    CHECK(sh("%s run moe --situ-beta 1e-45 %s", g_k3, args) == 2 && stderr_has("'1e-45' is too small") &&
              sh("grep -q 'not a finite' %s/stderr.txt", g_dir) == 1,
          "--situ-beta 1e-45 is called too small, not 'not a finite number'");
    CHECK(sh("%s run moe --situ-beta 1e39 %s", g_k3, args) == 2 && stderr_has("too large"), "1e39 too large");
    CHECK(sh("%s run moe --help | grep -q '0 = no clamp'", g_k3) == 0, "--help documents 0 = no clamp");
    char ypath[128];
    path_of(ypath, sizeof ypath, "y_audit.safetensors");
    const char *run = "%s run moe --weights %s/%s --input %s/%s --output %s";
    CHECK(sh(run, g_k3, g_dir, "q_experts.safetensors", g_dir, "x_ids.safetensors", ypath) == 0,
          "the unpatched files run (control)");
    CHECK(sh("%s run moe --situ-linear-beta 0 --weights %s/q_experts.safetensors --input %s/x_ids.safetensors "
             "--output %s",
             g_k3, g_dir, g_dir, ypath) == 0,
          "--situ-linear-beta 0 = no linear clamp is accepted");

    /* NaN / Inf on load, named by tensor and element */
    const float fnan = NAN, fbig = 3e38f;
    const unsigned char e4m3_nan = 0x7F, ue8m0_nan = 0xFF;
    const uint16_t bf_inf = 0x7F80;
    CHECK(copy_patched("q_experts.safetensors", "nan_s2.safetensors", "w13_weight_scale_2", 3 * sizeof(float),
                       &fnan, sizeof fnan),
          "write nan_s2");
    sh("rm -f %s", ypath);
    CHECK(sh(run, g_k3, g_dir, "nan_s2.safetensors", g_dir, "x_ids.safetensors", ypath) == 1 &&
              stderr_has("tensor 'w13_weight_scale_2' element [3] is NaN") && access(ypath, F_OK) != 0,
          "NaN in w13_weight_scale_2 named, no output");
    CHECK(copy_patched("q_experts.safetensors", "nan_bs.safetensors", "w2_weight_scale", 5, &e4m3_nan, 1),
          "write nan_bs");
    CHECK(sh(run, g_k3, g_dir, "nan_bs.safetensors", g_dir, "x_ids.safetensors", ypath) == 1 &&
              stderr_has("tensor 'w2_weight_scale' element [0, 2, 1]") /* [E, L, I/16] = [16, 64, 2] */ && stderr_has("E4M3 NaN code"),
          "E4M3 NaN code in a block scale named");
    CHECK(copy_patched("q_mx.safetensors", "nan_mx.safetensors", "w13_weight_scale", 2, &ue8m0_nan, 1),
          "write nan_mx");
    CHECK(sh(run, g_k3, g_dir, "nan_mx.safetensors", g_dir, "x_ids.safetensors", ypath) == 1 &&
              stderr_has("tensor 'w13_weight_scale' element [0, 1, 0]") /* [16, 64, 2] */ && stderr_has("UE8M0 NaN code"),
          "UE8M0 NaN code in a block scale named");
    CHECK(copy_patched("x_ids.safetensors", "nan_wts.safetensors", "topk_weights", 6 * sizeof(float), &fnan,
                       sizeof fnan),
          "write nan_wts");
    CHECK(sh(run, g_k3, g_dir, "q_experts.safetensors", g_dir, "nan_wts.safetensors", ypath) == 1 &&
              stderr_has("input: tensor 'topk_weights' element [1, 2] is NaN"),
          "NaN routing weight named");
    CHECK(copy_patched("x_ids.safetensors", "inf_x.safetensors", "hidden_states", 2 * (L + 1), &bf_inf,
                       sizeof bf_inf),
          "write inf_x");
    CHECK(sh(run, g_k3, g_dir, "q_experts.safetensors", g_dir, "inf_x.safetensors", ypath) == 1 &&
              stderr_has("input: tensor 'hidden_states' element [1, 1] is +Inf"),
          "Inf in hidden_states named");
    float big[E];
    for (int e = 0; e < E; e++) big[e] = fbig;
    CHECK(copy_patched("q_experts.safetensors", "big_s2.safetensors", "w2_weight_scale_2", 0, big, sizeof big),
          "write big_s2");
    CHECK(sh(run, g_k3, g_dir, "big_s2.safetensors", g_dir, "x_ids.safetensors", ypath) == 1 &&
              stderr_has("output element [") && stderr_has("not written") && access(ypath, F_OK) != 0,
          "an output that overflows to Inf/NaN is an error and is not written");
    const float fneg = -1.0f;
    CHECK(copy_patched("q_experts.safetensors", "neg_s2.safetensors", "w2_weight_scale_2", 0, &fneg, sizeof fneg),
          "write neg_s2");
    CHECK(sh(run, g_k3, g_dir, "neg_s2.safetensors", g_dir, "x_ids.safetensors", ypath) == 1 &&
              stderr_has("tensor 'w2_weight_scale_2' element [0] is -1: not positive"),
          "a negative scale_2 named");
}

/* Expert ids in a file: -1 (an expert on another rank) drops its slot, exactly as a zero routing weight would;
 * any other id outside [0, E) is refused, naming token and slot. */
static void test_ids(void) {
    char ypath[128];
    path_of(ypath, sizeof ypath, "y_ids.safetensors");
    const char *run = "%s run moe --weights %s/q_experts.safetensors --input %s/%s --output %s/%s";
    const int32_t at_e = E, below = -2, none = -1;
    const float zero = 0.0f;
    const size_t slot = (size_t)(2 * K + 1); /* token 2, slot 1 */
    CHECK(copy_patched("x_ids.safetensors", "ids_e.safetensors", "topk_ids", slot * 4, &at_e, 4), "write ids_e");
    sh("rm -f %s", ypath);
    CHECK(sh(run, g_k3, g_dir, g_dir, "ids_e.safetensors", g_dir, "y_ids.safetensors") == 1 &&
              stderr_has("input: topk_ids[token 2][slot 1] = 16 is out of range: an id is -1 (not on this rank) or "
                         "in [0, 16)") &&
              access(ypath, F_OK) != 0,
          "an id = E is refused, naming token and slot, no output");
    CHECK(copy_patched("x_ids.safetensors", "ids_m2.safetensors", "topk_ids", slot * 4, &below, 4), "write ids_m2");
    CHECK(sh(run, g_k3, g_dir, g_dir, "ids_m2.safetensors", g_dir, "y_ids.safetensors") == 1 &&
              stderr_has("topk_ids[token 2][slot 1] = -2 is out of range"),
          "an id of -2 is refused");
    CHECK(copy_patched("x_ids.safetensors", "ids_m1.safetensors", "topk_ids", slot * 4, &none, 4), "write ids_m1");
    CHECK(copy_patched("x_ids.safetensors", "wts_0.safetensors", "topk_weights", slot * 4, &zero, 4), "write wts_0");
    CHECK(sh(run, g_k3, g_dir, g_dir, "ids_m1.safetensors", g_dir, "y_m1.safetensors") == 0, "an id of -1 runs");
    CHECK(sh(run, g_k3, g_dir, g_dir, "wts_0.safetensors", g_dir, "y_w0.safetensors") == 0 &&
              sh(run, g_k3, g_dir, g_dir, "x_ids.safetensors", g_dir, "y_all.safetensors") == 0,
          "the zero-weight and the unpatched inputs run");
    CHECK(same_bytes("y_m1.safetensors", "y_w0.safetensors"), "id -1 gives the output of a zero weight in that slot");
    CHECK(!same_bytes("y_m1.safetensors", "y_all.safetensors"), "and the slot mattered (the control differs)");
}

int main(void) {
    const int st = run_moe_files_setup();
    if (st) return st;
    test_audit();
    test_ids();
    run_moe_files_done();
    return k3t_finish();
}
