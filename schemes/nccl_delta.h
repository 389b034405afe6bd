/* Internal: delta versions over the nccl scheme (issue 17, docs/delta.md, core/delta.h).
 *
 * How a delta-mode version travels (every member computes the same decisions, so that the NCCL
 * calls of both sides match):
 *  1. Version start: one ncclAllGather of a u64 per rank over the whole communicator: each
 *     sender's base b (the version its baselines hold, 0: none) and each receiver's holds (the
 *     version its targets hold intact, 0: none). Every member then knows every op's mode.
 *  2. An op (schemes/nccl.h) goes DELTA when its sender has b != 0 and its receiver holds b (a
 *     broadcast: every receiver of its set holds b); otherwise it goes plain, exactly as in a full
 *     version (mixed broadcast sets go plain to the whole set).
 *  3. In a DELTA op, an item (chunk) is *encoded* when the sender can diff it (esize 1, 2, 4 or 8,
 *     n * esize <= UINT32_MAX, no other chunk of the sender overlaps it: the encoding pass updates
 *     the baseline, which would corrupt an overlapping chunk's comparison) and every receiver of
 *     the op can apply it (each of its segments of the chunk lands in a target of the chunk's
 *     dtype, in place, not quantized: FP8 targets always take full bytes). Receivers tell each
 *     sender what they can apply once, at setup (a bitmap over the sender's chunks, relayed).
 *     An encoded item travels encoded even when its encoding is not smaller than the plain bytes
 *     (PLAIN blocks: at most 16 + 8 per 4096 elements more), so that which items are encoded is
 *     fixed for an op and the receiver's copies are built once.
 *  4. Per step, a DELTA op sends first its *table* (below: per item the encoded length, 0 for a
 *     plain item, and the xxh3 tree hash of the new values), by send or broadcast as the op goes;
 *     the receivers bring it to the host, then each item travels as its own send / broadcast of
 *     the length the table says (plain items: their plain bytes, where a plain op would put them).
 *  5. The receiver applies encoded items in place and compares each segment's tree hash with the
 *     table's: a mismatch fails the version with WSYNC_ERR_INTEGRITY naming the param.
 * The functions here are the decisions and formats, computed from the plan alone: unit-tested on
 * the CPU (tests/unit/test_nccl_delta.c). */
#ifndef WSYNC_SCHEMES_NCCL_DELTA_H
#define WSYNC_SCHEMES_NCCL_DELTA_H

#include <stdint.h>

#include "core/wire.h"
#include "reshard/plan.h"
#include "schemes/nccl.h"

#define WSYNC_NCCL_DTABLE_MAGIC 0x4c44434eu   /* "NCDL" */
#define WSYNC_NCCL_DCAPS_MAGIC 0x5044434eu    /* "NCDP" */
#define WSYNC_NCCL_DALIGN 256u                /* an encoded item's place in a staging area */

/* Chunks of sender `sender`: [*lo, *hi) of plan->chunks (they come by sender). */
void wsync_nccl_sender_chunks(const wsync_plan_t *plan, uint32_t sender, uint32_t *lo,
                              uint32_t *hi);

/* The bitmap a receiver relays to each sender it reads from, once at setup: bit i (byte i / 8,
 * LSB first) set when it can apply chunk lo + i of that sender as a delta
 * (wsync_delta_rx_chunk_capable). Its relay: u32 magic, u32 nbits, the bitmap. Decode checks magic, nbits == expect and the
 * length, and that no bit is set past nbits (WSYNC_ERR_PROTOCOL naming `who`); *bits gets a
 * malloc'd copy. */
void wsync_nccl_dcaps_encode(const uint8_t *bits, uint32_t nbits, wsync_wbuf_t *out);
wsync_status_t wsync_nccl_dcaps_decode(const void *p, size_t len, uint32_t expect,
                                       const char *who, uint8_t **bits);

static inline int wsync_nccl_bit(const uint8_t *bits, uint32_t i)
{
    return bits != NULL && (bits[i / 8] >> (i % 8)) & 1u;
}

/* Does op go DELTA this version? have[i] is NCCL rank i's all-gathered u64: senders' bases
 * (ranks 0 .. nsenders - 1), then receivers' holds. */
int wsync_nccl_delta_op_on(const wsync_nccl_sched_t *s, const wsync_nccl_op_t *op,
                           const uint64_t *have, uint32_t nsenders);

/* Is item j of op encoded when the op goes DELTA? scap[c - lo]: the op's sender can diff chunk c
 * (wsync_delta_tx_capable); rbits[r]: receiver r's bitmap for this sender (NULL: it applies
 * nothing). */
int wsync_nccl_delta_item_on(const wsync_plan_t *plan, const wsync_nccl_sched_t *s,
                             const wsync_nccl_op_t *op, uint32_t j, uint32_t lo,
                             const uint8_t *scap, uint8_t *const *rbits);

/* Room an encoded chunk may take (wsync_delta_max_bytes, rounded up to WSYNC_NCCL_DALIGN). */
uint64_t wsync_nccl_delta_room(const wsync_chunk_t *c);

/* An op's table: u32 magic, u32 nitems, u64 version, then per item u64 len (encoded bytes, 0:
 * the item travels plain), u64 hash (of the new values; 0 for a plain item). Little-endian. */
static inline uint64_t wsync_nccl_dtable_bytes(uint32_t nitems)
{
    return 16 + 16 * (uint64_t)nitems;
}
void wsync_nccl_dtable_write(void *out, uint64_t version, uint32_t nitems, const uint64_t *len,
                             const uint64_t *hash);
/* Read and check op's table: magic, version, item count, and each len 0 (plain) or a multiple of
 * 8 from the smallest encoding of its chunk (header and block table) up to
 * wsync_delta_max_bytes. WSYNC_ERR_INTEGRITY naming `who` (the sender) and the item. len and hash:
 * [op->nitems], written only on success. */
wsync_status_t wsync_nccl_dtable_read(const void *in, uint64_t version, const wsync_plan_t *plan,
                                      const wsync_nccl_sched_t *s, const wsync_nccl_op_t *op,
                                      const char *who, uint64_t *len, uint64_t *hash);

#endif
