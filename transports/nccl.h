/* Internal: NCCL communicators for the nccl scheme (schemes/nccl.c), behind plain C so that the
 * scheme compiles and its schedule is tested without NCCL. Without WSYNC_HAVE_NCCL every function
 * returns WSYNC_ERR_UNSUPPORTED ("built without NCCL").
 *
 * Communicators are non-blocking (ncclConfig_t.blocking = 0): init, split, group ends and
 * finalize return at once, and wsync_nccl_wait polls ncclCommGetAsyncError until the operation
 * left ncclInProgress, up to a deadline, asking the caller's `check` between polls whether to give
 * up (the group failed on the control plane). Nothing here waits forever; on any failure the
 * caller aborts (wsync_nccl_abort). Buffers are device memory of the communicator's device; byte
 * counts travel as ncclUint8.
 *
 * Errors: WSYNC_ERR_DEVICE naming the call, the communicator's label ("nccl group 0 rank 2"),
 * ncclGetErrorString and ncclGetLastError; WSYNC_ERR_TIMEOUT from the waits.
 * One thread at a time per communicator (and its children: they share resources). */
#ifndef WSYNC_TRANSPORTS_NCCL_H
#define WSYNC_TRANSPORTS_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "wsync/wsync.h"

#define WSYNC_NCCL_ID_BYTES 128      /* NCCL_UNIQUE_ID_BYTES */

typedef struct wsync_nccl_comm wsync_nccl_comm_t;

/* 1 when built with NCCL. */
int wsync_nccl_compiled(void);

/* ncclGetUniqueId (rank 0 of a communicator, once; sent to the others out of band). */
wsync_status_t wsync_nccl_unique_id(uint8_t id[WSYNC_NCCL_ID_BYTES]);

/* Start creating rank `rank` of `nranks` on the calling thread's current CUDA device
 * (non-blocking; wsync_nccl_wait for it). Sets NCCL_NVLS_ENABLE=0 first unless the environment
 * sets it. `label` names the communicator in messages. *comm is valid (to wait on, or abort)
 * even while its init runs. */
wsync_status_t wsync_nccl_comm_init(const uint8_t id[WSYNC_NCCL_ID_BYTES], int nranks, int rank,
                                    const char *label, wsync_nccl_comm_t **comm);

/* Returns WSYNC_OK to go on waiting, or a status to give up with (its last error set). */
typedef wsync_status_t (*wsync_nccl_check_fn)(void *arg);

/* ncclCommSplit, collective over every rank of `parent` (each calls it, in the same order):
 * color >= 0 joins the child of that color, ranked by key; color < 0 joins none (*child NULL).
 * The child shares the parent's resources (splitShare). Returns once the split is complete
 * (polling as wsync_nccl_wait does, until deadline_ms): non-blocking NCCL stores the child's
 * handle asynchronously, at the end of its split job, into memory that must outlive the call.
 * On failure the caller must abort the parent. */
wsync_status_t wsync_nccl_comm_split(wsync_nccl_comm_t *parent, int color, int key,
                                     const char *label, int64_t deadline_ms,
                                     wsync_nccl_check_fn check, void *arg,
                                     wsync_nccl_comm_t **child);

/* Poll until the communicator's last operation left ncclInProgress: WSYNC_OK when it succeeded,
 * WSYNC_ERR_DEVICE when it (or an earlier asynchronous operation) failed, WSYNC_ERR_TIMEOUT at
 * deadline_ms ("<label>: <what> did not finish within N ms"), or what `check` (may be NULL)
 * returned. */
wsync_status_t wsync_nccl_wait(wsync_nccl_comm_t *comm, int64_t deadline_ms, const char *what,
                               wsync_nccl_check_fn check, void *arg);

/* One non-blocking look at ncclCommGetAsyncError: WSYNC_OK (idle or still in progress) or
 * WSYNC_ERR_DEVICE naming the failure. NULL comm: WSYNC_OK. */
wsync_status_t wsync_nccl_check(wsync_nccl_comm_t *comm);

/* ncclGroupStart / ncclGroupEnd (the end's ncclInProgress is success: wsync_nccl_wait on every
 * communicator of the group before its next call). `comm` names the group in errors. */
wsync_status_t wsync_nccl_group_start(void);
wsync_status_t wsync_nccl_group_end(wsync_nccl_comm_t *comm);

/* Inside a group: ncclSend / ncclRecv of `bytes` bytes with `peer` (a rank of comm), and
 * ncclBroadcast from `root` (send is read at the root, recv written elsewhere), on `stream` (a
 * cudaStream_t as void *). */
wsync_status_t wsync_nccl_send(wsync_nccl_comm_t *comm, const void *buf, size_t bytes, int peer,
                               void *stream);
wsync_status_t wsync_nccl_recv(wsync_nccl_comm_t *comm, void *buf, size_t bytes, int peer,
                               void *stream);
wsync_status_t wsync_nccl_bcast(wsync_nccl_comm_t *comm, const void *send, void *recv,
                                size_t bytes, int root, void *stream);

/* ncclAllGather of `bytes` bytes from every rank: recv[i * bytes, (i + 1) * bytes) gets rank i's
 * send (recv holds nranks * bytes). */
wsync_status_t wsync_nccl_allgather(wsync_nccl_comm_t *comm, const void *send, void *recv,
                                    size_t bytes, void *stream);

#define WSYNC_NCCL_ABORT_MS 10000   /* wsync_nccl_abort's bound */

/* ncclCommAbort of comms[0..n) in that order (sub-communicators before their parent; NULL
 * entries skipped), then free them: the caller must not use them again. The aborts run on a
 * helper thread; this waits for them until deadline_ms. Returns 1 when every abort returned
 * (NCCL's kernels of those communicators have then stopped), 0 when the deadline passed first:
 * the aborts go on in the background and the caller must leak device memory and streams that
 * NCCL kernels may still use rather than free them (cudaFree would wait for those kernels). */
int wsync_nccl_abort_all(wsync_nccl_comm_t *const *comms, int n, int64_t deadline_ms);
/* wsync_nccl_abort_all of one communicator, bounded by WSYNC_NCCL_ABORT_MS. NULL is a no-op. */
void wsync_nccl_abort(wsync_nccl_comm_t *comm);
/* For an orderly end only (never after a failure or a lost peer: abort then):
 * ncclCommFinalize (waited for until deadline_ms), then ncclCommDestroy; a finalize that fails or
 * does not finish in time aborts instead (and says so in the log). NULL is a no-op. */
void wsync_nccl_destroy(wsync_nccl_comm_t *comm, int64_t deadline_ms);

const char *wsync_nccl_label(const wsync_nccl_comm_t *comm);

#endif
