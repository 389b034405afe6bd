/* core/workpool.h: the thread count (WSYNC_DELTA_THREADS, the CPUs this process may run on),
 * every item run exactly once over several threads and several runs of one pool, an item's
 * failure on a thread other than the caller's returned to the caller with its text (the lowest
 * failing item's), the deadline, and the one-thread pool. */
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "core/workpool.h"
#include "core/status.h"
#include "tests/support/check.h"
#include "wsync/wsync.h"

#define VAR "WSYNC_DELTA_THREADS"
#define NITEMS 2000u

typedef struct {
    atomic_uint count[NITEMS];       /* runs of each item */
    uint64_t out[NITEMS];
    uint32_t by[NITEMS];             /* the worker that ran it */
    atomic_int running;              /* items in progress */
    uint32_t fail_from;              /* items >= this fail when run by a worker other than 0 */
    int sleep_us0;                   /* worker 0 sleeps this long per item */
    int sleep_us;                    /* every worker sleeps this long per item */
} job_t;

static uint64_t value_of(uint32_t i)
{
    uint64_t x = i * 0x9E3779B97F4A7C15ull;
    for (int k = 0; k < 64; k++)
        x = x * 6364136223846793005ull + 1442695040888963407ull;
    return x;
}

static wsync_status_t item_fn(void *arg, uint32_t i, uint32_t worker)
{
    job_t *j = arg;
    atomic_fetch_add(&j->running, 1);
    atomic_fetch_add(&j->count[i], 1u);
    j->by[i] = worker;
    if (worker == 0 && j->sleep_us0 > 0)
        usleep((useconds_t)j->sleep_us0);
    if (j->sleep_us > 0)
        usleep((useconds_t)j->sleep_us);
    j->out[i] = value_of(i);
    atomic_fetch_sub(&j->running, 1);
    if (worker != 0 && i >= j->fail_from)
        return wsync_err(WSYNC_ERR_INTEGRITY, "region %u (worker %u): stream refused", i, worker);
    return WSYNC_OK;
}

static job_t *job_new(void)
{
    job_t *j = calloc(1, sizeof(*j));
    if (j != NULL)
        j->fail_from = UINT32_MAX;
    return j;
}

static void case_threads_env(void)
{
    uint32_t n = 0;
    const char *bad[] = {"0", "65", "x", "2x", "-3", "1.5", " 4"};
    cpu_set_t all, one;

    setenv(VAR, "3", 1);
    CHECK_OK(wsync_workpool_threads(VAR, &n));
    CHECK(n == 3);
    setenv(VAR, "64", 1);
    CHECK_OK(wsync_workpool_threads(VAR, &n));
    CHECK(n == 64);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char want[64];
        n = 77;
        setenv(VAR, bad[i], 1);
        CHECK_ST(wsync_workpool_threads(VAR, &n), WSYNC_ERR_INVALID);
        snprintf(want, sizeof(want), VAR "='%s'", bad[i]);
        CHECK_ERR_HAS(want);
        CHECK(n == 77);   /* untouched */
    }
    unsetenv(VAR);
    /* unset: the CPUs this process may run on, capped at WSYNC_WORKPOOL_CAP (16) */
    CHECK(sched_getaffinity(0, sizeof(all), &all) == 0);
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (CPU_ISSET(c, &all)) {
            CPU_SET(c, &one);
            break;
        }
    }
    CHECK(sched_setaffinity(0, sizeof(one), &one) == 0);
    CHECK_OK(wsync_workpool_threads(VAR, &n));
    CHECK_MSG(n == 1, "one CPU allowed: %u threads", n);
    CHECK(sched_setaffinity(0, sizeof(all), &all) == 0);
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    CHECK_OK(wsync_workpool_threads(VAR, &n));
    CHECK(WSYNC_WORKPOOL_CAP == 16);
    CHECK_MSG(n >= 1 && n <= 16 && n <= (uint32_t)online, "%u threads, %ld CPUs online", n,
              online);
    CHECK(n == (uint32_t)(CPU_COUNT(&all) < 16 ? CPU_COUNT(&all) : 16));
}

static void case_every_item_once(void)
{
    wsync_workpool_t *p = NULL;
    job_t *j = job_new();

    CHECK_ST(wsync_workpool_create(0, &p), WSYNC_ERR_INVALID);
    CHECK_ST(wsync_workpool_create(65, &p), WSYNC_ERR_INVALID);
    CHECK_OK(wsync_workpool_create(4, &p));
    if (p == NULL || j == NULL)
        return;
    CHECK(wsync_workpool_size(p) == 4);
    j->sleep_us0 = 200;   /* the caller slow: the pool's threads take most items */
    for (int run = 1; run <= 3; run++) {
        int workers[4] = {0};
        CHECK_OK(wsync_workpool_run(p, NITEMS, item_fn, j, wsync_deadline_in(60000), "test"));
        for (uint32_t i = 0; i < NITEMS; i++) {
            CHECK_MSG(atomic_load(&j->count[i]) == (unsigned)run, "run %d: item %u ran %u times",
                      run, i, atomic_load(&j->count[i]));
            CHECK(j->out[i] == value_of(i));
            CHECK(j->by[i] < 4);
            workers[j->by[i] < 4 ? j->by[i] : 0]++;
        }
        CHECK_MSG(workers[1] + workers[2] + workers[3] > 0, "run %d: only the caller ran items",
                  run);
        memset(j->out, 0, sizeof(j->out));
    }
    CHECK(atomic_load(&j->running) == 0);
    CHECK_OK(wsync_workpool_run(p, 0, item_fn, j, wsync_deadline_in(1000), "test"));
    wsync_workpool_free(p);
    wsync_workpool_free(NULL);
    free(j);
}

/* Items from 40 on fail on any thread but the caller's, which sleeps on each of its items so
 * that the others take most of them: the run returns the lowest failing item's error, text as
 * its thread wrote it, and only after every item in progress ended. */
static void case_error_from_another_thread(void)
{
    wsync_workpool_t *p = NULL;
    job_t *j = job_new();

    CHECK_OK(wsync_workpool_create(4, &p));
    if (p == NULL || j == NULL)
        return;
    j->fail_from = 40;
    j->sleep_us0 = 2000;
    j->sleep_us = 100;
    wsync_err_clear();
    wsync_status_t st = wsync_workpool_run(p, 400, item_fn, j, wsync_deadline_in(60000), "test");
    CHECK(atomic_load(&j->running) == 0);
    uint32_t lowest = UINT32_MAX, ran = 0;
    for (uint32_t i = 0; i < 400; i++) {
        if (atomic_load(&j->count[i]) == 0)
            continue;
        ran++;
        if (i >= 40 && j->by[i] != 0 && i < lowest)
            lowest = i;
    }
    CHECK_MSG(lowest != UINT32_MAX, "no item at or past 40 ran on a pool thread");
    CHECK_ST(st, WSYNC_ERR_INTEGRITY);
    char want[96];
    snprintf(want, sizeof(want), "region %u (worker %u): stream refused", lowest, j->by[lowest]);
    CHECK_ERR_HAS(want);
    CHECK_MSG(j->by[lowest] != 0, "item %u ran on the caller", lowest);
    CHECK_MSG(ran < 400, "the failure did not stop the run (%u items ran)", ran);
    /* every item below the failing one ran (so it is the lowest failure of all) */
    for (uint32_t i = 0; i < lowest; i++)
        CHECK_MSG(atomic_load(&j->count[i]) == 1, "item %u below the failure did not run", i);
    /* the pool goes on working after a failed run */
    memset(j->count, 0, sizeof(j->count));
    j->fail_from = UINT32_MAX;
    j->sleep_us0 = j->sleep_us = 0;
    CHECK_OK(wsync_workpool_run(p, NITEMS, item_fn, j, wsync_deadline_in(60000), "test"));
    for (uint32_t i = 0; i < NITEMS; i++)
        CHECK(atomic_load(&j->count[i]) == 1 && j->out[i] == value_of(i));
    wsync_workpool_free(p);
    free(j);
}

static void case_deadline(void)
{
    wsync_workpool_t *p = NULL;
    job_t *j = job_new();

    CHECK_OK(wsync_workpool_create(2, &p));
    if (p == NULL || j == NULL)
        return;
    j->sleep_us = 50000;
    uint64_t t0 = wsync_now_ns();
    CHECK_ST(wsync_workpool_run(p, 64, item_fn, j, wsync_deadline_in(120), "applying version 9"),
             WSYNC_ERR_TIMEOUT);
    CHECK_ERR_HAS("applying version 9: not done by the deadline");
    CHECK(atomic_load(&j->running) == 0);
    uint32_t ran = 0;
    for (uint32_t i = 0; i < 64; i++)
        ran += atomic_load(&j->count[i]);
    CHECK_MSG(ran < 64 && (wsync_now_ns() - t0) < 2000000000ull, "%u items ran", ran);
    wsync_workpool_free(p);
    free(j);
}

/* One thread, or no pool: every item on the caller. */
static void case_one_thread(void)
{
    wsync_workpool_t *p = NULL;
    job_t *j = job_new();

    CHECK_OK(wsync_workpool_create(1, &p));
    if (p == NULL || j == NULL)
        return;
    CHECK_OK(wsync_workpool_run(p, 100, item_fn, j, wsync_deadline_in(10000), "test"));
    CHECK_OK(wsync_workpool_run(NULL, 100, item_fn, j, wsync_deadline_in(10000), "test"));
    for (uint32_t i = 0; i < 100; i++)
        CHECK(atomic_load(&j->count[i]) == 2 && j->by[i] == 0 && j->out[i] == value_of(i));
    wsync_workpool_free(p);
    free(j);
}

int main(void)
{
    RUN(case_threads_env);
    RUN(case_every_item_once);
    RUN(case_error_from_another_thread);
    RUN(case_deadline);
    RUN(case_one_thread);
    return check_summary();
}
