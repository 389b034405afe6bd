/* Per-tensor FP8 on the wire: the senders agree on each per-tensor target's amax every version
 * (schemes/wire_amax.h, docs/fp8_wire.md section 5). */
#include "schemes/wire_amax.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/relay.h"
#include "core/status.h"
#include "core/util.h"
#include "kernels/device.h"
#include "reshard/exec.h"
#include "wsync_build_config.h"

#define AMAX_TAG 0x414d5831u         /* relay tag "AMX1": partial amaxes, or the agreed ones */
#define AMAX_HDR 12u                 /* u64 version, u32 set count */

static uint32_t uf_find(uint32_t *up, uint32_t x)
{
    while (up[x] != x) {
        up[x] = up[up[x]];
        x = up[x];
    }
    return x;
}

static int tensor_chunk(const wsync_plan_t *plan, uint32_t c)
{
    uint32_t r = plan->chunks[c].rule;
    return r != 0 && r <= plan->nrules && wsync_wire_rule_needs_amax(&plan->rules[r - 1]);
}

void wsync_amax_sets_free(wsync_amax_sets_t *sets)
{
    if (sets == NULL)
        return;
    free(sets->set);
    free(sets->first_seg);
    free(sets->holds);
    memset(sets, 0, sizeof(*sets));
}

/* What wsync_amax_sets_build's passes over every receiver's segments share. */
typedef struct {
    const wsync_plan_t *plan;
    uint32_t *up, *tmax, *first;     /* union-find; each receiver's per-tensor targets; each
                                        (receiver, target)'s first chunk */
    size_t *base;                    /* [nr] a receiver's first slot in first */
    wsync_amax_sets_t *s;
} sets_ctx_t;

typedef void (*seg_visit_t)(sets_ctx_t *x, uint32_t r, uint32_t at, const wsync_segment_t *segs,
                            uint32_t n);

/* visit(r, at, its segments) for every receiver in plan order, `at` the plan-order number of its
 * first segment (the plan holds lists: each receiver's are expanded into one buffer in turn). */
static wsync_status_t each_receiver(sets_ctx_t *x, seg_visit_t visit)
{
    wsync_segment_t *segs = NULL;
    size_t cap = 0;
    wsync_status_t st = WSYNC_OK;

    for (uint32_t r = 0, at = 0; r < x->plan->nreceivers && st == WSYNC_OK; r++) {
        uint32_t n = 0;
        st = wsync_plan_segments_into(x->plan, r, &segs, &cap, &n);
        if (st == WSYNC_OK)
            visit(x, r, at, segs, n);
        at += n;
    }
    free(segs);
    return st;
}

/* pass 1: how many targets each receiver numbers among its per-tensor segments */
static void count_targets(sets_ctx_t *x, uint32_t r, uint32_t at, const wsync_segment_t *segs,
                          uint32_t n)
{
    (void)at;
    for (uint32_t i = 0; i < n; i++)
        if (tensor_chunk(x->plan, segs[i].chunk) && segs[i].target + 1 > x->tmax[r])
            x->tmax[r] = segs[i].target + 1;
}

/* pass 2: the chunks of one (receiver, target) joined */
static void join_chunks(sets_ctx_t *x, uint32_t r, uint32_t at, const wsync_segment_t *segs,
                        uint32_t n)
{
    (void)at;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t *f;
        if (!tensor_chunk(x->plan, segs[i].chunk))
            continue;
        f = &x->first[x->base[r] + segs[i].target];
        if (*f == WSYNC_AMAX_NONE) {
            *f = segs[i].chunk;
        } else {
            uint32_t a = uf_find(x->up, *f), b = uf_find(x->up, segs[i].chunk);
            if (a != b)
                x->up[b] = a;
        }
    }
}

/* pass 3: each set's first segment in plan order */
static void first_segments(sets_ctx_t *x, uint32_t r, uint32_t at, const wsync_segment_t *segs,
                           uint32_t n)
{
    (void)r;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t k = x->s->set[segs[i].chunk];
        if (k != WSYNC_AMAX_NONE && x->s->first_seg[k] == UINT32_MAX)
            x->s->first_seg[k] = at + i;
    }
}

wsync_status_t wsync_amax_sets_build(const wsync_plan_t *plan, wsync_amax_sets_t *out)
{
    uint32_t nc = plan->nchunks, nr = plan->nreceivers;
    size_t nslots = 0;
    wsync_amax_sets_t s = {0};
    sets_ctx_t x = {.plan = plan, .s = &s};
    wsync_status_t st = WSYNC_OK;
    int any = 0;

    memset(out, 0, sizeof(*out));
    for (uint32_t c = 0; c < nc && !any; c++)
        any = tensor_chunk(plan, c);
    if (!any)
        return WSYNC_OK;
    x.up = malloc((size_t)nc * sizeof(*x.up));
    x.tmax = calloc((size_t)nr + 1, sizeof(*x.tmax));
    x.base = calloc((size_t)nr + 1, sizeof(*x.base));
    s.set = malloc((size_t)nc * sizeof(*s.set));
    s.holds = calloc(plan->nsenders, 1);
    if (x.up == NULL || x.tmax == NULL || x.base == NULL || s.set == NULL || s.holds == NULL)
        goto nomem;
    /* the chunks of one (receiver, target) are one set: union-find over them, through a table
     * of each such target's first chunk (targets numbered per receiver) */
    for (uint32_t c = 0; c < nc; c++)
        x.up[c] = c;
    if (each_receiver(&x, count_targets) != WSYNC_OK)
        goto nomem;
    for (uint32_t r = 0; r < nr; r++) {
        x.base[r] = nslots;
        nslots += x.tmax[r];
    }
    x.first = malloc((nslots ? nslots : 1) * sizeof(*x.first));
    if (x.first == NULL)
        goto nomem;
    for (size_t k = 0; k < nslots; k++)
        x.first[k] = WSYNC_AMAX_NONE;
    if (each_receiver(&x, join_chunks) != WSYNC_OK)
        goto nomem;
    /* sets numbered in order of their first chunk (the root's entry is its set's number from
     * the first chunk of the set on) */
    for (uint32_t c = 0; c < nc; c++)
        s.set[c] = WSYNC_AMAX_NONE;
    for (uint32_t c = 0; c < nc; c++) {
        uint32_t root;
        if (!tensor_chunk(plan, c))
            continue;
        root = uf_find(x.up, c);
        if (s.set[root] == WSYNC_AMAX_NONE)
            s.set[root] = s.nsets++;
        s.set[c] = s.set[root];
        if (plan->chunks[c].sender < plan->nsenders)
            s.holds[plan->chunks[c].sender] = 1;
    }
    s.first_seg = malloc((s.nsets ? s.nsets : 1) * sizeof(*s.first_seg));
    if (s.first_seg == NULL)
        goto nomem;
    for (uint32_t k = 0; k < s.nsets; k++)
        s.first_seg[k] = UINT32_MAX;
    /* numbered in the plan's order: every receiver's segments before the next one's */
    if (each_receiver(&x, first_segments) != WSYNC_OK)
        goto nomem;
    *out = s;
    goto out;
nomem:
    st = wsync_err(WSYNC_ERR_NOMEM, "FP8 per-tensor sets of %u chunks", nc);
    wsync_amax_sets_free(&s);
out:
    free(x.up);
    free(x.tmax);
    free(x.base);
    free(x.first);
    return st;
}

void wsync_amax_tx_free(wsync_amax_tx_t *tx)
{
    if (tx == NULL)
        return;
    wsync_amax_sets_free(&tx->sets);
    free(tx->amax);
    free(tx->k);
    free(tx->kchunk);
    wsync_dev_free(tx->dev);
    wsync_dev_free(tx->dws);
    memset(tx, 0, sizeof(*tx));
}

void wsync_amax_tx_free_host(wsync_amax_tx_t *tx)
{
    if (tx == NULL)
        return;
    /* forgotten, not freed: nothing here touches the device */
    tx->dev = NULL;
    tx->dws = NULL;
    wsync_amax_tx_free(tx);
}

wsync_status_t wsync_amax_tx_build(wsync_amax_tx_t *tx, const wsync_sender_t *s)
{
    const wsync_plan_t *plan = s->m.plan;
    wsync_amax_tx_t t = {0};
    wsync_status_t st;

    if (tx->built)
        return WSYNC_OK;
    if ((st = wsync_amax_sets_build(plan, &t.sets)) != WSYNC_OK)
        return st;
    if (t.sets.nsets == 0) {
        t.built = 1;
        *tx = t;
        return WSYNC_OK;
    }
    t.amax = calloc(t.sets.nsets, sizeof(*t.amax));
    if (t.amax == NULL)
        goto nomem;
    for (uint32_t c = 0; c < plan->nchunks; c++)
        t.nk += t.sets.set[c] != WSYNC_AMAX_NONE && plan->chunks[c].sender == (uint32_t)s->m.rank &&
                s->shards[plan->chunks[c].shard].mem == WSYNC_MEM_CUDA;
    if (t.nk > 0) {
        uint32_t i = 0;
        t.k = calloc(t.nk, sizeof(*t.k));
        t.kchunk = calloc(t.nk, sizeof(*t.kchunk));
        if (t.k == NULL || t.kchunk == NULL)
            goto nomem;
        for (uint32_t c = 0; c < plan->nchunks; c++) {
            const wsync_chunk_t *ch = &plan->chunks[c];
            if (t.sets.set[c] == WSYNC_AMAX_NONE || ch->sender != (uint32_t)s->m.rank ||
                s->shards[ch->shard].mem != WSYNC_MEM_CUDA)
                continue;
            t.k[i] = (wsync_kamax_t){
                .x = (const uint8_t *)s->shard_data[ch->shard] +
                     ch->src.off * wsync_dtype_size(ch->dtype),
                .x_dtype = ch->dtype, .rows = ch->src.rows, .cols = ch->src.cols,
                .x_pitch = ch->src.pitch, .set = t.sets.set[c]};
            t.kchunk[i++] = c;
        }
        if ((st = wsync_dev_malloc((size_t)t.sets.nsets * sizeof(float), (void **)&t.dev)) !=
                WSYNC_OK ||
            (st = wsync_dev_malloc(WSYNC_KQUANT_WS_BYTES, &t.dws)) != WSYNC_OK) {
            wsync_amax_tx_free(&t);
            return st;
        }
    }
    t.built = 1;
    *tx = t;
    return WSYNC_OK;
nomem:
    wsync_amax_tx_free(&t);
    return wsync_err(WSYNC_ERR_NOMEM, "sender %d: FP8 per-tensor amaxes of %u targets",
                     s->m.rank, t.sets.nsets);
}

/* A NaN or Inf in the CUDA part of set k: the first chunk of ours in it that holds one, named as
 * the host path names it (param, element, sender). */
static wsync_status_t cuda_nonfinite(wsync_amax_tx_t *tx, const wsync_sender_t *s, uint32_t k,
                                     void *stream, int64_t deadline_ms)
{
#if WSYNC_HAVE_CUDA
    const wsync_plan_t *plan = s->m.plan;
    for (uint32_t i = 0; i < tx->nk; i++) {
        const wsync_chunk_t *ch = &plan->chunks[tx->kchunk[i]];
        const wsync_shard_desc_t *d = &s->shards[ch->shard];
        wsync_kquant_t q;
        wsync_status_t st;
        if (tx->k[i].set != k)
            continue;
        memset(&q, 0, sizeof(q));
        q.name = d->param.name;
        q.x = tx->k[i].x;
        q.x_dtype = ch->dtype;
        q.rows = ch->src.rows;
        q.cols = ch->src.cols;
        q.x_pitch = ch->src.pitch;
        /* rows of the param's matrix above the chunk's first (a 2-D param's) */
        if (d->param.ndim == 2 && ch->src.pitch > 0)
            q.row_base = (uint64_t)d->box.start[0] + ch->src.off / ch->src.pitch;
        st = wsync_kernels_find_nonfinite(&q, tx->dws, stream, deadline_ms);
        if (st == WSYNC_ERR_NONFINITE) {
            char text[1024];
            snprintf(text, sizeof(text), "sender %d: param '%s' (its chunk from column %llu): %s",
                     s->m.rank, d->param.name,
                     ch->src.pitch > 0 ? (unsigned long long)(ch->src.off % ch->src.pitch) : 0ull,
                     wsync_last_error());
            return wsync_err_set_text(st, text);
        }
        if (st != WSYNC_OK)
            return st;
    }
#else
    (void)tx;
    (void)stream;
    (void)deadline_ms;
#endif
    return wsync_err(WSYNC_ERR_NONFINITE, "sender %d: a NaN or Inf in the FP8 per-tensor set %u "
                     "(its amax on the GPU), found in none of its chunks again", s->m.rank, k);
}

/* The first NONFINITE of a version's partials: its message kept, the others only counted. */
static void keep_first(wsync_status_t st, wsync_status_t *first, char *text, size_t len)
{
    if (*first == WSYNC_OK) {
        *first = st;
        snprintf(text, len, "%s", wsync_last_error());
    }
}

wsync_status_t wsync_amax_tx_partials(wsync_amax_tx_t *tx, const wsync_sender_t *s,
                                      uint64_t version, void *stream, int64_t deadline_ms)
{
    const wsync_plan_t *plan = s->m.plan;
    uint32_t nsets = tx->sets.nsets;
    wsync_status_t st, bad = WSYNC_OK;
    char text[1024] = "";

    (void)version;
    if (nsets == 0)
        return WSYNC_OK;
    memset(tx->amax, 0, (size_t)nsets * sizeof(*tx->amax));
#if WSYNC_HAVE_CUDA
    /* the GPU's parts first, so that they run while the CPU reads the host shards */
    if (tx->nk > 0 &&
        (st = wsync_kernels_amax_many(tx->k, tx->nk, tx->dev, nsets, stream)) != WSYNC_OK)
        return st;
#endif
    for (uint32_t c = 0; c < plan->nchunks; c++) {
        const wsync_chunk_t *ch = &plan->chunks[c];
        uint32_t k = tx->sets.set[c];
        float a = 0.0f;
        if (k == WSYNC_AMAX_NONE || ch->sender != (uint32_t)s->m.rank ||
            s->shards[ch->shard].mem != WSYNC_MEM_HOST)
            continue;
        st = wsync_exec_amax_wire(plan, ch, s->shards[ch->shard].param.name,
                                  s->shard_data[ch->shard], &a);
        if (st == WSYNC_ERR_NONFINITE)
            keep_first(st, &bad, text, sizeof(text));
        else if (st != WSYNC_OK)
            return st;
        else
            tx->amax[k] = a > tx->amax[k] ? a : tx->amax[k];
    }
    if (tx->nk > 0) {
        float *g = malloc((size_t)nsets * sizeof(*g));
        if (g == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "sender %d: %u FP8 per-tensor amaxes", s->m.rank,
                             nsets);
        st = wsync_dev_copy_to_host(g, tx->dev, (size_t)nsets * sizeof(*g), stream, deadline_ms);
        for (uint32_t k = 0; k < nsets && st == WSYNC_OK; k++) {
            uint32_t u;
            memcpy(&u, &g[k], 4);
            if (u < 0x7f800000u) {   /* bits of |x|: not Inf, not NaN */
                tx->amax[k] = g[k] > tx->amax[k] ? g[k] : tx->amax[k];
            } else if (bad == WSYNC_OK) {
                st = cuda_nonfinite(tx, s, k, stream, deadline_ms);
                if (st == WSYNC_ERR_NONFINITE) {
                    keep_first(st, &bad, text, sizeof(text));
                    st = WSYNC_OK;
                }
            }
        }
        free(g);
        if (st != WSYNC_OK)
            return st;
    }
    return bad == WSYNC_OK ? WSYNC_OK : wsync_err_set_text(bad, text);
}

wsync_status_t wsync_amax_tx_upload(wsync_amax_tx_t *tx, void *stream)
{
    if (tx->nk == 0 || tx->sets.nsets == 0)
        return WSYNC_OK;
    return wsync_dev_memcpy_async(tx->dev, tx->amax, (size_t)tx->sets.nsets * sizeof(float),
                                  stream);
}

uint32_t wsync_amax_msg_bytes(uint32_t nsets)
{
    return AMAX_HDR + 4u * nsets;
}

void wsync_amax_msg_encode(uint64_t version, uint32_t nsets, const float *amax, uint8_t *buf)
{
    memcpy(buf, &version, 8);
    memcpy(buf + 8, &nsets, 4);
    memcpy(buf + AMAX_HDR, amax, (size_t)nsets * 4u);
}

wsync_status_t wsync_amax_msg_reduce(const uint8_t *buf, uint32_t len, uint64_t version,
                                     uint32_t nsets, const char *from, float *acc)
{
    uint64_t v;
    uint32_t n;

    if (len < AMAX_HDR)
        return wsync_err(WSYNC_ERR_PROTOCOL, "FP8 per-tensor amax from %s: %u bytes", from, len);
    memcpy(&v, buf, 8);
    memcpy(&n, buf + 8, 4);
    if (v != version || n != nsets || len != wsync_amax_msg_bytes(nsets))
        return wsync_err(WSYNC_ERR_PROTOCOL, "FP8 per-tensor amax from %s: version %" PRIu64
                         ", %u sets in %u bytes; expected version %" PRIu64 ", %u sets", from,
                         v, n, len, version, nsets);
    for (uint32_t k = 0; k < nsets; k++) {
        float a;
        memcpy(&a, buf + AMAX_HDR + 4u * k, 4);
        if (!(a >= 0.0f) || a > 3.4028235e38f)
            return wsync_err(WSYNC_ERR_PROTOCOL, "FP8 per-tensor amax from %s: set %u's amax %g "
                             "is not finite and >= 0", from, k, (double)a);
        acc[k] = a > acc[k] ? a : acc[k];
    }
    return WSYNC_OK;
}

/* The version of a relay's payload (0 when too short: never a version pushed). */
static uint64_t msg_version(const wsync_relay_t *rl)
{
    uint64_t v = 0;
    if (rl->len >= 8)
        memcpy(&v, rl->data, 8);
    return v;
}

/* The next AMAX relay of this version from the sender `want` (-1: any sender), skipping those of
 * older versions (left by a version that failed). */
static wsync_status_t recv_amax(wsync_member_t *m, int rank, uint64_t version, int want,
                                int64_t deadline_ms, wsync_msg_t **msg, wsync_relay_t *rl)
{
    for (;;) {
        wsync_status_t st = wsync_member_relay_recv(m, deadline_ms, msg, rl);
        if (st != WSYNC_OK)
            return st;
        if (rl->tag == AMAX_TAG && rl->role == WSYNC_ROLE_SENDER && msg_version(rl) < version) {
            wsync_msg_free(*msg);
            continue;
        }
        if (rl->tag != AMAX_TAG || rl->role != WSYNC_ROLE_SENDER ||
            (want >= 0 && rl->rank != want)) {
            st = wsync_err(WSYNC_ERR_PROTOCOL, "sender %d: version %" PRIu64 ": relay of tag "
                           "%08x from %s %d where FP8 per-tensor amaxes were due", rank, version,
                           rl->tag, rl->role == WSYNC_ROLE_SENDER ? "sender" : "receiver",
                           rl->rank);
            wsync_msg_free(*msg);
            return st;
        }
        return WSYNC_OK;
    }
}

/* Sender 0: every holder's partials, their max, sent back to each. */
static wsync_status_t reduce_at_root(wsync_member_t *m, const wsync_amax_sets_t *sets,
                                     uint32_t nsenders, uint64_t version, int64_t deadline_ms,
                                     float *acc, uint8_t *buf)
{
    uint8_t *heard = calloc(nsenders, 1);
    uint32_t due = 0, bytes = wsync_amax_msg_bytes(sets->nsets);
    wsync_status_t st = WSYNC_OK;

    if (heard == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "FP8 per-tensor amax: %u senders", nsenders);
    for (uint32_t s = 1; s < nsenders; s++)
        due += sets->holds[s];
    while (due > 0 && st == WSYNC_OK) {
        wsync_msg_t *msg = NULL;
        wsync_relay_t rl;
        char from[32];
        st = recv_amax(m, 0, version, -1, deadline_ms, &msg, &rl);
        if (st == WSYNC_ERR_TIMEOUT) {
            char who[256] = "";
            size_t n = 0;
            for (uint32_t s = 1; s < nsenders && n + 16 < sizeof(who); s++)
                if (sets->holds[s] && !heard[s])
                    n += (size_t)snprintf(who + n, sizeof(who) - n, "%s%u", n ? ", " : "", s);
            st = wsync_err(WSYNC_ERR_TIMEOUT, "sender 0: version %" PRIu64 ": no FP8 per-tensor "
                           "amax from sender %s by the version's deadline", version, who);
            break;
        }
        if (st != WSYNC_OK)
            break;
        snprintf(from, sizeof(from), "sender %d", (int)rl.rank);
        if (rl.rank <= 0 || (uint32_t)rl.rank >= nsenders || !sets->holds[rl.rank] ||
            heard[rl.rank])
            st = wsync_err(WSYNC_ERR_PROTOCOL, "sender 0: version %" PRIu64 ": FP8 per-tensor "
                           "amax from %s, which owes none", version, from);
        else
            st = wsync_amax_msg_reduce(rl.data, rl.len, version, sets->nsets, from, acc);
        if (st == WSYNC_OK) {
            heard[rl.rank] = 1;
            due--;
        }
        wsync_msg_free(msg);
    }
    free(heard);
    if (st != WSYNC_OK)
        return st;
    wsync_amax_msg_encode(version, sets->nsets, acc, buf);
    for (uint32_t s = 1; s < nsenders && st == WSYNC_OK; s++)
        if (sets->holds[s])
            st = wsync_member_relay_send(m, WSYNC_ROLE_SENDER, (int)s, AMAX_TAG, buf, bytes);
    return st;
}

wsync_status_t wsync_amax_agree(wsync_member_t *m, int rank, const wsync_amax_sets_t *sets,
                                uint64_t version, int64_t deadline_ms, float *amax)
{
    uint32_t nsenders = m->plan->nsenders, bytes;
    uint8_t *buf;
    float *acc;
    wsync_status_t st;

    if (sets->nsets == 0)
        return WSYNC_OK;
    if (rank != 0 && ((uint32_t)rank >= nsenders || !sets->holds[rank]))
        return WSYNC_OK;             /* nothing to send, nothing to pack */
    bytes = wsync_amax_msg_bytes(sets->nsets);
    if (bytes > WSYNC_RELAY_MAX || sets->nsets > (WSYNC_RELAY_MAX - AMAX_HDR) / 4u)
        return wsync_err(WSYNC_ERR_RANGE, "FP8 per-tensor amax: %u targets exceed one relay",
                         sets->nsets);
    buf = malloc(bytes);
    acc = malloc((size_t)sets->nsets * sizeof(*acc));
    if (buf == NULL || acc == NULL) {
        free(buf);
        free(acc);
        return wsync_err(WSYNC_ERR_NOMEM, "FP8 per-tensor amax: %u targets", sets->nsets);
    }
    memcpy(acc, amax, (size_t)sets->nsets * sizeof(*acc));
    if (rank == 0) {
        st = reduce_at_root(m, sets, nsenders, version, deadline_ms, acc, buf);
    } else {
        wsync_amax_msg_encode(version, sets->nsets, acc, buf);
        st = wsync_member_relay_send(m, WSYNC_ROLE_SENDER, 0, AMAX_TAG, buf, bytes);
        if (st == WSYNC_OK) {
            wsync_msg_t *msg = NULL;
            wsync_relay_t rl;
            st = recv_amax(m, rank, version, 0, deadline_ms, &msg, &rl);
            if (st == WSYNC_ERR_TIMEOUT)
                st = wsync_err(st, "sender %d: version %" PRIu64 ": no FP8 per-tensor amax from "
                               "sender 0 by the version's deadline", rank, version);
            if (st == WSYNC_OK) {
                /* the agreed max replaces ours: start from 0 so that a malformed reply is
                 * caught, not hidden by our own partials */
                memset(acc, 0, (size_t)sets->nsets * sizeof(*acc));
                st = wsync_amax_msg_reduce(rl.data, rl.len, version, sets->nsets, "sender 0",
                                           acc);
                wsync_msg_free(msg);
            }
        }
    }
    if (st == WSYNC_OK)
        memcpy(amax, acc, (size_t)sets->nsets * sizeof(*acc));
    free(buf);
    free(acc);
    return st;
}
