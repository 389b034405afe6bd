/* The plan's wire form: wsync_plan_encode (header, chunks, segments, then the xxh3-64
 * fingerprint of those bytes), wsync_plan_wire_bytes, the fingerprint a compiled plan carries
 * (wsync_plan_fingerprint: the same hash over the same bytes, never held whole), and
 * wsync_plan_decode, which checks everything it reads and derives the tables that do not travel
 * (plan_derive). The compiler is in plan.c.
 */
#include "reshard/plan.h"
#include "reshard/plan_internal.h"

#include "core/status.h"
#include "core/util.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define PLAN_MAGIC 0x4c505357u          /* "WSPL" */
/* Version 2 (issue 19): records are coded against a prediction from the record before them,
 * and a receiver's segments may be copied in runs from an earlier receiver's (data-parallel
 * replicas want the same bytes at the same places). Version 1 spent 53 bytes on every chunk and
 * 48 on every segment, which put Kimi-K2 plans at 0.5-1.3 GB, past the 64 MiB control frame. */
#define PLAN_VERSION 2u
#define PLAN_HEADER_BYTES 32u           /* magic .. segment count */
/* Header flag: FP8 on the wire. The rule table follows the header (a varint count, then each
 * rule: fp8 dtype and scheme bytes, block rows and columns as varints, eps as 4 bytes of f32,
 * a byte of ue8m0 | no_saturate << 1), and chunks may carry CF_RULE. A plan without rules is
 * coded as before (flags 0). */
#define PLAN_FLAG_RULES 0x1u
#define PLAN_MAX_RULES 65535u

/* ------------------------------------------------------------------------------------------ */
/* Derived tables, encoding, fingerprint                                                        */
/* ------------------------------------------------------------------------------------------ */

/* nbuckets and bucket_used (high-water mark) from chunks, which must already be ordered by
 * (sender, bucket) with each sender's buckets numbered densely from 0; pair_bytes and each
 * receiver's segment count from the lists. */
static wsync_status_t plan_derive(wsync_plan_t *p)
{
    uint64_t total = 0, *base;

    p->nbuckets = calloc(p->nsenders, sizeof(*p->nbuckets));
    base = calloc(p->nsenders, sizeof(*base));
    if (!p->nbuckets || !base) {
        free(base);
        return wsync_err(WSYNC_ERR_NOMEM, "plan: tables for %u senders x %u receivers",
                         p->nsenders, p->nreceivers);
    }
    for (uint32_t i = 0; i < p->nchunks; i++) {
        const wsync_chunk_t *ch = &p->chunks[i];
        if (ch->bucket + 1 > p->nbuckets[ch->sender])
            p->nbuckets[ch->sender] = ch->bucket + 1;
    }
    for (uint32_t s = 0; s < p->nsenders; s++) {
        base[s] = total;
        total += p->nbuckets[s];
    }
    p->bucket_used = calloc(total ? total : 1, sizeof(*p->bucket_used));
    if (p->bucket_used == NULL) {
        free(base);
        return wsync_err(WSYNC_ERR_NOMEM, "plan: %" PRIu64 " buckets", total);
    }
    for (uint32_t i = 0; i < p->nchunks; i++) {
        const wsync_chunk_t *ch = &p->chunks[i];
        uint64_t *u = &p->bucket_used[base[ch->sender] + ch->bucket];
        *u = WSYNC_MAX(*u, ch->bucket_off + chunk_bytes(ch));
    }
    free(base);
    return wsync_plan_lists_derive(p, WSYNC_ERR_PROTOCOL);   /* pair bytes too */
}

/* ------------------------------------------------------------------------------------------ */
/* The records' coding                                                                          */
/* ------------------------------------------------------------------------------------------ */
/*
 * After a 32-byte header (magic, version, flags, senders, receivers, bucket bytes, chunk count,
 * segment count), every number is an unsigned LEB128 varint; a signed difference is zigzagged.
 *
 * Chunk i: a varint of flags, then the fields its flags say are not predicted, in this order:
 *   sender (difference from the previous chunk's), shard (difference), dtype (one byte), rows,
 *   cols (differences), pitch (difference from cols), off, bucket, bucket_off (differences from
 *   their predictions). Predictions, from the chunk before (a zero chunk before the first):
 *   sender and dtype the same; shard the same (CF_SHARD_NEXT: one more); rows and cols the same;
 *   pitch = cols; off = where the previous chunk's region ends when the shard is the same, else 0;
 *   bucket the same for the same sender, else 0; bucket_off = the previous chunk's end rounded up
 *   to WSYNC_PLAN_ALIGN in the same bucket, else 0. A chunk laid like the one before is 1 byte.
 *
 * Segments, receiver by receiver: a varint count, and when not 0 a varint `back` (0: none; else
 * the receiver `back` ranks earlier is the reference), then records until the count is made:
 *   - a literal (flags byte, top bit clear), fields not predicted following: target, piece
 *     (differences from the previous segment's), chunk (difference from the previous + 1), pitch
 *     (difference), off (difference from where the previous segment's region ends). rows and cols
 *     are the chunk's and do not travel.
 *   - a copy (flags byte 0x80 | SF_SKIP | SF_TDELTA): [skip] count [target delta]: step over
 *     `skip` segments of the reference, then take the next `count` of them, with this receiver
 *     and target + delta. The reference position starts at 0 and moves only by copies.
 * The previous segment is the one before in the plan's order, whatever made it.
 */
#define CF_SHARD_NEXT 0x001u
#define CF_SHARD 0x002u
#define CF_OFF 0x004u
#define CF_BOFF 0x008u
#define CF_ROWS 0x010u
#define CF_COLS 0x020u
#define CF_BUCKET 0x040u
#define CF_SENDER 0x080u
#define CF_PITCH 0x100u
#define CF_DTYPE 0x200u
#define CF_RULE 0x400u                     /* FP8 rule differs from the previous chunk's */
#define CF_ALL 0x7ffu

#define SF_TARGET 0x01u
#define SF_PIECE 0x02u
#define SF_CHUNK 0x04u
#define SF_PITCH 0x08u
#define SF_OFF 0x10u
#define SF_LITERAL_ALL 0x1fu
#define SF_COPY 0x80u
#define SF_SKIP 0x01u
#define SF_TDELTA 0x02u
#define SF_COPY_ALL 0x83u

#define VARINT_MAX 10u
#define RECORD_MAX (2u + 10u * VARINT_MAX) /* longest chunk, literal, copy or receiver head */
#define REF_TRIES 256u                     /* segments tried when choosing a reference */

static inline uint64_t zigzag(uint64_t d)
{
    return (d << 1) ^ (uint64_t)-(int64_t)(d >> 63);
}

static inline uint64_t unzigzag(uint64_t z)
{
    return (z >> 1) ^ (uint64_t)-(int64_t)(z & 1);
}

static inline uint64_t align_up(uint64_t v)
{
    return (v + WSYNC_PLAN_ALIGN - 1) / WSYNC_PLAN_ALIGN * WSYNC_PLAN_ALIGN;
}

/* Where a region's rows would continue: the element after its last row's pitch. Wraps for
 * hostile values; only ever a prediction. */
static inline uint64_t region_next(const wsync_region_t *g)
{
    return g->off + g->rows * g->pitch;
}

static inline uint64_t chunk_off_pred(const wsync_chunk_t *pv, uint32_t shard)
{
    return shard == pv->shard ? region_next(&pv->src) : 0;
}

static inline uint64_t chunk_boff_pred(const wsync_chunk_t *pv, uint32_t sender, uint32_t bucket)
{
    return sender == pv->sender && bucket == pv->bucket ? align_up(pv->bucket_off +
                                                                   chunk_bytes(pv)) : 0;
}

/* Records are formed in a block of this many bytes and handed on whole: appended to the wire
 * buffer, hashed (the fingerprint), or only counted (the wire size), so a plan of millions of
 * records is never held encoded unless it is being sent, and no call is made per record. */
#define ENCODE_BLOCK ((size_t)64 << 10)

typedef struct {
    wsync_wbuf_t *b;                 /* the header goes here first */
    XXH3_state_t *h;                 /* non-NULL: hash the bytes instead of keeping them */
    int count_only;                  /* count the bytes instead of keeping them */
    uint64_t total;                  /* bytes handed on */
    const wsync_plan_t *p;           /* the chunks (a segment's rows are its chunk's) */
    uint8_t blk[ENCODE_BLOCK];
    size_t used;
} encoder_t;

/* The encoder reads receivers' segments as the expander sorts them (32 bytes, no rows or cols:
 * those are the chunk's) and never needs them as wsync_segment_t. */
typedef wsync_xitem_t eseg_t;

/* Where the segment after pv is predicted to land: right after pv's rows (a chunk past the
 * plan's, as a test hands the encoder to see the decoder refuse it, has none). */
static inline uint64_t eseg_next(const wsync_plan_t *p, const eseg_t *pv)
{
    if (pv->pitch == 0 || pv->chunk >= p->nchunks)
        return pv->off;
    return pv->off + p->chunks[pv->chunk].src.rows * pv->pitch;
}

/* Hand on what the wire buffer and the block hold, in that order (the byte order of the wire). */
static void enc_flush(encoder_t *e)
{
    if (e->h != NULL || e->count_only) {
        if (!e->b->err && e->b->len > 0) {
            if (e->h != NULL)
                XXH3_64bits_update(e->h, e->b->data, e->b->len);
            e->total += e->b->len;
            e->b->len = 0;
        }
        if (e->used > 0 && e->h != NULL)
            XXH3_64bits_update(e->h, e->blk, e->used);
    } else {
        wsync_put_bytes(e->b, e->blk, e->used);
    }
    e->total += e->used;
    e->used = 0;
}

/* Room for one more record in the block. */
static inline uint8_t *enc_room(encoder_t *e)
{
    if (e->used + RECORD_MAX > ENCODE_BLOCK)
        enc_flush(e);
    return e->blk + e->used;
}

/* Bytes already coded (a receiver's records kept from an earlier receiver), through the block. */
static void enc_bytes(encoder_t *e, const uint8_t *d, size_t n)
{
    while (n > 0) {
        size_t k;
        if (e->used == ENCODE_BLOCK)
            enc_flush(e);
        k = WSYNC_MIN(n, ENCODE_BLOCK - e->used);
        memcpy(e->blk + e->used, d, k);
        e->used += k;
        d += k;
        n -= k;
    }
}

static inline uint8_t *put_varint(uint8_t *q, uint64_t v)
{
    while (v >= 0x80) {
        *q++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *q++ = (uint8_t)v;
    return q;
}

static void encode_chunk(encoder_t *e, const wsync_chunk_t *ch, const wsync_chunk_t *pv)
{
    uint8_t *q0 = enc_room(e), *q;
    uint32_t f = 0;
    uint64_t off_pred = chunk_off_pred(pv, ch->shard);
    uint64_t bucket_pred = ch->sender == pv->sender ? pv->bucket : 0;
    uint64_t boff_pred = chunk_boff_pred(pv, ch->sender, ch->bucket);

    if (ch->sender != pv->sender)
        f |= CF_SENDER;
    if (ch->shard == pv->shard + 1u)
        f |= CF_SHARD_NEXT;
    else if (ch->shard != pv->shard)
        f |= CF_SHARD;
    if (ch->dtype != pv->dtype)
        f |= CF_DTYPE;
    if (ch->rule != pv->rule)
        f |= CF_RULE;
    if (ch->src.rows != pv->src.rows)
        f |= CF_ROWS;
    if (ch->src.cols != pv->src.cols)
        f |= CF_COLS;
    if (ch->src.pitch != ch->src.cols)
        f |= CF_PITCH;
    if (ch->src.off != off_pred)
        f |= CF_OFF;
    if (ch->bucket != bucket_pred)
        f |= CF_BUCKET;
    if (ch->bucket_off != boff_pred)
        f |= CF_BOFF;
    q = put_varint(q0, f);
    if (f & CF_SENDER)
        q = put_varint(q, zigzag((uint64_t)ch->sender - pv->sender));
    if (f & CF_SHARD)
        q = put_varint(q, zigzag((uint64_t)ch->shard - pv->shard));
    if (f & CF_DTYPE)
        *q++ = (uint8_t)ch->dtype;
    if (f & CF_RULE)
        q = put_varint(q, ch->rule);
    if (f & CF_ROWS)
        q = put_varint(q, zigzag(ch->src.rows - pv->src.rows));
    if (f & CF_COLS)
        q = put_varint(q, zigzag(ch->src.cols - pv->src.cols));
    if (f & CF_PITCH)
        q = put_varint(q, zigzag(ch->src.pitch - ch->src.cols));
    if (f & CF_OFF)
        q = put_varint(q, zigzag(ch->src.off - off_pred));
    if (f & CF_BUCKET)
        q = put_varint(q, zigzag((uint64_t)ch->bucket - bucket_pred));
    if (f & CF_BOFF)
        q = put_varint(q, zigzag(ch->bucket_off - boff_pred));
    e->used += (size_t)(q - q0);
}

static void encode_literal(encoder_t *e, const eseg_t *sg, const eseg_t *pv)
{
    uint8_t *q0 = enc_room(e), *q = q0 + 1;
    uint8_t f = 0;
    uint64_t off_pred = eseg_next(e->p, pv);

    if (sg->target != pv->target) {
        f |= SF_TARGET;
        q = put_varint(q, zigzag((uint64_t)sg->target - pv->target));
    }
    if (sg->piece != pv->piece) {
        f |= SF_PIECE;
        q = put_varint(q, zigzag((uint64_t)sg->piece - pv->piece));
    }
    if (sg->chunk != pv->chunk + 1u) {
        f |= SF_CHUNK;
        q = put_varint(q, zigzag((uint64_t)sg->chunk - pv->chunk - 1u));
    }
    if (sg->pitch != pv->pitch) {
        f |= SF_PITCH;
        q = put_varint(q, zigzag(sg->pitch - pv->pitch));
    }
    if (sg->off != off_pred) {
        f |= SF_OFF;
        q = put_varint(q, zigzag(sg->off - off_pred));
    }
    *q0 = f;
    e->used += (size_t)(q - q0);
}

static void encode_copy(encoder_t *e, uint32_t skip, uint32_t n, uint32_t tdelta)
{
    uint8_t *q0 = enc_room(e), *q = q0 + 1;
    uint8_t f = SF_COPY;

    if (skip > 0) {
        f |= SF_SKIP;
        q = put_varint(q, skip);
    }
    q = put_varint(q, n);
    if (tdelta != 0) {
        f |= SF_TDELTA;
        q = put_varint(q, zigzag((uint64_t)(int64_t)(int32_t)tdelta));
    }
    *q0 = f;
    e->used += (size_t)(q - q0);
}

/* A copy from the reference gives `sg` when all but the receiver and target agree. */
static inline int copies(const eseg_t *sg, const eseg_t *rf, uint32_t tdelta)
{
    return sg->chunk == rf->chunk && sg->piece == rf->piece && sg->target == rf->target + tdelta &&
           sg->off == rf->off && sg->pitch == rf->pitch;
}

/* One receiver's segments cur[0, n) against the reference ref[0, nref) (nref 0: none), both in
 * chunk order: runs that agree are copies, the rest literals. With e NULL nothing is written and
 * only the segments copied are counted (how a reference is chosen). prev: the segment before
 * cur[0] in the plan (a zero segment before the first). Greedy, one pass over both. */
static uint32_t encode_receiver(encoder_t *e, const eseg_t *cur, uint32_t n,
                                const eseg_t *ref, uint32_t nref,
                                const eseg_t *prev)
{
    uint32_t j = 0, skip = 0, run = 0, tdelta = 0, copied = 0;

    for (uint32_t i = 0; i < n; i++) {
        const eseg_t *sg = &cur[i];
        uint32_t k;
        if (run > 0 && j < nref && copies(sg, &ref[j], tdelta)) {
            run++;
            j++;
            continue;
        }
        if (run > 0) {
            if (e != NULL)
                encode_copy(e, skip, run, tdelta);
            copied += run;
            skip = 0;
            run = 0;
        }
        for (k = j; k < nref && ref[k].chunk < sg->chunk; k++)
            ;
        skip += k - j;
        j = k;
        if (j < nref && copies(sg, &ref[j], sg->target - ref[j].target)) {
            tdelta = sg->target - ref[j].target;
            run = 1;
            j++;
        } else if (e != NULL) {
            encode_literal(e, sg, i > 0 ? &cur[i - 1] : prev);
        }
    }
    if (run > 0) {
        if (e != NULL)
            encode_copy(e, skip, run, tdelta);
        copied += run;
    }
    return copied;
}

/* Where the encoder reads receivers' segments: a flat array in (receiver, chunk) order (tests
 * hand one over), or the plan's lists, each receiver expanded once in rank order. The 8
 * receivers before the current one stay expanded (replicas 1-8 apart are the usual reference),
 * and every receiver's first PREFIX segments are kept to choose references among (the choice
 * reads no more); a reference further back is expanded again. */
#define RING 9u
#define PREFIX (4u * REF_TRIES + 64u)

typedef struct {
    const wsync_plan_t *p;
    eseg_t *flat;                    /* NULL: the plan's lists; else the given segments as items */
    uint64_t *start;                 /* flat: [nreceivers + 1] where each receiver's begin */
    wsync_expander_t x;
    eseg_t *ring[RING];
    size_t ring_cap[RING];
    uint32_t ring_rcv[RING];
    eseg_t *far;
    size_t far_cap;
    eseg_t *pre;            /* lists: receiver q's first min(n, PREFIX) at pre0[q] */
    uint64_t *pre0;
    /* lists: receivers with the same references (replicas of a whole engine) have the same
     * segments but for the receiver, so the same records whenever their references and the
     * segment before them agree too: coded once, copied after */
    uint32_t *cls;                   /* [nreceivers] the first receiver with r's references */
    uint32_t *twin;                  /* [nreceivers] the last one before r (r: none) */
    uint32_t *back;                  /* [nreceivers] the reference chosen */
    eseg_t *last;           /* [nreceivers] the segment before r's first (coded) */
    eseg_t *tail;           /* [nreceivers] r's last segment */
    uint64_t *rec0;                  /* [nreceivers + 1] r's records at recs.data[rec0[r] ..) */
    wsync_wbuf_t recs;
    encoder_t *side;                 /* codes one receiver's records into recs */
} segsrc_t;

static uint32_t src_count(const segsrc_t *s, uint32_t q)
{
    return s->flat != NULL ? (uint32_t)(s->start[q + 1] - s->start[q]) : s->p->rx_nsegs[q];
}

static const eseg_t *src_prefix(const segsrc_t *s, uint32_t q)
{
    return s->flat != NULL ? s->flat + s->start[q] : s->pre + s->pre0[q];
}

/* Receiver q's segments, whole (NULL when out of memory). */
static const eseg_t *src_full(segsrc_t *s, uint32_t q)
{
    uint32_t n = src_count(s, q), k = q % RING;
    const eseg_t *items;
    eseg_t **b = &s->ring[k];
    size_t *cap = &s->ring_cap[k];

    if (s->flat != NULL)
        return s->flat + s->start[q];
    if (s->ring_rcv[k] == q && s->ring[k] != NULL)
        return s->ring[k];
    if (s->ring_rcv[k] != UINT32_MAX && s->ring_rcv[k] > q) {   /* evicted: expand aside */
        b = &s->far;
        cap = &s->far_cap;
    }
    if (plan_grow((void **)b, cap, n ? n : 1, sizeof(**b)) ||
        wsync_plan_expand_items(s->p, q, &s->x, *b, &items) != WSYNC_OK)
        return NULL;
    if (b == &s->ring[k]) {
        s->ring_rcv[k] = q;
        if (s->pre0[q + 1] > s->pre0[q])
            memcpy(s->pre + s->pre0[q], *b, (size_t)(s->pre0[q + 1] - s->pre0[q]) * sizeof(**b));
    }
    return *b;
}

/* cls[r]: the first receiver whose references equal r's (open addressing on their hash);
 * twin[r]: the last one before r (r itself when none). */
static int find_classes(const wsync_plan_t *p, uint32_t *cls, uint32_t *twin)
{
    size_t cap = 64, nr = p->nreceivers;
    uint32_t *slot;

    while (cap < 2 * nr)
        cap *= 2;
    slot = malloc(cap * sizeof(*slot));
    if (slot == NULL)
        return -1;
    memset(slot, 0xff, cap * sizeof(*slot));
    for (uint32_t r = 0; r < nr; r++) {
        size_t n = p->ref0[r + 1] - p->ref0[r];
        const wsync_plan_ref_t *a = &p->refs[p->ref0[r]];
        size_t h = (size_t)XXH3_64bits(a, n * sizeof(*a)) & (cap - 1);
        cls[r] = r;
        twin[r] = r;
        for (; slot[h] != UINT32_MAX; h = (h + 1) & (cap - 1)) {
            uint32_t q = slot[h];
            if (p->ref0[q + 1] - p->ref0[q] == n &&
                memcmp(&p->refs[p->ref0[q]], a, n * sizeof(*a)) == 0) {
                cls[r] = cls[q];
                twin[r] = q;
                slot[h] = r;         /* the class's latest */
                break;
            }
        }
        if (cls[r] == r)
            slot[h] = r;
    }
    free(slot);
    return 0;
}

static int src_init(segsrc_t *s, const wsync_plan_t *p, const wsync_segment_t *flat,
                    uint64_t nflat)
{
    memset(s, 0, sizeof(*s));
    s->p = p;
    for (uint32_t k = 0; k < RING; k++)
        s->ring_rcv[k] = UINT32_MAX;
    if (flat != NULL) {
        s->start = calloc((size_t)p->nreceivers + 1, sizeof(*s->start));
        s->flat = malloc((size_t)(nflat ? nflat : 1) * sizeof(*s->flat));
        if (s->start == NULL || s->flat == NULL)
            return -1;
        for (uint64_t i = 0; i < nflat; i++) {
            eseg_t *x = &s->flat[i];
            x->chunk = flat[i].chunk;
            x->target = flat[i].target;
            x->piece = flat[i].piece;
            x->pad = 0;
            x->off = flat[i].dst.off;
            x->pitch = flat[i].dst.pitch;
        }
        /* segments are in receiver order: each receiver's run */
        for (uint64_t i = 0; i < nflat; i++)
            if (flat[i].receiver < p->nreceivers)
                s->start[flat[i].receiver + 1]++;
        for (uint32_t r = 0; r < p->nreceivers; r++)
            s->start[r + 1] += s->start[r];
        return 0;
    }
    s->pre0 = calloc((size_t)p->nreceivers + 1, sizeof(*s->pre0));
    s->cls = malloc(((size_t)p->nreceivers + 1) * sizeof(*s->cls));
    s->twin = malloc(((size_t)p->nreceivers + 1) * sizeof(*s->twin));
    s->back = calloc((size_t)p->nreceivers + 1, sizeof(*s->back));
    s->last = calloc((size_t)p->nreceivers + 1, sizeof(*s->last));
    s->tail = calloc((size_t)p->nreceivers + 1, sizeof(*s->tail));
    s->rec0 = calloc((size_t)p->nreceivers + 1, sizeof(*s->rec0));
    s->side = malloc(sizeof(*s->side));
    wsync_wbuf_init(&s->recs);
    if (s->pre0 == NULL || s->cls == NULL || s->back == NULL || s->last == NULL || !s->tail ||
        s->rec0 == NULL || s->side == NULL || s->twin == NULL ||
        find_classes(p, s->cls, s->twin) != 0)
        return -1;
    s->side->b = &s->recs;
    s->side->p = p;
    s->side->h = NULL;
    s->side->count_only = 0;
    s->side->total = 0;
    s->side->used = 0;
    for (uint32_t r = 0; r < p->nreceivers; r++)
        s->pre0[r + 1] = s->pre0[r] + WSYNC_MIN(p->rx_nsegs[r], PREFIX);
    s->pre = malloc((size_t)(s->pre0[p->nreceivers] ? s->pre0[p->nreceivers] : 1) *
                    sizeof(*s->pre));
    return s->pre == NULL ? -1 : 0;
}

static void src_free(segsrc_t *s)
{
    free(s->cls);
    free(s->twin);
    free(s->back);
    free(s->last);
    free(s->tail);
    free(s->rec0);
    free(s->side);
    wsync_wbuf_free(&s->recs);
    for (uint32_t k = 0; k < RING; k++)
        free(s->ring[k]);
    free(s->far);
    free(s->pre);
    free(s->pre0);
    free(s->start);
    free(s->flat);
    wsync_expander_free(&s->x);
}

/* The receiver `back` ranks before r whose segments most of r's first REF_TRIES copy (0: none
 * helps). Tried: the 8 receivers just before, then 16, 32, 64 ... before (replicas of an engine
 * of TP or EP size T are T apart). */
static uint32_t choose_reference(const segsrc_t *s, const eseg_t *cur, uint32_t ncur,
                                 uint32_t r)
{
    uint32_t n = WSYNC_MIN(ncur, REF_TRIES), best = 0, best_copied = 0;

    for (uint32_t back = 1; back <= r; back = back < 8 ? back + 1 : back * 2) {
        uint32_t q = r - back, nref = src_count(s, q);
        uint32_t c = nref == 0 ? 0 : encode_receiver(NULL, cur, n, src_prefix(s, q),
                                                     WSYNC_MIN(nref, 4 * n + 64), cur);
        if (c > best_copied) {
            best_copied = c;
            best = back;
        }
    }
    return best;
}

/* The body (everything but the trailing fingerprint) into b, hashed into h when h is given, or
 * only counted when count_only; the segments are the plan's, or flat[0, nflat) when flat is
 * given. Returns the body's bytes (0 with b->err set on failure). */
static uint64_t encode_body(const wsync_plan_t *p, const wsync_segment_t *flat, uint64_t nflat,
                            wsync_wbuf_t *b, XXH3_state_t *h, int count_only)
{
    encoder_t *e = malloc(sizeof(*e));
    segsrc_t src = {0};
    const wsync_chunk_t zc = {0};
    eseg_t last = {0};
    uint64_t total;

    if (e == NULL || src_init(&src, p, flat, nflat) != 0) {
        free(e);
        src_free(&src);
        b->err = 1;
        return 0;
    }
    e->b = b;
    e->p = p;
    e->h = h;
    e->count_only = count_only;
    e->total = 0;
    e->used = 0;
    wsync_put_u32(b, PLAN_MAGIC);
    wsync_put_u16(b, PLAN_VERSION);
    wsync_put_u16(b, p->nrules > 0 ? PLAN_FLAG_RULES : 0);
    wsync_put_u32(b, p->nsenders);
    wsync_put_u32(b, p->nreceivers);
    wsync_put_u64(b, p->bucket_bytes);
    wsync_put_u32(b, p->nchunks);
    wsync_put_u32(b, flat != NULL ? (uint32_t)nflat : p->nsegments);
    if (p->nrules > 0) {
        uint8_t tmp[2 * VARINT_MAX], *q = put_varint(tmp, p->nrules);
        wsync_put_bytes(b, tmp, (size_t)(q - tmp));
        for (uint32_t k = 0; k < p->nrules; k++) {
            const wsync_wire_rule_t *ru = &p->rules[k];
            uint32_t eb;
            wsync_put_u8(b, (uint8_t)ru->fp8_dtype);
            wsync_put_u8(b, (uint8_t)ru->scheme);
            q = put_varint(tmp, (uint64_t)(uint32_t)ru->block_rows);
            q = put_varint(q, (uint64_t)(uint32_t)ru->block_cols);
            wsync_put_bytes(b, tmp, (size_t)(q - tmp));
            memcpy(&eb, &ru->eps, 4);
            wsync_put_u32(b, eb);
            wsync_put_u8(b, (uint8_t)((ru->ue8m0 ? 1u : 0u) | (ru->no_saturate ? 2u : 0u)));
        }
    }
    enc_flush(e);
    for (uint32_t i = 0; i < p->nchunks; i++)
        encode_chunk(e, &p->chunks[i], i > 0 ? &p->chunks[i - 1] : &zc);
    for (uint32_t r = 0; r < p->nreceivers && !b->err; r++) {
        uint32_t n = src_count(&src, r), back, t = flat == NULL ? src.twin[r] : r;
        const eseg_t *cur, *ref = NULL;
        uint8_t *q0 = enc_room(e), *q = put_varint(q0, n);
        if (n == 0) {
            e->used += (size_t)(q - q0);
            if (flat == NULL)
                src.rec0[r + 1] = src.rec0[r];
            continue;
        }
        if (t != r) {
            /* r's segments are t's: its first ones (to choose a reference) copied from t's */
            memcpy(src.pre + src.pre0[r], src.pre + src.pre0[t],
                   (size_t)(src.pre0[r + 1] - src.pre0[r]) * sizeof(*src.pre));
            cur = src.pre + src.pre0[r];
        } else if ((cur = src_full(&src, r)) == NULL) {
            b->err = 1;
            break;
        }
        back = choose_reference(&src, cur, n, r);
        q = put_varint(q, back);
        e->used += (size_t)(q - q0);
        if (t != r && back == src.back[t] &&
            (back == 0 || src.cls[r - back] == src.cls[t - back]) &&
            copies(&last, &src.last[t], 0)) {
            /* the same records as t's: its references alike and the segment before alike */
            uint64_t at = src.recs.len, len = src.rec0[t + 1] - src.rec0[t];
            src.back[r] = back;
            src.last[r] = last;
            wsync_put_bytes(&src.recs, src.recs.data + src.rec0[t], (size_t)len);
            if (src.recs.err) {
                b->err = 1;
                break;
            }
            enc_bytes(e, src.recs.data + at, (size_t)len);
            src.rec0[r + 1] = src.recs.len;
            src.tail[r] = src.tail[t];
            last = src.tail[t];
            continue;
        }
        if (t != r && (cur = src_full(&src, r)) == NULL) {
            b->err = 1;
            break;
        }
        if (back && (ref = src_full(&src, r - back)) == NULL) {
            b->err = 1;
            break;
        }
        if (flat == NULL) {
            /* coded aside and kept, for a later receiver with the same references */
            src.back[r] = back;
            src.last[r] = last;
            encode_receiver(src.side, cur, n, ref, back ? src_count(&src, r - back) : 0, &last);
            enc_flush(src.side);
            if (src.recs.err) {
                b->err = 1;
                break;
            }
            src.rec0[r + 1] = src.recs.len;
            enc_bytes(e, src.recs.data + src.rec0[r], (size_t)(src.rec0[r + 1] - src.rec0[r]));
            src.tail[r] = cur[n - 1];
        } else {
            encode_receiver(e, cur, n, ref, back ? src_count(&src, r - back) : 0, &last);
        }
        last = cur[n - 1];
    }
    enc_flush(e);
    total = e->total;
    free(e);
    src_free(&src);
    return b->err ? 0 : total;
}

uint64_t wsync_plan_wire_bytes(const wsync_plan_t *plan)
{
    wsync_wbuf_t b;
    uint64_t n;

    if (plan->wire_bytes != 0)
        return plan->wire_bytes;
    wsync_wbuf_init(&b);
    n = encode_body(plan, NULL, 0, &b, NULL, 1);
    wsync_wbuf_free(&b);
    return n == 0 ? UINT64_MAX : n + 8u;         /* the fingerprint */
}

void wsync_plan_encode(const wsync_plan_t *plan, wsync_wbuf_t *out)
{
    size_t start = out->len;

    encode_body(plan, NULL, 0, out, NULL, 0);
    if (!out->err)   /* hash what was written, so the fingerprint always matches the bytes */
        wsync_put_u64(out, XXH3_64bits(out->data + start, out->len - start));
}

void wsync_plan_encode_flat(const wsync_plan_t *plan, const wsync_segment_t *segs, uint32_t n,
                            wsync_wbuf_t *out)
{
    size_t start = out->len;
    static const wsync_segment_t none = {0};

    encode_body(plan, n > 0 ? segs : &none, n, out, NULL, 0);
    if (!out->err)
        wsync_put_u64(out, XXH3_64bits(out->data + start, out->len - start));
}

wsync_status_t wsync_plan_fingerprint(wsync_plan_t *plan)
{
    wsync_wbuf_t body;
    XXH3_state_t *hs = XXH3_createState();
    uint64_t n;

    wsync_wbuf_init(&body);
    if (hs == NULL || XXH3_64bits_reset(hs) != XXH_OK) {
        XXH3_freeState(hs);      /* NULL is a no-op */
        wsync_wbuf_free(&body);
        return wsync_err(WSYNC_ERR_NOMEM, "plan: hash state");
    }
    n = encode_body(plan, NULL, 0, &body, hs, 0);
    if (body.err) {
        XXH3_freeState(hs);
        wsync_wbuf_free(&body);
        return wsync_err(WSYNC_ERR_NOMEM, "plan: encoding for the fingerprint");
    }
    plan->fingerprint = XXH3_64bits_digest(hs);
    plan->wire_bytes = n + 8u;
    XXH3_freeState(hs);
    wsync_wbuf_free(&body);
    return WSYNC_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Decoding: everything from the wire is checked before it is used                              */
/* ------------------------------------------------------------------------------------------ */

/* A varint of at most 64 bits; sets r->err when truncated or longer. */
static uint64_t get_varint(wsync_rbuf_t *r)
{
    uint64_t v = 0;

    for (unsigned shift = 0; shift < 64; shift += 7) {
        uint8_t c;
        if (r->err || r->p >= r->end) {
            r->err = 1;
            return 0;
        }
        c = *r->p++;
        if (shift == 63 && c > 1)
            break;
        v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80))
            return v;
    }
    r->err = 1;
    return 0;
}

static int wire_source_dtype(wsync_dtype_t dt)
{
    return dt == WSYNC_DTYPE_BF16 || dt == WSYNC_DTYPE_F16 || dt == WSYNC_DTYPE_F32;
}

/* The FP8 rule table (PLAN_FLAG_RULES): at least one rule, each one the compiler could make. */
static wsync_status_t decode_rules(wsync_rbuf_t *r, wsync_plan_t *p)
{
    uint64_t n = get_varint(r);

    if (r->err || n == 0 || n > PLAN_MAX_RULES || n > wsync_rbuf_left(r) / 8u)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: %" PRIu64 " FP8 rules (1 to %u, 8 bytes or "
                         "more each)", n, PLAN_MAX_RULES);
    p->rules = calloc((size_t)n, sizeof(*p->rules));
    if (p->rules == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "plan decode: %" PRIu64 " rules", n);
    p->nrules = (uint32_t)n;
    for (uint32_t k = 0; k < p->nrules; k++) {
        wsync_wire_rule_t *ru = &p->rules[k];
        uint8_t dt = wsync_get_u8(r), sc = wsync_get_u8(r), fl;
        uint64_t br = get_varint(r), bc = get_varint(r);
        uint32_t eb = wsync_get_u32(r);
        int ok;
        fl = wsync_get_u8(r);
        memcpy(&ru->eps, &eb, 4);
        ru->fp8_dtype = (wsync_dtype_t)dt;
        ru->scheme = (wsync_quant_scheme_t)sc;
        ru->block_rows = (int32_t)WSYNC_MIN(br, (uint64_t)INT32_MAX);
        ru->block_cols = (int32_t)WSYNC_MIN(bc, (uint64_t)INT32_MAX);
        ru->ue8m0 = fl & 1u;
        ru->no_saturate = (fl >> 1) & 1u;
        ok = !r->err && fl <= 3u &&
             (ru->fp8_dtype == WSYNC_DTYPE_F8E4M3FN || ru->fp8_dtype == WSYNC_DTYPE_F8E5M2);
        if (ok && ru->scheme == WSYNC_QUANT_BLOCK)
            ok = br >= 1 && br <= INT32_MAX && bc >= 1 && bc <= INT32_MAX && ru->eps > 0.0f &&
                 ru->eps < INFINITY;
        else if (ok)
            ok = (ru->scheme == WSYNC_QUANT_CHANNEL || ru->scheme == WSYNC_QUANT_TENSOR) &&
                 br == 0 && bc == 0 && eb == 0 && !ru->ue8m0;
        if (!ok)
            return wsync_err(WSYNC_ERR_PROTOCOL, "plan: FP8 rule %u is malformed (dtype %u, "
                             "scheme %u, blocks %" PRIu64 " x %" PRIu64 ", flags %u)", k + 1, dt,
                             sc, br, bc, fl);
        for (uint32_t j = 0; j < k; j++)
            if (wsync_wire_rule_eq(&p->rules[j], ru))
                return wsync_err(WSYNC_ERR_PROTOCOL, "plan: FP8 rules %u and %u are the same",
                                 j + 1, k + 1);
    }
    return WSYNC_OK;
}

static wsync_status_t decode_chunk(wsync_rbuf_t *r, const wsync_plan_t *p, uint32_t i)
{
    static const wsync_chunk_t zc = {0};
    wsync_chunk_t *ch = &p->chunks[i];
    const wsync_chunk_t *pv = i > 0 ? &p->chunks[i - 1] : &zc;
    uint64_t f = get_varint(r), esz, bytes;
    uint8_t dt = (uint8_t)pv->dtype;

    if (!r->err && ((f & ~(uint64_t)CF_ALL) != 0 || ((f & CF_SHARD_NEXT) && (f & CF_SHARD))))
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: chunk %u has unknown flags 0x%" PRIx64, i, f);
    ch->sender = pv->sender + (f & CF_SENDER ? (uint32_t)unzigzag(get_varint(r)) : 0u);
    ch->shard = pv->shard + (f & CF_SHARD_NEXT ? 1u : 0u) +
                (f & CF_SHARD ? (uint32_t)unzigzag(get_varint(r)) : 0u);
    if (f & CF_DTYPE)
        dt = wsync_get_u8(r);
    ch->dtype = (wsync_dtype_t)dt;
    ch->rule = pv->rule;
    if (f & CF_RULE) {
        uint64_t rule = get_varint(r);   /* read once: WSYNC_MIN evaluates its arguments twice */
        ch->rule = (uint32_t)WSYNC_MIN(rule, (uint64_t)UINT32_MAX);
    }
    ch->src.rows = pv->src.rows + (f & CF_ROWS ? unzigzag(get_varint(r)) : 0);
    ch->src.cols = pv->src.cols + (f & CF_COLS ? unzigzag(get_varint(r)) : 0);
    ch->src.pitch = ch->src.cols + (f & CF_PITCH ? unzigzag(get_varint(r)) : 0);
    ch->src.off = chunk_off_pred(pv, ch->shard) + (f & CF_OFF ? unzigzag(get_varint(r)) : 0);
    ch->bucket = (ch->sender == pv->sender ? pv->bucket : 0u) +
                 (f & CF_BUCKET ? (uint32_t)unzigzag(get_varint(r)) : 0u);
    ch->bucket_off = chunk_boff_pred(pv, ch->sender, ch->bucket) +
                     (f & CF_BOFF ? unzigzag(get_varint(r)) : 0);
    if (r->err)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: truncated at chunk %u", i);
    if (ch->sender >= p->nsenders)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: chunk %u names sender %u of %u", i,
                         ch->sender, p->nsenders);
    esz = wsync_dtype_size(ch->dtype);
    if (esz == 0)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: chunk %u has unknown dtype %u", i, dt);
    if (!region_sane(&ch->src))
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: chunk %u has a malformed region (%" PRIu64
                         " x %" PRIu64 ", pitch %" PRIu64 ")", i, ch->src.rows, ch->src.cols,
                         ch->src.pitch);
    if (ch->rule > p->nrules || (ch->rule != 0 && !wire_source_dtype(ch->dtype)))
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: chunk %u (%s) names FP8 rule %u of %u", i,
                         wsync_dtype_name(ch->dtype), ch->rule, p->nrules);
    ch->ncells = 0;
    if (ch->rule != 0) {
        uint64_t cr, cc;
        if (wsync_mul_u64(ch->src.rows, ch->src.cols, &bytes) || bytes > p->bucket_bytes)
            return wsync_err(WSYNC_ERR_PROTOCOL, "plan: chunk %u (%" PRIu64 " x %" PRIu64
                             " FP8) is larger than a bucket", i, ch->src.rows, ch->src.cols);
        wsync_wire_cells(&p->rules[ch->rule - 1], ch->src.rows, ch->src.cols, &cr, &cc);
        if (cr * cc > UINT32_MAX)
            return wsync_err(WSYNC_ERR_PROTOCOL, "plan: chunk %u has %" PRIu64 " FP8 cells", i,
                             cr * cc);
        ch->ncells = (uint32_t)(cr * cc);
        esz = 1;
    }
    if (wsync_mul_u64(ch->src.rows, ch->src.cols, &bytes) || wsync_mul_u64(bytes, esz, &bytes) ||
        (ch->rule != 0 && (bytes = chunk_bytes(ch)) == 0) ||
        bytes > p->bucket_bytes || ch->bucket_off % WSYNC_PLAN_ALIGN != 0 ||
        ch->bucket_off > p->bucket_bytes - bytes)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: chunk %u (%" PRIu64 " x %" PRIu64 " %s at "
                         "offset %" PRIu64 ") does not fit a %" PRIu64 "-byte bucket at a %u-byte "
                         "aligned offset", i, ch->src.rows, ch->src.cols,
                         wsync_dtype_name(ch->dtype), ch->bucket_off, p->bucket_bytes,
                         WSYNC_PLAN_ALIGN);
    if (i == 0 || ch->sender != p->chunks[i - 1].sender) {
        if ((i > 0 && ch->sender < p->chunks[i - 1].sender) || ch->bucket != 0)
            return wsync_err(WSYNC_ERR_PROTOCOL, "plan: chunk %u out of order (sender %u, bucket "
                             "%u)", i, ch->sender, ch->bucket);
    } else {
        int same = ch->bucket == pv->bucket && ch->bucket_off >= pv->bucket_off + chunk_bytes(pv);
        if (!same && ch->bucket != pv->bucket + 1)
            return wsync_err(WSYNC_ERR_PROTOCOL, "plan: chunk %u (sender %u, bucket %u, offset "
                             "%" PRIu64 ") is out of order or overlaps the one before", i,
                             ch->sender, ch->bucket, ch->bucket_off);
    }
    return WSYNC_OK;
}

/* What every segment must satisfy, however it was coded: its chunk exists, its region matches
 * the chunk's shape and is sane, and (receiver, chunk) order holds after pv (the segment before
 * it in the plan, NULL for the first). sg->receiver is set. */
static wsync_status_t check_segment(const wsync_plan_t *p, wsync_segment_t *sg,
                                    const wsync_segment_t *pv, uint64_t i)
{
    const wsync_chunk_t *ch;

    if (sg->chunk >= p->nchunks)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: segment %" PRIu64 " names receiver %u of %u, "
                         "chunk %u of %u", i, sg->receiver, p->nreceivers, sg->chunk, p->nchunks);
    ch = &p->chunks[sg->chunk];
    sg->dst.rows = ch->src.rows;
    sg->dst.cols = ch->src.cols;
    if (!region_sane(&sg->dst))
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: segment %" PRIu64 " (%" PRIu64 " x %" PRIu64
                         ", pitch %" PRIu64 ", offset %" PRIu64 ") does not match chunk %u (%"
                         PRIu64 " x %" PRIu64 ")", i, sg->dst.rows, sg->dst.cols, sg->dst.pitch,
                         sg->dst.off, sg->chunk, ch->src.rows, ch->src.cols);
    if (pv != NULL && cmp_rank_index(pv->receiver, pv->chunk, sg->receiver, sg->chunk) > 0)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: segment %" PRIu64 " out of order "
                         "(receiver %u, chunk %u after chunk %u)", i, sg->receiver,
                         sg->chunk, pv->chunk);
    return WSYNC_OK;
}

/* Segments are decoded receiver by receiver into one receiver's array (grown as the records
 * produce them: a copy makes many from a few bytes, so the header's count is never allocated
 * on trust), then kept as lists. Copies read their reference from the 8 receivers decoded
 * just before (kept) or from its lists. */
typedef struct {
    wsync_plan_t *p;
    uint64_t n;                      /* segments decoded so far, all receivers */
    wsync_segment_t *cur;            /* this receiver's */
    size_t ncur, cap;
    wsync_segment_t last;            /* the segment before cur[0] in the plan (zero: none) */
    int have_last;
    wsync_segment_t *ring[RING];
    size_t ring_cap[RING], ring_n[RING];
    uint32_t ring_rcv[RING];
    wsync_segment_t *far;
    size_t far_cap;
    wsync_expander_t x;
    wsync_lists_builder_t lb;
} seg_out_t;

static wsync_status_t seg_reserve(seg_out_t *o, uint64_t more)
{
    if (o->n + more > o->p->nsegments)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: more segments than the %u in the header",
                         o->p->nsegments);
    if (o->ncur + more > WSYNC_PLAN_MAX_SEGMENTS)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: a receiver of more than %u segments",
                         WSYNC_PLAN_MAX_SEGMENTS);
    if (plan_grow((void **)&o->cur, &o->cap, o->ncur + (size_t)more, sizeof(*o->cur)))
        return wsync_err(WSYNC_ERR_NOMEM, "plan decode: %zu segments", o->ncur + (size_t)more);
    return WSYNC_OK;
}

static const wsync_segment_t *seg_prev(const seg_out_t *o)
{
    return o->ncur > 0 ? &o->cur[o->ncur - 1] : o->have_last ? &o->last : NULL;
}

static wsync_status_t decode_literal(wsync_rbuf_t *r, seg_out_t *o, uint32_t rcv, uint8_t f)
{
    static const wsync_segment_t zs = {0};
    wsync_plan_t *p = o->p;
    const wsync_segment_t *pv = seg_prev(o) != NULL ? seg_prev(o) : &zs;
    wsync_segment_t *sg = &o->cur[o->ncur];
    wsync_status_t st;

    if (f & ~SF_LITERAL_ALL)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: segment %" PRIu64 " has unknown flags 0x%x",
                         o->n, f);
    sg->receiver = rcv;
    sg->target = pv->target + (f & SF_TARGET ? (uint32_t)unzigzag(get_varint(r)) : 0u);
    sg->piece = pv->piece + (f & SF_PIECE ? (uint32_t)unzigzag(get_varint(r)) : 0u);
    sg->chunk = pv->chunk + 1u + (f & SF_CHUNK ? (uint32_t)unzigzag(get_varint(r)) : 0u);
    sg->dst.pitch = pv->dst.pitch + (f & SF_PITCH ? unzigzag(get_varint(r)) : 0);
    sg->dst.off = region_next(&pv->dst) + (f & SF_OFF ? unzigzag(get_varint(r)) : 0);
    if (r->err)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: truncated at segment %" PRIu64, o->n);
    if ((st = check_segment(p, sg, seg_prev(o), o->n)) != WSYNC_OK)
        return st;
    o->n++;
    o->ncur++;
    return WSYNC_OK;
}

static wsync_status_t decode_copy(wsync_rbuf_t *r, seg_out_t *o, uint32_t rcv, uint8_t f,
                                  const wsync_segment_t *ref, uint64_t nref, uint64_t *j,
                                  uint64_t left)
{
    wsync_plan_t *p = o->p;
    uint64_t skip, n, tdelta = 0;
    wsync_status_t st;

    if (f & ~SF_COPY_ALL)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: segment %" PRIu64 " has unknown flags 0x%x",
                         o->n, f);
    skip = f & SF_SKIP ? get_varint(r) : 0;
    n = get_varint(r);
    if (f & SF_TDELTA)
        tdelta = unzigzag(get_varint(r));
    if (r->err)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: truncated at segment %" PRIu64, o->n);
    if (n == 0 || n > left || skip > nref - *j || n > nref - *j - skip)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: segment %" PRIu64 ": a copy of %" PRIu64
                         " after skipping %" PRIu64 " at %" PRIu64 " of the reference's %" PRIu64
                         ", with %" PRIu64 " segments left to this receiver", o->n, n, skip, *j,
                         nref, left);
    if ((st = seg_reserve(o, n)) != WSYNC_OK)
        return st;
    *j += skip;
    for (uint64_t k = 0; k < n; k++, (*j)++) {
        wsync_segment_t *sg = &o->cur[o->ncur];
        *sg = ref[*j];
        sg->receiver = rcv;
        sg->target += (uint32_t)tdelta;
        if ((st = check_segment(p, sg, seg_prev(o), o->n)) != WSYNC_OK)
            return st;
        o->n++;
        o->ncur++;
    }
    return WSYNC_OK;
}

/* Receiver q's segments, decoded earlier: kept if among the last RING, else from its lists. */
static const wsync_segment_t *decoded_ref(seg_out_t *o, uint32_t q, uint64_t *nref,
                                          wsync_status_t *st)
{
    uint32_t k = q % RING;

    if (o->ring_rcv[k] == q) {
        *nref = o->ring_n[k];
        return o->ring[k];
    }
    /* rx_nsegs is not derived yet: count q's lists */
    {
        wsync_plan_t *p = o->p;
        uint64_t m = 0;
        for (uint32_t i = p->ref0[q]; i < p->ref0[q + 1]; i++)
            m += p->list0[p->refs[i].list + 1] - p->list0[p->refs[i].list];
        p->rx_nsegs[q] = (uint32_t)m;
        if (plan_grow((void **)&o->far, &o->far_cap, m ? m : 1, sizeof(*o->far))) {
            *st = wsync_err(WSYNC_ERR_NOMEM, "plan decode: %" PRIu64 " segments", m);
            return NULL;
        }
        if ((*st = wsync_plan_expand(p, q, &o->x, o->far)) != WSYNC_OK)
            return NULL;
        *nref = m;
        return o->far;
    }
}

/* Every receiver's segments, kept as lists. */
static wsync_status_t decode_segments(wsync_rbuf_t *r, wsync_plan_t *p)
{
    seg_out_t o;
    wsync_status_t st;

    memset(&o, 0, sizeof(o));
    o.p = p;
    for (uint32_t k = 0; k < RING; k++)
        o.ring_rcv[k] = UINT32_MAX;
    p->rx_nsegs = calloc(p->nreceivers + (size_t)1, sizeof(*p->rx_nsegs));
    if (p->rx_nsegs == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan decode: %u receivers", p->nreceivers);
        goto out;
    }
    if ((st = wsync_lists_begin(&o.lb, p, WSYNC_ERR_PROTOCOL)) != WSYNC_OK)
        goto out;
    for (uint32_t rcv = 0; rcv < p->nreceivers; rcv++) {
        uint64_t n = get_varint(r), back = 0, nref = 0, j = 0;
        const wsync_segment_t *ref = NULL;
        uint32_t k = rcv % RING;
        wsync_segment_t *t;
        size_t tc;
        o.ncur = 0;
        if (!r->err && n > 0)
            back = get_varint(r);
        if (r->err) {
            st = wsync_err(WSYNC_ERR_PROTOCOL, "plan: truncated at receiver %u's segments", rcv);
            goto out;
        }
        if (n > p->nsegments - o.n || back > rcv) {
            st = wsync_err(WSYNC_ERR_PROTOCOL, "plan: receiver %u has %" PRIu64 " segments "
                           "(%" PRIu64 " of %u left) and reference %" PRIu64 " back", rcv, n,
                           p->nsegments - o.n, p->nsegments, back);
            goto out;
        }
        if (back > 0 && (ref = decoded_ref(&o, rcv - (uint32_t)back, &nref, &st)) == NULL &&
            st != WSYNC_OK)
            goto out;
        while (o.ncur < n) {
            uint8_t f = wsync_get_u8(r);
            if (r->err) {
                st = wsync_err(WSYNC_ERR_PROTOCOL, "plan: truncated at segment %" PRIu64, o.n);
                goto out;
            }
            if (f & SF_COPY)
                st = decode_copy(r, &o, rcv, f, ref, nref, &j, n - o.ncur);
            else if ((st = seg_reserve(&o, 1)) == WSYNC_OK)
                st = decode_literal(r, &o, rcv, f);
            if (st != WSYNC_OK)
                goto out;
        }
        if ((st = wsync_lists_add(&o.lb, rcv, o.cur, o.ncur)) != WSYNC_OK)
            goto out;
        if (o.ncur > 0) {
            o.last = o.cur[o.ncur - 1];
            o.have_last = 1;
        }
        /* keep this receiver's segments for the next ones' copies: swap buffers with its slot */
        t = o.ring[k];
        tc = o.ring_cap[k];
        o.ring[k] = o.cur;
        o.ring_cap[k] = o.cap;
        o.ring_n[k] = o.ncur;
        o.ring_rcv[k] = rcv;
        o.cur = t;
        o.cap = tc;
    }
    if (o.n != p->nsegments) {
        st = wsync_err(WSYNC_ERR_PROTOCOL, "plan: %" PRIu64 " segments, the header says %u",
                       o.n, p->nsegments);
        goto out;
    }
    st = wsync_lists_end(&o.lb);
out:
    for (uint32_t k = 0; k < RING; k++)
        free(o.ring[k]);
    free(o.cur);
    free(o.far);
    wsync_expander_free(&o.x);
    wsync_lists_builder_free(&o.lb);
    return st;
}

wsync_status_t wsync_plan_decode(const void *data, size_t len, wsync_plan_t **plan)
{
    wsync_rbuf_t r;
    wsync_plan_t *p;
    wsync_status_t st;
    uint32_t magic, version, flags;
    size_t body_len;
    uint64_t fp;

    if (plan == NULL || (data == NULL && len > 0))
        return wsync_err(WSYNC_ERR_INVALID, "plan decode: NULL argument");
    if (len == 0)                     /* also keeps NULL + 0 out of the reader */
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: empty message");
    wsync_rbuf_init(&r, data, len);
    magic = wsync_get_u32(&r);
    version = wsync_get_u16(&r);
    flags = wsync_get_u16(&r);
    if (r.err || magic != PLAN_MAGIC)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: not a plan (bad magic or %zu bytes)", len);
    if (version != PLAN_VERSION || (flags & ~PLAN_FLAG_RULES) != 0)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: version %u flags %u, this library reads "
                         "version %u flags 0 or %u", version, flags, PLAN_VERSION,
                         PLAN_FLAG_RULES);
    /* the whole message is hashed first: a flipped bit is named as such, not as whatever
     * record it happened to garble */
    if (len < PLAN_HEADER_BYTES + 8u)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: truncated header (%zu bytes)", len);
    body_len = len - 8u;
    {
        wsync_rbuf_t t;
        wsync_rbuf_init(&t, (const uint8_t *)data + body_len, 8);
        fp = wsync_get_u64(&t);
    }
    if (fp != XXH3_64bits(data, body_len))
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: fingerprint %016" PRIx64 " does not match the "
                         "content (corrupted or truncated in transit?)", fp);
    wsync_rbuf_init(&r, (const uint8_t *)data + 8, body_len - 8);

    p = calloc(1, sizeof(*p));
    if (p == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "plan decode");
    p->nsenders = wsync_get_u32(&r);
    p->nreceivers = wsync_get_u32(&r);
    p->bucket_bytes = wsync_get_u64(&r);
    if ((st = wsync_plan_check_limits(p->nsenders, p->nreceivers, p->bucket_bytes,
                                      WSYNC_ERR_PROTOCOL)))
        goto fail;
    /* a chunk is at least one byte, a receiver's segment count too */
    p->nchunks = wsync_get_count(&r, 1);
    if (r.err) {
        st = wsync_err(WSYNC_ERR_PROTOCOL, "plan: chunk count larger than the message");
        goto fail;
    }
    p->nsegments = wsync_get_u32(&r);
    if ((flags & PLAN_FLAG_RULES) && (st = decode_rules(&r, p)) != WSYNC_OK)
        goto fail;
    if (p->nchunks > WSYNC_PLAN_MAX_CHUNKS || p->nsegments > WSYNC_PLAN_MAX_LOGICAL_SEGMENTS ||
        p->nreceivers > wsync_rbuf_left(&r)) {
        st = wsync_err(WSYNC_ERR_PROTOCOL, "plan: %u chunks (at most %u), %u segments (at most "
                       "%u), %u receivers in a message of %zu bytes", p->nchunks,
                       WSYNC_PLAN_MAX_CHUNKS, p->nsegments, WSYNC_PLAN_MAX_LOGICAL_SEGMENTS,
                       p->nreceivers, len);
        goto fail;
    }
    p->chunks = calloc(p->nchunks ? p->nchunks : 1, sizeof(*p->chunks));
    if (p->chunks == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan decode: %u chunks", p->nchunks);
        goto fail;
    }
    for (uint32_t i = 0; i < p->nchunks; i++)
        if ((st = decode_chunk(&r, p, i)) != WSYNC_OK)
            goto fail;
    if ((st = decode_segments(&r, p)) != WSYNC_OK)
        goto fail;
    if (wsync_rbuf_left(&r) != 0) {
        st = wsync_err(WSYNC_ERR_PROTOCOL, "plan: %zu trailing bytes after the segments",
                       wsync_rbuf_left(&r));
        goto fail;
    }
    /* the receivers' counts and pair bytes, which the re-encoding below reads */
    if ((st = plan_derive(p)) != WSYNC_OK || (st = wsync_plan_cache_init(p)) != WSYNC_OK)
        goto fail;
    /* one plan, one encoding: the encoder's choices (which fields to predict, copies or
     * literals, which reference) must be the ones made, so that the fingerprint names the
     * plan and what a participant would send on is what it got */
    if ((st = wsync_plan_fingerprint(p)) != WSYNC_OK)
        goto fail;
    if (p->fingerprint != fp || p->wire_bytes != len) {
        st = wsync_err(WSYNC_ERR_PROTOCOL, "plan: not in canonical form (it encodes to %" PRIu64
                       " bytes with fingerprint %016" PRIx64 ", not %zu bytes with %016" PRIx64
                       ")", p->wire_bytes, p->fingerprint, len, fp);
        goto fail;
    }
    *plan = p;
    return WSYNC_OK;
fail:
    wsync_plan_free(p);
    return st;
}
