/* What the reshard/plan*.c files share; not for other modules (they use reshard/plan.h): the
 * plan compiler's state and its passes (plan.c runs them: plan_index.c, plan_map.c,
 * plan_fp8_mark.c, plan_layout.c), the box, dtype and name helpers those and the checks
 * (plan_check.c) use, and what the plan's wire form (plan_wire.c) needs. */
#ifndef WSYNC_RESHARD_PLAN_INTERNAL_H
#define WSYNC_RESHARD_PLAN_INTERNAL_H

#include "reshard/plan.h"

#include "core/util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* Order of (rank, index) pairs: by rank, then by index; -1, 0 or 1. */
static inline int cmp_rank_index(uint32_t ra, uint32_t ia, uint32_t rb, uint32_t ib)
{
    if (ra != rb)
        return ra < rb ? -1 : 1;
    if (ia != ib)
        return ia < ib ? -1 : 1;
    return 0;
}

/* rows, cols >= 1, pitch >= cols (rows > 1), and the end fits in 64 bits. */
static inline int region_sane(const wsync_region_t *g)
{
    return g->rows >= 1 && g->cols >= 1 && (g->rows == 1 || g->pitch >= g->cols) &&
           wsync_region_end(g) != 0;
}

/* Bytes of a chunk in its bucket (rows x cols elements of its dtype, or its FP8 form). */
static inline uint64_t chunk_bytes(const wsync_chunk_t *ch)
{
    return wsync_chunk_wire_bytes(ch);
}

/* ------------------------------------------------------------------------------------------ */
/* Boxes, dtypes and names (inline: called per shard, piece or region)                          */
/* ------------------------------------------------------------------------------------------ */

static inline int dtype_is_float(wsync_dtype_t dt)
{
    return dt == WSYNC_DTYPE_BF16 || dt == WSYNC_DTYPE_F16 || dt == WSYNC_DTYPE_F32;
}

static inline int dtype_is_fp8(wsync_dtype_t dt)
{
    return dt == WSYNC_DTYPE_F8E4M3FN || dt == WSYNC_DTYPE_F8E5M2;
}

/* Can a target of dtype `to` be filled from a param of dtype `from`? FP8 from float only with a
 * quant scheme: the receiver lands the floats and quantizes them itself. */
static inline int dtype_reachable(wsync_dtype_t from, wsync_dtype_t to, wsync_quant_scheme_t quant)
{
    if (from == to)
        return 1;
    if (dtype_is_float(from) && dtype_is_float(to))
        return 1;
    return dtype_is_float(from) && dtype_is_fp8(to) && quant != WSYNC_QUANT_NONE;
}

/* Elements of a shape; 0 when a dim is not positive or the product passes WSYNC_PLAN_MAX_ELEMS. */
static inline uint64_t shape_volume(int nd, const int64_t *shape)
{
    uint64_t v = 1;

    for (int d = 0; d < nd; d++) {
        if (shape[d] <= 0 || wsync_mul_u64(v, (uint64_t)shape[d], &v) != 0 ||
            v > WSYNC_PLAN_MAX_ELEMS)
            return 0;
    }
    return v;
}

static inline uint64_t box_volume(int nd, const wsync_box_t *b)
{
    uint64_t v = 1;

    for (int d = 0; d < nd; d++)
        v *= (uint64_t)b->len[d];  /* inside a validated shape: cannot overflow */
    return v;
}

/* start[d] + len[d] (a box `len` long placed at `start`) lies inside shape. */
static inline int span_inside(int nd, const int64_t *start, const int64_t *len,
                              const int64_t *shape)
{
    for (int d = 0; d < nd; d++)
        if (start[d] < 0 || len[d] < 0 || start[d] > shape[d] || len[d] > shape[d] - start[d])
            return 0;
    return 1;
}

/* Intersection of two boxes; 0 when empty. */
static inline int box_intersect(int nd, const wsync_box_t *a, const wsync_box_t *b,
                                wsync_box_t *out)
{
    wsync_box_t r;

    memset(&r, 0, sizeof(r));
    for (int d = 0; d < nd; d++) {
        int64_t lo = WSYNC_MAX(a->start[d], b->start[d]);
        int64_t hi = WSYNC_MIN(a->start[d] + a->len[d], b->start[d] + b->len[d]);
        if (hi <= lo)
            return 0;
        r.start[d] = lo;
        r.len[d] = hi - lo;
    }
    *out = r;
    return 1;
}

/* n int64s; params of 1 and 2 dims (nearly all) without a call to memcpy, which a copy of a
 * size not known at compile time becomes (tens of millions of them in a large plan). */
static inline void copy_i64(int64_t *dst, const int64_t *src, int n)
{
    switch (n) {
    case 2:
        dst[1] = src[1];
        /* fall through */
    case 1:
        dst[0] = src[0];
        break;
    default:
        memcpy(dst, src, (size_t)n * sizeof(int64_t));
    }
}

static inline void coords_to_box(int nd, const int64_t *co, wsync_box_t *b)
{
    copy_i64(b->start, co, nd);
    copy_i64(b->len, co + nd, nd);
}

/* A name a description may carry: not NULL, not empty, at most WSYNC_NAME_MAX bytes. */
static inline int name_ok(const char *s)
{
    return s != NULL && s[0] != '\0' && strnlen(s, WSYNC_NAME_MAX + 1) <= WSYNC_NAME_MAX;
}

static inline uint64_t name_hash(const char *s)
{
    return XXH3_64bits(s, strlen(s));
}

/* Room for `need` elements of `elem` bytes at *p (*cap of them now): doubled from 64 until it
 * holds them; -1 when out of memory (*p and *cap unchanged). */
static inline int plan_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    size_t n = *cap ? *cap : 64;
    void *q;

    if (need <= *cap)
        return 0;
    while (n < need)
        n *= 2;
    q = realloc(*p, n * elem);
    if (q == NULL)
        return -1;
    *p = q;
    *cap = n;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Compilation state                                                                            */
/* ------------------------------------------------------------------------------------------ */

/* A holder of a distinct box, with what pass 2 needs of its shard copied out: pass 2 visits
 * one param's holders together, while their descriptions lie a whole sender's shards apart. */
typedef struct {
    const wsync_shard_desc_t *shard;
    uint32_t sender, index;          /* shard->sender, shard->index */
    uint32_t spos;                   /* its place in (sender, index) order */
} rep_t;

typedef struct {
    const wsync_shard_desc_t *ref;   /* the param as its first sender (by rank) describes it */
    uint32_t box0, nbox;             /* its distinct boxes in compile_t.boxes, by start */
} param_t;

/* A distinct box. Its coordinates are nd starts then nd lengths at compile_t.coords[coord]
 * (nd: its param's), copied there in pass 1 next to the other boxes of the param: pass 2 reads
 * one param's boxes side by side, and a box of 2 dims takes 32 bytes, not a wsync_box_t's 128. */
typedef struct {
    uint64_t coord;
    uint32_t rep0, nrep;             /* holders: compile_t.reps[rep0 ..), by (sender, index) */
    uint32_t head, nl;               /* its logical chunks: a list through lchunk_t.next */
} dbox_t;

/* A 2-D region of one distinct box, before bucketing. */
typedef struct {
    uint32_t sender, shard, dbox;
    uint32_t spos;                   /* its shard's place in (sender, index) order */
    uint32_t next;                   /* next logical chunk of the same distinct box */
    wsync_dtype_t dtype;
    uint32_t rule;                   /* FP8 on the wire: 0 plain, k: compile_t.rules[k - 1] */
    wsync_region_t src;
} lchunk_t;

/* A target's use of a logical chunk: its region of the target has the chunk's rows and cols
 * (emit_region finds the chunk by its region), so only where it starts and its pitch are kept;
 * the receiver and target are its tref_t's: 24 bytes, not 48. */
typedef struct {
    uint32_t piece, lchunk;
    uint64_t dst_off, dst_pitch;
} lseg_t;

/* A target, in (receiver, index) order, and the logical segments it takes: its own, or those of
 * an earlier target laid out like it (see plan_map.c), which are not copied: with data-parallel
 * receivers most targets are such copies (Kimi-K2 TP-8 x EP-128: 19.5 million segments from
 * 1.3 million logical segments), and pass 4 reads the one list for every copy. */
typedef struct {
    const wsync_target_desc_t *desc;
    uint32_t receiver, target;       /* the target's receiver and index */
    uint32_t src;                    /* the tref whose logical segments these are (itself: own) */
    uint32_t shared;                 /* own segments a later target takes too */
    uint32_t lseg0, nlseg;           /* c->lsegs[lseg0 ..) */
    uint64_t nseg;                   /* segments they become (parts of their logical chunks) */
} tref_t;

/* Where a bucketed part starts inside its logical chunk. */
typedef struct {
    uint64_t row, col;
} part_t;

typedef struct {
    const wsync_shard_desc_t *shards;
    size_t nshards;
    const wsync_target_desc_t *targets;
    size_t ntargets;
    uint32_t nsenders, nreceivers;
    uint64_t bucket_bytes;

    param_t *params;                 /* in order of first appearance (sender, index) */
    size_t nparams;
    uint32_t *pmap;                  /* open addressing on the param name: params index or
                                        UINT32_MAX */
    size_t pmap_cap;
    dbox_t *boxes;
    size_t nboxes;
    int64_t *coords;                 /* boxes' coordinates, see dbox_t */
    rep_t *reps;                     /* [nshards] holders, grouped by param */
    uint64_t *load;                  /* [nsenders] bytes of logical chunks given to each */

    lchunk_t *lchunks;
    size_t nlchunks, cap_lchunks;
    lseg_t *lsegs;                   /* own logical segments, target by target */
    size_t nlsegs, cap_lsegs;
    tref_t *trefs;                   /* [ntargets] in (receiver, index) order */
    uint32_t *map;                   /* open addressing: lchunk index or UINT32_MAX; only the
                                        lchunks of boxes with more than LIST_MAX of them */
    size_t map_cap, nmapped;

    uint32_t *part0;                 /* [nlchunks + 1] after pass 3: logical chunk k (in bucket
                                        order) is plan->chunks[part0[k] .. part0[k + 1]) */
    part_t *parts;                   /* parallel to plan->chunks; NULL while no logical chunk
                                        was split (every part starts at row 0, column 0) */
    size_t cap_chunks, cap_parts;
    size_t nused, cap_used;          /* plan->bucket_used as pass 3 fills it */
    int fp8_wire, fp8_tensor;        /* wsync_plan_opts_t's */
    wsync_wire_rule_t *rules;        /* FP8 on the wire: the distinct rules, in order found */
    uint32_t nrules, cap_rules;
    wsync_plan_t *plan;
} compile_t;

/* ------------------------------------------------------------------------------------------ */
/* The passes, in the order wsync_plan_compile_opts (plan.c) runs them                          */
/* ------------------------------------------------------------------------------------------ */

/* Pass 1 (plan_index.c): check the shards, index them by param (c->params through c->pmap, in
 * order of first appearance) and group each param's non-empty boxes into distinct boxes
 * (c->boxes, c->coords, c->reps), refusing boxes that partially overlap. */
wsync_status_t wsync_plan_index_shards(compile_t *c);

/* The param named `name`, NULL when no sender holds it (after pass 1; plan_index.c). */
const param_t *wsync_plan_find_param(const compile_t *c, const char *name);

/* Double the logical chunks' map (1024 slots the first time), moving what it holds; -1 when
 * out of memory (the map unchanged). plan_map.c. */
int wsync_plan_map_grow(compile_t *c);

/* Pass 2 (plan_map.c): check the targets, put them in (receiver, index) order (c->trefs) and
 * cut every piece into logical chunks (c->lchunks) and logical segments (c->lsegs). */
wsync_status_t wsync_plan_map_targets(compile_t *c);

/* Pass 2b (plan_fp8_mark.c): with c->fp8_wire, mark the logical chunks that travel as FP8
 * (lchunk_t.rule, the rules in c->rules). */
wsync_status_t wsync_plan_mark_wire(compile_t *c);

/* Pass 3 (plan_layout.c): lay the logical chunks into each sender's buckets as the plan's
 * chunks (c->part0 says which chunks each became); frees c->lchunks and the map. */
wsync_status_t wsync_plan_layout_buckets(compile_t *c);

/* Pass 4 (plan_layout.c): the plan's segments, in (receiver, chunk) order, and its pair bytes;
 * frees c->lsegs. */
wsync_status_t wsync_plan_split_segments(compile_t *c);

/* ------------------------------------------------------------------------------------------ */
/* Shared with the plan's wire form                                                             */
/* ------------------------------------------------------------------------------------------ */

/* Ranks in [1, WSYNC_PLAN_MAX_RANKS] with their product at most WSYNC_PLAN_MAX_PAIRS, and
 * bucket_bytes in [WSYNC_PLAN_MIN_BUCKET, WSYNC_PLAN_MAX_BUCKET]; otherwise `code` (INVALID when
 * compiling, PROTOCOL when decoding) with a message naming the numbers. In plan.c. */
wsync_status_t wsync_plan_check_limits(uint32_t nsenders, uint32_t nreceivers,
                                       uint64_t bucket_bytes, wsync_status_t code);

/* ------------------------------------------------------------------------------------------ */
/* Lists (plan_lists.c)                                                                         */
/* ------------------------------------------------------------------------------------------ */

/* The plan's segment cache (wsync_plan_segments), made when its receivers are known. */
wsync_status_t wsync_plan_cache_init(wsync_plan_t *p);
void wsync_plan_cache_free(wsync_plan_t *p);

/* A receiver's segment as the expander sorts it: its list record with the reference's target
 * (its receiver is the one expanded; its rows and cols are its chunk's). */
typedef struct {
    uint32_t chunk, target, piece, pad;
    uint64_t off, pitch;
} wsync_xitem_t;

/* Scratch for expanding receivers' lists, kept from one receiver to the next. */
typedef struct {
    wsync_xitem_t *a, *tmp;
    size_t cap;
} wsync_expander_t;

/* Receiver r's p->rx_nsegs[r] segments as items, in the order wsync_plan_segments gives them:
 * written into `into` when given (room for them), else into the expander's scratch (valid until
 * its next use); *items points at them. */
wsync_status_t wsync_plan_expand_items(const wsync_plan_t *p, uint32_t r, wsync_expander_t *x,
                                       wsync_xitem_t *into, const wsync_xitem_t **items);

/* Receiver r's segments into out (room for p->rx_nsegs[r]), in the order wsync_plan_segments
 * gives them. */
wsync_status_t wsync_plan_expand(const wsync_plan_t *p, uint32_t r, wsync_expander_t *x,
                                 wsync_segment_t *out);
void wsync_expander_free(wsync_expander_t *x);

/* rx_nsegs, nsegments and pair_bytes from the lists and references (the chunks set);
 * `code` (RANGE compiling, PROTOCOL decoding) past the limits. */
wsync_status_t wsync_plan_lists_derive(wsync_plan_t *p, wsync_status_t code);

/* Lists built from receivers' segments, receiver after receiver (each receiver's in chunk
 * order): one target's segments equal to an earlier list become a reference to it. */
typedef struct {
    wsync_plan_t *p;
    wsync_status_t code;
    uint32_t *slots;                 /* open addressing on the list's hash: list or UINT32_MAX */
    size_t cap_slots;
    uint64_t *hash;                  /* [nlists] */
    size_t cap_hash, cap_lsegs, cap_list0, cap_refs, nrefs;
    uint32_t *idx, *tmp;
    size_t cap_idx, cap_tmp;
} wsync_lists_builder_t;

wsync_status_t wsync_lists_begin(wsync_lists_builder_t *b, wsync_plan_t *p, wsync_status_t code);
/* Receiver r's n segments (every receiver once, in rank order, none skipped). */
wsync_status_t wsync_lists_add(wsync_lists_builder_t *b, uint32_t r, const wsync_segment_t *segs,
                               size_t n);
wsync_status_t wsync_lists_end(wsync_lists_builder_t *b);
void wsync_lists_builder_free(wsync_lists_builder_t *b);

/* Replace the plan's lists with ones built from segs[0, n) in (receiver, chunk) order, and
 * derive its tables again (tests that edit a plan). */
wsync_status_t wsync_plan_set_segments(wsync_plan_t *p, const wsync_segment_t *segs, size_t n);

/* Set plan->fingerprint: the xxh3-64 of the plan's encoded body, as wsync_plan_encode appends
 * it, hashed block by block without holding the encoding. WSYNC_ERR_NOMEM on allocation failure
 * (plan unchanged). In plan_wire.c. */
wsync_status_t wsync_plan_fingerprint(wsync_plan_t *plan);

#endif
