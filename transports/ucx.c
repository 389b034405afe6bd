/* ucx transport: one-sided RMA (get/put) between processes through UCP, for the store scheme
 * (the contract is transports/rma.h). One wsync_rma_t is one UCP context with one worker; peers
 * are endpoints created from a worker address in error mode PEER; a region is a ucp_mem_map with
 * its packed rkey; gets and puts are ucp_get_nbx/ucp_put_nbx, counted until flush.
 *
 * What UCX itself checks, measured with UCX 1.13.1 and 1.16.0 (raw UCP programs, two processes):
 * nothing, on the paths a node without an RDMA NIC uses. Over tcp, and over shared memory
 * (sysv/posix) where CMA is unusable, UCX emulates RMA with active messages that the owner's
 * worker serves:
 *  - a get outside the registration makes the *owner* memcpy from that address: it silently
 *    returns the memory next to the region, or the owner dies of SIGSEGV when that is unmapped;
 *  - a zeroed key reads the region as if it were valid (tcp and shared memory);
 *  - ucp_ep_rkey_unpack takes no length and trusts the bytes: a corrupted blob aborts the reader
 *    on an assertion (shared memory, mm_posix.c "length > 0") or crashes it with SIGSEGV (shared
 *    memory; tcp with 1.16), while 1.13 over tcp ignores the key altogether.
 * So this file checks what UCX does not: addresses and keys travel in framed blobs (magic, sizes,
 * the owner context's id, the region's bounds, an xxh3 of it all), rkey_import rejects a blob that
 * is malformed, corrupted or from another context, and get/put refuse a range outside the region
 * before posting. This guards against bugs and corruption, not against a hostile peer, which can
 * forge a blob. Also, an owner must not dereg a region that readers may still read.
 *
 * Emulated RMA needs the owner's worker to make progress, yet an owner only registers and waits.
 * So once a region is registered, a server thread drives the worker (napping when idle) until
 * the last region is gone; every call into UCX is made under the context's lock, which is why the
 * worker is in UCS_THREAD_MODE_SERIALIZED (one thread at a time) rather than SINGLE.
 *
 * Mode PEER has a price on one node: UCX's shared-memory transports (1.13 and 1.16) have no
 * peer-failure handler, so same-node peers go over tcp loopback (about 1.2 GB/s, against 4-5 GB/s
 * for sysv/posix without PEER). Same-node groups have the ipc scheme for speed.
 *
 * flush returns with nothing in flight, also on failure: at the deadline it force-closes the
 * endpoints that still have ops (UCX then cancels them), so no buffer is written after it
 * returns; those peers are lost from then on (reconnect to retry). */
#include "transports/rma.h"
#include "transports/transport.h"
#include "wsync_build_config.h"

#include <stdio.h>

#if WSYNC_HAVE_UCX
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>
#include <xxhash.h>

#include "core/log.h"
#include "core/status.h"
#include "core/util.h"

/* Creates and drops a UCP context asking for RMA. No worker and no endpoint are made, so nothing
 * touches the network; reading the devices may take a moment, which is acceptable here. */
static int ucx_probe(char *reason, size_t reason_len)
{
    unsigned major = 0, minor = 0, release = 0;
    ucp_get_version(&major, &minor, &release);

    ucp_config_t *config = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK) {
        snprintf(reason, reason_len, "UCX %u.%u.%u: ucp_config_read failed: %s", major, minor,
                 release, ucs_status_string(st));
        return 0;
    }
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES,
        .features = UCP_FEATURE_RMA,
    };
    ucp_context_h context = NULL;
    st = ucp_init(&params, config, &context);
    ucp_config_release(config);
    if (st != UCS_OK) {
        snprintf(reason, reason_len, "UCX %u.%u.%u: ucp_init with RMA failed: %s", major, minor,
                 release, ucs_status_string(st));
        return 0;
    }
    ucp_cleanup(context);
    snprintf(reason, reason_len, "UCX %u.%u.%u: initialised with RMA", major, minor, release);
    return 1;
}

/* ---- blobs ----------------------------------------------------------------------------------
 * [0, 8)   xxh3-64 of bytes [8, end)
 * [8, 12)  magic
 * [12, 16) n: length of the UCX bytes at the end
 * [16, 24) id of the context that made the blob
 * then, for an address: the owner's label (host:pid, NUL-padded, UCX_LABEL_MAX bytes);
 *       for a key: the region's base and length (8 bytes each);
 * then the n bytes UCX produced (worker address or packed rkey). Little-endian. */
#define UCX_ADDR_MAGIC 0x41555357u /* "WSUA" */
#define UCX_KEY_MAGIC 0x4b555357u  /* "WSUK" */
#define UCX_LABEL_MAX 64
#define UCX_HDR 24
#define UCX_ADDR_HDR (UCX_HDR + UCX_LABEL_MAX)
#define UCX_KEY_HDR (UCX_HDR + 16)

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void blob_seal(uint8_t *b, size_t len)
{
    put_le64(b, XXH3_64bits(b + 8, len - 8));
}

/* Checks framing and checksum; on success *n is the UCX byte count. Returns a reason or NULL. */
static const char *blob_check(const uint8_t *b, size_t len, uint32_t magic, size_t hdr,
                              uint32_t *n)
{
    if (b == NULL || len < hdr)
        return "shorter than its header";
    if (get_le32(b + 8) != magic)
        return "wrong magic (not made by the ucx transport, or the wrong kind of blob)";
    uint32_t ucx_len = get_le32(b + 12);
    if (ucx_len == 0 || (uint64_t)hdr + ucx_len != len)
        return "its length does not match the length it announces";
    if (get_le64(b) != XXH3_64bits(b + 8, len - 8))
        return "checksum mismatch (corrupted)";
    *n = ucx_len;
    return NULL;
}

/* ---- objects --------------------------------------------------------------------------------- */

/* One posted operation, from post to its completion callback. */
typedef struct ucx_op {
    struct ucx_op *prev, *next;     /* in ctx->inflight, or (next only) the free list */
    wsync_rma_t *ctx;
    wsync_rma_peer_t *peer;
    const char *kind;               /* "get", "put" or "flush" */
    uint64_t remote_addr;
    size_t len;
    int done;
} ucx_op_t;

struct wsync_rma {
    ucp_context_h context;
    ucp_worker_h worker;
    pthread_mutex_t lock;           /* every call into UCX, and everything below */
    atomic_int waiters;             /* callers queued on lock: the server thread steps aside */
    uint64_t id;
    char label[UCX_LABEL_MAX];
    uint8_t *addr;                  /* sealed address blob */
    size_t addr_len;
    wsync_rma_peer_t *peers;        /* connected (not disconnected) peers */
    ucx_op_t inflight;              /* list head */
    ucx_op_t *free_ops;
    size_t outstanding;
    wsync_status_t err;             /* first failure since the last flush, and its sentence */
    char err_text[640];
    unsigned nmrs;
    pthread_t server;
    int server_running;
    atomic_int server_stop;
};

struct wsync_rma_peer {
    wsync_rma_t *ctx;
    wsync_rma_peer_t *next;
    ucp_ep_h ep;                    /* NULL once closed */
    uint64_t remote_id;
    char label[UCX_LABEL_MAX];      /* the remote context's host:pid */
    ucs_status_t failed;            /* what the error handler reported (UCS_OK: healthy) */
    const char *abandoned;          /* why we closed the endpoint ourselves, or NULL */
    size_t outstanding;
    int unflushed;                  /* puts posted since the last flush */
    int detached;                   /* disconnected while ops were pending: freed by the last */
};

struct wsync_rma_mr {
    wsync_rma_t *ctx;
    ucp_mem_h memh;
};

struct wsync_rma_rkey {
    wsync_rma_t *ctx;
    wsync_rma_peer_t *peer;
    ucp_rkey_h rkey;
    uint64_t base, len;             /* the region, as its owner announced it */
};

/* Idle polling: spin a little, then nap with growing naps, so that a wait that sees nothing does
 * not hold a core. (ucp_worker_wait would need UCP_FEATURE_WAKEUP, which not every transport's
 * RMA path supports; naps of at most UCX_NAP_MAX_US bound the added latency instead.) */
#define UCX_SPIN 64
#define UCX_NAP_MIN_US 10
#define UCX_NAP_MAX_US 250
/* How long closing an endpoint or cancelling what a deadline left may take. */
#define UCX_SETTLE_MS 2000

typedef struct {
    unsigned idle, nap_us;
} ucx_backoff_t;

static void ucx_nap(ucx_backoff_t *b, int64_t deadline_ms)
{
    if (++b->idle < UCX_SPIN)
        return;
    if (b->nap_us == 0)
        b->nap_us = UCX_NAP_MIN_US;
    int64_t left_ms = deadline_ms - wsync_now_ms();
    long us = (long)b->nap_us;
    if (left_ms <= us / 1000)
        us = left_ms > 0 ? (long)left_ms * 1000 : 0;
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
    if (b->nap_us < UCX_NAP_MAX_US)
        b->nap_us = b->nap_us * 2 > UCX_NAP_MAX_US ? UCX_NAP_MAX_US : b->nap_us * 2;
}

static void ucx_lock(wsync_rma_t *ctx)
{
    atomic_fetch_add(&ctx->waiters, 1);
    pthread_mutex_lock(&ctx->lock);
    atomic_fetch_sub(&ctx->waiters, 1);
}

static void ucx_unlock(wsync_rma_t *ctx)
{
    pthread_mutex_unlock(&ctx->lock);
}

static wsync_status_t ucx_map_status(ucs_status_t st)
{
    if (st == UCS_ERR_UNREACHABLE || st == UCS_ERR_CONNECTION_RESET || st == UCS_ERR_REJECTED ||
        st == UCS_ERR_NOT_CONNECTED ||
        (st <= UCS_ERR_FIRST_LINK_FAILURE && st >= UCS_ERR_LAST_ENDPOINT_FAILURE))
        return WSYNC_ERR_PEER_LOST;
    if (st == UCS_ERR_TIMED_OUT)
        return WSYNC_ERR_TIMEOUT;
    if (st == UCS_ERR_NO_MEMORY)
        return WSYNC_ERR_NOMEM;
    return WSYNC_ERR_TRANSPORT;
}

/* ---- operations in flight -------------------------------------------------------------------- */

static ucx_op_t *ucx_op_alloc(wsync_rma_t *ctx)
{
    ucx_op_t *op = ctx->free_ops;
    if (op != NULL)
        ctx->free_ops = op->next;
    else if ((op = malloc(sizeof(*op))) == NULL)
        return NULL;
    memset(op, 0, sizeof(*op));
    op->ctx = ctx;
    return op;
}

static void ucx_op_release(ucx_op_t *op)
{
    op->next = op->ctx->free_ops;
    op->ctx->free_ops = op;
}

static void ucx_op_track(ucx_op_t *op)
{
    wsync_rma_t *ctx = op->ctx;
    op->prev = ctx->inflight.prev;
    op->next = &ctx->inflight;
    ctx->inflight.prev->next = op;
    ctx->inflight.prev = op;
    ctx->outstanding++;
    op->peer->outstanding++;
}

/* Unlinks a tracked op; frees a detached peer with its last op. */
static void ucx_op_untrack(ucx_op_t *op)
{
    wsync_rma_peer_t *peer = op->peer;
    op->prev->next = op->next;
    op->next->prev = op->prev;
    op->ctx->outstanding--;
    if (--peer->outstanding == 0 && peer->detached)
        free(peer);
    op->done = 1;
}

static const char *ucx_op_dir(const ucx_op_t *op)
{
    return strcmp(op->kind, "get") == 0 ? "from" : "to";
}

/* Keeps the first failure (the one the caller will read) with the op and the peer. */
static void ucx_note_failure(ucx_op_t *op, ucs_status_t status)
{
    wsync_rma_t *ctx = op->ctx;
    wsync_rma_peer_t *peer = op->peer;
    if (ctx->err != WSYNC_OK)
        return;
    ctx->err = peer->failed != UCS_OK ? WSYNC_ERR_PEER_LOST : ucx_map_status(status);
    if (strcmp(op->kind, "flush") == 0)
        snprintf(ctx->err_text, sizeof(ctx->err_text),
                 "ucx flush of puts to peer %s failed: %s%s%s", peer->label,
                 ucs_status_string(status), peer->failed != UCS_OK ? "; the peer is lost: " : "",
                 peer->failed != UCS_OK ? ucs_status_string(peer->failed) : "");
    else
        snprintf(ctx->err_text, sizeof(ctx->err_text),
                 "ucx %s of %zu bytes at remote address 0x%" PRIx64 " %s peer %s failed: %s%s%s",
                 op->kind, op->len, op->remote_addr, ucx_op_dir(op), peer->label,
                 ucs_status_string(status), peer->failed != UCS_OK ? "; the peer is lost: " : "",
                 peer->failed != UCS_OK ? ucs_status_string(peer->failed) : "");
}

/* Completion of a get, put or endpoint flush; runs inside ucp_worker_progress, under the lock. */
static void ucx_op_done(void *request, ucs_status_t status, void *user_data)
{
    ucx_op_t *op = user_data;
    if (status != UCS_OK)
        ucx_note_failure(op, status);
    ucx_op_untrack(op);
    ucx_op_release(op);
    ucp_request_free(request);
}

/* What nbx returned: NULL (done at once), an error, or a request whose callback will come. The
 * op is tracked before posting, so a callback that runs early finds consistent counters. */
static ucs_status_t ucx_posted(ucx_op_t *op, ucs_status_ptr_t req)
{
    if (UCS_PTR_IS_PTR(req))
        return UCS_OK;
    if (!op->done) {
        ucx_op_untrack(op);
        ucx_op_release(op);
    }
    return UCS_PTR_STATUS(req);
}

/* Drives the worker until nothing is outstanding or ms pass. Lock held. */
static void ucx_settle(wsync_rma_t *ctx, int ms)
{
    int64_t deadline = wsync_deadline_in(ms);
    ucx_backoff_t b = {0, 0};
    while (ctx->outstanding > 0 && wsync_now_ms() < deadline) {
        if (ucp_worker_progress(ctx->worker) != 0)
            b = (ucx_backoff_t){0, 0};
        else
            ucx_nap(&b, deadline);
    }
}

/* Closes an endpoint; FORCE completes whatever it still has in flight with UCS_ERR_CANCELED.
 * Waits (bounded) for the close to finish. Lock held. */
static void ucx_ep_close(wsync_rma_peer_t *peer, int force)
{
    wsync_rma_t *ctx = peer->ctx;
    if (peer->ep == NULL)
        return;
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
        .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0,
    };
    ucs_status_ptr_t req = ucp_ep_close_nbx(peer->ep, &p);
    peer->ep = NULL;
    if (!UCS_PTR_IS_PTR(req))
        return;
    int64_t deadline = wsync_deadline_in(UCX_SETTLE_MS);
    ucx_backoff_t b = {0, 0};
    while (ucp_request_check_status(req) == UCS_INPROGRESS && wsync_now_ms() < deadline) {
        if (ucp_worker_progress(ctx->worker) != 0)
            b = (ucx_backoff_t){0, 0};
        else
            ucx_nap(&b, deadline);
    }
    if (ucp_request_check_status(req) == UCS_INPROGRESS)
        WSYNC_LOG_W("ucx: closing the endpoint to %s did not finish in %d ms; left to UCX",
                    peer->label, UCX_SETTLE_MS);
    ucp_request_free(req);
}

/* ---- server thread --------------------------------------------------------------------------- */

static void *ucx_server_main(void *arg)
{
    wsync_rma_t *ctx = arg;
    ucx_backoff_t b = {0, 0};
    while (!atomic_load(&ctx->server_stop)) {
        if (atomic_load(&ctx->waiters) > 0) {
            sched_yield();
            continue;
        }
        pthread_mutex_lock(&ctx->lock);
        unsigned n = ucp_worker_progress(ctx->worker);
        pthread_mutex_unlock(&ctx->lock);
        if (n != 0)
            b = (ucx_backoff_t){0, 0};
        else
            ucx_nap(&b, INT64_MAX);
    }
    return NULL;
}

/* Lock held on entry and exit; dropped while joining, since the thread takes it. */
static void ucx_server_stop(wsync_rma_t *ctx)
{
    if (!ctx->server_running)
        return;
    atomic_store(&ctx->server_stop, 1);
    ucx_unlock(ctx);
    pthread_join(ctx->server, NULL);
    ucx_lock(ctx);
    ctx->server_running = 0;
}

/* ---- context --------------------------------------------------------------------------------- */

/* "tcp/lo,tcp/eth0,..." from the context's resource list, for the open() info line. */
static void ucx_describe_resources(ucp_context_h context, char *out, size_t out_len)
{
    char *text = NULL;
    size_t text_len = 0, pos = 0;
    out[0] = '\0';
    FILE *f = open_memstream(&text, &text_len);
    if (f == NULL)
        return;
    ucp_context_print_info(context, f);
    fclose(f);
    /* lines read "#      resource 1  :  md 1  dev 1  flags -- tcp/lo" */
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char *dash = strstr(line, "-- ");
        if (strstr(line, "resource") == NULL || dash == NULL)
            continue;
        int n = snprintf(out + pos, out_len - pos, "%s%s", pos ? "," : "", dash + 3);
        if (n < 0 || (size_t)n >= out_len - pos)
            break;
        pos += (size_t)n;
    }
    free(text);
}

static void ucx_close(wsync_rma_t *ctx);

static wsync_status_t ucx_open(const char *hint, char *info, size_t info_len, wsync_rma_t **out)
{
    unsigned major = 0, minor = 0, release = 0;
    ucp_config_t *config = NULL;
    ucs_status_t st;
    wsync_status_t ret;

    if (out == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "ucx open: no output pointer");
    if (hint != NULL && hint[0] == '\0')
        hint = NULL;
    ucp_get_version(&major, &minor, &release);
    wsync_rma_t *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ucx open: context");
    pthread_mutex_init(&ctx->lock, NULL);
    ctx->inflight.next = ctx->inflight.prev = &ctx->inflight;

    st = ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK) {
        ret = wsync_err(WSYNC_ERR_UNSUPPORTED, "ucx %u.%u.%u: ucp_config_read: %s", major, minor,
                        release, ucs_status_string(st));
        goto err_ctx;
    }
    if (hint != NULL && (st = ucp_config_modify(config, "TLS", hint)) != UCS_OK) {
        ret = wsync_err(WSYNC_ERR_INVALID, "ucx %u.%u.%u: transport list \"%s\" refused: %s", major,
                        minor, release, hint, ucs_status_string(st));
        goto err_config;
    }
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES,
        .features = UCP_FEATURE_RMA,
    };
    st = ucp_init(&params, config, &ctx->context);
    if (st != UCS_OK) {
        ctx->context = NULL;
        ret = wsync_err(WSYNC_ERR_UNSUPPORTED, "ucx %u.%u.%u: ucp_init with RMA over %s: %s",
                        major, minor, release, hint ? hint : "the default transports",
                        ucs_status_string(st));
        goto err_config;
    }
    ucp_config_release(config);
    config = NULL;

    ucp_worker_params_t wparams = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SERIALIZED,
    };
    st = ucp_worker_create(ctx->context, &wparams, &ctx->worker);
    if (st != UCS_OK) {
        ctx->worker = NULL;
        ret = wsync_err(WSYNC_ERR_UNSUPPORTED, "ucx: ucp_worker_create: %s",
                        ucs_status_string(st));
        goto err_ctx;
    }

    ucp_address_t *waddr = NULL;
    size_t waddr_len = 0;
    st = ucp_worker_get_address(ctx->worker, &waddr, &waddr_len);
    if (st != UCS_OK) {
        ret = wsync_err(WSYNC_ERR_TRANSPORT, "ucx: ucp_worker_get_address: %s",
                        ucs_status_string(st));
        goto err_ctx;
    }
    char host[UCX_LABEL_MAX] = "";
    gethostname(host, sizeof(host) - 1);
    snprintf(ctx->label, sizeof(ctx->label), "%.40s:%ld", host, (long)getpid());
    /* unique enough to tell contexts apart: who, when, where, and the address itself */
    uint64_t seed = wsync_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)ctx;
    ctx->id = XXH3_64bits_withSeed(waddr, waddr_len, seed) ^
              XXH3_64bits(ctx->label, strlen(ctx->label));
    ctx->addr_len = UCX_ADDR_HDR + waddr_len;
    ctx->addr = calloc(1, ctx->addr_len);
    if (ctx->addr == NULL || waddr_len > UINT32_MAX) {
        ucp_worker_release_address(ctx->worker, waddr);
        ret = wsync_err(WSYNC_ERR_NOMEM, "ucx: worker address of %zu bytes", waddr_len);
        goto err_ctx;
    }
    put_le32(ctx->addr + 8, UCX_ADDR_MAGIC);
    put_le32(ctx->addr + 12, (uint32_t)waddr_len);
    put_le64(ctx->addr + 16, ctx->id);
    memcpy(ctx->addr + UCX_HDR, ctx->label, strlen(ctx->label));
    memcpy(ctx->addr + UCX_ADDR_HDR, waddr, waddr_len);
    blob_seal(ctx->addr, ctx->addr_len);
    ucp_worker_release_address(ctx->worker, waddr);

    if (info != NULL && info_len > 0) {
        char res[512];
        ucx_describe_resources(ctx->context, res, sizeof(res));
        snprintf(info, info_len, "ucx %u.%u.%u over %s (%s)", major, minor, release,
                 res[0] ? res : "?", hint ? hint : "default transports");
    }
    *out = ctx;
    return WSYNC_OK;

err_config:
    if (config != NULL)
        ucp_config_release(config);
err_ctx:
    ucx_close(ctx);
    return ret;
}

static void ucx_close(wsync_rma_t *ctx)
{
    if (ctx == NULL)
        return;
    ucx_lock(ctx);
    ucx_server_stop(ctx);
    if (ctx->worker != NULL) {
        /* peers the caller left connected: their ops are cancelled, then the peers freed */
        for (wsync_rma_peer_t *p = ctx->peers; p != NULL; p = p->next)
            ucx_ep_close(p, 1);
        ucx_settle(ctx, UCX_SETTLE_MS);
        while (ctx->peers != NULL) {
            wsync_rma_peer_t *p = ctx->peers;
            ctx->peers = p->next;
            if (p->outstanding == 0)
                free(p);
        }
        if (ctx->outstanding != 0)
            WSYNC_LOG_W("ucx: %zu operations were still in flight at close", ctx->outstanding);
        ucp_worker_destroy(ctx->worker);
    }
    if (ctx->nmrs != 0)
        WSYNC_LOG_W("ucx: %u regions were still registered at close", ctx->nmrs);
    if (ctx->context != NULL)
        ucp_cleanup(ctx->context);
    while (ctx->free_ops != NULL) {
        ucx_op_t *op = ctx->free_ops;
        ctx->free_ops = op->next;
        free(op);
    }
    ucx_unlock(ctx);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx->addr);
    free(ctx);
}

static wsync_status_t ucx_address(wsync_rma_t *ctx, void *buf, size_t *len)
{
    if (ctx == NULL || buf == NULL || len == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "ucx address: NULL argument");
    if (*len < ctx->addr_len)
        return wsync_err(WSYNC_ERR_RANGE, "ucx address: %zu bytes needed, buffer holds %zu",
                         ctx->addr_len, *len);
    memcpy(buf, ctx->addr, ctx->addr_len);
    *len = ctx->addr_len;
    return WSYNC_OK;
}

/* ---- peers ----------------------------------------------------------------------------------- */

/* UCX's error handler: the endpoint is dead (its ops fail with this status). Under the lock. */
static void ucx_on_peer_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    wsync_rma_peer_t *peer = arg;
    (void)ep;
    if (peer->failed == UCS_OK)
        peer->failed = status;
    WSYNC_LOG_I("ucx: peer %s failed: %s", peer->label, ucs_status_string(status));
}

static wsync_status_t ucx_connect(wsync_rma_t *ctx, const void *addr, size_t len,
                                  wsync_rma_peer_t **out)
{
    uint32_t n = 0;
    if (ctx == NULL || out == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "ucx connect: NULL argument");
    const char *why = blob_check(addr, len, UCX_ADDR_MAGIC, UCX_ADDR_HDR, &n);
    if (why != NULL)
        return wsync_err(WSYNC_ERR_INVALID, "ucx connect: address blob of %zu bytes: %s", len,
                         why);
    wsync_rma_peer_t *peer = calloc(1, sizeof(*peer));
    void *waddr = malloc(n); /* aligned copy for UCX */
    if (peer == NULL || waddr == NULL) {
        free(peer);
        free(waddr);
        return wsync_err(WSYNC_ERR_NOMEM, "ucx connect");
    }
    const uint8_t *b = addr;
    peer->ctx = ctx;
    peer->remote_id = get_le64(b + 16);
    memcpy(peer->label, b + UCX_HDR, UCX_LABEL_MAX - 1);
    memcpy(waddr, b + UCX_ADDR_HDR, n);

    /* PEER mode: a vanished peer fails its endpoint (and ops) instead of leaving them pending */
    ucp_ep_params_t params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = waddr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = ucx_on_peer_error, .arg = peer},
    };
    ucx_lock(ctx);
    ucs_status_t st = ucp_ep_create(ctx->worker, &params, &peer->ep);
    if (st == UCS_OK) {
        peer->next = ctx->peers;
        ctx->peers = peer;
    }
    ucx_unlock(ctx);
    free(waddr);
    if (st != UCS_OK) {
        /* UCX 1.13's shared-memory transports cannot detect a dead peer, so mode PEER finds
         * them unreachable; UCX logs which transport lacked what */
        wsync_status_t ret = wsync_err(
            ucx_map_status(st), "ucx connect to peer %s: ucp_ep_create: %s%s", peer->label,
            ucs_status_string(st),
            st == UCS_ERR_UNREACHABLE ? " (no transport in the list reaches it with peer "
                                        "failure detection)" : "");
        free(peer);
        return ret;
    }
    *out = peer;
    return WSYNC_OK;
}

static void ucx_disconnect(wsync_rma_peer_t *peer)
{
    if (peer == NULL)
        return;
    wsync_rma_t *ctx = peer->ctx;
    ucx_lock(ctx);
    for (wsync_rma_peer_t **pp = &ctx->peers; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == peer) {
            *pp = peer->next;
            break;
        }
    }
    /* a flushing close is polite (the remote learns at once) but needs a live peer */
    ucx_ep_close(peer, peer->failed != UCS_OK || peer->outstanding > 0);
    if (peer->outstanding > 0) {
        ucx_settle(ctx, UCX_SETTLE_MS);
        if (peer->outstanding > 0) {
            peer->detached = 1; /* the last completion frees it */
            peer = NULL;
        }
    }
    free(peer);
    ucx_unlock(ctx);
}

/* ---- memory ---------------------------------------------------------------------------------- */

static wsync_status_t ucx_reg(wsync_rma_t *ctx, void *base, size_t len, wsync_rma_mr_t **out,
                              void *rkey, size_t *rkey_len)
{
    if (ctx == NULL || base == NULL || len == 0 || out == NULL || rkey == NULL ||
        rkey_len == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "ucx reg: NULL argument or empty region");
    wsync_rma_mr_t *mr = calloc(1, sizeof(*mr));
    if (mr == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ucx reg");
    mr->ctx = ctx;

    wsync_status_t ret;
    void *packed = NULL;
    size_t packed_len = 0;
    ucp_mem_map_params_t params = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
        .address = base,
        .length = len,
    };
    ucx_lock(ctx);
    ucs_status_t st = ucp_mem_map(ctx->context, &params, &mr->memh);
    if (st != UCS_OK) {
        ret = wsync_err(ucx_map_status(st), "ucx reg of %zu bytes at %p: ucp_mem_map: %s", len,
                        base, ucs_status_string(st));
        goto err_mr;
    }
    st = ucp_rkey_pack(ctx->context, mr->memh, &packed, &packed_len);
    if (st != UCS_OK) {
        ret = wsync_err(WSYNC_ERR_TRANSPORT, "ucx reg of %zu bytes at %p: ucp_rkey_pack: %s", len,
                        base, ucs_status_string(st));
        goto err_map;
    }
    size_t need = UCX_KEY_HDR + packed_len;
    if (need > *rkey_len || packed_len > UINT32_MAX) {
        ret = wsync_err(WSYNC_ERR_RANGE, "ucx reg of %zu bytes at %p: the key needs %zu bytes, "
                        "the buffer holds %zu", len, base, need, *rkey_len);
        goto err_packed;
    }
    uint8_t *b = rkey;
    memset(b, 0, UCX_KEY_HDR);
    put_le32(b + 8, UCX_KEY_MAGIC);
    put_le32(b + 12, (uint32_t)packed_len);
    put_le64(b + 16, ctx->id);
    put_le64(b + UCX_HDR, (uint64_t)(uintptr_t)base);
    put_le64(b + UCX_HDR + 8, (uint64_t)len);
    memcpy(b + UCX_KEY_HDR, packed, packed_len);
    blob_seal(b, need);
    ucp_rkey_buffer_release(packed);

    /* emulated RMA (tcp, shared memory without CMA) is served by this worker: keep it turning */
    if (!ctx->server_running) {
        atomic_store(&ctx->server_stop, 0);
        if (pthread_create(&ctx->server, NULL, ucx_server_main, ctx) == 0)
            ctx->server_running = 1;
        else
            WSYNC_LOG_W("ucx: no server thread: peers' reads of this process's regions over "
                        "emulated RMA progress only inside its own flush calls");
    }
    ctx->nmrs++;
    ucx_unlock(ctx);
    *rkey_len = need;
    *out = mr;
    return WSYNC_OK;

err_packed:
    ucp_rkey_buffer_release(packed);
err_map:
    ucp_mem_unmap(ctx->context, mr->memh);
err_mr:
    ucx_unlock(ctx);
    free(mr);
    return ret;
}

static void ucx_dereg(wsync_rma_mr_t *mr)
{
    if (mr == NULL)
        return;
    wsync_rma_t *ctx = mr->ctx;
    ucx_lock(ctx);
    ucs_status_t st = ucp_mem_unmap(ctx->context, mr->memh);
    if (st != UCS_OK)
        WSYNC_LOG_W("ucx: ucp_mem_unmap: %s", ucs_status_string(st));
    if (--ctx->nmrs == 0)
        ucx_server_stop(ctx);
    ucx_unlock(ctx);
    free(mr);
}

static wsync_status_t ucx_rkey_import(wsync_rma_peer_t *peer, const void *blob, size_t len,
                                      wsync_rma_rkey_t **out)
{
    uint32_t n = 0;
    if (peer == NULL || out == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "ucx rkey_import: NULL argument");
    /* ucp_ep_rkey_unpack takes no length and trusts the bytes: check them first */
    const char *why = blob_check(blob, len, UCX_KEY_MAGIC, UCX_KEY_HDR, &n);
    if (why != NULL)
        return wsync_err(WSYNC_ERR_INVALID, "ucx rkey_import from peer %s: key blob of %zu bytes: "
                         "%s", peer->label, len, why);
    const uint8_t *b = blob;
    if (get_le64(b + 16) != peer->remote_id)
        return wsync_err(WSYNC_ERR_INVALID, "ucx rkey_import from peer %s: the key was made by "
                         "another context (id %016" PRIx64 ", the peer's is %016" PRIx64 ")",
                         peer->label, get_le64(b + 16), peer->remote_id);
    wsync_rma_rkey_t *rk = calloc(1, sizeof(*rk));
    void *packed = malloc(n); /* aligned copy for UCX */
    if (rk == NULL || packed == NULL) {
        free(rk);
        free(packed);
        return wsync_err(WSYNC_ERR_NOMEM, "ucx rkey_import");
    }
    memcpy(packed, b + UCX_KEY_HDR, n);
    rk->ctx = peer->ctx;
    rk->peer = peer;
    rk->base = get_le64(b + UCX_HDR);
    rk->len = get_le64(b + UCX_HDR + 8);

    wsync_status_t ret = WSYNC_OK;
    ucx_lock(peer->ctx);
    if (peer->ep == NULL || peer->failed != UCS_OK) {
        ret = wsync_err(WSYNC_ERR_PEER_LOST, "ucx rkey_import from peer %s: the peer is lost (%s)",
                        peer->label, peer->abandoned ? peer->abandoned
                                                     : ucs_status_string(peer->failed));
    } else {
        ucs_status_t st = ucp_ep_rkey_unpack(peer->ep, packed, &rk->rkey);
        if (st != UCS_OK)
            ret = wsync_err(ucx_map_status(st), "ucx rkey_import from peer %s: "
                            "ucp_ep_rkey_unpack of %u bytes: %s", peer->label, n,
                            ucs_status_string(st));
    }
    ucx_unlock(peer->ctx);
    free(packed);
    if (ret != WSYNC_OK) {
        free(rk);
        return ret;
    }
    *out = rk;
    return WSYNC_OK;
}

static void ucx_rkey_free(wsync_rma_rkey_t *rk)
{
    if (rk == NULL)
        return;
    ucx_lock(rk->ctx);
    ucp_rkey_destroy(rk->rkey);
    ucx_unlock(rk->ctx);
    free(rk);
}

/* ---- data path ------------------------------------------------------------------------------- */

static wsync_status_t ucx_post(wsync_rma_peer_t *peer, wsync_rma_rkey_t *rk, int is_get,
                               uint64_t raddr, void *buf, size_t len)
{
    const char *kind = is_get ? "get" : "put", *dir = is_get ? "from" : "to";
    if (peer == NULL || rk == NULL || (buf == NULL && len > 0))
        return wsync_err(WSYNC_ERR_INVALID, "ucx %s: NULL argument", kind);
    if (rk->peer != peer)
        return wsync_err(WSYNC_ERR_INVALID, "ucx %s of %zu bytes %s peer %s: the key was "
                         "imported for another peer", kind, len, dir, peer->label);
    /* UCX does not check this over tcp or shared memory (see the top of this file) */
    if (raddr < rk->base || len > rk->len || raddr - rk->base > rk->len - len)
        return wsync_err(WSYNC_ERR_RANGE, "ucx %s of %zu bytes at remote address 0x%" PRIx64
                         " %s peer %s: outside the registered region [0x%" PRIx64 ", 0x%" PRIx64
                         ")", kind, len, raddr, dir, peer->label, rk->base, rk->base + rk->len);
    if (len == 0)
        return WSYNC_OK;

    wsync_rma_t *ctx = peer->ctx;
    wsync_status_t ret = WSYNC_OK;
    ucx_lock(ctx);
    if (peer->ep == NULL || peer->failed != UCS_OK) {
        ret = wsync_err(WSYNC_ERR_PEER_LOST, "ucx %s of %zu bytes at remote address 0x%" PRIx64
                        " %s peer %s: the peer is lost (%s)", kind, len, raddr, dir, peer->label,
                        peer->abandoned ? peer->abandoned : ucs_status_string(peer->failed));
        goto out;
    }
    ucx_op_t *op = ucx_op_alloc(ctx);
    if (op == NULL) {
        ret = wsync_err(WSYNC_ERR_NOMEM, "ucx %s", kind);
        goto out;
    }
    op->peer = peer;
    op->kind = kind;
    op->remote_addr = raddr;
    op->len = len;
    ucx_op_track(op);
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = ucx_op_done,
        .user_data = op,
    };
    ucs_status_ptr_t req = is_get ? ucp_get_nbx(peer->ep, buf, len, raddr, rk->rkey, &param)
                                  : ucp_put_nbx(peer->ep, buf, len, raddr, rk->rkey, &param);
    ucs_status_t st = ucx_posted(op, req);
    if (st != UCS_OK) {
        ret = wsync_err(ucx_map_status(st), "ucx %s of %zu bytes at remote address 0x%" PRIx64
                        " %s peer %s: ucp_%s_nbx: %s", kind, len, raddr, dir, peer->label, kind,
                        ucs_status_string(st));
        goto out;
    }
    if (!is_get)
        peer->unflushed = 1;
out:
    ucx_unlock(ctx);
    return ret;
}

static wsync_status_t ucx_get(wsync_rma_peer_t *peer, wsync_rma_rkey_t *rkey,
                              uint64_t remote_addr, void *dst, size_t len)
{
    return ucx_post(peer, rkey, 1, remote_addr, dst, len);
}

static wsync_status_t ucx_put(wsync_rma_peer_t *peer, wsync_rma_rkey_t *rkey,
                              uint64_t remote_addr, const void *src, size_t len)
{
    /* UCX takes a non-const buffer for both directions; a put only reads it */
    return ucx_post(peer, rkey, 0, remote_addr, (void *)(uintptr_t)src, len);
}

/* Puts complete locally (source reusable) before they land: an endpoint flush waits for the
 * remote side, so that a following get, or the owner, sees the bytes. Lock held. */
static void ucx_flush_puts(wsync_rma_t *ctx)
{
    for (wsync_rma_peer_t *p = ctx->peers; p != NULL; p = p->next) {
        if (!p->unflushed || p->ep == NULL || p->failed != UCS_OK)
            continue;
        p->unflushed = 0;
        ucx_op_t *op = ucx_op_alloc(ctx);
        if (op == NULL) {
            if (ctx->err == WSYNC_OK) {
                ctx->err = WSYNC_ERR_NOMEM;
                snprintf(ctx->err_text, sizeof(ctx->err_text), "ucx flush of puts to peer %s",
                         p->label);
            }
            continue;
        }
        op->peer = p;
        op->kind = "flush";
        ucx_op_track(op);
        ucp_request_param_t param = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = ucx_op_done,
            .user_data = op,
        };
        ucs_status_ptr_t req = ucp_ep_flush_nbx(p->ep, &param);
        if (UCS_PTR_IS_ERR(req) && !op->done) {
            ucx_note_failure(op, UCS_PTR_STATUS(req));
            ucx_op_untrack(op);
            ucx_op_release(op);
        } else {
            ucx_posted(op, req);
        }
    }
}

/* Gives up on what is still in flight at a deadline: closing an endpoint by force cancels its
 * ops, so that no buffer is written after flush returns. Lock held. */
static void ucx_abandon(wsync_rma_t *ctx)
{
    if (ctx->err == WSYNC_OK) {
        const ucx_op_t *op = ctx->inflight.next;
        ctx->err = WSYNC_ERR_TIMEOUT;
        if (strcmp(op->kind, "flush") == 0)
            snprintf(ctx->err_text, sizeof(ctx->err_text), "ucx flush: %zu operations still in "
                     "flight at the deadline, among them the flush of puts to peer %s",
                     ctx->outstanding, op->peer->label);
        else
            snprintf(ctx->err_text, sizeof(ctx->err_text), "ucx flush: %zu operations still in "
                     "flight at the deadline, the oldest a %s of %zu bytes at remote address 0x%"
                     PRIx64 " %s peer %s", ctx->outstanding, op->kind, op->len, op->remote_addr,
                     ucx_op_dir(op), op->peer->label);
    }
    for (wsync_rma_peer_t *p = ctx->peers; p != NULL; p = p->next) {
        if (p->outstanding == 0)
            continue;
        WSYNC_LOG_W("ucx: %zu operations with peer %s still in flight at a deadline: closing "
                    "the endpoint", p->outstanding, p->label);
        p->abandoned = "closed after operations outlived a flush deadline";
        ucx_ep_close(p, 1);
    }
    ucx_settle(ctx, UCX_SETTLE_MS);
    if (ctx->outstanding > 0)
        WSYNC_LOG_E("ucx: %zu operations could not be cancelled; their buffers may still be "
                    "written", ctx->outstanding);
}

static wsync_status_t ucx_flush(wsync_rma_t *ctx, int64_t deadline_ms)
{
    if (ctx == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "ucx flush: NULL context");
    ucx_lock(ctx);
    ucx_flush_puts(ctx);
    /* on a failure, keep going until the rest settles too: flush returns with nothing in flight */
    ucx_backoff_t b = {0, 0};
    while (ctx->outstanding > 0) {
        if (ucp_worker_progress(ctx->worker) != 0) {
            b = (ucx_backoff_t){0, 0};
        } else {
            if (wsync_now_ms() >= deadline_ms)
                break;
            ucx_unlock(ctx);
            ucx_nap(&b, deadline_ms);
            ucx_lock(ctx);
        }
        if (wsync_now_ms() >= deadline_ms)
            break;
    }
    if (ctx->outstanding > 0)
        ucx_abandon(ctx);
    wsync_status_t ret = ctx->err;
    if (ret != WSYNC_OK)
        wsync_err(ret, "%s", ctx->err_text);
    ctx->err = WSYNC_OK;
    ucx_unlock(ctx);
    return ret;
}

static const wsync_rma_ops_t ucx_rma_ops = {
    .name = "ucx",
    .open = ucx_open,
    .close = ucx_close,
    .address = ucx_address,
    .connect = ucx_connect,
    .disconnect = ucx_disconnect,
    .reg = ucx_reg,
    .dereg = ucx_dereg,
    .rkey_import = ucx_rkey_import,
    .rkey_free = ucx_rkey_free,
    .get = ucx_get,
    .put = ucx_put,
    .flush = ucx_flush,
};

const wsync_rma_ops_t *wsync_rma_ucx(void)
{
    return &ucx_rma_ops;
}

#define UCX_COMPILED 1
#define UCX_CAPS (WSYNC_CAP_HOST_MEM | WSYNC_CAP_RMA | WSYNC_CAP_CROSS_NODE | WSYNC_CAP_SAME_NODE)
/* one 100 Gb/s RDMA NIC; over TCP it is far less (about 1 GB/s on loopback) */
#define UCX_EST_GBPS 12.0
#else
static int ucx_probe(char *reason, size_t reason_len)
{
    snprintf(reason, reason_len,
             "not compiled in: configure with -DWSYNC_WITH_UCX=ON (needs UCX headers and "
             "pkg-config file: libucx-dev)");
    return 0;
}

const wsync_rma_ops_t *wsync_rma_ucx(void)
{
    return NULL;
}

#define UCX_COMPILED 0
#define UCX_CAPS 0u
#define UCX_EST_GBPS 0.0
#endif

const wsync_transport_ops_t wsync_transport_ucx = {
    .name = "ucx",
    .compiled = UCX_COMPILED,
    .caps = UCX_CAPS,
    .est_gbps = UCX_EST_GBPS,
    .probe = ucx_probe,
};
