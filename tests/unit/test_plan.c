/* Plan compiler, codec and CPU executor: every layout is checked byte for byte against a
 * reference built another way (the whole tensor from a formula, sliced by hand). */
#include "core/status.h"
#include "core/util.h"
#include "core/wire.h"
#include "reshard/convert.h"
#include "reshard/exec.h"
#include "reshard/plan.h"
#include "reshard/plan_internal.h"
#include "tests/support/check.h"
#include "tests/support/plan_sim.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define BF16 WSYNC_DTYPE_BF16
#define F16 WSYNC_DTYPE_F16
#define F32 WSYNC_DTYPE_F32
#define MiB (1u << 20)

/* ------------------------------------------------------------------------------------------ */
/* Fixtures: allocations freed at the end of each case, reference tensors, boxes               */
/* ------------------------------------------------------------------------------------------ */

static void *allocs[4096];
static int nallocs;

static void *track(void *p)
{
    if (p != NULL && nallocs < (int)(sizeof(allocs) / sizeof(allocs[0])))
        allocs[nallocs++] = p;
    return p;
}

static void *zalloc(size_t n)
{
    return track(calloc(n ? n : 1, 1));
}

static void arena_free(void)
{
    while (nallocs > 0)
        free(allocs[--nallocs]);
}

static uint64_t volume(int nd, const int64_t *shape)
{
    uint64_t v = 1;
    for (int d = 0; d < nd; d++)
        v *= (uint64_t)shape[d];
    return v;
}

/* A param with its whole value, from a formula of (pid, flat index). bf16 values are small
 * integers (exact); f32/f16 values have fractions, so that casts must round. */
typedef struct {
    wsync_param_t p;
    void *full;
} ref_t;

static float formula(int pid, uint64_t i, wsync_dtype_t dt)
{
    if (dt == BF16)
        return (float)((int)((pid * 131u + i * 7u) % 253u) - 126);
    return (float)((pid * 2654435761u + i * 40503u) % 100003u) / 777.0f - 64.0f;
}

static void store(void *buf, uint64_t i, wsync_dtype_t dt, float v)
{
    if (dt == BF16) {
        ((uint16_t *)buf)[i] = wsync_f32_to_bf16(v);
    } else if (dt == F16) {
        ((uint16_t *)buf)[i] = wsync_f32_to_f16(v);
    } else {
        ((float *)buf)[i] = v;
    }
}

static ref_t ref_new(const char *name, wsync_dtype_t dt, int nd, const int64_t *shape, int pid)
{
    ref_t r;
    uint64_t n = volume(nd, shape);

    memset(&r, 0, sizeof(r));
    r.p.name = name;
    r.p.dtype = dt;
    r.p.ndim = nd;
    memcpy(r.p.shape, shape, (size_t)nd * sizeof(int64_t));
    r.full = zalloc(n * wsync_dtype_size(dt));
    for (uint64_t i = 0; i < n; i++)
        store(r.full, i, dt, formula(pid, i, dt));
    return r;
}

/* Copy a box `len` long from (src of shape sshape, at sstart) to (dst of shape dshape, at
 * dstart). */
static void box_copy(const void *src, const int64_t *sshape, const int64_t *sstart, void *dst,
                     const int64_t *dshape, const int64_t *dstart, const int64_t *len, int nd,
                     size_t esz)
{
    int64_t l[4] = {1, 1, 1, 1}, i[4];
    uint64_t ss[4], ds[4];

    for (int d = 0; d < nd; d++)
        l[d] = len[d];
    ss[nd - 1] = ds[nd - 1] = 1;
    for (int d = nd - 2; d >= 0; d--) {
        ss[d] = ss[d + 1] * (uint64_t)sshape[d + 1];
        ds[d] = ds[d + 1] * (uint64_t)dshape[d + 1];
    }
    for (i[0] = 0; i[0] < l[0]; i[0]++)
        for (i[1] = 0; i[1] < l[1]; i[1]++)
            for (i[2] = 0; i[2] < l[2]; i[2]++)
                for (i[3] = 0; i[3] < l[3]; i[3]++) {
                    uint64_t so = 0, dof = 0;
                    for (int d = 0; d < nd; d++) {
                        so += (uint64_t)(sstart[d] + i[d]) * ss[d];
                        dof += (uint64_t)(dstart[d] + i[d]) * ds[d];
                    }
                    memcpy((char *)dst + dof * esz, (const char *)src + so * esz, esz);
                }
}

static wsync_box_t box2(int64_t s0, int64_t l0, int64_t s1, int64_t l1)
{
    wsync_box_t b = {{s0, s1, 0, 0}, {l0, l1, 0, 0}};
    return b;
}

static wsync_box_t box1(int64_t s0, int64_t l0)
{
    wsync_box_t b = {{s0, 0, 0, 0}, {l0, 0, 0, 0}};
    return b;
}

/* The shard holding `box` of r, its data cut from the whole value (NULL when empty). */
static wsync_shard_t shard_of(const ref_t *r, wsync_box_t box)
{
    wsync_shard_t s;
    int64_t zero[4] = {0};
    uint64_t n = volume(r->p.ndim, box.len);

    memset(&s, 0, sizeof(s));
    s.param = r->p;
    s.box = box;
    s.mem = WSYNC_MEM_HOST;
    if (n > 0) {
        void *data = zalloc(n * wsync_dtype_size(r->p.dtype));
        box_copy(r->full, r->p.shape, box.start, data, box.len, zero, box.len, r->p.ndim,
                 wsync_dtype_size(r->p.dtype));
        s.data = data;
    }
    return s;
}

/* FSDP dim 0: rank i of n holds rows [i*c, (i+1)*c) with c = ceil(rows / n), clipped. */
static wsync_box_t fsdp_box(const ref_t *r, int i, int n)
{
    wsync_box_t b;
    int64_t rows = r->p.shape[0], c = (rows + n - 1) / n;
    int64_t s = WSYNC_MIN(i * c, rows);

    memset(&b, 0, sizeof(b));
    b.start[0] = s;
    b.len[0] = WSYNC_MIN(c, rows - s);
    for (int d = 1; d < r->p.ndim; d++)
        b.len[d] = r->p.shape[d];
    return b;
}

static wsync_box_t whole_box(const ref_t *r)
{
    wsync_box_t b;
    memset(&b, 0, sizeof(b));
    memcpy(b.len, r->p.shape, (size_t)r->p.ndim * sizeof(int64_t));
    return b;
}

static wsync_piece_t piece_of(const ref_t *r, wsync_box_t src, const int64_t *dst)
{
    wsync_piece_t p;
    memset(&p, 0, sizeof(p));
    p.param = r->p;
    p.src = src;
    if (dst != NULL)
        memcpy(p.dst_start, dst, (size_t)r->p.ndim * sizeof(int64_t));
    return p;
}

/* A target with one buffer (poisoned with 0xEE, so that unwritten bytes show). */
static wsync_target_t target_new(const char *name, wsync_dtype_t dt, int nd, const int64_t *shape,
                                 const wsync_piece_t *pieces, int npieces)
{
    wsync_target_t t;
    size_t bytes = volume(nd, shape) * wsync_dtype_size(dt);

    memset(&t, 0, sizeof(t));
    t.name = name;
    t.dtype = dt;
    t.ndim = nd;
    memcpy(t.shape, shape, (size_t)nd * sizeof(int64_t));
    t.data = zalloc(bytes);
    memset(t.data, 0xEE, bytes);
    t.mem = WSYNC_MEM_HOST;
    t.pieces = track(malloc(sizeof(*pieces) * (size_t)(npieces ? npieces : 1)));
    memcpy((void *)t.pieces, pieces, sizeof(*pieces) * (size_t)npieces);
    t.npieces = npieces;
    return t;
}

static float load(const void *buf, uint64_t i, wsync_dtype_t dt)
{
    if (dt == BF16)
        return wsync_bf16_to_f32(((const uint16_t *)buf)[i]);
    if (dt == F16)
        return wsync_f16_to_f32(((const uint16_t *)buf)[i]);
    return ((const float *)buf)[i];
}

/* What the target must hold: each piece cut dense from its param's whole value, cast with
 * convert.h when the dtypes differ, and placed; zero elsewhere. refs[k] is piece k's param. */
static void *expected_of(const wsync_target_t *t, const ref_t *const *refs)
{
    size_t esz = wsync_dtype_size(t->dtype);
    uint8_t *out = zalloc(volume(t->ndim, t->shape) * esz);
    int64_t zero[4] = {0};

    for (int k = 0; k < t->npieces; k++) {
        const wsync_piece_t *p = &t->pieces[k];
        const ref_t *r = refs[k];
        uint64_t pn = volume(t->ndim, p->src.len);
        size_t pesz = wsync_dtype_size(r->p.dtype);
        uint8_t *cut = zalloc(pn * pesz), *cast = zalloc(pn * esz);

        box_copy(r->full, r->p.shape, p->src.start, cut, p->src.len, zero, p->src.len, t->ndim,
                 pesz);
        for (uint64_t i = 0; i < pn; i++) {
            if (r->p.dtype == t->dtype)
                memcpy(cast + i * esz, cut + i * pesz, esz);
            else
                store(cast, i, t->dtype, load(cut, i, r->p.dtype));
        }
        box_copy(cast, p->src.len, zero, out, t->shape, p->dst_start, p->src.len, t->ndim, esz);
    }
    return out;
}

static int target_equals(const wsync_target_t *t, const ref_t *const *refs)
{
    size_t bytes = volume(t->ndim, t->shape) * wsync_dtype_size(t->dtype);
    const void *want = expected_of(t, refs);
    if (memcmp(t->data, want, bytes) != 0) {
        for (size_t i = 0; i < bytes; i++) {
            if (((const uint8_t *)t->data)[i] != ((const uint8_t *)want)[i]) {
                fprintf(stderr, "target '%s': first difference at byte %zu (%02x, want %02x)\n",
                        t->name, i, ((const uint8_t *)t->data)[i], ((const uint8_t *)want)[i]);
                break;
            }
        }
        return 0;
    }
    return 1;
}

/* Every invariant plan.h promises, checked on a plan. */
static void check_plan_shape(const wsync_plan_t *p)
{
    uint64_t base = 0;

    for (uint32_t i = 0; i < p->nchunks; i++) {
        const wsync_chunk_t *c = &p->chunks[i];
        uint64_t bytes = c->src.rows * c->src.cols * wsync_dtype_size(c->dtype);
        CHECK(bytes <= p->bucket_bytes);
        CHECK(c->bucket_off % 64 == 0);
        CHECK(c->bucket_off + bytes <= p->bucket_bytes);
        CHECK(c->bucket < p->nbuckets[c->sender]);
        if (i > 0) {
            const wsync_chunk_t *b = &p->chunks[i - 1];
            CHECK(b->sender < c->sender || (b->sender == c->sender && (b->bucket < c->bucket ||
                  (b->bucket == c->bucket && b->bucket_off < c->bucket_off))));
        }
    }
    for (uint32_t s = 0; s < p->nsenders; s++) {
        for (uint32_t b = 0; b < p->nbuckets[s]; b++)
            CHECK(p->bucket_used[base + b] > 0 && p->bucket_used[base + b] <= p->bucket_bytes);
        base += p->nbuckets[s];
    }
    /* wsync_plan_bucket_chunks: each sender's bucket k is exactly its chunks of bucket k */
    for (uint32_t s = 0; s < p->nsenders; s++) {
        uint32_t *start = calloc(p->nbuckets[s] + 1, sizeof(uint32_t)), mine = 0;
        if (start == NULL)
            continue;
        wsync_plan_bucket_chunks(p, s, start);
        for (uint32_t i = 0; i < p->nchunks; i++) {
            const wsync_chunk_t *c = &p->chunks[i];
            if (c->sender != s)
                continue;
            mine++;
            CHECK_MSG(start[c->bucket] <= i && i < start[c->bucket + 1],
                      "sender %u: chunk %u (bucket %u) outside [%u, %u)", s, i, c->bucket,
                      start[c->bucket], start[c->bucket + 1]);
        }
        CHECK(start[p->nbuckets[s]] - start[0] == mine);
        free(start);
    }
    wsync_segment_t *segs = NULL;
    CHECK_OK(wsync_plan_flatten(p, &segs));
    for (uint32_t i = 0; segs != NULL && i < p->nsegments; i++) {
        const wsync_segment_t *g = &segs[i];
        CHECK(g->chunk < p->nchunks);
        CHECK(g->dst.rows == p->chunks[g->chunk].src.rows);
        CHECK(g->dst.cols == p->chunks[g->chunk].src.cols);
        if (i > 0) {
            const wsync_segment_t *f = &segs[i - 1];
            CHECK(f->receiver < g->receiver ||
                  (f->receiver == g->receiver && f->chunk <= g->chunk));
        }
    }
    free(segs);
}

static wsync_status_t run(const wsync_shard_t *shards, const uint32_t *ss, size_t ns,
                          const wsync_target_t *targets, const uint32_t *tr, size_t nt,
                          uint32_t nsenders, uint32_t nreceivers, uint64_t bucket,
                          plan_sim_stats_t *stats, wsync_plan_t **plan)
{
    wsync_plan_t *local = NULL;
    wsync_status_t st = plan_sim_run_all(shards, ss, ns, targets, tr, nt, nsenders, nreceivers,
                                         bucket, stats, &local);
    if (st == WSYNC_OK)
        check_plan_shape(local);
    if (plan != NULL)
        *plan = local;
    else
        wsync_plan_free(local);
    return st;
}

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

/* ------------------------------------------------------------------------------------------ */
/* Layouts, bytes against the reference                                                         */
/* ------------------------------------------------------------------------------------------ */

/* FSDP dim 0 over 3 senders (uneven rows, and an empty last shard) → TP=2 column-parallel,
 * row-parallel and a 1-D bias. */
static void test_fsdp_to_tp(void)
{
    ref_t w = ref_new("model.layers.0.mlp.up_proj.weight", BF16, 2, SHAPE(10, 6), 1);
    ref_t v = ref_new("model.layers.0.mlp.down_proj.weight", BF16, 2, SHAPE(4, 6), 2);
    ref_t b = ref_new("model.layers.0.mlp.up_proj.bias", BF16, 1, SHAPE(10), 3);
    const ref_t *params[3] = {&w, &v, &b};
    wsync_shard_t shards[9];
    uint32_t ss[9], tr[6];
    wsync_target_t targets[6];
    const ref_t *refs[6][1];
    plan_sim_stats_t st;
    wsync_plan_t *plan = NULL;
    size_t ns = 0;

    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < 3; k++) {
            shards[ns] = shard_of(params[k], fsdp_box(params[k], i, 3));
            ss[ns++] = (uint32_t)i;
        }
    }
    CHECK(shards[7].data == NULL && shards[7].box.len[0] == 0);   /* v at sender 2: empty */
    CHECK(shards[6].box.len[0] == 2);                             /* w at sender 2: 2 rows */

    for (int r = 0; r < 2; r++) {
        wsync_piece_t pw = piece_of(&w, box2(5 * r, 5, 0, 6), NULL);
        wsync_piece_t pv = piece_of(&v, box2(0, 4, 3 * r, 3), NULL);
        wsync_piece_t pb = piece_of(&b, box1(5 * r, 5), NULL);
        targets[3 * r] = target_new("up_proj.weight", BF16, 2, SHAPE(5, 6), &pw, 1);
        targets[3 * r + 1] = target_new("down_proj.weight", BF16, 2, SHAPE(4, 3), &pv, 1);
        targets[3 * r + 2] = target_new("up_proj.bias", BF16, 1, SHAPE(5), &pb, 1);
        refs[3 * r][0] = &w;
        refs[3 * r + 1][0] = &v;
        refs[3 * r + 2][0] = &b;
        for (int k = 0; k < 3; k++)
            tr[3 * r + k] = (uint32_t)r;
    }
    CHECK_OK(run(shards, ss, ns, targets, tr, 6, 3, 2, MiB, &st, &plan));
    for (int i = 0; i < 6; i++)
        CHECK_MSG(target_equals(&targets[i], refs[i]), "target %d", i);
    if (plan != NULL) {
        /* worked by hand: receiver 0 needs w rows 0-4 (sender 0: 0-3, sender 1: 4), v cols 0-2
         * (rows 0-1 at sender 0, 2-3 at sender 1), b 0-4 (0-3, 4) */
        uint64_t want[3][2] = {{68, 12}, {26, 54}, {0, 28}};
        for (int s = 0; s < 3; s++)
            for (int r = 0; r < 2; r++)
                CHECK_MSG(plan->pair_bytes[s * 2 + r] == want[s][r], "pair %d,%d: %llu", s, r,
                          (unsigned long long)plan->pair_bytes[s * 2 + r]);
        CHECK(st.staged_bytes == 188 && st.delivered_bytes == 188);
    }
    wsync_plan_free(plan);
    arena_free();
}

/* Every param replicated on 4 senders; 4 receivers each take a TP=4 slice of two params into
 * one fused buffer: the reads are spread evenly over the senders. */
static void test_replicated_balanced(void)
{
    ref_t a = ref_new("model.gate_proj.weight", BF16, 2, SHAPE(64, 32), 4);
    ref_t b = ref_new("model.up_proj.weight", BF16, 2, SHAPE(64, 32), 5);
    wsync_shard_t shards[8];
    uint32_t ss[8], tr[4];
    wsync_target_t targets[4];
    const ref_t *refs[2] = {&a, &b};
    plan_sim_stats_t st;
    wsync_plan_t *plan = NULL;

    for (int i = 0; i < 4; i++) {
        shards[2 * i] = shard_of(&a, whole_box(&a));
        shards[2 * i + 1] = shard_of(&b, whole_box(&b));
        ss[2 * i] = ss[2 * i + 1] = (uint32_t)i;
    }
    for (int r = 0; r < 4; r++) {
        wsync_piece_t p[2] = {piece_of(&a, box2(16 * r, 16, 0, 32), SHAPE(0, 0)),
                              piece_of(&b, box2(16 * r, 16, 0, 32), SHAPE(16, 0))};
        targets[r] = target_new("gate_up_proj.weight", BF16, 2, SHAPE(32, 32), p, 2);
        tr[r] = (uint32_t)r;
    }
    CHECK_OK(run(shards, ss, 8, targets, tr, 4, 4, 4, MiB, &st, &plan));
    for (int r = 0; r < 4; r++)
        CHECK(target_equals(&targets[r], refs));
    if (plan != NULL) {
        for (int s = 0; s < 4; s++) {
            uint64_t sum = 0;
            for (int r = 0; r < 4; r++)
                sum += plan->pair_bytes[s * 4 + r];
            CHECK_MSG(sum == 2048, "sender %d serves %llu bytes, want 2048", s,
                      (unsigned long long)sum);
        }
        for (int r = 0; r < 4; r++) {
            uint64_t sum = 0;
            for (int s = 0; s < 4; s++)
                sum += plan->pair_bytes[s * 4 + r];
            CHECK(sum == 32 * 32 * 2);   /* each byte once per receiver */
        }
    }
    CHECK(st.staged_bytes == 4 * 2048 && st.delivered_bytes == 4 * 2048);
    wsync_plan_free(plan);
    arena_free();
}

/* Three replicas of one inference rank want the same target: the senders stage one copy. */
static void test_replica_targets_share_chunks(void)
{
    ref_t w = ref_new("model.q_proj.weight", BF16, 2, SHAPE(12, 8), 6);
    wsync_shard_t shards[2] = {shard_of(&w, fsdp_box(&w, 0, 2)), shard_of(&w, fsdp_box(&w, 1, 2))};
    uint32_t ss[2] = {0, 1}, tr[3] = {0, 1, 2};
    wsync_piece_t p = piece_of(&w, box2(0, 12, 0, 8), NULL);
    wsync_target_t targets[3];
    const ref_t *refs[1] = {&w};
    plan_sim_stats_t one, three;
    wsync_plan_t *plan = NULL;

    for (int r = 0; r < 3; r++)
        targets[r] = target_new("q_proj.weight", BF16, 2, SHAPE(12, 8), &p, 1);
    CHECK_OK(run(shards, ss, 2, targets, tr, 1, 2, 1, MiB, &one, NULL));
    CHECK_OK(run(shards, ss, 2, targets, tr, 3, 2, 3, MiB, &three, &plan));
    for (int r = 0; r < 3; r++)
        CHECK(target_equals(&targets[r], refs));
    CHECK(one.staged_bytes == 12 * 8 * 2);
    CHECK(three.staged_bytes == one.staged_bytes);            /* staged once */
    CHECK(three.delivered_bytes == 3 * one.delivered_bytes);
    CHECK(three.nchunks == one.nchunks);
    CHECK(three.nsegments == 3 * one.nsegments);
    if (plan != NULL) {
        wsync_segment_t *segs = NULL;
        CHECK_OK(wsync_plan_flatten(plan, &segs));
        for (uint32_t c = 0; segs != NULL && c < plan->nchunks; c++) {
            int users = 0;
            for (uint32_t i = 0; i < plan->nsegments; i++)
                users += segs[i].chunk == c;
            CHECK_MSG(users == 3, "chunk %u has %d segments", c, users);
        }
        free(segs);
    }
    wsync_plan_free(plan);
    arena_free();
}

/* bucket_bytes = 4096: a param larger than a bucket, and rows larger than a bucket. */
static void test_bucket_splitting(void)
{
    ref_t big = ref_new("model.big", F32, 2, SHAPE(64, 100), 7);      /* 25600 B, 400 B rows */
    ref_t wide = ref_new("model.wide", F32, 2, SHAPE(3, 1500), 8);    /* 6000 B rows */
    ref_t wide16 = ref_new("model.wide16", BF16, 2, SHAPE(5, 3000), 9);
    const ref_t *params[3] = {&big, &wide, &wide16};
    wsync_shard_t shards[6];
    uint32_t ss[6], tr[6];
    wsync_target_t targets[6];
    const ref_t *refs[6][1];
    wsync_plan_t *plan = NULL;
    plan_sim_stats_t st;
    int col_split = 0;

    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 3; k++) {
            shards[3 * i + k] = shard_of(params[k], fsdp_box(params[k], i, 2));
            ss[3 * i + k] = (uint32_t)i;
        }
    for (int r = 0; r < 2; r++) {
        wsync_piece_t pb = piece_of(&big, box2(32 * r, 32, 0, 100), NULL);
        wsync_piece_t pw = piece_of(&wide, whole_box(&wide), NULL);
        wsync_piece_t p16 = piece_of(&wide16, box2(0, 5, 1500 * r, 1500), NULL);
        targets[3 * r] = target_new("big", F32, 2, SHAPE(32, 100), &pb, 1);
        targets[3 * r + 1] = target_new("wide", F32, 2, SHAPE(3, 1500), &pw, 1);
        targets[3 * r + 2] = target_new("wide16", F32, 2, SHAPE(5, 1500), &p16, 1);  /* cast */
        refs[3 * r][0] = &big;
        refs[3 * r + 1][0] = &wide;
        refs[3 * r + 2][0] = &wide16;
        tr[3 * r] = tr[3 * r + 1] = tr[3 * r + 2] = (uint32_t)r;
    }
    CHECK_OK(run(shards, ss, 6, targets, tr, 6, 2, 2, 4096, &st, &plan));
    for (int i = 0; i < 6; i++)
        CHECK_MSG(target_equals(&targets[i], refs[i]), "target %d", i);
    if (plan != NULL) {
        for (uint32_t i = 0; i < plan->nchunks; i++)
            col_split |= plan->chunks[i].src.rows == 1 && plan->chunks[i].src.cols < 1500 &&
                         plan->chunks[i].dtype == F32;
        CHECK(col_split);
        CHECK(plan->nbuckets[0] > 5 && plan->nbuckets[1] > 5);
        /* whole param "wide" goes to both receivers but is staged once */
        CHECK(st.staged_bytes == (64 * 100 + 3 * 1500) * 4 + 5 * 3000 * 2);
    }
    wsync_plan_free(plan);
    arena_free();
}

/* bf16 ↔ f16 ↔ f32 casts, against convert.h. */
static void test_casts(void)
{
    ref_t a = ref_new("model.a", BF16, 2, SHAPE(6, 10), 10);
    ref_t b = ref_new("model.b", F32, 2, SHAPE(6, 10), 11);
    ref_t c = ref_new("model.c", F16, 2, SHAPE(6, 10), 12);
    const ref_t *params[3] = {&a, &b, &c};
    wsync_dtype_t to[6] = {F32, F16, BF16, F16, F32, BF16};
    const ref_t *from[6] = {&a, &a, &b, &b, &c, &c};
    wsync_shard_t shards[6];
    uint32_t ss[6], tr[6] = {0};
    wsync_target_t targets[6];

    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 3; k++) {
            shards[3 * i + k] = shard_of(params[k], fsdp_box(params[k], i, 2));
            ss[3 * i + k] = (uint32_t)i;
        }
    for (int k = 0; k < 6; k++) {
        wsync_piece_t p = piece_of(from[k], box2(1, 4, 2, 7), SHAPE(0, 1));
        targets[k] = target_new("cast", to[k], 2, SHAPE(4, 8), &p, 1);
    }
    CHECK_OK(run(shards, ss, 6, targets, tr, 6, 2, 1, 256, NULL, NULL));
    for (int k = 0; k < 6; k++)
        CHECK_MSG(target_equals(&targets[k], &from[k]), "cast %d", k);
    /* one value by hand: f32 → bf16 rounds to nearest even */
    {
        float v = ((const float *)b.full)[1 * 10 + 2];
        uint16_t got = ((const uint16_t *)targets[2].data)[0 * 8 + 1];
        CHECK(got == wsync_f32_to_bf16(v));
        CHECK(wsync_bf16_to_f32(got) != v || (uint32_t)v == v);
    }

    /* exec_copy alone, strided both sides: f32 [4, 5] rows 1-2, cols 1-3 → bf16 [3, 4] at
     * (1, 0) */
    {
        float src[20];
        uint16_t dst[12] = {0};
        wsync_region_t sr = {1 * 5 + 1, 5, 2, 3}, dr = {1 * 4 + 0, 4, 2, 3};
        for (int i = 0; i < 20; i++)
            src[i] = (float)i * 1.001f;
        CHECK_OK(wsync_exec_copy(src, F32, &sr, dst, BF16, &dr));
        for (int r = 0; r < 2; r++)
            for (int c2 = 0; c2 < 3; c2++)
                CHECK(dst[(1 + r) * 4 + c2] == wsync_f32_to_bf16(src[(1 + r) * 5 + 1 + c2]));
        CHECK(dst[0] == 0 && dst[3] == 0 && dst[7] == 0);
        dr.cols = 2;
        CHECK_ST(wsync_exec_copy(src, F32, &sr, dst, BF16, &dr), WSYNC_ERR_INVALID);
        dr.cols = 3;
        CHECK_ST(wsync_exec_copy(src, F32, &sr, dst, WSYNC_DTYPE_U8, &dr), WSYNC_ERR_UNSUPPORTED);
    }
    arena_free();
}

/* 3-D and 4-D params: boxes that cannot be one region (one per leading index), boxes that merge,
 * sub-boxes placed at offsets inside larger buffers, small buckets. */
static void test_3d_4d(void)
{
    ref_t e = ref_new("model.experts.w13", BF16, 3, SHAPE(4, 6, 5), 13);
    ref_t f = ref_new("model.conv.weight", F32, 4, SHAPE(3, 2, 4, 6), 14);
    const ref_t *params[2] = {&e, &f};
    wsync_shard_t shards[6];
    uint32_t ss[6], tr[10];
    wsync_target_t targets[10];
    const ref_t *refs[10][1];
    int nt = 0;

    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++) {
            shards[2 * i + k] = shard_of(params[k], fsdp_box(params[k], i, 3));
            ss[2 * i + k] = (uint32_t)i;
        }
    CHECK(shards[4].data == NULL);   /* e at sender 2: rows [4, 4) */
    for (int r = 0; r < 2; r++) {
        wsync_piece_t p1 = piece_of(&e, (wsync_box_t){{0, 3 * r, 0}, {4, 3, 5}}, NULL);
        wsync_piece_t p2 = piece_of(&e, (wsync_box_t){{2 * r, 0, 0}, {2, 6, 5}}, NULL);
        wsync_piece_t p3 = piece_of(&e, (wsync_box_t){{1, 2, 1}, {2, 3, 3}}, SHAPE(2, 4, 3));
        wsync_piece_t p4 =
            piece_of(&f, (wsync_box_t){{0, 1, 1, 0}, {3, 1, 2, 6}}, SHAPE(0, 0, 0, 0));
        targets[nt] = target_new("e.slice", BF16, 3, SHAPE(4, 3, 5), &p1, 1);
        refs[nt][0] = &e;
        tr[nt++] = (uint32_t)r;
        targets[nt] = target_new("e.rows", F32, 3, SHAPE(2, 6, 5), &p2, 1);
        refs[nt][0] = &e;
        tr[nt++] = (uint32_t)r;
        targets[nt] = target_new("e.padded", BF16, 3, SHAPE(5, 8, 7), &p3, 1);
        refs[nt][0] = &e;
        tr[nt++] = (uint32_t)r;
        targets[nt] = target_new("f.slice", BF16, 4, SHAPE(3, 1, 2, 6), &p4, 1);
        refs[nt][0] = &f;
        tr[nt++] = (uint32_t)r;
        /* whole trailing dims at the source, but a wider target: must not merge rows */
        wsync_piece_t p5 = piece_of(&e, whole_box(&e), SHAPE(0, r, 0));
        targets[nt] = target_new("e.wider", BF16, 3, SHAPE(4, 7, 5), &p5, 1);
        refs[nt][0] = &e;
        tr[nt++] = (uint32_t)r;
    }
    CHECK_OK(run(shards, ss, 6, targets, tr, (size_t)nt, 3, 2, 64, NULL, NULL));
    for (int i = 0; i < nt; i++)
        CHECK_MSG(target_equals(&targets[i], refs[i]), "target %d", i);
    arena_free();
}

/* Vocab padding: rows no piece covers are zeroed (the target starts full of 0xEE). */
static void test_vocab_padding(void)
{
    ref_t emb = ref_new("model.embed_tokens.weight", BF16, 2, SHAPE(10, 4), 15);
    wsync_shard_t shards[2] = {shard_of(&emb, fsdp_box(&emb, 0, 2)),
                               shard_of(&emb, fsdp_box(&emb, 1, 2))};
    uint32_t ss[2] = {0, 1}, tr[2] = {0, 1};
    wsync_piece_t p0 = piece_of(&emb, box2(0, 8, 0, 4), NULL);
    wsync_piece_t p1 = piece_of(&emb, box2(8, 2, 0, 4), NULL);
    wsync_target_t targets[2] = {target_new("embed", BF16, 2, SHAPE(8, 4), &p0, 1),
                                 target_new("embed", BF16, 2, SHAPE(8, 4), &p1, 1)};
    const ref_t *refs[1] = {&emb};

    CHECK_OK(run(shards, ss, 2, targets, tr, 2, 2, 2, MiB, NULL, NULL));
    CHECK(target_equals(&targets[0], refs) && target_equals(&targets[1], refs));
    for (int i = 2 * 4; i < 8 * 4; i++)
        CHECK(((const uint16_t *)targets[1].data)[i] == 0);

    /* zero_uncovered alone: two pieces with a column gap and a row gap */
    {
        wsync_piece_desc_t pd[2];
        wsync_target_desc_t t;
        uint8_t buf[5 * 6];
        memset(pd, 0, sizeof(pd));
        memset(&t, 0, sizeof(t));
        pd[0].src.len[0] = 3, pd[0].src.len[1] = 2;                         /* rows 0-2, cols 0-1 */
        pd[1].src.len[0] = 2, pd[1].src.len[1] = 2, pd[1].dst_start[0] = 1; /* rows 1-2, cols 4-5 */
        pd[1].dst_start[1] = 4;
        t.dtype = WSYNC_DTYPE_U8;
        t.ndim = 2;
        t.shape[0] = 5, t.shape[1] = 6;
        t.npieces = 2;
        t.pieces = pd;
        memset(buf, 0xEE, sizeof(buf));
        wsync_exec_zero_uncovered(&t, buf);
        for (int r = 0; r < 5; r++)
            for (int c = 0; c < 6; c++) {
                int covered = (r < 3 && c < 2) || (r >= 1 && r < 3 && c >= 4);
                CHECK_MSG(buf[r * 6 + c] == (covered ? 0xEE : 0), "(%d, %d)", r, c);
            }
    }
    arena_free();
}

/* Random layouts (fixed seed): FSDP by rows or columns, replicas, HSDP; targets of random
 * sub-boxes at random places in padded buffers, random casts, random bucket sizes. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static void test_random_layouts(void)
{
    static const wsync_dtype_t fl[3] = {BF16, F16, F32};
    static const uint64_t buckets[4] = {64, 192, 1024, 1 << 16};

    for (int iter = 0; iter < 200; iter++) {
        enum { NP = 3, NS = 4, NR = 3, MAXT = 12 };
        ref_t params[NP];
        char names[NP][32];
        wsync_shard_t shards[NP * NS];
        uint32_t ss[NP * NS], tr[MAXT];
        wsync_target_t targets[MAXT];
        const ref_t *refs[MAXT][1];
        size_t ns = 0, nt = 0;

        for (int k = 0; k < NP; k++) {
            int nd = 1 + (int)rnd(4);
            int64_t shape[4] = {1 + rnd(13), 1 + rnd(40), 0, 0};
            if (nd == 1)
                shape[0] *= shape[1];
            if (nd >= 3)   /* keep 3-D and 4-D params small */
                for (int d = 0; d < nd; d++)
                    shape[d] = 1 + rnd(d == 0 ? 7 : 5);
            snprintf(names[k], sizeof(names[k]), "p%d.%d", iter, k);
            params[k] = ref_new(names[k], fl[rnd(3)], nd, shape, iter * 8 + k);
            ref_t *p = &params[k];
            int mode = (int)rnd(4);
            for (int s = 0; s < NS; s++) {
                wsync_box_t b = whole_box(p);
                if (mode == 0) {                       /* FSDP rows */
                    b = fsdp_box(p, s, NS);
                } else if (mode == 1 && p->p.ndim >= 2) { /* shards along the last dim */
                    int l = p->p.ndim - 1;
                    int64_t c = (p->p.shape[l] + NS - 1) / NS;
                    int64_t st0 = WSYNC_MIN(s * c, p->p.shape[l]);
                    b.start[l] = st0;
                    b.len[l] = WSYNC_MIN(c, p->p.shape[l] - st0);
                } else if (mode == 2) {                /* HSDP: two replica groups of FSDP 2 */
                    b = fsdp_box(p, s % 2, 2);
                }                                      /* mode 3: replicated */
                shards[ns] = shard_of(p, b);
                ss[ns++] = (uint32_t)s;
            }
        }
        for (uint32_t r = 0; r < NR; r++) {
            int n = 1 + (int)rnd(4);
            for (int t = 0; t < n; t++) {
                ref_t *p = &params[rnd(NP)];
                int nd = p->p.ndim;
                wsync_box_t src;
                int64_t dst[4] = {0}, tshape[4] = {0};
                memset(&src, 0, sizeof(src));
                for (int d = 0; d < nd; d++) {
                    src.start[d] = rnd((uint32_t)p->p.shape[d]);
                    src.len[d] = 1 + rnd((uint32_t)(p->p.shape[d] - src.start[d]));
                    dst[d] = rnd(3);
                    tshape[d] = dst[d] + src.len[d] + rnd(3);
                }
                wsync_piece_t pc = piece_of(p, src, dst);
                wsync_dtype_t tdt = rnd(2) ? p->p.dtype : fl[rnd(3)];
                targets[nt] = target_new("t", tdt, nd, tshape, &pc, 1);
                refs[nt][0] = p;
                tr[nt++] = r;
            }
        }
        uint64_t bucket = buckets[rnd(4)];
        CHECK_OK(run(shards, ss, ns, targets, tr, nt, NS, NR, bucket, NULL, NULL));
        for (size_t i = 0; i < nt; i++)
            CHECK_MSG(target_equals(&targets[i], refs[i]), "iteration %d target %zu", iter, i);
        arena_free();
        if (check_failures)
            break;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Determinism                                                                                  */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    wsync_shard_desc_t shards[8];
    size_t ns;
    wsync_target_desc_t targets[8];
    size_t nt;
} descs_t;

static void descs_free(descs_t *d)
{
    for (size_t i = 0; i < d->ns; i++)
        wsync_shard_desc_clear(&d->shards[i]);
    for (size_t i = 0; i < d->nt; i++)
        wsync_target_desc_clear(&d->targets[i]);
    d->ns = d->nt = 0;
}

/* A small group: param [rows, 8] FSDP over 2 senders → 2 receivers, column-parallel. */
static void descs_make(descs_t *d, int64_t rows)
{
    ref_t w = ref_new("model.w", BF16, 2, SHAPE(rows, 8), 16);

    memset(d, 0, sizeof(*d));
    for (uint32_t i = 0; i < 2; i++) {
        wsync_shard_t s = shard_of(&w, fsdp_box(&w, (int)i, 2));
        CHECK_OK(wsync_shard_desc_from(&s, i, 0, &d->shards[d->ns++]));
    }
    for (uint32_t r = 0; r < 2; r++) {
        wsync_piece_t p = piece_of(&w, box2(r * rows / 2, rows / 2, 0, 8), NULL);
        wsync_target_t t = target_new("w", BF16, 2, SHAPE(rows / 2, 8), &p, 1);
        CHECK_OK(wsync_target_desc_from(&t, r, 0, &d->targets[d->nt++]));
    }
}

static uint64_t fingerprint_of(const descs_t *d, uint64_t bucket)
{
    wsync_plan_t *p = NULL;
    uint64_t fp = 0;

    CHECK_OK(wsync_plan_compile(d->shards, d->ns, d->targets, d->nt, 2, 2, bucket, &p));
    if (p != NULL)
        fp = p->fingerprint;
    wsync_plan_free(p);
    return fp;
}

static void test_determinism(void)
{
    descs_t a, b;

    descs_make(&a, 16);
    descs_make(&b, 20);
    uint64_t f1 = fingerprint_of(&a, 4096), f2 = fingerprint_of(&a, 4096);
    CHECK(f1 != 0 && f1 == f2);
    CHECK(fingerprint_of(&a, 128) != f1);          /* another bucket size: another plan */
    CHECK(fingerprint_of(&b, 4096) != f1);         /* another shape */

    /* the order of the descriptions does not matter */
    {
        wsync_shard_desc_t s[2] = {a.shards[1], a.shards[0]};
        wsync_target_desc_t t[2] = {a.targets[1], a.targets[0]};
        wsync_plan_t *p = NULL;
        CHECK_OK(wsync_plan_compile(s, 2, t, 2, 2, 2, 4096, &p));
        CHECK(p != NULL && p->fingerprint == f1);
        wsync_plan_free(p);
    }
    descs_free(&a);
    descs_free(&b);
    arena_free();
}

/* ------------------------------------------------------------------------------------------ */
/* Errors: codes, and messages naming what is wrong                                              */
/* ------------------------------------------------------------------------------------------ */

static wsync_status_t run_one(const wsync_shard_t *shards, size_t ns, const wsync_target_t *t,
                              uint32_t receiver)
{
    uint32_t ss[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    return plan_sim_run_all(shards, ss, ns, t, &receiver, 1, (uint32_t)ns, receiver + 1, MiB,
                            NULL, NULL);
}

static void test_errors(void)
{
    ref_t a = ref_new("model.a", BF16, 2, SHAPE(8, 4), 17);
    wsync_shard_t two[2] = {shard_of(&a, box2(0, 4, 0, 4)), shard_of(&a, box2(4, 4, 0, 4))};
    wsync_piece_t p;
    wsync_target_t t;

    /* unknown param */
    {
        ref_t z = a;
        z.p.name = "model.zzz";
        p = piece_of(&z, box2(0, 8, 0, 4), NULL);
        t = target_new("model.t", BF16, 2, SHAPE(8, 4), &p, 1);
        CHECK_ST(run_one(two, 2, &t, 1), WSYNC_ERR_MISMATCH);
        CHECK_ERR_HAS("receiver 1 target 'model.t' asks for param 'model.zzz', which no sender "
                      "holds");
    }
    /* the receiver expects another dtype */
    {
        ref_t z = a;
        z.p.dtype = F32;
        p = piece_of(&z, box2(0, 8, 0, 4), NULL);
        t = target_new("model.t", F32, 2, SHAPE(8, 4), &p, 1);
        CHECK_ST(run_one(two, 2, &t, 0), WSYNC_ERR_MISMATCH);
        CHECK_ERR_HAS("'model.a'");
        CHECK_ERR_HAS("bf16 [8, 4] at the senders");
        CHECK_ERR_HAS("f32 [8, 4]");
        CHECK_ERR_HAS("receiver 0");
    }
    /* ... or another shape */
    {
        ref_t z = a;
        z.p.shape[1] = 5;
        p = piece_of(&z, box2(0, 8, 0, 4), NULL);
        t = target_new("model.t", BF16, 2, SHAPE(8, 4), &p, 1);
        CHECK_ST(run_one(two, 2, &t, 0), WSYNC_ERR_MISMATCH);
        CHECK_ERR_HAS("'model.a'");
        CHECK_ERR_HAS("[8, 5]");
    }
    /* two senders disagree */
    {
        wsync_shard_t s[2] = {two[0], two[1]};
        s[1].param.shape[0] = 9;
        p = piece_of(&a, box2(0, 8, 0, 4), NULL);
        t = target_new("model.t", BF16, 2, SHAPE(8, 4), &p, 1);
        CHECK_ST(run_one(s, 2, &t, 0), WSYNC_ERR_MISMATCH);
        CHECK_ERR_HAS("param 'model.a': sender 0 describes it as bf16 [8, 4], sender 1 as bf16 "
                      "[9, 4]");
    }
    /* partial overlap */
    {
        wsync_shard_t s[2] = {shard_of(&a, box2(0, 4, 0, 4)), shard_of(&a, box2(2, 6, 0, 4))};
        p = piece_of(&a, box2(0, 8, 0, 4), NULL);
        t = target_new("model.t", BF16, 2, SHAPE(8, 4), &p, 1);
        CHECK_ST(run_one(s, 2, &t, 0), WSYNC_ERR_MISMATCH);
        CHECK_ERR_HAS("param 'model.a'");
        CHECK_ERR_HAS("sender 0 [0:4, 0:4]");
        CHECK_ERR_HAS("sender 1 [2:8, 0:4]");
        CHECK_ERR_HAS("overlap");
    }
    /* a box no sender covers: rows 3-4 of 0-7 */
    {
        wsync_shard_t s[2] = {shard_of(&a, box2(0, 3, 0, 4)), shard_of(&a, box2(5, 3, 0, 4))};
        p = piece_of(&a, box2(0, 8, 0, 4), NULL);
        t = target_new("model.t", BF16, 2, SHAPE(8, 4), &p, 1);
        CHECK_ST(run_one(s, 2, &t, 0), WSYNC_ERR_MISMATCH);
        CHECK_ERR_HAS("8 of 32 elements of param 'model.a' box [0:8, 0:4] are held by no sender");
        CHECK_ERR_HAS("first is at index [3, 0]");
        /* an uncovered corner found by box subtraction: columns 2-3 of row 7 missing */
        wsync_shard_t c[3] = {shard_of(&a, box2(0, 7, 0, 4)), shard_of(&a, box2(7, 1, 0, 2)),
                              shard_of(&a, box2(7, 1, 3, 1))};
        CHECK_ST(run_one(c, 3, &t, 0), WSYNC_ERR_MISMATCH);
        CHECK_ERR_HAS("1 of 32 elements");
        CHECK_ERR_HAS("first is at index [7, 2]");
    }
    /* a piece outside its param: refused at description time... */
    {
        p = piece_of(&a, box2(6, 4, 0, 4), NULL);
        t = target_new("model.t", BF16, 2, SHAPE(8, 4), &p, 1);
        wsync_target_desc_t d;
        CHECK_ST(wsync_target_desc_from(&t, 0, 0, &d), WSYNC_ERR_INVALID);
        CHECK_ERR_HAS("'model.a'");
        CHECK_ERR_HAS("[6:10, 0:4]");
        /* ...and by the compiler, when a description skipped that check */
        wsync_shard_desc_t sd[2];
        wsync_piece_desc_t pd;
        wsync_target_desc_t td;
        CHECK_OK(wsync_shard_desc_from(&two[0], 0, 0, &sd[0]));
        CHECK_OK(wsync_shard_desc_from(&two[1], 1, 0, &sd[1]));
        memset(&pd, 0, sizeof(pd));
        memset(&td, 0, sizeof(td));
        pd.param.name = (char *)"model.a";
        pd.param.dtype = BF16;
        pd.param.ndim = 2;
        pd.param.shape[0] = 8, pd.param.shape[1] = 4;
        pd.src = box2(6, 4, 0, 4);
        td.name = (char *)"model.t";
        td.dtype = BF16;
        td.ndim = 2;
        td.shape[0] = 8, td.shape[1] = 4;
        td.npieces = 1;
        td.pieces = &pd;
        wsync_plan_t *pl = NULL;
        CHECK_ST(wsync_plan_compile(sd, 2, &td, 1, 2, 1, MiB, &pl), WSYNC_ERR_INVALID);
        CHECK_ERR_HAS("param 'model.a'");
        CHECK_ERR_HAS("[6:10, 0:4]");
        CHECK(pl == NULL);
        /* destination outside the target */
        pd.src = box2(0, 4, 0, 4);
        pd.dst_start[0] = 6;
        CHECK_ST(wsync_plan_compile(sd, 2, &td, 1, 2, 1, MiB, &pl), WSYNC_ERR_INVALID);
        CHECK_ERR_HAS("target 'model.t'");
        CHECK_ERR_HAS("outside the target");
        /* a target dtype that cannot be made from the param */
        pd.dst_start[0] = 0;
        td.dtype = WSYNC_DTYPE_U8;
        CHECK_ST(wsync_plan_compile(sd, 2, &td, 1, 2, 1, MiB, &pl), WSYNC_ERR_MISMATCH);
        CHECK_ERR_HAS("target 'model.t' (u8) cannot be filled from param 'model.a' (bf16)");
        td.dtype = WSYNC_DTYPE_F8E4M3FN;                 /* FP8 needs a quant scheme */
        CHECK_ST(wsync_plan_compile(sd, 2, &td, 1, 2, 1, MiB, &pl), WSYNC_ERR_MISMATCH);
        CHECK_ERR_HAS("no quant");
        td.quant = WSYNC_QUANT_BLOCK;
        CHECK_OK(wsync_plan_compile(sd, 2, &td, 1, 2, 1, MiB, &pl));
        wsync_plan_free(pl);
        /* bad arguments */
        CHECK_ST(wsync_plan_compile(sd, 2, &td, 1, 2, 1, 32, &pl), WSYNC_ERR_INVALID);
        CHECK_ST(wsync_plan_compile(sd, 2, &td, 1, 1, 1, MiB, &pl), WSYNC_ERR_INVALID);
        CHECK_ERR_HAS("sender rank 1");
        CHECK_ST(wsync_plan_compile(sd, 2, &td, 1, 0, 1, MiB, &pl), WSYNC_ERR_INVALID);
        free(sd[0].param.name);
        free(sd[1].param.name);
    }
    /* an FP8 target with a quant compiles, but the CPU executor leaves quantizing to the
     * receiver */
    {
        p = piece_of(&a, box2(0, 8, 0, 4), NULL);
        t = target_new("model.t", WSYNC_DTYPE_F8E4M3FN, 2, SHAPE(8, 4), &p, 1);
        t.quant.scheme = WSYNC_QUANT_TENSOR;
        CHECK_ST(run_one(two, 2, &t, 0), WSYNC_ERR_UNSUPPORTED);
    }
    arena_free();
}

static void test_desc_validation(void)
{
    ref_t a = ref_new("model.a", BF16, 2, SHAPE(8, 4), 18);
    wsync_shard_t s = shard_of(&a, box2(0, 4, 0, 4));
    wsync_shard_desc_t sd;
    wsync_target_desc_t td;
    wsync_piece_t p[2];
    wsync_target_t t;

    s.param.name = NULL;
    CHECK_ST(wsync_shard_desc_from(&s, 0, 0, &sd), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("name is NULL");
    s.param.name = "";
    CHECK_ST(wsync_shard_desc_from(&s, 0, 0, &sd), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("empty");
    s.param.name = "model.a";
    s.param.ndim = 5;
    CHECK_ST(wsync_shard_desc_from(&s, 0, 0, &sd), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("'model.a' has ndim 5");
    s.param.ndim = 2;
    s.param.dtype = (wsync_dtype_t)99;
    CHECK_ST(wsync_shard_desc_from(&s, 0, 0, &sd), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("dtype");
    s.param.dtype = BF16;
    s.param.shape[1] = 0;
    CHECK_ST(wsync_shard_desc_from(&s, 0, 0, &sd), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("shape");
    s.param.shape[1] = 4;
    s.box = box2(6, 4, 0, 4);
    CHECK_ST(wsync_shard_desc_from(&s, 0, 0, &sd), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("box [6:10, 0:4] of param 'model.a'");
    s.box = box2(-1, 2, 0, 4);
    CHECK_ST(wsync_shard_desc_from(&s, 0, 0, &sd), WSYNC_ERR_INVALID);
    s.box = box2(0, 4, 0, 4);
    s.data = NULL;
    CHECK_ST(wsync_shard_desc_from(&s, 0, 0, &sd), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("data is NULL");
    s.box = box2(8, 0, 0, 4);                           /* empty: no data needed */
    CHECK_OK(wsync_shard_desc_from(&s, 3, 7, &sd));
    CHECK(sd.sender == 3 && sd.index == 7 && strcmp(sd.param.name, "model.a") == 0);
    CHECK(sd.param.name != s.param.name);               /* owned copy */
    wsync_shard_desc_clear(&sd);
    CHECK(sd.param.name == NULL);

    p[0] = piece_of(&a, box2(0, 4, 0, 4), SHAPE(0, 0));
    p[1] = piece_of(&a, box2(4, 4, 0, 4), SHAPE(3, 0));  /* overlaps row 3 */
    t = target_new("model.t", BF16, 2, SHAPE(8, 4), p, 2);
    CHECK_ST(wsync_target_desc_from(&t, 0, 0, &td), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("pieces 0 (param 'model.a') and 1 (param 'model.a') land on the same elements");
    p[1].dst_start[0] = 4;
    t = target_new("model.t", BF16, 2, SHAPE(8, 4), p, 2);
    CHECK_OK(wsync_target_desc_from(&t, 0, 0, &td));
    CHECK(td.npieces == 2 && td.pieces[1].dst_start[0] == 4);
    wsync_target_desc_clear(&td);
    CHECK(td.pieces == NULL && td.npieces == 0);
    t.npieces = 1;
    t.pieces = NULL;
    CHECK_ST(wsync_target_desc_from(&t, 0, 0, &td), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("pieces is NULL");
    t.pieces = p;
    t.data = NULL;
    CHECK_ST(wsync_target_desc_from(&t, 0, 0, &td), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("data is NULL");
    t.data = a.full;
    t.ndim = 1;                                          /* a piece keeps its dims */
    CHECK_ST(wsync_target_desc_from(&t, 0, 0, &td), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("'model.a' has 2 dims, the target 1");
    t.ndim = 2;
    p[0].dst_start[1] = 1;                               /* cols 1-4 of a 4-wide target */
    CHECK_ST(wsync_target_desc_from(&t, 0, 0, &td), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("dst [0:4, 1:5] lies outside the target [8, 4]");
    arena_free();
}

/* ------------------------------------------------------------------------------------------ */
/* Codec                                                                                        */
/* ------------------------------------------------------------------------------------------ */

/* The encoded plan of a small group with several chunks and segments. */
static void sample_plan(wsync_wbuf_t *wb, wsync_plan_t **out)
{
    descs_t d;
    wsync_plan_t *p = NULL;

    descs_make(&d, 16);
    CHECK_OK(wsync_plan_compile(d.shards, d.ns, d.targets, d.nt, 2, 2, 64, &p));
    wsync_wbuf_init(wb);
    if (p != NULL)
        wsync_plan_encode(p, wb);
    CHECK(!wb->err && wb->len > 40);
    descs_free(&d);
    *out = p;
}

static void reseal(uint8_t *buf, size_t len)
{
    uint64_t h = XXH3_64bits(buf, len - 8);
    for (int i = 0; i < 8; i++)
        buf[len - 8 + (size_t)i] = (uint8_t)(h >> (8 * i));
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void test_plan_round_trip(void)
{
    wsync_wbuf_t wb;
    wsync_plan_t *p, *q = NULL;

    sample_plan(&wb, &p);
    if (p == NULL)
        return;
    CHECK(p->nchunks >= 4 && p->nsegments >= 4);
    CHECK_OK(wsync_plan_decode(wb.data, wb.len, &q));
    if (q != NULL) {
        uint64_t nb = 0;
        CHECK(q->nsenders == p->nsenders && q->nreceivers == p->nreceivers);
        CHECK(q->bucket_bytes == p->bucket_bytes && q->fingerprint == p->fingerprint);
        CHECK(q->nchunks == p->nchunks && q->nsegments == p->nsegments);
        for (uint32_t i = 0; i < p->nchunks && i < q->nchunks; i++) {
            const wsync_chunk_t *a = &p->chunks[i], *b = &q->chunks[i];
            CHECK(a->sender == b->sender && a->shard == b->shard && a->dtype == b->dtype &&
                  a->bucket == b->bucket && a->bucket_off == b->bucket_off &&
                  a->src.off == b->src.off && a->src.pitch == b->src.pitch &&
                  a->src.rows == b->src.rows && a->src.cols == b->src.cols);
        }
        wsync_segment_t *ps = NULL, *qs = NULL;
        CHECK_OK(wsync_plan_flatten(p, &ps));
        CHECK_OK(wsync_plan_flatten(q, &qs));
        for (uint32_t i = 0; ps && qs && i < p->nsegments && i < q->nsegments; i++) {
            const wsync_segment_t *a = &ps[i], *b = &qs[i];
            CHECK(a->receiver == b->receiver && a->target == b->target && a->piece == b->piece &&
                  a->chunk == b->chunk && a->dst.off == b->dst.off &&
                  a->dst.pitch == b->dst.pitch && a->dst.rows == b->dst.rows &&
                  a->dst.cols == b->dst.cols);
        }
        free(ps);
        free(qs);
        for (uint32_t s = 0; s < p->nsenders; s++) {
            CHECK(q->nbuckets[s] == p->nbuckets[s]);
            nb += p->nbuckets[s];
        }
        for (uint64_t i = 0; i < nb; i++)
            CHECK(q->bucket_used[i] == p->bucket_used[i]);
        for (uint32_t i = 0; i < p->nsenders * p->nreceivers; i++)
            CHECK(q->pair_bytes[i] == p->pair_bytes[i]);
    }
    wsync_plan_free(p);
    wsync_plan_free(q);
    wsync_wbuf_free(&wb);
    arena_free();
}

static void expect_protocol(const uint8_t *buf, size_t len, const char *needle)
{
    wsync_plan_t *q = NULL;
    CHECK_ST(wsync_plan_decode(buf, len, &q), WSYNC_ERR_PROTOCOL);
    CHECK(q == NULL);
    if (needle != NULL)
        CHECK_ERR_HAS(needle);
    wsync_plan_free(q);
}

static void test_plan_decode_hostile(void)
{
    wsync_wbuf_t wb;
    wsync_plan_t *p;
    uint8_t *buf;
    size_t len;

    sample_plan(&wb, &p);
    if (p == NULL)
        return;
    len = wb.len;
    buf = zalloc(len + 1);

    /* every truncation */
    for (size_t n = 0; n < len; n++)
        expect_protocol(wb.data, n, NULL);
    /* every byte flipped, three ways */
    for (size_t i = 0; i < len; i++) {
        static const uint8_t masks[3] = {0x01, 0x80, 0xff};
        for (int m = 0; m < 3; m++) {
            memcpy(buf, wb.data, len);
            buf[i] ^= masks[m];
            expect_protocol(buf, len, NULL);
        }
    }
    /* a trailing byte: the fingerprint no longer covers the body */
    memcpy(buf, wb.data, len);
    buf[len] = 0;
    expect_protocol(buf, len + 1, "fingerprint");

    /* well-sealed but hostile header (version 2: magic 0, version 4, flags 6, nsenders 8,
     * nreceivers 12, bucket_bytes 16, nchunks 24, nsegments 28, records from 32) */
#define HOSTILE(edit, needle)                                                                 \
    do {                                                                                      \
        memcpy(buf, wb.data, len);                                                            \
        edit;                                                                                 \
        reseal(buf, len);                                                                     \
        expect_protocol(buf, len, needle);                                                    \
    } while (0)
    HOSTILE(put32(buf + 24, 0xffffffffu), "chunk count");
    HOSTILE(put32(buf + 28, 0x7fffffffu), "segments (at most");
    HOSTILE(put32(buf + 28, p->nsegments + 1), "the header says");
    HOSTILE(put32(buf + 28, p->nsegments - 1), "segments");
    HOSTILE(buf[4] = 1, "version");
    HOSTILE(put32(buf + 8, 0), "senders");
    HOSTILE(put32(buf + 8, 0xffffffffu), "senders");
    HOSTILE(put32(buf + 12, 1u << 30), "receivers");
    HOSTILE(put64(buf + 16, 0), "bucket");
    HOSTILE(put64(buf + 16, ~0ull), "bucket");
#undef HOSTILE

    /* hostile records: the plan edited, then encoded (the encoder codes whatever it is given,
     * and seals it), so every field is reached through the records' coding */
#define EDITED(edit, needle)                                                                  \
    do {                                                                                      \
        wsync_wbuf_t eb;                                                                      \
        wsync_plan_t *e = NULL;                                                               \
        wsync_wbuf_init(&eb);                                                                 \
        CHECK_OK(wsync_plan_decode(wb.data, wb.len, &e));                                     \
        if (e != NULL) {                                                                      \
            wsync_segment_t *S = NULL;                                                        \
            CHECK_OK(wsync_plan_flatten(e, &S));                                              \
            e->wire_bytes = 0;                                                                \
            edit;                                                                             \
            if (S != NULL)                                                                    \
                wsync_plan_encode_flat(e, S, e->nsegments, &eb);                              \
            free(S);                                                                          \
            CHECK(!eb.err);                                                                   \
            expect_protocol(eb.data, eb.len, needle);                                         \
        }                                                                                     \
        wsync_plan_free(e);                                                                   \
        wsync_wbuf_free(&eb);                                                                 \
    } while (0)
    EDITED(e->chunks[0].sender = 99, "names sender 99");
    EDITED(e->chunks[0].dtype = (wsync_dtype_t)77, "unknown dtype");
    EDITED(e->chunks[0].src.rows = 0, "malformed region");
    EDITED(e->chunks[0].src.rows = 1ull << 62, "chunk 0");
    EDITED(e->chunks[0].src.rows = 5, "does not fit");          /* 5 rows of 16 B > 64 B */
    EDITED(e->chunks[0].src.cols = ~0ull, "malformed region");
    EDITED(e->chunks[0].src.off = ~0ull - 3, "malformed region");
    EDITED(e->chunks[0].bucket_off = 8, "does not fit");
    EDITED(e->chunks[0].bucket_off = 1ull << 40, "does not fit");
    EDITED(e->chunks[0].bucket = 5, "out of order");
    EDITED(e->chunks[1].bucket = e->chunks[0].bucket + 7, "out of order");
    EDITED(S[0].chunk = 1u << 20, "chunk 1048576");
    EDITED(S[0].dst.off = ~0ull - 3, "does not match chunk");
    EDITED(S[0].chunk = S[1].chunk + 1, "out of order");
#undef EDITED
    {
        const wsync_segment_t *r0;
        uint32_t n0 = 0;
        CHECK_OK(wsync_plan_segments(p, 0, &r0, &n0));
        CHECK(n0 >= 2);   /* receiver 0 has segments 0 and 1: so the last edit tests order */
    }

    /* garbage after a valid magic, of many lengths */
    for (int i = 0; i < 2000; i++) {
        size_t n = 8 + rnd(300);
        uint8_t *g = malloc(n);
        for (size_t k = 0; k < n; k++)
            g[k] = (uint8_t)rnd(256);
        memcpy(g, wb.data, 8);
        if (rnd(2))
            reseal(g, n);
        expect_protocol(g, n, NULL);
        free(g);
    }
    {
        wsync_plan_t *q = NULL;
        CHECK_ST(wsync_plan_decode(NULL, 0, &q), WSYNC_ERR_PROTOCOL);
    }
    wsync_plan_free(p);
    wsync_wbuf_free(&wb);
    arena_free();
}

/* The version 2 coding written out by hand, as plan_wire.c documents it: one f32 chunk [1, 4],
 * receiver 0 takes it as a literal, receiver 1 copies receiver 0's segment. Then the copies and
 * literals a hostile coordinator could send. */
static size_t hand_plan(uint8_t *buf, const uint8_t *seg1, size_t nseg1, uint32_t nsegments)
{
    static const uint8_t head[] = {'W', 'S', 'P', 'L', 2, 0, 0, 0};
    static const uint8_t chunk_and_r0[] = {
        0xb0, 0x04, 3, 2, 8,   /* chunk: flags dtype|rows|cols (0x230), f32, rows +1, cols +4 */
        1, 0,                  /* receiver 0: 1 segment, no reference */
        0x0c, 1, 8};           /* literal: chunk -1 from the predicted 1, pitch +4 */
    size_t n = 0;

    memcpy(buf, head, sizeof(head));
    n += sizeof(head);
    put32(buf + n, 1);                       /* senders */
    put32(buf + n + 4, 2);                   /* receivers */
    put64(buf + n + 8, 64);                  /* bucket bytes */
    put32(buf + n + 16, 1);                  /* chunks */
    put32(buf + n + 20, nsegments);
    n += 24;
    memcpy(buf + n, chunk_and_r0, sizeof(chunk_and_r0));
    n += sizeof(chunk_and_r0);
    memcpy(buf + n, seg1, nseg1);
    n += nseg1 + 8;
    reseal(buf, n);
    return n;
}

static void test_plan_wire_v2_by_hand(void)
{
    uint8_t buf[128];
    wsync_plan_t *q = NULL;
    size_t n;
    static const uint8_t copy1[] = {1, 1, 0x80, 1};          /* 1 segment, reference 1 back */

    n = hand_plan(buf, copy1, sizeof(copy1), 2);
    CHECK_OK(wsync_plan_decode(buf, n, &q));
    if (q != NULL) {
        CHECK(q->nchunks == 1 && q->nsegments == 2 && q->wire_bytes == n);
        CHECK(q->chunks[0].dtype == WSYNC_DTYPE_F32 && q->chunks[0].src.rows == 1 &&
              q->chunks[0].src.cols == 4 && q->chunks[0].src.pitch == 4 &&
              q->chunks[0].src.off == 0 && q->chunks[0].bucket_off == 0);
        for (uint32_t i = 0; i < 2; i++) {
            const wsync_segment_t *g = NULL;
            uint32_t ng = 0;
            CHECK_OK(wsync_plan_segments(q, i, &g, &ng));
            CHECK(ng == 1 && g[0].receiver == i && g[0].chunk == 0 && g[0].target == 0 &&
                  g[0].dst.pitch == 4 && g[0].dst.rows == 1 && g[0].dst.cols == 4);
        }
        CHECK(q->nlists == 1);    /* receiver 1's copy is receiver 0's list */
        CHECK(q->pair_bytes[0] == 16 && q->pair_bytes[1] == 16);
        {   /* and the encoder writes exactly these bytes */
            wsync_wbuf_t b;
            wsync_wbuf_init(&b);
            wsync_plan_encode(q, &b);
            CHECK(b.len == n && memcmp(b.data, buf, n) == 0);
            wsync_wbuf_free(&b);
        }
    }
    wsync_plan_free(q);
    {
        static const uint8_t tdelta[] = {1, 1, 0x82, 1, 6};  /* copy with target + 3 */
        q = NULL;
        n = hand_plan(buf, tdelta, sizeof(tdelta), 2);
        CHECK_OK(wsync_plan_decode(buf, n, &q));
        {
            const wsync_segment_t *g = NULL;
            uint32_t ng = 0;
            if (q != NULL)
                CHECK_OK(wsync_plan_segments(q, 1, &g, &ng));
            CHECK(q != NULL && ng == 1 && g[0].target == 3);
        }
        wsync_plan_free(q);
    }
#define HAND(bytes, nsegs, needle)                                                            \
    do {                                                                                      \
        static const uint8_t b_[] = bytes;                                                    \
        n = hand_plan(buf, b_, sizeof(b_), nsegs);                                            \
        expect_protocol(buf, n, needle);                                                      \
    } while (0)
#define B(...) {__VA_ARGS__}
    HAND(B(1, 1, 0x80, 2), 2, "a copy of 2");                /* more than the reference has */
    HAND(B(2, 1, 0x80, 2), 3, "a copy of 2");                /* the reference has 1 */
    HAND(B(1, 1, 0x81, 1, 1), 2, "after skipping 1");        /* skips past its end */
    HAND(B(1, 1, 0x80, 0), 2, "a copy of 0");
    HAND(B(1, 2, 0x80, 1), 2, "reference 2 back");           /* before receiver 0 */
    HAND(B(1, 0, 0x80, 1), 2, "of the reference's 0");       /* copy with no reference */
    HAND(B(1, 1, 0x84, 1), 2, "unknown flags 0x84");
    HAND(B(1, 0, 0x20), 2, "unknown flags 0x20");            /* literal */
    HAND(B(1, 0, 0x04, 0), 2, "chunk 1 of 1");               /* literal naming chunk 1 */
    HAND(B(1, 0, 0x1f), 2, "truncated at segment 1");
    HAND(B(1, 1, 0x80, 1), 1, "receiver 1 has 1 segments (0 of 1 left)");
    HAND(B(1, 1, 0x80, 1, 0), 2, "trailing");
    /* the same plan as copy1, receiver 1's segment a literal: decodes, but is not the encoding
     * wsync makes of it */
    HAND(B(1, 0, 0x14, 1, 7), 2, "not in canonical form");
    HAND(B(1, 1, 0x81, 0, 1), 2, "not in canonical form");   /* a skip of 0 stated */
    HAND(B(1, 1, 0x80, 0x81, 0), 2, "not in canonical form"); /* a varint of 2 bytes for 1 */
    HAND(B(1, 1, 0x80, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f), 2,
         "truncated at segment 1");                          /* a varint past 64 bits */
#undef B
#undef HAND
    arena_free();
}

static void test_check_sender_receiver(void)
{
    descs_t d;
    wsync_plan_t *p = NULL;

    descs_make(&d, 16);
    CHECK_OK(wsync_plan_compile(d.shards, d.ns, d.targets, d.nt, 2, 2, 128, &p));
    if (p == NULL) {
        descs_free(&d);
        return;
    }
    CHECK_OK(wsync_plan_check_sender(p, 0, d.shards, d.ns));
    CHECK_OK(wsync_plan_check_sender(p, 1, d.shards, d.ns));
    CHECK_OK(wsync_plan_check_receiver(p, 0, d.targets, d.nt));
    CHECK_OK(wsync_plan_check_receiver(p, 1, d.targets, d.nt));
    CHECK_ST(wsync_plan_check_sender(p, 2, d.shards, d.ns), WSYNC_ERR_PROTOCOL);

    /* sender 0 lacks the shard its chunks read */
    CHECK_ST(wsync_plan_check_sender(p, 0, d.shards + 1, 1), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("shard 0 of sender 0");
    /* a chunk reaching past its shard */
    {
        wsync_chunk_t saved = p->chunks[0];
        p->chunks[0].src.off = 8 * 8 - 1;
        CHECK_ST(wsync_plan_check_sender(p, p->chunks[0].sender, d.shards, d.ns),
                 WSYNC_ERR_PROTOCOL);
        CHECK_ERR_HAS("'model.w'");
        p->chunks[0] = saved;
        p->chunks[0].dtype = F32;
        CHECK_ST(wsync_plan_check_sender(p, p->chunks[0].sender, d.shards, d.ns),
                 WSYNC_ERR_PROTOCOL);
        p->chunks[0] = saved;
    }
    /* segments: past the target, an unknown piece or target */
    {   /* edited in a flat copy, the plan's lists rebuilt from it */
        wsync_segment_t *S = NULL, saved;
        uint32_t r, n = p->nsegments;
        CHECK_OK(wsync_plan_flatten(p, &S));
        if (S == NULL)
            goto done;
        saved = S[0];
        r = saved.receiver;
        S[0].dst.off = 8 * 8;
        CHECK_OK(wsync_plan_set_segments(p, S, n));
        CHECK_ST(wsync_plan_check_receiver(p, r, d.targets, d.nt), WSYNC_ERR_PROTOCOL);
        CHECK_ERR_HAS("target 'w'");
        S[0] = saved;
        S[0].piece = 3;
        CHECK_OK(wsync_plan_set_segments(p, S, n));
        CHECK_ST(wsync_plan_check_receiver(p, r, d.targets, d.nt), WSYNC_ERR_PROTOCOL);
        CHECK_ERR_HAS("piece 3");
        S[0] = saved;
        S[0].target = 9;
        CHECK_OK(wsync_plan_set_segments(p, S, n));
        CHECK_ST(wsync_plan_check_receiver(p, r, d.targets, d.nt), WSYNC_ERR_PROTOCOL);
        S[0] = saved;
        CHECK_OK(wsync_plan_set_segments(p, S, n));
        CHECK_OK(wsync_plan_check_receiver(p, r, d.targets, d.nt));
        d.targets[r].dtype = WSYNC_DTYPE_U8;
        CHECK_ST(wsync_plan_check_receiver(p, r, d.targets, d.nt), WSYNC_ERR_PROTOCOL);
        d.targets[r].dtype = BF16;
        free(S);
    }
done:
    wsync_plan_free(p);
    descs_free(&d);
    arena_free();
}

static void test_desc_codec(void)
{
    descs_t d;
    wsync_wbuf_t wb;
    wsync_rbuf_t rb;
    wsync_shard_desc_t *s = NULL;
    wsync_target_desc_t *t = NULL;
    size_t ns = 0, nt = 0;

    descs_make(&d, 16);
    d.targets[1].quant = WSYNC_QUANT_BLOCK;
    d.targets[1].block_rows = 128;
    d.targets[1].block_cols = 64;
    wsync_wbuf_init(&wb);
    wsync_shards_encode(d.shards, d.ns, &wb);
    wsync_targets_encode(d.targets, d.nt, &wb);
    CHECK(!wb.err);

    wsync_rbuf_init(&rb, wb.data, wb.len);
    CHECK_OK(wsync_shards_decode(&rb, &s, &ns));
    CHECK_OK(wsync_targets_decode(&rb, &t, &nt));
    CHECK(wsync_rbuf_left(&rb) == 0);
    CHECK(ns == d.ns && nt == d.nt);
    for (size_t i = 0; s != NULL && i < ns; i++) {
        CHECK(s[i].sender == d.shards[i].sender && s[i].index == d.shards[i].index);
        CHECK(strcmp(s[i].param.name, d.shards[i].param.name) == 0);
        CHECK(memcmp(&s[i].box, &d.shards[i].box, sizeof(wsync_box_t)) == 0);
        CHECK(memcmp(s[i].param.shape, d.shards[i].param.shape, sizeof(s[i].param.shape)) == 0);
    }
    for (size_t i = 0; t != NULL && i < nt; i++) {
        CHECK(t[i].receiver == d.targets[i].receiver && strcmp(t[i].name, d.targets[i].name) == 0);
        CHECK(t[i].quant == d.targets[i].quant && t[i].block_cols == d.targets[i].block_cols);
        CHECK(t[i].npieces == 1 && memcmp(&t[i].pieces[0].src, &d.targets[i].pieces[0].src,
                                          sizeof(wsync_box_t)) == 0);
    }
    wsync_shard_descs_free(s, ns);
    wsync_target_descs_free(t, nt);

    /* every truncation fails cleanly */
    for (size_t n = 0; n < wb.len; n++) {
        wsync_status_t st;
        s = NULL, t = NULL, ns = nt = 0;
        wsync_rbuf_init(&rb, wb.data, n);
        st = wsync_shards_decode(&rb, &s, &ns);
        if (st == WSYNC_OK)
            st = wsync_targets_decode(&rb, &t, &nt);
        CHECK_MSG(st == WSYNC_ERR_PROTOCOL, "truncated at %zu: %s", n, wsync_status_name(st));
        wsync_shard_descs_free(s, ns);
        wsync_target_descs_free(t, nt);
    }
    /* flips: either still a valid description or refused; never a crash */
    {
        uint8_t *buf = zalloc(wb.len);
        for (size_t i = 0; i < wb.len; i++) {
            for (int m = 0; m < 8; m++) {
                wsync_status_t st;
                memcpy(buf, wb.data, wb.len);
                buf[i] ^= (uint8_t)(1u << m);
                s = NULL, t = NULL, ns = nt = 0;
                wsync_rbuf_init(&rb, buf, wb.len);
                st = wsync_shards_decode(&rb, &s, &ns);
                if (st == WSYNC_OK)
                    st = wsync_targets_decode(&rb, &t, &nt);
                CHECK(st == WSYNC_OK || st == WSYNC_ERR_PROTOCOL);
                wsync_shard_descs_free(s, ns);
                wsync_target_descs_free(t, nt);
            }
        }
    }
    /* huge counts */
    {
        uint8_t huge[8] = {0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4};
        wsync_rbuf_init(&rb, huge, sizeof(huge));
        CHECK_ST(wsync_shards_decode(&rb, &s, &ns), WSYNC_ERR_PROTOCOL);
        wsync_rbuf_init(&rb, huge, sizeof(huge));
        CHECK_ST(wsync_targets_decode(&rb, &t, &nt), WSYNC_ERR_PROTOCOL);
    }
    wsync_wbuf_free(&wb);
    descs_free(&d);
    arena_free();
}

static void test_exec_fp8(void)
{
    uint16_t bucket[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint8_t out[8] = {0};
    wsync_chunk_t ch;
    wsync_segment_t sg;

    memset(&ch, 0, sizeof(ch));
    memset(&sg, 0, sizeof(sg));
    ch.dtype = BF16;
    ch.src = (wsync_region_t){0, 4, 2, 4};
    sg.dst = (wsync_region_t){0, 4, 2, 4};
    CHECK_ST(wsync_exec_unpack(&sg, &ch, bucket, WSYNC_DTYPE_F8E4M3FN, out), WSYNC_ERR_UNSUPPORTED);
    CHECK_ERR_HAS("quantiz");
    ch.dtype = WSYNC_DTYPE_F8E5M2;                       /* FP8 → same FP8: a plain copy */
    CHECK_OK(wsync_exec_unpack(&sg, &ch, bucket, WSYNC_DTYPE_F8E5M2, out));
    CHECK(memcmp(out, bucket, 8) == 0);
}

int main(void)
{
    RUN(test_fsdp_to_tp);
    RUN(test_replicated_balanced);
    RUN(test_replica_targets_share_chunks);
    RUN(test_bucket_splitting);
    RUN(test_casts);
    RUN(test_3d_4d);
    RUN(test_vocab_padding);
    RUN(test_random_layouts);
    RUN(test_determinism);
    RUN(test_errors);
    RUN(test_desc_validation);
    RUN(test_plan_round_trip);
    RUN(test_plan_decode_hostile);
    RUN(test_plan_wire_v2_by_hand);
    RUN(test_check_sender_receiver);
    RUN(test_desc_codec);
    RUN(test_exec_fp8);
    return check_summary();
}
