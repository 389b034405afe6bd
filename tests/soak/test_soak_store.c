/* Soak: 1,000 versions of 1 MiB through the store scheme over UCX (one sender publishing
 * snapshots, three readers fetching every version with one-sided reads), in lockstep: the sender
 * publishes version v once every reader has read v - 1, so nothing is evicted under a reader and
 * each reader's fetch of v is exact. Every reader checks every byte; every process samples its
 * VmRSS and open descriptors from version 10 on (soak.h). Skipped (exit 77) when this build or
 * machine has no usable UCX. */
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/soak/soak.h"
#include "tests/support/check.h"
#include "tests/support/proc.h"
#include "wsync/wsync.h"

#define NRECEIVERS 3
#define NPARAMS 4
#define ROWS 512
#define COLS 256                      /* bf16: 256 KiB a param, 1 MiB in all */
#define PARAM_BYTES ((size_t)ROWS * COLS * 2)
#define TIMEOUT_MS 30000

static char coord_addr[64];
static int report_fd;
static int ack[2];                    /* readers → sender: one byte per version read */

static const char *param_name(int p)
{
    static char names[NPARAMS][48];
    snprintf(names[p], sizeof(names[p]), "model.layers.%d.mlp.up_proj.weight", p);
    return names[p];
}

static uint8_t byte_of(int p, uint64_t v, size_t i)
{
    return (uint8_t)(v * 13 + (uint64_t)p * 31 + (i >> 12));
}

static void fill(uint8_t *d, int p, uint64_t v)
{
    for (size_t blk = 0; blk < PARAM_BYTES; blk += 4096)
        memset(d + blk, byte_of(p, v, blk), 4096);
}

static int same(const uint8_t *d, int p, uint64_t v)
{
    for (size_t i = 0; i < PARAM_BYTES; i++)
        if (d[i] != byte_of(p, v, i))
            return 0;
    return 1;
}

static int sender_main(void *arg)
{
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    uint8_t *data[NPARAMS];
    soak_report_t rep;
    long long t0 = 0;

    (void)arg;
    close(ack[1]);
    memset(&rep, 0, sizeof(rep));
    snprintf(rep.who, sizeof(rep.who), "sender");
    setenv("WSYNC_STORE_TRANSPORT", "ucx", 1);
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    sp.coordinator = coord_addr;
    sp.rank = 0;
    sp.nranks = 1;
    sp.nreceivers = NRECEIVERS;
    sp.scheme = "store";
    sp.snapshot = 1;
    sp.keep_versions = 2;
    sp.timeout_ms = TIMEOUT_MS;
    sp.heartbeat_ms = 200;
    if (wsync_sender_create(ctx, &sp, &s) != WSYNC_OK) {
        fprintf(stderr, "sender: %s\n", wsync_last_error());
        rep.failed = 1;
        soak_send(report_fd, &rep);
        return 1;
    }
    for (int p = 0; p < NPARAMS; p++) {
        wsync_shard_t sh = {{param_name(p), WSYNC_DTYPE_BF16, 2, {ROWS, COLS}},
                            {{0, 0}, {ROWS, COLS}}, NULL, WSYNC_MEM_HOST, 0};
        data[p] = malloc(PARAM_BYTES);
        sh.data = data[p];
        CHECK_OK(wsync_sender_add_shard(s, &sh));
    }
    for (uint64_t v = 1; v <= SOAK_VERSIONS && check_failures == 0; v++) {
        for (int p = 0; p < NPARAMS; p++)
            fill(data[p], p, v);
        wsync_status_t st = wsync_sender_push(s, v);
        CHECK_MSG(st == WSYNC_OK, "publish %llu: %s", (unsigned long long)v, wsync_last_error());
        /* snapshot mode: the trainer may scribble at once */
        for (int p = 0; p < NPARAMS; p++)
            memset(data[p], 0x5a, PARAM_BYTES);
        for (int r = 0; r < NRECEIVERS && st == WSYNC_OK; r++) {
            struct pollfd pf = {ack[0], POLLIN, 0};
            char c;
            CHECK_MSG(poll(&pf, 1, TIMEOUT_MS) == 1 && read(ack[0], &c, 1) == 1 && c == 'y',
                      "version %llu: a reader did not read it", (unsigned long long)v);
        }
        if (v == SOAK_FIRST)
            t0 = proc_now_ms();
        soak_sample(&rep, v);
    }
    rep.seconds = (double)(proc_now_ms() - t0) / 1000.0;
    rep.failed = check_failures;
    soak_send(report_fd, &rep);
    wsync_sender_free(s);
    for (int p = 0; p < NPARAMS; p++)
        free(data[p]);
    wsync_ctx_free(ctx);
    return check_failures ? 1 : 0;
}

static int receiver_main(void *arg)
{
    int rank = *(int *)arg;
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *rv = NULL;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    uint8_t *buf[NPARAMS];
    wsync_piece_t pieces[NPARAMS];
    soak_report_t rep;
    long long t0 = 0;

    close(ack[0]);
    memset(&rep, 0, sizeof(rep));
    snprintf(rep.who, sizeof(rep.who), "reader %d", rank);
    setenv("WSYNC_STORE_TRANSPORT", "ucx", 1);
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    rp.coordinator = coord_addr;
    rp.rank = rank;
    rp.nreceivers = NRECEIVERS;
    rp.timeout_ms = TIMEOUT_MS;
    rp.heartbeat_ms = 200;
    if (wsync_receiver_create(ctx, &rp, &rv) != WSYNC_OK) {
        fprintf(stderr, "reader %d: %s\n", rank, wsync_last_error());
        rep.failed = 1;
        soak_send(report_fd, &rep);
        return 1;
    }
    for (int p = 0; p < NPARAMS; p++) {
        pieces[p] = (wsync_piece_t){{param_name(p), WSYNC_DTYPE_BF16, 2, {ROWS, COLS}},
                                    {{0, 0}, {ROWS, COLS}}, {0}};
        buf[p] = malloc(PARAM_BYTES);
        memset(buf[p], 0xab, PARAM_BYTES);
        wsync_target_t t = {param_name(p), WSYNC_DTYPE_BF16, 2, {ROWS, COLS}, buf[p],
                            WSYNC_MEM_HOST, 0, &pieces[p], 1, {0}};
        CHECK_OK(wsync_receiver_add_target(rv, &t));
    }
    for (uint64_t v = 1; v <= SOAK_VERSIONS && check_failures == 0; v++) {
        uint64_t got = 0;
        wsync_status_t st = wsync_receiver_fetch(rv, v, TIMEOUT_MS, &got);
        CHECK_MSG(st == WSYNC_OK && got == v, "reader %d: fetch %llu: %s (%s), got %llu", rank,
                  (unsigned long long)v, wsync_status_name(st), wsync_last_error(),
                  (unsigned long long)got);
        for (int p = 0; p < NPARAMS && st == WSYNC_OK; p++)
            CHECK_MSG(same(buf[p], p, v), "reader %d: version %llu: param %d differs", rank,
                      (unsigned long long)v, p);
        if (write(ack[1], check_failures ? "n" : "y", 1) != 1)
            CHECK_MSG(0, "reader %d: ack", rank);
        if (v == SOAK_FIRST)
            t0 = proc_now_ms();
        soak_sample(&rep, v);
    }
    rep.seconds = (double)(proc_now_ms() - t0) / 1000.0;
    rep.failed = check_failures;
    soak_send(report_fd, &rep);
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    for (int p = 0; p < NPARAMS; p++)
        free(buf[p]);
    return check_failures ? 1 : 0;
}

static int have_ucx(void)
{
    wsync_ctx_t *ctx;
    int have = 0;

    if (wsync_ctx_create(NULL, &ctx) != WSYNC_OK)
        return 0;
    for (int i = 0; i < wsync_transport_count(ctx); i++) {
        wsync_component_info_t info;
        if (wsync_transport_info(ctx, i, &info) == WSYNC_OK && strcmp(info.name, "ucx") == 0) {
            have = info.compiled && info.available;
            if (!have)
                fprintf(stderr, "skipped: transport ucx: %s\n", info.reason);
        }
    }
    wsync_ctx_free(ctx);
    return have;
}

static void case_store_ucx_1000_versions(void)
{
    int fds[2], ranks[NRECEIVERS], codes[1 + NRECEIVERS];
    pid_t pids[1 + NRECEIVERS];
    soak_report_t reps[1 + NRECEIVERS];

    CHECK(pipe(fds) == 0 && pipe(ack) == 0);
    report_fd = fds[1];
    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%d", proc_free_port());
    pids[0] = proc_spawn(sender_main, NULL, 600);
    for (int r = 0; r < NRECEIVERS; r++) {
        ranks[r] = r;
        pids[1 + r] = proc_spawn(receiver_main, &ranks[r], 600);
    }
    close(fds[1]);
    close(ack[0]);
    close(ack[1]);
    int got = soak_collect(fds[0], reps, 1 + NRECEIVERS, 120000);
    CHECK_MSG(proc_wait_all(pids, 1 + NRECEIVERS, 60000, codes) == 0, "a process failed");
    for (int i = 0; i < 1 + NRECEIVERS; i++)
        CHECK_MSG(codes[i] == 0, "process %d exited with %d", i, codes[i]);
    CHECK_MSG(got == 1 + NRECEIVERS, "%d reports of %d", got, 1 + NRECEIVERS);
    soak_check("store over ucx, 1 sender, 3 readers, 1 MiB snapshots", reps, got);
    close(fds[0]);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    if (!have_ucx())
        return 77;
    RUN(case_store_ucx_1000_versions);
    return check_summary();
}
