/* A participant that stops reading its control connection must not stall the coordinator
 * (issue 19). Sender 0 (which hosts the coordinator) and three receivers, which describe
 * themselves before the sender, so that the sender's first push makes the coordinator send the
 * plans; receiver 0 is SIGSTOPped before that, and the coordinator's sockets are shrunk (as on a
 * congested link) so that its plan cannot fit in the socket buffers.
 * - store: versions go on; readers 1 and 2 fetch each one whole and fast (before, the
 *   coordinator's thread sat 5 s in the send to reader 0 while nobody was served), and the
 *   coordinator drops reader 0 at its send deadline with a reason naming it.
 * - ipc (every receiver takes every version): the group fails at the send deadline, and the
 *   sender and receivers 1 and 2 are told why, naming receiver 0. */
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/check.h"
#include "tests/support/proc.h"
#include "tests/support/transports.h"
#include "wsync/wsync.h"

#define NREADERS 3
#define NPARAMS 20000         /* enough params that a reader's plan outgrows the buffers */
#define TIMEOUT_MS 20000      /* the coordinator's send timeout is min(this, 5000) */
#define SEND_TIMEOUT_MS 5000
#define HEARTBEAT_MS 1000     /* silence deadline min(timeout / 2, 10 x this) = 10 s: later */

static char coord_addr[64];
static int coord_port;
static const char *transport;
static const char *scheme;
static char log_path[128];

typedef struct {
    long long fetch_ms[NREADERS][8];   /* each reader's fetch time per version */
    int got[NREADERS][8];
    char err[1 + NREADERS][512];       /* ipc: the failure each member saw (sender 0 first) */
} shared_t;

static shared_t *sh;

/* bf16 elements of param p: sizes that differ, as a model's do, so the plan does not shrink to
 * a repeating pattern; their offsets in one buffer */
static int plen(int p)
{
    return 16 + (p * 7919) % 240;
}

static size_t poff(int p)
{
    static size_t off[NPARAMS + 1];
    if (off[NPARAMS] == 0)
        for (int q = 0; q < NPARAMS; q++)
            off[q + 1] = off[q] + (size_t)plen(q);
    return off[p];
}

static uint16_t value(int p, uint64_t v, int i)
{
    uint64_t x = ((uint64_t)p << 40) ^ (v << 32) ^ (uint64_t)i;
    x = (x ^ (x >> 29)) * 0xbf58476d1ce4e5b9ull;
    return (uint16_t)(x >> 40);
}


static int sock_port(int fd, int peer)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if ((peer ? getpeername(fd, (struct sockaddr *)&ss, &sl)
              : getsockname(fd, (struct sockaddr *)&ss, &sl)) != 0 ||
        ss.ss_family != AF_INET)
        return -1;
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

/* Set buffer `opt` to `bytes` on this process's TCP sockets whose local (peer = 0) or remote
 * (peer = 1) port is the coordinator's; the number changed. */
static int shrink_sockets(int peer, int opt, int bytes)
{
    int n = 0;
    for (int fd = 3; fd < 1024; fd++)
        if (sock_port(fd, peer) == coord_port &&
            setsockopt(fd, SOL_SOCKET, opt, &bytes, sizeof(bytes)) == 0)
            n++;
    return n;
}

/* ---- sender 0 (the coordinator's process): 'g' shrink and publish v1, 'p' the next, 'q' -- */

static int sender_main(void *arg)
{
    proc_chan_t *ch = arg;
    wsync_ctx_t *ctx;
    wsync_sender_t *s;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    uint16_t *w = malloc(poff(NPARAMS) * 2);
    static char names[NPARAMS][16];
    uint64_t v = 0;
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

    /* the coordinator's log, for the parent to read */
    if (fd >= 0) {
        dup2(fd, 2);
        close(fd);
    }
    setenv("WSYNC_STORE_TRANSPORT", transport, 1);
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    sp.coordinator = coord_addr;
    sp.rank = 0;
    sp.nranks = 1;
    sp.nreceivers = NREADERS;
    sp.scheme = scheme;
    sp.timeout_ms = TIMEOUT_MS;
    sp.heartbeat_ms = HEARTBEAT_MS;
    if (wsync_sender_create(ctx, &sp, &s) != WSYNC_OK) {
        fprintf(stderr, "sender: %s\n", wsync_last_error());
        return 1;
    }
    for (int p = 0; p < NPARAMS; p++) {
        snprintf(names[p], sizeof(names[p]), "p.%d", p);
        wsync_shard_t sd = {{names[p], WSYNC_DTYPE_BF16, 1, {plen(p)}}, {{0}, {plen(p)}},
                            w + poff(p), WSYNC_MEM_HOST, 0};
        CHECK_OK(wsync_sender_add_shard(s, &sd));
    }
    proc_send_byte(ch->to_parent[1], 'c');
    for (;;) {
        int c = proc_recv_byte(ch->to_child[0], 60000);
        if (c != 'g' && c != 'p')
            break;
        if (c == 'g') {
            /* a congested link: the coordinator's sockets hold a few KB, not megabytes */
            int n = shrink_sockets(0, SO_SNDBUF, 4096);
            CHECK_MSG(n >= 1 + NREADERS, "shrank %d coordinator sockets", n);
        }
        v++;
        for (int p = 0; p < NPARAMS; p++)
            for (int i = 0; i < plen(p); i++)
                w[poff(p) + (size_t)i] = value(p, v, i);
        wsync_status_t st = wsync_sender_push(s, v);
        if (st != WSYNC_OK) {
            fprintf(stderr, "sender: push %llu: %s\n", (unsigned long long)v, wsync_last_error());
            snprintf(sh->err[0], sizeof(sh->err[0]), "%s", wsync_last_error());
        }
        proc_send_byte(ch->to_parent[1], st == WSYNC_OK ? 'y' : 'n');
    }
    wsync_sender_free(s);
    wsync_ctx_free(ctx);
    free(w);
    return check_failures ? 1 : 0;
}

/* ---- a reader: 'f' fetches the newest version and checks every byte; reader 0 stops itself
 * once described ------------------------------------------------------------------------------ */

typedef struct {
    int rank;
    proc_chan_t *ch;
} reader_arg_t;

static int reader_main(void *arg)
{
    reader_arg_t *a = arg;
    wsync_ctx_t *ctx;
    wsync_receiver_t *rv;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    uint16_t *t = malloc(poff(NPARAMS) * 2);
    static char names[NPARAMS][16];
    uint64_t got = 0;

    setenv("WSYNC_STORE_TRANSPORT", transport, 1);
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    rp.coordinator = coord_addr;
    rp.rank = a->rank;
    rp.nreceivers = NREADERS;
    rp.timeout_ms = TIMEOUT_MS;
    rp.heartbeat_ms = HEARTBEAT_MS;
    if (wsync_receiver_create(ctx, &rp, &rv) != WSYNC_OK) {
        fprintf(stderr, "reader %d: %s\n", a->rank, wsync_last_error());
        return 1;
    }
    for (int p = 0; p < NPARAMS; p++) {
        snprintf(names[p], sizeof(names[p]), "p.%d", p);
        wsync_piece_t pc = {{names[p], WSYNC_DTYPE_BF16, 1, {plen(p)}}, {{0}, {plen(p)}}, {0}};
        wsync_target_t tg = {names[p], WSYNC_DTYPE_BF16, 1, {plen(p)}, t + poff(p),
                             WSYNC_MEM_HOST, 0, &pc, 1, {0}};
        CHECK_OK(wsync_receiver_add_target(rv, &tg));
    }
    /* describe; no sender has yet, so no plan comes: a timeout, which leaves it described */
    if (strcmp(scheme, "store") == 0)
        CHECK_ST(wsync_receiver_fetch(rv, 0, 200, &got), WSYNC_ERR_TIMEOUT);
    else
        CHECK_ST(wsync_receiver_wait(rv, 200, &got), WSYNC_ERR_TIMEOUT);
    if (a->rank == 0) {
        /* a stopped process: its buffers hold what the kernel took, then nothing more */
        shrink_sockets(1, SO_RCVBUF, 4096);
        proc_send_byte(a->ch->to_parent[1], 'd');
        raise(SIGSTOP);
        return 0;   /* never: the parent kills it */
    }
    proc_send_byte(a->ch->to_parent[1], 'd');
    for (;;) {
        int c = proc_recv_byte(a->ch->to_child[0], 60000);
        if (c == 'w') {   /* ipc: wait for a version; the group's failure is expected */
            wsync_status_t st = wsync_receiver_wait(rv, TIMEOUT_MS, &got);
            if (st != WSYNC_OK)
                snprintf(sh->err[1 + a->rank], sizeof(sh->err[0]), "%s", wsync_last_error());
            proc_send_byte(a->ch->to_parent[1], st == WSYNC_OK ? 'y' : 'n');
            continue;
        }
        if (c != 'f')
            break;
        long long t0 = proc_now_ms();
        wsync_status_t st = wsync_receiver_fetch(rv, 0, TIMEOUT_MS, &got);
        long long took = proc_now_ms() - t0;
        int ok = st == WSYNC_OK && got >= 1 && got < 8;
        for (int p = 0; ok && p < NPARAMS; p++)
            for (int i = 0; ok && i < plen(p); i++)
                ok = t[poff(p) + (size_t)i] == value(p, got, i);
        if (st != WSYNC_OK)
            fprintf(stderr, "reader %d: fetch: %s\n", a->rank, wsync_last_error());
        if (got < 8) {
            sh->fetch_ms[a->rank][got] = took;
            sh->got[a->rank][got] = ok;
        }
        proc_send_byte(a->ch->to_parent[1], ok ? (char)got : (char)200);
    }
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    free(t);
    return check_failures ? 1 : 0;
}

static void read_log(char *buf, size_t len)
{
    FILE *f = fopen(log_path, "r");
    size_t n = f != NULL ? fread(buf, 1, len - 1, f) : 0;
    buf[n] = '\0';
    if (f != NULL)
        fclose(f);
}

static void finish(proc_chan_t *sc, proc_chan_t *rc, pid_t *pids, const char *log)
{
    int codes[1 + NREADERS];

    kill(pids[1], SIGKILL);
    for (int r = 1; r < NREADERS; r++)
        proc_send_byte(rc[r].to_child[1], 'q');
    proc_send_byte(sc->to_child[1], 'q');
    proc_wait_all(pids, 1 + NREADERS, 60000, codes);
    CHECK_MSG(codes[0] == 0, "sender 0 exited with %d", codes[0]);
    CHECK_MSG(codes[1] == 128 + SIGKILL, "reader 0 exited with %d", codes[1]);
    for (int r = 1; r < NREADERS; r++)
        CHECK_MSG(codes[1 + r] == 0, "reader %d exited with %d", r, codes[1 + r]);
    if (check_failures)
        fprintf(stderr, "sender 0's log:\n%s\n", log);
    unlink(log_path);
}

/* ipc: the plan goes to everyone; receiver 0's waits. The group fails at the send deadline, and
 * every member is told why, naming receiver 0. */
static void group_fails(proc_chan_t *sc, proc_chan_t *rc, pid_t *pids, long long t_go)
{
    static char log[1 << 16];
    char want[128];

    for (int r = 1; r < NREADERS; r++)
        proc_send_byte(rc[r].to_child[1], 'w');
    CHECK_MSG(proc_recv_byte(sc->to_parent[0], 30000) == 'n', "version 1 was pushed without receiver 0");
    long long fail_ms = proc_now_ms() - t_go;
    for (int r = 1; r < NREADERS; r++)
        CHECK_MSG(proc_recv_byte(rc[r].to_parent[0], 30000) == 'n', "receiver %d got a version", r);
    long long all_ms = proc_now_ms() - t_go;
    snprintf(want, sizeof(want), "lost receiver 0 (pid %d on ", (int)pids[1]);
    for (int i = 0; i < 1 + NREADERS; i++) {
        if (i == 1)
            continue;   /* receiver 0 is stopped */
        CHECK_MSG(strstr(sh->err[i], want) != NULL &&
                  strstr(sh->err[i], ") stopped reading its control connection: ") != NULL &&
                  strstr(sh->err[i], "(deadline 5000 ms)") != NULL,
                  "%s %d was told: %s", i == 0 ? "sender" : "receiver", i == 0 ? 0 : i - 1,
                  sh->err[i]);
    }
    CHECK_MSG(fail_ms >= SEND_TIMEOUT_MS && all_ms < SEND_TIMEOUT_MS + 3000,
              "the push failed after %lld ms, everyone knew after %lld ms", fail_ms, all_ms);
    fprintf(stderr, "the group failed %lld ms after the push began (all told after %lld ms): "
            "%s\n", fail_ms, all_ms, sh->err[0]);
    read_log(log, sizeof(log));
    finish(sc, rc, pids, log);
}

static void stopped_reader(void)
{
    proc_chan_t sc, rc[NREADERS];
    reader_arg_t ra[NREADERS];
    pid_t pids[1 + NREADERS];
    int status;
    static char log[1 << 16];

    coord_port = proc_free_port();
    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%d", coord_port);
    snprintf(log_path, sizeof(log_path), "/tmp/wsync_slow_peer_%d.log", (int)getpid());
    memset(sh, 0, sizeof(*sh));
    proc_chan_open(&sc);
    pids[0] = proc_spawn(sender_main, &sc, 120);
    CHECK(proc_recv_byte(sc.to_parent[0], 30000) == 'c');
    for (int r = 0; r < NREADERS; r++) {
        proc_chan_open(&rc[r]);
        ra[r] = (reader_arg_t){r, &rc[r]};
        pids[1 + r] = proc_spawn(reader_main, &ra[r], 120);
    }
    for (int r = 0; r < NREADERS; r++)
        CHECK_MSG(proc_recv_byte(rc[r].to_parent[0], 30000) == 'd', "reader %d did not describe", r);
    CHECK(waitpid(pids[1], &status, WUNTRACED) == pids[1] && WIFSTOPPED(status));

    /* the sender describes: plans go to every reader, reader 0's into a full socket */
    long long t_go = proc_now_ms();
    proc_send_byte(sc.to_child[1], 'g');
    if (strcmp(scheme, "ipc") == 0) {
        group_fails(&sc, rc, pids, t_go);
        return;
    }
    CHECK_MSG(proc_recv_byte(sc.to_parent[0], 30000) == 'y', "version 1 was not published");
    long long v1_ms = 0;
    for (int v = 1; v <= 3; v++) {
        if (v > 1) {
            proc_send_byte(sc.to_child[1], 'p');
            CHECK_MSG(proc_recv_byte(sc.to_parent[0], 30000) == 'y', "version %d not published", v);
        }
        for (int r = 1; r < NREADERS; r++)
            proc_send_byte(rc[r].to_child[1], 'f');
        for (int r = 1; r < NREADERS; r++) {
            int g = proc_recv_byte(rc[r].to_parent[0], 30000);
            CHECK_MSG(g == v, "reader %d, version %d: got %d", r, v, g);
            /* served as if nobody were stuck: before, the coordinator's thread sat 5 s in the
             * send to reader 0, and the readers' first fetch waited for it (a fetch takes
             * 0.1-0.5 s here, reading 20,000 params; the bound leaves room for a loaded host) */
            CHECK_MSG(g != v || sh->fetch_ms[r][v] < 2000, "reader %d fetched version %d in %lld ms",
                      r, v, sh->fetch_ms[r][v]);
        }
        if (v == 1)
            v1_ms = proc_now_ms() - t_go;
    }
    long long served_ms = proc_now_ms() - t_go, slowest = 0;
    for (int r = 1; r < NREADERS; r++)
        for (int v = 1; v <= 3; v++)
            slowest = sh->fetch_ms[r][v] > slowest ? sh->fetch_ms[r][v] : slowest;
    CHECK_MSG(v1_ms < SEND_TIMEOUT_MS - 1000, "version 1 reached readers 1 and 2 %lld ms after the "
              "sender's push began, with reader 0 stopped", v1_ms);

    /* reader 0 is dropped at the send deadline, named, with what was waiting for it */
    char want[128];
    snprintf(want, sizeof(want), "receiver 0 (pid %d on ", (int)pids[1]);
    const char *hit = NULL;
    for (int i = 0; i < 150 && hit == NULL; i++) {
        usleep(100000);
        read_log(log, sizeof(log));
        hit = strstr(log, "stopped reading its control connection: ");
    }
    long long drop_ms = proc_now_ms() - t_go;
    CHECK_MSG(hit != NULL, "reader 0 was not dropped as stuck: sender 0's log:\n%s", log);
    if (hit != NULL) {
        const char *line = hit;
        while (line > log && line[-1] != '\n')
            line--;
        CHECK_MSG(strstr(line, want) != NULL && strstr(line, "(deadline 5000 ms)") != NULL,
                  "log line: %.300s", line);
        const char *q = strstr(hit, " queued for ");
        long long ms = q != NULL ? atoll(q + strlen(" queued for ")) : -1;
        CHECK_MSG(ms >= SEND_TIMEOUT_MS && ms < SEND_TIMEOUT_MS + 2000, "queued for %lld ms", ms);
        CHECK_MSG(drop_ms < SEND_TIMEOUT_MS + 3000, "dropped %lld ms after the plan", drop_ms);
        fprintf(stderr, "readers 1 and 2 had version 1 %lld ms after the push began, 1-3 after "
                "%lld ms (slowest fetch %lld ms); reader 0 dropped after %lld ms: %.*s\n", v1_ms,
                served_ms, slowest, drop_ms,
                (int)strcspn(line, "\n"), line);
    }
    /* the store serves on */
    proc_send_byte(sc.to_child[1], 'p');
    CHECK_MSG(proc_recv_byte(sc.to_parent[0], 30000) == 'y', "version 4 not published");
    for (int r = 1; r < NREADERS; r++) {
        proc_send_byte(rc[r].to_child[1], 'f');
        CHECK_MSG(proc_recv_byte(rc[r].to_parent[0], 30000) == 4, "reader %d: version 4", r);
    }

    read_log(log, sizeof(log));
    finish(&sc, rc, pids, log);
}

static void case_store(void)
{
    const char *ts[] = {"ucx", "ofi"};
    for (int i = 0; i < 2; i++) {
        if (!test_have_transport(ts[i]))
            continue;
        transport = ts[i];
        scheme = "store";
        fprintf(stderr, "-- transport %s\n", transport);
        stopped_reader();
        return;
    }
    fprintf(stderr, "skipped: no RMA transport (ucx, ofi) in this build\n");
}

static void case_ipc(void)
{
    transport = "ucx";   /* unused by ipc */
    scheme = "ipc";
    stopped_reader();
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        return 1;
    RUN(case_store);
    RUN(case_ipc);
    return check_summary();
}
