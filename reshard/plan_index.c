/* Pass 1 of the plan compiler (plan.c): the shards checked, put in (sender, index) order and
 * indexed by param (a hash table on the name), and each param's boxes grouped into distinct
 * boxes with their holders, checked to be identical replicas or disjoint. */
#include "reshard/plan.h"
#include "reshard/plan_internal.h"
#include "reshard/text.h"

#include "core/status.h"
#include "core/util.h"

#include <stdlib.h>
#include <string.h>

/* Pass 1 runs in time linear in the shards (a plan of Kimi-K2 from 64 FSDP ranks has 4.4 million
 * of them): shards are put in (sender, index) order by a counting sort on the sender, grouped by
 * param through a hash table on the name, and only each param's own few boxes are sorted. */

/* Lexicographic order of two boxes' coordinates (nd starts then nd lengths): the order of
 * cmp_box below. */
static int cmp_coords(int nd, const int64_t *a, const int64_t *b)
{
    for (int d = 0; d < 2 * nd; d++)
        if (a[d] != b[d])
            return a[d] < b[d] ? -1 : 1;
    return 0;
}

static int cmp_shard_by_rank(const void *a, const void *b)
{
    const wsync_shard_desc_t *x = *(const wsync_shard_desc_t *const *)a;
    const wsync_shard_desc_t *y = *(const wsync_shard_desc_t *const *)b;
    return cmp_rank_index(x->sender, x->index, y->sender, y->index);
}

/* A shard's box copied next to the others of its param (only the first nd dims are set), so
 * that sorting and grouping them reads one small array. */
typedef struct {
    wsync_box_t box;
    int nd;
    rep_t rep;
} boxed_t;

static int cmp_i64(int64_t a, int64_t b)
{
    return a < b ? -1 : a > b;
}

/* Order of boxes over their first nd dims: by start, then by length. */
static int cmp_box(int nd, const wsync_box_t *a, const wsync_box_t *b)
{
    for (int d = 0; d < nd; d++) {
        int c = cmp_i64(a->start[d], b->start[d]);
        if (c)
            return c;
    }
    for (int d = 0; d < nd; d++) {
        int c = cmp_i64(a->len[d], b->len[d]);
        if (c)
            return c;
    }
    return 0;
}

static int cmp_boxed(const void *a, const void *b)
{
    const boxed_t *x = a, *y = b;
    int c = cmp_box(x->nd, &x->box, &y->box);   /* one param: one ndim */
    return c ? c : cmp_rank_index(x->rep.sender, x->rep.index, y->rep.sender, y->rep.index);
}

static wsync_status_t check_shard(const compile_t *c, const wsync_shard_desc_t *s)
{
    wsync_text_t a, b;

    if (!name_ok(s->param.name))
        return wsync_err(WSYNC_ERR_INVALID, "sender %u shard %u: param name is missing, empty or "
                         "longer than %d bytes", s->sender, s->index, WSYNC_NAME_MAX);
    if (s->sender >= c->nsenders)
        return wsync_err(WSYNC_ERR_INVALID, "param '%s': sender rank %u is not below the %u "
                         "senders", s->param.name, s->sender, c->nsenders);
    if (wsync_dtype_size(s->param.dtype) == 0)
        return wsync_err(WSYNC_ERR_INVALID, "param '%s' at sender %u: unknown dtype %d",
                         s->param.name, s->sender, (int)s->param.dtype);
    if (s->param.ndim < 1 || s->param.ndim > WSYNC_MAX_DIMS)
        return wsync_err(WSYNC_ERR_INVALID, "param '%s' at sender %u: ndim %d not in [1, %d]",
                         s->param.name, s->sender, (int)s->param.ndim, WSYNC_MAX_DIMS);
    if (shape_volume(s->param.ndim, s->param.shape) == 0)
        return wsync_err(WSYNC_ERR_INVALID, "param '%s' at sender %u: shape %s has a dim <= 0 or "
                         "too many elements", s->param.name, s->sender,
                         wsync_fmt_dims(&a, s->param.ndim, s->param.shape));
    if (!span_inside(s->param.ndim, s->box.start, s->box.len, s->param.shape))
        return wsync_err(WSYNC_ERR_INVALID, "param '%s' at sender %u: box %s lies outside the "
                         "shape %s", s->param.name, s->sender, wsync_fmt_box(&a, s->param.ndim, &s->box),
                         wsync_fmt_dims(&b, s->param.ndim, s->param.shape));
    return WSYNC_OK;
}

static int same_param(const wsync_shard_desc_t *a, const wsync_shard_desc_t *b)
{
    if (a->param.dtype != b->param.dtype || a->param.ndim != b->param.ndim)
        return 0;
    for (int d = 0; d < a->param.ndim; d++)
        if (a->param.shape[d] != b->param.shape[d])
            return 0;
    return 1;
}

/* Group one param's shards into distinct boxes and check they are disjoint. Its n holders are
 * c->reps[r0 ..) with their boxes' coordinates at c->coords[c0 ..) (2 nd each), in (sender,
 * index) order; empty boxes are dropped, and the rest sorted by box only when not already in
 * that order (FSDP hands them out by rank, in order). tmp has room for n. */
static wsync_status_t build_boxes(compile_t *c, param_t *p, size_t r0, uint64_t c0, size_t n,
                                  boxed_t *tmp)
{
    int nd = p->ref->param.ndim, sorted = 1;
    size_t m = 0, w = 2 * (size_t)nd;
    int64_t *co = c->coords + c0;
    rep_t *rp = c->reps + r0;
    wsync_text_t ta, tb;

    for (size_t i = 0; i < n; i++) {
        int empty = 0;
        for (int d = 0; d < nd; d++)
            empty |= co[i * w + (size_t)nd + (size_t)d] == 0;
        if (empty)
            continue;
        if (m != i) {
            memmove(co + m * w, co + i * w, w * sizeof(int64_t));
            rp[m] = rp[i];
        }
        if (m > 0 && cmp_coords(nd, co + (m - 1) * w, co + m * w) > 0)
            sorted = 0;
        m++;
    }
    if (!sorted) {
        for (size_t i = 0; i < m; i++) {
            coords_to_box(nd, co + i * w, &tmp[i].box);
            tmp[i].nd = nd;
            tmp[i].rep = rp[i];
        }
        qsort(tmp, m, sizeof(*tmp), cmp_boxed);
        for (size_t i = 0; i < m; i++) {
            memcpy(co + i * w, tmp[i].box.start, (size_t)nd * sizeof(int64_t));
            memcpy(co + i * w + nd, tmp[i].box.len, (size_t)nd * sizeof(int64_t));
            rp[i] = tmp[i].rep;
        }
    }

    p->box0 = (uint32_t)c->nboxes;
    for (size_t i = 0; i < m; i++) {
        if (i == 0 || cmp_coords(nd, co + i * w, co + (i - 1) * w) != 0) {
            dbox_t *db = &c->boxes[c->nboxes++];
            db->coord = c0 + i * w;
            db->rep0 = (uint32_t)(r0 + i);
            db->nrep = 0;
            db->head = UINT32_MAX;
            db->nl = 0;
        }
        c->boxes[c->nboxes - 1].nrep++;
    }
    p->nbox = (uint32_t)c->nboxes - p->box0;

    /* Sorted by start, so only boxes starting before i ends in dim 0 can meet it. */
    for (uint32_t i = p->box0; i < p->box0 + p->nbox; i++) {
        const dbox_t *a = &c->boxes[i];
        wsync_box_t ab;
        coords_to_box(nd, c->coords + a->coord, &ab);
        for (uint32_t j = i + 1; j < p->box0 + p->nbox; j++) {
            const dbox_t *b = &c->boxes[j];
            wsync_box_t bb, x;
            coords_to_box(nd, c->coords + b->coord, &bb);
            if (bb.start[0] >= ab.start[0] + ab.len[0])
                break;
            if (box_intersect(nd, &ab, &bb, &x))
                return wsync_err(WSYNC_ERR_MISMATCH, "param '%s': the boxes of sender %u %s and "
                                 "sender %u %s partially overlap (boxes must be identical "
                                 "replicas or disjoint)", p->ref->param.name,
                                 c->reps[a->rep0].sender, wsync_fmt_box(&ta, nd, &ab),
                                 c->reps[b->rep0].sender, wsync_fmt_box(&tb, nd, &bb));
        }
    }
    return WSYNC_OK;
}

/* Slot of `name` in the param table: its param, or the empty slot where it would go. */
static size_t pmap_slot(const compile_t *c, const char *name, uint64_t h)
{
    size_t mask = c->pmap_cap - 1, i = (size_t)h & mask;

    while (c->pmap[i] != UINT32_MAX && strcmp(c->params[c->pmap[i]].ref->param.name, name) != 0)
        i = (i + 1) & mask;
    return i;
}

static int pmap_grow(compile_t *c)
{
    size_t old_cap = c->pmap_cap, cap = old_cap ? old_cap * 2 : 1024;
    uint32_t *old = c->pmap;

    c->pmap = malloc(cap * sizeof(*c->pmap));
    if (c->pmap == NULL) {
        c->pmap = old;
        return -1;
    }
    memset(c->pmap, 0xff, cap * sizeof(*c->pmap));
    c->pmap_cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i] != UINT32_MAX) {
            const char *name = c->params[old[i]].ref->param.name;
            c->pmap[pmap_slot(c, name, name_hash(name))] = old[i];
        }
    free(old);
    return 0;
}

/* Put the shards in (sender, index) order into sorted[]: a stable counting sort by sender, then
 * a sort of any sender whose shards were not given in index order; refuse a repeated index.
 * in_order: the caller saw them given in strictly rising (sender, index) order already (as the
 * coordinator and the summary hand them over), which needs none of that. */
static wsync_status_t order_shards(compile_t *c, const wsync_shard_desc_t **sorted, int in_order)
{
    size_t *start;
    size_t n = c->nshards;

    if (in_order) {
        for (size_t i = 0; i < n; i++)
            sorted[i] = &c->shards[i];
        return WSYNC_OK;
    }
    start = calloc((size_t)c->nsenders + 1, sizeof(*start));
    if (start == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "plan: ordering %zu shards", n);
    for (size_t i = 0; i < n; i++)
        start[c->shards[i].sender + 1]++;
    for (uint32_t s = 0; s < c->nsenders; s++)
        start[s + 1] += start[s];
    for (size_t i = 0; i < n; i++)
        sorted[start[c->shards[i].sender]++] = &c->shards[i];   /* start[s] becomes its end */
    /* a run given in strictly rising index order is sorted and has no repeat; only a run that
     * is not needs the sort and the check for repeats */
    for (uint32_t s = 0, lo = 0; s < c->nsenders; lo = (uint32_t)start[s], s++) {
        size_t hi = start[s];
        for (size_t i = lo + 1; i < hi; i++)
            if (sorted[i - 1]->index >= sorted[i]->index) {
                qsort(sorted + lo, hi - lo, sizeof(*sorted), cmp_shard_by_rank);
                for (size_t j = lo + 1; j < hi; j++)
                    if (sorted[j - 1]->index == sorted[j]->index) {
                        wsync_status_t st = wsync_err(
                            WSYNC_ERR_INVALID, "sender %u describes two shards with index %u "
                            "('%s' and '%s')", sorted[j]->sender, sorted[j]->index,
                            sorted[j - 1]->param.name, sorted[j]->param.name);
                        free(start);
                        return st;
                    }
                break;
            }
    }
    free(start);
    return WSYNC_OK;
}

/* The param of name `name`: params[guess] when guess names it (checked by the name), else
 * through the table, adding the param (with s as its reference) when new. UINT32_MAX when out
 * of memory. */
static uint32_t param_of(compile_t *c, const wsync_shard_desc_t *s, uint32_t guess)
{
    size_t slot;

    if (guess != UINT32_MAX && strcmp(c->params[guess].ref->param.name, s->param.name) == 0)
        return guess;
    if ((c->nparams + 1) * 2 > c->pmap_cap && pmap_grow(c) != 0)
        return UINT32_MAX;
    slot = pmap_slot(c, s->param.name, name_hash(s->param.name));
    if (c->pmap[slot] == UINT32_MAX) {
        param_t *p = &c->params[c->nparams];
        p->ref = s;
        p->box0 = p->nbox = 0;     /* nbox counts the param's shards until grouped */
        c->pmap[slot] = (uint32_t)c->nparams++;
    }
    return c->pmap[slot];
}

wsync_status_t wsync_plan_index_shards(compile_t *c)
{
    const wsync_shard_desc_t **sorted = NULL;
    uint32_t *pid = NULL, *first = NULL;
    uint64_t *cfirst = NULL;
    boxed_t *tmp = NULL;
    wsync_status_t st = WSYNC_OK;
    size_t n = c->nshards, most = 0;
    uint32_t *last = NULL;           /* [params] place in sorted[] of its latest shard */
    size_t cur_lo = 0;
    uint32_t guess = UINT32_MAX;
    int in_order = 1;
    wsync_text_t ta, tb;

    sorted = malloc((n ? n : 1) * sizeof(*sorted));
    pid = malloc((n ? n : 1) * sizeof(*pid));
    c->params = malloc((n ? n : 1) * sizeof(*c->params));
    c->boxes = malloc((n ? n : 1) * sizeof(*c->boxes));
    c->reps = malloc((n ? n : 1) * sizeof(*c->reps));
    if (!sorted || !pid || !c->params || !c->boxes || !c->reps ||
        pmap_grow(c) != 0) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan: indexing %zu shards", n);
        goto out;
    }
    wsync_plan_prefault(sorted, n * sizeof(*sorted));
    wsync_plan_prefault(pid, n * sizeof(*pid));
    wsync_plan_prefault(c->reps, n * sizeof(*c->reps));
    for (size_t i = 0; i < n; i++) {
        if ((st = check_shard(c, &c->shards[i])) != WSYNC_OK)
            goto out;
        if (i > 0 && in_order)
            in_order = cmp_rank_index(c->shards[i - 1].sender, c->shards[i - 1].index,
                                      c->shards[i].sender, c->shards[i].index) < 0;
    }
    if ((st = order_shards(c, sorted, in_order)) != WSYNC_OK)
        goto out;

    /* params in order of first appearance; every later description must agree with the first.
     * Senders usually hold the same params in the same order (FSDP, replicas), so a shard is
     * first tried as the param that followed, at an earlier sender, the param of the shard
     * before it: a name compare against memory read in order, where the table costs a hash of
     * the name and a probe at a random place. A sender that holds more or fewer params than
     * the one before only misses the guess where its list differs. */
    last = malloc((n ? n : 1) * sizeof(*last));
    if (last == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan: indexing %zu shards", n);
        goto out;
    }
    wsync_plan_prefault(last, n * sizeof(*last));
    for (size_t i = 0; i < n; i++) {
        const wsync_shard_desc_t *s = sorted[i];
        uint32_t k, prev;

        if (i > 0 && s->sender != sorted[i - 1]->sender) {
            cur_lo = i;
            guess = pid[0];          /* a sender starts as the first did */
        }
        k = param_of(c, s, guess);
        if (k == UINT32_MAX) {
            st = wsync_err(WSYNC_ERR_NOMEM, "plan: param index");
            goto out;
        }
        /* the next guess: what followed k's shard at an earlier sender */
        if (c->params[k].ref != s) {
            prev = last[k];
            guess = prev < cur_lo && prev + 1 < cur_lo ? pid[prev + 1] : UINT32_MAX;
        } else {
            guess = UINT32_MAX;
        }
        last[k] = (uint32_t)i;
        if (c->params[k].ref != s && !same_param(c->params[k].ref, s)) {
            const wsync_shard_desc_t *r = c->params[k].ref;
            st = wsync_err(WSYNC_ERR_MISMATCH, "param '%s': sender %u describes it as %s %s, "
                           "sender %u as %s %s", s->param.name, r->sender,
                           wsync_dtype_name(r->param.dtype),
                           wsync_fmt_dims(&ta, r->param.ndim, r->param.shape), s->sender,
                           wsync_dtype_name(s->param.dtype),
                           wsync_fmt_dims(&tb, s->param.ndim, s->param.shape));
            goto out;
        }
        pid[i] = k;
        c->params[k].nbox++;
    }

    /* each param's holders together, still in (sender, index) order, with their boxes'
     * coordinates (read here in order, once) */
    first = malloc((c->nparams + 1) * sizeof(*first));
    cfirst = malloc((c->nparams + 1) * sizeof(*cfirst));
    if (first == NULL || cfirst == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan: grouping %zu params", c->nparams);
        goto out;
    }
    first[0] = 0;
    cfirst[0] = 0;
    for (size_t k = 0; k < c->nparams; k++) {
        first[k + 1] = first[k] + c->params[k].nbox;
        cfirst[k + 1] = cfirst[k] + (uint64_t)c->params[k].nbox * 2u *
                                        (uint64_t)c->params[k].ref->param.ndim;
        most = WSYNC_MAX(most, (size_t)c->params[k].nbox);
        c->params[k].nbox = 0;
    }
    c->coords = malloc((cfirst[c->nparams] ? cfirst[c->nparams] : 1) * sizeof(*c->coords));
    if (c->coords == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan: boxes of %zu shards", n);
        goto out;
    }
    wsync_plan_prefault(c->coords, cfirst[c->nparams] * sizeof(*c->coords));
    for (size_t i = 0; i < n; i++) {
        const wsync_shard_desc_t *s = sorted[i];
        uint32_t k = pid[i], j = c->params[k].nbox++;
        size_t nd = (size_t)s->param.ndim;    /* the param's: checked above */
        rep_t *r = &c->reps[first[k] + j];
        int64_t *co = c->coords + cfirst[k] + (uint64_t)j * 2u * nd;
        r->shard = s;
        r->sender = s->sender;
        r->index = s->index;
        r->spos = (uint32_t)i;
        copy_i64(co, s->box.start, (int)nd);
        copy_i64(co + nd, s->box.len, (int)nd);
    }
    free(pid);
    pid = NULL;

    tmp = malloc((most ? most : 1) * sizeof(*tmp));
    if (tmp == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan: %zu shards of one param", most);
        goto out;
    }
    for (size_t k = 0; k < c->nparams; k++)
        if ((st = build_boxes(c, &c->params[k], first[k], cfirst[k], first[k + 1] - first[k],
                              tmp)) != WSYNC_OK)
            goto out;
out:
    free(sorted);
    free(cfirst);
    free(pid);
    free(last);
    free(first);
    free(tmp);
    return st;
}

const param_t *wsync_plan_find_param(const compile_t *c, const char *name)
{
    uint32_t k = c->pmap[pmap_slot(c, name, name_hash(name))];
    return k == UINT32_MAX ? NULL : &c->params[k];
}
