/* Per-tensor FP8 on the wire through the store, host memory, across processes
 * (docs/fp8_wire.md "The store" and section 5, schemes/store_amax.c).
 * FSDP-2 senders (snapshots) of three bf16 params; TP-2 readers 0 and 1 from the start, and a
 * TP-1 reader that comes once version 3 is published. Every target is FP8 with one scale:
 *   o_proj, row-parallel: TP rank t reads columns [t * 128, +128) of both senders' rows (sender
 *     1's values 8 x larger: its amax is the target's); the TP-1 reader all of it;
 *   lm_head, replicated whole (sender 0's values 8 x larger): one set for every reader;
 *   q_proj, column-parallel: TP rank t reads rows [t * 128, +128), which are sender t's rows;
 *     the TP-1 reader all of it: sender 0 packs its rows twice, for two sets with two amaxes.
 *  - Versions 1-6: every reader's codes and scale equal wsync_quantize_f32 of the whole target
 *    assembled here (the CPU quantizer; a scale from one sender's part alone differs, checked).
 *    By version 6 every chunk travels as codes and one f32 (the readers' progress, by hand:
 *    about half the bf16 bytes) and each sender's bytes_packed is its snapshot plus the regions
 *    its readers asked for, by hand. The late reader's first version comes plain for its new
 *    targets (its senders had not heard of it; it quantizes them itself) and packed for lm_head
 *    (the set TP readers already share).
 *    The same with WSYNC_VERIFY=1 (packed chunks checked against their senders' xxh3).
 *  - A NaN in sender 1's part of o_proj in version 4: sender 1 refuses it with NONFINITE naming
 *    the param, the element and itself; sender 0 fails it naming sender 1; no reader gets it.
 *  - Sender 1 dies before version 4: sender 0's push fails naming sender 1 well within its
 *    deadline; no reader gets version 4.
 * STORE_FP8T_CUDA=1 (a CUDA build on a GPU machine): the senders' shards in CUDA memory on
 * device 0 (snapshots; STORE_FP8T_SNAPSHOT=0: in place where the transport registers CUDA
 * memory), the same cases and assertions. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/device.h"
#include "reshard/fp8.h"
#include "tests/support/check.h"
#include "tests/support/fp8_groups.h"
#include "tests/support/proc.h"
#include "tests/support/transports.h"
#include "wsync/wsync.h"

#define TIMEOUT_MS 20000
#define NSENDERS 2
#define MAXRECV 3
#define LAST 6
#define LATE_FROM 3                  /* the TP-1 reader's first version */

enum { P_O, P_LM, P_Q, NPARAMS };

static const fg_pspec_t params[NPARAMS] = {
    {"model.layers.0.self_attn.o_proj.weight", 256, 256},
    {"lm_head.weight", 192, 128},
    {"model.layers.0.self_attn.q_proj.weight", 256, 128},
};

/* Element (i, j) of param p in version v: o's sender-1 rows and lm's sender-0 rows 8 x larger. */
static uint16_t value_bf16(int p, int64_t i, int64_t j, uint64_t v)
{
    uint64_t h = fg_splitmix64(((uint64_t)p << 56) ^ ((uint64_t)i << 32) ^ ((uint64_t)j << 12) ^ v);
    float x = (float)((double)(h >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    if ((p == P_O && i >= 128) || (p == P_LM && i < 96))
        x *= 8.0f;
    return fg_f32_bf16(x);
}

typedef struct {
    const char *name;
    int p;
    int64_t r0, c0, rows, cols;      /* the box of param p */
} tgt_t;

#define NTARGETS 3

/* Reader r's targets: TP rank r of 2 for r < 2, TP-1 (every param whole) for r == 2. */
static void make_targets(int r, tgt_t t[NTARGETS])
{
    if (r < 2) {
        t[0] = (tgt_t){"o_proj", P_O, 0, r * 128, 256, 128};
        t[1] = (tgt_t){"lm_head", P_LM, 0, 0, 192, 128};
        t[2] = (tgt_t){"q_proj", P_Q, r * 128, 0, 128, 128};
    } else {
        t[0] = (tgt_t){"o_proj", P_O, 0, 0, 256, 256};
        t[1] = (tgt_t){"lm_head", P_LM, 0, 0, 192, 128};
        t[2] = (tgt_t){"q_proj", P_Q, 0, 0, 256, 128};
    }
}

static const wsync_quant_t tensor_q = {WSYNC_QUANT_TENSOR, 0, 0, 0.0f, 0, 0, NULL, WSYNC_MEM_HOST};

/* Target t's values in version v as f32, its rows [a, b) only (the others 0). */
static float *target_values(const tgt_t *t, uint64_t v, int64_t a, int64_t b)
{
    float *x = calloc((size_t)(t->rows * t->cols), sizeof(float));
    for (int64_t i = a; x != NULL && i < b; i++)
        for (int64_t j = 0; j < t->cols; j++)
            x[i * t->cols + j] = fg_bf16_f32(value_bf16(t->p, t->r0 + i, t->c0 + j, v));
    return x;
}

typedef struct {
    uint64_t version[MAXRECV];
    uint64_t landed[MAXRECV][LAST + 1];   /* bytes a reader read for each version */
    uint64_t packed[NSENDERS][LAST + 1];  /* bytes_packed of each push */
    int status[NSENDERS];
    char text[NSENDERS][1024];
    long long fail_ms;
    int explain_tensor, explain_ipc;
    int published;
    int fetched[LAST + 1];
} results_t;

typedef struct {
    const char *transport;
    int fp8_wire;                    /* 2: the store's per-tensor exchange; 1: plain */
    int nrecv;                       /* 2: the TP readers; 3: and the late TP-1 reader */
    int verify;                      /* WSYNC_VERIFY=1 in every participant */
    uint64_t last;
    int nan_version, die_version;
    results_t *res;
} group_t;

/* Readers that fetch version v. */
static int readers_of(const group_t *g, uint64_t v)
{
    return g->nrecv == 3 && v >= LATE_FROM ? 3 : 2;
}

/* Snapshots (default), or STORE_FP8T_SNAPSHOT=0: in place. */
static int snapshots(void)
{
    const char *e = getenv("STORE_FP8T_SNAPSHOT");
    return e == NULL || atoi(e) != 0;
}

static int use_cuda(void)
{
    const char *e = getenv("STORE_FP8T_CUDA");
    return e != NULL && atoi(e) == 1;
}

/* A GPU is there: asked in a child, since CUDA once started in this process fails in the
 * processes it forks (cudaErrorInitializationError) */
static int gpu_seen(void)
{
    int status = 0;
    pid_t pid;

    if (!wsync_dev_compiled())
        return 0;
    pid = fork();
    if (pid == 0) {
        int n = 0;
        _exit(wsync_dev_count(&n) == WSYNC_OK && n >= 1 ? 0 : 1);
    }
    return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0;
}

/* STORE_FP8T_CUDA=1: fs as fg_sender_open makes it, its rows of each param in CUDA memory on
 * device 0 (dev[p]; fs->data[p] their host image, filled per version and uploaded). */
static int open_cuda(fg_sender_t *fs, const fg_member_t *m, const wsync_sender_params_t *sp,
                     void *dev[NPARAMS])
{
    memset(fs, 0, sizeof(*fs));
    fs->rank = m->rank;
    fs->nsenders = m->nsenders;
    fs->params = params;
    fs->nparams = NPARAMS;
    fs->value = value_bf16;
    CHECK_OK(wsync_dev_set(0));
    CHECK_OK(wsync_ctx_create(NULL, &fs->ctx));
    if (fs->ctx != NULL)
        CHECK_OK(wsync_sender_create(fs->ctx, sp, &fs->snd));
    for (int p = 0; p < NPARAMS && fs->snd != NULL; p++) {
        int64_t lo, hi;
        fg_param_rows(&params[p], fs->rank, fs->nsenders, &lo, &hi);
        size_t bytes = (size_t)((hi - lo) * params[p].cols) * 2;
        fs->data[p] = malloc(bytes);
        CHECK(fs->data[p] != NULL);
        CHECK_OK(wsync_dev_malloc(bytes, &dev[p]));
        wsync_shard_t sh = {fg_bf16_param(params[p].name, params[p].rows, params[p].cols),
                            {{lo, 0}, {hi - lo, params[p].cols}}, dev[p], WSYNC_MEM_CUDA, 0};
        CHECK_OK(wsync_sender_add_shard(fs->snd, &sh));
    }
    return check_failures ? -1 : 0;
}

static void upload(const fg_sender_t *fs, void *dev[NPARAMS])
{
    for (int p = 0; p < NPARAMS; p++) {
        int64_t lo, hi;
        fg_param_rows(&params[p], fs->rank, fs->nsenders, &lo, &hi);
        CHECK_OK(wsync_dev_memcpy_async(dev[p], fs->data[p],
                                        (size_t)((hi - lo) * params[p].cols) * 2, NULL));
    }
    CHECK_OK(wsync_dev_stream_sync(NULL, proc_now_ms() + TIMEOUT_MS, "the test's shards"));
}

static int sender_main(void *arg)
{
    const fg_member_t *m = arg;
    const group_t *g = m->group;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    fg_sender_t fs;
    void *dev[NPARAMS] = {0};
    int s = m->rank, cuda = use_cuda();

    if (g->verify)
        setenv("WSYNC_VERIFY", "1", 1);
    fg_sender_params(&sp, m, 64 * 1024, TIMEOUT_MS, g->transport, snapshots());
    sp.fp8_wire = g->fp8_wire;
    if (cuda ? open_cuda(&fs, m, &sp, dev) != 0
             : fg_sender_open(&fs, m, &sp, params, NPARAMS, value_bf16) != 0)
        return 1;
    for (uint64_t v = 1; v <= g->last; v++) {
        if (s == 1 && v == (uint64_t)g->die_version) {
            usleep(300000);   /* sender 0 is waiting for our amaxes by now */
            _exit(0);
        }
        fg_sender_fill(&fs, v);
        if (s == 1 && v == (uint64_t)g->nan_version)   /* o's row 130 (our row 2), column 7 */
            fs.data[P_O][2 * params[P_O].cols + 7] = 0x7fc0;
        if (cuda)
            upload(&fs, dev);
        if (fg_push_noted(&fs, v, &g->res->status[s], g->res->text[s], sizeof(g->res->text[s]),
                          s == 0 ? &g->res->fail_ms : NULL) != WSYNC_OK)
            break;
        wsync_push_stats_t stats;
        CHECK_OK(wsync_sender_stats(fs.snd, &stats));
        g->res->packed[s][v] = stats.bytes_packed;
        if (s == 0)
            __atomic_store_n(&g->res->published, (int)v, __ATOMIC_RELEASE);
        /* every reader read it, and the relays of a reader that came landed, before the next */
        CHECK_MSG(fg_wait_count(&g->res->fetched[v], readers_of(g, v), TIMEOUT_MS),
                  "sender %d: version %llu fetched by %d readers", s, (unsigned long long)v,
                  g->res->fetched[v]);
        usleep(300000);
    }
    if (s == 0) {
        g->res->explain_tensor = fg_explains(fs.snd, "per-tensor targets too (into host targets)");
        g->res->explain_ipc = fg_explains(fs.snd, "ipc or nccl");
    }
    int rc = fg_sender_close(&fs, g->nan_version || g->die_version);
    for (int p = 0; p < NPARAMS; p++)
        wsync_dev_free(dev[p]);
    return rc;
}

static void on_progress(void *arg, uint64_t version, uint64_t done, uint64_t total)
{
    uint64_t *landed = arg;
    (void)total;
    if (version <= LAST)
        landed[version] = done;
}

static int receiver_main(void *arg)
{
    const fg_member_t *m = arg;
    const group_t *g = m->group;
    int r = m->rank;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    wsync_ctx_t *ctx = NULL;
    fg_target_t ft[NTARGETS];
    tgt_t t[NTARGETS];
    uint64_t first = 1, bad = (uint64_t)(g->nan_version ? g->nan_version : g->die_version);

    if (r == 2) {   /* the late reader: once version LATE_FROM is published */
        long long until = proc_now_ms() + TIMEOUT_MS;
        while (__atomic_load_n(&g->res->published, __ATOMIC_ACQUIRE) < LATE_FROM &&
               proc_now_ms() < until)
            usleep(2000);
        first = LATE_FROM;
    }
    if (g->verify)
        setenv("WSYNC_VERIFY", "1", 1);
    make_targets(r, t);
    fg_receiver_params(&rp, m, TIMEOUT_MS);
    rp.progress = on_progress;
    rp.progress_arg = g->res->landed[r];
    wsync_receiver_t *rv = fg_receiver_open(&rp, &ctx);
    if (rv == NULL)
        return 1;
    for (int i = 0; i < NTARGETS; i++) {
        wsync_piece_t pc = {fg_bf16_param(params[t[i].p].name, params[t[i].p].rows,
                                          params[t[i].p].cols),
                            {{t[i].r0, t[i].c0}, {t[i].rows, t[i].cols}}, {0, 0}};
        wsync_target_t wt = {t[i].name, WSYNC_DTYPE_F8E4M3FN, 2, {t[i].rows, t[i].cols}, NULL,
                             WSYNC_MEM_HOST, 0, &pc, 1, tensor_q};
        if (fg_target_add(&ft[i], rv, wt) != 0)
            return 1;
    }
    for (uint64_t v = first; v <= g->last; v++) {
        uint64_t got = 0;
        wsync_status_t st = wsync_receiver_fetch(rv, v, v == bad ? 3000 : TIMEOUT_MS, &got);
        if (v == bad) {
            CHECK_MSG(st != WSYNC_OK, "reader %d: version %llu went through", r,
                      (unsigned long long)v);
            break;
        }
        CHECK_OK(st);
        if (st != WSYNC_OK)
            break;
        for (int i = 0; i < NTARGETS; i++) {
            float *x = target_values(&t[i], v, 0, t[i].rows);
            CHECK_OK(wsync_quantize_f32(t[i].name, x, (uint64_t)t[i].rows, (uint64_t)t[i].cols,
                                        (uint64_t)t[i].cols, &tensor_q, WSYNC_DTYPE_F8E4M3FN,
                                        ft[i].want, (uint64_t)t[i].cols, ft[i].want_scales));
            free(x);
            fg_target_check(&ft[i], r, v);
        }
        __atomic_add_fetch(&g->res->fetched[v], 1, __ATOMIC_RELEASE);
    }
    return fg_receiver_close(rv, ctx, ft, NTARGETS, &g->res->version[r]);
}

/* Probed once, in a child: a context made here may start CUDA (a transport with CUDA support
 * does), and CUDA started in this process fails in the senders it forks */
static const char *transport(void)
{
    static int known = -1;   /* 0: none, 1: ucx, 2: ofi */
    int status = 0;
    pid_t pid;

    if (known < 0) {
        pid = fork();
        if (pid == 0)
            _exit(test_have_transport("ucx") ? 1 : test_have_transport("ofi") ? 2 : 0);
        known = pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status)
                    ? WEXITSTATUS(status) : 0;
    }
    return known == 1 ? "ucx" : known == 2 ? "ofi" : NULL;
}

/* The test can fail: a scale from one sender's part alone is not the target's (o and lm). */
static void case_parts_differ(void)
{
    tgt_t t[NTARGETS];
    make_targets(2, t);
    for (int i = 0; i < 2; i++) {
        int64_t half = t[i].rows / 2;
        float *w = target_values(&t[i], 1, 0, t[i].rows), *a = target_values(&t[i], 1, 0, half),
              *b = target_values(&t[i], 1, half, t[i].rows);
        uint64_t n = (uint64_t)(t[i].rows * t[i].cols);
        float aw = wsync_amax_f32(w, n), a0 = wsync_amax_f32(a, n), a1 = wsync_amax_f32(b, n);
        CHECK_MSG(a0 != a1 && fmaxf(a0, a1) == aw, "%s: amaxes %g and %g of the senders' parts, "
                  "%g whole", t[i].name, (double)a0, (double)a1, (double)aw);
        CHECK(wsync_fp8_tensor_scale(fminf(a0, a1), WSYNC_DTYPE_F8E4M3FN) !=
              wsync_fp8_tensor_scale(aw, WSYNC_DTYPE_F8E4M3FN));
        free(w);
        free(a);
        free(b);
    }
}

/* Codes and one f32 of a chunk of rows x cols (cols a multiple of 4 here). */
static uint64_t fp8_chunk(uint64_t rows, uint64_t cols)
{
    return rows * cols + 4;
}

static void run_late(int verify)
{
    const char *tr = transport();
    results_t *res = tr != NULL ? fg_shared(sizeof(results_t)) : NULL;

    if (res == NULL)
        return;
    group_t g = {.transport = tr, .fp8_wire = 2, .nrecv = 3, .verify = verify, .last = LAST,
                 .res = res};
    fg_run_group(&g, NSENDERS, sender_main, 3, receiver_main);
    CHECK_MSG(res->explain_tensor, "rank 0's explanation does not say per-tensor targets travel "
              "FP8");
    CHECK_MSG(!res->explain_ipc, "rank 0's explanation of a store group names ipc or nccl");
    for (int r = 0; r < 3; r++)
        CHECK_MSG(res->version[r] == LAST, "reader %d holds version %llu", r,
                  (unsigned long long)res->version[r]);
    /* TP readers: o as two chunks (each sender's 128 rows), lm two (96 rows each), q one */
    uint64_t tp = 2 * fp8_chunk(128, 128) + 2 * fp8_chunk(96, 128) + fp8_chunk(128, 128);
    uint64_t tp_bf16 = 2 * (256 * 128 + 192 * 128 + 128 * 128);
    /* the TP-1 reader: o two chunks of 128 x 256, lm two, q two of 128 x 128 */
    uint64_t whole = 2 * fp8_chunk(128, 256) + 2 * fp8_chunk(96, 128) + 2 * fp8_chunk(128, 128);
    uint64_t first = 2 * (256 * 256 + 256 * 128) + 2 * fp8_chunk(96, 128);
    for (int r = 0; r < 2; r++)
        CHECK_MSG(res->landed[r][LAST] == tp, "reader %d read %llu bytes of version %d, %llu by "
                  "hand (bf16: %llu)", r, (unsigned long long)res->landed[r][LAST], LAST,
                  (unsigned long long)tp, (unsigned long long)tp_bf16);
    CHECK_MSG(res->landed[2][LATE_FROM] == first, "the late reader read %llu bytes of version %d, "
              "%llu by hand", (unsigned long long)res->landed[2][LATE_FROM], LATE_FROM,
              (unsigned long long)first);
    CHECK_MSG(res->landed[2][LAST] == whole, "the late reader read %llu bytes of version %d, %llu "
              "by hand", (unsigned long long)res->landed[2][LAST], LAST,
              (unsigned long long)whole);
    /* each sender: its snapshot (o 128 x 256, lm 96 x 128, q 128 x 128 bf16; none in place from
     * host shards: CUDA shards are staged into host memory whole either way) and its regions:
     * o for TP ranks 0 and 1 and whole, lm (one set), q for its TP rank and whole */
    uint64_t snap = snapshots() || use_cuda() ? 2 * (128 * 256 + 96 * 128 + 128 * 128) : 0;
    uint64_t regions = 2 * fp8_chunk(128, 128) + fp8_chunk(128, 256) + fp8_chunk(96, 128) +
                       2 * fp8_chunk(128, 128);
    for (int s = 0; s < NSENDERS; s++)
        CHECK_MSG(res->packed[s][LAST] == snap + regions, "sender %d packed %llu bytes in version "
                  "%d, %llu by hand", s, (unsigned long long)res->packed[s][LAST], LAST,
                  (unsigned long long)(snap + regions));
    printf("TP reader: %llu bytes (bf16 %llu, %.3f x); late reader version %d: %llu, version %d: "
           "%llu; sender packs %llu\n", (unsigned long long)tp, (unsigned long long)tp_bf16,
           (double)tp / (double)tp_bf16, LATE_FROM, (unsigned long long)res->landed[2][LATE_FROM],
           LAST, (unsigned long long)res->landed[2][LAST], (unsigned long long)res->packed[0][LAST]);
    munmap(res, sizeof(*res));
}

static void case_fsdp2_tp2_late(void)
{
    run_late(0);
}

/* WSYNC_VERIFY=1: every per-tensor chunk is read whole, so it is checked against its sender's
 * xxh3 and taken packed: the same bytes read. */
static void case_verified(void)
{
    run_late(1);
}

static void case_nan_refused(void)
{
    const char *tr = transport();
    results_t *res = tr != NULL ? fg_shared(sizeof(results_t)) : NULL;

    if (res == NULL)
        return;
    group_t g = {.transport = tr, .fp8_wire = 2, .nrecv = 2, .last = 4, .nan_version = 4,
                 .res = res};
    fg_run_group(&g, NSENDERS, sender_main, 2, receiver_main);
    printf("sender 1: %s: %s\n", wsync_status_name((wsync_status_t)res->status[1]), res->text[1]);
    printf("sender 0: %s: %s\n", wsync_status_name((wsync_status_t)res->status[0]), res->text[0]);
    CHECK(res->status[1] == WSYNC_ERR_NONFINITE);
    CHECK(strstr(res->text[1], params[P_O].name) != NULL);
    CHECK(strstr(res->text[1], "sender 1") != NULL);
    CHECK(strstr(res->text[1], "NaN at row 2, column 7") != NULL);
    CHECK(res->status[0] == WSYNC_ERR_NONFINITE);
    CHECK(strstr(res->text[0], "sender 1") != NULL);
    for (int r = 0; r < 2; r++)
        CHECK_MSG(res->version[r] == 3, "reader %d holds version %llu", r,
                  (unsigned long long)res->version[r]);
    munmap(res, sizeof(*res));
}

static void case_sender_lost(void)
{
    const char *tr = transport();
    results_t *res = tr != NULL ? fg_shared(sizeof(results_t)) : NULL;

    if (res == NULL)
        return;
    group_t g = {.transport = tr, .fp8_wire = 2, .nrecv = 2, .last = 4, .die_version = 4,
                 .res = res};
    fg_run_group(&g, NSENDERS, sender_main, 2, receiver_main);
    printf("sender 0 after %lld ms: %s: %s\n", res->fail_ms,
           wsync_status_name((wsync_status_t)res->status[0]), res->text[0]);
    CHECK(res->status[0] != WSYNC_OK);
    CHECK(strstr(res->text[0], "sender 1") != NULL);
    CHECK_MSG(res->fail_ms < TIMEOUT_MS / 2, "sender 0 failed after %lld ms", res->fail_ms);
    for (int r = 0; r < 2; r++)
        CHECK(res->version[r] == 3);
    munmap(res, sizeof(*res));
}

int main(void)
{
    if (transport() == NULL) {
        printf("no RMA transport (ucx, ofi): skipped\n");
        return 0;
    }
    if (use_cuda() && !gpu_seen()) {
        printf("STORE_FP8T_CUDA=1 without CUDA or a GPU: skipped\n");
        return 77;
    }
    RUN(case_parts_differ);
    RUN(case_fsdp2_tp2_late);
    RUN(case_verified);
    RUN(case_nan_refused);
    RUN(case_sender_lost);
    return check_summary();
}
