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
#include "kernels/delta.h"
#include "kernels/device.h"
#include "transports/shm.h"
#include "wsync_build_config.h"

/* kernels/delta.h is compiled only with CUDA; this file is built without it too, where no shard
 * or target is in CUDA memory and these calls are never reached. */
#if WSYNC_HAVE_CUDA
#define KD_OR(call, fallback) (call)
#else
#define KD_OR(call, fallback) (fallback)
static wsync_status_t no_cuda(void)
{
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "ipc: delta versions of CUDA memory need CUDA (this "
                     "wsync was built without it)");
}
#endif

#define NONE UINT32_MAX
#define PAGE 4096u
/* READY's delta slot with this bit: a device delta slot (in the sender's device slots' allocation,
 * after its device bucket slots), else a host one (the memfd) */
#define DEV_DELTA 0x80000000u

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
    /* CUDA shards (wsync_ipc_dtx_cuda): their capable chunks are encoded by one batched device
     * encode per bucket (kernels/delta.h, update_old: the pass also brings their baselines up)
     * into the bucket's delta slot: a device one when every receiver of the bucket's encoded
     * chunks reads our GPU (as the plain path's device bucket slots), else the host one, pinned
     * so that the kernels write it and every receiver (CPU or GPU) reads it */
    int cuda;
    void *shm_dev;                   /* the host delta slots as kernels see them */
    int shm_registered;
    uint8_t *dev;                    /* [nbuckets] the bucket's delta slot is a device one */
    void *dev_base;                  /* the device delta slots (not owned), or NULL */
    wsync_kdelta_batch_t **ebatch;   /* [nbuckets] the bucket's capable CUDA chunks, or NULL */
    void *ev;
};

void wsync_ipc_dtx_free(ipc_dtx_t *d)
{
    if (d == NULL)
        return;
    if (d->cuda)
        WSYNC_LOG_W("ipc: delta slots freed without wsync_ipc_dtx_cuda_free");
    wsync_shm_release(&d->shm);
    free(d->ebatch);
    free(d->dev);
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
    /* each receiver's chunks from us, in order: receiver-major in rc_list, rc_start[r] where
     * receiver r's begin */
    {
        uint32_t *cl = NULL, m = 0;
        size_t ccap = 0, lcap = 0, total = 0;
        for (uint32_t r = 0; r < d->nr; r++) {
            if ((rc = wsync_plan_rx_chunks(plan, r, d->c0, d->c1, &cl, &ccap, &m)) != WSYNC_OK) {
                free(cl);
                goto err;
            }
            if (total + m + 1 > lcap) {
                size_t nc = WSYNC_MAX(2 * lcap, total + m + 1);
                uint32_t *l = realloc(d->rc_list, nc * sizeof(*l));
                if (l == NULL) {
                    free(cl);
                    rc = wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for delta versions");
                    goto err;
                }
                d->rc_list = l;
                lcap = nc;
            }
            if (m > 0)
                memcpy(d->rc_list + total, cl, m * sizeof(*cl));
            total += m;
            d->rc_start[r + 1] = (uint32_t)total;
        }
        free(cl);
        if (d->rc_list == NULL && (d->rc_list = calloc(1, sizeof(*d->rc_list))) == NULL) {
            rc = wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for delta versions");
            goto err;
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

/* Chunk c is in its bucket's device encode: capable, of a CUDA shard, and within the codec's
 * limit (n * esize <= UINT32_MAX, core/delta.h; larger ones refresh their baseline by a copy and
 * travel plain). */
static int dev_encoded(const wsync_sender_t *s, const ipc_dtx_t *d, uint32_t c)
{
    const wsync_chunk_t *ch = &s->m.plan->chunks[c];
    return wsync_delta_tx_capable(d->tx, c) && s->shards[ch->shard].mem == WSYNC_MEM_CUDA &&
           plain_bytes(ch) <= UINT32_MAX;
}

uint32_t wsync_ipc_dtx_plan_device(wsync_sender_t *s, ipc_dtx_t *d, const uint8_t *stage_host)
{
    const wsync_plan_t *plan = s->m.plan;
    uint32_t ndev = 0;

    if (d->nslots == 0 || d->dev != NULL || (d->dev = calloc((size_t)d->nbuckets + 1, 1)) == NULL)
        return 0;   /* no memory: every bucket keeps its host delta slot */
    for (uint32_t k = 0; k < d->nbuckets; k++) {
        int ok = d->slot_of[k] != NONE, any = 0;
        for (uint32_t c = d->chunk_start[k]; c < d->chunk_start[k + 1] && ok; c++) {
            if (!wsync_delta_tx_capable(d->tx, c))
                continue;
            /* a host shard's chunk is encoded by the CPU, and a receiver that reads host memory
             * only (or not our GPU) cannot read a device slot: the host slot, as plain bytes */
            ok = dev_encoded(s, d, c) && !stage_host[plan->chunks[c].shard];
            any = 1;
        }
        d->dev[k] = (uint8_t)(ok && any);
        ndev += d->dev[k];
    }
    /* WSYNC_IPC_DELTA_DEVICE=0: pinned host delta slots only (to test or measure that path) */
    const char *env = getenv("WSYNC_IPC_DELTA_DEVICE");
    if (env != NULL && strcmp(env, "0") == 0) {
        memset(d->dev, 0, d->nbuckets);
        ndev = 0;
    }
    return ndev > 0 ? d->nslots : 0;
}

wsync_status_t wsync_ipc_dtx_cuda(wsync_sender_t *s, ipc_dtx_t *d, void *dev_base)
{
    const wsync_plan_t *plan = s->m.plan;
    wsync_kdelta_enc_t *e = NULL;
    uint32_t cap = 0, nenc = 0;
    wsync_status_t rc = WSYNC_OK;

    if (d->nslots == 0 || d->cuda)
        return WSYNC_OK;
    d->cuda = 1;   /* from here on, wsync_ipc_dtx_cuda_free undoes what was done */
    d->dev_base = dev_base;
    for (uint32_t k = 0; dev_base == NULL && d->dev != NULL && k < d->nbuckets; k++)
        d->dev[k] = 0;
    if ((d->ebatch = calloc((size_t)d->nbuckets + 1, sizeof(*d->ebatch))) == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for delta versions");
    if ((rc = wsync_dev_host_register(d->shm.base, d->shm.bytes, 0, &d->shm_registered)) != WSYNC_OK ||
        (rc = wsync_dev_host_device_ptr(d->shm.base, &d->shm_dev)) != WSYNC_OK ||
        (rc = wsync_dev_event_create(0, &d->ev)) != WSYNC_OK)
        return rc;
    for (uint32_t k = 0; k < d->nbuckets && rc == WSYNC_OK; k++) {
        uint32_t n = 0;
        if (d->slot_of[k] == NONE)
            continue;
        for (uint32_t c = d->chunk_start[k]; c < d->chunk_start[k + 1] && rc == WSYNC_OK; c++) {
            const wsync_chunk_t *ch = &plan->chunks[c];
            int on_dev = 0;
            void *old;
            if (!dev_encoded(s, d, c))
                continue;
            if (n >= cap) {
                wsync_kdelta_enc_t *ne = realloc(e, ((size_t)cap * 2 + 8) * sizeof(*e));
                if (ne == NULL) {
                    rc = wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for delta versions");
                    break;
                }
                e = ne;
                cap = cap * 2 + 8;
            }
            old = wsync_delta_tx_baseline(d->tx, ch->shard, &on_dev);
            if (old != NULL && !on_dev)   /* pinned host baseline: the address kernels use */
                rc = wsync_dev_host_device_ptr(old, &old);
            /* cap = the cut-off (delta_cutoff x the plain bytes): an encoding that does not fit
             * travels plain (len > cap) */
            e[n++] = (wsync_kdelta_enc_t){
                .new_base = s->shard_data[ch->shard], .old_base = old, .src = ch->src,
                .esize = (uint32_t)wsync_dtype_size(ch->dtype),
                .out = (uint8_t *)(d->dev != NULL && d->dev[k] ? d->dev_base : d->shm_dev) +
                       (size_t)d->slot_of[k] * d->slot_bytes + ch->bucket_off,
                .cap = wsync_delta_limit(s, 1, plain_bytes(ch))};
        }
        if (rc == WSYNC_OK && n > 0)
            rc = KD_OR(wsync_kdelta_encode_create(e, n, 1, &d->ebatch[k]), no_cuda());
        nenc += n;
    }
    free(e);
    if (rc == WSYNC_OK)
        WSYNC_LOG_I("ipc: sender %d: %u chunks of CUDA shards encoded on the device into delta "
                    "slots (%s)", s->m.rank, nenc, dev_base != NULL ? "device slots where every "
                    "receiver reads our GPU, else pinned host ones" : "pinned host memory");
    return rc;
}

void wsync_ipc_dtx_cuda_free(ipc_dtx_t *d)
{
    if (d == NULL || !d->cuda)
        return;
    for (uint32_t k = 0; d->ebatch != NULL && k < d->nbuckets; k++)
        KD_OR(wsync_kdelta_free(d->ebatch[k]), (void)0);
    wsync_dev_event_destroy(d->ev);
    if (d->shm_registered)
        wsync_dev_host_unregister(d->shm.base);
    d->ev = NULL;
    d->shm_registered = 0;
    d->cuda = 0;
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

/* The fault point delta.encoded on chunk c's encoding at enc[0, len) (host memory, or device
 * memory when on_device: a byte copied out, flipped and copied back on `stream`). */
static wsync_status_t encoded_fault(wsync_sender_t *s, uint32_t c, uint8_t *enc, uint64_t len,
                                    uint64_t version, int on_device, void *stream)
{
    switch (WSYNC_FAULT(WSYNC_FAULT_DELTA_CORRUPT)) {
    case WSYNC_FAULT_FAIL: {
        char where[128];
        snprintf(where, sizeof(where), "ipc sender %d, chunk %u of version %llu", s->m.rank, c,
                 (unsigned long long)version);
        return wsync_fault_err(WSYNC_FAULT_DELTA_CORRUPT, where);
    }
    case WSYNC_FAULT_CORRUPT:
        if (on_device) {
            uint8_t byte;
            wsync_status_t rc = wsync_dev_copy_to_host(&byte, enc + len / 2, 1, stream,
                                                       wsync_deadline_in(s->m.timeout_ms));
            if (rc != WSYNC_OK)
                return rc;
            wsync_fault_flip(&byte, 1);
            if ((rc = wsync_dev_memcpy_async(enc + len / 2, &byte, 1, stream)) != WSYNC_OK ||
                (rc = wsync_dev_stream_sync(stream, wsync_deadline_in(s->m.timeout_ms),
                                            "a fault's bit flip")) != WSYNC_OK)
                return rc;
        } else {
            wsync_fault_flip(enc, (size_t)len);
        }
        WSYNC_LOG_W("ipc: sender %d: fault delta.encoded:corrupt flipped a bit of chunk %u (param "
                    "'%s') of version %llu", s->m.rank, c,
                    s->shards[s->m.plan->chunks[c].shard].param.name, (unsigned long long)version);
        return WSYNC_OK;
    default:
        return WSYNC_OK;
    }
}

wsync_status_t wsync_ipc_dtx_bucket(wsync_sender_t *s, ipc_dtx_t *d, uint32_t k, uint64_t version,
                                    void *stream)
{
    const wsync_plan_t *plan = s->m.plan;
    uint32_t slot = d->slot_of[k];
    uint8_t *base = slot != NONE ? (uint8_t *)d->shm.base + (size_t)slot * d->slot_bytes : NULL;
    uint64_t t0 = wsync_now_ns();
    const wsync_kdelta_result_t *res = NULL;
    uint32_t e = 0;   /* the next CUDA chunk's entry in the bucket's encode batch */
    wsync_status_t rc = WSYNC_OK;

    if (d->base != 0 && d->ebatch != NULL && d->ebatch[k] != NULL) {
        int any = 0;
        for (uint32_t c = d->chunk_start[k]; c < d->chunk_start[k + 1] && !any; c++)
            any = d->want_d[c - d->c0] && dev_encoded(s, d, c);
        if (any) {
            /* one launch for the bucket's capable CUDA chunks, whoever takes them: it also brings
             * their baselines to this version. The lengths and hashes go into READY. */
            char what[96];
            snprintf(what, sizeof(what), "ipc sender %d: encoding bucket %u of version %llu",
                     s->m.rank, k, (unsigned long long)version);
            rc = KD_OR(wsync_kdelta_launch(d->ebatch[k], NULL, stream), no_cuda());
            if (rc == WSYNC_OK)
                rc = wsync_dev_event_record(d->ev, stream);
            if (rc == WSYNC_OK)
                rc = wsync_dev_event_wait(d->ev, wsync_deadline_in(s->m.timeout_ms), what);
            if (rc == WSYNC_OK && (res = KD_OR(wsync_kdelta_results(d->ebatch[k]), NULL)) == NULL)
                rc = wsync_err(WSYNC_ERR_INTERNAL, "ipc: sender %d: no encode results", s->m.rank);
            if (rc != WSYNC_OK)
                return rc;
        }
    }
    for (uint32_t c = d->chunk_start[k]; c < d->chunk_start[k + 1]; c++) {
        const wsync_chunk_t *ch = &plan->chunks[c];
        uint32_t i = c - d->c0;
        int cuda = s->shards[ch->shard].mem == WSYNC_MEM_CUDA;
        d->len[i] = 0;
        if (wsync_delta_tx_capable(d->tx, c)) {
            if (res != NULL && dev_encoded(s, d, c)) {
                const wsync_kdelta_result_t *x = &res[e++];
                wsync_delta_tx_mark(d->tx, c);
                d->hash[i] = x->hash;
                /* not shorter than the cut-off (or past it): plain */
                if (d->want_d[i] && x->len < wsync_delta_limit(s, 1, plain_bytes(ch))) {
                    int dev = d->dev != NULL && d->dev[k];
                    uint8_t *at = (dev ? (uint8_t *)d->dev_base + (size_t)slot * d->slot_bytes
                                       : base) + ch->bucket_off;
                    d->len[i] = x->len;
                    rc = encoded_fault(s, c, at, d->len[i], version, dev, stream);
                }
            } else if (d->base != 0 && d->want_d[i] && !cuda) {
                rc = wsync_delta_tx_encode(d->tx, c, base + ch->bucket_off, plain_bytes(ch),
                                           &d->len[i], &d->hash[i]);
                if (rc == WSYNC_OK && d->len[i] > 0)
                    rc = encoded_fault(s, c, base + ch->bucket_off, d->len[i], version, 0, NULL);
            } else {
                if (cuda)
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
    wsync_put_u32(b, d->slot_of[k] | (d->dev != NULL && d->dev[k] && d->slot_of[k] != NONE
                                          ? DEV_DELTA : 0u));
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
    uint8_t *own;                    /* that stream, copied out of the shared slot: the sender
                                        could still write there, and an apply trusts what the
                                        check saw (a rewritten table could send it anywhere) */
    size_t own_cap;
    /* CUDA targets (wsync_ipc_drx_cuda): per bucket, one batched device apply (hash on) of the
     * segments whose chunk comes as a delta, reading the pinned delta slot; cached by the set of
     * segments and the targets' pointers */
    int cuda;
    void *shm_dev;                   /* the host delta slots as our kernels see them */
    int shm_registered;
    const void *dev_base;            /* the sender's device delta slots, NULL: none readable */
    uint32_t nbuckets;
    struct drx_apply {
        wsync_kdelta_batch_t *batch;
        uint32_t n, cap;
        uint32_t *seg;               /* [n] the segments, in batch order */
        uint64_t *lens, *want;       /* [n] this version's encoded lengths, the sender's hashes */
        uint64_t gen;                /* r->land_gen the batch was built for */
        uint32_t slot;               /* the delta slot (READY's) its addresses are in */
        int live;                    /* launched in this version, not checked yet */
    } *ab;                           /* [nbuckets] */
};

wsync_status_t wsync_ipc_drx_create(wsync_receiver_t *r, uint32_t sender, uint32_t seg_first,
                                    uint32_t seg_end, ipc_drx_t **out)
{
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
        uint32_t c = r->m.segs[i].chunk;
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
    if (d->cuda)
        WSYNC_LOG_W("ipc: receiver's delta slots freed without wsync_ipc_drx_cuda_free");
    for (uint32_t k = 0; d->ab != NULL && k < d->nbuckets; k++) {
        free(d->ab[k].seg);
        free(d->ab[k].lens);
        free(d->ab[k].want);
    }
    free(d->ab);
    wsync_shm_release(&d->shm);
    free(d->plain);
    free(d->len);
    free(d->hash);
    free(d->own);
    free(d);
}

wsync_status_t wsync_ipc_drx_map(ipc_drx_t *d, int fd, uint32_t n, uint64_t bytes,
                                 const char *what)
{
    wsync_status_t rc = wsync_shm_map_fd(fd, (size_t)n * bytes, what, &d->shm);
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

    for (uint32_t k = 0; d->ab != NULL && k < d->nbuckets; k++)
        d->ab[k].live = 0;   /* a failed version may have left applies unchecked: not ours now */
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
        if ((d->slot & ~DEV_DELTA) >= d->nslots)
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
    uint32_t c = r->m.segs[seg].chunk, i = c - d->c0;

    if (d->n == 0 || i >= d->n || d->len[i] == 0 || !wsync_delta_rx_takes(r, r->delta_rx, d->base, c))
        return 0;
    if (d->slot & DEV_DELTA) {   /* the sender puts a host target's chunks in host memory */
        *rc = wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: sender %u put chunk %u, which a "
                        "host target of ours takes as a delta, in device memory", r->m.rank,
                        d->sender, c);
        return 1;
    }
    const uint8_t *enc = (const uint8_t *)d->shm.base + (size_t)d->slot * d->slot_bytes +
                         plan->chunks[c].bucket_off;
    if (d->checked != c) {
        /* checked and applied from our own copy (below the chunk's plain bytes: READY said) */
        if (d->len[i] > d->own_cap) {
            uint8_t *p = realloc(d->own, (size_t)d->len[i]);
            if (p == NULL) {
                *rc = wsync_err(WSYNC_ERR_NOMEM, "ipc: receiver %d: no memory for chunk %u's "
                                "delta stream (%llu bytes)", r->m.rank, c,
                                (unsigned long long)d->len[i]);
                return 1;
            }
            d->own = p;
            d->own_cap = (size_t)d->len[i];
        }
        memcpy(d->own, enc, (size_t)d->len[i]);
        *rc = wsync_delta_rx_check(r, c, d->own, d->len[i], version);
        if (*rc != WSYNC_OK)
            return 1;
        d->checked = c;
    }
    *rc = wsync_delta_rx_apply(r, seg, d->own, d->len[i], d->hash[i], version);
    return 1;
}

wsync_status_t wsync_ipc_drx_cuda(ipc_drx_t *d, uint32_t nbuckets, const void *dev_base,
                                  uint64_t dev_bytes)
{
    wsync_status_t rc;

    if (d->cuda)
        return WSYNC_OK;
    /* the device delta slots, when the sender shared them whole */
    d->dev_base = dev_base != NULL && d->nslots > 0 && dev_bytes >= (uint64_t)d->nslots * d->slot_bytes
                      ? dev_base : NULL;
    if ((d->ab = calloc((size_t)nbuckets + 1, sizeof(*d->ab))) == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for delta versions");
    d->nbuckets = nbuckets;
    d->cuda = 1;
    /* our kernels read the streams where the sender wrote them (read-only: mapped PROT_READ) */
    if (d->nslots > 0 &&
        ((rc = wsync_dev_host_register(d->shm.base, d->shm.bytes, 1, &d->shm_registered)) != WSYNC_OK ||
         (rc = wsync_dev_host_device_ptr(d->shm.base, &d->shm_dev)) != WSYNC_OK))
        return rc;
    return WSYNC_OK;
}

void wsync_ipc_drx_cuda_free(ipc_drx_t *d)
{
    if (d == NULL || !d->cuda)
        return;
    for (uint32_t k = 0; d->ab != NULL && k < d->nbuckets; k++) {
        KD_OR(wsync_kdelta_free(d->ab[k].batch), (void)0);
        d->ab[k].batch = NULL;
    }
    if (d->shm_registered)
        wsync_dev_host_unregister(d->shm.base);
    d->shm_registered = 0;
    d->cuda = 0;
}

int wsync_ipc_drx_seg_delta(const wsync_receiver_t *r, const ipc_drx_t *d, uint32_t seg)
{
    uint32_t c = r->m.segs[seg].chunk, i = c - d->c0;
    return d->n > 0 && c >= d->c0 && i < d->n && d->len[i] > 0 &&
           wsync_delta_rx_takes(r, r->delta_rx, d->base, c);
}

wsync_status_t wsync_ipc_drx_gpu_launch(wsync_receiver_t *r, ipc_drx_t *d, uint32_t k,
                                        uint32_t seg0, uint32_t seg1, void *stream, int *rebuilt)
{
    const wsync_plan_t *plan = r->m.plan;
    struct drx_apply *a;
    uint32_t n = 0;
    int same;
    wsync_status_t rc = WSYNC_OK;

    (void)stream;   /* without CUDA */
    *rebuilt = 0;
    if (!d->cuda || k >= d->nbuckets)
        return wsync_err(WSYNC_ERR_INTERNAL, "ipc: receiver %d: delta apply on the GPU without "
                         "its set-up (bucket %u of sender %u)", r->m.rank, k, d->sender);
    a = &d->ab[k];
    for (uint32_t i = seg0; i < seg1; i++)
        n += r->targets[r->m.segs[i].target].mem == WSYNC_MEM_CUDA &&
             wsync_ipc_drx_seg_delta(r, d, i);
    const uint8_t *slots = (d->slot & DEV_DELTA) ? d->dev_base : d->shm_dev;
    if (n > 0 && slots == NULL)
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: sender %u put bucket %u's deltas "
                         "in %s delta slots this receiver cannot read", r->m.rank, d->sender, k,
                         (d->slot & DEV_DELTA) ? "device" : "host");
    same = a->batch != NULL && a->gen == r->land_gen && a->n == n && a->slot == d->slot;
    for (uint32_t i = seg0, j = 0; i < seg1 && same; i++)
        if (r->targets[r->m.segs[i].target].mem == WSYNC_MEM_CUDA &&
            wsync_ipc_drx_seg_delta(r, d, i))
            same = a->seg[j++] == i;
    if (!same) {
        wsync_kdelta_app_t *app = calloc((size_t)n + 1, sizeof(*app));
        KD_OR(wsync_kdelta_free(a->batch), (void)0);
        a->batch = NULL;
        a->n = 0;
        if (n > a->cap) {
            uint32_t *sg = realloc(a->seg, (size_t)n * sizeof(*sg));
            if (sg != NULL)
                a->seg = sg;
            uint64_t *l = realloc(a->lens, (size_t)n * sizeof(*l));
            if (l != NULL)
                a->lens = l;
            uint64_t *w = realloc(a->want, (size_t)n * sizeof(*w));
            if (w != NULL)
                a->want = w;
            if (sg == NULL || l == NULL || w == NULL) {
                free(app);
                return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for %u delta applies", n);
            }
            a->cap = n;
        }
        if (app == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for %u delta applies", n);
        for (uint32_t i = seg0, j = 0; i < seg1; i++) {
            const wsync_segment_t *sg = &r->m.segs[i];
            const wsync_chunk_t *c = &plan->chunks[sg->chunk];
            if (r->targets[sg->target].mem != WSYNC_MEM_CUDA || !wsync_ipc_drx_seg_delta(r, d, i))
                continue;
            a->seg[j] = i;
            app[j++] = (wsync_kdelta_app_t){
                .enc = slots + (size_t)(d->slot & ~DEV_DELTA) * d->slot_bytes + c->bucket_off,
                .len = d->len[sg->chunk - d->c0], .dst_base = r->land[sg->target], .dst = sg->dst,
                .esize = (uint32_t)wsync_dtype_size(c->dtype)};
        }
        if (n > 0)
            rc = KD_OR(wsync_kdelta_apply_create(app, n, 1, &a->batch), no_cuda());
        free(app);
        if (rc != WSYNC_OK)
            return rc;
        a->n = n;
        a->gen = r->land_gen;
        a->slot = d->slot;
        *rebuilt = 1;
    }
    if (n == 0)
        return WSYNC_OK;
    for (uint32_t j = 0; j < n; j++) {
        uint32_t i = r->m.segs[a->seg[j]].chunk - d->c0;
        a->lens[j] = d->len[i];
        a->want[j] = d->hash[i];
    }
    /* a bucket's slot is the same every version (the sender's); a READY naming another one
     * rebuilds the batch above, so its addresses are the slot READY names */
    rc = KD_OR(wsync_kdelta_launch(a->batch, a->lens, stream), no_cuda());
    if (rc == WSYNC_OK)
        a->live = 1;
    return rc;
}

wsync_status_t wsync_ipc_drx_gpu_check(wsync_receiver_t *r, ipc_drx_t *d, uint32_t k,
                                       uint64_t version)
{
    const wsync_kdelta_result_t *res;

    if (!d->cuda || k >= d->nbuckets || !d->ab[k].live)
        return WSYNC_OK;
    d->ab[k].live = 0;
    if ((res = KD_OR(wsync_kdelta_results(d->ab[k].batch), NULL)) == NULL)
        return wsync_err(WSYNC_ERR_INTERNAL, "ipc: receiver %d: no apply results", r->m.rank);
    for (uint32_t j = 0; j < d->ab[k].n; j++) {
        uint32_t seg = d->ab[k].seg[j];
        const wsync_segment_t *sg = &r->m.segs[seg];
        const wsync_target_desc_t *t = &r->targets[sg->target];
        char what[WSYNC_NAME_MAX * 2 + 160];
        wsync_status_t rc;
        snprintf(what, sizeof(what), "receiver %d: version %llu refused: param '%s' (target "
                 "'%s'), chunk %u from sender %u", r->m.rank, (unsigned long long)version,
                 t->pieces[sg->piece].param.name, t->name, sg->chunk, d->sender);
        if ((rc = KD_OR(wsync_kdelta_fault_status(&res[j], what), no_cuda())) != WSYNC_OK)
            return rc;
        if (res[j].hash != d->ab[k].want[j])
            return wsync_delta_rx_hash_error(r, seg, d->ab[k].want[j], res[j].hash, version);
    }
    return WSYNC_OK;
}
