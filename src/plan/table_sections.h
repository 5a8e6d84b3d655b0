/* The moe and kda sections of the plan tables (src/plan/table_sections.c): their rows parsed and checked, and
 * written back. The GEMM part of the parser (table.c) hands these rows over. */
#ifndef K3_PLAN_TABLE_SECTIONS_H
#define K3_PLAN_TABLE_SECTIONS_H

#include "plan/table_text.h"
#include "plan/table_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* SUCCESS when the section is well formed (every value in its range; kda: every m set, unfused choices exactly
 * where the shape is fused); else FORMAT_ERROR with the reason in err. present 0 is well formed. The parser checks
 * the same rules; these serve sections set by code. */
k3_status k3_table_moe_check(const k3_table_moe *moe, char *err, size_t err_size);
k3_status k3_table_kda_check(const k3_table_kda *kda, char *err, size_t err_size);

/* The section rows: tok[0] is "moe" / "kda", ntok counts every token (at most cap + 1 = more than fit). */
k3_status k3_table_parse_moe(k3_table_parser *p, k3_table *t, char **tok, int ntok);
k3_status k3_table_parse_kda(k3_table_parser *p, k3_table *t, char **tok, int ntok);
/* After the last line: the sections' completeness rules (every moe key, every kda m, ...). */
k3_status k3_table_sections_finish(k3_table_parser *p, k3_table *t);

/* The moe and kda rows of t (nothing for a section that is not present). */
void k3_table_format_sections(k3_sbuf *b, const k3_table *t);

#ifdef __cplusplus
}
#endif
#endif
