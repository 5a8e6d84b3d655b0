/* The safetensors writer. */
#define _POSIX_C_SOURCE 200809L /* open, fsync, getpid */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/st_common.h"

typedef struct st_wentry {
    char *name;
    k3_st_dtype dtype;
    int32_t ndim;
    int64_t shape[K3_ST_MAX_DIMS];
    size_t nbytes;
    void *data; /* NULL for a declared tensor (its bytes are streamed) */
} st_wentry;

struct k3_st_writer {
    st_wentry *ents;
    int32_t count, cap;
    st_meta *meta;
    int32_t meta_count, meta_cap;
    st_index names, meta_keys; /* duplicate checks in O(1) */
    int32_t declared;          /* how many entries were declared (no data) */
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
    k3_st_index_free(&w->names);
    k3_st_index_free(&w->meta_keys);
    free(w);
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* Validates and appends one entry; data NULL with declared set: its bytes come later (streaming). */
static k3_status add_entry(k3_st_writer *w, const char *name, k3_st_dtype dtype, int32_t ndim, const int64_t *shape,
                           const void *data, int declared, char *err, size_t err_size) {
    if (!w) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_writer_add: writer is NULL");
    if (!name || !name[0])
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_writer_add: name must be non-empty");
    if (!strcmp(name, "__metadata__"))
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "tensor name '__metadata__' is reserved");
    if (k3_st_utf8_bad(name) != (size_t)-1)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT,
                         "tensor name: invalid UTF-8 at byte %zu of the name", k3_st_utf8_bad(name));
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
    if (nb && !data && !declared)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "tensor '%.200s': data is NULL for %zu bytes", name,
                      nb);
    if (k3_st_index_get(&w->names, name) >= 0)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "duplicate tensor name '%.200s'", name);
    if (w->count >= INT32_MAX - 1 || !k3_st_grow((void **)&w->ents, &w->cap, w->count + 1, sizeof(st_wentry)))
        return k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "out of memory");
    st_wentry *e = &w->ents[w->count];
    memset(e, 0, sizeof *e);
    e->name = dup_str(name);
    if (!declared) e->data = malloc(nb ? nb : 1);
    if (!e->name || (!declared && !e->data) || !k3_st_index_put(&w->names, e->name, w->count)) {
        free(e->name);
        free(e->data);
        return k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "tensor '%.200s': out of memory for %zu bytes", name,
                      nb);
    }
    if (nb && !declared) memcpy(e->data, data, nb);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int32_t i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->nbytes = nb;
    w->count++;
    w->declared += declared;
    return K3_STATUS_SUCCESS;
}

k3_status k3_st_writer_add(k3_st_writer *w, const char *name, k3_st_dtype dtype, int32_t ndim,
                           const int64_t *shape, const void *data, char *err, size_t err_size) {
    return add_entry(w, name, dtype, ndim, shape, data, 0, err, err_size);
}

k3_status k3_st_writer_declare(k3_st_writer *w, const char *name, k3_st_dtype dtype, int32_t ndim,
                               const int64_t *shape, char *err, size_t err_size) {
    return add_entry(w, name, dtype, ndim, shape, NULL, 1, err, err_size);
}

k3_status k3_st_writer_set_metadata(k3_st_writer *w, const char *key, const char *value, char *err,
                                    size_t err_size) {
    if (!w || !key || !value)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_writer_set_metadata: NULL argument");
    if (k3_st_utf8_bad(key) != (size_t)-1 || k3_st_utf8_bad(value) != (size_t)-1)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT,
                         "metadata: invalid UTF-8 at byte %zu of the %s",
                         k3_st_utf8_bad(key) != (size_t)-1 ? k3_st_utf8_bad(key) : k3_st_utf8_bad(value),
                         k3_st_utf8_bad(key) != (size_t)-1 ? "key" : "value");
    char *v = dup_str(value);
    if (!v) return k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "out of memory");
    const int32_t old = k3_st_index_get(&w->meta_keys, key);
    if (old >= 0) {
        free(w->meta[old].value);
        w->meta[old].value = v;
        return K3_STATUS_SUCCESS;
    }
    char *k = dup_str(key);
    if (!k || w->meta_count >= INT32_MAX - 1 ||
        !k3_st_grow((void **)&w->meta, &w->meta_cap, w->meta_count + 1, sizeof(st_meta)) ||
        !k3_st_index_put(&w->meta_keys, k, w->meta_count)) {
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

/* Writes all n bytes (retrying short writes and EINTR); 0 with errno set on failure. */
static int write_all(int fd, const void *p, size_t n) {
    const unsigned char *c = p;
    while (n) {
        const size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        const ssize_t r = write(fd, c, chunk);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = EIO;
            return 0;
        }
        c += r;
        n -= (size_t)r;
    }
    return 1;
}

/* The file is written to a fresh temporary name next to path (same folder, so the rename cannot cross file
 * systems), flushed to disk, then renamed over path: a failure at any point (disk full, a file size limit, a
 * signal) leaves whatever path held before untouched, and removes only the temporary file. */
static k3_status tmp_create(const char *path, char **tmp_out, int *fd_out, char *err, size_t err_size) {
    const size_t plen = strlen(path);
    char *tmp = malloc(plen + 64);
    if (!tmp) return k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
    int fd = -1;
    for (int attempt = 0; attempt < 1000 && fd < 0; attempt++) {
        snprintf(tmp, plen + 64, "%s.k3tmp-%ld-%d", path, (long)getpid(), attempt);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0666); /* O_EXCL: never reuse or follow an existing name */
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        const int e = errno;
        free(tmp);
        return k3_st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: cannot create a temporary file next to it: %s",
                         path, strerror(e));
    }
    struct stat old;
    if (stat(path, &old) == 0 && S_ISREG(old.st_mode)) (void)fchmod(fd, old.st_mode & 07777); /* keep its mode */
    *tmp_out = tmp;
    *fd_out = fd;
    return K3_STATUS_SUCCESS;
}

/* Ends a temporary file: ok (everything written) -> fsync, close, rename over path; else (or when one of those
 * fails) unlink it. e and step describe the failure that made ok 0. Frees tmp. */
static k3_status tmp_finish(int fd, char *tmp, const char *path, int ok, int e, const char *step, char *err,
                            size_t err_size) {
    if (ok && fsync(fd) != 0) ok = 0, e = errno, step = "fsync failed";
    if (close(fd) != 0 && ok) ok = 0, e = errno, step = "close failed";
    if (ok && rename(tmp, path) != 0) ok = 0, e = errno, step = "cannot rename the temporary file over it";
    if (!ok) {
        unlink(tmp); /* only ours: the destination is as it was */
        free(tmp);
        return k3_st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: %s: %s (the file was left unchanged)", path, step,
                         e ? strerror(e) : "short write");
    }
    free(tmp);
    return K3_STATUS_SUCCESS;
}

static k3_status write_atomic(const k3_st_writer *w, const char *path, const unsigned char lenb[8], const sbuf *b,
                              char *err, size_t err_size) {
    char *tmp = NULL;
    int fd = -1;
    ST_TRY(tmp_create(path, &tmp, &fd, err, err_size));
    int ok = write_all(fd, lenb, 8) && write_all(fd, b->p, b->n);
    for (int32_t i = 0; ok && i < w->count; i++)
        ok = w->ents[i].nbytes == 0 || write_all(fd, w->ents[i].data, w->ents[i].nbytes);
    return tmp_finish(fd, tmp, path, ok, ok ? 0 : errno, "write failed", err, err_size);
}

/* The header: the JSON (padded with spaces so the data section starts 8-byte aligned) and its 8-byte length. */
static k3_status build_header(const k3_st_writer *w, const char *path, sbuf *b, unsigned char lenb[8], char *err,
                              size_t err_size) {
    char num[96];
    sb_str(b, "{");
    int first = 1;
    if (w->meta_count) {
        sb_str(b, "\"__metadata__\":{");
        for (int32_t i = 0; i < w->meta_count; i++) {
            if (i) sb_str(b, ",");
            sb_json_string(b, w->meta[i].key);
            sb_str(b, ":");
            sb_json_string(b, w->meta[i].value);
        }
        sb_str(b, "}");
        first = 0;
    }
    uint64_t off = 0;
    for (int32_t i = 0; i < w->count; i++) {
        const st_wentry *e = &w->ents[i];
        if (!first) sb_str(b, ",");
        first = 0;
        sb_json_string(b, e->name);
        sb_str(b, ":{\"dtype\":\"");
        sb_str(b, k3_st_dtype_name(e->dtype));
        sb_str(b, "\",\"shape\":[");
        for (int32_t d = 0; d < e->ndim; d++) {
            snprintf(num, sizeof num, d ? ",%lld" : "%lld", (long long)e->shape[d]);
            sb_str(b, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                 (unsigned long long)(off + e->nbytes));
        sb_str(b, num);
        off += e->nbytes;
    }
    sb_str(b, "}");
    while (!b->oom && (b->n % 8) != 0) sb_put(b, " ", 1); /* 8 + header length stays a multiple of 8 */
    if (b->oom) {
        free(b->p);
        b->p = NULL;
        return k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory building the header", path);
    }
    for (int k = 0; k < 8; k++) lenb[k] = (unsigned char)(((uint64_t)b->n >> (8 * k)) & 0xffu);
    return K3_STATUS_SUCCESS;
}

k3_status k3_st_writer_save(const k3_st_writer *w, const char *path, char *err, size_t err_size) {
    if (!w || !path) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_writer_save: NULL argument");
    if (w->declared)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT,
                         "%s: %d tensor(s) were declared without data: write them with k3_st_stream_open", path,
                         (int)w->declared);
    sbuf b = {0};
    unsigned char lenb[8];
    ST_TRY(build_header(w, path, &b, lenb, err, err_size));
    k3_status st = write_atomic(w, path, lenb, &b, err, err_size);
    free(b.p);
    return st;
}

/* ---- streaming ------------------------------------------------------------------------------------- */

struct k3_st_stream {
    int fd;
    char *tmp, *path;
    char **names; /* copies: the writer may be gone */
    size_t *sizes;
    int32_t count, cur; /* cur: the tensor the next byte belongs to */
    size_t cur_done;    /* bytes of tensor cur already written */
    uint64_t written;
    int dead;           /* a write failed: only abort is left */
};

static void stream_free(k3_st_stream *s) {
    if (!s) return;
    for (int32_t i = 0; i < s->count; i++) free(s->names[i]);
    free(s->names);
    free(s->sizes);
    free(s->tmp);
    free(s->path);
    free(s);
}

/* Skips the empty tensors at cur (they need no bytes). */
static void stream_settle(k3_st_stream *s) {
    while (s->cur < s->count && s->cur_done == s->sizes[s->cur]) {
        s->cur++;
        s->cur_done = 0;
    }
}

k3_status k3_st_stream_open(const k3_st_writer *w, const char *path, k3_st_stream **out, char *err,
                            size_t err_size) {
    if (!out) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_stream_open: out is NULL");
    *out = NULL;
    if (!w || !path) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_stream_open: NULL argument");
    if (w->declared != w->count)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT,
                         "%s: a streamed file takes declared tensors only (%d of %d were added with data)", path,
                         (int)(w->count - w->declared), (int)w->count);
    k3_st_stream *s = calloc(1, sizeof *s);
    if (!s) return k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
    s->fd = -1;
    s->names = calloc((size_t)(w->count ? w->count : 1), sizeof *s->names);
    s->sizes = calloc((size_t)(w->count ? w->count : 1), sizeof *s->sizes);
    s->path = dup_str(path);
    int fail = !s->names || !s->sizes || !s->path;
    for (int32_t i = 0; !fail && i < w->count; i++) {
        s->names[i] = dup_str(w->ents[i].name);
        s->sizes[i] = w->ents[i].nbytes;
        s->count = i + 1;
        fail = !s->names[i];
    }
    if (fail) {
        stream_free(s);
        return k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    sbuf b = {0};
    unsigned char lenb[8];
    k3_status st = build_header(w, path, &b, lenb, err, err_size);
    if (st == K3_STATUS_SUCCESS) st = tmp_create(path, &s->tmp, &s->fd, err, err_size);
    if (st == K3_STATUS_SUCCESS && !(write_all(s->fd, lenb, 8) && write_all(s->fd, b.p, b.n))) {
        st = tmp_finish(s->fd, s->tmp, path, 0, errno, "write failed", err, err_size);
        s->tmp = NULL;
        s->fd = -1;
    }
    free(b.p);
    if (st != K3_STATUS_SUCCESS) {
        stream_free(s);
        return st;
    }
    stream_settle(s);
    *out = s;
    return K3_STATUS_SUCCESS;
}

k3_status k3_st_stream_write(k3_st_stream *s, const void *data, size_t n, char *err, size_t err_size) {
    if (!s || (n && !data))
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_stream_write: NULL argument");
    if (s->dead)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "%s: an earlier write failed", s->path);
    const unsigned char *c = data;
    while (n) {
        if (s->cur >= s->count) {
            s->dead = 1;
            return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT,
                             "%s: %zu bytes more than the tensors declared (%llu bytes)", s->path, n,
                             (unsigned long long)s->written);
        }
        const size_t room = s->sizes[s->cur] - s->cur_done, k = n < room ? n : room;
        if (!write_all(s->fd, c, k)) {
            const int e = errno;
            s->dead = 1;
            return k3_st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: tensor '%.200s': write failed: %s", s->path,
                             s->names[s->cur], e ? strerror(e) : "short write");
        }
        c += k;
        n -= k;
        s->cur_done += k;
        s->written += k;
        stream_settle(s);
    }
    return K3_STATUS_SUCCESS;
}

const char *k3_st_stream_current(const k3_st_stream *s) {
    return s && s->cur < s->count ? s->names[s->cur] : NULL;
}

uint64_t k3_st_stream_written(const k3_st_stream *s) { return s ? s->written : 0; }

k3_status k3_st_stream_commit(k3_st_stream *s, char *err, size_t err_size) {
    if (!s) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_stream_commit: NULL stream");
    k3_status st;
    if (s->dead || s->cur < s->count) {
        if (s->dead)
            k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "%s: an earlier write failed", s->path);
        else
            k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT,
                      "%s: tensor '%.200s' got %zu of its %zu bytes (the file is incomplete)", s->path,
                      s->names[s->cur], s->cur_done, s->sizes[s->cur]);
        st = K3_STATUS_INVALID_ARGUMENT;
        char sub[8];
        (void)tmp_finish(s->fd, s->tmp, s->path, 0, 0, "", sub, sizeof sub);
    } else {
        st = tmp_finish(s->fd, s->tmp, s->path, 1, 0, "", err, err_size);
    }
    s->tmp = NULL; /* tmp_finish freed it */
    stream_free(s);
    return st;
}

void k3_st_stream_abort(k3_st_stream *s) {
    if (!s) return;
    if (s->tmp) {
        char sub[8];
        (void)tmp_finish(s->fd, s->tmp, s->path, 0, 0, "", sub, sizeof sub);
        s->tmp = NULL;
    }
    stream_free(s);
}
