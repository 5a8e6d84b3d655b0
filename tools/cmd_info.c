/* k3 info: the backend, the device and every architecture fact the library decides on. */
#include <string.h>

#include "cli.h"

static void info_help(void) {
    printf("usage: k3 info [--json] [--arch MAJOR.MINOR] [--device cpu|cuda|auto]\n\n"
           "Prints the backend, device name, compute capability and the facts the library decides on:\n"
           "mixed-precision bf16 FMA (SM100+), native FP4 MMA (SM100+), which projection table applies\n"
           "(SM90 -> sm90, SM100 -> sm100, SM103 and SM107 -> sm103, else none).\n\n"
           "  --arch X.Y   simulate compute capability X.Y (X 1..99, Y 0..9) instead of reading a device\n"
           "  --json       one JSON object on stdout\n"
           "  --device D   cpu, cuda or auto (default auto: CUDA when a GPU is present)\n");
}

static const char *yes_no(int32_t v) { return v ? "yes" : "no"; }
static const char *json_bool(int32_t v) { return v ? "true" : "false"; }

int k3_cmd_info(int argc, char **argv) {
    int json = 0;
    const char *arch = NULL, *device = "auto";
    if (k3_cli_wants_help(argc, argv)) {
        info_help();
        return K3_EXIT_OK;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--arch")) {
            if (!(arch = k3_cli_value(argc, argv, &i, "--arch"))) return K3_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--device")) {
            if (!(device = k3_cli_value(argc, argv, &i, "--device")) || !k3_cli_device_name_ok(device, "--device"))
                return K3_EXIT_USAGE;
        } else {
            fprintf(stderr, "k3 info: unknown option '%s' (see k3 info --help)\n", argv[i]);
            return K3_EXIT_USAGE;
        }
    }
    k3_arch_info a;
    const char *backend;
    if (arch) {
        int major = 0, minor = 0;
        char tail = 0;
        if (sscanf(arch, "%d.%d%c", &major, &minor, &tail) != 2 ||
            k3_arch_from_capability(major, minor, &a) != K3_STATUS_SUCCESS) {
            fprintf(stderr,
                    "k3 info: --arch wants MAJOR.MINOR with MAJOR 1..99 and MINOR 0..9, such as 9.0 or 10.3 "
                    "(got '%s')\n",
                    arch);
            return K3_EXIT_USAGE;
        }
        backend = "simulated";
    } else {
        k3_ctx *ctx = k3_cli_ctx(device);
        if (!ctx) return K3_EXIT_FAIL;
        k3_ctx_arch(ctx, &a);
        backend = k3_ctx_backend(ctx) == K3_BACKEND_CUDA ? "cuda" : "cpu";
        k3_ctx_destroy(ctx);
    }
    if (json) {
        printf("{\"version\": \"%s\", \"backend\": \"%s\", \"device\": ", k3_version(), backend);
        k3_cli_json_string(stdout, a.device_name);
        printf(", \"capability\": \"%d.%d\", "
               "\"sm_version\": %d, \"simulated\": %s, \"mixed_precision_bf16_fma\": %s, \"fp4_mma\": %s, "
               "\"table\": \"%s\", \"cuda_backend_usable\": %s, \"sm_count\": %d, \"l2_bytes\": %lld, "
               "\"driver_version\": %d, \"runtime_version\": %d}\n",
               (int)a.cc_major, (int)a.cc_minor, (int)a.sm_version,
               json_bool(a.simulated), json_bool(a.has_mixed_bf16_fma), json_bool(a.has_fp4_mma),
               k3_table_name(a.table), json_bool(a.cuda_backend_usable), (int)a.sm_count, (long long)a.l2_bytes,
               (int)a.driver_version, (int)a.runtime_version);
        return K3_EXIT_OK;
    }
    printf("k3kernels %s\n", k3_version());
    printf("backend                   %s\n", backend);
    printf("device                    %s\n", a.device_name);
    printf("compute capability        %d.%d (sm_%d)%s\n", (int)a.cc_major, (int)a.cc_minor, (int)a.sm_version,
           a.simulated ? " [simulated]" : "");
    printf("mixed-precision bf16 FMA  %s\n", yes_no(a.has_mixed_bf16_fma));
    printf("native FP4 MMA            %s\n", yes_no(a.has_fp4_mma));
    printf("projection table          %s\n", k3_table_name(a.table));
    printf("CUDA kernels usable       %s\n", yes_no(a.cuda_backend_usable));
    if (a.sm_count) {
        printf("multiprocessors           %d\n", (int)a.sm_count);
        printf("L2 cache                  %.1f MB\n", (double)a.l2_bytes / 1e6);
        printf("driver / runtime          %d / %d\n", (int)a.driver_version, (int)a.runtime_version);
    }
    return K3_EXIT_OK;
}
