/* Fuzz target: the delta codec (core/delta.c): the check that stands between a received buffer
 * and the receiver's weights, the apply it guards, and the encoder.
 *
 * Input: byte 0 selects the op (bit 0), the element size (1 << bits 1-2) and op 1's format (bit
 * 3: format 4, step-coded values; else 3); byte 1 the layout
 * of the region (cols 1 + L % 32 with pitch cols + (L >> 5) % 4 when that divides n, else one
 * dense row); then
 *   op 0  an encoded chunk              wsync_delta_check with n from its own header (so that a
 *                                       stream can pass); where it passes (n <= 2^16), apply it
 *                                       to a region of a scratch buffer: apply's hash must equal
 *                                       wsync_delta_hash of the result, nothing outside the
 *                                       region may change, and encoding (result, before) must
 *                                       give a stream that checks, applies back to the same
 *                                       values and counts no more changes than the stream's k
 *   op 1  u16 n, u8 seed, then changes  old values from the seed; each change (u16 element,
 *         of 4 bytes (u16 element,      u8 byte, u8 xor) flips bits of the new values; encode,
 *         u8 byte, u8 xor)              check, apply: the region must hold the new values, the
 *                                       hashes agree, `changed` counts the differing elements
 * Buffers stay under 1 MiB so that each input runs in milliseconds. */
#include <inttypes.h>

#include "core/delta.h"
#include "core/status.h"
#include "tests/fuzz/fuzz.h"

#define MAX_APPLY (1u << 16)        /* elements of a region applied to */
#define MAX_ENC (3u * WSYNC_DELTA_BLOCK + 100)

typedef struct {
    wsync_region_t r;
    uint32_t es;
    size_t bytes;                   /* of a buffer holding the region */
} layout_t;

static layout_t make_layout(uint64_t n, uint32_t es, uint8_t l)
{
    layout_t lay = {{1, n, 1, n}, es, 0};
    uint64_t c = 1 + l % 32;

    if (n % c == 0) {
        lay.r.rows = n / c;
        lay.r.cols = c;
        lay.r.pitch = c + (l >> 5) % 4;
    }
    lay.bytes = (size_t)((lay.r.off + (lay.r.rows - 1) * lay.r.pitch + lay.r.cols + 1) * es);
    return lay;
}

static uint8_t *at(uint8_t *base, const layout_t *l, uint64_t e)
{
    return base + (l->r.off + e / l->r.cols * l->r.pitch + e % l->r.cols) * l->es;
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (uint8_t)(x >> 56);
    }
}

/* The buffer after equals `before` outside the region. */
static int outside_same(const uint8_t *after, const uint8_t *before, const layout_t *l)
{
    uint8_t *mask = calloc(1, l->bytes);
    int same = 1;
    FUZZ_ASSERT(mask != NULL, "out of memory");
    for (uint64_t e = 0; e < l->r.rows * l->r.cols; e++)
        memset(at(mask, l, e), 1, l->es);
    for (size_t i = 0; i < l->bytes && same; i++)
        same = mask[i] || after[i] == before[i];
    free(mask);
    return same;
}

/* Encode (nw against old) in region l in format fmt, check, apply onto a copy of old: the region
 * then holds nw's values. Returns the number of changed elements. */
static uint64_t encode_round_trip(const uint8_t *nw, const uint8_t *old, const layout_t *l,
                                  uint32_t fmt)
{
    uint64_t n = l->r.rows * l->r.cols, cap = wsync_delta_max_bytes(n, l->es);
    uint64_t len = 0, hash = 0, changed = 0, ah = 0, diff = 0;
    uint8_t *enc = malloc(cap), *dst = malloc(l->bytes);

    FUZZ_ASSERT(enc != NULL && dst != NULL, "out of memory");
    FUZZ_ASSERT(wsync_delta_encode_format(fmt, nw, old, &l->r, l->es, enc, cap, &len, &hash,
                                          &changed) == WSYNC_OK, "encode: %s", wsync_last_error());
    FUZZ_ASSERT(wsync_delta_format(enc, len) == fmt, "format %u, asked for %u",
                wsync_delta_format(enc, len), fmt);
    FUZZ_ASSERT(len <= cap, "encoded %" PRIu64 " > max %" PRIu64, len, cap);
    FUZZ_ASSERT(wsync_delta_check(enc, len, n, l->es, "fuzz") == WSYNC_OK,
                "an encoded stream fails the check: %s", wsync_last_error());
    if (len > WSYNC_DELTA_HEADER + 8 * wsync_delta_nblocks(n)) {
        uint64_t l2;
        FUZZ_ASSERT(wsync_delta_encode_format(fmt, nw, old, &l->r, l->es, enc, len - 1, &l2,
                                              &hash, &changed) == WSYNC_ERR_INVALID,
                    "cap one byte short");
        FUZZ_ASSERT(wsync_delta_encode_format(fmt, nw, old, &l->r, l->es, enc, cap, &len, &hash,
                                              &changed) == WSYNC_OK, "encode again");
    }
    memcpy(dst, old, l->bytes);
    FUZZ_ASSERT(wsync_delta_apply(enc, len, dst, &l->r, l->es, &ah) == WSYNC_OK, "apply: %s",
                wsync_last_error());
    FUZZ_ASSERT(ah == hash && hash == wsync_delta_hash(nw, &l->r, l->es),
                "hashes of apply, encode and wsync_delta_hash differ");
    for (uint64_t e = 0; e < n; e++) {
        FUZZ_ASSERT(memcmp(at(dst, l, e), at((uint8_t *)nw, l, e), l->es) == 0,
                    "element %" PRIu64 " differs after apply", e);
        diff += memcmp(at((uint8_t *)old, l, e), at((uint8_t *)nw, l, e), l->es) != 0;
    }
    FUZZ_ASSERT(outside_same(dst, old, l), "apply wrote outside the region");
    FUZZ_ASSERT(changed == diff, "changed %" PRIu64 ", %" PRIu64 " elements differ", changed,
                diff);
    free(enc);
    free(dst);
    return changed;
}

static void op_stream(const uint8_t *p, size_t len, uint32_t es, uint8_t lsel)
{
    uint64_t n = 1, ksum = 0, hash = 0;
    uint8_t *before, *dst;
    layout_t l;

    if (len >= 16)
        memcpy(&n, p + 8, 8);
    if (wsync_delta_check(p, len, n, es, "fuzz") != WSYNC_OK) {
        FUZZ_ASSERT(strstr(wsync_last_error(), "fuzz") != NULL, "error names no chunk: %s",
                    wsync_last_error());
        if (fuzz_verbose())
            fprintf(stderr, "refused: %s\n", wsync_last_error());
        return;
    }
    if (fuzz_verbose())
        fprintf(stderr, "passed: %" PRIu64 " elements of %u\n", n, es);
    if (n > MAX_APPLY)
        return;
    for (uint64_t j = 0; j < wsync_delta_nblocks(n); j++) {
        uint32_t mk;
        memcpy(&mk, p + WSYNC_DELTA_HEADER + 8 * j + 4, 4);
        ksum += wsync_delta_word_k(mk);
    }
    l = make_layout(n, es, lsel);
    before = malloc(l.bytes);
    dst = malloc(l.bytes);
    FUZZ_ASSERT(before != NULL && dst != NULL, "out of memory");
    fill(before, l.bytes, lsel);
    memcpy(dst, before, l.bytes);
    FUZZ_ASSERT(wsync_delta_apply(p, len, dst, &l.r, es, &hash) == WSYNC_OK,
                "apply of a checked stream: %s", wsync_last_error());
    FUZZ_ASSERT(hash == wsync_delta_hash(dst, &l.r, es), "apply's hash is not the result's");
    FUZZ_ASSERT(outside_same(dst, before, &l), "apply wrote outside the region");
    FUZZ_ASSERT(encode_round_trip(dst, before, &l, wsync_delta_format(p, len)) <= ksum,
                "more elements changed than the stream's k");
    free(before);
    free(dst);
}

static void op_encode(const uint8_t *p, size_t len, uint32_t es, uint8_t lsel, uint32_t fmt)
{
    fuzz_in_t in = {p, len};
    uint64_t n = 1 + fuzz_take(&in, 2) % MAX_ENC;
    uint8_t seed = (uint8_t)fuzz_take(&in, 1), *old, *nw;
    layout_t l = make_layout(n, es, lsel);

    old = malloc(l.bytes);
    nw = malloc(l.bytes);
    FUZZ_ASSERT(old != NULL && nw != NULL, "out of memory");
    fill(old, l.bytes, seed);
    memcpy(nw, old, l.bytes);
    /* bytes outside the region differ too: the encoder must not look at them */
    for (size_t i = 0; i < es; i++)
        nw[i] ^= 0xff;
    while (in.n >= 4) {
        uint64_t e = fuzz_take(&in, 2) % n;
        uint32_t b = (uint32_t)fuzz_take(&in, 1) % es;
        at(nw, &l, e)[b] ^= (uint8_t)fuzz_take(&in, 1);
    }
    encode_round_trip(nw, old, &l, fmt);
    free(old);
    free(nw);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint32_t es;

    if (size < 2)
        return 0;
    es = 1u << ((data[0] >> 1) & 3);
    if (data[0] & 1)
        op_encode(data + 2, size - 2, es, data[1],
                  data[0] & 8 ? WSYNC_DELTA_FORMAT_STEPS : WSYNC_DELTA_FORMAT);
    else
        op_stream(data + 2, size - 2, es, data[1]);
    return 0;
}
