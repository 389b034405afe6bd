/* The nccl scheme's schedule (schemes/nccl.h), from real compiled plans: every byte a receiver
 * needs is carried to it exactly once per version (by a broadcast to a set holding it, or a send to
 * it), in the step of its bucket; replicas share broadcasts, bounded by the number of
 * sub-communicators; large chunks are ops of their own, small ones packed at aligned offsets;
 * the order within a step is the documented one. Also the scheme's score (negotiation). */
#include "core/registry.h"
#include "core/status.h"
#include "reshard/plan.h"
#include "schemes/nccl.h"
#include "tests/support/check.h"
#include "wsync/wsync_layout.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BF16 WSYNC_DTYPE_BF16
#define F32 WSYNC_DTYPE_F32

static char dummy[16];

typedef struct {
    wsync_shard_desc_t shards[64];
    size_t nshards;
    wsync_target_desc_t targets[64];
    size_t ntargets;
} group_t;

static void add_shard(group_t *g, uint32_t sender, const char *name, wsync_dtype_t dt, int64_t r,
                      int64_t c, int64_t r0, int64_t nr, int64_t c0, int64_t nc)
{
    wsync_shard_t s = {{name, dt, 2, {r, c}}, {{r0, c0}, {nr, nc}}, dummy, WSYNC_MEM_CUDA, 0};
    uint32_t index = 0;
    for (size_t i = 0; i < g->nshards; i++)
        index += g->shards[i].sender == sender;
    CHECK_OK(wsync_shard_desc_from(&s, sender, index, &g->shards[g->nshards++]));
}

/* A target holding box [r0, r0 + nr) x [c0, c0 + nc) of param `name`, whole. */
static void add_target(group_t *g, uint32_t receiver, const char *tname, const char *name,
                       wsync_dtype_t pdt, wsync_dtype_t tdt, int64_t r, int64_t c, int64_t r0,
                       int64_t nr, int64_t c0, int64_t nc)
{
    wsync_piece_t pc = {{name, pdt, 2, {r, c}}, {{r0, c0}, {nr, nc}}, {0, 0}};
    wsync_target_t t = {tname, tdt, 2, {nr, nc}, dummy, WSYNC_MEM_CUDA, 0, &pc, 1, {0}};
    uint32_t index = 0;
    for (size_t i = 0; i < g->ntargets; i++)
        index += g->targets[i].receiver == receiver;
    CHECK_OK(wsync_target_desc_from(&t, receiver, index, &g->targets[g->ntargets++]));
}

static void group_free(group_t *g)
{
    for (size_t i = 0; i < g->nshards; i++)
        wsync_shard_desc_clear(&g->shards[i]);
    for (size_t i = 0; i < g->ntargets; i++)
        wsync_target_desc_clear(&g->targets[i]);
}

static uint64_t cbytes(const wsync_plan_t *p, uint32_t c)
{
    const wsync_chunk_t *ch = &p->chunks[c];
    return ch->src.rows * ch->src.cols * wsync_dtype_size(ch->dtype);
}

static int in_group(const wsync_nccl_group_t *g, uint32_t r)
{
    for (uint32_t i = 0; i < g->nrecv; i++)
        if (g->recv[i] == r)
            return 1;
    return 0;
}

/* The invariants every schedule must keep. */
static void check_sched(const wsync_plan_t *p, const wsync_nccl_sched_t *s, uint64_t direct_min,
                        uint32_t max_splits)
{
    uint32_t *carried = calloc((size_t)p->nchunks * p->nreceivers + 1, sizeof(uint32_t));
    uint32_t maxb = 0, nsplits = 0;

    for (uint32_t i = 0; i < p->nsenders; i++)
        maxb = maxb > p->nbuckets[i] ? maxb : p->nbuckets[i];
    CHECK(s->nsteps == maxb);
    CHECK(s->step_op[0] == 0 && s->step_op[s->nsteps] == s->nops);
    for (uint32_t g = 0; g < s->ngroups; g++) {
        CHECK(s->groups[g].nrecv >= 2);
        if (s->groups[g].split >= 0) {
            CHECK(s->groups[g].used && !s->groups[g].whole);
            nsplits++;
        }
        CHECK(!s->groups[g].whole || (p->nsenders == 1 && s->groups[g].nrecv == p->nreceivers));
    }
    CHECK(nsplits == s->nsplits && nsplits <= max_splits);
    for (uint32_t k = 0; k < s->nsteps; k++) {
        int seen_p2p = 0;
        uint32_t last_s = 0, last_r = 0;
        for (uint32_t i = s->step_op[k]; i < s->step_op[k + 1]; i++) {
            const wsync_nccl_op_t *op = &s->ops[i];
            uint64_t end = 0;
            CHECK(op->nitems >= 1);
            CHECK(op->packed || op->nitems == 1);
            if (op->kind == WSYNC_NCCL_OP_P2P) {
                /* sends come after every broadcast, by (sender, receiver) */
                CHECK(!seen_p2p || op->sender > last_s ||
                      (op->sender == last_s && op->receiver >= last_r));
                seen_p2p = 1;
                last_s = op->sender;
                last_r = op->receiver;
            } else {
                CHECK(!seen_p2p);
                CHECK(op->group < s->ngroups && s->groups[op->group].used);
                CHECK(s->groups[op->group].sender == op->sender);
            }
            for (uint32_t j = 0; j < op->nitems; j++) {
                const wsync_nccl_item_t *it = &s->items[op->item0 + j];
                const wsync_chunk_t *c = &p->chunks[it->chunk];
                CHECK(c->sender == op->sender && c->bucket == k);
                CHECK(it->off % WSYNC_PLAN_ALIGN == 0 && it->off >= end);
                end = it->off + cbytes(p, it->chunk);
                /* large chunks alone, small ones packed */
                CHECK((cbytes(p, it->chunk) >= direct_min) == !op->packed);
                for (uint32_t r = 0; r < p->nreceivers; r++)
                    if (op->kind == WSYNC_NCCL_OP_P2P ? op->receiver == r
                                                      : in_group(&s->groups[op->group], r))
                        carried[(size_t)it->chunk * p->nreceivers + r]++;
            }
            CHECK(op->bytes == end);
        }
    }
    /* exactly the (chunk, receiver) pairs the segments need, each once */
    wsync_segment_t *S = NULL;
    CHECK_OK(wsync_plan_flatten(p, &S));
    for (uint32_t c = 0; S != NULL && c < p->nchunks; c++)
        for (uint32_t r = 0; r < p->nreceivers; r++) {
            int needed = 0;
            for (uint32_t i = 0; i < p->nsegments; i++)
                needed |= S[i].chunk == c && S[i].receiver == r;
            CHECK_MSG(carried[(size_t)c * p->nreceivers + r] == (uint32_t)needed,
                      "chunk %u receiver %u carried %u times, needed %d", c, r,
                      carried[(size_t)c * p->nreceivers + r], needed);
        }
    free(S);
    free(carried);
}

static wsync_plan_t *compile(group_t *g, uint32_t ns, uint32_t nr, uint64_t bucket)
{
    wsync_plan_t *p = NULL;
    CHECK_OK(wsync_plan_compile(g->shards, g->nshards, g->targets, g->ntargets, ns, nr, bucket, &p));
    return p;
}

/* 1 sender, 3 replicas of the whole model: everything by broadcast on the whole communicator. */
static void test_fanout(void)
{
    group_t g = {0};
    wsync_plan_t *p;
    wsync_nccl_sched_t *s = NULL;

    add_shard(&g, 0, "big", BF16, 1024, 1024, 0, 1024, 0, 1024);   /* 2 MiB */
    add_shard(&g, 0, "norm", F32, 1, 4096, 0, 1, 0, 4096);         /* 16 KiB */
    for (uint32_t r = 0; r < 3; r++) {
        add_target(&g, r, "big", "big", BF16, BF16, 1024, 1024, 0, 1024, 0, 1024);
        add_target(&g, r, "norm", "norm", F32, F32, 1, 4096, 0, 1, 0, 4096);
    }
    p = compile(&g, 1, 3, 1u << 20);
    CHECK_OK(wsync_nccl_sched_build(p, WSYNC_NCCL_DIRECT_MIN, WSYNC_NCCL_MAX_SPLITS, &s));
    check_sched(p, s, WSYNC_NCCL_DIRECT_MIN, WSYNC_NCCL_MAX_SPLITS);
    CHECK(s->ngroups == 1 && s->groups[0].whole && s->groups[0].used && s->nsplits == 0);
    CHECK(s->bytes_p2p == 0);
    /* the bytes go out once, not once per replica */
    CHECK(s->bytes_bcast >= (2u << 20) + 16384 && s->bytes_bcast < (2u << 20) + 16384 + 4096);
    for (uint32_t i = 0; i < s->nops; i++)
        CHECK(s->ops[i].kind == WSYNC_NCCL_OP_BCAST);
    CHECK(wsync_nccl_op_has(s, &s->ops[0], 2, 2) && wsync_nccl_op_has(s, &s->ops[0], 1, 0));
    wsync_nccl_sched_free(s);
    wsync_plan_free(p);
    group_free(&g);
}

/* FSDP-2 (rows) to TP-2 (rows: column-parallel) and TP-2 (columns: row-parallel), no replicas:
 * sends only; row slices are contiguous on both sides, column slices not in the shard (the
 * sender packs them). */
static void test_fsdp_to_tp(void)
{
    group_t g = {0};
    wsync_plan_t *p;
    wsync_nccl_sched_t *s = NULL;

    for (uint32_t i = 0; i < 2; i++) {
        add_shard(&g, i, "colpar", BF16, 2048, 512, i * 1024, 1024, 0, 512);
        add_shard(&g, i, "rowpar", BF16, 2048, 512, i * 1024, 1024, 0, 512);
    }
    for (uint32_t r = 0; r < 2; r++) {
        add_target(&g, r, "colpar", "colpar", BF16, BF16, 2048, 512, r * 1024, 1024, 0, 512);
        add_target(&g, r, "rowpar", "rowpar", BF16, F32, 2048, 512, 0, 2048, r * 256, 256);
    }
    p = compile(&g, 2, 2, 1u << 20);
    CHECK_OK(wsync_nccl_sched_build(p, WSYNC_NCCL_DIRECT_MIN, WSYNC_NCCL_MAX_SPLITS, &s));
    check_sched(p, s, WSYNC_NCCL_DIRECT_MIN, WSYNC_NCCL_MAX_SPLITS);
    CHECK(s->ngroups == 0 && s->bytes_bcast == 0);
    CHECK(s->bytes_p2p >= 2u * 2048 * 512 * 2);
    int contiguous_both = 0, strided_src = 0;
    wsync_segment_t *S = NULL;
    CHECK_OK(wsync_plan_flatten(p, &S));
    for (uint32_t i = 0; S != NULL && i < p->nsegments; i++) {
        const wsync_chunk_t *c = &p->chunks[S[i].chunk];
        int src = wsync_nccl_region_contiguous(&c->src);
        int dst = wsync_nccl_region_contiguous(&S[i].dst);
        contiguous_both += src && dst;
        strided_src += !src;
    }
    free(S);
    CHECK(contiguous_both > 0);   /* colpar: straight from shard to target */
    CHECK(strided_src > 0);       /* rowpar: the sender packs, the receiver casts */
    wsync_nccl_sched_free(s);
    wsync_plan_free(p);
    group_free(&g);
}

/* FSDP-2 to TP-2 x 2 replicas: each chunk is needed by the two replicas of one TP rank, so
 * broadcast sets of one sender and two receivers, on sub-communicators; with one allowed, the
 * other sets go by sends to each receiver. */
static void test_replicas_and_split_bound(void)
{
    group_t g = {0};
    wsync_plan_t *p;
    wsync_nccl_sched_t *s = NULL;

    for (uint32_t i = 0; i < 2; i++)
        add_shard(&g, i, "w", BF16, 2048, 1024, i * 1024, 1024, 0, 1024);
    for (uint32_t r = 0; r < 4; r++) {
        uint32_t tp = r % 2;
        add_target(&g, r, "w", "w", BF16, BF16, 2048, 1024, tp * 1024, 1024, 0, 1024);
    }
    p = compile(&g, 2, 4, 1u << 20);
    CHECK_OK(wsync_nccl_sched_build(p, WSYNC_NCCL_DIRECT_MIN, WSYNC_NCCL_MAX_SPLITS, &s));
    check_sched(p, s, WSYNC_NCCL_DIRECT_MIN, WSYNC_NCCL_MAX_SPLITS);
    CHECK(s->ngroups >= 2);
    for (uint32_t i = 0; i < s->ngroups; i++)
        CHECK(s->groups[i].nrecv == 2 && s->groups[i].used && !s->groups[i].whole &&
              s->groups[i].recv[1] == s->groups[i].recv[0] + 2);
    CHECK(s->bytes_p2p == 0 && s->nsplits == s->ngroups);
    uint64_t bcast_all = s->bytes_bcast;
    wsync_nccl_sched_free(s);

    s = NULL;
    CHECK_OK(wsync_nccl_sched_build(p, WSYNC_NCCL_DIRECT_MIN, 1, &s));
    check_sched(p, s, WSYNC_NCCL_DIRECT_MIN, 1);
    CHECK(s->nsplits == 1);
    CHECK(s->bytes_p2p > 0 && s->bytes_bcast > 0 && s->bytes_bcast < bcast_all);
    /* the set kept carries at least as many bytes as any other */
    for (uint32_t i = 0; i < s->ngroups; i++)
        for (uint32_t j = 0; j < s->ngroups; j++)
            if (s->groups[i].used && !s->groups[j].used)
                CHECK(s->groups[i].bytes >= s->groups[j].bytes);
    wsync_nccl_sched_free(s);

    /* no sub-communicator at all: every byte by sends */
    s = NULL;
    CHECK_OK(wsync_nccl_sched_build(p, WSYNC_NCCL_DIRECT_MIN, 0, &s));
    check_sched(p, s, WSYNC_NCCL_DIRECT_MIN, 0);
    CHECK(s->bytes_bcast == 0 && s->nsplits == 0);
    wsync_nccl_sched_free(s);
    wsync_plan_free(p);
    group_free(&g);
}

/* Small chunks from many params: packed into one op per (sender, receiver) and step. */
static void test_packing(void)
{
    group_t g = {0};
    wsync_plan_t *p;
    wsync_nccl_sched_t *s = NULL;
    char names[8][16];

    for (int i = 0; i < 8; i++) {
        snprintf(names[i], sizeof(names[i]), "n%d", i);
        add_shard(&g, 0, names[i], BF16, 2, 1000 + i, 0, 2, 0, 1000 + i);
        add_target(&g, 0, names[i], names[i], BF16, BF16, 2, 1000 + i, 0, 1, 0, 1000 + i);
        add_target(&g, 1, names[i], names[i], BF16, BF16, 2, 1000 + i, 1, 1, 0, 1000 + i);
    }
    p = compile(&g, 1, 2, 1u << 20);
    CHECK_OK(wsync_nccl_sched_build(p, WSYNC_NCCL_DIRECT_MIN, WSYNC_NCCL_MAX_SPLITS, &s));
    check_sched(p, s, WSYNC_NCCL_DIRECT_MIN, WSYNC_NCCL_MAX_SPLITS);
    CHECK(s->nsteps == 1 && s->nops == 2);
    CHECK(s->ops[0].packed && s->ops[0].nitems == 8 && s->ops[0].receiver == 0);
    CHECK(s->ops[1].packed && s->ops[1].nitems == 8 && s->ops[1].receiver == 1);
    /* with everything "large", one op per chunk */
    wsync_nccl_sched_free(s);
    s = NULL;
    CHECK_OK(wsync_nccl_sched_build(p, 1, WSYNC_NCCL_MAX_SPLITS, &s));
    check_sched(p, s, 1, WSYNC_NCCL_MAX_SPLITS);
    CHECK(s->nops == 16);
    wsync_nccl_sched_free(s);
    wsync_plan_free(p);
    group_free(&g);
}

/* Several buckets: steps follow buckets, a sender with fewer buckets sits out the last steps. */
static void test_steps(void)
{
    group_t g = {0};
    wsync_plan_t *p;
    wsync_nccl_sched_t *s = NULL;

    add_shard(&g, 0, "a", BF16, 4096, 1024, 0, 4096, 0, 1024);   /* 8 MiB at sender 0 */
    add_shard(&g, 1, "b", BF16, 512, 1024, 0, 512, 0, 1024);     /* 1 MiB at sender 1 */
    add_target(&g, 0, "a", "a", BF16, BF16, 4096, 1024, 0, 4096, 0, 1024);
    add_target(&g, 0, "b", "b", BF16, BF16, 512, 1024, 0, 512, 0, 1024);
    p = compile(&g, 2, 1, 2u << 20);
    CHECK_OK(wsync_nccl_sched_build(p, WSYNC_NCCL_DIRECT_MIN, WSYNC_NCCL_MAX_SPLITS, &s));
    check_sched(p, s, WSYNC_NCCL_DIRECT_MIN, WSYNC_NCCL_MAX_SPLITS);
    CHECK(p->nbuckets[0] >= 4 && p->nbuckets[1] >= 1 && s->nsteps == p->nbuckets[0]);
    for (uint32_t k = p->nbuckets[1]; k < s->nsteps; k++)
        for (uint32_t i = s->step_op[k]; i < s->step_op[k + 1]; i++)
            CHECK(s->ops[i].sender == 0);
    wsync_nccl_sched_free(s);
    wsync_plan_free(p);
    group_free(&g);
}


/* The layouts the bench and the demo use, for many group shapes: FSDP-S senders to TP-T x
 * replicas receivers of a Qwen3-like model; every schedule keeps the invariants, and the plan
 * keeps the orders the scheme relies on (segments by (receiver, chunk), chunks by (sender,
 * bucket)). Run under the sanitizers, this catches any out-of-bounds write of the builder. */
static void model_group(const wsync_model_config_t *cfg, uint32_t ns, uint32_t tp, uint32_t reps,
                        uint64_t bucket)
{
    wsync_shard_desc_t *sd = NULL;
    wsync_target_desc_t *td = NULL;
    size_t nsd = 0, ntd = 0;
    wsync_tp_options_t opt = WSYNC_TP_OPTIONS_INIT;
    uint32_t nr = tp * reps;
    wsync_plan_t *p = NULL;
    wsync_nccl_sched_t *s = NULL;

    opt.param_dtype = BF16;
    for (uint32_t i = 0; i < ns; i++) {
        wsync_shard_t *sh = NULL;
        size_t n = 0;
        CHECK_OK(wsync_layout_fsdp_shards(cfg, BF16, (int)i, (int)ns, &sh, &n));
        sd = realloc(sd, (nsd + n) * sizeof(*sd));
        for (size_t k = 0; k < n; k++) {
            sh[k].data = dummy;
            sh[k].mem = WSYNC_MEM_CUDA;
            CHECK_OK(wsync_shard_desc_from(&sh[k], i, (uint32_t)k, &sd[nsd++]));
        }
        wsync_layout_shards_free(sh, n);
    }
    for (uint32_t r = 0; r < nr; r++) {
        wsync_target_t *t = NULL;
        size_t n = 0;
        CHECK_OK(wsync_layout_tp_targets(cfg, (int)(r % tp), (int)tp, &opt, &t, &n));
        td = realloc(td, (ntd + n) * sizeof(*td));
        for (size_t k = 0; k < n; k++) {
            t[k].data = dummy;
            t[k].mem = WSYNC_MEM_CUDA;
            CHECK_OK(wsync_target_desc_from(&t[k], r, (uint32_t)k, &td[ntd++]));
        }
        wsync_layout_targets_free(t, n);
    }
    CHECK_OK(wsync_plan_compile(sd, nsd, td, ntd, ns, nr, bucket, &p));
    if (p != NULL) {
        wsync_segment_t *S = NULL;
        CHECK_OK(wsync_plan_flatten(p, &S));
        for (uint32_t i = 1; S != NULL && i < p->nsegments; i++) {
            const wsync_segment_t *a = &S[i - 1], *b = &S[i];
            CHECK_MSG(a->receiver < b->receiver ||
                      (a->receiver == b->receiver && a->chunk <= b->chunk),
                      "S=%u T=%u x%u: segment %u (receiver %u chunk %u) after (%u, %u)", ns, tp,
                      reps, i, b->receiver, b->chunk, a->receiver, a->chunk);
        }
        free(S);
        for (uint32_t i = 1; i < p->nchunks; i++) {
            const wsync_chunk_t *a = &p->chunks[i - 1], *b = &p->chunks[i];
            CHECK(a->sender < b->sender || (a->sender == b->sender && a->bucket <= b->bucket));
        }
        for (uint32_t splits = 0; splits <= WSYNC_NCCL_MAX_SPLITS; splits += 4) {
            s = NULL;
            CHECK_OK(wsync_nccl_sched_build(p, WSYNC_NCCL_DIRECT_MIN, splits, &s));
            if (s != NULL)
                check_sched(p, s, WSYNC_NCCL_DIRECT_MIN, splits);
            wsync_nccl_sched_free(s);
        }
    }
    wsync_plan_free(p);
    for (size_t i = 0; i < nsd; i++)
        wsync_shard_desc_clear(&sd[i]);
    for (size_t i = 0; i < ntd; i++)
        wsync_target_desc_clear(&td[i]);
    free(sd);
    free(td);
}

static wsync_model_config_t qwen_like(int64_t hidden, int64_t layers, int64_t heads, int64_t kv,
                                      int64_t inter, int64_t vocab)
{
    wsync_model_config_t c;
    memset(&c, 0, sizeof(c));
    c.model_type = WSYNC_MODEL_QWEN3;
    c.hidden_size = hidden;
    c.num_hidden_layers = layers;
    c.num_attention_heads = heads;
    c.num_key_value_heads = kv;
    c.head_dim = 128;
    c.intermediate_size = inter;
    c.vocab_size = vocab;
    c.max_position_embeddings = 40960;
    c.qk_norm = 1;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e6;
    c.dtype = BF16;
    return c;
}

static void test_model_groups(void)
{
    /* the demo's tiny model, and Qwen3-8B's widths with two layers */
    wsync_model_config_t tiny = qwen_like(256, 2, 4, 2, 512, 1024);
    wsync_model_config_t q8 = qwen_like(4096, 2, 32, 8, 12288, 151936);
    CHECK_OK(wsync_model_config_check(&tiny));
    CHECK_OK(wsync_model_config_check(&q8));
    for (uint32_t ns = 1; ns <= 4; ns++)
        for (uint32_t tp = 1; tp <= 4; tp++)
            for (uint32_t reps = 1; reps <= 3; reps++) {
                if (tp != 3)
                    model_group(&tiny, ns, tp, reps, 64u << 10);
                if (tp != 3)
                    model_group(&q8, ns, tp, reps, 256u << 20);
            }
}

/* Negotiation: nccl serves CUDA groups whose members all have NCCL, and says why not otherwise. */
static void test_score(void)
{
    wsync_hello_t h[4];
    char reason[512], explain[2048];
    wsync_group_info_t g;
    const wsync_scheme_ops_t *chosen = NULL;
    int ti = wsync_transport_index("nccl");

    memset(h, 0, sizeof(h));
    memset(&g, 0, sizeof(g));
    for (int i = 0; i < 4; i++) {
        h[i].role = i < 2 ? 1 : 2;
        h[i].rank = i % 2;
        h[i].transports = 1u << ti;
        h[i].hostname = i % 2 ? (char *)"node-b" : (char *)"node-a";
        h[i].host_id = i % 2 ? (char *)"b" : (char *)"a";
    }
    g.nsenders = 2;
    g.nreceivers = 2;
    g.senders = h;
    g.receivers = h + 2;
    g.mem_kinds = 1u << WSYNC_MEM_CUDA;
    CHECK(wsync_scheme_nccl.score(&g, reason, sizeof(reason)) > 0);
    CHECK_MSG(strstr(reason, "NCCL") && strstr(reason, "CUDA memory"), "%s", reason);
    /* across hosts, in CUDA memory: nccl is the choice */
    CHECK_OK(wsync_negotiate(&g, "auto", &chosen, explain, sizeof(explain)));
    CHECK_MSG(chosen == &wsync_scheme_nccl, "%s", explain);
    CHECK_MSG(strstr(explain, "nccl: chosen") != NULL, "%s", explain);

    h[3].transports = 0;
    CHECK(wsync_scheme_nccl.score(&g, reason, sizeof(reason)) == 0);
    CHECK_MSG(strstr(reason, "receiver 1") && strstr(reason, "node-b"), "%s", reason);
    h[3].transports = 1u << ti;

    /* two participants on one GPU (DESCRIBE's GPU trailer): NCCL refuses, naming both and it */
    static const uint8_t gpu_a[16] = {0xaa, 1}, gpu_b[16] = {0xbb, 2}, gpu_c[16] = {0xcc, 3};
    const uint8_t *sg[2] = {gpu_a, gpu_b}, *rg[2] = {gpu_c, gpu_b};
    g.sender_gpu = sg;
    g.receiver_gpu = rg;
    CHECK(wsync_scheme_nccl.score(&g, reason, sizeof(reason)) == 0);
    CHECK_MSG(strstr(reason, "sender 1 and receiver 1 share GPU") != NULL, "%s", reason);
    rg[1] = NULL;   /* unknown: no refusal */
    CHECK(wsync_scheme_nccl.score(&g, reason, sizeof(reason)) > 0);
    rg[1] = gpu_a;   /* sender 0's GPU, but receiver 1 is on host b: named apart, not refused */
    CHECK_MSG(wsync_scheme_nccl.score(&g, reason, sizeof(reason)) > 0, "%s", reason);
    h[3].host_id = (char *)"a";   /* on host a too: one GPU */
    CHECK(wsync_scheme_nccl.score(&g, reason, sizeof(reason)) == 0);
    CHECK_MSG(strstr(reason, "sender 0 and receiver 1 share GPU") != NULL, "%s", reason);
    h[3].host_id = (char *)"b";
    g.sender_gpu = g.receiver_gpu = NULL;

    /* one host, CUDA memory, replicas: ipc still serves but ranks below nccl's broadcast */
    int shm = wsync_transport_index("shm"), cuda = wsync_transport_index("cuda_ipc");
    if (shm >= 0 && cuda >= 0) {
        for (int i = 0; i < 4; i++) {
            h[i].host_id = (char *)"a";
            h[i].transports = (1u << ti) | (1u << shm) | (1u << cuda);
        }
        static const uint8_t gpu_d[16] = {0xdd, 4};
        const uint8_t *sg4[2] = {gpu_a, gpu_b}, *rg4[2] = {gpu_c, gpu_d};
        g.replication = 2.0;   /* GPUs unknown: ipc keeps its score (nccl could not check) */
        int unknown = wsync_scheme_ipc.score(&g, reason, sizeof(reason));
        g.sender_gpu = sg4;
        g.receiver_gpu = rg4;
        g.replication = 1.0;
        int solo = wsync_scheme_ipc.score(&g, reason, sizeof(reason));
        CHECK(unknown == solo);
        g.replication = 2.0;
        int rep = wsync_scheme_ipc.score(&g, reason, sizeof(reason));
        CHECK_MSG(solo > wsync_scheme_nccl.score(&g, explain, sizeof(explain)) && rep > 0 &&
                      rep < wsync_scheme_nccl.score(&g, explain, sizeof(explain)),
                  "ipc %d without replicas, %d with; %s", solo, rep, reason);
        CHECK_MSG(strstr(reason, "2.0 times") != NULL, "%s", reason);
        CHECK_OK(wsync_negotiate(&g, "auto", &chosen, explain, sizeof(explain)));
        CHECK_MSG(chosen == &wsync_scheme_nccl, "%s", explain);
        g.replication = 1.0;
        CHECK_OK(wsync_negotiate(&g, "auto", &chosen, explain, sizeof(explain)));
        CHECK_MSG(chosen == &wsync_scheme_ipc, "%s", explain);
    }

    g.mem_kinds |= 1u << WSYNC_MEM_HOST;
    CHECK(wsync_scheme_nccl.score(&g, reason, sizeof(reason)) == 0);
    CHECK_MSG(strstr(reason, "host memory") != NULL, "%s", reason);
    g.mem_kinds = 1u << WSYNC_MEM_HOST;
    CHECK(wsync_scheme_nccl.score(&g, reason, sizeof(reason)) == 0);
}

int main(void)
{
    RUN(test_fanout);
    RUN(test_fsdp_to_tp);
    RUN(test_replicas_and_split_bound);
    RUN(test_packing);
    RUN(test_steps);
    RUN(test_model_groups);
    RUN(test_score);
    return check_summary();
}
