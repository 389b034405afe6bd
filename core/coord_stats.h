/* Internal: what the coordinator measures of its own work, for the scale test and benchmarks
 * (tests/scale, docs/scale.md). Written on the coordinator's loop thread, read from any thread. */
#ifndef WSYNC_CORE_COORD_STATS_H
#define WSYNC_CORE_COORD_STATS_H

#include <stdint.h>

typedef struct wsync_coord wsync_coord_t;

typedef struct {
    uint64_t version;                /* the last version every receiver committed (0: none) */
    /* That version, on the coordinator's monotonic clock (wsync_now_ns): the last sender's
     * PUSH_BEGIN arrived at begin_ns (BEGIN went to every receiver from then on), the last
     * receiver's COMMIT at commit_ns (DONE to every sender from then on); span_ns is their
     * difference, and bcast_ns the time spent sending the BEGINs and the DONEs. */
    uint64_t begin_ns, commit_ns, span_ns, bcast_ns;
    uint32_t participants;           /* connected (HELLO accepted) */
} wsync_coord_stats_t;

/* Figures of the last version the group completed; zeros before the first. Thread-safe. */
void wsync_coord_stats(const wsync_coord_t *coord, wsync_coord_stats_t *out);

#endif
