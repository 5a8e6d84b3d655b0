#include "core/internal.h"

#include <stdio.h>
#include <string.h>

#define K3_STR2(x) #x
#define K3_STR(x) K3_STR2(x)

const char *k3_version(void) {
    return K3_STR(K3_VERSION_MAJOR) "." K3_STR(K3_VERSION_MINOR) "." K3_STR(K3_VERSION_PATCH);
}

const char *k3_status_string(k3_status status) {
    switch (status) {
    case K3_STATUS_SUCCESS: return "success";
    case K3_STATUS_INVALID_ARGUMENT: return "invalid argument";
    case K3_STATUS_UNSUPPORTED: return "unsupported";
    case K3_STATUS_OUT_OF_MEMORY: return "out of memory";
    case K3_STATUS_NOT_AVAILABLE: return "not available";
    case K3_STATUS_CUDA_ERROR: return "CUDA error";
    case K3_STATUS_CUBLAS_ERROR: return "cuBLAS error";
    case K3_STATUS_IO_ERROR: return "I/O error";
    case K3_STATUS_FORMAT_ERROR: return "format error";
    case K3_STATUS_KEY_MISMATCH: return "table key mismatch";
    case K3_STATUS_INTERNAL_ERROR: return "internal error";
    case K3_STATUS_COMM_ERROR: return "communication error";
    }
    return "unknown status";
}

static void k3_log_v(const k3_ctx *ctx, k3_log_level level, const char *fmt, va_list ap) {
    if (!ctx || !ctx->log_fn || level > ctx->log_level) return;
    char buf[K3_ERROR_MAX];
    vsnprintf(buf, sizeof buf, fmt, ap);
    ctx->log_fn(ctx->log_user, level, buf);
}

void k3_log(const k3_ctx *ctx, k3_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    k3_log_v(ctx, level, fmt, ap);
    va_end(ap);
}

k3_status k3_fail(k3_ctx *ctx, k3_status status, const char *fmt, ...) {
    if (!ctx) return status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->last_error, sizeof ctx->last_error, fmt, ap);
    va_end(ap);
    if (ctx->log_fn && K3_LOG_ERROR <= ctx->log_level) ctx->log_fn(ctx->log_user, K3_LOG_ERROR, ctx->last_error);
    return status;
}

void k3_clear_error(k3_ctx *ctx) {
    if (ctx) ctx->last_error[0] = '\0';
}
