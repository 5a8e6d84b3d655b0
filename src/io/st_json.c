/* The JSON parser of the safetensors header: recursive descent, every byte index checked against the
 * header's end, so a malformed or truncated header is an error, never an over-read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/st_common.h"

/* The header starts at file byte 8, so JSON position i is file offset 8 + i. */
k3_status k3_jp_fail(jp *p, const char *what) {
    if (p->plain)
        return k3_st_err(p->err, p->err_size, K3_STATUS_FORMAT_ERROR, "%s: JSON at byte %zu: %s", p->path, p->i,
                         what);
    return k3_st_err(p->err, p->err_size, K3_STATUS_FORMAT_ERROR, "%s: header JSON at byte %zu: %s", p->path,
                  (size_t)8 + p->i, what);
}

void k3_jp_ws(jp *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

/* Consumes character c (after whitespace) or fails. */
int k3_jp_eat(jp *p, char c) {
    k3_jp_ws(p);
    if (p->i < p->n && p->s[p->i] == c) {
        p->i++;
        return 1;
    }
    return 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int k3_jp_hex4(jp *p, uint32_t *out) {
    if (p->n - p->i < 4) return 0;
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(p->s[p->i + (size_t)k]);
        if (h < 0) return 0;
        v = v * 16u + (uint32_t)h;
    }
    p->i += 4;
    *out = v;
    return 1;
}

/* Parses a JSON string into a fresh NUL-terminated UTF-8 buffer (*out, owned by the caller). */
k3_status k3_jp_string(jp *p, char **out) {
    *out = NULL;
    k3_jp_ws(p);
    if (p->i >= p->n || p->s[p->i] != '"') return k3_jp_fail(p, "expected a string");
    p->i++;
    size_t start = p->i;
    /* an escaped string never grows: \uXXXX (6 bytes) becomes at most 3 bytes, a surrogate pair (12) 4 */
    size_t end = start;
    while (end < p->n && p->s[end] != '"') end += (p->s[end] == '\\') ? 2 : 1;
    if (end >= p->n) return k3_jp_fail(p, "unterminated string");
    char *buf = malloc(end - start + 1);
    if (!buf) return k3_st_err(p->err, p->err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory", p->path);
    size_t o = 0;
    while (p->i < p->n && p->s[p->i] != '"') {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c < 0x20) {
            free(buf);
            return k3_jp_fail(p, "control character in a string");
        }
        if (c >= 0x80) { /* strict readers refuse a file with invalid UTF-8, so it is refused here too */
            const size_t l = k3_st_utf8_seq((const unsigned char *)p->s + p->i, p->n - p->i);
            if (!l) {
                free(buf);
                return k3_jp_fail(p, "invalid UTF-8 in a string (a stray, truncated, overlong or surrogate sequence)");
            }
            memcpy(buf + o, p->s + p->i, l);
            o += l;
            p->i += l;
            continue;
        }
        if (c != '\\') {
            buf[o++] = (char)c;
            p->i++;
            continue;
        }
        p->i++;
        if (p->i >= p->n) break;
        char e = p->s[p->i++];
        switch (e) {
        case '"': buf[o++] = '"'; break;
        case '\\': buf[o++] = '\\'; break;
        case '/': buf[o++] = '/'; break;
        case 'b': buf[o++] = '\b'; break;
        case 'f': buf[o++] = '\f'; break;
        case 'n': buf[o++] = '\n'; break;
        case 'r': buf[o++] = '\r'; break;
        case 't': buf[o++] = '\t'; break;
        case 'u': {
            uint32_t cp = 0, lo = 0;
            if (!k3_jp_hex4(p, &cp)) goto bad_escape;
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* a high surrogate must be followed by a low one */
                if (p->n - p->i < 2 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') goto bad_escape;
                p->i += 2;
                if (!k3_jp_hex4(p, &lo) || lo < 0xDC00 || lo > 0xDFFF) goto bad_escape;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                goto bad_escape;
            }
            if (cp == 0) {
                free(buf);
                return k3_jp_fail(p, "a string contains \\u0000");
            }
            if (cp < 0x80) {
                buf[o++] = (char)cp;
            } else if (cp < 0x800) {
                buf[o++] = (char)(0xC0 | (cp >> 6));
                buf[o++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                buf[o++] = (char)(0xE0 | (cp >> 12));
                buf[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                buf[o++] = (char)(0x80 | (cp & 0x3F));
            } else {
                buf[o++] = (char)(0xF0 | (cp >> 18));
                buf[o++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                buf[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                buf[o++] = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default:
            goto bad_escape;
        }
    }
    if (p->i >= p->n) {
        free(buf);
        return k3_jp_fail(p, "unterminated string");
    }
    p->i++; /* closing quote */
    buf[o] = '\0';
    *out = buf;
    return K3_STATUS_SUCCESS;
bad_escape:
    free(buf);
    return k3_jp_fail(p, "bad escape sequence in a string");
}

/* A non-negative JSON integer (no sign, fraction or exponent) up to INT64_MAX. */
k3_status k3_jp_uint(jp *p, const char *what, int64_t *out) {
    k3_jp_ws(p);
    size_t start = p->i;
    if (p->i < p->n && p->s[p->i] == '-') {
        char msg[160];
        snprintf(msg, sizeof msg, "%s must not be negative", what);
        return k3_jp_fail(p, msg);
    }
    uint64_t v = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        uint64_t d = (uint64_t)(p->s[p->i] - '0');
        if (v > ((uint64_t)INT64_MAX - d) / 10) {
            char msg[160];
            snprintf(msg, sizeof msg, "%s is too large", what);
            return k3_jp_fail(p, msg);
        }
        v = v * 10 + d;
        p->i++;
    }
    if (p->i == start || (p->i - start > 1 && p->s[start] == '0') ||
        (p->i < p->n && (p->s[p->i] == '.' || p->s[p->i] == 'e' || p->s[p->i] == 'E'))) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s must be a non-negative integer", what);
        return k3_jp_fail(p, msg);
    }
    *out = (int64_t)v;
    return K3_STATUS_SUCCESS;
}

/* Skips any JSON value (for keys we do not use), depth-limited. */
k3_status k3_jp_skip(jp *p, int depth) {
    if (depth > K3_ST_MAX_DEPTH) return k3_jp_fail(p, "JSON nested too deeply");
    k3_jp_ws(p);
    if (p->i >= p->n) return k3_jp_fail(p, "unexpected end of header");
    char c = p->s[p->i];
    if (c == '"') {
        char *s = NULL;
        k3_status st = k3_jp_string(p, &s);
        free(s);
        return st;
    }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        p->i++;
        if (k3_jp_eat(p, close)) return K3_STATUS_SUCCESS;
        for (;;) {
            if (c == '{') {
                char *k = NULL;
                ST_TRY(k3_jp_key(p, &k));
                free(k);
            }
            ST_TRY(k3_jp_skip(p, depth + 1));
            if (k3_jp_eat(p, ',')) continue;
            if (k3_jp_eat(p, close)) return K3_STATUS_SUCCESS;
            return k3_jp_fail(p, c == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
        }
    }
    static const char *const lits[3] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t ln = strlen(lits[k]);
        if (c == lits[k][0]) {
            if (p->n - p->i < ln || memcmp(p->s + p->i, lits[k], ln) != 0) return k3_jp_fail(p, "bad JSON literal");
            p->i += ln;
            return K3_STATUS_SUCCESS;
        }
    }
    /* a number: -?digits(.digits)?([eE][+-]?digits)? */
    size_t start = p->i, nd = 0;
    if (p->s[p->i] == '-') p->i++;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++, nd++;
    if (nd && p->i < p->n && p->s[p->i] == '.') {
        size_t fd = 0;
        p->i++;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++, fd++;
        if (!fd) nd = 0;
    }
    if (nd && p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        size_t ed = 0;
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++, ed++;
        if (!ed) nd = 0;
    }
    if (!nd) {
        p->i = start;
        return k3_jp_fail(p, "expected a JSON value");
    }
    return K3_STATUS_SUCCESS;
}

k3_status k3_jp_key(jp *p, char **out) {
    *out = NULL;
    char *k = NULL;
    ST_TRY(k3_jp_string(p, &k));
    if (!k3_jp_eat(p, ':')) {
        free(k);
        return k3_jp_fail(p, "expected ':'");
    }
    *out = k;
    return K3_STATUS_SUCCESS;
}

k3_status k3_jp_string_object(jp *p, const char *not_object, const char *not_string, const char *what,
                              k3_status (*pair)(void *user, jp *p, char *key, char *value), void *user) {
    if (!k3_jp_eat(p, '{')) return k3_jp_fail(p, not_object);
    if (k3_jp_eat(p, '}')) return K3_STATUS_SUCCESS;
    for (;;) {
        char *k = NULL, *v = NULL;
        ST_TRY(k3_jp_key(p, &k));
        k3_jp_ws(p);
        if (p->i < p->n && p->s[p->i] != '"') {
            free(k);
            return k3_jp_fail(p, not_string);
        }
        const k3_status st = k3_jp_string(p, &v);
        if (st != K3_STATUS_SUCCESS) {
            free(k);
            return st;
        }
        ST_TRY(pair(user, p, k, v));
        if (k3_jp_eat(p, ',')) continue;
        if (k3_jp_eat(p, '}')) return K3_STATUS_SUCCESS;
        char msg[160];
        snprintf(msg, sizeof msg, "expected ',' or '}' in %s", what);
        return k3_jp_fail(p, msg);
    }
}
