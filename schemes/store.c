/* The 'store' scheme: a versioned weight store read with one-sided RMA (UCX or libfabric), for
 * disaggregated and asynchronous RL. Senders publish each version — a snapshot copied into
 * registered host memory (the trainer may step on at once), or their shards in place — and the
 * coordinator keeps a directory of the last K versions: where each shard lies and its remote key.
 * Readers come and go; each asks for the newest version (or a given one), holds a lease on it
 * while it reads exactly its plan's segments with gets, and releases it. Old versions are freed
 * once nobody reads them.
 *
 * Verification (WSYNC_VERIFY at the senders): readers come with plans of their own, so a sender
 * cannot know their chunks; it publishes, beside its directory entry, the xxh3 of every
 * VERIFY_BLOCK bytes of each shard as published. A reader that verifies fetches the whole blocks
 * under its segments into a bounce buffer, checks them, and only then copies (and casts) into its
 * targets: it reads up to two extra blocks per segment, and whole rows where it wants only some
 * columns. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/delta_state.h"
#include "core/fault.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/objects.h"
#include "core/util.h"
#include "kernels/device.h"
#include "reshard/exec.h"
#include "schemes/scheme.h"
#include "schemes/store_delta.h"
#include "schemes/store_fp8.h"
#include "schemes/store_stage.h"
#include "transports/rma.h"

#define ALIGN 64u
/* posted bytes between flushes: bounds what is in flight (the transports' per-get records)
 * without draining the pipe often (each flush waits for the slowest get before more are posted;
 * the raw transport's baseline posts a whole GiB before its one flush) */
#define FLUSH_EVERY (1ull << 30)
/* a contiguous read goes as gets of at most this many bytes, all in flight, as the raw baseline
 * does: an owner serving several readers interleaves their gets, where one 64 MiB get holds its
 * serving thread for the whole of it */
#define GET_PIECE (1ull << 20)
/* bytes of a shard under one published checksum */
#define VERIFY_BLOCK (1ull << 20)
/* rows of a segment fetched per verified batch, in bytes of shard: bounds the bounce buffer */
#define VERIFY_BATCH (64ull << 20)
/* Readers of CUDA targets land their gets in STAGE_SLOTS pinned host buffers of STAGE_SLOT_MB
 * (WSYNC_STORE_STAGE_KB, in KiB) each, copied to the GPU while the next one fills (store_stage.h). */
#define STAGE_SLOTS 4
#define STAGE_SLOT_MB 16
/* Column slices of row-major shards (TP's row-parallel o_proj and down_proj cut from FSDP's row
 * shards) are rows of a few KiB with gaps between them. One get per row made the qwen3-0.6b
 * FSDP-2 -> TP-2 reader issue ~57,000 gets of 2-3 KiB; a get costs some microseconds beside its
 * bytes, so rows whose gap is at most SPAN_GAP_KB (WSYNC_STORE_GAP_KB; 0: never) are read as
 * spans, gaps included, into a staging slot and scattered from there (docs/store.md, "Model
 * shapes against the raw gets"). For host targets the scatter is a memcpy that one get per row
 * avoids, so there rows longer than SPAN_ROW_MAX go one get each as before. */
#define SPAN_GAP_KB 16
#define SPAN_ROW_MAX (64u << 10)
/* gets below this many bytes are counted apart in the debug line of each read */
#define SMALL_GET (64u << 10)

/* ---- choosing the transport ------------------------------------------------------------------ */

/* WSYNC_STORE_TRANSPORT=ucx|ofi, else UCX, else libfabric; WSYNC_STORE_PROVIDER is passed to
 * the transport as its hint (UCX_TLS list / libfabric provider). */
static wsync_status_t open_rma(const char *want, const wsync_rma_ops_t **ops, wsync_rma_t **ctx,
                               char *info, size_t len)
{
    const char *env = getenv("WSYNC_STORE_TRANSPORT");
    const char *hint = getenv("WSYNC_STORE_PROVIDER");
    const wsync_rma_ops_t *cands[2] = {wsync_rma_ucx(), wsync_rma_ofi()};
    wsync_status_t st = WSYNC_ERR_UNSUPPORTED;
    char why[512] = "";

    if (want == NULL && env != NULL && *env != '\0')
        want = env;
    if (want != NULL && strcmp(want, "ucx") != 0 && strcmp(want, "ofi") != 0)
        return wsync_err(WSYNC_ERR_INVALID, "store: transport '%s' is unknown (ucx or ofi; "
                         "WSYNC_STORE_TRANSPORT)", want);
    for (int i = 0; i < 2; i++) {
        const char *name = i == 0 ? "ucx" : "ofi";
        if (want != NULL && strcmp(want, name) != 0)
            continue;
        if (cands[i] == NULL) {
            snprintf(why + strlen(why), sizeof(why) - strlen(why), "%s: not compiled in; ", name);
            continue;
        }
        st = cands[i]->open(hint, info, len, ctx);
        if (st == WSYNC_OK) {
            *ops = cands[i];
            return WSYNC_OK;
        }
        snprintf(why + strlen(why), sizeof(why) - strlen(why), "%s: %s; ", name,
                 wsync_last_error());
    }
    return wsync_err(st == WSYNC_OK ? WSYNC_ERR_UNSUPPORTED : st, "store: no RMA transport could "
                     "start: %s", why);
}

static int store_score(const wsync_group_info_t *g, char *reason, size_t len)
{
    const wsync_rma_ops_t *u = wsync_rma_ucx(), *o = wsync_rma_ofi();
    int ti[2] = {wsync_transport_index("ucx"), wsync_transport_index("ofi")};

    /* CUDA memory: registered in place where the transport can, else staged through pinned
     * host buffers (which any participant with CUDA memory can do) */
    const char *mem = g->mem_kinds & (1u << WSYNC_MEM_CUDA)
                          ? "; CUDA memory registered with the transport where it takes it, "
                            "else staged through pinned host buffers"
                          : "";
    if (g->mem_kinds & (1u << WSYNC_MEM_CUDA)) {
        /* cuda_ipc is available wherever a CUDA device is usable: some participant must be */
        int ci = wsync_transport_index("cuda_ipc"), any = 0;
        for (uint32_t i = 0; ci >= 0 && i < g->nsenders + g->nreceivers && !any; i++) {
            const wsync_hello_t *h = i < g->nsenders ? &g->senders[i] : &g->receivers[i - g->nsenders];
            any = (h->transports & (1u << ci)) != 0;
        }
        if (!any) {
            snprintf(reason, len, "some shards or targets are in CUDA memory, but no participant "
                                  "can use a CUDA device (no device, or a build without CUDA)");
            return 0;
        }
    }
    /* the transport the senders will open: WSYNC_STORE_TRANSPORT when set, else UCX first */
    const char *want = getenv("WSYNC_STORE_TRANSPORT");
    int only = want == NULL || *want == '\0' ? -1 : strcmp(want, "ofi") == 0 ? 1
                                             : strcmp(want, "ucx") == 0 ? 0 : 2;
    if (only == 2) {
        snprintf(reason, len, "WSYNC_STORE_TRANSPORT='%s' is neither ucx nor ofi", want);
        return 0;
    }
    for (int t = 0; t < 2; t++) {
        if (only >= 0 && t != only)
            continue;
        int everyone = (t == 0 ? u : o) != NULL;
        for (uint32_t i = 0; everyone && i < g->nsenders + g->nreceivers; i++) {
            const wsync_hello_t *h = i < g->nsenders ? &g->senders[i] : &g->receivers[i - g->nsenders];
            everyone = (h->transports & (1u << ti[t])) != 0;
        }
        if (everyone) {
            /* the store spans hosts and namespaces: its reads go over the network */
            char where[128] = "";
            uint32_t n = g->nsenders + g->nreceivers, hosts = 1, spaces = 1;
            const char **ids = malloc((n ? n : 1) * sizeof(*ids));
            for (uint32_t i = 0; ids != NULL && i < n; i++)
                ids[i] = i < g->nsenders ? g->senders[i].host_id
                                         : g->receivers[i - g->nsenders].host_id;
            if (ids != NULL && wsync_host_count(ids, n, &hosts, &spaces) == 0 && spaces > 1)
                snprintf(where, sizeof(where), "; participants on %u host%s in %u network "
                                               "namespaces, read across them", hosts,
                         hosts == 1 ? "" : "s", spaces);
            free(ids);
            snprintf(reason, len, "one-sided reads over %s, which every participant has (the "
                                  "last versions kept for readers that come when they like)%s%s",
                     t == 0 ? "UCX" : "libfabric", where, mem);
            return 50;
        }
    }
    if (only >= 0)
        snprintf(reason, len, "WSYNC_STORE_TRANSPORT=%s, which not every participant has",
                 only == 0 ? "ucx" : "ofi");
    else
        snprintf(reason, len, "needs UCX or libfabric at every participant");
    return 0;
}

/* ---- sender ------------------------------------------------------------------------------------ */

typedef struct {
    void *base;
    size_t bytes;
    wsync_rma_mr_t *mr;
    uint8_t rkey[WSYNC_RMA_BLOB_MAX];
    size_t rkey_len;
    uint64_t version;                /* the version it holds; 0: free */
    int pinned;                      /* registered with CUDA by us (snapshots of CUDA shards) */
} store_slot_t;

typedef struct {
    const wsync_rma_ops_t *rma;
    wsync_rma_t *ctx;
    char info[256];
    uint8_t addr[WSYNC_RMA_BLOB_MAX];
    size_t addr_len;
    size_t *shard_off;               /* [nshards] offset of each shard in a snapshot */
    size_t *shard_bytes;
    size_t total;
    store_slot_t *slots;             /* snapshots, or (in place) one per shard */
    int nslots;
    int verify;                      /* publish block checksums with each version */
    /* snapshots: s->snapshot, or in place with CUDA shards the transport cannot register (the
     * staged path: each version copied from the GPU into pinned, registered host memory) */
    int snap;
    int cuda;                        /* some shard is in CUDA memory (on s->device) */
    void *stream;                    /* the snapshot's copies from the GPU */
    uint8_t *hashbuf;                /* in place, verify: a device shard's block, on the host */
    store_dtx_t *dtx;                /* delta versions (group mode on): schemes/store_delta.c */
    store_ftx_t *ftx;                /* FP8 on the wire (delta off): schemes/store_fp8.c */
} store_sender_t;

static void slot_release(store_sender_t *st, store_slot_t *sl, int owned)
{
    if (sl->mr != NULL)
        st->rma->dereg(sl->mr);
    if (sl->pinned)
        wsync_dev_host_unregister(sl->base);
    if (owned)
        free(sl->base);
    memset(sl, 0, sizeof(*sl));
}

static void store_sender_teardown(wsync_sender_t *s)
{
    store_sender_t *st = s->m.scheme_state;

    if (st == NULL)
        return;
    int saved = -1, entered = st->cuda && wsync_dev_enter(s->device, &saved) == WSYNC_OK;
    if (entered && st->stream != NULL)
        (void)wsync_dev_stream_sync(st->stream, wsync_deadline_in(s->m.timeout_ms),
                                    "the store's snapshot copies from the GPU");
    wsync_store_dtx_free(st->dtx);   /* its buffers are registered with st->ctx */
    wsync_store_ftx_free(st->ftx);
    for (int i = 0; i < st->nslots; i++)
        slot_release(st, &st->slots[i], st->snap);
    free(st->slots);
    if (st->ctx != NULL)
        st->rma->close(st->ctx);
    if (entered) {
        wsync_dev_stream_destroy(st->stream);
        wsync_dev_leave(s->device, saved);
    }
    free(st->hashbuf);
    free(st->shard_off);
    free(st->shard_bytes);
    free(st);
    s->m.scheme_state = NULL;
}

/* Register a slot: host memory, or (device >= 0) CUDA memory of that device, in place. */
static wsync_status_t reg_slot(store_sender_t *st, store_slot_t *sl, void *base, size_t bytes,
                               int device)
{
    wsync_status_t rc;

    sl->base = base;
    sl->bytes = bytes;
    sl->rkey_len = sizeof(sl->rkey);
    if (device >= 0)
        rc = st->rma->reg_cuda(st->ctx, base, bytes ? bytes : 1, device, &sl->mr, sl->rkey,
                               &sl->rkey_len);
    else
        rc = st->rma->reg(st->ctx, base, bytes ? bytes : 1, &sl->mr, sl->rkey, &sl->rkey_len);
    return rc;
}

/* The path a sender's CUDA shards take with this transport context: registered in place, or
 * staged through host snapshots (for the log and wsync-info). */
static const char *cuda_path(const wsync_rma_ops_t *rma, wsync_rma_t *ctx)
{
    return rma->mem_caps(ctx) & WSYNC_RMA_MEM_CUDA ? "CUDA memory registered with the transport"
                                                   : "CUDA memory staged through pinned host "
                                                     "buffers";
}

static wsync_status_t store_sender_setup(wsync_sender_t *s)
{
    store_sender_t *st = calloc(1, sizeof(*st));
    wsync_status_t rc;

    if (st == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory");
    s->m.scheme_state = st;
    st->verify = s->m.ctx->verify;
    rc = open_rma(NULL, &st->rma, &st->ctx, st->info, sizeof(st->info));
    if (rc != WSYNC_OK)
        return rc;
    st->addr_len = sizeof(st->addr);
    rc = st->rma->address(st->ctx, st->addr, &st->addr_len);
    if (rc != WSYNC_OK)
        return rc;
    st->shard_off = calloc(s->nshards + 1, sizeof(size_t));
    st->shard_bytes = calloc(s->nshards + 1, sizeof(size_t));
    if (st->shard_off == NULL || st->shard_bytes == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory");
    for (size_t i = 0; i < s->nshards; i++) {
        size_t b = wsync_dtype_size(s->shards[i].param.dtype);
        for (int d = 0; d < s->shards[i].param.ndim; d++)
            b *= (size_t)s->shards[i].box.len[d];
        st->shard_off[i] = st->total;
        st->shard_bytes[i] = b;
        st->total += (b + ALIGN - 1) / ALIGN * ALIGN;
    }
    for (size_t i = 0; i < s->nshards; i++)
        st->cuda |= s->shards[i].mem == WSYNC_MEM_CUDA;
    st->snap = s->snapshot;
    if (!s->snapshot && st->cuda && !(st->rma->mem_caps(st->ctx) & WSYNC_RMA_MEM_CUDA)) {
        st->snap = 1;
        WSYNC_LOG_I("store: sender %d: %s cannot register CUDA memory: its CUDA shards are "
                    "published as snapshots in pinned host memory", s->m.rank, st->info);
    }
    if (st->cuda) {
        int saved = -1;
        if ((rc = wsync_dev_enter(s->device, &saved)) != WSYNC_OK)
            return rc;
        rc = wsync_dev_stream_create(&st->stream);
        wsync_dev_leave(s->device, saved);
        if (rc != WSYNC_OK)
            return rc;
    }
    if (!st->snap) {
        /* in place: the shards themselves, registered once (CUDA shards as device memory) */
        int saved = -1;
        st->slots = calloc(s->nshards + 1, sizeof(*st->slots));
        if (st->slots == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "store: no memory");
        if (st->cuda && (rc = wsync_dev_enter(s->device, &saved)) != WSYNC_OK)
            return rc;
        for (size_t i = 0; i < s->nshards && rc == WSYNC_OK; i++, st->nslots++) {
            int dev = s->shards[i].mem == WSYNC_MEM_CUDA ? s->shards[i].device : -1;
            rc = reg_slot(st, &st->slots[i], (void *)s->shard_data[i], st->shard_bytes[i], dev);
        }
        if (st->cuda)
            wsync_dev_leave(s->device, saved);
        if (rc != WSYNC_OK)
            return rc;
    }
    WSYNC_LOG_I("store: sender %d on %s, %s, %zu bytes per version%s%s", s->m.rank, st->info,
                st->snap ? "snapshots" : "in place", st->total, st->cuda ? ", " : "",
                st->cuda ? cuda_path(st->rma, st->ctx) : "");
    if (s->m.planmsg.delta == WSYNC_DELTA_MODE_ON)
        return wsync_store_dtx_create(s, st->rma, st->ctx, &st->dtx);
    /* delta versions diff plain values: FP8 on the wire only without them */
    return wsync_store_ftx_create(s, st->rma, st->ctx, &st->ftx);
}

/* A free snapshot slot, registered once and reused (a new one while all are held). */
static wsync_status_t take_slot(wsync_sender_t *s, store_sender_t *st, store_slot_t **out)
{
    for (int i = 0; i < st->nslots; i++) {
        if (st->slots[i].version == 0 && st->slots[i].base != NULL) {
            *out = &st->slots[i];
            return WSYNC_OK;
        }
    }
    store_slot_t *ns = realloc(st->slots, (size_t)(st->nslots + 1) * sizeof(*ns));
    void *mem = NULL;
    if (ns == NULL || posix_memalign(&mem, 4096, st->total ? st->total : 1) != 0) {
        if (ns != NULL)
            st->slots = ns;
        return wsync_err(WSYNC_ERR_NOMEM, "store: sender %d: no memory for a snapshot of %zu bytes",
                         s->m.rank, st->total);
    }
    st->slots = ns;
    store_slot_t *sl = &st->slots[st->nslots];
    memset(sl, 0, sizeof(*sl));
    int pinned = 0;
    wsync_status_t rc = WSYNC_OK;
    /* pinned, so that the copies from the GPU are DMA and run at the link's speed */
    if (st->cuda)
        rc = wsync_dev_host_register(mem, st->total ? st->total : 1, 0, &pinned);
    if (rc == WSYNC_OK)
        rc = reg_slot(st, sl, mem, st->total, -1);
    if (rc != WSYNC_OK) {
        if (pinned)
            wsync_dev_host_unregister(mem);
        free(mem);
        memset(sl, 0, sizeof(*sl));
        return rc;
    }
    sl->pinned = pinned;
    st->nslots++;
    *out = sl;
    return WSYNC_OK;
}

static void handle_free(store_sender_t *st, wsync_msg_t *msg)
{
    wsync_rbuf_t r;
    uint64_t v;

    wsync_rbuf_init(&r, msg->payload, msg->len);
    v = wsync_get_u64(&r);
    if (r.err)
        return;
    wsync_store_dtx_release(st->dtx, v);   /* the delta of v goes with v */
    wsync_store_ftx_release(st->ftx, v);   /* and its FP8 codes and scales */
    if (!st->snap)
        return;
    for (int i = 0; i < st->nslots; i++)
        if (st->slots[i].version == v)
            st->slots[i].version = 0;   /* the memory stays registered for the next snapshot */
}

/* This version's bytes into snapshot slot sl: host shards by memcpy, CUDA shards by copies
 * from the GPU on the sender's stream (into pinned memory), all waited for before publishing. */
static wsync_status_t snapshot_copy(wsync_sender_t *s, store_sender_t *st, store_slot_t *sl)
{
    wsync_status_t rc = WSYNC_OK;
    int saved = -1;

    if (st->cuda && (rc = wsync_dev_enter(s->device, &saved)) != WSYNC_OK)
        return rc;
    for (size_t i = 0; i < s->nshards && rc == WSYNC_OK; i++) {
        uint8_t *to = (uint8_t *)sl->base + st->shard_off[i];
        if (s->shards[i].mem == WSYNC_MEM_CUDA)
            rc = wsync_dev_memcpy_async(to, s->shard_data[i], st->shard_bytes[i], st->stream);
        else
            memcpy(to, s->shard_data[i], st->shard_bytes[i]);
    }
    if (st->cuda) {
        wsync_status_t w = wsync_dev_stream_sync(st->stream, wsync_deadline_in(s->m.timeout_ms),
                                                 "the store's snapshot copies from the GPU");
        rc = rc == WSYNC_OK ? w : rc;
        wsync_dev_leave(s->device, saved);
    }
    return rc;
}

/* n bytes of device memory at p into st->hashbuf (VERIFY_BLOCK bytes). */
static wsync_status_t device_block(wsync_sender_t *s, store_sender_t *st, const void *p, size_t n)
{
    int saved = -1;
    wsync_status_t rc;

    if (st->hashbuf == NULL && (st->hashbuf = malloc(VERIFY_BLOCK)) == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory");
    if ((rc = wsync_dev_enter(s->device, &saved)) != WSYNC_OK)
        return rc;
    rc = wsync_dev_copy_to_host(st->hashbuf, p, n, st->stream, wsync_deadline_in(s->m.timeout_ms));
    wsync_dev_leave(s->device, saved);
    return rc;
}

/* FP8 on the wire: the regions readers asked for, quantized from this version's bytes (the
 * snapshot, host shards, or CUDA shards in place by way of the host) into a wire slot that
 * joins the entry's regions. */
static wsync_status_t publish_fp8(wsync_sender_t *s, store_sender_t *st, const store_slot_t *sl,
                                  uint64_t version, wsync_dir_entry_t *e)
{
    const void **src = calloc(s->nshards + 1, sizeof(*src));
    uint64_t packed = 0;
    int saved = -1;
    wsync_status_t rc;

    if (src == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory");
    for (size_t i = 0; i < s->nshards; i++)
        src[i] = sl != NULL ? (const uint8_t *)sl->base + st->shard_off[i]
                 : s->shards[i].mem == WSYNC_MEM_CUDA ? NULL : s->shard_data[i];
    if (st->cuda && (rc = wsync_dev_enter(s->device, &saved)) != WSYNC_OK) {
        free(src);
        return rc;
    }
    rc = wsync_store_ftx_publish(s, st->ftx, version, src, st->stream, st->verify, e, &packed);
    if (st->cuda)
        wsync_dev_leave(s->device, saved);
    free(src);
    if (rc == WSYNC_OK)
        s->stats.bytes_packed += packed;
    return rc;
}

/* This version's directory entry: the snapshot slot (taken and filled) or the shards in place,
 * one region each; *slp the slot (NULL in place). On failure nothing is left allocated. */
static wsync_status_t entry_fill(wsync_sender_t *s, store_sender_t *st, uint64_t version,
                                 wsync_dir_entry_t *e, store_slot_t **slp)
{
    store_slot_t *sl = NULL;
    wsync_status_t rc;

    memset(e, 0, sizeof(*e));
    *slp = NULL;
    e->sender = (uint32_t)s->m.rank;
    e->transport = (char *)st->rma->name;
    e->addr = st->addr;
    e->addr_len = (uint32_t)st->addr_len;
    e->nshards = (uint32_t)s->nshards;
    e->shards = calloc(s->nshards + 1, sizeof(*e->shards));
    /* regions beside the shards': the delta buffer, or the FP8 wire slot */
    e->regions = calloc(st->snap ? 3 : s->nshards + 2, sizeof(*e->regions));
    if (e->shards == NULL || e->regions == NULL) {
        free(e->shards);
        free(e->regions);
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory");
    }
    if (st->snap) {
        rc = take_slot(s, st, &sl);
        if (rc == WSYNC_OK)
            rc = snapshot_copy(s, st, sl);
        if (rc != WSYNC_OK) {
            free(e->shards);
            free(e->regions);
            return rc;
        }
        for (size_t i = 0; i < s->nshards; i++) {
            e->shards[i].region = 0;
            e->shards[i].addr = (uint64_t)(uintptr_t)sl->base + st->shard_off[i];
        }
        sl->version = version;
        s->stats.bytes_delivered = st->total;   /* published: readers take what they need later */
        e->nregions = 1;
        e->regions[0].base = (uint64_t)(uintptr_t)sl->base;
        e->regions[0].len = sl->bytes;
        e->regions[0].rkey = sl->rkey;
        e->regions[0].rkey_len = (uint32_t)sl->rkey_len;
        s->stats.bytes_packed += st->total;
    } else {
        s->stats.bytes_delivered = st->total;
        e->nregions = (uint32_t)s->nshards;
        for (size_t i = 0; i < s->nshards; i++) {
            e->regions[i].base = (uint64_t)(uintptr_t)st->slots[i].base;
            e->regions[i].len = st->slots[i].bytes;
            e->regions[i].rkey = st->slots[i].rkey;
            e->regions[i].rkey_len = (uint32_t)st->slots[i].rkey_len;
            e->shards[i].region = (uint32_t)i;
            e->shards[i].addr = (uint64_t)(uintptr_t)st->slots[i].base;
        }
    }
    *slp = sl;
    return WSYNC_OK;
}

/* The checksums after the entry: u64 block bytes (0: none), u32 nshards, and per shard u64 bytes
 * and one u64 xxh3 per block, of the bytes as published. */
static wsync_status_t put_checksums(wsync_sender_t *s, store_sender_t *st,
                                    const wsync_dir_entry_t *e, wsync_wbuf_t *b)
{
    wsync_status_t rc = WSYNC_OK;

    wsync_put_u64(b, st->verify ? VERIFY_BLOCK : 0);
    if (!st->verify)
        return WSYNC_OK;
    wsync_put_u32(b, (uint32_t)s->nshards);
    for (size_t i = 0; i < s->nshards && rc == WSYNC_OK; i++) {
        const uint8_t *p = (const uint8_t *)(uintptr_t)e->shards[i].addr;
        int on_dev = !st->snap && s->shards[i].mem == WSYNC_MEM_CUDA;
        wsync_put_u64(b, st->shard_bytes[i]);
        for (size_t o = 0; o < st->shard_bytes[i] && rc == WSYNC_OK; o += VERIFY_BLOCK) {
            size_t n = WSYNC_MIN(VERIFY_BLOCK, st->shard_bytes[i] - o);
            const uint8_t *q = p + o;
            if (on_dev) {   /* in place on the GPU: hashed from a host copy of the block */
                rc = device_block(s, st, q, n);
                q = st->hashbuf;
            }
            if (rc == WSYNC_OK)
                wsync_put_u64(b, XXH3_64bits(q, n));
        }
    }
    return rc;
}

/* The version is in the store once every sender published it: PUBLISHED, freeing evicted
 * versions' snapshots meanwhile. */
static wsync_status_t await_published(wsync_sender_t *s, store_sender_t *st, uint64_t version)
{
    const uint16_t types[] = {WSYNC_MSG_PUBLISHED, WSYNC_MSG_FREE};
    wsync_msg_t *msg;

    for (;;) {
        wsync_status_t rc = wsync_inbox_pop(&s->m.inbox, types, 2,
                                            wsync_deadline_in(s->m.timeout_ms), &msg);
        if (rc == WSYNC_ERR_TIMEOUT)
            return wsync_err(rc, "store: sender %d: version %llu was not published by every sender "
                             "within %d ms", s->m.rank, (unsigned long long)version,
                             s->m.timeout_ms);
        if (rc != WSYNC_OK)
            return rc;
        if (msg->type == WSYNC_MSG_FREE) {
            handle_free(st, msg);
            wsync_msg_free(msg);
            continue;
        }
        wsync_rbuf_t r;
        wsync_rbuf_init(&r, msg->payload, msg->len);
        uint64_t v = wsync_get_u64(&r);
        wsync_msg_free(msg);
        if (v == version) {
            wsync_store_dtx_published(st->dtx, version);
            return WSYNC_OK;
        }
        return wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %d: PUBLISHED %llu while publishing "
                         "%llu", s->m.rank, (unsigned long long)v, (unsigned long long)version);
    }
}

static wsync_status_t store_sender_push(wsync_sender_t *s, uint64_t version)
{
    store_sender_t *st = s->m.scheme_state;
    const uint16_t free_type = WSYNC_MSG_FREE;
    wsync_dir_entry_t e;
    wsync_wbuf_t b;
    wsync_status_t rc;
    wsync_msg_t *msg;
    store_slot_t *sl = NULL;

    /* versions the coordinator evicted since the last push free their snapshots first */
    while (wsync_inbox_pop(&s->m.inbox, &free_type, 1, 0, &msg) == WSYNC_OK) {
        handle_free(st, msg);
        wsync_msg_free(msg);
    }
    if ((rc = entry_fill(s, st, version, &e, &sl)) != WSYNC_OK)
        return rc;
    if ((st->ftx != NULL && (rc = publish_fp8(s, st, sl, version, &e)) != WSYNC_OK) ||
        (st->dtx != NULL &&
         (rc = wsync_store_dtx_publish(s, st->dtx, version, st->stream, &e)) != WSYNC_OK)) {
        if (sl != NULL)
            sl->version = 0;
        free(e.shards);
        free(e.regions);
        return rc;
    }
    wsync_wbuf_init(&b);
    wsync_put_u64(&b, version);
    wsync_dir_entry_encode(&e, &b);
    rc = put_checksums(s, st, &e, &b);
    wsync_store_ftx_table(st->ftx, &b);
    free(e.shards);
    free(e.regions);
    if (rc == WSYNC_OK && WSYNC_FAULT(WSYNC_FAULT_STORE_PUBLISH) == WSYNC_FAULT_FAIL) {
        char where[96];
        snprintf(where, sizeof(where), "store sender %d publishing version %llu", s->m.rank,
                 (unsigned long long)version);
        rc = wsync_fault_err(WSYNC_FAULT_STORE_PUBLISH, where);
    }
    if (rc != WSYNC_OK) {
        wsync_wbuf_free(&b);
        wsync_store_ftx_abandon(st->ftx);
        wsync_store_dtx_abandon(st->dtx);
        wsync_store_dtx_release(st->dtx, version);
        return rc;
    }
    rc = b.err ? wsync_err(WSYNC_ERR_NOMEM, "store: no memory")
               : wsync_conn_send(s->m.ctrl, WSYNC_MSG_PUBLISH, b.data, (uint32_t)b.len, NULL, 0,
                                 s->m.timeout_ms);
    wsync_wbuf_free(&b);
    if (rc != WSYNC_OK)
        return rc;
    return await_published(s, st, version);
}

/* ---- receiver ---------------------------------------------------------------------------------- */

typedef struct {
    uint8_t *blob;
    size_t len;
    wsync_rma_rkey_t *key;
} store_rkey_t;

typedef struct {
    wsync_rma_peer_t *peer;
    uint8_t *addr;
    size_t addr_len;
    store_rkey_t *rkeys;             /* imported keys of this sender, reused across versions */
    int nrkeys;
} store_from_t;

typedef struct {
    const wsync_rma_ops_t *rma;
    wsync_rma_t *ctx;
    char info[256];
    store_from_t *from;              /* [nsenders] */
    uint32_t nsenders;
    uint32_t lo, hi;                 /* our segments in the plan */
    uint8_t *bounce;                 /* one chunk, for segments that change dtype */
    size_t bounce_bytes;
    uint64_t seq;                    /* FETCH sequence number */
    /* The staged path (CUDA targets, or every target with WSYNC_STORE_STAGE=1): gets land in
     * the ring's host slots, copied on to the targets (to the GPU on `stream`). */
    int stage_all;                   /* WSYNC_STORE_STAGE=1: host targets staged too (tests) */
    int staged;                      /* the ring exists */
    uint8_t *slot_mem;               /* STAGE_SLOTS x slot bytes, pinned when cuda */
    size_t slot_mem_bytes;
    int slot_pinned;                 /* wsync_dev_host_register'ed by us */
    uint8_t *slots[STAGE_SLOTS];
    wsync_stage_t ring;
    size_t gap_max;                  /* rows this far apart or closer are read as spans */
    /* host targets' spans: one slot of host memory, scattered by memcpy (made when first needed) */
    int hstaged;
    uint8_t *hslot[1];
    wsync_stage_t hring;
    int cuda;                        /* some target is in CUDA memory (on r->device) */
    void *stream;                    /* the copies to the GPU */
    void *events[STAGE_SLOTS];       /* each slot's last copies */
    uint8_t *cast;                   /* host: a cast or verified chunk in its land dtype */
    size_t cast_bytes;
    /* what the ring's land callback flushes: the version being read */
    wsync_receiver_t *r;
    uint64_t v;
    void *ld;
    store_drx_t *drx;                /* delta versions (group mode on): schemes/store_delta.c */
    store_frx_t *frx;                /* our FP8 chunks (FP8 on the wire): schemes/store_fp8.c */
} store_receiver_t;

static void store_receiver_teardown(wsync_receiver_t *r)
{
    store_receiver_t *st = r->m.scheme_state;

    if (st == NULL)
        return;
    for (uint32_t s = 0; st->from != NULL && s < st->nsenders; s++) {
        store_from_t *f = &st->from[s];
        for (int k = 0; k < f->nrkeys; k++) {
            st->rma->rkey_free(f->rkeys[k].key);
            free(f->rkeys[k].blob);
        }
        free(f->rkeys);
        if (f->peer != NULL)
            st->rma->disconnect(f->peer);
        free(f->addr);
    }
    free(st->from);
    if (st->ctx != NULL)
        st->rma->close(st->ctx);
    free(st->bounce);
    free(st->cast);
    wsync_store_drx_free(st->drx);
    wsync_store_frx_free(st->frx);
    if (st->staged)
        wsync_stage_free(&st->ring);
    if (st->hstaged)
        wsync_stage_free(&st->hring);
    free(st->hslot[0]);
    if (st->cuda) {
        int saved = -1;
        if (wsync_dev_enter(r->device, &saved) == WSYNC_OK) {
            if (st->stream != NULL)   /* nothing may read the slots once they are freed */
                (void)wsync_dev_stream_sync(st->stream, wsync_deadline_in(r->m.timeout_ms),
                                            "the store's staged copies to the GPU");
            for (int i = 0; i < STAGE_SLOTS; i++)
                wsync_dev_event_destroy(st->events[i]);
            wsync_dev_stream_destroy(st->stream);
            if (st->slot_pinned)
                wsync_dev_host_unregister(st->slot_mem);
            wsync_dev_leave(r->device, saved);
        }
    }
    free(st->slot_mem);
    free(st);
    r->m.scheme_state = NULL;
}

/* ---- the staged path's copier: to the GPU on a stream, or plain memcpy (WSYNC_STORE_STAGE=1
 * with host targets only) ---------------------------------------------------------------------- */

static wsync_status_t cuda_copy(void *arg, int slot, void *dst, size_t dpitch, const void *src,
                                size_t spitch, size_t width, size_t rows)
{
    store_receiver_t *st = arg;
    (void)slot;
    return wsync_dev_memcpy2d_async(dst, dpitch, src, spitch, width, rows, st->stream);
}

static wsync_status_t cuda_mark(void *arg, int slot)
{
    store_receiver_t *st = arg;
    return wsync_dev_event_record(st->events[slot], st->stream);
}

static wsync_status_t cuda_wait(void *arg, int slot, int64_t deadline_ms)
{
    store_receiver_t *st = arg;
    return wsync_dev_event_wait(st->events[slot], deadline_ms, "the store's staged copies to the "
                                "GPU");
}

static wsync_status_t host_copy(void *arg, int slot, void *dst, size_t dpitch, const void *src,
                                size_t spitch, size_t width, size_t rows)
{
    (void)arg;
    (void)slot;
    for (size_t k = 0; k < rows; k++)
        memcpy((uint8_t *)dst + k * dpitch, (const uint8_t *)src + k * spitch, width);
    return WSYNC_OK;
}

static wsync_status_t host_mark(void *arg, int slot)
{
    (void)arg;
    (void)slot;
    return WSYNC_OK;
}

static wsync_status_t host_wait(void *arg, int slot, int64_t deadline_ms)
{
    (void)arg;
    (void)slot;
    (void)deadline_ms;
    return WSYNC_OK;
}

static wsync_status_t flush_landed(wsync_receiver_t *r, store_receiver_t *st, uint64_t v,
                                   void *ldv);

static wsync_status_t stage_land(void *arg)
{
    store_receiver_t *st = arg;
    return flush_landed(st->r, st, st->v, st->ld);
}

/* Bytes per staging slot: WSYNC_STORE_STAGE_KB, else STAGE_SLOT_MB. */
static wsync_status_t stage_slot_bytes(size_t *out)
{
    const char *kb_env = getenv("WSYNC_STORE_STAGE_KB");
    long kb = kb_env != NULL && *kb_env != '\0' ? strtol(kb_env, NULL, 10) : STAGE_SLOT_MB * 1024;

    if (kb < 4 || kb > (4l << 20))
        return wsync_err(WSYNC_ERR_INVALID, "store: WSYNC_STORE_STAGE_KB=%s: expected 4 to %ld "
                         "(KiB per staging slot)", kb_env, 4l << 20);
    *out = (size_t)kb << 10;
    return WSYNC_OK;
}

/* The ring and, for CUDA targets, its pinned slots, stream and events (on r->device). */
static wsync_status_t stage_setup(wsync_receiver_t *r, store_receiver_t *st)
{
    wsync_status_t rc = WSYNC_OK;
    int saved = -1;
    size_t slot = 0;

    if ((rc = stage_slot_bytes(&slot)) != WSYNC_OK)
        return rc;
    long kb = (long)(slot >> 10);
    st->slot_mem_bytes = slot * STAGE_SLOTS;
    if (posix_memalign((void **)&st->slot_mem, 4096, st->slot_mem_bytes) != 0) {
        st->slot_mem = NULL;
        return wsync_err(WSYNC_ERR_NOMEM, "store: receiver %d: no memory for %d staging slots of "
                         "%ld KiB", r->m.rank, STAGE_SLOTS, kb);
    }
    for (int i = 0; i < STAGE_SLOTS; i++)
        st->slots[i] = st->slot_mem + (size_t)i * slot;
    wsync_stage_copier_t cp = {host_copy, host_mark, host_wait, st};
    if (st->cuda) {
        if ((rc = wsync_dev_enter(r->device, &saved)) != WSYNC_OK)
            return rc;
        /* pinned, so that the copies to the GPU are DMA and asynchronous */
        rc = wsync_dev_host_register(st->slot_mem, st->slot_mem_bytes, 0, &st->slot_pinned);
        if (rc == WSYNC_OK)
            rc = wsync_dev_stream_create(&st->stream);
        for (int i = 0; i < STAGE_SLOTS && rc == WSYNC_OK; i++)
            rc = wsync_dev_event_create(0, &st->events[i]);
        wsync_dev_leave(r->device, saved);
        if (rc != WSYNC_OK)
            return rc;
        cp = (wsync_stage_copier_t){cuda_copy, cuda_mark, cuda_wait, st};
    }
    rc = wsync_stage_init(&st->ring, st->slots, STAGE_SLOTS, slot, &cp, stage_land, st);
    if (rc == WSYNC_OK)
        st->staged = 1;
    return rc;
}

/* The host targets' span ring: one slot, since its memcpy scatter runs at once when the slot is
 * sealed (after its gets landed) and leaves nothing to wait for before the slot is refilled. */
static wsync_status_t host_span_setup(wsync_receiver_t *r, store_receiver_t *st)
{
    wsync_stage_copier_t cp = {host_copy, host_mark, host_wait, st};
    size_t slot = 0;
    wsync_status_t rc;

    if ((rc = stage_slot_bytes(&slot)) != WSYNC_OK)
        return rc;
    if (st->hslot[0] == NULL && (st->hslot[0] = malloc(slot)) == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: receiver %d: no memory for a %zu KiB slot for "
                         "column slices", r->m.rank, slot >> 10);
    if ((rc = wsync_stage_init(&st->hring, st->hslot, 1, slot, &cp, stage_land, st)) != WSYNC_OK)
        return rc;
    st->hstaged = 1;
    WSYNC_LOG_D("store: receiver %d reads column slices with gaps of at most %zu bytes as spans "
                "through a %zu KiB host slot", r->m.rank, st->gap_max, slot >> 10);
    return WSYNC_OK;
}

static wsync_status_t store_receiver_setup(wsync_receiver_t *r)
{
    const wsync_plan_t *plan = r->m.plan;
    store_receiver_t *st = calloc(1, sizeof(*st));

    if (st == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory");
    r->m.scheme_state = st;
    st->nsenders = plan->nsenders;
    st->from = calloc(plan->nsenders, sizeof(*st->from));
    if (st->from == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory");
    st->lo = 0;                      /* our segments: r->m.segs, all of them */
    st->hi = r->m.nsegs;
    const char *force = getenv("WSYNC_STORE_STAGE");
    st->stage_all = force != NULL && atoi(force) > 0;
    const char *gap = getenv("WSYNC_STORE_GAP_KB");
    long gap_kb = gap != NULL && *gap != '\0' ? strtol(gap, NULL, 10) : SPAN_GAP_KB;
    if (gap_kb < 0 || gap_kb > (1l << 20))
        return wsync_err(WSYNC_ERR_INVALID, "store: WSYNC_STORE_GAP_KB=%s: expected 0 to %ld "
                         "(KiB of gap between rows read as one span; 0: one get per row)", gap,
                         1l << 20);
    st->gap_max = (size_t)gap_kb << 10;
    for (size_t t = 0; t < r->ntargets; t++)
        st->cuda |= r->targets[t].mem == WSYNC_MEM_CUDA;
    if (st->cuda || st->stage_all) {
        wsync_status_t rc = stage_setup(r, st);
        if (rc != WSYNC_OK)
            return rc;
        WSYNC_LOG_I("store: receiver %d stages its %s through %d %shost slots of %zu KiB",
                    r->m.rank, st->cuda ? "CUDA targets" : "targets (WSYNC_STORE_STAGE=1)",
                    STAGE_SLOTS, st->cuda ? "pinned " : "", st->ring.slot_bytes >> 10);
    }
    wsync_status_t frc = wsync_store_frx_create(r, st->lo, st->hi, &st->frx);
    if (frc != WSYNC_OK)
        return frc;
    /* a reader that said off takes every version in full: no regions for the senders to encode */
    if (r->m.planmsg.delta == WSYNC_DELTA_MODE_ON && r->delta_choice != WSYNC_DELTA_MODE_OFF)
        return wsync_store_drx_create(r, st->lo, st->hi, &st->drx);
    return WSYNC_OK;
}

static wsync_status_t connect_sender(store_receiver_t *st, uint32_t s, const wsync_dir_entry_t *e)
{
    store_from_t *f = &st->from[s];
    wsync_status_t rc;

    if (f->peer != NULL && f->addr_len == e->addr_len && memcmp(f->addr, e->addr, e->addr_len) == 0)
        return WSYNC_OK;
    if (f->peer != NULL) {           /* the sender came back with another address */
        for (int k = 0; k < f->nrkeys; k++) {
            st->rma->rkey_free(f->rkeys[k].key);
            free(f->rkeys[k].blob);
        }
        f->nrkeys = 0;
        st->rma->disconnect(f->peer);
        f->peer = NULL;
    }
    free(f->addr);
    f->addr = malloc(e->addr_len ? e->addr_len : 1);
    if (f->addr == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory");
    memcpy(f->addr, e->addr, e->addr_len);
    f->addr_len = e->addr_len;
    rc = st->rma->connect(st->ctx, e->addr, e->addr_len, &f->peer);
    return rc;
}

static wsync_status_t rkey_for(store_receiver_t *st, uint32_t s, const uint8_t *blob, size_t len,
                               wsync_rma_rkey_t **out)
{
    store_from_t *f = &st->from[s];
    wsync_status_t rc;

    for (int k = 0; k < f->nrkeys; k++) {
        if (f->rkeys[k].len == len && memcmp(f->rkeys[k].blob, blob, len) == 0) {
            *out = f->rkeys[k].key;
            return WSYNC_OK;
        }
    }
    store_rkey_t *nk = realloc(f->rkeys, (size_t)(f->nrkeys + 1) * sizeof(*nk));
    if (nk == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory");
    f->rkeys = nk;
    store_rkey_t *k = &f->rkeys[f->nrkeys];
    k->blob = malloc(len ? len : 1);
    if (k->blob == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory");
    memcpy(k->blob, blob, len);
    k->len = len;
    rc = st->rma->rkey_import(f->peer, blob, len, &k->key);
    if (rc != WSYNC_OK) {
        free(k->blob);
        return rc;
    }
    f->nrkeys++;
    *out = k->key;
    return WSYNC_OK;
}

/* One sender's checksums of a version, as published beside its directory entry. */
typedef struct {
    uint64_t block;                  /* bytes per checksum; 0: the sender published none */
    uint32_t nshards;
    uint64_t *shard_bytes;           /* [nshards] */
    uint64_t *first;                 /* [nshards] index of each shard's first block in sums */
    uint64_t *sums;
} store_sums_t;

static void sums_clear(store_sums_t *x)
{
    free(x->shard_bytes);
    free(x->first);
    free(x->sums);
    memset(x, 0, sizeof(*x));
}

static wsync_status_t sums_decode(wsync_rbuf_t *rb, uint32_t sender, store_sums_t *x)
{
    uint64_t n = 0;

    memset(x, 0, sizeof(*x));
    x->block = wsync_get_u64(rb);
    if (!rb->err && x->block == 0)
        return WSYNC_OK;
    x->nshards = wsync_get_count(rb, 8);
    if (rb->err || x->block % 64 != 0 || x->block > (1ull << 40))
        return wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %u's checksums are malformed", sender);
    x->shard_bytes = calloc(x->nshards + 1, sizeof(uint64_t));
    x->first = calloc(x->nshards + 1, sizeof(uint64_t));
    if (x->shard_bytes == NULL || x->first == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory");
    /* a first pass sizes the array from what the buffer really holds: a hostile count cannot */
    wsync_rbuf_t peek = *rb;
    for (uint32_t i = 0; i < x->nshards; i++) {
        uint64_t bytes = wsync_get_u64(&peek);
        uint64_t nb = bytes / x->block + (bytes % x->block != 0);
        if (peek.err || nb > wsync_rbuf_left(&peek) / 8)
            return wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %u's checksums are malformed",
                             sender);
        x->shard_bytes[i] = bytes;
        x->first[i] = n;
        wsync_get_bytes(&peek, (size_t)nb * 8);
        n += nb;
    }
    x->sums = malloc((size_t)(n + 1) * sizeof(uint64_t));
    if (x->sums == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for %llu checksums",
                         (unsigned long long)n);
    for (uint32_t i = 0; i < x->nshards; i++) {
        uint64_t end = i + 1 < x->nshards ? x->first[i + 1] : n;
        (void)wsync_get_u64(rb);
        for (uint64_t j = x->first[i]; j < end; j++)
            x->sums[j] = wsync_get_u64(rb);
    }
    return rb->err ? wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %u's checksums are malformed",
                               sender) : WSYNC_OK;
}

/* Where the fault points put their corruption: a get's bytes once landed (store.get), and the
 * last bytes landed (recv.unpack). */
typedef struct {
    uint8_t *flip;
    size_t flip_len;
    uint8_t *last;
    size_t last_len;
    uint64_t gets, small, bytes, flushes;  /* for the debug line of each read */
} store_landing_t;

/* One get, through the store.get fault point. */
static wsync_status_t post_get(wsync_receiver_t *r, store_receiver_t *st, uint32_t s,
                               wsync_rma_rkey_t *key, uint64_t addr, void *dst, size_t len,
                               uint64_t v, store_landing_t *ld)
{
    switch (WSYNC_FAULT(WSYNC_FAULT_STORE_GET)) {
    case WSYNC_FAULT_FAIL: {
        char where[160];
        snprintf(where, sizeof(where), "store reader %d reading %zu bytes of version %llu from "
                 "sender %u", r->m.rank, len, (unsigned long long)v, s);
        return wsync_fault_err(WSYNC_FAULT_STORE_GET, where);
    }
    case WSYNC_FAULT_CORRUPT:
        ld->flip = dst;              /* once it has landed: at the next flush */
        ld->flip_len = len;
        break;
    default:
        break;
    }
    ld->last = dst;
    ld->last_len = len;
    ld->gets++;
    ld->small += len < SMALL_GET;
    ld->bytes += len;
    return st->rma->get(st->from[s].peer, key, addr, dst, len);
}

/* Wait for every posted get: one batch landed (the recv.unpack fault point). */
static wsync_status_t flush_landed(wsync_receiver_t *r, store_receiver_t *st, uint64_t v,
                                   void *ldv)
{
    store_landing_t *ld = ldv;
    wsync_status_t rc = st->rma->flush(st->ctx, wsync_deadline_in(r->m.timeout_ms));

    ld->flushes++;

    if (rc != WSYNC_OK)
        return rc;
    if (ld->flip != NULL)
        wsync_fault_flip(ld->flip, ld->flip_len);
    ld->flip = NULL;
    switch (WSYNC_FAULT(WSYNC_FAULT_RECV_UNPACK)) {
    case WSYNC_FAULT_FAIL: {
        char where[96];
        snprintf(where, sizeof(where), "store reader %d, version %llu", r->m.rank,
                 (unsigned long long)v);
        return wsync_fault_err(WSYNC_FAULT_RECV_UNPACK, where);
    }
    case WSYNC_FAULT_CORRUPT:
        wsync_fault_flip(ld->last, ld->last_len);
        break;
    default:
        break;
    }
    return WSYNC_OK;
}

static wsync_status_t grow_bounce(store_receiver_t *st, size_t need)
{
    if (need <= st->bounce_bytes)
        return WSYNC_OK;
    uint8_t *nb = realloc(st->bounce, need);
    if (nb == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for %zu bytes", need);
    st->bounce = nb;
    st->bounce_bytes = need;
    return WSYNC_OK;
}

/* wsync_exec_copy into target t's landing buffer; one in CUDA memory gets the converted rows
 * by way of a host buffer (the cast runs on the CPU, as for host targets). */
static wsync_status_t land_copy(wsync_receiver_t *r, store_receiver_t *st, const void *src,
                                wsync_dtype_t src_dtype, const wsync_region_t *from, uint32_t t,
                                const wsync_region_t *to)
{
    if (r->targets[t].mem != WSYNC_MEM_CUDA)
        return wsync_exec_copy(src, src_dtype, from, r->land[t], r->land_dtype[t], to);
    size_t lsz = wsync_dtype_size(r->land_dtype[t]);
    size_t need = (size_t)(to->rows * to->cols) * lsz;
    wsync_region_t dense = {0, to->cols, to->rows, to->cols};
    wsync_status_t rc;

    if (need > st->cast_bytes) {
        uint8_t *nb = realloc(st->cast, need);
        if (nb == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for %zu bytes", need);
        st->cast = nb;
        st->cast_bytes = need;
    }
    if ((rc = wsync_exec_copy(src, src_dtype, from, st->cast, r->land_dtype[t], &dense)) != WSYNC_OK ||
        (rc = wsync_dev_memcpy2d_async((uint8_t *)r->land[t] + to->off * lsz, to->pitch * lsz,
                                       st->cast, to->cols * lsz, to->cols * lsz, to->rows,
                                       st->stream)) != WSYNC_OK)
        return rc;
    return wsync_dev_stream_sync(st->stream, wsync_deadline_in(r->m.timeout_ms),
                                 "a converted chunk's copy to the GPU");
}

/* A sender's gets into a ring's slots, in GET_PIECE pieces as the direct reads. */
typedef struct {
    wsync_receiver_t *r;
    store_receiver_t *st;
    uint32_t sender;
    wsync_rma_rkey_t *key;
    uint64_t v;
    store_landing_t *ld;
} store_getter_t;

static wsync_status_t ring_get(void *arg, uint64_t from, uint8_t *dst, size_t len)
{
    store_getter_t *g = arg;
    wsync_status_t rc = WSYNC_OK;

    for (size_t o = 0; o < len && rc == WSYNC_OK; o += GET_PIECE)
        rc = post_get(g->r, g->st, g->sender, g->key, from + o, dst + o,
                      (size_t)WSYNC_MIN(GET_PIECE, len - o), g->v, g->ld);
    return rc;
}

/* Segment sg, same dtype, through `ring`: its rows land in the ring's slots (as spans of rows
 * where the gaps between them are at most gap_max, else whole rows, one get each) and go on to
 * the target from there. */
static wsync_status_t read_staged(wsync_receiver_t *r, store_receiver_t *st, wsync_stage_t *ring,
                                  uint32_t i, wsync_rma_rkey_t *key, uint64_t shard_addr,
                                  size_t gap_max, uint64_t v, store_landing_t *ld)
{
    const wsync_segment_t *sg = &r->m.segs[i];
    const wsync_chunk_t *c = &r->m.plan->chunks[sg->chunk];
    size_t esz = wsync_dtype_size(c->dtype);
    store_getter_t g = {r, st, c->sender, key, v, ld};

    return wsync_stage_rows(ring, ring_get, &g, shard_addr + c->src.off * esz,
                            (size_t)c->src.pitch * esz, (size_t)c->src.cols * esz, c->src.rows,
                            (uint8_t *)r->land[sg->target] + sg->dst.off * esz,
                            (size_t)sg->dst.pitch * esz, gap_max,
                            wsync_deadline_in(r->m.timeout_ms));
}

/* Segment sg, verified: batches of its rows arrive as whole checksum blocks into the bounce
 * buffer, are checked, then copied (and cast) into the target, or (dense not NULL) into dense
 * [rows, cols] in the chunk's dtype. */
static wsync_status_t read_verified(wsync_receiver_t *r, store_receiver_t *st, uint32_t i,
                                    const struct wsync_dir_shard *sh,
                                    const struct wsync_dir_region *rg, wsync_rma_rkey_t *key,
                                    const store_sums_t *x, uint64_t v, store_landing_t *ld,
                                    uint8_t *dense)
{
    const wsync_segment_t *sg = &r->m.segs[i];
    const wsync_chunk_t *c = &r->m.plan->chunks[sg->chunk];
    const wsync_target_desc_t *t = &r->targets[sg->target];
    size_t esz = wsync_dtype_size(c->dtype);
    uint64_t bytes = x->shard_bytes[c->shard], span = c->src.pitch * esz;
    uint64_t batch = WSYNC_MAX(1, VERIFY_BATCH / (span ? span : 1));
    wsync_status_t rc;

    for (uint64_t r0 = 0; r0 < c->src.rows; r0 += batch) {
        uint64_t n = WSYNC_MIN(batch, c->src.rows - r0);
        uint64_t first = (c->src.off + r0 * c->src.pitch) * esz;
        uint64_t last = (c->src.off + (r0 + n - 1) * c->src.pitch + c->src.cols) * esz;
        uint64_t lo = first / x->block * x->block;
        uint64_t hi = WSYNC_MIN((last + x->block - 1) / x->block * x->block, bytes);
        if (last > bytes || sh->addr + hi > rg->base + rg->len)
            return wsync_err(WSYNC_ERR_PROTOCOL, "store: version %llu: sender %u shard %u: the "
                             "plan reads up to byte %llu of a %llu-byte shard", (unsigned long long)v,
                             c->sender, c->shard, (unsigned long long)last,
                             (unsigned long long)bytes);
        if ((rc = grow_bounce(st, (size_t)(hi - lo))) != WSYNC_OK ||
            (rc = post_get(r, st, c->sender, key, sh->addr + lo, st->bounce, (size_t)(hi - lo), v,
                           ld)) != WSYNC_OK ||
            (rc = flush_landed(r, st, v, ld)) != WSYNC_OK)
            return rc;
        for (uint64_t o = lo; o < hi; o += x->block) {
            uint64_t want = x->sums[x->first[c->shard] + o / x->block];
            uint64_t got = XXH3_64bits(st->bounce + (o - lo), (size_t)WSYNC_MIN(x->block, hi - o));
            if (got != want)
                return wsync_err(WSYNC_ERR_INTEGRITY, "store: receiver %d: version %llu refused: "
                                 "param '%s' (target '%s') from sender %u, chunk %u (shard %u, "
                                 "block %llu): the sender's xxh3 is %016llx, what arrived hashes "
                                 "to %016llx", r->m.rank, (unsigned long long)v,
                                 t->pieces[sg->piece].param.name, t->name, c->sender, sg->chunk,
                                 c->shard, (unsigned long long)(o / x->block),
                                 (unsigned long long)want, (unsigned long long)got);
        }
        wsync_region_t from = {first / esz - lo / esz, c->src.pitch, n, c->src.cols};
        wsync_region_t to = {sg->dst.off + r0 * sg->dst.pitch, sg->dst.pitch, n, sg->dst.cols};
        wsync_region_t packed = {r0 * c->src.cols, c->src.cols, n, c->src.cols};
        rc = dense != NULL ? wsync_exec_copy(st->bounce, c->dtype, &from, dense, c->dtype, &packed)
                           : land_copy(r, st, st->bounce, c->dtype, &from, sg->target, &to);
        if (rc != WSYNC_OK)
            return rc;
    }
    return WSYNC_OK;
}

/* A transport's failure (which names the peer by its address), said again with the sender's
 * rank; failures that already name what was wrong pass as they are. */
static wsync_status_t from_sender(wsync_receiver_t *r, wsync_status_t rc, int sender, uint64_t v)
{
    char detail[1024];

    if (rc == WSYNC_OK || rc == WSYNC_ERR_INTEGRITY || rc == WSYNC_ERR_PROTOCOL ||
        rc == WSYNC_ERR_NOMEM || (rc == WSYNC_ERR_IO && strstr(wsync_last_error(), "injected")))
        return rc;
    snprintf(detail, sizeof(detail), "%s", wsync_last_error());
    if (sender < 0)
        return wsync_err(rc, "store: receiver %d: reading version %llu from the senders: %s",
                         r->m.rank, (unsigned long long)v, detail);
    return wsync_err(rc, "store: receiver %d: reading version %llu from sender %d (pid %u): %s",
                     r->m.rank, (unsigned long long)v, sender, r->m.planmsg.peers[sender].pid,
                     detail);
}

/* The delta path's gets (schemes/store_delta.h): through rkey_for and post_get, as ours. */
typedef struct {
    wsync_receiver_t *r;
    store_receiver_t *st;
    uint64_t v;
    store_landing_t *ld;
} store_dio_t;

static wsync_status_t dio_get(void *arg, uint32_t s, const uint8_t *rkey, size_t rkey_len,
                              uint64_t addr, void *dst, size_t len)
{
    store_dio_t *io = arg;
    wsync_rma_rkey_t *key = NULL;
    wsync_status_t rc = rkey_for(io->st, s, rkey, rkey_len, &key);

    for (size_t o = 0; o < len && rc == WSYNC_OK; o += GET_PIECE)
        rc = post_get(io->r, io->st, s, key, addr + o, (uint8_t *)dst + o,
                      (size_t)WSYNC_MIN(GET_PIECE, len - o), io->v, io->ld);
    return from_sender(io->r, rc, (int)s, io->v);
}

static wsync_status_t dio_flush(void *arg)
{
    store_dio_t *io = arg;
    return from_sender(io->r, flush_landed(io->r, io->st, io->v, io->ld), -1, io->v);
}

/* WSYNC_VERIFY: an FP8 chunk no packed region holds whole (schemes/store_fp8.c quantizes it
 * here), its plain rows checked against its sender's checksums, dense into dst. */
typedef struct {
    wsync_receiver_t *r;
    store_receiver_t *st;
    const wsync_dir_entry_t *e;
    const store_sums_t *sums;
    uint64_t v;
    store_landing_t *ld;
} store_vio_t;

static wsync_status_t plain_verified(void *arg, uint32_t i, uint8_t *dst)
{
    store_vio_t *io = arg;
    const wsync_chunk_t *c = &io->r->m.plan->chunks[io->r->m.segs[i].chunk];
    const wsync_dir_entry_t *en = &io->e[c->sender];
    const store_sums_t *x = &io->sums[c->sender];
    wsync_rma_rkey_t *key = NULL;

    if (x->block == 0)
        return wsync_err(WSYNC_ERR_INTEGRITY, "store: receiver %d: version %llu refused: it "
                         "cannot be verified, sender %u published it without checksums "
                         "(WSYNC_VERIFY=1 must be set on the senders too)", io->r->m.rank,
                         (unsigned long long)io->v, c->sender);
    if (c->shard >= en->nshards || c->shard >= x->nshards)
        return wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %u's directory entry or checksums for "
                         "version %llu lack shard %u, which the plan reads", c->sender,
                         (unsigned long long)io->v, c->shard);
    const struct wsync_dir_shard *sh = &en->shards[c->shard];
    const struct wsync_dir_region *rg = &en->regions[sh->region];
    wsync_status_t rc = rkey_for(io->st, c->sender, rg->rkey, rg->rkey_len, &key);
    if (rc == WSYNC_OK)
        rc = read_verified(io->r, io->st, i, sh, rg, key, x, io->v, io->ld, dst);
    return from_sender(io->r, rc, (int)c->sender, io->v);
}

/* Read version v's segments of ours, as the directory entries say where they lie. */
static wsync_status_t read_version_in(wsync_receiver_t *r, store_receiver_t *st,
                                      const wsync_dir_entry_t *e, const store_sums_t *sums,
                                      const store_fp8_table_t *tabs, uint64_t v, uint64_t *bytes,
                                      store_landing_t *ldp)
{
    const wsync_plan_t *plan = r->m.plan;
    uint64_t posted = 0;
    store_landing_t *ld = ldp;   /* the ring's flushes see it too */
    wsync_status_t rc;

    if (st->drx != NULL) {
        /* first the deltas this reader can take; the rest is read plain below */
        store_dio_t dio = {r, st, v, ld};
        wsync_store_io_t io = {dio_get, dio_flush, &dio};
        if ((rc = wsync_store_drx_read(r, st->drx, &io, e, v, bytes)) != WSYNC_OK)
            return rc;
    }
    if (st->frx != NULL) {
        /* FP8 chunks: their senders' codes and scales (FP8 on the wire) */
        store_dio_t dio = {r, st, v, ld};
        wsync_store_io_t io = {dio_get, dio_flush, &dio};
        store_vio_t vio = {r, st, e, sums, v, ld};
        if ((rc = wsync_store_frx_read(r, st->frx, &io, plain_verified, &vio, e, tabs, v,
                                       st->stream, bytes)) != WSYNC_OK)
            return rc;
    }
    for (uint32_t i = st->lo; i < st->hi; i++) {
        if (wsync_store_drx_done(st->drx, i) || plan->chunks[r->m.segs[i].chunk].rule != 0)
            continue;
        const wsync_segment_t *sg = &r->m.segs[i];
        const wsync_chunk_t *c = &plan->chunks[sg->chunk];
        const wsync_dir_entry_t *en = &e[c->sender];
        size_t esz = wsync_dtype_size(c->dtype);
        wsync_dtype_t land_dtype = r->land_dtype[sg->target];
        uint8_t *land = r->land[sg->target];
        int direct = land_dtype == c->dtype;
        wsync_rma_rkey_t *key = NULL;

        const struct wsync_dir_region *rg = NULL;
        uint64_t first = 0;
        if ((rc = wsync_dir_chunk_span(en, c, v, &rg, &first)) != WSYNC_OK)
            return rc;
        const struct wsync_dir_shard *sh = &en->shards[c->shard];
        rc = rkey_for(st, c->sender, rg->rkey, rg->rkey_len, &key);
        if (rc != WSYNC_OK)
            return from_sender(r, rc, (int)c->sender, v);
        size_t row = (size_t)(c->src.cols * esz);
        if (r->m.ctx->verify) {
            const store_sums_t *x = &sums[c->sender];
            if (x->block == 0)
                return wsync_err(WSYNC_ERR_INTEGRITY, "store: receiver %d: version %llu refused: "
                                 "it cannot be verified, sender %u published it without checksums "
                                 "(WSYNC_VERIFY=1 must be set on the senders too)", r->m.rank,
                                 (unsigned long long)v, c->sender);
            if (c->shard >= x->nshards)
                return wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %u's checksums for version "
                                 "%llu cover %u shards; the plan reads shard %u", c->sender,
                                 (unsigned long long)v, x->nshards, c->shard);
            rc = read_verified(r, st, i, sh, rg, key, x, v, ld, NULL);
            posted = 0;
        } else if (direct && st->staged &&
                   (st->stage_all || r->targets[sg->target].mem == WSYNC_MEM_CUDA)) {
            rc = read_staged(r, st, &st->ring, i, key, sh->addr, st->gap_max, v, ld);
            posted = 0;
        } else if (direct && c->src.rows > 1 && c->src.pitch != c->src.cols &&
                   row <= SPAN_ROW_MAX &&
                   wsync_stage_spans(row, (size_t)(c->src.pitch * esz), st->gap_max)) {
            /* a column slice of small rows close together: spans, scattered by memcpy */
            if (!st->hstaged)
                rc = host_span_setup(r, st);
            if (rc == WSYNC_OK)
                rc = read_staged(r, st, &st->hring, i, key, sh->addr, st->gap_max, v, ld);
            posted = 0;
        } else if (direct) {
            /* straight into the target, one get per row, or one for a contiguous block */
            if (c->src.pitch == c->src.cols && sg->dst.pitch == sg->dst.cols) {
                uint64_t all = c->src.rows * row;
                for (uint64_t o = 0; o < all && rc == WSYNC_OK; o += GET_PIECE)
                    rc = post_get(r, st, c->sender, key, first + o, land + sg->dst.off * esz + o,
                                  (size_t)WSYNC_MIN(GET_PIECE, all - o), v, ld);
                posted += all;
            } else {
                for (uint64_t k = 0; k < c->src.rows && rc == WSYNC_OK; k++)
                    rc = post_get(r, st, c->sender, key,
                                  sh->addr + (c->src.off + k * c->src.pitch) * esz,
                                  land + (sg->dst.off + k * sg->dst.pitch) * esz, row, v, ld);
                posted += c->src.rows * row;
            }
            if (rc == WSYNC_OK && posted >= FLUSH_EVERY) {
                rc = flush_landed(r, st, v, ld);
                posted = 0;
            }
        } else {
            /* a cast: the chunk lands in the bounce buffer (dense, or as one span, gaps included,
             * when they are at most gap_max), then the executor converts */
            size_t pitch = (size_t)(c->src.pitch * esz);
            int span = c->src.rows > 1 && wsync_stage_spans(row, pitch, st->gap_max);
            size_t need = span ? (size_t)(c->src.rows - 1) * pitch + row
                               : (size_t)c->src.rows * row;
            rc = grow_bounce(st, need);
            if (span) {
                store_getter_t g = {r, st, c->sender, key, v, ld};
                if (rc == WSYNC_OK)
                    rc = ring_get(&g, first, st->bounce, need);
            }
            for (uint64_t k = 0; !span && k < c->src.rows && rc == WSYNC_OK; k++)
                rc = post_get(r, st, c->sender, key, sh->addr + (c->src.off + k * c->src.pitch) * esz,
                              st->bounce + k * row, row, v, ld);
            if (rc == WSYNC_OK)
                rc = flush_landed(r, st, v, ld);
            wsync_region_t from = {0, span ? c->src.pitch : c->src.cols, c->src.rows, c->src.cols};
            if (rc == WSYNC_OK)
                rc = land_copy(r, st, st->bounce, c->dtype, &from, sg->target, &sg->dst);
            posted = 0;
        }
        if (rc != WSYNC_OK)
            return from_sender(r, rc, posted > 0 ? -1 : (int)c->sender, v);
        *bytes += c->src.rows * c->src.cols * wsync_dtype_size(land_dtype);
    }
    /* the staged slots still on their way, and the last batch (verified reads flushed each of
     * theirs) */
    if (st->staged && (rc = wsync_stage_finish(&st->ring, wsync_deadline_in(r->m.timeout_ms))) !=
                          WSYNC_OK)
        return from_sender(r, rc, -1, v);
    if (st->hstaged && (rc = wsync_stage_finish(&st->hring, wsync_deadline_in(r->m.timeout_ms))) !=
                           WSYNC_OK)
        return from_sender(r, rc, -1, v);
    return r->m.ctx->verify && st->lo < st->hi ? WSYNC_OK
                                               : from_sender(r, flush_landed(r, st, v, ld), -1, v);
}

/* read_version_in, with the staged path's context: the version and landing record its ring
 * flushes, CUDA device current; on failure the ring's copies are waited for. */
static wsync_status_t read_version(wsync_receiver_t *r, store_receiver_t *st,
                                   const wsync_dir_entry_t *e, const store_sums_t *sums,
                                   const store_fp8_table_t *tabs, uint64_t v, uint64_t *bytes)
{
    store_landing_t ld = {NULL, 0, NULL, 0, 0, 0, 0, 0};
    int saved = -1;
    wsync_status_t rc;

    st->r = r;
    st->v = v;
    st->ld = &ld;
    if (st->cuda && (rc = wsync_dev_enter(r->device, &saved)) != WSYNC_OK)
        return rc;
    uint64_t t0 = wsync_now_ns();
    rc = read_version_in(r, st, e, sums, tabs, v, bytes, &ld);
    if (rc != WSYNC_OK && (st->staged || st->hstaged)) {
        char text[1024];
        snprintf(text, sizeof(text), "%s", wsync_last_error());
        if (st->staged)
            wsync_stage_abandon(&st->ring, wsync_deadline_in(r->m.timeout_ms));
        if (st->hstaged)
            wsync_stage_abandon(&st->hring, wsync_deadline_in(r->m.timeout_ms));
        wsync_err_set_text(rc, text);
    }
    if (rc == WSYNC_OK)
        WSYNC_LOG_D("store: receiver %d read version %llu in %llu gets (%llu under %u KiB), "
                    "%llu bytes, %llu flushes, %.1f ms", r->m.rank, (unsigned long long)v,
                    (unsigned long long)ld.gets, (unsigned long long)ld.small, SMALL_GET >> 10,
                    (unsigned long long)ld.bytes, (unsigned long long)ld.flushes,
                    (double)(wsync_now_ns() - t0) / 1e6);
    if (st->cuda)
        wsync_dev_leave(r->device, saved);
    st->ld = NULL;
    return rc;
}

static wsync_status_t store_receiver_fetch(wsync_receiver_t *r, uint64_t want, int timeout_ms,
                                           uint64_t *got)
{
    store_receiver_t *st = r->m.scheme_state;
    const uint16_t types[] = {WSYNC_MSG_DIRECTORY};
    int64_t deadline = wsync_deadline_in(timeout_ms);
    wsync_dir_entry_t *e = NULL;
    store_sums_t *sums = NULL;
    store_fp8_table_t *tabs = NULL;
    wsync_status_t rc;
    wsync_wbuf_t b;
    wsync_msg_t *msg = NULL;
    uint64_t v = 0, bytes = 0, seq = ++st->seq;
    uint32_t n = 0;

    wsync_wbuf_init(&b);
    wsync_put_u64(&b, want);
    wsync_put_u64(&b, r->version);
    wsync_put_u64(&b, seq);
    rc = wsync_conn_send(r->m.ctrl, WSYNC_MSG_FETCH, b.data, (uint32_t)b.len, NULL, 0,
                         r->m.timeout_ms);
    wsync_wbuf_free(&b);
    if (rc != WSYNC_OK)
        return rc;
    for (;;) {
        wsync_rbuf_t rb;
        rc = wsync_inbox_pop(&r->m.inbox, types, 1, deadline, &msg);
        if (rc == WSYNC_ERR_TIMEOUT) {
            wsync_member_send_u64(&r->m, WSYNC_MSG_CANCEL, want);
            if (want != 0)
                return wsync_err(rc, "store: receiver %d: version %llu was not published within "
                                 "%d ms", r->m.rank, (unsigned long long)want, timeout_ms);
            return wsync_err(rc, "store: receiver %d: no version newer than %llu within %d ms",
                             r->m.rank, (unsigned long long)r->version, timeout_ms);
        }
        if (rc != WSYNC_OK)
            return rc;
        wsync_rbuf_init(&rb, msg->payload, msg->len);
        if (wsync_get_u64(&rb) == seq && !rb.err)
            break;
        wsync_msg_free(msg);            /* the answer to a fetch given up on: its lease is gone */
    }
    {
        wsync_rbuf_t rb;
        char text[1024];
        wsync_rbuf_init(&rb, msg->payload, msg->len);
        (void)wsync_get_u64(&rb);
        wsync_status_t status = (wsync_status_t)wsync_get_i32(&rb);
        char *t = wsync_get_str(&rb, WSYNC_STR_MAX);
        snprintf(text, sizeof(text), "%s", t ? t : "");
        free(t);
        if (!rb.err && status != WSYNC_OK) {
            wsync_msg_free(msg);
            return wsync_err(status < 0 && status >= WSYNC_ERR_INTERNAL ? status : WSYNC_ERR_PROTOCOL,
                             "store: receiver %d: %s", r->m.rank, text);
        }
        v = wsync_get_u64(&rb);
        n = wsync_get_u32(&rb);
        if (rb.err || n != st->nsenders || v == 0) {
            wsync_msg_free(msg);
            return wsync_err(WSYNC_ERR_PROTOCOL, "store: receiver %d: malformed DIRECTORY", r->m.rank);
        }
        e = calloc(n, sizeof(*e));
        sums = calloc(n, sizeof(*sums));
        tabs = calloc(n, sizeof(*tabs));
        rc = e == NULL || sums == NULL || tabs == NULL
                 ? wsync_err(WSYNC_ERR_NOMEM, "store: no memory") : WSYNC_OK;
        for (uint32_t s = 0; s < n && rc == WSYNC_OK; s++) {
            rc = wsync_dir_entry_decode(&rb, &e[s]);
            if (rc == WSYNC_OK && e[s].sender != s)
                rc = wsync_err(WSYNC_ERR_PROTOCOL, "store: directory entries out of order");
            if (rc == WSYNC_OK)
                rc = sums_decode(&rb, s, &sums[s]);
            if (rc == WSYNC_OK)
                rc = wsync_store_fp8_table_decode(&rb, s, &e[s], &tabs[s]);
        }
        wsync_msg_free(msg);
    }
    if (rc == WSYNC_OK && st->ctx == NULL)
        rc = open_rma(e[0].transport, &st->rma, &st->ctx, st->info, sizeof(st->info));
    for (uint32_t s = 0; s < n && rc == WSYNC_OK; s++) {
        if (strcmp(e[s].transport, st->rma->name) != 0)
            rc = wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %u publishes over %s, sender 0 over %s",
                           s, e[s].transport, st->rma->name);
        else
            rc = from_sender(r, connect_sender(st, s, &e[s]), (int)s, v);
    }
    if (rc == WSYNC_OK) {
        r->torn = 1;   /* from here on the targets no longer hold only the last version */
        rc = read_version(r, st, e, sums, tabs, v, &bytes);
        if (rc != WSYNC_OK) {
            /* let the gets already posted finish before anything is torn down: a reader that
             * goes away with a get in flight can abort the owner serving it (UCX 1.13 software
             * RMA) */
            char text[1024];
            snprintf(text, sizeof(text), "%s", wsync_last_error());
            st->rma->flush(st->ctx, wsync_deadline_in(r->m.timeout_ms));
            wsync_err_set_text(rc, text);
        }
        /* TIMEOUT from a fetch means that nothing was written; reads that stalled have written
         * some: a sender that does not serve them is lost to us */
        if (rc == WSYNC_ERR_TIMEOUT) {
            char detail[1024];
            snprintf(detail, sizeof(detail), "%s", wsync_last_error());
            rc = wsync_err(WSYNC_ERR_PEER_LOST, "store: receiver %d: the reads of version %llu "
                           "did not complete: %s", r->m.rank, (unsigned long long)v, detail);
        }
    }
    for (uint32_t s = 0; e != NULL && s < n; s++)
        wsync_dir_entry_clear(&e[s]);
    for (uint32_t s = 0; sums != NULL && s < n; s++)
        sums_clear(&sums[s]);
    for (uint32_t s = 0; tabs != NULL && s < n; s++)
        wsync_store_fp8_table_clear(&tabs[s]);
    free(e);
    free(sums);
    free(tabs);
    if (rc == WSYNC_OK && r->progress != NULL)
        r->progress(r->progress_arg, v, bytes, bytes);   /* still under the lease */
    /* the lease ends either way; a failed read is the caller's error to report */
    wsync_member_send_u64(&r->m, WSYNC_MSG_READ_DONE, v);
    if (rc != WSYNC_OK)
        return rc;
    *got = v;
    return WSYNC_OK;
}

static wsync_status_t store_receiver_recv(wsync_receiver_t *r, uint64_t version)
{
    (void)version;
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "store: receiver %d: versions are fetched, not pushed",
                     r->m.rank);
}

const wsync_scheme_ops_t wsync_scheme_store = {
    .name = "store",
    .implemented = 1,
    .async = 1,
    .delta = 1,
    .score = store_score,
    .sender_setup = store_sender_setup,
    .sender_push = store_sender_push,
    .sender_teardown = store_sender_teardown,
    .receiver_setup = store_receiver_setup,
    .receiver_recv = store_receiver_recv,
    .receiver_fetch = store_receiver_fetch,
    .receiver_teardown = store_receiver_teardown,
};
