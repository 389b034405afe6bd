/* The delta codec's CUDA kernels (kernels/delta.h) against the CPU codec (core/delta.h) and xxHash,
 * on fresh random inputs (the seed is printed; --seed S repeats a run): XXH3_64bits on the device
 * equal to the library's for every length 0..2048 and large ones; GPU encode blocks (header, table
 * words, each payload wherever it lies) equal to wsync_delta_encode's (format 3) for element sizes
 * 1, 2, 4, 8, dense and strided regions, densities 0..100 % (0.2 and 0.4 %: escapes in most SPARSE
 * blocks), every mode boundary, SPARSE gaps at the escapes' edges (254..256, 509..511, 4094, 4095)
 * and the SPARSE/BITMAP choice decided by e; GPU apply of CPU streams and CPU apply of GPU streams
 * equal to the new values; corrupted
 * streams refused exactly when wsync_delta_check refuses them (targeted: a format-1 header, a
 * trailing 0xFF, a wrong e, e in a BITMAP or PLAIN entry, a position past the block, ...), changes
 * sharing one mask word, full blocks with no tail), nothing written outside the chunk. The encode,
 * apply and corrupt cases run three times: with WSYNC_KDELTA_OLD=1 (the kernels before the warp
 * kernels: one CTA per block everywhere), with the default (a warp per full block of dense 16-byte
 * aligned chunks, encode and apply, one CTA per block for the rest in the same batches, picked by
 * the batch's density) and with WSYNC_KDELTA_WARP=1 (the warp kernels whatever the density, over an
 * odd count of chunks). Then, unless --no-bench, 1 GiB of bf16 at 1 %, 5 % and 30 % changed (or
 * --density): encode and apply times (the default, and WSYNC_KDELTA_OLD=1 beside it in the same
 * run) against reading both versions once (JSON lines on stdout; "kernel" names the default's, the
 * old_ fields the old kernels'). The ratio that counts (issue 17: encode + apply kernels against
 * reading both versions once) is (encode + apply without the receiver's hash) / read both; with the
 * hash is printed beside it. Beside them, the least an apply can take: the changed values written
 * at their positions from a list and nothing else (tests/gpu/delta_floor.cu, "scatter_us";
 * "floor_ratio" = (read both + scatter) / read both, what an encoder reading only the two versions
 * and such an apply would give), and the changed 32-byte sectors read and written whole
 * ("sectors_us": writing whole sectors instead of the values alone); and the least an encode can
 * take, both versions read and compared in one grid-stride pass with nothing written ("compare_us",
 * its count of changed vectors checked). The encode is timed without update_old (new and old only
 * read; every launch the same work) and, as the schemes' senders run it, with update_old on a fresh
 * copy of the old version each launch ("encode_update_us": the copy's time subtracted; the stream
 * and the updated baseline checked).
 *
 * usage: test_delta_kernels [--seed S] [--no-bench | --bench-only] [--profile] [--density P ...]
 *                           [--json PATH]
 * --bench-only: the benchmark without the cases.
 * --density P: bench this fraction of changed elements (repeat for several) instead of 0.01,
 * 0.05 and 0.30; --profile takes the first.
 * --profile: only the bench at 1 %, one launch of each batch (encode, apply with and without the
 * hash: kernels wkw_delta_encode, wkw_delta_apply, wk_delta_encode and wk_delta_apply for tails,
 * wk_delta_chunk_hash),
 * for `ncu --set full -k regex:wk test_delta_kernels --profile`.
 * Exit 0 when every case passed, 1 otherwise, 77 when there is no CUDA device. Not a ctest:
 * tests/gpu/run.sh runs it on a GPU machine. */
#include "core/delta.h"
#include "kernels/delta.h"
#include "kernels/kernels.h"
#include "tests/support/check.h"
#include "tests/gpu/cuda_check.h"
#include "tests/gpu/delta_floor.h"

#include <cuda_runtime_api.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>


#define BLK WSYNC_DELTA_BLOCK

/* ------------------------------------------------------------------------------------------ */
/* Random numbers                                                                               */
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
static double unit(void) { return (double)(rnd() >> 11) / 9007199254740992.0; }

static void fill_random(uint8_t *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t r = rnd();
        memcpy(p + i, &r, 8);
    }
    for (; i < n; i++)
        p[i] = (uint8_t)rnd();
}

/* Change element e of es bytes at p to another bit pattern. */
static void change_elem(uint8_t *p, uint32_t es)
{
    uint64_t x;
    do
        x = rnd() & (es == 8 ? UINT64_MAX : (UINT64_C(1) << (8 * es)) - 1);
    while (x == 0);
    for (uint32_t b = 0; b < es; b++)
        p[b] ^= (uint8_t)(x >> (8 * b));
}

/* ------------------------------------------------------------------------------------------ */
/* Results for the JSON file                                                                    */
/* ------------------------------------------------------------------------------------------ */

#define MAX_CASES 16
#define MAX_BENCH 8

static struct {
    const char *name;
    int failures;
} cases[MAX_CASES];
static int ncases;

typedef struct {
    double density, changed_fraction;
    uint64_t elements, changed, wire_bytes;
    double t_enc, t_app, t_app_nohash, t_amax, t_d2d, t_read;
    double old_enc, old_app, old_app_nohash;   /* with WSYNC_KDELTA_OLD=1 */
    double t_scatter;   /* the changed values written at their positions, nothing else */
    double t_sectors;   /* the changed 32-byte sectors read and written whole */
    double t_enc_upd;   /* the encode as a sender runs it: with update_old */
    double t_cmp;       /* both versions read and compared in one pass, nothing else */
    const char *read_ref;
    int correct;
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
/* Test chunks: host and device copies of old and new, the region, the CPU encoding             */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    uint32_t es;
    wsync_region_t r;
    uint64_t n, buf_elems;           /* elements in the region / in the buffers */
    uint8_t *h_old, *h_new;          /* host [buf_elems * es] */
    void *d_old, *d_new;             /* device copies */
    uint8_t *cpu_enc;                /* wsync_delta_encode's output */
    uint64_t cpu_len, cpu_hash, cpu_changed, cap;
    char label[96];
} tcase_t;

/* 1 when element e of the region (row-major) lies at buffer element *at. */
static uint64_t region_elem(const wsync_region_t *r, uint64_t e)
{
    return r->off + (e / r->cols) * r->pitch + e % r->cols;
}

/* A chunk of rows x cols (pitch, off) of es-byte elements, none changed yet: random old values,
 * and new ones equal to them in the region. Elements of the buffer outside the region differ
 * between old and new: an encoder that looks there is wrong. */
static void tcase_start(tcase_t *t, uint32_t es, uint64_t rows, uint64_t cols, uint64_t pitch,
                        uint64_t off)
{
    memset(t, 0, sizeof(*t));
    t->es = es;
    t->r.off = off;
    t->r.pitch = pitch;
    t->r.rows = rows;
    t->r.cols = cols;
    t->n = rows * cols;
    t->buf_elems = off + (rows - 1) * pitch + cols + 5;
    size_t bytes = t->buf_elems * es;
    t->h_old = malloc(bytes);
    t->h_new = malloc(bytes);
    fill_random(t->h_old, bytes);
    fill_random(t->h_new, bytes);   /* outside the region: anything */
    for (uint64_t e = 0; e < t->n; e++) {
        uint64_t at = region_elem(&t->r, e);
        memcpy(t->h_new + at * es, t->h_old + at * es, es);
    }
}

/* A started case's label (its shape, then `what`: how it changed), device copies and CPU
 * encoding. */
static void tcase_finish(tcase_t *t, const char *what)
{
    const uint32_t es = t->es;
    const size_t bytes = t->buf_elems * es;
    snprintf(t->label, sizeof(t->label), "esize %u, %" PRIu64 " x %" PRIu64 " pitch %" PRIu64
             " off %" PRIu64 ", %s", es, t->r.rows, t->r.cols, t->r.pitch, t->r.off, what);
    CU(cudaMalloc(&t->d_old, bytes));
    CU(cudaMalloc(&t->d_new, bytes));
    CU(cudaMemcpy(t->d_old, t->h_old, bytes, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(t->d_new, t->h_new, bytes, cudaMemcpyHostToDevice));
    t->cap = (wsync_delta_max_bytes(t->n, es) + 7) & ~(uint64_t)7;
    t->cpu_enc = malloc(t->cap);
    CHECK_OK(wsync_delta_encode(t->h_new, t->h_old, &t->r, es, t->cpu_enc, t->cap, &t->cpu_len,
                                &t->cpu_hash, &t->cpu_changed));
}

/* A chunk (tcase_start) with each element changed with probability `density`, or, when kpat is
 * not NULL, block j of it with exactly kpat[j % nk] changes. */
static void tcase_make(tcase_t *t, uint32_t es, uint64_t rows, uint64_t cols, uint64_t pitch,
                       uint64_t off, double density, const uint32_t *kpat, uint32_t nk)
{
    char what[32];
    tcase_start(t, es, rows, cols, pitch, off);
    if (kpat == NULL) {
        for (uint64_t e = 0; e < t->n; e++)
            if (density >= 1.0 || (density > 0 && unit() < density))
                change_elem(t->h_new + region_elem(&t->r, e) * es, es);
    } else {
        uint32_t *perm = malloc(BLK * sizeof(*perm));
        for (uint64_t j = 0; j * BLK < t->n; j++) {
            uint32_t len = (uint32_t)(t->n - j * BLK < BLK ? t->n - j * BLK : BLK);
            uint32_t k = kpat[j % nk] < len ? kpat[j % nk] : len;
            for (uint32_t i = 0; i < len; i++)
                perm[i] = i;
            for (uint32_t i = 0; i < k; i++) {   /* k distinct positions */
                uint32_t s = i + (uint32_t)below(len - i), tmp = perm[i];
                perm[i] = perm[s];
                perm[s] = tmp;
                change_elem(t->h_new + region_elem(&t->r, j * BLK + perm[i]) * es, es);
            }
        }
        free(perm);
    }
    snprintf(what, sizeof(what), "%s %.3f", kpat ? "k pattern" : "density", kpat ? 0.0 : density);
    tcase_finish(t, what);
}

/* A chunk (tcase_start) whose elements (region order) pos[0..np) changed, and no other. */
static void tcase_make_pos(tcase_t *t, uint32_t es, uint64_t rows, uint64_t cols, uint64_t pitch,
                           uint64_t off, const uint32_t *pos, uint32_t np, const char *what)
{
    tcase_start(t, es, rows, cols, pitch, off);
    for (uint32_t i = 0; i < np; i++)
        change_elem(t->h_new + region_elem(&t->r, pos[i]) * es, es);
    tcase_finish(t, what);
}

static void tcase_free(tcase_t *t)
{
    free(t->h_old);
    free(t->h_new);
    free(t->cpu_enc);
    CU(cudaFree(t->d_old));
    CU(cudaFree(t->d_new));
}

/* The k values around every change of mode of a full block of es-byte elements (and 0, 1, all). */
static uint32_t mode_edges(uint32_t es, uint32_t *ks, uint32_t max)
{
    uint32_t n = 0, prev = 0;
    ks[n++] = 0;
    ks[n++] = 1;
    for (uint32_t k = 1; k <= BLK && n + 5 < max; k++) {
        uint32_t mode;
        wsync_delta_block_bytes(BLK, k, 0, es, &mode);   /* the edges without escapes */
        if (k > 1 && mode != prev) {
            ks[n++] = k - 1;
            ks[n++] = k;
            ks[n++] = k + 1 <= BLK ? k + 1 : k;
        }
        prev = mode;
    }
    ks[n++] = BLK - 1;
    ks[n++] = BLK;
    return n;
}

/* Changed positions of a chunk of 7 blocks and a tail of 1000 whose SPARSE gaps sit at the
 * escapes' edges: block 0 gaps 254, 255, 256, 509, 510, 511, 0, 0, 1000 and its last element;
 * block 1 only its last element (gap 4095, 16 escapes); block 2 its first and last (4094);
 * block 3 at 255 (one escape, then a byte 0) and its last; blocks 4 and 5 k = 500 with 12 and 13
 * gaps of 255 then a run (bf16: SPARSE at e = 12 ties BITMAP and wins, BITMAP from e = 13);
 * block 6 nothing; the tail its last element (gap 999). */
static uint32_t gap_positions(uint32_t *p, uint32_t max)
{
    static const uint32_t gaps0[] = {254, 255, 256, 509, 510, 511, 0, 0, 1000};
    uint32_t n = 0;
    int64_t last = -1;
    for (size_t i = 0; i < sizeof(gaps0) / sizeof(gaps0[0]); i++) {
        last += gaps0[i] + 1;
        p[n++] = (uint32_t)last;
    }
    p[n++] = BLK - 1;
    p[n++] = 2 * BLK - 1;
    p[n++] = 2 * BLK;
    p[n++] = 3 * BLK - 1;
    p[n++] = 3 * BLK + 255;
    p[n++] = 4 * BLK - 1;
    for (uint32_t b = 4; b <= 5; b++) {
        uint32_t esc = b == 4 ? 12 : 13;
        last = (int64_t)b * BLK - 1;
        for (uint32_t i = 0; i < 500; i++) {
            last += i < esc ? 256 : 1;
            p[n++] = (uint32_t)last;
        }
    }
    p[n++] = 7 * BLK + 999;
    if (n > max) {
        fprintf(stderr, "gap_positions: %u > %u\n", n, max);
        exit(2);
    }
    return n;
}

/* Changed positions of a chunk of 4 blocks and a tail of 20 (the warp encoder's mask words):
 * block 0 three changes in one word (224, 229, 255: gaps 224, 4, 25); block 1 all 32 elements of
 * its last word (gap 4064: 15 escapes, then 31 gaps of 0); block 2 its first element only; block
 * 3 nothing; the tail its elements 3 and 19 (its last, in a partial word). The first np3 of them
 * lie in the first 3 blocks (a chunk of exactly 3 full blocks: no tail). */
static uint32_t word_positions(uint32_t *p, uint32_t *np3)
{
    uint32_t n = 0;
    p[n++] = 224;
    p[n++] = 229;
    p[n++] = 255;
    for (uint32_t i = 0; i < 32; i++)
        p[n++] = 2 * BLK - 32 + i;
    p[n++] = 2 * BLK;
    *np3 = n;
    p[n++] = 4 * BLK + 3;
    p[n++] = 4 * BLK + 19;
    return n;
}

/* The test chunks: every element size, densities 0..1, dense and strided, tails, unaligned. */
#define MAX_TC 160
static tcase_t tcs[MAX_TC];
static int ntc;

static void make_all_cases(void)
{
    static const uint32_t sizes[4] = {1, 2, 4, 8};
    /* 0.002 and 0.004: most gaps near 255 (escapes in most SPARSE blocks) */
    static const double dens[] = {0.0, 0.0005, 0.01, 0.05, 0.3, 0.6, 0.97, 1.0, 0.002, 0.004};
    static const struct {
        uint64_t rows, cols, pitch, off;
    } shapes[] = {
        {1, 3 * BLK + 1001, 3 * BLK + 1001, 0},   /* dense, tail block */
        {37, 1000, 1500, 3},                      /* strided, blocks across rows */
        {1, 50001, 50001, 5},                     /* dense, start not 16-byte aligned */
    };
    uint32_t ks[64];

    ntc = 0;
    for (int si = 0; si < 4; si++) {
        uint32_t es = sizes[si];
        for (size_t di = 0; di < sizeof(dens) / sizeof(dens[0]); di++) {
            int sh = (int)(di % 3);   /* each density on one shape, each shape on several */
            tcase_make(&tcs[ntc++], es, shapes[sh].rows, shapes[sh].cols, shapes[sh].pitch,
                       shapes[sh].off, dens[di], NULL, 0);
        }
        /* tiny chunks: 1, 7 elements; exactly one block; one block + 1 */
        tcase_make(&tcs[ntc++], es, 1, 1, 1, 0, 1.0, NULL, 0);
        tcase_make(&tcs[ntc++], es, 1, 7, 7, 1, 0.5, NULL, 0);
        tcase_make(&tcs[ntc++], es, 64, 64, 64, 0, 0.02, NULL, 0);
        tcase_make(&tcs[ntc++], es, 1, BLK + 1, BLK + 1, 0, 0.4, NULL, 0);
        /* 100 blocks: look-backs across several windows of 32 blocks */
        if (es == 2)
            tcase_make(&tcs[ntc++], es, 1, 100 * BLK + 5, 100 * BLK + 5, 0, 0.02, NULL, 0);
        /* narrow rows: 3 of 7 */
        tcase_make(&tcs[ntc++], es, 3000, 3, 7, 2, 0.1, NULL, 0);
        /* every mode boundary, dense and strided */
        uint32_t nk = mode_edges(es, ks, 64);
        tcase_make(&tcs[ntc++], es, 1, (uint64_t)nk * BLK + 77, (uint64_t)nk * BLK + 77, 0, 0, ks, nk);
        tcase_make(&tcs[ntc++], es, nk, BLK, BLK + 64, 8, 0, ks, nk);
    }
    /* SPARSE gaps around the escapes, every element size, dense and (bf16) strided */
    uint32_t gp[1100], ng = gap_positions(gp, 1100);
    for (int si = 0; si < 4; si++)
        tcase_make_pos(&tcs[ntc++], sizes[si], 1, 7 * BLK + 1000, 7 * BLK + 1000, 1, gp, ng,
                       "gaps 254..256, 509..511, 4094, 4095, e 12 | 13 at k 500");
    tcase_make_pos(&tcs[ntc++], 2, 8, (7 * BLK + 1000) / 8, 3800, 0, gp, ng,
                   "gaps 254..256, 509..511, 4094, 4095, e 12 | 13 at k 500");
    /* the same at offset 0, 16-byte aligned (the warp encoder's full blocks), every size; then
     * changes sharing one mask word, with a tail and with exactly 3 full blocks */
    uint32_t wp[64], nw3, nw = word_positions(wp, &nw3);
    for (int si = 0; si < 4; si++) {
        tcase_make_pos(&tcs[ntc++], sizes[si], 1, 7 * BLK + 1000, 7 * BLK + 1000, 0, gp, ng,
                       "gaps 254..256, 509..511, 4094, 4095, e 12 | 13 at k 500");
        tcase_make_pos(&tcs[ntc++], sizes[si], 1, 4 * BLK + 20, 4 * BLK + 20, 0, wp, nw,
                       "changes in one word, tail");
        tcase_make_pos(&tcs[ntc++], sizes[si], 1, 3 * BLK, 3 * BLK, 0, wp, nw3,
                       "changes in one word, 3 full blocks");
    }
}

/* ------------------------------------------------------------------------------------------ */
/* XXH3                                                                                         */
/* ------------------------------------------------------------------------------------------ */

static void test_xxh3(void)
{
    const uint64_t big[] = {4096, 8192, 16384, 32768, 65537, 1 << 20, 3000017, 241, 1024, 1025};
    const uint32_t nsmall = 2049, nbig = sizeof(big) / sizeof(big[0]), n = nsmall + nbig;
    const size_t bytes = 4 << 20;
    uint8_t *h = malloc(bytes);
    uint64_t *offs = malloc(n * 8), *lens = malloc(n * 8), *got = malloc(n * 8);
    void *d;
    uint64_t *d_offs, *d_lens, *d_out;

    fill_random(h, bytes);
    for (uint32_t i = 0; i < n; i++) {
        lens[i] = i < nsmall ? i : big[i - nsmall];
        offs[i] = below(64);   /* any alignment */
        if (offs[i] + lens[i] > bytes)
            offs[i] = 0;
    }
    CU(cudaMalloc(&d, bytes));
    CU(cudaMalloc((void **)&d_offs, n * 8));
    CU(cudaMalloc((void **)&d_lens, n * 8));
    CU(cudaMalloc((void **)&d_out, n * 8));
    CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_offs, offs, n * 8, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_lens, lens, n * 8, cudaMemcpyHostToDevice));
    CU(cudaMemset(d_out, 0, n * 8));
    CHECK_OK(wsync_kdelta_xxh3(d, d_offs, d_lens, n, d_out, NULL));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(got, d_out, n * 8, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t want = XXH3_64bits(h + offs[i], lens[i]);
        if (got[i] != want && bad++ < 8)
            CHECK_MSG(0, "XXH3 of %" PRIu64 " bytes at offset %" PRIu64 ": device %016" PRIx64
                      ", xxHash %016" PRIx64, lens[i], offs[i], got[i], want);
    }
    CHECK_MSG(bad == 0, "%d of %" PRIu32 " lengths differ", bad, n);
    CHECK_ST(wsync_kdelta_xxh3(NULL, d_offs, d_lens, 1, d_out, NULL), WSYNC_ERR_INVALID);
    CU(cudaFree(d));
    CU(cudaFree(d_offs));
    CU(cudaFree(d_lens));
    CU(cudaFree(d_out));
    free(h);
    free(offs);
    free(lens);
    free(got);
}

/* ------------------------------------------------------------------------------------------ */
/* Encode: GPU bytes == CPU bytes                                                              */
/* ------------------------------------------------------------------------------------------ */

static size_t first_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i])
            return i;
    return n;
}

/* Do a GPU stream and the CPU's (len bytes each, n elements) hold the same blocks: header, table
 * words and each block's payload bytes, wherever the payload lies (format 3: the CPU lays them in
 * block order, the GPU in the order its blocks finished)? 1 and where (why) when they differ. */
static int stream_diff(const uint8_t *gpu, const uint8_t *cpu, uint64_t len, uint64_t n, char *why,
                       size_t wn)
{
    const uint64_t nb = wsync_delta_nblocks(n), tbl = 16 + 8 * nb;
    if (len < tbl || memcmp(gpu, cpu, 16) != 0) {
        snprintf(why, wn, "header");
        return 1;
    }
    for (uint64_t j = 0; j < nb; j++) {
        uint32_t go, gw, co, cw, cn = 0;
        memcpy(&go, gpu + 16 + 8 * j, 4);
        memcpy(&gw, gpu + 20 + 8 * j, 4);
        memcpy(&co, cpu + 16 + 8 * j, 4);
        memcpy(&cw, cpu + 20 + 8 * j, 4);
        if (j + 1 < nb)
            memcpy(&cn, cpu + 16 + 8 * (j + 1), 4);
        const uint64_t sz = (j + 1 < nb ? cn : len - tbl) - co;
        if (gw != cw) {
            snprintf(why, wn, "block %" PRIu64 "'s table word: GPU 0x%08" PRIx32 ", CPU 0x%08"
                     PRIx32, j, gw, cw);
            return 1;
        }
        if (go % 8 != 0 || tbl + go + sz > len) {
            snprintf(why, wn, "block %" PRIu64 ": GPU offset %" PRIu32 " (payload %" PRIu64
                     " bytes, stream %" PRIu64 ")", j, go, sz, len);
            return 1;
        }
        const size_t at = first_diff(gpu + tbl + go, cpu + tbl + co, sz);
        if (at < sz) {
            snprintf(why, wn, "block %" PRIu64 "'s payload, byte %zu of %" PRIu64 " (GPU 0x%02x, "
                     "CPU 0x%02x)", j, at, sz, gpu[tbl + go + at], cpu[tbl + co + at]);
            return 1;
        }
    }
    return 0;
}

/* Encode every test chunk in one batch (poisoned outputs); *outs gets the device outputs. */
static void gpu_encode_all(void **outs, const wsync_kdelta_result_t **res, wsync_kdelta_batch_t **b)
{
    wsync_kdelta_enc_t *e = calloc(ntc, sizeof(*e));
    for (int i = 0; i < ntc; i++) {
        CU(cudaMalloc(&outs[i], tcs[i].cap));
        CU(cudaMemset(outs[i], 0xa5, tcs[i].cap));
        e[i] = (wsync_kdelta_enc_t){tcs[i].d_new, tcs[i].d_old, tcs[i].r, tcs[i].es, outs[i],
                                    tcs[i].cap};
    }
    *b = NULL;
    CHECK_OK(wsync_kdelta_encode_create(e, (uint32_t)ntc, 0, b));
    if (*b != NULL) {
        CHECK_OK(wsync_kdelta_launch(*b, NULL, NULL));
        CU(cudaDeviceSynchronize());
        *res = wsync_kdelta_results(*b);
    }
    free(e);
}

static void test_encode(void)
{
    void *outs[MAX_TC];
    const wsync_kdelta_result_t *res = NULL;
    wsync_kdelta_batch_t *b;

    gpu_encode_all(outs, &res, &b);
    for (int i = 0; i < ntc && res != NULL; i++) {
        tcase_t *t = &tcs[i];
        CHECK_MSG(res[i].len == t->cpu_len && res[i].hash == t->cpu_hash &&
                  res[i].changed == t->cpu_changed && res[i].fault == WSYNC_KDELTA_NO_FAULT,
                  "%s: GPU len %" PRIu64 " hash %016" PRIx64 " changed %" PRIu64 ", CPU %" PRIu64
                  " %016" PRIx64 " %" PRIu64, t->label, res[i].len, res[i].hash, res[i].changed,
                  t->cpu_len, t->cpu_hash, t->cpu_changed);
        CHECK_MSG(res[i].hash == wsync_delta_hash(t->h_new, &t->r, t->es),
                  "%s: hash differs from wsync_delta_hash", t->label);
        if (res[i].len != t->cpu_len)
            continue;
        uint8_t *got = malloc(t->cpu_len);
        CU(cudaMemcpy(got, outs[i], t->cpu_len, cudaMemcpyDeviceToHost));
        char why[160];
        CHECK_OK(wsync_delta_check(got, t->cpu_len, t->n, t->es, t->label));
        CHECK_MSG(!stream_diff(got, t->cpu_enc, t->cpu_len, t->n, why, sizeof(why)),
                  "%s: encoded blocks differ from the CPU's: %s", t->label, why);
        free(got);
    }
    wsync_kdelta_free(b);

    /* caps too small: reported (len > cap), nothing written past cap; old never written */
    {
        tcase_t *t = &tcs[3];   /* esize 1, density 0.05 */
        uint64_t caps[3] = {0, 16, t->cpu_len - 8};
        uint64_t room = t->cpu_len + 64;
        uint8_t *d_out, *h = malloc(room);
        CU(cudaMalloc((void **)&d_out, 3 * room));
        CU(cudaMemset(d_out, 0x5a, 3 * room));
        wsync_kdelta_enc_t e[3];
        for (int i = 0; i < 3; i++)
            e[i] = (wsync_kdelta_enc_t){t->d_new, t->d_old, t->r, t->es, d_out + i * room, caps[i]};
        CHECK_OK(wsync_kdelta_encode_create(e, 3, 0, &b));
        CHECK_OK(wsync_kdelta_launch(b, NULL, NULL));
        CU(cudaDeviceSynchronize());
        res = wsync_kdelta_results(b);
        for (int i = 0; i < 3; i++) {
            CHECK_MSG(res[i].len == t->cpu_len && res[i].hash == t->cpu_hash,
                      "cap %" PRIu64 ": len %" PRIu64 " (want %" PRIu64 ", above the cap)",
                      caps[i], res[i].len, t->cpu_len);
            CU(cudaMemcpy(h, d_out + i * room, room, cudaMemcpyDeviceToHost));
            int past = 0;
            for (uint64_t x = caps[i]; x < room; x++)
                past |= h[x] != 0x5a;
            CHECK_MSG(!past, "cap %" PRIu64 ": bytes written past the cap", caps[i]);
        }
        wsync_kdelta_free(b);
        CU(cudaFree(d_out));
        free(h);
    }

    /* update_old: each old region holds the new values afterwards, the rest of old untouched */
    {
        /* strided; one full block, two full blocks and a tail at 5 % and 97 % (PLAIN); unaligned */
        wsync_kdelta_enc_t e[5];
        void *o[5];
        int pick[5] = {1, 12, 20, 23, 40};
        for (int i = 0; i < 5; i++) {
            tcase_t *t = &tcs[pick[i]];
            CU(cudaMalloc(&o[i], t->cap));
            e[i] = (wsync_kdelta_enc_t){t->d_new, t->d_old, t->r, t->es, o[i], t->cap};
        }
        CHECK_OK(wsync_kdelta_encode_create(e, 5, 1, &b));
        CHECK_OK(wsync_kdelta_launch(b, NULL, NULL));
        CU(cudaDeviceSynchronize());
        res = wsync_kdelta_results(b);
        for (int i = 0; i < 5; i++) {
            tcase_t *t = &tcs[pick[i]];
            size_t bytes = t->buf_elems * t->es;
            uint8_t *want = malloc(bytes), *got = malloc(bytes);
            memcpy(want, t->h_old, bytes);
            for (uint64_t x = 0; x < t->n; x++) {
                uint64_t at = region_elem(&t->r, x);
                memcpy(want + at * t->es, t->h_new + at * t->es, t->es);
            }
            CU(cudaMemcpy(got, t->d_old, bytes, cudaMemcpyDeviceToHost));
            size_t at = first_diff(got, want, bytes);
            CHECK_MSG(at == bytes, "%s: update_old: old differs from the expected at byte %zu",
                      t->label, at);
            CHECK_MSG(res[i].len == t->cpu_len && res[i].hash == t->cpu_hash,
                      "%s: update_old changed the encoding", t->label);
            /* put old back for the other cases */
            CU(cudaMemcpy(t->d_old, t->h_old, bytes, cudaMemcpyHostToDevice));
            free(want);
            free(got);
            CU(cudaFree(o[i]));
        }
        wsync_kdelta_free(b);
    }
    for (int i = 0; i < ntc; i++)
        CU(cudaFree(outs[i]));
}

/* ------------------------------------------------------------------------------------------ */
/* Apply                                                                                        */
/* ------------------------------------------------------------------------------------------ */

/* The buffer old with the region's elements taken from new: what a target holds after. */
static uint8_t *expected_after(const tcase_t *t)
{
    size_t bytes = t->buf_elems * t->es;
    uint8_t *w = malloc(bytes);
    memcpy(w, t->h_old, bytes);
    for (uint64_t x = 0; x < t->n; x++) {
        uint64_t at = region_elem(&t->r, x);
        memcpy(w + at * t->es, t->h_new + at * t->es, t->es);
    }
    return w;
}

/* GPU apply of the CPU's streams (device memory, or pinned host memory for some), with and
 * without the hash; then the CPU's check and apply of the GPU's streams. */
static void test_apply(void)
{
    for (int pass = 0; pass < 2; pass++) {
        int hash = pass == 0;
        wsync_kdelta_app_t *a = calloc(ntc, sizeof(*a));
        void **dst = calloc(ntc, sizeof(void *)), **enc = calloc(ntc, sizeof(void *));
        int *pinned = calloc(ntc, sizeof(int));
        for (int i = 0; i < ntc; i++) {
            tcase_t *t = &tcs[i];
            size_t bytes = t->buf_elems * t->es;
            CU(cudaMalloc(&dst[i], bytes));
            CU(cudaMemcpy(dst[i], t->h_old, bytes, cudaMemcpyHostToDevice));
            pinned[i] = i % 5 == 4;   /* the stream in host memory the GPU reads */
            if (pinned[i]) {
                CU(cudaMallocHost(&enc[i], t->cpu_len));
                memcpy(enc[i], t->cpu_enc, t->cpu_len);
            } else {
                CU(cudaMalloc(&enc[i], t->cpu_len));
                CU(cudaMemcpy(enc[i], t->cpu_enc, t->cpu_len, cudaMemcpyHostToDevice));
            }
            a[i] = (wsync_kdelta_app_t){enc[i], t->cpu_len, dst[i], t->r, t->es};
        }
        wsync_kdelta_batch_t *b = NULL;
        CHECK_OK(wsync_kdelta_apply_create(a, (uint32_t)ntc, hash, &b));
        if (b != NULL) {
            CHECK_OK(wsync_kdelta_launch(b, NULL, NULL));
            CU(cudaDeviceSynchronize());
            const wsync_kdelta_result_t *res = wsync_kdelta_results(b);
            for (int i = 0; i < ntc; i++) {
                tcase_t *t = &tcs[i];
                size_t bytes = t->buf_elems * t->es;
                uint8_t *want = expected_after(t), *got = malloc(bytes);
                CU(cudaMemcpy(got, dst[i], bytes, cudaMemcpyDeviceToHost));
                size_t at = first_diff(got, want, bytes);
                CHECK_MSG(at == bytes, "%s (hash %d%s): the target after apply differs at byte %zu",
                          t->label, hash, pinned[i] ? ", stream in host memory" : "", at);
                CHECK_MSG(res[i].fault == WSYNC_KDELTA_NO_FAULT && res[i].changed == t->cpu_changed,
                          "%s (hash %d): fault %" PRIx64 ", changed %" PRIu64 " (want %" PRIu64 ")",
                          t->label, hash, res[i].fault, res[i].changed, t->cpu_changed);
                if (hash)
                    CHECK_MSG(res[i].hash == t->cpu_hash, "%s: apply hash %016" PRIx64 ", the "
                              "sender's %016" PRIx64, t->label, res[i].hash, t->cpu_hash);
                free(want);
                free(got);
            }
        }
        wsync_kdelta_free(b);
        for (int i = 0; i < ntc; i++) {
            CU(cudaFree(dst[i]));
            if (pinned[i])
                CU(cudaFreeHost(enc[i]));
            else
                CU(cudaFree(enc[i]));
        }
        free(a);
        free(dst);
        free(enc);
        free(pinned);
    }

    /* the CPU applies what the GPU encoded */
    void *outs[MAX_TC];
    const wsync_kdelta_result_t *res = NULL;
    wsync_kdelta_batch_t *b;
    gpu_encode_all(outs, &res, &b);
    for (int i = 0; i < ntc && res != NULL; i++) {
        tcase_t *t = &tcs[i];
        size_t bytes = t->buf_elems * t->es;
        uint8_t *enc = malloc(res[i].len), *buf = malloc(bytes), *want = expected_after(t);
        uint64_t h = 0;
        CU(cudaMemcpy(enc, outs[i], res[i].len, cudaMemcpyDeviceToHost));
        memcpy(buf, t->h_old, bytes);
        CHECK_OK(wsync_delta_check(enc, res[i].len, t->n, t->es, t->label));
        CHECK_OK(wsync_delta_apply(enc, res[i].len, buf, &t->r, t->es, &h));
        CHECK_MSG(memcmp(buf, want, bytes) == 0 && h == res[i].hash,
                  "%s: CPU apply of the GPU's stream differs", t->label);
        free(enc);
        free(buf);
        free(want);
        CU(cudaFree(outs[i]));
    }
    wsync_kdelta_free(b);

    /* lengths per launch: created with length 0 (refused), launched with the real ones */
    {
        tcase_t *t = &tcs[2];
        size_t bytes = t->buf_elems * t->es;
        void *dst, *enc;
        CU(cudaMalloc(&dst, bytes));
        CU(cudaMalloc(&enc, t->cpu_len));
        CU(cudaMemcpy(dst, t->h_old, bytes, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(enc, t->cpu_enc, t->cpu_len, cudaMemcpyHostToDevice));
        wsync_kdelta_app_t a = {enc, 0, dst, t->r, t->es};
        CHECK_OK(wsync_kdelta_apply_create(&a, 1, 1, &b));
        CHECK_OK(wsync_kdelta_launch(b, NULL, NULL));
        CU(cudaDeviceSynchronize());
        res = wsync_kdelta_results(b);
        CHECK_MSG(res[0].fault == (uint64_t)WSYNC_KDELTA_FAULT_HEADER,
                  "length 0: fault %" PRIx64 ", want a header fault in block 0", res[0].fault);
        CHECK_ST(wsync_kdelta_fault_status(&res[0], "chunk 7 from sender 1"), WSYNC_ERR_INTEGRITY);
        CHECK_ERR_HAS("chunk 7 from sender 1: block 0: bad header");
        CHECK_OK(wsync_kdelta_launch(b, &t->cpu_len, NULL));
        CU(cudaDeviceSynchronize());
        res = wsync_kdelta_results(b);
        CHECK_MSG(res[0].fault == WSYNC_KDELTA_NO_FAULT && res[0].hash == t->cpu_hash,
                  "the length given at launch was not used");
        CHECK_OK(wsync_kdelta_fault_status(&res[0], "x"));
        wsync_kdelta_free(b);
        CU(cudaFree(dst));
        CU(cudaFree(enc));
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Corrupted streams                                                                            */
/* ------------------------------------------------------------------------------------------ */

#define NMUT 400

static void put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);   /* little-endian hosts, as the format */
}

/* Set block j's escape count e in a stream's table (its mode and k kept). */
static void set_e(uint8_t *s, uint32_t j, uint32_t e)
{
    uint8_t *w = s + 16 + 8 * j + 4;
    w[2] = (uint8_t)e;
    w[3] = (uint8_t)((w[3] & 0xc0) | ((e >> 8) & 0x3f));
}

/* k distinct random positions of [base, base + len) into p; the count after. */
static uint32_t rand_positions(uint32_t *p, uint32_t n, uint32_t base, uint32_t len, uint32_t k)
{
    uint32_t *perm = malloc(len * sizeof(*perm));
    for (uint32_t i = 0; i < len; i++)
        perm[i] = i;
    for (uint32_t i = 0; i < k; i++) {
        uint32_t s = i + (uint32_t)below(len - i), tmp = perm[i];
        perm[i] = perm[s];
        perm[s] = tmp;
        p[n++] = base + perm[i];
    }
    free(perm);
    return n;
}

/* Mutant m of the corrupt case's stream s (a copy of t's CPU stream, *len its length; pay[j]:
 * block j's payload, tbl: the table's end): m < 31 a targeted fault (or a valid change), then
 * random bit flips in the header and table (m < 200) or anywhere. Returns the fault code the
 * apply must report, or -1 where only the CPU check's verdict is compared. */
static int make_mutant(int m, uint8_t *s, uint64_t *len, const tcase_t *t, const uint64_t *pay,
                       uint64_t tbl)
{
    int want = -1;
    switch (m) {
    case 0: s[0] ^= 1; want = WSYNC_KDELTA_FAULT_HEADER; break;     /* magic */
    case 1: s[4] = 1; want = WSYNC_KDELTA_FAULT_HEADER; break;      /* format 1 */
    case 28: s[4] = 2; want = WSYNC_KDELTA_FAULT_HEADER; break;     /* format 2 */
    case 2: s[5] = 4; want = WSYNC_KDELTA_FAULT_HEADER; break;      /* esize */
    case 3: s[6] = 1; want = WSYNC_KDELTA_FAULT_HEADER; break;      /* padding */
    case 4: s[8] ^= 1; want = WSYNC_KDELTA_FAULT_HEADER; break;     /* n */
    case 5: *len = tbl - 8; want = WSYNC_KDELTA_FAULT_HEADER; break;
    case 6: *len = t->cpu_len - 8; break;                                /* truncated */
    case 7: *len = t->cpu_len + 8; memset(s + t->cpu_len, 0, 8); break;  /* trailing */
    case 8: s[16 + 8 * 1 + 7] ^= 0x40; break;                               /* mode of block 1 */
    case 9: s[16 + 8 * 0 + 4] ^= 1; break;                                  /* k of block 0 */
    case 10:   /* block 3 (SAME) placed past the payload area */
        put32(s + 16 + 8 * 3, (uint32_t)(t->cpu_len - tbl + 8));
        want = WSYNC_KDELTA_FAULT_TABLE;
        break;
    case 11: s[16 + 8 * 4 + 6] ^= 0x20; break;                              /* e + 32 */
    /* payloads: block 0 SPARSE (index stream at pay[0], values at + 16), 1 BITMAP, 4 SPARSE
     * (index at pay[4], values at + 24), 5 tail BITMAP */
    case 12:   /* a trailing escape: counts right (e 11, k 5), last byte 0xFF */
        s[pay[0] + 15] = 0xff;
        set_e(s, 0, 11);
        want = WSYNC_KDELTA_FAULT_PAYLOAD;
        break;
    case 13: set_e(s, 0, 9); want = WSYNC_KDELTA_FAULT_PAYLOAD; break;   /* wrong e */
    case 14: set_e(s, 0, 11); want = WSYNC_KDELTA_FAULT_PAYLOAD; break;  /* wrong e */
    case 15: s[pay[0] + 15] = 1; want = WSYNC_KDELTA_FAULT_PAYLOAD; break;   /* index pad */
    case 16: s[pay[1]] ^= 1; want = WSYNC_KDELTA_FAULT_PAYLOAD; break;       /* popcount */
    case 17:   /* a bit moved: as valid as before, the values land elsewhere */
    case 19: { /* a bit moved past the tail block's 77 elements */
        uint8_t *map = s + pay[m == 17 ? 1 : 5];
        uint32_t set = 0, clr = 0;
        while (!((map[set / 8] >> (set % 8)) & 1))
            set++;
        while (m == 17 && ((map[clr / 8] >> (clr % 8)) & 1))
            clr++;
        if (m == 19)
            clr = 79;
        map[set / 8] &= (uint8_t)~(1u << (set % 8));
        map[clr / 8] |= (uint8_t)(1u << (clr % 8));
        if (m == 19)
            want = WSYNC_KDELTA_FAULT_PAYLOAD;
        break;
    }
    case 18: s[pay[0] + 16 + 10] = 1; want = WSYNC_KDELTA_FAULT_PAYLOAD; break; /* value pad */
    case 20: s[pay[5] + 10] = 1; want = WSYNC_KDELTA_FAULT_PAYLOAD; break;      /* map pad */
    case 21: s[16 + 8 * 2 + 4] ^= 1; break;   /* PLAIN k 4000 -> 4001: still PLAIN, valid */
    case 22:   /* block 4's last gap 73 -> 254: position 4276, past the block */
        s[pay[4] + 17] = 254;
        want = WSYNC_KDELTA_FAULT_PAYLOAD;
        break;
    case 23: s[pay[4] + 17] = 72; break;      /* last position 4094: valid, lands elsewhere */
    case 24: set_e(s, 1, 1); want = WSYNC_KDELTA_FAULT_TABLE; break;   /* BITMAP e 1 */
    case 25: set_e(s, 2, 2); want = WSYNC_KDELTA_FAULT_TABLE; break;   /* PLAIN e 2 */
    case 26: s[16 + 8 * 4 + 5] ^= 0x10; want = WSYNC_KDELTA_FAULT_TABLE; break; /* k + 4096 */
    case 27:   /* block 4's last escape after its last element: counts right, last 0xFF */
        s[pay[4] + 16] = 73;
        s[pay[4] + 17] = 0xff;
        want = WSYNC_KDELTA_FAULT_PAYLOAD;
        break;
    case 29: {   /* payloads of blocks 0 and 1 swapped (format 3: any order): valid */
        const uint64_t s0 = pay[1] - pay[0], s1 = pay[2] - pay[1];
        memcpy(s + pay[0], t->cpu_enc + pay[1], s1);
        memcpy(s + pay[0] + s1, t->cpu_enc + pay[0], s0);
        put32(s + 16 + 8 * 1, (uint32_t)(pay[0] - tbl));
        put32(s + 16 + 8 * 0, (uint32_t)(pay[0] - tbl + s1));
        break;
    }
    case 30:   /* block 2 (PLAIN) over block 1: passes both checks (overlaps are not looked
                * for), its values wrong; the hash tells */
        put32(s + 16 + 8 * 2, (uint32_t)(pay[1] - tbl));
        break;
    default: {
        uint64_t at = m < 200 ? below(tbl) : below(t->cpu_len);   /* header/table, anywhere */
        s[at] ^= (uint8_t)(1u << below(8));
        break;
    }
    }
    return want;
}

static void test_corrupt(void)
{
    /* bf16 blocks: SPARSE k 5 at 300, 301, 900, 1500, 3000 (gaps 300, 0, 598, 599, 1499: e 10,
     * an index stream of 15 bytes and one of padding), BITMAP k 1000, PLAIN k 4000, SAME,
     * SPARSE k 3 at 3000, 3001, 4095 (gaps 3000, 0, 1093: e 15, last byte 73), and a tail of 77
     * elements as a BITMAP (k 30) whose last bitmap byte has bits past the block */
    static const uint32_t kp[6] = {5, 1000, 4000, 0, 3, 30}, ep[6] = {10, 0, 0, 0, 15, 0};
    uint32_t *pos = malloc(6000 * sizeof(*pos)), np = 0;
    static const uint32_t b0[5] = {300, 301, 900, 1500, 3000}, b4[3] = {3000, 3001, 4095};
    for (int i = 0; i < 5; i++)
        pos[np++] = b0[i];
    np = rand_positions(pos, np, BLK, BLK, 1000);
    np = rand_positions(pos, np, 2 * BLK, BLK, 4000);
    for (int i = 0; i < 3; i++)
        pos[np++] = 4 * BLK + b4[i];
    np = rand_positions(pos, np, 5 * BLK, 77, 30);
    tcase_t tc;
    /* at offset 0: the warp encoder writes the stream of the full blocks (the old kernels in
     * the "old" run); the apply kernel is the same for every target */
    tcase_make_pos(&tc, 2, 1, 5 * BLK + 77, 5 * BLK + 77, 0, pos, np, "corrupt case");
    free(pos);
    const tcase_t *t = &tc;
    const uint64_t nb = wsync_delta_nblocks(t->n), tbl = 16 + 8 * nb;
    uint64_t pay[6];
    for (int j = 0; j < 6; j++) {
        uint32_t off, mk;
        memcpy(&off, t->cpu_enc + 16 + 8 * j, 4);
        memcpy(&mk, t->cpu_enc + 16 + 8 * j + 4, 4);
        pay[j] = tbl + off;
        static const uint32_t modes[6] = {WSYNC_DELTA_SPARSE, WSYNC_DELTA_BITMAP, WSYNC_DELTA_PLAIN,
                                          WSYNC_DELTA_SAME, WSYNC_DELTA_SPARSE, WSYNC_DELTA_BITMAP};
        CHECK_MSG(mk >> 30 == modes[j] && (mk & 0xffffu) == kp[j] && ((mk >> 16) & 0x3fffu) == ep[j],
                  "corrupt case: block %d is mode %u k %u e %u", j, mk >> 30, mk & 0xffffu,
                  (mk >> 16) & 0x3fffu);
    }
    {   /* block 0's index stream, byte for byte */
        static const uint8_t want0[16] = {0xff, 45, 0, 0xff, 0xff, 88, 0xff, 0xff, 89,
                                          0xff, 0xff, 0xff, 0xff, 0xff, 224, 0};
        CHECK_MSG(memcmp(t->cpu_enc + pay[0], want0, 16) == 0, "corrupt case: block 0's index "
                  "stream is not the one the format gives");
        CHECK_MSG(t->cpu_enc[pay[4] + 17] == 73 && t->cpu_enc[pay[4] + 16] == 0xff &&
                  t->cpu_enc[pay[4] + 11] == 195, "corrupt case: block 4's index stream");
    }
    const size_t bytes = t->buf_elems * t->es;
    uint8_t *streams = calloc(NMUT, t->cpu_len + 64);
    uint64_t *lens = calloc(NMUT, 8);
    int *cpu_ok = calloc(NMUT, sizeof(int)), *want_code = calloc(NMUT, sizeof(int));
    const size_t stride = t->cpu_len + 64, dstride = (bytes + 15) & ~(size_t)15;

    /* targeted faults first, then random byte changes anywhere */
    for (int m = 0; m < NMUT; m++) {
        uint8_t *s = streams + m * stride;
        memcpy(s, t->cpu_enc, t->cpu_len);
        lens[m] = t->cpu_len;
        want_code[m] = make_mutant(m, s, &lens[m], t, pay, tbl);
        cpu_ok[m] = wsync_delta_check(s, lens[m], t->n, t->es, "mutant") == WSYNC_OK;
    }
    /* every mutant applied by the GPU at once, each onto its own target */
    uint8_t *d_streams, *d_dst;
    CU(cudaMalloc((void **)&d_streams, NMUT * stride));
    CU(cudaMalloc((void **)&d_dst, NMUT * dstride));
    CU(cudaMemcpy(d_streams, streams, NMUT * stride, cudaMemcpyHostToDevice));
    for (int m = 0; m < NMUT; m++)
        CU(cudaMemcpy(d_dst + m * dstride, t->h_old, bytes, cudaMemcpyHostToDevice));
    wsync_kdelta_app_t *a = calloc(NMUT, sizeof(*a));
    for (int m = 0; m < NMUT; m++)
        a[m] = (wsync_kdelta_app_t){d_streams + m * stride, lens[m], d_dst + m * dstride, t->r, t->es};
    wsync_kdelta_batch_t *b = NULL;
    CHECK_OK(wsync_kdelta_apply_create(a, NMUT, 1, &b));
    if (b == NULL) {
        tcase_free(&tc);
        return;
    }
    CHECK_OK(wsync_kdelta_launch(b, NULL, NULL));
    CU(cudaDeviceSynchronize());
    const wsync_kdelta_result_t *res = wsync_kdelta_results(b);
    uint8_t *got = malloc(bytes), *cpu = malloc(bytes);
    int refused = 0, disagree = 0;
    for (int m = 0; m < NMUT; m++) {
        int gpu_ok = res[m].fault == WSYNC_KDELTA_NO_FAULT;
        refused += !gpu_ok;
        if (gpu_ok != cpu_ok[m] && disagree++ < 8)
            CHECK_MSG(0, "mutant %d: wsync_delta_check says %s, the GPU %s (fault %" PRIx64 ")",
                      m, cpu_ok[m] ? "valid" : "invalid", gpu_ok ? "applied it" : "refused it",
                      res[m].fault);
        if (want_code[m] >= 0)
            CHECK_MSG(res[m].fault != WSYNC_KDELTA_NO_FAULT &&
                      (int)(res[m].fault & 0xff) == want_code[m],
                      "mutant %d: fault %" PRIx64 ", want code %d", m, res[m].fault, want_code[m]);
        if (m <= 30) {
            int valid = m == 17 || m == 21 || m == 23 || m == 29 || m == 30;
            CHECK_MSG(cpu_ok[m] == valid && gpu_ok == valid, "targeted mutant %d: CPU %s, GPU %s, "
                      "expected %s", m, cpu_ok[m] ? "valid" : "invalid", gpu_ok ? "valid" : "invalid",
                      valid ? "valid" : "invalid");
        }
        CU(cudaMemcpy(got, d_dst + m * dstride, bytes, cudaMemcpyDeviceToHost));
        /* outside the region: untouched, always */
        int outside = 0;
        uint64_t e = 0, next = region_elem(&t->r, 0);
        for (uint64_t x = 0; x < t->buf_elems; x++) {
            if (e < t->n && x == next) {
                e++;
                next = e < t->n ? region_elem(&t->r, e) : UINT64_MAX;
                continue;
            }
            outside |= memcmp(got + x * t->es, t->h_old + x * t->es, t->es) != 0;
        }
        CHECK_MSG(!outside, "mutant %d: bytes outside the chunk's region written", m);
        if (!gpu_ok && (res[m].fault & 0xff) == WSYNC_KDELTA_FAULT_HEADER)
            CHECK_MSG(memcmp(got, t->h_old, bytes) == 0, "mutant %d: header fault, yet written", m);
        if (gpu_ok && cpu_ok[m]) {   /* a changed value: both apply the same stream alike */
            uint64_t h;
            memcpy(cpu, t->h_old, bytes);
            CHECK_OK(wsync_delta_apply(streams + m * stride, lens[m], cpu, &t->r, t->es, &h));
            CHECK_MSG(memcmp(cpu, got, bytes) == 0 && h == res[m].hash,
                      "mutant %d: GPU and CPU apply the valid stream differently", m);
            if (m == 29)
                CHECK_MSG(h == t->cpu_hash, "mutant 29: payloads swapped, the values wrong");
            if (m == 30)
                CHECK_MSG(h != t->cpu_hash, "mutant 30: a payload over another, yet the hash "
                          "of the new values");
        }
    }
    CHECK_MSG(disagree == 0, "%d of %d mutants judged differently by the GPU and the CPU check",
              disagree, NMUT);
    fprintf(stderr, "   %d of %d mutants refused (the CPU check agreeing on each)\n", refused, NMUT);
    wsync_kdelta_free(b);
    CU(cudaFree(d_streams));
    CU(cudaFree(d_dst));
    free(a);
    free(got);
    free(cpu);
    free(streams);
    free(lens);
    free(cpu_ok);
    free(want_code);
    tcase_free(&tc);
}

/* ------------------------------------------------------------------------------------------ */
/* Arguments, plain copies                                                                      */
/* ------------------------------------------------------------------------------------------ */

static void test_errors(void)
{
    const tcase_t *t = &tcs[0];
    void *out;
    wsync_kdelta_batch_t *b = NULL;
    CU(cudaMalloc(&out, t->cap + 8));
    wsync_kdelta_enc_t e = {t->d_new, t->d_old, t->r, t->es, out, t->cap};

    e.esize = 3;
    CHECK_ST(wsync_kdelta_encode_create(&e, 1, 0, &b), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("chunk 0: esize 3");
    e = (wsync_kdelta_enc_t){t->d_new, t->d_old, t->r, t->es, (uint8_t *)out + 4, t->cap};
    CHECK_ST(wsync_kdelta_encode_create(&e, 1, 0, &b), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("not 8-byte aligned");
    e = (wsync_kdelta_enc_t){t->d_new, NULL, t->r, t->es, out, t->cap};
    CHECK_ST(wsync_kdelta_encode_create(&e, 1, 0, &b), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("old_base is NULL");
    e = (wsync_kdelta_enc_t){t->d_new, t->d_old, t->r, t->es, out, t->cap};
    e.src.rows = 2;
    e.src.pitch = e.src.cols - 1;
    CHECK_ST(wsync_kdelta_encode_create(&e, 1, 0, &b), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("above the pitch");
    e = (wsync_kdelta_enc_t){t->d_new, t->d_old, {0, 1, 1, (UINT64_C(1) << 32) + 8}, 1, out, 8};
    CHECK_ST(wsync_kdelta_encode_create(&e, 1, 0, &b), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("above the format's");
    CHECK(b == NULL);
    wsync_kdelta_app_t a = {(uint8_t *)out + 1, 64, t->d_old, t->r, t->es};
    CHECK_ST(wsync_kdelta_apply_create(&a, 1, 1, &b), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("enc is not 8-byte aligned");
    a.enc = out;
    a.dst.rows = 0;
    CHECK_ST(wsync_kdelta_apply_create(&a, 1, 1, &b), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("empty region");
    CHECK(b == NULL);
    /* an empty batch launches nothing and is not an error */
    CHECK_OK(wsync_kdelta_encode_create(NULL, 0, 0, &b));
    CHECK_OK(wsync_kdelta_launch(b, NULL, NULL));
    uint64_t l = 8;
    CHECK_ST(wsync_kdelta_launch(b, &l, NULL), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("lens given to an encode batch");
    wsync_kdelta_free(b);
    wsync_kdelta_free(NULL);
    CU(cudaFree(out));
}

/* The plain path: a strided region copied as bytes by the copy kernel. */
static void test_copy_plain(void)
{
    for (int i = 0; i < ntc; i += 7) {
        tcase_t *t = &tcs[i];
        size_t bytes = t->buf_elems * t->es;
        void *dst;
        wsync_kcopy_t c;
        CU(cudaMalloc(&dst, bytes));
        CU(cudaMemcpy(dst, t->h_old, bytes, cudaMemcpyHostToDevice));
        CHECK_OK(wsync_kdelta_copy_desc(t->d_new, &t->r, dst, &t->r, t->es, &c));
        CHECK_OK(wsync_kernels_copy(&c, 1, NULL));
        CU(cudaDeviceSynchronize());
        uint8_t *want = expected_after(t), *got = malloc(bytes);
        CU(cudaMemcpy(got, dst, bytes, cudaMemcpyDeviceToHost));
        CHECK_MSG(memcmp(got, want, bytes) == 0, "%s: plain copy differs", t->label);
        free(want);
        free(got);
        CU(cudaFree(dst));
    }
    wsync_region_t r1 = {0, 4, 2, 4}, r2 = {0, 4, 4, 2};
    wsync_kcopy_t c;
    CHECK_ST(wsync_kdelta_copy_desc(tcs[0].d_new, &r1, tcs[0].d_old, &r2, 2, &c), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("differ");
}

/* ------------------------------------------------------------------------------------------ */
/* Benchmark: 1 GiB of bf16                                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef void (*launch_fn)(void *ctx);
#define BENCH_ITERS 10

/* Median seconds of one call. */
/* --profile: the bench at 1 % only, each launch once (for a profiler), no v1, no reference */
static int profile_mode;
/* the bench's fractions of changed elements (--density P, repeated: these instead) */
static double bench_dens[MAX_BENCH] = {0.01, 0.05, 0.30};
static int nbench_dens = 3, dens_given;

static double time_it(launch_fn fn, void *ctx)
{
    cudaEvent_t ev[BENCH_ITERS + 1];
    float ms[BENCH_ITERS];
    if (profile_mode) {
        fn(ctx);
        CU(cudaDeviceSynchronize());
        return 0;
    }
    fn(ctx);
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

static void batch_launch(void *ctx)
{
    if (wsync_kdelta_launch((wsync_kdelta_batch_t *)ctx, NULL, NULL) != WSYNC_OK) {
        fprintf(stderr, "delta launch: %s\n", wsync_last_error());
        exit(2);
    }
}

static struct {
    const void *a, *b;
    void *dst;
    uint64_t rows, cols, bytes;
    float *amax;
} rd;

/* Reading both versions once: an amax (a read-only reduction) over each. */
static void read_both(void *ctx)
{
    (void)ctx;
    if (wsync_kernels_amax(rd.a, WSYNC_DTYPE_BF16, rd.rows, rd.cols, rd.cols, rd.amax, NULL) != WSYNC_OK ||
        wsync_kernels_amax(rd.b, WSYNC_DTYPE_BF16, rd.rows, rd.cols, rd.cols, rd.amax + 1, NULL) != WSYNC_OK) {
        fprintf(stderr, "amax: %s\n", wsync_last_error());
        exit(2);
    }
}

/* The changed values at their positions (delta_floor_scatter): what an apply cannot do without. */
static struct {
    uint16_t *dst, *val;
    uint32_t *pos;
    uint64_t n;
} sc;

static void scatter_changes(void *ctx)
{
    (void)ctx;
    if (delta_floor_scatter(sc.dst, sc.pos, sc.val, sc.n) != 0)
        exit(2);
}

/* Both versions read and compared in one pass, nothing written (delta_floor_compare). */
static unsigned long long *cmp_count;

static void compare_both(void *ctx)
{
    (void)ctx;
    if (delta_floor_compare(rd.a, rd.b, rd.bytes, cmp_count) != 0)
        exit(2);
}

static void sectors_rmw(void *ctx)
{
    (void)ctx;
    if (delta_floor_sectors(sc.dst, sc.pos, sc.n) != 0)
        exit(2);
}

/* The encode as a sender runs it (update_old: the baseline brought to the new values), each launch
 * on a fresh copy of the old version: the time of the copy and the encode less the copy's. */
static struct {
    wsync_kdelta_batch_t *b;
    void *base;
    const void *old;
    uint64_t bytes;
} up;

static void restore_base(void *ctx)
{
    (void)ctx;
    CU(cudaMemcpyAsync(up.base, up.old, up.bytes, cudaMemcpyDeviceToDevice, NULL));
}

static void restore_and_encode(void *ctx)
{
    restore_base(ctx);
    batch_launch(up.b);
}

/* The same bytes through the copy engine: a D2D copy of one version moves both versions' bytes. */
static void d2d_one(void *ctx)
{
    (void)ctx;
    CU(cudaMemcpyAsync(rd.dst, rd.a, rd.bytes, cudaMemcpyDeviceToDevice, NULL));
}

/* The encode with update_old, as the schemes' senders run it, timed on a fresh copy of the old
 * version each launch (the copy's time subtracted): the same streams as the plain encode's
 * (er), and the baseline equal to the new values after it. */
static void bench_update(bench_row_t *row, const wsync_kdelta_enc_t *eu, uint32_t nch,
                         const wsync_kdelta_result_t *er, uint8_t *d_base, const uint8_t *d_old,
                         const uint16_t *h_new, uint64_t n)
{
    wsync_kdelta_batch_t *ebu = NULL;
    CHECK_OK(wsync_kdelta_encode_create(eu, nch, 1, &ebu));
    if (ebu != NULL) {
        up.b = ebu;
        up.base = d_base;
        up.old = d_old;
        up.bytes = n * 2;
        restore_and_encode(NULL);   /* results landed: the kernels a sender's next version runs */
        CU(cudaDeviceSynchronize());
        const double tc = time_it(restore_base, NULL), tcu = time_it(restore_and_encode, NULL);
        row->t_enc_upd = tcu - tc;
        CU(cudaDeviceSynchronize());
        const wsync_kdelta_result_t *ur = wsync_kdelta_results(ebu);
        int same = 1;
        for (uint32_t c = 0; c < nch; c++)
            same &= ur[c].len == er[c].len && ur[c].hash == er[c].hash;
        uint16_t *got = malloc(n * 2);
        if (got != NULL) {
            CU(cudaMemcpy(got, d_base, n * 2, cudaMemcpyDeviceToHost));
            same &= memcmp(got, h_new, n * 2) == 0;
            free(got);
        }
        CHECK_MSG(same, "benchmark at density %.2f: the encode with update_old: streams or "
                  "baseline not as the plain encode's", row->density);
    }
    wsync_kdelta_free(ebu);
}

/* The old kernels (WSYNC_KDELTA_OLD=1: one CTA per block) in the same run, for comparison: the
 * same lengths and hashes as the default's (er), their times. */
static void bench_old_kernels(bench_row_t *row, const wsync_kdelta_enc_t *e,
                              const wsync_kdelta_app_t *a, uint32_t nch,
                              const wsync_kdelta_result_t *er)
{
    wsync_kdelta_batch_t *eb1 = NULL, *ab1 = NULL, *ab01 = NULL;
    setenv("WSYNC_KDELTA_OLD", "1", 1);
    CHECK_OK(wsync_kdelta_encode_create(e, nch, 0, &eb1));
    CHECK_OK(wsync_kdelta_apply_create(a, nch, 1, &ab1));
    CHECK_OK(wsync_kdelta_apply_create(a, nch, 0, &ab01));
    unsetenv("WSYNC_KDELTA_OLD");
    if (eb1 != NULL && ab1 != NULL && ab01 != NULL) {
        row->old_enc = time_it(batch_launch, eb1);
        row->old_app = time_it(batch_launch, ab1);
        row->old_app_nohash = time_it(batch_launch, ab01);
        CU(cudaDeviceSynchronize());
        const wsync_kdelta_result_t *e1 = wsync_kdelta_results(eb1), *a1 = wsync_kdelta_results(ab1);
        int same1 = 1;
        for (uint32_t c = 0; c < nch; c++)
            same1 &= e1[c].len == er[c].len && e1[c].hash == er[c].hash &&
                     a1[c].fault == WSYNC_KDELTA_NO_FAULT && a1[c].hash == er[c].hash;
        CHECK_MSG(same1, "benchmark at density %.2f: WSYNC_KDELTA_OLD=1: lengths or "
                  "hashes differ from the default's", row->density);
    }
    wsync_kdelta_free(eb1);
    wsync_kdelta_free(ab1);
    wsync_kdelta_free(ab01);
}

/* What the codec is measured against, after the byte check: reading both versions (an amax over
 * each, a D2D copy of one), both read and compared in one pass (its count of changed vectors
 * checked against the update's positions h_pos), the bare scatter of the changed values into
 * d_dst, and the changed sectors read and written whole (h_pos is overwritten with them). */
static void bench_references(bench_row_t *row, uint32_t *h_pos, const uint16_t *h_val,
                             uint64_t npos, uint64_t cappos, uint8_t *d_dst)
{
    row->t_amax = time_it(read_both, NULL);
    row->t_d2d = time_it(d2d_one, NULL);
    if (h_pos != NULL && npos <= cappos) {
        /* the 16-byte vectors with a change, counted here and by the compare */
        unsigned long long nv = 0, got = 0;
        for (uint64_t i = 0; i < npos; i++)
            nv += i == 0 || h_pos[i - 1] / 8 != h_pos[i] / 8;
        CU(cudaMalloc((void **)&cmp_count, sizeof(*cmp_count)));
        row->t_cmp = time_it(compare_both, NULL);
        CU(cudaMemcpy(&got, cmp_count, sizeof(got), cudaMemcpyDeviceToHost));
        CU(cudaFree(cmp_count));
        CHECK_MSG(got == nv, "benchmark at density %.2f: the one-pass compare counted %llu changed "
                  "vectors, the update has %llu", row->density, got, nv);
    }
    row->t_read = row->t_amax < row->t_d2d ? row->t_amax : row->t_d2d;
    if (h_pos != NULL && h_val != NULL && npos <= cappos) {   /* after the byte check */
        CU(cudaMalloc((void **)&sc.pos, npos * 4));
        CU(cudaMalloc((void **)&sc.val, npos * 2));
        CU(cudaMemcpy(sc.pos, h_pos, npos * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(sc.val, h_val, npos * 2, cudaMemcpyHostToDevice));
        sc.dst = (uint16_t *)d_dst;
        sc.n = npos;
        row->t_scatter = time_it(scatter_changes, NULL);
        {   /* the changed 32-byte sectors, read and written whole (in place of h_pos) */
            uint64_t ns = 0;
            for (uint64_t i = 0; i < npos; i++)
                if (ns == 0 || h_pos[ns - 1] != h_pos[i] / 16)
                    h_pos[ns++] = h_pos[i] / 16;
            CU(cudaMemcpy(sc.pos, h_pos, ns * 4, cudaMemcpyHostToDevice));
            sc.n = ns;
            row->t_sectors = time_it(sectors_rmw, NULL);
        }
        CU(cudaFree(sc.pos));
        CU(cudaFree(sc.val));
    }
    row->read_ref = row->t_amax < row->t_d2d ? "amax over new and old" : "cudaMemcpy D2D of one version";
}

static void bench_print(const bench_row_t *row, uint64_t n)
{
    fprintf(stderr, "   density %.2f: changed %.4f, wire %.1f%%, encode %.1f us, apply %.1f us "
            "(with the receiver's hash %.1f us), read both %.1f us (amax %.1f, D2D %.1f): "
            "encode + apply %.2f x (with the hash %.2f x)\n",
            row->density, row->changed_fraction, 100.0 * (double)row->wire_bytes / (double)(n * 2),
            row->t_enc * 1e6, row->t_app_nohash * 1e6, row->t_app * 1e6, row->t_read * 1e6,
            row->t_amax * 1e6, row->t_d2d * 1e6, (row->t_enc + row->t_app_nohash) / row->t_read,
            (row->t_enc + row->t_app) / row->t_read);
    fprintf(stderr, "      encode with the baseline update (update_old, as senders run it) %.1f us; "
            "both versions read and compared in one pass, nothing else %.1f us (%.3f x read both)\n",
            row->t_enc_upd * 1e6, row->t_cmp * 1e6, row->t_cmp / row->t_read);
    fprintf(stderr, "      the changed values' bare scatter %.1f us: (read both + scatter) / read both "
            "= %.2f x, the least the ratio can be (the changed sectors read and written whole: "
            "%.1f us)\n", row->t_scatter * 1e6, (row->t_read + row->t_scatter) / row->t_read,
            row->t_sectors * 1e6);
    fprintf(stderr, "      old kernels (WSYNC_KDELTA_OLD=1): encode %.1f us, apply %.1f us (with "
            "the hash %.1f us): %.2f x (%.2f x)\n", row->old_enc * 1e6,
            row->old_app_nohash * 1e6, row->old_app * 1e6,
            (row->old_enc + row->old_app_nohash) / row->t_read,
            (row->old_enc + row->old_app) / row->t_read);
}

static void run_bench(void)
{
    const uint64_t N = UINT64_C(1) << 29;      /* bf16 elements: 1 GiB */
    const uint32_t NCH = 64;                   /* chunks of 16 MiB, as buckets carry them */
    const uint64_t per = N / NCH;
    const double *dens = bench_dens;
    uint16_t *h_old = malloc(N * 2), *h_new = malloc(N * 2);
    uint8_t *d_old, *d_new, *d_dst, *d_out, *d_base;
    const uint64_t cap = (wsync_delta_max_bytes(per, 2) + 7) & ~(uint64_t)7;

    if (h_old == NULL || h_new == NULL) {
        CHECK_MSG(0, "no host memory for the benchmark");
        return;
    }
    CU(cudaMalloc((void **)&d_old, N * 2));
    CU(cudaMalloc((void **)&d_new, N * 2));
    CU(cudaMalloc((void **)&d_dst, N * 2));
    CU(cudaMalloc((void **)&d_base, N * 2));
    CU(cudaMalloc((void **)&d_out, cap * NCH));
    CU(cudaMalloc((void **)&rd.amax, 8));
    /* bf16 weights of unit scale: sign, exponent 120..127, random mantissa */
    for (uint64_t i = 0; i < N; i += 4) {
        uint64_t r = rnd();
        for (int k = 0; k < 4; k++) {
            uint16_t x = (uint16_t)(r >> (16 * k));
            h_old[i + k] = (uint16_t)((x & 0x807f) | ((0x78 + ((x >> 7) & 7)) << 7));
        }
    }
    CU(cudaMemcpy(d_old, h_old, N * 2, cudaMemcpyHostToDevice));
    rd.a = d_new;
    rd.b = d_old;
    rd.dst = d_dst;
    rd.rows = 16384;
    rd.cols = N / 16384;
    rd.bytes = N * 2;

    wsync_kdelta_enc_t *e = calloc(NCH, sizeof(*e)), *eu = calloc(NCH, sizeof(*eu));
    wsync_kdelta_app_t *a = calloc(NCH, sizeof(*a));
    for (uint32_t c = 0; c < NCH; c++) {
        wsync_region_t r = {c * per, per, 1, per};
        e[c] = (wsync_kdelta_enc_t){d_new, d_old, r, 2, d_out + c * cap, cap};
        eu[c] = (wsync_kdelta_enc_t){d_new, d_base, r, 2, d_out + c * cap, cap};
        a[c] = (wsync_kdelta_app_t){d_out + c * cap, 0, d_dst, r, 2};
    }
    fprintf(stderr, "-- 1 GiB bf16 in %u chunks, medians of %d\n", NCH, BENCH_ITERS);
    for (int di = 0; di < (profile_mode ? 1 : nbench_dens) && nbench < MAX_BENCH; di++) {
        bench_row_t *row = &bench[nbench++];
        memset(row, 0, sizeof(*row));
        row->density = dens[di];
        row->elements = N;
        /* an update: each element moves one ulp with probability p (the gaps between changed
         * elements drawn from the geometric distribution: one draw per change) */
        const double lq = log(1.0 - dens[di]);
        const uint64_t cappos = (uint64_t)((double)N * dens[di] * 1.2) + 4096;
        uint32_t *h_pos = malloc(cappos * 4);
        uint16_t *h_val = malloc(cappos * 2);
        uint64_t npos = 0;
        memcpy(h_new, h_old, N * 2);
        for (uint64_t i = (uint64_t)(log(1.0 - unit()) / lq); i < N;
             i += 1 + (uint64_t)(log(1.0 - unit()) / lq)) {
            h_new[i] ^= 1;
            if (h_pos != NULL && h_val != NULL && npos < cappos) {
                h_pos[npos] = (uint32_t)i;
                h_val[npos] = h_new[i];
            }
            npos++;
        }
        CU(cudaMemcpy(d_new, h_new, N * 2, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(d_dst, d_old, N * 2, cudaMemcpyDeviceToDevice));

        wsync_kdelta_batch_t *eb = NULL, *ab = NULL, *ab0 = NULL;
        CHECK_OK(wsync_kdelta_encode_create(e, NCH, 0, &eb));
        if (eb == NULL)
            break;
        /* a launch whose results landed first: an encode batch picks its kernels from the
         * last such launch, as a sender's next version does */
        batch_launch(eb);
        CU(cudaDeviceSynchronize());
        row->t_enc = time_it(batch_launch, eb);
        CU(cudaDeviceSynchronize());
        const wsync_kdelta_result_t *er = wsync_kdelta_results(eb);
        uint64_t hash_ok = 1;
        for (uint32_t c = 0; c < NCH; c++) {
            a[c].len = er[c].len;
            row->wire_bytes += er[c].len;
            row->changed += er[c].changed;
        }
        row->changed_fraction = (double)row->changed / (double)N;
        CHECK_OK(wsync_kdelta_apply_create(a, NCH, 1, &ab));
        CHECK_OK(wsync_kdelta_apply_create(a, NCH, 0, &ab0));
        if (ab == NULL || ab0 == NULL)
            break;
        /* applying the same stream again writes the same values: each launch does the same work */
        row->t_app = time_it(batch_launch, ab);
        row->t_app_nohash = time_it(batch_launch, ab0);
        CU(cudaDeviceSynchronize());
        const wsync_kdelta_result_t *ar = wsync_kdelta_results(ab);
        for (uint32_t c = 0; c < NCH; c++)
            hash_ok &= ar[c].fault == WSYNC_KDELTA_NO_FAULT && ar[c].hash == er[c].hash;
        /* byte check of the result and of one chunk's stream against the CPU encoder */
        {
            uint16_t *got = malloc(N * 2);
            CU(cudaMemcpy(got, d_dst, N * 2, cudaMemcpyDeviceToHost));
            int same = memcmp(got, h_new, N * 2) == 0;
            uint8_t *cpu = malloc(cap), *gpu = malloc(cap);
            uint64_t cl = 0, ch = 0;
            wsync_region_t r0 = {0, per, 1, per};
            CHECK_OK(wsync_delta_encode(h_new, h_old, &r0, 2, cpu, cap, &cl, &ch, NULL));
            CU(cudaMemcpy(gpu, d_out, er[0].len, cudaMemcpyDeviceToHost));
            char why[160];
            same &= cl == er[0].len && ch == er[0].hash &&
                     !stream_diff(gpu, cpu, cl, per, why, sizeof(why));
            row->correct = same && hash_ok;
            CHECK_MSG(row->correct, "benchmark at density %.2f: result not byte-equal (target %d, "
                      "hashes %d)", dens[di], same, (int)hash_ok);
            free(got);
            free(cpu);
            free(gpu);
        }
        if (!profile_mode) {
            bench_update(row, eu, NCH, er, d_base, d_old, h_new, N);
            bench_old_kernels(row, e, a, NCH, er);
        }
        bench_references(row, h_pos, h_val, npos, cappos, d_dst);
        free(h_pos);
        free(h_val);
        bench_print(row, N);
        wsync_kdelta_free(eb);
        wsync_kdelta_free(ab);
        wsync_kdelta_free(ab0);
    }
    free(e);
    free(eu);
    free(a);
    free(h_old);
    free(h_new);
    CU(cudaFree(d_old));
    CU(cudaFree(d_new));
    CU(cudaFree(d_dst));
    CU(cudaFree(d_base));
    CU(cudaFree(d_out));
    CU(cudaFree(rd.amax));
}

static void bench_json(FILE *f, const bench_row_t *r, const char *device)
{
    fprintf(f, "{\"bench\": \"delta_kernels\", \"device\": \"%s\", \"dtype\": \"bf16\", "
            "\"elements\": %" PRIu64 ", \"density\": %.2f, \"changed\": %" PRIu64
            ", \"changed_fraction\": %.6f, \"wire_bytes\": %" PRIu64 ", \"full_bytes\": %" PRIu64
            ", \"encode_us\": %.1f, \"apply_us\": %.1f, \"apply_nohash_us\": %.1f, "
            "\"read_both_us\": %.1f, \"read_ref\": \"%s\", \"amax_both_us\": %.1f, "
            "\"d2d_us\": %.1f, \"ratio\": %.3f, \"ratio_def\": \"(encode_us + apply_nohash_us) / "
            "read_both_us: the codec kernels; the receiver's hash is the separate check\", "
            "\"ratio_with_hash\": %.3f, \"target\": 1.5, \"met\": %s, \"correct\": %s, "
            "\"kernel\": \"warp kernels (wkw_delta_encode, wkw_delta_apply: a warp per full block "
            "of dense 16-byte aligned chunks)\", \"old_kernel\": \"WSYNC_KDELTA_OLD=1: a CTA per "
            "block (wk_delta_encode, wk_delta_apply)\", \"old_encode_us\": %.1f, \"old_apply_us\": %.1f, "
            "\"old_apply_nohash_us\": %.1f, \"old_ratio\": %.3f, \"scatter_us\": %.1f, "
            "\"floor_ratio\": %.3f, \"floor_def\": \"(read_both_us + scatter_us) / read_both_us: an "
            "encode that only reads both versions and an apply that only writes the changed values "
            "at their positions (a bare scatter from a list)\", \"sectors_us\": %.1f, "
            "\"encode_update_us\": %.1f, \"compare_us\": %.1f, \"compare_def\": \"both versions "
            "read once in one grid-stride pass and compared, nothing written: an encoder's reads "
            "alone\"}",
            device, r->elements, r->density, r->changed, r->changed_fraction, r->wire_bytes,
            r->elements * 2, r->t_enc * 1e6, r->t_app * 1e6, r->t_app_nohash * 1e6,
            r->t_read * 1e6, r->read_ref, r->t_amax * 1e6, r->t_d2d * 1e6,
            (r->t_enc + r->t_app_nohash) / r->t_read, (r->t_enc + r->t_app) / r->t_read,
            (r->t_enc + r->t_app_nohash) / r->t_read <= 1.5 ? "true" : "false",
            r->correct ? "true" : "false", r->old_enc * 1e6, r->old_app * 1e6,
            r->old_app_nohash * 1e6, (r->old_enc + r->old_app_nohash) / r->t_read,
            r->t_scatter * 1e6, (r->t_read + r->t_scatter) / r->t_read, r->t_sectors * 1e6,
            r->t_enc_upd * 1e6, r->t_cmp * 1e6);
}

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
        fprintf(f, "    ");
        bench_json(f, &bench[i], device);
        fprintf(f, "%s\n", i + 1 < nbench ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    fclose(f);
}

int main(int argc, char **argv)
{
    const char *json = NULL;
    int do_bench = 1, bench_only = 0;
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
        else if (strcmp(argv[i], "--bench-only") == 0)
            bench_only = 1;
        else if (strcmp(argv[i], "--profile") == 0)
            profile_mode = 1;
        else if (strcmp(argv[i], "--density") == 0 && i + 1 < argc) {
            const double p = strtod(argv[++i], NULL);
            if (!(p > 0 && p < 1) || (dens_given && nbench_dens == MAX_BENCH)) {
                fprintf(stderr, "--density: %s is not a fraction in (0, 1), or more than %d\n",
                        argv[i], MAX_BENCH);
                return 2;
            }
            if (!dens_given)
                nbench_dens = 0;
            dens_given = 1;
            bench_dens[nbench_dens++] = p;
        } else {
            fprintf(stderr, "usage: %s [--seed S] [--no-bench | --bench-only] [--profile] "
                    "[--density P ...] [--json PATH]\n", argv[0]);
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

    if (!profile_mode && !bench_only) {
        run_case("cases (CPU encoder)", make_all_cases);
        run_case("xxh3", test_xxh3);
        /* the old kernels (one CTA per block everywhere); then the default (a warp per full
         * block of the dense 16-byte aligned chunks, encode and apply; one CTA per block for the
         * rest) */
        setenv("WSYNC_KDELTA_OLD", "1", 1);
        run_case("encode (old)", test_encode);
        run_case("apply (old)", test_apply);
        run_case("corrupt (old)", test_corrupt);
        unsetenv("WSYNC_KDELTA_OLD");
        run_case("encode", test_encode);
        run_case("apply", test_apply);
        run_case("corrupt", test_corrupt);
        /* the warp kernels on every case (the default picks by the batch's density, and these
         * batches are dense), over an odd count of chunks (the device arrays after the lengths
         * start 8 bytes past a multiple of 16 unless aligned: the warp apply's records are read
         * as uint4) */
        setenv("WSYNC_KDELTA_WARP", "1", 1);
        const int nall = ntc;
        ntc = nall - 1 + (nall & 1);
        run_case("encode (warp)", test_encode);
        run_case("apply (warp)", test_apply);
        run_case("corrupt (warp)", test_corrupt);
        ntc = nall;
        unsetenv("WSYNC_KDELTA_WARP");
        run_case("errors", test_errors);
        run_case("copy_plain", test_copy_plain);
        for (int i = 0; i < ntc; i++)
            tcase_free(&tcs[i]);
    }
    if (do_bench || profile_mode)
        run_case("bench", run_bench);

    printf("\n%-22s %s\n", "case", "result");
    for (int i = 0; i < ncases; i++)
        printf("%-22s %s\n", cases[i].name, cases[i].failures ? "FAIL" : "pass");
    for (int i = 0; i < nbench; i++) {
        bench_json(stdout, &bench[i], prop.name);
        printf("\n");
    }
    if (json != NULL)
        write_json(json, prop.name, seed);
    return check_summary();
}
