/* plan_sim: see plan_sim.h. */
#include "tests/support/plan_sim.h"

#include "core/status.h"
#include "reshard/exec.h"
#include "reshard/plan_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    wsync_shard_desc_t desc;
    const void *data;
} sim_shard_t;

typedef struct {
    wsync_target_desc_t desc;
    void *data;
    uint8_t *hits;               /* per element: how many segments wrote it */
} sim_target_t;

struct plan_sim {
    uint32_t nsenders, nreceivers;
    uint64_t bucket_bytes;
    sim_shard_t *shards;
    size_t nshards, cap_shards;
    sim_target_t *targets;
    size_t ntargets, cap_targets;
    uint32_t *shard_count;       /* [nsenders] shards added so far */
    uint32_t *target_count;      /* [nreceivers] */
    wsync_plan_t *plan;
    int ran;
};

plan_sim_t *plan_sim_new(uint32_t nsenders, uint32_t nreceivers, uint64_t bucket_bytes)
{
    plan_sim_t *sim = calloc(1, sizeof(*sim));

    if (sim == NULL)
        return NULL;
    sim->nsenders = nsenders;
    sim->nreceivers = nreceivers;
    sim->bucket_bytes = bucket_bytes;
    sim->shard_count = calloc(nsenders ? nsenders : 1, sizeof(uint32_t));
    sim->target_count = calloc(nreceivers ? nreceivers : 1, sizeof(uint32_t));
    if (!sim->shard_count || !sim->target_count) {
        plan_sim_free(sim);
        return NULL;
    }
    return sim;
}

void plan_sim_free(plan_sim_t *sim)
{
    if (sim == NULL)
        return;
    for (size_t i = 0; i < sim->nshards; i++)
        wsync_shard_desc_clear(&sim->shards[i].desc);
    for (size_t i = 0; i < sim->ntargets; i++) {
        wsync_target_desc_clear(&sim->targets[i].desc);
        free(sim->targets[i].hits);
    }
    free(sim->shards);
    free(sim->targets);
    free(sim->shard_count);
    free(sim->target_count);
    wsync_plan_free(sim->plan);
    free(sim);
}

wsync_status_t plan_sim_add_shard(plan_sim_t *sim, uint32_t sender, const wsync_shard_t *shard)
{
    wsync_status_t st;

    if (sim == NULL || sender >= sim->nsenders)
        return wsync_err(WSYNC_ERR_INVALID, "plan_sim: sender %u out of range", sender);
    if (plan_grow((void **)&sim->shards, &sim->cap_shards, sim->nshards + 1, sizeof(*sim->shards)))
        return wsync_err(WSYNC_ERR_NOMEM, "plan_sim");
    st = wsync_shard_desc_from(shard, sender, sim->shard_count[sender],
                               &sim->shards[sim->nshards].desc);
    if (st != WSYNC_OK)
        return st;
    sim->shards[sim->nshards++].data = shard->data;
    sim->shard_count[sender]++;
    return WSYNC_OK;
}

wsync_status_t plan_sim_add_target(plan_sim_t *sim, uint32_t receiver,
                                   const wsync_target_t *target)
{
    wsync_status_t st;
    sim_target_t *t;

    if (sim == NULL || receiver >= sim->nreceivers)
        return wsync_err(WSYNC_ERR_INVALID, "plan_sim: receiver %u out of range", receiver);
    if (plan_grow((void **)&sim->targets, &sim->cap_targets, sim->ntargets + 1, sizeof(*sim->targets)))
        return wsync_err(WSYNC_ERR_NOMEM, "plan_sim");
    t = &sim->targets[sim->ntargets];
    memset(t, 0, sizeof(*t));
    st = wsync_target_desc_from(target, receiver, sim->target_count[receiver], &t->desc);
    if (st != WSYNC_OK)
        return st;
    t->data = target->data;
    sim->ntargets++;
    sim->target_count[receiver]++;
    return WSYNC_OK;
}

const wsync_plan_t *plan_sim_plan(const plan_sim_t *sim)
{
    return sim ? sim->plan : NULL;
}

/* The descriptions travel through their codec, as they would to the coordinator. */
static wsync_status_t compile_via_wire(plan_sim_t *sim, wsync_plan_t **plan)
{
    wsync_wbuf_t wb;
    wsync_rbuf_t rb;
    wsync_shard_desc_t *sd = NULL, *shards;
    wsync_target_desc_t *td = NULL, *targets;
    size_t ns = 0, nt = 0;
    wsync_status_t st;

    shards = calloc(sim->nshards ? sim->nshards : 1, sizeof(*shards));
    targets = calloc(sim->ntargets ? sim->ntargets : 1, sizeof(*targets));
    if (!shards || !targets) {
        free(shards);
        free(targets);
        return wsync_err(WSYNC_ERR_NOMEM, "plan_sim");
    }
    for (size_t i = 0; i < sim->nshards; i++)
        shards[i] = sim->shards[i].desc;
    for (size_t i = 0; i < sim->ntargets; i++)
        targets[i] = sim->targets[i].desc;

    wsync_wbuf_init(&wb);
    wsync_shards_encode(shards, sim->nshards, &wb);
    wsync_targets_encode(targets, sim->ntargets, &wb);
    free(shards);
    free(targets);
    if (wb.err) {
        wsync_wbuf_free(&wb);
        return wsync_err(WSYNC_ERR_NOMEM, "plan_sim: encoding descriptions");
    }
    wsync_rbuf_init(&rb, wb.data, wb.len);
    st = wsync_shards_decode(&rb, &sd, &ns);
    if (st == WSYNC_OK)
        st = wsync_targets_decode(&rb, &td, &nt);
    if (st == WSYNC_OK && (wsync_rbuf_left(&rb) != 0 || ns != sim->nshards || nt != sim->ntargets))
        st = wsync_err(WSYNC_ERR_INTERNAL, "plan_sim: descriptions changed on the wire");
    if (st == WSYNC_OK)
        st = wsync_plan_compile(sd, ns, td, nt, sim->nsenders, sim->nreceivers,
                                sim->bucket_bytes, plan);
    wsync_shard_descs_free(sd, ns);
    wsync_target_descs_free(td, nt);
    wsync_wbuf_free(&wb);
    return st;
}

/* Encode, decode, encode again: the same bytes and fingerprint. Replaces *plan by the decoded
 * copy, so that everything after runs on what a peer would have received. */
static wsync_status_t round_trip(wsync_plan_t **plan)
{
    wsync_wbuf_t a, b;
    wsync_plan_t *copy = NULL;
    wsync_status_t st;

    wsync_wbuf_init(&a);
    wsync_wbuf_init(&b);
    wsync_plan_encode(*plan, &a);
    st = a.err ? wsync_err(WSYNC_ERR_NOMEM, "plan_sim: encoding") : WSYNC_OK;
    if (st == WSYNC_OK)
        st = wsync_plan_decode(a.data, a.len, &copy);
    if (st == WSYNC_OK) {
        wsync_plan_encode(copy, &b);
        if (b.err || b.len != a.len || memcmp(a.data, b.data, a.len) != 0 ||
            copy->fingerprint != (*plan)->fingerprint)
            st = wsync_err(WSYNC_ERR_INTERNAL, "plan_sim: the plan changed through its codec");
    }
    if (st == WSYNC_OK) {
        wsync_plan_free(*plan);
        *plan = copy;
    } else {
        wsync_plan_free(copy);
    }
    wsync_wbuf_free(&a);
    wsync_wbuf_free(&b);
    return st;
}

static wsync_status_t check_ranks(plan_sim_t *sim)
{
    wsync_shard_desc_t *sd = malloc((sim->nshards ? sim->nshards : 1) * sizeof(*sd));
    wsync_target_desc_t *td = malloc((sim->ntargets ? sim->ntargets : 1) * sizeof(*td));
    wsync_status_t st = WSYNC_OK;

    if (!sd || !td) {
        free(sd);
        free(td);
        return wsync_err(WSYNC_ERR_NOMEM, "plan_sim");
    }
    for (uint32_t r = 0; r < sim->nsenders && st == WSYNC_OK; r++) {
        size_t n = 0;
        for (size_t i = 0; i < sim->nshards; i++)
            if (sim->shards[i].desc.sender == r)
                sd[n++] = sim->shards[i].desc;
        st = wsync_plan_check_sender(sim->plan, r, sd, n);
    }
    for (uint32_t r = 0; r < sim->nreceivers && st == WSYNC_OK; r++) {
        size_t n = 0;
        for (size_t i = 0; i < sim->ntargets; i++)
            if (sim->targets[i].desc.receiver == r)
                td[n++] = sim->targets[i].desc;
        st = wsync_plan_check_receiver(sim->plan, r, td, n);
    }
    free(sd);
    free(td);
    return st;
}

/* (rank, index) → position in the sim's arrays, ranks being dense by construction. */
static uint32_t *rank_table(size_t n, const uint32_t *count, uint32_t nranks, uint32_t **base_out)
{
    uint32_t *base = calloc((size_t)nranks + 1, sizeof(*base));
    uint32_t *pos = malloc((n ? n : 1) * sizeof(*pos));

    if (!base || !pos) {
        free(base);
        free(pos);
        return NULL;
    }
    for (uint32_t r = 0; r < nranks; r++)
        base[r + 1] = base[r] + count[r];
    *base_out = base;
    return pos;
}

static uint64_t elems_of(int nd, const int64_t *shape)
{
    uint64_t v = 1;
    for (int d = 0; d < nd; d++)
        v *= (uint64_t)shape[d];
    return v;
}

/* Every element of every piece's destination written once, nothing else written. */
static wsync_status_t verify_hits(const sim_target_t *tg)
{
    const wsync_target_desc_t *t = &tg->desc;
    int nd = t->ndim;
    uint64_t stride[WSYNC_MAX_DIMS], total = elems_of(nd, t->shape);

    stride[nd - 1] = 1;
    for (int d = nd - 2; d >= 0; d--)
        stride[d] = stride[d + 1] * (uint64_t)t->shape[d + 1];
    for (uint32_t k = 0; k < t->npieces; k++) {
        const wsync_piece_desc_t *p = &t->pieces[k];
        int64_t len[WSYNC_MAX_DIMS] = {1, 1, 1, 1}, i[WSYNC_MAX_DIMS];
        int empty = 0;
        for (int d = 0; d < nd; d++) {
            len[d] = p->src.len[d];
            empty |= len[d] == 0;
        }
        if (empty)
            continue;
        for (i[0] = 0; i[0] < len[0]; i[0]++)
            for (i[1] = 0; i[1] < len[1]; i[1]++)
                for (i[2] = 0; i[2] < len[2]; i[2]++)
                    for (i[3] = 0; i[3] < len[3]; i[3]++) {
                        uint64_t e = 0;
                        for (int d = 0; d < nd; d++)
                            e += (uint64_t)(p->dst_start[d] + i[d]) * stride[d];
                        if (tg->hits[e] != 1)
                            return wsync_err(WSYNC_ERR_INTERNAL, "plan_sim: target '%s' element "
                                             "%" PRIu64 " (piece %u, param '%s') was written %u "
                                             "times", t->name, e, k, p->param.name,
                                             (unsigned)tg->hits[e]);
                        tg->hits[e] = 2;
                    }
    }
    for (uint64_t e = 0; e < total; e++)
        if (tg->hits[e] != 0 && tg->hits[e] != 2)
            return wsync_err(WSYNC_ERR_INTERNAL, "plan_sim: target '%s' element %" PRIu64 " lies "
                             "in no piece but was written", t->name, e);
    return WSYNC_OK;
}

static void mark(uint8_t *hits, const wsync_region_t *r)
{
    for (uint64_t i = 0; i < r->rows; i++)
        for (uint64_t j = 0; j < r->cols; j++) {
            uint8_t *h = &hits[r->off + i * r->pitch + j];
            if (*h < 255)
                (*h)++;
        }
}

static wsync_status_t execute(plan_sim_t *sim, plan_sim_stats_t *out)
{
    const wsync_plan_t *p = sim->plan;
    uint32_t *sbase = NULL, *tbase = NULL, *spos, *tpos, *first = NULL, *order = NULL;
    wsync_segment_t *segs = NULL;    /* every receiver's, in plan order */
    uint8_t *bucket = NULL;
    uint64_t maxused = 1, nb = 0;
    wsync_status_t st = WSYNC_OK;
    plan_sim_stats_t stats;

    memset(&stats, 0, sizeof(stats));
    spos = rank_table(sim->nshards, sim->shard_count, sim->nsenders, &sbase);
    tpos = rank_table(sim->ntargets, sim->target_count, sim->nreceivers, &tbase);
    first = calloc((size_t)p->nchunks + 1, sizeof(*first));
    order = malloc((p->nsegments ? p->nsegments : 1) * sizeof(*order));
    for (uint32_t s = 0; s < p->nsenders; s++)
        nb += p->nbuckets[s];
    for (uint64_t b = 0; b < nb; b++)
        maxused = p->bucket_used[b] > maxused ? p->bucket_used[b] : maxused;
    bucket = malloc(maxused);
    if (wsync_plan_flatten(p, &segs) != WSYNC_OK)
        segs = NULL;
    if (!spos || !tpos || !first || !order || !bucket || !segs) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan_sim");
        goto out;
    }
    for (size_t i = 0; i < sim->nshards; i++) {
        const wsync_shard_desc_t *d = &sim->shards[i].desc;
        spos[sbase[d->sender] + d->index] = (uint32_t)i;
    }
    for (size_t i = 0; i < sim->ntargets; i++) {
        sim_target_t *t = &sim->targets[i];
        tpos[tbase[t->desc.receiver] + t->desc.index] = (uint32_t)i;
        t->hits = calloc(elems_of(t->desc.ndim, t->desc.shape), 1);
        if (t->hits == NULL) {
            st = wsync_err(WSYNC_ERR_NOMEM, "plan_sim: hit map");
            goto out;
        }
        wsync_exec_zero_uncovered(&t->desc, t->data);
    }

    /* segments grouped by chunk (counting sort) */
    for (uint32_t i = 0; i < p->nsegments; i++)
        first[segs[i].chunk + 1]++;
    for (uint32_t c = 0; c < p->nchunks; c++)
        first[c + 1] += first[c];
    {
        uint32_t *fill = calloc((size_t)p->nchunks + 1, sizeof(*fill));
        if (fill == NULL) {
            st = wsync_err(WSYNC_ERR_NOMEM, "plan_sim");
            goto out;
        }
        for (uint32_t i = 0; i < p->nsegments; i++) {
            uint32_t c = segs[i].chunk;
            order[first[c] + fill[c]++] = i;
        }
        free(fill);
    }

    /* bucket by bucket, as a sender would stage them */
    for (uint32_t c0 = 0, c1; c0 < p->nchunks; c0 = c1) {
        const wsync_chunk_t *head = &p->chunks[c0];
        for (c1 = c0; c1 < p->nchunks && p->chunks[c1].sender == head->sender &&
                      p->chunks[c1].bucket == head->bucket;
             c1++)
            ;
        memset(bucket, 0xA5, maxused);
        for (uint32_t c = c0; c < c1; c++) {
            const wsync_chunk_t *ch = &p->chunks[c];
            const sim_shard_t *sh = &sim->shards[spos[sbase[ch->sender] + ch->shard]];
            wsync_exec_pack(ch, sh->data, bucket);
            stats.staged_bytes += ch->src.rows * ch->src.cols * wsync_dtype_size(ch->dtype);
        }
        for (uint32_t c = c0; c < c1 && st == WSYNC_OK; c++) {
            const wsync_chunk_t *ch = &p->chunks[c];
            for (uint32_t k = first[c]; k < first[c + 1] && st == WSYNC_OK; k++) {
                const wsync_segment_t *sg = &segs[order[k]];
                sim_target_t *t = &sim->targets[tpos[tbase[sg->receiver] + sg->target]];
                st = wsync_exec_unpack(sg, ch, bucket, t->desc.dtype, t->data);
                mark(t->hits, &sg->dst);
                stats.delivered_bytes += ch->src.rows * ch->src.cols * wsync_dtype_size(ch->dtype);
            }
        }
        if (st != WSYNC_OK)
            goto out;
    }
    for (size_t i = 0; i < sim->ntargets && st == WSYNC_OK; i++)
        st = verify_hits(&sim->targets[i]);

    stats.fingerprint = p->fingerprint;
    stats.nchunks = p->nchunks;
    stats.nsegments = p->nsegments;
    stats.nbuckets = nb;
    if (st == WSYNC_OK && out != NULL)
        *out = stats;
out:
    free(segs);
    free(sbase);
    free(tbase);
    free(spos);
    free(tpos);
    free(first);
    free(order);
    free(bucket);
    return st;
}

wsync_status_t plan_sim_run(plan_sim_t *sim, plan_sim_stats_t *stats)
{
    wsync_status_t st;

    if (sim == NULL || sim->ran)
        return wsync_err(WSYNC_ERR_STATE, "plan_sim: run once per sim");
    sim->ran = 1;
    if ((st = compile_via_wire(sim, &sim->plan)) != WSYNC_OK)
        return st;
    if ((st = round_trip(&sim->plan)) != WSYNC_OK || (st = check_ranks(sim)) != WSYNC_OK)
        return st;
    return execute(sim, stats);
}

wsync_status_t plan_sim_run_all(const wsync_shard_t *shards, const uint32_t *shard_sender,
                                size_t nshards, const wsync_target_t *targets,
                                const uint32_t *target_receiver, size_t ntargets,
                                uint32_t nsenders, uint32_t nreceivers, uint64_t bucket_bytes,
                                plan_sim_stats_t *stats, wsync_plan_t **plan)
{
    plan_sim_t *sim = plan_sim_new(nsenders, nreceivers, bucket_bytes);
    wsync_status_t st = WSYNC_OK;

    if (sim == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "plan_sim");
    for (size_t i = 0; i < nshards && st == WSYNC_OK; i++)
        st = plan_sim_add_shard(sim, shard_sender[i], &shards[i]);
    for (size_t i = 0; i < ntargets && st == WSYNC_OK; i++)
        st = plan_sim_add_target(sim, target_receiver[i], &targets[i]);
    if (st == WSYNC_OK)
        st = plan_sim_run(sim, stats);
    if (st == WSYNC_OK && plan != NULL) {
        wsync_wbuf_t wb;
        wsync_wbuf_init(&wb);
        wsync_plan_encode(sim->plan, &wb);
        st = wb.err ? wsync_err(WSYNC_ERR_NOMEM, "plan_sim") : wsync_plan_decode(wb.data, wb.len,
                                                                                  plan);
        wsync_wbuf_free(&wb);
    }
    plan_sim_free(sim);
    return st;
}
