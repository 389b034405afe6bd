/* Internal: descriptions of shards and targets as the coordinator sees them, and the plan
 * compiled from them.
 *
 * The plan is the list of *chunks* and *segments*:
 *  - a chunk is a 2-D region of one sender's shard, packed dense into one bucket of that sender's
 *    schedule (bucket number, byte offset). A chunk is never larger than a bucket: big regions are
 *    split by rows, and a single row larger than a bucket by columns.
 *  - a segment is one receiver's use of one chunk: the same [rows, cols] elements land in a 2-D
 *    region of one of the receiver's targets. Receivers that need identical bytes share a chunk,
 *    so a sender stages each byte once whatever the number of receivers.
 * A scheme that can read shard memory in place uses chunk.src (shard region) and segment.dst
 * (target region) directly and ignores the buckets.
 *
 * Descriptions and plan are computed once per group; every version reuses them.
 */
#ifndef WSYNC_RESHARD_PLAN_H
#define WSYNC_RESHARD_PLAN_H

#include "core/util.h"
#include "core/wire.h"
#include "wsync/wsync.h"

#define WSYNC_NAME_MAX 1024          /* longest param/target name accepted from the wire */

/* Limits a plan (compiled or decoded) must respect; anything beyond is refused, so that hostile
 * input can never drive a huge allocation. */
#define WSYNC_PLAN_ALIGN 64u                         /* chunk offsets in a bucket */
#define WSYNC_PLAN_MIN_BUCKET 64u                    /* smallest bucket_bytes */
#define WSYNC_PLAN_MAX_BUCKET (UINT64_C(1) << 40)     /* largest bucket_bytes */
#define WSYNC_PLAN_MAX_RANKS (1u << 20)              /* senders, and receivers */
/* chunks and segments of one plan: a tiny bucket must not make the coordinator build many
 * millions of them before finding that out. Sized for a trillion-parameter MoE (Kimi-K2: 4.4
 * million chunks from 64 FSDP ranks, one per (expert param, rank)) to hundreds of receivers;
 * whether such a plan fits one control frame (WSYNC_FRAME_MAX) is the coordinator's check. */
#define WSYNC_PLAN_MAX_CHUNKS (1u << 23)
/* Segment records a plan stores: its shared lists' (below), and one receiver's expansion. */
#define WSYNC_PLAN_MAX_SEGMENTS (1u << 26)
/* Segments of all receivers together (the lists times the receivers taking them): 512
 * receivers of Kimi-K2 are 78 million, held as half a million records. */
#define WSYNC_PLAN_MAX_LOGICAL_SEGMENTS (1u << 28)
#define WSYNC_PLAN_MAX_PAIRS (1u << 22)              /* nsenders * nreceivers (2048 x 2048) */
#define WSYNC_PLAN_MAX_ELEMS (UINT64_C(1) << 56)      /* elements of one param or target */
#define WSYNC_MAX_PIECES 65536                       /* pieces of one target */

/* A param as described on the wire (owned name). In descriptions made by wsync_*_desc_from or
 * decoded, dims >= ndim of shapes, boxes and dst_start are zero. */
typedef struct {
    char *name;
    wsync_dtype_t dtype;
    int32_t ndim;
    int64_t shape[WSYNC_MAX_DIMS];
} wsync_pdesc_t;

typedef struct {
    uint32_t sender;                 /* sender rank */
    uint32_t index;                  /* index among that sender's shards (add order) */
    wsync_pdesc_t param;
    wsync_box_t box;
    wsync_mem_t mem;
    int32_t device;
} wsync_shard_desc_t;

/* A piece keeps its dims: param.ndim equals its target's ndim. */
typedef struct {
    wsync_pdesc_t param;
    wsync_box_t src;
    int64_t dst_start[WSYNC_MAX_DIMS];
} wsync_piece_desc_t;

typedef struct {
    uint32_t receiver;               /* receiver rank */
    uint32_t index;                  /* index among that receiver's targets (add order) */
    char *name;
    wsync_dtype_t dtype;
    int32_t ndim;
    int64_t shape[WSYNC_MAX_DIMS];
    wsync_mem_t mem;
    int32_t device;
    wsync_quant_scheme_t quant;      /* FP8 targets: how scales are formed */
    int32_t block_rows, block_cols;  /* WSYNC_QUANT_BLOCK: 0 in the public struct becomes 128 */
    float eps;                       /* WSYNC_QUANT_BLOCK: the floor on a cell's amax (<= 0 in
                                        the public struct becomes 1e-4); 0 otherwise */
    uint8_t ue8m0, no_saturate;      /* as wsync_quant_t's; ue8m0 only with blocks */
    uint32_t npieces;
    wsync_piece_desc_t *pieces;
} wsync_target_desc_t;

/* A 2-D region of a dense row-major buffer, in elements of that buffer's dtype. Element (r, c)
 * is at off + r * pitch + c. The last dim of a param is always the columns; the dims above it are
 * the rows (merged where a box spans them whole), and a box that cannot be one region (3-4 dims)
 * becomes several. A 1-D box is one row. rows, cols >= 1; pitch >= cols. */
typedef struct {
    uint64_t off;                    /* element offset of the region's first element */
    uint64_t pitch;                  /* elements from one row of the region to the next */
    uint64_t rows, cols;             /* cols elements are contiguous */
} wsync_region_t;

/* Last element of region r plus one; 0 when that does not fit 64 bits (rows, cols >= 1). What a
 * region that comes from a peer is checked with: no sum of its fields may wrap. */
static inline uint64_t wsync_region_end(const wsync_region_t *r)
{
    uint64_t v;

    if (wsync_mul_u64(r->rows - 1, r->pitch, &v) != 0 || wsync_add_u64(v, r->off, &v) != 0 ||
        wsync_add_u64(v, r->cols, &v) != 0)
        return 0;
    return v;
}

#define WSYNC_BUCKET_NONE UINT32_MAX

/* How the FP8 codes and scales of a chunk that travels quantized ("FP8 on the wire") are made:
 * the knobs of the targets it lands in, which all agree (the plan's rule table). Cells are
 * block_rows x block_cols of the chunk (WSYNC_QUANT_BLOCK) or its rows (WSYNC_QUANT_CHANNEL,
 * block_rows = block_cols = 0); the plan lays every such chunk on whole cells of its targets,
 * so the sender's cells are the receiver's. WSYNC_QUANT_TENSOR (wsync_wire_rule_needs_amax):
 * the chunk is one cell whose scale is the whole target's, made from the amax its senders agree
 * on each version (schemes/wire_amax.c), the same scale in every chunk of the target. */
typedef struct {
    wsync_dtype_t fp8_dtype;         /* WSYNC_DTYPE_F8E4M3FN or WSYNC_DTYPE_F8E5M2 */
    wsync_quant_scheme_t scheme;     /* WSYNC_QUANT_BLOCK, WSYNC_QUANT_CHANNEL or
                                        WSYNC_QUANT_TENSOR */
    int32_t block_rows, block_cols;
    float eps;                       /* blocks: the amax floor, > 0 */
    uint8_t ue8m0, no_saturate;
} wsync_wire_rule_t;

typedef struct {
    uint32_t sender, shard;          /* source: shard `shard` (index) of sender `sender` */
    wsync_dtype_t dtype;             /* the param's dtype */
    uint32_t rule;                   /* 0: travels as it is (dtype); k > 0: as FP8 codes of
                                        plan->rules[k - 1], [rows, cols] dense, then (4-byte
                                        aligned) ncells fp32 scales row-major, one per cell */
    wsync_region_t src;              /* region of the shard */
    uint32_t bucket;                 /* bucket number in the sender's schedule */
    uint32_t ncells;                 /* rule > 0: its cells (scales); 0 otherwise */
    uint64_t bucket_off;             /* byte offset in that bucket, 64-byte aligned */
} wsync_chunk_t;

/* Cells of a [rows, cols] chunk under a rule: rows of cells and cells per row. */
static inline void wsync_wire_cells(const wsync_wire_rule_t *r, uint64_t rows, uint64_t cols,
                                    uint64_t *cell_rows, uint64_t *cell_cols)
{
    if (r->scheme == WSYNC_QUANT_BLOCK) {
        *cell_rows = (rows + (uint64_t)r->block_rows - 1) / (uint64_t)r->block_rows;
        *cell_cols = (cols + (uint64_t)r->block_cols - 1) / (uint64_t)r->block_cols;
    } else if (r->scheme == WSYNC_QUANT_TENSOR) {
        *cell_rows = 1;
        *cell_cols = 1;
    } else {
        *cell_rows = rows;
        *cell_cols = 1;
    }
}

/* The rule's scale is the whole target's (per-tensor): its senders agree on the target's amax
 * each version before they pack (the "needs the tensor amax" flag of a rule). */
static inline int wsync_wire_rule_needs_amax(const wsync_wire_rule_t *r)
{
    return r->scheme == WSYNC_QUANT_TENSOR;
}

/* Byte offset of an FP8 chunk's scales in its bucket place (after rows x cols codes). */
static inline uint64_t wsync_wire_scales_off(uint64_t rows, uint64_t cols)
{
    return (rows * cols + 3u) & ~(uint64_t)3u;
}

/* Bytes a chunk takes in its bucket and on the wire. */
static inline uint64_t wsync_chunk_wire_bytes(const wsync_chunk_t *ch)
{
    if (ch->rule != 0)
        return wsync_wire_scales_off(ch->src.rows, ch->src.cols) + (uint64_t)ch->ncells * 4u;
    return ch->src.rows * ch->src.cols * wsync_dtype_size(ch->dtype);
}

typedef struct {
    uint32_t receiver, target;       /* destination: target `target` (index) of `receiver` */
    uint32_t piece;                  /* which piece of the target it serves */
    uint32_t chunk;                  /* index into plan->chunks */
    wsync_region_t dst;              /* region of the target; rows, cols equal the chunk's */
} wsync_segment_t;

/* A segment of a shared list: its receiver and target are those of the reference that takes
 * the list, its rows and cols its chunk's. */
typedef struct {
    uint32_t piece, chunk;
    uint64_t off, pitch;             /* the segment's dst.off and dst.pitch */
} wsync_list_seg_t;

/* Receiver r's target `target` takes list `list`: one segment per record, with r and target. */
typedef struct {
    uint32_t target, list;
} wsync_plan_ref_t;

struct wsync_plan_cache;             /* receivers' expanded segments (reshard/plan_lists.c) */

/* Segments are held once per list that receivers share (data-parallel receivers lay out most
 * targets alike): a receiver's segments are its references' lists, merged in (chunk, target,
 * piece, dst.off) order. Read them with wsync_plan_segments. */
typedef struct {
    uint32_t nsenders, nreceivers;
    uint64_t bucket_bytes;
    uint32_t nchunks;
    wsync_chunk_t *chunks;           /* ordered by (sender, bucket, bucket_off); a sender's
                                        buckets are numbered 0, 1, ... and none is empty */
    uint32_t nsegments;              /* every receiver's segments, in all (logical) */
    uint32_t nlists;
    uint32_t *list0;                 /* [nlists + 1] list k is lsegs[list0[k] .. list0[k + 1]) */
    wsync_list_seg_t *lsegs;         /* each list in (chunk, piece, off) order */
    uint32_t *ref0;                  /* [nreceivers + 1] receiver r's refs[ref0[r] .. ref0[r+1]) */
    wsync_plan_ref_t *refs;          /* by target, each target at most once */
    uint32_t *rx_nsegs;              /* [nreceivers] segments of each receiver */
    struct wsync_plan_cache *cache;
    uint32_t *nbuckets;              /* [nsenders] buckets in each sender's schedule */
    uint64_t *bucket_used;           /* [sum nbuckets] bytes used in each bucket, sender-major:
                                        the end of its last chunk, so [0, used) holds them all */
    uint64_t *pair_bytes;            /* [nsenders * nreceivers] bytes receiver r takes from
                                        sender s, at s * nreceivers + r (wire bytes) */
    uint32_t nrules;                 /* FP8 on the wire: the rules chunks name (0: none) */
    wsync_wire_rule_t *rules;
    uint64_t fingerprint;            /* xxh3-64 of the encoded plan body */
    uint64_t wire_bytes;             /* the encoded size, set with the fingerprint (compile) or
                                        by decode; 0: not known (wsync_plan_wire_bytes counts) */
} wsync_plan_t;
/* nbuckets, bucket_used and pair_bytes are derived from chunks and segments (by compile and by
 * decode alike); they do not travel. */

/* Receiver r's segments, in (chunk, target, piece, dst.off) order (chunk order, as the wire
 * sends them): expanded from its lists the first time it is asked for and kept by the plan
 * until wsync_plan_free; later calls return the same array. Thread-safe (a lock around the
 * expansion); expand what a participant uses at its setup, so scheme threads only read.
 * *segs is never NULL (an empty receiver's points at no element). WSYNC_ERR_NOMEM,
 * WSYNC_ERR_INVALID for r out of range. */
wsync_status_t wsync_plan_segments(const wsync_plan_t *plan, uint32_t r,
                                   const wsync_segment_t **segs, uint32_t *n);
/* Bytes all receivers' segments move together: their chunks' elements in the chunks' dtype
 * (plain) and as they travel (wire). */
void wsync_plan_segment_bytes(const wsync_plan_t *plan, uint64_t *plain, uint64_t *wire);
/* Every receiver's segments in one array, in (receiver, chunk) order (plan->nsegments of them;
 * the caller frees it): the whole plan at once, for tests and checks of small plans. */
wsync_status_t wsync_plan_flatten(const wsync_plan_t *plan, wsync_segment_t **segs);
/* The records of list l on chunks [c0, c1) are lsegs[*a, *b) (a list is in chunk order): what
 * a sender, whose chunks are one range, reads of each receiver's lists without expanding them. */
void wsync_plan_list_range(const wsync_plan_t *plan, uint32_t l, uint32_t c0, uint32_t c1,
                           uint32_t *a, uint32_t *b);
/* Sender s's buckets in the plan's chunk order (by sender, then bucket): bucket k is chunks
 * [start[k], start[k + 1]) for k < plan->nbuckets[s]; start has nbuckets[s] + 1 entries. */
void wsync_plan_bucket_chunks(const wsync_plan_t *plan, uint32_t s, uint32_t *start);
/* The distinct chunks in [c0, c1) receiver r takes, ascending, into *buf (grown with realloc,
 * *cap elements), *n of them: a sender's view of one receiver (its chunks are one range). */
wsync_status_t wsync_plan_rx_chunks(const wsync_plan_t *plan, uint32_t r, uint32_t c0,
                                    uint32_t c1, uint32_t **buf, size_t *cap, uint32_t *n);
/* The same segments written into *buf (grown with realloc; *cap elements), not kept by the
 * plan: for a reader that walks every receiver once (a sender's view of the group). */
wsync_status_t wsync_plan_segments_into(const wsync_plan_t *plan, uint32_t r,
                                        wsync_segment_t **buf, size_t *cap, uint32_t *n);

/* Fault in, in one call, the pages of a large fresh array that is about to be written whole: a
 * plan of millions of chunks writes hundreds of MB of fresh memory, and taking its page faults
 * one 4 KiB page at a time cost as much as a pass of the compiler. A hint only (Linux
 * MADV_POPULATE_WRITE, arrays of 4 MiB or more); elsewhere the pages fault in as written. */
void wsync_plan_prefault(void *p, size_t bytes);

/* Compile the plan. bucket_bytes in [WSYNC_PLAN_MIN_BUCKET, WSYNC_PLAN_MAX_BUCKET]; ranks within
 * WSYNC_PLAN_MAX_RANKS / _PAIRS (WSYNC_ERR_INVALID otherwise). Checks, with errors naming the
 * param/target and receiver:
 *  - every sender's description of a param agrees (dtype, shape); boxes lie inside the param;
 *    boxes of one param are either identical (replicas) or disjoint (WSYNC_ERR_MISMATCH);
 *  - every piece names a param some sender holds, with the same dtype and shape;
 *  - every piece lies inside its param and its target, and is fully covered by shards;
 *  - target dtype is reachable from the param dtype (same, a float cast, or FP8 with a quant).
 * Deterministic: the same inputs give the same plan and fingerprint. Replicated boxes are read
 * from the replica that has been given the fewest bytes so far, reusing an identical chunk where
 * one exists. *plan is owned by the caller (wsync_plan_free). */
wsync_status_t wsync_plan_compile(const wsync_shard_desc_t *shards, size_t nshards,
                                  const wsync_target_desc_t *targets, size_t ntargets,
                                  uint32_t nsenders, uint32_t nreceivers, uint64_t bucket_bytes,
                                  wsync_plan_t **plan);
void wsync_plan_free(wsync_plan_t *plan);

/* Options of a compile. fp8_wire: 1 to let chunks travel as FP8 codes and scales made by their
 * senders (docs/fp8_wire.md): a chunk does when every target it lands in is FP8 with block or
 * channel scales, all with one rule (dtype and knobs), each fully covered by pieces of float
 * params, and every chunk of each such target lands on whole cells of it (fused pieces or FSDP
 * rows that cut a cell leave the whole target to its receiver); such chunks are split at cell
 * rows only. 0 (and a NULL opts): every chunk travels as it is. fp8_tensor (with fp8_wire):
 * per-tensor targets too, every element covered by float params: their chunks travel as codes
 * and the target's one scale, which needs the senders to agree on the target's amax each version
 * (schemes/wire_amax.c); only for schemes that do that exchange (ipc with host shards). */
typedef struct {
    int fp8_wire;
    int fp8_tensor;
} wsync_plan_opts_t;

wsync_status_t wsync_plan_compile_opts(const wsync_shard_desc_t *shards, size_t nshards,
                                       const wsync_target_desc_t *targets, size_t ntargets,
                                       uint32_t nsenders, uint32_t nreceivers,
                                       uint64_t bucket_bytes, const wsync_plan_opts_t *opts,
                                       wsync_plan_t **plan);

/* FP8 on the wire (reshard/plan_quant.c). */
/* 1 and *rule filled when target t could take chunks quantized by their senders (FP8 dtype,
 * block, channel or per-tensor scales, every element covered by pieces of bf16/f16/f32 params;
 * per-tensor ones only where the compile allows it: wsync_plan_opts_t.fp8_tensor). */
int wsync_wire_rule_of(const wsync_target_desc_t *t, wsync_wire_rule_t *rule);
int wsync_wire_rule_eq(const wsync_wire_rule_t *a, const wsync_wire_rule_t *b);
/* The quantizer's arguments for a rule (scales and scales_mem left 0). */
void wsync_wire_rule_quant(const wsync_wire_rule_t *rule, wsync_quant_t *q);
/* Wire bytes of a [rows, cols] chunk under a rule. */
uint64_t wsync_wire_bytes(const wsync_wire_rule_t *rule, uint64_t rows, uint64_t cols);
/* 1 when one row of cells of a chunk `cols` wide fits a bucket (with room for alignment). */
int wsync_wire_cellrow_fits(const wsync_wire_rule_t *rule, uint64_t cols, uint64_t bucket_bytes);
/* 1 when the target region at dst_off (pitch dst_pitch, rows x cols, in elements of t's matrix:
 * its last dim the columns) is a union of whole cells of t under the rule. */
int wsync_wire_region_whole(const wsync_wire_rule_t *rule, const wsync_target_desc_t *t,
                            uint64_t dst_off, uint64_t dst_pitch, uint64_t rows, uint64_t cols);
/* Where a segment's cells sit in its target's scale matrix (wsync_quant_scales_shape's): the
 * first cell's row and column, and the matrix's columns (its row pitch). */
void wsync_wire_scales_at(const wsync_wire_rule_t *rule, const wsync_target_desc_t *t,
                          const wsync_region_t *dst, uint64_t *cell_row, uint64_t *cell_col,
                          uint64_t *scale_cols);
/* A receiver's check of a segment whose chunk travels as FP8: the rule is its target's and the
 * region whole cells (WSYNC_ERR_PROTOCOL naming both otherwise); WSYNC_OK for a plain chunk. */
wsync_status_t wsync_plan_check_wire_segment(const wsync_plan_t *plan, const wsync_segment_t *sg,
                                             const wsync_target_desc_t *t);
/* wire[t] = 1 for each of receiver `rank`'s targets t < ntargets whose every segment travels as
 * FP8 (and that has one): its codes and scales arrive made; it needs no staging and no
 * quantization. */
wsync_status_t wsync_plan_wire_targets(const wsync_plan_t *plan, uint32_t rank, size_t ntargets,
                                       uint8_t *wire);

/* Wire form of a plan (version 2, plan_wire.c says how each record is coded): "WSPL", version,
 * counts, the chunks, each coded against the one before, then each receiver's segments as
 * literals or as runs copied from an earlier receiver's (data-parallel replicas), then the
 * xxh3-64 of all that (the fingerprint), checked on decode. Deterministic: the same plan gives
 * the same bytes. Appends to out; out->err set on allocation failure. */
void wsync_plan_encode(const wsync_plan_t *plan, wsync_wbuf_t *out);
/* The wire form of a plan whose segments are segs[0, n) in (receiver, chunk) order rather than
 * its lists': each receiver coded from the array as given, none from another's records; what
 * a coordinator would send for them, hostile or not (tests). */
void wsync_plan_encode_flat(const wsync_plan_t *plan, const wsync_segment_t *segs, uint32_t n,
                            wsync_wbuf_t *out);
/* Bytes wsync_plan_encode appends for this plan: plan->wire_bytes when the compile or decode
 * set it, else counted by coding the plan without keeping the bytes (one pass); what a sender
 * of the plan checks against its frame limit before encoding. UINT64_MAX when out of memory. */
uint64_t wsync_plan_wire_bytes(const wsync_plan_t *plan);
/* Decode and validate structure (the fingerprint first, counts against the bytes left and the
 * limits, indices in range, regions consistent, chunks inside their buckets and in order,
 * segments in (receiver, chunk) order, copies inside their reference, no trailing bytes, and
 * the bytes the canonical encoding of what they decode to: one plan has one encoding).
 * WSYNC_ERR_PROTOCOL on anything malformed; never reads out of bounds. Chunks take at most
 * 56 bytes of memory per byte of len; receivers are decoded one at a time (a copy makes many
 * segments from a few bytes, never more than the header's count, itself at most
 * WSYNC_PLAN_MAX_LOGICAL_SEGMENTS) and kept as lists: a receiver's segments of one target that
 * equal an earlier list are a reference to it. *plan owned by the caller. */
wsync_status_t wsync_plan_decode(const void *data, size_t len, wsync_plan_t **plan);

/* Validate a decoded plan against this participant's own descriptions: every chunk of sender
 * `rank` names one of its shards (by index, among the descriptions whose sender is `rank`), has
 * its dtype and lies inside it; or every segment of receiver `rank` names one of its targets and
 * pieces, brings a dtype the target can take, and lies inside it. WSYNC_ERR_PROTOCOL naming the
 * shard/target otherwise. */
wsync_status_t wsync_plan_check_sender(const wsync_plan_t *plan, uint32_t rank,
                                       const wsync_shard_desc_t *shards, size_t nshards);
wsync_status_t wsync_plan_check_receiver(const wsync_plan_t *plan, uint32_t rank,
                                         const wsync_target_desc_t *targets, size_t ntargets);

/* Descriptions on the wire: a u32 count, then each description (only ndim dims of each array).
 * Decoders read from `in` (advancing it), validate every field as the *_desc_from functions do
 * (WSYNC_ERR_PROTOCOL naming the description and field), allocate (free with the *_free
 * functions below; freeing NULL is a no-op), and write their outputs only on success. */
void wsync_shards_encode(const wsync_shard_desc_t *shards, size_t n, wsync_wbuf_t *out);
wsync_status_t wsync_shards_decode(wsync_rbuf_t *in, wsync_shard_desc_t **shards, size_t *n);
void wsync_targets_encode(const wsync_target_desc_t *targets, size_t n, wsync_wbuf_t *out);
wsync_status_t wsync_targets_decode(wsync_rbuf_t *in, wsync_target_desc_t **targets, size_t *n);
/* Free what n descriptions own, then the array itself (as the decoders allocate it). NULL is a
 * no-op. Not for an element inside a larger array: use the *_desc_clear functions for that. */
void wsync_shard_descs_free(wsync_shard_desc_t *shards, size_t n);
void wsync_target_descs_free(wsync_target_desc_t *targets, size_t n);
/* Free what one description owns (names, pieces), not the description itself (e.g. one filled by
 * wsync_*_desc_from into a caller's array). The description is zeroed. NULL is a no-op. */
void wsync_shard_desc_clear(wsync_shard_desc_t *shard);
void wsync_target_desc_clear(wsync_target_desc_t *target);

/* From the public structs (validated: name non-NULL, non-empty, <= WSYNC_NAME_MAX; dtype known;
 * 1 <= ndim <= WSYNC_MAX_DIMS; dims > 0; box/src inside the param; shard data non-NULL when the
 * box is not empty; target data non-NULL; mem known; pieces non-NULL when npieces > 0, at most
 * WSYNC_MAX_PIECES, each with the target's ndim, its destination inside the target, and no two
 * destinations overlapping). WSYNC_ERR_INVALID naming the param/target and field. Allocates the
 * owned strings; *out written only on success. */
wsync_status_t wsync_shard_desc_from(const wsync_shard_t *shard, uint32_t sender, uint32_t index,
                                     wsync_shard_desc_t *out);
wsync_status_t wsync_target_desc_from(const wsync_target_t *target, uint32_t receiver,
                                      uint32_t index, wsync_target_desc_t *out);

#endif
