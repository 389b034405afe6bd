/* The delta codec of core/delta.h on the GPU: batched encode and apply, and XXH3_64bits on the
 * device (kernels/delta.h says what and why).
 *
 * Encode, two kernels. wkw_delta_encode (the default for full blocks of chunks that are dense
 * with new and old 16-byte aligned: what buckets hold): a warp per codec block of WK_DBLK
 * elements, no CTA barrier; it reads new and old once in 16-byte vectors, compares them into
 * mask words, the next segment's loads issued before the work on this one, keeps the changed
 * vectors in a shared-memory stash, sums XXH3's stripe terms from registers (keys fixed per
 * lane) and runs the scrambles on every lane, scans the 128 mask words four per lane (k, e,
 * ranks, escapes), and writes the payload straight to the output from each lane's set bits, the
 * values from the stash. wk_delta_encode (the
 * rest: strided or unaligned chunks, tail blocks): one CTA of WK_THREADS threads per codec block,
 * the values staged in shared memory; it runs after the warp encoder in the same stream, over a
 * list of its blocks (glist). Both find a block's payload offset by a decoupled look-back over
 * the blocks before it in its chunk (block numbers drawn in order from a counter, so a block
 * only waits for blocks that running warps or CTAs hold; a tail block's predecessors were
 * finished by the warp encoder), so that new and old are read once. WSYNC_KDELTA_OLD=1 runs
 * wk_delta_encode for every block (the kernels before the warp encoder, to compare in one run).
 *
 * Mask words and escapes: SPARSE's byte-gap index (format 2) needs, per element, the escapes
 * before it: a gap of 255 or more never lies inside a mask word, so only a word's first element
 * has escapes, and a scan over the words (last changed position: max; escapes: sum) places
 * every index byte. The leaf XXH3 of a full block: XXH3's long loop adds per-stripe terms that
 * depend only on data and secret, so they are summed per accumulator and 1 KiB segment by
 * shuffles, and only the scrambles run in order.
 *
 * Apply, two kernels with the same checks and faults, every check before any write.
 * wkw_delta_apply (full blocks of dense 16-byte aligned targets): a warp per block; lane 0 checks
 * the header and the entry (with the hash: a thread per block checked them all first), a SPARSE
 * index stream is cut into 32 runs placed by a warp scan of (position advance, is-element), a
 * BITMAP's words are scanned four a lane; without the hash only changed values are written; with
 * it a small SPARSE block (every block at a few percent changed) is merged, written in whole
 * sectors and hashed in one pass over the block, and any other block is applied, then read back
 * once and hashed from registers. wk_delta_apply (the rest, and every block with WSYNC_KDELTA_OLD=1): one CTA per
 * block, thread 0 checks, a block-wide scan decodes, the values staged in shared memory for the
 * hash. A CTA per block kept 8 blocks per SM in flight, each waiting on a chain of dependent
 * loads (block map, descriptor, length, header and entry, payload): apply was latency-bound.
 *
 * Traffic, 1 GiB of bf16 in 64 chunks at 1 % changed (the bench of test_delta_kernels): encode
 * reads new and old once (2 GiB) and writes the stream (table 1 MiB, payloads ~1.7 % of 1 GiB:
 * a SPARSE block of k ~ 41 is al8(k + e) + al8(2k) ~ 136 bytes), the leaves and look-back words
 * (1 MiB each); apply with the hash reads the target once (1 GiB), the stream (~18 MiB), and
 * writes the ~38 sectors with a change of each block whole; without the hash the ~41 changed
 * values (partial 32-byte sectors: a read-modify-write in the memory system). The
 * target (issue 17): encode + apply <= 1.5 x reading both versions once (an amax over both, or a
 * D2D copy of one: 0.70 ms on an H100), counting the apply without the receiver's hash (the
 * separate check, one more read of the new values; test_delta_kernels prints both ratios). The
 * scatter of the changed values alone takes 0.40 (H100) to 0.48 (H200) of reading both, so no
 * codec of this format gets under 1.40-1.48.
 * Instructions of the warp encoder per 16 bytes of each version (bf16, ptxas: 64 registers, 4
 * bytes of spills): two 16-byte loads, the compare into 8 bits (wk_vdiff: four min.u16x2 on sm_90) stored
 * as one mask byte, two 32 x 32 multiplies and four 64-bit adds of hash terms; per 1 KiB segment
 * 6 shuffles and one scramble; per block the scan (about 40 shuffles) and about one set bit per
 * lane at 1 %. Cutting the loop from 406 to 230 PTX instructions per two segments gained 2 % on
 * an H200: the encoder waits on memory. Since session 36 it reads both versions at 0.77 (H200)
 * to 0.88 (H100) times the speed of reading them alone, and the apply without the hash takes
 * 1.12 times a bare scatter of the changed values (docs/delta.md, "The GPU codec"). The
 * old encoder (Nsight on an H100: 1.55 ms, 1.40 TB/s, 78 % of issue slots busy) spent tens of
 * instructions per element in flags, ballots, a one-warp word scan, 8-lane scrambles and eight
 * CTA barriers a block.
 */
#include "kernels/common.cuh"
#include "kernels/delta.h"
#include "kernels/vdiff.h"
#include "kernels/xxh3.cuh"

extern "C" {
#include "core/delta.h"
}

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define WK_DBLK 4096u                  /* elements per codec block: WSYNC_DELTA_BLOCK */
#define WK_MWORDS (WK_DBLK / 32)       /* mask words per block */
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

/* ------------------------------------------------------------------------------------------ */
/* Encode                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* One CTA per block: blocks [g0, g0 + gridDim.x), or g0 + glist[0 .. gridDim.x) (ascending:
 * what the warp encoder leaves, tail blocks and chunks it cannot take), all of element size E.
 * Shared memory (dynamic): the new values [WK_DBLK * E], then the payload being built
 * [WK_DBLK * E] (the changed flags before it). */
/* An encoded block's table entry (and the chunk's header from its first block), its hash leaf
 * and its share of the chunk's results: one thread of the block's encoder. */
template <int E>
__device__ __forceinline__ void wk_block_entry(const wk_dchunk_t &d, uint32_t j, uint64_t g,
                                               uint64_t off, uint64_t pos, uint64_t size,
                                               uint32_t mode, uint32_t e, uint32_t k,
                                               uint64_t leaf, uint64_t *leaves,
                                               wsync_kdelta_result_t *res)
{
    if (16 + 8 * ((uint64_t)j + 1) <= d.cap)
        reinterpret_cast<uint64_t *>(d.out + 16)[j] =
            off | ((uint64_t)((mode << 30) | (e << 16) | k) << 32);
    if (j == 0 && d.cap >= 16) {
        reinterpret_cast<uint64_t *>(d.out)[0] =
            WSYNC_DELTA_MAGIC | ((uint64_t)WSYNC_DELTA_FORMAT << 32) | ((uint64_t)E << 40);
        reinterpret_cast<uint64_t *>(d.out)[1] = d.n;
    }
    leaves[g] = leaf;
    if (k > 0)
        atomicAdd(reinterpret_cast<unsigned long long *>(&res[d.idx].changed),
                  (unsigned long long)k);
    if (j == d.nb - 1)
        res[d.idx].len = pos + size;
}

template <int E>
__global__ void __launch_bounds__(WK_THREADS, WK_DMIN_BLOCKS)
wk_delta_encode(const wk_dchunk_t *__restrict__ ch, const uint32_t *__restrict__ bmap, uint64_t g0,
                const uint32_t *__restrict__ glist, unsigned long long *status,
                unsigned int *counter, uint64_t *leaves, wsync_kdelta_result_t *res, int update_old)
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
        const uint32_t i = atomicAdd(counter, 1u);
        const uint64_t g = g0 + (glist != NULL ? glist[i] : i);
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
    if (tid == 0)
        wk_block_entry<E>(d, j, g, off, pos, size, mode, e, k, sh_leaf, leaves, res);

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
/* Encode, a warp per block: full blocks of dense chunks with 16-byte aligned starts (default)  */
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
/* Changed 16-byte vectors the warp encoder keeps in shared memory for the payload (2 KiB a warp):
 * a block of 2-byte elements at 1 % changed has about 40, at 5 % about 170 (those past 128 are
 * read again from the new version). */
#define WKW_STASH 128

/* Blocks [g0, g0 + nblk) of chunks that are dense with new and old 16-byte aligned, element size
 * E; each warp of the grid claims one from *counter (in order, for the look-back) and leaves
 * tail blocks (fewer than WK_DBLK elements) to wk_delta_encode. No CTA barrier after the secret's
 * load: a warp reads its block once in 16-byte vectors, one 1 KiB segment of new and old per
 * step, and keeps everything else in registers but the mask words (512 bytes a warp):
 *  - compare, the loads of the next segment issued before the work on this one (the stores to
 *    the baseline would keep the compiler from moving them up): the changed bits of each vector
 *    (wk_vdiff) into the mask words (wk_put_bits), each changed vector (elements of at most 4
 *    bytes) into the warp's stash, in order, and with update_old the new values of every
 *    32-byte sector with a change into the baseline;
 *  - the leaf XXH3 as it goes (wkw_hash_t);
 *  - the scan: lane l takes mask words 4l .. 4l + 3 (k, its rank and escape prefix, the last
 *    changed position before it), then publishes the size and looks back as wk_delta_encode;
 *  - the payload: each lane walks the set bits of its words (at 1 % about one per lane), writing
 *    index bytes and values straight to the output (bytes no other lane writes, the padding bytes
 *    included), the values from the stash (a vector's slot: the ballot words' prefix counts),
 *    read again from the new version only past WKW_STASH vectors; PLAIN blocks are copied in
 *    8-byte words, a BITMAP's bitmap is the mask words. Reading the values again from L2 had
 *    kept each warp waiting on loads after its compare (docs/delta.md). */
template <int E>
__global__ void __launch_bounds__(WKW_THREADS, WKW_MIN_BLOCKS)
wkw_delta_encode(const wk_dchunk_t *__restrict__ ch, const uint32_t *__restrict__ bmap,
                 uint64_t g0, uint64_t nblk, unsigned long long *status, unsigned int *counter,
                 uint64_t *leaves, wsync_kdelta_result_t *res, int update_old)
{
    typedef typename wk_elem<E>::t el;
    constexpr uint32_t NSEG = WK_DBLK * E / 1024;   /* 1 KiB segments: two rounds of 512 bytes */
    __shared__ uint64_t sec[24];
    __shared__ __align__(16) uint32_t smask[WKW_WARPS][WK_MWORDS];
    const uint32_t lane = threadIdx.x & 31;
    uint32_t *mask = smask[threadIdx.x >> 5];
    /* the changed vectors, in order, as the compare read them; which vectors (a ballot word per
     * 32 vectors: 2 * NSEG words) and the slots before each word */
    constexpr bool ST = E <= 4;   /* 8-byte elements: 64 ballot words, values read again */
    __shared__ uint4 sstash[WKW_WARPS][WKW_STASH];
    __shared__ uint32_t svb[WKW_WARPS][32], svpre[WKW_WARPS][32];
    uint4 *stash = sstash[threadIdx.x >> 5];
    uint32_t *vb = svb[threadIdx.x >> 5], *vpre = svpre[threadIdx.x >> 5];
    uint32_t nst = 0;
    const uint32_t ltm = (1u << lane) - 1u;

    wk_secret_load(sec);
    __syncthreads();
    uint32_t bi = 0;
    if (lane == 0)
        bi = atomicAdd(counter, 1u);
    bi = __shfl_sync(WK_FULL, bi, 0);
    if (bi >= nblk)
        return;
    const uint64_t g = g0 + bi;
    const wk_dchunk_t d = ch[bmap[g]];
    const uint32_t j = (uint32_t)(g - d.block0);
    const uint64_t first = (uint64_t)j * WK_DBLK;
    if (d.n - first < WK_DBLK)
        return;   /* a tail block: wk_delta_encode's */
    const uint4 *pa = reinterpret_cast<const uint4 *>(d.a + first * E);
    uint4 *pb = reinterpret_cast<uint4 *>(d.b + first * E);   /* read, and updated */

    /* 1. compare and hash, a segment per step */
    wkw_hash_t h;
    wkw_hash_init(h, sec);
    uint4 nx0 = pa[lane], ny0 = pb[lane], nx1 = pa[lane + 32], ny1 = pb[lane + 32];
#pragma unroll
    for (uint32_t s = 0; s < NSEG; s++) {
        const uint32_t v0 = 64 * s + lane, v1 = v0 + 32;
        const uint4 x0 = nx0, y0 = ny0, x1 = nx1, y1 = ny1;
        if (s + 1 < NSEG) {
            nx0 = pa[v0 + 64];
            ny0 = pb[v0 + 64];
            nx1 = pa[v1 + 64];
            ny1 = pb[v1 + 64];
        }
        const uint32_t c0 = wk_vdiff<E>(x0, y0), c1 = wk_vdiff<E>(x1, y1);
        wk_put_bits<E>(c0, v0, mask);
        wk_put_bits<E>(c1, v1, mask);
        if constexpr (ST) {
            const uint32_t bb0 = __ballot_sync(WK_FULL, c0 != 0), bb1 = __ballot_sync(WK_FULL, c1 != 0);
            const uint32_t s0 = nst + __popc(bb0 & ltm), s1 = nst + __popc(bb0) + __popc(bb1 & ltm);
            if (c0 != 0 && s0 < WKW_STASH)
                stash[s0] = x0;
            if (c1 != 0 && s1 < WKW_STASH)
                stash[s1] = x1;
            if (lane == 0) {
                vb[2 * s] = bb0;
                vb[2 * s + 1] = bb1;
            }
            nst += __popc(bb0) + __popc(bb1);
        }
        if (update_old) {
            /* the baseline takes the new values of each 32-byte sector with a change, the
             * whole sector (the two lanes' vectors: unchanged elements rewrite their own
             * bytes): a write of a few bytes is a read-modify-write in the memory system */
            if ((c0 | __shfl_xor_sync(WK_FULL, c0, 1)) != 0)
                pb[v0] = x0;
            if ((c1 | __shfl_xor_sync(WK_FULL, c1, 1)) != 0)
                pb[v1] = x1;
        }
        wkw_hash_segment<WK_DBLK * E>(h, x0, x1, s, sec);
    }
    __syncwarp();

    if constexpr (ST) {   /* the slots before each ballot word */
        const uint32_t c = lane < 2 * NSEG ? (uint32_t)__popc(vb[lane]) : 0;
        vpre[lane] = wkw_incl(c) - c;
        __syncwarp();
    }
    /* 2. the mask words' scan: lane l's words 4l .. 4l + 3 */
    const uint4 mv = reinterpret_cast<const uint4 *>(mask)[lane];
    const uint32_t m[4] = {mv.x, mv.y, mv.z, mv.w};
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
        const uint32_t t = __shfl_up_sync(WK_FULL, inc, o);
        const int tl = __shfl_up_sync(WK_FULL, lmax, o);
        if (lane >= (uint32_t)o) {
            inc += t;
            lmax = tl > lmax ? tl : lmax;
        }
    }
    int prev0 = __shfl_up_sync(WK_FULL, lmax, 1);   /* the last change before lane's words */
    if (lane == 0)
        prev0 = -1;
    uint32_t es = 0;   /* escapes of lane's words: only a word's first change can have them */
    {
        int p = prev0;
#pragma unroll
        for (int w = 0; w < 4; w++) {
            if (m[w] != 0) {
                const int q = (int)(4 * lane + w) * 32;
                es += (uint32_t)(q + __ffs((int)m[w]) - 1 - p - 1) / 255u;
                p = q + 31 - __clz((int)m[w]);
            }
        }
    }
    const uint32_t einc = wkw_incl(es);
    const uint32_t k = __shfl_sync(WK_FULL, inc, 31), etot = __shfl_sync(WK_FULL, einc, 31);
    uint32_t mode;
    const uint64_t size = wk_bbytes(WK_DBLK, k, etot, E, &mode);
    const uint32_t e = mode == WSYNC_DELTA_SPARSE ? etot : 0;   /* the table's e */

    /* 3. publish the size, finish the hash, find the offset (as wk_delta_encode) */
    if (lane == 0)
        atomicExch(&status[g], (unsigned long long)((j == 0 ? WK_LB_INC : WK_LB_AGG) | size));
    const uint64_t leaf = wkw_hash_final<WK_DBLK * E>(h, sec);
    uint64_t off = 0;
    if (j > 0) {
        int64_t p = (int64_t)j - 1;   /* the nearest predecessor not yet summed */
        for (;;) {
            const int64_t q = p - lane;
            const uint64_t w = q >= 0 ? *(volatile unsigned long long *)&status[d.block0 + (uint64_t)q]
                                      : WK_LB_INC;   /* before the chunk: nothing */
            const uint32_t st = (uint32_t)(w >> 62);
            const uint32_t xm = __ballot_sync(WK_FULL, st == 0), im = __ballot_sync(WK_FULL, st == 2);
            const uint32_t lowi = im ? (uint32_t)__ffs((int)im) - 1 : 32;
            const uint32_t lowx = xm ? (uint32_t)__ffs((int)xm) - 1 : 32;
            if (lowx < lowi) {   /* a nearer block has not published yet */
                __nanosleep(64);
                continue;
            }
            uint64_t v = lane <= lowi ? (w & WK_LB_VAL) : 0;
#pragma unroll
            for (int o = 16; o > 0; o /= 2)
                v += __shfl_xor_sync(WK_FULL, v, o);
            off += v;
            if (lowi < 32)
                break;
            p -= 32;
        }
        if (lane == 0)
            atomicExch(&status[g], (unsigned long long)(WK_LB_INC | (off + size)));
    }
    const uint64_t pos = 16 + 8 * (uint64_t)d.nb + off;

    /* 4. table entry, header, results */
    if (lane == 0)
        wk_block_entry<E>(d, j, g, off, pos, size, mode, e, k, leaf, leaves, res);

    /* 5. the payload, straight to the output */
    const bool fits = size > 0 && pos + size <= d.cap;
    unsigned char *to = d.out + pos;   /* 8-byte aligned */
    if (fits && mode == WSYNC_DELTA_PLAIN) {
        const uint64_t *src = reinterpret_cast<const uint64_t *>(d.a + first * E);
        for (uint32_t w = lane; w < WK_DBLK * E / 8; w += 32)
            reinterpret_cast<uint64_t *>(to)[w] = src[w];
    }
    const bool idx = fits && mode != WSYNC_DELTA_PLAIN;   /* SPARSE or BITMAP */
    const uint64_t hdr = mode == WSYNC_DELTA_SPARSE ? wk_al8((uint64_t)k + etot) : WK_DBLK / 8;
    if (idx) {
        if (mode == WSYNC_DELTA_BITMAP) {   /* the bitmap is the mask words, 512 bytes */
            reinterpret_cast<uint64_t *>(to)[2 * lane] = (uint64_t)m[1] << 32 | m[0];
            reinterpret_cast<uint64_t *>(to)[2 * lane + 1] = (uint64_t)m[3] << 32 | m[2];
        }
        /* the padding bytes after the index stream and after the values */
        if (lane < 8) {
            if (mode == WSYNC_DELTA_SPARSE && (uint64_t)k + etot + lane < hdr)
                to[k + etot + lane] = 0;
            if (hdr + (uint64_t)k * E + lane < size)
                to[hdr + (uint64_t)k * E + lane] = 0;
        }
    }
    if (idx) {
        const el *nv = reinterpret_cast<const el *>(d.a + first * E);
        uint32_t r = inc - cnt, ex = einc - es;   /* rank and escapes before lane's first change */
        int p = prev0;
#pragma unroll
        for (int w = 0; w < 4; w++) {
            uint32_t mm = m[w];
            while (mm != 0) {
                const uint32_t i = (4 * lane + w) * 32 + (uint32_t)__ffs((int)mm) - 1;
                mm &= mm - 1;
                if (mode == WSYNC_DELTA_SPARSE) {
                    /* the gap: floor(gap / 255) escape bytes, then gap mod 255 */
                    const uint32_t gap = (uint32_t)((int)i - p - 1), ne = gap / 255u;
                    for (uint32_t x = 0; x < ne; x++)
                        to[r + ex + x] = 0xff;
                    ex += ne;
                    to[r + ex] = (unsigned char)(gap - 255u * ne);
                }
                const uint32_t vi = i * E / 16;   /* its vector, and that vector's slot */
                const uint32_t sl = ST ? vpre[vi >> 5] + __popc(vb[vi >> 5] & ((1u << (vi & 31)) - 1u))
                                       : WKW_STASH;
                *reinterpret_cast<el *>(to + hdr + (uint64_t)r * E) =
                    sl < WKW_STASH ? reinterpret_cast<const el *>(stash)[sl * (16 / E) + i % (16 / E)]
                                   : nv[i];
                p = (int)i;
                r++;
            }
        }
    }
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

/* One CTA per block: blocks [g0, g0 + gridDim.x), or g0 + glist[0 .. gridDim.x) (what the warp
 * apply leaves: tail blocks and chunks it cannot take), element size E: check, apply, hash.
 * Shared memory (dynamic): the block's values [WK_DBLK * E] (with hash). At 32 registers it
 * spills 108-260 bytes a thread (Nsight: 17.8 M local requests on the bench); at 64 (4 CTAs per
 * SM) it does not, but keeps half the blocks in flight. */
template <int E>
__global__ void __launch_bounds__(WK_THREADS, WK_DMIN_BLOCKS)
wk_delta_apply(const wk_dchunk_t *__restrict__ ch, const uint32_t *__restrict__ bmap, uint64_t g0,
               const uint32_t *__restrict__ glist, const uint64_t *lens, uint64_t *leaves,
               wsync_kdelta_result_t *res, int hash)
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
    const uint64_t g = g0 + (glist != NULL ? glist[blockIdx.x] : blockIdx.x);

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

/* Exclusive warp-wide prefix sums of two counts: *ea, *eb over the lanes before this one, *ta,
 * *tb the totals. */
__device__ __forceinline__ void wkw_scan2(uint32_t a, uint32_t b, uint32_t *ea, uint32_t *eb,
                                          uint32_t *ta, uint32_t *tb)
{
    const uint32_t lane = threadIdx.x & 31;
    uint32_t ia = a, ib = b;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
        const uint32_t oa = __shfl_up_sync(WK_FULL, ia, o), ob = __shfl_up_sync(WK_FULL, ib, o);
        if (lane >= (uint32_t)o) {
            ia += oa;
            ib += ob;
        }
    }
    *ea = ia - a;
    *eb = ib - b;
    *ta = __shfl_sync(WK_FULL, ia, 31);
    *tb = __shfl_sync(WK_FULL, ib, 31);
}

/* A block the warp apply takes, as the lane that checked its entry holds it. */
typedef struct {
    const unsigned char *P;            /* its payload (8-byte aligned) */
    unsigned char *tv;                 /* its first target value (16-byte aligned) */
    uint64_t size;                     /* payload bytes */
    uint32_t mode, k, esc;             /* the table entry */
    uint32_t idx, j;                   /* chunk (caller's order) and block in it */
} wkw_ablk_t;

/* Lane `src`'s block to every lane. */
__device__ __forceinline__ wkw_ablk_t wkw_ablk_shfl(const wkw_ablk_t &x, uint32_t src)
{
    wkw_ablk_t y;
    y.P = reinterpret_cast<const unsigned char *>(
        __shfl_sync(WK_FULL, reinterpret_cast<unsigned long long>(x.P), src));
    y.tv = reinterpret_cast<unsigned char *>(
        __shfl_sync(WK_FULL, reinterpret_cast<unsigned long long>(x.tv), src));
    y.size = __shfl_sync(WK_FULL, (unsigned long long)x.size, src);
    /* mode (2 bits), k (<= 4096: 13 bits) and esc (14 bits) in one word */
    const uint32_t mke = __shfl_sync(WK_FULL, x.mode | x.k << 2 | x.esc << 15, src);
    y.mode = mke & 3;
    y.k = (mke >> 2) & 0x1fffu;
    y.esc = mke >> 15;
    y.idx = __shfl_sync(WK_FULL, x.idx, src);
    y.j = __shfl_sync(WK_FULL, x.j, src);
    return y;
}

/* Step 1 of the warp apply, before anything is written: does the payload hold what its entry
 * says? A SPARSE index stream is cut into 32 runs, a warp scan of (position advance,
 * is-element) gives each run its start (*adv0, *cnt0) and each lane checks its positions; a
 * BITMAP's words are scanned four a lane (popcount = k, and the escapes its positions would need
 * as SPARSE: BITMAP must be the format's pick), *rank0 the lane's first rank; the padding after
 * the index and the values must be zero. True (on every lane) when it is bad. */
template <int E>
__device__ __forceinline__ bool wkw_apply_check(const wkw_ablk_t &x, uint64_t *hdr, uint32_t *b0,
                                                uint32_t *b1, uint32_t *adv0, uint32_t *cnt0,
                                                uint32_t (&m)[4], uint32_t *rank0)
{
    const uint32_t lane = threadIdx.x & 31, len = WK_DBLK;
    const unsigned char *P = x.P;
    bool bad = false;
    *hdr = 0;
    if (x.mode == WSYNC_DELTA_SPARSE) {
        const uint32_t nbytes = x.k + x.esc, per = (nbytes + 31) / 32;
        *b0 = lane * per < nbytes ? lane * per : nbytes;
        *b1 = *b0 + per < nbytes ? *b0 + per : nbytes;
        *hdr = wk_al8(nbytes);
        uint32_t adv = 0, cnt = 0;
        for (uint32_t b = *b0; b < *b1; b++) {
            const uint32_t v = P[b];
            adv += v == 0xff ? 255u : v + 1;
            cnt += v != 0xff;
        }
        uint32_t advt, cntt;
        wkw_scan2(adv, cnt, adv0, cnt0, &advt, &cntt);
        /* exactly k elements (so e escapes), no trailing escape: the same on every lane */
        if (cntt != x.k || P[nbytes - 1] == 0xff) {
            bad = true;
        } else {
            uint32_t a = *adv0;
            for (uint32_t b = *b0; b < *b1; b++) {
                const uint32_t v = P[b];
                a += v == 0xff ? 255u : v + 1;
                if (v != 0xff && a - 1 >= len)
                    bad = true;
            }
        }
        for (uint64_t b = nbytes + lane; b < *hdr; b += 32)
            if (P[b] != 0)
                bad = true;
    } else if (x.mode == WSYNC_DELTA_BITMAP) {
        *hdr = WK_DBLK / 8;   /* a full block: 128 words, no bits past it */
        const uint2 w0 = reinterpret_cast<const uint2 *>(P)[2 * lane];
        const uint2 w1 = reinterpret_cast<const uint2 *>(P)[2 * lane + 1];
        m[0] = w0.x;
        m[1] = w0.y;
        m[2] = w1.x;
        m[3] = w1.y;
        uint32_t cnt = 0;
        int last = -1;
#pragma unroll
        for (int w = 0; w < 4; w++) {
            cnt += (uint32_t)__popc(m[w]);
            if (m[w] != 0)
                last = (int)(4 * lane + w) * 32 + 31 - __clz((int)m[w]);
        }
        int lmax = last;
#pragma unroll
        for (int o = 1; o < 32; o *= 2) {
            const int tl = __shfl_up_sync(WK_FULL, lmax, o);
            if (lane >= (uint32_t)o)
                lmax = tl > lmax ? tl : lmax;
        }
        int p = __shfl_up_sync(WK_FULL, lmax, 1);
        if (lane == 0)
            p = -1;
        uint32_t es = 0;
#pragma unroll
        for (int w = 0; w < 4; w++) {
            if (m[w] != 0) {
                const int q = (int)(4 * lane + w) * 32;
                es += (uint32_t)(q + __ffs((int)m[w]) - 1 - p - 1) / 255u;
                p = q + 31 - __clz((int)m[w]);
            }
        }
        uint32_t eex, total, etrue, want;
        wkw_scan2(cnt, es, rank0, &eex, &total, &etrue);
        wk_bbytes(len, x.k, etrue, E, &want);
        if (total != x.k || want != WSYNC_DELTA_BITMAP)
            bad = true;
    }
    {   /* padding after the values (PLAIN: after the len values) */
        const uint64_t vend = x.mode == WSYNC_DELTA_PLAIN ? (uint64_t)len * E
                                                          : *hdr + (uint64_t)x.k * E;
        for (uint64_t b = vend + lane; b < x.size; b += 32)
            if (P[b] != 0)
                bad = true;
    }
    return __any_sync(WK_FULL, bad);
}

/* Vector v of a block (16 bytes, in x) takes its changed values: the bits of its elements in the
 * block's change bitmap, their ranks from the words' prefix counts, the values in rank order.
 * Returns the bits. */
template <int E>
__device__ __forceinline__ uint32_t wkw_merge(uint4 &x, uint32_t v, const uint32_t *bits,
                                              const uint32_t *wpre, const typename wk_elem<E>::t *vals)
{
    typedef typename wk_elem<E>::t el;
    constexpr uint32_t VE = 16 / E;   /* elements a vector */
    const uint32_t e0 = v * VE, w = e0 >> 5, sh = e0 & 31;
    const uint32_t word = bits[w];
    const uint32_t b = (word >> sh) & ((1u << VE) - 1u);
    if (b != 0) {
        uint32_t r = wpre[w] + __popc(word & ((1u << sh) - 1u));
        union {
            uint4 v;
            el e[VE];
        } u;
        u.v = x;
#pragma unroll
        for (uint32_t e = 0; e < VE; e++)
            if ((b >> e) & 1u)
                u.e[e] = vals[r++];
        x = u.v;
    }
    return b;
}

/* Index byte t (0..7) of a lane's run, from the two words it loaded. */
__device__ __forceinline__ uint32_t wkw_ibyte(uint32_t w0, uint32_t w1, uint32_t t)
{
    return ((t < 4 ? w0 : w1) >> (8 * (t & 3))) & 0xffu;
}

/* The warp apply of a SPARSE block of at most WKW_SMALL index bytes (each lane's run at most 8
 * bytes: every block at a few percent changed), its loads issued together: a lane's run as two
 * words with the padding bytes, and after the scan its values (at most 8). Every check of
 * wkw_apply_check before any write; true (on every lane) when the block is bad, nothing written.
 * Without the hash each lane writes its changed values. With it the warp builds the block's
 * change bitmap and values in shared memory (sbits, swpre: the words' prefix counts, svals) and
 * makes one pass over the block as the encoder does (the next segment's loads issued first):
 * each vector takes its values, the 32-byte sectors with a change are written whole, and *leaf
 * is hashed from the registers; where applying first and reading the block back for the hash
 * had waited on the stores' round trip and read each changed sector twice. */
#define WKW_SMALL 256u
template <int E>
__device__ __forceinline__ bool wkw_sparse_small(const wkw_ablk_t &x, int hash, uint32_t *sbits,
                                                 uint32_t *swpre, typename wk_elem<E>::t *svals,
                                                 const uint64_t *sec, uint64_t *leaf)
{
    typedef typename wk_elem<E>::t el;
    const uint32_t lane = threadIdx.x & 31;
    const unsigned char *P = x.P;
    const uint32_t nbytes = x.k + x.esc;                     /* 1 .. WKW_SMALL */
    const uint32_t per = (((nbytes + 31) / 32) + 3) & ~3u;   /* 4 or 8: word loads */
    const uint32_t b0 = lane * per < nbytes ? lane * per : nbytes;
    const uint32_t b1 = b0 + per < nbytes ? b0 + per : nbytes;
    const uint64_t hdr = wk_al8(nbytes), vend = hdr + (uint64_t)x.k * E;
    uint32_t w0 = 0, w1 = 0, pad = 0;
    if (b0 < b1)   /* words inside [0, hdr): b0 and hdr are multiples of 4 */
        w0 = *reinterpret_cast<const uint32_t *>(P + b0);
    if (b0 + 4 < b1)
        w1 = *reinterpret_cast<const uint32_t *>(P + b0 + 4);
    const uint32_t lastb = P[nbytes - 1];
    if (nbytes + lane < hdr)
        pad |= P[nbytes + lane];
    for (uint64_t b = vend + lane; b < x.size; b += 32)
        pad |= P[b];
    uint32_t adv = 0, cnt = 0;
#pragma unroll
    for (uint32_t t = 0; t < 8; t++) {
        const uint32_t v = wkw_ibyte(w0, w1, t);
        if (b0 + t < b1) {
            adv += v == 0xff ? 255u : v + 1;
            cnt += v != 0xff;
        }
    }
    uint32_t adv0, cnt0, advt, cntt;
    wkw_scan2(adv, cnt, &adv0, &cnt0, &advt, &cntt);
    const el *vals = reinterpret_cast<const el *>(P + hdr);
    el vv[8];   /* the lane's values; never read past the block's k */
#pragma unroll
    for (uint32_t t = 0; t < 8; t++)
        vv[t] = t < cnt && cnt0 + t < x.k ? vals[cnt0 + t] : (el)0;
    /* exactly k elements, no trailing escape, zero padding, every position inside the block */
    bool bad = cntt != x.k || lastb == 0xff || pad != 0;
    uint32_t a = adv0;
#pragma unroll
    for (uint32_t t = 0; t < 8; t++) {
        const uint32_t v = wkw_ibyte(w0, w1, t);
        if (b0 + t < b1) {
            a += v == 0xff ? 255u : v + 1;
            if (v != 0xff && a - 1 >= WK_DBLK)
                bad = true;
        }
    }
    if (__any_sync(WK_FULL, bad))
        return true;
    el *tv = reinterpret_cast<el *>(x.tv);
    if (hash) {
        reinterpret_cast<uint4 *>(sbits)[lane] = make_uint4(0, 0, 0, 0);
        __syncwarp();
    }
    /* each change written in place, or with the hash into the block's bitmap and values */
    a = adv0;
    uint32_t q = cnt0;
#pragma unroll
    for (uint32_t t = 0; t < 8; t++) {
        const uint32_t v = wkw_ibyte(w0, w1, t);
        if (b0 + t < b1) {
            a += v == 0xff ? 255u : v + 1;
            if (v != 0xff) {
                if (hash) {
                    atomicOr(&sbits[(a - 1) >> 5], 1u << ((a - 1) & 31));   /* runs share words */
                    svals[q++] = vv[0];
                } else {
                    tv[a - 1] = vv[0];
                }
#pragma unroll
                for (int z = 0; z < 7; z++)   /* registers: no indexed array */
                    vv[z] = vv[z + 1];
            }
        }
    }
    if (!hash)
        return false;
    __syncwarp();
    {   /* the words' prefix counts: lane l's words 4l .. 4l + 3 */
        const uint4 wv = reinterpret_cast<const uint4 *>(sbits)[lane];
        const uint32_t c0 = __popc(wv.x), c1 = __popc(wv.y), c2 = __popc(wv.z);
        const uint32_t c = c0 + c1 + c2 + __popc(wv.w);
        const uint32_t e = wkw_incl(c) - c;
        reinterpret_cast<uint4 *>(swpre)[lane] = make_uint4(e, e + c0, e + c0 + c1, e + c0 + c1 + c2);
    }
    __syncwarp();
    constexpr uint32_t NSEG = WK_DBLK * E / 1024;
    uint4 *p4 = reinterpret_cast<uint4 *>(x.tv);
    wkw_hash_t h;
    wkw_hash_init(h, sec);
    uint4 n0 = p4[lane], n1 = p4[lane + 32];
#pragma unroll
    for (uint32_t s = 0; s < NSEG; s++) {
        const uint32_t v0 = 64 * s + lane, v1 = v0 + 32;
        uint4 x0 = n0, x1 = n1;
        if (s + 1 < NSEG) {
            n0 = p4[v0 + 64];
            n1 = p4[v1 + 64];
        }
        const uint32_t m0 = wkw_merge<E>(x0, v0, sbits, swpre, svals);
        const uint32_t m1 = wkw_merge<E>(x1, v1, sbits, swpre, svals);
        if ((m0 | __shfl_xor_sync(WK_FULL, m0, 1)) != 0)   /* the two lanes' vectors: a sector */
            p4[v0] = x0;
        if ((m1 | __shfl_xor_sync(WK_FULL, m1, 1)) != 0)
            p4[v1] = x1;
        wkw_hash_segment<WK_DBLK * E>(h, x0, x1, s, sec);
    }
    *leaf = wkw_hash_final<WK_DBLK * E>(h, sec);
    return false;
}

/* The warp apply's records (batches with the hash): each block's table entry checked by a
 * thread of its own before the apply, all at once, so that a warp waits on one load for its
 * block's entry instead of the chain block map, descriptor, length, header and entry.
 * rec[2g] = payload and target addresses, rec[2g + 1] = mode | k << 2 | esc << 15, the chunk,
 * the block in it, and fault | payload size << 8 (fault WKW_TAIL: a tail block). */
#define WKW_TAIL 0xffu
template <int E>
__global__ void __launch_bounds__(WK_THREADS)
wkw_apply_entries(const wk_dchunk_t *__restrict__ ch, const uint32_t *__restrict__ bmap,
                  uint64_t g0, uint64_t nblk, const uint64_t *lens, uint4 *rec)
{
    const uint64_t bi = (uint64_t)blockIdx.x * WK_THREADS + threadIdx.x;
    if (bi >= nblk)
        return;
    const uint64_t g = g0 + bi;
    const wk_dchunk_t d = ch[bmap[g]];
    const uint32_t j = (uint32_t)(g - d.block0);
    const uint64_t first = (uint64_t)j * WK_DBLK;
    uint32_t mode = 0, k = 0, esc = 0, fault = WKW_TAIL;
    uint64_t off = 0, size = 0;
    if (d.n - first >= WK_DBLK)
        fault = wk_check_entry(d.a, lens[d.idx], d, j, WK_DBLK, E, &mode, &k, &esc, &off, &size);
    const uint64_t P = reinterpret_cast<uint64_t>(d.a + 16 + 8 * (uint64_t)d.nb + off);
    const uint64_t tv = reinterpret_cast<uint64_t>(d.b + first * E);
    rec[2 * g] = make_uint4((uint32_t)P, (uint32_t)(P >> 32), (uint32_t)tv, (uint32_t)(tv >> 32));
    rec[2 * g + 1] = make_uint4(mode | k << 2 | esc << 15, d.idx, j, fault | (uint32_t)size << 8);
}

/* Block g's entry for the warp apply, on every lane: from its record when there are records,
 * else checked here by lane 0 (wk_check_entry). 0 when x holds it, WKW_TAIL for a tail block,
 * else the fault (x.idx and x.j say where). */
template <int E>
__device__ __forceinline__ uint32_t wkw_entry(const wk_dchunk_t *__restrict__ ch,
                                              const uint32_t *__restrict__ bmap, uint64_t g,
                                              const uint64_t *lens, const uint4 *rec, wkw_ablk_t *x)
{
    const uint32_t lane = threadIdx.x & 31;
    if (rec != NULL) {
        const uint4 r0 = rec[2 * g], r1 = rec[2 * g + 1];
        x->P = reinterpret_cast<const unsigned char *>((uint64_t)r0.y << 32 | r0.x);
        x->tv = reinterpret_cast<unsigned char *>((uint64_t)r0.w << 32 | r0.z);
        x->mode = r1.x & 3;
        x->k = (r1.x >> 2) & 0x1fffu;
        x->esc = r1.x >> 15;
        x->idx = r1.y;
        x->j = r1.z;
        x->size = r1.w >> 8;
        return r1.w & 0xffu;
    }
    const wk_dchunk_t d = ch[bmap[g]];
    const uint32_t j = (uint32_t)(g - d.block0);
    const uint64_t first = (uint64_t)j * WK_DBLK;
    if (d.n - first < WK_DBLK)
        return WKW_TAIL;
    wkw_ablk_t mine = {};
    uint32_t fault = 0;
    if (lane == 0) {
        uint64_t off = 0;
        fault = wk_check_entry(d.a, lens[d.idx], d, j, WK_DBLK, E, &mine.mode, &mine.k, &mine.esc,
                               &off, &mine.size);
        mine.P = d.a + 16 + 8 * (uint64_t)d.nb + off;
        mine.tv = d.b + first * E;
    }
    mine.idx = d.idx;
    mine.j = j;
    *x = wkw_ablk_shfl(mine, 0);
    return __shfl_sync(WK_FULL, fault, 0);
}

/* Apply, a warp per block: blocks [g0, g0 + nblk) of chunks whose target is dense and 16-byte
 * aligned (tail blocks left to wk_delta_apply, which runs after it over its list). The same
 * checks and faults as wk_delta_apply, every one before any write: the block's entry
 * (wkw_entry), then its payload: a SPARSE block of at most WKW_SMALL index bytes by
 * wkw_sparse_small (with the hash: applied and hashed in one pass), any other by
 * wkw_apply_check and then only the changed values written (a SPARSE lane its run, a BITMAP
 * lane the set bits of its words; PLAIN is copied in 8-byte words), and with the hash the warp
 * reads its block once (after __syncwarp: its lanes' stores are visible) and hashes it from
 * registers. Shared memory: the secret, and per warp the change bitmap, prefix counts and values
 * of wkw_sparse_small; no CTA barrier after the secret's load. rec: wkw_apply_entries' records
 * (batches with the hash), or NULL. A warp that checked 32 blocks' entries at once (a lane each)
 * and then applied them in turn measured slower (docs/delta.md): the latency it waits on is the
 * payload's. */
template <int E>
__global__ void __launch_bounds__(WKW_THREADS, WKW_MIN_BLOCKS)
wkw_delta_apply(const wk_dchunk_t *__restrict__ ch, const uint32_t *__restrict__ bmap,
                uint64_t g0, uint64_t nblk, const uint64_t *lens, uint64_t *leaves,
                wsync_kdelta_result_t *res, int hash, const uint4 *rec)
{
    typedef typename wk_elem<E>::t el;
    __shared__ uint64_t sec[24];
    __shared__ __align__(16) uint32_t sbits_w[WKW_WARPS][WK_MWORDS], swpre_w[WKW_WARPS][WK_MWORDS];
    __shared__ __align__(16) el svals_w[WKW_WARPS][WKW_SMALL];
    const uint32_t lane = threadIdx.x & 31, w = threadIdx.x >> 5;

    wk_secret_load(sec);
    __syncthreads();
    const uint64_t bi = (uint64_t)blockIdx.x * WKW_WARPS + w;
    if (bi >= nblk)
        return;
    const uint64_t g = g0 + bi;
    wkw_ablk_t x;
    const uint32_t fault = wkw_entry<E>(ch, bmap, g, lens, rec, &x);
    if (fault == WKW_TAIL)
        return;   /* wk_delta_apply's */
    if (fault != 0) {
        if (lane == 0)
            atomicMin(reinterpret_cast<unsigned long long *>(&res[x.idx].fault),
                      (unsigned long long)(((uint64_t)x.j << 8) | fault));
        return;
    }
    if (x.mode == WSYNC_DELTA_SAME && !hash)
        return;

    bool hashed = false;
    uint64_t leaf = 0;
    if (x.mode == WSYNC_DELTA_SPARSE && x.k + x.esc <= WKW_SMALL) {
        if (wkw_sparse_small<E>(x, hash, sbits_w[w], swpre_w[w], svals_w[w], sec, &leaf)) {
            if (lane == 0)
                atomicMin(reinterpret_cast<unsigned long long *>(&res[x.idx].fault),
                          (unsigned long long)(((uint64_t)x.j << 8) | WSYNC_KDELTA_FAULT_PAYLOAD));
            return;
        }
        hashed = hash != 0;
    } else {
        uint64_t hdr;
        uint32_t b0 = 0, b1 = 0, adv0 = 0, cnt0 = 0, m[4] = {0, 0, 0, 0}, rank0 = 0;
        if (wkw_apply_check<E>(x, &hdr, &b0, &b1, &adv0, &cnt0, m, &rank0)) {
            if (lane == 0)
                atomicMin(reinterpret_cast<unsigned long long *>(&res[x.idx].fault),
                          (unsigned long long)(((uint64_t)x.j << 8) | WSYNC_KDELTA_FAULT_PAYLOAD));
            return;
        }
        el *tv = reinterpret_cast<el *>(x.tv);
        const el *vals = reinterpret_cast<const el *>(x.P + hdr);
        if (x.mode == WSYNC_DELTA_SPARSE) {
            uint32_t a = adv0, r = cnt0;
            for (uint32_t b = b0; b < b1; b++) {
                const uint32_t v = x.P[b];
                a += v == 0xff ? 255u : v + 1;
                if (v != 0xff)
                    tv[a - 1] = vals[r++];
            }
        } else if (x.mode == WSYNC_DELTA_BITMAP) {
            uint32_t r = rank0;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                uint32_t mm = m[q];
                while (mm != 0) {
                    tv[(4 * lane + q) * 32 + (uint32_t)__ffs((int)mm) - 1] = vals[r++];
                    mm &= mm - 1;
                }
            }
        } else if (x.mode == WSYNC_DELTA_PLAIN) {
            const uint64_t *src = reinterpret_cast<const uint64_t *>(x.P);
            for (uint32_t q = lane; q < WK_DBLK * E / 8; q += 32)
                reinterpret_cast<uint64_t *>(tv)[q] = src[q];
        }
    }
    if (hash && !hashed) {
        __syncwarp();   /* every lane's stores visible to the warp's loads */
        leaf = wkw_leaf<WK_DBLK * E>(reinterpret_cast<const uint4 *>(x.tv), sec);
    }
    if (lane == 0) {
        if (hash)
            leaves[g] = leaf;
        if (x.k > 0)
            atomicAdd(reinterpret_cast<unsigned long long *>(&res[x.idx].changed),
                      (unsigned long long)x.k);
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
    unsigned long long *status;        /*   [nblocks + 4] encode: look-back words, counters;
                                          [4 * nblocks] apply with the hash: the warp apply's
                                          records (wkw_apply_entries) */
    uint64_t *leaves;                  /*   [nblocks] */
    wsync_kdelta_result_t *res;        /*   [n] */
    uint32_t *glist;                   /*   [nblocks] the CTA kernels' blocks */
    uint32_t *bmap;                    /*   [nblocks] each block's chunk (its place in chunks) */
    uint64_t dev_bytes;
    wsync_kdelta_result_t *host;       /* pinned [n] */
    uint64_t *lens_host;               /* pinned [n] apply: the lengths of the next launch */
    uint64_t *lens_default;            /* malloc [n] apply: those given at create */
    int lens_changed;                  /* a launch gave other lengths than the default */
    uint64_t elems, plain_bytes;       /* the chunks' elements and their bytes */
    int launched;                      /* a launch's results were copied (res_ev recorded) */
    int warp_enc;                      /* encode: the warp kernels for the next launch */
    cudaEvent_t res_ev;                /* after the last launch's copy of the results */
    struct {
        uint32_t c0, cf, c1;           /* chunks: [c0, cf) the warp encoder's, [cf, c1) not */
        uint64_t g0, gf, g1;           /* their blocks */
        uint64_t l0, nl;               /* glist[l0, l0 + nl): the CTA kernels' blocks
                                          (relative to g0): [cf, c1)'s and [c0, cf)'s tails */
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

/* WSYNC_KDELTA_OLD=1: the kernels as they were before the warp encoder (commit 5c201c0's v1:
 * one CTA per block for every encode, apply at 32 registers), to compare in one run. Measured on
 * an H100 (test_delta_kernels, 1 GiB bf16 in 64 chunks at 1 %): docs/delta.md. */
static int wk_use_old(void)
{
    return wk_env_on("WSYNC_KDELTA_OLD");
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
    if (b->res_ev != NULL)
        cudaEventDestroy(b->res_ev);
    if (b->lens_host != NULL)
        cudaFreeHost(b->lens_host);
    free(b->lens_default);
    free(b);
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
    b->warp_enc = 1;
    for (uint32_t i = 0; i < n; i++) {
        b->elems += d[i].n;
        b->plain_bytes += d[i].n * esz[i];
    }
    uint32_t m = 0;
    uint64_t g = 0;
    for (int grp = 0; grp < 4; grp++) {
        b->grp[grp].c0 = m;
        b->grp[grp].g0 = g;
        for (int slow = 0; slow < 2; slow++) {   /* the warp encoder's chunks first */
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
        uint64_t o_st = o_lens + 8 * (uint64_t)n, o_lv = o_st + 8 * (apply ? (flag ? 4 * g : 0) : g + 4);
        uint64_t o_res = o_lv + 8 * g, o_gl = o_res + (uint64_t)n * sizeof(wsync_kdelta_result_t);
        uint64_t o_bm = o_gl + 4 * g, total = o_bm + 4 * g;
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
        b->glist = (uint32_t *)(base + o_gl);
        b->bmap = (uint32_t *)(base + o_bm);
        b->dev_bytes = total;
    }
    e = cudaMallocHost((void **)&b->host, (size_t)(n ? n : 1) * sizeof(wsync_kdelta_result_t));
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&b->res_ev, cudaEventDisableTiming);
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
        if (e == cudaSuccess) {
            /* the CTA kernels' blocks, ascending per group (the encoder's look-back order): the
             * tail blocks of the warp kernels' chunks, then every block of the others */
            uint64_t nl = 0;
            for (int grp = 0; grp < 4; grp++) {
                b->grp[grp].l0 = nl;
                for (uint32_t i = b->grp[grp].c0; i < b->grp[grp].cf; i++)
                    if (sorted[i].n % WK_DBLK != 0)
                        bm[nl++] = (uint32_t)(sorted[i].block0 + sorted[i].nb - 1 - b->grp[grp].g0);
                for (uint64_t x = b->grp[grp].gf; x < b->grp[grp].g1; x++)
                    bm[nl++] = (uint32_t)(x - b->grp[grp].g0);
                b->grp[grp].nl = nl - b->grp[grp].l0;
            }
            if (nl > 0)
                e = cudaMemcpy(b->glist, bm, (size_t)nl * 4, cudaMemcpyHostToDevice);
        }
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
    free(sorted);
    *out = b;
    return WSYNC_OK;
fail:
    free(sorted);
    wk_batch_release(b);
    return st;
}

template <int E>
static void wk_launch_group(const wsync_kdelta_batch_t *b, int grp, cudaStream_t s, int warp)
{
    const uint64_t g0 = b->grp[grp].g0, nb = b->grp[grp].g1 - g0;
    if (nb == 0)
        return;
    const uint64_t nw = warp ? b->grp[grp].gf - g0 : 0, nl = warp ? b->grp[grp].nl : nb;
    const uint32_t *gl = nl == nb ? NULL : b->glist + b->grp[grp].l0;   /* NULL: all, in order */
    if (b->apply) {
        /* with the hash, the entries first (measured: 5 % faster with the hash, 7 % slower
         * without it, where the apply writes only the changed values) */
        uint4 *rec = b->flag ? reinterpret_cast<uint4 *>(b->status) : NULL;
        if (nw > 0 && rec != NULL)
            wkw_apply_entries<E><<<(unsigned)((nw + WK_THREADS - 1) / WK_THREADS), WK_THREADS, 0, s>>>(
                b->chunks, b->bmap, g0, nw, b->lens, rec);
        if (nw > 0)
            wkw_delta_apply<E><<<(unsigned)((nw + WKW_WARPS - 1) / WKW_WARPS), WKW_THREADS, 0, s>>>(
                b->chunks, b->bmap, g0, nw, b->lens, b->leaves, b->res, b->flag, rec);
        if (nl > 0)
            wk_delta_apply<E><<<(unsigned)nl, WK_THREADS, b->flag ? WK_DBLK * E : 0, s>>>(
                b->chunks, b->bmap, g0, gl, b->lens, b->leaves, b->res, b->flag);
        return;
    }
    unsigned int *counters = (unsigned int *)(b->status + b->nblocks);
    if (nw > 0)   /* first: the tail blocks after it look back over its blocks */
        wkw_delta_encode<E><<<(unsigned)((nw + WKW_WARPS - 1) / WKW_WARPS), WKW_THREADS, 0, s>>>(
            b->chunks, b->bmap, g0, nw, b->status, counters + 4 + grp, b->leaves, b->res, b->flag);
    if (nl > 0)
        wk_delta_encode<E><<<(unsigned)nl, WK_THREADS, 2 * WK_DBLK * E, s>>>(
            b->chunks, b->bmap, g0, gl, b->status, counters + grp, b->leaves, b->res, b->flag);
}

extern "C" {

wsync_status_t wsync_kdelta_encode_create(const wsync_kdelta_enc_t *chunks, uint32_t n,
                                          int update_old, wsync_kdelta_batch_t **batch)
{
    static const char fn[] = "wsync_kdelta_encode_create";
    const int old = wk_use_old();
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
        d[i].fast = !old && d[i].dense && (((uintptr_t)d[i].a | (uintptr_t)d[i].b) & 15) == 0;
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
    const int old = wk_use_old();
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
        d[i].fast = !old && d[i].dense && ((uintptr_t)d[i].b & 15) == 0;
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
    /* The warp kernels win only where few elements change (tests/gpu/test_delta_kernels, H100,
     * 1 GiB bf16, (CTA -> warp) ms at 1 %, 5 %, 30 % changed: encode 1.30 -> 0.91, 1.68 -> 1.18,
     * 1.33 -> 2.89; apply 0.56 -> 0.30, 0.70 -> 1.60, 1.59 -> 5.30): an apply takes them when
     * its streams are under 3 % of the plain bytes (1 % changed is 1.7 %, 5 % is 7.7 %), an
     * encode while the last launch whose results had landed (its event done: read no sooner)
     * found under 15 % changed */
    int warp = b->warp_enc;
    if (b->apply) {
        const uint64_t *l = lens != NULL ? lens : b->lens_default;
        uint64_t wire = 0;
        for (uint32_t i = 0; i < b->n; i++)
            wire += l[i];
        warp = (double)wire < 0.03 * (double)b->plain_bytes;
    } else if (b->launched && cudaEventQuery(b->res_ev) == cudaSuccess) {
        uint64_t changed = 0;
        for (uint32_t i = 0; i < b->n; i++)
            changed += b->host[i].changed;
        warp = b->warp_enc = (double)changed < 0.15 * (double)b->elems;
    }
    wk_launch_group<1>(b, 0, s, warp);
    wk_launch_group<2>(b, 1, s, warp);
    wk_launch_group<4>(b, 2, s, warp);
    wk_launch_group<8>(b, 3, s, warp);
    if (!b->apply || b->flag)
        wk_delta_chunk_hash<<<b->n, WK_THREADS, 0, s>>>(b->chunks, b->leaves, b->res);
    wsync_status_t st = wk_launched("wsync_kdelta_launch: kernel launch");
    if (st != WSYNC_OK)
        return st;
    e = cudaMemcpyAsync(b->host, b->res, (size_t)b->n * sizeof(wsync_kdelta_result_t),
                        cudaMemcpyDeviceToHost, s);
    if (e != cudaSuccess)
        return wk_cuda(e, "wsync_kdelta_launch: cudaMemcpyAsync (results)");
    e = cudaEventRecord(b->res_ev, s);
    if (e != cudaSuccess)
        return wk_cuda(e, "wsync_kdelta_launch: cudaEventRecord (results)");
    b->launched = 1;
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
