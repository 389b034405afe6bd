/* The store scheme's delta versions: see schemes/store_delta.h. */
#include "schemes/store_delta.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/delta.h"
#include "core/delta_state.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/relay.h"
#include "core/util.h"
#include "core/workpool.h"
#include "kernels/delta.h"
#include "kernels/device.h"
#include "wsync_build_config.h"

#define ROW WSYNC_DIR_DELTA_ROW
/* a delta buffer's first size, grown geometrically */
#define DBUF_MIN (1ull << 20)

static uint64_t plain_bytes(const wsync_chunk_t *c)
{
    return c->src.rows * c->src.cols * wsync_dtype_size(c->dtype);
}

static uint64_t align8(uint64_t v)
{
    return (v + 7) / 8 * 8;
}

/* The table is little-endian on the wire, whatever the hosts. */
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* One item of a pool's run (a region to encode, a chunk to apply): runs take them largest first,
 * so that the last items to start are small ones and the threads end together. */
typedef struct {
    uint64_t bytes;
    uint32_t j;
} work_t;

static int work_cmp(const void *x, const void *y)
{
    const work_t *a = x, *b = y;
    if (a->bytes != b->bytes)
        return a->bytes > b->bytes ? -1 : 1;
    return (a->j > b->j) - (a->j < b->j);
}

/* The baselines of host shards are refreshed in pieces of this many bytes over the pool. */
#define COPY_PIECE (16ull << 20)

/* ---- sender ---------------------------------------------------------------------------------- */

/* One shard region some reader asked for (its plan's chunk of this sender), table key order. */
typedef struct {
    uint32_t shard;
    uint32_t gpu;                    /* a reader applies it on the GPU: format 3, else 4 */
    wsync_region_t g;
} dreg_t;

typedef struct {
    uint8_t *mem;
    size_t cap;
    wsync_rma_mr_t *mr;              /* NULL: not registered (new, or grown this version) */
    int pinned;                      /* pinned by us for the device encoder's copies (CUDA shards) */
    int pin_tried;                   /* since it last moved (memory pinned already stays as is) */
    uint8_t rkey[WSYNC_RMA_BLOB_MAX];
    size_t rkey_len;
    uint64_t version;                /* the published version it holds; 0: free */
} dbuf_t;

struct store_dtx {
    const wsync_rma_ops_t *rma;
    wsync_rma_t *ctx;
    int device;
    int rank;
    size_t nshards;
    /* baselines: each shard's values as of `base`, same memory kind (CUDA shards: device memory,
     * or pinned host memory with delta_baseline = host) */
    void **bl;                       /* [nshards] */
    uint8_t *bl_kind;                /* [nshards] 0 host, 1 device, 2 pinned host */
    uint64_t bl_bytes;
    uint64_t next_base;              /* the last version published whole, 0: none */
    uint64_t pending;                /* the version in flight */
    dreg_t *regs;                    /* sorted, unique */
    uint32_t nregs, cap_regs;
    int regs_changed;                /* the device batch must be made again */
    uint64_t *off, *len, *hash;      /* [nregs] this version's rows */
    uint8_t *skip;                   /* [nregs] host regions: versions left read plain without
                                        encoding (the region went plain by the cut-off) */
    dbuf_t *bufs;
    int nbufs;
    int cur;                         /* the buffer of the version in flight, -1 */
    /* the CPU encode runs over a pool made at set-up: each thread encodes a region into its own
     * scratch (the region's cut-off in bytes, the most the encoder writes), then appends what it
     * wrote to the version's buffer under `mu` */
    wsync_workpool_t *pool;
    uint8_t **scratch;               /* [pool size] */
    uint64_t *scratch_cap;
    pthread_mutex_t mu;
    work_t *work;                    /* [nregs] this version's host regions to encode */
    uint32_t nwork;
    uint64_t copy_pieces;            /* host shards' baselines: COPY_PIECE pieces in all */
    /* regions of CUDA shards with device baselines: encoded on the GPU */
    uint32_t nenc;
    uint32_t *enc_reg;               /* [nenc] index in regs */
    uint64_t *enc_cap, *enc_at;      /* [nenc] room in dev_out, and where */
    uint8_t *dev_out;
#if WSYNC_HAVE_CUDA
    wsync_kdelta_batch_t *batch;
#endif
};

static int reg_cmp(const void *x, const void *y)
{
    const dreg_t *a = x, *b = y;
    uint64_t ka[5] = {a->shard, a->g.off, a->g.rows, a->g.cols, a->g.pitch};
    uint64_t kb[5] = {b->shard, b->g.off, b->g.rows, b->g.cols, b->g.pitch};
    for (int i = 0; i < 5; i++)
        if (ka[i] != kb[i])
            return ka[i] < kb[i] ? -1 : 1;
    return 0;
}

static uint64_t shard_bytes(const wsync_shard_desc_t *d)
{
    uint64_t n = wsync_dtype_size(d->param.dtype);
    for (int i = 0; i < d->param.ndim; i++)
        n *= (uint64_t)d->box.len[i];
    return n;
}

static void dev_batch_free(store_dtx_t *d)
{
    int saved = -1;
    if (d->dev_out == NULL
#if WSYNC_HAVE_CUDA
        && d->batch == NULL
#endif
    )
        return;
    if (wsync_dev_enter(d->device, &saved) != WSYNC_OK)
        return;
#if WSYNC_HAVE_CUDA
    wsync_kdelta_free(d->batch);
    d->batch = NULL;
#endif
    wsync_dev_free(d->dev_out);
    d->dev_out = NULL;
    wsync_dev_leave(d->device, saved);
}

void wsync_store_dtx_free(store_dtx_t *d)
{
    if (d == NULL)
        return;
    for (int i = 0; i < d->nbufs; i++) {
        if (d->bufs[i].mr != NULL)
            d->rma->dereg(d->bufs[i].mr);
        if (d->bufs[i].pinned)
            wsync_dev_host_unregister(d->bufs[i].mem);
        free(d->bufs[i].mem);
    }
    dev_batch_free(d);
    for (size_t i = 0; d->bl != NULL && i < d->nshards; i++) {
        if (d->bl[i] == NULL)
            continue;
        if (d->bl_kind[i] == 1) {
            int saved = -1;
            if (wsync_dev_enter(d->device, &saved) == WSYNC_OK) {
                wsync_dev_free(d->bl[i]);
                wsync_dev_leave(d->device, saved);
            }
        } else {
            if (d->bl_kind[i] == 2)
                wsync_dev_host_unregister(d->bl[i]);
            free(d->bl[i]);
        }
    }
    free(d->bl);
    free(d->bl_kind);
    for (uint32_t i = 0; d->scratch != NULL && i < wsync_workpool_size(d->pool); i++)
        free(d->scratch[i]);
    free(d->scratch);
    free(d->scratch_cap);
    free(d->work);
    wsync_workpool_free(d->pool);
    pthread_mutex_destroy(&d->mu);
    free(d->bufs);
    free(d->regs);
    free(d->off);
    free(d->len);
    free(d->hash);
    free(d->skip);
    free(d->enc_reg);
    free(d->enc_cap);
    free(d->enc_at);
    free(d);
}

wsync_status_t wsync_store_dtx_create(wsync_sender_t *s, const wsync_rma_ops_t *rma,
                                      wsync_rma_t *ctx, store_dtx_t **out)
{
    store_dtx_t *d = calloc(1, sizeof(*d));
    wsync_status_t rc = WSYNC_OK;
    int saved = -1, entered = 0;

    if (d == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for delta versions");
    d->rma = rma;
    d->ctx = ctx;
    d->device = s->device;
    d->rank = s->m.rank;
    d->nshards = s->nshards;
    d->cur = -1;
    pthread_mutex_init(&d->mu, NULL);
    d->bl = calloc(s->nshards + 1, sizeof(*d->bl));
    d->bl_kind = calloc(s->nshards + 1, 1);
    if (d->bl == NULL || d->bl_kind == NULL) {
        wsync_store_dtx_free(d);
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for delta versions");
    }
    /* threads only where the CPU encodes: host shards (the variable is checked either way) */
    uint32_t nth = 1, host = 0;
    for (size_t i = 0; i < s->nshards; i++)
        host += s->shards[i].mem != WSYNC_MEM_CUDA;
    if ((rc = wsync_workpool_threads("WSYNC_DELTA_THREADS", &nth)) != WSYNC_OK ||
        (rc = wsync_workpool_create(host > 0 ? nth : 1, &d->pool)) != WSYNC_OK) {
        wsync_store_dtx_free(d);
        return rc;
    }
    nth = wsync_workpool_size(d->pool);
    d->scratch = calloc(nth, sizeof(*d->scratch));
    d->scratch_cap = calloc(nth, sizeof(*d->scratch_cap));
    if (d->scratch == NULL || d->scratch_cap == NULL) {
        wsync_store_dtx_free(d);
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for delta versions");
    }
    /* readers' regions are not known yet (they come when they like): every shard has one */
    for (size_t i = 0; i < s->nshards && rc == WSYNC_OK; i++) {
        size_t bytes = (size_t)shard_bytes(&s->shards[i]);
        if (s->shards[i].mem == WSYNC_MEM_CUDA && !s->delta_baseline_host) {
            if (!entered && (rc = wsync_dev_enter(s->device, &saved)) != WSYNC_OK)
                break;
            entered = 1;
            rc = wsync_dev_malloc(bytes ? bytes : 1, &d->bl[i]);
            d->bl_kind[i] = 1;
        } else {
            d->bl[i] = malloc(bytes + 1);
            if (d->bl[i] == NULL) {
                rc = wsync_err(WSYNC_ERR_NOMEM, "store: sender %d: no memory for the delta "
                               "baseline of param '%s' (%zu bytes)", s->m.rank,
                               s->shards[i].param.name, bytes);
            } else if (s->shards[i].mem == WSYNC_MEM_CUDA) {
                int reg = 0;
                rc = wsync_dev_host_register(d->bl[i], bytes + 1, 0, &reg);
                d->bl_kind[i] = reg ? 2 : 0;
            }
        }
        d->bl_bytes += bytes;
        if (s->shards[i].mem != WSYNC_MEM_CUDA)
            d->copy_pieces += (bytes + COPY_PIECE - 1) / COPY_PIECE;
    }
    if (entered)
        wsync_dev_leave(s->device, saved);
    if (rc != WSYNC_OK) {
        wsync_store_dtx_free(d);
        return rc;
    }
    WSYNC_LOG_I("store: sender %d: delta versions: baselines %.1f MiB (%s); regions come with the "
                "readers; cut-off %g of the plain bytes for host shards, %g for CUDA shards "
                "(device streams: at most half); %u threads encode host shards", s->m.rank,
                (double)d->bl_bytes / (1 << 20),
                s->delta_baseline_host ? "host" : "device for CUDA shards, host for host shards",
                wsync_delta_cutoff(s, 0), wsync_delta_cutoff(s, 1), nth);
    *out = d;
    return WSYNC_OK;
}

/* Region g lies in shard `shard` (its end computed without wrapping) and its bytes fit the
 * codec's u32 offsets (rows x cols <= its end: no overflow). */
static int region_in_shard(const wsync_sender_t *s, uint32_t shard, const wsync_region_t *g)
{
    if (shard >= s->nshards || g->rows == 0 || g->cols == 0 || g->cols > g->pitch)
        return 0;
    uint64_t esz = wsync_dtype_size(s->shards[shard].param.dtype);
    uint64_t end = wsync_region_end(g);
    return end != 0 && end <= shard_bytes(&s->shards[shard]) / esz &&
           g->rows * g->cols * esz <= UINT32_MAX;
}

/* A reader's regions (relay STORE_DELTA_TAG): u32 n, n x (u32 shard, u32 flags, u64 off, rows,
 * cols, pitch); new ones join the sorted set, and a region any reader applies on the GPU (flags
 * without STORE_DELTA_CPU) is encoded in format 3 for all. A region outside its shard, unknown
 * flags, or a malformed message, is refused whole (the set as it was; WSYNC_ERR_PROTOCOL naming
 * the reader and the region): that reader then reads those chunks plain, as it does any chunk
 * the table has no row for. */
static wsync_status_t add_regions(wsync_sender_t *s, store_dtx_t *d, const wsync_relay_t *m)
{
    wsync_rbuf_t rb;
    uint32_t n;

    wsync_rbuf_init(&rb, m->data, m->len);
    n = wsync_get_count(&rb, 40);
    if (rb.err)
        return wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %d: malformed delta regions from "
                         "receiver %d", s->m.rank, m->rank);
    if (d->nregs + n > d->cap_regs) {
        uint32_t cap = WSYNC_MAX(d->nregs + n, d->cap_regs * 2);
        dreg_t *nr = realloc(d->regs, (size_t)cap * sizeof(*nr));
        if (nr == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for delta regions");
        d->regs = nr;
        d->cap_regs = cap;
    }
    uint32_t had = d->nregs;
    for (uint32_t i = 0; i < n && !rb.err; i++) {
        dreg_t x;
        uint32_t flags;
        x.shard = wsync_get_u32(&rb);
        flags = wsync_get_u32(&rb);
        x.gpu = !(flags & STORE_DELTA_CPU);
        x.g.off = wsync_get_u64(&rb);
        x.g.rows = wsync_get_u64(&rb);
        x.g.cols = wsync_get_u64(&rb);
        x.g.pitch = wsync_get_u64(&rb);
        if (rb.err)
            break;
        if (flags & ~STORE_DELTA_CPU) {
            d->nregs = had;
            return wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %d: receiver %d's delta region "
                             "%u has unknown flags 0x%x", s->m.rank, m->rank, i, flags);
        }
        if (!region_in_shard(s, x.shard, &x.g)) {
            d->nregs = had;
            return wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %d: receiver %d asked for deltas "
                             "of region %u (off %llu, %llu x %llu, pitch %llu), outside shard %u",
                             s->m.rank, m->rank, i, (unsigned long long)x.g.off,
                             (unsigned long long)x.g.rows, (unsigned long long)x.g.cols,
                             (unsigned long long)x.g.pitch, x.shard);
        }
        d->regs[d->nregs++] = x;   /* one the set has already merges below (its flag too) */
    }
    if (rb.err || wsync_rbuf_left(&rb) != 0) {
        d->nregs = had;
        return wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %d: malformed delta regions from "
                         "receiver %d", s->m.rank, m->rank);
    }
    qsort(d->regs, d->nregs, sizeof(*d->regs), reg_cmp);
    uint32_t k = 0;
    for (uint32_t i = 0; i < d->nregs; i++)
        if (k == 0 || reg_cmp(&d->regs[k - 1], &d->regs[i]) != 0)
            d->regs[k++] = d->regs[i];
        else
            d->regs[k - 1].gpu |= d->regs[i].gpu;
    if (k != had) {
        d->nregs = k;
        d->regs_changed = 1;
        WSYNC_LOG_D("store: sender %d: receiver %d's delta regions: %u in all", s->m.rank,
                    m->rank, k);
    }
    d->nregs = k;
    return WSYNC_OK;
}

/* Per-region arrays, and the device batch over the regions of CUDA shards with device
 * baselines (made again when the regions change). */
static wsync_status_t regs_ready(wsync_sender_t *s, store_dtx_t *d)
{
    if (!d->regs_changed)
        return WSYNC_OK;
    size_t n = (size_t)d->nregs + 1;
    uint64_t *o = realloc(d->off, n * 8), *l = realloc(d->len, n * 8), *h = realloc(d->hash, n * 8);
    uint64_t *ec = realloc(d->enc_cap, n * 8), *ea = realloc(d->enc_at, n * 8);
    uint32_t *er = realloc(d->enc_reg, n * 4);
    uint8_t *sk = realloc(d->skip, n);
    work_t *wk = realloc(d->work, n * sizeof(*wk));
    if (wk != NULL)
        d->work = wk;
    if (o != NULL)
        d->off = o;
    if (l != NULL)
        d->len = l;
    if (h != NULL)
        d->hash = h;
    if (ec != NULL)
        d->enc_cap = ec;
    if (ea != NULL)
        d->enc_at = ea;
    if (er != NULL)
        d->enc_reg = er;
    if (sk != NULL)
        d->skip = sk;
    if (o == NULL || l == NULL || h == NULL || ec == NULL || ea == NULL || er == NULL ||
        sk == NULL || wk == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for delta regions");
    memset(d->skip, 0, n);   /* the regions' order changed: every one is probed again */
    dev_batch_free(d);
    d->nenc = 0;
    uint64_t total = 0;
    for (uint32_t i = 0; i < d->nregs; i++) {
        const dreg_t *x = &d->regs[i];
        if (s->shards[x->shard].mem != WSYNC_MEM_CUDA || d->bl_kind[x->shard] != 1)
            continue;
        uint64_t plain = x->g.rows * x->g.cols * wsync_dtype_size(s->shards[x->shard].param.dtype);
        d->enc_reg[d->nenc] = i;
        /* an encoding past half the plain bytes is read plain: the room bounds device memory;
         * a lower cut-off (delta_cutoff) stops the encoder earlier */
        d->enc_cap[d->nenc] = WSYNC_MIN(align8(plain / 2), wsync_delta_limit(s, 1, plain));
        d->enc_at[d->nenc] = total;
        total += align8(d->enc_cap[d->nenc]);   /* each stream starts 8-byte aligned */
        d->nenc++;
    }
    d->regs_changed = 0;
    if (d->nenc == 0)
        return WSYNC_OK;
#if WSYNC_HAVE_CUDA
    wsync_kdelta_enc_t *e = calloc(d->nenc, sizeof(*e));
    int saved = -1;
    wsync_status_t rc;
    if (e == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for delta versions");
    if ((rc = wsync_dev_enter(d->device, &saved)) != WSYNC_OK) {
        free(e);
        return rc;
    }
    rc = wsync_dev_malloc((size_t)(total ? total : 8), (void **)&d->dev_out);
    for (uint32_t i = 0; i < d->nenc && rc == WSYNC_OK; i++) {
        const dreg_t *x = &d->regs[d->enc_reg[i]];
        e[i] = (wsync_kdelta_enc_t){
            .new_base = s->shard_data[x->shard],
            .old_base = d->bl[x->shard],
            .src = x->g,
            .esize = (uint32_t)wsync_dtype_size(s->shards[x->shard].param.dtype),
            .out = d->dev_out + d->enc_at[i],
            .cap = d->enc_cap[i],
        };
    }
    /* regions of different readers may overlap: the baselines are refreshed whole afterwards */
    if (rc == WSYNC_OK)
        rc = wsync_kdelta_encode_create(e, d->nenc, 0, &d->batch);
    wsync_dev_leave(d->device, saved);
    free(e);
    if (rc != WSYNC_OK)
        d->regs_changed = 1;
    return rc;
#else
    d->regs_changed = 1;
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "store: delta versions of CUDA shards need CUDA (this "
                     "wsync was built without it)");
#endif
}

/* A free delta buffer for this version. */
static wsync_status_t take_buf(store_dtx_t *d)
{
    for (int i = 0; i < d->nbufs; i++) {
        if (d->bufs[i].version == 0) {
            d->cur = i;
            return WSYNC_OK;
        }
    }
    dbuf_t *nb = realloc(d->bufs, (size_t)(d->nbufs + 1) * sizeof(*nb));
    if (nb == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for delta versions");
    d->bufs = nb;
    memset(&d->bufs[d->nbufs], 0, sizeof(*nb));
    d->cur = d->nbufs++;
    return WSYNC_OK;
}

/* Room for `need` bytes in the current buffer (its memory may move: registered again later). */
static wsync_status_t buf_room(store_dtx_t *d, uint64_t need)
{
    dbuf_t *b = &d->bufs[d->cur];
    if (need <= b->cap)
        return WSYNC_OK;
    size_t cap = (size_t)WSYNC_MAX(WSYNC_MAX(need, (uint64_t)b->cap * 2), DBUF_MIN);
    if (b->mr != NULL) {
        d->rma->dereg(b->mr);
        b->mr = NULL;
    }
    if (b->pinned)
        wsync_dev_host_unregister(b->mem);
    b->pinned = b->pin_tried = 0;
    uint8_t *m = realloc(b->mem, cap);
    if (m == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: sender %d: no memory for a delta buffer of %zu "
                         "bytes", d->rank, cap);
    b->mem = m;
    b->cap = cap;
    return WSYNC_OK;
}

/* The delta.encoded fault point, on the stream just written at p. */
static wsync_status_t fault_point(wsync_sender_t *s, const dreg_t *x, uint64_t version, uint8_t *p,
                                  uint64_t len)
{
    switch (WSYNC_FAULT(WSYNC_FAULT_DELTA_CORRUPT)) {
    case WSYNC_FAULT_FAIL: {
        char where[160];
        snprintf(where, sizeof(where), "store sender %d, param '%s' of version %llu", s->m.rank,
                 s->shards[x->shard].param.name, (unsigned long long)version);
        return wsync_fault_err(WSYNC_FAULT_DELTA_CORRUPT, where);
    }
    case WSYNC_FAULT_CORRUPT:
        wsync_fault_flip(p, (size_t)len);
        WSYNC_LOG_W("store: sender %d: fault delta.encoded:corrupt flipped a bit of a region of "
                    "param '%s' of version %llu", s->m.rank, s->shards[x->shard].param.name,
                    (unsigned long long)version);
        return WSYNC_OK;
    default:
        return WSYNC_OK;
    }
}

typedef struct {
    wsync_sender_t *s;
    store_dtx_t *d;
    uint64_t used;                   /* the buffer's bytes so far (under d->mu) */
    atomic_uint_fast64_t enc_ns;     /* the items' times summed (the log) */
} tx_job_t;

/* Host region work[item]: encoded against its baseline into this thread's scratch, with the
 * cut-off as its room (an encoding that would pass it stops there and the region is read
 * plain), then appended to the version's buffer. */
static wsync_status_t tx_item(void *arg, uint32_t item, uint32_t worker)
{
    tx_job_t *job = arg;
    wsync_sender_t *s = job->s;
    store_dtx_t *d = job->d;
    uint32_t k = d->work[item].j;
    const dreg_t *x = &d->regs[k];
    uint32_t esz = (uint32_t)wsync_dtype_size(s->shards[x->shard].param.dtype);
    uint64_t limit = wsync_delta_limit(s, 0, x->g.rows * x->g.cols * esz), n = 0, h = 0;
    uint64_t t0 = wsync_now_ns();
    wsync_status_t rc = WSYNC_OK;

    if (limit > d->scratch_cap[worker]) {
        uint8_t *ns = realloc(d->scratch[worker], (size_t)limit);
        if (ns == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "store: sender %d: no memory for %llu bytes of "
                             "delta encoding (param '%s')", s->m.rank, (unsigned long long)limit,
                             s->shards[x->shard].param.name);
        d->scratch[worker] = ns;
        d->scratch_cap[worker] = limit;
    }
    /* format 4 (step-coded values) where every reader of the region applies on the CPU */
    if (wsync_delta_encode_format(x->gpu ? WSYNC_DELTA_FORMAT : WSYNC_DELTA_FORMAT_STEPS,
                                  s->shard_data[x->shard], d->bl[x->shard], &x->g, esz,
                                  d->scratch[worker], limit, &n, &h, NULL) != WSYNC_OK ||
        n >= limit) {
        d->skip[k] = (uint8_t)(WSYNC_DELTA_REPROBE - 1);
        atomic_fetch_add(&job->enc_ns, wsync_now_ns() - t0);
        return WSYNC_OK;
    }
    atomic_fetch_add(&job->enc_ns, wsync_now_ns() - t0);
    pthread_mutex_lock(&d->mu);
    if ((rc = buf_room(d, job->used + n)) == WSYNC_OK) {
        memcpy(d->bufs[d->cur].mem + job->used, d->scratch[worker], (size_t)n);
        d->off[k] = job->used;
        d->len[k] = n;
        d->hash[k] = h;
        job->used += align8(n);
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

#if WSYNC_HAVE_CUDA
/* The GPU's regions: one batched encode, then each stream that fits its room to the host buffer
 * at *used. */
static wsync_status_t dev_encode(wsync_sender_t *s, store_dtx_t *d, uint64_t version, void *stream,
                                 uint64_t *used)
{
    int64_t deadline = wsync_deadline_in(s->m.timeout_ms);
    wsync_status_t rc;

    if ((rc = wsync_kdelta_launch(d->batch, NULL, stream)) != WSYNC_OK ||
        (rc = wsync_dev_stream_sync(stream, deadline, "the store's delta encoding on the GPU")) !=
            WSYNC_OK)
        return rc;
    const wsync_kdelta_result_t *res = wsync_kdelta_results(d->batch);
    /* where each stream goes in the buffer, then the buffer's room once (it may move), then
     * every copy on the stream and one wait */
    uint64_t at = *used;
    for (uint32_t i = 0; i < d->nenc; i++) {
        uint32_t k = d->enc_reg[i];
        const dreg_t *x = &d->regs[k];
        uint64_t plain = x->g.rows * x->g.cols * wsync_dtype_size(s->shards[x->shard].param.dtype);
        d->hash[k] = res[i].hash;
        if (res[i].len > d->enc_cap[i] || res[i].len >= wsync_delta_limit(s, 1, plain))
            continue;   /* read plain: past its room or the cut-off */
        d->off[k] = at;
        d->len[k] = res[i].len;
        at += align8(res[i].len);
    }
    if (at == *used || (rc = buf_room(d, at)) != WSYNC_OK)
        return rc;
    /* pinned, so that each copy is queued, not waited for (pageable memory made every one of
     * hundreds a version wait: 8-36 ms for the Qwen3-0.6B shape on an H100); memory pinned
     * already (registered by someone else) is fine as it is */
    dbuf_t *b = &d->bufs[d->cur];
    if (!b->pin_tried) {
        b->pin_tried = 1;
        if ((rc = wsync_dev_host_register(b->mem, b->cap, 0, &b->pinned)) != WSYNC_OK)
            return rc;
    }
    for (uint32_t i = 0; i < d->nenc && rc == WSYNC_OK; i++) {
        uint32_t k = d->enc_reg[i];
        if (d->len[k] > 0)
            rc = wsync_dev_memcpy_async(b->mem + d->off[k],
                                        d->dev_out + d->enc_at[i], (size_t)d->len[k], stream);
    }
    if (rc == WSYNC_OK)
        rc = wsync_dev_stream_sync(stream, deadline, "the store's delta streams to the host");
    for (uint32_t i = 0; i < d->nenc && rc == WSYNC_OK; i++) {
        uint32_t k = d->enc_reg[i];
        if (d->len[k] > 0)
            rc = fault_point(s, &d->regs[k], version, b->mem + d->off[k], d->len[k]);
    }
    if (rc == WSYNC_OK)
        *used = at;
    return rc;
}
#endif

typedef struct {
    wsync_sender_t *s;
    store_dtx_t *d;
} copy_job_t;

/* Piece `item` of the host shards' baselines (COPY_PIECE bytes each, shard by shard). */
static wsync_status_t copy_item(void *arg, uint32_t item, uint32_t worker)
{
    copy_job_t *job = arg;
    uint64_t left = item;

    (void)worker;
    for (size_t i = 0; i < job->s->nshards; i++) {
        if (job->s->shards[i].mem == WSYNC_MEM_CUDA)
            continue;
        uint64_t bytes = shard_bytes(&job->s->shards[i]);
        uint64_t pieces = (bytes + COPY_PIECE - 1) / COPY_PIECE;
        if (left >= pieces) {
            left -= pieces;
            continue;
        }
        uint64_t at = left * COPY_PIECE;
        memcpy((uint8_t *)job->d->bl[i] + at, (const uint8_t *)job->s->shard_data[i] + at,
               (size_t)WSYNC_MIN(COPY_PIECE, bytes - at));
        return WSYNC_OK;
    }
    return wsync_err(WSYNC_ERR_INTERNAL, "store: baseline piece %u is past the shards", item);
}

/* Every shard's baseline to its new values (after encoding). */
static wsync_status_t refresh(wsync_sender_t *s, store_dtx_t *d, void *stream)
{
    copy_job_t job = {s, d};
    wsync_status_t rc;
    int saved = -1, entered = 0;

    rc = wsync_workpool_run(d->pool, (uint32_t)d->copy_pieces, copy_item, &job,
                            wsync_deadline_in(s->m.timeout_ms),
                            "store: refreshing the delta baselines");
    for (size_t i = 0; i < s->nshards && rc == WSYNC_OK; i++) {
        if (s->shards[i].mem != WSYNC_MEM_CUDA)
            continue;
        size_t bytes = (size_t)shard_bytes(&s->shards[i]);
        if (!entered && (rc = wsync_dev_enter(d->device, &saved)) != WSYNC_OK)
            break;
        entered = 1;
        rc = wsync_dev_memcpy_async(d->bl[i], s->shard_data[i], bytes, stream);
    }
    if (entered) {
        /* the trainer may step on once the push returns */
        wsync_status_t w = wsync_dev_stream_sync(stream, wsync_deadline_in(s->m.timeout_ms),
                                                 "the store's delta baselines of CUDA shards");
        rc = rc == WSYNC_OK ? w : rc;
        wsync_dev_leave(d->device, saved);
    }
    return rc;
}

wsync_status_t wsync_store_dtx_publish(wsync_sender_t *s, store_dtx_t *d, uint64_t version,
                                       void *stream, wsync_dir_entry_t *e)
{
    uint64_t base = d->next_base, enc = 0, plain = 0, used;
    wsync_status_t rc = WSYNC_OK;
    wsync_msg_t *msg;
    wsync_relay_t rl;

    uint64_t t0 = wsync_now_ns(), t_enc = t0;

    d->next_base = 0;   /* until this version is published whole */
    d->pending = version;
    e->delta_base = 0;
    /* readers that came since the last version: their regions */
    while (rc == WSYNC_OK && wsync_member_relay_recv(&s->m, 0, &msg, &rl) == WSYNC_OK) {
        /* a reader's bad regions cost that reader only: it reads those chunks plain */
        if (rl.tag == STORE_DELTA_TAG && rl.role == WSYNC_ROLE_RECEIVER &&
            add_regions(s, d, &rl) != WSYNC_OK)
            WSYNC_LOG_W("%s (that reader's regions left out: it reads them plain)",
                        wsync_last_error());
        wsync_msg_free(msg);
    }
    if (rc == WSYNC_OK)
        rc = regs_ready(s, d);
    if (rc != WSYNC_OK)
        return rc;
    used = align8((uint64_t)d->nregs * ROW);
    if (base != 0 && d->nregs > 0) {
        memset(d->len, 0, (size_t)d->nregs * sizeof(*d->len));
        memset(d->off, 0, (size_t)d->nregs * sizeof(*d->off));
        memset(d->hash, 0, (size_t)d->nregs * sizeof(*d->hash));
        if ((rc = take_buf(d)) == WSYNC_OK)
            rc = buf_room(d, used);
        /* the host regions to encode this version, largest first */
        d->nwork = 0;
        for (uint32_t k = 0; k < d->nregs; k++) {
            const dreg_t *x = &d->regs[k];
            if (s->shards[x->shard].mem == WSYNC_MEM_CUDA)
                continue;   /* the device batch below, or (host baseline) read plain */
            if (d->skip[k] > 0) {
                d->skip[k]--;   /* dense lately: read plain, without a pass to find out again */
                continue;
            }
            d->work[d->nwork++] = (work_t){
                x->g.rows * x->g.cols * wsync_dtype_size(s->shards[x->shard].param.dtype), k};
        }
        qsort(d->work, d->nwork, sizeof(*d->work), work_cmp);
        tx_job_t job = {s, d, used, 0};
        char what[96];
        snprintf(what, sizeof(what), "store: sender %d: encoding version %llu", s->m.rank,
                 (unsigned long long)version);
        if (rc == WSYNC_OK)
            rc = wsync_workpool_run(d->pool, d->nwork, tx_item, &job,
                                    wsync_deadline_in(s->m.timeout_ms), what);
        used = job.used;
        /* the fault point once per encoded region, in region order whatever the threads did */
        for (uint32_t k = 0; k < d->nregs && rc == WSYNC_OK; k++)
            if (d->len[k] > 0)
                rc = fault_point(s, &d->regs[k], version, d->bufs[d->cur].mem + d->off[k],
                                 d->len[k]);
        t_enc = wsync_now_ns();
        WSYNC_LOG_D("store: sender %d: version %llu: encoded %u host regions with %u threads in "
                    "%.2f ms (%.2f ms summed over the regions)", s->m.rank,
                    (unsigned long long)version, d->nwork, wsync_workpool_size(d->pool),
                    (double)(t_enc - t0) / 1e6, (double)atomic_load(&job.enc_ns) / 1e6);
#if WSYNC_HAVE_CUDA
        if (rc == WSYNC_OK && d->nenc > 0) {
            int saved = -1;
            if ((rc = wsync_dev_enter(d->device, &saved)) == WSYNC_OK) {
                rc = dev_encode(s, d, version, stream, &used);
                wsync_dev_leave(d->device, saved);
            }
        }
#endif
    }
    uint64_t t_dev = wsync_now_ns();
    if (rc == WSYNC_OK)
        rc = refresh(s, d, stream);
    WSYNC_LOG_D("store: sender %d: version %llu: device encode %.2f ms, baselines refreshed in "
                "%.2f ms", s->m.rank, (unsigned long long)version, (double)(t_dev - t_enc) / 1e6,
                (double)(wsync_now_ns() - t_dev) / 1e6);
    if (rc == WSYNC_OK && base != 0 && d->nregs > 0) {
        dbuf_t *b = &d->bufs[d->cur];
        for (uint32_t k = 0; k < d->nregs; k++) {
            const dreg_t *x = &d->regs[k];
            uint8_t *row = b->mem + (size_t)k * ROW;
            /* the stream's format beside the shard: a reader of CUDA targets reads plain a
             * region a reader of host targets asked for first (format 4) */
            put64(row, x->shard | (uint64_t)(d->len[k] != 0 ? wsync_delta_format(
                                                b->mem + d->off[k], d->len[k]) : 0) << 32);
            put64(row + 8, x->g.off);
            put64(row + 16, x->g.rows);
            put64(row + 24, x->g.cols);
            put64(row + 32, x->g.pitch);
            put64(row + 40, d->off[k]);
            put64(row + 48, d->len[k]);
            put64(row + 56, d->hash[k]);
            enc += d->len[k];
            plain += d->len[k] == 0
                         ? x->g.rows * x->g.cols * wsync_dtype_size(s->shards[x->shard].param.dtype)
                         : 0;
        }
        if (b->mr == NULL) {
            b->rkey_len = sizeof(b->rkey);
            rc = d->rma->reg(d->ctx, b->mem, b->cap, &b->mr, b->rkey, &b->rkey_len);
            if (rc != WSYNC_OK)
                b->mr = NULL;
        }
        if (rc == WSYNC_OK) {
            struct wsync_dir_region *g = &e->regions[e->nregions];
            g->base = (uint64_t)(uintptr_t)b->mem;
            g->len = b->cap;
            g->rkey = b->rkey;
            g->rkey_len = (uint32_t)b->rkey_len;
            e->delta_base = base;
            e->delta_region = e->nregions++;
            e->delta_table = g->base;
            e->delta_n = d->nregs;
            b->version = version;
        }
    }
    if (rc != WSYNC_OK) {
        wsync_store_dtx_abandon(d);
        return rc;
    }
    d->cur = -1;
    s->stats.bytes_encoded = enc;
    s->stats.bytes_plain = plain;
    s->stats.bytes_wire = enc + plain;
    s->stats.base_version = e->delta_base;
    WSYNC_LOG_D("store: sender %d: version %llu against base %llu: %u regions, %llu bytes "
                "encoded, %llu plain", s->m.rank, (unsigned long long)version,
                (unsigned long long)e->delta_base, d->nregs, (unsigned long long)enc,
                (unsigned long long)plain);
    return WSYNC_OK;
}

void wsync_store_dtx_published(store_dtx_t *d, uint64_t version)
{
    if (d != NULL && d->pending == version)
        d->next_base = version;
}

void wsync_store_dtx_abandon(store_dtx_t *d)
{
    if (d == NULL)
        return;
    if (d->cur >= 0)
        d->bufs[d->cur].version = 0;
    d->cur = -1;
    d->next_base = 0;
}

void wsync_store_dtx_release(store_dtx_t *d, uint64_t v)
{
    for (int i = 0; d != NULL && i < d->nbufs; i++)
        if (d->bufs[i].version == v)
            d->bufs[i].version = 0;
}

/* ---- reader ---------------------------------------------------------------------------------- */

typedef struct {
    uint32_t chunk;
    uint32_t seg0, seg1;             /* our segments of it: [seg0, seg1) (consecutive) */
    uint8_t capable;
    uint8_t take;                    /* this version: applied from its stream */
    uint8_t cuda;                    /* its segments are in CUDA memory */
    uint64_t addr, len, hash;        /* this version's stream (sender's address) */
    uint64_t at;                     /* where it landed in `enc` */
} mine_t;


/* A reader applies a version's streams to its host targets in block ranges, so that a large
 * chunk (the embedding: a quarter of Qwen3-0.6B's bytes) is applied by every thread, not one. */
typedef struct {
    uint64_t bytes;                  /* plain bytes of the range (runs take the largest first) */
    uint32_t j, seg;                 /* the chunk (in mine) and our segment of it */
    uint64_t b0, b1;                 /* blocks [b0, b1) of the stream */
    uint64_t leaf;                   /* where block b0's leaf hash goes in `leaves` */
} piece_t;

/* Ranges of at most 1 / RX_PIECES_PER_THREAD of a thread's share of the version's blocks. */
#define RX_PIECES_PER_THREAD 4u

/* The blocks of a chunk's stream. */
static uint64_t chunk_blocks(const wsync_chunk_t *c)
{
    return wsync_delta_nblocks(c->src.rows * c->src.cols);
}

static int piece_cmp(const void *x, const void *y)
{
    const piece_t *a = x, *b = y;
    if (a->bytes != b->bytes)
        return a->bytes > b->bytes ? -1 : 1;
    return (a->leaf > b->leaf) - (a->leaf < b->leaf);
}

struct store_drx {
    uint32_t lo, hi;
    mine_t *mine;                    /* our distinct chunks, in plan order */
    uint32_t nmine;
    uint32_t *of_seg;                /* [hi - lo] index in mine */
    uint8_t *table;                  /* rows of the tables we read */
    size_t table_cap;
    uint8_t *enc;                    /* the streams (pinned when there are CUDA targets) */
    size_t enc_cap;
    int enc_pinned;
    int cuda;
    uint32_t *first, *last;          /* [nsenders] this version's rows read from each sender */
    size_t *at;                      /* [nsenders] where they landed in `table` */
    /* the streams' check, apply and hash run over a pool made at set-up (chunks write disjoint
     * target regions: a plan carries each byte of a receiver once) */
    wsync_workpool_t *pool;
    work_t *work;                    /* [nmine] this version's chunks to check (j: in mine,
                                        bytes: plain bytes over our segments) */
    uint32_t nwork;
    piece_t *piece;                  /* this version's block ranges to apply, host segments */
    uint32_t npiece, piece_cap;
    piece_t *cpiece;                 /* and to check, every chunk's once (leaf: its slot in
                                        csum; the chunks' slots in work order) */
    uint32_t ncpiece, cpiece_cap;
    uint64_t *csum;                  /* [ncpiece] each range's payload bytes */
    uint32_t csum_cap;
    uint32_t *cfirst;                /* [nwork + 1] work chunk w's slots: [cfirst[w], cfirst[w+1]) */
    uint64_t *leaves;                /* their leaf hashes: each host segment's, in block order */
    size_t leaves_cap;               /* in leaves */
};

void wsync_store_drx_free(store_drx_t *d)
{
    if (d == NULL)
        return;
    wsync_workpool_free(d->pool);
    if (d->enc_pinned)
        wsync_dev_host_unregister(d->enc);
    free(d->enc);
    free(d->work);
    free(d->piece);
    free(d->cpiece);
    free(d->csum);
    free(d->cfirst);
    free(d->leaves);
    free(d->table);
    free(d->mine);
    free(d->of_seg);
    free(d->first);
    free(d->last);
    free(d->at);
    free(d);
}

wsync_status_t wsync_store_drx_create(wsync_receiver_t *r, uint32_t lo, uint32_t hi,
                                      store_drx_t **out)
{
    const wsync_plan_t *plan = r->m.plan;
    store_drx_t *d = calloc(1, sizeof(*d));
    wsync_status_t rc;

    if (d == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for delta versions");
    if (r->delta_rx == NULL &&
        (rc = wsync_delta_rx_create(r, !WSYNC_HAVE_CUDA, &r->delta_rx)) != WSYNC_OK) {
        free(d);
        return rc;
    }
    d->lo = lo;
    d->hi = hi;
    d->mine = calloc((size_t)(hi - lo) + 1, sizeof(*d->mine));
    d->of_seg = calloc((size_t)(hi - lo) + 1, sizeof(*d->of_seg));
    d->first = calloc((size_t)plan->nsenders + 1, sizeof(*d->first));
    d->last = calloc((size_t)plan->nsenders + 1, sizeof(*d->last));
    d->at = calloc((size_t)plan->nsenders + 1, sizeof(*d->at));
    d->work = calloc((size_t)(hi - lo) + 1, sizeof(*d->work));
    d->cfirst = calloc((size_t)(hi - lo) + 2, sizeof(*d->cfirst));
    if (d->mine == NULL || d->of_seg == NULL || d->first == NULL || d->last == NULL ||
        d->at == NULL || d->work == NULL || d->cfirst == NULL) {
        wsync_store_drx_free(d);
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for delta versions");
    }
    /* segments come by receiver, then chunk: a chunk's segments of ours are consecutive */
    for (uint32_t i = lo; i < hi; i++) {
        const wsync_segment_t *sg = &r->m.segs[i];
        mine_t *m = d->nmine > 0 ? &d->mine[d->nmine - 1] : NULL;
        if (m == NULL || m->chunk != sg->chunk || m->seg1 != i) {
            m = &d->mine[d->nmine++];
            m->chunk = sg->chunk;
            m->seg0 = i;
            m->capable = (uint8_t)wsync_delta_rx_chunk_capable(r->delta_rx, sg->chunk);
        }
        m->seg1 = i + 1;
        m->cuda |= r->targets[sg->target].mem == WSYNC_MEM_CUDA;
        d->cuda |= r->targets[sg->target].mem == WSYNC_MEM_CUDA;
        d->of_seg[i - lo] = (uint32_t)(m - d->mine);
    }
    /* a chunk whose segments mix host and CUDA targets is read plain (one apply path each) */
    for (uint32_t j = 0; j < d->nmine; j++) {
        mine_t *m = &d->mine[j];
        for (uint32_t i = m->seg0; i < m->seg1 && m->capable && m->cuda; i++)
            if (r->targets[r->m.segs[i].target].mem != WSYNC_MEM_CUDA)
                m->capable = 0;
    }
    /* threads wherever the CPU checks streams: every chunk's stream is checked here before
     * anything is applied (CUDA targets' too: one thread took 20 ms a version for the Qwen3-0.6B
     * shape at lr 1e-6, 2 x H100), host targets' then applied here as well */
    uint32_t nth = 1, host = 0, any = 0;
    for (uint32_t j = 0; j < d->nmine; j++) {
        host += d->mine[j].capable && !d->mine[j].cuda;
        any += d->mine[j].capable;
    }
    if ((rc = wsync_workpool_threads("WSYNC_DELTA_THREADS", &nth)) != WSYNC_OK ||
        (rc = wsync_workpool_create(any > 0 ? nth : 1, &d->pool)) != WSYNC_OK) {
        wsync_store_drx_free(d);
        return rc;
    }
    WSYNC_LOG_D("store: receiver %d: delta streams of %u chunks (%u of host targets) checked by "
                "%u threads", r->m.rank, any, host, wsync_workpool_size(d->pool));
    /* the senders do not know our plan: tell each the regions we would take as deltas */
    rc = WSYNC_OK;
    for (uint32_t s = 0; s < plan->nsenders && rc == WSYNC_OK; s++) {
        wsync_wbuf_t b;
        uint32_t n = 0;
        for (uint32_t j = 0; j < d->nmine; j++)
            n += d->mine[j].capable && plan->chunks[d->mine[j].chunk].sender == s;
        if (n == 0)
            continue;
        wsync_wbuf_init(&b);
        wsync_put_u32(&b, n);
        for (uint32_t j = 0; j < d->nmine; j++) {
            const wsync_chunk_t *c = &plan->chunks[d->mine[j].chunk];
            if (!d->mine[j].capable || c->sender != s)
                continue;
            wsync_put_u32(&b, c->shard);
            wsync_put_u32(&b, d->mine[j].cuda ? 0u : STORE_DELTA_CPU);
            wsync_put_u64(&b, c->src.off);
            wsync_put_u64(&b, c->src.rows);
            wsync_put_u64(&b, c->src.cols);
            wsync_put_u64(&b, c->src.pitch);
        }
        rc = b.err || b.len > WSYNC_RELAY_MAX
                 ? wsync_err(WSYNC_ERR_NOMEM, "store: receiver %d: %u delta regions do not fit a "
                             "relay", r->m.rank, n)
                 : wsync_member_relay_send(&r->m, WSYNC_ROLE_SENDER, (int)s, STORE_DELTA_TAG,
                                           b.data, (uint32_t)b.len);
        wsync_wbuf_free(&b);
    }
    if (rc != WSYNC_OK) {
        wsync_store_drx_free(d);
        return rc;
    }
    *out = d;
    return WSYNC_OK;
}

int wsync_store_drx_done(const store_drx_t *d, uint32_t seg)
{
    return d != NULL && seg >= d->lo && seg < d->hi && d->mine[d->of_seg[seg - d->lo]].take;
}

static wsync_status_t grow(uint8_t **p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return WSYNC_OK;
    uint8_t *n = realloc(*p, need);
    if (n == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for %zu bytes of delta streams", need);
    *p = n;
    *cap = need;
    return WSYNC_OK;
}

/* A stream that failed its check, said again with the param it was for. */
static wsync_status_t named(const wsync_receiver_t *r, uint32_t seg, wsync_status_t rc)
{
    const wsync_segment_t *sg = &r->m.segs[seg];
    const wsync_target_desc_t *t = &r->targets[sg->target];
    char text[1024];

    snprintf(text, sizeof(text), "%s", wsync_last_error());
    return wsync_err(rc, "store: receiver %d: param '%s' (target '%s'): %s", r->m.rank,
                     t->pieces[sg->piece].param.name, t->name, text);
}

#if WSYNC_HAVE_CUDA
/* The CUDA targets' streams: one batched apply on the device from the pinned host buffer, each
 * region's tree hash compared with the sender's. */
static wsync_status_t dev_apply(wsync_receiver_t *r, store_drx_t *d, uint64_t v)
{
    const wsync_plan_t *plan = r->m.plan;
    uint32_t n = 0, k = 0;
    wsync_kdelta_app_t *a;
    uint32_t *seg;
    wsync_kdelta_batch_t *batch = NULL;
    void *stream = NULL, *encd = NULL;
    wsync_status_t rc;

    for (uint32_t j = 0; j < d->nmine; j++)
        n += d->mine[j].take && d->mine[j].cuda ? d->mine[j].seg1 - d->mine[j].seg0 : 0;
    if (n == 0)
        return WSYNC_OK;
    a = calloc(n, sizeof(*a));
    seg = calloc(n, sizeof(*seg));
    if (a == NULL || seg == NULL) {
        free(a);
        free(seg);
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for delta versions");
    }
    rc = wsync_dev_host_device_ptr(d->enc, &encd);
    for (uint32_t j = 0; j < d->nmine && rc == WSYNC_OK; j++) {
        const mine_t *m = &d->mine[j];
        if (!m->take || !m->cuda)
            continue;
        for (uint32_t i = m->seg0; i < m->seg1; i++, k++) {
            const wsync_segment_t *sg = &r->m.segs[i];
            seg[k] = i;
            a[k] = (wsync_kdelta_app_t){
                .enc = (const uint8_t *)encd + m->at,
                .len = m->len,
                .dst_base = r->land[sg->target],
                .dst = sg->dst,
                .esize = (uint32_t)wsync_dtype_size(plan->chunks[m->chunk].dtype),
            };
        }
    }
    if (rc == WSYNC_OK)
        rc = wsync_kdelta_apply_create(a, n, 1, &batch);
    if (rc == WSYNC_OK)
        rc = wsync_dev_stream_create(&stream);
    if (rc == WSYNC_OK)
        rc = wsync_kdelta_launch(batch, NULL, stream);
    if (rc == WSYNC_OK)
        rc = wsync_dev_stream_sync(stream, wsync_deadline_in(r->m.timeout_ms),
                                   "the store's delta apply on the GPU");
    const wsync_kdelta_result_t *res = rc == WSYNC_OK ? wsync_kdelta_results(batch) : NULL;
    for (uint32_t i = 0; res != NULL && i < n && rc == WSYNC_OK; i++) {
        const mine_t *m = &d->mine[d->of_seg[seg[i] - d->lo]];
        char what[160];
        snprintf(what, sizeof(what), "receiver %d, version %llu: chunk %u from sender %u",
                 r->m.rank, (unsigned long long)v, m->chunk, plan->chunks[m->chunk].sender);
        rc = wsync_kdelta_fault_status(&res[i], what);
        if (rc != WSYNC_OK)
            rc = named(r, seg[i], rc);
        else
            rc = wsync_delta_rx_hash_error(r, seg[i], m->hash, res[i].hash, v);
    }
    wsync_kdelta_free(batch);
    wsync_dev_stream_destroy(stream);
    free(a);
    free(seg);
    return rc;
}
#endif


typedef struct {
    wsync_receiver_t *r;
    store_drx_t *d;
    uint64_t v;
    atomic_uint_fast64_t check_ns, apply_ns;   /* the items' times summed (the log) */
} rx_job_t;

/* One block range of a chunk's stream checked, its payload bytes kept (errors name the param,
 * the target and the chunk). */
static wsync_status_t rx_check_item(void *arg, uint32_t item, uint32_t worker)
{
    rx_job_t *job = arg;
    store_drx_t *d = job->d;
    const piece_t *p = &d->cpiece[item];
    const mine_t *m = &d->mine[p->j];
    uint64_t t0 = wsync_now_ns();
    wsync_status_t rc;

    (void)worker;
    rc = wsync_delta_rx_check_blocks(job->r, m->chunk, d->enc + m->at, m->len, job->v, p->b0,
                                     p->b1, &d->csum[p->leaf]);
    atomic_fetch_add(&job->check_ns, wsync_now_ns() - t0);
    return rc == WSYNC_OK ? rc : named(job->r, m->seg0, rc);
}

/* After every range passed: each chunk's ranges' payloads fill its payload area, and a chunk of
 * CUDA targets is in the one format the device applies; chunks in work order, the first fault
 * returned. */
static wsync_status_t check_areas(wsync_receiver_t *r, store_drx_t *d, uint64_t v)
{
    for (uint32_t w = 0; w < d->nwork; w++) {
        const mine_t *m = &d->mine[d->work[w].j];
        uint64_t payload = 0;
        wsync_status_t rc;
        for (uint32_t i = d->cfirst[w]; i < d->cfirst[w + 1]; i++)
            payload += d->csum[i];
        rc = wsync_delta_rx_check_area(r, m->chunk, m->len, v, payload);
        if (rc == WSYNC_OK && m->cuda &&
            wsync_delta_format(d->enc + m->at, m->len) != WSYNC_DELTA_FORMAT)
            rc = wsync_err(WSYNC_ERR_INTEGRITY, "chunk %u: delta format %u, but CUDA targets "
                           "apply format %u only (the sender was told so)", m->chunk,
                           wsync_delta_format(d->enc + m->at, m->len), WSYNC_DELTA_FORMAT);
        if (rc != WSYNC_OK)
            return named(r, m->seg0, rc);
    }
    return WSYNC_OK;
}

/* One block range of a checked stream applied to our host segment, its leaves kept. */
static wsync_status_t rx_apply_item(void *arg, uint32_t item, uint32_t worker)
{
    rx_job_t *job = arg;
    store_drx_t *d = job->d;
    const piece_t *p = &d->piece[item];
    const mine_t *m = &d->mine[p->j];
    const wsync_segment_t *sg = &job->r->m.segs[p->seg];
    uint32_t es = (uint32_t)wsync_dtype_size(job->r->m.plan->chunks[m->chunk].dtype);
    uint64_t t0 = wsync_now_ns();
    wsync_status_t rc;

    (void)worker;
    rc = wsync_delta_apply_blocks(d->enc + m->at, m->len, job->r->land[sg->target], &sg->dst, es,
                                  p->b0, p->b1, d->leaves + p->leaf);
    atomic_fetch_add(&job->apply_ns, wsync_now_ns() - t0);
    return rc == WSYNC_OK ? rc : named(job->r, p->seg, rc);
}

/* Room for `most` ranges in *p (*cap of them now). */
static wsync_status_t grow_pieces(piece_t **p, uint32_t *cap, uint64_t most)
{
    if (most <= *cap)
        return WSYNC_OK;
    piece_t *np = most < UINT32_MAX ? realloc(*p, (size_t)most * sizeof(*np)) : NULL;
    if (np == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for delta versions");
    *p = np;
    *cap = (uint32_t)most;
    return WSYNC_OK;
}

/* Blocks per range when a pass has `blocks` in all: about RX_PIECES_PER_THREAD ranges a thread. */
static uint64_t range_blocks(const store_drx_t *d, uint64_t blocks)
{
    return WSYNC_MAX(1, blocks / ((uint64_t)wsync_workpool_size(d->pool) * RX_PIECES_PER_THREAD));
}

/* Chunk c's stream (mine[j]) in ranges of at most `per` blocks, for our segment seg, into out:
 * range [b, b1) gets leaf base + b / div. Returns how many. */
static uint32_t chunk_ranges(const wsync_chunk_t *c, uint32_t j, uint32_t seg, uint64_t per,
                             uint64_t base, uint64_t div, piece_t *out)
{
    uint64_t es = wsync_dtype_size(c->dtype), elems = c->src.rows * c->src.cols;
    uint64_t nb = chunk_blocks(c);
    uint32_t n = 0;

    for (uint64_t b = 0; b < nb; b += per) {
        uint64_t b1 = WSYNC_MIN(nb, b + per), e1 = WSYNC_MIN(elems, b1 * WSYNC_DELTA_BLOCK);
        out[n++] = (piece_t){(e1 - b * WSYNC_DELTA_BLOCK) * es, j, seg, b, b1, base + b / div};
    }
    return n;
}

/* This version's block ranges to check: each chunk's stream once (CUDA targets' too), in ranges
 * of about as many blocks as the apply's, so that a large chunk is checked by every thread. */
static wsync_status_t make_check_pieces(wsync_receiver_t *r, store_drx_t *d)
{
    const wsync_plan_t *plan = r->m.plan;
    uint64_t blocks = 0, per;
    uint32_t n = 0;

    for (uint32_t w = 0; w < d->nwork; w++)
        blocks += chunk_blocks(&plan->chunks[d->mine[d->work[w].j].chunk]);
    per = range_blocks(d, blocks);
    uint64_t most = blocks / per + (uint64_t)d->nwork + 1;
    wsync_status_t rc = grow_pieces(&d->cpiece, &d->cpiece_cap, most);
    if (rc != WSYNC_OK)
        return rc;
    if (most > d->csum_cap) {
        uint64_t *ns = realloc(d->csum, (size_t)most * sizeof(*ns));
        if (ns == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for delta versions");
        d->csum = ns;
        d->csum_cap = (uint32_t)most;
    }
    for (uint32_t w = 0; w < d->nwork; w++) {
        const mine_t *m = &d->mine[d->work[w].j];
        d->cfirst[w] = n;      /* the chunk's ranges take slots n, n + 1, ... */
        n += chunk_ranges(&plan->chunks[m->chunk], d->work[w].j, m->seg0, per, n, per,
                          d->cpiece + n);
    }
    d->cfirst[d->nwork] = n;
    d->ncpiece = n;
    qsort(d->cpiece, n, sizeof(*d->cpiece), piece_cmp);
    return WSYNC_OK;
}

/* This version's block ranges of the checked streams over our host segments, and room for
 * their leaves. */
static wsync_status_t make_pieces(wsync_receiver_t *r, store_drx_t *d)
{
    const wsync_plan_t *plan = r->m.plan;
    uint64_t blocks = 0, nleaf = 0, per;
    uint32_t n = 0;

    for (uint32_t w = 0; w < d->nwork; w++) {
        const mine_t *m = &d->mine[d->work[w].j];
        if (!m->cuda)
            blocks += chunk_blocks(&plan->chunks[m->chunk]) * (m->seg1 - m->seg0);
    }
    per = range_blocks(d, blocks);
    uint64_t most = blocks / per + (uint64_t)(d->hi - d->lo) + 1;
    wsync_status_t rc = grow_pieces(&d->piece, &d->piece_cap, most);
    if (rc != WSYNC_OK)
        return rc;
    for (uint32_t w = 0; w < d->nwork; w++) {
        const mine_t *m = &d->mine[d->work[w].j];
        const wsync_chunk_t *c = &plan->chunks[m->chunk];
        if (m->cuda)
            continue;   /* the device applies it */
        for (uint32_t i = m->seg0; i < m->seg1; i++) {
            /* block b's leaf at nleaf + b */
            n += chunk_ranges(c, d->work[w].j, i, per, nleaf, 1, d->piece + n);
            nleaf += chunk_blocks(c);
        }
    }
    d->npiece = n;
    if (nleaf + 1 > d->leaves_cap) {
        uint64_t *nl = realloc(d->leaves, (size_t)(nleaf + 1) * sizeof(*nl));
        if (nl == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for delta versions");
        d->leaves = nl;
        d->leaves_cap = (size_t)(nleaf + 1);
    }
    qsort(d->piece, n, sizeof(*d->piece), piece_cmp);
    return WSYNC_OK;
}

/* Each host segment's tree hash, from its leaves, against its sender's: chunks in the order of
 * d->work (largest first), the first mismatch returned. */
static wsync_status_t compare_hashes(wsync_receiver_t *r, store_drx_t *d, uint64_t v)
{
    const wsync_plan_t *plan = r->m.plan;
    uint64_t at = 0;
    wsync_status_t rc = WSYNC_OK;

    for (uint32_t w = 0; w < d->nwork && rc == WSYNC_OK; w++) {
        const mine_t *m = &d->mine[d->work[w].j];
        uint64_t nb = chunk_blocks(&plan->chunks[m->chunk]);
        if (m->cuda)
            continue;
        for (uint32_t i = m->seg0; i < m->seg1 && rc == WSYNC_OK; i++) {
            rc = wsync_delta_rx_hash_error(r, i, m->hash, wsync_delta_tree_hash(d->leaves + at, nb),
                                           v);
            at += nb;
        }
    }
    return rc;
}

/* The row of a sender's table (n rows, sorted) for chunk c's region, NULL when it has none. */
static const uint8_t *find_row(const uint8_t *t, uint32_t n, const wsync_chunk_t *c)
{
    uint64_t key[5] = {c->shard, c->src.off, c->src.rows, c->src.cols, c->src.pitch};
    uint32_t a = 0, b = n;

    while (a < b) {
        uint32_t m = a + (b - a) / 2;
        const uint8_t *row = t + (size_t)m * ROW;
        int cmp = 0;
        for (int i = 0; i < 5 && cmp == 0; i++) {
            uint64_t x = i == 0 ? (get64(row) & 0xffffffffu) : get64(row + 8 * (size_t)i);
            cmp = x < key[i] ? -1 : x > key[i] ? 1 : 0;
        }
        if (cmp == 0)
            return row;
        if (cmp < 0)
            a = m + 1;
        else
            b = m;
    }
    return NULL;
}

wsync_status_t wsync_store_drx_read(wsync_receiver_t *r, store_drx_t *d, const wsync_store_io_t *io,
                                    const wsync_dir_entry_t *e, uint64_t v, uint64_t *bytes)
{
    const wsync_plan_t *plan = r->m.plan;
    uint64_t holds = wsync_delta_rx_holds(r);
    size_t need = 0, total = 0;
    wsync_status_t rc = WSYNC_OK;

    for (uint32_t j = 0; j < d->nmine; j++)
        d->mine[j].take = 0;
    if (holds == 0)
        return WSYNC_OK;
    uint64_t t0 = wsync_now_ns();
    /* the tables of the senders whose base we hold and from which we take deltas: whole */
    for (uint32_t s = 0; s < plan->nsenders; s++)
        d->first[s] = 0;
    for (uint32_t j = 0; j < d->nmine; j++) {
        const mine_t *m = &d->mine[j];
        uint32_t s = plan->chunks[m->chunk].sender;
        if (m->capable && wsync_delta_rx_takes(r, r->delta_rx, e[s].delta_base, m->chunk))
            d->first[s] = 1;
    }
    for (uint32_t s = 0; s < plan->nsenders; s++) {
        if (!d->first[s])
            continue;
        d->at[s] = need;
        need += (size_t)e[s].delta_n * ROW;
    }
    if (need == 0)
        return WSYNC_OK;
    if ((rc = grow(&d->table, &d->table_cap, need)) != WSYNC_OK)
        return rc;
    for (uint32_t s = 0; s < plan->nsenders && rc == WSYNC_OK; s++) {
        if (!d->first[s] || e[s].delta_n == 0)
            continue;
        const struct wsync_dir_region *g = &e[s].regions[e[s].delta_region];
        rc = io->get(io->arg, s, g->rkey, g->rkey_len, e[s].delta_table, d->table + d->at[s],
                     (size_t)e[s].delta_n * ROW);
    }
    if (rc == WSYNC_OK)
        rc = io->flush(io->arg);
    if (rc != WSYNC_OK)
        return rc;
    uint64_t t_table = wsync_now_ns();
    /* each capable chunk's row: read it as a delta, or plain */
    for (uint32_t j = 0; j < d->nmine; j++) {
        mine_t *m = &d->mine[j];
        const wsync_chunk_t *c = &plan->chunks[m->chunk];
        const wsync_dir_entry_t *en = &e[c->sender];
        if (!m->capable || !wsync_delta_rx_takes(r, r->delta_rx, en->delta_base, m->chunk))
            continue;
        const uint8_t *row = find_row(d->table + d->at[c->sender], en->delta_n, c);
        const struct wsync_dir_region *g = &en->regions[en->delta_region];
        if (row == NULL)
            continue;   /* the sender did not know our region yet: plain */
        uint64_t off = get64(row + 40), len = get64(row + 48), end = g->base + g->len;
        m->hash = get64(row + 56);
        if (len == 0)
            continue;   /* denser than the break-even point, or not encoded: plain */
        if (m->cuda && get64(row) >> 32 != WSYNC_DELTA_FORMAT)
            continue;   /* encoded for readers of host targets before ours came: plain */
        if (len < WSYNC_DELTA_HEADER || len >= plain_bytes(c) || off % 8 != 0 ||
            off < (uint64_t)en->delta_n * ROW || off > end - en->delta_table ||
            len > end - en->delta_table - off)
            return wsync_err(WSYNC_ERR_PROTOCOL, "store: receiver %d: sender %u's delta table for "
                             "version %llu: chunk %u's stream (offset %llu, %llu bytes) is not "
                             "inside its buffer or not below its %llu plain bytes", r->m.rank,
                             c->sender, (unsigned long long)v, m->chunk, (unsigned long long)off,
                             (unsigned long long)len, (unsigned long long)plain_bytes(c));
        m->take = 1;
        m->len = len;
        m->addr = en->delta_table + off;
        m->at = total;
        total += (size_t)align8(len);
    }
    if (total == 0)
        return WSYNC_OK;
    /* the streams, all in flight; pinned for the device's apply when we have CUDA targets */
    if (total > d->enc_cap) {
        if (d->enc_pinned)
            wsync_dev_host_unregister(d->enc);
        d->enc_pinned = 0;
        if ((rc = grow(&d->enc, &d->enc_cap, total)) != WSYNC_OK)
            return rc;
        if (d->cuda && (rc = wsync_dev_host_register(d->enc, d->enc_cap, 0, &d->enc_pinned)) !=
                           WSYNC_OK)
            return rc;
    }
    for (uint32_t j = 0; j < d->nmine && rc == WSYNC_OK; j++) {
        mine_t *m = &d->mine[j];
        if (!m->take)
            continue;
        const wsync_dir_entry_t *en = &e[plan->chunks[m->chunk].sender];
        const struct wsync_dir_region *g = &en->regions[en->delta_region];
        rc = io->get(io->arg, plan->chunks[m->chunk].sender, g->rkey, g->rkey_len, m->addr,
                     d->enc + m->at, (size_t)m->len);
    }
    if (rc == WSYNC_OK)
        rc = io->flush(io->arg);
    if (rc != WSYNC_OK)
        return rc;
    uint64_t t_streams = wsync_now_ns();
    /* check each stream once (block ranges over the pool, largest first, then each chunk's
     * ranges' payloads against its area), apply it to each of our host segments of its chunk
     * (block ranges over the pool, largest first), then compare each segment's tree hash, made
     * from its ranges' leaves, with the sender's */
    d->nwork = 0;
    for (uint32_t j = 0; j < d->nmine; j++) {
        mine_t *m = &d->mine[j];
        if (!m->take)
            continue;
        *bytes += m->len;
        d->work[d->nwork++] = (work_t){plain_bytes(&plan->chunks[m->chunk]) *
                                              (m->seg1 - m->seg0), j};
    }
    qsort(d->work, d->nwork, sizeof(*d->work), work_cmp);
    rx_job_t job = {r, d, v, 0, 0};
    int64_t deadline = wsync_deadline_in(r->m.timeout_ms);
    char what[96];
    snprintf(what, sizeof(what), "store: receiver %d: checking version %llu's deltas", r->m.rank,
             (unsigned long long)v);
    rc = make_check_pieces(r, d);
    if (rc == WSYNC_OK)
        rc = wsync_workpool_run(d->pool, d->ncpiece, rx_check_item, &job, deadline, what);
    if (rc == WSYNC_OK)
        rc = check_areas(r, d, v);
    if (rc == WSYNC_OK)
        rc = make_pieces(r, d);
    snprintf(what, sizeof(what), "store: receiver %d: applying version %llu's deltas", r->m.rank,
             (unsigned long long)v);
    if (rc == WSYNC_OK)
        rc = wsync_workpool_run(d->pool, d->npiece, rx_apply_item, &job, deadline, what);
    if (rc == WSYNC_OK)
        rc = compare_hashes(r, d, v);
    uint64_t t_apply = wsync_now_ns();
    WSYNC_LOG_D("store: receiver %d: version %llu's deltas: table %.2f ms, streams %.2f ms (%zu "
                "bytes), check %.2f + apply and hash %.2f ms summed, %u threads, in %.2f ms (%u "
                "chunks, %u block ranges)", r->m.rank, (unsigned long long)v,
                (double)(t_table - t0) / 1e6, (double)(t_streams - t_table) / 1e6, total,
                (double)atomic_load(&job.check_ns) / 1e6, (double)atomic_load(&job.apply_ns) / 1e6,
                wsync_workpool_size(d->pool), (double)(t_apply - t_streams) / 1e6, d->nwork,
                d->npiece);
#if WSYNC_HAVE_CUDA
    if (rc == WSYNC_OK && d->cuda)
        rc = dev_apply(r, d, v);
#endif
    return rc;
}
