/* Internal: bounds-checked little-endian encoding of message payloads. A decoder never reads past
 * its end: the first short read sets `err`, and every later read returns zeros, so a decode
 * function checks `err` once at the end. */
#ifndef WSYNC_CORE_WIRE_H
#define WSYNC_CORE_WIRE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint8_t *data;
    size_t len, cap;
    int err;              /* allocation failed */
} wsync_wbuf_t;

void wsync_wbuf_init(wsync_wbuf_t *b);
void wsync_wbuf_free(wsync_wbuf_t *b);
void wsync_put_bytes(wsync_wbuf_t *b, const void *p, size_t n);
void wsync_put_u8(wsync_wbuf_t *b, uint8_t v);
void wsync_put_u16(wsync_wbuf_t *b, uint16_t v);
void wsync_put_u32(wsync_wbuf_t *b, uint32_t v);
void wsync_put_u64(wsync_wbuf_t *b, uint64_t v);
static inline void wsync_put_i64(wsync_wbuf_t *b, int64_t v) { wsync_put_u64(b, (uint64_t)v); }
static inline void wsync_put_i32(wsync_wbuf_t *b, int32_t v) { wsync_put_u32(b, (uint32_t)v); }
void wsync_put_f32(wsync_wbuf_t *b, float v);
/* u32 length then the bytes; NULL is encoded as length 0xffffffff. */
void wsync_put_str(wsync_wbuf_t *b, const char *s);

typedef struct {
    const uint8_t *p, *end;
    int err;              /* a read ran past the end, or a value was out of range */
} wsync_rbuf_t;

void wsync_rbuf_init(wsync_rbuf_t *r, const void *data, size_t len);
const void *wsync_get_bytes(wsync_rbuf_t *r, size_t n);  /* NULL on error */
uint8_t wsync_get_u8(wsync_rbuf_t *r);
uint16_t wsync_get_u16(wsync_rbuf_t *r);
uint32_t wsync_get_u32(wsync_rbuf_t *r);
uint64_t wsync_get_u64(wsync_rbuf_t *r);
static inline int64_t wsync_get_i64(wsync_rbuf_t *r) { return (int64_t)wsync_get_u64(r); }
static inline int32_t wsync_get_i32(wsync_rbuf_t *r) { return (int32_t)wsync_get_u32(r); }
float wsync_get_f32(wsync_rbuf_t *r);
/* A freshly allocated NUL-terminated copy (caller frees); NULL for an encoded NULL or on error.
 * Strings longer than max_len, or holding a NUL, set err. */
char *wsync_get_str(wsync_rbuf_t *r, size_t max_len);
/* A count of items each at least min_item_bytes long: sets err if the rest of the buffer cannot
 * hold that many, so a hostile count can never drive a huge allocation. */
uint32_t wsync_get_count(wsync_rbuf_t *r, size_t min_item_bytes);
static inline size_t wsync_rbuf_left(const wsync_rbuf_t *r) { return (size_t)(r->end - r->p); }

#endif
