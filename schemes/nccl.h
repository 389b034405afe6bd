/* Internal: the nccl scheme's schedule, computed from the plan alone, identically on every
 * member of the group (so that every rank issues matching NCCL calls in the same order), and
 * exposed for unit tests.
 *
 * A version runs in steps: step k moves bucket k of every sender that has one. Each step is a
 * list of *ops*, each one NCCL call pair:
 *  - BCAST: one ncclBroadcast from a sender to a receiver set that needs the same chunks (replicas:
 *    a chunk shared by segments of several receivers), on the whole communicator when the set is
 *    every receiver of a single sender's group, else on a sub-communicator split for that
 *    (sender, receivers) set: at most max_splits sets, those carrying the most bytes; chunks of
 *    other sets go by P2P to each receiver;
 *  - P2P: one ncclSend/ncclRecv from a sender to one receiver.
 * An op carries one chunk (a chunk of at least direct_min bytes: each side may then use its own
 * memory directly, the sender's shard where the chunk is contiguous, the receiver's target where
 * its one segment is contiguous in the same dtype), or several small chunks *packed* (each at a
 * 64-byte aligned offset; always staged on both sides).
 * Order within a step, the same on every rank: BCAST ops by group then chunk, then P2P ops by
 * (sender, receiver), single ops in chunk order before the packed op. Each rank issues, per step,
 * the ops it is part of: on the whole communicator (broadcasts, then sends and receives, as two
 * NCCL groups), then on each sub-communicator in group order.
 * Bytes are wire bytes (wsync_chunk_wire_bytes): a chunk that travels as FP8 codes and scales
 * (FP8 on the wire) counts those, and is always staged (quantized into the slot, unpacked in two
 * copies). */
#ifndef WSYNC_SCHEMES_NCCL_H
#define WSYNC_SCHEMES_NCCL_H

#include <stdint.h>

#include "reshard/plan.h"

#define WSYNC_NCCL_DIRECT_MIN (256u << 10)  /* bytes from which a chunk is an op of its own */
#define WSYNC_NCCL_MAX_SPLITS 8             /* sub-communicators for broadcasts */

enum { WSYNC_NCCL_OP_BCAST = 0, WSYNC_NCCL_OP_P2P = 1 };

typedef struct {
    uint32_t sender;
    uint32_t nrecv;
    uint32_t *recv;                  /* [nrecv] receiver ranks, ascending */
    uint64_t bytes;                  /* bytes of the chunks this set shares, per version */
    int whole;                       /* the whole communicator: one sender, every receiver */
    int split;                       /* index of its sub-communicator (in group order), -1: none */
    int used;                        /* broadcast (whole, or split); else its chunks go by P2P */
} wsync_nccl_group_t;

typedef struct {
    uint8_t kind;                    /* WSYNC_NCCL_OP_* */
    uint8_t packed;                  /* several chunks (or one small one) in one staged buffer */
    uint32_t sender;
    uint32_t receiver;               /* P2P only */
    uint32_t group;                  /* BCAST only */
    uint32_t item0, nitems;          /* items[item0 .. item0 + nitems) */
    uint64_t bytes;                  /* on the wire */
} wsync_nccl_op_t;

typedef struct {
    uint32_t chunk;
    uint64_t off;                    /* byte offset in the op's buffer */
} wsync_nccl_item_t;

typedef struct {
    uint32_t nsteps;                 /* the most buckets of any sender */
    uint32_t *step_op;               /* [nsteps + 1] ops of step k: [step_op[k], step_op[k + 1]) */
    uint32_t nops, nitems, ngroups, nsplits;
    wsync_nccl_op_t *ops;
    wsync_nccl_item_t *items;
    wsync_nccl_group_t *groups;      /* every distinct (sender, receivers) set of 2+ receivers */
    uint64_t bytes_bcast, bytes_p2p; /* bytes a version puts on the wire, by kind (a broadcast
                                        counted once) */
} wsync_nccl_sched_t;

/* Build the schedule of a plan. direct_min: WSYNC_NCCL_DIRECT_MIN; max_splits: at most that many
 * sub-communicators. Deterministic. *out owned by the caller. */
wsync_status_t wsync_nccl_sched_build(const wsync_plan_t *plan, uint64_t direct_min,
                                      uint32_t max_splits, wsync_nccl_sched_t **out);
void wsync_nccl_sched_free(wsync_nccl_sched_t *s);

/* Is member (role: 1 sender, 2 receiver; rank) part of op? */
int wsync_nccl_op_has(const wsync_nccl_sched_t *s, const wsync_nccl_op_t *op, int role,
                      uint32_t rank);

/* Region helpers the scheme and its tests share: a region is contiguous when its rows follow
 * each other (one row, or pitch == cols). */
static inline int wsync_nccl_region_contiguous(const wsync_region_t *r)
{
    return r->rows == 1 || r->pitch == r->cols;
}

#endif
