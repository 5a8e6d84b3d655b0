#include "arch/arch.h"

#include <stdio.h>
#include <string.h>

/* The per-architecture facts the plans decide on. Kept as small pure functions so each rule reads on its own. */

static int32_t arch_has_mixed_bf16_fma(int32_t sm) { return sm >= 100; } /* fma.rn.f32.bf16: PTX ISA sm_100+ */

static int32_t arch_has_fp4_mma(int32_t sm) { return sm >= 100; } /* block-scaled FP4 MMA: Blackwell+ */

static k3_table_id arch_table(int32_t sm) {
    switch (sm) {
    case 90: return K3_TABLE_SM90;
    case 100: return K3_TABLE_SM100;
    case 103: return K3_TABLE_SM103;
    case 107: return K3_TABLE_SM103; /* Rubin: SM103's kernels compile there; crossovers not re-measured */
    default: return K3_TABLE_NONE;
    }
}

void k3_arch_facts(int32_t major, int32_t minor, k3_arch_info *out) {
    memset(out, 0, sizeof *out);
    out->cc_major = major;
    out->cc_minor = minor;
    out->sm_version = major * 10 + minor;
    if (major <= 0) return; /* a CPU context: no GPU facts */
    out->has_mixed_bf16_fma = arch_has_mixed_bf16_fma(out->sm_version);
    out->has_fp4_mma = arch_has_fp4_mma(out->sm_version);
    out->table = arch_table(out->sm_version);
}

k3_status k3_arch_from_capability(int32_t major, int32_t minor, k3_arch_info *out) {
    if (!out || major < 1 || major > 99 || minor < 0 || minor > 9) return K3_STATUS_INVALID_ARGUMENT;
    k3_arch_facts(major, minor, out);
    out->simulated = 1;
    snprintf(out->device_name, sizeof out->device_name, "simulated sm_%d", (int)out->sm_version);
    return K3_STATUS_SUCCESS;
}

const char *k3_table_name(k3_table_id table) {
    switch (table) {
    case K3_TABLE_NONE: return "none";
    case K3_TABLE_SM90: return "sm90";
    case K3_TABLE_SM100: return "sm100";
    case K3_TABLE_SM103: return "sm103";
    }
    return "none";
}
