/* Internal: the nccl scheme's state, shared by schemes/nccl.c (set-up, the schedule's NCCL calls),
 * schemes/nccl_delta.c (delta versions) and schemes/nccl_wire.c (FP8 on the wire). */
#ifndef WSYNC_SCHEMES_NCCL_STATE_H
#define WSYNC_SCHEMES_NCCL_STATE_H

#include <stdint.h>

#include "core/objects.h"
#include "kernels/device.h"
#include "schemes/nccl.h"
#include "schemes/wire_amax.h"
#include "transports/nccl.h"

#define NC_SLOTS 2
#define NC_ALIGN 256u                /* staging offsets of ops */
#define NC_TAG_HELLO 1u              /* relay: a member's GPU (and sender 0's unique id) */
#define NC_TAG_SUMS 2u               /* relay: a sender's checksums for one receiver */
#define NC_TAG_PACKED 3u             /* relay: a sender's FP8 chunks all passed their check */

struct wsync_kdelta_batch;

typedef struct {
    uint32_t op;                     /* in sched->ops */
    uint32_t phase;                  /* 0: whole-communicator broadcasts, 1: sends and receives,
                                        2 + j: sub-communicator j */
    int peer;                        /* P2P: the peer's NCCL rank; BCAST: the root's, in the comm */
    int staged;
    uint64_t soff;                   /* staged: offset in the step's slot */
    void *direct;                    /* not staged: the shard or target bytes */
    /* delta mode (schemes/nccl_delta.c) */
    uint8_t delta;                   /* this version: the op goes DELTA (table, then its items) */
    uint8_t built;                   /* receiver: abatch / pbatch match d->cpat */
    uint32_t ditem0;                 /* its items' entries in the nc_delta_t arrays */
    uint64_t toff;                   /* its table in the slot's table area */
    uint64_t doff;                   /* receiver: its encoded items, from the step's delta base */
    uint32_t napply;                 /* receiver: apply entries (one per segment of an encoded item) */
    uint32_t *aitem, *aseg;          /* receiver: [napply] the entry's item (in the op), segment */
    uint64_t *alens;                 /* receiver: [napply] this version's encoded lengths */
    struct wsync_kdelta_batch *abatch;   /* receiver: the apply of the encoded items */
    wsync_kcopy_batch_t *pbatch;     /* receiver: unpack of the staged plain items (DELTA op) */
    wsync_kcopy_batch_t *obatch;     /* receiver: unpack of the op (plain op, step with DELTA ops) */
} nc_myop_t;

typedef struct {
    uint32_t seg;                    /* in m->segs (the receiver's own) */
    int staged;
    uint64_t soff;                   /* staged: the chunk's dense bytes in the slot */
} nc_rseg_t;

typedef struct {
    uint32_t myop0, nmyops;
    uint32_t ncopies;                /* pack (sender) or unpack (receiver) copies */
    wsync_kcopy_batch_t *batch;      /* those copies, into / out of slot k % 2 */
    uint64_t staging;                /* bytes of the slot the step uses */
    uint64_t bytes;                  /* sender: bytes it sends; receiver: bytes landing */
    uint32_t rseg0, nrseg;           /* receiver: its segments of the step */
    /* delta mode: the slot holds [0, staging) plain, then [dbase, dbase + dstaging) encoded
     * chunks (sender: each once, at eoff; receiver: its ops' encoded items, at doff + ioff) */
    uint64_t dbase, dstaging;
    uint64_t tstaging;               /* bytes of its ops' tables */
    struct wsync_kdelta_batch *ebatch;   /* sender: encode of the step's chunks nenc */
    uint32_t nenc;
    uint32_t *echunk;                /* sender: [nenc] plan chunks */
    uint64_t *eoff;                  /* sender: [nenc] their place */
    uint32_t ndelta;                 /* this version: ops of ours that go DELTA */
    /* FP8 on the wire (sender): the step's chunks that travel as FP8, quantized into the slot
     * (st->quant[quant0 .. quant0 + nquant)) by one wsync_dev_quantize_many after its copies */
    uint32_t quant0, nquant;
} nc_step_t;

typedef struct {
    wsync_member_t *m;
    int role;
    uint32_t rank;                   /* sender or receiver rank */
    int nrank, nranks;               /* in the communicator */
    int device, prev_device;
    int verify;
    int aborted;                     /* communicators aborted (after a failure) */
    wsync_nccl_sched_t *sched;
    wsync_nccl_comm_t *comm;
    wsync_nccl_comm_t **sub;         /* [sched->nsplits], NULL where not a member */
    void *cstream, *xstream;         /* NCCL calls; pack or unpack kernels */
    void *ev_copy[NC_SLOTS];         /* sender: packed; receiver: received */
    void *ev_done[NC_SLOTS];         /* sender: sent; receiver: unpacked */
    int64_t slot_step[NC_SLOTS];     /* step whose work the slot's events track, -1 none */
    void *slot[NC_SLOTS];
    uint64_t slot_bytes;
    nc_step_t *steps;                /* [sched->nsteps] */
    nc_myop_t *myops;
    uint32_t nmyops, myops_cap;
    nc_rseg_t *rsegs;
    uint32_t nrsegs, rsegs_cap;
    uint32_t seg_lo, seg_hi;         /* receiver: its run of m->segs (all of them) */
    void **bound_land;               /* receiver: the land pointers the steps were built for */
    uint64_t *sums;                  /* receiver: [nrsegs] what landed, hashed */
    uint8_t *host;                   /* verify and faults: host copies */
    size_t host_cap;
    uint64_t bytes_total;            /* receiver: landing bytes per version */
    /* FP8 on the wire (sender): every step's quantizations into its slot, set up once */
    uint32_t nquant;
    wsync_kquant_t *quant;           /* [nquant] */
    void **qws;                      /* [nquant] workspaces, consecutive in qws_dev (each step's
                                        run one block, as wsync_dev_quantize_check takes it) */
    void *qws_dev;                   /* nquant * WSYNC_KQUANT_WS_BYTES of device memory, zeroed */
    uint32_t *qchunk;                /* [nquant] plan chunk of each */
    uint64_t *qoff;                  /* [nquant] its place in the slot */
    wsync_amax_tx_t amax_tx;         /* sender: per-tensor FP8 sets (schemes/wire_amax.h), built
                                        at bind; their quant entries read amax_tx.dev */
    uint64_t *tx_sum;                /* sender, verify: [nchunks] this version's checksums */
    uint8_t *tx_have;                /* [nchunks] 1: tx_sum set */
    /* FP8 on the wire: no receiver may finish a version before the NaN/Inf check of every FP8
     * chunk of the senders it takes from. A sender that finds one still issues every step (its
     * peers' sends and receives complete, so nothing is left for an abort that may never
     * return: 4 x H200, 2026-11-26), then refuses the version; so every receiver that takes
     * anything from a sender with FP8 chunks waits for its PACKED relay (or, under WSYNC_VERIFY,
     * its checksums, sent after its packs), which it sends once its last such step's check
     * passed, and which the refusal never sends. */
    int64_t last_qstep;              /* sender: its last step with FP8 chunks; -1: none */
    uint8_t *packed_to;              /* sender: [nreceivers] 1: relay PACKED to it */
    uint8_t *packed_from;            /* receiver: [nsenders] 1: wait for that sender's PACKED */
    struct nc_delta *d;              /* delta mode on: schemes/nccl_delta.c; NULL: off */
} nc_state_t;

/* What delta mode keeps (schemes/nccl_delta.c). */
typedef struct nc_delta {
    uint64_t version, base;          /* the version in flight; sender: its base (0: none) */
    uint64_t *have;                  /* [nranks] this version's all-gather: bases, then holds */
    void *have_dev;                  /* [nranks] its device buffer */
    uint32_t lo, hi;                 /* sender: its chunks, plan->chunks[lo, hi) */
    uint8_t *scap;                   /* sender: [hi - lo] delta-capable (wsync_delta_tx_capable) */
    uint8_t *encd;                   /* sender: [hi - lo] encoded each version by its step */
    uint8_t **rbits;                 /* sender: [nreceivers] what each can apply (relayed) */
    uint32_t nitems;                 /* items of our ops */
    uint64_t *len, *hash;            /* [nitems] this version's tables */
    uint8_t *pat;                    /* [nitems] encoded: sender, fixed; receiver, as the table says */
    uint8_t *cpat;                   /* receiver: [nitems] the pattern its op batches were built for */
    uint32_t *eidx;                  /* sender: [nitems] index in its step's encode batch */
    uint64_t *ioff;                  /* receiver: [nitems] place in its op's area; UINT64_MAX: it
                                        cannot apply that chunk */
    void *tdev[NC_SLOTS];            /* the tables of a step: device, pinned host */
    uint8_t *thost[NC_SLOTS];
    uint64_t tbytes;
    void *ev_tab;                    /* sender: encoded; receiver: tables landed */
    uint64_t enc, plain;             /* sender, this version: bytes on the wire, encoded streams
                                        and plain chunks (a broadcast counted once) */
} nc_delta_t;

/* schemes/nccl.c */
/* Poll `ev` (step k's work), NCCL's asynchronous errors and the control plane until the member's
 * timeout; the timeout names the step's peers. */
wsync_status_t wsync_nccl_wait_ev(nc_state_t *st, void *ev, uint32_t k, uint64_t version);
/* Flip one bit of device memory [p, p + bytes) (fault injection), through the host. */
wsync_status_t wsync_nccl_flip_device(nc_state_t *st, void *p, size_t bytes);
/* st->host holds at least `bytes` (grown as needed). */
wsync_status_t wsync_nccl_host_room(nc_state_t *st, size_t bytes);

/* schemes/nccl_wire.c: FP8 on the wire */
/* Which (sender, receiver) pairs need a PACKED relay (st->last_qstep, packed_to or packed_from),
 * from the plan alone; the receiver's seg_lo/seg_hi set. */
wsync_status_t wsync_nccl_wire_packed_pairs(nc_state_t *st, const wsync_plan_t *plan);
/* Sender, once the slots exist and the steps' nquant/quant0 are counted: st->quant, qws (zeroed
 * workspaces), qchunk, qoff. */
wsync_status_t wsync_nccl_wire_sender_bind(wsync_sender_t *s, nc_state_t *st);
/* Sender, after step k's pack: WSYNC_ERR_NONFINITE (naming param and element) when one of its
 * FP8 quantizations met a NaN or Inf; with verify, the checksums of its FP8 chunks. */
wsync_status_t wsync_nccl_wire_sender_check(wsync_sender_t *s, nc_state_t *st, uint32_t k,
                                            uint64_t version);
/* Sender, before its first step: per-tensor FP8 targets' amaxes agreed with the other senders
 * (schemes/wire_amax.h) and put where the packs read them. WSYNC_ERR_NONFINITE (param, element,
 * this sender) when a part of ours holds a NaN or Inf: the exchange still went through (that set
 * counting 0 from us), and the caller issues every step before it refuses the version. */
wsync_status_t wsync_nccl_wire_tensor_amax(wsync_sender_t *s, nc_state_t *st, uint64_t version);
/* Sender: relay PACKED (the version) to every receiver in st->packed_to. */
wsync_status_t wsync_nccl_wire_send_packed(wsync_sender_t *s, nc_state_t *st, uint64_t version);
/* Receiver: the two copies (codes into the target, scales where it keeps them) of FP8 segment
 * `sg` from its place `soff` in `slot`; WSYNC_ERR_PROTOCOL when the target is not set up for it. */
wsync_status_t wsync_nccl_wire_unpack_descs(const wsync_receiver_t *r, const nc_state_t *st,
                                            const wsync_segment_t *sg, uint64_t soff, void *slot,
                                            wsync_kcopy_t out[2]);
/* Receiver, verify: xxh3 of what FP8 segment `sg` landed (codes, then scales, dense). */
wsync_status_t wsync_nccl_wire_hash_landed(const wsync_receiver_t *r, nc_state_t *st,
                                           const wsync_segment_t *sg, uint64_t *out);
/* Receiver, after its steps: wait for the PACKED relay of every sender in st->packed_from. */
wsync_status_t wsync_nccl_wire_wait_packed(wsync_receiver_t *r, nc_state_t *st, uint64_t version);

/* schemes/nccl_delta.c: delta mode's part of set-up and of each version (see nccl_delta.h) */
wsync_status_t wsync_nccl_delta_sender_setup(wsync_sender_t *s, nc_state_t *st);
wsync_status_t wsync_nccl_delta_receiver_setup(wsync_receiver_t *r, nc_state_t *st);
/* Sender: layout of the encoded chunks and tables (before the slots); receiver: the same for its
 * ops, again whenever it rebinds (frees the op batches built for the old targets). */
wsync_status_t wsync_nccl_delta_layout(nc_state_t *st, const wsync_plan_t *plan,
                                       const wsync_receiver_t *r);
/* Sender, once the slots exist: the encode batches. */
wsync_status_t wsync_nccl_delta_sender_batches(wsync_sender_t *s, nc_state_t *st);
/* Version start: the all-gather of bases and holds, and every op's mode. */
wsync_status_t wsync_nccl_delta_begin(nc_state_t *st, struct wsync_delta_tx *tx, uint64_t mine,
                                      uint64_t version);
/* Sender, step k: launch the encode (on xstream, before ev_copy), then tables. */
wsync_status_t wsync_nccl_delta_encode(wsync_sender_t *s, nc_state_t *st, uint32_t k);
wsync_status_t wsync_nccl_delta_tables(wsync_sender_t *s, nc_state_t *st, uint32_t k);
/* Receiver, step k: the tables have landed in d->thost: read them, build the op batches. */
wsync_status_t wsync_nccl_delta_read_tables(wsync_receiver_t *r, nc_state_t *st, uint32_t k);
/* Receiver, step k: its unpacks and applies, on xstream. */
wsync_status_t wsync_nccl_delta_launch(wsync_receiver_t *r, nc_state_t *st, uint32_t k);
/* Receiver, step k done: every apply's fault and hash. */
wsync_status_t wsync_nccl_delta_check(wsync_receiver_t *r, nc_state_t *st, uint32_t k);
/* NCCL buffer and bytes of item j of op o in step k, in a data pass (DELTA op). */
void wsync_nccl_delta_item_buf(const nc_state_t *st, const wsync_plan_t *plan, uint32_t k,
                               const nc_myop_t *o, uint32_t j, void **buf, size_t *bytes);
/* Free the op and step batches (not the slots). */
void wsync_nccl_delta_free_batches(nc_state_t *st);
void wsync_nccl_delta_free(nc_state_t *st);

#endif
