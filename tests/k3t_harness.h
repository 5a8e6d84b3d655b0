/* The GPU-vs-CPU comparison harness, host side (no GPU needed; tests/test_harness.c checks it on the CPU):
 *  - output buffers with guard bytes on both sides, poisoned before a run, then checked: guards unchanged, every
 *    element the op must write written, no NaN/Inf (unless the case expects them), the rest of the body untouched;
 *  - comparisons against a reference under a per-op error budget (bitwise, relative L2, max-abs, max-ulp), the
 *    budgets of every op in one table;
 *  - table-driven cases {name, shape, m, options, seed, budget} with a fixed default base seed that K3T_SEED
 *    replaces; every case prints its seed and every failure names the case, the buffer, the index and the seed.
 * Checks come in two forms: k3t_verdict functions that only judge (so the harness's own test can assert that a
 * bad result is caught) and k3t_check_* wrappers that record the verdict through test_util.h's CHECK.
 * tests/k3t_harness_cuda.h puts device buffers under the same checks. Header-only: each test is one program. */
#ifndef K3_TEST_HARNESS_H
#define K3_TEST_HARNESS_H

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* ---------------------------------------------------------------------------------------- bf16, rng helpers */

/* fp32 -> BF16 bits, round to nearest even (NaN stays a quiet NaN). Written here, apart from the library's codec,
 * so that references and expected values do not come from the code under test. */
static inline uint16_t k3t_bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x40u);
    const uint32_t lsb = (u >> 16) & 1u;
    return (uint16_t)((u + 0x7fffu + lsb) >> 16);
}

/* A double rounded to the nearest BF16 value (through fp32: the double rounding is far below any budget here). */
static inline double k3t_round_bf16(double v) { return k3t_bf16_to_f32(k3t_bf16_bits((float)v)); }

/* A BF16 value uniform in [-scale, scale). */
static inline uint16_t k3t_rand_bf16(k3t_rng *r, float scale) { return k3t_bf16_bits(scale * k3t_uniform(r)); }

/* Random bytes, 8 per generator step (large quantized weights). */
static inline void k3t_fill_bytes(k3t_rng *r, uint8_t *p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint64_t v = k3t_next(r);
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++) p[i] = (uint8_t)k3t_next(r);
}

/* ---------------------------------------------------------------------------------------- seeds and cases */

/* Budget rows: one per op (and per kind of exact comparison). */
typedef enum k3t_op {
    K3T_OP_LINEAR,     /* the linear plan (gpu_linear): BF16 y vs an fp64 loop rounded to BF16 */
    K3T_OP_GEMM,       /* one GEMM configuration (gpu_gemm_kernels): vs an fp64 loop and vs k3_cpu_linear */
    K3T_OP_KDA_PROJ,   /* the KDA projection: qkvg, beta, f_a, g1 vs an fp64 evaluation rounded to BF16 */
    K3T_OP_MOE_W4A16,  /* routed experts, BF16 activations: out_f32 and out vs the CPU backend */
    K3T_OP_MOE_W4A4,   /* routed experts, FP4 activations (one more quantization: twice the budget) */
    K3T_OP_LATENT_MOE, /* the latent-MoE block's y vs the CPU backend */
    K3T_OP_ROUTER,     /* router ids and weights vs the CPU backend: bit for bit */
    K3T_OP_DISPATCH,   /* the dispatch's offsets, units, lists, weights vs a host counting sort: bit for bit */
    K3T_OP_REPEAT,     /* a rerun, a graph replay, another launch shape of the same call: bit for bit */
    K3T_OP_COUNT
} k3t_op;

typedef enum k3t_budget_kind {
    K3T_BITWISE, /* every element's bits equal */
    K3T_REL_L2,  /* ||got - ref|| / ||ref|| <= tol (||got - ref|| <= tol where ref is all zero) */
    K3T_MAX_ABS, /* max |got - ref| <= tol */
    K3T_MAX_ULP, /* max distance in units of the output's last place (BF16 or F32) <= tol */
} k3t_budget_kind;

typedef struct k3t_budget {
    const char *op;
    k3t_budget_kind kind;
    double tol;
} k3t_budget;

/* The budgets of every GPU test, in one place. BF16 GEMMs: 2e-3, above the ~1.7e-3 rel-L2 that one BF16 rounding
 * of normally distributed outputs adds where the reference is not rounded (the GEMM test's fp64 loop; the other
 * references are rounded to BF16 first). MoE: the experts round (W4A16) or also quantize to FP4 (W4A4) their
 * intermediate activations, and a different summation order flips some of those roundings against the CPU
 * backend's. */
static const k3t_budget k3t_budgets[K3T_OP_COUNT] = {
    [K3T_OP_LINEAR] = {"linear", K3T_REL_L2, 2e-3},
    [K3T_OP_GEMM] = {"gemm", K3T_REL_L2, 2e-3},
    [K3T_OP_KDA_PROJ] = {"kda_proj", K3T_REL_L2, 2e-3},
    [K3T_OP_MOE_W4A16] = {"moe_w4a16", K3T_REL_L2, 1e-2},
    [K3T_OP_MOE_W4A4] = {"moe_w4a4", K3T_REL_L2, 2e-2},
    [K3T_OP_LATENT_MOE] = {"latent_moe", K3T_REL_L2, 1e-2},
    [K3T_OP_ROUTER] = {"router", K3T_BITWISE, 0},
    [K3T_OP_DISPATCH] = {"dispatch", K3T_BITWISE, 0},
    [K3T_OP_REPEAT] = {"repeat", K3T_BITWISE, 0},
};

static inline const k3t_budget *k3t_budget_of(k3t_op op) { return &k3t_budgets[op]; }

/* A test case. shape and options mean what the test's own case table says (each test documents its order);
 * seed is an offset from the run's base seed, so one K3T_SEED moves every case and a printed seed reruns one. */
typedef struct k3t_case {
    const char *name;
    int64_t shape[6];
    int64_t m;
    int64_t options;
    uint64_t seed;
    k3t_op budget;
} k3t_case;

/* The run's base seed and the case being run: named in every failure message. */
struct k3t_state_s {
    uint64_t base;
    uint64_t seed;
    char name[96];
};
#if defined(K3T_SHARED_STATE) && !defined(K3T_DEFINE_STATE) /* several files, one state: see test_util.h */
extern struct k3t_state_s k3t_state;
#elif defined(K3T_SHARED_STATE)
struct k3t_state_s k3t_state = {0, 0, "-"};
#else
static struct k3t_state_s k3t_state = {0, 0, "-"};
#endif

/* Sets the base seed: K3T_SEED (decimal or 0x hex) when set, else the test's fixed default; prints it. */
static inline uint64_t k3t_seed_init(const char *test, uint64_t dflt) {
    const char *env = getenv("K3T_SEED");
    uint64_t base = dflt;
    int from_env = 0;
    if (env && *env) {
        char *end = NULL;
        const unsigned long long v = strtoull(env, &end, 0);
        CHECK(end && *end == '\0', "K3T_SEED=%s is not a number: the default seed is used", env);
        if (end && *end == '\0') base = (uint64_t)v, from_env = 1;
    }
    k3t_state.base = base;
    k3t_state.seed = base;
    snprintf(k3t_state.name, sizeof k3t_state.name, "%s", test);
    printf("%s: base seed 0x%" PRIx64 " (%s; K3T_SEED=<n> changes it)\n", test, base,
           from_env ? "from K3T_SEED" : "the default");
    return base;
}

/* Starts a case known only at run time: its seed is base + offset; prints it. Returns the seed. */
static inline uint64_t k3t_case_enter(const char *name, uint64_t offset) {
    k3t_state.seed = k3t_state.base + offset;
    snprintf(k3t_state.name, sizeof k3t_state.name, "%s", name);
    printf("case %s: seed 0x%" PRIx64 "\n", name, k3t_state.seed);
    return k3t_state.seed;
}

/* Starts a table case; prints its name, shape, m, options, budget and seed. Returns the case's seed. */
static inline uint64_t k3t_case_begin(const k3t_case *c) {
    k3t_state.seed = k3t_state.base + c->seed;
    snprintf(k3t_state.name, sizeof k3t_state.name, "%s", c->name);
    int dims = 6;
    while (dims > 1 && c->shape[dims - 1] == 0) dims--;
    char shape[160];
    int at = 0;
    for (int i = 0; i < dims && at >= 0 && (size_t)at < sizeof shape; i++)
        at += snprintf(shape + at, sizeof shape - (size_t)at, "%s%lld", i ? " " : "", (long long)c->shape[i]);
    printf("case %s: shape [%s] m %lld options 0x%llx budget %s: seed 0x%" PRIx64 "\n", c->name, shape,
           (long long)c->m, (unsigned long long)c->options, k3t_budgets[c->budget].op, k3t_state.seed);
    return k3t_state.seed;
}

/* "case NAME seed 0x.. (K3T_SEED=0x..)": appended to every failure. */
static inline const char *k3t_where(char *buf, size_t cap) {
    snprintf(buf, cap, "case %s seed 0x%" PRIx64 " (K3T_SEED=0x%" PRIx64 ")", k3t_state.name, k3t_state.seed,
             k3t_state.base);
    return buf;
}

/* ---------------------------------------------------------------------------------------- element types */

typedef enum k3t_type { K3T_BF16, K3T_F32, K3T_F64, K3T_I32 } k3t_type;

static inline size_t k3t_type_size(k3t_type t) { return t == K3T_BF16 ? 2 : t == K3T_F64 ? 8 : 4; }
static inline const char *k3t_type_name(k3t_type t) {
    return t == K3T_BF16 ? "bf16" : t == K3T_F32 ? "f32" : t == K3T_F64 ? "f64" : "i32";
}

/* Element i's bits, zero-extended. */
static inline uint64_t k3t_bits_at(const void *p, k3t_type t, int64_t i) {
    const unsigned char *b = (const unsigned char *)p + (size_t)i * k3t_type_size(t);
    if (t == K3T_BF16) {
        uint16_t v;
        memcpy(&v, b, 2);
        return v;
    }
    if (t == K3T_F64) {
        uint64_t v;
        memcpy(&v, b, 8);
        return v;
    }
    uint32_t v;
    memcpy(&v, b, 4);
    return v;
}

/* Element i's value. */
static inline double k3t_value_at(const void *p, k3t_type t, int64_t i) {
    const unsigned char *b = (const unsigned char *)p + (size_t)i * k3t_type_size(t);
    switch (t) {
    case K3T_BF16: {
        uint16_t v;
        memcpy(&v, b, 2);
        return k3t_bf16_to_f32(v);
    }
    case K3T_F32: {
        float v;
        memcpy(&v, b, 4);
        return v;
    }
    case K3T_F64: {
        double v;
        memcpy(&v, b, 8);
        return v;
    }
    default: {
        int32_t v;
        memcpy(&v, b, 4);
        return v;
    }
    }
}

/* ---------------------------------------------------------------------------------------- output buffers */

/* Guard bytes on each side of an output's body. 256 keeps the body as aligned as the allocation (cudaMalloc's
 * 256 bytes), so kernels see the alignment a plain allocation gives. */
#define K3T_GUARD_BYTES 256
#define K3T_GUARD_BYTE 0x5Au
/* Poison: the byte every body element is filled with before a run. 0xFF makes a BF16 (0xFFFF) or F32
 * (0xFFFFFFFF) NaN, so an unwritten element also poisons any sum that reads it; int32 gets 0xA5A5A5A5
 * (-1515870811), which is no id, count or offset. */
#define K3T_POISON_FLOAT 0xFFu
#define K3T_POISON_I32 0xA5u

static inline unsigned k3t_poison_byte(k3t_type t) { return t == K3T_I32 ? K3T_POISON_I32 : K3T_POISON_FLOAT; }

/* One output: its host image is [guard][body: n elements][guard]. */
typedef struct k3t_out {
    const char *name;
    k3t_type type;
    int64_t n;
    unsigned char *img;
} k3t_out;

static inline size_t k3t_out_body_bytes(const k3t_out *o) { return (size_t)o->n * k3t_type_size(o->type); }
static inline size_t k3t_out_img_bytes(const k3t_out *o) { return k3t_out_body_bytes(o) + 2 * K3T_GUARD_BYTES; }
static inline void *k3t_out_body(const k3t_out *o) { return o->img + K3T_GUARD_BYTES; }

/* Allocates the host image (poisoned). Returns 0 when out of memory (recorded as a failure). */
static inline int k3t_out_init(k3t_out *o, const char *name, k3t_type type, int64_t n) {
    o->name = name, o->type = type, o->n = n < 0 ? 0 : n;
    o->img = (unsigned char *)malloc(k3t_out_img_bytes(o));
    CHECK(o->img != NULL, "out of host memory for buffer %s (%lld elements)", name, (long long)n);
    if (!o->img) return 0;
    memset(o->img, (int)K3T_GUARD_BYTE, K3T_GUARD_BYTES);
    memset(o->img + K3T_GUARD_BYTES, (int)k3t_poison_byte(type), k3t_out_body_bytes(o));
    memset(o->img + K3T_GUARD_BYTES + k3t_out_body_bytes(o), (int)K3T_GUARD_BYTE, K3T_GUARD_BYTES);
    return 1;
}

static inline void k3t_out_free(k3t_out *o) {
    free(o->img);
    o->img = NULL;
}

/* Host-side poisoning (the device layer does the same with cudaMemset). */
static inline void k3t_out_poison(k3t_out *o) {
    memset(o->img, (int)K3T_GUARD_BYTE, K3T_GUARD_BYTES);
    memset(o->img + K3T_GUARD_BYTES, (int)k3t_poison_byte(o->type), k3t_out_body_bytes(o));
    memset(o->img + K3T_GUARD_BYTES + k3t_out_body_bytes(o), (int)K3T_GUARD_BYTE, K3T_GUARD_BYTES);
}

/* The poison as one element's bits. */
static inline uint64_t k3t_poison_word(k3t_type t) {
    const uint64_t b = k3t_poison_byte(t);
    return t == K3T_BF16 ? b * 0x0101u : t == K3T_F64 ? b * 0x0101010101010101ull : b * 0x01010101u;
}

static inline int k3t_is_poison(const void *body, k3t_type t, int64_t i) {
    return k3t_bits_at(body, t, i) == k3t_poison_word(t);
}

/* The elements an op must write: rows x cols at the start of the body, rows ld elements apart. */
typedef struct k3t_region {
    int64_t rows, cols, ld;
} k3t_region;

static inline k3t_region k3t_rows(int64_t rows, int64_t cols, int64_t ld) {
    k3t_region r = {rows, cols, ld};
    return r;
}
static inline k3t_region k3t_flat(int64_t n) { return k3t_rows(n > 0 ? 1 : 0, n, n); }

static inline int k3t_in_region(k3t_region r, int64_t i) {
    if (r.rows <= 0 || r.cols <= 0 || r.ld <= 0) return 0;
    return i / r.ld < r.rows && i % r.ld < r.cols;
}

/* A judgement: ok, the worst number it saw (count or error), where, and a message naming buffer, index, seed. */
typedef struct k3t_verdict {
    int ok;
    double metric;
    int64_t count, index;
    char msg[640];
} k3t_verdict;

static inline void k3t_verdict_init(k3t_verdict *v) {
    v->ok = 1, v->metric = 0, v->count = 0, v->index = -1;
    v->msg[0] = '\0';
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static inline void k3t_verdict_fail(k3t_verdict *v, const char *fmt, ...) {
    char where[160], what[sizeof v->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    /* the case and seed always fit: the description is cut instead */
    const int room = (int)(sizeof v->msg - strlen(k3t_where(where, sizeof where)) - 3);
    snprintf(v->msg, sizeof v->msg, "%.*s; %s", room, what, where);
    v->ok = 0;
}

/* Records a verdict as one CHECK; returns whether it passed. */
#define k3t_expect(v) k3t_expect_at((v), __FILE__, __LINE__)
static inline int k3t_expect_at(const k3t_verdict *v, const char *file, int line) {
    if (v->ok) {
        k3t_passed++;
    } else {
        k3t_failed++;
        fprintf(stderr, "FAIL %s:%d: %s\n", file, line, v->msg);
    }
    return v->ok;
}

/* Both guards unchanged. */
static inline k3t_verdict k3t_out_guards(const k3t_out *o) {
    k3t_verdict v;
    k3t_verdict_init(&v);
    const unsigned char *after = o->img + K3T_GUARD_BYTES + k3t_out_body_bytes(o);
    int64_t first = 0, count = 0;
    for (int64_t i = 0; i < K3T_GUARD_BYTES; i++) {
        if (o->img[i] != K3T_GUARD_BYTE && !count++) first = i - K3T_GUARD_BYTES; /* negative: before the body */
    }
    for (int64_t i = 0; i < K3T_GUARD_BYTES; i++) {
        if (after[i] != K3T_GUARD_BYTE && !count++) first = (int64_t)k3t_out_body_bytes(o) + i;
    }
    v.count = count, v.metric = (double)count, v.index = first;
    if (count)
        k3t_verdict_fail(&v, "buffer %s: %lld guard bytes changed, the first at byte offset %lld from the body (%s)",
                         o->name, (long long)count, (long long)first, first < 0 ? "before it" : "after it");
    return v;
}

/* Flags of the output checks. */
enum {
    K3T_NONFINITE_OK = 1, /* NaN/Inf outputs are expected (the case feeds them in) */
    K3T_OUTSIDE_ANY = 2,  /* the body outside the region may hold anything (the op may use it) */
};

/* Every element of region r written (no poison left) and, for float outputs, finite unless K3T_NONFINITE_OK. */
static inline k3t_verdict k3t_out_written(const k3t_out *o, k3t_region r, unsigned flags) {
    k3t_verdict v;
    k3t_verdict_init(&v);
    const void *body = k3t_out_body(o);
    const int floaty = o->type != K3T_I32 && !(flags & K3T_NONFINITE_OK);
    int64_t unwritten = 0, nonfinite = 0, first_u = -1, first_n = -1;
    if (r.rows > 0 && r.cols > 0 && r.ld > 0) {
        if (r.cols > r.ld || (r.rows - 1) * r.ld + r.cols > o->n) { /* a region past the body: a broken test */
            k3t_verdict_fail(&v, "buffer %s: region %lld x %lld (ld %lld) does not fit its %lld elements", o->name,
                             (long long)r.rows, (long long)r.cols, (long long)r.ld, (long long)o->n);
            return v;
        }
        for (int64_t row = 0; row < r.rows; row++)
            for (int64_t col = 0; col < r.cols; col++) {
                const int64_t i = row * r.ld + col;
                if (k3t_is_poison(body, o->type, i)) {
                    if (!unwritten++) first_u = i;
                } else if (floaty && !isfinite(k3t_value_at(body, o->type, i))) {
                    if (!nonfinite++) first_n = i;
                }
            }
    }
    v.count = unwritten + nonfinite, v.metric = (double)v.count;
    v.index = first_u >= 0 ? first_u : first_n;
    if (unwritten || nonfinite) {
        const int64_t ld = r.ld > 0 ? r.ld : 1, at = first_u >= 0 ? first_u : first_n;
        k3t_verdict_fail(&v,
                         "buffer %s (%s, %lld x %lld, ld %lld): %lld elements left poisoned, %lld NaN/Inf; the first "
                         "%s at index %lld (row %lld col %lld)",
                         o->name, k3t_type_name(o->type), (long long)r.rows, (long long)r.cols, (long long)r.ld,
                         (long long)unwritten, (long long)nonfinite, first_u >= 0 ? "unwritten" : "NaN/Inf",
                         (long long)at, (long long)(at / ld), (long long)(at % ld));
    }
    return v;
}

/* Every body element outside region r holds what it held before the run: expect's element (the same layout as
 * the body), or the poison when expect is NULL. */
static inline k3t_verdict k3t_out_outside(const k3t_out *o, k3t_region r, const void *expect) {
    k3t_verdict v;
    k3t_verdict_init(&v);
    const void *body = k3t_out_body(o);
    int64_t count = 0, first = -1;
    for (int64_t i = 0; i < o->n; i++) {
        if (k3t_in_region(r, i)) continue;
        const int same = expect ? k3t_bits_at(body, o->type, i) == k3t_bits_at(expect, o->type, i)
                                : k3t_is_poison(body, o->type, i);
        if (!same && !count++) first = i;
    }
    v.count = count, v.metric = (double)count, v.index = first;
    if (count) {
        const int64_t ld = r.ld > 0 ? r.ld : 1;
        k3t_verdict_fail(&v,
                         "buffer %s: %lld elements outside the %lld x %lld region (ld %lld) written, the first at "
                         "index %lld (row %lld col %lld): 0x%llx where %s 0x%llx",
                         o->name, (long long)count, (long long)r.rows, (long long)r.cols, (long long)r.ld,
                         (long long)first, (long long)(first / ld), (long long)(first % ld),
                         (unsigned long long)k3t_bits_at(body, o->type, first), expect ? "it held" : "the poison",
                         (unsigned long long)(expect ? k3t_bits_at(expect, o->type, first)
                                                     : k3t_poison_word(o->type)));
    }
    return v;
}

/* The post-run checks of one output as CHECKs: guards, region written (and finite), the rest untouched (equal
 * to `outside`, or poison when it is NULL; not checked with K3T_OUTSIDE_ANY). Returns 1 when all passed. */
static inline int k3t_check_out(const k3t_out *o, k3t_region r, unsigned flags, const void *outside) {
    const k3t_verdict g = k3t_out_guards(o), w = k3t_out_written(o, r, flags);
    int ok = k3t_expect(&g);
    ok &= k3t_expect(&w);
    if (!(flags & K3T_OUTSIDE_ANY)) {
        const k3t_verdict u = k3t_out_outside(o, r, outside);
        ok &= k3t_expect(&u);
    }
    return ok;
}

/* ---------------------------------------------------------------------------------------- comparisons */

/* rows x cols elements of p, rows ld apart. round_bf16: each element is rounded to BF16 before use (a reference
 * at the output's precision). */
typedef struct k3t_view {
    const void *p;
    k3t_type type;
    int64_t rows, cols, ld;
    int round_bf16;
} k3t_view;

static inline k3t_view k3t_view2(const void *p, k3t_type t, int64_t rows, int64_t cols, int64_t ld) {
    k3t_view v = {p, t, rows, cols, ld, 0};
    return v;
}
static inline k3t_view k3t_view1(const void *p, k3t_type t, int64_t n) { return k3t_view2(p, t, 1, n, n); }
static inline k3t_view k3t_rounded(k3t_view v) {
    v.round_bf16 = 1;
    return v;
}
/* The view of an output's body. */
static inline k3t_view k3t_view_out(const k3t_out *o, k3t_region r) {
    return k3t_view2(k3t_out_body(o), o->type, r.rows, r.cols, r.ld);
}

static inline double k3t_view_value(const k3t_view *v, int64_t row, int64_t col) {
    const double x = k3t_value_at(v->p, v->type, row * v->ld + col);
    return v->round_bf16 ? k3t_round_bf16(x) : x;
}

/* A monotonic integer image of a float's bits (sign-magnitude to two's complement order): adjacent values of the
 * type differ by one. */
static inline int64_t k3t_ordered(uint64_t bits, int width) {
    const uint64_t sign = 1ull << (width - 1), mag = bits & (sign - 1);
    return (bits & sign) ? -(int64_t)mag : (int64_t)mag;
}

/* Judges got against ref under budget b. For the numeric kinds a NaN/Inf in got (or in ref) makes the error +inf. */
static inline k3t_verdict k3t_compare(const char *what, k3t_view got, k3t_view ref, const k3t_budget *b) {
    k3t_verdict v;
    k3t_verdict_init(&v);
    if (got.rows != ref.rows || got.cols != ref.cols) {
        k3t_verdict_fail(&v, "%s: shapes differ (%lld x %lld vs a %lld x %lld reference)", what, (long long)got.rows,
                         (long long)got.cols, (long long)ref.rows, (long long)ref.cols);
        return v;
    }
    const int64_t rows = got.rows > 0 ? got.rows : 0, cols = got.cols > 0 ? got.cols : 0;
    int64_t worst_r = -1, worst_c = -1, nonfinite = 0, first_nf = -1;
    double worst = -1.0;
    if (b->kind == K3T_BITWISE) {
        if (got.type != ref.type || got.round_bf16 || ref.round_bf16) {
            k3t_verdict_fail(&v, "%s: a bitwise comparison of %s with %s", what, k3t_type_name(got.type),
                             k3t_type_name(ref.type));
            return v;
        }
        int64_t diff = 0;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                if (k3t_bits_at(got.p, got.type, r * got.ld + c) != k3t_bits_at(ref.p, ref.type, r * ref.ld + c) &&
                    !diff++)
                    worst_r = r, worst_c = c;
        v.metric = (double)diff, v.count = diff, v.index = worst_r >= 0 ? worst_r * got.ld + worst_c : -1;
        if (diff)
            k3t_verdict_fail(&v,
                             "%s: %lld of %lld elements differ bitwise (budget %s), the first at row %lld col %lld: "
                             "got 0x%llx (%.9g), expected 0x%llx (%.9g)",
                             what, (long long)diff, (long long)(rows * cols), b->op, (long long)worst_r,
                             (long long)worst_c, (unsigned long long)k3t_bits_at(got.p, got.type, v.index),
                             k3t_value_at(got.p, got.type, v.index),
                             (unsigned long long)k3t_bits_at(ref.p, ref.type, worst_r * ref.ld + worst_c),
                             k3t_value_at(ref.p, ref.type, worst_r * ref.ld + worst_c));
        return v;
    }
    const int ulp_width = got.type == K3T_BF16 ? 16 : 32;
    if (b->kind == K3T_MAX_ULP && got.type != K3T_BF16 && got.type != K3T_F32) {
        k3t_verdict_fail(&v, "%s: ulps of %s outputs", what, k3t_type_name(got.type));
        return v;
    }
    double num = 0.0, den = 0.0, metric = 0.0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const double g = k3t_view_value(&got, r, c), e = k3t_view_value(&ref, r, c);
            if (!isfinite(g) || !isfinite(e)) { /* a broken reference is no pass either */
                if (!nonfinite++) first_nf = r * got.ld + c;
                continue;
            }
            double err;
            if (b->kind == K3T_MAX_ULP) {
                /* the reference at the output's precision, then the distance in its steps */
                const uint64_t gb = k3t_bits_at(got.p, got.type, r * got.ld + c);
                uint64_t eb;
                if (got.type == K3T_BF16) {
                    eb = k3t_bf16_bits((float)e);
                } else {
                    const float ef = (float)e;
                    uint32_t u;
                    memcpy(&u, &ef, 4);
                    eb = u;
                }
                const int64_t d = k3t_ordered(gb, ulp_width) - k3t_ordered(eb, ulp_width);
                err = (double)(d < 0 ? -d : d);
            } else {
                err = fabs(g - e);
            }
            num += (g - e) * (g - e), den += e * e;
            if (err > worst) worst = err, worst_r = r, worst_c = c;
        }
    if (b->kind == K3T_REL_L2) metric = den > 0.0 ? sqrt(num / den) : sqrt(num);
    else metric = worst < 0.0 ? 0.0 : worst;
    if (nonfinite) metric = INFINITY;
    v.metric = metric, v.count = nonfinite;
    v.index = nonfinite ? first_nf : worst_r >= 0 ? worst_r * got.ld + worst_c : -1;
    static const char *const kind_name[] = {"bitwise", "rel-L2", "max-abs", "max-ulp"};
    if (!(metric <= b->tol)) { /* NaN fails too */
        if (nonfinite)
            k3t_verdict_fail(&v,
                             "%s: %lld NaN/Inf values (output or reference), the first at index %lld (budget %s %s "
                             "%.3g)",
                             what, (long long)nonfinite, (long long)first_nf, b->op, kind_name[b->kind], b->tol);
        else
            k3t_verdict_fail(&v,
                             "%s: %s %.4g over the budget %.3g (%s); the largest error at row %lld col %lld: got "
                             "%.9g, expected %.9g",
                             what, kind_name[b->kind], metric, b->tol, b->op, (long long)worst_r, (long long)worst_c,
                             worst_r >= 0 ? k3t_view_value(&got, worst_r, worst_c) : 0.0,
                             worst_r >= 0 ? k3t_view_value(&ref, worst_r, worst_c) : 0.0);
    }
    return v;
}

/* k3t_compare under op's budget, recorded as a CHECK. Returns the verdict (its metric for the test's report). */
static inline k3t_verdict k3t_check_close(const char *what, k3t_view got, k3t_view ref, k3t_op op) {
    const k3t_verdict v = k3t_compare(what, got, ref, k3t_budget_of(op));
    k3t_expect(&v);
    return v;
}

/* Bitwise equality of n elements of type t, recorded as a CHECK (reruns, replays, other launch shapes). */
static inline int k3t_check_same(const char *what, const void *got, const void *ref, k3t_type t, int64_t n) {
    const k3t_verdict v = k3t_compare(what, k3t_view1(got, t, n), k3t_view1(ref, t, n), k3t_budget_of(K3T_OP_REPEAT));
    return k3t_expect(&v);
}

#endif
