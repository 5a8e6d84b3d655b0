/* Activation descriptors: defaults, the K3 preset, validation (the rules of docs/model.md section 2). */
#include "core/act_check.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

void k3_act_desc_init(k3_act_desc *d, k3_act_kind kind) {
    if (!d) return;
    d->kind = kind;
    d->alpha = 1.702f;
    d->beta = 1.0f;
    /* the gpt-oss SwiGLU clamp; SILU and the others default to no clamp */
    d->limit = (kind == K3_ACT_SWIGLUOAI || kind == K3_ACT_SWIGLUOAI_UNINTERLEAVE) ? 7.0f : 0.0f;
    d->situ_beta = 0.0f;
    d->situ_linear_beta = 0.0f;
}

void k3_act_desc_k3(k3_act_desc *d) {
    if (!d) return;
    k3_act_desc_init(d, K3_ACT_SITU);
    d->situ_beta = 4.0f;
    d->situ_linear_beta = 25.0f;
}

const char *k3_act_name(k3_act_kind kind) {
    switch (kind) {
    case K3_ACT_SILU: return "silu";
    case K3_ACT_SWIGLUOAI: return "swigluoai";
    case K3_ACT_SWIGLUOAI_UNINTERLEAVE: return "swigluoai_uninterleave";
    case K3_ACT_RELU2_NO_MUL: return "relu2";
    case K3_ACT_SITU: return "situ";
    }
    return "unknown";
}

static k3_status act_bad(char *msg, size_t msg_size, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static k3_status act_bad(char *msg, size_t msg_size, const char *fmt, ...) {
    if (msg && msg_size > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msg_size, fmt, ap);
        va_end(ap);
    }
    return K3_STATUS_INVALID_ARGUMENT;
}

k3_status k3_act_desc_validate(const k3_act_desc *d, char *msg, size_t msg_size) {
    if (msg && msg_size > 0) msg[0] = '\0';
    if (!d) return act_bad(msg, msg_size, "activation descriptor is NULL");
    switch (d->kind) {
    case K3_ACT_SILU:
    case K3_ACT_SWIGLUOAI:
    case K3_ACT_SWIGLUOAI_UNINTERLEAVE:
    case K3_ACT_RELU2_NO_MUL:
    case K3_ACT_SITU: break;
    default:
        return act_bad(msg, msg_size, "activation kind %d is unknown (expected 0..4: silu, swigluoai, "
                       "swigluoai_uninterleave, relu2, situ)", (int)d->kind);
    }
    const char *name = k3_act_name(d->kind);
    if (!isfinite(d->alpha)) return act_bad(msg, msg_size, "activation alpha must be finite (got %g)", d->alpha);
    if (!isfinite(d->beta)) return act_bad(msg, msg_size, "activation beta must be finite (got %g)", d->beta);
    /* 0 is the only "unset" value: a negative limit or beta is refused rather than silently read as unset
     * (a sign slip would otherwise drop a clamp with no word) */
    if (!isfinite(d->limit) || d->limit < 0.0f)
        return act_bad(msg, msg_size, "activation limit must be finite and >= 0 (0 means no clamp; got %g)",
                       d->limit);
    if (!isfinite(d->situ_beta) || d->situ_beta < 0.0f)
        return act_bad(msg, msg_size, "activation_situ_beta must be finite and > 0 (0 means unset; got %g)",
                       d->situ_beta);
    if (!isfinite(d->situ_linear_beta) || d->situ_linear_beta < 0.0f)
        return act_bad(msg, msg_size,
                       "activation_situ_linear_beta must be finite and > 0 when set (0 means unset; got %g)",
                       d->situ_linear_beta);

    if (d->kind == K3_ACT_SITU) {
        if (!(d->situ_beta > 0.0f)) return act_bad(msg, msg_size, "SITU activation requires activation_situ_beta");
        if (d->limit > 0.0f)
            return act_bad(msg, msg_size, "SITU activation takes no clamp limit (got limit %g; set it to 0)",
                           d->limit);
    } else if (d->situ_beta > 0.0f || d->situ_linear_beta > 0.0f) {
        /* engines key SiTU on situ_beta with a SiLU kind; here the kind is explicit, so refuse the ambiguity
         * rather than silently computing SiLU */
        return act_bad(msg, msg_size, "activation_situ_beta / activation_situ_linear_beta are set but the kind is "
                       "%s; use K3_ACT_SITU for SiTU", name);
    }
    if (d->kind == K3_ACT_SWIGLUOAI_UNINTERLEAVE && !(d->limit > 0.0f))
        return act_bad(msg, msg_size, "SWIGLUOAI_UNINTERLEAVE activation requires a clamp limit > 0 (got %g)",
                       d->limit);
    return K3_STATUS_SUCCESS;
}

k3_status k3_act_check(k3_ctx *ctx, const k3_act_desc *d) {
    char msg[256];
    k3_status st = k3_act_desc_validate(d, msg, sizeof msg);
    if (st != K3_STATUS_SUCCESS) return k3_fail(ctx, st, "%s", msg);
    return K3_STATUS_SUCCESS;
}
