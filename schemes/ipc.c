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
 * colocated, Qwen3-8B shape) that took FP8-block from 1.26 to 1.18 x the bf16 time.
 *
 * FP8 on the wire (docs/fp8_wire.md): a chunk with rule != 0 travels as the FP8 codes and scales
 * its sender's pack makes (wsync_exec_pack_wire on the CPU, a quantization kernel per chunk on
 * CUDA, launched with the bucket's copies), so its shard is staged whatever the in-place rules
 * say (its plain chunks with it). A NaN or Inf refuses the version (NONFINITE naming the param and
 * sender) before that bucket's READY; a receiver whose last bucket from a sender comes before
 * that sender's last FP8 one waits for its PACKED (a READY of bucket nbuckets), so that no
 * receiver commits a version some pack refused. Receivers copy the codes into the target and
 * the scales into its scale matrix (CPU, or two copies in the bucket's batch); such targets are
 * never quantized here (nor by plan_qruns). Checksums of those chunks are of the slot's bytes.
 *
 * Files: this one holds the scheme's table, its score, and each side's set-up (DATA_HELLO, the
 * connections) and teardown; ipc_share.c what a sender shares and how a receiver maps it
 * (DATA_FDS); ipc_tx.c a sender's version; ipc_rx.c a receiver's version; ipc_cuda_rx.c the
 * receiver's GPU work (copy batches, FP8 runs, streams); ipc_delta.c delta versions;
 * ipc_internal.h the state and the calls they share. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* ---- helpers of both sides' versions (ipc_tx.c, ipc_rx.c) -------------------------------------- */

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
        wsync_dev_free(st->wq_mem);
        wsync_amax_tx_free(&st->amax_tx);
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
    wsync_amax_tx_free(&st->amax_tx);   /* host senders' (a CUDA one's went above) */
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
    free(st->wire_shard);
    free(st->notify);
    free(st->wq_start);
    free(st->wq);
    free(st->wq_ws);
    free(st);
    s->m.scheme_state = NULL;
}

/* FP8 on the wire, at the sender's setup (after need[] is known): a chunk with rule != 0 exists
 * only once the pack made it, so its shard is staged whole (its plain chunks too), whatever the
 * memory would allow (wire_shard); our last bucket with such a chunk (wire_last) and the
 * receivers that need none of our buckets from it on, which get PACKED (notify). */
static wsync_status_t wire_schedule(wsync_sender_t *s, ipc_sender_t *st, uint32_t c0)
{
    const wsync_plan_t *plan = s->m.plan;
    uint32_t me = (uint32_t)s->m.rank, nr = plan->nreceivers, nwire = 0;
    int64_t *last;

    st->wire_last = -1;
    st->wire_shard = calloc(s->nshards + 1, 1);
    st->notify = calloc(nr + 1, 1);
    if (st->wire_shard == NULL || st->notify == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for the schedule");
    for (uint32_t c = c0; c < st->chunk_start[st->nbuckets]; c++)
        if (plan->chunks[c].rule != 0 && plan->chunks[c].shard < s->nshards &&
            !st->wire_shard[plan->chunks[c].shard]) {
            st->wire_shard[plan->chunks[c].shard] = 1;
            nwire++;
        }
    if (nwire == 0)
        return WSYNC_OK;
    if (s->m.planmsg.delta == WSYNC_DELTA_MODE_ON)
        return wsync_err(WSYNC_ERR_INTERNAL, "ipc: sender %u: a plan with FP8 on the wire and "
                         "delta versions on (the coordinator never makes one)", me);
    WSYNC_LOG_D("ipc: sender %u: %u shards staged because chunks of them travel as FP8 codes and "
                "scales", me, nwire);
    if ((last = calloc(plan->nsenders + 1, sizeof(*last))) == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for the schedule");
    wire_last_buckets(plan, c0, st->chunk_start[st->nbuckets], last);
    st->wire_last = last[me];
    free(last);
    for (uint32_t r = 0; r < nr; r++) {
        int64_t last_need = -1;
        for (uint32_t k = 0; k < st->nbuckets; k++)
            if (st->need[(size_t)k * nr + r])
                last_need = k;
        st->notify[r] = st->needs_any[r] && last_need < st->wire_last;
    }
    return WSYNC_OK;
}

/* Our schedule: each bucket's chunks (ours are one run, ordered by (bucket, offset); *c0: the
 * first), which receivers take each bucket (our chunks' records in their lists), and *expected:
 * how many receivers need any. */
static void sender_schedule(wsync_sender_t *s, ipc_sender_t *st, uint32_t *c0, uint32_t *expected)
{
    const wsync_plan_t *plan = s->m.plan;
    uint32_t me = (uint32_t)s->m.rank, nr = plan->nreceivers;

    wsync_plan_bucket_chunks(plan, me, st->chunk_start);
    *c0 = st->chunk_start[0];
    for (uint32_t rv = 0; rv < nr; rv++)
        for (uint32_t k = plan->ref0[rv]; k < plan->ref0[rv + 1]; k++) {
            uint32_t a, b;
            wsync_plan_list_range(plan, plan->refs[k].list, *c0, st->chunk_start[st->nbuckets],
                                  &a, &b);
            for (; a < b; a++)
                st->need[(size_t)plan->chunks[plan->lsegs[a].chunk].bucket * nr + rv] = 1;
        }
    *expected = 0;
    for (uint32_t rv = 0; rv < nr; rv++)
        for (uint32_t k = 0; k < st->nbuckets && !st->needs_any[rv]; k++)
            if (st->need[(size_t)k * nr + rv]) {
                st->needs_any[rv] = 1;
                (*expected)++;
            }
}

/* Host shards in shareable memory (wsync_mem_alloc regions) are read in place, each region
 * shared once while the first DATA_FDS frame has room; the rest is staged. Notes our GPU when a
 * shard is in CUDA memory. */
static void share_host_shards(wsync_sender_t *s, ipc_sender_t *st)
{
    for (size_t i = 0; i < s->nshards; i++) {
        const wsync_shard_desc_t *d = &s->shards[i];
        uint64_t bytes = shard_bytes(d);
        wsync_alloc_t a;
        st->inplace[i].region = -1;
        st->inplace[i].cregion = -1;
        if (d->mem == WSYNC_MEM_CUDA)
            st->device = s->device;
        if (d->mem != WSYNC_MEM_HOST || bytes == 0 || st->wire_shard[i] ||
            !wsync_ctx_find_alloc(s->m.ctx, s->shard_data[i], bytes, &a))
            continue;
        uint32_t g;
        for (g = 0; g < st->nregions && st->region_fds[g] != a.fd; g++)
            ;
        if (g == st->nregions) {
            /* the first DATA_FDS frame also carries the bucket slots (and the delta slots) */
            int room = MAX_FDS - 1 - (s->m.planmsg.delta == WSYNC_DELTA_MODE_ON);
            if ((int)st->nregions == room) {
                WSYNC_LOG_W("ipc: sender %d: more than %d shareable regions; param '%s' is staged",
                            s->m.rank, room, d->param.name);
                continue;
            }
            st->region_fds[st->nregions] = a.fd;
            st->region_bytes[st->nregions++] = a.bytes;
        }
        st->inplace[i].region = (int32_t)g;
        st->inplace[i].offset = (uint64_t)((const uint8_t *)s->shard_data[i] - (uint8_t *)a.base);
    }
}

/* A receiver's DATA_HELLO (msg, freed here): its rank, pid and flags, and with CUDA targets
 * whether its GPU can read ours (my_uuid); its connection then named and tagged with its rank.
 * WSYNC_ERR_PROTOCOL (the connection closed) for one we do not expect. */
static wsync_status_t take_hello(wsync_sender_t *s, ipc_sender_t *st, wsync_msg_t *msg,
                                 const uint8_t *my_uuid, uint32_t *rank_out)
{
    const uint32_t nr = s->m.plan->nreceivers;
    wsync_rbuf_t r;
    uint32_t rank, pid, flags = 0;
    int reach = 0;

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
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: sender %d: unexpected data connection from "
                         "receiver %u", s->m.rank, rank);
    }
    st->rconn[rank] = msg->conn;
    atomic_store(&msg->conn->tag, rank + 1);
    st->rflags[rank] = flags;
    st->rreach[rank] = (uint8_t)reach;
    pthread_mutex_lock(&msg->conn->send_lock);
    snprintf(msg->conn->name, sizeof(msg->conn->name), "receiver %u (pid %u)", rank, pid);
    pthread_mutex_unlock(&msg->conn->send_lock);
    wsync_msg_free(msg);
    *rank_out = rank;
    return WSYNC_OK;
}

/* The sender's set-up: its schedule, its shards shared in place or staged, then each receiver
 * that needs its buckets connects once (DATA_HELLO) and gets what it shares (DATA_FDS): at once
 * with host shards only, once all have connected with CUDA shards (where each is read from
 * depends on what every receiver's GPU can read). */
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
    sender_schedule(s, st, &c0, &expected);
    st->inplace = calloc(s->nshards + 1, sizeof(*st->inplace));
    st->staged = calloc(st->nbuckets + 1, 1);
    if (st->inplace == NULL || st->staged == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for the schedule");
    if ((rc = wire_schedule(s, st, c0)) != WSYNC_OK)
        return rc;
    share_host_shards(s, st);
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
        uint32_t rank = 0;

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
        if (rc != WSYNC_OK || (rc = take_hello(s, st, msg, my_uuid, &rank)) != WSYNC_OK)
            goto out;
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

/* Wait (each with the deadline) for every sender's streams, the second one included: nothing
 * of ours may run on them once a failed version returns or the imports close. */
static void sync_sender_streams(wsync_receiver_t *r, ipc_receiver_t *st, const char *what)
{
    for (uint32_t s = 0; s < st->nsenders; s++) {
        void *streams[2] = {st->from[s].stream, st->from[s].stream2};
        for (int i = 0; i < 2; i++)
            if (streams[i] != NULL &&
                wsync_dev_stream_sync(streams[i], wsync_deadline_in(r->m.timeout_ms), what) !=
                    WSYNC_OK)
                WSYNC_LOG_W("ipc: receiver %d: %s", r->m.rank, wsync_last_error());
    }
}

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
        sync_sender_streams(r, st, "ipc receiver teardown");
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
            for (uint32_t k = 0; f->tev != NULL && k < 2 * f->nbuckets; k++)
                wsync_dev_event_destroy(f->tev[k]);
            wsync_dev_stream_destroy(f->stream);
            wsync_dev_stream_destroy(f->stream2);
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
        free(f->tev);
        free(f->qrun_start);
        free(f->qrun_list);
    }
    if (entered) {
        wsync_dev_stream_destroy(st->stream);
        wsync_dev_leave(r->device, saved);
    }
    free(st->cache_land[0]);
    free(st->cache_land[1]);
    free(st->cache_scales[0]);
    free(st->cache_scales[1]);
    free(st->seg_run);
    free(st->qrun_last);
    free(st->pend);
    free(st->scratch);
    free(st->from);
    free(st->sums);
    free(st);
    r->m.scheme_state = NULL;
}

/* Each sender's ranges of the plan: its buckets' chunks (READY's checksums follow that order)
 * and our segments from each of its buckets; the buckets we need from it. */
static void sender_ranges(wsync_receiver_t *r, ipc_receiver_t *st)
{
    const wsync_plan_t *plan = r->m.plan;
    /* segments are ordered by (receiver, chunk) and chunks by (sender, bucket): ours form one
     * run, grouped by sender and bucket */
    uint32_t i = 0, hi = r->m.nsegs;
    for (uint32_t s = 0; s < st->nsenders; s++) {
        ipc_from_t *f = &st->from[s];
        wsync_plan_bucket_chunks(plan, s, f->chunk_start);
        while (i < hi && plan->chunks[r->m.segs[i].chunk].sender < s)
            i++;
        for (uint32_t k = 0; k <= f->nbuckets; k++) {
            while (i < hi && plan->chunks[r->m.segs[i].chunk].sender == s &&
                   plan->chunks[r->m.segs[i].chunk].bucket < k)
                i++;
            f->seg_start[k] = i;
            if (k > 0 && f->seg_start[k] > f->seg_start[k - 1])
                f->needed++;
        }
    }
}

/* FP8 on the wire: a sender that quantizes after our last bucket from it sends PACKED. */
static wsync_status_t mark_await_packed(const wsync_plan_t *plan, ipc_receiver_t *st)
{
    int64_t *last = calloc(st->nsenders + 1, sizeof(*last));
    if (last == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
    wire_last_buckets(plan, 0, plan->nchunks, last);
    for (uint32_t s = 0; s < st->nsenders; s++) {
        ipc_from_t *f = &st->from[s];
        int64_t mine = -1;
        for (uint32_t k = 0; k < f->nbuckets; k++)
            if (f->seg_start[k] < f->seg_start[k + 1])
                mine = k;
        f->await_packed = f->needed > 0 && mine < last[s];
    }
    free(last);
    return WSYNC_OK;
}

/* Where our segments land: the bytes of a version, DATA_HELLO's host and GPU flags for each
 * sender, the buckets our kernels copy (*nevents: one event each). */
static void classify_segments(wsync_receiver_t *r, ipc_receiver_t *st, uint32_t *nevents)
{
    const wsync_plan_t *plan = r->m.plan;
    for (uint32_t i = 0; i < r->m.nsegs; i++) {
        const wsync_segment_t *sg = &r->m.segs[i];
        const wsync_chunk_t *c = &plan->chunks[sg->chunk];
        ipc_from_t *f = &st->from[c->sender];
        /* an FP8 chunk's segment is the whole chunk: its codes and scales */
        st->bytes_total += c->rule != 0 ? wsync_chunk_wire_bytes(c)
                                        : sg->dst.rows * sg->dst.cols *
                                              wsync_dtype_size(r->land_dtype[sg->target]);
        if (r->targets[sg->target].mem == WSYNC_MEM_CUDA) {
            f->flags |= HELLO_GPU;
            *nevents += !f->gpu[c->bucket];
            f->gpu[c->bucket] = 1;
            st->gpu = 1;
        } else {
            f->flags |= HELLO_HOST;
        }
    }
}

/* CUDA targets (on r->device, entered): the UUIDs of the GPUs ours can read, ours first (a
 * sender on one of them is read in place), our stream, the pending copies' room and each GPU
 * bucket's event. */
static wsync_status_t gpu_setup(wsync_receiver_t *r, ipc_receiver_t *st, uint32_t nevents,
                                uint8_t (*uuids)[WSYNC_DEV_UUID_BYTES], uint32_t *nuuids)
{
    int n = 0;
    wsync_status_t rc = wsync_dev_uuid(r->device, uuids[*nuuids]);
    if (rc == WSYNC_OK) {
        (*nuuids)++;
        rc = wsync_dev_count(&n);
    }
    for (int d = 0; d < n && rc == WSYNC_OK && *nuuids < MAX_UUIDS; d++) {
        int can = 0;
        if (d == r->device)
            continue;
        rc = wsync_dev_can_access_peer(r->device, d, &can);
        if (rc == WSYNC_OK && can && (rc = wsync_dev_uuid(d, uuids[*nuuids])) == WSYNC_OK)
            (*nuuids)++;
    }
    if (rc == WSYNC_OK)
        rc = wsync_dev_stream_create(&st->stream);
    st->pend = calloc(nevents + 1, sizeof(*st->pend));
    st->pend_cap = nevents;
    st->cache_land[0] = calloc(r->ntargets + 1, sizeof(void *));
    st->cache_land[1] = calloc(r->ntargets + 1, sizeof(void *));
    st->cache_scales[0] = calloc(r->ntargets + 1, sizeof(float *));
    st->cache_scales[1] = calloc(r->ntargets + 1, sizeof(float *));
    if (rc == WSYNC_OK && (st->pend == NULL || st->cache_land[0] == NULL ||
                           st->cache_land[1] == NULL || st->cache_scales[0] == NULL ||
                           st->cache_scales[1] == NULL))
        rc = wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
    for (uint32_t s = 0; s < st->nsenders && rc == WSYNC_OK; s++) {
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
    return rc;
}

/* Connect to each sender we need and ask for its buckets (DATA_HELLO: our rank, pid, flags
 * and, with CUDA targets, the UUIDs of the GPUs we read); *nconn: how many. */
static wsync_status_t send_hellos(wsync_receiver_t *r, ipc_receiver_t *st,
                                  uint8_t (*uuids)[WSYNC_DEV_UUID_BYTES], uint32_t nuuids,
                                  uint32_t *nconn)
{
    for (uint32_t s = 0; s < st->nsenders; s++) {
        ipc_from_t *f = &st->from[s];
        const wsync_peer_t *peer = &r->m.planmsg.peers[s];
        char name[128];
        int fd;
        wsync_wbuf_t b;
        wsync_status_t rc;

        if (f->needed == 0)
            continue;
        if ((rc = wsync_unix_connect(peer->data_addr, &fd)) != WSYNC_OK)
            return rc;
        snprintf(name, sizeof(name), "sender %u (pid %u)", s, peer->pid);
        rc = wsync_loop_add(r->m.loop, fd, WSYNC_CONN_UNIX, name, NULL, &f->conn);
        if (rc != WSYNC_OK)
            return rc;
        wsync_wbuf_init(&b);
        wsync_put_u32(&b, (uint32_t)r->m.rank);
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
            return rc;
        (*nconn)++;
    }
    return WSYNC_OK;
}

/* One DATA_FDS frame from f's sender: the first of its message (the table, and how many
 * descriptors it brings in all) or one that brings more descriptors; once all are in, what it
 * shared is taken (wsync_ipc_take_data_fds) and *taken set. */
static wsync_status_t one_data_fds(wsync_receiver_t *r, ipc_from_t *f, wsync_msg_t *msg,
                                   int *taken)
{
    const int me = r->m.rank;
    int more = msg->len == 4 && msg->payload[0] == 0xff && msg->payload[1] == 0xff &&
               msg->payload[2] == 0xff && msg->payload[3] == 0xff;
    *taken = 0;
    if (f == NULL || (more && f->first == NULL) || (!more && f->first != NULL)) {
        wsync_msg_free(msg);
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: unexpected DATA_FDS", me);
    }
    if (!more) {
        const char *why = "?";
        f->want_fds = wsync_ipc_fds_wanted(msg->payload, msg->len, &why);
        if (f->want_fds == UINT32_MAX) {
            wsync_status_t rc = wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: malformed "
                                          "DATA_FDS from %s: %s (%u bytes, %d descriptors in the "
                                          "first frame)", me, f->conn->name, why, msg->len,
                                          msg->nfds);
            wsync_msg_free(msg);
            return rc;
        }
        if ((f->xfds = calloc(f->want_fds + 1, sizeof(int))) == NULL) {
            wsync_msg_free(msg);
            return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
        }
        WSYNC_LOG_D("ipc: receiver %d: DATA_FDS from %s: %u bytes, %u descriptors in all", me,
                    f->conn->name, msg->len, f->want_fds);
        if (f->want_fds > WSYNC_MSG_MAX_FDS)
            wsync_cuda_ipc_fd_room(f->want_fds);
    }
    if (f->nxfds + (uint32_t)msg->nfds > f->want_fds) {
        wsync_msg_free(msg);
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: %s sent more descriptors than "
                         "it announced", me, f->conn->name);
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
        return WSYNC_OK;
    wsync_status_t rc = wsync_ipc_take_data_fds(r, f, f->first->payload, f->first->len, f->xfds,
                                                f->nxfds);
    wsync_msg_free(f->first);
    f->first = NULL;
    free(f->xfds);
    f->xfds = NULL;
    f->nxfds = 0;
    *taken = rc == WSYNC_OK;
    return rc;
}

/* The receiver's set-up: each sender's ranges of the plan, its delta and FP8 state, our GPU's,
 * then a DATA_HELLO to each sender we need and what it shares taken from its DATA_FDS (within
 * the params' timeout). */
static wsync_status_t ipc_receiver_setup(wsync_receiver_t *r)
{
    const wsync_plan_t *plan = r->m.plan;
    uint32_t me = (uint32_t)r->m.rank, ns = plan->nsenders, nconn = 0;
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
    for (uint32_t s = 0; s < ns; s++) {
        ipc_from_t *f = &st->from[s];
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
    }
    sender_ranges(r, st);
    if (plan->nrules > 0 && (rc = mark_await_packed(plan, st)) != WSYNC_OK)
        return rc;
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
    classify_segments(r, st, &nevents);
    if (st->gpu) {
        if (r->device < 0)
            return wsync_err(WSYNC_ERR_INTERNAL, "ipc: receiver %d has CUDA targets but no device",
                             r->m.rank);
        if ((rc = wsync_dev_enter(r->device, &saved)) != WSYNC_OK)
            return rc;
        if ((rc = gpu_setup(r, st, nevents, uuids, &nuuids)) != WSYNC_OK)
            goto out;
    }
    if ((rc = send_hellos(r, st, uuids, nuuids, &nconn)) != WSYNC_OK)
        goto out;
    while (nconn > 0) {
        wsync_msg_t *msg;
        ipc_from_t *f = NULL;
        int taken = 0;

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
        if ((rc = one_data_fds(r, f, msg, &taken)) != WSYNC_OK)
            goto out;
        nconn -= (uint32_t)taken;
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

static wsync_status_t ipc_receiver_recv(wsync_receiver_t *r, uint64_t version)
{
    ipc_receiver_t *st = r->m.scheme_state;
    int saved = -1;
    wsync_status_t rc;

    if (!st->gpu)
        return wsync_ipc_recv_body(r, st, version);
    if ((rc = wsync_dev_enter(r->device, &saved)) != WSYNC_OK)
        return rc;
    rc = wsync_ipc_recv_body(r, st, version);
    if (rc != WSYNC_OK && st->stream != NULL) {
        /* nothing of ours may still write into the targets once we return */
        char text[1024];
        snprintf(text, sizeof(text), "%s", wsync_last_error());
        if (wsync_dev_stream_sync(st->stream, wsync_deadline_in(r->m.timeout_ms),
                                  "ipc: copies after a failed version") != WSYNC_OK)
            WSYNC_LOG_W("ipc: receiver %d: %s", r->m.rank, wsync_last_error());
        sync_sender_streams(r, st, "ipc: copies after a failed version");
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
