/* Internal definitions shared by every layer: the context object and the error/log helpers. */
#ifndef K3_CORE_INTERNAL_H
#define K3_CORE_INTERNAL_H

#include "k3.h"

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

#define K3_ERROR_MAX 1024

struct k3_cuda_state; /* src/cuda/: cuBLASLt handle and friends; NULL on CPU contexts */
struct k3_table;      /* src/plan/table.h: the GEMM table plans use (loaded, or the embedded one parsed lazily) */

struct k3_ctx {
    k3_backend backend;       /* resolved: CPU or CUDA, never AUTO */
    int32_t device;
    k3_arch_info arch;
    k3_log_fn log_fn;
    void *log_user;
    k3_log_level log_level;
    int32_t skip_pointer_checks; /* k3_ctx_options.skip_pointer_checks */
    struct k3_cuda_state *cuda;
    struct k3_table *table;   /* the embedded table (parsed by k3_ctx_create) or a loaded one; NULL if none */
    char last_error[K3_ERROR_MAX];
};

/* Records a formatted message as the context's last error, logs it at ERROR, returns `status`.
 * ctx may be NULL (then only the status is returned). */
k3_status k3_fail(k3_ctx *ctx, k3_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Logs a message when the context's level admits it. */
void k3_log(const k3_ctx *ctx, k3_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Clears the last error (called at the start of every public call that can fail). */
void k3_clear_error(k3_ctx *ctx);

#define K3_CHECK_ARG(ctx, cond, ...)                                                                         \
    do {                                                                                                     \
        if (!(cond)) return k3_fail((ctx), K3_STATUS_INVALID_ARGUMENT, __VA_ARGS__);                        \
    } while (0)

#define K3_TRY(expr)                                                                                         \
    do {                                                                                                     \
        k3_status k3_try_st_ = (expr);                                                                       \
        if (k3_try_st_ != K3_STATUS_SUCCESS) return k3_try_st_;                                              \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
