/* Plan compiler, and the checks of a plan against a participant's own descriptions. The plan's
 * wire form (encoding, fingerprint, decoding) is in plan_wire.c.
 *
 * Compilation, in four passes:
 *  1. shards are grouped by param name (all senders must agree on dtype and shape); the non-empty
 *     boxes of each param are grouped into distinct boxes, each with its replicas, and distinct
 *     boxes are checked to be disjoint;
 *  2. every piece of every target is intersected with its param's distinct boxes; each
 *     intersection becomes one or more 2-D regions: a *logical chunk* (source side, shared by
 *     every receiver that needs the same region of the same box) and a *logical segment* (one
 *     receiver's destination);
 *  3. each sender's logical chunks are laid out in buckets, split by rows (or, for a row larger
 *     than a bucket, by columns) where a bucket ends; segments are split alongside;
 *  4. segments are placed in (receiver, chunk) order. Bucket use and pair bytes are summed
 *     while passes 3 and 4 lay chunks and segments (the decoder derives them from chunks and
 *     segments, plan_derive in plan_wire.c, so they never travel); the fingerprint hashes the
 *     encoding (wsync_plan_fingerprint).
 */
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
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#define UNCOVERED_BUDGET 100000         /* box-subtraction steps spent naming an uncovered index */

/* ------------------------------------------------------------------------------------------ */
/* Boxes and text                                                                               */
/* ------------------------------------------------------------------------------------------ */

static int dtype_is_float(wsync_dtype_t dt)
{
    return dt == WSYNC_DTYPE_BF16 || dt == WSYNC_DTYPE_F16 || dt == WSYNC_DTYPE_F32;
}

static int dtype_is_fp8(wsync_dtype_t dt)
{
    return dt == WSYNC_DTYPE_F8E4M3FN || dt == WSYNC_DTYPE_F8E5M2;
}

/* Can a target of dtype `to` be filled from a param of dtype `from`? FP8 from float only with a
 * quant scheme: the receiver lands the floats and quantizes them itself. */
static int dtype_reachable(wsync_dtype_t from, wsync_dtype_t to, wsync_quant_scheme_t quant)
{
    if (from == to)
        return 1;
    if (dtype_is_float(from) && dtype_is_float(to))
        return 1;
    return dtype_is_float(from) && dtype_is_fp8(to) && quant != WSYNC_QUANT_NONE;
}

/* Elements of a shape; 0 when a dim is not positive or the product passes WSYNC_PLAN_MAX_ELEMS. */
static uint64_t shape_volume(int nd, const int64_t *shape)
{
    uint64_t v = 1;

    for (int d = 0; d < nd; d++) {
        if (shape[d] <= 0 || wsync_mul_u64(v, (uint64_t)shape[d], &v) != 0 ||
            v > WSYNC_PLAN_MAX_ELEMS)
            return 0;
    }
    return v;
}

static uint64_t box_volume(int nd, const wsync_box_t *b)
{
    uint64_t v = 1;

    for (int d = 0; d < nd; d++)
        v *= (uint64_t)b->len[d];  /* inside a validated shape: cannot overflow */
    return v;
}

/* start[d] + len[d] (a box `len` long placed at `start`) lies inside shape. */
static int span_inside(int nd, const int64_t *start, const int64_t *len, const int64_t *shape)
{
    for (int d = 0; d < nd; d++)
        if (start[d] < 0 || len[d] < 0 || start[d] > shape[d] || len[d] > shape[d] - start[d])
            return 0;
    return 1;
}

static int box_is_empty(int nd, const wsync_box_t *b)
{
    for (int d = 0; d < nd; d++)
        if (b->len[d] == 0)
            return 1;
    return 0;
}

/* Intersection of two boxes; 0 when empty. */
static int box_intersect(int nd, const wsync_box_t *a, const wsync_box_t *b, wsync_box_t *out)
{
    wsync_box_t r;

    memset(&r, 0, sizeof(r));
    for (int d = 0; d < nd; d++) {
        int64_t lo = WSYNC_MAX(a->start[d], b->start[d]);
        int64_t hi = WSYNC_MIN(a->start[d] + a->len[d], b->start[d] + b->len[d]);
        if (hi <= lo)
            return 0;
        r.start[d] = lo;
        r.len[d] = hi - lo;
    }
    *out = r;
    return 1;
}

/* Lexicographic order of two boxes' coordinates (nd starts then nd lengths): the order of
 * cmp_box below. */
static int cmp_coords(int nd, const int64_t *a, const int64_t *b)
{
    for (int d = 0; d < 2 * nd; d++)
        if (a[d] != b[d])
            return a[d] < b[d] ? -1 : 1;
    return 0;
}

/* n int64s; params of 1 and 2 dims (nearly all) without a call to memcpy, which a copy of a
 * size not known at compile time becomes (tens of millions of them in a large plan). */
static inline void copy_i64(int64_t *dst, const int64_t *src, int n)
{
    switch (n) {
    case 2:
        dst[1] = src[1];
        /* fall through */
    case 1:
        dst[0] = src[0];
        break;
    default:
        memcpy(dst, src, (size_t)n * sizeof(int64_t));
    }
}

static inline void coords_to_box(int nd, const int64_t *co, wsync_box_t *b)
{
    copy_i64(b->start, co, nd);
    copy_i64(b->len, co + nd, nd);
}

/* A name a message can quote: never NULL. */
static const char *nm(const char *s)
{
    return s ? s : "(null)";
}

static int name_ok(const char *s)
{
    return s != NULL && s[0] != '\0' && strnlen(s, WSYNC_NAME_MAX + 1) <= WSYNC_NAME_MAX;
}

/* Loops that jump through large arrays in a computed order ask for a record this many steps
 * before they use it, so that several cache misses are in flight instead of one at a time. */
#define PREFETCH_AHEAD 16
#if defined(__GNUC__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)0)
#endif

static uint64_t align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

void wsync_plan_prefault(void *p, size_t bytes)
{
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
    long pg = sysconf(_SC_PAGESIZE);
    if (p != NULL && pg > 0 && bytes >= ((size_t)4 << 20)) {
        uintptr_t a = ((uintptr_t)p + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
        uintptr_t e = ((uintptr_t)p + bytes) & ~((uintptr_t)pg - 1);
        if (e > a)
            (void)madvise((void *)a, e - a, MADV_POPULATE_WRITE);
    }
#else
    (void)p;
    (void)bytes;
#endif
}

/* Give the system back the whole pages of bytes [from, to) of the array at base, which is still
 * allocated but whose range will never be read again (a hint: Linux MADV_DONTNEED, after which
 * they would read as zeros). The array's first page is always kept: the allocator's header
 * lies in it or just before it. Pass 4 frees the logical segments it has consumed this way
 * while it writes the plan's segments, so the two arrays are not both whole at the peak. */
static void release_pages(void *base, size_t from, size_t to)
{
#if defined(__linux__) && defined(MADV_DONTNEED)
    long pg = sysconf(_SC_PAGESIZE);
    if (base != NULL && pg > 0 && to > from) {
        uintptr_t m = (uintptr_t)pg - 1, b = (uintptr_t)base;
        uintptr_t a = WSYNC_MAX((b + from + m) & ~m, ((b + m) & ~m) + (uintptr_t)pg);
        uintptr_t e = (b + to) & ~m;
        if (e > a)
            (void)madvise((void *)a, e - a, MADV_DONTNEED);
    }
#else
    (void)base;
    (void)from;
    (void)to;
#endif
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    size_t n = *cap ? *cap : 64;
    void *q;

    if (need <= *cap)
        return 0;
    while (n < need)
        n *= 2;
    q = realloc(*p, n * elem);
    if (q == NULL)
        return -1;
    *p = q;
    *cap = n;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Compilation state                                                                            */
/* ------------------------------------------------------------------------------------------ */

/* A holder of a distinct box, with what pass 2 needs of its shard copied out: pass 2 visits
 * one param's holders together, while their descriptions lie a whole sender's shards apart. */
typedef struct {
    const wsync_shard_desc_t *shard;
    uint32_t sender, index;          /* shard->sender, shard->index */
    uint32_t spos;                   /* its place in (sender, index) order */
} rep_t;

typedef struct {
    const wsync_shard_desc_t *ref;   /* the param as its first sender (by rank) describes it */
    uint32_t box0, nbox;             /* its distinct boxes in compile_t.boxes, by start */
} param_t;

/* A distinct box. Its coordinates are nd starts then nd lengths at compile_t.coords[coord]
 * (nd: its param's), copied there in pass 1 next to the other boxes of the param: pass 2 reads
 * one param's boxes side by side, and a box of 2 dims takes 32 bytes, not a wsync_box_t's 128. */
typedef struct {
    uint64_t coord;
    uint32_t rep0, nrep;             /* holders: compile_t.reps[rep0 ..), by (sender, index) */
    uint32_t head, nl;               /* its logical chunks: a list through lchunk_t.next */
} dbox_t;

/* A 2-D region of one distinct box, before bucketing. */
typedef struct {
    uint32_t sender, shard, dbox;
    uint32_t spos;                   /* its shard's place in (sender, index) order */
    uint32_t next;                   /* next logical chunk of the same distinct box */
    wsync_dtype_t dtype;
    uint32_t rule;                   /* FP8 on the wire: 0 plain, k: compile_t.rules[k - 1] */
    wsync_region_t src;
} lchunk_t;

/* A target's use of a logical chunk: its region of the target has the chunk's rows and cols
 * (emit_region finds the chunk by its region), so only where it starts and its pitch are kept;
 * the receiver and target are its tref_t's: 24 bytes, not 48. */
typedef struct {
    uint32_t piece, lchunk;
    uint64_t dst_off, dst_pitch;
} lseg_t;

/* A target, in (receiver, index) order, and the logical segments it takes: its own, or those of
 * an earlier target laid out like it (see map_targets), which are not copied: with data-parallel
 * receivers most targets are such copies (Kimi-K2 TP-8 x EP-128: 19.5 million segments from
 * 1.3 million logical segments), and pass 4 reads the one list for every copy. */
typedef struct {
    const wsync_target_desc_t *desc;
    uint32_t receiver, target;       /* the target's receiver and index */
    uint32_t src;                    /* the tref whose logical segments these are (itself: own) */
    uint32_t shared;                 /* own segments a later target takes too */
    uint32_t lseg0, nlseg;           /* c->lsegs[lseg0 ..) */
    uint64_t nseg;                   /* segments they become (parts of their logical chunks) */
} tref_t;

/* Where a bucketed part starts inside its logical chunk. */
typedef struct {
    uint64_t row, col;
} part_t;

typedef struct {
    const wsync_shard_desc_t *shards;
    size_t nshards;
    const wsync_target_desc_t *targets;
    size_t ntargets;
    uint32_t nsenders, nreceivers;
    uint64_t bucket_bytes;

    param_t *params;                 /* in order of first appearance (sender, index) */
    size_t nparams;
    uint32_t *pmap;                  /* open addressing on the param name: params index or
                                        UINT32_MAX */
    size_t pmap_cap;
    dbox_t *boxes;
    size_t nboxes;
    int64_t *coords;                 /* boxes' coordinates, see dbox_t */
    rep_t *reps;                     /* [nshards] holders, grouped by param */
    uint64_t *load;                  /* [nsenders] bytes of logical chunks given to each */

    lchunk_t *lchunks;
    size_t nlchunks, cap_lchunks;
    lseg_t *lsegs;                   /* own logical segments, target by target */
    size_t nlsegs, cap_lsegs;
    tref_t *trefs;                   /* [ntargets] in (receiver, index) order */
    uint32_t *map;                   /* open addressing: lchunk index or UINT32_MAX; only the
                                        lchunks of boxes with more than LIST_MAX of them */
    size_t map_cap, nmapped;

    uint32_t *part0;                 /* [nlchunks + 1] after pass 3: logical chunk k (in bucket
                                        order) is plan->chunks[part0[k] .. part0[k + 1]) */
    part_t *parts;                   /* parallel to plan->chunks; NULL while no logical chunk
                                        was split (every part starts at row 0, column 0) */
    size_t cap_chunks, cap_parts;
    size_t nused, cap_used;          /* plan->bucket_used as pass 3 fills it */
    int fp8_wire;                    /* wsync_plan_opts_t's */
    wsync_wire_rule_t *rules;        /* FP8 on the wire: the distinct rules, in order found */
    uint32_t nrules, cap_rules;
    wsync_plan_t *plan;
} compile_t;

/* Free the compile state (not the plan); safe to call again. */
static void compile_release(compile_t *c)
{
    free(c->params);
    free(c->pmap);
    free(c->boxes);
    free(c->coords);
    free(c->reps);
    free(c->load);
    free(c->lchunks);
    free(c->lsegs);
    free(c->trefs);
    free(c->map);
    free(c->parts);
    free(c->part0);
    free(c->rules);
    c->rules = NULL;
    c->nrules = c->cap_rules = 0;
    c->params = NULL, c->pmap = NULL, c->boxes = NULL, c->coords = NULL, c->reps = NULL;
    c->load = NULL, c->lchunks = NULL, c->lsegs = NULL, c->map = NULL, c->parts = NULL;
    c->trefs = NULL;
    c->part0 = NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Pass 1: params and distinct boxes                                                            */
/* ------------------------------------------------------------------------------------------ */

/* Pass 1 runs in time linear in the shards (a plan of Kimi-K2 from 64 FSDP ranks has 4.4 million
 * of them): shards are put in (sender, index) order by a counting sort on the sender, grouped by
 * param through a hash table on the name, and only each param's own few boxes are sorted. */

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

static uint64_t name_hash(const char *s)
{
    return XXH3_64bits(s, strlen(s));
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

static wsync_status_t index_shards(compile_t *c)
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

static const param_t *find_param(const compile_t *c, const char *name)
{
    uint32_t k = c->pmap[pmap_slot(c, name, name_hash(name))];
    return k == UINT32_MAX ? NULL : &c->params[k];
}

/* ------------------------------------------------------------------------------------------ */
/* Pass 2: pieces → logical chunks and segments                                                 */
/* ------------------------------------------------------------------------------------------ */

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

static int map_grow(compile_t *c)
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
        if ((c->nmapped + 1) * 2 > c->map_cap && map_grow(c) != 0)
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
        if (grow((void **)&c->lchunks, &c->cap_lchunks, c->nlchunks + 1, sizeof(*c->lchunks)))
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
    if (grow((void **)&c->lsegs, &c->cap_lsegs, c->nlsegs + 1, sizeof(*c->lsegs)))
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
    par = find_param(c, p->param.name);
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

static wsync_status_t map_targets(compile_t *c)
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

/* ------------------------------------------------------------------------------------------ */
/* Pass 2b: FP8 on the wire                                                                     */
/* ------------------------------------------------------------------------------------------ */

#define RULE_BAD UINT32_MAX

/* The rule's number in c->rules, plus one (added when new); 0 when out of memory. */
static uint32_t intern_rule(compile_t *c, const wsync_wire_rule_t *r)
{
    for (uint32_t k = 0; k < c->nrules; k++)
        if (wsync_wire_rule_eq(&c->rules[k], r))
            return k + 1;
    if (c->nrules >= UINT16_MAX)
        return 0;                    /* so many distinct rules: the rest travel plain */
    if (c->nrules == c->cap_rules) {
        uint32_t cap = c->cap_rules ? 2 * c->cap_rules : 4;
        wsync_wire_rule_t *p = realloc(c->rules, cap * sizeof(*p));
        if (p == NULL)
            return 0;
        c->rules = p;
        c->cap_rules = cap;
    }
    c->rules[c->nrules++] = *r;
    return c->nrules;
}

/* Which logical chunks travel as FP8 (lchunk_t.rule). A target takes chunks quantized by their
 * senders only whole: when it may (wsync_wire_rule_of), every one of its chunks lands on whole
 * cells and fits a bucket by rows of cells, and no chunk of it also feeds a target that does not
 * take FP8 or takes another rule. Dropping a target can drop chunks it shares with another
 * target (fan-out replicas of different kinds), which can drop that one: repeated until nothing
 * changes (twice in practice). */
static wsync_status_t mark_wire(compile_t *c)
{
    uint32_t *trule;
    size_t n = c->ntargets;
    int changed = 1;

    if (!c->fp8_wire || n == 0)
        return WSYNC_OK;
    trule = calloc(n, sizeof(*trule));
    if (trule == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "plan: %zu targets", n);
    for (size_t i = 0; i < n; i++) {
        const tref_t *tr = &c->trefs[i];
        wsync_wire_rule_t r;
        int ok;
        if (!wsync_wire_rule_of(tr->desc, &r))
            continue;
        ok = 1;
        for (uint32_t k = 0; k < tr->nlseg && ok; k++) {
            const lseg_t *ls = &c->lsegs[tr->lseg0 + k];
            const lchunk_t *l = &c->lchunks[ls->lchunk];
            ok = wsync_wire_region_whole(&r, tr->desc, ls->dst_off, ls->dst_pitch, l->src.rows,
                                         l->src.cols) &&
                 wsync_wire_cellrow_fits(&r, l->src.cols, c->bucket_bytes);
        }
        if (ok && (trule[i] = intern_rule(c, &r)) == 0 && c->nrules < UINT16_MAX) {
            free(trule);
            return wsync_err(WSYNC_ERR_NOMEM, "plan: FP8 rules");
        }
    }
    while (changed) {
        changed = 0;
        for (size_t j = 0; j < c->nlchunks; j++)
            c->lchunks[j].rule = 0;
        for (size_t i = 0; i < n; i++) {
            const tref_t *tr = &c->trefs[i];
            for (uint32_t k = 0; k < tr->nlseg; k++) {
                lchunk_t *l = &c->lchunks[c->lsegs[tr->lseg0 + k].lchunk];
                if (trule[i] == 0)
                    l->rule = RULE_BAD;
                else if (l->rule == 0)
                    l->rule = trule[i];
                else if (l->rule != trule[i])
                    l->rule = RULE_BAD;
            }
        }
        for (size_t i = 0; i < n; i++) {
            const tref_t *tr = &c->trefs[i];
            for (uint32_t k = 0; k < tr->nlseg && trule[i] != 0; k++)
                if (c->lchunks[c->lsegs[tr->lseg0 + k].lchunk].rule == RULE_BAD) {
                    trule[i] = 0;
                    changed = 1;
                }
        }
    }
    for (size_t j = 0; j < c->nlchunks; j++)
        if (c->lchunks[j].rule == RULE_BAD)
            c->lchunks[j].rule = 0;
    free(trule);
    return WSYNC_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Pass 3: buckets                                                                              */
/* ------------------------------------------------------------------------------------------ */

static int cmp_u64(uint64_t a, uint64_t b)
{
    return a < b ? -1 : a > b;
}

static int cmp_lchunk(const void *a, const void *b)
{
    const lchunk_t *x = *(const lchunk_t *const *)a, *y = *(const lchunk_t *const *)b;
    int r = cmp_rank_index(x->sender, x->shard, y->sender, y->shard);
    if (!r)
        r = cmp_u64(x->src.off, y->src.off);
    if (!r)
        r = cmp_u64(x->src.rows, y->src.rows);
    if (!r)
        r = cmp_u64(x->src.cols, y->src.cols);
    if (!r)
        r = cmp_u64(x->src.pitch, y->src.pitch);
    return r;
}

static wsync_status_t add_part(compile_t *c, const lchunk_t *l, uint64_t row, uint64_t col,
                               uint64_t rows, uint64_t cols, uint32_t bucket, uint64_t off)
{
    wsync_plan_t *pl = c->plan;
    wsync_chunk_t *ch;

    if (pl->nchunks >= WSYNC_PLAN_MAX_CHUNKS)
        return wsync_err(WSYNC_ERR_RANGE, "plan: more than %u chunks with buckets of %llu bytes; "
                         "raise bucket_bytes", WSYNC_PLAN_MAX_CHUNKS,
                         (unsigned long long)c->bucket_bytes);
    if (grow((void **)&pl->chunks, &c->cap_chunks, pl->nchunks + 1, sizeof(*pl->chunks)))
        return wsync_err(WSYNC_ERR_NOMEM, "plan: %u chunks", pl->nchunks + 1);
    if (c->parts == NULL && (row | col) != 0) {   /* the first split: earlier parts start at 0 */
        c->cap_parts = 0;
        if (grow((void **)&c->parts, &c->cap_parts, c->cap_chunks, sizeof(*c->parts)))
            return wsync_err(WSYNC_ERR_NOMEM, "plan: %u chunks", pl->nchunks + 1);
        memset(c->parts, 0, pl->nchunks * sizeof(*c->parts));
    }
    if (c->parts != NULL &&
        grow((void **)&c->parts, &c->cap_parts, pl->nchunks + 1, sizeof(*c->parts)))
        return wsync_err(WSYNC_ERR_NOMEM, "plan: %u chunks", pl->nchunks + 1);
    ch = &pl->chunks[pl->nchunks];
    ch->sender = l->sender;
    ch->shard = l->shard;
    ch->dtype = l->dtype;
    ch->rule = l->rule;
    ch->ncells = 0;
    if (l->rule != 0) {
        uint64_t cr, cc;
        wsync_wire_cells(&c->rules[l->rule - 1], rows, cols, &cr, &cc);
        ch->ncells = (uint32_t)(cr * cc);            /* layout_buckets keeps it in range */
    }
    ch->src.off = l->src.off + row * l->src.pitch + col;
    ch->src.pitch = l->src.pitch;
    ch->src.rows = rows;
    ch->src.cols = cols;
    ch->bucket = bucket;
    ch->bucket_off = off;
    /* the derived tables as the parts are laid (what plan_derive finds from the chunks): a
     * sender's buckets are filled in turn, and a bucket's chunks at rising offsets */
    if (pl->nchunks == 0 || pl->chunks[pl->nchunks - 1].sender != l->sender ||
        pl->chunks[pl->nchunks - 1].bucket != bucket) {
        if (grow((void **)&pl->bucket_used, &c->cap_used, c->nused + 1,
                 sizeof(*pl->bucket_used)))
            return wsync_err(WSYNC_ERR_NOMEM, "plan: %zu buckets", c->nused + 1);
        pl->bucket_used[c->nused++] = 0;
        pl->nbuckets[l->sender] = bucket + 1;
    }
    pl->bucket_used[c->nused - 1] = WSYNC_MAX(pl->bucket_used[c->nused - 1],
                                              off + chunk_bytes(ch));
    if (c->parts != NULL) {
        c->parts[pl->nchunks].row = row;
        c->parts[pl->nchunks].col = col;
    }
    pl->nchunks++;
    return WSYNC_OK;
}

/* Lay the logical chunks into each sender's buckets, splitting at bucket ends. The order is
 * (sender, shard, region): a counting sort on the shard's place in (sender, index) order, then a
 * sort of the few regions of each shard. Logical chunks are renumbered in that order (the
 * segments' references with them), and only what the next pass needs of them is kept: where
 * each one's parts start (c->part0), so that pass reads small arrays front to back. */
static wsync_status_t layout_buckets(compile_t *c)
{
    lchunk_t **order;
    uint32_t *start, *inv = NULL;
    uint64_t B = c->bucket_bytes, off = 0;
    uint32_t sender = UINT32_MAX, bucket = 0;
    size_t nl = c->nlchunks;
    wsync_status_t st = WSYNC_OK;

    order = malloc((nl ? nl : 1) * sizeof(*order));
    start = calloc(c->nshards + 1, sizeof(*start));
    if (order == NULL || start == NULL) {
        free(order);
        free(start);
        return wsync_err(WSYNC_ERR_NOMEM, "plan: ordering %zu chunks", nl);
    }
    for (size_t i = 0; i < nl; i++)
        start[c->lchunks[i].spos + 1]++;
    for (size_t k = 0; k < c->nshards; k++)
        start[k + 1] += start[k];
    for (size_t i = 0; i < nl; i++)
        order[start[c->lchunks[i].spos]++] = &c->lchunks[i];   /* start[k] becomes its end */
    for (size_t k = 0, lo = 0; k < c->nshards; lo = start[k], k++)
        if (start[k] - lo > 1)
            qsort(order + lo, start[k] - lo, sizeof(*order), cmp_lchunk);
    free(start);
    /* the lists and the map index the old numbers; nothing looks chunks up after this pass */
    free(c->map);
    c->map = NULL;
    c->map_cap = c->nmapped = 0;

    inv = malloc((nl ? nl : 1) * sizeof(*inv));
    c->part0 = malloc((nl + 1) * sizeof(*c->part0));
    c->plan->nbuckets = calloc(c->nsenders, sizeof(*c->plan->nbuckets));
    c->plan->bucket_used = malloc(sizeof(*c->plan->bucket_used));   /* grown by add_part */
    c->cap_used = 1;
    if (inv == NULL || c->part0 == NULL || c->plan->nbuckets == NULL ||
        c->plan->bucket_used == NULL ||
        grow((void **)&c->plan->chunks, &c->cap_chunks, nl, sizeof(*c->plan->chunks))) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan: %zu chunks", nl);
        goto out;
    }
    wsync_plan_prefault(c->plan->chunks, nl * sizeof(*c->plan->chunks));   /* at least one part each */
    wsync_plan_prefault(inv, nl * sizeof(*inv));
    wsync_plan_prefault(c->part0, (nl + 1) * sizeof(*c->part0));

    for (size_t i = 0; i < nl; i++) {
        const lchunk_t *l = order[i];
        uint64_t esz = wsync_dtype_size(l->dtype), rowbytes = l->src.cols * esz;
        uint64_t row = 0, col = 0;

        if (i + PREFETCH_AHEAD < nl)   /* order[] jumps: ask for the record early */
            PREFETCH(order[i + PREFETCH_AHEAD]);
        inv[l - c->lchunks] = (uint32_t)i;
        if (l->sender != sender) {
            sender = l->sender;
            bucket = 0;
            off = 0;
        }
        c->part0[i] = c->plan->nchunks;
        while (row < l->src.rows) {
            off = align_up(off, WSYNC_PLAN_ALIGN);
            if (off >= B) {
                bucket++;
                off = 0;
            }
            if (bucket == WSYNC_BUCKET_NONE) {
                st = wsync_err(WSYNC_ERR_RANGE, "plan: sender %u needs more than %u buckets",
                               sender, WSYNC_BUCKET_NONE - 1);
                goto out;
            }
            uint64_t space = B - off;
            if (l->rule != 0) {                  /* FP8 on the wire: whole rows of cells */
                const wsync_wire_rule_t *ru = &c->rules[l->rule - 1];
                uint64_t cr = ru->scheme == WSYNC_QUANT_BLOCK ? (uint64_t)ru->block_rows : 1u;
                uint64_t cc = ru->scheme == WSYNC_QUANT_BLOCK
                                  ? (l->src.cols + (uint64_t)ru->block_cols - 1) /
                                        (uint64_t)ru->block_cols
                                  : 1u;
                uint64_t k = space > 3u ? (space - 3u) / (cr * l->src.cols + cc * 4u) : 0;
                uint64_t m;
                k = WSYNC_MIN(k, UINT32_MAX / cc);
                m = WSYNC_MIN(k * cr, l->src.rows - row);
                if (m == 0) {                    /* mark_wire saw a row of cells fit a bucket */
                    bucket++;
                    off = 0;
                    continue;
                }
                if ((st = add_part(c, l, row, 0, m, l->src.cols, bucket, off)) != WSYNC_OK)
                    goto out;
                off += wsync_wire_bytes(ru, m, l->src.cols);
                row += m;
                continue;
            }
            if (col == 0 && rowbytes <= B) {     /* whole rows: as many as fit */
                uint64_t k = WSYNC_MIN(l->src.rows - row, space / rowbytes);
                if (k == 0) {
                    bucket++;
                    off = 0;
                    continue;
                }
                if ((st = add_part(c, l, row, 0, k, l->src.cols, bucket, off)) != WSYNC_OK)
                    goto out;
                off += k * rowbytes;
                row += k;
            } else {                             /* a row larger than a bucket: by columns */
                uint64_t w = WSYNC_MIN(l->src.cols - col, space / esz);
                if (w == 0) {
                    bucket++;
                    off = 0;
                    continue;
                }
                if ((st = add_part(c, l, row, col, 1, w, bucket, off)) != WSYNC_OK)
                    goto out;
                off += w * esz;
                col += w;
                if (col == l->src.cols) {
                    col = 0;
                    row++;
                }
            }
        }
    }
    c->part0[nl] = c->plan->nchunks;
    for (size_t i = 0; i < c->nlsegs; i++)
        c->lsegs[i].lchunk = inv[c->lsegs[i].lchunk];
    free(c->lchunks);                /* part0 holds what is left to know of them */
    c->lchunks = NULL;
    c->cap_lchunks = 0;
out:
    free(order);
    free(inv);
    return st;
}

static int cmp_segment(const void *a, const void *b)
{
    const wsync_segment_t *x = a, *y = b;
    int r = cmp_rank_index(x->receiver, x->chunk, y->receiver, y->chunk);
    if (!r)
        r = cmp_rank_index(x->target, x->piece, y->target, y->piece);
    if (!r)
        r = cmp_u64(x->dst.off, y->dst.off);
    return r;
}

/* Segment `sg`: logical segment `sl` of `receiver`'s target `target` served by chunk q, one part
 * of its logical chunk; the pair's bytes counted as plan_derive counts them. */
static inline void put_segment(compile_t *c, uint32_t receiver, uint32_t target,
                               const lseg_t *sl, uint32_t q, wsync_segment_t *sg)
{
    wsync_plan_t *pl = c->plan;
    const wsync_chunk_t *ch = &pl->chunks[q];

    sg->receiver = receiver;
    sg->target = target;
    sg->piece = sl->piece;
    sg->chunk = q;
    sg->dst.off = sl->dst_off;
    if (c->parts != NULL)
        sg->dst.off += c->parts[q].row * sl->dst_pitch + c->parts[q].col;
    sg->dst.pitch = sl->dst_pitch;
    sg->dst.rows = ch->src.rows;
    sg->dst.cols = ch->src.cols;
    pl->pair_bytes[(size_t)ch->sender * c->nreceivers + receiver] += chunk_bytes(ch);
}

/* One of a receiver's logical segments in pass 4: its logical chunk (the sort key), which
 * logical segment, for which of the receiver's targets. */
typedef struct {
    uint32_t lchunk, lseg, target;
} item_t;

#define RADIX_BITS 11

/* Order a receiver's items by logical chunk, stably (LSD radix, RADIX_BITS a pass, `passes`
 * passes; the records move, so the pass that writes the segments reads them in order). a and
 * tmp hold m each; returns the array that holds the result. */
static item_t *radix_by_lchunk(item_t *a, item_t *tmp, size_t m, unsigned passes)
{
    for (unsigned p = 0; p < passes; p++) {
        uint32_t cnt[(1u << RADIX_BITS) + 1];
        unsigned shift = RADIX_BITS * p;
        uint32_t mask = (1u << RADIX_BITS) - 1;
        item_t *t;
        memset(cnt, 0, sizeof(cnt));
        for (size_t i = 0; i < m; i++)
            cnt[((a[i].lchunk >> shift) & mask) + 1]++;
        for (uint32_t d = 0; d < mask + 1; d++)
            cnt[d + 1] += cnt[d];
        for (size_t i = 0; i < m; i++)
            tmp[cnt[(a[i].lchunk >> shift) & mask]++] = a[i];
        t = a;
        a = tmp;
        tmp = t;
    }
    return a;
}

/* A receiver in pass 4: its targets c->trefs[a, b), where its segments go, and the receiver
 * whose logical segments it takes most of (itself when it takes more of its own). */
typedef struct {
    size_t a, b;
    uint64_t out;
    uint32_t like;
} rcv_t;

/* Give back the pages of a receiver's own logical segments that no later target takes (all of
 * them where no target is laid out like another); those of shared targets stay. A receiver's
 * own logical segments lie side by side, target after target. */
static void release_own(compile_t *c, const rcv_t *rv)
{
    size_t from = SIZE_MAX, to = 0, sz = sizeof(*c->lsegs);

    for (size_t j = rv->a; j < rv->b; j++) {
        const tref_t *t = &c->trefs[j];
        if (t->src != j)
            continue;
        if (t->shared) {
            if (from != SIZE_MAX)
                release_pages(c->lsegs, from, to);
            from = SIZE_MAX;
        } else {
            if (from == SIZE_MAX)
                from = (size_t)t->lseg0 * sz;
            to = ((size_t)t->lseg0 + t->nlseg) * sz;
        }
    }
    if (from != SIZE_MAX)
        release_pages(c->lsegs, from, to);
}

/* Segments in (receiver, chunk) order without a global sort. Targets come in (receiver, index)
 * order (map_targets sorted them); each receiver's logical segments, target by target, are put
 * in logical chunk order by a radix sort of their numbers (stable, so a receiver taking one
 * chunk twice keeps logical segment order, as before), and its segments are then written front
 * to back: logical chunks are numbered in bucket order, so their parts are chunks 0, 1, ...
 * Only segments of one receiver that share a chunk are sorted further. The scratch is sized by
 * the largest receiver's logical segments, not by the plan.
 * Receivers are written in an order that keeps those taking the same logical segments together
 * (with TP-8 x EP-128, receivers r, r + 8, r + 16, ... of one TP rank), each at its place in
 * the plan: the logical segments they read jumping (megabytes a TP rank) stay in cache from one
 * to the next, where receiver order would cycle through all the TP ranks' lists. */
static wsync_status_t split_segments(compile_t *c)
{
    wsync_plan_t *pl = c->plan;
    uint64_t n = 0;
    item_t *item = NULL, *tmp = NULL;
    rcv_t *rv = NULL;
    uint32_t *order = NULL, *cnt = NULL;
    uint64_t *tally = NULL;
    size_t most = 0, nt = c->ntargets, nrv = 0;
    unsigned passes = 1;
    int twice = 0;
    wsync_status_t st = WSYNC_OK;
    const uint32_t *part0 = c->part0;
    tref_t *tr = c->trefs;

    /* segments per target: counted once for a target's own logical segments, taken by copies */
    for (size_t j = 0, run = 0; j < nt; j++) {
        if (tr[j].src == j) {
            uint64_t m = 0;
            for (uint32_t k = 0; k < tr[j].nlseg; k++) {
                uint32_t l = c->lsegs[tr[j].lseg0 + k].lchunk;
                m += part0[l + 1] - part0[l];
            }
            tr[j].nseg = m;
        } else {
            tr[j].nseg = tr[tr[j].src].nseg;   /* src < j */
        }
        n += tr[j].nseg;
        run = (j > 0 && tr[j].receiver == tr[j - 1].receiver ? run : 0) + tr[j].nlseg;
        most = WSYNC_MAX(most, run);
    }
    /* refused here, before any segment is written (counted from the targets' logical
     * segments, shared ones once) */
    if (n > WSYNC_PLAN_MAX_SEGMENTS)
        return wsync_err(WSYNC_ERR_RANGE, "plan: %" PRIu64 " segments (one per chunk and "
                         "receiver taking it) to %u receivers, more than the %u a plan holds "
                         "(%zu bytes each); use fewer receivers per group, larger buckets, or "
                         "sender layouts that split fewer params (e.g. fused experts)", n,
                         c->nreceivers, WSYNC_PLAN_MAX_SEGMENTS, sizeof(wsync_segment_t));
    while (passes < 3 && ((uint64_t)c->nlchunks >> (RADIX_BITS * passes)) != 0)
        passes++;
    pl->segments = malloc((n ? n : 1) * sizeof(*pl->segments));
    pl->pair_bytes = calloc((size_t)c->nsenders * c->nreceivers, sizeof(*pl->pair_bytes));
    tmp = malloc((most ? most : 1) * sizeof(*tmp));
    item = malloc((most ? most : 1) * sizeof(*item));
    rv = malloc((c->nreceivers + (size_t)1) * sizeof(*rv));
    order = malloc((c->nreceivers + (size_t)1) * sizeof(*order));
    cnt = calloc(c->nreceivers + (size_t)1, sizeof(*cnt));
    tally = calloc(c->nreceivers, sizeof(*tally));
    if (pl->segments == NULL || pl->pair_bytes == NULL || tmp == NULL ||
        item == NULL || rv == NULL || order == NULL || cnt == NULL || tally == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan: %" PRIu64 " segments", n);
        goto done;
    }
    /* receivers with targets, where their segments start, and whom each is like: the receiver
     * it takes the most logical segments from (tally[], zeroed again after each receiver) */
    for (size_t a = 0, b; a < nt; a = b) {
        rcv_t *r = &rv[nrv];
        uint64_t best = 0;
        r->a = a;
        r->out = nrv > 0 ? rv[nrv - 1].out : 0;
        r->like = tr[a].receiver;
        for (b = a; b < nt && tr[b].receiver == tr[a].receiver; b++) {
            uint32_t from = tr[tr[b].src].receiver;
            tally[from] += tr[b].nlseg;
            if (tally[from] > best) {
                best = tally[from];
                r->like = from;
            }
            r->out += tr[b].nseg;
        }
        for (size_t j = a; j < b; j++)
            tally[tr[tr[j].src].receiver] = 0;
        r->b = b;
        cnt[r->like + 1]++;
        nrv++;
    }
    for (size_t k = nrv; k-- > 0;)      /* out: where each receiver's segments start */
        rv[k].out = k > 0 ? rv[k - 1].out : 0;
    for (uint32_t k = 0; k < c->nreceivers; k++)   /* stable counting sort on `like` */
        cnt[k + 1] += cnt[k];
    for (size_t k = 0; k < nrv; k++)
        order[cnt[rv[k].like]++] = (uint32_t)k;
    for (size_t o = 0; o < nrv; o++) {
        const rcv_t *r = &rv[order[o]];
        const item_t *sorted;
        uint32_t receiver = tr[r->a].receiver;
        uint64_t mine = 0, out = r->out;
        size_t m = 0;
        for (size_t b = r->a; b < r->b; b++) {
            mine += tr[b].nseg;
            if (tr[b].nlseg == 0)
                continue;   /* (lsegs may be NULL: no pointer arithmetic on it) */
            const lseg_t *ls = &c->lsegs[tr[b].lseg0];
            for (uint32_t k = 0; k < tr[b].nlseg; k++, m++) {
                item[m].lchunk = ls[k].lchunk;
                item[m].lseg = tr[b].lseg0 + k;
                item[m].target = tr[b].target;
            }
        }
        sorted = radix_by_lchunk(item, tmp, m, passes);
        /* fault in this receiver's segments at once */
        if (mine > 0)
            wsync_plan_prefault(&pl->segments[out], mine * sizeof(*pl->segments));
        for (size_t i = 0, e; i < m; i = e) {
            /* i .. e: this receiver's logical segments on logical chunk k (usually one) */
            uint32_t k = sorted[i].lchunk;
            /* sorted[] jumps through the logical segments: ask for them early */
            if (i + PREFETCH_AHEAD < m) {
                PREFETCH(&c->lsegs[sorted[i + PREFETCH_AHEAD].lseg]);
                PREFETCH(&pl->chunks[part0[sorted[i + PREFETCH_AHEAD].lchunk]]);
            }
            for (e = i + 1; e < m && sorted[e].lchunk == k; e++)
                ;
            twice |= e - i > 1;
            for (uint32_t q = part0[k]; q < part0[k + 1]; q++)
                for (size_t g = i; g < e; g++) {
                    const item_t *it = &sorted[g];
                    put_segment(c, receiver, it->target, &c->lsegs[it->lseg], q,
                                &pl->segments[out++]);
                }
        }
        release_own(c, r);
    }
    pl->nsegments = (uint32_t)n;
    free(c->lsegs);
    c->lsegs = NULL;
    /* a receiver that takes one chunk twice (two targets, or two pieces, of the same bytes) */
    for (uint64_t i = 0, j; twice && i < n; i = j) {
        for (j = i + 1; j < n && pl->segments[j].receiver == pl->segments[i].receiver &&
                        pl->segments[j].chunk == pl->segments[i].chunk;
             j++)
            ;
        if (j - i > 1)
            qsort(pl->segments + i, j - i, sizeof(*pl->segments), cmp_segment);
    }
done:
    free(tmp);
    free(item);
    free(rv);
    free(order);
    free(cnt);
    free(tally);
    return st;
}


/* ------------------------------------------------------------------------------------------ */
/* Entry points                                                                                 */
/* ------------------------------------------------------------------------------------------ */

wsync_status_t wsync_plan_check_limits(uint32_t nsenders, uint32_t nreceivers,
                                       uint64_t bucket_bytes, wsync_status_t code)
{
    if (nsenders == 0 || nreceivers == 0 || nsenders > WSYNC_PLAN_MAX_RANKS ||
        nreceivers > WSYNC_PLAN_MAX_RANKS ||
        (uint64_t)nsenders * nreceivers > WSYNC_PLAN_MAX_PAIRS)
        return wsync_err(code, "plan: %u senders and %u receivers (each must be in [1, %u], their "
                         "product at most %u)", nsenders, nreceivers, WSYNC_PLAN_MAX_RANKS,
                         WSYNC_PLAN_MAX_PAIRS);
    if (bucket_bytes < WSYNC_PLAN_MIN_BUCKET || bucket_bytes > WSYNC_PLAN_MAX_BUCKET)
        return wsync_err(code, "plan: bucket of %" PRIu64 " bytes (must be in [%u, %" PRIu64 "])",
                         bucket_bytes, WSYNC_PLAN_MIN_BUCKET, (uint64_t)WSYNC_PLAN_MAX_BUCKET);
    return WSYNC_OK;
}

wsync_status_t wsync_plan_compile(const wsync_shard_desc_t *shards, size_t nshards,
                                  const wsync_target_desc_t *targets, size_t ntargets,
                                  uint32_t nsenders, uint32_t nreceivers, uint64_t bucket_bytes,
                                  wsync_plan_t **plan)
{
    return wsync_plan_compile_opts(shards, nshards, targets, ntargets, nsenders, nreceivers,
                                   bucket_bytes, NULL, plan);
}

wsync_status_t wsync_plan_compile_opts(const wsync_shard_desc_t *shards, size_t nshards,
                                       const wsync_target_desc_t *targets, size_t ntargets,
                                       uint32_t nsenders, uint32_t nreceivers,
                                       uint64_t bucket_bytes, const wsync_plan_opts_t *opts,
                                       wsync_plan_t **plan)
{
    compile_t c;
    wsync_status_t st;

    if (plan == NULL || (nshards > 0 && shards == NULL) || (ntargets > 0 && targets == NULL))
        return wsync_err(WSYNC_ERR_INVALID, "plan: NULL argument");
    if ((st = wsync_plan_check_limits(nsenders, nreceivers, bucket_bytes, WSYNC_ERR_INVALID)) !=
        WSYNC_OK)
        return st;
    if (nshards >= UINT32_MAX || ntargets >= UINT32_MAX)
        return wsync_err(WSYNC_ERR_RANGE, "plan: %zu shards, %zu targets", nshards, ntargets);

    memset(&c, 0, sizeof(c));
    c.shards = shards;
    c.nshards = nshards;
    c.targets = targets;
    c.ntargets = ntargets;
    c.nsenders = nsenders;
    c.nreceivers = nreceivers;
    c.bucket_bytes = bucket_bytes;
    c.fp8_wire = opts != NULL && opts->fp8_wire;
    c.plan = calloc(1, sizeof(*c.plan));
    c.load = calloc(nsenders, sizeof(*c.load));
    if (c.plan == NULL || c.load == NULL || map_grow(&c) != 0) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan: compile state");
        goto fail;
    }
    c.plan->nsenders = nsenders;
    c.plan->nreceivers = nreceivers;
    c.plan->bucket_bytes = bucket_bytes;

    /* nbuckets, bucket_used and pair_bytes are filled by passes 3 and 4 as they lay the chunks
     * and segments, to the values plan_derive gives a decoded plan */
    if ((st = index_shards(&c)) != WSYNC_OK || (st = map_targets(&c)) != WSYNC_OK ||
        (st = mark_wire(&c)) != WSYNC_OK || (st = layout_buckets(&c)) != WSYNC_OK ||
        (st = split_segments(&c)) != WSYNC_OK)
        goto fail;
    c.plan->rules = c.rules;         /* the rules chunks name, in the plan's keeping */
    c.plan->nrules = c.nrules;
    c.rules = NULL;
    c.nrules = c.cap_rules = 0;

    /* the fingerprint is the xxh3-64 of the encoded body, as wsync_plan_encode appends it */
    compile_release(&c);
    if ((st = wsync_plan_fingerprint(c.plan)) != WSYNC_OK)
        goto fail;

    *plan = c.plan;
    c.plan = NULL;
    compile_release(&c);
    return WSYNC_OK;
fail:
    wsync_plan_free(c.plan);
    compile_release(&c);
    return st;
}

void wsync_plan_free(wsync_plan_t *plan)
{
    if (plan == NULL)
        return;
    free(plan->chunks);
    free(plan->segments);
    free(plan->nbuckets);
    free(plan->bucket_used);
    free(plan->pair_bytes);
    free(plan->rules);
    free(plan);
}


/* ------------------------------------------------------------------------------------------ */
/* Checks against a participant's own descriptions                                              */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    uint32_t index;
    const void *desc;
} by_index_t;

static int cmp_by_index(const void *a, const void *b)
{
    const by_index_t *x = a, *y = b;
    return x->index < y->index ? -1 : x->index > y->index;
}

static const void *lookup(const by_index_t *v, size_t n, uint32_t index)
{
    by_index_t key = {index, NULL};
    const by_index_t *hit = bsearch(&key, v, n, sizeof(*v), cmp_by_index);
    return hit ? hit->desc : NULL;
}

wsync_status_t wsync_plan_check_sender(const wsync_plan_t *plan, uint32_t rank,
                                       const wsync_shard_desc_t *shards, size_t nshards)
{
    by_index_t *v;
    size_t n = 0;
    wsync_status_t st = WSYNC_OK;

    if (plan == NULL || (nshards > 0 && shards == NULL))
        return wsync_err(WSYNC_ERR_INVALID, "plan check: NULL argument");
    if (rank >= plan->nsenders)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan has %u senders; this is sender %u",
                         plan->nsenders, rank);
    v = malloc((nshards ? nshards : 1) * sizeof(*v));
    if (v == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "plan check");
    for (size_t i = 0; i < nshards; i++)
        if (shards[i].sender == rank)
            v[n++] = (by_index_t){shards[i].index, &shards[i]};
    qsort(v, n, sizeof(*v), cmp_by_index);

    for (uint32_t i = 0; i < plan->nchunks && st == WSYNC_OK; i++) {
        const wsync_chunk_t *ch = &plan->chunks[i];
        const wsync_shard_desc_t *s;
        uint64_t vol, end;

        if (ch->sender != rank)
            continue;
        s = lookup(v, n, ch->shard);
        if (s == NULL) {
            st = wsync_err(WSYNC_ERR_PROTOCOL, "plan chunk %u reads shard %u of sender %u, which "
                           "it does not hold", i, ch->shard, rank);
            break;
        }
        if (s->param.ndim < 1 || s->param.ndim > WSYNC_MAX_DIMS ||
            !span_inside(s->param.ndim, s->box.start, s->box.len, s->param.shape)) {
            st = wsync_err(WSYNC_ERR_INVALID, "sender %u shard %u ('%s') is malformed", rank,
                           ch->shard, nm(s->param.name));
            break;
        }
        vol = box_volume(s->param.ndim, &s->box);
        end = region_end(&ch->src);
        if (ch->rule != 0 && (ch->rule > plan->nrules || !dtype_is_float(ch->dtype)))
            st = wsync_err(WSYNC_ERR_PROTOCOL, "plan chunk %u of shard %u (param '%s', %s) is to "
                           "travel quantized with FP8 rule %u of %u", i, ch->shard,
                           nm(s->param.name), wsync_dtype_name(ch->dtype), ch->rule,
                           plan->nrules);
        else if (ch->dtype != s->param.dtype || !region_sane(&ch->src) || end > vol)
            st = wsync_err(WSYNC_ERR_PROTOCOL, "plan chunk %u does not fit shard %u (param '%s', "
                           "%s, %" PRIu64 " elements): %s, elements [%" PRIu64 ", %" PRIu64 ")",
                           i, ch->shard, nm(s->param.name), wsync_dtype_name(s->param.dtype), vol,
                           wsync_dtype_name(ch->dtype), ch->src.off, end);
    }
    free(v);
    return st;
}

wsync_status_t wsync_plan_check_receiver(const wsync_plan_t *plan, uint32_t rank,
                                         const wsync_target_desc_t *targets, size_t ntargets)
{
    by_index_t *v;
    size_t n = 0;
    wsync_status_t st = WSYNC_OK;

    if (plan == NULL || (ntargets > 0 && targets == NULL))
        return wsync_err(WSYNC_ERR_INVALID, "plan check: NULL argument");
    if (rank >= plan->nreceivers)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan has %u receivers; this is receiver %u",
                         plan->nreceivers, rank);
    v = malloc((ntargets ? ntargets : 1) * sizeof(*v));
    if (v == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "plan check");
    for (size_t i = 0; i < ntargets; i++)
        if (targets[i].receiver == rank)
            v[n++] = (by_index_t){targets[i].index, &targets[i]};
    qsort(v, n, sizeof(*v), cmp_by_index);

    for (uint32_t i = 0; i < plan->nsegments && st == WSYNC_OK; i++) {
        const wsync_segment_t *sg = &plan->segments[i];
        const wsync_target_desc_t *t;
        const wsync_chunk_t *ch;
        uint64_t vol, end;

        if (sg->receiver != rank)
            continue;
        t = lookup(v, n, sg->target);
        if (t == NULL) {
            st = wsync_err(WSYNC_ERR_PROTOCOL, "plan segment %u writes target %u of receiver %u, "
                           "which it does not have", i, sg->target, rank);
            break;
        }
        if (sg->chunk >= plan->nchunks) {
            st = wsync_err(WSYNC_ERR_PROTOCOL, "plan segment %u names chunk %u of %u", i,
                           sg->chunk, plan->nchunks);
            break;
        }
        ch = &plan->chunks[sg->chunk];
        vol = t->ndim >= 1 && t->ndim <= WSYNC_MAX_DIMS ? shape_volume(t->ndim, t->shape) : 0;
        end = region_end(&sg->dst);
        if (sg->piece >= t->npieces || t->pieces == NULL) {
            st = wsync_err(WSYNC_ERR_PROTOCOL, "plan segment %u serves piece %u of target '%s', "
                           "which has %u", i, sg->piece, nm(t->name), t->npieces);
        } else if (ch->dtype != t->pieces[sg->piece].param.dtype ||
                   !dtype_reachable(ch->dtype, t->dtype, t->quant)) {
            st = wsync_err(WSYNC_ERR_PROTOCOL, "plan segment %u brings %s to target '%s' (%s), "
                           "piece %u of param '%s' (%s)", i, wsync_dtype_name(ch->dtype),
                           nm(t->name), wsync_dtype_name(t->dtype), sg->piece,
                           nm(t->pieces[sg->piece].param.name),
                           wsync_dtype_name(t->pieces[sg->piece].param.dtype));
        } else if (sg->dst.rows != ch->src.rows || sg->dst.cols != ch->src.cols ||
                   !region_sane(&sg->dst) || end > vol) {
            st = wsync_err(WSYNC_ERR_PROTOCOL, "plan segment %u does not fit target '%s' (%" PRIu64
                           " elements): elements [%" PRIu64 ", %" PRIu64 ")", i, nm(t->name), vol,
                           sg->dst.off, end);
        } else {
            st = wsync_plan_check_wire_segment(plan, sg, t);
        }
    }
    free(v);
    return st;
}
