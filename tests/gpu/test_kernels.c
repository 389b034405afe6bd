/* The CUDA kernels (kernels/kernels.h) against the CPU executor and quantizer, on fresh random
 * inputs (the seed is printed; --seed S repeats a run), with every output buffer poisoned before
 * each run; then, unless --no-bench, the bandwidth of each kernel as a fraction of a
 * device-to-device cudaMemcpy of the same bytes read + written, timed in the same run.
 *
 * usage: test_kernels [--seed S] [--no-bench] [--json PATH]
 * Exit 0 when every case passed, 1 otherwise, 77 when there is no CUDA device. Not a ctest:
 * tests/gpu/run.sh runs it on a GPU machine. */
#include "core/util.h"
#include "kernels/kernels.h"
#include "reshard/convert.h"
#include "reshard/exec.h"
#include "reshard/fp8.h"
#include "tests/support/check.h"
#include "transports/cuda_ipc.h"
#include "tests/gpu/cuda_check.h"

#include <cuda_runtime_api.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


/* ------------------------------------------------------------------------------------------ */
/* Random numbers and data                                                                      */
/* ------------------------------------------------------------------------------------------ */

static uint64_t rng;

static uint64_t rnd(void)
{
    /* xorshift64* */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * UINT64_C(2685821657736338717);
}

static uint64_t below(uint64_t n) { return n ? rnd() % n : 0; }
static uint64_t range(uint64_t lo, uint64_t hi) { return lo + below(hi - lo + 1); }

static float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* A float of magnitude 2^e with a random mantissa and sign. */
static float rnd_float(int e)
{
    uint32_t u = (uint32_t)(rnd() & 0x807fffffu) | ((uint32_t)(e + 127) << 23);
    return f32_of(u);
}

/* Elements for the copy tests: half random bit patterns (NaN, Inf, subnormals included), half
 * values near the 16-bit formats' range, so casts round rather than overflow. Never all zero. */
static void fill_copy_src(uint8_t *p, size_t n, wsync_dtype_t dt)
{
    size_t esz = wsync_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rnd();
        uint32_t u;
        if ((r & 1) || esz == 1) {
            u = (uint32_t)(r >> 8);
        } else {
            float f = rnd_float((int)range(0, 45) - 27);
            u = dt == WSYNC_DTYPE_F32 ? bits_of(f) : dt == WSYNC_DTYPE_BF16 ? bits_of(f) >> 16
                                                                            : wsync_f32_to_f16(f);
        }
        memcpy(p + i * esz, &u, esz);
    }
}

static const char *dtn(wsync_dtype_t t) { return wsync_dtype_name(t); }

static size_t first_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i])
            return i;
    return n;
}

/* ------------------------------------------------------------------------------------------ */
/* Results for the JSON file                                                                    */
/* ------------------------------------------------------------------------------------------ */

#define MAX_CASES 32
#define MAX_BENCH 32

static struct {
    const char *name;
    int failures;
} cases[MAX_CASES];
static int ncases;

typedef struct {
    char name[64];
    double bytes;          /* read + written by the kernel(s), as they run */
    double useful;         /* the bytes a single pass would move (input + output) */
    double t_kernel, t_d2d; /* seconds, medians */
} bench_row_t;

static bench_row_t bench[MAX_BENCH];
static int nbench;

static void run_case(const char *name, void (*fn)(void))
{
    check_run(name, fn);
    if (ncases < MAX_CASES) {
        cases[ncases].name = name;
        cases[ncases].failures = check_failures;
        ncases++;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Copies                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static const wsync_dtype_t float_types[3] = {WSYNC_DTYPE_BF16, WSYNC_DTYPE_F16, WSYNC_DTYPE_F32};

static void pick_pair(wsync_dtype_t *s, wsync_dtype_t *d, int same)
{
    static const wsync_dtype_t any[5] = {WSYNC_DTYPE_BF16, WSYNC_DTYPE_F16, WSYNC_DTYPE_F32,
                                         WSYNC_DTYPE_F8E4M3FN, WSYNC_DTYPE_U8};
    if (same || below(3) == 0) {
        *s = *d = any[below(5)];
        return;
    }
    *s = float_types[below(3)];
    do
        *d = float_types[below(3)];
    while (*d == *s);
}

/* A random copy inside arenas: region geometry only (src/dst are offsets until placed). */
typedef struct {
    wsync_kcopy_t c;
    size_t src_at, dst_at, src_bytes, dst_bytes;   /* byte ranges in the arenas */
} placed_t;

/* same: no cast (a batch of such copies runs the byte-copy kernel) */
static void make_copy(placed_t *p, size_t *src_used, size_t *dst_used, int same)
{
    wsync_kcopy_t *c = &p->c;
    int aligned = below(2) == 0;
    size_t ss, ds;

    memset(p, 0, sizeof(*p));
    pick_pair(&c->src_dtype, &c->dst_dtype, same);
    ss = wsync_dtype_size(c->src_dtype);
    ds = wsync_dtype_size(c->dst_dtype);
    switch (below(4)) {
    case 0: c->rows = 1; c->cols = range(1, 20000); break;
    case 1: c->rows = range(1, 8); c->cols = range(1, 3000); break;
    case 2: c->rows = range(1, 300); c->cols = range(1, 40); break;
    default: c->rows = range(1, 200); c->cols = range(1, 1500); break;
    }
    if (aligned) {
        c->cols = (c->cols + 15) / 16 * 16;
        c->src_pitch = c->cols + 16 * below(3);
        c->dst_pitch = c->cols + 16 * below(3);
        c->src_off = 16 * below(4);
        c->dst_off = 16 * below(4);
    } else if (below(3) == 0) {              /* dense: one long row after flattening */
        c->src_pitch = c->dst_pitch = c->cols;
        c->src_off = below(9);
        c->dst_off = below(9);
    } else {
        c->src_pitch = c->cols + below(7);
        c->dst_pitch = c->cols + below(7);
        c->src_off = below(9);
        c->dst_off = below(9);
    }
    p->src_bytes = (c->src_off + (c->rows - 1) * c->src_pitch + c->cols) * ss;
    p->dst_bytes = (c->dst_off + (c->rows - 1) * c->dst_pitch + c->cols) * ds;
    p->src_at = *src_used;
    p->dst_at = *dst_used;
    *src_used += (p->src_bytes + 255) / 256 * 256;
    *dst_used += (p->dst_bytes + 255) / 256 * 256;
}

/* Random batches of copies, run by the batch and the one-shot entry points, against
 * wsync_exec_copy; the batch also with its grid capped at 3 blocks (each block then strides over
 * many units, as a receiver's capped batches do). The second half of the trials has no casts
 * (the byte-copy kernel). */
static const char *const copy_ways[3] = {"batch", "one-shot", "batch, 3 blocks"};

static void test_copy_random(void)
{
    for (int trial = 0; trial < 40; trial++) {
        uint32_t n = (uint32_t)range(1, 48);
        placed_t *pl = calloc(n, sizeof(*pl));
        wsync_kcopy_t *cd = calloc(n, sizeof(*cd));
        size_t su = 0, du = 0;
        for (uint32_t i = 0; i < n; i++)
            make_copy(&pl[i], &su, &du, trial >= 20);
        uint8_t *hs = malloc(su), *hd = malloc(du), *ref = malloc(du), *got = malloc(du);
        uint8_t poison = (uint8_t)(rnd() | 1);
        void *ds_, *dd_;
        CU(cudaMalloc(&ds_, su));
        CU(cudaMalloc(&dd_, du));
        memset(hs, 0, su);
        for (uint32_t i = 0; i < n; i++)
            fill_copy_src(hs + pl[i].src_at, pl[i].src_bytes / wsync_dtype_size(pl[i].c.src_dtype),
                          pl[i].c.src_dtype);
        memset(ref, poison, du);
        for (uint32_t i = 0; i < n; i++) {
            wsync_kcopy_t c = pl[i].c;
            wsync_region_t sr = {c.src_off, c.src_pitch, c.rows, c.cols};
            wsync_region_t dr = {c.dst_off, c.dst_pitch, c.rows, c.cols};
            CHECK_OK(wsync_exec_copy(hs + pl[i].src_at, c.src_dtype, &sr, ref + pl[i].dst_at,
                                     c.dst_dtype, &dr));
            cd[i] = c;
            cd[i].src = (uint8_t *)ds_ + pl[i].src_at;
            cd[i].dst = (uint8_t *)dd_ + pl[i].dst_at;
        }
        CU(cudaMemcpy(ds_, hs, su, cudaMemcpyHostToDevice));
        for (int way = 0; way < 3; way++) {
            wsync_kcopy_batch_t *b = NULL;
            memset(hd, poison, du);
            CU(cudaMemcpy(dd_, hd, du, cudaMemcpyHostToDevice));
            if (way == 1) {
                CHECK_OK(wsync_kernels_copy(cd, n, NULL));
            } else {
                CHECK_OK(wsync_kernels_batch_create(cd, n, &b));
                if (way == 2)
                    wsync_kernels_batch_limit(b, 3);
                CHECK_OK(wsync_kernels_batch_launch(b, NULL));
            }
            CU(cudaDeviceSynchronize());
            wsync_kernels_batch_free(b);
            CU(cudaMemcpy(got, dd_, du, cudaMemcpyDeviceToHost));
            size_t at = first_diff(ref, got, du);
            if (at != du) {
                uint32_t i = 0;
                while (i + 1 < n && pl[i + 1].dst_at <= at)
                    i++;
                const wsync_kcopy_t *c = &pl[i].c;
                CHECK_MSG(0, "trial %d (%s): byte %zu differs (%02x, want %02x): copy %u %s->%s "
                          "%" PRIu64 "x%" PRIu64 " off %" PRIu64 "/%" PRIu64 " pitch %" PRIu64 "/%" PRIu64,
                          trial, copy_ways[way], at, got[at], ref[at], i,
                          dtn(c->src_dtype), dtn(c->dst_dtype), c->rows, c->cols, c->src_off,
                          c->dst_off, c->src_pitch, c->dst_pitch);
            }
        }
        CU(cudaFree(ds_));
        CU(cudaFree(dd_));
        free(hs);
        free(hd);
        free(ref);
        free(got);
        free(pl);
        free(cd);
    }
}

/* A shard, chunks of it packed into a bucket (the plan's structs and the descriptor helpers),
 * then each chunk unpacked into its own target, cast or not: against wsync_exec_pack / _unpack. */
static void test_pack_unpack_plan(void)
{
    for (int trial = 0; trial < 12; trial++) {
        static const wsync_dtype_t shard_types[4] = {WSYNC_DTYPE_BF16, WSYNC_DTYPE_F16,
                                                     WSYNC_DTYPE_F32, WSYNC_DTYPE_F8E4M3FN};
        wsync_dtype_t sdt = shard_types[below(4)];
        size_t ss = wsync_dtype_size(sdt);
        uint64_t R = range(1, 700), C = range(1, 2000);
        uint32_t n = (uint32_t)range(1, 40);
        wsync_chunk_t *ch = calloc(n, sizeof(*ch));
        wsync_segment_t *sg = calloc(n, sizeof(*sg));
        wsync_dtype_t *tdt = calloc(n, sizeof(*tdt));
        size_t *tat = calloc(n, sizeof(*tat)), tu = 0;
        uint64_t bu = 0;
        for (uint32_t i = 0; i < n; i++) {
            uint64_t r0 = below(R), c0 = below(C);
            uint64_t rows = range(1, R - r0), cols = range(1, C - c0);
            ch[i].dtype = sdt;
            ch[i].src = (wsync_region_t){r0 * C + c0, C, rows, cols};
            ch[i].bucket_off = bu;
            bu += (rows * cols * ss + 63) / 64 * 64;
            tdt[i] = sdt == WSYNC_DTYPE_F8E4M3FN || below(2) ? sdt : float_types[below(3)];
            uint64_t pitch = cols + below(2) * range(1, 9), off = below(2) * range(1, 9);
            sg[i].chunk = i;
            sg[i].dst = (wsync_region_t){off, pitch, rows, cols};
            tat[i] = tu;
            tu += ((off + (rows - 1) * pitch + cols) * wsync_dtype_size(tdt[i]) + 255) / 256 * 256;
        }
        size_t sb = R * C * ss;
        uint8_t *hs = malloc(sb), *hb = malloc(bu), *gb = malloc(bu), *ht = malloc(tu),
                *gt = malloc(tu);
        uint8_t poison = (uint8_t)(rnd() | 1);
        void *d_s, *d_b, *d_t;
        wsync_kcopy_t *cd = calloc(n, sizeof(*cd));
        wsync_kcopy_batch_t *b = NULL;

        fill_copy_src(hs, R * C, sdt);
        CU(cudaMalloc(&d_s, sb));
        CU(cudaMalloc(&d_b, bu));
        CU(cudaMalloc(&d_t, tu));
        CU(cudaMemcpy(d_s, hs, sb, cudaMemcpyHostToDevice));

        /* pack */
        memset(hb, poison, bu);
        CU(cudaMemcpy(d_b, hb, bu, cudaMemcpyHostToDevice));
        for (uint32_t i = 0; i < n; i++) {
            wsync_exec_pack(&ch[i], hs, hb);
            CHECK_OK(wsync_kernels_pack_desc(&ch[i], d_s, d_b, &cd[i]));
        }
        CHECK_OK(wsync_kernels_batch_create(cd, n, &b));
        CHECK_OK(wsync_kernels_batch_launch(b, NULL));
        CU(cudaDeviceSynchronize());
        wsync_kernels_batch_free(b);
        b = NULL;
        CU(cudaMemcpy(gb, d_b, bu, cudaMemcpyDeviceToHost));
        size_t at = first_diff(hb, gb, bu);
        CHECK_MSG(at == bu, "trial %d: pack of %u %s chunks: bucket byte %zu differs", trial, n,
                  dtn(sdt), at);

        /* unpack, from the CPU's bucket on both sides so that a pack error does not spread */
        CU(cudaMemcpy(d_b, hb, bu, cudaMemcpyHostToDevice));
        memset(ht, poison, tu);
        CU(cudaMemcpy(d_t, ht, tu, cudaMemcpyHostToDevice));
        for (uint32_t i = 0; i < n; i++) {
            CHECK_OK(wsync_exec_unpack(&sg[i], &ch[i], hb, tdt[i], ht + tat[i]));
            CHECK_OK(wsync_kernels_unpack_desc(&sg[i], &ch[i], d_b, tdt[i], (uint8_t *)d_t + tat[i],
                                               &cd[i]));
        }
        CHECK_OK(wsync_kernels_batch_create(cd, n, &b));
        CHECK_OK(wsync_kernels_batch_launch(b, NULL));
        CU(cudaDeviceSynchronize());
        wsync_kernels_batch_free(b);
        CU(cudaMemcpy(gt, d_t, tu, cudaMemcpyDeviceToHost));
        at = first_diff(ht, gt, tu);
        CHECK_MSG(at == tu, "trial %d: unpack of %u %s chunks: target byte %zu differs", trial, n,
                  dtn(sdt), at);

        CU(cudaFree(d_s));
        CU(cudaFree(d_b));
        CU(cudaFree(d_t));
        free(hs);
        free(hb);
        free(gb);
        free(ht);
        free(gt);
        free(ch);
        free(sg);
        free(tdt);
        free(tat);
        free(cd);
    }
}

static void test_copy_errors(void)
{
    wsync_chunk_t ch = {0, 0, WSYNC_DTYPE_BF16, 0, {0, 8, 2, 8}, 0, 0, 0};
    wsync_segment_t sg = {0, 0, 0, 0, {0, 8, 2, 8}};
    wsync_kcopy_t c;
    wsync_kcopy_batch_t *b = NULL;
    int dummy[4] = {0};

    CHECK_ST(wsync_kernels_unpack_desc(&sg, &ch, dummy, WSYNC_DTYPE_F8E4M3FN, dummy, &c),
             WSYNC_ERR_UNSUPPORTED);
    CHECK_ERR_HAS("quantizer");
    CHECK_OK(wsync_kernels_unpack_desc(&sg, &ch, dummy, WSYNC_DTYPE_F32, dummy, &c));
    c.dst_dtype = WSYNC_DTYPE_U8;
    CHECK_ST(wsync_kernels_batch_create(&c, 1, &b), WSYNC_ERR_UNSUPPORTED);
    CHECK_ERR_HAS("bf16 to u8");
    c.dst_dtype = WSYNC_DTYPE_F32;
    c.src = NULL;
    CHECK_ST(wsync_kernels_batch_create(&c, 1, &b), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("copy 0: src is NULL");
    c.src = dummy;
    c.dst_pitch = 4;
    CHECK_ST(wsync_kernels_copy(&c, 1, NULL), WSYNC_ERR_INVALID);
    CHECK(b == NULL);
    /* an empty batch launches nothing; a NULL one is refused */
    CHECK_OK(wsync_kernels_batch_create(NULL, 0, &b));
    CHECK_OK(wsync_kernels_batch_launch(b, NULL));
    CHECK_ST(wsync_kernels_batch_launch(NULL, NULL), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("batch is NULL");
    wsync_kernels_batch_free(b);
    CU(cudaDeviceSynchronize());
}

/* ------------------------------------------------------------------------------------------ */
/* amax and quantization                                                                        */
/* ------------------------------------------------------------------------------------------ */

/* Host matrix of x_dtype and its f32 image (what the CPU quantizer reads), with random
 * magnitudes per group of rows and a wide spread inside (FP8 subnormals and zeros after
 * scaling), some cells tiny (below the block eps); with MAT_ZERO_ROWS a few rows of zeros; with
 * MAT_EXTREMES (not f16) some groups of rows in 2^-149 .. 2^-100, f32 subnormals included (where
 * the GPU's x / s takes its exact-division path), and scattered +0 and -0. */
#define MAT_ZERO_ROWS 1
#define MAT_EXTREMES 2
typedef struct {
    wsync_dtype_t dt;
    uint64_t rows, cols, pitch;
    uint8_t *x;            /* [rows, pitch] of dt */
    float *f;              /* [rows, pitch] f32 image */
} mat_t;

static void mat_make(mat_t *m, wsync_dtype_t dt, uint64_t rows, uint64_t cols, uint64_t pitch,
                     int flags)
{
    size_t esz = wsync_dtype_size(dt);
    m->dt = dt;
    m->rows = rows;
    m->cols = cols;
    m->pitch = pitch;
    m->x = malloc(rows * pitch * esz + 1);
    m->f = malloc(rows * pitch * sizeof(float) + 1);
    int group_e = 0, tiny = 0;
    int extremes = (flags & MAT_EXTREMES) && dt != WSYNC_DTYPE_F16;
    for (uint64_t r = 0; r < rows; r++) {
        if (r % 16 == 0) {
            group_e = below(8) == 0 ? -30 : (int)range(0, 16) - 8;
            tiny = extremes && below(6) == 0;
        }
        int zero = (flags & MAT_ZERO_ROWS) && below(40) == 0;
        int spread = below(4) == 0 ? 20 : 8;
        for (uint64_t c = 0; c < pitch; c++) {
            int e = group_e - (int)below((uint64_t)spread + 1);
            if (dt == WSYNC_DTYPE_F16 && e < -24)
                e = -24 + (int)below(4);
            float v = zero ? 0.0f : rnd_float(e);
            if (tiny && !zero)
                v = ldexpf((below(2) ? -1.0f : 1.0f) * (1.0f + (float)below(1u << 23) / 8388608.0f),
                           -(int)range(100, 149));
            if (extremes && below(64) == 0)
                v = below(2) ? -0.0f : 0.0f;
            uint32_t u;
            if (dt == WSYNC_DTYPE_BF16) {
                u = bits_of(v) >> 16;
                v = wsync_bf16_to_f32((uint16_t)u);
            } else if (dt == WSYNC_DTYPE_F16) {
                u = wsync_f32_to_f16(v);
                v = wsync_f16_to_f32((uint16_t)u);
            } else {
                u = bits_of(v);
            }
            memcpy(m->x + (r * pitch + c) * esz, &u, esz);
            m->f[r * pitch + c] = v;
        }
    }
}

static void mat_free(mat_t *m)
{
    free(m->x);
    free(m->f);
}

static void test_amax(void)
{
    for (int trial = 0; trial < 24; trial++) {
        mat_t m;
        wsync_dtype_t dt = float_types[trial % 3];
        uint64_t rows = range(1, 400), cols = range(1, 3000);
        uint64_t pitch = below(2) ? cols : cols + range(1, 9);
        mat_make(&m, dt, rows, cols, pitch, 0);
        if (trial % 6 == 5) {          /* an Inf, or a NaN: the result shows it, as on the CPU */
            uint64_t r = below(rows), c = below(cols);
            float bad = trial % 12 == 5 ? INFINITY : NAN;
            uint32_t u = dt == WSYNC_DTYPE_F32 ? bits_of(bad) : dt == WSYNC_DTYPE_BF16
                ? bits_of(bad) >> 16 : wsync_f32_to_f16(bad);
            memcpy(m.x + (r * pitch + c) * wsync_dtype_size(dt), &u, wsync_dtype_size(dt));
            m.f[r * pitch + c] = bad;
        }
        uint32_t want = 0;
        for (uint64_t r = 0; r < rows; r++) {
            uint32_t b = bits_of(wsync_amax_f32(m.f + r * pitch, cols));
            want = b > want ? b : want;
        }
        size_t bytes = rows * pitch * wsync_dtype_size(dt);
        size_t shift = below(2) ? 0 : wsync_dtype_size(dt);   /* misaligned base too */
        uint8_t *d;
        float *d_amax, got = 0;
        CU(cudaMalloc((void **)&d, bytes + 16));
        CU(cudaMalloc((void **)&d_amax, sizeof(float)));
        CU(cudaMemcpy(d + shift, m.x, bytes, cudaMemcpyHostToDevice));
        CU(cudaMemset(d_amax, 0x7b, sizeof(float)));
        CHECK_OK(wsync_kernels_amax(d + shift, dt, rows, cols, pitch, d_amax, NULL));
        CU(cudaMemcpy(&got, d_amax, sizeof(float), cudaMemcpyDeviceToHost));
        CHECK_MSG(bits_of(got) == want, "trial %d: %s %" PRIu64 "x%" PRIu64 " pitch %" PRIu64
                  ": amax bits %08x, want %08x", trial, dtn(dt), rows, cols, pitch, bits_of(got), want);
        CU(cudaFree(d));
        CU(cudaFree(d_amax));
        mat_free(&m);
    }
}

/* Per-tensor FP8 on the wire's kernels (schemes/wire_amax.c): a matrix cut into row parts held
 * by different senders. wsync_kernels_amax_many folds every part's amax into its set (two
 * matrices, and a set with no part: 0) = the CPU's amax of the whole; each part quantized with
 * the agreed amax (wsync_kquant_t.amax, through quantize_many) gives exactly the codes and the
 * one scale wsync_quantize_f32 gives for the whole matrix; then a NaN or Inf in one part shows in
 * its set's amax, wsync_kernels_find_nonfinite names it in that part (its row in the whole) and
 * finds nothing in another. */
static void test_amax_parts(void)
{
    for (int trial = 0; trial < 12; trial++) {
        wsync_dtype_t dt = float_types[trial % 3];
        wsync_dtype_t fp8 = trial % 2 ? WSYNC_DTYPE_F8E5M2 : WSYNC_DTYPE_F8E4M3FN;
        size_t esz = wsync_dtype_size(dt);
        uint64_t rows[2] = {range(3, 300), range(2, 90)}, cols[2] = {range(1, 700), range(1, 300)};
        mat_t m[2];
        uint8_t *d[2];
        wsync_kamax_t it[5];
        uint64_t r0[5];
        uint32_t n = 0;
        float *d_amax, got[3];
        for (int k = 0; k < 2; k++) {
            mat_make(&m[k], dt, rows[k], cols[k], cols[k], trial % 4 == 3 ? MAT_EXTREMES : 0);
            CU(cudaMalloc((void **)&d[k], rows[k] * cols[k] * esz));
            CU(cudaMemcpy(d[k], m[k].x, rows[k] * cols[k] * esz, cudaMemcpyHostToDevice));
            /* set k: 3 row parts of matrix 0, 2 of matrix 1 (one may be empty) */
            uint64_t nparts = k == 0 ? 3 : 2, at = 0;
            for (uint64_t j = 0; j < nparts; j++) {
                uint64_t len = j + 1 == nparts ? rows[k] - at : below(rows[k] - at + 1);
                it[n] = (wsync_kamax_t){d[k] + at * cols[k] * esz, dt, len, cols[k], cols[k],
                                        (uint32_t)k};
                r0[n++] = at;
                at += len;
            }
        }
        CU(cudaMalloc((void **)&d_amax, 3 * sizeof(float)));
        CU(cudaMemset(d_amax, 0x7b, 3 * sizeof(float)));
        CHECK_OK(wsync_kernels_amax_many(it, n, d_amax, 3, NULL));
        CU(cudaMemcpy(got, d_amax, sizeof(got), cudaMemcpyDeviceToHost));
        for (int k = 0; k < 2; k++) {
            uint32_t want = bits_of(wsync_amax_f32(m[k].f, rows[k] * cols[k]));
            CHECK_MSG(bits_of(got[k]) == want, "trial %d: %s set %d (%" PRIu64 "x%" PRIu64 "): "
                      "amax bits %08x, want %08x", trial, dtn(dt), k, rows[k], cols[k],
                      bits_of(got[k]), want);
        }
        CHECK_MSG(bits_of(got[2]) == 0, "trial %d: the set without parts: %08x", trial,
                  bits_of(got[2]));

        /* the parts of matrix 0 packed with the agreed amax: the whole's codes and scale */
        uint64_t e = rows[0] * cols[0];
        uint8_t *want = malloc(e), *have = malloc(e), *d_out, *d_ws;
        float want_s = 0, have_s[3], *d_s;
        wsync_quant_t q = {WSYNC_QUANT_TENSOR, 0, 0, 0.0f, 0, trial % 3 == 2, NULL,
                           WSYNC_MEM_CUDA};
        wsync_kquant_t qa[3];
        void *ws[3];
        CHECK_OK(wsync_quantize_f32("t", m[0].f, rows[0], cols[0], cols[0], &q, fp8, want,
                                    cols[0], &want_s));
        CU(cudaMalloc((void **)&d_out, e));
        CU(cudaMalloc((void **)&d_s, 3 * sizeof(float)));
        CU(cudaMalloc((void **)&d_ws, 3 * WSYNC_KQUANT_WS_BYTES));
        CU(cudaMemset(d_out, 0xA5, e));
        CU(cudaMemset(d_s, 0xA5, 3 * sizeof(float)));
        CU(cudaMemset(d_ws, 0, 3 * WSYNC_KQUANT_WS_BYTES));
        for (int j = 0; j < 3; j++) {
            qa[j] = (wsync_kquant_t){"t", it[j].x, dt, it[j].rows, cols[0], cols[0], q, fp8,
                                     d_out + r0[j] * cols[0], cols[0], d_s + j, r0[j], d_amax};
            ws[j] = d_ws + j * WSYNC_KQUANT_WS_BYTES;
        }
        CHECK_OK(wsync_kernels_quantize_many(qa, 3, ws, 0, NULL));
        for (int j = 0; j < 3; j++)
            CHECK_OK(wsync_kernels_quantize_finish(&qa[j], ws[j], NULL));
        CU(cudaMemcpy(have, d_out, e, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(have_s, d_s, sizeof(have_s), cudaMemcpyDeviceToHost));
        size_t k = first_diff(want, have, e);
        CHECK_MSG(k == e, "trial %d: %s -> %s %" PRIu64 "x%" PRIu64 " in 3 parts: code %zu is "
                  "0x%02x, the whole's 0x%02x", trial, dtn(dt), dtn(fp8), rows[0], cols[0], k,
                  k < e ? have[k] : 0, k < e ? want[k] : 0);
        for (int j = 0; j < 3; j++)
            CHECK_MSG(it[j].rows == 0 || bits_of(have_s[j]) == bits_of(want_s), "trial %d: part "
                      "%d's scale %08x, the whole's %08x", trial, j, bits_of(have_s[j]),
                      bits_of(want_s));

        /* a NaN or Inf in part 1 (rows permitting): its set's amax shows it, the search names it */
        if (it[1].rows > 0) {
            uint64_t r = below(it[1].rows), c = below(cols[0]);
            float bad = trial % 2 ? INFINITY : NAN;
            uint32_t u = dt == WSYNC_DTYPE_F32 ? bits_of(bad) : dt == WSYNC_DTYPE_BF16
                ? bits_of(bad) >> 16 : wsync_f32_to_f16(bad);
            char msg[128];
            CU(cudaMemcpy((uint8_t *)it[1].x + (r * cols[0] + c) * esz, &u, esz,
                          cudaMemcpyHostToDevice));
            CHECK_OK(wsync_kernels_amax_many(it, n, d_amax, 3, NULL));
            CU(cudaMemcpy(got, d_amax, sizeof(got), cudaMemcpyDeviceToHost));
            CHECK_MSG(bits_of(got[0]) >= 0x7f800000u, "trial %d: set 0's amax %08x with a %s",
                      trial, bits_of(got[0]), trial % 2 ? "Inf" : "NaN");
            CHECK_ST(wsync_kernels_find_nonfinite(&qa[1], ws[1], NULL, wsync_deadline_in(10000)),
                     WSYNC_ERR_NONFINITE);
            snprintf(msg, sizeof(msg), "t: %s at row %" PRIu64 ", column %" PRIu64,
                     trial % 2 ? "Inf" : "NaN", r0[1] + r, c);
            {   /* the status's words first ("non-finite value (NaN or Inf) in a source: "), then
                 * where */
                const char *e = wsync_last_error();
                size_t le = strlen(e), lm = strlen(msg);
                CHECK_MSG(le > lm && strcmp(e + le - lm, msg) == 0 && strstr(e, "non-finite") == e,
                          "trial %d: \"%s\", want \"non-finite ...: %s\"", trial, e, msg);
            }
            CHECK_OK(wsync_kernels_find_nonfinite(&qa[0], ws[0], NULL, wsync_deadline_in(10000)));
        }
        CU(cudaFree(d_out));
        CU(cudaFree(d_s));
        CU(cudaFree(d_ws));
        CU(cudaFree(d_amax));
        free(want);
        free(have);
        for (int j = 0; j < 2; j++) {
            CU(cudaFree(d[j]));
            mat_free(&m[j]);
        }
    }
    /* refused before anything is enqueued */
    wsync_kamax_t bad = {NULL, WSYNC_DTYPE_BF16, 2, 2, 2, 0};
    float *d_a;
    CU(cudaMalloc((void **)&d_a, sizeof(float)));
    CHECK_ST(wsync_kernels_amax_many(&bad, 1, d_a, 1, NULL), WSYNC_ERR_INVALID);
    bad.x = d_a;
    bad.set = 1;
    CHECK_ST(wsync_kernels_amax_many(&bad, 1, d_a, 1, NULL), WSYNC_ERR_INVALID);
    CHECK_MSG(strstr(wsync_last_error(), "set 1 of 1") != NULL, "\"%s\"", wsync_last_error());
    CU(cudaFree(d_a));
}

typedef struct {
    const char *label;
    wsync_quant_scheme_t scheme;
    int br, bc, ue8m0;
} qscheme_t;

static const char *qname(const wsync_quant_t *q)
{
    static char buf[64];
    switch (q->scheme) {
    case WSYNC_QUANT_TENSOR: return "tensor";
    case WSYNC_QUANT_CHANNEL: return "channel";
    default:
        snprintf(buf, sizeof(buf), "block %dx%d%s eps %g", q->block_rows ? q->block_rows : 128,
                 q->block_cols ? q->block_cols : 128, q->ue8m0 ? " ue8m0" : "", (double)q->eps);
        return buf;
    }
}

/* One quantization on the GPU against wsync_quantize_f32; returns 1 when equal. */
static int quant_case(const mat_t *m, const wsync_quant_t *q, wsync_dtype_t fp8, int x_shift,
                      uint64_t out_pitch, int use_two_phase)
{
    int64_t nbr = 0, nbc = 0;
    size_t esz = wsync_dtype_size(m->dt);
    int ok = 1;

    CHECK_OK(wsync_quant_scales_shape(q, (int64_t)m->rows, (int64_t)m->cols, &nbr, &nbc));
    size_t nsc = (size_t)(nbr * nbc), ob = m->rows * out_pitch, xb = m->rows * m->pitch * esz;
    uint8_t *ref = malloc(ob + 1), *got = malloc(ob + 1);
    float *rs = malloc(nsc * 4 + 4), *gs = malloc(nsc * 4 + 4);
    uint8_t poison = (uint8_t)(rnd() | 1);
    memset(ref, poison, ob);
    memset(rs, poison, nsc * 4);
    wsync_status_t want = wsync_quantize_f32("t", m->f, m->rows, m->cols, m->pitch, q, fp8, ref,
                                             out_pitch, rs);
    CHECK_OK(want);

    uint8_t *dx, *dout;
    float *dsc;
    void *ws;
    CU(cudaMalloc((void **)&dx, xb + 16));
    CU(cudaMalloc((void **)&dout, ob + 16));
    CU(cudaMalloc((void **)&dsc, nsc * 4 + 4));
    CU(cudaMalloc(&ws, WSYNC_KQUANT_WS_BYTES));
    CU(cudaMemcpy(dx + x_shift, m->x, xb, cudaMemcpyHostToDevice));
    memset(got, poison, ob);
    memset(gs, poison, nsc * 4);
    CU(cudaMemcpy(dout, got, ob, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dsc, gs, nsc * 4, cudaMemcpyHostToDevice));

    wsync_kquant_t a = {"t", dx + x_shift, m->dt, m->rows, m->cols, m->pitch, *q, fp8, dout,
                        out_pitch, dsc, 0, NULL};
    if (use_two_phase) {
        CHECK_OK(wsync_kernels_quantize_launch(&a, ws, NULL));
        CHECK_OK(wsync_kernels_quantize_finish(&a, ws, NULL));
    } else {
        CHECK_OK(wsync_kernels_quantize(&a, NULL, NULL));
    }
    CU(cudaMemcpy(got, dout, ob, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gs, dsc, nsc * 4, cudaMemcpyDeviceToHost));
    size_t at = first_diff(ref, got, ob);
    if (at != ob) {
        uint64_t r = at / out_pitch, c = at % out_pitch;
        float xv = c < m->cols ? m->f[r * m->pitch + c] : 0.0f;
        CHECK_MSG(0, "%s %s %s%s %" PRIu64 "x%" PRIu64 " pitch %" PRIu64 "/%" PRIu64 ": byte (%" PRIu64
                  ", %" PRIu64 ") %02x, want %02x (x = %a)", dtn(m->dt), dtn(fp8), qname(q),
                  q->no_saturate ? " nosat" : "", m->rows, m->cols, m->pitch, out_pitch, r, c,
                  got[at], ref[at], (double)xv);
        ok = 0;
    }
    at = first_diff((const uint8_t *)rs, (const uint8_t *)gs, nsc * 4);
    if (at != nsc * 4) {
        CHECK_MSG(0, "%s %s %s %" PRIu64 "x%" PRIu64 ": scale %zu is %a, want %a", dtn(m->dt),
                  dtn(fp8), qname(q), m->rows, m->cols, at / 4, (double)gs[at / 4],
                  (double)rs[at / 4]);
        ok = 0;
    }
    CU(cudaFree(dx));
    CU(cudaFree(dout));
    CU(cudaFree(dsc));
    CU(cudaFree(ws));
    free(ref);
    free(got);
    free(rs);
    free(gs);
    return ok;
}

static void test_quant_random(void)
{
    static const qscheme_t schemes[] = {
        {"tensor", WSYNC_QUANT_TENSOR, 0, 0, 0},       {"channel", WSYNC_QUANT_CHANNEL, 0, 0, 0},
        {"block128", WSYNC_QUANT_BLOCK, 0, 0, 0},       {"block128-ue8m0", WSYNC_QUANT_BLOCK, 128, 128, 1},
        {"block1x128", WSYNC_QUANT_BLOCK, 1, 128, 0},  {"block-random", WSYNC_QUANT_BLOCK, -1, -1, 0},
        {"block-random-ue8m0", WSYNC_QUANT_BLOCK, -1, -1, 1},
    };
    int total = 0, passed = 0;
    for (size_t si = 0; si < sizeof(schemes) / sizeof(schemes[0]); si++) {
        for (int fmt = 0; fmt < 2; fmt++) {
            for (int sat = 0; sat < 2; sat++) {
                for (int xi = 0; xi < 3; xi++) {
                    for (int rep = 0; rep < 2; rep++) {
                        const qscheme_t *s = &schemes[si];
                        wsync_quant_t q = {0};
                        q.scheme = s->scheme;
                        q.block_rows = s->br < 0 ? (int)range(1, 200) : s->br;
                        q.block_cols = s->bc < 0 ? (int)range(1, 200) : s->bc;
                        q.ue8m0 = s->ue8m0;
                        q.no_saturate = !sat;
                        if (s->scheme == WSYNC_QUANT_BLOCK && below(3) == 0)
                            q.eps = below(2) ? 1e-3f : 1e-30f;
                        uint64_t rows, cols;
                        switch (below(5)) {
                        case 0: rows = range(1, 4); cols = range(1, 300); break;
                        case 1: rows = 128 * range(1, 3); cols = 128 * range(1, 4); break;
                        case 2: rows = range(100, 600); cols = range(100, 1100); break;
                        case 3: rows = range(1, 2000); cols = range(1, 24); break;
                        default: rows = range(1, 300); cols = range(1000, 20000); break;
                        }
                        int aligned = below(3) != 0;
                        if (aligned && below(2))   /* whole 16-byte chunks: cells in registers */
                            cols = (cols + 7) / 8 * 8;
                        uint64_t pitch = aligned ? (cols + 15) / 16 * 16 : cols + below(3);
                        uint64_t op = aligned ? (cols + 15) / 16 * 16 : cols + below(3);
                        int shift = aligned ? 0 : (int)(below(2) * wsync_dtype_size(float_types[xi]));
                        mat_t m;
                        mat_make(&m, float_types[xi], rows, cols, pitch,
                                 MAT_ZERO_ROWS | MAT_EXTREMES);
                        total++;
                        passed += quant_case(&m, &q, fmt ? WSYNC_DTYPE_F8E5M2 : WSYNC_DTYPE_F8E4M3FN,
                                             shift, op, rep);
                        mat_free(&m);
                    }
                }
            }
        }
    }
    fprintf(stderr, "   %d of %d random quantizations equal to the CPU's\n", passed, total);
}

/* wsync_kernels_quantize_many: 3 rounds of 1 .. 40 quantizations in one call (so more than the
 * 12 of one launch, and several input dtypes at once), random schemes and shapes (whole-chunk
 * rows for the register kernel, and others that go one by one, per-tensor among them), each
 * against wsync_quantize_f32 with its outputs poisoned; workspaces zeroed once, as the caller
 * keeps them. */
static void test_quant_many(void)
{
    for (int round = 0; round < 3; round++) {
        uint32_t n = round == 0 ? 1 : (uint32_t)range(13, 40);
        mat_t *m = calloc(n, sizeof(*m));
        wsync_kquant_t *a = calloc(n, sizeof(*a));
        void **ws = calloc(n, sizeof(*ws));
        uint8_t **ref = calloc(n, sizeof(*ref)), **dout = calloc(n, sizeof(*dout));
        float **rs = calloc(n, sizeof(*rs)), **dsc = calloc(n, sizeof(*dsc));
        size_t *ob = calloc(n, sizeof(*ob)), *nsc = calloc(n, sizeof(*nsc));
        uint8_t *dws;
        int bad = 0;
        CU(cudaMalloc((void **)&dws, n * WSYNC_KQUANT_WS_BYTES));
        CU(cudaMemset(dws, 0, n * WSYNC_KQUANT_WS_BYTES));
        for (uint32_t i = 0; i < n; i++) {
            wsync_quant_t q = {0};
            int kind = (int)below(8);
            q.scheme = kind == 0 ? WSYNC_QUANT_TENSOR : kind < 3 ? WSYNC_QUANT_CHANNEL : WSYNC_QUANT_BLOCK;
            q.block_rows = kind == 7 ? (int)range(1, 200) : 0;
            q.block_cols = kind == 7 ? (int)range(1, 200) : 0;
            q.no_saturate = (int)below(2);
            uint64_t rows = range(1, 700), cols = below(4) ? 128 * range(1, 6) : range(1, 600);
            wsync_dtype_t dt = float_types[below(3)];
            mat_make(&m[i], dt, rows, cols, cols, MAT_ZERO_ROWS);
            int64_t nbr = 0, nbc = 0;
            CHECK_OK(wsync_quant_scales_shape(&q, (int64_t)rows, (int64_t)cols, &nbr, &nbc));
            nsc[i] = (size_t)(nbr * nbc);
            ob[i] = rows * cols;
            ref[i] = malloc(ob[i]);
            rs[i] = malloc(nsc[i] * 4 + 4);
            wsync_dtype_t fp8 = below(2) ? WSYNC_DTYPE_F8E4M3FN : WSYNC_DTYPE_F8E5M2;
            CHECK_OK(wsync_quantize_f32("t", m[i].f, rows, cols, cols, &q, fp8, ref[i], cols, rs[i]));
            uint8_t *dx;
            CU(cudaMalloc((void **)&dx, rows * cols * wsync_dtype_size(dt)));
            CU(cudaMemcpy(dx, m[i].x, rows * cols * wsync_dtype_size(dt), cudaMemcpyHostToDevice));
            CU(cudaMalloc((void **)&dout[i], ob[i]));
            CU(cudaMalloc((void **)&dsc[i], nsc[i] * 4 + 4));
            CU(cudaMemset(dout[i], 0xA5, ob[i]));
            CU(cudaMemset(dsc[i], 0xA5, nsc[i] * 4));
            a[i] = (wsync_kquant_t){"t", dx, dt, rows, cols, cols, q, fp8, dout[i], cols, dsc[i], 0, NULL};
            ws[i] = dws + i * WSYNC_KQUANT_WS_BYTES;
        }
        CHECK_OK(wsync_kernels_quantize_many(a, n, ws, round == 2 ? 7 : 0, NULL));
        CU(cudaDeviceSynchronize());
        for (uint32_t i = 0; i < n; i++) {
            uint8_t *got = malloc(ob[i]);
            float *gs = malloc(nsc[i] * 4 + 4);
            CU(cudaMemcpy(got, dout[i], ob[i], cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(gs, dsc[i], nsc[i] * 4, cudaMemcpyDeviceToHost));
            if (memcmp(got, ref[i], ob[i]) != 0 || memcmp(gs, rs[i], nsc[i] * 4) != 0) {
                if (bad++ < 4)
                    fprintf(stderr, "   round %d, quantization %u of %u (%s, %s %" PRIu64 "x%" PRIu64
                            "): %s differ\n", round, i, n, qname(&a[i].quant), dtn(a[i].x_dtype),
                            a[i].rows, a[i].cols,
                            memcmp(got, ref[i], ob[i]) != 0 ? "codes" : "scales");
            }
            free(got);
            free(gs);
        }
        CHECK_MSG(bad == 0, "round %d: %d of %u quantizations differ from the CPU's", round, bad, n);
        /* every flag still clear: nothing non-finite went in */
        uint32_t *flags = malloc(n * WSYNC_KQUANT_WS_BYTES);
        CU(cudaMemcpy(flags, dws, n * WSYNC_KQUANT_WS_BYTES, cudaMemcpyDeviceToHost));
        for (uint32_t i = 0; i < n; i++)
            CHECK_MSG(flags[i * (WSYNC_KQUANT_WS_BYTES / 4) + 1] == 0,
                      "round %d: quantization %u flagged non-finite input", round, i);
        free(flags);
        for (uint32_t i = 0; i < n; i++) {
            CU(cudaFree((void *)a[i].x));
            CU(cudaFree(dout[i]));
            CU(cudaFree(dsc[i]));
            free(ref[i]);
            free(rs[i]);
            mat_free(&m[i]);
        }
        CU(cudaFree(dws));
        free(m);
        free(a);
        free(ws);
        free(ref);
        free(dout);
        free(rs);
        free(dsc);
        free(ob);
        free(nsc);
    }
}

/* Edge shapes: single elements, exact blocks, one more than a block, empty dims. */
static void test_quant_edges(void)
{
    static const uint64_t shapes[][2] = {{1, 1}, {1, 127}, {127, 1}, {128, 128}, {129, 129},
                                         {255, 257}, {256, 384}, {1, 20000}, {5000, 3},
                                         {3, 16384}, {2, 16400}, {130, 1}};
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        for (int sch = 1; sch <= 3; sch++) {
            wsync_quant_t q = {0};
            q.scheme = (wsync_quant_scheme_t)sch;
            mat_t m;
            mat_make(&m, WSYNC_DTYPE_F32, shapes[i][0], shapes[i][1], shapes[i][1], 0);
            quant_case(&m, &q, WSYNC_DTYPE_F8E4M3FN, 0, shapes[i][1], 1);
            mat_free(&m);
        }
    }
    /* large aligned cells, edge cells included: every size of group that holds a cell in
     * registers (up to 8192 chunks of 16 bytes: rows of 32768 f32), one beyond (read twice) */
    static const struct {
        wsync_quant_scheme_t scheme;
        uint64_t rows, cols;
    } big[] = {{WSYNC_QUANT_CHANNEL, 3000, 2048}, {WSYNC_QUANT_BLOCK, 1100, 2312},
               {WSYNC_QUANT_CHANNEL, 700, 6000}, {WSYNC_QUANT_TENSOR, 700, 2312},
               {WSYNC_QUANT_CHANNEL, 40, 32768}, {WSYNC_QUANT_CHANNEL, 9, 40000},
               {WSYNC_QUANT_CHANNEL, 5000, 64}, {WSYNC_QUANT_CHANNEL, 2000, 256}};
    for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++) {
        for (int xi = 0; xi < 3; xi++) {
            wsync_quant_t q = {0};
            q.scheme = big[i].scheme;
            q.ue8m0 = big[i].scheme == WSYNC_QUANT_BLOCK && xi == 1;
            mat_t m;
            mat_make(&m, float_types[xi], big[i].rows, big[i].cols, big[i].cols,
                     MAT_ZERO_ROWS | MAT_EXTREMES);
            quant_case(&m, &q, xi == 2 ? WSYNC_DTYPE_F8E5M2 : WSYNC_DTYPE_F8E4M3FN, 0, big[i].cols,
                       xi != 1);
            mat_free(&m);
        }
    }
    /* empty matrices still write the scales the CPU writes (1 for each cell) */
    for (int sch = 1; sch <= 3; sch++) {
        wsync_quant_t q = {0};
        q.scheme = (wsync_quant_scheme_t)sch;
        mat_t m;
        mat_make(&m, WSYNC_DTYPE_F32, sch == 2 ? 3 : 0, 0, 0, 0);
        quant_case(&m, &q, WSYNC_DTYPE_F8E4M3FN, 0, 0, 1);
        mat_free(&m);
    }
}

/* NaN / Inf: the same status and message as the CPU quantizer; the per-tensor path writes
 * nothing. Bad arguments: WSYNC_ERR_INVALID. */
static void test_quant_errors(void)
{
    static const struct {
        wsync_quant_scheme_t scheme;
        wsync_dtype_t dt;
        float bad;
    } cases_[] = {{WSYNC_QUANT_BLOCK, WSYNC_DTYPE_F32, NAN},
                  {WSYNC_QUANT_TENSOR, WSYNC_DTYPE_BF16, -INFINITY},
                  {WSYNC_QUANT_CHANNEL, WSYNC_DTYPE_F16, INFINITY},
                  {WSYNC_QUANT_TENSOR, WSYNC_DTYPE_F32, NAN}};
    for (size_t i = 0; i < sizeof(cases_) / sizeof(cases_[0]); i++) {
        mat_t m;
        uint64_t rows = 300, cols = 520;
        mat_make(&m, cases_[i].dt, rows, cols, cols, 0);
        size_t esz = wsync_dtype_size(m.dt);
        /* two bad elements: the first in row-major order is named */
        for (int k = 0; k < 2; k++) {
            uint64_t r = k == 0 ? 200 : 17, c = k == 0 ? 3 : 400;
            float bad = k == 0 ? NAN : cases_[i].bad;
            uint32_t u = m.dt == WSYNC_DTYPE_F32 ? bits_of(bad) : m.dt == WSYNC_DTYPE_BF16
                ? bits_of(bad) >> 16 : wsync_f32_to_f16(bad);
            memcpy(m.x + (r * cols + c) * esz, &u, esz);
            m.f[r * cols + c] = bad;
        }
        wsync_quant_t q = {0};
        q.scheme = cases_[i].scheme;
        int64_t nbr, nbc;
        CHECK_OK(wsync_quant_scales_shape(&q, (int64_t)rows, (int64_t)cols, &nbr, &nbc));
        size_t nsc = (size_t)(nbr * nbc);
        uint8_t *out = malloc(rows * cols);
        float *sc = malloc(nsc * 4);
        char want[512];
        CHECK_ST(wsync_quantize_f32("model.layers.0.mlp.down_proj.weight", m.f, rows, cols, cols,
                                    &q, WSYNC_DTYPE_F8E4M3FN, out, cols, sc),
                 WSYNC_ERR_NONFINITE);
        snprintf(want, sizeof(want), "%s", wsync_last_error());

        uint8_t *dx, *dout;
        float *dsc;
        CU(cudaMalloc((void **)&dx, rows * cols * esz));
        CU(cudaMalloc((void **)&dout, rows * cols));
        CU(cudaMalloc((void **)&dsc, nsc * 4));
        CU(cudaMemcpy(dx, m.x, rows * cols * esz, cudaMemcpyHostToDevice));
        CU(cudaMemset(dout, 0x33, rows * cols));
        CU(cudaMemset(dsc, 0x33, nsc * 4));
        wsync_kquant_t a = {"model.layers.0.mlp.down_proj.weight", dx, m.dt, rows, cols, cols, q,
                            WSYNC_DTYPE_F8E4M3FN, dout, cols, dsc, 0, NULL};
        CHECK_ST(wsync_kernels_quantize(&a, NULL, NULL), WSYNC_ERR_NONFINITE);
        CHECK_MSG(strcmp(wsync_last_error(), want) == 0, "message \"%s\", CPU's \"%s\"",
                  wsync_last_error(), want);
        if (q.scheme != WSYNC_QUANT_TENSOR) {
            /* a slice from row 128 (whole scale cells), as a receiver quantizing one run of a
             * target sees it: the element is named in the whole matrix's rows */
            wsync_kquant_t sl = a;
            sl.x = dx + 128 * cols * esz;
            sl.rows = rows - 128;
            sl.out = dout + 128 * cols;
            sl.scales = dsc + (q.scheme == WSYNC_QUANT_BLOCK ? nbc : 128);
            sl.row_base = 128;
            CHECK_ST(wsync_kernels_quantize(&sl, NULL, NULL), WSYNC_ERR_NONFINITE);
            CHECK_MSG(strstr(wsync_last_error(), ": NaN at row 200, column 3") != NULL,
                      "slice from row 128: message \"%s\"", wsync_last_error());
        }
        if (q.scheme == WSYNC_QUANT_TENSOR) {
            CU(cudaMemcpy(out, dout, rows * cols, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(sc, dsc, 4, cudaMemcpyDeviceToHost));
            CHECK(out[0] == 0x33 && out[rows * cols - 1] == 0x33 && bits_of(sc[0]) == 0x33333333u);
        }
        CU(cudaFree(dx));
        CU(cudaFree(dout));
        CU(cudaFree(dsc));
        free(out);
        free(sc);
        mat_free(&m);
    }

    /* invalid arguments, as wsync_quantize_f32 refuses them */
    float dummy[4] = {0};
    uint8_t dout[4] = {0};
    wsync_quant_t q = {0};
    q.scheme = WSYNC_QUANT_TENSOR;
    q.ue8m0 = 1;
    wsync_kquant_t a = {"t", dummy, WSYNC_DTYPE_F32, 2, 2, 2, q, WSYNC_DTYPE_F8E4M3FN, dout, 2, dummy, 0, NULL};
    void *ws;
    CU(cudaMalloc(&ws, WSYNC_KQUANT_WS_BYTES));
    CHECK_ST(wsync_kernels_quantize_launch(&a, ws, NULL), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("ue8m0");
    a.quant.ue8m0 = 0;
    a.fp8_dtype = WSYNC_DTYPE_BF16;
    CHECK_ST(wsync_kernels_quantize_launch(&a, ws, NULL), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("not FP8");
    a.fp8_dtype = WSYNC_DTYPE_F8E5M2;
    a.out_pitch = 1;
    CHECK_ST(wsync_kernels_quantize_launch(&a, ws, NULL), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("below cols");
    a.out_pitch = 2;
    a.quant.scheme = WSYNC_QUANT_NONE;
    CHECK_ST(wsync_kernels_quantize_launch(&a, ws, NULL), WSYNC_ERR_INVALID);
    a.quant.scheme = WSYNC_QUANT_BLOCK;
    a.quant.block_rows = -1;
    CHECK_ST(wsync_kernels_quantize_launch(&a, ws, NULL), WSYNC_ERR_INVALID);
    a.quant.block_rows = 0;
    a.x_dtype = WSYNC_DTYPE_U8;
    CHECK_ST(wsync_kernels_quantize_launch(&a, ws, NULL), WSYNC_ERR_INVALID);
    a.x_dtype = WSYNC_DTYPE_F32;
    CHECK_ST(wsync_kernels_quantize_launch(&a, NULL, NULL), WSYNC_ERR_INVALID);
    a.scales = NULL;
    CHECK_ST(wsync_kernels_quantize_launch(&a, ws, NULL), WSYNC_ERR_INVALID);
    CU(cudaFree(ws));
    CU(cudaDeviceSynchronize());
}

/* ------------------------------------------------------------------------------------------ */
/* Bandwidth                                                                                    */
/* ------------------------------------------------------------------------------------------ */

typedef void (*launch_fn)(void *ctx);

#define BENCH_ITERS 20

/* Median seconds of one launch. */
static double time_it(launch_fn fn, void *ctx)
{
    cudaEvent_t ev[BENCH_ITERS + 1];
    float ms[BENCH_ITERS];
    for (int i = 0; i < 3; i++)
        fn(ctx);
    for (int i = 0; i <= BENCH_ITERS; i++)
        CU(cudaEventCreate(&ev[i]));
    CU(cudaEventRecord(ev[0], NULL));
    for (int i = 0; i < BENCH_ITERS; i++) {
        fn(ctx);
        CU(cudaEventRecord(ev[i + 1], NULL));
    }
    CU(cudaEventSynchronize(ev[BENCH_ITERS]));
    for (int i = 0; i < BENCH_ITERS; i++)
        CU(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]));
    for (int i = 0; i <= BENCH_ITERS; i++)
        CU(cudaEventDestroy(ev[i]));
    return cu_median_seconds(ms, BENCH_ITERS);
}

static struct {
    void *a, *b;
    size_t bytes;
} d2d;

static void d2d_launch(void *ctx)
{
    (void)ctx;
    CU(cudaMemcpyAsync(d2d.b, d2d.a, d2d.bytes, cudaMemcpyDeviceToDevice, NULL));
}

/* Record a kernel: bytes read + written as it runs, and the same bytes by cudaMemcpy D2D. */
static void bench_add(const char *name, double bytes, double useful, launch_fn fn, void *ctx)
{
    if (nbench >= MAX_BENCH)
        return;
    bench_row_t *r = &bench[nbench++];
    snprintf(r->name, sizeof(r->name), "%s", name);
    r->bytes = bytes;
    r->useful = useful;
    r->t_kernel = time_it(fn, ctx);
    d2d.bytes = (size_t)(bytes / 2) / 256 * 256;
    r->t_d2d = time_it(d2d_launch, NULL) * (bytes / 2) / (double)d2d.bytes;
    fprintf(stderr, "   %-34s %8.1f us  %7.0f GB/s  d2d %7.0f GB/s  %5.1f%%\n", name,
            r->t_kernel * 1e6, bytes / r->t_kernel / 1e9, bytes / r->t_d2d / 1e9,
            100.0 * r->t_d2d / r->t_kernel);
}

static void batch_launch(void *ctx)
{
    wsync_status_t st = wsync_kernels_batch_launch((wsync_kcopy_batch_t *)ctx, NULL);
    if (st != WSYNC_OK) {
        fprintf(stderr, "batch launch: %s\n", wsync_last_error());
        exit(2);
    }
}

typedef struct {
    wsync_kquant_t a;
    void *ws;
} qctx_t;

static void quant_launch(void *ctx)
{
    qctx_t *c = ctx;
    if (wsync_kernels_quantize_launch(&c->a, c->ws, NULL) != WSYNC_OK) {
        fprintf(stderr, "quantize launch: %s\n", wsync_last_error());
        exit(2);
    }
}

typedef struct {
    const void *x;
    wsync_dtype_t dt;
    uint64_t rows, cols;
    float *out;
} actx_t;

static void amax_launch(void *ctx)
{
    actx_t *c = ctx;
    if (wsync_kernels_amax(c->x, c->dt, c->rows, c->cols, c->cols, c->out, NULL) != WSYNC_OK) {
        fprintf(stderr, "amax launch: %s\n", wsync_last_error());
        exit(2);
    }
}

static void run_bench(void)
{
    const uint64_t R = 8192, C = 8192, N = R * C;   /* 64 Mi elements: 256 MiB of f32 */
    mat_t m;
    uint8_t *d_f32, *d_bf16, *d_out, *d_wide;
    float *d_sc, *d_amax;
    void *ws;

    fprintf(stderr, "-- bandwidth (%" PRIu64 " x %" PRIu64 ", medians of %d)\n", R, C, BENCH_ITERS);
    mat_make(&m, WSYNC_DTYPE_F32, R, C, C, 0);
    uint16_t *hb = malloc(N * 2);
    float *fb = malloc(N * 4);             /* the f32 image of the bf16 input */
    for (uint64_t i = 0; i < N; i++) {
        hb[i] = wsync_f32_to_bf16(m.f[i]);
        fb[i] = wsync_bf16_to_f32(hb[i]);
    }
    CU(cudaMalloc((void **)&d_f32, N * 4));
    CU(cudaMalloc((void **)&d_bf16, N * 2));
    CU(cudaMalloc((void **)&d_out, N));
    CU(cudaMalloc((void **)&d_wide, N * 4));
    CU(cudaMalloc((void **)&d_sc, R * 4 * 2));
    CU(cudaMalloc((void **)&d_amax, 4));
    CU(cudaMalloc(&ws, WSYNC_KQUANT_WS_BYTES));
    CU(cudaMalloc(&d2d.a, N * 5));
    CU(cudaMalloc(&d2d.b, N * 5));
    CU(cudaMemset(d2d.a, 1, N * 5));
    CU(cudaMemcpy(d_f32, m.f, N * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_bf16, hb, N * 2, cudaMemcpyHostToDevice));

    /* pack: 8 column slices [8192, 1024] of a [8192, 8192] bf16 shard (row-parallel, TP 8) into a
     * dense bucket; unpack with a cast: the dense bf16 bucket into an f32 target; a cast back */
    {
        wsync_kcopy_t cd[8];
        for (int i = 0; i < 8; i++)
            cd[i] = (wsync_kcopy_t){d_bf16, d_wide, (uint64_t)i * 1024, C, (uint64_t)i * R * 1024,
                                    1024, R, 1024, WSYNC_DTYPE_BF16, WSYNC_DTYPE_BF16};
        wsync_kcopy_batch_t *b;
        CHECK_OK(wsync_kernels_batch_create(cd, 8, &b));
        bench_add("pack bf16 (8 strided slices)", N * 4.0, N * 4.0, batch_launch, b);
        wsync_kernels_batch_free(b);
        /* a dense copy with the grid a colocated receiver gives it alone on its GPU
         * (schemes/ipc_cuda_rx.c: 2 blocks per SM), and uncapped */
        int sms = 0;
        CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
        wsync_kcopy_t dc = {d_bf16, d_wide, 0, C, 0, C, R, C, WSYNC_DTYPE_BF16, WSYNC_DTYPE_BF16};
        CHECK_OK(wsync_kernels_batch_create(&dc, 1, &b));
        wsync_kernels_batch_limit(b, (uint32_t)(2 * sms));
        bench_add("copy bf16 dense, 2 blocks/SM", N * 4.0, N * 4.0, batch_launch, b);
        wsync_kernels_batch_limit(b, 0);
        bench_add("copy bf16 dense, uncapped", N * 4.0, N * 4.0, batch_launch, b);
        wsync_kernels_batch_free(b);
        wsync_kcopy_t up = {d_bf16, d_wide, 0, C, 0, C, R, C, WSYNC_DTYPE_BF16, WSYNC_DTYPE_F32};
        CHECK_OK(wsync_kernels_batch_create(&up, 1, &b));
        bench_add("unpack bf16 -> f32", N * 6.0, N * 6.0, batch_launch, b);
        wsync_kernels_batch_free(b);
        wsync_kcopy_t dn = {d_f32, d_wide, 0, C, 0, C, R, C, WSYNC_DTYPE_F32, WSYNC_DTYPE_BF16};
        CHECK_OK(wsync_kernels_batch_create(&dn, 1, &b));
        bench_add("cast f32 -> bf16", N * 6.0, N * 6.0, batch_launch, b);
        wsync_kernels_batch_free(b);
    }
    {
        actx_t c = {d_f32, WSYNC_DTYPE_F32, R, C, d_amax};
        bench_add("amax f32", N * 4.0, N * 4.0, amax_launch, &c);
        actx_t c2 = {d_bf16, WSYNC_DTYPE_BF16, R, C, d_amax};
        bench_add("amax bf16", N * 2.0, N * 2.0, amax_launch, &c2);
    }
    static const struct {
        const char *name;
        wsync_quant_scheme_t scheme;
        int ue8m0, nosat, bf16;
        wsync_dtype_t fp8;
    } qs[] = {
        {"quant tensor f32 -> e4m3", WSYNC_QUANT_TENSOR, 0, 0, 0, WSYNC_DTYPE_F8E4M3FN},
        {"quant channel f32 -> e4m3", WSYNC_QUANT_CHANNEL, 0, 0, 0, WSYNC_DTYPE_F8E4M3FN},
        {"quant block128 f32 -> e4m3", WSYNC_QUANT_BLOCK, 0, 0, 0, WSYNC_DTYPE_F8E4M3FN},
        {"quant block128 ue8m0 f32 -> e4m3", WSYNC_QUANT_BLOCK, 1, 0, 0, WSYNC_DTYPE_F8E4M3FN},
        {"quant block128 f32 -> e5m2 nosat", WSYNC_QUANT_BLOCK, 0, 1, 0, WSYNC_DTYPE_F8E5M2},
        {"quant tensor bf16 -> e4m3", WSYNC_QUANT_TENSOR, 0, 0, 1, WSYNC_DTYPE_F8E4M3FN},
        {"quant channel bf16 -> e4m3", WSYNC_QUANT_CHANNEL, 0, 0, 1, WSYNC_DTYPE_F8E4M3FN},
        {"quant block128 bf16 -> e4m3", WSYNC_QUANT_BLOCK, 0, 0, 1, WSYNC_DTYPE_F8E4M3FN},
        {"quant channel bf16 -> e5m2 nosat", WSYNC_QUANT_CHANNEL, 0, 1, 1, WSYNC_DTYPE_F8E5M2},
        {"quant block128 bf16 -> e4m3 nosat", WSYNC_QUANT_BLOCK, 0, 1, 1, WSYNC_DTYPE_F8E4M3FN},
    };
    for (size_t i = 0; i < sizeof(qs) / sizeof(qs[0]); i++) {
        qctx_t c;
        memset(&c, 0, sizeof(c));
        c.a.name = qs[i].name;
        c.a.x = qs[i].bf16 ? (const void *)d_bf16 : (const void *)d_f32;
        c.a.x_dtype = qs[i].bf16 ? WSYNC_DTYPE_BF16 : WSYNC_DTYPE_F32;
        c.a.rows = R;
        c.a.cols = C;
        c.a.x_pitch = C;
        c.a.quant.scheme = qs[i].scheme;
        c.a.quant.ue8m0 = qs[i].ue8m0;
        c.a.quant.no_saturate = qs[i].nosat;
        c.a.fp8_dtype = qs[i].fp8;
        c.a.out = d_out;
        c.a.out_pitch = C;
        c.a.scales = d_sc;
        c.ws = ws;
        double in = N * (qs[i].bf16 ? 2.0 : 4.0), scb = qs[i].scheme == WSYNC_QUANT_CHANNEL ? R * 4.0
                   : qs[i].scheme == WSYNC_QUANT_BLOCK ? 4096 * 4.0 : 4.0;
        double moved = in + N + scb + (qs[i].scheme == WSYNC_QUANT_TENSOR ? in : 0.0);
        bench_add(qs[i].name, moved, in + N + scb, quant_launch, &c);
        CHECK_OK(wsync_kernels_quantize_finish(&c.a, ws, NULL));
        /* and the big run is checked against the CPU */
        {
            int64_t nbr, nbc;
            CHECK_OK(wsync_quant_scales_shape(&c.a.quant, R, C, &nbr, &nbc));
            uint8_t *ref = malloc(N), *got = malloc(N);
            float *rs = malloc((size_t)(nbr * nbc) * 4), *gs = malloc((size_t)(nbr * nbc) * 4);
            CHECK_OK(wsync_quantize_f32("big", qs[i].bf16 ? fb : m.f, R, C, C, &c.a.quant,
                                        c.a.fp8_dtype, ref, C, rs));
            CU(cudaMemcpy(got, d_out, N, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(gs, d_sc, (size_t)(nbr * nbc) * 4, cudaMemcpyDeviceToHost));
            CHECK_MSG(memcmp(ref, got, N) == 0 && memcmp(rs, gs, (size_t)(nbr * nbc) * 4) == 0,
                      "%s: the 8192 x 8192 result differs from the CPU's", qs[i].name);
            free(ref);
            free(got);
            free(rs);
            free(gs);
        }
    }
    CU(cudaFree(d_f32));
    CU(cudaFree(d_bf16));
    CU(cudaFree(d_out));
    CU(cudaFree(d_wide));
    CU(cudaFree(d_sc));
    CU(cudaFree(d_amax));
    CU(cudaFree(ws));
    CU(cudaFree(d2d.a));
    CU(cudaFree(d2d.b));
    free(hb);
    free(fb);
    mat_free(&m);
}

/* ------------------------------------------------------------------------------------------ */

static void write_json(const char *path, const char *device, uint64_t seed)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        perror(path);
        return;
    }
    fprintf(f, "{\n  \"device\": \"%s\",\n  \"seed\": %" PRIu64 ",\n  \"tests\": [\n", device, seed);
    for (int i = 0; i < ncases; i++)
        fprintf(f, "    {\"name\": \"%s\", \"ok\": %s, \"failed_checks\": %d}%s\n", cases[i].name,
                cases[i].failures ? "false" : "true", cases[i].failures, i + 1 < ncases ? "," : "");
    fprintf(f, "  ],\n  \"bench\": [\n");
    for (int i = 0; i < nbench; i++) {
        const bench_row_t *r = &bench[i];
        fprintf(f, "    {\"kernel\": \"%s\", \"bytes_rw\": %.0f, \"useful_bytes\": %.0f, "
                "\"kernel_us\": %.2f, \"d2d_us\": %.2f, \"kernel_gbps\": %.1f, \"d2d_gbps\": %.1f, "
                "\"fraction_of_d2d\": %.3f, \"useful_fraction_of_d2d\": %.3f}%s\n",
                r->name, r->bytes, r->useful, r->t_kernel * 1e6, r->t_d2d * 1e6,
                r->bytes / r->t_kernel / 1e9, r->bytes / r->t_d2d / 1e9, r->t_d2d / r->t_kernel,
                r->useful / r->t_kernel / (r->bytes / r->t_d2d), i + 1 < nbench ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    fclose(f);
}


/* ------------------------------------------------------------------------------------------ */
/* Where shared memory lives                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* wsync_cuda_import_on_device: memory exported from GPU e and opened for GPU i is on the
 * importing GPU exactly when e == i (the ipc receiver's peer-read caps depend on it, and
 * cudaPointerGetAttributes reports every opened pointer on the importing GPU). Every pair of the
 * first two GPUs; one GPU: the same-GPU case only. */
static void test_import_on_device(void)
{
    int count = 0;
    CU(cudaGetDeviceCount(&count));
    int n = count < 2 ? count : 2;
    for (int e = 0; e < n; e++)
        for (int i = 0; i < n; i++) {
            void *buf = NULL;
            wsync_cuda_exporter_t *ex = NULL;
            wsync_cuda_import_t *im = NULL;
            wsync_wbuf_t b;
            const int *efds = NULL;
            uint32_t nfds = 0;
            CU(cudaSetDevice(e));
            CU(cudaMalloc(&buf, 1 << 20));
            CHECK_OK(wsync_cuda_exporter_create(e, &ex));
            CHECK_OK(wsync_cuda_export_add(ex, buf, 1 << 20, "buffer"));
            CHECK_OK(wsync_cuda_export_finish(ex));
            wsync_wbuf_init(&b);
            wsync_cuda_export_encode(ex, &b, &efds, &nfds);
            int fds[8];
            for (uint32_t k = 0; k < nfds && k < 8; k++)
                fds[k] = dup(efds[k]);
            wsync_rbuf_t rb;
            wsync_rbuf_init(&rb, b.data, b.len);
            CHECK(nfds <= 8);
            CHECK_OK(wsync_cuda_import_open(&rb, fds, nfds, i, "this process", &im));
            CHECK_MSG(wsync_cuda_import_on_device(im) == (e == i), "exported on GPU %d, opened "
                      "for GPU %d: on_device %d", e, i, wsync_cuda_import_on_device(im));
            uint64_t have = 0;
            CHECK(wsync_cuda_import_base(im, 0, &have) == buf && have >= (1u << 20));
            wsync_cuda_import_free(im);
            wsync_wbuf_free(&b);
            wsync_cuda_exporter_free(ex);
            CU(cudaFree(buf));
        }
    CHECK(wsync_cuda_import_on_device(NULL) == 0);
    CU(cudaSetDevice(0));
}

int main(int argc, char **argv)
{
    const char *json = NULL;
    int do_bench = 1;
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    int count = 0;
    struct cudaDeviceProp prop;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
            json = argv[++i];
        else if (strcmp(argv[i], "--no-bench") == 0)
            do_bench = 0;
        else {
            fprintf(stderr, "usage: %s [--seed S] [--no-bench] [--json PATH]\n", argv[0]);
            return 2;
        }
    }
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    CU(cudaGetDeviceProperties(&prop, 0));
    rng = seed ? seed : 1;
    printf("device: %s (%d SMs), seed %" PRIu64 "\n", prop.name, prop.multiProcessorCount, seed);
    fflush(stdout);

    run_case("copy_random", test_copy_random);
    run_case("pack_unpack_plan", test_pack_unpack_plan);
    run_case("copy_errors", test_copy_errors);
    run_case("amax", test_amax);
    run_case("amax_parts", test_amax_parts);
    run_case("quant_random", test_quant_random);
    run_case("quant_many", test_quant_many);
    run_case("quant_edges", test_quant_edges);
    run_case("quant_errors", test_quant_errors);
    run_case("import_on_device", test_import_on_device);
    if (do_bench)
        run_case("bench", run_bench);

    printf("\n%-22s %s\n", "case", "result");
    for (int i = 0; i < ncases; i++)
        printf("%-22s %s\n", cases[i].name, cases[i].failures ? "FAIL" : "pass");
    if (nbench > 0) {
        printf("\n%-34s %10s %10s %10s %9s %9s\n", "kernel (8192x8192)", "time us", "GB/s",
               "D2D GB/s", "of D2D", "useful");
        for (int i = 0; i < nbench; i++) {
            const bench_row_t *r = &bench[i];
            printf("%-34s %10.1f %10.0f %10.0f %8.1f%% %8.1f%%\n", r->name, r->t_kernel * 1e6,
                   r->bytes / r->t_kernel / 1e9, r->bytes / r->t_d2d / 1e9,
                   100.0 * r->t_d2d / r->t_kernel,
                   100.0 * r->useful / r->t_kernel / (r->bytes / r->t_d2d));
        }
    }
    if (json != NULL)
        write_json(json, prop.name, seed);
    return check_summary();
}
