/* Sender layouts (FSDP / Shard(d) boxes, replicated) and vLLM's tensor-parallel receiver layouts
 * (RESHARD_SPEC.md), one target at a time and for a whole Llama-family model. */
#include "reshard/model.h"

#include "core/status.h"
#include "reshard/plan.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_VOCAB_PAD 64     /* vLLM's DEFAULT_VOCAB_PADDING_SIZE */
#define DEFAULT_FP8_BLOCK 128    /* DeepSeek-V3 / vLLM / SGLang weight blocks */

static const char *pname(const wsync_param_t *p)
{
    return p->name != NULL ? p->name : "(unnamed param)";
}

static wsync_status_t check_param(const wsync_param_t *p)
{
    if (p == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "param is NULL");
    if (p->ndim < 1 || p->ndim > WSYNC_MAX_DIMS)
        return wsync_err(WSYNC_ERR_INVALID, "%s: ndim %d is outside [1, %d]", pname(p), p->ndim,
                         WSYNC_MAX_DIMS);
    for (int d = 0; d < p->ndim; d++)
        if (p->shape[d] < 1)
            return wsync_err(WSYNC_ERR_INVALID, "%s: shape[%d] = %" PRId64 " must be >= 1",
                             pname(p), d, p->shape[d]);
    if (wsync_dtype_size(p->dtype) == 0)
        return wsync_err(WSYNC_ERR_INVALID, "%s: unknown dtype %d", pname(p), (int)p->dtype);
    return WSYNC_OK;
}

wsync_status_t wsync_lt_check_rank(const char *what, int rank, int size)
{
    if (size < 1 || rank < 0 || rank >= size)
        return wsync_err(WSYNC_ERR_INVALID, "%s: rank %d of %d is outside [0, size)", what, rank,
                         size);
    return WSYNC_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Sender layouts                                                                               */
/* ------------------------------------------------------------------------------------------ */

wsync_status_t wsync_layout_shard_box(const wsync_param_t *param, int dim, int rank, int nranks,
                                      wsync_box_t *box)
{
    wsync_status_t st;

    if (box == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_layout_shard_box: box is NULL");
    if ((st = check_param(param)) || (st = wsync_lt_check_rank(pname(param), rank, nranks)))
        return st;
    if (dim != WSYNC_REPLICATE && (dim < 0 || dim >= param->ndim))
        return wsync_err(WSYNC_ERR_INVALID, "%s: cannot shard along dim %d of a %d-dim param",
                         pname(param), dim, param->ndim);

    wsync_box_t b;
    memset(&b, 0, sizeof(b));
    for (int d = 0; d < param->ndim; d++)
        b.len[d] = param->shape[d];
    if (dim != WSYNC_REPLICATE) {
        /* torch.chunk's rule (FSDP2, DTensor Shard): equal ceil-sized chunks, the tail short or
         * empty; an empty chunk starts at the end so its box still lies inside the param */
        int64_t n = param->shape[dim], c = (n + nranks - 1) / nranks;
        int64_t lo = c * rank < n ? c * rank : n;
        int64_t hi = c * (rank + 1) < n ? c * (rank + 1) : n;
        b.start[dim] = lo;
        b.len[dim] = hi - lo;
    }
    *box = b;
    return WSYNC_OK;
}

void wsync_layout_shards_free(wsync_shard_t *shards, size_t nshards)
{
    if (shards == NULL)
        return;
    for (size_t i = 0; i < nshards; i++)
        free((char *)shards[i].param.name);
    free(shards);
}

wsync_status_t wsync_layout_shards(const wsync_param_t *params, size_t nparams, int dim, int rank,
                                   int nranks, wsync_shard_t **shards, size_t *nshards)
{
    wsync_status_t st;

    if ((params == NULL && nparams > 0) || shards == NULL || nshards == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_layout_shards: NULL argument");
    wsync_shard_t *out = calloc(nparams ? nparams : 1, sizeof(*out));
    if (out == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "%zu shards", nparams);
    for (size_t i = 0; i < nparams; i++) {
        if (params[i].name == NULL) {
            st = wsync_err(WSYNC_ERR_INVALID, "param %zu has no name", i);
            goto err;
        }
        if ((st = wsync_layout_shard_box(&params[i], dim, rank, nranks, &out[i].box)) != WSYNC_OK)
            goto err;
        out[i].param = params[i];
        out[i].param.name = strdup(params[i].name);
        if (out[i].param.name == NULL) {
            st = wsync_err(WSYNC_ERR_NOMEM, "param names");
            goto err;
        }
        out[i].data = NULL;
        out[i].mem = WSYNC_MEM_HOST;
        out[i].device = 0;
    }
    *shards = out;
    *nshards = nparams;
    return WSYNC_OK;
err:
    wsync_layout_shards_free(out, nparams);   /* names not yet set are NULL */
    return st;
}

wsync_status_t wsync_layout_fsdp_shards(const wsync_model_config_t *cfg, wsync_dtype_t dtype,
                                        int rank, int nranks, wsync_shard_t **shards,
                                        size_t *nshards)
{
    wsync_param_t *params;
    size_t n;
    wsync_status_t st;

    if (shards == NULL || nshards == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_layout_fsdp_shards: NULL argument");
    if ((st = wsync_lt_check_rank("FSDP shards", rank, nranks)) != WSYNC_OK)
        return st;
    if ((st = wsync_model_params(cfg, dtype, &params, &n)) != WSYNC_OK)
        return st;
    st = wsync_layout_shards(params, n, 0, rank, nranks, shards, nshards);
    wsync_model_params_free(params, n);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Receiver layouts: one target                                                                 */
/* ------------------------------------------------------------------------------------------ */

void wsync_layout_target_free(wsync_target_t *target)
{
    if (target == NULL)
        return;
    wsync_piece_t *pieces = (wsync_piece_t *)target->pieces;
    for (int i = 0; pieces != NULL && i < target->npieces; i++)
        free((char *)pieces[i].param.name);
    free(pieces);
    free((char *)target->name);
    memset(target, 0, sizeof(*target));
}

/* A target named `name` of the given shape, with room for max_pieces pieces. */
wsync_status_t wsync_lt_target_new(wsync_target_t *t, const char *name, wsync_dtype_t dtype,
                                 int ndim, const int64_t *shape, int max_pieces)
{
    memset(t, 0, sizeof(*t));
    t->name = strdup(name);
    t->pieces = calloc(max_pieces > 0 ? (size_t)max_pieces : 1, sizeof(wsync_piece_t));
    if (t->name == NULL || t->pieces == NULL) {
        wsync_layout_target_free(t);
        return wsync_err(WSYNC_ERR_NOMEM, "target %s", name);
    }
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        t->shape[d] = shape[d];
    t->mem = WSYNC_MEM_HOST;
    t->quant.scheme = WSYNC_QUANT_NONE;
    return WSYNC_OK;
}

/* Append the piece: rows [row0, row0 + nrows) of `param` (all of every other dim) land at row
 * dst_row, column dst_col of the target. col0/ncols narrow dim 1 when ncols > 0 (row-parallel). */
wsync_status_t wsync_lt_target_piece(wsync_target_t *t, const wsync_param_t *param, int64_t row0,
                                   int64_t nrows, int64_t col0, int64_t ncols, int64_t dst_row)
{
    wsync_piece_t *pc = (wsync_piece_t *)&t->pieces[t->npieces];

    memset(pc, 0, sizeof(*pc));
    pc->param = *param;
    pc->param.name = strdup(param->name);
    if (pc->param.name == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "target %s", t->name);
    for (int d = 0; d < param->ndim; d++)
        pc->src.len[d] = param->shape[d];
    pc->src.start[0] = row0;
    pc->src.len[0] = nrows;
    if (ncols > 0) {
        pc->src.start[1] = col0;
        pc->src.len[1] = ncols;
    }
    pc->dst_start[0] = dst_row;
    t->npieces++;
    return WSYNC_OK;
}

wsync_status_t wsync_lt_named_param(const wsync_param_t *p)
{
    wsync_status_t st = check_param(p);
    if (st == WSYNC_OK && p->name == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "a param without a name cannot be a piece");
    return st;
}

wsync_status_t wsync_layout_replicated(const wsync_param_t *param, wsync_target_t *target)
{
    wsync_target_t t;
    wsync_status_t st;

    if (target == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_layout_replicated: target is NULL");
    if ((st = wsync_lt_named_param(param)) != WSYNC_OK)
        return st;
    if ((st = wsync_lt_target_new(&t, param->name, param->dtype, param->ndim, param->shape, 1)) ||
        (st = wsync_lt_target_piece(&t, param, 0, param->shape[0], 0, 0, 0))) {
        wsync_layout_target_free(&t);
        return st;
    }
    *target = t;
    return WSYNC_OK;
}

wsync_status_t wsync_layout_column_parallel(const wsync_param_t *param, int tp_rank, int tp_size,
                                            wsync_target_t *target)
{
    if (param == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_layout_column_parallel: param is NULL");
    return wsync_layout_merged_column(param->name, param, 1, tp_rank, tp_size, target);
}

wsync_status_t wsync_layout_row_parallel(const wsync_param_t *param, int tp_rank, int tp_size,
                                         wsync_target_t *target)
{
    wsync_target_t t;
    wsync_status_t st;

    if (target == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_layout_row_parallel: target is NULL");
    if ((st = wsync_lt_named_param(param)) || (st = wsync_lt_check_rank(param->name, tp_rank, tp_size)))
        return st;
    if (param->ndim != 2)
        return wsync_err(WSYNC_ERR_INVALID, "%s: row-parallel needs a 2-dim weight, not %d-dim",
                         param->name, param->ndim);
    int64_t in = param->shape[1];
    if (in % tp_size != 0)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: row-parallel input size %" PRId64 " is not divisible by tp_size %d",
                         param->name, in, tp_size);
    int64_t cols = in / tp_size;
    int64_t shape[2] = {param->shape[0], cols};
    if ((st = wsync_lt_target_new(&t, param->name, param->dtype, 2, shape, 1)) ||
        (st = wsync_lt_target_piece(&t, param, 0, param->shape[0], tp_rank * cols, cols, 0))) {
        wsync_layout_target_free(&t);
        return st;
    }
    *target = t;
    return WSYNC_OK;
}

/* Parts stacked along rows must agree on everything but their row counts. */
static wsync_status_t check_stackable(const char *name, const wsync_param_t *a,
                                      const wsync_param_t *b)
{
    if (a->dtype != b->dtype)
        return wsync_err(WSYNC_ERR_INVALID, "%s: %s is %s but %s is %s", name, a->name,
                         wsync_dtype_name(a->dtype), b->name, wsync_dtype_name(b->dtype));
    if (a->ndim != b->ndim)
        return wsync_err(WSYNC_ERR_INVALID, "%s: %s has %d dims but %s has %d", name, a->name,
                         a->ndim, b->name, b->ndim);
    for (int d = 1; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return wsync_err(WSYNC_ERR_INVALID,
                             "%s: shape[%d] differs: %" PRId64 " in %s, %" PRId64 " in %s", name,
                             d, a->shape[d], a->name, b->shape[d], b->name);
    return WSYNC_OK;
}

wsync_status_t wsync_layout_merged_column(const char *name, const wsync_param_t *parts, int nparts,
                                          int tp_rank, int tp_size, wsync_target_t *target)
{
    wsync_target_t t;
    wsync_status_t st;

    if (name == NULL || parts == NULL || nparts < 1 || target == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_layout_merged_column: bad arguments");
    if ((st = wsync_lt_check_rank(name, tp_rank, tp_size)) != WSYNC_OK)
        return st;
    int64_t rows = 0;
    for (int i = 0; i < nparts; i++) {
        if ((st = wsync_lt_named_param(&parts[i])) ||
            (st = check_stackable(name, &parts[0], &parts[i])))
            return st;
        if (parts[i].shape[0] % tp_size != 0)
            return wsync_err(WSYNC_ERR_CONFIG,
                             "%s: %s has %" PRId64 " output rows, not divisible by tp_size %d",
                             name, parts[i].name, parts[i].shape[0], tp_size);
        rows += parts[i].shape[0] / tp_size;
    }
    int64_t shape[WSYNC_MAX_DIMS];
    memcpy(shape, parts[0].shape, sizeof(shape));
    shape[0] = rows;
    if ((st = wsync_lt_target_new(&t, name, parts[0].dtype, parts[0].ndim, shape, nparts)) != WSYNC_OK)
        return st;
    int64_t dst = 0;
    for (int i = 0; i < nparts; i++) {
        int64_t n = parts[i].shape[0] / tp_size;
        if ((st = wsync_lt_target_piece(&t, &parts[i], tp_rank * n, n, 0, 0, dst)) != WSYNC_OK) {
            wsync_layout_target_free(&t);
            return st;
        }
        dst += n;
    }
    *target = t;
    return WSYNC_OK;
}

/* vLLM's QKVParallelLinear partition, or WSYNC_ERR_CONFIG naming `name`. */
static wsync_status_t qkv_split(const char *name, int64_t h, int64_t k, int tp_size, int64_t *hr,
                                int64_t *kr, int64_t *rep)
{
    if (h < 1 || k < 1)
        return wsync_err(WSYNC_ERR_CONFIG, "%s: H = %" PRId64 " and K = %" PRId64 " must be >= 1",
                         name, h, k);
    if (h % tp_size != 0)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: num_attention_heads H = %" PRId64 " is not divisible by tp_size "
                         "T = %d",
                         name, h, tp_size);
    if (k >= tp_size && k % tp_size != 0)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: num_key_value_heads K = %" PRId64 " >= tp_size T = %d must be "
                         "divisible by T",
                         name, k, tp_size);
    if (k < tp_size && tp_size % k != 0)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: num_key_value_heads K = %" PRId64 " < tp_size T = %d must divide T "
                         "(each kv head is replicated on T / K ranks)",
                         name, k, tp_size);
    *hr = h / tp_size;
    *kr = k >= tp_size ? k / tp_size : 1;
    *rep = k >= tp_size ? 1 : tp_size / k;
    return WSYNC_OK;
}

wsync_status_t wsync_layout_qkv(const char *name, const wsync_param_t *q, const wsync_param_t *k,
                                const wsync_param_t *v, int64_t num_heads, int64_t num_kv_heads,
                                int tp_rank, int tp_size, wsync_target_t *target)
{
    wsync_target_t t;
    wsync_status_t st;
    int64_t hr = 0, kr = 0, rep = 1;

    if (name == NULL || target == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_layout_qkv: name and target must be set");
    if ((st = wsync_lt_named_param(q)) || (st = wsync_lt_named_param(k)) || (st = wsync_lt_named_param(v)) ||
        (st = check_stackable(name, q, k)) || (st = check_stackable(name, q, v)) ||
        (st = wsync_lt_check_rank(name, tp_rank, tp_size)) ||
        (st = qkv_split(name, num_heads, num_kv_heads, tp_size, &hr, &kr, &rep)))
        return st;
    if (q->shape[0] % num_heads != 0 || v->shape[0] % num_kv_heads != 0 ||
        k->shape[0] != num_kv_heads * (q->shape[0] / num_heads))
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: rows q %" PRId64 ", k %" PRId64 ", v %" PRId64
                         " do not fit H = %" PRId64 ", K = %" PRId64 " heads of one head_dim",
                         name, q->shape[0], k->shape[0], v->shape[0], num_heads, num_kv_heads);
    int64_t d = q->shape[0] / num_heads, dv = v->shape[0] / num_kv_heads;
    int64_t kvs = tp_rank / rep;            /* kv shard this rank reads */

    int64_t shape[WSYNC_MAX_DIMS], qr, kvr, vr;
    memcpy(shape, q->shape, sizeof(shape));
    /* hr * d + kr * d + kr * dv, refused where it does not fit (hostile configs) */
    if (__builtin_mul_overflow(hr, d, &qr) || __builtin_mul_overflow(kr, d, &kvr) ||
        __builtin_mul_overflow(kr, dv, &vr) || __builtin_add_overflow(qr, kvr, &shape[0]) ||
        __builtin_add_overflow(shape[0], vr, &shape[0]))
        return wsync_err(WSYNC_ERR_CONFIG, "%s: the fused rows (%" PRId64 " q heads + %" PRId64
                         " kv heads of head_dim %" PRId64 ") do not fit in 64 bits", name, hr, kr,
                         d);
    if ((st = wsync_lt_target_new(&t, name, q->dtype, q->ndim, shape, 3)) ||
        (st = wsync_lt_target_piece(&t, q, tp_rank * hr * d, hr * d, 0, 0, 0)) ||
        (st = wsync_lt_target_piece(&t, k, kvs * kr * d, kr * d, 0, 0, hr * d)) ||
        (st = wsync_lt_target_piece(&t, v, kvs * kr * dv, kr * dv, 0, 0, hr * d + kr * d))) {
        wsync_layout_target_free(&t);
        return st;
    }
    *target = t;
    return WSYNC_OK;
}

/* vLLM's padded vocab, or WSYNC_ERR_CONFIG naming `name`. */
static wsync_status_t vocab_split(const char *name, int64_t v, int64_t pad, int tp_size,
                                  int64_t *vr)
{
    int64_t vp = (v + pad - 1) / pad * pad;
    if (vp % tp_size != 0)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: padded vocab Vp = %" PRId64 " (V = %" PRId64
                         " rounded up to a multiple of %" PRId64 ") is not divisible by tp_size "
                         "T = %d",
                         name, vp, v, pad, tp_size);
    *vr = vp / tp_size;
    return WSYNC_OK;
}

wsync_status_t wsync_layout_vocab_parallel(const wsync_param_t *param, int64_t vocab_pad,
                                           int tp_rank, int tp_size, wsync_target_t *target)
{
    wsync_target_t t;
    wsync_status_t st;
    int64_t vr = 0;

    if (target == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_layout_vocab_parallel: target is NULL");
    if (vocab_pad <= 0)
        vocab_pad = DEFAULT_VOCAB_PAD;
    if ((st = wsync_lt_named_param(param)) || (st = wsync_lt_check_rank(param->name, tp_rank, tp_size)) ||
        (st = vocab_split(param->name, param->shape[0], vocab_pad, tp_size, &vr)))
        return st;
    int64_t v = param->shape[0], lo = tp_rank * vr;
    int64_t hi = lo + vr < v ? lo + vr : v;
    int64_t shape[WSYNC_MAX_DIMS];
    memcpy(shape, param->shape, sizeof(shape));
    shape[0] = vr;
    if ((st = wsync_lt_target_new(&t, param->name, param->dtype, param->ndim, shape, 1)) != WSYNC_OK)
        return st;
    /* rows >= V get no piece: the library zeroes uncovered bytes, as vLLM's padding is zero */
    if (hi > lo && (st = wsync_lt_target_piece(&t, param, lo, hi - lo, 0, 0, 0)) != WSYNC_OK) {
        wsync_layout_target_free(&t);
        return st;
    }
    *target = t;
    return WSYNC_OK;
}

size_t wsync_target_bytes(const wsync_target_t *target)
{
    if (target == NULL || target->ndim < 1 || target->ndim > WSYNC_MAX_DIMS)
        return 0;
    size_t n = wsync_dtype_size(target->dtype);
    for (int d = 0; d < target->ndim; d++)
        n *= target->shape[d] > 0 ? (size_t)target->shape[d] : 0;
    return n;
}

size_t wsync_target_scale_count(const wsync_target_t *target)
{
    if (target == NULL || target->ndim < 1 || target->ndim > WSYNC_MAX_DIMS)
        return 0;
    /* the [prod(leading dims), last dim] matrix, as the receiver quantizes it
     * (wsync_shape_matrix): a 3-D [E, rows, cols] target has E * rows rows */
    size_t rows = 1, cols = (size_t)target->shape[target->ndim - 1];
    for (int d = 0; d < target->ndim - 1; d++)
        rows *= (size_t)target->shape[d];
    switch (target->quant.scheme) {
    case WSYNC_QUANT_TENSOR: return 1;
    case WSYNC_QUANT_CHANNEL: return rows;
    case WSYNC_QUANT_BLOCK: {
        size_t br = target->quant.block_rows > 0 ? (size_t)target->quant.block_rows
                                                 : DEFAULT_FP8_BLOCK;
        size_t bc = target->quant.block_cols > 0 ? (size_t)target->quant.block_cols
                                                 : DEFAULT_FP8_BLOCK;
        return ((rows + br - 1) / br) * ((cols + bc - 1) / bc);
    }
    case WSYNC_QUANT_NONE: break;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Receiver layouts: a whole model                                                              */
/* ------------------------------------------------------------------------------------------ */

void wsync_layout_targets_free(wsync_target_t *targets, size_t ntargets)
{
    if (targets == NULL)
        return;
    for (size_t i = 0; i < ntargets; i++)
        wsync_layout_target_free(&targets[i]);
    free(targets);
}

/* Options with every default resolved. */
typedef struct {
    wsync_dtype_t param_dtype, dtype;
    wsync_dtype_t quant_dtype;
    wsync_quant_t quant;
    int64_t vocab_pad;
    int ep_size, ep_rank;               /* ep_size 1: no expert parallelism */
    wsync_expert_placement_t placement;
} tp_opts_t;

static wsync_status_t resolve_options(const wsync_model_config_t *cfg,
                                      const wsync_tp_options_t *in, int tp_rank, int tp_size,
                                      tp_opts_t *o)
{
    const wsync_tp_options_t defaults = WSYNC_TP_OPTIONS_INIT;
    if (in == NULL)
        in = &defaults;
    o->param_dtype = wsync_mp_dtype(cfg, in->param_dtype);
    o->dtype = in->dtype != 0 ? in->dtype : o->param_dtype;
    o->quant_dtype = in->quant_dtype != 0 ? in->quant_dtype : WSYNC_DTYPE_F8E4M3FN;
    o->quant = in->quant;
    o->vocab_pad = in->vocab_pad != 0 ? in->vocab_pad : DEFAULT_VOCAB_PAD;
    o->ep_size = in->ep_size > 1 ? in->ep_size : 1;
    o->ep_rank = in->ep_size > 1 ? in->ep_rank : 0;
    o->placement = in->expert_placement;

    if (wsync_dtype_size(o->param_dtype) == 0 || wsync_dtype_size(o->dtype) == 0)
        return wsync_err(WSYNC_ERR_INVALID, "TP options: unknown dtype (param %d, target %d)",
                         (int)o->param_dtype, (int)o->dtype);
    if (o->vocab_pad < 1)
        return wsync_err(WSYNC_ERR_INVALID, "TP options: vocab_pad = %" PRId64 " must be >= 1",
                         o->vocab_pad);
    if (in->ep_size < 0)
        return wsync_err(WSYNC_ERR_INVALID, "TP options: ep_size = %d must be >= 0", in->ep_size);
    if (o->placement != WSYNC_EXPERT_LINEAR && o->placement != WSYNC_EXPERT_ROUND_ROBIN)
        return wsync_err(WSYNC_ERR_INVALID, "TP options: unknown expert_placement %d",
                         (int)o->placement);
    if (o->ep_size > 1) {
        wsync_status_t st = wsync_lt_check_rank("TP options: ep_rank", o->ep_rank, o->ep_size);
        if (st != WSYNC_OK)
            return st;
        /* vLLM: the EP group is TP x DP, this rank being dp_rank * T + tp_rank */
        if (o->ep_size % tp_size != 0 || o->ep_rank % tp_size != tp_rank)
            return wsync_err(WSYNC_ERR_INVALID,
                             "TP options: ep_size %d and ep_rank %d do not fit tp_rank %d of %d "
                             "(vLLM's EP group is TP x DP, ep_rank = dp_rank * T + tp_rank)",
                             o->ep_size, o->ep_rank, tp_rank, tp_size);
        if (!wsync_mp_is_moe_family(cfg))
            return wsync_err(WSYNC_ERR_INVALID, "TP options: ep_size %d given for %s, which has "
                                                "no experts",
                             o->ep_size, wsync_model_type_name(cfg->model_type));
    }
    switch (o->quant.scheme) {
    case WSYNC_QUANT_NONE: return WSYNC_OK;
    case WSYNC_QUANT_TENSOR:
    case WSYNC_QUANT_CHANNEL:
    case WSYNC_QUANT_BLOCK: break;
    default:
        return wsync_err(WSYNC_ERR_INVALID, "TP options: unknown quant scheme %d",
                         (int)o->quant.scheme);
    }
    if (o->quant_dtype != WSYNC_DTYPE_F8E4M3FN && o->quant_dtype != WSYNC_DTYPE_F8E5M2)
        return wsync_err(WSYNC_ERR_INVALID, "TP options: quant_dtype %s is not an FP8 dtype",
                         wsync_dtype_name(o->quant_dtype));
    if (o->quant.scales != NULL)
        return wsync_err(WSYNC_ERR_INVALID,
                         "TP options: quant.scales must be NULL (each target needs its own)");
    if (o->quant.block_rows < 0 || o->quant.block_cols < 0)
        return wsync_err(WSYNC_ERR_INVALID, "TP options: block %dx%d must not be negative",
                         o->quant.block_rows, o->quant.block_cols);
    if (o->quant.block_rows == 0)
        o->quant.block_rows = DEFAULT_FP8_BLOCK;
    if (o->quant.block_cols == 0)
        o->quant.block_cols = DEFAULT_FP8_BLOCK;
    return WSYNC_OK;
}

/* One per-rank partition that a scale block must not straddle. */
static wsync_status_t block_fits(const char *param, const char *what, int64_t total, int tp_size,
                                 int64_t per_rank, const char *unit, int block, int brow, int bcol)
{
    if (per_rank % block == 0)
        return WSYNC_OK;
    return wsync_err(WSYNC_ERR_CONFIG,
                     "%s: block FP8 %dx%d: %s = %" PRId64 " at T = %d gives %" PRId64
                     " %s per rank, not a multiple of %d",
                     param, brow, bcol, what, total, tp_size, per_rank, unit, block);
}

/* Layer numbers whose names the checks use: the first dense and the first MoE layer (-1: none),
 * found in one pass. */
static void first_layers(const wsync_model_config_t *cfg, int64_t *dense, int64_t *moe)
{
    *dense = -1;
    *moe = -1;
    for (int64_t l = 0; l < cfg->num_hidden_layers && (*dense < 0 || *moe < 0); l++) {
        if (wsync_model_layer_is_moe(cfg, l)) {
            if (*moe < 0)
                *moe = l;
        } else if (*dense < 0) {
            *dense = l;
        }
    }
}

/* A per-layer param's name, for messages. */
static const char *lname(char buf[WSYNC_MP_NAME_MAX], const wsync_model_config_t *cfg,
                         wsync_mp_kind_t kind, int64_t layer)
{
    wsync_param_t p;
    wsync_mp_param(cfg, kind, layer, WSYNC_DTYPE_BF16, buf, &p);
    return buf;
}

/* GQA attention (q, k, v fused into qkv_proj; o row-parallel). */
static wsync_status_t check_gqa(const wsync_model_config_t *cfg, int tp_size, const tp_opts_t *o)
{
    const int64_t h = cfg->num_attention_heads, k = cfg->num_key_value_heads, d = cfg->head_dim;
    int64_t hr = 0, kr = 0, rep = 1;
    char n[WSYNC_MP_NAME_MAX];
    wsync_status_t st;

    if ((st = qkv_split("model.layers.0.self_attn.qkv_proj.weight", h, k, tp_size, &hr, &kr,
                        &rep)) != WSYNC_OK)
        return st;
    if (o->quant.scheme != WSYNC_QUANT_BLOCK)
        return WSYNC_OK;
    /* each separate weight's TP partition must be whole blocks: rows for the outputs of
     * q, k, v; columns for the input of o */
    const int br = o->quant.block_rows, bc = o->quant.block_cols;
    if ((st = block_fits(lname(n, cfg, WSYNC_MP_Q, 0), "H*D", h * d, tp_size, hr * d, "rows", br,
                         br, bc)) ||
        (st = block_fits(lname(n, cfg, WSYNC_MP_K, 0), "K*D", k * d, tp_size, kr * d, "rows", br,
                         br, bc)) ||
        (st = block_fits(lname(n, cfg, WSYNC_MP_V, 0), "K*D", k * d, tp_size, kr * d, "rows", br,
                         br, bc)) ||
        (st = block_fits(lname(n, cfg, WSYNC_MP_O, 0), "H*D", h * d, tp_size, h * d / tp_size,
                         "columns", bc, br, bc)))
        return st;
    return WSYNC_OK;
}

/* MLA attention (vLLM DeepseekV2MLAAttention): heads split by TP; the a-projections whole. */
static wsync_status_t check_mla(const wsync_model_config_t *cfg, int tp_size, const tp_opts_t *o)
{
    const int64_t h = cfg->num_attention_heads, qk = cfg->qk_nope_head_dim + cfg->qk_rope_head_dim;
    const int64_t kvb = cfg->qk_nope_head_dim + cfg->v_head_dim, dv = cfg->v_head_dim;
    char n[WSYNC_MP_NAME_MAX];
    wsync_status_t st;

    if (h % tp_size != 0)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "model.layers.0.self_attn: num_attention_heads H = %" PRId64
                         " is not divisible by tp_size T = %d",
                         h, tp_size);
    if (o->quant.scheme != WSYNC_QUANT_BLOCK)
        return WSYNC_OK;
    const int br = o->quant.block_rows, bc = o->quant.block_cols;
    const int64_t hr = h / tp_size;
    /* fused_qkv_a_proj = [q_a; kv_a], replicated: a block must not straddle q_a and kv_a, so
     * q_lora_rank is whole blocks; kv_a, the last part, may end in a partial block (DeepSeek-V3's
     * 576 rows: vLLM serves its FP8 checkpoint so) */
    if (cfg->q_lora_rank > 0) {
        if (cfg->q_lora_rank % br != 0)
            return wsync_err(WSYNC_ERR_CONFIG,
                             "model.layers.0.self_attn.fused_qkv_a_proj.weight: block FP8 %dx%d: "
                             "q_lora_rank = %" PRId64
                             " rows of q_a_proj are not a multiple of %d (a block would straddle "
                             "q_a_proj and kv_a_proj_with_mqa)",
                             br, bc, cfg->q_lora_rank, br);
        if ((st = block_fits(lname(n, cfg, WSYNC_MP_Q_B, 0), "H*(nope+rope)", h * qk, tp_size,
                             hr * qk, "rows", br, br, bc)))
            return st;
    } else if ((st = block_fits(lname(n, cfg, WSYNC_MP_Q, 0), "H*(nope+rope)", h * qk, tp_size,
                                hr * qk, "rows", br, br, bc))) {
        return st;
    }
    if ((st = block_fits(lname(n, cfg, WSYNC_MP_KV_B, 0), "H*(nope+v)", h * kvb, tp_size,
                         hr * kvb, "rows", br, br, bc)) ||
        (st = block_fits(lname(n, cfg, WSYNC_MP_O, 0), "H*v_head_dim", h * dv, tp_size, hr * dv,
                         "columns", bc, br, bc)))
        return st;
    return WSYNC_OK;
}

/* A merged [gate; up] + row-parallel down MLP of width `width` (dense layers, shared experts). */
static wsync_status_t check_mlp(const char *gate, const char *up, const char *down,
                                const char *what, int64_t width, int tp_size, const tp_opts_t *o)
{
    wsync_status_t st;

    if (width % tp_size != 0)
        return wsync_err(WSYNC_ERR_CONFIG, "%s: %s = %" PRId64 " is not divisible by tp_size T = %d",
                         gate, what, width, tp_size);
    if (o->quant.scheme != WSYNC_QUANT_BLOCK)
        return WSYNC_OK;
    const int br = o->quant.block_rows, bc = o->quant.block_cols;
    if ((st = block_fits(gate, what, width, tp_size, width / tp_size, "rows", br, br, bc)) ||
        (st = block_fits(up, what, width, tp_size, width / tp_size, "rows", br, br, bc)) ||
        (st = block_fits(down, what, width, tp_size, width / tp_size, "columns", bc, br, bc)))
        return st;
    return WSYNC_OK;
}

/* Routed experts (FusedMoE): split inside by TP, or whole by EP. */
static wsync_status_t check_experts(const wsync_model_config_t *cfg, int64_t layer, int tp_size,
                                    const tp_opts_t *o)
{
    const int64_t e = cfg->num_experts, im = cfg->moe_intermediate_size, hd = cfg->hidden_size;
    const int t = o->ep_size > 1 ? 1 : tp_size;
    char w13[WSYNC_MP_NAME_MAX], w2[WSYNC_MP_NAME_MAX];

    snprintf(w13, sizeof(w13), "model.layers.%" PRId64 ".mlp.experts.w13_weight", layer);
    snprintf(w2, sizeof(w2), "model.layers.%" PRId64 ".mlp.experts.w2_weight", layer);
    if (o->ep_size > e)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: ep_size %d exceeds the %" PRId64
                         " experts (a rank would hold none)",
                         w13, o->ep_size, e);
    const int64_t most = (e + o->ep_size - 1) / o->ep_size;    /* experts on one rank */
    if (2 * most > WSYNC_MAX_PIECES)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: %" PRId64 " experts on one rank make %" PRId64
                         " pieces, more than a target takes (%d): use expert parallelism",
                         w13, most, 2 * most, WSYNC_MAX_PIECES);
    if (im % t != 0)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: moe_intermediate_size I = %" PRId64
                         " is not divisible by tp_size T = %d (without expert parallelism "
                         "every rank holds I / T of every expert)",
                         w13, im, t);
    if (o->quant.scheme != WSYNC_QUANT_BLOCK)
        return WSYNC_OK;
    /* vLLM Fp8MoEMethod.create_weights: I_p % block_n (and % block_k when T > 1; asked of
     * every T here, as for dense down_proj); as one matrix per target, a block must also not
     * straddle two experts of w2: Hd % block_n */
    const int br = o->quant.block_rows, bc = o->quant.block_cols;
    const int64_t ip = im / t;
    wsync_status_t st;
    if ((st = block_fits(w13, "moe_intermediate_size", im, t, ip, "gate and up rows", br, br,
                         bc)) ||
        (st = block_fits(w2, "moe_intermediate_size", im, t, ip, "columns", bc, br, bc)))
        return st;
    if (hd % br != 0)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: block FP8 %dx%d: hidden_size = %" PRId64
                         " rows per expert are not a multiple of %d",
                         w2, br, bc, hd, br);
    return WSYNC_OK;
}

/* Everything vLLM would refuse at this TP size, checked once for the whole model with the names
 * of the first layer of each kind (every layer of a kind has the same shapes). */
static wsync_status_t check_tp(const wsync_model_config_t *cfg, int tp_size, const tp_opts_t *o)
{
    int64_t dense, moe, vr = 0;
    char g[WSYNC_MP_NAME_MAX], u[WSYNC_MP_NAME_MAX], d[WSYNC_MP_NAME_MAX];
    wsync_status_t st;

    first_layers(cfg, &dense, &moe);
    if ((st = wsync_mp_is_mla(cfg) ? check_mla(cfg, tp_size, o) : check_gqa(cfg, tp_size, o)))
        return st;
    if (dense >= 0) {
        char gu[WSYNC_MP_NAME_MAX];
        snprintf(gu, sizeof(gu), "model.layers.%" PRId64 ".mlp.gate_up_proj.weight", dense);
        if (cfg->intermediate_size % tp_size != 0)
            return wsync_err(WSYNC_ERR_CONFIG,
                             "%s: intermediate_size I = %" PRId64
                             " is not divisible by tp_size T = %d",
                             gu, cfg->intermediate_size, tp_size);
        if ((st = check_mlp(lname(g, cfg, WSYNC_MP_GATE, dense), lname(u, cfg, WSYNC_MP_UP, dense),
                            lname(d, cfg, WSYNC_MP_DOWN, dense), "I", cfg->intermediate_size,
                            tp_size, o)))
            return st;
    }
    if (moe >= 0) {
        if ((st = check_experts(cfg, moe, tp_size, o)))
            return st;
        if (wsync_mp_in_layer(cfg, WSYNC_MP_SHARED_GATE, 1) &&
            (st = check_mlp(lname(g, cfg, WSYNC_MP_SHARED_GATE, moe),
                            lname(u, cfg, WSYNC_MP_SHARED_UP, moe),
                            lname(d, cfg, WSYNC_MP_SHARED_DOWN, moe),
                            "n_shared_experts * moe_intermediate_size",
                            cfg->n_shared_experts * cfg->moe_intermediate_size, tp_size, o)))
            return st;
    }
    if ((st = vocab_split("model.embed_tokens.weight", cfg->vocab_size, o->vocab_pad, tp_size,
                          &vr)) != WSYNC_OK)
        return st;
    return WSYNC_OK;
}

/* Targets of one model, appended in order. */
typedef struct {
    const wsync_model_config_t *cfg;
    const tp_opts_t *o;
    int rank, size;
    wsync_target_t *t;
    size_t n, cap;
    int64_t *experts;                  /* this rank's routed experts (global indices) */
    int64_t nlocal;
    wsync_param_t *gate, *up, *down;   /* [nlocal] scratch for the expert builders */
    char (*names)[WSYNC_MP_NAME_MAX];  /* [3 * nlocal] their names */
} tp_build_t;

/* The next slot, its dtype set: quantized for linear weights, else the target dtype. */
static void finish(tp_build_t *b, int linear)
{
    wsync_target_t *t = &b->t[b->n++];
    if (linear && b->o->quant.scheme != WSYNC_QUANT_NONE) {
        t->dtype = b->o->quant_dtype;
        t->quant = b->o->quant;
    } else {
        t->dtype = b->o->dtype;
    }
}

/* A replicated target; `linear` says whether it is a linear weight, quantized like the split
 * ones (see finish). */
static wsync_status_t add_replicated_as(tp_build_t *b, wsync_mp_kind_t kind, int64_t layer,
                                        int linear)
{
    char name[WSYNC_MP_NAME_MAX];
    wsync_param_t p;
    wsync_status_t st;

    wsync_mp_param(b->cfg, kind, layer, b->o->param_dtype, name, &p);
    if ((st = wsync_layout_replicated(&p, &b->t[b->n])) != WSYNC_OK)
        return st;
    finish(b, linear);
    return WSYNC_OK;
}

static wsync_status_t add_replicated(tp_build_t *b, wsync_mp_kind_t kind, int64_t layer)
{
    return add_replicated_as(b, kind, layer, 0);
}

/* A replicated linear weight (quantized like the split ones). */
static wsync_status_t add_replicated_linear(tp_build_t *b, wsync_mp_kind_t kind, int64_t layer)
{
    return add_replicated_as(b, kind, layer, 1);
}

static wsync_status_t add_vocab(tp_build_t *b, wsync_mp_kind_t kind)
{
    char name[WSYNC_MP_NAME_MAX];
    wsync_param_t p;
    wsync_status_t st;

    wsync_mp_param(b->cfg, kind, 0, b->o->param_dtype, name, &p);
    st = wsync_layout_vocab_parallel(&p, b->o->vocab_pad, b->rank, b->size, &b->t[b->n]);
    if (st != WSYNC_OK)
        return st;
    finish(b, 0);
    return WSYNC_OK;
}

static wsync_status_t add_row(tp_build_t *b, wsync_mp_kind_t kind, int64_t layer)
{
    char name[WSYNC_MP_NAME_MAX];
    wsync_param_t p;
    wsync_status_t st;

    wsync_mp_param(b->cfg, kind, layer, b->o->param_dtype, name, &p);
    if ((st = wsync_layout_row_parallel(&p, b->rank, b->size, &b->t[b->n])) != WSYNC_OK)
        return st;
    finish(b, 1);
    return WSYNC_OK;
}

/* Output rows split evenly over TP; for MLA's q_proj, q_b_proj, kv_b_proj that is by heads,
 * every head's rows being contiguous. */
static wsync_status_t add_column(tp_build_t *b, wsync_mp_kind_t kind, int64_t layer)
{
    char name[WSYNC_MP_NAME_MAX];
    wsync_param_t p;
    wsync_status_t st;

    wsync_mp_param(b->cfg, kind, layer, b->o->param_dtype, name, &p);
    if ((st = wsync_layout_column_parallel(&p, b->rank, b->size, &b->t[b->n])) != WSYNC_OK)
        return st;
    finish(b, 1);
    return WSYNC_OK;
}

/* qkv_proj.{weight,bias} from q, k, v of `layer`. */
static wsync_status_t add_qkv(tp_build_t *b, int64_t layer, int bias)
{
    char qn[WSYNC_MP_NAME_MAX], kn[WSYNC_MP_NAME_MAX], vn[WSYNC_MP_NAME_MAX];
    char name[WSYNC_MP_NAME_MAX];
    wsync_param_t q, k, v;
    wsync_status_t st;

    wsync_mp_param(b->cfg, bias ? WSYNC_MP_Q_BIAS : WSYNC_MP_Q, layer, b->o->param_dtype, qn, &q);
    wsync_mp_param(b->cfg, bias ? WSYNC_MP_K_BIAS : WSYNC_MP_K, layer, b->o->param_dtype, kn, &k);
    wsync_mp_param(b->cfg, bias ? WSYNC_MP_V_BIAS : WSYNC_MP_V, layer, b->o->param_dtype, vn, &v);
    snprintf(name, sizeof(name), "model.layers.%" PRId64 ".self_attn.qkv_proj.%s", layer,
             bias ? "bias" : "weight");
    st = wsync_layout_qkv(name, &q, &k, &v, b->cfg->num_attention_heads,
                          b->cfg->num_key_value_heads, b->rank, b->size, &b->t[b->n]);
    if (st != WSYNC_OK)
        return st;
    finish(b, !bias);
    return WSYNC_OK;
}

/* A merged [first; second] column-parallel target named `suffix` of `layer` (gate_up_proj of a
 * dense MLP or of the shared experts; tp_size 1 for MLA's replicated fused_qkv_a_proj). */
static wsync_status_t add_merged(tp_build_t *b, int64_t layer, wsync_mp_kind_t first,
                                 wsync_mp_kind_t second, const char *suffix, int rank, int size,
                                 int linear)
{
    char n0[WSYNC_MP_NAME_MAX], n1[WSYNC_MP_NAME_MAX], name[WSYNC_MP_NAME_MAX];
    wsync_param_t parts[2];
    wsync_status_t st;

    wsync_mp_param(b->cfg, first, layer, b->o->param_dtype, n0, &parts[0]);
    wsync_mp_param(b->cfg, second, layer, b->o->param_dtype, n1, &parts[1]);
    snprintf(name, sizeof(name), "model.layers.%" PRId64 ".%s", layer, suffix);
    st = wsync_layout_merged_column(name, parts, 2, rank, size, &b->t[b->n]);
    if (st != WSYNC_OK)
        return st;
    finish(b, linear);
    return WSYNC_OK;
}

static wsync_status_t add_gate_up(tp_build_t *b, int64_t layer, int bias)
{
    return bias ? add_merged(b, layer, WSYNC_MP_GATE_BIAS, WSYNC_MP_UP_BIAS,
                             "mlp.gate_up_proj.bias", b->rank, b->size, 0)
                : add_merged(b, layer, WSYNC_MP_GATE, WSYNC_MP_UP, "mlp.gate_up_proj.weight",
                             b->rank, b->size, 1);
}

/* The routed experts' w13_weight and w2_weight of `layer`. */
static wsync_status_t add_experts(tp_build_t *b, int64_t layer)
{
    const int ep = b->o->ep_size > 1;
    const int rank = ep ? 0 : b->rank, size = ep ? 1 : b->size;
    char name[WSYNC_MP_NAME_MAX];
    wsync_status_t st;

    for (int64_t j = 0; j < b->nlocal; j++) {
        wsync_mp_expert_param(b->cfg, WSYNC_MP_EXPERT_GATE, layer, b->experts[j],
                              b->o->param_dtype, b->names[3 * j], &b->gate[j]);
        wsync_mp_expert_param(b->cfg, WSYNC_MP_EXPERT_UP, layer, b->experts[j],
                              b->o->param_dtype, b->names[3 * j + 1], &b->up[j]);
        wsync_mp_expert_param(b->cfg, WSYNC_MP_EXPERT_DOWN, layer, b->experts[j],
                              b->o->param_dtype, b->names[3 * j + 2], &b->down[j]);
    }
    snprintf(name, sizeof(name), "model.layers.%" PRId64 ".mlp.experts.w13_weight", layer);
    if ((st = wsync_layout_moe_w13(name, b->gate, b->up, b->nlocal, rank, size, &b->t[b->n])))
        return st;
    finish(b, 1);
    snprintf(name, sizeof(name), "model.layers.%" PRId64 ".mlp.experts.w2_weight", layer);
    if ((st = wsync_layout_moe_w2(name, b->down, b->nlocal, rank, size, &b->t[b->n])))
        return st;
    finish(b, 1);
    return WSYNC_OK;
}

static wsync_status_t add_attention_gqa(tp_build_t *b, int64_t l)
{
    const wsync_model_config_t *c = b->cfg;
    wsync_status_t st;

    if ((st = add_qkv(b, l, 0)) || (c->attention_bias && (st = add_qkv(b, l, 1))) ||
        (st = add_row(b, WSYNC_MP_O, l)) ||
        /* a row-parallel bias is added once after the all-reduce: every rank holds it whole */
        (c->o_proj_bias && (st = add_replicated(b, WSYNC_MP_O_BIAS, l))) ||
        (c->qk_norm && (st = add_replicated(b, WSYNC_MP_Q_NORM, l))) ||
        (c->qk_norm && (st = add_replicated(b, WSYNC_MP_K_NORM, l))))
        return st;
    return WSYNC_OK;
}

static wsync_status_t add_attention_mla(tp_build_t *b, int64_t l)
{
    wsync_status_t st;

    if (b->cfg->q_lora_rank > 0) {
        /* [q_a_proj; kv_a_proj_with_mqa], every rank whole (MergedColumnParallelLinear with
         * disable_tp) */
        if ((st = add_merged(b, l, WSYNC_MP_Q_A, WSYNC_MP_KV_A, "self_attn.fused_qkv_a_proj.weight",
                             0, 1, 1)) ||
            (st = add_replicated(b, WSYNC_MP_Q_A_NORM, l)) ||
            (st = add_column(b, WSYNC_MP_Q_B, l)))
            return st;
    } else if ((st = add_column(b, WSYNC_MP_Q, l)) ||
               (st = add_replicated_linear(b, WSYNC_MP_KV_A, l))) {
        return st;
    }
    if ((st = add_replicated(b, WSYNC_MP_KV_A_NORM, l)) || (st = add_column(b, WSYNC_MP_KV_B, l)) ||
        (st = add_row(b, WSYNC_MP_O, l)))
        return st;
    return WSYNC_OK;
}

static wsync_status_t add_mlp_moe(tp_build_t *b, int64_t l)
{
    wsync_status_t st;

    if ((st = add_replicated(b, WSYNC_MP_ROUTER, l)) != WSYNC_OK)
        return st;
    if (wsync_mp_in_layer(b->cfg, WSYNC_MP_ROUTER_BIAS, 1)) {
        if ((st = add_replicated(b, WSYNC_MP_ROUTER_BIAS, l)) != WSYNC_OK)
            return st;
        /* vLLM holds e_score_correction_bias in f32 whatever the model's dtype */
        b->t[b->n - 1].dtype = WSYNC_DTYPE_F32;
    }
    if ((st = add_experts(b, l)) != WSYNC_OK)
        return st;
    if (wsync_mp_in_layer(b->cfg, WSYNC_MP_SHARED_GATE, 1) &&
        ((st = add_merged(b, l, WSYNC_MP_SHARED_GATE, WSYNC_MP_SHARED_UP,
                          "mlp.shared_experts.gate_up_proj.weight", b->rank, b->size, 1)) ||
         (st = add_row(b, WSYNC_MP_SHARED_DOWN, l))))
        return st;
    return WSYNC_OK;
}

static wsync_status_t add_layer(tp_build_t *b, int64_t l)
{
    const wsync_model_config_t *c = b->cfg;
    wsync_status_t st;

    if ((st = add_replicated(b, WSYNC_MP_INPUT_NORM, l)) ||
        (st = wsync_mp_is_mla(c) ? add_attention_mla(b, l) : add_attention_gqa(b, l)) ||
        (st = add_replicated(b, WSYNC_MP_POST_NORM, l)))
        return st;
    if (wsync_model_layer_is_moe(c, l))
        return add_mlp_moe(b, l);
    if ((st = add_gate_up(b, l, 0)) || (c->mlp_bias && (st = add_gate_up(b, l, 1))) ||
        (st = add_row(b, WSYNC_MP_DOWN, l)) ||
        (c->mlp_bias && (st = add_replicated(b, WSYNC_MP_DOWN_BIAS, l))))
        return st;
    return WSYNC_OK;
}

/* Most targets one layer can have: norms 2, MLA attention 6 (GQA: qkv, its bias, o, its bias,
 * q/k norms), MoE MLP 6 (router, its bias, w13, w2, shared gate_up and down). */
#define MAX_TARGETS_PER_LAYER 16

wsync_status_t wsync_layout_tp_targets(const wsync_model_config_t *cfg, int tp_rank, int tp_size,
                                       const wsync_tp_options_t *options,
                                       wsync_target_t **targets, size_t *ntargets)
{
    tp_opts_t o;
    wsync_status_t st;

    if (targets == NULL || ntargets == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_layout_tp_targets: NULL argument");
    if ((st = wsync_model_config_check(cfg)) ||
        (st = wsync_lt_check_rank("TP targets", tp_rank, tp_size)) ||
        (st = resolve_options(cfg, options, tp_rank, tp_size, &o)) ||
        (st = check_tp(cfg, tp_size, &o)))
        return st;

    tp_build_t b;
    memset(&b, 0, sizeof(b));
    b.cfg = cfg;
    b.o = &o;
    b.rank = tp_rank;
    b.size = tp_size;
    b.cap = 3 + (size_t)cfg->num_hidden_layers * MAX_TARGETS_PER_LAYER;   /* + embed, norm, lm_head */
    b.t = calloc(b.cap, sizeof(*b.t));
    if (wsync_mp_is_moe_family(cfg)) {
        size_t e = (size_t)cfg->num_experts;
        b.experts = calloc(e, sizeof(*b.experts));
        b.gate = calloc(e, sizeof(*b.gate));
        b.up = calloc(e, sizeof(*b.up));
        b.down = calloc(e, sizeof(*b.down));
        b.names = calloc(3 * e, sizeof(*b.names));
        if (b.experts == NULL || b.gate == NULL || b.up == NULL || b.down == NULL ||
            b.names == NULL) {
            st = wsync_err(WSYNC_ERR_NOMEM, "%zu experts", e);
            goto err;
        }
        if ((st = wsync_layout_local_experts(cfg->num_experts, o.ep_rank, o.ep_size, o.placement,
                                             b.experts, &b.nlocal)) != WSYNC_OK)
            goto err;
    }
    if (b.t == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "%zu targets", b.cap);
        goto err;
    }

    if ((st = add_vocab(&b, WSYNC_MP_EMBED)) != WSYNC_OK)
        goto err;
    for (int64_t l = 0; l < cfg->num_hidden_layers; l++)
        if ((st = add_layer(&b, l)) != WSYNC_OK)
            goto err;
    if ((st = add_replicated(&b, WSYNC_MP_NORM, 0)) != WSYNC_OK)
        goto err;
    /* tied: the engine's lm_head is embed_tokens, already a target */
    if (!cfg->tie_word_embeddings && (st = add_vocab(&b, WSYNC_MP_LM_HEAD)) != WSYNC_OK)
        goto err;
    free(b.experts);
    free(b.gate);
    free(b.up);
    free(b.down);
    free(b.names);
    *targets = b.t;
    *ntargets = b.n;
    return WSYNC_OK;
err:
    free(b.experts);
    free(b.gate);
    free(b.up);
    free(b.down);
    free(b.names);
    wsync_layout_targets_free(b.t, b.n);
    return st;
}
