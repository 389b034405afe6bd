/* FP8 on the wire, at the CPU executor: senders quantize their chunks into buckets
 * (wsync_exec_pack_wire), receivers copy codes and scales out (wsync_exec_unpack_wire), and
 * every target's codes and scales must equal, byte for byte, wsync_quantize_f32 of the whole
 * target assembled from the params' full values (what a receiver quantizing itself makes).
 * Values span many magnitudes per cell (UE8M0 rounding, saturation at the cell's amax, cells
 * under eps, all-zero cells); shapes are not multiples of the blocks. */
#include "core/status.h"
#include "reshard/convert.h"
#include "reshard/exec.h"
#include "reshard/fp8.h"
#include "reshard/plan.h"
#include "tests/support/check.h"
#include "tests/support/fp8_wire_fixtures.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BF16 WSYNC_DTYPE_BF16
#define F16 WSYNC_DTYPE_F16
#define F32 WSYNC_DTYPE_F32
#define E4M3 WSYNC_DTYPE_F8E4M3FN
#define E5M2 WSYNC_DTYPE_F8E5M2
#define BLOCK WSYNC_QUANT_BLOCK
#define CHANNEL WSYNC_QUANT_CHANNEL
#define MiB (1u << 20)
#define POISON 0xA5

/* ------------------------------------------------------------------------------------------ */
/* Params with their whole values                                                               */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    const char *name;
    wsync_dtype_t dt;
    int64_t rows, cols;
    void *full;                      /* [rows, cols] of dt */
} param_t;

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

/* A value whose magnitude depends on its 32 x 32 patch (so that cells differ: some zero, some
 * under eps, some huge) and whose mantissa is random. */
static float value(uint64_t seed, int64_t r, int64_t c)
{
    uint64_t patch = mix(seed * 1000003u + (uint64_t)(r / 32) * 7919u + (uint64_t)(c / 32));
    uint64_t h = mix(seed ^ ((uint64_t)r << 32) ^ (uint64_t)c ^ 0x9e3779b97f4a7c15ULL);
    int kind = (int)(patch % 16);
    float m = (float)(h % 1000001u) / 1000000.0f * ((h >> 40) & 1 ? -1.0f : 1.0f);

    if (kind == 0)
        return 0.0f;                                     /* an all-zero patch: scale 1 */
    if (kind == 1)
        return m * 3e-6f;                                /* amax under eps (1e-4) */
    return m * (float)(1u << (patch >> 8) % 20) * 0.37f; /* up to ~2e5: past e4m3 and e5m2 */
}

static void put(void *buf, uint64_t i, wsync_dtype_t dt, float v)
{
    if (dt == BF16)
        ((uint16_t *)buf)[i] = wsync_f32_to_bf16(v);
    else if (dt == F16)
        ((uint16_t *)buf)[i] = wsync_f32_to_f16(v);
    else
        ((float *)buf)[i] = v;
}

static float get(const void *buf, uint64_t i, wsync_dtype_t dt)
{
    if (dt == BF16)
        return wsync_bf16_to_f32(((const uint16_t *)buf)[i]);
    if (dt == F16)
        return wsync_f16_to_f32(((const uint16_t *)buf)[i]);
    return ((const float *)buf)[i];
}

static param_t param_new(const char *name, wsync_dtype_t dt, int64_t rows, int64_t cols,
                         uint64_t seed)
{
    param_t p = {name, dt, rows, cols, malloc((size_t)(rows * cols) * wsync_dtype_size(dt))};
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            put(p.full, (uint64_t)(r * cols + c), dt,
                value(seed, r, c) * (dt == F16 ? 1.0f / 32.0f : 1.0f));   /* f16 ends at 65504 */
    return p;
}

/* ------------------------------------------------------------------------------------------ */
/* A group: shards with data, targets with buffers                                              */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    fw_group_t d;                    /* descriptions (tests/support/fp8_wire_fixtures.h) */
    void *sdata[16];                 /* each shard's rows */
    const param_t *tparam[16][4];    /* each piece's param */
    uint8_t *codes[16];
    float *scales[16];
} group_t;

/* Sender `sender` holds rows [r0, r0 + nr) of the param (dense copy). */
static void add_shard(group_t *g, uint32_t sender, const param_t *pa, int64_t r0, int64_t nr)
{
    size_t esz = wsync_dtype_size(pa->dt), n = (size_t)(nr * pa->cols) * esz;

    g->sdata[g->d.ns] = malloc(n + 1);
    memcpy(g->sdata[g->d.ns], (uint8_t *)pa->full + (size_t)(r0 * pa->cols) * esz, n);
    fw_add_shard(&g->d, sender, pa->name, pa->dt, pa->rows, pa->cols, r0, nr);
}

/* FSDP over rows at the given cuts: sender k holds [cut[k], cut[k + 1]). */
static void add_fsdp(group_t *g, const param_t *pa, const int64_t *cuts, int nsenders)
{
    for (int k = 0; k < nsenders; k++)
        add_shard(g, (uint32_t)k, pa, cuts[k], cuts[k + 1] - cuts[k]);
}

/* A piece of the last target: rows [r0, r0 + nr), columns [c0, c0 + nc) of pa at (dr, 0). */
static void add_piece(group_t *g, const param_t *pa, int64_t r0, int64_t nr, int64_t c0,
                      int64_t nc, int64_t dr)
{
    wsync_target_desc_t *t = &g->d.t[g->d.nt - 1];

    g->tparam[g->d.nt - 1][t->npieces] = pa;
    fw_add_piece(&g->d, pa->name, pa->dt, pa->rows, pa->cols, r0, nr, c0, nc, dr, 0);
}

/* A target of `receiver` that is the whole param. */
static void add_whole(group_t *g, uint32_t receiver, const char *name, const param_t *pa,
                      wsync_dtype_t dt, wsync_quant_scheme_t quant, int br, int bc, int ue8m0,
                      int no_sat)
{
    fw_add_target(&g->d, receiver, name, dt, pa->rows, pa->cols, quant, br, bc, ue8m0, no_sat);
    add_piece(g, pa, 0, pa->rows, 0, pa->cols, 0);
}

static wsync_quant_t quant_of(const wsync_target_desc_t *t)
{
    wsync_quant_t q;
    memset(&q, 0, sizeof(q));
    q.scheme = t->quant;
    q.block_rows = t->block_rows;
    q.block_cols = t->block_cols;
    q.eps = t->eps;
    q.ue8m0 = t->ue8m0;
    q.no_saturate = t->no_saturate;
    return q;
}

static void scales_shape(const wsync_target_desc_t *t, int64_t *sr, int64_t *sc)
{
    wsync_quant_t q = quant_of(t);
    CHECK_OK(wsync_quant_scales_shape(&q, t->shape[0], t->shape[1], sr, sc));
}

/* Frees the group's data and buffers and empties it. */
static void group_free(group_t *g)
{
    for (size_t i = 0; i < g->d.ns; i++)
        free(g->sdata[i]);
    for (size_t i = 0; i < g->d.nt; i++) {
        free(g->codes[i]);
        free(g->scales[i]);
    }
    memset(g, 0, sizeof(*g));
}

/* ------------------------------------------------------------------------------------------ */
/* Pack, unpack, and the reference                                                              */
/* ------------------------------------------------------------------------------------------ */

static size_t shard_of(const group_t *g, const wsync_chunk_t *ch)
{
    for (size_t i = 0; i < g->d.ns; i++)
        if (g->d.s[i].sender == ch->sender && g->d.s[i].index == ch->shard)
            return i;
    return SIZE_MAX;
}

static size_t target_of(const group_t *g, const wsync_segment_t *sg)
{
    for (size_t i = 0; i < g->d.nt; i++)
        if (g->d.t[i].receiver == sg->receiver && g->d.t[i].index == sg->target)
            return i;
    return SIZE_MAX;
}

/* Every sender's buckets, one after another (sender-major, as plan->bucket_used). */
static uint8_t *bucket_at(uint8_t *all, const wsync_plan_t *p, const wsync_chunk_t *ch)
{
    uint64_t k = 0;
    for (uint32_t s = 0; s < ch->sender; s++)
        k += p->nbuckets[s];
    return all + (k + ch->bucket) * p->bucket_bytes;
}

static uint64_t total_buckets(const wsync_plan_t *p)
{
    uint64_t k = 0;
    for (uint32_t s = 0; s < p->nsenders; s++)
        k += p->nbuckets[s];
    return k;
}

/* Pack every chunk: the buckets' bytes no chunk owns keep the poison. */
static void pack_all(group_t *g, const wsync_plan_t *p, uint8_t *all)
{
    uint64_t nb = total_buckets(p), bytes = nb * p->bucket_bytes;
    uint8_t *owned = calloc((size_t)bytes, 1);

    for (uint32_t i = 0; i < p->nchunks; i++) {
        const wsync_chunk_t *ch = &p->chunks[i];
        size_t s = shard_of(g, ch);
        uint8_t *b = bucket_at(all, p, ch);
        CHECK(s != SIZE_MAX);
        if (s == SIZE_MAX)
            continue;
        CHECK_OK(wsync_exec_pack_wire(p, ch, g->d.s[s].param.name, g->sdata[s], b));
        memset(owned + (b - all) + ch->bucket_off, 1, (size_t)wsync_chunk_wire_bytes(ch));
    }
    for (uint64_t k = 0; k < bytes; k++)
        if (!owned[k] && all[k] != POISON) {
            CHECK_MSG(0, "bucket byte %llu, in no chunk, was written",
                      (unsigned long long)k);
            break;
        }
    free(owned);
}

static void unpack_all(group_t *g, const wsync_plan_t *p, uint8_t *all)
{
    for (size_t i = 0; i < g->d.nt; i++) {
        int64_t sr = 0, sc = 0;
        size_t n = (size_t)(g->d.t[i].shape[0] * g->d.t[i].shape[1]);
        scales_shape(&g->d.t[i], &sr, &sc);
        g->codes[i] = malloc(n);
        g->scales[i] = malloc((size_t)(sr * sc) * sizeof(float) + 1);
        memset(g->codes[i], 0xEE, n);
        memset(g->scales[i], 0xEE, (size_t)(sr * sc) * sizeof(float));
    }
    wsync_segment_t *S = NULL;
    CHECK_OK(wsync_plan_flatten(p, &S));
    for (uint32_t i = 0; S != NULL && i < p->nsegments; i++) {
        const wsync_segment_t *sg = &S[i];
        const wsync_chunk_t *ch = &p->chunks[sg->chunk];
        size_t t = target_of(g, sg);
        CHECK(t != SIZE_MAX);
        if (t == SIZE_MAX)
            continue;
        CHECK_OK(wsync_exec_unpack_wire(p, sg, ch, bucket_at(all, p, ch), &g->d.t[t], g->codes[t],
                                        g->scales[t]));
    }
    free(S);
}

/* The whole target as f32 from its pieces' params, quantized by the reference; compared. */
static void check_target(const group_t *g, size_t i)
{
    const wsync_target_desc_t *t = &g->d.t[i];
    uint64_t rows = (uint64_t)t->shape[0], cols = (uint64_t)t->shape[1];
    float *x = calloc((size_t)(rows * cols), sizeof(float));
    float *staged = calloc((size_t)(rows * cols), sizeof(float));
    uint8_t *want = malloc((size_t)(rows * cols));
    int64_t sr = 0, sc = 0;
    float *wscales;
    wsync_quant_t q = quant_of(t);

    scales_shape(t, &sr, &sc);
    wscales = malloc((size_t)(sr * sc) * sizeof(float) + 1);
    for (uint32_t k = 0; k < t->npieces; k++) {
        const wsync_piece_desc_t *pc = &t->pieces[k];
        const param_t *pa = g->tparam[i][k];
        for (int64_t r = 0; r < pc->src.len[0]; r++)
            for (int64_t c = 0; c < pc->src.len[1]; c++)
                x[(uint64_t)(pc->dst_start[0] + r) * cols + (uint64_t)(pc->dst_start[1] + c)] =
                    get(pa->full, (uint64_t)((pc->src.start[0] + r) * pa->cols +
                                             pc->src.start[1] + c), pa->dt);
    }
    /* the receiver quantizing itself converts through its staging copy (wsync_exec_copy into
     * f32, receiver.c's land[i]): those values, bit for bit, or the codes could not agree */
    for (uint32_t k = 0; k < t->npieces; k++) {
        const wsync_piece_desc_t *pc = &t->pieces[k];
        const param_t *pa = g->tparam[i][k];
        wsync_region_t from = {(uint64_t)(pc->src.start[0] * pa->cols + pc->src.start[1]),
                               (uint64_t)pa->cols, (uint64_t)pc->src.len[0],
                               (uint64_t)pc->src.len[1]};
        wsync_region_t to = {(uint64_t)pc->dst_start[0] * cols + (uint64_t)pc->dst_start[1], cols,
                             (uint64_t)pc->src.len[0], (uint64_t)pc->src.len[1]};
        CHECK_OK(wsync_exec_copy(pa->full, pa->dt, &from, staged, F32, &to));
    }
    CHECK_MSG(memcmp(staged, x, (size_t)(rows * cols) * sizeof(float)) == 0,
              "target '%s': the receiver's staging copy converts some value differently",
              t->name);
    CHECK_OK(wsync_quantize_f32(t->name, x, rows, cols, cols, &q, t->dtype, want, cols, wscales));
    for (uint64_t k = 0; k < rows * cols; k++)
        if (g->codes[i][k] != want[k]) {
            CHECK_MSG(0, "target '%s' (receiver %u): code at row %llu, column %llu is %02x, the "
                      "reference %02x", t->name, t->receiver, (unsigned long long)(k / cols),
                      (unsigned long long)(k % cols), g->codes[i][k], want[k]);
            break;
        }
    CHECK_MSG(memcmp(g->scales[i], wscales, (size_t)(sr * sc) * sizeof(float)) == 0,
              "target '%s' (receiver %u): scales differ from the reference", t->name,
              t->receiver);
    free(x);
    free(staged);
    free(want);
    free(wscales);
}

/* Compile with FP8 on the wire (every chunk must take it), pack, unpack, compare; then free
 * the group's buffers and empty it for the next. Returns the number of chunks. */
static uint32_t run_group(group_t *g, uint32_t ns, uint32_t nr, uint64_t bucket)
{
    wsync_plan_t *p = NULL;
    wsync_plan_opts_t o = {.fp8_wire = 1};
    uint8_t *all;
    uint32_t n = 0;

    CHECK_OK(wsync_plan_compile_opts(g->d.s, g->d.ns, g->d.t, g->d.nt, ns, nr, bucket, &o, &p));
    if (p != NULL) {
        CHECK_OK(wsync_plan_check_receiver(p, 0, g->d.t, g->d.nt)); /* receiver 0's, sorted */
        for (uint32_t i = 0; i < p->nchunks; i++)
            n += p->chunks[i].rule != 0;
        CHECK_MSG(n == p->nchunks && n > 0, "%u of %u chunks travel as FP8", n, p->nchunks);
        all = malloc((size_t)(total_buckets(p) * p->bucket_bytes));
        memset(all, POISON, (size_t)(total_buckets(p) * p->bucket_bytes));
        pack_all(g, p, all);
        unpack_all(g, p, all);
        for (size_t i = 0; i < g->d.nt; i++)
            check_target(g, i);
        free(all);
        n = p->nchunks;
        wsync_plan_free(p);
    }
    group_free(g);
    return n;
}

/* ------------------------------------------------------------------------------------------ */
/* Cases                                                                                        */
/* ------------------------------------------------------------------------------------------ */

/* bf16 [300, 200] FSDP-2 cut at 256 into 128x128 e4m3 blocks; then the same with buckets that
 * hold one row of cells, so chunks split at cell rows. */
static void test_block128_bf16(void)
{
    param_t w = param_new("model.layers.0.mlp.down_proj.weight", BF16, 300, 200, 1);
    const int64_t cuts[] = {0, 256, 300};
    group_t g;

    memset(&g, 0, sizeof(g));
    for (int small = 0; small < 2; small++) {
        add_fsdp(&g, &w, cuts, 2);
        add_whole(&g, 0, "down.fp8", &w, E4M3, BLOCK, 128, 128, 0, 0);
        uint32_t n = run_group(&g, 2, 1, small ? 128u * 200u + 64u : 1 * MiB);
        CHECK_MSG(small ? n == 3 : n == 2, "%u chunks", n);
    }
    free(w.full);
}

/* f32 [200, 300] FSDP-3 cut at 64 and 128 into 64x128 blocks, plain and UE8M0, on two
 * receivers each (two targets per receiver of the same param). */
static void test_block64_ue8m0_f32(void)
{
    param_t w = param_new("w64", F32, 200, 300, 2);
    param_t v = param_new("v64", F32, 200, 300, 3);
    const int64_t cuts[] = {0, 64, 128, 200};
    group_t g;

    memset(&g, 0, sizeof(g));
    add_fsdp(&g, &w, cuts, 3);
    add_fsdp(&g, &v, cuts, 3);
    for (uint32_t r = 0; r < 2; r++) {
        add_whole(&g, r, "w64.fp8", &w, E4M3, BLOCK, 64, 128, 0, 0);
        add_whole(&g, r, "v64.fp8", &v, E4M3, BLOCK, 64, 128, 1, 0);
    }
    run_group(&g, 3, 2, 1 * MiB);
    free(w.full);
    free(v.full);
}

/* Channel scales: bf16 [100, 333] cut at row 37 (any row is a cell row), e4m3 and e5m2, and a
 * no-saturate f32 one; then TP column slices of a row-parallel param (strided chunks). */
static void test_channel(void)
{
    param_t a = param_new("a", BF16, 100, 333, 4);
    param_t b = param_new("b", BF16, 100, 333, 5);
    param_t c = param_new("c", F32, 100, 333, 6);
    param_t o = param_new("o_proj", BF16, 96, 512, 7);
    const int64_t cuts[] = {0, 37, 100}, ocuts[] = {0, 48, 96};
    group_t g;

    memset(&g, 0, sizeof(g));
    add_fsdp(&g, &a, cuts, 2);
    add_fsdp(&g, &b, cuts, 2);
    add_fsdp(&g, &c, cuts, 2);
    add_whole(&g, 0, "a.fp8", &a, E4M3, CHANNEL, 0, 0, 0, 0);
    add_whole(&g, 0, "b.fp8", &b, E5M2, CHANNEL, 0, 0, 0, 0);
    add_whole(&g, 0, "c.fp8", &c, E4M3, CHANNEL, 0, 0, 0, 1);
    run_group(&g, 2, 1, 1 * MiB);

    add_fsdp(&g, &o, ocuts, 2);
    for (uint32_t r = 0; r < 2; r++) {
        fw_add_target(&g.d, r, "o_proj.fp8", E4M3, 96, 256, CHANNEL, 0, 0, 0, 0);
        add_piece(&g, &o, 0, 96, (int64_t)r * 256, 256, 0);
    }
    run_group(&g, 2, 2, 1 * MiB);
    free(a.full);
    free(b.full);
    free(c.full);
    free(o.full);
}

/* E5M2 blocks from f16 [260, 130], FSDP-2 cut at 128; and a TP column slice of 128x128 blocks
 * (columns 128.. of a [256, 384] param: the second slice ends at the edge, 128 wide). */
static void test_block_e5m2_and_slices(void)
{
    param_t w = param_new("w16", F16, 260, 130, 8);
    param_t u = param_new("up", BF16, 256, 384, 9);
    const int64_t cuts[] = {0, 128, 260}, ucuts[] = {0, 128, 256};
    group_t g;

    memset(&g, 0, sizeof(g));
    add_fsdp(&g, &w, cuts, 2);
    add_whole(&g, 0, "w16.fp8", &w, E5M2, BLOCK, 128, 128, 0, 0);
    run_group(&g, 2, 1, 1 * MiB);

    add_fsdp(&g, &u, ucuts, 2);
    fw_add_target(&g.d, 0, "up.0", E4M3, 256, 256, BLOCK, 128, 128, 0, 0);
    add_piece(&g, &u, 0, 256, 0, 256, 0);
    fw_add_target(&g.d, 1, "up.1", E4M3, 256, 128, BLOCK, 128, 128, 1, 0);
    add_piece(&g, &u, 0, 256, 256, 128, 0);
    run_group(&g, 2, 2, 1 * MiB);
    free(w.full);
    free(u.full);
}

/* Fused: q [256, 192] and k [128, 192] stacked on rows into one [384, 192] target of 128x128
 * blocks, q FSDP-2 at 128 and k on sender 1 whole: both aligned. */
static void test_fused_rows(void)
{
    param_t q = param_new("q_proj", BF16, 256, 192, 10);
    param_t k = param_new("k_proj", BF16, 128, 192, 11);
    const int64_t qcuts[] = {0, 128, 256};
    group_t g;

    memset(&g, 0, sizeof(g));
    add_fsdp(&g, &q, qcuts, 2);
    add_shard(&g, 1, &k, 0, 128);
    fw_add_target(&g.d, 0, "qk_proj.fp8", E4M3, 384, 192, BLOCK, 128, 128, 0, 0);
    add_piece(&g, &q, 0, 256, 0, 192, 0);
    add_piece(&g, &k, 0, 128, 0, 192, 256);
    run_group(&g, 2, 1, 1 * MiB);
    free(q.full);
    free(k.full);
}

/* Chunks wider than the packer's tile (16 cells of 128 x 128 a tile: [256, 2200] has rows of
 * 18 cells, the last 24 wide) and taller than a channel tile (64 rows: [150, 100] in one
 * chunk), so that a chunk's codes and scales are put together from several tiles. */
static void test_tiles(void)
{
    param_t w = param_new("wide", BF16, 256, 2200, 13);
    param_t v = param_new("tall", F32, 150, 100, 14);
    const int64_t cuts[] = {0, 128, 256};
    group_t g;

    memset(&g, 0, sizeof(g));
    add_fsdp(&g, &w, cuts, 2);
    add_shard(&g, 0, &v, 0, 150);
    add_whole(&g, 0, "wide.fp8", &w, E4M3, BLOCK, 128, 128, 1, 0);
    add_whole(&g, 0, "tall.fp8", &v, E5M2, CHANNEL, 0, 0, 0, 0);
    run_group(&g, 2, 1, 4 * MiB);
    free(w.full);
    free(v.full);
}

/* A NaN (bf16) or -Inf (f32) in sender 1's shard: its pack refuses the chunk naming the param,
 * the sender and the element, and the bucket keeps every byte; sender 0's chunk packs. */
static void test_nonfinite(void)
{
    for (int kind = 0; kind < 2; kind++) {
        param_t w = param_new(kind ? "layers.1.w_inf" : "layers.0.w_nan", kind ? F32 : BF16, 256,
                              160, 12);
        const int64_t cuts[] = {0, 128, 256};
        group_t g;
        wsync_plan_t *p = NULL;
        wsync_plan_opts_t o = {.fp8_wire = 1};
        uint8_t *bucket = NULL, *before = NULL;
        char want[160];

        memset(&g, 0, sizeof(g));
        add_fsdp(&g, &w, cuts, 2);
        add_whole(&g, 0, "w.fp8", &w, E4M3, BLOCK, 128, 128, 0, 0);
        /* row 10, column 77 of sender 1's shard (its only chunk) */
        put(g.sdata[1], 10u * 160u + 77u, w.dt, kind ? -INFINITY : NAN);
        CHECK_OK(wsync_plan_compile_opts(g.d.s, g.d.ns, g.d.t, g.d.nt, 2, 1, 1 * MiB, &o, &p));
        if (p != NULL && p->nchunks == 2 && p->chunks[1].sender == 1 && p->chunks[1].rule) {
            bucket = malloc(p->bucket_bytes);
            before = malloc(p->bucket_bytes);
            for (uint64_t i = 0; i < p->bucket_bytes; i++)
                bucket[i] = (uint8_t)mix(i);
            memcpy(before, bucket, p->bucket_bytes);
            CHECK_ST(wsync_exec_pack_wire(p, &p->chunks[1], w.name, g.sdata[1], bucket),
                     WSYNC_ERR_NONFINITE);
            snprintf(want, sizeof(want), "sender 1: param '%s': %s at row 10, column 77", w.name,
                     kind ? "-Inf" : "NaN");
            CHECK_ERR_HAS(want);
            CHECK(memcmp(bucket, before, p->bucket_bytes) == 0);
            CHECK_OK(wsync_exec_pack_wire(p, &p->chunks[0], w.name, g.sdata[0], bucket));
        } else {
            CHECK_MSG(0, "the plan is not two FP8 chunks, one per sender");
        }
        free(bucket);
        free(before);
        wsync_plan_free(p);
        group_free(&g);
        free(w.full);
    }
}

/* Values at the edges of the scale rule, one kind per 32 x 32 patch (the blocks below are 32
 * rows, 32 or 64 columns, so each cell holds one kind, or two side by side): all +0, all -0, a
 * mix of +-0 with one tiny value, subnormals of the source dtype, an amax of exactly 448 x 2^k
 * (the e4m3 saturation bound at a power-of-two scale) and 448 x 2^k x (1 + 2^-7) (UE8M0 rounds
 * it up), an amax just under and exactly at eps, one large value among tiny ones (codes that
 * underflow to FP8 subnormals and zero), values of both signs at the dtype's largest finite
 * magnitude (f16 65504, bf16 and f32 near 3e38), and random ones. */
static float edge_value(int kind, wsync_dtype_t dt, int64_t r, int64_t c)
{
    uint64_t h = mix(((uint64_t)r << 32) ^ (uint64_t)c ^ ((uint64_t)kind << 20));
    float m = (float)(h % 1000001u) / 1000000.0f, sign = (h >> 40) & 1 ? -1.0f : 1.0f;
    float sub = dt == F16 ? 5.9604645e-8f : dt == BF16 ? 9.1835e-41f : 1.4e-45f;
    float big = dt == F16 ? 65504.0f : 3.3895314e38f;   /* bf16's largest; f32 stays finite */
    int first = r % 32 == 0 && c % 32 == 0;

    switch (kind) {
    case 0:
        return 0.0f;
    case 1:
        return -0.0f;
    case 2:
        return first ? 1e-30f : (h & 1) ? -0.0f : 0.0f;
    case 3:
        return sign * sub * (float)(1 + h % 7);
    case 4:
        return first ? -448.0f * 4.0f : sign * m * 448.0f * 4.0f;
    case 5:
        return first ? 448.0f * 4.0f * (1.0f + 1.0f / 128.0f) : sign * m * 448.0f;
    case 6:
        return first ? 0.99e-4f : sign * m * 0.99e-4f;
    case 7:
        return first ? -1e-4f : sign * m * 1e-4f;
    case 8:
        return first ? 1000.0f : sign * m * 1e-3f;
    case 9:
        return sign * big * (m > 0.5f ? 1.0f : 0.5f);
    default:
        return sign * m * (float)(1u << (h >> 50) % 16);
    }
}

static param_t edge_param(const char *name, wsync_dtype_t dt, int64_t rows, int64_t cols)
{
    param_t p = {name, dt, rows, cols, malloc((size_t)(rows * cols) * wsync_dtype_size(dt))};
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            int kind = (int)((r / 32 * 7 + c / 32) % 12);
            put(p.full, (uint64_t)(r * cols + c), dt, edge_value(kind, dt, r, c));
        }
    return p;
}

/* Those values from bf16, f16 and f32 [100, 200] params (neither a multiple of the blocks),
 * FSDP-2 cut at row 64, under 32x32 e4m3 blocks, 32x64 UE8M0 no-saturate blocks and e5m2
 * no-saturate channels: codes and scales equal the receiver quantizing the whole target
 * itself. */
static void test_edge_values(void)
{
    static const wsync_dtype_t dts[] = {BF16, F16, F32};
    static const char *names[3][3] = {{"b.blk", "b.ue8", "b.ch"},
                                      {"h.blk", "h.ue8", "h.ch"},
                                      {"f.blk", "f.ue8", "f.ch"}};
    const int64_t cuts[] = {0, 64, 100};
    param_t ps[9];
    group_t g;

    /* two groups: the fixtures hold 16 shards */
    memset(&g, 0, sizeof(g));
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < 3; k++)
            ps[d * 3 + k] = edge_param(names[d][k], dts[d], 100, 200);
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < 2; k++) {
            param_t *pa = &ps[d * 3 + k];
            add_fsdp(&g, pa, cuts, 2);
            add_whole(&g, 0, pa->name, pa, E4M3, BLOCK, 32, k ? 64 : 32, k, k);
        }
    CHECK(run_group(&g, 2, 1, 1 * MiB) == 12);
    for (int d = 0; d < 3; d++) {
        param_t *pa = &ps[d * 3 + 2];
        add_fsdp(&g, pa, cuts, 2);
        add_whole(&g, 0, pa->name, pa, E5M2, CHANNEL, 0, 0, 0, 1);
    }
    CHECK(run_group(&g, 2, 1, 1 * MiB) == 6);
    for (int i = 0; i < 9; i++)
        free(ps[i].full);
}

/* A segment off its target's cells (a hostile or corrupt plan the receiver did not check):
 * unpack refuses it with PROTOCOL naming the target, and writes neither codes nor scales. One
 * row down, 64 columns right, and past the last row of a [256, 256] target of 128x128 blocks;
 * then a target whose blocks are 256 rows, whose scale matrix has one row; then a [1, 1]
 * channel target with an offset whose rows wrap past 2^64. */
static void test_unpack_off_cells(void)
{
    param_t w = param_new("w.cut", BF16, 256, 256, 15);
    const int64_t cuts[] = {0, 128, 256};
    static const uint64_t shift[] = {256, 64, 200 * 256};
    wsync_plan_opts_t o = {.fp8_wire = 1};
    wsync_plan_t *p = NULL;
    group_t g;

    memset(&g, 0, sizeof(g));
    add_fsdp(&g, &w, cuts, 2);
    add_whole(&g, 0, "w.cut.fp8", &w, E4M3, BLOCK, 128, 128, 0, 0);
    CHECK_OK(wsync_plan_compile_opts(g.d.s, g.d.ns, g.d.t, g.d.nt, 2, 1, 1 * MiB, &o, &p));
    wsync_segment_t *S = NULL;   /* every receiver's segments, flat */
    if (p != NULL)
        CHECK_OK(wsync_plan_flatten(p, &S));
    if (p != NULL && S != NULL && p->nsegments == 2 && p->chunks[S[0].chunk].rule != 0) {
        uint8_t *all = malloc((size_t)(total_buckets(p) * p->bucket_bytes));
        /* room past the target's end: an unchecked write lands here, not on the heap */
        uint8_t *codes = malloc(4 * 256 * 256), *before = malloc(4 * 256 * 256);
        float *scales = malloc(64 * sizeof(float)), *sbefore = malloc(64 * sizeof(float));
        for (size_t i = 0; i < 4 * 256 * 256; i++)
            codes[i] = (uint8_t)mix(i);
        for (size_t i = 0; i < 64; i++)
            scales[i] = (float)i;
        memcpy(before, codes, 4 * 256 * 256);
        memcpy(sbefore, scales, 64 * sizeof(float));
        memset(all, POISON, (size_t)(total_buckets(p) * p->bucket_bytes));
        pack_all(&g, p, all);
        for (int k = 0; k < 3; k++) {
            wsync_segment_t sg = S[0];
            const wsync_chunk_t *ch = &p->chunks[sg.chunk];
            sg.dst.off += shift[k];
            CHECK_ST(wsync_exec_unpack_wire(p, &sg, ch, bucket_at(all, p, ch), &g.d.t[0], codes,
                                            scales),
                     WSYNC_ERR_PROTOCOL);
            CHECK_ERR_HAS("target 'w.cut.fp8'");
            CHECK_ERR_HAS("does not cover whole");
            CHECK(memcmp(codes, before, 4 * 256 * 256) == 0);
            CHECK(memcmp(scales, sbefore, 64 * sizeof(float)) == 0);
        }
        /* a target of 256-row blocks (one row of scales) fed the 128-row rule's second cell row */
        {
            wsync_target_desc_t other = g.d.t[0];
            const wsync_segment_t *sg = &S[1];
            other.block_rows = 256;
            CHECK_ST(wsync_exec_unpack_wire(p, sg, &p->chunks[sg->chunk],
                                            bucket_at(all, p, &p->chunks[sg->chunk]), &other,
                                            codes, scales),
                     WSYNC_ERR_PROTOCOL);
            CHECK_ERR_HAS("blocks 256 x 128");
            CHECK(memcmp(scales, sbefore, 64 * sizeof(float)) == 0);
        }
        /* a [1, 1] channel target (C = 1): an offset whose rows would wrap past 2^64 */
        {
            wsync_target_desc_t one = g.d.t[0];
            wsync_segment_t sg = S[0];
            wsync_chunk_t ch = p->chunks[sg.chunk];
            wsync_wire_rule_t *ru = &p->rules[ch.rule - 1], keep = *ru;
            one.quant = CHANNEL;
            one.shape[0] = 1;
            one.shape[1] = 1;
            memset(ru, 0, sizeof(*ru));
            ru->fp8_dtype = E4M3;
            ru->scheme = CHANNEL;
            ch.src.rows = sg.dst.rows = 2;
            ch.src.cols = sg.dst.cols = 1;
            sg.dst.pitch = 1;
            sg.dst.off = UINT64_MAX;
            CHECK_ST(wsync_exec_unpack_wire(p, &sg, &ch, bucket_at(all, p, &ch), &one, codes + 8,
                                            scales + 8),
                     WSYNC_ERR_PROTOCOL);
            CHECK(memcmp(codes, before, 4 * 256 * 256) == 0);
            CHECK(memcmp(scales, sbefore, 64 * sizeof(float)) == 0);
            *ru = keep;
        }
        free(all);
        free(codes);
        free(before);
        free(scales);
        free(sbefore);
    } else {
        CHECK_MSG(0, "the plan is not two FP8 segments");
    }
    free(S);
    wsync_plan_free(p);
    group_free(&g);
    free(w.full);
}

int main(void)
{
    RUN(test_block128_bf16);
    RUN(test_block64_ue8m0_f32);
    RUN(test_channel);
    RUN(test_block_e5m2_and_slices);
    RUN(test_fused_rows);
    RUN(test_tiles);
    RUN(test_nonfinite);
    RUN(test_edge_values);
    RUN(test_unpack_off_cells);
    return check_summary();
}
