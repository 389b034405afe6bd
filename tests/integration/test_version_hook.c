/* The receiver's per-version hook (wsync_receiver_params_t.on_version), on host memory through
 * the ipc scheme, across processes: it runs once per version with that version's number, sees
 * the new bytes already in the targets, and runs before the receiver commits, so the sender's
 * push returns only after it finished (checked through a marker in shared memory that the hook
 * writes after sleeping); a hook that fails fails the version on its receiver (ABORTED, naming
 * the hook's return value), the sender's push names that receiver, and the last committed
 * version stays the one before; a version that fails on a receiver before it is whole (a fault
 * at the commit point) never reaches that receiver's hook. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/support/check.h"
#include "tests/support/proc.h"
#include "wsync/wsync.h"

#define ROWS 64
#define COLS 256
#define NRECEIVERS 2
#define VERSIONS 3
#define HOOK_SLEEP_MS 300
#define TIMEOUT_MS 20000

static char coord_addr[64];

/* What the hooks write and the sender reads: one page shared by every child. */
typedef struct {
    volatile uint64_t done[NRECEIVERS];   /* the last version whose hook finished, per receiver */
    volatile int reader_done;             /* store: the reader has fetched all it will */
} shared_t;

typedef struct {
    shared_t *sh;
    int rank;
    int fail_rank;             /* this receiver's hook returns 7 on fail_version (0: never) */
    int fail_version;
    int store;                 /* the store scheme (over UCX), one reader fetching */
    int commit_fault;          /* fail_rank fails fail_version at the commit point instead
                                * (WSYNC_FAULT commit:fail), before its hook could run */
} group_t;

/* Element i of the param in version v, as bf16 bits (any bits do; differ per version). */
static uint16_t value(uint64_t v, size_t i)
{
    uint64_t x = (v << 40) ^ i;
    x = (x ^ (x >> 31)) * 0x9e3779b97f4a7c15ull;
    return (uint16_t)(x >> 48);
}

static int sender_main(void *arg)
{
    const group_t *g = arg;
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    uint16_t *w = malloc(ROWS * COLS * 2);
    wsync_status_t st = WSYNC_OK;

    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    sp.coordinator = coord_addr;
    sp.rank = 0;
    sp.nranks = 1;
    sp.nreceivers = NRECEIVERS;
    sp.scheme = g->store ? "store" : "ipc";
    if (g->store) {
        sp.nreceivers = 1;
        sp.snapshot = 1;
        sp.keep_versions = 4;
    }
    sp.timeout_ms = TIMEOUT_MS;
    sp.heartbeat_ms = 200;
    CHECK_OK(wsync_sender_create(ctx, &sp, &s));
    if (s == NULL)
        return 1;
    wsync_shard_t sh = {{"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}}, {{0, 0}, {ROWS, COLS}}, w,
                        WSYNC_MEM_HOST, 0};
    CHECK_OK(wsync_sender_add_shard(s, &sh));
    for (uint64_t v = 1; v <= VERSIONS; v++) {
        for (size_t i = 0; i < ROWS * COLS; i++)
            w[i] = value(v, i);
        long long t0 = proc_now_ms();
        st = wsync_sender_push(s, v);
        if (g->store) {
            CHECK_OK(st);   /* published: the readers fetch (and run their hooks) later */
            continue;
        }
        if (g->fail_version != 0 && v == (uint64_t)g->fail_version) {
            /* the receiver's own failure: its hook's (ABORTED) or the commit point's (IO) */
            CHECK_MSG(st == (g->commit_fault ? WSYNC_ERR_IO : WSYNC_ERR_ABORTED),
                      "push %llu returned %s: %s", (unsigned long long)v, wsync_status_name(st),
                      wsync_last_error());
            CHECK_ERR_HAS("receiver 1");
            CHECK_ERR_HAS(g->commit_fault ? "commit" : "returned 7");
            break;
        }
        CHECK_OK(st);
        if (st != WSYNC_OK)
            break;
        /* every receiver's hook finished before push returned */
        for (int r = 0; r < NRECEIVERS; r++)
            CHECK_MSG(g->sh->done[r] == v, "push of version %llu returned after %lld ms, "
                      "receiver %d's hook had finished version %llu", (unsigned long long)v,
                      proc_now_ms() - t0, r, (unsigned long long)g->sh->done[r]);
        CHECK_MSG(proc_now_ms() - t0 >= HOOK_SLEEP_MS, "push took %lld ms, less than the hook "
                  "sleeps", proc_now_ms() - t0);
    }
    if (g->store) {
        /* the store serves from this process: stay until the reader is done */
        long long t0 = proc_now_ms();
        while (!g->sh->reader_done && proc_now_ms() - t0 < TIMEOUT_MS)
            usleep(10000);
    } else if (g->fail_version != 0) {
        CHECK_MSG(st != WSYNC_OK, "every push succeeded; receiver 1's hook failed version %d",
                  g->fail_version);
        usleep(1500000);   /* the coordinator stays while the receivers hear the verdict */
    }
    wsync_sender_free(s);
    wsync_ctx_free(ctx);
    free(w);
    return check_failures ? 1 : 0;
}

typedef struct {
    const group_t *g;
    const uint16_t *target;
    uint64_t calls;            /* hook calls so far */
    uint64_t last;             /* version of the last call */
} hook_t;

static int on_version(void *arg, uint64_t version)
{
    hook_t *h = arg;
    size_t wrong = 0;

    h->calls++;
    h->last = version;
    /* the new version is whole in the target before the hook runs */
    for (size_t i = 0; i < ROWS * COLS; i++)
        wrong += h->target[i] != value(version, i);
    CHECK_MSG(wrong == 0, "receiver %d's hook for version %llu: %zu elements not yet the new "
              "version's", h->g->rank, (unsigned long long)version, wrong);
    if (h->g->rank == h->g->fail_rank && version == (uint64_t)h->g->fail_version &&
        !h->g->commit_fault)
        return 7;
    usleep(HOOK_SLEEP_MS * 1000);
    h->g->sh->done[h->g->rank] = version;
    return 0;
}

/* store: fetch version 1 (the hook runs before fetch returns), then version 2, whose hook
 * fails: the fetch fails, the targets are torn, version 1 stays the last landed. */
static void store_reader(const group_t *g, wsync_receiver_t *rv, hook_t *hook)
{
    uint64_t got = 0;
    wsync_status_t st;

    CHECK_OK(wsync_receiver_fetch(rv, 1, TIMEOUT_MS, &got));
    CHECK(got == 1);
    CHECK_MSG(hook->calls == 1 && hook->last == 1 && g->sh->done[0] == 1, "after fetching "
              "version 1: the hook ran %llu times, last for %llu, finished %llu",
              (unsigned long long)hook->calls, (unsigned long long)hook->last,
              (unsigned long long)g->sh->done[0]);
    CHECK(!wsync_receiver_torn(rv));
    st = wsync_receiver_fetch(rv, 2, TIMEOUT_MS, &got);
    CHECK_MSG(st == WSYNC_ERR_ABORTED, "fetch of version 2 returned %s: %s",
              wsync_status_name(st), wsync_last_error());
    CHECK_ERR_HAS("returned 7");
    CHECK_ERR_HAS("version 2");
    CHECK(hook->calls == 2 && hook->last == 2);
    CHECK(wsync_receiver_version(rv) == 1);
    CHECK(wsync_receiver_torn(rv));
}

static int receiver_main(void *arg)
{
    const group_t *g = arg;
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *rv = NULL;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    uint16_t *buf = malloc(ROWS * COLS * 2);
    hook_t hook = {g, buf, 0, 0};
    wsync_status_t st = WSYNC_OK;
    uint64_t v;

    memset(buf, 0xAB, ROWS * COLS * 2);
    if (g->commit_fault && g->rank == g->fail_rank) {
        char fault[64];
        snprintf(fault, sizeof(fault), "commit:fail@%d", g->fail_version);
        setenv("WSYNC_FAULT", fault, 1);   /* this child only */
    }
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    rp.coordinator = coord_addr;
    rp.rank = g->rank;
    rp.nreceivers = g->store ? 1 : NRECEIVERS;
    rp.timeout_ms = TIMEOUT_MS;
    rp.heartbeat_ms = 200;
    rp.on_version = on_version;
    rp.on_version_arg = &hook;
    CHECK_OK(wsync_receiver_create(ctx, &rp, &rv));
    if (rv == NULL)
        return 1;
    wsync_piece_t piece = {{"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}}, {{0, 0}, {ROWS, COLS}}, {0}};
    wsync_target_t t = {"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}, buf, WSYNC_MEM_HOST, 0, &piece, 1,
                        {0}};
    CHECK_OK(wsync_receiver_add_target(rv, &t));
    if (g->store) {
        store_reader(g, rv, &hook);
        g->sh->reader_done = 1;
        wsync_receiver_free(rv);
        wsync_ctx_free(ctx);
        free(buf);
        return check_failures ? 1 : 0;
    }
    for (v = 1; v <= VERSIONS; v++) {
        uint64_t got = 0;
        st = wsync_receiver_wait(rv, TIMEOUT_MS, &got);
        if (st != WSYNC_OK)
            break;
        CHECK_MSG(got == v, "receiver %d got version %llu, expected %llu", g->rank,
                  (unsigned long long)got, (unsigned long long)v);
        CHECK_MSG(hook.calls == v && hook.last == v, "receiver %d after version %llu: the hook "
                  "ran %llu times, last for version %llu", g->rank, (unsigned long long)v,
                  (unsigned long long)hook.calls, (unsigned long long)hook.last);
        CHECK_MSG(g->sh->done[g->rank] == v, "receiver %d: wait returned version %llu before "
                  "the hook finished it", g->rank, (unsigned long long)v);
        CHECK(!wsync_receiver_torn(rv));
    }
    if (g->fail_version == 0) {
        CHECK_OK(st);
    } else if (g->rank == g->fail_rank && g->commit_fault) {
        /* the version failed before it was whole: its hook never ran for it */
        CHECK_MSG(st == WSYNC_ERR_IO && v == (uint64_t)g->fail_version,
                  "receiver 1: wait of version %llu returned %s: %s", (unsigned long long)v,
                  wsync_status_name(st), wsync_last_error());
        CHECK_ERR_HAS("commit");
        CHECK_MSG(hook.calls == (uint64_t)g->fail_version - 1 &&
                      hook.last == (uint64_t)g->fail_version - 1,
                  "receiver 1: the hook ran %llu times, last for version %llu, though version "
                  "%d failed", (unsigned long long)hook.calls, (unsigned long long)hook.last,
                  g->fail_version);
        CHECK(wsync_receiver_version(rv) == (uint64_t)g->fail_version - 1);
        CHECK(wsync_receiver_torn(rv));
    } else if (g->rank == g->fail_rank) {
        /* its own hook failed the version */
        CHECK_MSG(st == WSYNC_ERR_ABORTED && v == (uint64_t)g->fail_version,
                  "receiver 1: wait of version %llu returned %s: %s", (unsigned long long)v,
                  wsync_status_name(st), wsync_last_error());
        CHECK_ERR_HAS("returned 7");
        CHECK_ERR_HAS("version 2");
        CHECK(wsync_receiver_version(rv) == (uint64_t)g->fail_version - 1);
        CHECK(wsync_receiver_torn(rv));
        CHECK(hook.calls == (uint64_t)g->fail_version);
    } else {
        /* the other receiver hears the group failed, whenever it next waits */
        CHECK_MSG(st != WSYNC_OK, "receiver 0 got every version though receiver 1 failed");
        CHECK_ERR_HAS("receiver 1");
        CHECK(wsync_receiver_version(rv) <= (uint64_t)g->fail_version);
    }
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    free(buf);
    return check_failures ? 1 : 0;
}

static void run_group(int fail_rank, int fail_version, int store, int commit_fault)
{
    const int nrecv = store ? 1 : NRECEIVERS;
    shared_t *sh = mmap(NULL, sizeof(shared_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                        -1, 0);
    group_t cfg[1 + NRECEIVERS];
    pid_t pids[1 + NRECEIVERS];
    int codes[1 + NRECEIVERS];

    CHECK(sh != MAP_FAILED);
    if (sh == MAP_FAILED)
        return;
    memset(sh, 0, sizeof(*sh));
    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%d", proc_free_port());
    for (int i = 0; i <= nrecv; i++) {
        cfg[i] = (group_t){sh, i - 1, fail_rank, fail_version, store, commit_fault};
        pids[i] = proc_spawn(i == 0 ? sender_main : receiver_main, &cfg[i], 60);
    }
    proc_wait_all(pids, 1 + nrecv, 60000, codes);
    for (int i = 0; i <= nrecv; i++)
        CHECK_MSG(codes[i] == 0, "%s exited with %d", i == 0 ? "the sender" : "a receiver",
                  codes[i]);
    munmap(sh, sizeof(*sh));
}

static void case_hook_before_commit(void)
{
    run_group(-1, 0, 0, 0);
}

static void case_hook_fails_version_2(void)
{
    run_group(1, 2, 0, 0);
}

/* A version that fails on a receiver before it is whole (the commit point, a fault): the hook
 * never runs for it. */
static void case_failed_version_skips_hook(void)
{
#if defined(WSYNC_FAULTS) && WSYNC_FAULTS
    run_group(1, 2, 0, 1);
#else
    fprintf(stderr, "skipped: this build has no fault injection (WSYNC_FAULTS=ON)\n");
#endif
}

/* The store scheme (over UCX when this build has it): the hook runs inside fetch. */
static void case_store_hook(void)
{
    wsync_ctx_t *ctx;
    int have = 0;

    if (wsync_ctx_create(NULL, &ctx) != WSYNC_OK)
        return;
    for (int i = 0; i < wsync_transport_count(ctx); i++) {
        wsync_component_info_t info;
        if (wsync_transport_info(ctx, i, &info) == WSYNC_OK && strcmp(info.name, "ucx") == 0)
            have = info.compiled && info.available;
    }
    wsync_ctx_free(ctx);
    if (!have) {
        fprintf(stderr, "skipped: no ucx transport in this build\n");
        return;
    }
    setenv("WSYNC_STORE_TRANSPORT", "ucx", 1);   /* inherited by the children */
    run_group(0, 2, 1, 0);
    unsetenv("WSYNC_STORE_TRANSPORT");
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    RUN(case_hook_before_commit);
    RUN(case_hook_fails_version_2);
    RUN(case_failed_version_skips_hook);
    RUN(case_store_hook);
    return check_summary();
}
