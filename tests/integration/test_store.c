/* The store scheme's own behaviour, over each RMA transport this build has: senders publish
 * without waiting for readers; a reader that joins late gets the newest version; the store keeps
 * the last K versions and never frees one a reader holds; unknown and evicted versions are clear
 * errors; a sender killed after publishing gives readers an error within the deadline. The
 * processes are driven step by step through pipes so that what "late" means is exact. */
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "tests/support/check.h"
#include "tests/support/proc.h"
#include "tests/support/transports.h"
#include "wsync/wsync.h"

#define NSENDERS 2
#define ROWS 256
#define COLS 1024
#define NORM 4096
#define TIMEOUT_MS 10000

static char coord_addr[64];
static const char *transport;

/* The weights of version v: element i of param p, as bf16 bits (any bits do). */
static uint16_t value(int p, uint64_t v, size_t i)
{
    uint64_t x = ((uint64_t)p << 56) ^ (v << 40) ^ i;
    x = (x ^ (x >> 31)) * 0x9e3779b97f4a7c15ull;
    return (uint16_t)(x >> 48);
}

/* ---- step-by-step control ------------------------------------------------------------------ */


/* ---- sender: publishes versions 1..upto when told, then waits; 'k' kills it ------------------ */

typedef struct {
    int rank;
    proc_chan_t *chan;
    int keep;
    int in_place;              /* publish the shards themselves, not snapshots */
} sender_arg_t;

static int sender_main(void *arg)
{
    sender_arg_t *a = arg;
    wsync_ctx_t *ctx;
    wsync_sender_t *s;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    uint16_t *w = malloc(ROWS / NSENDERS * COLS * 2), *norm = malloc(NORM * 2);
    uint64_t v = 0;

    setenv("WSYNC_STORE_TRANSPORT", transport, 1);
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    sp.coordinator = coord_addr;
    sp.rank = a->rank;
    sp.nranks = NSENDERS;
    sp.nreceivers = 2;
    sp.scheme = "store";
    sp.keep_versions = a->keep;
    sp.snapshot = !a->in_place;
    sp.timeout_ms = TIMEOUT_MS;
    sp.heartbeat_ms = 200;
    if (wsync_sender_create(ctx, &sp, &s) != WSYNC_OK) {
        CHECK_OK(WSYNC_ERR_INTERNAL);
        return 1;
    }
    wsync_shard_t sh = {{"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}},
                        {{a->rank * ROWS / NSENDERS, 0}, {ROWS / NSENDERS, COLS}}, w,
                        WSYNC_MEM_HOST, 0};
    CHECK_OK(wsync_sender_add_shard(s, &sh));
    if (a->rank == 0) {
        wsync_shard_t nh = {{"norm", WSYNC_DTYPE_BF16, 1, {NORM}}, {{0}, {NORM}}, norm,
                            WSYNC_MEM_HOST, 0};
        CHECK_OK(wsync_sender_add_shard(s, &nh));
    }
    /* commands: 'p' publish the next version, 'k' die, 'q' leave */
    for (;;) {
        int c = proc_recv_byte(a->chan->to_child[0], 60000);
        if (c == 'k')
            raise(SIGKILL);
        if (c != 'p')
            break;
        v++;
        for (size_t i = 0; i < ROWS / NSENDERS * COLS; i++)
            w[i] = value(0, v, (size_t)a->rank * ROWS / NSENDERS * COLS + i);
        for (size_t i = 0; i < NORM; i++)
            norm[i] = value(1, v, i);
        wsync_status_t st = wsync_sender_push(s, v);
        CHECK_OK(st);
        /* snapshot mode: the trainer steps on at once, scribbling over what it just published
         * (in place, the shards are what readers read: they change only at the next version) */
        if (!a->in_place) {
            memset(w, 0x5a, ROWS / NSENDERS * COLS * 2);
            memset(norm, 0x5a, NORM * 2);
        }
        proc_send_byte(a->chan->to_parent[1], st == WSYNC_OK ? 'y' : 'n');
    }
    wsync_sender_free(s);
    wsync_ctx_free(ctx);
    free(w);
    free(norm);
    return check_failures ? 1 : 0;
}

/* ---- receiver: fetches what it is told, checks the bytes ------------------------------------ */

typedef struct {
    int rank;
    proc_chan_t *chan;
} receiver_arg_t;

static uint16_t *rw, *rnorm;
static int hold_ms;

static void on_progress(void *arg, uint64_t version, uint64_t done, uint64_t total)
{
    (void)arg;
    (void)version;
    (void)done;
    (void)total;
    if (hold_ms > 0)
        usleep((useconds_t)hold_ms * 1000);   /* keep the lease a while */
}

static int check_version(uint64_t v)
{
    for (size_t i = 0; i < (size_t)ROWS * COLS; i++)
        if (rw[i] != value(0, v, i))
            return 0;
    for (size_t i = 0; i < NORM; i++)
        if (rnorm[i] != value(1, v, i))
            return 0;
    return 1;
}

/* Commands (one byte, then for 'f' one byte of version, 0 = newest): the reply byte is the
 * version got, or 200 + a code: 201 NOT_FOUND, 202 TIMEOUT, 203 another error, 204 bytes wrong. */
static int receiver_main(void *arg)
{
    receiver_arg_t *a = arg;
    wsync_ctx_t *ctx;
    wsync_receiver_t *rv;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;

    setenv("WSYNC_STORE_TRANSPORT", transport, 1);
    rw = malloc((size_t)ROWS * COLS * 2);
    rnorm = malloc(NORM * 2);
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    rp.coordinator = coord_addr;
    rp.rank = a->rank;
    rp.nreceivers = 2;
    rp.timeout_ms = TIMEOUT_MS;
    rp.heartbeat_ms = 200;
    rp.progress = on_progress;
    if (wsync_receiver_create(ctx, &rp, &rv) != WSYNC_OK) {
        CHECK_OK(WSYNC_ERR_INTERNAL);
        return 1;
    }
    wsync_piece_t pw = {{"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}}, {{0, 0}, {ROWS, COLS}}, {0}};
    wsync_piece_t pn = {{"norm", WSYNC_DTYPE_BF16, 1, {NORM}}, {{0}, {NORM}}, {0}};
    wsync_target_t tw = {"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}, rw, WSYNC_MEM_HOST, 0, &pw, 1, {0}};
    wsync_target_t tn = {"norm", WSYNC_DTYPE_BF16, 1, {NORM}, rnorm, WSYNC_MEM_HOST, 0, &pn, 1, {0}};
    CHECK_OK(wsync_receiver_add_target(rv, &tw));
    CHECK_OK(wsync_receiver_add_target(rv, &tn));
    for (;;) {
        int c = proc_recv_byte(a->chan->to_child[0], 60000);
        if (c == 'h') {
            hold_ms = proc_recv_byte(a->chan->to_child[0], 1000) * 10;
            continue;
        }
        if (c != 'f')
            break;
        int want = proc_recv_byte(a->chan->to_child[0], 1000);
        uint64_t got = 0;
        wsync_status_t st = wsync_receiver_fetch(rv, (uint64_t)want, want == 99 ? 500 : TIMEOUT_MS,
                                                 &got);
        char reply;
        if (st == WSYNC_OK)
            reply = check_version(got) ? (char)got : (char)204;
        else
            reply = (char)(st == WSYNC_ERR_NOT_FOUND ? 201 : st == WSYNC_ERR_TIMEOUT ? 202 : 203);
        if (st != WSYNC_OK)
            fprintf(stderr, "receiver %d: fetch %d: %s\n", a->rank, want, wsync_last_error());
        proc_send_byte(a->chan->to_parent[1], reply);
    }
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    return check_failures ? 1 : 0;
}

/* ---- the parent drives ---------------------------------------------------------------------- */

typedef struct {
    proc_chan_t sc[NSENDERS], rc[2];
    sender_arg_t sa[NSENDERS];
    receiver_arg_t ra[2];
    pid_t pids[NSENDERS + 2];
    int n;
} world_t;

static int in_place;

static void start_senders(world_t *w, int keep)
{
    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%d", proc_free_port());
    w->n = 0;
    for (int s = 0; s < NSENDERS; s++) {
        proc_chan_open(&w->sc[s]);
        w->sa[s] = (sender_arg_t){s, &w->sc[s], keep, in_place};
        w->pids[w->n++] = proc_spawn(sender_main, &w->sa[s], 90);
    }
}

static void start_receiver(world_t *w, int r)
{
    proc_chan_open(&w->rc[r]);
    w->ra[r] = (receiver_arg_t){r, &w->rc[r]};
    w->pids[w->n++] = proc_spawn(receiver_main, &w->ra[r], 90);
}

/* Every sender publishes the next version; 1 if all said it is in the store. */
static int publish(world_t *w)
{
    int ok = 1;
    for (int s = 0; s < NSENDERS; s++)
        proc_send_byte(w->sc[s].to_child[1], 'p');
    for (int s = 0; s < NSENDERS; s++)
        ok &= proc_recv_byte(w->sc[s].to_parent[0], 30000) == 'y';
    return ok;
}

static int fetch(world_t *w, int r, int version)
{
    proc_send_byte(w->rc[r].to_child[1], 'f');
    proc_send_byte(w->rc[r].to_child[1], (char)version);
    return proc_recv_byte(w->rc[r].to_parent[0], 30000);
}

static void finish(world_t *w, int killed_sender)
{
    int codes[NSENDERS + 2];

    for (int r = 0; r < w->n - NSENDERS; r++)
        proc_send_byte(w->rc[r].to_child[1], 'q');
    for (int s = 0; s < NSENDERS; s++)
        if (s != killed_sender)
            proc_send_byte(w->sc[s].to_child[1], 'q');
    proc_wait_all(w->pids, w->n, 60000, codes);
    for (int i = 0; i < w->n; i++) {
        if (i == killed_sender)
            CHECK_MSG(codes[i] == 128 + SIGKILL, "sender %d exited with %d", i, codes[i]);
        else
            CHECK_MSG(codes[i] == 0, "process %d exited with %d", i, codes[i]);
    }
}

/* Senders publish 1..3 with no reader in sight; a reader joining then gets 3, then 4. */
static void late_joiner(void)
{
    world_t w;

    start_senders(&w, 2);
    for (int v = 1; v <= 3; v++)
        CHECK_MSG(publish(&w), "version %d was not published without readers", v);
    start_receiver(&w, 0);
    CHECK_MSG(fetch(&w, 0, 0) == 3, "the late reader did not get version 3 whole");
    CHECK(publish(&w));
    CHECK_MSG(fetch(&w, 0, 0) == 4, "the reader did not get version 4 whole");
    finish(&w, -1);
}

/* K = 2: 1 and 2 are evicted once 3 and 4 exist; an unpublished version times out; a version a
 * reader holds outlives K until released. */
static void eviction_and_leases(void)
{
    world_t w;
    int r;

    start_senders(&w, 2);
    start_receiver(&w, 0);
    start_receiver(&w, 1);
    for (int v = 1; v <= 4; v++)
        CHECK(publish(&w));
    CHECK_MSG((r = fetch(&w, 0, 1)) == 201, "version 1 after 3 and 4: got %d, expected NOT_FOUND", r);
    CHECK_MSG((r = fetch(&w, 0, 99)) == 202, "version 99: got %d, expected TIMEOUT", r);
    CHECK_MSG((r = fetch(&w, 0, 3)) == 3, "version 3: got %d", r);
    /* reader 0 holds version 4 for 2 s while 5 and 6 are published: 4 must survive that */
    proc_send_byte(w.rc[0].to_child[1], 'h');
    proc_send_byte(w.rc[0].to_child[1], (char)200);
    proc_send_byte(w.rc[0].to_child[1], 'f');
    proc_send_byte(w.rc[0].to_child[1], 4);
    usleep(300000);
    CHECK(publish(&w));
    CHECK(publish(&w));
    CHECK_MSG((r = fetch(&w, 1, 4)) == 4, "version 4, held by another reader: got %d", r);
    CHECK_MSG((r = proc_recv_byte(w.rc[0].to_parent[0], 30000)) == 4,
              "the slow reader of version 4 got %d", r);
    proc_send_byte(w.rc[0].to_child[1], 'h');
    proc_send_byte(w.rc[0].to_child[1], 0);
    /* released: with 5 and 6 kept, 4 goes */
    CHECK(publish(&w));
    CHECK_MSG((r = fetch(&w, 1, 4)) == 201, "version 4 after release: got %d, expected NOT_FOUND", r);
    CHECK_MSG((r = fetch(&w, 1, 0)) == 7, "newest: got %d", r);
    finish(&w, -1);
}

/* A sender killed after publishing: the reader's next fetch fails within the deadline. */
static void sender_killed(void)
{
    world_t w;
    int r;
    long long t0;

    start_senders(&w, 2);
    start_receiver(&w, 0);
    CHECK(publish(&w));
    CHECK_MSG(fetch(&w, 0, 0) == 1, "version 1 not read");
    proc_send_byte(w.sc[1].to_child[1], 'k');
    usleep(200000);
    t0 = proc_now_ms();
    r = fetch(&w, 0, 0);
    CHECK_MSG(r == 203, "after sender 1 died: got %d, expected an error", r);
    CHECK_MSG(proc_now_ms() - t0 < TIMEOUT_MS + 5000, "the error took %lld ms", proc_now_ms() - t0);
    finish(&w, 1);
}

/* In place: readers read the senders' own shards, registered once; no copy is made. */
static void in_place_reads(void)
{
    world_t w;
    int r;

    in_place = 1;
    start_senders(&w, 1);
    start_receiver(&w, 0);
    for (int v = 1; v <= 3; v++) {
        CHECK(publish(&w));
        CHECK_MSG((r = fetch(&w, 0, 0)) == v, "in place, version %d: got %d", v, r);
    }
    finish(&w, -1);
    in_place = 0;
}

static void run_all(const char *t)
{
    transport = t;
    if (!test_have_transport(t))
        return;
    fprintf(stderr, "-- transport %s\n", t);
    late_joiner();
    eviction_and_leases();
    sender_killed();
    in_place_reads();
}

static void case_store_ucx(void) { run_all("ucx"); }
static void case_store_ofi(void) { run_all("ofi"); }

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    RUN(case_store_ucx);
    RUN(case_store_ofi);
    return check_summary();
}
