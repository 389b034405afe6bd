/* Internal: a small pool of worker threads for CPU passes over independent items (the store's
 * delta regions: the sender's encode, the reader's check, apply and hash; docs/delta.md).
 *
 * Created once at set-up and joined at free, so that a version starts no thread. A run hands
 * items 0..n-1 out one at a time (the next free item to the next free thread, so a few large
 * items do not leave threads idle behind a static split); the calling thread works too. The
 * first failure stops the run: threads take no new item, the items in progress finish, and the
 * run returns the error of the lowest failing item (every item below it ran, so that is the
 * lowest failing item of all: the same error whatever the threads' timing), its text as the
 * worker's wsync_err gave it. */
#ifndef WSYNC_CORE_WORKPOOL_H
#define WSYNC_CORE_WORKPOOL_H

#include <stdint.h>

#include "wsync/wsync.h"

/* At most this many threads (the caller included) from the CPUs available. The passes are
 * memory-bound, but one core reads far below a socket's bandwidth: on the 16-core Xeon host of
 * an H100 machine a store reader's apply and hash of 1.19 GB took 30-37 ms on 16 threads against
 * 44-58 ms on 8 (docs/delta.md, "The store scheme"). */
#define WSYNC_WORKPOOL_CAP 16u
/* WSYNC_DELTA_THREADS may ask for up to this many. */
#define WSYNC_WORKPOOL_MAX 64u

typedef struct wsync_workpool wsync_workpool_t;

/* One item of a run. worker: 0 for the calling thread, 1..n-1 for the pool's threads (per-worker
 * scratch). Errors go through wsync_err as anywhere; the run carries the text to the caller. */
typedef wsync_status_t (*wsync_work_fn_t)(void *arg, uint32_t item, uint32_t worker);

/* Threads for a pool: environment variable `var` when set (an integer in 1..WSYNC_WORKPOOL_MAX;
 * anything else is WSYNC_ERR_INVALID naming the variable and its value), else the CPUs this
 * thread may run on (sched_getaffinity) capped at WSYNC_WORKPOOL_CAP. *n untouched on failure. */
wsync_status_t wsync_workpool_threads(const char *var, uint32_t *n);

/* A pool of n threads in all (the caller counts as one: n - 1 are started; n = 1 starts none and
 * runs every item on the caller). WSYNC_ERR_INVALID for n outside 1..WSYNC_WORKPOOL_MAX,
 * WSYNC_ERR_NOMEM, WSYNC_ERR_IO when a thread cannot start (those started are joined). */
wsync_status_t wsync_workpool_create(uint32_t n, wsync_workpool_t **out);
/* Joins the threads. NULL is a no-op. Not while a run is in progress. */
void wsync_workpool_free(wsync_workpool_t *p);
/* Threads in all, the caller included (1 for NULL). */
uint32_t wsync_workpool_size(const wsync_workpool_t *p);

/* Run fn(arg, i, worker) for i in 0..nitems-1 over the pool (p NULL: on the caller alone),
 * returning once every item started has ended. WSYNC_OK when all succeeded; else the lowest
 * failing item's status with its text. Past deadline_ms (wsync_now_ms clock) no item starts:
 * WSYNC_ERR_TIMEOUT naming `what` and how many items ended; items in progress are CPU work
 * without waits and are let finish, as they write the caller's memory. One run at a time per
 * pool (the caller's thread). */
wsync_status_t wsync_workpool_run(wsync_workpool_t *p, uint32_t nitems, wsync_work_fn_t fn,
                                  void *arg, int64_t deadline_ms, const char *what);

#endif
