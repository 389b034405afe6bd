/* The ipc scheme's delta versions: see schemes/ipc_delta.h. */
#include "schemes/ipc_delta.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/delta.h"
#include "core/delta_state.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/util.h"
#include "kernels/device.h"
#include "transports/shm.h"

#define NONE UINT32_MAX
#define PAGE 4096u

static uint64_t plain_bytes(const wsync_chunk_t *c)
{
    return c->src.rows * c->src.cols * wsync_dtype_size(c->dtype);
}

/* ---- sender ---------------------------------------------------------------------------------- */

struct ipc_dtx {
    wsync_delta_tx_t *tx;
    uint32_t nbuckets;
    uint32_t *chunk_start;           /* [nbuckets + 1] plan chunk ranges of our buckets */
    uint32_t c0, c1;                 /* our chunks */
    wsync_shm_t shm;                 /* the delta slots */
    uint32_t nslots;
    uint64_t slot_bytes;
    uint32_t *slot_of;               /* [nbuckets] delta slot, NONE: no capable chunk */
    int64_t last[8];                 /* [nslots] bucket that used the slot last this version */
    uint32_t nr;
    uint32_t *rc_start, *rc_list;    /* receiver r's chunks from us: rc_list[rc_start[r] ..] */
    uint8_t *got;                    /* [nr] DELTA_START in for this version */
    uint8_t *want_d, *want_p;        /* [c1 - c0] some receiver takes it as a delta / plain */
    uint8_t *mark;                   /* [c1 - c0] scratch: chunks one receiver takes plain */
    uint64_t *len, *hash;            /* [c1 - c0] this version's encoding (0: plain) */
    uint64_t base;
    int dev_refresh;                 /* device copies were queued on the stream */
    uint64_t enc_bytes, plain_bytes, nenc, nplain;
    uint64_t t_encode_ns;
};

void wsync_ipc_dtx_free(ipc_dtx_t *d)
{
    if (d == NULL)
        return;
    wsync_shm_release(&d->shm);
    free(d->chunk_start);
    free(d->slot_of);
    free(d->rc_start);
    free(d->rc_list);
    free(d->got);
    free(d->want_d);
    free(d->want_p);
    free(d->mark);
    free(d->len);
    free(d->hash);
    free(d);
}

wsync_status_t wsync_ipc_dtx_create(wsync_sender_t *s, uint32_t nbuckets,
                                    const uint32_t *chunk_start, uint32_t nslots, ipc_dtx_t **out)
{
    const wsync_plan_t *plan = s->m.plan;
    uint32_t me = (uint32_t)s->m.rank, first = 0, used = 0, n;
    ipc_dtx_t *d = calloc(1, sizeof(*d));
    wsync_status_t rc;

    if (d == NULL || nslots == 0 || nslots > 8) {
        free(d);
        return wsync_err(d == NULL ? WSYNC_ERR_NOMEM : WSYNC_ERR_INTERNAL, "ipc: delta slots");
    }
    d->shm.fd = -1;
    if (s->delta_tx == NULL && (rc = wsync_delta_tx_create(s, &s->delta_tx)) != WSYNC_OK) {
        free(d);
        return rc;
    }
    d->tx = s->delta_tx;
    d->nbuckets = nbuckets;
    d->nslots = nslots;
    d->nr = plan->nreceivers;
    d->c0 = chunk_start[0];
    d->c1 = chunk_start[nbuckets];
    n = d->c1 - d->c0;
    d->chunk_start = malloc(((size_t)nbuckets + 1) * sizeof(*d->chunk_start));
    d->slot_of = calloc((size_t)nbuckets + 1, sizeof(*d->slot_of));
    d->rc_start = calloc((size_t)d->nr + 2, sizeof(*d->rc_start));
    d->got = calloc((size_t)d->nr + 1, 1);
    d->want_d = calloc((size_t)n + 1, 1);
    d->want_p = calloc((size_t)n + 1, 1);
    d->mark = calloc((size_t)n + 1, 1);
    d->len = calloc((size_t)n + 1, sizeof(*d->len));
    d->hash = calloc((size_t)n + 1, sizeof(*d->hash));
    if (d->chunk_start == NULL || d->slot_of == NULL || d->rc_start == NULL || d->got == NULL ||
        d->want_d == NULL || d->want_p == NULL || d->mark == NULL || d->len == NULL ||
        d->hash == NULL) {
        rc = wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for delta versions");
        goto err;
    }
    memcpy(d->chunk_start, chunk_start, ((size_t)nbuckets + 1) * sizeof(*chunk_start));
    for (uint32_t i = 0; i < me; i++)
        first += plan->nbuckets[i];
    for (uint32_t k = 0; k < nbuckets; k++) {
        int any = 0;
        for (uint32_t c = chunk_start[k]; c < chunk_start[k + 1] && !any; c++)
            any = wsync_delta_tx_capable(d->tx, c);
        d->slot_of[k] = any ? used++ % nslots : NONE;
        if (any)
            d->slot_bytes = WSYNC_MAX(d->slot_bytes, plan->bucket_used[first + k]);
    }
    d->slot_bytes = (d->slot_bytes + PAGE - 1) / PAGE * PAGE;
    if (used < nslots)
        d->nslots = used;
    if (d->nslots > 0) {
        char label[64];
        snprintf(label, sizeof(label), "wsync-delta-%u", me);
        if ((rc = wsync_shm_create(label, (size_t)d->nslots * d->slot_bytes, &d->shm)) != WSYNC_OK)
            goto err;
    }
    /* each receiver's chunks from us, in order (segments are ordered by receiver, then chunk) */
    uint32_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        uint32_t prev_r = NONE, prev_c = NONE;
        total = 0;
        for (uint32_t i = 0; i < plan->nsegments; i++) {
            const wsync_segment_t *sg = &plan->segments[i];
            if (sg->chunk < d->c0 || sg->chunk >= d->c1 ||
                (sg->receiver == prev_r && sg->chunk == prev_c))
                continue;
            prev_r = sg->receiver;
            prev_c = sg->chunk;
            if (pass == 0)
                d->rc_start[sg->receiver + 1]++;
            else
                d->rc_list[total] = sg->chunk;   /* receiver-major, as counted */
            total++;
        }
        if (pass == 0) {
            for (uint32_t r = 0; r < d->nr; r++)
                d->rc_start[r + 1] += d->rc_start[r];
            d->rc_list = calloc((size_t)total + 1, sizeof(*d->rc_list));
            if (d->rc_list == NULL) {
                rc = wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for delta versions");
                goto err;
            }
        }
    }
    WSYNC_LOG_I("ipc: sender %u: delta versions: %u of %u chunks delta-capable, %u delta slots of "
                "%llu bytes, baselines %.1f MiB", me, wsync_delta_tx_ncapable(d->tx), n, d->nslots,
                (unsigned long long)d->slot_bytes,
                (double)wsync_delta_tx_bytes(d->tx) / (1 << 20));
    *out = d;
    return WSYNC_OK;
err:
    wsync_ipc_dtx_free(d);
    return rc;
}

void wsync_ipc_dtx_slots(const ipc_dtx_t *d, uint32_t *n, uint64_t *bytes, int *fd)
{
    *n = d != NULL ? d->nslots : 0;
    *bytes = d != NULL ? d->slot_bytes : 0;
    *fd = d != NULL && d->nslots > 0 ? d->shm.fd : -1;
}

/* One DELTA_START: which of receiver r's chunks it takes as deltas and which plain. */
static wsync_status_t take_start(wsync_sender_t *s, ipc_dtx_t *d, uint32_t r, wsync_rbuf_t *rb,
                                 uint64_t version)
{
    uint64_t v = wsync_get_u64(rb), holds = wsync_get_u64(rb);
    uint32_t n = wsync_get_count(rb, 4), bad = 0;
    uint32_t *list = calloc((size_t)n + 1, sizeof(*list));

    if (list == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for a DELTA_START of %u chunks", n);
    for (uint32_t i = 0; i < n && !rb->err; i++)
        list[i] = wsync_get_u32(rb);
    if (rb->err || wsync_rbuf_left(rb) != 0 || v != version || d->got[r]) {
        free(list);
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: sender %d: unexpected DELTA_START (version "
                         "%llu) from receiver %u while pushing version %llu", s->m.rank,
                         (unsigned long long)v, r, (unsigned long long)version);
    }
    d->got[r] = 1;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t c = list[i];
        if (c < d->c0 || c >= d->c1)
            bad = 1;
        else
            d->mark[c - d->c0] = 1;
    }
    int takes = d->base != 0 && holds == d->base;
    for (uint32_t i = d->rc_start[r]; i < d->rc_start[r + 1]; i++) {
        uint32_t c = d->rc_list[i];
        if (takes && wsync_delta_tx_capable(d->tx, c) && !d->mark[c - d->c0])
            d->want_d[c - d->c0] = 1;
        else
            d->want_p[c - d->c0] = 1;
    }
    for (uint32_t i = 0; i < n; i++)
        if (list[i] >= d->c0 && list[i] < d->c1)
            d->mark[list[i] - d->c0] = 0;
    free(list);
    if (bad)
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: sender %d: receiver %u's DELTA_START names a "
                         "chunk that is not this sender's", s->m.rank, r);
    WSYNC_LOG_D("ipc: sender %d: version %llu: receiver %u holds version %llu (base %llu): %s",
                s->m.rank, (unsigned long long)version, r, (unsigned long long)holds,
                (unsigned long long)d->base, takes ? "deltas" : "full bytes");
    return WSYNC_OK;
}

wsync_status_t wsync_ipc_dtx_begin(wsync_sender_t *s, ipc_dtx_t *d, uint64_t version,
                                   wsync_conn_t *const *rconn, const uint8_t *needs_any)
{
    const uint16_t types[] = {WSYNC_MSG_DELTA_START};
    int64_t deadline = wsync_deadline_in(s->m.timeout_ms);
    uint32_t want = 0, n = d->c1 - d->c0;

    d->base = wsync_delta_tx_begin(d->tx, version);
    for (uint32_t i = 0; i < d->nslots; i++)
        d->last[i] = -1;   /* no delta slot used yet in this version */
    memset(d->got, 0, d->nr);
    memset(d->want_d, 0, n);
    memset(d->want_p, 0, n);
    memset(d->len, 0, (size_t)n * sizeof(*d->len));
    d->dev_refresh = 0;
    d->enc_bytes = d->plain_bytes = d->nenc = d->nplain = 0;
    d->t_encode_ns = 0;
    for (uint32_t r = 0; r < d->nr; r++)
        want += needs_any[r] != 0;
    for (uint32_t have = 0; have < want; have++) {
        wsync_msg_t *msg;
        wsync_rbuf_t rb;
        wsync_status_t rc = wsync_inbox_pop(&s->m.inbox, types, 1, deadline, &msg);
        if (rc == WSYNC_ERR_TIMEOUT) {
            char who[256] = "";
            size_t w = 0;
            for (uint32_t r = 0; r < d->nr && w + 16 < sizeof(who); r++)
                if (needs_any[r] && !d->got[r])
                    w += (size_t)snprintf(who + w, sizeof(who) - w, "%s%u", w ? ", " : "", r);
            return wsync_err(rc, "ipc: sender %d: version %llu: no DELTA_START within %d ms from "
                             "receiver(s) %s", s->m.rank, (unsigned long long)version,
                             s->m.timeout_ms, who);
        }
        if (rc != WSYNC_OK)
            return rc;
        uint32_t t = atomic_load(&msg->conn->tag);
        int r = t >= 1 && t <= d->nr && rconn[t - 1] == msg->conn && needs_any[t - 1]
                    ? (int)(t - 1) : -1;
        wsync_rbuf_init(&rb, msg->payload, msg->len);
        rc = r < 0 ? wsync_err(WSYNC_ERR_PROTOCOL, "ipc: sender %d: DELTA_START from a "
                               "connection that is no receiver of ours", s->m.rank)
                   : take_start(s, d, (uint32_t)r, &rb, version);
        wsync_msg_free(msg);
        if (rc != WSYNC_OK)
            return rc;
    }
    return WSYNC_OK;
}

int64_t wsync_ipc_dtx_reuse(ipc_dtx_t *d, uint32_t k)
{
    uint32_t slot = d->slot_of[k];
    if (slot == NONE)
        return -1;
    int64_t prev = d->last[slot];
    d->last[slot] = k;
    return prev;
}

wsync_status_t wsync_ipc_dtx_bucket(wsync_sender_t *s, ipc_dtx_t *d, uint32_t k, uint64_t version,
                                    void *stream)
{
    const wsync_plan_t *plan = s->m.plan;
    uint32_t slot = d->slot_of[k];
    uint8_t *base = slot != NONE ? (uint8_t *)d->shm.base + (size_t)slot * d->slot_bytes : NULL;
    uint64_t t0 = wsync_now_ns();
    wsync_status_t rc;

    for (uint32_t c = d->chunk_start[k]; c < d->chunk_start[k + 1]; c++) {
        const wsync_chunk_t *ch = &plan->chunks[c];
        uint32_t i = c - d->c0;
        d->len[i] = 0;
        if (wsync_delta_tx_capable(d->tx, c)) {
            if (d->base != 0 && d->want_d[i] && s->shards[ch->shard].mem == WSYNC_MEM_HOST) {
                rc = wsync_delta_tx_encode(d->tx, c, base + ch->bucket_off, plain_bytes(ch),
                                           &d->len[i], &d->hash[i]);
                if (rc == WSYNC_OK && d->len[i] > 0) {
                    switch (WSYNC_FAULT(WSYNC_FAULT_DELTA_CORRUPT)) {
                    case WSYNC_FAULT_FAIL: {
                        char where[128];
                        snprintf(where, sizeof(where), "ipc sender %d, chunk %u of version %llu",
                                 s->m.rank, c, (unsigned long long)version);
                        return wsync_fault_err(WSYNC_FAULT_DELTA_CORRUPT, where);
                    }
                    case WSYNC_FAULT_CORRUPT:
                        wsync_fault_flip(base + ch->bucket_off, (size_t)d->len[i]);
                        WSYNC_LOG_W("ipc: sender %d: fault delta.encoded:corrupt flipped a bit of "
                                    "chunk %u (param '%s') of version %llu", s->m.rank, c,
                                    s->shards[ch->shard].param.name, (unsigned long long)version);
                        break;
                    default:
                        break;
                    }
                }
            } else {
                if (s->shards[ch->shard].mem == WSYNC_MEM_CUDA)
                    d->dev_refresh = 1;
                rc = wsync_delta_tx_refresh(d->tx, c, stream);
            }
            if (rc != WSYNC_OK)
                return rc;
        }
        if (d->len[i] > 0) {
            d->enc_bytes += d->len[i];
            d->nenc++;
        }
        if (d->want_p[i] || d->len[i] == 0) {
            d->plain_bytes += plain_bytes(ch);
            d->nplain++;
        }
    }
    d->t_encode_ns += wsync_now_ns() - t0;
    return WSYNC_OK;
}

int wsync_ipc_dtx_skip_plain(const ipc_dtx_t *d, uint32_t c)
{
    return d != NULL && c >= d->c0 && c < d->c1 && !d->want_p[c - d->c0] && d->len[c - d->c0] > 0;
}

void wsync_ipc_dtx_put_ready(const ipc_dtx_t *d, uint32_t k, wsync_wbuf_t *b)
{
    uint32_t any = 0;
    for (uint32_t c = d->chunk_start[k]; c < d->chunk_start[k + 1] && !any; c++)
        any = d->len[c - d->c0] > 0;
    wsync_put_u64(b, d->base);
    wsync_put_u32(b, d->slot_of[k]);
    wsync_put_u32(b, any ? d->chunk_start[k + 1] - d->chunk_start[k] : 0);
    for (uint32_t c = d->chunk_start[k]; any && c < d->chunk_start[k + 1]; c++) {
        wsync_put_u64(b, d->len[c - d->c0]);
        wsync_put_u64(b, d->hash[c - d->c0]);
    }
}

wsync_status_t wsync_ipc_dtx_finish(wsync_sender_t *s, ipc_dtx_t *d, uint64_t version,
                                    void *stream)
{
    if (d->dev_refresh) {
        /* the trainer may write its shards once the push returns: the copies must be done */
        wsync_status_t rc = wsync_dev_stream_sync(stream, wsync_deadline_in(s->m.timeout_ms),
                                                  "ipc: delta baselines of CUDA shards");
        if (rc != WSYNC_OK)
            return rc;
    }
    s->stats.bytes_encoded = d->enc_bytes;
    s->stats.bytes_plain = d->plain_bytes;
    s->stats.bytes_wire = d->enc_bytes + d->plain_bytes;
    s->stats.base_version = d->base;
    WSYNC_LOG_D("ipc: sender %d: version %llu against base %llu: %llu bytes on the wire, %llu "
                "encoded (%llu chunks) and %llu plain (%llu chunks); encoding %.3f ms", s->m.rank,
                (unsigned long long)version, (unsigned long long)d->base,
                (unsigned long long)(d->enc_bytes + d->plain_bytes),
                (unsigned long long)d->enc_bytes, (unsigned long long)d->nenc,
                (unsigned long long)d->plain_bytes, (unsigned long long)d->nplain,
                (double)d->t_encode_ns / 1e6);
    return WSYNC_OK;
}

/* ---- receiver -------------------------------------------------------------------------------- */

struct ipc_drx {
    uint32_t sender;
    wsync_shm_t shm;                 /* the sender's delta slots, read-only */
    uint32_t nslots;
    uint64_t slot_bytes;
    uint32_t *plain;                 /* the sender's chunks we take plain whatever we hold */
    uint32_t nplain;
    /* the READY at hand */
    uint64_t base;
    uint32_t slot, c0, n;
    uint64_t *len, *hash;
    uint32_t cap;
    uint32_t checked;                /* the chunk whose stream was checked last, NONE */
};

wsync_status_t wsync_ipc_drx_create(wsync_receiver_t *r, uint32_t sender, uint32_t seg_first,
                                    uint32_t seg_end, ipc_drx_t **out)
{
    const wsync_plan_t *plan = r->m.plan;
    ipc_drx_t *d = calloc(1, sizeof(*d));

    if (d == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for delta versions");
    d->shm.fd = -1;
    d->sender = sender;
    d->checked = NONE;
    d->plain = calloc((size_t)(seg_end - seg_first) + 1, sizeof(*d->plain));
    if (d->plain == NULL) {
        free(d);
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for delta versions");
    }
    for (uint32_t i = seg_first; i < seg_end; i++) {
        uint32_t c = plan->segments[i].chunk;
        if (wsync_delta_rx_chunk_capable(r->delta_rx, c) ||
            (d->nplain > 0 && d->plain[d->nplain - 1] == c))
            continue;
        d->plain[d->nplain++] = c;
    }
    *out = d;
    return WSYNC_OK;
}

void wsync_ipc_drx_free(ipc_drx_t *d)
{
    if (d == NULL)
        return;
    wsync_shm_release(&d->shm);
    free(d->plain);
    free(d->len);
    free(d->hash);
    free(d);
}

wsync_status_t wsync_ipc_drx_map(ipc_drx_t *d, int fd, uint32_t n, uint64_t bytes)
{
    wsync_status_t rc = wsync_shm_map_fd(fd, (size_t)n * bytes, &d->shm);
    if (rc != WSYNC_OK)
        return rc;
    d->nslots = n;
    d->slot_bytes = bytes;
    return WSYNC_OK;
}

wsync_status_t wsync_ipc_drx_start(wsync_receiver_t *r, ipc_drx_t *d, wsync_conn_t *conn,
                                   uint64_t version)
{
    wsync_wbuf_t b;
    wsync_status_t rc;

    wsync_wbuf_init(&b);
    wsync_put_u64(&b, version);
    wsync_put_u64(&b, wsync_delta_rx_holds(r));
    wsync_put_u32(&b, d->nplain);
    for (uint32_t i = 0; i < d->nplain; i++)
        wsync_put_u32(&b, d->plain[i]);
    rc = b.err ? wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for DELTA_START")
               : wsync_conn_send(conn, WSYNC_MSG_DELTA_START, b.data, (uint32_t)b.len, NULL, 0,
                                 r->m.timeout_ms);
    wsync_wbuf_free(&b);
    return rc;
}

wsync_status_t wsync_ipc_drx_ready(wsync_receiver_t *r, ipc_drx_t *d, wsync_rbuf_t *rb,
                                   uint32_t k, uint32_t c0, uint32_t c1, uint64_t version)
{
    const wsync_plan_t *plan = r->m.plan;
    const char *why = NULL;

    d->base = wsync_get_u64(rb);
    d->slot = wsync_get_u32(rb);
    d->n = wsync_get_count(rb, 16);
    d->c0 = c0;
    d->checked = NONE;
    if (!rb->err && d->n > 0 && d->n != c1 - c0)
        why = "a chunk count that is not the bucket's";
    else if (!rb->err && d->n > d->cap) {
        uint64_t *l = realloc(d->len, (size_t)d->n * sizeof(*l));
        if (l != NULL)
            d->len = l;
        uint64_t *h = realloc(d->hash, (size_t)d->n * sizeof(*h));
        if (h != NULL)
            d->hash = h;
        if (l == NULL || h == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for %u chunks' delta lengths", d->n);
        d->cap = d->n;
    }
    for (uint32_t i = 0; why == NULL && !rb->err && i < d->n; i++) {
        const wsync_chunk_t *c = &plan->chunks[c0 + i];
        d->len[i] = wsync_get_u64(rb);
        d->hash[i] = wsync_get_u64(rb);
        if (rb->err || d->len[i] == 0)
            continue;
        if (d->slot >= d->nslots)
            why = "an encoded chunk in a delta slot that was not shared";
        else if (d->len[i] >= plain_bytes(c) || d->len[i] < WSYNC_DELTA_HEADER)
            why = "an encoded length outside (header, plain bytes)";
        else if (c->bucket_off + d->len[i] > d->slot_bytes)
            why = "an encoded chunk past its delta slot";
    }
    if (rb->err || why != NULL)
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: malformed READY from sender %u "
                         "(bucket %u, version %llu): %s", r->m.rank, d->sender, k,
                         (unsigned long long)version, why != NULL ? why : "truncated delta part");
    return WSYNC_OK;
}

int wsync_ipc_drx_segment(wsync_receiver_t *r, ipc_drx_t *d, uint32_t seg, uint64_t version,
                          wsync_status_t *rc)
{
    const wsync_plan_t *plan = r->m.plan;
    uint32_t c = plan->segments[seg].chunk, i = c - d->c0;

    if (d->n == 0 || i >= d->n || d->len[i] == 0 || !wsync_delta_rx_takes(r, r->delta_rx, d->base, c))
        return 0;
    const uint8_t *enc = (const uint8_t *)d->shm.base + (size_t)d->slot * d->slot_bytes +
                         plan->chunks[c].bucket_off;
    if (d->checked != c) {
        *rc = wsync_delta_rx_check(r, c, enc, d->len[i], version);
        if (*rc != WSYNC_OK)
            return 1;
        d->checked = c;
    }
    *rc = wsync_delta_rx_apply(r, seg, enc, d->len[i], d->hash[i], version);
    return 1;
}
