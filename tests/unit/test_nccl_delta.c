/* The nccl scheme's delta decisions and formats (schemes/nccl_delta.h), from real compiled plans:
 * each sender's chunks, the capability relay, which ops go delta for which bases and holds and
 * which of their items are encoded, the per-op table and its checks, the room an encoded chunk
 * takes. */
#include "core/status.h"
#include "reshard/plan.h"
#include "schemes/nccl.h"
#include "schemes/nccl_delta.h"
#include "tests/support/check.h"
#include "wsync/wsync_layout.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BF16 WSYNC_DTYPE_BF16
#define F32 WSYNC_DTYPE_F32

static char dummy[16];

typedef struct {
    wsync_shard_desc_t shards[32];
    size_t nshards;
    wsync_target_desc_t targets[32];
    size_t ntargets;
} group_t;

static void add_shard(group_t *g, uint32_t sender, const char *name, wsync_dtype_t dt, int64_t r,
                      int64_t c, int64_t r0, int64_t nr)
{
    wsync_shard_t s = {{name, dt, 2, {r, c}}, {{r0, 0}, {nr, c}}, dummy, WSYNC_MEM_CUDA, 0};
    uint32_t index = 0;
    for (size_t i = 0; i < g->nshards; i++)
        index += g->shards[i].sender == sender;
    CHECK_OK(wsync_shard_desc_from(&s, sender, index, &g->shards[g->nshards++]));
}

/* A target of dtype tdt holding box [r0, r0 + nr) x [c0, c0 + nc) of param `name`, whole. */
static void add_target(group_t *g, uint32_t receiver, const char *tname, const char *name,
                       wsync_dtype_t pdt, wsync_dtype_t tdt, int64_t r, int64_t c, int64_t r0,
                       int64_t nr, int64_t c0, int64_t nc)
{
    wsync_piece_t pc = {{name, pdt, 2, {r, c}}, {{r0, c0}, {nr, nc}}, {0, 0}};
    wsync_target_t t = {tname, tdt, 2, {nr, nc}, dummy, WSYNC_MEM_CUDA, 0, &pc, 1, {0}};
    uint32_t index = 0;
    for (size_t i = 0; i < g->ntargets; i++)
        index += g->targets[i].receiver == receiver;
    CHECK_OK(wsync_target_desc_from(&t, receiver, index, &g->targets[g->ntargets++]));
}

static void group_free(group_t *g)
{
    for (size_t i = 0; i < g->nshards; i++)
        wsync_shard_desc_clear(&g->shards[i]);
    for (size_t i = 0; i < g->ntargets; i++)
        wsync_target_desc_clear(&g->targets[i]);
}

static wsync_plan_t *compile(group_t *g, uint32_t ns, uint32_t nr, uint64_t bucket)
{
    wsync_plan_t *p = NULL;
    CHECK_OK(wsync_plan_compile(g->shards, g->nshards, g->targets, g->ntargets, ns, nr, bucket,
                                &p));
    return p;
}

/* Two senders (FSDP-2) of three params to one receiver: each sender's chunks are its run of the
 * plan's chunks; the capability relay round-trips and refuses every malformed form. */
static void test_chunks_and_relay(void)
{
    group_t g = {0};
    for (uint32_t i = 0; i < 2; i++) {
        add_shard(&g, i, "a", BF16, 16, 8, i * 8, 8);
        add_shard(&g, i, "b", BF16, 16, 8, i * 8, 8);
        add_shard(&g, i, "c", BF16, 16, 8, i * 8, 8);
    }
    add_target(&g, 0, "a", "a", BF16, BF16, 16, 8, 0, 16, 0, 8);
    add_target(&g, 0, "b", "b", BF16, F32, 16, 8, 0, 16, 0, 8);
    add_target(&g, 0, "c", "c", BF16, BF16, 16, 8, 0, 16, 0, 8);
    wsync_plan_t *p = compile(&g, 2, 1, 1u << 20);
    uint32_t prev_hi = 0;
    for (uint32_t s = 0; s < 2; s++) {
        uint32_t lo, hi;
        wsync_nccl_sender_chunks(p, s, &lo, &hi);
        CHECK(lo == prev_hi && hi - lo == 3);
        for (uint32_t c = 0; c < p->nchunks; c++)
            CHECK((p->chunks[c].sender == s) == (c >= lo && c < hi));
        prev_hi = hi;
    }
    CHECK(prev_hi == p->nchunks);
    uint32_t lo, hi;
    wsync_nccl_sender_chunks(p, 7, &lo, &hi);   /* no such sender: an empty run */
    CHECK(lo == hi);

    uint8_t bits[1] = {0x05};   /* chunks 0 and 2 */
    wsync_wbuf_t b;
    uint8_t *got = NULL;
    wsync_wbuf_init(&b);
    wsync_nccl_dcaps_encode(bits, 3, &b);
    CHECK(!b.err && b.len == 9);
    CHECK_OK(wsync_nccl_dcaps_decode(b.data, b.len, 3, "receiver 0", &got));
    CHECK(got != NULL && got[0] == 0x05);
    CHECK(wsync_nccl_bit(got, 0) && !wsync_nccl_bit(got, 1) && wsync_nccl_bit(got, 2));
    CHECK(!wsync_nccl_bit(NULL, 0));
    free(got);
    got = NULL;
    CHECK_ST(wsync_nccl_dcaps_decode(b.data, b.len, 4, "receiver 0", &got), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("receiver 0's delta capabilities are malformed");
    CHECK_ST(wsync_nccl_dcaps_decode(b.data, b.len - 1, 3, "receiver 0", &got),
             WSYNC_ERR_PROTOCOL);
    b.data[8] |= 0x80;   /* a bit past the 3 chunks */
    CHECK_ST(wsync_nccl_dcaps_decode(b.data, b.len, 3, "receiver 0", &got), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("set bits past its 3 chunks");
    b.data[8] = 0x05;
    b.data[0] ^= 1;
    CHECK_ST(wsync_nccl_dcaps_decode(b.data, b.len, 3, "receiver 0", &got), WSYNC_ERR_PROTOCOL);
    CHECK(got == NULL);
    wsync_wbuf_free(&b);
    wsync_plan_free(p);
    group_free(&g);
}

/* 1 sender, 3 replicas (broadcast on the whole communicator) then 2 senders -> 2 receivers
 * (sends): which ops go delta for which bases and holds, and which items are encoded. */
static void test_op_modes(void)
{
    group_t g = {0};
    add_shard(&g, 0, "w", BF16, 64, 64, 0, 64);
    add_shard(&g, 0, "n", F32, 1, 64, 0, 1);
    for (uint32_t r = 0; r < 3; r++) {
        add_target(&g, r, "w", "w", BF16, BF16, 64, 64, 0, 64, 0, 64);
        add_target(&g, r, "n", "n", F32, r == 2 ? BF16 : F32, 1, 64, 0, 1, 0, 64);
    }
    wsync_plan_t *p = compile(&g, 1, 3, 1u << 20);
    wsync_nccl_sched_t *s = NULL;
    CHECK_OK(wsync_nccl_sched_build(p, WSYNC_NCCL_DIRECT_MIN, WSYNC_NCCL_MAX_SPLITS, &s));
    CHECK(s->nops == 1 && s->ops[0].kind == WSYNC_NCCL_OP_BCAST && s->ops[0].nitems == 2);
    const wsync_nccl_op_t *op = &s->ops[0];
    uint64_t all[4] = {5, 5, 5, 5}, one_behind[4] = {5, 5, 4, 5}, none[4] = {0, 0, 0, 0};
    CHECK(wsync_nccl_delta_op_on(s, op, all, 1) == 1);
    CHECK(wsync_nccl_delta_op_on(s, op, one_behind, 1) == 0);   /* mixed set: plain to all */
    CHECK(wsync_nccl_delta_op_on(s, op, none, 1) == 0);         /* no base: plain */
    uint8_t cap[2] = {1, 1}, b0 = 3, b2 = 1;                     /* receiver 2 casts "n" */
    uint8_t *rbits[3] = {&b0, &b0, &b2};
    int w_on = -1, n_on = -1;
    for (uint32_t j = 0; j < op->nitems; j++) {
        int on = wsync_nccl_delta_item_on(p, s, op, j, 0, cap, rbits);
        if (p->chunks[s->items[op->item0 + j].chunk].dtype == BF16)
            w_on = on;
        else
            n_on = on;
    }
    CHECK(w_on == 1 && n_on == 0);   /* one receiver that cannot apply makes the item plain */
    cap[0] = cap[1] = 0;
    for (uint32_t j = 0; j < op->nitems; j++)
        CHECK(wsync_nccl_delta_item_on(p, s, op, j, 0, cap, rbits) == 0);
    wsync_nccl_sched_free(s);
    wsync_plan_free(p);
    group_free(&g);

    group_t h = {0};
    for (uint32_t i = 0; i < 2; i++)
        add_shard(&h, i, "w", BF16, 64, 64, i * 32, 32);
    for (uint32_t r = 0; r < 2; r++)
        add_target(&h, r, "w", "w", BF16, BF16, 64, 64, 0, 64, r * 32, 32);
    p = compile(&h, 2, 2, 1u << 20);
    s = NULL;
    CHECK_OK(wsync_nccl_sched_build(p, WSYNC_NCCL_DIRECT_MIN, WSYNC_NCCL_MAX_SPLITS, &s));
    CHECK(s->nops == 4);
    uint64_t have[4] = {7, 0, 7, 7};   /* sender 1 lost its base (a failed version) */
    for (uint32_t i = 0; i < s->nops; i++) {
        CHECK(s->ops[i].kind == WSYNC_NCCL_OP_P2P);
        CHECK(wsync_nccl_delta_op_on(s, &s->ops[i], have, 2) == (s->ops[i].sender == 0));
    }
    have[1] = 7;
    have[3] = 6;   /* receiver 1 holds an older version */
    for (uint32_t i = 0; i < s->nops; i++)
        CHECK(wsync_nccl_delta_op_on(s, &s->ops[i], have, 2) == (s->ops[i].receiver == 0));
    wsync_nccl_sched_free(s);
    wsync_plan_free(p);
    group_free(&h);
}

/* The per-op table: round trip, and each field a receiver checks. */
static void test_table(void)
{
    group_t g = {0};
    add_shard(&g, 0, "w", BF16, 5, 1000, 0, 5);   /* 5000 elements: 2 blocks */
    add_shard(&g, 0, "n", F32, 1, 8, 0, 1);
    add_target(&g, 0, "w", "w", BF16, BF16, 5, 1000, 0, 5, 0, 1000);
    add_target(&g, 0, "n", "n", F32, F32, 1, 8, 0, 1, 0, 8);
    wsync_plan_t *p = compile(&g, 1, 1, 1u << 20);
    wsync_nccl_sched_t *s = NULL;
    CHECK_OK(wsync_nccl_sched_build(p, WSYNC_NCCL_DIRECT_MIN, WSYNC_NCCL_MAX_SPLITS, &s));
    CHECK(s->nops == 1 && s->ops[0].nitems == 2);
    const wsync_nccl_op_t *op = &s->ops[0];
    uint32_t wi = p->chunks[s->items[op->item0].chunk].dtype == BF16 ? 0 : 1;

    /* room: header 16, 2 blocks' table 16, payloads 4096 * 2 and 904 * 2 bytes */
    CHECK(wsync_nccl_delta_room(&p->chunks[s->items[op->item0 + wi].chunk]) ==
          (16 + 16 + 8192 + 1808 + 255) / 256 * 256);
    CHECK(wsync_nccl_delta_room(&p->chunks[s->items[op->item0 + 1 - wi].chunk]) == 256);

    uint8_t tab[16 + 32];
    uint64_t len[2], hash[2] = {0x1111, 0x2222}, got_len[2] = {9, 9}, got_hash[2] = {9, 9};
    CHECK(wsync_nccl_dtable_bytes(2) == sizeof(tab));
    len[wi] = 16 + 16 + 8 * 3 + 8;   /* a SPARSE block of 3 and a SAME block */
    len[1 - wi] = 0;                 /* plain */
    wsync_nccl_dtable_write(tab, 42, 2, len, hash);
    CHECK_OK(wsync_nccl_dtable_read(tab, 42, p, s, op, "sender 0", got_len, got_hash));
    CHECK(got_len[wi] == len[wi] && got_hash[wi] == hash[wi]);
    CHECK(got_len[1 - wi] == 0 && got_hash[1 - wi] == 0);   /* a plain item carries no hash */

    got_len[0] = got_len[1] = 9;
    CHECK_ST(wsync_nccl_dtable_read(tab, 41, p, s, op, "sender 0", got_len, got_hash),
             WSYNC_ERR_INTEGRITY);
    CHECK_ERR_HAS("the delta table from sender 0 is corrupt");
    CHECK(got_len[0] == 9 && got_len[1] == 9);   /* outputs untouched on failure */
    uint64_t bad[] = {8, 16 + 16 - 8, 16 + 16 + 4, 16 + 16 + 8192 + 1808 + 8};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        len[wi] = bad[i];
        wsync_nccl_dtable_write(tab, 42, 2, len, hash);
        CHECK_ST(wsync_nccl_dtable_read(tab, 42, p, s, op, "sender 0", got_len, got_hash),
                 WSYNC_ERR_INTEGRITY);
        CHECK_ERR_HAS("(5000 elements) is encoded in");
    }
    len[wi] = 16 + 16 + 8192 + 1808;   /* every block PLAIN: the most allowed */
    wsync_nccl_dtable_write(tab, 42, 2, len, hash);
    CHECK_OK(wsync_nccl_dtable_read(tab, 42, p, s, op, "sender 0", got_len, got_hash));
    tab[0] ^= 0x40;
    CHECK_ST(wsync_nccl_dtable_read(tab, 42, p, s, op, "sender 0", got_len, got_hash),
             WSYNC_ERR_INTEGRITY);
    wsync_nccl_sched_free(s);
    wsync_plan_free(p);
    group_free(&g);
}

int main(void)
{
    RUN(test_chunks_and_relay);
    RUN(test_op_modes);
    RUN(test_table);
    return check_summary();
}
