/*
 * Replays files through a fuzz target without libFuzzer: every argument is a file or a folder (its regular files,
 * not recursive); each file's bytes go to LLVMFuzzerTestOneInput once. The target aborts on any failure, so a
 * clean exit means every input ran clean (under the sanitizers in the ASan build). An empty folder is fine (the
 * crashes/ folders are empty until something is found), no input at all is not; an argument that cannot be read is an error, so a wrong
 * path cannot make the test pass without replaying anything.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path, long *count) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    size_t cap = 4096, len = 0;
    uint8_t *buf = (uint8_t *)malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(fp);
            fprintf(stderr, "replay: out of memory reading %s\n", path);
            return 1;
        }
        len += fread(buf + len, 1, cap - len, fp);
        if (len < cap) break;
        cap *= 2;
        uint8_t *nb = (uint8_t *)realloc(buf, cap);
        if (!nb) free(buf);
        buf = nb;
    }
    const int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(buf);
        fprintf(stderr, "replay: read error on %s\n", path);
        return 1;
    }
    /* A copy of exactly len bytes, so ASan sees a read past the input as what it is. */
    uint8_t *exact = (uint8_t *)malloc(len ? len : 1);
    if (!exact) {
        free(buf);
        return 1;
    }
    memcpy(exact, buf, len);
    free(buf);
    printf("replay: %s (%zu bytes)\n", path, len);
    fflush(stdout);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    ++*count;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int replay_dir(const char *dir, long *count) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "replay: cannot open folder %s\n", dir);
        return 1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue; /* ., .., and dot files such as .gitkeep */
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nn = (char **)realloc(names, cap * sizeof *nn);
            if (!nn) {
                rc = 1;
                break;
            }
            names = nn;
        }
        const size_t len = strlen(dir) + strlen(e->d_name) + 2;
        names[n] = (char *)malloc(len);
        if (!names[n]) {
            rc = 1;
            break;
        }
        snprintf(names[n], len, "%s/%s", dir, e->d_name);
        ++n;
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_str); /* a stable order: the same run every time */
    for (size_t i = 0; i < n; ++i) {
        struct stat sb;
        if (rc == 0 && stat(names[i], &sb) == 0 && S_ISREG(sb.st_mode)) rc = replay_file(names[i], count);
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv) {
    long count = 0;
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE_OR_FOLDER...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; ++i) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "replay: %s does not exist\n", argv[i]);
            return 1;
        }
        const int rc = S_ISDIR(sb.st_mode) ? replay_dir(argv[i], &count) : replay_file(argv[i], &count);
        if (rc) return rc;
    }
    if (count == 0) { /* the corpus folders hold seeds: none found means the test replayed nothing */
        fprintf(stderr, "replay: no input files found\n");
        return 1;
    }
    printf("replay: %ld inputs, all clean\n", count);
    return 0;
}
