/* Fuzz target: the control plane as a hostile peer sees it — a byte stream of frames (header
 * checks of core/frame.c, reassembly in core/loop.c), the payload of every message type decoded
 * as its receiver decodes it (HELLO, DESCRIBE, PLAN, status messages, the store's PUBLISH and
 * DIRECTORY with their directory entries, the schemes' SCHEME_SETUP and SCHEME_RELAY, the
 * fixed-size ones), and a real coordinator's handlers
 * (core/coordinator.c) driven by one or two fuzzed clients.
 *
 * Input: a mode byte, a flags byte, then the stream.
 *   mode % 4  0: decode the stream in this thread (fast, deterministic)
 *             1: write it into a socketpair read by a real progress loop (wsync_loop_*)
 *             2: a coordinator for 1 sender and 1 receiver; two TCP clients, the stream split
 *                at the u16 that starts it, each client sending one frame in turn
 *             3: a coordinator for 1 sender and 1 receiver; one TCP client sends it all
 *   flags     bit 0: fix every frame's checksum before sending, so that payloads get past the
 *                    checksum to their handlers (modes 1-3)
 *             bit 1: write in 7-byte pieces, so that frames arrive split (modes 1-3)
 *             bit 2: the loop's connection reads with recvmsg (Unix, may carry descriptors)
 *             bit 3: the loop's connection has heartbeats on (the loop writes to the peer too)
 *             bits 4-6: descriptors (0-7, /dev/null) sent with the stream's first byte (mode 1)
 * In-thread mode hands every payload to its decoder whatever the checksum says: the checksum
 * catches corruption, not a peer that lies, and a lying peer can always compute it.
 *
 * Properties checked besides memory safety: what a decoder accepts encodes back to the same
 * bytes; a loop or coordinator run ends (every connection closed) within 15 s of the stream's
 * end and leaves no descriptor open. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/frame.h"
#include "core/log.h"
#include "core/loop.h"
#include "core/objects.h"
#include "core/proto.h"
#include "core/sock.h"
#include "core/util.h"
#include "core/wire.h"
#include "reshard/plan.h"
#include "tests/fuzz/fuzz.h"

/* ---- payload decoders, one per message type ------------------------------------------------ */

static void same_bytes(const wsync_wbuf_t *b, const uint8_t *p, size_t n, const char *what)
{
    FUZZ_ASSERT(!b->err, "%s: re-encoding failed", what);
    FUZZ_ASSERT(b->len == n && (n == 0 || memcmp(b->data, p, n) == 0),
                "%s: decoded then encoded gives %zu bytes, not the %zu received", what, b->len, n);
}

static void on_hello(const uint8_t *p, size_t n)
{
    wsync_hello_t h;
    wsync_wbuf_t b;

    if (wsync_hello_decode(p, n, &h) != WSYNC_OK) {
        /* outputs are cleared on failure */
        FUZZ_ASSERT(h.hostname == NULL && h.host_id == NULL && h.data_addr == NULL &&
                        h.scheme == NULL, "a failed HELLO decode left strings behind");
        return;
    }
    FUZZ_ASSERT(h.host_id != NULL, "HELLO without host_id accepted");
    FUZZ_ASSERT(h.role == WSYNC_ROLE_SENDER || h.role == WSYNC_ROLE_RECEIVER, "role %u", h.role);
    wsync_wbuf_init(&b);
    wsync_hello_encode(&h, &b);
    same_bytes(&b, p, n, "HELLO");
    wsync_wbuf_free(&b);
    wsync_hello_clear(&h);
}

/* The coordinator reads a sender's DESCRIBE as shards and a receiver's as targets: try both. */
static void on_describe(const uint8_t *p, size_t n)
{
    wsync_rbuf_t r;
    wsync_shard_desc_t *sd = NULL;
    wsync_target_desc_t *td = NULL;
    size_t ns = 0, nt = 0;
    wsync_wbuf_t b;

    wsync_rbuf_init(&r, p, n);
    if (wsync_shards_decode(&r, &sd, &ns) == WSYNC_OK) {
        wsync_wbuf_init(&b);
        wsync_shards_encode(sd, ns, &b);
        same_bytes(&b, p, n - wsync_rbuf_left(&r), "shard descriptions");
        wsync_wbuf_free(&b);
        wsync_shard_descs_free(sd, ns);
    }
    wsync_rbuf_init(&r, p, n);
    if (wsync_targets_decode(&r, &td, &nt) == WSYNC_OK) {
        wsync_wbuf_init(&b);
        wsync_targets_encode(td, nt, &b);
        same_bytes(&b, p, n - wsync_rbuf_left(&r), "target descriptions");
        wsync_wbuf_free(&b);
        wsync_target_descs_free(td, nt);
    }
}

/* As wsync_member_await_plan: the message, then the plan it carries. */
static void on_plan(const uint8_t *p, size_t n)
{
    wsync_plan_msg_t m;
    wsync_plan_t *plan = NULL;
    wsync_wbuf_t b;

    if (wsync_plan_msg_decode(p, n, &m) != WSYNC_OK) {
        FUZZ_ASSERT(m.scheme == NULL && m.peers == NULL && m.explain == NULL,
                    "a failed PLAN decode left memory behind");
        return;
    }
    FUZZ_ASSERT(m.plan != NULL && m.plan >= p && m.plan + m.plan_len <= p + n,
                "the plan does not lie inside the payload");
    wsync_wbuf_init(&b);
    wsync_plan_msg_encode(&m, &b);
    same_bytes(&b, p, n, "PLAN message");
    wsync_wbuf_free(&b);
    if (wsync_plan_decode(m.plan, m.plan_len, &plan) == WSYNC_OK) {
        wsync_wbuf_init(&b);
        wsync_plan_encode(plan, &b);
        same_bytes(&b, m.plan, m.plan_len, "plan");
        wsync_wbuf_free(&b);
        wsync_plan_free(plan);
    }
    wsync_plan_msg_clear(&m);
}

static void on_status(const uint8_t *p, size_t n)
{
    wsync_status_t st;
    char text[1024];

    memset(text, 'x', sizeof(text));
    if (wsync_status_msg_decode(p, n, &st, text, sizeof(text)) == WSYNC_OK)
        FUZZ_ASSERT(st < 0 && st >= WSYNC_ERR_INTERNAL, "status %d accepted", (int)st);
    else
        FUZZ_ASSERT(st == WSYNC_ERR_PROTOCOL, "a malformed status message gave %d", (int)st);
    FUZZ_ASSERT(memchr(text, '\0', sizeof(text)) != NULL, "the text is not terminated");
    /* what member_on_msg and coord_on_msg do with it next */
    FUZZ_ASSERT(wsync_status_str(st) != NULL && wsync_status_name(st) != NULL, "no name");
}

/* One directory entry from r, checked as the coordinator and the store's readers rely on it. */
static int dir_entry(wsync_rbuf_t *r)
{
    const uint8_t *start = r->p;
    wsync_dir_entry_t e;
    wsync_wbuf_t b;

    if (wsync_dir_entry_decode(r, &e) != WSYNC_OK) {
        FUZZ_ASSERT(e.transport == NULL && e.regions == NULL && e.shards == NULL,
                    "a failed directory entry decode left memory behind");
        return -1;
    }
    for (uint32_t i = 0; i < e.nshards; i++) {
        const struct wsync_dir_region *g;
        FUZZ_ASSERT(e.shards[i].region < e.nregions, "shard %u in region %u of %u", i,
                    e.shards[i].region, e.nregions);
        g = &e.regions[e.shards[i].region];
        FUZZ_ASSERT(e.shards[i].addr >= g->base && e.shards[i].addr - g->base <= g->len,
                    "shard %u outside its region", i);
    }
    for (uint32_t i = 0; i < e.nregions; i++)
        FUZZ_ASSERT(e.regions[i].rkey != NULL || e.regions[i].rkey_len == 0, "rkey");
    wsync_wbuf_init(&b);
    wsync_dir_entry_encode(&e, &b);
    same_bytes(&b, start, (size_t)(r->p - start), "directory entry");
    wsync_wbuf_free(&b);
    wsync_dir_entry_clear(&e);
    return 0;
}

/* PUBLISH: u64 version, one entry, nothing after (core/coordinator.c on_publish). */
static void on_publish(const uint8_t *p, size_t n)
{
    wsync_rbuf_t r;

    wsync_rbuf_init(&r, p, n);
    (void)wsync_get_u64(&r);
    if (dir_entry(&r) == 0)
        (void)wsync_rbuf_left(&r);
}

/* DIRECTORY: u64 seq, i32 status, str text, then if OK u64 version, u32 n, n entries
 * (schemes/store.c store_receiver_fetch; there n must equal the number of senders). */
static void on_directory(const uint8_t *p, size_t n)
{
    wsync_rbuf_t r;
    char *text;
    int32_t status;
    uint32_t count;

    wsync_rbuf_init(&r, p, n);
    (void)wsync_get_u64(&r);
    status = wsync_get_i32(&r);
    text = wsync_get_str(&r, WSYNC_STR_MAX);
    free(text);
    if (r.err || status != WSYNC_OK)
        return;
    (void)wsync_get_u64(&r);
    count = wsync_get_u32(&r);
    for (uint32_t s = 0; s < count && s < 4096 && !r.err; s++)
        if (dir_entry(&r) != 0)
            break;
}

/* SCHEME_SETUP (the coordinator) and SCHEME_RELAY (core/relay.h): strict, and what is accepted
 * encodes back to the same bytes. */
static void on_relay(uint16_t type, const uint8_t *p, size_t n)
{
    wsync_relay_t r;
    wsync_wbuf_t b;

    if (wsync_relay_decode(p, n, type, &r) != WSYNC_OK)
        return;
    FUZZ_ASSERT(r.len <= WSYNC_RELAY_MAX && (r.len == 0 || (r.data >= p && r.data + r.len == p + n)),
                "relay data outside the payload");
    FUZZ_ASSERT(r.role == WSYNC_ROLE_SENDER || r.role == WSYNC_ROLE_RECEIVER ||
                    (type == WSYNC_MSG_SCHEME_SETUP && r.role == WSYNC_ROLE_NONE && r.rank == -1),
                "relay role %u rank %d accepted", r.role, r.rank);
    wsync_wbuf_init(&b);
    wsync_relay_encode(&r, &b);
    same_bytes(&b, p, n, wsync_msg_name(type));
    wsync_wbuf_free(&b);
}

/* The fixed-size messages: each field read, the length checked, as their handlers do. */
static void on_fixed(uint16_t type, const uint8_t *p, size_t n)
{
    wsync_rbuf_t r;

    wsync_rbuf_init(&r, p, n);
    switch (type) {
    case WSYNC_MSG_FETCH:
        (void)wsync_get_u64(&r);
        (void)wsync_get_u64(&r);
        (void)wsync_get_u64(&r);
        break;
    case WSYNC_MSG_DATA_HELLO:
        (void)wsync_get_u32(&r);
        (void)wsync_get_u32(&r);
        break;
    case WSYNC_MSG_READY:
        (void)wsync_get_u64(&r);
        (void)wsync_get_u32(&r);
        (void)wsync_get_u32(&r);
        break;
    case WSYNC_MSG_RELEASE:
        (void)wsync_get_u64(&r);
        (void)wsync_get_u32(&r);
        break;
    default:
        (void)wsync_get_u64(&r);
        break;
    }
    FUZZ_ASSERT(r.err || wsync_rbuf_left(&r) <= n, "reader ran past its end");
}

static void handle(uint16_t type, const uint8_t *p, size_t n)
{
    FUZZ_ASSERT(wsync_msg_name(type) != NULL, "no name for type %u", type);
    switch (type) {
    case WSYNC_MSG_HELLO:
        on_hello(p, n);
        break;
    case WSYNC_MSG_DESCRIBE:
        on_describe(p, n);
        break;
    case WSYNC_MSG_PLAN:
        on_plan(p, n);
        break;
    case WSYNC_MSG_ERROR:
    case WSYNC_MSG_ABORT:
    case WSYNC_MSG_PEER_LOST:
        on_status(p, n);
        break;
    case WSYNC_MSG_PUBLISH:
        on_publish(p, n);
        break;
    case WSYNC_MSG_DIRECTORY:
        on_directory(p, n);
        break;
    case WSYNC_MSG_SCHEME_SETUP:
    case WSYNC_MSG_SCHEME_RELAY:
        on_relay(type, p, n);
        break;
    case WSYNC_MSG_WELCOME:
    case WSYNC_MSG_BYE:
    case WSYNC_MSG_HEARTBEAT:
    case WSYNC_MSG_DATA_FDS:     /* scheme-defined, read against a receiver's plan (ipc_share.c) */
        break;
    default:
        on_fixed(type, p, n);
        break;
    }
}

/* ---- in-thread: the frame rules of core/frame.c over the whole stream ------------------------ */

static void decode_stream(const uint8_t *p, size_t n)
{
    while (n >= WSYNC_FRAME_HDR) {
        wsync_frame_hdr_t h;
        char why[200];

        why[0] = '\0';
        if (wsync_frame_hdr_decode(p, &h, why, sizeof(why)) != WSYNC_OK) {
            FUZZ_ASSERT(why[0] != '\0', "a refused header without a reason");
            return;                                    /* the connection would close */
        }
        FUZZ_ASSERT(h.type > 0 && h.type < WSYNC_MSG_COUNT_ && h.len <= WSYNC_FRAME_MAX,
                    "header accepted with type %u, len %u", h.type, h.len);
        p += WSYNC_FRAME_HDR;
        n -= WSYNC_FRAME_HDR;
        if (h.len > n)
            return;                                    /* closed in the middle of a frame */
        (void)wsync_frame_checksum_ok(&h, p);
        handle(h.type, p, h.len);
        p += h.len;
        n -= h.len;
    }
}

/* ---- through a real progress loop ---------------------------------------------------------- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int closed;
    int messages;
} loop_state_t;

static void loop_on_msg(void *user, wsync_conn_t *c, wsync_msg_t *m)
{
    loop_state_t *s = user;

    (void)c;
    FUZZ_ASSERT(m->nfds >= 0 && m->nfds <= WSYNC_MSG_MAX_FDS, "%d fds", m->nfds);
    handle(m->type, m->payload, m->len);
    s->messages++;
    wsync_msg_free(m);
}

static void loop_on_close(void *user, wsync_conn_t *c, wsync_status_t why, const char *text)
{
    loop_state_t *s = user;

    (void)c;
    (void)why;
    FUZZ_ASSERT(text != NULL, "close without a reason");
    pthread_mutex_lock(&s->mu);
    s->closed++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Rewrite each frame's checksum to match its payload, as a peer that lies carefully would. */
static void fix_checksums(uint8_t *p, size_t n)
{
    while (n >= WSYNC_FRAME_HDR) {
        uint32_t len = (uint32_t)p[12] | (uint32_t)p[13] << 8 | (uint32_t)p[14] << 16 |
                       (uint32_t)p[15] << 24;
        uint16_t type = (uint16_t)(p[6] | p[7] << 8);
        uint32_t flags = (uint32_t)p[8] | (uint32_t)p[9] << 8 | (uint32_t)p[10] << 16 |
                         (uint32_t)p[11] << 24;
        uint8_t hdr[WSYNC_FRAME_HDR];
        if (len > n - WSYNC_FRAME_HDR)
            return;
        wsync_frame_hdr_encode(type, flags, p + WSYNC_FRAME_HDR, len, hdr);
        memcpy(p + 16, hdr + 16, 8);
        p += WSYNC_FRAME_HDR + len;
        n -= WSYNC_FRAME_HDR + len;
    }
}

static void send_stream(int fd, const uint8_t *p, size_t n, int nfds, int piece)
{
    int fds[8];
    int k = 0;

    for (; k < nfds; k++)
        fds[k] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    while (n > 0) {
        size_t want = piece > 0 && (size_t)piece < n ? (size_t)piece : n;
        struct iovec iov = {(void *)p, want};
        struct msghdr mh;
        char cbuf[CMSG_SPACE(sizeof(fds))];
        ssize_t got;

        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        if (nfds > 0) {
            struct cmsghdr *cm;
            memset(cbuf, 0, sizeof(cbuf));
            mh.msg_control = cbuf;
            mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
            cm = CMSG_FIRSTHDR(&mh);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
            memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
        }
        got = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf = {fd, POLLOUT, 0};
            int rc;
            while ((rc = poll(&pf, 1, 15000)) < 0 && errno == EINTR)
                ;
            if (rc == 1)
                continue;
        }
        if (got <= 0)
            break;                                     /* the loop closed its end: fine */
        nfds = 0;
        p += got;
        n -= (size_t)got;
    }
    for (int i = 0; i < k; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

static void run_loop(uint8_t flags, const uint8_t *p, size_t n)
{
    static const wsync_loop_ops_t ops = {loop_on_msg, NULL, loop_on_close, NULL};
    loop_state_t s = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    unsigned cflags = ((flags & 4) ? WSYNC_CONN_UNIX : 0) | ((flags & 8) ? WSYNC_CONN_HEARTBEAT : 0);
    int fds_before = fuzz_count_fds(), sv[2];
    uint8_t *copy = malloc(n ? n : 1);
    wsync_loop_t *loop = NULL;
    wsync_conn_t *conn = NULL;
    struct timespec until;

    FUZZ_ASSERT(copy != NULL, "no memory");
    memcpy(copy, p, n);
    if (flags & 1)
        fix_checksums(copy, n);
    FUZZ_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair: %s",
                strerror(errno));
    FUZZ_ASSERT(wsync_loop_create(&ops, &s, 1000, 60000, &loop) == WSYNC_OK, "loop_create: %s",
                wsync_last_error());
    FUZZ_ASSERT(wsync_loop_add(loop, sv[0], cflags, "the fuzzer", NULL, &conn) == WSYNC_OK,
                "loop_add: %s", wsync_last_error());
    FUZZ_ASSERT(wsync_loop_start(loop) == WSYNC_OK, "loop_start: %s", wsync_last_error());
    send_stream(sv[1], copy, n, (flags >> 4) & 7, (flags & 2) ? 7 : 0);
    shutdown(sv[1], SHUT_WR);

    /* the loop must report the end of the stream (an orderly close, a protocol error) soon */
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 15;
    pthread_mutex_lock(&s.mu);
    while (s.closed == 0)
        if (pthread_cond_timedwait(&s.cv, &s.mu, &until) != 0)
            break;
    FUZZ_ASSERT(s.closed == 1, "the loop reported %d closes of one connection in 15 s", s.closed);
    pthread_mutex_unlock(&s.mu);

    wsync_loop_free(loop);
    close(sv[1]);
    free(copy);
    FUZZ_ASSERT(fuzz_count_fds() == fds_before, "%d descriptors open after the loop, %d before",
                fuzz_count_fds(), fds_before);
}

/* ---- a coordinator and its clients ----------------------------------------------------------- */

/* Read what the coordinator sends (WELCOME, PLAN, ABORT...) until it closes the connection;
 * returns 0 once every client saw its end, -1 if one stayed open past the deadline. */
static int drain(const int *fds, int n, int64_t deadline_ms)
{
    int open = n, done[2] = {0, 0};
    uint8_t buf[65536];

    while (open > 0) {
        struct pollfd pf[2];
        int k = 0, map[2];
        for (int i = 0; i < n; i++) {
            if (done[i])
                continue;
            pf[k].fd = fds[i];
            pf[k].events = POLLIN;
            map[k++] = i;
        }
        int left = wsync_ms_left(deadline_ms), rc;
        if (left <= 0)
            return -1;
        rc = poll(pf, (nfds_t)k, left);
        if (rc < 0 && errno == EINTR)  /* libFuzzer's -timeout alarm ticks every second */
            continue;
        if (rc <= 0)
            return -1;
        for (int j = 0; j < k; j++) {
            if (pf[j].revents == 0)
                continue;
            ssize_t got = read(pf[j].fd, buf, sizeof(buf));
            if (got <= 0 && !(got < 0 && errno == EINTR)) {
                done[map[j]] = 1;
                open--;
            }
        }
    }
    return 0;
}

static void run_coordinator(uint8_t flags, const uint8_t *p, size_t n, int two)
{
    int fds_before = fuzz_count_fds(), fds[2] = {-1, -1}, nclients = two ? 2 : 1;
    size_t split = n, part[2];
    uint8_t *copy;
    wsync_coord_t *co = NULL;

    if (two) {
        if (n < 2)
            return;
        split = ((size_t)p[0] | (size_t)p[1] << 8) % (n - 1);
        p += 2;
        n -= 2;
    }
    part[0] = split;
    part[1] = n - split;
    copy = malloc(n ? n : 1);
    FUZZ_ASSERT(copy != NULL, "no memory");
    memcpy(copy, p, n);
    if (flags & 1) {
        fix_checksums(copy, part[0]);
        if (two)
            fix_checksums(copy + part[0], part[1]);
    }
    FUZZ_ASSERT(wsync_coord_create("127.0.0.1:0", 1, 1, 1000, 10000, 1, &co) == WSYNC_OK,
                "coord_create: %s", wsync_last_error());
    for (int i = 0; i < nclients; i++)
        FUZZ_ASSERT(wsync_tcp_connect(wsync_coord_address(co), wsync_deadline_in(5000),
                                      &fds[i]) == WSYNC_OK, "connect: %s", wsync_last_error());
    if (!two) {
        send_stream(fds[0], copy, part[0], 0, (flags & 2) ? 7 : 0);
    } else {
        /* a frame of one client, then one of the other, with a pause between, so that the
         * conversation runs in that order (both HELLOs, both DESCRIBEs, then the versions) */
        size_t off[2] = {0, 0};
        const uint8_t *base[2] = {copy, copy + part[0]};
        while (off[0] < part[0] || off[1] < part[1]) {
            for (int i = 0; i < 2; i++) {
                size_t left = part[i] - off[i], len = left;
                if (left == 0)
                    continue;
                if (left >= WSYNC_FRAME_HDR) {
                    const uint8_t *h = base[i] + off[i];
                    uint64_t plen = (uint64_t)h[12] | (uint64_t)h[13] << 8 |
                                    (uint64_t)h[14] << 16 | (uint64_t)h[15] << 24;
                    if (plen <= left - WSYNC_FRAME_HDR)
                        len = WSYNC_FRAME_HDR + (size_t)plen;
                }
                send_stream(fds[i], base[i] + off[i], len, 0, (flags & 2) ? 7 : 0);
                off[i] += len;
                usleep(200);
            }
        }
    }
    for (int i = 0; i < nclients; i++)
        shutdown(fds[i], SHUT_WR);
    FUZZ_ASSERT(drain(fds, nclients, wsync_deadline_in(15000)) == 0,
                "the coordinator kept a connection open 15 s after its client's stream ended");
    wsync_coord_free(co);
    for (int i = 0; i < nclients; i++)
        close(fds[i]);
    free(copy);
    FUZZ_ASSERT(fuzz_count_fds() == fds_before, "%d descriptors open after the coordinator, %d "
                "before", fuzz_count_fds(), fds_before);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;

    if (!quiet) {                     /* the coordinator warns of every bad client: noise here */
        wsync_log_set_level(fuzz_verbose() ? WSYNC_LOG_DEBUG : WSYNC_LOG_ERROR);
        signal(SIGPIPE, SIG_IGN);
        quiet = 1;
    }
    if (size < 2)
        return 0;
    switch (data[0] % 4) {
    case 0:
        decode_stream(data + 2, size - 2);
        break;
    case 1:
        run_loop(data[1], data + 2, size - 2);
        break;
    default:
        run_coordinator(data[1], data + 2, size - 2, data[0] % 4 == 2);
        break;
    }
    return 0;
}
