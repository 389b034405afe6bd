/* nccl transport: send/recv and broadcast groups between GPUs, on one node or many. The run-time
 * probe, and the communicator helpers of transports/nccl.h that the nccl scheme drives. */
#include "transports/nccl.h"
#include "transports/transport.h"
#include "wsync_build_config.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "core/status.h"
#include "core/util.h"

#if WSYNC_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

/* NCCL encodes versions as X*1000+Y*100+Z up to 2.8 and X*10000+Y*100+Z from 2.9 on. */
static void nccl_version_text(int code, char *buf, size_t len)
{
    if (code >= 10000)
        snprintf(buf, len, "%d.%d.%d", code / 10000, (code / 100) % 100, code % 100);
    else
        snprintf(buf, len, "%d.%d.%d", code / 1000, (code / 100) % 10, code % 100);
}

static int nccl_probe(char *reason, size_t reason_len)
{
    int code = 0;
    ncclResult_t res = ncclGetVersion(&code);
    if (res != ncclSuccess) {
        snprintf(reason, reason_len, "ncclGetVersion failed: %s", ncclGetErrorString(res));
        return 0;
    }
    char version[32];
    nccl_version_text(code, version, sizeof(version));

    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count <= 0) {
        snprintf(reason, reason_len, "NCCL %s, but no CUDA device: %s", version,
                 err != cudaSuccess ? cudaGetErrorString(err) : "the driver reports 0 devices");
        return 0;
    }
    snprintf(reason, reason_len, "NCCL %s, %d CUDA device%s", version, count,
             count == 1 ? "" : "s");
    return 1;
}

struct wsync_nccl_comm {
    ncclComm_t comm;
    char label[96];
};

int wsync_nccl_compiled(void)
{
    return 1;
}

static wsync_status_t nccl_fail(const wsync_nccl_comm_t *c, const char *call, ncclResult_t res)
{
    const char *last = ncclGetLastError(c != NULL ? c->comm : NULL);
    return wsync_err(WSYNC_ERR_DEVICE, "%s%s%s: %s%s%s", c != NULL ? c->label : "",
                     c != NULL ? ": " : "", call, ncclGetErrorString(res),
                     last != NULL && last[0] ? ": " : "", last != NULL ? last : "");
}

/* NVLink SHARP needs multicast objects the lent machines refuse: off unless the environment
 * asks for it. Before NCCL's first initialisation, which may read its parameters once. */
static void nccl_env_defaults(void)
{
    setenv("NCCL_NVLS_ENABLE", "0", 0);
}

wsync_status_t wsync_nccl_unique_id(uint8_t id[WSYNC_NCCL_ID_BYTES])
{
    ncclUniqueId u;
    ncclResult_t res;

    nccl_env_defaults();
    res = ncclGetUniqueId(&u);

    _Static_assert(sizeof(u.internal) == WSYNC_NCCL_ID_BYTES, "NCCL unique id size");
    if (res != ncclSuccess)
        return nccl_fail(NULL, "ncclGetUniqueId", res);
    memcpy(id, u.internal, WSYNC_NCCL_ID_BYTES);
    return WSYNC_OK;
}

static void nap(int64_t *spins);

static wsync_nccl_comm_t *comm_new(const char *label)
{
    wsync_nccl_comm_t *c = calloc(1, sizeof(*c));
    if (c != NULL)
        snprintf(c->label, sizeof(c->label), "%s", label != NULL ? label : "nccl");
    return c;
}

wsync_status_t wsync_nccl_comm_init(const uint8_t id[WSYNC_NCCL_ID_BYTES], int nranks, int rank,
                                    const char *label, wsync_nccl_comm_t **out)
{
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclUniqueId u;
    wsync_nccl_comm_t *c;
    ncclResult_t res;
    char call[96];

    nccl_env_defaults();
    c = comm_new(label);
    if (c == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "no memory for an NCCL communicator");
    memcpy(u.internal, id, WSYNC_NCCL_ID_BYTES);
    config.blocking = 0;
    res = ncclCommInitRankConfig(&c->comm, nranks, u, rank, &config);
    if (res != ncclSuccess && res != ncclInProgress) {
        snprintf(call, sizeof(call), "ncclCommInitRankConfig(rank %d of %d)", rank, nranks);
        wsync_status_t st = nccl_fail(c, call, res);
        if (c->comm != NULL)
            ncclCommAbort(c->comm);
        free(c);
        return st;
    }
    *out = c;
    return WSYNC_OK;
}

wsync_status_t wsync_nccl_comm_split(wsync_nccl_comm_t *parent, int color, int key,
                                     const char *label, int64_t deadline_ms,
                                     wsync_nccl_check_fn check, void *arg,
                                     wsync_nccl_comm_t **out)
{
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    wsync_nccl_comm_t *c;
    ncclResult_t res;
    wsync_status_t st;
    char call[96];
    int64_t spins = 0, t0 = wsync_now_ms();

    *out = NULL;
    c = comm_new(label);
    if (c == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "no memory for an NCCL communicator");
    config.blocking = 0;
    config.splitShare = 1;
    snprintf(call, sizeof(call), "ncclCommSplit(color %d, key %d)", color, key);
    res = ncclCommSplit(parent->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &c->comm,
                        &config);
    if (res != ncclSuccess && res != ncclInProgress) {
        st = nccl_fail(parent, call, res);
        free(c);
        return st;
    }
    /* Non-blocking, NCCL sets c->comm to NULL now and stores the child's handle there (NULL for
     * NCCL_SPLIT_NOCOLOR) only when its asynchronous split job ends, a job that runs on the
     * parent. So c must stay allocated until then: wait for the parent, then for the handle. On
     * a failure or timeout c is deliberately leaked (the job may still write to it); the caller
     * aborts the parent. */
    if ((st = wsync_nccl_wait(parent, deadline_ms, call, check, arg)) != WSYNC_OK)
        return st;
    while (color >= 0 && __atomic_load_n(&c->comm, __ATOMIC_ACQUIRE) == NULL) {
        if (check != NULL && (st = check(arg)) != WSYNC_OK)
            return st;
        if (wsync_now_ms() >= deadline_ms)
            return wsync_err(WSYNC_ERR_TIMEOUT, "%s: %s: no child communicator within %lld ms",
                             parent->label, call, (long long)(wsync_now_ms() - t0));
        nap(&spins);
    }
    if (color < 0) {
        free(c);
        return WSYNC_OK;
    }
    if ((st = wsync_nccl_wait(c, deadline_ms, call, check, arg)) != WSYNC_OK) {
        wsync_nccl_abort(c);
        return st;
    }
    *out = c;
    return WSYNC_OK;
}

wsync_status_t wsync_nccl_check(wsync_nccl_comm_t *c)
{
    ncclResult_t state = ncclSuccess, res;

    if (c == NULL || c->comm == NULL)
        return WSYNC_OK;
    res = ncclCommGetAsyncError(c->comm, &state);
    if (res != ncclSuccess)
        return nccl_fail(c, "ncclCommGetAsyncError", res);
    if (state != ncclSuccess && state != ncclInProgress)
        return nccl_fail(c, "asynchronous error", state);
    return WSYNC_OK;
}

static void nap(int64_t *spins)
{
    /* spin briefly for the common fast case, then sleep: enqueueing usually takes microseconds,
     * a stuck peer may take seconds */
    if (++*spins < 1000)
        return;
    struct timespec ts = {0, *spins < 20000 ? 50000 : 500000};
    nanosleep(&ts, NULL);
}

wsync_status_t wsync_nccl_wait(wsync_nccl_comm_t *c, int64_t deadline_ms, const char *what,
                               wsync_nccl_check_fn check, void *arg)
{
    int64_t spins = 0, t0 = wsync_now_ms();

    if (c == NULL || c->comm == NULL)
        return WSYNC_OK;
    for (;;) {
        ncclResult_t state = ncclInProgress, res = ncclCommGetAsyncError(c->comm, &state);
        if (res != ncclSuccess)
            return nccl_fail(c, "ncclCommGetAsyncError", res);
        if (state == ncclSuccess)
            return WSYNC_OK;
        if (state != ncclInProgress) {
            char call[160];
            snprintf(call, sizeof(call), "%s", what);
            return nccl_fail(c, call, state);
        }
        if (check != NULL) {
            wsync_status_t st = check(arg);
            if (st != WSYNC_OK)
                return st;
        }
        if (wsync_now_ms() >= deadline_ms)
            return wsync_err(WSYNC_ERR_TIMEOUT, "%s: %s did not finish within %lld ms", c->label,
                             what, (long long)(wsync_now_ms() - t0));
        nap(&spins);
    }
}

wsync_status_t wsync_nccl_group_start(void)
{
    ncclResult_t res = ncclGroupStart();
    return res == ncclSuccess ? WSYNC_OK : nccl_fail(NULL, "ncclGroupStart", res);
}

wsync_status_t wsync_nccl_group_end(wsync_nccl_comm_t *c)
{
    ncclResult_t res = ncclGroupEnd();
    return res == ncclSuccess || res == ncclInProgress ? WSYNC_OK
                                                       : nccl_fail(c, "ncclGroupEnd", res);
}

wsync_status_t wsync_nccl_send(wsync_nccl_comm_t *c, const void *buf, size_t bytes, int peer,
                               void *stream)
{
    ncclResult_t res = ncclSend(buf, bytes, ncclUint8, peer, c->comm, (cudaStream_t)stream);
    char call[128];

    if (res == ncclSuccess || res == ncclInProgress)
        return WSYNC_OK;
    snprintf(call, sizeof(call), "ncclSend(%zu bytes to rank %d)", bytes, peer);
    return nccl_fail(c, call, res);
}

wsync_status_t wsync_nccl_recv(wsync_nccl_comm_t *c, void *buf, size_t bytes, int peer,
                               void *stream)
{
    ncclResult_t res = ncclRecv(buf, bytes, ncclUint8, peer, c->comm, (cudaStream_t)stream);
    char call[128];

    if (res == ncclSuccess || res == ncclInProgress)
        return WSYNC_OK;
    snprintf(call, sizeof(call), "ncclRecv(%zu bytes from rank %d)", bytes, peer);
    return nccl_fail(c, call, res);
}

wsync_status_t wsync_nccl_bcast(wsync_nccl_comm_t *c, const void *send, void *recv, size_t bytes,
                                int root, void *stream)
{
    ncclResult_t res = ncclBroadcast(send, recv, bytes, ncclUint8, root, c->comm,
                                     (cudaStream_t)stream);
    char call[128];

    if (res == ncclSuccess || res == ncclInProgress)
        return WSYNC_OK;
    snprintf(call, sizeof(call), "ncclBroadcast(%zu bytes from rank %d)", bytes, root);
    return nccl_fail(c, call, res);
}

wsync_status_t wsync_nccl_allgather(wsync_nccl_comm_t *c, const void *send, void *recv,
                                    size_t bytes, void *stream)
{
    ncclResult_t res = ncclAllGather(send, recv, bytes, ncclUint8, c->comm, (cudaStream_t)stream);
    char call[128];

    if (res == ncclSuccess || res == ncclInProgress)
        return WSYNC_OK;
    snprintf(call, sizeof(call), "ncclAllGather(%zu bytes a rank)", bytes);
    return nccl_fail(c, call, res);
}

/* The aborts of wsync_nccl_abort_all, on a detached thread: ncclCommAbort can block for good
 * (it may wait on kernels or proxies tied to a dead peer), and a failing caller must not. */
typedef struct {
    atomic_int done;                 /* every abort returned */
    atomic_int refs;                 /* the caller and the thread; the last one frees */
    int device;
    int n;
    wsync_nccl_comm_t *comms[];
} abort_job_t;

static void abort_job_release(abort_job_t *job)
{
    if (atomic_fetch_sub(&job->refs, 1) == 1)
        free(job);
}

static void *abort_main(void *arg)
{
    abort_job_t *job = arg;

    if (job->device >= 0)
        cudaSetDevice(job->device);
    for (int i = 0; i < job->n; i++) {
        wsync_nccl_comm_t *c = job->comms[i];
        int64_t t0 = wsync_now_ms();
        if (c->comm != NULL) {
            ncclResult_t res = ncclCommAbort(c->comm);
            if (res != ncclSuccess && res != ncclInProgress)
                WSYNC_LOG_W("%s: ncclCommAbort: %s", c->label, ncclGetErrorString(res));
            else
                WSYNC_LOG_I("%s: communicator aborted in %.3f s", c->label,
                            (double)(wsync_now_ms() - t0) / 1e3);
        }
        free(c);   /* NCCL frees the communicator in ncclCommAbort, even when in progress */
    }
    atomic_store(&job->done, 1);
    abort_job_release(job);
    return NULL;
}

int wsync_nccl_abort_all(wsync_nccl_comm_t *const *comms, int n, int64_t deadline_ms)
{
    abort_job_t *job;
    pthread_attr_t attr;
    pthread_t tid;
    int k = 0, ok;

    job = calloc(1, sizeof(*job) + (size_t)(n > 0 ? n : 1) * sizeof(job->comms[0]));
    if (job == NULL) {
        WSYNC_LOG_W("nccl: no memory to abort %d communicators: they are left as they are", n);
        return 0;
    }
    for (int i = 0; i < n; i++)
        if (comms[i] != NULL)
            job->comms[k++] = comms[i];
    job->n = k;
    if (k == 0) {
        free(job);
        return 1;
    }
    if (cudaGetDevice(&job->device) != cudaSuccess)
        job->device = -1;
    atomic_init(&job->done, 0);
    atomic_init(&job->refs, 2);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&tid, &attr, abort_main, job) != 0) {
        pthread_attr_destroy(&attr);
        atomic_store(&job->refs, 1);
        abort_main(job);   /* no thread to be had: abort here, unbounded */
        return 1;
    }
    pthread_attr_destroy(&attr);
    while (!(ok = atomic_load(&job->done)) && wsync_now_ms() < deadline_ms) {
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
    }
    if (!ok)
        WSYNC_LOG_W("deadline passed: ncclCommAbort of %d communicator%s (%s first) did not return "
                    "within the deadline; left to finish on a helper thread (its resources leak "
                    "if it never does)", k, k == 1 ? "" : "s", job->comms[0]->label);
    abort_job_release(job);
    return ok;
}

void wsync_nccl_abort(wsync_nccl_comm_t *c)
{
    if (c == NULL)
        return;
    wsync_nccl_abort_all(&c, 1, wsync_deadline_in(WSYNC_NCCL_ABORT_MS));
}

void wsync_nccl_destroy(wsync_nccl_comm_t *c, int64_t deadline_ms)
{
    ncclResult_t res;

    if (c == NULL)
        return;
    if (c->comm == NULL) {
        free(c);
        return;
    }
    res = ncclCommFinalize(c->comm);
    if (res != ncclSuccess && res != ncclInProgress) {
        WSYNC_LOG_W("%s: ncclCommFinalize: %s; aborting instead", c->label, ncclGetErrorString(res));
        wsync_nccl_abort(c);
        return;
    }
    if (wsync_nccl_wait(c, deadline_ms, "ncclCommFinalize", NULL, NULL) != WSYNC_OK) {
        WSYNC_LOG_W("%s; aborting instead", wsync_last_error());
        wsync_nccl_abort(c);
        return;
    }
    res = ncclCommDestroy(c->comm);
    if (res != ncclSuccess && res != ncclInProgress)
        WSYNC_LOG_W("%s: ncclCommDestroy: %s", c->label, ncclGetErrorString(res));
    free(c);
}

const char *wsync_nccl_label(const wsync_nccl_comm_t *c)
{
    return c != NULL ? c->label : "nccl";
}

#define NCCL_COMPILED 1
#define NCCL_CAPS (WSYNC_CAP_CUDA_MEM | WSYNC_CAP_SAME_NODE | WSYNC_CAP_CROSS_NODE | \
                   WSYNC_CAP_COLLECTIVE)
#define NCCL_GBPS 300.0
#else
static int nccl_probe(char *reason, size_t reason_len)
{
    snprintf(reason, reason_len,
             "not compiled in: configure with -DWSYNC_WITH_NCCL=ON (needs nccl.h and libnccl, "
             "and CUDA)");
    return 0;
}

#define NO_NCCL() wsync_err(WSYNC_ERR_UNSUPPORTED, "built without NCCL")

int wsync_nccl_compiled(void)
{
    return 0;
}

wsync_status_t wsync_nccl_unique_id(uint8_t id[WSYNC_NCCL_ID_BYTES])
{
    (void)id;
    return NO_NCCL();
}

wsync_status_t wsync_nccl_comm_init(const uint8_t id[WSYNC_NCCL_ID_BYTES], int nranks, int rank,
                                    const char *label, wsync_nccl_comm_t **comm)
{
    (void)id, (void)nranks, (void)rank, (void)label, (void)comm;
    return NO_NCCL();
}

wsync_status_t wsync_nccl_comm_split(wsync_nccl_comm_t *parent, int color, int key,
                                     const char *label, int64_t deadline_ms,
                                     wsync_nccl_check_fn check, void *arg,
                                     wsync_nccl_comm_t **child)
{
    (void)parent, (void)color, (void)key, (void)label, (void)deadline_ms, (void)check, (void)arg;
    *child = NULL;
    return NO_NCCL();
}

wsync_status_t wsync_nccl_wait(wsync_nccl_comm_t *comm, int64_t deadline_ms, const char *what,
                               wsync_nccl_check_fn check, void *arg)
{
    (void)comm, (void)deadline_ms, (void)what, (void)check, (void)arg;
    return NO_NCCL();
}

wsync_status_t wsync_nccl_check(wsync_nccl_comm_t *comm)
{
    (void)comm;
    return WSYNC_OK;
}

wsync_status_t wsync_nccl_group_start(void)
{
    return NO_NCCL();
}

wsync_status_t wsync_nccl_group_end(wsync_nccl_comm_t *comm)
{
    (void)comm;
    return NO_NCCL();
}

wsync_status_t wsync_nccl_send(wsync_nccl_comm_t *comm, const void *buf, size_t bytes, int peer,
                               void *stream)
{
    (void)comm, (void)buf, (void)bytes, (void)peer, (void)stream;
    return NO_NCCL();
}

wsync_status_t wsync_nccl_recv(wsync_nccl_comm_t *comm, void *buf, size_t bytes, int peer,
                               void *stream)
{
    (void)comm, (void)buf, (void)bytes, (void)peer, (void)stream;
    return NO_NCCL();
}

wsync_status_t wsync_nccl_bcast(wsync_nccl_comm_t *comm, const void *send, void *recv,
                                size_t bytes, int root, void *stream)
{
    (void)comm, (void)send, (void)recv, (void)bytes, (void)root, (void)stream;
    return NO_NCCL();
}

wsync_status_t wsync_nccl_allgather(wsync_nccl_comm_t *comm, const void *send, void *recv,
                                    size_t bytes, void *stream)
{
    (void)comm, (void)send, (void)recv, (void)bytes, (void)stream;
    return NO_NCCL();
}

int wsync_nccl_abort_all(wsync_nccl_comm_t *const *comms, int n, int64_t deadline_ms)
{
    (void)comms, (void)n, (void)deadline_ms;
    return 1;
}

void wsync_nccl_abort(wsync_nccl_comm_t *comm)
{
    (void)comm;
}

void wsync_nccl_destroy(wsync_nccl_comm_t *comm, int64_t deadline_ms)
{
    (void)comm, (void)deadline_ms;
}

const char *wsync_nccl_label(const wsync_nccl_comm_t *comm)
{
    (void)comm;
    return "nccl";
}

#define NCCL_COMPILED 0
#define NCCL_CAPS 0u
#define NCCL_GBPS 0.0
#endif

const wsync_transport_ops_t wsync_transport_nccl = {
    .name = "nccl",
    .compiled = NCCL_COMPILED,
    /* what the nccl scheme moves with it: device memory, within a node or across nodes, by
     * grouped send/recv and broadcast */
    .caps = NCCL_CAPS,
    .est_gbps = NCCL_GBPS,
    .probe = nccl_probe,
};
