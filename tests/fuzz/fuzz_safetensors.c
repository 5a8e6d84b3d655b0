/*
 * libFuzzer target: the safetensors reader. The input bytes are a file's whole content. They go to an anonymous
 * in-memory file (memfd; a tmpfile where memfd is missing) that k3_st_open reads through its /proc/self/fd path, so
 * the reader runs exactly as on a real file and the fuzzer leaves nothing on disk. Every tensor and metadata entry
 * of a file that opens is then walked, and the accessors are checked against each other, so a header the parser
 * accepts but describes wrongly (a size, a pointer outside the data) shows up too, not only a crash. The header-only
 * open (k3_st_open_header + k3_st_read) must accept the same files and give back the same bytes.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The scratch file is per process (each fuzz worker and the replay test are one process) and is reused: one file
 * descriptor, truncated and rewritten per input. */
static int scratch_fd(void) {
    static int fd = -1;
    if (fd >= 0) return fd;
#ifdef MFD_CLOEXEC
    fd = memfd_create("k3_fuzz_st", MFD_CLOEXEC);
#endif
    if (fd < 0) {
        FILE *fp = tmpfile(); /* kept open for the life of the process on purpose */
        if (fp) fd = fileno(fp);
    }
    if (fd < 0) {
        perror("fuzz_safetensors: no scratch file");
        abort();
    }
    return fd;
}

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_safetensors: accessor inconsistency: %s\n", what);
        abort();
    }
}

/* A header-only open describes the file as the whole-file open does, and k3_st_read gives back the same bytes:
 * the whole tensor, a range in the middle, and a range past the end refused. */
static void check_header_open(const k3_st_file *f, const k3_st_file *hf) {
    check(hf != NULL && k3_st_count(hf) == k3_st_count(f), "the header-only open lists another tensor count");
    check(k3_st_metadata_count(hf) == k3_st_metadata_count(f), "the header-only open lists other metadata");
    char err[512];
    for (int32_t i = 0; i < k3_st_count(f); i++) {
        const k3_st_tensor *t = k3_st_at(f, i), *h = k3_st_at(hf, i);
        check(h && !strcmp(h->name, t->name) && h->dtype == t->dtype && h->ndim == t->ndim && h->nbytes == t->nbytes &&
                  !memcmp(h->shape, t->shape, sizeof t->shape),
              "the header-only open describes a tensor differently");
        check(h->data == NULL, "a header-only tensor with data");
        if (t->nbytes == 0 || t->nbytes > (1u << 20)) continue;
        uint8_t *b = malloc(t->nbytes);
        if (!b) abort();
        check(k3_st_read(hf, h, 0, b, t->nbytes, err, sizeof err) == K3_STATUS_SUCCESS &&
                  !memcmp(b, t->data, t->nbytes),
              "k3_st_read of a whole tensor differs from the whole-file open's bytes");
        const size_t off = t->nbytes / 3, n = t->nbytes - off - t->nbytes / 4;
        check(k3_st_read(hf, h, off, b, n, err, sizeof err) == K3_STATUS_SUCCESS &&
                  !memcmp(b, (const uint8_t *)t->data + off, n),
              "k3_st_read of a range differs from the whole-file open's bytes");
        check(k3_st_read(hf, h, t->nbytes, b, 1, err, sizeof err) == K3_STATUS_INVALID_ARGUMENT && err[0] != '\0',
              "a read past the tensor's end was not refused with a message");
        free(b);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const int fd = scratch_fd();
    if (ftruncate(fd, 0) != 0) abort();
    size_t done = 0;
    while (done < size) {
        const ssize_t w = pwrite(fd, data + done, size - done, (off_t)done);
        if (w <= 0) abort();
        done += (size_t)w;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);

    char err[512];
    k3_st_file *f = NULL;
    const k3_status st = k3_st_open(path, &f, err, sizeof err);
    /* the header-only open accepts exactly what the whole-file open accepts */
    char herr[512];
    k3_st_file *hf = NULL;
    const k3_status hst = k3_st_open_header(path, &hf, herr, sizeof herr);
    check((st == K3_STATUS_SUCCESS) == (hst == K3_STATUS_SUCCESS), "the two opens disagree on whether the file is valid");
    if (st != K3_STATUS_SUCCESS) {
        check(f == NULL, "*out not NULL on failure");
        check(err[0] != '\0', "failure without a message");
        check(hf == NULL && herr[0] != '\0', "a failed header-only open without a message, or with a file");
        return 0;
    }
    check_header_open(f, hf);
    k3_st_close(hf);
    check(f != NULL, "success without a file");

    const int32_t n = k3_st_count(f);
    check(n >= 0, "negative tensor count");
    size_t total = 0;
    for (int32_t i = 0; i < n; ++i) {
        const k3_st_tensor *t = k3_st_at(f, i);
        check(t != NULL && t->name != NULL, "k3_st_at in range returned NULL");
        check(k3_st_find(f, t->name) == t, "k3_st_find does not return the tensor of that name");
        check(t->ndim >= 0 && t->ndim <= K3_ST_MAX_DIMS, "ndim out of range");
        const size_t es = k3_st_dtype_size(t->dtype);
        check(es > 0, "unknown dtype accepted");
        size_t elems = 1;
        for (int32_t d = 0; d < t->ndim; ++d) {
            check(t->shape[d] >= 0, "negative dimension accepted");
            check(!__builtin_mul_overflow(elems, (size_t)t->shape[d], &elems), "element count overflows");
        }
        size_t nb = 0;
        check(!__builtin_mul_overflow(elems, es, &nb) && nb == t->nbytes, "nbytes is not elements x size");
        check(!__builtin_add_overflow(total, t->nbytes, &total), "tensor sizes overflow");
        if (t->nbytes > 0) {
            check(t->data != NULL, "tensor with bytes but no data");
            check((uintptr_t)t->data % es == 0, "tensor data not aligned to its element size");
            /* Touch the first and the last byte: ASan reports a pointer outside the data section. */
            volatile uint8_t sink = ((const uint8_t *)t->data)[0];
            sink ^= ((const uint8_t *)t->data)[t->nbytes - 1];
            (void)sink;
        }
        (void)strlen(t->name);
        (void)k3_st_dtype_name(t->dtype);
    }
    check(total <= size, "tensors larger than the file");
    check(k3_st_at(f, n) == NULL && k3_st_at(f, -1) == NULL, "k3_st_at out of range is not NULL");

    const int32_t nm = k3_st_metadata_count(f);
    check(nm >= 0, "negative metadata count");
    for (int32_t i = 0; i < nm; ++i) {
        const char *key = NULL, *value = NULL;
        check(k3_st_metadata_at(f, i, &key, &value) != 0 && key != NULL && value != NULL,
              "k3_st_metadata_at in range failed");
        const char *got = k3_st_metadata_get(f, key);
        check(got != NULL && strcmp(got, value) == 0, "k3_st_metadata_get disagrees with k3_st_metadata_at");
    }
    const char *key = NULL, *value = NULL;
    check(k3_st_metadata_at(f, nm, &key, &value) == 0, "k3_st_metadata_at out of range succeeded");
    k3_st_close(f);
    return 0;
}
