/* The coordinator on one simulated host, the participants on others (issue 19.2): network
 * namespaces on one bridge; sender 0, which runs the coordinator, alone in the first.
 * - sender 0 holds nothing (a coordinating rank); sender 1 and both receivers share the second
 *   namespace: the only pairs that carry bytes are local there, so ipc serves them, every
 *   control message crossing to the coordinator and back;
 * - sender 0 holds half the rows, sender 1 the rest in the second namespace, receivers in the
 *   third and fourth: auto picks the store and every byte crosses;
 * - the coordinator's host drops off the network mid-group (its device set down): the others
 *   fail within their deadline, naming the lost coordinator, rather than hang.
 * Every element is checked against values each receiver computes. Needs root and iproute2;
 * otherwise it says why and exits 77 (skipped). */
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/check.h"
#include "tests/support/netns.h"
#include "tests/support/proc.h"
#include "wsync/wsync.h"

#define ROWS 256
#define COLS 1024
#define TIMEOUT_MS 20000
#define LOST_TIMEOUT_MS 4000

typedef struct {
    const char *name;
    int sender_host[2], receiver_host[2];
    int sender0_rows;                /* rows sender 0 holds (the first ones); sender 1 the rest */
    int versions;
    const char *expect_scheme;
    const char *needle;              /* in the explanation */
    int cut_after;                   /* > 0: the coordinator's host goes off after this version */
} case_t;

static netns_lan_t lan;
static const case_t *cur;
static char coord[64];
static int linger[2], pushed[2], go[2];   /* pushed: children -> parent, go: parent -> senders */

/* One byte from fd within ms milliseconds (a child that died never writes it). */
static int read_within(int fd, char *c, int ms)
{
    struct pollfd p = {fd, POLLIN, 0};

    return poll(&p, 1, ms) == 1 && read(fd, c, 1) == 1;
}

static uint16_t value(uint64_t v, size_t i)
{
    uint64_t x = (v << 44) ^ (i * 0xd6e8feb86659fd93ull);
    x = (x ^ (x >> 32)) * 0x9e3779b97f4a7c15ull;
    return (uint16_t)(x >> 45);
}

static int sender_main(void *p)
{
    int rank = (int)(intptr_t)p;
    size_t row0 = rank == 0 ? 0 : (size_t)cur->sender0_rows;
    size_t rows = rank == 0 ? (size_t)cur->sender0_rows : ROWS - row0, n = rows * COLS;
    uint16_t *w = malloc(n * 2 + 2);
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    wsync_ctx_t *ctx;
    wsync_sender_t *s;
    wsync_status_t st;

    if (netns_enter(&lan, cur->sender_host[rank]) != 0 || w == NULL)
        return 1;
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    sp.coordinator = coord;
    sp.rank = rank;
    sp.nranks = 2;
    sp.nreceivers = 2;
    sp.timeout_ms = cur->cut_after ? LOST_TIMEOUT_MS : TIMEOUT_MS;
    sp.heartbeat_ms = 100;
    st = wsync_sender_create(ctx, &sp, &s);
    CHECK_OK(st);
    if (st != WSYNC_OK)
        return 1;
    if (rows > 0) {
        wsync_shard_t shard = {{"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}},
                               {{(int64_t)row0, 0}, {(int64_t)rows, COLS}}, w, WSYNC_MEM_HOST, 0};
        CHECK_OK(wsync_sender_add_shard(s, &shard));
    }
    for (uint64_t v = 1; v <= (uint64_t)cur->versions; v++) {
        for (size_t i = 0; i < n; i++)
            w[i] = value(v, row0 * COLS + i);
        st = wsync_sender_push(s, v);
        if (cur->cut_after && v > (uint64_t)cur->cut_after) {
            /* the coordinator's host is gone: sender 1 says so; sender 0 lost everyone */
            CHECK_MSG(st != WSYNC_OK, "sender %d: version %llu pushed with the coordinator's "
                                      "host off the network", rank, (unsigned long long)v);
            if (rank == 1)
                CHECK_MSG(strstr(wsync_last_error(), "coordinator") != NULL,
                          "sender 1: %s: %s", wsync_status_name(st), wsync_last_error());
            fprintf(stderr, "  sender %d: %s: %s\n", rank, wsync_status_name(st),
                    wsync_last_error());
            break;
        }
        CHECK_OK(st);
        if (st != WSYNC_OK)
            break;
        if (v == 1) {
            const char *explain = wsync_sender_explain(s);
            CHECK_MSG(strcmp(wsync_sender_scheme(s), cur->expect_scheme) == 0 &&
                          strstr(explain, cur->needle) != NULL,
                      "sender %d: scheme %s, %s and \"%s\" expected:\n%s", rank,
                      wsync_sender_scheme(s), cur->expect_scheme, cur->needle, explain);
        }
        if (cur->cut_after && v == (uint64_t)cur->cut_after) {
            /* everyone has the version; the next push starts once the cut is made */
            char c;
            CHECK_MSG(write(pushed[1], "s", 1) == 1 && read(go[0], &c, 1) == 1,
                      "sender %d: no word with the parent", rank);
        }
    }
    char c;
    if (read(linger[0], &c, 1) != 1)
        fprintf(stderr, "sender %d: no word from the parent\n", rank);
    wsync_sender_free(s);
    wsync_ctx_free(ctx);
    free(w);
    return check_failures ? 1 : 0;
}

static int receiver_main(void *p)
{
    int rank = (int)(intptr_t)p;
    size_t cols = COLS / 2, col0 = cols * (size_t)rank, n = (size_t)ROWS * cols;
    uint16_t *w = calloc(n, 2);
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    wsync_ctx_t *ctx;
    wsync_receiver_t *rv;
    wsync_status_t st;
    uint64_t got = 0;

    if (netns_enter(&lan, cur->receiver_host[rank]) != 0 || w == NULL)
        return 1;
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    rp.coordinator = coord;
    rp.rank = rank;
    rp.nreceivers = 2;
    rp.timeout_ms = cur->cut_after ? LOST_TIMEOUT_MS : TIMEOUT_MS;
    rp.heartbeat_ms = 100;
    st = wsync_receiver_create(ctx, &rp, &rv);
    CHECK_OK(st);
    if (st != WSYNC_OK)
        return 1;
    /* tensor-parallel columns: rank r takes columns [r COLS/2, (r + 1) COLS/2) */
    wsync_piece_t piece = {{"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}},
                           {{0, (int64_t)col0}, {ROWS, (int64_t)cols}}, {0}};
    wsync_target_t t = {"w", WSYNC_DTYPE_BF16, 2, {ROWS, (int64_t)cols}, w, WSYNC_MEM_HOST, 0,
                        &piece, 1, {0}};
    CHECK_OK(wsync_receiver_add_target(rv, &t));
    while (got < (uint64_t)cur->versions) {
        long long t0 = proc_now_ms();
        int after_cut = cur->cut_after && got >= (uint64_t)cur->cut_after;
        st = wsync_receiver_wait(rv, rp.timeout_ms, &got);
        if (after_cut) {
            long long took = proc_now_ms() - t0;
            CHECK_MSG(st != WSYNC_OK && strstr(wsync_last_error(), "coordinator") != NULL,
                      "receiver %d after the cut: %s: %s", rank, wsync_status_name(st),
                      wsync_last_error());
            CHECK_MSG(took <= LOST_TIMEOUT_MS + 2000, "receiver %d learnt the loss in %lld ms",
                      rank, took);
            fprintf(stderr, "  receiver %d, %lld ms after its wait began: %s: %s\n", rank, took,
                    wsync_status_name(st), wsync_last_error());
            break;
        }
        CHECK_OK(st);
        if (st != WSYNC_OK)
            break;
        size_t bad = 0;
        for (size_t i = 0; i < ROWS; i++)
            for (size_t j = 0; j < cols; j++)
                bad += w[i * cols + j] != value(got, i * COLS + col0 + j);
        CHECK_MSG(bad == 0, "receiver %d version %llu: %zu of %zu elements differ", rank,
                  (unsigned long long)got, bad, n);
        if (cur->cut_after && got == (uint64_t)cur->cut_after && write(pushed[1], "r", 1) != 1)
            CHECK_MSG(0, "receiver %d: could not tell the parent", rank);
    }
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    free(w);
    return check_failures ? 1 : 0;
}

static void run(const case_t *c)
{
    pid_t pids[4];
    int codes[4];
    char ch;

    cur = c;
    snprintf(coord, sizeof(coord), "%s:%d", lan.addr[c->sender_host[0]],
             20000 + (int)(getpid() % 20000));
    CHECK(pipe(linger) == 0 && pipe(pushed) == 0 && pipe(go) == 0);
    for (int i = 0; i < 2; i++)
        pids[i] = proc_spawn(sender_main, (void *)(intptr_t)i, 60);
    for (int i = 0; i < 2; i++)
        pids[2 + i] = proc_spawn(receiver_main, (void *)(intptr_t)i, 60);
    if (c->cut_after) {
        char cmd[128];
        for (int i = 0; i < 4; i++)
            CHECK_MSG(read_within(pushed[0], &ch, 30000), "a participant never finished version %d",
                      c->cut_after);
        snprintf(cmd, sizeof(cmd), "ip -n %s link set %s down", lan.ns[c->sender_host[0]],
                 NETNS_DEV);
        CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
        for (int i = 0; i < 2; i++)
            CHECK(write(go[1], "g", 1) == 1);
    }
    proc_wait_all(pids + 2, 2, 40000, codes + 2);
    for (int i = 0; i < 2; i++)
        if (write(linger[1], "x", 1) != 1)
            break;
    proc_wait_all(pids, 2, 20000, codes);
    close(linger[0]);
    close(linger[1]);
    close(pushed[0]);
    close(pushed[1]);
    close(go[0]);
    close(go[1]);
    for (int i = 0; i < 4; i++)
        CHECK_MSG(codes[i] == 0, "%s: %s %d (in %s) exited with %d", c->name,
                  i < 2 ? "sender" : "receiver", i % 2,
                  lan.ns[i < 2 ? c->sender_host[i] : c->receiver_host[i - 2]], codes[i]);
}

/* UCX or libfabric built in and usable, asked in a child (the parent stays free of threads). */
static int have_store(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        wsync_ctx_t *ctx;
        int yes = 0;
        if (wsync_ctx_create(NULL, &ctx) == WSYNC_OK) {
            for (int i = 0; i < wsync_transport_count(ctx); i++) {
                wsync_component_info_t info;
                if (wsync_transport_info(ctx, i, &info) == WSYNC_OK &&
                    (strcmp(info.name, "ucx") == 0 || strcmp(info.name, "ofi") == 0))
                    yes |= info.compiled && info.available;
            }
            wsync_ctx_free(ctx);
        }
        _exit(yes ? 0 : 1);
    }
    int code = -1;
    proc_wait_all(&pid, 1, 20000, &code);
    return code == 0;
}

static void case_remote_coordinator_ipc(void)
{
    static const case_t c = {"remote coordinator, ipc", {0, 1}, {1, 1}, 0, 3, "ipc",
                             "ipc: chosen: each of the 2 sender -> receiver pairs that carry "
                             "bytes shares a host and network namespace", 0};
    run(&c);
}

static void case_everyone_apart_store(void)
{
    static const case_t c = {"everyone apart, store", {0, 1}, {2, 3}, ROWS / 2, 3, "store",
                             "participants on 1 host in 4 network namespaces", 0};
    if (!have_store()) {
        fprintf(stderr, "  skipped: no store transport (UCX or libfabric) in this build\n");
        return;
    }
    run(&c);
}

static void case_coordinator_host_lost(void)
{
    static const case_t c = {"coordinator's host lost", {0, 1}, {1, 1}, 0, 3, "ipc",
                             "ipc: chosen", 1};
    run(&c);
}

int main(void)
{
    const char *why = netns_unavailable();

    signal(SIGPIPE, SIG_IGN);
    if (why != NULL) {
        fprintf(stderr, "skipped: %s (this test runs as uid %d)\n", why, (int)geteuid());
        return NETNS_SKIP;
    }
    if (netns_lan_up(&lan, 4, "C") != 0) {
        fprintf(stderr, "skipped: could not create network namespaces here\n");
        return NETNS_SKIP;
    }
    RUN(case_remote_coordinator_ipc);
    RUN(case_everyone_apart_store);
    RUN(case_coordinator_host_lost);
    netns_lan_down(&lan);
    return check_summary();
}
