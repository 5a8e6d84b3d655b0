/* TEMPORARY scaffold, replaced by its issue's implementation. */
#include "cli.h"

int k3_cmd_bench(int argc, char **argv) {
    (void)argc;
    fprintf(stderr, "k3 %s: not implemented yet\n", argv[0]);
    return K3_EXIT_FAIL;
}
