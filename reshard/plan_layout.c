/* Passes 3 and 4 of the plan compiler (plan.c): each sender's logical chunks laid out in its
 * buckets as the plan's chunks, split where a bucket ends, then the plan's shared lists of
 * segments and each receiver's references to them. Bucket use is summed as chunks are laid
 * (plan_derive in plan_wire.c finds the same from a decoded plan's chunks). */
#include "reshard/plan.h"
#include "reshard/plan_internal.h"

#include "core/status.h"
#include "core/util.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

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
    if (plan_grow((void **)&pl->chunks, &c->cap_chunks, pl->nchunks + 1, sizeof(*pl->chunks)))
        return wsync_err(WSYNC_ERR_NOMEM, "plan: %u chunks", pl->nchunks + 1);
    if (c->parts == NULL && (row | col) != 0) {   /* the first split: earlier parts start at 0 */
        c->cap_parts = 0;
        if (plan_grow((void **)&c->parts, &c->cap_parts, c->cap_chunks, sizeof(*c->parts)))
            return wsync_err(WSYNC_ERR_NOMEM, "plan: %u chunks", pl->nchunks + 1);
        memset(c->parts, 0, pl->nchunks * sizeof(*c->parts));
    }
    if (c->parts != NULL &&
        plan_grow((void **)&c->parts, &c->cap_parts, pl->nchunks + 1, sizeof(*c->parts)))
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
        ch->ncells = (uint32_t)(cr * cc); /* wsync_plan_layout_buckets keeps it in range */
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
        if (plan_grow((void **)&pl->bucket_used, &c->cap_used, c->nused + 1,
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
wsync_status_t wsync_plan_layout_buckets(compile_t *c)
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
        plan_grow((void **)&c->plan->chunks, &c->cap_chunks, nl, sizeof(*c->plan->chunks))) {
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
                if (m == 0) { /* wsync_plan_mark_wire saw a row of cells fit a bucket */
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

/* ------------------------------------------------------------------------------------------ */
/* Pass 4: lists                                                                                */
/* ------------------------------------------------------------------------------------------ */

/* One of a target's logical segments in pass 4: its logical chunk (the sort key) and which. */
typedef struct {
    uint32_t lchunk, lseg;
} item_t;

#define RADIX_BITS 11

/* Order items by logical chunk, stably (LSD radix, RADIX_BITS a pass, `passes` passes). a and
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

/* (piece, off) order of a list's records on one chunk (a target taking a chunk twice). */
static void sort_ties(wsync_list_seg_t *a, size_t m)
{
    for (size_t i = 1; i < m; i++) {
        wsync_list_seg_t v = a[i];
        size_t j = i;
        while (j > 0 && (a[j - 1].piece > v.piece ||
                         (a[j - 1].piece == v.piece && a[j - 1].off > v.off))) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = v;
    }
}

/* The plan's lists and references. A target whose logical segments are its own (tref.src is
 * itself) becomes a list: its logical segments, each cut into the parts (chunks) of its logical
 * chunk, in (chunk, piece, off) order; every target, its own or laid out like an earlier one,
 * is a reference (target, list) of its receiver. Segments of all receivers are never written:
 * a receiver's are its references' lists merged by chunk (wsync_plan_segments). Segments per
 * receiver and pair bytes are derived from the lists (wsync_plan_lists_derive). */
wsync_status_t wsync_plan_split_segments(compile_t *c)
{
    wsync_plan_t *pl = c->plan;
    uint64_t n = 0, nrec = 0;
    item_t *item = NULL, *tmp = NULL;
    uint32_t *lid = NULL;
    size_t most = 0, nt = c->ntargets, nrefs = 0;
    unsigned passes = 1;
    wsync_status_t st = WSYNC_OK;
    const uint32_t *part0 = c->part0;
    tref_t *tr = c->trefs;

    /* segments per target: counted once for a target's own logical segments, taken by copies */
    for (size_t j = 0; j < nt; j++) {
        if (tr[j].src == j) {
            uint64_t m = 0;
            for (uint32_t k = 0; k < tr[j].nlseg; k++) {
                uint32_t l = c->lsegs[tr[j].lseg0 + k].lchunk;
                m += part0[l + 1] - part0[l];
            }
            tr[j].nseg = m;
            nrec += m;
            most = WSYNC_MAX(most, (size_t)tr[j].nlseg);
        } else {
            tr[j].nseg = tr[tr[j].src].nseg;   /* src < j */
        }
        n += tr[j].nseg;
        nrefs += tr[j].nseg > 0;
    }
    /* refused here, before any list is written */
    if (n > WSYNC_PLAN_MAX_LOGICAL_SEGMENTS || nrec > WSYNC_PLAN_MAX_SEGMENTS)
        return wsync_err(WSYNC_ERR_RANGE, "plan: %" PRIu64 " segments (one per chunk and "
                         "receiver taking it) to %u receivers in %" PRIu64 " records, more than "
                         "the %u segments or %u records a plan may have; use fewer receivers "
                         "per group, larger buckets, or sender layouts that split fewer params "
                         "(e.g. fused experts)", n, c->nreceivers, nrec,
                         WSYNC_PLAN_MAX_LOGICAL_SEGMENTS, WSYNC_PLAN_MAX_SEGMENTS);
    while (passes < 3 && ((uint64_t)c->nlchunks >> (RADIX_BITS * passes)) != 0)
        passes++;
    pl->lsegs = malloc((nrec ? nrec : 1) * sizeof(*pl->lsegs));
    pl->list0 = malloc((nt + 1) * sizeof(*pl->list0));
    pl->refs = malloc((nrefs ? nrefs : 1) * sizeof(*pl->refs));
    pl->ref0 = calloc(c->nreceivers + (size_t)1, sizeof(*pl->ref0));
    tmp = malloc((most ? most : 1) * sizeof(*tmp));
    item = malloc((most ? most : 1) * sizeof(*item));
    lid = malloc((nt ? nt : 1) * sizeof(*lid));
    if (pl->lsegs == NULL || pl->list0 == NULL || pl->refs == NULL || pl->ref0 == NULL ||
        tmp == NULL || item == NULL || lid == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan: %" PRIu64 " segment records", nrec);
        goto done;
    }
    pl->list0[0] = 0;
    nrec = 0;
    for (size_t j = 0; j < nt; j++) {
        const item_t *sorted;
        const lseg_t *ls;
        if (tr[j].src != j || tr[j].nseg == 0)
            continue;
        ls = &c->lsegs[tr[j].lseg0];
        for (uint32_t k = 0; k < tr[j].nlseg; k++) {
            item[k].lchunk = ls[k].lchunk;
            item[k].lseg = tr[j].lseg0 + k;
        }
        sorted = radix_by_lchunk(item, tmp, tr[j].nlseg, passes);
        for (size_t i = 0, e; i < tr[j].nlseg; i = e) {
            uint32_t k = sorted[i].lchunk;
            for (e = i + 1; e < tr[j].nlseg && sorted[e].lchunk == k; e++)
                ;
            for (uint32_t q = part0[k]; q < part0[k + 1]; q++) {
                size_t at = nrec;
                for (size_t g = i; g < e; g++) {
                    const lseg_t *sl = &c->lsegs[sorted[g].lseg];
                    wsync_list_seg_t *o = &pl->lsegs[nrec++];
                    o->piece = sl->piece;
                    o->chunk = q;
                    o->off = sl->dst_off;
                    if (c->parts != NULL)
                        o->off += c->parts[q].row * sl->dst_pitch + c->parts[q].col;
                    o->pitch = sl->dst_pitch;
                }
                if (e - i > 1)
                    sort_ties(&pl->lsegs[at], e - i);
            }
        }
        lid[j] = pl->nlists++;
        pl->list0[pl->nlists] = (uint32_t)nrec;
    }
    nrefs = 0;
    for (size_t j = 0; j < nt; j++) {
        if (tr[j].nseg > 0) {
            pl->refs[nrefs].target = tr[j].target;
            pl->refs[nrefs].list = lid[tr[j].src];
            nrefs++;
        }
        pl->ref0[tr[j].receiver + 1] = (uint32_t)nrefs;
    }
    for (uint32_t r = 0; r < c->nreceivers; r++)   /* receivers without targets */
        pl->ref0[r + 1] = WSYNC_MAX(pl->ref0[r + 1], pl->ref0[r]);
    free(c->lsegs);
    c->lsegs = NULL;
    if ((st = wsync_plan_lists_derive(pl, WSYNC_ERR_RANGE)) == WSYNC_OK)
        st = wsync_plan_cache_init(pl);
done:
    free(tmp);
    free(item);
    free(lid);
    return st;
}
