/* ipc and the hosts it can serve (issue 19.1-2), with network namespaces on one bridge as hosts:
 * - ipc asked for explicitly, with a receiver in another namespace: every participant's setup
 *   fails with WSYNC_ERR_UNSUPPORTED, and the text names the pair and the network namespace;
 * - the choice left to wsync (auto), same group, host memory: the store is chosen, and the
 *   explanation says why ipc was refused; every byte arrives;
 * - two "hosts", each with a sender and the receiver that reads only from it (the coordinator in
 *   the first): ipc serves the group, since no pair that carries bytes crosses a namespace.
 * Needs root and iproute2; otherwise it says why and exits 77 (skipped). */
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
#define VERSIONS 2
#define TIMEOUT_MS 20000
#define MAXN 4

typedef struct {
    const char *name;
    const char *scheme;              /* the senders' choice */
    int nsenders, nreceivers;
    int sender_host[MAXN], receiver_host[MAXN];
    int own_rows;                    /* receiver r takes sender r's rows only, else the whole param */
    const char *expect_scheme;       /* NULL: the group is refused */
    const char *needles[4];          /* in the explanation, or in every participant's error */
} case_t;

static netns_lan_t lan;
static const case_t *cur;
static char coord[64];
static int linger[2];

/* The value of element i (row-major over the whole param) in version v: a hash, so that a
 * misplaced or stale element shows. */
static uint16_t value(uint64_t v, size_t i)
{
    uint64_t x = (v << 40) ^ (i * 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
    return (uint16_t)(x >> 47);
}

static void check_needles(const char *who, const char *text)
{
    for (int k = 0; k < 4 && cur->needles[k] != NULL; k++)
        CHECK_MSG(strstr(text, cur->needles[k]) != NULL, "%s: \"%s\" lacks \"%s\"", who, text,
                  cur->needles[k]);
}

static int sender_main(void *p)
{
    int rank = (int)(intptr_t)p;
    size_t rows = ROWS / (size_t)cur->nsenders, n = rows * COLS;
    uint16_t *w = malloc(n * 2);
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    wsync_ctx_t *ctx;
    wsync_sender_t *s;
    wsync_status_t st;
    char who[32];

    snprintf(who, sizeof(who), "sender %d", rank);
    if (netns_enter(&lan, cur->sender_host[rank]) != 0 || w == NULL)
        return 1;
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    sp.coordinator = coord;
    sp.rank = rank;
    sp.nranks = cur->nsenders;
    sp.nreceivers = cur->nreceivers;
    sp.scheme = cur->scheme;
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
        if (cur->expect_scheme == NULL) {
            /* refused at setup: the first push is where the group is known */
            CHECK_MSG(st == WSYNC_ERR_UNSUPPORTED, "%s: push returned %s: %s", who,
                      wsync_status_name(st), wsync_last_error());
            check_needles(who, wsync_last_error());
            break;
        }
        CHECK_OK(st);
        if (st != WSYNC_OK)
            break;
        if (v == 1) {
            const char *explain = wsync_sender_explain(s);
            CHECK_MSG(strcmp(wsync_sender_scheme(s), cur->expect_scheme) == 0,
                      "%s: scheme %s chosen, %s expected:\n%s", who, wsync_sender_scheme(s),
                      cur->expect_scheme, explain);
            check_needles(who, explain);
            if (rank == 0)
                fprintf(stderr, "  %s: the group's explanation:\n%s", cur->name, explain);
        }
    }
    /* a store publisher stays until its readers are done */
    char c;
    if (read(linger[0], &c, 1) != 1)
        fprintf(stderr, "%s: no word from the parent\n", who);
    wsync_sender_free(s);
    wsync_ctx_free(ctx);
    free(w);
    return check_failures ? 1 : 0;
}

static int receiver_main(void *p)
{
    int rank = (int)(intptr_t)p;
    size_t rows = cur->own_rows ? ROWS / (size_t)cur->nsenders : ROWS;
    size_t row0 = cur->own_rows ? rows * (size_t)rank : 0, n = rows * COLS;
    uint16_t *w = calloc(n, 2);
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    wsync_ctx_t *ctx;
    wsync_receiver_t *rv;
    wsync_status_t st;
    uint64_t got = 0;
    char who[32];

    snprintf(who, sizeof(who), "receiver %d", rank);
    if (netns_enter(&lan, cur->receiver_host[rank]) != 0 || w == NULL)
        return 1;
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    rp.coordinator = coord;
    rp.rank = rank;
    rp.nreceivers = cur->nreceivers;
    rp.timeout_ms = TIMEOUT_MS;
    rp.heartbeat_ms = 200;
    st = wsync_receiver_create(ctx, &rp, &rv);
    CHECK_OK(st);
    if (st != WSYNC_OK)
        return 1;
    wsync_piece_t piece = {{"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}},
                           {{(int64_t)row0, 0}, {(int64_t)rows, COLS}}, {0}};
    wsync_target_t t = {"w", WSYNC_DTYPE_BF16, 2, {(int64_t)rows, COLS}, w, WSYNC_MEM_HOST, 0,
                        &piece, 1, {0}};
    CHECK_OK(wsync_receiver_add_target(rv, &t));
    while (got < VERSIONS) {
        st = wsync_receiver_wait(rv, TIMEOUT_MS, &got);
        if (cur->expect_scheme == NULL) {
            CHECK_MSG(st == WSYNC_ERR_UNSUPPORTED, "%s: wait returned %s: %s", who,
                      wsync_status_name(st), wsync_last_error());
            check_needles(who, wsync_last_error());
            break;
        }
        CHECK_OK(st);
        if (st != WSYNC_OK)
            break;
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += w[i] != value(got, row0 * COLS + i);
        CHECK_MSG(bad == 0, "%s version %llu: %zu of %zu elements differ", who,
                  (unsigned long long)got, bad, n);
    }
    if (cur->expect_scheme != NULL)
        CHECK(wsync_receiver_scheme(rv) != NULL &&
              strcmp(wsync_receiver_scheme(rv), cur->expect_scheme) == 0);
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    free(w);
    return check_failures ? 1 : 0;
}

static void run(const case_t *c)
{
    pid_t pids[2 * MAXN];
    int codes[2 * MAXN], ns = c->nsenders, nr = c->nreceivers;

    cur = c;
    snprintf(coord, sizeof(coord), "%s:%d", lan.addr[c->sender_host[0]],
             20000 + (int)(getpid() % 20000));
    CHECK(pipe(linger) == 0);
    for (int i = 0; i < ns; i++)
        pids[i] = proc_spawn(sender_main, (void *)(intptr_t)i, 60);
    for (int i = 0; i < nr; i++)
        pids[ns + i] = proc_spawn(receiver_main, (void *)(intptr_t)i, 60);
    proc_wait_all(pids + ns, nr, 50000, codes + ns);
    for (int i = 0; i < ns; i++)
        if (write(linger[1], "x", 1) != 1)
            break;
    proc_wait_all(pids, ns, 20000, codes);
    close(linger[0]);
    close(linger[1]);
    for (int i = 0; i < ns + nr; i++)
        CHECK_MSG(codes[i] == 0, "%s: %s %d (in %s) exited with %d", c->name,
                  i < ns ? "sender" : "receiver", i < ns ? i : i - ns,
                  lan.ns[i < ns ? c->sender_host[i] : c->receiver_host[i - ns]], codes[i]);
}

/* UCX or libfabric built in and usable: what the store needs. */
static int have_store(void)
{
    /* in a child: the parent forks the participants and must hold no wsync threads */
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

static void case_ipc_asked_across_namespaces(void)
{
    static const case_t c = {
        "ipc asked for", "ipc", 1, 2, {0}, {0, 1}, 0, NULL,
        {"scheme 'ipc' was asked for but cannot serve this group",
         "receiver 1 is on host", "but in another network namespace (net:[",
         "(sender 0 -> receiver 1)"}};
    run(&c);
}

static void case_auto_across_namespaces_picks_store(void)
{
    static const case_t c = {
        "auto", "auto", 1, 2, {0}, {0, 1}, 0, "store",
        {"ipc: refused: receiver 1 is on host", "another network namespace",
         "store: chosen: one-sided reads", "participants on 1 host in 2 network namespaces"}};
    if (!have_store()) {
        fprintf(stderr, "  skipped: no store transport (UCX or libfabric) in this build\n");
        return;
    }
    run(&c);
}

static void case_ipc_serves_pairs_within_namespaces(void)
{
    static const case_t c = {
        "pairs within namespaces", "auto", 2, 2, {0, 1}, {0, 1}, 1, "ipc",
        {"ipc: chosen: each of the 2 sender -> receiver pairs that carry bytes shares a host and "
         "network namespace (1 host, 2 namespaces in all)"}};
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
    if (netns_lan_up(&lan, 2, "I") != 0) {
        fprintf(stderr, "skipped: could not create network namespaces here\n");
        return NETNS_SKIP;
    }
    RUN(case_ipc_asked_across_namespaces);
    RUN(case_auto_across_namespaces_picks_store);
    RUN(case_ipc_serves_pairs_within_namespaces);
    netns_lan_down(&lan);
    return check_summary();
}
