/* Per-tensor FP8 on the wire (docs/fp8_wire.md section 5): the plan's marking
 * (plan_fp8_mark.c, wsync_plan_opts_t.fp8_tensor), the amax sets (schemes/wire_amax.c), the
 * reduction's message, and the senders' amax and pack (reshard/exec_wire.c) against
 * wsync_quantize_f32 of the whole target, carried out here on the CPU for every sender and
 * receiver of a plan (no processes: test_fp8_tensor_ipc runs them). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/wire.h"
#include "reshard/exec.h"
#include "reshard/fp8.h"
#include "reshard/plan.h"
#include "schemes/wire_amax.h"
#include "tests/support/check.h"
#include "tests/support/fp8_groups.h"
#include "tests/support/fp8_wire_fixtures.h"

#define BF16 WSYNC_DTYPE_BF16
#define E4M3 WSYNC_DTYPE_F8E4M3FN
#define TENSOR WSYNC_QUANT_TENSOR
#define R 256
#define C 192
#define CUT 100                      /* FSDP-2 rows: no multiple of anything */

/* The param [R, C] in bf16: rows from CUT on (sender 1's) 16 x larger. */
static void fill(uint16_t *w, uint32_t seed)
{
    uint64_t h = 0x9e3779b97f4a7c15ull * (seed + 1);
    for (int64_t i = 0; i < R * C; i++) {
        h ^= h << 13;
        h ^= h >> 7;
        h ^= h << 17;
        float x = ((float)(h >> 40) / 16777216.0f - 0.5f) * (i / C >= CUT ? 16.0f : 1.0f);
        w[i] = fg_f32_bf16(x);
    }
}

static wsync_plan_t *compile(fw_group_t *d, uint32_t nr, int tensor, uint64_t bucket)
{
    wsync_plan_t *p = NULL;
    wsync_plan_opts_t o = {.fp8_wire = 1, .fp8_tensor = tensor};
    CHECK_OK(wsync_plan_compile_opts(d->s, d->ns, d->t, d->nt, 2, nr, bucket, &o, &p));
    return p;
}

static void fsdp2(fw_group_t *d)
{
    memset(d, 0, sizeof(*d));
    fw_add_shard(d, 0, "w", BF16, R, C, 0, CUT);
    fw_add_shard(d, 1, "w", BF16, R, C, CUT, R - CUT);
}

static uint32_t tensor_chunks(const wsync_plan_t *p)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->nchunks; i++)
        n += p->chunks[i].rule != 0 && wsync_wire_rule_needs_amax(&p->rules[p->chunks[i].rule - 1]);
    return n;
}

/* TP-2 column slices of w (per-tensor), each fed by both senders: every chunk per-tensor FP8 with
 * fp8_tensor, none without; two sets, both senders hold chunks of each. The summary's forms
 * follow. */
static void test_marking(void)
{
    fw_group_t d;
    wsync_plan_t *p;

    fsdp2(&d);
    for (uint32_t r = 0; r < 2; r++) {
        fw_add_target(&d, r, "w.fp8", E4M3, R, C / 2, TENSOR, 0, 0, 0, 0);
        fw_add_piece(&d, "w", BF16, R, C, 0, R, r * (C / 2), C / 2, 0, 0);
    }
    p = compile(&d, 2, 1, 1u << 20);
    if (p != NULL) {
        wsync_amax_sets_t sets;
        CHECK_MSG(tensor_chunks(p) == p->nchunks && p->nchunks == 4, "%u of %u chunks per-tensor",
                  tensor_chunks(p), p->nchunks);
        for (uint32_t i = 0; i < p->nchunks; i++)
            CHECK(p->chunks[i].ncells == 1);
        CHECK_OK(wsync_amax_sets_build(p, &sets));
        CHECK(sets.nsets == 2 && sets.holds[0] && sets.holds[1]);
        /* a set is one receiver's target here: two segments share a set exactly when they
         * go to one receiver */
        wsync_segment_t *S = NULL;   /* every receiver's segments, flat */
        CHECK_OK(wsync_plan_flatten(p, &S));
        for (uint32_t i = 0; S != NULL && i < p->nsegments && sets.set != NULL; i++)
            for (uint32_t k = 0; k < p->nsegments; k++)
                CHECK((sets.set[S[i].chunk] == sets.set[S[k].chunk]) ==
                      (S[i].receiver == S[k].receiver));
        free(S);
        wsync_amax_sets_free(&sets);
        for (uint32_t r = 0; r < 2; r++)
            CHECK_OK(wsync_plan_check_receiver(p, r, &d.t[r], 1));
        /* through the wire form: the rule decodes */
        wsync_wbuf_t b;
        wsync_plan_t *q = NULL;
        wsync_wbuf_init(&b);
        wsync_plan_encode(p, &b);
        CHECK(!b.err);
        CHECK_OK(wsync_plan_decode(b.data, b.len, &q));
        if (q != NULL) {
            CHECK(q->nrules == 1 && q->rules[0].scheme == TENSOR && tensor_chunks(q) == 4);
            wsync_plan_free(q);
        }
        wsync_wbuf_free(&b);
        wsync_plan_free(p);
    }
    p = compile(&d, 2, 0, 1u << 20);
    if (p != NULL) {
        wsync_amax_sets_t sets;
        for (uint32_t i = 0; i < p->nchunks; i++)
            CHECK(p->chunks[i].rule == 0);
        CHECK_OK(wsync_amax_sets_build(p, &sets));
        CHECK(sets.nsets == 0 && sets.set == NULL);
        wsync_plan_free(p);
    }
}

/* Receiver 0 holds all of w, receiver 1 rows [0, 128): sender 0's chunk (rows 0..99) feeds both,
 * with different other chunks, so it would need two scales: both targets travel plain. Replicas
 * of one whole target share every chunk: one set, FP8. */
static void test_closure(void)
{
    fw_group_t d;
    wsync_plan_t *p;

    fsdp2(&d);
    fw_add_target(&d, 0, "w.fp8", E4M3, R, C, TENSOR, 0, 0, 0, 0);
    fw_add_piece(&d, "w", BF16, R, C, 0, R, 0, C, 0, 0);
    fw_add_target(&d, 1, "w.top", E4M3, 128, C, TENSOR, 0, 0, 0, 0);
    fw_add_piece(&d, "w", BF16, R, C, 0, 128, 0, C, 0, 0);
    p = compile(&d, 2, 1, 1u << 20);
    if (p != NULL) {
        CHECK_MSG(tensor_chunks(p) == 0, "%u chunks per-tensor FP8 where sets overlap",
                  tensor_chunks(p));
        wsync_plan_free(p);
    }
    fsdp2(&d);
    for (uint32_t r = 0; r < 3; r++) {
        fw_add_target(&d, r, "w.fp8", E4M3, R, C, TENSOR, 0, 0, 0, 0);
        fw_add_piece(&d, "w", BF16, R, C, 0, R, 0, C, 0, 0);
    }
    p = compile(&d, 3, 1, 1u << 20);
    if (p != NULL) {
        wsync_amax_sets_t sets;
        CHECK(tensor_chunks(p) == p->nchunks && p->nchunks == 2);
        CHECK_OK(wsync_amax_sets_build(p, &sets));
        CHECK(sets.nsets == 1);
        wsync_amax_sets_free(&sets);
        wsync_plan_free(p);
    }
}

/* Every sender's partial amaxes, reduced per set as sender 0 does through the relay's message,
 * every chunk packed with the agreed amax and unpacked into its receivers' targets: codes and
 * scale equal wsync_quantize_f32 of the whole target; small buckets split the chunks (several
 * scales per target, all the same). A sender packing with its own amax would differ: checked. */
static void test_pack_equals_reference(void)
{
    static uint16_t w[R * C];
    fw_group_t d;

    fill(w, 7);
    for (int small = 0; small < 2; small++) {
        fsdp2(&d);
        for (uint32_t r = 0; r < 2; r++) {
            fw_add_target(&d, r, "w.fp8", E4M3, R, C / 2, TENSOR, 0, 0, 0, 0);
            fw_add_piece(&d, "w", BF16, R, C, 0, R, r * (C / 2), C / 2, 0, 0);
        }
        wsync_plan_t *p = compile(&d, 2, 1, small ? 4096u : 1u << 20);
        wsync_amax_sets_t sets;
        if (p == NULL)
            return;
        CHECK(tensor_chunks(p) == p->nchunks);
        CHECK(small ? p->nchunks > 8 : p->nchunks == 4);
        CHECK_OK(wsync_amax_sets_build(p, &sets));
        wsync_segment_t *S = NULL;   /* every receiver's segments, flat */
        CHECK_OK(wsync_plan_flatten(p, &S));
        float agreed[2] = {0, 0}, own[2][2] = {{0, 0}, {0, 0}};
        for (uint32_t i = 0; i < p->nchunks; i++) {
            const wsync_chunk_t *ch = &p->chunks[i];
            const uint16_t *shard = w + (ch->sender ? CUT * C : 0);
            float a = -1.0f;
            CHECK_OK(wsync_exec_amax_wire(p, ch, "w", shard, &a));
            own[ch->sender][sets.set[i]] = fmaxf(own[ch->sender][sets.set[i]], a);
        }
        /* the reduction, as the relay carries it: sender 1's message into sender 0's partials */
        uint8_t msg[64];
        CHECK(wsync_amax_msg_bytes(2) == 20);
        memcpy(agreed, own[0], sizeof(agreed));
        wsync_amax_msg_encode(5, 2, own[1], msg);
        CHECK_OK(wsync_amax_msg_reduce(msg, 20, 5, 2, "sender 1", agreed));
        for (int k = 0; k < 2; k++)
            CHECK(agreed[k] == fmaxf(own[0][k], own[1][k]) && own[0][k] != own[1][k]);
        uint8_t *codes[2], *bucket = malloc(p->bucket_bytes);
        float scales[2][4];
        for (uint32_t r = 0; r < 2; r++) {
            codes[r] = malloc(R * C / 2);
            memset(codes[r], 0xAB, R * C / 2);
            scales[r][0] = scales[r][1] = -1.0f;
        }
        for (uint32_t i = 0; i < p->nchunks; i++) {
            const wsync_chunk_t *ch = &p->chunks[i];
            const uint16_t *shard = w + (ch->sender ? CUT * C : 0);
            memset(bucket, 0xCD, p->bucket_bytes);
            CHECK_OK(wsync_exec_pack_wire_amax(p, ch, "w", shard, agreed[sets.set[i]], bucket));
            for (uint32_t k = 0; S != NULL && k < p->nsegments; k++) {
                const wsync_segment_t *sg = &S[k];
                if (sg->chunk == i)
                    CHECK_OK(wsync_exec_unpack_wire(p, sg, ch, bucket, &d.t[sg->receiver],
                                                    codes[sg->receiver], scales[sg->receiver]));
            }
        }
        for (uint32_t r = 0; r < 2; r++) {
            float *x = malloc(R * C / 2 * sizeof(float)), ref_scale, own_scale;
            uint8_t *ref = malloc(R * C / 2);
            wsync_quant_t q = {0};
            q.scheme = TENSOR;
            for (int64_t i = 0; i < R; i++)
                for (int64_t j = 0; j < C / 2; j++)
                    x[i * (C / 2) + j] = fg_bf16_f32(w[i * C + r * (C / 2) + j]);
            CHECK_OK(wsync_quantize_f32("w.fp8", x, R, C / 2, C / 2, &q, E4M3, ref, C / 2,
                                        &ref_scale));
            CHECK_MSG(memcmp(codes[r], ref, R * C / 2) == 0, "receiver %u: codes differ from the "
                      "reference (buckets %llu)", r, (unsigned long long)p->bucket_bytes);
            CHECK_MSG(memcmp(&scales[r][0], &ref_scale, 4) == 0 && scales[r][1] == -1.0f,
                      "receiver %u: scale %a, the reference's %a", r, (double)scales[r][0],
                      (double)ref_scale);
            own_scale = wsync_fp8_tensor_scale(own[0][sets.set[0]], E4M3);
            CHECK(own_scale != ref_scale);   /* sender 0's amax alone: another scale */
            free(x);
            free(ref);
            free(codes[r]);
        }
        free(bucket);
        free(S);
        wsync_amax_sets_free(&sets);
        wsync_plan_free(p);
    }
}

/* Refusals: a per-tensor chunk through wsync_exec_pack_wire (no amax), a NaN in a sender's part
 * (NONFINITE naming the param and the sender, nothing written), a non-finite agreed amax; the
 * message: another version, another count, a NaN amax, a short message. */
static void test_refusals(void)
{
    static uint16_t w[R * C];
    fw_group_t d;
    wsync_plan_t *p;

    fill(w, 3);
    fsdp2(&d);
    fw_add_target(&d, 0, "w.fp8", E4M3, R, C, TENSOR, 0, 0, 0, 0);
    fw_add_piece(&d, "w", BF16, R, C, 0, R, 0, C, 0, 0);
    p = compile(&d, 1, 1, 1u << 20);
    if (p != NULL) {
        const wsync_chunk_t *ch = &p->chunks[p->chunks[0].sender == 1 ? 0 : 1];
        uint8_t *bucket = malloc(p->bucket_bytes);
        float a = 7.0f;
        CHECK_ST(wsync_exec_pack_wire(p, ch, "w", w + CUT * C, bucket), WSYNC_ERR_INVALID);
        CHECK_ERR_HAS("needs the target's amax");
        w[CUT * C + 3 * C + 5] = 0x7fc0;
        CHECK_ST(wsync_exec_amax_wire(p, ch, "w", w + CUT * C, &a), WSYNC_ERR_NONFINITE);
        CHECK_ERR_HAS("param 'w'");
        CHECK_ERR_HAS("sender 1");
        CHECK_ERR_HAS("NaN at row 3, column 5");
        CHECK(a == 7.0f);
        memset(bucket, 0xCD, p->bucket_bytes);
        CHECK_ST(wsync_exec_pack_wire_amax(p, ch, "w", w + CUT * C, 1.0f, bucket),
                 WSYNC_ERR_NONFINITE);
        CHECK(bucket[ch->bucket_off] == 0xCD);
        w[CUT * C + 3 * C + 5] = 0;
        CHECK_ST(wsync_exec_pack_wire_amax(p, ch, "w", w + CUT * C, INFINITY, bucket),
                 WSYNC_ERR_INVALID);
        free(bucket);
        wsync_plan_free(p);
    }
    uint8_t msg[32];
    float amax[2] = {1.0f, 2.0f}, acc[2] = {0, 0};
    wsync_amax_msg_encode(3, 2, amax, msg);
    CHECK_ST(wsync_amax_msg_reduce(msg, 20, 4, 2, "sender 1", acc), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("sender 1");
    CHECK_ST(wsync_amax_msg_reduce(msg, 20, 3, 3, "sender 1", acc), WSYNC_ERR_PROTOCOL);
    CHECK_ST(wsync_amax_msg_reduce(msg, 11, 3, 2, "sender 1", acc), WSYNC_ERR_PROTOCOL);
    amax[1] = NAN;
    wsync_amax_msg_encode(3, 2, amax, msg);
    CHECK_ST(wsync_amax_msg_reduce(msg, 20, 3, 2, "sender 1", acc), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("not finite");
}

/* The scale rule and the scaled encoder against wsync_quantize_f32 (per-tensor). */
static void test_scaled_encoder(void)
{
    float x[64], s_ref, zero[4] = {0, 0, 0, 0};
    uint8_t a[64], b[64];
    wsync_quant_t q = {0};

    q.scheme = TENSOR;
    for (int i = 0; i < 64; i++)
        x[i] = (float)(i - 31) * 0.37f;
    CHECK_OK(wsync_quantize_f32("x", x, 8, 8, 8, &q, E4M3, a, 8, &s_ref));
    CHECK(wsync_fp8_tensor_scale(wsync_amax_f32(x, 64), E4M3) == s_ref);
    CHECK_OK(wsync_fp8_encode_scaled_f32(x, 8, 8, 8, s_ref, E4M3, 0, b, 8));
    CHECK(memcmp(a, b, 64) == 0);
    CHECK_OK(wsync_quantize_f32("z", zero, 2, 2, 2, &q, E4M3, a, 2, &s_ref));
    CHECK(wsync_fp8_tensor_scale(0.0f, E4M3) == s_ref && s_ref == 1.0f);
    CHECK_ST(wsync_fp8_encode_scaled_f32(x, 8, 8, 8, 0.0f, E4M3, 0, b, 8), WSYNC_ERR_INVALID);
}

int main(void)
{
    RUN(test_marking);
    RUN(test_closure);
    RUN(test_pack_equals_reference);
    RUN(test_refusals);
    RUN(test_scaled_encoder);
    return check_summary();
}
