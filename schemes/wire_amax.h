/* Internal: per-tensor FP8 on the wire (docs/fp8_wire.md, section 5). A per-tensor target's one
 * scale comes from the amax over all of it, and its chunks come from several senders: each
 * version the senders agree on every such target's amax before they pack. The plan's per-tensor
 * chunks fall into sets (the chunks of one target; replicas of it share them, the compiler sees
 * to it: plan_fp8_mark.c), numbered 0 .. nsets - 1 in chunk order. Every sender holding a chunk
 * of some set sends its partial amaxes (one float per set, 0 where it holds none) to sender 0,
 * the coordinator's process, through the coordinator's relay; sender 0 takes the max once every
 * such sender reported and sends it back to them: one control round trip per version, only for
 * groups whose plan has per-tensor chunks. */
#ifndef WSYNC_SCHEMES_WIRE_AMAX_H
#define WSYNC_SCHEMES_WIRE_AMAX_H

#include <stdint.h>

#include "core/objects.h"
#include "reshard/plan.h"

#define WSYNC_AMAX_NONE UINT32_MAX

typedef struct {
    uint32_t nsets;
    uint32_t *set;                   /* [plan->nchunks]: the chunk's set, WSYNC_AMAX_NONE when
                                        its rule is not per-tensor */
    uint32_t *first_seg;             /* [nsets]: a segment of the set (names its target) */
    uint8_t *holds;                  /* [plan->nsenders]: 1 when the sender holds a chunk of
                                        some set */
} wsync_amax_sets_t;

/* The plan's per-tensor sets (all zero when it has none; no allocation then). */
wsync_status_t wsync_amax_sets_build(const wsync_plan_t *plan, wsync_amax_sets_t *out);
void wsync_amax_sets_free(wsync_amax_sets_t *sets);

/* The relay's payload: version, set count, then one f32 (bits) per set. Encode into buf of
 * wsync_amax_msg_bytes(nsets) bytes; decode checks the version and the count (PROTOCOL naming
 * `from` otherwise) and takes the max into acc. */
uint32_t wsync_amax_msg_bytes(uint32_t nsets);
void wsync_amax_msg_encode(uint64_t version, uint32_t nsets, const float *amax, uint8_t *buf);
wsync_status_t wsync_amax_msg_reduce(const uint8_t *buf, uint32_t len, uint64_t version,
                                     uint32_t nsets, const char *from, float *acc);

/* One version's exchange on sender s (the member m, rank `rank`): amax[nsets] holds this
 * sender's partials on entry (0 for sets it holds none of) and every set's agreed amax on
 * return (written only on success). Waits until deadline_ms; a sender lost, or one that refused
 * the version, fails the group (the coordinator's ABORT names it); a deadline passed without a
 * sender's report is TIMEOUT naming the senders not heard from. */
wsync_status_t wsync_amax_agree(wsync_member_t *m, int rank, const wsync_amax_sets_t *sets,
                                uint64_t version, int64_t deadline_ms, float *amax);

#endif
