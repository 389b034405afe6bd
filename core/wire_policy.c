/* When colocated ipc stages FP8 chunks (docs/fp8_wire.md, "When"). fp8-block targets, Qwen3-8B
 * shape unless named (docs/bench/sections/18_fp8_wire.md, 18_colocated_copies.md):
 *   - disaggregated FSDP-2 -> TP-2 (4 x H200): 0.58 x the bytes, 0.57-0.60 x the time: every
 *     byte crosses NVLink, so it always pays there;
 *   - colocated on 4 GPUs (4 x H200, 2026-11-27, once wsync-bench's senders allocated as a
 *     caching allocator does): three quarters of the bytes cross NVLink, which the bf16 copies
 *     then saturate (0.98-1.03 x the floor). In place, the receivers quantizing from the shards
 *     read the same bf16 over NVLink: 1.04-1.12 x bf16. Staged by the senders with 2 GiB buckets
 *     (no device slot reused within a version): 0.87-0.95 x bf16; with the 256 MiB default,
 *     whose two slots the four receivers hold in lockstep, 1.3-1.4 x.
 *     That plan moves 0.58 x the bytes. Qwen3-30B-A3B FSDP-4 -> EP-4, whose gate and up experts
 *     have cells cut between senders and travel plain, moves 0.83 x: staged 39.5-39.6 ms, in
 *     place 43.5-43.8, bf16 39.2-39.7 (4 x H200, 2026-11-27, 2 rounds alternating);
 *   - colocated on one GPU: in place 0.79-0.85 x bf16 (one H200); on two, in place measured
 *     faster than staged (8.8 against 9.5 ms, with 256 MiB buckets). Three GPUs: not measured.
 * So colocated groups on 4 GPUs or more stage FP8 chunks when that moves at most 0.9 x the
 * bytes (0.83 paid by a tenth; a plan that saves less leaves little to gain for the senders'
 * extra pass), in 2 GiB buckets unless the senders chose a bucket size; others leave FP8
 * targets to their receivers; fp8_wire 2 forces staging. */
#include "core/wire_policy.h"

#include <stdio.h>

int wsync_ipc_wire_pays(int colocated, int ngpus, uint64_t plain, uint64_t wire, char *why,
                        size_t whylen)
{
    if (!colocated)
        return 1;
    if (ngpus < WSYNC_IPC_WIRE_MIN_GPUS) {
        if (why != NULL && whylen > 0)
            snprintf(why, whylen, "ipc colocated on %d GPU(s): the receivers quantize from the "
                     "shards in place, cheaper than staging FP8 chunks below %d GPUs", ngpus,
                     WSYNC_IPC_WIRE_MIN_GPUS);
        return 0;
    }
    if (wire * 10 > plain * WSYNC_IPC_WIRE_MAX_TENTHS) {
        if (why != NULL && whylen > 0)
            snprintf(why, whylen, "ipc colocated on %d GPUs: FP8 on the wire would move %.2f x "
                     "the bytes (staging pays from %.2f x down), so the receivers quantize from "
                     "the shards in place", ngpus, plain ? (double)wire / (double)plain : 1.0,
                     WSYNC_IPC_WIRE_MAX_TENTHS / 10.0);
        return 0;
    }
    return 1;
}

uint64_t wsync_ipc_wire_bucket(int colocated, int ngpus, uint64_t asked)
{
    return colocated && ngpus >= WSYNC_IPC_WIRE_MIN_GPUS && asked == WSYNC_DEFAULT_BUCKET_BYTES
               ? WSYNC_IPC_WIRE_BUCKET_BYTES
               : asked;
}
