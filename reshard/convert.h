/* Internal: scalar conversions between bf16, f16 and f32 (round to nearest even, NaN kept). */
#ifndef WSYNC_RESHARD_CONVERT_H
#define WSYNC_RESHARD_CONVERT_H

#include <stdint.h>
#include <string.h>

static inline float wsync_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t wsync_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)          /* NaN: keep it quiet, keep the sign */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);                /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static inline float wsync_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    float f;

    if (exp == 0x1fu) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else {                                         /* subnormal: normalize */
        exp = 113u;
        while ((man & 0x400u) == 0) {
            man <<= 1;
            exp--;
        }
        u = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t wsync_f32_to_f16(float f)
{
    uint32_t u, sign, exp, man;
    memcpy(&u, &f, 4);
    sign = (u >> 16) & 0x8000u;
    exp = (u >> 23) & 0xffu;
    man = u & 0x7fffffu;
    if (exp == 0xffu)                                /* Inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0));
    int32_t e = (int32_t)exp - 127 + 15;
    if (e >= 0x1f)                                   /* overflow → Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {                                    /* subnormal or zero */
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = 1u << (shift - 1);
        uint32_t rest = man & ((1u << shift) - 1);
        uint32_t r = man >> shift;
        if (rest > half || (rest == half && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (r & 1u)))
        r++;                                         /* may carry into the exponent: correct */
    return (uint16_t)(sign | r);
}

#endif
