/* Internal: one-sided RMA transports (ucx.c, ofi.c) for the `store` scheme.
 *
 * Model: each process opens one context (a UCX worker / a libfabric endpoint). An owner registers
 * memory and publishes (its context address, the region's address and length, its packed remote
 * key) through the control plane; a reader connects to the owner's context once, imports the
 * packed key once per peer, then posts many gets that complete in any order and waits for all of
 * them with a deadline. Every failure names the peer and the operation and never crashes: a get
 * outside a registration, a key that does not match, a peer that vanished, all come back as
 * errors from wsync_rma_ops_t.flush (or from get itself when detected at once).
 *
 * Over software RMA (UCX's and libfabric's tcp providers) a reader's get completes only while the
 * owner's side progresses, so from its first registration until its last, a context serves
 * peers on a thread of its own: an owner need not call anything for reads to complete.
 *
 * Blobs (addresses, packed keys) are opaque bytes of at most WSYNC_RMA_BLOB_MAX, sent as they
 * are on the wire by the scheme. Thread-safety: one user thread at a time per context (the
 * context's own serving thread is the transport's business). */
#ifndef WSYNC_TRANSPORTS_RMA_H
#define WSYNC_TRANSPORTS_RMA_H

#include <stddef.h>
#include <stdint.h>

#include "wsync/wsync.h"

#define WSYNC_RMA_BLOB_MAX 4096

/* Memory kinds a context can register for peers to read, beyond host memory (mem_caps bits). */
#define WSYNC_RMA_MEM_CUDA 1u

typedef struct wsync_rma wsync_rma_t;            /* per-process context */
typedef struct wsync_rma_mr wsync_rma_mr_t;      /* a registered region (owner side) */
typedef struct wsync_rma_peer wsync_rma_peer_t;  /* a connection to another context */
typedef struct wsync_rma_rkey wsync_rma_rkey_t;  /* a remote key imported for one peer */

typedef struct {
    const char *name;                            /* "ucx" or "ofi" */
    /* Open a context. `hint` may name a provider/transport preference (NULL: automatic);
     * writes what was chosen (e.g. "ucx 1.13.1 over tcp,sysv" / "libfabric tcp;ofi_rxm") into
     * info. WSYNC_ERR_UNSUPPORTED if the transport is not compiled in or cannot start. */
    wsync_status_t (*open)(const char *hint, char *info, size_t info_len, wsync_rma_t **ctx);
    void (*close)(wsync_rma_t *ctx);
    /* This context's address, for peers to connect to. */
    wsync_status_t (*address)(wsync_rma_t *ctx, void *buf, size_t *len);
    wsync_status_t (*connect)(wsync_rma_t *ctx, const void *addr, size_t len,
                              wsync_rma_peer_t **peer);
    void (*disconnect)(wsync_rma_peer_t *peer);
    /* Register [base, base + len) for remote reads (and writes); the packed key goes to rkey
     * (capacity *rkey_len in, used length out). */
    wsync_status_t (*reg)(wsync_rma_t *ctx, void *base, size_t len, wsync_rma_mr_t **mr,
                          void *rkey, size_t *rkey_len);
    void (*dereg)(wsync_rma_mr_t *mr);
    /* WSYNC_RMA_MEM_* bits: which device memory reg_cuda takes in this context (UCX built with
     * CUDA support: memory type CUDA; a libfabric provider with FI_HMEM: FI_HMEM_CUDA). 0: host
     * memory only, and the store stages device memory through pinned host buffers. Gets always
     * land in host memory. */
    unsigned (*mem_caps)(wsync_rma_t *ctx);
    /* reg for CUDA device memory [base, base + len) of CUDA device `device` (same key format;
     * a peer's gets read it as any region). WSYNC_ERR_UNSUPPORTED, saying why, when mem_caps
     * lacks WSYNC_RMA_MEM_CUDA. */
    wsync_status_t (*reg_cuda)(wsync_rma_t *ctx, void *base, size_t len, int device,
                               wsync_rma_mr_t **mr, void *rkey, size_t *rkey_len);
    wsync_status_t (*rkey_import)(wsync_rma_peer_t *peer, const void *rkey, size_t len,
                                  wsync_rma_rkey_t **out);
    void (*rkey_free)(wsync_rma_rkey_t *rkey);
    /* Post a read of len bytes at remote_addr (in the owner's address space, inside a region
     * registered under rkey) into local [dst, dst + len). Non-blocking: many may be in flight;
     * dst must stay valid until flush returns. */
    wsync_status_t (*get)(wsync_rma_peer_t *peer, wsync_rma_rkey_t *rkey, uint64_t remote_addr,
                          void *dst, size_t len);
    /* Post a write (same rules as get). */
    wsync_status_t (*put)(wsync_rma_peer_t *peer, wsync_rma_rkey_t *rkey, uint64_t remote_addr,
                          const void *src, size_t len);
    /* Drive progress until every posted operation completed, or the first failure (returned, with
     * which peer and operation), or deadline_ms (wsync_now_ms clock): WSYNC_ERR_TIMEOUT. After a
     * failure, operations may still be in flight: their buffers must stay valid until close or
     * a later successful flush. */
    wsync_status_t (*flush)(wsync_rma_t *ctx, int64_t deadline_ms);

} wsync_rma_ops_t;

/* NULL when the transport is not compiled in. */
const wsync_rma_ops_t *wsync_rma_ucx(void);
const wsync_rma_ops_t *wsync_rma_ofi(void);

#endif
