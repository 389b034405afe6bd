/* The asynchronous push (wsync_sender_push_begin / _wait / _test) on host memory, across
 * processes, with the ipc scheme. Receivers are made slow (their progress callback sleeps after
 * every bucket), so that a version is still landing long after push_begin returned:
 *  - copy_shards: the trainer overwrites its shards with the next version's bytes as soon as
 *    push_begin returned, while the receivers land; every receiver must still end with exactly
 *    the bytes the shards held at push_begin (computed here by the test's own generator), and
 *    push_wait returns OK and that version;
 *  - no copy: the trainer computes (reads its shards) while the push runs and writes only after
 *    push_wait; the blocking push still works beside begin/wait;
 *  - misuse: a second push_begin, push/setup/stats/add_shard during a push are WSYNC_ERR_STATE
 *    naming the version in flight; push_wait with none in flight is WSYNC_ERR_STATE;
 *  - a receiver killed in the middle of a version: push_wait reports WSYNC_ERR_PEER_LOST naming
 *    it, within the deadline, and a later push_begin returns the group's failure at once;
 *  - a sender freed during a push: the free aborts it and returns promptly, receivers fail;
 *  - the store scheme in place (snapshot = 0) with copy_shards: the reader gets each version's
 *    bytes though the trainer overwrote its shards right after push_begin (skipped without an
 *    RMA transport). */
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/check.h"
#include "tests/support/proc.h"
#include "tests/support/transports.h"
#include "wsync/wsync.h"

#define TIMEOUT_MS 5000
#define VERSIONS 3
#define BUCKET (128 * 1024)
#define SLOW_US 20000   /* a receiver's sleep after each bucket: 16+ buckets, >= 0.3 s a version */

typedef struct {
    const char *name;
    wsync_dtype_t dtype;
    int64_t rows, cols;
} param_spec_t;

/* ~2.3 MiB in three params: 18 or more buckets of 128 KiB */
static const param_spec_t params[] = {
    {"model.layers.0.mlp.up_proj.weight", WSYNC_DTYPE_BF16, 512, 1536},
    {"model.layers.0.self_attn.o_proj.weight", WSYNC_DTYPE_F32, 256, 256},
    {"model.norm.weight", WSYNC_DTYPE_BF16, 1, 4096},
};
#define NPARAMS ((int)(sizeof(params) / sizeof(params[0])))

static size_t param_bytes(int p)
{
    return (size_t)params[p].rows * (size_t)params[p].cols * wsync_dtype_size(params[p].dtype);
}

static wsync_param_t to_param(int p)
{
    wsync_param_t wp = {params[p].name, params[p].dtype, 2, {params[p].rows, params[p].cols}};
    return wp;
}

/* Byte i of param p in version v: the test's own definition of the weights. */
static void fill(uint8_t *dst, size_t n, int p, uint64_t v)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t x = ((uint64_t)p << 56) ^ (v << 40) ^ i;
        x = (x ^ (x >> 31)) * 0x9e3779b97f4a7c15ull;
        dst[i] = (uint8_t)(x >> 56);
    }
}

typedef struct {
    int copy;                 /* the sender's copy_shards */
    int nreceivers;
    int rank;                 /* receiver children */
    int kill_receiver;        /* receiver that dies in version 2 (-1: none) */
    int free_mid_push;        /* the trainer frees its sender during the push of version 2 */
} group_t;

static char coord_addr[64];

/* ---- the trainer ------------------------------------------------------------------------------ */

/* Calls a trainer might make by mistake while a push is in flight: each WSYNC_ERR_STATE naming
 * the version. */
static void check_busy(wsync_sender_t *s, uint64_t v, uint8_t *some_data)
{
    char want[64];
    wsync_push_stats_t stats;
    wsync_shard_t sh = {to_param(0), {{0}, {1, 1}}, some_data, WSYNC_MEM_HOST, 0};

    snprintf(want, sizeof(want), "the push of version %llu is in flight", (unsigned long long)v);
    CHECK_ST(wsync_sender_push_begin(s, v + 1), WSYNC_ERR_STATE);
    CHECK_ERR_HAS(want);
    CHECK_ERR_HAS("cannot begin version");
    CHECK_ST(wsync_sender_push(s, v + 1), WSYNC_ERR_STATE);
    CHECK_ERR_HAS(want);
    CHECK_ST(wsync_sender_setup(s), WSYNC_ERR_STATE);
    CHECK_ERR_HAS("wsync_sender_setup while the push of version");
    CHECK_ST(wsync_sender_stats(s, &stats), WSYNC_ERR_STATE);
    CHECK_ERR_HAS("wsync_sender_stats while the push of version");
    CHECK_ST(wsync_sender_add_shard(s, &sh), WSYNC_ERR_STATE);
}

static int sender_main(void *arg)
{
    const group_t *g = arg;
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    uint8_t *data[NPARAMS];
    wsync_status_t st;
    int landing_seen = 0;
    uint64_t got = 0;

    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    sp.coordinator = coord_addr;
    sp.rank = 0;
    sp.nranks = 1;
    sp.nreceivers = g->nreceivers;
    sp.scheme = "ipc";
    sp.bucket_bytes = BUCKET;
    sp.timeout_ms = TIMEOUT_MS;
    sp.heartbeat_ms = 200;
    sp.copy_shards = g->copy;
    st = wsync_sender_create(ctx, &sp, &s);
    CHECK_OK(st);
    if (st != WSYNC_OK)
        return 1;
    for (int p = 0; p < NPARAMS; p++) {
        /* param 0 in shareable memory (read in place without a copy), the rest staged */
        if (p == 0)
            CHECK_OK(wsync_mem_alloc(ctx, param_bytes(p), (void **)&data[p]));
        else
            data[p] = malloc(param_bytes(p));
        fill(data[p], param_bytes(p), p, 1);
        wsync_shard_t sh = {to_param(p), {{0}, {params[p].rows, params[p].cols}}, data[p],
                            WSYNC_MEM_HOST, 0};
        CHECK_OK(wsync_sender_add_shard(s, &sh));
    }
    CHECK_ST(wsync_sender_push_wait(s, 0, &got), WSYNC_ERR_STATE);
    CHECK_ERR_HAS("no push in flight");
    for (uint64_t v = 1; v <= VERSIONS; v++) {
        int done = -1;
        long long t0 = proc_now_ms();
        /* the shards hold version v's bytes here */
        if (!g->copy && v == VERSIONS) {
            /* the blocking push beside begin/wait */
            CHECK_OK(wsync_sender_push(s, v));
            for (int p = 0; p < NPARAMS; p++)
                fill(data[p], param_bytes(p), p, v + 1);
            continue;
        }
        st = wsync_sender_push_begin(s, v);
        CHECK_OK(st);
        if (st != WSYNC_OK)
            break;
        if (g->copy) {
            /* allowed at once: the next version's bytes, while the receivers land this one */
            for (int p = 0; p < NPARAMS; p++)
                fill(data[p], param_bytes(p), p, v + 1);
        } else {
            /* "computing": reading the shards is allowed; writing waits for push_wait */
            uint64_t sum = 0;
            for (int p = 0; p < NPARAMS; p++)
                for (size_t i = 0; i < param_bytes(p); i += 64)
                    sum += data[p][i];
            CHECK(sum > 0);
        }
        CHECK_OK(wsync_sender_push_test(s, &done));
        if (done == 0)
            landing_seen++;   /* the writes above ended while receivers were still landing */
        check_busy(s, v, data[0]);
        if (g->free_mid_push && v == 2) {
            /* aborts the push (the group fails) and waits for wsync's thread: promptly */
            t0 = proc_now_ms();
            wsync_sender_free(s);
            s = NULL;
            CHECK_MSG(proc_now_ms() - t0 < TIMEOUT_MS, "wsync_sender_free during a push took "
                      "%lld ms", proc_now_ms() - t0);
            break;
        }
        if (g->kill_receiver >= 0 && v == 2) {
            st = wsync_sender_push_wait(s, -1, &got);
            CHECK_MSG(st == WSYNC_ERR_PEER_LOST, "push_wait returned %s: %s",
                      wsync_status_name(st), wsync_last_error());
            CHECK_ERR_HAS("receiver 1");
            CHECK_MSG(proc_now_ms() - t0 < TIMEOUT_MS * 2, "the error took %lld ms",
                      proc_now_ms() - t0);
            /* reaped: the next begin returns the group's failure at once */
            t0 = proc_now_ms();
            st = wsync_sender_push_begin(s, v + 1);
            CHECK_MSG(st == WSYNC_ERR_PEER_LOST, "push_begin after the failure returned %s: %s",
                      wsync_status_name(st), wsync_last_error());
            CHECK_ERR_HAS("receiver 1");
            CHECK(proc_now_ms() - t0 < 1000);
            CHECK_ST(wsync_sender_push_wait(s, 0, NULL), WSYNC_ERR_STATE);
            break;
        }
        /* not yet: the receivers sleep after every bucket */
        CHECK_ST(wsync_sender_push_wait(s, 50, &got), WSYNC_ERR_TIMEOUT);
        CHECK_ERR_HAS("still in flight");
        got = 0;
        CHECK_OK(wsync_sender_push_wait(s, -1, &got));
        CHECK_MSG(got == v, "push_wait returned version %llu, expected %llu",
                  (unsigned long long)got, (unsigned long long)v);
        CHECK_ST(wsync_sender_push_test(s, &done), WSYNC_ERR_STATE);
        wsync_push_stats_t stats;
        CHECK_OK(wsync_sender_stats(s, &stats));
        CHECK(stats.version == v);
        if (!g->copy)
            for (int p = 0; p < NPARAMS; p++)
                fill(data[p], param_bytes(p), p, v + 1);
    }
    if (g->kill_receiver < 0 && !g->free_mid_push)
        CHECK_MSG(landing_seen > 0, "every push had ended before push_test: the receivers were "
                  "not slow enough for the test to mean anything");
    else
        usleep(1000000);   /* the coordinator: let the others hear why the group ended */
    wsync_sender_free(s);
    wsync_mem_free(ctx, data[0]);
    for (int p = 1; p < NPARAMS; p++)
        free(data[p]);
    wsync_ctx_free(ctx);
    return check_failures ? 1 : 0;
}

/* ---- the inference workers -------------------------------------------------------------------- */

static void slow(void *arg, uint64_t version, uint64_t done, uint64_t total)
{
    (void)arg;
    (void)version;
    (void)done;
    (void)total;
    usleep(SLOW_US);
}

static void slow_then_die(void *arg, uint64_t version, uint64_t done, uint64_t total)
{
    if (version == 2 && done > total / 3)
        raise(SIGKILL);   /* with part of version 2 landed */
    slow(arg, version, done, total);
}

/* One host target per param, the whole param in one piece, into a fresh buf[p] (every byte 0xAB
 * when `poison`, so bytes never written show); want[p], as large, is for the expected bytes. */
static void add_whole_targets(wsync_receiver_t *rv, uint8_t **buf, uint8_t **want, int poison)
{
    for (int p = 0; p < NPARAMS; p++) {
        wsync_piece_t piece = {to_param(p), {{0}, {params[p].rows, params[p].cols}}, {0}};
        wsync_target_t t = {params[p].name, params[p].dtype, 2, {params[p].rows, params[p].cols},
                            NULL, WSYNC_MEM_HOST, 0, &piece, 1, {0}};
        buf[p] = malloc(param_bytes(p));
        want[p] = malloc(param_bytes(p));
        if (poison)
            memset(buf[p], 0xAB, param_bytes(p));
        t.data = buf[p];
        CHECK_OK(wsync_receiver_add_target(rv, &t));
    }
}

static int receiver_main(void *arg)
{
    const group_t *g = arg;
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *rv = NULL;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    uint8_t *buf[NPARAMS], *want[NPARAMS];
    wsync_status_t st;
    int failed = 0;

    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    rp.coordinator = coord_addr;
    rp.rank = g->rank;
    rp.nreceivers = g->nreceivers;
    rp.timeout_ms = TIMEOUT_MS;
    rp.heartbeat_ms = 200;
    rp.progress = g->kill_receiver == g->rank ? slow_then_die : slow;
    st = wsync_receiver_create(ctx, &rp, &rv);
    CHECK_OK(st);
    if (st != WSYNC_OK)
        return 1;
    add_whole_targets(rv, buf, want, 1);
    for (uint64_t v = 1; v <= VERSIONS; v++) {
        uint64_t got = 0;
        st = wsync_receiver_wait(rv, TIMEOUT_MS * 2, &got);
        if (g->free_mid_push && v == 2) {
            /* the sender (and the coordinator with it) left during version 2 */
            CHECK_MSG(st == WSYNC_ERR_PEER_LOST || st == WSYNC_ERR_ABORTED,
                      "receiver %d: wait returned %s: %s", g->rank, wsync_status_name(st),
                      wsync_last_error());
            CHECK(wsync_receiver_version(rv) == 1);
            failed = 1;
            break;
        }
        if (g->kill_receiver >= 0 && st != WSYNC_OK) {
            /* version 2, or (when this receiver committed 2 before the other died) 3 */
            CHECK_MSG(st == WSYNC_ERR_PEER_LOST || st == WSYNC_ERR_ABORTED,
                      "receiver %d: wait returned %s: %s", g->rank, wsync_status_name(st),
                      wsync_last_error());
            CHECK_ERR_HAS("receiver 1");
            CHECK(v >= 2);
            failed = 1;
            break;
        }
        CHECK_OK(st);
        if (st != WSYNC_OK)
            break;
        CHECK(got == v);
        for (int p = 0; p < NPARAMS; p++) {
            fill(want[p], param_bytes(p), p, v);
            size_t bad = 0;
            for (size_t i = 0; i < param_bytes(p); i++)
                bad += buf[p][i] != want[p][i];
            CHECK_MSG(bad == 0, "receiver %d, version %llu: %zu bytes of %s differ from the "
                      "version's (version %llu's bytes leaked in?)", g->rank,
                      (unsigned long long)v, bad, params[p].name, (unsigned long long)v + 1);
        }
    }
    if (g->kill_receiver >= 0 || g->free_mid_push)
        CHECK_MSG(failed, "receiver %d: every version arrived though receiver 1 died", g->rank);
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    for (int p = 0; p < NPARAMS; p++) {
        free(buf[p]);
        free(want[p]);
    }
    return check_failures ? 1 : 0;
}

static void run_group(const group_t *g)
{
    pid_t pids[8];
    group_t cfg[8];
    int codes[8], n = 0;

    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%d", proc_free_port());
    cfg[n] = *g;
    pids[n] = proc_spawn(sender_main, &cfg[n], 60);
    n++;
    for (int r = 0; r < g->nreceivers; r++) {
        cfg[n] = *g;
        cfg[n].rank = r;
        pids[n] = proc_spawn(receiver_main, &cfg[n], 60);
        n++;
    }
    proc_wait_all(pids, n, 60000, codes);
    for (int i = 0; i < n; i++) {
        if (g->kill_receiver >= 0 && i == 1 + g->kill_receiver)
            CHECK_MSG(codes[i] == 128 + SIGKILL, "receiver %d exited with %d", i - 1, codes[i]);
        else
            CHECK_MSG(codes[i] == 0, "process %d exited with %d", i, codes[i]);
    }
}

/* ---- the store scheme, in place, with copy_shards ------------------------------------------- */

/* Readers read what the sender registered, after its push returned: with copy_shards that is
 * wsync's copy, which only the next push_begin changes, so the trainer's writes right after
 * push_begin never reach a reader. Without the copy they would: the test can tell. */
static const char *store_transport;
static int store_pipe[2];   /* receiver -> sender: one byte per version fetched */

static int store_sender_main(void *arg)
{
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    uint8_t *data[NPARAMS];
    wsync_status_t st;

    (void)arg;
    setenv("WSYNC_STORE_TRANSPORT", store_transport, 1);
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    sp.coordinator = coord_addr;
    sp.rank = 0;
    sp.nranks = 1;
    sp.nreceivers = 1;
    sp.scheme = "store";
    sp.snapshot = 0;
    sp.copy_shards = 1;
    sp.timeout_ms = TIMEOUT_MS;
    sp.heartbeat_ms = 200;
    st = wsync_sender_create(ctx, &sp, &s);
    CHECK_OK(st);
    if (st != WSYNC_OK)
        return 1;
    for (int p = 0; p < NPARAMS; p++) {
        data[p] = malloc(param_bytes(p));
        fill(data[p], param_bytes(p), p, 1);
        wsync_shard_t sh = {to_param(p), {{0}, {params[p].rows, params[p].cols}}, data[p],
                            WSYNC_MEM_HOST, 0};
        CHECK_OK(wsync_sender_add_shard(s, &sh));
    }
    for (uint64_t v = 1; v <= VERSIONS && check_failures == 0; v++) {
        uint64_t got = 0;
        CHECK_OK(wsync_sender_push_begin(s, v));
        for (int p = 0; p < NPARAMS; p++)
            fill(data[p], param_bytes(p), p, v + 1);
        CHECK_OK(wsync_sender_push_wait(s, -1, &got));
        CHECK(got == v);
        /* the reader fetches v before the next push_begin refreshes the copy */
        struct pollfd pfd = {store_pipe[0], POLLIN, 0};
        char c;
        CHECK_MSG(poll(&pfd, 1, TIMEOUT_MS * 2) == 1 && read(store_pipe[0], &c, 1) == 1,
                  "the reader did not fetch version %llu", (unsigned long long)v);
    }
    wsync_sender_free(s);
    for (int p = 0; p < NPARAMS; p++)
        free(data[p]);
    wsync_ctx_free(ctx);
    return check_failures ? 1 : 0;
}

static int store_receiver_main(void *arg)
{
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *rv = NULL;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    uint8_t *buf[NPARAMS], *want[NPARAMS];
    wsync_status_t st;

    (void)arg;
    setenv("WSYNC_STORE_TRANSPORT", store_transport, 1);
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    rp.coordinator = coord_addr;
    rp.rank = 0;
    rp.nreceivers = 1;
    rp.timeout_ms = TIMEOUT_MS;
    rp.heartbeat_ms = 200;
    st = wsync_receiver_create(ctx, &rp, &rv);
    CHECK_OK(st);
    if (st != WSYNC_OK)
        return 1;
    add_whole_targets(rv, buf, want, 0);
    for (uint64_t v = 1; v <= VERSIONS; v++) {
        uint64_t got = 0;
        st = wsync_receiver_fetch(rv, v, TIMEOUT_MS * 2, &got);
        CHECK_OK(st);
        if (st != WSYNC_OK)
            break;
        CHECK(got == v);
        for (int p = 0; p < NPARAMS; p++) {
            fill(want[p], param_bytes(p), p, v);
            CHECK_MSG(memcmp(buf[p], want[p], param_bytes(p)) == 0, "store reader, version %llu: "
                      "%s differs from the version's bytes", (unsigned long long)v,
                      params[p].name);
        }
        if (write(store_pipe[1], "f", 1) != 1)
            CHECK(0);
    }
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    for (int p = 0; p < NPARAMS; p++) {
        free(buf[p]);
        free(want[p]);
    }
    return check_failures ? 1 : 0;
}

static void case_store_in_place_with_copy(void)
{
    pid_t pids[2];
    int codes[2];

    store_transport = test_have_transport("ucx") ? "ucx" : test_have_transport("ofi") ? "ofi" : NULL;
    if (store_transport == NULL) {
        fprintf(stderr, "skipped: no RMA transport (ucx, ofi) for the store scheme\n");
        return;
    }
    if (pipe(store_pipe) != 0) {
        CHECK(0);
        return;
    }
    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%d", proc_free_port());
    pids[0] = proc_spawn(store_sender_main, NULL, 60);
    pids[1] = proc_spawn(store_receiver_main, NULL, 60);
    proc_wait_all(pids, 2, 60000, codes);
    close(store_pipe[0]);
    close(store_pipe[1]);
    for (int i = 0; i < 2; i++)
        CHECK_MSG(codes[i] == 0, "process %d exited with %d", i, codes[i]);
}

static void case_copy_write_at_once(void)
{
    group_t g = {1, 2, 0, -1, 0};
    run_group(&g);
}

static void case_no_copy_write_after_wait(void)
{
    group_t g = {0, 2, 0, -1, 0};
    run_group(&g);
}

static void case_receiver_killed(void)
{
    group_t g = {1, 2, 0, 1, 0};
    run_group(&g);
}

static void case_sender_freed_mid_push(void)
{
    group_t g = {1, 2, 0, -1, 1};
    run_group(&g);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    RUN(case_copy_write_at_once);
    RUN(case_no_copy_write_after_wait);
    RUN(case_receiver_killed);
    RUN(case_sender_freed_mid_push);
    RUN(case_store_in_place_with_copy);
    return check_summary();
}
