/* The checks of a plan against a participant's own descriptions: a sender's chunks against its
 * shards (wsync_plan_check_sender), a receiver's segments against its targets
 * (wsync_plan_check_receiver). */
#include "reshard/plan.h"
#include "reshard/plan_internal.h"

#include "core/status.h"
#include "core/util.h"

#include <inttypes.h>
#include <stdlib.h>

/* A name a message can quote: never NULL. */
static const char *nm(const char *s)
{
    return s ? s : "(null)";
}

typedef struct {
    uint32_t index;
    const void *desc;
} by_index_t;

static int cmp_by_index(const void *a, const void *b)
{
    const by_index_t *x = a, *y = b;
    return x->index < y->index ? -1 : x->index > y->index;
}

static const void *lookup(const by_index_t *v, size_t n, uint32_t index)
{
    by_index_t key = {index, NULL};
    const by_index_t *hit = bsearch(&key, v, n, sizeof(*v), cmp_by_index);
    return hit ? hit->desc : NULL;
}

wsync_status_t wsync_plan_check_sender(const wsync_plan_t *plan, uint32_t rank,
                                       const wsync_shard_desc_t *shards, size_t nshards)
{
    by_index_t *v;
    size_t n = 0;
    wsync_status_t st = WSYNC_OK;

    if (plan == NULL || (nshards > 0 && shards == NULL))
        return wsync_err(WSYNC_ERR_INVALID, "plan check: NULL argument");
    if (rank >= plan->nsenders)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan has %u senders; this is sender %u",
                         plan->nsenders, rank);
    v = malloc((nshards ? nshards : 1) * sizeof(*v));
    if (v == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "plan check");
    for (size_t i = 0; i < nshards; i++)
        if (shards[i].sender == rank)
            v[n++] = (by_index_t){shards[i].index, &shards[i]};
    qsort(v, n, sizeof(*v), cmp_by_index);

    for (uint32_t i = 0; i < plan->nchunks && st == WSYNC_OK; i++) {
        const wsync_chunk_t *ch = &plan->chunks[i];
        const wsync_shard_desc_t *s;
        uint64_t vol, end;

        if (ch->sender != rank)
            continue;
        s = lookup(v, n, ch->shard);
        if (s == NULL) {
            st = wsync_err(WSYNC_ERR_PROTOCOL, "plan chunk %u reads shard %u of sender %u, which "
                           "it does not hold", i, ch->shard, rank);
            break;
        }
        if (s->param.ndim < 1 || s->param.ndim > WSYNC_MAX_DIMS ||
            !span_inside(s->param.ndim, s->box.start, s->box.len, s->param.shape)) {
            st = wsync_err(WSYNC_ERR_INVALID, "sender %u shard %u ('%s') is malformed", rank,
                           ch->shard, nm(s->param.name));
            break;
        }
        vol = box_volume(s->param.ndim, &s->box);
        end = wsync_region_end(&ch->src);
        if (ch->rule != 0 && (ch->rule > plan->nrules || !dtype_is_float(ch->dtype)))
            st = wsync_err(WSYNC_ERR_PROTOCOL, "plan chunk %u of shard %u (param '%s', %s) is to "
                           "travel quantized with FP8 rule %u of %u", i, ch->shard,
                           nm(s->param.name), wsync_dtype_name(ch->dtype), ch->rule,
                           plan->nrules);
        else if (ch->dtype != s->param.dtype || !region_sane(&ch->src) || end > vol)
            st = wsync_err(WSYNC_ERR_PROTOCOL, "plan chunk %u does not fit shard %u (param '%s', "
                           "%s, %" PRIu64 " elements): %s, elements [%" PRIu64 ", %" PRIu64 ")",
                           i, ch->shard, nm(s->param.name), wsync_dtype_name(s->param.dtype), vol,
                           wsync_dtype_name(ch->dtype), ch->src.off, end);
    }
    free(v);
    return st;
}

wsync_status_t wsync_plan_check_receiver(const wsync_plan_t *plan, uint32_t rank,
                                         const wsync_target_desc_t *targets, size_t ntargets)
{
    by_index_t *v;
    size_t n = 0;
    wsync_status_t st = WSYNC_OK;
    wsync_segment_t *mine = NULL;    /* expanded here, not kept: a check of every receiver
                                        (WSYNC_PLAN_WIRE_CHECK) holds one at a time */
    size_t cap = 0;
    uint32_t nmine;
    uint64_t first = 0;

    if (plan == NULL || (ntargets > 0 && targets == NULL))
        return wsync_err(WSYNC_ERR_INVALID, "plan check: NULL argument");
    if (rank >= plan->nreceivers)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan has %u receivers; this is receiver %u",
                         plan->nreceivers, rank);
    v = malloc((ntargets ? ntargets : 1) * sizeof(*v));
    if (v == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "plan check");
    for (size_t i = 0; i < ntargets; i++)
        if (targets[i].receiver == rank)
            v[n++] = (by_index_t){targets[i].index, &targets[i]};
    qsort(v, n, sizeof(*v), cmp_by_index);

    /* segments are named by their place in the plan, every receiver's before this one's */
    for (uint32_t q = 0; q < rank; q++)
        first += plan->rx_nsegs[q];
    if ((st = wsync_plan_segments_into(plan, rank, &mine, &cap, &nmine)) != WSYNC_OK) {
        free(v);
        return st;
    }
    for (uint32_t k = 0; k < nmine && st == WSYNC_OK; k++) {
        const wsync_segment_t *sg = &mine[k];
        const wsync_target_desc_t *t;
        const wsync_chunk_t *ch;
        uint64_t vol, end;
        uint64_t i = first + k;

        t = lookup(v, n, sg->target);
        if (t == NULL) {
            st = wsync_err(WSYNC_ERR_PROTOCOL, "plan segment %" PRIu64 " writes target %u of receiver %u, "
                           "which it does not have", i, sg->target, rank);
            break;
        }
        if (sg->chunk >= plan->nchunks) {
            st = wsync_err(WSYNC_ERR_PROTOCOL, "plan segment %" PRIu64 " names chunk %u of %u", i,
                           sg->chunk, plan->nchunks);
            break;
        }
        ch = &plan->chunks[sg->chunk];
        vol = t->ndim >= 1 && t->ndim <= WSYNC_MAX_DIMS ? shape_volume(t->ndim, t->shape) : 0;
        end = wsync_region_end(&sg->dst);
        if (sg->piece >= t->npieces || t->pieces == NULL) {
            st = wsync_err(WSYNC_ERR_PROTOCOL, "plan segment %" PRIu64 " serves piece %u of target '%s', "
                           "which has %u", i, sg->piece, nm(t->name), t->npieces);
        } else if (ch->dtype != t->pieces[sg->piece].param.dtype ||
                   !dtype_reachable(ch->dtype, t->dtype, t->quant)) {
            st = wsync_err(WSYNC_ERR_PROTOCOL, "plan segment %" PRIu64 " brings %s to target '%s' (%s), "
                           "piece %u of param '%s' (%s)", i, wsync_dtype_name(ch->dtype),
                           nm(t->name), wsync_dtype_name(t->dtype), sg->piece,
                           nm(t->pieces[sg->piece].param.name),
                           wsync_dtype_name(t->pieces[sg->piece].param.dtype));
        } else if (sg->dst.rows != ch->src.rows || sg->dst.cols != ch->src.cols ||
                   !region_sane(&sg->dst) || end > vol) {
            st = wsync_err(WSYNC_ERR_PROTOCOL, "plan segment %" PRIu64 " does not fit target '%s' (%" PRIu64
                           " elements): elements [%" PRIu64 ", %" PRIu64 ")", i, nm(t->name), vol,
                           sg->dst.off, end);
        } else {
            st = wsync_plan_check_wire_segment(plan, sg, t);
        }
    }
    free(v);
    free(mine);
    return st;
}
