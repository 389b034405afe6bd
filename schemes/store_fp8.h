/* Internal: FP8 on the wire through the store (docs/fp8_wire.md, docs/store.md).
 *
 * A store reader's plan is its own (readers come when they like), so its senders learn which
 * FP8 chunks to make from the readers themselves: at setup each reader sends every sender it
 * reads FP8 chunks from their shard regions and rules (a relay through the coordinator), and a
 * sender also takes those of its own plan. Per version a sender quantizes each such region of
 * its shards (reshard/exec_wire.c's pack: codes, then one f32 per cell) into a wire slot,
 * registered with the transport and kept with the version, and publishes a table of them after
 * its checksums. A reader gets an FP8 chunk's codes and scales from the table's region that
 * holds it (whole rows of cells), and unpacks them into its target; a chunk no table holds (a
 * version published before the sender heard of this reader) is read plain and quantized here
 * the same way, so the target's bytes are the same either way.
 *
 * Table (PUBLISH, after the checksums; the coordinator passes it on in the DIRECTORY): u32 n,
 * u32 row bytes (STORE_FP8_ROW), then n rows: u32 shard, u32 region (of the directory entry),
 * u64 address of the packed region (codes, then its scales at wsync_wire_scales_off), u64 off,
 * rows, cols, pitch (elements of the shard), u32 ncells, u32 fp8 dtype, u32 scheme, i32 block
 * rows, i32 block cols, u32 eps (f32 bits), u32 flags (1 ue8m0, 2 no_saturate), u64 xxh3 of the
 * packed bytes (0: none). Little-endian.
 *
 * Per-tensor targets (one scale for the whole target: schemes/store_amax.h): a region's rule is
 * WSYNC_QUANT_TENSOR with its set's key in the block fields (the same region may be packed for
 * two sets with two amaxes); a sender packs it only in versions whose amax its senders agreed
 * on, and a reader takes a set packed only if every chunk of it is in a table, whole, else reads
 * all of them plain and quantizes the whole target here. */
#ifndef WSYNC_SCHEMES_STORE_FP8_H
#define WSYNC_SCHEMES_STORE_FP8_H

#include "core/objects.h"
#include "core/proto.h"
#include "schemes/store_delta.h"
#include "transports/rma.h"

/* The relay tag of a reader's FP8 regions to a sender (tests wait on it). */
#define STORE_FP8_TAG 2u
#define STORE_FP8_ROW 84u

/* One row of a sender's table. */
typedef struct {
    uint32_t shard, region;
    uint64_t addr;
    wsync_region_t g;
    uint32_t ncells;
    wsync_wire_rule_t rule;
    uint64_t hash;
} store_fp8_row_t;

typedef struct {
    uint32_t n;
    store_fp8_row_t *rows;           /* sorted for lookups (store_fp8.c) */
} store_fp8_table_t;

/* ---- sender ---- */
typedef struct store_ftx store_ftx_t;

/* Set up with the FP8 chunks of the sender's own plan (none is fine: readers say theirs). */
wsync_status_t wsync_store_ftx_create(wsync_sender_t *s, const wsync_rma_ops_t *rma,
                                      wsync_rma_t *ctx, store_ftx_t **out);
void wsync_store_ftx_free(store_ftx_t *f);
/* Version `version`: take the regions of readers that came since (relays), quantize each into a
 * wire slot and add the slot as region e->nregions (the caller's array has room for it). src[i]
 * is host shard i's bytes of this version (its snapshot, or the shard); regions of CUDA shards
 * are quantized on the GPU from the shards (kernels/wire.c's descriptors, on `stream`, device
 * current) and copied into the slot. WSYNC_ERR_NONFINITE naming the param, the element and the
 * sender when a region holds a NaN or Inf; nothing is published then. *packed: the bytes. With
 * `hash`, each region's xxh3 goes in the table (WSYNC_VERIFY). */
wsync_status_t wsync_store_ftx_publish(wsync_sender_t *s, store_ftx_t *f, uint64_t version,
                                       const void *const *src, void *stream, int hash,
                                       wsync_dir_entry_t *e, uint64_t *packed);
/* Append the table of the version just packed (none: n = 0; f may be NULL). */
void wsync_store_ftx_table(const store_ftx_t *f, wsync_wbuf_t *b);
/* The version was not published (its slot is free again), or was evicted. */
void wsync_store_ftx_abandon(store_ftx_t *f);
void wsync_store_ftx_release(store_ftx_t *f, uint64_t version);

/* ---- reader ---- */
typedef struct store_frx store_frx_t;

/* Sender `sender`'s table, after its checksums in a DIRECTORY; rows checked against its entry
 * (regions, sizes, rules). */
wsync_status_t wsync_store_fp8_table_decode(wsync_rbuf_t *rb, uint32_t sender,
                                            const wsync_dir_entry_t *e, store_fp8_table_t *t);
void wsync_store_fp8_table_clear(store_fp8_table_t *t);
/* The row of a decoded table that holds shard `shard`'s region src under `rule` as whole rows of
 * its cells (same columns, its first row on a cell row, its last at one or at the row's end),
 * and src's first row in it (*dr); NULL when none does. */
const store_fp8_row_t *wsync_store_fp8_find(const store_fp8_table_t *t, uint32_t shard,
                                            const wsync_region_t *src, const wsync_wire_rule_t *rule,
                                            uint64_t *dr);

/* Receiver setup: our segments are r->m.segs[lo, hi). *out NULL when none of them is FP8;
 * else each sender we read FP8 chunks from is told their regions. */
wsync_status_t wsync_store_frx_create(wsync_receiver_t *r, uint32_t lo, uint32_t hi,
                                      store_frx_t **out);
void wsync_store_frx_free(store_frx_t *f);
/* WSYNC_VERIFY: segment seg's chunk's plain rows, checked against its sender's checksums, dense
 * [rows, cols] into dst (store.c). */
typedef wsync_status_t (*wsync_store_verified_fn)(void *arg, uint32_t seg, uint8_t *dst);

/* Version v: every one of our segments whose chunk travels FP8, read (its sender's packed bytes
 * where its table holds them, else plain and quantized here) and landed in its target (CUDA
 * targets by copies on `stream`, device current). *bytes += the bytes read for them. With
 * WSYNC_VERIFY, packed bytes are taken only where a region holds the chunk whole with its
 * sender's xxh3 (checked); the others come plain through `verified`. */
wsync_status_t wsync_store_frx_read(wsync_receiver_t *r, store_frx_t *f, const wsync_store_io_t *io,
                                    wsync_store_verified_fn verified, void *varg,
                                    const wsync_dir_entry_t *e, const store_fp8_table_t *tabs,
                                    uint64_t v, void *stream, uint64_t *bytes);

#endif
