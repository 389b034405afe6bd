/* plan_sim: run a plan in one process, with no networking, the way senders and receivers would.
 *
 * Give it every sender's shards (public wsync_shard_t, with data) and every receiver's targets
 * (public wsync_target_t, with buffers); plan_sim_run then
 *   1. turns them into descriptions (wsync_shard_desc_from / wsync_target_desc_from, index = add
 *      order within the rank), sends them through their wire codec, and compiles the plan from
 *      the decoded copies, as the coordinator does;
 *   2. encodes and decodes the plan, and checks the decoded copy against the original (same bytes
 *      when encoded again, same fingerprint);
 *   3. runs wsync_plan_check_sender / _receiver for every rank with its own descriptions;
 *   4. zero-fills the bytes of every target that no piece covers (wsync_exec_zero_uncovered);
 *   5. for each sender and each of its buckets: poisons a scratch bucket (0xA5), packs the
 *      bucket's chunks from shard memory, and unpacks every segment of those chunks into the
 *      targets (wsync_exec_unpack, casting to the target dtype);
 *   6. verifies that every element of every piece's destination was written exactly once and
 *      nothing else was (WSYNC_ERR_INTERNAL with a message otherwise).
 * Host memory only. FP8 targets fed from float params fail with WSYNC_ERR_UNSUPPORTED (the
 * receiver quantizes from a staging buffer; the CPU executor does not).
 *
 * Errors from any step are returned as they are (the compile errors in particular: an unknown
 * param, a mismatch...), with wsync_last_error() set. Not thread-safe; one sim per thread.
 *
 *     plan_sim_t *sim = plan_sim_new(2, 1, 4096);
 *     plan_sim_add_shard(sim, 0, &shard0);        // sender 0
 *     plan_sim_add_shard(sim, 1, &shard1);        // sender 1
 *     plan_sim_add_target(sim, 0, &target);       // receiver 0
 *     CHECK_OK(plan_sim_run(sim, &stats));        // target.data now holds its slice
 *     plan_sim_free(sim);
 */
#ifndef WSYNC_TEST_PLAN_SIM_H
#define WSYNC_TEST_PLAN_SIM_H

#include "reshard/plan.h"

typedef struct plan_sim plan_sim_t;

typedef struct {
    uint64_t fingerprint;
    uint32_t nchunks, nsegments;
    uint64_t nbuckets;          /* over all senders */
    uint64_t staged_bytes;      /* bytes packed into buckets, all senders (each chunk once) */
    uint64_t delivered_bytes;   /* bytes unpacked into targets, all receivers (param dtype) */
} plan_sim_stats_t;

/* A sim for nsenders senders and nreceivers receivers with buckets of bucket_bytes.
 * NULL when out of memory. Free with plan_sim_free. */
plan_sim_t *plan_sim_new(uint32_t nsenders, uint32_t nreceivers, uint64_t bucket_bytes);

/* Free the sim and its plan. NULL is a no-op. */
void plan_sim_free(plan_sim_t *sim);

/* Add a shard of `sender` (its index is the number of shards that sender already has). The
 * description is copied and validated now (WSYNC_ERR_INVALID from wsync_shard_desc_from);
 * shard->data must stay valid until plan_sim_run returns. */
wsync_status_t plan_sim_add_shard(plan_sim_t *sim, uint32_t sender, const wsync_shard_t *shard);

/* Add a target of `receiver`; as above. target->data is written by plan_sim_run. */
wsync_status_t plan_sim_add_target(plan_sim_t *sim, uint32_t receiver,
                                   const wsync_target_t *target);

/* Compile and run, as described at the top. Once per sim. stats may be NULL. */
wsync_status_t plan_sim_run(plan_sim_t *sim, plan_sim_stats_t *stats);

/* The compiled plan (valid after a successful run, until plan_sim_free); NULL before. */
const wsync_plan_t *plan_sim_plan(const plan_sim_t *sim);

/* One call for simple cases: shards[i] belongs to sender shard_sender[i], targets[j] to receiver
 * target_receiver[j]. If plan is not NULL, *plan receives a copy of the plan (decoded from its
 * encoding; free with wsync_plan_free). */
wsync_status_t plan_sim_run_all(const wsync_shard_t *shards, const uint32_t *shard_sender,
                                size_t nshards, const wsync_target_t *targets,
                                const uint32_t *target_receiver, size_t ntargets,
                                uint32_t nsenders, uint32_t nreceivers, uint64_t bucket_bytes,
                                plan_sim_stats_t *stats, wsync_plan_t **plan);

#endif
