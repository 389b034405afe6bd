/* The device facade (device.h): thin wrappers over cudart, or WSYNC_ERR_UNSUPPORTED without CUDA. */
#include "kernels/device.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "core/status.h"
#include "core/util.h"
#include "wsync_build_config.h"

void wsync_dev_uuid_str(const uint8_t uuid[WSYNC_DEV_UUID_BYTES], char *buf, size_t len)
{
    /* nvidia-smi's form: GPU-8-4-4-4-12 hex digits */
    static const int groups[] = {4, 2, 2, 2, 6};
    size_t n = 0;
    int b = 0;

    if (len == 0)
        return;
    buf[0] = '\0';
    n += (size_t)snprintf(buf, len, "GPU");
    for (int g = 0; g < 5 && n < len; g++) {
        n += (size_t)snprintf(buf + n, len - n, "-");
        for (int i = 0; i < groups[g] && n < len; i++, b++)
            n += (size_t)snprintf(buf + n, len - n, "%02x", uuid[b]);
    }
}

wsync_status_t wsync_kcopy_reserve(wsync_kcopy_t **descs, uint32_t *cap, uint32_t need)
{
    if (need <= *cap)
        return WSYNC_OK;
    uint32_t n = *cap > need / 2 ? *cap * 2 : need;
    if (n < 64)
        n = 64;
    wsync_kcopy_t *p = realloc(*descs, (size_t)n * sizeof(*p));
    if (p == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "no memory for %u copy descriptors", need);
    *descs = p;
    *cap = n;
    return WSYNC_OK;
}

#if WSYNC_HAVE_CUDA

#include <cuda_runtime_api.h>

int wsync_dev_compiled(void) { return 1; }

/* The error of a failed call, consumed (cudart keeps a sticky "last error" otherwise). */
static wsync_status_t cu_err(cudaError_t e, const char *fmt, ...) WSYNC_PRINTF(2, 3);
static wsync_status_t cu_err(cudaError_t e, const char *fmt, ...)
{
    char what[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    (void)cudaGetLastError();
    return wsync_err(WSYNC_ERR_DEVICE, "%s: %s: %s", what, cudaGetErrorName(e),
                     cudaGetErrorString(e));
}

/* Once an NCCL abort is left running on a helper thread (wsync_dev_mark_wedged), it may hold the
 * CUDA driver's locks for good: seen on H200s, ncclCommAbort of a survivor sat in cuMemFreeHost,
 * waiting for a kernel stuck on the dead peer, while cuEventCreate on the main thread waited for
 * the driver lock it held. So from then on no wsync function makes a CUDA call in this process:
 * each fails at once (or, freeing, does nothing), and the caller's error returns instead of a
 * hang. The process should exit (wsync.h). */
static atomic_int wedged_device = -1;

void wsync_dev_mark_wedged(int device)
{
    int none = -1;
    if (atomic_compare_exchange_strong(&wedged_device, &none, device < 0 ? 0 : device))
        WSYNC_LOG_W("device %d: kernels that may never finish remain (a communicator whose abort "
                    "did not return, and may hold the CUDA driver's locks): wsync makes no more "
                    "CUDA calls in this process and leaks its device memory; the process should "
                    "exit", device);
}

int wsync_dev_is_wedged(void)
{
    return atomic_load(&wedged_device) >= 0;
}

static wsync_status_t wedged_err(const char *fn)
{
    return wsync_err(WSYNC_ERR_DEVICE, "%s: refused: an NCCL abort on device %d did not return "
                     "and may hold the CUDA driver's locks; this process can make no more CUDA "
                     "calls and should exit", fn, atomic_load(&wedged_device));
}

#define REFUSE_IF_WEDGED()                                                                     \
    do {                                                                                       \
        if (atomic_load(&wedged_device) >= 0)                                                  \
            return wedged_err(__func__);                                                       \
    } while (0)
#define SKIP_IF_WEDGED()                                                                       \
    do {                                                                                       \
        if (atomic_load(&wedged_device) >= 0)                                                  \
            return;                                                                            \
    } while (0)

static int cur_dev(void)
{
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return d;
}

wsync_status_t wsync_dev_count(int *count)
{
    REFUSE_IF_WEDGED();
    int n = 0;
    cudaError_t e;

    if (count == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_dev_count: NULL argument");
    e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return cu_err(e, "cudaGetDeviceCount");
    if (n <= 0)
        return wsync_err(WSYNC_ERR_DEVICE, "cudaGetDeviceCount: no CUDA device visible to this "
                         "process (CUDA_VISIBLE_DEVICES?)");
    *count = n;
    return WSYNC_OK;
}

wsync_status_t wsync_dev_set(int device)
{
    REFUSE_IF_WEDGED();
    cudaError_t e = cudaSetDevice(device);
    return e == cudaSuccess ? WSYNC_OK : cu_err(e, "cudaSetDevice(%d)", device);
}

wsync_status_t wsync_dev_get(int *device)
{
    REFUSE_IF_WEDGED();
    int d;
    cudaError_t e;

    if (device == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_dev_get: NULL argument");
    e = cudaGetDevice(&d);
    if (e != cudaSuccess)
        return cu_err(e, "cudaGetDevice");
    *device = d;
    return WSYNC_OK;
}

wsync_status_t wsync_dev_enter(int device, int *saved)
{
    REFUSE_IF_WEDGED();
    cudaError_t e;

    if (saved == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_dev_enter: NULL argument");
    *saved = -1;
    if (cudaGetDevice(saved) != cudaSuccess) {
        (void)cudaGetLastError();
        *saved = -1;
    }
    if (*saved == device)
        return WSYNC_OK;
    e = cudaSetDevice(device);
    return e == cudaSuccess ? WSYNC_OK : cu_err(e, "cudaSetDevice(%d)", device);
}

void wsync_dev_leave(int device, int saved)
{
    SKIP_IF_WEDGED();
    if (saved >= 0 && saved != device && cudaSetDevice(saved) != cudaSuccess)
        (void)cudaGetLastError();
}

wsync_status_t wsync_dev_uuid(int device, uint8_t uuid[WSYNC_DEV_UUID_BYTES])
{
    REFUSE_IF_WEDGED();
    struct cudaDeviceProp prop;
    cudaError_t e;

    if (uuid == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_dev_uuid: NULL argument");
    e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess)
        return cu_err(e, "cudaGetDeviceProperties(%d)", device);
    memcpy(uuid, prop.uuid.bytes, WSYNC_DEV_UUID_BYTES);
    return WSYNC_OK;
}

wsync_status_t wsync_dev_find_uuid(const uint8_t uuid[WSYNC_DEV_UUID_BYTES], int *device)
{
    int n = 0;
    wsync_status_t st;

    if (uuid == NULL || device == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_dev_find_uuid: NULL argument");
    if ((st = wsync_dev_count(&n)) != WSYNC_OK)
        return st;
    for (int d = 0; d < n; d++) {
        uint8_t u[WSYNC_DEV_UUID_BYTES];
        if ((st = wsync_dev_uuid(d, u)) != WSYNC_OK)
            return st;
        if (memcmp(u, uuid, WSYNC_DEV_UUID_BYTES) == 0) {
            *device = d;
            return WSYNC_OK;
        }
    }
    return WSYNC_ERR_NOT_FOUND;
}

wsync_status_t wsync_dev_can_access_peer(int device, int peer, int *can)
{
    REFUSE_IF_WEDGED();
    int c = 0;
    cudaError_t e;

    if (can == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_dev_can_access_peer: NULL argument");
    if (device == peer) {
        *can = 1;
        return WSYNC_OK;
    }
    e = cudaDeviceCanAccessPeer(&c, device, peer);
    if (e != cudaSuccess)
        return cu_err(e, "cudaDeviceCanAccessPeer(%d, %d)", device, peer);
    *can = c != 0;
    return WSYNC_OK;
}

wsync_status_t wsync_dev_ptr_info(const void *ptr, wsync_dev_ptr_t *info)
{
    REFUSE_IF_WEDGED();
    struct cudaPointerAttributes a;
    cudaError_t e;

    if (info == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_dev_ptr_info: NULL argument");
    memset(&a, 0, sizeof(a));
    e = cudaPointerGetAttributes(&a, ptr);
    if (e == cudaErrorInvalidValue) {   /* older drivers: memory CUDA does not know */
        (void)cudaGetLastError();
        info->kind = WSYNC_DEV_PTR_HOST;
        info->device = -1;
        return WSYNC_OK;
    }
    if (e != cudaSuccess)
        return cu_err(e, "cudaPointerGetAttributes(%p)", ptr);
    switch (a.type) {
    case cudaMemoryTypeDevice:
        info->kind = WSYNC_DEV_PTR_DEVICE;
        info->device = a.device;
        break;
    case cudaMemoryTypeManaged:
        info->kind = WSYNC_DEV_PTR_MANAGED;
        info->device = a.device;
        break;
    case cudaMemoryTypeHost:
        info->kind = WSYNC_DEV_PTR_HOST_PINNED;
        info->device = -1;
        break;
    default:
        info->kind = WSYNC_DEV_PTR_HOST;
        info->device = -1;
        break;
    }
    return WSYNC_OK;
}

wsync_status_t wsync_dev_stream_create(void **stream)
{
    REFUSE_IF_WEDGED();
    cudaStream_t s;
    cudaError_t e;

    if (stream == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_dev_stream_create: NULL argument");
    e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess)
        return cu_err(e, "cudaStreamCreateWithFlags on device %d", cur_dev());
    *stream = s;
    return WSYNC_OK;
}

wsync_status_t wsync_dev_stream_create_prio(void **stream, int boost)
{
    REFUSE_IF_WEDGED();
    cudaStream_t s;
    cudaError_t e;
    int least = 0, greatest = 0;

    if (stream == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_dev_stream_create_prio: NULL argument");
    e = cudaDeviceGetStreamPriorityRange(&least, &greatest);   /* greater priority: lower number */
    if (e == cudaSuccess)
        e = cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking,
                                         least - boost < greatest ? greatest : least - boost);
    if (e != cudaSuccess)
        return cu_err(e, "cudaStreamCreateWithPriority on device %d", cur_dev());
    *stream = s;
    return WSYNC_OK;
}

wsync_status_t wsync_dev_sm_count(int device, int *sms)
{
    REFUSE_IF_WEDGED();
    if (sms == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_dev_sm_count: NULL argument");
    cudaError_t e = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device);
    return e == cudaSuccess ? WSYNC_OK
                            : cu_err(e, "cudaDeviceGetAttribute(multiprocessors, device %d)", device);
}

void wsync_dev_stream_destroy(void *stream)
{
    SKIP_IF_WEDGED();
    if (stream == NULL)
        return;
    cudaError_t e = cudaStreamDestroy((cudaStream_t)stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        WSYNC_LOG_W("cudaStreamDestroy: %s", cudaGetErrorString(e));
    }
}

wsync_status_t wsync_dev_event_create(int timing, void **event)
{
    REFUSE_IF_WEDGED();
    cudaEvent_t ev;
    cudaError_t e;

    if (event == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_dev_event_create: NULL argument");
    e = cudaEventCreateWithFlags(&ev, timing ? cudaEventDefault : cudaEventDisableTiming);
    if (e != cudaSuccess)
        return cu_err(e, "cudaEventCreateWithFlags on device %d", cur_dev());
    *event = ev;
    return WSYNC_OK;
}

void wsync_dev_event_destroy(void *event)
{
    SKIP_IF_WEDGED();
    if (event == NULL)
        return;
    cudaError_t e = cudaEventDestroy((cudaEvent_t)event);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        WSYNC_LOG_W("cudaEventDestroy: %s", cudaGetErrorString(e));
    }
}

wsync_status_t wsync_dev_event_record(void *event, void *stream)
{
    REFUSE_IF_WEDGED();
    cudaError_t e = cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream);
    return e == cudaSuccess ? WSYNC_OK : cu_err(e, "cudaEventRecord");
}

wsync_status_t wsync_dev_event_query(void *event, int *done)
{
    REFUSE_IF_WEDGED();
    cudaError_t e;

    if (done == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_dev_event_query: NULL argument");
    e = cudaEventQuery((cudaEvent_t)event);
    if (e == cudaSuccess) {
        *done = 1;
        return WSYNC_OK;
    }
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        *done = 0;
        return WSYNC_OK;
    }
    return cu_err(e, "cudaEventQuery (work on the GPU failed)");
}

wsync_status_t wsync_dev_event_wait(void *event, int64_t deadline_ms, const char *what)
{
    uint64_t t0 = wsync_now_ns();
    long nap_ns = 0;

    for (;;) {
        int done = 0;
        wsync_status_t st = wsync_dev_event_query(event, &done);
        if (st != WSYNC_OK) {
            char text[1024];
            snprintf(text, sizeof(text), "%s: %s", what ? what : "GPU work", wsync_last_error());
            return wsync_err_set_text(st, text);
        }
        if (done)
            return WSYNC_OK;
        if (wsync_now_ms() >= deadline_ms)
            return wsync_err(WSYNC_ERR_TIMEOUT, "%s did not finish on the GPU within %.0f ms",
                             what ? what : "GPU work", (double)(wsync_now_ns() - t0) / 1e6);
        /* spin a little (short copies finish in microseconds), then back off to 50 us naps: a
         * nap's granularity is added to every wait, and a version waits per bucket */
        if (wsync_now_ns() - t0 > 100000) {
            struct timespec ts = {0, nap_ns};
            nap_ns = nap_ns < 50000 ? nap_ns + 5000 : nap_ns;
            nanosleep(&ts, NULL);
        }
    }
}

wsync_status_t wsync_dev_event_elapsed(void *start, void *end, float *ms)
{
    REFUSE_IF_WEDGED();
    float v = 0;
    cudaError_t e;

    if (ms == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_dev_event_elapsed: NULL argument");
    e = cudaEventElapsedTime(&v, (cudaEvent_t)start, (cudaEvent_t)end);
    if (e != cudaSuccess)
        return cu_err(e, "cudaEventElapsedTime");
    *ms = v;
    return WSYNC_OK;
}

wsync_status_t wsync_dev_stream_wait_event(void *stream, void *event)
{
    REFUSE_IF_WEDGED();
    cudaError_t e = cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0);
    return e == cudaSuccess ? WSYNC_OK : cu_err(e, "cudaStreamWaitEvent");
}

wsync_status_t wsync_dev_stream_sync(void *stream, int64_t deadline_ms, const char *what)
{
    void *ev = NULL;
    wsync_status_t st = wsync_dev_event_create(0, &ev);

    if (st == WSYNC_OK)
        st = wsync_dev_event_record(ev, stream);
    if (st == WSYNC_OK)
        st = wsync_dev_event_wait(ev, deadline_ms, what);
    wsync_dev_event_destroy(ev);
    return st;
}

wsync_status_t wsync_dev_malloc(size_t bytes, void **ptr)
{
    REFUSE_IF_WEDGED();
    void *p = NULL;
    cudaError_t e;

    if (ptr == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_dev_malloc: NULL argument");
    /* past 2 MiB, a multiple of 2 MiB (what the GPU backs it with anyway): other processes read
     * the buffers the ipc scheme shares up to a quarter slower otherwise (transports/cuda_ipc.c
     * warn_odd_size) */
    const size_t page = (size_t)2 << 20;
    if (bytes > SIZE_MAX - page)
        return wsync_err(WSYNC_ERR_RANGE, "wsync_dev_malloc: %zu bytes is no size to allocate", bytes);
    if (bytes > page)
        bytes = (bytes + page - 1) & ~(page - 1);
    e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess)
        return cu_err(e, "cudaMalloc(%zu bytes) on device %d", bytes, cur_dev());
    *ptr = p;
    return WSYNC_OK;
}

void wsync_dev_free(void *ptr)
{
    SKIP_IF_WEDGED();
    if (ptr == NULL)
        return;
    cudaError_t e = cudaFree(ptr);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        WSYNC_LOG_W("cudaFree(%p): %s", ptr, cudaGetErrorString(e));
    }
}

wsync_status_t wsync_dev_host_register(void *ptr, size_t bytes, int read_only, int *registered)
{
    REFUSE_IF_WEDGED();
    unsigned flags = cudaHostRegisterPortable | cudaHostRegisterMapped;
    cudaError_t e;

    if (registered == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_dev_host_register: NULL argument");
    if (read_only)
        flags |= cudaHostRegisterReadOnly;
    e = cudaHostRegister(ptr, bytes, flags);
    if (e == cudaErrorHostMemoryAlreadyRegistered) {
        (void)cudaGetLastError();
        *registered = 0;
        return WSYNC_OK;
    }
    if (e != cudaSuccess)
        return cu_err(e, "cudaHostRegister(%p, %zu bytes%s)", ptr, bytes,
                      read_only ? ", read-only" : "");
    *registered = 1;
    return WSYNC_OK;
}

void wsync_dev_host_unregister(void *ptr)
{
    SKIP_IF_WEDGED();
    if (ptr == NULL)
        return;
    cudaError_t e = cudaHostUnregister(ptr);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        WSYNC_LOG_W("cudaHostUnregister(%p): %s", ptr, cudaGetErrorString(e));
    }
}

wsync_status_t wsync_dev_host_device_ptr(void *ptr, void **dev_ptr)
{
    REFUSE_IF_WEDGED();
    void *d = NULL;
    cudaError_t e;

    if (dev_ptr == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_dev_host_device_ptr: NULL argument");
    e = cudaHostGetDevicePointer(&d, ptr, 0);
    if (e != cudaSuccess)
        return cu_err(e, "cudaHostGetDevicePointer(%p)", ptr);
    *dev_ptr = d;
    return WSYNC_OK;
}

wsync_status_t wsync_dev_memcpy_async(void *dst, const void *src, size_t bytes, void *stream)
{
    REFUSE_IF_WEDGED();
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream);
    return e == cudaSuccess ? WSYNC_OK
                            : cu_err(e, "cudaMemcpyAsync(%p <- %p, %zu bytes)", dst, src, bytes);
}

wsync_status_t wsync_dev_memcpy2d_async(void *dst, size_t dst_pitch, const void *src,
                                        size_t src_pitch, size_t width, size_t rows, void *stream)
{
    REFUSE_IF_WEDGED();
    cudaError_t e = cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows,
                                      cudaMemcpyDefault, (cudaStream_t)stream);
    return e == cudaSuccess ? WSYNC_OK
                            : cu_err(e, "cudaMemcpy2DAsync(%p <- %p, %zu rows of %zu bytes)", dst,
                                     src, rows, width);
}

wsync_status_t wsync_dev_memset_async(void *ptr, int value, size_t bytes, void *stream)
{
    REFUSE_IF_WEDGED();
    cudaError_t e = cudaMemsetAsync(ptr, value, bytes, (cudaStream_t)stream);
    return e == cudaSuccess ? WSYNC_OK : cu_err(e, "cudaMemsetAsync(%p, %zu bytes)", ptr, bytes);
}

wsync_status_t wsync_dev_copy_to_host(void *dst, const void *src, size_t bytes, void *stream,
                                      int64_t deadline_ms)
{
    wsync_status_t st = wsync_dev_memcpy_async(dst, src, bytes, stream);
    return st == WSYNC_OK ? wsync_dev_stream_sync(stream, deadline_ms, "a copy to the host") : st;
}

wsync_status_t wsync_dev_batch_create(const wsync_kcopy_t *descs, uint32_t n,
                                      wsync_kcopy_batch_t **batch)
{
    REFUSE_IF_WEDGED();
    return wsync_kernels_batch_create(descs, n, batch);
}

wsync_status_t wsync_dev_batch_launch(const wsync_kcopy_batch_t *batch, void *stream)
{
    REFUSE_IF_WEDGED();
    return wsync_kernels_batch_launch(batch, stream);
}

void wsync_dev_batch_info(const wsync_kcopy_batch_t *batch, uint64_t *bytes_read,
                          uint64_t *bytes_written, uint32_t *ncopies)
{
    wsync_kernels_batch_info(batch, bytes_read, bytes_written, ncopies);
}

void wsync_dev_batch_free(wsync_kcopy_batch_t *batch)
{
    SKIP_IF_WEDGED();
    wsync_kernels_batch_free(batch);
}

void wsync_dev_batch_limit(wsync_kcopy_batch_t *batch, uint32_t max_blocks)
{
    wsync_kernels_batch_limit(batch, max_blocks);
}

wsync_status_t wsync_dev_quantize_launch(const wsync_kquant_t *a, void *ws, void *stream)
{
    REFUSE_IF_WEDGED();
    return wsync_kernels_quantize_launch(a, ws, stream);
}

wsync_status_t wsync_dev_quantize_finish(const wsync_kquant_t *a, void *ws, void *stream)
{
    REFUSE_IF_WEDGED();
    return wsync_kernels_quantize_finish(a, ws, stream);
}

wsync_status_t wsync_dev_quantize_many(const wsync_kquant_t *a, uint32_t n, void *const *ws,
                                       uint32_t max_blocks, void *stream)
{
    REFUSE_IF_WEDGED();
    return wsync_kernels_quantize_many(a, n, ws, max_blocks, stream);
}

wsync_status_t wsync_dev_quantize_check(const void *ws, size_t n, void *stream, int64_t deadline_ms,
                                        size_t *first_bad)
{
    uint32_t small[64 * WSYNC_KQUANT_WS_BYTES / sizeof(uint32_t)];
    size_t bytes = n * WSYNC_KQUANT_WS_BYTES;
    uint32_t *h = bytes <= sizeof(small) ? small : malloc(bytes);
    wsync_status_t st;

    if (first_bad == NULL || (ws == NULL && n > 0))
        return wsync_err(WSYNC_ERR_INVALID, "wsync_dev_quantize_check: NULL argument");
    *first_bad = n;
    if (n == 0)
        return WSYNC_OK;
    if (h == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "wsync_dev_quantize_check: no memory for %zu bytes", bytes);
    st = wsync_dev_copy_to_host(h, ws, bytes, stream, deadline_ms);
    for (size_t i = 0; st == WSYNC_OK && i < n; i++) {
        if (h[i * (WSYNC_KQUANT_WS_BYTES / sizeof(uint32_t)) + 1] != 0) {
            *first_bad = i;
            break;
        }
    }
    if (h != small)
        free(h);
    return st;
}

#else /* !WSYNC_HAVE_CUDA */

#define NO_CUDA(fn) wsync_err(WSYNC_ERR_UNSUPPORTED, "%s: built without CUDA", fn)

int wsync_dev_compiled(void) { return 0; }

wsync_status_t wsync_dev_count(int *count)
{
    (void)count;
    return NO_CUDA("wsync_dev_count");
}

wsync_status_t wsync_dev_set(int device)
{
    (void)device;
    return NO_CUDA("wsync_dev_set");
}

wsync_status_t wsync_dev_get(int *device)
{
    (void)device;
    return NO_CUDA("wsync_dev_get");
}

wsync_status_t wsync_dev_enter(int device, int *saved)
{
    (void)device;
    (void)saved;
    return NO_CUDA("wsync_dev_enter");
}

void wsync_dev_leave(int device, int saved)
{
    (void)device;
    (void)saved;
}

wsync_status_t wsync_dev_host_device_ptr(void *ptr, void **dev_ptr)
{
    (void)ptr;
    (void)dev_ptr;
    return NO_CUDA("wsync_dev_host_device_ptr");
}

wsync_status_t wsync_dev_uuid(int device, uint8_t uuid[WSYNC_DEV_UUID_BYTES])
{
    (void)device;
    (void)uuid;
    return NO_CUDA("wsync_dev_uuid");
}

wsync_status_t wsync_dev_find_uuid(const uint8_t uuid[WSYNC_DEV_UUID_BYTES], int *device)
{
    (void)uuid;
    (void)device;
    return NO_CUDA("wsync_dev_find_uuid");
}

wsync_status_t wsync_dev_can_access_peer(int device, int peer, int *can)
{
    (void)device;
    (void)peer;
    (void)can;
    return NO_CUDA("wsync_dev_can_access_peer");
}

wsync_status_t wsync_dev_ptr_info(const void *ptr, wsync_dev_ptr_t *info)
{
    (void)ptr;
    (void)info;
    return NO_CUDA("wsync_dev_ptr_info");
}

wsync_status_t wsync_dev_stream_create(void **stream)
{
    (void)stream;
    return NO_CUDA("wsync_dev_stream_create");
}

wsync_status_t wsync_dev_stream_create_prio(void **stream, int boost)
{
    (void)stream;
    (void)boost;
    return NO_CUDA("wsync_dev_stream_create_prio");
}

wsync_status_t wsync_dev_sm_count(int device, int *sms)
{
    (void)device;
    (void)sms;
    return NO_CUDA("wsync_dev_sm_count");
}

void wsync_dev_stream_destroy(void *stream) { (void)stream; }

wsync_status_t wsync_dev_event_create(int timing, void **event)
{
    (void)timing;
    (void)event;
    return NO_CUDA("wsync_dev_event_create");
}

void wsync_dev_event_destroy(void *event) { (void)event; }

wsync_status_t wsync_dev_event_record(void *event, void *stream)
{
    (void)event;
    (void)stream;
    return NO_CUDA("wsync_dev_event_record");
}

wsync_status_t wsync_dev_event_query(void *event, int *done)
{
    (void)event;
    (void)done;
    return NO_CUDA("wsync_dev_event_query");
}

wsync_status_t wsync_dev_event_wait(void *event, int64_t deadline_ms, const char *what)
{
    (void)event;
    (void)deadline_ms;
    (void)what;
    return NO_CUDA("wsync_dev_event_wait");
}

wsync_status_t wsync_dev_event_elapsed(void *start, void *end, float *ms)
{
    (void)start;
    (void)end;
    (void)ms;
    return NO_CUDA("wsync_dev_event_elapsed");
}

wsync_status_t wsync_dev_stream_wait_event(void *stream, void *event)
{
    (void)stream;
    (void)event;
    return NO_CUDA("wsync_dev_stream_wait_event");
}

wsync_status_t wsync_dev_stream_sync(void *stream, int64_t deadline_ms, const char *what)
{
    (void)stream;
    (void)deadline_ms;
    (void)what;
    return NO_CUDA("wsync_dev_stream_sync");
}

wsync_status_t wsync_dev_malloc(size_t bytes, void **ptr)
{
    (void)bytes;
    (void)ptr;
    return NO_CUDA("wsync_dev_malloc");
}

void wsync_dev_free(void *ptr) { (void)ptr; }

void wsync_dev_mark_wedged(int device) { (void)device; }

int wsync_dev_is_wedged(void) { return 0; }

wsync_status_t wsync_dev_host_register(void *ptr, size_t bytes, int read_only, int *registered)
{
    (void)ptr;
    (void)bytes;
    (void)read_only;
    (void)registered;
    return NO_CUDA("wsync_dev_host_register");
}

void wsync_dev_host_unregister(void *ptr) { (void)ptr; }

wsync_status_t wsync_dev_memcpy_async(void *dst, const void *src, size_t bytes, void *stream)
{
    (void)dst;
    (void)src;
    (void)bytes;
    (void)stream;
    return NO_CUDA("wsync_dev_memcpy_async");
}

wsync_status_t wsync_dev_memcpy2d_async(void *dst, size_t dst_pitch, const void *src,
                                        size_t src_pitch, size_t width, size_t rows, void *stream)
{
    (void)dst;
    (void)dst_pitch;
    (void)src;
    (void)src_pitch;
    (void)width;
    (void)rows;
    (void)stream;
    return NO_CUDA("wsync_dev_memcpy2d_async");
}

wsync_status_t wsync_dev_memset_async(void *ptr, int value, size_t bytes, void *stream)
{
    (void)ptr;
    (void)value;
    (void)bytes;
    (void)stream;
    return NO_CUDA("wsync_dev_memset_async");
}

wsync_status_t wsync_dev_copy_to_host(void *dst, const void *src, size_t bytes, void *stream,
                                      int64_t deadline_ms)
{
    (void)dst;
    (void)src;
    (void)bytes;
    (void)stream;
    (void)deadline_ms;
    return NO_CUDA("wsync_dev_copy_to_host");
}

wsync_status_t wsync_dev_batch_create(const wsync_kcopy_t *descs, uint32_t n,
                                      wsync_kcopy_batch_t **batch)
{
    (void)descs;
    (void)n;
    (void)batch;
    return NO_CUDA("wsync_dev_batch_create");
}

wsync_status_t wsync_dev_batch_launch(const wsync_kcopy_batch_t *batch, void *stream)
{
    (void)batch;
    (void)stream;
    return NO_CUDA("wsync_dev_batch_launch");
}

void wsync_dev_batch_info(const wsync_kcopy_batch_t *batch, uint64_t *bytes_read,
                          uint64_t *bytes_written, uint32_t *ncopies)
{
    (void)batch;
    if (bytes_read != NULL)
        *bytes_read = 0;
    if (bytes_written != NULL)
        *bytes_written = 0;
    if (ncopies != NULL)
        *ncopies = 0;
}

void wsync_dev_batch_free(wsync_kcopy_batch_t *batch) { (void)batch; }

void wsync_dev_batch_limit(wsync_kcopy_batch_t *batch, uint32_t max_blocks)
{
    (void)batch;
    (void)max_blocks;
}

wsync_status_t wsync_dev_quantize_launch(const wsync_kquant_t *a, void *ws, void *stream)
{
    (void)a;
    (void)ws;
    (void)stream;
    return NO_CUDA("wsync_dev_quantize_launch");
}

wsync_status_t wsync_dev_quantize_finish(const wsync_kquant_t *a, void *ws, void *stream)
{
    (void)a;
    (void)ws;
    (void)stream;
    return NO_CUDA("wsync_dev_quantize_finish");
}

wsync_status_t wsync_dev_quantize_many(const wsync_kquant_t *a, uint32_t n, void *const *ws,
                                       uint32_t max_blocks, void *stream)
{
    (void)a;
    (void)n;
    (void)ws;
    (void)max_blocks;
    (void)stream;
    return NO_CUDA("wsync_dev_quantize_many");
}

wsync_status_t wsync_dev_quantize_check(const void *ws, size_t n, void *stream, int64_t deadline_ms,
                                        size_t *first_bad)
{
    (void)ws;
    (void)stream;
    (void)deadline_ms;
    if (first_bad != NULL)
        *first_bad = n;
    return NO_CUDA("wsync_dev_quantize_check");
}

#endif
