/* The 'nccl' scheme: GPUs on one node or many. One NCCL communicator per group over every sender
 * (NCCL ranks 0..S-1) and receiver (S..S+R-1), from a unique id that sender 0 sends the others
 * through the coordinator (SCHEME_SETUP/RELAY, core/relay.h) together with every member's GPU;
 * non-blocking init, aborted on timeout or peer loss.
 *
 * A version runs in steps (schemes/nccl.h: the schedule, from the plan alone): step k moves
 * bucket k of every sender. Per step each rank issues its ops: ncclBroadcast where several
 * receivers need the same chunks (replicas), on the whole communicator or on a sub-communicator
 * split for that receiver set, and grouped ncclSend/ncclRecv carrying each receiver only its
 * chunks. A sender sends a large contiguous chunk straight from its shard, and a receiver takes a
 * large chunk straight into its target where its one segment is contiguous in the same dtype;
 * everything else goes through a staging slot of device memory: packed on the sender and
 * unpacked (with casts) on the receiver by one batch-copy kernel per step, its descriptors built
 * once at setup. Two slots: pack of step k+1 and unpack of step k-1 overlap the transfer of step
 * k (own streams, ordered by events). The host waits on a step's events only before reusing its
 * slot, polling the events, NCCL's asynchronous errors and the control plane (a lost peer), with
 * the member's timeout from the last progress: nothing hangs; a failure aborts the communicators.
 *
 * Integrity (WSYNC_VERIFY at any member): each sender hashes its chunks (copied to the host) and
 * relays each receiver the checksums of the chunks it takes; a receiver hashes what landed (or,
 * across a cast, the staged bytes the cast read) after each step and compares at the end.
 *
 * Delta versions (the group's delta mode on, issue 17): schemes/nccl_delta.h says how they travel
 * (an all-gather of bases and holds at version start; per step, DELTA ops send a table and then
 * their items one call each, encoded on the sender's GPU and applied and hash-checked on the
 * receiver's); schemes/nccl_delta.c holds that path, schemes/nccl_state.h the state both share.
 *
 * FP8 on the wire (issue 18): schemes/nccl_wire.c holds the quantizations into the slots, their
 * NaN/Inf checks, the FP8 unpack and checksums, and the PACKED relays. The schedule itself, from
 * the plan alone: schemes/nccl_sched.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fault.h"
#include "core/log.h"
#include "core/objects.h"
#include "core/relay.h"
#include "core/util.h"
#include "kernels/device.h"
#include "reshard/exec.h"
#include "core/delta_state.h"
#include "schemes/nccl.h"
#include "schemes/nccl_delta.h"
#include "schemes/nccl_state.h"
#include "schemes/scheme.h"
#include "transports/nccl.h"
#define NC_HELLO_MAGIC 0x4e43434cu   /* "NCCL" */

/* ================================================================================================
 * Scoring
 * ============================================================================================== */

/* Participant i's GPU (senders first), NULL if unknown. */
static const uint8_t *group_gpu(const wsync_group_info_t *g, uint32_t i)
{
    if (i < g->nsenders)
        return g->sender_gpu != NULL ? g->sender_gpu[i] : NULL;
    return g->receiver_gpu != NULL ? g->receiver_gpu[i - g->nsenders] : NULL;
}

static const wsync_hello_t *group_hello(const wsync_group_info_t *g, uint32_t i)
{
    return i < g->nsenders ? &g->senders[i] : &g->receivers[i - g->nsenders];
}

static int nccl_score(const wsync_group_info_t *g, char *reason, size_t len)
{
    int ti = wsync_transport_index("nccl");

    if (g->mem_kinds & (1u << WSYNC_MEM_HOST)) {
        snprintf(reason, len, "some shards or targets are in host memory; NCCL moves CUDA memory "
                              "only");
        return 0;
    }
    if (!(g->mem_kinds & (1u << WSYNC_MEM_CUDA))) {
        snprintf(reason, len, "no shard or target is in CUDA memory");
        return 0;
    }
    for (uint32_t i = 0; i < g->nsenders + g->nreceivers; i++) {
        const wsync_hello_t *h = i < g->nsenders ? &g->senders[i] : &g->receivers[i - g->nsenders];
        if (ti < 0 || !(h->transports & (1u << ti))) {
            snprintf(reason, len, "%s %d (%s) has no NCCL with a GPU (not compiled in, or no "
                                  "CUDA device: wsync-info says which)",
                     h->role == WSYNC_ROLE_SENDER ? "sender" : "receiver", h->rank,
                     h->hostname != NULL ? h->hostname : "?");
            return 0;
        }
    }
    /* NCCL allows one rank per GPU: colocated senders and receivers are the ipc scheme's. One
     * GPU is one UUID on one host: the same UUID under two host ids is one machine that the
     * user named as two (WSYNC_HOST_ID, with NCCL_HOSTID for NCCL: tests/gpu/netns_nccl.sh),
     * as exchange_hello judges it too */
    for (uint32_t i = 0; i < g->nsenders + g->nreceivers; i++) {
        const uint8_t *a = group_gpu(g, i);
        const wsync_hello_t *hi = group_hello(g, i);
        for (uint32_t j = i + 1; a != NULL && j < g->nsenders + g->nreceivers; j++) {
            const uint8_t *b = group_gpu(g, j);
            const wsync_hello_t *hj = group_hello(g, j);
            if (b != NULL && memcmp(a, b, 16) == 0 &&
                (hi->host_id == NULL || hj->host_id == NULL ||
                 wsync_host_same(hi->host_id, hj->host_id))) {
                char u[48];
                wsync_dev_uuid_str(a, u, sizeof(u));
                snprintf(reason, len, "%s %u and %s %u share GPU %s: NCCL allows one rank per GPU",
                         i < g->nsenders ? "sender" : "receiver",
                         i < g->nsenders ? i : i - g->nsenders,
                         j < g->nsenders ? "sender" : "receiver",
                         j < g->nsenders ? j : j - g->nsenders, u);
                return 0;
            }
        }
    }
    /* NCCL spans hosts by itself (its socket or IB transports): say what the group is */
    char where[160];
    uint32_t n = g->nsenders + g->nreceivers, hosts = 1, spaces = 1;
    const char **ids = malloc((n ? n : 1) * sizeof(*ids));
    for (uint32_t i = 0; ids != NULL && i < n; i++)
        ids[i] = i < g->nsenders ? g->senders[i].host_id : g->receivers[i - g->nsenders].host_id;
    if (ids == NULL || wsync_host_count(ids, n, &hosts, &spaces) != 0)
        hosts = spaces = 1;
    free(ids);
    if (hosts > 1)
        snprintf(where, sizeof(where), "; participants on %u hosts: nccl over its network "
                                       "transports between them", hosts);
    else if (spaces > 1)
        snprintf(where, sizeof(where), "; participants in %u network namespaces of one host: NCCL "
                                       "bootstraps over TCP between them",
                 spaces);
    else
        where[0] = '\0';
    snprintf(reason, len, "all %u participants have NCCL and a GPU of their own, and every shard "
                          "and target is in CUDA memory: grouped send/recv, broadcast to replicas%s",
             n, where);
    return 80;
}

/* ================================================================================================
 * State shared by both roles
 * ============================================================================================== */


static const char *role_word(int role)
{
    return role == WSYNC_ROLE_SENDER ? "sender" : "receiver";
}

/* "receiver 2 (pid 42)" for NCCL rank i */
static void rank_name(const nc_state_t *st, int i, char *buf, size_t len)
{
    const wsync_plan_msg_t *pm = &st->m->planmsg;
    int ns = st->m->nsenders;
    if (i >= 0 && (uint32_t)i < pm->npeers)
        snprintf(buf, len, "%s %d (pid %u)", i < ns ? "sender" : "receiver", i < ns ? i : i - ns,
                 pm->peers[i].pid);
    else
        snprintf(buf, len, "rank %d", i);
}

static wsync_status_t nc_check_inbox(void *arg)
{
    nc_state_t *st = arg;
    return wsync_inbox_failed(&st->m->inbox);
}

/* Abort every communicator, sub-communicators before the parent (with splitShare they share
 * the parent's resources), never finalizing: after a failure a peer may be gone. Bounded: an
 * abort that does not return in time is left running and the process marked wedged
 * (kernels/device.h), so that teardown leaves the device memory and streams NCCL kernels may
 * still use rather than wait in cudaFree. */
static void nc_abort(nc_state_t *st)
{
    wsync_nccl_comm_t *list[WSYNC_NCCL_MAX_SPLITS + 1];
    int n = 0;

    if (st->aborted)
        return;
    st->aborted = 1;
    for (uint32_t j = 0; st->sub != NULL && j < st->sched->nsplits; j++) {
        if (st->sub[j] != NULL && n < WSYNC_NCCL_MAX_SPLITS)
            list[n++] = st->sub[j];
        else if (st->sub[j] != NULL)
            wsync_nccl_abort(st->sub[j]);   /* not reached: nsplits <= WSYNC_NCCL_MAX_SPLITS */
        st->sub[j] = NULL;
    }
    list[n++] = st->comm;
    st->comm = NULL;
    uint64_t t0 = wsync_now_ns();
    int bound = st->m != NULL ? WSYNC_MIN(st->m->timeout_ms, WSYNC_NCCL_ABORT_MS)
                              : WSYNC_NCCL_ABORT_MS;
    if (!wsync_nccl_abort_all(list, n, wsync_deadline_in(WSYNC_MAX(bound, 1000)))) {
        wsync_dev_mark_wedged(st->device);   /* the receiver's and sender's frees must not wait */
        WSYNC_LOG_W("nccl: %s %u: the communicators' abort did not finish within %.3f s: their "
                    "device memory and streams will be leaked, not freed", role_word(st->role),
                    st->rank, (double)(wsync_now_ns() - t0) / 1e9);
    } else {
        WSYNC_LOG_I("nccl: %s %u: %d communicator%s aborted in %.3f s", role_word(st->role),
                    st->rank, n, n == 1 ? "" : "s", (double)(wsync_now_ns() - t0) / 1e9);
    }
}

/* A failure in the middle of setup or a version: abort, so that no NCCL call waits on a peer
 * forever. An NCCL error is often a peer's death that NCCL saw first: give the control plane the
 * time it takes to declare a silent peer lost, so that the error names the peer. */
static wsync_status_t nc_fail(nc_state_t *st, wsync_status_t rc)
{
    char text[1024];

    snprintf(text, sizeof(text), "%s", wsync_last_error());
    nc_abort(st);
    if (rc == WSYNC_ERR_DEVICE) {
        int64_t until = wsync_deadline_in(wsync_peer_timeout_ms(st->m->timeout_ms,
                                                                st->m->heartbeat_ms) +
                                          2 * st->m->heartbeat_ms);
        while (wsync_now_ms() < until) {
            wsync_status_t lost = wsync_inbox_failed(&st->m->inbox);
            if (lost != WSYNC_OK) {
                WSYNC_LOG_W("nccl: %s %u: %s (after: %s)", role_word(st->role), st->rank, text,
                            wsync_last_error());
                return lost;
            }
            struct timespec ts = {0, 5000000};
            nanosleep(&ts, NULL);
        }
    }
    return wsync_err_set_text(rc, text);
}

wsync_status_t wsync_nccl_host_room(nc_state_t *st, size_t bytes)
{
    if (bytes <= st->host_cap)
        return WSYNC_OK;
    uint8_t *p = realloc(st->host, bytes);
    if (p == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for %zu bytes of host copy", bytes);
    st->host = p;
    st->host_cap = bytes;
    return WSYNC_OK;
}

/* xxh3 of a region of device memory, through a host copy. */
static wsync_status_t hash_device(nc_state_t *st, const void *base, wsync_dtype_t dtype,
                                  const wsync_region_t *r, uint64_t *out)
{
    size_t esz = wsync_dtype_size(dtype), width = (size_t)(r->cols * esz);
    wsync_region_t dense = {0, r->cols, r->rows, r->cols};
    wsync_status_t rc = wsync_nccl_host_room(st, width * (size_t)r->rows);

    if (rc == WSYNC_OK)
        rc = wsync_dev_memcpy2d_async(st->host, width, (const uint8_t *)base + r->off * esz,
                                      (size_t)(r->pitch * esz), width, (size_t)r->rows,
                                      st->xstream);
    if (rc == WSYNC_OK)
        rc = wsync_dev_stream_sync(st->xstream, wsync_deadline_in(st->m->timeout_ms),
                                   "nccl: a copy to the host for checksums");
    if (rc == WSYNC_OK)
        *out = wsync_exec_hash(st->host, dtype, &dense);
    return rc;
}

wsync_status_t wsync_nccl_flip_device(nc_state_t *st, void *p, size_t bytes)
{
    wsync_status_t rc;

    bytes = WSYNC_MIN(bytes, (size_t)4096);
    if ((rc = wsync_nccl_host_room(st, bytes)) != WSYNC_OK ||
        (rc = wsync_dev_copy_to_host(st->host, p, bytes, st->xstream,
                                     wsync_deadline_in(st->m->timeout_ms))) != WSYNC_OK)
        return rc;
    wsync_fault_flip(st->host, bytes);
    if ((rc = wsync_dev_memcpy_async(p, st->host, bytes, st->xstream)) != WSYNC_OK)
        return rc;
    return wsync_dev_stream_sync(st->xstream, wsync_deadline_in(st->m->timeout_ms),
                                 "nccl: a fault's bit flip");
}

static wsync_status_t add_myop(nc_state_t *st, const nc_myop_t *o)
{
    if (st->nmyops == st->myops_cap) {
        uint32_t cap = st->myops_cap ? st->myops_cap * 2 : 64;
        nc_myop_t *p = realloc(st->myops, cap * sizeof(*p));
        if (p == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for the schedule");
        st->myops = p;
        st->myops_cap = cap;
    }
    st->myops[st->nmyops++] = *o;
    return WSYNC_OK;
}

static uint32_t op_phase(const nc_state_t *st, const wsync_nccl_op_t *op)
{
    if (op->kind == WSYNC_NCCL_OP_P2P)
        return 1;
    const wsync_nccl_group_t *g = &st->sched->groups[op->group];
    return g->whole ? 0 : 2 + (uint32_t)g->split;
}

static wsync_nccl_comm_t *phase_comm(const nc_state_t *st, uint32_t phase)
{
    return phase < 2 ? st->comm : st->sub[phase - 2];
}

/* The ops of step k this member takes part in, by phase (the order every rank issues them in). */
static wsync_status_t collect_ops(nc_state_t *st, uint32_t k)
{
    const wsync_nccl_sched_t *s = st->sched;
    nc_step_t *step = &st->steps[k];
    wsync_status_t rc;

    step->myop0 = st->nmyops;
    for (uint32_t phase = 0; phase < 2 + s->nsplits; phase++) {
        for (uint32_t i = s->step_op[k]; i < s->step_op[k + 1]; i++) {
            const wsync_nccl_op_t *op = &s->ops[i];
            if (op_phase(st, op) != phase || !wsync_nccl_op_has(s, op, st->role, st->rank))
                continue;
            nc_myop_t o = {.op = i, .phase = phase, .staged = 1};
            if (op->kind == WSYNC_NCCL_OP_P2P)
                o.peer = st->role == WSYNC_ROLE_SENDER ? st->m->nsenders + (int)op->receiver
                                                       : (int)op->sender;
            else
                o.peer = s->groups[op->group].whole ? (int)op->sender : 0;
            if ((rc = add_myop(st, &o)) != WSYNC_OK)
                return rc;
        }
    }
    step->nmyops = st->nmyops - step->myop0;
    return WSYNC_OK;
}

/* ================================================================================================
 * Setup: devices, the unique id, the communicators
 * ============================================================================================== */

/* One shard or target, in memory `mem` on device `dev`, named `name`: all must be in CUDA memory
 * of one device, which becomes st->device (*first_name: the first one seen, NULL before). */
static wsync_status_t device_item(nc_state_t *st, wsync_mem_t mem, int dev, const char *name,
                                  const char **first_name)
{
    const char *what = st->role == WSYNC_ROLE_SENDER ? "param" : "target";

    if (mem != WSYNC_MEM_CUDA)
        return wsync_err(WSYNC_ERR_UNSUPPORTED, "nccl: %s %u: %s '%s' is in host memory; the "
                         "nccl scheme moves CUDA memory only", role_word(st->role), st->rank,
                         what, name);
    if (*first_name == NULL) {
        *first_name = name;
        st->device = dev;
    } else if (dev != st->device) {
        return wsync_err(WSYNC_ERR_UNSUPPORTED, "nccl: %s %u uses two CUDA devices (%s '%s' on "
                         "device %d, '%s' on device %d): one participant may use one device",
                         role_word(st->role), st->rank, what, *first_name, st->device, name, dev);
    }
    return WSYNC_OK;
}

/* Every member tells every other its GPU (and verify wish); sender 0 adds the unique id. */
static wsync_status_t exchange_hello(nc_state_t *st, uint8_t id[WSYNC_NCCL_ID_BYTES],
                                     int64_t deadline)
{
    wsync_member_t *m = st->m;
    int n = st->nranks;
    uint8_t (*uuid)[WSYNC_DEV_UUID_BYTES] = calloc((size_t)n, WSYNC_DEV_UUID_BYTES);
    uint8_t *seen = calloc((size_t)n, 1);
    int got = 0;
    wsync_status_t rc;
    wsync_wbuf_t b;

    if (uuid == NULL || seen == NULL) {
        rc = wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory");
        goto out;
    }
    if ((rc = wsync_dev_uuid(st->device, uuid[st->nrank])) != WSYNC_OK)
        goto out;
    if (st->nrank == 0) {
        if ((rc = wsync_nccl_unique_id(id)) != WSYNC_OK)
            goto out;
    }
    wsync_wbuf_init(&b);
    wsync_put_u32(&b, NC_HELLO_MAGIC);
    wsync_put_u32(&b, st->verify ? 1u : 0u);
    wsync_put_bytes(&b, uuid[st->nrank], WSYNC_DEV_UUID_BYTES);
    wsync_put_i32(&b, st->device);
    wsync_put_u32(&b, st->nrank == 0 ? WSYNC_NCCL_ID_BYTES : 0);
    if (st->nrank == 0)
        wsync_put_bytes(&b, id, WSYNC_NCCL_ID_BYTES);
    rc = b.err ? wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory")
               : wsync_member_relay_send(m, WSYNC_ROLE_NONE, -1, NC_TAG_HELLO, b.data,
                                         (uint32_t)b.len);
    wsync_wbuf_free(&b);
    if (rc != WSYNC_OK)
        goto out;
    seen[st->nrank] = 1;
    while (got < n - 1) {
        wsync_msg_t *msg;
        wsync_relay_t rl;
        rc = wsync_member_relay_recv(m, deadline, &msg, &rl);
        if (rc == WSYNC_ERR_TIMEOUT) {
            char who[512] = "";
            size_t k = 0;
            for (int i = 0; i < n && k + 40 < sizeof(who); i++)
                if (!seen[i]) {
                    char nm[64];
                    rank_name(st, i, nm, sizeof(nm));
                    k += (size_t)snprintf(who + k, sizeof(who) - k, "%s%s", k ? ", " : "", nm);
                }
            rc = wsync_err(rc, "nccl: %s %u: no GPU description within %d ms from %s",
                           role_word(st->role), st->rank, m->timeout_ms, who);
            goto out;
        }
        if (rc != WSYNC_OK)
            goto out;
        int from = rl.role == WSYNC_ROLE_SENDER ? (rl.rank < m->nsenders ? rl.rank : -1)
                                                : (rl.rank < m->nreceivers ? m->nsenders + rl.rank
                                                                           : -1);
        wsync_rbuf_t r;
        wsync_rbuf_init(&r, rl.data, rl.len);
        uint32_t magic = wsync_get_u32(&r), flags = wsync_get_u32(&r);
        const void *u = wsync_get_bytes(&r, WSYNC_DEV_UUID_BYTES);
        int32_t dev = wsync_get_i32(&r);
        uint32_t idlen = wsync_get_u32(&r);
        const void *idp = idlen == WSYNC_NCCL_ID_BYTES ? wsync_get_bytes(&r, idlen) : NULL;
        int bad = r.err || wsync_rbuf_left(&r) != 0 || magic != NC_HELLO_MAGIC ||
                  rl.tag != NC_TAG_HELLO || from < 0 || from >= n || seen[from] ||
                  (idlen != 0 && (from != 0 || idp == NULL)) || (from == 0 && idlen == 0);
        if (!bad) {
            memcpy(uuid[from], u, WSYNC_DEV_UUID_BYTES);
            if (idp != NULL)
                memcpy(id, idp, WSYNC_NCCL_ID_BYTES);
            st->verify |= (int)(flags & 1u);
            seen[from] = 1;
            got++;
            WSYNC_LOG_D("nccl: %s %u: rank %d uses device %d", role_word(st->role), st->rank,
                        from, dev);
        }
        wsync_msg_free(msg);
        if (bad) {
            rc = wsync_err(WSYNC_ERR_PROTOCOL, "nccl: %s %u: malformed or unexpected GPU "
                           "description from %s %d (tag %u)", role_word(st->role), st->rank,
                           role_word((int)rl.role), rl.rank, rl.tag);
            goto out;
        }
    }
    /* NCCL allows one rank per GPU: say so here, by name, rather than let init fail */
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            const wsync_peer_t *a = &m->planmsg.peers[i], *c = &m->planmsg.peers[j];
            /* one machine, whatever the network namespaces: they share the GPU all the same */
            if (memcmp(uuid[i], uuid[j], WSYNC_DEV_UUID_BYTES) != 0 ||
                !wsync_host_same(a->host_id, c->host_id))
                continue;
            char na[64], nb[64], us[48];
            rank_name(st, i, na, sizeof(na));
            rank_name(st, j, nb, sizeof(nb));
            wsync_dev_uuid_str(uuid[i], us, sizeof(us));
            rc = wsync_err(WSYNC_ERR_UNSUPPORTED, "nccl: %s and %s share GPU %s: NCCL allows one "
                           "rank per GPU; colocated senders and receivers need the ipc scheme",
                           na, nb, us);
            goto out;
        }
    rc = WSYNC_OK;
out:
    free(uuid);
    free(seen);
    return rc;
}

static wsync_status_t make_comms(nc_state_t *st, const uint8_t id[WSYNC_NCCL_ID_BYTES],
                                 int64_t deadline)
{
    char label[96];
    wsync_status_t rc;
    uint64_t t0 = wsync_now_ns();

    snprintf(label, sizeof(label), "nccl %s %u (rank %d of %d)", role_word(st->role), st->rank,
             st->nrank, st->nranks);
    if ((rc = wsync_nccl_comm_init(id, st->nranks, st->nrank, label, &st->comm)) != WSYNC_OK)
        return rc;
    if ((rc = wsync_nccl_wait(st->comm, deadline, "ncclCommInitRankConfig", nc_check_inbox, st)) !=
        WSYNC_OK)
        return rc;
    double t_init = (double)(wsync_now_ns() - t0) / 1e9;
    st->sub = calloc(st->sched->nsplits + 1, sizeof(*st->sub));
    if (st->sub == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory");
    for (uint32_t g = 0; g < st->sched->ngroups; g++) {
        const wsync_nccl_group_t *gr = &st->sched->groups[g];
        int color = -1, key = 0;
        if (gr->split < 0)
            continue;
        if (st->role == WSYNC_ROLE_SENDER && gr->sender == st->rank)
            color = 0;
        for (uint32_t i = 0; st->role == WSYNC_ROLE_RECEIVER && i < gr->nrecv; i++)
            if (gr->recv[i] == st->rank) {
                color = 0;
                key = 1 + (int)i;   /* the sender is rank 0 of the child: the root */
            }
        snprintf(label, sizeof(label), "nccl %s %u, sub-communicator %d", role_word(st->role),
                 st->rank, gr->split);
        rc = wsync_nccl_comm_split(st->comm, color, key, label, deadline, nc_check_inbox, st,
                                   &st->sub[gr->split]);
        if (rc != WSYNC_OK)
            return rc;
        if ((color >= 0) != (st->sub[gr->split] != NULL))
            return wsync_err(WSYNC_ERR_DEVICE, "nccl: %s %u: ncclCommSplit for sub-communicator "
                             "%d gave %s child", role_word(st->role), st->rank, gr->split,
                             color >= 0 ? "no" : "an unexpected");
    }
    WSYNC_LOG_I("nccl: %s %u: communicator of %d ranks on device %d in %.3f s (init %.3f s, %u "
                "sub-communicators)", role_word(st->role), st->rank, st->nranks, st->device,
                (double)(wsync_now_ns() - t0) / 1e9, t_init, st->sched->nsplits);
    return WSYNC_OK;
}

static wsync_status_t common_setup(nc_state_t *st, wsync_member_t *m, int role, uint32_t rank)
{
    uint8_t id[WSYNC_NCCL_ID_BYTES];
    int64_t deadline = wsync_deadline_in(m->timeout_ms);
    wsync_status_t rc;
    uint64_t t0 = wsync_now_ns();

    st->m = m;
    st->role = role;
    st->rank = rank;
    st->nranks = m->nsenders + m->nreceivers;
    st->nrank = role == WSYNC_ROLE_SENDER ? (int)rank : m->nsenders + (int)rank;
    st->verify = m->ctx->verify;
    for (int i = 0; i < NC_SLOTS; i++)
        st->slot_step[i] = -1;
    if (!wsync_nccl_compiled())
        return wsync_err(WSYNC_ERR_UNSUPPORTED, "nccl: %s %u: this wsync was built without NCCL",
                         role_word(role), rank);
    rc = wsync_nccl_sched_build(m->plan, WSYNC_NCCL_DIRECT_MIN, WSYNC_NCCL_MAX_SPLITS, &st->sched);
    if (rc != WSYNC_OK)
        return rc;
    if ((rc = wsync_dev_set(st->device)) != WSYNC_OK)
        return rc;
    if ((rc = exchange_hello(st, id, deadline)) != WSYNC_OK)
        return rc;
    WSYNC_LOG_D("nccl: %s %u: GPUs exchanged in %.3f s", role_word(role), rank,
                (double)(wsync_now_ns() - t0) / 1e9);
    if ((rc = make_comms(st, id, deadline)) != WSYNC_OK)
        return rc;
    if ((rc = wsync_dev_stream_create(&st->cstream)) != WSYNC_OK ||
        (rc = wsync_dev_stream_create(&st->xstream)) != WSYNC_OK)
        return rc;
    for (int i = 0; i < NC_SLOTS; i++)
        if ((rc = wsync_dev_event_create(0, &st->ev_copy[i])) != WSYNC_OK ||
            (rc = wsync_dev_event_create(0, &st->ev_done[i])) != WSYNC_OK)
            return rc;
    st->steps = calloc(st->sched->nsteps + 1, sizeof(*st->steps));
    if (st->steps == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory");
    for (uint32_t k = 0; k < st->sched->nsteps; k++)
        if ((rc = collect_ops(st, k)) != WSYNC_OK)
            return rc;
    return wsync_nccl_wire_packed_pairs(st, m->plan);
}

/* Grow the scratch array of copy descriptors a step's batch is built from to hold n. */
static wsync_status_t alloc_slots(nc_state_t *st)
{
    wsync_status_t rc;
    uint64_t need = 0;

    for (uint32_t k = 0; k < st->sched->nsteps; k++)
        need = WSYNC_MAX(need, st->steps[k].dstaging > 0
                                   ? st->steps[k].dbase + st->steps[k].dstaging
                                   : st->steps[k].staging);
    if (need <= st->slot_bytes)
        return WSYNC_OK;
    for (int i = 0; i < NC_SLOTS; i++) {
        wsync_dev_free(st->slot[i]);
        st->slot[i] = NULL;
    }
    st->slot_bytes = 0;
    for (int i = 0; i < NC_SLOTS; i++)
        if ((rc = wsync_dev_malloc((size_t)need, &st->slot[i])) != WSYNC_OK)
            return rc;
    st->slot_bytes = need;
    return WSYNC_OK;
}

static void free_batches(nc_state_t *st)
{
    for (uint32_t k = 0; st->steps != NULL && k < st->sched->nsteps; k++) {
        wsync_dev_batch_free(st->steps[k].batch);
        st->steps[k].batch = NULL;
    }
}

static void state_free(nc_state_t *st)
{
    if (st == NULL)
        return;
    if (st->sched != NULL && st->device >= 0 && wsync_dev_compiled()) {
        int64_t deadline = wsync_deadline_in(WSYNC_MIN(st->m->timeout_ms, 10000));
        /* after a failure anywhere in the group (a peer lost, an abort) a communicator may wait
         * on a dead peer: abort (it stops NCCL's kernels) before anything synchronizes or frees,
         * and never finalize */
        if (!st->aborted && wsync_inbox_failed(&st->m->inbox) != WSYNC_OK) {
            WSYNC_LOG_I("nccl: %s %u: teardown after a failure of the group (%s): aborting the "
                        "communicators", role_word(st->role), st->rank, wsync_last_error());
            nc_abort(st);
        }
        if (!st->aborted && st->cstream != NULL &&
            (wsync_dev_stream_sync(st->cstream, deadline, "nccl: teardown") != WSYNC_OK ||
             wsync_dev_stream_sync(st->xstream, deadline, "nccl: teardown") != WSYNC_OK)) {
            WSYNC_LOG_W("nccl: %s %u: %s; aborting", role_word(st->role), st->rank,
                        wsync_last_error());
            nc_abort(st);
        }
        if (!st->aborted) {
            for (uint32_t j = 0; st->sub != NULL && j < st->sched->nsplits; j++)
                wsync_nccl_destroy(st->sub[j], deadline);
            wsync_nccl_destroy(st->comm, deadline);
        } else if (!wsync_dev_is_wedged() && st->cstream != NULL) {
            /* aborted: NCCL's kernels should have stopped; free only once both streams are idle
             * (cudaFree waits for every kernel on the device), bounded */
            int64_t idle = wsync_deadline_in(WSYNC_MIN(st->m->timeout_ms, 5000));
            if (wsync_dev_stream_sync(st->cstream, idle, "nccl: NCCL calls after the abort") !=
                    WSYNC_OK ||
                wsync_dev_stream_sync(st->xstream, idle, "nccl: copies after the abort") !=
                    WSYNC_OK) {
                WSYNC_LOG_W("nccl: %s %u: %s: leaking its device memory and streams",
                            role_word(st->role), st->rank, wsync_last_error());
                wsync_dev_mark_wedged(st->device);
            }
        }
        if (!wsync_dev_is_wedged()) {
            free_batches(st);
            if (st->d != NULL)
                wsync_nccl_delta_free_batches(st);
            wsync_dev_free(st->qws_dev);
            wsync_amax_tx_free(&st->amax_tx);
            for (int i = 0; i < NC_SLOTS; i++) {
                wsync_dev_free(st->slot[i]);
                wsync_dev_event_destroy(st->ev_copy[i]);
                wsync_dev_event_destroy(st->ev_done[i]);
            }
            wsync_dev_stream_destroy(st->cstream);
            wsync_dev_stream_destroy(st->xstream);
        } else {
            WSYNC_LOG_W("nccl: %s %u: leaked 2 x %llu bytes of staging, copy descriptors, 2 "
                        "streams and 4 events on device %d (NCCL may still use them)",
                        role_word(st->role), st->rank, (unsigned long long)st->slot_bytes,
                        st->device);
        }
    }
    /* its device parts were freed above unless the device is wedged (or never used): the host
     * arrays in every case */
    wsync_amax_tx_free_host(&st->amax_tx);
    if (st->d != NULL)
        wsync_nccl_delta_free(st);   /* device parts only when not wedged (it checks) */
    wsync_nccl_sched_free(st->sched);
    free(st->sub);
    free(st->steps);
    free(st->myops);
    free(st->rsegs);
    free(st->bound_land);
    free(st->sums);
    free(st->host);
    free(st->quant);
    free(st->qws);
    free(st->qchunk);
    free(st->qoff);
    free(st->tx_sum);
    free(st->tx_have);
    free(st->packed_to);
    free(st->packed_from);
    free(st);
}

/* Run `fn` on this member's device, restoring the caller's current device after. */
static void dev_enter(nc_state_t *st)
{
    st->prev_device = -1;
    if (wsync_dev_get(&st->prev_device) != WSYNC_OK)
        st->prev_device = -1;
    if (st->prev_device != st->device)
        wsync_dev_set(st->device);
}

static void dev_leave(nc_state_t *st)
{
    if (st->prev_device >= 0 && st->prev_device != st->device)
        wsync_dev_set(st->prev_device);
}

/* One NCCL call of op o: broadcast, send or receive `bytes` at buf. */
static wsync_status_t issue_call(nc_state_t *st, wsync_nccl_comm_t *comm, const nc_myop_t *o,
                                 void *buf, size_t bytes)
{
    const wsync_nccl_op_t *op = &st->sched->ops[o->op];
    if (op->kind == WSYNC_NCCL_OP_BCAST)
        return wsync_nccl_bcast(comm, buf, buf, bytes, o->peer, st->cstream);
    if (st->role == WSYNC_ROLE_SENDER)
        return wsync_nccl_send(comm, buf, bytes, o->peer, st->cstream);
    return wsync_nccl_recv(comm, buf, bytes, o->peer, st->cstream);
}

enum { NC_PASS_PLAIN = 0, NC_PASS_TABLES = 1, NC_PASS_DATA = 2 };

/* Issue step k's NCCL calls, phase by phase (one NCCL group per communicator), on cstream: each
 * op from (to) its staging place in slot k % 2, or this member's own memory. A delta-mode step
 * with DELTA ops runs two passes, the same on every rank of an op: NC_PASS_TABLES (the DELTA ops'
 * tables only), then NC_PASS_DATA (plain ops as ever; a DELTA op's items one call each, of the
 * length its table says). */
static wsync_status_t issue_step(nc_state_t *st, uint32_t k, int64_t deadline, int pass)
{
    const nc_step_t *step = &st->steps[k];
    uint8_t *slot = st->slot[k % NC_SLOTS];
    wsync_status_t rc = WSYNC_OK;

    for (uint32_t i = 0; i < step->nmyops;) {
        uint32_t phase = st->myops[step->myop0 + i].phase, j = i, calls = 0;
        wsync_nccl_comm_t *comm = phase_comm(st, phase);
        for (; j < step->nmyops && st->myops[step->myop0 + j].phase == phase; j++)
            calls += pass != NC_PASS_TABLES || st->myops[step->myop0 + j].delta;
        if (calls == 0) {   /* no table of this phase: no group (ranks outside it issue none) */
            i = j;
            continue;
        }
        j = i;
        if ((rc = wsync_nccl_group_start()) != WSYNC_OK)
            return rc;
        for (; j < step->nmyops && st->myops[step->myop0 + j].phase == phase; j++) {
            const nc_myop_t *o = &st->myops[step->myop0 + j];
            const wsync_nccl_op_t *op = &st->sched->ops[o->op];
            void *buf = o->staged ? slot + o->soff : o->direct;
            if (rc != WSYNC_OK)
                break;
            if (pass == NC_PASS_TABLES) {
                if (o->delta)
                    rc = issue_call(st, comm, o, (uint8_t *)st->d->tdev[k % NC_SLOTS] + o->toff,
                                    (size_t)wsync_nccl_dtable_bytes(op->nitems));
            } else if (pass == NC_PASS_DATA && o->delta) {
                for (uint32_t t = 0; t < op->nitems && rc == WSYNC_OK; t++) {
                    void *ib;
                    size_t n;
                    wsync_nccl_delta_item_buf(st, st->m->plan, k, o, t, &ib, &n);
                    rc = issue_call(st, comm, o, ib, n);
                }
            } else {
                rc = issue_call(st, comm, o, buf, (size_t)op->bytes);
            }
        }
        /* the group ends even after a failed call, so that NCCL's group state stays sane */
        wsync_status_t end = wsync_nccl_group_end(comm);
        if (rc == WSYNC_OK)
            rc = end;
        if (rc == WSYNC_OK)
            rc = wsync_nccl_wait(comm, deadline, "enqueueing a step's transfers", nc_check_inbox,
                                 st);
        if (rc != WSYNC_OK)
            return rc;
        i = j;
    }
    return rc;
}

wsync_status_t wsync_nccl_wait_ev(nc_state_t *st, void *ev, uint32_t k, uint64_t version)
{
    int64_t t0 = wsync_now_ms(), deadline = wsync_deadline_in(st->m->timeout_ms), spins = 0;
    wsync_status_t rc;

    for (;;) {
        int done = 0;
        if ((rc = wsync_dev_event_query(ev, &done)) != WSYNC_OK)
            return rc;
        if (done)
            return WSYNC_OK;
        if ((rc = wsync_nccl_check(st->comm)) != WSYNC_OK)
            return rc;
        for (uint32_t j = 0; j < st->sched->nsplits; j++)
            if ((rc = wsync_nccl_check(st->sub[j])) != WSYNC_OK)
                return rc;
        if ((rc = wsync_inbox_failed(&st->m->inbox)) != WSYNC_OK)
            return rc;
        if (wsync_now_ms() >= deadline) {
            /* whom this step waits on: the peers of its ops */
            char who[512] = "";
            size_t n = 0;
            const nc_step_t *step = &st->steps[k];
            for (uint32_t i = 0; i < step->nmyops && n + 48 < sizeof(who); i++) {
                const wsync_nccl_op_t *op = &st->sched->ops[st->myops[step->myop0 + i].op];
                char nm[64];
                if (op->kind == WSYNC_NCCL_OP_P2P)
                    rank_name(st, st->role == WSYNC_ROLE_SENDER ? st->m->nsenders +
                                  (int)op->receiver : (int)op->sender, nm, sizeof(nm));
                else
                    snprintf(nm, sizeof(nm), "the broadcast group of sender %u", op->sender);
                if (strstr(who, nm) == NULL)
                    n += (size_t)snprintf(who + n, sizeof(who) - n, "%s%s", n ? ", " : "", nm);
            }
            return wsync_err(WSYNC_ERR_TIMEOUT, "nccl: %s %u: version %llu: step %u of %u did not "
                             "finish within %lld ms (transfers with %s)", role_word(st->role),
                             st->rank, (unsigned long long)version, k, st->sched->nsteps,
                             (long long)(wsync_now_ms() - t0), n ? who : "nobody");
        }
        if (++spins > 200) {
            struct timespec ts = {0, spins < 5000 ? 20000 : 200000};
            nanosleep(&ts, NULL);
        }
    }
}

/* Wait until step k's work is done (its slot free again): polls its event, NCCL's asynchronous
 * errors and the control plane, until the member's timeout. */
static wsync_status_t wait_step(nc_state_t *st, uint32_t k, uint64_t version)
{
    return wsync_nccl_wait_ev(st, st->ev_done[k % NC_SLOTS], k, version);
}

/* ================================================================================================
 * Sender
 * ============================================================================================== */

static void nccl_sender_teardown(wsync_sender_t *s)
{
    nc_state_t *st = s->m.scheme_state;

    if (st == NULL)
        return;
    dev_enter(st);
    int prev = st->prev_device, dev = st->device;
    state_free(st);
    if (prev >= 0 && prev != dev)
        wsync_dev_set(prev);
    s->m.scheme_state = NULL;
}

/* Staging layout, pack copies and direct pointers of every step. */
static wsync_status_t sender_bind(wsync_sender_t *s, nc_state_t *st)
{
    const wsync_plan_t *plan = s->m.plan;
    wsync_kcopy_t *descs = NULL;
    uint32_t cap = 0;
    wsync_status_t rc = WSYNC_OK;
    uint32_t ndirect = 0, nstaged = 0;

    /* offsets first: slot size is the largest step */
    for (uint32_t k = 0; k < st->sched->nsteps; k++) {
        nc_step_t *step = &st->steps[k];
        for (uint32_t i = 0; i < step->nmyops; i++) {
            nc_myop_t *o = &st->myops[step->myop0 + i];
            const wsync_nccl_op_t *op = &st->sched->ops[o->op];
            const wsync_chunk_t *c = &plan->chunks[st->sched->items[op->item0].chunk];
            step->bytes += op->bytes;
            /* an FP8 chunk's codes and scales exist only once packed: never straight from the
             * shard */
            if (!op->packed && c->rule == 0 && wsync_nccl_region_contiguous(&c->src)) {
                o->staged = 0;
                o->direct = (uint8_t *)s->shard_data[c->shard] + c->src.off * wsync_dtype_size(c->dtype);
                ndirect++;
                continue;
            }
            o->staged = 1;
            o->soff = wsync_align_up(step->staging, NC_ALIGN);
            step->staging = o->soff + op->bytes;
            for (uint32_t j = 0; j < op->nitems; j++) {
                if (plan->chunks[st->sched->items[op->item0 + j].chunk].rule != 0)
                    step->nquant++;
                else
                    step->ncopies++;
            }
            nstaged++;
        }
        step->quant0 = st->nquant;
        st->nquant += step->nquant;
    }
    if (st->d != NULL && st->nquant > 0)
        return wsync_err(WSYNC_ERR_INTERNAL, "nccl: sender %d: the plan sends %u chunks as FP8 "
                         "codes in a group with delta versions (delta groups get plain plans)",
                         s->m.rank, st->nquant);
    if (st->d != NULL && (rc = wsync_nccl_delta_layout(st, plan, NULL)) != WSYNC_OK)
        return rc;
    if ((rc = alloc_slots(st)) != WSYNC_OK)
        return rc;
    if (st->d != NULL && (rc = wsync_nccl_delta_sender_batches(s, st)) != WSYNC_OK)
        return rc;
    if ((rc = wsync_nccl_wire_sender_bind(s, st)) != WSYNC_OK)
        return rc;
    for (uint32_t k = 0; k < st->sched->nsteps && rc == WSYNC_OK; k++) {
        nc_step_t *step = &st->steps[k];
        uint32_t n = 0;
        if (step->ncopies == 0)
            continue;
        if ((rc = wsync_kcopy_reserve(&descs, &cap, step->ncopies)) != WSYNC_OK)
            break;
        for (uint32_t i = 0; i < step->nmyops; i++) {
            const nc_myop_t *o = &st->myops[step->myop0 + i];
            const wsync_nccl_op_t *op = &st->sched->ops[o->op];
            if (!o->staged)
                continue;
            for (uint32_t j = 0; j < op->nitems; j++) {
                const wsync_nccl_item_t *it = &st->sched->items[op->item0 + j];
                const wsync_chunk_t *c = &plan->chunks[it->chunk];
                uint64_t esz = wsync_dtype_size(c->dtype);
                if (c->rule != 0)
                    continue;   /* quantized into the slot: wsync_nccl_wire_sender_bind */
                descs[n++] = (wsync_kcopy_t){
                    .src = s->shard_data[c->shard], .dst = st->slot[k % NC_SLOTS],
                    .src_off = c->src.off, .src_pitch = c->src.pitch,
                    .dst_off = (o->soff + it->off) / esz, .dst_pitch = c->src.cols,
                    .rows = c->src.rows, .cols = c->src.cols,
                    .src_dtype = c->dtype, .dst_dtype = c->dtype};
            }
        }
        rc = wsync_dev_batch_create(descs, n, &step->batch);
    }
    free(descs);
    if (rc == WSYNC_OK)
        WSYNC_LOG_I("nccl: sender %d: %u steps, %u ops (%u straight from the shards, %u staged), "
                    "%u chunks quantized to FP8 as they are packed, staging 2 x %llu bytes; the "
                    "group's broadcasts carry %llu bytes a version, its sends %llu", s->m.rank,
                    st->sched->nsteps, ndirect + nstaged, ndirect, nstaged, st->nquant,
                    (unsigned long long)st->slot_bytes,
                    (unsigned long long)st->sched->bytes_bcast,
                    (unsigned long long)st->sched->bytes_p2p);
    return rc;
}

static wsync_status_t nccl_sender_setup(wsync_sender_t *s)
{
    nc_state_t *st = calloc(1, sizeof(*st));
    const char *first = NULL;
    wsync_status_t rc;

    if (st == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory");
    s->m.scheme_state = st;
    st->m = &s->m;
    st->role = WSYNC_ROLE_SENDER;
    st->rank = (uint32_t)s->m.rank;
    st->device = -1;
    rc = WSYNC_OK;
    for (size_t i = 0; i < s->nshards && rc == WSYNC_OK; i++)
        rc = device_item(st, s->shards[i].mem, s->shards[i].device, s->shards[i].param.name,
                         &first);
    if (rc == WSYNC_OK && first == NULL)
        rc = wsync_dev_get(&st->device);   /* nothing to send: any device will do */
    st->prev_device = -1;
    if (rc == WSYNC_OK && wsync_dev_get(&st->prev_device) != WSYNC_OK)
        st->prev_device = -1;
    if (rc == WSYNC_OK)
        rc = common_setup(st, &s->m, WSYNC_ROLE_SENDER, (uint32_t)s->m.rank);
    if (rc == WSYNC_OK && s->m.planmsg.delta == WSYNC_DELTA_MODE_ON)
        rc = wsync_nccl_delta_sender_setup(s, st);
    if (rc == WSYNC_OK)
        rc = sender_bind(s, st);
    if (rc != WSYNC_OK)
        rc = nc_fail(st, rc);
    dev_leave(st);
    return rc;
}

/* Sender me's chunks: [*c0, *c1) (chunks are ordered by sender). */
static void my_chunks(const wsync_plan_t *plan, uint32_t me, uint32_t *c0, uint32_t *c1)
{
    uint32_t a = 0, b;

    while (a < plan->nchunks && plan->chunks[a].sender < me)
        a++;
    for (b = a; b < plan->nchunks && plan->chunks[b].sender == me; b++)
        ;
    *c0 = a;
    *c1 = b;
}

/* WSYNC_VERIFY, at version start: room for the version's checksums, and those of the chunks of
 * ours someone takes that travel as they are (hashed from the shards); an FP8 chunk's exist once
 * its step packed it (wsync_nccl_wire_sender_check). */
static wsync_status_t sender_sums_begin(wsync_sender_t *s, nc_state_t *st)
{
    const wsync_plan_t *plan = s->m.plan;
    uint32_t me = (uint32_t)s->m.rank, c0, c1, m;
    uint32_t *cl = NULL;
    size_t cap = 0;
    wsync_status_t rc = WSYNC_OK;

    free(st->tx_sum);
    free(st->tx_have);
    st->tx_sum = calloc(plan->nchunks + 1, sizeof(uint64_t));
    st->tx_have = calloc(plan->nchunks + 1, 1);
    if (st->tx_sum == NULL || st->tx_have == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for checksums");
    my_chunks(plan, me, &c0, &c1);
    for (uint32_t r = 0; r < plan->nreceivers && rc == WSYNC_OK; r++) {
        if ((rc = wsync_plan_rx_chunks(plan, r, c0, c1, &cl, &cap, &m)) != WSYNC_OK)
            break;
        for (uint32_t k = 0; k < m && rc == WSYNC_OK; k++) {
            uint32_t c = cl[k];
            const wsync_chunk_t *ch = &plan->chunks[c];
            if (st->tx_have[c] || ch->rule != 0)
                continue;
            rc = hash_device(st, s->shard_data[ch->shard], ch->dtype, &ch->src, &st->tx_sum[c]);
            st->tx_have[c] = 1;
        }
    }
    free(cl);
    return rc;
}

/* WSYNC_VERIFY, once every step is packed: relay each receiver the checksums of the chunks it
 * takes from us, in its segments' order. */
static wsync_status_t sender_sums_send(wsync_sender_t *s, nc_state_t *st, uint64_t version)
{
    const wsync_plan_t *plan = s->m.plan;
    uint32_t me = (uint32_t)s->m.rank, nr = plan->nreceivers, c0, c1, m;
    uint32_t *cl = NULL;
    size_t cap = 0;
    wsync_status_t rc = WSYNC_OK;

    my_chunks(plan, me, &c0, &c1);
    for (uint32_t r = 0; r < nr && rc == WSYNC_OK; r++) {
        wsync_wbuf_t b;
        uint32_t n = 0, prev = UINT32_MAX;
        wsync_wbuf_init(&b);
        wsync_put_u64(&b, version);
        wsync_put_u32(&b, 0);                       /* count, patched below */
        if ((rc = wsync_plan_rx_chunks(plan, r, c0, c1, &cl, &cap, &m)) != WSYNC_OK) {
            wsync_wbuf_free(&b);
            break;
        }
        for (uint32_t k = 0; k < m; k++) {
            uint32_t c = cl[k];
            if (c == prev)
                continue;
            if (!st->tx_have[c]) {
                rc = wsync_err(WSYNC_ERR_INTERNAL, "nccl: sender %u: no checksum of chunk %u "
                               "(FP8 on the wire: not packed in any step)", me, c);
                break;
            }
            wsync_put_u64(&b, st->tx_sum[c]);
            prev = c;
            n++;
        }
        if (rc == WSYNC_OK && n > 0 && !b.err) {
            for (int j = 0; j < 4; j++)
                b.data[8 + j] = (uint8_t)(n >> (8 * j));
            rc = b.len > WSYNC_RELAY_MAX
                     ? wsync_err(WSYNC_ERR_RANGE, "nccl: sender %u: %u checksums for receiver %u "
                                 "exceed one relay", me, n, r)
                     : wsync_member_relay_send(&s->m, WSYNC_ROLE_RECEIVER, (int)r, NC_TAG_SUMS,
                                               b.data, (uint32_t)b.len);
        } else if (rc == WSYNC_OK && b.err) {
            rc = wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for checksums");
        }
        wsync_wbuf_free(&b);
    }
    free(cl);
    return rc;
}

static wsync_status_t sender_push_steps(wsync_sender_t *s, nc_state_t *st, uint64_t version)
{
    wsync_status_t rc;
    uint32_t nsteps = st->sched->nsteps;
    uint64_t t0 = wsync_now_ns(), t_wait = 0;
    wsync_status_t refused = WSYNC_OK;   /* an FP8 chunk's NaN/Inf, with its message */
    char refused_text[1024] = "";

    if (st->verify && (rc = sender_sums_begin(s, st)) != WSYNC_OK)
        return rc;
    if (st->d != NULL &&
        (rc = wsync_nccl_delta_begin(st, s->delta_tx, wsync_delta_tx_begin(s->delta_tx, version),
                                      version)) !=
            WSYNC_OK)
        return rc;
    for (int i = 0; i < NC_SLOTS; i++)
        st->slot_step[i] = -1;
    /* per-tensor FP8 targets: their amaxes agreed before any pack (a NaN or Inf refuses the
     * version once every step went out, as below) */
    if ((rc = wsync_nccl_wire_tensor_amax(s, st, version)) != WSYNC_OK) {
        if (rc != WSYNC_ERR_NONFINITE)
            return rc;
        refused = rc;
        snprintf(refused_text, sizeof(refused_text), "%s", wsync_last_error());
    }
    for (uint32_t k = 0; k < nsteps; k++) {
        nc_step_t *step = &st->steps[k];
        uint32_t slot = k % NC_SLOTS;
        int64_t deadline = wsync_deadline_in(s->m.timeout_ms);
        if (step->nmyops == 0)
            continue;
        if (st->slot_step[slot] >= 0) {             /* the slot's previous step must be sent */
            uint64_t w = wsync_now_ns();
            if ((rc = wait_step(st, (uint32_t)st->slot_step[slot], version)) != WSYNC_OK)
                return rc;
            t_wait += wsync_now_ns() - w;
        }
        if (step->batch != NULL || step->ebatch != NULL || step->nquant > 0) {
            if ((step->batch != NULL &&
                 (rc = wsync_dev_batch_launch(step->batch, st->xstream)) != WSYNC_OK) ||
                (step->nquant > 0 &&
                 (rc = wsync_dev_quantize_many(&st->quant[step->quant0], step->nquant,
                                               &st->qws[step->quant0], 0, st->xstream)) !=
                     WSYNC_OK) ||
                (st->d != NULL && (rc = wsync_nccl_delta_encode(s, st, k)) != WSYNC_OK) ||
                (rc = wsync_dev_event_record(st->ev_copy[slot], st->xstream)) != WSYNC_OK ||
                (rc = wsync_dev_stream_wait_event(st->cstream, st->ev_copy[slot])) != WSYNC_OK)
                return rc;
            s->stats.bytes_packed += step->staging;
        }
        /* FP8 on the wire: a NaN or Inf refuses the version, but the steps still go out, so
         * that every send and receive of the peers completes; PACKED and the checksums never */
        if ((rc = wsync_nccl_wire_sender_check(s, st, k, version)) != WSYNC_OK) {
            if (rc != WSYNC_ERR_NONFINITE)
                return rc;
            if (refused == WSYNC_OK) {
                refused = rc;
                snprintf(refused_text, sizeof(refused_text), "%s", wsync_last_error());
            }
        }
        if ((int64_t)k == st->last_qstep && !st->verify && refused == WSYNC_OK &&
            (rc = wsync_nccl_wire_send_packed(s, st, version)) != WSYNC_OK)
            return rc;
        /* DELTA ops: the encoded lengths to the host, the tables out (fault point inside) */
        if (st->d != NULL && step->ndelta > 0 &&
            (rc = wsync_nccl_delta_tables(s, st, k)) != WSYNC_OK)
            return rc;
        switch (WSYNC_FAULT(WSYNC_FAULT_PUSH_BUCKET)) {
        case WSYNC_FAULT_FAIL: {
            char where[128];
            snprintf(where, sizeof(where), "nccl sender %d, step %u of version %llu", s->m.rank, k,
                     (unsigned long long)version);
            return wsync_fault_err(WSYNC_FAULT_PUSH_BUCKET, where);
        }
        case WSYNC_FAULT_CORRUPT: {   /* in the staging slot: what goes on the wire */
            const nc_myop_t *o = NULL;
            for (uint32_t i = 0; i < step->nmyops && o == NULL; i++)
                if (st->myops[step->myop0 + i].staged)
                    o = &st->myops[step->myop0 + i];
            if (o == NULL) {
                WSYNC_LOG_W("nccl: sender %d: step %u is sent from the shards: nothing staged to "
                            "corrupt", s->m.rank, k);
                break;
            }
            if ((rc = wsync_dev_stream_sync(st->xstream, deadline, "nccl: packing")) != WSYNC_OK ||
                (rc = wsync_nccl_flip_device(st, (uint8_t *)st->slot[slot] + o->soff,
                                  (size_t)st->sched->ops[o->op].bytes)) != WSYNC_OK)
                return rc;
            break;
        }
        default:
            break;
        }
        rc = st->d != NULL && step->ndelta > 0 ? issue_step(st, k, deadline, NC_PASS_TABLES)
                                               : WSYNC_OK;
        if (rc == WSYNC_OK)
            rc = issue_step(st, k, deadline, st->d != NULL && step->ndelta > 0 ? NC_PASS_DATA
                                                                              : NC_PASS_PLAIN);
        if (rc != WSYNC_OK ||
            (rc = wsync_dev_event_record(st->ev_done[slot], st->cstream)) != WSYNC_OK)
            return rc;
        st->slot_step[slot] = k;
        s->stats.buckets++;
    }
    /* the checksums go once every FP8 chunk is packed and hashed: the receivers compare them
     * after their last step */
    if (st->verify && refused == WSYNC_OK && (rc = sender_sums_send(s, st, version)) != WSYNC_OK)
        return rc;
    for (uint32_t i = 0; i < NC_SLOTS; i++) {
        uint32_t slot = (uint32_t)(i + nsteps) % NC_SLOTS;   /* oldest first */
        if (st->slot_step[slot] >= 0 &&
            (rc = wait_step(st, (uint32_t)st->slot_step[slot], version)) != WSYNC_OK)
            return rc;
    }
    if (refused != WSYNC_OK)
        return wsync_err_set_text(refused, refused_text);
    double secs = (double)(wsync_now_ns() - t0) / 1e9;
    uint64_t sent = 0;
    for (uint32_t k = 0; k < nsteps; k++)
        sent += st->steps[k].bytes;
    if (st->d != NULL) {
        s->stats.bytes_encoded = st->d->enc;
        s->stats.bytes_plain = st->d->plain;
        s->stats.bytes_wire = st->d->enc + st->d->plain;
        s->stats.base_version = st->d->base;
        WSYNC_LOG_D("nccl: sender %d: version %llu (base %llu): %llu bytes encoded, %llu plain "
                    "on the wire", s->m.rank, (unsigned long long)version,
                    (unsigned long long)st->d->base, (unsigned long long)st->d->enc,
                    (unsigned long long)st->d->plain);
    }
    WSYNC_LOG_D("nccl: sender %d: version %llu: %llu bytes sent in %u steps in %.4f s (%.2f GB/s; "
                "%.4f s waiting for slots)", s->m.rank, (unsigned long long)version,
                (unsigned long long)sent, nsteps, secs, secs > 0 ? (double)sent / secs / 1e9 : 0.0,
                (double)t_wait / 1e9);
    return WSYNC_OK;
}

static wsync_status_t nccl_sender_push(wsync_sender_t *s, uint64_t version)
{
    nc_state_t *st = s->m.scheme_state;
    wsync_status_t rc;

    if (st == NULL || st->aborted)
        return wsync_err(WSYNC_ERR_STATE, "nccl: sender %d: the communicator was aborted by an "
                         "earlier failure", s->m.rank);
    dev_enter(st);
    rc = sender_push_steps(s, st, version);
    if (rc != WSYNC_OK)
        rc = nc_fail(st, rc);
    dev_leave(st);
    if (rc == WSYNC_OK)
        for (uint32_t r = 0; r < s->m.plan->nreceivers; r++)
            s->stats.bytes_delivered +=
                s->m.plan->pair_bytes[(size_t)s->m.rank * s->m.plan->nreceivers + r];
    return rc;
}

/* ================================================================================================
 * Receiver
 * ============================================================================================== */

static void nccl_receiver_teardown(wsync_receiver_t *r)
{
    nc_state_t *st = r->m.scheme_state;

    if (st == NULL)
        return;
    dev_enter(st);
    int prev = st->prev_device, dev = st->device;
    state_free(st);
    if (prev >= 0 && prev != dev)
        wsync_dev_set(prev);
    r->m.scheme_state = NULL;
}

/* Our segments of chunk c: [*lo, *hi) in st->m->segs. */
static void my_segments(const wsync_plan_t *plan, const nc_state_t *st, uint32_t c, uint32_t *lo,
                        uint32_t *hi)
{
    uint32_t a = st->seg_lo, b = st->seg_hi;
    (void)plan;
    while (a < b) {
        uint32_t mid = a + (b - a) / 2;
        if (st->m->segs[mid].chunk < c)
            a = mid + 1;
        else
            b = mid;
    }
    *lo = a;
    while (a < st->seg_hi && st->m->segs[a].chunk == c)
        a++;
    *hi = a;
}

static wsync_status_t add_rseg(nc_state_t *st, uint32_t seg, int staged, uint64_t soff)
{
    if (st->nrsegs == st->rsegs_cap) {
        uint32_t cap = st->rsegs_cap ? st->rsegs_cap * 2 : 64;
        nc_rseg_t *p = realloc(st->rsegs, cap * sizeof(*p));
        if (p == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for the schedule");
        st->rsegs = p;
        st->rsegs_cap = cap;
    }
    st->rsegs[st->nrsegs++] = (nc_rseg_t){seg, staged, soff};
    return WSYNC_OK;
}

/* Staging layout, unpack copies and direct pointers of every step, for the landing buffers as
 * they are now (again whenever the application moved a target). */
static wsync_status_t receiver_bind(wsync_receiver_t *r, nc_state_t *st)
{
    const wsync_plan_t *plan = r->m.plan;
    wsync_kcopy_t *descs = NULL;
    uint32_t cap = 0, ndirect = 0, nstaged = 0;
    wsync_status_t rc = WSYNC_OK;

    free_batches(st);
    st->nrsegs = 0;
    st->bytes_total = 0;
    if (st->d != NULL)
        wsync_nccl_delta_free_batches(st);   /* built for the old targets */
    for (uint32_t k = 0; k < st->sched->nsteps; k++) {
        nc_step_t *step = &st->steps[k];
        step->staging = 0;
        step->ncopies = 0;
        step->bytes = 0;
        step->rseg0 = st->nrsegs;
        for (uint32_t i = 0; i < step->nmyops && rc == WSYNC_OK; i++) {
            nc_myop_t *o = &st->myops[step->myop0 + i];
            const wsync_nccl_op_t *op = &st->sched->ops[o->op];
            uint32_t lo, hi;
            o->staged = 1;
            o->direct = NULL;
            if (!op->packed) {
                const wsync_chunk_t *c = &plan->chunks[st->sched->items[op->item0].chunk];
                my_segments(plan, st, st->sched->items[op->item0].chunk, &lo, &hi);
                /* an FP8 chunk's codes and scales go two ways: always staged */
                if (hi == lo + 1 && c->rule == 0) {
                    const wsync_segment_t *sg = &st->m->segs[lo];
                    if (r->land_dtype[sg->target] == c->dtype &&
                        wsync_nccl_region_contiguous(&sg->dst)) {
                        o->staged = 0;
                        o->direct = (uint8_t *)r->land[sg->target] +
                                    sg->dst.off * wsync_dtype_size(c->dtype);
                        rc = add_rseg(st, lo, 0, 0);
                        step->bytes += sg->dst.rows * sg->dst.cols * wsync_dtype_size(c->dtype);
                        ndirect++;
                        continue;
                    }
                }
            }
            o->soff = wsync_align_up(step->staging, NC_ALIGN);
            step->staging = o->soff + op->bytes;
            nstaged++;
            for (uint32_t j = 0; j < op->nitems && rc == WSYNC_OK; j++) {
                const wsync_nccl_item_t *it = &st->sched->items[op->item0 + j];
                my_segments(plan, st, it->chunk, &lo, &hi);
                for (uint32_t g = lo; g < hi && rc == WSYNC_OK; g++) {
                    const wsync_segment_t *sg = &st->m->segs[g];
                    const wsync_chunk_t *c = &plan->chunks[it->chunk];
                    rc = add_rseg(st, g, 1, o->soff + it->off);
                    if (c->rule != 0) {      /* codes, then scales */
                        step->ncopies += 2;
                        step->bytes += sg->dst.rows * sg->dst.cols + (uint64_t)c->ncells * 4u;
                        continue;
                    }
                    step->ncopies++;
                    step->bytes += sg->dst.rows * sg->dst.cols *
                                   wsync_dtype_size(r->land_dtype[sg->target]);
                }
            }
        }
        step->nrseg = st->nrsegs - step->rseg0;
        st->bytes_total += step->bytes;
    }
    if (rc == WSYNC_OK && st->d != NULL)
        rc = wsync_nccl_delta_layout(st, plan, r);
    if (rc == WSYNC_OK)
        rc = alloc_slots(st);
    for (uint32_t k = 0; k < st->sched->nsteps && rc == WSYNC_OK; k++) {
        nc_step_t *step = &st->steps[k];
        uint32_t n = 0;
        if (step->ncopies == 0)
            continue;
        if ((rc = wsync_kcopy_reserve(&descs, &cap, step->ncopies)) != WSYNC_OK)
            break;
        for (uint32_t i = 0; i < step->nrseg; i++) {
            const nc_rseg_t *e = &st->rsegs[step->rseg0 + i];
            const wsync_segment_t *sg = &st->m->segs[e->seg];
            const wsync_chunk_t *c = &plan->chunks[sg->chunk];
            if (!e->staged)
                continue;
            if (c->rule != 0) {
                if ((rc = wsync_nccl_wire_unpack_descs(r, st, sg, e->soff, st->slot[k % NC_SLOTS],
                                            &descs[n])) != WSYNC_OK)
                    break;
                n += 2;
                continue;
            }
            descs[n++] = (wsync_kcopy_t){
                .src = st->slot[k % NC_SLOTS], .dst = r->land[sg->target],
                .src_off = e->soff / wsync_dtype_size(c->dtype), .src_pitch = c->src.cols,
                .dst_off = sg->dst.off, .dst_pitch = sg->dst.pitch,
                .rows = sg->dst.rows, .cols = sg->dst.cols,
                .src_dtype = c->dtype, .dst_dtype = r->land_dtype[sg->target]};
        }
        if (rc == WSYNC_OK)
            rc = wsync_dev_batch_create(descs, n, &step->batch);
    }
    free(descs);
    if (rc != WSYNC_OK)
        return rc;
    free(st->sums);
    st->sums = calloc(st->nrsegs + 1, sizeof(uint64_t));
    if (st->sums == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory");
    if (st->bound_land == NULL && (st->bound_land = calloc(r->ntargets + 1, sizeof(void *))) == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory");
    memcpy(st->bound_land, r->land, r->ntargets * sizeof(void *));
    WSYNC_LOG_I("nccl: receiver %d: %u steps, %u ops (%u straight into the targets, %u staged), "
                "staging 2 x %llu bytes, %llu bytes landing a version", r->m.rank,
                st->sched->nsteps, ndirect + nstaged, ndirect, nstaged,
                (unsigned long long)st->slot_bytes, (unsigned long long)st->bytes_total);
    return WSYNC_OK;
}

static wsync_status_t nccl_receiver_setup(wsync_receiver_t *r)
{
    nc_state_t *st = calloc(1, sizeof(*st));
    const wsync_plan_t *plan = r->m.plan;
    const char *first = NULL;
    wsync_status_t rc;

    if (st == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory");
    r->m.scheme_state = st;
    st->m = &r->m;
    st->role = WSYNC_ROLE_RECEIVER;
    st->rank = (uint32_t)r->m.rank;
    st->device = -1;
    st->seg_lo = 0;                  /* our segments: r->m.segs, all of them */
    st->seg_hi = r->m.nsegs;
    rc = WSYNC_OK;
    for (size_t i = 0; i < r->ntargets && rc == WSYNC_OK; i++)
        rc = device_item(st, r->targets[i].mem, r->targets[i].device, r->targets[i].name, &first);
    if (rc == WSYNC_OK && first == NULL)
        rc = wsync_dev_get(&st->device);
    st->prev_device = -1;
    if (rc == WSYNC_OK && wsync_dev_get(&st->prev_device) != WSYNC_OK)
        st->prev_device = -1;
    if (rc == WSYNC_OK)
        rc = common_setup(st, &r->m, WSYNC_ROLE_RECEIVER, (uint32_t)r->m.rank);
    if (rc == WSYNC_OK && r->m.planmsg.delta == WSYNC_DELTA_MODE_ON) {
        for (uint32_t g = st->seg_lo; g < st->seg_hi && rc == WSYNC_OK; g++)
            if (plan->chunks[st->m->segs[g].chunk].rule != 0)
                rc = wsync_err(WSYNC_ERR_INTERNAL, "nccl: receiver %d: chunk %u travels as FP8 "
                               "codes in a group with delta versions (delta groups get plain "
                               "plans)", r->m.rank, st->m->segs[g].chunk);
        if (rc == WSYNC_OK)
            rc = wsync_nccl_delta_receiver_setup(r, st);
    }
    if (rc == WSYNC_OK)
        rc = receiver_bind(r, st);
    if (rc != WSYNC_OK)
        rc = nc_fail(st, rc);
    dev_leave(st);
    return rc;
}

/* After step k landed: checksums of what landed (verify), the fault point, progress. */
static wsync_status_t receiver_step_done(wsync_receiver_t *r, nc_state_t *st, uint32_t k,
                                         uint64_t version, uint64_t *bytes_done)
{
    const wsync_plan_t *plan = r->m.plan;
    const nc_step_t *step = &st->steps[k];
    wsync_status_t rc;

    if (st->d != NULL && step->ndelta > 0 && (rc = wsync_nccl_delta_check(r, st, k)) != WSYNC_OK)
        return rc;
    switch (WSYNC_FAULT(WSYNC_FAULT_RECV_UNPACK)) {
    case WSYNC_FAULT_FAIL: {
        char where[128];
        snprintf(where, sizeof(where), "nccl receiver %d, step %u of version %llu", r->m.rank, k,
                 (unsigned long long)version);
        return wsync_fault_err(WSYNC_FAULT_RECV_UNPACK, where);
    }
    case WSYNC_FAULT_CORRUPT:   /* in the target, in the first row the step filled */
        if (step->nrseg > 0) {
            const wsync_segment_t *sg = &st->m->segs[st->rsegs[step->rseg0].seg];
            size_t esz = wsync_dtype_size(r->land_dtype[sg->target]);
            if ((rc = wsync_nccl_flip_device(st, (uint8_t *)r->land[sg->target] + sg->dst.off * esz,
                                  (size_t)sg->dst.cols * esz)) != WSYNC_OK)
                return rc;
        }
        break;
    default:
        break;
    }
    for (uint32_t i = 0; st->verify && i < step->nrseg; i++) {
        const nc_rseg_t *e = &st->rsegs[step->rseg0 + i];
        const wsync_segment_t *sg = &st->m->segs[e->seg];
        const wsync_chunk_t *c = &plan->chunks[sg->chunk];
        if (c->rule != 0) {
            /* FP8 on the wire: the codes and scales as they landed, as the sender hashed them */
            rc = wsync_nccl_wire_hash_landed(r, st, sg, &st->sums[step->rseg0 + i]);
        } else if (r->land_dtype[sg->target] == c->dtype || !e->staged) {
            rc = hash_device(st, r->land[sg->target], c->dtype, &sg->dst,
                             &st->sums[step->rseg0 + i]);
        } else {
            /* across a cast: the bytes the cast read, still in the slot */
            wsync_region_t dense = {e->soff / wsync_dtype_size(c->dtype), c->src.cols,
                                    c->src.rows, c->src.cols};
            rc = hash_device(st, st->slot[k % NC_SLOTS], c->dtype, &dense,
                             &st->sums[step->rseg0 + i]);
        }
        if (rc != WSYNC_OK)
            return rc;
    }
    for (uint32_t i = 0; i < step->nrseg; i++) {   /* FP8 targets now whole start quantizing */
        uint32_t g = st->rsegs[step->rseg0 + i].seg;
        if (plan->chunks[st->m->segs[g].chunk].rule != 0)
            continue;                /* came quantized: nothing to quantize here */
        if ((rc = wsync_receiver_landed(r, g, g + 1)) != WSYNC_OK)
            return rc;
    }
    *bytes_done += step->bytes;
    if (r->progress != NULL)
        r->progress(r->progress_arg, version, *bytes_done, st->bytes_total);
    return WSYNC_OK;
}

/* WSYNC_VERIFY: each sender's checksums against what landed. */
static wsync_status_t receiver_verify(wsync_receiver_t *r, nc_state_t *st, uint64_t version)
{
    const wsync_plan_t *plan = r->m.plan;
    uint32_t ns = plan->nsenders, expect = 0, got = 0;
    uint64_t **sums = calloc(ns, sizeof(*sums));
    uint32_t *nsums = calloc(ns, sizeof(uint32_t)), *cursor = calloc(ns, sizeof(uint32_t));
    uint64_t *landed = calloc(st->seg_hi - st->seg_lo + 1, sizeof(uint64_t));
    uint8_t *need = calloc(ns, 1);
    int64_t deadline = wsync_deadline_in(r->m.timeout_ms);
    wsync_status_t rc = WSYNC_OK;

    if (sums == NULL || nsums == NULL || cursor == NULL || landed == NULL || need == NULL) {
        rc = wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for checksums");
        goto out;
    }
    for (uint32_t i = 0; i < st->nrsegs; i++)
        landed[st->rsegs[i].seg - st->seg_lo] = st->sums[i];
    for (uint32_t g = st->seg_lo; g < st->seg_hi; g++) {
        uint32_t s = plan->chunks[st->m->segs[g].chunk].sender;
        expect += !need[s];
        need[s] = 1;
    }
    while (got < expect) {
        wsync_msg_t *msg;
        wsync_relay_t rl;
        rc = wsync_member_relay_recv(&r->m, deadline, &msg, &rl);
        if (rc == WSYNC_ERR_TIMEOUT)
            rc = wsync_err(rc, "nccl: receiver %d: version %llu: checksums from %u of %u senders "
                           "did not come within %d ms", r->m.rank, (unsigned long long)version,
                           expect - got, expect, r->m.timeout_ms);
        if (rc != WSYNC_OK)
            goto out;
        wsync_rbuf_t rb;
        wsync_rbuf_init(&rb, rl.data, rl.len);
        uint64_t v = wsync_get_u64(&rb);
        uint32_t n = wsync_get_count(&rb, 8);
        uint32_t s = (uint32_t)rl.rank;
        int bad = rb.err || rl.tag != NC_TAG_SUMS || rl.role != WSYNC_ROLE_SENDER || s >= ns ||
                  !need[s] || sums[s] != NULL || v != version;
        if (!bad && (sums[s] = malloc((size_t)n * sizeof(uint64_t) + 1)) == NULL)
            bad = 1;
        for (uint32_t i = 0; !bad && i < n; i++)
            sums[s][i] = wsync_get_u64(&rb);
        bad = bad || rb.err || wsync_rbuf_left(&rb) != 0;
        nsums[s] = n;
        wsync_msg_free(msg);
        if (bad) {
            rc = wsync_err(WSYNC_ERR_PROTOCOL, "nccl: receiver %d: unexpected checksums (tag %u) "
                           "from %s %d while verifying version %llu", r->m.rank, rl.tag,
                           role_word((int)rl.role), rl.rank, (unsigned long long)version);
            goto out;
        }
        got++;
    }
    for (uint32_t g = st->seg_lo, prev = UINT32_MAX; g < st->seg_hi; g++) {
        const wsync_segment_t *sg = &st->m->segs[g];
        const wsync_chunk_t *c = &plan->chunks[sg->chunk];
        uint32_t s = c->sender;
        if (sg->chunk != prev)
            cursor[s]++;
        prev = sg->chunk;
        if (cursor[s] > nsums[s]) {
            rc = wsync_err(WSYNC_ERR_PROTOCOL, "nccl: receiver %d: sender %u sent %u checksums, "
                           "fewer than the chunks it sends us", r->m.rank, s, nsums[s]);
            goto out;
        }
        uint64_t want = sums[s][cursor[s] - 1], have = landed[g - st->seg_lo];
        if (want != have) {
            const wsync_target_desc_t *t = &r->targets[sg->target];
            rc = wsync_err(WSYNC_ERR_INTEGRITY, "receiver %d: version %llu refused: param '%s' "
                           "(target '%s') from sender %u (pid %u), chunk %u (bucket %u, %llu x "
                           "%llu %s): the sender's xxh3 is %016llx, what landed hashes to %016llx",
                           r->m.rank, (unsigned long long)version, t->pieces[sg->piece].param.name,
                           t->name, s, r->m.planmsg.peers[s].pid, sg->chunk, c->bucket,
                           (unsigned long long)c->src.rows, (unsigned long long)c->src.cols,
                           c->rule != 0 ? "as FP8 codes and scales" : wsync_dtype_name(c->dtype),
                           (unsigned long long)want, (unsigned long long)have);
            goto out;
        }
    }
out:
    for (uint32_t s = 0; sums != NULL && s < ns; s++)
        free(sums[s]);
    free(sums);
    free(nsums);
    free(cursor);
    free(landed);
    free(need);
    return rc;
}

/* Step k has DELTA ops: their tables first (NCCL), to the host, read. */
static wsync_status_t receiver_tables(wsync_receiver_t *r, nc_state_t *st, uint32_t k)
{
    const nc_step_t *step = &st->steps[k];
    uint32_t slot = k % NC_SLOTS;
    wsync_status_t rc;

    if ((rc = issue_step(st, k, wsync_deadline_in(r->m.timeout_ms), NC_PASS_TABLES)) != WSYNC_OK ||
        (rc = wsync_dev_memcpy_async(st->d->thost[slot], st->d->tdev[slot],
                                     (size_t)step->tstaging, st->cstream)) != WSYNC_OK ||
        (rc = wsync_dev_event_record(st->d->ev_tab, st->cstream)) != WSYNC_OK ||
        (rc = wsync_nccl_wait_ev(st, st->d->ev_tab, k, st->d->version)) != WSYNC_OK)
        return rc;
    return wsync_nccl_delta_read_tables(r, st, k);
}

static wsync_status_t receiver_recv_steps(wsync_receiver_t *r, nc_state_t *st, uint64_t version)
{
    uint32_t nsteps = st->sched->nsteps;
    uint64_t t0 = wsync_now_ns(), bytes_done = 0, t_wait = 0;
    wsync_status_t rc;

    if (memcmp(st->bound_land, r->land, r->ntargets * sizeof(void *)) != 0) {
        WSYNC_LOG_I("nccl: receiver %d: targets moved: rebuilding the copies", r->m.rank);
        if ((rc = receiver_bind(r, st)) != WSYNC_OK)
            return rc;
    }
    if (st->d != NULL &&
        (rc = wsync_nccl_delta_begin(st, NULL, wsync_delta_rx_holds(r), version)) != WSYNC_OK)
        return rc;
    for (int i = 0; i < NC_SLOTS; i++)
        st->slot_step[i] = -1;
    r->torn = 1;   /* from the first byte on, the targets no longer hold only the last version */
    for (uint32_t k = 0; k < nsteps; k++) {
        nc_step_t *step = &st->steps[k];
        uint32_t slot = k % NC_SLOTS;
        if (step->nmyops == 0)
            continue;
        if (st->slot_step[slot] >= 0) {             /* the slot's previous step must be unpacked */
            uint32_t prev = (uint32_t)st->slot_step[slot];
            uint64_t w = wsync_now_ns();
            if ((rc = wait_step(st, prev, version)) != WSYNC_OK)
                return rc;
            t_wait += wsync_now_ns() - w;
            if ((rc = receiver_step_done(r, st, prev, version, &bytes_done)) != WSYNC_OK)
                return rc;
        }
        int delta = st->d != NULL && step->ndelta > 0;
        if (delta && (rc = receiver_tables(r, st, k)) != WSYNC_OK)
            return rc;
        if ((rc = issue_step(st, k, wsync_deadline_in(r->m.timeout_ms),
                             delta ? NC_PASS_DATA : NC_PASS_PLAIN)) != WSYNC_OK ||
            (rc = wsync_dev_event_record(st->ev_copy[slot], st->cstream)) != WSYNC_OK ||
            (rc = wsync_dev_stream_wait_event(st->xstream, st->ev_copy[slot])) != WSYNC_OK)
            return rc;
        if (delta)
            rc = wsync_nccl_delta_launch(r, st, k);
        else if (step->batch != NULL)
            rc = wsync_dev_batch_launch(step->batch, st->xstream);
        if (rc != WSYNC_OK)
            return rc;
        if ((rc = wsync_dev_event_record(st->ev_done[slot], st->xstream)) != WSYNC_OK)
            return rc;
        st->slot_step[slot] = k;
    }
    for (uint32_t i = 0; i < NC_SLOTS; i++) {
        uint32_t slot = (uint32_t)(i + nsteps) % NC_SLOTS;   /* oldest first */
        if (st->slot_step[slot] < 0)
            continue;
        uint32_t k = (uint32_t)st->slot_step[slot];
        if ((rc = wait_step(st, k, version)) != WSYNC_OK ||
            (rc = receiver_step_done(r, st, k, version, &bytes_done)) != WSYNC_OK)
            return rc;
    }
    if (!st->verify && (rc = wsync_nccl_wire_wait_packed(r, st, version)) != WSYNC_OK)
        return rc;
    if (st->verify && (rc = receiver_verify(r, st, version)) != WSYNC_OK)
        return rc;
    double secs = (double)(wsync_now_ns() - t0) / 1e9;
    WSYNC_LOG_D("nccl: receiver %d: version %llu: %llu bytes landed in %u steps in %.4f s "
                "(%.2f GB/s; %.4f s waiting for slots)", r->m.rank, (unsigned long long)version,
                (unsigned long long)bytes_done, nsteps, secs,
                secs > 0 ? (double)bytes_done / secs / 1e9 : 0.0, (double)t_wait / 1e9);
    return WSYNC_OK;
}

static wsync_status_t nccl_receiver_recv(wsync_receiver_t *r, uint64_t version)
{
    nc_state_t *st = r->m.scheme_state;
    wsync_status_t rc;

    if (st == NULL || st->aborted)
        return wsync_err(WSYNC_ERR_STATE, "nccl: receiver %d: the communicator was aborted by an "
                         "earlier failure", r->m.rank);
    dev_enter(st);
    rc = receiver_recv_steps(r, st, version);
    if (rc != WSYNC_OK)
        rc = nc_fail(st, rc);
    dev_leave(st);
    return rc;
}

static wsync_status_t nccl_receiver_fetch(wsync_receiver_t *r, uint64_t version, int timeout_ms,
                                          uint64_t *got)
{
    (void)version;
    (void)timeout_ms;
    (void)got;
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "scheme 'nccl' delivers versions as they are pushed "
                     "(receiver %d)", r->m.rank);
}

const wsync_scheme_ops_t wsync_scheme_nccl = {
    .name = "nccl",
    .implemented = 1,
    .score = nccl_score,
    .sender_setup = nccl_sender_setup,
    .sender_push = nccl_sender_push,
    .sender_teardown = nccl_sender_teardown,
    .receiver_setup = nccl_receiver_setup,
    .receiver_recv = nccl_receiver_recv,
    .receiver_fetch = nccl_receiver_fetch,
    .receiver_teardown = nccl_receiver_teardown,
    .delta = 1,
};
