/* FP8 encode/decode over arrays, scale shapes, and the per-tensor / per-channel / block
 * quantizers (RESHARD_SPEC.md, "FP8 encodings" and "Scales"). */
#include "reshard/fp8.h"

#include "core/status.h"

#include <float.h>
#include <inttypes.h>
#include <stdlib.h>

/* ------------------------------------------------------------------------------------------ */
/* Array codecs                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* One loop per format and overflow mode, so the encoder's constants fold and nothing is decided
 * per element. `plain` encodes x, `div` x / s (tensor, channel), `mul` x * s with s = 1 / scale
 * (block): the two round differently and each must match its reference. The work goes in
 * chunks of WSYNC_FP8_CHUNK with restrict pointers: a fixed trip count without aliasing is what
 * GCC's -O2 cost model needs to vectorize the encoder. */
typedef void (*span_fn)(const float *x, size_t n, float s, uint8_t *out);

#define WSYNC_FP8_CHUNK 16

#define WSYNC_FP8_SPAN(name, enc, expr)                                                       \
    static inline void name##_chunk(const float *restrict x, float s, uint8_t *restrict out)  \
    {                                                                                         \
        (void)s;                                                                              \
        for (int i = 0; i < WSYNC_FP8_CHUNK; i++)                                             \
            out[i] = enc(expr);                                                               \
    }                                                                                         \
    static void name(const float *x, size_t n, float s, uint8_t *out)                         \
    {                                                                                         \
        size_t i = 0;                                                                         \
        (void)s;                                                                              \
        for (; i + WSYNC_FP8_CHUNK <= n; i += WSYNC_FP8_CHUNK)                                \
            name##_chunk(x + i, s, out + i);                                                  \
        for (; i < n; i++)                                                                    \
            out[i] = enc(expr);                                                               \
    }

#define WSYNC_FP8_SPANS(tag, enc)                                                             \
    WSYNC_FP8_SPAN(span_plain_##tag, enc, x[i])                                               \
    WSYNC_FP8_SPAN(span_div_##tag, enc, x[i] / s)                                             \
    WSYNC_FP8_SPAN(span_mul_##tag, enc, x[i] * s)

static inline uint8_t enc_e4m3_sat(float x) { return wsync_f32_to_e4m3fn(x, 1); }
static inline uint8_t enc_e4m3_nosat(float x) { return wsync_f32_to_e4m3fn(x, 0); }
static inline uint8_t enc_e5m2_sat(float x) { return wsync_f32_to_e5m2(x, 1); }
static inline uint8_t enc_e5m2_nosat(float x) { return wsync_f32_to_e5m2(x, 0); }

WSYNC_FP8_SPANS(e4m3_sat, enc_e4m3_sat)
WSYNC_FP8_SPANS(e4m3_nosat, enc_e4m3_nosat)
WSYNC_FP8_SPANS(e5m2_sat, enc_e5m2_sat)
WSYNC_FP8_SPANS(e5m2_nosat, enc_e5m2_nosat)

typedef struct {
    span_fn plain, div, mul;
} fp8_spans_t;

/* [format: 0 E4M3FN, 1 E5M2][saturate] */
static const fp8_spans_t fp8_spans[2][2] = {
    {{span_plain_e4m3_nosat, span_div_e4m3_nosat, span_mul_e4m3_nosat},
     {span_plain_e4m3_sat, span_div_e4m3_sat, span_mul_e4m3_sat}},
    {{span_plain_e5m2_nosat, span_div_e5m2_nosat, span_mul_e5m2_nosat},
     {span_plain_e5m2_sat, span_div_e5m2_sat, span_mul_e5m2_sat}},
};

static int fp8_format(wsync_dtype_t dtype)
{
    return dtype == WSYNC_DTYPE_F8E4M3FN ? 0 : dtype == WSYNC_DTYPE_F8E5M2 ? 1 : -1;
}

/* All 256 decoded values, so decoding loops are one load each. */
static void fp8_decode_table(int format, float lut[256])
{
    for (int c = 0; c < 256; c++)
        lut[c] = format == 0 ? wsync_e4m3fn_to_f32((uint8_t)c) : wsync_e5m2_to_f32((uint8_t)c);
}

wsync_status_t wsync_fp8_from_f32(const float *src, size_t n, wsync_dtype_t fp8_dtype,
                                  int saturate, uint8_t *dst)
{
    int format = fp8_format(fp8_dtype);

    if (format < 0)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_fp8_from_f32: dtype %s (%d) is not FP8",
                         wsync_dtype_name(fp8_dtype), (int)fp8_dtype);
    if (n > 0 && (src == NULL || dst == NULL))
        return wsync_err(WSYNC_ERR_INVALID, "wsync_fp8_from_f32: %s is NULL with n = %zu",
                         src == NULL ? "src" : "dst", n);
    fp8_spans[format][saturate != 0].plain(src, n, 1.0f, dst);
    return WSYNC_OK;
}

wsync_status_t wsync_fp8_to_f32(const uint8_t *src, size_t n, wsync_dtype_t fp8_dtype, float *dst)
{
    int format = fp8_format(fp8_dtype);
    float lut[256];

    if (format < 0)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_fp8_to_f32: dtype %s (%d) is not FP8",
                         wsync_dtype_name(fp8_dtype), (int)fp8_dtype);
    if (n > 0 && (src == NULL || dst == NULL))
        return wsync_err(WSYNC_ERR_INVALID, "wsync_fp8_to_f32: %s is NULL with n = %zu",
                         src == NULL ? "src" : "dst", n);
    fp8_decode_table(format, lut);
    for (size_t i = 0; i < n; i++)
        dst[i] = lut[src[i]];
    return WSYNC_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Scale geometry                                                                               */
/* ------------------------------------------------------------------------------------------ */

/* Every scheme is a grid of br x bc cells: tensor one cell of the whole matrix, channel one cell
 * per row, block the blocks. */
typedef struct {
    uint64_t br, bc;    /* cell size */
    uint64_t nbr, nbc;  /* cells down and across = shape of the scale array */
    int block;          /* WSYNC_QUANT_BLOCK: eps, ue8m0 and x * (1/s) apply */
} quant_grid_t;

static wsync_status_t quant_grid(const char *fn, const wsync_quant_t *q, uint64_t rows,
                                 uint64_t cols, quant_grid_t *g)
{
    switch (q->scheme) {
    case WSYNC_QUANT_TENSOR:
    case WSYNC_QUANT_CHANNEL:
        if (q->ue8m0)
            return wsync_err(WSYNC_ERR_INVALID, "%s: ue8m0 applies to block scales only", fn);
        g->block = 0;
        g->bc = cols > 0 ? cols : 1;
        g->nbc = 1;
        if (q->scheme == WSYNC_QUANT_TENSOR) {
            g->br = rows > 0 ? rows : 1;
            g->nbr = 1;
        } else {
            g->br = 1;
            g->nbr = rows;
        }
        return WSYNC_OK;
    case WSYNC_QUANT_BLOCK:
        if (q->block_rows < 0 || q->block_cols < 0)
            return wsync_err(WSYNC_ERR_INVALID, "%s: block %d x %d has a negative size", fn,
                             q->block_rows, q->block_cols);
        if (q->eps != q->eps || q->eps > FLT_MAX)
            return wsync_err(WSYNC_ERR_INVALID, "%s: eps %g is not finite", fn, (double)q->eps);
        g->block = 1;
        g->br = q->block_rows > 0 ? (uint64_t)q->block_rows : 128;
        g->bc = q->block_cols > 0 ? (uint64_t)q->block_cols : 128;
        g->nbr = rows / g->br + (rows % g->br != 0);
        g->nbc = cols / g->bc + (cols % g->bc != 0);
        return WSYNC_OK;
    case WSYNC_QUANT_NONE:
        break;
    }
    return wsync_err(WSYNC_ERR_INVALID, "%s: quant scheme %d has no scales", fn, (int)q->scheme);
}

wsync_status_t wsync_quant_scales_shape(const wsync_quant_t *q, int64_t rows, int64_t cols,
                                        int64_t *scale_rows, int64_t *scale_cols)
{
    static const char fn[] = "wsync_quant_scales_shape";
    quant_grid_t g = {0};
    wsync_status_t st;

    if (q == NULL || scale_rows == NULL || scale_cols == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: %s is NULL", fn,
                         q == NULL ? "q" : scale_rows == NULL ? "scale_rows" : "scale_cols");
    if (rows < 0 || cols < 0)
        return wsync_err(WSYNC_ERR_INVALID, "%s: shape [%" PRId64 ", %" PRId64 "] is negative",
                         fn, rows, cols);
    st = quant_grid(fn, q, (uint64_t)rows, (uint64_t)cols, &g);
    if (st != WSYNC_OK)
        return st;
    *scale_rows = (int64_t)g.nbr;
    *scale_cols = (int64_t)g.nbc;
    return WSYNC_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Quantizers                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/* max of |x| as bits: ordered like the values, and >= 0x7f800000 exactly when Inf or NaN is
 * present. A fixed-width array of running maxima lets the compiler vectorize the loop. */
static uint32_t amax_bits(const float *x, uint64_t n)
{
    int32_t acc[WSYNC_FP8_CHUNK] = {0};
    uint64_t i = 0;
    int32_t m = 0;

    for (; i + WSYNC_FP8_CHUNK <= n; i += WSYNC_FP8_CHUNK) {
        int32_t u[WSYNC_FP8_CHUNK];
        memcpy(u, x + i, sizeof(u));
        for (int k = 0; k < WSYNC_FP8_CHUNK; k++) {
            int32_t v = u[k] & 0x7fffffff;
            acc[k] = v > acc[k] ? v : acc[k];
        }
    }
    for (; i < n; i++) {
        int32_t v;
        memcpy(&v, x + i, 4);
        v &= 0x7fffffff;
        m = v > m ? v : m;
    }
    for (int k = 0; k < WSYNC_FP8_CHUNK; k++)
        m = acc[k] > m ? acc[k] : m;
    return (uint32_t)m;
}

float wsync_amax_f32(const float *x, uint64_t n)
{
    uint32_t m = x != NULL ? amax_bits(x, n) : 0u;
    float f;
    memcpy(&f, &m, 4);
    return f;
}

/* Name the first non-finite element in row-major order; only called once one is known to
 * exist, so its speed does not matter. */
static wsync_status_t report_nonfinite(const char *name, const float *x, uint64_t rows,
                                       uint64_t cols, uint64_t pitch)
{
    for (uint64_t r = 0; r < rows; r++) {
        for (uint64_t c = 0; c < cols; c++) {
            uint32_t u;
            memcpy(&u, x + r * pitch + c, 4);
            if ((u & 0x7f800000u) == 0x7f800000u)
                return wsync_err(WSYNC_ERR_NONFINITE, "%s: %s at row %" PRIu64 ", column %" PRIu64,
                                 name != NULL ? name : "(unnamed)",
                                 (u & 0x7fffffu) ? "NaN" : (u >> 31) ? "-Inf" : "Inf", r, c);
        }
    }
    return wsync_err(WSYNC_ERR_INTERNAL, "%s: non-finite value vanished",
                     name != NULL ? name : "(unnamed)");
}

/* Scale of one cell from its amax (RESHARD_SPEC.md "Scales"). */
static float cell_scale(uint32_t amax_u, const quant_grid_t *g, float fmax, float eps, int ue8m0)
{
    float amax, s;
    memcpy(&amax, &amax_u, 4);
    if (g->block && amax < eps)
        amax = eps;
    s = amax / fmax;
    if (ue8m0) {
        /* round up to a power of two: exponent + (mantissa != 0), within the normal range */
        uint32_t u, e;
        memcpy(&u, &s, 4);
        e = ((u >> 23) & 0xffu) + ((u & 0x7fffffu) != 0);
        e = e < 1 ? 1 : e > 254 ? 254 : e;
        u = e << 23;
        memcpy(&s, &u, 4);
    }
    /* amax 0, or so small that every element rounds to 0 anyway: 1 keeps x / s and 1 / s
     * finite */
    if (!(s >= FLT_MIN))
        s = 1.0f;
    return s;
}

static wsync_status_t quant_check(const char *fn, const void *x, uint64_t rows, uint64_t cols,
                                  uint64_t x_pitch, const wsync_quant_t *q,
                                  wsync_dtype_t fp8_dtype, const void *out, uint64_t out_pitch,
                                  const void *scales, quant_grid_t *g)
{
    wsync_status_t st;

    if (q == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: quant is NULL", fn);
    if (fp8_format(fp8_dtype) < 0)
        return wsync_err(WSYNC_ERR_INVALID, "%s: dtype %s (%d) is not FP8", fn,
                         wsync_dtype_name(fp8_dtype), (int)fp8_dtype);
    st = quant_grid(fn, q, rows, cols, g);
    if (st != WSYNC_OK)
        return st;
    if (rows > 0 && cols > 0) {
        if (x == NULL || out == NULL)
            return wsync_err(WSYNC_ERR_INVALID, "%s: %s is NULL", fn,
                             x == NULL ? "input" : "output");
        if (x_pitch < cols || out_pitch < cols)
            return wsync_err(WSYNC_ERR_INVALID,
                             "%s: pitch %" PRIu64 " of the %s is below cols %" PRIu64, fn,
                             x_pitch < cols ? x_pitch : out_pitch,
                             x_pitch < cols ? "input" : "output", cols);
    }
    if (g->nbr > 0 && g->nbc > 0 && scales == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: scales is NULL", fn);
    if (g->nbc != 0 && g->nbr > SIZE_MAX / sizeof(float) / g->nbc)
        return wsync_err(WSYNC_ERR_INVALID, "%s: %" PRIu64 " x %" PRIu64 " scales overflow", fn,
                         g->nbr, g->nbc);
    return WSYNC_OK;
}

wsync_status_t wsync_quantize_f32(const char *name, const float *x, uint64_t rows, uint64_t cols,
                                  uint64_t x_pitch, const wsync_quant_t *q,
                                  wsync_dtype_t fp8_dtype, uint8_t *out, uint64_t out_pitch,
                                  float *scales)
{
    static const char fn[] = "wsync_quantize_f32";
    uint32_t local[64];
    uint32_t *cell;     /* [nbr, nbc]: amax bits in pass 1, then scale bits */
    quant_grid_t g = {0};
    wsync_status_t st;
    uint64_t ncells, i;
    uint32_t worst = 0;

    st = quant_check(fn, x, rows, cols, x_pitch, q, fp8_dtype, out, out_pitch, scales, &g);
    if (st != WSYNC_OK)
        return st;
    ncells = g.nbr * g.nbc;
    if (ncells <= sizeof(local) / sizeof(local[0])) {
        cell = local;
    } else {
        cell = malloc((size_t)ncells * sizeof(*cell));
        if (cell == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "%s: %s: %" PRIu64 " scales", fn,
                             name != NULL ? name : "(unnamed)", ncells);
    }
    memset(cell, 0, (size_t)ncells * sizeof(*cell));

    /* Pass 1: amax of every cell. Non-finite input shows as an amax >= inf, so it is caught
     * before anything is written. */
    for (uint64_t r = 0; r < rows; r++) {
        const float *row = x + r * x_pitch;
        uint32_t *crow = cell + (r / g.br) * g.nbc;
        for (uint64_t j = 0, c0 = 0; c0 < cols; j++, c0 += g.bc) {
            uint64_t len = cols - c0 < g.bc ? cols - c0 : g.bc;
            uint32_t m = amax_bits(row + c0, len);
            crow[j] = m > crow[j] ? m : crow[j];
        }
    }
    for (i = 0; i < ncells; i++)
        worst = cell[i] > worst ? cell[i] : worst;
    if (worst >= 0x7f800000u) {
        st = report_nonfinite(name, x, rows, cols, x_pitch);
        goto out;
    }

    {
        float fmax = wsync_fp8_max(fp8_dtype);
        float eps = q->eps > 0.0f ? q->eps : 1e-4f;
        const fp8_spans_t *sp = &fp8_spans[fp8_format(fp8_dtype)][!q->no_saturate];

        for (i = 0; i < ncells; i++) {
            float s = cell_scale(cell[i], &g, fmax, eps, g.block && q->ue8m0);
            memcpy(&cell[i], &s, 4);
        }

        /* Pass 2: encode with the cell's scale; block quantizers multiply by the reciprocal
         * (DeepGEMM, vLLM), the others divide (PyTorch's x / s). */
        for (uint64_t r = 0; r < rows; r++) {
            const float *row = x + r * x_pitch;
            uint8_t *orow = out + r * out_pitch;
            const uint32_t *crow = cell + (r / g.br) * g.nbc;
            for (uint64_t j = 0, c0 = 0; c0 < cols; j++, c0 += g.bc) {
                uint64_t len = cols - c0 < g.bc ? cols - c0 : g.bc;
                float s;
                memcpy(&s, &crow[j], 4);
                if (g.block)
                    sp->mul(row + c0, (size_t)len, 1.0f / s, orow + c0);
                else
                    sp->div(row + c0, (size_t)len, s, orow + c0);
            }
        }
        if (ncells > 0)
            memcpy(scales, cell, (size_t)ncells * sizeof(float));
    }
    st = WSYNC_OK;
out:
    if (cell != local)
        free(cell);
    return st;
}

float wsync_fp8_tensor_scale(float amax, wsync_dtype_t fp8_dtype)
{
    const quant_grid_t g = {0};
    uint32_t u;

    memcpy(&u, &amax, 4);
    return cell_scale(u & 0x7fffffffu, &g, wsync_fp8_max(fp8_dtype), 0.0f, 0);
}

wsync_status_t wsync_fp8_encode_scaled_f32(const float *x, uint64_t rows, uint64_t cols,
                                           uint64_t x_pitch, float scale,
                                           wsync_dtype_t fp8_dtype, int no_saturate,
                                           uint8_t *out, uint64_t out_pitch)
{
    int f = fp8_format(fp8_dtype);

    if (f < 0 || (rows > 0 && cols > 0 && (x == NULL || out == NULL)) || x_pitch < cols ||
        out_pitch < cols || !(scale >= FLT_MIN) || scale > FLT_MAX)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_fp8_encode_scaled_f32: dtype %s, %" PRIu64
                         " x %" PRIu64 " at pitches %" PRIu64 " / %" PRIu64 ", scale %g",
                         wsync_dtype_name(fp8_dtype), rows, cols, x_pitch, out_pitch,
                         (double)scale);
    /* as wsync_quantize_f32's per-tensor pass 2: x / s, element for element */
    for (uint64_t r = 0; r < rows; r++)
        fp8_spans[f][!no_saturate].div(x + r * x_pitch, (size_t)cols, scale, out + r * out_pitch);
    return WSYNC_OK;
}

wsync_status_t wsync_dequantize_f32(const uint8_t *qv, uint64_t rows, uint64_t cols,
                                    uint64_t q_pitch, const wsync_quant_t *q,
                                    wsync_dtype_t fp8_dtype, const float *scales, float *out,
                                    uint64_t out_pitch)
{
    static const char fn[] = "wsync_dequantize_f32";
    quant_grid_t g = {0};
    wsync_status_t st;
    float lut[256];

    st = quant_check(fn, qv, rows, cols, q_pitch, q, fp8_dtype, out, out_pitch, scales, &g);
    if (st != WSYNC_OK)
        return st;
    fp8_decode_table(fp8_format(fp8_dtype), lut);
    for (uint64_t r = 0; r < rows; r++) {
        const uint8_t *qrow = qv + r * q_pitch;
        float *orow = out + r * out_pitch;
        const float *srow = scales + (r / g.br) * g.nbc;
        for (uint64_t j = 0, c0 = 0; c0 < cols; j++, c0 += g.bc) {
            uint64_t len = cols - c0 < g.bc ? cols - c0 : g.bc;
            float s = srow[j];
            for (uint64_t c = c0; c < c0 + len; c++)
                orow[c] = lut[qrow[c]] * s;
        }
    }
    return WSYNC_OK;
}
