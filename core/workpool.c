/* A small pool of worker threads: see core/workpool.h. */
#include "core/workpool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "core/status.h"
#include "core/util.h"

struct wsync_workpool {
    uint32_t n;                      /* threads in all, the caller included */
    pthread_t *th;                   /* [n - 1] */
    uint32_t started;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;          /* a run began, or quit */
    pthread_cond_t done_cv;          /* the last busy thread left the run (CLOCK_MONOTONIC) */
    uint64_t gen;                    /* runs begun */
    int quit;
    uint32_t busy;                   /* pool threads still in the current run */
    /* the run in progress */
    wsync_work_fn_t fn;
    void *arg;
    uint32_t nitems;
    atomic_uint next;                /* the next item to hand out */
    atomic_uint ended;               /* items that ended */
    atomic_int stop;                 /* no new item: a failure, or the deadline */
    uint32_t err_item;               /* lowest failing item, UINT32_MAX: none */
    wsync_status_t err_rc;
    char err_text[1024];             /* its wsync_last_error(), relayed as it was */
};

typedef struct {
    wsync_workpool_t *p;
    uint32_t id;
} worker_arg_t;

wsync_status_t wsync_workpool_threads(const char *var, uint32_t *n)
{
    const char *s = getenv(var);

    if (s != NULL && *s != '\0') {
        char *end = NULL;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno != 0 || *s < '0' || *s > '9' || *end != '\0' || v < 1 ||
            v > (long)WSYNC_WORKPOOL_MAX)
            return wsync_err(WSYNC_ERR_INVALID, "environment variable %s='%s' is not a thread "
                             "count (an integer from 1 to %u)", var, s, WSYNC_WORKPOOL_MAX);
        *n = (uint32_t)v;
        return WSYNC_OK;
    }
    cpu_set_t set;
    uint32_t cpus = 1;
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
        cpus = (uint32_t)CPU_COUNT(&set);
    *n = WSYNC_MIN(cpus, WSYNC_WORKPOOL_CAP);
    return WSYNC_OK;
}

/* Take items until none is left or the run stops; the lowest failure is kept. */
static void take_items(wsync_workpool_t *p, uint32_t worker, int64_t deadline_ms, int *late)
{
    for (;;) {
        if (atomic_load(&p->stop))
            return;
        if (late != NULL && wsync_now_ms() > deadline_ms) {
            *late = 1;
            atomic_store(&p->stop, 1);
            return;
        }
        uint32_t i = atomic_fetch_add(&p->next, 1u);
        if (i >= p->nitems)
            return;
        wsync_status_t rc = p->fn(p->arg, i, worker);
        if (rc != WSYNC_OK) {
            pthread_mutex_lock(&p->mu);
            if (i < p->err_item) {
                p->err_item = i;
                p->err_rc = rc;
                snprintf(p->err_text, sizeof(p->err_text), "%s", wsync_last_error());
            }
            pthread_mutex_unlock(&p->mu);
            atomic_store(&p->stop, 1);
        }
        atomic_fetch_add(&p->ended, 1u);
    }
}

static void *worker_main(void *x)
{
    worker_arg_t *w = x;
    wsync_workpool_t *p = w->p;
    uint32_t id = w->id;
    uint64_t seen = 0;

    free(w);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        /* idle between runs: nothing waits on an idle worker, and free wakes it */
        while (!p->quit && p->gen == seen)
            pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->quit)
            break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        take_items(p, id, 0, NULL);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0)
            pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

wsync_status_t wsync_workpool_create(uint32_t n, wsync_workpool_t **out)
{
    wsync_workpool_t *p;
    pthread_condattr_t ca;

    if (n < 1 || n > WSYNC_WORKPOOL_MAX)
        return wsync_err(WSYNC_ERR_INVALID, "workpool: %u threads (1 to %u)", n,
                         WSYNC_WORKPOOL_MAX);
    p = calloc(1, sizeof(*p));
    if (p == NULL || (p->th = calloc(n, sizeof(*p->th))) == NULL) {
        free(p);
        return wsync_err(WSYNC_ERR_NOMEM, "workpool: no memory for %u threads", n);
    }
    p->n = n;
    p->err_item = UINT32_MAX;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->done_cv, &ca);
    pthread_condattr_destroy(&ca);
    for (uint32_t i = 1; i < n; i++) {
        worker_arg_t *w = malloc(sizeof(*w));
        int rc = w == NULL ? ENOMEM : 0;
        if (w != NULL) {
            *w = (worker_arg_t){p, i};
            rc = pthread_create(&p->th[p->started], NULL, worker_main, w);
            if (rc != 0)
                free(w);
        }
        if (rc != 0) {
            wsync_workpool_free(p);
            return wsync_err(WSYNC_ERR_IO, "workpool: cannot start thread %u of %u: %s", i, n,
                             strerror(rc));
        }
        p->started++;
    }
    *out = p;
    return WSYNC_OK;
}

void wsync_workpool_free(wsync_workpool_t *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 0; i < p->started; i++)
        pthread_join(p->th[i], NULL);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    pthread_mutex_destroy(&p->mu);
    free(p->th);
    free(p);
}

uint32_t wsync_workpool_size(const wsync_workpool_t *p)
{
    return p != NULL ? p->n : 1;
}

wsync_status_t wsync_workpool_run(wsync_workpool_t *p, uint32_t nitems, wsync_work_fn_t fn,
                                  void *arg, int64_t deadline_ms, const char *what)
{
    int late = 0;

    if (nitems == 0)
        return WSYNC_OK;
    if (p == NULL || p->n == 1 || nitems == 1) {
        /* on the caller alone: in order, stopping at the first failure (the lowest) */
        for (uint32_t i = 0; i < nitems; i++) {
            if (wsync_now_ms() > deadline_ms)
                return wsync_err(WSYNC_ERR_TIMEOUT, "%s: not done by the deadline (%u of %u "
                                 "items ended)", what, i, nitems);
            wsync_status_t rc = fn(arg, i, 0);
            if (rc != WSYNC_OK)
                return rc;
        }
        return WSYNC_OK;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->nitems = nitems;
    atomic_store(&p->next, 0u);
    atomic_store(&p->ended, 0u);
    atomic_store(&p->stop, 0);
    p->err_item = UINT32_MAX;
    p->busy = p->started;
    p->gen++;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);

    take_items(p, 0, deadline_ms, &late);

    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) {
        struct timespec ts;
        int64_t at = late ? wsync_now_ms() + 1000 : deadline_ms;
        ts.tv_sec = (time_t)(at / 1000);
        ts.tv_nsec = (long)(at % 1000) * 1000000L;
        if (pthread_cond_timedwait(&p->done_cv, &p->mu, &ts) == ETIMEDOUT && !late) {
            /* past the deadline: no new item starts; the ones in progress only compute on
             * memory the caller owns, so they are let end before the caller goes on */
            late = 1;
            atomic_store(&p->stop, 1);
            WSYNC_LOG_W("%s: past the deadline; waiting for the items in progress to end", what);
        }
    }
    uint32_t failed = p->err_item;
    wsync_status_t rc = p->err_rc;
    pthread_mutex_unlock(&p->mu);
    if (failed != UINT32_MAX)
        return wsync_err_set_text(rc, p->err_text);
    if (late && atomic_load(&p->ended) < nitems)
        return wsync_err(WSYNC_ERR_TIMEOUT, "%s: not done by the deadline (%u of %u items "
                         "ended)", what, atomic_load(&p->ended), nitems);
    return WSYNC_OK;
}
