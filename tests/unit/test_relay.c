/* Scheme side data through the coordinator (SCHEME_SETUP / SCHEME_RELAY, core/relay.h): the
 * codec is strict, and a real group (one sender, two receivers, host memory, in this process)
 * forwards bytes to everyone else or to one member, naming the author; a relay to a member that
 * does not exist ends the group with an error naming the culprit. */
#include "core/objects.h"
#include "core/proto.h"
#include "core/relay.h"
#include "core/status.h"
#include "core/util.h"
#include "tests/support/check.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void roundtrip(unsigned type, uint32_t role, int32_t rank, const char *data)
{
    wsync_relay_t in = {role, rank, 42, (uint32_t)strlen(data), (const uint8_t *)data}, out;
    wsync_wbuf_t b;

    wsync_wbuf_init(&b);
    wsync_relay_encode(&in, &b);
    CHECK(!b.err);
    CHECK_OK(wsync_relay_decode(b.data, b.len, type, &out));
    CHECK(out.role == role && out.rank == rank && out.tag == 42 && out.len == in.len);
    CHECK(out.len == 0 || memcmp(out.data, data, out.len) == 0);
    /* every truncation and one extra byte are refused */
    for (size_t n = 0; n < b.len; n++)
        CHECK_ST(wsync_relay_decode(b.data, n, type, &out), WSYNC_ERR_PROTOCOL);
    wsync_put_u8(&b, 0);
    CHECK_ST(wsync_relay_decode(b.data, b.len, type, &out), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS(wsync_msg_name(type));
    wsync_wbuf_free(&b);
}

static wsync_status_t decode_raw(unsigned type, uint32_t role, int32_t rank, uint32_t len,
                                 size_t actual)
{
    wsync_relay_t out;
    wsync_wbuf_t b;
    wsync_status_t st;
    uint8_t zeros[64] = {0};

    wsync_wbuf_init(&b);
    wsync_put_u32(&b, role);
    wsync_put_i32(&b, rank);
    wsync_put_u32(&b, 7);
    wsync_put_u32(&b, len);
    wsync_put_bytes(&b, zeros, actual);
    st = wsync_relay_decode(b.data, b.len, type, &out);
    wsync_wbuf_free(&b);
    return st;
}

static void test_codec(void)
{
    roundtrip(WSYNC_MSG_SCHEME_SETUP, WSYNC_ROLE_NONE, -1, "unique id");
    roundtrip(WSYNC_MSG_SCHEME_SETUP, WSYNC_ROLE_RECEIVER, 3, "");
    roundtrip(WSYNC_MSG_SCHEME_RELAY, WSYNC_ROLE_SENDER, 0, "x");
    CHECK(strcmp(wsync_msg_name(WSYNC_MSG_SCHEME_SETUP), "SCHEME_SETUP") == 0);
    CHECK(strcmp(wsync_msg_name(WSYNC_MSG_SCHEME_RELAY), "SCHEME_RELAY") == 0);

    CHECK_OK(decode_raw(WSYNC_MSG_SCHEME_SETUP, WSYNC_ROLE_NONE, -1, 8, 8));
    /* "everyone" has no rank, and an author is always someone */
    CHECK_ST(decode_raw(WSYNC_MSG_SCHEME_SETUP, WSYNC_ROLE_NONE, 0, 8, 8), WSYNC_ERR_PROTOCOL);
    CHECK_ST(decode_raw(WSYNC_MSG_SCHEME_RELAY, WSYNC_ROLE_NONE, -1, 8, 8), WSYNC_ERR_PROTOCOL);
    CHECK_ST(decode_raw(WSYNC_MSG_SCHEME_SETUP, WSYNC_ROLE_SENDER, -1, 8, 8), WSYNC_ERR_PROTOCOL);
    CHECK_ST(decode_raw(WSYNC_MSG_SCHEME_SETUP, 3, 0, 8, 8), WSYNC_ERR_PROTOCOL);
    /* the length says exactly what follows, and is bounded */
    CHECK_ST(decode_raw(WSYNC_MSG_SCHEME_SETUP, WSYNC_ROLE_SENDER, 0, 9, 8), WSYNC_ERR_PROTOCOL);
    CHECK_ST(decode_raw(WSYNC_MSG_SCHEME_SETUP, WSYNC_ROLE_SENDER, 0, 7, 8), WSYNC_ERR_PROTOCOL);
    CHECK_ST(decode_raw(WSYNC_MSG_SCHEME_SETUP, WSYNC_ROLE_SENDER, 0, WSYNC_RELAY_MAX + 1, 8),
             WSYNC_ERR_PROTOCOL);
    CHECK_ST(decode_raw(WSYNC_MSG_SCHEME_SETUP, WSYNC_ROLE_SENDER, 0, UINT32_MAX, 8),
             WSYNC_ERR_PROTOCOL);
    /* only these two message types */
    CHECK_ST(decode_raw(WSYNC_MSG_PLAN, WSYNC_ROLE_SENDER, 0, 8, 8), WSYNC_ERR_PROTOCOL);
}

/* ---- a real group ------------------------------------------------------------------------- */

#define ROWS 4
#define COLS 64

static char coord_addr[128];
static uint16_t shard_data[ROWS * COLS];

typedef struct {
    int rank;
    wsync_ctx_t *ctx;
    wsync_receiver_t *r;
    uint16_t data[ROWS * COLS];
    wsync_status_t wait_st;
} recv_t;

static void *receiver_main(void *arg)
{
    recv_t *x = arg;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    wsync_piece_t pc = {{"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}}, {{0, 0}, {ROWS, COLS}}, {0, 0}};
    wsync_target_t t = {"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}, x->data, WSYNC_MEM_HOST, 0, &pc, 1,
                        {0}};
    uint64_t v;

    rp.coordinator = coord_addr;
    rp.rank = x->rank;
    rp.nreceivers = 2;
    rp.timeout_ms = 10000;
    rp.heartbeat_ms = 200;
    x->wait_st = WSYNC_ERR_INTERNAL;
    if (wsync_receiver_create(x->ctx, &rp, &x->r) != WSYNC_OK ||
        wsync_receiver_add_target(x->r, &t) != WSYNC_OK)
        return NULL;
    /* sets the receiver up, then times out: no version is pushed */
    x->wait_st = wsync_receiver_wait(x->r, 3000, &v);
    return NULL;
}

/* The next relay at member m: author, tag and bytes as expected. */
static void expect_relay(wsync_member_t *m, uint32_t role, int32_t rank, uint32_t tag,
                         const char *data)
{
    wsync_msg_t *msg = NULL;
    wsync_relay_t r;

    CHECK_OK(wsync_member_relay_recv(m, wsync_deadline_in(5000), &msg, &r));
    if (msg == NULL)
        return;
    CHECK_MSG(r.role == role && r.rank == rank && r.tag == tag, "relay from %u %d tag %u", r.role,
              r.rank, r.tag);
    CHECK(r.len == strlen(data) && memcmp(r.data, data, r.len) == 0);
    wsync_msg_free(msg);
}

static void test_group(void)
{
    wsync_ctx_params_t cp = WSYNC_CTX_PARAMS_INIT;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    wsync_shard_t sh = {{"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}}, {{0, 0}, {ROWS, COLS}},
                        shard_data, WSYNC_MEM_HOST, 0};
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    recv_t rx[2];
    pthread_t th[2];
    wsync_msg_t *none = NULL;
    wsync_relay_t rl;

    memset(rx, 0, sizeof(rx));
    cp.log_level = WSYNC_LOG_WARN;
    CHECK_OK(wsync_ctx_create(&cp, &ctx));
    sp.coordinator = "127.0.0.1:0";
    sp.rank = 0;
    sp.nranks = 1;
    sp.nreceivers = 2;
    sp.timeout_ms = 10000;
    sp.heartbeat_ms = 200;
    sp.scheme = "ipc";
    CHECK_OK(wsync_sender_create(ctx, &sp, &s));
    if (s == NULL)
        goto out;
    snprintf(coord_addr, sizeof(coord_addr), "%s", wsync_sender_coordinator(s));
    CHECK_OK(wsync_sender_add_shard(s, &sh));
    for (int i = 0; i < 2; i++) {
        rx[i].rank = i;
        rx[i].ctx = ctx;
        pthread_create(&th[i], NULL, receiver_main, &rx[i]);
    }
    CHECK_OK(wsync_sender_setup(s));
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++)
        CHECK_MSG(rx[i].wait_st == WSYNC_ERR_TIMEOUT, "receiver %d: %s", i,
                  wsync_status_name(rx[i].wait_st));
    if (rx[0].r == NULL || rx[1].r == NULL)
        goto out;

    /* to everyone else: both receivers, not the author */
    CHECK_OK(wsync_member_relay_send(&s->m, WSYNC_ROLE_NONE, -1, 5, "to all", 6));
    expect_relay(&rx[0].r->m, WSYNC_ROLE_SENDER, 0, 5, "to all");
    expect_relay(&rx[1].r->m, WSYNC_ROLE_SENDER, 0, 5, "to all");
    /* to one member: receiver 1 to receiver 0, and receiver 0 to sender 0 */
    CHECK_OK(wsync_member_relay_send(&rx[1].r->m, WSYNC_ROLE_RECEIVER, 0, 6, "just you", 8));
    expect_relay(&rx[0].r->m, WSYNC_ROLE_RECEIVER, 1, 6, "just you");
    CHECK_OK(wsync_member_relay_send(&rx[0].r->m, WSYNC_ROLE_SENDER, 0, 7, "", 0));
    expect_relay(&s->m, WSYNC_ROLE_RECEIVER, 0, 7, "");
    CHECK_ST(wsync_member_relay_recv(&s->m, wsync_deadline_in(300), &none, &rl), WSYNC_ERR_TIMEOUT);
    CHECK_ST(wsync_member_relay_recv(&rx[1].r->m, wsync_deadline_in(300), &none, &rl),
             WSYNC_ERR_TIMEOUT);

    /* to nobody: the group ends, everyone is told who sent it */
    CHECK_OK(wsync_member_relay_send(&rx[1].r->m, WSYNC_ROLE_RECEIVER, 5, 8, "lost", 4));
    CHECK_ST(wsync_member_relay_recv(&rx[0].r->m, wsync_deadline_in(5000), &none, &rl),
             WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("receiver 1");
    CHECK_ERR_HAS("SCHEME_SETUP to receiver 5");
out:
    for (int i = 0; i < 2; i++)
        wsync_receiver_free(rx[i].r);
    wsync_sender_free(s);
    wsync_ctx_free(ctx);
}

int main(void)
{
    RUN(test_codec);
    RUN(test_group);
    return check_summary();
}
