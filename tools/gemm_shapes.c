/* Shape sets for the GEMM tools (docs/model.md, section 1). */
#include "gemm_shapes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per-rank [N, K] at TP8: KDA packed in_proj, QKVG, F_AB, f_b, o_proj, MLA fused_qkv_a, q_b, g_proj/shared
 * gate_up, shared down, latent down, latent up, dense gate_up, dense down, lm_head. */
static const k3_shape tp8[] = {{144, 7168},  {1536, 128},  {1536, 7168}, {2112, 7168}, {2304, 1536},
                               {3584, 7168}, {6144, 7168}, {6288, 7168}, {7168, 768},  {7168, 1536},
                               {7168, 3584}, {8448, 7168}, {7168, 4224}, {20480, 7168}};
/* The other tensor-parallel degrees listed there (TP4 / TP16). */
static const k3_shape tp4_16[] = {{12448, 7168}, {3216, 7168}, {768, 7168},  {1152, 1536}, {4224, 7168},
                                  {7168, 384},   {768, 128},   {3072, 128},  {3072, 7168}, {4608, 1536},
                                  {7168, 3072},  {7168, 8448}, {16896, 7168}};

static int add_shape(k3_shape *out, int n, int cap, int64_t sn, int64_t sk) {
    for (int i = 0; i < n; i++)
        if (out[i].n == sn && out[i].k == sk) return n;
    if (n >= cap) {
        fprintf(stderr, "k3: more than %d shapes\n", cap);
        return -1;
    }
    out[n].n = sn;
    out[n].k = sk;
    return n + 1;
}

static int add_set(k3_shape *out, int n, int cap, const k3_shape *set, int count) {
    for (int i = 0; i < count && n >= 0; i++) n = add_shape(out, n, cap, set[i].n, set[i].k);
    return n;
}

/* Parses "N,K,N,K" / "NxK,NxK" / "N K N K" (any of ',', 'x', spaces, tabs, newlines between numbers, '#'
 * comments); returns the count or -1. */
static int parse_pairs(const char *s, k3_shape *out, int n, int cap, const char *what) {
    int64_t pending = -1;
    const char *p = s;
    while (*p) {
        if (*p == '#') {
            while (*p && *p != '\n') p++;
            continue;
        }
        if (*p == ',' || *p == 'x' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
            p++;
            continue;
        }
        char *end = NULL;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 1 || v > (1ll << 30)) {
            fprintf(stderr, "k3: %s: '%.20s' is not a dimension in 1..2^30\n", what, p);
            return -1;
        }
        p = end;
        if (pending < 0) pending = v;
        else {
            n = add_shape(out, n, cap, pending, v);
            if (n < 0) return -1;
            pending = -1;
        }
    }
    if (pending >= 0) {
        fprintf(stderr, "k3: %s: an N without its K\n", what);
        return -1;
    }
    return n;
}

int k3_shapes_parse(const char *value, const char *default_set, int allow_file, k3_shape *out, int cap) {
    if (!strcmp(value, "k3")) value = default_set;
    int n = 0;
    if (!strcmp(value, "tp8")) n = add_set(out, 0, cap, tp8, (int)(sizeof tp8 / sizeof tp8[0]));
    else if (!strcmp(value, "all")) {
        n = add_set(out, 0, cap, tp8, (int)(sizeof tp8 / sizeof tp8[0]));
        if (n >= 0) n = add_set(out, n, cap, tp4_16, (int)(sizeof tp4_16 / sizeof tp4_16[0]));
    } else if (value[0] >= '0' && value[0] <= '9') {
        n = parse_pairs(value, out, 0, cap, "--shapes");
    } else if (allow_file) {
        FILE *f = fopen(value, "rb");
        if (!f) {
            fprintf(stderr, "k3: --shapes '%s' is not tp8, all, k3, N,K[,N,K...] or a readable file\n", value);
            return 0;
        }
        char *text = (char *)calloc(1, 1 << 20);
        size_t len = text ? fread(text, 1, (1 << 20) - 1, f) : 0;
        fclose(f);
        if (!text) return 0;
        text[len] = '\0';
        n = parse_pairs(text, out, 0, cap, value);
        free(text);
    } else {
        fprintf(stderr, "k3: --shapes '%s' is not tp8, all, k3 or N,K[,N,K...]\n", value);
        return 0;
    }
    if (n == 0) fprintf(stderr, "k3: --shapes '%s' names no shape\n", value);
    return n < 0 ? 0 : n;
}
