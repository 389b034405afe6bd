/* FP8 on the wire: which targets may take chunks quantized by their senders, the rules that say
 * how, and the checks a receiver applies to such chunks (docs/fp8_wire.md). The compiler's pass
 * that marks chunks is plan_fp8_mark.c (it walks the compile state); what it asks of one target
 * or one region is here. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "core/util.h"
#include "reshard/plan_internal.h"

#define DEFAULT_EPS 1e-4f

static int fp8_dtype(wsync_dtype_t dt)
{
    return dt == WSYNC_DTYPE_F8E4M3FN || dt == WSYNC_DTYPE_F8E5M2;
}

static int float_dtype(wsync_dtype_t dt)
{
    return dt == WSYNC_DTYPE_BF16 || dt == WSYNC_DTYPE_F16 || dt == WSYNC_DTYPE_F32;
}


int wsync_wire_rule_of(const wsync_target_desc_t *t, wsync_wire_rule_t *rule)
{
    uint64_t covered = 0, volume = 1;

    if (!fp8_dtype(t->dtype) || (t->quant != WSYNC_QUANT_BLOCK && t->quant != WSYNC_QUANT_CHANNEL &&
                                 t->quant != WSYNC_QUANT_TENSOR))
        return 0;
    if (t->quant == WSYNC_QUANT_BLOCK && (t->block_rows <= 0 || t->block_cols <= 0))
        return 0;
    /* every element comes from a piece (pieces never overlap): padding rows would be cells
     * no sender makes */
    for (int32_t d = 0; d < t->ndim; d++)
        volume *= (uint64_t)t->shape[d];
    for (uint32_t k = 0; k < t->npieces; k++) {
        const wsync_piece_desc_t *p = &t->pieces[k];
        uint64_t v = 1;
        if (!float_dtype(p->param.dtype))
            return 0;
        for (int32_t d = 0; d < t->ndim; d++)
            v *= (uint64_t)p->src.len[d];
        covered += v;
    }
    if (covered != volume || volume == 0)
        return 0;
    memset(rule, 0, sizeof(*rule));
    rule->fp8_dtype = t->dtype;
    rule->scheme = t->quant;
    if (t->quant == WSYNC_QUANT_BLOCK) {
        rule->block_rows = t->block_rows;
        rule->block_cols = t->block_cols;
        rule->eps = t->eps > 0.0f ? t->eps : DEFAULT_EPS;
        rule->ue8m0 = t->ue8m0 ? 1 : 0;
    }
    rule->no_saturate = t->no_saturate ? 1 : 0;
    return 1;
}

int wsync_wire_rule_eq(const wsync_wire_rule_t *a, const wsync_wire_rule_t *b)
{
    return a->fp8_dtype == b->fp8_dtype && a->scheme == b->scheme &&
           a->block_rows == b->block_rows && a->block_cols == b->block_cols &&
           memcmp(&a->eps, &b->eps, sizeof(float)) == 0 && a->ue8m0 == b->ue8m0 &&
           a->no_saturate == b->no_saturate;
}

void wsync_wire_rule_quant(const wsync_wire_rule_t *rule, wsync_quant_t *q)
{
    memset(q, 0, sizeof(*q));
    q->scheme = rule->scheme;
    q->block_rows = rule->block_rows;
    q->block_cols = rule->block_cols;
    q->eps = rule->eps;
    q->ue8m0 = rule->ue8m0;
    q->no_saturate = rule->no_saturate;
}

uint64_t wsync_wire_bytes(const wsync_wire_rule_t *rule, uint64_t rows, uint64_t cols)
{
    uint64_t cr, cc;

    wsync_wire_cells(rule, rows, cols, &cr, &cc);
    return wsync_wire_scales_off(rows, cols) + cr * cc * 4u;
}

int wsync_wire_cellrow_fits(const wsync_wire_rule_t *rule, uint64_t cols, uint64_t bucket_bytes)
{
    uint64_t cr = rule->scheme == WSYNC_QUANT_BLOCK ? (uint64_t)rule->block_rows : 1u;
    uint64_t cc = rule->scheme == WSYNC_QUANT_BLOCK
                      ? (cols + (uint64_t)rule->block_cols - 1) / (uint64_t)rule->block_cols
                      : 1u;
    /* the layout's conservative count: codes of a cell row, its scales, and the alignment */
    return cols <= (bucket_bytes - 3u) / cr && cr * cols + cc * 4u + 3u <= bucket_bytes;
}

int wsync_wire_region_whole(const wsync_wire_rule_t *rule, const wsync_target_desc_t *t,
                            uint64_t dst_off, uint64_t dst_pitch, uint64_t rows, uint64_t cols)
{
    uint64_t R, C, r0, c0;

    wsync_shape_matrix(t->ndim, t->shape, &R, &C);
    if (C == 0 || (rows > 1 && dst_pitch != C))
        return 0;                    /* rows not consecutive rows of the matrix */
    r0 = dst_off / C;
    c0 = dst_off % C;
    if (cols > C - c0 || rows > R || r0 > R - rows)   /* as differences: no sum may wrap */
        return 0;
    if (rule->scheme == WSYNC_QUANT_TENSOR)
        return 1;                    /* the one cell is the target's: any region of it */
    if (rule->scheme == WSYNC_QUANT_CHANNEL)
        return c0 == 0 && cols == C;
    {
        uint64_t br = (uint64_t)rule->block_rows, bc = (uint64_t)rule->block_cols;
        return r0 % br == 0 && c0 % bc == 0 && (r0 + rows == R || (r0 + rows) % br == 0) &&
               (c0 + cols == C || (c0 + cols) % bc == 0);
    }
}

/* Where a segment's scales go in its target's scale matrix: the first cell's (row, column) and
 * the scale matrix's columns. */
void wsync_wire_scales_at(const wsync_wire_rule_t *rule, const wsync_target_desc_t *t,
                          const wsync_region_t *dst, uint64_t *cell_row, uint64_t *cell_col,
                          uint64_t *scale_cols)
{
    uint64_t R, C, r0, c0;

    wsync_shape_matrix(t->ndim, t->shape, &R, &C);
    r0 = dst->off / C;
    c0 = dst->off % C;
    if (rule->scheme == WSYNC_QUANT_BLOCK) {
        *cell_row = r0 / (uint64_t)rule->block_rows;
        *cell_col = c0 / (uint64_t)rule->block_cols;
        *scale_cols = (C + (uint64_t)rule->block_cols - 1) / (uint64_t)rule->block_cols;
    } else if (rule->scheme == WSYNC_QUANT_TENSOR) {
        *cell_row = 0;
        *cell_col = 0;
        *scale_cols = 1;
    } else {
        *cell_row = r0;
        *cell_col = 0;
        *scale_cols = 1;
    }
}

wsync_status_t wsync_plan_check_wire_segment(const wsync_plan_t *plan, const wsync_segment_t *sg,
                                             const wsync_target_desc_t *t)
{
    const wsync_chunk_t *ch = &plan->chunks[sg->chunk];
    wsync_wire_rule_t mine;

    if (ch->rule == 0)
        return WSYNC_OK;
    if (ch->rule > plan->nrules)
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: chunk %u names FP8 rule %u of %u", sg->chunk,
                         ch->rule, plan->nrules);
    if (!wsync_wire_rule_of(t, &mine) || !wsync_wire_rule_eq(&mine, &plan->rules[ch->rule - 1]))
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: receiver %u target '%s' (%s, quant %d) is "
                         "sent chunk %u quantized by its sender with FP8 rule %u, which is not "
                         "this target's", sg->receiver, t->name, wsync_dtype_name(t->dtype),
                         (int)t->quant, sg->chunk, ch->rule);
    if (!wsync_wire_region_whole(&mine, t, sg->dst.off, sg->dst.pitch, sg->dst.rows,
                                 sg->dst.cols))
        return wsync_err(WSYNC_ERR_PROTOCOL, "plan: receiver %u target '%s': chunk %u, quantized "
                         "by its sender, lands on cells it does not cover whole (offset %" PRIu64
                         ", %" PRIu64 " x %" PRIu64 ")", sg->receiver, t->name, sg->chunk,
                         sg->dst.off, sg->dst.rows, sg->dst.cols);
    return WSYNC_OK;
}

wsync_status_t wsync_plan_wire_targets(const wsync_plan_t *plan, uint32_t rank, size_t ntargets,
                                       uint8_t *wire)
{
    uint32_t *nseg = calloc(ntargets + 1, sizeof(*nseg)), n;
    const wsync_segment_t *mine;
    wsync_status_t st;

    if (nseg == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "plan: %zu targets", ntargets);
    if ((st = wsync_plan_segments(plan, rank, &mine, &n)) != WSYNC_OK) {
        free(nseg);
        return st;
    }
    memset(wire, 1, ntargets);
    for (uint32_t i = 0; i < n; i++) {
        const wsync_segment_t *sg = &mine[i];
        if (sg->target >= ntargets)
            continue;
        nseg[sg->target]++;
        if (plan->chunks[sg->chunk].rule == 0)
            wire[sg->target] = 0;
    }
    for (size_t t = 0; t < ntargets; t++)
        if (nseg[t] == 0)
            wire[t] = 0;
    free(nseg);
    return WSYNC_OK;
}
