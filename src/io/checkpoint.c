/* The checkpoint reader: a folder, an index.json and its shards, or one safetensors file; tensors by name. The MoE
 * layer's names and stacking: checkpoint_moe.c. */
#define _POSIX_C_SOURCE 200809L /* stat, opendir */
#include "io/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/st_common.h"

#define CK_CACHE 4          /* open shards kept: a layer's experts sit in one or two shards */
#define CK_MAX_INDEX (256u << 20) /* an index lists names only; a real one is a few MB */
#define CK_INDEX_NAME "model.safetensors.index.json"

typedef struct ck_slot {
    int32_t shard; /* -1 = empty */
    k3_st_file *f;
    uint64_t used;
} ck_slot;

struct k3_ckpt {
    char *dir;      /* the index's folder (shard paths are relative to it) */
    char *path;     /* the index file or the single safetensors file */
    k3_st_file *single; /* a single-file checkpoint: open for the checkpoint's life */
    char **shards;  /* shard file names as the index gives them */
    int32_t shard_count, shard_cap;
    char **names;   /* weight_map keys, in index order */
    int32_t *name_shard;
    int32_t name_count, name_cap, shard_id_cap;
    st_index name_idx, shard_idx;
    ck_slot cache[CK_CACHE];
    uint64_t tick;
    unsigned char *buf; /* k3_ckpt_find's tensor bytes (one tensor at a time) */
    size_t buf_cap;
    k3_st_tensor found; /* what k3_ckpt_find returned last: a header entry with data = buf */
    int scale_layout;   /* k3_ckpt_set_scale_layout: a stacked file's 3-D scales' layout, -1 = not given */
};

static int ends_with(const char *s, const char *suf) {
    const size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

static char *dup_str(const char *s) {
    const size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static char *join_path(const char *dir, const char *name) {
    const size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return dup_str(".");
    if (slash == path) return dup_str("/");
    const size_t n = (size_t)(slash - path);
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, path, n);
    d[n] = '\0';
    return d;
}

void k3_ckpt_close(k3_ckpt *ck) {
    if (!ck) return;
    for (int i = 0; i < CK_CACHE; i++) k3_st_close(ck->cache[i].f);
    k3_st_close(ck->single);
    for (int32_t i = 0; i < ck->shard_count; i++) free(ck->shards[i]);
    for (int32_t i = 0; i < ck->name_count; i++) free(ck->names[i]);
    free(ck->shards);
    free(ck->names);
    free(ck->name_shard);
    k3_st_index_free(&ck->name_idx);
    k3_st_index_free(&ck->shard_idx);
    free(ck->dir);
    free(ck->path);
    free(ck->buf);
    free(ck);
}

/* A shard path must stay inside the checkpoint's folder: relative, with no ".." component. */
static const char *bad_shard_path(const char *s) {
    if (!s[0]) return "is empty";
    if (s[0] == '/') return "is absolute (shards are resolved relative to the index's folder)";
    if (strchr(s, '\\')) return "contains a backslash";
    for (const char *c = s; *c;) {
        const char *e = strchr(c, '/');
        const size_t n = e ? (size_t)(e - c) : strlen(c);
        if (n == 2 && c[0] == '.' && c[1] == '.') return "has a '..' component (it would leave the index's folder)";
        if (!e) break;
        c = e + 1;
    }
    return NULL;
}

static k3_status oom(char *err, size_t err_size, const char *path) {
    return k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
}

/* One "name": "shard" entry of weight_map (name owned by the caller until it is stored). */
static k3_status add_entry(k3_ckpt *ck, jp *p, char *name, char *shard) {
    char msg[600];
    if (!name[0]) {
        free(name);
        free(shard);
        return k3_jp_fail(p, "weight_map has an empty tensor name");
    }
    if (k3_st_index_get(&ck->name_idx, name) >= 0) {
        snprintf(msg, sizeof msg, "weight_map lists tensor '%.200s' twice", name);
        free(name);
        free(shard);
        return k3_jp_fail(p, msg);
    }
    const char *why = bad_shard_path(shard);
    if (why) {
        snprintf(msg, sizeof msg, "weight_map: the shard '%.200s' of tensor '%.200s' %s", shard, name, why);
        free(name);
        free(shard);
        return k3_jp_fail(p, msg);
    }
    int32_t sid = k3_st_index_get(&ck->shard_idx, shard);
    if (sid < 0) {
        if (ck->shard_count >= INT32_MAX - 1 ||
            !k3_st_grow((void **)&ck->shards, &ck->shard_cap, ck->shard_count + 1, sizeof(char *)) ||
            !k3_st_index_put(&ck->shard_idx, shard, ck->shard_count)) {
            free(name);
            free(shard);
            return oom(p->err, p->err_size, p->path);
        }
        sid = ck->shard_count;
        ck->shards[ck->shard_count++] = shard;
    } else {
        free(shard);
    }
    if (ck->name_count >= INT32_MAX - 1 ||
        !k3_st_grow((void **)&ck->names, &ck->name_cap, ck->name_count + 1, sizeof(char *))) {
        free(name);
        return oom(p->err, p->err_size, p->path);
    }
    int32_t cap2 = ck->shard_id_cap;
    if (!k3_st_grow((void **)&ck->name_shard, &cap2, ck->name_count + 1, sizeof(int32_t))) {
        free(name);
        return oom(p->err, p->err_size, p->path);
    }
    ck->shard_id_cap = cap2;
    ck->names[ck->name_count] = name;
    ck->name_shard[ck->name_count] = sid;
    if (!k3_st_index_put(&ck->name_idx, name, ck->name_count)) {
        free(name);
        return oom(p->err, p->err_size, p->path);
    }
    ck->name_count++;
    return K3_STATUS_SUCCESS;
}

static k3_status weight_map_pair(void *user, jp *p, char *name, char *shard) {
    return add_entry((k3_ckpt *)user, p, name, shard);
}

static k3_status parse_weight_map(k3_ckpt *ck, jp *p) {
    return k3_jp_string_object(p, "weight_map must be an object of tensor name -> shard file",
                               "weight_map values must be strings (shard file names)", "weight_map", weight_map_pair, ck);
}

/* {"metadata": {...}, "weight_map": {...}}; other keys are skipped. */
static k3_status parse_index(k3_ckpt *ck, jp *p) {
    int have_map = 0;
    if (!k3_jp_eat(p, '{')) return k3_jp_fail(p, "an index must be a JSON object");
    if (!k3_jp_eat(p, '}')) {
        for (;;) {
            char *key = NULL;
            ST_TRY(k3_jp_key(p, &key));
            const int is_map = !strcmp(key, "weight_map");
            free(key);
            if (is_map) {
                if (have_map++) return k3_jp_fail(p, "duplicate weight_map");
                ST_TRY(parse_weight_map(ck, p));
            } else {
                ST_TRY(k3_jp_skip(p, 1));
            }
            if (k3_jp_eat(p, ',')) continue;
            if (k3_jp_eat(p, '}')) break;
            return k3_jp_fail(p, "expected ',' or '}'");
        }
    }
    k3_jp_ws(p);
    if (p->i != p->n) return k3_jp_fail(p, "trailing bytes after the index object");
    if (!have_map) return k3_jp_fail(p, "the index has no weight_map");
    return K3_STATUS_SUCCESS;
}

static k3_status read_index(k3_ckpt *ck, const char *path, char *err, size_t err_size) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return k3_st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: cannot open: %s", path, strerror(errno));
    long long n = -1;
    if (fseek(fp, 0, SEEK_END) == 0) n = (long long)ftell(fp);
    if (n < 0 || fseek(fp, 0, SEEK_SET) != 0) {
        fclose(fp);
        return k3_st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: cannot determine the file size", path);
    }
    if ((unsigned long long)n > CK_MAX_INDEX) {
        fclose(fp);
        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR, "%s: %lld bytes is larger than an index may be (%u)",
                         path, n, CK_MAX_INDEX);
    }
    char *buf = malloc(n ? (size_t)n : 1);
    if (!buf) {
        fclose(fp);
        return oom(err, err_size, path);
    }
    const size_t got = fread(buf, 1, (size_t)n, fp);
    fclose(fp);
    if (got != (size_t)n) {
        free(buf);
        return k3_st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: read error", path);
    }
    jp p = {.s = buf, .n = (size_t)n, .i = 0, .path = path, .err = err, .err_size = err_size, .plain = 1};
    k3_status st = parse_index(ck, &p);
    free(buf);
    return st;
}

/* A folder: its index, or else its only safetensors file. *out is a fresh string. */
static k3_status resolve_dir(const char *dir, char **out, int *is_index, char *err, size_t err_size) {
    *out = NULL;
    char *ix = join_path(dir, CK_INDEX_NAME);
    if (!ix) return oom(err, err_size, dir);
    struct stat sb;
    if (stat(ix, &sb) == 0) {
        *out = ix;
        *is_index = 1;
        return K3_STATUS_SUCCESS;
    }
    free(ix);
    DIR *d = opendir(dir);
    if (!d) return k3_st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: cannot list: %s", dir, strerror(errno));
    char *found = NULL;
    int count = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (!ends_with(e->d_name, ".safetensors")) continue;
        if (count++ == 0) found = join_path(dir, e->d_name);
    }
    closedir(d);
    if (count == 0 || !found) {
        free(found);
        return count ? oom(err, err_size, dir)
                     : k3_st_err(err, err_size, K3_STATUS_IO_ERROR,
                                 "%s: no " CK_INDEX_NAME " and no *.safetensors file in this folder", dir);
    }
    if (count > 1) {
        free(found);
        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                         "%s: %d *.safetensors files but no " CK_INDEX_NAME " saying which tensor is where", dir,
                         count);
    }
    *out = found;
    *is_index = 0;
    return K3_STATUS_SUCCESS;
}

k3_status k3_ckpt_open(const char *path, k3_ckpt **out, char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!out) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_ckpt_open: out must not be NULL");
    *out = NULL;
    if (!path || !path[0])
        return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_ckpt_open: path must not be NULL or empty");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return k3_st_err(err, err_size, K3_STATUS_IO_ERROR, "%s: cannot open: %s", path, strerror(errno));
    k3_ckpt *ck = calloc(1, sizeof *ck);
    if (ck) ck->scale_layout = -1;
    if (!ck) return oom(err, err_size, path);
    for (int i = 0; i < CK_CACHE; i++) ck->cache[i].shard = -1;
    k3_status st = K3_STATUS_SUCCESS;
    int is_index = 0;
    if (S_ISDIR(sb.st_mode)) {
        st = resolve_dir(path, &ck->path, &is_index, err, err_size);
    } else {
        is_index = ends_with(path, ".json");
        if (!(ck->path = dup_str(path))) st = oom(err, err_size, path);
    }
    if (st == K3_STATUS_SUCCESS && !(ck->dir = dir_of(ck->path))) st = oom(err, err_size, path);
    if (st == K3_STATUS_SUCCESS)
        st = is_index ? read_index(ck, ck->path, err, err_size)
                      : k3_st_open_header(ck->path, &ck->single, err, err_size);
    if (st != K3_STATUS_SUCCESS) {
        k3_ckpt_close(ck);
        return st;
    }
    *out = ck;
    return K3_STATUS_SUCCESS;
}

int32_t k3_ckpt_count(const k3_ckpt *ck) {
    if (!ck) return 0;
    return ck->single ? k3_st_count(ck->single) : ck->name_count;
}

const char *k3_ckpt_name_at(const k3_ckpt *ck, int32_t i) {
    if (!ck || i < 0 || i >= k3_ckpt_count(ck)) return NULL;
    return ck->single ? k3_st_at(ck->single, i)->name : ck->names[i];
}

int k3_ckpt_has(const k3_ckpt *ck, const char *name) {
    if (!ck || !name) return 0;
    return ck->single ? k3_st_find(ck->single, name) != NULL : k3_st_index_get(&ck->name_idx, name) >= 0;
}

static k3_status open_shard(k3_ckpt *ck, int32_t sid, k3_st_file **f, char *err, size_t err_size) {
    int victim = 0;
    for (int i = 0; i < CK_CACHE; i++) {
        if (ck->cache[i].shard == sid) {
            ck->cache[i].used = ++ck->tick;
            *f = ck->cache[i].f;
            return K3_STATUS_SUCCESS;
        }
        if (ck->cache[i].used < ck->cache[victim].used) victim = i;
    }
    k3_st_close(ck->cache[victim].f);
    ck->cache[victim].f = NULL;
    ck->cache[victim].shard = -1;
    ck->cache[victim].used = 0;
    char *full = join_path(ck->dir, ck->shards[sid]);
    if (!full) return oom(err, err_size, ck->path);
    char sub[400];
    k3_st_file *nf = NULL;
    const k3_status st = k3_st_open_header(full, &nf, sub, sizeof sub);
    if (st != K3_STATUS_SUCCESS) {
        k3_st_err(err, err_size, st, "%s: shard '%s': %s", ck->path, ck->shards[sid], sub);
        free(full);
        return st;
    }
    free(full);
    ck->cache[victim].f = nf;
    ck->cache[victim].shard = sid;
    ck->cache[victim].used = ++ck->tick;
    *f = nf;
    return K3_STATUS_SUCCESS;
}

/* The file holding `name` (opened when needed) and its header entry. */
static k3_status locate(k3_ckpt *ck, const char *name, k3_st_file **file, const k3_st_tensor **out, char *err,
                        size_t err_size) {
    if (ck->single) {
        *file = ck->single;
        *out = k3_st_find(ck->single, name);
        if (!*out)
            return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR, "%s: no tensor '%.200s'", ck->path, name);
        return K3_STATUS_SUCCESS;
    }
    const int32_t i = k3_st_index_get(&ck->name_idx, name);
    if (i < 0) return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR, "%s: no tensor '%.200s' in weight_map",
                                ck->path, name);
    ST_TRY(open_shard(ck, ck->name_shard[i], file, err, err_size));
    *out = k3_st_find(*file, name);
    if (!*out)
        return k3_st_err(err, err_size, K3_STATUS_FORMAT_ERROR,
                         "%s: weight_map puts tensor '%.200s' in shard '%s', which does not hold it", ck->path, name,
                         ck->shards[ck->name_shard[i]]);
    return K3_STATUS_SUCCESS;
}

k3_status k3_ckpt_lookup(k3_ckpt *ck, const char *name, const k3_st_tensor **out, char *err, size_t err_size) {
    if (!out) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_ckpt_lookup: out must not be NULL");
    *out = NULL;
    if (!ck || !name) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_ckpt_lookup: NULL argument");
    k3_st_file *f = NULL;
    return locate(ck, name, &f, out, err, err_size);
}

k3_status k3_ckpt_read(k3_ckpt *ck, const char *name, uint64_t offset, void *dst, size_t n, char *err,
                       size_t err_size) {
    if (!ck || !name) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_ckpt_read: NULL argument");
    k3_st_file *f = NULL;
    const k3_st_tensor *t = NULL;
    ST_TRY(locate(ck, name, &f, &t, err, err_size));
    return k3_st_read(f, t, offset, dst, n, err, err_size);
}

k3_status k3_ckpt_find(k3_ckpt *ck, const char *name, const k3_st_tensor **out, char *err, size_t err_size) {
    if (!out) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_ckpt_find: out must not be NULL");
    *out = NULL;
    if (!ck || !name) return k3_st_err(err, err_size, K3_STATUS_INVALID_ARGUMENT, "k3_ckpt_find: NULL argument");
    k3_st_file *f = NULL;
    const k3_st_tensor *t = NULL;
    ST_TRY(locate(ck, name, &f, &t, err, err_size));
    if (t->nbytes > ck->buf_cap) {
        unsigned char *nb = malloc(t->nbytes);
        if (!nb)
            return k3_st_err(err, err_size, K3_STATUS_OUT_OF_MEMORY, "%s: tensor '%.200s': out of memory for %zu bytes",
                             ck->path, name, t->nbytes);
        free(ck->buf);
        ck->buf = nb;
        ck->buf_cap = t->nbytes;
    }
    ST_TRY(k3_st_read(f, t, 0, ck->buf, t->nbytes, err, err_size));
    ck->found = *t;
    ck->found.data = ck->buf ? (const void *)ck->buf : (const void *)&ck->buf_cap; /* an empty tensor: any address */
    *out = &ck->found;
    return K3_STATUS_SUCCESS;
}

const char *k3_ckpt_path(const k3_ckpt *ck) { return ck ? ck->path : NULL; }

void k3_ckpt_set_scale_layout(k3_ckpt *ck, int layout) {
    if (ck) ck->scale_layout = layout;
}

int k3_ckpt_scale_layout(const k3_ckpt *ck) { return ck ? ck->scale_layout : -1; }

const char *k3_ckpt_metadata(const k3_ckpt *ck, const char *key) {
    return ck && ck->single ? k3_st_metadata_get(ck->single, key) : NULL;
}
