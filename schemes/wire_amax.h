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
#include "kernels/kernels.h"
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

/* The plan's per-tensor sets (all zero when it has none; no allocation then). One pass over
 * the plan's chunks and every receiver's segments: a sender builds them once and keeps them
 * (wsync_amax_tx_t). */
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

/* A sender's side of it, built at its first version and kept: the sets, its partial amaxes
 * and, for chunks of CUDA shards, their regions for the amax kernels and the agreed amaxes on
 * the device, where the pack kernels read them (wsync_kquant_t.amax = dev + set). */
typedef struct {
    int built;
    wsync_amax_sets_t sets;
    float *amax;                     /* [nsets] host: partials, then the agreed maxima */
    uint32_t nk;                     /* our chunks of some set in CUDA shards */
    wsync_kamax_t *k;                /* [nk] their regions */
    uint32_t *kchunk;                /* [nk] their plan chunks */
    float *dev;                      /* [nsets] device (the CUDA shards' device): the partials
                                        of the CUDA chunks, then the agreed amaxes; NULL if nk 0 */
    void *dws;                       /* device workspace naming a NaN or Inf (WSYNC_KQUANT_WS_BYTES) */
} wsync_amax_tx_t;

/* Build tx for sender s (its plan, shards and their data) unless built; allocates device memory
 * on the current device when s has chunks of some set in CUDA shards. No sets: tx->sets.nsets 0,
 * nothing allocated. Not thread-safe (the sender's push thread). */
wsync_status_t wsync_amax_tx_build(wsync_amax_tx_t *tx, const wsync_sender_t *s);
void wsync_amax_tx_free(wsync_amax_tx_t *tx);
/* Only tx's host arrays (no CUDA call): for a teardown that leaks the device memory on purpose
 * (a wedged device) or never freed it; no-op after wsync_amax_tx_free. */
void wsync_amax_tx_free_host(wsync_amax_tx_t *tx);

/* One version: s's partial amax of every set into tx->amax (0 where s holds none): host shards
 * on the CPU (wsync_exec_amax_wire), CUDA shards by wsync_kernels_amax_many on `stream`, copied
 * back (waiting up to deadline_ms). A NaN or Inf is WSYNC_ERR_NONFINITE naming the param, the
 * element and sender s (the version is then refused; nothing sent); tx->amax is complete even
 * then, for a scheme that must still take part in the exchange and its transfers before it
 * refuses (nccl): a set holding one keeps the max of its other host chunks (a host chunk's NaN
 * is skipped; a CUDA one drops the GPU's partial of the set, all its CUDA chunks). Harmless:
 * the version is refused, so that amax packs nothing kept. */
wsync_status_t wsync_amax_tx_partials(wsync_amax_tx_t *tx, const wsync_sender_t *s,
                                      uint64_t version, void *stream, int64_t deadline_ms);

/* The agreed amaxes (tx->amax, from wsync_amax_agree) to tx->dev on `stream`, before the packs
 * that read them are enqueued on it. No-op without CUDA chunks. */
wsync_status_t wsync_amax_tx_upload(wsync_amax_tx_t *tx, void *stream);

#endif
