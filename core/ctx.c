/* The context: log level and what each transport can do on this machine (probed once). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fault.h"
#include "core/util.h"
#include "transports/shm.h"

#include "core/log.h"
#include "core/objects.h"

wsync_status_t wsync_ctx_create(const wsync_ctx_params_t *params, wsync_ctx_t **out)
{
    wsync_ctx_t *ctx;

    if (out == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_ctx_create: ctx is NULL");
    if (wsync_fault_init() != WSYNC_OK)
        return WSYNC_ERR_INVALID;   /* the last error names the bad token */
    ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "no memory for a context");
    ctx->log_level = params != NULL ? params->log_level : WSYNC_LOG_UNSET;
    if (ctx->log_level == WSYNC_LOG_UNSET) {
        const char *env = getenv("WSYNC_LOG_LEVEL");
        ctx->log_level = wsync_log_parse_level(env);
        if (env != NULL && *env != '\0' && ctx->log_level == WSYNC_LOG_UNSET) {
            free(ctx);
            return wsync_err(WSYNC_ERR_INVALID, "environment variable WSYNC_LOG_LEVEL='%s': "
                                                "expected error, warn, info or debug", env);
        }
    }
    if (ctx->log_level == WSYNC_LOG_UNSET)
        ctx->log_level = WSYNC_LOG_WARN;
    ctx->verify = params != NULL ? params->verify : -1;
    if (ctx->verify == -1) {
        const char *env = getenv("WSYNC_VERIFY");
        ctx->verify = 0;
        if (env != NULL && *env != '\0') {
            if ((env[0] != '0' && env[0] != '1') || env[1] != '\0') {
                free(ctx);
                return wsync_err(WSYNC_ERR_INVALID, "environment variable WSYNC_VERIFY='%s': "
                                                    "expected 0 or 1", env);
            }
            ctx->verify = env[0] == '1';
        }
    }
    if (ctx->verify != 0 && ctx->verify != 1) {
        int bad = ctx->verify;
        free(ctx);
        return wsync_err(WSYNC_ERR_INVALID, "wsync_ctx_create: verify = %d, expected -1, 0 or 1",
                         bad);
    }
    wsync_log_set_level(ctx->log_level);
    pthread_mutex_init(&ctx->allocs_mu, NULL);
    pthread_mutex_init(&ctx->probe_mu, NULL);
    /* the transports are probed when a sender, receiver or info call first needs them */
    for (int i = 0; i < WSYNC_NTRANSPORTS; i++)
        wsync_caps_str(wsync_transports[i]->caps, ctx->transport_caps[i],
                       sizeof(ctx->transport_caps[i]));
    *out = ctx;
    return WSYNC_OK;
}

uint32_t wsync_ctx_probe(const wsync_ctx_t *cctx, uint32_t want)
{
    /* the ctx was allocated writable (wsync_ctx_create); the probes only fill its cache */
    wsync_ctx_t *ctx = (wsync_ctx_t *)cctx;
    uint32_t got;

    pthread_mutex_lock(&ctx->probe_mu);
    for (int i = 0; i < WSYNC_NTRANSPORTS; i++) {
        const wsync_transport_ops_t *t = wsync_transports[i];
        if (!(want & (1u << i)) || (ctx->probed_mask & (1u << i)))
            continue;
        ctx->transport_available[i] = t->probe(ctx->transport_reason[i],
                                               sizeof(ctx->transport_reason[i]));
        if (ctx->transport_available[i])
            ctx->transport_mask |= 1u << i;
        ctx->probed_mask |= 1u << i;
        WSYNC_LOG_D("transport %s: %s (%s)", t->name,
                    ctx->transport_available[i] ? "available" : "unavailable",
                    ctx->transport_reason[i]);
    }
    got = ctx->transport_mask & want;
    pthread_mutex_unlock(&ctx->probe_mu);
    return got;
}

uint32_t wsync_ctx_probed(const wsync_ctx_t *cctx)
{
    wsync_ctx_t *ctx = (wsync_ctx_t *)cctx;
    uint32_t m;

    pthread_mutex_lock(&ctx->probe_mu);
    m = ctx->probed_mask;
    pthread_mutex_unlock(&ctx->probe_mu);
    return m;
}

const char *wsync_ctx_env_scheme(void)
{
    const char *env = getenv("WSYNC_SCHEME");
    /* "auto" or a name no scheme has: probe everything, as a receiver always did */
    return env != NULL && wsync_scheme_find(env) != NULL ? env : NULL;
}

void wsync_ctx_free(wsync_ctx_t *ctx)
{
    if (ctx == NULL)
        return;
    for (size_t i = 0; i < ctx->nallocs; i++) {
        wsync_shm_t shm = {ctx->allocs[i].fd, ctx->allocs[i].base, ctx->allocs[i].bytes};
        WSYNC_LOG_W("wsync_ctx_free: %zu bytes from wsync_mem_alloc were not freed",
                    ctx->allocs[i].bytes);
        wsync_shm_release(&shm);
    }
    free(ctx->allocs);
    pthread_mutex_destroy(&ctx->allocs_mu);
    pthread_mutex_destroy(&ctx->probe_mu);
    free(ctx);
}

wsync_status_t wsync_mem_alloc(wsync_ctx_t *ctx, size_t bytes, void **ptr)
{
    wsync_shm_t shm;
    wsync_status_t st;

    if (ctx == NULL || ptr == NULL || bytes == 0)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_mem_alloc: ctx and ptr must be set, bytes > 0");
    st = wsync_shm_create("wsync-shard", bytes, &shm);
    if (st != WSYNC_OK)
        return st;
    pthread_mutex_lock(&ctx->allocs_mu);
    if (ctx->nallocs == ctx->allocs_cap) {
        size_t cap = ctx->allocs_cap ? ctx->allocs_cap * 2 : 16;
        wsync_alloc_t *a = realloc(ctx->allocs, cap * sizeof(*a));
        if (a == NULL) {
            pthread_mutex_unlock(&ctx->allocs_mu);
            wsync_shm_release(&shm);
            return wsync_err(WSYNC_ERR_NOMEM, "wsync_mem_alloc: no memory for the registry");
        }
        ctx->allocs = a;
        ctx->allocs_cap = cap;
    }
    ctx->allocs[ctx->nallocs++] = (wsync_alloc_t){shm.base, shm.bytes, shm.fd};
    pthread_mutex_unlock(&ctx->allocs_mu);
    *ptr = shm.base;
    return WSYNC_OK;
}

void wsync_mem_free(wsync_ctx_t *ctx, void *ptr)
{
    if (ctx == NULL || ptr == NULL)
        return;
    pthread_mutex_lock(&ctx->allocs_mu);
    for (size_t i = 0; i < ctx->nallocs; i++) {
        if (ctx->allocs[i].base != ptr)
            continue;
        wsync_shm_t shm = {ctx->allocs[i].fd, ctx->allocs[i].base, ctx->allocs[i].bytes};
        ctx->allocs[i] = ctx->allocs[--ctx->nallocs];
        pthread_mutex_unlock(&ctx->allocs_mu);
        wsync_shm_release(&shm);
        return;
    }
    pthread_mutex_unlock(&ctx->allocs_mu);
    WSYNC_LOG_E("wsync_mem_free: %p did not come from wsync_mem_alloc", ptr);
}

int wsync_ctx_find_alloc(wsync_ctx_t *ctx, const void *ptr, size_t bytes, wsync_alloc_t *out)
{
    uintptr_t p = (uintptr_t)ptr;
    int found = 0;

    pthread_mutex_lock(&ctx->allocs_mu);
    for (size_t i = 0; i < ctx->nallocs && !found; i++) {
        uintptr_t b = (uintptr_t)ctx->allocs[i].base;
        if (p >= b && p + bytes <= b + ctx->allocs[i].bytes) {
            *out = ctx->allocs[i];
            found = 1;
        }
    }
    pthread_mutex_unlock(&ctx->allocs_mu);
    return found;
}

int wsync_transport_count(const wsync_ctx_t *ctx)
{
    (void)ctx;
    return WSYNC_NTRANSPORTS;
}

wsync_status_t wsync_transport_info(const wsync_ctx_t *ctx, int i, wsync_component_info_t *info)
{
    if (ctx == NULL || info == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_transport_info: NULL argument");
    if (i < 0 || i >= WSYNC_NTRANSPORTS)
        return wsync_err(WSYNC_ERR_RANGE, "transport index %d outside [0, %d)", i,
                         WSYNC_NTRANSPORTS);
    wsync_ctx_probe(ctx, 1u << i);
    info->name = wsync_transports[i]->name;
    info->compiled = wsync_transports[i]->compiled;
    info->available = ctx->transport_available[i];
    info->reason = ctx->transport_reason[i];
    info->caps = ctx->transport_caps[i];
    return WSYNC_OK;
}

int wsync_scheme_count(const wsync_ctx_t *ctx)
{
    (void)ctx;
    return WSYNC_NSCHEMES;
}

wsync_status_t wsync_scheme_info(const wsync_ctx_t *ctx, int i, wsync_component_info_t *info)
{
    static const char *needs[WSYNC_NSCHEMES][3] = {
        {"shm", NULL, NULL}, {"nccl", NULL, NULL}, {"ucx", "ofi", NULL}};

    if (ctx == NULL || info == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_scheme_info: NULL argument");
    if (i < 0 || i >= WSYNC_NSCHEMES)
        return wsync_err(WSYNC_ERR_RANGE, "scheme index %d outside [0, %d)", i, WSYNC_NSCHEMES);
    const wsync_scheme_ops_t *s = wsync_schemes[i];
    info->name = s->name;
    info->compiled = s->implemented;
    info->caps = "";
    if (!s->implemented) {
        info->available = 0;
        info->reason = "no data path in this version of wsync";
        return WSYNC_OK;
    }
    /* a scheme can run here if any transport it builds on can */
    wsync_ctx_probe(ctx, wsync_scheme_transports(s->name));
    info->available = 0;
    info->reason = "none of the transports it needs is available here";
    for (int k = 0; k < 3 && needs[i][k] != NULL; k++) {
        int t = wsync_transport_index(needs[i][k]);
        if (t >= 0 && ctx->transport_available[t]) {
            info->available = 1;
            info->reason = ctx->transport_reason[t];
            break;
        }
    }
    return WSYNC_OK;
}

wsync_status_t wsync_ctx_explain(const wsync_ctx_t *ctx, wsync_mem_t mem, int nsenders,
                                 int nreceivers, char *buf, size_t len)
{
    wsync_hello_t *peers;
    wsync_group_info_t g;
    const wsync_scheme_ops_t *chosen;
    char host[256] = "this machine";
    wsync_status_t st;

    if (ctx == NULL || buf == NULL || len == 0 || nsenders < 1 || nreceivers < 1 ||
        (mem != WSYNC_MEM_HOST && mem != WSYNC_MEM_CUDA))
        return wsync_err(WSYNC_ERR_INVALID, "wsync_ctx_explain: bad arguments");
    peers = calloc((size_t)(nsenders + nreceivers), sizeof(*peers));
    if (peers == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "wsync_ctx_explain: no memory");
    gethostname(host, sizeof(host) - 1);
    uint32_t mask = wsync_ctx_probe(ctx, wsync_scheme_transports(NULL));   /* every scheme */
    /* every participant looks like this process: same host, same transports */
    for (int i = 0; i < nsenders + nreceivers; i++) {
        peers[i].role = i < nsenders ? WSYNC_ROLE_SENDER : WSYNC_ROLE_RECEIVER;
        peers[i].rank = i < nsenders ? i : i - nsenders;
        peers[i].nsenders = nsenders;
        peers[i].nreceivers = nreceivers;
        peers[i].pid = (uint32_t)getpid();
        peers[i].transports = mask;
        peers[i].hostname = host;
        peers[i].host_id = (char *)wsync_host_id();
    }
    memset(&g, 0, sizeof(g));
    g.nsenders = (uint32_t)nsenders;
    g.nreceivers = (uint32_t)nreceivers;
    g.senders = peers;
    g.receivers = peers + nsenders;
    g.mem_kinds = 1u << mem;
    buf[0] = '\0';
    st = wsync_negotiate(&g, "auto", &chosen, buf, len);
    free(peers);
    return st;
}
