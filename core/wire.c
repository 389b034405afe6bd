#include "core/wire.h"

#include <stdlib.h>
#include <stdint.h>
#include <string.h>

void wsync_wbuf_init(wsync_wbuf_t *b)
{
    memset(b, 0, sizeof(*b));
}

void wsync_wbuf_free(wsync_wbuf_t *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}

void wsync_put_bytes(wsync_wbuf_t *b, const void *p, size_t n)
{
    if (b->err || n == 0)
        return;
    if (b->len + n > b->cap) {
        /* p may point into the buffer itself (a copy of bytes written earlier, as the plan's
         * encoder makes of a replica's records): keep its offset across the realloc */
        uintptr_t at = (uintptr_t)p, base = (uintptr_t)b->data;
        int inside = b->data != NULL && at >= base && at < base + b->len;
        size_t cap = b->cap ? b->cap : 256;
        uint8_t *d;

        while (cap < b->len + n)
            cap *= 2;
        d = realloc(b->data, cap);
        if (d == NULL) {
            b->err = 1;
            return;
        }
        b->data = d;
        b->cap = cap;
        if (inside)
            p = d + (at - base);
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

void wsync_put_u8(wsync_wbuf_t *b, uint8_t v) { wsync_put_bytes(b, &v, 1); }

void wsync_put_u16(wsync_wbuf_t *b, uint16_t v)
{
    uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    wsync_put_bytes(b, x, 2);
}

void wsync_put_u32(wsync_wbuf_t *b, uint32_t v)
{
    uint8_t x[4];
    for (int i = 0; i < 4; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    wsync_put_bytes(b, x, 4);
}

void wsync_put_u64(wsync_wbuf_t *b, uint64_t v)
{
    uint8_t x[8];
    for (int i = 0; i < 8; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    wsync_put_bytes(b, x, 8);
}

void wsync_put_f32(wsync_wbuf_t *b, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    wsync_put_u32(b, u);
}

void wsync_put_str(wsync_wbuf_t *b, const char *s)
{
    if (s == NULL) {
        wsync_put_u32(b, 0xffffffffu);
        return;
    }
    size_t n = strlen(s);
    wsync_put_u32(b, (uint32_t)n);
    wsync_put_bytes(b, s, n);
}

void wsync_rbuf_init(wsync_rbuf_t *r, const void *data, size_t len)
{
    r->p = data;
    r->end = r->p + len;
    r->err = 0;
}

const void *wsync_get_bytes(wsync_rbuf_t *r, size_t n)
{
    const uint8_t *p = r->p;

    if (r->err || (size_t)(r->end - r->p) < n) {
        r->err = 1;
        return NULL;
    }
    r->p += n;
    return p;
}

uint8_t wsync_get_u8(wsync_rbuf_t *r)
{
    const uint8_t *p = wsync_get_bytes(r, 1);
    return p ? p[0] : 0;
}

uint16_t wsync_get_u16(wsync_rbuf_t *r)
{
    const uint8_t *p = wsync_get_bytes(r, 2);
    return p ? (uint16_t)(p[0] | (p[1] << 8)) : 0;
}

uint32_t wsync_get_u32(wsync_rbuf_t *r)
{
    const uint8_t *p = wsync_get_bytes(r, 4);
    uint32_t v = 0;
    if (p)
        for (int i = 3; i >= 0; i--)
            v = (v << 8) | p[i];
    return v;
}

uint64_t wsync_get_u64(wsync_rbuf_t *r)
{
    const uint8_t *p = wsync_get_bytes(r, 8);
    uint64_t v = 0;
    if (p)
        for (int i = 7; i >= 0; i--)
            v = (v << 8) | p[i];
    return v;
}

float wsync_get_f32(wsync_rbuf_t *r)
{
    uint32_t u = wsync_get_u32(r);
    float v;
    memcpy(&v, &u, 4);
    return v;
}

char *wsync_get_str(wsync_rbuf_t *r, size_t max_len)
{
    uint32_t n = wsync_get_u32(r);
    const char *p;
    char *s;

    if (r->err || n == 0xffffffffu)
        return NULL;
    if (n > max_len) {
        r->err = 1;
        return NULL;
    }
    p = wsync_get_bytes(r, n);
    if (p == NULL)
        return NULL;
    if (memchr(p, '\0', n) != NULL) {
        r->err = 1;
        return NULL;
    }
    s = malloc((size_t)n + 1);
    if (s == NULL) {
        r->err = 1;
        return NULL;
    }
    memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

uint32_t wsync_get_count(wsync_rbuf_t *r, size_t min_item_bytes)
{
    uint32_t n = wsync_get_u32(r);

    if (r->err)
        return 0;
    if (min_item_bytes > 0 && (uint64_t)n * min_item_bytes > (uint64_t)(r->end - r->p)) {
        r->err = 1;
        return 0;
    }
    return n;
}
