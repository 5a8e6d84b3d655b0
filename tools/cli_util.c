#define _POSIX_C_SOURCE 200809L /* stat */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sys/stat.h>

#include "cli.h"

int k3_cli_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return 1;
    return 0;
}

const char *k3_cli_value(int argc, char **argv, int *i, const char *name) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "k3: option %s needs a value\n", name);
        return NULL;
    }
    *i += 1;
    return argv[*i];
}

int k3_cli_parse_i64(const char *s, const char *what, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end != '\0') {
        fprintf(stderr, "k3: %s: '%s' is not an integer\n", what, s);
        return 0;
    }
    *out = (int64_t)v;
    return 1;
}

int k3_cli_parse_f32(const char *s, const char *what, float *out) {
    char *end = NULL;
    errno = 0;
    float v = strtof(s, &end);
    if (end == s || *end != '\0') {
        fprintf(stderr, "k3: %s: '%s' is not a number\n", what, s);
        return 0;
    }
    if (!isfinite(v) && errno != ERANGE) {
        fprintf(stderr, "k3: %s: '%s' is not a finite number\n", what, s);
        return 0;
    }
    if (errno == ERANGE) { /* strtof's range error: too large for a float, or below its normal range */
        fprintf(stderr, "k3: %s: '%s' is %s\n", what, s,
                isinf(v) || fabsf(v) > 1.0f ? "too large for a 32-bit float (above about 3.4e38)"
                                            : "too small in magnitude for a 32-bit float (below about 1.2e-38, "
                                              "the smallest normal value); use 0 where the option allows it");
        return 0;
    }
    *out = v;
    return 1;
}

int k3_cli_parse_list(const char *s, const char *what, int64_t *out, int cap) {
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end = NULL;
        long long a = strtoll(p, &end, 10), b;
        if (end == p) goto bad;
        b = a;
        if (*end == '-') {
            const char *q = end + 1;
            b = strtoll(q, &end, 10);
            if (end == q || b < a) goto bad;
        }
        for (long long v = a; v <= b; v++) {
            if (n >= cap) {
                fprintf(stderr, "k3: %s: more than %d values\n", what, cap);
                return 0;
            }
            out[n++] = (int64_t)v;
        }
        if (*end == ',') end++;
        else if (*end != '\0') goto bad;
        p = end;
    }
    if (n == 0) goto bad;
    return n;
bad:
    fprintf(stderr, "k3: %s: '%s' is not a list like 1,2,4 or 1-16\n", what, s);
    return 0;
}

int k3_cli_device_name_ok(const char *s, const char *what) {
    if (s && (!strcmp(s, "cpu") || !strcmp(s, "cuda") || !strcmp(s, "auto"))) return 1;
    fprintf(stderr, "k3: %s must be cpu, cuda or auto (got '%s')\n", what, s ? s : "");
    return 0;
}

k3_ctx *k3_cli_ctx(const char *device) {
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    if (!device || !strcmp(device, "auto")) opt.backend = K3_BACKEND_AUTO;
    else if (!strcmp(device, "cpu")) opt.backend = K3_BACKEND_CPU;
    else if (!strcmp(device, "cuda")) opt.backend = K3_BACKEND_CUDA;
    else {
        fprintf(stderr, "k3: --device must be cpu, cuda or auto (got '%s')\n", device);
        return NULL;
    }
    k3_ctx *ctx = NULL;
    k3_status st = k3_ctx_create(&opt, &ctx);
    if (st != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3: cannot create a %s context: %s%s\n", device ? device : "auto", k3_status_string(st),
                st == K3_STATUS_NOT_AVAILABLE ? " (no CUDA device, or a build without CUDA)" : "");
        return NULL;
    }
    return ctx;
}

k3_ctx *k3_cli_sim_ctx(const char *cmd, const char *arch, int32_t sm_count, int *usage) {
    int major = 0, minor = 0;
    char tail = 0;
    k3_arch_info probe;
    *usage = 0;
    if (sscanf(arch, "%d.%d%c", &major, &minor, &tail) != 2 ||
        k3_arch_from_capability(major, minor, &probe) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "%s: --arch wants MAJOR.MINOR with MAJOR 1..99 and MINOR 0..9, such as 9.0 or 10.3 (got '%s')\n",
                cmd, arch);
        *usage = 1;
        return NULL;
    }
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    opt.backend = K3_BACKEND_CPU;
    opt.sim_major = major, opt.sim_minor = minor, opt.sim_sm_count = sm_count;
    k3_ctx *ctx = NULL;
    const k3_status st = k3_ctx_create(&opt, &ctx);
    if (st != K3_STATUS_SUCCESS)
        fprintf(stderr, "%s: cannot create a simulated %s context: %s\n", cmd, arch, k3_status_string(st));
    return ctx;
}

int k3_cli_same_file(const char *a, const char *b) {
    if (!a || !b) return 0;
    if (!strcmp(a, b)) return 1;
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void k3_cli_json_string(FILE *f, const char *s) {
    if (!s) {
        fputs("null", f);
        return;
    }
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        switch (*c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (*c < 0x20 || *c == 0x7f) fprintf(f, "\\u%04x", (unsigned)*c);
            else fputc(*c, f);
        }
    }
    fputc('"', f);
}

void k3_cli_json_number(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.17g", v);
    else fputs("null", f);
}

double k3_cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void k3_cli_progress_init(k3_cli_progress *p, const char *cmd, double after) {
    p->cmd = cmd;
    p->start = k3_cli_now();
    p->last = -1e30;
    p->after = after;
}

/* 1 when a line is due now (and marks it printed). */
static int progress_due(k3_cli_progress *p) {
    if (p->after < 0) return 0;
    const double t = k3_cli_now();
    if (t - p->start < p->after || (p->after > 0 && t - p->last < 0.5)) return 0;
    p->last = t;
    return 1;
}

void k3_cli_progress_item(k3_cli_progress *p, int64_t i, int64_t n, const char *name) {
    if (progress_due(p)) fprintf(stderr, "%s: tensor %lld of %lld: %s\n", p->cmd, (long long)i, (long long)n, name);
}

void k3_cli_progress_step(k3_cli_progress *p, const char *step) {
    if (progress_due(p)) fprintf(stderr, "%s: %s\n", p->cmd, step);
}
