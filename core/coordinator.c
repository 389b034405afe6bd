/* The coordinator (runs in sender 0's process, on its own progress thread). It admits each
 * participant once (HELLO), collects every description (DESCRIBE), compiles the plan, picks the
 * scheme and sends both to all (PLAN), then orders each version: BEGIN to receivers once every
 * sender began it, DONE to senders once every receiver committed it. Any failure — a lost peer, a
 * bad description, a rank claimed twice — ends the group and every participant is told why. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/coord_stats.h"
#include "core/delta_state.h"
#include "core/doorbell.h"
#include "core/log.h"
#include "core/objects.h"
#include "core/sock.h"
#include "core/util.h"
#include "core/wire_policy.h"

typedef struct {
    wsync_conn_t *conn;
    wsync_hello_t hello;
    int present;                     /* HELLO accepted */
    int described;
    int left;                        /* said BYE */
    uint64_t begun, committed;       /* versions */
    uint64_t lease;                  /* store: the version this reader holds, 0 if none */
    wsync_shard_desc_t *shards;
    size_t nshards;
    wsync_target_desc_t *targets;
    size_t ntargets;
    uint8_t gpu[16];                 /* UUID of its CUDA memory's GPU (DESCRIBE's trailer) */
    int has_gpu;
} coord_peer_t;

struct wsync_coord {
    wsync_loop_t *loop;
    char addr[128];
    int nsenders, nreceivers;
    int timeout_ms;
    coord_peer_t *senders, *receivers;
    int npresent, ndescribed;
    int planned;
    const wsync_scheme_ops_t *scheme;  /* chosen at the first plan */
    char explain[4096];
    uint32_t delta;                  /* the group's delta mode, resolved with the scheme */
    int fp8_wire;                    /* rank 0's fp8_wire param: 0 off, 1 where it pays, 2 on */
    int wire_tensor;                 /* this compile may send per-tensor FP8 targets' chunks as
                                        FP8 (tensor_candidate) */
    /* store: published versions (the directory), readers waiting for one, how many to keep */
    struct coord_version {
        uint64_t version;
        int npublished;
        wsync_wbuf_t *entries;       /* [nsenders] each sender's encoded directory entry */
        int leases;
    } *versions;
    int nversions;
    uint64_t latest;                 /* newest version every sender published */
    struct coord_fetch {
        coord_peer_t *peer;
        uint64_t version, after;
        uint64_t seq;                /* echoed in the reply, so a late answer is recognised */
    } *fetches;
    int nfetches;
    uint32_t keep;
    int failed;
    char fail_text[1024];            /* why the group ended, for late joiners */
    uint64_t version;                /* the version in flight or last done */
    int nbegun, ncommitted;
    /* figures of the version in flight and of the last one done (wsync_coord_stats) */
    uint64_t begin_ns, bcast_ns;
    pthread_mutex_t stats_mu;
    wsync_coord_stats_t stats;
    /* doorbells (core/doorbell.h): the page offered to participants on this host, NULL if off;
     * bells_on once the plan turned it on (then no BEGIN, COMMIT or DONE travels) */
    wsync_bells_t *bells;
    int bells_on;
};

/* Doorbells on: the per-version state lives in the page; copy it into the fields the messages
 * would have kept (versions begun and committed per peer, the version in flight), for the texts
 * that say on whom the group waits and for a leave in the middle of a version. */
static void bell_sync(wsync_coord_t *co)
{
    wsync_bells_t *b = co->bells;
    uint32_t kb, kd, nb;
    uint64_t newest = 0;

    if (!co->bells_on)
        return;
    kb = atomic_load(&b->hdr->begin_seq);
    kd = atomic_load(&b->hdr->done_seq);
    nb = atomic_load(&b->hdr->nbegin) - kb * (uint32_t)co->nsenders;   /* toward the next one */
    for (int i = 0; i < co->nsenders; i++) {
        co->senders[i].begun = atomic_load(&wsync_bells_line(b, 1, (uint32_t)i)->version);
        newest = WSYNC_MAX(newest, co->senders[i].begun);
    }
    co->ncommitted = 0;
    co->version = kb != kd || nb > 0 ? newest : atomic_load(&b->hdr->version);
    co->nbegun = kb != kd ? co->nsenders : (int)nb;
    for (int i = 0; i < co->nreceivers; i++) {
        co->receivers[i].committed = atomic_load(&wsync_bells_line(b, 0, (uint32_t)i)->version);
        co->ncommitted += co->receivers[i].committed == co->version;
    }
}

/* A receiver left: with doorbells on, the next sender to begin a version must know. */
static void bell_mark_left(wsync_coord_t *co, const coord_peer_t *p)
{
    if (co->bells != NULL && p->hello.role == WSYNC_ROLE_RECEIVER)
        atomic_store(&wsync_bells_line(co->bells, 0, (uint32_t)p->hello.rank)->left, 1);
}

/* At the plan for everyone: doorbells on when every participant mapped the page (so all are on
 * this host), the scheme is synchronous, and no fault is being injected (the faults suite drives
 * the messages themselves). Set before PLAN goes out: members read the mode once they have it. */
static void bells_decide(wsync_coord_t *co)
{
    const char *why = NULL;
    char text[160];

    if (co->bells == NULL)
        return;
    if (co->scheme->async)
        why = "the store's readers come and go";
    for (int i = 0; i < co->nsenders + co->nreceivers && why == NULL; i++) {
        int sender = i < co->nsenders;
        uint32_t rank = (uint32_t)(sender ? i : i - co->nsenders);
        if (!atomic_load(&wsync_bells_line(co->bells, sender, rank)->attached)) {
            snprintf(text, sizeof(text), "%s %u is not on this host or could not map the page",
                     sender ? "sender" : "receiver", rank);
            why = text;
        }
    }
    co->bells_on = why == NULL;
    atomic_store(&co->bells->hdr->mode, (uint32_t)co->bells_on);
    if (why == NULL)
        WSYNC_LOG_I("coordinator: doorbells on: BEGIN, COMMIT and DONE through shared memory");
    else
        WSYNC_LOG_I("coordinator: doorbells off (%s): BEGIN, COMMIT and DONE as messages", why);
}

static int send_timeout(const wsync_coord_t *co)
{
    return WSYNC_MIN(co->timeout_ms, 5000);
}

/* Every send of the coordinator runs on its loop thread, which serves everyone: it never waits
 * for a peer's socket (wsync_conn_post). A peer that stops reading is closed at the send timeout
 * (or the queue's cap), naming it, and coord_on_close treats it as any lost peer. */
static wsync_status_t coord_send(const wsync_coord_t *co, wsync_conn_t *c, uint16_t type,
                                 const void *data, size_t len)
{
    return wsync_conn_post(c, type, data, (uint32_t)len, send_timeout(co), NULL);
}

static void peer_name(const coord_peer_t *p, char *buf, size_t len)
{
    snprintf(buf, len, "%s %d (pid %u on %s)",
             p->hello.role == WSYNC_ROLE_SENDER ? "sender" : "receiver", p->hello.rank,
             p->hello.pid, p->hello.hostname ? p->hello.hostname : "?");
}

static void for_each_peer(wsync_coord_t *co, void (*fn)(wsync_coord_t *, coord_peer_t *, void *),
                          void *arg)
{
    for (int i = 0; i < co->nsenders; i++)
        if (co->senders[i].present)
            fn(co, &co->senders[i], arg);
    for (int i = 0; i < co->nreceivers; i++)
        if (co->receivers[i].present)
            fn(co, &co->receivers[i], arg);
}

typedef struct {
    uint16_t type;
    const wsync_wbuf_t *payload;
    const wsync_conn_t *except;
    wsync_outbuf_t *shared;          /* one queued copy for every peer that must wait for it */
} bcast_t;

static void bcast_one(wsync_coord_t *co, coord_peer_t *p, void *arg)
{
    bcast_t *b = arg;
    if (p->conn == b->except || p->left || atomic_load(&p->conn->closed))
        return;
    wsync_conn_post(p->conn, b->type, b->payload->data, (uint32_t)b->payload->len,
                    send_timeout(co), &b->shared);
}

/* End the group: every participant (but `except`) gets type (ABORT or PEER_LOST) and the text. */
static void group_fail(wsync_coord_t *co, uint16_t type, wsync_status_t st, const char *text,
                       const wsync_conn_t *except)
{
    wsync_wbuf_t b;
    bcast_t arg;

    if (co->failed)
        return;
    co->failed = 1;
    snprintf(co->fail_text, sizeof(co->fail_text), "%s", text);
    if (st == WSYNC_ERR_ABORTED)
        WSYNC_LOG_I("coordinator: %s", text);   /* the orderly end */
    else
        WSYNC_LOG_W("coordinator: group ended: %s", text);
    wsync_wbuf_init(&b);
    wsync_status_msg_encode(st, text, &b);
    arg.type = type;
    arg.payload = &b;
    arg.except = except;
    arg.shared = NULL;
    for_each_peer(co, bcast_one, &arg);
    wsync_outbuf_release(arg.shared);
    wsync_wbuf_free(&b);
}

static void reject(wsync_coord_t *co, wsync_conn_t *c, wsync_status_t st, const char *text)
{
    wsync_wbuf_t b;

    wsync_wbuf_init(&b);
    wsync_status_msg_encode(st, text, &b);
    coord_send(co, c, WSYNC_MSG_ABORT, b.data, b.len);
    wsync_wbuf_free(&b);
    wsync_loop_close(co->loop, c, WSYNC_OK, text);
}

static void send_u64(wsync_coord_t *co, coord_peer_t *p, uint16_t type, uint64_t v)
{
    wsync_wbuf_t b;

    wsync_wbuf_init(&b);
    wsync_put_u64(&b, v);
    coord_send(co, p->conn, type, b.data, b.len);
    wsync_wbuf_free(&b);
}

static void on_hello(wsync_coord_t *co, wsync_conn_t *c, wsync_msg_t *m)
{
    wsync_hello_t h;
    char text[512], name[160];
    coord_peer_t *p;
    int n;

    if (wsync_hello_decode(m->payload, m->len, &h) != WSYNC_OK) {
        snprintf(text, sizeof(text), "%s sent a malformed HELLO", c->name);
        wsync_loop_close(co->loop, c, WSYNC_ERR_PROTOCOL, text);
        return;
    }
    n = h.role == WSYNC_ROLE_SENDER ? co->nsenders : co->nreceivers;
    const char *role = h.role == WSYNC_ROLE_SENDER ? "sender" : "receiver";
    /* receivers may leave the number of senders to the coordinator (-1) */
    if ((h.nsenders != co->nsenders && !(h.role == WSYNC_ROLE_RECEIVER && h.nsenders == -1)) ||
        h.nreceivers != co->nreceivers) {
        snprintf(text, sizeof(text), "%s %d (pid %u) expects %d senders and %d receivers; the "
                 "coordinator was created for %d and %d", role, h.rank, h.pid, h.nsenders,
                 h.nreceivers, co->nsenders, co->nreceivers);
        reject(co, c, WSYNC_ERR_MISMATCH, text);
        wsync_hello_clear(&h);
        return;
    }
    if (h.rank < 0 || h.rank >= n) {
        snprintf(text, sizeof(text), "%s rank %d (pid %u) is outside [0, %d)", role, h.rank, h.pid, n);
        reject(co, c, WSYNC_ERR_INVALID, text);
        wsync_hello_clear(&h);
        return;
    }
    p = h.role == WSYNC_ROLE_SENDER ? &co->senders[h.rank] : &co->receivers[h.rank];
    if (p->present) {
        /* two processes claim one rank: neither can be trusted, so the group ends */
        snprintf(text, sizeof(text), "%s rank %d claimed twice: by pid %u on %s and by pid %u on %s",
                 role, h.rank, p->hello.pid, p->hello.hostname, h.pid, h.hostname);
        reject(co, c, WSYNC_ERR_MISMATCH, text);
        group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_MISMATCH, text, NULL);
        wsync_hello_clear(&h);
        return;
    }
    int late_reader = co->planned && co->scheme != NULL && co->scheme->async &&
                      h.role == WSYNC_ROLE_RECEIVER;
    if (co->failed || (co->planned && !late_reader)) {
        if (co->failed)
            snprintf(text, sizeof(text), "%s %d (pid %u) came after the group had ended: %s", role,
                     h.rank, h.pid, co->fail_text);
        else
            snprintf(text, sizeof(text), "%s %d (pid %u) came after the group was set up", role,
                     h.rank, h.pid);
        reject(co, c, co->failed ? WSYNC_ERR_ABORTED : WSYNC_ERR_STATE, text);
        wsync_hello_clear(&h);
        return;
    }
    if (h.role == WSYNC_ROLE_SENDER && h.rank == 0)
        co->keep = h.keep_versions > 0 ? h.keep_versions : 2;
    p->hello = h;
    p->conn = c;
    p->present = 1;
    wsync_wbuf_t wb;
    wsync_wbuf_init(&wb);
    if (co->bells != NULL && h.host_id != NULL && strcmp(h.host_id, wsync_host_id()) == 0) {
        /* on this host (and network namespace): offer the doorbell page (core/doorbell.h) */
        wsync_put_u32(&wb, (uint32_t)getpid());
        wsync_put_u32(&wb, (uint32_t)co->bells->fd);
        wsync_put_u64(&wb, co->bells->bytes);
        wsync_put_u32(&wb, (uint32_t)co->nsenders);
        wsync_put_u32(&wb, (uint32_t)co->nreceivers);
    }
    co->npresent++;
    c->user = p;
    peer_name(p, name, sizeof(name));
    pthread_mutex_lock(&c->send_lock);
    snprintf(c->name, sizeof(c->name), "%s", name);
    pthread_mutex_unlock(&c->send_lock);
    WSYNC_LOG_I("coordinator: %s joined (%d of %d)", name, co->npresent,
                co->nsenders + co->nreceivers);
    coord_send(co, c, WSYNC_MSG_WELCOME, wb.err ? NULL : wb.data, wb.err ? 0 : wb.len);
    wsync_wbuf_free(&wb);
}

/* Bytes the receivers take over the bytes taken from the senders (each chunk counted once). */
static double plan_replication(const wsync_plan_t *plan)
{
    double sent = 0;
    uint64_t taken, wire;
    for (uint32_t i = 0; i < plan->nchunks; i++) {
        const wsync_chunk_t *c = &plan->chunks[i];
        sent += (double)c->src.rows * (double)c->src.cols * (double)wsync_dtype_size(c->dtype);
    }
    wsync_plan_segment_bytes(plan, &taken, &wire);
    return sent > 0 ? (double)taken / sent : 1.0;
}

/* The first plan chooses the scheme from what the group is (peers, memory kinds, GPUs, the
 * plan's replication); on failure every participant has been told. Returns 0 or -1. */
static int choose_scheme(wsync_coord_t *co, int only, const wsync_plan_t *plan,
                         const wsync_shard_desc_t *shards, size_t nsh,
                         const wsync_target_desc_t *targets, size_t ntg, wsync_hello_t *sh,
                         wsync_hello_t *rh)
{
    wsync_group_info_t g;
    wsync_status_t st;
    const uint8_t **sgpu = calloc((size_t)co->nsenders + 1, sizeof(*sgpu));
    const uint8_t **rgpu = calloc((size_t)co->nreceivers + 1, sizeof(*rgpu));
    if (sgpu == NULL || rgpu == NULL) {
        free(sgpu);
        free(rgpu);
        group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_NOMEM, "coordinator: out of memory", NULL);
        return -1;
    }
    memset(&g, 0, sizeof(g));
    g.nsenders = (uint32_t)co->nsenders;
    g.nreceivers = only == -2 ? 0 : (uint32_t)co->nreceivers;
    g.senders = sh;
    g.receivers = rh;
    for (size_t i = 0; i < nsh; i++)
        g.mem_kinds |= 1u << shards[i].mem;
    for (size_t i = 0; i < ntg; i++)
        g.mem_kinds |= 1u << targets[i].mem;
    for (int i = 0; i < co->nsenders; i++)
        sgpu[i] = co->senders[i].has_gpu ? co->senders[i].gpu : NULL;
    for (int i = 0; i < co->nreceivers; i++)
        rgpu[i] = co->receivers[i].has_gpu ? co->receivers[i].gpu : NULL;
    g.sender_gpu = sgpu;
    g.receiver_gpu = rgpu;
    g.replication = plan_replication(plan);
    g.pair_bytes = plan->pair_bytes;   /* ipc: only the pairs that carry bytes must share a host */
    st = wsync_negotiate_probed(&g, co->senders[0].hello.scheme, &co->scheme, co->explain,
                                sizeof(co->explain));
    if (st == WSYNC_OK) {
        /* delta versions: every participant's say, the scheme, and where they are */
        int fp8 = 0;
        size_t used = strlen(co->explain);
        for (size_t i = 0; i < ntg && !fp8; i++)
            fp8 = wsync_target_quantized(targets[i].dtype, targets[i].quant);
        if (used + 2 < sizeof(co->explain) && used > 0 && co->explain[used - 1] != '\n')
            co->explain[used++] = '\n';
        co->explain[used] = '\0';
        st = wsync_delta_resolve(&g, co->scheme, fp8, &co->delta, co->explain + used,
                                 sizeof(co->explain) - used);
    }
    free(sgpu);
    free(rgpu);
    if (st != WSYNC_OK) {
        group_fail(co, WSYNC_MSG_ABORT, st, wsync_last_error(), NULL);
        return -1;
    }
    return 0;
}

/* Distinct GPUs of the participants' CUDA memory. */
static int gpus_of(const wsync_coord_t *co)
{
    const uint8_t *seen[64];
    int n = 0;

    for (int i = 0; i < co->nsenders + co->nreceivers && n < 64; i++) {
        const coord_peer_t *p = i < co->nsenders ? &co->senders[i]
                                                 : &co->receivers[i - co->nsenders];
        int k = 0;
        if (!p->has_gpu)
            continue;
        while (k < n && memcmp(seen[k], p->gpu, 16) != 0)
            k++;
        if (k == n)
            seen[n++] = p->gpu;
    }
    return n;
}

/* Some sender shares a GPU with some receiver. */
static int group_colocated(const wsync_coord_t *co)
{
    for (int r = 0; r < co->nreceivers; r++)
        for (int s = 0; s < co->nsenders; s++)
            if (co->receivers[r].has_gpu && co->senders[s].has_gpu &&
                memcmp(co->receivers[r].gpu, co->senders[s].gpu, 16) == 0)
                return 1;
    return 0;
}

/* Some target could take FP8 on the wire: rank 0 allows it, some target is FP8 with block or
 * channel scales, and the scheme, if already chosen, is ipc, nccl or the store, without delta
 * versions. */
static int wire_candidate(const wsync_coord_t *co, const wsync_target_desc_t *targets, size_t ntg)
{
    int fp8 = 0;

    if (!co->fp8_wire || (co->scheme != NULL &&
                          (co->delta != WSYNC_DELTA_MODE_OFF ||
                           (strcmp(co->scheme->name, "ipc") != 0 &&
                            strcmp(co->scheme->name, "nccl") != 0 &&
                            strcmp(co->scheme->name, "store") != 0))))
        return 0;
    for (size_t i = 0; i < ntg && !fp8; i++)
        fp8 = wsync_target_quantized(targets[i].dtype, targets[i].quant) &&
              (targets[i].quant != WSYNC_QUANT_TENSOR || co->wire_tensor);
    return fp8;
}

/* Per-tensor FP8 targets may travel FP8 too: their senders agree on each one's amax every
 * version (schemes/wire_amax.c), which ipc and nccl do, from host or CUDA shards, and the store
 * with fp8_wire 2 from host shards into host targets (schemes/store_amax.c; docs/fp8_wire.md
 * section 5). Some such target exists, and the scheme, if already chosen, is one of those. */
static int tensor_candidate(const wsync_coord_t *co, const wsync_shard_desc_t *shards,
                            size_t nsh, const wsync_target_desc_t *targets, size_t ntg)
{
    int any = 0;

    /* ipc and nccl senders exchange amaxes (host shards on the CPU, CUDA shards with the amax
     * kernels); the store's agree on the amaxes of sets their readers name
     * (schemes/store_amax.c) */
    if (!co->fp8_wire || (co->scheme != NULL && strcmp(co->scheme->name, "ipc") != 0 &&
                          strcmp(co->scheme->name, "nccl") != 0 &&
                          strcmp(co->scheme->name, "store") != 0))
        return 0;
    /* the store: with fp8_wire 2 only (its senders' exchange costs a round trip every version,
     * and a reader's new targets come plain for two versions), without delta versions, into
     * host targets; its senders pack them on the CPU (a CUDA shard's from its snapshot, or in
     * place from a host copy of each region) */
    (void)shards;
    (void)nsh;
    if (co->scheme != NULL && strcmp(co->scheme->name, "store") == 0) {
        if (co->fp8_wire != 2 || co->delta != WSYNC_DELTA_MODE_OFF)
            return 0;
        for (size_t i = 0; i < ntg; i++)
            if (targets[i].quant == WSYNC_QUANT_TENSOR && targets[i].mem != WSYNC_MEM_HOST)
                return 0;
    }
    for (size_t i = 0; i < ntg && !any; i++)
        any = wsync_target_quantized(targets[i].dtype, targets[i].quant) &&
              targets[i].quant == WSYNC_QUANT_TENSOR;
    return any;
}

static int plan_has_tensor(const wsync_plan_t *plan)
{
    for (uint32_t i = 0; i < plan->nchunks; i++)
        if (plan->chunks[i].rule != 0 &&
            wsync_wire_rule_needs_amax(&plan->rules[plan->chunks[i].rule - 1]))
            return 1;
    return 0;
}

static int plan_has_wire(const wsync_plan_t *plan)
{
    for (uint32_t i = 0; i < plan->nchunks; i++)
        if (plan->chunks[i].rule != 0)
            return 1;
    return 0;
}

/* What the plan's segments move: their values in their dtype (plain) and as they travel (wire),
 * and how many chunks their senders quantize. */
static void wire_totals(const wsync_plan_t *plan, uint64_t *plain, uint64_t *wire, uint64_t *nwire)
{
    *nwire = 0;
    wsync_plan_segment_bytes(plan, plain, wire);
    for (uint32_t i = 0; i < plan->nchunks; i++)
        *nwire += plan->chunks[i].rule != 0;
}

/* Append one line to the explanation. */
static void explain_line(wsync_coord_t *co, const char *line)
{
    size_t used = strlen(co->explain);
    if (used + 2 < sizeof(co->explain) && used > 0 && co->explain[used - 1] != '\n')
        co->explain[used++] = '\n';
    snprintf(co->explain + used, sizeof(co->explain) - used, "%s", line);
}

/* The explanation says FP8 on the wire once: a store compiles a plan per reader. */
static int wire_said(const wsync_coord_t *co)
{
    return strstr(co->explain, "FP8 on the wire:") != NULL;
}

/* Delta versions keep FP8 on the wire off (they diff plain values: docs/delta.md), said where
 * rank 0 allows it and some target could take it (a store's senders, planning before any
 * reader, cannot tell: said for them too). */
static void wire_off_delta(wsync_coord_t *co, const wsync_target_desc_t *targets, size_t ntg)
{
    int fp8 = ntg == 0;

    for (size_t i = 0; i < ntg && !fp8; i++)
        fp8 = wsync_target_quantized(targets[i].dtype, targets[i].quant) &&
              (targets[i].quant != WSYNC_QUANT_TENSOR || co->wire_tensor);
    if (fp8 && co->fp8_wire && co->scheme != NULL && co->delta != WSYNC_DELTA_MODE_OFF &&
        !wire_said(co))
        explain_line(co, "FP8 on the wire: off: delta versions diff plain values, so FP8 targets "
                         "take full bytes (docs/delta.md)");
}

/* FP8 on the wire (docs/fp8_wire.md) is for ipc, nccl and store groups without delta versions,
 * when rank 0 allows it and some target is FP8 with block or channel scales: delta versions diff
 * the values as they are. With fp8_wire 1, ipc takes it only where it pays
 * (core/wire_policy.c: not where sender and receiver share a GPU, unless the group spans 4 GPUs
 * or more and the wired plan moves at most 0.9 x the bytes). */
static int wire_wanted(wsync_coord_t *co, const wsync_target_desc_t *targets, size_t ntg,
                       const wsync_plan_t *wired)
{
    char why[300], line[400];
    uint64_t plain, wire, nwire;

    if (co->scheme == NULL || !wire_candidate(co, targets, ntg)) {
        wire_off_delta(co, targets, ntg);
        return 0;
    }
    wire_totals(wired, &plain, &wire, &nwire);
    if (co->fp8_wire == 1 && strcmp(co->scheme->name, "ipc") == 0 &&
        !wsync_ipc_wire_pays(group_colocated(co), gpus_of(co), plain, wire, why, sizeof(why))) {
        snprintf(line, sizeof(line), "FP8 on the wire: off: %s (fp8_wire 2 forces it)", why);
        explain_line(co, line);
        return 0;
    }
    return 1;
}

/* FP8 on the wire for an ipc group colocated on many GPUs whose senders kept the default bucket:
 * compiled again with the larger bucket of core/wire_policy.c (*bucket set to it, *plan
 * replaced). The larger bucket only saves time: a plan that does not compile with it is kept
 * as it was, logged. */
static void wire_bucket_again(wsync_coord_t *co, const wsync_shard_desc_t *shards, size_t nsh,
                              const wsync_target_desc_t *targets, size_t ntg, uint64_t *bucket,
                              const wsync_plan_opts_t *opts, wsync_plan_t **plan)
{
    uint64_t want = wsync_ipc_wire_bucket(group_colocated(co), gpus_of(co), *bucket);
    wsync_plan_t *again = NULL;
    wsync_status_t st;

    if (strcmp(co->scheme->name, "ipc") != 0 || want == *bucket)
        return;
    st = wsync_plan_compile_opts(shards, nsh, targets, ntg, (uint32_t)co->nsenders,
                                 (uint32_t)co->nreceivers, want, opts, &again);
    if (st != WSYNC_OK) {
        WSYNC_LOG_W("coordinator: FP8 on the wire: the plan with %llu MiB buckets did not compile "
                    "(%s); keeping %llu MiB", (unsigned long long)(want >> 20), wsync_last_error(),
                    (unsigned long long)(*bucket >> 20));
        return;
    }
    wsync_plan_free(*plan);
    *plan = again;
    *bucket = want;
}

/* One line in the explanation: what FP8 on the wire saves (every segment's bytes as they travel
 * against those of its values in their dtype). */
static void wire_explain(wsync_coord_t *co, const wsync_plan_t *wired)
{
    uint64_t before, after, nwire;
    char line[300];

    if (wire_said(co))
        return;
    wire_totals(wired, &before, &after, &nwire);
    snprintf(line, sizeof(line),
             "FP8 on the wire: %" PRIu64 " of %u chunks quantized by their senders; %.3f GB moved "
             "instead of %.3f GB (%.3f x)", nwire, wired->nchunks, (double)after / 1e9,
             (double)before / 1e9, before ? (double)after / (double)before : 1.0);
    explain_line(co, line);
    if (plan_has_tensor(wired))
        explain_line(co, strcmp(co->scheme->name, "store") == 0
                             ? "FP8 on the wire: per-tensor targets too (into host targets): "
                               "the store's senders agree on each one's amax every version "
                               "(fp8_wire 2), from the second after its reader came"
                             : "FP8 on the wire: per-tensor targets too: their senders agree on "
                               "each one's amax every version (ipc or nccl, from host or CUDA "
                               "shards: one control round trip through sender 0)");
}

/* Per-tensor FP8 targets left plain while rank 0 allows FP8 on the wire: said once. */
static void tensor_plain_said(wsync_coord_t *co, const wsync_plan_t *plan,
                              const wsync_target_desc_t *targets, size_t ntg)
{
    int any = 0;
    char line[300];

    for (size_t i = 0; i < ntg && !any; i++)
        any = wsync_target_quantized(targets[i].dtype, targets[i].quant) &&
              targets[i].quant == WSYNC_QUANT_TENSOR;
    if (!any || !co->fp8_wire || plan_has_tensor(plan) || strstr(co->explain, "per-tensor") ||
        strstr(co->explain, "FP8 on the wire: off"))
        return;
    /* the store's senders agree on amaxes too, with fp8_wire 2 into host targets */
    if (co->scheme != NULL && strcmp(co->scheme->name, "store") == 0)
        snprintf(line, sizeof(line), "FP8 on the wire: per-tensor targets plain, quantized by "
                 "their readers: the store's senders agree on the amax only with fp8_wire 2 "
                 "(WSYNC_FP8_WIRE=2; fp8_wire %d), into host targets, without delta versions",
                 co->fp8_wire);
    else
        snprintf(line, sizeof(line), "FP8 on the wire: per-tensor targets plain, quantized by "
                 "their receivers: only ipc, nccl and the store (fp8_wire 2) have their senders "
                 "agree on the amax (scheme %s)", co->scheme != NULL ? co->scheme->name : "?");
    explain_line(co, line);
}

/* A plan too large for one control frame is refused before encoding what may be a gigabyte;
 * every participant gets the abort with the reason instead of waiting for a plan. Returns 1 when
 * refused. */
static int refuse_oversize_plan(wsync_coord_t *co, const wsync_plan_t *plan)
{
    if (wsync_plan_wire_bytes(plan) <= WSYNC_FRAME_MAX)
        return 0;
    char text[400];
    snprintf(text, sizeof(text), "coordinator: the plan (%u chunks, %u segments) is "
             "%" PRIu64 " bytes encoded, more than the control frame limit of %u bytes; "
             "use larger buckets, fewer ranks, or layouts with fewer regions (e.g. "
             "fused experts)", plan->nchunks, plan->nsegments,
             wsync_plan_wire_bytes(plan), (unsigned)WSYNC_FRAME_MAX);
    group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_RANGE, text, NULL);
    return 1;
}

/* Encode the plan with the peers' addresses and send it to `to` (NULL: the senders only when
 * `only` is -2, else everyone present); failures abort the group. */
static void send_plan(wsync_coord_t *co, int only, coord_peer_t *to, const wsync_plan_t *plan,
                      const wsync_hello_t *sh, const wsync_hello_t *rh)
{
    wsync_wbuf_t pb, mb;
    wsync_plan_msg_t pm;
    uint32_t np = (uint32_t)(co->nsenders + co->nreceivers);
    wsync_peer_t *peers = calloc(np, sizeof(*peers));

    if (peers == NULL) {
        group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_NOMEM, "coordinator: out of memory", NULL);
        return;
    }
    for (uint32_t i = 0; i < np; i++) {
        const wsync_hello_t *h = i < (uint32_t)co->nsenders ? &sh[i] : &rh[i - co->nsenders];
        peers[i].role = i < (uint32_t)co->nsenders ? WSYNC_ROLE_SENDER : WSYNC_ROLE_RECEIVER;
        peers[i].rank = (int32_t)(i < (uint32_t)co->nsenders ? i : i - (uint32_t)co->nsenders);
        peers[i].pid = h->pid;
        peers[i].host_id = h->host_id;
        peers[i].data_addr = h->data_addr;
    }
    wsync_wbuf_init(&pb);
    wsync_wbuf_init(&mb);
    if (refuse_oversize_plan(co, plan)) {
        free(peers);
        wsync_wbuf_free(&pb);
        wsync_wbuf_free(&mb);
        return;
    }
    wsync_plan_encode(plan, &pb);
    pm.scheme = (char *)co->scheme->name;
    pm.explain = co->explain;
    pm.npeers = np;
    pm.peers = peers;
    pm.plan = pb.data;
    pm.plan_len = (uint32_t)pb.len;
    pm.delta = co->delta;
    wsync_plan_msg_encode(&pm, &mb);
    if (pb.err || mb.err || mb.len > WSYNC_FRAME_MAX) {
        char text[300];
        snprintf(text, sizeof(text), "coordinator: the plan message (%zu bytes with the "
                 "plan's %zu) does not fit one control frame of %u bytes%s", mb.len, pb.len,
                 (unsigned)WSYNC_FRAME_MAX, pb.err || mb.err ? " (out of memory)" : "");
        group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_RANGE, text, NULL);
    } else if (to != NULL) {
        coord_send(co, to->conn, WSYNC_MSG_PLAN, mb.data, mb.len);
    } else if (only == -2) {
        wsync_outbuf_t *shared = NULL;
        co->planned = 1;
        for (int i = 0; i < co->nsenders; i++)
            wsync_conn_post(co->senders[i].conn, WSYNC_MSG_PLAN, mb.data, (uint32_t)mb.len,
                            send_timeout(co), &shared);
        wsync_outbuf_release(shared);
    } else {
        bcast_t arg = {WSYNC_MSG_PLAN, &mb, NULL, NULL};
        co->planned = 1;
        for_each_peer(co, bcast_one, &arg);
        wsync_outbuf_release(arg.shared);
    }
    free(peers);
    wsync_wbuf_free(&pb);
    wsync_wbuf_free(&mb);
}

/* Compile a plan from every sender's shards and the targets of receiver `only` (-1: every
 * receiver; -2: none, for a store whose senders start before any reader), choose the scheme the
 * first time, and send PLAN to `to` (NULL: everyone present). */
static void compile_and_send_plan(wsync_coord_t *co, int only, coord_peer_t *to)
{
    size_t nsh = 0, ntg = 0, k;
    wsync_shard_desc_t *shards;
    wsync_target_desc_t *targets;
    wsync_hello_t *sh, *rh;
    wsync_plan_t *plan = NULL;
    wsync_status_t st;
    uint64_t bucket = co->senders[0].hello.bucket_bytes;

    for (int i = 0; i < co->nsenders; i++)
        nsh += co->senders[i].nshards;
    for (int i = 0; i < co->nreceivers; i++)
        if (only == -1 || only == i)
            ntg += co->receivers[i].ntargets;
    shards = calloc(nsh ? nsh : 1, sizeof(*shards));
    targets = calloc(ntg ? ntg : 1, sizeof(*targets));
    sh = calloc((size_t)co->nsenders, sizeof(*sh));
    rh = calloc((size_t)co->nreceivers, sizeof(*rh));
    if (shards == NULL || targets == NULL || sh == NULL || rh == NULL) {
        group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_NOMEM, "coordinator: out of memory", NULL);
        goto out;
    }
    /* shallow views: descriptions stay owned by their peers */
    k = 0;
    for (int i = 0; i < co->nsenders; i++) {
        memcpy(shards + k, co->senders[i].shards, co->senders[i].nshards * sizeof(*shards));
        k += co->senders[i].nshards;
        sh[i] = co->senders[i].hello;
    }
    k = 0;
    for (int i = 0; i < co->nreceivers; i++) {
        if (only == -1 || only == i) {
            memcpy(targets + k, co->receivers[i].targets,
                   co->receivers[i].ntargets * sizeof(*targets));
            k += co->receivers[i].ntargets;
        }
        rh[i] = co->receivers[i].hello;
    }
    /* FP8 on the wire compiled in from the start where it may be taken: the scheme is chosen on
     * that plan (which pairs carry bytes does not change), and only a group that turns out not
     * to take it (the store, delta versions, ipc colocated on few GPUs or saving too little)
     * compiles again */
    co->wire_tensor = tensor_candidate(co, shards, nsh, targets, ntg);
    wsync_plan_opts_t opts = {wire_candidate(co, targets, ntg), co->wire_tensor};
    st = wsync_plan_compile_opts(shards, nsh, targets, ntg, (uint32_t)co->nsenders,
                                 (uint32_t)co->nreceivers, bucket, &opts, &plan);
    if (st != WSYNC_OK) {
        char text[1200];
        if (only >= 0 && co->scheme != NULL && co->scheme->async) {
            /* a store reader that does not fit is turned away; the others carry on */
            snprintf(text, sizeof(text), "%s", wsync_last_error());
            reject(co, to->conn, st, text);
            to->present = 0;
            to->described = 0;
            co->npresent--;
            goto out;
        }
        group_fail(co, WSYNC_MSG_ABORT, st, wsync_last_error(), NULL);
        goto out;
    }
    if (co->scheme == NULL &&
        choose_scheme(co, only, plan, shards, nsh, targets, ntg, sh, rh) != 0)
        goto out;
    if (co->wire_tensor && !tensor_candidate(co, shards, nsh, targets, ntg)) {
        /* the scheme chosen does not exchange amaxes: per-tensor targets travel plain */
        wsync_plan_t *again = NULL;
        co->wire_tensor = 0;
        opts = (wsync_plan_opts_t){wire_candidate(co, targets, ntg), 0};
        st = wsync_plan_compile_opts(shards, nsh, targets, ntg, (uint32_t)co->nsenders,
                                     (uint32_t)co->nreceivers, bucket, &opts, &again);
        if (st != WSYNC_OK) {
            group_fail(co, WSYNC_MSG_ABORT, st, wsync_last_error(), NULL);
            goto out;
        }
        wsync_plan_free(plan);
        plan = again;
    }
    if (plan_has_wire(plan) && !wire_wanted(co, targets, ntg, plan)) {
        wsync_plan_t *plain = NULL;
        st = wsync_plan_compile(shards, nsh, targets, ntg, (uint32_t)co->nsenders,
                                (uint32_t)co->nreceivers, bucket, &plain);
        if (st != WSYNC_OK) {
            group_fail(co, WSYNC_MSG_ABORT, st, wsync_last_error(), NULL);
            goto out;
        }
        wsync_plan_free(plan);
        plan = plain;
    } else if (plan_has_wire(plan)) {
        uint64_t wb = bucket;
        wire_bucket_again(co, shards, nsh, targets, ntg, &wb, &opts, &plan);
        int said = wire_said(co);
        wire_explain(co, plan);
        if (wb != bucket && !said) {
            char line[300];
            snprintf(line, sizeof(line), "FP8 on the wire: ipc colocated on %d GPUs: buckets of "
                     "%llu MiB instead of the default %llu, so that a sender's two device slots "
                     "are seldom reused within a version (set bucket_bytes to choose)",
                     gpus_of(co), (unsigned long long)(wb >> 20), (unsigned long long)(bucket >> 20));
            explain_line(co, line);
        }
    } else if (co->scheme->async && only == -2 && co->fp8_wire && !wire_said(co)) {
        /* a store's senders plan before any reader: say what they will do */
        if (co->delta != WSYNC_DELTA_MODE_OFF)
            wire_off_delta(co, targets, ntg);
        else
            explain_line(co, co->fp8_wire == 2
                                 ? "FP8 on the wire: the store's senders quantize the FP8 chunks "
                                   "their readers ask for, from the version after a reader "
                                   "came; a reader quantizes what they did not, to the same "
                                   "bytes; per-tensor targets too (into host targets): "
                                   "their senders agree on each one's amax every version, from "
                                   "the second after its reader came"
                                 : "FP8 on the wire: the store's senders quantize the FP8 chunks "
                                   "(block or channel scales, whole cells) their readers ask "
                                   "for, from the version after a reader came; a reader "
                                   "quantizes what they did not, to the same bytes; per-tensor "
                                   "targets plain, quantized by their readers (fp8_wire 2 has "
                                   "the store's senders agree on amaxes)");
    } else {
        wire_off_delta(co, targets, ntg);
    }
    tensor_plain_said(co, plan, targets, ntg);
    WSYNC_LOG_I("coordinator: plan %016llx, %u chunks, %u segments; scheme %s\n%s",
                (unsigned long long)plan->fingerprint, plan->nchunks, plan->nsegments,
                co->scheme->name, co->explain);
    if (only == -1 && to == NULL)
        bells_decide(co);
    send_plan(co, only, to, plan, sh, rh);
out:
    wsync_plan_free(plan);
    free(shards);
    free(targets);
    free(sh);
    free(rh);
}

/* The user chose an asynchronous scheme (store): senders need not wait for any reader. */
static int store_first(const wsync_coord_t *co)
{
    const wsync_scheme_ops_t *s;

    if (!co->senders[0].present || co->senders[0].hello.scheme == NULL)
        return 0;
    s = wsync_scheme_find(co->senders[0].hello.scheme);
    return s != NULL && s->async;
}

static void on_describe(wsync_coord_t *co, coord_peer_t *p, wsync_msg_t *m)
{
    wsync_rbuf_t r;
    wsync_status_t st;
    char name[160], text[1200];

    peer_name(p, name, sizeof(name));
    if (p->described) {
        snprintf(text, sizeof(text), "%s described itself twice", name);
        group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_STATE, text, NULL);
        return;
    }
    wsync_rbuf_init(&r, m->payload, m->len);
    if (p->hello.role == WSYNC_ROLE_SENDER)
        st = wsync_shards_decode(&r, &p->shards, &p->nshards);
    else
        st = wsync_targets_decode(&r, &p->targets, &p->ntargets);
    if (st == WSYNC_OK && wsync_rbuf_left(&r) > 0) {   /* the GPU (wsync_member_put_gpu) */
        uint32_t n = wsync_get_u32(&r);
        const void *u = n == 1 ? wsync_get_bytes(&r, sizeof(p->gpu)) : NULL;
        if (u != NULL) {
            memcpy(p->gpu, u, sizeof(p->gpu));
            p->has_gpu = 1;
        }
        if (r.err || n > 1)
            st = wsync_err(WSYNC_ERR_PROTOCOL, "bad GPU identity after the descriptions");
    }
    if (st == WSYNC_OK) {
        /* the wire says who the descriptions belong to; trust only the connection */
        for (size_t i = 0; i < p->nshards; i++)
            p->shards[i].sender = (uint32_t)p->hello.rank;
        for (size_t i = 0; i < p->ntargets; i++)
            p->targets[i].receiver = (uint32_t)p->hello.rank;
    }
    if (st != WSYNC_OK) {
        snprintf(text, sizeof(text), "%s sent a malformed description: %s", name, wsync_last_error());
        group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_PROTOCOL, text, NULL);
        return;
    }
    p->described = 1;
    co->ndescribed++;
    if (co->planned) {                       /* a store reader joining late */
        if (p->hello.role == WSYNC_ROLE_RECEIVER)
            compile_and_send_plan(co, p->hello.rank, p);
        return;
    }
    if (store_first(co)) {
        int senders_done = 1;
        for (int i = 0; i < co->nsenders; i++)
            senders_done &= co->senders[i].described;
        if (!senders_done)
            return;
        /* the store starts with its senders; readers get plans of their own as they come */
        compile_and_send_plan(co, -2, NULL);
        for (int i = 0; i < co->nreceivers && !co->failed; i++)
            if (co->receivers[i].described)
                compile_and_send_plan(co, i, &co->receivers[i]);
        return;
    }
    if (co->ndescribed == co->nsenders + co->nreceivers)
        compile_and_send_plan(co, -1, NULL);
}

static void on_push_begin(wsync_coord_t *co, coord_peer_t *p, uint64_t v)
{
    char name[160], text[512];

    peer_name(p, name, sizeof(name));
    if (!co->planned) {
        snprintf(text, sizeof(text), "%s began version %llu before the group was set up", name,
                 (unsigned long long)v);
        group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_STATE, text, NULL);
        return;
    }
    if (co->nbegun == 0) {
        if (v <= co->version) {
            snprintf(text, sizeof(text), "%s pushes version %llu, not newer than version %llu",
                     name, (unsigned long long)v, (unsigned long long)co->version);
            group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_INVALID, text, NULL);
            return;
        }
        for (int i = 0; i < co->nreceivers; i++) {
            if (co->receivers[i].left) {
                snprintf(text, sizeof(text), "version %llu cannot be delivered: receiver %d has "
                         "left the group", (unsigned long long)v, i);
                group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_PEER_LOST, text, NULL);
                return;
            }
        }
        co->version = v;
        co->ncommitted = 0;
    } else if (v != co->version || p->begun == v) {
        snprintf(text, sizeof(text), "senders disagree: %s pushes version %llu while version %llu "
                 "is in flight", name, (unsigned long long)v, (unsigned long long)co->version);
        group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_INVALID, text, NULL);
        return;
    }
    p->begun = v;
    if (++co->nbegun == co->nsenders) {
        uint64_t t0 = wsync_now_ns();
        co->begin_ns = t0;
        for (int i = 0; i < co->nreceivers; i++)
            send_u64(co, &co->receivers[i], WSYNC_MSG_BEGIN, v);
        co->bcast_ns = wsync_now_ns() - t0;
    }
}

static void on_commit(wsync_coord_t *co, coord_peer_t *p, uint64_t v)
{
    char name[160], text[512];

    if (v != co->version || co->nbegun != co->nsenders || p->committed == v) {
        peer_name(p, name, sizeof(name));
        snprintf(text, sizeof(text), "%s committed version %llu, but version %llu is in flight",
                 name, (unsigned long long)v, (unsigned long long)co->version);
        group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_PROTOCOL, text, NULL);
        return;
    }
    p->committed = v;
    if (++co->ncommitted == co->nreceivers) {
        uint64_t t0 = wsync_now_ns();
        co->nbegun = 0;
        /* the figures first: a sender may read them as soon as its DONE arrives */
        pthread_mutex_lock(&co->stats_mu);
        co->stats.version = v;
        co->stats.begin_ns = co->begin_ns;
        co->stats.commit_ns = t0;
        co->stats.span_ns = t0 - co->begin_ns;
        co->stats.bcast_ns = co->bcast_ns;
        co->stats.participants = (uint32_t)co->npresent;
        pthread_mutex_unlock(&co->stats_mu);
        for (int i = 0; i < co->nsenders; i++)
            send_u64(co, &co->senders[i], WSYNC_MSG_DONE, v);
        t0 = wsync_now_ns() - t0;
        pthread_mutex_lock(&co->stats_mu);
        co->stats.bcast_ns += t0;
        pthread_mutex_unlock(&co->stats_mu);
    }
}

void wsync_coord_stats(const wsync_coord_t *co, wsync_coord_stats_t *out)
{
    pthread_mutex_lock((pthread_mutex_t *)&co->stats_mu);
    *out = co->stats;
    pthread_mutex_unlock((pthread_mutex_t *)&co->stats_mu);
    if (co->bells_on) {
        /* doorbells: the last sender to begin and the last receiver to commit stamped the page;
         * the one futex wake that replaced the broadcasts is not counted */
        wsync_bell_hdr_t *h = co->bells->hdr;
        if (atomic_load(&h->done_seq) == atomic_load(&h->begin_seq)) {
            out->version = atomic_load(&h->version);
            out->begin_ns = atomic_load(&h->begin_ns);
            out->commit_ns = atomic_load(&h->commit_ns);
            out->span_ns = out->commit_ns - out->begin_ns;
            out->bcast_ns = 0;
        }
        out->participants = (uint32_t)(co->nsenders + co->nreceivers);
    }
}

/* SCHEME_SETUP: forward a scheme's bytes, as SCHEME_RELAY naming their author, to one member or
 * to every other one. Only once the group is planned: before that no scheme was chosen. */
static void on_scheme_setup(wsync_coord_t *co, coord_peer_t *p, wsync_msg_t *m)
{
    char name[160], text[512];
    wsync_relay_t in, out;
    wsync_wbuf_t b;

    peer_name(p, name, sizeof(name));
    if (!co->planned || wsync_relay_decode(m->payload, m->len, WSYNC_MSG_SCHEME_SETUP, &in) != WSYNC_OK) {
        snprintf(text, sizeof(text), "%s sent a %s SCHEME_SETUP", name,
                 co->planned ? "malformed" : "premature (the group has no plan yet)");
        group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_PROTOCOL, text, NULL);
        return;
    }
    out.role = p->hello.role;
    out.rank = p->hello.rank;
    out.tag = in.tag;
    out.len = in.len;
    out.data = in.data;
    wsync_wbuf_init(&b);
    wsync_relay_encode(&out, &b);
    if (b.err) {
        wsync_wbuf_free(&b);
        group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_NOMEM, "coordinator: out of memory", NULL);
        return;
    }
    if (in.role == WSYNC_ROLE_NONE) {
        bcast_t arg = {WSYNC_MSG_SCHEME_RELAY, &b, p->conn, NULL};
        for_each_peer(co, bcast_one, &arg);
        wsync_outbuf_release(arg.shared);
    } else {
        int n = in.role == WSYNC_ROLE_SENDER ? co->nsenders : co->nreceivers;
        coord_peer_t *to = in.rank < n ? (in.role == WSYNC_ROLE_SENDER ? &co->senders[in.rank]
                                                                       : &co->receivers[in.rank])
                                       : NULL;
        if (to == NULL || !to->present || to == p) {
            snprintf(text, sizeof(text), "%s sent SCHEME_SETUP to %s %d, not another member of "
                     "this group", name, in.role == WSYNC_ROLE_SENDER ? "sender" : "receiver",
                     in.rank);
            group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_PROTOCOL, text, NULL);
        } else if (!to->left && !atomic_load(&to->conn->closed)) {
            coord_send(co, to->conn, WSYNC_MSG_SCHEME_RELAY, b.data, b.len);
        }
    }
    wsync_wbuf_free(&b);
}

/* ---- the store: directory of published versions ----------------------------------------- */

static struct coord_version *version_find(wsync_coord_t *co, uint64_t v)
{
    for (int i = 0; i < co->nversions; i++)
        if (co->versions[i].version == v)
            return &co->versions[i];
    return NULL;
}

static void version_drop(wsync_coord_t *co, int i)
{
    for (int s = 0; s < co->nsenders; s++)
        wsync_wbuf_free(&co->versions[i].entries[s]);
    free(co->versions[i].entries);
    co->versions[i] = co->versions[--co->nversions];
}

/* Keep the newest `keep` published versions and any that a reader holds; tell the senders to
 * release the others. */
static void store_evict(wsync_coord_t *co)
{
    for (int i = 0; i < co->nversions;) {
        struct coord_version *cv = &co->versions[i];
        int newer = 0;
        if (cv->npublished < co->nsenders || cv->leases > 0) {
            i++;
            continue;
        }
        for (int j = 0; j < co->nversions; j++)
            newer += co->versions[j].npublished == co->nsenders &&
                     co->versions[j].version > cv->version;
        if ((uint32_t)newer < co->keep) {
            i++;
            continue;
        }
        WSYNC_LOG_I("coordinator: store evicts version %llu", (unsigned long long)cv->version);
        for (int s = 0; s < co->nsenders; s++)
            send_u64(co, &co->senders[s], WSYNC_MSG_FREE, cv->version);
        version_drop(co, i);
    }
}

static void store_reply_error(wsync_coord_t *co, coord_peer_t *p, uint64_t seq, wsync_status_t st,
                              const char *text)
{
    wsync_wbuf_t b;

    wsync_wbuf_init(&b);
    wsync_put_u64(&b, seq);
    wsync_put_i32(&b, st);
    wsync_put_str(&b, text);
    coord_send(co, p->conn, WSYNC_MSG_DIRECTORY, b.data, b.len);
    wsync_wbuf_free(&b);
}

/* Answer a reader with version v's directory; it holds a lease on v until READ_DONE. */
static void store_reply(wsync_coord_t *co, coord_peer_t *p, uint64_t seq, struct coord_version *cv)
{
    wsync_wbuf_t b;

    wsync_wbuf_init(&b);
    wsync_put_u64(&b, seq);
    wsync_put_i32(&b, WSYNC_OK);
    wsync_put_str(&b, "");
    wsync_put_u64(&b, cv->version);
    wsync_put_u32(&b, (uint32_t)co->nsenders);
    for (int s = 0; s < co->nsenders; s++)
        wsync_put_bytes(&b, cv->entries[s].data, cv->entries[s].len);
    /* queued counts as given: a reader lost before reading it releases the lease on close */
    if (coord_send(co, p->conn, WSYNC_MSG_DIRECTORY, b.data, b.len) == WSYNC_OK) {
        cv->leases++;
        p->lease = cv->version;
    }
    wsync_wbuf_free(&b);
}

/* Try to answer fetch f now: 1 if answered (with data or an error), 0 to keep waiting. */
static int store_serve(wsync_coord_t *co, const struct coord_fetch *f)
{
    char text[256];
    struct coord_version *cv;

    if (f->version == 0) {
        if (co->latest <= f->after)
            return 0;
        cv = version_find(co, co->latest);
    } else {
        cv = version_find(co, f->version);
        if (cv == NULL || cv->npublished < co->nsenders) {
            if (f->version > co->latest)
                return 0;                     /* not published yet: wait for it */
            uint64_t oldest = co->latest;
            for (int i = 0; i < co->nversions; i++)
                if (co->versions[i].npublished == co->nsenders && co->versions[i].version < oldest)
                    oldest = co->versions[i].version;
            snprintf(text, sizeof(text), "version %llu is not in the store: it was evicted or "
                     "never published (kept now: %llu to %llu)", (unsigned long long)f->version,
                     (unsigned long long)oldest, (unsigned long long)co->latest);
            store_reply_error(co, f->peer, f->seq, WSYNC_ERR_NOT_FOUND, text);
            return 1;
        }
    }
    store_reply(co, f->peer, f->seq, cv);
    return 1;
}

static void store_serve_pending(wsync_coord_t *co)
{
    for (int i = 0; i < co->nfetches;) {
        if (store_serve(co, &co->fetches[i]))
            co->fetches[i] = co->fetches[--co->nfetches];
        else
            i++;
    }
}

static void store_drop_reader(wsync_coord_t *co, coord_peer_t *p)
{
    for (int i = 0; i < co->nfetches;) {
        if (co->fetches[i].peer == p)
            co->fetches[i] = co->fetches[--co->nfetches];
        else
            i++;
    }
    if (p->lease != 0) {
        struct coord_version *cv = version_find(co, p->lease);
        if (cv != NULL && cv->leases > 0)
            cv->leases--;
        p->lease = 0;
    }
    store_evict(co);
}

/* The checksums a store sender publishes after its directory entry (schemes/store.c): u64 block
 * bytes (0: none), then u32 nshards, and per shard u64 bytes and one u64 per block. Readers
 * decode them from the directory as sent here, so their shape is checked against the sender's
 * own description before they are kept. 0 if well formed (r then at their end). */
static int checksums_ok(wsync_rbuf_t *r, const coord_peer_t *p)
{
    uint64_t block = wsync_get_u64(r);

    if (r->err || block == 0)
        return r->err ? -1 : 0;
    if (block % 64 != 0 || block > (1ull << 40) || wsync_get_u32(r) != p->nshards)
        return -1;
    for (size_t i = 0; i < p->nshards && !r->err; i++) {
        uint64_t want = wsync_dtype_size(p->shards[i].param.dtype), bytes = wsync_get_u64(r);
        for (int d = 0; d < p->shards[i].param.ndim; d++)
            want *= (uint64_t)p->shards[i].box.len[d];
        uint64_t nb = bytes / block + (bytes % block != 0);
        if (bytes != want || nb > wsync_rbuf_left(r) / 8)
            return -1;
        wsync_get_bytes(r, (size_t)nb * 8);
    }
    return r->err ? -1 : 0;
}

/* After the checksums, the sender's FP8 table (schemes/store_fp8.h): u32 rows, u32 row bytes,
 * the rows, passed on to readers as they are. 0 when its size is sound. */
static int fp8_table_ok(wsync_rbuf_t *r)
{
    uint32_t n = wsync_get_u32(r), row = wsync_get_u32(r);

    if (r->err || row < 8 || row > 4096 || n > wsync_rbuf_left(r) / row)
        return -1;
    wsync_get_bytes(r, (size_t)n * row);
    return r->err ? -1 : 0;
}

static void on_publish(wsync_coord_t *co, coord_peer_t *p, wsync_msg_t *m)
{
    char name[160], text[512];
    wsync_rbuf_t r;
    wsync_dir_entry_t e;
    struct coord_version *cv;
    uint64_t v;
    int s = p->hello.rank;

    peer_name(p, name, sizeof(name));
    wsync_rbuf_init(&r, m->payload, m->len);
    v = wsync_get_u64(&r);
    const uint8_t *entry = r.p;
    if (wsync_dir_entry_decode(&r, &e) != WSYNC_OK || checksums_ok(&r, p) != 0 ||
        fp8_table_ok(&r) != 0 || wsync_rbuf_left(&r) != 0 || e.sender != (uint32_t)s || e.nshards != p->nshards) {
        wsync_dir_entry_clear(&e);
        snprintf(text, sizeof(text), "%s published a malformed directory entry", name);
        group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_PROTOCOL, text, NULL);
        return;
    }
    wsync_dir_entry_clear(&e);
    cv = version_find(co, v);
    if (cv == NULL) {
        for (int i = 0; i < co->nversions; i++) {
            if (co->versions[i].npublished < co->nsenders) {
                snprintf(text, sizeof(text), "senders disagree: %s publishes version %llu while "
                         "version %llu is incomplete", name, (unsigned long long)v,
                         (unsigned long long)co->versions[i].version);
                group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_INVALID, text, NULL);
                return;
            }
        }
        if (v <= co->latest) {
            snprintf(text, sizeof(text), "%s publishes version %llu, not newer than version %llu",
                     name, (unsigned long long)v, (unsigned long long)co->latest);
            group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_INVALID, text, NULL);
            return;
        }
        struct coord_version *nv = realloc(co->versions, (size_t)(co->nversions + 1) * sizeof(*nv));
        wsync_wbuf_t *entries = calloc((size_t)co->nsenders, sizeof(*entries));
        if (nv == NULL || entries == NULL) {
            free(entries);
            if (nv != NULL)
                co->versions = nv;
            group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_NOMEM, "coordinator: out of memory", NULL);
            return;
        }
        co->versions = nv;
        cv = &co->versions[co->nversions++];
        memset(cv, 0, sizeof(*cv));
        cv->version = v;
        cv->entries = entries;
    }
    if (cv->entries[s].len != 0) {
        snprintf(text, sizeof(text), "%s published version %llu twice", name, (unsigned long long)v);
        group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_INVALID, text, NULL);
        return;
    }
    wsync_put_bytes(&cv->entries[s], entry, (size_t)(m->payload + m->len - entry));
    if (++cv->npublished < co->nsenders)
        return;
    co->latest = v;
    WSYNC_LOG_I("coordinator: store has version %llu", (unsigned long long)v);
    for (int i = 0; i < co->nsenders; i++)
        send_u64(co, &co->senders[i], WSYNC_MSG_PUBLISHED, v);
    store_serve_pending(co);
    store_evict(co);
}

static void on_fetch(wsync_coord_t *co, coord_peer_t *p, uint64_t version, uint64_t after,
                     uint64_t seq)
{
    struct coord_fetch f = {p, version, after, seq};

    if (p->lease != 0)   /* one version at a time per reader: the previous read is over */
        store_drop_reader(co, p);
    if (store_serve(co, &f))
        return;
    struct coord_fetch *nf = realloc(co->fetches, (size_t)(co->nfetches + 1) * sizeof(*nf));
    if (nf == NULL) {
        store_reply_error(co, p, seq, WSYNC_ERR_NOMEM, "coordinator: out of memory");
        return;
    }
    co->fetches = nf;
    co->fetches[co->nfetches++] = f;
}

/* Append "what from A, B" to buf at *n, naming each peer pred() picks. */
static void awaits_add(wsync_coord_t *co, char *buf, size_t len, size_t *n, const char *what,
                       int senders, int (*pred)(const wsync_coord_t *, const coord_peer_t *, int, int),
                       int arg)
{
    int count = senders ? co->nsenders : co->nreceivers, named = 0;

    for (int i = 0; i < count && *n + 1 < len; i++) {
        const coord_peer_t *p = senders ? &co->senders[i] : &co->receivers[i];
        char name[160];
        if (!pred(co, p, i, arg))
            continue;
        if (p->present)
            peer_name(p, name, sizeof(name));
        else
            snprintf(name, sizeof(name), "%s %d (not connected)", senders ? "sender" : "receiver", i);
        if (named++ > 0)
            *n += (size_t)snprintf(buf + *n, len - *n, ", %s", name);
        else
            *n += (size_t)snprintf(buf + *n, len - *n, "%s%s from %s", *n ? "; " : "", what, name);
    }
    *n = WSYNC_MIN(*n, len - 1);
}

static int not_described(const wsync_coord_t *co, const coord_peer_t *p, int rank, int arg)
{
    (void)co, (void)rank, (void)arg;
    return !p->present || !p->described;
}

static int not_begun(const wsync_coord_t *co, const coord_peer_t *p, int rank, int arg)
{
    (void)rank, (void)arg;
    return p->begun != co->version;
}

static int not_committed(const wsync_coord_t *co, const coord_peer_t *p, int rank, int arg)
{
    (void)rank, (void)arg;
    return p->committed != co->version;
}

static int not_published(const wsync_coord_t *co, const coord_peer_t *p, int rank, int version)
{
    (void)p;
    return co->versions[version].entries[rank].len == 0;
}

/* What the group waits for and on whom, as the coordinator sees it ("COMMIT of version 2 from
 * receiver 1 (pid 42 on host)"); returns its length, 0 if it waits on nobody. */
static size_t coord_awaits(wsync_coord_t *co, char *buf, size_t len)
{
    size_t n = 0;
    char what[64];

    buf[0] = '\0';
    bell_sync(co);
    if (!co->planned) {
        awaits_add(co, buf, len, &n, "the description", 1, not_described, 0);
        awaits_add(co, buf, len, &n, "the description", 0, not_described, 0);
    } else if (co->scheme != NULL && co->scheme->async) {
        for (int i = 0; i < co->nversions; i++) {
            if (co->versions[i].npublished == co->nsenders)
                continue;
            snprintf(what, sizeof(what), "PUBLISH of version %llu",
                     (unsigned long long)co->versions[i].version);
            awaits_add(co, buf, len, &n, what, 1, not_published, i);
        }
        if (n == 0 && co->latest > 0)
            n = (size_t)snprintf(buf, len, "nothing: every sender published version %llu",
                                 (unsigned long long)co->latest);
    } else if (co->nbegun > 0 && co->nbegun < co->nsenders) {
        snprintf(what, sizeof(what), "PUSH_BEGIN of version %llu", (unsigned long long)co->version);
        awaits_add(co, buf, len, &n, what, 1, not_begun, 0);
    } else if (co->nbegun == co->nsenders) {
        snprintf(what, sizeof(what), "COMMIT of version %llu", (unsigned long long)co->version);
        awaits_add(co, buf, len, &n, what, 0, not_committed, 0);
    } else if (co->version > 0) {
        n = (size_t)snprintf(buf, len, "nothing: version %llu was committed by every receiver",
                             (unsigned long long)co->version);
    }
    if (n > 0) {
        char tmp[320];
        snprintf(tmp, sizeof(tmp), "the coordinator awaits %s", buf);
        snprintf(buf, len, "%s", tmp);
    }
    return n > 0 ? strlen(buf) : 0;
}

static void coord_on_msg(void *user, wsync_conn_t *c, wsync_msg_t *m)
{
    wsync_coord_t *co = user;
    coord_peer_t *p = c->user;
    char name[160], text[1400];

    if (p == NULL) {
        if (m->type == WSYNC_MSG_HELLO) {
            on_hello(co, c, m);
        } else {
            snprintf(text, sizeof(text), "%s sent %s before HELLO", c->name, wsync_msg_name(m->type));
            wsync_loop_close(co->loop, c, WSYNC_ERR_PROTOCOL, text);
        }
        wsync_msg_free(m);
        return;
    }
    peer_name(p, name, sizeof(name));
    if (co->failed && m->type != WSYNC_MSG_BYE) {
        wsync_msg_free(m);
        return;
    }
    switch (m->type) {
    case WSYNC_MSG_DESCRIBE:
        on_describe(co, p, m);
        break;
    case WSYNC_MSG_PUSH_BEGIN:
    case WSYNC_MSG_COMMIT: {
        wsync_rbuf_t r;
        uint64_t v;
        wsync_rbuf_init(&r, m->payload, m->len);
        v = wsync_get_u64(&r);
        if (r.err || wsync_rbuf_left(&r) != 0 ||
            (m->type == WSYNC_MSG_PUSH_BEGIN) != (p->hello.role == WSYNC_ROLE_SENDER)) {
            snprintf(text, sizeof(text), "%s sent a malformed or misplaced %s", name,
                     wsync_msg_name(m->type));
            group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_PROTOCOL, text, NULL);
        } else if (m->type == WSYNC_MSG_PUSH_BEGIN) {
            on_push_begin(co, p, v);
        } else {
            on_commit(co, p, v);
        }
        break;
    }
    case WSYNC_MSG_ERROR: {
        wsync_status_t st;
        char detail[1024];
        char awaits[320];
        wsync_status_msg_decode(m->payload, m->len, &st, detail, sizeof(detail));
        if (p->hello.role == WSYNC_ROLE_RECEIVER && co->scheme != NULL && co->scheme->async) {
            /* a store reader that failed is one reader gone, as if it had left: the store and
             * its other readers carry on. The reader still hears its verdict (its own words) */
            WSYNC_LOG_W("coordinator: store reader %d failed: %s", p->hello.rank, detail);
            store_drop_reader(co, p);
            snprintf(text, sizeof(text), "%s failed: %s", name, detail);
            wsync_wbuf_t b;
            wsync_wbuf_init(&b);
            wsync_status_msg_encode(st, text, &b);
            coord_send(co, c, WSYNC_MSG_ABORT, b.data, b.len);
            wsync_wbuf_free(&b);
            break;
        }
        if (st == WSYNC_ERR_TIMEOUT && coord_awaits(co, awaits, sizeof(awaits)) > 0) {
            /* a deadline passed waiting on someone: say whom */
            int room = 1000 - (int)strlen(name) - (int)strlen(awaits) - 16;
            snprintf(text, sizeof(text), "%s failed: %.*s [%s]", name, room > 0 ? room : 0, detail,
                     awaits);
            group_fail(co, WSYNC_MSG_ABORT, st, text, NULL);
            break;
        }
        /* the failing member hears the verdict too: it waits for it (core/member.c) */
        snprintf(text, sizeof(text), "%s failed: %s", name, detail);
        group_fail(co, WSYNC_MSG_ABORT, st, text, NULL);
        break;
    }
    case WSYNC_MSG_PUBLISH:
        if (p->hello.role != WSYNC_ROLE_SENDER || co->scheme == NULL || !co->scheme->async) {
            snprintf(text, sizeof(text), "%s sent PUBLISH outside a store", name);
            group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_PROTOCOL, text, NULL);
        } else {
            on_publish(co, p, m);
        }
        break;
    case WSYNC_MSG_FETCH:
    case WSYNC_MSG_CANCEL:
    case WSYNC_MSG_READ_DONE: {
        wsync_rbuf_t r;
        wsync_rbuf_init(&r, m->payload, m->len);
        uint64_t v = wsync_get_u64(&r);
        uint64_t after = m->type == WSYNC_MSG_FETCH ? wsync_get_u64(&r) : 0;
        uint64_t seq = m->type == WSYNC_MSG_FETCH ? wsync_get_u64(&r) : 0;
        if (r.err || wsync_rbuf_left(&r) != 0 || p->hello.role != WSYNC_ROLE_RECEIVER ||
            co->scheme == NULL || !co->scheme->async) {
            snprintf(text, sizeof(text), "%s sent a malformed or misplaced %s", name,
                     wsync_msg_name(m->type));
            group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_PROTOCOL, text, NULL);
        } else if (m->type == WSYNC_MSG_FETCH) {
            on_fetch(co, p, v, after, seq);
        } else {
            /* CANCEL and READ_DONE both end whatever this reader was doing */
            store_drop_reader(co, p);
        }
        break;
    }
    case WSYNC_MSG_SCHEME_SETUP:
        on_scheme_setup(co, p, m);
        break;
    case WSYNC_MSG_BYE:
        p->left = 1;
        bell_mark_left(co, p);
        break;
    default:
        snprintf(text, sizeof(text), "%s sent an unexpected %s", name, wsync_msg_name(m->type));
        group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_PROTOCOL, text, NULL);
        break;
    }
    wsync_msg_free(m);
}

static void coord_on_close(void *user, wsync_conn_t *c, wsync_status_t why, const char *text)
{
    wsync_coord_t *co = user;
    coord_peer_t *p = c->user;
    char name[160], msg[700];

    if (p == NULL) {
        if (why != WSYNC_OK)
            WSYNC_LOG_W("coordinator: dropped a connection: %s", text);
        return;
    }
    if (p->hello.role == WSYNC_ROLE_RECEIVER && co->scheme != NULL && co->scheme->async) {
        /* store readers come and go: release what it held, free its rank for a return */
        int described = p->described;
        store_drop_reader(co, p);
        WSYNC_LOG_I("coordinator: store reader %d left (%s)", p->hello.rank,
                    why == WSYNC_OK ? "orderly" : text);
        wsync_hello_clear(&p->hello);
        wsync_target_descs_free(p->targets, p->ntargets);
        memset(p, 0, sizeof(*p));
        c->user = NULL;
        co->npresent--;
        co->ndescribed -= described;
        return;
    }
    if (why == WSYNC_OK || p->left) {
        p->left = 1;
        bell_mark_left(co, p);
        bell_sync(co);
        /* leaving in the middle of a version is a loss for those waiting on it */
        int in_flight = co->nbegun > 0 && p->hello.role == WSYNC_ROLE_RECEIVER &&
                        p->committed != co->version;
        if (!in_flight)
            return;
        peer_name(p, name, sizeof(name));
        snprintf(msg, sizeof(msg), "%s left during version %llu", name,
                 (unsigned long long)co->version);
        group_fail(co, WSYNC_MSG_PEER_LOST, WSYNC_ERR_PEER_LOST, msg, c);
        return;
    }
    snprintf(msg, sizeof(msg), "lost %s", text);
    group_fail(co, WSYNC_MSG_PEER_LOST, why == WSYNC_ERR_TIMEOUT ? WSYNC_ERR_PEER_LOST : why, msg, c);
}

static void coord_on_tick(void *user)
{
    (void)user;
}

static void coord_on_accept(void *user, wsync_conn_t *c)
{
    (void)user;
    (void)c;
}

/* The coordinator's process (sender 0) holds a control connection per participant and, with
 * the ipc scheme, a data connection per receiver, besides its memfds and the library's own
 * descriptors: past about 500 participants that exceeds the common soft limit of 1024. Raise the
 * soft limit toward the hard one when it is short (as a server would), and say so; warn, naming
 * the numbers, when even the hard limit is short. */
static void raise_fd_limit(int participants)
{
    struct rlimit rl;
    rlim_t want = (rlim_t)participants * 2 + 256;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want)
        return;
    rlim_t old = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        rl.rlim_cur = old;
    if (rl.rlim_cur >= want)
        WSYNC_LOG_I("coordinator: raised the open-file limit (RLIMIT_NOFILE) from %llu to %llu "
                    "for %d participants", (unsigned long long)old,
                    (unsigned long long)rl.rlim_cur, participants);
    else
        WSYNC_LOG_W("coordinator: %d participants need about %llu descriptors; the open-file "
                    "limit is %llu (hard limit %llu): raise it (ulimit -n) or connections will "
                    "be refused", participants, (unsigned long long)want,
                    (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max);
}

wsync_status_t wsync_coord_create(const char *addr, int nsenders, int nreceivers,
                                  int heartbeat_ms, int timeout_ms, int fp8_wire,
                                  wsync_coord_t **out)
{
    static const wsync_loop_ops_t ops = {coord_on_msg, coord_on_accept, coord_on_close,
                                         coord_on_tick};
    wsync_coord_t *co = calloc(1, sizeof(*co));
    wsync_status_t st;
    int fd;

    if (co == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "no memory for the coordinator");
    pthread_mutex_init(&co->stats_mu, NULL);
    co->nsenders = nsenders;
    co->nreceivers = nreceivers;
    co->timeout_ms = timeout_ms;
    co->fp8_wire = fp8_wire;
    co->senders = calloc((size_t)nsenders, sizeof(*co->senders));
    co->receivers = calloc((size_t)nreceivers, sizeof(*co->receivers));
    if (co->senders == NULL || co->receivers == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "no memory for the coordinator's peers");
        goto err;
    }
    raise_fd_limit(nsenders + nreceivers);
    /* doorbells for the participants on this host, unless turned off or faults are injected */
    if (wsync_bells_wanted() &&
        wsync_bells_create((uint32_t)nsenders, (uint32_t)nreceivers, &co->bells) != WSYNC_OK)
        WSYNC_LOG_W("coordinator: no doorbells (%s); BEGIN, COMMIT and DONE go as messages",
                    wsync_last_error());
    st = wsync_tcp_listen(addr, &fd, co->addr, sizeof(co->addr));
    if (st != WSYNC_OK)
        goto err;
    st = wsync_loop_create(&ops, co, heartbeat_ms, wsync_peer_timeout_ms(timeout_ms, heartbeat_ms),
                           &co->loop);
    if (st != WSYNC_OK) {
        close(fd);
        goto err;
    }
    st = wsync_loop_listen(co->loop, fd, WSYNC_CONN_HEARTBEAT);
    if (st == WSYNC_OK)
        st = wsync_loop_start(co->loop);
    if (st != WSYNC_OK)
        goto err;
    WSYNC_LOG_I("coordinator listening on %s for %d senders and %d receivers", co->addr,
                nsenders, nreceivers);
    *out = co;
    return WSYNC_OK;
err:
    wsync_coord_free(co);
    return st;
}

const char *wsync_coord_address(const wsync_coord_t *co)
{
    return co->addr;
}

void wsync_coord_free(wsync_coord_t *co)
{
    if (co == NULL)
        return;
    if (co->loop != NULL) {
        /* with the thread stopped the peers table is ours: say why the group ends, then close */
        wsync_loop_stop(co->loop);
        group_fail(co, WSYNC_MSG_ABORT, WSYNC_ERR_ABORTED,
                   "the group ended: its coordinator (sender 0) closed", NULL);
        /* no loop to write what the sockets could not take at once: one deadline for all */
        wsync_loop_flush(co->loop, send_timeout(co));
        wsync_loop_free(co->loop);
    }
    wsync_bells_free(co->bells);
    for (int i = 0; co->senders != NULL && i < co->nsenders; i++) {
        wsync_hello_clear(&co->senders[i].hello);
        wsync_shard_descs_free(co->senders[i].shards, co->senders[i].nshards);
    }
    for (int i = 0; co->receivers != NULL && i < co->nreceivers; i++) {
        wsync_hello_clear(&co->receivers[i].hello);
        wsync_target_descs_free(co->receivers[i].targets, co->receivers[i].ntargets);
    }
    while (co->nversions > 0)
        version_drop(co, co->nversions - 1);
    free(co->versions);
    free(co->fetches);
    free(co->senders);
    free(co->receivers);
    pthread_mutex_destroy(&co->stats_mu);
    free(co);
}
