/* What the plan compiler (plan.c) and the plan's wire form (plan_wire.c) share; not for other
 * modules (they use reshard/plan.h). */
#ifndef WSYNC_RESHARD_PLAN_INTERNAL_H
#define WSYNC_RESHARD_PLAN_INTERNAL_H

#include "reshard/plan.h"

#include "core/util.h"

#include <stdint.h>

/* Order of (rank, index) pairs: by rank, then by index; -1, 0 or 1. */
static inline int cmp_rank_index(uint32_t ra, uint32_t ia, uint32_t rb, uint32_t ib)
{
    if (ra != rb)
        return ra < rb ? -1 : 1;
    if (ia != ib)
        return ia < ib ? -1 : 1;
    return 0;
}

/* Last element of a region plus one; 0 on overflow (a region always has rows, cols >= 1). */
static inline uint64_t region_end(const wsync_region_t *r)
{
    uint64_t v;

    if (wsync_mul_u64(r->rows - 1, r->pitch, &v) != 0 || wsync_add_u64(v, r->off, &v) != 0 ||
        wsync_add_u64(v, r->cols, &v) != 0)
        return 0;
    return v;
}

/* rows, cols >= 1, pitch >= cols (rows > 1), and the end fits in 64 bits. */
static inline int region_sane(const wsync_region_t *g)
{
    return g->rows >= 1 && g->cols >= 1 && (g->rows == 1 || g->pitch >= g->cols) &&
           region_end(g) != 0;
}

/* Bytes of a chunk in its bucket (rows x cols elements of its dtype, or its FP8 form). */
static inline uint64_t chunk_bytes(const wsync_chunk_t *ch)
{
    return wsync_chunk_wire_bytes(ch);
}

/* Ranks in [1, WSYNC_PLAN_MAX_RANKS] with their product at most WSYNC_PLAN_MAX_PAIRS, and
 * bucket_bytes in [WSYNC_PLAN_MIN_BUCKET, WSYNC_PLAN_MAX_BUCKET]; otherwise `code` (INVALID when
 * compiling, PROTOCOL when decoding) with a message naming the numbers. In plan.c. */
wsync_status_t wsync_plan_check_limits(uint32_t nsenders, uint32_t nreceivers,
                                       uint64_t bucket_bytes, wsync_status_t code);

/* Set plan->fingerprint: the xxh3-64 of the plan's encoded body, as wsync_plan_encode appends
 * it, hashed block by block without holding the encoding. WSYNC_ERR_NOMEM on allocation failure
 * (plan unchanged). In plan_wire.c. */
wsync_status_t wsync_plan_fingerprint(wsync_plan_t *plan);

#endif
