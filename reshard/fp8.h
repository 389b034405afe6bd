/* Internal: FP8 scalar codecs and the quantizers the receiver runs once a whole target has landed.
 * Bit layouts and rounding rules: include/wsync/wsync_fp8.h and RESHARD_SPEC.md. */
#ifndef WSYNC_RESHARD_FP8_H
#define WSYNC_RESHARD_FP8_H

#include "wsync/wsync.h"

#include <stdint.h>
#include <string.h>

#define WSYNC_E4M3FN_MAX 448.0f
#define WSYNC_E5M2_MAX 57344.0f

/* Round the float32 with bits u to an FP8 format with man_bits mantissa bits and exponent bias
 * `bias`, to nearest even, and clamp the code to maxcode: the largest finite code when
 * saturating, else the code overflow must land on (E4M3FN NaN 0x7F, E5M2 inf 0x7C).
 * Both the normal and the subnormal rounding are computed and one is picked with masks, so that
 * loops over it have no branches and compilers vectorize them with plain SSE2/NEON. */
static inline uint8_t wsync_fp8_encode_bits(uint32_t u, unsigned man_bits, unsigned bias,
                                            uint32_t maxcode)
{
    const unsigned drop = 23u - man_bits;            /* float32 mantissa bits dropped */
    const uint32_t magic_u = (151u - bias - man_bits) << 23;
    uint32_t sign = (u >> 24) & 0x80u;
    uint32_t a = u & 0x7fffffffu;
    float fa, magic, t;
    uint32_t n, r, m, code;

    /* normal result: rebias the exponent in place and round at bit `drop`; a carry into the
     * exponent is the right answer */
    n = a - ((127u - bias) << 23);
    n += ((1u << (drop - 1)) - 1u) + ((n >> drop) & 1u);
    n >>= drop;

    /* subnormal result: adding a power of two whose ulp is the FP8 subnormal step makes the
     * FPU round |x| to that step (nearest even, the default mode); the low bits are the code.
     * Reaching 2^man_bits gives the smallest normal code, which is right too. */
    memcpy(&fa, &a, 4);
    memcpy(&magic, &magic_u, 4);
    t = fa + magic;
    memcpy(&r, &t, 4);
    r -= magic_u;

    /* signed compares: everything is below 2^31, and SSE2 has no unsigned ones */
    m = 0u - (uint32_t)((int32_t)a < (int32_t)((128u - bias) << 23));
    code = (r & m) | (n & ~m);
    m = 0u - (uint32_t)((int32_t)code > (int32_t)maxcode);      /* overflow and inf */
    code = (maxcode & m) | (code & ~m);
    m = 0u - (uint32_t)((int32_t)a > (int32_t)0x7f800000);      /* NaN */
    code = (0x7fu & m) | (code & ~m);
    return (uint8_t)(sign | code);
}

static inline uint8_t wsync_f32_to_e4m3fn(float x, int saturate)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return wsync_fp8_encode_bits(u, 3, 7, saturate ? 0x7eu : 0x7fu);
}

static inline uint8_t wsync_f32_to_e5m2(float x, int saturate)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return wsync_fp8_encode_bits(u, 2, 15, saturate ? 0x7bu : 0x7cu);
}

/* Exact value of an FP8 code with man_bits mantissa bits and bias `bias`; specials are decided by
 * the caller through is_nan / is_inf. */
static inline float wsync_fp8_decode_bits(uint8_t c, unsigned man_bits, unsigned bias, int is_nan,
                                          int is_inf)
{
    uint32_t a = c & 0x7fu;
    uint32_t u;
    float f;

    if (is_nan) {
        u = 0x7fc00000u;
    } else if (is_inf) {
        u = 0x7f800000u;
    } else if ((a >> man_bits) == 0) {
        /* subnormal: a * 2^(1-bias-man_bits), exact in float32 */
        uint32_t step_bits = (uint32_t)(128 - (int)bias - (int)man_bits) << 23;
        float step;
        memcpy(&step, &step_bits, 4);
        f = (float)a * step;
        memcpy(&u, &f, 4);
    } else {
        u = (a << (23u - man_bits)) + ((127u - bias) << 23);
    }
    u |= (uint32_t)(c & 0x80u) << 24;
    memcpy(&f, &u, 4);
    return f;
}

static inline float wsync_e4m3fn_to_f32(uint8_t c)
{
    return wsync_fp8_decode_bits(c, 3, 7, (c & 0x7fu) == 0x7fu, 0);
}

static inline float wsync_e5m2_to_f32(uint8_t c)
{
    return wsync_fp8_decode_bits(c, 2, 15, (c & 0x7fu) > 0x7cu, (c & 0x7fu) == 0x7cu);
}

/* Largest finite value of an FP8 dtype; 0 for another dtype. */
static inline float wsync_fp8_max(wsync_dtype_t fp8_dtype)
{
    return fp8_dtype == WSYNC_DTYPE_F8E4M3FN ? WSYNC_E4M3FN_MAX
         : fp8_dtype == WSYNC_DTYPE_F8E5M2   ? WSYNC_E5M2_MAX
                                             : 0.0f;
}

/* max |x[i]| over n floats, found on the bit patterns (non-negative floats order like their
 * bits), so one pass also flags non-finite input: the result is +inf or NaN when x holds one.
 * 0 for n == 0. Thread-safe. */
float wsync_amax_f32(const float *x, uint64_t n);

/* Quantize a [rows, cols] float32 matrix (row i at x + i * x_pitch, pitches in elements) to FP8
 * of fp8_dtype at out (row i at out + i * out_pitch) with the scheme of *q, and write the fp32
 * dequantization scales (x ~= decode(q) * s) row-major to `scales`, in the shape given by
 * wsync_quant_scales_shape:
 *  - WSYNC_QUANT_TENSOR:  s = amax / fmax over the whole matrix, q = encode(x / s);
 *  - WSYNC_QUANT_CHANNEL: the same per row;
 *  - WSYNC_QUANT_BLOCK:   s = max(amax, eps) / fmax per block_rows x block_cols block (0 → 128;
 *                         eps <= 0 → 1e-4; edge blocks over their valid elements only),
 *                         optionally rounded up to a power of two (q->ue8m0),
 *                         q = encode(x * (1 / s)) as DeepGEMM and vLLM compute it.
 * fmax is 448 (E4M3FN) or 57344 (E5M2). A scale of 0 (amax 0) or below FLT_MIN (amax so small
 * every element rounds to 0 anyway) is replaced by 1. Saturating unless q->no_saturate.
 * `name` is the target's name, used in error messages only. x and out must not overlap.
 * Returns WSYNC_OK; WSYNC_ERR_NONFINITE if x holds a NaN or Inf (the message names `name` and the
 * first bad element's row and column); WSYNC_ERR_INVALID for bad arguments (NULL pointers, a
 * non-FP8 dtype, WSYNC_QUANT_NONE, negative block sizes, a non-finite eps, ue8m0 without
 * blocks, a pitch below cols); WSYNC_ERR_NOMEM. On error, out and scales are untouched.
 * Thread-safe. */
wsync_status_t wsync_quantize_f32(const char *name, const float *x, uint64_t rows, uint64_t cols,
                                  uint64_t x_pitch, const wsync_quant_t *q,
                                  wsync_dtype_t fp8_dtype, uint8_t *out, uint64_t out_pitch,
                                  float *scales);

/* The per-tensor rule's scale for a tensor whose max |x| is amax (as wsync_quantize_f32 makes
 * it with WSYNC_QUANT_TENSOR): amax / fmax, 1 where that is 0 or below FLT_MIN. amax must be
 * finite. Thread-safe. */
float wsync_fp8_tensor_scale(float amax, wsync_dtype_t fp8_dtype);

/* Encode a [rows, cols] float32 matrix with a given per-tensor scale: out = encode(x / scale),
 * bit for bit what wsync_quantize_f32 writes with WSYNC_QUANT_TENSOR when its own amax gives that
 * scale (FP8 on the wire: a sender's part of a tensor, the scale from every sender's amax).
 * Saturating unless no_saturate. WSYNC_ERR_INVALID for a non-FP8 dtype, NULL pointers, pitches
 * below cols, or a scale that is not finite and >= FLT_MIN. Thread-safe. */
wsync_status_t wsync_fp8_encode_scaled_f32(const float *x, uint64_t rows, uint64_t cols,
                                           uint64_t x_pitch, float scale,
                                           wsync_dtype_t fp8_dtype, int no_saturate,
                                           uint8_t *out, uint64_t out_pitch);

/* The inverse: out[i][j] = decode(qv[i][j]) * s for the scale s covering (i, j), computed in
 * float32. Same arguments and errors as wsync_quantize_f32 (no NONFINITE). Thread-safe. */
wsync_status_t wsync_dequantize_f32(const uint8_t *qv, uint64_t rows, uint64_t cols,
                                    uint64_t q_pitch, const wsync_quant_t *q,
                                    wsync_dtype_t fp8_dtype, const float *scales, float *out,
                                    uint64_t out_pitch);

#endif
