/* Receiver layouts of mixture-of-experts layers, as vLLM's FusedMoE holds them (rules and sources
 * in docs/moe_layouts.md).
 *
 * vLLM's w13_weight [E_local, 2 * I_p, Hd] and w2_weight [E_local, Hd, I_p] are contiguous
 * row-major tensors; wsync describes them as the matrices of the same bytes, [E_local * 2 * I_p,
 * Hd] and [E_local * Hd, I_p], so that every piece (one expert's 2-D checkpoint param) keeps its
 * dims, as pieces must, and an FP8 target's scales are those of the [prod(leading dims), last dim]
 * matrix vLLM's per-expert block scales tile. */
#include "reshard/model.h"

#include "core/status.h"
#include "reshard/plan.h"

#include <inttypes.h>
#include <stdint.h>
#include <string.h>

wsync_status_t wsync_layout_local_experts(int64_t num_experts, int ep_rank, int ep_size,
                                          wsync_expert_placement_t placement, int64_t *experts,
                                          int64_t *nlocal)
{
    wsync_status_t st;

    if (experts == NULL || nlocal == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_layout_local_experts: experts and nlocal "
                                            "must be set");
    if ((st = wsync_lt_check_rank("expert-parallel rank", ep_rank, ep_size)) != WSYNC_OK)
        return st;
    if (num_experts < 1)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_layout_local_experts: num_experts = %" PRId64
                                            " must be >= 1",
                         num_experts);
    if (placement != WSYNC_EXPERT_LINEAR && placement != WSYNC_EXPERT_ROUND_ROBIN)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_layout_local_experts: unknown placement %d",
                         (int)placement);

    /* vLLM determine_expert_map: floor(E / EP) each, the first E % EP ranks one more */
    const int64_t base = num_experts / ep_size, rem = num_experts % ep_size;
    const int64_t n = base + (ep_rank < rem);
    if (placement == WSYNC_EXPERT_LINEAR) {
        const int64_t start = ep_rank * base + (ep_rank < rem ? ep_rank : rem);
        for (int64_t j = 0; j < n; j++)
            experts[j] = start + j;
    } else {
        for (int64_t j = 0; j < n; j++)
            experts[j] = ep_rank + j * ep_size;
    }
    *nlocal = n;
    return WSYNC_OK;
}

/* nlocal 2-D params of one shape and dtype (the experts of one kind). */
static wsync_status_t check_experts(const char *name, const char *what, const wsync_param_t *ps,
                                    int64_t nlocal)
{
    wsync_status_t st;

    if (ps == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: %s params are NULL", name, what);
    for (int64_t j = 0; j < nlocal; j++) {
        if ((st = wsync_lt_named_param(&ps[j])) != WSYNC_OK)
            return st;
        if (ps[j].ndim != 2)
            return wsync_err(WSYNC_ERR_INVALID, "%s: %s %s has %d dims, an expert's is 2", name,
                             what, ps[j].name, ps[j].ndim);
        if (ps[j].dtype != ps[0].dtype || ps[j].shape[0] != ps[0].shape[0] ||
            ps[j].shape[1] != ps[0].shape[1])
            return wsync_err(WSYNC_ERR_INVALID,
                             "%s: %s %s is %s [%" PRId64 ", %" PRId64 "] but %s is %s [%" PRId64
                             ", %" PRId64 "]",
                             name, what, ps[j].name, wsync_dtype_name(ps[j].dtype),
                             ps[j].shape[0], ps[j].shape[1], ps[0].name,
                             wsync_dtype_name(ps[0].dtype), ps[0].shape[0], ps[0].shape[1]);
    }
    return WSYNC_OK;
}

static wsync_status_t check_common(const char *fn, const char *name, int64_t nlocal, int tp_rank,
                                   int tp_size, const wsync_target_t *target)
{
    if (name == NULL || target == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: name and target must be set", fn);
    if (nlocal < 1 || nlocal > WSYNC_MAX_PIECES / 2)
        return wsync_err(WSYNC_ERR_INVALID, "%s: nlocal = %" PRId64 " must be in [1, %d]", name,
                         nlocal, WSYNC_MAX_PIECES / 2);
    return wsync_lt_check_rank(name, tp_rank, tp_size);
}

/* FusedMoE's intermediate_size_per_partition: I / tp_size (each rank holds every expert). */
static wsync_status_t split_im(const char *name, int64_t im, int tp_size, int64_t *ip)
{
    if (im % tp_size != 0)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: moe_intermediate_size I = %" PRId64
                         " is not divisible by tp_size %d",
                         name, im, tp_size);
    *ip = im / tp_size;
    return WSYNC_OK;
}

wsync_status_t wsync_layout_moe_w13(const char *name, const wsync_param_t *gate,
                                    const wsync_param_t *up, int64_t nlocal, int tp_rank,
                                    int tp_size, wsync_target_t *target)
{
    wsync_target_t t;
    wsync_status_t st;

    if ((st = check_common("wsync_layout_moe_w13", name, nlocal, tp_rank, tp_size, target)) ||
        (st = check_experts(name, "gate", gate, nlocal)) ||
        (st = check_experts(name, "up", up, nlocal)))
        return st;
    if (up[0].dtype != gate[0].dtype || up[0].shape[0] != gate[0].shape[0] ||
        up[0].shape[1] != gate[0].shape[1])
        return wsync_err(WSYNC_ERR_INVALID, "%s: up %s differs from gate %s in dtype or shape",
                         name, up[0].name, gate[0].name);
    const int64_t hd = gate[0].shape[1];
    int64_t ip = 0;
    if ((st = split_im(name, gate[0].shape[0], tp_size, &ip)))
        return st;
    /* the params are the caller's: their sizes may be anything a dim can hold */
    if (ip > INT64_MAX / (2 * nlocal))
        return wsync_err(WSYNC_ERR_INVALID,
                         "%s: %" PRId64 " experts of 2 x %" PRId64 " rows overflow int64", name,
                         nlocal, ip);
    const int64_t shape[2] = {nlocal * 2 * ip, hd};    /* w13 [nlocal, 2 * I_p, Hd] */
    if ((st = wsync_lt_target_new(&t, name, gate[0].dtype, 2, shape, (int)(2 * nlocal))))
        return st;
    for (int64_t j = 0; j < nlocal; j++) {
        /* expert j: its gate (w1) slice, then its up (w3) slice, each rows [r * I_p, +I_p) */
        if ((st = wsync_lt_target_piece(&t, &gate[j], tp_rank * ip, ip, 0, 0, j * 2 * ip)) ||
            (st = wsync_lt_target_piece(&t, &up[j], tp_rank * ip, ip, 0, 0, j * 2 * ip + ip))) {
            wsync_layout_target_free(&t);
            return st;
        }
    }
    *target = t;
    return WSYNC_OK;
}

wsync_status_t wsync_layout_moe_w2(const char *name, const wsync_param_t *down, int64_t nlocal,
                                   int tp_rank, int tp_size, wsync_target_t *target)
{
    wsync_target_t t;
    wsync_status_t st;

    if ((st = check_common("wsync_layout_moe_w2", name, nlocal, tp_rank, tp_size, target)) ||
        (st = check_experts(name, "down", down, nlocal)))
        return st;
    const int64_t hd = down[0].shape[0];
    int64_t ip = 0;
    if ((st = split_im(name, down[0].shape[1], tp_size, &ip)))
        return st;
    if (hd > INT64_MAX / nlocal)
        return wsync_err(WSYNC_ERR_INVALID,
                         "%s: %" PRId64 " experts of %" PRId64 " rows overflow int64", name, nlocal,
                         hd);
    const int64_t shape[2] = {nlocal * hd, ip};        /* w2 [nlocal, Hd, I_p] */
    if ((st = wsync_lt_target_new(&t, name, down[0].dtype, 2, shape, (int)nlocal)))
        return st;
    for (int64_t j = 0; j < nlocal; j++) {
        /* expert j's down_proj split on its input: columns [r * I_p, +I_p) of every row */
        if ((st = wsync_lt_target_piece(&t, &down[j], 0, hd, tp_rank * ip, ip, j * hd))) {
            wsync_layout_target_free(&t);
            return st;
        }
    }
    *target = t;
    return WSYNC_OK;
}
