/* Internal: fault injection, for tests. WSYNC_FAULT=<point>:<action>[,<point>:<action>...] makes
 * this process misbehave on purpose at named points, so that tests can check what every other
 * participant then sees. Read once per process (again after a fork), at the first
 * wsync_ctx_create; a malformed value fails that call with WSYNC_ERR_INVALID naming the token.
 *
 * Points (where a hook sits; "hit" = one pass through it):
 *   push.bucket     ipc sender: a bucket packed, before its READY frames go out
 *   recv.unpack     receiver: one bucket (ipc) or one batch of gets (store) landed, before it is
 *                   verified
 *   ctrl.send       any frame but a heartbeat, before it is written (ctrl.send/COMMIT: only COMMIT
 *                   frames count; any message name of core/proto.h works)
 *   ctrl.recv       any frame but a heartbeat, before it is handed on (ctrl.recv/BEGIN likewise)
 *   store.publish   store sender: a version snapshotted, before PUBLISH
 *   store.get       store reader: each RMA get posted
 *   commit          receiver: a version landed whole, before it is committed
 *   delta.encoded   sender (any scheme in delta mode): one chunk encoded as a delta, before it
 *                   is sent or published (WSYNC_FAULT_DELTA_CORRUPT); corrupt flips one bit of
 *                   the encoded bytes (the receiver must refuse the version: INTEGRITY)
 *   bell.wait       a doorbell wait (core/doorbell.c): its word found short past the polls,
 *                   before it looks for the group's failure (delay: a ring and a failure then
 *                   both land in between)
 * Actions, each optionally "@N" (only the Nth hit of that rule; without it, every hit):
 *   kill            SIGKILL this process          stop       SIGSTOP this process
 *   delay=200ms     sleep (also "5s")             fail       the point returns WSYNC_ERR_IO
 *   drop            the frame is not sent / not delivered (ctrl.send, ctrl.recv)
 *   corrupt         one bit of the data just landed or sent flips (push.bucket, recv.unpack,
 *                   store.get, delta.encoded)
 * Heartbeats are neither counted nor dropped: their number depends on time, and N must name the
 * same frame in every run.
 *
 * Built only with the CMake option WSYNC_FAULTS=ON (test builds). Without it every hook is the
 * constant WSYNC_FAULT_NONE, so release builds carry no code for it. */
#ifndef WSYNC_CORE_FAULT_H
#define WSYNC_CORE_FAULT_H

#include <stddef.h>

#include "core/status.h"

typedef enum {
    WSYNC_FAULT_PUSH_BUCKET = 0,
    WSYNC_FAULT_RECV_UNPACK,
    WSYNC_FAULT_CTRL_SEND,
    WSYNC_FAULT_CTRL_RECV,
    WSYNC_FAULT_STORE_PUBLISH,
    WSYNC_FAULT_STORE_GET,
    WSYNC_FAULT_COMMIT,
    WSYNC_FAULT_DELTA_CORRUPT,
    WSYNC_FAULT_BELL_WAIT,
    WSYNC_FAULT_NPOINTS
} wsync_fault_point_t;

/* What the caller of a hook must do; kill, stop and delay have happened inside it. */
typedef enum {
    WSYNC_FAULT_NONE = 0,
    WSYNC_FAULT_DROP,
    WSYNC_FAULT_CORRUPT,
    WSYNC_FAULT_FAIL,
} wsync_fault_act_t;

#if defined(WSYNC_FAULTS) && WSYNC_FAULTS

/* Parse WSYNC_FAULT if this process has not yet (the same answer every later call). */
wsync_status_t wsync_fault_init(void);
/* One hit at `point` (msg_type: the frame's type at ctrl.*, else -1). Thread-safe. */
wsync_fault_act_t wsync_fault_hit(wsync_fault_point_t point, int msg_type);
/* WSYNC_ERR_IO "injected fault at <point> (hit N): <where>", for a FAIL. */
wsync_status_t wsync_fault_err(wsync_fault_point_t point, const char *where);
/* Flip one bit in the middle of [data, data + len), for a CORRUPT. */
void wsync_fault_flip(void *data, size_t len);

#define WSYNC_FAULT(point) wsync_fault_hit((point), -1)
#define WSYNC_FAULT_MSG(point, type) wsync_fault_hit((point), (int)(type))

#else

/* Says (once, as a warning) that WSYNC_FAULT is set but this build cannot honour it. */
wsync_status_t wsync_fault_init(void);
static inline wsync_status_t wsync_fault_err(wsync_fault_point_t point, const char *where)
{
    (void)point;
    (void)where;
    return WSYNC_ERR_INTERNAL;
}
static inline void wsync_fault_flip(void *data, size_t len)
{
    (void)data;
    (void)len;
}

#define WSYNC_FAULT(point) WSYNC_FAULT_NONE
#define WSYNC_FAULT_MSG(point, type) WSYNC_FAULT_NONE

#endif

#endif
