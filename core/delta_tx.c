/* Delta versions, sender side (core/delta_state.h): the group's mode, and the baselines a sender
 * diffs its shards against. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/delta.h"
#include "core/delta_state.h"
#include "core/log.h"
#include "core/status.h"
#include "core/util.h"
#include "kernels/device.h"

/* ---- the group's mode ---------------------------------------------------------------------- */

wsync_status_t wsync_delta_resolve(const wsync_group_info_t *g, const wsync_scheme_ops_t *scheme,
                                   int fp8_targets, uint32_t *mode, char *line, size_t len)
{
    uint32_t n = g->nsenders + g->nreceivers, hosts = 1, spaces = 1;
    const char *off_by = NULL, *on_by = NULL;
    int off_rank = -1, on_rank = -1;
    char why[256];

    for (uint32_t i = 0; i < n; i++) {
        const wsync_hello_t *h = i < g->nsenders ? &g->senders[i] : &g->receivers[i - g->nsenders];
        const char *role = i < g->nsenders ? "sender" : "receiver";
        if (h->delta == WSYNC_DELTA_MODE_OFF && off_by == NULL) {
            off_by = role;
            off_rank = h->rank;
        } else if (h->delta == WSYNC_DELTA_MODE_ON && on_by == NULL) {
            on_by = role;
            on_rank = h->rank;
        }
    }
    if (off_by != NULL) {
        *mode = WSYNC_DELTA_MODE_OFF;
        snprintf(why, sizeof(why), "%s %d asked for delta = off", off_by, off_rank);
    } else if (on_by != NULL) {
        if (!scheme->delta)
            return wsync_err(WSYNC_ERR_UNSUPPORTED, "delta versions are not yet carried by the %s "
                             "scheme (%s %d asked for delta = on; use delta = auto or off, or "
                             "another scheme)", scheme->name, on_by, on_rank);
        *mode = WSYNC_DELTA_MODE_ON;
        snprintf(why, sizeof(why), "%s %d asked for delta = on", on_by, on_rank);
    } else {
        const char **ids = calloc(n + 1, sizeof(*ids));
        if (ids == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "coordinator: out of memory");
        for (uint32_t i = 0; i < n; i++)
            ids[i] = i < g->nsenders ? g->senders[i].host_id : g->receivers[i - g->nsenders].host_id;
        int rc = wsync_host_count(ids, n, &hosts, &spaces);
        free(ids);
        if (rc != 0)
            return wsync_err(WSYNC_ERR_NOMEM, "coordinator: out of memory");
        int dear = strcmp(scheme->name, "nccl") == 0 || strcmp(scheme->name, "store") == 0;
        if (dear && g->nreceivers == 0 && scheme->async && scheme->delta) {
            /* a store set up before any reader: readers come later, from anywhere */
            *mode = WSYNC_DELTA_MODE_ON;
            snprintf(why, sizeof(why), "auto: the %s scheme's readers come later, from any host; "
                     "a reader with delta = off takes every version in full", scheme->name);
        } else if (!dear) {
            *mode = WSYNC_DELTA_MODE_OFF;
            snprintf(why, sizeof(why), "auto: the %s scheme moves bytes through shared memory, "
                     "where full versions are cheap", scheme->name);
        } else if (hosts < 2 && spaces < 2) {
            *mode = WSYNC_DELTA_MODE_OFF;
            snprintf(why, sizeof(why), "auto: all %u participants share one host and network "
                     "namespace, where full versions are cheap", n);
        } else if (!scheme->delta) {
            *mode = WSYNC_DELTA_MODE_OFF;
            snprintf(why, sizeof(why), "auto: the %s scheme does not carry delta versions yet",
                     scheme->name);
        } else {
            *mode = WSYNC_DELTA_MODE_ON;
            snprintf(why, sizeof(why), "auto: the %s scheme spans %u hosts, %u network "
                     "namespaces", scheme->name, hosts, spaces);
        }
    }
    char cut[320] = "";
    if (*mode == WSYNC_DELTA_MODE_ON)
        snprintf(cut, sizeof(cut), "; a chunk travels plain when its encoding would pass "
                 "delta_cutoff x its plain bytes (default %g for host shards: past it the CPU "
                 "codec's passes cost more than the bytes they save, as measured on the loopback "
                 "store; %g for CUDA shards: the GPU codec runs at HBM speed)",
                 WSYNC_DELTA_CUTOFF_HOST, WSYNC_DELTA_CUTOFF_CUDA);
    snprintf(line, len, "delta: %s (%s)%s%s\n", *mode == WSYNC_DELTA_MODE_ON ? "on" : "off", why,
             *mode == WSYNC_DELTA_MODE_ON && fp8_targets
                 ? "; quantized FP8 targets take every version in full (they hold FP8 codes, "
                   "not the values a delta is taken against)"
                 : "", cut);
    return WSYNC_OK;
}

/* ---- the cut-off ----------------------------------------------------------------------------- */

double wsync_delta_cutoff(const wsync_sender_t *s, int cuda)
{
    if (s != NULL && s->delta_cutoff > 0.0 && s->delta_cutoff <= 1.0)
        return s->delta_cutoff;
    return cuda ? WSYNC_DELTA_CUTOFF_CUDA : WSYNC_DELTA_CUTOFF_HOST;
}

uint64_t wsync_delta_limit(const wsync_sender_t *s, int cuda, uint64_t plain)
{
    double f = wsync_delta_cutoff(s, cuda);
    /* plain <= 2^32 - 1 for any encodable chunk: exact in a double */
    return f >= 1.0 ? plain : (uint64_t)(f * (double)plain);
}

/* ---- baselines ----------------------------------------------------------------------------- */

struct wsync_delta_tx {
    wsync_sender_t *s;
    uint32_t c0, c1;                 /* this sender's chunks: plan->chunks[c0, c1) */
    uint8_t *capable;                /* [c1 - c0] */
    uint8_t *touched;                /* [c1 - c0] baseline brought to this version */
    uint8_t *skip;                   /* [c1 - c0] versions left to travel plain unencoded (the
                                        chunk went plain by the cut-off) */
    void **base;                     /* [nshards] baseline, NULL: no capable chunk */
    uint8_t *kind;                   /* [nshards] 0 host (malloc), 1 device, 2 pinned host */
    uint64_t bytes;
    uint32_t ncapable;
    uint64_t next_base;              /* base of the next version: the last one pushed whole */
    uint64_t cur_base;               /* base of the version in flight */
};

static uint64_t shard_elems(const wsync_shard_desc_t *d)
{
    uint64_t n = 1;
    for (int i = 0; i < d->param.ndim; i++)
        n *= (uint64_t)d->box.len[i];
    return n;
}

/* Elements [lo, hi) a region touches in its buffer. */
static void region_span_elems(const wsync_region_t *g, uint64_t *lo, uint64_t *hi)
{
    *lo = g->off;
    *hi = g->off + (g->rows - 1) * g->pitch + g->cols;
}

static int regions_overlap(const wsync_region_t *a, const wsync_region_t *b)
{
    uint64_t alo, ahi, blo, bhi;
    region_span_elems(a, &alo, &ahi);
    region_span_elems(b, &blo, &bhi);
    if (alo >= bhi || blo >= ahi)
        return 0;
    if (a->pitch != b->pitch || a->pitch == 0)
        return 1;   /* spans meet, shapes not comparable: count it as an overlap */
    uint64_t p = a->pitch, ar = a->off / p, ac = a->off % p, br = b->off / p, bc = b->off % p;
    if (ac + a->cols > p || bc + b->cols > p)
        return 1;
    return ar < br + b->rows && br < ar + a->rows && ac < bc + b->cols && bc < ac + a->cols;
}

/* Chunks of one shard, by their first element (qsort_r is not C11: sort pairs instead). */
typedef struct {
    uint64_t lo;
    uint32_t c;
} span_t;

static int cmp_span(const void *x, const void *y)
{
    const span_t *a = x, *b = y;
    return a->lo < b->lo ? -1 : a->lo > b->lo ? 1 : (a->c > b->c) - (a->c < b->c);
}

/* capable[c - c0] = 1 for chunks that overlap no other chunk of their shard. */
static wsync_status_t find_capable(wsync_delta_tx_t *tx)
{
    const wsync_plan_t *plan = tx->s->m.plan;
    uint32_t n = tx->c1 - tx->c0;
    span_t *sp = calloc((size_t)n + 1, sizeof(*sp));
    uint32_t *by_shard = calloc(tx->s->nshards + 1, sizeof(*by_shard));

    if (sp == NULL || by_shard == NULL) {
        free(sp);
        free(by_shard);
        return wsync_err(WSYNC_ERR_NOMEM, "delta: no memory for %u chunks", n);
    }
    /* group by shard (counting sort), then by first element within each shard */
    for (uint32_t i = 0; i < n; i++)
        by_shard[plan->chunks[tx->c0 + i].shard]++;
    for (size_t h = 0, at = 0; h < tx->s->nshards; h++) {
        uint32_t k = by_shard[h];
        by_shard[h] = (uint32_t)at;
        at += k;
    }
    for (uint32_t i = 0; i < n; i++) {
        const wsync_chunk_t *ch = &plan->chunks[tx->c0 + i];
        sp[by_shard[ch->shard]++] = (span_t){ch->src.off, tx->c0 + i};
        tx->capable[i] = ch->src.rows > 0 && ch->src.cols > 0 &&
                         ch->src.rows * ch->src.cols * wsync_dtype_size(ch->dtype) <= UINT32_MAX;
    }
    for (uint32_t i = 0; i < n;) {
        uint32_t sh = plan->chunks[sp[i].c].shard, e = i;
        while (e < n && plan->chunks[sp[e].c].shard == sh)
            e++;
        qsort(sp + i, e - i, sizeof(*sp), cmp_span);
        for (uint32_t a = i; a < e; a++) {
            const wsync_chunk_t *ca = &plan->chunks[sp[a].c];
            uint64_t lo, hi;
            region_span_elems(&ca->src, &lo, &hi);
            for (uint32_t b = a + 1; b < e && sp[b].lo < hi; b++) {
                if (regions_overlap(&ca->src, &plan->chunks[sp[b].c].src)) {
                    tx->capable[sp[a].c - tx->c0] = 0;
                    tx->capable[sp[b].c - tx->c0] = 0;
                }
            }
        }
        i = e;
    }
    free(sp);
    free(by_shard);
    return WSYNC_OK;
}

static void free_baselines(wsync_delta_tx_t *tx)
{
    for (size_t i = 0; tx->base != NULL && i < tx->s->nshards; i++) {
        if (tx->base[i] == NULL)
            continue;
        if (tx->kind[i] == 1) {
            wsync_dev_free(tx->base[i]);
        } else {
            if (tx->kind[i] == 2)
                wsync_dev_host_unregister(tx->base[i]);
            free(tx->base[i]);
        }
    }
}

wsync_status_t wsync_delta_tx_create(wsync_sender_t *s, wsync_delta_tx_t **out)
{
    const wsync_plan_t *plan = s->m.plan;
    uint32_t me = (uint32_t)s->m.rank;
    wsync_delta_tx_t *tx = calloc(1, sizeof(*tx));
    wsync_status_t rc = WSYNC_OK;

    if (tx == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "delta: no memory");
    tx->s = s;
    while (tx->c0 < plan->nchunks && plan->chunks[tx->c0].sender < me)
        tx->c0++;
    tx->c1 = tx->c0;
    while (tx->c1 < plan->nchunks && plan->chunks[tx->c1].sender == me)
        tx->c1++;
    tx->capable = calloc((size_t)(tx->c1 - tx->c0) + 1, 1);
    tx->touched = calloc((size_t)(tx->c1 - tx->c0) + 1, 1);
    tx->skip = calloc((size_t)(tx->c1 - tx->c0) + 1, 1);
    tx->base = calloc(s->nshards + 1, sizeof(*tx->base));
    tx->kind = calloc(s->nshards + 1, 1);
    if (tx->capable == NULL || tx->touched == NULL || tx->skip == NULL || tx->base == NULL ||
        tx->kind == NULL) {
        rc = wsync_err(WSYNC_ERR_NOMEM, "delta: no memory");
        goto err;
    }
    if ((rc = find_capable(tx)) != WSYNC_OK)
        goto err;
    int saved = -1, entered = 0;
    for (uint32_t c = tx->c0; c < tx->c1 && rc == WSYNC_OK; c++) {
        uint32_t sh = plan->chunks[c].shard;
        if (!tx->capable[c - tx->c0])
            continue;
        tx->ncapable++;
        if (tx->base[sh] != NULL)
            continue;
        const wsync_shard_desc_t *d = &s->shards[sh];
        size_t bytes = (size_t)(shard_elems(d) * wsync_dtype_size(d->param.dtype));
        if (d->mem == WSYNC_MEM_CUDA && !s->delta_baseline_host) {
            if (!entered && (rc = wsync_dev_enter(s->device, &saved)) != WSYNC_OK)
                break;
            entered = 1;
            rc = wsync_dev_malloc(bytes, &tx->base[sh]);
            tx->kind[sh] = 1;
        } else {
            tx->base[sh] = malloc(bytes + 1);
            if (tx->base[sh] == NULL) {
                rc = wsync_err(WSYNC_ERR_NOMEM, "delta: sender %u: no memory for the baseline of "
                               "param '%s' (%zu bytes)", me, d->param.name, bytes);
            } else if (d->mem == WSYNC_MEM_CUDA) {
                int reg = 0;
                /* pinned: the device copies into it run at PCIe speed, asynchronously */
                rc = wsync_dev_host_register(tx->base[sh], bytes, 0, &reg);
                tx->kind[sh] = reg ? 2 : 0;
            }
        }
        if (rc == WSYNC_OK)
            tx->bytes += bytes;
    }
    if (entered)
        wsync_dev_leave(s->device, saved);
    if (rc != WSYNC_OK)
        goto err;
    WSYNC_LOG_I("delta: sender %u: %u of %u chunks delta-capable; baselines %.1f MiB (%s); "
                "cut-off %g of the plain bytes for host shards, %g for CUDA shards", me,
                tx->ncapable, tx->c1 - tx->c0, (double)tx->bytes / (1 << 20),
                s->delta_baseline_host ? "host" : "device for CUDA shards, host for host shards",
                wsync_delta_cutoff(s, 0), wsync_delta_cutoff(s, 1));
    *out = tx;
    return WSYNC_OK;
err:
    wsync_delta_tx_free(tx);
    return rc;
}

void wsync_delta_tx_free(wsync_delta_tx_t *tx)
{
    if (tx == NULL)
        return;
    free_baselines(tx);
    free(tx->base);
    free(tx->kind);
    free(tx->capable);
    free(tx->touched);
    free(tx->skip);
    free(tx);
}

int wsync_delta_tx_capable(const wsync_delta_tx_t *tx, uint32_t chunk)
{
    return tx != NULL && chunk >= tx->c0 && chunk < tx->c1 && tx->capable[chunk - tx->c0];
}

uint64_t wsync_delta_tx_bytes(const wsync_delta_tx_t *tx)
{
    return tx != NULL ? tx->bytes : 0;
}

uint32_t wsync_delta_tx_ncapable(const wsync_delta_tx_t *tx)
{
    return tx != NULL ? tx->ncapable : 0;
}

void *wsync_delta_tx_baseline(const wsync_delta_tx_t *tx, uint32_t shard, int *on_device)
{
    if (tx == NULL || shard >= tx->s->nshards)
        return NULL;
    if (on_device != NULL)
        *on_device = tx->kind[shard] == 1;
    return tx->base[shard];
}

uint64_t wsync_delta_tx_begin(wsync_delta_tx_t *tx, uint64_t version)
{
    (void)version;
    memset(tx->touched, 0, (size_t)(tx->c1 - tx->c0));
    tx->cur_base = tx->next_base;
    return tx->cur_base;
}

uint64_t wsync_delta_tx_base(const wsync_delta_tx_t *tx)
{
    return tx != NULL ? tx->cur_base : 0;
}

/* Copy a chunk's region of host memory src into the same region of dst. */
static void copy_region_host(void *dst, const void *src, const wsync_region_t *g, size_t esz)
{
    for (uint64_t r = 0; r < g->rows; r++) {
        size_t at = (size_t)(g->off + r * g->pitch) * esz;
        memcpy((uint8_t *)dst + at, (const uint8_t *)src + at, (size_t)g->cols * esz);
    }
}

wsync_status_t wsync_delta_tx_encode(wsync_delta_tx_t *tx, uint32_t chunk, void *out, uint64_t cap,
                                     uint64_t *len, uint64_t *hash)
{
    const wsync_plan_t *plan = tx->s->m.plan;
    const wsync_chunk_t *ch = &plan->chunks[chunk];
    uint32_t esz = (uint32_t)wsync_dtype_size(ch->dtype);
    const void *data = tx->s->shard_data[ch->shard];
    void *base = tx->base[ch->shard];
    uint64_t n = 0, h = 0, plain = ch->src.rows * ch->src.cols * esz;

    if (!wsync_delta_tx_capable(tx, chunk) || tx->s->shards[ch->shard].mem != WSYNC_MEM_HOST ||
        tx->kind[ch->shard] != 0)
        return wsync_err(WSYNC_ERR_INTERNAL, "delta: chunk %u is not a delta-capable chunk of a "
                         "host shard of sender %d", chunk, tx->s->m.rank);
    uint8_t *skip = &tx->skip[chunk - tx->c0];
    if (tx->cur_base != 0 && *skip > 0) {
        (*skip)--;   /* dense lately: plain, without a pass to find out again */
    } else if (tx->cur_base != 0) {
        /* given the cut-off as its room, the encoder stops at the first block past it */
        uint64_t limit = wsync_delta_limit(tx->s, 0, plain);
        wsync_status_t rc = wsync_delta_encode(data, base, &ch->src, esz, out,
                                               WSYNC_MIN(cap, limit), &n, &h, NULL);
        if (rc != WSYNC_OK || n >= limit) {
            n = 0;   /* past the cut-off (or the room): it travels plain */
            *skip = (uint8_t)(WSYNC_DELTA_REPROBE - 1);
        }
    }
    if (n == 0)
        h = 0;       /* a plain chunk's hash is read by no receiver: no pass for it */
    copy_region_host(base, data, &ch->src, esz);
    tx->touched[chunk - tx->c0] = 1;
    *len = n;
    *hash = h;
    return WSYNC_OK;
}

wsync_status_t wsync_delta_tx_refresh(wsync_delta_tx_t *tx, uint32_t chunk, void *stream)
{
    const wsync_plan_t *plan = tx->s->m.plan;
    const wsync_chunk_t *ch = &plan->chunks[chunk];
    size_t esz = wsync_dtype_size(ch->dtype);
    const void *data = tx->s->shard_data[ch->shard];
    void *base = tx->base[ch->shard];

    if (!wsync_delta_tx_capable(tx, chunk) || base == NULL)
        return wsync_err(WSYNC_ERR_INTERNAL, "delta: chunk %u is not a delta-capable chunk of "
                         "sender %d", chunk, tx->s->m.rank);
    if (tx->s->shards[ch->shard].mem == WSYNC_MEM_HOST) {
        copy_region_host(base, data, &ch->src, esz);
    } else {
        wsync_status_t rc = wsync_dev_memcpy2d_async(
            (uint8_t *)base + ch->src.off * esz, ch->src.pitch * esz,
            (const uint8_t *)data + ch->src.off * esz, ch->src.pitch * esz, ch->src.cols * esz,
            ch->src.rows, stream);
        if (rc != WSYNC_OK)
            return rc;
    }
    tx->touched[chunk - tx->c0] = 1;
    return WSYNC_OK;
}

void wsync_delta_tx_mark(wsync_delta_tx_t *tx, uint32_t chunk)
{
    if (wsync_delta_tx_capable(tx, chunk))
        tx->touched[chunk - tx->c0] = 1;
}

void wsync_delta_tx_end(wsync_delta_tx_t *tx, uint64_t version, int ok)
{
    uint32_t missed = 0;

    for (uint32_t i = 0; ok && i < tx->c1 - tx->c0; i++)
        missed += tx->capable[i] && !tx->touched[i];
    if (ok && missed > 0)
        WSYNC_LOG_W("delta: sender %d: version %llu left %u delta-capable chunks' baselines "
                    "behind: the next version goes in full", tx->s->m.rank,
                    (unsigned long long)version, missed);
    tx->next_base = ok && missed == 0 ? version : 0;
    tx->cur_base = 0;
}
