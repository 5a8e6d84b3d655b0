/* Context, status strings, architecture facts (every shipped capability and some unknown ones). */
#include <string.h>

#include "k3.h"
#include "test_util.h"

static void check_arch_row(int major, int minor, int mixed_fma, k3_table_id table, int fp4) {
    k3_arch_info a;
    CHECK(k3_arch_from_capability(major, minor, &a) == K3_STATUS_SUCCESS, "(%d,%d)", major, minor);
    CHECK(a.has_mixed_bf16_fma == mixed_fma, "(%d,%d) mixed fma %d want %d", major, minor, a.has_mixed_bf16_fma,
          mixed_fma);
    CHECK(a.table == table, "(%d,%d) table %s want %s", major, minor, k3_table_name(a.table), k3_table_name(table));
    CHECK(a.has_fp4_mma == fp4, "(%d,%d) fp4 mma %d want %d", major, minor, a.has_fp4_mma, fp4);
    CHECK(a.sm_version == major * 10 + minor, "(%d,%d) sm_version %d", major, minor, a.sm_version);
    CHECK(a.simulated == 1, "simulated flag");
}

int main(void) {
    /* SM90, SM100, SM103, SM107 (Rubin, on the SM103 table), SM120, plus capabilities without a table */
    check_arch_row(9, 0, 0, K3_TABLE_SM90, 0);
    check_arch_row(10, 0, 1, K3_TABLE_SM100, 1);
    check_arch_row(10, 3, 1, K3_TABLE_SM103, 1);
    check_arch_row(10, 7, 1, K3_TABLE_SM103, 1);
    check_arch_row(12, 0, 1, K3_TABLE_NONE, 1);
    check_arch_row(8, 0, 0, K3_TABLE_NONE, 0);
    check_arch_row(8, 9, 0, K3_TABLE_NONE, 0);
    check_arch_row(11, 0, 1, K3_TABLE_NONE, 1);
    check_arch_row(9, 1, 0, K3_TABLE_NONE, 0);
    k3_arch_info a;
    CHECK(k3_arch_from_capability(0, 0, &a) == K3_STATUS_INVALID_ARGUMENT, "cc 0.0 rejected");
    CHECK(k3_arch_from_capability(9, 10, &a) == K3_STATUS_INVALID_ARGUMENT, "minor 10 rejected");
    CHECK(k3_arch_from_capability(9, 0, NULL) == K3_STATUS_INVALID_ARGUMENT, "NULL out rejected");

    /* status strings: every value has its own text */
    for (int s = 0; s <= K3_STATUS_COMM_ERROR; s++) {
        const char *t = k3_status_string((k3_status)s);
        CHECK(t && strcmp(t, "unknown status") != 0, "status %d has a string", s);
    }
    CHECK(!strcmp(k3_status_string((k3_status)999), "unknown status"), "unknown status");
    CHECK(!strcmp(k3_version(), "0.1.0"), "version %s", k3_version());

    /* CPU context and a simulated one */
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    opt.backend = K3_BACKEND_CPU;
    k3_ctx *ctx = NULL;
    CHECK(k3_ctx_create(&opt, &ctx) == K3_STATUS_SUCCESS && ctx, "cpu context");
    CHECK(k3_ctx_backend(ctx) == K3_BACKEND_CPU, "backend cpu");
    CHECK(!strcmp(k3_ctx_last_error(ctx), ""), "no error yet");
    CHECK(k3_ctx_arch(ctx, &a) == K3_STATUS_SUCCESS && a.table == K3_TABLE_NONE && !a.cuda_backend_usable, "cpu");
    /* a NULL out fails with a message (it used to leave none), and the next good call clears it */
    CHECK(k3_ctx_arch(ctx, NULL) == K3_STATUS_INVALID_ARGUMENT && strstr(k3_ctx_last_error(ctx), "out is NULL"),
          "k3_ctx_arch NULL out: '%s'", k3_ctx_last_error(ctx));
    CHECK(k3_ctx_arch(ctx, &a) == K3_STATUS_SUCCESS && !strcmp(k3_ctx_last_error(ctx), ""), "k3_ctx_arch clears");
    CHECK(k3_ctx_arch(NULL, &a) == K3_STATUS_INVALID_ARGUMENT, "k3_ctx_arch NULL ctx");
    k3_ctx_destroy(ctx);
    CHECK(opt.skip_pointer_checks == 0, "pointer checks are on by default");
    opt.skip_pointer_checks = 2;
    CHECK(k3_ctx_create(&opt, &ctx) == K3_STATUS_INVALID_ARGUMENT && ctx == NULL, "skip_pointer_checks 2 refused");
    opt.skip_pointer_checks = 1;
    CHECK(k3_ctx_create(&opt, &ctx) == K3_STATUS_SUCCESS && ctx, "skip_pointer_checks 1 taken");
    k3_ctx_destroy(ctx);
    opt.skip_pointer_checks = 0;

    opt.sim_major = 10;
    opt.sim_minor = 7;
    CHECK(k3_ctx_create(&opt, &ctx) == K3_STATUS_SUCCESS, "simulated context");
    CHECK(k3_ctx_arch(ctx, &a) == K3_STATUS_SUCCESS && a.table == K3_TABLE_SM103 && a.simulated, "sim 10.7");
    k3_ctx_destroy(ctx);

    opt.sim_major = 100;
    CHECK(k3_ctx_create(&opt, &ctx) == K3_STATUS_INVALID_ARGUMENT && ctx == NULL, "bad simulated cc");
    opt.sim_major = 9;
    opt.backend = K3_BACKEND_CUDA;
    CHECK(k3_ctx_create(&opt, &ctx) != K3_STATUS_SUCCESS && ctx == NULL, "simulation on CUDA is refused");
    CHECK(k3_ctx_create(NULL, NULL) == K3_STATUS_INVALID_ARGUMENT, "NULL out");
    k3_ctx_destroy(NULL);
    return k3t_finish();
}
