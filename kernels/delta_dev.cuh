/* The delta codec's device pieces that kernels/delta_encode.cu, kernels/delta_apply.cu and
 * kernels/delta.cu share (internal: included by those three only): the codec block and
 * chunk cursors, a chunk and a batch as the kernels see them, the block sizes of the format,
 * the CTA kernels' block loads and stores and mask scans, the warp kernels' vectors and register
 * XXH3, and the two launchers. kernels/delta.cu's opening comment says how the kernels work. */
#ifndef WSYNC_KERNELS_DELTA_DEV_CUH
#define WSYNC_KERNELS_DELTA_DEV_CUH

#include "kernels/common.cuh"
#include "kernels/delta.h"
#include "kernels/vdiff.h"
#include "kernels/xxh3.cuh"

extern "C" {
#include "core/delta.h"
}

#include <cuda_runtime.h>
#include <stdint.h>

#define WK_DBLK 4096u                  /* elements per codec block: WSYNC_DELTA_BLOCK */
#define WK_MWORDS (WK_DBLK / 32)       /* mask words per block */
/* Codec blocks resident per SM that the register budget must allow (<= 32 registers): a block's
 * life has stretches without loads in flight (ballots, hash, the cursor's round trip), so
 * bandwidth comes from many blocks per SM (with bf16, shared memory allows 8 too). */
#define WK_DMIN_BLOCKS 8

static_assert(WK_DBLK == WSYNC_DELTA_BLOCK, "the kernels' block is the format's");
static_assert(WK_THREADS == 256, "the hash and the prefix counts assume 256 threads");

/* A chunk's cursor in the encode (status[block0], its first block's word): the changed elements
 * of the blocks that took an offset << WK_CUR_KSHIFT | their payloads' 8-byte words. Format 3
 * lets payloads lie in any order, so a block takes its offset and adds its k with one atomicAdd
 * (no block waits for another), and wk_delta_chunk_hash reads the chunk's length and changed
 * count from it. n * esize < 2^32: the words stay below 2^30, k's sum below 2^32. */
#define WK_CUR_KSHIFT 30
#define WK_CUR_WORDS ((UINT64_C(1) << WK_CUR_KSHIFT) - 1)
__device__ __forceinline__ unsigned long long wk_cur_add(uint32_t k, uint64_t size)
{
    return (unsigned long long)k << WK_CUR_KSHIFT | (unsigned long long)(size / 8);
}

/* An applied block's share of its chunk's result, one atomicAdd: k into `changed`'s low
 * WK_APP_SHIFT bits, its payload's 8-byte words above (n * esize < 2^32: both fit);
 * wsync_kdelta_results splits them and checks that the payloads fill the stream's payload area
 * (format 3 lets them lie anywhere in it). That one fault is found after the blocks were applied
 * (the version fails all the same). A second atomicAdd a block for the bytes made the apply
 * 7 % slower on an H100 (every block's atomics go to the chunk's one result). */
#define WK_APP_SHIFT 33
__device__ __forceinline__ void wk_app_count(wsync_kdelta_result_t *res, uint32_t idx, uint32_t k,
                                             uint64_t size)
{
    atomicAdd(reinterpret_cast<unsigned long long *>(&res[idx].changed),
              (unsigned long long)k | (unsigned long long)(size / 8) << WK_APP_SHIFT);
}

/* The results an apply launch leaves for the next one, the other half of its double buffer
 * (r NULL: none): CTA 0 of the launch's first kernel sets them to their starting values, so
 * that no init kernel stands before an apply's own (it had cost 2-3 us a launch). */
typedef struct {
    wsync_kdelta_result_t *r;
    uint32_t n;
} wk_reset_t;

__device__ __forceinline__ void wk_reset(const wk_reset_t &z)
{
    if (z.r != NULL && blockIdx.x == 0)
        for (uint32_t i = threadIdx.x; i < z.n; i += blockDim.x) {
            z.r[i].len = 0;
            z.r[i].hash = 0;
            z.r[i].changed = 0;
            z.r[i].fault = WSYNC_KDELTA_NO_FAULT;
        }
}

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
    uint32_t fast;                     /* the warp kernels take its full blocks: dense, new and
                                          old (encode) or the target (apply) 16-byte aligned */
} wk_dchunk_t;

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

/* Store the block's values from shared `sv` (all len of them) to the region at `base`: all of
 * them (all), or those whose mask bit is set. On a dense 16-byte aligned region the latter
 * writes each 32-byte sector with a set bit whole, in 16-byte vectors (its unchanged elements
 * take their own values again): a write of a few bytes is a read-modify-write in the memory
 * system, and past a few percent changed most sectors have a change. */
template <int E>
__device__ __forceinline__ void wk_store_block(const wk_dchunk_t &d, unsigned char *base,
                                               uint64_t first, uint32_t len,
                                               const unsigned char *sv, const uint32_t *mask,
                                               bool all)
{
    typedef typename wk_elem<E>::t el;
    constexpr uint32_t VE = 16 / E;                        /* elements a vector */
    constexpr uint32_t SB = 2 * VE >= 32 ? 0xffffffffu : (1u << (2 * VE)) - 1u;   /* a sector's */
    unsigned char *a = base + (d.dense ? first * E : 0);
    uint32_t done = 0;
    if (d.dense && ((uintptr_t)a & 15) == 0) {
        const uint32_t nvec = len / VE;
        for (uint32_t v = threadIdx.x; v < nvec; v += WK_THREADS) {
            const uint32_t e0 = (v & ~1u) * VE;   /* the first element of v's sector */
            if (all || ((mask[e0 >> 5] >> (e0 & 31)) & SB) != 0)
                reinterpret_cast<uint4 *>(a)[v] = reinterpret_cast<const uint4 *>(sv)[v];
        }
        done = nvec * VE;
    }
    for (uint32_t i = done + threadIdx.x; i < len; i += WK_THREADS) {
        if (!all && !((mask[i >> 5] >> (i & 31)) & 1u))
            continue;
        uint64_t off = d.dense ? (uint64_t)i * E : wk_eoff(d, first + i, E);
        *reinterpret_cast<el *>((d.dense ? a : base) + off) = reinterpret_cast<const el *>(sv)[i];
    }
}

/* A lane's share of a full block's mask words, the whole warp calling: m holds words 4 lane ..
 * 4 lane + 3. cnt: their changed elements; inc (with INC; else cnt): the changed elements up to
 * and including them (scanned beside the last position, in the same shuffles); prev: the last
 * changed position before them (-1: none); es: the escape bytes their positions take in a
 * SPARSE index (a gap of 255 or more never lies inside a word, so only a word's first change
 * can have escapes, its gap counted from the change before it). */
typedef struct {
    uint32_t cnt, inc, es;
    int prev;
} wkw_words_t;

template <bool INC>
__device__ __forceinline__ wkw_words_t wkw_words(const uint32_t m[4], uint32_t lane)
{
    wkw_words_t r;
    uint32_t cnt = 0;
    int last = -1;
#pragma unroll
    for (int w = 0; w < 4; w++) {
        cnt += (uint32_t)__popc(m[w]);
        if (m[w] != 0)
            last = (int)(4 * lane + w) * 32 + 31 - __clz((int)m[w]);
    }
    uint32_t inc = cnt;
    int lmax = last;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
        uint32_t t = 0;
        if constexpr (INC)
            t = __shfl_up_sync(WK_FULL, inc, o);
        const int tl = __shfl_up_sync(WK_FULL, lmax, o);
        if (lane >= (uint32_t)o) {
            if constexpr (INC)
                inc += t;
            lmax = tl > lmax ? tl : lmax;
        }
    }
    int p = __shfl_up_sync(WK_FULL, lmax, 1);
    if (lane == 0)
        p = -1;
    r.prev = p;
    uint32_t es = 0;
#pragma unroll
    for (int w = 0; w < 4; w++) {
        if (m[w] != 0) {
            const int q = (int)(4 * lane + w) * 32;
            es += (uint32_t)(q + __ffs((int)m[w]) - 1 - p - 1) / 255u;
            p = q + 31 - __clz((int)m[w]);
        }
    }
    r.cnt = cnt;
    r.inc = inc;
    r.es = es;
    return r;
}

/* The sum of x over this lane and the lanes before it (the whole warp calls it). */
__device__ __forceinline__ uint32_t wkw_incl(uint32_t x)
{
    const uint32_t lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
        const uint32_t t = __shfl_up_sync(WK_FULL, x, o);
        if (lane >= (uint32_t)o)
            x += t;
    }
    return x;
}

/* ------------------------------------------------------------------------------------------ */
/* Vectors in registers, the register XXH3 of a full block (both kernel sets)                   */
/* ------------------------------------------------------------------------------------------ */

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

/* Bit e set when element e of a and b differ: 2- and 1-byte elements in word operations
 * (kernels/vdiff.h: about 6 per word where the loop below compiled to about 10 per element
 * pair), 4- and 8-byte ones by the loop. */
template <int E>
__device__ __forceinline__ uint32_t wk_vdiff(const uint4 &a, const uint4 &b)
{
    if constexpr (E == 2) {
        return wk_vdiff2(a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w);
    } else if constexpr (E == 1) {
        return wk_vdiff1(a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w);
    } else {
        uint32_t bits = 0;
#pragma unroll
        for (int e = 0; e < 16 / E; e++)
            bits |= (uint32_t)(wk_vget<E>(a, e) != wk_vget<E>(b, e)) << e;
        return bits;
    }
}

/* Vector v's bits into the mask words (every lane of the warp calls it, with v = threadIdx.x +
 * WK_THREADS * it: the lanes of a mask word are neighbours). A vector of 2- or 1-byte elements
 * fills a whole byte or half-word of its mask word (little-endian: vector v's bits are byte v,
 * or half-word v, of the words), so it is stored alone; 4- and 8-byte elements fill 4 or 2 bits,
 * joined by shuffles. */
template <int E>
__device__ __forceinline__ void wk_put_bits(uint32_t bits, uint32_t v, uint32_t *mask)
{
    if constexpr (E == 2) {
        reinterpret_cast<uint8_t *>(mask)[v] = (uint8_t)bits;
    } else if constexpr (E == 1) {
        reinterpret_cast<uint16_t *>(mask)[v] = (uint16_t)bits;
    } else {
        constexpr uint32_t VE = 16 / E, G = 32 / VE;
        uint32_t x = bits << ((v % G) * VE);
#pragma unroll
        for (uint32_t o = 1; o < G; o *= 2)
            x |= __shfl_xor_sync(WK_FULL, x, o);
        if (v % G == 0)
            mask[v / G] = x;
    }
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

/* The XXH3 leaf of a block's len values in shared sv, by the whole CTA (WK_THREADS threads):
 * a full block's stripe terms by every thread and the scrambles by warp 1, a tail block by
 * wk_xxh3; one thread writes it to *leaf. hsum is the CTA's scratch; the caller's barrier comes
 * before anything reads *leaf. */
template <int E>
__device__ __forceinline__ void wk_block_leaf(const unsigned char *sv, uint32_t len,
                                              const uint64_t *sec, uint64_t *hsum, uint64_t *leaf)
{
    const int tid = threadIdx.x;
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
                *leaf = h;
        }
    } else {
        const uint64_t h = wk_xxh3(sv, (uint64_t)len * E,
                                   reinterpret_cast<const unsigned char *>(sec), hsum);
        if (tid == 0)
            *leaf = h;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The warp kernels' CTAs, a batch, the launchers                                               */
/* ------------------------------------------------------------------------------------------ */

/* CTAs per SM the warp kernels' register budget must allow (64 registers a thread): a warp keeps
 * one 1 KiB segment of new and old in flight (the next one's loads issued before the work on
 * this one), so bandwidth comes from many warps per SM. */
#ifndef WKW_MIN_BLOCKS   /* -DWKW_MIN_BLOCKS=N builds a variant to measure */
#define WKW_MIN_BLOCKS 8   /* 32 warps an SM */
#endif
#ifndef WKW_THREADS   /* -DWKW_THREADS=N (with WKW_MIN_BLOCKS) builds a variant to measure */
#define WKW_THREADS 128   /* 4 warps: a CTA's slot frees sooner (encode at 5 %: 4 % faster) */
#endif
#define WKW_WARPS (WKW_THREADS / 32)   /* codec blocks per CTA */
/* The index bytes of the SPARSE blocks the warp apply takes in one pass (wkw_sparse_small in
 * kernels/delta_apply.cu); its launcher's choice of kernel follows from it (kernels/delta.cu). */
#define WKW_SMALL 256u

struct wsync_kdelta_batch {
    int apply;                         /* apply batch, else encode */
    int flag;                          /* encode: update_old; apply: hash */
    uint32_t n;
    uint64_t nblocks;
    void *dev;                         /* one allocation: */
    wk_dchunk_t *chunks;               /*   [n], grouped by element size */
    uint64_t *lens;                    /*   [n] apply: lengths, caller's order */
    unsigned long long *status;        /*   [nblocks + 4] encode: a chunk's cursor at its first
                                          block's word, the block counters;
                                          [4 * nblocks] apply with the hash: the warp apply's
                                          records (wkw_apply_entries) */
    uint64_t *leaves;                  /*   [nblocks] */
    wsync_kdelta_result_t *res;        /*   [n] encode, [2n] apply: a half a launch, by turns */
    uint32_t *glist;                   /*   [nblocks] the CTA kernels' blocks */
    uint32_t *bmap;                    /*   [nblocks] each block's chunk (its place in chunks) */
    uint64_t dev_bytes;
    wsync_kdelta_result_t *host;       /* pinned [n] */
    wsync_kdelta_result_t *host_dev;   /* encode: host as the chunk hash kernel writes it */
    int clean;                         /* encode: cursors and counters 0; apply: the half of res
                                          for the next launch reset (no init kernel) */
    int half;                          /* apply: res's half for the next launch */
    uint64_t *lens_host;               /* pinned [n] apply: the lengths of the next launch */
    uint64_t *lens_default;            /* malloc [n] apply: those given at create */
    uint8_t *esz;                      /* malloc [n] apply: element sizes, caller's order */
    uint64_t *nbl;                     /* malloc [n] apply: blocks of each chunk, caller's order */
    int lens_changed;                  /* a launch gave other lengths than the default */
    uint64_t elems, plain_bytes;       /* the chunks' elements and their bytes */
    int launched;                      /* a launch's results were copied (res_ev recorded) */
    int split;                         /* apply: wsync_kdelta_results split the last launch's
                                          counts (wk_app_count) */
    int warp_enc;                      /* encode: the warp kernels for the next launch */
    cudaEvent_t res_ev;                /* after the last launch's copy of the results */
    struct {
        uint32_t c0, cf, c1;           /* chunks: [c0, cf) the warp encoder's, [cf, c1) not */
        uint64_t g0, gf, g1;           /* their blocks */
        uint64_t l0, nl;               /* glist[l0, l0 + nl): the CTA kernels' blocks
                                          (relative to g0): [cf, c1)'s and [c0, cf)'s tails */
    } grp[4];
};

/* Group grp's blocks as a launcher runs them: [g0, g0 + nb); the first nw for the warp kernel
 * (when warp, else none); nl left to the CTA kernel, listed in gl (NULL: all nb, in order). */
typedef struct {
    uint64_t g0, nb, nw, nl;
    const uint32_t *gl;
} wk_group_span_t;

static inline wk_group_span_t wk_group_span(const wsync_kdelta_batch_t *b, int grp, int warp)
{
    wk_group_span_t sp;
    sp.g0 = b->grp[grp].g0;
    sp.nb = b->grp[grp].g1 - sp.g0;
    sp.nw = warp ? b->grp[grp].gf - sp.g0 : 0;
    sp.nl = warp ? b->grp[grp].nl : sp.nb;
    sp.gl = sp.nl == sp.nb ? NULL : b->glist + b->grp[grp].l0;
    return sp;
}

/* Every encode (kernels/delta_encode.cu) or apply (kernels/delta_apply.cu) kernel of a launch of
 * b on stream s, group by group; warp: the warp kernels take the full blocks of fast chunks. */
void wk_delta_launch_encode(const wsync_kdelta_batch_t *b, cudaStream_t s, int warp);
void wk_delta_launch_apply(const wsync_kdelta_batch_t *b, cudaStream_t s, int warp,
                           wsync_kdelta_result_t *res, wk_reset_t z);

/* The CTA encoder of 8-byte elements may take 64 KiB of dynamic shared memory a block (past the
 * default 48). */
cudaError_t wk_delta_encode_smem8(void);

#endif
