/* Internal to the table code (table.c, table_sections.c, table_write.c): the line parser's state and helpers, the
 * growing output buffer of the writer (defined in table_text.c). */
#ifndef K3_PLAN_TABLE_TEXT_H
#define K3_PLAN_TABLE_TEXT_H

#include <stddef.h>

#include "plan/table_types.h"

#define K3_TABLE_MOE_KEYS 11 /* keys of the moe section (k3_table_moe's members between present and line) */

typedef struct k3_table_parser {
    const char *source;
    int32_t line;
    char *err;
    size_t err_size;
    int32_t seen_row;     /* a row of any kind: header fields must come before */
    uint32_t seen_fields; /* bit per header field */
    int32_t moe_line[K3_TABLE_MOE_KEYS];                /* the line of each moe key, 0 = not yet */
    int32_t kda_overlap_line;                           /* the kda overlap_max_tokens row's line, 0 = not yet */
    int32_t kda_line[K3_TABLE_KDA_MAX_M + 1];           /* the line that set each m's choice */
    int32_t kda_unfused_line[K3_TABLE_KDA_MAX_M + 1];   /* the line that set each m's unfused choice */
} k3_table_parser;

/* Writes "<source>:<line>: <message>" into p->err; returns FORMAT_ERROR. */
k3_status k3_table_perr(k3_table_parser *p, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* A strict decimal number (digits only) in [lo, hi]: 1 and *out, else 0. */
int k3_table_parse_num(const char *s, int64_t lo, int64_t hi, int64_t *out);
/* "4" or "1-6" within [1, max_m]: 1 and *lo, *hi; else 0. */
int k3_table_parse_range(const char *s, int64_t max_m, int64_t *lo, int64_t *hi);

typedef struct k3_sbuf {
    char *s;
    size_t len, cap;
    int failed; /* out of memory: s is freed by the owner, the text is lost */
} k3_sbuf;

void k3_sbuf_printf(k3_sbuf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#endif
