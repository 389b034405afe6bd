/* CPU executor for FP8 on the wire (docs/fp8_wire.md): a sender quantizes a chunk's region into
 * its bucket place as FP8 codes then scales, and a receiver copies them into its target and its
 * scale matrix. The plan lays every such chunk on whole cells of each target it feeds, so the
 * chunk's cells quantized alone are the target's cells: wsync_quantize_f32, the reference, is
 * run over tiles of whole cells of the chunk. */
#include "reshard/exec.h"

#include "core/status.h"
#include "core/util.h"
#include "reshard/convert.h"
#include "reshard/fp8.h"

#include <float.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* Cells per tile: at most the quantizer's on-stack cell table (64), so that it allocates
 * nothing and can fail only on arguments checked before anything is written. */
#define TILE_CELLS 64u
/* Rows of a per-channel tile are capped so that its f32 scratch stays near this size. */
#define TILE_BYTES (1u << 20)

/* A tile of whole cells of the chunk: rows [r0, r0 + rows), columns [c0, c0 + cols); its
 * scales are `rows` (channel) or `cols / bc` (block) consecutive floats of the chunk's scale
 * matrix, starting at cell `cell`. */
typedef struct {
    uint64_t r0, rows, c0, cols, cell, ncells;
} tile_t;

/* Masks of an element's exponent and mantissa bits, and its size, for bf16, f16 or f32. */
static void float_bits(wsync_dtype_t dt, uint32_t *exp, uint32_t *man, size_t *esz)
{
    *exp = dt == WSYNC_DTYPE_F32 ? 0x7f800000u : dt == WSYNC_DTYPE_BF16 ? 0x7f80u : 0x7c00u;
    *man = dt == WSYNC_DTYPE_F32 ? 0x007fffffu : dt == WSYNC_DTYPE_BF16 ? 0x007fu : 0x03ffu;
    *esz = wsync_dtype_size(dt);
}

static uint32_t load_bits(const uint8_t *p, size_t esz)
{
    uint16_t h;
    uint32_t u;

    if (esz == 4) {
        memcpy(&u, p, 4);
        return u;
    }
    memcpy(&h, p, 2);
    return h;
}

/* Loops below go in chunks of CHUNK elements with restrict pointers: a fixed trip count
 * without aliasing is what GCC's -O2 cost model needs to vectorize them (as in fp8.c). */
#define CHUNK 16

/* The largest exponent field of a row (masked bits, as unsigned): equal to the mask exactly
 * when the row holds an Inf or NaN. */
static uint32_t row_exp_max32(const uint8_t *restrict p, uint64_t n, uint32_t mask)
{
    uint32_t acc[CHUNK] = {0}, worst = 0;
    uint64_t c = 0;

    for (; c + CHUNK <= n; c += CHUNK) {
        uint32_t u[CHUNK];
        memcpy(u, p + c * 4, sizeof(u));
        for (int k = 0; k < CHUNK; k++)
            acc[k] = (u[k] & mask) > acc[k] ? u[k] & mask : acc[k];
    }
    for (; c < n; c++) {
        uint32_t u;
        memcpy(&u, p + c * 4, 4);
        worst = (u & mask) > worst ? u & mask : worst;
    }
    for (int k = 0; k < CHUNK; k++)
        worst = acc[k] > worst ? acc[k] : worst;
    return worst;
}

static uint16_t row_exp_max16(const uint8_t *restrict p, uint64_t n, uint16_t mask)
{
    uint16_t acc[CHUNK] = {0}, worst = 0;
    uint64_t c = 0;

    for (; c + CHUNK <= n; c += CHUNK) {
        uint16_t h[CHUNK];
        memcpy(h, p + c * 2, sizeof(h));
        for (int k = 0; k < CHUNK; k++)
            acc[k] = (uint16_t)(h[k] & mask) > acc[k] ? (uint16_t)(h[k] & mask) : acc[k];
    }
    for (; c < n; c++) {
        uint16_t h;
        memcpy(&h, p + c * 2, 2);
        worst = (uint16_t)(h & mask) > worst ? (uint16_t)(h & mask) : worst;
    }
    for (int k = 0; k < CHUNK; k++)
        worst = acc[k] > worst ? acc[k] : worst;
    return worst;
}

/* The first non-finite element of the region in row-major order, found on the raw bits (an
 * all-ones exponent): 1, its (*row, *col) and its bits when there is one. A row's largest
 * exponent is found first (a loop compilers vectorize); the element only in a bad row. */
static int find_nonfinite(const uint8_t *base, wsync_dtype_t dt, const wsync_region_t *g,
                          uint64_t *row, uint64_t *col, uint32_t *bits)
{
    uint32_t em, mm;
    size_t esz;

    float_bits(dt, &em, &mm, &esz);
    for (uint64_t r = 0; r < g->rows; r++) {
        const uint8_t *p = base + (g->off + r * g->pitch) * esz;
        uint32_t worst = esz == 4 ? row_exp_max32(p, g->cols, em)
                                  : row_exp_max16(p, g->cols, (uint16_t)em);
        if (worst != em)
            continue;
        for (uint64_t c = 0; c < g->cols; c++) {
            uint32_t u = load_bits(p + c * esz, esz);
            if ((u & em) == em) {
                *row = r;
                *col = c;
                *bits = u;
                return 1;
            }
        }
    }
    return 0;
}

static wsync_status_t report_nonfinite(const wsync_chunk_t *ch, const char *param,
                                       const void *shard_data)
{
    uint64_t r = 0, c = 0;
    uint32_t u = 0, em, mm;
    size_t esz;

    if (!find_nonfinite(shard_data, ch->dtype, &ch->src, &r, &c, &u))
        return WSYNC_OK;
    float_bits(ch->dtype, &em, &mm, &esz);
    return wsync_err(WSYNC_ERR_NONFINITE, "sender %u: param '%s': %s at row %" PRIu64 ", column %"
                     PRIu64 " of its chunk of %" PRIu64 " x %" PRIu64 " (shard %u, element %"
                     PRIu64 "), which it quantizes to FP8 for the wire", ch->sender,
                     param != NULL ? param : "?",
                     (u & mm) ? "NaN" : (u >> (esz * 8 - 1)) ? "-Inf" : "Inf", r, c,
                     ch->src.rows, ch->src.cols, ch->shard,
                     ch->src.off + r * ch->src.pitch + c);
}

/* Rows and columns of one tile: one row of block cells, at most TILE_CELLS cells wide; or up
 * to TILE_CELLS channel rows, fewer when the rows are long. */
static void tile_dims(const wsync_wire_rule_t *ru, uint64_t cols, uint64_t *trows,
                      uint64_t *tcols)
{
    if (ru->scheme == WSYNC_QUANT_BLOCK) {
        uint64_t cell = (uint64_t)ru->block_rows * (uint64_t)ru->block_cols * 4u;
        uint64_t k = TILE_BYTES / cell;
        *trows = (uint64_t)ru->block_rows;
        *tcols = (uint64_t)ru->block_cols * (k < 1 ? 1 : k > TILE_CELLS ? TILE_CELLS : k);
    } else {
        uint64_t k = TILE_BYTES / 4u / cols;
        *trows = k < 1 ? 1 : k > TILE_CELLS ? TILE_CELLS : k;
        *tcols = cols;
    }
}

/* Rows of bf16 / f16 to f32 (the output never aliases the shard). */
static void row_bf16(const uint8_t *restrict p, float *restrict o, uint64_t n)
{
    uint64_t c = 0;

    for (; c + CHUNK <= n; c += CHUNK) {
        uint16_t h[CHUNK];
        uint32_t u[CHUNK];
        memcpy(h, p + c * 2, sizeof(h));
        for (int k = 0; k < CHUNK; k++)
            u[k] = (uint32_t)h[k] << 16;
        memcpy(o + c, u, sizeof(u));
    }
    for (; c < n; c++) {
        uint16_t h;
        memcpy(&h, p + c * 2, 2);
        o[c] = wsync_bf16_to_f32(h);
    }
}

static void row_f16(const uint8_t *restrict p, float *restrict o, uint64_t n)
{
    for (uint64_t c = 0; c < n; c++) {   /* f16 is rare for weights: the plain conversion */
        uint16_t h;
        memcpy(&h, p + c * 2, 2);
        o[c] = wsync_f16_to_f32(h);
    }
}

/* The tile's values as rows of f32 at *x (pitch *pitch): the shard itself for f32, else
 * converted into scratch (pitch = the tile's cols). */
static void tile_input(const wsync_chunk_t *ch, const uint8_t *shard, const tile_t *tl,
                       float *scratch, const float **x, uint64_t *pitch)
{
    size_t esz = wsync_dtype_size(ch->dtype);
    const uint8_t *first = shard + (ch->src.off + tl->r0 * ch->src.pitch + tl->c0) * esz;

    if (ch->dtype == WSYNC_DTYPE_F32) {
        *x = (const float *)(const void *)first;   /* an f32 shard is float-aligned */
        *pitch = ch->src.pitch;
        return;
    }
    for (uint64_t r = 0; r < tl->rows; r++) {
        const uint8_t *p = first + r * ch->src.pitch * esz;
        if (ch->dtype == WSYNC_DTYPE_BF16)
            row_bf16(p, scratch + r * tl->cols, tl->cols);
        else
            row_f16(p, scratch + r * tl->cols, tl->cols);
    }
    *x = scratch;
    *pitch = tl->cols;
}

/* Quantize the chunk tile by tile into its bucket place `codes` (codes dense, then scales). */
static wsync_status_t pack_tiles(const wsync_chunk_t *ch, const wsync_wire_rule_t *ru,
                                 const char *param, const void *shard_data, uint8_t *codes,
                                 float *scratch, uint64_t trows, uint64_t tcols)
{
    uint64_t rows = ch->src.rows, cols = ch->src.cols, cell_rows, cell_cols;
    float tile_scales[TILE_CELLS];
    wsync_status_t st = WSYNC_OK;
    wsync_quant_t q;

    wsync_wire_cells(ru, rows, cols, &cell_rows, &cell_cols);
    wsync_wire_rule_quant(ru, &q);
    for (uint64_t r0 = 0; r0 < rows && st == WSYNC_OK; r0 += trows) {
        for (uint64_t c0 = 0; c0 < cols && st == WSYNC_OK; c0 += tcols) {
            tile_t tl = {r0, WSYNC_MIN(trows, rows - r0), c0, WSYNC_MIN(tcols, cols - c0), 0, 0};
            const float *x;
            uint64_t pitch, tcr, tcc;
            wsync_wire_cells(ru, tl.rows, tl.cols, &tcr, &tcc);
            tl.ncells = tcr * tcc;
            tl.cell = ru->scheme == WSYNC_QUANT_BLOCK
                          ? r0 / (uint64_t)ru->block_rows * cell_cols +
                                c0 / (uint64_t)ru->block_cols
                          : r0;
            tile_input(ch, shard_data, &tl, scratch, &x, &pitch);
            st = wsync_quantize_f32(param, x, tl.rows, tl.cols, pitch, &q, ru->fp8_dtype,
                                    codes + r0 * cols + c0, cols, tile_scales);
            /* scales through memcpy: the bucket's place needs no float alignment */
            if (st == WSYNC_OK)
                memcpy(codes + wsync_wire_scales_off(rows, cols) + tl.cell * 4u, tile_scales,
                       (size_t)tl.ncells * 4u);
        }
    }
    return st;
}

static wsync_status_t pack_check(const wsync_plan_t *plan, const wsync_chunk_t *ch,
                                 const void *shard_data, const void *bucket)
{
    if (plan == NULL || ch == NULL || shard_data == NULL || bucket == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "pack (FP8 on the wire): NULL argument");
    if (ch->rule == 0 || ch->rule > plan->nrules)
        return wsync_err(WSYNC_ERR_INVALID, "pack (FP8 on the wire): chunk of sender %u names "
                         "rule %u of %u", ch->sender, ch->rule, plan->nrules);
    if (ch->dtype != WSYNC_DTYPE_BF16 && ch->dtype != WSYNC_DTYPE_F16 &&
        ch->dtype != WSYNC_DTYPE_F32)
        return wsync_err(WSYNC_ERR_UNSUPPORTED, "pack (FP8 on the wire): sender %u: a chunk of "
                         "%s is quantized from bf16, f16 or f32 only", ch->sender,
                         wsync_dtype_name(ch->dtype));
    if (ch->src.rows == 0 || ch->src.cols == 0 || ch->src.pitch < ch->src.cols)
        return wsync_err(WSYNC_ERR_INVALID, "pack (FP8 on the wire): sender %u: chunk of %" PRIu64
                         " x %" PRIu64 " at pitch %" PRIu64, ch->sender, ch->src.rows,
                         ch->src.cols, ch->src.pitch);
    return WSYNC_OK;
}

wsync_status_t wsync_exec_pack_wire(const wsync_plan_t *plan, const wsync_chunk_t *chunk,
                                    const char *param, const void *shard_data, void *bucket)
{
    const wsync_chunk_t *ch = chunk;
    const wsync_wire_rule_t *ru;
    uint64_t rows, cols, cell_rows, cell_cols, trows, tcols;
    float *scratch = NULL;
    wsync_status_t st = pack_check(plan, ch, shard_data, bucket);

    if (st != WSYNC_OK)
        return st;
    ru = &plan->rules[ch->rule - 1];
    if (wsync_wire_rule_needs_amax(ru))
        return wsync_err(WSYNC_ERR_INVALID, "pack (FP8 on the wire): sender %u: param '%s': a "
                         "per-tensor chunk needs the target's amax (wsync_exec_pack_wire_amax)",
                         ch->sender, param != NULL ? param : "?");
    rows = ch->src.rows;
    cols = ch->src.cols;
    wsync_wire_cells(ru, rows, cols, &cell_rows, &cell_cols);
    if (cell_rows * cell_cols != ch->ncells)
        return wsync_err(WSYNC_ERR_INVALID, "pack (FP8 on the wire): sender %u: param '%s': a "
                         "%" PRIu64 " x %" PRIu64 " chunk has %" PRIu64 " cells, not %u",
                         ch->sender, param != NULL ? param : "?", rows, cols,
                         cell_rows * cell_cols, ch->ncells);
    /* refused before anything is written: the bucket keeps what it held */
    if ((st = report_nonfinite(ch, param, shard_data)) != WSYNC_OK)
        return st;
    tile_dims(ru, cols, &trows, &tcols);
    if (ch->dtype != WSYNC_DTYPE_F32) {
        scratch = malloc((size_t)(WSYNC_MIN(trows, rows) * WSYNC_MIN(tcols, cols)) * sizeof(float));
        if (scratch == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "pack (FP8 on the wire): sender %u: param '%s': "
                             "scratch for %" PRIu64 " x %" PRIu64 " values", ch->sender,
                             param != NULL ? param : "?", trows, tcols);
    }
    st = pack_tiles(ch, ru, param, shard_data, (uint8_t *)bucket + ch->bucket_off, scratch,
                    trows, tcols);
    free(scratch);
    return st;
}

/* Per-tensor rules: rows of the chunk in tiles of up to TILE_BYTES of f32 (channel-like), so
 * that bf16 and f16 shards convert through a bounded scratch. */
static wsync_status_t tensor_tiles(const wsync_chunk_t *ch, const char *param,
                                   float **scratch, uint64_t *trows)
{
    uint64_t k = TILE_BYTES / 4u / ch->src.cols;

    *trows = WSYNC_MIN(k < 1 ? 1 : k, ch->src.rows);
    *scratch = NULL;
    if (ch->dtype == WSYNC_DTYPE_F32)
        return WSYNC_OK;
    *scratch = malloc((size_t)(*trows * ch->src.cols) * sizeof(float));
    if (*scratch == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "pack (FP8 on the wire): sender %u: param '%s': "
                         "scratch for %" PRIu64 " x %" PRIu64 " values", ch->sender,
                         param != NULL ? param : "?", *trows, ch->src.cols);
    return WSYNC_OK;
}

static wsync_status_t tensor_check(const wsync_plan_t *plan, const wsync_chunk_t *ch,
                                   const char *param, const void *shard_data, const void *out)
{
    wsync_status_t st = pack_check(plan, ch, shard_data, out);

    if (st == WSYNC_OK && !wsync_wire_rule_needs_amax(&plan->rules[ch->rule - 1]))
        return wsync_err(WSYNC_ERR_INVALID, "pack (FP8 on the wire): sender %u: param '%s': "
                         "rule %u is not per-tensor", ch->sender, param != NULL ? param : "?",
                         ch->rule);
    if (st == WSYNC_OK && ch->ncells != 1)
        return wsync_err(WSYNC_ERR_INVALID, "pack (FP8 on the wire): sender %u: param '%s': a "
                         "per-tensor chunk has 1 scale, not %u", ch->sender,
                         param != NULL ? param : "?", ch->ncells);
    return st;
}

wsync_status_t wsync_exec_amax_wire(const wsync_plan_t *plan, const wsync_chunk_t *chunk,
                                    const char *param, const void *shard_data, float *amax)
{
    const wsync_chunk_t *ch = chunk;
    float *scratch, m = 0.0f;
    uint64_t trows;
    wsync_status_t st = tensor_check(plan, ch, param, shard_data, amax);

    if (st != WSYNC_OK || (st = report_nonfinite(ch, param, shard_data)) != WSYNC_OK ||
        (st = tensor_tiles(ch, param, &scratch, &trows)) != WSYNC_OK)
        return st;
    for (uint64_t r0 = 0; r0 < ch->src.rows; r0 += trows) {
        tile_t tl = {r0, WSYNC_MIN(trows, ch->src.rows - r0), 0, ch->src.cols, 0, 0};
        const float *x;
        uint64_t pitch;
        tile_input(ch, shard_data, &tl, scratch, &x, &pitch);
        for (uint64_t r = 0; r < tl.rows; r++) {
            float a = wsync_amax_f32(x + r * pitch, tl.cols);
            m = a > m ? a : m;
        }
    }
    free(scratch);
    *amax = m;
    return WSYNC_OK;
}

wsync_status_t wsync_exec_pack_wire_amax(const wsync_plan_t *plan, const wsync_chunk_t *chunk,
                                         const char *param, const void *shard_data, float amax,
                                         void *bucket)
{
    const wsync_chunk_t *ch = chunk;
    const wsync_wire_rule_t *ru;
    uint8_t *codes;
    float *scratch, s;
    uint64_t trows;
    wsync_status_t st = tensor_check(plan, ch, param, shard_data, bucket);

    if (st != WSYNC_OK)
        return st;
    if (!(amax >= 0.0f) || amax > FLT_MAX)
        return wsync_err(WSYNC_ERR_INVALID, "pack (FP8 on the wire): sender %u: param '%s': "
                         "the target's amax %g is not finite", ch->sender,
                         param != NULL ? param : "?", (double)amax);
    /* refused before anything is written, as the other rules are */
    if ((st = report_nonfinite(ch, param, shard_data)) != WSYNC_OK ||
        (st = tensor_tiles(ch, param, &scratch, &trows)) != WSYNC_OK)
        return st;
    ru = &plan->rules[ch->rule - 1];
    s = wsync_fp8_tensor_scale(amax, ru->fp8_dtype);
    codes = (uint8_t *)bucket + ch->bucket_off;
    for (uint64_t r0 = 0; r0 < ch->src.rows && st == WSYNC_OK; r0 += trows) {
        tile_t tl = {r0, WSYNC_MIN(trows, ch->src.rows - r0), 0, ch->src.cols, 0, 0};
        const float *x;
        uint64_t pitch;
        tile_input(ch, shard_data, &tl, scratch, &x, &pitch);
        st = wsync_fp8_encode_scaled_f32(x, tl.rows, tl.cols, pitch, s, ru->fp8_dtype,
                                         ru->no_saturate, codes + r0 * ch->src.cols,
                                         ch->src.cols);
    }
    free(scratch);
    if (st == WSYNC_OK)
        memcpy(codes + wsync_wire_scales_off(ch->src.rows, ch->src.cols), &s, 4);
    return st;
}

wsync_status_t wsync_exec_unpack_wire(const wsync_plan_t *plan, const wsync_segment_t *seg,
                                      const wsync_chunk_t *chunk, const void *bucket,
                                      const wsync_target_desc_t *t, void *target_data,
                                      float *scales)
{
    const wsync_wire_rule_t *ru;
    const uint8_t *src;
    uint64_t cell_rows, cell_cols, cr0, cc0, scale_cols;
    wsync_region_t dense;
    wsync_status_t st;

    if (plan == NULL || seg == NULL || chunk == NULL || bucket == NULL || t == NULL ||
        target_data == NULL || scales == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "unpack (FP8 on the wire): NULL argument");
    if (chunk->rule == 0 || chunk->rule > plan->nrules)
        return wsync_err(WSYNC_ERR_INVALID, "unpack (FP8 on the wire): target '%s': chunk %u "
                         "names rule %u of %u", t->name, seg->chunk, chunk->rule, plan->nrules);
    ru = &plan->rules[chunk->rule - 1];
    if (t->dtype != ru->fp8_dtype || seg->dst.rows != chunk->src.rows ||
        seg->dst.cols != chunk->src.cols)
        return wsync_err(WSYNC_ERR_INVALID, "unpack (FP8 on the wire): target '%s' (%s): chunk "
                         "%u of %" PRIu64 " x %" PRIu64 " %s into a region of %" PRIu64 " x %"
                         PRIu64, t->name, wsync_dtype_name(t->dtype), seg->chunk,
                         chunk->src.rows, chunk->src.cols, wsync_dtype_name(ru->fp8_dtype),
                         seg->dst.rows, seg->dst.cols);
    /* whole cells of the target under its own cell geometry, inside it: codes and scales are
     * written only there, whatever the plan says (O(1) per segment and version; the full rule
     * check, wsync_plan_check_wire_segment, ran on the plan once) */
    if (ru->scheme != t->quant ||
        (ru->scheme == WSYNC_QUANT_BLOCK &&
         (ru->block_rows != t->block_rows || ru->block_cols != t->block_cols)) ||
        !wsync_wire_region_whole(ru, t, seg->dst.off, seg->dst.pitch, seg->dst.rows,
                                 seg->dst.cols))
        return wsync_err(WSYNC_ERR_PROTOCOL, "unpack (FP8 on the wire): receiver %u target '%s' "
                         "(quant %d, blocks %d x %d): chunk %u, FP8 rule %u (quant %d, blocks %d "
                         "x %d), lands on cells it does not cover whole (offset %" PRIu64 ", %"
                         PRIu64 " x %" PRIu64 ", pitch %" PRIu64 ")", seg->receiver, t->name,
                         (int)t->quant, t->block_rows, t->block_cols, seg->chunk, chunk->rule,
                         (int)ru->scheme, ru->block_rows, ru->block_cols, seg->dst.off,
                         seg->dst.rows, seg->dst.cols, seg->dst.pitch);
    wsync_wire_cells(ru, chunk->src.rows, chunk->src.cols, &cell_rows, &cell_cols);
    wsync_wire_scales_at(ru, t, &seg->dst, &cr0, &cc0, &scale_cols);
    if (cc0 + cell_cols > scale_cols)
        return wsync_err(WSYNC_ERR_INVALID, "unpack (FP8 on the wire): target '%s': chunk %u's "
                         "%" PRIu64 " cells a row from scale column %" PRIu64 " pass the %"
                         PRIu64 " columns of the scales", t->name, seg->chunk, cell_cols, cc0,
                         scale_cols);
    src = (const uint8_t *)bucket + chunk->bucket_off;
    dense = (wsync_region_t){0, chunk->src.cols, chunk->src.rows, chunk->src.cols};
    st = wsync_exec_copy(src, t->dtype, &dense, target_data, t->dtype, &seg->dst);
    if (st != WSYNC_OK)
        return st;
    src += wsync_wire_scales_off(chunk->src.rows, chunk->src.cols);
    for (uint64_t i = 0; i < cell_rows; i++)
        memcpy(scales + (cr0 + i) * scale_cols + cc0, src + i * cell_cols * 4u,
               (size_t)cell_cols * 4u);
    return WSYNC_OK;
}
