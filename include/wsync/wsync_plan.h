/*
 * Plan summaries (part of the public API; included by wsync.h).
 *
 * What a group's plan would move, computed from the descriptions alone, with no connection and
 * no memory: the bytes on every (sender, receiver) link, what each sender stages, the number of
 * chunks, segments and buckets, and the plan's fingerprint. Tools (wsync-plan) and benchmarks use
 * it to print the floor a sync cannot beat, before any trainer or engine starts.
 *
 * Bytes *moved* are counted in the params' dtype (what the senders hold), because that is what
 * travels in this version: a receiver that wants an FP8 target takes the param's bf16 bytes and
 * quantizes them itself. Bytes *landed* are what the receiver's targets then hold.
 */
#ifndef WSYNC_PLAN_H
#define WSYNC_PLAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

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
} wsync_plan_summary_t;

/* Compile the plan the coordinator would compile for these shards and targets, and summarize it.
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

/* Free a summary and its arrays. NULL is a no-op. */
void wsync_plan_summary_free(wsync_plan_summary_t *summary);

#ifdef __cplusplus
}
#endif

#endif
