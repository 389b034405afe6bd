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
        [WSYNC_MSG_RELEASE] = "RELEASE",     [WSYNC_MSG_PUBLISH] = "PUBLISH",
        [WSYNC_MSG_PUBLISHED] = "PUBLISHED", [WSYNC_MSG_FREE] = "FREE",
        [WSYNC_MSG_FETCH] = "FETCH",         [WSYNC_MSG_CANCEL] = "CANCEL",
        [WSYNC_MSG_DIRECTORY] = "DIRECTORY", [WSYNC_MSG_READ_DONE] = "READ_DONE",
        [WSYNC_MSG_SCHEME_SETUP] = "SCHEME_SETUP", [WSYNC_MSG_SCHEME_RELAY] = "SCHEME_RELAY",
        [WSYNC_MSG_DELTA_START] = "DELTA_START",
    };
    return type < WSYNC_MSG_COUNT_ && names[type] ? names[type] : "?";
}

int wsync_delta_mode_parse(const char *s)
{
    if (s == NULL)
        return -1;
    if (strcmp(s, "off") == 0)
        return WSYNC_DELTA_MODE_OFF;
    if (strcmp(s, "on") == 0)
        return WSYNC_DELTA_MODE_ON;
    if (strcmp(s, "auto") == 0)
        return WSYNC_DELTA_MODE_AUTO;
    return -1;
}

const char *wsync_delta_mode_name(uint32_t mode)
{
    return mode == WSYNC_DELTA_MODE_OFF ? "off" : mode == WSYNC_DELTA_MODE_ON ? "on"
           : mode == WSYNC_DELTA_MODE_AUTO ? "auto" : "?";
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
    wsync_put_u32(out, h->keep_versions);
    wsync_put_u32(out, h->delta);
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
    h->keep_versions = wsync_get_u32(&r);
    h->delta = wsync_get_u32(&r);
    if (r.err || wsync_rbuf_left(&r) != 0 || h->host_id == NULL ||
        h->delta > WSYNC_DELTA_MODE_AUTO ||
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
    wsync_put_u32(out, m->delta);
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
    m->delta = wsync_get_u32(&r);
    if (r.err || m->scheme == NULL || wsync_rbuf_left(&r) != 0 ||
        m->delta > WSYNC_DELTA_MODE_ON) {
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

void wsync_relay_encode(const wsync_relay_t *m, wsync_wbuf_t *out)
{
    wsync_put_u32(out, m->role);
    wsync_put_i32(out, m->rank);
    wsync_put_u32(out, m->tag);
    wsync_put_u32(out, m->len);
    wsync_put_bytes(out, m->data, m->len);
}

wsync_status_t wsync_relay_decode(const void *p, size_t n, unsigned type, wsync_relay_t *m)
{
    wsync_relay_t v;
    wsync_rbuf_t r;
    int ok;

    wsync_rbuf_init(&r, p, n);
    v.role = wsync_get_u32(&r);
    v.rank = wsync_get_i32(&r);
    v.tag = wsync_get_u32(&r);
    v.len = wsync_get_u32(&r);
    ok = !r.err && v.len <= WSYNC_RELAY_MAX && wsync_rbuf_left(&r) == v.len &&
         (type == WSYNC_MSG_SCHEME_SETUP || type == WSYNC_MSG_SCHEME_RELAY);
    if (ok && v.role == WSYNC_ROLE_NONE)
        ok = type == WSYNC_MSG_SCHEME_SETUP && v.rank == -1;
    else if (ok)
        ok = (v.role == WSYNC_ROLE_SENDER || v.role == WSYNC_ROLE_RECEIVER) && v.rank >= 0;
    if (ok) {
        v.data = wsync_get_bytes(&r, v.len);
        ok = !r.err && (v.data != NULL || v.len == 0);
    }
    if (!ok)
        return wsync_err(WSYNC_ERR_PROTOCOL, "malformed %s (%zu bytes)", wsync_msg_name(type), n);
    *m = v;
    return WSYNC_OK;
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

#define DIR_MAX_BLOB 4096u

void wsync_dir_entry_encode(const wsync_dir_entry_t *e, wsync_wbuf_t *out)
{
    wsync_put_u32(out, e->sender);
    wsync_put_str(out, e->transport);
    wsync_put_u32(out, e->addr_len);
    wsync_put_bytes(out, e->addr, e->addr_len);
    wsync_put_u32(out, e->nregions);
    for (uint32_t i = 0; i < e->nregions; i++) {
        wsync_put_u64(out, e->regions[i].base);
        wsync_put_u64(out, e->regions[i].len);
        wsync_put_u32(out, e->regions[i].rkey_len);
        wsync_put_bytes(out, e->regions[i].rkey, e->regions[i].rkey_len);
    }
    wsync_put_u32(out, e->nshards);
    for (uint32_t i = 0; i < e->nshards; i++) {
        wsync_put_u32(out, e->shards[i].region);
        wsync_put_u64(out, e->shards[i].addr);
    }
    wsync_put_u64(out, e->delta_base);
    if (e->delta_base != 0) {
        wsync_put_u32(out, e->delta_region);
        wsync_put_u64(out, e->delta_table);
        wsync_put_u32(out, e->delta_n);
    }
}

static uint8_t *get_blob(wsync_rbuf_t *in, uint32_t *len)
{
    const void *p;
    uint8_t *b;

    *len = wsync_get_u32(in);
    if (in->err || *len > DIR_MAX_BLOB) {
        in->err = 1;
        return NULL;
    }
    p = wsync_get_bytes(in, *len);
    b = malloc(*len ? *len : 1);
    if (p == NULL || b == NULL) {
        free(b);
        in->err = 1;
        return NULL;
    }
    memcpy(b, p, *len);
    return b;
}

wsync_status_t wsync_dir_chunk_span(const wsync_dir_entry_t *en, const wsync_chunk_t *c,
                                    uint64_t v, const struct wsync_dir_region **rg,
                                    uint64_t *first)
{
    size_t esz = wsync_dtype_size(c->dtype);

    if (c->shard >= en->nshards)
        return wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %u's directory entry for version "
                         "%llu has %u shards; the plan reads shard %u", c->sender,
                         (unsigned long long)v, en->nshards, c->shard);
    const struct wsync_dir_shard *sh = &en->shards[c->shard];
    const struct wsync_dir_region *g = &en->regions[sh->region];
    uint64_t lo = sh->addr + c->src.off * esz;
    uint64_t hi = sh->addr + (c->src.off + (c->src.rows - 1) * c->src.pitch + c->src.cols) * esz;
    if (c->src.rows == 0 || lo < g->base || hi > g->base + g->len || hi < lo)
        return wsync_err(WSYNC_ERR_PROTOCOL, "store: version %llu: sender %u shard %u: the plan "
                         "reads [%llu, %llu) outside its registered region [%llu, +%llu)",
                         (unsigned long long)v, c->sender, c->shard, (unsigned long long)lo,
                         (unsigned long long)hi, (unsigned long long)g->base,
                         (unsigned long long)g->len);
    *rg = g;
    *first = lo;
    return WSYNC_OK;
}

wsync_status_t wsync_dir_entry_decode(wsync_rbuf_t *in, wsync_dir_entry_t *e)
{
    memset(e, 0, sizeof(*e));
    e->sender = wsync_get_u32(in);
    e->transport = wsync_get_str(in, 64);
    e->addr = get_blob(in, &e->addr_len);
    e->nregions = wsync_get_count(in, 20);
    if (!in->err && e->nregions > 0 && (e->regions = calloc(e->nregions, sizeof(*e->regions))) == NULL)
        in->err = 1;
    for (uint32_t i = 0; !in->err && i < e->nregions; i++) {
        e->regions[i].base = wsync_get_u64(in);
        e->regions[i].len = wsync_get_u64(in);
        e->regions[i].rkey = get_blob(in, &e->regions[i].rkey_len);
        if (e->regions[i].base + e->regions[i].len < e->regions[i].base)
            in->err = 1;
    }
    e->nshards = wsync_get_count(in, 12);
    if (!in->err && e->nshards > 0 && (e->shards = calloc(e->nshards, sizeof(*e->shards))) == NULL)
        in->err = 1;
    for (uint32_t i = 0; !in->err && i < e->nshards; i++) {
        e->shards[i].region = wsync_get_u32(in);
        e->shards[i].addr = wsync_get_u64(in);
        if (e->shards[i].region >= e->nregions ||
            e->shards[i].addr < e->regions[e->shards[i].region].base ||
            e->shards[i].addr > e->regions[e->shards[i].region].base +
                                    e->regions[e->shards[i].region].len)
            in->err = 1;
    }
    e->delta_base = wsync_get_u64(in);
    if (!in->err && e->delta_base != 0) {
        e->delta_region = wsync_get_u32(in);
        e->delta_table = wsync_get_u64(in);
        e->delta_n = wsync_get_u32(in);
        /* the table lies inside its region (n rows; n bounded so that this cannot wrap) */
        if (!in->err && (e->delta_region >= e->nregions || e->delta_n > (1u << 28) ||
                         e->delta_table < e->regions[e->delta_region].base ||
                         e->delta_table - e->regions[e->delta_region].base +
                                 (uint64_t)e->delta_n * WSYNC_DIR_DELTA_ROW >
                             e->regions[e->delta_region].len))
            in->err = 1;
    }
    if (in->err || e->transport == NULL) {
        wsync_dir_entry_clear(e);
        return wsync_err(WSYNC_ERR_PROTOCOL, "malformed store directory entry");
    }
    return WSYNC_OK;
}

void wsync_dir_entry_clear(wsync_dir_entry_t *e)
{
    free(e->transport);
    free(e->addr);
    for (uint32_t i = 0; e->regions != NULL && i < e->nregions; i++)
        free(e->regions[i].rkey);
    free(e->regions);
    free(e->shards);
    memset(e, 0, sizeof(*e));
}
