/*
 * libFuzzer target: the checkpoint index reader. The input bytes are a model.safetensors.index.json. They go to
 * the scratch memfd, and a private folder (made once per process, removed at exit) holds a symbolic link of that
 * name to it, so k3_ckpt_open reads the index as it reads a real one: through the file's own path and through
 * the folder. The shards it names need not exist (opening the index reads none). A checkpoint that opens must
 * describe itself consistently: both paths give the same names in the same order, every name is found by
 * k3_ckpt_has, the names are distinct (so the count is the number of names), a name that is not listed is not
 * found, and k3_ckpt_find and the MoE detection answer with a status and a message, never a crash.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "io/checkpoint.h"

#define TARGET "fuzz_index"
#define INDEX_NAME "model.safetensors.index.json"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_dir[64], g_link[128];

static void remove_dir(void) {
    if (g_link[0]) unlink(g_link);
    if (g_dir[0]) rmdir(g_dir);
}

/* The private folder with the link to the scratch file (made on the first input). */
static void make_dir(const char *scratch) {
    if (g_dir[0]) return;
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/k3_fuzz_index.XXXXXX", tmp && tmp[0] && strlen(tmp) < 32 ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror(TARGET ": mkdtemp");
        abort();
    }
    snprintf(g_link, sizeof g_link, "%s/" INDEX_NAME, g_dir);
    if (symlink(scratch, g_link) != 0) {
        perror(TARGET ": symlink");
        abort();
    }
    atexit(remove_dir);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Every name listed and found, distinct; a name that is not listed is not found. */
static void check_names(const k3_ckpt *ck) {
    const int32_t n = k3_ckpt_count(ck);
    fuzz_check(TARGET, n >= 0, "negative count");
    fuzz_check(TARGET, k3_ckpt_name_at(ck, n) == NULL && k3_ckpt_name_at(ck, -1) == NULL, "name_at out of range");
    const char **sorted = malloc(sizeof *sorted * (size_t)(n ? n : 1));
    if (!sorted) abort();
    for (int32_t i = 0; i < n; i++) {
        const char *name = k3_ckpt_name_at(ck, i);
        fuzz_check(TARGET, name != NULL, "name_at in range is NULL");
        fuzz_check(TARGET, k3_ckpt_has(ck, name), "a listed name is not found by k3_ckpt_has");
        sorted[i] = name;
    }
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_str);
    for (int32_t i = 1; i < n; i++) fuzz_check(TARGET, strcmp(sorted[i - 1], sorted[i]) != 0, "a name listed twice");
    if (n > 0) { /* the first name with a byte appended: found exactly when it is listed itself */
        char probe[512];
        snprintf(probe, sizeof probe, "%.500sx", k3_ckpt_name_at(ck, 0));
        const int listed = bsearch(&(const char *){probe}, sorted, (size_t)n, sizeof *sorted, cmp_str) != NULL;
        fuzz_check(TARGET, k3_ckpt_has(ck, probe) == listed, "k3_ckpt_has finds a name that is not listed");
    }
    free(sorted);
    fuzz_check(TARGET, !k3_ckpt_has(ck, NULL), "k3_ckpt_has(NULL)");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char scratch[64], err[512];
    fuzz_scratch_write(TARGET, data, size, scratch, sizeof scratch);
    make_dir(scratch);

    k3_ckpt *ck = NULL;
    const k3_status st = k3_ckpt_open(g_link, &ck, err, sizeof err);
    k3_ckpt *ck_dir = NULL;
    char err_dir[512];
    const k3_status st_dir = k3_ckpt_open(g_dir, &ck_dir, err_dir, sizeof err_dir);
    fuzz_check(TARGET, st == st_dir, "the index and its folder open differently");
    FUZZ_TRACE_PRINT("open: %s\n", st == K3_STATUS_SUCCESS ? "success" : err);
    if (st != K3_STATUS_SUCCESS) {
        fuzz_check(TARGET, ck == NULL && ck_dir == NULL, "*out not NULL on failure");
        fuzz_check(TARGET, err[0] != '\0' && err_dir[0] != '\0', "a failure without a message");
        return 0;
    }
    fuzz_check(TARGET, ck != NULL && ck_dir != NULL, "success without a checkpoint");
    fuzz_check(TARGET, strcmp(k3_ckpt_path(ck), g_link) == 0, "k3_ckpt_path is not the index opened");
    fuzz_check(TARGET, k3_ckpt_metadata(ck, "format") == NULL, "an index has no __metadata__");
    check_names(ck);
    const int32_t n = k3_ckpt_count(ck);
    fuzz_check(TARGET, k3_ckpt_count(ck_dir) == n, "the folder lists a different count");
    for (int32_t i = 0; i < n; i++)
        fuzz_check(TARGET, strcmp(k3_ckpt_name_at(ck, i), k3_ckpt_name_at(ck_dir, i)) == 0,
                   "the folder lists different names");
    k3_ckpt_close(ck_dir);

    /* a lookup opens a shard: none exists here but the link itself, so this must fail with a message */
    if (n > 0) {
        const k3_st_tensor *t = NULL;
        err[0] = '\0';
        const k3_status fs = k3_ckpt_find(ck, k3_ckpt_name_at(ck, 0), &t, err, sizeof err);
        fuzz_check(TARGET, fs != K3_STATUS_SUCCESS && err[0] != '\0', "a lookup without a shard succeeded silently");
    }
    /* the MoE detection reads names only */
    for (int32_t layer = 0; layer < 3; layer++) {
        k3_ckpt_moe_info info;
        err[0] = '\0';
        const k3_status ds = k3_ckpt_moe_detect(ck, layer, &info, err, sizeof err);
        FUZZ_TRACE_PRINT("layer %d: detect: %s\n", (int)layer, ds == K3_STATUS_SUCCESS ? "success" : err);
        if (ds != K3_STATUS_SUCCESS) {
            fuzz_check(TARGET, err[0] != '\0', "a failed detection without a message");
            continue;
        }
        fuzz_check(TARGET, memchr(info.prefix, '\0', sizeof info.prefix) != NULL, "prefix not terminated");
        if (info.format == K3_CKPT_MOE_STACKED) {
            char name[400];
            snprintf(name, sizeof name, "%sw13_weight", info.prefix);
            fuzz_check(TARGET, k3_ckpt_has(ck, name), "stacked detection without <prefix>w13_weight");
        } else {
            fuzz_check(TARGET, info.format <= K3_CKPT_MOE_MODELOPT_NVFP4, "unknown format");
            fuzz_check(TARGET, info.num_experts >= 1, "per-expert detection without experts");
            const char *sfx = info.format == K3_CKPT_MOE_MODELOPT_NVFP4 ? "weight" : "weight_packed";
            static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
            for (int32_t e = 0; e < info.num_experts && e < 64; e++)
                for (int p = 0; p < 3; p++) {
                    char name[400];
                    snprintf(name, sizeof name, "%sexperts.%d.%s.%s", info.prefix, (int)e, proj[p], sfx);
                    fuzz_check(TARGET, k3_ckpt_has(ck, name), "a detected expert's weight is not listed");
                }
        }
    }
    k3_ckpt_close(ck);
    return 0;
}
