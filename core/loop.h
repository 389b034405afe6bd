/* Internal: the progress thread. One loop per sender, receiver and coordinator owns their sockets
 * for reading: it accepts connections, reassembles frames (with file descriptors passed over Unix
 * sockets), sends heartbeats on control connections, declares a peer lost when it is silent past
 * its deadline or its connection breaks, and hands each message to the owner's callbacks, on the
 * loop thread. Any thread may send on a connection (one sender at a time, by a lock).
 *
 * Two ways to send: wsync_conn_send blocks until the frame is written (API threads), and
 * wsync_conn_post never blocks (the loop thread: a peer that stopped reading must not stall it):
 * what the socket does not take at once waits in the connection's out-queue, written by the loop
 * when the socket has room, in order; a queue past its byte cap or whose oldest frame is past its
 * deadline closes the connection, naming the peer. */
#ifndef WSYNC_CORE_LOOP_H
#define WSYNC_CORE_LOOP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "core/frame.h"

#define WSYNC_MSG_MAX_FDS 32

typedef struct wsync_conn wsync_conn_t;
typedef struct wsync_loop wsync_loop_t;
typedef struct wsync_outbuf wsync_outbuf_t;   /* a queued payload, shared by a broadcast's posts */
typedef struct wsync_outq wsync_outq_t;       /* one queued frame (core/loop.c) */

/* Default cap on a connection's queued bytes: two of the largest frames (a plan to a slow peer
 * and what follows it), not a growing backlog for a peer that stopped reading. */
#define WSYNC_CONN_QUEUE_MAX (2 * (size_t)WSYNC_FRAME_MAX)

typedef struct wsync_msg {
    struct wsync_msg *next;
    wsync_conn_t *conn;             /* where it came from */
    uint16_t type;
    uint32_t len;
    uint8_t *payload;
    int nfds;
    int fds[WSYNC_MSG_MAX_FDS];     /* owned by the message until taken (set to -1) */
} wsync_msg_t;

/* Frees payload and closes fds not taken. NULL is a no-op. */
void wsync_msg_free(wsync_msg_t *m);

enum {
    WSYNC_CONN_HEARTBEAT = 1,       /* control connection: heartbeats both ways, silence = loss */
    WSYNC_CONN_UNIX = 2,            /* may carry file descriptors */
};

struct wsync_conn {
    int fd;
    unsigned flags;
    char name[128];                 /* who is on the other side, for messages */
    void *user;                     /* owner's data (the peer record) */
    atomic_uint tag;                /* a scheme's index for this peer + 1 (its rank on a data
                                       connection), so that a message finds its peer in O(1); 0:
                                       none */
    atomic_int closed;              /* no more frames either way */
    atomic_int leaving;             /* BYE sent or received: closing is not a loss */
    atomic_llong last_recv_ms;
    int64_t created_ms;
    pthread_mutex_t send_lock;
    /* receive state: loop thread only */
    uint8_t hdr[WSYNC_FRAME_HDR];
    size_t hdr_got;
    wsync_frame_hdr_t cur;
    uint8_t *payload;
    size_t payload_got;
    int pending_fds[WSYNC_MSG_MAX_FDS];
    int npending_fds;
    int close_reported;
    wsync_status_t close_why;       /* set by wsync_loop_close from another thread */
    char close_text[256];
    wsync_loop_t *loop;             /* its loop (to arm EPOLLOUT for the out-queue) */
    /* out-queue (wsync_conn_post): under send_lock */
    wsync_outq_t *oq_head, *oq_tail;
    size_t oq_bytes;                /* not yet written, partly written head included */
    int oq_armed;                   /* EPOLLOUT watched */
};

typedef struct {
    /* Each runs on the loop thread. on_msg owns m. on_close reports a connection that ended:
     * why == WSYNC_OK for an orderly leave (BYE), else the failure and a sentence. */
    void (*on_msg)(void *user, wsync_conn_t *c, wsync_msg_t *m);
    void (*on_accept)(void *user, wsync_conn_t *c);
    void (*on_close)(void *user, wsync_conn_t *c, wsync_status_t why, const char *text);
    void (*on_tick)(void *user);
} wsync_loop_ops_t;

/* heartbeat_ms: period of heartbeats and ticks; peer_timeout_ms: silence after which a control
 * peer is lost. */
wsync_status_t wsync_loop_create(const wsync_loop_ops_t *ops, void *user, int heartbeat_ms,
                                 int peer_timeout_ms, wsync_loop_t **loop);
/* Stops the thread, closes every socket, frees connections. NULL is a no-op. */
void wsync_loop_free(wsync_loop_t *loop);
wsync_status_t wsync_loop_start(wsync_loop_t *loop);
/* Stop the thread; connections stay open (callers may still send) until wsync_loop_free. */
void wsync_loop_stop(wsync_loop_t *loop);
/* Accept connections on listening socket fd (owned by the loop from now on); accepted
 * connections get conn_flags. */
wsync_status_t wsync_loop_listen(wsync_loop_t *loop, int fd, unsigned conn_flags);
/* Add a connected socket (owned by the loop from now on). */
wsync_status_t wsync_loop_add(wsync_loop_t *loop, int fd, unsigned flags, const char *name,
                              void *user, wsync_conn_t **conn);
/* Close a connection from any thread; on_close follows on the loop thread. */
void wsync_loop_close(wsync_loop_t *loop, wsync_conn_t *c, wsync_status_t why, const char *text);

/* Send one frame (fds attached on Unix connections), waiting at most timeout_ms for room.
 * Frames queued by wsync_conn_post go first (this call writes them, within the same deadline);
 * WSYNC_ERR_TIMEOUT, with nothing of this frame written, if they or it do not fit in time.
 * WSYNC_ERR_PEER_LOST if the connection is closed or breaks. Thread-safe. */
wsync_status_t wsync_conn_send(wsync_conn_t *c, uint16_t type, const void *payload, uint32_t len,
                               const int *fds, int nfds, int timeout_ms);

/* Send one frame (no descriptors) without waiting: written at once when nothing is queued and the
 * socket has room, else (what is left of it) queued and written by the loop thread when the
 * socket has room, after the frames queued before it. The frame must be fully written within
 * timeout_ms, and the connection's queue stay under its cap (wsync_loop_set_queue_max), or the
 * connection is closed with a reason naming the peer ("... stopped reading its control
 * connection: 3.2 MB queued for 5004 ms ...") and the owner's on_close follows on the loop
 * thread. shared: NULL, or a broadcast's slot (NULL at first) where the first post that must
 * queue keeps one copy of the payload for every post of the same payload that passes the same
 * slot; the caller releases it with wsync_outbuf_release after the last post. Returns WSYNC_OK
 * once written or queued; WSYNC_ERR_PEER_LOST if the connection is closed (or this post closed
 * it: past the cap, or the socket failed); WSYNC_ERR_NOMEM. Thread-safe. */
wsync_status_t wsync_conn_post(wsync_conn_t *c, uint16_t type, const void *payload, uint32_t len,
                               int timeout_ms, wsync_outbuf_t **shared);
/* Drop the caller's hold on a shared payload. NULL is a no-op. */
void wsync_outbuf_release(wsync_outbuf_t *b);
/* Cap on each connection's queued bytes (default WSYNC_CONN_QUEUE_MAX). */
void wsync_loop_set_queue_max(wsync_loop_t *loop, size_t bytes);
/* Once the loop is stopped: write what the connections still have queued (a stopping owner's last
 * words), giving up at timeout_ms for all of them together. */
void wsync_loop_flush(wsync_loop_t *loop, int timeout_ms);

/* A queue of messages handed from the loop thread to the owner's API calls, with a sticky
 * failure: once the group failed, waits return that failure (after the messages that came first). */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    wsync_msg_t *head, *tail;
    wsync_status_t fatal;
    char fatal_text[1024];
} wsync_inbox_t;

void wsync_inbox_init(wsync_inbox_t *in);
void wsync_inbox_destroy(wsync_inbox_t *in);
void wsync_inbox_push(wsync_inbox_t *in, wsync_msg_t *m);
/* Record the group's failure; the first one sticks. text is the whole sentence. */
void wsync_inbox_fail(wsync_inbox_t *in, wsync_status_t st, const char *text);
/* The sticky failure, WSYNC_OK if none; sets the last error when failed. */
wsync_status_t wsync_inbox_failed(wsync_inbox_t *in);
/* Take the first queued message whose type is in types[0..ntypes). If none is queued: the
 * sticky failure if there is one, else wait until deadline_ms (WSYNC_ERR_TIMEOUT, with no last
 * error set: the caller says what it was waiting for). */
wsync_status_t wsync_inbox_pop(wsync_inbox_t *in, const uint16_t *types, int ntypes,
                               int64_t deadline_ms, wsync_msg_t **out);

#endif
