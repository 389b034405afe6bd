/* A small, strict safetensors reader for tests (the engine gets its own reader elsewhere).
 *
 * Format: an 8-byte little-endian header length N, then N bytes of JSON (an object: one entry per
 * tensor, {"dtype": "BF16", "shape": [r, c], "data_offsets": [begin, end]}, plus an optional
 * "__metadata__" object of strings), then the data area; offsets are relative to the data area.
 *
 * Strict: the header must be a JSON object within the file; every tensor needs exactly those
 * three fields with a known dtype, non-negative integer dims and offsets, end - begin equal to
 * the element count times the dtype size, and the tensors' regions must tile the data area with
 * no overlap, hole or trailing byte (as the reference Rust implementation requires). Anything else
 * is refused with a message naming the tensor or field.
 *
 * Not thread-safe per file object; distinct objects are independent. */
#ifndef WSYNC_TEST_SAFETENSORS_MIN_H
#define WSYNC_TEST_SAFETENSORS_MIN_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8

typedef struct {
    const char *name;          /* owned by the file object */
    char dtype[8];             /* "BF16", "F32", ... as written in the header */
    size_t elem_size;          /* bytes per element of dtype */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t offset;           /* begin, relative to the data area */
    uint64_t nbytes;
    const uint8_t *data;       /* into the mapping (or the caller's bytes) */
} st_tensor_t;

typedef struct st_file st_file_t;

/* Map `path` read-only and parse it. On failure returns -1 and writes a message to err. */
int st_open(const char *path, st_file_t **out, char *err, size_t errlen);

/* Parse `len` bytes held by the caller (they must outlive the object). Same checks as st_open. */
int st_parse(const void *bytes, size_t len, st_file_t **out, char *err, size_t errlen);

/* Close (unmaps what st_open mapped). NULL is a no-op. */
void st_close(st_file_t *f);

size_t st_count(const st_file_t *f);
const st_tensor_t *st_at(const st_file_t *f, size_t i);       /* in data-offset order */
const st_tensor_t *st_find(const st_file_t *f, const char *name); /* NULL if absent */

/* The data area (every tensor's bytes, in file order) and its size. */
const uint8_t *st_data(const st_file_t *f);
size_t st_data_size(const st_file_t *f);

#endif
