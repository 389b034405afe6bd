/* Delta versions over the nccl scheme: the decisions and formats (schemes/nccl_delta.h), from the
 * plan alone. */
#include <stdlib.h>
#include <string.h>

#include <stdio.h>

#include "core/delta.h"
#include "core/delta_state.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/relay.h"
#include "core/status.h"
#include "core/util.h"
#include "kernels/delta.h"
#include "kernels/device.h"
#include "schemes/nccl_delta.h"
#include "schemes/nccl_state.h"
#include "wsync_build_config.h"

void wsync_nccl_sender_chunks(const wsync_plan_t *plan, uint32_t sender, uint32_t *lo,
                              uint32_t *hi)
{
    uint32_t a = 0, b = plan->nchunks;

    while (a < b) {   /* first chunk of a sender >= `sender` */
        uint32_t mid = a + (b - a) / 2;
        if (plan->chunks[mid].sender < sender)
            a = mid + 1;
        else
            b = mid;
    }
    *lo = a;
    b = plan->nchunks;
    while (a < b) {   /* first chunk of a sender > `sender` */
        uint32_t mid = a + (b - a) / 2;
        if (plan->chunks[mid].sender <= sender)
            a = mid + 1;
        else
            b = mid;
    }
    *hi = a;
}

void wsync_nccl_dcaps_encode(const uint8_t *bits, uint32_t nbits, wsync_wbuf_t *out)
{
    wsync_put_u32(out, WSYNC_NCCL_DCAPS_MAGIC);
    wsync_put_u32(out, nbits);
    wsync_put_bytes(out, bits, ((size_t)nbits + 7) / 8);
}

wsync_status_t wsync_nccl_dcaps_decode(const void *p, size_t len, uint32_t expect,
                                       const char *who, uint8_t **bits)
{
    wsync_rbuf_t r;
    size_t nbytes = ((size_t)expect + 7) / 8;

    wsync_rbuf_init(&r, p, len);
    uint32_t magic = wsync_get_u32(&r), nbits = wsync_get_u32(&r);
    if (r.err || magic != WSYNC_NCCL_DCAPS_MAGIC || nbits != expect ||
        wsync_rbuf_left(&r) != nbytes)
        return wsync_err(WSYNC_ERR_PROTOCOL, "nccl: %s's delta capabilities are malformed (%zu "
                         "bytes, magic %08x, %u chunks; expected %u chunks)", who, len, magic,
                         nbits, expect);
    const uint8_t *src = wsync_get_bytes(&r, nbytes);
    if (nbytes > 0 && expect % 8 != 0 && (src[nbytes - 1] >> (expect % 8)) != 0)
        return wsync_err(WSYNC_ERR_PROTOCOL, "nccl: %s's delta capabilities set bits past its %u "
                         "chunks", who, expect);
    uint8_t *b = malloc(nbytes + 1);
    if (b == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for delta capabilities");
    if (nbytes > 0)
        memcpy(b, src, nbytes);
    *bits = b;
    return WSYNC_OK;
}

int wsync_nccl_delta_op_on(const wsync_nccl_sched_t *s, const wsync_nccl_op_t *op,
                           const uint64_t *have, uint32_t nsenders)
{
    uint64_t b = have[op->sender];

    if (b == 0)
        return 0;
    if (op->kind == WSYNC_NCCL_OP_P2P)
        return have[nsenders + op->receiver] == b;
    const wsync_nccl_group_t *g = &s->groups[op->group];
    for (uint32_t i = 0; i < g->nrecv; i++)
        if (have[nsenders + g->recv[i]] != b)
            return 0;
    return 1;
}

int wsync_nccl_delta_item_on(const wsync_plan_t *plan, const wsync_nccl_sched_t *s,
                             const wsync_nccl_op_t *op, uint32_t j, uint32_t lo,
                             const uint8_t *scap, uint8_t *const *rbits)
{
    uint32_t c = s->items[op->item0 + j].chunk;

    (void)plan;
    if (!scap[c - lo])
        return 0;
    if (op->kind == WSYNC_NCCL_OP_P2P)
        return wsync_nccl_bit(rbits[op->receiver], c - lo);
    const wsync_nccl_group_t *g = &s->groups[op->group];
    for (uint32_t i = 0; i < g->nrecv; i++)
        if (!wsync_nccl_bit(rbits[g->recv[i]], c - lo))
            return 0;
    return 1;
}

/* core/delta.h's bound (every block PLAIN), computed here so that the scheme's layouts do not
 * wait on the codec. */
static uint64_t max_bytes(uint64_t n, uint64_t esize)
{
    uint64_t nb = wsync_delta_nblocks(n), full = n / WSYNC_DELTA_BLOCK, tail = n % WSYNC_DELTA_BLOCK;
    return WSYNC_DELTA_HEADER + 8 * nb + full * ((WSYNC_DELTA_BLOCK * esize + 7) / 8 * 8) +
           (tail * esize + 7) / 8 * 8;
}

uint64_t wsync_nccl_delta_room(const wsync_chunk_t *c)
{
    uint64_t max = max_bytes(c->src.rows * c->src.cols, wsync_dtype_size(c->dtype));
    return (max + WSYNC_NCCL_DALIGN - 1) / WSYNC_NCCL_DALIGN * WSYNC_NCCL_DALIGN;
}

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

void wsync_nccl_dtable_write(void *out, uint64_t version, uint32_t nitems, const uint64_t *len,
                             const uint64_t *hash)
{
    uint8_t *p = out;

    put64(p, (uint64_t)WSYNC_NCCL_DTABLE_MAGIC | (uint64_t)nitems << 32);
    put64(p + 8, version);
    for (uint32_t i = 0; i < nitems; i++) {
        put64(p + 16 + 16 * (size_t)i, len[i]);
        put64(p + 24 + 16 * (size_t)i, len[i] != 0 ? hash[i] : 0);
    }
}

wsync_status_t wsync_nccl_dtable_read(const void *in, uint64_t version, const wsync_plan_t *plan,
                                      const wsync_nccl_sched_t *s, const wsync_nccl_op_t *op,
                                      const char *who, uint64_t *len, uint64_t *hash)
{
    const uint8_t *p = in;
    uint64_t head = get64(p), v = get64(p + 8);

    if ((uint32_t)head != WSYNC_NCCL_DTABLE_MAGIC || (uint32_t)(head >> 32) != op->nitems ||
        v != version)
        return wsync_err(WSYNC_ERR_INTEGRITY, "nccl: the delta table from %s is corrupt: magic "
                         "%08x, %u items, version %llu (expected %u items of version %llu)", who,
                         (uint32_t)head, (uint32_t)(head >> 32), (unsigned long long)v,
                         op->nitems, (unsigned long long)version);
    for (uint32_t i = 0; i < op->nitems; i++) {
        const wsync_chunk_t *c = &plan->chunks[s->items[op->item0 + i].chunk];
        uint64_t n = c->src.rows * c->src.cols, l = get64(p + 16 + 16 * (size_t)i);
        uint64_t least = WSYNC_DELTA_HEADER + 8 * wsync_delta_nblocks(n);
        uint64_t most = max_bytes(n, wsync_dtype_size(c->dtype));
        if (l != 0 && (l % 8 != 0 || l < least || l > most))
            return wsync_err(WSYNC_ERR_INTEGRITY, "nccl: the delta table from %s says chunk %u "
                             "(%llu elements) is encoded in %llu bytes: not a multiple of 8 in "
                             "[%llu, %llu]", who, s->items[op->item0 + i].chunk,
                             (unsigned long long)n, (unsigned long long)l,
                             (unsigned long long)least, (unsigned long long)most);
    }
    for (uint32_t i = 0; i < op->nitems; i++) {
        len[i] = get64(p + 16 + 16 * (size_t)i);
        hash[i] = get64(p + 24 + 16 * (size_t)i);
    }
    return WSYNC_OK;
}

/* ================================================================================================
 * The scheme's delta path (schemes/nccl_state.h): set-up, and each version's steps
 * ============================================================================================== */

#define NC_TAG_DCAPS 3u              /* relay: a receiver's delta capabilities for one sender */

/* kernels/delta.h is compiled only with CUDA; the nccl scheme runs only with it, but this file is
 * built (and checked) without it too. */
#if WSYNC_HAVE_CUDA
#define KD_OR(call, fallback) (call)
#else
#define KD_OR(call, fallback) (fallback)
static wsync_status_t no_cuda(void)
{
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "nccl: delta versions need CUDA (this wsync was "
                     "built without it)");
}
#endif

static uint64_t nc_align(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

static uint64_t plain_bytes(const wsync_chunk_t *c)
{
    return c->src.rows * c->src.cols * wsync_dtype_size(c->dtype);
}

static wsync_status_t nc_inbox(void *arg)
{
    nc_state_t *st = arg;
    return wsync_inbox_failed(&st->m->inbox);
}

/* What both roles keep: the all-gather's buffers, the event. */
static wsync_status_t delta_alloc(nc_state_t *st)
{
    nc_delta_t *d = calloc(1, sizeof(*d));
    wsync_status_t rc;

    if (d == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for delta versions");
    st->d = d;
    d->have = calloc((size_t)st->nranks + 1, sizeof(uint64_t));
    if (d->have == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for delta versions");
    if ((rc = wsync_dev_malloc((size_t)st->nranks * 8, &d->have_dev)) != WSYNC_OK ||
        (rc = wsync_dev_event_create(0, &d->ev_tab)) != WSYNC_OK)
        return rc;
    return WSYNC_OK;
}

wsync_status_t wsync_nccl_delta_sender_setup(wsync_sender_t *s, nc_state_t *st)
{
    const wsync_plan_t *plan = s->m.plan;
    uint32_t me = st->rank, nr = plan->nreceivers, expect = 0, got = 0;
    int64_t deadline = wsync_deadline_in(s->m.timeout_ms);
    wsync_status_t rc;
    nc_delta_t *d;

    if ((rc = delta_alloc(st)) != WSYNC_OK)
        return rc;
    d = st->d;
    wsync_delta_tx_free(s->delta_tx);   /* a set-up before this one's */
    s->delta_tx = NULL;
    if ((rc = wsync_delta_tx_create(s, &s->delta_tx)) != WSYNC_OK)
        return rc;
    wsync_nccl_sender_chunks(plan, me, &d->lo, &d->hi);
    d->scap = calloc((size_t)(d->hi - d->lo) + 1, 1);
    d->rbits = calloc((size_t)nr + 1, sizeof(*d->rbits));
    if (d->scap == NULL || d->rbits == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for delta versions");
    for (uint32_t c = d->lo; c < d->hi; c++) {
        size_t esz = wsync_dtype_size(plan->chunks[c].dtype);
        d->scap[c - d->lo] = wsync_delta_tx_capable(s->delta_tx, c) &&
                             (esz == 1 || esz == 2 || esz == 4 || esz == 8);
    }
    /* what each receiver that reads from us can apply (sent once the communicators exist, so
     * that no GPU description is still on its way to anyone) */
    for (uint32_t r = 0; r < nr; r++)
        expect += plan->pair_bytes[(size_t)me * nr + r] > 0;
    while (got < expect) {
        wsync_msg_t *msg;
        wsync_relay_t rl;
        char who[64];
        rc = wsync_member_relay_recv(&s->m, deadline, &msg, &rl);
        if (rc == WSYNC_ERR_TIMEOUT)
            return wsync_err(rc, "nccl: sender %u: delta capabilities from %u of its %u receivers "
                             "did not come within %d ms", me, expect - got, expect,
                             s->m.timeout_ms);
        if (rc != WSYNC_OK)
            return rc;
        uint32_t r = (uint32_t)rl.rank;
        snprintf(who, sizeof(who), "receiver %d", rl.rank);
        if (rl.tag != NC_TAG_DCAPS || rl.role != WSYNC_ROLE_RECEIVER || rl.rank < 0 || r >= nr ||
            plan->pair_bytes[(size_t)me * nr + r] == 0 || d->rbits[r] != NULL)
            rc = wsync_err(WSYNC_ERR_PROTOCOL, "nccl: sender %u: unexpected relay (tag %u) from "
                           "%s %d while waiting for delta capabilities", me, rl.tag,
                           rl.role == WSYNC_ROLE_SENDER ? "sender" : "receiver", rl.rank);
        else
            rc = wsync_nccl_dcaps_decode(rl.data, rl.len, d->hi - d->lo, who, &d->rbits[r]);
        wsync_msg_free(msg);
        if (rc != WSYNC_OK)
            return rc;
        got++;
    }
    return WSYNC_OK;
}

wsync_status_t wsync_nccl_delta_receiver_setup(wsync_receiver_t *r, nc_state_t *st)
{
    const wsync_plan_t *plan = r->m.plan;
    uint32_t me = st->rank, nr = plan->nreceivers;
    wsync_status_t rc;

    if ((rc = delta_alloc(st)) != WSYNC_OK)
        return rc;
    wsync_delta_rx_free(r->delta_rx);
    r->delta_rx = NULL;
    if ((rc = wsync_delta_rx_create(r, 0, &r->delta_rx)) != WSYNC_OK)
        return rc;
    for (uint32_t s = 0; s < plan->nsenders && rc == WSYNC_OK; s++) {
        uint32_t lo, hi;
        if (plan->pair_bytes[(size_t)s * nr + me] == 0)
            continue;
        wsync_nccl_sender_chunks(plan, s, &lo, &hi);
        uint8_t *bits = calloc(((size_t)(hi - lo) + 7) / 8 + 1, 1);
        wsync_wbuf_t b;
        if (bits == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for delta capabilities");
        for (uint32_t c = lo; c < hi; c++)
            if (wsync_delta_rx_chunk_capable(r->delta_rx, c))
                bits[(c - lo) / 8] |= (uint8_t)(1u << ((c - lo) % 8));
        wsync_wbuf_init(&b);
        wsync_nccl_dcaps_encode(bits, hi - lo, &b);
        rc = b.err ? wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for delta capabilities")
                   : wsync_member_relay_send(&r->m, WSYNC_ROLE_SENDER, (int)s, NC_TAG_DCAPS,
                                             b.data, (uint32_t)b.len);
        wsync_wbuf_free(&b);
        free(bits);
    }
    return rc;
}

/* Pinned host memory of `bytes` (for tables the host reads or writes while NCCL runs). */
static wsync_status_t pinned_alloc(size_t bytes, uint8_t **out)
{
    int reg = 0;
    uint8_t *p = calloc(bytes + 1, 1);
    wsync_status_t rc;

    if (p == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for %zu bytes of delta tables", bytes);
    if ((rc = wsync_dev_host_register(p, bytes, 0, &reg)) != WSYNC_OK) {
        free(p);
        return rc;
    }
    if (!reg) {   /* registered by someone else already: cannot be (fresh memory) */
        free(p);
        return wsync_err(WSYNC_ERR_INTERNAL, "nccl: fresh host memory was already registered");
    }
    *out = p;
    return WSYNC_OK;
}

wsync_status_t wsync_nccl_delta_layout(nc_state_t *st, const wsync_plan_t *plan,
                                       const wsync_receiver_t *r)
{
    nc_delta_t *d = st->d;
    const wsync_nccl_sched_t *s = st->sched;
    int sender = st->role == WSYNC_ROLE_SENDER;
    uint32_t *map = NULL;
    wsync_status_t rc = WSYNC_OK;

    if (d->len == NULL) {   /* first time: the items of our ops */
        uint32_t n = 0;
        for (uint32_t i = 0; i < st->nmyops; i++) {
            st->myops[i].ditem0 = n;
            n += s->ops[st->myops[i].op].nitems;
        }
        d->nitems = n;
        d->len = calloc((size_t)n + 1, sizeof(uint64_t));
        d->hash = calloc((size_t)n + 1, sizeof(uint64_t));
        d->pat = calloc((size_t)n + 1, 1);
        d->cpat = calloc((size_t)n + 1, 1);
        d->eidx = calloc((size_t)n + 1, sizeof(uint32_t));
        d->ioff = calloc((size_t)n + 1, sizeof(uint64_t));
        if (d->len == NULL || d->hash == NULL || d->pat == NULL || d->cpat == NULL ||
            d->eidx == NULL || d->ioff == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for delta versions");
        for (uint32_t i = 0; sender && i < st->nmyops; i++) {
            const wsync_nccl_op_t *op = &s->ops[st->myops[i].op];
            for (uint32_t j = 0; j < op->nitems; j++)
                d->pat[st->myops[i].ditem0 + j] =
                    (uint8_t)wsync_nccl_delta_item_on(plan, s, op, j, d->lo, d->scap, d->rbits);
        }
    }
    if (sender) {
        map = malloc(((size_t)(d->hi - d->lo) + 1) * sizeof(uint32_t));
        free(d->encd);
        d->encd = calloc((size_t)(d->hi - d->lo) + 1, 1);
        if (map == NULL || d->encd == NULL) {
            free(map);
            return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for delta versions");
        }
        for (uint32_t c = d->lo; c < d->hi; c++)
            map[c - d->lo] = UINT32_MAX;
    }
    d->tbytes = 0;
    for (uint32_t k = 0; k < s->nsteps && rc == WSYNC_OK; k++) {
        nc_step_t *step = &st->steps[k];
        step->dbase = nc_align(step->staging, NC_ALIGN);
        step->dstaging = 0;
        step->tstaging = 0;
        for (uint32_t i = 0; i < step->nmyops; i++) {
            nc_myop_t *o = &st->myops[step->myop0 + i];
            const wsync_nccl_op_t *op = &s->ops[o->op];
            o->toff = step->tstaging;
            step->tstaging += nc_align(wsync_nccl_dtable_bytes(op->nitems), NC_ALIGN);
            if (sender)
                continue;
            /* receiver: room for each item it can apply, in item order */
            uint64_t off = 0;
            o->doff = step->dstaging;
            for (uint32_t j = 0; j < op->nitems; j++) {
                uint32_t c = s->items[op->item0 + j].chunk;
                if (wsync_delta_rx_chunk_capable(r->delta_rx, c)) {
                    d->ioff[o->ditem0 + j] = off;
                    off += wsync_nccl_delta_room(&plan->chunks[c]);
                } else {
                    d->ioff[o->ditem0 + j] = UINT64_MAX;
                }
            }
            step->dstaging += off;
        }
        if (!sender)
            continue;
        /* sender: each chunk an op of the step takes encoded, once */
        uint32_t n = 0;
        for (uint32_t i = 0; i < step->nmyops; i++) {
            const nc_myop_t *o = &st->myops[step->myop0 + i];
            const wsync_nccl_op_t *op = &s->ops[o->op];
            for (uint32_t j = 0; j < op->nitems; j++) {
                uint32_t c = s->items[op->item0 + j].chunk;
                if (d->pat[o->ditem0 + j] && map[c - d->lo] == UINT32_MAX)
                    map[c - d->lo] = n++;
            }
        }
        free(step->echunk);
        free(step->eoff);
        step->nenc = n;
        step->echunk = malloc(((size_t)n + 1) * sizeof(uint32_t));
        step->eoff = malloc(((size_t)n + 1) * sizeof(uint64_t));
        if (step->echunk == NULL || step->eoff == NULL) {
            rc = wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for delta versions");
            break;
        }
        for (uint32_t i = 0; i < step->nmyops; i++) {
            const nc_myop_t *o = &st->myops[step->myop0 + i];
            const wsync_nccl_op_t *op = &s->ops[o->op];
            for (uint32_t j = 0; j < op->nitems; j++) {
                uint32_t c = s->items[op->item0 + j].chunk;
                if (!d->pat[o->ditem0 + j])
                    continue;
                uint32_t e = map[c - d->lo];
                d->eidx[o->ditem0 + j] = e;
                step->echunk[e] = c;
            }
        }
        for (uint32_t e = 0; e < n; e++) {
            d->encd[step->echunk[e] - d->lo] = 1;
            step->eoff[e] = step->dstaging;
            step->dstaging += wsync_nccl_delta_room(&plan->chunks[step->echunk[e]]);
            map[step->echunk[e] - d->lo] = UINT32_MAX;
        }
    }
    free(map);
    if (rc != WSYNC_OK)
        return rc;
    for (uint32_t k = 0; k < s->nsteps; k++)
        d->tbytes = WSYNC_MAX(d->tbytes, st->steps[k].tstaging);
    for (int i = 0; i < NC_SLOTS && rc == WSYNC_OK; i++) {
        if (d->tdev[i] != NULL || d->tbytes == 0)
            continue;   /* tables keep their size: they depend on the schedule alone */
        rc = wsync_dev_malloc((size_t)d->tbytes, &d->tdev[i]);
        if (rc == WSYNC_OK)
            rc = pinned_alloc((size_t)d->tbytes, &d->thost[i]);
    }
    return rc;
}

wsync_status_t wsync_nccl_delta_sender_batches(wsync_sender_t *s, nc_state_t *st)
{
    const wsync_plan_t *plan = s->m.plan;
    wsync_kdelta_enc_t *e = NULL;
    uint32_t cap = 0, nenc = 0;
    uint64_t ebytes = 0;
    wsync_status_t rc = WSYNC_OK;

    for (uint32_t k = 0; k < st->sched->nsteps && rc == WSYNC_OK; k++) {
        nc_step_t *step = &st->steps[k];
        if (step->nenc == 0)
            continue;
        if (step->nenc > cap) {
            free(e);
            cap = step->nenc;
            if ((e = malloc(cap * sizeof(*e))) == NULL) {
                rc = wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for delta versions");
                break;
            }
        }
        for (uint32_t i = 0; i < step->nenc && rc == WSYNC_OK; i++) {
            const wsync_chunk_t *c = &plan->chunks[step->echunk[i]];
            int on_dev = 0;
            void *old = wsync_delta_tx_baseline(s->delta_tx, c->shard, &on_dev);
            if (old != NULL && !on_dev)   /* pinned host baseline: the address kernels use */
                rc = wsync_dev_host_device_ptr(old, &old);
            e[i] = (wsync_kdelta_enc_t){
                .new_base = s->shard_data[c->shard], .old_base = old, .src = c->src,
                .esize = (uint32_t)wsync_dtype_size(c->dtype),
                .out = (uint8_t *)st->slot[k % NC_SLOTS] + step->dbase + step->eoff[i],
                .cap = wsync_nccl_delta_room(c)};
            ebytes += plain_bytes(c);
        }
        if (rc == WSYNC_OK)
            rc = KD_OR(wsync_kdelta_encode_create(e, step->nenc, 1, &step->ebatch), no_cuda());
        nenc += step->nenc;
    }
    free(e);
    if (rc == WSYNC_OK)
        WSYNC_LOG_I("nccl: sender %u: delta mode: %u chunks (%llu bytes) encoded each version "
                    "for the receivers that can apply them; baselines %llu bytes", st->rank, nenc,
                    (unsigned long long)ebytes,
                    (unsigned long long)wsync_delta_tx_bytes(s->delta_tx));
    return rc;
}

wsync_status_t wsync_nccl_delta_begin(nc_state_t *st, wsync_delta_tx_t *tx, uint64_t mine,
                                      uint64_t version)
{
    nc_delta_t *d = st->d;
    int64_t deadline = wsync_deadline_in(st->m->timeout_ms);
    uint8_t *slot = (uint8_t *)d->have_dev + (size_t)st->nrank * 8;
    wsync_status_t rc;

    d->version = version;
    d->base = st->role == WSYNC_ROLE_SENDER ? mine : 0;
    d->enc = d->plain = 0;
    /* one u64 a rank, in place: every member learns every base and every holds */
    if ((rc = wsync_dev_memcpy_async(slot, &mine, 8, st->cstream)) != WSYNC_OK ||
        (rc = wsync_nccl_allgather(st->comm, slot, d->have_dev, 8, st->cstream)) != WSYNC_OK ||
        (rc = wsync_nccl_wait(st->comm, deadline, "the delta versions' all-gather", nc_inbox,
                              st)) != WSYNC_OK ||
        (rc = wsync_dev_event_record(d->ev_tab, st->cstream)) != WSYNC_OK ||
        (rc = wsync_nccl_wait_ev(st, d->ev_tab, 0, version)) != WSYNC_OK ||
        (rc = wsync_dev_copy_to_host(d->have, d->have_dev, (size_t)st->nranks * 8, st->cstream,
                                     deadline)) != WSYNC_OK)
        return rc;
    uint32_t ndelta = 0;
    for (uint32_t k = 0; k < st->sched->nsteps; k++) {
        nc_step_t *step = &st->steps[k];
        step->ndelta = 0;
        for (uint32_t i = 0; i < step->nmyops; i++) {
            nc_myop_t *o = &st->myops[step->myop0 + i];
            const wsync_nccl_op_t *op = &st->sched->ops[o->op];
            o->delta = (uint8_t)wsync_nccl_delta_op_on(st->sched, op, d->have,
                                                       (uint32_t)st->m->nsenders);
            step->ndelta += o->delta;
            for (uint32_t j = 0; !o->delta && j < op->nitems; j++)
                d->plain += plain_bytes(&st->m->plan->chunks[st->sched->items[op->item0 + j].chunk]);
        }
        ndelta += step->ndelta;
    }
    /* capable chunks no receiver can apply are never encoded: their baseline is never read, so
     * it counts as current (the ones encoded are marked as their step encodes them) */
    for (uint32_t c = d->lo; tx != NULL && c < d->hi; c++)
        if (!d->encd[c - d->lo])
            wsync_delta_tx_mark(tx, c);
    WSYNC_LOG_D("nccl: %s %u: version %llu: %u of its ops go as deltas (base %llu)",
                st->role == WSYNC_ROLE_SENDER ? "sender" : "receiver", st->rank,
                (unsigned long long)version, ndelta, (unsigned long long)mine);
    return WSYNC_OK;
}

wsync_status_t wsync_nccl_delta_encode(wsync_sender_t *s, nc_state_t *st, uint32_t k)
{
    nc_step_t *step = &st->steps[k];
    wsync_status_t rc;

    if (step->ebatch == NULL)
        return WSYNC_OK;
    /* every version, whoever takes it: the pass also brings the baselines to this version */
    rc = KD_OR(wsync_kdelta_launch(step->ebatch, NULL, st->xstream), no_cuda());
    if (rc != WSYNC_OK)
        return rc;
    for (uint32_t e = 0; e < step->nenc; e++)
        wsync_delta_tx_mark(s->delta_tx, step->echunk[e]);
    return WSYNC_OK;
}

wsync_status_t wsync_nccl_delta_tables(wsync_sender_t *s, nc_state_t *st, uint32_t k)
{
    const wsync_plan_t *plan = s->m.plan;
    nc_delta_t *d = st->d;
    nc_step_t *step = &st->steps[k];
    uint32_t slot = k % NC_SLOTS;
    const wsync_kdelta_result_t *res = NULL;
    wsync_status_t rc;

    if (step->ebatch != NULL) {   /* the encode ran before ev_copy */
        if ((rc = wsync_dev_event_wait(st->ev_copy[slot], wsync_deadline_in(s->m.timeout_ms),
                                       "nccl: the delta encoding")) != WSYNC_OK)
            return rc;
        res = KD_OR(wsync_kdelta_results(step->ebatch), NULL);
        if (res == NULL)
            return wsync_err(WSYNC_ERR_INTERNAL, "nccl: sender %u: no encode results", st->rank);
    }
    for (uint32_t i = 0; i < step->nmyops; i++) {
        const nc_myop_t *o = &st->myops[step->myop0 + i];
        const wsync_nccl_op_t *op = &st->sched->ops[o->op];
        if (!o->delta)
            continue;
        for (uint32_t j = 0; j < op->nitems; j++) {
            uint32_t t = o->ditem0 + j, c = st->sched->items[op->item0 + j].chunk;
            const wsync_chunk_t *ch = &plan->chunks[c];
            if (!d->pat[t]) {
                d->len[t] = d->hash[t] = 0;
                d->plain += plain_bytes(ch);
                continue;
            }
            const wsync_kdelta_result_t *e = &res[d->eidx[t]];
            if (e->len > wsync_nccl_delta_room(ch))
                return wsync_err(WSYNC_ERR_INTERNAL, "nccl: sender %u: chunk %u encoded in %llu "
                                 "bytes, past its room of %llu", st->rank, c,
                                 (unsigned long long)e->len,
                                 (unsigned long long)wsync_nccl_delta_room(ch));
            d->len[t] = e->len;
            d->hash[t] = e->hash;
            d->enc += e->len;
            if (WSYNC_FAULT(WSYNC_FAULT_DELTA_CORRUPT) == WSYNC_FAULT_CORRUPT) {
                /* what goes on the wire: the receiver must refuse it (INTEGRITY) */
                uint8_t *enc = (uint8_t *)st->slot[slot] + step->dbase + step->eoff[d->eidx[t]];
                WSYNC_LOG_W("nccl: sender %u: fault: one bit of chunk %u's encoding flipped "
                            "(version %llu)", st->rank, c, (unsigned long long)d->version);
                if ((rc = wsync_nccl_flip_device(st, enc, (size_t)e->len)) != WSYNC_OK)
                    return rc;
            }
        }
        wsync_nccl_dtable_write(d->thost[slot] + o->toff, d->version, op->nitems, &d->len[o->ditem0],
                                &d->hash[o->ditem0]);
    }
    /* on cstream: after the slot's previous sends (so the host buffer was free), before the
     * tables' sends */
    return wsync_dev_memcpy_async(d->tdev[slot], d->thost[slot], (size_t)step->tstaging,
                                  st->cstream);
}

void wsync_nccl_delta_item_buf(const nc_state_t *st, const wsync_plan_t *plan, uint32_t k,
                               const nc_myop_t *o, uint32_t j, void **buf, size_t *bytes)
{
    const nc_delta_t *d = st->d;
    const nc_step_t *step = &st->steps[k];
    const wsync_nccl_op_t *op = &st->sched->ops[o->op];
    const wsync_nccl_item_t *it = &st->sched->items[op->item0 + j];
    uint8_t *slot = st->slot[k % NC_SLOTS];
    uint32_t t = o->ditem0 + j;

    if (d->pat[t]) {
        *bytes = (size_t)d->len[t];
        *buf = st->role == WSYNC_ROLE_SENDER ? slot + step->dbase + step->eoff[d->eidx[t]]
                                             : slot + step->dbase + o->doff + d->ioff[t];
    } else {
        *bytes = (size_t)plain_bytes(&plan->chunks[it->chunk]);
        *buf = o->staged ? slot + o->soff + it->off : o->direct;
    }
}

/* Our segments of chunk c: [*lo, *hi) in st->m->segs. */
static void my_segs(const wsync_plan_t *plan, const nc_state_t *st, uint32_t c, uint32_t *lo,
                    uint32_t *hi)
{
    uint32_t a = st->seg_lo, b = st->seg_hi;
    (void)plan;
    while (a < b) {
        uint32_t mid = a + (b - a) / 2;
        if (st->m->segs[mid].chunk < c)
            a = mid + 1;
        else
            b = mid;
    }
    *lo = a;
    while (a < st->seg_hi && st->m->segs[a].chunk == c)
        a++;
    *hi = a;
}

static void free_op(nc_myop_t *o)
{
    KD_OR(wsync_kdelta_free(o->abatch), (void)0);
    wsync_dev_batch_free(o->pbatch);
    wsync_dev_batch_free(o->obatch);
    free(o->aitem);
    free(o->aseg);
    free(o->alens);
    o->abatch = NULL;
    o->pbatch = o->obatch = NULL;
    o->aitem = o->aseg = NULL;
    o->alens = NULL;
    o->napply = 0;
    o->built = 0;
}

/* The unpack of op o's staged items (only those not encoded when `plain_only`), from slot k. */
static wsync_status_t build_unpack(wsync_receiver_t *r, nc_state_t *st, uint32_t k,
                                   const nc_myop_t *o, int plain_only, wsync_kcopy_batch_t **out)
{
    const wsync_plan_t *plan = r->m.plan;
    const wsync_nccl_op_t *op = &st->sched->ops[o->op];
    wsync_kcopy_t *descs = NULL;
    uint32_t cap = 0, n = 0, lo, hi;
    wsync_status_t rc = WSYNC_OK;

    for (uint32_t j = 0; j < op->nitems && rc == WSYNC_OK; j++) {
        const wsync_nccl_item_t *it = &st->sched->items[op->item0 + j];
        const wsync_chunk_t *c = &plan->chunks[it->chunk];
        if (plain_only && st->d->pat[o->ditem0 + j])
            continue;
        my_segs(plan, st, it->chunk, &lo, &hi);
        if ((rc = wsync_kcopy_reserve(&descs, &cap, n + (hi - lo))) != WSYNC_OK)
            break;
        for (uint32_t g = lo; g < hi; g++) {
            const wsync_segment_t *sg = &st->m->segs[g];
            descs[n++] = (wsync_kcopy_t){
                .src = st->slot[k % NC_SLOTS], .dst = r->land[sg->target],
                .src_off = (o->soff + it->off) / wsync_dtype_size(c->dtype),
                .src_pitch = c->src.cols, .dst_off = sg->dst.off, .dst_pitch = sg->dst.pitch,
                .rows = c->src.rows, .cols = c->src.cols, .src_dtype = c->dtype,
                .dst_dtype = r->land_dtype[sg->target]};
        }
    }
    if (rc == WSYNC_OK && n > 0)
        rc = wsync_dev_batch_create(descs, n, out);
    free(descs);
    return rc;
}

/* The batches of DELTA op o for the items its table encodes (d->pat). */
static wsync_status_t build_op(wsync_receiver_t *r, nc_state_t *st, uint32_t k, nc_myop_t *o)
{
    const wsync_plan_t *plan = r->m.plan;
    nc_delta_t *d = st->d;
    const nc_step_t *step = &st->steps[k];
    const wsync_nccl_op_t *op = &st->sched->ops[o->op];
    wsync_kdelta_app_t *a = NULL;
    uint32_t n = 0, lo, hi;
    wsync_status_t rc = WSYNC_OK;

    KD_OR(wsync_kdelta_free(o->abatch), (void)0);
    wsync_dev_batch_free(o->pbatch);
    o->abatch = NULL;
    o->pbatch = NULL;
    o->built = 0;
    for (uint32_t j = 0; j < op->nitems; j++)
        if (d->pat[o->ditem0 + j]) {
            my_segs(plan, st, st->sched->items[op->item0 + j].chunk, &lo, &hi);
            n += hi - lo;
        }
    free(o->aitem);
    free(o->aseg);
    free(o->alens);
    o->aitem = malloc(((size_t)n + 1) * sizeof(uint32_t));
    o->aseg = malloc(((size_t)n + 1) * sizeof(uint32_t));
    o->alens = malloc(((size_t)n + 1) * sizeof(uint64_t));
    a = malloc(((size_t)n + 1) * sizeof(*a));
    if (o->aitem == NULL || o->aseg == NULL || o->alens == NULL || a == NULL) {
        free(a);
        return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for delta versions");
    }
    o->napply = 0;
    for (uint32_t j = 0; j < op->nitems; j++) {
        uint32_t t = o->ditem0 + j, c = st->sched->items[op->item0 + j].chunk;
        const wsync_chunk_t *ch = &plan->chunks[c];
        if (!d->pat[t])
            continue;
        my_segs(plan, st, c, &lo, &hi);
        for (uint32_t g = lo; g < hi; g++) {
            const wsync_segment_t *sg = &st->m->segs[g];
            o->aitem[o->napply] = j;
            o->aseg[o->napply] = g;
            a[o->napply++] = (wsync_kdelta_app_t){
                .enc = (uint8_t *)st->slot[k % NC_SLOTS] + step->dbase + o->doff + d->ioff[t],
                .len = wsync_nccl_delta_room(ch), .dst_base = r->land[sg->target],
                .dst = sg->dst, .esize = (uint32_t)wsync_dtype_size(ch->dtype)};
        }
    }
    if (o->napply > 0)
        rc = KD_OR(wsync_kdelta_apply_create(a, o->napply, 1, &o->abatch), no_cuda());
    free(a);
    if (rc == WSYNC_OK && o->staged)
        rc = build_unpack(r, st, k, o, 1, &o->pbatch);
    if (rc != WSYNC_OK)
        return rc;
    memcpy(d->cpat + o->ditem0, d->pat + o->ditem0, op->nitems);
    o->built = 1;
    return WSYNC_OK;
}

wsync_status_t wsync_nccl_delta_read_tables(wsync_receiver_t *r, nc_state_t *st, uint32_t k)
{
    const wsync_plan_t *plan = r->m.plan;
    nc_delta_t *d = st->d;
    const nc_step_t *step = &st->steps[k];
    wsync_status_t rc;

    for (uint32_t i = 0; i < step->nmyops; i++) {
        nc_myop_t *o = &st->myops[step->myop0 + i];
        const wsync_nccl_op_t *op = &st->sched->ops[o->op];
        char who[64];
        if (!o->delta)
            continue;
        snprintf(who, sizeof(who), "sender %u (pid %u)", op->sender,
                 r->m.planmsg.peers[op->sender].pid);
        if ((rc = wsync_nccl_dtable_read(d->thost[k % NC_SLOTS] + o->toff, d->version, plan,
                                         st->sched, op, who, &d->len[o->ditem0],
                                         &d->hash[o->ditem0])) != WSYNC_OK)
            return rc;
        for (uint32_t j = 0; j < op->nitems; j++) {
            uint32_t t = o->ditem0 + j;
            d->pat[t] = d->len[t] != 0;
            if (d->pat[t] && d->ioff[t] == UINT64_MAX)
                return wsync_err(WSYNC_ERR_PROTOCOL, "nccl: receiver %u: %s sent chunk %u "
                                 "encoded, but this receiver cannot apply it (a cast, a quantized "
                                 "FP8 target, or a staged one): it said so at set-up", st->rank,
                                 who, st->sched->items[op->item0 + j].chunk);
        }
        if (!o->built || memcmp(d->cpat + o->ditem0, d->pat + o->ditem0, op->nitems) != 0)
            if ((rc = build_op(r, st, k, o)) != WSYNC_OK)
                return rc;
    }
    return WSYNC_OK;
}

wsync_status_t wsync_nccl_delta_launch(wsync_receiver_t *r, nc_state_t *st, uint32_t k)
{
    nc_delta_t *d = st->d;
    const nc_step_t *step = &st->steps[k];
    wsync_status_t rc = WSYNC_OK;

    for (uint32_t i = 0; i < step->nmyops && rc == WSYNC_OK; i++) {
        nc_myop_t *o = &st->myops[step->myop0 + i];
        if (!o->delta) {   /* a plain op beside DELTA ones: its own unpack, not the step's */
            if (o->staged && o->obatch == NULL &&
                (rc = build_unpack(r, st, k, o, 0, &o->obatch)) != WSYNC_OK)
                break;
            if (o->obatch != NULL)
                rc = wsync_dev_batch_launch(o->obatch, st->xstream);
            continue;
        }
        if (o->pbatch != NULL && (rc = wsync_dev_batch_launch(o->pbatch, st->xstream)) != WSYNC_OK)
            break;
        if (o->napply == 0)
            continue;
        for (uint32_t e = 0; e < o->napply; e++)
            o->alens[e] = d->len[o->ditem0 + o->aitem[e]];
        rc = KD_OR(wsync_kdelta_launch(o->abatch, o->alens, st->xstream), no_cuda());
    }
    return rc;
}

wsync_status_t wsync_nccl_delta_check(wsync_receiver_t *r, nc_state_t *st, uint32_t k)
{
    const wsync_plan_t *plan = r->m.plan;
    nc_delta_t *d = st->d;
    const nc_step_t *step = &st->steps[k];

    for (uint32_t i = 0; i < step->nmyops; i++) {
        const nc_myop_t *o = &st->myops[step->myop0 + i];
        if (!o->delta || o->napply == 0)
            continue;
        const wsync_kdelta_result_t *res = KD_OR(wsync_kdelta_results(o->abatch), NULL);
        if (res == NULL)
            return wsync_err(WSYNC_ERR_INTERNAL, "nccl: receiver %u: no apply results", st->rank);
        for (uint32_t e = 0; e < o->napply; e++) {
            const wsync_segment_t *sg = &st->m->segs[o->aseg[e]];
            const wsync_chunk_t *c = &plan->chunks[sg->chunk];
            uint64_t want = d->hash[o->ditem0 + o->aitem[e]];
            if (res[e].fault != WSYNC_KDELTA_NO_FAULT) {
                const wsync_target_desc_t *t = &r->targets[sg->target];
                char what[512];
                snprintf(what, sizeof(what), "receiver %u: version %llu refused: param '%s' "
                         "(target '%s') from sender %u, chunk %u, applied as a delta against "
                         "version %llu", st->rank, (unsigned long long)d->version,
                         t->pieces[sg->piece].param.name, t->name, c->sender, sg->chunk,
                         (unsigned long long)wsync_delta_rx_holds(r));
                wsync_status_t rc = KD_OR(wsync_kdelta_fault_status(&res[e], what), no_cuda());
                return rc != WSYNC_OK ? rc
                                      : wsync_err(WSYNC_ERR_INTEGRITY, "%s: malformed", what);
            }
            if (res[e].hash != want)
                return wsync_delta_rx_hash_error(r, o->aseg[e], want, res[e].hash, d->version);
        }
    }
    return WSYNC_OK;
}

void wsync_nccl_delta_free_batches(nc_state_t *st)
{
    for (uint32_t i = 0; i < st->nmyops; i++)
        free_op(&st->myops[i]);
    for (uint32_t k = 0; st->steps != NULL && k < st->sched->nsteps; k++) {
        KD_OR(wsync_kdelta_free(st->steps[k].ebatch), (void)0);
        st->steps[k].ebatch = NULL;
    }
}

void wsync_nccl_delta_free(nc_state_t *st)
{
    nc_delta_t *d = st->d;

    if (d == NULL)
        return;
    if (!wsync_dev_is_wedged()) {
        wsync_dev_free(d->have_dev);
        wsync_dev_event_destroy(d->ev_tab);
        for (int i = 0; i < NC_SLOTS; i++) {
            wsync_dev_free(d->tdev[i]);
            if (d->thost[i] != NULL) {
                wsync_dev_host_unregister(d->thost[i]);
                free(d->thost[i]);
            }
        }
    }   /* else leaked with the rest of the scheme's device memory (NCCL may still use it) */
    for (uint32_t k = 0; st->steps != NULL && k < st->sched->nsteps; k++) {
        free(st->steps[k].echunk);
        free(st->steps[k].eoff);
        st->steps[k].echunk = NULL;
        st->steps[k].eoff = NULL;
    }
    for (uint32_t r = 0; d->rbits != NULL && st->sched != NULL &&
                         r < (uint32_t)st->m->nreceivers; r++)
        free(d->rbits[r]);
    free(d->rbits);
    free(d->scap);
    free(d->encd);
    free(d->have);
    free(d->len);
    free(d->hash);
    free(d->pat);
    free(d->cpat);
    free(d->eidx);
    free(d->ioff);
    free(d);
    st->d = NULL;
}
