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

static wsync_conn_t *conn_new(int fd, unsigned flags, const char *name, void *user)
{
    wsync_conn_t *c = calloc(1, sizeof(*c));

    if (c == NULL)
        return NULL;
    c->fd = fd;
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

void wsync_loop_close(wsync_loop_t *loop, wsync_conn_t *c, wsync_status_t why, const char *text)
{
    pthread_mutex_lock(&c->send_lock);
    if (!atomic_load(&c->closed)) {
        c->close_why = why;
        snprintf(c->close_text, sizeof(c->close_text), "%s", text ? text : "closed");
        atomic_store(&c->closed, 1);
        shutdown(c->fd, SHUT_RDWR);
    }
    pthread_mutex_unlock(&c->send_lock);
    wake(loop);
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
    switch (WSYNC_FAULT_MSG(WSYNC_FAULT_CTRL_SEND, type)) {
    case WSYNC_FAULT_DROP:
        return WSYNC_OK;                 /* as if the peer never got it */
    case WSYNC_FAULT_FAIL: {
        char where[200];
        snprintf(where, sizeof(where), "sending %s to %s", wsync_msg_name(type), c->name);
        return wsync_fault_err(WSYNC_FAULT_CTRL_SEND, where);
    }
    default:
        break;
    }
    wsync_frame_hdr_encode(type, (uint32_t)nfds, payload, len, hdr);
    pthread_mutex_lock(&c->send_lock);
    if (atomic_load(&c->closed)) {
        pthread_mutex_unlock(&c->send_lock);
        return wsync_err(WSYNC_ERR_PEER_LOST, "cannot send %s to %s: the connection is closed",
                         wsync_msg_name(type), c->name);
    }
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
        c = conn_new(fd, flags, name, NULL);
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
        if (!atomic_load(&c->closed))
            wsync_conn_send(c, WSYNC_MSG_HEARTBEAT, NULL, 0, NULL, 0, 0);
    }
    if (loop->ops.on_tick != NULL)
        loop->ops.on_tick(loop->user);
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
        int timeout = (int)WSYNC_MAX(0, loop->next_tick_ms - wsync_now_ms());
        int rc = epoll_wait(loop->ep_fd, evs, MAX_EVENTS, timeout);
        if (rc < 0 && errno != EINTR) {
            WSYNC_LOG_E("epoll_wait failed: %s", strerror(errno));
            break;
        }
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
                if (atomic_load(&c->closed))   /* closed by another thread: report it here */
                    conn_finish(loop, c, c->close_why, c->close_text);
                else
                    conn_read(loop, c);
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
    c = conn_new(fd, flags, name, user);
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
