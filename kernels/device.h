/* Internal: the device facade — the few CUDA runtime calls the library makes outside kernels/,
 * behind plain C, compiled in every build.
 *
 * Why: core/ and schemes/ must build and run without CUDA. They call these functions instead of
 * cudart; without WSYNC_HAVE_CUDA every function returns WSYNC_ERR_UNSUPPORTED ("built without
 * CUDA"), and wsync_dev_compiled() says 0, so callers can decide before trying.
 *
 * Conventions:
 *  - streams and events are cudaStream_t / cudaEvent_t passed as void * (NULL stream: the legacy
 *    default stream);
 *  - functions act on the calling thread's *current* device (wsync_dev_set), as cudart does,
 *    except where a device argument is taken;
 *  - errors: WSYNC_ERR_DEVICE with wsync_last_error() naming the call, its arguments where they
 *    help, and the CUDA error ("cudaMalloc(268435456 bytes) on device 1: cudaErrorMemoryAllocation:
 *    out of memory"); WSYNC_ERR_INVALID for NULL outputs; WSYNC_ERR_TIMEOUT from the waits;
 *  - outputs written only on success; free/destroy functions accept NULL and log (warn) a failure
 *    rather than return it;
 *  - every wait takes a deadline (core/util.h wsync_deadline_in) and polls: nothing blocks forever.
 *  Thread-safe as cudart is.
 */
#ifndef WSYNC_KERNELS_DEVICE_H
#define WSYNC_KERNELS_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "wsync/wsync.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the library was built with CUDA (the functions below can work), else 0. */
int wsync_dev_compiled(void);

/* ---- devices ------------------------------------------------------------------------------- */

/* Number of CUDA devices visible to this process (0 is an error: WSYNC_ERR_DEVICE with why). */
wsync_status_t wsync_dev_count(int *count);
/* cudaSetDevice / cudaGetDevice for the calling thread. */
wsync_status_t wsync_dev_set(int device);
wsync_status_t wsync_dev_get(int *device);
/* Make `device` current for a stretch of library work on a caller's thread, remembering the
 * caller's device in *saved; wsync_dev_leave puts it back. Cheap when it is already current. */
wsync_status_t wsync_dev_enter(int device, int *saved);
void wsync_dev_leave(int device, int saved);

#define WSYNC_DEV_UUID_BYTES 16
/* The 16-byte UUID of a device ordinal (same bytes in every process of the node, whatever
 * CUDA_VISIBLE_DEVICES says). */
wsync_status_t wsync_dev_uuid(int device, uint8_t uuid[WSYNC_DEV_UUID_BYTES]);
/* The ordinal, in this process, of the device with that UUID; WSYNC_ERR_NOT_FOUND (no last
 * error set) when this process does not see it. */
wsync_status_t wsync_dev_find_uuid(const uint8_t uuid[WSYNC_DEV_UUID_BYTES], int *device);
/* "GPU-1a2b3c4d-..." form of a UUID, for logs (buf of at least 41 bytes). */
void wsync_dev_uuid_str(const uint8_t uuid[WSYNC_DEV_UUID_BYTES], char *buf, size_t len);

/* cudaDeviceCanAccessPeer(device, peer): 1 when kernels on `device` can read `peer`'s memory
 * (same device: 1). */
wsync_status_t wsync_dev_can_access_peer(int device, int peer, int *can);
/* Streaming multiprocessors of `device`. */
wsync_status_t wsync_dev_sm_count(int device, int *sms);

/* ---- pointers ------------------------------------------------------------------------------ */

typedef enum {
    WSYNC_DEV_PTR_HOST = 0,          /* host memory CUDA does not know (malloc, mmap) */
    WSYNC_DEV_PTR_HOST_PINNED = 1,   /* host memory pinned or registered with CUDA */
    WSYNC_DEV_PTR_DEVICE = 2,        /* device memory (cudaMalloc, pools, cuMemCreate) */
    WSYNC_DEV_PTR_MANAGED = 3,       /* managed (unified) memory */
} wsync_dev_ptr_kind_t;

typedef struct {
    wsync_dev_ptr_kind_t kind;
    int device;                      /* the owning device ordinal; -1 for host memory */
} wsync_dev_ptr_t;

/* What `ptr` is (cudaPointerGetAttributes). Host memory is not an error. */
wsync_status_t wsync_dev_ptr_info(const void *ptr, wsync_dev_ptr_t *info);

/* ---- streams and events -------------------------------------------------------------------- */

/* A non-blocking stream on the current device. */
wsync_status_t wsync_dev_stream_create(void **stream);
/* The same `boost` priority levels above normal (clamped to the device's range): the block
 * scheduler starts the blocks of a higher-priority stream's kernels first. */
wsync_status_t wsync_dev_stream_create_prio(void **stream, int boost);
void wsync_dev_stream_destroy(void *stream);
/* An event on the current device; timing 0: no timing (cheapest to record and query). */
wsync_status_t wsync_dev_event_create(int timing, void **event);
void wsync_dev_event_destroy(void *event);
wsync_status_t wsync_dev_event_record(void *event, void *stream);
/* *done = 1 when every work recorded before the event finished, 0 while it runs; a CUDA error
 * (a kernel fault) is WSYNC_ERR_DEVICE. */
wsync_status_t wsync_dev_event_query(void *event, int *done);
/* Poll the event until done or deadline_ms (absolute, wsync_deadline_in): WSYNC_ERR_TIMEOUT with
 * "<what> did not finish on the GPU within N ms". `what` names the work for the message. */
wsync_status_t wsync_dev_event_wait(void *event, int64_t deadline_ms, const char *what);
/* Milliseconds between two timing events, both completed. */
wsync_status_t wsync_dev_event_elapsed(void *start, void *end, float *ms);
/* Make `stream` wait (on the device) for `event`. */
wsync_status_t wsync_dev_stream_wait_event(void *stream, void *event);
/* Wait for everything enqueued on `stream` so far, until deadline_ms (records an internal event
 * and polls it). */
wsync_status_t wsync_dev_stream_sync(void *stream, int64_t deadline_ms, const char *what);

/* ---- memory -------------------------------------------------------------------------------- */

/* cudaMalloc on the current device (past 2 MiB, rounded up to a multiple of 2 MiB). */
wsync_status_t wsync_dev_malloc(size_t bytes, void **ptr);
void wsync_dev_free(void *ptr);
/* A device on which kernels may never finish (NCCL's, waiting on a dead peer, after an abort
 * that did not return and goes on in a thread of its own, perhaps holding the CUDA driver's
 * locks): once one is marked, every wsync_dev_* function of this process makes no CUDA call any
 * more: those that return a status fail with WSYNC_ERR_DEVICE, frees and destroys leak (logged
 * once). wsync_dev_is_wedged: whether that has happened (to any device: the locks are the
 * process's). */
void wsync_dev_mark_wedged(int device);
int wsync_dev_is_wedged(void);
/* Pin host memory [ptr, ptr + bytes) and map it for every device (cudaHostRegister, portable and
 * mapped): kernels then read (and, unless read_only, write) it through its host address (UVA).
 * read_only: the pages are mapped PROT_READ (cudaHostRegisterReadOnly; devices that lack it give
 * WSYNC_ERR_DEVICE). Memory already registered is not an error (*registered = 0: the caller must
 * not unregister it); otherwise *registered = 1. */
wsync_status_t wsync_dev_host_register(void *ptr, size_t bytes, int read_only, int *registered);
void wsync_dev_host_unregister(void *ptr);
/* The address kernels use for registered host memory (cudaHostGetDevicePointer; equal to ptr on
 * every system wsync targets, but asked rather than assumed). */
wsync_status_t wsync_dev_host_device_ptr(void *ptr, void **dev_ptr);

/* cudaMemcpyAsync(cudaMemcpyDefault) of `bytes` (any pair of host/device pointers). */
wsync_status_t wsync_dev_memcpy_async(void *dst, const void *src, size_t bytes, void *stream);
/* cudaMemcpy2DAsync(cudaMemcpyDefault): `rows` rows of `width` bytes, pitches in bytes. */
wsync_status_t wsync_dev_memcpy2d_async(void *dst, size_t dst_pitch, const void *src,
                                        size_t src_pitch, size_t width, size_t rows, void *stream);
/* cudaMemsetAsync. */
wsync_status_t wsync_dev_memset_async(void *ptr, int value, size_t bytes, void *stream);
/* Copy [src, src + bytes) of any memory to host memory `dst` and wait (deadline): for checks
 * and checksums, not the data path. */
wsync_status_t wsync_dev_copy_to_host(void *dst, const void *src, size_t bytes, void *stream,
                                      int64_t deadline_ms);

/* ---- kernels (kernels/kernels.h), callable from builds without CUDA --------------------------- */

/* Room for at least `need` descriptors in *descs (capacity *cap, grown geometrically), for the
 * schemes that build batches. WSYNC_ERR_NOMEM leaves *descs as it was. */
wsync_status_t wsync_kcopy_reserve(wsync_kcopy_t **descs, uint32_t *cap, uint32_t need);
wsync_status_t wsync_dev_batch_create(const wsync_kcopy_t *descs, uint32_t n,
                                      wsync_kcopy_batch_t **batch);
wsync_status_t wsync_dev_batch_launch(const wsync_kcopy_batch_t *batch, void *stream);
void wsync_dev_batch_info(const wsync_kcopy_batch_t *batch, uint64_t *bytes_read,
                          uint64_t *bytes_written, uint32_t *ncopies);
void wsync_dev_batch_free(wsync_kcopy_batch_t *batch);
void wsync_dev_batch_limit(wsync_kcopy_batch_t *batch, uint32_t max_blocks);
/* wsync_kernels_quantize_launch / _finish / quantize (finish waits for the stream). */
wsync_status_t wsync_dev_quantize_launch(const wsync_kquant_t *a, void *ws, void *stream);
wsync_status_t wsync_dev_quantize_finish(const wsync_kquant_t *a, void *ws, void *stream);
wsync_status_t wsync_dev_quantize_many(const wsync_kquant_t *a, uint32_t n, void *const *ws,
                                       uint32_t max_blocks, void *stream);
/* After n quantizations launched on `stream` with workspaces ws + i * WSYNC_KQUANT_WS_BYTES: one
 * copy of all n workspaces to the host (waiting for the stream, up to the deadline) and *first_bad
 * = the first i whose quantization saw a non-finite value (its _finish names it), or n if none.
 * Saves a stream synchronization per target when all is well. Relies on the workspace layout of
 * kernels/quant.cu: uint32 [0] amax bits, [1] non-finite seen. */
wsync_status_t wsync_dev_quantize_check(const void *ws, size_t n, void *stream, int64_t deadline_ms,
                                        size_t *first_bad);

#ifdef __cplusplus
}
#endif

#endif
