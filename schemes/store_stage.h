/* Internal: the store's staging ring, for readers whose targets are in memory the transport
 * cannot land in (CUDA memory: gets land in host memory only, transports/rma.h).
 *
 * A few host buffers (slots, pinned by the caller) take turns: gets land in the current slot;
 * when it is full it is sealed (the caller's land callback waits for its gets), its bytes start
 * on their way to their destinations (the copier's copies, asynchronous: cudaMemcpy2DAsync on a
 * stream), and the next slot is taken once the copies out of it last time are done. So the
 * network fills slot k + 1 while slot k is copied to the GPU.
 *
 * The ring knows nothing of CUDA or of the transport: both come in as callbacks, which is what
 * lets tests/unit/test_store_stage.c drive it with host copies that are held back until waited
 * for (a slot reused too early shows as wrong bytes). Not thread-safe: one reader thread. */
#ifndef WSYNC_SCHEMES_STORE_STAGE_H
#define WSYNC_SCHEMES_STORE_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "wsync/wsync.h"

typedef struct {
    /* Start a copy of `rows` rows of `width` bytes from host src (row pitch spitch) to dst
     * (pitch dpitch), out of slot `slot`; it may run on after this returns. */
    wsync_status_t (*copy)(void *arg, int slot, void *dst, size_t dpitch, const void *src,
                           size_t spitch, size_t width, size_t rows);
    /* Every copy started out of `slot` so far is to be waited for by wait(slot). */
    wsync_status_t (*mark)(void *arg, int slot);
    /* Until the copies marked on `slot` are done, or deadline_ms (wsync_now_ms clock). */
    wsync_status_t (*wait)(void *arg, int slot, int64_t deadline_ms);
    void *arg;
} wsync_stage_copier_t;

/* Wait until every byte posted into the current slot has landed there (the store: flush). */
typedef wsync_status_t (*wsync_stage_land_fn)(void *arg);

typedef struct {
    uint8_t *src;                    /* in a slot */
    size_t spitch;
    void *dst;
    size_t dpitch, width, rows;
} wsync_stage_move_t;

typedef struct {
    uint8_t *const *slots;           /* [nslots] the caller's host buffers, slot_bytes each */
    int nslots;
    size_t slot_bytes;
    wsync_stage_copier_t cp;
    wsync_stage_land_fn land;
    void *land_arg;
    int cur;                         /* the slot being filled */
    size_t used;                     /* its bytes taken */
    uint8_t *busy;                   /* [nslots] copies out of it marked, not yet waited */
    wsync_stage_move_t *moves;       /* the current slot's moves, started when it is sealed */
    size_t nmoves, cap;
    uint64_t sealed;                 /* slots sealed so far (for tests and logs) */
} wsync_stage_t;

/* A ring over the caller's nslots (>= 1) buffers of slot_bytes (> 0) each. */
wsync_status_t wsync_stage_init(wsync_stage_t *sg, uint8_t *const *slots, int nslots,
                                size_t slot_bytes, const wsync_stage_copier_t *cp,
                                wsync_stage_land_fn land, void *land_arg);
void wsync_stage_free(wsync_stage_t *sg);

/* Room for `bytes` (1 to slot_bytes) in the current slot, at *out: when it does not fit, the
 * slot is sealed and the next one taken first. The caller posts its gets there, then says where
 * those bytes go with wsync_stage_move. */
wsync_status_t wsync_stage_take(wsync_stage_t *sg, size_t bytes, int64_t deadline_ms,
                                uint8_t **out);
/* Once landed, `rows` rows of `width` bytes at src (in the current slot, pitch spitch) go to dst
 * (pitch dpitch). */
wsync_status_t wsync_stage_move(wsync_stage_t *sg, uint8_t *src, size_t spitch, void *dst,
                                size_t dpitch, size_t width, size_t rows);
/* Rows of `width` bytes, `spitch` bytes apart at the source (a column slice of a row-major
 * shard when spitch > width), are read as spans when the gap between them is at most gap_max
 * bytes: one get of several rows with their gaps, scattered by the ring's move, instead of one
 * get per row. A get costs a fixed overhead beside its bytes (a request and a completion on
 * both sides), so a span pays when the gap's bytes take less time than that overhead. */
int wsync_stage_spans(size_t width, size_t spitch, size_t gap_max);
/* How many of `rows` rows (from the first) one span of at most room bytes holds:
 * (n - 1) * spitch + width <= room; 0 when not even one row fits. */
uint64_t wsync_stage_span_rows(size_t width, size_t spitch, uint64_t rows, size_t room);

/* One get of len bytes at source address `from` into dst (in a slot). */
typedef wsync_status_t (*wsync_stage_get_fn)(void *arg, uint64_t from, uint8_t *dst, size_t len);

/* `rows` rows of `width` bytes at source address `from` (row pitch spitch >= width, bytes) to
 * dst (pitch dpitch) through the ring: as spans of rows (contiguous rows, or gaps of at most
 * gap_max: wsync_stage_spans), each one get into a slot; else as many whole rows per slot as fit,
 * one get each; rows longer than a slot in slot-sized pieces. */
wsync_status_t wsync_stage_rows(wsync_stage_t *sg, wsync_stage_get_fn get, void *get_arg,
                                uint64_t from, size_t spitch, size_t width, uint64_t rows,
                                uint8_t *dst, size_t dpitch, size_t gap_max, int64_t deadline_ms);
/* Seal the current slot (if anything is in it) and wait for every copy: then every move made
 * has reached its destination. */
wsync_status_t wsync_stage_finish(wsync_stage_t *sg, int64_t deadline_ms);
/* After a failure: forget unsealed moves, and wait (ignoring errors, up to the deadline) for
 * the copies started, so that no slot is written or read once this returns. */
void wsync_stage_abandon(wsync_stage_t *sg, int64_t deadline_ms);

#endif
