/*
 * safetensors reader and writer. The header is parsed by a small recursive-descent JSON parser that checks
 * every byte index against the header's end, so a malformed or truncated file is an error, never an over-read.
 */
#include "core/safetensors.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define K3_ST_MAX_HEADER 100000000ull /* the reference implementation's limit */
#define K3_ST_MAX_DEPTH 64             /* nesting allowed in skipped (unknown) JSON values */

#define ST_TRY(expr)                                                                                         \
    do {                                                                                                     \
        k3_status st_try_ = (expr);                                                                          \
        if (st_try_ != K3_STATUS_SUCCESS) return st_try_;                                                    \
    } while (0)

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

static k3_status st_err(char *err, size_t err_size, k3_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static k3_status st_err(char *err, size_t err_size, k3_status st, const char *fmt, ...) {
    if (err && err_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_size, fmt, ap);
        va_end(ap);
    }
    return st;
}

/* Element count * element size with overflow checks; 0 on overflow (a non-empty tensor always has size > 0),
 * with *ok cleared. */
static size_t tensor_bytes(k3_st_dtype dtype, int32_t ndim, const int64_t *shape, int *ok) {
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

/* ================================================================= reader ================================ */

typedef struct st_meta {
    char *key, *value;
} st_meta;

struct k3_st_file {
    k3_st_tensor *tensors; /* sorted by data offset */
    int32_t count;
    st_meta *meta;
    int32_t meta_count;
    unsigned char *data;   /* the data section */
    void **copies;         /* aligned copies of misaligned tensors */
    int32_t copy_count;
};

/* The parser's state: the header bytes [0, n), a cursor, and where to put a message. */
typedef struct jp {
    const char *s;
    size_t n, i;
    const char *path;
    char *err;
    size_t err_size;
} jp;

/* The header starts at file byte 8, so JSON position i is file offset 8 + i. */
static k3_status jp_fail(jp *p, const char *what) {
    return st_err(p->err, p->err_size, K3_STATUS_FORMAT_ERROR, "%s: header JSON at byte %zu: %s", p->path,
                  (size_t)8 + p->i, what);
}

static void jp_ws(jp *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

/* Consumes character c (after whitespace) or fails. */
static int jp_eat(jp *p, char c) {
    jp_ws(p);
    if (p->i < p->n && p->s[p->i] == c) {
        p->i++;
        return 1;
    }
    return 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int jp_hex4(jp *p, uint32_t *out) {
    if (p->n - p->i < 4) return 0;
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(p->s[p->i + (size_t)k]);
        if (h < 0) return 0;
        v = v * 16u + (uint32_t)h;
    }
    p->i += 4;
    *out = v;
    return 1;
}

/* Parses a JSON string into a fresh NUL-terminated UTF-8 buffer (*out, owned by the caller). */
static k3_status jp_string(jp *p, char **out) {
    *out = NULL;
    jp_ws(p);
    if (p->i >= p->n || p->s[p->i] != '"') return jp_fail(p, "expected a string");
    p->i++;
    size_t start = p->i;
    /* an escaped string never grows: \uXXXX (6 bytes) becomes at most 3 bytes, a surrogate pair (12) 4 */
    size_t end = start;
    while (end < p->n && p->s[end] != '"') end += (p->s[end] == '\\') ? 2 : 1;
    if (end >= p->n) return jp_fail(p, "unterminated string");
    char *buf = malloc(end - start + 1);
    if (!buf) return st_err(p->err, p->err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory", p->path);
    size_t o = 0;
    while (p->i < p->n && p->s[p->i] != '"') {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c < 0x20) {
            free(buf);
            return jp_fail(p, "control character in a string");
        }
        if (c != '\\') {
            buf[o++] = (char)c;
            p->i++;
            continue;
        }
        p->i++;
        if (p->i >= p->n) break;
        char e = p->s[p->i++];
        switch (e) {
        case '"': buf[o++] = '"'; break;
        case '\\': buf[o++] = '\\'; break;
        case '/': buf[o++] = '/'; break;
        case 'b': buf[o++] = '\b'; break;
        case 'f': buf[o++] = '\f'; break;
        case 'n': buf[o++] = '\n'; break;
        case 'r': buf[o++] = '\r'; break;
        case 't': buf[o++] = '\t'; break;
        case 'u': {
            uint32_t cp = 0, lo = 0;
            if (!jp_hex4(p, &cp)) goto bad_escape;
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* a high surrogate must be followed by a low one */
                if (p->n - p->i < 2 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') goto bad_escape;
                p->i += 2;
                if (!jp_hex4(p, &lo) || lo < 0xDC00 || lo > 0xDFFF) goto bad_escape;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                goto bad_escape;
            }
            if (cp == 0) {
                free(buf);
                return jp_fail(p, "a string contains \\u0000");
            }
            if (cp < 0x80) {
                buf[o++] = (char)cp;
            } else if (cp < 0x800) {
                buf[o++] = (char)(0xC0 | (cp >> 6));
                buf[o++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                buf[o++] = (char)(0xE0 | (cp >> 12));
                buf[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                buf[o++] = (char)(0x80 | (cp & 0x3F));
            } else {
                buf[o++] = (char)(0xF0 | (cp >> 18));
                buf[o++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                buf[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                buf[o++] = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default:
            goto bad_escape;
        }
    }
    if (p->i >= p->n) {
        free(buf);
        return jp_fail(p, "unterminated string");
    }
    p->i++; /* closing quote */
    buf[o] = '\0';
    *out = buf;
    return K3_STATUS_SUCCESS;
bad_escape:
    free(buf);
    return jp_fail(p, "bad escape sequence in a string");
}

/* A non-negative JSON integer (no sign, fraction or exponent) up to INT64_MAX. */
static k3_status jp_uint(jp *p, const char *what, int64_t *out) {
    jp_ws(p);
    size_t start = p->i;
    if (p->i < p->n && p->s[p->i] == '-') {
        char msg[160];
        snprintf(msg, sizeof msg, "%s must not be negative", what);
        return jp_fail(p, msg);
    }
    uint64_t v = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        uint64_t d = (uint64_t)(p->s[p->i] - '0');
        if (v > ((uint64_t)INT64_MAX - d) / 10) {
            char msg[160];
            snprintf(msg, sizeof msg, "%s is too large", what);
            return jp_fail(p, msg);
        }
        v = v * 10 + d;
        p->i++;
    }
    if (p->i == start || (p->i - start > 1 && p->s[start] == '0') ||
        (p->i < p->n && (p->s[p->i] == '.' || p->s[p->i] == 'e' || p->s[p->i] == 'E'))) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s must be a non-negative integer", what);
        return jp_fail(p, msg);
    }
    *out = (int64_t)v;
    return K3_STATUS_SUCCESS;
}

/* Skips any JSON value (for keys we do not use), depth-limited. */
static k3_status jp_skip(jp *p, int depth) {
    if (depth > K3_ST_MAX_DEPTH) return jp_fail(p, "JSON nested too deeply");
    jp_ws(p);
    if (p->i >= p->n) return jp_fail(p, "unexpected end of header");
    char c = p->s[p->i];
    if (c == '"') {
        char *s = NULL;
        k3_status st = jp_string(p, &s);
        free(s);
        return st;
    }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        p->i++;
        if (jp_eat(p, close)) return K3_STATUS_SUCCESS;
        for (;;) {
            if (c == '{') {
                char *k = NULL;
                ST_TRY(jp_string(p, &k));
                free(k);
                if (!jp_eat(p, ':')) return jp_fail(p, "expected ':'");
            }
            ST_TRY(jp_skip(p, depth + 1));
            if (jp_eat(p, ',')) continue;
            if (jp_eat(p, close)) return K3_STATUS_SUCCESS;
            return jp_fail(p, c == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
        }
    }
    static const char *const lits[3] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t ln = strlen(lits[k]);
        if (c == lits[k][0]) {
            if (p->n - p->i < ln || memcmp(p->s + p->i, lits[k], ln) != 0) return jp_fail(p, "bad JSON literal");
            p->i += ln;
            return K3_STATUS_SUCCESS;
        }
    }
    /* a number: -?digits(.digits)?([eE][+-]?digits)? */
    size_t start = p->i, nd = 0;
    if (p->s[p->i] == '-') p->i++;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++, nd++;
    if (nd && p->i < p->n && p->s[p->i] == '.') {
        size_t fd = 0;
        p->i++;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++, fd++;
        if (!fd) nd = 0;
    }
    if (nd && p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        size_t ed = 0;
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++, ed++;
        if (!ed) nd = 0;
    }
    if (!nd) {
        p->i = start;
        return jp_fail(p, "expected a JSON value");
    }
    return K3_STATUS_SUCCESS;
}

static void file_free(k3_st_file *f) {
    if (!f) return;
    for (int32_t i = 0; i < f->count; i++) free((char *)f->tensors[i].name);
    free(f->tensors);
    for (int32_t i = 0; i < f->meta_count; i++) {
        free(f->meta[i].key);
        free(f->meta[i].value);
    }
    free(f->meta);
    for (int32_t i = 0; i < f->copy_count; i++) free(f->copies[i]);
    free(f->copies);
    free(f->data);
    free(f);
}

/* Tensor entries as parsed, before their data pointers are set. */
typedef struct st_entry {
    k3_st_tensor t;
    int64_t begin, end;
} st_entry;

static int grow(void **arr, int32_t *cap, int32_t need, size_t elem) {
    if (need <= *cap) return 1;
    int32_t nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    void *na = realloc(*arr, (size_t)nc * elem);
    if (!na) return 0;
    *arr = na;
    *cap = nc;
    return 1;
}

/* Parses {"dtype": ..., "shape": [...], "data_offsets": [b, e]} for tensor `name`. */
static k3_status parse_tensor(jp *p, const char *name, st_entry *e) {
    char msg[512];
    int have_dtype = 0, have_shape = 0, have_off = 0;
    if (!jp_eat(p, '{')) {
        snprintf(msg, sizeof msg, "tensor '%.200s': expected an object", name);
        return jp_fail(p, msg);
    }
    if (!jp_eat(p, '}')) {
        for (;;) {
            char *key = NULL;
            ST_TRY(jp_string(p, &key));
            if (!jp_eat(p, ':')) {
                free(key);
                return jp_fail(p, "expected ':'");
            }
            k3_status st = K3_STATUS_SUCCESS;
            int dup = 0;
            if (!strcmp(key, "dtype")) {
                dup = have_dtype++;
                char *dt = NULL;
                st = jp_string(p, &dt);
                if (st == K3_STATUS_SUCCESS) {
                    int found = -1;
                    for (int k = 0; k < K3_ST_NDTYPES; k++)
                        if (!strcmp(dt, k3_st_dtypes[k].name)) found = k;
                    if (found < 0) {
                        snprintf(msg, sizeof msg,
                                 "tensor '%.200s': unsupported dtype '%.40s' (supported: BF16 F16 F32 F64 I32 I64 "
                                 "U8 F8_E4M3)",
                                 name, dt);
                        st = jp_fail(p, msg);
                    }
                    e->t.dtype = (k3_st_dtype)(found < 0 ? 0 : found);
                }
                free(dt);
            } else if (!strcmp(key, "shape")) {
                dup = have_shape++;
                if (!jp_eat(p, '[')) {
                    snprintf(msg, sizeof msg, "tensor '%.200s': shape must be an array", name);
                    st = jp_fail(p, msg);
                } else if (!jp_eat(p, ']')) {
                    for (;;) {
                        if (e->t.ndim >= K3_ST_MAX_DIMS) {
                            snprintf(msg, sizeof msg, "tensor '%.200s': more than %d dimensions", name,
                                     K3_ST_MAX_DIMS);
                            st = jp_fail(p, msg);
                            break;
                        }
                        snprintf(msg, sizeof msg, "tensor '%.200s': shape[%d]", name, e->t.ndim);
                        st = jp_uint(p, msg, &e->t.shape[e->t.ndim]);
                        if (st != K3_STATUS_SUCCESS) break;
                        e->t.ndim++;
                        if (jp_eat(p, ',')) continue;
                        if (jp_eat(p, ']')) break;
                        st = jp_fail(p, "expected ',' or ']' in shape");
                        break;
                    }
                }
            } else if (!strcmp(key, "data_offsets")) {
                dup = have_off++;
                snprintf(msg, sizeof msg, "tensor '%.200s': data_offsets", name);
                if (!jp_eat(p, '[')) st = jp_fail(p, "data_offsets must be an array of two integers");
                if (st == K3_STATUS_SUCCESS) st = jp_uint(p, msg, &e->begin);
                if (st == K3_STATUS_SUCCESS && !jp_eat(p, ','))
                    st = jp_fail(p, "data_offsets must be an array of two integers");
                if (st == K3_STATUS_SUCCESS) st = jp_uint(p, msg, &e->end);
                if (st == K3_STATUS_SUCCESS && !jp_eat(p, ']'))
                    st = jp_fail(p, "data_offsets must be an array of two integers");
            } else {
                st = jp_skip(p, 1); /* tolerate keys a future writer may add */
            }
            if (st == K3_STATUS_SUCCESS && dup) {
                snprintf(msg, sizeof msg, "tensor '%.200s': duplicate key '%.40s'", name, key);
                st = jp_fail(p, msg);
            }
            free(key);
            if (st != K3_STATUS_SUCCESS) return st;
            if (jp_eat(p, ',')) continue;
            if (jp_eat(p, '}')) break;
            return jp_fail(p, "expected ',' or '}'");
        }
    }
    if (!have_dtype || !have_shape || !have_off) {
        snprintf(msg, sizeof msg, "tensor '%.200s': missing %s", name,
                 !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");
        return jp_fail(p, msg);
    }
    return K3_STATUS_SUCCESS;
}

static k3_status parse_metadata(jp *p, k3_st_file *f) {
    int32_t cap = 0;
    if (!jp_eat(p, '{')) return jp_fail(p, "__metadata__ must be an object of strings");
    if (jp_eat(p, '}')) return K3_STATUS_SUCCESS;
    for (;;) {
        char *k = NULL, *v = NULL;
        ST_TRY(jp_string(p, &k));
        if (!jp_eat(p, ':')) {
            free(k);
            return jp_fail(p, "expected ':'");
        }
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] != '"') {
            free(k);
            return jp_fail(p, "__metadata__ values must be strings");
        }
        k3_status st = jp_string(p, &v);
        if (st != K3_STATUS_SUCCESS) {
            free(k);
            return st;
        }
        for (int32_t i = 0; i < f->meta_count; i++)
            if (!strcmp(f->meta[i].key, k)) {
                free(k);
                free(v);
                return jp_fail(p, "duplicate key in __metadata__");
            }
        if (!grow((void **)&f->meta, &cap, f->meta_count + 1, sizeof(st_meta))) {
            free(k);
            free(v);
            return st_err(p->err, p->err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory", p->path);
        }
        f->meta[f->meta_count].key = k;
        f->meta[f->meta_count].value = v;
        f->meta_count++;
        if (jp_eat(p, ',')) continue;
        if (jp_eat(p, '}')) return K3_STATUS_SUCCESS;
        return jp_fail(p, "expected ',' or '}' in __metadata__");
    }
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
    if (!jp_eat(p, '{')) return jp_fail(p, "the header must be a JSON object");
    if (!jp_eat(p, '}')) {
        for (;;) {
            char *name = NULL;
            st = jp_string(p, &name);
            if (st != K3_STATUS_SUCCESS) break;
            if (!jp_eat(p, ':')) {
                free(name);
                st = jp_fail(p, "expected ':'");
                break;
            }
            if (!strcmp(name, "__metadata__")) {
                free(name);
                if (have_meta++) {
                    st = jp_fail(p, "duplicate __metadata__");
                    break;
                }
                st = parse_metadata(p, f);
                if (st != K3_STATUS_SUCCESS) break;
            } else {
                if (count >= INT32_MAX - 1 || !grow((void **)&ents, &cap, count + 1, sizeof(st_entry))) {
                    free(name);
                    st = st_err(p->err, p->err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory", p->path);
                    break;
                }
                st_entry *e = &ents[count];
                memset(e, 0, sizeof *e);
                e->t.name = name;
                count++;
                st = parse_tensor(p, name, e);
                if (st != K3_STATUS_SUCCESS) break;
            }
            if (jp_eat(p, ',')) continue;
            if (jp_eat(p, '}')) break;
            st = jp_fail(p, "expected ',' or '}'");
            break;
        }
    }
    if (st == K3_STATUS_SUCCESS) {
        jp_ws(p);
        if (p->i != p->n) st = jp_fail(p, "trailing bytes after the header object (only spaces may pad it)");
    }
    /* per-tensor sizes */
    for (int32_t i = 0; st == K3_STATUS_SUCCESS && i < count; i++) {
        st_entry *e = &ents[i];
        int ok = 1;
        size_t nb = tensor_bytes(e->t.dtype, e->t.ndim, e->t.shape, &ok);
        if (!ok)
            st = st_err(p->err, p->err_size, K3_STATUS_FORMAT_ERROR, "%s: tensor '%.200s': byte size overflows",
                        p->path, e->t.name);
        else if (e->end < e->begin)
            st = st_err(p->err, p->err_size, K3_STATUS_FORMAT_ERROR,
                        "%s: tensor '%.200s': data_offsets [%lld, %lld] end before they begin", p->path, e->t.name,
                        (long long)e->begin, (long long)e->end);
        else if ((uint64_t)(e->end - e->begin) != (uint64_t)nb)
            st = st_err(p->err, p->err_size, K3_STATUS_FORMAT_ERROR,
                        "%s: tensor '%.200s': data_offsets [%lld, %lld] span %lld bytes but %s shape needs %zu",
                        p->path, e->t.name, (long long)e->begin, (long long)e->end,
                        (long long)(e->end - e->begin), k3_st_dtype_name(e->t.dtype), nb);
        else if ((uint64_t)e->end > data_size)
            st = st_err(p->err, p->err_size, K3_STATUS_FORMAT_ERROR,
                        "%s: tensor '%.200s': data_offsets end %lld is past the data section (%llu bytes; "
                        "truncated file?)",
                        p->path, e->t.name, (long long)e->end, (unsigned long long)data_size);
        e->t.nbytes = nb;
    }
    /* duplicate names */
    if (st == K3_STATUS_SUCCESS && count > 1) {
        st_entry **byname = malloc((size_t)count * sizeof *byname);
        if (!byname) {
            st = st_err(p->err, p->err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory", p->path);
        } else {
            for (int32_t i = 0; i < count; i++) byname[i] = &ents[i];
            qsort(byname, (size_t)count, sizeof *byname, cmp_name);
            for (int32_t i = 1; i < count && st == K3_STATUS_SUCCESS; i++)
                if (!strcmp(byname[i]->t.name, byname[i - 1]->t.name))
                    st = st_err(p->err, p->err_size, K3_STATUS_FORMAT_ERROR, "%s: duplicate tensor name '%.200s'",
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
                st = st_err(p->err, p->err_size, K3_STATUS_FORMAT_ERROR,
                            "%s: tensor '%.200s': data_offsets [%lld, %lld] overlap the previous tensor '%.200s'",
                            p->path, ents[i].t.name, (long long)ents[i].begin, (long long)ents[i].end,
                            ents[i - 1].t.name);
            else if (b > pos)
                st = st_err(p->err, p->err_size, K3_STATUS_FORMAT_ERROR,
                            "%s: tensor '%.200s': data_offsets begin %lld leaves a hole after byte %llu", p->path,
                            ents[i].t.name, (long long)ents[i].begin, (unsigned long long)pos);
            pos = (uint64_t)ents[i].end;
        }
        if (st == K3_STATUS_SUCCESS && pos != data_size)
            st = st_err(p->err, p->err_size, K3_STATUS_FORMAT_ERROR,
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

k3_status k3_st_open(const char *path, k3_st_file **out, char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!out) return st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_open: out must not be NULL");
    *out = NULL;
    if (!path) return st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_open: path must not be NULL");
    FILE *fp = fopen(path, "rb");
    if (!fp) return st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: cannot open: %s", path, strerror(errno));
    k3_status st = K3_STATUS_SUCCESS;
    k3_st_file *f = NULL;
    char *header = NULL;
    st_entry *ents = NULL;
    int64_t *offsets = NULL;
    long long fsize = -1;
    if (fseek(fp, 0, SEEK_END) == 0) fsize = (long long)ftell(fp);
    if (fsize < 0 || fseek(fp, 0, SEEK_SET) != 0) {
        st = st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: cannot determine the file size", path);
        goto done;
    }
    unsigned char lenb[8];
    if (fsize >= 8 && fread(lenb, 1, 8, fp) != 8) {
        st = st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: cannot read: %s", path, strerror(errno));
        goto done;
    }
    if (fsize < 8) {
        st = st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                    "%s: %lld bytes is too short for a safetensors file (8-byte header length)", path, fsize);
        goto done;
    }
    uint64_t hlen = 0;
    for (int k = 7; k >= 0; k--) hlen = (hlen << 8) | lenb[k];
    if (hlen > K3_ST_MAX_HEADER) {
        st = st_err(err, err_size, K3_STATUS_FORMAT_ERROR, "%s: header length %llu exceeds the %llu-byte limit",
                    path, (unsigned long long)hlen, K3_ST_MAX_HEADER);
        goto done;
    }
    if (hlen > (uint64_t)fsize - 8) {
        st = st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                    "%s: header length %llu is larger than the rest of the file (%lld bytes; truncated?)", path,
                    (unsigned long long)hlen, fsize - 8);
        goto done;
    }
    if (hlen < 2) {
        st = st_err(err, err_size, K3_STATUS_FORMAT_ERROR, "%s: header length %llu is too short for a JSON object",
                    path, (unsigned long long)hlen);
        goto done;
    }
    header = malloc((size_t)hlen);
    f = calloc(1, sizeof *f);
    if (!header || !f) {
        st = st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory reading the header", path);
        goto done;
    }
    if (fread(header, 1, (size_t)hlen, fp) != (size_t)hlen) {
        st = st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: read error in the header", path);
        goto done;
    }
    uint64_t data_size = (uint64_t)fsize - 8 - hlen;
    jp p = {header, (size_t)hlen, 0, path, err, err_size};
    st = parse_header(&p, data_size, f, &ents);
    if (st != K3_STATUS_SUCCESS) goto done;
    /* f owns the names from here on, so every later failure is a plain file_free */
    f->tensors = calloc((size_t)(f->count ? f->count : 1), sizeof *f->tensors);
    offsets = malloc((size_t)(f->count ? f->count : 1) * sizeof *offsets);
    if (!f->tensors || !offsets) {
        for (int32_t i = 0; i < f->count; i++) free((char *)ents[i].t.name);
        free(ents);
        f->count = 0;
        st = st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
        goto done;
    }
    for (int32_t i = 0; i < f->count; i++) {
        f->tensors[i] = ents[i].t;
        offsets[i] = ents[i].begin;
    }
    free(ents);

    f->data = malloc(data_size ? (size_t)data_size : 1);
    if (!f->data) {
        st = st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory for %llu bytes of tensor data", path,
                    (unsigned long long)data_size);
        goto done;
    }
    if (data_size && fread(f->data, 1, (size_t)data_size, fp) != (size_t)data_size) {
        st = st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: read error in the data section", path);
        goto done;
    }
    int32_t copy_cap = 0;
    for (int32_t i = 0; i < f->count; i++) {
        k3_st_tensor *t = &f->tensors[i];
        const unsigned char *d = f->data + (size_t)offsets[i];
        size_t esz = k3_st_dtype_size(t->dtype);
        if (t->nbytes && ((uintptr_t)d % esz) != 0) { /* only a foreign writer's odd layout gets here: copy */
            void *c = malloc(t->nbytes);
            if (!c || !grow((void **)&f->copies, &copy_cap, f->copy_count + 1, sizeof(void *))) {
                free(c);
                st = st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
                goto done;
            }
            memcpy(c, d, t->nbytes);
            f->copies[f->copy_count++] = c;
            d = c;
        }
        t->data = d;
    }
done:
    free(offsets);
    free(header);
    fclose(fp);
    if (st != K3_STATUS_SUCCESS) {
        file_free(f);
        return st;
    }
    *out = f;
    return K3_STATUS_SUCCESS;
}

void k3_st_close(k3_st_file *f) { file_free(f); }
int32_t k3_st_count(const k3_st_file *f) { return f ? f->count : 0; }
const k3_st_tensor *k3_st_at(const k3_st_file *f, int32_t i) {
    return f && i >= 0 && i < f->count ? &f->tensors[i] : NULL;
}
const k3_st_tensor *k3_st_find(const k3_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    for (int32_t i = 0; i < f->count; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
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
    for (int32_t i = 0; i < f->meta_count; i++)
        if (!strcmp(f->meta[i].key, key)) return f->meta[i].value;
    return NULL;
}

/* ================================================================= writer ================================ */

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
    if (!w) return st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_writer_add: writer is NULL");
    if (!name || !name[0])
        return st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_writer_add: name must be non-empty");
    if (!strcmp(name, "__metadata__"))
        return st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "tensor name '__metadata__' is reserved");
    if (k3_st_dtype_size(dtype) == 0)
        return st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "tensor '%.200s': unknown dtype %d", name,
                      (int)dtype);
    if (ndim < 0 || ndim > K3_ST_MAX_DIMS || (ndim > 0 && !shape))
        return st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT,
                      "tensor '%.200s': ndim %d must be 0..%d with a shape array", name, (int)ndim, K3_ST_MAX_DIMS);
    for (int32_t i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "tensor '%.200s': shape[%d] = %lld is negative",
                          name, (int)i, (long long)shape[i]);
    int ok = 1;
    size_t nb = tensor_bytes(dtype, ndim, shape, &ok);
    if (!ok) return st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "tensor '%.200s': byte size overflows", name);
    if (nb && !data)
        return st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "tensor '%.200s': data is NULL for %zu bytes", name,
                      nb);
    for (int32_t i = 0; i < w->count; i++)
        if (!strcmp(w->ents[i].name, name))
            return st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "duplicate tensor name '%.200s'", name);
    if (!grow((void **)&w->ents, &w->cap, w->count + 1, sizeof(st_wentry)))
        return st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "out of memory");
    st_wentry *e = &w->ents[w->count];
    memset(e, 0, sizeof *e);
    e->name = dup_str(name);
    e->data = malloc(nb ? nb : 1);
    if (!e->name || !e->data) {
        free(e->name);
        free(e->data);
        return st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "tensor '%.200s': out of memory for %zu bytes", name,
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
        return st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_writer_set_metadata: NULL argument");
    char *v = dup_str(value);
    if (!v) return st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int32_t i = 0; i < w->meta_count; i++)
        if (!strcmp(w->meta[i].key, key)) {
            free(w->meta[i].value);
            w->meta[i].value = v;
            return K3_STATUS_SUCCESS;
        }
    char *k = dup_str(key);
    if (!k || !grow((void **)&w->meta, &w->meta_cap, w->meta_count + 1, sizeof(st_meta))) {
        free(k);
        free(v);
        return st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "out of memory");
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
    if (!w || !path) return st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_st_writer_save: NULL argument");
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
        return st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory building the header", path);
    }
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        free(b.p);
        return st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: cannot create: %s", path, strerror(errno));
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
        return st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: write failed: %s", path,
                      err_no ? strerror(err_no) : "short write");
    }
    return K3_STATUS_SUCCESS;
}
