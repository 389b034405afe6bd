/* Passes 3 and 4 of the plan compiler (plan.c): each sender's logical chunks laid out in its
 * buckets as the plan's chunks, split where a bucket ends, then the plan's segments written in
 * (receiver, chunk) order. Bucket use and pair bytes are summed as they are laid (plan_derive in
 * plan_wire.c finds the same from a decoded plan's chunks and segments). */
#include "reshard/plan.h"
#include "reshard/plan_internal.h"

#include "core/status.h"
#include "core/util.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

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
/* Pass 4: segments                                                                             */
/* ------------------------------------------------------------------------------------------ */

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
 * order (pass 2 sorted them); each receiver's logical segments, target by target, are put
 * in logical chunk order by a radix sort of their numbers (stable, so a receiver taking one
 * chunk twice keeps logical segment order, as before), and its segments are then written front
 * to back: logical chunks are numbered in bucket order, so their parts are chunks 0, 1, ...
 * Only segments of one receiver that share a chunk are sorted further. The scratch is sized by
 * the largest receiver's logical segments, not by the plan.
 * Receivers are written in an order that keeps those taking the same logical segments together
 * (with TP-8 x EP-128, receivers r, r + 8, r + 16, ... of one TP rank), each at its place in
 * the plan: the logical segments they read jumping (megabytes a TP rank) stay in cache from one
 * to the next, where receiver order would cycle through all the TP ranks' lists. */
wsync_status_t wsync_plan_split_segments(compile_t *c)
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
