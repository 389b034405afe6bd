/* Internal: the delta codec of core/delta.h on the GPU (issue 17) — batched encode of chunks of
 * CUDA memory against their previous values, batched apply of encoded chunks to CUDA memory with
 * the tree hash of the result, and XXH3_64bits on the device.
 *
 * Same wire form, same bytes: for the same (old, new) the encoder writes exactly what
 * wsync_delta_encode writes, and the apply kernel takes what either encoder wrote; the tree hash
 * equals wsync_delta_hash. tests/gpu/test_delta_kernels.c holds them to it.
 *
 * Work: per codec block (WSYNC_DELTA_BLOCK elements), one warp (full blocks of chunks that are
 * dense with new and old 16-byte aligned) or one CUDA block (the rest; WSYNC_KDELTA_OLD=1: every
 * block, the kernels before the warp encoder, to compare); kernels/delta.cu says how, what each
 * measured and what limits the speed. Encode reads each block of new and old values once: it counts
 * the changes, hashes the new values (leaf), takes the block's payload offset from its chunk's
 * cursor (format 3: payloads in any order, so no block waits for another and no second pass), and
 * writes its table entry and payload. A second, small kernel hashes each chunk's leaves. Apply
 * validates the header, the block's table entry and its payload before touching the destination,
 * writes the changed values in place and hashes the block's values after it.
 *
 * Conventions are those of kernels/kernels.h (device pointers of the current device, streams as
 * void *, WSYNC_ERR_INVALID / WSYNC_ERR_DEVICE with wsync_last_error()). A batch holds device
 * scratch and results: one launch of a batch may be in flight at a time (launches of different
 * batches may run at once, on any streams). Compiled only when WSYNC_HAVE_CUDA.
 */
#ifndef WSYNC_KERNELS_DELTA_H
#define WSYNC_KERNELS_DELTA_H

#include "kernels/kernels.h"
#include "reshard/plan.h"
#include "wsync/wsync.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One chunk to encode: its new values are region `src` of new_base, its previous values the same
 * region of old_base (both device memory, esize-byte elements, row-major order of the region).
 * The encoded chunk goes to out[0, cap) (device, 8-byte aligned). cap below the bytes needed is
 * not an error: the result then reports len > cap and out holds nothing to trust (send it plain);
 * wsync_delta_max_bytes(n, esize) is always enough. */
typedef struct {
    const void *new_base;
    void *old_base;                    /* written only by a batch made with update_old */
    wsync_region_t src;
    uint32_t esize;                    /* 1, 2, 4 or 8 */
    void *out;
    uint64_t cap;
} wsync_kdelta_enc_t;

/* One encoded chunk to apply: enc[0, len) (device memory, or host memory mapped for the device:
 * pass the address kernels use, wsync_dev_host_device_ptr; 8-byte aligned) onto region `dst` of
 * dst_base (device), which holds the previous values. */
typedef struct {
    const void *enc;
    uint64_t len;                      /* the default; a launch may give each chunk's length */
    void *dst_base;
    wsync_region_t dst;
    uint32_t esize;
} wsync_kdelta_app_t;

/* Faults an apply finds in an encoded chunk (low byte of wsync_kdelta_result_t.fault). */
enum {
    WSYNC_KDELTA_FAULT_HEADER = 1,     /* len below header + table, magic, format, esize or n */
    WSYNC_KDELTA_FAULT_TABLE = 2,      /* a block's entry: mode vs (k, e), k above the block,
                                          e outside SPARSE, offset unaligned or a payload
                                          past len; at the last block: the payloads' bytes
                                          not those of the stream's payload area */
    WSYNC_KDELTA_FAULT_PAYLOAD = 3,    /* SPARSE index stream: not k bytes < 0xFF and e bytes
                                          0xFF, a trailing 0xFF, a position past the block;
                                          BITMAP count differs from k, bits past the block, or
                                          its positions' escapes make SPARSE the pick;
                                          non-zero padding */
};
#define WSYNC_KDELTA_NO_FAULT UINT64_MAX

/* One chunk's outcome, valid once the launch has completed on its stream. */
typedef struct {
    uint64_t len;       /* encode: the encoded bytes (> cap: it did not fit); apply: the payload
                           bytes of the blocks applied (wsync_kdelta_results faults the chunk
                           when they do not fill its payload area) */
    uint64_t hash;      /* encode: tree hash of the new values; apply (with hash): tree hash of
                           the region after applying (meaningless when fault is set) */
    uint64_t changed;   /* elements that differ (encode) / that the stream changed (apply: the
                           sum of the valid blocks' k) */
    uint64_t fault;     /* apply: WSYNC_KDELTA_NO_FAULT, or (first faulty block << 8) | fault;
                           encode: WSYNC_KDELTA_NO_FAULT */
} wsync_kdelta_result_t;

typedef struct wsync_kdelta_batch wsync_kdelta_batch_t;

/* An encode batch for n chunks (synchronous: checks, cudaMalloc, upload). update_old: the launch
 * also writes each chunk's changed values into old_base's region, so that it holds the new
 * values afterwards (a sender's baseline for the next version, updated while the values are at
 * hand; whether or not the encoding fitted its cap; the chunks' regions must then not overlap).
 * WSYNC_ERR_INVALID names the first bad chunk
 * (NULL pointer, esize, empty region, cols above the pitch, out not 8-byte aligned, a region
 * not aligned to its elements, n * esize above UINT32_MAX as core/delta.h rules);
 * WSYNC_ERR_DEVICE; WSYNC_ERR_NOMEM. n may be 0. */
wsync_status_t wsync_kdelta_encode_create(const wsync_kdelta_enc_t *chunks, uint32_t n,
                                          int update_old, wsync_kdelta_batch_t **batch);

/* An apply batch for n chunks. hash: compute each region's tree hash after applying (the
 * receiver's check; it reads every block of the region, and stores a BITMAP or PLAIN block whole,
 * its unchanged values rewritten as they were). Without it only blocks with changes are read and
 * only changed values written (a sender bringing its baseline up to the version it encoded). Errors as encode_create (enc not 8-byte aligned; regions of one batch must not
 * overlap). */
wsync_status_t wsync_kdelta_apply_create(const wsync_kdelta_app_t *chunks, uint32_t n, int hash,
                                         wsync_kdelta_batch_t **batch);

/* Enqueue the batch on `stream`: one or two kernels per element size present, then (encode, or
 * apply with the hash) the chunks' hash kernel, which writes an encode's results straight into
 * pinned host memory (wsync_kdelta_results); an apply starts with a kernel that zeroes its
 * counts and ends with the results' copy. Launches of one batch must not overlap (one stream, or
 * the last launch complete). lens (apply batches only; may be NULL: the lengths given at create)
 * gives each chunk's encoded length for this launch; it is read before the call returns.
 * WSYNC_ERR_INVALID for lens with an encode batch; WSYNC_ERR_DEVICE. An apply never writes
 * outside a chunk's region nor reads outside enc[0, len): a chunk whose stream is malformed
 * reports its first faulty block; blocks of it found valid may have been applied (the region
 * then mixes old and new values: send it full). */
wsync_status_t wsync_kdelta_launch(wsync_kdelta_batch_t *batch, const uint64_t *lens,
                                   void *stream);

/* The results of the last launch: n entries of pinned host memory owned by the batch, in the
 * order of the chunks given at create. Call it after the launch's stream has passed it (an
 * event recorded after wsync_kdelta_launch): for an apply it makes the last check there, that
 * the payloads fill each stream's payload area (a fault in the chunk's last block otherwise). */
const wsync_kdelta_result_t *wsync_kdelta_results(wsync_kdelta_batch_t *batch);

/* An apply result as a status: WSYNC_OK, or WSYNC_ERR_INTEGRITY naming `what`, the block and the
 * fault ("chunk 12 from sender 1: block 3: bad block table entry"). */
wsync_status_t wsync_kdelta_fault_status(const wsync_kdelta_result_t *r, const char *what);

/* Chunks, codec blocks, and device bytes held (descriptors, scratch, results); any pointer may be
 * NULL. */
void wsync_kdelta_info(const wsync_kdelta_batch_t *batch, uint32_t *nchunks, uint64_t *nblocks,
                       uint64_t *device_bytes);

/* Free the batch (waits for the device). NULL is a no-op. */
void wsync_kdelta_free(wsync_kdelta_batch_t *batch);

/* The copy of a chunk sent plain: region `src` of src_base to region `dst` of dst_base (same
 * rows and cols, esize-byte elements), as a byte copy for wsync_kernels_batch_create /
 * wsync_kernels_copy (a receiver's plain chunk, or a sender's baseline update for a chunk it sent
 * plain). Fills *out; no device call. WSYNC_ERR_INVALID for NULL pointers, a bad esize, or
 * regions of different shapes. */
wsync_status_t wsync_kdelta_copy_desc(const void *src_base, const wsync_region_t *src,
                                      void *dst_base, const wsync_region_t *dst, uint32_t esize,
                                      wsync_kcopy_t *out);

/* out[i] = XXH3_64bits(data + offs[i], lens[i]) (seed 0, the default secret), for i < n: data,
 * offs, lens and out are device memory; one CUDA block per range. The device XXH3 the codec
 * hashes with, exposed for its tests. WSYNC_ERR_INVALID for NULL pointers; WSYNC_ERR_DEVICE. */
wsync_status_t wsync_kdelta_xxh3(const void *data, const uint64_t *offs, const uint64_t *lens,
                                 uint32_t n, uint64_t *out, void *stream);

#ifdef __cplusplus
}
#endif

#endif
