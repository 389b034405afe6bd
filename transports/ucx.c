/* ucx transport: one-sided RMA (get/put) between processes through UCP, for the store scheme
 * (the contract is transports/rma.h). One wsync_rma_t is one UCP context with one worker; peers
 * are endpoints created from a worker address in error mode PEER; a region is a ucp_mem_map with
 * its packed rkey. Gets and puts are counted until flush; they are ucp_get_nbx/ucp_put_nbx where
 * an RDMA NIC serves them (an InfiniBand rc or dc lane to the peer), else active messages that
 * this file serves itself (below).
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
 *    memory; tcp with 1.16), while 1.13 over tcp ignores the key altogether;
 *  - the owner answers a get from inside the handler of the reader's request, and a failure to
 *    send that answer (the reader died after asking) is ucs_fatal, "unexpected error: Endpoint
 *    timeout" (ucp_get_req_handler, 1.13): it aborts the *owner*, whatever the error mode (the
 *    answering endpoint is in mode PEER like ours) or UCX_* setting. Puts are acknowledged the
 *    same way. No transport here avoids it: CMA is never taken for UCP's RMA lanes (it has
 *    zero-copy only), and mode PEER leaves only tcp on one node.
 * So this file checks what UCX does not: addresses and keys travel in framed blobs (magic, sizes,
 * the owner context's id, the region's bounds, an xxh3 of it all), rkey_import rejects a blob that
 * is malformed, corrupted or from another context, and get/put refuse a range outside the region
 * before posting. This guards against bugs and corruption, not against a hostile peer, which can
 * forge a blob. Also, an owner must not dereg a region that readers may still read.
 * Nor does it use UCX's emulated RMA: to a peer with no NIC lane, a get is an active message
 * (with the reply flag) that the owner checks against its own registrations and answers with the
 * bytes; a put carries its bytes, which the owner checks, lands and acknowledges. A failed send
 * of an active message is an ordinary error, so a reply to a dead reader just fails. Bytes go
 * eager up to UCX_AM_EAGER_MAX and by rendezvous beyond, straight between the region and the
 * reader's buffer (1.13 also aborts on a failed multi-fragment eager send over tcp: "comp->count
 * > 0"). A rendezvous holds a request at the owner until the reader takes the bytes, and
 * ucp_worker_destroy asserts on one left over: dereg and close end those of a reader that stopped
 * reading by force-closing the endpoint UCX made to it (the request's reply endpoint).
 *
 * The owner's worker must make progress to serve, yet an owner only registers and waits. So once
 * a region is registered, a server thread drives the worker (napping when idle) until the last
 * region is gone; every call into UCX is made under the context's lock, which is why the worker
 * is in UCS_THREAD_MODE_SERIALIZED (one thread at a time) rather than SINGLE.
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
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM,
    };
    ucp_context_h context = NULL;
    st = ucp_init(&params, config, &context);
    ucp_config_release(config);
    if (st != UCS_OK) {
        snprintf(reason, reason_len, "UCX %u.%u.%u: ucp_init with RMA and AM failed: %s", major,
                 minor, release, ucs_status_string(st));
        return 0;
    }
    /* which path the store's CUDA shards take here (schemes/store.c): say it in wsync-info */
    ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    int cuda = ucp_context_query(context, &attr) == UCS_OK &&
               (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
    ucp_cleanup(context);
    snprintf(reason, reason_len, "UCX %u.%u.%u: initialised with RMA and AM; store CUDA memory: "
             "%s", major, minor, release,
             cuda ? "registered with UCX (memory type CUDA)"
                  : "staged through pinned host buffers (this UCX has no CUDA memory type)");
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

/* ---- active messages --------------------------------------------------------------------------
 * Gets and puts to a peer with no NIC lane (see the top of this file). Headers, little-endian:
 * request, to the owner:  [0,4) magic  [4,8) UCX_GET or UCX_PUT  [8,16) token
 *                         [16,24) remote address  [24,32) length; a put carries its bytes
 * reply, to the reader:   [0,4) magic  [4,8) ucs_status_t  [8,16) token; a get's carries the bytes
 * The token names the op at the reader (ctx->ops index and use count), so that a reply to an op
 * given up on finds nothing and writes nothing. */
#define UCX_AM_REQ 1
#define UCX_AM_REP 2
#define UCX_REQ_MAGIC 0x51415357u /* "WSAQ" */
#define UCX_REP_MAGIC 0x50415357u /* "WSAP" */
#define UCX_REQ_LEN 32
#define UCX_REP_LEN 16
#define UCX_GET 1u
#define UCX_PUT 2u
/* bytes sent eager, in one fragment of UCX's tcp (8 KiB); more go by rendezvous */
#define UCX_AM_EAGER_MAX 4096

/* ---- objects --------------------------------------------------------------------------------- */

/* One posted operation, from post until its outcome is known and UCX holds none of its requests
 * (so that nothing uses its buffer, or its header, after flush returns). */
typedef struct ucx_op {
    struct ucx_op *prev, *next;     /* in ctx->inflight, or (next only) the free list */
    wsync_rma_t *ctx;
    wsync_rma_peer_t *peer;
    const char *kind;               /* "get", "put" or "flush" */
    uint64_t remote_addr;
    size_t len;
    void *buf;                      /* where an active-message get lands */
    uint32_t idx, gen;              /* ctx->ops[idx]; gen counts its uses: the token */
    unsigned nreqs;                 /* UCX requests of this op not yet completed */
    int am;                         /* an active message: it ends with the owner's reply */
    int waiting;                    /* ... which it still awaits */
    int settled;                    /* its outcome is known (and noted, if a failure) */
    uint8_t hdr[UCX_REQ_LEN];       /* an active message's header: UCX reads it until sent */
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
    ucx_op_t **ops;                 /* every op ever made, by idx: [nops] of [ops_cap] */
    uint32_t nops, ops_cap;
    size_t outstanding;
    wsync_status_t err;             /* first failure since the last flush, and its sentence */
    char err_text[640];
    wsync_rma_mr_t *mrs;            /* registered regions: what peers' requests may touch */
    unsigned nmrs;
    struct ucx_serve *serving;      /* peers' requests UCX still holds work of */
    size_t nserving;
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
    int am;                         /* no NIC lane: gets and puts are active messages */
    int unflushed;                  /* puts posted since the last flush */
    int detached;                   /* disconnected while ops were pending: freed by the last */
};

struct wsync_rma_mr {
    wsync_rma_t *ctx;
    wsync_rma_mr_t *next;           /* in ctx->mrs */
    ucp_mem_h memh;
    ucs_memory_type_t mem_type;     /* host, or CUDA (replies read it with cuda_copy) */
    uint64_t base, len;
    size_t serving;                 /* requests whose bytes UCX still moves from or to it */
    int detached;                   /* deregistered while serving: freed by the last of them */
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
/* How long dereg and close let peers take what they asked for before cutting them off: a reader
 * that reads answers a rendezvous within milliseconds, one that stopped never does. */
#define UCX_SERVE_WAIT_MS 200

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
    if (st == UCS_ERR_INVALID_ADDR) /* an owner's answer: no region of its own there */
        return WSYNC_ERR_RANGE;
    if (st == UCS_ERR_NO_MEMORY)
        return WSYNC_ERR_NOMEM;
    return WSYNC_ERR_TRANSPORT;
}

/* ---- operations in flight -------------------------------------------------------------------- */

static ucx_op_t *ucx_op_alloc(wsync_rma_t *ctx)
{
    ucx_op_t *op = ctx->free_ops;
    if (op != NULL) {
        ctx->free_ops = op->next;
    } else {
        if (ctx->nops == ctx->ops_cap) {
            uint32_t cap = ctx->ops_cap ? 2 * ctx->ops_cap : 64;
            ucx_op_t **ops = realloc(ctx->ops, cap * sizeof(*ops));
            if (ops == NULL)
                return NULL;
            ctx->ops = ops;
            ctx->ops_cap = cap;
        }
        if ((op = calloc(1, sizeof(*op))) == NULL)
            return NULL;
        op->idx = ctx->nops;
        ctx->ops[ctx->nops++] = op;
    }
    uint32_t idx = op->idx, gen = op->gen + 1;
    memset(op, 0, sizeof(*op));
    op->idx = idx;
    op->gen = gen;
    op->ctx = ctx;
    return op;
}

static void ucx_op_release(ucx_op_t *op)
{
    op->waiting = 0; /* a late reply finds nothing */
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
}

/* The op a reply's token names, if it still awaits one. */
static ucx_op_t *ucx_op_find(wsync_rma_t *ctx, uint64_t token)
{
    uint32_t idx = (uint32_t)token, gen = (uint32_t)(token >> 32);
    if (idx >= ctx->nops || ctx->ops[idx]->gen != gen || !ctx->ops[idx]->waiting)
        return NULL;
    return ctx->ops[idx];
}

static const char *ucx_op_dir(const ucx_op_t *op)
{
    return strcmp(op->kind, "get") == 0 ? "from" : "to";
}

/* Keeps the first failure (the one the caller will read) with the op and the peer. */
static void ucx_note_failure(ucx_op_t *op, ucs_status_t status, const char *detail)
{
    wsync_rma_t *ctx = op->ctx;
    wsync_rma_peer_t *peer = op->peer;
    if (ctx->err != WSYNC_OK)
        return;
    ctx->err = peer->failed != UCS_OK ? WSYNC_ERR_PEER_LOST : ucx_map_status(status);
    const char *lost = peer->failed != UCS_OK ? "; the peer is lost: " : "";
    const char *why = peer->failed != UCS_OK ? ucs_status_string(peer->failed) : "";
    if (strcmp(op->kind, "flush") == 0)
        snprintf(ctx->err_text, sizeof(ctx->err_text), "ucx flush of puts to peer %s failed: "
                 "%s%s%s", peer->label, ucs_status_string(status), lost, why);
    else
        snprintf(ctx->err_text, sizeof(ctx->err_text),
                 "ucx %s of %zu bytes at remote address 0x%" PRIx64 " %s peer %s failed: %s%s%s%s",
                 op->kind, op->len, op->remote_addr, ucx_op_dir(op), peer->label,
                 ucs_status_string(status), detail ? detail : "", lost, why);
}

/* Records an op's outcome (the first one counts); the op leaves the books once UCX also holds
 * none of its requests, so that flush never returns while UCX may still use its buffer. Lock
 * held (callbacks run inside ucp_worker_progress, which is always called under it). */
static void ucx_op_end(ucx_op_t *op, ucs_status_t status, const char *detail)
{
    if (!op->settled) {
        op->settled = 1;
        op->waiting = 0;
        if (status != UCS_OK)
            ucx_note_failure(op, status, detail);
    }
    if (op->nreqs == 0) {
        ucx_op_untrack(op);
        ucx_op_release(op);
    }
}

/* Completion of a get, put or endpoint flush, or of the send of an active message (whose op
 * ends with the owner's reply, unless the send failed). Runs inside ucp_worker_progress. */
static void ucx_req_done(void *request, ucs_status_t status, void *user_data)
{
    ucx_op_t *op = user_data;
    ucp_request_free(request);
    op->nreqs--;
    if (status != UCS_OK || !op->am || op->settled)
        ucx_op_end(op, status, NULL);
}

/* Completion of the rendezvous that lands a get's reply. */
static void ucx_landed(void *request, ucs_status_t status, size_t length, void *user_data)
{
    ucx_op_t *op = user_data;
    (void)length; /* asked for exactly op->len, which the reply announced */
    ucp_request_free(request);
    op->nreqs--;
    ucx_op_end(op, status, NULL);
}

/* What nbx returned for an op whose request was counted before posting: a request (its callback
 * will come, or has come), NULL (done at once, no callback), or an error: nothing was posted, so
 * the op leaves the books and the caller reports the error. */
static ucs_status_t ucx_posted(ucx_op_t *op, ucs_status_ptr_t req)
{
    if (UCS_PTR_IS_PTR(req))
        return UCS_OK;
    op->nreqs--;
    if (UCS_PTR_IS_ERR(req)) {
        ucx_op_untrack(op);
        ucx_op_release(op);
        return UCS_PTR_STATUS(req);
    }
    if (!op->am)
        ucx_op_end(op, UCS_OK, NULL);
    return UCS_OK;
}

/* Ends the active-message ops that await a reply from peer: none will come (it is lost, or our
 * endpoint to it is closed). Their requests, if any, UCX completes itself. */
static void ucx_fail_waiting(wsync_rma_peer_t *peer, ucs_status_t status)
{
    wsync_rma_t *ctx = peer->ctx;
    for (ucx_op_t *op = ctx->inflight.next, *next; op != &ctx->inflight; op = next) {
        next = op->next;
        if (op->peer == peer && op->waiting)
            ucx_op_end(op, status, NULL);
    }
}

/* Drives the worker until *busy is 0 or ms pass. Lock held. */
static void ucx_settle(wsync_rma_t *ctx, const size_t *busy, int ms)
{
    int64_t deadline = wsync_deadline_in(ms);
    ucx_backoff_t b = {0, 0};
    while (*busy > 0 && wsync_now_ms() < deadline) {
        if (ucp_worker_progress(ctx->worker) != 0)
            b = (ucx_backoff_t){0, 0};
        else
            ucx_nap(&b, deadline);
    }
}

/* Closes an endpoint; FORCE completes whatever it still has in flight with UCS_ERR_CANCELED.
 * Waits (bounded) for the close to finish. Lock held. */
static void ucx_close_ep(wsync_rma_t *ctx, ucp_ep_h ep, int force, const char *label)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
        .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0,
    };
    ucs_status_ptr_t req = ucp_ep_close_nbx(ep, &p);
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
                    label, UCX_SETTLE_MS);
    ucp_request_free(req);
}

static void ucx_ep_close(wsync_rma_peer_t *peer, int force)
{
    ucp_ep_h ep = peer->ep;
    if (ep == NULL)
        return;
    peer->ep = NULL;
    ucx_fail_waiting(peer, UCS_ERR_CANCELED); /* no reply comes through a closed endpoint */
    ucx_close_ep(peer->ctx, ep, force, peer->label);
}

/* ---- active messages: the owner's side, then the reader's --------------------------------- */

static wsync_rma_mr_t *ucx_mr_find(wsync_rma_t *ctx, uint64_t addr, uint64_t len)
{
    for (wsync_rma_mr_t *mr = ctx->mrs; mr != NULL; mr = mr->next)
        if (addr >= mr->base && len <= mr->len && addr - mr->base <= mr->len - len)
            return mr;
    return NULL;
}

/* A peer's request while UCX holds work of it: its reply being sent, or a put's bytes landing. */
typedef struct ucx_serve {
    struct ucx_serve *prev, *next;  /* in ctx->serving */
    wsync_rma_t *ctx;
    ucp_ep_h ep;                    /* UCX's endpoint to the requester; NULL once closed */
    wsync_rma_mr_t *mr;             /* the region it reads or writes, until done with it */
    uint8_t hdr[UCX_REP_LEN];       /* the reply's header: UCX reads it until sent */
} ucx_serve_t;

static ucx_serve_t *ucx_serve_new(wsync_rma_t *ctx, ucp_ep_h ep, wsync_rma_mr_t *mr)
{
    ucx_serve_t *sv = calloc(1, sizeof(*sv));
    if (sv == NULL)
        return NULL;
    sv->ctx = ctx;
    sv->ep = ep;
    sv->mr = mr;
    if (mr != NULL)
        mr->serving++;
    sv->next = ctx->serving;
    if (ctx->serving != NULL)
        ctx->serving->prev = sv;
    ctx->serving = sv;
    ctx->nserving++;
    return sv;
}

static void ucx_serve_mr_done(ucx_serve_t *sv)
{
    if (sv->mr != NULL && --sv->mr->serving == 0 && sv->mr->detached)
        free(sv->mr);
    sv->mr = NULL;
}

static void ucx_serve_end(ucx_serve_t *sv)
{
    ucx_serve_mr_done(sv);
    if (sv->prev != NULL)
        sv->prev->next = sv->next;
    else
        sv->ctx->serving = sv->next;
    if (sv->next != NULL)
        sv->next->prev = sv->prev;
    sv->ctx->nserving--;
    free(sv);
}

static void ucx_reply_done(void *request, ucs_status_t status, void *user_data)
{
    if (status != UCS_OK)
        WSYNC_LOG_D("ucx: a reply to a peer failed (%s): the peer is gone or closed",
                    ucs_status_string(status));
    ucx_serve_end(user_data);
    ucp_request_free(request);
}

/* Answers on the endpoint UCX made for the requester: the status, and for a get sv->mr's bytes
 * at addr. If that peer is gone, the send fails here or in ucx_reply_done, and that is all. */
static void ucx_reply(ucx_serve_t *sv, uint64_t token, ucs_status_t st, uint64_t addr,
                      size_t len)
{
    put_le32(sv->hdr, UCX_REP_MAGIC);
    put_le32(sv->hdr + 4, (uint32_t)(int32_t)st);
    put_le64(sv->hdr + 8, token);
    if (sv->ep == NULL) { /* closed by ucx_serve_drop meanwhile */
        ucx_serve_end(sv);
        return;
    }
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_MEMORY_TYPE,
        .cb.send = ucx_reply_done,
        .user_data = sv,
        .flags = sv->mr != NULL && len > UCX_AM_EAGER_MAX ? UCP_AM_SEND_FLAG_RNDV : 0,
        .memory_type = sv->mr != NULL ? sv->mr->mem_type : UCS_MEMORY_TYPE_HOST,
    };
    ucs_status_ptr_t req = ucp_am_send_nbx(sv->ep, UCX_AM_REP, sv->hdr, UCX_REP_LEN,
                                           sv->mr != NULL ? (void *)(uintptr_t)addr : NULL,
                                           sv->mr != NULL ? len : 0, &p);
    if (!UCS_PTR_IS_PTR(req))
        ucx_serve_end(sv);
}

/* A put's bytes, landed in the region (or not): acknowledged. */
static void ucx_put_landed(void *request, ucs_status_t status, size_t length, void *user_data)
{
    ucx_serve_t *sv = user_data;
    (void)length; /* asked for exactly what the request announced */
    ucp_request_free(request);
    ucx_serve_mr_done(sv);
    ucx_reply(sv, get_le64(sv->hdr + 8), status, 0, 0);
}

/* A peer's get or put, at the owner: checked against this context's own regions (UCX's emulated
 * RMA would touch any address it is given), carried out, answered. */
static ucs_status_t ucx_on_req(void *arg, const void *header, size_t header_len, void *data,
                               size_t len, const ucp_am_recv_param_t *param)
{
    wsync_rma_t *ctx = arg;
    const uint8_t *h = header;
    int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if (header_len != UCX_REQ_LEN || get_le32(h) != UCX_REQ_MAGIC ||
        !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
        WSYNC_LOG_W("ucx: dropped a malformed request from a peer (%zu header bytes)",
                    header_len);
        if (rndv)
            ucp_am_data_release(ctx->worker, data);
        return UCS_OK;
    }
    uint32_t kind = get_le32(h + 4);
    uint64_t token = get_le64(h + 8), addr = get_le64(h + 16), n = get_le64(h + 24);
    wsync_rma_mr_t *mr = ucx_mr_find(ctx, addr, n);
    ucs_status_t st = UCS_OK;
    if (mr == NULL)
        st = UCS_ERR_INVALID_ADDR;
    else if (kind == UCX_GET ? len != 0 || rndv : kind != UCX_PUT || len != n)
        st = UCS_ERR_INVALID_PARAM;
    else if (kind == UCX_PUT && !rndv && mr->mem_type != UCS_MEMORY_TYPE_HOST)
        st = UCS_ERR_UNSUPPORTED; /* an eager put lands by memcpy: not into device memory */
    /* the region is used after this returns by a get's reply, or a rendezvous put's landing */
    ucx_serve_t *sv = ucx_serve_new(ctx, param->reply_ep,
                                    st == UCS_OK && (kind == UCX_GET || rndv) ? mr : NULL);
    if (rndv && (sv == NULL || st != UCS_OK))
        ucp_am_data_release(ctx->worker, data);
    if (sv == NULL) {
        WSYNC_LOG_E("ucx: no memory to serve a peer's request; it will time out");
        return UCS_OK;
    }
    if (st != UCS_OK || kind == UCX_GET) {
        ucx_reply(sv, token, st, addr, n);
        return UCS_OK;
    }
    if (!rndv) {
        memcpy((void *)(uintptr_t)addr, data, n);
        ucx_reply(sv, token, UCS_OK, 0, 0);
        return UCS_OK;
    }
    put_le64(sv->hdr + 8, token); /* for ucx_put_landed */
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.recv_am = ucx_put_landed,
        .user_data = sv,
    };
    ucs_status_ptr_t req = ucp_am_recv_data_nbx(ctx->worker, data, (void *)(uintptr_t)addr, n,
                                                &p);
    if (!UCS_PTR_IS_PTR(req)) {
        ucx_serve_mr_done(sv);
        ucx_reply(sv, token, UCS_PTR_STATUS(req), 0, 0);
    }
    return UCS_OK;
}

/* Closes by force UCX's endpoints to requesters still served from mr (from anything if NULL),
 * so that UCX cancels that work: those readers stopped reading, and find this owner lost. */
static void ucx_serve_drop(wsync_rma_t *ctx, const wsync_rma_mr_t *mr)
{
    for (;;) {
        ucx_serve_t *sv = ctx->serving;
        while (sv != NULL && (sv->ep == NULL || (mr != NULL && sv->mr != mr)))
            sv = sv->next;
        if (sv == NULL)
            return;
        ucp_ep_h ep = sv->ep;
        for (ucx_serve_t *q = ctx->serving; q != NULL; q = q->next)
            if (q->ep == ep)
                q->ep = NULL; /* closed once */
        wsync_rma_peer_t *peer = ctx->peers;
        while (peer != NULL && peer->ep != ep) /* UCX may have matched it with one of ours */
            peer = peer->next;
        WSYNC_LOG_W("ucx: closing the endpoint to %s, which stopped taking what it asked for",
                    peer != NULL ? peer->label : "a reader");
        if (peer != NULL) {
            peer->abandoned = "closed: it stopped taking what it asked for";
            ucx_ep_close(peer, 1);
        } else {
            ucx_close_ep(ctx, ep, 1, "a reader");
        }
    }
}

/* A reply, at the reader: a get's bytes (eager, or a rendezvous to receive straight into its
 * buffer), the end of a put, or the owner's refusal. */
static ucs_status_t ucx_on_rep(void *arg, const void *header, size_t header_len, void *data,
                               size_t len, const ucp_am_recv_param_t *param)
{
    wsync_rma_t *ctx = arg;
    const uint8_t *h = header;
    int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    ucx_op_t *op = NULL;
    if (header_len == UCX_REP_LEN && get_le32(h) == UCX_REP_MAGIC)
        op = ucx_op_find(ctx, get_le64(h + 8));
    ucs_status_t st = op != NULL ? (ucs_status_t)(int32_t)get_le32(h + 4) : UCS_OK;
    if (op != NULL && st == UCS_OK && len != (op->buf != NULL ? op->len : 0))
        st = UCS_ERR_MESSAGE_TRUNCATED;
    if (op == NULL || st != UCS_OK || !rndv) {
        if (op != NULL && st == UCS_OK && len > 0)
            memcpy(op->buf, data, len);
        if (rndv) /* not taken: UCX tells the owner */
            ucp_am_data_release(ctx->worker, data);
        if (op != NULL)
            ucx_op_end(op, st, st == UCS_ERR_INVALID_ADDR ? " (the owner has no region "
                                                            "registered there)" : NULL);
        return UCS_OK;
    }
    op->waiting = 0; /* landing: its request ends it */
    op->nreqs++;
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.recv_am = ucx_landed,
        .user_data = op,
    };
    ucs_status_ptr_t req = ucp_am_recv_data_nbx(ctx->worker, data, op->buf, op->len, &p);
    if (!UCS_PTR_IS_PTR(req)) {
        op->nreqs--;
        ucx_op_end(op, UCS_PTR_STATUS(req), NULL);
    }
    return UCS_OK;
}

/* Posts a get or put as an active message. */
static ucs_status_t ucx_am_post(ucx_op_t *op, uint32_t kind, void *buf)
{
    put_le32(op->hdr, UCX_REQ_MAGIC);
    put_le32(op->hdr + 4, kind);
    put_le64(op->hdr + 8, (uint64_t)op->gen << 32 | op->idx);
    put_le64(op->hdr + 16, op->remote_addr);
    put_le64(op->hdr + 24, op->len);
    op->buf = kind == UCX_GET ? buf : NULL;
    op->am = op->waiting = 1;
    op->nreqs++;
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = ucx_req_done,
        .user_data = op,
        /* the reply flag gives the owner an endpoint to answer on */
        .flags = UCP_AM_SEND_FLAG_REPLY |
                 (kind == UCX_PUT && op->len > UCX_AM_EAGER_MAX ? UCP_AM_SEND_FLAG_RNDV : 0),
    };
    return ucx_posted(op, ucp_am_send_nbx(op->peer->ep, UCX_AM_REQ, op->hdr, UCX_REQ_LEN,
                                          kind == UCX_PUT ? buf : NULL,
                                          kind == UCX_PUT ? op->len : 0, &param));
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
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM,
    };
    st = ucp_init(&params, config, &ctx->context);
    if (st != UCS_OK) {
        ctx->context = NULL;
        ret = wsync_err(WSYNC_ERR_UNSUPPORTED, "ucx %u.%u.%u: ucp_init with RMA and AM over %s: "
                        "%s", major, minor, release, hint ? hint : "the default transports",
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
    /* gets and puts to peers with no NIC lane: served by ucx_on_req, answered to ucx_on_rep */
    for (unsigned id = UCX_AM_REQ; id <= UCX_AM_REP; id++) {
        ucp_am_handler_param_t am = {
            .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                          UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
            .id = id,
            .flags = UCP_AM_FLAG_WHOLE_MSG,
            .cb = id == UCX_AM_REQ ? ucx_on_req : ucx_on_rep,
            .arg = ctx,
        };
        if ((st = ucp_worker_set_am_recv_handler(ctx->worker, &am)) != UCS_OK) {
            ret = wsync_err(WSYNC_ERR_UNSUPPORTED, "ucx: ucp_worker_set_am_recv_handler: %s",
                            ucs_status_string(st));
            goto err_ctx;
        }
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
        ucx_settle(ctx, &ctx->outstanding, UCX_SETTLE_MS);
        while (ctx->peers != NULL) {
            wsync_rma_peer_t *p = ctx->peers;
            ctx->peers = p->next;
            if (p->outstanding == 0)
                free(p);
        }
        if (ctx->outstanding != 0)
            WSYNC_LOG_W("ucx: %zu operations were still in flight at close", ctx->outstanding);
        /* ucp_worker_destroy asserts on a rendezvous still pending: end what peers asked */
        ucx_settle(ctx, &ctx->nserving, UCX_SERVE_WAIT_MS);
        if (ctx->nserving != 0) {
            ucx_serve_drop(ctx, NULL);
            ucx_settle(ctx, &ctx->nserving, UCX_SETTLE_MS);
        }
        if (ctx->nserving != 0)
            WSYNC_LOG_W("ucx: %zu peers' requests were still served at close", ctx->nserving);
        ucp_worker_destroy(ctx->worker);
    }
    if (ctx->nmrs != 0)
        WSYNC_LOG_W("ucx: %u regions were still registered at close", ctx->nmrs);
    if (ctx->context != NULL)
        ucp_cleanup(ctx->context);
    for (uint32_t i = 0; i < ctx->nops; i++)
        free(ctx->ops[i]);
    free(ctx->ops);
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
    ucx_fail_waiting(peer, status); /* it will answer no more */
}

/* Whether an RDMA NIC carries gets and puts to this peer: an InfiniBand rc or dc lane, which UCX
 * takes for RMA when both sides have one. Over anything else UCX would emulate them. */
static int ucx_ep_nic_rma(ucp_ep_h ep)
{
    char *text = NULL, tl[32];
    size_t text_len = 0;
    int nic = 0;
    FILE *f = open_memstream(&text, &text_len);
    if (f == NULL)
        return 0;
    ucp_ep_print_info(ep, f);
    fclose(f);
    /* lines read "#   lane[0]:  1:rc_mlx5/mlx5_0:1.0 md[1]  -> md[1]/ib/sysdev[255] rma#0 ..." */
    for (const char *p = text; p != NULL && (p = strstr(p, "lane[")) != NULL; p++)
        if (sscanf(p, "lane[%*u]: %*u:%31[^/]", tl) == 1 &&
            (strncmp(tl, "rc", 2) == 0 || strncmp(tl, "dc", 2) == 0))
            nic = 1;
    free(text);
    return nic;
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
        peer->am = !ucx_ep_nic_rma(peer->ep);
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
        ucx_settle(ctx, &peer->outstanding, UCX_SETTLE_MS);
        if (peer->outstanding > 0) {
            peer->detached = 1; /* the last completion frees it */
            peer = NULL;
        }
    }
    free(peer);
    ucx_unlock(ctx);
}

/* ---- memory ---------------------------------------------------------------------------------- */

/* Memory types this UCX context registers (ucp_context_query), as WSYNC_RMA_MEM_* bits. */
static unsigned ucx_mem_caps(wsync_rma_t *ctx)
{
    ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};

    if (ctx == NULL || ucp_context_query(ctx->context, &attr) != UCS_OK)
        return 0;
    return (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) ? WSYNC_RMA_MEM_CUDA : 0;
}

/* reg and reg_cuda: a region of memory type mt (host, or CUDA: told to UCX rather than detected,
 * and remembered so that the replies that read it say so too). */
static wsync_status_t ucx_reg_as(wsync_rma_t *ctx, void *base, size_t len, ucs_memory_type_t mt,
                                 wsync_rma_mr_t **out, void *rkey, size_t *rkey_len)
{
    if (ctx == NULL || base == NULL || len == 0 || out == NULL || rkey == NULL ||
        rkey_len == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "ucx reg: NULL argument or empty region");
    wsync_rma_mr_t *mr = calloc(1, sizeof(*mr));
    if (mr == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ucx reg");
    mr->ctx = ctx;
    mr->mem_type = mt;

    wsync_status_t ret;
    void *packed = NULL;
    size_t packed_len = 0;
    ucp_mem_map_params_t params = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
        .address = base,
        .length = len,
        .memory_type = mt,
    };
    ucx_lock(ctx);
    ucs_status_t st = ucp_mem_map(ctx->context, &params, &mr->memh);
    if (st != UCS_OK) {
        ret = wsync_err(ucx_map_status(st), "ucx reg of %zu bytes of %s memory at %p: "
                        "ucp_mem_map: %s", len, ucs_memory_type_names[mt], base,
                        ucs_status_string(st));
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

    /* peers' gets and puts without a NIC are served by this worker: keep it turning */
    if (!ctx->server_running) {
        atomic_store(&ctx->server_stop, 0);
        if (pthread_create(&ctx->server, NULL, ucx_server_main, ctx) == 0)
            ctx->server_running = 1;
        else
            WSYNC_LOG_W("ucx: no server thread: peers' reads of this process's regions without "
                        "a NIC progress only inside its own flush calls");
    }
    mr->base = (uint64_t)(uintptr_t)base;
    mr->len = len;
    mr->next = ctx->mrs;
    ctx->mrs = mr;
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

static wsync_status_t ucx_reg(wsync_rma_t *ctx, void *base, size_t len, wsync_rma_mr_t **out,
                              void *rkey, size_t *rkey_len)
{
    return ucx_reg_as(ctx, base, len, UCS_MEMORY_TYPE_HOST, out, rkey, rkey_len);
}

static wsync_status_t ucx_reg_cuda(wsync_rma_t *ctx, void *base, size_t len, int device,
                                   wsync_rma_mr_t **out, void *rkey, size_t *rkey_len)
{
    if (ctx == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "ucx reg_cuda: NULL context");
    if (!(ucx_mem_caps(ctx) & WSYNC_RMA_MEM_CUDA))
        return wsync_err(WSYNC_ERR_UNSUPPORTED, "ucx reg_cuda of %zu bytes at %p on CUDA device "
                         "%d: this UCX has no CUDA memory type (built without CUDA, or its cuda "
                         "transports are not loaded: ucx_info -d | grep cuda)", len, base, device);
    /* UCX maps on the caller's current device: the sender made `device` current */
    return ucx_reg_as(ctx, base, len, UCS_MEMORY_TYPE_CUDA, out, rkey, rkey_len);
}

static void ucx_dereg(wsync_rma_mr_t *mr)
{
    if (mr == NULL)
        return;
    wsync_rma_t *ctx = mr->ctx;
    ucx_lock(ctx);
    for (wsync_rma_mr_t **pp = &ctx->mrs; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == mr) {
            *pp = mr->next; /* no request is served from it from now on */
            break;
        }
    }
    /* UCX may still move bytes from or to the region, which the caller frees next: let that end
     * (it fails at once for a reader that is gone), else cut off the readers that stopped */
    ucx_settle(ctx, &mr->serving, UCX_SERVE_WAIT_MS);
    if (mr->serving > 0) {
        ucx_serve_drop(ctx, mr);
        ucx_settle(ctx, &mr->serving, UCX_SETTLE_MS); /* UCX cancels them as it progresses */
    }
    ucs_status_t st = ucp_mem_unmap(ctx->context, mr->memh);
    if (st != UCS_OK)
        WSYNC_LOG_W("ucx: ucp_mem_unmap: %s", ucs_status_string(st));
    if (mr->serving > 0) {
        WSYNC_LOG_E("ucx: %zu transfers from or to the region of %" PRIu64 " bytes at 0x%"
                    PRIx64 " could not be cancelled at dereg", mr->serving, mr->len, mr->base);
        mr->detached = 1; /* the last of them frees it */
        mr = NULL;
    }
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
    ucs_status_t st;
    if (peer->am) {
        st = ucx_am_post(op, is_get ? UCX_GET : UCX_PUT, buf);
    } else {
        ucp_request_param_t param = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = ucx_req_done,
            .user_data = op,
        };
        op->nreqs++;
        st = ucx_posted(op, is_get ? ucp_get_nbx(peer->ep, buf, len, raddr, rk->rkey, &param)
                                   : ucp_put_nbx(peer->ep, buf, len, raddr, rk->rkey, &param));
        peer->unflushed |= !is_get; /* an active-message put ends when the owner has it */
    }
    if (st != UCS_OK)
        ret = wsync_err(ucx_map_status(st), "ucx %s of %zu bytes at remote address 0x%" PRIx64
                        " %s peer %s: %s: %s", kind, len, raddr, dir, peer->label,
                        peer->am ? "ucp_am_send_nbx" : is_get ? "ucp_get_nbx" : "ucp_put_nbx",
                        ucs_status_string(st));
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
            .cb.send = ucx_req_done,
            .user_data = op,
        };
        op->nreqs = 1;
        ucs_status_ptr_t req = ucp_ep_flush_nbx(p->ep, &param);
        if (!UCS_PTR_IS_PTR(req)) { /* done at once, or failed: kept for this flush to report */
            op->nreqs = 0;
            ucx_op_end(op, UCS_PTR_STATUS(req), NULL);
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
    ucx_settle(ctx, &ctx->outstanding, UCX_SETTLE_MS);
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
    .mem_caps = ucx_mem_caps,
    .reg_cuda = ucx_reg_cuda,
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
