/* Fuzz target: the plan and the descriptions on the wire (reshard/plan_wire.c wsync_plan_decode
 * and the checks a participant runs on a plan, reshard/plan_check.c; reshard/desc.c
 * wsync_shards_decode and
 * wsync_targets_decode), and the plan compiler fed with what a peer described.
 *
 * Input: one selector byte (taken mod 5), then
 *   0  a plan                                  decode; accepted plans encode back to the same
 *                                              bytes and their derived tables stay in bounds
 *   1  shard descriptions                      decode; accepted ones encode back the same
 *   2  target descriptions                     decode; as above, and the zeroing of uncovered
 *                                              elements stays inside each (small) target
 *   3  u32 n, a plan of n bytes, shards,       every rank's plan check; where it passes, run the
 *      targets                                 rank's part of the plan with the CPU executor on
 *                                              buffers of exactly the described sizes, as a
 *                                              sender (pack) and a receiver (unpack) would
 *   4  u8 senders, u8 receivers, u32 bucket,   compile a plan from the descriptions (ranks taken
 *      shards, targets                         modulo the counts) as the coordinator does and
 *                                              run it (tests/support/plan_sim): every element a
 *                                              piece names must arrive once, equal to the
 *                                              sender's, and nothing else may be written
 * Sizes are bounded (1 MiB per buffer, 2^16 elements per side for compiling) so that each input
 * runs in milliseconds; larger inputs are decoded and checked but not executed. */
#include "core/status.h"
#include "core/wire.h"
#include "reshard/exec.h"
#include "reshard/plan.h"
#include "tests/fuzz/fuzz.h"
#include "tests/support/plan_sim.h"
#include "wsync/wsync_fp8.h"

#define MAX_BUF (1u << 20)
#define MAX_COMPILE_ELEMS (1u << 16)
#define MAX_RANKS_RUN 8

static uint64_t volume(int nd, const int64_t *len)
{
    uint64_t v = 1;
    for (int d = 0; d < nd; d++)
        v *= (uint64_t)len[d];      /* descriptions are validated: <= 2^56 elements */
    return v;
}

static int dtype_is_fp8(wsync_dtype_t dt)
{
    return dt == WSYNC_DTYPE_F8E4M3FN || dt == WSYNC_DTYPE_F8E5M2;
}

/* ---- 0: a plan ------------------------------------------------------------------------------ */

static wsync_plan_t *decode_plan(const uint8_t *p, size_t n)
{
    wsync_plan_t *plan = NULL;
    wsync_wbuf_t b;
    uint64_t nb = 0;

    if (wsync_plan_decode(p, n, &plan) != WSYNC_OK) {
        FUZZ_ASSERT(plan == NULL, "a failed decode wrote its output");
        return NULL;
    }
    wsync_wbuf_init(&b);
    wsync_plan_encode(plan, &b);
    FUZZ_ASSERT(!b.err && b.len == n && memcmp(b.data, p, n) == 0,
                "the plan encodes back to %zu bytes, not the %zu decoded", b.len, n);
    wsync_wbuf_free(&b);
    for (uint32_t s = 0; s < plan->nsenders; s++)
        nb += plan->nbuckets[s];
    for (uint32_t i = 0; i < plan->nchunks; i++) {
        const wsync_chunk_t *c = &plan->chunks[i];
        uint64_t base = 0;
        FUZZ_ASSERT(c->sender < plan->nsenders && c->bucket < plan->nbuckets[c->sender],
                    "chunk %u: sender %u bucket %u", i, c->sender, c->bucket);
        for (uint32_t s = 0; s < c->sender; s++)
            base += plan->nbuckets[s];
        FUZZ_ASSERT(base + c->bucket < nb && plan->bucket_used[base + c->bucket] <=
                    plan->bucket_bytes, "chunk %u: bucket used past its size", i);
    }
    for (uint32_t r = 0; r < plan->nreceivers; r++) {
        const wsync_segment_t *sg;
        uint32_t n;
        FUZZ_ASSERT(wsync_plan_segments(plan, r, &sg, &n) == WSYNC_OK, "receiver %u's segments: "
                    "%s", r, wsync_last_error());
        for (uint32_t i = 0; i < n; i++)
            FUZZ_ASSERT(sg[i].chunk < plan->nchunks && sg[i].receiver == r,
                        "receiver %u segment %u", r, i);
    }
    return plan;
}

/* ---- 1, 2: descriptions --------------------------------------------------------------------- */

static int decode_shards(wsync_rbuf_t *r, wsync_shard_desc_t **sd, size_t *ns)
{
    const uint8_t *start = r->p;
    wsync_wbuf_t b;

    *sd = NULL;
    *ns = 0;
    if (wsync_shards_decode(r, sd, ns) != WSYNC_OK) {
        FUZZ_ASSERT(*sd == NULL && *ns == 0, "a failed decode wrote its outputs");
        return -1;
    }
    wsync_wbuf_init(&b);
    wsync_shards_encode(*sd, *ns, &b);
    FUZZ_ASSERT(!b.err && b.len == (size_t)(r->p - start) && memcmp(b.data, start, b.len) == 0,
                "shard descriptions encode back to other bytes");
    wsync_wbuf_free(&b);
    return 0;
}

static int decode_targets(wsync_rbuf_t *r, wsync_target_desc_t **td, size_t *nt)
{
    const uint8_t *start = r->p;
    wsync_wbuf_t b;

    *td = NULL;
    *nt = 0;
    if (wsync_targets_decode(r, td, nt) != WSYNC_OK) {
        FUZZ_ASSERT(*td == NULL && *nt == 0, "a failed decode wrote its outputs");
        return -1;
    }
    wsync_wbuf_init(&b);
    wsync_targets_encode(*td, *nt, &b);
    FUZZ_ASSERT(!b.err && b.len == (size_t)(r->p - start) && memcmp(b.data, start, b.len) == 0,
                "target descriptions encode back to other bytes");
    wsync_wbuf_free(&b);
    return 0;
}

static uint64_t target_bytes(const wsync_target_desc_t *t)
{
    return volume(t->ndim, t->shape) * wsync_dtype_size(t->dtype);
}

/* A receiver zeroes what no piece covers once, at setup: it must stay inside the target. */
static void zero_uncovered(const wsync_target_desc_t *td, size_t nt)
{
    for (size_t i = 0; i < nt; i++) {
        uint64_t bytes = target_bytes(&td[i]);
        if (bytes == 0 || bytes > MAX_BUF)
            continue;
        uint8_t *buf = malloc(bytes);
        FUZZ_ASSERT(buf != NULL, "no memory");
        memset(buf, 0x5a, bytes);
        wsync_exec_zero_uncovered(&td[i], buf);
        free(buf);
    }
}

/* ---- 3: a plan checked and run against descriptions ---------------------------------------- */

static const wsync_shard_desc_t *find_shard(const wsync_shard_desc_t *sd, size_t ns,
                                            uint32_t rank, uint32_t index)
{
    for (size_t i = 0; i < ns; i++)
        if (sd[i].sender == rank && sd[i].index == index)
            return &sd[i];
    return NULL;
}

static const wsync_target_desc_t *find_target(const wsync_target_desc_t *td, size_t nt,
                                              uint32_t rank, uint32_t index)
{
    for (size_t i = 0; i < nt; i++)
        if (td[i].receiver == rank && td[i].index == index)
            return &td[i];
    return NULL;
}

/* As a sender: every chunk of `rank` packed from a shard buffer of exactly the box's bytes into a
 * bucket of exactly bucket_bytes. */
static void run_sender(const wsync_plan_t *plan, uint32_t rank, const wsync_shard_desc_t *sd,
                       size_t ns)
{
    uint8_t *bucket;

    if (plan->bucket_bytes > MAX_BUF)
        return;
    for (uint32_t i = 0; i < plan->nchunks; i++) {
        const wsync_chunk_t *c = &plan->chunks[i];
        const wsync_shard_desc_t *s;
        if (c->sender != rank)
            continue;
        s = find_shard(sd, ns, rank, c->shard);
        FUZZ_ASSERT(s != NULL, "checked plan reads shard %u that sender %u lacks", c->shard, rank);
        if (volume(s->param.ndim, s->box.len) * wsync_dtype_size(s->param.dtype) > MAX_BUF)
            return;
    }
    bucket = malloc(plan->bucket_bytes);
    FUZZ_ASSERT(bucket != NULL, "no memory");
    for (uint32_t i = 0; i < plan->nchunks; i++) {
        const wsync_chunk_t *c = &plan->chunks[i];
        const wsync_shard_desc_t *s;
        uint64_t bytes;
        uint8_t *data;
        if (c->sender != rank)
            continue;
        s = find_shard(sd, ns, rank, c->shard);
        bytes = volume(s->param.ndim, s->box.len) * wsync_dtype_size(s->param.dtype);
        data = malloc(bytes ? bytes : 1);
        FUZZ_ASSERT(data != NULL, "no memory");
        memset(data, 0x11, bytes);   /* bf16 / f16 / f32 0x11.. values: finite */
        if (c->rule != 0) {
            /* FP8 on the wire: codes and scales at the chunk's place (wsync_chunk_wire_bytes) */
            wsync_status_t st = wsync_exec_pack_wire(plan, c, s->param.name, data, bucket);
            FUZZ_ASSERT(st == WSYNC_OK || st == WSYNC_ERR_NONFINITE,
                        "FP8 pack of chunk %u: %s", i, wsync_last_error());
        } else {
            wsync_exec_pack(c, data, bucket);
        }
        free(data);
    }
    free(bucket);
}

/* A segment of an FP8 chunk (FP8 on the wire) unpacked into a target buffer and a scale matrix
 * of exactly their sizes: a checked plan must never make it write outside them. */
static void run_wire_segment(const wsync_plan_t *plan, const wsync_segment_t *sg, uint32_t seg,
                             const void *bucket, const wsync_target_desc_t *t)
{
    wsync_quant_t q;
    int64_t sr = 0, sc = 0;
    uint64_t bytes = target_bytes(t);

    memset(&q, 0, sizeof(q));
    q.scheme = t->quant;
    q.block_rows = t->block_rows;
    q.block_cols = t->block_cols;
    q.eps = t->eps;
    q.ue8m0 = t->ue8m0;
    q.no_saturate = t->no_saturate;
    if (t->ndim != 2 || wsync_quant_scales_shape(&q, t->shape[0], t->shape[1], &sr, &sc) != WSYNC_OK ||
        bytes > MAX_BUF || (uint64_t)sr * (uint64_t)sc > MAX_BUF / sizeof(float))
        return;
    uint8_t *data = malloc(bytes ? bytes : 1);
    size_t nscales = (size_t)sr * (size_t)sc;
    float *scales = malloc((nscales > 0 ? nscales : 1) * sizeof(float));
    FUZZ_ASSERT(data != NULL && scales != NULL, "no memory");
    wsync_status_t st = wsync_exec_unpack_wire(plan, sg, &plan->chunks[sg->chunk], bucket,
                                               t, data, scales);
    FUZZ_ASSERT(st == WSYNC_OK || st == WSYNC_ERR_PROTOCOL, "FP8 unpack of segment %u: %s", seg,
                wsync_last_error());
    free(data);
    free(scales);
}

/* As a receiver: every segment of `rank` unpacked from a bucket of bucket_bytes into a target
 * buffer of exactly the target's bytes (FP8 targets fed from floats go through the quantizer,
 * not the executor: left out; FP8 chunks through the wire unpack). */
static void run_receiver(const wsync_plan_t *plan, uint32_t rank, const wsync_target_desc_t *td,
                         size_t nt)
{
    uint8_t *bucket;

    if (plan->bucket_bytes > MAX_BUF)
        return;
    bucket = malloc(plan->bucket_bytes);
    FUZZ_ASSERT(bucket != NULL, "no memory");
    memset(bucket, 0x3c, plan->bucket_bytes);
    const wsync_segment_t *mine;
    uint32_t nmine = 0;
    FUZZ_ASSERT(wsync_plan_segments(plan, rank, &mine, &nmine) == WSYNC_OK, "receiver %u: %s",
                rank, wsync_last_error());
    for (uint32_t i = 0; i < nmine; i++) {
        const wsync_segment_t *sg = &mine[i];
        const wsync_chunk_t *c = &plan->chunks[sg->chunk];
        const wsync_target_desc_t *t;
        uint64_t bytes;
        uint8_t *data;
        t = find_target(td, nt, rank, sg->target);
        FUZZ_ASSERT(t != NULL, "checked plan writes target %u that receiver %u lacks",
                    sg->target, rank);
        if (c->rule != 0) {
            run_wire_segment(plan, sg, i, bucket, t);
            continue;
        }
        if (dtype_is_fp8(t->dtype) && t->dtype != c->dtype)
            continue;
        bytes = target_bytes(t);
        if (bytes > MAX_BUF)
            continue;
        data = malloc(bytes);
        FUZZ_ASSERT(data != NULL, "no memory");
        wsync_status_t st = wsync_exec_unpack(sg, c, bucket, t->dtype, data);
        FUZZ_ASSERT(st == WSYNC_OK || st == WSYNC_ERR_UNSUPPORTED, "unpack of segment %u: %s", i,
                    wsync_last_error());
        free(data);
    }
    free(bucket);
}

/* A participant's own descriptions are numbered by add order (wsync_*_add_*): renumber what
 * came off the wire the same way, so that (rank, index) names one description, as it does in a
 * real sender or receiver. */
static void renumber(wsync_shard_desc_t *sd, size_t ns, wsync_target_desc_t *td, size_t nt)
{
    for (size_t i = 0; i < ns; i++) {
        sd[i].index = 0;
        for (size_t j = 0; j < i; j++)
            sd[i].index += sd[j].sender == sd[i].sender;
    }
    for (size_t i = 0; i < nt; i++) {
        td[i].index = 0;
        for (size_t j = 0; j < i; j++)
            td[i].index += td[j].receiver == td[i].receiver;
    }
}

static void check_and_run(const wsync_plan_t *plan, wsync_shard_desc_t *sd, size_t ns,
                          wsync_target_desc_t *td, size_t nt)
{
    wsync_shard_desc_t *mine_s = malloc((ns ? ns : 1) * sizeof(*mine_s));
    wsync_target_desc_t *mine_t = malloc((nt ? nt : 1) * sizeof(*mine_t));

    FUZZ_ASSERT(mine_s != NULL && mine_t != NULL, "no memory");
    renumber(sd, ns, td, nt);
    for (uint32_t r = 0; r < plan->nsenders && r < MAX_RANKS_RUN; r++) {
        size_t n = 0;
        for (size_t i = 0; i < ns; i++)
            if (sd[i].sender == r)
                mine_s[n++] = sd[i];
        wsync_status_t st = wsync_plan_check_sender(plan, r, mine_s, n);
        if (fuzz_verbose())
            fprintf(stderr, "sender %u: %s\n", r, st == WSYNC_OK ? "checked" : wsync_last_error());
        if (st == WSYNC_OK)
            run_sender(plan, r, mine_s, n);
    }
    for (uint32_t r = 0; r < plan->nreceivers && r < MAX_RANKS_RUN; r++) {
        size_t n = 0;
        for (size_t i = 0; i < nt; i++)
            if (td[i].receiver == r)
                mine_t[n++] = td[i];
        wsync_status_t st = wsync_plan_check_receiver(plan, r, mine_t, n);
        if (fuzz_verbose())
            fprintf(stderr, "receiver %u: %s\n", r, st == WSYNC_OK ? "checked" : wsync_last_error());
        if (st == WSYNC_OK)
            run_receiver(plan, r, mine_t, n);
    }
    free(mine_s);
    free(mine_t);
}

/* ---- 4: compile what peers described, and run it --------------------------------------------- */

/* Byte k of element `index` of a param: what every sender holding that element holds. */
static uint8_t pattern(const char *name, uint64_t index, size_t k)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *c = name; *c; c++)
        h = (h ^ (uint8_t)*c) * 1099511628211ull;
    h ^= index * 0x9e3779b97f4a7c15ull + k;
    h *= 0xbf58476d1ce4e5b9ull;
    return (uint8_t)(h >> 56);
}

static uint64_t flat_index(int nd, const int64_t *shape, const int64_t *pos)
{
    uint64_t e = 0;
    for (int d = 0; d < nd; d++)
        e = e * (uint64_t)shape[d] + (uint64_t)pos[d];
    return e;
}

/* Walk every element of a box: pos = start + i, for i over len (row-major). */
static int box_next(int nd, const int64_t *len, int64_t *i)
{
    for (int d = nd - 1; d >= 0; d--) {
        if (++i[d] < len[d])
            return 1;
        i[d] = 0;
    }
    return 0;
}

static void fill_shard(const wsync_shard_desc_t *s, uint8_t *data)
{
    size_t esz = wsync_dtype_size(s->param.dtype);
    int nd = s->param.ndim;
    int64_t i[WSYNC_MAX_DIMS] = {0}, pos[WSYNC_MAX_DIMS] = {0};
    uint64_t e = 0;

    if (volume(nd, s->box.len) == 0)
        return;
    do {
        for (int d = 0; d < nd; d++)
            pos[d] = s->box.start[d] + i[d];
        uint64_t g = flat_index(nd, s->param.shape, pos);
        for (size_t k = 0; k < esz; k++)
            data[e * esz + k] = pattern(s->param.name, g, k);
        e++;
    } while (box_next(nd, s->box.len, i));
}

/* Same-dtype pieces must hold exactly the senders' bytes (casts are checked by test_plan). */
static void verify_target(const wsync_target_desc_t *t, const uint8_t *data)
{
    size_t esz = wsync_dtype_size(t->dtype);
    int nd = t->ndim;

    for (uint32_t k = 0; k < t->npieces; k++) {
        const wsync_piece_desc_t *p = &t->pieces[k];
        int64_t i[WSYNC_MAX_DIMS] = {0}, src[WSYNC_MAX_DIMS], dst[WSYNC_MAX_DIMS];
        if (p->param.dtype != t->dtype || volume(nd, p->src.len) == 0)
            continue;
        do {
            for (int d = 0; d < nd; d++) {
                src[d] = p->src.start[d] + i[d];
                dst[d] = p->dst_start[d] + i[d];
            }
            uint64_t g = flat_index(nd, p->param.shape, src);
            uint64_t e = flat_index(nd, t->shape, dst);
            for (size_t b = 0; b < esz; b++)
                FUZZ_ASSERT(data[e * esz + b] == pattern(p->param.name, g, b),
                            "target '%s' piece %u element %llu byte %zu differs from the "
                            "sender's", t->name, k, (unsigned long long)e, b);
        } while (box_next(nd, p->src.len, i));
    }
}

static void compile_and_run(uint32_t nsenders, uint32_t nreceivers, uint64_t bucket,
                            const wsync_shard_desc_t *sd, size_t ns,
                            const wsync_target_desc_t *td, size_t nt)
{
    uint64_t selems = 0, telems = 0;
    plan_sim_t *sim;
    wsync_shard_t *shards;
    wsync_target_t *targets;
    wsync_piece_t **pieces;
    uint8_t **sdata, **tdata;
    wsync_status_t st = WSYNC_OK;

    for (size_t i = 0; i < ns; i++)
        selems += volume(sd[i].param.ndim, sd[i].box.len);
    for (size_t i = 0; i < nt; i++)
        telems += volume(td[i].ndim, td[i].shape);
    if (selems > MAX_COMPILE_ELEMS || telems > MAX_COMPILE_ELEMS || ns + nt > 4096)
        return;

    sim = plan_sim_new(nsenders, nreceivers, bucket);
    shards = calloc(ns + 1, sizeof(*shards));
    targets = calloc(nt + 1, sizeof(*targets));
    pieces = calloc(nt + 1, sizeof(*pieces));
    sdata = calloc(ns + 1, sizeof(*sdata));
    tdata = calloc(nt + 1, sizeof(*tdata));
    FUZZ_ASSERT(sim && shards && targets && pieces && sdata && tdata, "no memory");
    for (size_t i = 0; i < ns && st == WSYNC_OK; i++) {
        const wsync_shard_desc_t *s = &sd[i];
        uint64_t bytes = volume(s->param.ndim, s->box.len) * wsync_dtype_size(s->param.dtype);
        sdata[i] = malloc(bytes ? bytes : 1);
        FUZZ_ASSERT(sdata[i] != NULL, "no memory");
        fill_shard(s, sdata[i]);
        shards[i].param = (wsync_param_t){s->param.name, s->param.dtype, s->param.ndim, {0}};
        memcpy(shards[i].param.shape, s->param.shape, sizeof(s->param.shape));
        shards[i].box = s->box;
        shards[i].data = sdata[i];
        shards[i].mem = WSYNC_MEM_HOST;
        st = plan_sim_add_shard(sim, s->sender % nsenders, &shards[i]);
        FUZZ_ASSERT(st == WSYNC_OK, "a decoded shard description was refused: %s",
                    wsync_last_error());
    }
    for (size_t i = 0; i < nt && st == WSYNC_OK; i++) {
        const wsync_target_desc_t *t = &td[i];
        uint64_t bytes = target_bytes(t);
        tdata[i] = malloc(bytes);
        pieces[i] = calloc(t->npieces + 1, sizeof(**pieces));
        FUZZ_ASSERT(tdata[i] != NULL && pieces[i] != NULL, "no memory");
        memset(tdata[i], 0xee, bytes);
        for (uint32_t k = 0; k < t->npieces; k++) {
            const wsync_piece_desc_t *p = &t->pieces[k];
            pieces[i][k].param = (wsync_param_t){p->param.name, p->param.dtype, p->param.ndim,
                                                 {0}};
            memcpy(pieces[i][k].param.shape, p->param.shape, sizeof(p->param.shape));
            pieces[i][k].src = p->src;
            memcpy(pieces[i][k].dst_start, p->dst_start, sizeof(p->dst_start));
        }
        targets[i].name = t->name;
        targets[i].dtype = t->dtype;
        targets[i].ndim = t->ndim;
        memcpy(targets[i].shape, t->shape, sizeof(t->shape));
        targets[i].data = tdata[i];
        targets[i].mem = WSYNC_MEM_HOST;
        targets[i].pieces = pieces[i];
        targets[i].npieces = (int)t->npieces;
        targets[i].quant.scheme = t->quant;
        targets[i].quant.block_rows = t->block_rows;
        targets[i].quant.block_cols = t->block_cols;
        st = plan_sim_add_target(sim, t->receiver % nreceivers, &targets[i]);
        FUZZ_ASSERT(st == WSYNC_OK, "a decoded target description was refused: %s",
                    wsync_last_error());
    }
    st = plan_sim_run(sim, NULL);
    if (fuzz_verbose())
        fprintf(stderr, "compile: %zu shards, %zu targets: %s\n", ns, nt,
                st == WSYNC_OK ? "ran" : wsync_last_error());
    /* refusing what peers described is fine; a plan that moves the wrong bytes is not */
    FUZZ_ASSERT(st != WSYNC_ERR_INTERNAL, "%s", wsync_last_error());
    if (st == WSYNC_OK)
        for (size_t i = 0; i < nt; i++)
            verify_target(&td[i], tdata[i]);
    plan_sim_free(sim);
    for (size_t i = 0; i < ns; i++)
        free(sdata[i]);
    for (size_t i = 0; i < nt; i++) {
        free(tdata[i]);
        free(pieces[i]);
    }
    free(shards);
    free(targets);
    free(pieces);
    free(sdata);
    free(tdata);
}

/* -------------------------------------------------------------------------------------------- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    wsync_shard_desc_t *sd = NULL;
    wsync_target_desc_t *td = NULL;
    size_t ns = 0, nt = 0;
    wsync_plan_t *plan = NULL;
    fuzz_in_t in;
    wsync_rbuf_t r;

    if (size < 1)
        return 0;
    in.p = data + 1;
    in.n = size - 1;
    switch (data[0] % 5) {
    case 0:
        wsync_plan_free(decode_plan(in.p, in.n));
        break;
    case 1:
        wsync_rbuf_init(&r, in.p, in.n);
        if (decode_shards(&r, &sd, &ns) == 0)
            wsync_shard_descs_free(sd, ns);
        break;
    case 2:
        wsync_rbuf_init(&r, in.p, in.n);
        if (decode_targets(&r, &td, &nt) == 0) {
            zero_uncovered(td, nt);
            wsync_target_descs_free(td, nt);
        }
        break;
    case 3: {
        uint32_t n = (uint32_t)fuzz_take(&in, 4);
        if (n > in.n)
            break;
        plan = decode_plan(in.p, n);
        wsync_rbuf_init(&r, in.p + n, in.n - n);
        if (plan != NULL && decode_shards(&r, &sd, &ns) == 0 && decode_targets(&r, &td, &nt) == 0)
            check_and_run(plan, sd, ns, td, nt);
        wsync_plan_free(plan);
        wsync_shard_descs_free(sd, ns);
        wsync_target_descs_free(td, nt);
        break;
    }
    case 4: {
        uint32_t nsenders = (uint32_t)fuzz_take(&in, 1) % 4 + 1;
        uint32_t nreceivers = (uint32_t)fuzz_take(&in, 1) % 4 + 1;
        uint64_t bucket = fuzz_take(&in, 4) % (1u << 20);
        if (bucket < 64)
            bucket = 64;
        wsync_rbuf_init(&r, in.p, in.n);
        if (decode_shards(&r, &sd, &ns) == 0 && decode_targets(&r, &td, &nt) == 0)
            compile_and_run(nsenders, nreceivers, bucket, sd, ns, td, nt);
        wsync_shard_descs_free(sd, ns);
        wsync_target_descs_free(td, nt);
        break;
    }
    }
    return 0;
}
