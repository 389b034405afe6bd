/* When colocated ipc stages FP8 chunks (docs/fp8_wire.md, "When"). Measured on H200s with fp8-block
 * targets (2026-11-26; docs/bench/sections/18_fp8_wire.md):
 *   - disaggregated FSDP-2 -> TP-2, Qwen3-8B: 0.58 x the bytes, 0.57-0.60 x the time: every
 *     byte crosses NVLink, so it always pays there;
 *   - colocated on 1 or 2 GPUs, Qwen3-8B: 15.4 ms against 13.9 plain (one GPU), 9.5 against 8.8
 *     (two): most bytes stay on their GPU, where quantizing from the shard in place is one pass;
 *   - colocated FSDP-4 -> TP-4 on 4 GPUs, Qwen3-8B, 0.58 x the bytes: 5.6 ms against 6.5 plain
 *     (each GPU's NVLink ports shared by three peers: the crossing bytes bound the time);
 *   - colocated FSDP-4 -> EP-4 on 4 GPUs, Qwen3-30B-A3B, 0.83 x the bytes (expert cells cut by
 *     the FSDP rows travel plain): 54.7 ms against 47.5 plain.
 * Between the last two the saving that repays the staging lies near 0.70 x the bytes. */
#include "core/wire_policy.h"

#include <stdio.h>

int wsync_ipc_wire_pays(int colocated, int ngpus, uint64_t plain_bytes, uint64_t wire_bytes,
                        char *why, size_t whylen)
{
    double share = plain_bytes ? (double)wire_bytes / (double)plain_bytes : 1.0;

    if (!colocated)
        return 1;
    if (ngpus <= 2) {
        if (why != NULL && whylen > 0)
            snprintf(why, whylen, "ipc colocated on %d GPU(s): the receivers quantize from the "
                     "shards in place, cheaper there than staging FP8 chunks", ngpus);
        return 0;
    }
    if (share > WSYNC_IPC_WIRE_MAX_SHARE) {
        if (why != NULL && whylen > 0)
            snprintf(why, whylen, "ipc colocated: FP8 chunks would move %.3f x the bytes (more "
                     "than %.2f x: cells cut by the senders' rows travel plain), too little saved "
                     "to pay for staging them", share, WSYNC_IPC_WIRE_MAX_SHARE);
        return 0;
    }
    return 1;
}
