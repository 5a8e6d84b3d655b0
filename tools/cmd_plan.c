/* k3 plan: the resolved GEMM plan (shape, M -> kernel + configuration) for an architecture. */
#include <string.h>

#include "cli.h"
#include "gemm_shapes.h"
#include "plan/linear_plan.h" /* internals: the table and each M's resolved choice, which the API does not list */

static void plan_help(void) {
    printf("usage: k3 plan [--arch X.Y] [--json] [--table FILE [--force]] [--shapes SET] [--max-m M] [--configs]\n\n"
           "Resolves the BF16 GEMM plan of every shape of the table plus the K3 shape set exactly as\n"
           "k3_linear_plan_create does, and prints M -> kernel + configuration per shape. Unlisted (N, K) or\n"
           "M use the cuBLASLt fallback (marked [not in table]).\n\n"
           "  --arch X.Y     simulate compute capability X.Y (no GPU needed): 9.0 -> sm90 table,\n"
           "                 10.0 -> sm100, 10.3 and 10.7 -> sm103, anything else -> no table\n"
           "  --device D     cpu, cuda or auto (default auto) when --arch is not given\n"
           "  --table FILE   load this table file (k3_ctx_load_table) instead of the embedded one\n"
           "  --force        load --table even when its device key does not match\n"
           "  --shapes SET   tp8, all (default: all, plus every shape of the table), N,K[,N,K...] or a file\n"
           "  --max-m M      the largest token count to resolve (1..32, default 16)\n"
           "  --configs      list the compiled kernel configurations (the registry) instead\n"
           "  --json         one JSON object on stdout\n"
           "  --moe          the routed-experts plan instead (k3 plan --moe --help)\n"
           "  --latent       the latent-MoE block's per-m schedule instead (k3 plan --latent --help)\n");
}

static void print_configs(int json) {
    int32_t count = 0;
    const k3_gemm_config *all = k3_gemm_configs(&count);
    if (json) printf("{\"configs\": [");
    else printf("%-7s %-20s %7s %5s %6s %6s %5s %7s %8s %5s\n", "kernel", "config", "threads", "rows", "unroll",
                "ksplit", "max_m", "k_align", "static_k", "max_k");
    for (int32_t i = 0; i < count; i++) {
        const k3_gemm_config *c = &all[i];
        const char *kern = c->kernel == K3_KERNEL_SKINNY ? "skinny" : "mma";
        if (json)
            printf("%s{\"kernel\": \"%s\", \"config\": \"%s\", \"threads\": %d, \"rows_per_block\": %d, "
                   "\"k_unroll\": %d, \"k_split\": %d, \"max_m\": %d, \"k_align\": %d, \"static_k\": %d, "
                   "\"max_k\": %d}",
                   i ? ", " : "", kern, c->name, (int)c->threads, (int)c->rows_per_block, (int)c->k_unroll,
                   (int)c->k_split, (int)c->max_m, (int)c->k_align, (int)c->static_k, (int)c->max_k);
        else
            printf("%-7s %-20s %7d %5d %6d %6d %5d %7d %8d %5d\n", kern, c->name, (int)c->threads,
                   (int)c->rows_per_block, (int)c->k_unroll, (int)c->k_split, (int)c->max_m, (int)c->k_align,
                   (int)c->static_k, (int)c->max_k);
    }
    if (json) printf("]}\n");
}

static const char *source_word(k3_choice_source s) {
    switch (s) {
    case K3_CHOICE_TABLE: return "table";
    case K3_CHOICE_UNLISTED: return "not in table";
    case K3_CHOICE_FORCED: return "forced";
    case K3_CHOICE_DEMOTED: return "demoted";
    }
    return "?";
}

static int same_choice(const k3_table_choice *a, k3_choice_source sa, const k3_table_choice *b, k3_choice_source sb) {
    return sa == sb && a->kernel == b->kernel && a->cfg == b->cfg && a->algo == b->algo;
}

/* Prints one shape's resolved plan; returns 0 on success. */
static int print_shape(k3_ctx *ctx, k3_shape s, int64_t max_m, int json, int first) {
    k3_linear_desc d;
    k3_linear_desc_init(&d, s.n, s.k);
    d.max_m = max_m;
    k3_linear_plan *plan = NULL;
    k3_status st = k3_linear_plan_create(ctx, &d, &plan);
    if (st != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 plan: %lld x %lld: %s: %s\n", (long long)s.n, (long long)s.k, k3_status_string(st),
                k3_ctx_last_error(ctx));
        return 1;
    }
    if (json) printf("%s{\"n\": %lld, \"k\": %lld, \"m\": [", first ? "" : ", ", (long long)s.n, (long long)s.k);
    int items = 0;
    for (int64_t m = 1; m <= max_m;) {
        k3_choice_source src;
        const k3_table_choice *c = k3_linear_plan_choice(plan, m, &src);
        int64_t hi = m;
        for (;;) {
            k3_choice_source s2;
            const k3_table_choice *c2 = hi + 1 <= max_m ? k3_linear_plan_choice(plan, hi + 1, &s2) : NULL;
            if (!c2 || !same_choice(c, src, c2, s2)) break;
            hi++;
        }
        char what[96], range[48];
        k3_table_choice_string(*c, what, sizeof what);
        if (hi == m) snprintf(range, sizeof range, "%lld", (long long)m);
        else snprintf(range, sizeof range, "%lld-%lld", (long long)m, (long long)hi);
        if (json) {
            const char *kern = c->kernel == K3_KERNEL_SKINNY ? "skinny" : c->kernel == K3_KERNEL_MMA ? "mma" : "cublaslt";
            char cfg[32];
            if (c->cfg) snprintf(cfg, sizeof cfg, "%s", c->cfg->name);
            else snprintf(cfg, sizeof cfg, "h%d", (int)c->algo);
            printf("%s{\"lo\": %lld, \"hi\": %lld, \"kernel\": \"%s\", \"config\": \"%s\", \"source\": \"%s\"}",
                   items ? ", " : "", (long long)m, (long long)hi, kern, cfg, source_word(src));
        } else {
            char shape[48];
            snprintf(shape, sizeof shape, "%lld x %lld", (long long)s.n, (long long)s.k);
            printf("%-16s %-7s %s%s%s%s\n", items ? "" : shape, range, what, src == K3_CHOICE_TABLE ? "" : " [",
                   src == K3_CHOICE_TABLE ? "" : source_word(src), src == K3_CHOICE_TABLE ? "" : "]");
        }
        items++;
        m = hi + 1;
    }
    if (json) printf("]}");
    k3_linear_plan_destroy(plan);
    return 0;
}

int k3_cmd_plan(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--moe")) return k3_cmd_plan_moe(argc, argv);
        else if (!strcmp(argv[i], "--latent")) return k3_cmd_plan_latent(argc, argv);
    int json = 0, force = 0, configs = 0;
    const char *arch = NULL, *device = "auto", *table = NULL, *shapes_arg = NULL;
    int64_t max_m = 16;
    if (k3_cli_wants_help(argc, argv)) {
        plan_help();
        return K3_EXIT_OK;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--force")) force = 1;
        else if (!strcmp(argv[i], "--configs")) configs = 1;
        else if (!strcmp(argv[i], "--arch")) {
            if (!(arch = k3_cli_value(argc, argv, &i, "--arch"))) return K3_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--device")) {
            if (!(device = k3_cli_value(argc, argv, &i, "--device")) || !k3_cli_device_name_ok(device, "--device"))
                return K3_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--table")) {
            if (!(table = k3_cli_value(argc, argv, &i, "--table"))) return K3_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--shapes")) {
            if (!(shapes_arg = k3_cli_value(argc, argv, &i, "--shapes"))) return K3_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--max-m")) {
            const char *v = k3_cli_value(argc, argv, &i, "--max-m");
            if (!v || !k3_cli_parse_i64(v, "--max-m", &max_m)) return K3_EXIT_USAGE;
            if (max_m < 1 || max_m > K3_LINEAR_MAX_M) {
                fprintf(stderr, "k3 plan: --max-m must be 1..%d\n", K3_LINEAR_MAX_M);
                return K3_EXIT_USAGE;
            }
        } else {
            fprintf(stderr, "k3 plan: unknown option '%s' (see k3 plan --help)\n", argv[i]);
            return K3_EXIT_USAGE;
        }
    }
    if (configs) {
        print_configs(json);
        return K3_EXIT_OK;
    }

    k3_ctx *ctx = NULL;
    if (arch) {
        int usage = 0;
        if (!(ctx = k3_cli_sim_ctx("k3 plan", arch, 0, &usage))) return usage ? K3_EXIT_USAGE : K3_EXIT_FAIL;
    } else if (!(ctx = k3_cli_ctx(device))) {
        return K3_EXIT_FAIL;
    }
    int rc = K3_EXIT_OK;
    if (table) {
        k3_status st = k3_ctx_load_table(ctx, table, force);
        if (st != K3_STATUS_SUCCESS) {
            fprintf(stderr, "k3 plan: %s: %s\n", k3_status_string(st), k3_ctx_last_error(ctx));
            k3_ctx_destroy(ctx);
            return K3_EXIT_FAIL;
        }
    }
    const k3_table *t = NULL;
    k3_status st = k3_linear_ctx_table(ctx, &t);
    if (st != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 plan: %s: %s\n", k3_status_string(st), k3_ctx_last_error(ctx));
        k3_ctx_destroy(ctx);
        return K3_EXIT_FAIL;
    }
    static k3_shape shapes[K3_SHAPES_MAX];
    int n_shapes = 0;
    if (shapes_arg) {
        n_shapes = k3_shapes_parse(shapes_arg, "all", 1, shapes, K3_SHAPES_MAX);
        if (!n_shapes) {
            k3_ctx_destroy(ctx);
            return K3_EXIT_USAGE;
        }
    } else {
        for (int32_t i = 0; t && i < t->n_rows && n_shapes < K3_SHAPES_MAX; i++)
            shapes[n_shapes++] = (k3_shape){t->rows[i].n, t->rows[i].k};
        k3_shape k3set[K3_SHAPES_MAX];
        int n_k3 = k3_shapes_parse("all", "all", 0, k3set, K3_SHAPES_MAX);
        for (int i = 0; i < n_k3 && n_shapes < K3_SHAPES_MAX; i++) {
            int dup = 0;
            for (int j = 0; j < n_shapes; j++) dup |= shapes[j].n == k3set[i].n && shapes[j].k == k3set[i].k;
            if (!dup) shapes[n_shapes++] = k3set[i];
        }
    }

    k3_arch_info a;
    k3_ctx_arch(ctx, &a);
    const char *tname = t ? t->source : "none";
    if (json) {
        printf("{\"device\": ");
        k3_cli_json_string(stdout, a.device_name);
        printf(", \"capability\": \"%d.%d\", \"simulated\": %s, \"backend\": \"%s\", \"table\": ", (int)a.cc_major,
               (int)a.cc_minor, a.simulated ? "true" : "false",
               k3_ctx_backend(ctx) == K3_BACKEND_CUDA ? "cuda" : "cpu");
        k3_cli_json_string(stdout, tname);
        if (t) {
            printf(", \"key\": {\"arch\": ");
            k3_cli_json_string(stdout, t->key.arch);
            printf(", \"gpu\": ");
            k3_cli_json_string(stdout, t->key.gpu);
            printf(", \"sm_count\": %d, \"capability\": \"%d.%d\", \"driver\": %d, \"runtime\": %d, \"library\": ",
                   (int)t->key.sm_count, (int)t->key.cc_major, (int)t->key.cc_minor, (int)t->key.driver,
                   (int)t->key.runtime);
            k3_cli_json_string(stdout, t->key.library);
            printf(", \"date\": ");
            k3_cli_json_string(stdout, t->key.date);
            printf(", \"note\": ");
            k3_cli_json_string(stdout, t->key.note);
            printf("}");
        }
        printf(", \"max_m\": %lld, \"fallback\": \"cublaslt\", \"shapes\": [", (long long)max_m);
    } else {
        printf("device %s (capability %d.%d%s), table %s\n", a.device_name, (int)a.cc_major, (int)a.cc_minor,
               a.simulated ? ", simulated" : "", tname);
        if (t && t->key.gpu[0])
            printf("table key: gpu '%s', sm_count %d, capability %d.%d, driver %d, runtime %d, library '%s', "
                   "date '%s'\n",
                   t->key.gpu, (int)t->key.sm_count, (int)t->key.cc_major, (int)t->key.cc_minor, (int)t->key.driver,
                   (int)t->key.runtime, t->key.library, t->key.date);
        else if (t)
            printf("table key: architecture %s only (no device measured)\n", t->key.arch);
        if (t && t->key.note[0]) printf("note: %s\n", t->key.note);
        if (!t) printf("no table for this architecture: every shape uses the cuBLASLt fallback\n");
        if (k3_ctx_backend(ctx) == K3_BACKEND_CPU)
            printf("(a CPU context runs the reference loop; shown is what a GPU of this architecture would run)\n");
        printf("%-16s %-7s %s\n", "N x K", "M", "kernel config");
    }
    for (int i = 0; i < n_shapes; i++)
        if (print_shape(ctx, shapes[i], max_m, json, i == 0)) rc = K3_EXIT_FAIL;
    if (json) printf("]}\n");
    k3_ctx_destroy(ctx);
    return rc;
}
