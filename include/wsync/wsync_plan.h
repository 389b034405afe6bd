/*
 * Plan summaries (part of the public API; included by wsync.h).
 *
 * What a group's plan would move, computed from the descriptions alone, with no connection and
 * no memory: the bytes on every (sender, receiver) link, what each sender stages, the number of
 * chunks, segments and buckets, and the plan's fingerprint. Tools (wsync-plan) and benchmarks use
 * it to print the floor a sync cannot beat, before any trainer or engine starts.
 *
 * Bytes *moved* are counted as they travel: in the params' dtype (what the senders hold), or,
 * with FP8 on the wire (docs/fp8_wire.md), as the FP8 codes and fp32 scales the senders make for
 * FP8 targets whose every chunk lies on whole cells. Bytes *landed* are what the receiver's
 * targets then hold.
 */
#ifndef WSYNC_PLAN_H
#define WSYNC_PLAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How a target's bytes travel (wsync_plan_summary_t.target_form). An FP8 target with block or
 * channel scales travels as FP8 codes and scales made by its senders only whole: every chunk of
 * it must lie on whole cells, and feed no target that travels otherwise. */
typedef enum {
    WSYNC_WIRE_PLAIN = 0,        /* not an FP8 target with scales: its params' values travel */
    WSYNC_WIRE_FP8 = 1,          /* FP8 codes and fp32 scales, made by the senders */
    WSYNC_WIRE_CUT_CELLS = 2,    /* FP8 target, plain: a chunk does not lie on whole cells (FSDP
                                    rows or fused pieces cut a cell), or a row of its cells does
                                    not fit a bucket; its receiver quantizes */
    WSYNC_WIRE_SHARED = 3,       /* FP8 target, plain: a chunk of it also feeds a target that
                                    travels plain or under another rule (dtype, scales, knobs) */
    WSYNC_WIRE_PER_TENSOR = 4,   /* FP8 target with one scale (WSYNC_QUANT_TENSOR), plain: compiled
                                    without FP8 on the wire, or a chunk of it shared with another
                                    target or padding; with it such targets travel FP8, their
                                    senders agreeing on the amax each version (ipc, host memory) */
    WSYNC_WIRE_OFF = 5,          /* FP8 target, plain: compiled without FP8 on the wire */
    WSYNC_WIRE_UNCOVERED = 6,    /* FP8 target, plain: padding no piece covers, or a piece of a
                                    param that is not bf16, f16 or f32 */
    WSYNC_WIRE_NFORMS = 7        /* the number of forms (the size of the arrays below) */
} wsync_wire_form_t;

/* Arrays are owned by the summary and freed with it. Pair arrays are sender-major:
 * element [s * nreceivers + r] is about sender s and receiver r. */
typedef struct {
    int nsenders, nreceivers;
    uint64_t bucket_bytes;                /* the bucket size the plan was compiled for */
    uint64_t *pair_bytes;                 /* [nsenders * nreceivers] bytes moved from s to r */
    uint64_t *bytes_per_receiver;         /* [nreceivers] bytes moved into r (sum over senders) */
    uint64_t *bytes_landed_per_receiver;  /* [nreceivers] bytes written into r's targets per
                                             version: covered elements x target dtype size, plus
                                             4 bytes per fp32 scale of FP8 targets; padding that
                                             no piece covers is zeroed once and not counted */
    uint64_t *bytes_per_sender;           /* [nsenders] bytes moved out of s (sum over receivers;
                                             point to point: a chunk several receivers need
                                             counts once per receiver) */
    uint64_t *staged_bytes_per_sender;    /* [nsenders] bytes s packs into its buckets per
                                             version (sum of each bucket's used bytes) */
    uint64_t *buckets_per_sender;         /* [nsenders] buckets in s's schedule */
    uint64_t total_bytes;                 /* sum of pair_bytes */
    uint64_t total_landed_bytes;          /* sum of bytes_landed_per_receiver */
    uint64_t total_staged_bytes;          /* sum of staged_bytes_per_sender */
    uint64_t nchunks, nsegments;
    uint64_t fingerprint;                 /* the plan's xxh3-64, as the coordinator would log it */
    uint64_t wire_bytes;                  /* the encoded plan the coordinator sends (PLAN) */
    int wire_checked;                     /* 1: WSYNC_PLAN_WIRE_CHECK=1 was set, and the plan
                                             went through encode -> decode -> every sender's and
                                             receiver's check, and came back the same plan */
    double wire_check_seconds;            /* wall time of that check */
    /* FP8 on the wire. Bytes below are counted per segment, as pair_bytes are (a chunk that two
     * targets take counts twice); form_bytes sum to total_bytes. */
    int fp8_wire;                         /* 1: compiled with FP8 on the wire allowed */
    uint64_t fp8_wire_bytes;              /* bytes that travel as FP8 codes and scales
                                             (form_bytes[WSYNC_WIRE_FP8]) */
    uint64_t form_bytes[WSYNC_WIRE_NFORMS];        /* bytes moved into targets of each form */
    uint64_t form_param_bytes[WSYNC_WIRE_NFORMS];  /* the same elements in the params' dtype:
                                                      what they would take travelling plain */
    uint64_t total_param_bytes;           /* total_bytes with every chunk plain (sum of
                                             form_param_bytes) */
    size_t ntargets;                      /* the targets summarized, in the order given */
    int32_t *target_form;                 /* [ntargets] a wsync_wire_form_t each */
    uint64_t *target_bytes;               /* [ntargets] bytes moved into each target */
    uint64_t *target_param_bytes;         /* [ntargets] the same in the params' dtype */
} wsync_plan_summary_t;

/* Compile the plan the coordinator would compile for these shards and targets, and summarize it
 * (FP8 on the wire off: every chunk travels in its param's dtype; wsync_plan_summarize_wire
 * chooses).
 *
 * shards[i] belongs to sender shard_sender[i] and targets[j] to receiver target_receiver[j]
 * (ranks in [0, nsenders) and [0, nreceivers)); a NULL rank array puts every shard (target) on
 * rank 0. Within a rank, descriptions are indexed in array order, as if added in that order.
 * Only geometry matters: `data` may be NULL in shards and targets, and is never read.
 * bucket_bytes: staging bucket size (0: 256 MiB, the senders' default).
 *
 * Returns WSYNC_OK and *summary (owned by the caller: wsync_plan_summary_free);
 * WSYNC_ERR_INVALID for a NULL argument, a rank out of range or a malformed description
 * (the message names the shard or target and the field); otherwise the plan compiler's own
 * error, with its message (WSYNC_ERR_MISMATCH naming the param and receiver for a piece no
 * sender covers, and so on). *summary is written only on success.
 * Allocates memory proportional to the plan; no other state: thread-safe.
 * With WSYNC_PLAN_WIRE_CHECK=1 in the environment it also encodes the plan, decodes it, checks
 * the decoded plan is the same and passes every sender's and receiver's own check against the
 * descriptions (what participants do with the PLAN message), and fails with that error if not;
 * wire_checked says it ran. */
wsync_status_t wsync_plan_summarize(const wsync_shard_t *shards, const int *shard_sender,
                                    size_t nshards, const wsync_target_t *targets,
                                    const int *target_receiver, size_t ntargets, int nsenders,
                                    int nreceivers, size_t bucket_bytes,
                                    wsync_plan_summary_t **summary);

/* wsync_plan_summarize with FP8 on the wire chosen: fp8_wire 1 compiles the plan an ipc or nccl
 * group compiles by default (senders quantize the chunks of FP8 targets with block, channel or
 * per-tensor scales where the plan allows; per-tensor ones on ipc and nccl, where the senders
 * agree on each target's amax; wsync_sender_params_t.fp8_wire), 0 the plan of the
 * store, of delta versions or of fp8_wire = 0 (everything travels plain). wsync_plan_summarize
 * is this with fp8_wire 0. Other values: WSYNC_ERR_INVALID. The rest as wsync_plan_summarize. */
wsync_status_t wsync_plan_summarize_wire(const wsync_shard_t *shards, const int *shard_sender,
                                         size_t nshards, const wsync_target_t *targets,
                                         const int *target_receiver, size_t ntargets,
                                         int nsenders, int nreceivers, size_t bucket_bytes,
                                         int fp8_wire, wsync_plan_summary_t **summary);

/* Free a summary and its arrays. NULL is a no-op. */
void wsync_plan_summary_free(wsync_plan_summary_t *summary);

#ifdef __cplusplus
}
#endif

#endif
