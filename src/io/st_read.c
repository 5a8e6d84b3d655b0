/* The safetensors reader: the header parsed and checked (offsets, sizes, dtypes), tensors sorted by offset. */
#define _POSIX_C_SOURCE 200809L /* pread */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/st_common.h"

struct k3_st_file {
    k3_st_tensor *tensors; /* sorted by data offset */
    int32_t count;
    st_meta *meta;
    int32_t meta_count;
    st_index names, meta_keys; /* O(1) lookups: built once at open, read-only afterwards */
    unsigned char *data;   /* the data section (NULL when opened header-only) */
    uint64_t *offsets;     /* each tensor's begin in the data section */
    uint64_t data_start;   /* the data section's offset in the file */
    int fd;                /* header-only: the open file (pread), else -1 */
    char *path;            /* header-only: for messages */
    void **copies;         /* aligned copies of misaligned tensors */
    int32_t copy_count;
};

static void file_free(k3_st_file *f) {
    if (!f) return;
    for (int32_t i = 0; i < f->count; i++) free((char *)f->tensors[i].name);
    free(f->tensors);
    for (int32_t i = 0; i < f->meta_count; i++) {
        free(f->meta[i].key);
        free(f->meta[i].value);
    }
    free(f->meta);
    k3_st_index_free(&f->names);
    k3_st_index_free(&f->meta_keys);
    for (int32_t i = 0; i < f->copy_count; i++) free(f->copies[i]);
    free(f->copies);
    free(f->data);
    free(f->offsets);
    free(f->path);
    if (f->fd >= 0) close(f->fd);
    free(f);
}

/* Tensor entries as parsed, before their data pointers are set. */
typedef struct st_entry {
    k3_st_tensor t;
    int64_t begin, end;
} st_entry;


/* Parses {"dtype": ..., "shape": [...], "data_offsets": [b, e]} for tensor `name`. */
static k3_status parse_tensor(jp *p, const char *name, st_entry *e) {
    char msg[512];
    int have_dtype = 0, have_shape = 0, have_off = 0;
    if (!k3_jp_eat(p, '{')) {
        snprintf(msg, sizeof msg, "tensor '%.200s': expected an object", name);
        return k3_jp_fail(p, msg);
    }
    if (!k3_jp_eat(p, '}')) {
        for (;;) {
            char *key = NULL;
            ST_TRY(k3_jp_key(p, &key));
            k3_status st = K3_STATUS_SUCCESS;
            /* a repeated key is reported before its value is parsed (a second "shape" must not read as extra
               dimensions of the first) */
            if ((!strcmp(key, "dtype") && have_dtype) || (!strcmp(key, "shape") && have_shape) ||
                (!strcmp(key, "data_offsets") && have_off)) {
                snprintf(msg, sizeof msg, "tensor '%.200s': duplicate key '%.40s'", name, key);
                free(key);
                return k3_jp_fail(p, msg);
            }
            if (!strcmp(key, "dtype")) {
                have_dtype = 1;
                char *dt = NULL;
                st = k3_jp_string(p, &dt);
                if (st == K3_STATUS_SUCCESS) {
                    int found = -1;
                    for (int k = 0; k3_st_dtype_size((k3_st_dtype)k) != 0; k++)
                        if (!strcmp(dt, k3_st_dtype_name((k3_st_dtype)k))) found = k;
                    if (found < 0) {
                        snprintf(msg, sizeof msg,
                                 "tensor '%.200s': unsupported dtype '%.40s' (supported: BF16 F16 F32 F64 I32 I64 "
                                 "U8 F8_E4M3)",
                                 name, dt);
                        st = k3_jp_fail(p, msg);
                    }
                    e->t.dtype = (k3_st_dtype)(found < 0 ? 0 : found);
                }
                free(dt);
            } else if (!strcmp(key, "shape")) {
                have_shape = 1;
                if (!k3_jp_eat(p, '[')) {
                    snprintf(msg, sizeof msg, "tensor '%.200s': shape must be an array", name);
                    st = k3_jp_fail(p, msg);
                } else if (!k3_jp_eat(p, ']')) {
                    for (;;) {
                        if (e->t.ndim >= K3_ST_MAX_DIMS) {
                            snprintf(msg, sizeof msg, "tensor '%.200s': more than %d dimensions", name,
                                     K3_ST_MAX_DIMS);
                            st = k3_jp_fail(p, msg);
                            break;
                        }
                        snprintf(msg, sizeof msg, "tensor '%.200s': shape[%d]", name, e->t.ndim);
                        st = k3_jp_uint(p, msg, &e->t.shape[e->t.ndim]);
                        if (st != K3_STATUS_SUCCESS) break;
                        e->t.ndim++;
                        if (k3_jp_eat(p, ',')) continue;
                        if (k3_jp_eat(p, ']')) break;
                        st = k3_jp_fail(p, "expected ',' or ']' in shape");
                        break;
                    }
                }
            } else if (!strcmp(key, "data_offsets")) {
                have_off = 1;
                snprintf(msg, sizeof msg, "tensor '%.200s': data_offsets", name);
                if (!k3_jp_eat(p, '[')) st = k3_jp_fail(p, "data_offsets must be an array of two integers");
                if (st == K3_STATUS_SUCCESS) st = k3_jp_uint(p, msg, &e->begin);
                if (st == K3_STATUS_SUCCESS && !k3_jp_eat(p, ','))
                    st = k3_jp_fail(p, "data_offsets must be an array of two integers");
                if (st == K3_STATUS_SUCCESS) st = k3_jp_uint(p, msg, &e->end);
                if (st == K3_STATUS_SUCCESS && !k3_jp_eat(p, ']'))
                    st = k3_jp_fail(p, "data_offsets must be an array of two integers");
            } else {
                st = k3_jp_skip(p, 1); /* tolerate keys a future writer may add */
            }
            free(key);
            if (st != K3_STATUS_SUCCESS) return st;
            if (k3_jp_eat(p, ',')) continue;
            if (k3_jp_eat(p, '}')) break;
            return k3_jp_fail(p, "expected ',' or '}'");
        }
    }
    if (!have_dtype || !have_shape || !have_off) {
        snprintf(msg, sizeof msg, "tensor '%.200s': missing %s", name,
                 !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");
        return k3_jp_fail(p, msg);
    }
    return K3_STATUS_SUCCESS;
}

typedef struct meta_sink {
    k3_st_file *f;
    int32_t cap;
} meta_sink;

static k3_status meta_pair(void *user, jp *p, char *k, char *v) {
    meta_sink *m = (meta_sink *)user;
    k3_st_file *f = m->f;
    if (k3_st_index_get(&f->meta_keys, k) >= 0) {
        char msg[320];
        snprintf(msg, sizeof msg, "duplicate key '%.200s' in __metadata__", k);
        free(k);
        free(v);
        return k3_jp_fail(p, msg);
    }
    if (f->meta_count >= INT32_MAX - 1 || !k3_st_grow((void **)&f->meta, &m->cap, f->meta_count + 1, sizeof(st_meta)) ||
        !k3_st_index_put(&f->meta_keys, k, f->meta_count)) {
        free(k);
        free(v);
        return k3_st_err(p->err, p->err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory", p->path);
    }
    f->meta[f->meta_count].key = k;
    f->meta[f->meta_count].value = v;
    f->meta_count++;
    return K3_STATUS_SUCCESS;
}

static k3_status parse_metadata(jp *p, k3_st_file *f) {
    meta_sink m = {f, 0};
    return k3_jp_string_object(p, "__metadata__ must be an object of strings", "__metadata__ values must be strings",
                               "__metadata__", meta_pair, &m);
}

static int cmp_entry(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const st_entry *const *)a)->t.name, (*(const st_entry *const *)b)->t.name);
}

/* Parses the header, validates every tensor against the data section size, fills f->tensors (no data yet). */
static k3_status parse_header(jp *p, uint64_t data_size, k3_st_file *f, st_entry **entries_out) {
    st_entry *ents = NULL;
    int32_t cap = 0, count = 0;
    int have_meta = 0;
    k3_status st = K3_STATUS_SUCCESS;
    *entries_out = NULL;
    if (!k3_jp_eat(p, '{')) return k3_jp_fail(p, "the header must be a JSON object");
    if (!k3_jp_eat(p, '}')) {
        for (;;) {
            char *name = NULL;
            st = k3_jp_key(p, &name);
            if (st != K3_STATUS_SUCCESS) break;
            if (!name[0]) {
                free(name);
                st = k3_jp_fail(p, "empty tensor name (a tensor needs a non-empty name)");
                break;
            }
            if (!strcmp(name, "__metadata__")) {
                free(name);
                if (have_meta++) {
                    st = k3_jp_fail(p, "duplicate __metadata__");
                    break;
                }
                st = parse_metadata(p, f);
                if (st != K3_STATUS_SUCCESS) break;
            } else {
                if (count >= INT32_MAX - 1 || !k3_st_grow((void **)&ents, &cap, count + 1, sizeof(st_entry))) {
                    free(name);
                    st = k3_st_err(p->err, p->err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory", p->path);
                    break;
                }
                st_entry *e = &ents[count];
                memset(e, 0, sizeof *e);
                e->t.name = name;
                count++;
                st = parse_tensor(p, name, e);
                if (st != K3_STATUS_SUCCESS) break;
            }
            if (k3_jp_eat(p, ',')) continue;
            if (k3_jp_eat(p, '}')) break;
            st = k3_jp_fail(p, "expected ',' or '}'");
            break;
        }
    }
    if (st == K3_STATUS_SUCCESS) {
        k3_jp_ws(p);
        if (p->i != p->n) st = k3_jp_fail(p, "trailing bytes after the header object (only spaces may pad it)");
    }
    /* per-tensor sizes */
    for (int32_t i = 0; st == K3_STATUS_SUCCESS && i < count; i++) {
        st_entry *e = &ents[i];
        int ok = 1;
        size_t nb = k3_st_tensor_bytes(e->t.dtype, e->t.ndim, e->t.shape, &ok);
        if (!ok)
            st = k3_st_err(p->err, p->err_size, K3_STATUS_FORMAT_ERROR, "%s: tensor '%.200s': byte size overflows",
                        p->path, e->t.name);
        else if (e->end < e->begin)
            st = k3_st_err(p->err, p->err_size, K3_STATUS_FORMAT_ERROR,
                        "%s: tensor '%.200s': data_offsets [%lld, %lld] end before they begin", p->path, e->t.name,
                        (long long)e->begin, (long long)e->end);
        else if ((uint64_t)(e->end - e->begin) != (uint64_t)nb)
            st = k3_st_err(p->err, p->err_size, K3_STATUS_FORMAT_ERROR,
                        "%s: tensor '%.200s': data_offsets [%lld, %lld] span %lld bytes but %s shape needs %zu",
                        p->path, e->t.name, (long long)e->begin, (long long)e->end,
                        (long long)(e->end - e->begin), k3_st_dtype_name(e->t.dtype), nb);
        else if ((uint64_t)e->end > data_size)
            st = k3_st_err(p->err, p->err_size, K3_STATUS_FORMAT_ERROR,
                        "%s: tensor '%.200s': data_offsets end %lld is past the data section (%llu bytes; "
                        "truncated file?)",
                        p->path, e->t.name, (long long)e->end, (unsigned long long)data_size);
        e->t.nbytes = nb;
    }
    /* duplicate names */
    if (st == K3_STATUS_SUCCESS && count > 1) {
        st_entry **byname = malloc((size_t)count * sizeof *byname);
        if (!byname) {
            st = k3_st_err(p->err, p->err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory", p->path);
        } else {
            for (int32_t i = 0; i < count; i++) byname[i] = &ents[i];
            qsort(byname, (size_t)count, sizeof *byname, cmp_name);
            for (int32_t i = 1; i < count && st == K3_STATUS_SUCCESS; i++)
                if (!strcmp(byname[i]->t.name, byname[i - 1]->t.name))
                    st = k3_st_err(p->err, p->err_size, K3_STATUS_FORMAT_ERROR, "%s: duplicate tensor name '%.200s'",
                                p->path, byname[i]->t.name);
            free(byname);
        }
    }
    /* the tensors must tile the data section exactly */
    if (st == K3_STATUS_SUCCESS) {
        if (count > 1) qsort(ents, (size_t)count, sizeof *ents, cmp_entry);
        uint64_t pos = 0;
        for (int32_t i = 0; i < count && st == K3_STATUS_SUCCESS; i++) {
            uint64_t b = (uint64_t)ents[i].begin;
            if (b < pos)
                st = k3_st_err(p->err, p->err_size, K3_STATUS_FORMAT_ERROR,
                            "%s: tensor '%.200s': data_offsets [%lld, %lld] overlap the previous tensor '%.200s'",
                            p->path, ents[i].t.name, (long long)ents[i].begin, (long long)ents[i].end,
                            ents[i - 1].t.name);
            else if (b > pos)
                st = k3_st_err(p->err, p->err_size, K3_STATUS_FORMAT_ERROR,
                            "%s: tensor '%.200s': data_offsets begin %lld leaves a hole after byte %llu", p->path,
                            ents[i].t.name, (long long)ents[i].begin, (unsigned long long)pos);
            pos = (uint64_t)ents[i].end;
        }
        if (st == K3_STATUS_SUCCESS && pos != data_size)
            st = k3_st_err(p->err, p->err_size, K3_STATUS_FORMAT_ERROR,
                        "%s: the tensors cover %llu bytes of a %llu-byte data section (extra bytes at the end)",
                        p->path, (unsigned long long)pos, (unsigned long long)data_size);
    }
    if (st != K3_STATUS_SUCCESS) {
        for (int32_t i = 0; i < count; i++) free((char *)ents[i].t.name);
        free(ents);
        return st;
    }
    f->count = count;
    *entries_out = ents;
    return K3_STATUS_SUCCESS;
}

/* Reads n bytes at file offset off (short reads and EINTR retried); 0 with *eof set when the file ended first. */
static int pread_all(int fd, void *dst, size_t n, uint64_t off, int *eof) {
    unsigned char *c = dst;
    *eof = 0;
    while (n) {
        const size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        const ssize_t r = pread(fd, c, chunk, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return 0;
        if (r == 0) {
            *eof = 1;
            return 0;
        }
        c += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 1;
}

/* header_only: validate everything, keep the descriptor, read no tensor bytes (k3_st_read reads them later). */
static k3_status open_file(const char *path, int header_only, k3_st_file **out, char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!out) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_open: out must not be NULL");
    *out = NULL;
    if (!path) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_open: path must not be NULL");
    const int fd = open(path, O_RDONLY);
    if (fd < 0) return k3_st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: cannot open: %s", path, strerror(errno));
    k3_status st = K3_STATUS_SUCCESS;
    k3_st_file *f = NULL;
    char *header = NULL;
    st_entry *ents = NULL;
    int eof = 0;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 0) {
        st = k3_st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: not a regular file (or its size is unknown)", path);
        goto done;
    }
    const long long fsize = (long long)sb.st_size;
    unsigned char lenb[8];
    if (fsize < 8) {
        st = k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                    "%s: %lld bytes is too short for a safetensors file (8-byte header length)", path, fsize);
        goto done;
    }
    if (!pread_all(fd, lenb, 8, 0, &eof)) {
        st = k3_st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: cannot read: %s", path,
                       eof ? "the file shrank while it was read" : strerror(errno));
        goto done;
    }
    uint64_t hlen = 0;
    for (int k = 7; k >= 0; k--) hlen = (hlen << 8) | lenb[k];
    if (hlen > K3_ST_MAX_HEADER) {
        st = k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR, "%s: header length %llu exceeds the %llu-byte limit",
                    path, (unsigned long long)hlen, K3_ST_MAX_HEADER);
        goto done;
    }
    if (hlen > (uint64_t)fsize - 8) {
        st = k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                    "%s: header length %llu is larger than the rest of the file (%lld bytes; truncated?)", path,
                    (unsigned long long)hlen, fsize - 8);
        goto done;
    }
    if (hlen < 2) {
        st = k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR, "%s: header length %llu is too short for a JSON object",
                    path, (unsigned long long)hlen);
        goto done;
    }
    header = malloc((size_t)hlen);
    f = calloc(1, sizeof *f);
    if (f) f->fd = -1;
    if (!header || !f) {
        st = k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory reading the header", path);
        goto done;
    }
    if (!pread_all(fd, header, (size_t)hlen, 8, &eof)) {
        st = k3_st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: read error in the header%s", path,
                       eof ? " (the file shrank while it was read)" : "");
        goto done;
    }
    const uint64_t data_size = (uint64_t)fsize - 8 - hlen;
    f->data_start = 8 + hlen;
    jp p = {.s = header, .n = (size_t)hlen, .i = 0, .path = path, .err = err, .err_size = err_size};
    st = parse_header(&p, data_size, f, &ents);
    if (st != K3_STATUS_SUCCESS) goto done;
    /* f owns the names from here on, so every later failure is a plain file_free */
    f->tensors = calloc((size_t)(f->count ? f->count : 1), sizeof *f->tensors);
    f->offsets = malloc((size_t)(f->count ? f->count : 1) * sizeof *f->offsets);
    if (!f->tensors || !f->offsets) {
        for (int32_t i = 0; i < f->count; i++) free((char *)ents[i].t.name);
        free(ents);
        f->count = 0;
        st = k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
        goto done;
    }
    for (int32_t i = 0; i < f->count; i++) {
        f->tensors[i] = ents[i].t;
        f->offsets[i] = (uint64_t)ents[i].begin;
    }
    free(ents);
    for (int32_t i = 0; i < f->count; i++)
        if (!k3_st_index_put(&f->names, f->tensors[i].name, i)) {
            st = k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory indexing the names", path);
            goto done;
        }
    if (header_only) {
        size_t n = strlen(path) + 1;
        f->path = malloc(n);
        if (!f->path) {
            st = k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
            goto done;
        }
        memcpy(f->path, path, n);
        f->fd = fd;
        goto done;
    }
    f->data = malloc(data_size ? (size_t)data_size : 1);
    if (!f->data) {
        st = k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory for %llu bytes of tensor data", path,
                    (unsigned long long)data_size);
        goto done;
    }
    if (data_size && !pread_all(fd, f->data, (size_t)data_size, f->data_start, &eof)) {
        st = k3_st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: read error in the data section%s", path,
                       eof ? " (the file shrank while it was read)" : "");
        goto done;
    }
    int32_t copy_cap = 0;
    for (int32_t i = 0; i < f->count; i++) {
        k3_st_tensor *t = &f->tensors[i];
        const unsigned char *d = f->data + (size_t)f->offsets[i];
        size_t esz = k3_st_dtype_size(t->dtype);
        if (t->nbytes && ((uintptr_t)d % esz) != 0) { /* only a foreign writer's odd layout gets here: copy */
            void *c = malloc(t->nbytes);
            if (!c || !k3_st_grow((void **)&f->copies, &copy_cap, f->copy_count + 1, sizeof(void *))) {
                free(c);
                st = k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
                goto done;
            }
            memcpy(c, d, t->nbytes);
            f->copies[f->copy_count++] = c;
            d = c;
        }
        t->data = d;
    }
done:
    free(header);
    if (!f || f->fd != fd) close(fd);
    if (st != K3_STATUS_SUCCESS) {
        file_free(f);
        return st;
    }
    *out = f;
    return K3_STATUS_SUCCESS;
}

k3_status k3_st_open(const char *path, k3_st_file **out, char *err, size_t err_size) {
    return open_file(path, 0, out, err, err_size);
}

k3_status k3_st_open_header(const char *path, k3_st_file **out, char *err, size_t err_size) {
    return open_file(path, 1, out, err, err_size);
}

k3_status k3_st_read(const k3_st_file *f, const k3_st_tensor *t, uint64_t offset, void *dst, size_t n, char *err,
                     size_t err_size) {
    if (!f || !t || (n && !dst))
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_read: NULL argument");
    if (t < f->tensors || t >= f->tensors + f->count)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT,
                         "k3_st_read: tensor '%.200s' is not one of this file's", t->name ? t->name : "?");
    if (offset > t->nbytes || n > t->nbytes - offset)
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT,
                         "k3_st_read: tensor '%.200s': bytes [%llu, +%zu) are outside its %zu bytes", t->name,
                         (unsigned long long)offset, n, t->nbytes);
    if (!n) return K3_STATUS_SUCCESS;
    if (t->data) {
        memcpy(dst, (const unsigned char *)t->data + offset, n);
        return K3_STATUS_SUCCESS;
    }
    int eof = 0;
    const uint64_t at = f->data_start + f->offsets[t - f->tensors] + offset;
    if (!pread_all(f->fd, dst, n, at, &eof))
        return k3_st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: tensor '%.200s': %s at byte %llu%s", f->path,
                         t->name, eof ? "the file ends early" : "read error", (unsigned long long)at,
                         eof ? " (it shrank or was truncated after it was opened)" : "");
    return K3_STATUS_SUCCESS;
}

void k3_st_close(k3_st_file *f) { file_free(f); }
int32_t k3_st_count(const k3_st_file *f) { return f ? f->count : 0; }
const k3_st_tensor *k3_st_at(const k3_st_file *f, int32_t i) {
    return f && i >= 0 && i < f->count ? &f->tensors[i] : NULL;
}
const k3_st_tensor *k3_st_find(const k3_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    const int32_t i = k3_st_index_get(&f->names, name);
    return i >= 0 ? &f->tensors[i] : NULL;
}
int32_t k3_st_metadata_count(const k3_st_file *f) { return f ? f->meta_count : 0; }
int k3_st_metadata_at(const k3_st_file *f, int32_t i, const char **key, const char **value) {
    if (!f || i < 0 || i >= f->meta_count) return 0;
    if (key) *key = f->meta[i].key;
    if (value) *value = f->meta[i].value;
    return 1;
}
const char *k3_st_metadata_get(const k3_st_file *f, const char *key) {
    if (!f || !key) return NULL;
    const int32_t i = k3_st_index_get(&f->meta_keys, key);
    return i >= 0 ? f->meta[i].value : NULL;
}
