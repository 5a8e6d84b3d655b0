/* Minimal test harness: CHECK records a failure and goes on; the closing line is "N passed, N failed". */
#ifndef K3_TEST_UTIL_H
#define K3_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3.h"

/* The counts are per program. A test program of several files defines K3T_SHARED_STATE in all of them (CMake
 * does) and K3T_DEFINE_STATE in the one that owns main(), so that every file counts into the same totals. */
#if defined(K3T_SHARED_STATE) && !defined(K3T_DEFINE_STATE)
extern int k3t_passed, k3t_failed;
#elif defined(K3T_SHARED_STATE)
int k3t_passed, k3t_failed;
#else
static int k3t_passed, k3t_failed;
#endif

#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        if (cond) {                                                                                          \
            k3t_passed++;                                                                                    \
        } else {                                                                                             \
            k3t_failed++;                                                                                    \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                  \
            fprintf(stderr, __VA_ARGS__);                                                                    \
            fputc('\n', stderr);                                                                             \
        }                                                                                                    \
    } while (0)

/* BF16 bits -> value, written here (not the library's codec) so references stay independent of the code under
 * test. Exact: a BF16 value widens to fp32 by a 16-bit shift. */
static inline float k3t_bf16_to_f32(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Ends a test program: prints the closing line, returns the exit status. */
static inline int k3t_finish(void) {
    printf("%d passed, %d failed\n", k3t_passed, k3t_failed);
    return k3t_failed ? 1 : (k3t_passed ? 0 : 1);
}

/* A context on the CPU backend (the reference); NULL when it cannot be created. */
static inline k3_ctx *k3t_cpu_ctx(void) {
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    opt.backend = K3_BACKEND_CPU;
    k3_ctx *ctx = NULL;
    return k3_ctx_create(&opt, &ctx) == K3_STATUS_SUCCESS ? ctx : NULL;
}

/* Ends a GPU test that found no device: exit code 77 is reported as "skipped" by ctest. */
#define K3T_SKIP(...)                                                                                        \
    do {                                                                                                     \
        printf("SKIPPED: ");                                                                                 \
        printf(__VA_ARGS__);                                                                                 \
        printf("\n");                                                                                        \
        return 77;                                                                                           \
    } while (0)

/* splitmix64: a small seeded generator so every test prints and reuses its seed. */
typedef struct { uint64_t s; } k3t_rng;
static inline uint64_t k3t_next(k3t_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* uniform in [-1, 1) */
static inline float k3t_uniform(k3t_rng *r) { return (float)((k3t_next(r) >> 40) * (2.0 / 16777216.0) - 1.0); }
static inline double k3t_normal(k3t_rng *r) {
    double u1 = ((k3t_next(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (k3t_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
