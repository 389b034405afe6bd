/* The store's per-tensor sets (schemes/store_amax.c): a set's key is the same whatever the order
 * of its members and differs with its rule or any member; a per-tensor rule carries the key in
 * its block fields; sender 0 takes a reader's sets once each (replicas name one set), leaves out
 * one whose key does not match it and a malformed relay; another sender keeps only its own
 * members of sender 0's sets, and exchanges from the version sender 0 says; nothing is agreed
 * before an exchange. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/proto.h"
#include "core/status.h"
#include "core/wire.h"
#include "schemes/store_amax.h"
#include "tests/support/check.h"
#include "wsync/wsync.h"

static const wsync_wire_rule_t tensor = {WSYNC_DTYPE_F8E4M3FN, WSYNC_QUANT_TENSOR, 0, 0, 0.0f, 0,
                                         0};

/* o_proj's column slice of TP rank 0 over FSDP-2 senders: 128 rows each, columns [0, 128). */
static void o_members(store_amax_member_t m[2])
{
    m[0] = (store_amax_member_t){0, 0, {0, 128, 128, 256}};
    m[1] = (store_amax_member_t){1, 0, {0, 128, 128, 256}};
}

static void case_key(void)
{
    store_amax_member_t a[2], b[2];
    o_members(a);
    b[0] = a[1];
    b[1] = a[0];
    uint64_t ka = wsync_store_amax_key(&tensor, a, 2), kb = wsync_store_amax_key(&tensor, b, 2);
    CHECK(ka != 0 && ka == kb);
    CHECK(b[0].sender == 0 && b[1].sender == 1);   /* sorted in place */
    wsync_wire_rule_t e5 = tensor;
    e5.fp8_dtype = WSYNC_DTYPE_F8E5M2;
    CHECK(wsync_store_amax_key(&e5, a, 2) != ka);
    b[1].g.off = 128;   /* the other TP rank's columns */
    CHECK(wsync_store_amax_key(&tensor, b, 2) != ka);
    CHECK(wsync_store_amax_key(&tensor, a, 1) != ka);
    /* the key rides in the block fields, which the key itself ignores */
    wsync_wire_rule_t r = tensor;
    wsync_store_amax_rule_keyed(&r, ka);
    CHECK(wsync_store_amax_rule_key(&r) == ka);
    CHECK(wsync_store_amax_key(&r, a, 2) == ka);
    wsync_store_amax_rule_plain(&r);
    CHECK(r.block_rows == 0 && r.block_cols == 0);
}

/* A relay of `tag` from (role, rank) over b's bytes. */
static wsync_relay_t relay(wsync_role_t role, int rank, const wsync_wbuf_t *b)
{
    return (wsync_relay_t){(uint32_t)role, rank, STORE_AMAX_SETS_TAG, (uint32_t)b->len, b->data};
}

static void case_sender0_takes_readers(void)
{
    store_amax_t *a = NULL;
    store_amax_member_t o[2], q[1] = {{0, 2, {0, 128, 128, 128}}};
    wsync_wbuf_t b;
    CHECK_OK(wsync_store_amax_create(0, 2, &a));
    if (a == NULL)
        return;
    o_members(o);
    uint64_t ko = wsync_store_amax_key(&tensor, o, 2), kq = wsync_store_amax_key(&tensor, q, 1);
    /* reader 0: o and q; reader 2 (a replica): o again */
    wsync_wbuf_init(&b);
    wsync_put_u32(&b, 2);
    wsync_store_amax_put_set(&b, ko, &tensor, o, 2);
    wsync_store_amax_put_set(&b, kq, &tensor, q, 1);
    wsync_relay_t rl = relay(WSYNC_ROLE_RECEIVER, 0, &b);
    CHECK_OK(wsync_store_amax_take(a, &rl));
    wsync_wbuf_free(&b);
    wsync_wbuf_init(&b);
    wsync_put_u32(&b, 1);
    wsync_store_amax_put_set(&b, ko, &tensor, o, 2);
    rl = relay(WSYNC_ROLE_RECEIVER, 2, &b);
    CHECK_OK(wsync_store_amax_take(a, &rl));
    wsync_wbuf_free(&b);
    CHECK_MSG(wsync_store_amax_nsets(a) == 2, "%u sets", wsync_store_amax_nsets(a));
    /* sender 0's own members: one of o, q's */
    uint32_t n0 = 0, n1 = 0;
    const store_amax_member_t *m0 = wsync_store_amax_members(a, 0, &n0);
    wsync_store_amax_members(a, 1, &n1);
    CHECK(n0 == 1 && n1 == 1 && m0[0].sender == 0 && m0[0].g.rows == 128);
    /* a key that is not its set's: left out */
    wsync_wbuf_init(&b);
    wsync_put_u32(&b, 1);
    wsync_store_amax_put_set(&b, ko ^ 1, &tensor, q, 1);
    rl = relay(WSYNC_ROLE_RECEIVER, 1, &b);
    CHECK_OK(wsync_store_amax_take(a, &rl));
    wsync_wbuf_free(&b);
    CHECK(wsync_store_amax_nsets(a) == 2);
    /* a truncated relay of a new set with its right key: left out, no failure; whole, it is
     * taken (so the truncation is what left it out) */
    store_amax_member_t k1[1] = {{1, 1, {0, 64, 128, 128}}};
    wsync_wbuf_init(&b);
    wsync_put_u32(&b, 1);
    wsync_store_amax_put_set(&b, wsync_store_amax_key(&tensor, k1, 1), &tensor, k1, 1);
    rl = relay(WSYNC_ROLE_RECEIVER, 1, &b);
    rl.len -= 8;
    CHECK_OK(wsync_store_amax_take(a, &rl));
    CHECK_MSG(wsync_store_amax_nsets(a) == 2, "%u sets", wsync_store_amax_nsets(a));
    rl.len += 8;
    CHECK_OK(wsync_store_amax_take(a, &rl));
    CHECK_MSG(wsync_store_amax_nsets(a) == 3, "%u sets", wsync_store_amax_nsets(a));
    wsync_wbuf_free(&b);
    /* a member of a sender the group lacks: left out */
    store_amax_member_t far[1] = {{5, 0, {0, 1, 1, 1}}};
    wsync_wbuf_init(&b);
    wsync_put_u32(&b, 1);
    wsync_store_amax_put_set(&b, wsync_store_amax_key(&tensor, far, 1), &tensor, far, 1);
    rl = relay(WSYNC_ROLE_RECEIVER, 1, &b);
    CHECK_OK(wsync_store_amax_take(a, &rl));
    wsync_wbuf_free(&b);
    CHECK(wsync_store_amax_nsets(a) == 3);
    /* sets from a sender to sender 0: refused */
    wsync_wbuf_init(&b);
    wsync_put_u64(&b, 3);
    wsync_put_u32(&b, 0);
    rl = relay(WSYNC_ROLE_SENDER, 1, &b);
    CHECK_ST(wsync_store_amax_take(a, &rl), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("per-tensor sets from sender 1");
    wsync_wbuf_free(&b);
    float amax = -1.0f;
    CHECK(!wsync_store_amax_agreed(a, ko, &amax) && amax == -1.0f);
    CHECK(!wsync_store_amax_due(a, 1));
    wsync_store_amax_free(a);
}

static void case_other_sender(void)
{
    store_amax_t *a = NULL;
    store_amax_member_t o[2];
    wsync_wbuf_t b;
    CHECK_OK(wsync_store_amax_create(1, 2, &a));
    if (a == NULL)
        return;
    o_members(o);
    uint64_t ko = wsync_store_amax_key(&tensor, o, 2);
    /* a reader's sets reach sender 0 only: left out here */
    wsync_wbuf_init(&b);
    wsync_put_u32(&b, 1);
    wsync_store_amax_put_set(&b, ko, &tensor, o, 2);
    wsync_relay_t rl = relay(WSYNC_ROLE_RECEIVER, 0, &b);
    CHECK_OK(wsync_store_amax_take(a, &rl));
    wsync_wbuf_free(&b);
    CHECK(wsync_store_amax_nsets(a) == 0 && !wsync_store_amax_due(a, 9));
    /* sender 0's forward: exchanged from version 3 */
    wsync_wbuf_init(&b);
    wsync_put_u64(&b, 3);
    wsync_put_u32(&b, 1);
    wsync_store_amax_put_set(&b, ko, &tensor, o, 2);
    rl = relay(WSYNC_ROLE_SENDER, 0, &b);
    CHECK_OK(wsync_store_amax_take(a, &rl));
    CHECK(wsync_store_amax_nsets(a) == 1);
    CHECK(!wsync_store_amax_due(a, 2) && wsync_store_amax_due(a, 3) && wsync_store_amax_due(a, 4));
    uint32_t n = 0;
    const store_amax_member_t *m = wsync_store_amax_members(a, 0, &n);
    CHECK(n == 1 && m[0].sender == 1);
    /* a malformed forward would part the lists: refused */
    rl.len -= 4;
    CHECK_ST(wsync_store_amax_take(a, &rl), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("sender 0's per-tensor sets are malformed");
    wsync_wbuf_free(&b);
    wsync_store_amax_free(a);
}

/* A sender that could not make its partials tells sender 0 its status (the flags word), and the
 * others' error says NaN or Inf only when that status is NONFINITE; otherwise it names the status
 * and the sender: a timeout is not corrupt weights. */
static void case_refusal(void)
{
    static const wsync_status_t kinds[] = {WSYNC_ERR_NONFINITE, WSYNC_ERR_TIMEOUT,
                                           WSYNC_ERR_DEVICE, WSYNC_ERR_NOMEM};
    CHECK(wsync_store_amax_refused_flags(WSYNC_OK) == 0);
    CHECK(wsync_store_amax_flags_status(0) == WSYNC_OK);
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        uint32_t flags = wsync_store_amax_refused_flags(kinds[i]);
        CHECK_MSG(flags != 0 && wsync_store_amax_flags_status(flags) == kinds[i], "%s: flags %x",
                  wsync_status_name(kinds[i]), flags);
    }
    CHECK_ST(wsync_store_amax_refusal(1, WSYNC_ERR_NONFINITE, NULL, 0), WSYNC_ERR_NONFINITE);
    CHECK_ERR_HAS("sender 1 found a NaN or Inf in its part of a per-tensor target");
    CHECK_ST(wsync_store_amax_refusal(2, WSYNC_ERR_TIMEOUT, NULL, 0), WSYNC_ERR_ABORTED);
    CHECK_ERR_HAS("sender 2 failed its part of the per-tensor amaxes: WSYNC_ERR_TIMEOUT "
                  "(deadline passed)");
    CHECK(strstr(wsync_last_error(), "NaN") == NULL);
    CHECK_ST(wsync_store_amax_refusal(0, WSYNC_ERR_DEVICE, NULL, 0), WSYNC_ERR_ABORTED);
    CHECK_ERR_HAS("sender 0 failed its part of the per-tensor amaxes: WSYNC_ERR_DEVICE "
                  "(device (CUDA) error)");
    CHECK(strstr(wsync_last_error(), "NaN") == NULL);
    CHECK_ST(wsync_store_amax_refusal(3, WSYNC_ERR_NOMEM, NULL, 0), WSYNC_ERR_ABORTED);
    CHECK_ERR_HAS("sender 3 failed its part of the per-tensor amaxes: WSYNC_ERR_NOMEM "
                  "(out of memory)");
    CHECK(strstr(wsync_last_error(), "NaN") == NULL);
    /* with the refusing sender's words (tlen bytes of them, not NUL-terminated) */
    static const char words[] = "sender 1: param 'w': NaN at row 2, column 7XXXX";
    CHECK_ST(wsync_store_amax_refusal(1, WSYNC_ERR_NONFINITE, words, sizeof(words) - 5),
             WSYNC_ERR_NONFINITE);
    CHECK_ERR_HAS("sender 1 found a NaN or Inf in its part of a per-tensor target: sender 1: "
                  "param 'w': NaN at row 2, column 7");
    CHECK(strstr(wsync_last_error(), "XXXX") == NULL);
    CHECK_ST(wsync_store_amax_refusal(2, WSYNC_ERR_TIMEOUT, "no answer", 9), WSYNC_ERR_ABORTED);
    CHECK_ERR_HAS("sender 2 failed its part of the per-tensor amaxes: WSYNC_ERR_TIMEOUT "
                  "(deadline passed): no answer");
}

/* The queue of kept relays gives them back in the order they came, past its first growth, and
 * is empty after a clear (ASan: the messages it owned freed). */
static void case_relayq(void)
{
    store_relayq_t q = {0};
    wsync_msg_t *msg = (wsync_msg_t *)&q;
    wsync_relay_t rl;
    for (int i = 0; i < 20; i++) {
        wsync_relay_t r = {WSYNC_ROLE_SENDER, i, STORE_AMAX_PART_TAG, 0, NULL};
        wsync_store_relayq_push(&q, NULL, &r, "test");
    }
    CHECK(q.n == 20);
    for (int i = 0; i < 12; i++) {
        CHECK(wsync_store_relayq_pop(&q, &msg, &rl));
        CHECK_MSG(msg == NULL && rl.rank == i && rl.tag == STORE_AMAX_PART_TAG, "pop %d: rank %d",
                  i, rl.rank);
    }
    wsync_store_relayq_clear(&q);
    CHECK(q.n == 0 && !wsync_store_relayq_pop(&q, &msg, &rl));
    wsync_relay_t r = {WSYNC_ROLE_RECEIVER, 7, STORE_AMAX_SETS_TAG, 0, NULL};
    wsync_store_relayq_push(&q, NULL, &r, "test");
    CHECK(wsync_store_relayq_pop(&q, &msg, &rl) && rl.rank == 7 && rl.role == WSYNC_ROLE_RECEIVER);
    wsync_store_relayq_free(&q);
    CHECK(q.items == NULL && q.n == 0);
}

/* Many sets (MoE experts' targets): sender 0 takes 5,000 from one reader, none again from a
 * replica, each set k keeps its own members (the index finds every key), in the order they came. */
static void case_many_sets(void)
{
    enum { N = 5000 };
    store_amax_t *a = NULL;
    wsync_wbuf_t b;
    CHECK_OK(wsync_store_amax_create(0, 2, &a));
    if (a == NULL)
        return;
    wsync_wbuf_init(&b);
    wsync_put_u32(&b, N);
    for (uint32_t k = 0; k < N; k++) {
        store_amax_member_t e[1] = {{0, k, {0, 8, 16, 16}}};
        wsync_store_amax_put_set(&b, wsync_store_amax_key(&tensor, e, 1), &tensor, e, 1);
    }
    CHECK(!b.err);
    wsync_relay_t rl = relay(WSYNC_ROLE_RECEIVER, 0, &b);
    CHECK_OK(wsync_store_amax_take(a, &rl));
    rl.rank = 1;
    CHECK_OK(wsync_store_amax_take(a, &rl));
    wsync_wbuf_free(&b);
    CHECK_MSG(wsync_store_amax_nsets(a) == N, "%u sets", wsync_store_amax_nsets(a));
    uint32_t bad = 0;
    for (uint32_t k = 0; k < wsync_store_amax_nsets(a); k++) {
        uint32_t n = 0;
        const store_amax_member_t *m = wsync_store_amax_members(a, k, &n);
        bad += n != 1 || m[0].shard != k;
    }
    CHECK_MSG(bad == 0, "%u sets out of place", bad);
    wsync_store_amax_free(a);
}

int main(void)
{
    RUN(case_key);
    RUN(case_sender0_takes_readers);
    RUN(case_other_sender);
    RUN(case_refusal);
    RUN(case_relayq);
    RUN(case_many_sets);
    return check_summary();
}
