/* The plan's segments as shared lists: a receiver's segments are the lists its targets take
 * (wsync_plan_ref_t), merged in chunk order. Data-parallel receivers lay out most of their
 * targets alike, so a plan to hundreds of receivers holds a few lists many times over: Kimi-K2
 * to 512 receivers is 78 million segments from about half a million records. Here: expanding
 * a receiver's lists (wsync_plan_segments, and the wire coder's expander), building lists from
 * receivers' segments (the decoder; tests), and the tables derived from lists (segments per
 * receiver, pair bytes). */
#include "reshard/plan.h"
#include "reshard/plan_internal.h"

#include "core/status.h"
#include "core/util.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

struct wsync_plan_cache {
    pthread_mutex_t mu;
    wsync_segment_t **rx;            /* [nreceivers] expanded, or NULL */
};

wsync_status_t wsync_plan_cache_init(wsync_plan_t *p)
{
    struct wsync_plan_cache *c = calloc(1, sizeof(*c));

    if (c == NULL || (c->rx = calloc(p->nreceivers + (size_t)1, sizeof(*c->rx))) == NULL ||
        pthread_mutex_init(&c->mu, NULL) != 0) {
        if (c != NULL)
            free(c->rx);
        free(c);
        return wsync_err(WSYNC_ERR_NOMEM, "plan: segment cache for %u receivers",
                         p->nreceivers);
    }
    p->cache = c;
    return WSYNC_OK;
}

void wsync_plan_cache_free(wsync_plan_t *p)
{
    struct wsync_plan_cache *c = p->cache;

    if (c == NULL)
        return;
    for (uint32_t r = 0; r < p->nreceivers; r++)
        free(c->rx[r]);
    free(c->rx);
    pthread_mutex_destroy(&c->mu);
    free(c);
    p->cache = NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Expanding a receiver                                                                         */
/* ------------------------------------------------------------------------------------------ */

#define XRADIX_BITS 11

void wsync_expander_free(wsync_expander_t *x)
{
    free(x->a);
    free(x->tmp);
    memset(x, 0, sizeof(*x));
}

/* Stable LSD radix sort of m items by chunk, `passes` passes of XRADIX_BITS, the digits'
 * counts given (cnt[d][v + 1]: items whose digit d is v, counted as the items were made); the
 * last pass writes into `into` when given. Returns the sorted array (a, tmp or into). */
static wsync_xitem_t *xradix(wsync_xitem_t *a, wsync_xitem_t *tmp, wsync_xitem_t *into,
                             size_t m, unsigned passes, uint32_t (*cnt)[(1u << XRADIX_BITS) + 1])
{
    const uint32_t mask = (1u << XRADIX_BITS) - 1;

    for (unsigned p = 0; p < passes; p++) {
        unsigned shift = XRADIX_BITS * p;
        uint32_t *c = cnt[p];
        wsync_xitem_t *dst = p + 1 == passes && into != NULL ? into : tmp;
        for (uint32_t d = 0; d < mask + 1; d++)
            c[d + 1] += c[d];
        for (size_t i = 0; i < m; i++)
            dst[c[(a[i].chunk >> shift) & mask]++] = a[i];
        tmp = a;
        a = dst;
    }
    return a;
}

wsync_status_t wsync_plan_expand_items(const wsync_plan_t *p, uint32_t r, wsync_expander_t *x,
                                       wsync_xitem_t *into, const wsync_xitem_t **items)
{
    size_t m = 0, n = p->rx_nsegs[r];
    int sorted = 1;
    unsigned passes = 1;
    uint32_t cnt[3][(1u << XRADIX_BITS) + 1];
    const uint32_t mask = (1u << XRADIX_BITS) - 1;

    if (n > x->cap) {
        wsync_xitem_t *a = realloc(x->a, n * sizeof(*a)), *t;
        if (a == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "plan: expanding %zu segments", n);
        x->a = a;
        t = realloc(x->tmp, n * sizeof(*t));
        if (t == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "plan: expanding %zu segments", n);
        x->tmp = t;
        x->cap = n;
    }
    while (passes < 3 && ((uint64_t)p->nchunks >> (XRADIX_BITS * passes)) != 0)
        passes++;
    memset(cnt, 0, sizeof(cnt));
    /* references are in target order and each list in (chunk, piece, off) order, so a stable
     * sort by chunk gives (chunk, target, piece, off); the sort's digits counted here. The
     * items carry their records: read in sorted order, the records would be read jumping
     * between hundreds of lists, a cache miss a segment. */
    for (uint32_t k = p->ref0[r]; k < p->ref0[r + 1]; k++) {
        const wsync_plan_ref_t *rf = &p->refs[k];
        for (uint32_t i = p->list0[rf->list]; i < p->list0[rf->list + 1]; i++, m++) {
            const wsync_list_seg_t *l = &p->lsegs[i];
            uint32_t c = l->chunk;
            wsync_xitem_t *it = &x->a[m];
            it->chunk = c;
            it->target = rf->target;
            it->piece = l->piece;
            it->pad = 0;
            it->off = l->off;
            it->pitch = l->pitch;
            for (unsigned d = 0; d < passes; d++)
                cnt[d][((c >> (XRADIX_BITS * d)) & mask) + 1]++;
            sorted &= m == 0 || x->a[m - 1].chunk <= c;
        }
    }
    if (!sorted) {
        *items = xradix(x->a, x->tmp, into, m, passes, cnt);
    } else if (into != NULL) {
        memcpy(into, x->a, m * sizeof(*into));
        *items = into;
    } else {
        *items = x->a;
    }
    return WSYNC_OK;
}

wsync_status_t wsync_plan_expand(const wsync_plan_t *p, uint32_t r, wsync_expander_t *x,
                                 wsync_segment_t *out)
{
    const wsync_xitem_t *s;
    size_t m = p->rx_nsegs[r];
    wsync_status_t st = wsync_plan_expand_items(p, r, x, NULL, &s);

    if (st != WSYNC_OK)
        return st;
    for (size_t i = 0; i < m; i++) {
        const wsync_chunk_t *ch = &p->chunks[s[i].chunk];
        wsync_segment_t *sg = &out[i];
        sg->receiver = r;
        sg->target = s[i].target;
        sg->piece = s[i].piece;
        sg->chunk = s[i].chunk;
        sg->dst.off = s[i].off;
        sg->dst.pitch = s[i].pitch;
        sg->dst.rows = ch->src.rows;
        sg->dst.cols = ch->src.cols;
    }
    return WSYNC_OK;
}

wsync_status_t wsync_plan_segments_into(const wsync_plan_t *plan, uint32_t r,
                                        wsync_segment_t **buf, size_t *cap, uint32_t *n)
{
    wsync_expander_t x = {0};
    wsync_status_t st;
    size_t need;

    if (plan == NULL || buf == NULL || cap == NULL || n == NULL || plan->rx_nsegs == NULL ||
        r >= plan->nreceivers)
        return wsync_err(WSYNC_ERR_INVALID, "plan segments: receiver %u of %u (or a NULL "
                         "argument)", r, plan != NULL ? plan->nreceivers : 0);
    need = plan->rx_nsegs[r] ? plan->rx_nsegs[r] : 1;
    if (plan_grow((void **)buf, cap, need, sizeof(**buf)))
        return wsync_err(WSYNC_ERR_NOMEM, "plan: %zu segments of receiver %u", need, r);
    st = wsync_plan_expand(plan, r, &x, *buf);
    wsync_expander_free(&x);
    if (st == WSYNC_OK)
        *n = plan->rx_nsegs[r];
    return st;
}

wsync_status_t wsync_plan_segments(const wsync_plan_t *plan, uint32_t r,
                                   const wsync_segment_t **segs, uint32_t *n)
{
    struct wsync_plan_cache *c;
    wsync_status_t st = WSYNC_OK;

    if (plan == NULL || segs == NULL || n == NULL || plan->cache == NULL ||
        r >= plan->nreceivers)
        return wsync_err(WSYNC_ERR_INVALID, "plan segments: receiver %u of %u (or a NULL "
                         "argument)", r, plan != NULL ? plan->nreceivers : 0);
    c = plan->cache;
    pthread_mutex_lock(&c->mu);
    if (c->rx[r] == NULL) {
        wsync_segment_t *b = NULL;
        size_t cap = 0;
        uint32_t m;
        st = wsync_plan_segments_into(plan, r, &b, &cap, &m);
        if (st == WSYNC_OK)
            c->rx[r] = b;
        else
            free(b);
    }
    pthread_mutex_unlock(&c->mu);
    if (st != WSYNC_OK)
        return st;
    *segs = c->rx[r];
    *n = plan->rx_nsegs[r];
    return WSYNC_OK;
}

wsync_status_t wsync_plan_flatten(const wsync_plan_t *plan, wsync_segment_t **segs)
{
    wsync_expander_t x = {0};
    wsync_segment_t *all = malloc(((size_t)plan->nsegments + 1) * sizeof(*all));
    uint64_t at = 0;
    wsync_status_t st = WSYNC_OK;

    if (all == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "plan: %u segments", plan->nsegments);
    for (uint32_t r = 0; r < plan->nreceivers && st == WSYNC_OK; r++) {
        st = wsync_plan_expand(plan, r, &x, all + at);
        at += plan->rx_nsegs[r];
    }
    wsync_expander_free(&x);
    if (st != WSYNC_OK) {
        free(all);
        return st;
    }
    *segs = all;
    return WSYNC_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Tables derived from the lists                                                                */
/* ------------------------------------------------------------------------------------------ */

wsync_status_t wsync_plan_lists_derive(wsync_plan_t *p, wsync_status_t code)
{
    uint64_t total = 0, *acc = NULL;
    uint32_t *e0 = NULL;
    struct ent {
        uint32_t sender;
        uint64_t bytes;
    } *ent = NULL;
    size_t nent = 0, cap_ent = 0;
    wsync_status_t st = WSYNC_OK;

    free(p->rx_nsegs);
    free(p->pair_bytes);
    p->rx_nsegs = calloc(p->nreceivers + (size_t)1, sizeof(*p->rx_nsegs));
    p->pair_bytes = calloc((size_t)p->nsenders * p->nreceivers, sizeof(*p->pair_bytes));
    acc = calloc(p->nsenders, sizeof(*acc));
    e0 = malloc((p->nlists + (size_t)1) * sizeof(*e0));
    if (p->rx_nsegs == NULL || p->pair_bytes == NULL || acc == NULL || e0 == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan: tables for %u senders x %u receivers",
                       p->nsenders, p->nreceivers);
        goto out;
    }
    for (uint32_t r = 0; r < p->nreceivers; r++) {
        uint64_t m = 0;
        for (uint32_t k = p->ref0[r]; k < p->ref0[r + 1]; k++)
            m += p->list0[p->refs[k].list + 1] - p->list0[p->refs[k].list];
        if (m > WSYNC_PLAN_MAX_SEGMENTS) {
            st = wsync_err(code, "plan: receiver %u takes %" PRIu64 " segments, more than the %u "
                           "one receiver may", r, m, WSYNC_PLAN_MAX_SEGMENTS);
            goto out;
        }
        p->rx_nsegs[r] = (uint32_t)m;
        total += m;
    }
    if (total > WSYNC_PLAN_MAX_LOGICAL_SEGMENTS) {
        st = wsync_err(code, "plan: %" PRIu64 " segments (one per chunk and receiver taking it) "
                       "to %u receivers, more than the %u a plan may have; use fewer receivers "
                       "per group, larger buckets, or sender layouts that split fewer params "
                       "(e.g. fused experts)", total, p->nreceivers,
                       WSYNC_PLAN_MAX_LOGICAL_SEGMENTS);
        goto out;
    }
    p->nsegments = (uint32_t)total;
    /* each list's bytes per sender (its chunks come in sender order: a run per sender) */
    for (uint32_t l = 0; l < p->nlists; l++) {
        e0[l] = (uint32_t)nent;
        for (uint32_t i = p->list0[l]; i < p->list0[l + 1]; i++) {
            const wsync_chunk_t *ch = &p->chunks[p->lsegs[i].chunk];
            if (nent == e0[l] || ent[nent - 1].sender != ch->sender) {
                if (plan_grow((void **)&ent, &cap_ent, nent + 1, sizeof(*ent))) {
                    st = wsync_err(WSYNC_ERR_NOMEM, "plan: pair bytes of %u lists", p->nlists);
                    goto out;
                }
                ent[nent].sender = ch->sender;
                ent[nent++].bytes = 0;
            }
            ent[nent - 1].bytes += chunk_bytes(ch);
        }
    }
    e0[p->nlists] = (uint32_t)nent;
    for (uint32_t r = 0; r < p->nreceivers; r++) {
        for (uint32_t k = p->ref0[r]; k < p->ref0[r + 1]; k++) {
            uint32_t l = p->refs[k].list;
            for (uint32_t i = e0[l]; i < e0[l + 1]; i++)
                acc[ent[i].sender] += ent[i].bytes;
        }
        for (uint32_t s = 0; s < p->nsenders; s++) {
            p->pair_bytes[(size_t)s * p->nreceivers + r] = acc[s];
            acc[s] = 0;
        }
    }
out:
    free(acc);
    free(e0);
    free(ent);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Lists from receivers' segments                                                               */
/* ------------------------------------------------------------------------------------------ */

wsync_status_t wsync_lists_begin(wsync_lists_builder_t *b, wsync_plan_t *p, wsync_status_t code)
{
    memset(b, 0, sizeof(*b));
    b->p = p;
    b->code = code;
    free(p->ref0);
    p->ref0 = calloc(p->nreceivers + (size_t)1, sizeof(*p->ref0));
    if (p->ref0 == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "plan: lists of %u receivers", p->nreceivers);
    p->nlists = 0;
    return WSYNC_OK;
}

void wsync_lists_builder_free(wsync_lists_builder_t *b)
{
    free(b->slots);
    free(b->hash);
    free(b->idx);
    free(b->tmp);
    memset(b, 0, sizeof(*b));
}

static int lists_rehash(wsync_lists_builder_t *b)
{
    size_t cap = b->cap_slots ? b->cap_slots * 2 : 1024;
    uint32_t *s = malloc(cap * sizeof(*s));

    if (s == NULL)
        return -1;
    memset(s, 0xff, cap * sizeof(*s));
    for (uint32_t l = 0; l < b->p->nlists; l++) {
        size_t h = (size_t)b->hash[l] & (cap - 1);
        while (s[h] != UINT32_MAX)
            h = (h + 1) & (cap - 1);
        s[h] = l;
    }
    free(b->slots);
    b->slots = s;
    b->cap_slots = cap;
    return 0;
}

/* segs[idx[0 .. m)] (one target's, in order) as a list: an earlier equal one, or a new one. */
static wsync_status_t lists_take(wsync_lists_builder_t *b, uint32_t r, const wsync_segment_t *segs,
                                 const uint32_t *idx, size_t m)
{
    wsync_plan_t *p = b->p;
    size_t base = p->list0 != NULL ? p->list0[p->nlists] : 0, h;
    uint64_t hv;
    uint32_t list = UINT32_MAX;

    if (base + m > WSYNC_PLAN_MAX_SEGMENTS)
        return wsync_err(b->code, "plan: more than %u segment records in its lists",
                         WSYNC_PLAN_MAX_SEGMENTS);
    if (plan_grow((void **)&p->lsegs, &b->cap_lsegs, base + m, sizeof(*p->lsegs)) ||
        plan_grow((void **)&p->list0, &b->cap_list0, p->nlists + (size_t)2,
                  sizeof(*p->list0)) ||
        plan_grow((void **)&b->hash, &b->cap_hash, p->nlists + (size_t)1, sizeof(*b->hash)) ||
        plan_grow((void **)&p->refs, &b->cap_refs, b->nrefs + (size_t)1, sizeof(*p->refs)))
        return wsync_err(WSYNC_ERR_NOMEM, "plan: %zu segment records", base + m);
    if (p->nlists == 0)
        p->list0[0] = 0;
    for (size_t i = 0; i < m; i++) {
        const wsync_segment_t *sg = &segs[idx[i]];
        wsync_list_seg_t *l = &p->lsegs[base + i];
        l->piece = sg->piece;
        l->chunk = sg->chunk;
        l->off = sg->dst.off;
        l->pitch = sg->dst.pitch;
    }
    hv = XXH3_64bits(&p->lsegs[base], m * sizeof(*p->lsegs));
    if ((p->nlists + (size_t)1) * 2 > b->cap_slots && lists_rehash(b) != 0)
        return wsync_err(WSYNC_ERR_NOMEM, "plan: %u lists", p->nlists + 1);
    for (h = (size_t)hv & (b->cap_slots - 1); b->slots[h] != UINT32_MAX;
         h = (h + 1) & (b->cap_slots - 1)) {
        uint32_t l = b->slots[h];
        if (b->hash[l] == hv && p->list0[l + 1] - p->list0[l] == m &&
            memcmp(&p->lsegs[p->list0[l]], &p->lsegs[base], m * sizeof(*p->lsegs)) == 0) {
            list = l;
            break;
        }
    }
    if (list == UINT32_MAX) {        /* a new list: keep the records just written */
        list = p->nlists++;
        p->list0[p->nlists] = (uint32_t)(base + m);
        b->hash[list] = hv;
        b->slots[h] = list;
    }
    p->refs[b->nrefs].target = segs[idx[0]].target;
    p->refs[b->nrefs].list = list;
    b->nrefs++;
    (void)r;
    return WSYNC_OK;
}

wsync_status_t wsync_lists_add(wsync_lists_builder_t *b, uint32_t r, const wsync_segment_t *segs,
                               size_t n)
{
    wsync_plan_t *p = b->p;
    uint32_t maxt = 0;
    unsigned bits = 0;
    wsync_status_t st = WSYNC_OK;

    p->ref0[r] = (uint32_t)b->nrefs;
    if (plan_grow((void **)&b->idx, &b->cap_idx, n + 1, sizeof(*b->idx)) ||
        plan_grow((void **)&b->tmp, &b->cap_tmp, n + 1, sizeof(*b->tmp)))
        return wsync_err(WSYNC_ERR_NOMEM, "plan: %zu segments of receiver %u", n, r);
    for (size_t i = 0; i < n; i++) {
        b->idx[i] = (uint32_t)i;
        maxt = WSYNC_MAX(maxt, segs[i].target);
    }
    while (bits < 32 && (maxt >> bits) != 0)
        bits += 8;
    /* group by target, stably (LSD radix on the target, 8 bits a pass) */
    for (unsigned sh = 0; sh < bits; sh += 8) {
        uint32_t cnt[257];
        uint32_t *t;
        memset(cnt, 0, sizeof(cnt));
        for (size_t i = 0; i < n; i++)
            cnt[((segs[b->idx[i]].target >> sh) & 0xffu) + 1]++;
        for (unsigned d = 0; d < 256; d++)
            cnt[d + 1] += cnt[d];
        for (size_t i = 0; i < n; i++)
            b->tmp[cnt[(segs[b->idx[i]].target >> sh) & 0xffu]++] = b->idx[i];
        t = b->idx;
        b->idx = b->tmp;
        b->tmp = t;
    }
    for (size_t i = 0, e; i < n && st == WSYNC_OK; i = e) {
        for (e = i + 1; e < n && segs[b->idx[e]].target == segs[b->idx[i]].target; e++)
            ;
        st = lists_take(b, r, segs, b->idx + i, e - i);
    }
    p->ref0[r + 1] = (uint32_t)b->nrefs;
    return st;
}

wsync_status_t wsync_lists_end(wsync_lists_builder_t *b)
{
    wsync_plan_t *p = b->p;

    if (p->list0 == NULL && (p->list0 = calloc(1, sizeof(*p->list0))) == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "plan: lists");
    if (p->lsegs == NULL && (p->lsegs = calloc(1, sizeof(*p->lsegs))) == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "plan: lists");
    if (p->refs == NULL && (p->refs = calloc(1, sizeof(*p->refs))) == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "plan: lists");
    return WSYNC_OK;
}

wsync_status_t wsync_plan_set_segments(wsync_plan_t *p, const wsync_segment_t *segs, size_t n)
{
    wsync_lists_builder_t b;
    wsync_status_t st;
    size_t i = 0;

    free(p->list0);
    free(p->lsegs);
    free(p->refs);
    p->list0 = NULL;
    p->lsegs = NULL;
    p->refs = NULL;
    wsync_plan_cache_free(p);
    if ((st = wsync_lists_begin(&b, p, WSYNC_ERR_RANGE)) != WSYNC_OK)
        return st;
    for (uint32_t r = 0; r < p->nreceivers && st == WSYNC_OK; r++) {
        size_t e = i;
        while (e < n && segs[e].receiver == r)
            e++;
        st = wsync_lists_add(&b, r, segs + i, e - i);
        i = e;
    }
    if (st == WSYNC_OK && i != n)
        st = wsync_err(WSYNC_ERR_INVALID, "plan: segment %zu (receiver %u) is out of receiver "
                       "order", i, segs[i].receiver);
    if (st == WSYNC_OK)
        st = wsync_lists_end(&b);
    wsync_lists_builder_free(&b);
    if (st == WSYNC_OK)
        st = wsync_plan_lists_derive(p, WSYNC_ERR_RANGE);
    if (st == WSYNC_OK)
        st = wsync_plan_cache_init(p);
    return st;
}

void wsync_plan_segment_bytes(const wsync_plan_t *plan, uint64_t *plain, uint64_t *wire)
{
    *plain = *wire = 0;
    for (uint32_t r = 0; r < plan->nreceivers; r++)
        for (uint32_t k = plan->ref0[r]; k < plan->ref0[r + 1]; k++) {
            uint32_t l = plan->refs[k].list;
            for (uint32_t i = plan->list0[l]; i < plan->list0[l + 1]; i++) {
                const wsync_chunk_t *c = &plan->chunks[plan->lsegs[i].chunk];
                *plain += c->src.rows * c->src.cols * wsync_dtype_size(c->dtype);
                *wire += wsync_chunk_wire_bytes(c);
            }
        }
}

void wsync_plan_list_range(const wsync_plan_t *plan, uint32_t l, uint32_t c0, uint32_t c1,
                           uint32_t *a, uint32_t *b)
{
    uint32_t lo = plan->list0[l], hi = plan->list0[l + 1], e;

    while (lo < hi) {                /* the first record on a chunk >= c0 */
        uint32_t mid = lo + (hi - lo) / 2;
        if (plan->lsegs[mid].chunk < c0)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (e = lo; e < plan->list0[l + 1] && plan->lsegs[e].chunk < c1; e++)
        ;
    *a = lo;
    *b = e;
}

void wsync_plan_bucket_chunks(const wsync_plan_t *plan, uint32_t s, uint32_t *start)
{
    uint32_t lo = 0, hi = plan->nchunks;

    while (lo < hi) {                /* the first chunk of a sender >= s */
        uint32_t mid = lo + (hi - lo) / 2;
        if (plan->chunks[mid].sender < s)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (uint32_t k = 0; k <= plan->nbuckets[s]; k++) {
        while (lo < plan->nchunks && plan->chunks[lo].sender == s && plan->chunks[lo].bucket < k)
            lo++;
        start[k] = lo;
    }
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

wsync_status_t wsync_plan_rx_chunks(const wsync_plan_t *plan, uint32_t r, uint32_t c0,
                                    uint32_t c1, uint32_t **buf, size_t *cap, uint32_t *n)
{
    size_t m = 0, out = 0;
    int sorted = 1;

    for (uint32_t k = plan->ref0[r]; k < plan->ref0[r + 1]; k++) {
        uint32_t a, b;
        wsync_plan_list_range(plan, plan->refs[k].list, c0, c1, &a, &b);
        if (plan_grow((void **)buf, cap, m + (b - a) + 1, sizeof(**buf)))
            return wsync_err(WSYNC_ERR_NOMEM, "plan: chunks of receiver %u", r);
        for (; a < b; a++) {
            sorted &= m == 0 || (*buf)[m - 1] <= plan->lsegs[a].chunk;
            (*buf)[m++] = plan->lsegs[a].chunk;
        }
    }
    if (!sorted)
        qsort(*buf, m, sizeof(**buf), cmp_u32);
    for (size_t i = 0; i < m; i++)
        if (out == 0 || (*buf)[out - 1] != (*buf)[i])
            (*buf)[out++] = (*buf)[i];
    *n = (uint32_t)out;
    return WSYNC_OK;
}
