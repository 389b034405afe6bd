/* FP8 on the wire, at the plan: which chunks the compiler lets travel as FP8 codes and scales
 * made by their senders (docs/fp8_wire.md), their cells and wire bytes, where it splits them,
 * the plan's wire form of rules, and the receiver's check. Descriptions are built by hand; every
 * expected figure is counted here from the shapes, not taken from the compiler. Host only. */
#include "core/status.h"
#include "reshard/plan.h"
#include "tests/support/check.h"
#include "tests/support/fp8_wire_fixtures.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define BF16 WSYNC_DTYPE_BF16
#define F32 WSYNC_DTYPE_F32
#define E4M3 WSYNC_DTYPE_F8E4M3FN
#define E5M2 WSYNC_DTYPE_F8E5M2
#define BLOCK WSYNC_QUANT_BLOCK
#define CHANNEL WSYNC_QUANT_CHANNEL
#define TENSOR WSYNC_QUANT_TENSOR
#define MiB (1u << 20)

/* ------------------------------------------------------------------------------------------ */
/* Descriptions by hand                                                                         */
/* ------------------------------------------------------------------------------------------ */

/* tests/support/fp8_wire_fixtures.h builds them */
typedef fw_group_t group_t;

/* A target that is the whole [rows, cols] param. */
static void add_whole(group_t *g, uint32_t receiver, const char *tname, const char *param,
                      wsync_dtype_t pdt, int64_t rows, int64_t cols, wsync_dtype_t dt,
                      wsync_quant_scheme_t quant, int br, int bc, int ue8m0)
{
    fw_add_target(g, receiver, tname, dt, rows, cols, quant, br, bc, ue8m0, 0);
    fw_add_piece(g, param, pdt, rows, cols, 0, rows, 0, cols, 0, 0);
}

static wsync_plan_t *compile(const group_t *g, uint32_t ns, uint32_t nr, uint64_t bucket,
                             int fp8)
{
    wsync_plan_t *plan = NULL;
    wsync_plan_opts_t o = {.fp8_wire = fp8};

    CHECK_OK(wsync_plan_compile_opts(g->s, g->ns, g->t, g->nt, ns, nr, bucket, &o, &plan));
    return plan;
}

static uint32_t count_rule(const wsync_plan_t *p, int fp8)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->nchunks; i++)
        n += fp8 ? p->chunks[i].rule != 0 : p->chunks[i].rule == 0;
    return n;
}

/* Cells of a block target [R, C] at br x bc, counted with a loop (not the plan's formula). */
static uint64_t block_cells(uint64_t rows, uint64_t cols, uint64_t br, uint64_t bc)
{
    uint64_t n = 0;
    for (uint64_t r = 0; r < rows; r += br)
        for (uint64_t c = 0; c < cols; c += bc)
            n++;
    return n;
}

/* Row of the shard where a chunk starts (every chunk here spans whole shard rows' columns
 * from column 0, or a column slice whose start is off % pitch). */
static uint64_t chunk_row(const wsync_chunk_t *c)
{
    return c->src.off / c->src.pitch;
}

/* ------------------------------------------------------------------------------------------ */
/* Cases                                                                                        */
/* ------------------------------------------------------------------------------------------ */

/* FSDP-2 row shards of a [512, 384] bf16 param, cut on a cell row (256), into one receiver's
 * FP8 128x128 block target of the whole param. */
static void fsdp2_block(group_t *g)
{
    memset(g, 0, sizeof(*g));
    fw_add_shard(g, 0, "w", BF16, 512, 384, 0, 256);
    fw_add_shard(g, 1, "w", BF16, 512, 384, 256, 256);
    add_whole(g, 0, "w.fp8", "w", BF16, 512, 384, E4M3, BLOCK, 128, 128, 0);
}

static void test_fsdp2_aligned(void)
{
    group_t g;
    wsync_plan_t *on, *off;
    uint64_t wire = 0, cells = 0, per_sender[2] = {0, 0};
    uint8_t wt[1] = {7};

    fsdp2_block(&g);
    on = compile(&g, 2, 1, 64 * MiB, 1);
    off = compile(&g, 2, 1, 64 * MiB, 0);
    if (on == NULL || off == NULL)
        goto out;
    CHECK(on->nrules == 1);
    CHECK(on->rules[0].fp8_dtype == E4M3 && on->rules[0].scheme == BLOCK &&
          on->rules[0].block_rows == 128 && on->rules[0].block_cols == 128 &&
          on->rules[0].eps == 1e-4f && !on->rules[0].ue8m0 && !on->rules[0].no_saturate);
    CHECK(on->nchunks >= 2 && count_rule(on, 1) == on->nchunks);
    for (uint32_t i = 0; i < on->nchunks; i++) {
        const wsync_chunk_t *c = &on->chunks[i];
        uint64_t want = block_cells(c->src.rows, c->src.cols, 128, 128);
        CHECK_MSG(c->ncells == want, "chunk %u: %u cells, want %llu", i, c->ncells,
                  (unsigned long long)want);
        wire += wsync_chunk_wire_bytes(c);
        cells += c->ncells;
        per_sender[c->sender] += c->src.rows * c->src.cols + 4u * c->ncells;
    }
    CHECK(cells == block_cells(512, 384, 128, 128));       /* 4 x 3 */
    CHECK_MSG(wire == 512u * 384u + 4u * 12u, "wire bytes %llu", (unsigned long long)wire);
    CHECK(on->pair_bytes[0] == per_sender[0] && on->pair_bytes[1] == per_sender[1]);
    CHECK(on->pair_bytes[0] == 256u * 384u + 4u * 6u);
    CHECK_OK(wsync_plan_wire_targets(on, 0, 1, wt));
    CHECK(wt[0] == 1);

    CHECK(off->nrules == 0 && count_rule(off, 0) == off->nchunks);
    CHECK(off->pair_bytes[0] == 256u * 384u * 2u && off->pair_bytes[1] == 256u * 384u * 2u);
    CHECK_OK(wsync_plan_wire_targets(off, 0, 1, wt));
    CHECK(wt[0] == 0);
out:
    wsync_plan_free(on);
    wsync_plan_free(off);
}

/* FSDP rows 200 / 312 cut the second row of cells: the whole target takes no FP8. */
static void test_fsdp_unaligned(void)
{
    group_t g;
    wsync_plan_t *p;

    memset(&g, 0, sizeof(g));
    fw_add_shard(&g, 0, "w", BF16, 512, 384, 0, 200);
    fw_add_shard(&g, 1, "w", BF16, 512, 384, 200, 312);
    add_whole(&g, 0, "w.fp8", "w", BF16, 512, 384, E4M3, BLOCK, 128, 128, 0);
    p = compile(&g, 2, 1, 64 * MiB, 1);
    if (p == NULL)
        return;
    CHECK(p->nchunks >= 2 && count_rule(p, 0) == p->nchunks);
    CHECK(p->pair_bytes[0] == 200u * 384u * 2u && p->pair_bytes[1] == 312u * 384u * 2u);
    wsync_plan_free(p);
}

/* One chunk (the whole param on sender 0) read by two receivers. */
static wsync_plan_t *fanout(wsync_dtype_t dt1, wsync_quant_scheme_t q1, int br1, int bc1,
                            uint32_t *chunks_alone)
{
    group_t g;
    wsync_plan_t *alone, *p;

    memset(&g, 0, sizeof(g));
    fw_add_shard(&g, 0, "w", BF16, 256, 256, 0, 256);
    add_whole(&g, 0, "w.a", "w", BF16, 256, 256, E4M3, BLOCK, 128, 128, 0);
    alone = compile(&g, 1, 1, 64 * MiB, 1);
    *chunks_alone = alone != NULL ? alone->nchunks : 0;
    CHECK(alone != NULL && alone->nrules == 1 && count_rule(alone, 1) == alone->nchunks);
    wsync_plan_free(alone);
    add_whole(&g, 1, "w.b", "w", BF16, 256, 256, dt1, q1, br1, bc1, 0);
    p = compile(&g, 1, 2, 64 * MiB, 1);
    if (p != NULL)   /* one chunk serves both: a sender stages each byte once */
        CHECK(p->nchunks == *chunks_alone && p->nsegments == 2 * p->nchunks);
    return p;
}

static void test_fanout(void)
{
    uint32_t n = 0;
    wsync_plan_t *p;
    uint8_t wt[1];

    /* FP8 block on receiver 0, bf16 on receiver 1: the chunk travels bf16 for both */
    p = fanout(BF16, WSYNC_QUANT_NONE, 0, 0, &n);
    CHECK(p != NULL && count_rule(p, 0) == p->nchunks);
    if (p != NULL) {
        CHECK_OK(wsync_plan_wire_targets(p, 0, 1, wt));
        CHECK(wt[0] == 0);
    }
    wsync_plan_free(p);
    /* two FP8 targets with different blocks: their cells differ, so plain */
    p = fanout(E4M3, BLOCK, 64, 128, &n);
    CHECK(p != NULL && count_rule(p, 0) == p->nchunks);
    wsync_plan_free(p);
    /* the same rule: FP8, one rule */
    p = fanout(E4M3, BLOCK, 128, 128, &n);
    CHECK(p != NULL && p->nrules == 1 && count_rule(p, 1) == p->nchunks);
    if (p != NULL) {
        CHECK_OK(wsync_plan_wire_targets(p, 1, 1, wt));
        CHECK(wt[0] == 1);
        /* each receiver takes codes and 4 scales: 256 x 256 + 16 bytes */
        CHECK(p->pair_bytes[0] == 256u * 256u + 16u && p->pair_bytes[1] == p->pair_bytes[0]);
    }
    wsync_plan_free(p);
}

/* Channel scales on TP column slices of a row-parallel [256, 512] param held FSDP-2: each
 * receiver's target is [256, 256] (columns r*256..), its chunks span every column of it. */
static void test_channel_tp_slice(void)
{
    group_t g;
    wsync_plan_t *p;

    for (int quant = 0; quant < 2; quant++) {
        memset(&g, 0, sizeof(g));
        fw_add_shard(&g, 0, "o", BF16, 256, 512, 0, 128);
        fw_add_shard(&g, 1, "o", BF16, 256, 512, 128, 128);
        for (uint32_t r = 0; r < 2; r++) {
            fw_add_target(&g, r, "o.fp8", E4M3, 256, 256, quant == 0 ? CHANNEL : TENSOR, 0, 0,
                          0, 0);
            fw_add_piece(&g, "o", BF16, 256, 512, 0, 256, r * 256, 256, 0, 0);
        }
        p = compile(&g, 2, 2, 64 * MiB, 1);
        if (p == NULL)
            continue;
        if (quant == 0) {
            CHECK(p->nrules == 1 && p->rules[0].scheme == CHANNEL &&
                  p->rules[0].block_rows == 0 && p->rules[0].eps == 0.0f);
            CHECK(count_rule(p, 1) == p->nchunks);
            for (uint32_t i = 0; i < p->nchunks; i++)
                CHECK(p->chunks[i].src.cols == 256 && p->chunks[i].src.pitch == 512 &&
                      p->chunks[i].ncells == p->chunks[i].src.rows);
            /* sender s to receiver r: 128 rows x 256 codes, 128 scales */
            for (uint32_t k = 0; k < 4; k++)
                CHECK(p->pair_bytes[k] == 128u * 256u + 128u * 4u);
        } else {   /* a per-tensor scale needs every sender's amax: plain */
            CHECK(p->nrules == 0 && count_rule(p, 0) == p->nchunks);
            for (uint32_t k = 0; k < 4; k++)
                CHECK(p->pair_bytes[k] == 128u * 256u * 2u);
        }
        wsync_plan_free(p);
    }
}

/* Three targets on one receiver, one per param: e4m3 blocks, e4m3 UE8M0 blocks, e5m2 blocks:
 * three rules, each chunk naming its target's. */
static void test_rules_distinct(void)
{
    static const char *const names[3] = {"a", "b", "c"};
    static const char *const tnames[3] = {"a.fp8", "b.fp8", "c.fp8"};
    static const wsync_dtype_t dts[3] = {E4M3, E4M3, E5M2};
    static const int ue[3] = {0, 1, 0};
    group_t g;
    wsync_plan_t *p;
    int seen[3] = {0, 0, 0};

    memset(&g, 0, sizeof(g));
    for (int k = 0; k < 3; k++)
        fw_add_shard(&g, 0, names[k], BF16, 256, 128, 0, 256);
    for (int k = 0; k < 3; k++)
        add_whole(&g, 0, tnames[k], names[k], BF16, 256, 128, dts[k], BLOCK, 128, 128, ue[k]);
    p = compile(&g, 1, 1, 64 * MiB, 1);
    if (p == NULL)
        return;
    CHECK(p->nrules == 3);
    for (uint32_t a = 0; a < p->nrules; a++)
        for (uint32_t b = a + 1; b < p->nrules; b++)
            CHECK(!wsync_wire_rule_eq(&p->rules[a], &p->rules[b]));
    wsync_segment_t *S = NULL;
    CHECK_OK(wsync_plan_flatten(p, &S));
    for (uint32_t i = 0; S != NULL && i < p->nsegments; i++) {
        const wsync_segment_t *sg = &S[i];
        const wsync_chunk_t *c = &p->chunks[sg->chunk];
        uint32_t t = sg->target;
        CHECK(t < 3 && c->rule >= 1 && c->rule <= p->nrules);
        if (t >= 3 || c->rule < 1 || c->rule > p->nrules)
            continue;
        CHECK_MSG(p->rules[c->rule - 1].fp8_dtype == dts[t] &&
                  p->rules[c->rule - 1].ue8m0 == ue[t], "target %u: rule %u", t, c->rule);
        seen[t] = 1;
    }
    free(S);
    CHECK(seen[0] && seen[1] && seen[2]);
    wsync_plan_free(p);
}

/* A [500, 256] param into 128x128 blocks, buckets of room for two rows of cells: the chunks
 * split at multiples of 128 rows (the last at the edge), every cell in exactly one chunk. */
static void test_split_on_cell_rows(void)
{
    group_t g;
    wsync_plan_t *p;
    uint64_t rows_seen = 0, cells = 0;
    const uint64_t bucket = 80000;   /* 2 x (128 x 256 codes + 2 scales) fit, 3 do not */

    memset(&g, 0, sizeof(g));
    fw_add_shard(&g, 0, "w", BF16, 500, 256, 0, 500);
    add_whole(&g, 0, "w.fp8", "w", BF16, 500, 256, E4M3, BLOCK, 128, 128, 0);
    p = compile(&g, 1, 1, bucket, 1);
    if (p == NULL)
        return;
    CHECK(p->nchunks == 2 && count_rule(p, 1) == p->nchunks);
    for (uint32_t i = 0; i < p->nchunks; i++) {
        const wsync_chunk_t *c = &p->chunks[i];
        uint64_t r0 = chunk_row(c);
        CHECK_MSG(r0 % 128 == 0, "chunk %u starts at row %llu", i, (unsigned long long)r0);
        CHECK_MSG(c->src.rows % 128 == 0 || r0 + c->src.rows == 500, "chunk %u: rows %llu..%llu",
                  i, (unsigned long long)r0, (unsigned long long)(r0 + c->src.rows));
        CHECK(r0 == rows_seen && c->src.cols == 256);
        CHECK(c->bucket_off + wsync_chunk_wire_bytes(c) <= bucket);
        rows_seen += c->src.rows;
        cells += c->ncells;
    }
    CHECK(rows_seen == 500 && cells == block_cells(500, 256, 128, 128));
    CHECK(p->nchunks == 2 && p->chunks[0].src.rows == 256 && p->chunks[1].src.rows == 244);
    wsync_plan_free(p);
}

/* ------------------------------------------------------------------------------------------ */
/* Wire form and the receiver's check                                                           */
/* ------------------------------------------------------------------------------------------ */

static uint64_t get_varint(const uint8_t *b, size_t *pos)
{
    uint64_t v = 0;
    for (int s = 0; s < 64; s += 7) {
        uint8_t x = b[(*pos)++];
        v |= (uint64_t)(x & 0x7f) << s;
        if (!(x & 0x80))
            break;
    }
    return v;
}

/* The trailing xxh3-64 over the rest, so that the decoder gets past its first check. */
static void refinger(uint8_t *b, size_t len)
{
    uint64_t h = XXH3_64bits(b, len - 8);
    for (int k = 0; k < 8; k++)
        b[len - 8 + k] = (uint8_t)(h >> (8 * k));
}

static void test_wire_round_trip(void)
{
    group_t g;
    wsync_plan_t *p, *q = NULL;
    wsync_wbuf_t b;
    uint8_t *bad;
    size_t pos, rule_at;
    uint64_t f;

    fsdp2_block(&g);
    /* a second, channel target on another receiver: two rules on the wire */
    fw_add_shard(&g, 0, "v", F32, 64, 96, 0, 64);
    add_whole(&g, 1, "v.fp8", "v", F32, 64, 96, E5M2, CHANNEL, 0, 0, 0);
    p = compile(&g, 2, 2, 64 * MiB, 1);
    if (p == NULL)
        return;
    CHECK(p->nrules == 2);
    wsync_wbuf_init(&b);
    wsync_plan_encode(p, &b);
    CHECK(!b.err);
    CHECK_OK(wsync_plan_decode(b.data, b.len, &q));
    if (q != NULL) {
        CHECK(q->fingerprint == p->fingerprint && q->nrules == p->nrules &&
              q->nchunks == p->nchunks);
        for (uint32_t k = 0; k < q->nrules && k < p->nrules; k++)
            CHECK(wsync_wire_rule_eq(&q->rules[k], &p->rules[k]));
        for (uint32_t i = 0; i < q->nchunks && i < p->nchunks; i++)
            CHECK(q->chunks[i].rule == p->chunks[i].rule &&
                  q->chunks[i].ncells == p->chunks[i].ncells);
        for (uint32_t k = 0; k < 4; k++)
            CHECK(q->pair_bytes[k] == p->pair_bytes[k]);
    }
    wsync_plan_free(q);
    q = NULL;

    /* the first chunk's rule out of range: header (32 bytes), the rule table (a count, then
     * per rule dtype, scheme, two varints, eps, flags), then the chunk's flags varint and the
     * fields before the rule (sender, shard, dtype, each when its flag says) */
    bad = malloc(b.len);
    pos = 32;
    f = get_varint(b.data, &pos);
    CHECK(f == 2);
    for (uint64_t k = 0; k < f; k++) {
        pos += 2;
        get_varint(b.data, &pos);
        get_varint(b.data, &pos);
        pos += 5;
    }
    f = get_varint(b.data, &pos);
    CHECK(f & 0x400u);                          /* CF_RULE */
    if (f & 0x080u)                             /* CF_SENDER, CF_SHARD: a varint each */
        get_varint(b.data, &pos);
    if (f & 0x002u)
        get_varint(b.data, &pos);
    rule_at = pos + ((f & 0x200u) ? 1u : 0u);   /* past the dtype byte (CF_DTYPE) */
    CHECK(b.data[rule_at] == p->chunks[0].rule);
    memcpy(bad, b.data, b.len);
    bad[rule_at] = 7;
    refinger(bad, b.len);
    CHECK_ST(wsync_plan_decode(bad, b.len, &q), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("FP8 rule 7 of 2");
    CHECK(q == NULL);

    /* rule 1's dtype byte (bf16) and scheme byte (per-tensor): malformed, named */
    memcpy(bad, b.data, b.len);
    bad[33] = (uint8_t)BF16;
    refinger(bad, b.len);
    CHECK_ST(wsync_plan_decode(bad, b.len, &q), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("FP8 rule 1 is malformed");
    memcpy(bad, b.data, b.len);
    bad[34] = (uint8_t)TENSOR;
    refinger(bad, b.len);
    CHECK_ST(wsync_plan_decode(bad, b.len, &q), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("FP8 rule 1 is malformed");
    CHECK(q == NULL);
    free(bad);
    wsync_wbuf_free(&b);
    wsync_plan_free(p);
}

/* A receiver whose target has 64-row blocks refuses chunks the plan quantized with 128-row
 * ones, naming its target; with its own description it accepts the plan. */
static void test_check_receiver_other_block(void)
{
    group_t g;
    wsync_plan_t *p;
    wsync_target_desc_t mine;

    fsdp2_block(&g);
    p = compile(&g, 2, 1, 64 * MiB, 1);
    if (p == NULL)
        return;
    CHECK_OK(wsync_plan_check_receiver(p, 0, g.t, 1));
    mine = g.t[0];
    mine.block_rows = 64;
    CHECK_ST(wsync_plan_check_receiver(p, 0, &mine, 1), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("target 'w.fp8'");
    CHECK_ERR_HAS("which is not this target's");
    mine = g.t[0];
    mine.ue8m0 = 1;
    CHECK_ST(wsync_plan_check_receiver(p, 0, &mine, 1), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("target 'w.fp8'");
    wsync_plan_free(p);
}

/* A plan whose FP8 fields were changed in the struct, then encoded (the fingerprint matches):
 * decode refuses it with PROTOCOL and the message given. */
static void decode_refuses(const wsync_plan_t *p, const char *what, const char *want)
{
    wsync_plan_t *q = NULL;
    wsync_wbuf_t b;

    wsync_wbuf_init(&b);
    wsync_plan_encode(p, &b);
    CHECK(!b.err);
    if (wsync_plan_decode(b.data, b.len, &q) == WSYNC_ERR_PROTOCOL)
        CHECK_MSG(strstr(wsync_last_error(), want) != NULL, "%s: \"%s\" lacks \"%s\"", what,
                  wsync_last_error(), want);
    else
        CHECK_MSG(0, "%s: decode did not refuse with PROTOCOL (%s)", what, wsync_last_error());
    CHECK_MSG(q == NULL, "%s: a refused decode set its output", what);
    wsync_plan_free(q);
    wsync_wbuf_free(&b);
}

/* Hostile FP8 fields, each alone: a chunk of FP8 dtype quantized again, a rule no compiler
 * makes (eps NaN, 0 or Inf, a channel rule with UE8M0 or an eps, blocks of 0 rows), two equal
 * rules, and an FP8 chunk whose scales pass its bucket's end. */
static void test_decode_hostile_rules(void)
{
    group_t g;
    wsync_plan_t *p;
    wsync_wire_rule_t keep;
    wsync_chunk_t kc;
    const float bad_eps[] = {0.0f, NAN, INFINITY, -1.0f};

    fsdp2_block(&g);
    fw_add_shard(&g, 0, "v", F32, 64, 96, 0, 64);
    add_whole(&g, 1, "v.fp8", "v", F32, 64, 96, E5M2, CHANNEL, 0, 0, 0);
    p = compile(&g, 2, 2, 64 * MiB, 1);
    if (p == NULL || p->nrules != 2 || p->nchunks < 1 || p->chunks[0].rule == 0) {
        CHECK_MSG(0, "the plan has no two rules");
        wsync_plan_free(p);
        return;
    }
    uint32_t blk = p->rules[0].scheme == BLOCK ? 0 : 1, ch = 1 - blk;

    kc = p->chunks[0];
    p->chunks[0].dtype = E4M3;
    decode_refuses(p, "FP8 chunk of FP8 dtype", "names FP8 rule");
    p->chunks[0] = kc;

    keep = p->rules[blk];
    for (size_t i = 0; i < sizeof(bad_eps) / sizeof(bad_eps[0]); i++) {
        p->rules[blk].eps = bad_eps[i];
        decode_refuses(p, "block eps", "is malformed");
    }
    p->rules[blk] = keep;
    p->rules[blk].block_rows = 0;
    decode_refuses(p, "blocks of 0 rows", "is malformed");
    p->rules[blk] = keep;

    keep = p->rules[ch];
    p->rules[ch].ue8m0 = 1;
    decode_refuses(p, "channel UE8M0", "is malformed");
    p->rules[ch] = keep;
    p->rules[ch].eps = 1e-4f;
    decode_refuses(p, "channel eps", "is malformed");
    p->rules[ch] = keep;

    keep = p->rules[1];
    p->rules[1] = p->rules[0];
    decode_refuses(p, "two equal rules", "are the same");
    p->rules[1] = keep;

    /* the last chunk of its bucket moved so that its codes fit and its scales do not */
    int moved = 0;
    for (uint32_t i = 0; i < p->nchunks && !moved; i++) {
        wsync_chunk_t *c = &p->chunks[i];
        if (c->rule == 0 || (i + 1 < p->nchunks && p->chunks[i + 1].sender == c->sender &&
                             p->chunks[i + 1].bucket == c->bucket))
            continue;
        kc = *c;
        c->bucket_off = (p->bucket_bytes - c->src.rows * c->src.cols) / 64 * 64;
        CHECK(c->bucket_off + wsync_chunk_wire_bytes(c) > p->bucket_bytes);
        decode_refuses(p, "scales past the bucket", "does not fit");
        *c = kc;
        moved = 1;
    }
    CHECK_MSG(moved, "no FP8 chunk ends its bucket");
    wsync_plan_free(p);
}

int main(void)
{
    RUN(test_fsdp2_aligned);
    RUN(test_fsdp_unaligned);
    RUN(test_fanout);
    RUN(test_channel_tp_slice);
    RUN(test_rules_distinct);
    RUN(test_split_on_cell_rows);
    RUN(test_wire_round_trip);
    RUN(test_check_receiver_other_block);
    RUN(test_decode_hostile_rules);
    return check_summary();
}
