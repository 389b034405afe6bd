/* Plan compiler: the driver of its passes, its limits, its memory, and freeing a plan. The
 * passes are in plan_index.c (1), plan_map.c (2), plan_fp8_mark.c (2b: FP8 on the wire) and
 * plan_layout.c (3 and 4), their state (compile_t) in plan_internal.h; the plan's wire form
 * (encoding, fingerprint, decoding) is in plan_wire.c; the checks of a plan against a
 * participant's own descriptions in plan_check.c.
 *
 * Compilation, in four passes:
 *  1. shards are grouped by param name (all senders must agree on dtype and shape); the non-empty
 *     boxes of each param are grouped into distinct boxes, each with its replicas, and distinct
 *     boxes are checked to be disjoint;
 *  2. every piece of every target is intersected with its param's distinct boxes; each
 *     intersection becomes one or more 2-D regions: a *logical chunk* (source side, shared by
 *     every receiver that needs the same region of the same box) and a *logical segment* (one
 *     receiver's destination);
 *  3. each sender's logical chunks are laid out in buckets, split by rows (or, for a row larger
 *     than a bucket, by columns) where a bucket ends; segments are split alongside;
 *  4. segments are written once per list that targets share (a target laid out like an
 *     earlier one takes its list), each receiver naming its (target, list) references; a
 *     receiver's segments are its lists merged by chunk (plan_lists.c). Bucket use is summed
 *     while pass 3 lays chunks, pair bytes from the lists (the decoder derives both, so they
 *     never travel); the fingerprint hashes the
 *     encoding (wsync_plan_fingerprint).
 */
#include "reshard/plan.h"
#include "reshard/plan_internal.h"

#include "core/status.h"
#include "core/util.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

/* ------------------------------------------------------------------------------------------ */
/* Memory                                                                                       */
/* ------------------------------------------------------------------------------------------ */

void wsync_plan_prefault(void *p, size_t bytes)
{
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
    long pg = sysconf(_SC_PAGESIZE);
    if (p != NULL && pg > 0 && bytes >= ((size_t)4 << 20)) {
        uintptr_t a = ((uintptr_t)p + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
        uintptr_t e = ((uintptr_t)p + bytes) & ~((uintptr_t)pg - 1);
        if (e > a)
            (void)madvise((void *)a, e - a, MADV_POPULATE_WRITE);
    }
#else
    (void)p;
    (void)bytes;
#endif
}

/* Free the compile state (not the plan); safe to call again. */
static void compile_release(compile_t *c)
{
    free(c->params);
    free(c->pmap);
    free(c->boxes);
    free(c->coords);
    free(c->reps);
    free(c->load);
    free(c->lchunks);
    free(c->lsegs);
    free(c->trefs);
    free(c->map);
    free(c->parts);
    free(c->part0);
    free(c->rules);
    c->rules = NULL;
    c->nrules = c->cap_rules = 0;
    c->params = NULL, c->pmap = NULL, c->boxes = NULL, c->coords = NULL, c->reps = NULL;
    c->load = NULL, c->lchunks = NULL, c->lsegs = NULL, c->map = NULL, c->parts = NULL;
    c->trefs = NULL;
    c->part0 = NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Entry points                                                                                 */
/* ------------------------------------------------------------------------------------------ */

wsync_status_t wsync_plan_check_limits(uint32_t nsenders, uint32_t nreceivers,
                                       uint64_t bucket_bytes, wsync_status_t code)
{
    if (nsenders == 0 || nreceivers == 0 || nsenders > WSYNC_PLAN_MAX_RANKS ||
        nreceivers > WSYNC_PLAN_MAX_RANKS ||
        (uint64_t)nsenders * nreceivers > WSYNC_PLAN_MAX_PAIRS)
        return wsync_err(code, "plan: %u senders and %u receivers (each must be in [1, %u], their "
                         "product at most %u)", nsenders, nreceivers, WSYNC_PLAN_MAX_RANKS,
                         WSYNC_PLAN_MAX_PAIRS);
    if (bucket_bytes < WSYNC_PLAN_MIN_BUCKET || bucket_bytes > WSYNC_PLAN_MAX_BUCKET)
        return wsync_err(code, "plan: bucket of %" PRIu64 " bytes (must be in [%u, %" PRIu64 "])",
                         bucket_bytes, WSYNC_PLAN_MIN_BUCKET, (uint64_t)WSYNC_PLAN_MAX_BUCKET);
    return WSYNC_OK;
}

wsync_status_t wsync_plan_compile(const wsync_shard_desc_t *shards, size_t nshards,
                                  const wsync_target_desc_t *targets, size_t ntargets,
                                  uint32_t nsenders, uint32_t nreceivers, uint64_t bucket_bytes,
                                  wsync_plan_t **plan)
{
    return wsync_plan_compile_opts(shards, nshards, targets, ntargets, nsenders, nreceivers,
                                   bucket_bytes, NULL, plan);
}

wsync_status_t wsync_plan_compile_opts(const wsync_shard_desc_t *shards, size_t nshards,
                                       const wsync_target_desc_t *targets, size_t ntargets,
                                       uint32_t nsenders, uint32_t nreceivers,
                                       uint64_t bucket_bytes, const wsync_plan_opts_t *opts,
                                       wsync_plan_t **plan)
{
    compile_t c;
    wsync_status_t st;

    if (plan == NULL || (nshards > 0 && shards == NULL) || (ntargets > 0 && targets == NULL))
        return wsync_err(WSYNC_ERR_INVALID, "plan: NULL argument");
    if ((st = wsync_plan_check_limits(nsenders, nreceivers, bucket_bytes, WSYNC_ERR_INVALID)) !=
        WSYNC_OK)
        return st;
    if (nshards >= UINT32_MAX || ntargets >= UINT32_MAX)
        return wsync_err(WSYNC_ERR_RANGE, "plan: %zu shards, %zu targets", nshards, ntargets);

    memset(&c, 0, sizeof(c));
    c.shards = shards;
    c.nshards = nshards;
    c.targets = targets;
    c.ntargets = ntargets;
    c.nsenders = nsenders;
    c.nreceivers = nreceivers;
    c.bucket_bytes = bucket_bytes;
    c.fp8_wire = opts != NULL && opts->fp8_wire;
    c.fp8_tensor = c.fp8_wire && opts->fp8_tensor;
    c.plan = calloc(1, sizeof(*c.plan));
    c.load = calloc(nsenders, sizeof(*c.load));
    if (c.plan == NULL || c.load == NULL || wsync_plan_map_grow(&c) != 0) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan: compile state");
        goto fail;
    }
    c.plan->nsenders = nsenders;
    c.plan->nreceivers = nreceivers;
    c.plan->bucket_bytes = bucket_bytes;

    /* nbuckets, bucket_used and pair_bytes are filled by passes 3 and 4 as they lay the chunks
     * and segments, to the values plan_derive gives a decoded plan */
    if ((st = wsync_plan_index_shards(&c)) != WSYNC_OK ||
        (st = wsync_plan_map_targets(&c)) != WSYNC_OK ||
        (st = wsync_plan_mark_wire(&c)) != WSYNC_OK ||
        (st = wsync_plan_layout_buckets(&c)) != WSYNC_OK ||
        (st = wsync_plan_split_segments(&c)) != WSYNC_OK)
        goto fail;
    c.plan->rules = c.rules;         /* the rules chunks name, in the plan's keeping */
    c.plan->nrules = c.nrules;
    c.rules = NULL;
    c.nrules = c.cap_rules = 0;

    /* the fingerprint is the xxh3-64 of the encoded body, as wsync_plan_encode appends it */
    compile_release(&c);
    if ((st = wsync_plan_fingerprint(c.plan)) != WSYNC_OK)
        goto fail;

    *plan = c.plan;
    c.plan = NULL;
    compile_release(&c);
    return WSYNC_OK;
fail:
    wsync_plan_free(c.plan);
    compile_release(&c);
    return st;
}

void wsync_plan_free(wsync_plan_t *plan)
{
    if (plan == NULL)
        return;
    free(plan->chunks);
    wsync_plan_cache_free(plan);
    free(plan->list0);
    free(plan->lsegs);
    free(plan->ref0);
    free(plan->refs);
    free(plan->rx_nsegs);
    free(plan->nbuckets);
    free(plan->bucket_used);
    free(plan->pair_bytes);
    free(plan->rules);
    free(plan);
}
