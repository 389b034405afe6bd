/* Sender layouts (FSDP / Shard(d) boxes, replicated) and vLLM's tensor-parallel receiver layouts
 * (RESHARD_SPEC.md), one target at a time and for a whole Llama-family model. */
#include "reshard/model.h"

#include "core/status.h"

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

static wsync_status_t check_rank(const char *what, int rank, int size)
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
    if ((st = check_param(param)) || (st = check_rank(pname(param), rank, nranks)))
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
    if ((st = check_rank("FSDP shards", rank, nranks)) != WSYNC_OK)
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
static wsync_status_t target_new(wsync_target_t *t, const char *name, wsync_dtype_t dtype,
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
static wsync_status_t target_piece(wsync_target_t *t, const wsync_param_t *param, int64_t row0,
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

static wsync_status_t named_param(const wsync_param_t *p)
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
    if ((st = named_param(param)) != WSYNC_OK)
        return st;
    if ((st = target_new(&t, param->name, param->dtype, param->ndim, param->shape, 1)) ||
        (st = target_piece(&t, param, 0, param->shape[0], 0, 0, 0))) {
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
    if ((st = named_param(param)) || (st = check_rank(param->name, tp_rank, tp_size)))
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
    if ((st = target_new(&t, param->name, param->dtype, 2, shape, 1)) ||
        (st = target_piece(&t, param, 0, param->shape[0], tp_rank * cols, cols, 0))) {
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
    if ((st = check_rank(name, tp_rank, tp_size)) != WSYNC_OK)
        return st;
    int64_t rows = 0;
    for (int i = 0; i < nparts; i++) {
        if ((st = named_param(&parts[i])) ||
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
    if ((st = target_new(&t, name, parts[0].dtype, parts[0].ndim, shape, nparts)) != WSYNC_OK)
        return st;
    int64_t dst = 0;
    for (int i = 0; i < nparts; i++) {
        int64_t n = parts[i].shape[0] / tp_size;
        if ((st = target_piece(&t, &parts[i], tp_rank * n, n, 0, 0, dst)) != WSYNC_OK) {
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
    if ((st = named_param(q)) || (st = named_param(k)) || (st = named_param(v)) ||
        (st = check_stackable(name, q, k)) || (st = check_stackable(name, q, v)) ||
        (st = check_rank(name, tp_rank, tp_size)) ||
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
    if ((st = target_new(&t, name, q->dtype, q->ndim, shape, 3)) ||
        (st = target_piece(&t, q, tp_rank * hr * d, hr * d, 0, 0, 0)) ||
        (st = target_piece(&t, k, kvs * kr * d, kr * d, 0, 0, hr * d)) ||
        (st = target_piece(&t, v, kvs * kr * dv, kr * dv, 0, 0, hr * d + kr * d))) {
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
    if ((st = named_param(param)) || (st = check_rank(param->name, tp_rank, tp_size)) ||
        (st = vocab_split(param->name, param->shape[0], vocab_pad, tp_size, &vr)))
        return st;
    int64_t v = param->shape[0], lo = tp_rank * vr;
    int64_t hi = lo + vr < v ? lo + vr : v;
    int64_t shape[WSYNC_MAX_DIMS];
    memcpy(shape, param->shape, sizeof(shape));
    shape[0] = vr;
    if ((st = target_new(&t, param->name, param->dtype, param->ndim, shape, 1)) != WSYNC_OK)
        return st;
    /* rows >= V get no piece: the library zeroes uncovered bytes, as vLLM's padding is zero */
    if (hi > lo && (st = target_piece(&t, param, lo, hi - lo, 0, 0, 0)) != WSYNC_OK) {
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
    size_t rows = (size_t)target->shape[0], cols = 1;
    for (int d = 1; d < target->ndim; d++)
        cols *= (size_t)target->shape[d];
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
} tp_opts_t;

static wsync_status_t resolve_options(const wsync_model_config_t *cfg,
                                      const wsync_tp_options_t *in, tp_opts_t *o)
{
    const wsync_tp_options_t defaults = WSYNC_TP_OPTIONS_INIT;
    if (in == NULL)
        in = &defaults;
    o->param_dtype = wsync_mp_dtype(cfg, in->param_dtype);
    o->dtype = in->dtype != 0 ? in->dtype : o->param_dtype;
    o->quant_dtype = in->quant_dtype != 0 ? in->quant_dtype : WSYNC_DTYPE_F8E4M3FN;
    o->quant = in->quant;
    o->vocab_pad = in->vocab_pad != 0 ? in->vocab_pad : DEFAULT_VOCAB_PAD;

    if (wsync_dtype_size(o->param_dtype) == 0 || wsync_dtype_size(o->dtype) == 0)
        return wsync_err(WSYNC_ERR_INVALID, "TP options: unknown dtype (param %d, target %d)",
                         (int)o->param_dtype, (int)o->dtype);
    if (o->vocab_pad < 1)
        return wsync_err(WSYNC_ERR_INVALID, "TP options: vocab_pad = %" PRId64 " must be >= 1",
                         o->vocab_pad);
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

/* Everything vLLM would refuse at this TP size, checked once for the whole model with the names
 * of layer 0 (every layer has the same shapes). */
static wsync_status_t check_tp(const wsync_model_config_t *cfg, int tp_size, const tp_opts_t *o)
{
    const int64_t h = cfg->num_attention_heads, k = cfg->num_key_value_heads;
    const int64_t d = cfg->head_dim, im = cfg->intermediate_size;
    int64_t hr = 0, kr = 0, rep = 1, vr = 0;
    wsync_status_t st;

    if ((st = qkv_split("model.layers.0.self_attn.qkv_proj.weight", h, k, tp_size, &hr, &kr,
                        &rep)) != WSYNC_OK)
        return st;
    if (im % tp_size != 0)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "model.layers.0.mlp.gate_up_proj.weight: intermediate_size I = %" PRId64
                         " is not divisible by tp_size T = %d",
                         im, tp_size);
    if ((st = vocab_split("model.embed_tokens.weight", cfg->vocab_size, o->vocab_pad, tp_size,
                          &vr)) != WSYNC_OK)
        return st;
    if (o->quant.scheme != WSYNC_QUANT_BLOCK)
        return WSYNC_OK;

    /* each separate weight's TP partition must be whole blocks: rows for the outputs of
     * q, k, v, gate, up; columns for the inputs of o and down */
    const int br = o->quant.block_rows, bc = o->quant.block_cols;
    if ((st = block_fits("model.layers.0.self_attn.q_proj.weight", "H*D", h * d, tp_size, hr * d,
                         "rows", br, br, bc)) ||
        (st = block_fits("model.layers.0.self_attn.k_proj.weight", "K*D", k * d, tp_size, kr * d,
                         "rows", br, br, bc)) ||
        (st = block_fits("model.layers.0.self_attn.v_proj.weight", "K*D", k * d, tp_size, kr * d,
                         "rows", br, br, bc)) ||
        (st = block_fits("model.layers.0.self_attn.o_proj.weight", "H*D", h * d, tp_size,
                         h * d / tp_size, "columns", bc, br, bc)) ||
        (st = block_fits("model.layers.0.mlp.gate_proj.weight", "I", im, tp_size, im / tp_size,
                         "rows", br, br, bc)) ||
        (st = block_fits("model.layers.0.mlp.up_proj.weight", "I", im, tp_size, im / tp_size,
                         "rows", br, br, bc)) ||
        (st = block_fits("model.layers.0.mlp.down_proj.weight", "I", im, tp_size, im / tp_size,
                         "columns", bc, br, bc)))
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

static wsync_status_t add_replicated(tp_build_t *b, wsync_mp_kind_t kind, int64_t layer)
{
    char name[WSYNC_MP_NAME_MAX];
    wsync_param_t p;
    wsync_status_t st;

    wsync_mp_param(b->cfg, kind, layer, b->o->param_dtype, name, &p);
    if ((st = wsync_layout_replicated(&p, &b->t[b->n])) != WSYNC_OK)
        return st;
    finish(b, 0);
    return WSYNC_OK;
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

/* gate_up_proj.{weight,bias} = [gate; up] of `layer`. */
static wsync_status_t add_gate_up(tp_build_t *b, int64_t layer, int bias)
{
    char gn[WSYNC_MP_NAME_MAX], un[WSYNC_MP_NAME_MAX], name[WSYNC_MP_NAME_MAX];
    wsync_param_t parts[2];
    wsync_status_t st;

    wsync_mp_param(b->cfg, bias ? WSYNC_MP_GATE_BIAS : WSYNC_MP_GATE, layer, b->o->param_dtype, gn,
                   &parts[0]);
    wsync_mp_param(b->cfg, bias ? WSYNC_MP_UP_BIAS : WSYNC_MP_UP, layer, b->o->param_dtype, un,
                   &parts[1]);
    snprintf(name, sizeof(name), "model.layers.%" PRId64 ".mlp.gate_up_proj.%s", layer,
             bias ? "bias" : "weight");
    st = wsync_layout_merged_column(name, parts, 2, b->rank, b->size, &b->t[b->n]);
    if (st != WSYNC_OK)
        return st;
    finish(b, !bias);
    return WSYNC_OK;
}

static wsync_status_t add_layer(tp_build_t *b, int64_t l)
{
    const wsync_model_config_t *c = b->cfg;
    wsync_status_t st;

    if ((st = add_replicated(b, WSYNC_MP_INPUT_NORM, l)) || (st = add_qkv(b, l, 0)) ||
        (c->attention_bias && (st = add_qkv(b, l, 1))) || (st = add_row(b, WSYNC_MP_O, l)) ||
        /* a row-parallel bias is added once after the all-reduce: every rank holds it whole */
        (c->o_proj_bias && (st = add_replicated(b, WSYNC_MP_O_BIAS, l))) ||
        (c->qk_norm && (st = add_replicated(b, WSYNC_MP_Q_NORM, l))) ||
        (c->qk_norm && (st = add_replicated(b, WSYNC_MP_K_NORM, l))) ||
        (st = add_replicated(b, WSYNC_MP_POST_NORM, l)) || (st = add_gate_up(b, l, 0)) ||
        (c->mlp_bias && (st = add_gate_up(b, l, 1))) || (st = add_row(b, WSYNC_MP_DOWN, l)) ||
        (c->mlp_bias && (st = add_replicated(b, WSYNC_MP_DOWN_BIAS, l))))
        return st;
    return WSYNC_OK;
}

static size_t targets_per_layer(const wsync_model_config_t *c)
{
    /* norms, qkv, o, gate_up, down, then the optional ones */
    return 6 + (c->attention_bias != 0) + (c->o_proj_bias != 0) + 2 * (c->qk_norm != 0) +
           2 * (c->mlp_bias != 0);
}

wsync_status_t wsync_layout_tp_targets(const wsync_model_config_t *cfg, int tp_rank, int tp_size,
                                       const wsync_tp_options_t *options,
                                       wsync_target_t **targets, size_t *ntargets)
{
    tp_opts_t o;
    wsync_status_t st;

    if (targets == NULL || ntargets == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_layout_tp_targets: NULL argument");
    if ((st = wsync_model_config_check(cfg)) ||
        (st = check_rank("TP targets", tp_rank, tp_size)) ||
        (st = resolve_options(cfg, options, &o)) || (st = check_tp(cfg, tp_size, &o)))
        return st;
    if (wsync_mp_is_moe_family(cfg))
        return wsync_err(WSYNC_ERR_UNSUPPORTED, "wsync_layout_tp_targets: %s: not yet",
                         wsync_model_type_name(cfg->model_type));

    tp_build_t b = {cfg, &o, tp_rank, tp_size, NULL, 0, 0};
    b.cap = 2 + (size_t)cfg->num_hidden_layers * targets_per_layer(cfg) + !cfg->tie_word_embeddings;
    b.t = calloc(b.cap, sizeof(*b.t));
    if (b.t == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "%zu targets", b.cap);

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
    if (b.n != b.cap) {
        st = wsync_err(WSYNC_ERR_INTERNAL, "built %zu TP targets, expected %zu", b.n, b.cap);
        goto err;
    }
    *targets = b.t;
    *ntargets = b.n;
    return WSYNC_OK;
err:
    wsync_layout_targets_free(b.t, b.n);
    return st;
}
