/* Internal to the delta codec's kernels (kernels/delta*.cu, through kernels/delta_dev.cuh):
 * XXH3_64bits (seed 0, default secret) on the device, every length class, bit-exact with xxhash.h
 * (tests/gpu/test_delta_kernels "xxh3"): the codec's leaf and tree hashes, by a block, and by one
 * warp (wkw_*) for its full blocks. Its secret is a static __constant__ definition: each
 * translation unit that includes this has its own copy (no separate device linking). */
#ifndef WSYNC_KERNELS_XXH3_CUH
#define WSYNC_KERNELS_XXH3_CUH

#include <stdint.h>

#include "kernels/common.cuh"

#ifndef WK_XXH_FN
#define WK_XXH_FN __device__ __forceinline__
#endif

/* The default secret of XXH3 (xxhash.h's XXH3_kSecret, the specification's constant). Kernels
 * copy it to shared memory: lanes read it at different offsets. */
static __constant__ unsigned char wk_xxh_secret[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

#define WK_P32_1 UINT64_C(0x9E3779B1)
#define WK_P32_2 UINT64_C(0x85EBCA77)
#define WK_P32_3 UINT64_C(0xC2B2AE3D)
#define WK_P64_1 UINT64_C(0x9E3779B185EBCA87)
#define WK_P64_2 UINT64_C(0xC2B2AE3D27D4EB4F)
#define WK_P64_3 UINT64_C(0x165667B19E3779F9)
#define WK_P64_4 UINT64_C(0x85EBCA77C2B2AE63)
#define WK_P64_5 UINT64_C(0x27D4EB2F165667C5)
#define WK_PMX_1 UINT64_C(0x165667919E3779F9)
#define WK_PMX_2 UINT64_C(0x9FB21C651E98DF25)

/* Little-endian loads at any alignment (the device is little-endian). */
WK_XXH_FN uint64_t wk_rd64(const unsigned char *p)
{
    if (((uintptr_t)p & 7) == 0)
        return *(const uint64_t *)p;
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

WK_XXH_FN uint32_t wk_rd32(const unsigned char *p)
{
    if (((uintptr_t)p & 3) == 0)
        return *(const uint32_t *)p;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

WK_XXH_FN uint64_t wk_rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

WK_XXH_FN uint64_t wk_swap64(uint64_t x)
{
    uint64_t r = 0;
    for (int i = 0; i < 8; i++)
        r = (r << 8) | ((x >> (8 * i)) & 0xff);
    return r;
}

WK_XXH_FN uint64_t wk_fold64(uint64_t a, uint64_t b)
{
#ifdef __CUDA_ARCH__
    return (a * b) ^ __umul64hi(a, b);
#else
    unsigned __int128 p = (unsigned __int128)a * b;
    return (uint64_t)p ^ (uint64_t)(p >> 64);
#endif
}

WK_XXH_FN uint64_t wk_avalanche3(uint64_t h)
{
    h ^= h >> 37;
    h *= WK_PMX_1;
    return h ^ (h >> 32);
}

WK_XXH_FN uint64_t wk_avalanche64(uint64_t h)
{
    h ^= h >> 33;
    h *= WK_P64_2;
    h ^= h >> 29;
    h *= WK_P64_3;
    return h ^ (h >> 32);
}

WK_XXH_FN uint64_t wk_mix16(const unsigned char *p, const unsigned char *s)
{
    return wk_fold64(wk_rd64(p) ^ wk_rd64(s), wk_rd64(p + 8) ^ wk_rd64(s + 8));
}

/* Inputs of 0..240 bytes, by one thread; s: the secret. */
WK_XXH_FN uint64_t wk_xxh3_short(const unsigned char *p, uint64_t len, const unsigned char *s)
{
    if (len == 0)
        return wk_avalanche64(wk_rd64(s + 56) ^ wk_rd64(s + 64));
    if (len <= 3) {
        uint32_t comb = (uint32_t)p[0] << 16 | (uint32_t)p[len >> 1] << 24 | (uint32_t)p[len - 1] |
                        (uint32_t)len << 8;
        return wk_avalanche64((uint64_t)comb ^ (uint64_t)(wk_rd32(s) ^ wk_rd32(s + 4)));
    }
    if (len <= 8) {
        uint64_t in = (uint64_t)wk_rd32(p + len - 4) + ((uint64_t)wk_rd32(p) << 32);
        uint64_t h = in ^ (wk_rd64(s + 8) ^ wk_rd64(s + 16));
        h ^= wk_rotl64(h, 49) ^ wk_rotl64(h, 24);
        h *= WK_PMX_2;
        h ^= (h >> 35) + len;
        h *= WK_PMX_2;
        return h ^ (h >> 28);
    }
    if (len <= 16) {
        uint64_t lo = wk_rd64(p) ^ (wk_rd64(s + 24) ^ wk_rd64(s + 32));
        uint64_t hi = wk_rd64(p + len - 8) ^ (wk_rd64(s + 40) ^ wk_rd64(s + 48));
        return wk_avalanche3(len + wk_swap64(lo) + hi + wk_fold64(lo, hi));
    }
    uint64_t acc = len * WK_P64_1;
    if (len <= 128) {
        /* pairs of 16-byte lanes from both ends, as many as the length holds */
        uint32_t pairs = len > 96 ? 4 : len > 64 ? 3 : len > 32 ? 2 : 1;
        for (uint32_t i = 0; i < pairs; i++) {
            acc += wk_mix16(p + 16 * i, s + 32 * i);
            acc += wk_mix16(p + len - 16 * (i + 1), s + 32 * i + 16);
        }
        return wk_avalanche3(acc);
    }
    /* 129..240: eight rounds, an avalanche, the rest at secret offset 3, the last 16 bytes */
    for (uint32_t i = 0; i < 8; i++)
        acc += wk_mix16(p + 16 * i, s + 16 * i);
    acc = wk_avalanche3(acc);
    uint32_t rounds = (uint32_t)(len / 16);
    for (uint32_t i = 8; i < rounds; i++)
        acc += wk_mix16(p + 16 * i, s + 16 * (i - 8) + 3);
    acc += wk_mix16(p + len - 16, s + 136 - 17);
    return wk_avalanche3(acc);
}

/* Inputs of more than 240 bytes, by the whole block (every thread calls it; the result is thread
 * 0's). XXH3's long loop adds, per 64-byte stripe, terms that do not depend on the accumulators;
 * only the scramble after every 1024 bytes (16 stripes) is not linear. So thread (segment, lane)
 * sums its lane's terms over the 16 stripes of its segment, 32 segments at a time, and eight
 * threads (one per accumulator) then run the scrambles in order. hsum: 256 words of shared
 * memory. */
static __device__ uint64_t wk_xxh3_long(const unsigned char *p, uint64_t len, const unsigned char *s,
                                        uint64_t *hsum)
{
    const uint64_t nfull = (len - 1) / 1024;   /* segments followed by a scramble */
    const uint32_t nlast = (uint32_t)(((len - 1) - nfull * 1024) / 64);
    const uint64_t nseg = nfull + 1;
    const int t = threadIdx.x, lane = t & 7;
    /* the accumulators' starting values, without a local array */
    uint64_t acc = lane == 0 ? WK_P32_3 : lane == 1 ? WK_P64_1 : lane == 2 ? WK_P64_2
                 : lane == 3 ? WK_P64_3 : lane == 4 ? WK_P64_4 : lane == 5 ? WK_P32_2
                 : lane == 6 ? WK_P64_5 : WK_P32_1;

    for (uint64_t base = 0; base < nseg; base += WK_THREADS / 8) {
        uint64_t seg = base + (uint64_t)(t >> 3), sv = 0, sp = 0;
        if (seg < nseg) {
            uint32_t ns = seg < nfull ? 16 : nlast;
            const unsigned char *q = p + seg * 1024 + 8 * lane;
            for (uint32_t n = 0; n < ns; n++) {
                uint64_t v = wk_rd64(q + 64 * n), key = v ^ wk_rd64(s + 8 * n + 8 * lane);
                sv += v;
                sp += (key & 0xffffffffu) * (key >> 32);
            }
            if (seg == nseg - 1) {   /* the last stripe: the input's last 64 bytes */
                uint64_t v = wk_rd64(p + len - 64 + 8 * lane), key = v ^ wk_rd64(s + 121 + 8 * lane);
                sv += v;
                sp += (key & 0xffffffffu) * (key >> 32);
            }
        }
        /* accumulator i takes its own products and the values of lane i ^ 1 */
        hsum[t] = sp + __shfl_xor_sync(WK_FULL, sv, 1);
        __syncthreads();
        if (t < 8) {
            uint64_t end = nseg < base + WK_THREADS / 8 ? nseg : base + WK_THREADS / 8;
            for (uint64_t g = base; g < end; g++) {
                acc += hsum[(g - base) * 8 + t];
                if (g < nfull) {
                    acc ^= acc >> 47;
                    acc ^= wk_rd64(s + 128 + 8 * t);
                    acc *= WK_P32_1;
                }
            }
        }
        __syncthreads();
    }
    if (t < 8)
        hsum[t] = acc;
    __syncthreads();
    uint64_t h = 0;
    if (t == 0) {
        h = len * WK_P64_1;
        for (int i = 0; i < 4; i++)
            h += wk_fold64(hsum[2 * i] ^ wk_rd64(s + 11 + 16 * i),
                           hsum[2 * i + 1] ^ wk_rd64(s + 11 + 16 * i + 8));
        h = wk_avalanche3(h);
    }
    __syncthreads();   /* hsum is free again */
    return h;
}

/* XXH3_64bits(p, len) by the whole block; thread 0 gets it. */
static __device__ uint64_t wk_xxh3(const unsigned char *p, uint64_t len, const unsigned char *s,
                                   uint64_t *hsum)
{
    if (len > 240)
        return wk_xxh3_long(p, len, s, hsum);
    return threadIdx.x == 0 ? wk_xxh3_short(p, len, s) : 0;
}

/* The secret into shared memory (before the first __syncthreads of a kernel). */
__device__ __forceinline__ void wk_secret_load(uint64_t *sec)
{
    if (threadIdx.x < 24)
        sec[threadIdx.x] = wk_rd64(wk_xxh_secret + 8 * threadIdx.x);
}

/* ------------------------------------------------------------------------------------------ */
/* One warp's XXH3_64bits of an input of L bytes (a multiple of 1024, the delta codec's full     */
/* block) held as 16-byte vectors: the warp kernels of kernels/delta_*.cu                        */
/* ------------------------------------------------------------------------------------------ */

/* XXH3's stripe terms of one 16-byte vector (bytes 8 i0 .. 8 i0 + 15 of a stripe) with the keys
 * of those bytes: *a gets accumulator i0's term, *b accumulator i0 + 1's. */
__device__ __forceinline__ void wkw_terms(const uint4 &x, uint64_t k0, uint64_t k1, uint64_t *a,
                                          uint64_t *b)
{
    const uint64_t d0 = (uint64_t)x.y << 32 | x.x, d1 = (uint64_t)x.w << 32 | x.z;
    const uint64_t y0 = d0 ^ k0, y1 = d1 ^ k1;
    *a += (y0 & 0xffffffffu) * (y0 >> 32) + d1;
    *b += (y1 & 0xffffffffu) * (y1 >> 32) + d0;
}

/* One warp's XXH3 of the input, a 1 KiB segment (two 16-byte vectors a lane) a step: lane
 * l's vector of a 512-byte round is bytes 16 (l & 3) .. of stripe l >> 2 (plus 8 in odd rounds),
 * so its keys are fixed and its terms go to accumulators 2 (l & 3) and 2 (l & 3) + 1. Each lane
 * keeps one of the two (the second when lane bit 2 is set): a segment's terms are summed over
 * the eight lanes of the same l & 3 by a shuffle that trades the other accumulator's term with
 * the partner lane (l ^ 4), then two that sum one value, and each lane runs one scramble. The
 * warp encoder and wkw_leaf share it. */
typedef struct {
    uint64_t acc;                      /* accumulator 2 (l & 3) + ((l >> 2) & 1) */
    uint64_t ke0, ke1, ko0, ko1;       /* the lane's keys in even and odd rounds */
    uint64_t ks;                       /* its accumulator's scramble key */
} wkw_hash_t;

__device__ __forceinline__ void wkw_hash_init(wkw_hash_t &h, const uint64_t *sec)
{
    const uint32_t lane = threadIdx.x & 31, c = lane & 3, i0 = 2 * c, sn = lane >> 2;
    const uint32_t hi = (lane >> 2) & 1;
    h.ke0 = sec[sn + i0];
    h.ke1 = sec[sn + i0 + 1];
    h.ko0 = sec[8 + sn + i0];
    h.ko1 = sec[9 + sn + i0];
    h.ks = sec[16 + i0 + hi];
    const uint64_t a0 = c == 0 ? WK_P32_3 : c == 1 ? WK_P64_2 : c == 2 ? WK_P64_4 : WK_P64_5;
    const uint64_t a1 = c == 0 ? WK_P64_1 : c == 1 ? WK_P64_3 : c == 2 ? WK_P32_2 : WK_P32_1;
    h.acc = hi ? a1 : a0;
}

/* Segment s of the input: x0 = the lane's vector 64 s + lane, x1 = 64 s + lane + 32. */
template <uint32_t L>
__device__ __forceinline__ void wkw_hash_segment(wkw_hash_t &h, const uint4 &x0, const uint4 &x1,
                                                 uint32_t s, const uint64_t *sec)
{
    static_assert(L % 1024 == 0 && L > 240, "whole 1 KiB segments, XXH3's long input");
    constexpr uint32_t NSEG = L / 1024;
    const uint32_t lane = threadIdx.x & 31, i0 = 2 * (lane & 3);
    uint64_t a = 0, b = 0, k10 = h.ko0, k11 = h.ko1;
    if (s == NSEG - 1 && lane >= 28) {   /* the input's last stripe: keys from byte 121 */
        k10 = (sec[15 + i0] >> 8) | (sec[16 + i0] << 56);
        k11 = (sec[16 + i0] >> 8) | (sec[17 + i0] << 56);
    }
    wkw_terms(x0, h.ke0, h.ke1, &a, &b);
    wkw_terms(x1, k10, k11, &a, &b);
    const bool hi = (lane & 4) != 0;
    uint64_t t = hi ? b : a;
    t += __shfl_xor_sync(WK_FULL, hi ? a : b, 4);
    t += __shfl_xor_sync(WK_FULL, t, 8);
    t += __shfl_xor_sync(WK_FULL, t, 16);
    h.acc += t;
    if (s + 1 < NSEG)   /* the scramble after every 1 KiB but the last */
        h.acc = (h.acc ^ (h.acc >> 47) ^ h.ks) * WK_P32_1;
}

/* XXH3's merge and avalanche, every lane getting the hash: lane c of each four folds
 * accumulators 2c and 2c + 1 (keys at 11 + 16 c), the second from its partner lane. */
template <uint32_t L>
__device__ __forceinline__ uint64_t wkw_hash_final(const wkw_hash_t &h, const uint64_t *sec)
{
    const uint32_t c = threadIdx.x & 3;
    const bool hi = (threadIdx.x & 4) != 0;
    const uint64_t other = __shfl_xor_sync(WK_FULL, h.acc, 4);
    const uint64_t acc0 = hi ? other : h.acc, acc1 = hi ? h.acc : other;
    const uint64_t mk0 = (sec[1 + 2 * c] >> 24) | (sec[2 + 2 * c] << 40);
    const uint64_t mk1 = (sec[2 + 2 * c] >> 24) | (sec[3 + 2 * c] << 40);
    uint64_t f = wk_fold64(acc0 ^ mk0, acc1 ^ mk1);
    f += __shfl_xor_sync(WK_FULL, f, 1);
    f += __shfl_xor_sync(WK_FULL, f, 2);
    return wk_avalanche3((uint64_t)L * WK_P64_1 + f);
}

/* XXH3_64bits of the L bytes at p (16-byte aligned) by one warp, every lane getting it: the warp
 * encoder's hash without the compare. */
template <uint32_t L>
__device__ __forceinline__ uint64_t wkw_leaf(const uint4 *p, const uint64_t *sec)
{
    constexpr uint32_t NSEG = L / 1024;
    const uint32_t lane = threadIdx.x & 31;
    wkw_hash_t h;
    wkw_hash_init(h, sec);
#pragma unroll 2
    for (uint32_t s = 0; s < NSEG; s++)
        wkw_hash_segment<L>(h, p[64 * s + lane], p[64 * s + lane + 32], s, sec);
    return wkw_hash_final<L>(h, sec);
}

#endif
