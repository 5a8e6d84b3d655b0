/* Internals shared by the safetensors reader (st_read.c, st_json.c) and writer (st_write.c). */
#ifndef K3_IO_ST_COMMON_H
#define K3_IO_ST_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"

#define K3_ST_MAX_HEADER 100000000ull /* the reference implementation's limit */
#define K3_ST_MAX_DEPTH 64             /* nesting allowed in skipped (unknown) JSON values */

#define ST_TRY(expr)                                                                                         \
    do {                                                                                                     \
        k3_status st_try_ = (expr);                                                                          \
        if (st_try_ != K3_STATUS_SUCCESS) return st_try_;                                                    \
    } while (0)

typedef struct st_meta {
    char *key, *value;
} st_meta;

/* Writes the message into err (when given) and returns st. */
k3_status k3_st_err(char *err, size_t err_size, k3_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
/* Element count * element size with overflow checks; 0 on overflow (a non-empty tensor always has size > 0),
 * with *ok cleared. */
size_t k3_st_tensor_bytes(k3_st_dtype dtype, int32_t ndim, const int64_t *shape, int *ok);
/* Grows *arr (elements of elem bytes, capacity *cap) to hold need elements; 0 when out of memory. */
int k3_st_grow(void **arr, int32_t *cap, int32_t need, size_t elem);

/* The length (1..4) of the well-formed UTF-8 sequence at s[0..n), or 0 when it is not one (a stray
 * continuation byte, a truncated sequence, an overlong form, a surrogate U+D800..DFFF, or above U+10FFFF). */
size_t k3_st_utf8_seq(const unsigned char *s, size_t n);
/* The offset of the first byte of s that does not start a well-formed sequence, or (size_t)-1 when s is valid. */
size_t k3_st_utf8_bad(const char *s);

/* A name -> index hash table (open addressing, linear probing) so lookups and duplicate checks are O(1) per
 * name: a header may list over a million tensors, and a linear scan per tensor would take hours. The keys are
 * borrowed (owned by the file or writer, stable for the table's life). */
typedef struct st_slot {
    const char *key; /* NULL = empty */
    int32_t idx;
} st_slot;
typedef struct st_index {
    st_slot *slots;
    size_t cap; /* a power of two, or 0 */
    int32_t count;
} st_index;
/* The index stored for key, or -1 when absent. */
int32_t k3_st_index_get(const st_index *x, const char *key);
/* Adds key -> idx (the caller checked that key is absent); 0 when out of memory. */
int k3_st_index_put(st_index *x, const char *key, int32_t idx);
void k3_st_index_free(st_index *x);

/* The header's JSON parser (st_json.c): recursive descent, every index checked against the header's end. */
/* The parser's state: the header bytes [0, n), a cursor, and where to put a message. */
typedef struct jp {
    const char *s;
    size_t n, i;
    const char *path;
    char *err;
    size_t err_size;
    int plain; /* 0: a safetensors header (byte offsets count from the file's start, 8 + i); 1: a JSON file */
} jp;
k3_status k3_jp_fail(jp *p, const char *what);
void k3_jp_ws(jp *p);
int k3_jp_eat(jp *p, char c);
int k3_jp_hex4(jp *p, uint32_t *out);
k3_status k3_jp_string(jp *p, char **out);
k3_status k3_jp_uint(jp *p, const char *what, int64_t *out);
k3_status k3_jp_skip(jp *p, int depth);
/* An object key: a string and the ':' after it. On failure *out is NULL (nothing to free). */
k3_status k3_jp_key(jp *p, char **out);
/* An object of string keys and string values, {"k": "v", ...}: each pair goes to `pair`, which owns both strings
 * (and frees them when it fails). The messages: not_object when it is not an object, not_string when a value is
 * not a string; `what` names the object in the others. */
k3_status k3_jp_string_object(jp *p, const char *not_object, const char *not_string, const char *what,
                              k3_status (*pair)(void *user, jp *p, char *key, char *value), void *user);

/* ---- the writer's internals, shared by st_write.c (whole files) and st_stream.c (streamed ones) ---- */
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

/* A growable text buffer for the header. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

char *k3_st_dup(const char *s); /* NULL when out of memory */
/* Writes all n bytes (retrying short writes and EINTR); 0 with errno set on failure. */
int k3_st_write_all(int fd, const void *p, size_t n);
/* The header of w's entries and metadata (padded with spaces so the data section starts 8-byte aligned) into b,
   and its 8-byte length; b->p is the caller's to free. */
k3_status k3_st_build_header(const k3_st_writer *w, const char *path, sbuf *b, unsigned char lenb[8], char *err,
                             size_t err_size);
/* A fresh temporary file next to path (O_EXCL; path's mode kept when it exists). */
k3_status k3_st_tmp_create(const char *path, char **tmp_out, int *fd_out, char *err, size_t err_size);
/* ok: fsync, close, rename over path; else (or when one of those fails) unlink. Frees tmp. */
k3_status k3_st_tmp_finish(int fd, char *tmp, const char *path, int ok, int e, const char *step, char *err,
                           size_t err_size);

#endif
