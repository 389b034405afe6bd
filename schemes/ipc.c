/* The 'ipc' scheme: every participant on one node (and network namespace). Shards that lie in
 * memory from wsync_mem_alloc are shared once (their memfds) and read in place by the receivers:
 * no staging copy. Other chunks are packed into a memfd of `nslots` bucket slots (double-buffered),
 * also shared once. Descriptors travel over an abstract Unix socket. Per bucket of the plan's
 * schedule, READY tells a receiver that the bucket may be read (and in which slot its staged
 * chunks are); the receiver copies out only its segments and answers RELEASE; a slot is refilled
 * only once every receiver that needed its previous bucket released it. Nothing has a name, so
 * nothing outlives the processes. With verification on (WSYNC_VERIFY, at the sender or asked for
 * by a receiver in DATA_HELLO), READY also carries the xxh3 of each of the bucket's chunks, taken
 * from the shard, which the receiver checks against what landed.
 *
 * CUDA memory (issue 4). A receiver says in DATA_HELLO whether segments from this sender land in
 * its host targets, in its CUDA targets, and which GPUs (UUIDs) its own GPU can read. Each CUDA
 * shard is then, in this order of preference:
 *  - read in place, through cuda_ipc (cudaMalloc handle or cuMemCreate fds), when every receiver
 *    that needs it lands it in CUDA targets on a GPU that can read the sender's (same GPU or
 *    peer access); the sender never touches it, so READY goes out for all such buckets at once;
 *  - packed by a batch kernel into device bucket slots (cudaMalloc, shared through cuda_ipc) when
 *    those receivers can read the sender's GPU but the memory cannot be shared (a memory pool,
 *    managed memory, cuMemCreate without POSIX fds: logged once per param);
 *  - else packed by a batch kernel into the memfd host slots, pinned with cudaHostRegister (the
 *    kernel writes host memory through UVA: device to host), which every receiver can read.
 * A receiver executes the segments that land in CUDA targets with one batch-kernel launch per
 * bucket, built once at setup (and again only when wsync_receiver_set_target_data moved a target:
 * the last two pointer sets are kept, so shadow mode's swaps rebuild nothing after the second
 * version); host memory it reads (memfd slots and regions) is registered read-only. It launches
 * bucket after bucket on one stream and sends each RELEASE when that bucket's event completes,
 * polling events and the inbox against the deadline. Segments into host targets are copied by
 * the CPU as before, so a sender stages CUDA shards into host slots for receivers that want them.
 * With verification on, CUDA bytes are copied to the host to be hashed (slow, but exact).
 * FP8 targets (plan_qruns): a staged CUDA FP8 target whose every segment is read in place, each
 * sender's rows of it whole rows of scale cells, is quantized straight from the shards into the
 * target (core/quant_direct.c) instead of landing in its staging buffer: its runs launch on the
 * sender's stream after their last bucket's copies, several a kernel. On 4 H200s (FSDP-4 -> TP-4
 * colocated, Qwen3-8B shape) that took FP8-block from 1.26 to 1.18 x the bf16 time. */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/delta_state.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/objects.h"
#include "core/sock.h"
#include "core/util.h"
#include "kernels/device.h"
#include "reshard/exec.h"
#include "schemes/ipc_delta.h"
#include "schemes/ipc_internal.h"
#include "schemes/scheme.h"
#include "transports/cuda_ipc.h"
#include "transports/shm.h"
#include "wsync_build_config.h"

static uint32_t bucket_base(const wsync_plan_t *plan, uint32_t sender)
{
    uint32_t b = 0;
    for (uint32_t s = 0; s < sender; s++)
        b += plan->nbuckets[s];
    return b;
}

/* Bytes from a region's first element to just past its last (the region must not be empty). */
static uint64_t region_span(const wsync_region_t *g, size_t esz)
{
    return ((g->rows - 1) * g->pitch + g->cols) * esz;
}

/* xxh3 of a region of memory that may be on a device: copied to the host first (into *scratch,
 * grown as needed), then hashed as wsync_exec_hash does. */
wsync_status_t wsync_ipc_hash_any(const void *base, int on_device, wsync_dtype_t dtype,
                                  const wsync_region_t *g, uint8_t **scratch, size_t *cap,
                                  void *stream, int timeout_ms, uint64_t *out)
{
    size_t esz = wsync_dtype_size(dtype);
    wsync_status_t rc;

    if (!on_device || g->rows == 0 || g->cols == 0) {
        *out = wsync_exec_hash(base, dtype, g);
        return WSYNC_OK;
    }
    uint64_t span = region_span(g, esz);
    if (span > *cap) {
        uint8_t *p = realloc(*scratch, span);
        if (p == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory to check %llu bytes",
                             (unsigned long long)span);
        *scratch = p;
        *cap = span;
    }
    rc = wsync_dev_copy_to_host(*scratch, (const uint8_t *)base + g->off * esz, span, stream,
                                wsync_deadline_in(timeout_ms));
    if (rc != WSYNC_OK)
        return rc;
    wsync_region_t local = {0, g->pitch, g->rows, g->cols};
    *out = wsync_exec_hash(*scratch, dtype, &local);
    return WSYNC_OK;
}

/* One bit flipped in the middle of [p, p + len), on the host or a device (fault injection). */
wsync_status_t wsync_ipc_flip_any(void *p, int on_device, size_t len, void *stream,
                                  int timeout_ms)
{
    uint8_t byte;
    wsync_status_t rc;

    if (!on_device) {
        wsync_fault_flip(p, len);
        return WSYNC_OK;
    }
    uint8_t *at = (uint8_t *)p + len / 2;
    rc = wsync_dev_copy_to_host(&byte, at, 1, stream, wsync_deadline_in(timeout_ms));
    if (rc != WSYNC_OK)
        return rc;
    wsync_fault_flip(&byte, 1);
    rc = wsync_dev_memcpy_async(at, &byte, 1, stream);
    return rc == WSYNC_OK ? wsync_dev_stream_sync(stream, wsync_deadline_in(timeout_ms),
                                                  "a fault's bit flip") : rc;
}

/* ---- scoring ----------------------------------------------------------------------------------- */

/* Why sender s and receiver r cannot share memory, as a user would say it: another machine, or
 * the same machine but another network namespace (two containers, or `ip netns`). */
static void ipc_pair_apart(const wsync_hello_t *s, const wsync_hello_t *r, char *buf, size_t len)
{
    if (!wsync_host_same(s->host_id, r->host_id))
        snprintf(buf, len, "receiver %d is on another host (hostname %s) than sender %d (%s)",
                 r->rank, r->hostname ? r->hostname : "?", s->rank,
                 s->hostname ? s->hostname : "?");
    else
        snprintf(buf, len, "receiver %d is on host %s but in another network namespace (%s) than "
                           "sender %d (%s): abstract Unix sockets do not cross namespaces",
                 r->rank, r->hostname ? r->hostname : "?", wsync_host_netns(r->host_id), s->rank,
                 wsync_host_netns(s->host_id));
}

/* The pairs that carry bytes (all pairs when the plan is not known) must each share a host and a
 * network namespace: memfd and CUDA IPC handles stay on one machine, and the data connection is
 * an abstract Unix socket. Returns how many pairs do not; the reason names the first 8. */
#define IPC_PAIRS_NAMED 8
static uint32_t ipc_pairs_apart(const wsync_group_info_t *g, uint32_t *npairs, char *reason,
                                size_t len)
{
    uint32_t bad = 0, pairs = 0;
    size_t n = 0;
    char first[320] = "", list[IPC_PAIRS_NAMED * 32] = "";

    for (uint32_t s = 0; s < g->nsenders; s++)
        for (uint32_t r = 0; r < g->nreceivers; r++) {
            const wsync_hello_t *hs = &g->senders[s], *hr = &g->receivers[r];
            if (g->pair_bytes != NULL && g->pair_bytes[(size_t)s * g->nreceivers + r] == 0)
                continue;
            pairs++;
            if (wsync_host_same_netns(hs->host_id, hr->host_id))
                continue;
            if (bad == 0)
                ipc_pair_apart(hs, hr, first, sizeof(first));
            if (bad < IPC_PAIRS_NAMED) {
                int w = snprintf(list + n, sizeof(list) - n, "%ssender %u -> receiver %u",
                                 bad ? ", " : "", s, r);
                if (w > 0 && (size_t)w < sizeof(list) - n)
                    n += (size_t)w;
            }
            bad++;
        }
    *npairs = pairs;
    if (bad > 0) {
        char more[32] = "";
        if (bad > IPC_PAIRS_NAMED)
            snprintf(more, sizeof(more), ", and %u more", bad - IPC_PAIRS_NAMED);
        snprintf(reason, len, "%s; %u of the %u sender -> receiver pairs%s cross hosts or network "
                              "namespaces (%s%s), and ipc shares memory within one host and "
                              "namespace only", first, bad, pairs,
                 g->pair_bytes != NULL ? " that carry bytes" : "", list, more);
    }
    return bad;
}

static int ipc_score(const wsync_group_info_t *g, char *reason, size_t len)
{
    int shm = wsync_transport_index("shm");
    int cuda = wsync_transport_index("cuda_ipc");
    int want_cuda = (g->mem_kinds & (1u << WSYNC_MEM_CUDA)) != 0;
    uint32_t npairs = 0, hosts = 1, spaces = 1;
    char where[256];

    if (g->mem_kinds & ~((1u << WSYNC_MEM_HOST) | (1u << WSYNC_MEM_CUDA))) {
        snprintf(reason, len, "some shards or targets are in a memory kind it cannot share");
        return 0;
    }
    if (ipc_pairs_apart(g, &npairs, reason, len) > 0)
        return 0;
    for (uint32_t i = 0; i < g->nsenders + g->nreceivers; i++) {
        const wsync_hello_t *h = i < g->nsenders ? &g->senders[i] : &g->receivers[i - g->nsenders];
        const char *role = h->role == WSYNC_ROLE_SENDER ? "sender" : "receiver";
        if (!(h->transports & (1u << shm))) {
            snprintf(reason, len, "%s %d cannot use shared memory (memfd)", role, h->rank);
            return 0;
        }
        if (want_cuda && (cuda < 0 || !(h->transports & (1u << cuda)))) {
            snprintf(reason, len, "some shards or targets are in CUDA memory, and %s %d cannot use "
                                  "cuda_ipc (no CUDA device, or a build without CUDA)", role,
                     h->rank);
            return 0;
        }
    }
    /* several hosts, each pair within one: "every receiver shares ..." rather than "all share" */
    {
        uint32_t n = g->nsenders + g->nreceivers;
        const char **ids = malloc((n ? n : 1) * sizeof(*ids));
        for (uint32_t i = 0; ids != NULL && i < n; i++)
            ids[i] = i < g->nsenders ? g->senders[i].host_id : g->receivers[i - g->nsenders].host_id;
        if (ids == NULL || wsync_host_count(ids, n, &hosts, &spaces) != 0)
            hosts = spaces = 1;
        free(ids);
    }
    if (g->nreceivers == 0)
        snprintf(where, sizeof(where), "no receiver has joined yet (%u senders)", g->nsenders);
    else if (spaces > 1)
        snprintf(where, sizeof(where), "each of the %u sender -> receiver pairs%s shares a host and "
                                       "network namespace (%u host%s, %u namespaces in all)",
                 npairs, g->pair_bytes != NULL ? " that carry bytes" : "", hosts,
                 hosts == 1 ? "" : "s", spaces);
    else
        snprintf(where, sizeof(where), "all %u participants share host %s",
                 g->nsenders + g->nreceivers, g->senders[0].hostname);
    int gpus_known = g->sender_gpu != NULL && g->receiver_gpu != NULL;
    for (uint32_t i = 0; gpus_known && i < g->nsenders + g->nreceivers; i++)
        gpus_known = (i < g->nsenders ? g->sender_gpu[i] : g->receiver_gpu[i - g->nsenders]) != NULL;
    /* only where every GPU is known: nccl then refuses by itself a group that shares one */
    if (want_cuda && g->replication >= 1.5 && gpus_known) {
        /* every receiver reads what it needs from the sender's GPU: replicas read the same bytes
         * over the same link, where a broadcast (nccl) moves them once per link */
        snprintf(reason, len, "%s, but the receivers take the same bytes %.1f times over: each "
                              "would read them from the sender's GPU, which a broadcast avoids",
                 where, g->replication);
        return 60;
    }
    if (want_cuda)
        snprintf(reason, len, "%s; CUDA memory through cuda_ipc: read in place where the "
                              "receiver's GPU can read the sender's (same GPU or peer access), "
                              "else through double-buffered device or pinned host buckets", where);
    else
        snprintf(reason, len, "%s; host memory through memfd buckets", where);
    return 100;
}

/* ---- sender ------------------------------------------------------------------------------------ */

static void ipc_sender_teardown(wsync_sender_t *s)
{
    ipc_sender_t *st = s->m.scheme_state;
    int saved = -1;

    if (st == NULL)
        return;
    for (int r = 0; r < s->m.nreceivers; r++)
        if (st->rconn != NULL && st->rconn[r] != NULL) {
            atomic_store(&st->rconn[r]->leaving, 1);
            wsync_conn_send(st->rconn[r], WSYNC_MSG_BYE, NULL, 0, NULL, 0, 100);
        }
    if (st->device >= 0 && wsync_dev_enter(st->device, &saved) == WSYNC_OK) {
        if (st->stream != NULL &&
            wsync_dev_stream_sync(st->stream, wsync_deadline_in(s->m.timeout_ms),
                                  "ipc sender teardown") != WSYNC_OK)
            WSYNC_LOG_W("ipc: sender %d: %s", s->m.rank, wsync_last_error());
        for (uint32_t k = 0; st->pack != NULL && k < st->nbuckets; k++)
            wsync_dev_batch_free(st->pack[k]);
        wsync_ipc_dtx_cuda_free(st->dtx);
        wsync_dev_event_destroy(st->ev);
        wsync_dev_stream_destroy(st->stream);
        if (st->shm_registered)
            wsync_dev_host_unregister(st->shm.base);
        wsync_cuda_exporter_free(st->cex);
        wsync_dev_free(st->dslots);
        wsync_dev_leave(st->device, saved);
    }
    wsync_shm_release(&st->shm);
    wsync_ipc_dtx_free(st->dtx);
    free(st->inplace);
    free(st->staged);
    free(st->slot_of);
    free(st->chunk_start);
    free(st->need);
    free(st->pending);
    free(st->owed);
    free(st->rconn);
    free(st->needs_any);
    free(st->rflags);
    free(st->rreach);
    free(st->pack);
    free(st->scratch);
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
    uint8_t my_uuid[WSYNC_DEV_UUID_BYTES];
    int saved = -1;
    wsync_status_t rc;

    if (st == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
    s->m.scheme_state = st;
    st->shm.fd = -1;
    st->device = -1;
    st->nbuckets = plan->nbuckets[me];
    st->first_bucket = bucket_base(plan, me);
    st->chunk_start = calloc(st->nbuckets + 1, sizeof(uint32_t));
    st->need = calloc((size_t)st->nbuckets * nr + 1, 1);
    st->pending = calloc(st->nbuckets + 1, sizeof(uint32_t));
    st->owed = calloc((size_t)st->nbuckets * nr + 1, 1);
    st->rconn = calloc(nr, sizeof(*st->rconn));
    st->needs_any = calloc(nr, 1);
    st->rflags = calloc(nr + 1, sizeof(*st->rflags));
    st->rreach = calloc(nr + 1, 1);
    st->slot_of = calloc(st->nbuckets + 1, sizeof(*st->slot_of));
    st->verify = s->m.ctx->verify;
    if (!st->chunk_start || !st->need || !st->pending || !st->owed || !st->rconn ||
        !st->needs_any || !st->rflags || !st->rreach || !st->slot_of)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for the schedule");
    for (uint32_t i = 0; i < 2 * IPC_SLOTS; i++)
        st->last_in_slot[i] = -1;

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
    /* host shards in shareable memory are read in place; the rest is staged */
    st->inplace = calloc(s->nshards + 1, sizeof(*st->inplace));
    st->staged = calloc(st->nbuckets + 1, 1);
    if (st->inplace == NULL || st->staged == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for the schedule");
    for (size_t i = 0; i < s->nshards; i++) {
        const wsync_shard_desc_t *d = &s->shards[i];
        uint64_t bytes = shard_bytes(d);
        wsync_alloc_t a;
        st->inplace[i].region = -1;
        st->inplace[i].cregion = -1;
        if (d->mem == WSYNC_MEM_CUDA)
            st->device = s->device;
        if (d->mem != WSYNC_MEM_HOST || bytes == 0 ||
            !wsync_ctx_find_alloc(s->m.ctx, s->shard_data[i], bytes, &a))
            continue;
        uint32_t g;
        for (g = 0; g < st->nregions && st->region_fds[g] != a.fd; g++)
            ;
        if (g == st->nregions) {
            /* the first DATA_FDS frame also carries the bucket slots (and the delta slots) */
            int room = MAX_FDS - 1 - (s->m.planmsg.delta == WSYNC_DELTA_MODE_ON);
            if ((int)st->nregions == room) {
                WSYNC_LOG_W("ipc: sender %u: more than %d shareable regions; param '%s' is staged",
                            me, room, d->param.name);
                continue;
            }
            st->region_fds[st->nregions] = a.fd;
            st->region_bytes[st->nregions++] = a.bytes;
        }
        st->inplace[i].region = (int32_t)g;
        st->inplace[i].offset = (uint64_t)((const uint8_t *)s->shard_data[i] - (uint8_t *)a.base);
    }
    if (st->device >= 0) {
        if ((rc = wsync_dev_enter(st->device, &saved)) != WSYNC_OK)
            return rc;
        rc = wsync_dev_uuid(st->device, my_uuid);
        if (rc != WSYNC_OK)
            goto out;
    } else if ((rc = wsync_ipc_plan_slots(s, st)) != WSYNC_OK ||
               (rc = wsync_ipc_plan_delta(s, st)) != WSYNC_OK) {
        /* host shards only: where each is read from does not depend on the receivers */
        return rc;
    }
    /* every receiver that needs our buckets connects once and gets the descriptors */
    while (connected < expected) {
        wsync_msg_t *msg;
        wsync_rbuf_t r;
        uint32_t rank, pid, flags = 0;
        int reach = 0;

        rc = wsync_inbox_pop(&s->m.inbox, hello_t, 1, deadline, &msg);
        if (rc == WSYNC_ERR_TIMEOUT) {
            char missing[256] = "";
            size_t n = 0;
            for (uint32_t i = 0; i < nr; i++)
                if (st->needs_any[i] && st->rconn[i] == NULL && n + 12 < sizeof(missing))
                    n += (size_t)snprintf(missing + n, sizeof(missing) - n, "%s%u", n ? ", " : "", i);
            rc = wsync_err(rc, "ipc: sender %u: receivers %s did not connect for data within %d "
                           "ms", me, missing, s->m.timeout_ms);
            goto out;
        }
        if (rc != WSYNC_OK)
            goto out;
        wsync_rbuf_init(&r, msg->payload, msg->len);
        rank = wsync_get_u32(&r);
        pid = wsync_get_u32(&r);
        if (wsync_rbuf_left(&r) >= 4)
            flags = wsync_get_u32(&r);
        if (flags & HELLO_VERIFY)
            st->verify = 1;   /* this receiver verifies: ship checksums to all */
        if (flags & HELLO_GPU) {
            /* the GPUs its GPU can read: is ours among them? */
            uint32_t nu = wsync_get_count(&r, WSYNC_DEV_UUID_BYTES);
            for (uint32_t i = 0; i < nu && !r.err && i < MAX_UUIDS; i++) {
                const void *u = wsync_get_bytes(&r, WSYNC_DEV_UUID_BYTES);
                if (u != NULL && st->device >= 0 && memcmp(u, my_uuid, WSYNC_DEV_UUID_BYTES) == 0)
                    reach = 1;
            }
        }
        if (r.err || rank >= nr || !st->needs_any[rank] || st->rconn[rank] != NULL) {
            wsync_loop_close(s->m.loop, msg->conn, WSYNC_ERR_PROTOCOL, "unexpected DATA_HELLO");
            wsync_msg_free(msg);
            rc = wsync_err(WSYNC_ERR_PROTOCOL, "ipc: sender %u: unexpected data connection from "
                           "receiver %u", me, rank);
            goto out;
        }
        st->rconn[rank] = msg->conn;
        atomic_store(&msg->conn->tag, rank + 1);
        st->rflags[rank] = flags;
        st->rreach[rank] = (uint8_t)reach;
        pthread_mutex_lock(&msg->conn->send_lock);
        snprintf(msg->conn->name, sizeof(msg->conn->name), "receiver %u (pid %u)", rank, pid);
        pthread_mutex_unlock(&msg->conn->send_lock);
        wsync_msg_free(msg);
        if (st->device < 0 && (rc = wsync_ipc_send_fds(s, st, rank)) != WSYNC_OK)
            goto out;
        connected++;
    }
    if (st->device >= 0) {
        /* CUDA shards: where each is read from depends on what every receiver can read */
        if ((rc = wsync_ipc_plan_slots(s, st)) != WSYNC_OK ||
            (rc = wsync_ipc_plan_delta(s, st)) != WSYNC_OK)
            goto out;
        for (uint32_t r = 0; r < nr; r++)
            if (st->rconn[r] != NULL && (rc = wsync_ipc_send_fds(s, st, r)) != WSYNC_OK)
                goto out;
        wsync_cuda_export_close_fds(st->cex);   /* every receiver holds its own now */
    }
    {
        uint32_t nstaged = 0, ncuda = 0;
        for (uint32_t k = 0; k < st->nbuckets; k++)
            nstaged += st->staged[k];
        for (size_t i = 0; i < s->nshards; i++)
            ncuda += st->inplace[i].cregion >= 0;
        WSYNC_LOG_I("ipc: sender %u: %u buckets (%u staged) in %u host slots of %llu bytes and %u "
                    "device slots of %llu bytes, %u shared host regions, %u CUDA shards read in "
                    "place (%u CUDA regions), %u receivers", me, st->nbuckets, nstaged, st->nslots,
                    (unsigned long long)st->slot_bytes, st->ndslots,
                    (unsigned long long)st->dslot_bytes, st->nregions, ncuda,
                    wsync_cuda_export_count(st->cex), expected);
    }
    rc = WSYNC_OK;
out:
    if (st->device >= 0)
        wsync_dev_leave(st->device, saved);
    return rc;
}

static wsync_status_t ipc_sender_push(wsync_sender_t *s, uint64_t version)
{
    ipc_sender_t *st = s->m.scheme_state;
    int saved = -1;
    wsync_status_t rc;

    if (st->device < 0)
        return wsync_ipc_push_body(s, st, version);
    if ((rc = wsync_dev_enter(st->device, &saved)) != WSYNC_OK)
        return rc;
    rc = wsync_ipc_push_body(s, st, version);
    wsync_dev_leave(st->device, saved);
    return rc;
}

/* ---- receiver ---------------------------------------------------------------------------------- */

static void ipc_receiver_teardown(wsync_receiver_t *r)
{
    ipc_receiver_t *st = r->m.scheme_state;
    int saved = -1, entered = 0;

    if (st == NULL)
        return;
    for (uint32_t s = 0; s < st->nsenders; s++) {
        ipc_from_t *f = &st->from[s];
        if (f->conn != NULL) {
            atomic_store(&f->conn->leaving, 1);
            wsync_conn_send(f->conn, WSYNC_MSG_BYE, NULL, 0, NULL, 0, 100);
        }
    }
    if (st->gpu && r->device >= 0 && wsync_dev_enter(r->device, &saved) == WSYNC_OK) {
        entered = 1;
        if (st->stream != NULL &&
            wsync_dev_stream_sync(st->stream, wsync_deadline_in(r->m.timeout_ms),
                                  "ipc receiver teardown") != WSYNC_OK)
            WSYNC_LOG_W("ipc: receiver %d: %s", r->m.rank, wsync_last_error());
        for (uint32_t s = 0; s < st->nsenders; s++)
            if (st->from[s].stream != NULL &&
                wsync_dev_stream_sync(st->from[s].stream, wsync_deadline_in(r->m.timeout_ms),
                                      "ipc receiver teardown") != WSYNC_OK)
                WSYNC_LOG_W("ipc: receiver %d: %s", r->m.rank, wsync_last_error());
    }
    for (uint32_t s = 0; s < st->nsenders; s++) {
        ipc_from_t *f = &st->from[s];
        if (entered) {
            for (int c = 0; c < 2; c++)
                for (uint32_t k = 0; f->batch[c] != NULL && k < f->nbuckets; k++)
                    wsync_dev_batch_free(f->batch[c][k]);
            for (uint32_t k = 0; f->dcopy != NULL && k < f->nbuckets; k++)
                wsync_dev_batch_free(f->dcopy[k]);
            for (uint32_t k = 0; f->ev != NULL && k < f->nbuckets; k++)
                wsync_dev_event_destroy(f->ev[k]);
            wsync_dev_stream_destroy(f->stream);
            if (f->shm_registered)
                wsync_dev_host_unregister(f->shm.base);
            for (uint32_t g = 0; g < f->nregions; g++)
                if (f->region_registered[g])
                    wsync_dev_host_unregister(f->regions[g].base);
            wsync_ipc_drx_cuda_free(f->drx);   /* its batches read the imported slots */
            wsync_cuda_import_free(f->cim);
        }
        wsync_shm_release(&f->shm);
        wsync_ipc_drx_free(f->drx);
        for (uint32_t g = 0; g < f->nregions; g++)
            wsync_shm_release(&f->regions[g]);
        wsync_msg_free(f->first);
        for (uint32_t i = 0; f->xfds != NULL && i < f->nxfds; i++)
            if (f->xfds[i] >= 0)
                close(f->xfds[i]);
        free(f->xfds);
        free(f->inplace);
        free(f->seg_start);
        free(f->chunk_start);
        free(f->done);
        free(f->slot_of);
        free(f->gpu);
        free(f->batch[0]);
        free(f->batch[1]);
        free(f->dcopy);
        free(f->ev);
        free(f->qrun_start);
        free(f->qrun_list);
    }
    if (entered) {
        wsync_dev_stream_destroy(st->stream);
        wsync_dev_leave(r->device, saved);
    }
    free(st->cache_land[0]);
    free(st->cache_land[1]);
    free(st->seg_run);
    free(st->qrun_last);
    free(st->pend);
    free(st->scratch);
    free(st->from);
    free(st->sums);
    free(st);
    r->m.scheme_state = NULL;
}

static wsync_status_t ipc_receiver_setup(wsync_receiver_t *r)
{
    const wsync_plan_t *plan = r->m.plan;
    uint32_t me = (uint32_t)r->m.rank, ns = plan->nsenders, lo, hi, nconn = 0;
    const uint16_t fds_t[] = {WSYNC_MSG_DATA_FDS};
    int64_t deadline = wsync_deadline_in(r->m.timeout_ms);
    ipc_receiver_t *st = calloc(1, sizeof(*st));
    uint8_t uuids[MAX_UUIDS][WSYNC_DEV_UUID_BYTES];
    uint32_t nuuids = 0, nevents = 0;
    int saved = -1;
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
        f->gpu = calloc(f->nbuckets + 1, 1);
        f->pid = r->m.planmsg.peers[s].pid;
        if (f->seg_start == NULL || f->chunk_start == NULL || f->done == NULL || f->gpu == NULL)
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
    if (r->m.planmsg.delta == WSYNC_DELTA_MODE_ON) {
        /* delta versions: host targets apply them with the CPU, CUDA targets with kernels/delta
         * (a build without CUDA has no CUDA targets) */
        if (r->delta_rx == NULL &&
            (rc = wsync_delta_rx_create(r, !WSYNC_HAVE_CUDA, &r->delta_rx)) != WSYNC_OK)
            return rc;
        for (uint32_t s = 0; s < ns; s++)
            if (st->from[s].needed > 0 &&
                (rc = wsync_ipc_drx_create(r, s, st->from[s].seg_start[0],
                                           st->from[s].seg_start[st->from[s].nbuckets],
                                           &st->from[s].drx)) != WSYNC_OK)
                return rc;
    }
    for (uint32_t i = lo; i < hi; i++) {
        const wsync_segment_t *sg = &plan->segments[i];
        const wsync_chunk_t *c = &plan->chunks[sg->chunk];
        ipc_from_t *f = &st->from[c->sender];
        st->bytes_total += sg->dst.rows * sg->dst.cols * wsync_dtype_size(r->land_dtype[sg->target]);
        if (r->targets[sg->target].mem == WSYNC_MEM_CUDA) {
            f->flags |= HELLO_GPU;
            nevents += !f->gpu[c->bucket];
            f->gpu[c->bucket] = 1;
            st->gpu = 1;
        } else {
            f->flags |= HELLO_HOST;
        }
    }
    if (st->gpu) {
        /* the GPUs ours can read, ours first: a sender on one of them is read in place */
        int n = 0;
        if (r->device < 0)
            return wsync_err(WSYNC_ERR_INTERNAL, "ipc: receiver %d has CUDA targets but no device",
                             r->m.rank);
        if ((rc = wsync_dev_enter(r->device, &saved)) != WSYNC_OK)
            return rc;
        rc = wsync_dev_uuid(r->device, uuids[nuuids]);
        if (rc == WSYNC_OK) {
            nuuids++;
            rc = wsync_dev_count(&n);
        }
        for (int d = 0; d < n && rc == WSYNC_OK && nuuids < MAX_UUIDS; d++) {
            int can = 0;
            if (d == r->device)
                continue;
            rc = wsync_dev_can_access_peer(r->device, d, &can);
            if (rc == WSYNC_OK && can && (rc = wsync_dev_uuid(d, uuids[nuuids])) == WSYNC_OK)
                nuuids++;
        }
        if (rc == WSYNC_OK)
            rc = wsync_dev_stream_create(&st->stream);
        st->pend = calloc(nevents + 1, sizeof(*st->pend));
        st->pend_cap = nevents;
        st->cache_land[0] = calloc(r->ntargets + 1, sizeof(void *));
        st->cache_land[1] = calloc(r->ntargets + 1, sizeof(void *));
        if (rc == WSYNC_OK && (st->pend == NULL || st->cache_land[0] == NULL || st->cache_land[1] == NULL))
            rc = wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
        for (uint32_t s = 0; s < ns && rc == WSYNC_OK; s++) {
            ipc_from_t *f = &st->from[s];
            if (!(f->flags & HELLO_GPU))
                continue;
            if ((f->ev = calloc(f->nbuckets + 1, sizeof(void *))) == NULL)
                rc = wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
            /* f->stream: made with the first batches, once we know where the sender's GPU is */
            for (uint32_t k = 0; k < f->nbuckets && rc == WSYNC_OK; k++)
                if (f->gpu[k])
                    rc = wsync_dev_event_create(0, &f->ev[k]);
        }
        if (rc != WSYNC_OK)
            goto out;
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
            goto out;
        snprintf(name, sizeof(name), "sender %u (pid %u)", s, peer->pid);
        rc = wsync_loop_add(r->m.loop, fd, WSYNC_CONN_UNIX, name, NULL, &f->conn);
        if (rc != WSYNC_OK)
            goto out;
        wsync_wbuf_init(&b);
        wsync_put_u32(&b, me);
        wsync_put_u32(&b, (uint32_t)getpid());
        wsync_put_u32(&b, f->flags | (r->m.ctx->verify ? HELLO_VERIFY : 0u));
        if (f->flags & HELLO_GPU) {
            wsync_put_u32(&b, nuuids);
            for (uint32_t u = 0; u < nuuids; u++)
                wsync_put_bytes(&b, uuids[u], WSYNC_DEV_UUID_BYTES);
        }
        rc = b.err ? wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory")
                   : wsync_conn_send(f->conn, WSYNC_MSG_DATA_HELLO, b.data, (uint32_t)b.len, NULL,
                                     0, r->m.timeout_ms);
        wsync_wbuf_free(&b);
        if (rc != WSYNC_OK)
            goto out;
        nconn++;
    }
    while (nconn > 0) {
        wsync_msg_t *msg;
        ipc_from_t *f = NULL;

        rc = wsync_inbox_pop(&r->m.inbox, fds_t, 1, deadline, &msg);
        if (rc == WSYNC_ERR_TIMEOUT) {
            rc = wsync_err(rc, "ipc: receiver %u: %u senders did not share their buckets within "
                           "%d ms", me, nconn, r->m.timeout_ms);
            goto out;
        }
        if (rc != WSYNC_OK)
            goto out;
        for (uint32_t s = 0; s < ns; s++)
            if (st->from[s].conn == msg->conn)
                f = &st->from[s];
        int more = msg->len == 4 && msg->payload[0] == 0xff && msg->payload[1] == 0xff &&
                   msg->payload[2] == 0xff && msg->payload[3] == 0xff;
        if (f == NULL || (more && f->first == NULL) || (!more && f->first != NULL)) {
            wsync_msg_free(msg);
            rc = wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %u: unexpected DATA_FDS", me);
            goto out;
        }
        if (!more) {
            const char *why = "?";
            f->want_fds = wsync_ipc_fds_wanted(msg->payload, msg->len, &why);
            if (f->want_fds == UINT32_MAX) {
                rc = wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %u: malformed DATA_FDS from %s: "
                               "%s (%u bytes, %d descriptors in the first frame)", me,
                               f->conn->name, why, msg->len, msg->nfds);
                wsync_msg_free(msg);
                goto out;
            }
            if ((f->xfds = calloc(f->want_fds + 1, sizeof(int))) == NULL) {
                wsync_msg_free(msg);
                rc = wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
                goto out;
            }
            WSYNC_LOG_D("ipc: receiver %u: DATA_FDS from %s: %u bytes, %u descriptors in all", me,
                        f->conn->name, msg->len, f->want_fds);
            if (f->want_fds > WSYNC_MSG_MAX_FDS)
                wsync_cuda_ipc_fd_room(f->want_fds);
        }
        if (f->nxfds + (uint32_t)msg->nfds > f->want_fds) {
            wsync_msg_free(msg);
            rc = wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %u: %s sent more descriptors than it "
                           "announced", me, f->conn->name);
            goto out;
        }
        for (int i = 0; i < msg->nfds; i++) {
            f->xfds[f->nxfds++] = msg->fds[i];
            msg->fds[i] = -1;
        }
        if (more)
            wsync_msg_free(msg);
        else
            f->first = msg;
        if (f->nxfds < f->want_fds)
            continue;
        rc = wsync_ipc_take_data_fds(r, f, f->first->payload, f->first->len, f->xfds,
                                     f->nxfds);
        wsync_msg_free(f->first);
        f->first = NULL;
        free(f->xfds);
        f->xfds = NULL;
        f->nxfds = 0;
        if (rc != WSYNC_OK)
            goto out;
        nconn--;
    }
    if (st->gpu) {
        st->cur = 0;
        rc = wsync_ipc_select_batches(r, st);
    }
out:
    if (st->gpu && r->device >= 0)
        wsync_dev_leave(r->device, saved);
    return rc;
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

/* Where slot `slot` of a sender lies here, and whether on a device. */
static const uint8_t *from_slot(const ipc_from_t *f, uint32_t slot, int *on_device)
{
    *on_device = slot != NO_SLOT && slot >= DEV_SLOT0;
    if (slot == NO_SLOT)
        return NULL;
    if (slot >= DEV_SLOT0)
        return (const uint8_t *)wsync_cuda_import_base(f->cim, f->dslot_region, NULL) +
               (size_t)(slot - DEV_SLOT0) * f->dslot_bytes;
    return (const uint8_t *)f->shm.base + (size_t)slot * f->slot_bytes;
}

/* Check every segment of bucket k of sender s against the checksums READY brought: the bytes as
 * they landed when no cast came between, else the source bytes the cast read. */
static wsync_status_t verify_bucket(wsync_receiver_t *r, ipc_receiver_t *st, const ipc_from_t *f,
                                    uint32_t s, uint32_t k, uint64_t version, const uint64_t *sums,
                                    uint32_t slot)
{
    const wsync_plan_t *plan = r->m.plan;
    int slot_dev = 0;
    const uint8_t *base = from_slot(f, slot, &slot_dev);

    for (uint32_t i = f->seg_start[k]; i < f->seg_start[k + 1]; i++) {
        const wsync_segment_t *sg = &plan->segments[i];
        const wsync_chunk_t *c = &plan->chunks[sg->chunk];
        const ipc_inplace_t *ip = &f->inplace[c->shard];
        uint64_t got = 0;
        wsync_status_t rc;
        if (r->land_dtype[sg->target] == c->dtype && (st->seg_run == NULL || st->seg_run[i] == 0)) {
            rc = wsync_ipc_hash_any(r->land[sg->target],
                                    r->targets[sg->target].mem == WSYNC_MEM_CUDA, c->dtype,
                                    &sg->dst, &st->scratch, &st->scratch_cap, st->stream,
                                    r->m.timeout_ms, &got);
        } else if (ip->region >= 0) {
            rc = wsync_ipc_hash_any((const uint8_t *)f->regions[ip->region].base + ip->offset, 0,
                                    c->dtype, &c->src, &st->scratch, &st->scratch_cap, st->stream,
                                    r->m.timeout_ms, &got);
        } else if (ip->cregion >= 0) {
            rc = wsync_ipc_hash_any((const uint8_t *)wsync_cuda_import_base(
                                        f->cim, (uint32_t)ip->cregion, NULL) + ip->offset,
                                    1, c->dtype, &c->src, &st->scratch, &st->scratch_cap,
                                    st->stream, r->m.timeout_ms, &got);
        } else {
            wsync_region_t dense = {0, c->src.cols, c->src.rows, c->src.cols};
            rc = wsync_ipc_hash_any(base + c->bucket_off, slot_dev, c->dtype, &dense,
                                    &st->scratch, &st->scratch_cap, st->stream, r->m.timeout_ms,
                                    &got);
        }
        if (rc != WSYNC_OK)
            return rc;
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

/* Bucket k of sender s has landed whole: fault point, checks, RELEASE, progress. */
static wsync_status_t finish_bucket(wsync_receiver_t *r, ipc_receiver_t *st, uint32_t s, uint32_t k,
                                    uint64_t version, uint32_t slot, uint64_t bytes,
                                    uint64_t *bytes_done)
{
    ipc_from_t *f = &st->from[s];
    const wsync_plan_t *plan = r->m.plan;
    wsync_status_t rc;

    switch (WSYNC_FAULT(WSYNC_FAULT_RECV_UNPACK)) {
    case WSYNC_FAULT_FAIL: {
        char where[128];
        snprintf(where, sizeof(where), "ipc receiver %d, bucket %u of sender %u, version %llu",
                 r->m.rank, k, s, (unsigned long long)version);
        return wsync_fault_err(WSYNC_FAULT_RECV_UNPACK, where);
    }
    case WSYNC_FAULT_CORRUPT: {   /* in the target, in the first row the bucket filled */
        /* a segment of a quantization run holds its FP8 codes in the target once the run has
         * launched (its last bucket is this one or earlier); before that, nothing to corrupt */
        uint32_t i = f->seg_start[k], run = 0;
        while (i < f->seg_start[k + 1] && st->seg_run != NULL && (run = st->seg_run[i]) != 0 &&
               st->qrun_last[run - 1] > k)
            i++;
        if (i == f->seg_start[k + 1]) {
            WSYNC_LOG_W("ipc: receiver %d: fault recv.unpack:corrupt injected nothing: bucket %u "
                        "of sender %u only feeds quantization runs not launched yet", r->m.rank,
                        k, s);
            break;
        }
        const wsync_segment_t *sg = &plan->segments[i];
        size_t esz = run ? 1 : wsync_dtype_size(r->land_dtype[sg->target]);
        void *at = run ? r->target_data[sg->target] : r->land[sg->target];
        rc = wsync_ipc_flip_any((uint8_t *)at + sg->dst.off * esz,
                                r->targets[sg->target].mem == WSYNC_MEM_CUDA,
                                (size_t)sg->dst.cols * esz, st->stream, r->m.timeout_ms);
        if (rc != WSYNC_OK)
            return rc;
        break;
    }
    default:
        break;
    }
    /* the deltas applied on the GPU: their faults and tree hashes against the sender's */
    if (f->drx != NULL && (rc = wsync_ipc_drx_gpu_check(r, f->drx, k, version)) != WSYNC_OK)
        return rc;
    if (r->m.ctx->verify &&
        (rc = verify_bucket(r, st, f, s, k, version, st->sums, slot)) != WSYNC_OK)
        return rc;
    if ((rc = wsync_receiver_landed(r, f->seg_start[k], f->seg_start[k + 1])) != WSYNC_OK)
        return rc;
    {
        wsync_wbuf_t b;
        wsync_wbuf_init(&b);
        wsync_put_u64(&b, version);
        wsync_put_u32(&b, k);
        rc = wsync_conn_send(f->conn, WSYNC_MSG_RELEASE, b.data, (uint32_t)b.len, NULL, 0,
                             r->m.timeout_ms);
        wsync_wbuf_free(&b);
        if (rc != WSYNC_OK)
            return rc;
    }
    *bytes_done += bytes;
    if (r->progress != NULL)
        r->progress(r->progress_arg, version, *bytes_done, st->bytes_total);
    return WSYNC_OK;
}

/* Finish the buckets whose GPU copies are complete (each sender's on its own stream, so in any
 * order); *reaped counts them. */
static wsync_status_t reap(wsync_receiver_t *r, ipc_receiver_t *st, uint64_t version,
                           uint64_t *bytes_done, int64_t *last_ms, uint32_t *reaped)
{
    uint32_t keep = 0;
    wsync_status_t rc = WSYNC_OK;

    for (uint32_t i = 0; i < st->npend; i++) {
        struct ipc_pend p = st->pend[st->pend_head + i];
        int done = 0;
        if (rc == WSYNC_OK && (rc = wsync_dev_event_query(st->from[p.s].ev[p.k], &done)) == WSYNC_OK &&
            done && (rc = finish_bucket(r, st, p.s, p.k, version, NO_SLOT, p.bytes, bytes_done)) == WSYNC_OK) {
            (*reaped)++;
            *last_ms = wsync_now_ms();
            continue;
        }
        st->pend[st->pend_head + keep++] = p;   /* not done (or failed: keep it, nothing lost) */
    }
    st->npend = keep;
    return rc;
}

/* A short pause while GPU copies run and no READY is in: spin with yields first (copies of a
 * bucket take tens of microseconds to a few milliseconds; nanosleep costs at least the timer
 * slack, about 50 us), then naps of 10 us. */
static void poll_pause(uint32_t idle)
{
    if (idle < 64) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 10000};
    nanosleep(&ts, NULL);
}

static wsync_status_t recv_body(wsync_receiver_t *r, ipc_receiver_t *st, uint64_t version)
{
    const wsync_plan_t *plan = r->m.plan;
    const uint16_t types[] = {WSYNC_MSG_READY};
    uint32_t remaining = 0, total, launched = 0, idle = 0;
    uint64_t bytes_done = 0, t_first = 0, t_last_ready = 0, t_cpu = 0;
    /* a quarter longer than a sender's wait for a RELEASE: a sender held up by another
     * receiver names that receiver before this wait blames the sender */
    int wait_ms = (int)WSYNC_MIN((int64_t)r->m.timeout_ms * 5 / 4, INT_MAX);
    int64_t last_ms;
    wsync_status_t rc;

    for (uint32_t s = 0; s < st->nsenders; s++) {
        remaining += st->from[s].needed;
        memset(st->from[s].done, 0, st->from[s].nbuckets);
    }
    total = remaining;
    st->pend_head = st->npend = 0;
    for (uint32_t s = 0; s < st->nsenders; s++)
        if (st->from[s].drx != NULL && st->from[s].needed > 0 &&
            (rc = wsync_ipc_drx_start(r, st->from[s].drx, st->from[s].conn, version)) != WSYNC_OK)
            return rc;
    if (st->gpu && (rc = wsync_ipc_select_batches(r, st)) != WSYNC_OK)
        return rc;
    uint64_t t0 = wsync_now_ns();
    last_ms = wsync_now_ms();
    while (remaining > 0 || st->npend > 0) {
        wsync_msg_t *msg;
        wsync_rbuf_t rb;
        ipc_from_t *f = NULL;
        uint32_t s, nsums = 0, reaped = 0;
        int has_sums;

        if (st->npend > 0 &&
            (rc = reap(r, st, version, &bytes_done, &last_ms, &reaped)) != WSYNC_OK)
            return rc;
        if (reaped > 0)
            idle = 0;
        if (remaining == 0) {
            /* only GPU work left: poll every pending bucket (they finish in any order) */
            if (st->npend > 0 && reaped == 0) {
                if (wsync_now_ms() >= last_ms + wait_ms) {
                    struct ipc_pend *p = &st->pend[st->pend_head];
                    return wsync_err(WSYNC_ERR_TIMEOUT, "ipc: receiver %d: version %llu: bucket %u "
                                     "of sender %u did not finish on the GPU within %d ms",
                                     r->m.rank, (unsigned long long)version, p->k, p->s, wait_ms);
                }
                poll_pause(idle++);
            }
            continue;
        }
        rc = wsync_inbox_pop(&r->m.inbox, types, 1, st->npend > 0 ? 0 : last_ms + wait_ms, &msg);
        if (rc == WSYNC_ERR_TIMEOUT && st->npend > 0) {
            struct ipc_pend *p = &st->pend[st->pend_head];
            if (wsync_now_ms() >= last_ms + wait_ms)
                return wsync_err(rc, "ipc: receiver %d: version %llu: bucket %u of sender %u did "
                                 "not finish on the GPU within %d ms", r->m.rank,
                                 (unsigned long long)version, p->k, p->s, wait_ms);
            if (reaped == 0)
                poll_pause(idle++);
            continue;
        }
        if (rc == WSYNC_ERR_TIMEOUT) {
            char who[512];
            waiting_on(st, who, sizeof(who));
            return wsync_err(rc, "ipc: receiver %d: version %llu: no bucket for %d ms (%u of %u "
                             "received; waiting on %s)", r->m.rank, (unsigned long long)version,
                             wait_ms, total - remaining, total, who);
        }
        if (rc != WSYNC_OK)
            return rc;
        idle = 0;
        t_last_ready = wsync_now_ns();
        if (t_first == 0)
            t_first = t_last_ready;
        for (s = 0; s < st->nsenders && f == NULL; s++)
            if (st->from[s].conn == msg->conn)
                f = &st->from[s];
        s--;

        wsync_rbuf_init(&rb, msg->payload, msg->len);
        uint64_t v = wsync_get_u64(&rb);
        uint32_t k = wsync_get_u32(&rb);
        uint32_t slot = wsync_get_u32(&rb);
        if (f != NULL && f->drx != NULL && !rb.err && k < f->nbuckets &&
            (rc = wsync_ipc_drx_ready(r, f->drx, &rb, k, f->chunk_start[k], f->chunk_start[k + 1],
                                      version)) != WSYNC_OK) {
            wsync_msg_free(msg);
            return rc;
        }
        has_sums = wsync_rbuf_left(&rb) > 0;
        if (has_sums) {
            nsums = wsync_get_count(&rb, 8);
            if (!rb.err && nsums > st->sums_cap) {
                uint64_t *nsp = realloc(st->sums, (size_t)nsums * sizeof(*nsp));
                if (nsp == NULL) {
                    wsync_msg_free(msg);
                    return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for %u checksums", nsums);
                }
                st->sums = nsp;
                st->sums_cap = nsums;
            }
            for (uint32_t i = 0; i < nsums && !rb.err; i++)
                st->sums[i] = wsync_get_u64(&rb);
        }
        wsync_msg_free(msg);
        if (f == NULL || rb.err || v != version || k >= f->nbuckets || slot != f->slot_of[k] ||
            f->done[k] || f->seg_start[k] == f->seg_start[k + 1] ||
            (has_sums && nsums != f->chunk_start[k + 1] - f->chunk_start[k]))
            return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: unexpected READY (version "
                             "%llu, bucket %u, slot %u) while receiving version %llu", r->m.rank,
                             (unsigned long long)v, k, slot, (unsigned long long)version);
        if (r->m.ctx->verify && !has_sums)
            return wsync_err(WSYNC_ERR_INTEGRITY, "ipc: receiver %d: version %llu refused: it "
                             "cannot be verified, sender %u (pid %u) sent bucket %u without "
                             "checksums", r->m.rank, (unsigned long long)version, s, f->pid, k);
        int slot_dev = 0;
        const uint8_t *base = from_slot(f, slot, &slot_dev);
        uint64_t bytes = 0;
        r->torn = 1;   /* the targets no longer hold only the last version */
        if (f->gpu[k]) {
            /* the segments into CUDA targets: one launch, finished when its event completes */
            wsync_kcopy_batch_t *batch = f->batch[st->cur][k];
            if (f->drx != NULL && (rc = wsync_ipc_delta_batches(r, st, f, k, &batch)) != WSYNC_OK)
                return rc;
            if (batch != NULL && (rc = wsync_dev_batch_launch(batch, f->stream)) != WSYNC_OK)
                return rc;
            if (f->qrun_start[k + 1] > f->qrun_start[k] &&
                (rc = wsync_qdirect_launch(r, f->qrun_list + f->qrun_start[k],
                                           f->qrun_start[k + 1] - f->qrun_start[k],
                                           f->qblocks, f->stream)) != WSYNC_OK)
                return rc;
            if ((rc = wsync_dev_event_record(f->ev[k], f->stream)) != WSYNC_OK)
                return rc;
            launched++;
        }
        uint64_t tc = wsync_now_ns();
        for (uint32_t i = f->seg_start[k]; i < f->seg_start[k + 1]; i++) {
            const wsync_segment_t *sg = &plan->segments[i];
            const wsync_chunk_t *c = &plan->chunks[sg->chunk];
            const ipc_inplace_t *ip = &f->inplace[c->shard];
            void *dst = r->land[sg->target];
            wsync_dtype_t dst_dtype = r->land_dtype[sg->target];
            bytes += sg->dst.rows * sg->dst.cols * wsync_dtype_size(dst_dtype);
            if (r->targets[sg->target].mem == WSYNC_MEM_CUDA)
                continue;   /* in the batch */
            if (f->drx != NULL && wsync_ipc_drx_segment(r, f->drx, i, version, &rc)) {
                if (rc != WSYNC_OK)
                    return rc;
                continue;   /* applied from the delta slot, checked against the sender's hash */
            }
            if (ip->region >= 0) {   /* straight from the sender's shard */
                const uint8_t *shard = (const uint8_t *)f->regions[ip->region].base + ip->offset;
                rc = wsync_exec_copy(shard, c->dtype, &c->src, dst, dst_dtype, &sg->dst);
            } else if (base == NULL || slot_dev || ip->cregion >= 0) {
                rc = wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: bucket %u of sender %u "
                               "came without a host slot", r->m.rank, k, c->sender);
            } else {
                rc = wsync_exec_unpack(sg, c, base, dst_dtype, dst);
            }
            if (rc != WSYNC_OK)
                return rc;
        }
        t_cpu += wsync_now_ns() - tc;
        f->done[k] = 1;
        remaining--;
        last_ms = wsync_now_ms();
        if (f->gpu[k] && !r->m.ctx->verify) {
            st->pend[st->pend_head + st->npend++] = (struct ipc_pend){s, k, bytes};
            continue;
        }
        if (f->gpu[k]) {
            /* verifying: READY's checksums are this bucket's, so finish it before the next */
            char what[128];
            snprintf(what, sizeof(what), "ipc: receiver %d: version %llu: bucket %u of sender %u",
                     r->m.rank, (unsigned long long)version, k, s);
            if ((rc = wsync_dev_event_wait(f->ev[k], wsync_deadline_in(wait_ms), what)) != WSYNC_OK)
                return rc;
        }
        if ((rc = finish_bucket(r, st, s, k, version, slot, bytes, &bytes_done)) != WSYNC_OK)
            return rc;
    }
    uint64_t t_end = wsync_now_ns();
    double secs = (double)(t_end - t0) / 1e9;
    WSYNC_LOG_D("ipc: receiver %d: version %llu: %llu bytes landed in %.4f s (%.2f GB/s; %u GPU "
                "batches on %u streams, %u buckets); stages: first READY after %.3f ms, last "
                "READY at %.3f ms, CPU copies %.3f ms, last RELEASE at %.3f ms (GPU tail after "
                "last READY %.3f ms)", r->m.rank, (unsigned long long)version,
                (unsigned long long)bytes_done, secs,
                secs > 0 ? (double)bytes_done / secs / 1e9 : 0.0, launched, st->nsenders, total,
                t_first ? (double)(t_first - t0) / 1e6 : 0.0,
                t_last_ready ? (double)(t_last_ready - t0) / 1e6 : 0.0, (double)t_cpu / 1e6,
                (double)(t_end - t0) / 1e6,
                t_last_ready ? (double)(t_end - t_last_ready) / 1e6 : 0.0);
    return WSYNC_OK;
}

static wsync_status_t ipc_receiver_recv(wsync_receiver_t *r, uint64_t version)
{
    ipc_receiver_t *st = r->m.scheme_state;
    int saved = -1;
    wsync_status_t rc;

    if (!st->gpu)
        return recv_body(r, st, version);
    if ((rc = wsync_dev_enter(r->device, &saved)) != WSYNC_OK)
        return rc;
    rc = recv_body(r, st, version);
    if (rc != WSYNC_OK && st->stream != NULL) {
        /* nothing of ours may still write into the targets once we return */
        char text[1024];
        snprintf(text, sizeof(text), "%s", wsync_last_error());
        if (wsync_dev_stream_sync(st->stream, wsync_deadline_in(r->m.timeout_ms),
                                  "ipc: copies after a failed version") != WSYNC_OK)
            WSYNC_LOG_W("ipc: receiver %d: %s", r->m.rank, wsync_last_error());
        for (uint32_t s = 0; s < st->nsenders; s++)
            if (st->from[s].stream != NULL &&
                wsync_dev_stream_sync(st->from[s].stream, wsync_deadline_in(r->m.timeout_ms),
                                      "ipc: copies after a failed version") != WSYNC_OK)
                WSYNC_LOG_W("ipc: receiver %d: %s", r->m.rank, wsync_last_error());
        wsync_err_set_text(rc, text);
    }
    wsync_dev_leave(r->device, saved);
    return rc;
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
    .delta = 1,
    .score = ipc_score,
    .sender_setup = ipc_sender_setup,
    .sender_push = ipc_sender_push,
    .sender_teardown = ipc_sender_teardown,
    .receiver_setup = ipc_receiver_setup,
    .receiver_recv = ipc_receiver_recv,
    .receiver_fetch = ipc_receiver_fetch,
    .receiver_teardown = ipc_receiver_teardown,
};
