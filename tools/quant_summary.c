/* k3 quant / k3 dequant --json: the summary object (names escaped, counts from the per-tensor fates). */
#define _POSIX_C_SOURCE 200809L /* stat */
#include "quant_summary.h"

#include <stdio.h>
#include <sys/stat.h>

#include "cli.h"

int64_t k3_quant_file_bytes(const char *path) {
    struct stat st;
    if (!path || stat(path, &st) != 0) return -1;
    return (int64_t)st.st_size;
}

/* "KEY_count": n, "KEY": [names of the tensors whose fate is `fate`] */
static void names_of(const k3_quant_summary *s, const char *key, unsigned char fate) {
    const int32_t n = k3_st_count(s->in);
    int64_t count = 0;
    for (int32_t i = 0; i < n; i++) count += s->fate[i] == fate;
    printf(", \"%s_count\": %lld, \"%s\": [", key, (long long)count, key);
    int first = 1;
    for (int32_t i = 0; i < n; i++) {
        if (s->fate[i] != fate) continue;
        if (!first) fputs(", ", stdout);
        k3_cli_json_string(stdout, k3_st_at(s->in, i)->name);
        first = 0;
    }
    putchar(']');
}

void k3_quant_summary_print(const k3_quant_summary *s) {
    printf("{\"command\": ");
    k3_cli_json_string(stdout, s->command);
    printf(", \"input\": ");
    k3_cli_json_string(stdout, s->input);
    printf(", \"output\": ");
    k3_cli_json_string(stdout, s->output);
    printf(", \"format\": ");
    k3_cli_json_string(stdout, s->format);
    printf(", \"scale_layout\": ");
    k3_cli_json_string(stdout, s->scale_layout);
    if (s->dtype) {
        printf(", \"dtype\": ");
        k3_cli_json_string(stdout, s->dtype);
    }
    printf(", \"tensors_in\": %lld", (long long)k3_st_count(s->in));
    names_of(s, s->converted_key, K3_QS_CONVERTED);
    names_of(s, "copied", K3_QS_COPIED);
    if (s->dtype) names_of(s, "dropped", K3_QS_DROPPED);
    printf(", \"tensors_out\": %lld, \"bytes_in\": %lld, \"bytes_out\": %lld, \"seconds\": ", (long long)s->tensors_out,
           (long long)s->bytes_in, (long long)s->bytes_out);
    k3_cli_json_number(stdout, s->seconds);
    printf("}\n");
}
