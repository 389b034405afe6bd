/* FP8 codecs (part of the public API; included by wsync.h after its own declarations).
 *
 * Formats (see RESHARD_SPEC.md, "FP8 encodings"):
 *  - WSYNC_DTYPE_F8E4M3FN: s eeee mmm, bias 7, no infinity, max 448 (0x7E), NaN 0x7F / 0xFF.
 *  - WSYNC_DTYPE_F8E5M2:   s eeeee mm, bias 15, max 57344 (0x7B), inf 0x7C / 0xFC,
 *                          NaN 0x7D..0x7F (and with the sign).
 * Encoding rounds to nearest, ties to even, exactly for every float32 input (in the default
 * floating-point rounding mode). */
#ifndef WSYNC_FP8_H
#define WSYNC_FP8_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Encode n floats as FP8 of fp8_dtype (WSYNC_DTYPE_F8E4M3FN or WSYNC_DTYPE_F8E5M2) into dst[n].
 *
 * saturate = 1 (CUDA __NV_SATFINITE, what the engines' quantizers do): a finite value that rounds
 *   past the largest finite one, and +-inf, become +-max.
 * saturate = 0 (PyTorch's plain `.to(float8_*)`, CUDA __NV_NOSAT): E4M3FN turns |x| that rounds
 *   above 448 (|x| > 464) and +-inf into NaN (0x7F with the sign); E5M2 rounds past 57344 to inf.
 * In both modes NaN becomes 0x7F with the sign of the input.
 *
 * Returns WSYNC_OK, or WSYNC_ERR_INVALID for a non-FP8 dtype or a NULL pointer with n > 0
 * (dst is then untouched). src and dst are owned by the caller and must not overlap.
 * Thread-safe: keeps no state. */
wsync_status_t wsync_fp8_from_f32(const float *src, size_t n, wsync_dtype_t fp8_dtype,
                                  int saturate, uint8_t *dst);

/* Decode n FP8 codes of fp8_dtype into dst[n]. Every code has an exact float32 value; NaN codes
 * become a quiet NaN with the code's sign, E5M2 0x7C / 0xFC become +-inf.
 * Returns WSYNC_OK, or WSYNC_ERR_INVALID for a non-FP8 dtype or a NULL pointer with n > 0.
 * Buffers are owned by the caller. Thread-safe. */
wsync_status_t wsync_fp8_to_f32(const uint8_t *src, size_t n, wsync_dtype_t fp8_dtype, float *dst);

/* Shape of the fp32 scale array that quantizing a [rows, cols] target with *q produces:
 * WSYNC_QUANT_TENSOR 1 x 1, WSYNC_QUANT_CHANNEL rows x 1, WSYNC_QUANT_BLOCK
 * ceil(rows / block_rows) x ceil(cols / block_cols) (block sizes 0 mean 128).
 * Returns WSYNC_OK with *scale_rows and *scale_cols set, or WSYNC_ERR_INVALID (written nowhere)
 * for NULL pointers, negative sizes, negative block sizes or a scheme without scales
 * (WSYNC_QUANT_NONE). Thread-safe. */
wsync_status_t wsync_quant_scales_shape(const wsync_quant_t *q, int64_t rows, int64_t cols,
                                        int64_t *scale_rows, int64_t *scale_cols);

#ifdef __cplusplus
}
#endif

#endif /* WSYNC_FP8_H */
