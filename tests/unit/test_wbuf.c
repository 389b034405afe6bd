/* The write buffer of core/wire.h: appending bytes copied from the buffer itself while it grows
 * (the plan's encoder copies a replica's coded records that way) must copy what was there, not
 * freed memory; appends past many reallocations keep every byte. */
#include <stdint.h>
#include <string.h>

#include "core/wire.h"
#include "tests/support/check.h"

static void self_append_across_growth(void)
{
    wsync_wbuf_t b;
    wsync_wbuf_init(&b);
    for (int i = 0; i < 200; i++)
        wsync_put_u8(&b, (uint8_t)i);
    /* 200 bytes in a 256-byte buffer: appending 100 of them forces a realloc */
    CHECK(b.cap == 256);
    wsync_put_bytes(&b, b.data + 50, 100);
    CHECK(!b.err && b.len == 300 && b.cap >= 300);
    for (int i = 0; i < 100; i++)
        CHECK_MSG(b.data[200 + i] == (uint8_t)(50 + i), "byte %d: %u", 200 + i, b.data[200 + i]);
    /* again and again, each copy doubling the buffer's contents */
    for (int round = 0; round < 10; round++) {
        size_t len = b.len;
        wsync_put_bytes(&b, b.data, len);
        CHECK(!b.err && b.len == 2 * len);
        CHECK(memcmp(b.data, b.data + len, len) == 0);
    }
    wsync_wbuf_free(&b);
}

static void outside_source(void)
{
    uint8_t src[1000];
    for (int i = 0; i < 1000; i++)
        src[i] = (uint8_t)(i * 7);
    wsync_wbuf_t b;
    wsync_wbuf_init(&b);
    wsync_put_bytes(&b, src, 10);
    wsync_put_bytes(&b, src, 1000);
    CHECK(!b.err && b.len == 1010);
    CHECK(memcmp(b.data, src, 10) == 0 && memcmp(b.data + 10, src, 1000) == 0);
    wsync_wbuf_free(&b);
}

int main(void)
{
    RUN(self_append_across_growth);
    RUN(outside_source);
    return check_summary();
}
