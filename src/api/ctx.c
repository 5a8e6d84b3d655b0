/* Context creation: resolves the backend, reads (or simulates) the architecture facts. */
#include "arch/arch.h"
#include "cuda/common/backend.h"
#include "plan/linear_plan.h"
#include "plan/table.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void k3_ctx_options_init(k3_ctx_options *opt) {
    if (!opt) return;
    memset(opt, 0, sizeof *opt);
    opt->backend = K3_BACKEND_AUTO;
    opt->log_level = K3_LOG_WARN;
    const char *env = getenv("K3_LOG_LEVEL"); /* environment seeds defaults here and nowhere else */
    if (env && env[0] >= '0' && env[0] <= '3' && env[1] == '\0') opt->log_level = (k3_log_level)(env[0] - '0');
}

static k3_status ctx_init_cpu(k3_ctx *ctx, const k3_ctx_options *opt) {
    if (opt->sim_major > 0) {
        k3_status st = k3_arch_from_capability(opt->sim_major, opt->sim_minor, &ctx->arch);
        if (st != K3_STATUS_SUCCESS)
            return k3_fail(ctx, st, "simulated capability %d.%d is out of range (major 1..99, minor 0..9)",
                           (int)opt->sim_major, (int)opt->sim_minor);
        if (opt->sim_sm_count < 0 || opt->sim_sm_count > 4096)
            return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT, "simulated SM count %d is out of range (0..4096)",
                           (int)opt->sim_sm_count);
        ctx->arch.sm_count = opt->sim_sm_count;
    } else {
        if (opt->sim_sm_count != 0)
            return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT, "sim_sm_count needs a simulated capability (sim_major)");
        k3_arch_facts(0, 0, &ctx->arch);
        snprintf(ctx->arch.device_name, sizeof ctx->arch.device_name, "cpu");
    }
    ctx->backend = K3_BACKEND_CPU;
    return K3_STATUS_SUCCESS;
}

static k3_status ctx_init_cuda(k3_ctx *ctx, const k3_ctx_options *opt) {
    if (opt->sim_major > 0)
        return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT,
                       "a simulated capability is only allowed on a CPU context (it cannot run kernels)");
    K3_TRY(k3_cuda_device_query(ctx, opt->device, &ctx->arch));
    ctx->backend = K3_BACKEND_CUDA;
    ctx->device = opt->device;
    return k3_cuda_state_create(ctx);
}

k3_status k3_ctx_create(const k3_ctx_options *opt, k3_ctx **out) {
    if (!out) return K3_STATUS_INVALID_ARGUMENT;
    *out = NULL;
    k3_ctx_options defaults;
    if (!opt) {
        k3_ctx_options_init(&defaults);
        opt = &defaults;
    }
    if (opt->backend < K3_BACKEND_CPU || opt->backend > K3_BACKEND_AUTO || opt->log_level < K3_LOG_ERROR ||
        opt->log_level > K3_LOG_DEBUG || opt->device < 0 ||
        (opt->skip_pointer_checks != 0 && opt->skip_pointer_checks != 1))
        return K3_STATUS_INVALID_ARGUMENT;
    k3_ctx *ctx = (k3_ctx *)calloc(1, sizeof *ctx);
    if (!ctx) return K3_STATUS_OUT_OF_MEMORY;
    ctx->log_fn = opt->log_fn;
    ctx->log_user = opt->log_user;
    ctx->log_level = opt->log_level;
    ctx->skip_pointer_checks = opt->skip_pointer_checks;

    k3_backend want = opt->backend;
    if (want == K3_BACKEND_AUTO)
        want = (opt->sim_major <= 0 && k3_cuda_device_count() > opt->device) ? K3_BACKEND_CUDA : K3_BACKEND_CPU;
    k3_status st = (want == K3_BACKEND_CUDA) ? ctx_init_cuda(ctx, opt) : ctx_init_cpu(ctx, opt);
    /* parsed now, not by the first plan, so that plans made by several threads only read the context */
    if (st == K3_STATUS_SUCCESS) st = k3_linear_ctx_parse_embedded(ctx);
    if (st != K3_STATUS_SUCCESS) {
        k3_ctx_destroy(ctx);
        return st;
    }
    ctx->arch.cuda_backend_usable = (ctx->backend == K3_BACKEND_CUDA);
    k3_log(ctx, K3_LOG_INFO, "k3 %s: %s context on %s", k3_version(),
           ctx->backend == K3_BACKEND_CUDA ? "CUDA" : "CPU", ctx->arch.device_name);
    *out = ctx;
    return K3_STATUS_SUCCESS;
}

void k3_ctx_destroy(k3_ctx *ctx) {
    if (!ctx) return;
    k3_cuda_state_destroy(ctx->cuda);
    k3_table_destroy(ctx->table);
    free(ctx);
}

const char *k3_ctx_last_error(const k3_ctx *ctx) { return ctx ? ctx->last_error : "no context"; }

k3_backend k3_ctx_backend(const k3_ctx *ctx) { return ctx ? ctx->backend : K3_BACKEND_CPU; }

k3_status k3_ctx_arch(const k3_ctx *ctx, k3_arch_info *out) {
    if (!ctx) return K3_STATUS_INVALID_ARGUMENT;
    /* the message is the only state this call changes; every context is made non-const by k3_ctx_create */
    k3_ctx *mctx = (k3_ctx *)(uintptr_t)ctx;
    k3_clear_error(mctx);
    K3_CHECK_ARG(mctx, out != NULL, "k3_ctx_arch: out is NULL");
    *out = ctx->arch;
    return K3_STATUS_SUCCESS;
}
