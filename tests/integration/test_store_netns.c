/* The store across a real network stack: senders in one network namespace, readers in another,
 * joined only by veth pairs to a bridge, so every byte crosses TCP/IP between two "hosts" (not
 * loopback, not shared memory). The scheme is left to negotiation, which must refuse ipc (another network
 * namespace) and pick the store. Needs root and iproute2 (CI has both); otherwise it says why and
 * exits 77 (skipped). The namespaces (tests/support/netns.c) are this test's own and are removed
 * at the end. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "tests/support/check.h"
#include "tests/support/netns.h"
#include "tests/support/proc.h"
#include "wsync/wsync.h"

#define NSENDERS 2
#define NRECEIVERS 2
#define ROWS 512
#define COLS 2048
#define VERSIONS 3
#define TIMEOUT_MS 20000

static netns_lan_t lan;   /* host 0: the senders, host 1: the readers */
static char coord_addr[64];
static const char *transport;

static uint16_t value(uint64_t v, size_t i)
{
    uint64_t x = (v << 40) ^ i;
    x = (x ^ (x >> 29)) * 0xbf58476d1ce4e5b9ull;
    return (uint16_t)(x >> 48);
}

/* Enter a namespace (tests/support/netns.c steers UCX and libfabric to its device, not its
 * loopback) with the transport under test. */
static int enter(int host)
{
    if (netns_enter(&lan, host) != 0)
        return -1;
    setenv("WSYNC_STORE_TRANSPORT", transport, 1);
    setenv("UCX_TLS", "tcp", 1);
    setenv("FI_PROVIDER", "tcp;ofi_rxm", 1);
    return 0;
}

typedef struct {
    int rank;
    int linger_fd;
} arg_t;

static int sender_main(void *p)
{
    arg_t *a = p;
    wsync_ctx_t *ctx;
    wsync_sender_t *s;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    size_t n = (size_t)ROWS / NSENDERS * COLS;
    uint16_t *w = malloc(n * 2);
    wsync_status_t st;

    if (enter(0) != 0)
        return 1;
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    sp.coordinator = coord_addr;
    sp.rank = a->rank;
    sp.nranks = NSENDERS;
    sp.nreceivers = NRECEIVERS;
    sp.timeout_ms = TIMEOUT_MS;
    sp.heartbeat_ms = 200;
    st = wsync_sender_create(ctx, &sp, &s);
    CHECK_OK(st);
    if (st != WSYNC_OK)
        return 1;
    wsync_shard_t shard = {{"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}},
                           {{a->rank * ROWS / NSENDERS, 0}, {ROWS / NSENDERS, COLS}}, w,
                           WSYNC_MEM_HOST, 0};
    CHECK_OK(wsync_sender_add_shard(s, &shard));
    for (uint64_t v = 1; v <= VERSIONS; v++) {
        for (size_t i = 0; i < n; i++)
            w[i] = value(v, (size_t)a->rank * n + i);
        st = wsync_sender_push(s, v);
        CHECK_OK(st);
        if (st != WSYNC_OK)
            break;
        if (v == 1 && a->rank == 0) {
            const char *explain = wsync_sender_explain(s);
            CHECK_MSG(strcmp(wsync_sender_scheme(s), "store") == 0, "scheme %s chosen:\n%s",
                      wsync_sender_scheme(s), explain);
            CHECK_MSG(strstr(explain, "ipc: refused") != NULL && strstr(explain, "namespace"),
                      "ipc was not refused for the other namespace:\n%s", explain);
        }
    }
    /* the store's publisher stays until the readers are done */
    char c;
    if (read(a->linger_fd, &c, 1) != 1)
        fprintf(stderr, "sender %d: no word from the parent\n", a->rank);
    wsync_sender_free(s);
    wsync_ctx_free(ctx);
    free(w);
    return check_failures ? 1 : 0;
}

static int receiver_main(void *p)
{
    arg_t *a = p;
    wsync_ctx_t *ctx;
    wsync_receiver_t *rv;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    uint16_t *w = calloc((size_t)ROWS * COLS, 2);
    uint64_t got = 0;
    wsync_status_t st;

    if (enter(1) != 0)
        return 1;
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    rp.coordinator = coord_addr;
    rp.rank = a->rank;
    rp.nreceivers = NRECEIVERS;
    rp.timeout_ms = TIMEOUT_MS;
    rp.heartbeat_ms = 200;
    st = wsync_receiver_create(ctx, &rp, &rv);
    CHECK_OK(st);
    if (st != WSYNC_OK)
        return 1;
    wsync_piece_t piece = {{"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}}, {{0, 0}, {ROWS, COLS}}, {0}};
    wsync_target_t t = {"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}, w, WSYNC_MEM_HOST, 0, &piece, 1, {0}};
    CHECK_OK(wsync_receiver_add_target(rv, &t));
    /* take the newest until the last version; each one must be whole */
    while (got < VERSIONS) {
        st = wsync_receiver_wait(rv, TIMEOUT_MS, &got);
        CHECK_OK(st);
        if (st != WSYNC_OK)
            break;
        size_t bad = 0;
        for (size_t i = 0; i < (size_t)ROWS * COLS; i++)
            bad += w[i] != value(got, i);
        CHECK_MSG(bad == 0, "receiver %d version %llu: %zu elements differ", a->rank,
                  (unsigned long long)got, bad);
    }
    CHECK(strcmp(wsync_receiver_scheme(rv), "store") == 0);
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    free(w);
    return check_failures ? 1 : 0;
}

static void run(const char *t)
{
    pid_t pids[NSENDERS + NRECEIVERS];
    arg_t args[NSENDERS + NRECEIVERS];
    int codes[NSENDERS + NRECEIVERS], linger[2];
    wsync_ctx_t *ctx;
    int have = 0;

    if (wsync_ctx_create(NULL, &ctx) == WSYNC_OK) {
        for (int i = 0; i < wsync_transport_count(ctx); i++) {
            wsync_component_info_t info;
            if (wsync_transport_info(ctx, i, &info) == WSYNC_OK && strcmp(info.name, t) == 0)
                have = info.compiled && info.available;
        }
        wsync_ctx_free(ctx);
    }
    if (!have) {
        fprintf(stderr, "skipped: transport %s is not available in this build\n", t);
        return;
    }
    transport = t;
    snprintf(coord_addr, sizeof(coord_addr), "%s:%d", lan.addr[0], 20000 + (int)(getpid() % 20000));
    CHECK(pipe(linger) == 0);
    for (int i = 0; i < NSENDERS; i++) {
        args[i] = (arg_t){i, linger[0]};
        pids[i] = proc_spawn(sender_main, &args[i], 120);
    }
    for (int i = 0; i < NRECEIVERS; i++) {
        args[NSENDERS + i] = (arg_t){i, -1};
        pids[NSENDERS + i] = proc_spawn(receiver_main, &args[NSENDERS + i], 120);
    }
    proc_wait_all(pids + NSENDERS, NRECEIVERS, 100000, codes + NSENDERS);
    for (int i = 0; i < NSENDERS; i++)
        if (write(linger[1], "x", 1) != 1)
            break;
    proc_wait_all(pids, NSENDERS, 30000, codes);
    close(linger[0]);
    close(linger[1]);
    for (int i = 0; i < NSENDERS + NRECEIVERS; i++)
        CHECK_MSG(codes[i] == 0, "%s %d (in %s) exited with %d", i < NSENDERS ? "sender" : "receiver",
                  i < NSENDERS ? i : i - NSENDERS, lan.ns[i < NSENDERS ? 0 : 1], codes[i]);
}

static void case_store_ucx_across_namespaces(void)
{
    run("ucx");
}

static void case_store_ofi_across_namespaces(void)
{
    run("ofi");
}

int main(void)
{
    const char *why = netns_unavailable();

    signal(SIGPIPE, SIG_IGN);
    if (why != NULL) {
        fprintf(stderr, "skipped: %s (this test runs as uid %d)\n", why, (int)geteuid());
        return NETNS_SKIP;
    }
    if (netns_lan_up(&lan, 2, "N") != 0) {
        fprintf(stderr, "skipped: could not create network namespaces here\n");
        return NETNS_SKIP;
    }
    RUN(case_store_ucx_across_namespaces);
    RUN(case_store_ofi_across_namespaces);
    netns_lan_down(&lan);
    return check_summary();
}
