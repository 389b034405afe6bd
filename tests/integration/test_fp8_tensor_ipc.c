/* Per-tensor FP8 on the wire through the ipc scheme, host memory, across processes
 * (docs/fp8_wire.md section 5, schemes/wire_amax.c).
 * FSDP-2 senders of two bf16 params; TP-2 receivers and a replica of TP rank 0, whose targets are
 * FP8 with one scale each: a row-parallel column slice of o (both senders' rows; sender 1's
 * values 8 x larger, so its amax is the target's) and lm replicated whole (sender 0's values
 * 8 x larger). A scale from one sender's part alone differs from the target's (checked here), so
 * a sender packing with its own amax would show.
 *  - Two versions with fp8_wire = 1 and again with 0: every receiver's codes and scale equal
 *    wsync_quantize_f32 of the whole target assembled here, in both runs; with 1 the senders
 *    delivered codes and one f32 per chunk (counted by hand) and rank 0's explanation says the
 *    per-tensor targets travel FP8.
 *  - A NaN in sender 1's part of o in version 2: sender 1 refuses it with NONFINITE naming the
 *    param and itself; no receiver commits version 2.
 *  - Sender 1 dies before reporting its amax of version 2: sender 0's push fails naming sender
 *    1 well within the version's deadline; no receiver commits version 2.
 *  - The store keeps per-tensor targets plain (its senders do not exchange amaxes): same bytes,
 *    and the explanation says so. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include "reshard/fp8.h"
#include "tests/support/check.h"
#include "tests/support/fp8_groups.h"
#include "tests/support/proc.h"
#include "tests/support/transports.h"
#include "wsync/wsync.h"

#define TIMEOUT_MS 20000
#define NSENDERS 2
#define TP 2
#define NRECV 3      /* TP ranks 0, 1 and a replica of rank 0 */
#define BUCKET (64 * 1024)

enum { P_O, P_LM, NPARAMS };
enum { T_O, T_LM, NTARGETS };

static const fg_pspec_t params[NPARAMS] = {
    {"model.layers.0.self_attn.o_proj.weight", 256, 256},
    {"lm_head.weight", 192, 128},
};

/* Element (i, j) of param p in version v as bf16 bits: o's second half of rows (sender 1's) and
 * lm's first half (sender 0's) are 8 x larger, so that the senders' amaxes differ either way. */
static uint16_t value_bf16(int p, int64_t i, int64_t j, uint64_t v)
{
    uint64_t h = fg_splitmix64(((uint64_t)p << 56) ^ ((uint64_t)i << 32) ^ ((uint64_t)j << 8) ^
                               v);
    int big = p == P_O ? i >= params[p].rows / 2 : i < params[p].rows / 2;
    return fg_f32_bf16(((float)(h >> 40) / 16777216.0f - 0.5f) * (big ? 8.0f : 1.0f) *
                       (1.0f + 0.25f * (float)v));
}

static wsync_param_t to_param(int p)
{
    return fg_bf16_param(params[p].name, params[p].rows, params[p].cols);
}

typedef struct {
    const char *name;
    int64_t rows, cols;
    wsync_piece_t piece;
} tspec_t;

/* Receiver r's targets: o's columns [t * 128, +128) for TP rank t, lm whole. */
static void make_targets(int t, tspec_t ts[NTARGETS])
{
    ts[T_O] = (tspec_t){"o_proj", 256, 128,
                        {to_param(P_O), {{0, t * 128}, {256, 128}}, {0, 0}}};
    ts[T_LM] = (tspec_t){"lm_head", 192, 128, {to_param(P_LM), {{0, 0}, {192, 128}}, {0, 0}}};
}

static const wsync_quant_t tensor_q = {WSYNC_QUANT_TENSOR, 0, 0, 0.0f, 0, 0, NULL, WSYNC_MEM_HOST};

/* The target's values in version v as f32, rows [r0, r1) only (the others 0). */
static float *target_values(const tspec_t *t, int p, uint64_t v, int64_t r0, int64_t r1)
{
    float *x = calloc((size_t)(t->rows * t->cols), sizeof(float));
    for (int64_t i = r0; i < r1; i++)
        for (int64_t j = 0; j < t->cols; j++)
            x[i * t->cols + j] = fg_bf16_f32(value_bf16(p, i, t->piece.src.start[1] + j, v));
    return x;
}

/* Codes and scale of the whole target (the reference: wsync_quantize_f32, per-tensor). */
static void reference(const tspec_t *t, int p, uint64_t v, uint8_t *codes, float *scale)
{
    float *x = target_values(t, p, v, 0, t->rows);
    CHECK_OK(wsync_quantize_f32(t->name, x, (uint64_t)t->rows, (uint64_t)t->cols,
                                (uint64_t)t->cols, &tensor_q, WSYNC_DTYPE_F8E4M3FN, codes,
                                (uint64_t)t->cols, scale));
    free(x);
}

typedef struct {
    uint64_t hash[NRECV][NTARGETS];
    uint64_t version[NRECV];
    uint64_t delivered[NSENDERS];
    int explain_tensor, explain_plain, explain_wire2;
    int status[NSENDERS];
    char text[NSENDERS][1024];
    long long fail_ms;               /* sender 0: how long its failed push took */
    int fetched[64];
} results_t;

typedef struct {
    int fp8_wire;
    uint64_t last;                   /* versions 1 .. last */
    int nan_version;                 /* sender 1 puts a NaN in o in this version */
    int die_version;                 /* sender 1 exits before pushing this version */
    const char *store;               /* the store over this transport; NULL: ipc */
    results_t *res;
} group_t;

static int sender_main(void *arg)
{
    const fg_member_t *m = arg;
    const group_t *g = m->group;
    int s = m->rank;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    fg_sender_t fs;

    fg_sender_params(&sp, m, BUCKET, TIMEOUT_MS, g->store, 1);
    sp.fp8_wire = g->fp8_wire;
    if (fg_sender_open(&fs, m, &sp, params, NPARAMS, value_bf16) != 0)
        return 1;
    for (uint64_t v = 1; v <= g->last; v++) {
        if (s == 1 && v == (uint64_t)g->die_version) {
            usleep(300000);   /* sender 0 is waiting for our amax by now */
            _exit(0);
        }
        fg_sender_fill(&fs, v);
        if (s == 1 && v == (uint64_t)g->nan_version)   /* o's row 130 (its row 2), column 7 */
            fs.data[P_O][2 * params[P_O].cols + 7] = 0x7fc0;
        if (fg_push_noted(&fs, v, &g->res->status[s], g->res->text[s], sizeof(g->res->text[s]),
                          s == 0 ? &g->res->fail_ms : NULL) != WSYNC_OK)
            break;
        wsync_push_stats_t stats;
        CHECK_OK(wsync_sender_stats(fs.snd, &stats));
        g->res->delivered[s] = stats.bytes_delivered;
        CHECK_MSG(g->store == NULL || fg_wait_count(&g->res->fetched[v], NRECV, TIMEOUT_MS),
                  "sender %d: the readers did not fetch version %llu", s, (unsigned long long)v);
    }
    if (s == 0) {
        g->res->explain_tensor = fg_explains(fs.snd, "per-tensor targets too");
        g->res->explain_plain = fg_explains(fs.snd, "per-tensor targets plain");
        g->res->explain_wire2 = fg_explains(fs.snd, "fp8_wire 2");
    }
    return fg_sender_close(&fs, g->nan_version || g->die_version);
}

static int receiver_main(void *arg)
{
    const fg_member_t *m = arg;
    const group_t *g = m->group;
    int r = m->rank;
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *rv;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    tspec_t ts[NTARGETS];
    fg_target_t ft[NTARGETS];

    make_targets(r % TP, ts);
    fg_receiver_params(&rp, m, TIMEOUT_MS);
    if ((rv = fg_receiver_open(&rp, &ctx)) == NULL)
        return 1;
    for (int i = 0; i < NTARGETS; i++) {
        wsync_target_t wt = {ts[i].name, WSYNC_DTYPE_F8E4M3FN, 2, {ts[i].rows, ts[i].cols}, NULL,
                             WSYNC_MEM_HOST, 0, &ts[i].piece, 1, tensor_q};
        if (fg_target_add(&ft[i], rv, wt) != 0)
            return fg_receiver_close(rv, ctx, ft, i + 1, NULL);
    }
    for (uint64_t v = 1; v <= g->last; v++) {
        uint64_t got = 0;
        wsync_status_t st = g->store != NULL ? wsync_receiver_fetch(rv, v, TIMEOUT_MS, &got)
                                             : wsync_receiver_wait(rv, TIMEOUT_MS, &got);
        if (v == (uint64_t)g->nan_version || v == (uint64_t)g->die_version) {
            CHECK_MSG(st != WSYNC_OK, "receiver %d: version %llu went through", r,
                      (unsigned long long)v);
            break;
        }
        CHECK_OK(st);
        if (st != WSYNC_OK)
            break;
        for (int i = 0; i < NTARGETS; i++) {
            reference(&ts[i], i == T_O ? P_O : P_LM, v, ft[i].want, ft[i].want_scales);
            fg_target_check(&ft[i], r, v);
            g->res->hash[r][i] = XXH3_64bits(ft[i].buf, ft[i].bytes) ^
                                 XXH3_64bits(ft[i].scales, sizeof(float));
        }
        __atomic_add_fetch(&g->res->fetched[v], 1, __ATOMIC_RELEASE);
    }
    return fg_receiver_close(rv, ctx, ft, NTARGETS, &g->res->version[r]);
}

static void run_group(group_t g)
{
    memset(g.res, 0, sizeof(*g.res));
    fg_run_group(&g, NSENDERS, sender_main, NRECV, receiver_main);
}

/* The test can fail: a scale from either sender's rows alone is not the target's. */
static void case_parts_differ(void)
{
    tspec_t ts[NTARGETS];
    make_targets(0, ts);
    for (int i = 0; i < NTARGETS; i++) {
        int p = i == T_O ? P_O : P_LM;
        float *whole = target_values(&ts[i], p, 1, 0, ts[i].rows);
        float *half = target_values(&ts[i], p, 1, 0, ts[i].rows / 2);
        float *rest = target_values(&ts[i], p, 1, ts[i].rows / 2, ts[i].rows);
        uint64_t n = (uint64_t)(ts[i].rows * ts[i].cols);
        float a = wsync_amax_f32(whole, n), a0 = wsync_amax_f32(half, n),
              a1 = wsync_amax_f32(rest, n);
        CHECK_MSG(a0 != a1 && fmaxf(a0, a1) == a && a0 > 0.0f && a1 > 0.0f,
                  "target %s: amaxes %g and %g of the senders' parts, %g whole", ts[i].name,
                  (double)a0, (double)a1, (double)a);
        CHECK(wsync_fp8_tensor_scale(fminf(a0, a1), WSYNC_DTYPE_F8E4M3FN) !=
              wsync_fp8_tensor_scale(a, WSYNC_DTYPE_F8E4M3FN));
        free(whole);
        free(half);
        free(rest);
    }
}

/* Bytes sender s delivers per version, by hand: its rows of o's column slice for each receiver
 * (TP ranks 0, 1, replica of 0) and of lm for each, codes and one f32 per chunk with FP8 on the
 * wire (a chunk per (receiver, bucket) piece: the buckets hold them whole here), bf16 without. */
static uint64_t expected_delivered(int wire)
{
    uint64_t o = 128 * 128, lm = 96 * 128;
    return NRECV * (wire ? o + 4 + lm + 4 : 2 * (o + lm));
}

static void case_ipc_on_equals_off(void)
{
    results_t *res = fg_shared(sizeof(results_t));
    uint64_t on[NRECV][NTARGETS];

    if (res == NULL)
        return;
    /* FP8T_VERSIONS=N: N versions each way (docs/fp8_wire.md measures the exchange so, with
     * WSYNC_LOG_LEVEL=debug: "per-tensor amaxes agreed in") */
    const char *nv = getenv("FP8T_VERSIONS");
    uint64_t last = nv != NULL && atoi(nv) >= 2 && atoi(nv) < 64 ? (uint64_t)atoi(nv) : 2;
    run_group((group_t){.fp8_wire = 1, .last = last, .res = res});
    memcpy(on, res->hash, sizeof(on));
    CHECK_MSG(res->explain_tensor, "rank 0's explanation does not say per-tensor targets travel "
              "FP8");
    for (int s = 0; s < NSENDERS; s++)
        CHECK_MSG(res->delivered[s] == expected_delivered(1), "sender %d delivered %llu bytes, "
                  "%llu by hand", s, (unsigned long long)res->delivered[s],
                  (unsigned long long)expected_delivered(1));
    for (int r = 0; r < NRECV; r++)
        CHECK(res->version[r] == last);
    run_group((group_t){.fp8_wire = 0, .last = last, .res = res});
    for (int s = 0; s < NSENDERS; s++)
        CHECK(res->delivered[s] == expected_delivered(0));
    for (int r = 0; r < NRECV; r++) {
        CHECK(res->version[r] == last);
        for (int i = 0; i < NTARGETS; i++)
            CHECK_MSG(on[r][i] == res->hash[r][i] && on[r][i] != 0, "receiver %d target %d: "
                      "fp8_wire 1 and 0 differ", r, i);
    }
    munmap(res, sizeof(*res));
}

/* A group that fails at version 2 (g's nan_version or die_version): sender 0's push fails and
 * every receiver keeps version 1. The results, for the case's own checks (munmap them); NULL if
 * there is no shared memory. */
static results_t *run_failing(group_t g)
{
    g.res = fg_shared(sizeof(results_t));
    if (g.res == NULL)
        return NULL;
    run_group(g);
    CHECK(g.res->status[0] != WSYNC_OK);
    for (int r = 0; r < NRECV; r++)
        CHECK_MSG(g.res->version[r] == 1, "receiver %d holds version %llu", r,
                  (unsigned long long)g.res->version[r]);
    return g.res;
}

static void case_nan_refused(void)
{
    results_t *res = run_failing((group_t){.fp8_wire = 1, .last = 2, .nan_version = 2});

    if (res == NULL)
        return;
    printf("sender 1: %s: %s\n", wsync_status_name((wsync_status_t)res->status[1]), res->text[1]);
    printf("sender 0: %s: %s\n", wsync_status_name((wsync_status_t)res->status[0]), res->text[0]);
    CHECK(res->status[1] == WSYNC_ERR_NONFINITE);
    CHECK(strstr(res->text[1], params[P_O].name) != NULL);
    CHECK(strstr(res->text[1], "sender 1") != NULL);
    CHECK(strstr(res->text[1], "NaN at row 2, column 7") != NULL);
    munmap(res, sizeof(*res));
}

static void case_sender_lost(void)
{
    results_t *res = run_failing((group_t){.fp8_wire = 1, .last = 2, .die_version = 2});

    if (res == NULL)
        return;
    fflush(stdout);
    printf("sender 0 after %lld ms: %s: %s\n", res->fail_ms,
           wsync_status_name((wsync_status_t)res->status[0]), res->text[0]);
    CHECK(strstr(res->text[0], "sender 1") != NULL);
    CHECK_MSG(res->fail_ms < TIMEOUT_MS, "sender 0 failed after %lld ms", res->fail_ms);
    munmap(res, sizeof(*res));
}

/* The store keeps them plain, quantized by its readers, to the same bytes. */
static void case_store_plain(void)
{
    const char *t = test_have_transport("ucx") ? "ucx" : test_have_transport("ofi") ? "ofi" : NULL;
    results_t *res = t != NULL ? fg_shared(sizeof(results_t)) : NULL;

    if (res == NULL)
        return;
    run_group((group_t){.fp8_wire = 1, .last = 2, .store = t, .res = res});
    CHECK_MSG(res->explain_plain && !res->explain_tensor, "the store's explanation does not say "
              "per-tensor targets travel plain");
    /* ... and points to what makes its senders agree on the amaxes */
    CHECK_MSG(res->explain_wire2, "the store's explanation does not point to fp8_wire 2");
    for (int r = 0; r < NRECV; r++)
        CHECK(res->version[r] == 2);
    munmap(res, sizeof(*res));
}

int main(void)
{
    RUN(case_parts_differ);
    RUN(case_ipc_on_equals_off);
    RUN(case_nan_refused);
    RUN(case_sender_lost);
    RUN(case_store_plain);
    return check_summary();
}
