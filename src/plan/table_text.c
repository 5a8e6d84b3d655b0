/* The table parser's shared helpers (messages with the line, numbers, M ranges) and the writer's buffer. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/table_text.h"

k3_status k3_table_perr(k3_table_parser *p, const char *fmt, ...) {
    if (p->err && p->err_size) {
        int n = snprintf(p->err, p->err_size, "%s:%d: ", p->source, (int)p->line);
        if (n >= 0 && (size_t)n < p->err_size) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(p->err + n, p->err_size - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return K3_STATUS_FORMAT_ERROR;
}

int k3_table_parse_num(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s) return 0;
    for (const char *c = s; *c; c++)
        if (*c < '0' || *c > '9') return 0;
    if (strlen(s) > 12) return 0;
    errno = 0;
    long long v = strtoll(s, NULL, 10);
    if (errno || v < lo || v > hi) return 0;
    *out = (int64_t)v;
    return 1;
}

int k3_table_parse_range(const char *s, int64_t max_m, int64_t *lo, int64_t *hi) {
    char range[64];
    snprintf(range, sizeof range, "%s", s);
    char *dash = strchr(range, '-');
    if (dash) *dash = '\0';
    if (!k3_table_parse_num(range, 0, 1000000, lo) || (dash && !k3_table_parse_num(dash + 1, 0, 1000000, hi)))
        return 0;
    if (!dash) *hi = *lo;
    return *lo >= 1 && *hi <= max_m && *lo <= *hi ? 1 : -1;
}

void k3_sbuf_printf(k3_sbuf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if (b->s && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *s = (char *)realloc(b->s, cap);
        if (!s) {
            b->failed = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}
