/* FP8 on the wire: the CUDA path's descriptors (kernels/wire.c) and the nccl schedule's bytes,
 * checked on the CPU (CI has no GPU; tests/gpu/test_fp8_wire_gpu runs the kernels themselves).
 *
 * The descriptors hold plain pointers, so here they point at host memory and are carried out by
 * the CPU: a pack descriptor by wsync_quantize_f32 over its input (converted to f32), an unpack
 * copy element by element. Plans compiled with FP8 on the wire, small buckets so that chunks are
 * split at cell rows: the target and its scale matrix filled that way must equal
 * wsync_quantize_f32 of the whole target, which checks every offset, pitch and cell position the
 * descriptors carry. Also: their refusals, and the nccl schedule of such a plan counting each
 * chunk's wire bytes (codes, then 4-byte aligned scales), never its values'. */
#include "kernels/kernels.h"
#include "reshard/convert.h"
#include "reshard/fp8.h"
#include "reshard/plan.h"
#include "schemes/nccl.h"
#include "tests/support/check.h"
#include "tests/support/fp8_wire_fixtures.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A finite value exact in bf16, f16 and f32: |x| in [2^-7, 2). */
static float value(uint64_t i)
{
    uint16_t x = (uint16_t)mix64(i * 0x2545F4914F6CDD1Dull);
    uint32_t u = ((uint32_t)((x & 0x8000u) | ((120u + ((x >> 7) & 7u)) << 7) | (x & 0x7Fu)))
                 << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float load_f32(const uint8_t *p, wsync_dtype_t dt)
{
    uint16_t h;
    float f;
    if (dt == WSYNC_DTYPE_F32) {
        memcpy(&f, p, 4);
        return f;
    }
    memcpy(&h, p, 2);
    return dt == WSYNC_DTYPE_BF16 ? wsync_bf16_to_f32(h) : wsync_f16_to_f32(h);
}

/* What the quantize kernel does with a descriptor, done by the CPU reference. */
static wsync_status_t run_quant(const wsync_kquant_t *a)
{
    size_t esz = wsync_dtype_size(a->x_dtype);
    float *x = malloc(a->rows * a->cols * sizeof(float) + 1);
    wsync_status_t st;
    if (x == NULL)
        return WSYNC_ERR_NOMEM;
    for (uint64_t r = 0; r < a->rows; r++)
        for (uint64_t c = 0; c < a->cols; c++)
            x[r * a->cols + c] = load_f32((const uint8_t *)a->x + (r * a->x_pitch + c) * esz,
                                          a->x_dtype);
    st = wsync_quantize_f32(a->name, x, a->rows, a->cols, a->cols, &a->quant, a->fp8_dtype,
                            a->out, a->out_pitch, a->scales);
    free(x);
    return st;
}

/* What the copy kernel does with a same-dtype descriptor. */
static void run_copy(const wsync_kcopy_t *c)
{
    size_t esz = wsync_dtype_size(c->src_dtype);
    CHECK(c->src_dtype == c->dst_dtype && esz > 0 && c->cols <= c->src_pitch &&
          c->cols <= c->dst_pitch);
    for (uint64_t r = 0; r < c->rows; r++)
        memcpy((uint8_t *)c->dst + (c->dst_off + r * c->dst_pitch) * esz,
               (const uint8_t *)c->src + (c->src_off + r * c->src_pitch) * esz, c->cols * esz);
}

typedef struct {
    const char *name;
    uint64_t rows, cols, c0, tcols;  /* param [rows, cols]; the target its columns c0.. */
    wsync_dtype_t x_dtype, fp8;
    wsync_quant_scheme_t scheme;
    int br, bc, ue8m0, no_saturate;
    uint64_t bucket;
    uint32_t split;                  /* senders, each holding cols / split columns (0: 1) */
} wcase_t;

static void one_case(const wcase_t *k)
{
    size_t esz = wsync_dtype_size(k->x_dtype);
    uint64_t R = k->rows, C = k->cols, TC = k->tcols;
    wsync_quant_t q = {k->scheme, k->br, k->bc, 0.0f, k->ue8m0, k->no_saturate, NULL,
                       WSYNC_MEM_HOST};
    int64_t sr = 0, sc = 0;
    uint32_t ns = k->split ? k->split : 1;
    uint64_t SC = C / ns;            /* a sender's columns */
    uint8_t *shard = malloc(R * C * esz), *want = malloc(R * TC), *have = malloc(R * TC);
    float *tf = malloc(R * TC * sizeof(float)), *want_s = NULL, *have_s = NULL;
    uint8_t *buckets = NULL;
    uint32_t base[4] = {0};
    wsync_shard_desc_t sd[4];
    wsync_target_desc_t td;
    wsync_plan_t *plan = NULL;
    wsync_nccl_sched_t *sched = NULL;

    memset(sd, 0, sizeof(sd));
    memset(&td, 0, sizeof(td));
    CHECK(shard && want && have && tf);
    if (check_failures)
        goto out;
    for (uint64_t r = 0; r < R; r++)
        for (uint64_t c = 0; c < C; c++) {
            float f = value(r * C + c);
            /* sender c / SC's shard, dense [R, SC], one after the other */
            uint8_t *p = shard + ((c / SC) * R * SC + r * SC + c % SC) * esz;
            if (k->x_dtype == WSYNC_DTYPE_F32) {
                memcpy(p, &f, 4);
            } else {
                uint16_t h = k->x_dtype == WSYNC_DTYPE_BF16 ? wsync_f32_to_bf16(f)
                                                            : wsync_f32_to_f16(f);
                memcpy(p, &h, 2);
            }
            if (c >= k->c0 && c < k->c0 + TC)
                tf[r * TC + c - k->c0] = f;
        }
    CHECK_OK(wsync_quant_scales_shape(&q, (int64_t)R, (int64_t)TC, &sr, &sc));
    want_s = malloc((size_t)(sr * sc) * sizeof(float));
    have_s = malloc((size_t)(sr * sc) * sizeof(float));
    CHECK_OK(wsync_quantize_f32(k->name, tf, R, TC, TC, &q, k->fp8, want, TC, want_s));

    wsync_piece_t pc = {{k->name, k->x_dtype, 2, {(int64_t)R, (int64_t)C}},
                        {{0, (int64_t)k->c0}, {(int64_t)R, (int64_t)TC}}, {0, 0}};
    wsync_target_t tg = {k->name, k->fp8, 2, {(int64_t)R, (int64_t)TC}, have, WSYNC_MEM_HOST, 0,
                         &pc, 1, q};
    for (uint32_t i = 0; i < ns; i++) {
        wsync_shard_t sh = {{k->name, k->x_dtype, 2, {(int64_t)R, (int64_t)C}},
                            {{0, (int64_t)(i * SC)}, {(int64_t)R, (int64_t)SC}},
                            shard + i * R * SC * esz, WSYNC_MEM_HOST, 0};
        CHECK_OK(wsync_shard_desc_from(&sh, i, 0, &sd[i]));
    }
    CHECK_OK(wsync_target_desc_from(&tg, 0, 0, &td));
    CHECK_OK(wsync_plan_compile_opts(sd, ns, &td, 1, ns, 1, k->bucket,
                                     &(wsync_plan_opts_t){.fp8_wire = 1}, &plan));
    if (check_failures)
        goto out;
    CHECK_MSG(plan->nrules == 1 && plan->nchunks >= 2, "%s: %u rules, %u chunks", k->name,
              plan->nrules, plan->nchunks);
    for (uint32_t i = 0; i < plan->nchunks; i++)
        CHECK_MSG(plan->chunks[i].rule == 1, "%s: chunk %u travels plain", k->name, i);
    if (check_failures)
        goto out;
    for (uint32_t i = 1; i <= ns && i < 4; i++)
        base[i] = base[i - 1] + plan->nbuckets[i - 1];
    buckets = malloc((size_t)base[ns] * k->bucket);
    CHECK(buckets != NULL);
    if (buckets == NULL)
        goto out;
    memset(buckets, 0xA5, (size_t)base[ns] * k->bucket);
#define BUCKET(c) (buckets + (size_t)(base[(c)->sender] + (c)->bucket) * k->bucket)
    memset(have, 0xFF, R * TC);
    memset(have_s, 0xFF, (size_t)(sr * sc) * sizeof(float));

    /* pack every chunk into its bucket, then unpack every segment */
    for (uint32_t i = 0; i < plan->nchunks; i++) {
        const wsync_chunk_t *c = &plan->chunks[i];
        wsync_kquant_t a;
        CHECK_OK(wsync_kernels_pack_wire_desc(plan, c, shard + c->sender * R * SC * esz,
                                              BUCKET(c), &a));
        CHECK(a.out == BUCKET(c) + c->bucket_off && a.out_pitch == c->src.cols);
        CHECK(a.name == NULL && a.row_base == 0);
        if (check_failures)
            goto out;
        CHECK_OK(run_quant(&a));
    }
    for (uint32_t r = 0; r < plan->nreceivers; r++) {
        const wsync_segment_t *mine = NULL;
        uint32_t nmine = 0;
        CHECK_OK(wsync_plan_segments(plan, r, &mine, &nmine));
        for (uint32_t i = 0; i < nmine; i++) {
            const wsync_segment_t *sg = &mine[i];
            const wsync_chunk_t *c = &plan->chunks[sg->chunk];
            wsync_kcopy_t two[2];
            CHECK_OK(wsync_kernels_unpack_wire_desc(plan, sg, c, BUCKET(c), &td, have, have_s,
                                                    two));
            if (check_failures)
                goto out;
            CHECK(two[0].src_dtype == k->fp8 && two[1].src_dtype == WSYNC_DTYPE_F32);
            run_copy(&two[0]);
            run_copy(&two[1]);
        }
    }
    fw_check_codes(k->name, have, want, R, TC, have_s, want_s, (uint64_t)(sr * sc));

    /* the nccl schedule counts wire bytes: each op's items, 64-byte aligned, end at its bytes */
    CHECK_OK(wsync_nccl_sched_build(plan, WSYNC_NCCL_DIRECT_MIN, WSYNC_NCCL_MAX_SPLITS, &sched));
    if (sched != NULL) {
        uint64_t total = 0;
        for (uint32_t o = 0; o < sched->nops; o++) {
            const wsync_nccl_op_t *op = &sched->ops[o];
            uint64_t end = 0;
            for (uint32_t j = 0; j < op->nitems; j++) {
                const wsync_nccl_item_t *it = &sched->items[op->item0 + j];
                const wsync_chunk_t *c = &plan->chunks[it->chunk];
                uint64_t cr, cc, wb;
                wsync_wire_cells(&plan->rules[0], c->src.rows, c->src.cols, &cr, &cc);
                wb = ((c->src.rows * c->src.cols + 3) & ~(uint64_t)3) + 4 * cr * cc;
                CHECK(it->off % WSYNC_PLAN_ALIGN == 0 && it->off >= end);
                end = it->off + wb;
                total += wb;
            }
            CHECK_MSG(op->bytes == end, "%s: op %u of %" PRIu64 " bytes, its FP8 items end at %"
                      PRIu64, k->name, o, op->bytes, end);
        }
        uint64_t pair = 0;
        for (uint32_t i = 0; i < ns; i++)
            pair += plan->pair_bytes[i];
        CHECK_MSG(total == pair && total < R * TC * esz, "%s: the schedule carries %" PRIu64
                  " wire bytes, the plan's pair bytes are %" PRIu64 " (values: %" PRIu64 ")",
                  k->name, total, pair, R * TC * esz);
    }

    fw_check_wire_desc_refusals(plan, &td, shard, buckets, have, have_s);
out:
    wsync_nccl_sched_free(sched);
    wsync_plan_free(plan);
    for (uint32_t i = 0; i < 4; i++)
        wsync_shard_desc_clear(&sd[i]);
    wsync_target_desc_clear(&td);
    free(shard);
    free(want);
    free(have);
    free(tf);
    free(want_s);
    free(have_s);
    free(buckets);
}

static void test_block_bf16(void)
{
    wcase_t k = {"w.block", 640, 512, 256, 256, WSYNC_DTYPE_BF16, WSYNC_DTYPE_F8E4M3FN,
                 WSYNC_QUANT_BLOCK, 128, 128, 0, 0, 64u << 10, 1};
    one_case(&k);
}

/* Two senders holding column halves: two chunks side by side in each cell row, the second's
 * scales at cell column 2 of the target's scale matrix. */
static void test_block_column_halves(void)
{
    wcase_t k = {"w.halves", 384, 512, 0, 512, WSYNC_DTYPE_BF16, WSYNC_DTYPE_F8E4M3FN,
                 WSYNC_QUANT_BLOCK, 128, 128, 0, 0, 48u << 10, 2};
    one_case(&k);
}

static void test_block_ue8m0_f32_edge(void)
{
    wcase_t k = {"w.ue8m0", 300, 384, 0, 384, WSYNC_DTYPE_F32, WSYNC_DTYPE_F8E4M3FN,
                 WSYNC_QUANT_BLOCK, 64, 128, 1, 0, 96u << 10, 1};
    one_case(&k);
}

static void test_channel_f16(void)
{
    wcase_t k = {"w.channel", 200, 320, 64, 256, WSYNC_DTYPE_F16, WSYNC_DTYPE_F8E4M3FN,
                 WSYNC_QUANT_CHANNEL, 0, 0, 0, 0, 16u << 10, 1};
    one_case(&k);
}

static void test_channel_e5m2_odd_cols(void)
{
    /* 130 columns: a chunk's codes end off a 4-byte boundary, its scales are aligned after */
    wcase_t k = {"w.e5m2", 131, 130, 0, 130, WSYNC_DTYPE_BF16, WSYNC_DTYPE_F8E5M2,
                 WSYNC_QUANT_CHANNEL, 0, 0, 0, 1, 8u << 10, 1};
    one_case(&k);
}

int main(void)
{
    RUN(test_block_bf16);
    RUN(test_block_column_halves);
    RUN(test_block_ue8m0_f32_edge);
    RUN(test_channel_f16);
    RUN(test_channel_e5m2_odd_cols);
    return check_summary();
}
