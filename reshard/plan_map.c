/* Pass 2 of the plan compiler (plan.c): every piece of every target intersected with its
 * param's distinct boxes (plan_index.c), each intersection cut into 2-D regions: a logical chunk
 * (the source side, shared by every receiver that needs the same region of the same box) and a
 * logical segment (one receiver's destination). */
#include "reshard/plan.h"
#include "reshard/plan_internal.h"
#include "reshard/text.h"

#include "core/status.h"
#include "core/util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define UNCOVERED_BUDGET 100000         /* box-subtraction steps spent naming an uncovered index */

static int box_is_empty(int nd, const wsync_box_t *b)
{
    for (int d = 0; d < nd; d++)
        if (b->len[d] == 0)
            return 1;
    return 0;
}

static uint64_t hash_key(uint32_t dbox, const wsync_region_t *r)
{
    uint64_t k[5] = {dbox, r->off, r->pitch, r->rows, r->cols};
    return XXH3_64bits(k, sizeof(k));
}

static int lchunk_matches(const lchunk_t *l, uint32_t dbox, const wsync_region_t *r)
{
    return l->dbox == dbox && l->src.off == r->off && l->src.pitch == r->pitch &&
           l->src.rows == r->rows && l->src.cols == r->cols;
}

/* A distinct box's logical chunks are found by walking its list while it is short (one region
 * per box, or a few, in the usual layouts: the box's memory stays in cache, where a global table
 * would miss on every one of millions of chunks), and through the map once it is long (many
 * receivers wanting different slices of one replicated box), so neither way is quadratic. */
#define LIST_MAX 8

/* Slot of (dbox, region) in the map: its lchunk, or the empty slot where it would go. */
static size_t map_slot(const compile_t *c, uint32_t dbox, const wsync_region_t *r)
{
    size_t mask = c->map_cap - 1;
    size_t i = (size_t)hash_key(dbox, r) & mask;

    while (c->map[i] != UINT32_MAX && !lchunk_matches(&c->lchunks[c->map[i]], dbox, r))
        i = (i + 1) & mask;
    return i;
}

int wsync_plan_map_grow(compile_t *c)
{
    size_t old_cap = c->map_cap;
    uint32_t *old = c->map;
    size_t cap = old_cap ? old_cap * 2 : 1024;

    c->map = malloc(cap * sizeof(*c->map));
    if (c->map == NULL) {
        c->map = old;
        return -1;
    }
    memset(c->map, 0xff, cap * sizeof(*c->map));
    c->map_cap = cap;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i] != UINT32_MAX) {
            const lchunk_t *l = &c->lchunks[old[i]];
            c->map[map_slot(c, l->dbox, &l->src)] = old[i];
        }
    }
    free(old);
    return 0;
}

/* Everything needed to emit the regions of one intersection. */
typedef struct {
    const wsync_target_desc_t *target;
    uint32_t piece;
    uint32_t dbox;
    const rep_t *rep;                /* replica that stages new chunks */
    wsync_dtype_t dtype;
} emit_t;

/* Index a distinct box's logical chunks in the map: all of them when its list has just
 * passed LIST_MAX, else its newest (the list head). */
static int map_add(compile_t *c, const dbox_t *db)
{
    int all = db->nl == LIST_MAX + 1;

    for (uint32_t k = db->head; k != UINT32_MAX; k = all ? c->lchunks[k].next : UINT32_MAX) {
        const lchunk_t *l = &c->lchunks[k];
        if ((c->nmapped + 1) * 2 > c->map_cap && wsync_plan_map_grow(c) != 0)
            return -1;
        c->map[map_slot(c, l->dbox, &l->src)] = k;
        c->nmapped++;
    }
    return 0;
}

static wsync_status_t emit_region(compile_t *c, const emit_t *e, const wsync_region_t *src,
                                  const wsync_region_t *dst)
{
    uint32_t idx;
    lseg_t *sg;

    dbox_t *db = &c->boxes[e->dbox];

    idx = UINT32_MAX;
    if (db->nl <= LIST_MAX) {
        for (uint32_t k = db->head; k != UINT32_MAX; k = c->lchunks[k].next)
            if (lchunk_matches(&c->lchunks[k], e->dbox, src)) {
                idx = k;
                break;
            }
    } else {
        idx = c->map[map_slot(c, e->dbox, src)];
    }
    if (idx == UINT32_MAX) {
        lchunk_t *l;
        if (c->nlchunks >= UINT32_MAX - 1)
            return wsync_err(WSYNC_ERR_RANGE, "plan: more than %u chunks", UINT32_MAX - 1);
        if (plan_grow((void **)&c->lchunks, &c->cap_lchunks, c->nlchunks + 1, sizeof(*c->lchunks)))
            return wsync_err(WSYNC_ERR_NOMEM, "plan: %zu chunks", c->nlchunks + 1);
        idx = (uint32_t)c->nlchunks++;
        l = &c->lchunks[idx];
        memset(l, 0, sizeof(*l));
        l->sender = e->rep->sender;
        l->shard = e->rep->index;
        l->spos = e->rep->spos;
        l->dbox = e->dbox;
        l->dtype = e->dtype;
        l->src = *src;
        c->load[l->sender] += src->rows * src->cols * wsync_dtype_size(e->dtype);
        l->next = db->head;
        db->head = idx;
        if (++db->nl > LIST_MAX && map_add(c, db) != 0)
            return wsync_err(WSYNC_ERR_NOMEM, "plan: chunk index");
    }
    if (c->nlsegs >= UINT32_MAX - 1)
        return wsync_err(WSYNC_ERR_RANGE, "plan: more than %u segments", UINT32_MAX - 1);
    if (plan_grow((void **)&c->lsegs, &c->cap_lsegs, c->nlsegs + 1, sizeof(*c->lsegs)))
        return wsync_err(WSYNC_ERR_NOMEM, "plan: %zu segments", c->nlsegs + 1);
    sg = &c->lsegs[c->nlsegs++];
    sg->piece = e->piece;
    sg->lchunk = idx;
    sg->dst_off = dst->off;
    sg->dst_pitch = dst->pitch;
    return WSYNC_OK;
}

/* Row-major strides of a dense array. */
static void strides_of(int nd, const int64_t *shape, uint64_t *stride)
{
    stride[nd - 1] = 1;
    for (int d = nd - 2; d >= 0; d--)
        stride[d] = stride[d + 1] * (uint64_t)shape[d + 1];
}

/* Cut intersection `x` (param coordinates) of piece `p` with distinct box `db` into 2-D regions
 * of the shard (dense over db's box) and of the target, and emit them. The last dim is always the
 * columns (params of 1 or 2 dims map directly); the dims above form the rows, merged upward while
 * they span their whole extent in both buffers; what cannot merge loops, one region per index. */
static wsync_status_t emit_intersection(compile_t *c, const emit_t *e, const wsync_box_t *x,
                                        const wsync_box_t *db, const wsync_piece_desc_t *p)
{
    const wsync_target_desc_t *t = e->target;
    int nd = t->ndim;
    uint64_t ss[WSYNC_MAX_DIMS], ds[WSYNC_MAX_DIMS];
    uint64_t sbase = 0, dbase = 0, cols = (uint64_t)x->len[nd - 1];
    /* groups above the columns, innermost first: [0] rows, then loops */
    uint64_t glen[WSYNC_MAX_DIMS], gss[WSYNC_MAX_DIMS], gds[WSYNC_MAX_DIMS];
    int ng = 0, have = 0, full = 0;
    uint64_t len = 0, gs = 0, gd = 0;

    strides_of(nd, db->len, ss);
    strides_of(nd, t->shape, ds);
    for (int d = 0; d < nd; d++) {
        sbase += (uint64_t)(x->start[d] - db->start[d]) * ss[d];
        dbase += (uint64_t)(x->start[d] - p->src.start[d] + p->dst_start[d]) * ds[d];
    }
    for (int d = nd - 2; d >= 0; d--) {
        uint64_t l = (uint64_t)x->len[d];
        int f = x->len[d] == db->len[d] && x->len[d] == t->shape[d];
        if (have && full) {          /* the group spans its dims whole: dim d stacks on it */
            len *= l;
            full = f;
            continue;
        }
        if (l == 1)                  /* contributes only to the offsets */
            continue;
        if (have && len > 1) {
            glen[ng] = len, gss[ng] = gs, gds[ng] = gd;
            ng++;
        }
        len = l, gs = ss[d], gd = ds[d], full = f, have = 1;
    }
    if (have && len > 1) {
        glen[ng] = len, gss[ng] = gs, gds[ng] = gd;
        ng++;
    }

    uint64_t rows = ng > 0 ? glen[0] : 1;
    wsync_region_t src = {0, rows > 1 ? gss[0] : cols, rows, cols};
    wsync_region_t dst = {0, rows > 1 ? gds[0] : cols, rows, cols};
    uint64_t n1 = ng > 1 ? glen[1] : 1, n2 = ng > 2 ? glen[2] : 1;

    for (uint64_t i2 = 0; i2 < n2; i2++) {
        for (uint64_t i1 = 0; i1 < n1; i1++) {
            wsync_status_t st;
            src.off = sbase + (ng > 1 ? i1 * gss[1] : 0) + (ng > 2 ? i2 * gss[2] : 0);
            dst.off = dbase + (ng > 1 ? i1 * gds[1] : 0) + (ng > 2 ? i2 * gds[2] : 0);
            if ((st = emit_region(c, e, &src, &dst)) != WSYNC_OK)
                return st;
        }
    }
    return WSYNC_OK;
}

/* The replica of a distinct box with the fewest bytes staged so far (ties: lowest rank). */
static const rep_t *pick_replica(const compile_t *c, const dbox_t *db)
{
    const rep_t *best = &c->reps[db->rep0];

    for (uint32_t k = 1; k < db->nrep; k++) {
        const rep_t *r = &c->reps[db->rep0 + k];
        if (c->load[r->sender] < c->load[best->sender])
            best = r;
    }
    return best;
}

static int index_less(int nd, const int64_t *a, const int64_t *b)
{
    for (int d = 0; d < nd; d++)
        if (a[d] != b[d])
            return a[d] < b[d];
    return 0;
}

/* Smallest (row-major) index of box b that none of boxes[from..n) covers, by box subtraction:
 * 1 found (*out), 0 all covered, -1 out of budget. */
static int find_uncovered(const compile_t *c, int nd, const wsync_box_t *b, uint32_t from,
                          uint32_t n, int64_t *out, int *budget)
{
    wsync_box_t x, rem = *b, frags[2 * WSYNC_MAX_DIMS], kb;
    int nf = 0, found = 0;
    uint32_t k;

    if (--*budget < 0)
        return -1;
    for (k = from; k < n; k++) {
        coords_to_box(nd, c->coords + c->boxes[k].coord, &kb);
        if (box_intersect(nd, b, &kb, &x))
            break;
    }
    if (k == n) {
        memcpy(out, b->start, (size_t)nd * sizeof(int64_t));
        return 1;
    }
    /* b minus x as disjoint fragments: below and above x in dim d, dims < d clipped to x */
    for (int d = 0; d < nd; d++) {
        if (rem.start[d] < x.start[d]) {
            frags[nf] = rem;
            frags[nf].len[d] = x.start[d] - rem.start[d];
            nf++;
        }
        if (x.start[d] + x.len[d] < rem.start[d] + rem.len[d]) {
            frags[nf] = rem;
            frags[nf].start[d] = x.start[d] + x.len[d];
            frags[nf].len[d] = rem.start[d] + rem.len[d] - frags[nf].start[d];
            nf++;
        }
        rem.start[d] = x.start[d];
        rem.len[d] = x.len[d];
    }
    for (int f = 0; f < nf; f++) {
        int64_t idx[WSYNC_MAX_DIMS];
        int r = find_uncovered(c, nd, &frags[f], k + 1, n, idx, budget);
        if (r < 0)
            return -1;       /* a partial search cannot tell which index is first */
        if (r == 1 && (!found || index_less(nd, idx, out)))
            memcpy(out, idx, (size_t)nd * sizeof(int64_t));
        found |= r == 1;
    }
    return found;
}

static wsync_status_t map_piece(compile_t *c, const wsync_target_desc_t *t, uint32_t pi)
{
    const wsync_piece_desc_t *p = &t->pieces[pi];
    const param_t *par;
    const wsync_shard_desc_t *ref;
    int nd = t->ndim;
    uint64_t vol, covered = 0;
    wsync_box_t dstbox;
    wsync_text_t ta, tb;

    if (!name_ok(p->param.name))
        return wsync_err(WSYNC_ERR_INVALID, "receiver %u target '%s' piece %u: param name is "
                         "missing, empty or too long", t->receiver, t->name, pi);
    par = wsync_plan_find_param(c, p->param.name);
    if (par == NULL)
        return wsync_err(WSYNC_ERR_MISMATCH, "receiver %u target '%s' asks for param '%s', which "
                         "no sender holds", t->receiver, t->name, p->param.name);
    ref = par->ref;
    if (p->param.ndim != ref->param.ndim || p->param.dtype != ref->param.dtype ||
        memcmp(p->param.shape, ref->param.shape,
               (size_t)WSYNC_MIN(WSYNC_MAX(p->param.ndim, 1), WSYNC_MAX_DIMS) * sizeof(int64_t))) {
        return wsync_err(WSYNC_ERR_MISMATCH, "receiver %u target '%s' piece %u: param '%s' is %s "
                         "%s at the senders but the receiver expects %s %s", t->receiver, t->name,
                         pi, p->param.name, wsync_dtype_name(ref->param.dtype),
                         wsync_fmt_dims(&ta, ref->param.ndim, ref->param.shape),
                         wsync_dtype_name(p->param.dtype),
                         wsync_fmt_dims(&tb, WSYNC_MIN(WSYNC_MAX(p->param.ndim, 0), WSYNC_MAX_DIMS),
                                   p->param.shape));
    }
    if (p->param.ndim != nd)
        return wsync_err(WSYNC_ERR_INVALID, "receiver %u target '%s' piece %u: param '%s' has %d "
                         "dims, the target %d (a piece keeps its dims)", t->receiver, t->name, pi,
                         p->param.name, (int)p->param.ndim, nd);
    if (!span_inside(nd, p->src.start, p->src.len, ref->param.shape))
        return wsync_err(WSYNC_ERR_INVALID, "receiver %u target '%s' piece %u: box %s lies outside "
                         "param '%s' %s", t->receiver, t->name, pi, wsync_fmt_box(&ta, nd, &p->src),
                         p->param.name, wsync_fmt_dims(&tb, nd, ref->param.shape));
    memset(&dstbox, 0, sizeof(dstbox));
    memcpy(dstbox.start, p->dst_start, (size_t)nd * sizeof(int64_t));
    memcpy(dstbox.len, p->src.len, (size_t)nd * sizeof(int64_t));
    if (!span_inside(nd, dstbox.start, dstbox.len, t->shape))
        return wsync_err(WSYNC_ERR_INVALID, "receiver %u target '%s' piece %u (param '%s'): "
                         "destination %s lies outside the target %s", t->receiver, t->name, pi,
                         p->param.name, wsync_fmt_box(&ta, nd, &dstbox), wsync_fmt_dims(&tb, nd, t->shape));
    if (!dtype_reachable(ref->param.dtype, t->dtype, t->quant))
        return wsync_err(WSYNC_ERR_MISMATCH, "receiver %u target '%s' (%s%s) cannot be filled from "
                         "param '%s' (%s)", t->receiver, t->name, wsync_dtype_name(t->dtype),
                         dtype_is_fp8(t->dtype) && t->quant == WSYNC_QUANT_NONE ? ", no quant"
                                                                                 : "",
                         p->param.name, wsync_dtype_name(ref->param.dtype));
    if (box_is_empty(nd, &p->src))
        return WSYNC_OK;

    vol = box_volume(nd, &p->src);
    for (uint32_t k = par->box0; k < par->box0 + par->nbox; k++) {
        const dbox_t *db = &c->boxes[k];
        const int64_t *co = c->coords + db->coord;
        wsync_box_t x, dbb;
        emit_t e;
        wsync_status_t st;

        if (co[0] >= p->src.start[0] + p->src.len[0])
            break;           /* boxes are sorted by start: none further can meet the piece */
        coords_to_box(nd, co, &dbb);
        if (!box_intersect(nd, &p->src, &dbb, &x))
            continue;
        covered += box_volume(nd, &x);
        e.target = t;
        e.piece = pi;
        e.dbox = k;
        e.rep = pick_replica(c, db);
        e.dtype = ref->param.dtype;
        if ((st = emit_intersection(c, &e, &x, &dbb, p)) != WSYNC_OK)
            return st;
    }
    if (covered != vol) {
        int64_t idx[WSYNC_MAX_DIMS] = {0};
        int budget = UNCOVERED_BUDGET;
        int r = find_uncovered(c, nd, &p->src, par->box0, par->box0 + par->nbox, idx, &budget);
        char where[300] = "";
        if (r == 1)
            snprintf(where, sizeof(where), "; the first is at index %s", wsync_fmt_dims(&ta, nd, idx));
        return wsync_err(WSYNC_ERR_MISMATCH, "receiver %u target '%s' piece %u: %" PRIu64 " of "
                         "%" PRIu64 " elements of param '%s' box %s are held by no sender%s",
                         t->receiver, t->name, pi, vol - covered, vol, p->param.name,
                         wsync_fmt_box(&tb, nd, &p->src), where);
    }
    return WSYNC_OK;
}

static int cmp_target_by_rank(const void *a, const void *b)
{
    const wsync_target_desc_t *x = *(const wsync_target_desc_t *const *)a;
    const wsync_target_desc_t *y = *(const wsync_target_desc_t *const *)b;
    return cmp_rank_index(x->receiver, x->index, y->receiver, y->index);
}

static wsync_status_t check_target(const compile_t *c, const wsync_target_desc_t *t)
{
    wsync_text_t a;

    if (!name_ok(t->name))
        return wsync_err(WSYNC_ERR_INVALID, "receiver %u target %u: name is missing, empty or "
                         "longer than %d bytes", t->receiver, t->index, WSYNC_NAME_MAX);
    if (t->receiver >= c->nreceivers)
        return wsync_err(WSYNC_ERR_INVALID, "target '%s': receiver rank %u is not below the %u "
                         "receivers", t->name, t->receiver, c->nreceivers);
    if (wsync_dtype_size(t->dtype) == 0)
        return wsync_err(WSYNC_ERR_INVALID, "receiver %u target '%s': unknown dtype %d",
                         t->receiver, t->name, (int)t->dtype);
    if (t->ndim < 1 || t->ndim > WSYNC_MAX_DIMS)
        return wsync_err(WSYNC_ERR_INVALID, "receiver %u target '%s': ndim %d not in [1, %d]",
                         t->receiver, t->name, (int)t->ndim, WSYNC_MAX_DIMS);
    if (shape_volume(t->ndim, t->shape) == 0)
        return wsync_err(WSYNC_ERR_INVALID, "receiver %u target '%s': shape %s has a dim <= 0 or "
                         "too many elements", t->receiver, t->name,
                         wsync_fmt_dims(&a, t->ndim, t->shape));
    if (t->npieces > 0 && t->pieces == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "receiver %u target '%s': %u pieces but no array",
                         t->receiver, t->name, t->npieces);
    return WSYNC_OK;
}

/* Targets that ask for the same bytes laid out the same way (every receiver's copy of a weight
 * replicated over data-parallel ranks: 256 receivers of Kimi-K2 with DP attention each take its
 * attention, dense and shared weights whole) get the same logical segments but for the receiver
 * and target numbers. Such a target takes the logical segments of the first one like it (its
 * tref_t names them) instead of intersecting its pieces again: that one found or made every
 * logical chunk they use, so they are what mapping the pieces would give (the same chunks; none
 * new, so no replica's load changes either). */
typedef struct {
    uint64_t hash;
    uint32_t target;                 /* index in the receiver-ordered list of targets */
    uint32_t lseg0, nlseg;           /* its logical segments */
} tsig_t;

static uint64_t target_hash(const wsync_target_desc_t *t)
{
    uint64_t h = XXH3_64bits(t->shape, (size_t)t->ndim * sizeof(int64_t));

    h = h * 31 + (uint64_t)t->dtype * 7 + (uint64_t)t->quant * 3 + t->npieces;
    for (uint32_t k = 0; k < t->npieces; k++) {
        const wsync_piece_desc_t *p = &t->pieces[k];
        size_t nd = (size_t)WSYNC_MIN(WSYNC_MAX(t->ndim, 1), WSYNC_MAX_DIMS);
        h = h * 31 + (p->param.name ? name_hash(p->param.name) : 0);
        h = h * 31 + XXH3_64bits(p->src.start, nd * sizeof(int64_t));
        h = h * 31 + XXH3_64bits(p->src.len, nd * sizeof(int64_t));
        h = h * 31 + XXH3_64bits(p->dst_start, nd * sizeof(int64_t));
    }
    return h;
}

/* Same layout as far as the plan can tell: shape, dtype, quant and its knobs (FP8 on the wire
 * reads them), and every piece's param (name, dtype, dims) and boxes. Only the receiver, index
 * and name may differ. */
static int same_target(const wsync_target_desc_t *a, const wsync_target_desc_t *b)
{
    size_t nd = (size_t)a->ndim;

    if (a->ndim != b->ndim || a->dtype != b->dtype || a->quant != b->quant ||
        a->block_rows != b->block_rows || a->block_cols != b->block_cols ||
        memcmp(&a->eps, &b->eps, sizeof(float)) != 0 || a->ue8m0 != b->ue8m0 ||
        a->no_saturate != b->no_saturate || a->npieces != b->npieces || memcmp(a->shape, b->shape, nd * sizeof(int64_t)) != 0)
        return 0;
    for (uint32_t k = 0; k < a->npieces; k++) {
        const wsync_piece_desc_t *p = &a->pieces[k], *q = &b->pieces[k];
        if (p->param.name == NULL || q->param.name == NULL ||
            strcmp(p->param.name, q->param.name) != 0 || p->param.dtype != q->param.dtype ||
            p->param.ndim != q->param.ndim ||
            memcmp(p->param.shape, q->param.shape, nd * sizeof(int64_t)) != 0 ||
            memcmp(p->src.start, q->src.start, nd * sizeof(int64_t)) != 0 ||
            memcmp(p->src.len, q->src.len, nd * sizeof(int64_t)) != 0 ||
            memcmp(p->dst_start, q->dst_start, nd * sizeof(int64_t)) != 0)
            return 0;
    }
    return 1;
}

wsync_status_t wsync_plan_map_targets(compile_t *c)
{
    const wsync_target_desc_t **sorted;
    tsig_t *sig = NULL;
    size_t sig_cap = 16;
    wsync_status_t st = WSYNC_OK;
    size_t n = c->ntargets;

    sorted = malloc((n ? n : 1) * sizeof(*sorted));
    c->trefs = malloc((n ? n : 1) * sizeof(*c->trefs));
    while (sig_cap < 2 * n)
        sig_cap *= 2;
    sig = malloc(sig_cap * sizeof(*sig));
    if (sorted == NULL || c->trefs == NULL || sig == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan: indexing %zu targets", n);
        goto out;
    }
    for (size_t i = 0; i < sig_cap; i++)
        sig[i].target = UINT32_MAX;
    for (size_t i = 0; i < n; i++) {
        if ((st = check_target(c, &c->targets[i])) != WSYNC_OK)
            goto out;
        sorted[i] = &c->targets[i];
    }
    qsort(sorted, n, sizeof(*sorted), cmp_target_by_rank);
    for (size_t i = 0; i < n; i++) {
        const wsync_target_desc_t *t = sorted[i];
        uint64_t h;
        size_t slot;

        if (i > 0 && cmp_target_by_rank(&sorted[i - 1], &sorted[i]) == 0) {
            st = wsync_err(WSYNC_ERR_INVALID, "receiver %u describes two targets with index %u "
                           "('%s' and '%s')", sorted[i]->receiver, sorted[i]->index,
                           sorted[i - 1]->name, sorted[i]->name);
            goto out;
        }
        h = target_hash(t);
        for (slot = (size_t)h & (sig_cap - 1); sig[slot].target != UINT32_MAX;
             slot = (slot + 1) & (sig_cap - 1))
            if (sig[slot].hash == h && same_target(sorted[sig[slot].target], t))
                break;
        tref_t *tr = &c->trefs[i];
        tr->desc = t;
        tr->receiver = t->receiver;
        tr->target = t->index;
        tr->shared = 0;
        tr->nseg = 0;
        if (sig[slot].target != UINT32_MAX) {       /* laid out like an earlier target */
            const tsig_t *g = &sig[slot];
            tr->src = g->target;
            tr->lseg0 = g->lseg0;
            tr->nlseg = g->nlseg;
            c->trefs[g->target].shared = 1;
            continue;
        }
        size_t lseg0 = c->nlsegs;
        for (uint32_t k = 0; k < t->npieces; k++)
            if ((st = map_piece(c, t, k)) != WSYNC_OK)
                goto out;
        tr->src = (uint32_t)i;
        tr->lseg0 = (uint32_t)lseg0;
        tr->nlseg = (uint32_t)(c->nlsegs - lseg0);
        sig[slot].hash = h;
        sig[slot].target = (uint32_t)i;
        sig[slot].lseg0 = (uint32_t)lseg0;
        sig[slot].nlseg = (uint32_t)(c->nlsegs - lseg0);
    }
out:
    free(sorted);
    free(sig);
    return st;
}
