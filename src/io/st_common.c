/* The safetensors dtypes and the helpers the reader and the writer share. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

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
