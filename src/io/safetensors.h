/*
 * safetensors reader and writer (https://github.com/huggingface/safetensors format):
 *   8-byte little-endian header length H, H bytes of JSON
 *   {"__metadata__": {"k": "v", ...}, "NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}, ...},
 *   then the data section; offsets are relative to its start, and the tensors must cover it exactly
 *   (no holes, no overlap, nothing after the last tensor).
 *
 * k3_st_open loads and validates the whole file at open time (one allocation for the data section), so
 * every later accessor is a plain lookup. k3_st_open_header validates the same (header, offsets, file size) but
 * reads no tensor bytes: k3_st_read then reads a tensor, or a byte range of one, into the caller's buffer, so a
 * reader's host memory is what it asked for, not the file. The header parser is a small bounds-checked JSON parser: any
 * malformed file is K3_STATUS_FORMAT_ERROR with a message naming the path and what was wrong. Strings must
 * be well-formed UTF-8 (no overlong forms or surrogates) and tensor names non-empty, as strict readers demand.
 * Names and metadata keys are hashed at open time, so lookups are O(1) and the file is read-only afterwards.
 */
#ifndef K3_CORE_SAFETENSORS_H
#define K3_CORE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "k3.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum k3_st_dtype {
    K3_ST_BF16 = 0,
    K3_ST_F16,
    K3_ST_F32,
    K3_ST_F64,
    K3_ST_I32,
    K3_ST_I64,
    K3_ST_U8,
    K3_ST_F8_E4M3
} k3_st_dtype;

#define K3_ST_MAX_DIMS 8

typedef struct k3_st_tensor {
    const char *name;
    k3_st_dtype dtype;
    int32_t ndim; /* 0 = a scalar (one element) */
    int64_t shape[K3_ST_MAX_DIMS];
    size_t nbytes;
    const void *data; /* aligned to at least the element size (a misaligned tensor in the file is copied);
                         NULL in a file opened with k3_st_open_header */
} k3_st_tensor;

typedef struct k3_st_file k3_st_file;

/* Reads and validates the whole file. On failure returns K3_STATUS_IO_ERROR / K3_STATUS_FORMAT_ERROR with
   a message (path, byte offset or tensor name, what was wrong) in err. Also K3_STATUS_INVALID_ARGUMENT
   (NULL path/out) and K3_STATUS_OUT_OF_MEMORY. *out is NULL on failure. */
k3_status k3_st_open(const char *path, k3_st_file **out, char *err, size_t err_size);
/* The same checks as k3_st_open, but only the header is read; the file stays open until k3_st_close and every
   tensor's data is NULL (read it with k3_st_read). */
k3_status k3_st_open_header(const char *path, k3_st_file **out, char *err, size_t err_size);
/* Copies bytes [offset, offset + n) of tensor t (one of f's) into dst: from memory for a whole-file open, with
   pread otherwise. INVALID_ARGUMENT when the range is outside the tensor; IO_ERROR naming the file and tensor when
   the read fails or the file ends early (it shrank after it was opened). */
k3_status k3_st_read(const k3_st_file *f, const k3_st_tensor *t, uint64_t offset, void *dst, size_t n, char *err,
                     size_t err_size);
void k3_st_close(k3_st_file *f); /* NULL is accepted */
int32_t k3_st_count(const k3_st_file *f);
/* Tensors in file order (ascending data offset). NULL when i is out of range. */
const k3_st_tensor *k3_st_at(const k3_st_file *f, int32_t i);
const k3_st_tensor *k3_st_find(const k3_st_file *f, const char *name); /* NULL when absent */
/* "__metadata__" entries (string -> string). */
int32_t k3_st_metadata_count(const k3_st_file *f);
/* The i-th key and value (in header order); returns 0 when i is out of range. */
int k3_st_metadata_at(const k3_st_file *f, int32_t i, const char **key, const char **value);
const char *k3_st_metadata_get(const k3_st_file *f, const char *key); /* NULL when absent */

typedef struct k3_st_writer k3_st_writer;
k3_status k3_st_writer_create(k3_st_writer **out);
/* Copies the data (nbytes follows from dtype and shape; data may be NULL only when that is 0).
   Rejects (K3_STATUS_INVALID_ARGUMENT, message in err) a NULL/empty name, invalid UTF-8, "__metadata__",
   duplicate names,
   ndim outside 0..K3_ST_MAX_DIMS, negative dims, a byte size that overflows, an unknown dtype. */
k3_status k3_st_writer_add(k3_st_writer *w, const char *name, k3_st_dtype dtype, int32_t ndim,
                           const int64_t *shape, const void *data, char *err, size_t err_size);
/* Sets (or replaces) a "__metadata__" entry (key and value must be valid UTF-8). */
k3_status k3_st_writer_set_metadata(k3_st_writer *w, const char *key, const char *value, char *err,
                                    size_t err_size);
/* Writes the file: header padded with spaces so the data section starts 8-byte aligned, tensors in
   insertion order. The bytes go to a new temporary file in path's folder (O_EXCL), which is fsynced and then
   renamed over path (an existing file keeps its mode). K3_STATUS_IO_ERROR (message in err) when it cannot be
   written; then only the temporary file is removed and whatever path held before is left as it was. */
k3_status k3_st_writer_save(const k3_st_writer *w, const char *path, char *err, size_t err_size);
void k3_st_writer_destroy(k3_st_writer *w); /* NULL is accepted */

/* Streaming write, for files larger than the memory one wants to spend: declare every tensor (name, dtype,
   shape; no bytes) with k3_st_writer_declare, set the metadata, then k3_st_stream_open writes the header to a
   temporary file next to path. The bytes follow with k3_st_stream_write, in declaration order, in pieces of any
   size (a piece may span tensors). k3_st_stream_commit checks that exactly the declared bytes arrived, fsyncs and
   renames over path; k3_st_stream_abort (or any failed call, or a commit that fails) removes only the temporary.
   A writer holding declared tensors cannot be saved with k3_st_writer_save, nor one holding data streamed. */
k3_status k3_st_writer_declare(k3_st_writer *w, const char *name, k3_st_dtype dtype, int32_t ndim,
                               const int64_t *shape, char *err, size_t err_size);
typedef struct k3_st_stream k3_st_stream;
/* w must hold declared tensors only; it may be destroyed once the stream is open (the stream keeps what it needs). */
k3_status k3_st_stream_open(const k3_st_writer *w, const char *path, k3_st_stream **out, char *err, size_t err_size);
/* INVALID_ARGUMENT (naming the tensor being written) when more bytes arrive than were declared; IO_ERROR when
   the write fails. After a failure the stream is dead: only abort is left. */
k3_status k3_st_stream_write(k3_st_stream *s, const void *data, size_t n, char *err, size_t err_size);
/* The tensor the next byte belongs to (messages, progress), or NULL when every declared byte has arrived. */
const char *k3_st_stream_current(const k3_st_stream *s);
uint64_t k3_st_stream_written(const k3_st_stream *s); /* data bytes written so far */
/* Frees s whatever happens. */
k3_status k3_st_stream_commit(k3_st_stream *s, char *err, size_t err_size);
void k3_st_stream_abort(k3_st_stream *s); /* NULL is accepted */

const char *k3_st_dtype_name(k3_st_dtype t); /* "BF16", "F8_E4M3", ... as in the format; "?" when invalid */
size_t k3_st_dtype_size(k3_st_dtype t);      /* bytes per element; 0 when invalid */

#ifdef __cplusplus
}
#endif
#endif
