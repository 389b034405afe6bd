/* Fuzz target: HF config.json (reshard/model_config.c wsync_model_config_parse), and what is
 * built from an accepted config without allocating weights: the checkpoint param list, FSDP
 * shards and vLLM's TP targets (reshard/layout.c), whose shapes are products of config sizes.
 *
 * Input: the JSON text. Properties: an accepted config passes wsync_model_config_check; every
 * param, shard and target built from it has positive dims, and every box and piece lies inside
 * its param and its target. Builders run only for configs of at
 * most 4 layers, so that each input stays fast (UBSan watches their arithmetic). */
#include "reshard/model.h"
#include "tests/fuzz/fuzz.h"
#include "wsync/wsync.h"

/* Dims are positive int64 values (each a product of at most two config sizes, so no overflow
 * on the way: UBSan checks that). The element count may still pass 64 bits for absurd sizes:
 * descriptions refuse such params later (WSYNC_PLAN_MAX_ELEMS), so it is not a property here. */
static void dims_ok(int nd, const int64_t *shape)
{
    for (int d = 0; d < nd; d++)
        FUZZ_ASSERT(shape[d] > 0, "dim %d is %lld", d, (long long)shape[d]);
}

static void check_params(const wsync_model_config_t *cfg)
{
    wsync_param_t *params = NULL;
    size_t n = 0;

    if (wsync_model_params(cfg, (wsync_dtype_t)0, &params, &n) != WSYNC_OK)
        return;
    for (size_t i = 0; i < n; i++) {
        FUZZ_ASSERT(params[i].name != NULL && params[i].ndim >= 1 &&
                    params[i].ndim <= WSYNC_MAX_DIMS, "param %zu", i);
        dims_ok(params[i].ndim, params[i].shape);
    }
    wsync_model_params_free(params, n);
}

static void check_shards(const wsync_model_config_t *cfg, int rank, int nranks)
{
    wsync_shard_t *shards = NULL;
    size_t n = 0;

    if (wsync_layout_fsdp_shards(cfg, (wsync_dtype_t)0, rank, nranks, &shards, &n) != WSYNC_OK)
        return;
    for (size_t i = 0; i < n; i++) {
        const wsync_shard_t *s = &shards[i];
        dims_ok(s->param.ndim, s->param.shape);
        for (int d = 0; d < s->param.ndim; d++)
            FUZZ_ASSERT(s->box.start[d] >= 0 && s->box.len[d] >= 0 &&
                        s->box.start[d] <= s->param.shape[d] &&
                        s->box.len[d] <= s->param.shape[d] - s->box.start[d],
                        "shard %zu (%s) dim %d outside the param", i, s->param.name, d);
    }
    wsync_layout_shards_free(shards, n);
}

static void check_targets(const wsync_model_config_t *cfg, int rank, int size, int fp8)
{
    wsync_tp_options_t opt = WSYNC_TP_OPTIONS_INIT;
    wsync_target_t *targets = NULL;
    size_t n = 0;

    if (fp8)
        opt.quant.scheme = WSYNC_QUANT_BLOCK;
    if (wsync_layout_tp_targets(cfg, rank, size, &opt, &targets, &n) != WSYNC_OK)
        return;
    for (size_t i = 0; i < n; i++) {
        const wsync_target_t *t = &targets[i];
        dims_ok(t->ndim, t->shape);
        (void)wsync_target_bytes(t);
        (void)wsync_target_scale_count(t);
        FUZZ_ASSERT(t->npieces >= 0 && (t->npieces == 0 || t->pieces != NULL), "pieces");
        for (int k = 0; k < t->npieces; k++) {
            const wsync_piece_t *p = &t->pieces[k];
            FUZZ_ASSERT(p->param.ndim == t->ndim, "target %s piece %d has %d dims", t->name, k,
                        p->param.ndim);
            dims_ok(p->param.ndim, p->param.shape);
            for (int d = 0; d < t->ndim; d++)
                FUZZ_ASSERT(p->src.start[d] >= 0 && p->src.len[d] >= 0 &&
                            p->src.len[d] <= p->param.shape[d] - p->src.start[d] &&
                            p->dst_start[d] >= 0 &&
                            p->src.len[d] <= t->shape[d] - p->dst_start[d],
                            "target %s piece %d dim %d lies outside", t->name, k, d);
        }
    }
    wsync_layout_targets_free(targets, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    wsync_model_config_t cfg;

    memset(&cfg, 0xa5, sizeof(cfg));
    if (wsync_model_config_parse((const char *)data, size, &cfg) != WSYNC_OK)
        return 0;
    FUZZ_ASSERT(wsync_model_config_check(&cfg) == WSYNC_OK, "parsed config fails its check: %s",
                wsync_last_error());
    FUZZ_ASSERT(strcmp(wsync_model_type_name(cfg.model_type), "?") != 0, "family %d",
                (int)cfg.model_type);
    if (cfg.num_hidden_layers > 4)
        return 0;
    check_params(&cfg);
    check_shards(&cfg, 0, 1);
    check_shards(&cfg, 2, 3);
    for (int size = 1; size <= 4; size *= 2) {
        check_targets(&cfg, size - 1, size, 0);
        check_targets(&cfg, 0, size, 1);
    }
    return 0;
}
