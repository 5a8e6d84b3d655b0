/*
 * safetensors reader/writer: round trip of every dtype and of metadata, a table of malformed files (each a
 * FORMAT_ERROR with a message, no crash; the ASan build proves no over-read), and bounded truncation /
 * byte-flip fuzzing of a valid file.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "test_util.h"

#define SEED 77031ull

static char dir[256];

static const char *tmp_path(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc(sz > 0 ? (size_t)sz : 1);
    *n = fread(p, 1, (size_t)sz, f);
    fclose(f);
    return p;
}

/* A file made of an 8-byte length (hlen, or strlen(header) when hlen < 0), the header text and `data` zero
 * bytes. */
static void write_raw(const char *path, const char *header, long long hlen, size_t data) {
    size_t hn = strlen(header);
    unsigned long long len = hlen < 0 ? (unsigned long long)hn : (unsigned long long)hlen;
    unsigned char *buf = calloc(8 + hn + data + 1, 1);
    for (int k = 0; k < 8; k++) buf[k] = (unsigned char)(len >> (8 * k));
    memcpy(buf + 8, header, hn);
    write_bytes(path, buf, 8 + hn + data);
    free(buf);
}

static void test_round_trip(k3t_rng *rng) {
    k3_st_writer *w = NULL;
    char err[256];
    CHECK(k3_st_writer_create(&w) == K3_STATUS_SUCCESS && w, "writer");
    static const k3_st_dtype all[8] = {K3_ST_BF16, K3_ST_F16, K3_ST_F32, K3_ST_F64,
                                       K3_ST_I32,  K3_ST_I64, K3_ST_U8,  K3_ST_F8_E4M3};
    static const char *names[8] = {"BF16", "F16", "F32", "F64", "I32", "I64", "U8", "F8_E4M3"};
    static const size_t sizes[8] = {2, 2, 4, 8, 4, 8, 1, 1};
    unsigned char *payload[8];
    int64_t shapes[8][3];
    for (int i = 0; i < 8; i++) {
        CHECK(!strcmp(k3_st_dtype_name(all[i]), names[i]) && k3_st_dtype_size(all[i]) == sizes[i], "dtype %s",
              names[i]);
        /* odd element counts so U8/F8 tensors leave the next tensor misaligned in the file */
        shapes[i][0] = 3;
        shapes[i][1] = 1 + i;
        shapes[i][2] = 5;
        size_t nb = 15 * (size_t)(1 + i) * sizes[i];
        payload[i] = malloc(nb);
        for (size_t k = 0; k < nb; k++) payload[i][k] = (unsigned char)k3t_next(rng);
        char name[64];
        snprintf(name, sizeof name, "layer.%d.%s \"q\\", i, names[i]); /* quote and backslash need escaping */
        CHECK(k3_st_writer_add(w, name, all[i], 3, shapes[i], payload[i], err, sizeof err) == K3_STATUS_SUCCESS,
              "add %s: %s", name, err);
    }
    /* reverse order of alignment: a U8 tensor followed by an F64 one */
    unsigned char odd[3] = {1, 2, 3};
    double dv[2] = {1.5, -2.25};
    int64_t s3 = 3, s2 = 2;
    CHECK(k3_st_writer_add(w, "odd", K3_ST_U8, 1, &s3, odd, err, sizeof err) == 0, "odd");
    CHECK(k3_st_writer_add(w, "after_odd", K3_ST_F64, 1, &s2, dv, err, sizeof err) == 0, "after_odd");
    float scalar = 3.25f;
    CHECK(k3_st_writer_add(w, "scalar", K3_ST_F32, 0, NULL, &scalar, err, sizeof err) == 0, "scalar");
    int64_t zero_shape[2] = {4, 0};
    CHECK(k3_st_writer_add(w, "empty", K3_ST_F32, 2, zero_shape, NULL, err, sizeof err) == 0, "empty: %s", err);
    CHECK(k3_st_writer_add(w, "utf8 \xc3\xa9\n", K3_ST_U8, 1, &s3, odd, err, sizeof err) == 0, "utf8 name");
    CHECK(k3_st_writer_set_metadata(w, "format", "pt", err, sizeof err) == 0, "meta");
    CHECK(k3_st_writer_set_metadata(w, "note", "a \"quoted\"\\ value\twith\x01 control", err, sizeof err) == 0, "m");
    CHECK(k3_st_writer_set_metadata(w, "format", "k3", err, sizeof err) == 0, "meta replace");

    /* rejected additions */
    CHECK(k3_st_writer_add(w, "odd", K3_ST_U8, 1, &s3, odd, err, sizeof err) == K3_STATUS_INVALID_ARGUMENT &&
              strstr(err, "duplicate"),
          "duplicate name rejected: %s", err);
    int64_t neg = -1;
    CHECK(k3_st_writer_add(w, "neg", K3_ST_U8, 1, &neg, odd, err, sizeof err) == K3_STATUS_INVALID_ARGUMENT,
          "negative dim rejected");
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    CHECK(k3_st_writer_add(w, "nine", K3_ST_U8, 9, nine, odd, err, sizeof err) == K3_STATUS_INVALID_ARGUMENT,
          "9 dims rejected");
    CHECK(k3_st_writer_add(w, "m1", K3_ST_U8, -1, nine, odd, err, sizeof err) == K3_STATUS_INVALID_ARGUMENT,
          "ndim -1 rejected");
    int64_t huge[3] = {1ll << 40, 1ll << 40, 1ll << 40};
    CHECK(k3_st_writer_add(w, "huge", K3_ST_F32, 3, huge, odd, err, sizeof err) == K3_STATUS_INVALID_ARGUMENT,
          "size overflow rejected");
    CHECK(k3_st_writer_add(w, "nul", K3_ST_F32, 1, &s2, NULL, err, sizeof err) == K3_STATUS_INVALID_ARGUMENT,
          "NULL data rejected");
    CHECK(k3_st_writer_add(w, "__metadata__", K3_ST_U8, 1, &s3, odd, err, sizeof err) == K3_STATUS_INVALID_ARGUMENT,
          "reserved name rejected");
    CHECK(k3_st_writer_add(w, "", K3_ST_U8, 1, &s3, odd, err, sizeof err) == K3_STATUS_INVALID_ARGUMENT, "empty");
    CHECK(k3_st_writer_add(w, "bad", (k3_st_dtype)99, 1, &s3, odd, err, sizeof err) == K3_STATUS_INVALID_ARGUMENT,
          "bad dtype rejected");

    const char *path = tmp_path("rt.safetensors");
    CHECK(k3_st_writer_save(w, path, err, sizeof err) == K3_STATUS_SUCCESS, "save: %s", err);
    k3_st_writer_destroy(w);

    size_t fn = 0;
    unsigned char *raw = read_bytes(path, &fn);
    unsigned long long hl = 0;
    for (int k = 7; k >= 0; k--) hl = (hl << 8) | raw[k];
    CHECK((8 + hl) % 8 == 0 && raw[8] == '{' && (raw[8 + hl - 1] == ' ' || raw[8 + hl - 1] == '}'),
          "header padded with spaces so the data starts 8-aligned (header %llu bytes)", hl);
    free(raw);

    k3_st_file *f = NULL;
    CHECK(k3_st_open(path, &f, err, sizeof err) == K3_STATUS_SUCCESS && f, "open: %s", err);
    if (!f) return;
    CHECK(k3_st_count(f) == 13, "13 tensors (got %d)", k3_st_count(f));
    int bad = 0;
    for (int i = 0; i < 8; i++) {
        const k3_st_tensor *t = k3_st_at(f, i); /* file order = insertion order for our writer */
        char name[64];
        snprintf(name, sizeof name, "layer.%d.%s \"q\\", i, names[i]);
        size_t nb = 15 * (size_t)(1 + i) * sizes[i];
        if (!t || strcmp(t->name, name) || t->dtype != all[i] || t->ndim != 3 || t->shape[0] != 3 ||
            t->shape[1] != 1 + i || t->shape[2] != 5 || t->nbytes != nb || memcmp(t->data, payload[i], nb) ||
            ((uintptr_t)t->data % sizes[i]) != 0 || k3_st_find(f, name) != t)
            bad++;
        free(payload[i]);
    }
    CHECK(bad == 0, "every dtype round trips (name, dtype, shape, bytes, alignment) (%d bad)", bad);
    const k3_st_tensor *t = k3_st_find(f, "after_odd");
    CHECK(t && t->nbytes == 16 && ((uintptr_t)t->data % 8) == 0 && ((const double *)t->data)[1] == -2.25,
          "an F64 tensor after a 3-byte one is readable and aligned");
    t = k3_st_find(f, "scalar");
    CHECK(t && t->ndim == 0 && t->nbytes == 4 && *(const float *)t->data == 3.25f, "scalar tensor");
    t = k3_st_find(f, "empty");
    CHECK(t && t->ndim == 2 && t->shape[1] == 0 && t->nbytes == 0, "empty tensor");
    CHECK(k3_st_find(f, "utf8 \xc3\xa9\n") != NULL, "UTF-8 and escaped control characters in a name");
    CHECK(k3_st_find(f, "nope") == NULL && k3_st_at(f, 13) == NULL && k3_st_at(f, -1) == NULL, "absent");
    CHECK(k3_st_metadata_count(f) == 2, "2 metadata entries");
    const char *fmt = k3_st_metadata_get(f, "format"), *note = k3_st_metadata_get(f, "note");
    CHECK(fmt && !strcmp(fmt, "k3"), "metadata replaced value");
    CHECK(note && !strcmp(note, "a \"quoted\"\\ value\twith\x01 control"), "metadata escapes round trip");
    CHECK(k3_st_metadata_get(f, "x") == NULL, "absent metadata");
    k3_st_close(f);

    /* an empty writer makes a valid empty file */
    CHECK(k3_st_writer_create(&w) == 0, "writer");
    CHECK(k3_st_writer_save(w, path, err, sizeof err) == 0, "save empty");
    k3_st_writer_destroy(w);
    CHECK(k3_st_open(path, &f, err, sizeof err) == 0 && k3_st_count(f) == 0, "open empty: %s", err);
    k3_st_close(f);
    k3_st_close(NULL);
    k3_st_writer_destroy(NULL);
    CHECK(k3_st_writer_save(NULL, path, err, sizeof err) == K3_STATUS_INVALID_ARGUMENT, "save NULL writer");
    CHECK(k3_st_open(tmp_path("missing.safetensors"), &f, err, sizeof err) == K3_STATUS_IO_ERROR && !f &&
              strstr(err, "missing.safetensors"),
          "missing file: IO_ERROR naming it (%s)", err);
    CHECK(k3_st_open(NULL, &f, err, sizeof err) == K3_STATUS_INVALID_ARGUMENT, "NULL path");
    CHECK(k3_st_open(path, NULL, err, sizeof err) == K3_STATUS_INVALID_ARGUMENT, "NULL out");
    w = NULL;
    CHECK(k3_st_writer_create(&w) == 0, "writer");
    CHECK(k3_st_writer_save(w, tmp_path("no/such/dir.safetensors"), err, sizeof err) == K3_STATUS_IO_ERROR,
          "unwritable path: IO_ERROR (%s)", err);
    k3_st_writer_destroy(w);
}

typedef struct bad_case {
    const char *what;
    const char *header;
    long long hlen; /* -1 = strlen(header) */
    size_t data;
} bad_case;

static void test_malformed(void) {
    const bad_case cases[] = {
        {"empty file", "", -2, 0},
        {"header length > file", "{}", 1000, 0},
        {"header length > 100 MB", "{}", 200000000, 0},
        {"header length 0", "", 0, 0},
        {"bad JSON: truncated", "{\"a\":", -1, 0},
        {"bad JSON: not an object", "[]", -1, 0},
        {"bad JSON: trailing garbage", "{} x", -1, 0},
        {"bad JSON: missing colon", "{\"a\" {}}", -1, 0},
        {"bad JSON: trailing comma", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},}", -1, 1},
        {"unknown dtype", "{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}}", -1, 1},
        {"dtype not a string", "{\"a\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,1]}}", -1, 1},
        {"shape/offset mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", -1, 4},
        {"overlapping offsets",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         -1, 12},
        {"offsets past the data", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", -1, 8},
        {"hole between tensors",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
         -1, 12},
        {"bytes after the last tensor", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 9},
        {"end before begin", "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", -1, 4},
        {"negative dim", "{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}", -1, 0},
        {"negative offset", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", -1, 1},
        {"fractional dim", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", -1, 1},
        {"exponent dim", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1e0],\"data_offsets\":[0,1]}}", -1, 1},
        {"leading zero", "{\"a\":{\"dtype\":\"U8\",\"shape\":[01],\"data_offsets\":[0,1]}}", -1, 1},
        {"dim too large", "{\"a\":{\"dtype\":\"U8\",\"shape\":[99999999999999999999],\"data_offsets\":[0,1]}}", -1, 1},
        {"size overflow",
         "{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,0]}}", -1, 0},
        {"size overflow (wraps to a small value)",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,0]}}", -1, 0},
        {"9 dimensions", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", -1, 1},
        {"duplicate names",
         "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
         "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
         -1, 2},
        {"missing data_offsets", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", -1, 1},
        {"missing dtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", -1, 1},
        {"duplicate key in a tensor",
         "{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", -1, 1},
        {"three data_offsets", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", -1, 1},
        {"tensor entry not an object", "{\"a\":[1,2]}", -1, 0},
        {"metadata value not a string", "{\"__metadata__\":{\"k\":1}}", -1, 0},
        {"metadata not an object", "{\"__metadata__\":\"x\"}", -1, 0},
        {"duplicate __metadata__", "{\"__metadata__\":{},\"__metadata__\":{}}", -1, 0},
        {"unterminated string", "{\"abc", -1, 0},
        {"bad escape", "{\"a\\x\":{}}", -1, 0},
        {"escape at the end", "{\"a\\", -1, 0},
        {"short \\u escape", "{\"a\\u12\"}", -1, 0},
        {"lone low surrogate", "{\"a\\udc00\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", -1, 0},
        {"high surrogate alone", "{\"a\\ud800x\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", -1, 0},
        {"\\u0000 in a name", "{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", -1, 0},
        {"control character in a string", "{\"a\tb\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", -1, 0},
        {"bad literal in an unknown key",
         "{\"a\":{\"dtype\":\"U8\",\"x\":tru,\"shape\":[1],\"data_offsets\":[0,1]}}", -1, 1},
        {"bad number in an unknown key",
         "{\"a\":{\"dtype\":\"U8\",\"x\":-,\"shape\":[1],\"data_offsets\":[0,1]}}", -1, 1},
        {"empty tensor name", "{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", -1, 1},
        {"duplicate shape key (more dims the second time)",
         "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1],\"shape\":[1,1,1,1,1],\"data_offsets\":[0,1]}}", -1, 1},
        {"UTF-8: stray continuation byte in a name", "{\"a\x80\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}",
         -1, 0},
        {"UTF-8: overlong 2-byte '/'", "{\"a\xc0\xaf\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", -1, 0},
        {"UTF-8: overlong 3-byte", "{\"a\xe0\x80\xaf\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", -1,
         0},
        {"UTF-8: overlong 4-byte", "{\"a\xf0\x80\x80\xaf\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}",
         -1, 0},
        {"UTF-8: encoded surrogate U+D800", "{\"a\xed\xa0\x80\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}",
         -1, 0},
        {"UTF-8: above U+10FFFF", "{\"a\xf4\x90\x80\x80\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", -1,
         0},
        {"UTF-8: byte 0xFF", "{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", -1, 0},
        {"UTF-8: truncated sequence", "{\"a\xe2\x82\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", -1, 0},
        {"UTF-8: invalid in a metadata key", "{\"__metadata__\":{\"k\xc3\":\"v\"}}", -1, 0},
        {"UTF-8: invalid in a metadata value", "{\"__metadata__\":{\"k\":\"v\xa9\"}}", -1, 0},
        {"UTF-8: invalid in a skipped key",
         "{\"a\":{\"x\":\"\xfe\",\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", -1, 0},
        {"duplicate metadata key", "{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", -1, 0},
        {"header shorter than its JSON", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 20, 40},
    };
    const int n = (int)(sizeof cases / sizeof cases[0]);
    const char *path = tmp_path("bad.safetensors");
    int rejected = 0;
    for (int i = 0; i < n; i++) {
        if (cases[i].hlen == -2) write_bytes(path, "", 0);
        else write_raw(path, cases[i].header, cases[i].hlen, cases[i].data);
        k3_st_file *f = (k3_st_file *)&rejected; /* must be reset to NULL */
        char err[512] = "";
        k3_status st = k3_st_open(path, &f, err, sizeof err);
        CHECK(st == K3_STATUS_FORMAT_ERROR && f == NULL && err[0] && strstr(err, "bad.safetensors"),
              "%s: want FORMAT_ERROR with a message naming the file, got %s '%s'", cases[i].what,
              k3_status_string(st), err);
        rejected += st == K3_STATUS_FORMAT_ERROR;
        if (i < 3 || getenv("K3_TEST_VERBOSE")) printf("  %-28s -> %s\n", cases[i].what, err);
    }
    printf("%d of %d malformed files rejected\n", rejected, n);

    /* the messages say what is wrong, where */
    struct {
        const char *header, *want;
    } msgs[] = {
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1],\"shape\":[1,1,1,1,1],\"data_offsets\":[0,1]}}",
         "duplicate key 'shape'"},
        {"{\"ab\x80\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", "at byte 12: invalid UTF-8"},
        {"{\"__metadata__\":{\"k\":\"v\xed\xbf\xbf\"}}", "at byte 31: invalid UTF-8"},
        {"{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", "empty tensor name"},
        {"{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", "duplicate key 'k' in __metadata__"},
    };
    for (size_t i = 0; i < sizeof msgs / sizeof msgs[0]; i++) {
        write_raw(path, msgs[i].header, -1, 1);
        k3_st_file *f = NULL;
        char err[512] = "";
        k3_st_open(path, &f, err, sizeof err);
        CHECK(!f && strstr(err, msgs[i].want), "message '%s' wanted, got '%s'", msgs[i].want, err);
        k3_st_close(f);
    }

    /* nesting deeper than the parser allows, inside a key it would skip */
    char deep[1024];
    int o = snprintf(deep, sizeof deep, "{\"a\":{\"x\":");
    for (int i = 0; i < 200; i++) deep[o++] = '[';
    for (int i = 0; i < 200; i++) deep[o++] = ']';
    snprintf(deep + o, sizeof deep - (size_t)o, ",\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}");
    write_raw(path, deep, -1, 0);
    k3_st_file *df = NULL;
    char derr[512] = "";
    CHECK(k3_st_open(path, &df, derr, sizeof derr) == K3_STATUS_FORMAT_ERROR && strstr(derr, "deep"),
          "200-deep nesting rejected: %s", derr);

    /* valid oddities that must be accepted */
    const bad_case good[] = {
        {"spaces padding, unknown key skipped",
         "  { \"a\" : {\"x\": {\"y\": [1, -2.5e3, true, null, \"s\"]}, \"dtype\" : \"U8\", \"shape\" : [ 2 ] ,"
         " \"data_offsets\" : [ 0 , 2 ] } }      ",
         -1, 2},
        {"escaped name", "{\"\\u00e9\\ud83d\\ude00\\n\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", -1,
         1},
        {"raw (unescaped) UTF-8: 2, 3 and 4 bytes",
         "{\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", -1, 1},
        {"zero-size tensors at one offset",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[0, 5],\"data_offsets\":[0,0]}}",
         -1, 0},
    };
    for (int i = 0; i < (int)(sizeof good / sizeof good[0]); i++) {
        write_raw(path, good[i].header, good[i].hlen, good[i].data);
        k3_st_file *f = NULL;
        char err[512] = "";
        CHECK(k3_st_open(path, &f, err, sizeof err) == K3_STATUS_SUCCESS, "%s accepted: %s", good[i].what, err);
        if (i == 1) CHECK(f && k3_st_find(f, "\xc3\xa9\xf0\x9f\x98\x80\n"), "\\u escapes and surrogates decoded");
        if (i == 2) CHECK(f && k3_st_find(f, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"), "raw UTF-8 name kept");
        k3_st_close(f);
    }
}

/* Truncations and byte flips of a valid file: every outcome is SUCCESS or FORMAT_ERROR, never a crash. */
static void test_fuzz(k3t_rng *rng) {
    k3_st_writer *w = NULL;
    char err[512];
    k3_st_writer_create(&w);
    unsigned char d[64];
    for (int i = 0; i < 64; i++) d[i] = (unsigned char)i;
    int64_t s1[2] = {2, 4}, s2[1] = {3}, s3[1] = {5};
    k3_st_writer_add(w, "w", K3_ST_F32, 2, s1, d, err, sizeof err);
    k3_st_writer_add(w, "b", K3_ST_U8, 1, s2, d, err, sizeof err);
    k3_st_writer_add(w, "i", K3_ST_BF16, 1, s3, d, err, sizeof err);
    k3_st_writer_set_metadata(w, "k", "v", err, sizeof err);
    const char *src = tmp_path("fuzz_src.safetensors"), *path = tmp_path("fuzz.safetensors");
    CHECK(k3_st_writer_save(w, src, err, sizeof err) == 0, "fuzz source");
    k3_st_writer_destroy(w);
    size_t n = 0;
    unsigned char *good = read_bytes(src, &n);
    int trunc_ok = 1;
    for (size_t len = 0; len < n; len++) {
        write_bytes(path, good, len);
        k3_st_file *f = NULL;
        k3_status st = k3_st_open(path, &f, err, sizeof err);
        if (st != K3_STATUS_FORMAT_ERROR || f || !err[0]) trunc_ok = 0;
        k3_st_close(f);
    }
    CHECK(trunc_ok, "all %zu truncations rejected with FORMAT_ERROR", n);
    int flips_ok = 1, accepted = 0;
    unsigned char *buf = malloc(n);
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, good, n);
        int nflip = 1 + (int)(k3t_next(rng) % 3);
        for (int k = 0; k < nflip; k++) {
            size_t pos = (size_t)(k3t_next(rng) % (it % 4 == 0 ? 8 : n)); /* the length field gets its share */
            buf[pos] = (unsigned char)k3t_next(rng);
        }
        write_bytes(path, buf, n);
        k3_st_file *f = NULL;
        k3_status st = k3_st_open(path, &f, err, sizeof err);
        if (st == K3_STATUS_SUCCESS) {
            accepted++;
            size_t total = 0; /* an accepted file's tensors must still tile the data inside the file */
            for (int32_t i = 0; i < k3_st_count(f); i++) total += k3_st_at(f, i)->nbytes;
            if (total > n) flips_ok = 0;
        } else if (st != K3_STATUS_FORMAT_ERROR || f || !err[0]) {
            flips_ok = 0;
            fprintf(stderr, "flip %d: %s %s\n", it, k3_status_string(st), err);
        }
        k3_st_close(f);
    }
    printf("byte flips: %d of 3000 mutated files still valid (flips in tensor data)\n", accepted);
    CHECK(flips_ok, "every byte-flipped file is accepted consistently or rejected with FORMAT_ERROR");
    free(buf);
    free(good);
    remove(src);
    remove(path);
}

/* Names in this folder that start with prefix (a leftover temporary file of the writer). */
static int count_prefixed(const char *prefix) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "exit $(ls -a '%s' | grep -c '^%s')", dir, prefix);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The writer never truncates or removes the destination: a failed save (here a file size limit, as a full disk
 * would) leaves the old file byte for byte, and only its own temporary file is removed. */
static void test_atomic_save(void) {
    const char *path = tmp_path("keep.safetensors");
    char err[512];
    k3_st_writer *w = NULL;
    k3_st_writer_create(&w);
    unsigned char small[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    int64_t s16 = 16;
    k3_st_writer_add(w, "small", K3_ST_U8, 1, &s16, small, err, sizeof err);
    CHECK(k3_st_writer_save(w, path, err, sizeof err) == K3_STATUS_SUCCESS, "save the original: %s", err);
    k3_st_writer_destroy(w);
    chmod(path, 0640);
    size_t n0 = 0;
    unsigned char *orig = read_bytes(path, &n0);

    /* a second save of 64 KiB under a 4 KiB file size limit (SIGXFSZ ignored, so write fails with EFBIG) */
    w = NULL;
    k3_st_writer_create(&w);
    int64_t big_n = 65536;
    unsigned char *big = calloc((size_t)big_n, 1);
    k3_st_writer_add(w, "big", K3_ST_U8, 1, &big_n, big, err, sizeof err);
    struct rlimit old_lim, lim;
    getrlimit(RLIMIT_FSIZE, &old_lim);
    lim = old_lim;
    lim.rlim_cur = 4096;
    void (*old_sig)(int) = signal(SIGXFSZ, SIG_IGN);
    const int limited = setrlimit(RLIMIT_FSIZE, &lim) == 0;
    err[0] = '\0';
    const k3_status st = k3_st_writer_save(w, path, err, sizeof err);
    setrlimit(RLIMIT_FSIZE, &old_lim);
    signal(SIGXFSZ, old_sig);
    CHECK(limited, "setrlimit(RLIMIT_FSIZE)");
    CHECK(st == K3_STATUS_IO_ERROR && strstr(err, "keep.safetensors") && strstr(err, "unchanged"),
          "a save past the file size limit fails with a message (%s: %s)", k3_status_string(st), err);
    size_t n1 = 0;
    unsigned char *after = read_bytes(path, &n1);
    CHECK(after && n1 == n0 && memcmp(after, orig, n0) == 0, "the existing file is byte-identical after the failure");
    CHECK(count_prefixed("keep.safetensors.k3tmp") == 0, "no temporary file is left behind");
    free(after);

    /* a name already taken by someone else's file is skipped (O_EXCL), that file untouched */
    char taken[600];
    snprintf(taken, sizeof taken, "%s.k3tmp-%ld-0", path, (long)getpid());
    write_bytes(taken, "mine", 4);
    CHECK(k3_st_writer_save(w, path, err, sizeof err) == K3_STATUS_SUCCESS, "save replaces the file: %s", err);
    size_t nt = 0;
    unsigned char *tb = read_bytes(taken, &nt);
    CHECK(tb && nt == 4 && !memcmp(tb, "mine", 4), "an existing file with the temporary name is left alone");
    free(tb);
    remove(taken);
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (size_t)sb.st_size > 65536 && (sb.st_mode & 0777) == 0640,
          "the new file replaced the old one and kept its mode 0640 (mode %o)", (unsigned)(sb.st_mode & 0777));
    k3_st_file *f = NULL;
    CHECK(k3_st_open(path, &f, err, sizeof err) == 0 && k3_st_find(f, "big") && !k3_st_find(f, "small"),
          "the replaced file reads back");
    k3_st_close(f);
    k3_st_writer_destroy(w);
    free(big);
    free(orig);
    remove(path);

    /* the writer refuses what the reader would refuse */
    w = NULL;
    k3_st_writer_create(&w);
    CHECK(k3_st_writer_add(w, "bad\xc3(", K3_ST_U8, 1, &s16, small, err, sizeof err) == K3_STATUS_INVALID_ARGUMENT &&
              strstr(err, "UTF-8"),
          "writer refuses an invalid UTF-8 name: %s", err);
    CHECK(k3_st_writer_set_metadata(w, "k", "\xed\xa0\x80", err, sizeof err) == K3_STATUS_INVALID_ARGUMENT &&
              strstr(err, "UTF-8"),
          "writer refuses an invalid UTF-8 metadata value: %s", err);
    k3_st_writer_destroy(w);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Tens of thousands of tiny tensors and metadata keys: writing (duplicate checks), reading (duplicate checks) and
 * looking each one up must be near-linear, not a scan per name. */
static void test_many_tensors(void) {
    enum { N = 40000 };
    const char *path = tmp_path("many.safetensors");
    char err[512], name[64];
    const double t0 = now_s();
    k3_st_writer *w = NULL;
    k3_st_writer_create(&w);
    int ok = 1;
    int64_t one = 1;
    for (int i = 0; i < N && ok; i++) {
        unsigned char v = (unsigned char)i;
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.w", i / 1000, i % 1000);
        ok = k3_st_writer_add(w, name, K3_ST_U8, 1, &one, &v, err, sizeof err) == K3_STATUS_SUCCESS &&
             k3_st_writer_set_metadata(w, name, "v", err, sizeof err) == K3_STATUS_SUCCESS;
    }
    CHECK(ok, "40000 tensors and metadata keys added: %s", err);
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.w", 7, 123);
    CHECK(k3_st_writer_add(w, name, K3_ST_U8, 1, &one, name, err, sizeof err) == K3_STATUS_INVALID_ARGUMENT,
          "a duplicate among 40000 is still found");
    CHECK(k3_st_writer_save(w, path, err, sizeof err) == 0, "save: %s", err);
    k3_st_writer_destroy(w);
    k3_st_file *f = NULL;
    CHECK(k3_st_open(path, &f, err, sizeof err) == 0 && k3_st_count(f) == N, "open: %s", err);
    int found = 0;
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.w", i / 1000, i % 1000);
        const k3_st_tensor *t = k3_st_find(f, name);
        const char *m = k3_st_metadata_get(f, name);
        found += t && *(const unsigned char *)t->data == (unsigned char)i && m && !strcmp(m, "v");
    }
    CHECK(found == N && !k3_st_find(f, "model.layers.40.mlp.experts.0.w"), "every name found (%d of %d)", found, N);
    k3_st_close(f);
    const double dt = now_s() - t0;
    printf("40000 tensors + 40000 metadata keys: write, read and look up in %.3f s\n", dt);
    CHECK(dt < 5.0, "40000 names take %.1f s (> 5 s: a scan per name?)", dt);
    remove(path);
}

int main(void) {
    printf("seed %llu\n", (unsigned long long)SEED);
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/k3_st_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "cannot create a temp dir\n");
        return 1;
    }
    k3t_rng rng = {SEED};
    test_round_trip(&rng);
    test_malformed();
    test_fuzz(&rng);
    test_atomic_save();
    test_many_tensors();
    remove(tmp_path("rt.safetensors"));
    remove(tmp_path("bad.safetensors"));
    rmdir(dir);
    return k3t_finish();
}
