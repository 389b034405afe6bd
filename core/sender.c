/* The sender: a trainer rank's view. Rank 0 also hosts the coordinator. */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/delta_state.h"
#include "core/doorbell.h"
#include "core/log.h"
#include "core/objects.h"
#include "core/sock.h"
#include "core/status.h"
#include "core/util.h"
#include "kernels/device.h"

/* ---- the private copy (copy_shards) ------------------------------------------------------- */

#define COPY_ALIGN 256   /* where each shard starts in a copy block: any kernel's vector loads */

static uint64_t desc_bytes(const wsync_shard_desc_t *d)
{
    uint64_t bytes = wsync_dtype_size(d->param.dtype);
    for (int k = 0; k < d->param.ndim; k++)
        bytes *= (uint64_t)d->box.len[k];
    return bytes;
}

/* Offsets of every shard in its kind's block (off[i]; empty shards take no room), and the two
 * blocks' sizes. */
static void copy_layout(const wsync_sender_t *s, size_t *off, size_t *host, size_t *dev)
{
    *host = *dev = 0;
    for (size_t i = 0; i < s->nshards; i++) {
        uint64_t b = desc_bytes(&s->shards[i]);
        size_t *end = s->shards[i].mem == WSYNC_MEM_CUDA ? dev : host;
        off[i] = 0;
        if (b == 0)
            continue;
        *end = (*end + COPY_ALIGN - 1) / COPY_ALIGN * COPY_ALIGN;
        off[i] = *end;
        *end += (size_t)b;
    }
}

static void copy_free(wsync_sender_t *s)
{
    if (s->copy_dev != NULL || s->copy_stream != NULL) {
        int saved = -1;
        if (wsync_dev_enter(s->device, &saved) == WSYNC_OK) {
            wsync_dev_stream_destroy(s->copy_stream);
            wsync_dev_free(s->copy_dev);
            wsync_dev_leave(s->device, saved);
        }
    }
    if (s->copy_host != NULL)
        wsync_mem_free(s->m.ctx, s->copy_host);
    if (s->user_data != NULL)   /* the caller's pointers back, for anything that looks after */
        memcpy(s->shard_data, s->user_data, s->nshards * sizeof(*s->shard_data));
    free(s->user_data);
    s->copy_host = s->copy_dev = s->copy_stream = NULL;
    s->user_data = NULL;
}

/* Allocate the copy and point shard_data at it, once, before the scheme is set up (it exports or
 * registers whatever shard_data points at). */
static wsync_status_t copy_alloc(wsync_sender_t *s)
{
    size_t host, dev, *off;
    wsync_status_t st = WSYNC_OK;

    if (!s->copy_shards || s->user_data != NULL)
        return WSYNC_OK;
    off = calloc(s->nshards + 1, sizeof(*off));
    s->user_data = calloc(s->nshards + 1, sizeof(*s->user_data));
    if (off == NULL || s->user_data == NULL) {
        free(off);
        free(s->user_data);
        s->user_data = NULL;
        return wsync_err(WSYNC_ERR_NOMEM, "sender %d: no memory for the copy's layout", s->m.rank);
    }
    copy_layout(s, off, &host, &dev);
    if (host > 0 && wsync_mem_alloc(s->m.ctx, host, &s->copy_host) != WSYNC_OK)
        st = wsync_err(WSYNC_ERR_NOMEM, "sender %d: copy_shards: no memory for a copy of the "
                       "host shards (%zu bytes): %s", s->m.rank, host, wsync_last_error());
    if (st == WSYNC_OK && dev > 0) {
        int saved = -1;
        st = wsync_dev_enter(s->device, &saved);
        if (st == WSYNC_OK) {
            st = wsync_dev_malloc(dev, &s->copy_dev);
            if (st == WSYNC_OK)
                st = wsync_dev_stream_create(&s->copy_stream);
            wsync_dev_leave(s->device, saved);
        }
        if (st != WSYNC_OK)
            st = wsync_err(st, "sender %d: copy_shards: a copy of the CUDA shards (%zu bytes on "
                           "device %d): %s", s->m.rank, dev, s->device, wsync_last_error());
    }
    if (st != WSYNC_OK) {
        free(off);
        free(s->user_data);   /* shard_data still holds the caller's pointers */
        s->user_data = NULL;
        copy_free(s);
        return st;
    }
    for (size_t i = 0; i < s->nshards; i++) {
        s->user_data[i] = s->shard_data[i];
        if (desc_bytes(&s->shards[i]) > 0)
            s->shard_data[i] = (const uint8_t *)(s->shards[i].mem == WSYNC_MEM_CUDA
                                                     ? s->copy_dev : s->copy_host) + off[i];
    }
    free(off);
    WSYNC_LOG_I("sender %d: copy_shards: a private copy of %zu host and %zu device bytes",
                s->m.rank, host, dev);
    return WSYNC_OK;
}

/* The caller's shards into the copy, complete on return (device copies waited for). */
static wsync_status_t copy_take(wsync_sender_t *s, uint64_t version)
{
    wsync_status_t st = WSYNC_OK;

    for (size_t i = 0; i < s->nshards; i++)
        if (s->shards[i].mem == WSYNC_MEM_HOST && s->shard_data[i] != s->user_data[i])
            memcpy((void *)s->shard_data[i], s->user_data[i], desc_bytes(&s->shards[i]));
    if (s->copy_dev == NULL)
        return WSYNC_OK;
    int saved = -1;
    if ((st = wsync_dev_enter(s->device, &saved)) != WSYNC_OK)
        return st;
    for (size_t i = 0; i < s->nshards && st == WSYNC_OK; i++)
        if (s->shards[i].mem == WSYNC_MEM_CUDA && s->shard_data[i] != s->user_data[i])
            st = wsync_dev_memcpy_async((void *)s->shard_data[i], s->user_data[i],
                                        desc_bytes(&s->shards[i]), s->copy_stream);
    if (st == WSYNC_OK) {
        char what[96];
        snprintf(what, sizeof(what), "sender %d: the copy of the CUDA shards for version %llu",
                 s->m.rank, (unsigned long long)version);
        st = wsync_dev_stream_sync(s->copy_stream, wsync_deadline_in(s->m.timeout_ms), what);
    }
    wsync_dev_leave(s->device, saved);
    return st;
}

/* Whether a push is in flight (begun, not reaped); if so, WSYNC_ERR_STATE naming `call`. */
static wsync_status_t job_idle(wsync_sender_t *s, const char *call)
{
    pthread_mutex_lock(&s->job_mu);
    int state = s->job_state;
    uint64_t v = s->job_version;
    pthread_mutex_unlock(&s->job_mu);
    if (state == WSYNC_JOB_IDLE)
        return WSYNC_OK;
    return wsync_err(WSYNC_ERR_STATE, "sender %d: %s while the push of version %llu is in flight "
                     "(begun and not yet reaped by wsync_sender_push_wait)", s->m.rank, call,
                     (unsigned long long)v);
}

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
    {
        /* push_wait's deadlines are on the monotonic clock, as every wait's */
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&s->job_cv, &ca);
        pthread_condattr_destroy(&ca);
        pthread_mutex_init(&s->job_mu, NULL);
    }
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
    s->copy_shards = p.copy_shards;
    s->delta_choice = (uint32_t)wsync_delta_mode_parse(p.delta);   /* config checked it */
    s->delta_baseline_host = strcmp(p.delta_baseline, "host") == 0;
    s->delta_cutoff = p.delta_cutoff;
    s->data_listen_fd = -1;
    s->device = -1;
    if (s->m.coordinator == NULL || s->scheme_choice == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "no memory for a sender");
        goto err;
    }
    if (p.rank == 0) {
        st = wsync_coord_create(p.coordinator, p.nranks, p.nreceivers, p.heartbeat_ms,
                                p.timeout_ms, p.fp8_wire, &s->coord);
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
    /* a sender that asked for one scheme probes, and reports, only the transports it can use */
    hello.transports = wsync_ctx_probe(ctx, wsync_scheme_transports(s->scheme_choice));
    hello.hostname = hostname;
    hello.host_id = (char *)wsync_host_id();
    hello.data_addr = s->data_addr;
    hello.scheme = s->scheme_choice;
    hello.keep_versions = (uint32_t)p.keep_versions;
    hello.delta = s->delta_choice;
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
    pthread_mutex_lock(&s->job_mu);
    int state = s->job_state;
    pthread_mutex_unlock(&s->job_mu);
    if (state != WSYNC_JOB_IDLE) {
        /* every wait of the push watches the inbox: failing it ends the push soon */
        if (state == WSYNC_JOB_RUNNING) {
            char text[160];
            snprintf(text, sizeof(text), "sender %d was freed during the push of version %llu",
                     s->m.rank, (unsigned long long)s->job_version);
            WSYNC_LOG_W("%s: the push is aborted", text);
            wsync_inbox_fail(&s->m.inbox, WSYNC_ERR_ABORTED, text);
        }
        pthread_join(s->job_thread, NULL);
    }
    if (s->m.scheme != NULL && s->m.scheme_state != NULL)
        s->m.scheme->sender_teardown(s);
    wsync_delta_tx_free(s->delta_tx);   /* a scheme made it; the sender owns it */
    s->delta_tx = NULL;
    wsync_member_close(&s->m);
    wsync_coord_free(s->coord);
    if (s->data_listen_fd >= 0)
        close(s->data_listen_fd);
    copy_free(s);
    wsync_shard_descs_free(s->shards, s->nshards);
    free(s->shard_data);
    free(s->scheme_choice);
    pthread_cond_destroy(&s->job_cv);
    pthread_mutex_destroy(&s->job_mu);
    free(s);
}

wsync_status_t wsync_sender_add_shard(wsync_sender_t *s, const wsync_shard_t *shard)
{
    wsync_status_t st;

    if (s == NULL || shard == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_sender_add_shard: NULL argument");
    if ((st = job_idle(s, "wsync_sender_add_shard")) != WSYNC_OK)
        return st;
    if (s->m.state != WSYNC_STATE_CONNECTED || s->user_data != NULL)
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

/* wsync_sender_setup's work, on whichever thread runs the push. */
static wsync_status_t sender_setup(wsync_sender_t *s)
{
    wsync_status_t st;
    wsync_wbuf_t b;

    st = wsync_inbox_failed(&s->m.inbox);
    if (st != WSYNC_OK || s->m.state == WSYNC_STATE_READY)
        return st;
    if (s->m.state == WSYNC_STATE_CONNECTED) {
        if ((st = copy_alloc(s)) != WSYNC_OK)
            return wsync_member_fail(&s->m, st);
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

wsync_status_t wsync_sender_setup(wsync_sender_t *s)
{
    wsync_status_t st;

    if (s == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_sender_setup: sender is NULL");
    if ((st = job_idle(s, "wsync_sender_setup")) != WSYNC_OK)
        return st;
    return sender_setup(s);
}

/* The push of `version`, on wsync's thread (push_thread): what wsync_sender_push did before the
 * asynchronous push, less the checks push_begin made. t0: when push_begin was called. */
static wsync_status_t push_run_body(wsync_sender_t *s, uint64_t version, uint64_t t0);

/* The baselines follow the push's outcome: the next version is encoded against this one only
 * when every receiver committed it (store: every sender published it). */
static wsync_status_t push_run(wsync_sender_t *s, uint64_t version, uint64_t t0)
{
    wsync_status_t st = push_run_body(s, version, t0);
    if (s->delta_tx != NULL)
        wsync_delta_tx_end(s->delta_tx, version, st == WSYNC_OK);
    return st;
}

static wsync_status_t push_run_body(wsync_sender_t *s, uint64_t version, uint64_t t0)
{
    const uint16_t done[] = {WSYNC_MSG_DONE};
    wsync_status_t st;
    wsync_msg_t *msg;

    st = sender_setup(s);
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
    /* on the coordinator's host, BEGIN and DONE are doorbells in shared memory (doorbell.h) */
    if (s->m.bells_on)
        st = wsync_member_bell_begin(&s->m, version);
    else
        st = wsync_member_send_u64(&s->m, WSYNC_MSG_PUSH_BEGIN, version);
    if (st == WSYNC_OK)
        st = s->m.scheme->sender_push(s, version);
    if (st != WSYNC_OK)
        return wsync_member_fail(&s->m, st);
    /* half as long again as a sender's wait for a receiver: waits farther from a stall end
     * later (ipc: RELEASE 1x, a receiver's next bucket 1.25x, DONE 1.5x), so that the one
     * waiting on the culprit reports it, by name, first */
    int wait_ms = (int)WSYNC_MIN((int64_t)s->m.timeout_ms * 3 / 2, INT_MAX);
    if (s->m.bells_on) {
        st = wsync_member_bell_done(&s->m, wsync_deadline_in(wait_ms));
        if (st == WSYNC_ERR_TIMEOUT)
            st = wsync_err(st, "sender %d: version %llu was not committed by every receiver "
                           "within %d ms", s->m.rank, (unsigned long long)version, wait_ms);
        if (st != WSYNC_OK)
            return wsync_member_fail(&s->m, st);
        s->last_version = version;
        s->stats.version = version;
        s->stats.seconds = (double)(wsync_now_ns() - t0) / 1e9;
        return WSYNC_OK;
    }
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
    s->last_version = version;
    s->stats.version = version;
    s->stats.seconds = (double)(wsync_now_ns() - t0) / 1e9;
    return WSYNC_OK;
}

static void *push_thread(void *arg)
{
    wsync_sender_t *s = arg;
    wsync_status_t st;

    /* A new thread's current device is 0: make it the sender's, so that the schemes' enter/leave
     * pairs never switch back to a device this process does not use (cudaSetDevice creates
     * that device's context). A failure here shows in the push's own device calls. */
    if (s->device >= 0 && wsync_dev_set(s->device) != WSYNC_OK)
        WSYNC_LOG_W("sender %d: push thread: %s", s->m.rank, wsync_last_error());
    st = push_run(s, s->job_version, s->job_t0);

    pthread_mutex_lock(&s->job_mu);
    s->job_status = st;
    /* the error text is this thread's: push_wait hands it to the caller's */
    snprintf(s->job_text, sizeof(s->job_text), "%s", st != WSYNC_OK ? wsync_last_error() : "");
    s->job_state = WSYNC_JOB_FINISHED;
    pthread_cond_broadcast(&s->job_cv);
    pthread_mutex_unlock(&s->job_mu);
    return NULL;
}

/* What a push checks and takes before it runs, on the caller's thread: no push in flight, a
 * version above the last, a group not failed, and with copy_shards the shards' copy (the trainer
 * may write its shards once push_begin returns). */
static wsync_status_t push_prepare(wsync_sender_t *s, uint64_t version)
{
    wsync_status_t st;

    pthread_mutex_lock(&s->job_mu);
    int state = s->job_state;
    uint64_t inflight = s->job_version;
    pthread_mutex_unlock(&s->job_mu);
    if (state != WSYNC_JOB_IDLE)
        return wsync_err(WSYNC_ERR_STATE, "sender %d: cannot begin version %llu: the push of "
                         "version %llu is %s (wsync_sender_push_wait reaps it)", s->m.rank,
                         (unsigned long long)version, (unsigned long long)inflight,
                         state == WSYNC_JOB_RUNNING ? "in flight" : "over but not yet reaped");
    if (version == 0 || version <= s->last_version)
        return wsync_err(WSYNC_ERR_INVALID, "sender %d: version %llu must be greater than the last "
                         "pushed (%llu)", s->m.rank, (unsigned long long)version,
                         (unsigned long long)s->last_version);
    if ((st = wsync_inbox_failed(&s->m.inbox)) != WSYNC_OK)
        return st;
    if (s->copy_shards) {
        st = copy_alloc(s);
        if (st == WSYNC_OK)
            st = copy_take(s, version);
        if (st != WSYNC_OK)
            return wsync_member_fail(&s->m, st);
    }
    return WSYNC_OK;
}

wsync_status_t wsync_sender_push_begin(wsync_sender_t *s, uint64_t version)
{
    uint64_t t0 = wsync_now_ns();
    wsync_status_t st;

    if (s == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_sender_push_begin: sender is NULL");
    if ((st = push_prepare(s, version)) != WSYNC_OK)
        return st;
    pthread_mutex_lock(&s->job_mu);
    s->job_version = version;
    s->job_t0 = t0;
    s->job_status = WSYNC_OK;
    s->job_text[0] = '\0';
    s->job_state = WSYNC_JOB_RUNNING;
    int rc = pthread_create(&s->job_thread, NULL, push_thread, s);
    if (rc != 0)
        s->job_state = WSYNC_JOB_IDLE;
    pthread_mutex_unlock(&s->job_mu);
    if (rc != 0)
        return wsync_member_fail(&s->m, wsync_err(WSYNC_ERR_NOMEM, "sender %d: no thread for the "
                                 "push of version %llu: %s", s->m.rank,
                                 (unsigned long long)version, strerror(rc)));
    return WSYNC_OK;
}

wsync_status_t wsync_sender_push_wait(wsync_sender_t *s, int timeout_ms, uint64_t *version)
{
    int64_t deadline = wsync_deadline_in(timeout_ms);
    wsync_status_t st;
    uint64_t v;

    if (s == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_sender_push_wait: sender is NULL");
    pthread_mutex_lock(&s->job_mu);
    if (s->job_state == WSYNC_JOB_IDLE) {
        pthread_mutex_unlock(&s->job_mu);
        return wsync_err(WSYNC_ERR_STATE, "sender %d: no push in flight (begin one with "
                         "wsync_sender_push_begin)", s->m.rank);
    }
    while (s->job_state == WSYNC_JOB_RUNNING) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&s->job_cv, &s->job_mu);
            continue;
        }
        int64_t left = deadline - wsync_now_ms();
        if (left <= 0)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += left / 1000;
        ts.tv_nsec += (left % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->job_cv, &s->job_mu, &ts);
    }
    v = s->job_version;
    if (s->job_state == WSYNC_JOB_RUNNING) {
        pthread_mutex_unlock(&s->job_mu);
        return wsync_err(WSYNC_ERR_TIMEOUT, "sender %d: the push of version %llu is still in "
                         "flight after %d ms (it goes on; wait again)", s->m.rank,
                         (unsigned long long)v, timeout_ms);
    }
    /* reaped here, once: a second waiter finds no push in flight */
    s->job_state = WSYNC_JOB_IDLE;
    pthread_mutex_unlock(&s->job_mu);
    pthread_join(s->job_thread, NULL);
    st = s->job_status;
    if (st != WSYNC_OK)
        return wsync_err_set_text(st, s->job_text);
    if (version != NULL)
        *version = v;
    return WSYNC_OK;
}

wsync_status_t wsync_sender_push_test(wsync_sender_t *s, int *done)
{
    if (s == NULL || done == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_sender_push_test: NULL argument");
    pthread_mutex_lock(&s->job_mu);
    int state = s->job_state;
    pthread_mutex_unlock(&s->job_mu);
    if (state == WSYNC_JOB_IDLE)
        return wsync_err(WSYNC_ERR_STATE, "sender %d: no push in flight (begin one with "
                         "wsync_sender_push_begin)", s->m.rank);
    *done = state == WSYNC_JOB_FINISHED;
    return WSYNC_OK;
}

/* push_begin then push_wait, less the thread: the caller waits anyway, so the push runs on its
 * thread (the schemes enter the sender's device and leave the caller's as they found it). A
 * thread per version cost each sender its creation, a new thread's first scheduling (behind busy
 * cores' tasks, or an idle core's wakeup), cudaSetDevice and the caller's wakeup; the slowest
 * sender's set the version's time. ipc, tiny shape, host memory, 2-core VM, medians of 8
 * alternating runs: FSDP-1 -> TP-1 0.293 -> 0.196 ms, FSDP-4 -> TP-4 0.879 -> 0.654 ms. */
wsync_status_t wsync_sender_push(wsync_sender_t *s, uint64_t version)
{
    uint64_t t0 = wsync_now_ns();
    wsync_status_t st;

    if (s == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_sender_push: sender is NULL");
    if ((st = push_prepare(s, version)) != WSYNC_OK)
        return st;
    return push_run(s, version, t0);
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
    wsync_status_t st = job_idle((wsync_sender_t *)s, "wsync_sender_stats");
    if (st != WSYNC_OK)
        return st;
    if (s->stats.version == 0)
        return wsync_err(WSYNC_ERR_STATE, "sender %d has not completed a push", s->m.rank);
    *stats = s->stats;
    return WSYNC_OK;
}
