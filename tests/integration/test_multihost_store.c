/* The store across three simulated hosts (issue 19.2): network namespaces on one bridge, the
 * two senders (and the coordinator) in the first, reader 0 in the second, reader 1 and a late
 * reader in the third, so every byte and control message crosses TCP/IP between namespaces.
 * The senders publish five versions (three kept); readers 0 and 1 take them as they come, reader
 * 0 the whole param, reader 1 a column slice; the late reader joins only once all five are
 * published and the first readers are done: it fetches version 3 by number, is told version 1
 * was evicted (WSYNC_ERR_NOT_FOUND, naming what is kept), then takes the newest, 5. Every element
 * is checked against value(), computed by each reader on its own. Needs root and iproute2,
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

#define NSENDERS 2
#define NRECEIVERS 3                 /* the last one joins late */
#define ROWS 256
#define COLS 2048
#define VERSIONS 5
#define KEEP 3
#define TIMEOUT_MS 20000

static netns_lan_t lan;
static char coord[64];
static int linger[2], published[2];
/* the host (namespace index) of each reader */
static const int reader_host[NRECEIVERS] = {1, 2, 2};

/* One byte from fd within ms milliseconds (a child that died never writes it). */
static int read_within(int fd, char *c, int ms)
{
    struct pollfd p = {fd, POLLIN, 0};

    return poll(&p, 1, ms) == 1 && read(fd, c, 1) == 1;
}

static uint16_t value(uint64_t v, size_t i)
{
    uint64_t x = (v * 0x2545f4914f6cdd1dull) ^ (i * 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 33)) * 0xff51afd7ed558ccdull;
    return (uint16_t)(x >> 41);
}

static int sender_main(void *p)
{
    int rank = (int)(intptr_t)p;
    size_t rows = ROWS / NSENDERS, n = rows * COLS;
    uint16_t *w = malloc(n * 2);
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    wsync_ctx_t *ctx;
    wsync_sender_t *s;
    wsync_status_t st;

    if (netns_enter(&lan, 0) != 0 || w == NULL)
        return 1;
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    sp.coordinator = coord;
    sp.rank = rank;
    sp.nranks = NSENDERS;
    sp.nreceivers = NRECEIVERS;
    sp.scheme = "store";
    sp.keep_versions = KEEP;
    sp.timeout_ms = TIMEOUT_MS;
    sp.heartbeat_ms = 200;
    st = wsync_sender_create(ctx, &sp, &s);
    CHECK_OK(st);
    if (st != WSYNC_OK)
        return 1;
    wsync_shard_t shard = {{"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}},
                           {{(int64_t)rows * rank, 0}, {(int64_t)rows, COLS}}, w, WSYNC_MEM_HOST, 0};
    CHECK_OK(wsync_sender_add_shard(s, &shard));
    for (uint64_t v = 1; v <= VERSIONS; v++) {
        for (size_t i = 0; i < n; i++)
            w[i] = value(v, (size_t)rank * n + i);
        st = wsync_sender_push(s, v);
        CHECK_OK(st);
        if (st != WSYNC_OK)
            break;
    }
    if (rank == 0) {
        const char *explain = wsync_sender_explain(s);
        /* the store's readers come when they like: the choice was made for the senders alone */
        CHECK_MSG(strstr(explain, "store: chosen") && strstr(explain, "(the user's choice)"),
                  "explanation:\n%s", explain);
        if (write(published[1], "p", 1) != 1)
            CHECK_MSG(0, "could not tell the parent that every version is published");
    }
    char c;
    if (read(linger[0], &c, 1) != 1)
        fprintf(stderr, "sender %d: no word from the parent\n", rank);
    wsync_sender_free(s);
    wsync_ctx_free(ctx);
    free(w);
    return check_failures ? 1 : 0;
}

/* Reader r's target: reader 0 the whole param, the others columns [COLS/4, 3 COLS/4). */
static void reader_box(int r, size_t *col0, size_t *cols)
{
    *col0 = r == 0 ? 0 : COLS / 4;
    *cols = r == 0 ? COLS : COLS / 2;
}

static size_t count_bad(const uint16_t *w, int r, uint64_t v)
{
    size_t col0, cols, bad = 0;

    reader_box(r, &col0, &cols);
    for (size_t i = 0; i < ROWS; i++)
        for (size_t j = 0; j < cols; j++)
            bad += w[i * cols + j] != value(v, i * COLS + col0 + j);
    return bad;
}

static int receiver_main(void *p)
{
    int rank = (int)(intptr_t)p;
    size_t col0, cols;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    wsync_ctx_t *ctx;
    wsync_receiver_t *rv;
    wsync_status_t st;
    uint64_t got = 0;
    uint16_t *w;

    reader_box(rank, &col0, &cols);
    w = calloc((size_t)ROWS * cols, 2);
    if (netns_enter(&lan, reader_host[rank]) != 0 || w == NULL)
        return 1;
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    rp.coordinator = coord;
    rp.rank = rank;
    rp.nreceivers = NRECEIVERS;
    rp.timeout_ms = TIMEOUT_MS;
    rp.heartbeat_ms = 200;
    st = wsync_receiver_create(ctx, &rp, &rv);
    CHECK_OK(st);
    if (st != WSYNC_OK)
        return 1;
    wsync_piece_t piece = {{"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}},
                           {{0, (int64_t)col0}, {ROWS, (int64_t)cols}}, {0}};
    wsync_target_t t = {"w", WSYNC_DTYPE_BF16, 2, {ROWS, (int64_t)cols}, w, WSYNC_MEM_HOST, 0,
                        &piece, 1, {0}};
    CHECK_OK(wsync_receiver_add_target(rv, &t));
    if (rank < NRECEIVERS - 1) {
        /* the newest each time, until the last; each one whole */
        while (got < VERSIONS) {
            st = wsync_receiver_wait(rv, TIMEOUT_MS, &got);
            CHECK_OK(st);
            if (st != WSYNC_OK)
                break;
            size_t bad = count_bad(w, rank, got);
            CHECK_MSG(bad == 0, "reader %d version %llu: %zu elements differ", rank,
                      (unsigned long long)got, bad);
        }
    } else {
        /* late: versions 3..5 are kept, 1 and 2 are gone */
        st = wsync_receiver_fetch(rv, 3, TIMEOUT_MS, &got);
        CHECK_OK(st);
        CHECK_MSG(got == 3, "fetch(3) landed version %llu", (unsigned long long)got);
        size_t bad = count_bad(w, rank, 3);
        CHECK_MSG(bad == 0, "late reader version 3: %zu elements differ", bad);
        memset(w, 0, (size_t)ROWS * cols * 2);
        CHECK_ST(wsync_receiver_fetch(rv, 1, TIMEOUT_MS, &got), WSYNC_ERR_NOT_FOUND);
        CHECK_ERR_HAS("version 1");
        st = wsync_receiver_fetch(rv, 0, TIMEOUT_MS, &got);
        CHECK_OK(st);
        CHECK_MSG(got == VERSIONS, "fetch(0) landed version %llu", (unsigned long long)got);
        bad = count_bad(w, rank, VERSIONS);
        CHECK_MSG(bad == 0, "late reader version %d: %zu elements differ", VERSIONS, bad);
        CHECK(wsync_receiver_version(rv) == VERSIONS);
    }
    CHECK(wsync_receiver_scheme(rv) != NULL && strcmp(wsync_receiver_scheme(rv), "store") == 0);
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    free(w);
    return check_failures ? 1 : 0;
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

static void case_store_three_namespaces_late_reader(void)
{
    pid_t pids[NSENDERS + NRECEIVERS];
    int codes[NSENDERS + NRECEIVERS];
    int early = NRECEIVERS - 1;
    char c;

    snprintf(coord, sizeof(coord), "%s:%d", lan.addr[0], 20000 + (int)(getpid() % 20000));
    CHECK(pipe(linger) == 0 && pipe(published) == 0);
    for (int i = 0; i < NSENDERS; i++)
        pids[i] = proc_spawn(sender_main, (void *)(intptr_t)i, 60);
    for (int i = 0; i < early; i++)
        pids[NSENDERS + i] = proc_spawn(receiver_main, (void *)(intptr_t)i, 60);
    /* every version published, and the first readers done (their leases released) */
    CHECK_MSG(read_within(published[0], &c, 30000), "sender 0 never said it published");
    proc_wait_all(pids + NSENDERS, early, 40000, codes + NSENDERS);
    pids[NSENDERS + early] = proc_spawn(receiver_main, (void *)(intptr_t)early, 60);
    proc_wait_all(pids + NSENDERS + early, 1, 40000, codes + NSENDERS + early);
    for (int i = 0; i < NSENDERS; i++)
        if (write(linger[1], "x", 1) != 1)
            break;
    proc_wait_all(pids, NSENDERS, 20000, codes);
    for (int i = 0; i < NSENDERS + NRECEIVERS; i++)
        CHECK_MSG(codes[i] == 0, "%s %d (in %s) exited with %d",
                  i < NSENDERS ? "sender" : "reader", i < NSENDERS ? i : i - NSENDERS,
                  lan.ns[i < NSENDERS ? 0 : reader_host[i - NSENDERS]], codes[i]);
}

int main(void)
{
    const char *why = netns_unavailable();

    signal(SIGPIPE, SIG_IGN);
    if (why != NULL) {
        fprintf(stderr, "skipped: %s (this test runs as uid %d)\n", why, (int)geteuid());
        return NETNS_SKIP;
    }
    if (!have_store()) {
        fprintf(stderr, "skipped: no store transport (UCX or libfabric) in this build\n");
        return NETNS_SKIP;
    }
    if (netns_lan_up(&lan, 3, "S") != 0) {
        fprintf(stderr, "skipped: could not create network namespaces here\n");
        return NETNS_SKIP;
    }
    RUN(case_store_three_namespaces_late_reader);
    netns_lan_down(&lan);
    return check_summary();
}
