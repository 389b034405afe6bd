/* The delta codec of core/delta.h on the GPU: batched encode and apply, and XXH3_64bits on the
 * device (kernels/delta.h says what and why). This file holds the batches (create, launch,
 * results), the chunk hashes and XXH3 of ranges; the encode kernels are in
 * kernels/delta_encode.cu, the apply kernels in kernels/delta_apply.cu, what they share in
 * kernels/delta_dev.cuh. This comment says how they all work.
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
 * list of its blocks (glist). Both take a block's payload offset from its chunk's cursor, one
 * atomicAdd of the payload's size and k once the block is compared (format 3 lets payloads lie
 * in any order): no block waits for another, and new and old are read once. Until session 39
 * the payloads were in block order (format 2) and each block found its offset by a decoupled
 * look-back over the blocks before it: 10 % of the encoder's time at 5 % changed (H100).
 * WSYNC_KDELTA_OLD=1 runs wk_delta_encode for every block (the kernels before the warp
 * encoder, to compare in one run).
 *
 * Mask words and escapes: SPARSE's byte-gap index (formats 2 and 3) needs, per element, the escapes
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
 * reads new and old once (2 GiB) and writes the stream (table 1 MiB, payloads ~1.7 % of 1 GiB: a
 * SPARSE block of k ~ 41 is al8(k + e) + al8(2k) ~ 136 bytes), the leaves (1 MiB); apply with the
 * hash reads the target once (1 GiB), the stream (~18 MiB), and writes the ~38 sectors with a
 * change of each block whole; without the hash the ~41 changed
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
#include "kernels/delta_dev.cuh"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Chunk hashes, results, XXH3 of ranges                                                       */
/* ------------------------------------------------------------------------------------------ */

/* Chunk blockIdx.x: XXH3 of its leaves (the tree hash) into res (an apply's, on the device). After
 * an encode (status: its cursors, then the block counters) res is the pinned host results, a
 * chunk's whole entry written here, and the cursors and counters are left 0 for the next launch:
 * the results' copy and the init kernel before the encoder had cost an encode 9-11 us a launch
 * on an H100 (749 against 740 us for 1 GiB at 1 % changed; 22-25 against 13 us for 64 blocks). */
__global__ void __launch_bounds__(WK_THREADS)
wk_delta_chunk_hash(const wk_dchunk_t *__restrict__ ch, const uint64_t *leaves,
                    unsigned long long *status, uint64_t nblocks, wsync_kdelta_result_t *res)
{
    __shared__ uint64_t sec[24], hsum[WK_THREADS];
    wk_secret_load(sec);
    __syncthreads();
    const wk_dchunk_t &d = ch[blockIdx.x];
    uint64_t h = wk_xxh3(reinterpret_cast<const unsigned char *>(leaves + d.block0),
                         8 * (uint64_t)d.nb, reinterpret_cast<const unsigned char *>(sec), hsum);
    if (threadIdx.x == 0) {
        res[d.idx].hash = h;
        if (status != NULL) {   /* an encode: the chunk's cursor */
            const uint64_t c = status[d.block0];
            status[d.block0] = 0;
            res[d.idx].len = 16 + 8 * (uint64_t)d.nb + 8 * (c & WK_CUR_WORDS);
            res[d.idx].changed = c >> WK_CUR_KSHIFT;
            res[d.idx].fault = WSYNC_KDELTA_NO_FAULT;
        }
    }
    if (status != NULL && blockIdx.x == 0 && threadIdx.x < 4)
        status[nblocks + threadIdx.x] = 0;   /* the block counters */
}

/* Results to their starting values: len, hash, changed 0, no fault; the chunks' cursors and
 * the block counters 0. */
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

/* WSYNC_KDELTA_WARP=1: the warp kernels for every launch, whatever the density (where a chunk
 * allows them), so that a test covers them on any data; the default picks by density (below). */
static int wk_force_warp(void)
{
    return wk_env_on("WSYNC_KDELTA_WARP");
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
    free(b->esz);
    free(b->nbl);
    free(b);
}

/* b's one device allocation (its chunks, lens, status + counters, leaves, results, CTA block
 * list and block map) for b->n chunks of b->nblocks blocks, and the pointers into it. */
static cudaError_t wk_batch_alloc(wsync_kdelta_batch_t *b)
{
    const uint64_t n = b->n, g = b->nblocks;
    const uint64_t o_ch = 0, o_lens = o_ch + wk_al8(n * sizeof(wk_dchunk_t));
    /* status at a multiple of 16: the warp apply's records are read as uint4 (with an odd count
     * of chunks it had been 8 bytes off: a misaligned address, session 38) */
    const uint64_t o_st = (o_lens + 8 * n + 15) & ~UINT64_C(15);
    const uint64_t o_lv = o_st + 8 * (b->apply ? (b->flag ? 4 * g : 0) : g + 4);
    const uint64_t o_res = o_lv + 8 * g;
    const uint64_t o_gl = o_res + (b->apply ? 2 : 1) * n * sizeof(wsync_kdelta_result_t);
    const uint64_t o_bm = o_gl + 4 * g, total = o_bm + 4 * g;
    const cudaError_t e = cudaMalloc(&b->dev, total ? total : 8);
    if (e != cudaSuccess)
        return e;
    unsigned char *base = (unsigned char *)b->dev;
    b->chunks = (wk_dchunk_t *)(base + o_ch);
    b->lens = (uint64_t *)(base + o_lens);
    b->status = (unsigned long long *)(base + o_st);
    b->leaves = (uint64_t *)(base + o_lv);
    b->res = (wsync_kdelta_result_t *)(base + o_res);
    b->glist = (uint32_t *)(base + o_gl);
    b->bmap = (uint32_t *)(base + o_bm);
    b->dev_bytes = total;
    return cudaSuccess;
}

/* b's results: the pinned host copy (mapped: an encode's chunk hash kernel writes it), their
 * event, an apply's pinned lengths, and the starting state of the first launch (an encode's
 * cursors and block counters 0, an apply's two halves of results reset): no init kernel. */
static wsync_status_t wk_batch_results(wsync_kdelta_batch_t *b)
{
    const uint32_t n = b->n;
    cudaError_t e = cudaHostAlloc((void **)&b->host,
                                  (size_t)(n ? n : 1) * sizeof(wsync_kdelta_result_t),
                                  cudaHostAllocMapped);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&b->res_ev, cudaEventDisableTiming);
    if (e == cudaSuccess && b->apply)
        e = cudaMallocHost((void **)&b->lens_host, (size_t)(n ? n : 1) * 8);
    if (e != cudaSuccess)
        return wk_cuda(e, "wsync_kdelta: cudaMallocHost");
    for (uint32_t i = 0; i < n; i++) {
        b->host[i].len = b->host[i].hash = b->host[i].changed = 0;
        b->host[i].fault = WSYNC_KDELTA_NO_FAULT;
    }
    if (!b->apply) {   /* cursors and counters clean for the first launch; results straight home */
        e = cudaMemset(b->status, 0, (size_t)(b->nblocks + 4) * 8);
        if (e == cudaSuccess)
            e = cudaHostGetDevicePointer((void **)&b->host_dev, b->host, 0);
    } else {        /* both halves of the results at their starting values */
        for (int h = 0; h < 2 && e == cudaSuccess; h++)
            e = cudaMemcpy(b->res + h * n, b->host, (size_t)n * sizeof(wsync_kdelta_result_t),
                           cudaMemcpyHostToDevice);
    }
    if (e != cudaSuccess)
        return wk_cuda(e, "wsync_kdelta: the batch's cursors and results");
    b->clean = 1;
    return WSYNC_OK;
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

    if ((e = wk_batch_alloc(b)) != cudaSuccess) {
        st = wk_cuda(e, "wsync_kdelta: cudaMalloc");
        goto fail;
    }
    if ((st = wk_batch_results(b)) != WSYNC_OK)
        goto fail;
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
            /* the CTA kernels' blocks, ascending per group (the order the encoder reads them): the
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
        b->esz = (uint8_t *)malloc((size_t)(n ? n : 1));
        if (b->esz == NULL) {
            st = wsync_err(WSYNC_ERR_NOMEM, "%s: %" PRIu32 " element sizes", fn, n);
            goto fail;
        }
        b->nbl = (uint64_t *)malloc((size_t)(n ? n : 1) * 8);
        if (b->nbl == NULL) {
            st = wsync_err(WSYNC_ERR_NOMEM, "%s: %" PRIu32 " block counts", fn, n);
            goto fail;
        }
        for (uint32_t i = 0; i < n; i++) {
            b->esz[i] = (uint8_t)esz[i];
            b->nbl[i] = d[i].nb;
        }
    } else if (b->grp[3].g1 > b->grp[3].g0) {
        /* 8-byte elements: 64 KiB of shared memory a block, past the default 48 */
        e = wk_delta_encode_smem8();
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
    /* No kernel before the launch's own: an encode finds its cursors and block counters clean
     * (its chunk hash kernel leaves them so, and create did), an apply its half of the results
     * (the last launch's first kernel reset it, or create did). After a launch that failed
     * part-way, the init kernel does it. */
    wsync_kdelta_result_t *res = b->res + (b->apply && b->half ? b->n : 0);
    wk_reset_t z = {NULL, b->n};
    if (b->apply)
        z.r = b->res + (b->half ? 0 : b->n);
    if (!b->clean) {
        uint64_t nst = b->apply ? 0 : b->nblocks + 4, most = nst > b->n ? nst : b->n;
        unsigned grid = (unsigned)(most / WK_THREADS + 1 < 1024 ? most / WK_THREADS + 1 : 1024);
        wk_delta_init<<<grid, WK_THREADS, 0, s>>>(res, b->n, b->status, nst);
    }
    b->clean = 0;   /* until every kernel of this launch is enqueued */
    /* The warp kernels win only where few elements change. An encode takes them while the last
     * launch whose results had landed (its event done: read no sooner) found under 15 % changed
     * (tests/gpu/test_delta_kernels, H100, 1 GiB bf16, (CTA -> warp) ms at 2 %, 5 %, 10 %, 20 %
     * changed: 1.38 -> 0.80, 1.62 -> 0.97, 1.77 -> 1.41, 1.26 -> 1.79). An apply estimates its
     * changed elements from its streams (a SPARSE change costs an index byte and its value):
     * with the hash (every scheme's default) the warp kernel's one pass over the block (merge,
     * whole sectors, hash) wins while blocks fit wkw_sparse_small, under WKW_SMALL / WK_DBLK
     * (6.25 %) changed: (CTA -> warp) ms at 2 %, 3 %, 5 %, 6 %, 7 %: 1.08 -> 0.63, 1.10 -> 0.67,
     * 1.16 -> 0.70, 1.19 -> 0.88, 1.22 -> 1.92; without the hash, where the warp kernel writes
     * each change on its own, under 2 %: at 1 % 0.56 -> 0.31, at 2 % 0.61 -> 0.64 (session 38,
     * docs/delta.md). */
    int warp = b->warp_enc;
    if (b->apply) {
        const uint64_t *l = lens != NULL ? lens : b->lens_default;
        double changed = 0;
        for (uint32_t i = 0; i < b->n; i++)
            changed += (double)l[i] / (1.0 + b->esz[i]);
        const double cut = b->flag ? (double)WKW_SMALL / WK_DBLK : 0.02;
        warp = changed < cut * (double)b->elems;
    } else if (b->launched && cudaEventQuery(b->res_ev) == cudaSuccess) {
        uint64_t changed = 0;
        for (uint32_t i = 0; i < b->n; i++)
            changed += b->host[i].changed;
        warp = b->warp_enc = (double)changed < 0.15 * (double)b->elems;
    }
    if (wk_force_warp())
        warp = 1;
    if (b->apply)
        wk_delta_launch_apply(b, s, warp, res, z);
    else
        wk_delta_launch_encode(b, s, warp);
    if (b->apply && b->flag)
        wk_delta_chunk_hash<<<b->n, WK_THREADS, 0, s>>>(b->chunks, b->leaves, NULL, 0, res);
    else if (!b->apply)
        wk_delta_chunk_hash<<<b->n, WK_THREADS, 0, s>>>(b->chunks, b->leaves, b->status,
                                                        b->nblocks, b->host_dev);
    wsync_status_t st = wk_launched("wsync_kdelta_launch: kernel launch");
    if (st != WSYNC_OK)
        return st;
    if (b->apply) {
        e = cudaMemcpyAsync(b->host, res, (size_t)b->n * sizeof(wsync_kdelta_result_t),
                            cudaMemcpyDeviceToHost, s);
        if (e != cudaSuccess)
            return wk_cuda(e, "wsync_kdelta_launch: cudaMemcpyAsync (results)");
    }
    e = cudaEventRecord(b->res_ev, s);
    if (e != cudaSuccess)
        return wk_cuda(e, "wsync_kdelta_launch: cudaEventRecord (results)");
    b->launched = 1;
    b->split = 0;
    b->clean = 1;
    b->half ^= b->apply;
    return WSYNC_OK;
}

const wsync_kdelta_result_t *wsync_kdelta_results(wsync_kdelta_batch_t *b)
{
    if (b == NULL)
        return NULL;
    if (b->apply && b->launched && !b->split) {
        /* the last of an apply's checks (format 3): the payloads of the blocks, each inside
         * the payload area, must fill it; the kernels counted them beside k (wk_app_count) */
        const uint64_t *l = b->lens_changed ? b->lens_host : b->lens_default;
        for (uint32_t i = 0; i < b->n; i++) {
            wsync_kdelta_result_t *r = &b->host[i];
            const uint64_t tbl = 16 + 8 * b->nbl[i];
            r->len = (r->changed >> WK_APP_SHIFT) * 8;
            r->changed &= (UINT64_C(1) << WK_APP_SHIFT) - 1;
            if (r->fault == WSYNC_KDELTA_NO_FAULT && l[i] >= tbl && r->len != l[i] - tbl)
                r->fault = ((b->nbl[i] - 1) << 8) | WSYNC_KDELTA_FAULT_TABLE;
        }
        b->split = 1;
    }
    return b->host;
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
