#include "core/loop.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "core/fault.h"
#include "core/log.h"
#include "core/proto.h"
#include "core/sock.h"
#include "core/util.h"

#define MAX_LISTENERS 4
#define EV_WAKE 0u
#define EV_LISTEN 1u                /* EV_LISTEN + i: listener i */
#define MAX_EVENTS 256

struct wsync_loop {
    wsync_loop_ops_t ops;
    void *user;
    int heartbeat_ms, peer_timeout_ms;
    pthread_t thread;
    int started;
    atomic_int stop;
    int wake_fd;
    /* epoll, not poll: a wakeup costs the ready descriptors, not all of them (with hundreds of
     * peers, rebuilding a pollfd array per wakeup made each version quadratic in the peers).
     * Event data: EV_WAKE, EV_LISTEN + i for listener i, else the wsync_conn_t pointer. */
    int ep_fd;
    pthread_mutex_t mu;             /* guards conns[] and listeners[] */
    wsync_conn_t **conns;
    size_t nconns, cap;
    struct {
        int fd;
        unsigned flags;
    } listeners[MAX_LISTENERS];
    int nlisteners;
    int64_t next_tick_ms;
    size_t oq_max;                  /* cap on a connection's queued bytes */
    /* earliest deadline of a queue's oldest frame (INT64_MAX: none), so that the loop wakes for
     * it: lowered by posts (any thread), recomputed by the loop when it passes */
    atomic_llong oq_deadline;
};

struct wsync_outbuf {
    atomic_int refs;
    uint32_t len;
    uint8_t data[];
};

struct wsync_outq {
    wsync_outq_t *next;
    uint8_t hdr[WSYNC_FRAME_HDR];
    wsync_outbuf_t *buf;            /* NULL for an empty payload */
    size_t off;                     /* bytes of header + payload written */
    int64_t queued_ms, deadline_ms;
};

void wsync_msg_free(wsync_msg_t *m)
{
    if (m == NULL)
        return;
    for (int i = 0; i < m->nfds; i++)
        if (m->fds[i] >= 0)
            close(m->fds[i]);
    free(m->payload);
    free(m);
}

static void wake(wsync_loop_t *loop)
{
    uint64_t one = 1;
    ssize_t n = write(loop->wake_fd, &one, sizeof(one));
    (void)n;
}

void wsync_outbuf_release(wsync_outbuf_t *b)
{
    if (b != NULL && atomic_fetch_sub(&b->refs, 1) == 1)
        free(b);
}

/* Free the out-queue. Under send_lock (or with the connection no longer shared). */
static void oq_clear(wsync_conn_t *c)
{
    while (c->oq_head != NULL) {
        wsync_outq_t *q = c->oq_head;
        c->oq_head = q->next;
        wsync_outbuf_release(q->buf);
        free(q);
    }
    c->oq_tail = NULL;
    c->oq_bytes = 0;
}

static wsync_conn_t *conn_new(wsync_loop_t *loop, int fd, unsigned flags, const char *name,
                              void *user)
{
    wsync_conn_t *c = calloc(1, sizeof(*c));

    if (c == NULL)
        return NULL;
    c->fd = fd;
    c->loop = loop;
    c->flags = flags;
    snprintf(c->name, sizeof(c->name), "%s", name);
    c->user = user;
    c->created_ms = wsync_now_ms();
    atomic_store(&c->last_recv_ms, c->created_ms);
    pthread_mutex_init(&c->send_lock, NULL);
    return c;
}

static void conn_free(wsync_conn_t *c)
{
    for (int i = 0; i < c->npending_fds; i++)
        close(c->pending_fds[i]);
    if (c->fd >= 0)
        close(c->fd);
    free(c->payload);
    oq_clear(c);
    pthread_mutex_destroy(&c->send_lock);
    free(c);
}

static wsync_status_t add_conn(wsync_loop_t *loop, wsync_conn_t *c)
{
    pthread_mutex_lock(&loop->mu);
    if (loop->nconns == loop->cap) {
        size_t cap = loop->cap ? loop->cap * 2 : 16;
        wsync_conn_t **p = realloc(loop->conns, cap * sizeof(*p));
        if (p == NULL) {
            pthread_mutex_unlock(&loop->mu);
            return wsync_err(WSYNC_ERR_NOMEM, "no memory for a connection");
        }
        loop->conns = p;
        loop->cap = cap;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    if (epoll_ctl(loop->ep_fd, EPOLL_CTL_ADD, c->fd, &ev) != 0) {
        int e = errno;
        pthread_mutex_unlock(&loop->mu);
        return wsync_err(WSYNC_ERR_IO, "cannot watch the connection to %s: epoll_ctl: %s",
                         c->name, strerror(e));
    }
    loop->conns[loop->nconns++] = c;
    pthread_mutex_unlock(&loop->mu);
    return WSYNC_OK;
}

/* Report a connection's end once, on the loop thread. The fd stays open (shut down) until the
 * loop is freed, so that no other thread's send can reach a reused descriptor. */
static void conn_finish(wsync_loop_t *loop, wsync_conn_t *c, wsync_status_t why, const char *text)
{
    if (c->close_reported)
        return;
    c->close_reported = 1;
    atomic_store(&c->closed, 1);
    /* the fd stays open (below): stop watching it, or its hang-up would wake the loop forever */
    epoll_ctl(loop->ep_fd, EPOLL_CTL_DEL, c->fd, NULL);
    shutdown(c->fd, SHUT_RDWR);
    free(c->payload);
    c->payload = NULL;
    pthread_mutex_lock(&c->send_lock);
    oq_clear(c);                 /* nobody will read it */
    c->oq_armed = 0;
    pthread_mutex_unlock(&c->send_lock);
    for (int i = 0; i < c->npending_fds; i++)
        close(c->pending_fds[i]);
    c->npending_fds = 0;
    if (atomic_load(&c->leaving))
        why = WSYNC_OK;
    if (why != WSYNC_OK)
        WSYNC_LOG_D("connection to %s ended: %s", c->name, text);
    if (loop->ops.on_close != NULL)
        loop->ops.on_close(loop->user, c, why, text);
}

/* Mark c closed with a reason for the loop to report (it must be woken). Under send_lock. */
static void close_locked(wsync_conn_t *c, wsync_status_t why, const char *text)
{
    if (!atomic_load(&c->closed)) {
        c->close_why = why;
        snprintf(c->close_text, sizeof(c->close_text), "%s", text ? text : "closed");
        atomic_store(&c->closed, 1);
        shutdown(c->fd, SHUT_RDWR);
    }
}

void wsync_loop_close(wsync_loop_t *loop, wsync_conn_t *c, wsync_status_t why, const char *text)
{
    pthread_mutex_lock(&c->send_lock);
    close_locked(c, why, text);
    pthread_mutex_unlock(&c->send_lock);
    wake(loop);
}

/* The fault hook of a frame about to be sent: 1 to send it, 0 to drop it silently, -1 failed
 * (the last error says so). */
static int fault_gate(const wsync_conn_t *c, uint16_t type)
{
    switch (WSYNC_FAULT_MSG(WSYNC_FAULT_CTRL_SEND, type)) {
    case WSYNC_FAULT_DROP:
        return 0;                        /* as if the peer never got it */
    case WSYNC_FAULT_FAIL: {
        char where[200];
        snprintf(where, sizeof(where), "sending %s to %s", wsync_msg_name(type), c->name);
        wsync_fault_err(WSYNC_FAULT_CTRL_SEND, where);
        return -1;
    }
    default:
        return 1;
    }
}

/* Write [hdr, payload) from byte `off` without waiting: the bytes written, or -1 with errno
 * (EAGAIN: no room). */
static ssize_t write_frame(int fd, const uint8_t *hdr, const void *payload, size_t len, size_t off)
{
    struct iovec iov[2];
    struct msghdr mh;
    int niov = 0;

    if (off < WSYNC_FRAME_HDR) {
        iov[niov].iov_base = (void *)(hdr + off);
        iov[niov++].iov_len = WSYNC_FRAME_HDR - off;
        if (len > 0) {
            iov[niov].iov_base = (void *)payload;
            iov[niov++].iov_len = len;
        }
    } else {
        iov[niov].iov_base = (uint8_t *)payload + (off - WSYNC_FRAME_HDR);
        iov[niov++].iov_len = WSYNC_FRAME_HDR + len - off;
    }
    memset(&mh, 0, sizeof(mh));
    mh.msg_iov = iov;
    mh.msg_iovlen = (size_t)niov;
    for (;;) {
        ssize_t n = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0) {
            errno = EPIPE;
            return -1;
        }
        return n;
    }
}

/* Write queued frames until the queue is empty (1), the socket is full (0) or fails (-1, errno
 * in *err). Each frame's bytes go once, in order. Under send_lock. */
static int oq_write(wsync_conn_t *c, int *err)
{
    while (c->oq_head != NULL) {
        wsync_outq_t *q = c->oq_head;
        size_t len = q->buf != NULL ? q->buf->len : 0;
        ssize_t n = write_frame(c->fd, q->hdr, q->buf != NULL ? q->buf->data : NULL, len, q->off);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            *err = errno;
            return -1;
        }
        q->off += (size_t)n;
        c->oq_bytes -= (size_t)n;
        if (q->off == WSYNC_FRAME_HDR + len) {
            c->oq_head = q->next;
            if (c->oq_head == NULL)
                c->oq_tail = NULL;
            wsync_outbuf_release(q->buf);
            free(q);
        }
    }
    return 1;
}

/* Watch the socket for room (on) or not. Under send_lock. */
static void oq_arm(wsync_conn_t *c, int on)
{
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0u), .data.ptr = c};

    if (c->oq_armed == on || c->loop == NULL)
        return;
    /* fails only for a connection the loop already stopped watching (finished): nothing to do */
    if (epoll_ctl(c->loop->ep_fd, EPOLL_CTL_MOD, c->fd, &ev) == 0)
        c->oq_armed = on;
}

/* "3.2 MB" */
static void fmt_bytes(size_t n, char *buf, size_t len)
{
    if (n >= 1000000)
        snprintf(buf, len, "%.1f MB", (double)n / 1e6);
    else if (n >= 1000)
        snprintf(buf, len, "%.1f KB", (double)n / 1e3);
    else
        snprintf(buf, len, "%zu bytes", n);
}

/* The reason a queue ends its connection. Under send_lock. */
static void oq_reason(const wsync_conn_t *c, const char *limit, char *buf, size_t len)
{
    char b[32];
    int64_t age = c->oq_head != NULL ? wsync_now_ms() - c->oq_head->queued_ms : 0;

    fmt_bytes(c->oq_bytes, b, sizeof(b));
    snprintf(buf, len, "%s stopped reading its %s connection: %s queued for %lld ms (%s)",
             c->name, (c->flags & WSYNC_CONN_HEARTBEAT) ? "control" : "data", b, (long long)age,
             limit);
}

static void deadline_lower(wsync_loop_t *loop, int64_t d)
{
    long long cur = atomic_load(&loop->oq_deadline);
    while (d < cur && !atomic_compare_exchange_weak(&loop->oq_deadline, &cur, d))
        ;
}

wsync_status_t wsync_conn_post(wsync_conn_t *c, uint16_t type, const void *payload, uint32_t len,
                               int timeout_ms, wsync_outbuf_t **shared)
{
    uint8_t hdr[WSYNC_FRAME_HDR];
    size_t total = WSYNC_FRAME_HDR + len, sent = 0;
    wsync_loop_t *loop = c->loop;
    char why[400];
    int gate;

    if (len > WSYNC_FRAME_MAX)
        return wsync_err(WSYNC_ERR_INTERNAL, "frame to %s: %u bytes", c->name, len);
    gate = fault_gate(c, type);
    if (gate <= 0)
        return gate == 0 ? WSYNC_OK : WSYNC_ERR_IO;
    wsync_frame_hdr_encode(type, 0, payload, len, hdr);
    pthread_mutex_lock(&c->send_lock);
    if (atomic_load(&c->closed)) {
        pthread_mutex_unlock(&c->send_lock);
        return wsync_err(WSYNC_ERR_PEER_LOST, "cannot send %s to %s: the connection is closed",
                         wsync_msg_name(type), c->name);
    }
    while (c->oq_head == NULL && sent < total) {   /* behind a queue, it waits its turn */
        ssize_t n = write_frame(c->fd, hdr, payload, len, sent);
        if (n > 0) {
            sent += (size_t)n;
            continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            break;
        snprintf(why, sizeof(why), "sending %s to %s failed: %s", wsync_msg_name(type), c->name,
                 strerror(errno));
        goto fail;
    }
    if (sent == total) {
        pthread_mutex_unlock(&c->send_lock);
        return WSYNC_OK;
    }
    size_t cap = loop != NULL ? loop->oq_max : WSYNC_CONN_QUEUE_MAX;
    if (c->oq_bytes + (total - sent) > cap) {
        char b[32], lim[96];
        fmt_bytes(cap, b, sizeof(b));
        snprintf(lim, sizeof(lim), "%s more would pass the cap of %s", wsync_msg_name(type), b);
        oq_reason(c, lim, why, sizeof(why));
        goto fail;
    }
    wsync_outq_t *q = calloc(1, sizeof(*q));
    wsync_outbuf_t *ob = shared != NULL ? *shared : NULL;
    if (q != NULL && len > 0 && ob == NULL) {
        ob = malloc(sizeof(*ob) + len);
        if (ob != NULL) {
            atomic_init(&ob->refs, shared != NULL ? 1 : 0);   /* the slot's hold */
            ob->len = len;
            memcpy(ob->data, payload, len);
            if (shared != NULL)
                *shared = ob;
        }
    }
    if (q == NULL || (len > 0 && ob == NULL)) {
        free(q);
        snprintf(why, sizeof(why), "out of memory queueing %s (%u bytes) to %s",
                 wsync_msg_name(type), len, c->name);
        if (sent == 0) {        /* nothing written: the stream is intact */
            pthread_mutex_unlock(&c->send_lock);
            return wsync_err(WSYNC_ERR_NOMEM, "%s", why);
        }
        goto fail;
    }
    if (len > 0)
        atomic_fetch_add(&ob->refs, 1);
    memcpy(q->hdr, hdr, sizeof(hdr));
    q->buf = len > 0 ? ob : NULL;
    q->off = sent;
    q->queued_ms = wsync_now_ms();
    q->deadline_ms = wsync_deadline_in(timeout_ms);
    if (c->oq_tail != NULL)
        c->oq_tail->next = q;
    else
        c->oq_head = q;
    c->oq_tail = q;
    c->oq_bytes += total - sent;
    oq_arm(c, 1);
    pthread_mutex_unlock(&c->send_lock);
    if (loop != NULL && q->deadline_ms < atomic_load(&loop->oq_deadline)) {
        deadline_lower(loop, q->deadline_ms);
        wake(loop);              /* its epoll_wait may be set to sleep past this deadline */
    }
    return WSYNC_OK;
fail:
    /* a part-sent frame, or a peer past its limits: the stream is done; the loop reports it */
    close_locked(c, WSYNC_ERR_PEER_LOST, why);
    pthread_mutex_unlock(&c->send_lock);
    if (loop != NULL)
        wake(loop);
    return wsync_err(WSYNC_ERR_PEER_LOST, "%s", why);
}

/* Write c's queue before a blocking send, until deadline. Under send_lock; on failure unlocks. */
static wsync_status_t flush_locked(wsync_conn_t *c, uint16_t type, int64_t deadline, int timeout_ms)
{
    char why[400];
    int err = 0;

    for (;;) {
        int r = oq_write(c, &err);
        if (r == 1)
            return WSYNC_OK;    /* the loop disarms EPOLLOUT when it next looks */
        if (r < 0)
            break;
        int left = wsync_ms_left(deadline);
        struct pollfd pfd = {c->fd, POLLOUT, 0};
        if (left <= 0) {
            char b[32];
            fmt_bytes(c->oq_bytes, b, sizeof(b));
            pthread_mutex_unlock(&c->send_lock);
            return wsync_err(WSYNC_ERR_TIMEOUT, "no room to send %s to %s for %d ms (%s queued "
                             "before it)", wsync_msg_name(type), c->name, timeout_ms, b);
        }
        if (poll(&pfd, 1, left) < 0 && errno != EINTR) {
            err = errno;
            break;
        }
    }
    snprintf(why, sizeof(why), "sending to %s failed: %s", c->name, strerror(err));
    close_locked(c, WSYNC_ERR_PEER_LOST, why);
    pthread_mutex_unlock(&c->send_lock);
    if (c->loop != NULL)
        wake(c->loop);
    return wsync_err(WSYNC_ERR_PEER_LOST, "%s", why);
}

wsync_status_t wsync_conn_send(wsync_conn_t *c, uint16_t type, const void *payload, uint32_t len,
                               const int *fds, int nfds, int timeout_ms)
{
    uint8_t hdr[WSYNC_FRAME_HDR];
    size_t total = WSYNC_FRAME_HDR + len, sent = 0;
    int64_t deadline = wsync_deadline_in(timeout_ms);
    wsync_status_t st = WSYNC_OK;
    char cbuf[CMSG_SPACE(sizeof(int) * WSYNC_MSG_MAX_FDS)];

    if (nfds < 0 || nfds > WSYNC_MSG_MAX_FDS || len > WSYNC_FRAME_MAX)
        return wsync_err(WSYNC_ERR_INTERNAL, "frame to %s: %d fds, %u bytes", c->name, nfds, len);
    int gate = fault_gate(c, type);
    if (gate <= 0)
        return gate == 0 ? WSYNC_OK : WSYNC_ERR_IO;
    wsync_frame_hdr_encode(type, (uint32_t)nfds, payload, len, hdr);
    pthread_mutex_lock(&c->send_lock);
    if (atomic_load(&c->closed)) {
        pthread_mutex_unlock(&c->send_lock);
        return wsync_err(WSYNC_ERR_PEER_LOST, "cannot send %s to %s: the connection is closed",
                         wsync_msg_name(type), c->name);
    }
    /* frames posted before this one go first: frame order is the stream's order */
    if (c->oq_head != NULL && (st = flush_locked(c, type, deadline, timeout_ms)) != WSYNC_OK)
        return st;
    while (sent < total) {
        struct iovec iov[2];
        struct msghdr mh;
        int niov = 0;
        ssize_t n;

        if (sent < WSYNC_FRAME_HDR) {
            iov[niov].iov_base = hdr + sent;
            iov[niov++].iov_len = WSYNC_FRAME_HDR - sent;
            if (len > 0) {
                iov[niov].iov_base = (void *)payload;
                iov[niov++].iov_len = len;
            }
        } else {
            iov[niov].iov_base = (uint8_t *)payload + (sent - WSYNC_FRAME_HDR);
            iov[niov++].iov_len = total - sent;
        }
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)niov;
        if (sent == 0 && nfds > 0) {   /* descriptors travel with the frame's first byte */
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
        n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
        if (n > 0) {
            sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int left = wsync_ms_left(deadline);
            struct pollfd pfd = {c->fd, POLLOUT, 0};
            if (left > 0 && poll(&pfd, 1, left) >= 0)
                continue;
            if (sent == 0) {   /* nothing written: the stream is intact, the caller may retry */
                pthread_mutex_unlock(&c->send_lock);
                return wsync_err(WSYNC_ERR_TIMEOUT, "no room to send %s to %s for %d ms",
                                 wsync_msg_name(type), c->name, timeout_ms);
            }
            st = wsync_err(WSYNC_ERR_TIMEOUT, "%s stopped reading: %s half sent after %d ms",
                           c->name, wsync_msg_name(type), timeout_ms);
        } else {
            st = wsync_err(WSYNC_ERR_PEER_LOST, "sending %s to %s failed: %s", wsync_msg_name(type),
                           c->name, n < 0 ? strerror(errno) : "nothing written");
        }
        /* a half-sent frame leaves the stream unusable: close it; the loop reports the loss */
        shutdown(c->fd, SHUT_RDWR);
        break;
    }
    pthread_mutex_unlock(&c->send_lock);
    return st;
}

/* Deliver a complete frame. Returns 0 to keep reading, -1 once the connection is finished. */
static int deliver(wsync_loop_t *loop, wsync_conn_t *c)
{
    wsync_msg_t *m;
    int nfds = (int)(c->cur.flags & 0xffu);
    char why[256];

    if (!wsync_frame_checksum_ok(&c->cur, c->payload)) {
        snprintf(why, sizeof(why), "%s sent a %s frame whose checksum does not match its payload",
                 c->name, wsync_msg_name(c->cur.type));
        conn_finish(loop, c, WSYNC_ERR_PROTOCOL, why);
        return -1;
    }
    if ((c->cur.flags & ~0xffu) != 0 || nfds > c->npending_fds) {
        snprintf(why, sizeof(why), "%s sent a frame announcing %d file descriptors; %d arrived",
                 c->name, nfds, c->npending_fds);
        conn_finish(loop, c, WSYNC_ERR_PROTOCOL, why);
        return -1;
    }
    m = calloc(1, sizeof(*m));
    if (m == NULL) {
        conn_finish(loop, c, WSYNC_ERR_NOMEM, "out of memory receiving a frame");
        return -1;
    }
    m->conn = c;
    m->type = c->cur.type;
    m->len = c->cur.len;
    m->payload = c->payload;
    m->nfds = nfds;
    memcpy(m->fds, c->pending_fds, sizeof(int) * (size_t)nfds);
    memmove(c->pending_fds, c->pending_fds + nfds, sizeof(int) * (size_t)(c->npending_fds - nfds));
    c->npending_fds -= nfds;
    c->payload = NULL;
    c->payload_got = 0;
    c->hdr_got = 0;
    if (m->type == WSYNC_MSG_HEARTBEAT) {
        wsync_msg_free(m);
        return 0;
    }
    switch (WSYNC_FAULT_MSG(WSYNC_FAULT_CTRL_RECV, m->type)) {
    case WSYNC_FAULT_DROP:
        wsync_msg_free(m);
        return 0;
    case WSYNC_FAULT_FAIL:
        snprintf(why, sizeof(why), "%s from %s", wsync_msg_name(m->type), c->name);
        wsync_fault_err(WSYNC_FAULT_CTRL_RECV, why);
        wsync_msg_free(m);
        conn_finish(loop, c, WSYNC_ERR_IO, wsync_last_error());
        return -1;
    default:
        break;
    }
    if (m->type == WSYNC_MSG_BYE)
        atomic_store(&c->leaving, 1);
    loop->ops.on_msg(loop->user, c, m);
    return atomic_load(&c->closed) ? -1 : 0;
}

static void conn_read(wsync_loop_t *loop, wsync_conn_t *c)
{
    char why[320];

    while (!c->close_reported && !atomic_load(&c->closed)) {
        uint8_t *buf;
        size_t want;
        ssize_t n;

        if (c->hdr_got == WSYNC_FRAME_HDR && c->payload_got == c->cur.len) {
            if (deliver(loop, c) != 0)
                return;
            continue;
        }
        if (c->hdr_got < WSYNC_FRAME_HDR) {
            buf = c->hdr + c->hdr_got;
            want = WSYNC_FRAME_HDR - c->hdr_got;
        } else {
            buf = c->payload + c->payload_got;
            want = c->cur.len - c->payload_got;
        }
        if (c->flags & WSYNC_CONN_UNIX) {
            char cbuf[CMSG_SPACE(sizeof(int) * WSYNC_MSG_MAX_FDS)];
            struct iovec iov = {buf, want};
            struct msghdr mh;
            memset(&mh, 0, sizeof(mh));
            mh.msg_iov = &iov;
            mh.msg_iovlen = 1;
            mh.msg_control = cbuf;
            mh.msg_controllen = sizeof(cbuf);
            n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC);
            for (struct cmsghdr *cm = n >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; cm != NULL;
                 cm = CMSG_NXTHDR(&mh, cm)) {
                if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                    continue;
                int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                int got[WSYNC_MSG_MAX_FDS];
                if (k > WSYNC_MSG_MAX_FDS)
                    k = WSYNC_MSG_MAX_FDS;
                memcpy(got, CMSG_DATA(cm), sizeof(int) * (size_t)k);
                for (int i = 0; i < k; i++) {
                    if (c->npending_fds < WSYNC_MSG_MAX_FDS)
                        c->pending_fds[c->npending_fds++] = got[i];
                    else
                        close(got[i]);
                }
            }
            if (n >= 0 && (mh.msg_flags & MSG_CTRUNC)) {
                snprintf(why, sizeof(why), "%s passed more file descriptors than allowed", c->name);
                conn_finish(loop, c, WSYNC_ERR_PROTOCOL, why);
                return;
            }
        } else {
            n = recv(c->fd, buf, want, 0);
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            snprintf(why, sizeof(why), "connection to %s failed: %s", c->name, strerror(errno));
            conn_finish(loop, c, WSYNC_ERR_PEER_LOST, why);
            return;
        }
        if (n == 0) {
            if (c->hdr_got == 0)
                snprintf(why, sizeof(why), "%s closed its connection", c->name);
            else
                snprintf(why, sizeof(why), "%s closed its connection in the middle of a frame "
                                           "(%zu of %u payload bytes)", c->name, c->payload_got,
                         c->hdr_got == WSYNC_FRAME_HDR ? c->cur.len : 0);
            conn_finish(loop, c, WSYNC_ERR_PEER_LOST, why);
            return;
        }
        atomic_store(&c->last_recv_ms, wsync_now_ms());
        if (c->hdr_got < WSYNC_FRAME_HDR) {
            c->hdr_got += (size_t)n;
            if (c->hdr_got == WSYNC_FRAME_HDR) {
                char reason[200];
                if (wsync_frame_hdr_decode(c->hdr, &c->cur, reason, sizeof(reason)) != WSYNC_OK) {
                    snprintf(why, sizeof(why), "%s sent a bad frame: %s", c->name, reason);
                    conn_finish(loop, c, WSYNC_ERR_PROTOCOL, why);
                    return;
                }
                c->payload = malloc(c->cur.len ? c->cur.len : 1);
                c->payload_got = 0;
                if (c->payload == NULL) {
                    conn_finish(loop, c, WSYNC_ERR_NOMEM, "out of memory receiving a frame");
                    return;
                }
            }
        } else {
            c->payload_got += (size_t)n;
        }
    }
}

static void do_accept(wsync_loop_t *loop, int lfd, unsigned flags)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        char name[128];
        wsync_conn_t *c;

        if (fd < 0)
            return;
        snprintf(name, sizeof(name), "an unidentified client (fd %d)", fd);
        c = conn_new(loop, fd, flags, name, NULL);
        if (c == NULL || add_conn(loop, c) != WSYNC_OK) {
            if (c != NULL)
                conn_free(c);
            else
                close(fd);
            continue;
        }
        if (loop->ops.on_accept != NULL)
            loop->ops.on_accept(loop->user, c);
    }
}

static void tick(wsync_loop_t *loop)
{
    int64_t now = wsync_now_ms();
    size_t n;

    pthread_mutex_lock(&loop->mu);
    n = loop->nconns;
    pthread_mutex_unlock(&loop->mu);
    for (size_t i = 0; i < n; i++) {
        wsync_conn_t *c = loop->conns[i];
        if (c->close_reported || !(c->flags & WSYNC_CONN_HEARTBEAT))
            continue;
        if (now - atomic_load(&c->last_recv_ms) > loop->peer_timeout_ms && !atomic_load(&c->closed))
            /* this thread may itself have been starved (hundreds of processes on few cores):
             * what the peer sent may be waiting unread, so read it before judging the silence */
            conn_read(loop, c);
        if (c->close_reported)
            continue;
        if (now - atomic_load(&c->last_recv_ms) > loop->peer_timeout_ms) {
            char why[256];
            snprintf(why, sizeof(why), "%s sent nothing for %lld ms (deadline %d ms)", c->name,
                     (long long)(now - atomic_load(&c->last_recv_ms)), loop->peer_timeout_ms);
            conn_finish(loop, c, WSYNC_ERR_TIMEOUT, why);
            continue;
        }
        /* never blocking; none behind a queue: the peer is not reading, or is reading the
         * queue's bytes, which count as signs of life as much as a heartbeat */
        pthread_mutex_lock(&c->send_lock);
        int idle = c->oq_head == NULL;
        pthread_mutex_unlock(&c->send_lock);
        if (!atomic_load(&c->closed) && idle)
            wsync_conn_post(c, WSYNC_MSG_HEARTBEAT, NULL, 0, loop->peer_timeout_ms, NULL);
    }
    if (loop->ops.on_tick != NULL)
        loop->ops.on_tick(loop->user);
}

/* The socket has room: write c's queue. */
static void conn_drain(wsync_loop_t *loop, wsync_conn_t *c)
{
    char why[300];
    int err = 0, r;

    pthread_mutex_lock(&c->send_lock);
    r = oq_write(c, &err);
    if (r == 1)
        oq_arm(c, 0);
    else if (r < 0)
        snprintf(why, sizeof(why), "sending to %s failed: %s", c->name, strerror(err));
    pthread_mutex_unlock(&c->send_lock);
    if (r < 0)
        conn_read(loop, c);     /* its last frames, and its own account of the end */
    if (r < 0 && !c->close_reported)
        conn_finish(loop, c, WSYNC_ERR_PEER_LOST, why);
}

/* A queue's oldest frame is past its deadline: close that connection, naming the peer; note the
 * next deadline. */
static void check_queues(wsync_loop_t *loop)
{
    int64_t now = wsync_now_ms();
    size_t n;

    /* reset first: a post racing with the scan lowers it again after this store */
    atomic_store(&loop->oq_deadline, INT64_MAX);
    pthread_mutex_lock(&loop->mu);
    n = loop->nconns;
    pthread_mutex_unlock(&loop->mu);
    for (size_t i = 0; i < n; i++) {
        wsync_conn_t *c = loop->conns[i];
        char why[400];
        int over = 0;

        if (c->close_reported)
            continue;
        pthread_mutex_lock(&c->send_lock);
        if (c->oq_head != NULL && !atomic_load(&c->closed)) {
            if (now >= c->oq_head->deadline_ms) {
                char lim[64];
                snprintf(lim, sizeof(lim), "deadline %lld ms",
                         (long long)(c->oq_head->deadline_ms - c->oq_head->queued_ms));
                oq_reason(c, lim, why, sizeof(why));
                close_locked(c, WSYNC_ERR_TIMEOUT, why);
                over = 1;
            } else {
                deadline_lower(loop, c->oq_head->deadline_ms);
            }
        }
        pthread_mutex_unlock(&c->send_lock);
        if (over) {
            WSYNC_LOG_W("%s", why);
            conn_finish(loop, c, WSYNC_ERR_TIMEOUT, why);
        }
    }
}

/* Report the connections other threads closed (wsync_loop_close wakes the loop for them). */
static void reap_closed(wsync_loop_t *loop)
{
    size_t n;

    pthread_mutex_lock(&loop->mu);
    n = loop->nconns;
    pthread_mutex_unlock(&loop->mu);
    for (size_t i = 0; i < n; i++) {
        wsync_conn_t *c = loop->conns[i];   /* conns[] only grows; entries never move */
        if (!c->close_reported && atomic_load(&c->closed))
            conn_finish(loop, c, c->close_why, c->close_text);
    }
}

static void *loop_main(void *arg)
{
    wsync_loop_t *loop = arg;
    struct epoll_event evs[MAX_EVENTS];

    while (!atomic_load(&loop->stop)) {
        int64_t now = wsync_now_ms();

        if (now >= loop->next_tick_ms) {
            tick(loop);
            loop->next_tick_ms = now + loop->heartbeat_ms;
        }
        int64_t until = WSYNC_MIN(loop->next_tick_ms, (int64_t)atomic_load(&loop->oq_deadline));
        int timeout = (int)WSYNC_MAX(0, until - wsync_now_ms());
        int rc = epoll_wait(loop->ep_fd, evs, MAX_EVENTS, timeout);
        if (rc < 0 && errno != EINTR) {
            WSYNC_LOG_E("epoll_wait failed: %s", strerror(errno));
            break;
        }
        if (wsync_now_ms() >= atomic_load(&loop->oq_deadline))
            check_queues(loop);
        if (rc <= 0)
            continue;
        for (int i = 0; i < rc; i++) {
            uint64_t tag = evs[i].data.u64;
            if (tag == EV_WAKE) {
                uint64_t v;
                ssize_t n = read(loop->wake_fd, &v, sizeof(v));
                (void)n;
                reap_closed(loop);
            } else if (tag < EV_LISTEN + MAX_LISTENERS) {
                int k = (int)(tag - EV_LISTEN);
                pthread_mutex_lock(&loop->mu);
                int lfd = loop->listeners[k].fd;
                unsigned lflags = loop->listeners[k].flags;
                pthread_mutex_unlock(&loop->mu);
                do_accept(loop, lfd, lflags);
            }
        }
        /* data connections first: what a peer sent on them before anything it caused on the
         * control connection (RELEASE before the COMMIT that led to DONE, then to the group's
         * end) must be queued before that, or a finished push would report the group's end */
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < rc; i++) {
                if (evs[i].data.u64 < EV_LISTEN + MAX_LISTENERS)
                    continue;
                wsync_conn_t *c = evs[i].data.ptr;
                int control = (c->flags & WSYNC_CONN_HEARTBEAT) != 0;
                if (control != pass || c->close_reported)
                    continue;
                if (atomic_load(&c->closed)) {  /* closed by another thread: report it here */
                    conn_finish(loop, c, c->close_why, c->close_text);
                    continue;
                }
                /* read first: what the peer sent before it went (a BYE, an ERROR) comes before
                 * a failed write to it */
                if (evs[i].events & ~(uint32_t)EPOLLOUT)
                    conn_read(loop, c);
                if (!c->close_reported && (evs[i].events & EPOLLOUT))
                    conn_drain(loop, c);
            }
        }
    }
    /* a last pass over what has already arrived, so that an owner stopping the loop still
     * learns of frames (an ERROR, a BYE) its peers sent before it stopped */
    pthread_mutex_lock(&loop->mu);
    size_t nc = loop->nconns;
    pthread_mutex_unlock(&loop->mu);
    for (size_t i = 0; i < nc; i++)
        if (!loop->conns[i]->close_reported && !atomic_load(&loop->conns[i]->closed))
            conn_read(loop, loop->conns[i]);
    return NULL;
}

wsync_status_t wsync_loop_create(const wsync_loop_ops_t *ops, void *user, int heartbeat_ms,
                                 int peer_timeout_ms, wsync_loop_t **out)
{
    wsync_loop_t *loop = calloc(1, sizeof(*loop));

    if (loop == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "no memory for the progress loop");
    loop->ops = *ops;
    loop->user = user;
    loop->heartbeat_ms = heartbeat_ms > 0 ? heartbeat_ms : 1000;
    loop->peer_timeout_ms = peer_timeout_ms > 0 ? peer_timeout_ms : 60000;
    loop->oq_max = WSYNC_CONN_QUEUE_MAX;
    atomic_init(&loop->oq_deadline, INT64_MAX);
    loop->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (loop->wake_fd < 0) {
        free(loop);
        return wsync_err(WSYNC_ERR_IO, "eventfd: %s", strerror(errno));
    }
    loop->ep_fd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = EV_WAKE};
    if (loop->ep_fd < 0 || epoll_ctl(loop->ep_fd, EPOLL_CTL_ADD, loop->wake_fd, &ev) != 0) {
        int e = errno;
        if (loop->ep_fd >= 0)
            close(loop->ep_fd);
        close(loop->wake_fd);
        free(loop);
        return wsync_err(WSYNC_ERR_IO, "cannot set up the progress loop: epoll: %s", strerror(e));
    }
    pthread_mutex_init(&loop->mu, NULL);
    *out = loop;
    return WSYNC_OK;
}

wsync_status_t wsync_loop_start(wsync_loop_t *loop)
{
    int rc = pthread_create(&loop->thread, NULL, loop_main, loop);

    if (rc != 0)
        return wsync_err(WSYNC_ERR_IO, "cannot start the progress thread: %s", strerror(rc));
    loop->started = 1;
    return WSYNC_OK;
}

void wsync_loop_stop(wsync_loop_t *loop)
{
    if (loop->started) {
        atomic_store(&loop->stop, 1);
        wake(loop);
        pthread_join(loop->thread, NULL);
        loop->started = 0;
    }
}

void wsync_loop_free(wsync_loop_t *loop)
{
    if (loop == NULL)
        return;
    wsync_loop_stop(loop);
    for (size_t i = 0; i < loop->nconns; i++)
        conn_free(loop->conns[i]);
    for (int i = 0; i < loop->nlisteners; i++)
        close(loop->listeners[i].fd);
    free(loop->conns);
    close(loop->ep_fd);
    close(loop->wake_fd);
    pthread_mutex_destroy(&loop->mu);
    free(loop);
}

void wsync_loop_set_queue_max(wsync_loop_t *loop, size_t bytes)
{
    loop->oq_max = bytes;
}

void wsync_loop_flush(wsync_loop_t *loop, int timeout_ms)
{
    int64_t deadline = wsync_deadline_in(timeout_ms);
    size_t n = loop->nconns;
    struct pollfd *pfd = calloc(n ? n : 1, sizeof(*pfd));

    if (pfd == NULL)
        return;
    for (;;) {
        nfds_t k = 0;
        for (size_t i = 0; i < n; i++) {
            wsync_conn_t *c = loop->conns[i];
            int err = 0, r = 1;
            pthread_mutex_lock(&c->send_lock);
            if (c->oq_head != NULL && !atomic_load(&c->closed))
                r = oq_write(c, &err);
            if (r < 0)
                oq_clear(c);    /* broken: its last words are lost either way */
            pthread_mutex_unlock(&c->send_lock);
            if (r == 0)
                pfd[k++] = (struct pollfd){c->fd, POLLOUT, 0};
        }
        int left = wsync_ms_left(deadline);
        if (k == 0 || left <= 0)
            break;
        if (poll(pfd, k, left) < 0 && errno != EINTR)
            break;
    }
    free(pfd);
}

wsync_status_t wsync_loop_listen(wsync_loop_t *loop, int fd, unsigned conn_flags)
{
    pthread_mutex_lock(&loop->mu);
    if (loop->nlisteners == MAX_LISTENERS) {
        pthread_mutex_unlock(&loop->mu);
        close(fd);
        return wsync_err(WSYNC_ERR_INTERNAL, "too many listening sockets");
    }
    wsync_sock_nonblock(fd);
    /* the slot is filled before epoll may report the socket: the loop thread reads it (under
     * the lock) as soon as a connection arrives */
    loop->listeners[loop->nlisteners].fd = fd;
    loop->listeners[loop->nlisteners].flags = conn_flags;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = EV_LISTEN + (uint64_t)loop->nlisteners};
    if (epoll_ctl(loop->ep_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        int e = errno;
        loop->listeners[loop->nlisteners].fd = -1;
        pthread_mutex_unlock(&loop->mu);
        close(fd);
        return wsync_err(WSYNC_ERR_IO, "cannot watch a listening socket: epoll_ctl: %s",
                         strerror(e));
    }
    loop->nlisteners++;
    pthread_mutex_unlock(&loop->mu);
    return WSYNC_OK;
}

wsync_status_t wsync_loop_add(wsync_loop_t *loop, int fd, unsigned flags, const char *name,
                              void *user, wsync_conn_t **out)
{
    wsync_conn_t *c;
    wsync_status_t st;

    wsync_sock_nonblock(fd);
    c = conn_new(loop, fd, flags, name, user);
    if (c == NULL) {
        close(fd);
        return wsync_err(WSYNC_ERR_NOMEM, "no memory for a connection");
    }
    st = add_conn(loop, c);
    if (st != WSYNC_OK) {
        conn_free(c);
        return st;
    }
    *out = c;
    return WSYNC_OK;
}

/* ---- inbox ---------------------------------------------------------------------------------- */

void wsync_inbox_init(wsync_inbox_t *in)
{
    pthread_condattr_t ca;

    memset(in, 0, sizeof(*in));
    pthread_mutex_init(&in->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&in->cv, &ca);
    pthread_condattr_destroy(&ca);
}

void wsync_inbox_destroy(wsync_inbox_t *in)
{
    while (in->head != NULL) {
        wsync_msg_t *m = in->head;
        in->head = m->next;
        wsync_msg_free(m);
    }
    pthread_mutex_destroy(&in->mu);
    pthread_cond_destroy(&in->cv);
}

void wsync_inbox_push(wsync_inbox_t *in, wsync_msg_t *m)
{
    m->next = NULL;
    pthread_mutex_lock(&in->mu);
    if (in->tail != NULL)
        in->tail->next = m;
    else
        in->head = m;
    in->tail = m;
    pthread_cond_broadcast(&in->cv);
    pthread_mutex_unlock(&in->mu);
}

void wsync_inbox_fail(wsync_inbox_t *in, wsync_status_t st, const char *text)
{
    const char *prefix = wsync_status_str(st);
    size_t plen = strlen(prefix);

    pthread_mutex_lock(&in->mu);
    if (in->fatal == WSYNC_OK) {
        in->fatal = st;
        /* keep the whole sentence once: relayed texts already start with the status text */
        if (strncmp(text, prefix, plen) == 0 && text[plen] == ':')
            snprintf(in->fatal_text, sizeof(in->fatal_text), "%s", text);
        else
            snprintf(in->fatal_text, sizeof(in->fatal_text), "%s: %s", prefix, text);
    }
    pthread_cond_broadcast(&in->cv);
    pthread_mutex_unlock(&in->mu);
}

wsync_status_t wsync_inbox_failed(wsync_inbox_t *in)
{
    wsync_status_t st;

    pthread_mutex_lock(&in->mu);
    st = in->fatal;
    if (st != WSYNC_OK)
        wsync_err_set_text(st, in->fatal_text);
    pthread_mutex_unlock(&in->mu);
    return st;
}

wsync_status_t wsync_inbox_pop(wsync_inbox_t *in, const uint16_t *types, int ntypes,
                               int64_t deadline_ms, wsync_msg_t **out)
{
    pthread_mutex_lock(&in->mu);
    for (;;) {
        wsync_msg_t *prev = NULL;
        for (wsync_msg_t *m = in->head; m != NULL; prev = m, m = m->next) {
            for (int t = 0; t < ntypes; t++) {
                if (m->type != types[t])
                    continue;
                if (prev != NULL)
                    prev->next = m->next;
                else
                    in->head = m->next;
                if (in->tail == m)
                    in->tail = prev;
                m->next = NULL;
                pthread_mutex_unlock(&in->mu);
                *out = m;
                return WSYNC_OK;
            }
        }
        if (in->fatal != WSYNC_OK) {
            wsync_status_t st = in->fatal;
            wsync_err_set_text(st, in->fatal_text);
            pthread_mutex_unlock(&in->mu);
            return st;
        }
        int64_t left = deadline_ms - wsync_now_ms();
        if (left <= 0) {
            pthread_mutex_unlock(&in->mu);
            return WSYNC_ERR_TIMEOUT;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += left / 1000;
        ts.tv_nsec += (left % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&in->cv, &in->mu, &ts);
    }
}
