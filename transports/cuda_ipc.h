/* Internal: CUDA device memory shared between processes of one node.
 *
 * Two kinds of memory can be shared, each exported once per setup and opened once by each peer:
 *  - cudaMalloc memory ("legacy"): one cudaIpcMemHandle per allocation (base found with
 *    cuMemGetAddressRange), opened with cudaIpcOpenMemHandle(cudaIpcMemLazyEnablePeerAccess);
 *  - cuMemCreate memory ("vmm", e.g. PyTorch's expandable segments): a range may span several
 *    physical allocations mapped back to back; each is exported as a POSIX file descriptor
 *    (cuMemExportToShareableHandle), the descriptors travel over a Unix socket, and the peer
 *    imports them, reserves one address range for the span, maps every piece into it and grants
 *    its device access.
 * Memory that cannot be shared (cudaMallocAsync pools, managed memory, cuMemCreate memory made
 * without the POSIX-fd handle type) is refused by wsync_cuda_export_add with WSYNC_ERR_UNSUPPORTED
 * and a sentence saying why; callers stage it instead.
 *
 * Driver calls go through cudaGetDriverEntryPointByVersion: the library never links libcuda.
 * Without WSYNC_HAVE_CUDA every function returns WSYNC_ERR_UNSUPPORTED. Not thread-safe per
 * object. */
#ifndef WSYNC_TRANSPORTS_CUDA_IPC_H
#define WSYNC_TRANSPORTS_CUDA_IPC_H

#include <stddef.h>
#include <stdint.h>

#include "core/wire.h"
#include "wsync/wsync.h"

/* ---- exporting (the side that owns the memory) ------------------------------------------------ */

typedef struct wsync_cuda_exporter wsync_cuda_exporter_t;

/* An exporter for memory of CUDA device `device` (ordinal in this process). */
wsync_status_t wsync_cuda_exporter_create(int device, wsync_cuda_exporter_t **ex);
/* Unexports (closes descriptors); peers keep what they opened until they free it. NULL: no-op. */
void wsync_cuda_exporter_free(wsync_cuda_exporter_t *ex);

/* Add [ptr, ptr + bytes) of device memory, before wsync_cuda_export_finish. `what` names it in
 * messages ("param 'x'"). WSYNC_ERR_UNSUPPORTED when it cannot be shared (the message says why
 * and how to allocate instead); WSYNC_ERR_DEVICE when a CUDA call failed. Nothing is recorded on
 * error. */
wsync_status_t wsync_cuda_export_add(wsync_cuda_exporter_t *ex, const void *ptr, size_t bytes,
                                     const char *what);

/* Export every range added (one handle per allocation, one descriptor per cuMemCreate piece). */
wsync_status_t wsync_cuda_export_finish(wsync_cuda_exporter_t *ex);

/* After finish: the region holding [ptr, ptr + bytes) and the byte offset of ptr in it; 0 when
 * no region holds it. */
int wsync_cuda_export_find(const wsync_cuda_exporter_t *ex, const void *ptr, size_t bytes,
                           uint32_t *region, uint64_t *offset);
uint32_t wsync_cuda_export_count(const wsync_cuda_exporter_t *ex);

/* After finish: append the regions' description to `out`; *fds / *nfds are the descriptors to pass
 * along with it, in order (owned by the exporter). */
void wsync_cuda_export_encode(const wsync_cuda_exporter_t *ex, wsync_wbuf_t *out,
                              const int **fds, uint32_t *nfds);

/* Close the exported descriptors once every peer has its copies (the regions stay exported:
 * legacy handles need nothing kept, and an imported piece holds its allocation alive). */
void wsync_cuda_export_close_fds(wsync_cuda_exporter_t *ex);

/* ---- importing (a peer) ----------------------------------------------------------------------- */

typedef struct wsync_cuda_import wsync_cuda_import_t;

/* Descriptors a description in `in` needs (read without consuming `in`); UINT32_MAX on a malformed
 * one. 0 is valid: cudaMalloc allocations travel as IPC handles in the description, no descriptor.
 * Built without CUDA: 0 (wsync_cuda_import_open then says so). */
uint32_t wsync_cuda_import_nfds(const wsync_rbuf_t *in);

/* Decode a description from `in` and open every region for device `device` (ordinal in this
 * process; made current during the call and restored after). fds[0..nfds) are the descriptors that
 * came with it; all are taken (closed, set to -1), on failure too. `who` names the exporter for
 * messages. WSYNC_ERR_PROTOCOL for a malformed description, WSYNC_ERR_DEVICE for a CUDA failure
 * (naming the call and the region). */
wsync_status_t wsync_cuda_import_open(wsync_rbuf_t *in, int *fds, uint32_t nfds, int device,
                                      const char *who, wsync_cuda_import_t **im);
uint32_t wsync_cuda_import_count(const wsync_cuda_import_t *im);
/* 1 when every region opened lives on the importing GPU (the exporter's UUID is that GPU's),
 * 0 when some region is on another GPU (its reads are peer reads), or for NULL or no region.
 * cudaPointerGetAttributes cannot tell: it reports an imported pointer on the importing GPU. */
int wsync_cuda_import_on_device(const wsync_cuda_import_t *im);
/* Base address (in this process, on `device`) and size of region i; NULL for a bad index. */
void *wsync_cuda_import_base(const wsync_cuda_import_t *im, uint32_t i, uint64_t *bytes);
/* Unmap and release everything opened. NULL: no-op. */
void wsync_cuda_import_free(wsync_cuda_import_t *im);

/* Raise this process's open-file soft limit so that `more` descriptors fit (best effort). */
void wsync_cuda_ipc_fd_room(uint32_t more);

#endif
