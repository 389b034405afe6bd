/* FP8 codecs and quantizers against PyTorch's bytes and an independent float64 model. */
#include "reshard/fp8.h"
#include "tests/support/check.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* The float64 model: formats from their definition, rounding by nearest grid point            */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    const char *name;
    wsync_dtype_t dtype;
    int man, bias;
    int maxcode;       /* largest finite code */
    double max;
} fmt_t;

static const fmt_t fmts[2] = {
    {"e4m3fn", WSYNC_DTYPE_F8E4M3FN, 3, 7, 0x7e, 448.0},
    {"e5m2", WSYNC_DTYPE_F8E5M2, 2, 15, 0x7b, 57344.0},
};

static int model_is_nan(const fmt_t *f, int code)
{
    int a = code & 0x7f;
    return f->dtype == WSYNC_DTYPE_F8E4M3FN ? a == 0x7f : a > 0x7c;
}

static int model_is_inf(const fmt_t *f, int code)
{
    return f->dtype == WSYNC_DTYPE_F8E5M2 && (code & 0x7f) == 0x7c;
}

/* (-1)^s * 2^(e-bias) * (1 + m/2^man), or 2^(1-bias) * m/2^man when e == 0 */
static double model_value(const fmt_t *f, int code)
{
    int e = (code & 0x7f) >> f->man;
    int m = code & ((1 << f->man) - 1);
    double sign = (code & 0x80) ? -1.0 : 1.0;

    if (model_is_nan(f, code))
        return NAN;
    if (model_is_inf(f, code))
        return sign * INFINITY;
    if (e == 0)
        return sign * ldexp((double)m, 1 - f->bias - f->man);
    return sign * ldexp((double)((1 << f->man) + m), e - f->bias - f->man);
}

/* Nearest code to y, ties to the even code. The grid is extended by one step past max (a
 * virtual code maxcode + 1), so that values beyond max round as with unbounded range; landing
 * there is overflow: max when saturating, else E4M3FN NaN / E5M2 inf. */
static int model_encode(const fmt_t *f, double y, int saturate)
{
    int sign = signbit(y) ? 0x80 : 0;
    double a = fabs(y);
    int top = f->maxcode + 1;
    double virt = 2.0 * model_value(f, f->maxcode) - model_value(f, f->maxcode - 1);
    int code;

    if (isnan(y))
        return sign | 0x7f;
    if (a >= virt) {
        code = top;
    } else {
        int lo = 0, hi = top;                        /* value(lo) <= a < value(hi) */
        while (hi - lo > 1) {
            int mid = (lo + hi) / 2;
            if (model_value(f, mid) <= a)
                lo = mid;
            else
                hi = mid;
        }
        double vhi = hi == top ? virt : model_value(f, hi);
        double dlo = a - model_value(f, lo), dhi = vhi - a;
        code = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
    }
    if (code > f->maxcode)
        code = saturate ? f->maxcode : f->dtype == WSYNC_DTYPE_F8E4M3FN ? 0x7f : 0x7c;
    return sign | code;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static uint8_t lib_encode1(const fmt_t *f, float x, int saturate)
{
    uint8_t b = 0xaa;
    if (wsync_fp8_from_f32(&x, 1, f->dtype, saturate, &b) != WSYNC_OK)
        return 0xaa;
    return b;
}

/* ------------------------------------------------------------------------------------------ */
/* (a) every bf16 pattern against PyTorch's bytes                                               */
/* ------------------------------------------------------------------------------------------ */

static int read_golden(const char *file, uint8_t *buf)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/fp8/%s", WSYNC_TESTDATA, file);
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) {
        fprintf(stderr, "cannot open %s\n", path);
        return -1;
    }
    size_t got = fread(buf, 1, 65536, fp);
    fclose(fp);
    if (got != 65536) {
        fprintf(stderr, "%s: %zu bytes, expected 65536\n", path, got);
        return -1;
    }
    return 0;
}

static void test_bf16_all_patterns_match_pytorch(void)
{
    static float x[65536];
    static uint8_t want[65536], got[65536];

    for (uint32_t b = 0; b < 65536; b++)
        x[b] = bits_f32(b << 16);
    for (int fi = 0; fi < 2; fi++) {
        for (int sat = 0; sat < 2; sat++) {
            const fmt_t *f = &fmts[fi];
            char file[64];
            snprintf(file, sizeof(file), "bf16_to_%s_%s.bin", f->name, sat ? "satfinite" : "nosat");
            CHECK(read_golden(file, want) == 0);
            memset(got, 0xaa, sizeof(got));
            CHECK_OK(wsync_fp8_from_f32(x, 65536, f->dtype, sat, got));
            int bad = 0, model_bad = 0;
            for (uint32_t b = 0; b < 65536; b++) {
                if (got[b] != want[b] && bad++ < 5)
                    fprintf(stderr, "  %s: bf16 0x%04x (%.9g) -> 0x%02x, PyTorch 0x%02x\n", file,
                            b, (double)x[b], got[b], want[b]);
                /* the model must agree too, or it could not judge the f32 sweep below */
                int m = model_encode(f, x[b], sat);
                if (m != want[b] && model_bad++ < 5)
                    fprintf(stderr, "  %s: model: bf16 0x%04x (%.9g) -> 0x%02x, PyTorch 0x%02x\n",
                            file, b, (double)x[b], m, want[b]);
            }
            CHECK_MSG(bad == 0, "%s: %d of 65536 differ", file, bad);
            CHECK_MSG(model_bad == 0, "%s: the model differs in %d", file, model_bad);
        }
    }
}

/* Float32 inputs have 16 more mantissa bits than bf16: sweep patterns at a prime stride, and
 * every float within 3 ulp of each rounding midpoint, where a wrong rounding shows. */
static void test_f32_sweep_matches_model(void)
{
    for (int fi = 0; fi < 2; fi++) {
        const fmt_t *f = &fmts[fi];
        for (int sat = 0; sat < 2; sat++) {
            int bad = 0;
            uint64_t n = 0;
            for (uint64_t u = 0; u <= 0xffffffffu; u += 4099) {
                float x = bits_f32((uint32_t)u);
                uint8_t got = lib_encode1(f, x, sat);
                int want = model_encode(f, x, sat);
                int ok = got == want || (model_is_nan(f, want) && model_is_nan(f, got));
                if (!ok && bad++ < 5)
                    fprintf(stderr, "  %s sat=%d: 0x%08x (%.9g) -> 0x%02x, model 0x%02x\n",
                            f->name, sat, (uint32_t)u, (double)x, got, want);
                n++;
            }
            /* midpoints between neighbouring codes, and past max */
            for (int c = 0; c <= f->maxcode; c++) {
                double lo = model_value(f, c);
                double hi = c < f->maxcode ? model_value(f, c + 1)
                                           : 2.0 * lo - model_value(f, c - 1);
                float mid = (float)((lo + hi) / 2);  /* exact: a few bits more than FP8 */
                CHECK((double)mid == (lo + hi) / 2);
                for (int sgn = 0; sgn < 2; sgn++) {
                    float fa = sgn ? -mid : mid, fb = fa;
                    for (int k = 0; k < 4; k++) {
                        float pts[2] = {fa, fb};
                        for (int p = 0; p < 2; p++) {
                            uint8_t got = lib_encode1(f, pts[p], sat);
                            int want = model_encode(f, pts[p], sat);
                            if (got != want && bad++ < 5)
                                fprintf(stderr, "  %s sat=%d: %.9g -> 0x%02x, model 0x%02x\n",
                                        f->name, sat, (double)pts[p], got, want);
                            n++;
                        }
                        fa = nextafterf(fa, 0.0f);
                        fb = nextafterf(fb, sgn ? -INFINITY : INFINITY);
                    }
                }
            }
            CHECK_MSG(bad == 0, "%s sat=%d: %d of %" PRIu64 " floats differ", f->name, sat, bad, n);
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* (b) decode all 256 codes; re-encoding gives the code back                                    */
/* ------------------------------------------------------------------------------------------ */

static void test_decode_all_codes(void)
{
    for (int fi = 0; fi < 2; fi++) {
        const fmt_t *f = &fmts[fi];
        uint8_t codes[256], back[256], back_sat[256];
        float v[256];

        for (int c = 0; c < 256; c++)
            codes[c] = (uint8_t)c;
        CHECK_OK(wsync_fp8_to_f32(codes, 256, f->dtype, v));
        CHECK_OK(wsync_fp8_from_f32(v, 256, f->dtype, 0, back));
        CHECK_OK(wsync_fp8_from_f32(v, 256, f->dtype, 1, back_sat));
        for (int c = 0; c < 256; c++) {
            double want = model_value(f, c);
            float one = f->dtype == WSYNC_DTYPE_F8E4M3FN ? wsync_e4m3fn_to_f32((uint8_t)c)
                                                         : wsync_e5m2_to_f32((uint8_t)c);
            CHECK_MSG(f32_bits(one) == f32_bits(v[c]), "%s 0x%02x: scalar and array decoders",
                      f->name, c);
            if (isnan(want)) {
                CHECK_MSG(isnan(v[c]), "%s 0x%02x decodes to %g, not NaN", f->name, c,
                          (double)v[c]);
                CHECK_MSG(model_is_nan(f, back[c]) && model_is_nan(f, back_sat[c]),
                          "%s 0x%02x: NaN re-encodes to 0x%02x / 0x%02x", f->name, c, back[c],
                          back_sat[c]);
                continue;
            }
            /* same value, and same sign for zeros */
            CHECK_MSG((double)v[c] == want && !signbit(v[c]) == !signbit(want),
                      "%s 0x%02x decodes to %.9g, model %.9g", f->name, c, (double)v[c], want);
            CHECK_MSG(back[c] == c, "%s 0x%02x re-encodes to 0x%02x", f->name, c, back[c]);
            int want_sat = model_is_inf(f, c) ? (c & 0x80) | f->maxcode : c;
            CHECK_MSG(back_sat[c] == want_sat, "%s 0x%02x re-encodes (saturating) to 0x%02x",
                      f->name, c, back_sat[c]);
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* (c) edge values of the spec                                                                  */
/* ------------------------------------------------------------------------------------------ */

static void test_edge_values(void)
{
    const fmt_t *e4 = &fmts[0], *e5 = &fmts[1];
    static const struct {
        int fi, sat;
        float x;
        uint8_t want;
    } cases[] = {
        {0, 0, 0x1p-10f, 0x00},   /* tie between 0 and 2^-9: even */
        {0, 0, 0x3p-10f, 0x02},   /* tie between 2^-9 and 2^-8: even */
        {0, 0, 0x1p-9f, 0x01},    /* smallest subnormal */
        {0, 0, 0x1p-6f, 0x08},    /* smallest normal */
        {0, 0, 464.0f, 0x7e},     /* tie between 448 and (virtual) 480: even */
        {0, 0, 464.00003f, 0x7f}, /* just past: NaN */
        {0, 0, 480.0f, 0x7f},
        {0, 1, 480.0f, 0x7e},
        {0, 0, -480.0f, 0xff},
        {0, 1, -1e30f, 0xfe},
        {0, 0, -0.0f, 0x80},
        {0, 1, -0.0f, 0x80},
        {0, 0, 448.0f, 0x7e},
        {0, 0, -448.0f, 0xfe},
        {0, 0, INFINITY, 0x7f},
        {0, 0, -INFINITY, 0xff},
        {0, 1, INFINITY, 0x7e},
        {0, 1, -INFINITY, 0xfe},
        {0, 1, NAN, 0x7f},
        {0, 0, -NAN, 0xff},
        {0, 0, 1e-30f, 0x00},
        {0, 0, 0x1p-149f, 0x00},  /* float32 subnormal */
        {1, 0, 57344.0f, 0x7b},
        {1, 0, 61440.0f, 0x7c},   /* tie between max and (virtual) 65536: even = inf */
        {1, 0, 61439.996f, 0x7b},
        {1, 1, 61440.0f, 0x7b},
        {1, 0, -1e30f, 0xfc},
        {1, 1, -INFINITY, 0xfb},
        {1, 0, INFINITY, 0x7c},
        {1, 1, NAN, 0x7f},
        {1, 0, -0.0f, 0x80},
        {1, 0, 0x1p-16f, 0x01},   /* smallest subnormal */
        {1, 0, 0x1p-17f, 0x00},   /* tie to even */
        {1, 0, 0x1.000002p-17f, 0x01},
        {1, 0, 0x1p-14f, 0x04},   /* smallest normal */
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const fmt_t *f = cases[i].fi ? e5 : e4;
        uint8_t got = lib_encode1(f, cases[i].x, cases[i].sat);
        uint8_t one = cases[i].fi ? wsync_f32_to_e5m2(cases[i].x, cases[i].sat)
                                  : wsync_f32_to_e4m3fn(cases[i].x, cases[i].sat);
        CHECK_MSG(got == cases[i].want && one == got,
                  "%s sat=%d: %a -> 0x%02x (scalar 0x%02x), want 0x%02x", f->name, cases[i].sat,
                  (double)cases[i].x, got, one, cases[i].want);
    }
    CHECK(wsync_e4m3fn_to_f32(0x7e) == 448.0f);
    CHECK(wsync_e5m2_to_f32(0x7b) == 57344.0f);
    CHECK(wsync_e4m3fn_to_f32(0x01) == 0x1p-9f);
    CHECK(wsync_e5m2_to_f32(0x01) == 0x1p-16f);
    CHECK(isinf(wsync_e5m2_to_f32(0xfc)) && wsync_e5m2_to_f32(0xfc) < 0);
    CHECK(isnan(wsync_e4m3fn_to_f32(0xff)) && signbit(wsync_e4m3fn_to_f32(0xff)) != 0);
    CHECK(wsync_fp8_max(WSYNC_DTYPE_F8E4M3FN) == 448.0f);
    CHECK(wsync_fp8_max(WSYNC_DTYPE_F8E5M2) == 57344.0f);
}

/* ------------------------------------------------------------------------------------------ */
/* (d) quantizers against a float64 reference                                                   */
/* ------------------------------------------------------------------------------------------ */

static uint64_t rng_state;

static uint64_t rng_next(void)
{
    /* splitmix64: fixed seed, same data on every machine */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(void)
{
    return (double)(rng_next() >> 11) * 0x1p-53;
}

/* Weight-like values: signed, with magnitudes spread over several decades and the spread
 * varying by row, so that per-channel and block scales differ from the tensor's. */
static float *random_matrix(uint64_t rows, uint64_t cols, uint64_t pitch, uint64_t seed)
{
    float *x = malloc(sizeof(float) * (rows * pitch + 1));
    rng_state = seed;
    for (uint64_t r = 0; r < rows; r++) {
        double row_scale = pow(10.0, -3.0 + 4.0 * rng_unit());
        for (uint64_t c = 0; c < pitch; c++) {
            double v = (rng_unit() * 2.0 - 1.0) * row_scale * pow(10.0, -2.0 * rng_unit());
            x[r * pitch + c] = c < cols ? (float)v : NAN;  /* padding must never be read */
        }
    }
    return x;
}

/* Power of two at or above s, from frexp rather than from the bits; kept in the normal range. */
static double ref_pow2_ceil(double s)
{
    int e;
    double m = frexp(s, &e);                         /* s = m * 2^e, m in [0.5, 1) */
    double p = m == 0.5 ? s : ldexp(1.0, e);
    if (p < 0x1p-126)
        p = 0x1p-126;
    if (p > 0x1p127)
        p = 0x1p127;
    return p;
}

typedef struct {
    wsync_quant_scheme_t scheme;
    int br, bc;          /* as given to the library (0 = default) */
    float eps;
    int ue8m0, no_saturate;
} qcase_t;

/* The reference quantizer: per-cell amax in float64, scale rounded once to float32, each
 * element scaled (x / s or x * (1/s), each rounded to float32 as the rule says) and rounded by
 * the model. */
static void ref_quantize(const float *x, uint64_t rows, uint64_t cols, uint64_t pitch,
                         const qcase_t *qc, const fmt_t *f, uint8_t *q, float *s,
                         uint64_t *srows, uint64_t *scols)
{
    uint64_t br, bc;
    int block = qc->scheme == WSYNC_QUANT_BLOCK;

    if (qc->scheme == WSYNC_QUANT_TENSOR) {
        br = rows;
        bc = cols;
    } else if (qc->scheme == WSYNC_QUANT_CHANNEL) {
        br = 1;
        bc = cols;
    } else {
        br = qc->br ? (uint64_t)qc->br : 128;
        bc = qc->bc ? (uint64_t)qc->bc : 128;
    }
    *srows = (rows + br - 1) / br;
    *scols = (cols + bc - 1) / bc;
    for (uint64_t i = 0; i < *srows; i++) {
        for (uint64_t j = 0; j < *scols; j++) {
            double amax = 0;
            for (uint64_t r = i * br; r < rows && r < (i + 1) * br; r++)
                for (uint64_t c = j * bc; c < cols && c < (j + 1) * bc; c++)
                    amax = fmax(amax, fabs((double)x[r * pitch + c]));
            double sc;
            if (block) {
                double eps = qc->eps > 0 ? (double)qc->eps : (double)1e-4f;
                sc = (double)(float)(fmax(amax, eps) / f->max);
                if (qc->ue8m0)
                    sc = ref_pow2_ceil(sc);
            } else {
                sc = amax == 0 ? 1.0 : (double)(float)(amax / f->max);
            }
            float inv = (float)(1.0 / sc);
            s[i * *scols + j] = (float)sc;
            for (uint64_t r = i * br; r < rows && r < (i + 1) * br; r++) {
                for (uint64_t c = j * bc; c < cols && c < (j + 1) * bc; c++) {
                    double v = x[r * pitch + c];
                    float y = block ? (float)(v * (double)inv) : (float)(v / sc);
                    q[r * cols + c] = (uint8_t)model_encode(f, y, !qc->no_saturate);
                }
            }
        }
    }
}

/* Quantize with the library and the reference; compare scales and bytes; check the
 * dequantizer. */
static void check_quant(const char *label, uint64_t rows, uint64_t cols, uint64_t x_pitch,
                            uint64_t out_pitch, const qcase_t *qc, const fmt_t *f, uint64_t seed)
{
    float *x = random_matrix(rows, cols, x_pitch, seed);
    uint8_t *got = malloc(rows * out_pitch + 1), *want = malloc(rows * cols + 1);
    uint64_t max_scales = (rows + 1) * (cols + 1) + 1;
    float *s_got = malloc(sizeof(float) * max_scales), *s_want = malloc(sizeof(float) * max_scales);
    float *deq = malloc(sizeof(float) * (rows * cols + 1));
    wsync_quant_t q = {0};
    uint64_t srows, scols;
    int64_t sr = -1, sc = -1;

    q.scheme = qc->scheme;
    q.block_rows = qc->br;
    q.block_cols = qc->bc;
    q.eps = qc->eps;
    q.ue8m0 = qc->ue8m0;
    q.no_saturate = qc->no_saturate;
    memset(got, 0xaa, rows * out_pitch + 1);
    ref_quantize(x, rows, cols, x_pitch, qc, f, want, s_want, &srows, &scols);
    CHECK_OK(wsync_quant_scales_shape(&q, (int64_t)rows, (int64_t)cols, &sr, &sc));
    CHECK_MSG(sr == (int64_t)srows && sc == (int64_t)scols, "%s: scales shape %" PRId64
              " x %" PRId64 ", want %" PRIu64 " x %" PRIu64, label, sr, sc, srows, scols);
    CHECK_OK(wsync_quantize_f32(label, x, rows, cols, x_pitch, &q, f->dtype, got, out_pitch,
                                s_got));

    int bad = 0;
    for (uint64_t i = 0; i < srows * scols; i++)
        if (f32_bits(s_got[i]) != f32_bits(s_want[i]) && bad++ < 5)
            fprintf(stderr, "  %s %s: scale %" PRIu64 " = %.9g, reference %.9g\n", label, f->name,
                    i, (double)s_got[i], (double)s_want[i]);
    CHECK_MSG(bad == 0, "%s %s: %d scales differ", label, f->name, bad);

    bad = 0;
    for (uint64_t r = 0; r < rows; r++) {
        for (uint64_t c = 0; c < cols; c++) {
            uint8_t g = got[r * out_pitch + c], w = want[r * cols + c];
            if (g != w && bad++ < 5)
                fprintf(stderr, "  %s %s: [%" PRIu64 ", %" PRIu64 "] x = %.9g -> 0x%02x, "
                        "reference 0x%02x\n", label, f->name, r, c,
                        (double)x[r * x_pitch + c], g, w);
        }
        for (uint64_t c = cols; c < out_pitch; c++)
            if (got[r * out_pitch + c] != 0xaa && bad++ < 5)
                fprintf(stderr, "  %s: row %" PRIu64 " written past cols\n", label, r);
    }
    CHECK_MSG(bad == 0, "%s %s: %d bytes differ", label, f->name, bad);

    /* dequantizer: decode(q) * s in float32 */
    CHECK_OK(wsync_dequantize_f32(got, rows, cols, out_pitch, &q, f->dtype, s_got, deq, cols));
    bad = 0;
    for (uint64_t r = 0; r < rows; r++) {
        for (uint64_t c = 0; c < cols; c++) {
            uint64_t bi = qc->scheme == WSYNC_QUANT_TENSOR ? 0
                        : qc->scheme == WSYNC_QUANT_CHANNEL ? r
                        : (r / (qc->br ? (uint64_t)qc->br : 128)) * scols +
                              c / (qc->bc ? (uint64_t)qc->bc : 128);
            float w = (float)(model_value(f, want[r * cols + c]) * (double)s_want[bi]);
            if (f32_bits(deq[r * cols + c]) != f32_bits(w) && bad++ < 5)
                fprintf(stderr, "  %s: dequantized [%" PRIu64 ", %" PRIu64 "] = %.9g, want %.9g\n",
                        label, r, c, (double)deq[r * cols + c], (double)w);
        }
    }
    CHECK_MSG(bad == 0, "%s %s: %d dequantized values differ", label, f->name, bad);

    free(x);
    free(got);
    free(want);
    free(s_got);
    free(s_want);
    free(deq);
}

static void test_quant_tensor_and_channel(void)
{
    static const struct {
        uint64_t rows, cols, x_pitch, out_pitch;
    } shapes[] = {{1, 1000, 1000, 1000}, {7, 33, 40, 35}, {130, 200, 200, 200}, {1, 517, 517, 520}};
    for (int fi = 0; fi < 2; fi++) {
        for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
            for (int ns = 0; ns < 2; ns++) {
                qcase_t t = {WSYNC_QUANT_TENSOR, 0, 0, 0, 0, ns};
                qcase_t ch = {WSYNC_QUANT_CHANNEL, 0, 0, 0, 0, ns};
                char label[64];
                snprintf(label, sizeof(label), "tensor %" PRIu64 "x%" PRIu64, shapes[k].rows,
                         shapes[k].cols);
                check_quant(label, shapes[k].rows, shapes[k].cols, shapes[k].x_pitch,
                                     shapes[k].out_pitch, &t, &fmts[fi], 100 + k);
                snprintf(label, sizeof(label), "channel %" PRIu64 "x%" PRIu64, shapes[k].rows,
                         shapes[k].cols);
                check_quant(label, shapes[k].rows, shapes[k].cols, shapes[k].x_pitch,
                                     shapes[k].out_pitch, &ch, &fmts[fi], 200 + k);
            }
        }
    }
}

static void test_quant_block(void)
{
    static const struct {
        uint64_t rows, cols, x_pitch, out_pitch;
        int br, bc;
    } shapes[] = {
        {130, 200, 200, 200, 0, 0},      /* edge blocks both ways */
        {1, 300, 300, 300, 0, 0},        /* one row */
        {256, 384, 390, 384, 128, 128},
        {100, 70, 70, 72, 64, 32},
        {5, 300, 300, 300, 1, 128},      /* per-token groups of 128 (vLLM activations) */
        {3, 2, 2, 2, 0, 0},              /* smaller than one block */
    };
    for (int fi = 0; fi < 2; fi++) {
        for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
            for (int variant = 0; variant < 4; variant++) {
                /* default eps / larger eps / ue8m0 / non-saturating */
                qcase_t b = {WSYNC_QUANT_BLOCK, shapes[k].br, shapes[k].bc,
                             variant == 1 ? 1e-2f : 0.0f, variant == 2, variant == 3};
                char label[80];
                snprintf(label, sizeof(label), "block %" PRIu64 "x%" PRIu64 " by %dx%d v%d",
                         shapes[k].rows, shapes[k].cols, shapes[k].br, shapes[k].bc, variant);
                check_quant(label, shapes[k].rows, shapes[k].cols, shapes[k].x_pitch,
                                     shapes[k].out_pitch, &b, &fmts[fi], 300 + k);
            }
        }
    }
}

/* x / s and x * (1/s) differ by an ulp of float32 now and then, and an FP8 rounding midpoint
 * between the two flips the byte. Random data meets that about once in a million elements, so
 * plant such elements: each scheme must follow its own rule on them. */
static void test_quant_rounding_rule(void)
{
    enum { N = 128 };
    static const wsync_quant_scheme_t schemes[] = {WSYNC_QUANT_TENSOR, WSYNC_QUANT_CHANNEL,
                                                   WSYNC_QUANT_BLOCK};

    for (int fi = 0; fi < 2; fi++) {
        const fmt_t *f = &fmts[fi];
        const float amax = 3.3f;                     /* s is no power of two: 1/s is inexact */
        float s = (float)((double)amax / f->max);
        float inv = (float)(1.0 / (double)s);
        float x[N] = {0};
        int n = 0;

        x[n++] = amax;
        for (int c = 1; c < f->maxcode && n < N; c++) {
            double mid = (model_value(f, c) + model_value(f, c + 1)) / 2;
            uint32_t u0 = f32_bits((float)(mid * s));
            for (int k = -4; k <= 4 && n < N; k++) {
                float xc = bits_f32(u0 + (uint32_t)k);
                if (xc >= amax)
                    continue;
                xc = (n % 2) ? -xc : xc;
                if (model_encode(f, (float)((double)xc / s), 1) !=
                    model_encode(f, (float)((double)xc * inv), 1))
                    x[n++] = xc;
            }
        }
        CHECK_MSG(n > 16, "%s: only %d elements tell the rules apart", f->name, n - 1);

        for (size_t k = 0; k < sizeof(schemes) / sizeof(schemes[0]); k++) {
            wsync_quant_t q = {0};
            uint8_t out[N];
            float sg = 0;
            int bad = 0;
            q.scheme = schemes[k];
            CHECK_OK(wsync_quantize_f32("w", x, 1, N, N, &q, f->dtype, out, N, &sg));
            CHECK(sg == s);
            for (int i = 0; i < N; i++) {
                float y = schemes[k] == WSYNC_QUANT_BLOCK ? (float)((double)x[i] * inv)
                                                          : (float)((double)x[i] / s);
                int want = model_encode(f, y, 1);
                if (out[i] != want && bad++ < 5)
                    fprintf(stderr, "  %s scheme %d: x = %a -> 0x%02x, want 0x%02x\n", f->name,
                            (int)schemes[k], (double)x[i], out[i], want);
            }
            CHECK_MSG(bad == 0, "%s scheme %d: %d bytes follow the wrong rule", f->name,
                      (int)schemes[k], bad);
        }
    }
}

static void test_quant_zero_and_eps(void)
{
    /* [4, 256]: block (0, 1) all zero, the rest not */
    float x[4 * 256];
    uint8_t out[4 * 256];
    float s[2];
    wsync_quant_t q = {0};

    for (int i = 0; i < 4 * 256; i++)
        x[i] = (i % 256) < 128 ? (float)(i % 7) - 3.0f : 0.0f;
    q.scheme = WSYNC_QUANT_BLOCK;
    CHECK_OK(wsync_quantize_f32("w", x, 4, 256, 256, &q, WSYNC_DTYPE_F8E4M3FN, out, 256, s));
    CHECK(s[0] == 3.0f / 448.0f);
    CHECK_MSG(s[1] == 1e-4f / 448.0f, "eps scale %.9g", (double)s[1]);
    CHECK(out[128] == 0 && out[255] == 0);

    /* eps given */
    q.eps = 0.5f;
    CHECK_OK(wsync_quantize_f32("w", x, 4, 256, 256, &q, WSYNC_DTYPE_F8E4M3FN, out, 256, s));
    CHECK(s[0] == 3.0f / 448.0f && s[1] == 0.5f / 448.0f);

    /* ue8m0: 1e-4 / 448 = 2.23e-7 rounds up to 2^-22; 3/448 up to 2^-7 */
    q.eps = 0;
    q.ue8m0 = 1;
    CHECK_OK(wsync_quantize_f32("w", x, 4, 256, 256, &q, WSYNC_DTYPE_F8E4M3FN, out, 256, s));
    CHECK_MSG(s[0] == 0x1p-7f && s[1] == 0x1p-22f, "ue8m0 scales %a %a", (double)s[0],
              (double)s[1]);
    CHECK(wsync_e4m3fn_to_f32(out[0]) * s[0] == -3.0f);    /* x[0] = -3 */

    /* an exact power of two stays: amax 448 * 2^-3 */
    for (int i = 0; i < 128; i++)
        x[i] = i == 5 ? 56.0f : 1.0f;
    CHECK_OK(wsync_quantize_f32("w", x, 1, 128, 128, &q, WSYNC_DTYPE_F8E4M3FN, out, 128, s));
    CHECK(s[0] == 0.125f);

    /* all-zero tensor: s = 1, every byte 0; per channel, a zero row gets s = 1 */
    memset(x, 0, sizeof(x));
    x[300] = -2.0f;                                          /* row 1 */
    memset(out, 0xaa, sizeof(out));
    q = (wsync_quant_t){0};
    q.scheme = WSYNC_QUANT_TENSOR;
    CHECK_OK(wsync_quantize_f32("w", x, 1, 256, 256, &q, WSYNC_DTYPE_F8E5M2, out, 256, s));
    CHECK(s[0] == 1.0f);
    int nonzero = 0;
    for (int i = 0; i < 256; i++)
        nonzero += out[i] != 0;
    CHECK(nonzero == 0);
    float sc[4];
    q.scheme = WSYNC_QUANT_CHANNEL;
    CHECK_OK(wsync_quantize_f32("w", x, 4, 256, 256, &q, WSYNC_DTYPE_F8E4M3FN, out, 256, sc));
    CHECK(sc[0] == 1.0f && sc[1] == 2.0f / 448.0f && sc[2] == 1.0f && sc[3] == 1.0f);
    CHECK(out[300] == 0xfe);                                 /* -2 / s = -448 */

    /* empty tensor: one scale of 1, nothing else touched */
    s[0] = 0;
    q.scheme = WSYNC_QUANT_TENSOR;
    CHECK_OK(wsync_quantize_f32("w", NULL, 0, 0, 0, &q, WSYNC_DTYPE_F8E4M3FN, NULL, 0, s));
    CHECK(s[0] == 1.0f);

    CHECK(wsync_amax_f32(x, 4 * 256) == 2.0f);
    CHECK(wsync_amax_f32(x, 0) == 0.0f);
}

/* ------------------------------------------------------------------------------------------ */
/* (e) non-finite input                                                                         */
/* ------------------------------------------------------------------------------------------ */

static void test_nonfinite_names_param(void)
{
    static const wsync_quant_scheme_t schemes[] = {WSYNC_QUANT_TENSOR, WSYNC_QUANT_CHANNEL,
                                                   WSYNC_QUANT_BLOCK};
    static const float bad[] = {NAN, INFINITY, -INFINITY};
    const char *name = "model.layers.3.mlp.down_proj.weight";
    enum { R = 9, C = 150 };
    float *x = random_matrix(R, C, C, 7);
    uint8_t out[R * C];
    float s[R * 2];

    for (size_t k = 0; k < sizeof(schemes) / sizeof(schemes[0]); k++) {
        for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
            wsync_quant_t q = {0};
            q.scheme = schemes[k];
            x[3 * C + 7] = bad[b];
            x[5 * C + 140] = NAN;                            /* later: not the one reported */
            memset(out, 0xaa, sizeof(out));
            memset(s, 0xaa, sizeof(s));
            CHECK_ST(wsync_quantize_f32(name, x, R, C, C, &q, WSYNC_DTYPE_F8E4M3FN, out, C, s),
                     WSYNC_ERR_NONFINITE);
            CHECK_ERR_HAS(name);
            CHECK_ERR_HAS("row 3, column 7");
            CHECK_ERR_HAS(b == 0 ? "NaN" : b == 1 ? "Inf" : "-Inf");
            int touched = 0;
            for (size_t i = 0; i < sizeof(out); i++)
                touched += out[i] != 0xaa;
            for (size_t i = 0; i < sizeof(s); i++)
                touched += ((uint8_t *)s)[i] != 0xaa;
            CHECK_MSG(touched == 0, "scheme %d: %d output bytes written on error",
                      (int)schemes[k], touched);
        }
    }
    /* NaN in the pitch padding is not part of the matrix */
    {
        wsync_quant_t q = {0};
        float y[2 * 4] = {1, 2, 3, NAN, 4, 5, 6, INFINITY};
        q.scheme = WSYNC_QUANT_TENSOR;
        CHECK_OK(wsync_quantize_f32(name, y, 2, 3, 4, &q, WSYNC_DTYPE_F8E4M3FN, out, 3, s));
    }
    free(x);
}

/* ------------------------------------------------------------------------------------------ */
/* (f) quantize then slice == slice then quantize                                               */
/* ------------------------------------------------------------------------------------------ */

static void test_block_slice_equivalence(void)
{
    enum { R = 256, C = 384 };
    float *x = random_matrix(R, C, C, 11);
    uint8_t *full = malloc(R * C), *part = malloc(R * C);
    float s_full[2 * 3], s_part[3];
    wsync_quant_t q = {0};

    q.scheme = WSYNC_QUANT_BLOCK;
    for (int fi = 0; fi < 2; fi++) {
        for (int ue = 0; ue < 2; ue++) {
            q.ue8m0 = ue;
            CHECK_OK(wsync_quantize_f32("full", x, R, C, C, &q, fmts[fi].dtype, full, C, s_full));
            /* rows [128, 256): a row-parallel TP slice */
            CHECK_OK(wsync_quantize_f32("rows", x + 128 * C, 128, C, C, &q, fmts[fi].dtype, part,
                                        C, s_part));
            CHECK(memcmp(full + 128 * C, part, 128 * C) == 0);
            CHECK(memcmp(&s_full[3], s_part, sizeof(s_part)) == 0);
            /* columns [128, 384): a column-parallel slice, read through the pitch */
            float s_cols[2 * 2];
            CHECK_OK(wsync_quantize_f32("cols", x + 128, R, 256, C, &q, fmts[fi].dtype, part, 256,
                                        s_cols));
            int same = 1;
            for (int r = 0; r < R; r++)
                same &= memcmp(full + r * C + 128, part + r * 256, 256) == 0;
            CHECK(same);
            CHECK(s_cols[0] == s_full[1] && s_cols[1] == s_full[2] && s_cols[2] == s_full[4] &&
                  s_cols[3] == s_full[5]);
        }
    }
    free(x);
    free(full);
    free(part);
}

/* ------------------------------------------------------------------------------------------ */
/* (g) bad arguments                                                                            */
/* ------------------------------------------------------------------------------------------ */

static void test_bad_arguments(void)
{
    float x[4] = {1, 2, 3, 4}, s[4];
    uint8_t b[4] = {0};
    wsync_quant_t q = {0};
    int64_t sr, sc;

    CHECK_ST(wsync_fp8_from_f32(x, 4, WSYNC_DTYPE_BF16, 1, b), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("bf16");
    CHECK_ST(wsync_fp8_from_f32(x, 4, (wsync_dtype_t)99, 1, b), WSYNC_ERR_INVALID);
    CHECK_ST(wsync_fp8_from_f32(NULL, 4, WSYNC_DTYPE_F8E4M3FN, 1, b), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("src");
    CHECK_ST(wsync_fp8_from_f32(x, 4, WSYNC_DTYPE_F8E4M3FN, 1, NULL), WSYNC_ERR_INVALID);
    CHECK_OK(wsync_fp8_from_f32(NULL, 0, WSYNC_DTYPE_F8E5M2, 0, NULL));
    CHECK_ST(wsync_fp8_to_f32(b, 4, WSYNC_DTYPE_F32, x), WSYNC_ERR_INVALID);
    CHECK_ST(wsync_fp8_to_f32(NULL, 4, WSYNC_DTYPE_F8E5M2, x), WSYNC_ERR_INVALID);
    CHECK_ST(wsync_fp8_to_f32(b, 4, WSYNC_DTYPE_F8E5M2, NULL), WSYNC_ERR_INVALID);
    CHECK_OK(wsync_fp8_to_f32(NULL, 0, WSYNC_DTYPE_F8E5M2, NULL));

    q.scheme = WSYNC_QUANT_NONE;
    CHECK_ST(wsync_quant_scales_shape(&q, 4, 4, &sr, &sc), WSYNC_ERR_INVALID);
    CHECK_ST(wsync_quantize_f32("w", x, 2, 2, 2, &q, WSYNC_DTYPE_F8E4M3FN, b, 2, s),
             WSYNC_ERR_INVALID);
    q.scheme = WSYNC_QUANT_BLOCK;
    CHECK_ST(wsync_quant_scales_shape(NULL, 4, 4, &sr, &sc), WSYNC_ERR_INVALID);
    CHECK_ST(wsync_quant_scales_shape(&q, -1, 4, &sr, &sc), WSYNC_ERR_INVALID);
    CHECK_ST(wsync_quant_scales_shape(&q, 4, 4, NULL, &sc), WSYNC_ERR_INVALID);
    q.block_rows = -128;
    CHECK_ST(wsync_quant_scales_shape(&q, 4, 4, &sr, &sc), WSYNC_ERR_INVALID);
    CHECK_ST(wsync_quantize_f32("w", x, 2, 2, 2, &q, WSYNC_DTYPE_F8E4M3FN, b, 2, s),
             WSYNC_ERR_INVALID);
    q.block_rows = 0;
    q.eps = INFINITY;
    CHECK_ST(wsync_quantize_f32("w", x, 2, 2, 2, &q, WSYNC_DTYPE_F8E4M3FN, b, 2, s),
             WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("eps");
    q.eps = 0;
    CHECK_ST(wsync_quantize_f32("w", x, 2, 2, 2, &q, WSYNC_DTYPE_BF16, b, 2, s),
             WSYNC_ERR_INVALID);
    CHECK_ST(wsync_quantize_f32("w", x, 2, 2, 2, NULL, WSYNC_DTYPE_F8E4M3FN, b, 2, s),
             WSYNC_ERR_INVALID);
    CHECK_ST(wsync_quantize_f32("w", NULL, 2, 2, 2, &q, WSYNC_DTYPE_F8E4M3FN, b, 2, s),
             WSYNC_ERR_INVALID);
    CHECK_ST(wsync_quantize_f32("w", x, 2, 2, 2, &q, WSYNC_DTYPE_F8E4M3FN, NULL, 2, s),
             WSYNC_ERR_INVALID);
    CHECK_ST(wsync_quantize_f32("w", x, 2, 2, 2, &q, WSYNC_DTYPE_F8E4M3FN, b, 2, NULL),
             WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("scales");
    CHECK_ST(wsync_quantize_f32("w", x, 2, 2, 1, &q, WSYNC_DTYPE_F8E4M3FN, b, 2, s),
             WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("pitch");
    CHECK_ST(wsync_quantize_f32("w", x, 2, 2, 2, &q, WSYNC_DTYPE_F8E4M3FN, b, 1, s),
             WSYNC_ERR_INVALID);
    q.scheme = WSYNC_QUANT_CHANNEL;
    q.ue8m0 = 1;
    CHECK_ST(wsync_quantize_f32("w", x, 2, 2, 2, &q, WSYNC_DTYPE_F8E4M3FN, b, 2, s),
             WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("ue8m0");
    CHECK_ST(wsync_dequantize_f32(b, 2, 2, 2, &q, WSYNC_DTYPE_F8E4M3FN, s, x, 2),
             WSYNC_ERR_INVALID);
    q.ue8m0 = 0;
    CHECK_ST(wsync_dequantize_f32(b, 2, 2, 2, &q, WSYNC_DTYPE_F8E4M3FN, NULL, x, 2),
             WSYNC_ERR_INVALID);
    CHECK_ST(wsync_dequantize_f32(b, 2, 2, 2, &q, WSYNC_DTYPE_U8, s, x, 2), WSYNC_ERR_INVALID);
}

static void test_scales_shape(void)
{
    wsync_quant_t q = {0};
    int64_t sr = -1, sc = -1;

    q.scheme = WSYNC_QUANT_TENSOR;
    CHECK_OK(wsync_quant_scales_shape(&q, 4096, 11008, &sr, &sc));
    CHECK(sr == 1 && sc == 1);
    q.scheme = WSYNC_QUANT_CHANNEL;
    CHECK_OK(wsync_quant_scales_shape(&q, 4096, 11008, &sr, &sc));
    CHECK(sr == 4096 && sc == 1);
    q.scheme = WSYNC_QUANT_BLOCK;
    CHECK_OK(wsync_quant_scales_shape(&q, 2368, 3584, &sr, &sc));
    CHECK(sr == 19 && sc == 28);
    CHECK_OK(wsync_quant_scales_shape(&q, 130, 200, &sr, &sc));
    CHECK(sr == 2 && sc == 2);
    CHECK_OK(wsync_quant_scales_shape(&q, 0, 200, &sr, &sc));
    CHECK(sr == 0 && sc == 2);
    q.block_rows = 1;
    q.block_cols = 64;
    CHECK_OK(wsync_quant_scales_shape(&q, 5, 129, &sr, &sc));
    CHECK(sr == 5 && sc == 3);
}

int main(void)
{
    RUN(test_bf16_all_patterns_match_pytorch);
    RUN(test_f32_sweep_matches_model);
    RUN(test_decode_all_codes);
    RUN(test_edge_values);
    RUN(test_quant_tensor_and_channel);
    RUN(test_quant_block);
    RUN(test_quant_rounding_rule);
    RUN(test_quant_zero_and_eps);
    RUN(test_nonfinite_names_param);
    RUN(test_block_slice_equivalence);
    RUN(test_bad_arguments);
    RUN(test_scales_shape);
    return check_summary();
}
