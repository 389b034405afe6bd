/* FP8 on the wire through the ipc scheme and the store, host memory, across processes
 * (docs/fp8_wire.md).
 * FSDP-2 senders of a small model-shaped set of bf16 params; TP-2 receivers and a replica of TP
 * rank 0 (which reads the same slots as rank 0), whose targets are FP8: a fused QKV of three
 * params with 128 x 128 blocks, a row-parallel column slice with channel scales, a merged
 * gate_up with UE8M0 64 x 128 blocks, an embedding the FSDP boundary cuts mid-cell (so it
 * travels plain and its receiver quantizes it), and a bf16 norm.
 *  - Two versions with fp8_wire = 1 and again with 0: every receiver's codes and scales equal
 *    wsync_quantize_f32 of the target assembled from the full params here, so the two runs are
 *    byte-identical; the senders staged the FP8 form (bytes_packed counted by hand: codes and
 *    one f32 per cell, about half of bf16), the receivers landed it (their progress, counted by
 *    hand), and rank 0's explanation says so.
 *  - The same with verification on: the checksums of FP8 chunks are of their wire bytes; a bit
 *    of one flipped in its slot (fault push.bucket:corrupt) is refused with INTEGRITY.
 *  - A NaN in sender 1's shard in version 2: its push fails with WSYNC_ERR_NONFINITE naming the
 *    param, the sender and the element, before that bucket's READY; every participant fails,
 *    no receiver commits version 2 (theirs stays 1); a new group then takes version 3 right.
 *    Sender 1's chunks for receiver 0 (the embedding, o_proj) all come before its last FP8 one
 *    (up_proj, receiver 1's): a NaN there must still keep receiver 0 from committing (PACKED). */
/* The store (schemes/store_fp8.c), over UCX and libfabric, snapshots and in place, with a
 * per-tensor lm_head target too (plain, quantized by its receiver):
 *  - readers come once version 1 is published, so their senders made it without their FP8
 *    chunks: the readers read those plain and quantize them (their progress counts bf16 bytes);
 *    from version 2 on the senders pack them (progress: codes and one f32 per cell, 0.502 x),
 *    and every version's codes and scales equal the reference and the group's with
 *    fp8_wire = 0; the senders' bytes_packed is the snapshot plus the FP8 regions, by hand;
 *  - WSYNC_VERIFY=1: the chunks read whole are checked against their senders' xxh3;
 *  - a NaN in sender 1's q_proj in version 2: refused by sender 1 (NONFINITE naming the param,
 *    itself and the element), every reader keeps version 1. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/loop.h"
#include "schemes/store_fp8.h"
#include "core/objects.h"
#include "core/proto.h"
#include "reshard/fp8.h"
#include "tests/support/check.h"
#include "tests/support/fp8_groups.h"
#include "tests/support/proc.h"
#include "tests/support/transports.h"
#include "wsync/wsync.h"

#define TIMEOUT_MS 20000
#define NSENDERS 2
#define TP 2
#define NRECV 3      /* TP ranks 0, 1 and a replica of rank 0: one slot read by two */
#define BUCKET (96 * 1024)   /* several buckets: chunks split at cell rows */

/* the embedding first: sender 1's chunks for receiver 0 (embedding, lm_head, o_proj) all come
 * before its last FP8 one (up_proj, receiver 1's) */
enum { P_EMBED, P_NORM, P_LM, P_Q, P_K, P_V, P_O, P_GATE, P_UP, NPARAMS };

static const fg_pspec_t params[NPARAMS] = {   /* cols 0: 1-D */
    {"model.embed_tokens.weight", 300, 256},   /* FSDP-2 splits it at row 150: inside a cell */
    {"model.norm.weight", 256, 0},
    {"lm_head.weight", 256, 256},              /* a per-tensor scale: plain, quantized by its
                                                  receiver */
    {"model.layers.0.self_attn.q_proj.weight", 512, 256},
    {"model.layers.0.self_attn.k_proj.weight", 256, 256},
    {"model.layers.0.self_attn.v_proj.weight", 256, 256},
    {"model.layers.0.self_attn.o_proj.weight", 256, 512},
    {"model.layers.0.mlp.gate_proj.weight", 512, 256},
    {"model.layers.0.mlp.up_proj.weight", 512, 256},
};

/* lm_head: the store's groups only (in ipc's, the buckets and the chunk orders the corruption
 * and NaN cases rely on stay as they were without it) */
enum { T_QKV, T_O, T_GATE_UP, T_EMBED, T_NORM, T_LM, NTARGETS };

/* Element (i, j) of param p in version v, as bf16 bits: magnitudes that change across cells, so
 * that every cell gets a scale of its own. */
static uint16_t value_bf16(int p, int64_t i, int64_t j, uint64_t v)
{
    uint64_t h = fg_splitmix64(((uint64_t)p << 56) ^ ((uint64_t)i << 32) ^ ((uint64_t)j << 8) ^
                               v);
    int e = (int)((i / 37 + j / 53 + (int64_t)v + p) % 9) - 4;
    return fg_f32_bf16(((float)(h >> 40) / 16777216.0f - 0.5f) * ldexpf(1.0f, e));
}

static int64_t pcols(int p) { return params[p].cols ? params[p].cols : 1; }

/* FSDP rows of sender s: [lo, hi); 1-D params whole on sender 0. */
static void fsdp_rows(int p, int s, int64_t *lo, int64_t *hi)
{
    fg_param_rows(&params[p], s, NSENDERS, lo, hi);
}

static wsync_param_t to_param(int p)
{
    return fg_bf16_param(params[p].name, params[p].rows, params[p].cols);
}

/* ---- targets: described once, for the receivers and for the reference ------------------------ */

typedef struct {
    const char *name;
    wsync_dtype_t dtype;
    int64_t rows, cols;              /* cols 0: 1-D */
    wsync_quant_t quant;
    int npieces;
    wsync_piece_t pieces[3];
} tspec_t;

static wsync_piece_t piece_rows(int p, int64_t r0, int64_t n, int64_t dst_row)
{
    wsync_piece_t pc = {to_param(p), {{r0, 0}, {n, pcols(p)}}, {dst_row, 0}};
    return pc;
}

/* Receiver r's targets (vLLM's TP-2 layout of these params). */
static void make_targets(int r, tspec_t t[NTARGETS])
{
    const wsync_quant_t block = {WSYNC_QUANT_BLOCK, 128, 128, 0.0f, 0, 0, NULL, WSYNC_MEM_HOST};
    const wsync_quant_t chan = {WSYNC_QUANT_CHANNEL, 0, 0, 0.0f, 0, 0, NULL, WSYNC_MEM_HOST};
    const wsync_quant_t ue8m0 = {WSYNC_QUANT_BLOCK, 64, 128, 0.0f, 1, 0, NULL, WSYNC_MEM_HOST};
    const wsync_quant_t tensor = {WSYNC_QUANT_TENSOR, 0, 0, 0.0f, 0, 0, NULL, WSYNC_MEM_HOST};

    memset(t, 0, NTARGETS * sizeof(*t));
    /* fused QKV, column-parallel: q, k, v rows of rank r stacked */
    t[T_QKV] = (tspec_t){.name = "qkv_proj", .dtype = WSYNC_DTYPE_F8E4M3FN, .rows = 512,
                         .cols = 256, .quant = block, .npieces = 3};
    t[T_QKV].pieces[0] = piece_rows(P_Q, r * 256, 256, 0);
    t[T_QKV].pieces[1] = piece_rows(P_K, r * 128, 128, 256);
    t[T_QKV].pieces[2] = piece_rows(P_V, r * 128, 128, 384);
    /* row-parallel: a slice of o_proj's columns, every row */
    t[T_O] = (tspec_t){.name = "o_proj", .dtype = WSYNC_DTYPE_F8E4M3FN, .rows = 256, .cols = 256,
                       .quant = chan, .npieces = 1};
    t[T_O].pieces[0] = (wsync_piece_t){to_param(P_O), {{0, r * 256}, {256, 256}}, {0, 0}};
    /* merged gate_up, UE8M0 scales over 64 x 128 blocks */
    t[T_GATE_UP] = (tspec_t){.name = "gate_up_proj", .dtype = WSYNC_DTYPE_F8E4M3FN, .rows = 512,
                             .cols = 256, .quant = ue8m0, .npieces = 2};
    t[T_GATE_UP].pieces[0] = piece_rows(P_GATE, r * 256, 256, 0);
    t[T_GATE_UP].pieces[1] = piece_rows(P_UP, r * 256, 256, 256);
    /* replicated whole: both senders' rows meet at row 150, inside the 128..256 cell row */
    t[T_EMBED] = (tspec_t){.name = "embed_tokens", .dtype = WSYNC_DTYPE_F8E4M3FN, .rows = 300,
                           .cols = 256, .quant = block, .npieces = 1};
    t[T_EMBED].pieces[0] = piece_rows(P_EMBED, 0, 300, 0);
    t[T_NORM] = (tspec_t){.name = "norm", .dtype = WSYNC_DTYPE_BF16, .rows = 256, .npieces = 1};
    t[T_NORM].pieces[0] = (wsync_piece_t){to_param(P_NORM), {{0}, {256}}, {0}};
    /* replicated whole, one scale for it all: it needs every sender's amax, so it travels plain */
    t[T_LM] = (tspec_t){.name = "lm_head", .dtype = WSYNC_DTYPE_F8E4M3FN, .rows = 256, .cols = 256,
                        .quant = tensor, .npieces = 1};
    t[T_LM].pieces[0] = piece_rows(P_LM, 0, 256, 0);
}

static int is_fp8(const tspec_t *t) { return t->dtype == WSYNC_DTYPE_F8E4M3FN; }
static int64_t tcols(const tspec_t *t) { return t->cols ? t->cols : 1; }

/* What target t must hold after version v, computed here: its bf16 bytes, or the codes and
 * scales wsync_quantize_f32 makes of the whole target assembled from the full params. */
static void reference(const tspec_t *t, uint64_t v, uint8_t *data, float *scales)
{
    int64_t rows = t->rows, cols = tcols(t);
    float *x = calloc((size_t)(rows * cols), sizeof(float));
    uint16_t *b = (uint16_t *)data;

    for (int k = 0; k < t->npieces; k++) {
        const wsync_piece_t *pc = &t->pieces[k];
        int p = 0;
        while (strcmp(params[p].name, pc->param.name) != 0)
            p++;
        int two = params[p].cols != 0;
        int64_t nr = two ? pc->src.len[0] : 1, nc = two ? pc->src.len[1] : pc->src.len[0];
        for (int64_t i = 0; i < nr; i++)
            for (int64_t j = 0; j < nc; j++) {
                uint16_t h = two ? value_bf16(p, pc->src.start[0] + i, pc->src.start[1] + j, v)
                                 : value_bf16(p, 0, pc->src.start[0] + j, v);
                int64_t at = two ? (pc->dst_start[0] + i) * cols + pc->dst_start[1] + j
                                 : pc->dst_start[0] + j;
                if (is_fp8(t))
                    x[at] = fg_bf16_f32(h);
                else
                    b[at] = h;
            }
    }
    if (is_fp8(t))
        CHECK_OK(wsync_quantize_f32(t->name, x, (uint64_t)rows, (uint64_t)cols, (uint64_t)cols,
                                    &t->quant, t->dtype, data, (uint64_t)cols, scales));
    free(x);
}

/* ---- a group --------------------------------------------------------------------------------- */

/* What each receiver saw, for the parent to compare across runs (shared memory). */
typedef struct {
    uint64_t data_hash[NRECV][NTARGETS], scales_hash[NRECV][NTARGETS];
    uint64_t version[NRECV];            /* committed at the end */
    uint64_t landed[NRECV][2];          /* the last version's progress: bytes done, of total */
    uint64_t packed[NSENDERS];       /* bytes_packed of the last successful push */
    uint64_t delivered[NSENDERS];
    int explain_wire;                /* rank 0's explanation has the FP8 on the wire line */
    int fetched[8];                  /* the store: readers that fetched version v */
    int published;                   /* the store: sender 0 published version `first` */
    uint64_t landed_first[NRECV];    /* the store: the progress of version `first` */
    int fail_status[NRECV];             /* a receiver's failed wait: its status and text */
    char fail_text[NRECV][1024];
} results_t;

typedef struct {
    int fp8_wire;                    /* sender param */
    uint64_t first, last;            /* versions pushed */
    int nan_version;                 /* sender 1 puts a NaN in q_proj in this version (0: none) */
    results_t *res;
    int verify;                      /* WSYNC_VERIFY=1 in every participant */
    int corrupt;                     /* sender 1 flips a bit of the first chunk of its bucket 1,
                                        q_proj's first FP8 chunk (fault push.bucket:corrupt@2), in
                                        version `first`: that version fails */
    int nan_param;                   /* where sender 1's NaN goes: its row 3, column 5 */
    const char *store;               /* the store over this transport ("ucx", "ofi"); NULL: ipc */
    int in_place;                    /* the store: shards published in place, not snapshots */
    int corrupt_get;                 /* the store: reader corrupt_get - 1 flips a bit of its first
                                        get of version 2 (0: none) */
} group_t;

/* A member's word on version v where the group must refuse it (a flipped bit, or a NaN that
 * another member met): it failed, naming the NaN's param. 1: a refused version, the member
 * stops; 0: a good version. */
static int refused_version(const fg_member_t *m, uint64_t v, wsync_status_t st, const char *role)
{
    const group_t *g = m->group;
    if (g->corrupt) {
        CHECK_MSG(st != WSYNC_OK, "%s %d: a corrupted version went through", role, m->rank);
        return 1;
    }
    if (v == (uint64_t)g->nan_version) {
        CHECK_MSG(st != WSYNC_OK, "%s %d: version %llu went through", role, m->rank,
                  (unsigned long long)v);
        CHECK_ERR_HAS(params[g->nan_param].name);
        return 1;
    }
    return 0;
}

/* The readers whose FP8 chunks sender snd has heard of: their relays through the coordinator,
 * queued in its inbox, where its next publish takes them all (schemes/store_fp8.c). */
static int readers_heard(wsync_sender_t *snd)
{
    wsync_inbox_t *in = &snd->m.inbox;
    uint64_t seen = 0;

    pthread_mutex_lock(&in->mu);
    for (const wsync_msg_t *x = in->head; x != NULL; x = x->next) {
        wsync_relay_t rl;
        if (x->type == WSYNC_MSG_SCHEME_RELAY &&
            wsync_relay_decode(x->payload, x->len, x->type, &rl) == WSYNC_OK &&
            rl.role == WSYNC_ROLE_RECEIVER && rl.tag == STORE_FP8_TAG && rl.rank < 64)
            seen |= 1ull << rl.rank;
    }
    pthread_mutex_unlock(&in->mu);
    return __builtin_popcountll(seen);
}

static int sender_main(void *arg)
{
    const fg_member_t *m = arg;
    const group_t *g = m->group;
    int s = m->rank;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    fg_sender_t fs;
    wsync_status_t st = WSYNC_OK;

    if (g->verify)
        setenv("WSYNC_VERIFY", "1", 1);
    if (g->corrupt && s == 1)
        setenv("WSYNC_FAULT", "push.bucket:corrupt@2", 1);
    fg_sender_params(&sp, m, BUCKET, TIMEOUT_MS, g->store, !g->in_place);
    sp.fp8_wire = g->fp8_wire;
    /* data[P_NORM] NULL on sender 1: no rows of it */
    if (fg_sender_open(&fs, m, &sp, params, NPARAMS, value_bf16) != 0)
        return 1;
    for (uint64_t v = g->first; v <= g->last; v++) {
        fg_sender_fill(&fs, v);
        int nan_here = v == (uint64_t)g->nan_version && s == 1;
        if (nan_here)   /* e.g. q_proj row 259 (its row 3), column 5 */
            fs.data[g->nan_param][3 * pcols(g->nan_param) + 5] = 0x7fc0;
        st = wsync_sender_push(fs.snd, v);
        if (nan_here) {
            CHECK_MSG(st == WSYNC_ERR_NONFINITE, "push of version %llu returned %s: %s",
                      (unsigned long long)v, wsync_status_name(st), wsync_last_error());
            CHECK_ERR_HAS(params[g->nan_param].name);
            CHECK_ERR_HAS("sender 1");
            CHECK_ERR_HAS("NaN at row 3, column 5");
            break;
        }
        /* the group fails on the other members too, with the first failure's words */
        if (refused_version(m, v, st, "sender"))
            break;
        CHECK_OK(st);
        if (st != WSYNC_OK)
            break;
        wsync_push_stats_t stats;
        CHECK_OK(wsync_sender_stats(fs.snd, &stats));
        g->res->packed[s] = stats.bytes_packed;
        g->res->delivered[s] = stats.bytes_delivered;
        if (s == 0 && v == g->first)
            __atomic_store_n(&g->res->published, 1, __ATOMIC_RELEASE);
        /* the store: every reader has version v before the next is made (in place, its shards
         * are read as they are), and before a sender leaves with its memory */
        if (g->store != NULL && !fg_wait_count(&g->res->fetched[v], NRECV, TIMEOUT_MS)) {
            CHECK_MSG(0, "sender %d: the readers did not fetch version %llu", s,
                      (unsigned long long)v);
            break;
        }
        /* and we heard of every reader's FP8 chunks (sent at its setup, through the
         * coordinator's relay, which on a loaded machine may land after its fetch): the next
         * version packs them all */
        if (g->store != NULL && g->fp8_wire && v == g->first && v < g->last) {
            int heard = 0;
            for (long long until = proc_now_ms() + TIMEOUT_MS;
                 (heard = readers_heard(fs.snd)) < NRECV && proc_now_ms() < until;)
                usleep(2000);
            CHECK_MSG(heard == NRECV, "sender %d: heard of %d readers' FP8 chunks of %d in %d ms",
                      s, heard, NRECV, TIMEOUT_MS);
        }
    }
    if (s == 0)
        g->res->explain_wire = fg_explains(fs.snd, "FP8 on the wire:");
    return fg_sender_close(&fs, g->nan_version || g->corrupt);
}

/* The receiver's progress: bytes landed in this version so far, of its total. */
static void on_progress(void *arg, uint64_t version, uint64_t done, uint64_t total)
{
    uint64_t *landed = arg;
    (void)version;
    landed[0] = done;
    landed[1] = total;
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
    wsync_status_t st;

    make_targets(r % TP, ts);   /* receiver 2 is a replica of TP rank 0 */
    /* its 18th get: version 1 took 17 under WSYNC_VERIFY (whole checksum blocks), and version
     * 2's FP8 chunks are read first, as their senders packed them */
    if (g->store != NULL && g->corrupt_get == r + 1)
        setenv("WSYNC_FAULT", "store.get:corrupt@18", 1);
    /* the store: readers come once the first version is in it, so that its senders made it
     * without their FP8 chunks, which the readers read plain and quantize themselves */
    CHECK_MSG(g->store == NULL || fg_wait_count(&g->res->published, 1, TIMEOUT_MS),
              "receiver %d: sender 0 did not publish version %llu", r,
              (unsigned long long)g->first);
    const int nt = g->store != NULL ? NTARGETS : T_LM;
    if (g->verify)
        setenv("WSYNC_VERIFY", "1", 1);
    fg_receiver_params(&rp, m, TIMEOUT_MS);
    rp.progress = on_progress;
    rp.progress_arg = g->res->landed[r];
    if ((rv = fg_receiver_open(&rp, &ctx)) == NULL)
        return 1;
    for (int i = 0; i < nt; i++) {
        const tspec_t *t = &ts[i];
        wsync_target_t wt = {t->name, t->dtype, t->cols ? 2 : 1, {t->rows, t->cols}, NULL,
                             WSYNC_MEM_HOST, 0, t->pieces, t->npieces, t->quant};
        if (fg_target_add(&ft[i], rv, wt) != 0)
            return fg_receiver_close(rv, ctx, ft, i + 1, NULL);
    }
    for (uint64_t v = g->first; v <= g->last; v++) {
        uint64_t got = 0;
        st = g->store != NULL ? wsync_receiver_fetch(rv, v, TIMEOUT_MS, &got)
                              : wsync_receiver_wait(rv, TIMEOUT_MS, &got);
        if (g->corrupt_get == r + 1 && v == 2) {   /* this reader alone refuses it */
            g->res->fail_status[r] = (int)st;
            snprintf(g->res->fail_text[r], sizeof(g->res->fail_text[r]), "%s", wsync_last_error());
            CHECK_MSG(st != WSYNC_OK, "reader %d: a corrupted version went through", r);
            __atomic_add_fetch(&g->res->fetched[v], 1, __ATOMIC_RELEASE);   /* senders go on */
            break;
        }
        if (g->corrupt) {
            g->res->fail_status[r] = (int)st;
            snprintf(g->res->fail_text[r], sizeof(g->res->fail_text[r]), "%s", wsync_last_error());
        }
        if (refused_version(m, v, st, "receiver"))
            break;
        CHECK_OK(st);
        if (st != WSYNC_OK)
            break;
        CHECK_MSG(got == v, "receiver %d got version %llu, expected %llu", r,
                  (unsigned long long)got, (unsigned long long)v);
        for (int i = 0; i < nt; i++) {
            reference(&ts[i], v, ft[i].want, ft[i].want_scales);
            fg_target_check(&ft[i], r, v);
            g->res->data_hash[r][i] = XXH3_64bits(ft[i].buf, ft[i].bytes);
            g->res->scales_hash[r][i] = XXH3_64bits(ft[i].scales, ft[i].ns * sizeof(float));
        }
        if (v == g->first)
            g->res->landed_first[r] = g->res->landed[r][1];
        if (v < 8)
            __atomic_add_fetch(&g->res->fetched[v], 1, __ATOMIC_RELEASE);
    }
    return fg_receiver_close(rv, ctx, ft, nt, &g->res->version[r]);
}

/* Run a group (both senders and receivers as processes); every one must exit 0. */
static void run_group(group_t g)
{
    memset(g.res, 0, sizeof(*g.res));
    fg_run_group(&g, NSENDERS, sender_main, NRECV, receiver_main);
}

/* Bytes sender s stages per version, counted by hand: every row it holds once (the embedding's
 * two receivers read one chunk), FP8 targets' rows as codes plus one f32 per cell when on. */
static uint64_t expected_packed(int s, int wire)
{
    uint64_t b = 0;
    for (int p = 0; p < NPARAMS; p++) {
        int64_t lo, hi;
        fsdp_rows(p, s, &lo, &hi);
        uint64_t elems = (uint64_t)((hi - lo) * pcols(p));
        if (p == P_LM)
            continue;   /* no ipc receiver reads it */
        if (!wire || p == P_EMBED || p == P_NORM) {
            b += 2 * elems;
            continue;
        }
        /* o_proj: two column slices, a cell per row each; gate, up: 64 x 128; q, k, v: 128 x 128 */
        uint64_t cells = p == P_O                 ? 2 * (uint64_t)(hi - lo)
                       : p == P_GATE || p == P_UP ? (uint64_t)(hi - lo) / 64 * 2
                                                  : (uint64_t)(hi - lo) / 128 * 2;
        b += elems + 4 * cells;
    }
    return b;
}

/* Bytes sender s delivers per version (the plan's pair bytes, summed over the receivers), by
 * hand: each receiver of TP rank t takes the embedding's rows of s (plain), the norm (s = 0),
 * s's rows of its o_proj slice, and when s = t, s's rows of q, k, v, gate and up. */
static uint64_t expected_delivered(int s, int wire)
{
    uint64_t b = 0;
    for (int r = 0; r < NRECV; r++) {
        b += 150 * 256 * 2 + (s == 0 ? 256 * 2 : 0);
        b += wire ? 128 * 256 + 4 * 128 : 2 * 128 * 256;              /* o_proj: channel */
        if (s != r % TP)
            continue;
        b += wire ? 256 * 256 + 4 * 4 : 2 * 256 * 256;                /* q */
        b += 2 * (wire ? 128 * 256 + 4 * 2 : 2 * 128 * 256);          /* k, v */
        b += 2 * (wire ? 256 * 256 + 4 * 8 : 2 * 256 * 256);          /* gate, up */
    }
    return b;
}

/* Bytes of sender s's shards as a store snapshot holds them (each 64-byte aligned). */
static uint64_t snapshot_bytes(int s)
{
    uint64_t b = 0;
    for (int p = 0; p < NPARAMS; p++) {
        int64_t lo, hi;
        fsdp_rows(p, s, &lo, &hi);
        b += ((uint64_t)((hi - lo) * pcols(p)) * 2 + 63) / 64 * 64;
    }
    return b;
}

/* FP8 on the wire on and off (ipc, or the store over `store`, snapshots or in place): the same
 * codes and scales at every receiver, and the bytes counted by hand. */
static void wire_on_equals_off(const char *store, int in_place)
{
    results_t *on = fg_shared(sizeof(results_t)), *off = fg_shared(sizeof(results_t));
    CHECK(on != NULL && off != NULL);
    if (on == NULL || off == NULL)
        return;
    const char *what = store == NULL ? "ipc" : store;
    run_group((group_t){.fp8_wire = 1, .first = 1, .last = 2, .res = on, .store = store,
                        .in_place = in_place});
    run_group((group_t){.fp8_wire = 0, .first = 1, .last = 2, .res = off, .store = store,
                        .in_place = in_place});
    for (int r = 0; r < NRECV; r++) {
        CHECK(on->version[r] == 2 && off->version[r] == 2);
        for (int i = 0; i < (store != NULL ? NTARGETS : T_LM); i++) {
            CHECK_MSG(on->data_hash[r][i] == off->data_hash[r][i] && on->data_hash[r][i] != 0,
                      "%s: receiver %d target %d: codes differ with FP8 on the wire", what, r, i);
            CHECK_MSG(on->scales_hash[r][i] == off->scales_hash[r][i],
                      "%s: receiver %d target %d: scales differ with FP8 on the wire", what, r, i);
        }
    }
    CHECK_MSG(on->explain_wire && !off->explain_wire, "%s: the explanation %s FP8 on the wire",
              what, on->explain_wire ? "names, with it off," : "does not name");
    /* what a receiver lands per version: the FP8 targets' codes and one f32 per cell (qkv_proj
     * 4 + 2 + 2 cells, o_proj one per row, gate_up_proj 8 + 8), the embedding and lm_head as f32
     * values to quantize, the norm as bf16. Through the store, version 2's: the senders heard
     * of every reader's FP8 chunks before packing it (a chunk read plain and quantized by its
     * reader would count its bf16 bytes) */
    uint64_t fp8_on = 512 * 256 + 4 * 8 + 256 * 256 + 4 * 256 + 512 * 256 + 4 * 16;
    uint64_t fp8_off = 4 * (512 * 256 + 256 * 256 + 512 * 256);
    uint64_t rest = 300 * 256 * 4 + 256 * 2 + (store != NULL ? 256 * 256 * 4 : 0);
    for (int r = 0; r < NRECV; r++) {
        CHECK_MSG(on->landed[r][0] == fp8_on + rest && on->landed[r][1] == fp8_on + rest,
                  "%s: receiver %d landed %llu of %llu bytes, expected %llu", what, r,
                  (unsigned long long)on->landed[r][0], (unsigned long long)on->landed[r][1],
                  (unsigned long long)(fp8_on + rest));
        CHECK_MSG(off->landed[r][1] == fp8_off + rest, "%s: receiver %d landed %llu bytes "
                  "without FP8 on the wire, expected %llu", what, r,
                  (unsigned long long)off->landed[r][1], (unsigned long long)(fp8_off + rest));
        printf("%s: receiver %d: landed %llu bytes per version with FP8 on the wire, %llu "
               "without; the FP8 targets %llu against %llu in bf16 (%.3f x)\n", what, r,
               (unsigned long long)on->landed[r][1], (unsigned long long)off->landed[r][1],
               (unsigned long long)fp8_on, (unsigned long long)(fp8_off / 2),
               (double)fp8_on / (double)(fp8_off / 2));
    }
    for (int r = 0; r < NRECV && store != NULL; r++)   /* version 1: read plain, quantized here */
        CHECK_MSG(on->landed_first[r] == fp8_off / 2 + rest, "%s: receiver %d read %llu bytes "
                  "of version 1, published before it came; expected %llu (its FP8 chunks plain)",
                  what, r, (unsigned long long)on->landed_first[r],
                  (unsigned long long)(fp8_off / 2 + rest));
    for (int s = 0; s < NSENDERS && store != NULL; s++) {
        /* the store: the snapshot (none in place), then the FP8 regions its readers asked for,
         * each row of them once (receiver 2 asks for receiver 0's) */
        uint64_t plain = 0;
        for (int p = 0; p < NPARAMS; p++) {
            int64_t lo, hi;
            fsdp_rows(p, s, &lo, &hi);
            if (p == P_EMBED || p == P_NORM)   /* expected_packed leaves lm_head out */
                plain += (uint64_t)((hi - lo) * pcols(p)) * 2;
        }
        uint64_t snap = in_place ? 0 : snapshot_bytes(s), wire = expected_packed(s, 1) - plain;
        CHECK_MSG(on->packed[s] == snap + wire && off->packed[s] == snap, "%s: sender %d staged "
                  "%llu bytes with FP8 on the wire, %llu without; expected %llu and %llu", what, s,
                  (unsigned long long)on->packed[s], (unsigned long long)off->packed[s],
                  (unsigned long long)(snap + wire), (unsigned long long)snap);
        printf("%s: sender %d: %llu bytes of FP8 codes and scales per version beside %llu of "
               "snapshot\n", what, s, (unsigned long long)(on->packed[s] - snap),
               (unsigned long long)snap);
    }
    for (int s = 0; s < NSENDERS && store == NULL; s++) {
        CHECK_MSG(on->packed[s] == expected_packed(s, 1), "sender %d staged %llu bytes with FP8 "
                  "on the wire, expected %llu", s, (unsigned long long)on->packed[s],
                  (unsigned long long)expected_packed(s, 1));
        CHECK_MSG(off->packed[s] == expected_packed(s, 0), "sender %d staged %llu bytes plain, "
                  "expected %llu", s, (unsigned long long)off->packed[s],
                  (unsigned long long)expected_packed(s, 0));
        CHECK_MSG(on->delivered[s] == expected_delivered(s, 1) &&
                      off->delivered[s] == expected_delivered(s, 0),
                  "sender %d delivered %llu bytes with FP8 on the wire, %llu without; expected "
                  "%llu and %llu", s, (unsigned long long)on->delivered[s],
                  (unsigned long long)off->delivered[s],
                  (unsigned long long)expected_delivered(s, 1),
                  (unsigned long long)expected_delivered(s, 0));
        printf("sender %d: staged %llu bytes with FP8 on the wire, %llu plain (%.3f x); "
               "delivered %llu, %llu\n", s, (unsigned long long)on->packed[s],
               (unsigned long long)off->packed[s], (double)on->packed[s] / (double)off->packed[s],
               (unsigned long long)on->delivered[s], (unsigned long long)off->delivered[s]);
    }
    fflush(stdout);
    munmap(on, sizeof(*on));
    munmap(off, sizeof(*off));
}

static void case_wire_on_equals_off(void)
{
    wire_on_equals_off(NULL, 0);
}

/* Verification on (WSYNC_VERIFY=1): the checksums of FP8 chunks are of the codes and scales the
 * senders packed, and the receivers' hashes of what they read from the slots agree. */
static void case_wire_verified(void)
{
    results_t *res = fg_shared(sizeof(results_t));
    CHECK(res != NULL);
    if (res == NULL)
        return;
    run_group((group_t){.fp8_wire = 1, .first = 1, .last = 2, .res = res, .verify = 1});
    for (int r = 0; r < NRECV; r++)
        CHECK(res->version[r] == 2);
    CHECK(res->explain_wire);
    for (int s = 0; s < NSENDERS; s++)
        CHECK(res->packed[s] == expected_packed(s, 1));
    munmap(res, sizeof(*res));
}

/* Verification on and a bit of sender 1's first FP8 chunk (its bucket 1: the embedding's plain
 * rows fill bucket 0) flipped in its slot after the
 * checksum was taken: a receiver that reads it refuses the version with INTEGRITY, naming the
 * param and the sender (what it read from the slot is not what the pack made). */
static void case_wire_corrupt_refused(void)
{
#if defined(WSYNC_FAULTS) && WSYNC_FAULTS
    results_t *res = fg_shared(sizeof(results_t));
    int found = 0;
    CHECK(res != NULL);
    if (res == NULL)
        return;
    run_group((group_t){.fp8_wire = 1, .first = 1, .last = 1, .res = res, .verify = 1,
                        .corrupt = 1});
    for (int r = 0; r < NRECV; r++) {
        printf("receiver %d: %s: %s\n", r, wsync_status_name((wsync_status_t)res->fail_status[r]),
               res->fail_text[r]);
        CHECK(res->version[r] == 0);
        found |= res->fail_status[r] == WSYNC_ERR_INTEGRITY &&
                 strstr(res->fail_text[r], "from sender 1") != NULL &&
                 strstr(res->fail_text[r], "sent as FP8 codes and scales") != NULL &&
                 strstr(res->fail_text[r], params[P_Q].name) != NULL;
    }
    fflush(stdout);
    CHECK_MSG(found, "no receiver refused the corrupted FP8 chunk of %s with INTEGRITY",
              params[P_Q].name);
    munmap(res, sizeof(*res));
#else
    printf("skipped: this build has no fault injection (configure with -DWSYNC_FAULTS=ON)\n");
#endif
}

static void case_nan_refused(void)
{
    results_t *res = fg_shared(sizeof(results_t));
    CHECK(res != NULL);
    if (res == NULL)
        return;
    /* in q_proj, sender 1's first bucket; in up_proj, its last FP8 one, after every bucket of
     * it receiver 0 takes: receiver 0 waits for sender 1's PACKED, which never comes */
    static const int where[] = {P_Q, P_UP};
    for (int w = 0; w < 2; w++) {
        run_group((group_t){.fp8_wire = 1, .first = 1, .last = 3, .nan_version = 2, .res = res,
                            .nan_param = where[w]});
        for (int r = 0; r < NRECV; r++)
            CHECK_MSG(res->version[r] == 1, "NaN in %s: receiver %d holds version %llu, "
                      "expected 1", params[where[w]].name, r,
                      (unsigned long long)res->version[r]);
    }
    /* finite again: a new group takes version 3 right */
    run_group((group_t){.fp8_wire = 1, .first = 3, .last = 3, .res = res});
    for (int r = 0; r < NRECV; r++)
        CHECK(res->version[r] == 3);
    CHECK(res->explain_wire);
    munmap(res, sizeof(*res));
}

/* The store over each RMA transport this build has, snapshots and in place: the same codes and
 * scales with FP8 on the wire and without, about half the bytes for the FP8 targets. */
static void case_store_on_equals_off(void)
{
    static const char *const ts[] = {"ucx", "ofi"};
    for (int k = 0; k < 2; k++) {
        if (!test_have_transport(ts[k]))
            continue;
        wire_on_equals_off(ts[k], 0);
        wire_on_equals_off(ts[k], 1);
    }
}

/* The store with WSYNC_VERIFY=1: a reader checks the FP8 chunks it reads whole against the xxh3
 * its sender published for them (version 2), and those it quantizes itself against the shards'
 * checksums (version 1, published before it came); a flipped bit is refused. */
static void case_store_verified(void)
{
    const char *t = test_have_transport("ucx") ? "ucx" : test_have_transport("ofi") ? "ofi" : NULL;
    results_t *res = t != NULL ? fg_shared(sizeof(results_t)) : NULL;
    if (res == NULL)
        return;
    run_group((group_t){.fp8_wire = 1, .first = 1, .last = 2, .res = res, .verify = 1,
                        .store = t});
    for (int r = 0; r < NRECV; r++)
        CHECK(res->version[r] == 2);
#if defined(WSYNC_FAULTS) && WSYNC_FAULTS
    /* a bit of reader 1's first FP8 chunk of version 2 flipped as it lands: refused with
     * INTEGRITY naming the chunk's param and sender; the other readers take version 2 */
    run_group((group_t){.fp8_wire = 1, .first = 1, .last = 2, .res = res, .verify = 1,
                        .store = t, .corrupt_get = 2});
    printf("%s: reader 1: %s: %s\n", t, wsync_status_name((wsync_status_t)res->fail_status[1]),
           res->fail_text[1]);
    fflush(stdout);
    CHECK_MSG(res->fail_status[1] == WSYNC_ERR_INTEGRITY &&
                  strstr(res->fail_text[1], "version 2 refused") != NULL &&
                  strstr(res->fail_text[1], "xxh3 of its codes and scales") != NULL &&
                  strstr(res->fail_text[1], "from sender") != NULL,
              "%s: reader 1 did not refuse its corrupted FP8 chunk with INTEGRITY", t);
    CHECK(res->version[0] == 2 && res->version[1] == 1 && res->version[2] == 2);
#endif
    munmap(res, sizeof(*res));
}

/* The store: a NaN in sender 1's q_proj in version 2, which its readers take FP8 on the wire:
 * sender 1 refuses the version with NONFINITE naming the param, itself and the element, and no
 * reader commits it (each holds version 1). */
static void case_store_nan_refused(void)
{
    const char *t = test_have_transport("ofi") ? "ofi" : test_have_transport("ucx") ? "ucx" : NULL;
    results_t *res = t != NULL ? fg_shared(sizeof(results_t)) : NULL;
    if (res == NULL)
        return;
    run_group((group_t){.fp8_wire = 1, .first = 1, .last = 3, .nan_version = 2, .res = res,
                        .nan_param = P_Q, .store = t});
    for (int r = 0; r < NRECV; r++)
        CHECK_MSG(res->version[r] == 1, "%s: NaN in %s: receiver %d holds version %llu, expected "
                  "1", t, params[P_Q].name, r, (unsigned long long)res->version[r]);
    munmap(res, sizeof(*res));
}

int main(void)
{
    RUN(case_wire_on_equals_off);
    RUN(case_store_on_equals_off);
    RUN(case_store_verified);
    RUN(case_store_nan_refused);
    RUN(case_wire_verified);
    RUN(case_wire_corrupt_refused);
    RUN(case_nan_refused);
    return check_summary();
}
