/* The safetensors dtypes and the helpers the reader and the writer share. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/st_common.h"

static const struct {
    const char *name;
    size_t size;
} k3_st_dtypes[] = {{"BF16", 2}, {"F16", 2}, {"F32", 4}, {"F64", 8},
                    {"I32", 4},  {"I64", 8}, {"U8", 1},  {"F8_E4M3", 1}};
#define K3_ST_NDTYPES (int)(sizeof k3_st_dtypes / sizeof k3_st_dtypes[0])

const char *k3_st_dtype_name(k3_st_dtype t) {
    return (int)t >= 0 && (int)t < K3_ST_NDTYPES ? k3_st_dtypes[t].name : "?";
}
size_t k3_st_dtype_size(k3_st_dtype t) { return (int)t >= 0 && (int)t < K3_ST_NDTYPES ? k3_st_dtypes[t].size : 0; }

k3_status k3_st_err(char *err, size_t err_size, k3_status st, const char *fmt, ...) {
    if (err && err_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_size, fmt, ap);
        va_end(ap);
    }
    return st;
}

size_t k3_st_tensor_bytes(k3_st_dtype dtype, int32_t ndim, const int64_t *shape, int *ok) {
    uint64_t total = k3_st_dtype_size(dtype);
    *ok = 1;
    for (int32_t i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (d != 0 && total > (uint64_t)INT64_MAX / d) {
            *ok = 0;
            return 0;
        }
        total *= d;
    }
    if (total > (uint64_t)SIZE_MAX) *ok = 0;
    return *ok ? (size_t)total : 0;
}

int k3_st_grow(void **arr, int32_t *cap, int32_t need, size_t elem) {
    if (need <= *cap) return 1;
    int32_t nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    void *na = realloc(*arr, (size_t)nc * elem);
    if (!na) return 0;
    *arr = na;
    *cap = nc;
    return 1;
}

/* FNV-1a: simple, and good enough for names that differ in a few digits */
static size_t st_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) h = (h ^ *c) * 1099511628211ull;
    return (size_t)(h ^ (h >> 29));
}

int32_t k3_st_index_get(const st_index *x, const char *key) {
    if (!x->cap || !key) return -1;
    for (size_t i = st_hash(key) & (x->cap - 1);; i = (i + 1) & (x->cap - 1)) {
        if (!x->slots[i].key) return -1;
        if (!strcmp(x->slots[i].key, key)) return x->slots[i].idx;
    }
}

static void st_index_insert(st_slot *slots, size_t cap, const char *key, int32_t idx) {
    size_t i = st_hash(key) & (cap - 1);
    while (slots[i].key) i = (i + 1) & (cap - 1);
    slots[i].key = key;
    slots[i].idx = idx;
}

int k3_st_index_put(st_index *x, const char *key, int32_t idx) {
    if ((size_t)x->count + 1 > x->cap / 2) { /* at most half full, so probes stay short and always end */
        size_t nc = x->cap ? x->cap * 2 : 16;
        if (nc > SIZE_MAX / sizeof(st_slot)) return 0;
        st_slot *ns = calloc(nc, sizeof *ns);
        if (!ns) return 0;
        for (size_t i = 0; i < x->cap; i++)
            if (x->slots[i].key) st_index_insert(ns, nc, x->slots[i].key, x->slots[i].idx);
        free(x->slots);
        x->slots = ns;
        x->cap = nc;
    }
    st_index_insert(x->slots, x->cap, key, idx);
    x->count++;
    return 1;
}

void k3_st_index_free(st_index *x) {
    free(x->slots);
    x->slots = NULL;
    x->cap = 0;
    x->count = 0;
}

size_t k3_st_utf8_seq(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    const unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1Fu, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0Fu, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07u, min = 0x10000;
    else return 0; /* continuation byte, C0/C1 (always overlong) or F5..FF */
    if (n < len) return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0u) != 0x80u) return 0;
        cp = (cp << 6) | (s[k] & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

size_t k3_st_utf8_bad(const char *s) {
    const unsigned char *u = (const unsigned char *)s;
    const size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        const size_t l = k3_st_utf8_seq(u + i, n - i);
        if (!l) return i;
        i += l;
    }
    return (size_t)-1;
}
