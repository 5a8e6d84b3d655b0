/*
 * What the checkpoint fuzz targets share: the per-process scratch file (an anonymous memfd, a tmpfile where memfd
 * is missing) that holds each input so the readers run on a real file descriptor path, and the consistency check
 * that aborts (libFuzzer and the replay test then report the input).
 */
#ifndef K3_TESTS_FUZZ_UTIL_H
#define K3_TESTS_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

/* FUZZ_TRACE(...) prints what an input did when the target is built with -DFUZZ_TRACE (to see which seeds reach
 * which status); otherwise nothing. */
#ifdef FUZZ_TRACE
#define FUZZ_TRACE_PRINT(...) fprintf(stderr, __VA_ARGS__)
#else
#define FUZZ_TRACE_PRINT(...) ((void)0)
#endif

/* Aborts with a message naming the target and the broken promise. */
static void fuzz_check(const char *target, int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "%s: inconsistency: %s\n", target, what);
        abort();
    }
}

/* The scratch file, opened once per process (each fuzz worker and the replay test are one process). */
static int fuzz_scratch_fd(const char *target) {
    static int fd = -1;
    if (fd >= 0) return fd;
#ifdef MFD_CLOEXEC
    fd = memfd_create(target, MFD_CLOEXEC);
#endif
    if (fd < 0) {
        FILE *fp = tmpfile(); /* kept open for the life of the process on purpose */
        if (fp) fd = fileno(fp);
    }
    if (fd < 0) {
        perror(target);
        abort();
    }
    return fd;
}

/* Replaces the scratch file's content with bytes [0, n) and writes its /proc/self/fd path to path. */
static void fuzz_scratch_write(const char *target, const uint8_t *bytes, size_t n, char *path, size_t path_size) {
    const int fd = fuzz_scratch_fd(target);
    if (ftruncate(fd, 0) != 0) abort();
    size_t done = 0;
    while (done < n) {
        const ssize_t w = pwrite(fd, bytes + done, n - done, (off_t)done);
        if (w <= 0) abort();
        done += (size_t)w;
    }
    snprintf(path, path_size, "/proc/self/fd/%d", fd);
}

#endif
