/* Hundreds of participants on one host (issue 19, part 3): one sender (rank 0, the coordinator)
 * and P - 1 receiver processes, host memory, the ipc scheme, a tiny synthetic model every
 * receiver wants whole. Each of VERSIONS versions must reach every receiver, byte for byte (the
 * receiver recomputes the weights itself), with every wait inside its deadline; nothing may
 * fail. The sender's process reports, per version, the coordinator's control time (see
 * docs/scale.md for the definition), its resident memory and its open file descriptors, as one
 * JSON line per participant count (tests/scale/report.sh turns them into docs/scale.md's table).
 *
 * P: WSYNC_SCALE_PARTICIPANTS, a count or a comma-separated list (default 256; docs/scale.md
 * uses 16,64,256,1024). The test asserts correctness and deadlines, never times. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "core/coord_stats.h"
#include "core/objects.h"
#include "core/util.h"
#include "tests/support/check.h"
#include "tests/support/proc.h"
#include "wsync/wsync.h"

#define NPARAMS 4
#define ROWS 32
#define COLS 64                      /* each param [32, 64] bf16: 4 KiB; 16 KiB per receiver */
#define VERSIONS 11
#define MAX_P 4096

typedef struct {
    int participants;                /* 1 sender + participants - 1 receivers */
    int rank;                        /* receiver rank (receiver children) */
    int timeout_ms;
    int heartbeat_ms;
    int result_fd;                   /* sender: where its JSON line goes */
} group_t;

static char coord_addr[64];

static const char *param_name(int p, char *buf, size_t len)
{
    snprintf(buf, len, "model.layers.%d.mlp.down_proj.weight", p);
    return buf;
}

/* Element i of param p in version v: the test's own definition of the weights (bf16 bits). */
static uint16_t weight(int p, uint64_t v, size_t i)
{
    uint64_t x = ((uint64_t)p << 40) ^ (v << 24) ^ i;
    x = (x ^ (x >> 31)) * 0x9e3779b97f4a7c15ull;
    return (uint16_t)(x >> 48);
}

static wsync_param_t to_param(int p, char *name, size_t len)
{
    wsync_param_t wp = {param_name(p, name, len), WSYNC_DTYPE_BF16, 2, {ROWS, COLS}};
    return wp;
}

/* Resident memory (bytes) and open descriptors of this process. */
static void self_usage(uint64_t *rss, int *fds)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, res = 0;
    DIR *d;

    if (f != NULL) {
        if (fscanf(f, "%llu %llu", &size, &res) != 2)
            res = 0;
        fclose(f);
    }
    *rss = res * (uint64_t)sysconf(_SC_PAGESIZE);
    *fds = 0;
    d = opendir("/proc/self/fd");
    if (d == NULL)
        return;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        *fds += e->d_name[0] != '.';
    closedir(d);
    (*fds)--;   /* the directory's own descriptor */
}

/* One core's memcpy of `bytes`, in bytes per second (median of 7), for the data-time estimate. */
static double memcpy_rate(size_t bytes)
{
    uint8_t *a = malloc(bytes), *b = malloc(bytes);
    double best[7];

    memset(a, 1, bytes);
    memset(b, 2, bytes);
    for (int k = 0; k < 7; k++) {
        uint64_t t0 = wsync_now_ns();
        for (int j = 0; j < 64; j++) {
            a[j] = (uint8_t)j;
            memcpy(b, a, bytes);
        }
        best[k] = 64.0 * (double)bytes / ((double)(wsync_now_ns() - t0) / 1e9);
    }
    free(a);
    free(b);
    for (int i = 1; i < 7; i++)
        for (int j = i; j > 0 && best[j] < best[j - 1]; j--) {
            double t = best[j];
            best[j] = best[j - 1];
            best[j - 1] = t;
        }
    return best[3];
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int sender_main(void *arg)
{
    const group_t *g = arg;
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    uint16_t *data[NPARAMS] = {0};
    char name[64], line[2048];
    double push_ms[VERSIONS], span_ms[VERSIONS], ctrl_ms[VERSIONS], bcast_ms[VERSIONS];
    uint64_t rss_max = 0, rss_setup = 0;
    int fds_max = 0, fds_setup = 0, done = 0;
    double rate = memcpy_rate((size_t)NPARAMS * ROWS * COLS * 2);
    uint64_t t_start = wsync_now_ns();
    double setup_s = 0;

    {
        /* start from the common soft limit of 1024 open files: past ~500 participants the
         * coordinator must raise it itself (core/coordinator.c) */
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur > 1024 &&
            rl.rlim_max >= (rlim_t)g->participants * 2 + 256) {
            rl.rlim_cur = 1024;
            CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
        }
    }
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    sp.coordinator = coord_addr;
    sp.rank = 0;
    sp.nranks = 1;
    sp.nreceivers = g->participants - 1;
    sp.timeout_ms = g->timeout_ms;
    sp.heartbeat_ms = g->heartbeat_ms;
    sp.scheme = "ipc";
    if (wsync_sender_create(ctx, &sp, &s) != WSYNC_OK) {
        CHECK_MSG(0, "sender: %s", wsync_last_error());
        wsync_ctx_free(ctx);
        return 1;
    }
    for (int p = 0; p < NPARAMS; p++) {
        wsync_shard_t sh = {to_param(p, name, sizeof(name)), {{0, 0}, {ROWS, COLS}}, NULL,
                            WSYNC_MEM_HOST, 0};
        /* shared memory, read in place by the receivers: the ipc scheme's fast path */
        CHECK_OK(wsync_mem_alloc(ctx, (size_t)ROWS * COLS * 2, (void **)&data[p]));
        sh.data = data[p];
        CHECK_OK(wsync_sender_add_shard(s, &sh));
    }
    for (int v = 1; v <= VERSIONS && check_failures == 0; v++) {
        for (int p = 0; p < NPARAMS; p++)
            for (size_t i = 0; i < (size_t)ROWS * COLS; i++)
                data[p][i] = weight(p, (uint64_t)v, i);
        uint64_t t0 = wsync_now_ns();
        wsync_status_t st = wsync_sender_push(s, (uint64_t)v);
        uint64_t t1 = wsync_now_ns();
        if (st != WSYNC_OK) {
            CHECK_MSG(0, "push of version %d: %s", v, wsync_last_error());
            break;
        }
        if (v == 1)   /* the first push also sets the group up (plan, data connections) */
            setup_s = (double)(t1 - t_start) / 1e9;
        CHECK_MSG((double)(t1 - t0) / 1e6 < g->timeout_ms, "push %d took %.0f ms", v,
                  (double)(t1 - t0) / 1e6);
        wsync_push_stats_t ps;
        wsync_coord_stats_t cs;
        CHECK_OK(wsync_sender_stats(s, &ps));
        wsync_coord_stats(s->coord, &cs);
        CHECK_MSG(cs.version == (uint64_t)v, "the coordinator's last version is %llu, not %d",
                  (unsigned long long)cs.version, v);
        CHECK_MSG(cs.participants == (uint32_t)g->participants, "%u participants connected, "
                  "%d expected", cs.participants, g->participants);
        /* data time: the bytes every receiver copied, at one core's memcpy speed */
        double data_ms = (double)ps.bytes_delivered / rate * 1e3;
        push_ms[done] = (double)(t1 - t0) / 1e6;
        span_ms[done] = (double)cs.span_ns / 1e6;
        ctrl_ms[done] = span_ms[done] - data_ms;
        bcast_ms[done] = (double)cs.bcast_ns / 1e6;
        done++;
        uint64_t rss;
        int fds;
        self_usage(&rss, &fds);
        if (v == 1) {
            rss_setup = rss;
            fds_setup = fds;
        }
        rss_max = rss > rss_max ? rss : rss_max;
        fds_max = fds > fds_max ? fds : fds_max;
    }
    if (done == VERSIONS) {
        /* medians over the versions after the first */
        qsort(push_ms + 1, VERSIONS - 1, sizeof(double), cmp_double);
        qsort(span_ms + 1, VERSIONS - 1, sizeof(double), cmp_double);
        qsort(ctrl_ms + 1, VERSIONS - 1, sizeof(double), cmp_double);
        qsort(bcast_ms + 1, VERSIONS - 1, sizeof(double), cmp_double);
        int mid = 1 + (VERSIONS - 1) / 2;
        int n = snprintf(line, sizeof(line),
                         "{\"participants\": %d, \"receivers\": %d, \"versions\": %d, "
                         "\"setup_s\": %.3f, \"push_ms\": %.3f, \"span_ms\": %.3f, "
                         "\"control_ms\": %.3f, \"bcast_ms\": %.3f, \"data_ms\": %.4f, "
                         "\"control_ms_per_receiver\": %.5f, \"rss_mib\": %.1f, "
                         "\"rss_setup_mib\": %.1f, \"fds\": %d, \"fds_setup\": %d}\n",
                         g->participants, g->participants - 1, VERSIONS, setup_s, push_ms[mid],
                         span_ms[mid], ctrl_ms[mid], bcast_ms[mid], span_ms[mid] - ctrl_ms[mid],
                         ctrl_ms[mid] / (g->participants - 1), (double)rss_max / 1048576.0,
                         (double)rss_setup / 1048576.0, fds_max, fds_setup);
        if (write(g->result_fd, line, (size_t)n) != n)
            CHECK_MSG(0, "cannot write the result line: %s", strerror(errno));
    }
    wsync_sender_free(s);
    for (int p = 0; p < NPARAMS; p++)
        wsync_mem_free(ctx, data[p]);
    wsync_ctx_free(ctx);
    return check_failures ? 1 : 0;
}

static int receiver_main(void *arg)
{
    const group_t *g = arg;
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *rv = NULL;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    static uint16_t buf[NPARAMS][ROWS * COLS];
    char names[NPARAMS][64], tnames[NPARAMS][32];
    wsync_piece_t pieces[NPARAMS];

    /* a receiver has no scheme param: WSYNC_SCHEME tells it to probe only ipc's transports
     * (not UCX and libfabric, 0.1-0.2 s of CPU each time, which hundreds of processes pay) */
    setenv("WSYNC_SCHEME", "ipc", 1);
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    rp.coordinator = coord_addr;
    rp.rank = g->rank;
    rp.nreceivers = g->participants - 1;
    rp.timeout_ms = g->timeout_ms;
    rp.heartbeat_ms = g->heartbeat_ms;
    if (wsync_receiver_create(ctx, &rp, &rv) != WSYNC_OK) {
        fprintf(stderr, "receiver %d: %s\n", g->rank, wsync_last_error());
        wsync_ctx_free(ctx);
        return 1;
    }
    for (int p = 0; p < NPARAMS; p++) {
        memset(&pieces[p], 0, sizeof(pieces[p]));
        pieces[p].param = to_param(p, names[p], sizeof(names[p]));
        pieces[p].src.len[0] = ROWS;
        pieces[p].src.len[1] = COLS;
        snprintf(tnames[p], sizeof(tnames[p]), "w%d", p);
        wsync_target_t t = {.name = tnames[p], .dtype = WSYNC_DTYPE_BF16, .ndim = 2,
                            .shape = {ROWS, COLS}, .data = buf[p], .mem = WSYNC_MEM_HOST,
                            .pieces = &pieces[p], .npieces = 1};
        CHECK_OK(wsync_receiver_add_target(rv, &t));
    }
    for (int v = 1; v <= VERSIONS && check_failures == 0; v++) {
        uint64_t got = 0;
        wsync_status_t st = wsync_receiver_wait(rv, g->timeout_ms, &got);
        if (st != WSYNC_OK) {
            fprintf(stderr, "receiver %d: waiting for version %d: %s\n", g->rank, v,
                    wsync_last_error());
            check_failures++;
            break;
        }
        CHECK_MSG(got == (uint64_t)v, "receiver %d got version %llu, expected %d", g->rank,
                  (unsigned long long)got, v);
        size_t bad = 0;
        for (int p = 0; p < NPARAMS; p++)
            for (size_t i = 0; i < (size_t)ROWS * COLS; i++)
                bad += buf[p][i] != weight(p, (uint64_t)v, i);
        CHECK_MSG(bad == 0, "receiver %d: version %d: %zu elements differ from the sender's",
                  g->rank, v, bad);
    }
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    return check_failures ? 1 : 0;
}

/* Wait until something accepts connections at addr ("127.0.0.1:port"), at most timeout_ms. */
static void wait_listening(const char *addr, int timeout_ms)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    long long end = proc_now_ms() + timeout_ms;

    sa.sin_port = htons((uint16_t)atoi(strchr(addr, ':') + 1));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    while (proc_now_ms() < end) {
        int fd = socket(AF_INET, SOCK_STREAM, 0), ok;
        ok = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
        if (fd >= 0)
            close(fd);
        if (ok)
            return;
        usleep(20000);
    }
    CHECK_MSG(0, "the coordinator did not listen at %s within %d ms", addr, timeout_ms);
}

static void run_group(int participants)
{
    static pid_t pids[MAX_P];
    static int codes[MAX_P];
    static group_t groups[MAX_P];
    /* a thousand processes starting on two cores (each probing its transports) starve one
     * another for seconds: heartbeats every 3 s, silence allowed for 30 s (10 heartbeats); the
     * last of them describes itself minutes after the first, which waits for the plan */
    int pipefd[2], timeout_ms = participants >= 512 ? 600000 : 60000;
    int heartbeat_ms = participants >= 512 ? 3000 : 1000;
    char out[4096];
    ssize_t got;

    fprintf(stderr, "scale: %d participants (1 sender, %d receivers)\n", participants,
            participants - 1);
    CHECK(pipe(pipefd) == 0);
    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%d", proc_free_port());
    long long t0 = proc_now_ms();
    groups[0] = (group_t){participants, 0, timeout_ms, heartbeat_ms, pipefd[1]};
    pids[0] = proc_spawn(sender_main, &groups[0], timeout_ms / 1000 * 3);
    /* let the coordinator listen before a thousand processes compete with its start */
    wait_listening(coord_addr, timeout_ms);
    for (int i = 1; i < participants; i++) {
        groups[i] = (group_t){participants, i - 1, timeout_ms, heartbeat_ms, -1};
        pids[i] = proc_spawn(receiver_main, &groups[i], timeout_ms / 1000 * 3);
        CHECK_MSG(pids[i] > 0, "fork of receiver %d: %s", i - 1, strerror(errno));
    }
    close(pipefd[1]);
    int bad = proc_wait_all(pids, participants, timeout_ms * 3, codes);
    CHECK_MSG(bad == 0, "%d of %d participants failed (sender: exit %d)", bad, participants,
              codes[0]);
    for (int i = 0, shown = 0; i < participants && shown < 5; i++)
        if (codes[i] != 0) {
            fprintf(stderr, "  %s %d: exit code %d\n", i ? "receiver" : "sender", i ? i - 1 : 0,
                    codes[i]);
            shown++;
        }
    got = read(pipefd[0], out, sizeof(out) - 1);
    close(pipefd[0]);
    CHECK_MSG(got > 0, "the sender wrote no figures");
    if (got > 0) {
        out[got] = '\0';
        printf("%s", out);
        fflush(stdout);
    }
    fprintf(stderr, "scale: %d participants done in %.1f s\n", participants,
            (double)(proc_now_ms() - t0) / 1e3);
}

static const char *counts;

static void test_scale(void)
{
    char list[256];
    snprintf(list, sizeof(list), "%s", counts);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        int n = atoi(tok);
        if (n < 2 || n > MAX_P) {
            CHECK_MSG(0, "WSYNC_SCALE_PARTICIPANTS: %s is outside [2, %d]", tok, MAX_P);
            continue;
        }
        run_group(n);
        if (check_failures)
            break;
    }
}

int main(void)
{
    counts = getenv("WSYNC_SCALE_PARTICIPANTS");
    if (counts == NULL || counts[0] == '\0')
        counts = "256";
    signal(SIGPIPE, SIG_IGN);
    RUN(test_scale);
    return check_summary();
}
