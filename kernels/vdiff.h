/* Which elements of two 16-byte vectors differ, as bits (bit e: element e), for 2- and 1-byte
 * elements, in a few word operations instead of an element-by-element loop: the delta encoders'
 * compare (kernels/delta_dev.cuh wk_vdiff), which runs for every 16 bytes of both versions. Plain C,
 * so that tests/unit/test_vdiff.c checks it on the CPU against the loop. Elements compare as bit
 * patterns: a lane of a ^ b is not zero exactly when the elements differ. */
#ifndef WSYNC_KERNELS_VDIFF_H
#define WSYNC_KERNELS_VDIFF_H

#include <stdint.h>

#ifdef __CUDACC__
#define WK_VDIFF_FN static __host__ __device__ __forceinline__
#else
#define WK_VDIFF_FN static inline
#endif

/* The top bit of each 16-bit half set when that half of a ^ b is not zero: its low 15 bits plus
 * 0x7fff reach bit 15 when any is set (never carrying into the next half), and the OR adds the
 * half's own top bit. */
WK_VDIFF_FN uint32_t wk_nz16(uint32_t a, uint32_t b)
{
    const uint32_t d = a ^ b;
    return (((d & 0x7fff7fffu) + 0x7fff7fffu) | d) & 0x80008000u;
}

/* The same for each byte: its top bit set when that byte of a ^ b is not zero. */
WK_VDIFF_FN uint32_t wk_nz8(uint32_t a, uint32_t b)
{
    const uint32_t d = a ^ b;
    return (((d & 0x7f7f7f7fu) + 0x7f7f7f7fu) | d) & 0x80808080u;
}

/* Eight 2-byte elements (words a0..a3 against b0..b3, element 2w in the low half of word w):
 * word w's two flags (bits 15 and 31) shifted to bits 2w and 2w + 16, then the upper ones folded
 * down onto 2w + 1. On sm_90 the flags come from min.u16x2 instead (same bits; the GPU run of
 * test_delta_kernels checks that path's streams against the CPU codec). */
WK_VDIFF_FN uint32_t wk_vdiff2(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                               uint32_t b1, uint32_t b2, uint32_t b3)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    /* Hopper's min.u16x2 (one instruction): each half of a ^ b capped at 1, so word w's flags
     * are bits 0 and 16, placed at 2w and 2w + 16 */
    uint32_t f0, f1, f2, f3;
    asm("min.u16x2 %0, %1, %2;" : "=r"(f0) : "r"(a0 ^ b0), "r"(0x00010001u));
    asm("min.u16x2 %0, %1, %2;" : "=r"(f1) : "r"(a1 ^ b1), "r"(0x00010001u));
    asm("min.u16x2 %0, %1, %2;" : "=r"(f2) : "r"(a2 ^ b2), "r"(0x00010001u));
    asm("min.u16x2 %0, %1, %2;" : "=r"(f3) : "r"(a3 ^ b3), "r"(0x00010001u));
    const uint32_t t = f0 | f1 << 2 | f2 << 4 | f3 << 6;
#else
    const uint32_t t = wk_nz16(a0, b0) >> 15 | wk_nz16(a1, b1) >> 13 | wk_nz16(a2, b2) >> 11 |
                       wk_nz16(a3, b3) >> 9;
#endif
    return (t | t >> 15) & 0xffu;
}

/* Bits 7, 15, 23 and 31 of m to bits 0..3: shifted to 0, 8, 16, 24, the multiply puts copies 7,
 * 14 and 21 places up (no two land on one bit, so nothing carries), and bits 21..24 hold them in
 * order. */
WK_VDIFF_FN uint32_t wk_gather4(uint32_t m)
{
    return ((m >> 7) * 0x00204081u) >> 21 & 0xfu;
}

/* Sixteen 1-byte elements. */
WK_VDIFF_FN uint32_t wk_vdiff1(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                               uint32_t b1, uint32_t b2, uint32_t b3)
{
    return wk_gather4(wk_nz8(a0, b0)) | wk_gather4(wk_nz8(a1, b1)) << 4 |
           wk_gather4(wk_nz8(a2, b2)) << 8 | wk_gather4(wk_nz8(a3, b3)) << 12;
}

#endif
