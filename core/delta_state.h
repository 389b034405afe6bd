/* Internal: what senders and receivers keep for delta versions (issue 17, docs/delta.md), and
 * the calls a scheme (ipc, nccl, store) makes to move a version's chunks encoded.
 *
 * The group's mode is resolved once by the coordinator (wsync_delta_resolve) and travels in PLAN
 * (m->planmsg.delta). Only when it is WSYNC_DELTA_MODE_ON does a scheme create the state below;
 * with it off nothing here is allocated or called, and versions travel as before.
 *
 * Sender (core/delta_tx.c): a baseline per shard that has delta-capable chunks = the shard's
 * values as of the base version b (0: none). A chunk is delta-capable when it overlaps no other
 * chunk of the same shard (the encoding pass updates the baseline region, which would corrupt an
 * overlapping chunk's comparison). Each version, every capable chunk's baseline region is brought
 * to the new values exactly once: by wsync_delta_tx_encode (host shards), by
 * wsync_delta_tx_refresh (a copy), or by the scheme's own device kernels followed by
 * wsync_delta_tx_mark. A version that fails, or leaves a capable chunk untouched, leaves b = 0:
 * the next version goes full to every receiver and refreshes every baseline.
 *
 * Receiver (core/delta_rx.c): holds = r->delta_holds, the version its targets hold intact (the
 * last committed one), 0 = none: 0 at start, after wsync_receiver_set_target_data (any target
 * re-pointed: shadow mode and sleep/wake take the next version in full) and after any failed
 * version. It takes chunk c of a version encoded against b as delta iff holds == b != 0 and every
 * segment it has of c is delta-capable (target dtype == chunk dtype, not a quantized FP8 target,
 * and in memory the scheme applies to); otherwise it takes c plain. After applying it compares
 * the tree hash of each target region with the sender's hash of the new values: a mismatch is
 * WSYNC_ERR_INTEGRITY naming the param, the target and the sender (and holds becomes 0).
 */
#ifndef WSYNC_CORE_DELTA_STATE_H
#define WSYNC_CORE_DELTA_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "core/objects.h"
#include "schemes/scheme.h"

/* ---- the group's mode (coordinator) ------------------------------------------------------ */

/* Resolve the group's delta mode from every participant's HELLO choice: any "off" -> off; else
 * any "on" -> on; else auto: on when the scheme is nccl or store and the participants span more
 * than one host or network namespace, off otherwise (a store resolved before any reader joined
 * (g->nreceivers 0): on, its readers come later from anywhere; a reader that said off then takes
 * every version in full). A scheme whose ops lack .delta cannot carry
 * delta versions: "on" is then refused (WSYNC_ERR_UNSUPPORTED naming the scheme and who asked),
 * and auto resolves off. fp8_targets: the group has quantized FP8 targets (they always take full
 * bytes; the line says so when the mode is on). Writes one explanation line ("delta: on (...)")
 * into line[0, len) on success; *mode gets WSYNC_DELTA_MODE_OFF or _ON. */
wsync_status_t wsync_delta_resolve(const wsync_group_info_t *g, const wsync_scheme_ops_t *scheme,
                                   int fp8_targets, uint32_t *mode, char *line, size_t len);

/* ---- sender: the cut-off (core/delta_tx.c; docs/delta.md "When a chunk goes plain") -------- */

/* Defaults of params.delta_cutoff (0 = unset), per the memory the chunk's shard is in. Host: the
 * CPU codec's passes (encode reads both versions, the reader checks, applies and hashes) cost
 * more than the bytes they save once the encoding passes 13 to 25 % of the plain bytes on the
 * loopback store (UCX over TCP, measured on the 2-core development VM, docs/delta.md): 0.2.
 * CUDA: the device codec runs at HBM speed, far above any link, so an encoding pays whenever it
 * is smaller than the plain bytes. */
/* (WSYNC_DELTA_CUTOFF_HOST and WSYNC_DELTA_CUTOFF_CUDA: public, in wsync/wsync.h) */

/* This sender's cut-off for a chunk of a host (cuda 0) or CUDA (cuda 1) shard. */
double wsync_delta_cutoff(const wsync_sender_t *s, int cuda);
/* The cut-off in bytes for a chunk of `plain` bytes: its encoding travels only when it is
 * shorter than this (floor(cutoff x plain); with cut-off 1, the plain size). Give the encoder
 * this as its cap: an encoding that would pass it stops early and the chunk travels plain. */
uint64_t wsync_delta_limit(const wsync_sender_t *s, int cuda, uint64_t plain);
/* A host chunk that went plain by the cut-off is not encoded again for the next
 * WSYNC_DELTA_REPROBE - 1 versions (it travels plain and its baseline is refreshed by a copy);
 * the one after probes it again. Dense chunks then cost a copy, not a partial encoding pass. */
#define WSYNC_DELTA_REPROBE 8u

/* ---- sender: baselines (core/delta_tx.c) ------------------------------------------------- */

typedef struct wsync_delta_tx wsync_delta_tx_t;

/* Called by a scheme's sender_setup when the group's mode is on. Finds this sender's
 * delta-capable chunks and allocates a baseline for every shard that has one: host shards in
 * host memory; CUDA shards in device memory on s->device, or pinned host memory when
 * delta_baseline is "host". The baselines' content is undefined until the first version (b = 0
 * then). The scheme stores it in s->delta_tx, which wsync_sender_free frees (after the scheme's
 * teardown); core/sender.c calls wsync_delta_tx_end after each push. */
wsync_status_t wsync_delta_tx_create(wsync_sender_t *s, wsync_delta_tx_t **out);
void wsync_delta_tx_free(wsync_delta_tx_t *tx);

/* 1 when plan chunk `chunk` (one of this sender's) is delta-capable. */
int wsync_delta_tx_capable(const wsync_delta_tx_t *tx, uint32_t chunk);
/* Bytes of memory the baselines take (what wsync-info --explain and the docs report), and how
 * many of this sender's chunks are capable. */
uint64_t wsync_delta_tx_bytes(const wsync_delta_tx_t *tx);
uint32_t wsync_delta_tx_ncapable(const wsync_delta_tx_t *tx);
/* Shard i's baseline (same layout as the shard: shard element e at element e of it); *on_device
 * (may be NULL) 1 for device memory. NULL when shard i has no capable chunk. For a scheme that
 * encodes CUDA shards with the device codec (kernels/delta.h) and then calls _mark. */
void *wsync_delta_tx_baseline(const wsync_delta_tx_t *tx, uint32_t shard, int *on_device);

/* At the start of each push of `version`, before any chunk: returns the base version b its
 * deltas are encoded against (0: every receiver takes this version in full). */
uint64_t wsync_delta_tx_begin(wsync_delta_tx_t *tx, uint64_t version);
/* The base of the version in flight (as _begin returned). */
uint64_t wsync_delta_tx_base(const wsync_delta_tx_t *tx);

/* Host shard chunk `chunk` (capable), this version: encode its new values (the shard) against
 * its baseline into out[0, cap) and bring the baseline to the new values. *len = the encoded
 * bytes, or 0 when the chunk travels plain (b = 0, or its encoding would not be shorter than
 * wsync_delta_limit, the cut-off, or would not fit cap: the encoder stops there; and without
 * encoding in the WSYNC_DELTA_REPROBE - 1 versions after one that went plain by the cut-off);
 * the baseline is refreshed either way. *hash = the tree hash of the new values (core/delta.h) when *len > 0; 0
 * for a plain chunk (receivers compare hashes only after applying a delta, so it is not
 * computed). Call once per chunk per version. */
wsync_status_t wsync_delta_tx_encode(wsync_delta_tx_t *tx, uint32_t chunk, void *out, uint64_t cap,
                                     uint64_t *len, uint64_t *hash);
/* Capable chunk `chunk` travels plain to everyone this version: copy its new values into the
 * baseline (host shards: memcpy; CUDA shards: a device copy on `stream`, which the caller
 * synchronizes before _end). */
wsync_status_t wsync_delta_tx_refresh(wsync_delta_tx_t *tx, uint32_t chunk, void *stream);
/* The scheme brought chunk `chunk`'s baseline to the new values itself (device kernels). */
void wsync_delta_tx_mark(wsync_delta_tx_t *tx, uint32_t chunk);
/* At the end of the push of `version` (core/sender.c calls it): ok and every capable chunk encoded, refreshed or marked
 * -> the next version's base is `version`; else 0 (logged when a chunk was left out). */
void wsync_delta_tx_end(wsync_delta_tx_t *tx, uint64_t version, int ok);

/* ---- receiver: holds and apply (core/delta_rx.c) ----------------------------------------- */

typedef struct wsync_delta_rx wsync_delta_rx_t;

/* Called by a scheme's receiver_setup when the group's mode is on. host_only: the scheme
 * applies deltas to host targets only (CUDA segments are then not capable). The scheme stores it
 * in r->delta_rx, which wsync_receiver_free frees; core/receiver.c keeps r->delta_holds. */
wsync_status_t wsync_delta_rx_create(wsync_receiver_t *r, int host_only, wsync_delta_rx_t **out);
void wsync_delta_rx_free(wsync_delta_rx_t *rx);

/* 1 when segment `seg` of ours (r->m.segs[seg]) can be applied from an encoded chunk. */
int wsync_delta_rx_seg_capable(const wsync_delta_rx_t *rx, uint32_t seg);
/* 1 when every segment of ours from plan chunk `chunk` is capable (0 for chunks we lack). */
int wsync_delta_rx_chunk_capable(const wsync_delta_rx_t *rx, uint32_t chunk);
/* 1 when this receiver takes `chunk` of a version encoded against `base` as delta. */
int wsync_delta_rx_takes(const wsync_receiver_t *r, const wsync_delta_rx_t *rx, uint64_t base,
                         uint32_t chunk);

/* Check the encoded chunk enc[0, len) of plan chunk `chunk` (once per chunk, before applying it
 * to any segment): WSYNC_ERR_INTEGRITY naming the chunk, its param and the sender. */
wsync_status_t wsync_delta_rx_check(const wsync_receiver_t *r, uint32_t chunk, const void *enc,
                                    uint64_t len, uint64_t version);
/* The same in parts (core/delta.h: wsync_delta_check_blocks, then wsync_delta_check_area): blocks
 * [b0, b1) of the stream, *payload their payloads' bytes; then the ranges' payloads added up. The
 * same errors as wsync_delta_rx_check. */
wsync_status_t wsync_delta_rx_check_blocks(const wsync_receiver_t *r, uint32_t chunk,
                                           const void *enc, uint64_t len, uint64_t version,
                                           uint64_t b0, uint64_t b1, uint64_t *payload);
wsync_status_t wsync_delta_rx_check_area(const wsync_receiver_t *r, uint32_t chunk, uint64_t len,
                                         uint64_t version, uint64_t payload);
/* Apply a checked encoded chunk to host segment `seg` (r->m.segs[seg]; its target region holds the base
 * version), then compare the region's tree hash with `hash` (the sender's, of the new values):
 * WSYNC_ERR_INTEGRITY naming the param, the target and the sender on a mismatch. */
wsync_status_t wsync_delta_rx_apply(wsync_receiver_t *r, uint32_t seg, const void *enc,
                                    uint64_t len, uint64_t hash, uint64_t version);
/* Compare the tree hash of segment `seg`'s target region (host) with `hash`: for a scheme that
 * applied with its own kernels and hashed on the device, or a test. Same error as _apply. */
wsync_status_t wsync_delta_rx_hash_error(const wsync_receiver_t *r, uint32_t seg, uint64_t want,
                                         uint64_t got, uint64_t version);

/* core/receiver.c keeps r->delta_holds; schemes read it with this (START, holds exchange). */
static inline uint64_t wsync_delta_rx_holds(const wsync_receiver_t *r)
{
    return r->delta_holds;
}

#endif
