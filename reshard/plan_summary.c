/* wsync_plan_summarize(_wire): the coordinator's plan compiled from public descriptions, reduced
 * to the figures a tool prints (bytes per link, staging, counts, fingerprint, and how each
 * target's bytes travel with FP8 on the wire). */
#include "reshard/plan.h"

#include "core/status.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_BUCKET_BYTES ((size_t)256 << 20)

/* desc_from insists on data for non-empty boxes; a summary needs none, so NULL is replaced by
 * this address, which is never dereferenced (descriptions do not keep data pointers). */
static char no_data;

static int is_fp8(wsync_dtype_t d)
{
    return d == WSYNC_DTYPE_F8E4M3FN || d == WSYNC_DTYPE_F8E5M2;
}

/* Shard descriptions borrow the caller's names (see shard_view); targets own theirs. */
static void descs_clear(wsync_shard_desc_t *sd, wsync_target_desc_t *td, size_t ntd)
{
    for (size_t i = 0; td && i < ntd; i++)
        wsync_target_desc_clear(&td[i]);
    free(sd);
    free(td);
}

void wsync_plan_summary_free(wsync_plan_summary_t *s)
{
    if (s == NULL)
        return;
    free(s->pair_bytes);
    free(s->bytes_per_receiver);
    free(s->bytes_landed_per_receiver);
    free(s->bytes_per_sender);
    free(s->staged_bytes_per_sender);
    free(s->buckets_per_sender);
    free(s->target_form);
    free(s->target_bytes);
    free(s->target_param_bytes);
    free(s);
}

/* A shard's description for the compiler, borrowing the caller's name: a plan of a trillion-
 * parameter MoE from 64 FSDP ranks has millions of shards, and copying each name costs as much
 * as a pass of the compiler. Checked here: what the compiler does not check itself (ndim before
 * the dims are copied, the memory kind); the compiler checks name, dtype, shape and box, with
 * messages naming the sender, shard and param. */
static wsync_status_t shard_view(const wsync_shard_t *sh, uint32_t sender, uint32_t index,
                                 wsync_shard_desc_t *d)
{
    const char *name = sh->param.name ? sh->param.name : "(null)";

    if (sh->param.ndim < 1 || sh->param.ndim > WSYNC_MAX_DIMS)
        return wsync_err(WSYNC_ERR_INVALID, "sender %u shard %u: param '%s' has ndim %d, not in "
                         "[1, %d]", sender, index, name, sh->param.ndim, WSYNC_MAX_DIMS);
    if (sh->mem != WSYNC_MEM_HOST && sh->mem != WSYNC_MEM_CUDA)
        return wsync_err(WSYNC_ERR_INVALID, "sender %u shard %u (param '%s'): unknown memory "
                         "kind %d", sender, index, name, (int)sh->mem);
    if (sh->mem == WSYNC_MEM_CUDA && sh->device < 0)
        return wsync_err(WSYNC_ERR_INVALID, "sender %u shard %u (param '%s'): CUDA device %d",
                         sender, index, name, sh->device);
    memset(d, 0, sizeof(*d));
    d->sender = sender;
    d->index = index;
    d->param.name = (char *)sh->param.name;   /* borrowed: never freed here */
    d->param.dtype = sh->param.dtype;
    d->param.ndim = sh->param.ndim;
    memcpy(d->param.shape, sh->param.shape, (size_t)sh->param.ndim * sizeof(int64_t));
    memcpy(d->box.start, sh->box.start, (size_t)sh->param.ndim * sizeof(int64_t));
    memcpy(d->box.len, sh->box.len, (size_t)sh->param.ndim * sizeof(int64_t));
    d->mem = sh->mem;
    d->device = sh->device;
    return WSYNC_OK;
}

/* ---- FP8 on the wire: how each target's bytes travel, and why plain -------------------------
 *
 * The compiler keeps no reasons; they are found again from the plan and the descriptions. A
 * target that could take FP8 (wsync_wire_rule_of) but travels plain was dropped either because a
 * chunk of it does not lie on whole cells (or a row of its cells does not fit a bucket), or,
 * all its chunks being whole, because one of them also feeds a target that travels otherwise.
 * The compiler judges a chunk before splitting it at bucket ends, and a plain chunk is split at
 * any row: the parts of one region (consecutive chunks of one shard, the next part starting its
 * bucket, rows continuing in the shard and in the target) are joined again before the test. */

/* A region of a target being joined from the parts of one chunk. */
typedef struct {
    uint32_t chunk;                  /* its last part; UINT32_MAX: none open */
    uint32_t piece;
    uint64_t off, pitch, rows, cols; /* in the target, in elements */
} run_t;

/* 1 when segment sg (chunk ch) continues run r: the next part of the same region. */
static int run_continues(const wsync_plan_t *p, const run_t *r, const wsync_segment_t *sg)
{
    const wsync_chunk_t *a, *b = &p->chunks[sg->chunk];

    if (r->chunk == UINT32_MAX || sg->chunk != r->chunk + 1 || sg->piece != r->piece)
        return 0;
    a = &p->chunks[r->chunk];
    return a->sender == b->sender && a->shard == b->shard && a->rule == 0 && b->rule == 0 &&
           b->bucket == a->bucket + 1 && b->bucket_off == 0 && a->src.cols == b->src.cols &&
           a->src.pitch == b->src.pitch && b->src.off == a->src.off + a->src.rows * a->src.pitch &&
           sg->dst.cols == r->cols && sg->dst.pitch == r->pitch &&
           sg->dst.off == r->off + r->rows * r->pitch;
}

/* The region run r joined: 0 when it is not whole cells of t under rule, or its cell row does not
 * fit a bucket (what the compiler asks of every region before it marks a target). */
static int run_whole(const run_t *r, const wsync_wire_rule_t *rule, const wsync_target_desc_t *t,
                     uint64_t bucket_bytes)
{
    return wsync_wire_region_whole(rule, t, r->off, r->pitch, r->rows, r->cols) &&
           wsync_wire_cellrow_fits(rule, r->cols, bucket_bytes);
}

/* target_form, target_bytes, target_param_bytes and the totals by form. */
static wsync_status_t summarize_forms(const wsync_plan_t *p, const wsync_target_desc_t *td,
                                      size_t ntd, int fp8_wire, wsync_plan_summary_t *s)
{
    uint32_t *at = NULL, *base = NULL, *nseg = NULL, *nfp8 = NULL;
    uint8_t *ruled = NULL, *cut = NULL;
    wsync_wire_rule_t *rules = NULL;
    run_t *runs = NULL;
    struct lsum {
        uint64_t bytes, param_bytes;
        uint32_t nfp8;
    } *lsum = NULL;
    size_t nr = p->nreceivers;
    wsync_status_t st = WSYNC_OK;

    at = malloc((ntd + 1) * sizeof(*at));
    base = calloc(nr + 1, sizeof(*base));
    nseg = calloc(ntd + 1, sizeof(*nseg));
    nfp8 = calloc(ntd + 1, sizeof(*nfp8));
    ruled = calloc(ntd + 1, 1);
    cut = calloc(ntd + 1, 1);
    rules = calloc(ntd + 1, sizeof(*rules));
    runs = malloc((ntd + 1) * sizeof(*runs));
    if (!at || !base || !nseg || !nfp8 || !ruled || !cut || !rules || !runs) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan summary: wire forms of %zu targets", ntd);
        goto out;
    }
    /* segments name (receiver, index); the descriptions are in the caller's order */
    for (size_t j = 0; j < ntd; j++)
        base[td[j].receiver + 1]++;
    for (size_t r = 0; r < nr; r++)
        base[r + 1] += base[r];
    for (size_t j = 0; j < ntd; j++) {
        at[base[td[j].receiver] + td[j].index] = (uint32_t)j;
        ruled[j] = fp8_wire && wsync_wire_rule_of(&td[j], &rules[j]);
        runs[j].chunk = UINT32_MAX;
    }
    /* a list's figures are the same for every target taking it: summed once (lsum); only
     * targets that could take FP8 from their senders walk their segments (runs of cells) */
    lsum = calloc(p->nlists + (size_t)1, sizeof(*lsum));
    if (lsum == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan summary: %u lists", p->nlists);
        goto out;
    }
    for (uint32_t l = 0; l < p->nlists; l++)
        for (uint32_t i = p->list0[l]; i < p->list0[l + 1]; i++) {
            const wsync_chunk_t *ch = &p->chunks[p->lsegs[i].chunk];
            lsum[l].bytes += wsync_chunk_wire_bytes(ch);
            lsum[l].param_bytes += ch->src.rows * ch->src.cols * wsync_dtype_size(ch->dtype);
            lsum[l].nfp8 += ch->rule != 0;
        }
    for (uint32_t rc = 0; rc < p->nreceivers; rc++)
        for (uint32_t k = p->ref0[rc]; k < p->ref0[rc + 1]; k++) {
            const wsync_plan_ref_t *rf = &p->refs[k];
            size_t j = at[base[rc] + rf->target];
            run_t *r = &runs[j];
            s->target_bytes[j] += lsum[rf->list].bytes;
            s->target_param_bytes[j] += lsum[rf->list].param_bytes;
            nseg[j] += p->list0[rf->list + 1] - p->list0[rf->list];
            nfp8[j] += lsum[rf->list].nfp8;
            for (uint32_t i = p->list0[rf->list]; ruled[j] && i < p->list0[rf->list + 1]; i++) {
                const wsync_list_seg_t *l = &p->lsegs[i];
                const wsync_chunk_t *ch = &p->chunks[l->chunk];
                wsync_segment_t sg = {rc, rf->target, l->piece, l->chunk,
                                      {l->off, l->pitch, ch->src.rows, ch->src.cols}};
                if (cut[j])
                    break;
                if (run_continues(p, r, &sg)) {
                    r->chunk = sg.chunk;
                    r->rows += sg.dst.rows;
                    continue;
                }
                if (r->chunk != UINT32_MAX && !run_whole(r, &rules[j], &td[j], p->bucket_bytes))
                    cut[j] = 1;
                r->chunk = sg.chunk;
                r->piece = sg.piece;
                r->off = sg.dst.off;
                r->pitch = sg.dst.pitch;
                r->rows = sg.dst.rows;
                r->cols = sg.dst.cols;
            }
        }
    for (size_t j = 0; j < ntd; j++) {
        const wsync_target_desc_t *t = &td[j];
        wsync_wire_form_t f;

        if (ruled[j] && !cut[j] && runs[j].chunk != UINT32_MAX &&
            !run_whole(&runs[j], &rules[j], t, p->bucket_bytes))
            cut[j] = 1;
        if (!is_fp8(t->dtype) || t->quant == WSYNC_QUANT_NONE)
            f = WSYNC_WIRE_PLAIN;
        else if (nseg[j] > 0 && nfp8[j] == nseg[j])
            f = WSYNC_WIRE_FP8;
        else if (t->quant == WSYNC_QUANT_TENSOR)
            f = WSYNC_WIRE_PER_TENSOR;
        else if (!fp8_wire)
            f = WSYNC_WIRE_OFF;
        else if (!ruled[j])
            f = WSYNC_WIRE_UNCOVERED;
        else if (cut[j])
            f = WSYNC_WIRE_CUT_CELLS;
        else
            f = WSYNC_WIRE_SHARED;
        s->target_form[j] = (int32_t)f;
        s->form_bytes[f] += s->target_bytes[j];
        s->form_param_bytes[f] += s->target_param_bytes[j];
        s->total_param_bytes += s->target_param_bytes[j];
    }
    s->fp8_wire_bytes = s->form_bytes[WSYNC_WIRE_FP8];
out:
    free(at);
    free(base);
    free(nseg);
    free(nfp8);
    free(ruled);
    free(cut);
    free(rules);
    free(runs);
    free(lsum);
    return st;
}

/* Fill the summary's figures from a compiled plan. */
static wsync_status_t summarize(const wsync_plan_t *p, const wsync_target_desc_t *td, size_t ntd,
                                const wsync_target_t *targets, int fp8_wire,
                                wsync_plan_summary_t *s)
{
    size_t ns = p->nsenders, nr = p->nreceivers;

    for (size_t sn = 0; sn < ns; sn++)
        for (size_t r = 0; r < nr; r++) {
            uint64_t b = p->pair_bytes[sn * nr + r];
            s->bytes_per_receiver[r] += b;
            s->bytes_per_sender[sn] += b;
            s->total_bytes += b;
        }
    size_t k = 0;
    for (size_t sn = 0; sn < ns; sn++) {
        s->buckets_per_sender[sn] = p->nbuckets[sn];
        for (uint32_t b = 0; b < p->nbuckets[sn]; b++)
            s->staged_bytes_per_sender[sn] += p->bucket_used[k++];
        s->total_staged_bytes += s->staged_bytes_per_sender[sn];
    }
    /* what lands: every element of every piece, once (the compile refuses a piece its
     * segments do not cover exactly), at its target's element size; not summed over the
     * segments, tens of millions of records read again */
    for (size_t j = 0; j < ntd; j++) {
        uint64_t esz = wsync_dtype_size(td[j].dtype);
        for (uint32_t q = 0; q < td[j].npieces; q++) {
            const wsync_piece_desc_t *pc = &td[j].pieces[q];
            uint64_t v = 1;
            for (int d = 0; d < td[j].ndim; d++)
                v *= (uint64_t)pc->src.len[d];
            s->bytes_landed_per_receiver[td[j].receiver] += v * esz;
        }
        if (is_fp8(td[j].dtype) && td[j].quant != WSYNC_QUANT_NONE)
            s->bytes_landed_per_receiver[td[j].receiver] +=
                wsync_target_scale_count(&targets[j]) * sizeof(float);
    }
    for (size_t r = 0; r < nr; r++)
        s->total_landed_bytes += s->bytes_landed_per_receiver[r];
    s->nchunks = p->nchunks;
    s->nsegments = p->nsegments;
    s->fingerprint = p->fingerprint;
    s->fp8_wire = fp8_wire;
    return summarize_forms(p, td, ntd, fp8_wire, s);
}

/* WSYNC_PLAN_WIRE_CHECK=1: what every participant would do with the plan the coordinator sends:
 * encode it, decode it, check it is the same plan (the decoded plan encodes to the same bytes,
 * with the same fingerprint), and check every sender's and receiver's part against its own
 * descriptions (wsync_plan_check_sender / _receiver). Off by default: it costs a few times the
 * compile's memory traffic. Sets s->wire_checked and s->wire_check_seconds. */
static wsync_status_t wire_check(const wsync_plan_t *plan, const wsync_shard_desc_t *sd,
                                 size_t nsd, const wsync_target_desc_t *td, size_t ntd,
                                 wsync_plan_summary_t *s)
{
    const char *env = getenv("WSYNC_PLAN_WIRE_CHECK");
    wsync_wbuf_t a, b;
    wsync_plan_t *q = NULL;
    wsync_status_t st = WSYNC_OK;
    struct timespec t0, t1;

    if (env == NULL || strcmp(env, "1") != 0)
        return WSYNC_OK;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    wsync_wbuf_init(&a);
    wsync_wbuf_init(&b);
    wsync_plan_encode(plan, &a);
    if (a.err)
        st = wsync_err(WSYNC_ERR_NOMEM, "plan wire check: encoding");
    if (st == WSYNC_OK)
        st = wsync_plan_decode(a.data, a.len, &q);
    if (st == WSYNC_OK) {
        wsync_plan_encode(q, &b);
        if (b.err || b.len != a.len || memcmp(a.data, b.data, a.len) != 0 ||
            q->fingerprint != plan->fingerprint || q->nchunks != plan->nchunks ||
            q->nsegments != plan->nsegments || a.len != plan->wire_bytes)
            st = wsync_err(WSYNC_ERR_INTERNAL, "plan wire check: the decoded plan (%u chunks, "
                           "%u segments, %zu bytes) differs from the compiled one (%u, %u, %"
                           PRIu64 ")", q->nchunks, q->nsegments, b.len, plan->nchunks,
                           plan->nsegments, plan->wire_bytes);
    }
    for (uint32_t r = 0; st == WSYNC_OK && r < plan->nsenders; r++)
        st = wsync_plan_check_sender(q, r, sd, nsd);
    for (uint32_t r = 0; st == WSYNC_OK && r < plan->nreceivers; r++)
        st = wsync_plan_check_receiver(q, r, td, ntd);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    wsync_plan_free(q);
    wsync_wbuf_free(&a);
    wsync_wbuf_free(&b);
    if (st == WSYNC_OK) {
        s->wire_checked = 1;
        s->wire_check_seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec -
                                                                                   t0.tv_nsec);
    }
    return st;
}

wsync_status_t wsync_plan_summarize(const wsync_shard_t *shards, const int *shard_sender,
                                    size_t nshards, const wsync_target_t *targets,
                                    const int *target_receiver, size_t ntargets, int nsenders,
                                    int nreceivers, size_t bucket_bytes,
                                    wsync_plan_summary_t **summary)
{
    return wsync_plan_summarize_wire(shards, shard_sender, nshards, targets, target_receiver,
                                     ntargets, nsenders, nreceivers, bucket_bytes, 0, summary);
}

wsync_status_t wsync_plan_summarize_wire(const wsync_shard_t *shards, const int *shard_sender,
                                         size_t nshards, const wsync_target_t *targets,
                                         const int *target_receiver, size_t ntargets,
                                         int nsenders, int nreceivers, size_t bucket_bytes,
                                         int fp8_wire, wsync_plan_summary_t **summary)
{
    wsync_shard_desc_t *sd = NULL;
    wsync_target_desc_t *td = NULL;
    uint32_t *count = NULL;
    wsync_plan_t *plan = NULL;
    wsync_plan_summary_t *s = NULL;
    size_t nsd = 0, ntd = 0;
    wsync_status_t st;

    if (summary == NULL || (nshards > 0 && shards == NULL) || (ntargets > 0 && targets == NULL))
        return wsync_err(WSYNC_ERR_INVALID, "plan summary: NULL argument");
    if (fp8_wire != 0 && fp8_wire != 1)
        return wsync_err(WSYNC_ERR_INVALID, "plan summary: fp8_wire = %d, expected 0 or 1",
                         fp8_wire);
    if (nsenders < 1 || nreceivers < 1 || (uint64_t)nsenders > WSYNC_PLAN_MAX_RANKS ||
        (uint64_t)nreceivers > WSYNC_PLAN_MAX_RANKS ||
        (uint64_t)nsenders * (uint64_t)nreceivers > WSYNC_PLAN_MAX_PAIRS)
        return wsync_err(WSYNC_ERR_INVALID, "plan summary: %d senders and %d receivers (each "
                         "must be in [1, %u], their product at most %u)", nsenders, nreceivers,
                         WSYNC_PLAN_MAX_RANKS, WSYNC_PLAN_MAX_PAIRS);
    if (bucket_bytes == 0)
        bucket_bytes = DEFAULT_BUCKET_BYTES;
    for (size_t i = 0; shard_sender && i < nshards; i++)
        if (shard_sender[i] < 0 || shard_sender[i] >= nsenders)
            return wsync_err(WSYNC_ERR_INVALID, "plan summary: shard %zu (param '%s') belongs "
                             "to sender %d, not in [0, %d)", i,
                             shards[i].param.name ? shards[i].param.name : "(null)",
                             shard_sender[i], nsenders);
    for (size_t j = 0; target_receiver && j < ntargets; j++)
        if (target_receiver[j] < 0 || target_receiver[j] >= nreceivers)
            return wsync_err(WSYNC_ERR_INVALID, "plan summary: target %zu ('%s') belongs to "
                             "receiver %d, not in [0, %d)", j,
                             targets[j].name ? targets[j].name : "(null)", target_receiver[j],
                             nreceivers);

    sd = calloc(nshards ? nshards : 1, sizeof(*sd));
    td = calloc(ntargets ? ntargets : 1, sizeof(*td));
    count = calloc((size_t)(nsenders > nreceivers ? nsenders : nreceivers), sizeof(*count));
    if (sd == NULL || td == NULL || count == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan summary: %zu shards, %zu targets", nshards,
                       ntargets);
        goto out;
    }
    wsync_plan_prefault(sd, nshards * sizeof(*sd));
    wsync_plan_prefault(td, ntargets * sizeof(*td));
    for (size_t i = 0; i < nshards; i++, nsd++) {
        int rank = shard_sender ? shard_sender[i] : 0;
        if ((st = shard_view(&shards[i], (uint32_t)rank, count[rank]++, &sd[i])) != WSYNC_OK)
            goto out;
    }
    memset(count, 0, (size_t)(nsenders > nreceivers ? nsenders : nreceivers) * sizeof(*count));
    for (size_t j = 0; j < ntargets; j++, ntd++) {
        wsync_target_t t = targets[j];
        int rank = target_receiver ? target_receiver[j] : 0;
        if (t.data == NULL)
            t.data = &no_data;
        if ((st = wsync_target_desc_from(&t, (uint32_t)rank, count[rank]++, &td[j])) != WSYNC_OK)
            goto out;
    }
    st = wsync_plan_compile_opts(sd, nsd, td, ntd, (uint32_t)nsenders, (uint32_t)nreceivers,
                                 (uint64_t)bucket_bytes,
                                 &(wsync_plan_opts_t){.fp8_wire = fp8_wire,
                                                      .fp8_tensor = fp8_wire},
                                 &plan);
    if (st != WSYNC_OK)
        goto out;

    size_t ns = (size_t)nsenders, nr = (size_t)nreceivers;
    s = calloc(1, sizeof(*s));
    if (s == NULL || (s->pair_bytes = calloc(ns * nr, sizeof(uint64_t))) == NULL ||
        (s->bytes_per_receiver = calloc(nr, sizeof(uint64_t))) == NULL ||
        (s->bytes_landed_per_receiver = calloc(nr, sizeof(uint64_t))) == NULL ||
        (s->bytes_per_sender = calloc(ns, sizeof(uint64_t))) == NULL ||
        (s->staged_bytes_per_sender = calloc(ns, sizeof(uint64_t))) == NULL ||
        (s->buckets_per_sender = calloc(ns, sizeof(uint64_t))) == NULL ||
        (s->target_form = calloc(ntd + 1, sizeof(int32_t))) == NULL ||
        (s->target_bytes = calloc(ntd + 1, sizeof(uint64_t))) == NULL ||
        (s->target_param_bytes = calloc(ntd + 1, sizeof(uint64_t))) == NULL) {
        st = wsync_err(WSYNC_ERR_NOMEM, "plan summary: %d senders, %d receivers", nsenders,
                       nreceivers);
        goto out;
    }
    s->nsenders = nsenders;
    s->nreceivers = nreceivers;
    s->ntargets = ntd;
    s->bucket_bytes = bucket_bytes;
    memcpy(s->pair_bytes, plan->pair_bytes, ns * nr * sizeof(uint64_t));
    s->wire_bytes = wsync_plan_wire_bytes(plan);
    if ((st = summarize(plan, td, ntd, targets, fp8_wire, s)) != WSYNC_OK ||
        (st = wire_check(plan, sd, nsd, td, ntd, s)) != WSYNC_OK)
        goto out;
    *summary = s;
    s = NULL;
out:
    wsync_plan_summary_free(s);
    wsync_plan_free(plan);
    descs_clear(sd, td, ntd);
    free(count);
    return st;
}
