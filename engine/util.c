/* The engine's last error, and element conversions. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"

static _Thread_local char last_error[2048];

const char *wsync_engine_last_error(void)
{
    return last_error;
}

wsync_status_t wse_err(wsync_status_t st, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(last_error, sizeof(last_error), "%s: ", wsync_status_str(st));

    if (n < 0 || (size_t)n >= sizeof(last_error))
        return st;
    va_start(ap, fmt);
    vsnprintf(last_error + n, sizeof(last_error) - (size_t)n, fmt, ap);
    va_end(ap);
    return st;
}

wsync_status_t wse_err_wsync(wsync_status_t st, const char *what)
{
    char detail[sizeof(last_error)];

    snprintf(detail, sizeof(detail), "%s", wsync_last_error());
    snprintf(last_error, sizeof(last_error), "%s: %s", what, detail[0] ? detail : wsync_status_str(st));
    return st;
}

void wse_info(const char *fmt, ...)
{
    const char *lv = getenv("WSYNC_LOG_LEVEL");
    va_list ap;

    if (lv == NULL || (strcmp(lv, "info") != 0 && strcmp(lv, "debug") != 0))
        return;
    fprintf(stderr, "wsync engine: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

float wse_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    float f;

    if (e == 0) {
        /* zero or subnormal: m * 2^-24 is exact in float */
        f = (float)m * 0x1p-24f;
        return sign ? -f : f;
    }
    if (e == 31)
        u = sign | 0x7f800000u | (m << 13);
    else
        u = sign | ((e + 112u) << 23) | (m << 13);
    memcpy(&f, &u, 4);
    return f;
}

uint16_t wse_f32_to_f16(float f)
{
    uint32_t u, sign, a;
    memcpy(&u, &f, 4);
    sign = (u >> 16) & 0x8000u;
    a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u)              /* rounds to 65536 or more: inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {             /* below 2^-14: subnormal, steps of 2^-24 */
        float x;
        memcpy(&x, &a, 4);
        float m = x * 0x1p24f;        /* exact scaling; the cast below rounds to nearest even */
        uint32_t q = (uint32_t)__builtin_rintf(m);
        return (uint16_t)(sign | q);
    }
    /* normal: drop 13 mantissa bits with round to nearest even */
    a += 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | ((a - 0x38000000u) >> 13));
}

float wse_load(wsync_dtype_t dtype, const void *p, size_t i)
{
    const uint8_t *b = p;
    uint16_t h;
    float f;

    switch (dtype) {
    case WSYNC_DTYPE_BF16:
        memcpy(&h, b + 2 * i, 2);
        return wse_bf16_to_f32(h);
    case WSYNC_DTYPE_F16:
        memcpy(&h, b + 2 * i, 2);
        return wse_f16_to_f32(h);
    case WSYNC_DTYPE_F32:
        memcpy(&f, b + 4 * i, 4);
        return f;
    default:
        return 0.0f;
    }
}

void wse_store(wsync_dtype_t dtype, void *p, size_t i, float x)
{
    uint8_t *b = p;
    uint16_t h;

    switch (dtype) {
    case WSYNC_DTYPE_BF16:
        h = wse_f32_to_bf16(x);
        memcpy(b + 2 * i, &h, 2);
        break;
    case WSYNC_DTYPE_F16:
        h = wse_f32_to_f16(x);
        memcpy(b + 2 * i, &h, 2);
        break;
    case WSYNC_DTYPE_F32:
        memcpy(b + 4 * i, &x, 4);
        break;
    default:
        break;
    }
}
