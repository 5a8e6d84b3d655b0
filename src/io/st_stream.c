/* The streaming safetensors writer: declared tensors, the header written first, the bytes in order, then the
 * writer's temp + fsync + rename (st_write.c). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/st_common.h"

struct k3_st_stream {
    int fd;
    char *tmp, *path;
    char **names; /* copies: the writer may be gone */
    size_t *sizes;
    int32_t count, cur; /* cur: the tensor the next byte belongs to */
    size_t cur_done;    /* bytes of tensor cur already written */
    uint64_t written;
    int dead; /* a write failed: only abort is left */
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

k3_status k3_st_stream_open(const k3_st_writer *w, const char *path, k3_st_stream **out, char *err, size_t err_size) {
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
    s->path = k3_st_dup(path);
    int fail = !s->names || !s->sizes || !s->path;
    for (int32_t i = 0; !fail && i < w->count; i++) {
        s->names[i] = k3_st_dup(w->ents[i].name);
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
    k3_status st = k3_st_build_header(w, path, &b, lenb, err, err_size);
    if (st == K3_STATUS_SUCCESS) st = k3_st_tmp_create(path, &s->tmp, &s->fd, err, err_size);
    if (st == K3_STATUS_SUCCESS && !(k3_st_write_all(s->fd, lenb, 8) && k3_st_write_all(s->fd, b.p, b.n))) {
        st = k3_st_tmp_finish(s->fd, s->tmp, path, 0, errno, "write failed", err, err_size);
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
    if (s->dead) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "%s: an earlier write failed", s->path);
    const unsigned char *c = data;
    while (n) {
        if (s->cur >= s->count) {
            s->dead = 1;
            return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT,
                             "%s: %zu bytes more than the tensors declared (%llu bytes)", s->path, n,
                             (unsigned long long)s->written);
        }
        const size_t room = s->sizes[s->cur] - s->cur_done, k = n < room ? n : room;
        if (!k3_st_write_all(s->fd, c, k)) {
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

const char *k3_st_stream_current(const k3_st_stream *s) { return s && s->cur < s->count ? s->names[s->cur] : NULL; }

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
        (void)k3_st_tmp_finish(s->fd, s->tmp, s->path, 0, 0, "", sub, sizeof sub);
    } else {
        st = k3_st_tmp_finish(s->fd, s->tmp, s->path, 1, 0, "", err, err_size);
    }
    s->tmp = NULL; /* tmp_finish freed it */
    stream_free(s);
    return st;
}

void k3_st_stream_abort(k3_st_stream *s) {
    if (!s) return;
    if (s->tmp) {
        char sub[8];
        (void)k3_st_tmp_finish(s->fd, s->tmp, s->path, 0, 0, "", sub, sizeof sub);
        s->tmp = NULL;
    }
    stream_free(s);
}
