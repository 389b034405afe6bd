/* FP8 on the wire (docs/fp8_wire.md): the descriptors of a sender's pack (a quantization of the
 * chunk's region into its bucket place, codes then scales) and of a receiver's unpack (two
 * copies: codes into the target, scales into its scale matrix), for the CUDA kernels. Plain C
 * that makes no device call, so that it builds with and without CUDA (kernels/kernels.h). */
#include "kernels/kernels.h"

#include <inttypes.h>
#include <string.h>

#include "core/status.h"

static int float_dtype(wsync_dtype_t dt)
{
    return dt == WSYNC_DTYPE_BF16 || dt == WSYNC_DTYPE_F16 || dt == WSYNC_DTYPE_F32;
}

/* The rule of an FP8 chunk, checked against the plan's table and the chunk's cell count. */
static wsync_status_t chunk_rule(const char *fn, const wsync_plan_t *plan,
                                 const wsync_chunk_t *chunk, const wsync_wire_rule_t **rule)
{
    uint64_t cr, cc;

    if (chunk->rule == 0 || chunk->rule > plan->nrules || plan->rules == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: chunk (sender %u, shard %u) names FP8 rule %u "
                         "of %u: %s", fn, chunk->sender, chunk->shard, chunk->rule, plan->nrules,
                         chunk->rule == 0 ? "it travels plain" : "no such rule");
    *rule = &plan->rules[chunk->rule - 1];
    if ((*rule)->scheme == WSYNC_QUANT_BLOCK && ((*rule)->block_rows <= 0 ||
                                                 (*rule)->block_cols <= 0))
        return wsync_err(WSYNC_ERR_INVALID, "%s: FP8 rule %u has blocks of %d x %d", fn,
                         chunk->rule, (*rule)->block_rows, (*rule)->block_cols);
    wsync_wire_cells(*rule, chunk->src.rows, chunk->src.cols, &cr, &cc);
    if (cr * cc != chunk->ncells)
        return wsync_err(WSYNC_ERR_INVALID, "%s: chunk (sender %u, shard %u) of %" PRIu64 " x %"
                         PRIu64 " says %u cells; FP8 rule %u makes %" PRIu64 " x %" PRIu64, fn,
                         chunk->sender, chunk->shard, chunk->src.rows, chunk->src.cols,
                         chunk->ncells, chunk->rule, cr, cc);
    /* codes start the place, the f32 scales follow 4-byte aligned */
    if (chunk->bucket_off % 4 != 0)
        return wsync_err(WSYNC_ERR_INVALID, "%s: bucket offset %" PRIu64 " is not 4-byte aligned",
                         fn, chunk->bucket_off);
    return WSYNC_OK;
}

wsync_status_t wsync_kernels_pack_wire_desc(const wsync_plan_t *plan, const wsync_chunk_t *chunk,
                                            const void *shard_data, void *bucket,
                                            wsync_kquant_t *out)
{
    static const char fn[] = "wsync_kernels_pack_wire_desc";
    const wsync_wire_rule_t *rule = NULL;
    wsync_status_t st;
    wsync_kquant_t a;

    if (plan == NULL || chunk == NULL || shard_data == NULL || bucket == NULL || out == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: NULL argument", fn);
    if ((st = chunk_rule(fn, plan, chunk, &rule)) != WSYNC_OK)
        return st;
    if (!float_dtype(chunk->dtype))
        return wsync_err(WSYNC_ERR_INVALID, "%s: chunk (sender %u, shard %u) is %s; FP8 codes are "
                         "made from bf16, f16 or f32", fn, chunk->sender, chunk->shard,
                         wsync_dtype_name(chunk->dtype));
    memset(&a, 0, sizeof(a));
    a.x = (const uint8_t *)shard_data + chunk->src.off * wsync_dtype_size(chunk->dtype);
    a.x_dtype = chunk->dtype;
    a.rows = chunk->src.rows;
    a.cols = chunk->src.cols;
    a.x_pitch = chunk->src.pitch;
    wsync_wire_rule_quant(rule, &a.quant);
    a.fp8_dtype = rule->fp8_dtype;
    a.out = (uint8_t *)bucket + chunk->bucket_off;
    a.out_pitch = chunk->src.cols;
    a.scales = (float *)(void *)((uint8_t *)bucket + chunk->bucket_off +
                                 wsync_wire_scales_off(chunk->src.rows, chunk->src.cols));
    *out = a;
    return WSYNC_OK;
}

wsync_status_t wsync_kernels_unpack_wire_desc(const wsync_plan_t *plan,
                                              const wsync_segment_t *seg,
                                              const wsync_chunk_t *chunk, const void *bucket,
                                              const wsync_target_desc_t *t, void *target_data,
                                              float *scales, wsync_kcopy_t out[2])
{
    static const char fn[] = "wsync_kernels_unpack_wire_desc";
    const wsync_wire_rule_t *rule = NULL;
    uint64_t cr, cc, cell_row, cell_col, scale_cols;
    wsync_status_t st;

    if (plan == NULL || seg == NULL || chunk == NULL || bucket == NULL || t == NULL ||
        target_data == NULL || scales == NULL || out == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: NULL argument", fn);
    if ((st = chunk_rule(fn, plan, chunk, &rule)) != WSYNC_OK)
        return st;
    if (seg->chunk >= plan->nchunks || plan->chunks[seg->chunk].rule != chunk->rule)
        return wsync_err(WSYNC_ERR_INVALID, "%s: segment of receiver %u names chunk %u, not one "
                         "of the plan's %u with FP8 rule %u", fn, seg->receiver, seg->chunk,
                         plan->nchunks, chunk->rule);
    if (seg->dst.rows != chunk->src.rows || seg->dst.cols != chunk->src.cols)
        return wsync_err(WSYNC_ERR_INVALID, "%s: target '%s': chunk %" PRIu64 " x %" PRIu64
                         ", segment %" PRIu64 " x %" PRIu64, fn, t->name, chunk->src.rows,
                         chunk->src.cols, seg->dst.rows, seg->dst.cols);
    /* the receiver's own check: its target's rule, and whole cells of it */
    if ((st = wsync_plan_check_wire_segment(plan, seg, t)) != WSYNC_OK)
        return st;
    wsync_wire_cells(rule, chunk->src.rows, chunk->src.cols, &cr, &cc);
    wsync_wire_scales_at(rule, t, &seg->dst, &cell_row, &cell_col, &scale_cols);
    out[0] = (wsync_kcopy_t){
        .src = bucket, .dst = target_data,
        .src_off = chunk->bucket_off, .src_pitch = chunk->src.cols,
        .dst_off = seg->dst.off, .dst_pitch = seg->dst.pitch,
        .rows = chunk->src.rows, .cols = chunk->src.cols,
        .src_dtype = t->dtype, .dst_dtype = t->dtype};
    out[1] = (wsync_kcopy_t){
        .src = bucket, .dst = scales,
        .src_off = (chunk->bucket_off + wsync_wire_scales_off(chunk->src.rows,
                                                              chunk->src.cols)) / 4,
        .src_pitch = cc,
        .dst_off = cell_row * scale_cols + cell_col, .dst_pitch = scale_cols,
        .rows = cr, .cols = cc,
        .src_dtype = WSYNC_DTYPE_F32, .dst_dtype = WSYNC_DTYPE_F32};
    return WSYNC_OK;
}
