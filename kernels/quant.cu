/* amax and FP8 quantization, bit for bit as reshard/fp8.c does it (wsync_quantize_f32).
 *
 * Per-tensor: an amax kernel (per-thread maxima of |x| bits, one atomic per warp), then an encode
 * kernel that forms the one scale itself. Both run as many blocks as the device holds at once,
 * each thread taking items a grid apart, a batch of 8 (16-byte) items loaded before any is used;
 * the encoder is picked once a thread, not per item.
 *
 * Per-channel and block: kernels over the *cells* (a row, a block), each forming its cell's amax,
 * scale and codes:
 *  - cells of whole 16-byte rows up to 128 KiB (every real case: rows of a weight, 128 x 128
 *    blocks): G threads a cell (8 .. 1024) hold the whole cell in registers, 8 chunks of 16 bytes
 *    a thread at most, all loads issued before any is used; amax over the group, then the codes
 *    from the registers. Each element is read once, in one coalesced 16-byte load, and no shared
 *    memory beyond the reduction's words limits how many blocks an SM holds;
 *  - small unaligned cells (a warp each), and cells too large for the registers: a group of
 *    threads per cell keeps it in shared memory (or, too large, reads it twice, from L2).
 *
 * Arithmetic matches the CPU: amax on bit patterns; s = amax / fmax (with the eps floor for
 * blocks, then UE8M0, then 1 for s < FLT_MIN); x / s for tensor and channel, x * (1 / s) for
 * blocks; every operation rounded to nearest even in f32 (no contraction, no approximation).
 * Two cheaper forms, both exact:
 *  - x / s as q = x * y, r = fma(-q, s, x), q + r * y with y = RN(1 / s) per cell (Markstein's
 *    correction: checked against div.rn.f32 for every pair of f32 significands on an H200, which
 *    covers every exponent while nothing under- or overflows; |x| in (0, 2^-100), where the
 *    residual could lose bits, takes div.rn; the sign is put back afterwards, so -0 stays -0);
 *  - the FP8 encoder as cvt.rn.satfinite.{e4m3,e5m2}x2.f32 (sm_89 and later; checked equal to
 *    the integer algorithm of wsync_fp8_encode_bits for every finite f32, and cells holding NaN
 *    or Inf are never encoded; before sm_89 the integer algorithm runs). Without saturation the
 *    code differs only where |x| rounds past the largest finite value, to maxcode (E4M3FN 0x7f,
 *    E5M2 0x7c): the saturated code plus one, sign kept. That is where |x| >= T, T the midpoint
 *    of the largest finite value and the next step if the tie goes up to the even code, else one
 *    ulp above it: E4M3FN 464 ties down to 0x7e, T = 464 + ulp; E5M2 61440 ties up to 0x7c,
 *    T = 61440 (checked for every finite f32 and both signs against wsync_fp8_encode_bits). */
#include "kernels/common.cuh"

#include <cuda_fp16.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

extern "C" {
#include "kernels/device.h"
#include "reshard/convert.h"
#include "reshard/fp8.h"
}

/* Constants of wsync_fp8_encode_bits for one format and overflow mode. */
typedef struct {
    uint32_t drop;                     /* f32 mantissa bits dropped */
    uint32_t rnd;                      /* (1 << (drop - 1)) - 1 */
    uint32_t rebias;                   /* (127 - bias) << 23 */
    uint32_t magic;                    /* (151 - bias - man_bits) << 23 */
    uint32_t sub_lim;                  /* (128 - bias) << 23: below it the result is subnormal */
    uint32_t maxcode;
} wk_fp8_fmt_t;

typedef struct {
    const unsigned char *x;
    uint64_t xp;                       /* x row pitch, bytes */
    unsigned char *out;
    uint64_t op;                       /* out row pitch, bytes */
    float *scales;
    uint32_t *ws;                      /* [0] amax bits (per-tensor), [1] non-finite seen */
    const float *amax_in;              /* per-tensor: an agreed amax, copied into ws[0] instead
                                          of the amax kernel's; NULL: x's own */
    uint64_t rows, cols;
    uint64_t br, bc, nbr, nbc;         /* cells: size, and how many down and across */
    float fmax, eps;
    int block, ue8m0;
    int hw;                            /* wk_encode_as's HW, 1 .. 4 (before sm_89 all mean 0) */
    wk_fp8_fmt_t f;
    const char *name;                  /* host only: the target, for messages */
} wk_quant_params_t;

static const char wk_qfn[] = "wsync_kernels_quantize";

/* A [rows, items per row] walk over a matrix for the per-tensor kernels. */
typedef struct {
    uint64_t rows, full;               /* rows; whole items a row, then one of rem elements */
    uint32_t rem;
} wk_walk_t;

/* ------------------------------------------------------------------------------------------ */
/* Device helpers                                                                               */
/* ------------------------------------------------------------------------------------------ */

__device__ __forceinline__ uint32_t wk_fp8_encode(uint32_t u, const wk_fp8_fmt_t &f)
{
    uint32_t sign = (u >> 24) & 0x80u;
    uint32_t a = u & 0x7fffffffu;
    uint32_t n = a - f.rebias;
    n += f.rnd + ((n >> f.drop) & 1u);
    n >>= f.drop;
    uint32_t r = __float_as_uint(__fadd_rn(__uint_as_float(a), __uint_as_float(f.magic))) - f.magic;
    uint32_t code = (int32_t)a < (int32_t)f.sub_lim ? r : n;
    code = (int32_t)code > (int32_t)f.maxcode ? f.maxcode : code;
    code = (int32_t)a > (int32_t)0x7f800000 ? 0x7fu : code;
    return sign | code;
}

/* cell_scale of reshard/fp8.c */
__device__ __forceinline__ float wk_cell_scale(uint32_t amax_u, const wk_quant_params_t &p)
{
    float amax = __uint_as_float(amax_u);
    if (p.block && amax < p.eps)
        amax = p.eps;
    float s = __fdiv_rn(amax, p.fmax);
    if (p.ue8m0) {
        uint32_t u = __float_as_uint(s);
        uint32_t e = ((u >> 23) & 0xffu) + ((u & 0x7fffffu) != 0);
        e = e < 1 ? 1 : e > 254 ? 254 : e;
        s = __uint_as_float(e << 23);
    }
    if (!(s >= __uint_as_float(0x00800000u)))   /* FLT_MIN */
        s = 1.0f;
    return s;
}

/* A cell's amax found: false for NaN or Inf (the flag finish reports raised), else its scale s
 * (lane 0 writes it to scales) and RN(1 / s). */
__device__ __forceinline__ bool wk_cell_open(const wk_quant_params_t &p, uint32_t m, uint64_t cell,
                                             uint32_t lane, float &s, float &inv)
{
    if (m >= 0x7f800000u) {
        if (lane == 0)
            p.ws[1] = 1;
        return false;
    }
    s = wk_cell_scale(m, p);
    inv = __fdiv_rn(1.0f, s);
    if (lane == 0)
        p.scales[cell] = s;
    return true;
}

/* x / s exactly as div.rn.f32 rounds it, for x = |value| given as bits a and y = RN(1 / s), where
 * s is a tensor or channel scale (FLT_MIN <= s < 2^120, so y is normal) and x >= 2^-100 or 0:
 * Markstein's correction (see the top of the file). */
__device__ __forceinline__ float wk_div_abs(uint32_t a, float s, float y)
{
    const float x = __uint_as_float(a);
    const float q = __fmul_rn(x, y);
    return __fmaf_rn(__fmaf_rn(-q, s, x), y, q);
}

/* x in (0, 2^-100), where the residual of wk_div_abs might not be exact: div.rn itself. */
__device__ __forceinline__ bool wk_div_tiny(uint32_t a) { return a - 1u < 0x0d7fffffu; }

/* FP8 codes of V values (f32 bits, signs included) packed little-endian into words w:
 * HW 1 / 2 the hardware conversion to saturated E4M3 / E5M2, 3 / 4 the same without saturation
 * (the conversion, plus one where |x| >= T: see the top of the file), 0 the integer algorithm. */
template <int HW, int V>
__device__ __forceinline__ void wk_encode_as(const uint32_t *y, uint32_t *w, const wk_fp8_fmt_t &f)
{
    constexpr int NW = V >= 4 ? V / 4 : 1;
#pragma unroll
    for (int i = 0; i < NW; i++)
        w[i] = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if constexpr (HW != 0 && V % 2 == 0) {
#pragma unroll
        for (int i = 0; i < V; i += 2) {
            unsigned short h;
            /* the second source goes to the low byte */
            if constexpr (HW == 1 || HW == 3)
                asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;"
                    : "=h"(h) : "f"(__uint_as_float(y[i])), "f"(__uint_as_float(y[i + 1])));
            else
                asm("cvt.rn.satfinite.e5m2x2.f32 %0, %2, %1;"
                    : "=h"(h) : "f"(__uint_as_float(y[i])), "f"(__uint_as_float(y[i + 1])));
            uint32_t c = h;
            if constexpr (HW >= 3) {   /* 0x7e / 0x7b, signed or not, + 1: no carry */
                const float t = __uint_as_float(HW == 3 ? 0x43e80001u : 0x47700000u);
                c += (fabsf(__uint_as_float(y[i])) >= t ? 1u : 0u) +
                     (fabsf(__uint_as_float(y[i + 1])) >= t ? 0x100u : 0u);
            }
            w[i / 4] |= c << (8 * (i & 3));
        }
    } else
#endif
    {
#pragma unroll
        for (int i = 0; i < V; i++)
            w[i / 4] |= wk_fp8_encode(y[i], f) << (8 * (i & 3));
    }
}

/* Codes of V values u (f32 bits) of a cell with scale s and inv = RN(1 / s): x * inv for blocks
 * (BLOCK), x / s for the others, as wsync_quantize_f32 forms them; HW as wk_encode_as. */
template <int BLOCK, int HW, int V>
__device__ __forceinline__ void wk_quant_as(const uint32_t *u, float s, float inv,
                                            const wk_fp8_fmt_t &f, uint32_t *w)
{
    uint32_t y[V];
    if constexpr (BLOCK) {
#pragma unroll
        for (int i = 0; i < V; i++)
            y[i] = __float_as_uint(__fmul_rn(__uint_as_float(u[i]), inv));
    } else {
        bool tiny = false;
#pragma unroll
        for (int i = 0; i < V; i++) {
            const uint32_t a = u[i] & 0x7fffffffu;
            tiny |= wk_div_tiny(a);
            y[i] = __float_as_uint(wk_div_abs(a, s, inv)) | (u[i] & 0x80000000u);
        }
        if (tiny) {                    /* rare: redo those elements by division */
#pragma unroll
            for (int i = 0; i < V; i++) {
                const uint32_t a = u[i] & 0x7fffffffu;
                if (wk_div_tiny(a))
                    y[i] = __float_as_uint(__fdiv_rn(__uint_as_float(a), s)) | (u[i] & 0x80000000u);
            }
        }
    }
    wk_encode_as<HW, V>(y, w, f);
}

/* The same with the scheme and encoder read from p (uniform branches). */
template <int V>
__device__ __forceinline__ void wk_quant_v(const uint32_t *u, float s, float inv,
                                           const wk_quant_params_t &p, uint32_t *w)
{
#define WK_QUANT_HW(B)                                                                        \
    switch (p.hw) {                                                                           \
    case 1: wk_quant_as<B, 1, V>(u, s, inv, p.f, w); break;                                   \
    case 2: wk_quant_as<B, 2, V>(u, s, inv, p.f, w); break;                                   \
    case 3: wk_quant_as<B, 3, V>(u, s, inv, p.f, w); break;                                   \
    default: wk_quant_as<B, 4, V>(u, s, inv, p.f, w); break;                                  \
    }
    if (p.block)
        WK_QUANT_HW(1)
    else
        WK_QUANT_HW(0)
#undef WK_QUANT_HW
}

/* One item: V elements of kind XK as f32 bits (whole), or the first `rem` of them; returns the
 * max of their |bits|. */
template <int XK, int V>
__device__ __forceinline__ uint32_t wk_load_item(const unsigned char *p, bool whole, uint32_t rem,
                                                 uint32_t *u)
{
    constexpr int XS = wk_size(XK);
    uint32_t m = 0;
    if (whole) {
        wk_load_elems<XK, V>(p, u);
#pragma unroll
        for (int i = 0; i < V; i++) {
            u[i] = wk_to_f32<XK>(u[i]);
            m = max(m, u[i] & 0x7fffffffu);
        }
    } else {
#pragma unroll
        for (int i = 0; i < V; i++) {
            u[i] = 0;
            if ((uint32_t)i < rem) {
                u[i] = wk_to_f32<XK>(wk_load_one<XK>(p + i * XS));
                m = max(m, u[i] & 0x7fffffffu);
            }
        }
    }
    return m;
}

/* Store an item's V codes, packed in words w (all V, or the first rem). */
template <int V>
__device__ __forceinline__ void wk_store_codes(unsigned char *o, bool whole, uint32_t rem,
                                               const uint32_t *w)
{
    if (whole) {
        wk_store_words<V>(o, w);
    } else {
#pragma unroll
        for (int i = 0; i < V; i++)
            if ((uint32_t)i < rem)
                o[i] = (unsigned char)(w[i / 4] >> (8 * (i & 3)));
    }
}

/* Encode an item's V values and store the codes (all V, or the first rem). */
template <int V>
__device__ __forceinline__ void wk_store_item(unsigned char *o, bool whole, uint32_t rem,
                                              const uint32_t *u, float s, float inv,
                                              const wk_quant_params_t &p)
{
    constexpr int NW = V >= 4 ? V / 4 : 1;
    uint32_t w[NW];
    wk_quant_v<V>(u, s, inv, p, w);
    wk_store_codes<V>(o, whole, rem, w);
}

/* ------------------------------------------------------------------------------------------ */
/* Cells: per-channel and block                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Items of a cell a thread takes, k = 0, 1, ...: item lane + k * G of the [crows, ipr] cell,
 * walked as (row, col) with steps of G items. 32-bit: the host keeps cells within that. */
struct wk_cell_walk {
    uint32_t r, c, drow, dcol, ipr;

    __device__ __forceinline__ void start(uint32_t lane, uint32_t g, uint32_t crows, uint32_t n)
    {
        ipr = n;
        if (n == 0) {
            r = crows;
            c = drow = dcol = 0;
        } else {
            r = lane / n;
            c = lane % n;
            drow = g / n;
            dcol = g % n;
        }
    }

    __device__ __forceinline__ void next()
    {
        r += drow;
        c += dcol;
        if (c >= ipr) {
            c -= ipr;
            r++;
        }
    }
};

/* Items a thread loads before using them (memory-level parallelism with few registers). */
#define WK_BATCH (V >= 8 ? 2 : 4)

/* G threads per cell, NT per block (G == 32: a warp per cell, NT / 32 cells a block; else
 * G == NT). CACHE: the cell is read once from memory and kept in shared memory, CI items a
 * thread (32 values); otherwise it is read twice. */
template <int XK, int V, int G, int NT, bool CACHE>
__global__ void __launch_bounds__(NT, 1024 / NT) wk_cells_kernel(const wk_quant_params_t p)
{
    constexpr int XS = wk_size(XK);
    constexpr int CI = 32 / V;
    constexpr int CPB = NT / G;
    extern __shared__ uint4 wk_smem[];
    __shared__ uint32_t red[2][NT / 32];
    const uint32_t lane = threadIdx.x % G;
    const uint64_t ncells = p.nbr * p.nbc;
    /* this group's cache: item k of the thread at words ((k * G + lane) * V), as V / 4 uint4
     * chunks laid out lane-major so that a warp's accesses are contiguous */
    uint32_t *cache = reinterpret_cast<uint32_t *>(wk_smem) + (threadIdx.x / G) * (G * 32);
    int phase = 0;

    for (uint64_t base = (uint64_t)blockIdx.x * CPB; base < ncells;
         base += (uint64_t)gridDim.x * CPB) {
        const uint64_t cell = base + threadIdx.x / G;
        if (cell >= ncells)                    /* a whole warp (G == 32 only) */
            continue;
        const uint64_t bi = cell / p.nbc, bj = cell - bi * p.nbc;
        const uint64_t r0 = bi * p.br, c0 = bj * p.bc;
        const uint32_t crows = (uint32_t)min(p.br, p.rows - r0);
        const uint32_t ccols = (uint32_t)min(p.bc, p.cols - c0);
        const unsigned char *xc = p.x + r0 * p.xp + c0 * XS;
        unsigned char *oc = p.out + r0 * p.op + c0;
        const uint32_t full = ccols / V, rem = ccols % V;
        wk_cell_walk w0;
        w0.start(lane, G, crows, full + (rem != 0));

        /* pass 1: amax (and the cache) */
        uint32_t m = 0;
        {
            wk_cell_walk w = w0;
            for (int k0 = 0; CACHE ? k0 < CI : w.r < crows; k0 += WK_BATCH) {
                uint32_t v[WK_BATCH][V];
                bool ok[WK_BATCH];
#pragma unroll
                for (int j = 0; j < WK_BATCH; j++) {
                    ok[j] = w.r < crows && (!CACHE || k0 + j < CI);
                    if (ok[j])
                        m = max(m, wk_load_item<XK, V>(xc + w.r * p.xp + (uint64_t)w.c * (V * XS), w.c < full,
                                                       rem, v[j]));
                    w.next();
                }
                if constexpr (CACHE) {
#pragma unroll
                    for (int j = 0; j < WK_BATCH; j++) {
                        if (!ok[j])
                            continue;
                        const int k = k0 + j;
                        if constexpr (V >= 4) {
#pragma unroll
                            for (int q = 0; q < V / 4; q++)
                                reinterpret_cast<uint4 *>(cache)[(k * (V / 4) + q) * G + lane] =
                                    make_uint4(v[j][4 * q], v[j][4 * q + 1], v[j][4 * q + 2],
                                               v[j][4 * q + 3]);
                        } else {
#pragma unroll
                            for (int q = 0; q < V; q++)
                                cache[(k * V + q) * G + lane] = v[j][q];
                        }
                    }
                }
            }
        }

        m = __reduce_max_sync(0xffffffffu, m);
        if constexpr (G > 32) {
            if ((threadIdx.x & 31) == 0)
                red[phase][threadIdx.x >> 5] = m;
            __syncthreads();
#pragma unroll
            for (int i = 0; i < G / 32; i++)
                m = max(m, red[phase][i]);
            phase ^= 1;
        }
        /* (each thread reads back only what it wrote itself: no barrier needed for the cache,
         * and the next cell's writes come after this cell's reads in every thread) */
        float s, inv;
        if (!wk_cell_open(p, m, cell, lane, s, inv))
            continue;

        /* pass 2: encode */
        wk_cell_walk w = w0;
        if constexpr (CACHE) {
#pragma unroll 4
            for (int k = 0; k < CI; k++) {
                if (w.r >= crows)
                    break;
                uint32_t v[V];
                if constexpr (V >= 4) {
#pragma unroll
                    for (int q = 0; q < V / 4; q++) {
                        uint4 t = reinterpret_cast<const uint4 *>(cache)[(k * (V / 4) + q) * G + lane];
                        v[4 * q] = t.x;
                        v[4 * q + 1] = t.y;
                        v[4 * q + 2] = t.z;
                        v[4 * q + 3] = t.w;
                    }
                } else {
#pragma unroll
                    for (int q = 0; q < V; q++)
                        v[q] = cache[(k * V + q) * G + lane];
                }
                wk_store_item<V>(oc + w.r * p.op + (uint64_t)w.c * V, w.c < full, rem, v, s, inv, p);
                w.next();
            }
        } else {
            while (w.r < crows) {
                uint32_t v[WK_BATCH][V];
                uint32_t rr[WK_BATCH], cc[WK_BATCH];
#pragma unroll
                for (int j = 0; j < WK_BATCH; j++) {
                    rr[j] = w.r;
                    cc[j] = w.c;
                    if (w.r < crows)
                        wk_load_item<XK, V>(xc + w.r * p.xp + (uint64_t)w.c * (V * XS), w.c < full, rem, v[j]);
                    w.next();
                }
#pragma unroll
                for (int j = 0; j < WK_BATCH; j++)
                    if (rr[j] < crows)
                        wk_store_item<V>(oc + rr[j] * p.op + (uint64_t)cc[j] * V, cc[j] < full, rem, v[j], s,
                                         inv, p);
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Cells in registers: cells whose rows are whole, aligned 16-byte chunks                       */
/* ------------------------------------------------------------------------------------------ */

#define WK_RIPT 8                      /* 16-byte chunks a thread holds at most */

/* Threads of a block for G threads a cell: 256 at least, so that small cells share a block. */
#define WK_REG_NT(G) ((G) > 256 ? (G) : 256)

/* Running max of |x| over NW words of elements of kind XK: on the f32 bits (f32), or on two
 * 16-bit halves at once (bf16, f16, whose magnitudes order like their bit patterns, as do their
 * f32 images). */
template <int XK, int NW>
__device__ __forceinline__ uint32_t wk_words_amax(const uint32_t *w, uint32_t m)
{
#pragma unroll
    for (int i = 0; i < NW; i++) {
        if constexpr (XK == WK_F32)
            m = max(m, w[i] & 0x7fffffffu);
        else
            m = __vmaxu2(m, w[i] & 0x7fff7fffu);
    }
    return m;
}

template <int XK>
__device__ __forceinline__ uint32_t wk_chunk_amax(const uint4 &v, uint32_t m)
{
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    return wk_words_amax<XK, 4>(w, m);
}

/* That running max as the f32 bits of |x|. */
template <int XK>
__device__ __forceinline__ uint32_t wk_chunk_amax_bits(uint32_t m)
{
    if constexpr (XK == WK_F32)
        return m;
    else
        return wk_to_f32<XK>(max(m >> 16, m & 0xffffu));
}

/* The first V elements of kind XK packed little-endian in words w, as f32 bits, for a cell known
 * to be finite (f16 by the hardware conversion, exact for every finite value). */
template <int XK, int V>
__device__ __forceinline__ void wk_words_f32(const uint32_t *w, uint32_t *u)
{
#pragma unroll
    for (int i = 0; i < V; i++) {
        if constexpr (XK == WK_F32) {
            u[i] = w[i];
        } else {
            const uint32_t e = (w[i / 2] >> (16 * (i & 1))) & 0xffffu;
            if constexpr (XK == WK_BF16)
                u[i] = e << 16;
            else
                u[i] = __float_as_uint(__half2float(__ushort_as_half((unsigned short)e)));
        }
    }
}

/* The chunk's 16 / size(XK) elements as f32 bits, likewise. */
template <int XK>
__device__ __forceinline__ void wk_chunk_f32(const uint4 &v, uint32_t *u)
{
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    wk_words_f32<XK, 16 / wk_size(XK)>(w, u);
}

/* Pass 2 of a cell in registers: encode the chunks a thread holds and store their codes. */
template <int XK, int G, int BLOCK, int HW>
__device__ __forceinline__ void wk_cell_codes(const uint4 *v, uint32_t lane, uint32_t n, uint32_t r,
                                              uint32_t c, uint32_t dr, uint32_t dc, uint32_t cpr,
                                              unsigned char *oc, uint64_t op, float s, float inv,
                                              const wk_fp8_fmt_t &f)
{
    constexpr int V = 16 / wk_size(XK);
#pragma unroll
    for (int k = 0; k < WK_RIPT; k++) {
        if (lane + (uint32_t)k * G < n) {
            uint32_t u[V], w[V / 4];
            wk_chunk_f32<XK>(v[k], u);
            wk_quant_as<BLOCK, HW, V>(u, s, inv, f, w);
            wk_store_words<V>(oc + (uint64_t)r * op + (uint64_t)c * V, w);
        }
        r += dr;
        c += dc;
        if (c >= cpr) {
            c -= cpr;
            r++;
        }
    }
}

/* G threads a cell (a power of two, 8 .. 1024), NT / G cells a block. The cell's [crows, cpr]
 * chunks of 16 bytes are taken in row-major order, chunk lane + k * G by thread `lane` for
 * k < WK_RIPT (a warp reads whole rows, or 512 contiguous bytes of one), all loaded into
 * registers before the first is used; then the group's amax (a warp reduction, and for G > 32
 * one barrier), the scale, and the codes from the registers (stores of 4 or 8 bytes, coalesced
 * likewise). The host keeps cells within G * WK_RIPT chunks.
 * One group's cell of p (valid: the group has one this round). Every thread of the block calls
 * it equally often: the barrier of G > 32 is inside. */
template <int XK, int G>
__device__ __forceinline__ void wk_reg_cell(const wk_quant_params_t &p, uint64_t cell, bool valid,
                                            uint32_t lane, uint32_t grp,
                                            uint32_t (*red)[WK_REG_NT(G) / 32], int &phase)
{
    constexpr int NT = WK_REG_NT(G), XS = wk_size(XK), V = 16 / XS;
    constexpr int NWG = G >= 32 ? G / 32 : 1;
    (void)NT;
    const unsigned char *xc = p.x;
    unsigned char *oc = p.out;
    uint32_t n = 0, cpr = 1, r = 0, c = 0, dr = 0, dc = 0;
    if (valid) {
        uint64_t bi, bj;
        if (p.nbc == 1) {
            bi = cell;
            bj = 0;
        } else if (((cell | p.nbc) >> 32) == 0) {
            bi = (uint32_t)cell / (uint32_t)p.nbc;
            bj = (uint32_t)cell - (uint32_t)bi * (uint32_t)p.nbc;
        } else {
            bi = cell / p.nbc;
            bj = cell - bi * p.nbc;
        }
        const uint64_t r0 = bi * p.br, c0 = bj * p.bc;
        const uint32_t crows = (uint32_t)min(p.br, p.rows - r0);
        cpr = (uint32_t)(min(p.bc, p.cols - c0) / V);
        n = crows * cpr;
        xc += r0 * p.xp + c0 * XS;
        oc += r0 * p.op + c0;
        r = lane / cpr;
        c = lane - r * cpr;
        dr = (uint32_t)G / cpr;
        dc = (uint32_t)G - dr * cpr;
    }

    uint4 v[WK_RIPT];
    {
        uint32_t rr = r, cc = c;
#pragma unroll
        for (int k = 0; k < WK_RIPT; k++) {
            v[k] = make_uint4(0, 0, 0, 0);
            if (lane + (uint32_t)k * G < n)
                v[k] = *reinterpret_cast<const uint4 *>(xc + (uint64_t)rr * p.xp + (uint64_t)cc * 16);
            rr += dr;
            cc += dc;
            if (cc >= cpr) {
                cc -= cpr;
                rr++;
            }
        }
    }
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < WK_RIPT; k++)
        m = wk_chunk_amax<XK>(v[k], m);
    m = wk_chunk_amax_bits<XK>(m);
    if constexpr (G < 32) {
#pragma unroll
        for (int o = G / 2; o > 0; o /= 2)
            m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    } else {
        m = __reduce_max_sync(0xffffffffu, m);
        if constexpr (G > 32) {
            if ((threadIdx.x & 31) == 0)
                red[phase][threadIdx.x >> 5] = m;
            __syncthreads();
#pragma unroll
            for (int i = 0; i < NWG; i++)
                m = max(m, red[phase][grp * NWG + i]);
            phase ^= 1;        /* the next write to red[phase] is a barrier away from these reads */
        }
    }
    if (n == 0)
        return;
    float s, inv;
    if (!wk_cell_open(p, m, cell, lane, s, inv))
        return;
#define WK_CELL_CODES(B, H)                                                                   \
    wk_cell_codes<XK, G, B, H>(v, lane, n, r, c, dr, dc, cpr, oc, p.op, s, inv, p.f)
#define WK_CELL_HW(B)                                                                         \
    switch (p.hw) {                                                                           \
    case 1: WK_CELL_CODES(B, 1); break;                                                       \
    case 2: WK_CELL_CODES(B, 2); break;                                                       \
    case 3: WK_CELL_CODES(B, 3); break;                                                       \
    default: WK_CELL_CODES(B, 4); break;                                                      \
    }
    if (p.block)
        WK_CELL_HW(1)
    else
        WK_CELL_HW(0)
#undef WK_CELL_HW
#undef WK_CELL_CODES
}

template <int XK, int G>
__global__ void __launch_bounds__(WK_REG_NT(G), WK_REG_NT(G) == 256 ? 3 : 1024 / WK_REG_NT(G))
wk_cells_reg_kernel(const wk_quant_params_t p)
{
    constexpr int NT = WK_REG_NT(G), CPB = NT / G;
    __shared__ uint32_t red[2][NT / 32];
    const uint32_t lane = threadIdx.x % G, grp = threadIdx.x / G;
    const uint64_t ncells = p.nbr * p.nbc;
    int phase = 0;

    for (uint64_t base = (uint64_t)blockIdx.x * CPB; base < ncells;
         base += (uint64_t)gridDim.x * CPB)
        wk_reg_cell<XK, G>(p, base + grp, base + grp < ncells, lane, grp, red, phase);
}

/* Several quantizations in one launch (wsync_kernels_quantize_many): their cells numbered one
 * after another, run j's from first[j]. Passed by value and read in place (__grid_constant__):
 * no upload, and the pointers are the launch's own. */
#define WK_MANY 12
typedef struct {
    wk_quant_params_t p[WK_MANY];
    uint64_t first[WK_MANY + 1];
    uint32_t n;
} wk_qmany_t;

template <int XK, int G>
__global__ void __launch_bounds__(WK_REG_NT(G), WK_REG_NT(G) == 256 ? 3 : 1024 / WK_REG_NT(G))
wk_cells_reg_many_kernel(const __grid_constant__ wk_qmany_t m)
{
    constexpr int NT = WK_REG_NT(G), CPB = NT / G;
    __shared__ uint32_t red[2][NT / 32];
    const uint32_t lane = threadIdx.x % G, grp = threadIdx.x / G;
    const uint64_t ncells = m.first[m.n];
    int phase = 0;

    for (uint64_t base = (uint64_t)blockIdx.x * CPB; base < ncells;
         base += (uint64_t)gridDim.x * CPB) {
        const uint64_t cell = base + grp;
        uint32_t j = 0;
        while (j + 1 < m.n && cell >= m.first[j + 1])
            j++;
        wk_reg_cell<XK, G>(m.p[j], cell - m.first[j], cell < ncells, lane, grp, red, phase);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Per-tensor: amax, then encode                                                                */
/* ------------------------------------------------------------------------------------------ */

/* Items of V elements a thread of the per-tensor kernels loads before using any: 8 of 16 bytes
 * keep 96 KiB an SM in flight with the encoder's 3 blocks an SM, as the cells in registers do
 * (half as many where the walk crosses rows, whose (row, col) steps cost registers too). */
#define WK_TIPT 8

/* The per-tensor kernels' walk over the [rows, ipr] items of w: in a grid no larger than the
 * device holds at once, thread g of S takes items g, g + S, g + 2S, ..., so every thread's share
 * is within one item of the others' (no last wave of blocks half empty), and (row, col) steps by
 * S without a division. ONE_ROW: a dense matrix walked as one row, where only the column moves. */
template <bool ONE_ROW>
struct wk_tensor_walk {
    uint64_t r, c;                     /* the item */
    uint64_t dr, dc, ipr, rows;        /* S as (rows, cols), and the matrix */
    static constexpr int ipt = ONE_ROW ? WK_TIPT : WK_TIPT / 2;     /* items a batch */

    __device__ __forceinline__ void start(const wk_walk_t &w)
    {
        const uint64_t g = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
        const uint64_t s = (uint64_t)gridDim.x * blockDim.x;
        rows = w.rows;
        ipr = w.full + (w.rem != 0);
        r = dr = 0;
        c = g;
        dc = s;
        if (!ONE_ROW && ipr > 0) {
            r = g / ipr;
            c = g - r * ipr;
            dr = s / ipr;
            dc = s - dr * ipr;
        }
    }

    __device__ __forceinline__ bool ok() const { return ONE_ROW ? c < ipr : r < rows; }

    /* This item and the next ipt - 1 all exist and are whole (for several rows a bound that
     * may say no for the last few batches, which then take the checked path). */
    __device__ __forceinline__ bool batch_whole(const wk_walk_t &w) const
    {
        if (ONE_ROW)
            return c + (ipt - 1) * dc < w.full;
        return w.rem == 0 && r + (ipt - 1) * (dr + 1) < rows;
    }

    __device__ __forceinline__ void next()
    {
        c += dc;
        if (!ONE_ROW) {
            r += dr;
            if (c >= ipr) {
                c -= ipr;
                r++;
            }
        }
    }
};

/* A batch (ipt items of V elements of kind XK) from the walk on, which moves past it: as they lie
 * in memory, packed little-endian in words raw (half the registers of their f32 bits for 16-bit
 * kinds), missing elements zero. WHOLE: batch_whole said so, nothing to check. */
template <int XK, int V, bool ONE_ROW, bool WHOLE, int NW>
__device__ __forceinline__ void wk_tensor_load(wk_tensor_walk<ONE_ROW> &it, const unsigned char *x,
                                               uint64_t xp, const wk_walk_t &w,
                                               uint32_t (*raw)[NW])
{
    constexpr int XS = wk_size(XK), NB = V * XS;
#pragma unroll
    for (int k = 0; k < wk_tensor_walk<ONE_ROW>::ipt; k++) {
        const unsigned char *p = x + it.r * xp + it.c * NB;
#pragma unroll
        for (int i = 0; i < NW; i++)
            raw[k][i] = 0;
        if (WHOLE || (it.ok() && it.c < w.full)) {
            wk_load_words<NB>(p, raw[k]);
        } else if (it.ok()) {
#pragma unroll
            for (int i = 0; i < V; i++)
                if ((uint32_t)i < w.rem)
                    raw[k][i * XS / 4] |= wk_load_one<XK>(p + i * XS) << (8 * (i * XS % 4));
        }
        it.next();
    }
}

template <int XK, int V, bool ONE_ROW>
__global__ void __launch_bounds__(WK_THREADS)
wk_amax_kernel(const unsigned char *__restrict__ x, uint64_t xp, const wk_walk_t w, uint32_t *amax)
{
    constexpr int NB = V * wk_size(XK), NW = NB >= 4 ? NB / 4 : 1;
    uint32_t m = 0;
    wk_tensor_walk<ONE_ROW> it;

    it.start(w);
    while (it.ok()) {
        uint32_t raw[wk_tensor_walk<ONE_ROW>::ipt][NW];
        if (it.batch_whole(w))
            wk_tensor_load<XK, V, ONE_ROW, true>(it, x, xp, w, raw);
        else
            wk_tensor_load<XK, V, ONE_ROW, false>(it, x, xp, w, raw);
#pragma unroll
        for (int k = 0; k < wk_tensor_walk<ONE_ROW>::ipt; k++)
            m = wk_words_amax<XK, NW>(raw[k], m);
    }
    m = __reduce_max_sync(0xffffffffu, wk_chunk_amax_bits<XK>(m));
    if ((threadIdx.x & 31) == 0 && m != 0)
        atomicMax(amax, m);
}

/* The codes of x / s for the batch loaded from walk o on: HW as wk_encode_as; WHOLE as
 * wk_tensor_load. */
template <int XK, int V, bool ONE_ROW, int HW, bool WHOLE, int NW>
__device__ __forceinline__ void wk_tensor_store(wk_tensor_walk<ONE_ROW> o,
                                                const wk_quant_params_t &p, const wk_walk_t &w,
                                                const uint32_t (*raw)[NW], float s, float inv)
{
#pragma unroll
    for (int k = 0; k < wk_tensor_walk<ONE_ROW>::ipt; k++) {
        if (WHOLE || o.ok()) {
            uint32_t u[V], code[V >= 4 ? V / 4 : 1];
            wk_words_f32<XK, V>(raw[k], u);
            wk_quant_as<0, HW, V>(u, s, inv, p.f, code);
            wk_store_codes<V>(p.out + o.r * p.op + o.c * V, WHOLE || o.c < w.full, w.rem, code);
        }
        o.next();
    }
}

template <int XK, int V, bool ONE_ROW, int HW>
__device__ __forceinline__ void wk_tensor_codes(const wk_quant_params_t &p, const wk_walk_t &w,
                                                float s, float inv)
{
    constexpr int NB = V * wk_size(XK), NW = NB >= 4 ? NB / 4 : 1;
    wk_tensor_walk<ONE_ROW> it;

    it.start(w);
    while (it.ok()) {
        uint32_t raw[wk_tensor_walk<ONE_ROW>::ipt][NW];
        const wk_tensor_walk<ONE_ROW> first = it;
        if (it.batch_whole(w)) {
            wk_tensor_load<XK, V, ONE_ROW, true>(it, p.x, p.xp, w, raw);
            wk_tensor_store<XK, V, ONE_ROW, HW, true>(first, p, w, raw, s, inv);
        } else {
            wk_tensor_load<XK, V, ONE_ROW, false>(it, p.x, p.xp, w, raw);
            wk_tensor_store<XK, V, ONE_ROW, HW, false>(first, p, w, raw, s, inv);
        }
    }
}

/* The encoder, picked once a thread rather than per item, so the loop is one stretch of code. */
template <int XK, int V, bool ONE_ROW>
__global__ void __launch_bounds__(WK_THREADS, 3)
wk_tensor_encode_kernel(const wk_quant_params_t p, const wk_walk_t w)
{
    const uint32_t m = *(volatile const uint32_t *)&p.ws[0];

    if (m >= 0x7f800000u) {
        if (blockIdx.x == 0 && threadIdx.x == 0)
            p.ws[1] = 1;
        return;
    }
    const float s = wk_cell_scale(m, p);
    const float inv = __fdiv_rn(1.0f, s);
    if (blockIdx.x == 0 && threadIdx.x == 0)
        p.scales[0] = s;
    switch (p.hw) {
    case 1: wk_tensor_codes<XK, V, ONE_ROW, 1>(p, w, s, inv); break;
    case 2: wk_tensor_codes<XK, V, ONE_ROW, 2>(p, w, s, inv); break;
    case 3: wk_tensor_codes<XK, V, ONE_ROW, 3>(p, w, s, inv); break;
    default: wk_tensor_codes<XK, V, ONE_ROW, 4>(p, w, s, inv); break;
    }
}

/* First non-finite element (row-major linear index), only run once one is known to exist. */
template <int XK>
__global__ void wk_find_kernel(const unsigned char *x, uint64_t xp, uint64_t rows, uint64_t cols,
                               unsigned long long *first)
{
    const uint64_t n = rows * cols;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t r = i / cols, c = i - r * cols;
        uint32_t u = wk_to_f32<XK>(wk_load_one<XK>(x + r * xp + c * wk_size(XK)));
        if ((u & 0x7f800000u) == 0x7f800000u)
            atomicMin(first, (unsigned long long)i);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Host side                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static wsync_status_t wk_sms(int *sms)
{
    int dev;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev);
    return e == cudaSuccess ? WSYNC_OK : wk_cuda(e, "cudaDeviceGetAttribute(multiprocessors)");
}

/* The walk of a [rows, cols] matrix by items of V elements (one row when both are dense). */
static wk_walk_t wk_walk(uint64_t rows, uint64_t cols, int dense, uint64_t v)
{
    wk_walk_t w;
    if (rows == 0 || cols == 0) {
        w.rows = w.full = 0;
        w.rem = 0;
        return w;
    }
    if (dense) {
        cols *= rows;
        rows = 1;
    }
    w.rows = rows;
    w.full = cols / v;
    w.rem = (uint32_t)(cols % v);
    return w;
}

/* Blocks for a per-tensor kernel: one per WK_THREADS * WK_TIPT items, but no more than the device
 * holds at once (wk_tensor_walk), and one at least. */
template <typename K>
static wsync_status_t wk_tensor_grid(K kernel, const wk_walk_t &w, int sms, unsigned *grid)
{
    const uint64_t items = w.rows * (w.full + (w.rem != 0)), per = (uint64_t)WK_THREADS * WK_TIPT;
    const uint64_t need = items / per + (items % per != 0);
    int per_sm = 1;
    if (need > (uint64_t)sms) {        /* small inputs skip the query */
        cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel,
                                                                      WK_THREADS, 0);
        if (e != cudaSuccess)
            return wk_cuda(e, "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    }
    const uint64_t cap = (uint64_t)sms * (uint64_t)(per_sm > 0 ? per_sm : 1);
    *grid = (unsigned)(need < cap ? (need > 0 ? need : 1) : cap);
    return WSYNC_OK;
}

template <int XK, int V>
static wsync_status_t wk_amax_launch(const unsigned char *x, uint64_t xp, const wk_walk_t &w,
                                     uint32_t *amax, int sms, cudaStream_t s)
{
    void (*k)(const unsigned char *, uint64_t, const wk_walk_t, uint32_t *) =
        w.rows <= 1 ? wk_amax_kernel<XK, V, true> : wk_amax_kernel<XK, V, false>;
    unsigned grid = 1;
    if (w.rows == 0)
        return WSYNC_OK;
    wsync_status_t st = wk_tensor_grid(k, w, sms, &grid);
    if (st != WSYNC_OK)
        return st;
    k<<<grid, WK_THREADS, 0, s>>>(x, xp, w, amax);
    return wk_launched("amax kernel launch");
}

/* Per-tensor: amax into ws[0], then encode (one block at least, to write the scale). */
template <int XK, int V>
static wsync_status_t wk_tensor_launch(const wk_quant_params_t &p, const wk_walk_t &w, int sms,
                                       cudaStream_t s)
{
    void (*k)(const wk_quant_params_t, const wk_walk_t) =
        w.rows <= 1 ? wk_tensor_encode_kernel<XK, V, true> : wk_tensor_encode_kernel<XK, V, false>;
    unsigned grid = 1;
    wsync_status_t st = WSYNC_OK;
    if (p.amax_in == NULL)
        st = wk_amax_launch<XK, V>(p.x, p.xp, w, p.ws, sms, s);
    if (st == WSYNC_OK)
        st = wk_tensor_grid(k, w, sms, &grid);
    if (st != WSYNC_OK)
        return st;
    k<<<grid, WK_THREADS, 0, s>>>(p, w);
    return wk_launched("quantize (per-tensor) kernel launch");
}

/* Vector width of the per-tensor walk: 16-byte loads when the input allows them. */
static int wk_vec_ok(const void *x, uint64_t xp_bytes, const void *out, uint64_t op, uint64_t v,
                     int one_row)
{
    return ((uintptr_t)x % 16 == 0) && (one_row || xp_bytes % 16 == 0) &&
           (out == NULL || ((uintptr_t)out % v == 0 && (one_row || op % v == 0)));
}

template <int XK>
static wsync_status_t wk_amax_any(const void *x, uint64_t rows, uint64_t cols, uint64_t x_pitch,
                                  uint32_t *amax, cudaStream_t s)
{
    constexpr int XS = wk_size(XK), VV = 16 / XS;
    int sms;
    wsync_status_t st = wk_sms(&sms);
    if (st != WSYNC_OK)
        return st;
    int dense = rows <= 1 || x_pitch == cols;
    uint64_t xp = x_pitch * XS;
    if (wk_vec_ok(x, xp, NULL, 0, VV, dense))
        return wk_amax_launch<XK, VV>((const unsigned char *)x, xp, wk_walk(rows, cols, dense, VV),
                                      amax, sms, s);
    return wk_amax_launch<XK, 1>((const unsigned char *)x, xp, wk_walk(rows, cols, dense, 1), amax,
                                 sms, s);
}

static wsync_status_t wk_amax_dispatch(int xk, const void *x, uint64_t rows, uint64_t cols,
                                       uint64_t x_pitch, uint32_t *amax, cudaStream_t s)
{
    switch (xk) {
    case WK_BF16: return wk_amax_any<WK_BF16>(x, rows, cols, x_pitch, amax, s);
    case WK_F16: return wk_amax_any<WK_F16>(x, rows, cols, x_pitch, amax, s);
    default: return wk_amax_any<WK_F32>(x, rows, cols, x_pitch, amax, s);
    }
}

template <int XK>
static wsync_status_t wk_tensor_run(const wk_quant_params_t &p, cudaStream_t s)
{
    constexpr int XS = wk_size(XK), VV = 16 / XS;
    int sms;
    wsync_status_t st = wk_sms(&sms);
    if (st != WSYNC_OK)
        return st;
    int dense = p.rows <= 1 || (p.xp == p.cols * XS && p.op == p.cols);
    int vec = wk_vec_ok(p.x, p.xp, p.out, p.op, VV, dense);
    wk_walk_t w = wk_walk(p.rows, p.cols, dense, vec ? VV : 1);
    return vec ? wk_tensor_launch<XK, VV>(p, w, sms, s) : wk_tensor_launch<XK, 1>(p, w, sms, s);
}

template <int XK, int V, int G, int NT, bool CACHE>
static wsync_status_t wk_cells_launch(const wk_quant_params_t &p, uint64_t ncells, cudaStream_t s)
{
    const size_t smem = CACHE ? (size_t)NT * 32 * sizeof(uint32_t) : 0;
    const uint64_t blocks = ncells / (NT / G) + (ncells % (NT / G) != 0);
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(wk_cells_kernel<XK, V, G, NT, CACHE>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess)
            return wk_cuda(e, "wsync_kernels_quantize: cudaFuncSetAttribute");
    }
    wk_cells_kernel<XK, V, G, NT, CACHE><<<wk_grid(blocks), NT, smem, s>>>(p);
    return wk_launched("quantize kernel launch");
}

/* A warp per cell for small cells, 512 threads for larger ones; cached in shared memory when the
 * cell has at most 32 values a thread. */
template <int XK, int V>
static wsync_status_t wk_cells_run_v(const wk_quant_params_t &p, cudaStream_t s)
{
    constexpr int CI = 32 / V;
    uint64_t ncells = p.nbr * p.nbc;
    uint64_t crows = p.br < p.rows ? p.br : p.rows, ccols = p.bc < p.cols ? p.bc : p.cols;
    uint64_t ipr = ccols / V + (ccols % V != 0), items = crows * ipr;
    if (ncells == 0)
        return WSYNC_OK;
    if (crows > INT32_MAX || ipr > INT32_MAX)
        return wsync_err(WSYNC_ERR_UNSUPPORTED, "%s: %s: a scale cell of %" PRIu64 " x %" PRIu64
                         " is beyond the GPU quantizer (2^31 rows or vectors a row)", wk_qfn,
                         p.name, crows, ccols);
    if (items <= 32u * CI)
        return wk_cells_launch<XK, V, 32, 256, true>(p, ncells, s);
    if (items <= 512u * CI)
        return wk_cells_launch<XK, V, 512, 512, true>(p, ncells, s);
    return wk_cells_launch<XK, V, 512, 512, false>(p, ncells, s);
}

template <int XK, int G>
static wsync_status_t wk_cells_reg_launch(const wk_quant_params_t &p, uint64_t ncells, cudaStream_t s)
{
    constexpr uint64_t CPB = WK_REG_NT(G) / G;
    wk_cells_reg_kernel<XK, G><<<wk_grid(ncells / CPB + (ncells % CPB != 0)), WK_REG_NT(G), 0, s>>>(p);
    return wk_launched("quantize (cells in registers) kernel launch");
}

/* f(std::integral_constant<int, g>) for g threads a cell (8, 16, .. 1024; others as 1024): the
 * register kernels' template argument from a run-time count. */
template <typename F>
static wsync_status_t wk_with_threads(int g, F f)
{
    switch (g) {
    case 8: return f(std::integral_constant<int, 8>{});
    case 16: return f(std::integral_constant<int, 16>{});
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    case 128: return f(std::integral_constant<int, 128>{});
    case 256: return f(std::integral_constant<int, 256>{});
    case 512: return f(std::integral_constant<int, 512>{});
    default: return f(std::integral_constant<int, 1024>{});
    }
}

/* Threads a cell for the register kernel (the fewest that hold the largest cell: 8 .. 1024), or
 * 0 where it does not apply: cells of whole 16-byte chunks (every cell's columns a multiple of
 * the vector), up to 1024 * WK_RIPT chunks (128 KiB). An empty matrix, whose cells still get
 * scale 1, goes to the general kernel. */
template <int XK>
static int wk_reg_threads(const wk_quant_params_t &p)
{
    constexpr int XS = wk_size(XK), VV = 16 / XS;
    int one_row = p.rows <= 1;
    int vec = wk_vec_ok(p.x, p.xp, p.out, p.op, VV, one_row) && (p.nbc == 1 || p.bc % VV == 0);
    uint64_t ncells = p.nbr * p.nbc;
    uint64_t crows = p.br < p.rows ? p.br : p.rows, ccols = p.bc < p.cols ? p.bc : p.cols;
    if (!vec || ncells == 0 || p.rows == 0 || p.cols == 0 || p.cols % VV != 0)
        return 0;
    uint64_t n = crows * (ccols / VV);
    for (int g = 8; g <= 1024; g *= 2)
        if (n <= (uint64_t)g * WK_RIPT)
            return g;
    return 0;
}

template <int XK>
static wsync_status_t wk_cells_run(const wk_quant_params_t &p, cudaStream_t s)
{
    constexpr int XS = wk_size(XK), VV = 16 / XS;
    uint64_t ncells = p.nbr * p.nbc;
    int vec = wk_vec_ok(p.x, p.xp, p.out, p.op, VV, p.rows <= 1) && (p.nbc == 1 || p.bc % VV == 0);
    int g = wk_reg_threads<XK>(p);
    if (g > 0)
        return wk_with_threads(g, [&](auto G) { return wk_cells_reg_launch<XK, G.value>(p, ncells, s); });
    return vec ? wk_cells_run_v<XK, VV>(p, s) : wk_cells_run_v<XK, 1>(p, s);
}

template <int XK, int G>
static wsync_status_t wk_many_launch(const wk_qmany_t &m, uint32_t max_blocks, cudaStream_t s)
{
    constexpr uint64_t CPB = WK_REG_NT(G) / G;
    const uint64_t ncells = m.first[m.n];
    unsigned grid = wk_grid(ncells / CPB + (ncells % CPB != 0));
    if (max_blocks > 0 && grid > max_blocks)
        grid = max_blocks;   /* the blocks loop over the rest */
    wk_cells_reg_many_kernel<XK, G><<<grid, WK_REG_NT(G), 0, s>>>(m);
    return wk_launched("quantize (several, cells in registers) kernel launch");
}

template <int XK>
static wsync_status_t wk_many_run(const wk_qmany_t &m, int g, uint32_t mb, cudaStream_t s)
{
    return wk_with_threads(g, [&](auto G) { return wk_many_launch<XK, G.value>(m, mb, s); });
}

static int wk_reg_threads_any(int xk, const wk_quant_params_t &p)
{
    switch (xk) {
    case WK_BF16: return wk_reg_threads<WK_BF16>(p);
    case WK_F16: return wk_reg_threads<WK_F16>(p);
    default: return wk_reg_threads<WK_F32>(p);
    }
}

/* quant_check and quant_grid of reshard/fp8.c, plus the input dtype and the workspace. */
static wsync_status_t wk_quant_prepare(const wsync_kquant_t *a, const void *ws,
                                       wk_quant_params_t *p, int *xk)
{
    const wsync_quant_t *q;

    if (a == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: arguments are NULL", wk_qfn);
    q = &a->quant;
    if (a->fp8_dtype != WSYNC_DTYPE_F8E4M3FN && a->fp8_dtype != WSYNC_DTYPE_F8E5M2)
        return wsync_err(WSYNC_ERR_INVALID, "%s: dtype %s (%d) is not FP8", wk_qfn,
                         wsync_dtype_name(a->fp8_dtype), (int)a->fp8_dtype);
    *xk = wk_kind(a->x_dtype);
    if (*xk < 0)
        return wsync_err(WSYNC_ERR_INVALID, "%s: input dtype %s (%d) is not bf16, f16 or f32",
                         wk_qfn, wsync_dtype_name(a->x_dtype), (int)a->x_dtype);
    memset(p, 0, sizeof(*p));
    switch (q->scheme) {
    case WSYNC_QUANT_TENSOR:
    case WSYNC_QUANT_CHANNEL:
        if (q->ue8m0)
            return wsync_err(WSYNC_ERR_INVALID, "%s: ue8m0 applies to block scales only", wk_qfn);
        p->bc = a->cols > 0 ? a->cols : 1;
        p->nbc = 1;
        if (q->scheme == WSYNC_QUANT_TENSOR) {
            p->br = a->rows > 0 ? a->rows : 1;
            p->nbr = 1;
        } else {
            p->br = 1;
            p->nbr = a->rows;
        }
        break;
    case WSYNC_QUANT_BLOCK:
        if (q->block_rows < 0 || q->block_cols < 0)
            return wsync_err(WSYNC_ERR_INVALID, "%s: block %d x %d has a negative size", wk_qfn,
                             q->block_rows, q->block_cols);
        if (q->eps != q->eps || q->eps > 3.40282347e+38f)
            return wsync_err(WSYNC_ERR_INVALID, "%s: eps %g is not finite", wk_qfn, (double)q->eps);
        p->block = 1;
        p->br = q->block_rows > 0 ? (uint64_t)q->block_rows : 128;
        p->bc = q->block_cols > 0 ? (uint64_t)q->block_cols : 128;
        p->nbr = a->rows / p->br + (a->rows % p->br != 0);
        p->nbc = a->cols / p->bc + (a->cols % p->bc != 0);
        break;
    default:
        return wsync_err(WSYNC_ERR_INVALID, "%s: quant scheme %d has no scales", wk_qfn,
                         (int)q->scheme);
    }
    if (a->rows > 0 && a->cols > 0) {
        if (a->x == NULL || a->out == NULL)
            return wsync_err(WSYNC_ERR_INVALID, "%s: %s is NULL", wk_qfn,
                             a->x == NULL ? "input" : "output");
        if (a->x_pitch < a->cols || a->out_pitch < a->cols)
            return wsync_err(WSYNC_ERR_INVALID,
                             "%s: pitch %" PRIu64 " of the %s is below cols %" PRIu64, wk_qfn,
                             a->x_pitch < a->cols ? a->x_pitch : a->out_pitch,
                             a->x_pitch < a->cols ? "input" : "output", a->cols);
        if (a->rows >= (UINT64_C(1) << 56) || a->cols >= (UINT64_C(1) << 56) ||
            a->rows - 1 > ((UINT64_C(1) << 56) - a->cols) / a->x_pitch ||
            a->rows - 1 > ((UINT64_C(1) << 56) - a->cols) / a->out_pitch)
            return wsync_err(WSYNC_ERR_INVALID, "%s: matrix too large", wk_qfn);
    }
    if (p->nbr > 0 && p->nbc > 0 && a->scales == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: scales is NULL", wk_qfn);
    if (ws == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: workspace is NULL", wk_qfn);
    if (a->amax != NULL && q->scheme != WSYNC_QUANT_TENSOR)
        return wsync_err(WSYNC_ERR_INVALID, "%s: an agreed amax applies to per-tensor scales only",
                         wk_qfn);

    int e4m3 = a->fp8_dtype == WSYNC_DTYPE_F8E4M3FN;
    uint32_t man_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
    p->f.drop = 23u - man_bits;
    p->f.rnd = (1u << (p->f.drop - 1)) - 1u;
    p->f.rebias = (127u - bias) << 23;
    p->f.magic = (151u - bias - man_bits) << 23;
    p->f.sub_lim = (128u - bias) << 23;
    p->f.maxcode = e4m3 ? (q->no_saturate ? 0x7fu : 0x7eu) : (q->no_saturate ? 0x7cu : 0x7bu);
    p->hw = (e4m3 ? 1 : 2) + (q->no_saturate ? 2 : 0);
    p->fmax = wsync_fp8_max(a->fp8_dtype);
    p->eps = q->eps > 0.0f ? q->eps : 1e-4f;
    p->ue8m0 = p->block && q->ue8m0;
    p->x = (const unsigned char *)a->x;
    p->xp = a->x_pitch * (uint64_t)wk_size(*xk);
    p->out = a->out;
    p->op = a->out_pitch;
    p->scales = a->scales;
    p->ws = (uint32_t *)ws;
    p->amax_in = a->amax;
    p->rows = a->rows;
    p->cols = a->cols;
    p->name = a->name != NULL ? a->name : "(unnamed)";
    return WSYNC_OK;
}

/* Wait for everything on s so far: until deadline_ms (absolute) by polling an event, so that a
 * stream stuck behind other work fails in time; deadline_ms < 0: no deadline (quantize's
 * finish, whose own wait has none). */
static wsync_status_t wk_wait(cudaStream_t s, int64_t deadline_ms, const char *what)
{
    if (deadline_ms >= 0)
        return wsync_dev_stream_sync(s, deadline_ms, what);
    cudaError_t e = cudaStreamSynchronize(s);
    return e == cudaSuccess ? WSYNC_OK : wk_cuda(e, what);
}

/* The first NaN or Inf of a's input in row-major order, named as the CPU names it; none: OK,
 * or INTERNAL when `must` (the flag said there was one). Waits for the stream (see wk_wait);
 * its copies go on the stream once it is idle (pageable, so they return when done: never behind
 * other work, nor on the legacy stream, which would wait for every blocking stream). */
static wsync_status_t wk_search(const wsync_kquant_t *a, void *ws, cudaStream_t s, int must,
                                int64_t deadline_ms)
{
    const char *name = a->name != NULL ? a->name : "(unnamed)";
    int xk = wk_kind(a->x_dtype);
    cudaError_t e;
    unsigned long long first;
    unsigned long long *d_first = (unsigned long long *)((char *)ws + 8);
    uint64_t xs = (uint64_t)wk_size(xk);
    e = cudaMemsetAsync(d_first, 0xff, sizeof(*d_first), s);
    if (e != cudaSuccess)
        return wk_cuda(e, "wsync_kernels_quantize: cudaMemsetAsync");
    const unsigned char *x = (const unsigned char *)a->x;
    uint64_t xp = a->x_pitch * xs;
    switch (xk) {
    case WK_BF16: wk_find_kernel<WK_BF16><<<1024, WK_THREADS, 0, s>>>(x, xp, a->rows, a->cols, d_first); break;
    case WK_F16: wk_find_kernel<WK_F16><<<1024, WK_THREADS, 0, s>>>(x, xp, a->rows, a->cols, d_first); break;
    default: wk_find_kernel<WK_F32><<<1024, WK_THREADS, 0, s>>>(x, xp, a->rows, a->cols, d_first); break;
    }
    wsync_status_t st = wk_launched("wsync_kernels_quantize: search kernel launch");
    if (st != WSYNC_OK)
        return st;
    if ((st = wk_wait(s, deadline_ms, "the search for a NaN or Inf")) != WSYNC_OK)
        return st;
    e = cudaMemcpyAsync(&first, d_first, sizeof(first), cudaMemcpyDeviceToHost, s);
    if (e != cudaSuccess)
        return wk_cuda(e, "wsync_kernels_quantize: search");
    if ((st = wk_wait(s, deadline_ms, "the search's result to the host")) != WSYNC_OK)
        return st;
    if (first == ~0ull || a->cols == 0)
        return must ? wsync_err(WSYNC_ERR_INTERNAL, "%s: non-finite value vanished", name)
                    : WSYNC_OK;
    uint64_t r = first / a->cols, c = first % a->cols;
    uint32_t raw = 0, u;
    e = cudaMemcpyAsync(&raw, x + r * xp + c * xs, xs, cudaMemcpyDeviceToHost, s);
    if (e != cudaSuccess)
        return wk_cuda(e, "wsync_kernels_quantize: cudaMemcpyAsync");
    if ((st = wk_wait(s, deadline_ms, "the non-finite value to the host")) != WSYNC_OK)
        return st;
    if (xk == WK_BF16) {
        float f = wsync_bf16_to_f32((uint16_t)raw);
        memcpy(&u, &f, 4);
    } else if (xk == WK_F16) {
        float f = wsync_f16_to_f32((uint16_t)raw);
        memcpy(&u, &f, 4);
    } else {
        u = raw;
    }
    return wsync_err(WSYNC_ERR_NONFINITE, "%s: %s at row %" PRIu64 ", column %" PRIu64, name,
                     (u & 0x7fffffu) ? "NaN" : (u >> 31) ? "-Inf" : "Inf", a->row_base + r, c);
}

extern "C" {

wsync_status_t wsync_kernels_amax(const void *x, wsync_dtype_t x_dtype, uint64_t rows,
                                  uint64_t cols, uint64_t x_pitch, float *amax_out, void *stream)
{
    static const char fn[] = "wsync_kernels_amax";
    cudaStream_t s = (cudaStream_t)stream;
    int xk = wk_kind(x_dtype);
    cudaError_t e;

    if (xk < 0)
        return wsync_err(WSYNC_ERR_INVALID, "%s: dtype %s (%d) is not bf16, f16 or f32", fn,
                         wsync_dtype_name(x_dtype), (int)x_dtype);
    if (amax_out == NULL || (rows > 0 && cols > 0 && x == NULL))
        return wsync_err(WSYNC_ERR_INVALID, "%s: %s is NULL", fn, amax_out == NULL ? "amax_out" : "x");
    if (rows > 1 && x_pitch < cols)
        return wsync_err(WSYNC_ERR_INVALID, "%s: pitch %" PRIu64 " is below cols %" PRIu64, fn,
                         x_pitch, cols);
    e = cudaMemsetAsync(amax_out, 0, sizeof(float), s);
    if (e != cudaSuccess)
        return wk_cuda(e, "wsync_kernels_amax: cudaMemsetAsync");
    return wk_amax_dispatch(xk, x, rows, cols, x_pitch, (uint32_t *)amax_out, s);
}

wsync_status_t wsync_kernels_quantize_launch(const wsync_kquant_t *a, void *ws, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    wk_quant_params_t p;
    int xk = -1;
    wsync_status_t st = wk_quant_prepare(a, ws, &p, &xk);
    if (st != WSYNC_OK)
        return st;
    cudaError_t e = cudaMemsetAsync(ws, 0, 2 * sizeof(uint32_t), s);
    if (e != cudaSuccess)
        return wk_cuda(e, "wsync_kernels_quantize: cudaMemsetAsync");
    if (a->amax != NULL) {
        /* the agreed amax's bits take the amax kernel's place: the encoder forms the scale */
        e = cudaMemcpyAsync(ws, a->amax, sizeof(float), cudaMemcpyDeviceToDevice, s);
        if (e != cudaSuccess)
            return wk_cuda(e, "wsync_kernels_quantize: cudaMemcpyAsync (agreed amax)");
    }
    if (a->quant.scheme == WSYNC_QUANT_TENSOR) {
        switch (xk) {
        case WK_BF16: return wk_tensor_run<WK_BF16>(p, s);
        case WK_F16: return wk_tensor_run<WK_F16>(p, s);
        default: return wk_tensor_run<WK_F32>(p, s);
        }
    }
    switch (xk) {
    case WK_BF16: return wk_cells_run<WK_BF16>(p, s);
    case WK_F16: return wk_cells_run<WK_F16>(p, s);
    default: return wk_cells_run<WK_F32>(p, s);
    }
}

wsync_status_t wsync_kernels_quantize_finish(const wsync_kquant_t *a, void *ws, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    uint32_t h[2];
    cudaError_t e;

    if (a == NULL || ws == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: %s is NULL", wk_qfn, a == NULL ? "arguments" : "workspace");
    e = cudaMemcpyAsync(h, ws, sizeof(h), cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    if (e != cudaSuccess)
        return wk_cuda(e, "wsync_kernels_quantize: kernels");
    if (h[1] == 0)
        return WSYNC_OK;
    /* non-finite input: the first bad element in row-major order, as the CPU names it */
    return wk_search(a, ws, s, 1, -1);
}

wsync_status_t wsync_kernels_find_nonfinite(const wsync_kquant_t *a, void *ws, void *stream,
                                            int64_t deadline_ms)
{
    if (a == NULL || ws == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_kernels_find_nonfinite: %s is NULL",
                         a == NULL ? "arguments" : "workspace");
    if (wk_kind(a->x_dtype) < 0 || (a->rows > 0 && a->cols > 0 && a->x == NULL))
        return wsync_err(WSYNC_ERR_INVALID, "wsync_kernels_find_nonfinite: input %s",
                         a->x == NULL ? "is NULL" : "is not bf16, f16 or f32");
    if (a->rows == 0 || a->cols == 0)
        return WSYNC_OK;
    return wk_search(a, ws, (cudaStream_t)stream, 0, deadline_ms < 0 ? 0 : deadline_ms);
}

wsync_status_t wsync_kernels_amax_many(const wsync_kamax_t *a, uint32_t n, float *amax,
                                       uint32_t nsets, void *stream)
{
    static const char fn[] = "wsync_kernels_amax_many";
    cudaStream_t s = (cudaStream_t)stream;
    wsync_status_t st = WSYNC_OK;
    cudaError_t e;

    if ((n > 0 && a == NULL) || (nsets > 0 && amax == NULL))
        return wsync_err(WSYNC_ERR_INVALID, "%s: NULL argument", fn);
    /* every item checked before anything is enqueued */
    for (uint32_t i = 0; i < n; i++) {
        if (wk_kind(a[i].x_dtype) < 0)
            return wsync_err(WSYNC_ERR_INVALID, "%s: item %u: dtype %s (%d) is not bf16, f16 or "
                             "f32", fn, i, wsync_dtype_name(a[i].x_dtype), (int)a[i].x_dtype);
        if (a[i].set >= nsets)
            return wsync_err(WSYNC_ERR_INVALID, "%s: item %u: set %u of %u", fn, i, a[i].set,
                             nsets);
        if (a[i].rows > 0 && a[i].cols > 0 && a[i].x == NULL)
            return wsync_err(WSYNC_ERR_INVALID, "%s: item %u: x is NULL", fn, i);
        if (a[i].rows > 1 && a[i].x_pitch < a[i].cols)
            return wsync_err(WSYNC_ERR_INVALID, "%s: item %u: pitch %" PRIu64 " is below cols %"
                             PRIu64, fn, i, a[i].x_pitch, a[i].cols);
    }
    if (nsets == 0)
        return WSYNC_OK;
    e = cudaMemsetAsync(amax, 0, (size_t)nsets * sizeof(float), s);
    if (e != cudaSuccess)
        return wk_cuda(e, "wsync_kernels_amax_many: cudaMemsetAsync");
    for (uint32_t i = 0; i < n && st == WSYNC_OK; i++)
        if (a[i].rows > 0 && a[i].cols > 0)
            st = wk_amax_dispatch(wk_kind(a[i].x_dtype), a[i].x, a[i].rows, a[i].cols,
                                  a[i].x_pitch, (uint32_t *)(amax + a[i].set), s);
    return st;
}

/* Launch group [first, end) of the register-kernel runs in order[] (one input kind and one
 * number of threads a cell) as one kernel. */
static wsync_status_t wk_many_flush(const wk_quant_params_t *p, const int *xk, const int *g,
                                    const uint32_t *order, uint32_t first, uint32_t end,
                                    uint32_t max_blocks, cudaStream_t s)
{
    wk_qmany_t m;
    int gm = 8;
    memset(&m, 0, sizeof(m));
    for (uint32_t i = first; i < end; i++) {
        uint32_t j = order[i];
        m.p[m.n] = p[j];
        m.p[m.n].name = NULL;   /* host only */
        m.first[m.n + 1] = m.first[m.n] + p[j].nbr * p[j].nbc;
        m.n++;
        gm = g[j] > gm ? g[j] : gm;
    }
    switch (xk[order[first]]) {
    case WK_BF16: return wk_many_run<WK_BF16>(m, gm, max_blocks, s);
    case WK_F16: return wk_many_run<WK_F16>(m, gm, max_blocks, s);
    default: return wk_many_run<WK_F32>(m, gm, max_blocks, s);
    }
}

wsync_status_t wsync_kernels_quantize_many(const wsync_kquant_t *a, uint32_t n, void *const *ws,
                                           uint32_t max_blocks, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    wk_quant_params_t small_p[WK_MANY];
    int small_xk[WK_MANY], small_g[WK_MANY];
    uint32_t small_o[WK_MANY];
    wk_quant_params_t *p = n <= WK_MANY ? small_p : (wk_quant_params_t *)malloc(n * sizeof(*p));
    int *xk = n <= WK_MANY ? small_xk : (int *)malloc(n * sizeof(int));
    int *g = n <= WK_MANY ? small_g : (int *)malloc(n * sizeof(int));
    uint32_t *order = n <= WK_MANY ? small_o : (uint32_t *)malloc(n * sizeof(uint32_t));
    uint32_t nreg = 0;
    wsync_status_t st = WSYNC_OK;

    if (a == NULL || (n > 0 && ws == NULL))
        st = wsync_err(WSYNC_ERR_INVALID, "wsync_kernels_quantize_many: NULL argument");
    else if (p == NULL || xk == NULL || g == NULL || order == NULL)
        st = wsync_err(WSYNC_ERR_NOMEM, "wsync_kernels_quantize_many: no memory for %u", n);
    /* every one checked before anything is enqueued */
    for (uint32_t i = 0; i < n && st == WSYNC_OK; i++) {
        st = wk_quant_prepare(&a[i], ws[i], &p[i], &xk[i]);
        g[i] = st == WSYNC_OK && a[i].quant.scheme != WSYNC_QUANT_TENSOR ? wk_reg_threads_any(xk[i], p[i]) : 0;
    }
    /* the register-kernel ones by input kind and threads a cell, WK_MANY a launch; the rest one
     * by one */
    for (int kind = WK_BF16; kind <= WK_F32 && st == WSYNC_OK; kind++) {
        for (int gv = 8; gv <= 1024 && st == WSYNC_OK; gv *= 2) {
            uint32_t first = nreg;
            for (uint32_t i = 0; i < n; i++)
                if (g[i] == gv && xk[i] == kind)
                    order[nreg++] = i;
            for (uint32_t i = first; i < nreg && st == WSYNC_OK; i += WK_MANY)
                st = wk_many_flush(p, xk, g, order, i, nreg - i > WK_MANY ? i + WK_MANY : nreg,
                                   max_blocks, s);
        }
    }
    for (uint32_t i = 0; i < n && st == WSYNC_OK; i++)
        if (g[i] == 0)
            st = wsync_kernels_quantize_launch(&a[i], ws[i], stream);
    if (p != small_p)
        free(p);
    if (xk != small_xk)
        free(xk);
    if (g != small_g)
        free(g);
    if (order != small_o)
        free(order);
    return st;
}

wsync_status_t wsync_kernels_quantize(const wsync_kquant_t *a, void *ws, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    void *own = NULL;
    wsync_status_t st;
    cudaError_t e;

    if (ws == NULL) {
        e = cudaMallocAsync(&own, WSYNC_KQUANT_WS_BYTES, s);
        if (e != cudaSuccess)
            return wk_cuda(e, "wsync_kernels_quantize: cudaMallocAsync");
        ws = own;
    }
    st = wsync_kernels_quantize_launch(a, ws, stream);
    if (st == WSYNC_OK)
        st = wsync_kernels_quantize_finish(a, ws, stream);
    if (own != NULL) {
        e = cudaFreeAsync(own, s);
        if (e != cudaSuccess && st == WSYNC_OK)
            st = wk_cuda(e, "wsync_kernels_quantize: cudaFreeAsync");
    }
    return st;
}

} /* extern "C" */
