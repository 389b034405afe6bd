/* The plan of mixture-of-experts models (issue 16): bytes per receiver and per (sender,
 * receiver) link for FSDP and expert-parallel senders to TP and EP receivers of the tiny
 * Qwen3-MoE and DeepSeek-V3 models, against figures computed here:
 *  - a receiver takes exactly the elements its targets' pieces name (the layouts' pieces), and
 *    from FSDP sender s the rows of each piece that s holds, [s*c, min(n, (s+1)*c)) with
 *    c = ceil(n / S) (the FSDP rule, not the library's);
 *  - every routed expert byte lands once per engine: on the one EP rank that holds the expert
 *    (linear placement, computed here), or split by TP when EP is off;
 * and the compiler's order independence, replicated receivers (whose segments it copies), and
 * linear structure on many params. */
#include "wsync/wsync.h"

#include "reshard/plan.h"
#include "tests/support/check.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QWEN WSYNC_TESTDATA "/hf_qwen3_moe_tiny/config.json"
#define DSV3 WSYNC_TESTDATA "/hf_deepseek_v3_tiny/config.json"

typedef enum { SEND_FSDP, SEND_EP } sender_layout_t;

typedef struct {
    wsync_model_config_t cfg;
    int S, T, E;                     /* senders; TP; EP (0: off) */
    int nr;                          /* receivers: E, or T */
    wsync_shard_t **sh;
    size_t *nsh;
    wsync_target_t **tg;
    size_t *ntg;
} group_t;

static void group_free(group_t *g)
{
    for (int s = 0; g->sh && s < g->S; s++)
        wsync_layout_shards_free(g->sh[s], g->nsh[s]);
    for (int r = 0; g->tg && r < g->nr; r++)
        wsync_layout_targets_free(g->tg[r], g->ntg[r]);
    free(g->sh);
    free(g->nsh);
    free(g->tg);
    free(g->ntg);
    memset(g, 0, sizeof(*g));
}

static int group_make(group_t *g, const char *config, int S, sender_layout_t sl, int T, int E)
{
    memset(g, 0, sizeof(*g));
    CHECK_ST(wsync_model_config_load(config, &g->cfg), WSYNC_OK);
    g->S = S, g->T = T, g->E = E, g->nr = E ? E : T;
    g->sh = calloc((size_t)S, sizeof(*g->sh));
    g->nsh = calloc((size_t)S, sizeof(*g->nsh));
    g->tg = calloc((size_t)g->nr, sizeof(*g->tg));
    g->ntg = calloc((size_t)g->nr, sizeof(*g->ntg));
    if (!g->sh || !g->nsh || !g->tg || !g->ntg)
        return -1;
    for (int s = 0; s < S; s++) {
        wsync_status_t st =
            sl == SEND_EP
                ? wsync_layout_ep_shards(&g->cfg, (wsync_dtype_t)0, s, S, 0, &g->sh[s], &g->nsh[s])
                : wsync_layout_fsdp_shards(&g->cfg, (wsync_dtype_t)0, s, S, &g->sh[s],
                                           &g->nsh[s]);
        CHECK_MSG(st == WSYNC_OK, "sender %d: %s", s, wsync_last_error());
        if (st != WSYNC_OK)
            return -1;
    }
    for (int r = 0; r < g->nr; r++) {
        wsync_tp_options_t o = WSYNC_TP_OPTIONS_INIT;
        o.ep_size = E;
        o.ep_rank = E ? r : 0;
        wsync_status_t st = wsync_layout_tp_targets(&g->cfg, r % T, T, &o, &g->tg[r], &g->ntg[r]);
        CHECK_MSG(st == WSYNC_OK, "receiver %d: %s", r, wsync_last_error());
        if (st != WSYNC_OK)
            return -1;
    }
    return 0;
}

/* Summarize the group through the public API. */
static wsync_plan_summary_t *group_summary(const group_t *g)
{
    size_t nsh = 0, ntg = 0, k;
    for (int s = 0; s < g->S; s++)
        nsh += g->nsh[s];
    for (int r = 0; r < g->nr; r++)
        ntg += g->ntg[r];
    wsync_shard_t *sh = calloc(nsh, sizeof(*sh));
    wsync_target_t *tg = calloc(ntg, sizeof(*tg));
    int *ss = calloc(nsh, sizeof(*ss)), *tr = calloc(ntg, sizeof(*tr));
    wsync_plan_summary_t *sum = NULL;
    if (sh && tg && ss && tr) {
        k = 0;
        for (int s = 0; s < g->S; s++)
            for (size_t i = 0; i < g->nsh[s]; i++, k++)
                sh[k] = g->sh[s][i], ss[k] = s;
        k = 0;
        for (int r = 0; r < g->nr; r++)
            for (size_t j = 0; j < g->ntg[r]; j++, k++)
                tg[k] = g->tg[r][j], tr[k] = r;
        wsync_status_t st = wsync_plan_summarize(sh, ss, nsh, tg, tr, ntg, g->S, g->nr, 0, &sum);
        CHECK_MSG(st == WSYNC_OK, "summarize: %s", wsync_last_error());
    }
    free(sh);
    free(tg);
    free(ss);
    free(tr);
    return sum;
}

static uint64_t vol(int nd, const int64_t *len)
{
    uint64_t v = 1;
    for (int d = 0; d < nd; d++)
        v *= (uint64_t)len[d];
    return v;
}

static int is_routed_expert(const char *name)
{
    return strstr(name, ".mlp.experts.") != NULL;
}

/* Rows [lo, hi) of a dim-0 FSDP split of n rows that sender s of S holds. */
static void fsdp_rows(int64_t n, int s, int S, int64_t *lo, int64_t *hi)
{
    int64_t c = (n + S - 1) / S;
    *lo = s * c < n ? s * c : n;
    *hi = (s + 1) * c < n ? (s + 1) * c : n;
}

/* Experts EP rank r of E holds under linear placement: the first E % EP ranks one more. */
static int64_t linear_count(int64_t experts, int r, int E)
{
    return experts / E + (r < experts % E ? 1 : 0);
}

/* Bytes of every routed expert param of the checkpoint, and one expert's (3 params), from
 * wsync_model_params by name. */
static void expert_bytes(const wsync_model_config_t *cfg, uint64_t *all, uint64_t *one,
                         int64_t *moe_layers)
{
    wsync_param_t *p = NULL;
    size_t n = 0;
    *all = *one = 0;
    *moe_layers = 0;
    CHECK_ST(wsync_model_params(cfg, (wsync_dtype_t)0, &p, &n), WSYNC_OK);
    for (size_t i = 0; i < n; i++)
        if (is_routed_expert(p[i].name))
            *all += vol(p[i].ndim, p[i].shape) * wsync_dtype_size(p[i].dtype);
    for (int64_t l = 0; l < cfg->num_hidden_layers; l++)
        *moe_layers += wsync_model_layer_is_moe(cfg, l);
    /* gate and up [I, Hd], down [Hd, I] */
    *one = 3u * (uint64_t)cfg->moe_intermediate_size * (uint64_t)cfg->hidden_size * 2u;
    wsync_model_params_free(p, n);
}

static void check_group(const char *config, int S, sender_layout_t sl, int T, int E)
{
    group_t g;
    char what[160];
    snprintf(what, sizeof(what), "%s S=%d %s T=%d EP=%d", strstr(config, "qwen3") ? "qwen3_moe" : "dsv3",
             S, sl == SEND_EP ? "ep" : "fsdp", T, E);
    if (group_make(&g, config, S, sl, T, E) != 0) {
        group_free(&g);
        return;
    }
    wsync_plan_summary_t *sum = group_summary(&g);
    if (sum == NULL) {
        group_free(&g);
        return;
    }
    uint64_t all_experts, one_expert, expert_total = 0, total = 0;
    int64_t moe_layers;
    expert_bytes(&g.cfg, &all_experts, &one_expert, &moe_layers);
    CHECK_MSG(moe_layers > 0 && all_experts == (uint64_t)g.cfg.num_experts * one_expert *
                                                   (uint64_t)moe_layers,
              "%s: %" PRIu64 " expert bytes in %" PRId64 " MoE layers", what, all_experts,
              moe_layers);

    for (int r = 0; r < g.nr; r++) {
        uint64_t want = 0, experts = 0;
        for (size_t j = 0; j < g.ntg[r]; j++) {
            const wsync_target_t *t = &g.tg[r][j];
            for (int k = 0; k < t->npieces; k++) {
                const wsync_piece_t *p = &t->pieces[k];
                uint64_t b = vol(p->param.ndim, p->src.len) * wsync_dtype_size(p->param.dtype);
                want += b;
                if (is_routed_expert(p->param.name))
                    experts += b;
            }
        }
        CHECK_MSG(sum->bytes_per_receiver[r] == want, "%s receiver %d: plan %" PRIu64 ", pieces "
                  "%" PRIu64, what, r, sum->bytes_per_receiver[r], want);
        if (E) {        /* whole experts: this rank's share of them, each whole */
            uint64_t w = (uint64_t)linear_count(g.cfg.num_experts, r, E) * one_expert *
                         (uint64_t)moe_layers;
            CHECK_MSG(experts == w, "%s receiver %d: expert bytes %" PRIu64 ", want %" PRIu64,
                      what, r, experts, w);
        }
        expert_total += experts;
        total += want;

        /* from FSDP sender s: the rows of each piece that s holds */
        for (int s = 0; sl == SEND_FSDP && s < S; s++) {
            uint64_t pair = 0;
            for (size_t j = 0; j < g.ntg[r]; j++) {
                const wsync_target_t *t = &g.tg[r][j];
                for (int k = 0; k < t->npieces; k++) {
                    const wsync_piece_t *p = &t->pieces[k];
                    int64_t lo, hi;
                    fsdp_rows(p->param.shape[0], s, S, &lo, &hi);
                    int64_t a = p->src.start[0] > lo ? p->src.start[0] : lo;
                    int64_t z = p->src.start[0] + p->src.len[0] < hi
                                    ? p->src.start[0] + p->src.len[0]
                                    : hi;
                    if (z > a)
                        pair += (uint64_t)(z - a) * vol(p->param.ndim - 1, p->src.len + 1) *
                                wsync_dtype_size(p->param.dtype);
                }
            }
            uint64_t got = sum->pair_bytes[(size_t)s * (size_t)g.nr + (size_t)r];
            CHECK_MSG(got == pair, "%s sender %d -> receiver %d: plan %" PRIu64 ", rows held "
                      "%" PRIu64, what, s, r, got, pair);
        }
    }
    /* every routed expert byte once per engine, EP or TP */
    CHECK_MSG(expert_total == all_experts, "%s: experts moved %" PRIu64 ", checkpoint %" PRIu64,
              what, expert_total, all_experts);
    CHECK(sum->total_bytes == total);
    wsync_plan_summary_free(sum);
    group_free(&g);
}

static void qwen3_moe_plans(void)
{
    check_group(QWEN, 3, SEND_FSDP, 2, 4);   /* FSDP-3 -> EP-4 (attention DP 2 x TP 2) */
    check_group(QWEN, 3, SEND_FSDP, 2, 0);   /* FSDP-3 -> TP-2, experts split inside */
    check_group(QWEN, 2, SEND_FSDP, 1, 3);   /* EP-3: 8 experts as 3 + 3 + 2 */
    check_group(QWEN, 4, SEND_EP, 2, 2);     /* expert-parallel senders -> EP-2 */
}

static void deepseek_v3_plans(void)
{
    check_group(DSV3, 3, SEND_FSDP, 2, 4);
    check_group(DSV3, 2, SEND_FSDP, 2, 0);
    check_group(DSV3, 2, SEND_EP, 1, 8);     /* one expert per EP rank */
    /* FSDP-16 -> EP-8 as 4 data-parallel groups of TP 2: receivers 2..7 take their attention
     * and dense weights' logical segments from receiver 0 or 1 (not copied, read in place) and
     * are written in the order 0, 2, 4, 6, 1, 3, 5, 7; receivers' own logical segments (tens
     * of pages) are given back after their receiver while the shared ones stay. A page given
     * back too early reads as zeros: chunk 0, sender 0's link bytes wrong. */
    check_group(DSV3, 16, SEND_FSDP, 2, 8);
}

/* The compiler sums bucket use and pair bytes while it lays the plan out; a decoder derives them
 * from the chunks and segments alone. The two must agree (and the wire bytes, and the
 * fingerprint, with the encoding's). */
static void check_tables_as_decoded(const wsync_plan_t *p)
{
    wsync_wbuf_t b;
    wsync_plan_t *q = NULL;
    uint64_t nb = 0;

    wsync_wbuf_init(&b);
    wsync_plan_encode(p, &b);
    CHECK(!b.err);
    CHECK(b.len == wsync_plan_wire_bytes(p));
    CHECK_ST(wsync_plan_decode(b.data, b.len, &q), WSYNC_OK);
    if (q) {
        CHECK(q->fingerprint == p->fingerprint);
        for (uint32_t s = 0; s < p->nsenders; s++) {
            CHECK_MSG(q->nbuckets[s] == p->nbuckets[s], "sender %u: %u buckets, decoded %u", s,
                      p->nbuckets[s], q->nbuckets[s]);
            nb += p->nbuckets[s];
        }
        for (uint64_t i = 0; i < nb; i++)
            CHECK_MSG(q->bucket_used[i] == p->bucket_used[i], "bucket %" PRIu64 " used %" PRIu64
                      ", decoded %" PRIu64, i, p->bucket_used[i], q->bucket_used[i]);
        for (size_t i = 0; i < (size_t)p->nsenders * p->nreceivers; i++)
            CHECK_MSG(q->pair_bytes[i] == p->pair_bytes[i], "pair %zu", i);
    }
    wsync_plan_free(q);
    wsync_wbuf_free(&b);
}

/* Descriptors of group g's shards (*nsh) and of its receivers' targets `copies` times over
 * (*ntd of them a copy; copy c's receiver r is receiver c * g->nr + r, laid out as r: replicas of
 * the whole group's receivers), their data a placeholder. 0, or -1 after a failed CHECK. */
static int group_descs(const group_t *g, int copies, wsync_shard_desc_t **sd, size_t *nsh,
                       wsync_target_desc_t **td, size_t *ntd)
{
    static char data;
    size_t k = 0;
    int failures = check_failures;

    *nsh = *ntd = 0;
    for (int s = 0; s < g->S; s++)
        *nsh += g->nsh[s];
    for (int r = 0; r < g->nr; r++)
        *ntd += g->ntg[r];
    *sd = calloc(*nsh, sizeof(**sd));
    *td = calloc(*ntd * (size_t)copies, sizeof(**td));
    CHECK(*sd != NULL && *td != NULL);
    if (*sd == NULL || *td == NULL)
        return -1;
    for (int s = 0; s < g->S; s++)
        for (size_t i = 0; i < g->nsh[s]; i++, k++) {
            wsync_shard_t one = g->sh[s][i];
            one.data = &data;
            CHECK_ST(wsync_shard_desc_from(&one, (uint32_t)s, (uint32_t)i, &(*sd)[k]), WSYNC_OK);
        }
    k = 0;
    for (int c = 0; c < copies; c++)
        for (int r = 0; r < g->nr; r++)
            for (size_t j = 0; j < g->ntg[r]; j++, k++) {
                wsync_target_t one = g->tg[r][j];
                one.data = &data;
                CHECK_ST(wsync_target_desc_from(&one, (uint32_t)(c * g->nr + r), (uint32_t)j,
                                                &(*td)[k]), WSYNC_OK);
            }
    return check_failures == failures ? 0 : -1;
}

/* The same descriptions in another order (shards and targets shuffled, each keeping its rank
 * and index) give the same plan: the compiler sorts what it needs, it does not rely on the
 * order the coordinator happens to collect them in. */
static void order_independent(void)
{
    group_t g;
    wsync_shard_desc_t *sd = NULL;
    wsync_target_desc_t *td = NULL;
    size_t nsh = 0, ntg = 0;
    if (group_make(&g, DSV3, 3, SEND_FSDP, 2, 4) != 0 ||
        group_descs(&g, 1, &sd, &nsh, &td, &ntg) != 0) {
        wsync_shard_descs_free(sd, nsh);
        wsync_target_descs_free(td, ntg);
        group_free(&g);
        return;
    }
    wsync_plan_t *a = NULL, *b = NULL;
    CHECK_ST(wsync_plan_compile(sd, nsh, td, ntg, 3, 4, 1 << 20, &a), WSYNC_OK);
    uint64_t seed = 0x9e3779b97f4a7c15u;
    for (size_t i = nsh; i > 1; i--) {
        seed = seed * 6364136223846793005u + 1442695040888963407u;
        size_t j = (size_t)(seed >> 33) % i;
        wsync_shard_desc_t t = sd[i - 1];
        sd[i - 1] = sd[j], sd[j] = t;
    }
    for (size_t i = ntg; i > 1; i--) {
        seed = seed * 6364136223846793005u + 1442695040888963407u;
        size_t j = (size_t)(seed >> 33) % i;
        wsync_target_desc_t t = td[i - 1];
        td[i - 1] = td[j], td[j] = t;
    }
    CHECK_ST(wsync_plan_compile(sd, nsh, td, ntg, 3, 4, 1 << 20, &b), WSYNC_OK);
    if (a && b) {
        CHECK_MSG(a->fingerprint == b->fingerprint, "fingerprints %016" PRIx64 " and %016" PRIx64,
                  a->fingerprint, b->fingerprint);
        CHECK(a->nchunks == b->nchunks && a->nsegments == b->nsegments);
        check_tables_as_decoded(a);
        check_tables_as_decoded(b);
    }
    /* a repeated (sender, index) is still refused, naming both params */
    if (nsh >= 2) {
        uint32_t keep = sd[1].index, ks = sd[1].sender;
        sd[1].index = sd[0].index, sd[1].sender = sd[0].sender;
        wsync_plan_t *c = NULL;
        CHECK_ST(wsync_plan_compile(sd, nsh, td, ntg, 3, 4, 1 << 20, &c), WSYNC_ERR_INVALID);
        CHECK_ERR_HAS("describes two shards with index");
        sd[1].index = keep, sd[1].sender = ks;
    }
    wsync_plan_free(a);
    wsync_plan_free(b);
    wsync_shard_descs_free(sd, nsh);
    wsync_target_descs_free(td, ntg);
    group_free(&g);
}

static int cmp_seg_ref(const void *a, const void *b)
{
    const wsync_segment_t *x = a, *y = b;
    if (x->chunk != y->chunk)
        return x->chunk < y->chunk ? -1 : 1;
    if (x->target != y->target)
        return x->target < y->target ? -1 : 1;
    if (x->piece != y->piece)
        return x->piece < y->piece ? -1 : 1;
    return x->dst.off < y->dst.off ? -1 : x->dst.off > y->dst.off;
}

/* Each receiver's segments from wsync_plan_segments against a reference expansion made another
 * way: every record of every list its references take, with the reference's target, sorted
 * by (chunk, target, piece, offset) with qsort. Returns the receivers checked. */
static uint32_t check_expansion(const wsync_plan_t *p)
{
    uint32_t ok = 0;
    for (uint32_t r = 0; r < p->nreceivers; r++) {
        const wsync_segment_t *got = NULL;
        uint32_t n = 0, m = 0;
        wsync_segment_t *want;
        CHECK_OK(wsync_plan_segments(p, r, &got, &n));
        want = calloc((size_t)n + 1, sizeof(*want));
        CHECK(want != NULL);
        if (want == NULL)
            return ok;
        for (uint32_t k = p->ref0[r]; k < p->ref0[r + 1]; k++)
            for (uint32_t i = p->list0[p->refs[k].list];
                 i < p->list0[p->refs[k].list + 1] && m < n; i++, m++) {
                const wsync_list_seg_t *l = &p->lsegs[i];
                want[m].receiver = r;
                want[m].target = p->refs[k].target;
                want[m].piece = l->piece;
                want[m].chunk = l->chunk;
                want[m].dst.off = l->off;
                want[m].dst.pitch = l->pitch;
                want[m].dst.rows = p->chunks[l->chunk].src.rows;
                want[m].dst.cols = p->chunks[l->chunk].src.cols;
            }
        CHECK_MSG(m == n, "receiver %u: %u segments, its lists hold %u", r, n, m);
        qsort(want, m, sizeof(*want), cmp_seg_ref);
        CHECK_MSG(m == n && memcmp(want, got, (size_t)n * sizeof(*want)) == 0,
                  "receiver %u: segments differ from the reference expansion", r);
        ok += m == n && memcmp(want, got, (size_t)n * sizeof(*want)) == 0;
        free(want);
    }
    return ok;
}

/* Receivers that are replicas of one another: data-parallel copies of one receiver (DeepSeek-V3,
 * FSDP-3 to TP-1, 4 copies) and of a whole engine (Qwen3-MoE, FSDP-4 to TP-2 x EP-4, 3 copies: 12
 * receivers, each engine's 4 laid out alike). Against the plan to one copy alone: the same
 * chunks; the plan holds that copy's lists once, a reference to each per copy; every receiver's
 * segments equal the reference expansion, and each copy's are exactly the one copy's, in the
 * same order, for its receivers. On the wire each later copy costs a few bytes a receiver (the
 * coded records of the copy before reused, wire version 2), and the plan's encoding is byte for
 * byte that of its flattened segments coded receiver by receiver, and decodes to the same
 * segments and pair bytes. */
static void replicas(void)
{
    static const struct {
        const char *what, *config;
        int S, T, E, K;              /* senders, TP, EP (0: off), copies */
    } rows[] = {
        {"copies of one receiver", DSV3, 3, 1, 0, 4},
        {"copies of a TP-2 x EP-4 engine", QWEN, 4, 2, 4, 3},
    };
    for (size_t x = 0; x < sizeof(rows) / sizeof(rows[0]); x++) {
        const char *what = rows[x].what;
        const int S = rows[x].S, K = rows[x].K;
        group_t g;
        wsync_shard_desc_t *sd = NULL;
        wsync_target_desc_t *td = NULL;
        size_t nsh = 0, ntd = 0;
        uint32_t nr = 0;
        wsync_plan_t *a = NULL, *b = NULL, *q = NULL;
        if (group_make(&g, rows[x].config, S, SEND_FSDP, rows[x].T, rows[x].E) == 0 &&
            group_descs(&g, K, &sd, &nsh, &td, &ntd) == 0) {
            nr = (uint32_t)g.nr;
            CHECK_ST(wsync_plan_compile(sd, nsh, td, ntd, S, nr, 1 << 16, &a), WSYNC_OK);
            CHECK_ST(wsync_plan_compile(sd, nsh, td, ntd * K, S, nr * K, 1 << 16, &b), WSYNC_OK);
        }
        if (a != NULL && b != NULL) {
            CHECK_MSG(a->nsegments > 100 && a->nbuckets[0] > 1, "%s: %u segments, "
                      "sender 0's buckets %u (small buckets: params split over several chunks)",
                      what, a->nsegments, a->nbuckets[0]);
            check_tables_as_decoded(a);
            check_tables_as_decoded(b);
            CHECK_MSG(b->nchunks == a->nchunks, "%s: %u chunks, one copy %u", what, b->nchunks,
                      a->nchunks);
            for (uint32_t i = 0; i < a->nchunks && i < b->nchunks; i++) {
                const wsync_chunk_t *u = &a->chunks[i], *y = &b->chunks[i];
                CHECK_MSG(u->sender == y->sender && u->shard == y->shard && u->dtype == y->dtype &&
                          u->bucket == y->bucket && u->bucket_off == y->bucket_off &&
                          memcmp(&u->src, &y->src, sizeof(u->src)) == 0, "%s: chunk %u differs",
                          what, i);
            }
            CHECK(b->nsegments == (uint64_t)K * a->nsegments);
            /* the plan holds the one copy's lists once: K references to each */
            CHECK(b->nlists == a->nlists && b->list0[b->nlists] == a->list0[a->nlists]);
            CHECK(b->ref0[nr * K] == (uint64_t)K * a->ref0[nr]);
            CHECK(check_expansion(a) == nr && check_expansion(b) == nr * K);
            CHECK_MSG(b->wire_bytes > a->wire_bytes &&
                          b->wire_bytes <= a->wire_bytes + 16 * (uint64_t)nr * (K - 1),
                      "%s: %d copies: %" PRIu64 " bytes on the wire, one copy %" PRIu64, what, K,
                      b->wire_bytes, a->wire_bytes);
            wsync_segment_t *as = NULL, *bs = NULL;
            CHECK_OK(wsync_plan_flatten(a, &as));
            CHECK_OK(wsync_plan_flatten(b, &bs));
            for (uint64_t i = 0; as && bs && b->nsegments == (uint64_t)K * a->nsegments &&
                                 i < b->nsegments; i++) {
                const wsync_segment_t *u = &as[i % a->nsegments], *y = &bs[i];
                uint32_t copy = (uint32_t)(i / a->nsegments);
                CHECK_MSG(y->receiver == u->receiver + copy * nr && u->target == y->target &&
                          u->piece == y->piece && u->chunk == y->chunk &&
                          memcmp(&u->dst, &y->dst, sizeof(u->dst)) == 0, "%s: segment %" PRIu64
                          " differs", what, i);
                if (y->receiver != u->receiver + copy * nr || u->chunk != y->chunk)
                    break;
            }
            /* the encoding, which codes a copy's records once and reuses them for the next */
            wsync_wbuf_t ea, eb;
            wsync_wbuf_init(&ea);
            wsync_wbuf_init(&eb);
            wsync_plan_encode(b, &ea);
            if (bs != NULL)
                wsync_plan_encode_flat(b, bs, b->nsegments, &eb);
            CHECK_MSG(!ea.err && !eb.err && ea.len == eb.len &&
                          memcmp(ea.data, eb.data, ea.len) == 0,
                      "%s: the plan's encoding (%zu bytes) differs from its flattened segments' "
                      "(%zu)", what, ea.len, eb.len);
            CHECK(ea.len == b->wire_bytes);
            CHECK_OK(wsync_plan_decode(ea.data, ea.len, &q));
            if (q != NULL && bs != NULL) {
                wsync_segment_t *qs = NULL;
                CHECK(q->fingerprint == b->fingerprint && q->nlists == b->nlists);
                CHECK_OK(wsync_plan_flatten(q, &qs));
                CHECK(qs != NULL && memcmp(qs, bs, (size_t)b->nsegments * sizeof(*qs)) == 0);
                CHECK(memcmp(q->pair_bytes, b->pair_bytes,
                             (size_t)S * b->nreceivers * sizeof(*q->pair_bytes)) == 0);
                free(qs);
            }
            wsync_wbuf_free(&ea);
            wsync_wbuf_free(&eb);
            free(as);
            free(bs);
        }
        wsync_plan_free(a);
        wsync_plan_free(b);
        wsync_plan_free(q);
        wsync_shard_descs_free(sd, nsh);
        wsync_target_descs_free(td, ntd * K);
        group_free(&g);
    }
}

/* One receiver taking the same bytes twice (two targets fed from one region, e.g. a tied weight
 * kept in two places): one chunk, two segments on it, in target order. */
static void same_chunk_twice(void)
{
    static char data;
    wsync_param_t p = {"w", WSYNC_DTYPE_F32, 2, {4, 8}};
    wsync_shard_t sh = {p, {{0, 0}, {4, 8}}, &data, WSYNC_MEM_HOST, 0};
    wsync_piece_t pc = {p, {{0, 0}, {4, 8}}, {0, 0}};
    wsync_target_t ta = {"a", WSYNC_DTYPE_F32, 2, {4, 8}, &data, WSYNC_MEM_HOST, 0, &pc, 1, {0}};
    wsync_target_t tb = ta;
    wsync_shard_desc_t sd;
    wsync_target_desc_t td[2];
    wsync_plan_t *pl = NULL;

    tb.name = "b";
    CHECK_ST(wsync_shard_desc_from(&sh, 0, 0, &sd), WSYNC_OK);
    CHECK_ST(wsync_target_desc_from(&tb, 0, 1, &td[0]), WSYNC_OK);   /* given out of order */
    CHECK_ST(wsync_target_desc_from(&ta, 0, 0, &td[1]), WSYNC_OK);
    CHECK_ST(wsync_plan_compile(&sd, 1, td, 2, 1, 1, 1 << 20, &pl), WSYNC_OK);
    if (pl) {
        CHECK(pl->nchunks == 1 && pl->nsegments == 2);
        const wsync_segment_t *g = NULL;
        uint32_t n = 0;
        CHECK_OK(wsync_plan_segments(pl, 0, &g, &n));
        CHECK(n == 2 && g[0].target == 0 && g[1].target == 1 && g[0].chunk == 0 &&
              g[1].chunk == 0);
    }
    wsync_plan_free(pl);
    wsync_shard_desc_clear(&sd);
    wsync_target_desc_clear(&td[0]);
    wsync_target_desc_clear(&td[1]);
}

/* Receivers laid out alike share the plan's lists, so a plan of more segments than one array
 * could hold (WSYNC_PLAN_MAX_SEGMENTS, 2^26, the limit on logical segments before lists) is
 * records only once per list: 4,096 senders each hold a row of one param, and 1,024 receivers
 * each take it whole as K targets laid out alike. K = 17: 71,303,168 segments (3.4 GB as one
 * array) from one list of 4,096 records, each receiver's segments those of the list, target by
 * target on each chunk. K = 65: 272,629,760 segments, past WSYNC_PLAN_MAX_LOGICAL_SEGMENTS:
 * refused with the count, the receivers and the limits before any list is written. */
static void segment_limit(void)
{
    enum { S = 4096, R = 1024, KMAX = 65 };
    static char data;
    wsync_param_t p = {"w", WSYNC_DTYPE_F32, 2, {S, 2}};
    wsync_piece_t pc = {p, {{0, 0}, {S, 2}}, {0, 0}};
    wsync_target_t t = {"t", WSYNC_DTYPE_F32, 2, {S, 2}, &data, WSYNC_MEM_HOST, 0, &pc, 1, {0}};
    wsync_shard_desc_t *sd = calloc(S, sizeof(*sd));
    wsync_target_desc_t *td = calloc((size_t)R * KMAX, sizeof(*td));
    wsync_plan_t *pl = NULL;
    char name[16];

    CHECK(sd != NULL && td != NULL);
    if (sd == NULL || td == NULL) {
        free(sd);
        free(td);
        return;
    }
    for (int s = 0; s < S; s++) {
        wsync_shard_t sh = {p, {{s, 0}, {1, 2}}, &data, WSYNC_MEM_HOST, 0};
        CHECK_ST(wsync_shard_desc_from(&sh, (uint32_t)s, 0, &sd[s]), WSYNC_OK);
    }
    for (int K = 17; K <= KMAX; K += KMAX - 17) {
        for (int r = 0; r < R; r++)
            for (int k = 0; k < K; k++) {
                snprintf(name, sizeof(name), "t%d", k);
                t.name = name;
                CHECK_ST(wsync_target_desc_from(&t, (uint32_t)r, (uint32_t)k, &td[r * K + k]),
                         WSYNC_OK);
            }
        if (K == KMAX) {
            CHECK_ST(wsync_plan_compile(sd, S, td, (size_t)R * K, S, R, 1 << 20, &pl),
                     WSYNC_ERR_RANGE);
            CHECK(pl == NULL);
            CHECK_ERR_HAS("plan: 272629760 segments (one per chunk and receiver taking it) to "
                          "1024 receivers in 4096 records, more than the 268435456 segments");
        } else {
            CHECK_ST(wsync_plan_compile(sd, S, td, (size_t)R * K, S, R, 1 << 20, &pl), WSYNC_OK);
        }
        if (pl != NULL) {
            const wsync_segment_t *g = NULL;
            uint32_t n = 0, bad = 0;
            CHECK(pl->nsegments == 71303168u && pl->nsegments > WSYNC_PLAN_MAX_SEGMENTS);
            CHECK(pl->nlists == 1 && pl->list0[1] == S && pl->ref0[R] == (uint32_t)R * K);
            /* the last receiver's: chunk c (sender c's row) into each target in turn */
            CHECK_OK(wsync_plan_segments(pl, R - 1, &g, &n));
            CHECK(n == (uint32_t)S * K);
            for (uint32_t i = 0; g != NULL && i < n; i++) {
                const wsync_segment_t *e = &g[i];
                uint32_t c = i / K;
                bad += e->receiver != R - 1 || e->chunk != c || e->target != i % K ||
                       e->piece != 0 || e->dst.off != 2 * (uint64_t)pl->chunks[c].sender ||
                       e->dst.rows != 1 || e->dst.cols != 2 || pl->chunks[c].sender != c;
            }
            CHECK_MSG(bad == 0, "%u of receiver %u's segments are not its list's", bad, R - 1);
            CHECK(pl->pair_bytes[(size_t)(S - 1) * R + 7] == 8u * K);   /* 2 floats, K times */
        }
        wsync_plan_free(pl);
        pl = NULL;
        wsync_target_descs_free(td, (size_t)R * K);
        td = calloc((size_t)R * KMAX, sizeof(*td));
        if (td == NULL)
            break;
    }
    wsync_shard_descs_free(sd, S);
    free(td);
}

/* Many params (as a MoE has), FSDP over 4 senders, two receivers taking alternate params whole:
 * one chunk per (param, sender), one segment per chunk, each receiver's bytes its params'. */
static void many_params(void)
{
    enum { N = 6000, S = 4, ROWS = 64, COLS = 32 };
    wsync_param_t *p = calloc(N, sizeof(*p));
    char (*names)[48] = calloc(N, sizeof(*names));
    wsync_piece_t *pieces = calloc(N, sizeof(*pieces));
    wsync_target_t *tg = calloc(N, sizeof(*tg));
    int *tr = calloc(N, sizeof(*tr)), *ss = NULL;
    wsync_shard_t *all = NULL;
    size_t nall = 0;
    CHECK(p && names && pieces && tg && tr);
    if (!(p && names && pieces && tg && tr))
        goto out;
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "model.layers.%d.mlp.experts.%d.w.weight", i / 300,
                 i % 300);
        p[i] = (wsync_param_t){names[i], WSYNC_DTYPE_BF16, 2, {ROWS, COLS}};
        pieces[i].param = p[i];
        pieces[i].src.len[0] = ROWS, pieces[i].src.len[1] = COLS;
        tg[i] = (wsync_target_t){names[i], WSYNC_DTYPE_BF16, 2, {ROWS, COLS}, NULL,
                                 WSYNC_MEM_HOST, 0, &pieces[i], 1, {0}};
        tr[i] = i % 2;
    }
    all = calloc((size_t)N * S, sizeof(*all));
    ss = calloc((size_t)N * S, sizeof(*ss));
    for (int s = 0; all && ss && s < S; s++) {
        wsync_shard_t *sh = NULL;
        size_t n = 0;
        CHECK_ST(wsync_layout_shards(p, N, 0, s, S, &sh, &n), WSYNC_OK);
        for (size_t i = 0; i < n; i++, nall++)
            all[nall] = sh[i], ss[nall] = s;
        free(sh);   /* names stay with `all`, freed below */
    }
    wsync_plan_summary_t *sum = NULL;
    CHECK_ST(wsync_plan_summarize(all, ss, nall, tg, tr, N, S, 2, 0, &sum), WSYNC_OK);
    if (sum) {
        CHECK(sum->nchunks == (uint64_t)N * S);
        CHECK(sum->nsegments == (uint64_t)N * S);
        for (int r = 0; r < 2; r++)
            CHECK(sum->bytes_per_receiver[r] == (uint64_t)N / 2 * ROWS * COLS * 2);
        for (int s = 0; s < S; s++)
            CHECK(sum->pair_bytes[(size_t)s * 2] == (uint64_t)N / 2 * (ROWS / S) * COLS * 2);
    }
    wsync_plan_summary_free(sum);
out:
    for (size_t i = 0; all && i < nall; i++)
        free((char *)all[i].param.name);
    free(all);
    free(ss);
    free(p);
    free(names);
    free(pieces);
    free(tg);
    free(tr);
}

int main(void)
{
    RUN(qwen3_moe_plans);
    RUN(deepseek_v3_plans);
    RUN(order_independent);
    RUN(replicas);
    RUN(same_chunk_twice);
    RUN(segment_limit);
    RUN(many_params);
    return check_summary();
}
