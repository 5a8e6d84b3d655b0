/* k3 plan --moe: the resolved routed-experts plan (m -> the CUDA launches k3_moe_run makes) for an architecture. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void plan_moe_help(void) {
    printf("usage: k3 plan --moe [--config tp8|ep16] [--experts E] [--top-k K] [--hidden L] [--inter I]\n"
           "                [--format nvfp4|mxfp4|bf16] [--scale-layout linear|swizzled] [--mode w4a16|w4a4]\n"
           "                [--act situ|silu|relu2] [--max-tokens M] [--force-off LIST] [--arch X.Y [--sm-count N]]\n"
           "                [--device cpu|cuda|auto] [--json]\n\n"
           "Creates the MoE plan exactly as k3_moe_plan_create does and prints, for every m, what a run of m\n"
           "tokens launches (k3_moe_plan_kernel): the GEMM1 and GEMM2 instances of the registry, their grids (a\n"
           "folded GEMM1 held to its grid's share of blocks per SM shows it: 16x24 <=3/SM), and whether the\n"
           "dispatch and combine kernels run. The choices are resolved once, at plan time, from the\n"
           "architecture's table (its moe rows) and the device's SM count.\n\n"
           "  --config C        tp8 (896 experts, top-k 16, L 3584, I 384; default) or ep16 (56, top-k 1, 3584,\n"
           "                    3072); the options below change single fields\n"
           "  --arch X.Y        simulate compute capability X.Y (no GPU needed); the SM count is --sm-count,\n"
           "                    else the sm_count key of the architecture's table\n"
           "  --force-off LIST  launch shapes turned off (k3_moe_desc.force_shape): fold,pair,tiles,early,balance\n"
           "  --max-tokens M    resolve m = 1..M (default 16)\n"
           "  --json            one JSON object on stdout\n");
}

static int parse_force(const char *s, int32_t *out) {
    *out = 0;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (!strcmp(tok, "fold")) *out |= K3_MOE_FORCE_NO_FOLD;
        else if (!strcmp(tok, "pair")) *out |= K3_MOE_FORCE_NO_PAIR;
        else if (!strcmp(tok, "tiles")) *out |= K3_MOE_FORCE_NO_TILES;
        else if (!strcmp(tok, "early")) *out |= K3_MOE_FORCE_NO_EARLY;
        else if (!strcmp(tok, "balance")) *out |= K3_MOE_FORCE_NO_BALANCE;
        else {
            fprintf(stderr, "k3 plan: --force-off takes fold, pair, tiles, early and balance (got '%s')\n", tok);
            return 0;
        }
    }
    return 1;
}

static int parse_word(const char *v, const char *what, const char *const *words, int n, int *out) {
    for (int i = 0; i < n; i++)
        if (!strcmp(v, words[i])) {
            *out = i;
            return 1;
        }
    fprintf(stderr, "k3 plan: %s: unknown value '%s'\n", what, v);
    return 0;
}

int k3_cmd_plan_moe(int argc, char **argv) {
    if (k3_cli_wants_help(argc, argv)) {
        plan_moe_help();
        return K3_EXIT_OK;
    }
    k3_moe_desc d;
    k3_moe_desc_init(&d);
    int json = 0;
    const char *arch = NULL, *device = "auto";
    int64_t sms = 0;
    static const char *const formats[] = {"bf16", "nvfp4", "mxfp4"};
    static const char *const layouts[] = {"linear", "swizzled"};
    static const char *const modes[] = {"w4a16", "w4a4"};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        int64_t v = 0;
        int w = 0;
        if (!strcmp(o, "--moe")) continue;
        if (!strcmp(o, "--json")) {
            json = 1;
            continue;
        }
        const char *val = k3_cli_value(argc, argv, &i, o);
        if (!val) return K3_EXIT_USAGE;
        if (!strcmp(o, "--config")) {
            if (!strcmp(val, "ep16")) d.num_experts = 56, d.top_k = 1, d.inter = 3072;
            else if (strcmp(val, "tp8")) {
                fprintf(stderr, "k3 plan: --config must be tp8 or ep16 (got '%s')\n", val);
                return K3_EXIT_USAGE;
            }
        } else if (!strcmp(o, "--experts") || !strcmp(o, "--top-k") || !strcmp(o, "--hidden") ||
                   !strcmp(o, "--inter") || !strcmp(o, "--max-tokens") || !strcmp(o, "--sm-count")) {
            if (!k3_cli_parse_i64(val, o, &v)) return K3_EXIT_USAGE;
            if (v < 0 || v > (INT64_C(1) << 30)) {
                fprintf(stderr, "k3 plan: %s is out of range (got %lld)\n", o, (long long)v);
                return K3_EXIT_USAGE;
            }
            if (!strcmp(o, "--experts")) d.num_experts = (int32_t)v;
            else if (!strcmp(o, "--top-k")) d.top_k = (int32_t)v;
            else if (!strcmp(o, "--hidden")) d.hidden = v;
            else if (!strcmp(o, "--inter")) d.inter = v;
            else if (!strcmp(o, "--max-tokens")) d.max_tokens = v;
            else sms = v;
        } else if (!strcmp(o, "--format")) {
            if (!parse_word(val, o, formats, 3, &w)) return K3_EXIT_USAGE;
            d.format = (k3_weight_format)w;
        } else if (!strcmp(o, "--scale-layout")) {
            if (!parse_word(val, o, layouts, 2, &w)) return K3_EXIT_USAGE;
            d.scale_layout = (k3_scale_layout)w;
        } else if (!strcmp(o, "--mode")) {
            if (!parse_word(val, o, modes, 2, &w)) return K3_EXIT_USAGE;
            d.mode = (k3_moe_mode)w;
        } else if (!strcmp(o, "--act")) {
            if (!strcmp(val, "situ")) k3_act_desc_k3(&d.act);
            else if (!strcmp(val, "silu")) k3_act_desc_init(&d.act, K3_ACT_SILU);
            else if (!strcmp(val, "relu2")) k3_act_desc_init(&d.act, K3_ACT_RELU2_NO_MUL);
            else {
                fprintf(stderr, "k3 plan: --act must be situ, silu or relu2 (got '%s')\n", val);
                return K3_EXIT_USAGE;
            }
        } else if (!strcmp(o, "--force-off")) {
            if (!parse_force(val, &d.force_shape)) return K3_EXIT_USAGE;
        } else if (!strcmp(o, "--arch")) {
            arch = val;
        } else if (!strcmp(o, "--device")) {
            if (!k3_cli_device_name_ok(val, "--device")) return K3_EXIT_USAGE;
            device = val;
        } else {
            fprintf(stderr, "k3 plan: unknown option '%s' (see k3 plan --moe --help)\n", o);
            return K3_EXIT_USAGE;
        }
    }
    if (sms && !arch) {
        fprintf(stderr, "k3 plan: --sm-count needs --arch (a real device reports its own)\n");
        return K3_EXIT_USAGE;
    }
    int usage = 0;
    k3_ctx *ctx = arch ? k3_cli_sim_ctx("k3 plan", arch, (int32_t)sms, &usage) : k3_cli_ctx(device);
    if (!ctx) return usage ? K3_EXIT_USAGE : K3_EXIT_FAIL;
    k3_moe_plan *plan = NULL;
    k3_status st = k3_moe_plan_create(ctx, &d, &plan);
    if (st != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 plan: %s: %s\n", k3_status_string(st), k3_ctx_last_error(ctx));
        k3_ctx_destroy(ctx);
        return K3_EXIT_FAIL;
    }
    k3_arch_info a;
    k3_ctx_arch(ctx, &a);
    if (json) {
        fputs("{\"device\": ", stdout);
        k3_cli_json_string(stdout, a.device_name);
        printf(", \"capability\": \"%d.%d\", \"simulated\": %s, \"sm_count\": %d, \"experts\": %d, "
               "\"top_k\": %d, \"hidden\": %lld, \"inter\": %lld, \"format\": \"%s\", \"scale_layout\": \"%s\", "
               "\"mode\": \"%s\", \"force_shape\": %d, \"m\": [",
               (int)a.cc_major, (int)a.cc_minor, a.simulated ? "true" : "false", (int)a.sm_count,
               (int)d.num_experts, (int)d.top_k, (long long)d.hidden, (long long)d.inter, formats[d.format],
               layouts[d.scale_layout], modes[d.mode], (int)d.force_shape);
    } else
        printf("device %s (capability %d.%d%s), E %d, top-k %d, L %lld, I %lld, %s %s scales, %s%s\n"
               "%-4s %-8s %-40s %-17s %-44s %-11s %s\n",
               a.device_name, (int)a.cc_major, (int)a.cc_minor, a.simulated ? ", simulated" : "", (int)d.num_experts,
               (int)d.top_k, (long long)d.hidden, (long long)d.inter, formats[d.format], layouts[d.scale_layout],
               modes[d.mode], d.force_shape ? " (shapes forced off)" : "", "m", "dispatch", "gemm1", "grid", "gemm2",
               "grid", "combine");
    if (!json && k3_ctx_backend(ctx) == K3_BACKEND_CPU && !a.simulated)
        printf("(a CPU context runs the reference loops; --arch X.Y shows what a GPU of that architecture launches)\n");
    int rc = K3_EXIT_OK;
    for (int64_t m = 1; m <= d.max_tokens; m++) {
        k3_moe_launch_info li;
        st = k3_moe_plan_kernel(plan, m, &li);
        if (st != K3_STATUS_SUCCESS) {
            fprintf(stderr, "k3 plan: m %lld: %s\n", (long long)m, k3_ctx_last_error(ctx));
            rc = K3_EXIT_FAIL;
            break;
        }
        char g1[32], g2[32];
        if (li.gemm1_blocks_per_sm > 0)
            snprintf(g1, sizeof g1, "%lldx%lld <=%d/SM", (long long)li.gemm1_grid[0], (long long)li.gemm1_grid[1],
                     (int)li.gemm1_blocks_per_sm);
        else
            snprintf(g1, sizeof g1, "%lldx%lld", (long long)li.gemm1_grid[0], (long long)li.gemm1_grid[1]);
        snprintf(g2, sizeof g2, "%lldx%lld", (long long)li.gemm2_grid[0], (long long)li.gemm2_grid[1]);
        if (json)
            printf("%s{\"m\": %lld, \"dispatch\": %d, \"gemm1\": \"%s\", \"gemm1_grid\": [%lld, %lld], \"gemm2\": "
                   "\"%s\", \"gemm2_grid\": [%lld, %lld], \"combine\": %d, \"token_tiles\": %d, \"tokens_per_unit\": "
                   "%d, \"fold\": %d, \"pair\": %d, \"early\": %d, \"early_blocks\": %lld, \"wide\": %d, \"dense\": "
                   "%d, \"direct\": %d, \"gemm2_split_k\": %d, \"gemm2_tiles\": %d, \"gemm1_blocks_per_sm\": %d}",
                   m > 1 ? ", " : "", (long long)m, li.dispatch, li.gemm1, (long long)li.gemm1_grid[0],
                   (long long)li.gemm1_grid[1], li.gemm2, (long long)li.gemm2_grid[0], (long long)li.gemm2_grid[1],
                   li.combine, li.token_tiles, li.tokens_per_unit, li.fold, li.pair, li.early,
                   (long long)li.early_blocks, li.wide, li.dense, li.direct, li.gemm2_split_k, li.gemm2_tiles,
                   (int)li.gemm1_blocks_per_sm);
        else if (!strcmp(li.gemm1, "cpu"))
            printf("%-4lld %-8s the CPU reference loops\n", (long long)m, "-");
        else
            printf("%-4lld %-8s %-40s %-17s %-44s %-11s %s\n", (long long)m, li.dispatch ? "yes" : "folded", li.gemm1,
                   g1, li.gemm2, g2, li.combine ? "yes" : "no");
    }
    if (json) printf("]}\n");
    k3_moe_plan_destroy(plan);
    k3_ctx_destroy(ctx);
    return rc;
}
