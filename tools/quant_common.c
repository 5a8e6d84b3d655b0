/* k3 quant / k3 dequant: the options and file helpers both commands share. */
#include "quant_common.h"

#include <stdlib.h>
#include <string.h>

int k3_quant_opts_parse(int argc, char **argv, int *i, k3_quant_opts *o) {
    const char *a = argv[*i];
    if (!strcmp(a, "--json")) {
        o->json = 1;
        return 1;
    }
    if (!strcmp(a, "--quiet")) {
        o->quiet = 1;
        return 1;
    }
    if (strcmp(a, "--progress-after")) return 0;
    const char *v = k3_cli_value(argc, argv, i, a);
    if (!v || !k3_cli_parse_f32(v, a, &o->progress_after)) return -1;
    if (!(o->progress_after >= 0.0f)) {
        fprintf(stderr, "k3: --progress-after must be >= 0 seconds (got '%s')\n", v);
        return -1;
    }
    return 1;
}

int64_t k3_quant_elems(const int64_t *d, int32_t n) {
    int64_t p = 1;
    for (int32_t i = 0; i < n; i++) {
        if (d[i] < 0 || (d[i] && p > INT64_MAX / d[i])) return -1;
        p *= d[i];
    }
    return p;
}

const char *k3_quant_shape_str(const k3_st_tensor *t, char *buf, size_t n) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int32_t i = 0; i < t->ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
    return buf;
}

char *k3_quant_suffixed(const char *name, const char *suffix) {
    size_t a = strlen(name), b = strlen(suffix);
    char *s = malloc(a + b + 1);
    if (s) {
        memcpy(s, name, a);
        memcpy(s + a, suffix, b + 1);
    }
    return s;
}

int k3_quant_copy_tensor(k3_st_writer *w, const k3_st_tensor *t, const char *cmd) {
    char err[512];
    if (k3_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, err, sizeof err) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 %s: %s\n", cmd, err);
        return 0;
    }
    return 1;
}

int k3_quant_save(k3_st_writer *w, const char *path, const char *cmd) {
    char err[512];
    if (k3_st_writer_save(w, path, err, sizeof err) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 %s: %s\n", cmd, err);
        return 0;
    }
    return 1;
}

k3_st_file *k3_quant_open(const char *path, const char *cmd) {
    char err[512];
    k3_st_file *f = NULL;
    if (k3_st_open(path, &f, err, sizeof err) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 %s: %s\n", cmd, err);
        return NULL;
    }
    return f;
}
