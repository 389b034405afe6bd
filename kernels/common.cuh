/* Internal to kernels/: what the copy and quantization kernels share — CUDA errors as wsync
 * statuses, element loads and stores, and bit-exact device ports of reshard/convert.h. */
#ifndef WSYNC_KERNELS_COMMON_CUH
#define WSYNC_KERNELS_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "core/status.h"
}
#include "kernels/kernels.h"

#define WK_THREADS 256                 /* threads of every block */
#ifndef WK_IPT                         /* -DWK_IPT=N builds a variant to measure */
#define WK_IPT 4                       /* items a thread takes per unit */
#endif
#define WK_UNIT (WK_THREADS * WK_IPT)  /* items of one unit of work */
#define WK_MAX_GRID (1u << 30)
#define WK_FULL 0xffffffffu            /* every lane of a warp (the *_sync masks) */

/* Element kinds (element sizes in bytes: 2, 2, 4, 1). */
enum { WK_BF16 = 0, WK_F16 = 1, WK_F32 = 2, WK_BYTE = 3 };

static inline int wk_kind(wsync_dtype_t t)
{
    return t == WSYNC_DTYPE_BF16 ? WK_BF16 : t == WSYNC_DTYPE_F16 ? WK_F16
         : t == WSYNC_DTYPE_F32  ? WK_F32  : -1;
}

__host__ __device__ constexpr int wk_size(int kind)
{
    return kind == WK_F32 ? 4 : kind == WK_BYTE ? 1 : 2;
}

static inline wsync_status_t wk_cuda(cudaError_t e, const char *what)
{
    return wsync_err(WSYNC_ERR_DEVICE, "%s: %s (%s)", what, cudaGetErrorName(e),
                     cudaGetErrorString(e));
}

/* After a launch: a launch error, or one a previous kernel left behind. */
static inline wsync_status_t wk_launched(const char *what)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? WSYNC_OK : wk_cuda(e, what);
}

/* Blocks for a grid-stride loop over `units`: every unit its block, up to WK_MAX_GRID. */
static inline unsigned wk_grid(uint64_t units)
{
    return units < WK_MAX_GRID ? (unsigned)(units > 0 ? units : 1) : WK_MAX_GRID;
}

/* ------------------------------------------------------------------------------------------ */
/* Conversions: the integer algorithms of reshard/convert.h, on bit patterns (f32 as uint32).     */
/* ------------------------------------------------------------------------------------------ */

__device__ __forceinline__ uint32_t wk_f16_to_f32(uint32_t h)
{
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;

    if (exp == 0x1fu)
        return sign | 0x7f800000u | (man << 13);
    if (exp != 0)
        return sign | ((exp + 112u) << 23) | (man << 13);
    if (man == 0)
        return sign;
    /* subnormal: shift the leading one up to bit 10, as the CPU loop does */
    uint32_t sh = (uint32_t)__clz((int)man) - 21u;
    return sign | ((113u - sh) << 23) | (((man << sh) & 0x3ffu) << 13);
}

__device__ __forceinline__ uint32_t wk_f32_to_bf16(uint32_t u)
{
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return ((u >> 16) | 0x0040u) & 0xffffu;
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}

__device__ __forceinline__ uint32_t wk_f32_to_f16(uint32_t u)
{
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t exp = (u >> 23) & 0xffu;
    uint32_t man = u & 0x7fffffu;

    if (exp == 0xffu)
        return sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0u);
    int32_t e = (int32_t)exp - 127 + 15;
    if (e >= 0x1f)
        return sign | 0x7c00u;
    if (e <= 0) {
        if (e < -10)
            return sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = 1u << (shift - 1);
        uint32_t rest = man & ((1u << shift) - 1);
        uint32_t r = man >> shift;
        if (rest > half || (rest == half && (r & 1u)))
            r++;
        return sign | r;
    }
    uint32_t r = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (r & 1u)))
        r++;
    return sign | r;
}

/* Element bits of kind K -> f32 bits, and back. */
template <int K>
__device__ __forceinline__ uint32_t wk_to_f32(uint32_t e)
{
    if constexpr (K == WK_BF16)
        return e << 16;
    else if constexpr (K == WK_F16)
        return wk_f16_to_f32(e);
    else
        return e;
}

template <int K>
__device__ __forceinline__ uint32_t wk_from_f32(uint32_t u)
{
    if constexpr (K == WK_BF16)
        return wk_f32_to_bf16(u);
    else if constexpr (K == WK_F16)
        return wk_f32_to_f16(u);
    else
        return u;
}

/* ------------------------------------------------------------------------------------------ */
/* Loads and stores of B = 1..32 bytes at an address aligned to min(B, 16).                     */
/* ------------------------------------------------------------------------------------------ */

/* B bytes into 32-bit words w[0 .. max(B/4, 1)), little-endian (a B < 4 load fills w[0]). */
template <int B>
__device__ __forceinline__ void wk_load_words(const unsigned char *p, uint32_t *w)
{
    if constexpr (B >= 16) {
#pragma unroll
        for (int i = 0; i < B / 16; i++) {
            uint4 v = reinterpret_cast<const uint4 *>(p)[i];
            w[4 * i] = v.x;
            w[4 * i + 1] = v.y;
            w[4 * i + 2] = v.z;
            w[4 * i + 3] = v.w;
        }
    } else if constexpr (B == 8) {
        uint2 v = *reinterpret_cast<const uint2 *>(p);
        w[0] = v.x;
        w[1] = v.y;
    } else if constexpr (B == 4) {
        w[0] = *reinterpret_cast<const uint32_t *>(p);
    } else if constexpr (B == 2) {
        w[0] = *reinterpret_cast<const unsigned short *>(p);
    } else {
        w[0] = *p;
    }
}

template <int B>
__device__ __forceinline__ void wk_store_words(unsigned char *p, const uint32_t *w)
{
    if constexpr (B >= 16) {
#pragma unroll
        for (int i = 0; i < B / 16; i++)
            reinterpret_cast<uint4 *>(p)[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2],
                                                         w[4 * i + 3]);
    } else if constexpr (B == 8) {
        *reinterpret_cast<uint2 *>(p) = make_uint2(w[0], w[1]);
    } else if constexpr (B == 4) {
        *reinterpret_cast<uint32_t *>(p) = w[0];
    } else if constexpr (B == 2) {
        *reinterpret_cast<unsigned short *>(p) = (unsigned short)w[0];
    } else {
        *p = (unsigned char)w[0];
    }
}

/* G elements of kind K (2 or 4 bytes) at p, as bits in e[0..G). */
template <int K, int G>
__device__ __forceinline__ void wk_load_elems(const unsigned char *p, uint32_t *e)
{
    constexpr int S = wk_size(K), B = S * G, NW = B >= 4 ? B / 4 : 1;
    uint32_t w[NW];
    wk_load_words<B>(p, w);
#pragma unroll
    for (int i = 0; i < G; i++) {
        if constexpr (S == 4)
            e[i] = w[i];
        else
            e[i] = (w[i / 2] >> (16 * (i & 1))) & 0xffffu;
    }
}

template <int K, int G>
__device__ __forceinline__ void wk_store_elems(unsigned char *p, const uint32_t *e)
{
    constexpr int S = wk_size(K), B = S * G, NW = B >= 4 ? B / 4 : 1;
    uint32_t w[NW];
#pragma unroll
    for (int i = 0; i < NW; i++)
        w[i] = 0;
#pragma unroll
    for (int i = 0; i < G; i++) {
        if constexpr (S == 4)
            w[i] = e[i];
        else
            w[i / 2] |= (e[i] & 0xffffu) << (16 * (i & 1));
    }
    wk_store_words<B>(p, w);
}

/* One element of kind K (any alignment of its own size). */
template <int K>
__device__ __forceinline__ uint32_t wk_load_one(const unsigned char *p)
{
    uint32_t w;
    wk_load_words<wk_size(K)>(p, &w);
    return w;
}

template <int K>
__device__ __forceinline__ void wk_store_one(unsigned char *p, uint32_t e)
{
    wk_store_words<wk_size(K)>(p, &e);
}

/* Linear item `it` of a [rows, ipr] grid as (row, col); 32-bit division where it fits. */
__device__ __forceinline__ void wk_divmod(uint64_t it, uint64_t ipr, uint64_t rows, uint64_t &r,
                                          uint64_t &c)
{
    if (rows == 1) {
        r = 0;
        c = it;
    } else if (((it | ipr) >> 32) == 0) {
        uint32_t q = (uint32_t)it / (uint32_t)ipr;
        r = q;
        c = (uint32_t)it - q * (uint32_t)ipr;
    } else {
        r = it / ipr;
        c = it - r * ipr;
    }
}

#endif
