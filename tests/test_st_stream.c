/* Streaming safetensors IO: the header-only open and range reads (k3_st_open_header, k3_st_read), and the
 * streaming writer (k3_st_writer_declare, k3_st_stream_*): bytes compared with what the test wrote, a file that
 * shrinks after it was opened, and a stream given too many or too few bytes, which must leave no file. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, truncate */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "test_util.h"

static char g_dir[256];

static void pattern(uint8_t *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)((i * 131u + seed * 7u + (i >> 8)) & 0xffu);
}

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* A file with tensors a (U8 [1000, 37]), b (F32 [5]) and an empty c (U8 [0]), through the streaming writer in
   pieces of `piece` bytes (a piece may span tensors). */
static int stream_file(const char *path, const uint8_t *a, const float *b, size_t piece, int extra, int short_by,
                       char *err, size_t n) {
    k3_st_writer *w = NULL;
    k3_st_writer_create(&w);
    const int64_t sa[2] = {1000, 37}, sb[1] = {5}, sc[1] = {0};
    int ok = k3_st_writer_declare(w, "a", K3_ST_U8, 2, sa, err, n) == K3_STATUS_SUCCESS &&
             k3_st_writer_declare(w, "b", K3_ST_F32, 1, sb, err, n) == K3_STATUS_SUCCESS &&
             k3_st_writer_declare(w, "c", K3_ST_U8, 1, sc, err, n) == K3_STATUS_SUCCESS &&
             k3_st_writer_set_metadata(w, "k", "v", err, n) == K3_STATUS_SUCCESS;
    CHECK(ok, "declare: %s", err);
    char e2[256];
    CHECK(k3_st_writer_save(w, path, e2, sizeof e2) == K3_STATUS_INVALID_ARGUMENT && strstr(e2, "declared"),
          "a writer with declared tensors is not saved whole: %s", e2);
    k3_st_stream *s = NULL;
    ok = ok && k3_st_stream_open(w, path, &s, err, n) == K3_STATUS_SUCCESS;
    k3_st_writer_destroy(w); /* the stream keeps what it needs */
    if (!ok) return 0;
    uint8_t all[37000 + 20 + 8];
    memcpy(all, a, 37000);
    memcpy(all + 37000, b, 20);
    memset(all + 37020, 0xEE, 8);
    const size_t total = 37020 - (size_t)short_by + (extra ? 8 : 0);
    CHECK(!strcmp(k3_st_stream_current(s), "a"), "the first byte is a's");
    for (size_t off = 0; off < total && ok; off += piece) {
        const size_t k = total - off < piece ? total - off : piece;
        ok = k3_st_stream_write(s, all + off, k, err, n) == K3_STATUS_SUCCESS;
    }
    if (!ok) {
        k3_st_stream_abort(s);
        return 0;
    }
    CHECK(k3_st_stream_written(s) == total, "written %llu", (unsigned long long)k3_st_stream_written(s));
    return k3_st_stream_commit(s, err, n) == K3_STATUS_SUCCESS;
}

static void test_stream_and_ranges(void) {
    uint8_t *a = malloc(37000);
    float b[5] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f};
    pattern(a, 37000, 1);
    char path[400], err[512];
    snprintf(path, sizeof path, "%s/s.safetensors", g_dir);
    const size_t pieces[3] = {1, 4093, 1 << 20};
    for (int k = 0; k < 3; k++) {
        CHECK(stream_file(path, a, b, pieces[k], 0, 0, err, sizeof err), "stream in pieces of %zu: %s", pieces[k],
              err);
        k3_st_file *f = NULL;
        CHECK(k3_st_open(path, &f, err, sizeof err) == K3_STATUS_SUCCESS, "read back: %s", err);
        if (!f) continue;
        const k3_st_tensor *ta = k3_st_find(f, "a"), *tb = k3_st_find(f, "b"), *tc = k3_st_find(f, "c");
        CHECK(ta && tb && tc && !memcmp(ta->data, a, 37000) && !memcmp(tb->data, b, 20) && tc->nbytes == 0,
              "pieces of %zu: the bytes as written", pieces[k]);
        const char *v = k3_st_metadata_get(f, "k");
        CHECK(v && !strcmp(v, "v"), "metadata");
        k3_st_close(f);
    }
    /* header-only open: no data, range reads anywhere in a tensor */
    k3_st_file *h = NULL;
    CHECK(k3_st_open_header(path, &h, err, sizeof err) == K3_STATUS_SUCCESS, "open_header: %s", err);
    if (h) {
        const k3_st_tensor *ta = k3_st_find(h, "a"), *tb = k3_st_find(h, "b");
        CHECK(ta && ta->data == NULL && ta->nbytes == 37000, "header only: data is NULL");
        uint8_t buf[4096];
        const uint64_t offs[4] = {0, 1, 12345, 37000 - 4096};
        for (int k = 0; k < 4; k++) {
            memset(buf, 0, sizeof buf);
            CHECK(k3_st_read(h, ta, offs[k], buf, sizeof buf, err, sizeof err) == K3_STATUS_SUCCESS &&
                      !memcmp(buf, a + offs[k], sizeof buf),
                  "range [%llu, +4096): %s", (unsigned long long)offs[k], err);
        }
        float fb[2];
        CHECK(k3_st_read(h, tb, 12, fb, 8, err, sizeof err) == K3_STATUS_SUCCESS && fb[0] == b[3] && fb[1] == b[4],
              "b[3..5)");
        CHECK(k3_st_read(h, ta, 37000 - 10, buf, 11, err, sizeof err) == K3_STATUS_INVALID_ARGUMENT &&
                  strstr(err, "'a'") && strstr(err, "outside"),
              "a range past the tensor: %s", err);
        /* the file shrinks under the open reader: its last tensor can no longer be read */
        struct stat sb;
        CHECK(stat(path, &sb) == 0 && truncate(path, sb.st_size - 10) == 0, "truncate");
        CHECK(k3_st_read(h, tb, 0, fb, 8, err, sizeof err) == K3_STATUS_SUCCESS, "bytes still there read fine");
        CHECK(k3_st_read(h, tb, 0, b, 20, err, sizeof err) == K3_STATUS_IO_ERROR && strstr(err, "tensor 'b'") &&
                  strstr(err, "ends early"),
              "a shrunken file: %s", err);
        k3_st_close(h);
        /* opened again, it is refused as truncated at open time */
        CHECK(k3_st_open_header(path, &h, err, sizeof err) == K3_STATUS_FORMAT_ERROR && strstr(err, "'b'") &&
                  strstr(err, "truncated"),
              "reopened: %s", err);
    }
    /* too many bytes: refused naming the total; too few: the commit names the tensor; neither leaves a file */
    unlink(path);
    CHECK(!stream_file(path, a, b, 1000, 1, 0, err, sizeof err) && strstr(err, "more than the tensors declared") &&
              !file_exists(path),
          "extra bytes: %s", err);
    CHECK(!stream_file(path, a, b, 1000, 0, 3, err, sizeof err) && strstr(err, "tensor 'b' got 17 of its 20") &&
              !file_exists(path),
          "missing bytes: %s", err);
    /* abort keeps an existing file as it was */
    CHECK(stream_file(path, a, b, 5000, 0, 0, err, sizeof err), "write: %s", err);
    struct stat before, after;
    stat(path, &before);
    k3_st_writer *w = NULL;
    k3_st_writer_create(&w);
    const int64_t one[1] = {4};
    k3_st_writer_declare(w, "x", K3_ST_U8, 1, one, err, sizeof err);
    k3_st_stream *s = NULL;
    CHECK(k3_st_stream_open(w, path, &s, err, sizeof err) == K3_STATUS_SUCCESS, "open: %s", err);
    k3_st_stream_abort(s);
    k3_st_writer_destroy(w);
    CHECK(stat(path, &after) == 0 && after.st_size == before.st_size && after.st_ino == before.st_ino,
          "abort leaves the old file");
    /* a writer holding data is not streamed */
    k3_st_writer_create(&w);
    k3_st_writer_add(w, "y", K3_ST_U8, 1, one, "abcd", err, sizeof err);
    CHECK(k3_st_stream_open(w, path, &s, err, sizeof err) == K3_STATUS_INVALID_ARGUMENT && s == NULL &&
              strstr(err, "declared tensors only"),
          "mixed writer: %s", err);
    k3_st_writer_destroy(w);
    free(a);
}

int main(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/k3_st_stream_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_stream_and_ranges();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return k3t_finish();
}
