/* The TP collectives of a CUDA engine. With NCCL, the ranks' GPUs all-reduce (and gather the
 * logits) on the engine's stream: rank 0 makes the unique id and hands it to the others through
 * the host communicator (the shared mapping made before fork), at the first forward, where every
 * rank also tells which GPU it has. Without NCCL, or when two ranks share a GPU (NCCL refuses
 * that), or with WSYNC_ENGINE_ALLREDUCE=shm, each collective copies to the host, goes through the
 * host communicator (the CPU engine's rank-order sum) and copies back.
 *
 * The NCCL communicator is non-blocking, so that no wait is unbounded: its setup and every call
 * poll with the host communicator's deadline, and a lost peer (the launcher aborts the host
 * communicator, or its process is gone) aborts it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wsync_build_config.h"
#include "engine/internal.h"

#if WSYNC_HAVE_NCCL
#include <nccl.h>
#endif

struct wse_tpdev {
    wsync_engine_t *e;
    int want_nccl;          /* before setup: NCCL unless told otherwise or not built */
    int ready;              /* setup done */
    int use_nccl;           /* after setup */
    int failed;             /* the NCCL communicator was aborted: every later call fails */
    float *host;            /* staging for the host path: max(Hd, Vr) floats */
    long long next_liveness;
#if WSYNC_HAVE_NCCL
    ncclComm_t comm;
#endif
};

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

wsync_status_t wse_tpdev_create(wsync_engine_t *e, wse_tpdev_t **out)
{
    const char *env = getenv("WSYNC_ENGINE_ALLREDUCE");
    size_t n = (size_t)(e->Hd > e->Vr ? e->Hd : e->Vr);
    wse_tpdev_t *t;

    if (env != NULL && *env != '\0' && strcmp(env, "nccl") != 0 && strcmp(env, "shm") != 0)
        return wse_err(WSYNC_ERR_INVALID, "WSYNC_ENGINE_ALLREDUCE='%s': expected nccl or shm", env);
    if (!WSYNC_HAVE_NCCL && env != NULL && strcmp(env, "nccl") == 0)
        return wse_err(WSYNC_ERR_UNSUPPORTED, "WSYNC_ENGINE_ALLREDUCE=nccl, but wsync was built "
                       "without NCCL");
    t = calloc(1, sizeof(*t));
    if (t == NULL || (t->host = calloc(n, sizeof(float))) == NULL) {
        free(t);
        return wse_err(WSYNC_ERR_NOMEM, "no memory for the TP staging buffers");
    }
    t->e = e;
    t->want_nccl = WSYNC_HAVE_NCCL && !(env != NULL && strcmp(env, "shm") == 0);
    *out = t;
    return WSYNC_OK;
}

/* ---- host path ------------------------------------------------------------------------------ */

static wsync_status_t shm_allreduce(void *arg, float *x, size_t n)
{
    wse_tpdev_t *t = arg;
    wsync_engine_t *e = t->e;
    wsync_status_t st;

    if ((st = wse_cuda_download(e->cuda, t->host, x, n * sizeof(float))) != WSYNC_OK ||
        (st = wse_comm_allreduce(e->p.comm, e->p.tp_rank, t->host, n)) != WSYNC_OK)
        return st;
    return wse_cuda_upload(e->cuda, x, t->host, n * sizeof(float));
}

static wsync_status_t shm_allgather(void *arg, const float *in, size_t n, float *out)
{
    wse_tpdev_t *t = arg;
    wsync_engine_t *e = t->e;
    wsync_status_t st;

    /* e->logits (host, tp * Vr floats) is free until forward copies the result into it */
    if ((st = wse_cuda_download(e->cuda, t->host, in, n * sizeof(float))) != WSYNC_OK ||
        (st = wse_comm_allgather(e->p.comm, e->p.tp_rank, t->host, n * sizeof(float),
                                 e->logits)) != WSYNC_OK)
        return st;
    return wse_cuda_upload(e->cuda, out, e->logits, (size_t)e->p.tp_size * n * sizeof(float));
}

static wsync_status_t shm_check(void *arg)
{
    wse_tpdev_t *t = arg;
    return wse_comm_check(t->e->p.comm, t->e->p.tp_rank);
}

/* ---- NCCL ------------------------------------------------------------------------------------ */

#if WSYNC_HAVE_NCCL

static wsync_status_t nccl_fail(wse_tpdev_t *t, const char *call, ncclResult_t r)
{
    const char *detail = t->comm != NULL ? ncclGetLastError(t->comm) : ncclGetLastError(NULL);
    return wse_err(WSYNC_ERR_DEVICE, "TP rank %d (GPU %d): %s: %s%s%s", t->e->p.tp_rank,
                   wse_cuda_gpu(t->e->cuda), call, ncclGetErrorString(r),
                   detail != NULL && *detail ? ": " : "", detail != NULL ? detail : "");
}

static void nccl_abort(wse_tpdev_t *t)
{
    if (t->comm != NULL && !t->failed)
        ncclCommAbort(t->comm);
    if (t->comm != NULL)
        t->comm = NULL;
    t->failed = 1;
}

/* Every few ms while waiting: the host communicator says whether a peer is gone. */
static wsync_status_t liveness(wse_tpdev_t *t)
{
    long long now = now_ms();
    wsync_status_t st;
    if (now < t->next_liveness)
        return WSYNC_OK;
    t->next_liveness = now + 50;
    if ((st = wse_comm_check(t->e->p.comm, t->e->p.tp_rank)) != WSYNC_OK)
        nccl_abort(t);
    return st;
}

/* A non-blocking NCCL call returned r: wait until it is enqueued (or failed), with a deadline. */
static wsync_status_t nccl_settle(wse_tpdev_t *t, ncclResult_t r, const char *call)
{
    long long deadline = now_ms() + wse_comm_timeout_ms(t->e->p.comm);
    wsync_status_t st;

    while (r == ncclInProgress) {
        struct timespec ts = {0, 20 * 1000};
        if ((st = liveness(t)) != WSYNC_OK)
            return st;
        if (now_ms() > deadline) {
            nccl_abort(t);
            return wse_err(WSYNC_ERR_TIMEOUT, "TP rank %d: %s did not complete within %d ms",
                           t->e->p.tp_rank, call, wse_comm_timeout_ms(t->e->p.comm));
        }
        nanosleep(&ts, NULL);
        if (ncclCommGetAsyncError(t->comm, &r) != ncclSuccess)
            break;
    }
    if (r != ncclSuccess) {
        st = nccl_fail(t, call, r);
        nccl_abort(t);
        return st;
    }
    return WSYNC_OK;
}

static wsync_status_t nccl_allreduce(void *arg, float *x, size_t n)
{
    wse_tpdev_t *t = arg;
    if (t->failed)
        return wse_err(WSYNC_ERR_PEER_LOST, "TP rank %d: the NCCL communicator was aborted",
                       t->e->p.tp_rank);
    return nccl_settle(t, ncclAllReduce(x, x, n, ncclFloat32, ncclSum, t->comm,
                                        (cudaStream_t)wse_cuda_stream(t->e->cuda)),
                       "ncclAllReduce");
}

static wsync_status_t nccl_allgather(void *arg, const float *in, size_t n, float *out)
{
    wse_tpdev_t *t = arg;
    if (t->failed)
        return wse_err(WSYNC_ERR_PEER_LOST, "TP rank %d: the NCCL communicator was aborted",
                       t->e->p.tp_rank);
    return nccl_settle(t, ncclAllGather(in, out, n, ncclFloat32, t->comm,
                                        (cudaStream_t)wse_cuda_stream(t->e->cuda)),
                       "ncclAllGather");
}

static wsync_status_t nccl_check(void *arg)
{
    wse_tpdev_t *t = arg;
    ncclResult_t r = ncclSuccess;
    wsync_status_t st;

    if ((st = liveness(t)) != WSYNC_OK)
        return st;
    if (t->comm != NULL && ncclCommGetAsyncError(t->comm, &r) == ncclSuccess &&
        r != ncclSuccess && r != ncclInProgress) {
        st = nccl_fail(t, "ncclCommGetAsyncError", r);
        nccl_abort(t);
        return st;
    }
    return WSYNC_OK;
}

#endif

/* ---- setup ----------------------------------------------------------------------------------- */

/* What each rank tells the others at setup. */
typedef struct {
    int32_t gpu;
    int32_t ok;            /* rank 0: the id is valid */
    char id[128];          /* ncclUniqueId (rank 0) */
} hello_t;

static wsync_status_t setup(wse_tpdev_t *t)
{
    wsync_engine_t *e = t->e;
    const int rank = e->p.tp_rank, tp = e->p.tp_size;
    hello_t mine, all[WSYNC_ENGINE_MAX_TP];
    const char *why = NULL;
    long long t0 = now_ms();
    wsync_status_t st;

    memset(&mine, 0, sizeof(mine));
    mine.gpu = wse_cuda_gpu(e->cuda);
#if WSYNC_HAVE_NCCL
    _Static_assert(sizeof(ncclUniqueId) <= sizeof(mine.id), "ncclUniqueId is larger than 128");
    if (t->want_nccl && rank == 0) {
        ncclUniqueId id;
        ncclResult_t r;
        setenv("NCCL_NVLS_ENABLE", "0", 0);   /* NVLink multicast off on shared hosts */
        r = ncclGetUniqueId(&id);
        if (r == ncclSuccess) {
            memcpy(mine.id, &id, sizeof(id));
            mine.ok = 1;
        } else {
            fprintf(stderr, "wsync engine: TP rank 0: ncclGetUniqueId: %s (%s): the TP "
                    "all-reduce goes through host shared memory\n", ncclGetErrorString(r),
                    ncclGetLastError(NULL));
        }
    }
#endif
    if ((st = wse_comm_allgather(e->p.comm, rank, &mine, sizeof(mine), all)) != WSYNC_OK)
        return st;
    t->use_nccl = 0;
    if (!t->want_nccl)
        why = WSYNC_HAVE_NCCL ? "WSYNC_ENGINE_ALLREDUCE=shm" : "built without NCCL";
    else if (!all[0].ok)
        why = "ncclGetUniqueId failed on TP rank 0";
    for (int r = 0; r < tp && why == NULL; r++)
        for (int k = 0; k < r && why == NULL; k++)
            if (all[r].gpu == all[k].gpu)
                why = "two TP ranks share a GPU";
#if WSYNC_HAVE_NCCL
    if (why == NULL) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        ncclUniqueId id;
        ncclResult_t r;
        setenv("NCCL_NVLS_ENABLE", "0", 0);
        cfg.blocking = 0;
        memcpy(&id, all[0].id, sizeof(id));
        if ((st = wse_cuda_enter(e->cuda)) != WSYNC_OK)
            return st;
        r = ncclCommInitRankConfig(&t->comm, tp, id, rank, &cfg);
        if (r != ncclSuccess && r != ncclInProgress) {
            st = nccl_fail(t, "ncclCommInitRankConfig", r);
            nccl_abort(t);
            return st;
        }
        if (r == ncclInProgress && ncclCommGetAsyncError(t->comm, &r) != ncclSuccess)
            r = ncclInternalError;
        if ((st = nccl_settle(t, r, "ncclCommInitRankConfig")) != WSYNC_OK)
            return st;
        t->use_nccl = 1;
    }
#endif
    t->ready = 1;
    wse_info("TP rank %d of %d on GPU %d (%s): all-reduce through %s%s%s (set up in %lld ms)",
             rank, tp, wse_cuda_gpu(e->cuda), wse_cuda_gpu_name(e->cuda),
             t->use_nccl ? "NCCL" : "host shared memory", why ? ": " : "", why ? why : "",
             now_ms() - t0);
    return WSYNC_OK;
}

wsync_status_t wse_tpdev_coll(wse_tpdev_t *t, wse_cuda_coll_t *coll)
{
    wsync_status_t st;

    if (!t->ready && (st = setup(t)) != WSYNC_OK)
        return st;
    coll->arg = t;
    coll->timeout_ms = wse_comm_timeout_ms(t->e->p.comm);
#if WSYNC_HAVE_NCCL
    if (t->use_nccl) {
        coll->allreduce = nccl_allreduce;
        coll->allgather = nccl_allgather;
        coll->check = nccl_check;
        return WSYNC_OK;
    }
#endif
    coll->allreduce = shm_allreduce;
    coll->allgather = shm_allgather;
    coll->check = shm_check;
    return WSYNC_OK;
}

void wse_tpdev_free(wse_tpdev_t *t)
{
    if (t == NULL)
        return;
#if WSYNC_HAVE_NCCL
    if (t->comm != NULL && !t->failed) {
        /* a non-blocking communicator may still be finalizing: destroy waits for it */
        ncclResult_t r = ncclCommFinalize(t->comm), a = r;
        long long deadline = now_ms() + 10000;
        while (a == ncclSuccess || a == ncclInProgress) {
            if (ncclCommGetAsyncError(t->comm, &a) != ncclSuccess || a != ncclInProgress ||
                now_ms() > deadline)
                break;
            struct timespec ts = {0, 100 * 1000};
            nanosleep(&ts, NULL);
        }
        if (a == ncclSuccess)
            ncclCommDestroy(t->comm);
        else
            ncclCommAbort(t->comm);
    }
#endif
    free(t->host);
    free(t);
}
