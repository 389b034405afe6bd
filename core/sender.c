/* The sender: a trainer rank's view. Rank 0 also hosts the coordinator. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "core/objects.h"
#include "core/sock.h"
#include "core/util.h"
#include "kernels/device.h"

wsync_status_t wsync_sender_create(wsync_ctx_t *ctx, const wsync_sender_params_t *params,
                                   wsync_sender_t **out)
{
    wsync_sender_params_t p;
    wsync_sender_t *s;
    wsync_status_t st;
    wsync_hello_t hello;
    char hostname[256] = "";

    if (ctx == NULL || out == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_sender_create: ctx and sender must not be NULL");
    st = wsync_config_sender(params, &p);
    if (st != WSYNC_OK)
        return st;
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "no memory for a sender");
    s->m.ctx = ctx;
    s->m.role = WSYNC_ROLE_SENDER;
    s->m.rank = p.rank;
    s->m.nsenders = p.nranks;
    s->m.nreceivers = p.nreceivers;
    s->m.timeout_ms = p.timeout_ms;
    s->m.heartbeat_ms = p.heartbeat_ms;
    s->m.coordinator = wsync_strdup(p.coordinator);
    s->scheme_choice = wsync_strdup(p.scheme);
    s->bucket_bytes = p.bucket_bytes;
    s->snapshot = p.snapshot;
    s->keep_versions = p.keep_versions;
    s->data_listen_fd = -1;
    s->device = -1;
    if (s->m.coordinator == NULL || s->scheme_choice == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "no memory for a sender");
        goto err;
    }
    if (p.rank == 0) {
        st = wsync_coord_create(p.coordinator, p.nranks, p.nreceivers, p.heartbeat_ms,
                                p.timeout_ms, &s->coord);
        if (st != WSYNC_OK)
            goto err;
        free(s->m.coordinator);
        s->m.coordinator = wsync_strdup(wsync_coord_address(s->coord));
    }
    /* where same-node receivers will ask for shared memory */
    st = wsync_unix_listen(s->data_addr, sizeof(s->data_addr), &s->data_listen_fd);
    if (st != WSYNC_OK)
        goto err;
    gethostname(hostname, sizeof(hostname) - 1);
    memset(&hello, 0, sizeof(hello));
    hello.role = WSYNC_ROLE_SENDER;
    hello.rank = p.rank;
    hello.nsenders = p.nranks;
    hello.nreceivers = p.nreceivers;
    hello.pid = (uint32_t)getpid();
    hello.bucket_bytes = p.bucket_bytes;
    hello.transports = ctx->transport_mask;
    hello.hostname = hostname;
    hello.host_id = (char *)wsync_host_id();
    hello.data_addr = s->data_addr;
    hello.scheme = s->scheme_choice;
    hello.keep_versions = (uint32_t)p.keep_versions;
    st = wsync_member_connect(&s->m, &hello);
    if (st != WSYNC_OK)
        goto err;
    st = wsync_loop_listen(s->m.loop, s->data_listen_fd, WSYNC_CONN_UNIX);
    s->data_listen_fd = -1;   /* the loop owns it now, even on failure */
    if (st != WSYNC_OK)
        goto err;
    *out = s;
    return WSYNC_OK;
err:
    {
        char text[1024];
        snprintf(text, sizeof(text), "%s", wsync_last_error());
        wsync_sender_free(s);
        return wsync_err_set_text(st, text);
    }
}

void wsync_sender_free(wsync_sender_t *s)
{
    if (s == NULL)
        return;
    if (s->m.scheme != NULL && s->m.scheme_state != NULL)
        s->m.scheme->sender_teardown(s);
    wsync_member_close(&s->m);
    wsync_coord_free(s->coord);
    if (s->data_listen_fd >= 0)
        close(s->data_listen_fd);
    wsync_shard_descs_free(s->shards, s->nshards);
    free(s->shard_data);
    free(s->scheme_choice);
    free(s);
}

wsync_status_t wsync_sender_add_shard(wsync_sender_t *s, const wsync_shard_t *shard)
{
    wsync_status_t st;

    if (s == NULL || shard == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_sender_add_shard: NULL argument");
    if (s->m.state != WSYNC_STATE_CONNECTED)
        return wsync_err(WSYNC_ERR_STATE, "sender %d: shards must be added before the first push "
                         "or setup (param '%s')", s->m.rank,
                         shard->param.name ? shard->param.name : "?");
    if (shard->mem == WSYNC_MEM_CUDA) {
        const char *name = shard->param.name ? shard->param.name : "?";
        wsync_dev_ptr_t info;
        if (!wsync_dev_compiled())
            return wsync_err(WSYNC_ERR_UNSUPPORTED, "sender %d: param '%s' is in CUDA memory, but "
                             "this libwsync was built without CUDA", s->m.rank, name);
        int ndev = 0;
        if (wsync_dev_count(&ndev) != WSYNC_OK)
            return wsync_err(WSYNC_ERR_UNSUPPORTED, "sender %d: param '%s' is in CUDA memory, but "
                             "this process can use no CUDA device (%s)", s->m.rank, name,
                             wsync_last_error());
        if (shard->device < 0 || shard->device >= ndev)
            return wsync_err(WSYNC_ERR_INVALID, "sender %d: param '%s' is on CUDA device %d, but "
                             "this process sees devices 0 to %d", s->m.rank, name, shard->device,
                             ndev - 1);
        if (s->device >= 0 && shard->device != s->device)
            return wsync_err(WSYNC_ERR_UNSUPPORTED, "sender %d: param '%s' is on CUDA device %d, but "
                             "its earlier shards are on device %d: a sender uses one CUDA device "
                             "(make one sender per GPU)", s->m.rank, name, shard->device, s->device);
        if (shard->data != NULL) {   /* NULL only for an empty box, checked below */
            st = wsync_dev_ptr_info(shard->data, &info);
            if (st != WSYNC_OK)
                return st;
            if (info.kind == WSYNC_DEV_PTR_HOST || info.kind == WSYNC_DEV_PTR_HOST_PINNED)
                return wsync_err(WSYNC_ERR_INVALID, "sender %d: param '%s': data %p is host memory, "
                                 "but the shard says CUDA memory of device %d (use "
                                 "WSYNC_MEM_HOST)", s->m.rank, name, shard->data, shard->device);
            if (info.kind == WSYNC_DEV_PTR_DEVICE && info.device != shard->device)
                return wsync_err(WSYNC_ERR_INVALID, "sender %d: param '%s': data %p is memory of CUDA "
                                 "device %d, but the shard says device %d", s->m.rank, name,
                                 shard->data, info.device, shard->device);
        }
    } else if (shard->mem != WSYNC_MEM_HOST) {
        return wsync_err(WSYNC_ERR_INVALID, "sender %d: param '%s' has an unknown memory kind %d",
                         s->m.rank, shard->param.name ? shard->param.name : "?", (int)shard->mem);
    }
    if (s->nshards == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        wsync_shard_desc_t *d = realloc(s->shards, cap * sizeof(*d));
        if (d == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "no memory for shard descriptions");
        s->shards = d;
        const void **p = realloc(s->shard_data, cap * sizeof(*p));
        if (p == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "no memory for shard descriptions");
        s->shard_data = p;
        s->cap = cap;
    }
    st = wsync_shard_desc_from(shard, (uint32_t)s->m.rank, (uint32_t)s->nshards,
                               &s->shards[s->nshards]);
    if (st != WSYNC_OK)
        return st;
    for (size_t i = 0; i < s->nshards; i++) {
        if (strcmp(s->shards[i].param.name, shard->param.name) == 0 &&
            memcmp(&s->shards[i].box, &s->shards[s->nshards].box, sizeof(wsync_box_t)) == 0) {
            wsync_shard_desc_clear(&s->shards[s->nshards]);
            return wsync_err(WSYNC_ERR_INVALID, "sender %d: param '%s' added twice with the same "
                             "box", s->m.rank, shard->param.name);
        }
    }
    s->shard_data[s->nshards++] = shard->data;
    if (shard->mem == WSYNC_MEM_CUDA)
        s->device = shard->device;
    return WSYNC_OK;
}

wsync_status_t wsync_sender_setup(wsync_sender_t *s)
{
    wsync_status_t st;
    wsync_wbuf_t b;

    if (s == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_sender_setup: sender is NULL");
    st = wsync_inbox_failed(&s->m.inbox);
    if (st != WSYNC_OK || s->m.state == WSYNC_STATE_READY)
        return st;
    if (s->m.state == WSYNC_STATE_CONNECTED) {
        wsync_wbuf_init(&b);
        wsync_shards_encode(s->shards, s->nshards, &b);
        wsync_member_put_gpu(&b, s->device);
        st = wsync_member_describe(&s->m, &b);
        wsync_wbuf_free(&b);
        if (st != WSYNC_OK)
            return wsync_member_fail(&s->m, st);
    }
    st = wsync_member_await_plan(&s->m, wsync_deadline_in(s->m.timeout_ms));
    if (st != WSYNC_OK)
        return wsync_member_fail(&s->m, st);
    st = wsync_plan_check_sender(s->m.plan, (uint32_t)s->m.rank, s->shards, s->nshards);
    if (st == WSYNC_OK)
        st = s->m.scheme->sender_setup(s);
    if (st != WSYNC_OK)
        return wsync_member_fail(&s->m, st);
    s->m.state = WSYNC_STATE_READY;
    return WSYNC_OK;
}

wsync_status_t wsync_sender_push(wsync_sender_t *s, uint64_t version)
{
    const uint16_t done[] = {WSYNC_MSG_DONE};
    uint64_t t0 = wsync_now_ns();
    wsync_status_t st;
    wsync_msg_t *msg;

    if (s == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_sender_push: sender is NULL");
    if (version == 0 || version <= s->last_version)
        return wsync_err(WSYNC_ERR_INVALID, "sender %d: version %llu must be greater than the last "
                         "pushed (%llu)", s->m.rank, (unsigned long long)version,
                         (unsigned long long)s->last_version);
    st = wsync_sender_setup(s);
    if (st != WSYNC_OK)
        return st;
    memset(&s->stats, 0, sizeof(s->stats));
    if (s->m.scheme->async) {
        /* published, not delivered: the scheme returns once every sender published it */
        st = s->m.scheme->sender_push(s, version);
        if (st != WSYNC_OK)
            return wsync_member_fail(&s->m, st);
        s->last_version = version;
        s->stats.version = version;
        s->stats.seconds = (double)(wsync_now_ns() - t0) / 1e9;
        return WSYNC_OK;
    }
    st = wsync_member_send_u64(&s->m, WSYNC_MSG_PUSH_BEGIN, version);
    if (st == WSYNC_OK)
        st = s->m.scheme->sender_push(s, version);
    if (st != WSYNC_OK)
        return wsync_member_fail(&s->m, st);
    for (;;) {
        /* half as long again as a sender's wait for a receiver: waits farther from a stall end
         * later (ipc: RELEASE 1x, a receiver's next bucket 1.25x, DONE 1.5x), so that the one
         * waiting on the culprit reports it, by name, first */
        int wait_ms = (int)WSYNC_MIN((int64_t)s->m.timeout_ms * 3 / 2, INT_MAX);
        st = wsync_inbox_pop(&s->m.inbox, done, 1, wsync_deadline_in(wait_ms), &msg);
        if (st == WSYNC_ERR_TIMEOUT)
            st = wsync_err(st, "sender %d: version %llu was not committed by every receiver within "
                           "%d ms", s->m.rank, (unsigned long long)version, wait_ms);
        if (st != WSYNC_OK)
            return wsync_member_fail(&s->m, st);
        wsync_rbuf_t r;
        wsync_rbuf_init(&r, msg->payload, msg->len);
        uint64_t v = wsync_get_u64(&r);
        int bad = r.err;
        wsync_msg_free(msg);
        if (bad || v != version)
            return wsync_member_fail(&s->m, wsync_err(WSYNC_ERR_PROTOCOL, "sender %d: DONE for "
                                     "version %llu while pushing %llu", s->m.rank,
                                     (unsigned long long)v, (unsigned long long)version));
        break;
    }
    s->last_version = version;
    s->stats.version = version;
    s->stats.seconds = (double)(wsync_now_ns() - t0) / 1e9;
    return WSYNC_OK;
}

const char *wsync_sender_scheme(const wsync_sender_t *s)
{
    return s != NULL && s->m.plan != NULL ? s->m.planmsg.scheme : NULL;
}

const char *wsync_sender_explain(const wsync_sender_t *s)
{
    return s != NULL && s->m.plan != NULL ? s->m.planmsg.explain : NULL;
}

const char *wsync_sender_coordinator(const wsync_sender_t *s)
{
    return s != NULL && s->coord != NULL ? wsync_coord_address(s->coord) : NULL;
}

wsync_status_t wsync_sender_stats(const wsync_sender_t *s, wsync_push_stats_t *stats)
{
    if (s == NULL || stats == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_sender_stats: NULL argument");
    if (s->stats.version == 0)
        return wsync_err(WSYNC_ERR_STATE, "sender %d has not completed a push", s->m.rank);
    *stats = s->stats;
    return WSYNC_OK;
}
