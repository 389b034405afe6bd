/* FP8 targets quantized straight from the sender's memory (issue 4's FP8 target).
 *
 * A staged CUDA FP8 target normally lands in its staging buffer (land[i], the pieces' dtype),
 * and is quantized from there once whole: every value is written twice and read twice on the
 * receiver's GPU. Where a scheme reads the sender's shards in place (ipc on one node), the values
 * already lie in device memory the receiver's GPU reads, unchanged until the commit; a run of the
 * target's rows that is whole rows of scale cells (per-channel: any rows; blocks: block-row
 * aligned) is then quantized by one kernel from the shard into the target, as the staged path
 * would have produced it bit for bit: the kernels convert bf16 and f16 to f32 exactly, as the
 * staging copy would, and a cell's amax sees the same values. The staging buffer goes unused.
 *
 * The scheme decides which targets it can serve whole (every segment in place, runs that fit);
 * this file holds the runs, launches them (several a kernel), and checks their non-finite flags
 * at commit. The flags are cleared once and stay clear while versions succeed; after a version
 * that may have set one (a failure), the next version clears them first. */
#include <stdlib.h>
#include <string.h>

#include "core/objects.h"
#include "core/status.h"
#include "core/util.h"
#include "kernels/device.h"
#include "reshard/fp8.h"

/* Rows of the target one row of scales covers: 1 per channel, block_rows for blocks. */
static uint64_t cell_rows(const wsync_quant_t *q)
{
    return q->scheme == WSYNC_QUANT_BLOCK ? (q->block_rows > 0 ? (uint64_t)q->block_rows : 128) : 1;
}

wsync_status_t wsync_qdirect_begin(wsync_receiver_t *r, uint8_t **candidates)
{
    uint8_t *cand = calloc(r->ntargets + 1, 1);

    *candidates = NULL;
    if (cand == NULL || (r->q_direct == NULL && (r->q_direct = calloc(r->ntargets + 1, 1)) == NULL)) {
        free(cand);
        return wsync_err(WSYNC_ERR_NOMEM, "receiver %d: no memory", r->m.rank);
    }
    memset(r->q_direct, 0, r->ntargets);
    r->nqruns = 0;
    /* q_need (the version's start, quant_early_reset): what the plan lands in each CUDA FP8
     * target; a run may write only a target the plan covers whole */
    for (size_t i = 0; i < r->ntargets && r->q_need != NULL; i++) {
        const wsync_target_desc_t *t = &r->targets[i];
        uint64_t rows, cols;
        wsync_shape_matrix(t->ndim, t->shape, &rows, &cols);
        cand[i] = r->land[i] != r->target_data[i] &&
                  (r->quant[i].scheme == WSYNC_QUANT_BLOCK ||
                   r->quant[i].scheme == WSYNC_QUANT_CHANNEL) &&
                  rows * cols > 0 && r->q_need[i] == rows * cols;
    }
    *candidates = cand;
    return WSYNC_OK;
}

int wsync_qdirect_fits(const wsync_receiver_t *r, uint32_t t, uint64_t row0, uint64_t rows)
{
    uint64_t trows, tcols, br = cell_rows(&r->quant[t]);
    wsync_shape_matrix(r->targets[t].ndim, r->targets[t].shape, &trows, &tcols);
    return rows > 0 && row0 % br == 0 && row0 + rows <= trows &&
           (rows % br == 0 || row0 + rows == trows);
}

wsync_status_t wsync_qdirect_add(wsync_receiver_t *r, const wsync_qrun_t *run, uint32_t *index)
{
    if (r->nqruns == r->qruns_cap) {
        uint32_t cap = r->qruns_cap ? r->qruns_cap * 2 : 64;
        wsync_qrun_t *q = realloc(r->qruns, (size_t)cap * sizeof(*q));
        if (q == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "receiver %d: no memory for %u quantization runs",
                             r->m.rank, cap);
        r->qruns = q;
        r->qruns_cap = cap;
    }
    *index = r->nqruns;
    r->qruns[r->nqruns++] = *run;
    return WSYNC_OK;
}

wsync_status_t wsync_qdirect_commit(wsync_receiver_t *r, const uint8_t *direct)
{
    wsync_status_t st = WSYNC_OK;
    size_t bytes = (size_t)r->nqruns * WSYNC_KQUANT_WS_BYTES + 1;

    for (uint32_t k = 0; k < r->nqruns; k++)
        if (!direct[r->qruns[k].target])
            return wsync_err(WSYNC_ERR_INTERNAL, "receiver %d: a quantization run of target '%s', "
                             "which is not quantized by runs", r->m.rank,
                             r->targets[r->qruns[k].target].name);
    memcpy(r->q_direct, direct, r->ntargets);
    wsync_dev_free(r->qrun_ws);   /* waits for the device: no run of an earlier version uses it */
    r->qrun_ws = NULL;
    st = wsync_dev_malloc(bytes, &r->qrun_ws);
    /* flags of runs never launched read as clear */
    if (st == WSYNC_OK && (st = wsync_dev_memset_async(r->qrun_ws, 0, bytes, r->dev_stream)) == WSYNC_OK)
        st = wsync_dev_stream_sync(r->dev_stream, wsync_deadline_in(r->m.timeout_ms),
                                   "clearing the quantization runs' workspaces");
    if (st != WSYNC_OK)
        memset(r->q_direct, 0, r->ntargets);
    r->qrun_dirty = 0;
    return st;
}

static wsync_kquant_t run_args(const wsync_receiver_t *r, const wsync_qrun_t *q)
{
    const wsync_target_desc_t *t = &r->targets[q->target];
    const wsync_quant_t *qu = &r->quant[q->target];
    uint64_t rows, cols;
    int64_t sr = 0, sc = 1;
    wsync_shape_matrix(t->ndim, t->shape, &rows, &cols);
    (void)wsync_quant_scales_shape(qu, (int64_t)rows, (int64_t)cols, &sr, &sc);   /* checked at add_target */
    float *scales = r->dev_scales[q->target] != NULL ? r->dev_scales[q->target] : qu->scales;
    wsync_kquant_t a = {t->name, q->src, q->src_dtype, q->rows, cols, q->src_pitch, *qu, t->dtype,
                        (uint8_t *)r->target_data[q->target] + q->row0 * cols, cols,
                        scales + q->row0 / cell_rows(qu) * (uint64_t)sc, q->row0, NULL};
    return a;
}

wsync_status_t wsync_qdirect_launch(wsync_receiver_t *r, const uint32_t *index, uint32_t n,
                                    uint32_t max_blocks, void *stream)
{
    wsync_kquant_t small_a[16];
    void *small_w[16];
    wsync_kquant_t *a = n <= 16 ? small_a : malloc(n * sizeof(*a));
    void **ws = n <= 16 ? small_w : malloc(n * sizeof(*ws));
    wsync_status_t st = WSYNC_OK;

    if (a == NULL || ws == NULL)
        st = wsync_err(WSYNC_ERR_NOMEM, "receiver %d: no memory for %u quantization runs",
                       r->m.rank, n);
    for (uint32_t i = 0; i < n && st == WSYNC_OK; i++) {
        a[i] = run_args(r, &r->qruns[index[i]]);
        ws[i] = (uint8_t *)r->qrun_ws + (size_t)index[i] * WSYNC_KQUANT_WS_BYTES;
    }
    if (st == WSYNC_OK && n > 0) {
        r->qrun_dirty = 1;   /* clean again only once a check found every flag clear */
        st = wsync_dev_quantize_many(a, n, ws, max_blocks, stream);
    }
    if (a != small_a)
        free(a);
    if (ws != small_w)
        free(ws);
    return st;
}

wsync_status_t wsync_qdirect_clear(wsync_receiver_t *r)
{
    size_t bytes = (size_t)r->nqruns * WSYNC_KQUANT_WS_BYTES + 1;
    wsync_status_t st;

    int saved = -1;

    if (!r->qrun_dirty || r->qrun_ws == NULL)
        return WSYNC_OK;
    if ((st = wsync_dev_enter(r->device, &saved)) != WSYNC_OK)
        return st;
    st = wsync_dev_memset_async(r->qrun_ws, 0, bytes, r->dev_stream);
    if (st == WSYNC_OK)
        st = wsync_dev_stream_sync(r->dev_stream, wsync_deadline_in(r->m.timeout_ms),
                                   "clearing the quantization runs' workspaces");
    wsync_dev_leave(r->device, saved);
    if (st == WSYNC_OK)
        r->qrun_dirty = 0;
    return st;
}

wsync_status_t wsync_qdirect_check(wsync_receiver_t *r)
{
    size_t bad = r->nqruns;
    wsync_status_t st;

    if (r->nqruns == 0)
        return WSYNC_OK;
    st = wsync_dev_quantize_check(r->qrun_ws, r->nqruns, r->dev_stream,
                                  wsync_deadline_in(r->m.timeout_ms), &bad);
    if (st == WSYNC_OK && bad >= r->nqruns)
        r->qrun_dirty = 0;
    if (st != WSYNC_OK || bad >= r->nqruns)
        return st;
    /* the run that saw NaN or Inf names the element, in the target's rows */
    wsync_kquant_t a = run_args(r, &r->qruns[bad]);
    st = wsync_dev_quantize_finish(&a, (uint8_t *)r->qrun_ws + bad * WSYNC_KQUANT_WS_BYTES,
                                   r->dev_stream);
    if (st == WSYNC_OK)
        st = wsync_err(WSYNC_ERR_NONFINITE, "receiver %d: target '%s': non-finite value while "
                       "quantizing", r->m.rank, a.name);
    return st;
}

void wsync_qdirect_free(wsync_receiver_t *r)
{
    wsync_dev_free(r->qrun_ws);
    free(r->qruns);
    free(r->q_direct);
    r->qrun_ws = NULL;
    r->qruns = NULL;
    r->q_direct = NULL;
    r->nqruns = r->qruns_cap = 0;
}
