/* Activation-descriptor validation for plans: records the failure on the context. */
#ifndef K3_CORE_ACT_CHECK_H
#define K3_CORE_ACT_CHECK_H

#include "core/internal.h"

/* k3_act_desc_validate, with the message recorded via k3_fail (K3_STATUS_INVALID_ARGUMENT on failure). */
k3_status k3_act_check(k3_ctx *ctx, const k3_act_desc *d);

#endif
