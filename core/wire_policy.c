/* When colocated ipc stages FP8 chunks (docs/fp8_wire.md, "When"). fp8-block targets, Qwen3-8B
 * shape unless named (docs/bench/sections/18_fp8_wire.md):
 *   - disaggregated FSDP-2 -> TP-2 (4 x H200): 0.58 x the bytes, 0.57-0.60 x the time: every
 *     byte crosses NVLink, so it always pays there;
 *   - colocated, the receivers quantizing from the shards in place (one pass: bf16 read once,
 *     FP8 written once) against FP8 chunks staged by the senders (a pack, then a copy):
 *     FSDP-4 -> TP-4 on 4 x H100, 6.04 ms against 6.62 (2026-11-26, 3 rounds; bf16 5.24); on
 *     one H200 15.4 ms staged against 13.9 (FSDP-1 -> TP-1), on two 9.5 against 8.8. (The 4 x
 *     H200 rows of 11-26 that favoured staging, 5.6 against 6.5 ms, and Qwen3-30B-A3B EP-4, 54.7
 *     against 47.5, ran while the in-place path was broken and every FP8 target was landed in
 *     staging and quantized from there: schemes/ipc_cuda_rx.c, plan_qruns.)
 * So colocated groups leave FP8 targets to their receivers; fp8_wire 2 forces staging. */
#include "core/wire_policy.h"

#include <stdio.h>

int wsync_ipc_wire_pays(int colocated, int ngpus, char *why, size_t whylen)
{
    if (!colocated)
        return 1;
    if (why != NULL && whylen > 0)
        snprintf(why, whylen, "ipc colocated on %d GPU(s): the receivers quantize from the "
                 "shards in place, cheaper than staging FP8 chunks", ngpus);
    return 0;
}
