/* Internal: the store scheme's delta versions (issue 17, docs/delta.md "The store scheme"), kept
 * out of store.c.
 *
 * The store's senders have no readers' chunks in their plan (readers come when they like, each
 * with a plan of its own), so each reader tells every sender it reads from, once at set-up (a
 * relay through the coordinator), the shard regions of its chunks that it could take as deltas.
 * Sender: a baseline of every shard (its values as of the base b, the last version it published
 * whole); with version v it encodes every region readers asked for against it, next to the full
 * bytes it publishes as before (snapshot or in place), into a registered host buffer of its own:
 * at its head a table, one row per region sorted by (shard, off, rows, cols, pitch) with the
 * stream's offset, length (0: read it plain) and the tree hash of the new values, the streams
 * after it; then the baselines are brought to v whole (regions of different readers may
 * overlap). The directory entry's delta part says where (core/proto.h). Host shards encode with
 * the CPU codec, in format 4 (values as steps from the old ones, core/delta.h) where every reader
 * of the region applies on the CPU (its message says so), else in format 3; CUDA shards with
 * device baselines with the device codec (kernels/delta.h, one batch over their regions, format
 * 3), the streams copied to the host buffer. The buffer of v is reused
 * once the coordinator frees v (FREE). A version not published whole leaves no base: the next
 * one is read full by everyone.
 * Reader: for each sender whose base it holds (r->delta_holds == b != 0), it reads the table,
 * finds its chunks' regions there, reads their streams (one-sided gets, all in flight), checks
 * each (wsync_delta_check), applies it to each of its segments of the chunk and compares the
 * tree hash with the sender's (WSYNC_ERR_INTEGRITY naming the param). Everything else it reads
 * plain, as without delta. Host targets apply with the CPU codec; CUDA targets with the device
 * codec, from the pinned host buffer the streams landed in (format 3 only: a stream of another
 * format is refused before it is applied). */
#ifndef WSYNC_SCHEMES_STORE_DELTA_H
#define WSYNC_SCHEMES_STORE_DELTA_H

#include <stdint.h>

#include "core/objects.h"
#include "core/proto.h"

/* Relay tag: a reader's regions, to each sender it reads from (u32 n, n x (u32 shard, u32 flags,
 * u64 off, rows, cols, pitch)). A sender refuses a message naming a region outside its shard,
 * unknown flags, or a malformed one, whole, with a warning naming the reader: that reader reads
 * those chunks plain. */
#define STORE_DELTA_TAG 1u
/* A region's flag: the reader applies it on the CPU, so it takes format 4 (core/delta.h: values
 * as steps from the old); a region without it (CUDA targets) is encoded in format 3. */
#define STORE_DELTA_CPU 1u
#include "transports/rma.h"

/* ---- sender ---- */

typedef struct store_dtx store_dtx_t;

/* store sender_setup, when the group's mode is on: a baseline of every shard (CUDA shards: on
 * s->device, or pinned host memory with delta_baseline = host). rma/ctx register the delta
 * buffers. */
wsync_status_t wsync_store_dtx_create(wsync_sender_t *s, const wsync_rma_ops_t *rma,
                                      wsync_rma_t *ctx, store_dtx_t **out);
/* After the sender's stream is idle. NULL is a no-op. */
void wsync_store_dtx_free(store_dtx_t *d);
/* Version `version`: take the regions of readers that came since (relays), encode every region
 * against the base (if any), bring the baselines to this version and fill e's delta part; when
 * there is a base, the delta buffer is added as region e->nregions (the caller's regions array
 * has room for one more). The device work runs on `stream` and is waited for. Fault point
 * delta.encoded: once per encoded region. push stats (bytes_encoded, bytes_plain, bytes_wire,
 * base_version) say what the regions readers asked for take to read by a reader that holds the
 * base. */
wsync_status_t wsync_store_dtx_publish(wsync_sender_t *s, store_dtx_t *d, uint64_t version,
                                       void *stream, wsync_dir_entry_t *e);
/* The version in flight was published (every sender's PUBLISH in): the next is encoded against
 * it. */
void wsync_store_dtx_published(store_dtx_t *d, uint64_t version);
/* The version in flight was not published: its delta buffer is free again, and the next version
 * has no base (every reader reads it full). */
void wsync_store_dtx_abandon(store_dtx_t *d);
/* The coordinator evicted version v: its delta buffer is free again (memory kept registered). */
void wsync_store_dtx_release(store_dtx_t *d, uint64_t v);

/* ---- reader ---- */

typedef struct store_drx store_drx_t;

/* How the reader's gets go (store.c: rkey import, the store.get fault point, pieces). */
typedef struct {
    /* Post one get of len bytes at addr, in the region of sender `sender` whose packed key is
     * rkey[0, rkey_len), into dst. */
    wsync_status_t (*get)(void *arg, uint32_t sender, const uint8_t *rkey, size_t rkey_len,
                          uint64_t addr, void *dst, size_t len);
    /* Wait for every get posted. */
    wsync_status_t (*flush)(void *arg);
    void *arg;
} wsync_store_io_t;

/* store receiver_setup, when the group's mode is on: our segments are r->m.segs[lo, hi).
 * Creates r->delta_rx (CUDA targets count as capable only in a build with CUDA), and sends each
 * sender we read from the regions we could take as deltas. */
wsync_status_t wsync_store_drx_create(wsync_receiver_t *r, uint32_t lo, uint32_t hi,
                                      store_drx_t **out);
void wsync_store_drx_free(store_drx_t *d);
/* Version v, directory entries e[nsenders]: read and apply the deltas this reader can take
 * (CUDA device current, when it has CUDA targets). *bytes += the encoded bytes read. Afterwards
 * wsync_store_drx_done says which of our segments it landed. */
wsync_status_t wsync_store_drx_read(wsync_receiver_t *r, store_drx_t *d, const wsync_store_io_t *io,
                                    const wsync_dir_entry_t *e, uint64_t v, uint64_t *bytes);
/* 1 when segment seg (one of ours) was landed by the last wsync_store_drx_read. */
int wsync_store_drx_done(const store_drx_t *d, uint32_t seg);

#endif
