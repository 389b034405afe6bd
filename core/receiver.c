/* The receiver: an inference rank's view. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fault.h"
#include "core/log.h"
#include "core/objects.h"
#include "core/util.h"
#include "reshard/exec.h"
#include "reshard/fp8.h"

wsync_status_t wsync_receiver_create(wsync_ctx_t *ctx, const wsync_receiver_params_t *params,
                                     wsync_receiver_t **out)
{
    wsync_receiver_params_t p;
    wsync_receiver_t *r;
    wsync_status_t st;
    wsync_hello_t hello;
    char hostname[256] = "";

    if (ctx == NULL || out == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_receiver_create: ctx and receiver must not be NULL");
    st = wsync_config_receiver(params, &p);
    if (st != WSYNC_OK)
        return st;
    r = calloc(1, sizeof(*r));
    if (r == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "no memory for a receiver");
    r->m.ctx = ctx;
    r->m.role = WSYNC_ROLE_RECEIVER;
    r->m.rank = p.rank;
    r->m.nreceivers = p.nreceivers;
    r->m.timeout_ms = p.timeout_ms;
    r->m.heartbeat_ms = p.heartbeat_ms;
    r->m.coordinator = wsync_strdup(p.coordinator);
    r->progress = p.progress;
    r->progress_arg = p.progress_arg;
    /* the number of senders is learnt from the plan; HELLO says -1 for "as the coordinator says" */
    gethostname(hostname, sizeof(hostname) - 1);
    memset(&hello, 0, sizeof(hello));
    hello.role = WSYNC_ROLE_RECEIVER;
    hello.rank = p.rank;
    hello.nsenders = -1;
    hello.nreceivers = p.nreceivers;
    hello.pid = (uint32_t)getpid();
    hello.transports = ctx->transport_mask;
    hello.hostname = hostname;
    hello.host_id = (char *)wsync_host_id();
    st = r->m.coordinator == NULL ? wsync_err(WSYNC_ERR_NOMEM, "no memory for a receiver")
                                  : wsync_member_connect(&r->m, &hello);
    if (st != WSYNC_OK) {
        char text[1024];
        snprintf(text, sizeof(text), "%s", wsync_last_error());
        wsync_receiver_free(r);
        return wsync_err_set_text(st, text);
    }
    *out = r;
    return WSYNC_OK;
}

void wsync_receiver_free(wsync_receiver_t *r)
{
    if (r == NULL)
        return;
    if (r->m.scheme != NULL && r->m.scheme_state != NULL)
        r->m.scheme->receiver_teardown(r);
    wsync_member_close(&r->m);
    for (size_t i = 0; i < r->ntargets; i++)
        if (r->land != NULL && r->land[i] != r->target_data[i])
            free(r->land[i]);
    wsync_target_descs_free(r->targets, r->ntargets);
    free(r->target_data);
    free(r->land);
    free(r->land_dtype);
    free(r->quant);
    free(r);
}

wsync_status_t wsync_receiver_add_target(wsync_receiver_t *r, const wsync_target_t *t)
{
    wsync_status_t st;

    if (r == NULL || t == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_receiver_add_target: NULL argument");
    if (r->m.state != WSYNC_STATE_CONNECTED)
        return wsync_err(WSYNC_ERR_STATE, "receiver %d: targets must be added before the first "
                         "wait (target '%s')", r->m.rank, t->name ? t->name : "?");
    if (t->mem != WSYNC_MEM_HOST)
        return wsync_err(WSYNC_ERR_UNSUPPORTED, "receiver %d: target '%s' is in CUDA memory, which "
                         "this version of wsync cannot fill yet", r->m.rank, t->name ? t->name : "?");
    if (t->data == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "receiver %d: target '%s' has no buffer (data is NULL)",
                         r->m.rank, t->name ? t->name : "?");
    if (r->ntargets == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        wsync_target_desc_t *d = realloc(r->targets, cap * sizeof(*d));
        if (d == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "no memory for target descriptions");
        r->targets = d;
        void **p = realloc(r->target_data, cap * sizeof(*p));
        if (p == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "no memory for target descriptions");
        r->target_data = p;
        p = realloc(r->land, cap * sizeof(*p));
        if (p == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "no memory for target descriptions");
        r->land = p;
        wsync_dtype_t *ld = realloc(r->land_dtype, cap * sizeof(*ld));
        if (ld == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "no memory for target descriptions");
        r->land_dtype = ld;
        wsync_quant_t *q = realloc(r->quant, cap * sizeof(*q));
        if (q == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "no memory for target descriptions");
        r->quant = q;
        r->cap = cap;
    }
    if (wsync_target_quantized(t->dtype, t->quant.scheme) && t->quant.scales == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "receiver %d: FP8 target '%s' has no scales buffer "
                         "(quant.scales is NULL)", r->m.rank, t->name ? t->name : "?");
    if (wsync_target_quantized(t->dtype, t->quant.scheme) && t->quant.scales_mem != WSYNC_MEM_HOST)
        return wsync_err(WSYNC_ERR_UNSUPPORTED, "receiver %d: FP8 target '%s' has its scales in "
                         "CUDA memory, which this version cannot fill yet", r->m.rank, t->name);
    st = wsync_target_desc_from(t, (uint32_t)r->m.rank, (uint32_t)r->ntargets,
                                &r->targets[r->ntargets]);
    if (st != WSYNC_OK)
        return st;
    for (size_t i = 0; i < r->ntargets; i++) {
        if (strcmp(r->targets[i].name, t->name) == 0) {
            wsync_target_desc_clear(&r->targets[r->ntargets]);
            return wsync_err(WSYNC_ERR_INVALID, "receiver %d: target '%s' added twice", r->m.rank,
                             t->name);
        }
    }
    {
        size_t i = r->ntargets;
        r->target_data[i] = t->data;
        r->land[i] = t->data;
        r->land_dtype[i] = t->dtype;
        r->quant[i] = t->quant;
        if (wsync_target_quantized(t->dtype, t->quant.scheme)) {
            /* whole-group scales need every value first: land f32 here, quantize at commit */
            uint64_t n = 1;
            for (int d = 0; d < t->ndim; d++)
                n *= (uint64_t)t->shape[d];
            r->land[i] = calloc(n ? n : 1, sizeof(float));
            r->land_dtype[i] = WSYNC_DTYPE_F32;
            if (r->land[i] == NULL) {
                wsync_target_desc_clear(&r->targets[i]);
                return wsync_err(WSYNC_ERR_NOMEM, "receiver %d: no memory to stage FP8 target "
                                 "'%s' (%llu values)", r->m.rank, t->name, (unsigned long long)n);
            }
        }
        r->ntargets++;
    }
    return WSYNC_OK;
}

/* Describe, wait for the plan and set the scheme up; resumable across calls. */
static wsync_status_t receiver_setup(wsync_receiver_t *r, int64_t plan_deadline)
{
    wsync_status_t st;

    if (r->m.state == WSYNC_STATE_CONNECTED) {
        wsync_wbuf_t b;
        wsync_wbuf_init(&b);
        wsync_targets_encode(r->targets, r->ntargets, &b);
        st = wsync_member_describe(&r->m, &b);
        wsync_wbuf_free(&b);
        if (st != WSYNC_OK)
            return wsync_member_fail(&r->m, st);
    }
    st = wsync_member_await_plan(&r->m, plan_deadline);
    if (st == WSYNC_ERR_TIMEOUT)
        return st;                      /* not a failure: the others may not be there yet */
    if (st != WSYNC_OK)
        return st;
    st = wsync_plan_check_receiver(r->m.plan, (uint32_t)r->m.rank, r->targets, r->ntargets);
    if (st != WSYNC_OK)
        return wsync_member_fail(&r->m, st);
    for (size_t i = 0; i < r->ntargets; i++) {
        wsync_target_desc_t landing = r->targets[i];
        landing.dtype = r->land_dtype[i];
        wsync_exec_zero_uncovered(&landing, r->land[i]);
    }
    st = r->m.scheme->receiver_setup(r);
    if (st != WSYNC_OK)
        return wsync_member_fail(&r->m, st);
    r->m.state = WSYNC_STATE_READY;
    return WSYNC_OK;
}

/* Quantize every staged FP8 target into its buffer and scales, once all its values landed. */
static wsync_status_t quantize_staged(wsync_receiver_t *r)
{
    for (size_t i = 0; i < r->ntargets; i++) {
        const wsync_target_desc_t *t = &r->targets[i];
        uint64_t rows = 1, cols = t->ndim > 0 ? (uint64_t)t->shape[t->ndim - 1] : 1;
        wsync_status_t st;
        if (r->land[i] == r->target_data[i])
            continue;
        for (int d = 0; d < t->ndim - 1; d++)
            rows *= (uint64_t)t->shape[d];
        st = wsync_quantize_f32(t->name, r->land[i], rows, cols, cols, &r->quant[i], t->dtype,
                                r->target_data[i], cols, r->quant[i].scales);
        if (st != WSYNC_OK)
            return st;
    }
    return WSYNC_OK;
}

/* The group is usable and this receiver set up (resumable across calls). */
static wsync_status_t receiver_ready(wsync_receiver_t *r, int64_t deadline, int timeout_ms)
{
    wsync_status_t st = wsync_inbox_failed(&r->m.inbox);

    if (st != WSYNC_OK || r->m.state == WSYNC_STATE_READY)
        return st;
    st = receiver_setup(r, deadline);
    if (st == WSYNC_ERR_TIMEOUT)
        return wsync_err(st, "receiver %d: no version within %d ms (the group is still being set "
                         "up)", r->m.rank, timeout_ms);
    return st;
}

/* The commit fault point: a version landed whole, not yet committed. */
static wsync_status_t commit_point(wsync_receiver_t *r, uint64_t v)
{
    if (WSYNC_FAULT(WSYNC_FAULT_COMMIT) == WSYNC_FAULT_FAIL) {
        char where[96];
        snprintf(where, sizeof(where), "receiver %d committing version %llu", r->m.rank,
                 (unsigned long long)v);
        return wsync_fault_err(WSYNC_FAULT_COMMIT, where);
    }
    return WSYNC_OK;
}

/* Async schemes: land a version the receiver asks for. */
static wsync_status_t receiver_fetch(wsync_receiver_t *r, uint64_t want, int timeout_ms,
                                     uint64_t *got)
{
    uint64_t v = 0;
    wsync_status_t st;

    /* the scheme sets torn once it writes into the targets */
    st = r->m.scheme->receiver_fetch(r, want, timeout_ms, &v);
    if (st == WSYNC_ERR_TIMEOUT || st == WSYNC_ERR_NOT_FOUND)
        return st;     /* nothing was written: the scheme writes only once it has a directory */
    if (st == WSYNC_OK) {
        r->torn = 1;
        st = quantize_staged(r);
    }
    if (st == WSYNC_OK)
        st = commit_point(r, v);
    if (st == WSYNC_ERR_INTEGRITY)
        return st;     /* this reader's copy is bad, not the store: it may fetch again */
    if (st != WSYNC_OK)
        return wsync_member_fail(&r->m, st);
    r->torn = 0;
    r->version = v;
    *got = v;
    return WSYNC_OK;
}

wsync_status_t wsync_receiver_wait(wsync_receiver_t *r, int timeout_ms, uint64_t *version)
{
    const uint16_t begin[] = {WSYNC_MSG_BEGIN};
    int64_t deadline;
    wsync_status_t st;
    wsync_msg_t *msg;
    uint64_t v;

    if (r == NULL || version == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_receiver_wait: NULL argument");
    if (timeout_ms < 0)
        timeout_ms = r->m.timeout_ms;
    deadline = wsync_deadline_in(timeout_ms);
    st = receiver_ready(r, deadline, timeout_ms);
    if (st != WSYNC_OK)
        return st;
    if (r->m.scheme->async)
        return receiver_fetch(r, 0, wsync_ms_left(deadline), version);
    st = wsync_inbox_pop(&r->m.inbox, begin, 1, deadline, &msg);
    if (st == WSYNC_ERR_TIMEOUT)
        return wsync_err(st, "receiver %d: no new version within %d ms (last committed: %llu)",
                         r->m.rank, timeout_ms, (unsigned long long)r->version);
    if (st != WSYNC_OK)
        return st;
    {
        wsync_rbuf_t rb;
        wsync_rbuf_init(&rb, msg->payload, msg->len);
        v = wsync_get_u64(&rb);
        st = rb.err || v <= r->version
                 ? wsync_err(WSYNC_ERR_PROTOCOL, "receiver %d: BEGIN of version %llu after version "
                             "%llu", r->m.rank, (unsigned long long)v,
                             (unsigned long long)r->version)
                 : WSYNC_OK;
        wsync_msg_free(msg);
        if (st != WSYNC_OK)
            return wsync_member_fail(&r->m, st);
    }
    /* the scheme sets torn once it writes into the targets */
    st = r->m.scheme->receiver_recv(r, v);
    if (st == WSYNC_OK) {
        r->torn = 1;
        st = quantize_staged(r);
    }
    if (st == WSYNC_OK)
        st = commit_point(r, v);
    if (st != WSYNC_OK)
        return wsync_member_fail(&r->m, st);
    r->torn = 0;
    r->version = v;
    st = wsync_member_send_u64(&r->m, WSYNC_MSG_COMMIT, v);
    if (st != WSYNC_OK)
        return wsync_member_fail(&r->m, st);
    *version = v;
    return WSYNC_OK;
}

wsync_status_t wsync_receiver_fetch(wsync_receiver_t *r, uint64_t version, int timeout_ms,
                                    uint64_t *got)
{
    int64_t deadline;
    wsync_status_t st;

    if (r == NULL || got == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_receiver_fetch: NULL argument");
    if (timeout_ms < 0)
        timeout_ms = r->m.timeout_ms;
    deadline = wsync_deadline_in(timeout_ms);
    st = receiver_ready(r, deadline, timeout_ms);
    if (st != WSYNC_OK)
        return st;
    if (!r->m.scheme->async)
        return wsync_err(WSYNC_ERR_UNSUPPORTED, "receiver %d: scheme '%s' delivers every version as "
                         "it is pushed; fetching a chosen version needs the store scheme",
                         r->m.rank, r->m.scheme->name);
    return receiver_fetch(r, version, wsync_ms_left(deadline), got);
}

wsync_status_t wsync_receiver_set_target_data(wsync_receiver_t *r, const char *name, void *data,
                                              float *scales)
{
    if (r == NULL || name == NULL || data == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_receiver_set_target_data: NULL argument");
    for (size_t i = 0; i < r->ntargets; i++) {
        if (strcmp(r->targets[i].name, name) != 0)
            continue;
        int direct = r->land[i] == r->target_data[i];   /* else: staged FP8, quantized at commit */
        if (direct) {
            r->land[i] = data;
            /* a fresh buffer holds garbage where no piece lands (vocab padding): zero it */
            if (r->m.state == WSYNC_STATE_READY)
                wsync_exec_zero_uncovered(&r->targets[i], data);
        }
        r->target_data[i] = data;
        if (scales != NULL)
            r->quant[i].scales = scales;
        return WSYNC_OK;
    }
    return wsync_err(WSYNC_ERR_NOT_FOUND, "receiver %d has no target '%s'", r->m.rank, name);
}

uint64_t wsync_receiver_version(const wsync_receiver_t *r)
{
    return r != NULL ? r->version : 0;
}

int wsync_receiver_torn(const wsync_receiver_t *r)
{
    return r != NULL ? r->torn : 0;
}

const char *wsync_receiver_scheme(const wsync_receiver_t *r)
{
    return r != NULL && r->m.plan != NULL ? r->m.planmsg.scheme : NULL;
}
