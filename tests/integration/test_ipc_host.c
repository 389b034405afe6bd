/* The ipc scheme on host memory, across processes: one sender and three receivers moving three
 * versions of a 64 MiB set of mixed params (one larger than a bucket), compared by hashes the
 * test computes itself; and the failures a user meets: unknown param, dtype and shape mismatch,
 * a receiver killed mid-push, malformed frames from a raw client, a rank claimed twice. Each
 * failure must reach every participant as a clear error, and nothing may hang. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>
#include <xxhash.h>

#include "tests/support/check.h"
#include "tests/support/proc.h"
#include "wsync/wsync.h"

#define MiB (1024 * 1024)
#define TIMEOUT_MS 20000

typedef struct {
    const char *name;
    wsync_dtype_t dtype;
    int ndim;
    int64_t shape[2];
} param_spec_t;

/* ~64 MiB of mixed dtypes and sizes; the first is 24 MiB, larger than the 8 MiB bucket. */
static const param_spec_t params[] = {
    {"model.layers.0.mlp.down_proj.weight", WSYNC_DTYPE_BF16, 2, {3072, 4096}},
    {"model.layers.0.mlp.up_proj.weight", WSYNC_DTYPE_F32, 2, {1024, 4096}},
    {"model.layers.0.self_attn.o_proj.weight", WSYNC_DTYPE_F16, 2, {2048, 2048}},
    {"model.layers.0.quant_table", WSYNC_DTYPE_U8, 1, {8 * MiB}},
    {"model.layers.0.self_attn.qkv_fp8", WSYNC_DTYPE_F8E4M3FN, 2, {1000, 7001}},
    {"model.norm.weight", WSYNC_DTYPE_BF16, 1, {4096}},
    {"model.layers.0.scale", WSYNC_DTYPE_F32, 1, {1}},
};
#define NPARAMS ((int)(sizeof(params) / sizeof(params[0])))

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Byte i of param p in version v: the test's own definition of the weights. */
static void fill(uint8_t *dst, size_t off, size_t n, int p, uint64_t v)
{
    for (size_t i = 0; i < n; i++) {
        size_t b = off + i;
        uint64_t w = splitmix64(((uint64_t)p << 48) ^ (v << 40) ^ (b / 8));
        dst[i] = (uint8_t)(w >> (8 * (b % 8)));
    }
}

static size_t param_bytes(int p)
{
    size_t n = wsync_dtype_size(params[p].dtype);
    for (int d = 0; d < params[p].ndim; d++)
        n *= (size_t)params[p].shape[d];
    return n;
}

static size_t row_bytes(int p)
{
    return params[p].ndim == 1 ? param_bytes(p) : param_bytes(p) / (size_t)params[p].shape[0];
}

static wsync_param_t to_param(int p)
{
    wsync_param_t wp = {params[p].name, params[p].dtype, params[p].ndim, {0}};
    for (int d = 0; d < params[p].ndim; d++)
        wp.shape[d] = params[p].shape[d];
    return wp;
}

/* ---- a configurable group -------------------------------------------------------------------- */

typedef struct {
    int port;
    int nsenders, nreceivers;
    int sender_rank;           /* for sender children */
    int receiver_rank;         /* for receiver children */
    int versions;              /* versions to push / expect */
    size_t bucket;
    int kill_receiver;         /* receiver rank that dies in version 2 (-1: none) */
    const char *bad_param;     /* a receiver 0 target naming a param nobody holds */
    int bad_dtype, bad_shape;  /* receiver 0 describes param 1 wrongly */
    int sync_fd;               /* raw-client test: sender waits on it before version 2 */
    int push_sleep_ms;
    int inplace;               /* sender allocates even-numbered params with wsync_mem_alloc */
    int stop_receiver;         /* receiver rank that stops (SIGSTOP) in version 2 (-1: none) */
    int timeout_ms;            /* every participant's deadline (0: TIMEOUT_MS) */
    const char *expect_error;  /* failure tests: text every participant's error must contain */
} group_t;

static char coord_addr[64];

/* Sender 0 is the coordinator: once its group failed, it stays a moment, so that a participant
 * still starting (a loaded machine) reaches it and is told why the group ended, not refused a
 * connection until its deadline. Also when the group failed during sender 0's own create (a rank
 * claimed twice is found while the HELLOs arrive): CI once saw a receiver start after that. */
static void linger_if_coordinator(const group_t *g)
{
    if (g->sender_rank == 0)
        usleep(3000000);
}

static int sender_main(void *arg)
{
    const group_t *g = arg;
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    uint8_t *data[NPARAMS];
    wsync_status_t st;

    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    sp.coordinator = coord_addr;
    sp.rank = g->sender_rank;
    sp.nranks = g->nsenders;
    sp.nreceivers = g->nreceivers;
    sp.bucket_bytes = g->bucket;
    sp.timeout_ms = g->timeout_ms ? g->timeout_ms : TIMEOUT_MS;
    sp.heartbeat_ms = 200;
    st = wsync_sender_create(ctx, &sp, &s);
    if (st != WSYNC_OK) {
        if (g->expect_error != NULL) {
            CHECK_ERR_HAS(g->expect_error);
            linger_if_coordinator(g);
            wsync_ctx_free(ctx);
            return check_failures ? 1 : 0;
        }
        CHECK_OK(st);
        return 1;
    }
    /* FSDP-style: with several senders, sender i holds rows [i*R/N, (i+1)*R/N) of each 2-D param
     * and sender 0 holds the 1-D params whole */
    for (int p = 0; p < NPARAMS; p++) {
        wsync_shard_t sh = {to_param(p), {{0}, {0}}, NULL, WSYNC_MEM_HOST, 0};
        int64_t rows = params[p].ndim == 2 ? params[p].shape[0] : 1;
        int64_t r0 = params[p].ndim == 2 ? rows * g->sender_rank / g->nsenders : 0;
        int64_t r1 = params[p].ndim == 2 ? rows * (g->sender_rank + 1) / g->nsenders : 1;
        if (params[p].ndim == 1 && g->sender_rank != 0) {
            data[p] = NULL;
            continue;
        }
        sh.box.start[0] = r0;
        sh.box.len[0] = params[p].ndim == 2 ? r1 - r0 : params[p].shape[0];
        if (params[p].ndim == 2)
            sh.box.len[1] = params[p].shape[1];
        size_t bytes = (size_t)(r1 - r0) * row_bytes(p) + 1;
        if (g->inplace && p % 2 == 0)
            CHECK_OK(wsync_mem_alloc(ctx, bytes, (void **)&data[p]));
        else
            data[p] = malloc(bytes);
        sh.data = data[p];
        CHECK_OK(wsync_sender_add_shard(s, &sh));
    }
    for (int v = 1; v <= g->versions; v++) {
        for (int p = 0; p < NPARAMS; p++) {
            if (data[p] == NULL)
                continue;
            int64_t rows = params[p].ndim == 2 ? params[p].shape[0] : 1;
            int64_t r0 = params[p].ndim == 2 ? rows * g->sender_rank / g->nsenders : 0;
            int64_t r1 = params[p].ndim == 2 ? rows * (g->sender_rank + 1) / g->nsenders : 1;
            fill(data[p], (size_t)r0 * row_bytes(p), (size_t)(r1 - r0) * row_bytes(p), p,
                 (uint64_t)v);
        }
        if (v == 2 && g->sync_fd >= 0) {
            struct pollfd pfd = {g->sync_fd, POLLIN, 0};
            CHECK_MSG(poll(&pfd, 1, TIMEOUT_MS) == 1, "raw client did not finish");
        }
        long long t0 = proc_now_ms();
        st = wsync_sender_push(s, (uint64_t)v);
        if (g->expect_error != NULL) {
            if (st == WSYNC_OK) {
                if (g->push_sleep_ms)
                    usleep((useconds_t)g->push_sleep_ms * 1000);
                continue;
            }
            CHECK_MSG(st == WSYNC_ERR_PEER_LOST || st == WSYNC_ERR_MISMATCH ||
                          st == WSYNC_ERR_ABORTED,
                      "push returned %s: %s", wsync_status_name(st), wsync_last_error());
            CHECK_ERR_HAS(g->expect_error);
            CHECK_MSG(proc_now_ms() - t0 < TIMEOUT_MS, "the error took %lld ms",
                      proc_now_ms() - t0);
            break;
        }
        CHECK_OK(st);
        if (st != WSYNC_OK)
            break;
        wsync_push_stats_t stats;
        CHECK_OK(wsync_sender_stats(s, &stats));
        CHECK(stats.version == (uint64_t)v);
        {
            /* every byte this sender holds is needed by some receiver: staged all of it, or —
             * with shareable memory — only the params outside it */
            uint64_t held = 0, held_shared = 0;
            for (int p = 0; p < NPARAMS; p++) {
                if (data[p] == NULL)
                    continue;
                int64_t rows = params[p].ndim == 2 ? params[p].shape[0] : 1;
                int64_t r0 = params[p].ndim == 2 ? rows * g->sender_rank / g->nsenders : 0;
                int64_t r1 = params[p].ndim == 2 ? rows * (g->sender_rank + 1) / g->nsenders : 1;
                uint64_t b = (uint64_t)(r1 - r0) * row_bytes(p);
                held += b;
                if (g->inplace && p % 2 == 0)
                    held_shared += b;
            }
            /* receiver 2's rows [100, 1100) of param 0 differ from the whole-param region the
             * others read, so the plan stages them as a chunk of their own (dedup is by region) */
            uint64_t extra = 0;
            if (g->nreceivers >= 3 && !(g->inplace)) {
                int64_t r0 = params[0].shape[0] * g->sender_rank / g->nsenders;
                int64_t r1 = params[0].shape[0] * (g->sender_rank + 1) / g->nsenders;
                int64_t lo = r0 > 100 ? r0 : 100, hi = r1 < 1100 ? r1 : 1100;
                if (hi > lo)
                    extra = (uint64_t)(hi - lo) * row_bytes(0);
            }
            CHECK_MSG(stats.bytes_packed == held - held_shared + extra,
                      "sender %d staged %llu bytes; holds %llu, %llu of them shareable",
                      g->sender_rank, (unsigned long long)stats.bytes_packed,
                      (unsigned long long)held, (unsigned long long)held_shared);
        }
        CHECK(strcmp(wsync_sender_scheme(s), "ipc") == 0);
    }
    if (g->expect_error != NULL) {
        CHECK_MSG(st != WSYNC_OK, "every push succeeded; expected an error with \"%s\"",
                  g->expect_error);
        linger_if_coordinator(g);
    }
    wsync_sender_free(s);
    for (int p = 0; p < NPARAMS; p++) {
        if (g->inplace && p % 2 == 0)
            wsync_mem_free(ctx, data[p]);
        else
            free(data[p]);
    }
    wsync_ctx_free(ctx);
    return check_failures ? 1 : 0;
}

static void on_progress(void *arg, uint64_t version, uint64_t done, uint64_t total)
{
    (void)arg;
    (void)total;
    if (version == 2 && done > 0)
        raise(SIGKILL);   /* die with part of version 2 landed */
}

static void on_progress_stop(void *arg, uint64_t version, uint64_t done, uint64_t total)
{
    (void)arg;
    (void)total;
    if (version == 2 && done > 0)
        raise(SIGSTOP);   /* hang with the sockets open: only the silence deadline can tell */
}

static int receiver_main(void *arg)
{
    const group_t *g = arg;
    int r = g->receiver_rank;
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *rv = NULL;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    uint8_t *buf[NPARAMS + 1] = {0};
    size_t off[NPARAMS + 1], len[NPARAMS + 1];
    int ntargets = 0;
    wsync_status_t st;

    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    rp.coordinator = coord_addr;
    rp.rank = r;
    rp.nreceivers = g->nreceivers;
    rp.timeout_ms = g->timeout_ms ? g->timeout_ms : TIMEOUT_MS;
    rp.heartbeat_ms = 200;
    if (g->kill_receiver == r)
        rp.progress = on_progress;
    if (g->stop_receiver == r)
        rp.progress = on_progress_stop;
    st = wsync_receiver_create(ctx, &rp, &rv);
    if (st != WSYNC_OK && g->expect_error != NULL) {
        /* a group that failed before we joined must still say why; unless its coordinator,
         * in sender 0's process, had already exited (a slow start: under ASan the receiver
         * came after sender 0 saw the failure and left, or joined just before it left), which
         * the senders' own checks of the error then cover */
        if (strstr(wsync_last_error(), "could not reach the coordinator") == NULL &&
            strstr(wsync_last_error(), "lost the coordinator") == NULL)
            CHECK_ERR_HAS(g->expect_error);
        wsync_ctx_free(ctx);
        return check_failures ? 1 : 0;
    }
    CHECK_OK(st);
    if (st != WSYNC_OK)
        return 1;
    for (int p = 0; p < NPARAMS; p++) {
        wsync_piece_t piece = {to_param(p), {{0}, {0}}, {0}};
        wsync_target_t t = {params[p].name, params[p].dtype, params[p].ndim, {0}, NULL,
                            WSYNC_MEM_HOST, 0, &piece, 1, {0}};
        for (int d = 0; d < params[p].ndim; d++) {
            t.shape[d] = params[p].shape[d];
            piece.src.len[d] = params[p].shape[d];
        }
        off[p] = 0;
        len[p] = param_bytes(p);
        if (r == 2 && p == 0) {
            /* receiver 2 takes only rows [100, 1100) of the big param */
            piece.src.start[0] = 100;
            piece.src.len[0] = 1000;
            t.shape[0] = 1000;
            off[p] = 100 * row_bytes(p);
            len[p] = 1000 * row_bytes(p);
        }
        if (r == 0 && p == 1 && g->bad_dtype)
            piece.param.dtype = t.dtype = WSYNC_DTYPE_BF16;
        if (r == 0 && p == 1 && g->bad_shape)
            piece.param.shape[1] = 8192;   /* the box still fits: only the coordinator can tell */
        buf[p] = malloc(len[p]);
        memset(buf[p], 0xAB, len[p]);   /* poison: stale bytes cannot pass for data */
        t.data = buf[p];
        CHECK_OK(wsync_receiver_add_target(rv, &t));
        ntargets++;
    }
    if (r == 0 && g->bad_param != NULL) {
        wsync_piece_t piece = {{g->bad_param, WSYNC_DTYPE_BF16, 1, {64}}, {{0}, {64}}, {0}};
        wsync_target_t t = {"extra", WSYNC_DTYPE_BF16, 1, {64}, NULL, WSYNC_MEM_HOST, 0, &piece, 1,
                            {0}};
        buf[NPARAMS] = malloc(128);
        t.data = buf[NPARAMS];
        CHECK_OK(wsync_receiver_add_target(rv, &t));
    }
    for (int v = 1; v <= g->versions; v++) {
        uint64_t got = 0;
        st = wsync_receiver_wait(rv, TIMEOUT_MS, &got);
        if (g->expect_error != NULL && st != WSYNC_OK) {
            CHECK_MSG(st == WSYNC_ERR_PEER_LOST || st == WSYNC_ERR_MISMATCH ||
                          st == WSYNC_ERR_ABORTED,
                      "wait returned %s: %s", wsync_status_name(st), wsync_last_error());
            CHECK_ERR_HAS(g->expect_error);
            CHECK(wsync_receiver_version(rv) == (uint64_t)(v - 1));
            break;
        }
        CHECK_OK(st);
        if (st != WSYNC_OK)
            break;
        CHECK_MSG(got == (uint64_t)v, "receiver %d got version %llu, expected %d", r,
                  (unsigned long long)got, v);
        CHECK(!wsync_receiver_torn(rv));
        for (int p = 0; p < NPARAMS; p++) {
            uint8_t *want = malloc(len[p]);
            fill(want, off[p], len[p], p, (uint64_t)v);
            CHECK_MSG(XXH3_64bits(buf[p], len[p]) == XXH3_64bits(want, len[p]),
                      "receiver %d version %d: param %s differs from the sender's", r, v,
                      params[p].name);
            free(want);
        }
    }
    if (g->expect_error != NULL)
        CHECK_MSG(st != WSYNC_OK, "every wait succeeded; expected an error with \"%s\"",
                  g->expect_error);
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    for (int p = 0; p <= NPARAMS; p++)
        free(buf[p]);
    return check_failures ? 1 : 0;
}

/* Run a group: senders, then receivers; returns the exit codes. */
static void run_group(group_t *g, int extra_senders_rank1, int *codes, int *nprocs)
{
    pid_t pids[16];
    group_t cfg[16];
    int n = 0;

    g->port = proc_free_port();
    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%d", g->port);
    for (int s = 0; s < g->nsenders + extra_senders_rank1; s++) {
        cfg[n] = *g;
        cfg[n].sender_rank = s < g->nsenders ? s : 1;
        pids[n] = proc_spawn(sender_main, &cfg[n], 60);
        n++;
    }
    for (int r = 0; r < g->nreceivers; r++) {
        cfg[n] = *g;
        cfg[n].receiver_rank = r;
        pids[n] = proc_spawn(receiver_main, &cfg[n], 60);
        n++;
    }
    /* (receivers retry until the coordinator listens; the lingering coordinator covers
     * late starters of a group that fails at once) */
    proc_wait_all(pids, n, 90000, codes);
    *nprocs = n;
}

static group_t base_group(void)
{
    group_t g;
    memset(&g, 0, sizeof(g));
    g.nsenders = 1;
    g.nreceivers = 3;
    g.versions = 3;
    g.bucket = 8 * MiB;
    g.kill_receiver = -1;
    g.stop_receiver = -1;
    g.sync_fd = -1;
    return g;
}

static void case_three_receivers_three_versions(void)
{
    group_t g = base_group();
    int codes[16], n;

    run_group(&g, 0, codes, &n);
    for (int i = 0; i < n; i++)
        CHECK_MSG(codes[i] == 0, "process %d exited with %d", i, codes[i]);
}

static void case_two_senders_small_buckets(void)
{
    group_t g = base_group();
    int codes[16], n;

    g.nsenders = 2;
    g.nreceivers = 2;
    g.bucket = 1 * MiB;   /* many buckets: exercises slot reuse and release ordering */
    run_group(&g, 0, codes, &n);
    for (int i = 0; i < n; i++)
        CHECK_MSG(codes[i] == 0, "process %d exited with %d", i, codes[i]);
}

/* Shards in wsync_mem_alloc memory are read in place, the others staged, in the same buckets. */
static void case_inplace_and_staged(void)
{
    group_t g = base_group();
    int codes[16], n;

    g.nsenders = 2;
    g.bucket = 2 * MiB;
    g.inplace = 1;
    run_group(&g, 0, codes, &n);
    for (int i = 0; i < n; i++)
        CHECK_MSG(codes[i] == 0, "process %d exited with %d", i, codes[i]);
}

static void case_unknown_param(void)
{
    group_t g = base_group();
    int codes[16], n;

    g.nreceivers = 2;
    g.bad_param = "model.layers.9.mlp.missing.weight";
    g.expect_error = "model.layers.9.mlp.missing.weight";
    run_group(&g, 0, codes, &n);
    for (int i = 0; i < n; i++)
        CHECK_MSG(codes[i] == 0, "process %d exited with %d", i, codes[i]);
}

static void case_dtype_mismatch(void)
{
    group_t g = base_group();
    int codes[16], n;

    g.nreceivers = 2;
    g.bad_dtype = 1;
    g.expect_error = params[1].name;
    run_group(&g, 0, codes, &n);
    for (int i = 0; i < n; i++)
        CHECK_MSG(codes[i] == 0, "process %d exited with %d", i, codes[i]);
}

static void case_shape_mismatch(void)
{
    group_t g = base_group();
    int codes[16], n;

    g.nreceivers = 2;
    g.bad_shape = 1;
    g.expect_error = params[1].name;
    run_group(&g, 0, codes, &n);
    for (int i = 0; i < n; i++)
        CHECK_MSG(codes[i] == 0, "process %d exited with %d", i, codes[i]);
}

static void case_receiver_killed_mid_push(void)
{
    group_t g = base_group();
    int codes[16], n;

    g.bucket = 1 * MiB;
    g.kill_receiver = 1;
    g.expect_error = "receiver 1";
    run_group(&g, 0, codes, &n);
    /* processes: sender, receiver 0, receiver 1 (killed), receiver 2 */
    CHECK_MSG(codes[0] == 0, "sender exited with %d", codes[0]);
    CHECK_MSG(codes[1] == 0, "receiver 0 exited with %d", codes[1]);
    CHECK_MSG(codes[2] == 128 + SIGKILL, "receiver 1 exited with %d, expected SIGKILL", codes[2]);
    CHECK_MSG(codes[3] == 0, "receiver 2 exited with %d", codes[3]);
}

static void case_receiver_stalled_mid_push(void)
{
    group_t g = base_group();
    pid_t pids[8];
    group_t cfg[8];
    int codes[8], n = 0;
    long long t0 = proc_now_ms();

    g.bucket = 1 * MiB;
    g.stop_receiver = 1;
    g.timeout_ms = 2000;
    g.expect_error = "receiver 1";
    g.port = proc_free_port();
    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%d", g.port);
    cfg[n] = g;
    pids[n] = proc_spawn(sender_main, &cfg[n], 60);
    n++;
    for (int r = 0; r < g.nreceivers; r++) {
        cfg[n] = g;
        cfg[n].receiver_rank = r;
        pids[n] = proc_spawn(receiver_main, &cfg[n], 60);
        n++;
    }
    /* the stopped receiver never exits: wait for the others, then kill it */
    int others[3] = {0, 1, 3}, ocodes[3];
    pid_t opids[3] = {pids[0], pids[1], pids[3]};
    proc_wait_all(opids, 3, 60000, ocodes);
    long long took = proc_now_ms() - t0;
    kill(pids[2], SIGKILL);
    proc_wait_all(&pids[2], 1, 5000, &codes[2]);
    for (int i = 0; i < 3; i++)
        CHECK_MSG(ocodes[i] == 0, "process %d exited with %d", others[i], ocodes[i]);
    /* heartbeats every 200 ms, silence deadline 2 s: everyone knew well before 20 s */
    CHECK_MSG(took < 15000, "the stall was reported after %lld ms", took);
}

static void case_rank_claimed_twice(void)
{
    group_t g = base_group();
    int codes[16], n;

    g.nsenders = 2;
    g.nreceivers = 1;
    g.versions = 40;
    g.push_sleep_ms = 50;
    g.expect_error = "claimed twice";
    run_group(&g, 1, codes, &n);
    for (int i = 0; i < n; i++)
        CHECK_MSG(codes[i] == 0, "process %d exited with %d", i, codes[i]);
}

/* ---- raw clients --------------------------------------------------------------------------- */

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A frame header built by the test itself, following docs/protocol in core/frame.h. */
static void make_header(uint8_t h[24], uint16_t type, uint32_t len, const void *payload)
{
    memcpy(h, "WSYN", 4);
    put_le(h + 4, 1, 2);
    put_le(h + 6, type, 2);
    put_le(h + 8, 0, 4);
    put_le(h + 12, len, 4);
    put_le(h + 16, payload ? XXH3_64bits(payload, len) : 0, 8);
}

/* Connect, send bytes, and expect the coordinator to close the connection within 5 s. */
static int send_and_expect_close(int port, const void *bytes, size_t n, int close_early)
{
    struct sockaddr_in sa;
    int fd = socket(AF_INET, SOCK_STREAM, 0), closed = 0;
    char buf[256];

    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int tries = 0; connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 && tries < 200; tries++)
        usleep(20000);
    if (write(fd, bytes, n) != (ssize_t)n)
        fprintf(stderr, "raw client: short write\n");
    if (close_early) {
        close(fd);
        return 1;
    }
    struct pollfd pfd = {fd, POLLIN, 0};
    long long deadline = proc_now_ms() + 5000;
    while (proc_now_ms() < deadline && poll(&pfd, 1, 100) >= 0) {
        if (pfd.revents) {
            ssize_t r = read(fd, buf, sizeof(buf));
            if (r <= 0) {
                closed = 1;
                break;
            }
            /* a heartbeat or an ABORT frame before the close is fine */
        }
    }
    close(fd);
    return closed;
}

typedef struct {
    int port;
    int done_fd;
} raw_arg_t;

static int raw_client_main(void *arg)
{
    raw_arg_t *a = arg;
    uint8_t frame[24 + 64];
    const char garbage[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    uint8_t payload[16] = {1, 2, 3};

    usleep(200000);   /* let the group form first */
    CHECK_MSG(send_and_expect_close(a->port, garbage, sizeof(garbage), 0),
              "garbage bytes: the coordinator kept the connection open");
    make_header(frame, 1 /* HELLO */, 1u << 30, NULL);
    CHECK_MSG(send_and_expect_close(a->port, frame, 24, 0),
              "oversized frame: the coordinator kept the connection open");
    make_header(frame, 1, 64, NULL);
    send_and_expect_close(a->port, frame, 34, 1);   /* truncated, then gone */
    make_header(frame, 7 /* COMMIT */, 16, payload);
    memcpy(frame + 24, payload, 16);
    CHECK_MSG(send_and_expect_close(a->port, frame, 40, 0),
              "COMMIT before HELLO: the coordinator kept the connection open");
    make_header(frame, 1 /* HELLO */, 16, payload);
    memcpy(frame + 24, payload, 16);
    CHECK_MSG(send_and_expect_close(a->port, frame, 40, 0),
              "malformed HELLO: the coordinator kept the connection open");
    make_header(frame, 1, 16, payload);
    frame[20] ^= 0xff;   /* checksum mismatch */
    memcpy(frame + 24, payload, 16);
    CHECK_MSG(send_and_expect_close(a->port, frame, 40, 0),
              "bad checksum: the coordinator kept the connection open");
    if (write(a->done_fd, "x", 1) != 1)
        return 1;
    return check_failures ? 1 : 0;
}

static void case_raw_client_frames(void)
{
    group_t g = base_group();
    pid_t pids[8];
    group_t cfg[8];
    int codes[8], n = 0, pipefd[2];
    raw_arg_t raw;

    CHECK(pipe(pipefd) == 0);
    g.nreceivers = 1;
    g.versions = 2;
    g.port = proc_free_port();
    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%d", g.port);
    cfg[0] = g;
    cfg[0].sync_fd = pipefd[0];
    pids[n++] = proc_spawn(sender_main, &cfg[0], 60);
    cfg[1] = g;
    cfg[1].receiver_rank = 0;
    pids[n++] = proc_spawn(receiver_main, &cfg[1], 60);
    raw.port = g.port;
    raw.done_fd = pipefd[1];
    pids[n++] = proc_spawn(raw_client_main, &raw, 60);
    proc_wait_all(pids, n, 90000, codes);
    close(pipefd[0]);
    close(pipefd[1]);
    for (int i = 0; i < n; i++)
        CHECK_MSG(codes[i] == 0, "process %d exited with %d", i, codes[i]);
}

static char shm_before[8192];

/* memfds have no names: after every group above, nothing may have appeared in /dev/shm (other
 * programs' entries may come and go; only new ones count) */
static void case_dev_shm_clean(void)
{
    char after[8192], before[8200];

    snprintf(before, sizeof(before), "\n%s", shm_before);   /* every name between newlines */
    proc_list_dev_shm(after, sizeof(after));
    for (char *line = strtok(after, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char needle[300];
        snprintf(needle, sizeof(needle), "\n%s\n", line);
        CHECK_MSG(strstr(before, needle) != NULL, "/dev/shm/%s appeared during the test", line);
    }
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    proc_list_dev_shm(shm_before, sizeof(shm_before));
    RUN(case_three_receivers_three_versions);
    RUN(case_two_senders_small_buckets);
    RUN(case_inplace_and_staged);
    RUN(case_unknown_param);
    RUN(case_dtype_mismatch);
    RUN(case_shape_mismatch);
    RUN(case_receiver_killed_mid_push);
    RUN(case_receiver_stalled_mid_push);
    RUN(case_raw_client_frames);
    RUN(case_rank_claimed_twice);
    RUN(case_dev_shm_clean);
    return check_summary();
}
