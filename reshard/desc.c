/* Shard and target descriptions: made from the public structs, and carried on the wire.
 *
 * One set of checks serves both sources: wsync_*_desc_from reports WSYNC_ERR_INVALID (a caller's
 * mistake), the decoders WSYNC_ERR_PROTOCOL (a peer's). Descriptions keep dims >= ndim at zero, so
 * that a decoded description equals the one encoded. */
#include "reshard/plan.h"
#include "reshard/text.h"

#include "core/status.h"
#include "core/util.h"

#include <inttypes.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Smallest encodings, to bound counts read from the wire. */
#define SHARD_WIRE_MIN 43u   /* sender, index, name len, dtype, ndim, 1 dim, start, len, mem, dev */
#define TARGET_WIRE_MIN 45u  /* receiver, index, name, dtype, ndim, 1 dim, mem, dev, quant x5, n */
#define PIECE_WIRE_MIN 38u   /* name len, dtype, ndim, 1 dim, start, len, dst */

/* ------------------------------------------------------------------------------------------ */
/* Checks shared by desc_from and decode                                                        */
/* ------------------------------------------------------------------------------------------ */

static int name_len_ok(const char *s)
{
    return s != NULL && s[0] != '\0' && strnlen(s, WSYNC_NAME_MAX + 1) <= WSYNC_NAME_MAX;
}

/* A name a message can quote (checked names only). */
static const char *nm(const char *s)
{
    return name_len_ok(s) ? s : "(bad name)";
}

static int span_inside(int nd, const int64_t *start, const int64_t *len, const int64_t *shape)
{
    for (int d = 0; d < nd; d++)
        if (start[d] < 0 || len[d] < 0 || start[d] > shape[d] || len[d] > shape[d] - start[d])
            return 0;
    return 1;
}

static int span_empty(int nd, const int64_t *len)
{
    for (int d = 0; d < nd; d++)
        if (len[d] == 0)
            return 1;
    return 0;
}

/* `what` names the owner in messages ("sender 2 shard 0", "receiver 1 target 'x' piece 3"). */
static wsync_status_t check_pdesc(wsync_status_t code, const char *what, const wsync_pdesc_t *p)
{
    uint64_t v = 1;
    wsync_text_t t;

    if (!name_len_ok(p->name))
        return wsync_err(code, "%s: param name is %s", what,
                         p->name == NULL ? "NULL" : p->name[0] == '\0' ? "empty" : "too long");
    if (wsync_dtype_size(p->dtype) == 0)
        return wsync_err(code, "%s: param '%s' has unknown dtype %d", what, p->name, (int)p->dtype);
    if (p->ndim < 1 || p->ndim > WSYNC_MAX_DIMS)
        return wsync_err(code, "%s: param '%s' has ndim %d, not in [1, %d]", what, p->name,
                         (int)p->ndim, WSYNC_MAX_DIMS);
    for (int d = 0; d < p->ndim; d++) {
        if (p->shape[d] <= 0 || wsync_mul_u64(v, (uint64_t)p->shape[d], &v) != 0 ||
            v > WSYNC_PLAN_MAX_ELEMS)
            return wsync_err(code, "%s: param '%s' shape %s has a dim <= 0 or too many elements",
                             what, p->name, wsync_fmt_dims(&t, p->ndim, p->shape));
    }
    return WSYNC_OK;
}

static wsync_status_t check_mem(wsync_status_t code, const char *what, const char *name,
                                wsync_mem_t mem, int32_t device)
{
    if (mem != WSYNC_MEM_HOST && mem != WSYNC_MEM_CUDA)
        return wsync_err(code, "%s '%s': unknown memory kind %d", what, name, (int)mem);
    if (mem == WSYNC_MEM_CUDA && device < 0)
        return wsync_err(code, "%s '%s': CUDA device %d", what, name, (int)device);
    return WSYNC_OK;
}

static wsync_status_t check_shard(wsync_status_t code, const wsync_shard_desc_t *s)
{
    char what[64];
    wsync_text_t a, b;
    wsync_status_t st;

    snprintf(what, sizeof(what), "sender %u shard %u", s->sender, s->index);
    if ((st = check_pdesc(code, what, &s->param)) != WSYNC_OK)
        return st;
    if (!span_inside(s->param.ndim, s->box.start, s->box.len, s->param.shape))
        return wsync_err(code, "%s: box %s of param '%s' lies outside its shape %s (box.start "
                         ">= 0, box.len >= 0)", what,
                         wsync_fmt_span_box(&a, s->param.ndim, s->box.start, s->box.len), s->param.name,
                         wsync_fmt_dims(&b, s->param.ndim, s->param.shape));
    return check_mem(code, "shard of param", s->param.name, s->mem, s->device);
}

typedef struct {
    int64_t start[WSYNC_MAX_DIMS], end[WSYNC_MAX_DIMS];
    uint32_t piece;
} span_t;

static int cmp_span(const void *a, const void *b)
{
    const span_t *x = a, *y = b;
    return x->start[0] < y->start[0] ? -1 : x->start[0] > y->start[0];
}

/* No two non-empty destinations of a target overlap: each element has one source. */
static wsync_status_t check_overlaps(wsync_status_t code, const wsync_target_desc_t *t)
{
    span_t *v = malloc((t->npieces ? t->npieces : 1) * sizeof(*v));
    size_t n = 0;
    wsync_status_t st = WSYNC_OK;

    if (v == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "target '%s': %u pieces", t->name, t->npieces);
    for (uint32_t i = 0; i < t->npieces; i++) {
        const wsync_piece_desc_t *p = &t->pieces[i];
        if (span_empty(t->ndim, p->src.len))
            continue;
        for (int d = 0; d < t->ndim; d++) {
            v[n].start[d] = p->dst_start[d];
            v[n].end[d] = p->dst_start[d] + p->src.len[d];
        }
        v[n++].piece = i;
    }
    qsort(v, n, sizeof(*v), cmp_span);
    for (size_t i = 0; i < n && st == WSYNC_OK; i++) {
        for (size_t j = i + 1; j < n && v[j].start[0] < v[i].end[0]; j++) {
            int meet = 1;
            for (int d = 1; d < t->ndim && meet; d++)
                meet = v[j].start[d] < v[i].end[d] && v[i].start[d] < v[j].end[d];
            if (meet) {
                uint32_t a = WSYNC_MIN(v[i].piece, v[j].piece);
                uint32_t b = WSYNC_MAX(v[i].piece, v[j].piece);
                st = wsync_err(code, "receiver %u target '%s': pieces %u (param '%s') and %u "
                               "(param '%s') land on the same elements", t->receiver, t->name, a,
                               t->pieces[a].param.name, b, t->pieces[b].param.name);
                break;
            }
        }
    }
    free(v);
    return st;
}

static wsync_status_t check_target(wsync_status_t code, const wsync_target_desc_t *t)
{
    char what[WSYNC_NAME_MAX + 96];
    wsync_text_t a, b;
    wsync_status_t st;
    uint64_t v = 1;

    if (!name_len_ok(t->name))
        return wsync_err(code, "receiver %u target %u: name is %s", t->receiver, t->index,
                         t->name == NULL ? "NULL" : t->name[0] == '\0' ? "empty" : "too long");
    if (wsync_dtype_size(t->dtype) == 0)
        return wsync_err(code, "receiver %u target '%s': unknown dtype %d", t->receiver, t->name,
                         (int)t->dtype);
    if (t->ndim < 1 || t->ndim > WSYNC_MAX_DIMS)
        return wsync_err(code, "receiver %u target '%s': ndim %d, not in [1, %d]", t->receiver,
                         t->name, (int)t->ndim, WSYNC_MAX_DIMS);
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] <= 0 || wsync_mul_u64(v, (uint64_t)t->shape[d], &v) != 0 ||
            v > WSYNC_PLAN_MAX_ELEMS)
            return wsync_err(code, "receiver %u target '%s': shape %s has a dim <= 0 or too many "
                             "elements", t->receiver, t->name, wsync_fmt_dims(&a, t->ndim, t->shape));
    }
    if ((st = check_mem(code, "target", t->name, t->mem, t->device)) != WSYNC_OK)
        return st;
    if ((unsigned)t->quant > WSYNC_QUANT_BLOCK || t->block_rows < 0 || t->block_cols < 0)
        return wsync_err(code, "receiver %u target '%s': quant scheme %d with blocks %d x %d",
                         t->receiver, t->name, (int)t->quant, (int)t->block_rows,
                         (int)t->block_cols);
    if (!isfinite(t->eps) || t->ue8m0 > 1 || t->no_saturate > 1)
        return wsync_err(code, "receiver %u target '%s': quant eps %g, ue8m0 %u, no_saturate %u",
                         t->receiver, t->name, (double)t->eps, t->ue8m0, t->no_saturate);
    if (t->npieces > WSYNC_MAX_PIECES)
        return wsync_err(code, "receiver %u target '%s': %u pieces, more than %d", t->receiver,
                         t->name, t->npieces, WSYNC_MAX_PIECES);
    if (t->npieces > 0 && t->pieces == NULL)
        return wsync_err(code, "receiver %u target '%s': %u pieces but pieces is NULL",
                         t->receiver, t->name, t->npieces);
    for (uint32_t i = 0; i < t->npieces; i++) {
        const wsync_piece_desc_t *p = &t->pieces[i];
        snprintf(what, sizeof(what), "receiver %u target '%s' piece %u", t->receiver, t->name, i);
        if ((st = check_pdesc(code, what, &p->param)) != WSYNC_OK)
            return st;
        if (p->param.ndim != t->ndim)
            return wsync_err(code, "%s: param '%s' has %d dims, the target %d (a piece keeps its "
                             "dims)", what, p->param.name, (int)p->param.ndim, (int)t->ndim);
        if (!span_inside(t->ndim, p->src.start, p->src.len, p->param.shape))
            return wsync_err(code, "%s: src box %s lies outside param '%s' %s", what,
                             wsync_fmt_span_box(&a, t->ndim, p->src.start, p->src.len), p->param.name,
                             wsync_fmt_dims(&b, t->ndim, p->param.shape));
        if (!span_inside(t->ndim, p->dst_start, p->src.len, t->shape))
            return wsync_err(code, "%s (param '%s'): dst %s lies outside the target %s", what,
                             p->param.name, wsync_fmt_span_box(&a, t->ndim, p->dst_start, p->src.len),
                             wsync_fmt_dims(&b, t->ndim, t->shape));
    }
    return check_overlaps(code, t);
}

void wsync_shard_desc_clear(wsync_shard_desc_t *s)
{
    if (s == NULL)
        return;
    free(s->param.name);
    memset(s, 0, sizeof(*s));
}

void wsync_target_desc_clear(wsync_target_desc_t *t)
{
    if (t == NULL)
        return;
    free(t->name);
    if (t->pieces != NULL)
        for (uint32_t i = 0; i < t->npieces; i++)
            free(t->pieces[i].param.name);
    free(t->pieces);
    memset(t, 0, sizeof(*t));
}

/* ------------------------------------------------------------------------------------------ */
/* From the public structs                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* Copy a public param (fields only; the name is borrowed until dup_names). */
static void param_copy(wsync_pdesc_t *out, const wsync_param_t *p)
{
    memset(out, 0, sizeof(*out));
    out->name = (char *)p->name;
    out->dtype = p->dtype;
    out->ndim = p->ndim;
    if (p->ndim >= 1 && p->ndim <= WSYNC_MAX_DIMS)
        memcpy(out->shape, p->shape, (size_t)p->ndim * sizeof(int64_t));
}

static void span_copy(int64_t *out, const int64_t *in, int nd)
{
    memset(out, 0, WSYNC_MAX_DIMS * sizeof(int64_t));
    if (nd >= 1 && nd <= WSYNC_MAX_DIMS)
        memcpy(out, in, (size_t)nd * sizeof(int64_t));
}

wsync_status_t wsync_shard_desc_from(const wsync_shard_t *shard, uint32_t sender, uint32_t index,
                                     wsync_shard_desc_t *out)
{
    wsync_shard_desc_t d;
    wsync_status_t st;

    if (shard == NULL || out == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "shard description: NULL argument");
    memset(&d, 0, sizeof(d));
    d.sender = sender;
    d.index = index;
    param_copy(&d.param, &shard->param);
    span_copy(d.box.start, shard->box.start, shard->param.ndim);
    span_copy(d.box.len, shard->box.len, shard->param.ndim);
    d.mem = shard->mem;
    d.device = shard->device;
    if ((st = check_shard(WSYNC_ERR_INVALID, &d)) != WSYNC_OK)
        return st;
    if (shard->data == NULL && !span_empty(d.param.ndim, d.box.len))
        return wsync_err(WSYNC_ERR_INVALID, "sender %u shard %u (param '%s'): data is NULL but "
                         "the box is not empty", sender, index, d.param.name);
    d.param.name = wsync_strdup(shard->param.name);
    if (d.param.name == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "shard of param '%s'", shard->param.name);
    *out = d;
    return WSYNC_OK;
}

wsync_status_t wsync_target_desc_from(const wsync_target_t *target, uint32_t receiver,
                                      uint32_t index, wsync_target_desc_t *out)
{
    wsync_target_desc_t d;
    wsync_status_t st;
    uint32_t n;

    if (target == NULL || out == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "target description: NULL argument");
    if (target->npieces < 0 || target->npieces > WSYNC_MAX_PIECES)
        return wsync_err(WSYNC_ERR_INVALID, "receiver %u target '%s': npieces %d not in [0, %d]",
                         receiver, nm(target->name), target->npieces, WSYNC_MAX_PIECES);
    if (target->npieces > 0 && target->pieces == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "receiver %u target '%s': %d pieces but pieces is "
                         "NULL", receiver, nm(target->name), target->npieces);
    n = (uint32_t)target->npieces;

    memset(&d, 0, sizeof(d));
    d.receiver = receiver;
    d.index = index;
    d.name = (char *)target->name;
    d.dtype = target->dtype;
    d.ndim = target->ndim;
    span_copy(d.shape, target->shape, target->ndim);
    d.mem = target->mem;
    d.device = target->device;
    d.quant = target->quant.scheme;
    d.block_rows = target->quant.block_rows;
    d.block_cols = target->quant.block_cols;
    if (d.quant == WSYNC_QUANT_BLOCK) {
        d.block_rows = d.block_rows ? d.block_rows : 128;
        d.block_cols = d.block_cols ? d.block_cols : 128;
        d.eps = isfinite(target->quant.eps) && target->quant.eps > 0.0f ? target->quant.eps
                                                                         : 1e-4f;
        d.ue8m0 = target->quant.ue8m0 ? 1 : 0;
    }
    d.no_saturate = target->quant.no_saturate ? 1 : 0;
    d.npieces = n;
    d.pieces = calloc(n ? n : 1, sizeof(*d.pieces));
    if (d.pieces == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "target '%s': %u pieces", nm(target->name), n);
    for (uint32_t i = 0; i < n; i++) {
        const wsync_piece_t *p = &target->pieces[i];
        param_copy(&d.pieces[i].param, &p->param);
        span_copy(d.pieces[i].src.start, p->src.start, p->param.ndim);
        span_copy(d.pieces[i].src.len, p->src.len, p->param.ndim);
        span_copy(d.pieces[i].dst_start, p->dst_start, p->param.ndim);
    }
    st = check_target(WSYNC_ERR_INVALID, &d);
    if (st == WSYNC_OK && target->data == NULL)
        st = wsync_err(WSYNC_ERR_INVALID, "receiver %u target '%s': data is NULL", receiver,
                       target->name);
    if (st != WSYNC_OK) {
        free(d.pieces);
        return st;
    }

    /* Validated with borrowed names; now own them. */
    d.name = wsync_strdup(target->name);
    for (uint32_t i = 0; i < n; i++)
        d.pieces[i].param.name = NULL;
    int ok = d.name != NULL;
    for (uint32_t i = 0; i < n && ok; i++)
        ok = (d.pieces[i].param.name = wsync_strdup(target->pieces[i].param.name)) != NULL;
    if (!ok) {
        wsync_target_desc_clear(&d);
        return wsync_err(WSYNC_ERR_NOMEM, "target '%s'", target->name);
    }
    *out = d;
    return WSYNC_OK;
}

void wsync_shard_descs_free(wsync_shard_desc_t *shards, size_t n)
{
    if (shards == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        wsync_shard_desc_clear(&shards[i]);
    free(shards);
}

void wsync_target_descs_free(wsync_target_desc_t *targets, size_t n)
{
    if (targets == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        wsync_target_desc_clear(&targets[i]);
    free(targets);
}

/* ------------------------------------------------------------------------------------------ */
/* Wire form                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* ndim clamped so that a malformed description can never be read past its arrays. */
static int wire_ndim(int32_t ndim)
{
    return ndim < 0 ? 0 : ndim > WSYNC_MAX_DIMS ? WSYNC_MAX_DIMS : (int)ndim;
}

static void put_dims(wsync_wbuf_t *b, const int64_t *v, int nd)
{
    for (int d = 0; d < nd; d++)
        wsync_put_i64(b, v[d]);
}

static void put_pdesc(wsync_wbuf_t *b, const wsync_pdesc_t *p)
{
    wsync_put_str(b, p->name);
    wsync_put_u8(b, (uint8_t)p->dtype);
    wsync_put_u8(b, (uint8_t)wire_ndim(p->ndim));
    put_dims(b, p->shape, wire_ndim(p->ndim));
}

void wsync_shards_encode(const wsync_shard_desc_t *shards, size_t n, wsync_wbuf_t *out)
{
    wsync_put_u32(out, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        const wsync_shard_desc_t *s = &shards[i];
        int nd = wire_ndim(s->param.ndim);
        wsync_put_u32(out, s->sender);
        wsync_put_u32(out, s->index);
        put_pdesc(out, &s->param);
        put_dims(out, s->box.start, nd);
        put_dims(out, s->box.len, nd);
        wsync_put_u8(out, (uint8_t)s->mem);
        wsync_put_i32(out, s->device);
    }
}

void wsync_targets_encode(const wsync_target_desc_t *targets, size_t n, wsync_wbuf_t *out)
{
    wsync_put_u32(out, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        const wsync_target_desc_t *t = &targets[i];
        int nd = wire_ndim(t->ndim);
        uint32_t np = t->pieces ? t->npieces : 0;
        wsync_put_u32(out, t->receiver);
        wsync_put_u32(out, t->index);
        wsync_put_str(out, t->name);
        wsync_put_u8(out, (uint8_t)t->dtype);
        wsync_put_u8(out, (uint8_t)nd);
        put_dims(out, t->shape, nd);
        wsync_put_u8(out, (uint8_t)t->mem);
        wsync_put_i32(out, t->device);
        wsync_put_u8(out, (uint8_t)t->quant);
        wsync_put_i32(out, t->block_rows);
        wsync_put_i32(out, t->block_cols);
        {
            uint32_t eb;
            memcpy(&eb, &t->eps, 4);
            wsync_put_u32(out, eb);
        }
        wsync_put_u8(out, (uint8_t)((t->ue8m0 ? 1u : 0u) | (t->no_saturate ? 2u : 0u)));
        wsync_put_u32(out, np);
        for (uint32_t k = 0; k < np; k++) {
            const wsync_piece_desc_t *p = &t->pieces[k];
            int pd = wire_ndim(p->param.ndim);
            put_pdesc(out, &p->param);
            put_dims(out, p->src.start, pd);
            put_dims(out, p->src.len, pd);
            put_dims(out, p->dst_start, pd);
        }
    }
}

/* Reads ndim (bounded first) then ndim values; dims above stay zero (the output is zeroed). */
static int get_ndim(wsync_rbuf_t *in, int32_t *ndim)
{
    uint8_t nd = wsync_get_u8(in);
    if (in->err || nd < 1 || nd > WSYNC_MAX_DIMS)
        return -1;
    *ndim = nd;
    return 0;
}

static void get_dims(wsync_rbuf_t *in, int64_t *v, int nd)
{
    for (int d = 0; d < nd; d++)
        v[d] = wsync_get_i64(in);
}

static int get_pdesc(wsync_rbuf_t *in, wsync_pdesc_t *p)
{
    p->name = wsync_get_str(in, WSYNC_NAME_MAX);
    if (p->name == NULL)        /* too long, holding a NUL, truncated, or encoded NULL */
        return -1;
    p->dtype = (wsync_dtype_t)wsync_get_u8(in);
    if (get_ndim(in, &p->ndim) != 0)
        return -1;
    get_dims(in, p->shape, p->ndim);
    return in->err ? -1 : 0;
}

wsync_status_t wsync_shards_decode(wsync_rbuf_t *in, wsync_shard_desc_t **shards, size_t *n)
{
    wsync_shard_desc_t *v;
    uint32_t count;
    wsync_status_t st = WSYNC_OK;

    if (in == NULL || shards == NULL || n == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "shards decode: NULL argument");
    count = wsync_get_count(in, SHARD_WIRE_MIN);
    if (in->err)
        return wsync_err(WSYNC_ERR_PROTOCOL, "shard descriptions: count missing or larger than "
                         "the message");
    v = calloc(count ? count : 1, sizeof(*v));
    if (v == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "%u shard descriptions", count);
    for (uint32_t i = 0; i < count && st == WSYNC_OK; i++) {
        wsync_shard_desc_t *s = &v[i];
        s->sender = wsync_get_u32(in);
        s->index = wsync_get_u32(in);
        if (get_pdesc(in, &s->param) != 0) {
            st = wsync_err(WSYNC_ERR_PROTOCOL, "shard description %u: malformed or truncated "
                           "param (name, dtype, ndim or shape)", i);
            break;
        }
        get_dims(in, s->box.start, s->param.ndim);
        get_dims(in, s->box.len, s->param.ndim);
        s->mem = (wsync_mem_t)wsync_get_u8(in);
        s->device = wsync_get_i32(in);
        if (in->err)
            st = wsync_err(WSYNC_ERR_PROTOCOL, "shard description %u ('%s'): truncated", i,
                           s->param.name);
        else
            st = check_shard(WSYNC_ERR_PROTOCOL, s);
    }
    if (st != WSYNC_OK) {
        wsync_shard_descs_free(v, count);
        return st;
    }
    *shards = v;
    *n = count;
    return WSYNC_OK;
}

static wsync_status_t decode_target(wsync_rbuf_t *in, uint32_t i, wsync_target_desc_t *t)
{
    uint32_t np;

    t->receiver = wsync_get_u32(in);
    t->index = wsync_get_u32(in);
    t->name = wsync_get_str(in, WSYNC_NAME_MAX);
    if (t->name == NULL)
        return wsync_err(WSYNC_ERR_PROTOCOL, "target description %u: name missing, too long or "
                         "truncated", i);
    t->dtype = (wsync_dtype_t)wsync_get_u8(in);
    if (get_ndim(in, &t->ndim) != 0)
        return wsync_err(WSYNC_ERR_PROTOCOL, "target description %u ('%s'): bad ndim", i, t->name);
    get_dims(in, t->shape, t->ndim);
    t->mem = (wsync_mem_t)wsync_get_u8(in);
    t->device = wsync_get_i32(in);
    t->quant = (wsync_quant_scheme_t)wsync_get_u8(in);
    t->block_rows = wsync_get_i32(in);
    t->block_cols = wsync_get_i32(in);
    {
        uint32_t eb = wsync_get_u32(in);
        uint8_t qf = wsync_get_u8(in);
        memcpy(&t->eps, &eb, 4);
        t->ue8m0 = qf & 1u;
        t->no_saturate = (qf >> 1) & 1u;
        if (qf > 3u) {
            t->ue8m0 = 2;            /* refused by the check below, naming the field */
        }
    }
    np = wsync_get_count(in, PIECE_WIRE_MIN);
    if (in->err)
        return wsync_err(WSYNC_ERR_PROTOCOL, "target description %u ('%s'): truncated, or a "
                         "piece count larger than the message", i, t->name);
    if (np > WSYNC_MAX_PIECES)
        return wsync_err(WSYNC_ERR_PROTOCOL, "target description %u ('%s'): %u pieces, more "
                         "than %d", i, t->name, np, WSYNC_MAX_PIECES);
    t->pieces = calloc(np ? np : 1, sizeof(*t->pieces));
    if (t->pieces == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "target '%s': %u pieces", t->name, np);
    t->npieces = np;     /* set now, so that clearing frees every name read so far */
    for (uint32_t k = 0; k < np; k++) {
        wsync_piece_desc_t *p = &t->pieces[k];
        if (get_pdesc(in, &p->param) != 0)
            return wsync_err(WSYNC_ERR_PROTOCOL, "target description %u ('%s') piece %u: "
                             "malformed or truncated param", i, t->name, k);
        get_dims(in, p->src.start, p->param.ndim);
        get_dims(in, p->src.len, p->param.ndim);
        get_dims(in, p->dst_start, p->param.ndim);
        if (in->err)
            return wsync_err(WSYNC_ERR_PROTOCOL, "target description %u ('%s') piece %u: "
                             "truncated", i, t->name, k);
    }
    return check_target(WSYNC_ERR_PROTOCOL, t);
}

wsync_status_t wsync_targets_decode(wsync_rbuf_t *in, wsync_target_desc_t **targets, size_t *n)
{
    wsync_target_desc_t *v;
    uint32_t count;
    wsync_status_t st = WSYNC_OK;

    if (in == NULL || targets == NULL || n == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "targets decode: NULL argument");
    count = wsync_get_count(in, TARGET_WIRE_MIN);
    if (in->err)
        return wsync_err(WSYNC_ERR_PROTOCOL, "target descriptions: count missing or larger than "
                         "the message");
    v = calloc(count ? count : 1, sizeof(*v));
    if (v == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "%u target descriptions", count);
    for (uint32_t i = 0; i < count && st == WSYNC_OK; i++)
        st = decode_target(in, i, &v[i]);
    if (st != WSYNC_OK) {
        wsync_target_descs_free(v, count);
        return st;
    }
    *targets = v;
    *n = count;
    return WSYNC_OK;
}
