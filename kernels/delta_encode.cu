/* The delta codec's encode kernels (kernels/delta.cu's opening comment says how they work):
 * wk_delta_encode, a CTA per block, and wkw_delta_encode, a warp per full block; and their
 * launcher. */
#include "kernels/delta_dev.cuh"

/* ------------------------------------------------------------------------------------------ */
/* Encode                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* One CTA per block: blocks [g0, g0 + gridDim.x), or g0 + glist[0 .. gridDim.x) (ascending:
 * what the warp encoder leaves, tail blocks and chunks it cannot take), all of element size E.
 * Shared memory (dynamic): the new values [WK_DBLK * E], then the payload being built
 * [WK_DBLK * E] (the changed flags before it). */
/* An encoded block's table entry (and the chunk's header from its first block) and its hash
 * leaf: one thread of the block's encoder (its k and size went into the chunk's cursor). */
template <int E>
__device__ __forceinline__ void wk_block_entry(const wk_dchunk_t &d, uint32_t j, uint64_t g,
                                               uint64_t off, uint32_t mode, uint32_t e, uint32_t k,
                                               uint64_t leaf, uint64_t *leaves)
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
}

template <int E>
__global__ void __launch_bounds__(WK_THREADS, WK_DMIN_BLOCKS)
wk_delta_encode(const wk_dchunk_t *__restrict__ ch, const uint32_t *__restrict__ bmap, uint64_t g0,
                const uint32_t *__restrict__ glist, unsigned long long *status,
                unsigned int *counter, uint64_t *leaves, int update_old)
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
        /* blocks numbered in the order they start (reads sweep both versions in order) */
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

    /* 3. the offset from the chunk's cursor (its round trip under the hash) */
    if (tid == 0)
        sh_off = (atomicAdd(&status[d.block0], wk_cur_add(k, size)) & WK_CUR_WORDS) * 8;
    wk_block_leaf<E>(snew, len, sec, hsum, &sh_leaf);
    __syncthreads();
    const uint64_t off = sh_off;
    const uint64_t tbl = 16 + 8 * (uint64_t)d.nb, pos = tbl + off;

    /* 4. table entry, header, leaf */
    if (tid == 0)
        wk_block_entry<E>(d, j, g, off, mode, e, k, sh_leaf, leaves);

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

    /* 6. the sender's baseline takes the new values (each changed 32-byte sector whole) */
    if (update_old && k > 0)
        wk_store_block<E>(d, d.b, first, len, snew, mask, false);
}

/* ------------------------------------------------------------------------------------------ */
/* Encode, a warp per block: full blocks of dense chunks with 16-byte aligned starts (default)  */
/* ------------------------------------------------------------------------------------------ */

/* Changed 16-byte vectors the warp encoder keeps in shared memory for the payload (2 KiB a warp):
 * a block of 2-byte elements at 1 % changed has about 40, at 5 % about 170 (those past 128 are
 * read again from the new version). */
#define WKW_STASH 128

/* A SPARSE payload up to this many bytes (k <= 340 bf16 changes, 8 % of a block) is built in a
 * warp's shared memory, during the round trip of its offset, and written out in 8-byte words.
 * Its index bytes and values stored one by one to global memory had cost the encoder 50 of its
 * 770 us at 1 % changed on an H100, and 148 of 869 at 5 % (a build writing no payload); staged,
 * the encode takes 749 and 797 us (session 39). */
#define WKW_PBUF 1024

/* The warp encoder's writes of a SPARSE or BITMAP block's changes (lane's set bits of mask
 * words m, words 4 lane .. 4 lane + 3) to the payload at `to`: with sparse each change's gap
 * bytes (floor(gap / 255) escapes, then gap mod 255) at its rank r plus the escapes before it
 * (r0, ex0: lane's first; prev: the change before lane's words), and each value at hdr + r E,
 * from the warp's stash (a vector's slot: the ballot words vb and their prefix counts vpre) or,
 * past WKW_STASH vectors or without a stash (ST false), from the new version nv. */
template <int E, bool ST>
__device__ __forceinline__ void wkw_write_changes(unsigned char *to, uint64_t hdr, bool sparse,
                                                  const uint32_t m[4], uint32_t lane, uint32_t r0,
                                                  uint32_t ex0, int prev, const uint4 *stash,
                                                  const uint32_t *vb, const uint32_t *vpre,
                                                  const typename wk_elem<E>::t *nv)
{
    typedef typename wk_elem<E>::t el;
    uint32_t r = r0, ex = ex0;
    int p = prev;
#pragma unroll
    for (int w = 0; w < 4; w++) {
        uint32_t mm = m[w];
        while (mm != 0) {
            const uint32_t i = (4 * lane + w) * 32 + (uint32_t)__ffs((int)mm) - 1;
            mm &= mm - 1;
            if (sparse) {
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

/* A 16-byte vector of either version. RO (no update_old, as the store scheme's senders
 * encode: the kernel writes neither version): through the read-only path (ld.global.nc; the
 * descriptor's pointers otherwise make generic loads), on an H100 774-778 us against 792-799 at
 * 1 % changed, no change at 5 % or on an H200. With update_old the warp writes the old version's
 * changed sectors, so both stay ordinary loads: ld.global.cg for the old one, or either form
 * picked at run time, measured 1.5-2.5 % slower on an H200 (docs/delta.md, session 38). The
 * kernel is built for each case (update_old a constant): that alone made the encode with
 * update_old 1-2 % faster on both GPUs. */
template <bool RO>
__device__ __forceinline__ uint4 wkw_ld(const uint4 *p)
{
    if constexpr (RO)
        return __ldg(p);
    else
        return *p;
}

/* Blocks [g0, g0 + nblk) of chunks that are dense with new and old 16-byte aligned, element size
 * E; each warp of the grid claims one from *counter (in order: by CTA index measured 10 %
 * slower, docs/delta.md) and leaves tail blocks (fewer than WK_DBLK elements) to
 * wk_delta_encode. No CTA barrier after the secret's
 * load: a warp reads its block once in 16-byte vectors, one 1 KiB segment of new and old per
 * step, and keeps everything else in registers but the mask words (512 bytes a warp):
 *  - compare, the loads of the next segment issued before the work on this one (the stores to
 *    the baseline would keep the compiler from moving them up): the changed bits of each vector
 *    (wk_vdiff) into the mask words (wk_put_bits), each changed vector (elements of at most 4
 *    bytes) into the warp's stash, in order, and with update_old the new values of every
 *    32-byte sector with a change into the baseline;
 *  - the leaf XXH3 as it goes (wkw_hash_t);
 *  - the scan: lane l takes mask words 4l .. 4l + 3 (k, its rank and escape prefix, the last
 *    changed position before it), then takes the block's offset from the chunk's cursor;
 *  - the payload: each lane walks the set bits of its words (at 1 % about one per lane), writing
 *    index bytes and values straight to the output (bytes no other lane writes, the padding bytes
 *    included), the values from the stash (a vector's slot: the ballot words' prefix counts),
 *    read again from the new version only past WKW_STASH vectors; PLAIN blocks are copied in
 *    8-byte words, a BITMAP's bitmap is the mask words. Reading the values again from L2 had
 *    kept each warp waiting on loads after its compare (docs/delta.md). */
template <int E, bool UPDATE_OLD>
__global__ void __launch_bounds__(WKW_THREADS, WKW_MIN_BLOCKS)
wkw_delta_encode(const wk_dchunk_t *__restrict__ ch, const uint32_t *__restrict__ bmap,
                 uint64_t g0, uint64_t nblk, unsigned long long *status, unsigned int *counter,
                 uint64_t *leaves)
{
    constexpr bool RO = !UPDATE_OLD;   /* the kernel writes neither version */
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
    __shared__ uint64_t spay[WKW_WARPS][WKW_PBUF / 8];
    uint64_t *pbuf = spay[threadIdx.x >> 5];
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
    uint4 nx0 = wkw_ld<RO>(pa + lane), ny0 = wkw_ld<RO>(pb + lane);
    uint4 nx1 = wkw_ld<RO>(pa + lane + 32), ny1 = wkw_ld<RO>(pb + lane + 32);
#pragma unroll
    for (uint32_t s = 0; s < NSEG; s++) {
        const uint32_t v0 = 64 * s + lane, v1 = v0 + 32;
        const uint4 x0 = nx0, y0 = ny0, x1 = nx1, y1 = ny1;
        if (s + 1 < NSEG) {
            nx0 = wkw_ld<RO>(pa + v0 + 64);
            ny0 = wkw_ld<RO>(pb + v0 + 64);
            nx1 = wkw_ld<RO>(pa + v1 + 64);
            ny1 = wkw_ld<RO>(pb + v1 + 64);
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
        if (UPDATE_OLD) {
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
    const wkw_words_t ws = wkw_words<true>(m, lane);
    const uint32_t cnt = ws.cnt, inc = ws.inc, es = ws.es;
    const int prev0 = ws.prev;   /* the last change before lane's words */
    const uint32_t einc = wkw_incl(es);
    const uint32_t k = __shfl_sync(WK_FULL, inc, 31), etot = __shfl_sync(WK_FULL, einc, 31);
    uint32_t mode;
    const uint64_t size = wk_bbytes(WK_DBLK, k, etot, E, &mode);
    const uint32_t e = mode == WSYNC_DELTA_SPARSE ? etot : 0;   /* the table's e */

    /* 3. the offset from the chunk's cursor; during its round trip the hash is finished and a
     * small SPARSE payload built in shared memory (zeros first: the padding) */
    unsigned long long c = 0;
    if (lane == 0)
        c = atomicAdd(&status[d.block0], wk_cur_add(k, size));
    const uint64_t leaf = wkw_hash_final<WK_DBLK * E>(h, sec);
    const uint64_t hdr = mode == WSYNC_DELTA_SPARSE ? wk_al8((uint64_t)k + etot) : WK_DBLK / 8;
    typedef typename wk_elem<E>::t el;
    const el *nv = reinterpret_cast<const el *>(d.a + first * E);   /* the new values */
    const bool staged = mode == WSYNC_DELTA_SPARSE && size <= WKW_PBUF;
    if (staged) {
        for (uint32_t w = lane; w < size / 8; w += 32)
            pbuf[w] = 0;
        __syncwarp();
        wkw_write_changes<E, ST>(reinterpret_cast<unsigned char *>(pbuf), hdr, true, m, lane,
                                 inc - cnt, einc - es, prev0, stash, vb, vpre, nv);
        __syncwarp();
    }
    c = __shfl_sync(WK_FULL, c, 0);
    const uint64_t off = (c & WK_CUR_WORDS) * 8;
    const uint64_t pos = 16 + 8 * (uint64_t)d.nb + off;

    /* 4. table entry, header, leaf */
    if (lane == 0)
        wk_block_entry<E>(d, j, g, off, mode, e, k, leaf, leaves);

    /* 5. the payload: the staged one copied out, any other straight to the output */
    const bool fits = size > 0 && pos + size <= d.cap;
    unsigned char *to = d.out + pos;   /* 8-byte aligned */
    if (fits && staged)
        for (uint32_t w = lane; w < size / 8; w += 32)
            reinterpret_cast<uint64_t *>(to)[w] = pbuf[w];
    if (fits && mode == WSYNC_DELTA_PLAIN) {
        const uint64_t *src = reinterpret_cast<const uint64_t *>(d.a + first * E);
        for (uint32_t w = lane; w < WK_DBLK * E / 8; w += 32)
            reinterpret_cast<uint64_t *>(to)[w] = src[w];
    }
    const bool idx = fits && !staged && mode != WSYNC_DELTA_PLAIN;   /* SPARSE or BITMAP */
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
    if (idx)
        wkw_write_changes<E, ST>(to, hdr, mode == WSYNC_DELTA_SPARSE, m, lane, inc - cnt, einc - es,
                                 prev0, stash, vb, vpre, nv);
}

/* Group grp's encode kernels (element size E = 1 << grp) on stream s: the warp kernel for the
 * full blocks of its fast chunks when warp, then the CTA kernel for the rest. */
template <int E>
static void wk_encode_group(const wsync_kdelta_batch_t *b, int grp, cudaStream_t s, int warp)
{
    const wk_group_span_t sp = wk_group_span(b, grp, warp);
    const uint64_t g0 = sp.g0, nw = sp.nw, nl = sp.nl;
    const uint32_t *gl = sp.gl;
    if (sp.nb == 0)
        return;
    unsigned int *counters = (unsigned int *)(b->status + b->nblocks);
    const unsigned nc = (unsigned)((nw + WKW_WARPS - 1) / WKW_WARPS);
    if (nw > 0 && b->flag)
        wkw_delta_encode<E, true><<<nc, WKW_THREADS, 0, s>>>(
            b->chunks, b->bmap, g0, nw, b->status, counters + 4 + grp, b->leaves);
    else if (nw > 0)
        wkw_delta_encode<E, false><<<nc, WKW_THREADS, 0, s>>>(
            b->chunks, b->bmap, g0, nw, b->status, counters + 4 + grp, b->leaves);
    if (nl > 0)
        wk_delta_encode<E><<<(unsigned)nl, WK_THREADS, 2 * WK_DBLK * E, s>>>(
            b->chunks, b->bmap, g0, gl, b->status, counters + grp, b->leaves, b->flag);
}

void wk_delta_launch_encode(const wsync_kdelta_batch_t *b, cudaStream_t s, int warp)
{
    wk_encode_group<1>(b, 0, s, warp);
    wk_encode_group<2>(b, 1, s, warp);
    wk_encode_group<4>(b, 2, s, warp);
    wk_encode_group<8>(b, 3, s, warp);
}

cudaError_t wk_delta_encode_smem8(void)
{
    return cudaFuncSetAttribute(wk_delta_encode<8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)(2 * WK_DBLK * 8));
}
