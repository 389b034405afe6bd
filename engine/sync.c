/* wsync inside the engine: the rank's receiver, whose targets are the weight buffers.
 *
 * In place, a version lands in the weights in use while the engine waits in update(). In shadow
 * mode a thread owns the receiver and lands each version in the spare set; generate() (or
 * update()) swaps it in once every TP rank has it, and the thread re-points the targets at the
 * new spare before it waits again, so a generation only ever reads one version. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/internal.h"

#define SHADOW_POLL_MS 100

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* What each rank tells the others when they agree on a version. */
typedef struct {
    uint64_t version;    /* landed (in place: committed; shadow: pending), 0 if none */
    int32_t status;      /* a failure of this rank's receiver */
    int32_t timed_out;   /* this rank's deadline passed */
} vote_t;

static wsync_status_t agree(wsync_engine_t *e, const vote_t *mine, vote_t *all)
{
    if (e->p.tp_size == 1) {
        all[0] = *mine;
        return WSYNC_OK;
    }
    return wse_comm_allgather(e->p.comm, e->p.tp_rank, mine, sizeof(*mine), all);
}

/* The first failed rank of a vote, as an error on this rank. */
static wsync_status_t vote_failure(wsync_engine_t *e, const vote_t *all, wsync_status_t local)
{
    if (all[e->p.tp_rank].status != WSYNC_OK)
        return local;   /* its own error says most, and is already set */
    for (int r = 0; r < e->p.tp_size; r++) {
        if (all[r].status == WSYNC_OK)
            continue;
        return wse_err(WSYNC_ERR_PEER_LOST, "TP rank %d: TP rank %d could not take the version "
                       "(%s)", e->p.tp_rank, r, wsync_status_str((wsync_status_t)all[r].status));
    }
    return WSYNC_OK;
}

wsync_status_t wse_targets_point(wsync_engine_t *e, int s)
{
    uint8_t *base = e->sets[s].base;

    for (size_t i = 0; i < e->ntargets; i++) {
        const wse_slot_t *sl = &e->slots[i];
        wsync_status_t st = wsync_receiver_set_target_data(
            e->rv, e->targets[i].name, base + sl->offset,
            sl->nscales ? (float *)(base + sl->scales_offset) : NULL);
        if (st != WSYNC_OK)
            return wse_err_wsync(st, "re-pointing a target");
    }
    return WSYNC_OK;
}

/* ---- shadow thread ------------------------------------------------------------------------ */

static void *shadow_main(void *arg)
{
    wsync_engine_t *e = arg;

    /* a CUDA engine's GPU is current on this thread too (the receiver lands into its memory) */
    if (e->cuda != NULL && wse_cuda_enter(e->cuda) != WSYNC_OK) {
        pthread_mutex_lock(&e->mu);
        e->thread_st = WSYNC_ERR_DEVICE;
        snprintf(e->thread_err, sizeof(e->thread_err), "%s", wsync_engine_last_error());
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        return NULL;
    }
    pthread_mutex_lock(&e->mu);
    for (;;) {
        int spare;
        uint64_t v = 0;
        wsync_status_t st;
        double t0;

        while (!e->stop && e->pending != 0)
            pthread_cond_wait(&e->cv, &e->mu);
        if (e->stop)
            break;
        spare = 1 - e->active;
        if (e->repoint) {
            pthread_mutex_unlock(&e->mu);
            st = wse_targets_point(e, spare);
            pthread_mutex_lock(&e->mu);
            if (st != WSYNC_OK) {
                e->thread_st = st;
                snprintf(e->thread_err, sizeof(e->thread_err), "%s", wsync_engine_last_error());
                break;
            }
            e->repoint = 0;
        }
        pthread_mutex_unlock(&e->mu);
        t0 = seconds_now();
        st = wsync_receiver_wait(e->rv, SHADOW_POLL_MS, &v);
        pthread_mutex_lock(&e->mu);
        if (st == WSYNC_ERR_TIMEOUT)
            continue;
        if (st != WSYNC_OK) {
            wse_err_wsync(st, "shadow receiver");
            e->thread_st = st;
            snprintf(e->thread_err, sizeof(e->thread_err), "%s", wsync_engine_last_error());
            e->sets[spare].valid = 0;
            pthread_cond_broadcast(&e->cv);
            break;
        }
        e->sync_seconds = seconds_now() - t0;
        e->sets[spare].version = v;
        e->sets[spare].valid = 1;
        e->pending = v;
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

wsync_status_t wse_shadow_start(wsync_engine_t *e)
{
    int rc;

    if (e->thread_running || e->p.mode != WSYNC_ENGINE_SHADOW || e->rv == NULL)
        return WSYNC_OK;
    e->stop = 0;
    rc = pthread_create(&e->thread, NULL, shadow_main, e);
    if (rc != 0)
        return wse_err(WSYNC_ERR_IO, "cannot start the shadow receiver thread: %s", strerror(rc));
    e->thread_running = 1;
    return WSYNC_OK;
}

void wse_shadow_stop(wsync_engine_t *e)
{
    if (!e->thread_running)
        return;
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->thread_running = 0;
}

static wsync_status_t thread_failure(wsync_engine_t *e, wsync_status_t st)
{
    return wse_err(st, "%s", e->thread_err);
}

wsync_status_t wse_shadow_take(wsync_engine_t *e, int strict, int *swapped)
{
    vote_t mine, all[WSYNC_ENGINE_MAX_TP];
    wsync_status_t st, tst;

    *swapped = 0;
    pthread_mutex_lock(&e->mu);
    mine.version = e->pending;
    tst = e->thread_st;
    pthread_mutex_unlock(&e->mu);
    /* a failed receiver (often just the trainers' group ending) stops new versions, not the
     * serving of the whole one in use: only update() reports it */
    mine.status = strict ? tst : WSYNC_OK;
    mine.timed_out = 0;
    if (mine.status != WSYNC_OK)
        thread_failure(e, tst);
    if ((st = agree(e, &mine, all)) != WSYNC_OK)
        return st;
    if ((st = vote_failure(e, all, mine.status)) != WSYNC_OK)
        return st;
    for (int r = 0; r < e->p.tp_size; r++)
        if (all[r].version == 0 || all[r].version != all[0].version)
            return WSYNC_OK;   /* not every rank has it yet: keep serving the old one */
    pthread_mutex_lock(&e->mu);
    e->active = 1 - e->active;
    e->pending = 0;
    e->repoint = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    wse_weights_bind(e);
    *swapped = 1;
    return WSYNC_OK;
}

/* ---- public ------------------------------------------------------------------------------- */

wsync_status_t wsync_engine_attach(wsync_engine_t *e, wsync_ctx_t *ctx,
                                   const wsync_receiver_params_t *rp)
{
    wsync_receiver_params_t p = WSYNC_RECEIVER_PARAMS_INIT;
    wsync_receiver_t *rv = NULL;
    wsync_status_t st;
    int land;

    if (e == NULL || ctx == NULL)
        return wse_err(WSYNC_ERR_INVALID, "wsync_engine_attach: NULL argument");
    if (e->rv != NULL)
        return wse_err(WSYNC_ERR_STATE, "TP rank %d is already attached", e->p.tp_rank);
    if (e->sleeping >= 2)
        return wse_err(WSYNC_ERR_STATE, "TP rank %d is asleep (level 2)", e->p.tp_rank);
    if (rp != NULL)
        p = *rp;
    if (p.rank < 0)
        p.rank = e->p.tp_rank;
    if (p.nreceivers == 0)
        p.nreceivers = e->p.tp_size;
    st = wsync_receiver_create(ctx, &p, &rv);
    if (st != WSYNC_OK) {
        char what[64];
        snprintf(what, sizeof(what), "TP rank %d: receiver", e->p.tp_rank);
        return wse_err_wsync(st, what);
    }
    land = e->p.mode == WSYNC_ENGINE_SHADOW ? 1 - e->active : e->active;
    for (size_t i = 0; i < e->ntargets; i++) {
        wsync_target_t t = e->targets[i];
        const wse_slot_t *sl = &e->slots[i];
        t.data = e->sets[land].base + sl->offset;
        if (sl->nscales)
            t.quant.scales = (float *)(e->sets[land].base + sl->scales_offset);
        st = wsync_receiver_add_target(rv, &t);
        if (st != WSYNC_OK) {
            wse_err_wsync(st, "adding a target");
            wsync_receiver_free(rv);
            return st;
        }
    }
    e->ctx = ctx;
    e->rv = rv;
    e->pending = 0;
    e->repoint = 0;
    e->thread_st = WSYNC_OK;
    if ((st = wse_shadow_start(e)) != WSYNC_OK) {
        wsync_receiver_free(rv);
        e->rv = NULL;
        return st;
    }
    return WSYNC_OK;
}

static wsync_status_t update_in_place(wsync_engine_t *e, int timeout_ms, uint64_t *version)
{
    vote_t mine = {0, 0, 0}, all[WSYNC_ENGINE_MAX_TP];
    uint64_t v = 0, target = 0;
    wsync_status_t st, local;
    double t0 = seconds_now();

    for (int round = 0; round < 2; round++) {
        local = WSYNC_OK;
        if (round == 0 || mine.version < target) {
            local = wsync_receiver_wait(e->rv, round == 0 ? timeout_ms : -1, &v);
            if (local == WSYNC_OK) {
                e->sets[e->active].version = v;
                e->sets[e->active].valid = 1;
                e->sync_seconds = seconds_now() - t0;
                mine.version = v;
            } else if (local == WSYNC_ERR_TIMEOUT && round == 0) {
                local = WSYNC_OK;
                mine.timed_out = 1;
            } else {
                wse_err_wsync(local, "taking a version");
                if (wsync_receiver_torn(e->rv))
                    e->sets[e->active].valid = 0;
            }
        }
        mine.status = local;
        if ((st = agree(e, &mine, all)) != WSYNC_OK)
            return st;
        if ((st = vote_failure(e, all, local)) != WSYNC_OK)
            return st;
        target = 0;
        for (int r = 0; r < e->p.tp_size; r++)
            target = all[r].version > target ? all[r].version : target;
        if (target == 0)
            return wse_err(WSYNC_ERR_TIMEOUT, "TP rank %d: no new version within %d ms",
                           e->p.tp_rank, timeout_ms);
        int same = 1;
        for (int r = 0; r < e->p.tp_size; r++)
            same &= all[r].version == target;
        if (same) {
            if (version != NULL)
                *version = target;
            return WSYNC_OK;
        }
    }
    return wse_err(WSYNC_ERR_INTERNAL, "TP rank %d: ranks disagree on the version after "
                   "catching up", e->p.tp_rank);
}

static wsync_status_t update_shadow(wsync_engine_t *e, int timeout_ms, uint64_t *version)
{
    double deadline = seconds_now() + (timeout_ms < 0 ? 3600.0 : timeout_ms / 1000.0);
    wsync_status_t st;

    for (;;) {
        vote_t mine = {0, 0, 0}, all[WSYNC_ENGINE_MAX_TP];
        struct timespec ts;
        int swapped = 0, expired = 0;

        if ((st = wse_shadow_take(e, 1, &swapped)) != WSYNC_OK)
            return st;
        if (swapped) {
            if (version != NULL)
                *version = e->sets[e->active].version;
            return WSYNC_OK;
        }
        /* wait a little for the thread, then ask every rank whether to go on */
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 5 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&e->mu);
        if (e->pending == 0 && e->thread_st == WSYNC_OK)
            pthread_cond_timedwait(&e->cv, &e->mu, &ts);
        pthread_mutex_unlock(&e->mu);
        mine.timed_out = seconds_now() >= deadline;
        if ((st = agree(e, &mine, all)) != WSYNC_OK)
            return st;
        for (int r = 0; r < e->p.tp_size; r++)
            expired |= all[r].timed_out;
        if (expired)
            return wse_err(WSYNC_ERR_TIMEOUT, "TP rank %d: no new version within %d ms",
                           e->p.tp_rank, timeout_ms);
    }
}

wsync_status_t wsync_engine_update(wsync_engine_t *e, int timeout_ms, uint64_t *version)
{
    if (e == NULL)
        return wse_err(WSYNC_ERR_INVALID, "wsync_engine_update: NULL engine");
    if (e->rv == NULL)
        return wse_err(WSYNC_ERR_STATE, "TP rank %d is not attached to a wsync group",
                       e->p.tp_rank);
    if (e->sleeping >= 2)
        return wse_err(WSYNC_ERR_STATE, "TP rank %d is asleep (level 2): wake it first",
                       e->p.tp_rank);
    if (e->p.mode == WSYNC_ENGINE_SHADOW)
        return update_shadow(e, timeout_ms, version);
    return update_in_place(e, timeout_ms, version);
}

int wsync_engine_pending(const wsync_engine_t *e)
{
    int p;
    if (e == NULL)
        return 0;
    pthread_mutex_lock((pthread_mutex_t *)&e->mu);
    p = e->pending != 0;
    pthread_mutex_unlock((pthread_mutex_t *)&e->mu);
    return p;
}

double wsync_engine_sync_seconds(const wsync_engine_t *e)
{
    return e != NULL ? e->sync_seconds : 0.0;
}

int wsync_engine_sleeping(const wsync_engine_t *e)
{
    return e != NULL ? e->sleeping : 0;
}

wsync_status_t wsync_engine_sleep(wsync_engine_t *e, int level)
{
    if (e == NULL)
        return wse_err(WSYNC_ERR_INVALID, "wsync_engine_sleep: NULL engine");
    if (level != 1 && level != 2)
        return wse_err(WSYNC_ERR_INVALID, "sleep level %d (1: free the KV cache, 2: also the "
                       "weights)", level);
    if (e->sleeping >= level)
        return WSYNC_OK;
    wse_shadow_stop(e);
    wse_kv_free(e);
    if (level == 2) {
        for (int s = 0; s < e->nsets; s++)
            wse_set_free(e, s);
        e->pending = 0;
        e->repoint = 0;
        wse_weights_bind(e);   /* views become NULL */
    }
    e->sleeping = level;
    return WSYNC_OK;
}

wsync_status_t wsync_engine_wake(wsync_engine_t *e)
{
    wsync_status_t st;
    int was = e != NULL ? e->sleeping : 0;

    if (e == NULL)
        return wse_err(WSYNC_ERR_INVALID, "wsync_engine_wake: NULL engine");
    if (was == 0)
        return WSYNC_OK;
    if ((st = wse_kv_alloc(e)) != WSYNC_OK)
        return st;
    if (was >= 2) {
        for (int s = 0; s < e->nsets; s++)
            if ((st = wse_set_alloc(e, s)) != WSYNC_OK)
                return st;
        wse_weights_bind(e);
        if (e->rv != NULL) {
            /* the next version lands in the new buffers */
            st = wse_targets_point(e, e->p.mode == WSYNC_ENGINE_SHADOW ? 1 - e->active : e->active);
            if (st != WSYNC_OK)
                return st;
        } else if (e->src != NULL) {
            if ((st = wse_load_into(e, e->active, e->src, e->nsrc)) != WSYNC_OK)
                return st;
        }
    }
    e->sleeping = 0;
    return wse_shadow_start(e);
}
