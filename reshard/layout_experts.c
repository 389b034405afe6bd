/* Sender layouts of mixture-of-experts trainers. TODO(issue 16): being written. */
#include "core/status.h"
#include "wsync/wsync.h"

wsync_status_t wsync_layout_ep_shards(const wsync_model_config_t *cfg, wsync_dtype_t dtype,
                                      int rank, int nranks, int dense_dim,
                                      wsync_shard_t **shards, size_t *nshards)
{
    (void)cfg; (void)dtype; (void)rank; (void)nranks; (void)dense_dim; (void)shards; (void)nshards;
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "wsync_layout_ep_shards: not yet");
}

wsync_status_t wsync_model_fused_params(const wsync_model_config_t *cfg, wsync_dtype_t dtype,
                                        wsync_param_t **params, size_t *n)
{
    (void)cfg; (void)dtype; (void)params; (void)n;
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "wsync_model_fused_params: not yet");
}

wsync_status_t wsync_layout_unfuse_experts(const wsync_shard_t *shard, wsync_shard_t **shards,
                                           size_t *nshards)
{
    (void)shard; (void)shards; (void)nshards;
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "wsync_layout_unfuse_experts: not yet");
}
