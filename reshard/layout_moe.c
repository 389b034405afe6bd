/* Receiver layouts of mixture-of-experts models (vLLM FusedMoE). TODO(issue 16): being written. */
#include "core/status.h"
#include "wsync/wsync.h"

wsync_status_t wsync_layout_local_experts(int64_t num_experts, int ep_rank, int ep_size,
                                          wsync_expert_placement_t placement, int64_t *experts,
                                          int64_t *nlocal)
{
    (void)num_experts; (void)ep_rank; (void)ep_size; (void)placement; (void)experts; (void)nlocal;
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "wsync_layout_local_experts: not yet");
}

wsync_status_t wsync_layout_moe_w13(const char *name, const wsync_param_t *gate,
                                    const wsync_param_t *up, int64_t nlocal, int tp_rank,
                                    int tp_size, wsync_target_t *target)
{
    (void)name; (void)gate; (void)up; (void)nlocal; (void)tp_rank; (void)tp_size; (void)target;
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "wsync_layout_moe_w13: not yet");
}

wsync_status_t wsync_layout_moe_w2(const char *name, const wsync_param_t *down, int64_t nlocal,
                                   int tp_rank, int tp_size, wsync_target_t *target)
{
    (void)name; (void)down; (void)nlocal; (void)tp_rank; (void)tp_size; (void)target;
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "wsync_layout_moe_w2: not yet");
}
