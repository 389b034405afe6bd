/* The delta codec's apply kernels (kernels/delta.cu's opening comment says how they work):
 * wk_delta_apply, a CTA per block, and wkw_delta_apply, a warp per full block, with the entries
 * kernel before it; and their launcher. */
#include "kernels/delta_dev.cuh"

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
    /* header and entry lie before tbl: loaded together */
    const uint64_t h = wk_rd64(enc), hn = wk_rd64(enc + 8);
    const uint64_t w = wk_rd64(enc + 16 + 8 * (uint64_t)j);
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
    if ((o & 7) != 0 || o > area || sz > area - o)
        return WSYNC_KDELTA_FAULT_TABLE;
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
               wsync_kdelta_result_t *res, int hash, wk_reset_t z)
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

    wk_reset(z);
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
        wk_block_leaf<E>(sv, len, sec, hsum, &leaves[g]);
    }
    if (tid == 0 && k > 0)
        wk_app_count(res, d.idx, k, size);
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
        const wkw_words_t ws = wkw_words<false>(m, lane);
        const uint32_t cnt = ws.cnt, es = ws.es;
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
                  uint64_t g0, uint64_t nblk, const uint64_t *lens, uint4 *rec, wk_reset_t z)
{
    wk_reset(z);
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
                wsync_kdelta_result_t *res, int hash, const uint4 *rec, wk_reset_t z)
{
    typedef typename wk_elem<E>::t el;
    __shared__ uint64_t sec[24];
    __shared__ __align__(16) uint32_t sbits_w[WKW_WARPS][WK_MWORDS], swpre_w[WKW_WARPS][WK_MWORDS];
    __shared__ __align__(16) el svals_w[WKW_WARPS][WKW_SMALL];
    const uint32_t lane = threadIdx.x & 31, w = threadIdx.x >> 5;

    wk_reset(z);
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
            wk_app_count(res, x.idx, x.k, x.size);
    }
}

/* Group grp's apply kernels (element size E = 1 << grp) on stream s, into res: the warp kernels
 * for the full blocks of its fast chunks when warp, then the CTA kernel for the rest; the first
 * kernel launched resets *z (then NULL). */
template <int E>
static void wk_apply_group(const wsync_kdelta_batch_t *b, int grp, cudaStream_t s, int warp,
                           wsync_kdelta_result_t *res, wk_reset_t *z)
{
    const wk_group_span_t sp = wk_group_span(b, grp, warp);
    const uint64_t g0 = sp.g0, nw = sp.nw, nl = sp.nl;
    const uint32_t *gl = sp.gl;
    if (sp.nb == 0)
        return;
    /* with the hash, the entries first (measured: 5 % faster with the hash, 7 % slower
     * without it, where the apply writes only the changed values) */
    uint4 *rec = b->flag ? reinterpret_cast<uint4 *>(b->status) : NULL;
    if (nw > 0 && rec != NULL) {
        wkw_apply_entries<E><<<(unsigned)((nw + WK_THREADS - 1) / WK_THREADS), WK_THREADS, 0, s>>>(
            b->chunks, b->bmap, g0, nw, b->lens, rec, *z);
        z->r = NULL;
    }
    if (nw > 0) {
        wkw_delta_apply<E><<<(unsigned)((nw + WKW_WARPS - 1) / WKW_WARPS), WKW_THREADS, 0, s>>>(
            b->chunks, b->bmap, g0, nw, b->lens, b->leaves, res, b->flag, rec, *z);
        z->r = NULL;
    }
    if (nl > 0) {
        wk_delta_apply<E><<<(unsigned)nl, WK_THREADS, b->flag ? WK_DBLK * E : 0, s>>>(
            b->chunks, b->bmap, g0, gl, b->lens, b->leaves, res, b->flag, *z);
        z->r = NULL;
    }
}

void wk_delta_launch_apply(const wsync_kdelta_batch_t *b, cudaStream_t s, int warp,
                           wsync_kdelta_result_t *res, wk_reset_t z)
{
    wk_apply_group<1>(b, 0, s, warp, res, &z);
    wk_apply_group<2>(b, 1, s, warp, res, &z);
    wk_apply_group<4>(b, 2, s, warp, res, &z);
    wk_apply_group<8>(b, 3, s, warp, res, &z);
}
