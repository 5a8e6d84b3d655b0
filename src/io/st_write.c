/* The safetensors writer. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/st_common.h"

typedef struct st_wentry {
    char *name;
    k3_st_dtype dtype;
    int32_t ndim;
    int64_t shape[K3_ST_MAX_DIMS];
    size_t nbytes;
    void *data;
} st_wentry;

struct k3_st_writer {
    st_wentry *ents;
    int32_t count, cap;
    st_meta *meta;
    int32_t meta_count, meta_cap;
};

k3_status k3_st_writer_create(k3_st_writer **out) {
    if (!out) return K3_STATUS_INVALID_ARGUMENT;
    *out = calloc(1, sizeof **out);
    return *out ? K3_STATUS_SUCCESS : K3_STATUS_OUT_OF_MEMORY;
}

void k3_st_writer_destroy(k3_st_writer *w) {
    if (!w) return;
    for (int32_t i = 0; i < w->count; i++) {
        free(w->ents[i].name);
        free(w->ents[i].data);
    }
    free(w->ents);
    for (int32_t i = 0; i < w->meta_count; i++) {
        free(w->meta[i].key);
        free(w->meta[i].value);
    }
    free(w->meta);
    free(w);
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

k3_status k3_st_writer_add(k3_st_writer *w, const char *name, k3_st_dtype dtype, int32_t ndim,
                           const int64_t *shape, const void *data, char *err, size_t err_size) {
    if (!w) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_writer_add: writer is NULL");
    if (!name || !name[0])
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_writer_add: name must be non-empty");
    if (!strcmp(name, "__metadata__"))
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "tensor name '__metadata__' is reserved");
    if (k3_st_dtype_size(dtype) == 0)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "tensor '%.200s': unknown dtype %d", name,
                      (int)dtype);
    if (ndim < 0 || ndim > K3_ST_MAX_DIMS || (ndim > 0 && !shape))
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT,
                      "tensor '%.200s': ndim %d must be 0..%d with a shape array", name, (int)ndim, K3_ST_MAX_DIMS);
    for (int32_t i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "tensor '%.200s': shape[%d] = %lld is negative",
                          name, (int)i, (long long)shape[i]);
    int ok = 1;
    size_t nb = k3_st_tensor_bytes(dtype, ndim, shape, &ok);
    if (!ok) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "tensor '%.200s': byte size overflows", name);
    if (nb && !data)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "tensor '%.200s': data is NULL for %zu bytes", name,
                      nb);
    for (int32_t i = 0; i < w->count; i++)
        if (!strcmp(w->ents[i].name, name))
            return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "duplicate tensor name '%.200s'", name);
    if (!k3_st_grow((void **)&w->ents, &w->cap, w->count + 1, sizeof(st_wentry)))
        return k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "out of memory");
    st_wentry *e = &w->ents[w->count];
    memset(e, 0, sizeof *e);
    e->name = dup_str(name);
    e->data = malloc(nb ? nb : 1);
    if (!e->name || !e->data) {
        free(e->name);
        free(e->data);
        return k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "tensor '%.200s': out of memory for %zu bytes", name,
                      nb);
    }
    if (nb) memcpy(e->data, data, nb);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int32_t i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->nbytes = nb;
    w->count++;
    return K3_STATUS_SUCCESS;
}

k3_status k3_st_writer_set_metadata(k3_st_writer *w, const char *key, const char *value, char *err,
                                    size_t err_size) {
    if (!w || !key || !value)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_writer_set_metadata: NULL argument");
    char *v = dup_str(value);
    if (!v) return k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int32_t i = 0; i < w->meta_count; i++)
        if (!strcmp(w->meta[i].key, key)) {
            free(w->meta[i].value);
            w->meta[i].value = v;
            return K3_STATUS_SUCCESS;
        }
    char *k = dup_str(key);
    if (!k || !k3_st_grow((void **)&w->meta, &w->meta_cap, w->meta_count + 1, sizeof(st_meta))) {
        free(k);
        free(v);
        return k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    w->meta[w->meta_count].key = k;
    w->meta[w->meta_count].value = v;
    w->meta_count++;
    return K3_STATUS_SUCCESS;
}

/* A growable text buffer for the header. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_json_string(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = {'\\', (char)*c};
            sb_put(b, e, 2);
        } else if (*c < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", *c);
            sb_put(b, e, 6);
        } else {
            sb_put(b, (const char *)c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

k3_status k3_st_writer_save(const k3_st_writer *w, const char *path, char *err, size_t err_size) {
    if (!w || !path) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_writer_save: NULL argument");
    sbuf b = {0};
    char num[96];
    sb_str(&b, "{");
    int first = 1;
    if (w->meta_count) {
        sb_str(&b, "\"__metadata__\":{");
        for (int32_t i = 0; i < w->meta_count; i++) {
            if (i) sb_str(&b, ",");
            sb_json_string(&b, w->meta[i].key);
            sb_str(&b, ":");
            sb_json_string(&b, w->meta[i].value);
        }
        sb_str(&b, "}");
        first = 0;
    }
    uint64_t off = 0;
    for (int32_t i = 0; i < w->count; i++) {
        const st_wentry *e = &w->ents[i];
        if (!first) sb_str(&b, ",");
        first = 0;
        sb_json_string(&b, e->name);
        sb_str(&b, ":{\"dtype\":\"");
        sb_str(&b, k3_st_dtype_name(e->dtype));
        sb_str(&b, "\",\"shape\":[");
        for (int32_t d = 0; d < e->ndim; d++) {
            snprintf(num, sizeof num, d ? ",%lld" : "%lld", (long long)e->shape[d]);
            sb_str(&b, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                 (unsigned long long)(off + e->nbytes));
        sb_str(&b, num);
        off += e->nbytes;
    }
    sb_str(&b, "}");
    while (!b.oom && (b.n % 8) != 0) sb_put(&b, " ", 1); /* 8 + header length stays a multiple of 8 */
    if (b.oom) {
        free(b.p);
        return k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory building the header", path);
    }
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        free(b.p);
        return k3_st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: cannot create: %s", path, strerror(errno));
    }
    unsigned char lenb[8];
    for (int k = 0; k < 8; k++) lenb[k] = (unsigned char)(((uint64_t)b.n >> (8 * k)) & 0xffu);
    int ok = fwrite(lenb, 1, 8, fp) == 8 && fwrite(b.p, 1, b.n, fp) == b.n;
    for (int32_t i = 0; ok && i < w->count; i++)
        ok = w->ents[i].nbytes == 0 || fwrite(w->ents[i].data, 1, w->ents[i].nbytes, fp) == w->ents[i].nbytes;
    int err_no = ok ? 0 : errno;
    if (fclose(fp) != 0 && ok) {
        ok = 0;
        err_no = errno;
    }
    free(b.p);
    if (!ok) {
        remove(path);
        return k3_st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: write failed: %s", path,
                      err_no ? strerror(err_no) : "short write");
    }
    return K3_STATUS_SUCCESS;
}
