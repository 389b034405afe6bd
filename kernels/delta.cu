/* The delta codec of core/delta.h on the GPU: batched encode and apply, and XXH3_64bits on the
 * device (kernels/delta.h says what and why).
 *
 * Two sets of kernels. v1 (wk_delta_encode, wk_delta_apply): one CUDA block of WK_THREADS threads
 * per codec block of WK_DBLK elements, any region (strided, unaligned); each finds its chunk in
 * a block map (one load). v2 (wk2_*): for chunks that are dense with 16-byte aligned starts
 * (what buckets hold): a grid of resident CTAs loops over the blocks, the values in registers
 * (16-byte loads), the next block's loading while the current one is worked on. v1 measured
 * faster for every kind (wk_use_v2 has the numbers), so it is the default; WSYNC_KDELTA_V2=1
 * runs v2 wherever it can (kept, tested, for the next round of tuning).
 *
 * Encode: per block, changed flags -> 32-bit mask words (ballots in v1, shuffles in v2); the
 * words' prefix counts give each changed element its rank in the payload; SPARSE's byte-gap
 * index (format 2) needs, per element, the escapes before it: a gap of 255 or more never lies
 * inside a mask word, so only a word's first element has escapes, and a scan over the words
 * (last changed position: max; escapes: sum) places every index byte. The block's payload
 * offset inside its chunk is the sum of the sizes of the blocks before it: each block publishes
 * its size as soon as it knows it, then warp 0 looks back over its predecessors (decoupled
 * look-back; block numbers drawn in order from a counter, so a block only waits for blocks that
 * running CTAs hold), so that new and old are read once. The leaf XXH3 (v2, full blocks): XXH3's
 * long loop adds per-stripe terms that depend only on data and secret, so each thread makes the
 * terms of its 16 bytes, warp shuffles sum them per accumulator and half segment, and 8 lanes run
 * the 1 KiB segments' scrambles (v1 does the same from the block's values in shared memory).
 * Apply: v2 checks every block's table entry first (wk2_entries), then per block decodes an
 * index stream with a block-wide scan of (position advance, is-element) over its bytes, checks
 * the payload before any write, writes the changed values, and hashes the block from registers
 * (a SAME block) or shared memory (patched values).
 *
 * Traffic, 1 GiB of bf16 in 64 chunks at 1 % changed (the bench of test_delta_kernels): encode
 * reads new and old once (2 GiB) and writes the stream (table 1 MiB, payloads ~1.7 % of 1 GiB:
 * a SPARSE block of k ~ 41 is al8(k + e) + al8(2k) ~ 136 bytes), the leaves and look-back words
 * (1 MiB each); apply with the hash reads the target once (1 GiB), the stream (~18 MiB) and the
 * entry words (2 MiB), and writes the ~41 changed values of each block (each a partial 32-byte
 * sector: ~16 % of the target's sectors touched, merged in L2). The target (issue 17): encode +
 * apply <= 1.5 x reading both versions once (an amax over both, or a D2D copy of one: 0.70 ms on
 * an H100), counting the apply without the receiver's hash (that is the separate check of item
 * 2, one more read of the new values; test_delta_kernels prints both ratios). Floors: encode
 * reads 2 GiB (1.0 x); apply without the hash reads the ~18 MiB stream and writes the changes
 * (~0.05-0.2 x, the writes being partial sectors the L2 must fill); with the hash it reads the
 * target once more (+0.5 x). What limits the kernels: every block needs several CTA barriers
 * (mask words, scan, hash sums, payload), serial stretches (the word scan on one warp, the 4E
 * segment scrambles on 8 lanes, the look-back's wait for the block before), and dependent loads
 * before a block's data can load (v1: the block counter, the block map, the descriptor; apply:
 * the stream length, the table entries, the payload). Measured on an H100 (ncu --set full,
 * 1 GiB bf16 at 1 %): v1 encode 1.55 ms under ncu (1.30 in the bench), 1.40 TB/s, issue-bound
 * (3.1 instructions a cycle, 78 % of issue slots, ALU 60 %): the next gain is fewer
 * instructions per element (compare, mask words, the word scan, hash terms); v1 apply without
 * the hash 0.63 ms, 32 registers with spills (17.8 M local requests) and partial-sector stores;
 * v2 encode 61 % of warp time stalled at barriers with 4 CTAs per SM (540 GB/s).
 */
#include "kernels/common.cuh"
#include "kernels/delta.h"

extern "C" {
#include "core/delta.h"
}

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define WK_DBLK 4096u                  /* elements per codec block: WSYNC_DELTA_BLOCK */
#define WK_EPT (WK_DBLK / WK_THREADS)  /* elements per thread */
#define WK_MWORDS (WK_DBLK / 32)       /* mask words per block */
#define WK_FULL 0xffffffffu
/* Codec blocks resident per SM that the register budget must allow (<= 32 registers): a block's
 * life has stretches without loads in flight (ballots, hash, look-back), so bandwidth comes from
 * many blocks per SM (with bf16, shared memory allows 8 too). */
#define WK_DMIN_BLOCKS 8

static_assert(WK_DBLK == WSYNC_DELTA_BLOCK, "the kernels' block is the format's");
static_assert(WK_THREADS == 256, "the hash and the prefix counts assume 256 threads");

/* Look-back words: status in the top 2 bits, a byte count below. */
#define WK_LB_AGG (UINT64_C(1) << 62)  /* the block's own payload size */
#define WK_LB_INC (UINT64_C(2) << 62)  /* payload bytes up to and including the block */
#define WK_LB_VAL ((UINT64_C(1) << 62) - 1)

/* A chunk as the kernels see it; [nchunks] on the device, grouped by element size. */
typedef struct {
    const unsigned char *a;            /* encode: first new value; apply: the stream */
    unsigned char *b;                  /* encode: first old value; apply: first target value */
    unsigned char *out;                /* encode: the output */
    uint64_t cap;                      /* encode: bytes of out */
    uint64_t pitch, cols, n;           /* elements */
    uint64_t block0;                   /* the chunk's first block in the batch's numbering */
    uint32_t nb;                       /* its blocks */
    uint32_t idx;                      /* its place in the caller's order (results, lengths) */
    uint32_t dense;                    /* rows == 1 or pitch == cols: element e at e * esize */
    uint32_t fast;                     /* the v2 kernels take it: dense, 16-byte aligned */
} wk_dchunk_t;

/* ------------------------------------------------------------------------------------------ */
/* XXH3_64bits, seed 0, default secret: every length class                                     */
/* ------------------------------------------------------------------------------------------ */

#ifndef WK_XXH_FN
#define WK_XXH_FN __device__ __forceinline__
#endif

/* The default secret of XXH3 (xxhash.h's XXH3_kSecret, the specification's constant). Kernels
 * copy it to shared memory: lanes read it at different offsets. */
__constant__ unsigned char wk_xxh_secret[192] = {
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
__device__ uint64_t wk_xxh3_long(const unsigned char *p, uint64_t len, const unsigned char *s,
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
__device__ uint64_t wk_xxh3(const unsigned char *p, uint64_t len, const unsigned char *s,
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
/* Shared pieces of the codec kernels                                                          */
/* ------------------------------------------------------------------------------------------ */

__host__ __device__ __forceinline__ uint64_t wk_al8(uint64_t x) { return (x + 7) & ~UINT64_C(7); }

/* wsync_delta_block_bytes: the payload of a block of len elements with k changed and e escape
 * bytes in its SPARSE index, in the mode the format picks (the smallest; the lower mode on a
 * tie). */
__host__ __device__ __forceinline__ uint64_t wk_bbytes(uint32_t len, uint32_t k, uint32_t e,
                                                      uint32_t esize, uint32_t *mode)
{
    if (k == 0) {
        *mode = WSYNC_DELTA_SAME;
        return 0;
    }
    uint64_t v = wk_al8((uint64_t)k * esize);
    uint64_t best = wk_al8((uint64_t)k + e) + v, bm = wk_al8((len + 7) / 8) + v;
    uint64_t pl = wk_al8((uint64_t)len * esize);
    *mode = WSYNC_DELTA_SPARSE;
    if (bm < best) {
        best = bm;
        *mode = WSYNC_DELTA_BITMAP;
    }
    if (pl < best) {
        best = pl;
        *mode = WSYNC_DELTA_PLAIN;
    }
    return best;
}

/* The payload bytes of a block in a given mode (what its table entry says). */
__host__ __device__ __forceinline__ uint64_t wk_msize(uint32_t mode, uint32_t len, uint32_t k,
                                                     uint32_t e, uint32_t esize)
{
    uint64_t v = wk_al8((uint64_t)k * esize);
    return mode == WSYNC_DELTA_SAME     ? 0
         : mode == WSYNC_DELTA_SPARSE   ? wk_al8((uint64_t)k + e) + v
         : mode == WSYNC_DELTA_BITMAP   ? wk_al8((len + 7) / 8) + v
                                        : wk_al8((uint64_t)len * esize);
}

/* Byte offset of element e of a chunk from its first element. */
__device__ __forceinline__ uint64_t wk_eoff(const wk_dchunk_t &d, uint64_t e, uint32_t esize)
{
    if (d.dense)
        return e * esize;
    uint64_t r, c;
    if (((e | d.cols) >> 32) == 0) {
        r = (uint32_t)e / (uint32_t)d.cols;
        c = (uint32_t)e - (uint32_t)r * (uint32_t)d.cols;
    } else {
        r = e / d.cols;
        c = e - r * d.cols;
    }
    return (r * d.pitch + c) * esize;
}

/* The chunk holding batch block g, among chunks [c0, c1) ordered by block0. */
__device__ __forceinline__ uint32_t wk_find_chunk(const wk_dchunk_t *ch, uint32_t c0, uint32_t c1,
                                                  uint64_t g)
{
    uint32_t lo = c0, hi = c1;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (ch[mid].block0 <= g)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The mask words' scan, by warp 0 (4 words a lane): wpre[q] = changed elements before word q;
 * wesc[q] = (escape bytes of the SPARSE index up to and including word q's) << 8 | word q's
 * own; wprev[q] = the last changed position before word q (-1: none). A gap of 255 or more
 * positions never lies inside a word, so only a word's first changed element has escapes: its
 * gap is from wprev. *total gets k, *esc e. Followed by a __syncthreads in the caller. */
__device__ __forceinline__ void wk_mask_scan(const uint32_t *mask, uint32_t *wpre, uint32_t *wesc,
                                             int16_t *wprev, uint32_t *total, uint32_t *esc)
{
    if (threadIdx.x >= 32)
        return;
    const int l = threadIdx.x;
    uint32_t m[4], s = 0;
    int last = -1;
    for (int i = 0; i < 4; i++) {
        m[i] = mask[4 * l + i];
        s += (uint32_t)__popc(m[i]);
        if (m[i] != 0)
            last = (4 * l + i) * 32 + 31 - __clz((int)m[i]);
    }
    /* inclusive scans over the lanes: counts (sum), last changed position (max) */
    uint32_t inc = s;
    int lmax = last;
    for (int d = 1; d < 32; d *= 2) {
        uint32_t o = __shfl_up_sync(WK_FULL, inc, d);
        int ol = __shfl_up_sync(WK_FULL, lmax, d);
        if (l >= d) {
            inc += o;
            lmax = ol > lmax ? ol : lmax;
        }
    }
    int prev = __shfl_up_sync(WK_FULL, lmax, 1);
    if (l == 0)
        prev = -1;
    uint32_t ew[4], es = 0;
    int pv[4];
    for (int i = 0; i < 4; i++) {
        pv[i] = prev;
        ew[i] = 0;
        if (m[i] != 0) {
            int q = 4 * l + i;
            ew[i] = (uint32_t)(q * 32 + __ffs((int)m[i]) - 1 - prev - 1) / 255u;
            prev = q * 32 + 31 - __clz((int)m[i]);
        }
        es += ew[i];
    }
    uint32_t einc = es;
    for (int d = 1; d < 32; d *= 2) {
        uint32_t o = __shfl_up_sync(WK_FULL, einc, d);
        if (l >= d)
            einc += o;
    }
    uint32_t ex = inc - s, ee = einc - es;
    for (int i = 0; i < 4; i++) {
        wpre[4 * l + i] = ex;
        ex += (uint32_t)__popc(m[i]);
        ee += ew[i];
        wesc[4 * l + i] = ee << 8 | ew[i];
        wprev[4 * l + i] = (int16_t)pv[i];
    }
    if (l == 31) {
        *total = inc;
        *esc = einc;
    }
}

/* Rank of changed element i among the block's changed elements. */
__device__ __forceinline__ uint32_t wk_rank(const uint32_t *mask, const uint32_t *wpre, uint32_t i)
{
    return wpre[i >> 5] + (uint32_t)__popc(mask[i >> 5] & ((1u << (i & 31)) - 1u));
}

/* Element bits of E bytes: an unsigned type to compare and move them. */
template <int E> struct wk_elem;
template <> struct wk_elem<1> { typedef uint8_t t; };
template <> struct wk_elem<2> { typedef uint16_t t; };
template <> struct wk_elem<4> { typedef uint32_t t; };
template <> struct wk_elem<8> { typedef unsigned long long t; };

/* Load the block's values [first, first + len) of a chunk region starting at `base` into
 * shared `sv`, and (when `cmp`) set flag[i] when they differ from the same elements at `other`.
 * 16-byte loads when the region is dense and both starts are 16-byte aligned. */
template <int E, bool CMP>
__device__ __forceinline__ void wk_load_block(const wk_dchunk_t &d, const unsigned char *base,
                                              const unsigned char *other, uint64_t first,
                                              uint32_t len, unsigned char *sv, uint8_t *flag)
{
    typedef typename wk_elem<E>::t el;
    const unsigned char *a = base + (d.dense ? first * E : 0);
    const unsigned char *o = other != NULL ? other + (d.dense ? first * E : 0) : NULL;
    uint32_t done = 0;
    if (d.dense && ((uintptr_t)a & 15) == 0 && (!CMP || ((uintptr_t)o & 15) == 0)) {
        constexpr uint32_t VE = 16 / E;
        const uint32_t nvec = len / VE;
        for (uint32_t v = threadIdx.x; v < nvec; v += WK_THREADS) {
            uint4 x = reinterpret_cast<const uint4 *>(a)[v];
            reinterpret_cast<uint4 *>(sv)[v] = x;
            if constexpr (CMP) {
                uint4 y = reinterpret_cast<const uint4 *>(o)[v];
                const el *xe = reinterpret_cast<const el *>(&x), *ye = reinterpret_cast<const el *>(&y);
                uint8_t f[VE];
#pragma unroll
                for (uint32_t e = 0; e < VE; e++)
                    f[e] = xe[e] != ye[e];
#pragma unroll
                for (uint32_t e = 0; e < VE; e++)
                    flag[v * VE + e] = f[e];
            }
        }
        done = nvec * VE;
    }
    for (uint32_t i = done + threadIdx.x; i < len; i += WK_THREADS) {
        uint64_t off = d.dense ? (uint64_t)i * E : wk_eoff(d, first + i, E);
        el x = *reinterpret_cast<const el *>((d.dense ? a : base) + off);
        reinterpret_cast<el *>(sv)[i] = x;
        if constexpr (CMP) {
            el y = *reinterpret_cast<const el *>((d.dense ? o : other) + off);
            flag[i] = x != y;
        }
    }
}

/* Store the block's values from shared `sv` to the region at `base`: all len of them (all), or
 * those whose mask bit is set. */
template <int E>
__device__ __forceinline__ void wk_store_block(const wk_dchunk_t &d, unsigned char *base,
                                               uint64_t first, uint32_t len,
                                               const unsigned char *sv, const uint32_t *mask,
                                               bool all)
{
    typedef typename wk_elem<E>::t el;
    unsigned char *a = base + (d.dense ? first * E : 0);
    uint32_t done = 0;
    if (all && d.dense && ((uintptr_t)a & 15) == 0) {
        const uint32_t nvec = len / (16 / E);
        for (uint32_t v = threadIdx.x; v < nvec; v += WK_THREADS)
            reinterpret_cast<uint4 *>(a)[v] = reinterpret_cast<const uint4 *>(sv)[v];
        done = nvec * (16 / E);
    }
    for (uint32_t i = done + threadIdx.x; i < len; i += WK_THREADS) {
        if (!all && !((mask[i >> 5] >> (i & 31)) & 1u))
            continue;
        uint64_t off = d.dense ? (uint64_t)i * E : wk_eoff(d, first + i, E);
        *reinterpret_cast<el *>((d.dense ? a : base) + off) = reinterpret_cast<const el *>(sv)[i];
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Vectors in registers, the register XXH3 of a full block (both kernel sets)                   */
/* ------------------------------------------------------------------------------------------ */

/* CTAs a v2 kernel keeps per SM (its register budget: 64 a thread). Each CTA loops over codec
 * blocks: the chunk lookups are amortized, and the next block's values are loaded into
 * registers while the current one is scanned, hashed and written (bf16 and bytes; wider
 * elements load at the top of each iteration). */
#define WK2_MIN_BLOCKS 4
/* v2 encode: 4 CTAs per SM with the register prefetch (3.36 ms on the 1 GiB bench, 61 % of warp
 * time stalled at barriers); 6 CTAs per SM without it measured worse (5.93 ms: 40 registers,
 * spills, and each block's loads exposed). */
#define WK2E_MIN_BLOCKS 4
#define WK2E_PREFETCH 1

/* Element e of a 16-byte vector of E-byte elements. */
template <int E>
__device__ __forceinline__ unsigned long long wk_vget(const uint4 &x, int e)
{
    if constexpr (E == 8) {
        return e == 0 ? ((unsigned long long)x.y << 32 | x.x) : ((unsigned long long)x.w << 32 | x.z);
    } else {
        const int w = (e * E) / 4, sh = ((e * E) % 4) * 8;
        const uint32_t word = w == 0 ? x.x : w == 1 ? x.y : w == 2 ? x.z : x.w;
        if constexpr (E == 4)
            return word;
        else
            return (word >> sh) & ((1u << (8 * E)) - 1u);
    }
}

/* Bit e set when element e of a and b differ. */
template <int E>
__device__ __forceinline__ uint32_t wk_vdiff(const uint4 &a, const uint4 &b)
{
    uint32_t bits = 0;
#pragma unroll
    for (int e = 0; e < 16 / E; e++)
        bits |= (uint32_t)(wk_vget<E>(a, e) != wk_vget<E>(b, e)) << e;
    return bits;
}

/* Vector v's bits into the mask words (every lane of the warp calls it, with v = threadIdx.x +
 * WK_THREADS * it: the lanes of a mask word are neighbours). */
template <int E>
__device__ __forceinline__ void wk_put_bits(uint32_t bits, uint32_t v, uint32_t *mask)
{
    constexpr uint32_t VE = 16 / E, G = 32 / VE;
    uint32_t x = bits << ((v % G) * VE);
#pragma unroll
    for (uint32_t o = 1; o < G; o *= 2)
        x |= __shfl_xor_sync(WK_FULL, x, o);
    if (v % G == 0)
        mask[v / G] = x;
}

/* Vector v of a block of len elements starting at p (16-byte aligned): elements at or past len
 * read as 0 (so old and new agree there, and a tail's padding is zero). */
template <int E>
__device__ __forceinline__ uint4 wk_vload(const unsigned char *p, uint32_t v, uint32_t len)
{
    typedef typename wk_elem<E>::t el;
    constexpr uint32_t VE = 16 / E;
    if ((v + 1) * VE <= len)
        return reinterpret_cast<const uint4 *>(p)[v];
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (uint32_t e = 0; e < VE; e++) {
        if (v * VE + e < len) {
            const unsigned long long x = reinterpret_cast<const el *>(p)[v * VE + e];
            if constexpr (E == 8) {
                w[2 * e] = (uint32_t)x;
                w[2 * e + 1] = (uint32_t)(x >> 32);
            } else {
                w[(e * E) / 4] |= (uint32_t)x << (((e * E) % 4) * 8);
            }
        }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* The block's values in registers: vector tid + WK_THREADS * it in x[it]. */
template <int E>
__device__ __forceinline__ void wk_vload_block(const unsigned char *p, uint32_t len, uint4 (&x)[E])
{
#pragma unroll
    for (int it = 0; it < E; it++)
        x[it] = wk_vload<E>(p, threadIdx.x + WK_THREADS * it, len);
}

/* XXH3 of a full block (WK_DBLK * E bytes, a multiple of 1024) from the values in registers,
 * part 1 (every thread): XXH3's long loop adds, per 64-byte stripe, terms that depend only on the
 * data and the secret; each thread makes the terms of its 16 bytes (two of the stripe's eight
 * lanes), a warp sums them per accumulator over its 512 bytes (half a 1 KiB segment), and
 * hx[half segment * 8 + accumulator] gets the sum. The input's last 64 bytes are its last
 * stripe, keyed at secret byte 121 (the segment before it has 15 ordinary stripes). */
template <int E>
__device__ __forceinline__ void wk_hash_terms(const uint4 (&x)[E], const uint64_t *sec, uint64_t *hx)
{
    constexpr uint32_t L = WK_DBLK * E;
    const uint32_t lane = threadIdx.x & 31;
#pragma unroll
    for (int it = 0; it < E; it++) {
        const uint32_t v = threadIdx.x + WK_THREADS * it, o = 16 * v;
        const uint32_t n = (o >> 6) & 15, i0 = (o >> 3) & 7;
        uint64_t k0, k1;
        if (o >= L - 64) {
            k0 = (sec[15 + i0] >> 8) | (sec[16 + i0] << 56);
            k1 = (sec[16 + i0] >> 8) | (sec[17 + i0] << 56);
        } else {
            k0 = sec[n + i0];
            k1 = sec[n + i0 + 1];
        }
        const uint64_t d0 = (uint64_t)x[it].y << 32 | x[it].x, d1 = (uint64_t)x[it].w << 32 | x[it].z;
        const uint64_t y0 = d0 ^ k0, y1 = d1 ^ k1;
        uint64_t a = (y0 & 0xffffffffu) * (y0 >> 32) + d1;   /* accumulator i0 */
        uint64_t b = (y1 & 0xffffffffu) * (y1 >> 32) + d0;   /* accumulator i0 + 1 */
#pragma unroll
        for (int s = 4; s < 32; s *= 2) {
            a += __shfl_xor_sync(WK_FULL, a, s);
            b += __shfl_xor_sync(WK_FULL, b, s);
        }
        if (lane < 4) {
            hx[(v >> 5) * 8 + 2 * lane] = a;
            hx[(v >> 5) * 8 + 2 * lane + 1] = b;
        }
    }
}

/* Part 2, by one whole warp after a __syncthreads: lanes 0..7 run the accumulators through the
 * segments (a scramble after each but the last) and lane 0 gets XXH3_64bits. */
template <int E>
__device__ __forceinline__ uint64_t wk_hash_finish(const uint64_t *hx, const uint64_t *sec)
{
    constexpr uint32_t NSEG = WK_DBLK * E / 1024;
    const uint32_t i = threadIdx.x & 7;   /* lanes 8..31 repeat lanes 0..7 */
    const unsigned char *secret = reinterpret_cast<const unsigned char *>(sec);
    uint64_t acc = i == 0 ? WK_P32_3 : i == 1 ? WK_P64_1 : i == 2 ? WK_P64_2 : i == 3 ? WK_P64_3
                 : i == 4 ? WK_P64_4 : i == 5 ? WK_P32_2 : i == 6 ? WK_P64_5 : WK_P32_1;
    for (uint32_t s = 0; s < NSEG; s++) {
        acc += hx[16 * s + i] + hx[16 * s + 8 + i];
        if (s + 1 < NSEG) {
            acc ^= acc >> 47;
            acc ^= sec[16 + i];
            acc *= WK_P32_1;
        }
    }
    uint64_t h = (uint64_t)WK_DBLK * E * WK_P64_1;
#pragma unroll
    for (int m = 0; m < 4; m++) {
        const uint64_t a0 = __shfl_sync(WK_FULL, acc, 2 * m), a1 = __shfl_sync(WK_FULL, acc, 2 * m + 1);
        h += wk_fold64(a0 ^ wk_rd64(secret + 11 + 16 * m), a1 ^ wk_rd64(secret + 19 + 16 * m));
    }
    return wk_avalanche3(h);
}

/* ------------------------------------------------------------------------------------------ */
/* Encode                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* Blocks [g0, g0 + gridDim.x) of chunks [c0, c1), all of element size E. Shared memory
 * (dynamic): the new values [WK_DBLK * E], then the payload being built [WK_DBLK * E] (the
 * changed flags before it). */
template <int E>
__global__ void __launch_bounds__(WK_THREADS, WK_DMIN_BLOCKS)
wk_delta_encode(const wk_dchunk_t *__restrict__ ch, const uint32_t *__restrict__ bmap, uint64_t g0,
                unsigned long long *status, unsigned int *counter, uint64_t *leaves,
                wsync_kdelta_result_t *res, int update_old)
{
    extern __shared__ uint4 wk_dyn[];
    unsigned char *snew = reinterpret_cast<unsigned char *>(wk_dyn);
    unsigned char *stage = snew + WK_DBLK * E;
    __shared__ uint32_t mask[WK_MWORDS], wpre[WK_MWORDS], wesc[WK_MWORDS];
    __shared__ int16_t wprev[WK_MWORDS];
    __shared__ uint64_t sec[24], hsum[64 * E > WK_THREADS ? 64 * E : WK_THREADS];
    __shared__ uint64_t sh_g, sh_off, sh_leaf;
    __shared__ uint32_t sh_c, sh_k, sh_e;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    wk_secret_load(sec);
    if (tid == 0) {
        /* blocks numbered in the order they start: the look-back waits only for running ones */
        uint64_t g = g0 + atomicAdd(counter, 1u);
        sh_g = g;
        sh_c = bmap[g];
    }
    __syncthreads();
    const uint64_t g = sh_g;
    const wk_dchunk_t d = ch[sh_c];
    const uint32_t j = (uint32_t)(g - d.block0);
    const uint64_t first = (uint64_t)j * WK_DBLK;
    const uint32_t len = (uint32_t)(d.n - first < WK_DBLK ? d.n - first : WK_DBLK);
    const unsigned char *secret = reinterpret_cast<const unsigned char *>(sec);

    /* 1. new values into shared memory; a full block of a dense chunk with 16-byte aligned
     * starts: 16-byte loads, compared in registers, straight to mask words (shuffles); other
     * blocks: a changed flag per element, then ballots */
    const bool vec = d.dense && len == WK_DBLK &&
                     ((((uintptr_t)d.a | (uintptr_t)d.b) + first * E) & 15) == 0;
    if (vec) {
#pragma unroll
        for (int it = 0; it < E; it++) {
            const uint32_t v = tid + WK_THREADS * it;
            const uint4 x = reinterpret_cast<const uint4 *>(d.a + first * E)[v];
            const uint4 y = reinterpret_cast<const uint4 *>(d.b + first * E)[v];
            reinterpret_cast<uint4 *>(snew)[v] = x;
            wk_put_bits<E>(wk_vdiff<E>(x, y), v, mask);
        }
    } else {
        wk_load_block<E, true>(d, d.a, d.b, first, len, snew, stage);
    }
    if (tid == 0)
        for (uint64_t b = (uint64_t)len * E; b < wk_al8((uint64_t)len * E); b++)
            snew[b] = 0;   /* a PLAIN tail block's padding */
    __syncthreads();

    /* 2. flags -> mask words (ballots), their prefix counts and escapes, k and e */
    if (!vec) {
        for (uint32_t q = warp; q < WK_MWORDS; q += WK_THREADS / 32) {
            uint32_t i = q * 32 + lane;
            uint32_t m = __ballot_sync(WK_FULL, i < len && stage[i] != 0);
            if (lane == 0)
                mask[q] = m;
        }
        __syncthreads();
    }
    wk_mask_scan(mask, wpre, wesc, wprev, &sh_k, &sh_e);
    __syncthreads();
    const uint32_t k = sh_k;
    uint32_t mode;
    const uint64_t size = wk_bbytes(len, k, sh_e, E, &mode);
    const uint32_t e = mode == WSYNC_DELTA_SPARSE ? sh_e : 0;   /* the table's e */

    /* 3. publish the size at once (the blocks after this one are waiting for it), hash the block
     * meanwhile, then find the offset: the sizes of the blocks before this one in its chunk */
    if (tid == 0)
        atomicExch(&status[g], (unsigned long long)((j == 0 ? WK_LB_INC : WK_LB_AGG) | size));
    if (len == WK_DBLK) {   /* the stripe terms by every thread, one warp's scrambles */
        uint4 x[E];
#pragma unroll
        for (int it = 0; it < E; it++)
            x[it] = reinterpret_cast<const uint4 *>(snew)[tid + WK_THREADS * it];
        wk_hash_terms<E>(x, sec, hsum);
        __syncthreads();
        if (warp == 1) {
            const uint64_t h = wk_hash_finish<E>(hsum, sec);
            if (lane == 0)
                sh_leaf = h;
        }
    } else {
        const uint64_t h = wk_xxh3(snew, (uint64_t)len * E, secret, hsum);
        if (tid == 0)
            sh_leaf = h;
    }
    if (warp == 0 && j > 0) {
        uint64_t excl = 0;
        int64_t p = (int64_t)j - 1;   /* the nearest predecessor not yet summed */
        for (;;) {
            int64_t q = p - lane;
            uint64_t w = q >= 0 ? *(volatile unsigned long long *)&status[d.block0 + (uint64_t)q]
                                : WK_LB_INC;   /* before the chunk: nothing */
            uint32_t st = (uint32_t)(w >> 62);
            uint32_t xm = __ballot_sync(WK_FULL, st == 0), im = __ballot_sync(WK_FULL, st == 2);
            uint32_t lowi = im ? (uint32_t)__ffs((int)im) - 1 : 32;
            uint32_t lowx = xm ? (uint32_t)__ffs((int)xm) - 1 : 32;
            if (lowx < lowi) {   /* a nearer block has not published yet */
                __nanosleep(64);
                continue;
            }
            uint64_t v = (uint32_t)lane <= lowi ? (w & WK_LB_VAL) : 0;
            for (int o = 16; o > 0; o /= 2)
                v += __shfl_xor_sync(WK_FULL, v, o);
            excl += v;
            if (lowi < 32)
                break;
            p -= 32;
        }
        if (lane == 0) {
            atomicExch(&status[g], (unsigned long long)(WK_LB_INC | (excl + size)));
            sh_off = excl;
        }
    } else if (tid == 0) {
        sh_off = 0;
    }
    __syncthreads();
    const uint64_t off = sh_off;
    const uint64_t tbl = 16 + 8 * (uint64_t)d.nb, pos = tbl + off;

    /* 4. table entry, header, results */
    if (tid == 0) {
        if (16 + 8 * ((uint64_t)j + 1) <= d.cap)
            reinterpret_cast<uint64_t *>(d.out + 16)[j] =
                off | ((uint64_t)((mode << 30) | (e << 16) | k) << 32);
        if (j == 0 && d.cap >= 16) {
            reinterpret_cast<uint64_t *>(d.out)[0] =
                WSYNC_DELTA_MAGIC | ((uint64_t)WSYNC_DELTA_FORMAT << 32) | ((uint64_t)E << 40);
            reinterpret_cast<uint64_t *>(d.out)[1] = d.n;
        }
        leaves[g] = sh_leaf;
        if (k > 0)
            atomicAdd(reinterpret_cast<unsigned long long *>(&res[d.idx].changed),
                      (unsigned long long)k);
        if (j == d.nb - 1)
            res[d.idx].len = pos + size;
    }

    /* 5. the payload, built in shared memory and copied out in 8-byte words */
    if (size > 0 && pos + size <= d.cap) {
        const unsigned char *src = snew;
        if (mode != WSYNC_DELTA_PLAIN) {
            const uint64_t hdr = mode == WSYNC_DELTA_SPARSE ? wk_al8((uint64_t)k + e)
                                                            : wk_al8((len + 7) / 8);
            if (tid == 0) {   /* padding words; the values overwrite their first bytes */
                reinterpret_cast<uint64_t *>(stage)[hdr / 8 - 1] = 0;
                reinterpret_cast<uint64_t *>(stage)[(size - 8) / 8] = 0;
            }
            __syncthreads();
            if (mode == WSYNC_DELTA_BITMAP)   /* bits past len are 0 in the mask */
                for (uint32_t w = tid; w < hdr / 4; w += WK_THREADS)
                    reinterpret_cast<uint32_t *>(stage)[w] = mask[w];
            for (uint32_t i = tid; i < len; i += WK_THREADS) {
                if (!((mask[i >> 5] >> (i & 31)) & 1u))
                    continue;
                const uint32_t q = i >> 5, below = mask[q] & ((1u << (i & 31)) - 1u);
                const uint32_t r = wpre[q] + (uint32_t)__popc(below);
                if (mode == WSYNC_DELTA_SPARSE) {
                    /* the gap byte of the element of rank r sits after r bytes of the elements
                     * before it and the escapes up to its own */
                    const uint32_t at = r + (wesc[q] >> 8);
                    uint32_t gap;
                    if (below != 0) {
                        gap = (i & 31) - (32 - (uint32_t)__clz((int)below));
                    } else {
                        const uint32_t ew = wesc[q] & 0xff;
                        gap = (uint32_t)((int)i - wprev[q] - 1);
                        for (uint32_t x = 1; x <= ew; x++)
                            stage[at - x] = 0xff;
                    }
                    stage[at] = (unsigned char)(gap % 255u);
                }
                typedef typename wk_elem<E>::t el;
                *reinterpret_cast<el *>(stage + hdr + (uint64_t)r * E) =
                    reinterpret_cast<const el *>(snew)[i];
            }
            __syncthreads();
            src = stage;
        }
        uint64_t *to = reinterpret_cast<uint64_t *>(d.out + pos);
        for (uint32_t w = tid; w < size / 8; w += WK_THREADS)
            to[w] = reinterpret_cast<const uint64_t *>(src)[w];
    }

    /* 6. the sender's baseline takes the new values */
    if (update_old && k > 0)
        wk_store_block<E>(d, d.b, first, len, snew, mask, false);
}

/* ------------------------------------------------------------------------------------------ */
/* Apply                                                                                        */
/* ------------------------------------------------------------------------------------------ */

/* Check the header and block j's table entry; 0 or a fault. *mode, *k, *e, *off, *size of the
 * block on success. One thread. A BITMAP entry passes here when the format could pick BITMAP
 * for it: its choice depends on the escapes its positions would need as SPARSE, which only its
 * bitmap tells (the caller checks that). */
__device__ uint32_t wk_check_entry(const unsigned char *enc, uint64_t elen, const wk_dchunk_t &d,
                                   uint32_t j, uint32_t len, uint32_t E, uint32_t *mode,
                                   uint32_t *k, uint32_t *e, uint64_t *off, uint64_t *size)
{
    const uint64_t tbl = 16 + 8 * (uint64_t)d.nb;
    if (elen < tbl)
        return WSYNC_KDELTA_FAULT_HEADER;
    /* header, entry and the entry before it all lie before tbl: loaded together */
    const uint64_t h = wk_rd64(enc), hn = wk_rd64(enc + 8);
    const uint64_t w = wk_rd64(enc + 16 + 8 * (uint64_t)j);
    const uint64_t pw = j > 0 ? wk_rd64(enc + 16 + 8 * ((uint64_t)j - 1)) : 0;
    if ((uint32_t)h != WSYNC_DELTA_MAGIC || ((h >> 32) & 0xff) != WSYNC_DELTA_FORMAT ||
        ((h >> 40) & 0xff) != E || (h >> 48) != 0 || hn != d.n)
        return WSYNC_KDELTA_FAULT_HEADER;
    const uint64_t area = elen - tbl;
    const uint32_t m = (uint32_t)(w >> 62), kk = (uint32_t)(w >> 32) & 0xffffu;
    const uint32_t ee = (uint32_t)(w >> 48) & 0x3fffu;
    const uint64_t o = (uint32_t)w;
    uint32_t want;
    if (kk > len || (m != WSYNC_DELTA_SPARSE && ee != 0))
        return WSYNC_KDELTA_FAULT_TABLE;
    wk_bbytes(len, kk, ee, E, &want);
    if (m != want && !(m == WSYNC_DELTA_BITMAP && want == WSYNC_DELTA_SPARSE))
        return WSYNC_KDELTA_FAULT_TABLE;
    const uint64_t sz = wk_msize(m, len, kk, ee, E);
    if ((o & 7) != 0 || o + sz > area)
        return WSYNC_KDELTA_FAULT_TABLE;
    if (j == 0) {
        if (o != 0)
            return WSYNC_KDELTA_FAULT_TABLE;
    } else {   /* right after the block before it (which checks its own entry) */
        const uint32_t pk = (uint32_t)(pw >> 32) & 0xffffu, pe = (uint32_t)(pw >> 48) & 0x3fffu;
        if ((uint64_t)(uint32_t)pw + wk_msize((uint32_t)(pw >> 62), WK_DBLK, pk, pe, E) != o)
            return WSYNC_KDELTA_FAULT_TABLE;
    }
    if (j == d.nb - 1 && o + sz != area)
        return WSYNC_KDELTA_FAULT_TABLE;   /* bytes after the last payload */
    *mode = m;
    *k = kk;
    *e = ee;
    *off = o;
    *size = sz;
    return 0;
}

/* Exclusive block-wide prefix sums of two counts (every thread calls it): *ea, *eb get the sums
 * over the threads before this one, *ta, *tb the totals. red: 16 words of shared memory. */
__device__ __forceinline__ void wk_block_scan2(uint32_t a, uint32_t b, uint32_t *red, uint32_t *ea,
                                               uint32_t *eb, uint32_t *ta, uint32_t *tb)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t ia = a, ib = b;
    for (int d = 1; d < 32; d *= 2) {
        uint32_t oa = __shfl_up_sync(WK_FULL, ia, d), ob = __shfl_up_sync(WK_FULL, ib, d);
        if (lane >= d) {
            ia += oa;
            ib += ob;
        }
    }
    if (lane == 31) {
        red[warp] = ia;
        red[8 + warp] = ib;
    }
    __syncthreads();
    uint32_t pa = 0, pb = 0, sa = 0, sb = 0;
    for (int w = 0; w < WK_THREADS / 32; w++) {
        if (w < warp) {
            pa += red[w];
            pb += red[8 + w];
        }
        sa += red[w];
        sb += red[8 + w];
    }
    *ea = pa + ia - a;
    *eb = pb + ib - b;
    *ta = sa;
    *tb = sb;
}

/* Blocks [g0, g0 + gridDim.x) of chunks [c0, c1), element size E: check, apply, hash. Shared
 * memory (dynamic): the block's values [WK_DBLK * E] (with hash). */
template <int E>
__global__ void __launch_bounds__(WK_THREADS, WK_DMIN_BLOCKS)
wk_delta_apply(const wk_dchunk_t *__restrict__ ch, const uint32_t *__restrict__ bmap, uint64_t g0,
               const uint64_t *lens, uint64_t *leaves, wsync_kdelta_result_t *res, int hash)
{
    typedef typename wk_elem<E>::t el;
    extern __shared__ uint4 wk_dyn[];
    unsigned char *sv = reinterpret_cast<unsigned char *>(wk_dyn);
    __shared__ uint32_t mask[WK_MWORDS], wpre[WK_MWORDS], wesc[WK_MWORDS], red[16];
    __shared__ int16_t wprev[WK_MWORDS];
    __shared__ uint16_t posv[512];   /* SPARSE: the changed positions, in index order (a SPARSE
                                        block's k + e <= 512: its index beats a bitmap) */
    __shared__ uint64_t sec[24], hsum[64 * E > WK_THREADS ? 64 * E : WK_THREADS];
    __shared__ uint64_t sh_off, sh_size;
    __shared__ uint32_t sh_mode, sh_k, sh_e, sh_fault, sh_bad, sh_total, sh_etrue;
    const int tid = threadIdx.x;
    const uint64_t g = g0 + blockIdx.x;

    wk_secret_load(sec);
    const wk_dchunk_t d = ch[bmap[g]];
    const uint32_t j = (uint32_t)(g - d.block0);
    const uint64_t first = (uint64_t)j * WK_DBLK;
    const uint32_t len = (uint32_t)(d.n - first < WK_DBLK ? d.n - first : WK_DBLK);
    /* the target's values are read whatever the stream holds (reading is harmless): their loads
     * are in flight while thread 0 walks the header and the table entry */
    if (hash)
        wk_load_block<E, false>(d, d.b, NULL, first, len, sv, NULL);
    if (tid == 0) {
        sh_fault = wk_check_entry(d.a, lens[d.idx], d, j, len, E, &sh_mode, &sh_k, &sh_e,
                                  &sh_off, &sh_size);
        sh_bad = 0;
    }
    __syncthreads();
    if (sh_fault != 0) {
        if (tid == 0)
            atomicMin(reinterpret_cast<unsigned long long *>(&res[d.idx].fault),
                      (unsigned long long)(((uint64_t)j << 8) | sh_fault));
        return;
    }
    const uint32_t mode = sh_mode, k = sh_k;
    const uint64_t size = sh_size;
    if (mode == WSYNC_DELTA_SAME && !hash)
        return;
    const unsigned char *P = d.a + 16 + 8 * (uint64_t)d.nb + sh_off;   /* 8-byte aligned */

    /* 1. the payload's content, before anything is written */
    uint64_t hdr = 0;
    if (mode == WSYNC_DELTA_SPARSE) {
        /* the index stream: byte b advances the position by 255 (b = 0xFF) or b + 1, and b <
         * 0xFF marks an element; each thread scans a run of bytes, a block-wide scan gives each
         * run its starting position and value slot */
        const uint32_t nbytes = k + sh_e, per = (nbytes + WK_THREADS - 1) / WK_THREADS;
        const uint32_t b0 = tid * per < nbytes ? tid * per : nbytes;
        const uint32_t b1 = b0 + per < nbytes ? b0 + per : nbytes;
        hdr = wk_al8(nbytes);
        uint32_t adv = 0, cnt = 0;
        for (uint32_t b = b0; b < b1; b++) {
            const uint32_t x = P[b];
            adv += x == 0xff ? 255u : x + 1;
            cnt += x != 0xff;
        }
        uint32_t adv0, cnt0, advt, cntt;
        wk_block_scan2(adv, cnt, red, &adv0, &cnt0, &advt, &cntt);
        /* exactly k elements (so e escapes), no trailing escape; a block-uniform decision */
        if (cntt != k || P[nbytes - 1] == 0xff) {
            if (tid == 0)
                sh_bad = 1;
        } else {
            for (uint32_t b = b0; b < b1; b++) {
                const uint32_t x = P[b];
                adv0 += x == 0xff ? 255u : x + 1;
                if (x != 0xff) {
                    if (adv0 - 1 >= len)
                        sh_bad = 1;
                    else
                        posv[cnt0] = (uint16_t)(adv0 - 1);
                    cnt0++;
                }
            }
        }
        for (uint64_t b = nbytes + tid; b < hdr; b += WK_THREADS)
            if (P[b] != 0)
                sh_bad = 1;
    } else if (mode == WSYNC_DELTA_BITMAP) {
        hdr = wk_al8((len + 7) / 8);
        for (uint32_t w = tid; w < WK_MWORDS; w += WK_THREADS) {
            uint32_t m = w < hdr / 4 ? reinterpret_cast<const uint32_t *>(P)[w] : 0;
            uint32_t lo = w * 32;   /* bits at or past len must be 0 */
            uint32_t past = lo >= len ? WK_FULL : len - lo >= 32 ? 0u : ~((1u << (len - lo)) - 1u);
            if (m & past)
                sh_bad = 1;
            mask[w] = m;
        }
    }
    {   /* padding after the values (PLAIN: after the len values) */
        uint64_t vend = mode == WSYNC_DELTA_PLAIN ? (uint64_t)len * E : hdr + (uint64_t)k * E;
        for (uint64_t b = vend + tid; b < size; b += WK_THREADS)
            if (P[b] != 0)
                sh_bad = 1;
    }
    __syncthreads();
    if (mode == WSYNC_DELTA_BITMAP) {
        /* k bits, and BITMAP is the format's pick with the escapes these positions need */
        wk_mask_scan(mask, wpre, wesc, wprev, &sh_total, &sh_etrue);
        __syncthreads();
        if (tid == 0) {
            uint32_t want;
            wk_bbytes(len, k, sh_etrue, E, &want);
            if (sh_total != k || want != WSYNC_DELTA_BITMAP)
                sh_bad = 1;
        }
        __syncthreads();
    }
    if (sh_bad) {
        if (tid == 0)
            atomicMin(reinterpret_cast<unsigned long long *>(&res[d.idx].fault),
                      (unsigned long long)(((uint64_t)j << 8) | WSYNC_KDELTA_FAULT_PAYLOAD));
        return;
    }

/* 2. apply: without hash straight into the target; with it, into the block's values first */
    const el *vals = reinterpret_cast<const el *>(P + hdr);
    const uint16_t *ix = posv;
    if (!hash) {
        unsigned char *a = d.b + (d.dense ? first * E : 0);
        if (mode == WSYNC_DELTA_SPARSE) {
            for (uint32_t r = tid; r < k; r += WK_THREADS) {
                uint32_t i = ix[r];
                uint64_t off = d.dense ? (uint64_t)i * E : wk_eoff(d, first + i, E);
                *reinterpret_cast<el *>((d.dense ? a : d.b) + off) = vals[r];
            }
        } else {
            for (uint32_t i = tid; i < len; i += WK_THREADS) {
                if (mode == WSYNC_DELTA_BITMAP && !((mask[i >> 5] >> (i & 31)) & 1u))
                    continue;
                uint64_t off = d.dense ? (uint64_t)i * E : wk_eoff(d, first + i, E);
                *reinterpret_cast<el *>((d.dense ? a : d.b) + off) =
                    mode == WSYNC_DELTA_BITMAP ? vals[wk_rank(mask, wpre, i)] : vals[i];
            }
        }
    } else {
        if (mode == WSYNC_DELTA_SPARSE) {
            for (uint32_t r = tid; r < k; r += WK_THREADS)
                reinterpret_cast<el *>(sv)[ix[r]] = vals[r];
        } else if (mode == WSYNC_DELTA_BITMAP) {
            for (uint32_t i = tid; i < len; i += WK_THREADS)
                if ((mask[i >> 5] >> (i & 31)) & 1u)
                    reinterpret_cast<el *>(sv)[i] = vals[wk_rank(mask, wpre, i)];
        } else if (mode == WSYNC_DELTA_PLAIN) {
            for (uint32_t i = tid; i < len; i += WK_THREADS)
                reinterpret_cast<el *>(sv)[i] = vals[i];
        }
        __syncthreads();
        if (mode == WSYNC_DELTA_SPARSE) {
            unsigned char *a = d.b + (d.dense ? first * E : 0);
            for (uint32_t r = tid; r < k; r += WK_THREADS) {
                uint32_t i = ix[r];
                uint64_t off = d.dense ? (uint64_t)i * E : wk_eoff(d, first + i, E);
                *reinterpret_cast<el *>((d.dense ? a : d.b) + off) = vals[r];
            }
        } else if (mode != WSYNC_DELTA_SAME) {
            /* a BITMAP block is dense enough (k > len / 16 for bf16) that most 32-byte sectors
             * hold a change: the whole block in 16-byte stores, not a 2-byte store per change */
            wk_store_block<E>(d, d.b, first, len, sv, mask, true);
        }
        const unsigned char *secret = reinterpret_cast<const unsigned char *>(sec);
        if (len == WK_DBLK) {
            uint4 x[E];
#pragma unroll
            for (int it = 0; it < E; it++)
                x[it] = reinterpret_cast<const uint4 *>(sv)[tid + WK_THREADS * it];
            wk_hash_terms<E>(x, sec, hsum);
            __syncthreads();
            if (tid >> 5 == 1) {
                const uint64_t h = wk_hash_finish<E>(hsum, sec);
                if ((tid & 31) == 0)
                    leaves[g] = h;
            }
        } else {
            const uint64_t leaf = wk_xxh3(sv, (uint64_t)len * E, secret, hsum);
            if (tid == 0)
                leaves[g] = leaf;
        }
    }
    if (tid == 0 && k > 0)
        atomicAdd(reinterpret_cast<unsigned long long *>(&res[d.idx].changed),
                  (unsigned long long)k);
}

/* ------------------------------------------------------------------------------------------ */
/* Persistent kernels (v2): chunks that are dense with 16-byte aligned starts                   */
/* ------------------------------------------------------------------------------------------ */

/* The chunk of batch block g, at or after chunk c (a CTA's blocks only grow). */
__device__ __forceinline__ uint32_t wk_chunk_from(const wk_dchunk_t *ch, uint32_t c, uint32_t c1,
                                                  uint64_t g)
{
    if (ch[c].block0 + ch[c].nb > g)
        return c;
    return wk_find_chunk(ch, c + 1, c1, g);
}

/* Elements in block g of chunk d, and the block's first element. */
__device__ __forceinline__ uint32_t wk_blen(const wk_dchunk_t &d, uint64_t g, uint64_t *first)
{
    *first = (g - d.block0) * WK_DBLK;
    return (uint32_t)(d.n - *first < WK_DBLK ? d.n - *first : WK_DBLK);
}

/* Encode, v2: blocks [g0, g0 + nblk) of chunks [c0, c1) (dense, new and old 16-byte aligned),
 * claimed in order from *counter by a grid of resident CTAs. Per block: compare in registers
 * (16-byte loads), mask words by shuffles, the words' scan (k, e, ranks) and the hash terms at
 * once, publish the size, hash and look back, then the payload (PLAIN from registers; SPARSE and
 * BITMAP staged in shared memory and written in 8-byte words). Shared memory (dynamic):
 * WK_DBLK * E bytes (the staged payload; a tail block's values for its hash). */
template <int E>
__global__ void __launch_bounds__(WK_THREADS, WK2E_MIN_BLOCKS)
wk2_delta_encode(const wk_dchunk_t *__restrict__ ch, uint32_t c0, uint32_t c1, uint64_t g0,
                 uint64_t nblk, unsigned long long *status, unsigned int *counter,
                 uint64_t *leaves, wsync_kdelta_result_t *res, int update_old)
{
    typedef typename wk_elem<E>::t el;
    constexpr uint32_t VE = 16 / E;
    constexpr bool PF = WK2E_PREFETCH && E <= 2;   /* prefetch the next block into registers */
    extern __shared__ uint4 wk_dyn[];
    unsigned char *buf = reinterpret_cast<unsigned char *>(wk_dyn);
    __shared__ uint32_t mask[WK_MWORDS], wpre[WK_MWORDS], wesc[WK_MWORDS];
    __shared__ int16_t wprev[WK_MWORDS];
    __shared__ uint64_t sec[24], hx[64 * E > WK_THREADS ? 64 * E : WK_THREADS];
    __shared__ uint64_t sh_off, sh_leaf;
    __shared__ uint32_t sh_k, sh_e, sh_next, sh_next2;
    const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const unsigned char *secret = reinterpret_cast<const unsigned char *>(sec);

    /* claims run two blocks ahead: the current one, the next (its values loading), and the one
     * after, whose atomic's latency is hidden behind a whole block (a CTA processes its claims in
     * increasing order, so the lowest unfinished block is always some CTA's current one) */
    wk_secret_load(sec);
    if (tid == 0) {
        sh_next = atomicAdd(counter, 1u);
        sh_next2 = atomicAdd(counter, 1u);
    }
    __syncthreads();
    uint64_t gr = sh_next, grq = sh_next2;
    uint32_t claim = 0;
    uint32_t c = c0;
    uint4 nw[E], od[E];
    if (gr < nblk) {
        c = wk_chunk_from(ch, c, c1, g0 + gr);
        uint64_t f;
        const uint32_t l = wk_blen(ch[c], g0 + gr, &f);
        wk_vload_block<E>(ch[c].a + f * E, l, nw);
        wk_vload_block<E>(ch[c].b + f * E, l, od);
    }
    while (gr < nblk) {
        const uint64_t g = g0 + gr;
        const wk_dchunk_t &d = ch[c];
        uint64_t first;
        const uint32_t len = wk_blen(d, g, &first);
        const uint32_t j = (uint32_t)(g - d.block0);
        const bool full = len == WK_DBLK;

        /* 1. changed bits, mask words; a tail block's values to shared memory for its hash */
        uint32_t cb[E];
#pragma unroll
        for (int it = 0; it < E; it++) {
            const uint32_t v = tid + WK_THREADS * it;
            cb[it] = wk_vdiff<E>(nw[it], od[it]);
            wk_put_bits<E>(cb[it], v, mask);
            if (!full)
                reinterpret_cast<uint4 *>(buf)[v] = nw[it];
        }
        __syncthreads();
        /* 2. the words' scan (warp 0), the next block's claim, the hash terms */
        if (warp == 0)
            wk_mask_scan(mask, wpre, wesc, wprev, &sh_k, &sh_e);
        else if (tid == 32)
            claim = atomicAdd(counter, 1u);   /* used at the end of the block */
        if (full)
            wk_hash_terms<E>(nw, sec, hx);
        __syncthreads();
        const uint32_t k = sh_k;
        const uint64_t grn = grq;
        uint32_t mode;
        const uint64_t size = wk_bbytes(len, k, sh_e, E, &mode);
        const uint32_t e = mode == WSYNC_DELTA_SPARSE ? sh_e : 0;
        if (tid == 0)
            atomicExch(&status[g], (unsigned long long)((j == 0 ? WK_LB_INC : WK_LB_AGG) | size));

        /* 3. the next block's values start loading */
        uint32_t cn = c;
        uint4 pn[PF ? E : 1], po[PF ? E : 1];
        if (PF && grn < nblk) {
            cn = wk_chunk_from(ch, c, c1, g0 + grn);
            uint64_t f;
            const uint32_t l = wk_blen(ch[cn], g0 + grn, &f);
#pragma unroll
            for (int it = 0; it < (PF ? E : 1); it++) {
                pn[it] = wk_vload<E>(ch[cn].a + f * E, tid + WK_THREADS * it, l);
                po[it] = wk_vload<E>(ch[cn].b + f * E, tid + WK_THREADS * it, l);
            }
        }

        /* 4. the leaf hash; the payload offset by look-back (warp 0) */
        if (full) {
            if (warp == 1) {
                const uint64_t h = wk_hash_finish<E>(hx, sec);
                if (lane == 0)
                    sh_leaf = h;
            }
        } else {
            const uint64_t h = wk_xxh3(buf, (uint64_t)len * E, secret, hx);
            if (tid == 0)
                sh_leaf = h;
        }
        if (warp == 0 && j > 0) {
            uint64_t excl = 0;
            int64_t p = (int64_t)j - 1;
            for (;;) {
                int64_t q = p - lane;
                uint64_t w = q >= 0 ? *(volatile unsigned long long *)&status[d.block0 + (uint64_t)q]
                                    : WK_LB_INC;
                uint32_t st = (uint32_t)(w >> 62);
                uint32_t xm = __ballot_sync(WK_FULL, st == 0), im = __ballot_sync(WK_FULL, st == 2);
                uint32_t lowi = im ? (uint32_t)__ffs((int)im) - 1 : 32;
                uint32_t lowx = xm ? (uint32_t)__ffs((int)xm) - 1 : 32;
                if (lowx < lowi) {
                    __nanosleep(32);
                    continue;
                }
                uint64_t val = (uint32_t)lane <= lowi ? (w & WK_LB_VAL) : 0;
                for (int o = 16; o > 0; o /= 2)
                    val += __shfl_xor_sync(WK_FULL, val, o);
                excl += val;
                if (lowi < 32)
                    break;
                p -= 32;
            }
            if (lane == 0) {
                atomicExch(&status[g], (unsigned long long)(WK_LB_INC | (excl + size)));
                sh_off = excl;
            }
        } else if (tid == 0) {
            sh_off = 0;
        }
        __syncthreads();
        const uint64_t off = sh_off, pos = 16 + 8 * (uint64_t)d.nb + off;

        /* 5. table entry, header, results */
        if (tid == 0) {
            if (16 + 8 * ((uint64_t)j + 1) <= d.cap)
                reinterpret_cast<uint64_t *>(d.out + 16)[j] =
                    off | ((uint64_t)((mode << 30) | (e << 16) | k) << 32);
            if (j == 0 && d.cap >= 16) {
                reinterpret_cast<uint64_t *>(d.out)[0] =
                    WSYNC_DELTA_MAGIC | ((uint64_t)WSYNC_DELTA_FORMAT << 32) | ((uint64_t)E << 40);
                reinterpret_cast<uint64_t *>(d.out)[1] = d.n;
            }
            leaves[g] = sh_leaf;
            if (k > 0)
                atomicAdd(reinterpret_cast<unsigned long long *>(&res[d.idx].changed),
                          (unsigned long long)k);
            if (j == d.nb - 1)
                res[d.idx].len = pos + size;
        }

        /* 6. the payload */
        if (size > 0 && pos + size <= d.cap) {
            uint64_t *to = reinterpret_cast<uint64_t *>(d.out + pos);
            if (mode == WSYNC_DELTA_PLAIN) {   /* from registers; a tail's padding is zero */
#pragma unroll
                for (int it = 0; it < E; it++) {
                    const uint64_t w0 = 2 * (uint64_t)(tid + WK_THREADS * it);
                    if (8 * w0 < size)
                        to[w0] = (uint64_t)nw[it].y << 32 | nw[it].x;
                    if (8 * (w0 + 1) < size)
                        to[w0 + 1] = (uint64_t)nw[it].w << 32 | nw[it].z;
                }
            } else {
                const bool sp = mode == WSYNC_DELTA_SPARSE;
                const uint64_t nh = sp ? (uint64_t)k + e : (len + 7) / 8, hdr = wk_al8(nh);
#pragma unroll
                for (int it = 0; it < E; it++) {
                    const uint32_t v = tid + WK_THREADS * it;
#pragma unroll
                    for (uint32_t x = 0; x < VE; x++) {
                        if (!((cb[it] >> x) & 1u))
                            continue;
                        const uint32_t i = v * VE + x, q = i >> 5;
                        const uint32_t below = mask[q] & ((1u << (i & 31)) - 1u);
                        const uint32_t r = wpre[q] + (uint32_t)__popc(below);
                        *reinterpret_cast<el *>(buf + hdr + (uint64_t)r * E) = (el)wk_vget<E>(nw[it], x);
                        if (sp) {   /* as in wk_delta_encode */
                            const uint32_t at = r + (wesc[q] >> 8);
                            uint32_t gap;
                            if (below != 0) {
                                gap = (i & 31) - (32 - (uint32_t)__clz((int)below));
                            } else {
                                const uint32_t ew = wesc[q] & 0xff;
                                gap = (uint32_t)((int)i - wprev[q] - 1);
                                for (uint32_t y = 1; y <= ew; y++)
                                    buf[at - y] = 0xff;
                            }
                            buf[at] = (unsigned char)(gap % 255u);
                        }
                    }
                }
                __syncthreads();
                /* 8-byte words, the bytes past the index (or bitmap) and past the values zero:
                 * the staging area holds earlier blocks' bytes there */
                const uint64_t vend = hdr + (uint64_t)k * E;
                for (uint64_t w = tid; w < size / 8; w += WK_THREADS) {
                    const uint64_t b = 8 * w;
                    uint64_t x, valid;
                    if (b < hdr) {
                        x = sp ? reinterpret_cast<const uint64_t *>(buf)[w]
                               : (uint64_t)mask[2 * w + 1] << 32 | mask[2 * w];
                        valid = nh > b ? nh - b : 0;
                    } else {
                        x = reinterpret_cast<const uint64_t *>(buf)[w];
                        valid = vend > b ? vend - b : 0;
                    }
                    if (valid < 8)
                        x &= valid == 0 ? 0 : ~UINT64_C(0) >> (64 - 8 * valid);
                    to[w] = x;
                }
            }
        }

        /* 7. the sender's baseline takes the changed values */
        if (update_old && k > 0) {
            unsigned char *ob = d.b + first * E;
#pragma unroll
            for (int it = 0; it < E; it++) {
                const uint32_t v = tid + WK_THREADS * it;
#pragma unroll
                for (uint32_t x = 0; x < VE; x++)
                    if ((cb[it] >> x) & 1u)
                        reinterpret_cast<el *>(ob)[v * VE + x] = (el)wk_vget<E>(nw[it], x);
            }
        }
        if (tid == 32)
            sh_next = claim;
        __syncthreads();   /* buf, mask and hx are the next block's */
        grq = sh_next;

        if constexpr (PF) {
#pragma unroll
            for (int it = 0; it < E; it++) {
                nw[it] = pn[it];
                od[it] = po[it];
            }
        } else if (grn < nblk) {
            cn = wk_chunk_from(ch, c, c1, g0 + grn);
            uint64_t f;
            const uint32_t l = wk_blen(ch[cn], g0 + grn, &f);
            wk_vload_block<E>(ch[cn].a + f * E, l, nw);
            wk_vload_block<E>(ch[cn].b + f * E, l, od);
        }
        gr = grn;
        c = cn;
    }
}

/* Store vector v of a block of len elements at p (16-byte aligned): only elements below len. */
template <int E>
__device__ __forceinline__ void wk_vstore(unsigned char *p, uint32_t v, uint32_t len, const uint4 &x)
{
    typedef typename wk_elem<E>::t el;
    constexpr uint32_t VE = 16 / E;
    if ((v + 1) * VE <= len) {
        reinterpret_cast<uint4 *>(p)[v] = x;
        return;
    }
#pragma unroll
    for (uint32_t e = 0; e < VE; e++)
        if (v * VE + e < len)
            reinterpret_cast<el *>(p)[v * VE + e] = (el)wk_vget<E>(x, e);
}

/* Every block's table entry checked, before the apply (v2): blocks [g0, g0 + nblk) of chunks
 * [c0, c1), a thread each; ents[g] = {offset, payload bytes, (mode << 30) | (e << 16) | k, fault}.
 * The apply then reads one 16-byte word per block, two blocks ahead. */
__global__ void __launch_bounds__(WK_THREADS)
wk2_entries(const wk_dchunk_t *__restrict__ ch, const uint32_t *__restrict__ bmap, uint64_t g0,
            uint64_t nblk, const uint64_t *lens, uint32_t E, uint4 *ents)
{
    for (uint64_t gr = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; gr < nblk;
         gr += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t g = g0 + gr;
        const wk_dchunk_t &d = ch[bmap[g]];
        uint64_t first, off = 0, size = 0;
        const uint32_t len = wk_blen(d, g, &first);
        uint32_t mode = 0, k = 0, e = 0;
        const uint32_t fault = wk_check_entry(d.a, lens[d.idx], d, (uint32_t)(g - d.block0), len, E,
                                              &mode, &k, &e, &off, &size);
        ents[g] = fault != 0 ? make_uint4(0, 0, 0, fault)
                             : make_uint4((uint32_t)off, (uint32_t)size, mode << 30 | e << 16 | k, 0);
    }
}

/* A SPARSE block's payload in registers (v2 apply, loaded a block ahead): this thread's bytes
 * of the index area [0, al8(k + e)) (at most 2: k + e <= 512), its values of rank tid and tid +
 * WK_THREADS, and (thread 0) the payload's last 8 bytes, for the values' padding. */
typedef struct {
    uint32_t ib;
    unsigned long long v0, v1, tail;
} wk_sparse_regs_t;

template <int E>
__device__ __forceinline__ void wk_sparse_load(const unsigned char *P, uint4 en, wk_sparse_regs_t *r)
{
    typedef typename wk_elem<E>::t el;
    const uint32_t k = en.z & 0xffffu, e = (en.z >> 16) & 0x3fffu;
    const uint32_t hdr = (uint32_t)wk_al8(k + e), per = (hdr + WK_THREADS - 1) / WK_THREADS;
    const uint32_t tid = threadIdx.x;
    r->ib = 0;
    for (uint32_t b = tid * per; b < tid * per + per && b < hdr; b++)
        r->ib |= (uint32_t)P[b] << (8 * (b - tid * per));
    const el *vals = reinterpret_cast<const el *>(P + hdr);
    r->v0 = tid < k ? (unsigned long long)vals[tid] : 0;
    r->v1 = tid + WK_THREADS < k ? (unsigned long long)vals[tid + WK_THREADS] : 0;
    r->tail = tid == 0 ? *reinterpret_cast<const unsigned long long *>(P + en.y - 8) : 0;
}

/* Apply, v2: blocks [g0, g0 + nblk) of chunks [c0, c1) (dense, the target 16-byte aligned),
 * grid-stride over a grid of resident CTAs, after wk2_entries. While a block is applied and
 * hashed, the next block's entry word, target values (with hash) and, when SPARSE, its payload
 * are loading into registers, and the entry word of the block after it: a SPARSE block is
 * decoded, checked, applied and hashed without waiting for memory. A SAME block is hashed from
 * registers; other blocks go through shared memory. Shared memory (dynamic, with hash):
 * WK_DBLK * E bytes. */
template <int E>
__global__ void __launch_bounds__(WK_THREADS, WK2_MIN_BLOCKS)
wk2_delta_apply(const wk_dchunk_t *__restrict__ ch, uint32_t c0, uint32_t c1, uint64_t g0,
                uint64_t nblk, const uint4 *ents, uint64_t *leaves, wsync_kdelta_result_t *res,
                int hash)
{
    typedef typename wk_elem<E>::t el;
    constexpr bool PF = E <= 2;
    extern __shared__ uint4 wk_dyn[];
    unsigned char *buf = reinterpret_cast<unsigned char *>(wk_dyn);
    __shared__ uint32_t mask[WK_MWORDS], wpre[WK_MWORDS], wesc[WK_MWORDS], red[16];
    __shared__ int16_t wprev[WK_MWORDS];
    __shared__ uint16_t posv[512];   /* SPARSE: k <= 512 (its index beats a bitmap of <= 512) */
    __shared__ uint64_t sec[24], hx[64 * E > WK_THREADS ? 64 * E : WK_THREADS];
    __shared__ uint32_t sh_total, sh_etrue;
    const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const uint64_t S = gridDim.x;
    const unsigned char *secret = reinterpret_cast<const unsigned char *>(sec);

    wk_secret_load(sec);
    uint64_t gr = blockIdx.x;
    uint32_t c = c0;
    uint4 tv[E], en = make_uint4(0, 0, 0, 0), en1 = make_uint4(0, 0, 0, 0);
    wk_sparse_regs_t sp = {0, 0, 0, 0};
    if (gr < nblk) {
        c = wk_chunk_from(ch, c, c1, g0 + gr);
        en = ents[g0 + gr];
        if (gr + S < nblk)
            en1 = ents[g0 + gr + S];
        uint64_t f;
        const uint32_t l = wk_blen(ch[c], g0 + gr, &f);
        if (hash)
            wk_vload_block<E>(ch[c].b + f * E, l, tv);
        if (en.w == 0 && (en.z >> 30) == WSYNC_DELTA_SPARSE)
            wk_sparse_load<E>(ch[c].a + 16 + 8 * (uint64_t)ch[c].nb + en.x, en, &sp);
    }
    __syncthreads();
    while (gr < nblk) {
        const uint64_t g = g0 + gr, grn = gr + S;
        const wk_dchunk_t &d = ch[c];
        uint64_t first;
        const uint32_t len = wk_blen(d, g, &first);
        const uint32_t j = (uint32_t)(g - d.block0);
        const bool full = len == WK_DBLK;
        const uint32_t fault = en.w, mode = en.z >> 30, k = en.z & 0xffffu, ee = (en.z >> 16) & 0x3fffu;
        const uint64_t size = en.y;
        const unsigned char *P = d.a + 16 + 8 * (uint64_t)d.nb + en.x;   /* 8-byte aligned */

        /* the blocks ahead: the entry after next; the next one's target values and payload */
        uint32_t cn = c;
        uint4 en2 = make_uint4(0, 0, 0, 0), pv[PF ? E : 1];
        wk_sparse_regs_t sp1 = {0, 0, 0, 0};
        if (grn + S < nblk)
            en2 = ents[g0 + grn + S];
        if (grn < nblk) {
            cn = wk_chunk_from(ch, c, c1, g0 + grn);
            uint64_t f;
            const uint32_t l = wk_blen(ch[cn], g0 + grn, &f);
            if (PF && hash) {
#pragma unroll
                for (int it = 0; it < (PF ? E : 1); it++)
                    pv[it] = wk_vload<E>(ch[cn].b + f * E, tid + WK_THREADS * it, l);
            }
            if (en1.w == 0 && (en1.z >> 30) == WSYNC_DELTA_SPARSE)
                wk_sparse_load<E>(ch[cn].a + 16 + 8 * (uint64_t)ch[cn].nb + en1.x, en1, &sp1);
        }

        /* 1. the payload's content, before anything is written (as wk_delta_apply) */
        const bool buffered = hash && fault == 0 && (mode != WSYNC_DELTA_SAME || !full);
        if (buffered) {
#pragma unroll
            for (int it = 0; it < E; it++)
                reinterpret_cast<uint4 *>(buf)[tid + WK_THREADS * it] = tv[it];
        }
        int lbad = 0;
        uint64_t hdr = 0;
        if (fault == 0 && mode == WSYNC_DELTA_SPARSE) {
            /* from registers: this thread's run of the index area, padding bytes zero, no
             * trailing escape; then as wk_delta_apply */
            const uint32_t nbytes = k + ee;
            hdr = wk_al8(nbytes);
            const uint32_t per = ((uint32_t)hdr + WK_THREADS - 1) / WK_THREADS, b0 = tid * per;
            uint32_t adv = 0, cnt = 0;
            for (uint32_t b = b0; b < b0 + per && b < hdr; b++) {
                const uint32_t x = (sp.ib >> (8 * (b - b0))) & 0xffu;
                if (b < nbytes) {
                    adv += x == 0xff ? 255u : x + 1;
                    cnt += x != 0xff;
                    if (b == nbytes - 1 && x == 0xff)
                        lbad = 1;
                } else if (x != 0) {
                    lbad = 1;
                }
            }
            uint32_t adv0, cnt0, advt, cntt;
            wk_block_scan2(adv, cnt, red, &adv0, &cnt0, &advt, &cntt);
            if (cntt != k) {
                lbad = 1;
            } else {
                for (uint32_t b = b0; b < b0 + per && b < nbytes; b++) {
                    const uint32_t x = (sp.ib >> (8 * (b - b0))) & 0xffu;
                    adv0 += x == 0xff ? 255u : x + 1;
                    if (x != 0xff) {
                        if (adv0 - 1 >= len)
                            lbad = 1;
                        else
                            posv[cnt0] = (uint16_t)(adv0 - 1);
                        cnt0++;
                    }
                }
            }
            const uint64_t pad = size - hdr - (uint64_t)k * E;   /* 0..7 bytes after the values */
            if (tid == 0 && pad > 0 && (sp.tail >> (64 - 8 * pad)) != 0)
                lbad = 1;
        } else if (fault == 0 && mode == WSYNC_DELTA_BITMAP) {
            hdr = wk_al8((len + 7) / 8);
            for (uint32_t w = tid; w < WK_MWORDS; w += WK_THREADS) {
                uint32_t m = w < hdr / 4 ? reinterpret_cast<const uint32_t *>(P)[w] : 0;
                uint32_t lo = w * 32;
                uint32_t past = lo >= len ? WK_FULL : len - lo >= 32 ? 0u : ~((1u << (len - lo)) - 1u);
                if (m & past)
                    lbad = 1;
                mask[w] = m;
            }
        }
        if (fault == 0 && (mode == WSYNC_DELTA_BITMAP || mode == WSYNC_DELTA_PLAIN)) {
            const uint64_t vend = mode == WSYNC_DELTA_PLAIN ? (uint64_t)len * E : hdr + (uint64_t)k * E;
            for (uint64_t b = vend + tid; b < size; b += WK_THREADS)
                if (P[b] != 0)
                    lbad = 1;
        }
        int bad = __syncthreads_or(lbad);
        if (fault == 0 && !bad && mode == WSYNC_DELTA_BITMAP) {
            wk_mask_scan(mask, wpre, wesc, wprev, &sh_total, &sh_etrue);
            __syncthreads();
            int lb = 0;
            if (tid == 0) {
                uint32_t want;
                wk_bbytes(len, k, sh_etrue, E, &want);
                lb = sh_total != k || want != WSYNC_DELTA_BITMAP;
            }
            bad = __syncthreads_or(lb);
        }

        if (fault != 0 || bad) {
            if (tid == 0)
                atomicMin(reinterpret_cast<unsigned long long *>(&res[d.idx].fault),
                          (unsigned long long)(((uint64_t)j << 8) |
                                               (fault != 0 ? fault : WSYNC_KDELTA_FAULT_PAYLOAD)));
        } else {
            /* 2. apply */
            const el *vals = reinterpret_cast<const el *>(P + hdr);
            unsigned char *tb = d.b + first * E;
            if (mode == WSYNC_DELTA_SPARSE) {   /* only the changed values are written */
                if (tid < k) {
                    reinterpret_cast<el *>(tb)[posv[tid]] = (el)sp.v0;
                    if (hash)
                        reinterpret_cast<el *>(buf)[posv[tid]] = (el)sp.v0;
                }
                if (tid + WK_THREADS < k) {
                    reinterpret_cast<el *>(tb)[posv[tid + WK_THREADS]] = (el)sp.v1;
                    if (hash)
                        reinterpret_cast<el *>(buf)[posv[tid + WK_THREADS]] = (el)sp.v1;
                }
            } else if (!hash) {
                if (mode != WSYNC_DELTA_SAME) {
                    for (uint32_t i = tid; i < len; i += WK_THREADS) {
                        if (mode == WSYNC_DELTA_BITMAP && !((mask[i >> 5] >> (i & 31)) & 1u))
                            continue;
                        reinterpret_cast<el *>(tb)[i] =
                            mode == WSYNC_DELTA_BITMAP ? vals[wk_rank(mask, wpre, i)] : vals[i];
                    }
                }
            } else if (mode != WSYNC_DELTA_SAME) {   /* BITMAP, PLAIN: the block whole */
                for (uint32_t i = tid; i < len; i += WK_THREADS) {
                    if (mode == WSYNC_DELTA_BITMAP && !((mask[i >> 5] >> (i & 31)) & 1u))
                        continue;
                    reinterpret_cast<el *>(buf)[i] =
                        mode == WSYNC_DELTA_BITMAP ? vals[wk_rank(mask, wpre, i)] : vals[i];
                }
            }
            /* 3. the hash of the block's values after applying */
            if (hash) {
                if (buffered) {
                    __syncthreads();
#pragma unroll
                    for (int it = 0; it < E; it++) {
                        const uint32_t v = tid + WK_THREADS * it;
                        tv[it] = reinterpret_cast<const uint4 *>(buf)[v];
                        if (mode == WSYNC_DELTA_BITMAP || mode == WSYNC_DELTA_PLAIN)
                            wk_vstore<E>(tb, v, len, tv[it]);
                    }
                }
                if (full) {
                    wk_hash_terms<E>(tv, sec, hx);
                    __syncthreads();
                    if (warp == 1) {
                        const uint64_t h = wk_hash_finish<E>(hx, sec);
                        if (lane == 0)
                            leaves[g] = h;
                    }
                } else {
                    const uint64_t h = wk_xxh3(buf, (uint64_t)len * E, secret, hx);
                    if (tid == 0)
                        leaves[g] = h;
                }
            }
            if (tid == 0 && k > 0)
                atomicAdd(reinterpret_cast<unsigned long long *>(&res[d.idx].changed),
                          (unsigned long long)k);
        }
        __syncthreads();   /* buf, hx, posv and mask are the next block's */

        if constexpr (PF) {
            if (hash) {
#pragma unroll
                for (int it = 0; it < E; it++)
                    tv[it] = pv[it];
            }
        } else if (hash && grn < nblk) {
            uint64_t f;
            const uint32_t l = wk_blen(ch[cn], g0 + grn, &f);
            wk_vload_block<E>(ch[cn].b + f * E, l, tv);
        }
        en = en1;
        en1 = en2;
        sp = sp1;
        gr = grn;
        c = cn;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Chunk hashes, results, XXH3 of ranges                                                       */
/* ------------------------------------------------------------------------------------------ */

/* Chunk blockIdx.x: XXH3 of its leaves (the tree hash). */
__global__ void __launch_bounds__(WK_THREADS)
wk_delta_chunk_hash(const wk_dchunk_t *__restrict__ ch, const uint64_t *leaves,
                    wsync_kdelta_result_t *res)
{
    __shared__ uint64_t sec[24], hsum[WK_THREADS];
    wk_secret_load(sec);
    __syncthreads();
    const wk_dchunk_t &d = ch[blockIdx.x];
    uint64_t h = wk_xxh3(reinterpret_cast<const unsigned char *>(leaves + d.block0),
                         8 * (uint64_t)d.nb, reinterpret_cast<const unsigned char *>(sec), hsum);
    if (threadIdx.x == 0)
        res[d.idx].hash = h;
}

/* Results to their starting values: len, hash, changed 0, no fault; the look-back words and
 * block counters 0. */
__global__ void wk_delta_init(wsync_kdelta_result_t *res, uint32_t n, unsigned long long *status,
                              uint64_t nstatus)
{
    uint64_t i0 = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x, step = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = i0; i < n; i += step) {
        res[i].len = 0;
        res[i].hash = 0;
        res[i].changed = 0;
        res[i].fault = WSYNC_KDELTA_NO_FAULT;
    }
    for (uint64_t i = i0; i < nstatus; i += step)
        status[i] = 0;
}

__global__ void __launch_bounds__(WK_THREADS)
wk_xxh3_ranges(const unsigned char *data, const uint64_t *offs, const uint64_t *lens,
               uint64_t *out)
{
    __shared__ uint64_t sec[24], hsum[WK_THREADS];
    wk_secret_load(sec);
    __syncthreads();
    uint64_t h = wk_xxh3(data + offs[blockIdx.x], lens[blockIdx.x],
                         reinterpret_cast<const unsigned char *>(sec), hsum);
    if (threadIdx.x == 0)
        out[blockIdx.x] = h;
}

/* ------------------------------------------------------------------------------------------ */
/* Host side                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* Element sizes 1, 2, 4, 8 as groups 0..3. */
static int wk_esize_group(uint32_t esize)
{
    return esize == 1 ? 0 : esize == 2 ? 1 : esize == 4 ? 2 : esize == 8 ? 3 : -1;
}

struct wsync_kdelta_batch {
    int apply;                         /* apply batch, else encode */
    int flag;                          /* encode: update_old; apply: hash */
    uint32_t n;
    uint64_t nblocks;
    void *dev;                         /* one allocation: */
    wk_dchunk_t *chunks;               /*   [n], grouped by element size */
    uint64_t *lens;                    /*   [n] apply: lengths, caller's order */
    unsigned long long *status;        /*   [nblocks + 4] encode: look-back words, counters */
    uint64_t *leaves;                  /*   [nblocks] */
    wsync_kdelta_result_t *res;        /*   [n] */
    uint4 *ents;                       /*   [nblocks] apply: the checked table entries (v2) */
    uint32_t *bmap;                    /*   [nblocks] each block's chunk (its place in chunks) */
    uint64_t dev_bytes;
    wsync_kdelta_result_t *host;       /* pinned [n] */
    uint64_t *lens_host;               /* pinned [n] apply: the lengths of the next launch */
    uint64_t *lens_default;            /* malloc [n] apply: those given at create */
    int lens_changed;                  /* a launch gave other lengths than the default */
    struct {
        uint32_t c0, cf, c1;           /* chunks: [c0, cf) for the v2 kernels, [cf, c1) v1 */
        uint64_t g0, gf, g1;           /* their blocks */
        unsigned grid2;                /* the v2 kernel's CTAs (resident at once) */
    } grp[4];
};

static const char *const wk_fault_names[4] = {
    "no fault", "bad header (length, magic, format, element size or element count)",
    "bad block table entry (mode, changed count, offset or length)",
    "bad payload (indices, bitmap, or non-zero padding)"};

static int wk_env_on(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

/* Whether a batch's dense 16-byte aligned chunks take the v2 kernels: not by default. Measured
 * on an H100 (test_delta_kernels, 1 GiB bf16 in 64 chunks at 1 %, commit 5c201c0): v1 encode
 * 1.30 ms against v2's 5.93, v1 apply 0.55 ms against 0.75, with the hash 1.00 against 1.40 (v2
 * stalls at its barriers with 4-6 CTAs per SM; v1 keeps 8). WSYNC_KDELTA_V2=1: v2 wherever it
 * can run, to compare; WSYNC_KDELTA_V1=1: v1 (the default) whatever else is set. */
static int wk_use_v2(int apply, int hash)
{
    (void)apply;
    (void)hash;
    if (wk_env_on("WSYNC_KDELTA_V1"))
        return 0;
    return wk_env_on("WSYNC_KDELTA_V2");
}

/* The checks both kinds of chunk share. */
static wsync_status_t wk_check_region(const char *fn, uint32_t i, const void *base,
                                      const char *base_name, const wsync_region_t *r,
                                      uint32_t esize)
{
    if (base == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: chunk %" PRIu32 ": %s is NULL", fn, i, base_name);
    if (wk_esize_group(esize) < 0)
        return wsync_err(WSYNC_ERR_INVALID, "%s: chunk %" PRIu32 ": esize %" PRIu32 " (1, 2, 4 or 8)",
                         fn, i, esize);
    if (r->rows == 0 || r->cols == 0)
        return wsync_err(WSYNC_ERR_INVALID, "%s: chunk %" PRIu32 ": empty region (%" PRIu64 " x %" PRIu64 ")",
                         fn, i, r->rows, r->cols);
    if (r->rows > 1 && r->pitch < r->cols)
        return wsync_err(WSYNC_ERR_INVALID, "%s: chunk %" PRIu32 ": cols %" PRIu64 " above the pitch %" PRIu64,
                         fn, i, r->cols, r->pitch);
    const uint64_t lim = UINT64_C(1) << 48;
    if (r->rows >= lim || r->cols >= lim || r->off >= lim || r->pitch >= lim ||
        (r->rows > 1 && r->rows - 1 > (lim - r->cols) / r->pitch))
        return wsync_err(WSYNC_ERR_INVALID, "%s: chunk %" PRIu32 ": region too large", fn, i);
    uint64_t n = r->rows * r->cols;
    /* core/delta.h: n * esize <= UINT32_MAX, so that every 32-bit offset fits */
    if (n * esize > UINT32_MAX)
        return wsync_err(WSYNC_ERR_INVALID, "%s: chunk %" PRIu32 ": %" PRIu64 " elements of %" PRIu32
                         " bytes, above the format's %" PRIu32 " (it travels plain)", fn, i, n,
                         esize, UINT32_MAX);
    uintptr_t start = (uintptr_t)base + (uintptr_t)(r->off * esize);
    if (start % esize != 0)
        return wsync_err(WSYNC_ERR_INVALID, "%s: chunk %" PRIu32 ": %s's region starts at %p, not "
                         "aligned to its %" PRIu32 "-byte elements", fn, i, base_name, (void *)start, esize);
    return WSYNC_OK;
}

static void wk_batch_release(wsync_kdelta_batch_t *b)
{
    if (b == NULL)
        return;
    if (b->dev != NULL)
        cudaFree(b->dev);
    if (b->host != NULL)
        cudaFreeHost(b->host);
    if (b->lens_host != NULL)
        cudaFreeHost(b->lens_host);
    free(b->lens_default);
    free(b);
}

template <int E>
static cudaError_t wk_occupancy(int apply, int *per_sm)
{
    if (apply)
        return cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, wk2_delta_apply<E>, WK_THREADS,
                                                             WK_DBLK * E);
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, wk2_delta_encode<E>, WK_THREADS,
                                                         WK_DBLK * E);
}

/* The v2 kernels' grids: as many CTAs as the device keeps resident (they loop over the blocks),
 * at most one per block. */
static wsync_status_t wk_grid2(wsync_kdelta_batch_t *b)
{
    int dev = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    for (int grp = 0; grp < 4 && e == cudaSuccess; grp++) {
        const uint64_t nb = b->grp[grp].gf - b->grp[grp].g0;
        int per_sm = 0;
        if (nb == 0)
            continue;
        e = grp == 0 ? wk_occupancy<1>(b->apply, &per_sm) : grp == 1 ? wk_occupancy<2>(b->apply, &per_sm)
          : grp == 2 ? wk_occupancy<4>(b->apply, &per_sm) : wk_occupancy<8>(b->apply, &per_sm);
        uint64_t grid = (uint64_t)(per_sm > 0 ? per_sm : 1) * (uint64_t)(sms > 0 ? sms : 1);
        b->grp[grp].grid2 = (unsigned)(grid < nb ? grid : nb);
    }
    return e == cudaSuccess ? WSYNC_OK : wk_cuda(e, "wsync_kdelta: occupancy of the codec kernels");
}

/* Group the chunks by element size, number their blocks, allocate and upload. d[i] describes
 * chunk i (caller's order) with block0 unset; esz[i] its element size. */
static wsync_status_t wk_batch_build(const char *fn, int apply, int flag, wk_dchunk_t *d,
                                     const uint32_t *esz, const uint64_t *lens, uint32_t n,
                                     wsync_kdelta_batch_t **out)
{
    wsync_kdelta_batch_t *b = (wsync_kdelta_batch_t *)calloc(1, sizeof(*b));
    wk_dchunk_t *sorted = (wk_dchunk_t *)malloc((size_t)(n ? n : 1) * sizeof(*sorted));
    wsync_status_t st = WSYNC_OK;
    cudaError_t e;

    if (b == NULL || sorted == NULL) {
        free(b);
        free(sorted);
        return wsync_err(WSYNC_ERR_NOMEM, "%s: %" PRIu32 " chunks", fn, n);
    }
    b->apply = apply;
    b->flag = flag;
    b->n = n;
    uint32_t m = 0;
    uint64_t g = 0;
    for (int grp = 0; grp < 4; grp++) {
        b->grp[grp].c0 = m;
        b->grp[grp].g0 = g;
        for (int slow = 0; slow < 2; slow++) {   /* the v2 kernels' chunks first */
            if (slow) {
                b->grp[grp].cf = m;
                b->grp[grp].gf = g;
            }
            for (uint32_t i = 0; i < n; i++) {
                if (wk_esize_group(esz[i]) != grp || (int)(d[i].fast == 0) != slow)
                    continue;
                sorted[m] = d[i];
                sorted[m].block0 = g;
                g += sorted[m].nb;
                m++;
            }
        }
        b->grp[grp].c1 = m;
        b->grp[grp].g1 = g;
        if (g - b->grp[grp].g0 > INT32_MAX) {
            st = wsync_err(WSYNC_ERR_INVALID, "%s: %" PRIu64 " blocks of %d-byte elements in one batch "
                           "(at most %d)", fn, g - b->grp[grp].g0, 1 << grp, INT32_MAX);
            goto fail;
        }
    }
    b->nblocks = g;

    {   /* one device allocation: chunks, lens, status + counters, leaves, results */
        uint64_t o_ch = 0, o_lens = o_ch + wk_al8((uint64_t)n * sizeof(wk_dchunk_t));
        uint64_t o_st = o_lens + 8 * (uint64_t)n, o_lv = o_st + 8 * (apply ? 0 : g + 4);
        uint64_t o_res = o_lv + 8 * g, o_en = (o_res + (uint64_t)n * sizeof(wsync_kdelta_result_t) + 15) & ~UINT64_C(15);
        uint64_t o_bm = o_en + (apply ? 16 * g : 0), total = o_bm + 4 * g;
        e = cudaMalloc(&b->dev, total ? total : 8);
        if (e != cudaSuccess) {
            st = wk_cuda(e, "wsync_kdelta: cudaMalloc");
            goto fail;
        }
        unsigned char *base = (unsigned char *)b->dev;
        b->chunks = (wk_dchunk_t *)(base + o_ch);
        b->lens = (uint64_t *)(base + o_lens);
        b->status = (unsigned long long *)(base + o_st);
        b->leaves = (uint64_t *)(base + o_lv);
        b->res = (wsync_kdelta_result_t *)(base + o_res);
        b->ents = (uint4 *)(base + o_en);
        b->bmap = (uint32_t *)(base + o_bm);
        b->dev_bytes = total;
    }
    e = cudaMallocHost((void **)&b->host, (size_t)(n ? n : 1) * sizeof(wsync_kdelta_result_t));
    if (e == cudaSuccess && apply)
        e = cudaMallocHost((void **)&b->lens_host, (size_t)(n ? n : 1) * 8);
    if (e != cudaSuccess) {
        st = wk_cuda(e, "wsync_kdelta: cudaMallocHost");
        goto fail;
    }
    for (uint32_t i = 0; i < n; i++) {
        b->host[i].len = b->host[i].hash = b->host[i].changed = 0;
        b->host[i].fault = WSYNC_KDELTA_NO_FAULT;
    }
    if (n > 0) {
        e = cudaMemcpy(b->chunks, sorted, (size_t)n * sizeof(*sorted), cudaMemcpyHostToDevice);
        if (e == cudaSuccess && apply)
            e = cudaMemcpy(b->lens, lens, (size_t)n * 8, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) {
            st = wk_cuda(e, "wsync_kdelta: cudaMemcpy (descriptors)");
            goto fail;
        }
    }
    if (g > 0) {   /* each block's chunk: one load instead of a search per block */
        uint32_t *bm = (uint32_t *)malloc((size_t)g * 4);
        if (bm == NULL) {
            st = wsync_err(WSYNC_ERR_NOMEM, "%s: a block map of %" PRIu64 " blocks", fn, g);
            goto fail;
        }
        for (uint32_t i = 0; i < n; i++)
            for (uint64_t x = 0; x < sorted[i].nb; x++)
                bm[sorted[i].block0 + x] = i;
        e = cudaMemcpy(b->bmap, bm, (size_t)g * 4, cudaMemcpyHostToDevice);
        free(bm);
        if (e != cudaSuccess) {
            st = wk_cuda(e, "wsync_kdelta: cudaMemcpy (block map)");
            goto fail;
        }
    }
    if (apply) {
        b->lens_default = (uint64_t *)malloc((size_t)(n ? n : 1) * 8);
        if (b->lens_default == NULL) {
            st = wsync_err(WSYNC_ERR_NOMEM, "%s: %" PRIu32 " lengths", fn, n);
            goto fail;
        }
        if (n > 0)
            memcpy(b->lens_default, lens, (size_t)n * 8);
    } else if (b->grp[3].g1 > b->grp[3].g0) {
        /* 8-byte elements: 64 KiB of shared memory a block, past the default 48 */
        e = cudaFuncSetAttribute(wk_delta_encode<8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)(2 * WK_DBLK * 8));
        if (e != cudaSuccess) {
            st = wk_cuda(e, "wsync_kdelta: cudaFuncSetAttribute");
            goto fail;
        }
    }
    st = wk_grid2(b);
    if (st != WSYNC_OK)
        goto fail;
    free(sorted);
    *out = b;
    return WSYNC_OK;
fail:
    free(sorted);
    wk_batch_release(b);
    return st;
}

template <int E>
static void wk_launch_group(const wsync_kdelta_batch_t *b, int grp, cudaStream_t s)
{
    const uint32_t c0 = b->grp[grp].cf, cv = b->grp[grp].c0;
    const uint64_t g0 = b->grp[grp].gf, nb = b->grp[grp].g1 - g0, gv = b->grp[grp].g0;
    const uint64_t nbv = g0 - gv;
    if (nbv > 0) {
        if (b->apply) {
            const uint64_t units = (nbv + WK_THREADS - 1) / WK_THREADS;
            wk2_entries<<<(unsigned)(units < 65536 ? units : 65536), WK_THREADS, 0, s>>>(
                b->chunks, b->bmap, gv, nbv, b->lens, (uint32_t)E, b->ents);
            wk2_delta_apply<E><<<b->grp[grp].grid2, WK_THREADS, b->flag ? WK_DBLK * E : 0, s>>>(
                b->chunks, cv, c0, gv, nbv, b->ents, b->leaves, b->res, b->flag);
        } else
            wk2_delta_encode<E><<<b->grp[grp].grid2, WK_THREADS, WK_DBLK * E, s>>>(
                b->chunks, cv, c0, gv, nbv, b->status,
                (unsigned int *)(b->status + b->nblocks) + 4 + grp, b->leaves, b->res, b->flag);
    }
    if (nb == 0)
        return;
    if (b->apply)
        wk_delta_apply<E><<<(unsigned)nb, WK_THREADS, b->flag ? WK_DBLK * E : 0, s>>>(
            b->chunks, b->bmap, g0, b->lens, b->leaves, b->res, b->flag);
    else
        wk_delta_encode<E><<<(unsigned)nb, WK_THREADS, 2 * WK_DBLK * E, s>>>(
            b->chunks, b->bmap, g0, b->status, (unsigned int *)(b->status + b->nblocks) + grp,
            b->leaves, b->res, b->flag);
}

extern "C" {

wsync_status_t wsync_kdelta_encode_create(const wsync_kdelta_enc_t *chunks, uint32_t n,
                                          int update_old, wsync_kdelta_batch_t **batch)
{
    static const char fn[] = "wsync_kdelta_encode_create";
    const int v2 = wk_use_v2(0, 0);
    if (batch == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: batch is NULL", fn);
    if (n > 0 && chunks == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: chunks is NULL with n = %" PRIu32, fn, n);
    wk_dchunk_t *d = (wk_dchunk_t *)calloc(n ? n : 1, sizeof(*d));
    uint32_t *esz = (uint32_t *)calloc(n ? n : 1, sizeof(*esz));
    if (d == NULL || esz == NULL) {
        free(d);
        free(esz);
        return wsync_err(WSYNC_ERR_NOMEM, "%s: %" PRIu32 " chunks", fn, n);
    }
    wsync_status_t st = WSYNC_OK;
    for (uint32_t i = 0; i < n && st == WSYNC_OK; i++) {
        const wsync_kdelta_enc_t *c = &chunks[i];
        st = wk_check_region(fn, i, c->new_base, "new_base", &c->src, c->esize);
        if (st == WSYNC_OK)
            st = wk_check_region(fn, i, c->old_base, "old_base", &c->src, c->esize);
        if (st == WSYNC_OK && (c->out == NULL || ((uintptr_t)c->out & 7) != 0))
            st = wsync_err(WSYNC_ERR_INVALID, "%s: chunk %" PRIu32 ": out %s", fn, i,
                           c->out == NULL ? "is NULL" : "is not 8-byte aligned");
        if (st != WSYNC_OK)
            break;
        const wsync_region_t *r = &c->src;
        d[i].a = (const unsigned char *)c->new_base + r->off * c->esize;
        d[i].b = (unsigned char *)c->old_base + r->off * c->esize;
        d[i].out = (unsigned char *)c->out;
        d[i].cap = c->cap;
        d[i].pitch = r->pitch;
        d[i].cols = r->cols;
        d[i].n = r->rows * r->cols;
        d[i].nb = (uint32_t)wsync_delta_nblocks(d[i].n);
        d[i].idx = i;
        d[i].dense = r->rows == 1 || r->pitch == r->cols;
        d[i].fast = v2 && d[i].dense && (((uintptr_t)d[i].a | (uintptr_t)d[i].b) & 15) == 0;
        esz[i] = c->esize;
    }
    if (st == WSYNC_OK)
        st = wk_batch_build(fn, 0, update_old != 0, d, esz, NULL, n, batch);
    free(d);
    free(esz);
    return st;
}

wsync_status_t wsync_kdelta_apply_create(const wsync_kdelta_app_t *chunks, uint32_t n, int hash,
                                         wsync_kdelta_batch_t **batch)
{
    static const char fn[] = "wsync_kdelta_apply_create";
    const int v2 = wk_use_v2(1, hash != 0);
    if (batch == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: batch is NULL", fn);
    if (n > 0 && chunks == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: chunks is NULL with n = %" PRIu32, fn, n);
    wk_dchunk_t *d = (wk_dchunk_t *)calloc(n ? n : 1, sizeof(*d));
    uint32_t *esz = (uint32_t *)calloc(n ? n : 1, sizeof(*esz));
    uint64_t *lens = (uint64_t *)calloc(n ? n : 1, sizeof(*lens));
    if (d == NULL || esz == NULL || lens == NULL) {
        free(d);
        free(esz);
        free(lens);
        return wsync_err(WSYNC_ERR_NOMEM, "%s: %" PRIu32 " chunks", fn, n);
    }
    wsync_status_t st = WSYNC_OK;
    for (uint32_t i = 0; i < n; i++) {
        const wsync_kdelta_app_t *c = &chunks[i];
        st = wk_check_region(fn, i, c->dst_base, "dst_base", &c->dst, c->esize);
        if (st == WSYNC_OK && (c->enc == NULL || ((uintptr_t)c->enc & 7) != 0))
            st = wsync_err(WSYNC_ERR_INVALID, "%s: chunk %" PRIu32 ": enc %s", fn, i,
                           c->enc == NULL ? "is NULL" : "is not 8-byte aligned");
        if (st != WSYNC_OK)
            break;
        const wsync_region_t *r = &c->dst;
        d[i].a = (const unsigned char *)c->enc;
        d[i].b = (unsigned char *)c->dst_base + r->off * c->esize;
        d[i].pitch = r->pitch;
        d[i].cols = r->cols;
        d[i].n = r->rows * r->cols;
        d[i].nb = (uint32_t)wsync_delta_nblocks(d[i].n);
        d[i].idx = i;
        d[i].dense = r->rows == 1 || r->pitch == r->cols;
        d[i].fast = v2 && d[i].dense && ((uintptr_t)d[i].b & 15) == 0;
        esz[i] = c->esize;
        lens[i] = c->len;
    }
    if (st == WSYNC_OK)
        st = wk_batch_build(fn, 1, hash != 0, d, esz, lens, n, batch);
    free(d);
    free(esz);
    free(lens);
    return st;
}

wsync_status_t wsync_kdelta_launch(wsync_kdelta_batch_t *b, const uint64_t *lens, void *stream)
{
    static const char fn[] = "wsync_kdelta_launch";
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t e;

    if (b == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: batch is NULL", fn);
    if (lens != NULL && !b->apply)
        return wsync_err(WSYNC_ERR_INVALID, "%s: lens given to an encode batch", fn);
    if (b->n == 0)
        return WSYNC_OK;
    if (b->apply && (lens != NULL || b->lens_changed)) {
        /* the pinned staging is free: the previous launch of this batch has completed */
        memcpy(b->lens_host, lens != NULL ? lens : b->lens_default, (size_t)b->n * 8);
        b->lens_changed = lens != NULL;
        e = cudaMemcpyAsync(b->lens, b->lens_host, (size_t)b->n * 8, cudaMemcpyHostToDevice, s);
        if (e != cudaSuccess)
            return wk_cuda(e, "wsync_kdelta_launch: cudaMemcpyAsync (lengths)");
    }
    {
        uint64_t nst = b->apply ? 0 : b->nblocks + 4, most = nst > b->n ? nst : b->n;
        unsigned grid = (unsigned)(most / WK_THREADS + 1 < 1024 ? most / WK_THREADS + 1 : 1024);
        wk_delta_init<<<grid, WK_THREADS, 0, s>>>(b->res, b->n, b->status, nst);
    }
    wk_launch_group<1>(b, 0, s);
    wk_launch_group<2>(b, 1, s);
    wk_launch_group<4>(b, 2, s);
    wk_launch_group<8>(b, 3, s);
    if (!b->apply || b->flag)
        wk_delta_chunk_hash<<<b->n, WK_THREADS, 0, s>>>(b->chunks, b->leaves, b->res);
    wsync_status_t st = wk_launched("wsync_kdelta_launch: kernel launch");
    if (st != WSYNC_OK)
        return st;
    e = cudaMemcpyAsync(b->host, b->res, (size_t)b->n * sizeof(wsync_kdelta_result_t),
                        cudaMemcpyDeviceToHost, s);
    if (e != cudaSuccess)
        return wk_cuda(e, "wsync_kdelta_launch: cudaMemcpyAsync (results)");
    return WSYNC_OK;
}

const wsync_kdelta_result_t *wsync_kdelta_results(const wsync_kdelta_batch_t *b)
{
    return b != NULL ? b->host : NULL;
}

wsync_status_t wsync_kdelta_fault_status(const wsync_kdelta_result_t *r, const char *what)
{
    if (r == NULL || r->fault == WSYNC_KDELTA_NO_FAULT)
        return WSYNC_OK;
    uint32_t code = (uint32_t)(r->fault & 0xff);
    return wsync_err(WSYNC_ERR_INTEGRITY, "%s: block %" PRIu64 ": %s", what ? what : "encoded chunk",
                     r->fault >> 8, code < 4 ? wk_fault_names[code] : "unknown fault");
}

void wsync_kdelta_info(const wsync_kdelta_batch_t *b, uint32_t *nchunks, uint64_t *nblocks,
                       uint64_t *device_bytes)
{
    if (nchunks != NULL)
        *nchunks = b != NULL ? b->n : 0;
    if (nblocks != NULL)
        *nblocks = b != NULL ? b->nblocks : 0;
    if (device_bytes != NULL)
        *device_bytes = b != NULL ? b->dev_bytes : 0;
}

void wsync_kdelta_free(wsync_kdelta_batch_t *b)
{
    wk_batch_release(b);
}

wsync_status_t wsync_kdelta_copy_desc(const void *src_base, const wsync_region_t *src,
                                      void *dst_base, const wsync_region_t *dst, uint32_t esize,
                                      wsync_kcopy_t *out)
{
    static const char fn[] = "wsync_kdelta_copy_desc";
    if (src_base == NULL || src == NULL || dst_base == NULL || dst == NULL || out == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: NULL argument", fn);
    if (wk_esize_group(esize) < 0)
        return wsync_err(WSYNC_ERR_INVALID, "%s: esize %" PRIu32 " (1, 2, 4 or 8)", fn, esize);
    if (src->rows != dst->rows || src->cols != dst->cols)
        return wsync_err(WSYNC_ERR_INVALID, "%s: source region %" PRIu64 " x %" PRIu64
                         " and destination %" PRIu64 " x %" PRIu64 " differ", fn, src->rows,
                         src->cols, dst->rows, dst->cols);
    wsync_kcopy_t c;
    c.src = src_base;
    c.dst = dst_base;
    c.src_off = src->off * esize;
    c.src_pitch = src->pitch * esize;
    c.dst_off = dst->off * esize;
    c.dst_pitch = dst->pitch * esize;
    c.rows = src->rows;
    c.cols = src->cols * esize;
    c.src_dtype = WSYNC_DTYPE_U8;
    c.dst_dtype = WSYNC_DTYPE_U8;
    *out = c;
    return WSYNC_OK;
}

wsync_status_t wsync_kdelta_xxh3(const void *data, const uint64_t *offs, const uint64_t *lens,
                                 uint32_t n, uint64_t *out, void *stream)
{
    if (n == 0)
        return WSYNC_OK;
    if (data == NULL || offs == NULL || lens == NULL || out == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_kdelta_xxh3: NULL argument");
    wk_xxh3_ranges<<<n, WK_THREADS, 0, (cudaStream_t)stream>>>(
        (const unsigned char *)data, offs, lens, out);
    return wk_launched("wsync_kdelta_xxh3: kernel launch");
}

}   /* extern "C" */
