/* Pack and unpack: a batch of strided 2-D copies, with bf16/f16/f32 casts, in one launch.
 *
 * Each copy is cut into *items* (G elements, or G bytes for a same-dtype copy, moved by one
 * vector load and store) laid out as [rows, items per row]; a row whose length is not a multiple
 * of G ends with a partial item done element by element. Items are grouped into units of
 * WK_UNIT; every block takes a unit, finds its copy by binary search over the units' prefix sums,
 * and its threads take consecutive items (coalesced). G is the widest (16 bytes at most) that the
 * copy's addresses and pitches allow; a copy whose pitches equal its cols is one long row. */
#include "kernels/common.cuh"

#include <inttypes.h>
#include <stdlib.h>

/* [ncopies] on the device, with unit_begin[ncopies + 1] after it. */
typedef struct {
    const unsigned char *src;          /* first element of the source region */
    unsigned char *dst;
    uint64_t sp, dp;                   /* row pitches, bytes */
    uint64_t rows;
    uint64_t full;                     /* whole items per row */
    uint32_t rem;                      /* elements (bytes for a copy) of the partial item, 0: none */
    uint32_t kind;                     /* op * 8 + width index */
} wk_copy_desc_t;

/* ops: 0 same dtype (bytes), then the casts */
static const struct {
    int from, to;
} wk_casts[7] = {{WK_BYTE, WK_BYTE}, {WK_BF16, WK_F16}, {WK_BF16, WK_F32}, {WK_F16, WK_BF16},
                 {WK_F16, WK_F32},   {WK_F32, WK_BF16}, {WK_F32, WK_F16}};

struct wsync_kcopy_batch {
    wk_copy_desc_t *descs;             /* device */
    uint64_t *unit_begin;              /* device, inside the same allocation */
    uint32_t n;
    int casts;                         /* some copy converts */
    uint64_t units;
    uint64_t bytes_read, bytes_written;
    uint32_t max_blocks;               /* grid cap, 0: one block per unit */
};

/* ------------------------------------------------------------------------------------------ */
/* Device side                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/* Same dtype: items of G bytes. A thread loads its WK_IPT items, then stores them; a partial item
 * (a row's last bytes) is copied byte by byte on the spot. */
template <int G>
__device__ __forceinline__ void wk_copy_unit(const wk_copy_desc_t *__restrict__ dp, uint64_t first)
{
    const wk_copy_desc_t d = *dp;
    constexpr int NW = G >= 4 ? G / 4 : 1;
    const uint64_t ipr = d.full + (d.rem != 0), items = d.rows * ipr;
    uint32_t w[WK_IPT][NW];
    unsigned char *to[WK_IPT];

#pragma unroll
    for (int k = 0; k < WK_IPT; k++) {
        uint64_t it = first + threadIdx.x + (uint64_t)k * WK_THREADS, r, c;
        to[k] = NULL;
        if (it < items) {
            wk_divmod(it, ipr, d.rows, r, c);
            const unsigned char *s = d.src + r * d.sp + c * G;
            unsigned char *t = d.dst + r * d.dp + c * G;
            if (c < d.full) {
                wk_load_words<G>(s, w[k]);
                to[k] = t;
            } else {
                for (uint32_t j = 0; j < d.rem; j++)
                    t[j] = s[j];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < WK_IPT; k++)
        if (to[k] != NULL)
            wk_store_words<G>(to[k], w[k]);
}

/* Cast SK -> DK: items of G elements, loaded as raw words first, converted on the way out;
 * items of 8 bytes and more go two at a time, to stay within the registers. */
template <int SK, int DK, int G>
__device__ __forceinline__ void wk_cast_unit(const wk_copy_desc_t *__restrict__ dp, uint64_t first)
{
    const wk_copy_desc_t d = *dp;
    constexpr int SS = wk_size(SK), DS = wk_size(DK);
    constexpr int SB = G * SS, NW = SB >= 4 ? SB / 4 : 1, P = SB >= 8 ? 2 : WK_IPT;
    const uint64_t ipr = d.full + (d.rem != 0), items = d.rows * ipr;

#pragma unroll
    for (int k0 = 0; k0 < WK_IPT; k0 += P) {
        uint32_t w[P][NW];
        unsigned char *to[P];
#pragma unroll
        for (int k = 0; k < P; k++) {
            uint64_t it = first + threadIdx.x + (uint64_t)(k0 + k) * WK_THREADS, r, c;
            to[k] = NULL;
            if (it < items) {
                wk_divmod(it, ipr, d.rows, r, c);
                const unsigned char *s = d.src + r * d.sp + c * SB;
                unsigned char *t = d.dst + r * d.dp + c * (G * DS);
                if (c < d.full) {
                    wk_load_words<SB>(s, w[k]);
                    to[k] = t;
                } else {
                    for (uint32_t j = 0; j < d.rem; j++)
                        wk_store_one<DK>(t + j * DS,
                                         wk_from_f32<DK>(wk_to_f32<SK>(wk_load_one<SK>(s + j * SS))));
                }
            }
        }
#pragma unroll
        for (int k = 0; k < P; k++) {
            if (to[k] == NULL)
                continue;
            uint32_t e[G];
#pragma unroll
            for (int i = 0; i < G; i++) {
                uint32_t x;
                if constexpr (SS == 4)
                    x = w[k][i];
                else
                    x = (w[k][i / 2] >> (16 * (i & 1))) & 0xffffu;
                e[i] = wk_from_f32<DK>(wk_to_f32<SK>(x));
            }
            wk_store_elems<DK, G>(to[k], e);
        }
    }
}

#define WK_CAST_CASES(op, SK, DK)                                                             \
    case op * 8 + 0: wk_cast_unit<SK, DK, 8>(dp, first); break;                                \
    case op * 8 + 1: wk_cast_unit<SK, DK, 4>(dp, first); break;                                \
    case op * 8 + 2: wk_cast_unit<SK, DK, 2>(dp, first); break;                                \
    case op * 8 + 3: wk_cast_unit<SK, DK, 1>(dp, first); break;

/* The copy holding unit u: unit_begin[lo] <= u < unit_begin[lo + 1]. */
__device__ __forceinline__ uint32_t wk_unit_copy(const uint64_t *__restrict__ unit_begin,
                                                 uint32_t n, uint64_t u)
{
    uint32_t lo = 0, hi = n;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (unit_begin[mid] <= u)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* CASTS: the batch holds casts (the general kernel); else only byte copies: a smaller kernel that
 * keeps all its state in registers. */
template <bool CASTS>
__global__ void __launch_bounds__(WK_THREADS, 3)
wk_copy_kernel(const wk_copy_desc_t *__restrict__ descs, const uint64_t *__restrict__ unit_begin,
               uint32_t n, uint64_t units)
{
    for (uint64_t u = blockIdx.x; u < units; u += gridDim.x) {
        const uint32_t lo = wk_unit_copy(unit_begin, n, u);
        const wk_copy_desc_t *dp = &descs[lo];
        const uint64_t first = (u - unit_begin[lo]) * WK_UNIT;
        switch (dp->kind) {
        case 0: wk_copy_unit<16>(dp, first); break;
        case 1: wk_copy_unit<8>(dp, first); break;
        case 2: wk_copy_unit<4>(dp, first); break;
        case 3: wk_copy_unit<2>(dp, first); break;
        case 4: wk_copy_unit<1>(dp, first); break;
        default:
            if constexpr (CASTS) {
                switch (dp->kind) {
        WK_CAST_CASES(1, WK_BF16, WK_F16)
        WK_CAST_CASES(2, WK_BF16, WK_F32)
        WK_CAST_CASES(3, WK_F16, WK_BF16)
        WK_CAST_CASES(4, WK_F16, WK_F32)
        WK_CAST_CASES(5, WK_F32, WK_BF16)
        WK_CAST_CASES(6, WK_F32, WK_F16)
                default: break;
                }
            }
            break;
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Host side                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static int wk_aligned(uint64_t v, uint64_t a) { return (v & (a - 1)) == 0; }

/* Check one copy and lay it out. Returns WSYNC_OK with *units 0 for an empty copy. */
static wsync_status_t wk_copy_prepare(const wsync_kcopy_t *c, uint32_t i, wk_copy_desc_t *d,
                                      uint64_t *units, uint64_t *rd, uint64_t *wr)
{
    static const char fn[] = "wsync_kernels_batch_create";
    size_t ss = wsync_dtype_size(c->src_dtype), ds = wsync_dtype_size(c->dst_dtype);
    int op = -1;

    *units = 0;
    if (ss == 0 || ds == 0)
        return wsync_err(WSYNC_ERR_INVALID, "%s: copy %" PRIu32 ": unknown dtype (%d -> %d)", fn, i,
                         (int)c->src_dtype, (int)c->dst_dtype);
    if (c->src_dtype == c->dst_dtype) {
        op = 0;
    } else {
        int sk = wk_kind(c->src_dtype), dk = wk_kind(c->dst_dtype);
        for (int k = 1; k < 7 && sk >= 0 && dk >= 0; k++)
            if (wk_casts[k].from == sk && wk_casts[k].to == dk)
                op = k;
        if (op < 0)
            return wsync_err(WSYNC_ERR_UNSUPPORTED, "%s: copy %" PRIu32 ": no conversion from %s to %s",
                             fn, i, wsync_dtype_name(c->src_dtype), wsync_dtype_name(c->dst_dtype));
    }
    if (c->rows == 0 || c->cols == 0)
        return WSYNC_OK;
    if (c->src == NULL || c->dst == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: copy %" PRIu32 ": %s is NULL", fn, i,
                         c->src == NULL ? "src" : "dst");
    if (c->rows > 1 && (c->src_pitch < c->cols || c->dst_pitch < c->cols))
        return wsync_err(WSYNC_ERR_INVALID, "%s: copy %" PRIu32 ": cols %" PRIu64 " above the %s pitch %" PRIu64,
                         fn, i, c->cols, c->src_pitch < c->cols ? "source" : "destination",
                         c->src_pitch < c->cols ? c->src_pitch : c->dst_pitch);
    {   /* the furthest element must be addressable */
        uint64_t lim = UINT64_C(1) << 56;
        uint64_t mp = c->src_pitch > c->dst_pitch ? c->src_pitch : c->dst_pitch;
        if (c->cols >= lim || c->rows >= lim || (mp > 0 && c->rows - 1 > (lim - c->cols) / mp) ||
            c->src_off >= lim || c->dst_off >= lim)
            return wsync_err(WSYNC_ERR_INVALID, "%s: copy %" PRIu32 ": region too large", fn, i);
    }

    uint64_t rows = c->rows, cols = c->cols;
    uint64_t sp = c->src_pitch * ss, dp = c->dst_pitch * ds;
    uint64_t sa = (uint64_t)(uintptr_t)c->src + c->src_off * ss;
    uint64_t da = (uint64_t)(uintptr_t)c->dst + c->dst_off * ds;
    if (rows == 1 || (c->src_pitch == cols && c->dst_pitch == cols)) {
        cols *= rows;
        rows = 1;
    }
    *rd = c->rows * c->cols * ss;
    *wr = c->rows * c->cols * ds;

    int widx;
    uint64_t g;
    if (op == 0) {
        /* bytes: the widest of 16, 8, 4, 2, 1 both sides allow */
        cols *= ss;
        for (widx = 0, g = 16; g > 1; widx++, g /= 2)
            if (wk_aligned(sa, g) && wk_aligned(da, g) &&
                (rows == 1 || (wk_aligned(sp, g) && wk_aligned(dp, g))))
                break;
    } else {
        /* G elements: loads of G * ss bytes need min(16, G * ss) alignment, stores likewise */
        for (widx = 0, g = 8; g > 1; widx++, g /= 2) {
            uint64_t la = g * ss < 16 ? g * ss : 16, sta = g * ds < 16 ? g * ds : 16;
            if (wk_aligned(sa, la) && wk_aligned(da, sta) &&
                (rows == 1 || (wk_aligned(sp, la) && wk_aligned(dp, sta))))
                break;
        }
    }
    d->src = (const unsigned char *)(uintptr_t)sa;
    d->dst = (unsigned char *)(uintptr_t)da;
    d->sp = sp;
    d->dp = dp;
    d->rows = rows;
    d->full = cols / g;
    d->rem = (uint32_t)(cols % g);
    d->kind = (uint32_t)(op * 8 + widx);
    uint64_t items = rows * (d->full + (d->rem != 0));
    *units = items / WK_UNIT + (items % WK_UNIT != 0);
    return WSYNC_OK;
}

/* Lay out n copies on the host: descs and unit_begin[nlive + 1]. */
static wsync_status_t wk_batch_build(const wsync_kcopy_t *descs, uint32_t n, wk_copy_desc_t **out_d,
                                     uint64_t **out_u, uint32_t *nlive, uint64_t *units,
                                     uint64_t *rd, uint64_t *wr, int *casts)
{
    int any_cast = 0;
    wk_copy_desc_t *d = NULL;
    uint64_t *ub = NULL;
    uint32_t m = 0;
    uint64_t total = 0, r = 0, w = 0;

    if (n > 0 && descs == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_kernels_batch_create: descs is NULL with n = %" PRIu32, n);
    d = (wk_copy_desc_t *)malloc((size_t)(n ? n : 1) * sizeof(*d));
    ub = (uint64_t *)malloc(((size_t)n + 1) * sizeof(*ub));
    if (d == NULL || ub == NULL) {
        free(d);
        free(ub);
        return wsync_err(WSYNC_ERR_NOMEM, "wsync_kernels_batch_create: %" PRIu32 " copies", n);
    }
    for (uint32_t i = 0; i < n; i++) {
        uint64_t u = 0, cr = 0, cw = 0;
        wsync_status_t st = wk_copy_prepare(&descs[i], i, &d[m], &u, &cr, &cw);
        if (st != WSYNC_OK) {
            free(d);
            free(ub);
            return st;
        }
        if (u == 0)
            continue;
        any_cast |= d[m].kind >= 8;
        ub[m++] = total;
        total += u;
        r += cr;
        w += cw;
    }
    ub[m] = total;
    *out_d = d;
    *out_u = ub;
    *nlive = m;
    *units = total;
    *rd = r;
    *wr = w;
    *casts = any_cast;
    return WSYNC_OK;
}

static wsync_status_t wk_batch_run(const wk_copy_desc_t *d, const uint64_t *ub, uint32_t n,
                                   uint64_t units, int casts, uint32_t max_blocks,
                                   cudaStream_t stream)
{
    if (units == 0)
        return WSYNC_OK;
    unsigned grid = wk_grid(units);
    if (max_blocks > 0 && grid > max_blocks)
        grid = max_blocks;   /* the grid-stride loop takes the rest */
    if (casts)
        wk_copy_kernel<true><<<grid, WK_THREADS, 0, stream>>>(d, ub, n, units);
    else
        wk_copy_kernel<false><<<grid, WK_THREADS, 0, stream>>>(d, ub, n, units);
    return wk_launched("copy kernel launch");
}

extern "C" {

wsync_status_t wsync_kernels_pack_desc(const wsync_chunk_t *chunk, const void *shard_data,
                                       void *bucket, wsync_kcopy_t *out)
{
    if (chunk == NULL || shard_data == NULL || bucket == NULL || out == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_kernels_pack_desc: NULL argument");
    size_t esz = wsync_dtype_size(chunk->dtype);
    if (esz == 0)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_kernels_pack_desc: unknown dtype %d",
                         (int)chunk->dtype);
    if (chunk->bucket_off % esz != 0)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_kernels_pack_desc: bucket offset %" PRIu64
                         " is not a multiple of the %zu-byte element", chunk->bucket_off, esz);
    wsync_kcopy_t c = {shard_data, bucket, chunk->src.off, chunk->src.pitch,
                       chunk->bucket_off / esz, chunk->src.cols, chunk->src.rows,
                       chunk->src.cols, chunk->dtype, chunk->dtype};
    *out = c;
    return WSYNC_OK;
}

wsync_status_t wsync_kernels_unpack_desc(const wsync_segment_t *seg, const wsync_chunk_t *chunk,
                                         const void *bucket, wsync_dtype_t dst_dtype,
                                         void *target_data, wsync_kcopy_t *out)
{
    if (seg == NULL || chunk == NULL || bucket == NULL || target_data == NULL || out == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "unpack: NULL argument");
    if (dst_dtype != chunk->dtype &&
        (dst_dtype == WSYNC_DTYPE_F8E4M3FN || dst_dtype == WSYNC_DTYPE_F8E5M2))
        return wsync_err(WSYNC_ERR_UNSUPPORTED, "unpack: %s into an %s target is the quantizer's "
                         "job (land the values in a float staging buffer, then quantize)",
                         wsync_dtype_name(chunk->dtype), wsync_dtype_name(dst_dtype));
    size_t esz = wsync_dtype_size(chunk->dtype);
    if (esz == 0 || wsync_dtype_size(dst_dtype) == 0)
        return wsync_err(WSYNC_ERR_INVALID, "unpack: unknown dtype (%d -> %d)", (int)chunk->dtype,
                         (int)dst_dtype);
    if (seg->dst.rows != chunk->src.rows || seg->dst.cols != chunk->src.cols)
        return wsync_err(WSYNC_ERR_INVALID, "unpack: source %" PRIu64 " x %" PRIu64
                         ", destination %" PRIu64 " x %" PRIu64, chunk->src.rows, chunk->src.cols,
                         seg->dst.rows, seg->dst.cols);
    if (dst_dtype != chunk->dtype && (wk_kind(dst_dtype) < 0 || wk_kind(chunk->dtype) < 0))
        return wsync_err(WSYNC_ERR_UNSUPPORTED, "unpack: no conversion from %s to %s",
                         wsync_dtype_name(chunk->dtype), wsync_dtype_name(dst_dtype));
    if (chunk->bucket_off % esz != 0)
        return wsync_err(WSYNC_ERR_INVALID, "unpack: bucket offset %" PRIu64
                         " is not a multiple of the %zu-byte element", chunk->bucket_off, esz);
    wsync_kcopy_t c = {bucket, target_data, chunk->bucket_off / esz, chunk->src.cols,
                       seg->dst.off, seg->dst.pitch, chunk->src.rows, chunk->src.cols,
                       chunk->dtype, dst_dtype};
    *out = c;
    return WSYNC_OK;
}

wsync_status_t wsync_kernels_batch_create(const wsync_kcopy_t *descs, uint32_t n,
                                          wsync_kcopy_batch_t **batch)
{
    wk_copy_desc_t *d;
    uint64_t *ub;
    uint32_t m;
    uint64_t units, rd, wr;
    wsync_kcopy_batch_t *b;
    wsync_status_t st;
    cudaError_t e;
    void *mem = NULL;
    int casts = 0;

    if (batch == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_kernels_batch_create: batch is NULL");
    st = wk_batch_build(descs, n, &d, &ub, &m, &units, &rd, &wr, &casts);
    if (st != WSYNC_OK)
        return st;
    b = (wsync_kcopy_batch_t *)calloc(1, sizeof(*b));
    if (b == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "wsync_kernels_batch_create: batch");
        goto err;
    }
    if (m > 0) {
        size_t dbytes = (size_t)m * sizeof(*d), ubytes = ((size_t)m + 1) * sizeof(*ub);
        e = cudaMalloc(&mem, dbytes + ubytes);
        if (e != cudaSuccess) {
            st = wk_cuda(e, "wsync_kernels_batch_create: cudaMalloc");
            goto err;
        }
        e = cudaMemcpy(mem, d, dbytes, cudaMemcpyHostToDevice);
        if (e == cudaSuccess)
            e = cudaMemcpy((char *)mem + dbytes, ub, ubytes, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) {
            st = wk_cuda(e, "wsync_kernels_batch_create: cudaMemcpy");
            goto err;
        }
        b->descs = (wk_copy_desc_t *)mem;
        b->unit_begin = (uint64_t *)((char *)mem + dbytes);
    }
    b->n = m;
    b->casts = casts;
    b->units = units;
    b->bytes_read = rd;
    b->bytes_written = wr;
    free(d);
    free(ub);
    *batch = b;
    return WSYNC_OK;
err:
    if (mem != NULL)
        cudaFree(mem);
    free(b);
    free(d);
    free(ub);
    return st;
}

wsync_status_t wsync_kernels_batch_launch(const wsync_kcopy_batch_t *batch, void *stream)
{
    if (batch == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_kernels_batch_launch: batch is NULL");
    return wk_batch_run(batch->descs, batch->unit_begin, batch->n, batch->units, batch->casts,
                        batch->max_blocks, (cudaStream_t)stream);
}

void wsync_kernels_batch_limit(wsync_kcopy_batch_t *batch, uint32_t max_blocks)
{
    if (batch != NULL)
        batch->max_blocks = max_blocks;
}

void wsync_kernels_batch_info(const wsync_kcopy_batch_t *batch, uint64_t *bytes_read,
                              uint64_t *bytes_written, uint32_t *ncopies)
{
    if (bytes_read != NULL)
        *bytes_read = batch != NULL ? batch->bytes_read : 0;
    if (bytes_written != NULL)
        *bytes_written = batch != NULL ? batch->bytes_written : 0;
    if (ncopies != NULL)
        *ncopies = batch != NULL ? batch->n : 0;
}

void wsync_kernels_batch_free(wsync_kcopy_batch_t *batch)
{
    if (batch == NULL)
        return;
    if (batch->descs != NULL)
        cudaFree(batch->descs);
    free(batch);
}

wsync_status_t wsync_kernels_copy(const wsync_kcopy_t *descs, uint32_t n, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    wk_copy_desc_t *d;
    uint64_t *ub;
    uint32_t m;
    uint64_t units, rd, wr;
    wsync_status_t st;
    cudaError_t e;
    void *mem = NULL;
    int casts = 0;

    st = wk_batch_build(descs, n, &d, &ub, &m, &units, &rd, &wr, &casts);
    if (st != WSYNC_OK)
        return st;
    if (m > 0) {
        size_t dbytes = (size_t)m * sizeof(*d), ubytes = ((size_t)m + 1) * sizeof(*ub);
        e = cudaMallocAsync(&mem, dbytes + ubytes, s);
        if (e != cudaSuccess) {
            st = wk_cuda(e, "wsync_kernels_copy: cudaMallocAsync");
            goto out;
        }
        /* from pageable memory: returns once the bytes are staged, so d and ub may go */
        e = cudaMemcpyAsync(mem, d, dbytes, cudaMemcpyHostToDevice, s);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync((char *)mem + dbytes, ub, ubytes, cudaMemcpyHostToDevice, s);
        if (e != cudaSuccess) {
            st = wk_cuda(e, "wsync_kernels_copy: cudaMemcpyAsync");
            goto out;
        }
        st = wk_batch_run((const wk_copy_desc_t *)mem, (const uint64_t *)((char *)mem + dbytes), m,
                          units, casts, 0, s);
    }
out:
    if (mem != NULL) {
        e = cudaFreeAsync(mem, s);
        if (e != cudaSuccess && st == WSYNC_OK)
            st = wk_cuda(e, "wsync_kernels_copy: cudaFreeAsync");
    }
    free(d);
    free(ub);
    return st;
}

} /* extern "C" */
