/* Delta versions, receiver side (core/delta_state.h): which segments can take a delta, and
 * applying and checking an encoded chunk in host memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/delta.h"
#include "core/delta_state.h"
#include "core/log.h"
#include "core/status.h"

struct wsync_delta_rx {
    uint32_t s0, s1;                 /* our segments: r->m.segs[s0, s1), all of them */
    uint8_t *seg_ok;                 /* [s1 - s0] */
    uint8_t *chunk_ok;               /* [plan->nchunks] every segment of ours from it is capable */
};

wsync_status_t wsync_delta_rx_create(wsync_receiver_t *r, int host_only, wsync_delta_rx_t **out)
{
    const wsync_plan_t *plan = r->m.plan;
    uint32_t me = (uint32_t)r->m.rank, capable = 0, n;
    wsync_delta_rx_t *rx = calloc(1, sizeof(*rx));

    if (rx == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "delta: no memory");
    rx->s0 = 0;
    rx->s1 = r->m.nsegs;
    n = rx->s1 - rx->s0;
    rx->seg_ok = calloc((size_t)n + 1, 1);
    rx->chunk_ok = calloc((size_t)plan->nchunks + 1, 1);
    if (rx->seg_ok == NULL || rx->chunk_ok == NULL) {
        wsync_delta_rx_free(rx);
        return wsync_err(WSYNC_ERR_NOMEM, "delta: no memory");
    }
    /* a chunk is ours as delta only if all its segments are: set, then clear on any that is not */
    for (uint32_t i = rx->s0; i < rx->s1; i++)
        rx->chunk_ok[r->m.segs[i].chunk] = 1;
    for (uint32_t i = rx->s0; i < rx->s1; i++) {
        const wsync_segment_t *sg = &r->m.segs[i];
        const wsync_chunk_t *c = &plan->chunks[sg->chunk];
        const wsync_target_desc_t *t = &r->targets[sg->target];
        int ok = t->dtype == c->dtype && !wsync_target_quantized(t->dtype, t->quant) &&
                 r->land[sg->target] == r->target_data[sg->target] &&
                 (!host_only || t->mem == WSYNC_MEM_HOST);
        rx->seg_ok[i - rx->s0] = (uint8_t)ok;
        if (!ok)
            rx->chunk_ok[sg->chunk] = 0;
    }
    for (uint32_t i = rx->s0; i < rx->s1; i++)
        capable += rx->chunk_ok[r->m.segs[i].chunk];
    WSYNC_LOG_I("delta: receiver %u: %u of %u segments can take deltas (the rest: casts, quantized "
                "FP8 targets%s take full bytes)", me, capable, n,
                host_only ? ", CUDA targets" : "");
    *out = rx;
    return WSYNC_OK;
}

void wsync_delta_rx_free(wsync_delta_rx_t *rx)
{
    if (rx == NULL)
        return;
    free(rx->seg_ok);
    free(rx->chunk_ok);
    free(rx);
}

int wsync_delta_rx_seg_capable(const wsync_delta_rx_t *rx, uint32_t seg)
{
    return rx != NULL && seg >= rx->s0 && seg < rx->s1 && rx->seg_ok[seg - rx->s0];
}

int wsync_delta_rx_chunk_capable(const wsync_delta_rx_t *rx, uint32_t chunk)
{
    return rx != NULL && rx->chunk_ok[chunk];
}

int wsync_delta_rx_takes(const wsync_receiver_t *r, const wsync_delta_rx_t *rx, uint64_t base,
                         uint32_t chunk)
{
    return base != 0 && r->delta_holds == base && wsync_delta_rx_chunk_capable(rx, chunk);
}

/* What a check's errors name: the receiver, the version, the chunk and its sender. */
static const char *check_what(const wsync_receiver_t *r, uint32_t chunk, uint64_t version,
                              char *what, size_t cap)
{
    snprintf(what, cap, "receiver %d, version %llu: chunk %u from sender %u", r->m.rank,
             (unsigned long long)version, chunk, r->m.plan->chunks[chunk].sender);
    return what;
}

static uint64_t chunk_elems(const wsync_receiver_t *r, uint32_t chunk)
{
    return r->m.plan->chunks[chunk].src.rows * r->m.plan->chunks[chunk].src.cols;
}

wsync_status_t wsync_delta_rx_check(const wsync_receiver_t *r, uint32_t chunk, const void *enc,
                                    uint64_t len, uint64_t version)
{
    char what[160];

    return wsync_delta_check(enc, len, chunk_elems(r, chunk),
                             (uint32_t)wsync_dtype_size(r->m.plan->chunks[chunk].dtype),
                             check_what(r, chunk, version, what, sizeof(what)));
}

wsync_status_t wsync_delta_rx_check_blocks(const wsync_receiver_t *r, uint32_t chunk,
                                           const void *enc, uint64_t len, uint64_t version,
                                           uint64_t b0, uint64_t b1, uint64_t *payload)
{
    char what[160];

    return wsync_delta_check_blocks(enc, len, chunk_elems(r, chunk),
                                    (uint32_t)wsync_dtype_size(r->m.plan->chunks[chunk].dtype),
                                    b0, b1, check_what(r, chunk, version, what, sizeof(what)),
                                    payload);
}

wsync_status_t wsync_delta_rx_check_area(const wsync_receiver_t *r, uint32_t chunk, uint64_t len,
                                         uint64_t version, uint64_t payload)
{
    char what[160];

    return wsync_delta_check_area(len, chunk_elems(r, chunk), payload,
                                  check_what(r, chunk, version, what, sizeof(what)));
}

wsync_status_t wsync_delta_rx_hash_error(const wsync_receiver_t *r, uint32_t seg, uint64_t want,
                                         uint64_t got, uint64_t version)
{
    const wsync_segment_t *sg = &r->m.segs[seg];
    const wsync_chunk_t *c = &r->m.plan->chunks[sg->chunk];
    const wsync_target_desc_t *t = &r->targets[sg->target];

    if (want == got)
        return WSYNC_OK;
    return wsync_err(WSYNC_ERR_INTEGRITY, "receiver %d: version %llu refused: param '%s' (target "
                     "'%s') from sender %u, chunk %u (%llu x %llu %s), applied as a delta against "
                     "version %llu: the sender's xxh3 tree hash of the new values is %016llx, the "
                     "target's is %016llx", r->m.rank, (unsigned long long)version,
                     t->pieces[sg->piece].param.name, t->name, c->sender, sg->chunk,
                     (unsigned long long)c->src.rows, (unsigned long long)c->src.cols,
                     wsync_dtype_name(c->dtype), (unsigned long long)r->delta_holds,
                     (unsigned long long)want, (unsigned long long)got);
}

wsync_status_t wsync_delta_rx_apply(wsync_receiver_t *r, uint32_t seg, const void *enc,
                                    uint64_t len, uint64_t hash, uint64_t version)
{
    const wsync_segment_t *sg = &r->m.segs[seg];
    const wsync_chunk_t *c = &r->m.plan->chunks[sg->chunk];
    uint64_t got = 0;
    wsync_status_t rc;

    rc = wsync_delta_apply(enc, len, r->land[sg->target], &sg->dst,
                           (uint32_t)wsync_dtype_size(c->dtype), &got);
    if (rc != WSYNC_OK)
        return rc;
    return wsync_delta_rx_hash_error(r, seg, hash, got, version);
}
