/* kernels/vdiff.h, the delta encoders' compare of two 16-byte vectors, against the loop it
 * replaces (element by element, written here): every single-lane difference of every lane (all
 * 65,535 non-zero differences of a 2-byte lane, all 255 of a byte), the values that probe the
 * carries (0x8000, 0x7fff, 0x0001, 0xffff and their byte forms) in every lane at once, and random
 * pairs that differ in several lanes. */
#include <stdint.h>
#include <string.h>

#include "kernels/vdiff.h"
#include "tests/support/check.h"

static uint64_t rng = 0x243f6a8885a308d3ull;

static uint32_t next32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* The loop: bit e set when element e (esize bytes, little-endian lanes) of a and b differ. */
static uint32_t ref_diff(const uint32_t a[4], const uint32_t b[4], int esize)
{
    uint8_t x[16], y[16];
    uint32_t bits = 0;

    memcpy(x, a, 16);
    memcpy(y, b, 16);
    for (int e = 0; e < 16 / esize; e++)
        if (memcmp(x + e * esize, y + e * esize, (size_t)esize) != 0)
            bits |= 1u << e;
    return bits;
}

static uint32_t fast_diff(const uint32_t a[4], const uint32_t b[4], int esize)
{
    return esize == 2 ? wk_vdiff2(a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3])
                      : wk_vdiff1(a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]);
}

static int check_pair(const uint32_t a[4], const uint32_t b[4], int esize)
{
    const uint32_t r = ref_diff(a, b, esize), f = fast_diff(a, b, esize);
    CHECK_MSG(r == f, "esize %d: %08x %08x %08x %08x against %08x %08x %08x %08x: bits %x, "
              "the loop says %x", esize, a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], f, r);
    return r == f;
}

static void test_single_lane(void)
{
    for (int esize = 1; esize <= 2; esize++) {
        const uint32_t lanes = 16u / (uint32_t)esize, top = esize == 2 ? 0xffffu : 0xffu;
        int ok = 1;
        for (uint32_t lane = 0; lane < lanes && ok; lane++)
            for (uint32_t d = 1; d <= top && ok; d++) {
                uint32_t a[4] = {next32(), next32(), next32(), next32()}, b[4];
                memcpy(b, a, 16);
                b[lane * (uint32_t)esize / 4] ^= d << (8 * ((lane * (uint32_t)esize) % 4));
                ok = check_pair(a, b, esize) && fast_diff(a, b, esize) == 1u << lane;
                ok &= fast_diff(a, a, esize) == 0;
            }
        CHECK_MSG(ok, "esize %d: single-lane differences", esize);
    }
}

static void test_carry_values(void)
{
    static const uint16_t v16[] = {0, 0x8000, 0x7fff, 0x0001, 0xffff, 0x8001, 0x00ff, 0xff00};
    static const uint8_t v8[] = {0, 0x80, 0x7f, 0x01, 0xff, 0x81};
    int ok = 1;
    for (int it = 0; it < 200000 && ok; it++) {
        uint32_t a[4], b[4];
        uint16_t ha[8], hb[8];
        uint8_t ca[16], cb[16];
        for (int i = 0; i < 8; i++) {
            ha[i] = v16[next32() % 8];
            hb[i] = v16[next32() % 8];
        }
        memcpy(a, ha, 16);
        memcpy(b, hb, 16);
        ok &= check_pair(a, b, 2);
        for (int i = 0; i < 16; i++) {
            ca[i] = v8[next32() % 6];
            cb[i] = v8[next32() % 6];
        }
        memcpy(a, ca, 16);
        memcpy(b, cb, 16);
        ok &= check_pair(a, b, 1);
    }
    CHECK_MSG(ok, "lanes of 0x8000, 0x7fff, 0x0001, 0xffff ... against each other");
}

static void test_random(void)
{
    int ok = 1;
    for (int it = 0; it < 2000000 && ok; it++) {
        uint32_t a[4] = {next32(), next32(), next32(), next32()}, b[4];
        memcpy(b, a, 16);
        for (int w = 0; w < 4; w++)
            if (next32() & 1)   /* one bit, or a whole new word */
                b[w] ^= (next32() & 1) ? 1u << (next32() & 31) : next32();
        ok &= check_pair(a, b, 2) && check_pair(a, b, 1);
    }
    CHECK_MSG(ok, "random pairs");
}

int main(void)
{
    RUN(test_single_lane);
    RUN(test_carry_values);
    RUN(test_random);
    return check_summary();
}
