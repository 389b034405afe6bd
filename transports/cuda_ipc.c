/* cuda_ipc transport: GPU memory shared between processes of one node (see cuda_ipc.h). */
#include "transports/cuda_ipc.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/log.h"
#include "core/status.h"
#include "transports/transport.h"
#include "wsync_build_config.h"

void wsync_cuda_ipc_fd_room(uint32_t more)
{
    struct rlimit rl;
    long open_now = 64;   /* a guess at what the process already holds, beyond `more` */

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    rlim_t want = (rlim_t)more + (rlim_t)open_now + 256;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        rlim_t old = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
            WSYNC_LOG_I("cuda_ipc: open-file limit raised from %llu to %llu for %u descriptors",
                        (unsigned long long)old, (unsigned long long)rl.rlim_cur, more);
    }
}

#if WSYNC_HAVE_CUDA

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <pthread.h>

#include "kernels/device.h"

enum { REG_LEGACY = 1, REG_VMM = 2 };
#define MAX_REGIONS (1u << 16)
#define MAX_PIECES (1u << 20)

/* ---- driver entry points (no libcuda link) ------------------------------------------------- */

static struct {
    PFN_cuGetErrorName_v6000 GetErrorName;
    PFN_cuDeviceGet_v2000 DeviceGet;
    PFN_cuPointerGetAttribute_v4000 PointerGetAttribute;
    PFN_cuMemGetAddressRange_v3020 MemGetAddressRange;
    PFN_cuMemRetainAllocationHandle_v11000 MemRetainAllocationHandle;
    PFN_cuMemGetAllocationPropertiesFromHandle_v10020 MemGetAllocationPropertiesFromHandle;
    PFN_cuMemExportToShareableHandle_v10020 MemExportToShareableHandle;
    PFN_cuMemImportFromShareableHandle_v10020 MemImportFromShareableHandle;
    PFN_cuMemGetAllocationGranularity_v10020 MemGetAllocationGranularity;
    PFN_cuMemAddressReserve_v10020 MemAddressReserve;
    PFN_cuMemAddressFree_v10020 MemAddressFree;
    PFN_cuMemMap_v10020 MemMap;
    PFN_cuMemUnmap_v10020 MemUnmap;
    PFN_cuMemSetAccess_v10020 MemSetAccess;
    PFN_cuMemRelease_v10020 MemRelease;
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static char drv_error[256];

static void drv_load(void)
{
    static const struct {
        const char *name;
        void **slot;
        unsigned version;
    } syms[] = {
        {"cuGetErrorName", (void **)&drv.GetErrorName, 6000},
        {"cuDeviceGet", (void **)&drv.DeviceGet, 2000},
        {"cuPointerGetAttribute", (void **)&drv.PointerGetAttribute, 4000},
        {"cuMemGetAddressRange", (void **)&drv.MemGetAddressRange, 3020},
        {"cuMemRetainAllocationHandle", (void **)&drv.MemRetainAllocationHandle, 11000},
        {"cuMemGetAllocationPropertiesFromHandle", (void **)&drv.MemGetAllocationPropertiesFromHandle, 10020},
        {"cuMemExportToShareableHandle", (void **)&drv.MemExportToShareableHandle, 10020},
        {"cuMemImportFromShareableHandle", (void **)&drv.MemImportFromShareableHandle, 10020},
        {"cuMemGetAllocationGranularity", (void **)&drv.MemGetAllocationGranularity, 10020},
        {"cuMemAddressReserve", (void **)&drv.MemAddressReserve, 10020},
        {"cuMemAddressFree", (void **)&drv.MemAddressFree, 10020},
        {"cuMemMap", (void **)&drv.MemMap, 10020},
        {"cuMemUnmap", (void **)&drv.MemUnmap, 10020},
        {"cuMemSetAccess", (void **)&drv.MemSetAccess, 10020},
        {"cuMemRelease", (void **)&drv.MemRelease, 10020},
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        void *fn = NULL;
        cudaError_t e = cudaGetDriverEntryPointByVersion(syms[i].name, &fn, syms[i].version,
                                                         cudaEnableDefault, &q);
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || fn == NULL) {
            (void)cudaGetLastError();
            snprintf(drv_error, sizeof(drv_error), "cudaGetDriverEntryPointByVersion(%s, %u): %s "
                     "(query result %d)", syms[i].name, syms[i].version,
                     e != cudaSuccess ? cudaGetErrorString(e) : "not found", (int)q);
            return;
        }
        *syms[i].slot = fn;
    }
}

static wsync_status_t drv_ready(void)
{
    pthread_once(&drv_once, drv_load);
    if (drv_error[0] != '\0')
        return wsync_err(WSYNC_ERR_DEVICE, "cuda_ipc: the CUDA driver API is not available: %s",
                         drv_error);
    return WSYNC_OK;
}

static const char *cu_name(CUresult r)
{
    const char *s = NULL;
    if (drv.GetErrorName == NULL || drv.GetErrorName(r, &s) != CUDA_SUCCESS || s == NULL)
        return "CUDA_ERROR_?";
    return s;
}

static wsync_status_t rt_err(cudaError_t e, const char *call, const char *what)
{
    (void)cudaGetLastError();
    return wsync_err(WSYNC_ERR_DEVICE, "cuda_ipc: %s (%s): %s: %s", call, what, cudaGetErrorName(e),
                     cudaGetErrorString(e));
}

static wsync_status_t dev_enter(int device, int *saved)
{
    cudaError_t e;

    *saved = -1;
    if (cudaGetDevice(saved) != cudaSuccess) {
        (void)cudaGetLastError();
        *saved = -1;
    }
    if (*saved == device)
        return WSYNC_OK;
    e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        char what[32];
        snprintf(what, sizeof(what), "device %d", device);
        return rt_err(e, "cudaSetDevice", what);
    }
    return WSYNC_OK;
}

static void dev_leave(int device, int saved)
{
    if (saved >= 0 && saved != device && cudaSetDevice(saved) != cudaSuccess)
        (void)cudaGetLastError();
}

/* ---- exporter -------------------------------------------------------------------------------- */

typedef struct {
    uintptr_t base;
    size_t bytes;
    int kind;
    cudaIpcMemHandle_t handle;         /* legacy */
    uint32_t piece0, npieces;          /* vmm: pieces[piece0 .. piece0 + npieces) */
} xregion_t;

typedef struct {
    uintptr_t base;
    size_t bytes;
    int fd;
} xpiece_t;

struct wsync_cuda_exporter {
    int device;
    uint8_t uuid[WSYNC_DEV_UUID_BYTES];
    xregion_t *legacy;                 /* allocations, unique by base */
    uint32_t nlegacy, legacy_cap;
    xpiece_t *pieces;                  /* cuMemCreate pieces, unique by base */
    uint32_t npieces, pieces_cap;
    xregion_t *regions;                /* after finish: legacy ones, then vmm runs */
    uint32_t nregions;
    int *fds;                          /* [npieces] after finish, in region order */
    int finished;
};

wsync_status_t wsync_cuda_exporter_create(int device, wsync_cuda_exporter_t **out)
{
    wsync_cuda_exporter_t *ex;
    wsync_status_t st;

    if (out == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_cuda_exporter_create: NULL argument");
    if ((st = drv_ready()) != WSYNC_OK)
        return st;
    ex = calloc(1, sizeof(*ex));
    if (ex == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "cuda_ipc: no memory for an exporter");
    ex->device = device;
    if ((st = wsync_dev_uuid(device, ex->uuid)) != WSYNC_OK) {
        free(ex);
        return st;
    }
    *out = ex;
    return WSYNC_OK;
}

void wsync_cuda_export_close_fds(wsync_cuda_exporter_t *ex)
{
    if (ex == NULL || ex->fds == NULL)
        return;
    for (uint32_t i = 0; i < ex->npieces; i++)
        if (ex->fds[i] >= 0) {
            close(ex->fds[i]);
            ex->fds[i] = -1;
        }
}

void wsync_cuda_exporter_free(wsync_cuda_exporter_t *ex)
{
    if (ex == NULL)
        return;
    wsync_cuda_export_close_fds(ex);
    free(ex->fds);
    free(ex->legacy);
    free(ex->pieces);
    free(ex->regions);
    free(ex);
}

/* How to allocate memory wsync can share, for the refusals. */
#define HOW_TO_ALLOCATE                                                                          \
    "allocate shards with cudaMalloc (PyTorch's default caching allocator), or with cuMemCreate "  \
    "and requestedHandleTypes including CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (PyTorch's "      \
    "expandable segments)"

/* A cudaMalloc allocation whose size is not a multiple of 2 MiB (the GPU's large page) is read
 * slower by the processes that open it: 165 us a 256 MiB batch of copies against 133 us once
 * the same allocation was rounded up to 2 MiB, on one H200 (docs/benchmarks.md, "The cause: an
 * allocation whose size is no multiple of 2 MiB"). Its owner is the one who can fix it, so say
 * so, once a process. */
static void warn_odd_size(uintptr_t base, size_t size, const char *what)
{
    static atomic_int told;
    const size_t big_page = (size_t)2 << 20;
    if (size <= big_page || size % big_page == 0 || atomic_exchange(&told, 1) != 0)
        return;
    WSYNC_LOG_W("cuda_ipc: %s lies in a cudaMalloc allocation (%#lx) of %zu bytes, not a multiple "
                "of 2 MiB: processes that open it read it up to a quarter slower; allocate in "
                "multiples of 2 MiB (PyTorch's caching allocator does) (said once)", what,
                (unsigned long)base, size);
}

/* Is the cuMemCreate allocation mapped at `base` exportable as a POSIX fd? */
static wsync_status_t vmm_piece_check(uintptr_t base, const char *what)
{
    CUmemGenericAllocationHandle h;
    CUmemAllocationProp prop;
    CUresult r = drv.MemRetainAllocationHandle(&h, (void *)base);

    if (r != CUDA_SUCCESS)
        return wsync_err(WSYNC_ERR_UNSUPPORTED, "cuda_ipc: %s: the cuMemCreate memory at %#lx "
                         "cannot be retained (cuMemRetainAllocationHandle: %s)", what,
                         (unsigned long)base, cu_name(r));
    memset(&prop, 0, sizeof(prop));
    r = drv.MemGetAllocationPropertiesFromHandle(&prop, h);
    drv.MemRelease(h);
    if (r != CUDA_SUCCESS)
        return wsync_err(WSYNC_ERR_DEVICE, "cuda_ipc: %s: cuMemGetAllocationPropertiesFromHandle: "
                         "%s", what, cu_name(r));
    if (!(prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return wsync_err(WSYNC_ERR_UNSUPPORTED, "cuda_ipc: %s: its cuMemCreate allocation at %#lx "
                         "was made without the POSIX file-descriptor handle type (handle types "
                         "%#x), so no other process can map it; " HOW_TO_ALLOCATE, what,
                         (unsigned long)base, (unsigned)prop.requestedHandleTypes);
    return WSYNC_OK;
}

static int add_piece(wsync_cuda_exporter_t *ex, uintptr_t base, size_t bytes)
{
    for (uint32_t i = 0; i < ex->npieces; i++)
        if (ex->pieces[i].base == base)
            return 0;
    if (ex->npieces == ex->pieces_cap) {
        uint32_t cap = ex->pieces_cap ? ex->pieces_cap * 2 : 64;
        xpiece_t *p = realloc(ex->pieces, cap * sizeof(*p));
        if (p == NULL)
            return -1;
        ex->pieces = p;
        ex->pieces_cap = cap;
    }
    ex->pieces[ex->npieces++] = (xpiece_t){base, bytes, -1};
    return 0;
}

wsync_status_t wsync_cuda_export_add(wsync_cuda_exporter_t *ex, const void *ptr, size_t bytes,
                                     const char *what)
{
    uintptr_t p = (uintptr_t)ptr, end = p + bytes;
    CUdeviceptr b = 0;
    size_t s = 0;
    CUresult r;
    wsync_dev_ptr_t info;
    wsync_status_t st;
    int saved;

    if (ex == NULL || ptr == NULL || bytes == 0 || ex->finished)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_cuda_export_add: bad arguments (%s)", what);
    if ((st = wsync_dev_ptr_info(ptr, &info)) != WSYNC_OK)
        return st;
    if (info.kind == WSYNC_DEV_PTR_MANAGED)
        return wsync_err(WSYNC_ERR_UNSUPPORTED, "cuda_ipc: %s is in managed (unified) memory, which "
                         "CUDA cannot share between processes; " HOW_TO_ALLOCATE, what);
    if (info.kind != WSYNC_DEV_PTR_DEVICE)
        return wsync_err(WSYNC_ERR_UNSUPPORTED, "cuda_ipc: %s at %p is host memory, not CUDA device "
                         "memory", what, ptr);
    if ((st = dev_enter(info.device, &saved)) != WSYNC_OK)
        return st;
    {
        CUmemoryPool pool = NULL;
        r = drv.PointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, (CUdeviceptr)p);
        if (r == CUDA_SUCCESS && pool != NULL) {
            st = wsync_err(WSYNC_ERR_UNSUPPORTED, "cuda_ipc: %s at %p comes from a stream-ordered "
                           "memory pool (cudaMallocAsync), whose allocations wsync does not export; "
                           HOW_TO_ALLOCATE, what, ptr);
            goto out;
        }
    }
    r = drv.MemGetAddressRange(&b, &s, (CUdeviceptr)p);
    if (r != CUDA_SUCCESS) {
        st = wsync_err(WSYNC_ERR_DEVICE, "cuda_ipc: %s: cuMemGetAddressRange(%p): %s", what, ptr,
                       cu_name(r));
        goto out;
    }
    {
        CUmemGenericAllocationHandle h;
        r = drv.MemRetainAllocationHandle(&h, (void *)(uintptr_t)b);
        if (r == CUDA_SUCCESS)
            drv.MemRelease(h);
    }
    if (r == CUDA_SUCCESS) {
        /* cuMemCreate: walk the pieces mapped back to back over [p, end) */
        uint32_t first = ex->npieces;
        uintptr_t at = (uintptr_t)b;
        for (;;) {
            if ((st = vmm_piece_check(at, what)) != WSYNC_OK)
                break;
            if (add_piece(ex, at, s) != 0) {
                st = wsync_err(WSYNC_ERR_NOMEM, "cuda_ipc: no memory");
                break;
            }
            at += s;
            if (at >= end)
                break;
            r = drv.MemGetAddressRange(&b, &s, (CUdeviceptr)at);
            if (r != CUDA_SUCCESS || (uintptr_t)b != at) {
                st = wsync_err(WSYNC_ERR_UNSUPPORTED, "cuda_ipc: %s (%p, %zu bytes) is not mapped "
                               "contiguously: nothing mapped at %#lx (%s)", what, ptr, bytes,
                               (unsigned long)at, r != CUDA_SUCCESS ? cu_name(r) : "another range");
                break;
            }
        }
        if (st != WSYNC_OK)
            ex->npieces = first;   /* pieces are only appended: drop this range's */
        goto out;
    }
    /* cudaMalloc: one IPC handle for the allocation */
    if (end > (uintptr_t)b + s) {
        st = wsync_err(WSYNC_ERR_UNSUPPORTED, "cuda_ipc: %s (%p, %zu bytes) runs past the end of "
                       "its allocation (%#lx, %zu bytes)", what, ptr, bytes, (unsigned long)b, s);
        goto out;
    }
    for (uint32_t i = 0; i < ex->nlegacy; i++)
        if (ex->legacy[i].base == (uintptr_t)b)
            goto out;   /* cached */
    {
        cudaIpcMemHandle_t h;
        cudaError_t e = cudaIpcGetMemHandle(&h, (void *)(uintptr_t)b);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            st = wsync_err(WSYNC_ERR_UNSUPPORTED, "cuda_ipc: %s at %p cannot be shared: "
                           "cudaIpcGetMemHandle: %s (%s); " HOW_TO_ALLOCATE, what, ptr,
                           cudaGetErrorName(e), cudaGetErrorString(e));
            goto out;
        }
        if (ex->nlegacy == ex->legacy_cap) {
            uint32_t cap = ex->legacy_cap ? ex->legacy_cap * 2 : 16;
            xregion_t *n = realloc(ex->legacy, cap * sizeof(*n));
            if (n == NULL) {
                st = wsync_err(WSYNC_ERR_NOMEM, "cuda_ipc: no memory");
                goto out;
            }
            ex->legacy = n;
            ex->legacy_cap = cap;
        }
        ex->legacy[ex->nlegacy++] = (xregion_t){(uintptr_t)b, s, REG_LEGACY, h, 0, 0};
        warn_odd_size((uintptr_t)b, s, what);
    }
out:
    dev_leave(info.device, saved);
    return st;
}

static int piece_cmp(const void *a, const void *b)
{
    uintptr_t x = ((const xpiece_t *)a)->base, y = ((const xpiece_t *)b)->base;
    return x < y ? -1 : x > y;
}

wsync_status_t wsync_cuda_export_finish(wsync_cuda_exporter_t *ex)
{
    wsync_status_t st = WSYNC_OK;
    uint32_t nvmm = 0;
    int saved;

    if (ex == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_cuda_export_finish: NULL argument");
    if (ex->finished)
        return WSYNC_OK;
    qsort(ex->pieces, ex->npieces, sizeof(*ex->pieces), piece_cmp);
    for (uint32_t i = 0; i < ex->npieces; i++)
        nvmm += i == 0 || ex->pieces[i - 1].base + ex->pieces[i - 1].bytes != ex->pieces[i].base;
    ex->regions = calloc((size_t)ex->nlegacy + nvmm + 1, sizeof(*ex->regions));
    ex->fds = calloc((size_t)ex->npieces + 1, sizeof(int));
    if (ex->regions == NULL || ex->fds == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "cuda_ipc: no memory");
    for (uint32_t i = 0; i < ex->npieces; i++)
        ex->fds[i] = -1;
    memcpy(ex->regions, ex->legacy, ex->nlegacy * sizeof(*ex->regions));
    ex->nregions = ex->nlegacy;
    if (ex->npieces > 0)
        wsync_cuda_ipc_fd_room(ex->npieces);
    if ((st = dev_enter(ex->device, &saved)) != WSYNC_OK)
        return st;
    for (uint32_t i = 0; i < ex->npieces && st == WSYNC_OK; i++) {
        xpiece_t *pc = &ex->pieces[i];
        CUmemGenericAllocationHandle h;
        CUresult r;
        int fd = -1;
        if (i == 0 || ex->pieces[i - 1].base + ex->pieces[i - 1].bytes != pc->base)
            ex->regions[ex->nregions++] = (xregion_t){pc->base, 0, REG_VMM, {{0}}, i, 0};
        xregion_t *g = &ex->regions[ex->nregions - 1];
        g->bytes += pc->bytes;
        g->npieces++;
        r = drv.MemRetainAllocationHandle(&h, (void *)pc->base);
        if (r != CUDA_SUCCESS) {
            st = wsync_err(WSYNC_ERR_DEVICE, "cuda_ipc: cuMemRetainAllocationHandle(%#lx): %s",
                           (unsigned long)pc->base, cu_name(r));
            break;
        }
        r = drv.MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        drv.MemRelease(h);
        if (r != CUDA_SUCCESS)
            st = wsync_err(WSYNC_ERR_DEVICE, "cuda_ipc: cuMemExportToShareableHandle(%#lx, %zu "
                           "bytes, POSIX fd): %s", (unsigned long)pc->base, pc->bytes, cu_name(r));
        pc->fd = fd;
        ex->fds[i] = fd;
    }
    dev_leave(ex->device, saved);
    if (st == WSYNC_OK) {
        ex->finished = 1;
        WSYNC_LOG_D("cuda_ipc: device %d: %u cudaMalloc allocations and %u cuMemCreate pieces "
                    "(in %u ranges) exported", ex->device, ex->nlegacy, ex->npieces,
                    ex->nregions - ex->nlegacy);
    }
    return st;
}

int wsync_cuda_export_find(const wsync_cuda_exporter_t *ex, const void *ptr, size_t bytes,
                           uint32_t *region, uint64_t *offset)
{
    uintptr_t p = (uintptr_t)ptr;

    if (ex == NULL || !ex->finished)
        return 0;
    for (uint32_t i = 0; i < ex->nregions; i++) {
        const xregion_t *g = &ex->regions[i];
        if (p >= g->base && p - g->base <= g->bytes && bytes <= g->bytes - (p - g->base)) {
            *region = i;
            *offset = p - g->base;
            return 1;
        }
    }
    return 0;
}

uint32_t wsync_cuda_export_count(const wsync_cuda_exporter_t *ex)
{
    return ex != NULL && ex->finished ? ex->nregions : 0;
}

/* Description: u32 pid, u32 nregions, then per region u32 kind, u64 base, u64 bytes, 16 bytes of
 * device UUID, and a 64-byte IPC handle (legacy) or u32 npieces and u64 bytes of each (vmm). */
void wsync_cuda_export_encode(const wsync_cuda_exporter_t *ex, wsync_wbuf_t *out, const int **fds,
                              uint32_t *nfds)
{
    wsync_put_u32(out, (uint32_t)getpid());
    wsync_put_u32(out, ex->nregions);
    for (uint32_t i = 0; i < ex->nregions; i++) {
        const xregion_t *g = &ex->regions[i];
        wsync_put_u32(out, (uint32_t)g->kind);
        wsync_put_u64(out, g->base);
        wsync_put_u64(out, g->bytes);
        wsync_put_bytes(out, ex->uuid, WSYNC_DEV_UUID_BYTES);
        if (g->kind == REG_LEGACY) {
            wsync_put_bytes(out, &g->handle, sizeof(g->handle));
        } else {
            wsync_put_u32(out, g->npieces);
            for (uint32_t k = 0; k < g->npieces; k++)
                wsync_put_u64(out, ex->pieces[g->piece0 + k].bytes);
        }
    }
    *fds = ex->fds;
    *nfds = ex->npieces;
}

/* ---- importer -------------------------------------------------------------------------------- */

typedef struct {
    int kind;
    void *base;                        /* in this process */
    uint64_t bytes;
    uint64_t reserved;                 /* vmm: the reservation's size */
    CUmemGenericAllocationHandle *handles;
    uint32_t nhandles, nmapped;
    int local;                         /* the exporter is this process: base is its own pointer */
} iregion_t;

struct wsync_cuda_import {
    int device;
    int on_device;                     /* every region lives on the importing GPU (its UUID) */
    uint32_t nregions;
    iregion_t *regions;
};

uint32_t wsync_cuda_import_nfds(const wsync_rbuf_t *in)
{
    wsync_rbuf_t r = *in;
    uint32_t nfds = 0;

    (void)wsync_get_u32(&r);
    uint32_t n = wsync_get_count(&r, 36);
    if (r.err || n > MAX_REGIONS)
        return UINT32_MAX;
    for (uint32_t i = 0; i < n && !r.err; i++) {
        uint32_t kind = wsync_get_u32(&r);
        (void)wsync_get_u64(&r);
        (void)wsync_get_u64(&r);
        (void)wsync_get_bytes(&r, WSYNC_DEV_UUID_BYTES);
        if (kind == REG_LEGACY) {
            (void)wsync_get_bytes(&r, sizeof(cudaIpcMemHandle_t));
        } else if (kind == REG_VMM) {
            uint32_t np = wsync_get_count(&r, 8);
            for (uint32_t k = 0; k < np; k++)
                (void)wsync_get_u64(&r);
            if (r.err || np == 0 || np > MAX_PIECES - nfds)
                return UINT32_MAX;
            nfds += np;
        } else {
            return UINT32_MAX;
        }
    }
    /* 0 is a valid answer: cudaMalloc allocations travel as IPC handles, without descriptors */
    return r.err ? UINT32_MAX : nfds;
}

static void iregion_release(iregion_t *g)
{
    if (g->local)
        return;
    if (g->kind == REG_LEGACY && g->base != NULL) {
        cudaError_t e = cudaIpcCloseMemHandle(g->base);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            WSYNC_LOG_W("cuda_ipc: cudaIpcCloseMemHandle(%p): %s", g->base, cudaGetErrorString(e));
        }
    }
    if (g->kind == REG_VMM) {
        CUresult r;
        if (g->base != NULL && g->nmapped > 0 &&
            (r = drv.MemUnmap((CUdeviceptr)(uintptr_t)g->base, g->reserved)) != CUDA_SUCCESS)
            WSYNC_LOG_W("cuda_ipc: cuMemUnmap(%p): %s", g->base, cu_name(r));
        for (uint32_t k = 0; k < g->nhandles; k++)
            drv.MemRelease(g->handles[k]);
        if (g->base != NULL &&
            (r = drv.MemAddressFree((CUdeviceptr)(uintptr_t)g->base, g->reserved)) != CUDA_SUCCESS)
            WSYNC_LOG_W("cuda_ipc: cuMemAddressFree(%p): %s", g->base, cu_name(r));
    }
    free(g->handles);
    g->handles = NULL;
    g->base = NULL;
}

void wsync_cuda_import_free(wsync_cuda_import_t *im)
{
    int saved;

    if (im == NULL)
        return;
    int entered = dev_enter(im->device, &saved) == WSYNC_OK;
    for (uint32_t i = 0; i < im->nregions; i++)
        iregion_release(&im->regions[i]);
    if (entered)
        dev_leave(im->device, saved);
    free(im->regions);
    free(im);
}

/* Import the pieces of one vmm region (their fds taken) and map them contiguously. */
static wsync_status_t import_vmm(iregion_t *g, const uint64_t *piece_bytes, int *fds,
                                 uint32_t npieces, int device, const char *who, uint32_t idx)
{
    CUresult r;
    CUmemAllocationProp prop;
    size_t gran = 0;
    CUdeviceptr va = 0;
    CUdevice dev;
    uint64_t off = 0;

    g->handles = calloc(npieces + 1, sizeof(*g->handles));
    if (g->handles == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "cuda_ipc: no memory");
    for (uint32_t k = 0; k < npieces; k++) {
        r = drv.MemImportFromShareableHandle(&g->handles[k], (void *)(uintptr_t)fds[k],
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        close(fds[k]);
        fds[k] = -1;
        if (r != CUDA_SUCCESS)
            return wsync_err(WSYNC_ERR_DEVICE, "cuda_ipc: cuMemImportFromShareableHandle (region %u "
                             "of %s, piece %u of %u): %s", idx, who, k, npieces, cu_name(r));
        g->nhandles++;
    }
    memset(&prop, 0, sizeof(prop));
    r = drv.MemGetAllocationPropertiesFromHandle(&prop, g->handles[0]);
    if (r == CUDA_SUCCESS)
        r = drv.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS || gran == 0)
        return wsync_err(WSYNC_ERR_DEVICE, "cuda_ipc: allocation granularity of region %u of %s: %s",
                         idx, who, cu_name(r));
    g->reserved = (g->bytes + gran - 1) / gran * gran;
    r = drv.MemAddressReserve(&va, g->reserved, gran, 0, 0);
    if (r != CUDA_SUCCESS)
        return wsync_err(WSYNC_ERR_DEVICE, "cuda_ipc: cuMemAddressReserve(%llu bytes) for region %u "
                         "of %s: %s", (unsigned long long)g->reserved, idx, who, cu_name(r));
    g->base = (void *)(uintptr_t)va;
    for (uint32_t k = 0; k < npieces; k++) {
        r = drv.MemMap(va + off, piece_bytes[k], 0, g->handles[k], 0);
        if (r != CUDA_SUCCESS)
            return wsync_err(WSYNC_ERR_DEVICE, "cuda_ipc: cuMemMap (region %u of %s, piece %u, %llu "
                             "bytes at offset %llu): %s", idx, who, k,
                             (unsigned long long)piece_bytes[k], (unsigned long long)off, cu_name(r));
        g->nmapped++;
        off += piece_bytes[k];
    }
    r = drv.DeviceGet(&dev, device);
    if (r == CUDA_SUCCESS) {
        CUmemAccessDesc acc;
        memset(&acc, 0, sizeof(acc));
        acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        acc.location.id = dev;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        r = drv.MemSetAccess(va, g->bytes, &acc, 1);
    }
    if (r != CUDA_SUCCESS)
        return wsync_err(WSYNC_ERR_DEVICE, "cuda_ipc: cuMemSetAccess for device %d on region %u of "
                         "%s (%llu bytes; the memory lives on another GPU: is peer access possible?)"
                         ": %s", device, idx, who, (unsigned long long)g->bytes, cu_name(r));
    return WSYNC_OK;
}

wsync_status_t wsync_cuda_import_open(wsync_rbuf_t *in, int *fds, uint32_t nfds, int device,
                                      const char *who, wsync_cuda_import_t **out)
{
    wsync_cuda_import_t *im = NULL;
    wsync_status_t st = drv_ready();
    uint64_t *pbytes = NULL;
    uint32_t used = 0, pid, n, need;
    int saved = -1, entered = 0;

    if (st != WSYNC_OK)
        goto fail;
    need = wsync_cuda_import_nfds(in);
    if (need == UINT32_MAX) {
        st = wsync_err(WSYNC_ERR_PROTOCOL, "cuda_ipc: malformed memory description from %s (region "
                       "table truncated, too many regions or pieces, or an unknown region kind)",
                       who);
        goto fail;
    }
    if (need != nfds) {
        st = wsync_err(WSYNC_ERR_PROTOCOL, "cuda_ipc: %s sent %u descriptors for memory that needs "
                       "%u", who, nfds, need);
        goto fail;
    }
    pid = wsync_get_u32(in);
    n = wsync_get_count(in, 36);
    if (in->err || n > MAX_REGIONS) {
        st = wsync_err(WSYNC_ERR_PROTOCOL, "cuda_ipc: malformed memory description from %s", who);
        goto fail;
    }
    im = calloc(1, sizeof(*im));
    if (im == NULL || (im->regions = calloc(n + 1, sizeof(*im->regions))) == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "cuda_ipc: no memory");
        goto fail;
    }
    im->device = device;
    if ((st = dev_enter(device, &saved)) != WSYNC_OK)
        goto fail;
    entered = 1;
    /* where the exporter's memory lives, by UUID: a pointer opened here reports the importing
     * GPU to cudaPointerGetAttributes whichever GPU holds it, so this is the only way to know */
    uint8_t here[WSYNC_DEV_UUID_BYTES];
    if ((st = wsync_dev_uuid(device, here)) != WSYNC_OK)
        goto fail;
    im->on_device = n > 0;
    for (uint32_t i = 0; i < n; i++) {
        iregion_t *g = &im->regions[i];
        uint32_t kind = wsync_get_u32(in);
        uint64_t base = wsync_get_u64(in), bytes = wsync_get_u64(in);
        const void *uuid = wsync_get_bytes(in, WSYNC_DEV_UUID_BYTES);
        if (uuid == NULL || memcmp(uuid, here, WSYNC_DEV_UUID_BYTES) != 0)
            im->on_device = 0;
        g->kind = (int)kind;
        g->bytes = bytes;
        g->local = pid == (uint32_t)getpid();
        im->nregions++;
        if (kind == REG_LEGACY) {
            cudaIpcMemHandle_t h;
            const void *hb = wsync_get_bytes(in, sizeof(h));
            if (in->err || hb == NULL || bytes == 0)
                break;
            memcpy(&h, hb, sizeof(h));
            if (g->local) {
                g->base = (void *)(uintptr_t)base;
                continue;
            }
            cudaError_t e = cudaIpcOpenMemHandle(&g->base, h, cudaIpcMemLazyEnablePeerAccess);
            if (e != cudaSuccess) {
                char what[160];
                g->base = NULL;
                snprintf(what, sizeof(what), "region %u of %s, %llu bytes, on device %d", i, who,
                         (unsigned long long)bytes, device);
                st = rt_err(e, "cudaIpcOpenMemHandle", what);
                goto fail;
            }
        } else if (kind == REG_VMM) {
            uint32_t np = wsync_get_count(in, 8);
            uint64_t sum = 0;
            free(pbytes);
            pbytes = calloc(np + 1, sizeof(*pbytes));
            if (pbytes == NULL) {
                st = wsync_err(WSYNC_ERR_NOMEM, "cuda_ipc: no memory");
                goto fail;
            }
            for (uint32_t k = 0; k < np; k++) {
                pbytes[k] = wsync_get_u64(in);
                sum += pbytes[k];
            }
            if (in->err || np == 0 || sum != bytes || used + np > nfds)
                break;
            if (g->local) {
                for (uint32_t k = 0; k < np; k++) {
                    close(fds[used + k]);
                    fds[used + k] = -1;
                }
                g->base = (void *)(uintptr_t)base;
            } else if ((st = import_vmm(g, pbytes, fds + used, np, device, who, i)) != WSYNC_OK) {
                goto fail;
            }
            used += np;
        } else {
            in->err = 1;
            break;
        }
    }
    if (in->err || used != nfds) {
        st = wsync_err(WSYNC_ERR_PROTOCOL, "cuda_ipc: malformed memory description from %s", who);
        goto fail;
    }
    dev_leave(device, saved);
    free(pbytes);
    WSYNC_LOG_D("cuda_ipc: opened %u regions of %s on device %d (%u descriptors)", n, who, device,
                nfds);
    *out = im;
    return WSYNC_OK;
fail:
    for (uint32_t k = 0; k < nfds; k++)
        if (fds[k] >= 0) {
            close(fds[k]);
            fds[k] = -1;
        }
    if (im != NULL) {
        for (uint32_t i = 0; i < im->nregions; i++)
            iregion_release(&im->regions[i]);
        free(im->regions);
        free(im);
    }
    if (entered)
        dev_leave(device, saved);
    free(pbytes);
    return st;
}

uint32_t wsync_cuda_import_count(const wsync_cuda_import_t *im)
{
    return im != NULL ? im->nregions : 0;
}

int wsync_cuda_import_on_device(const wsync_cuda_import_t *im)
{
    return im != NULL && im->on_device;
}

void *wsync_cuda_import_base(const wsync_cuda_import_t *im, uint32_t i, uint64_t *bytes)
{
    if (im == NULL || i >= im->nregions)
        return NULL;
    if (bytes != NULL)
        *bytes = im->regions[i].bytes;
    return im->regions[i].base;
}

/* ---- the transport's probe ------------------------------------------------------------------ */

static int cuda_ipc_probe(char *reason, size_t reason_len)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count <= 0) {
        /* No driver, no device, or a device the driver refuses: all read the same to a user. */
        (void)cudaGetLastError();
        snprintf(reason, reason_len, "no CUDA device: %s",
                 err != cudaSuccess ? cudaGetErrorString(err) : "the driver reports 0 devices");
        return 0;
    }
    struct cudaDeviceProp prop;
    err = cudaGetDeviceProperties(&prop, 0);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(reason, reason_len, "%d device%s, but device 0 cannot be queried: %s", count,
                 count == 1 ? "" : "s", cudaGetErrorString(err));
        return 0;
    }
    pthread_once(&drv_once, drv_load);
    if (drv_error[0] != '\0') {
        snprintf(reason, reason_len, "%d device%s, but the driver API is missing: %s", count,
                 count == 1 ? "" : "s", drv_error);
        return 0;
    }
    snprintf(reason, reason_len, "%d device%s: %s; cudaMalloc (IPC handles) and cuMemCreate "
             "(POSIX fds) memory", count, count == 1 ? "" : "s", prop.name);
    return 1;
}

#define CUDA_IPC_COMPILED 1
#define CUDA_IPC_CAPS (WSYNC_CAP_CUDA_MEM | WSYNC_CAP_SAME_NODE | WSYNC_CAP_MAP)

#else /* !WSYNC_HAVE_CUDA */

#define NO_CUDA(fn) wsync_err(WSYNC_ERR_UNSUPPORTED, "%s: built without CUDA", fn)

wsync_status_t wsync_cuda_exporter_create(int device, wsync_cuda_exporter_t **ex)
{
    (void)device;
    (void)ex;
    return NO_CUDA("wsync_cuda_exporter_create");
}

void wsync_cuda_exporter_free(wsync_cuda_exporter_t *ex) { (void)ex; }

wsync_status_t wsync_cuda_export_add(wsync_cuda_exporter_t *ex, const void *ptr, size_t bytes,
                                     const char *what)
{
    (void)ex;
    (void)ptr;
    (void)bytes;
    (void)what;
    return NO_CUDA("wsync_cuda_export_add");
}

wsync_status_t wsync_cuda_export_finish(wsync_cuda_exporter_t *ex)
{
    (void)ex;
    return NO_CUDA("wsync_cuda_export_finish");
}

int wsync_cuda_export_find(const wsync_cuda_exporter_t *ex, const void *ptr, size_t bytes,
                           uint32_t *region, uint64_t *offset)
{
    (void)ex;
    (void)ptr;
    (void)bytes;
    (void)region;
    (void)offset;
    return 0;
}

uint32_t wsync_cuda_export_count(const wsync_cuda_exporter_t *ex)
{
    (void)ex;
    return 0;
}

void wsync_cuda_export_encode(const wsync_cuda_exporter_t *ex, wsync_wbuf_t *out, const int **fds,
                              uint32_t *nfds)
{
    (void)ex;
    wsync_put_u32(out, (uint32_t)getpid());
    wsync_put_u32(out, 0);
    *fds = NULL;
    *nfds = 0;
}

void wsync_cuda_export_close_fds(wsync_cuda_exporter_t *ex) { (void)ex; }

uint32_t wsync_cuda_import_nfds(const wsync_rbuf_t *in)
{
    (void)in;
    return 0;
}

wsync_status_t wsync_cuda_import_open(wsync_rbuf_t *in, int *fds, uint32_t nfds, int device,
                                      const char *who, wsync_cuda_import_t **im)
{
    (void)in;
    (void)device;
    (void)im;
    for (uint32_t k = 0; k < nfds; k++)
        if (fds[k] >= 0) {
            close(fds[k]);
            fds[k] = -1;
        }
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "cuda_ipc: %s shares CUDA memory, but this library was "
                     "built without CUDA", who);
}

uint32_t wsync_cuda_import_count(const wsync_cuda_import_t *im)
{
    (void)im;
    return 0;
}

void *wsync_cuda_import_base(const wsync_cuda_import_t *im, uint32_t i, uint64_t *bytes)
{
    (void)im;
    (void)i;
    (void)bytes;
    return NULL;
}

int wsync_cuda_import_on_device(const wsync_cuda_import_t *im)
{
    (void)im;
    return 0;
}

void wsync_cuda_import_free(wsync_cuda_import_t *im) { (void)im; }

static int cuda_ipc_probe(char *reason, size_t reason_len)
{
    snprintf(reason, reason_len,
             "not compiled in: configure with -DWSYNC_WITH_CUDA=ON (needs the CUDA toolkit: "
             "nvcc and cudart)");
    return 0;
}

#define CUDA_IPC_COMPILED 0
#define CUDA_IPC_CAPS 0u
#endif

const wsync_transport_ops_t wsync_transport_cuda_ipc = {
    .name = "cuda_ipc",
    .compiled = CUDA_IPC_COMPILED,
    .caps = CUDA_IPC_CAPS,
    .est_gbps = CUDA_IPC_COMPILED ? 300.0 : 0.0,
    .probe = cuda_ipc_probe,
};
