/* Helpers of the GEMM plan's CPU tests (test_plan.c, test_table_gemm.c): configuration names from the registry,
 * simulated contexts that count their log lines, a table file written for a test, a malformed-table check. */
#ifndef K3_TESTS_PLAN_TEST_UTIL_H
#define K3_TESTS_PLAN_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "k3.h"
#include "plan/linear_plan.h"
#include "test_util.h"

#define SEED 0x5EED0004u

/* ---------------------------------------------------------------- helpers ---------------------- */

/* Configuration names come from the registry (it changes as kernels are tuned): {SK}, {SK2} = the first two
 * skinny configurations for any K, {SKK} = a static-K skinny one (else {SK}), {MM}, {MM2} = the first and last
 * mma configurations for any K, {MW} = the first whole-K warp tile (max_k > 0). S() substitutes them into a text
 * (a ring of buffers, valid for a while). */
/* (each test program of the plan uses some of these) */
static char SK[40], SK2[40], SKK[40], MM[40], MM2[40], MW[40] __attribute__((unused));
static int have_skk __attribute__((unused));

static inline void pick_configs(void) {
    int32_t count = 0;
    const k3_gemm_config *all = k3_gemm_configs(&count);
    for (int32_t i = 0; i < count; i++) {
        const k3_gemm_config *c = &all[i];
        if (c->kernel == K3_KERNEL_SKINNY && c->static_k == 0) {
            if (!SK[0]) snprintf(SK, sizeof SK, "%s", c->name);
            else if (!SK2[0]) snprintf(SK2, sizeof SK2, "%s", c->name);
        }
        if (c->kernel == K3_KERNEL_SKINNY && c->static_k == 7168 && !have_skk) {
            snprintf(SKK, sizeof SKK, "%s", c->name);
            have_skk = 1;
        }
        if (c->kernel == K3_KERNEL_MMA && c->max_k == 0) {
            if (!MM[0]) snprintf(MM, sizeof MM, "%s", c->name);
            snprintf(MM2, sizeof MM2, "%s", c->name);
        }
        if (c->kernel == K3_KERNEL_MMA && c->max_k > 0 && !MW[0]) snprintf(MW, sizeof MW, "%s", c->name);
    }
    if (!SK2[0]) snprintf(SK2, sizeof SK2, "%s", SK);
    if (!have_skk) snprintf(SKK, sizeof SKK, "%s", SK);
    CHECK(SK[0] && MM[0] && MW[0], "the registry has skinny, mma and whole-K mma configurations");
    printf("configurations used: SK %s, SK2 %s, SKK %s%s, MM %s, MM2 %s, MW %s\n", SK, SK2, SKK,
           have_skk ? "" : " (no static-K config)", MM, MM2, MW);
}

static inline const char *S(const char *tmpl) {
    static char ring[16][2048];
    static int next;
    char *out = ring[next];
    next = (next + 1) % 16;
    size_t o = 0;
    for (const char *p = tmpl; *p && o < sizeof ring[0] - 1;) {
        const char *name = NULL;
        size_t skip = 0;
        if (!strncmp(p, "{SK}", 4)) name = SK, skip = 4;
        else if (!strncmp(p, "{SK2}", 5)) name = SK2, skip = 5;
        else if (!strncmp(p, "{SKK}", 5)) name = SKK, skip = 5;
        else if (!strncmp(p, "{MM}", 4)) name = MM, skip = 4;
        else if (!strncmp(p, "{MM2}", 5)) name = MM2, skip = 5;
        else if (!strncmp(p, "{MW}", 4)) name = MW, skip = 4;
        if (name) {
            for (const char *q = name; *q && o < sizeof ring[0] - 1; q++) out[o++] = *q;
            p += skip;
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    return out;
}

typedef struct log_count {
    int warn, error;
    char last[512];
} log_count;

static inline void count_log(void *user, k3_log_level level, const char *msg) {
    log_count *c = (log_count *)user;
    if (level == K3_LOG_WARN) c->warn++;
    if (level == K3_LOG_ERROR) c->error++;
    snprintf(c->last, sizeof c->last, "%s", msg);
}

static inline k3_ctx *sim_ctx(int major, int minor, log_count *logs) {
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    opt.backend = K3_BACKEND_CPU;
    opt.sim_major = major;
    opt.sim_minor = minor;
    if (logs) {
        opt.log_fn = count_log;
        opt.log_user = logs;
        opt.log_level = K3_LOG_WARN;
    }
    k3_ctx *ctx = NULL;
    k3_status st = k3_ctx_create(&opt, &ctx);
    CHECK(st == K3_STATUS_SUCCESS && ctx, "simulated %d.%d context: %s", major, minor, k3_status_string(st));
    return ctx;
}

static inline int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fputs(text, f);
    return fclose(f) == 0;
}

/* Parses text expecting failure at `line` with `what` in the message. */
static inline void expect_bad(const char *text, int line, const char *what) {
    char err[512], want[32];
    k3_table *t = (k3_table *)0x1;
    k3_status st = k3_table_parse(text, "t.txt", &t, err, sizeof err);
    snprintf(want, sizeof want, "t.txt:%d: ", line);
    CHECK(st == K3_STATUS_FORMAT_ERROR, "malformed table accepted (want '%s'): %s", what, text);
    CHECK(t == NULL, "no table on failure");
    CHECK(strstr(err, want) == err, "message '%s' should start with '%s'", err, want);
    CHECK(strstr(err, what) != NULL, "message '%s' should mention '%s'", err, what);
}

static inline void plan_string(k3_ctx *ctx, int64_t n, int64_t k, int64_t m, char *buf, size_t size) {
    k3_linear_desc d;
    k3_linear_desc_init(&d, n, k);
    k3_linear_plan *p = NULL;
    buf[0] = '\0';
    k3_status st = k3_linear_plan_create(ctx, &d, &p);
    CHECK(st == K3_STATUS_SUCCESS, "plan %lldx%lld: %s", (long long)n, (long long)k, k3_ctx_last_error(ctx));
    if (p) CHECK(k3_linear_plan_kernel(p, m, buf, size) == K3_STATUS_SUCCESS, "plan_kernel");
    k3_linear_plan_destroy(p);
}

#endif
