/* FP8 on the wire through the store: the senders' wire slots and tables, the readers' FP8
 * chunks (schemes/store_fp8.h says how they fit together). */
#include "schemes/store_fp8.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core/log.h"
#include "core/relay.h"
#include "core/util.h"
#include "kernels/device.h"
#include "kernels/kernels.h"
#include "reshard/exec.h"
#include "schemes/store_amax.h"
#include "schemes/store_fp8_tensor.h"
#include "schemes/wire_amax.h"

/* relay tag: a reader's FP8 chunks, to each sender it reads them from (store_delta.c has 1) */
/* bytes of one region in a reader's relay */
#define RELAY_ROW 64u
/* a reader's FP8 reads go in batches of at most this many bytes of host buffer (one larger
 * chunk gets a batch of its own) */
#define BATCH_BYTES (64ull << 20)
#define ALIGN STORE_FRX_ALIGN

/* ---- a region and its rule: one sort key for senders' sets and readers' lookups ---------------- */

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static uint32_t rule_flags(const wsync_wire_rule_t *r)
{
    return (r->ue8m0 ? 1u : 0u) | (r->no_saturate ? 2u : 0u);
}

/* The first column of a region in its shard's rows. */
static uint64_t col_of(const wsync_region_t *g)
{
    return g->pitch ? g->off % g->pitch : g->off;
}

#define CMP(a, b)                                                                                \
    do {                                                                                         \
        if ((a) != (b))                                                                          \
            return (a) < (b) ? -1 : 1;                                                           \
    } while (0)

/* Shard, row geometry, rule, then the first row: regions one could hold another's rows are
 * neighbours, the last one starting at or before a row found by binary search. */
static int key_cmp(uint32_t sa, const wsync_region_t *a, const wsync_wire_rule_t *ra, uint32_t sb,
                   const wsync_region_t *b, const wsync_wire_rule_t *rb)
{
    CMP(sa, sb);
    CMP(a->pitch, b->pitch);
    CMP(a->cols, b->cols);
    CMP(col_of(a), col_of(b));
    CMP((uint32_t)ra->fp8_dtype, (uint32_t)rb->fp8_dtype);
    CMP((uint32_t)ra->scheme, (uint32_t)rb->scheme);
    CMP(ra->block_rows, rb->block_rows);
    CMP(ra->block_cols, rb->block_cols);
    CMP(f32_bits(ra->eps), f32_bits(rb->eps));
    CMP(rule_flags(ra), rule_flags(rb));
    CMP(a->off, b->off);
    return 0;
}

static int row_cmp(const void *x, const void *y)
{
    const store_fp8_row_t *a = x, *b = y;
    int c = key_cmp(a->shard, &a->g, &a->rule, b->shard, &b->g, &b->rule);
    if (c != 0)
        return c;
    CMP(a->g.rows, b->g.rows);
    return 0;
}

/* A rule as it came from a peer: a known FP8 dtype and scheme, blocks of sane sizes (a
 * per-tensor rule's block fields carry its set's key: schemes/store_amax.h). */
static int rule_sane(const wsync_wire_rule_t *r)
{
    if (r->fp8_dtype != WSYNC_DTYPE_F8E4M3FN && r->fp8_dtype != WSYNC_DTYPE_F8E5M2)
        return 0;
    if (r->scheme == WSYNC_QUANT_TENSOR)
        return 1;
    if (r->scheme == WSYNC_QUANT_CHANNEL)
        return r->block_rows == 0 && r->block_cols == 0;
    return r->scheme == WSYNC_QUANT_BLOCK && r->block_rows > 0 && r->block_cols > 0 &&
           r->block_rows <= (1 << 20) && r->block_cols <= (1 << 20);
}

static uint64_t cells_of(const wsync_wire_rule_t *r, uint64_t rows, uint64_t cols)
{
    uint64_t cr, cc;
    wsync_wire_cells(r, rows, cols, &cr, &cc);
    return cr * cc;
}

static void put_rule(wsync_wbuf_t *b, const wsync_wire_rule_t *r)
{
    wsync_put_u32(b, (uint32_t)r->fp8_dtype);
    wsync_put_u32(b, (uint32_t)r->scheme);
    wsync_put_i32(b, r->block_rows);
    wsync_put_i32(b, r->block_cols);
    wsync_put_u32(b, f32_bits(r->eps));
    wsync_put_u32(b, rule_flags(r));
}

static void get_rule(wsync_rbuf_t *rb, wsync_wire_rule_t *r)
{
    uint32_t eps, flags;

    memset(r, 0, sizeof(*r));
    r->fp8_dtype = (wsync_dtype_t)wsync_get_u32(rb);
    r->scheme = (wsync_quant_scheme_t)wsync_get_u32(rb);
    r->block_rows = wsync_get_i32(rb);
    r->block_cols = wsync_get_i32(rb);
    eps = wsync_get_u32(rb);
    memcpy(&r->eps, &eps, 4);
    flags = wsync_get_u32(rb);
    r->ue8m0 = (uint8_t)(flags & 1u);
    r->no_saturate = (uint8_t)((flags >> 1) & 1u);
}

/* ---- sender ---------------------------------------------------------------------------------- */

typedef struct {
    uint32_t shard;
    wsync_region_t g;
    wsync_wire_rule_t rule;
    uint32_t ncells;
    uint64_t off;                    /* its place in a wire slot */
    uint64_t hash;                   /* of this version's packed bytes (0: not hashed) */
    int skip;                        /* per-tensor, its set not agreed this version: not packed */
} freg_t;

typedef struct {
    uint8_t *mem;
    size_t cap;
    wsync_rma_mr_t *mr;
    uint8_t rkey[WSYNC_RMA_BLOB_MAX];
    size_t rkey_len;
    uint64_t version;                /* the version it holds; 0: free */
    int pinned;                      /* cudaHostRegister'ed by us (a sender with CUDA shards) */
} fslot_t;

struct store_ftx {
    const wsync_rma_ops_t *rma;
    wsync_rma_t *ctx;
    freg_t *regs;                    /* sorted by row_cmp's key, unique */
    uint32_t nregs, cap_regs;
    uint64_t used;                   /* bytes of a slot the regions take */
    fslot_t *slots;
    int nslots;
    int cur;                         /* the slot of the version in flight, -1 */
    uint32_t published;              /* regions in the table of the version packed last */
    uint32_t region;                 /* its slot's region in the directory entry */
    uint8_t *scratch;                /* a CUDA shard's region on the host */
    size_t scratch_cap;
    /* Regions of CUDA shards: quantized on the GPU (kernels/wire.c's pack descriptors, one
     * quantize_many) into dwire, laid out as a slot, then copied to the slot. */
    int cuda;                        /* some shard is in CUDA memory */
    int stale;                       /* the regions changed: descriptors to make again */
    wsync_kquant_t *kq;              /* [nkq] */
    uint32_t *kreg;                  /* [nkq] the region of each */
    void **kws;                      /* [nkq] its workspace in dws */
    uint32_t nkq;
    void *dwire, *dws;               /* device: the slot's image, the workspaces (kept zeroed) */
    /* per-tensor targets: the readers' sets and the senders' amax exchange (store_amax.h) */
    store_amax_t *amax;
    float *part;                     /* [cap_part] this sender's partials */
    uint32_t cap_part;
    store_relayq_t deferred;         /* relays that came during an exchange, for the next version */
};

static int freg_cmp(const void *x, const void *y)
{
    const freg_t *a = x, *b = y;
    int c = key_cmp(a->shard, &a->g, &a->rule, b->shard, &b->g, &b->rule);
    if (c != 0)
        return c;
    CMP(a->g.rows, b->g.rows);
    return 0;
}

/* Append a region (checked against shard `shard`), unsorted; sort_regs makes the set again. */
static wsync_status_t add_reg(wsync_sender_t *s, store_ftx_t *f, uint32_t shard,
                              const wsync_region_t *g, const wsync_wire_rule_t *rule,
                              uint32_t ncells, int from_rank)
{
    if (shard >= s->nshards || g->rows == 0 || g->cols == 0 || g->pitch < g->cols ||
        !rule_sane(rule) || cells_of(rule, g->rows, g->cols) != ncells)
        return wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %d: reader %d asked for a malformed "
                         "FP8 region (shard %u of %zu, %" PRIu64 " x %" PRIu64 " at pitch %" PRIu64
                         ", %u cells)", s->m.rank, from_rank, shard, s->nshards, g->rows, g->cols,
                         g->pitch, ncells);
    uint64_t elems = 1;
    for (int d = 0; d < s->shards[shard].param.ndim; d++)
        elems *= (uint64_t)s->shards[shard].box.len[d];
    wsync_dtype_t dt = s->shards[shard].param.dtype;
    if (g->off > elems || (g->rows - 1) > (elems - g->off) / g->pitch ||
        g->off + (g->rows - 1) * g->pitch + g->cols > elems ||
        (dt != WSYNC_DTYPE_BF16 && dt != WSYNC_DTYPE_F16 && dt != WSYNC_DTYPE_F32))
        return wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %d: reader %d asked for an FP8 region "
                         "of param '%s' (%s) outside its shard of %" PRIu64 " elements, or not "
                         "of bf16, f16 or f32", s->m.rank, from_rank,
                         s->shards[shard].param.name, wsync_dtype_name(dt), elems);
    if (f->nregs == f->cap_regs) {
        uint32_t nc = f->cap_regs ? f->cap_regs * 2 : 64;
        freg_t *n = realloc(f->regs, (size_t)nc * sizeof(*n));
        if (n == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for FP8 regions");
        f->regs = n;
        f->cap_regs = nc;
    }
    freg_t *x = &f->regs[f->nregs++];
    memset(x, 0, sizeof(*x));
    x->shard = shard;
    x->g = *g;
    x->rule = *rule;
    x->ncells = ncells;
    return WSYNC_OK;
}

/* Sorted and unique, with each region's place in a slot. */
static void sort_regs(store_ftx_t *f)
{
    uint32_t n = 0;

    if (f->nregs > 1)   /* qsort of NULL, 0 is undefined (UBSan): no FP8 regions */
        qsort(f->regs, f->nregs, sizeof(*f->regs), freg_cmp);
    for (uint32_t i = 0; i < f->nregs; i++)
        if (n == 0 || freg_cmp(&f->regs[n - 1], &f->regs[i]) != 0)
            f->regs[n++] = f->regs[i];
    f->nregs = n;
    f->used = 0;
    for (uint32_t i = 0; i < n; i++) {
        f->regs[i].off = f->used;
        f->used += (wsync_wire_scales_off(f->regs[i].g.rows, f->regs[i].g.cols) +
                    (uint64_t)f->regs[i].ncells * 4u + ALIGN - 1) / ALIGN * ALIGN;
    }
}

wsync_status_t wsync_store_ftx_create(wsync_sender_t *s, const wsync_rma_ops_t *rma,
                                      wsync_rma_t *ctx, store_ftx_t **out)
{
    const wsync_plan_t *plan = s->m.plan;
    store_ftx_t *f = calloc(1, sizeof(*f));
    wsync_status_t rc = WSYNC_OK;

    if (f == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory");
    f->rma = rma;
    f->ctx = ctx;
    f->cur = -1;
    f->stale = 1;
    for (size_t i = 0; i < s->nshards; i++)
        f->cuda |= s->shards[i].mem == WSYNC_MEM_CUDA;
    for (uint32_t i = 0; plan != NULL && i < plan->nchunks && rc == WSYNC_OK; i++) {
        const wsync_chunk_t *c = &plan->chunks[i];
        /* per-tensor chunks come from their readers, with their sets' keys */
        if (c->sender == (uint32_t)s->m.rank && c->rule != 0 && c->rule <= plan->nrules &&
            !wsync_wire_rule_needs_amax(&plan->rules[c->rule - 1]))
            rc = add_reg(s, f, c->shard, &c->src, &plan->rules[c->rule - 1], c->ncells, -1);
    }
    if (rc == WSYNC_OK)
        rc = wsync_store_amax_create(s->m.rank, (uint32_t)s->m.nsenders, &f->amax);
    if (rc != WSYNC_OK) {
        wsync_store_ftx_free(f);
        return rc;
    }
    sort_regs(f);
    *out = f;
    return WSYNC_OK;
}

void wsync_store_ftx_free(store_ftx_t *f)
{
    if (f == NULL)
        return;
    for (int i = 0; i < f->nslots; i++) {
        if (f->slots[i].mr != NULL)
            f->rma->dereg(f->slots[i].mr);
        if (f->slots[i].pinned)
            wsync_dev_host_unregister(f->slots[i].mem);
        free(f->slots[i].mem);
    }
    free(f->slots);
    free(f->regs);
    free(f->scratch);
    wsync_dev_free(f->dwire);
    wsync_dev_free(f->dws);
    free(f->kq);
    free(f->kreg);
    free(f->kws);
    wsync_store_amax_free(f->amax);
    free(f->part);
    wsync_store_relayq_free(&f->deferred);
    free(f);
}

/* A reader's relay: u32 n, then n rows of u32 shard, u64 off, rows, cols, pitch, u32 ncells,
 * the rule (six u32). */
static wsync_status_t take_relay(wsync_sender_t *s, store_ftx_t *f, const wsync_relay_t *m)
{
    wsync_rbuf_t rb;
    wsync_status_t rc = WSYNC_OK;

    wsync_rbuf_init(&rb, m->data, m->len);
    uint32_t n = wsync_get_count(&rb, RELAY_ROW);
    for (uint32_t i = 0; i < n && rc == WSYNC_OK && !rb.err; i++) {
        wsync_region_t g;
        wsync_wire_rule_t rule;
        uint32_t shard = wsync_get_u32(&rb);
        g.off = wsync_get_u64(&rb);
        g.rows = wsync_get_u64(&rb);
        g.cols = wsync_get_u64(&rb);
        g.pitch = wsync_get_u64(&rb);
        uint32_t ncells = wsync_get_u32(&rb);
        get_rule(&rb, &rule);
        if (!rb.err)
            rc = add_reg(s, f, shard, &g, &rule, ncells, m->rank);
    }
    if (rc == WSYNC_OK && (rb.err || wsync_rbuf_left(&rb) != 0))
        rc = wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %d: reader %d's FP8 regions are "
                       "malformed", s->m.rank, m->rank);
    return rc;
}

/* A free slot of at least f->used bytes, registered. */
static wsync_status_t take_slot(wsync_sender_t *s, store_ftx_t *f)
{
    int pick = -1;

    for (int i = 0; i < f->nslots && pick < 0; i++)
        if (f->slots[i].version == 0)
            pick = i;
    if (pick < 0) {
        fslot_t *n = realloc(f->slots, (size_t)(f->nslots + 1) * sizeof(*n));
        if (n == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "store: no memory");
        f->slots = n;
        memset(&f->slots[f->nslots], 0, sizeof(*n));
        pick = f->nslots++;
    }
    fslot_t *sl = &f->slots[pick];
    if (sl->cap < f->used) {         /* readers asked for more: a larger slot */
        if (sl->mr != NULL)
            f->rma->dereg(sl->mr);
        if (sl->pinned)
            wsync_dev_host_unregister(sl->mem);
        free(sl->mem);
        memset(sl, 0, sizeof(*sl));
        if (posix_memalign((void **)&sl->mem, 4096, (size_t)f->used) != 0) {
            sl->mem = NULL;
            return wsync_err(WSYNC_ERR_NOMEM, "store: sender %d: no memory for a wire slot of "
                             "%" PRIu64 " bytes (FP8 codes and scales)", s->m.rank, f->used);
        }
        sl->cap = (size_t)f->used;
        /* pinned, so that the copy of the GPU's codes and scales is DMA */
        wsync_status_t rc = f->cuda ? wsync_dev_host_register(sl->mem, sl->cap, 0, &sl->pinned)
                                    : WSYNC_OK;
        if (rc != WSYNC_OK)
            return rc;
    }
    if (sl->mr == NULL) {
        sl->rkey_len = sizeof(sl->rkey);
        wsync_status_t rc = f->rma->reg(f->ctx, sl->mem, sl->cap, &sl->mr, sl->rkey, &sl->rkey_len);
        if (rc != WSYNC_OK) {
            sl->mr = NULL;
            return rc;
        }
    }
    f->cur = pick;
    return WSYNC_OK;
}

/* Region x of a CUDA shard in place, on the host: its rows' span from the first to the last
 * element wanted. *base points where element x->g.off would be. */
static wsync_status_t device_span(wsync_sender_t *s, store_ftx_t *f, const freg_t *x,
                                  void *stream, const uint8_t **base)
{
    size_t esz = wsync_dtype_size(s->shards[x->shard].param.dtype);
    size_t n = (size_t)((x->g.rows - 1) * x->g.pitch + x->g.cols) * esz;

    if (n > f->scratch_cap) {
        uint8_t *p = realloc(f->scratch, n);
        if (p == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for %zu bytes", n);
        f->scratch = p;
        f->scratch_cap = n;
    }
    wsync_status_t rc = wsync_dev_copy_to_host(f->scratch,
                                               (const uint8_t *)s->shard_data[x->shard] +
                                                   x->g.off * esz,
                                               n, stream, wsync_deadline_in(s->m.timeout_ms));
    *base = f->scratch - x->g.off * esz;
    return rc;
}

/* A plan of one rule, and region x as a chunk placed at its offset in a slot. */
static void region_chunk(const wsync_sender_t *s, freg_t *x, wsync_plan_t *one, wsync_chunk_t *c)
{
    memset(one, 0, sizeof(*one));
    one->nrules = 1;
    one->rules = &x->rule;
    memset(c, 0, sizeof(*c));
    c->sender = (uint32_t)s->m.rank;
    c->shard = x->shard;
    c->dtype = s->shards[x->shard].param.dtype;
    c->rule = 1;
    c->src = x->g;
    c->ncells = x->ncells;
    c->bucket_off = x->off;
}

/* The descriptors of the CUDA shards' regions, their workspaces zeroed, and the device image of
 * a slot (f->used bytes), made again whenever the regions changed. */
static wsync_status_t dev_bind(wsync_sender_t *s, store_ftx_t *f, void *stream)
{
    wsync_status_t rc = WSYNC_OK;
    uint32_t n = 0;

    for (uint32_t k = 0; k < f->nregs; k++)
        n += s->shards[f->regs[k].shard].mem == WSYNC_MEM_CUDA &&
             !wsync_wire_rule_needs_amax(&f->regs[k].rule);
    wsync_dev_free(f->dwire);
    wsync_dev_free(f->dws);
    f->dwire = f->dws = NULL;
    free(f->kq);
    free(f->kreg);
    free(f->kws);
    f->kq = calloc(n + 1, sizeof(*f->kq));
    f->kreg = calloc(n + 1, sizeof(*f->kreg));
    f->kws = calloc(n + 1, sizeof(*f->kws));
    f->nkq = 0;
    if (f->kq == NULL || f->kreg == NULL || f->kws == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for %u FP8 regions", n);
    if (n == 0) {
        f->stale = 0;
        return WSYNC_OK;
    }
    if ((rc = wsync_dev_malloc((size_t)f->used, &f->dwire)) != WSYNC_OK ||
        (rc = wsync_dev_malloc((size_t)n * WSYNC_KQUANT_WS_BYTES, &f->dws)) != WSYNC_OK ||
        (rc = wsync_dev_memset_async(f->dws, 0, (size_t)n * WSYNC_KQUANT_WS_BYTES, stream)) !=
            WSYNC_OK ||
        (rc = wsync_dev_stream_sync(stream, wsync_deadline_in(s->m.timeout_ms),
                                    "store: zeroing the FP8 workspaces")) != WSYNC_OK)
        return rc;
    for (uint32_t k = 0; k < f->nregs && rc == WSYNC_OK; k++) {
        freg_t *x = &f->regs[k];
        /* per-tensor regions: packed on the CPU with the agreed amax (from a host copy) */
        if (s->shards[x->shard].mem != WSYNC_MEM_CUDA || wsync_wire_rule_needs_amax(&x->rule))
            continue;
        wsync_plan_t one;
        wsync_chunk_t c;
        region_chunk(s, x, &one, &c);
        rc = wsync_kernels_pack_wire_desc(&one, &c, s->shard_data[x->shard], f->dwire,
                                          &f->kq[f->nkq]);
        f->kq[f->nkq].name = s->shards[x->shard].param.name;
        f->kws[f->nkq] = (uint8_t *)f->dws + (size_t)f->nkq * WSYNC_KQUANT_WS_BYTES;
        f->kreg[f->nkq++] = k;
    }
    f->stale = rc != WSYNC_OK;
    return rc;
}

/* The CUDA shards' regions, quantized on the GPU and copied into slot sl. *bad: the region whose
 * quantization met a NaN or Inf (UINT32_MAX: none). */
static wsync_status_t dev_pack(wsync_sender_t *s, store_ftx_t *f, void *stream, fslot_t *sl,
                               uint32_t *bad)
{
    size_t first_bad = f->nkq;
    wsync_status_t rc;

    *bad = UINT32_MAX;
    if (f->stale && (rc = dev_bind(s, f, stream)) != WSYNC_OK)
        return rc;
    if (f->nkq == 0)
        return WSYNC_OK;
    if ((rc = wsync_dev_quantize_many(f->kq, f->nkq, f->kws, 0, stream)) != WSYNC_OK ||
        (rc = wsync_dev_quantize_check(f->dws, f->nkq, stream, wsync_deadline_in(s->m.timeout_ms),
                                       &first_bad)) != WSYNC_OK)
        return rc;
    if (first_bad < f->nkq) {
        *bad = f->kreg[first_bad];
        /* the flags stay set otherwise */
        rc = wsync_dev_memset_async(f->dws, 0, (size_t)f->nkq * WSYNC_KQUANT_WS_BYTES, stream);
        return rc;
    }
    rc = wsync_dev_memcpy_async(sl->mem, f->dwire, (size_t)f->used, stream);
    return rc == WSYNC_OK ? wsync_dev_stream_sync(stream, wsync_deadline_in(s->m.timeout_ms),
                                                  "store: the GPU's FP8 codes and scales to the "
                                                  "host")
                          : rc;
}

/* A relay that came during an exchange: kept for the next version's drain. */
static void defer_relay(void *arg, wsync_msg_t *msg, const wsync_relay_t *rl)
{
    store_ftx_t *f = arg;

    /* lost: a reader's regions, which that reader then quantizes itself */
    wsync_store_relayq_push(&f->deferred, msg, rl, "its regions or sets");
}

/* A relay to this sender: a reader's regions, a reader's per-tensor sets (sender 0), sender 0's
 * sets (the others). */
static wsync_status_t take_any(wsync_sender_t *s, store_ftx_t *f, const wsync_relay_t *rl)
{
    /* a reader's malformed regions cost that reader only: it quantizes what we do not */
    if (rl->tag == STORE_FP8_TAG && rl->role == WSYNC_ROLE_RECEIVER &&
        take_relay(s, f, rl) != WSYNC_OK)
        WSYNC_LOG_W("%s (the rest of that reader's regions left out)", wsync_last_error());
    if (rl->tag == STORE_AMAX_SETS_TAG)
        return wsync_store_amax_take(f->amax, rl);
    return WSYNC_OK;
}

/* Region g of shard `shard` lies in it, and the shard is of a float dtype. */
static int region_fits(const wsync_sender_t *s, uint32_t shard, const wsync_region_t *g)
{
    if (shard >= s->nshards || g->rows == 0 || g->cols == 0 || g->pitch < g->cols)
        return 0;
    uint64_t elems = 1;
    for (int d = 0; d < s->shards[shard].param.ndim; d++)
        elems *= (uint64_t)s->shards[shard].box.len[d];
    wsync_dtype_t dt = s->shards[shard].param.dtype;
    uint64_t end = wsync_region_end(g);
    return end != 0 && end <= elems &&
           (dt == WSYNC_DTYPE_BF16 || dt == WSYNC_DTYPE_F16 || dt == WSYNC_DTYPE_F32);
}

/* This sender's partial amax of every set of its list: the max over its members' regions of this
 * version's bytes. A member that does not fit its shard poisons its set (-1: left to its
 * readers). NONFINITE naming the param and the element on a NaN or Inf. */
static wsync_status_t partials(wsync_sender_t *s, store_ftx_t *f, const void *const *src,
                               void *stream, uint32_t n)
{
    if (n > f->cap_part) {
        float *p = realloc(f->part, (size_t)n * sizeof(*p));
        if (p == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for %u per-tensor amaxes", n);
        f->part = p;
        f->cap_part = n;
    }
    for (uint32_t k = 0; k < n; k++) {
        uint32_t nm;
        const store_amax_member_t *mem = wsync_store_amax_members(f->amax, k, &nm);
        f->part[k] = 0.0f;
        for (uint32_t i = 0; i < nm; i++) {
            if (!region_fits(s, mem[i].shard, &mem[i].g)) {
                f->part[k] = -1.0f;
                break;
            }
            freg_t x = {.shard = mem[i].shard, .g = mem[i].g,
                        .rule = *wsync_store_amax_rule(f->amax, k), .ncells = 1};
            wsync_plan_t one;
            wsync_chunk_t c;
            /* a CUDA shard's snapshot is on the host already; in place, its region is copied */
            const uint8_t *base = src[x.shard];
            float a = 0.0f;
            wsync_status_t rc = WSYNC_OK;
            region_chunk(s, &x, &one, &c);
            if (base == NULL)
                rc = device_span(s, f, &x, stream, &base);
            if (rc == WSYNC_OK)
                rc = wsync_exec_amax_wire(&one, &c, s->shards[x.shard].param.name, base, &a);
            if (rc != WSYNC_OK)
                return rc;
            f->part[k] = WSYNC_MAX(f->part[k], a);
        }
    }
    return WSYNC_OK;
}

/* Every sender, each version once sender 0 forwarded sets: the partials, then their agreement. */
static wsync_status_t tensor_amax(wsync_sender_t *s, store_ftx_t *f, uint64_t version,
                                  const void *const *src, void *stream)
{
    uint32_t n = wsync_store_amax_nsets(f->amax);
    int64_t deadline = wsync_deadline_in(s->m.timeout_ms);
    uint64_t t0 = wsync_now_ns();
    wsync_status_t rc = partials(s, f, src, stream, n), ag;

    /* a refusal is told to sender 0 (which tells the others) before it is returned */
    ag = wsync_store_amax_agree(f->amax, &s->m, version, f->part, n, rc, deadline, defer_relay,
                                f);
    if (rc == WSYNC_OK && ag == WSYNC_OK)
        WSYNC_LOG_D("store: sender %d: version %llu: %u per-tensor amaxes agreed in %.3f ms",
                    s->m.rank, (unsigned long long)version, n, (double)(wsync_now_ns() - t0) / 1e6);
    return rc != WSYNC_OK ? rc : ag;
}

wsync_status_t wsync_store_ftx_publish(wsync_sender_t *s, store_ftx_t *f, uint64_t version,
                                       const void *const *src, void *stream, int hash,
                                       wsync_dir_entry_t *e, uint64_t *packed)
{
    wsync_status_t rc = WSYNC_OK;
    wsync_msg_t *msg;
    wsync_relay_t rl;
    uint32_t had = f->nregs, npub = 0;

    *packed = 0;
    f->published = 0;
    /* relays kept from the last exchange, then those of readers that came since */
    for (uint32_t i = 0; i < f->deferred.n && rc == WSYNC_OK; i++)
        rc = take_any(s, f, &f->deferred.items[i].rl);
    wsync_store_relayq_clear(&f->deferred);
    while (rc == WSYNC_OK && wsync_member_relay_recv(&s->m, 0, &msg, &rl) == WSYNC_OK) {
        if (rl.tag == STORE_AMAX_PART_TAG) {   /* a sender ahead of us: for our exchange */
            wsync_store_amax_keep(f->amax, msg, &rl);
            continue;
        }
        rc = take_any(s, f, &rl);
        wsync_msg_free(msg);
    }
    /* sender 0: readers' new sets to the others, before this version's PUBLISH */
    if (rc == WSYNC_OK)
        rc = wsync_store_amax_forward(f->amax, &s->m, version);
    if (rc != WSYNC_OK)
        goto refused;
    if (f->nregs != had) {
        sort_regs(f);
        f->stale = 1;
        WSYNC_LOG_D("store: sender %d: %u FP8 regions (%" PRIu64 " bytes of codes and scales) "
                    "from version %llu", s->m.rank, f->nregs, f->used, (unsigned long long)version);
    }
    if (wsync_store_amax_due(f->amax, version) &&
        (rc = tensor_amax(s, f, version, src, stream)) != WSYNC_OK)
        goto refused;
    if (f->nregs == 0)
        return WSYNC_OK;
    if ((rc = take_slot(s, f)) != WSYNC_OK)
        return rc;
    fslot_t *sl = &f->slots[f->cur];
    /* CUDA shards' regions on the GPU first (the copy fills the whole slot), then the host's */
    uint32_t bad = UINT32_MAX;
    if (f->cuda)
        rc = dev_pack(s, f, stream, sl, &bad);
    for (uint32_t k = 0; k < f->nregs && rc == WSYNC_OK; k++) {
        freg_t *x = &f->regs[k];
        wsync_plan_t one;
        wsync_chunk_t c;
        int tensor = wsync_wire_rule_needs_amax(&x->rule);
        float amax = 0.0f;
        /* per-tensor: only with its set's agreed amax (else its readers quantize it) */
        x->skip = tensor && !wsync_store_amax_agreed(f->amax, wsync_store_amax_rule_key(&x->rule),
                                                     &amax);
        x->hash = 0;
        if (x->skip)
            continue;
        npub++;
        region_chunk(s, x, &one, &c);
        uint64_t nb = wsync_chunk_wire_bytes(&c);
        *packed += nb;
        if (s->shards[x->shard].mem != WSYNC_MEM_CUDA || k == bad || tensor) {
            /* on the CPU; a region whose GPU quantization met a NaN or Inf again, from a host
             * copy, for the error naming the element */
            const uint8_t *base =
                s->shards[x->shard].mem == WSYNC_MEM_CUDA && !tensor ? NULL : src[x->shard];
            if (base == NULL)
                rc = device_span(s, f, x, stream, &base);
            if (rc == WSYNC_OK && tensor) {
                wsync_wire_rule_t plain = x->rule;
                wsync_store_amax_rule_plain(&plain);
                one.rules = &plain;
                rc = wsync_exec_pack_wire_amax(&one, &c, s->shards[x->shard].param.name, base,
                                               amax, sl->mem);
            } else if (rc == WSYNC_OK) {
                rc = wsync_exec_pack_wire(&one, &c, s->shards[x->shard].param.name, base, sl->mem);
            }
            if (rc == WSYNC_OK && k == bad)
                rc = wsync_err(WSYNC_ERR_INTERNAL, "store: sender %d: the GPU's quantization of "
                               "param '%s' met a non-finite value its region does not hold",
                               s->m.rank, s->shards[x->shard].param.name);
        }
        x->hash = rc == WSYNC_OK && hash ? XXH3_64bits(sl->mem + x->off, (size_t)nb) : 0;
    }
    if (rc != WSYNC_OK)
        goto refused;
    struct wsync_dir_region *g = &e->regions[e->nregions];
    g->base = (uint64_t)(uintptr_t)sl->mem;
    g->len = sl->cap;
    g->rkey = sl->rkey;
    g->rkey_len = (uint32_t)sl->rkey_len;
    f->region = e->nregions++;
    sl->version = version;
    f->published = npub;
    return WSYNC_OK;
refused:;
    char text[1024];
    snprintf(text, sizeof(text), "store sender %d: version %llu refused: %s", s->m.rank,
             (unsigned long long)version, wsync_last_error());
    wsync_store_ftx_abandon(f);
    return wsync_err_set_text(rc, text);
}

void wsync_store_ftx_table(const store_ftx_t *f, wsync_wbuf_t *b)
{
    uint32_t n = f != NULL && f->cur >= 0 ? f->published : 0;

    wsync_put_u32(b, n);
    wsync_put_u32(b, STORE_FP8_ROW);
    if (n == 0)
        return;
    const fslot_t *sl = &f->slots[f->cur];
    for (uint32_t k = 0; k < f->nregs; k++) {
        const freg_t *x = &f->regs[k];
        if (x->skip)
            continue;
        wsync_put_u32(b, x->shard);
        wsync_put_u32(b, f->region);
        wsync_put_u64(b, (uint64_t)(uintptr_t)sl->mem + x->off);
        wsync_put_u64(b, x->g.off);
        wsync_put_u64(b, x->g.rows);
        wsync_put_u64(b, x->g.cols);
        wsync_put_u64(b, x->g.pitch);
        wsync_put_u32(b, x->ncells);
        put_rule(b, &x->rule);
        wsync_put_u64(b, x->hash);
    }
}

void wsync_store_ftx_abandon(store_ftx_t *f)
{
    if (f == NULL)
        return;
    if (f->cur >= 0)
        f->slots[f->cur].version = 0;
    f->cur = -1;
    f->published = 0;
}

void wsync_store_ftx_release(store_ftx_t *f, uint64_t version)
{
    for (int i = 0; f != NULL && i < f->nslots; i++)
        if (f->slots[i].version == version)
            f->slots[i].version = 0;
}

/* ---- reader ---------------------------------------------------------------------------------- */

wsync_status_t wsync_store_fp8_table_decode(wsync_rbuf_t *rb, uint32_t sender,
                                            const wsync_dir_entry_t *e, store_fp8_table_t *t)
{
    memset(t, 0, sizeof(*t));
    uint32_t n = wsync_get_u32(rb), row = wsync_get_u32(rb);
    if (rb->err || row != STORE_FP8_ROW || n > wsync_rbuf_left(rb) / STORE_FP8_ROW)
        return wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %u's FP8 table is malformed (%u rows "
                         "of %u bytes)", sender, n, row);
    if (n == 0)
        return WSYNC_OK;
    t->rows = calloc(n, sizeof(*t->rows));
    if (t->rows == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for %u FP8 table rows", n);
    t->n = n;
    for (uint32_t i = 0; i < n; i++) {
        store_fp8_row_t *x = &t->rows[i];
        x->shard = wsync_get_u32(rb);
        x->region = wsync_get_u32(rb);
        x->addr = wsync_get_u64(rb);
        x->g.off = wsync_get_u64(rb);
        x->g.rows = wsync_get_u64(rb);
        x->g.cols = wsync_get_u64(rb);
        x->g.pitch = wsync_get_u64(rb);
        x->ncells = wsync_get_u32(rb);
        get_rule(rb, &x->rule);
        x->hash = wsync_get_u64(rb);
        int ok = !rb->err && x->region < e->nregions && x->shard < e->nshards && x->g.rows > 0 &&
                 x->g.cols > 0 && x->g.pitch >= x->g.cols && x->g.rows <= (1ull << 40) &&
                 x->g.cols <= (1ull << 40) && rule_sane(&x->rule) &&
                 cells_of(&x->rule, x->g.rows, x->g.cols) == x->ncells;
        if (ok) {   /* the packed bytes lie inside their region (differences: nothing wraps) */
            const struct wsync_dir_region *g = &e->regions[x->region];
            uint64_t nb = wsync_wire_scales_off(x->g.rows, x->g.cols) + (uint64_t)x->ncells * 4u;
            ok = x->addr >= g->base && x->addr - g->base <= g->len &&
                 nb <= g->len - (x->addr - g->base);
        }
        if (!ok) {
            wsync_store_fp8_table_clear(t);
            return wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %u's FP8 table row %u is "
                             "malformed or lies outside its region", sender, i);
        }
    }
    if (n > 1)
        qsort(t->rows, n, sizeof(*t->rows), row_cmp);
    return WSYNC_OK;
}

void wsync_store_fp8_table_clear(store_fp8_table_t *t)
{
    free(t->rows);
    memset(t, 0, sizeof(*t));
}

/* Shard, row geometry and rule equal: one row of the table could hold the chunk's rows. */
static int same_key(const store_fp8_row_t *x, uint32_t shard, const wsync_region_t *g,
                    const wsync_wire_rule_t *rule)
{
    wsync_region_t a = x->g, b = *g;
    a.off = b.off = 0;   /* all but the first row */
    return key_cmp(x->shard, &a, &x->rule, shard, &b, rule) == 0 && col_of(&x->g) == col_of(g);
}

const store_fp8_row_t *wsync_store_fp8_find(const store_fp8_table_t *t, uint32_t shard,
                                            const wsync_region_t *src, const wsync_wire_rule_t *rule,
                                            uint64_t *dr)
{
    size_t lo = 0, hi = t->n;
    uint64_t step = rule->scheme == WSYNC_QUANT_BLOCK ? (uint64_t)rule->block_rows : 1u;

    while (lo < hi) {   /* the first row after src's key */
        size_t mid = lo + (hi - lo) / 2;
        const store_fp8_row_t *x = &t->rows[mid];
        if (key_cmp(x->shard, &x->g, &x->rule, shard, src, rule) <= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    /* a few rows back: a shorter region may start nearer than a longer one that holds src */
    for (size_t k = lo, tries = 0; k > 0 && tries < 16; k--, tries++) {
        const store_fp8_row_t *x = &t->rows[k - 1];
        if (!same_key(x, shard, src, rule))
            break;
        if (src->off < x->g.off || (src->off - x->g.off) % x->g.pitch != 0)
            continue;
        uint64_t d = (src->off - x->g.off) / x->g.pitch;
        if (d > x->g.rows || src->rows > x->g.rows - d || d % step != 0 ||
            (src->rows % step != 0 && d + src->rows != x->g.rows))
            continue;
        *dr = d;
        return x;
    }
    return NULL;
}

wsync_status_t wsync_store_frx_create(wsync_receiver_t *r, uint32_t lo, uint32_t hi,
                                      store_frx_t **out)
{
    const wsync_plan_t *plan = r->m.plan;
    uint32_t n = 0;
    wsync_status_t rc = WSYNC_OK;

    *out = NULL;
    for (uint32_t i = lo; i < hi; i++)
        n += plan->chunks[r->m.segs[i].chunk].rule != 0;
    if (n == 0)
        return WSYNC_OK;
    store_frx_t *f = calloc(1, sizeof(*f));
    if (f == NULL || (f->items = calloc(n, sizeof(*f->items))) == NULL) {
        free(f);
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory");
    }
    f->lo = lo;
    f->hi = hi;
    f->cap_items = n;
    if ((rc = wsync_store_frx_sets(r, f)) != WSYNC_OK) {
        wsync_store_frx_free(f);
        return rc;
    }
    /* our FP8 chunks of each sender, to that sender: it packs them from then on */
    const uint32_t per = (WSYNC_RELAY_MAX - 8u) / RELAY_ROW;
    for (uint32_t s = 0; s < plan->nsenders && rc == WSYNC_OK; s++) {
        uint32_t i = lo;
        while (i < hi && rc == WSYNC_OK) {
            wsync_wbuf_t b;
            uint32_t k = 0, prev = UINT32_MAX;
            wsync_wbuf_init(&b);
            wsync_put_u32(&b, 0);   /* the count, set below */
            for (; i < hi && k < per; i++) {
                const wsync_segment_t *sg = &r->m.segs[i];
                const wsync_chunk_t *c = &plan->chunks[sg->chunk];
                if (c->sender != s || c->rule == 0 || sg->chunk == prev)
                    continue;
                prev = sg->chunk;   /* segments of one chunk are neighbours (receiver, chunk) */
                wsync_put_u32(&b, c->shard);
                wsync_put_u64(&b, c->src.off);
                wsync_put_u64(&b, c->src.rows);
                wsync_put_u64(&b, c->src.cols);
                wsync_put_u64(&b, c->src.pitch);
                wsync_put_u32(&b, c->ncells);
                wsync_wire_rule_t rule = plan->rules[c->rule - 1];
                if (f->ckey != NULL && f->ckey[sg->chunk] != 0)
                    wsync_store_amax_rule_keyed(&rule, f->ckey[sg->chunk]);
                put_rule(&b, &rule);
                k++;
            }
            if (!b.err && k > 0) {
                uint32_t le = k;   /* little-endian count in place */
                for (int j = 0; j < 4; j++, le >>= 8)
                    b.data[j] = (uint8_t)le;
            }
            if (b.err)
                rc = wsync_err(WSYNC_ERR_NOMEM, "store: no memory");
            else if (k > 0)
                rc = wsync_member_relay_send(&r->m, WSYNC_ROLE_SENDER, (int)s, STORE_FP8_TAG,
                                             b.data, (uint32_t)b.len);
            wsync_wbuf_free(&b);
        }
    }
    if (rc != WSYNC_OK) {
        wsync_store_frx_free(f);
        return rc;
    }
    WSYNC_LOG_D("store: receiver %d: %u segments of FP8 targets take FP8 on the wire", r->m.rank,
                n);
    *out = f;
    return WSYNC_OK;
}

void wsync_store_frx_free(store_frx_t *f)
{
    if (f == NULL)
        return;
    free(f->buf);
    free(f->items);
    free(f->ckey);
    free(f->cset);
    free(f->set_plain);
    free(f->set_off);
    free(f->set_seg);
    free(f);
}

/* Codes and scales of segment sg (at `at` in the batch, as a bucket place) into its CUDA target:
 * two 2-D copies on `stream`. */
static wsync_status_t unpack_cuda(wsync_receiver_t *r, const wsync_segment_t *sg,
                                  const wsync_wire_rule_t *rule, const uint8_t *at, void *stream)
{
    const wsync_target_desc_t *t = &r->targets[sg->target];
    uint64_t cell_row, cell_col, scale_cols, cr, cc;
    wsync_status_t rc;

    if (!wsync_wire_region_whole(rule, t, sg->dst.off, sg->dst.pitch, sg->dst.rows, sg->dst.cols))
        return wsync_err(WSYNC_ERR_PROTOCOL, "store: receiver %d: target '%s': an FP8 segment "
                         "lands on cells it does not cover whole (offset %" PRIu64 ", %" PRIu64
                         " x %" PRIu64 ")", r->m.rank, t->name, sg->dst.off, sg->dst.rows,
                         sg->dst.cols);
    wsync_wire_cells(rule, sg->dst.rows, sg->dst.cols, &cr, &cc);
    wsync_wire_scales_at(rule, t, &sg->dst, &cell_row, &cell_col, &scale_cols);
    float *scales = wsync_receiver_wire_scales(r, sg->target);
    rc = wsync_dev_memcpy2d_async((uint8_t *)r->target_data[sg->target] + sg->dst.off,
                                  (size_t)sg->dst.pitch, at, (size_t)sg->dst.cols,
                                  (size_t)sg->dst.cols, (size_t)sg->dst.rows, stream);
    const uint8_t *from = at + wsync_wire_scales_off(sg->dst.rows, sg->dst.cols);
    float *to = scales + cell_row * scale_cols + cell_col;
    int dev = (r->dev_scales != NULL && r->dev_scales[sg->target] != NULL) ||
              r->quant[sg->target].scales_mem == WSYNC_MEM_CUDA;
    if (rc == WSYNC_OK && dev)
        rc = wsync_dev_memcpy2d_async(to, (size_t)scale_cols * 4u, from, (size_t)cc * 4u,
                                      (size_t)cc * 4u, (size_t)cr, stream);
    for (uint64_t k = 0; rc == WSYNC_OK && !dev && k < cr; k++)   /* host scales */
        memcpy(to + k * scale_cols, from + k * cc * 4u, (size_t)cc * 4u);
    return rc;
}

/* The batch's gets landed: quantize what came plain, then every segment into its target. */
wsync_status_t wsync_store_frx_finish_batch(wsync_receiver_t *r, store_frx_t *f,
                                            const wsync_store_io_t *io,
                                   void *stream)
{
    const wsync_plan_t *plan = r->m.plan;
    wsync_status_t rc = f->nitems > 0 ? io->flush(io->arg) : WSYNC_OK;
    int cuda = 0;

    for (uint32_t k = 0; k < f->nitems && rc == WSYNC_OK; k++) {
        const store_frx_item_t *it = &f->items[k];
        const wsync_segment_t *sg = &r->m.segs[it->seg];
        const wsync_target_desc_t *t = &r->targets[sg->target];
        wsync_chunk_t c = plan->chunks[sg->chunk];
        if (it->hash != 0) {
            uint64_t got = XXH3_64bits(f->buf + it->wire, (size_t)wsync_chunk_wire_bytes(&c));
            if (got != it->hash) {
                rc = wsync_err(WSYNC_ERR_INTEGRITY, "store: receiver %d: version %llu refused: "
                               "param '%s' (target '%s') from sender %u, FP8 chunk %u: the "
                               "sender's xxh3 of its codes and scales is %016llx, what arrived "
                               "hashes to %016llx", r->m.rank, (unsigned long long)f->v,
                               t->pieces[sg->piece].param.name, t->name, c.sender, sg->chunk,
                               (unsigned long long)it->hash, (unsigned long long)got);
                break;
            }
        }
        if (it->plain != UINT64_MAX) {
            wsync_chunk_t pc = c;
            pc.src = (wsync_region_t){0, c.src.cols, c.src.rows, c.src.cols};
            pc.bucket_off = it->wire;
            rc = wsync_wire_rule_needs_amax(&plan->rules[c.rule - 1])
                     ? wsync_exec_pack_wire_amax(plan, &pc, t->pieces[sg->piece].param.name,
                                                 f->buf + it->plain, it->amax, f->buf)
                     : wsync_exec_pack_wire(plan, &pc, t->pieces[sg->piece].param.name,
                                            f->buf + it->plain, f->buf);
            if (rc != WSYNC_OK)
                break;
        }
        c.bucket_off = it->wire;
        if (t->mem == WSYNC_MEM_CUDA) {
            rc = unpack_cuda(r, sg, &plan->rules[c.rule - 1], f->buf + it->wire, stream);
            cuda = 1;
        } else {
            rc = wsync_exec_unpack_wire(plan, sg, &c, f->buf, t, r->target_data[sg->target],
                                        wsync_receiver_wire_scales(r, sg->target));
        }
    }
    /* the buffer is refilled next: the copies out of it first */
    if (cuda) {
        wsync_status_t w = wsync_dev_stream_sync(stream, wsync_deadline_in(r->m.timeout_ms),
                                                 "the store's FP8 chunks' copies to the GPU");
        rc = rc == WSYNC_OK ? w : rc;
    }
    f->nitems = 0;
    return rc;
}

/* Segment i's chunk's plain values from its sender's shard, dense [rows, cols] into `to` (through
 * the checksums under WSYNC_VERIFY). */
wsync_status_t wsync_store_frx_get_plain(wsync_receiver_t *r, const wsync_store_io_t *io,
                                wsync_store_verified_fn verified, void *varg,
                                const wsync_dir_entry_t *en, uint64_t v, uint32_t i,
                                const wsync_chunk_t *c, uint8_t *to)
{
    size_t esz = wsync_dtype_size(c->dtype);
    const struct wsync_dir_region *g = NULL;
    uint64_t first = 0;
    wsync_status_t rc = wsync_dir_chunk_span(en, c, v, &g, &first);

    if (rc != WSYNC_OK)
        return rc;
    if (r->m.ctx->verify)
        return verified(varg, i, to);
    if (c->src.pitch == c->src.cols)
        return io->get(io->arg, c->sender, g->rkey, g->rkey_len, first, to,
                       c->src.rows * c->src.cols * esz);
    for (uint64_t k = 0; k < c->src.rows && rc == WSYNC_OK; k++)
        rc = io->get(io->arg, c->sender, g->rkey, g->rkey_len, first + k * c->src.pitch * esz,
                     to + k * c->src.cols * esz, c->src.cols * esz);
    return rc;
}

/* The table row holding segment i's chunk as its sender packed it, or NULL: a per-tensor chunk
 * only whole, in a row of its set (the rule's key). */
static const store_fp8_row_t *find_packed(const wsync_receiver_t *r, const store_frx_t *f,
                                          const store_fp8_table_t *tabs, const wsync_chunk_t *c,
                                          uint32_t chunk, uint64_t *dr)
{
    const wsync_plan_t *plan = r->m.plan;
    wsync_wire_rule_t rule = plan->rules[c->rule - 1];
    int tensor = wsync_wire_rule_needs_amax(&rule);

    if (tensor)
        wsync_store_amax_rule_keyed(&rule, f->ckey != NULL ? f->ckey[chunk] : 0);
    const store_fp8_row_t *x = wsync_store_fp8_find(&tabs[c->sender], c->shard, &c->src, &rule, dr);
    /* verified: only what can be checked whole against its sender's xxh3 */
    if (x != NULL && (r->m.ctx->verify || tensor) &&
        (*dr != 0 || c->src.rows != x->g.rows || (r->m.ctx->verify && x->hash == 0)))
        x = NULL;
    return x;
}

/* Room for `need` bytes in the batch buffer (nothing in flight: it may move). */
wsync_status_t wsync_store_frx_batch_room(wsync_receiver_t *r, store_frx_t *f, uint64_t need)
{
    if (need <= f->cap)
        return WSYNC_OK;
    size_t want = (size_t)WSYNC_MAX(need, BATCH_BYTES);
    uint8_t *p = realloc(f->buf, want);
    if (p == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: receiver %d: no memory for %zu bytes of FP8 "
                         "chunks", r->m.rank, want);
    f->buf = p;
    f->cap = want;
    return WSYNC_OK;
}

wsync_status_t wsync_store_frx_read(wsync_receiver_t *r, store_frx_t *f, const wsync_store_io_t *io,
                                    wsync_store_verified_fn verified, void *varg,
                                    const wsync_dir_entry_t *e, const store_fp8_table_t *tabs,
                                    uint64_t v, void *stream, uint64_t *bytes)
{
    const wsync_plan_t *plan = r->m.plan;
    uint64_t used = 0;
    wsync_status_t rc = WSYNC_OK;

    f->nitems = 0;
    f->nsent = f->nlocal = 0;
    f->v = v;
    /* a per-tensor target comes packed only if every chunk of it does (one amax) */
    if (f->nsets > 0)
        memset(f->set_plain, 0, f->nsets);
    for (uint32_t i = f->lo; i < f->hi && f->nsets > 0; i++) {
        uint32_t ch = r->m.segs[i].chunk;
        const wsync_chunk_t *c = &plan->chunks[ch];
        uint64_t dr = 0;
        if (c->rule != 0 && c->rule <= plan->nrules && f->cset[ch] < f->nsets &&
            find_packed(r, f, tabs, c, ch, &dr) == NULL)
            f->set_plain[f->cset[ch]] = 1;
    }
    for (uint32_t i = f->lo; i < f->hi && rc == WSYNC_OK; i++) {
        const wsync_segment_t *sg = &r->m.segs[i];
        const wsync_chunk_t *c = &plan->chunks[sg->chunk];
        if (c->rule == 0)
            continue;
        const wsync_target_desc_t *t = &r->targets[sg->target];
        if (r->wire == NULL || !r->wire[sg->target] || c->rule > plan->nrules)
            return wsync_err(WSYNC_ERR_PROTOCOL, "store: receiver %d: FP8 chunk %u of sender %u "
                             "for target '%s', which is not set up for FP8 on the wire",
                             r->m.rank, sg->chunk, c->sender, t->name);
        if (f->nsets > 0 && f->cset[sg->chunk] < f->nsets && f->set_plain[f->cset[sg->chunk]])
            continue;   /* below, whole */
        const wsync_wire_rule_t *rule = &plan->rules[c->rule - 1];
        const wsync_dir_entry_t *en = &e[c->sender];
        size_t esz = wsync_dtype_size(c->dtype);
        uint64_t nb = wsync_chunk_wire_bytes(c), dr = 0, plain = c->src.rows * c->src.cols * esz;
        const store_fp8_row_t *x = find_packed(r, f, tabs, c, sg->chunk, &dr);
        uint64_t need = wsync_store_frx_align(nb) + (x == NULL ? wsync_store_frx_align(plain) : 0);
        if (f->nitems > 0 && used + need > f->cap) {
            if ((rc = wsync_store_frx_finish_batch(r, f, io, stream)) != WSYNC_OK)
                return rc;
            used = 0;
        }
        if (used + need > f->cap && (rc = wsync_store_frx_batch_room(r, f, need)) != WSYNC_OK)
            return rc;
        store_frx_item_t *it = &f->items[f->nitems++];
        it->seg = i;
        it->wire = used;
        it->plain = x == NULL ? used + wsync_store_frx_align(nb) : UINT64_MAX;
        it->hash = 0;
        it->amax = 0.0f;
        if (x != NULL) {   /* its sender's codes and scales: one get, or codes and scales apart */
            const struct wsync_dir_region *g = &en->regions[x->region];
            uint64_t step = rule->scheme == WSYNC_QUANT_BLOCK ? (uint64_t)rule->block_rows : 1u;
            uint64_t cr, cc;
            wsync_wire_cells(rule, c->src.rows, c->src.cols, &cr, &cc);
            if (dr == 0 && c->src.rows == x->g.rows) {
                rc = io->get(io->arg, c->sender, g->rkey, g->rkey_len, x->addr, f->buf + used, nb);
                it->hash = r->m.ctx->verify ? x->hash : 0;
            } else {
                rc = io->get(io->arg, c->sender, g->rkey, g->rkey_len, x->addr + dr * c->src.cols,
                             f->buf + used, c->src.rows * c->src.cols);
                if (rc == WSYNC_OK)
                    rc = io->get(io->arg, c->sender, g->rkey, g->rkey_len,
                                 x->addr + wsync_wire_scales_off(x->g.rows, x->g.cols) +
                                     dr / step * cc * 4u,
                                 f->buf + used + wsync_wire_scales_off(c->src.rows, c->src.cols),
                                 cr * cc * 4u);
            }
            *bytes += nb;
            f->nsent++;
        } else {           /* not in its table (yet): its values, quantized here */
            rc = wsync_store_frx_get_plain(r, io, verified, varg, en, v, i, c, f->buf + it->plain);
            *bytes += plain;
            f->nlocal++;
        }
        used += need;
    }
    if (rc == WSYNC_OK)
        rc = wsync_store_frx_finish_batch(r, f, io, stream);
    for (uint32_t k = 0; k < f->nsets && rc == WSYNC_OK; k++)
        if (f->set_plain[k])
            rc = wsync_store_frx_tensor_plain(r, f, io, verified, varg, e, v, k, stream, bytes);
    if (rc == WSYNC_OK)
        WSYNC_LOG_D("store: receiver %d: version %llu: %u FP8 segments as their senders packed "
                    "them, %u read plain and quantized here", r->m.rank, (unsigned long long)v,
                    f->nsent, f->nlocal);
    return rc;
}
