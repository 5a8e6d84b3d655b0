/* k3 plan --latent: what the CUDA latent-MoE block runs per token count on an architecture (its stream schedule
 * and whether the RMSNorm lets the up projection come up early), from the architecture's measured data. */
#include <string.h>

#include "block_bench.h"
#include "cli.h"
#include "plan/latent_tuning.h" /* internals: the per-m data, which a CPU plan (always SERIAL) cannot report */

static void plan_latent_help(void) {
    printf("usage: k3 plan --latent [--arch X.Y | --device cpu|cuda|auto] [--max-tokens M] [--json]\n\n"
           "Prints, per token count m, the stream schedule a CUDA latent-MoE plan with schedule AUTO runs\n"
           "(k3_latent_moe_plan_schedule_at: shared-beside, select-beside, ...) and whether its RMSNorm lets the\n"
           "up projection come up while it runs (a PDL trigger), as the architecture's data in\n"
           "src/plan/latent_tuning.c choose them. Every schedule gives the same bits; a CPU context runs the parts\n"
           "in one order, so there the table is what a GPU of the context's architecture would run.\n\n"
           "  --arch X.Y        simulate compute capability X.Y (no GPU needed): 9.0 -> the sm90 data, anything\n"
           "                    without measurements -> the defaults (shared-beside, no early up projection)\n"
           "  --device D        the context when --arch is not given (default auto)\n"
           "  --max-tokens M    resolve m = 1..M (1..32, default 16)\n"
           "  --json            one JSON object on stdout\n"
           "exit status: 0 success, 1 failure (no context), 2 usage error\n");
}

int k3_cmd_plan_latent(int argc, char **argv) {
    if (k3_cli_wants_help(argc, argv)) {
        plan_latent_help();
        return K3_EXIT_OK;
    }
    int json = 0;
    const char *arch = NULL, *device = "auto";
    int64_t max_m = 16;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--latent")) continue;
        if (!strcmp(o, "--json")) {
            json = 1;
            continue;
        }
        const char *val = k3_cli_value(argc, argv, &i, o);
        if (!val) return K3_EXIT_USAGE;
        if (!strcmp(o, "--arch")) arch = val;
        else if (!strcmp(o, "--device")) {
            if (!k3_cli_device_name_ok(val, "--device")) return K3_EXIT_USAGE;
            device = val;
        } else if (!strcmp(o, "--max-tokens")) {
            if (!k3_cli_parse_i64(val, o, &max_m)) return K3_EXIT_USAGE;
            if (max_m < 1 || max_m > K3_LATENT_TUNING_MAX_M) {
                fprintf(stderr, "k3 plan: --max-tokens must be in 1..%d (the CUDA block's limit; got %lld)\n",
                        K3_LATENT_TUNING_MAX_M, (long long)max_m);
                return K3_EXIT_USAGE;
            }
        } else {
            fprintf(stderr, "k3 plan: unknown option '%s' (see k3 plan --latent --help)\n", o);
            return K3_EXIT_USAGE;
        }
    }
    int usage = 0;
    k3_ctx *ctx = arch ? k3_cli_sim_ctx("k3 plan", arch, 0, &usage) : k3_cli_ctx(device);
    if (!ctx) return usage ? K3_EXIT_USAGE : K3_EXIT_FAIL;
    k3_arch_info a;
    k3_ctx_arch(ctx, &a);
    k3_latent_tuning t;
    k3_latent_tuning_for_table(a.table, &t);
    if (json) {
        fputs("{\"device\": ", stdout);
        k3_cli_json_string(stdout, a.device_name);
        printf(", \"capability\": \"%d.%d\", \"simulated\": %s, \"table\": \"%s\", \"m\": [", (int)a.cc_major,
               (int)a.cc_minor, a.simulated ? "true" : "false", k3_table_name(a.table));
    } else {
        printf("device %s (capability %d.%d%s), data of table %s%s\n%-4s %-14s %s\n", a.device_name, (int)a.cc_major,
               (int)a.cc_minor, a.simulated ? ", simulated" : "", k3_table_name(a.table),
               k3_ctx_backend(ctx) == K3_BACKEND_CPU ? " (what a CUDA plan runs; this CPU context runs SERIAL)" : "",
               "m", "schedule", "rmsnorm trigger");
    }
    for (int64_t m = 1; m <= max_m; m++) {
        const char *name = k3_bench_schedule_name(t.schedule[m]);
        if (json)
            printf("%s{\"m\": %lld, \"schedule\": \"%s\", \"rmsnorm_trigger\": %s}", m > 1 ? ", " : "", (long long)m,
                   name, t.norm_trigger[m] ? "true" : "false");
        else
            printf("%-4lld %-14s %s\n", (long long)m, name, t.norm_trigger[m] ? "yes" : "no");
    }
    if (json) printf("]}\n");
    k3_ctx_destroy(ctx);
    return K3_EXIT_OK;
}
