/* wsync_conn_post (core/loop.h): a send that never waits. Over socketpairs served by a real
 * loop, whose peer (this test) stops reading: posts return at once and the bytes wait in the
 * connection's queue; once the peer reads again every frame arrives whole and in order (a
 * blocking wsync_conn_send made meanwhile comes after them); past the queue's deadline or its
 * cap the connection closes with a reason naming the peer; and a connection that is stuck does
 * not delay another's heartbeats. */
#include "core/frame.h"
#include "core/loop.h"
#include "core/proto.h"
#include "core/status.h"
#include "core/util.h"
#include "tests/support/check.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define PEER_NAME "receiver 7 (pid 4242 on testhost)"

typedef struct {
    pthread_mutex_t mu;
    int closes;
    wsync_status_t why;
    char text[512];
    long long at_ms;
} closes_t;

static void on_msg(void *user, wsync_conn_t *c, wsync_msg_t *m)
{
    (void)user;
    (void)c;
    wsync_msg_free(m);
}

static void on_close(void *user, wsync_conn_t *c, wsync_status_t why, const char *text)
{
    closes_t *cl = user;
    (void)c;
    pthread_mutex_lock(&cl->mu);
    cl->closes++;
    cl->why = why;
    snprintf(cl->text, sizeof(cl->text), "%s", text);
    cl->at_ms = wsync_now_ms();
    pthread_mutex_unlock(&cl->mu);
}

static const wsync_loop_ops_t ops = {on_msg, NULL, on_close, NULL};

/* The payload of frame i, computed from i alone: [i u32][bytes that depend on i and position] */
static uint32_t frame_len(uint32_t i)
{
    return 4 + (i * 7919u) % 40000u;
}

static uint8_t frame_byte(uint32_t i, uint32_t j)
{
    return (uint8_t)(i * 131u + j * 7u + (j >> 9));
}

static uint8_t *frame_payload(uint32_t i)
{
    uint32_t len = frame_len(i);
    uint8_t *p = malloc(len);
    memcpy(p, &i, 4);
    for (uint32_t j = 4; j < len; j++)
        p[j] = frame_byte(i, j);
    return p;
}

/* Read exactly n bytes by timeout_ms; 0 on success. */
static int read_full(int fd, void *buf, size_t n, int timeout_ms)
{
    int64_t deadline = wsync_deadline_in(timeout_ms);
    size_t got = 0;
    while (got < n) {
        struct pollfd p = {fd, POLLIN, 0};
        int left = wsync_ms_left(deadline);
        if (left <= 0 || poll(&p, 1, left) <= 0)
            return -1;
        ssize_t r = read(fd, (uint8_t *)buf + got, n - got);
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

/* Read one frame: its type, and its payload (malloc'd) in *payload. 0 on success. */
static int read_frame(int fd, uint16_t *type, uint8_t **payload, uint32_t *len, int timeout_ms)
{
    uint8_t hb[WSYNC_FRAME_HDR];
    wsync_frame_hdr_t h;
    char why[200];

    if (read_full(fd, hb, sizeof(hb), timeout_ms) != 0)
        return -1;
    if (wsync_frame_hdr_decode(hb, &h, why, sizeof(why)) != WSYNC_OK) {
        fprintf(stderr, "bad frame header: %s\n", why);
        return -1;
    }
    *payload = malloc(h.len ? h.len : 1);
    if (read_full(fd, *payload, h.len, timeout_ms) != 0 || !wsync_frame_checksum_ok(&h, *payload)) {
        free(*payload);
        return -1;
    }
    *type = h.type;
    *len = h.len;
    return 0;
}

static size_t queued(wsync_conn_t *c)
{
    pthread_mutex_lock(&c->send_lock);
    size_t n = c->oq_bytes;
    pthread_mutex_unlock(&c->send_lock);
    return n;
}

typedef struct {
    wsync_loop_t *loop;
    closes_t cl;
    int sv[2];          /* sv[0]: the loop's; sv[1]: the peer's (this test) */
    wsync_conn_t *c;
} rig_t;

static void rig_open(rig_t *r, unsigned flags, int heartbeat_ms)
{
    int small = 16384;

    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->cl.mu, NULL);
    CHECK_OK(wsync_loop_create(&ops, &r->cl, heartbeat_ms, 60000, &r->loop));
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, r->sv) == 0);
    /* small buffers: a few frames fill them */
    setsockopt(r->sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    setsockopt(r->sv[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    CHECK_OK(wsync_loop_add(r->loop, r->sv[0], flags, PEER_NAME, NULL, &r->c));
    CHECK_OK(wsync_loop_start(r->loop));
}

static void rig_close(rig_t *r)
{
    wsync_loop_free(r->loop);   /* closes sv[0] */
    close(r->sv[1]);
    pthread_mutex_destroy(&r->cl.mu);
}

/* Wait until on_close was called or timeout_ms; the number of calls. */
static int wait_close(rig_t *r, int timeout_ms)
{
    int64_t deadline = wsync_deadline_in(timeout_ms);
    for (;;) {
        pthread_mutex_lock(&r->cl.mu);
        int n = r->cl.closes;
        pthread_mutex_unlock(&r->cl.mu);
        if (n > 0 || wsync_ms_left(deadline) <= 0)
            return n;
        usleep(5000);
    }
}

typedef struct {
    wsync_conn_t *c;
    wsync_status_t st;
} blocking_t;

static void *blocking_send(void *arg)
{
    blocking_t *b = arg;
    uint64_t v = 0x5e4d5e4dULL;
    b->st = wsync_conn_send(b->c, WSYNC_MSG_BEGIN, &v, sizeof(v), NULL, 0, 10000);
    return NULL;
}

/* The peer stops reading: posts return at once, the queue holds what the socket did not take;
 * the peer reads again: every frame arrives whole and in order, then the blocking send's. */
static void test_order_after_stall(void)
{
    enum { N = 120 };
    rig_t r;
    size_t total = 0;
    long long slowest = 0;

    rig_open(&r, 0, 1000);
    for (uint32_t i = 0; i < N; i++) {
        uint8_t *p = frame_payload(i);
        long long t0 = wsync_now_ms();
        CHECK_OK(wsync_conn_post(r.c, WSYNC_MSG_SCHEME_RELAY, p, frame_len(i), 10000, NULL));
        slowest = WSYNC_MAX(slowest, wsync_now_ms() - t0);
        total += WSYNC_FRAME_HDR + frame_len(i);
        free(p);
    }
    size_t q = queued(r.c);
    CHECK_MSG(slowest < 100, "a post took %lld ms", slowest);
    /* the socket took a few frames at most; the rest waits in the queue */
    CHECK_MSG(q > total / 2 && q < total, "%zu of %zu bytes queued", q, total);

    /* a blocking send from another thread goes after the queue, not into its middle */
    blocking_t b = {r.c, WSYNC_ERR_INTERNAL};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, blocking_send, &b) == 0);
    usleep(50000);
    for (uint32_t i = 0; i < N; i++) {
        uint16_t type = 0;
        uint8_t *got = NULL;
        uint32_t len = 0;
        if (read_frame(r.sv[1], &type, &got, &len, 5000) != 0) {
            CHECK_MSG(0, "frame %u did not arrive whole", i);
            break;
        }
        uint32_t idx;
        memcpy(&idx, got, 4);
        CHECK_MSG(type == WSYNC_MSG_SCHEME_RELAY && idx == i && len == frame_len(i),
                  "frame %u: type %u index %u length %u", i, type, idx, len);
        int same = 1;
        for (uint32_t j = 4; j < len && same; j++)
            same = got[j] == frame_byte(i, j);
        CHECK_MSG(same, "frame %u's bytes differ", i);
        free(got);
    }
    uint16_t type = 0;
    uint8_t *got = NULL;
    uint32_t len = 0;
    CHECK(read_frame(r.sv[1], &type, &got, &len, 5000) == 0);
    CHECK(type == WSYNC_MSG_BEGIN && len == 8 && got != NULL && got[0] == 0x4d);
    free(got);
    pthread_join(th, NULL);
    CHECK_ST(b.st, WSYNC_OK);
    /* the loop drained and disarmed; nothing closed */
    usleep(50000);
    CHECK(queued(r.c) == 0);
    CHECK(wait_close(&r, 0) == 0);
    /* posts go straight through again */
    uint64_t v = 7;
    CHECK_OK(wsync_conn_post(r.c, WSYNC_MSG_BEGIN, &v, sizeof(v), 1000, NULL));
    CHECK(queued(r.c) == 0);
    CHECK(read_frame(r.sv[1], &type, &got, &len, 2000) == 0 && type == WSYNC_MSG_BEGIN);
    free(got);
    rig_close(&r);
}

/* Nobody reads: the queue's oldest frame passes its deadline and the connection closes, naming
 * the peer, the bytes and the time; later posts are refused. */
static void test_deadline(void)
{
    rig_t r;
    long long t0;

    rig_open(&r, WSYNC_CONN_HEARTBEAT, 1000);
    t0 = wsync_now_ms();
    for (uint32_t i = 0; i < 40; i++) {
        uint8_t *p = frame_payload(i);
        CHECK_OK(wsync_conn_post(r.c, WSYNC_MSG_SCHEME_RELAY, p, frame_len(i), 300, NULL));
        free(p);
    }
    CHECK(queued(r.c) > 0);
    CHECK(wait_close(&r, 3000) == 1);
    long long took = r.cl.at_ms - t0;
    CHECK_MSG(took >= 300 && took < 1000, "closed after %lld ms (deadline 300)", took);
    CHECK_ST(r.cl.why, WSYNC_ERR_TIMEOUT);
    CHECK_MSG(strstr(r.cl.text, PEER_NAME " stopped reading its control connection: ") != NULL &&
              strstr(r.cl.text, " KB queued for ") != NULL &&
              strstr(r.cl.text, "(deadline 300 ms)") != NULL, "text: %s", r.cl.text);
    uint64_t v = 1;
    CHECK_ST(wsync_conn_post(r.c, WSYNC_MSG_BEGIN, &v, sizeof(v), 1000, NULL), WSYNC_ERR_PEER_LOST);
    CHECK_ERR_HAS("the connection is closed");
    CHECK(queued(r.c) == 0);   /* freed with the connection's end */
    rig_close(&r);
}

/* Nobody reads: the post that would pass the cap closes the connection, saying so. */
static void test_cap(void)
{
    rig_t r;
    wsync_status_t st = WSYNC_OK;
    int posts = 0;
    size_t before = 0;
    uint8_t *p = calloc(1, 65536);

    rig_open(&r, WSYNC_CONN_HEARTBEAT, 1000);
    wsync_loop_set_queue_max(r.loop, 256 * 1024);
    while (posts < 100 && (st = wsync_conn_post(r.c, WSYNC_MSG_SCHEME_RELAY, p, 65536, 60000,
                                                NULL)) == WSYNC_OK) {
        before = queued(r.c);
        posts++;
    }
    CHECK_ST(st, WSYNC_ERR_PEER_LOST);
    CHECK_ERR_HAS(PEER_NAME " stopped reading its control connection: ");
    CHECK_ERR_HAS("SCHEME_RELAY more would pass the cap of 262.1 KB");
    CHECK_MSG(before <= 256 * 1024 && before + 65536 + WSYNC_FRAME_HDR > 256 * 1024,
              "%zu bytes were queued after %d posts", before, posts);
    CHECK(wait_close(&r, 2000) == 1);
    CHECK_ST(r.cl.why, WSYNC_ERR_PEER_LOST);
    CHECK_MSG(strstr(r.cl.text, "would pass the cap") != NULL, "text: %s", r.cl.text);
    free(p);
    rig_close(&r);
}

/* One loop, two connections: A's peer stopped reading with a large queue (shared by the posts
 * of one payload); B's peer still gets its heartbeats every period and a post at once. */
static void test_stuck_peer_does_not_delay_others(void)
{
    wsync_loop_t *loop;
    closes_t cl;
    int a[2], b[2], small = 16384;
    wsync_conn_t *ca, *cb;
    uint32_t big = 1u << 20;
    uint8_t *p = malloc(big);
    wsync_outbuf_t *shared = NULL;

    memset(&cl, 0, sizeof(cl));
    pthread_mutex_init(&cl.mu, NULL);
    for (uint32_t j = 0; j < big; j++)
        p[j] = frame_byte(3, j);
    CHECK_OK(wsync_loop_create(&ops, &cl, 50, 60000, &loop));
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, a) == 0);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, b) == 0);
    setsockopt(a[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    CHECK_OK(wsync_loop_add(loop, a[0], WSYNC_CONN_HEARTBEAT, "receiver 1 (pid 1 on h)", NULL, &ca));
    CHECK_OK(wsync_loop_add(loop, b[0], WSYNC_CONN_HEARTBEAT, "receiver 2 (pid 2 on h)", NULL, &cb));
    CHECK_OK(wsync_loop_start(loop));
    /* four 1 MB frames to A, one copy of the payload for all of them */
    for (int k = 0; k < 4; k++)
        CHECK_OK(wsync_conn_post(ca, WSYNC_MSG_SCHEME_RELAY, p, big, 20000, &shared));
    CHECK(shared != NULL);
    wsync_outbuf_release(shared);
    CHECK(queued(ca) > 3u * big);
    /* B: heartbeats keep coming every 50 ms; none is more than a few periods late */
    long long last = wsync_now_ms(), worst = 0;
    int beats = 0;
    while (beats < 15) {
        uint16_t type = 0;
        uint8_t *got = NULL;
        uint32_t len = 0;
        if (read_frame(b[1], &type, &got, &len, 2000) != 0)
            break;
        free(got);
        long long now = wsync_now_ms();
        if (type == WSYNC_MSG_HEARTBEAT) {
            worst = WSYNC_MAX(worst, now - last);
            last = now;
            beats++;
        }
    }
    CHECK_MSG(beats == 15 && worst < 500, "%d heartbeats, longest gap %lld ms", beats, worst);
    /* A's peer reads again: four intact copies (after any heartbeat queued before them) */
    int copies = 0;
    for (int k = 0; k < 8 && copies < 4; k++) {
        uint16_t type = 0;
        uint8_t *got = NULL;
        uint32_t len = 0;
        if (read_frame(a[1], &type, &got, &len, 5000) != 0)
            break;
        if (type == WSYNC_MSG_SCHEME_RELAY)
            copies += len == big && memcmp(got, p, big) == 0;
        free(got);
    }
    CHECK_MSG(copies == 4, "%d intact copies of 4", copies);
    pthread_mutex_lock(&cl.mu);
    CHECK(cl.closes == 0);
    pthread_mutex_unlock(&cl.mu);
    wsync_loop_free(loop);
    close(a[1]);
    close(b[1]);
    pthread_mutex_destroy(&cl.mu);
    free(p);
}

static void *flush_thread(void *arg)
{
    wsync_loop_flush(arg, 5000);
    return NULL;
}

/* A stopped loop's queue goes out with wsync_loop_flush, within its deadline. */
static void test_flush(void)
{
    rig_t r;

    rig_open(&r, 0, 1000);
    wsync_loop_stop(r.loop);
    for (uint32_t i = 0; i < 20; i++) {
        uint8_t *p = frame_payload(i);
        CHECK_OK(wsync_conn_post(r.c, WSYNC_MSG_SCHEME_RELAY, p, frame_len(i), 5000, NULL));
        free(p);
    }
    CHECK(queued(r.c) > 0);
    long long t0 = wsync_now_ms();
    wsync_loop_flush(r.loop, 200);           /* nobody reads: gives up at its deadline */
    long long took = wsync_now_ms() - t0;
    CHECK_MSG(took >= 190 && took < 1000, "flush took %lld ms", took);
    CHECK(queued(r.c) > 0);
    /* a reader now: a flush in another thread writes everything, in order */
    pthread_t th;
    CHECK(pthread_create(&th, NULL, flush_thread, r.loop) == 0);
    int ok = 1;
    for (uint32_t i = 0; i < 20 && ok; i++) {
        uint16_t type = 0;
        uint8_t *got = NULL;
        uint32_t len = 0, idx = 0;
        if (read_frame(r.sv[1], &type, &got, &len, 5000) != 0) {
            ok = 0;
            break;
        }
        memcpy(&idx, got, 4);
        ok = idx == i && len == frame_len(i) && (len == 4 || got[len - 1] == frame_byte(i, len - 1));
        free(got);
    }
    pthread_join(th, NULL);
    CHECK(queued(r.c) == 0);
    CHECK_MSG(ok, "frames did not arrive in order after flushes");
    rig_close(&r);
}

int main(void)
{
    RUN(test_order_after_stall);
    RUN(test_deadline);
    RUN(test_cap);
    RUN(test_stuck_peer_does_not_delay_others);
    RUN(test_flush);
    return check_summary();
}
