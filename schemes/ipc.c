/* The 'ipc' scheme: every participant on one node (and network namespace). Shards that lie in
 * memory from wsync_mem_alloc are shared once (their memfds) and read in place by the receivers:
 * no staging copy. Other chunks are packed into a memfd of `nslots` bucket slots (double-buffered),
 * also shared once. Descriptors travel over an abstract Unix socket. Per bucket of the plan's
 * schedule, READY tells a receiver that the bucket may be read (and in which slot its staged
 * chunks are); the receiver copies out only its segments and answers RELEASE; a slot is refilled
 * only once every receiver that needed its previous bucket released it. Nothing has a name, so
 * nothing outlives the processes. With verification on (WSYNC_VERIFY, at the sender or asked for
 * by a receiver in DATA_HELLO), READY also carries the xxh3 of each of the bucket's chunks, taken
 * from the shard, which the receiver checks against what landed. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fault.h"
#include "core/log.h"
#include "core/objects.h"
#include "core/sock.h"
#include "core/util.h"
#include "reshard/exec.h"
#include "schemes/scheme.h"
#include "transports/shm.h"

#define IPC_SLOTS 2
#define PAGE 4096u
#define NO_SLOT UINT32_MAX
/* descriptors in one DATA_FDS frame: the bucket memfd and up to this many minus one regions;
 * shards in further regions are staged instead */
#define MAX_FDS WSYNC_MSG_MAX_FDS

typedef struct {
    int32_t region;                  /* index into the shared regions, -1: staged */
    uint64_t offset;                 /* byte offset of the shard in its region */
} ipc_inplace_t;

typedef struct {
    wsync_shm_t shm;
    uint32_t nslots;
    uint64_t slot_bytes;
    ipc_inplace_t *inplace;          /* [nshards] */
    int region_fds[MAX_FDS];         /* memfds of wsync_mem_alloc regions (not owned) */
    uint64_t region_bytes[MAX_FDS];
    uint32_t nregions;
    uint8_t *staged;                 /* [nbuckets] bucket has chunks to pack */
    int64_t last_in_slot[IPC_SLOTS]; /* bucket whose bytes a slot holds, -1 if none */
    uint32_t nbuckets;
    uint32_t first_bucket;           /* index of this sender's bucket 0 in plan->bucket_used */
    uint32_t *chunk_start;           /* [nbuckets + 1] chunk ranges per bucket */
    uint8_t *need;                   /* [nbuckets * nreceivers] receiver r needs bucket k */
    uint32_t *pending;               /* [nbuckets] releases still due */
    uint8_t *owed;                   /* [nbuckets * nreceivers] READY sent, RELEASE not yet in */
    wsync_conn_t **rconn;            /* [nreceivers] data connections */
    uint8_t *needs_any;              /* [nreceivers] */
    int verify;                      /* READY carries the chunks' checksums */
} ipc_sender_t;

typedef struct {
    wsync_conn_t *conn;
    wsync_shm_t shm;
    uint32_t nslots;
    uint64_t slot_bytes;
    wsync_shm_t regions[MAX_FDS];    /* the sender's shards, mapped read-only */
    uint32_t nregions;
    ipc_inplace_t *inplace;          /* [ninplace_slots] by the sender's shard index */
    uint32_t ninplace_slots;
    uint32_t nbuckets;               /* the sender's schedule length */
    uint32_t *seg_start;             /* [nbuckets + 1] ranges of plan->segments per bucket */
    uint32_t *chunk_start;           /* [nbuckets + 1] ranges of plan->chunks per bucket */
    uint8_t *done;                   /* [nbuckets] landed in this version */
    uint32_t needed;                 /* buckets with segments of ours */
    uint32_t pid;
} ipc_from_t;

typedef struct {
    uint32_t nsenders;
    ipc_from_t *from;                /* [nsenders] */
    uint64_t bytes_total;            /* bytes landing in our targets per version */
    uint64_t *sums;                  /* the checksums of the READY at hand */
    uint32_t sums_cap;
} ipc_receiver_t;

static uint64_t chunk_bytes(const wsync_chunk_t *c)
{
    return c->src.rows * c->src.cols * wsync_dtype_size(c->dtype);
}

static uint32_t bucket_base(const wsync_plan_t *plan, uint32_t sender)
{
    uint32_t b = 0;
    for (uint32_t s = 0; s < sender; s++)
        b += plan->nbuckets[s];
    return b;
}

/* ---- scoring ----------------------------------------------------------------------------------- */

static int ipc_score(const wsync_group_info_t *g, char *reason, size_t len)
{
    const char *host = g->senders[0].host_id;
    int shm = wsync_transport_index("shm");

    if (g->mem_kinds & ~(1u << WSYNC_MEM_HOST)) {
        snprintf(reason, len, "some shards or targets are in CUDA memory; this version shares host "
                              "memory only");
        return 0;
    }
    for (uint32_t i = 0; i < g->nsenders + g->nreceivers; i++) {
        const wsync_hello_t *h = i < g->nsenders ? &g->senders[i] : &g->receivers[i - g->nsenders];
        const char *role = h->role == WSYNC_ROLE_SENDER ? "sender" : "receiver";
        if (strcmp(h->host_id, host) != 0) {
            snprintf(reason, len, "%s %d is on another host or network namespace (%s) than sender "
                                  "0 (%s)", role, h->rank, h->hostname, g->senders[0].hostname);
            return 0;
        }
        if (!(h->transports & (1u << shm))) {
            snprintf(reason, len, "%s %d cannot use shared memory (memfd)", role, h->rank);
            return 0;
        }
    }
    snprintf(reason, len, "all %u participants share host %s; host memory through memfd buckets",
             g->nsenders + g->nreceivers, g->senders[0].hostname);
    return 100;
}

/* ---- sender ------------------------------------------------------------------------------------ */

static void ipc_sender_teardown(wsync_sender_t *s)
{
    ipc_sender_t *st = s->m.scheme_state;

    if (st == NULL)
        return;
    for (int r = 0; r < s->m.nreceivers; r++)
        if (st->rconn[r] != NULL) {
            atomic_store(&st->rconn[r]->leaving, 1);
            wsync_conn_send(st->rconn[r], WSYNC_MSG_BYE, NULL, 0, NULL, 0, 100);
        }
    wsync_shm_release(&st->shm);
    free(st->inplace);
    free(st->staged);
    free(st->chunk_start);
    free(st->need);
    free(st->pending);
    free(st->owed);
    free(st->rconn);
    free(st->needs_any);
    free(st);
    s->m.scheme_state = NULL;
}

static wsync_status_t ipc_sender_setup(wsync_sender_t *s)
{
    const wsync_plan_t *plan = s->m.plan;
    uint32_t me = (uint32_t)s->m.rank, nr = plan->nreceivers;
    const uint16_t hello_t[] = {WSYNC_MSG_DATA_HELLO};
    int64_t deadline = wsync_deadline_in(s->m.timeout_ms);
    ipc_sender_t *st = calloc(1, sizeof(*st));
    uint32_t expected = 0, connected = 0, c0;
    wsync_status_t rc;

    if (st == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
    s->m.scheme_state = st;
    st->shm.fd = -1;
    st->nbuckets = plan->nbuckets[me];
    st->first_bucket = bucket_base(plan, me);
    st->chunk_start = calloc(st->nbuckets + 1, sizeof(uint32_t));
    st->need = calloc((size_t)st->nbuckets * nr + 1, 1);
    st->pending = calloc(st->nbuckets + 1, sizeof(uint32_t));
    st->owed = calloc((size_t)st->nbuckets * nr + 1, 1);
    st->rconn = calloc(nr, sizeof(*st->rconn));
    st->needs_any = calloc(nr, 1);
    st->verify = s->m.ctx->verify;
    if (!st->chunk_start || !st->need || !st->pending || !st->owed || !st->rconn || !st->needs_any)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for the schedule");

    /* chunks are ordered by (sender, bucket, offset): find our range and its bucket bounds */
    for (c0 = 0; c0 < plan->nchunks && plan->chunks[c0].sender < me; c0++)
        ;
    {
        uint32_t c = c0;
        for (uint32_t k = 0; k <= st->nbuckets; k++) {
            while (c < plan->nchunks && plan->chunks[c].sender == me && plan->chunks[c].bucket < k)
                c++;
            st->chunk_start[k] = c;
        }
    }
    for (uint32_t i = 0; i < plan->nsegments; i++) {
        const wsync_chunk_t *c = &plan->chunks[plan->segments[i].chunk];
        if (c->sender != me)
            continue;
        st->need[(size_t)c->bucket * nr + plan->segments[i].receiver] = 1;
        if (!st->needs_any[plan->segments[i].receiver]) {
            st->needs_any[plan->segments[i].receiver] = 1;
            expected++;
        }
    }
    /* shards in shareable memory are read in place; the rest is staged */
    st->inplace = calloc(s->nshards + 1, sizeof(*st->inplace));
    st->staged = calloc(st->nbuckets + 1, 1);
    if (st->inplace == NULL || st->staged == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for the schedule");
    for (size_t i = 0; i < s->nshards; i++) {
        const wsync_shard_desc_t *d = &s->shards[i];
        uint64_t bytes = wsync_dtype_size(d->param.dtype);
        wsync_alloc_t a;
        st->inplace[i].region = -1;
        for (int k = 0; k < d->param.ndim; k++)
            bytes *= (uint64_t)d->box.len[k];
        if (bytes == 0 || !wsync_ctx_find_alloc(s->m.ctx, s->shard_data[i], bytes, &a))
            continue;
        uint32_t g;
        for (g = 0; g < st->nregions && st->region_fds[g] != a.fd; g++)
            ;
        if (g == st->nregions) {
            if (st->nregions == MAX_FDS - 1) {
                WSYNC_LOG_W("ipc: sender %u: more than %d shareable regions; param '%s' is staged",
                            me, MAX_FDS - 1, d->param.name);
                continue;
            }
            st->region_fds[st->nregions] = a.fd;
            st->region_bytes[st->nregions++] = a.bytes;
        }
        st->inplace[i].region = (int32_t)g;
        st->inplace[i].offset = (uint64_t)((const uint8_t *)s->shard_data[i] - (uint8_t *)a.base);
    }
    uint32_t nstaged = 0;
    for (uint32_t k = 0; k < st->nbuckets; k++) {
        for (uint32_t c = st->chunk_start[k]; c < st->chunk_start[k + 1]; c++)
            if (st->inplace[plan->chunks[c].shard].region < 0)
                st->staged[k] = 1;
        if (st->staged[k]) {
            nstaged++;
            st->slot_bytes = WSYNC_MAX(st->slot_bytes, plan->bucket_used[st->first_bucket + k]);
        }
    }
    st->slot_bytes = (st->slot_bytes + PAGE - 1) / PAGE * PAGE;
    st->nslots = WSYNC_MIN(nstaged, IPC_SLOTS);
    if (st->nslots > 0) {
        char label[64];
        snprintf(label, sizeof(label), "wsync-sender-%u", me);
        rc = wsync_shm_create(label, (size_t)st->nslots * st->slot_bytes, &st->shm);
        if (rc != WSYNC_OK)
            return rc;
    }
    /* every receiver that needs our buckets connects once and gets the segment's descriptor */
    while (connected < expected) {
        wsync_msg_t *msg;
        wsync_rbuf_t r;
        uint32_t rank, pid;

        rc = wsync_inbox_pop(&s->m.inbox, hello_t, 1, deadline, &msg);
        if (rc == WSYNC_ERR_TIMEOUT) {
            char missing[256] = "";
            size_t n = 0;
            for (uint32_t i = 0; i < nr; i++)
                if (st->needs_any[i] && st->rconn[i] == NULL && n + 12 < sizeof(missing))
                    n += (size_t)snprintf(missing + n, sizeof(missing) - n, "%s%u", n ? ", " : "", i);
            return wsync_err(rc, "ipc: sender %u: receivers %s did not connect for data within %d "
                             "ms", me, missing, s->m.timeout_ms);
        }
        if (rc != WSYNC_OK)
            return rc;
        wsync_rbuf_init(&r, msg->payload, msg->len);
        rank = wsync_get_u32(&r);
        pid = wsync_get_u32(&r);
        if (wsync_rbuf_left(&r) >= 4 && (wsync_get_u32(&r) & 1u))
            st->verify = 1;   /* this receiver verifies: ship checksums to all */
        if (r.err || rank >= nr || !st->needs_any[rank] || st->rconn[rank] != NULL) {
            wsync_loop_close(s->m.loop, msg->conn, WSYNC_ERR_PROTOCOL, "unexpected DATA_HELLO");
            wsync_msg_free(msg);
            return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: sender %u: unexpected data connection "
                             "from receiver %u", me, rank);
        }
        st->rconn[rank] = msg->conn;
        pthread_mutex_lock(&msg->conn->send_lock);
        snprintf(msg->conn->name, sizeof(msg->conn->name), "receiver %u (pid %u)", rank, pid);
        pthread_mutex_unlock(&msg->conn->send_lock);
        wsync_msg_free(msg);
        {
            /* payload: nslots, slot_bytes, the regions' sizes, then where each in-place shard
             * lies; descriptors: the bucket memfd (if any slots), then the regions */
            wsync_wbuf_t b;
            int fds[MAX_FDS], nfds = 0;
            uint32_t ninplace = 0;
            wsync_wbuf_init(&b);
            wsync_put_u32(&b, st->nslots);
            wsync_put_u64(&b, st->slot_bytes);
            wsync_put_u32(&b, st->nregions);
            for (uint32_t g = 0; g < st->nregions; g++)
                wsync_put_u64(&b, st->region_bytes[g]);
            for (size_t i = 0; i < s->nshards; i++)
                ninplace += st->inplace[i].region >= 0;
            wsync_put_u32(&b, ninplace);
            for (size_t i = 0; i < s->nshards; i++) {
                if (st->inplace[i].region < 0)
                    continue;
                wsync_put_u32(&b, (uint32_t)i);
                wsync_put_u32(&b, (uint32_t)st->inplace[i].region);
                wsync_put_u64(&b, st->inplace[i].offset);
            }
            if (st->nslots > 0)
                fds[nfds++] = st->shm.fd;
            for (uint32_t g = 0; g < st->nregions; g++)
                fds[nfds++] = st->region_fds[g];
            rc = b.err ? wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory")
                       : wsync_conn_send(st->rconn[rank], WSYNC_MSG_DATA_FDS, b.data,
                                         (uint32_t)b.len, fds, nfds, s->m.timeout_ms);
            wsync_wbuf_free(&b);
        }
        if (rc != WSYNC_OK)
            return rc;
        connected++;
    }
    WSYNC_LOG_I("ipc: sender %u: %u buckets (%u staged) in %u slots of %llu bytes, %u shared "
                "regions, %u receivers", me, st->nbuckets, nstaged, st->nslots,
                (unsigned long long)st->slot_bytes, st->nregions, expected);
    return WSYNC_OK;
}

static int rank_of_conn(const ipc_sender_t *st, uint32_t nr, const wsync_conn_t *c)
{
    for (uint32_t r = 0; r < nr; r++)
        if (st->rconn[r] == c)
            return (int)r;
    return -1;
}

/* Take RELEASE messages until bucket k has none due. */
static wsync_status_t await_release(wsync_sender_t *s, ipc_sender_t *st, uint64_t version, uint32_t k)
{
    const uint16_t types[] = {WSYNC_MSG_RELEASE};
    uint32_t nr = s->m.plan->nreceivers;

    while (st->pending[k] > 0) {
        wsync_msg_t *msg;
        wsync_rbuf_t r;
        wsync_status_t rc = wsync_inbox_pop(&s->m.inbox, types, 1,
                                            wsync_deadline_in(s->m.timeout_ms), &msg);
        if (rc == WSYNC_ERR_TIMEOUT) {
            char who[512] = "";
            size_t n = 0;
            for (uint32_t i = 0; i < nr; i++) {
                if (!st->owed[(size_t)k * nr + i] || n + 1 >= sizeof(who))
                    continue;
                pthread_mutex_lock(&st->rconn[i]->send_lock);   /* its name may be rewritten */
                n += (size_t)snprintf(who + n, sizeof(who) - n, "%s%s", n ? ", " : "",
                                      st->rconn[i]->name);
                pthread_mutex_unlock(&st->rconn[i]->send_lock);
            }
            return wsync_err(rc, "ipc: sender %d: version %llu: bucket %u not released within %d ms "
                             "by %s", s->m.rank, (unsigned long long)version, k, s->m.timeout_ms,
                             who);
        }
        if (rc != WSYNC_OK)
            return rc;
        wsync_rbuf_init(&r, msg->payload, msg->len);
        uint64_t v = wsync_get_u64(&r);
        uint32_t b = wsync_get_u32(&r);
        int rank = rank_of_conn(st, nr, msg->conn);
        wsync_msg_free(msg);
        if (r.err || v != version || b >= st->nbuckets || rank < 0 ||
            !st->need[(size_t)b * nr + (uint32_t)rank] || st->pending[b] == 0)
            return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: sender %d: unexpected RELEASE of bucket %u "
                             "version %llu from receiver %d", s->m.rank, b, (unsigned long long)v,
                             rank);
        st->pending[b]--;
        st->owed[(size_t)b * nr + (uint32_t)rank] = 0;
    }
    return WSYNC_OK;
}

static wsync_status_t ipc_sender_push(wsync_sender_t *s, uint64_t version)
{
    ipc_sender_t *st = s->m.scheme_state;
    const wsync_plan_t *plan = s->m.plan;
    uint32_t nr = plan->nreceivers;
    wsync_status_t rc;

    uint32_t next_slot = 0;

    for (uint32_t i = 0; i < IPC_SLOTS; i++)
        st->last_in_slot[i] = -1;
    for (uint32_t k = 0; k < st->nbuckets; k++) {
        uint32_t slot = NO_SLOT;
        wsync_wbuf_t b;

        if (st->staged[k]) {
            /* refill a slot only once its previous bucket was released by all who needed it */
            slot = next_slot;
            next_slot = (next_slot + 1) % st->nslots;
            if (st->last_in_slot[slot] >= 0 &&
                (rc = await_release(s, st, version, (uint32_t)st->last_in_slot[slot])) != WSYNC_OK)
                return rc;
            st->last_in_slot[slot] = k;
            uint8_t *base = (uint8_t *)st->shm.base + (size_t)slot * st->slot_bytes;
            for (uint32_t c = st->chunk_start[k]; c < st->chunk_start[k + 1]; c++) {
                const wsync_chunk_t *ch = &plan->chunks[c];
                if (st->inplace[ch->shard].region >= 0)
                    continue;
                wsync_exec_pack(ch, s->shard_data[ch->shard], base);
                s->stats.bytes_packed += chunk_bytes(ch);
            }
            s->stats.buckets++;
        }
        wsync_wbuf_init(&b);
        wsync_put_u64(&b, version);
        wsync_put_u32(&b, k);
        wsync_put_u32(&b, slot);
        if (st->verify) {
            /* from the shard itself: whatever happens to the bytes after this, the receiver sees */
            wsync_put_u32(&b, st->chunk_start[k + 1] - st->chunk_start[k]);
            for (uint32_t c = st->chunk_start[k]; c < st->chunk_start[k + 1]; c++)
                wsync_put_u64(&b, wsync_exec_hash(s->shard_data[plan->chunks[c].shard],
                                                  plan->chunks[c].dtype, &plan->chunks[c].src));
        }
        switch (WSYNC_FAULT(WSYNC_FAULT_PUSH_BUCKET)) {
        case WSYNC_FAULT_FAIL: {
            char where[128];
            snprintf(where, sizeof(where), "ipc sender %d, bucket %u of version %llu", s->m.rank,
                     k, (unsigned long long)version);
            wsync_wbuf_free(&b);
            return wsync_fault_err(WSYNC_FAULT_PUSH_BUCKET, where);
        }
        case WSYNC_FAULT_CORRUPT:   /* in the staging slot: what the receivers copy from */
            for (uint32_t c = st->chunk_start[k]; c < st->chunk_start[k + 1] && slot != NO_SLOT; c++) {
                if (st->inplace[plan->chunks[c].shard].region >= 0)
                    continue;
                wsync_fault_flip((uint8_t *)st->shm.base + (size_t)slot * st->slot_bytes +
                                     plan->chunks[c].bucket_off, chunk_bytes(&plan->chunks[c]));
                break;
            }
            if (slot == NO_SLOT)
                WSYNC_LOG_W("ipc: sender %d: bucket %u is read in place: nothing staged to "
                            "corrupt", s->m.rank, k);
            break;
        default:
            break;
        }
        if (b.err) {
            wsync_wbuf_free(&b);
            return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for READY");
        }
        for (uint32_t r = 0; r < nr; r++) {
            if (!st->need[(size_t)k * nr + r])
                continue;
            rc = wsync_conn_send(st->rconn[r], WSYNC_MSG_READY, b.data, (uint32_t)b.len, NULL, 0,
                                 s->m.timeout_ms);
            if (rc != WSYNC_OK) {
                wsync_wbuf_free(&b);
                return rc;
            }
            st->pending[k]++;
            st->owed[(size_t)k * nr + r] = 1;
        }
        wsync_wbuf_free(&b);
    }
    for (uint32_t k = 0; k < st->nbuckets; k++)
        if ((rc = await_release(s, st, version, k)) != WSYNC_OK)
            return rc;
    for (uint32_t r = 0; r < nr; r++)
        s->stats.bytes_delivered += plan->pair_bytes[(size_t)s->m.rank * nr + r];
    return WSYNC_OK;
}

/* ---- receiver ---------------------------------------------------------------------------------- */

static void ipc_receiver_teardown(wsync_receiver_t *r)
{
    ipc_receiver_t *st = r->m.scheme_state;

    if (st == NULL)
        return;
    for (uint32_t s = 0; s < st->nsenders; s++) {
        ipc_from_t *f = &st->from[s];
        if (f->conn != NULL) {
            atomic_store(&f->conn->leaving, 1);
            wsync_conn_send(f->conn, WSYNC_MSG_BYE, NULL, 0, NULL, 0, 100);
        }
        wsync_shm_release(&f->shm);
        for (uint32_t g = 0; g < f->nregions; g++)
            wsync_shm_release(&f->regions[g]);
        free(f->inplace);
        free(f->seg_start);
        free(f->chunk_start);
        free(f->done);
    }
    free(st->from);
    free(st->sums);
    free(st);
    r->m.scheme_state = NULL;
}

/* Map what a sender shared (bucket slots, in-place regions) and check that every read our plan
 * makes from it stays inside. Takes the message's descriptors. */
static wsync_status_t take_data_fds(wsync_receiver_t *r, ipc_from_t *f, wsync_msg_t *msg)
{
    const wsync_plan_t *plan = r->m.plan;
    uint64_t region_bytes[MAX_FDS];
    wsync_rbuf_t rb;
    wsync_status_t rc = WSYNC_OK;
    int me = r->m.rank;

    if (f == NULL || f->nslots != 0 || f->nregions != 0 || f->inplace != NULL)
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: unexpected DATA_FDS", me);
    wsync_rbuf_init(&rb, msg->payload, msg->len);
    uint32_t nslots = wsync_get_u32(&rb);
    uint64_t slot_bytes = wsync_get_u64(&rb);
    uint32_t nregions = wsync_get_u32(&rb);
    if (rb.err || nslots > IPC_SLOTS || nregions >= MAX_FDS ||
        (uint32_t)msg->nfds != (nslots > 0) + nregions || (nslots > 0 && slot_bytes == 0) ||
        slot_bytes > (1ull << 40))
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: malformed DATA_FDS from %s", me,
                         msg->conn->name);
    for (uint32_t g = 0; g < nregions; g++)
        region_bytes[g] = wsync_get_u64(&rb);
    uint32_t ninplace = wsync_get_count(&rb, 16);
    uint32_t maxshard = 0;
    for (uint32_t i = f->seg_start[0]; i < f->seg_start[f->nbuckets]; i++)
        maxshard = WSYNC_MAX(maxshard, plan->chunks[plan->segments[i].chunk].shard + 1);
    f->ninplace_slots = maxshard;
    f->inplace = calloc(maxshard + 1, sizeof(*f->inplace));
    if (f->inplace == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
    for (uint32_t i = 0; i < maxshard; i++)
        f->inplace[i].region = -1;
    for (uint32_t i = 0; i < ninplace; i++) {
        uint32_t shard = wsync_get_u32(&rb), g = wsync_get_u32(&rb);
        uint64_t off = wsync_get_u64(&rb);
        if (rb.err || g >= nregions)
            return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: malformed DATA_FDS table", me);
        if (shard < maxshard) {
            f->inplace[shard].region = (int32_t)g;
            f->inplace[shard].offset = off;
        }
    }
    if (rb.err || wsync_rbuf_left(&rb) != 0)
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: malformed DATA_FDS table", me);
    /* every read must stay inside the slot or region it comes from */
    for (uint32_t i = f->seg_start[0]; i < f->seg_start[f->nbuckets]; i++) {
        const wsync_chunk_t *c = &plan->chunks[plan->segments[i].chunk];
        const ipc_inplace_t *ip = &f->inplace[c->shard];
        uint64_t esz = wsync_dtype_size(c->dtype);
        if (ip->region >= 0) {
            /* end = offset + (off + (rows - 1) * pitch + cols) * esz, refusing any wrap: the
             * plan only promises the element count fits, not the byte count */
            uint64_t end = 0;
            int wrap = c->src.rows == 0 ||
                       wsync_mul_u64(c->src.rows - 1, c->src.pitch, &end) != 0 ||
                       wsync_add_u64(end, c->src.off, &end) != 0 ||
                       wsync_add_u64(end, c->src.cols, &end) != 0 ||
                       wsync_mul_u64(end, esz, &end) != 0 ||
                       wsync_add_u64(end, ip->offset, &end) != 0;
            if (wrap || end > region_bytes[ip->region])
                return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: sender %u's shard %u "
                                 "lies outside the memory it shared", me, c->sender, c->shard);
        } else if (nslots == 0 || c->bucket_off + chunk_bytes(c) > slot_bytes) {
            return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: sender %u's slots (%llu bytes) "
                             "cannot hold its plan", me, c->sender, (unsigned long long)slot_bytes);
        }
    }
    int k = 0;
    if (nslots > 0) {
        rc = wsync_shm_map_fd(msg->fds[k], (size_t)nslots * slot_bytes, &f->shm);
        msg->fds[k++] = -1;   /* taken, even on failure */
        if (rc != WSYNC_OK)
            return rc;
    }
    f->nslots = nslots;
    f->slot_bytes = slot_bytes;
    for (uint32_t g = 0; g < nregions; g++) {
        rc = wsync_shm_map_fd(msg->fds[k], region_bytes[g], &f->regions[g]);
        msg->fds[k++] = -1;
        if (rc != WSYNC_OK)
            return rc;
        f->nregions++;
    }
    return WSYNC_OK;
}

static wsync_status_t ipc_receiver_setup(wsync_receiver_t *r)
{
    const wsync_plan_t *plan = r->m.plan;
    uint32_t me = (uint32_t)r->m.rank, ns = plan->nsenders, lo, hi, nconn = 0;
    const uint16_t fds_t[] = {WSYNC_MSG_DATA_FDS};
    int64_t deadline = wsync_deadline_in(r->m.timeout_ms);
    ipc_receiver_t *st = calloc(1, sizeof(*st));
    wsync_status_t rc;

    if (st == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
    r->m.scheme_state = st;
    st->nsenders = ns;
    st->from = calloc(ns, sizeof(*st->from));
    if (st->from == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
    /* segments are ordered by (receiver, chunk) and chunks by (sender, bucket): ours form one
     * run, grouped by sender and bucket */
    for (lo = 0; lo < plan->nsegments && plan->segments[lo].receiver < me; lo++)
        ;
    for (hi = lo; hi < plan->nsegments && plan->segments[hi].receiver == me; hi++)
        ;
    for (uint32_t s = 0; s < ns; s++) {
        ipc_from_t *f = &st->from[s];
        uint32_t i = lo;
        f->shm.fd = -1;
        for (uint32_t g = 0; g < MAX_FDS; g++)
            f->regions[g].fd = -1;
        f->nbuckets = plan->nbuckets[s];
        f->seg_start = calloc(f->nbuckets + 1, sizeof(uint32_t));
        f->chunk_start = calloc(f->nbuckets + 1, sizeof(uint32_t));
        f->done = calloc(f->nbuckets + 1, 1);
        f->pid = r->m.planmsg.peers[s].pid;
        if (f->seg_start == NULL || f->chunk_start == NULL || f->done == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
        /* chunks are ordered by (sender, bucket): READY's checksums follow that order */
        {
            uint32_t c = 0;
            while (c < plan->nchunks && plan->chunks[c].sender < s)
                c++;
            for (uint32_t k = 0; k <= f->nbuckets; k++) {
                while (c < plan->nchunks && plan->chunks[c].sender == s && plan->chunks[c].bucket < k)
                    c++;
                f->chunk_start[k] = c;
            }
        }
        while (i < hi && plan->chunks[plan->segments[i].chunk].sender < s)
            i++;
        for (uint32_t k = 0; k <= f->nbuckets; k++) {
            while (i < hi && plan->chunks[plan->segments[i].chunk].sender == s &&
                   plan->chunks[plan->segments[i].chunk].bucket < k)
                i++;
            f->seg_start[k] = i;
            if (k > 0 && f->seg_start[k] > f->seg_start[k - 1])
                f->needed++;
        }
    }
    for (uint32_t i = lo; i < hi; i++) {
        const wsync_segment_t *sg = &plan->segments[i];
        st->bytes_total += sg->dst.rows * sg->dst.cols * wsync_dtype_size(r->land_dtype[sg->target]);
    }
    /* connect to each sender we need and ask for its buckets */
    for (uint32_t s = 0; s < ns; s++) {
        ipc_from_t *f = &st->from[s];
        const wsync_peer_t *peer = &r->m.planmsg.peers[s];
        char name[128];
        int fd;
        wsync_wbuf_t b;

        if (f->needed == 0)
            continue;
        rc = wsync_unix_connect(peer->data_addr, &fd);
        if (rc != WSYNC_OK)
            return rc;
        snprintf(name, sizeof(name), "sender %u (pid %u)", s, peer->pid);
        rc = wsync_loop_add(r->m.loop, fd, WSYNC_CONN_UNIX, name, NULL, &f->conn);
        if (rc != WSYNC_OK)
            return rc;
        wsync_wbuf_init(&b);
        wsync_put_u32(&b, me);
        wsync_put_u32(&b, (uint32_t)getpid());
        wsync_put_u32(&b, r->m.ctx->verify ? 1u : 0u);   /* bit 0: send me checksums */
        rc = wsync_conn_send(f->conn, WSYNC_MSG_DATA_HELLO, b.data, (uint32_t)b.len, NULL, 0,
                             r->m.timeout_ms);
        wsync_wbuf_free(&b);
        if (rc != WSYNC_OK)
            return rc;
        nconn++;
    }
    while (nconn > 0) {
        wsync_msg_t *msg;
        ipc_from_t *f = NULL;
        uint32_t s;

        rc = wsync_inbox_pop(&r->m.inbox, fds_t, 1, deadline, &msg);
        if (rc == WSYNC_ERR_TIMEOUT)
            return wsync_err(rc, "ipc: receiver %u: %u senders did not share their buckets within "
                             "%d ms", me, nconn, r->m.timeout_ms);
        if (rc != WSYNC_OK)
            return rc;
        for (s = 0; s < ns; s++)
            if (st->from[s].conn == msg->conn)
                f = &st->from[s];
        rc = take_data_fds(r, f, msg);
        wsync_msg_free(msg);
        if (rc != WSYNC_OK)
            return rc;
        nconn--;
    }
    return WSYNC_OK;
}

/* "sender 1 (pid 42): 2 buckets": whom a receiver still waits on in this version. */
static void waiting_on(const ipc_receiver_t *st, char *buf, size_t len)
{
    size_t n = 0;

    buf[0] = '\0';
    for (uint32_t s = 0; s < st->nsenders && n + 1 < len; s++) {
        const ipc_from_t *f = &st->from[s];
        uint32_t missing = 0;
        for (uint32_t k = 0; k < f->nbuckets; k++)
            missing += f->seg_start[k] < f->seg_start[k + 1] && !f->done[k];
        if (missing > 0)
            n += (size_t)snprintf(buf + n, len - n, "%ssender %u (pid %u): %u bucket%s",
                                  n ? ", " : "", s, f->pid, missing, missing == 1 ? "" : "s");
    }
}

/* Check every segment of bucket k of sender s against the checksums READY brought: the bytes as
 * they landed when no cast came between, else the source bytes the cast read. */
static wsync_status_t verify_bucket(wsync_receiver_t *r, const ipc_from_t *f, uint32_t s,
                                    uint32_t k, uint64_t version, const uint64_t *sums,
                                    const uint8_t *base)
{
    const wsync_plan_t *plan = r->m.plan;

    for (uint32_t i = f->seg_start[k]; i < f->seg_start[k + 1]; i++) {
        const wsync_segment_t *sg = &plan->segments[i];
        const wsync_chunk_t *c = &plan->chunks[sg->chunk];
        const ipc_inplace_t *ip = &f->inplace[c->shard];
        uint64_t got;
        if (r->land_dtype[sg->target] == c->dtype) {
            got = wsync_exec_hash(r->land[sg->target], c->dtype, &sg->dst);
        } else if (ip->region >= 0) {
            got = wsync_exec_hash((const uint8_t *)f->regions[ip->region].base + ip->offset,
                                  c->dtype, &c->src);
        } else {
            wsync_region_t dense = {0, c->src.cols, c->src.rows, c->src.cols};
            got = wsync_exec_hash(base + c->bucket_off, c->dtype, &dense);
        }
        uint64_t want = sums[sg->chunk - f->chunk_start[k]];
        if (got != want) {
            const wsync_target_desc_t *t = &r->targets[sg->target];
            return wsync_err(WSYNC_ERR_INTEGRITY, "receiver %d: version %llu refused: param '%s' "
                             "(target '%s') from sender %u (pid %u), chunk %u (bucket %u, %llu x "
                             "%llu %s): the sender's xxh3 is %016llx, what landed hashes to %016llx",
                             r->m.rank, (unsigned long long)version, t->pieces[sg->piece].param.name,
                             t->name, s, f->pid, sg->chunk, k, (unsigned long long)c->src.rows,
                             (unsigned long long)c->src.cols, wsync_dtype_name(c->dtype),
                             (unsigned long long)want, (unsigned long long)got);
        }
    }
    return WSYNC_OK;
}

static wsync_status_t ipc_receiver_recv(wsync_receiver_t *r, uint64_t version)
{
    ipc_receiver_t *st = r->m.scheme_state;
    const wsync_plan_t *plan = r->m.plan;
    const uint16_t types[] = {WSYNC_MSG_READY};
    uint32_t remaining = 0, total;
    uint64_t bytes_done = 0;
    wsync_status_t rc;

    for (uint32_t s = 0; s < st->nsenders; s++) {
        remaining += st->from[s].needed;
        memset(st->from[s].done, 0, st->from[s].nbuckets);
    }
    total = remaining;
    uint64_t t0 = wsync_now_ns();
    while (remaining > 0) {
        wsync_msg_t *msg;
        wsync_rbuf_t rb;
        ipc_from_t *f = NULL;
        uint32_t s, nsums = 0;
        int has_sums;

        /* a quarter longer than a sender's wait for a RELEASE: a sender held up by another
         * receiver names that receiver before this wait blames the sender */
        int wait_ms = (int)WSYNC_MIN((int64_t)r->m.timeout_ms * 5 / 4, INT_MAX);
        rc = wsync_inbox_pop(&r->m.inbox, types, 1, wsync_deadline_in(wait_ms), &msg);
        if (rc == WSYNC_ERR_TIMEOUT) {
            char who[512];
            waiting_on(st, who, sizeof(who));
            return wsync_err(rc, "ipc: receiver %d: version %llu: no bucket for %d ms (%u of %u "
                             "received; waiting on %s)", r->m.rank, (unsigned long long)version,
                             wait_ms, total - remaining, total, who);
        }
        if (rc != WSYNC_OK)
            return rc;
        for (s = 0; s < st->nsenders && f == NULL; s++)
            if (st->from[s].conn == msg->conn)
                f = &st->from[s];
        s--;

        wsync_rbuf_init(&rb, msg->payload, msg->len);
        uint64_t v = wsync_get_u64(&rb);
        uint32_t k = wsync_get_u32(&rb);
        uint32_t slot = wsync_get_u32(&rb);
        has_sums = wsync_rbuf_left(&rb) > 0;
        if (has_sums) {
            nsums = wsync_get_count(&rb, 8);
            if (!rb.err && nsums > st->sums_cap) {
                uint64_t *ns = realloc(st->sums, (size_t)nsums * sizeof(*ns));
                if (ns == NULL) {
                    wsync_msg_free(msg);
                    return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for %u checksums", nsums);
                }
                st->sums = ns;
                st->sums_cap = nsums;
            }
            for (uint32_t i = 0; i < nsums && !rb.err; i++)
                st->sums[i] = wsync_get_u64(&rb);
        }
        wsync_conn_t *conn = msg->conn;
        wsync_msg_free(msg);
        if (f == NULL || rb.err || v != version || k >= f->nbuckets ||
            (slot != NO_SLOT && slot >= f->nslots) || f->done[k] ||
            f->seg_start[k] == f->seg_start[k + 1] ||
            (has_sums && nsums != f->chunk_start[k + 1] - f->chunk_start[k]))
            return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: unexpected READY (version "
                             "%llu, bucket %u, slot %u) while receiving version %llu", r->m.rank,
                             (unsigned long long)v, k, slot, (unsigned long long)version);
        if (r->m.ctx->verify && !has_sums)
            return wsync_err(WSYNC_ERR_INTEGRITY, "ipc: receiver %d: version %llu refused: it "
                             "cannot be verified, sender %u (pid %u) sent bucket %u without "
                             "checksums", r->m.rank, (unsigned long long)version, s, f->pid, k);
        const uint8_t *base = slot == NO_SLOT ? NULL
                                              : (const uint8_t *)f->shm.base + (size_t)slot * f->slot_bytes;
        r->torn = 1;   /* the targets no longer hold only the last version */
        for (uint32_t i = f->seg_start[k]; i < f->seg_start[k + 1]; i++) {
            const wsync_segment_t *sg = &plan->segments[i];
            const wsync_chunk_t *c = &plan->chunks[sg->chunk];
            const ipc_inplace_t *ip = &f->inplace[c->shard];
            void *dst = r->land[sg->target];
            wsync_dtype_t dst_dtype = r->land_dtype[sg->target];
            if (ip->region >= 0) {   /* straight from the sender's shard */
                const uint8_t *shard = (const uint8_t *)f->regions[ip->region].base + ip->offset;
                rc = wsync_exec_copy(shard, c->dtype, &c->src, dst, dst_dtype, &sg->dst);
            } else if (base == NULL) {
                rc = wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: bucket %u of sender %u "
                               "came without a slot", r->m.rank, k, c->sender);
            } else {
                rc = wsync_exec_unpack(sg, c, base, dst_dtype, dst);
            }
            if (rc != WSYNC_OK)
                return rc;
            bytes_done += sg->dst.rows * sg->dst.cols * wsync_dtype_size(dst_dtype);
        }
        switch (WSYNC_FAULT(WSYNC_FAULT_RECV_UNPACK)) {
        case WSYNC_FAULT_FAIL: {
            char where[128];
            snprintf(where, sizeof(where), "ipc receiver %d, bucket %u of sender %u, version %llu",
                     r->m.rank, k, s, (unsigned long long)version);
            return wsync_fault_err(WSYNC_FAULT_RECV_UNPACK, where);
        }
        case WSYNC_FAULT_CORRUPT: {   /* in the target, in the first row the bucket filled */
            const wsync_segment_t *sg = &plan->segments[f->seg_start[k]];
            size_t esz = wsync_dtype_size(r->land_dtype[sg->target]);
            wsync_fault_flip((uint8_t *)r->land[sg->target] + sg->dst.off * esz,
                             (size_t)sg->dst.cols * esz);
            break;
        }
        default:
            break;
        }
        if (r->m.ctx->verify && (rc = verify_bucket(r, f, s, k, version, st->sums, base)) != WSYNC_OK)
            return rc;
        f->done[k] = 1;
        remaining--;
        {
            wsync_wbuf_t b;
            wsync_wbuf_init(&b);
            wsync_put_u64(&b, version);
            wsync_put_u32(&b, k);
            rc = wsync_conn_send(conn, WSYNC_MSG_RELEASE, b.data, (uint32_t)b.len, NULL, 0,
                                 r->m.timeout_ms);
            wsync_wbuf_free(&b);
            if (rc != WSYNC_OK)
                return rc;
        }
        if (r->progress != NULL)
            r->progress(r->progress_arg, version, bytes_done, st->bytes_total);
    }
    double secs = (double)(wsync_now_ns() - t0) / 1e9;
    WSYNC_LOG_D("ipc: receiver %d: version %llu: %llu bytes landed in %.4f s (%.2f GB/s)",
                r->m.rank, (unsigned long long)version, (unsigned long long)bytes_done, secs,
                secs > 0 ? (double)bytes_done / secs / 1e9 : 0.0);
    return WSYNC_OK;
}

static wsync_status_t ipc_receiver_fetch(wsync_receiver_t *r, uint64_t version, int timeout_ms,
                                         uint64_t *got)
{
    (void)version;
    (void)timeout_ms;
    (void)got;
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "scheme 'ipc' delivers versions as they are pushed "
                     "(receiver %d)", r->m.rank);
}

const wsync_scheme_ops_t wsync_scheme_ipc = {
    .name = "ipc",
    .implemented = 1,
    .score = ipc_score,
    .sender_setup = ipc_sender_setup,
    .sender_push = ipc_sender_push,
    .sender_teardown = ipc_sender_teardown,
    .receiver_setup = ipc_receiver_setup,
    .receiver_recv = ipc_receiver_recv,
    .receiver_fetch = ipc_receiver_fetch,
    .receiver_teardown = ipc_receiver_teardown,
};
