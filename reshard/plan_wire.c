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
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define PLAN_MAGIC 0x4c505357u          /* "WSPL" */
#define PLAN_VERSION 1u
#define CHUNK_WIRE_BYTES 53u            /* smallest encoded chunk and segment: bounds counts */
#define SEGMENT_WIRE_BYTES 48u

/* ------------------------------------------------------------------------------------------ */
/* Derived tables, encoding, fingerprint                                                        */
/* ------------------------------------------------------------------------------------------ */

/* nbuckets, bucket_used (high-water mark) and pair_bytes from chunks and segments, which must
 * already be ordered by (sender, bucket) with each sender's buckets numbered densely from 0. */
static wsync_status_t plan_derive(wsync_plan_t *p)
{
    uint64_t total = 0, *base;

    p->nbuckets = calloc(p->nsenders, sizeof(*p->nbuckets));
    p->pair_bytes = calloc((size_t)p->nsenders * p->nreceivers, sizeof(*p->pair_bytes));
    base = calloc(p->nsenders, sizeof(*base));
    if (!p->nbuckets || !p->pair_bytes || !base) {
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
    for (uint32_t i = 0; i < p->nsegments; i++) {
        const wsync_segment_t *sg = &p->segments[i];
        const wsync_chunk_t *ch = &p->chunks[sg->chunk];
        p->pair_bytes[(size_t)ch->sender * p->nreceivers + sg->receiver] += chunk_bytes(ch);
    }
    free(base);
    return WSYNC_OK;
}

/* Records are formed in a block of this many bytes and handed on whole: appended to the wire
 * buffer, or, when only the fingerprint is wanted, hashed straight from the block (a plan of
 * millions of chunks is never held encoded, and no call is made per record). */
#define ENCODE_BLOCK ((size_t)64 << 10)

typedef struct {
    wsync_wbuf_t *b;                 /* the wire buffer: the header and counts go here */
    XXH3_state_t *h;                 /* non-NULL: hash the bytes instead of keeping them */
    uint8_t blk[ENCODE_BLOCK];
    size_t used;
} encoder_t;

/* Hand on what the wire buffer and the block hold, in that order (the byte order of the wire). */
static void enc_flush(encoder_t *e)
{
    if (e->h != NULL) {
        if (!e->b->err && e->b->len > 0) {
            XXH3_64bits_update(e->h, e->b->data, e->b->len);
            e->b->len = 0;
        }
        if (e->used > 0)
            XXH3_64bits_update(e->h, e->blk, e->used);
    } else {
        wsync_put_bytes(e->b, e->blk, e->used);
    }
    e->used = 0;
}

/* Little-endian, as the wsync_put_* functions write: a chunk or segment is formed in place in
 * the block (a plan has millions of them). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define HOST_IS_LE 1
#else
#define HOST_IS_LE 0
#endif

static inline uint8_t *le32(uint8_t *q, uint32_t v)
{
    if (HOST_IS_LE) {
        memcpy(q, &v, 4);
    } else {
        for (int i = 0; i < 4; i++)
            q[i] = (uint8_t)(v >> (8 * i));
    }
    return q + 4;
}

static inline uint8_t *le64(uint8_t *q, uint64_t v)
{
    if (HOST_IS_LE) {
        memcpy(q, &v, 8);
    } else {
        for (int i = 0; i < 8; i++)
            q[i] = (uint8_t)(v >> (8 * i));
    }
    return q + 8;
}

static inline uint8_t *le_region(uint8_t *q, const wsync_region_t *r)
{
    q = le64(q, r->off);
    q = le64(q, r->pitch);
    q = le64(q, r->rows);
    return le64(q, r->cols);
}

/* The body (everything but the trailing fingerprint) into b, or hashed into h when h is given. */
static void encode_body(const wsync_plan_t *p, wsync_wbuf_t *b, XXH3_state_t *h)
{
    encoder_t *e = malloc(sizeof(*e));

    if (e == NULL) {
        b->err = 1;
        return;
    }
    e->b = b;
    e->h = h;
    e->used = 0;
    wsync_put_u32(b, PLAN_MAGIC);
    wsync_put_u16(b, PLAN_VERSION);
    wsync_put_u16(b, 0);                          /* flags */
    wsync_put_u32(b, p->nsenders);
    wsync_put_u32(b, p->nreceivers);
    wsync_put_u64(b, p->bucket_bytes);
    wsync_put_u32(b, p->nchunks);
    enc_flush(e);
    for (uint32_t i = 0; i < p->nchunks; i++) {
        const wsync_chunk_t *ch = &p->chunks[i];
        uint8_t *q;
        if (e->used + CHUNK_WIRE_BYTES > ENCODE_BLOCK)
            enc_flush(e);
        q = e->blk + e->used;
        q = le32(q, ch->sender);
        q = le32(q, ch->shard);
        *q++ = (uint8_t)ch->dtype;
        q = le_region(q, &ch->src);
        q = le32(q, ch->bucket);
        q = le64(q, ch->bucket_off);
        e->used += CHUNK_WIRE_BYTES;
    }
    enc_flush(e);
    wsync_put_u32(b, p->nsegments);
    enc_flush(e);
    for (uint32_t i = 0; i < p->nsegments; i++) {
        const wsync_segment_t *sg = &p->segments[i];
        uint8_t *q;
        if (e->used + SEGMENT_WIRE_BYTES > ENCODE_BLOCK)
            enc_flush(e);
        q = e->blk + e->used;
        q = le32(q, sg->receiver);
        q = le32(q, sg->target);
        q = le32(q, sg->piece);
        q = le32(q, sg->chunk);
        q = le_region(q, &sg->dst);
        e->used += SEGMENT_WIRE_BYTES;
    }
    enc_flush(e);
    free(e);
}

uint64_t wsync_plan_wire_bytes(const wsync_plan_t *plan)
{
    /* magic, version, flags, senders, receivers, bucket, chunk count; segment count;
     * fingerprint */
    return 28u + (uint64_t)CHUNK_WIRE_BYTES * plan->nchunks + 4u +
           (uint64_t)SEGMENT_WIRE_BYTES * plan->nsegments + 8u;
}

void wsync_plan_encode(const wsync_plan_t *plan, wsync_wbuf_t *out)
{
    size_t start = out->len;

    encode_body(plan, out, NULL);
    if (!out->err)   /* hash what was written, so the fingerprint always matches the bytes */
        wsync_put_u64(out, XXH3_64bits(out->data + start, out->len - start));
}

wsync_status_t wsync_plan_fingerprint(wsync_plan_t *plan)
{
    wsync_wbuf_t body;
    XXH3_state_t *hs = XXH3_createState();

    wsync_wbuf_init(&body);
    if (hs == NULL || XXH3_64bits_reset(hs) != XXH_OK) {
        XXH3_freeState(hs);      /* NULL is a no-op */
        wsync_wbuf_free(&body);
        return wsync_err(WSYNC_ERR_NOMEM, "plan: hash state");
    }
    encode_body(plan, &body, hs);
    if (body.err) {
        XXH3_freeState(hs);
        wsync_wbuf_free(&body);
        return wsync_err(WSYNC_ERR_NOMEM, "plan: encoding for the fingerprint");
    }
    plan->fingerprint = XXH3_64bits_digest(hs);
    XXH3_freeState(hs);
    wsync_wbuf_free(&body);
    return WSYNC_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Decoding: everything from the wire is checked before it is used                              */
/* ------------------------------------------------------------------------------------------ */

static void get_region(wsync_rbuf_t *r, wsync_region_t *g)
{
    g->off = wsync_get_u64(r);
    g->pitch = wsync_get_u64(r);
    g->rows = wsync_get_u64(r);
    g->cols = wsync_get_u64(r);
}

static wsync_status_t decode_chunk(wsync_rbuf_t *r, const wsync_plan_t *p, uint32_t i)
{
    wsync_chunk_t *ch = &p->chunks[i];
    uint8_t dt;
    uint64_t esz, bytes;

    ch->sender = wsync_get_u32(r);
    ch->shard = wsync_get_u32(r);
    dt = wsync_get_u8(r);
    ch->dtype = (wsync_dtype_t)dt;
    get_region(r, &ch->src);
    ch->bucket = wsync_get_u32(r);
    ch->bucket_off = wsync_get_u64(r);
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
    if (wsync_mul_u64(ch->src.rows, ch->src.cols, &bytes) || wsync_mul_u64(bytes, esz, &bytes) ||
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
        const wsync_chunk_t *pv = &p->chunks[i - 1];
        int same = ch->bucket == pv->bucket && ch->bucket_off >= pv->bucket_off + chunk_bytes(pv);
        if (!same && ch->bucket != pv->bucket + 1)
            return wsync_err(WSYNC_ERR_PROTOCOL, "plan: chunk %u (sender %u, bucket %u, offset "
                             "%" PRIu64 ") is out of order or overlaps the one before", i,
                             ch->sender, ch->bucket, ch->bucket_off);
    }
    return WSYNC_OK;
}

static wsync_status_t decode_segment(wsync_rbuf_t *r, const wsync_plan_t *p, uint32_t i)
{
    wsync_segment_t *sg = &p->segments[i];
    const wsync_chunk_t *ch;

    sg->receiver = wsync_get_u32(r);
    sg->target = wsync_get_u32(r);
    sg->piece = wsync_get_u32(r);
    sg->chunk = wsync_get_u32(r);
    get_region(r, &sg->dst);
    if (r->err)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: truncated at segment %u", i);
    if (sg->receiver >= p->nreceivers || sg->chunk >= p->nchunks)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: segment %u names receiver %u of %u, chunk %u "
                         "of %u", i, sg->receiver, p->nreceivers, sg->chunk, p->nchunks);
    ch = &p->chunks[sg->chunk];
    if (sg->dst.rows != ch->src.rows || sg->dst.cols != ch->src.cols || !region_sane(&sg->dst))
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: segment %u (%" PRIu64 " x %" PRIu64 ", pitch "
                         "%" PRIu64 ") does not match chunk %u (%" PRIu64 " x %" PRIu64 ")", i,
                         sg->dst.rows, sg->dst.cols, sg->dst.pitch, sg->chunk, ch->src.rows,
                         ch->src.cols);
    if (i > 0) {
        const wsync_segment_t *pv = &p->segments[i - 1];
        if (cmp_rank_index(pv->receiver, pv->chunk, sg->receiver, sg->chunk) > 0)
            return wsync_err(WSYNC_ERR_PROTOCOL, "plan: segment %u out of order", i);
    }
    return WSYNC_OK;
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
    if (version != PLAN_VERSION || flags != 0)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: version %u flags %u, this library reads "
                         "version %u flags 0", version, flags, PLAN_VERSION);

    p = calloc(1, sizeof(*p));
    if (p == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "plan decode");
    p->nsenders = wsync_get_u32(&r);
    p->nreceivers = wsync_get_u32(&r);
    p->bucket_bytes = wsync_get_u64(&r);
    if (r.err) {
        st = wsync_err(WSYNC_ERR_PROTOCOL, "plan: truncated header");
        goto fail;
    }
    if ((st = wsync_plan_check_limits(p->nsenders, p->nreceivers, p->bucket_bytes,
                                      WSYNC_ERR_PROTOCOL)))
        goto fail;

    p->nchunks = wsync_get_count(&r, CHUNK_WIRE_BYTES);
    if (r.err) {
        st = wsync_err(WSYNC_ERR_PROTOCOL, "plan: chunk count larger than the message");
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

    p->nsegments = wsync_get_count(&r, SEGMENT_WIRE_BYTES);
    if (r.err) {
        st = wsync_err(WSYNC_ERR_PROTOCOL, "plan: segment count larger than the message");
        goto fail;
    }
    p->segments = calloc(p->nsegments ? p->nsegments : 1, sizeof(*p->segments));
    if (p->segments == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan decode: %u segments", p->nsegments);
        goto fail;
    }
    for (uint32_t i = 0; i < p->nsegments; i++)
        if ((st = decode_segment(&r, p, i)) != WSYNC_OK)
            goto fail;

    body_len = len - wsync_rbuf_left(&r);
    fp = wsync_get_u64(&r);
    if (r.err || wsync_rbuf_left(&r) != 0) {
        st = wsync_err(WSYNC_ERR_PROTOCOL, "plan: %s after the segments",
                       r.err ? "fingerprint missing" : "trailing bytes");
        goto fail;
    }
    if (fp != XXH3_64bits(data, body_len)) {
        st = wsync_err(WSYNC_ERR_PROTOCOL, "plan: fingerprint %016" PRIx64 " does not match the "
                       "content (corrupted in transit?)", fp);
        goto fail;
    }
    p->fingerprint = fp;
    if ((st = plan_derive(p)) != WSYNC_OK)
        goto fail;
    *plan = p;
    return WSYNC_OK;
fail:
    wsync_plan_free(p);
    return st;
}
