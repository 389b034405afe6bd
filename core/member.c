/* What senders and receivers share: the progress loop, the control connection to the
 * coordinator, HELLO/WELCOME, DESCRIBE and the PLAN. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/doorbell.h"
#include "core/log.h"
#include "core/objects.h"
#include "core/relay.h"
#include "core/sock.h"
#include "core/util.h"
#include "kernels/device.h"

const char *wsync_member_who(const wsync_member_t *m, char *buf, size_t len)
{
    snprintf(buf, len, "%s %d", m->role == WSYNC_ROLE_SENDER ? "sender" : "receiver", m->rank);
    return buf;
}

static void member_on_msg(void *user, wsync_conn_t *c, wsync_msg_t *msg)
{
    wsync_member_t *m = user;
    wsync_status_t st;
    char text[1024];

    switch (msg->type) {
    case WSYNC_MSG_ABORT:
    case WSYNC_MSG_PEER_LOST:
        if (wsync_status_msg_decode(msg->payload, msg->len, &st, text, sizeof(text)) != WSYNC_OK)
            snprintf(text, sizeof(text), "%s sent a malformed %s", c->name, wsync_msg_name(msg->type));
        /* someone else's deadline: to us the group was aborted (TIMEOUT from a wait means that
         * nothing happened yet, and a dead group must not keep saying so) */
        wsync_inbox_fail(&m->inbox, st == WSYNC_ERR_TIMEOUT ? WSYNC_ERR_ABORTED : st, text);
        wsync_bells_kick(atomic_load(&m->bells));   /* a doorbell wait sees the failure now */
        wsync_msg_free(msg);
        return;
    case WSYNC_MSG_BYE:
        wsync_msg_free(msg);
        return;
    default:
        wsync_inbox_push(&m->inbox, msg);
    }
}

static void member_on_close(void *user, wsync_conn_t *c, wsync_status_t why, const char *text)
{
    wsync_member_t *m = user;
    char msg[600];

    if (why == WSYNC_OK)
        return;
    if (c == m->ctrl) {
        snprintf(msg, sizeof(msg), "lost the coordinator: %s", text);
        wsync_inbox_fail(&m->inbox, why == WSYNC_ERR_PROTOCOL ? why : WSYNC_ERR_PEER_LOST, msg);
        wsync_bells_kick(atomic_load(&m->bells));
    } else {
        /* a data peer: only we can see it go, so tell the coordinator before anyone acts on it */
        wsync_status_t st = why == WSYNC_ERR_TIMEOUT ? WSYNC_ERR_PEER_LOST : why;
        wsync_wbuf_t b;
        wsync_wbuf_init(&b);
        wsync_status_msg_encode(st, text, &b);
        if (m->ctrl != NULL)
            wsync_conn_send(m->ctrl, WSYNC_MSG_ERROR, b.data, (uint32_t)b.len, NULL, 0, 1000);
        wsync_wbuf_free(&b);
        wsync_inbox_fail(&m->inbox, st, text);
        wsync_bells_kick(atomic_load(&m->bells));
    }
}

/* WELCOME may offer the coordinator's doorbell page (core/doorbell.h): u32 pid, i32 fd, u64
 * bytes, u32 senders, u32 receivers. Map it and mark this member's line attached; anything that
 * fails leaves this member on the sockets (the coordinator then keeps the group on them). */
static void member_take_bells(wsync_member_t *m, const wsync_msg_t *msg)
{
    wsync_rbuf_t r;
    wsync_bells_t *b = NULL;

    if (msg->len == 0 || !wsync_bells_wanted())
        return;
    wsync_rbuf_init(&r, msg->payload, msg->len);
    uint32_t pid = wsync_get_u32(&r);
    int32_t fd = (int32_t)wsync_get_u32(&r);
    uint64_t bytes = wsync_get_u64(&r);
    uint32_t ns = wsync_get_u32(&r), nr = wsync_get_u32(&r);
    uint32_t rank = (uint32_t)m->rank;
    int sender = m->role == WSYNC_ROLE_SENDER;
    if (r.err || rank >= (sender ? ns : nr)) {
        WSYNC_LOG_W("%s: a malformed doorbell offer in WELCOME; using the sockets",
                    sender ? "sender" : "receiver");
        return;
    }
    if (wsync_bells_attach(pid, fd, bytes, ns, nr, &b) != WSYNC_OK) {
        WSYNC_LOG_I("%s %u: no doorbells (%s); using the sockets", sender ? "sender" : "receiver",
                    rank, wsync_last_error());
        return;
    }
    atomic_store(&wsync_bells_line(b, sender, rank)->attached, 1);
    atomic_store(&m->bells, b);
}

wsync_status_t wsync_member_connect(wsync_member_t *m, const wsync_hello_t *hello)
{
    static const wsync_loop_ops_t ops = {member_on_msg, NULL, member_on_close, NULL};
    int64_t deadline = wsync_deadline_in(m->timeout_ms);
    wsync_status_t st;
    wsync_wbuf_t b;
    wsync_msg_t *msg;
    char name[160];
    int fd;
    const uint16_t welcome[] = {WSYNC_MSG_WELCOME};

    wsync_inbox_init(&m->inbox);
    st = wsync_loop_create(&ops, m, m->heartbeat_ms,
                           wsync_peer_timeout_ms(m->timeout_ms, m->heartbeat_ms), &m->loop);
    if (st != WSYNC_OK)
        return st;
    st = wsync_tcp_connect(m->coordinator, deadline, &fd);
    if (st != WSYNC_OK)
        return st;
    snprintf(name, sizeof(name), "the coordinator at %s", m->coordinator);
    /* ctrl must be known before the loop can report on it: start the thread after adding */
    st = wsync_loop_add(m->loop, fd, WSYNC_CONN_HEARTBEAT, name, NULL, &m->ctrl);
    if (st != WSYNC_OK)
        return st;
    st = wsync_loop_start(m->loop);
    if (st != WSYNC_OK)
        return st;
    wsync_wbuf_init(&b);
    wsync_hello_encode(hello, &b);
    st = b.err ? wsync_err(WSYNC_ERR_NOMEM, "no memory for HELLO")
               : wsync_conn_send(m->ctrl, WSYNC_MSG_HELLO, b.data, (uint32_t)b.len, NULL, 0,
                                 m->timeout_ms);
    wsync_wbuf_free(&b);
    if (st != WSYNC_OK)
        return st;
    st = wsync_inbox_pop(&m->inbox, welcome, 1, deadline, &msg);
    if (st == WSYNC_ERR_TIMEOUT)
        return wsync_err(st, "the coordinator at %s did not answer HELLO within %d ms",
                         m->coordinator, m->timeout_ms);
    if (st != WSYNC_OK)
        return st;
    member_take_bells(m, msg);
    wsync_msg_free(msg);
    WSYNC_LOG_I("%s joined the group at %s", wsync_member_who(m, name, sizeof(name)),
                m->coordinator);
    return WSYNC_OK;
}

void wsync_member_put_gpu(wsync_wbuf_t *desc, int device)
{
    uint8_t uuid[WSYNC_DEV_UUID_BYTES];
    int known = device >= 0 && wsync_dev_uuid(device, uuid) == WSYNC_OK;

    wsync_put_u32(desc, (uint32_t)known);
    if (known)
        wsync_put_bytes(desc, uuid, sizeof(uuid));
}

wsync_status_t wsync_member_describe(wsync_member_t *m, const wsync_wbuf_t *desc)
{
    wsync_status_t st;

    if (desc->err)
        return wsync_err(WSYNC_ERR_NOMEM, "no memory for the description");
    if (desc->len > WSYNC_FRAME_MAX)
        return wsync_err(WSYNC_ERR_RANGE, "description of %zu bytes exceeds one frame", desc->len);
    st = wsync_conn_send(m->ctrl, WSYNC_MSG_DESCRIBE, desc->data, (uint32_t)desc->len, NULL, 0,
                         m->timeout_ms);
    if (st == WSYNC_OK)
        m->state = WSYNC_STATE_DESCRIBED;
    return st;
}

wsync_status_t wsync_member_await_plan(wsync_member_t *m, int64_t deadline_ms)
{
    const uint16_t types[] = {WSYNC_MSG_PLAN};
    wsync_msg_t *msg;
    wsync_status_t st;
    char who[32];

    st = wsync_inbox_pop(&m->inbox, types, 1, deadline_ms, &msg);
    if (st == WSYNC_ERR_TIMEOUT)
        return wsync_err(st, "%s: no plan from the coordinator yet (every sender and receiver must "
                             "have described itself: senders in setup or push, receivers in wait)",
                         wsync_member_who(m, who, sizeof(who)));
    if (st != WSYNC_OK)
        return st;
    st = wsync_plan_msg_decode(msg->payload, msg->len, &m->planmsg);
    if (st == WSYNC_OK)
        st = wsync_plan_decode(m->planmsg.plan, m->planmsg.plan_len, &m->plan);
    if (st == WSYNC_OK) {
        m->scheme = wsync_scheme_find(m->planmsg.scheme);
        if (m->scheme == NULL)
            st = wsync_err(WSYNC_ERR_PROTOCOL, "the coordinator chose scheme '%s', unknown here",
                           m->planmsg.scheme);
    }
    if (st == WSYNC_OK && m->role == WSYNC_ROLE_RECEIVER && m->nsenders <= 0)
        m->nsenders = (int)m->plan->nsenders;
    if (st == WSYNC_OK && (m->plan->nsenders != (uint32_t)m->nsenders ||
                           m->plan->nreceivers != (uint32_t)m->nreceivers ||
                           m->planmsg.npeers != (uint32_t)(m->nsenders + m->nreceivers)))
        st = wsync_err(WSYNC_ERR_PROTOCOL, "the plan is for %u senders and %u receivers, this group "
                       "has %d and %d", m->plan->nsenders, m->plan->nreceivers, m->nsenders,
                       m->nreceivers);
    /* a receiver's own segments, expanded from the plan's lists once, here, before any scheme
     * thread reads them */
    if (st == WSYNC_OK && m->role == WSYNC_ROLE_RECEIVER)
        st = wsync_plan_segments(m->plan, (uint32_t)m->rank, &m->segs, &m->nsegs);
    /* the plan message borrows the payload: keep it */
    m->plan_payload = msg->payload;
    msg->payload = NULL;
    wsync_msg_free(msg);
    if (st != WSYNC_OK)
        return wsync_member_fail(m, st);
    /* the coordinator turned its page on, or not, before it sent the plan */
    wsync_bells_t *bells = atomic_load(&m->bells);
    m->bells_on = bells != NULL && !m->scheme->async && atomic_load(&bells->hdr->mode) == 1;
    m->bell_k = 0;
    WSYNC_LOG_I("%s: plan %016llx, scheme %s%s", wsync_member_who(m, who, sizeof(who)),
                (unsigned long long)m->plan->fingerprint, m->planmsg.scheme,
                m->bells_on ? ", doorbells" : "");
    return WSYNC_OK;
}

wsync_status_t wsync_member_send_u64(wsync_member_t *m, uint16_t type, uint64_t v)
{
    wsync_wbuf_t b;
    wsync_status_t st;

    wsync_wbuf_init(&b);
    wsync_put_u64(&b, v);
    st = wsync_conn_send(m->ctrl, type, b.data, (uint32_t)b.len, NULL, 0, m->timeout_ms);
    wsync_wbuf_free(&b);
    return st;
}

/* Tell the coordinator, and wait a little for its verdict: the ABORT it sends everyone, this
 * member too. The group's first failure is the one every member reports: when another member's
 * came first (this one may only be its consequence), that is the verdict. Returns 1 if the
 * verdict is this failure's own echo, or none came; *suffix then points at what the coordinator
 * added (whom it awaits) or is NULL. Returns with m->inbox.mu held. */
static int report_and_hear(wsync_member_t *m, wsync_status_t st, const char *text,
                           const char **suffix)
{
    wsync_wbuf_t b;
    wsync_status_t sent;
    wsync_msg_t *none;
    const char *detail = strchr(text, ':');
    int ours;

    wsync_wbuf_init(&b);
    wsync_status_msg_encode(st, text, &b);
    sent = wsync_conn_send(m->ctrl, WSYNC_MSG_ERROR, b.data, (uint32_t)b.len, NULL, 0, 1000);
    wsync_wbuf_free(&b);
    if (sent == WSYNC_OK)
        wsync_inbox_pop(&m->inbox, NULL, 0, wsync_deadline_in(WSYNC_MIN(m->timeout_ms, 1000)),
                        &none);
    pthread_mutex_lock(&m->inbox.mu);
    *suffix = NULL;
    ours = m->inbox.fatal == WSYNC_OK ||
           (detail != NULL && strstr(m->inbox.fatal_text, detail + 1) != NULL);
    if (ours && m->inbox.fatal != WSYNC_OK)
        *suffix = strstr(m->inbox.fatal_text, " [the coordinator awaits");
    return ours;
}

wsync_status_t wsync_member_fail(wsync_member_t *m, wsync_status_t st)
{
    char text[1024], full[1400];
    const char *suffix;

    if (wsync_inbox_failed(&m->inbox) != WSYNC_OK)
        return wsync_inbox_failed(&m->inbox);   /* the group had already failed: say why */
    snprintf(text, sizeof(text), "%s", wsync_last_error());
    if (st == WSYNC_ERR_TIMEOUT && m->role == WSYNC_ROLE_RECEIVER) {
        /* TIMEOUT from a receiver's wait means "no version began"; a deadline passed waiting on
         * a peer in the middle of one is that peer's loss, as a silent peer's is */
        const char *prefix = wsync_status_str(st);
        size_t plen = strlen(prefix);
        char detail[1024];
        snprintf(detail, sizeof(detail), "%s", strncmp(text, prefix, plen) == 0 &&
                 text[plen] == ':' ? text + plen + 2 : text);
        st = WSYNC_ERR_PEER_LOST;
        snprintf(text, sizeof(text), "%s: %s", wsync_status_str(st), detail);
    }
    if (m->ctrl == NULL || atomic_load(&m->ctrl->closed)) {
        wsync_inbox_fail(&m->inbox, st, text);
        return wsync_err_set_text(st, text);
    }
    if (report_and_hear(m, st, text, &suffix)) {
        /* this member's own failure, as it saw it, and whom the coordinator awaits */
        snprintf(full, sizeof(full), "%s%s", text, suffix != NULL ? suffix : "");
        m->inbox.fatal = st;
        snprintf(m->inbox.fatal_text, sizeof(m->inbox.fatal_text), "%s", full);
        pthread_cond_broadcast(&m->inbox.cv);
    }
    pthread_mutex_unlock(&m->inbox.mu);
    return wsync_inbox_failed(&m->inbox);
}

void wsync_member_close(wsync_member_t *m)
{
    if (m->loop != NULL) {
        if (m->ctrl != NULL) {
            atomic_store(&m->ctrl->leaving, 1);
            wsync_conn_send(m->ctrl, WSYNC_MSG_BYE, NULL, 0, NULL, 0, 100);
        }
        wsync_loop_free(m->loop);
        m->loop = NULL;
        wsync_inbox_destroy(&m->inbox);
    }
    /* after the loop: its thread may kick the page until it stops */
    wsync_bells_free(atomic_load(&m->bells));
    atomic_store(&m->bells, NULL);
    m->bells_on = 0;
    wsync_plan_free(m->plan);
    wsync_plan_msg_clear(&m->planmsg);
    free(m->plan_payload);
    free(m->coordinator);
    m->plan = NULL;
    m->plan_payload = NULL;
    m->coordinator = NULL;
}

/* ---- doorbells (core/doorbell.h) ---------------------------------------------------------- */

wsync_status_t wsync_member_bell_begin(wsync_member_t *m, uint64_t v)
{
    wsync_bells_t *b = atomic_load(&m->bells);
    wsync_bell_hdr_t *h = b->hdr;
    uint32_t k = ++m->bell_k, ns = b->nsenders;

    atomic_store(&wsync_bells_line(b, 1, (uint32_t)m->rank)->version, v);
    if (atomic_fetch_add(&h->nbegin, 1) + 1 != ns * k)
        return WSYNC_OK;   /* not the last sender: that one rings */
    /* the last sender checks what the coordinator checked at PUSH_BEGIN */
    for (uint32_t i = 0; i < ns; i++) {
        uint64_t vi = atomic_load(&wsync_bells_line(b, 1, i)->version);
        if (vi != v)
            return wsync_err(WSYNC_ERR_INVALID, "senders disagree: sender %u pushes version %llu "
                             "while sender %d pushes version %llu", i, (unsigned long long)vi,
                             m->rank, (unsigned long long)v);
    }
    for (uint32_t r = 0; r < b->nreceivers; r++)
        if (atomic_load(&wsync_bells_line(b, 0, r)->left))
            return wsync_err(WSYNC_ERR_PEER_LOST, "version %llu cannot be delivered: receiver %u "
                             "has left the group", (unsigned long long)v, r);
    atomic_store(&h->version, v);
    atomic_store(&h->begin_ns, wsync_now_ns());
    atomic_store(&h->begin_seq, k);
    wsync_bell_ring(&h->begin_seq);
    return WSYNC_OK;
}

wsync_status_t wsync_member_bell_done(wsync_member_t *m, int64_t deadline_ms)
{
    wsync_bells_t *b = atomic_load(&m->bells);
    return wsync_bell_wait(&b->hdr->done_seq, m->bell_k, deadline_ms, &m->inbox);
}

wsync_status_t wsync_member_bell_next(wsync_member_t *m, int64_t deadline_ms, uint64_t *v)
{
    wsync_bells_t *b = atomic_load(&m->bells);
    wsync_status_t st = wsync_bell_wait(&b->hdr->begin_seq, m->bell_k + 1, deadline_ms, &m->inbox);

    if (st != WSYNC_OK)
        return st;
    m->bell_k++;
    *v = atomic_load(&b->hdr->version);
    return WSYNC_OK;
}

void wsync_member_bell_commit(wsync_member_t *m, uint64_t v)
{
    wsync_bells_t *b = atomic_load(&m->bells);
    wsync_bell_hdr_t *h = b->hdr;

    atomic_store(&wsync_bells_line(b, 0, (uint32_t)m->rank)->version, v);
    if (atomic_fetch_add(&h->ncommit, 1) + 1 != b->nreceivers * m->bell_k)
        return;
    atomic_store(&h->commit_ns, wsync_now_ns());
    atomic_store(&h->done_seq, m->bell_k);
    wsync_bell_ring(&h->done_seq);
}

/* ---- scheme side data through the coordinator (core/relay.h) ------------------------------ */

wsync_status_t wsync_member_relay_send(wsync_member_t *m, wsync_role_t to_role, int to_rank,
                                       uint32_t tag, const void *data, uint32_t len)
{
    wsync_relay_t r = {(uint32_t)to_role, to_role == WSYNC_ROLE_NONE ? -1 : to_rank, tag, len,
                       data};
    wsync_status_t st;
    wsync_wbuf_t b;

    if (len > WSYNC_RELAY_MAX)
        return wsync_err(WSYNC_ERR_RANGE, "scheme data of %u bytes exceeds one relay (%u)", len,
                         WSYNC_RELAY_MAX);
    wsync_wbuf_init(&b);
    wsync_relay_encode(&r, &b);
    st = b.err ? wsync_err(WSYNC_ERR_NOMEM, "no memory for SCHEME_SETUP")
               : wsync_conn_send(m->ctrl, WSYNC_MSG_SCHEME_SETUP, b.data, (uint32_t)b.len, NULL, 0,
                                 m->timeout_ms);
    wsync_wbuf_free(&b);
    return st;
}

wsync_status_t wsync_member_relay_recv(wsync_member_t *m, int64_t deadline_ms, wsync_msg_t **msg,
                                       wsync_relay_t *r)
{
    const uint16_t types[] = {WSYNC_MSG_SCHEME_RELAY};
    wsync_msg_t *got;
    wsync_status_t st;

    st = wsync_inbox_pop(&m->inbox, types, 1, deadline_ms, &got);
    if (st != WSYNC_OK)
        return st;
    st = wsync_relay_decode(got->payload, got->len, WSYNC_MSG_SCHEME_RELAY, r);
    if (st != WSYNC_OK) {
        wsync_msg_free(got);
        return wsync_err(st, "the coordinator relayed malformed scheme data (%s)",
                         wsync_last_error());
    }
    *msg = got;
    return WSYNC_OK;
}
