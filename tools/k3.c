/* k3: the command-line front of k3kernels. */
#include <string.h>

#include "cli.h"

static const k3_cli_command commands[] = {
    {"info", "backend, device and architecture facts (--json, --arch X.Y)", k3_cmd_info},
    {"quant", "quantize BF16/F32 safetensors tensors to NVFP4 or MXFP4", k3_cmd_quant},
    {"dequant", "expand NVFP4/MXFP4 safetensors tensors back to F32 or BF16", k3_cmd_quant},
    {"convert", "one layer's MoE of a checkpoint to the stacked layout (lossless nvfp4/mxfp4)", k3_cmd_convert},
    {"run", "run an operation on safetensors inputs (run moe ...)", k3_cmd_run},
    {"demo", "the Kimi-K3 latent-MoE block at real shapes on the default backend", k3_cmd_demo},
    {"plan", "the resolved GEMM plan table for an architecture", k3_cmd_plan},
    {"bench", "GPU benchmarks: bench gemm | kda | moe (cuBLASLt side by side) | block", k3_cmd_bench},
    {"tune", "measure this GPU and write its GEMM table", k3_cmd_tune},
};
#define N_COMMANDS (int)(sizeof commands / sizeof commands[0])

static void usage(FILE *f) {
    fprintf(f, "k3 %s: latency-critical decode kernels for Kimi-K3-class models\n\n", k3_version());
    fprintf(f, "usage: k3 COMMAND [OPTIONS]    (k3 COMMAND --help for a command's options)\n\ncommands:\n");
    for (int i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nexit status: 0 success, 1 failure, 2 usage error\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return K3_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return K3_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("k3 %s\n", k3_version());
        return K3_EXIT_OK;
    }
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "k3: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return K3_EXIT_USAGE;
}
