#include "core/proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

const char *wsync_msg_name(unsigned type)
{
    static const char *names[WSYNC_MSG_COUNT_] = {
        [WSYNC_MSG_HELLO] = "HELLO",         [WSYNC_MSG_WELCOME] = "WELCOME",
        [WSYNC_MSG_DESCRIBE] = "DESCRIBE",   [WSYNC_MSG_PLAN] = "PLAN",
        [WSYNC_MSG_PUSH_BEGIN] = "PUSH_BEGIN", [WSYNC_MSG_BEGIN] = "BEGIN",
        [WSYNC_MSG_COMMIT] = "COMMIT",       [WSYNC_MSG_DONE] = "DONE",
        [WSYNC_MSG_ERROR] = "ERROR",         [WSYNC_MSG_ABORT] = "ABORT",
        [WSYNC_MSG_PEER_LOST] = "PEER_LOST", [WSYNC_MSG_BYE] = "BYE",
        [WSYNC_MSG_HEARTBEAT] = "HEARTBEAT", [WSYNC_MSG_DATA_HELLO] = "DATA_HELLO",
        [WSYNC_MSG_DATA_FDS] = "DATA_FDS",   [WSYNC_MSG_READY] = "READY",
        [WSYNC_MSG_RELEASE] = "RELEASE",
    };
    return type < WSYNC_MSG_COUNT_ && names[type] ? names[type] : "?";
}

void wsync_hello_encode(const wsync_hello_t *h, wsync_wbuf_t *out)
{
    wsync_put_u32(out, h->role);
    wsync_put_i32(out, h->rank);
    wsync_put_i32(out, h->nsenders);
    wsync_put_i32(out, h->nreceivers);
    wsync_put_u32(out, h->pid);
    wsync_put_u64(out, h->bucket_bytes);
    wsync_put_u32(out, h->transports);
    wsync_put_str(out, h->hostname);
    wsync_put_str(out, h->host_id);
    wsync_put_str(out, h->data_addr);
    wsync_put_str(out, h->scheme);
}

wsync_status_t wsync_hello_decode(const void *p, size_t n, wsync_hello_t *h)
{
    wsync_rbuf_t r;

    memset(h, 0, sizeof(*h));
    wsync_rbuf_init(&r, p, n);
    h->role = wsync_get_u32(&r);
    h->rank = wsync_get_i32(&r);
    h->nsenders = wsync_get_i32(&r);
    h->nreceivers = wsync_get_i32(&r);
    h->pid = wsync_get_u32(&r);
    h->bucket_bytes = wsync_get_u64(&r);
    h->transports = wsync_get_u32(&r);
    h->hostname = wsync_get_str(&r, WSYNC_STR_MAX);
    h->host_id = wsync_get_str(&r, WSYNC_STR_MAX);
    h->data_addr = wsync_get_str(&r, WSYNC_STR_MAX);
    h->scheme = wsync_get_str(&r, WSYNC_STR_MAX);
    if (r.err || wsync_rbuf_left(&r) != 0 || h->host_id == NULL ||
        (h->role != WSYNC_ROLE_SENDER && h->role != WSYNC_ROLE_RECEIVER)) {
        wsync_hello_clear(h);
        return wsync_err(WSYNC_ERR_PROTOCOL, "malformed HELLO (%zu bytes)", n);
    }
    return WSYNC_OK;
}

void wsync_hello_clear(wsync_hello_t *h)
{
    free(h->hostname);
    free(h->host_id);
    free(h->data_addr);
    free(h->scheme);
    memset(h, 0, sizeof(*h));
}

void wsync_plan_msg_encode(const wsync_plan_msg_t *m, wsync_wbuf_t *out)
{
    wsync_put_str(out, m->scheme);
    wsync_put_str(out, m->explain);
    wsync_put_u32(out, m->npeers);
    for (uint32_t i = 0; i < m->npeers; i++) {
        wsync_put_u32(out, m->peers[i].role);
        wsync_put_i32(out, m->peers[i].rank);
        wsync_put_u32(out, m->peers[i].pid);
        wsync_put_str(out, m->peers[i].host_id);
        wsync_put_str(out, m->peers[i].data_addr);
    }
    wsync_put_u32(out, m->plan_len);
    wsync_put_bytes(out, m->plan, m->plan_len);
}

wsync_status_t wsync_plan_msg_decode(const void *p, size_t n, wsync_plan_msg_t *m)
{
    wsync_rbuf_t r;

    memset(m, 0, sizeof(*m));
    wsync_rbuf_init(&r, p, n);
    m->scheme = wsync_get_str(&r, WSYNC_STR_MAX);
    m->explain = wsync_get_str(&r, 1u << 20);
    m->npeers = wsync_get_count(&r, 20);
    if (!r.err && m->npeers > 0) {
        m->peers = calloc(m->npeers, sizeof(*m->peers));
        if (m->peers == NULL)
            r.err = 1;
    }
    for (uint32_t i = 0; !r.err && i < m->npeers; i++) {
        m->peers[i].role = wsync_get_u32(&r);
        m->peers[i].rank = wsync_get_i32(&r);
        m->peers[i].pid = wsync_get_u32(&r);
        m->peers[i].host_id = wsync_get_str(&r, WSYNC_STR_MAX);
        m->peers[i].data_addr = wsync_get_str(&r, WSYNC_STR_MAX);
    }
    m->plan_len = wsync_get_u32(&r);
    m->plan = wsync_get_bytes(&r, m->plan_len);
    if (r.err || m->scheme == NULL || wsync_rbuf_left(&r) != 0) {
        wsync_plan_msg_clear(m);
        return wsync_err(WSYNC_ERR_PROTOCOL, "malformed PLAN message (%zu bytes)", n);
    }
    return WSYNC_OK;
}

void wsync_plan_msg_clear(wsync_plan_msg_t *m)
{
    free(m->scheme);
    free(m->explain);
    for (uint32_t i = 0; m->peers != NULL && i < m->npeers; i++) {
        free(m->peers[i].host_id);
        free(m->peers[i].data_addr);
    }
    free(m->peers);
    memset(m, 0, sizeof(*m));
}

void wsync_status_msg_encode(wsync_status_t st, const char *text, wsync_wbuf_t *out)
{
    wsync_put_i32(out, (int32_t)st);
    wsync_put_str(out, text);
}

wsync_status_t wsync_status_msg_decode(const void *p, size_t n, wsync_status_t *st, char *text,
                                       size_t text_len)
{
    wsync_rbuf_t r;
    char *s;

    wsync_rbuf_init(&r, p, n);
    *st = (wsync_status_t)wsync_get_i32(&r);
    s = wsync_get_str(&r, WSYNC_STR_MAX);
    if (r.err || *st >= 0 || *st < WSYNC_ERR_INTERNAL) {
        free(s);
        *st = WSYNC_ERR_PROTOCOL;
        snprintf(text, text_len, "malformed status message");
        return WSYNC_ERR_PROTOCOL;
    }
    snprintf(text, text_len, "%s", s ? s : "");
    free(s);
    return WSYNC_OK;
}
