/* Synthetic MoE checkpoints for the tests (test_checkpoint.c, test_convert.c): per-expert files in each published
 * layout written with the library's writer, sharded and indexed, and what the stacked layout should then hold.
 * Functions are static inline so that a test using only some of them compiles warning-free. */
#ifndef K3_TESTS_CKPT_SYNTH_H
#define K3_TESTS_CKPT_SYNTH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/safetensors.h"
#include "test_util.h"

static char g_dir[256];

/* Deterministic bytes: tensor data differs per tensor, so a swapped or misplaced tensor is seen. */
static inline void fill(uint8_t *p, size_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (uint8_t)(x >> 24);
    }
}

static inline int mkdir_p(const char *path) { return mkdir(path, 0755) == 0; }

static const char *const projs[3] = {"gate_proj", "up_proj", "down_proj"};

enum { CT_MX, CT_NV, MO_NV };

/* What the test wrote, in the stacked layout (built here by its own offsets). */
typedef struct expect {
    int64_t E, I, L;
    uint8_t *w13, *s13, *w2, *s2;
    float *g13, *g2, *in13, *in2; /* scale_2 and input scales as the library should give them */
} expect;

static inline void expect_free(expect *x) {
    free(x->w13), free(x->s13), free(x->w2), free(x->s2);
    free(x->g13), free(x->g2), free(x->in13), free(x->in2);
    memset(x, 0, sizeof *x);
}

static inline void add(k3_st_writer *w, const char *name, k3_st_dtype dt, int32_t nd, const int64_t *sh, const void *d) {
    char err[256];
    k3_status st = k3_st_writer_add(w, name, dt, nd, sh, d, err, sizeof err);
    if (st != K3_STATUS_SUCCESS) fprintf(stderr, "writer_add %s: %s\n", name, err);
}

static inline void add_f32(k3_st_writer *w, const char *name, float v, int as_one) {
    const int64_t one[1] = {1};
    add(w, name, K3_ST_F32, as_one ? 1 : 0, one, &v);
}

/* The per-expert scale_2 value written for (e, proj): gate and up differ. */
static inline float g_of(int64_t e, int pj) { return (pj == 0 && e == 0) ? 448.0f : 0.5f * (float)(e + 1) + 0.25f * (float)pj; }

typedef struct pe_opts {
    int fmt;
    const char *prefix;
    int64_t E, I, L;
    int64_t skip_expert;     /* -1: none */
    int64_t split;           /* experts >= split go to the second writer (0: one writer) */
    int bad_scale_dtype;     /* expert 1's down_proj.weight_scale written as F32 */
    float zero_global;       /* when nonzero: expert 0 up_proj's scale_2 (or global) value replaced */
    int nan_scale;           /* expert 0 up_proj's last block scale is a NaN code */
    int narrow;              /* scales a lossless format change can carry: MXFP4 exponents within 15 binades
                                (2: exactly 17, the most E4M3 holds; 3: 18, one too many) plus all-zero blocks
                                with far-off scales; NVFP4 powers of two equal over each 32-block, power-of-two
                                global scales */
    int bad_shape;           /* expert 1's down_proj codes written one row short */
} pe_opts;

/* The narrow scale byte i of (e, pj): UE8M0 2^-7 .. 2^8 (kind 2: 2^-9 .. 2^8, 3: 2^-10 .. 2^8), or E4M3
   2^-6 .. 2^1 equal for the 16-blocks 2q, 2q+1. */
static inline uint8_t narrow_scale(int nv, int kind, int64_t e, int pj, size_t i) {
    const int n = kind == 3 ? 19 : kind == 2 ? 18 : 16;
    if (!nv) return (uint8_t)(136 - n + (int)(((size_t)(e * 7 + pj * 3) + i * 5) % (size_t)n));
    const int k = -6 + (int)((size_t)(e + pj) + i / 2) % 8;
    return (uint8_t)((k + 7) << 3);
}
/* Power-of-two global scales; gate and up differ. */
static inline float narrow_g(int64_t e, int pj) { return (float)(1 << (int)((e + 2 * pj) % 4)); }

static inline void write_per_expert(k3_st_writer *w[2], const pe_opts *o, expect *x) {
    const int nv = o->fmt != CT_MX, ct = o->fmt != MO_NV;
    const int64_t bs = nv ? 16 : 32, E = o->E, I = o->I, L = o->L;
    memset(x, 0, sizeof *x);
    x->E = E, x->I = I, x->L = L;
    x->w13 = calloc((size_t)(E * 2 * I * L / 2), 1);
    x->s13 = calloc((size_t)(E * 2 * I * L / bs), 1);
    x->w2 = calloc((size_t)(E * L * I / 2), 1);
    x->s2 = calloc((size_t)(E * L * I / bs), 1);
    x->g13 = calloc((size_t)E * 2, sizeof(float));
    x->g2 = calloc((size_t)E, sizeof(float));
    x->in13 = calloc((size_t)E * 2, sizeof(float));
    x->in2 = calloc((size_t)E, sizeof(float));
    char name[300];
    for (int64_t e = 0; e < E; e++) {
        if (e == o->skip_expert) continue;
        k3_st_writer *wr = (o->split && e >= o->split) ? w[1] : w[0];
        for (int pj = 0; pj < 3; pj++) {
            const int64_t N = pj < 2 ? I : L, K = pj < 2 ? L : I;
            const size_t wb = (size_t)(N * K / 2), sb = (size_t)(N * K / bs);
            uint8_t *wd = pj < 2 ? x->w13 + (size_t)(e * 2 + pj) * wb : x->w2 + (size_t)e * wb;
            uint8_t *sd = pj < 2 ? x->s13 + (size_t)(e * 2 + pj) * sb : x->s2 + (size_t)e * sb;
            fill(wd, wb, (uint32_t)(e * 10 + pj));
            fill(sd, sb, (uint32_t)(e * 10 + pj + 1000));
            for (size_t i = 0; i < sb; i++) sd[i] &= 0x7E; /* no NaN scale codes (0x7F/0xFF E4M3, 0xFF UE8M0) */
            if (o->narrow) {
                for (size_t i = 0; i < sb; i++) sd[i] = narrow_scale(nv, o->narrow, e, pj, i);
                /* row 1's first 32 elements: zero codes under a scale far outside the others' range */
                memset(wd + (size_t)(K / 2), 0, 16);
                if (nv) sd[K / bs] = 0x01, sd[K / bs + 1] = 0x03; /* 2^-9, 3 * 2^-9: not a power of two */
                else sd[K / bs] = 10;                       /* 2^-117 */
            }
            if (o->nan_scale && e == 0 && pj == 1) sd[sb - 1] = nv ? 0x7F : 0xFF;
            const int64_t wsh[2] = {N - (o->bad_shape && e == 1 && pj == 2), K / 2}, ssh[2] = {N, K / bs};
            snprintf(name, sizeof name, "%sexperts.%lld.%s.%s", o->prefix, (long long)e, projs[pj],
                     ct ? "weight_packed" : "weight");
            add(wr, name, K3_ST_U8, 2, wsh, wd);
            snprintf(name, sizeof name, "%sexperts.%lld.%s.weight_scale", o->prefix, (long long)e, projs[pj]);
            if (o->bad_scale_dtype && e == 1 && pj == 2) {
                float *f = calloc((size_t)(N * K / bs), sizeof(float));
                add(wr, name, K3_ST_F32, 2, ssh, f);
                free(f);
            } else {
                add(wr, name, nv ? K3_ST_F8_E4M3 : K3_ST_U8, 2, ssh, sd);
            }
            if (!nv) continue;
            float g = o->narrow ? narrow_g(e, pj) : g_of(e, pj), in = 2.0f + (float)e + 0.5f * (float)pj;
            if (o->zero_global != 0.0f && e == 0 && pj == 1) g = o->zero_global < 0 ? 0.0f : o->zero_global;
            snprintf(name, sizeof name, "%sexperts.%lld.%s.%s", o->prefix, (long long)e, projs[pj],
                     ct ? "weight_global_scale" : "weight_scale_2");
            add_f32(wr, name, g, (int)(e & 1));
            snprintf(name, sizeof name, "%sexperts.%lld.%s.%s", o->prefix, (long long)e, projs[pj],
                     ct ? "input_global_scale" : "input_scale");
            add_f32(wr, name, in, 0);
            /* the expected values: compressed-tensors stores reciprocals, computed here in double and rounded */
            const float s2 = ct ? (float)(1.0 / (double)g) : g, si = ct ? (float)(1.0 / (double)in) : in;
            if (pj < 2) x->g13[e * 2 + pj] = s2, x->in13[e * 2 + pj] = si;
            else x->g2[e] = s2, x->in2[e] = si;
        }
    }
}

static inline int save(k3_st_writer *w, const char *file, char *path, size_t n) {
    char err[256];
    snprintf(path, n, "%s/%s", g_dir, file);
    const k3_status st = k3_st_writer_save(w, path, err, sizeof err);
    if (st != K3_STATUS_SUCCESS) fprintf(stderr, "save %s: %s\n", path, err);
    return st == K3_STATUS_SUCCESS;
}

static inline int write_index(const char *file, const char *const *names, const char *const *shards, int n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_dir, file);
    FILE *f = fopen(path, "w");
    if (!f) return 0;
    fprintf(f, "{\n  \"metadata\": {\"total_size\": 12345, \"note\": [1, 2.5, null]},\n  \"weight_map\": {\n");
    for (int i = 0; i < n; i++) fprintf(f, "    \"%s\": \"%s\"%s\n", names[i], shards[i], i + 1 < n ? "," : "");
    fprintf(f, "  }\n}\n");
    return fclose(f) == 0;
}

/* An index over the tensors of the given files (each listed in the shard it is in). */
static inline int index_of(const char *index_file, const char *dir_rel, const char *const *files, int nfiles,
                    const char *override_shard) {
    const char *names[256], *shards[256];
    char *owned[256];
    int n = 0;
    k3_st_file *fs[4] = {NULL, NULL, NULL, NULL};
    for (int k = 0; k < nfiles; k++) {
        char path[1280], err[256];
        snprintf(path, sizeof path, "%s/%s/%s", g_dir, dir_rel, files[k]);
        if (k3_st_open(path, &fs[k], err, sizeof err) != K3_STATUS_SUCCESS) return 0;
        for (int32_t i = 0; i < k3_st_count(fs[k]) && n < 256; i++) {
            owned[n] = strdup(k3_st_at(fs[k], i)->name);
            names[n] = owned[n];
            shards[n] = (override_shard && k == 1) ? override_shard : files[k];
            n++;
        }
    }
    const int ok = write_index(index_file, names, shards, n);
    for (int i = 0; i < n; i++) free(owned[i]);
    for (int k = 0; k < nfiles; k++) k3_st_close(fs[k]);
    return ok;
}

#endif
