/* Internal: the ipc scheme's delta versions (issue 17, docs/delta.md), kept out of ipc.c.
 *
 * Sender: at each delta-mode version it waits for a DELTA_START from every receiver that reads
 * from it (version, holds, the chunks it takes plain anyway), so it knows per chunk whether some
 * receiver takes it as a delta and whether some takes it plain. Per bucket, the chunks wanted as
 * deltas are encoded (host shards, CPU codec) into the bucket's delta slot, a memfd of IPC_SLOTS
 * slots shared once like the bucket slots, at the chunk's bucket offset (an encoding not smaller
 * than the plain bytes travels plain); every other delta-capable chunk refreshes its baseline by
 * a copy. Plain bytes stay where they are for those who want them (staged, or read in place);
 * a chunk nobody takes plain is not staged. READY carries the base version, the delta slot and
 * per chunk (encoded length or 0, tree hash of the new values).
 * Receiver: sends DELTA_START to each sender it reads from when the version begins; per READY,
 * takes a chunk as a delta iff it holds the base, the chunk is delta-capable for it and the
 * sender encoded it: checks the stream once, applies it to each of its segments of the chunk and
 * compares each region's tree hash with the sender's (WSYNC_ERR_INTEGRITY naming the param).
 * CUDA memory: a sender with CUDA shards encodes each bucket's capable CUDA chunks with one
 * batched device encode (kernels/delta.h, update_old brings the baselines up), the results
 * (length, hash) read back after the encode's event, into the bucket's delta slot: a device one
 * (after the device bucket slots, in the same cuda_ipc region) when every receiver of those chunks
 * lands them in CUDA targets on a GPU that reads ours (as the plain path decides device vs host
 * bucket slots), else the host one, pinned for the kernels; READY's slot then has DEV_DELTA set.
 * A receiver with CUDA targets applies the bucket's segments that come as deltas with one batched
 * device apply (hash on) reading the peer-mapped device slot or the pinned host slot, on the
 * sender's stream beside the plain copies, and compares the hashes when the bucket's event
 * completes. */
#ifndef WSYNC_SCHEMES_IPC_DELTA_H
#define WSYNC_SCHEMES_IPC_DELTA_H

#include <stdint.h>

#include "core/objects.h"
#include "core/wire.h"

/* ---- sender ---- */

typedef struct ipc_dtx ipc_dtx_t;

/* ipc sender_setup, when the group's mode is on: the baselines (s->delta_tx), the delta slots
 * (nslots of the largest bucket's bytes, rounded to pages; a memfd), each receiver's chunks from
 * this sender. chunk_start[nbuckets + 1]: the plan's chunk ranges of this sender's buckets. */
wsync_status_t wsync_ipc_dtx_create(wsync_sender_t *s, uint32_t nbuckets,
                                    const uint32_t *chunk_start, uint32_t nslots, ipc_dtx_t **out);
void wsync_ipc_dtx_free(ipc_dtx_t *d);
/* What DATA_FDS says of the delta slots: their count, bytes each, and the memfd (-1: none). */
void wsync_ipc_dtx_slots(const ipc_dtx_t *d, uint32_t *n, uint64_t *bytes, int *fd);
/* Start of a push: the base version, and every DELTA_START of the receivers with needs_any[r]
 * (rconn[r] their data connections), waited for until the deadline. */
wsync_status_t wsync_ipc_dtx_begin(wsync_sender_t *s, ipc_dtx_t *d, uint64_t version,
                                   wsync_conn_t *const *rconn, const uint8_t *needs_any);
/* Bucket k is about to use its delta slot: the bucket that used it last (its RELEASEs must be
 * in before the slot is rewritten), or -1. Call once per bucket, in schedule order. */
int64_t wsync_ipc_dtx_reuse(ipc_dtx_t *d, uint32_t k);
/* Bucket k: encode the chunks some receiver takes as deltas into its delta slot, refresh the
 * other capable chunks' baselines (CUDA shards: device copies on `stream`). Fault point
 * delta.encoded: once per encoded chunk. */
wsync_status_t wsync_ipc_dtx_bucket(wsync_sender_t *s, ipc_dtx_t *d, uint32_t k, uint64_t version,
                                    void *stream);
/* CUDA shards, before the device slots are allocated: which buckets' delta slots are device ones
 * (stage_host[shard]: some receiver of the shard reads host memory or cannot read our GPU).
 * Returns how many device delta slots (of wsync_ipc_dtx_slots' bytes) to allocate, 0: none. */
uint32_t wsync_ipc_dtx_plan_device(wsync_sender_t *s, ipc_dtx_t *d, const uint8_t *stage_host);
/* CUDA shards (in the sender's device context, after _create): pin the host delta slots for the
 * kernels and build each bucket's batched encode of its capable CUDA chunks, into the device
 * delta slots at dev_base (NULL: none, every bucket uses its host slot) or the host ones.
 * _cuda_free undoes it (in the device context, before wsync_ipc_dtx_free). */
wsync_status_t wsync_ipc_dtx_cuda(wsync_sender_t *s, ipc_dtx_t *d, void *dev_base);
void wsync_ipc_dtx_cuda_free(ipc_dtx_t *d);
/* 1 when plan chunk c travels to nobody plain this version (so it need not be staged). */
int wsync_ipc_dtx_skip_plain(const ipc_dtx_t *d, uint32_t c);
/* READY's delta part for bucket k (after the slot). */
void wsync_ipc_dtx_put_ready(const ipc_dtx_t *d, uint32_t k, wsync_wbuf_t *b);
/* Once every READY went out: the device refreshes are complete (stream), the push's wire bytes
 * are in s->stats, and the debug log says what travelled encoded and plain. */
wsync_status_t wsync_ipc_dtx_finish(wsync_sender_t *s, ipc_dtx_t *d, uint64_t version,
                                    void *stream);

/* ---- receiver ---- */

typedef struct ipc_drx ipc_drx_t;

/* ipc receiver_setup, when the group's mode is on, once per sender it reads from: our segments
 * from that sender are r->m.segs[seg_first, seg_end). r->delta_rx must exist. */
wsync_status_t wsync_ipc_drx_create(wsync_receiver_t *r, uint32_t sender, uint32_t seg_first,
                                    uint32_t seg_end, ipc_drx_t **out);
void wsync_ipc_drx_free(ipc_drx_t *d);
/* Map the sender's delta slots (DATA_FDS; takes fd, closed on failure too); what names them in
 * errors. */
wsync_status_t wsync_ipc_drx_map(ipc_drx_t *d, int fd, uint32_t n, uint64_t bytes,
                                 const char *what);
/* The version began: DELTA_START to the sender over its data connection. */
wsync_status_t wsync_ipc_drx_start(wsync_receiver_t *r, ipc_drx_t *d, wsync_conn_t *conn,
                                   uint64_t version);
/* READY's delta part for bucket k, whose chunks are plan->chunks[c0, c1): read and checked
 * (lengths inside the chunk's plain bytes and the slot). WSYNC_ERR_PROTOCOL otherwise. */
wsync_status_t wsync_ipc_drx_ready(wsync_receiver_t *r, ipc_drx_t *d, wsync_rbuf_t *rb,
                                   uint32_t k, uint32_t c0, uint32_t c1, uint64_t version);
/* Segment `seg` of the bucket READY described: 1 when it was applied as a delta (*rc says how
 * that went), 0 when it takes plain bytes as before. */
int wsync_ipc_drx_segment(wsync_receiver_t *r, ipc_drx_t *d, uint32_t seg, uint64_t version,
                          wsync_status_t *rc);

/* CUDA targets (in the receiver's device context, after _map): pin the mapped host delta slots
 * for our kernels; the sender has nbuckets buckets; its device delta slots are at dev_base
 * (imported, dev_bytes readable there; NULL: none). _cuda_free undoes it and frees the batches. */
wsync_status_t wsync_ipc_drx_cuda(ipc_drx_t *d, uint32_t nbuckets, const void *dev_base,
                                  uint64_t dev_bytes);
void wsync_ipc_drx_cuda_free(ipc_drx_t *d);
/* 1 when segment `seg`'s chunk comes as a delta to us in the READY at hand. */
int wsync_ipc_drx_seg_delta(const wsync_receiver_t *r, const ipc_drx_t *d, uint32_t seg);
/* Bucket k (our segments seg0 .. seg1 from this sender): launch the apply of its CUDA-target
 * segments that come as deltas on `stream` (nothing when none does). *rebuilt: the set of those
 * segments (or the targets' pointers) changed since the bucket's last launch, so a copy batch
 * that leaves them out must be rebuilt too. */
wsync_status_t wsync_ipc_drx_gpu_launch(wsync_receiver_t *r, ipc_drx_t *d, uint32_t k,
                                        uint32_t seg0, uint32_t seg1, void *stream, int *rebuilt);
/* Bucket k's launch has completed: each apply's fault and tree hash against the sender's
 * (WSYNC_ERR_INTEGRITY naming the param). Nothing when this version launched none. */
wsync_status_t wsync_ipc_drx_gpu_check(wsync_receiver_t *r, ipc_drx_t *d, uint32_t k,
                                       uint64_t version);

#endif
