/* The nccl scheme's schedule (schemes/nccl.h), from the plan alone: which ops each step issues
 * (broadcasts to replica sets, sub-communicator splits, point-to-point pairs), direct or staged.
 * Apart from schemes/nccl.c because it needs neither NCCL nor a GPU (tests/unit/test_nccl_sched). */
#include <stdlib.h>
#include <string.h>

#include "core/proto.h"
#include "core/status.h"
#include "core/util.h"
#include "schemes/nccl.h"

/* Bytes of a chunk in an op's buffer and on the wire: FP8 codes and scales for a chunk that
 * travels quantized (FP8 on the wire), its values otherwise. */
static uint64_t chunk_bytes(const wsync_chunk_t *c)
{
    return wsync_chunk_wire_bytes(c);
}

/* What the build works from beside the schedule, freed when it ends. */
typedef struct {
    const wsync_plan_t *plan;
    uint32_t *rstart, *rlist;  /* distinct receivers of chunk c: rlist[rstart[c]..[c+1]) */
    uint32_t *chunk_group;     /* [nchunks] chunk c's broadcast group, UINT32_MAX for none */
    /* sender r's bucket k: chunks [cstart[sbase[r] + k], cstart[sbase[r] + k + 1]) */
    uint32_t *sbase, *cstart;
} sched_ctx_t;

static int cmp_chunk_sets(const void *a, const void *b, void *arg)
{
    const sched_ctx_t *x = arg;
    uint32_t ca = *(const uint32_t *)a, cb = *(const uint32_t *)b;
    uint32_t sa = x->plan->chunks[ca].sender, sb = x->plan->chunks[cb].sender;
    uint32_t na = x->rstart[ca + 1] - x->rstart[ca], nb = x->rstart[cb + 1] - x->rstart[cb];

    if (sa != sb)
        return sa < sb ? -1 : 1;
    if (na != nb)
        return na < nb ? -1 : 1;
    for (uint32_t i = 0; i < na; i++) {
        uint32_t ra = x->rlist[x->rstart[ca] + i], rb = x->rlist[x->rstart[cb] + i];
        if (ra != rb)
            return ra < rb ? -1 : 1;
    }
    return ca < cb ? -1 : ca > cb;
}

static int same_set(const sched_ctx_t *x, uint32_t ca, uint32_t cb)
{
    uint32_t na = x->rstart[ca + 1] - x->rstart[ca], nb = x->rstart[cb + 1] - x->rstart[cb];
    return x->plan->chunks[ca].sender == x->plan->chunks[cb].sender && na == nb &&
           memcmp(x->rlist + x->rstart[ca], x->rlist + x->rstart[cb], na * sizeof(uint32_t)) == 0;
}

typedef struct {
    const wsync_nccl_group_t *groups;
} split_ctx_t;

/* candidates for a sub-communicator: most bytes first, then group order */
static int cmp_split(const void *a, const void *b, void *arg)
{
    const split_ctx_t *x = arg;
    uint32_t ga = *(const uint32_t *)a, gb = *(const uint32_t *)b;
    uint64_t ba = x->groups[ga].bytes, bb = x->groups[gb].bytes;
    if (ba != bb)
        return ba > bb ? -1 : 1;
    return ga < gb ? -1 : ga > gb;
}

typedef struct {
    uint32_t receiver, chunk;
} pair_t;

static int cmp_pair(const void *a, const void *b)
{
    const pair_t *x = a, *y = b;
    if (x->receiver != y->receiver)
        return x->receiver < y->receiver ? -1 : 1;
    return x->chunk < y->chunk ? -1 : x->chunk > y->chunk;
}

typedef struct {
    wsync_nccl_sched_t *s;
    uint32_t ops_cap, items_cap;
    int err;
} builder_t;

/* Append one op carrying chunks[0..n) (packed: at aligned offsets in one buffer). */
static void emit(builder_t *b, const wsync_plan_t *plan, uint8_t kind, int packed, uint32_t sender,
                 uint32_t receiver, uint32_t group, const uint32_t *chunks, uint32_t n)
{
    wsync_nccl_sched_t *s = b->s;
    uint64_t off = 0;

    if (b->err || n == 0)
        return;
    if (s->nops == b->ops_cap) {
        uint32_t cap = b->ops_cap ? b->ops_cap * 2 : 64;
        wsync_nccl_op_t *p = realloc(s->ops, cap * sizeof(*p));
        if (p == NULL) {
            b->err = 1;
            return;
        }
        s->ops = p;
        b->ops_cap = cap;
    }
    while (s->nitems + n > b->items_cap) {
        uint32_t cap = b->items_cap ? b->items_cap * 2 : 256;
        wsync_nccl_item_t *p = realloc(s->items, cap * sizeof(*p));
        if (p == NULL) {
            b->err = 1;
            return;
        }
        s->items = p;
        b->items_cap = cap;
    }
    wsync_nccl_op_t *op = &s->ops[s->nops++];
    op->kind = kind;
    op->packed = (uint8_t)packed;
    op->sender = sender;
    op->receiver = receiver;
    op->group = group;
    op->item0 = s->nitems;
    op->nitems = n;
    for (uint32_t i = 0; i < n; i++) {
        off = wsync_align_up(off, WSYNC_PLAN_ALIGN);
        s->items[s->nitems].chunk = chunks[i];
        s->items[s->nitems].off = off;
        s->nitems++;
        off += chunk_bytes(&plan->chunks[chunks[i]]);
    }
    op->bytes = off;
    if (kind == WSYNC_NCCL_OP_BCAST)
        s->bytes_bcast += off;
    else
        s->bytes_p2p += off;
}

/* One op per large chunk, then the small ones packed into one. */
static void emit_list(builder_t *b, const wsync_plan_t *plan, uint64_t direct_min, uint8_t kind,
                      uint32_t sender, uint32_t receiver, uint32_t group, const uint32_t *chunks,
                      uint32_t n, uint32_t *small)
{
    uint32_t nsmall = 0;

    for (uint32_t i = 0; i < n; i++) {
        if (chunk_bytes(&plan->chunks[chunks[i]]) >= direct_min)
            emit(b, plan, kind, 0, sender, receiver, group, &chunks[i], 1);
        else
            small[nsmall++] = chunks[i];
    }
    emit(b, plan, kind, 1, sender, receiver, group, small, nsmall);
}

void wsync_nccl_sched_free(wsync_nccl_sched_t *s)
{
    if (s == NULL)
        return;
    for (uint32_t g = 0; s->groups != NULL && g < s->ngroups; g++)
        free(s->groups[g].recv);
    free(s->groups);
    free(s->step_op);
    free(s->ops);
    free(s->items);
    free(s);
}

/* Each chunk's distinct receivers into x->rstart, x->rlist: receivers are visited in rank order,
 * so each chunk's receivers come out ascending. 0, or -1 out of memory. */
static int chunk_receivers(sched_ctx_t *x)
{
    const wsync_plan_t *plan = x->plan;
    const uint32_t nc = plan->nchunks;
    uint32_t *rch = NULL, *fill = NULL;   /* one receiver's chunks; each chunk's fill cursor */
    size_t rch_cap = 0;
    int rc = -1;

    x->rstart = calloc((size_t)nc + 1, sizeof(uint32_t));
    if (x->rstart == NULL)
        return -1;
    for (uint32_t r = 0; r < plan->nreceivers; r++) {
        uint32_t m;
        if (wsync_plan_rx_chunks(plan, r, 0, nc, &rch, &rch_cap, &m) != WSYNC_OK)
            goto out;
        for (uint32_t k = 0; k < m; k++)
            x->rstart[rch[k] + 1]++;
    }
    for (uint32_t c = 0; c < nc; c++)
        x->rstart[c + 1] += x->rstart[c];
    x->rlist = malloc(((size_t)x->rstart[nc] + 1) * sizeof(uint32_t));
    fill = calloc((size_t)nc + 1, sizeof(uint32_t));
    if (x->rlist == NULL || fill == NULL)
        goto out;
    for (uint32_t r = 0; r < plan->nreceivers; r++) {
        uint32_t m;
        if (wsync_plan_rx_chunks(plan, r, 0, nc, &rch, &rch_cap, &m) != WSYNC_OK)
            goto out;
        for (uint32_t k = 0; k < m; k++)
            x->rlist[x->rstart[rch[k]] + fill[rch[k]]++] = r;
    }
    rc = 0;
out:
    free(rch);
    free(fill);
    return rc;
}

/* The broadcast groups: receiver sets shared by several receivers, one group per (sender, set),
 * into s->groups, and x->chunk_group. 0, or -1 out of memory. */
static int find_groups(sched_ctx_t *x, wsync_nccl_sched_t *s)
{
    const wsync_plan_t *plan = x->plan;
    const uint32_t nc = plan->nchunks;
    uint32_t nmulti = 0;
    uint32_t *multi = malloc(((size_t)nc + 1) * sizeof(uint32_t));
    int rc = -1;

    x->chunk_group = malloc(((size_t)nc + 1) * sizeof(uint32_t));
    if (multi == NULL || x->chunk_group == NULL)
        goto out;
    for (uint32_t c = 0; c < nc; c++) {
        x->chunk_group[c] = UINT32_MAX;
        if (x->rstart[c + 1] - x->rstart[c] >= 2)
            multi[nmulti++] = c;
    }
    qsort_r(multi, nmulti, sizeof(uint32_t), cmp_chunk_sets, x);
    for (uint32_t i = 0; i < nmulti; i++) {
        uint32_t c = multi[i];
        if (i == 0 || !same_set(x, multi[i - 1], c)) {
            wsync_nccl_group_t *ng = realloc(s->groups, (s->ngroups + 1) * sizeof(*ng));
            if (ng == NULL)
                goto out;
            s->groups = ng;
            wsync_nccl_group_t *g = &s->groups[s->ngroups++];
            memset(g, 0, sizeof(*g));
            g->sender = plan->chunks[c].sender;
            g->nrecv = x->rstart[c + 1] - x->rstart[c];
            g->split = -1;
            g->recv = malloc(g->nrecv * sizeof(uint32_t));
            if (g->recv == NULL)
                goto out;
            memcpy(g->recv, x->rlist + x->rstart[c], g->nrecv * sizeof(uint32_t));
            g->whole = plan->nsenders == 1 && g->nrecv == plan->nreceivers;
            g->used = g->whole;
        }
        x->chunk_group[c] = s->ngroups - 1;
        s->groups[s->ngroups - 1].bytes += chunk_bytes(&plan->chunks[c]);
    }
    rc = 0;
out:
    free(multi);
    return rc;
}

/* Sub-communicators for the max_splits groups carrying the most bytes (a group of every
 * receiver of a lone sender needs none), numbered in group order. 0, or -1 out of memory. */
static int pick_splits(wsync_nccl_sched_t *s, uint32_t max_splits)
{
    uint32_t ncand = 0;
    uint32_t *cand = malloc(((size_t)s->ngroups + 1) * sizeof(uint32_t));
    split_ctx_t sx = {s->groups};

    if (cand == NULL)
        return -1;
    for (uint32_t g = 0; g < s->ngroups; g++)
        if (!s->groups[g].whole)
            cand[ncand++] = g;
    qsort_r(cand, ncand, sizeof(uint32_t), cmp_split, &sx);
    for (uint32_t i = 0; i < ncand && i < max_splits; i++)
        s->groups[cand[i]].used = 1;
    for (uint32_t g = 0; g < s->ngroups; g++)
        if (s->groups[g].used && !s->groups[g].whole)
            s->groups[g].split = (int)s->nsplits++;
    free(cand);
    return 0;
}

/* The chunk range of each sender's buckets into x->sbase, x->cstart (wsync_plan_bucket_chunks,
 * nbuckets + 1 entries a sender), and s->nsteps: the most buckets of any sender. 0, or -1. */
static int bucket_ranges(sched_ctx_t *x, wsync_nccl_sched_t *s)
{
    const wsync_plan_t *plan = x->plan;

    x->sbase = calloc((size_t)plan->nsenders + 1, sizeof(uint32_t));
    if (x->sbase == NULL)
        return -1;
    for (uint32_t r = 0; r < plan->nsenders; r++) {
        x->sbase[r + 1] = x->sbase[r] + plan->nbuckets[r] + 1;
        s->nsteps = WSYNC_MAX(s->nsteps, plan->nbuckets[r]);
    }
    x->cstart = calloc((size_t)x->sbase[plan->nsenders] + 1, sizeof(uint32_t));
    if (x->cstart == NULL)
        return -1;
    for (uint32_t r = 0; r < plan->nsenders; r++)
        wsync_plan_bucket_chunks(plan, r, x->cstart + x->sbase[r]);
    return 0;
}

/* The ops of every step, into b: step k is bucket k of each sender that has one; first the
 * broadcasts of the groups in use, by group, then the rest as sends, by (sender, receiver).
 * 0, or -1 out of memory. */
static int emit_steps(const sched_ctx_t *x, builder_t *b, uint64_t direct_min)
{
    const wsync_plan_t *plan = x->plan;
    const uint32_t nc = plan->nchunks;
    wsync_nccl_sched_t *s = b->s;
    uint32_t *list = malloc(((size_t)nc + 1) * sizeof(uint32_t));
    uint32_t *small = malloc(((size_t)nc + 1) * sizeof(uint32_t));
    pair_t *pairs = malloc(((size_t)x->rstart[nc] + 1) * sizeof(pair_t));
    int rc = -1;

    s->step_op = calloc((size_t)s->nsteps + 1, sizeof(uint32_t));
    if (list == NULL || small == NULL || pairs == NULL || s->step_op == NULL)
        goto out;
    for (uint32_t k = 0; k < s->nsteps; k++) {
        s->step_op[k] = s->nops;
        /* broadcasts, by group */
        for (uint32_t g = 0; g < s->ngroups; g++) {
            const wsync_nccl_group_t *gr = &s->groups[g];
            uint32_t n = 0, r = gr->sender;
            if (!gr->used || k >= plan->nbuckets[r])
                continue;
            for (uint32_t c = x->cstart[x->sbase[r] + k]; c < x->cstart[x->sbase[r] + k + 1]; c++)
                if (x->chunk_group[c] == g)
                    list[n++] = c;
            emit_list(b, plan, direct_min, WSYNC_NCCL_OP_BCAST, r, UINT32_MAX, g, list, n, small);
        }
        /* sends, by (sender, receiver) */
        for (uint32_t r = 0; r < plan->nsenders; r++) {
            uint32_t np = 0;
            if (k >= plan->nbuckets[r])
                continue;
            for (uint32_t c = x->cstart[x->sbase[r] + k]; c < x->cstart[x->sbase[r] + k + 1]; c++) {
                if (x->chunk_group[c] != UINT32_MAX && s->groups[x->chunk_group[c]].used)
                    continue;
                for (uint32_t i = x->rstart[c]; i < x->rstart[c + 1]; i++)
                    pairs[np++] = (pair_t){x->rlist[i], c};
            }
            qsort(pairs, np, sizeof(pair_t), cmp_pair);
            for (uint32_t i = 0; i < np;) {
                uint32_t j = i, n = 0;
                while (j < np && pairs[j].receiver == pairs[i].receiver)
                    list[n++] = pairs[j++].chunk;
                emit_list(b, plan, direct_min, WSYNC_NCCL_OP_P2P, r, pairs[i].receiver,
                          UINT32_MAX, list, n, small);
                i = j;
            }
        }
    }
    s->step_op[s->nsteps] = s->nops;
    rc = b->err ? -1 : 0;
out:
    free(list);
    free(small);
    free(pairs);
    return rc;
}

wsync_status_t wsync_nccl_sched_build(const wsync_plan_t *plan, uint64_t direct_min,
                                      uint32_t max_splits, wsync_nccl_sched_t **out)
{
    wsync_nccl_sched_t *s = calloc(1, sizeof(*s));
    sched_ctx_t x = {.plan = plan};
    builder_t b = {s, 0, 0, 0};
    wsync_status_t st = WSYNC_OK;

    if (s == NULL || chunk_receivers(&x) != 0 || find_groups(&x, s) != 0 ||
        pick_splits(s, max_splits) != 0 || bucket_ranges(&x, s) != 0 ||
        emit_steps(&x, &b, direct_min) != 0) {
        st = wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for the schedule (%u chunks)",
                       plan->nchunks);
        wsync_nccl_sched_free(s);
    } else {
        *out = s;
    }
    free(x.rstart);
    free(x.rlist);
    free(x.chunk_group);
    free(x.sbase);
    free(x.cstart);
    return st;
}

int wsync_nccl_op_has(const wsync_nccl_sched_t *s, const wsync_nccl_op_t *op, int role,
                      uint32_t rank)
{
    if (role == WSYNC_ROLE_SENDER)
        return op->sender == rank;
    if (op->kind == WSYNC_NCCL_OP_P2P)
        return op->receiver == rank;
    const wsync_nccl_group_t *g = &s->groups[op->group];
    for (uint32_t i = 0; i < g->nrecv; i++)
        if (g->recv[i] == rank)
            return 1;
    return 0;
}
