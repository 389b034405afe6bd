/* The TP communicator: one anonymous shared mapping made before fork, holding a barrier (an
 * arrival counter and a generation word that waiters sleep on with futex) and two sets of
 * per-rank slots used alternately, so that each all-reduce costs one barrier: a rank writes set
 * k % 2 for op k only after barrier k-1, which every rank passed after reading set (k-2) % 2.
 * Every wait has a deadline and checks whether a peer process is gone, so nothing hangs. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/internal.h"

#define DEFAULT_TIMEOUT_MS 120000
#define SPIN 4000
#define LIVENESS_MS 50

typedef struct {
    _Atomic uint32_t arrived;
    _Atomic uint32_t generation;
    _Atomic uint32_t aborted;
    _Atomic int32_t pids[WSYNC_ENGINE_MAX_TP];
    char why[512];
} comm_head_t;

struct wsync_engine_comm {
    comm_head_t *head;
    uint8_t *slots;         /* [2][tp][slot_bytes] */
    size_t slot_bytes;
    size_t map_len;
    int tp;
    int timeout_ms;
    uint64_t ops;           /* this process's count of slot operations */
    pid_t creator;
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

wsync_status_t wsync_engine_comm_create(int tp, const wsync_model_config_t *cfg, int64_t vocab_pad,
                                        int timeout_ms, wsync_engine_comm_t **out)
{
    wsync_engine_comm_t *c;
    size_t floats, head = (sizeof(comm_head_t) + 63) / 64 * 64;
    int64_t pad = vocab_pad > 0 ? vocab_pad : 64, vp;
    void *map;

    if (cfg == NULL || out == NULL)
        return wse_err(WSYNC_ERR_INVALID, "wsync_engine_comm_create: NULL argument");
    if (tp < 1 || tp > WSYNC_ENGINE_MAX_TP)
        return wse_err(WSYNC_ERR_INVALID, "TP size %d is outside [1, %d]", tp, WSYNC_ENGINE_MAX_TP);
    if (cfg->hidden_size < 1 || cfg->vocab_size < 1)
        return wse_err(WSYNC_ERR_CONFIG, "hidden_size and vocab_size must be >= 1");
    vp = (cfg->vocab_size + pad - 1) / pad * pad;
    floats = (size_t)(cfg->hidden_size > vp / tp + 1 ? cfg->hidden_size : vp / tp + 1);
    if (floats < 64)
        floats = 64;   /* room for the small agreements (versions, a CUDA engine's NCCL id) */
    c = calloc(1, sizeof(*c));
    if (c == NULL)
        return wse_err(WSYNC_ERR_NOMEM, "no memory for a communicator");
    c->slot_bytes = (floats * sizeof(float) + 63) / 64 * 64;
    c->tp = tp;
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : DEFAULT_TIMEOUT_MS;
    c->map_len = head + 2 * (size_t)tp * c->slot_bytes;
    map = mmap(NULL, c->map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) {
        size_t len = c->map_len;
        free(c);
        return wse_err(WSYNC_ERR_NOMEM, "cannot map %zu bytes of shared memory for TP %d: %s",
                       len, tp, strerror(errno));
    }
    c->head = map;
    c->slots = (uint8_t *)map + head;
    c->creator = getpid();
    *out = c;
    return WSYNC_OK;
}

void wsync_engine_comm_free(wsync_engine_comm_t *c)
{
    if (c == NULL)
        return;
    munmap(c->head, c->map_len);
    free(c);
}

void wsync_engine_comm_abort(wsync_engine_comm_t *c, const char *why)
{
    uint32_t expected = 0;
    if (c == NULL)
        return;
    if (atomic_compare_exchange_strong(&c->head->aborted, &expected, 1u)) {
        snprintf(c->head->why, sizeof(c->head->why), "%s", why != NULL ? why : "aborted");
        atomic_store(&c->head->aborted, 2u);   /* why is complete */
    }
    atomic_fetch_add(&c->head->generation, 0x10000u);   /* wake sleepers; generations differ */
    syscall(SYS_futex, &c->head->generation, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

size_t wse_comm_slot_bytes(const wsync_engine_comm_t *c)
{
    return c->slot_bytes;
}

int wse_comm_timeout_ms(const wsync_engine_comm_t *c)
{
    return c->timeout_ms;
}

wsync_status_t wse_comm_join(wsync_engine_comm_t *c, int rank)
{
    if (rank < 0 || rank >= c->tp)
        return wse_err(WSYNC_ERR_INVALID, "rank %d outside TP %d", rank, c->tp);
    atomic_store(&c->head->pids[rank], (int32_t)getpid());
    return WSYNC_OK;
}

/* A process that exited is gone even while still a zombie; /proc says which. */
static int process_gone(pid_t pid)
{
    char path[64], buf[256];
    FILE *f;
    char *p;
    int gone = 1;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    if (f == NULL)
        return kill(pid, 0) != 0 && errno == ESRCH;
    if (fgets(buf, sizeof(buf), f) != NULL && (p = strrchr(buf, ')')) != NULL && p[1] == ' ')
        gone = p[2] == 'Z' || p[2] == 'X' || p[2] == 'x';
    fclose(f);
    return gone;
}

static wsync_status_t aborted_error(wsync_engine_comm_t *c, int rank)
{
    for (int i = 0; i < 1000 && atomic_load(&c->head->aborted) == 1u; i++)
        sched_yield();
    return wse_err(WSYNC_ERR_PEER_LOST, "TP rank %d: the group was aborted: %s", rank,
                   c->head->why);
}

wsync_status_t wse_comm_barrier(wsync_engine_comm_t *c, int rank)
{
    comm_head_t *h = c->head;
    uint32_t gen = atomic_load(&h->generation);
    int64_t start, deadline, next_check;

    if (atomic_load(&h->aborted))
        return aborted_error(c, rank);
    if (atomic_fetch_add(&h->arrived, 1u) + 1u == (uint32_t)c->tp) {
        atomic_store(&h->arrived, 0u);
        atomic_fetch_add(&h->generation, 1u);
        syscall(SYS_futex, &h->generation, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
        return WSYNC_OK;
    }
    for (int i = 0; i < SPIN; i++) {
        if (atomic_load_explicit(&h->generation, memory_order_acquire) != gen)
            goto passed;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    start = now_ms();
    deadline = start + c->timeout_ms;
    next_check = start + LIVENESS_MS;
    for (;;) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        int64_t t;
        if (atomic_load(&h->generation) != gen)
            goto passed;
        syscall(SYS_futex, &h->generation, FUTEX_WAIT, gen, &ts, NULL, 0);
        if (atomic_load(&h->generation) != gen)
            goto passed;
        t = now_ms();
        if (t >= next_check) {
            next_check = t + LIVENESS_MS;
            for (int r = 0; r < c->tp; r++) {
                pid_t pid = atomic_load(&h->pids[r]);
                if (r == rank || pid <= 0 || !process_gone(pid))
                    continue;
                if (atomic_load(&h->generation) != gen)
                    goto passed;   /* it arrived, then left: not a failure of this barrier */
                char why[160];
                snprintf(why, sizeof(why), "TP rank %d (pid %d) exited", r, (int)pid);
                wsync_engine_comm_abort(c, why);
                return wse_err(WSYNC_ERR_PEER_LOST, "TP rank %d: %s", rank, why);
            }
        }
        if (t >= deadline) {
            char why[160];
            snprintf(why, sizeof(why), "TP rank %d waited %d ms for its peers at a barrier",
                     rank, c->timeout_ms);
            wsync_engine_comm_abort(c, why);
            return wse_err(WSYNC_ERR_TIMEOUT, "%s", why);
        }
    }
passed:
    if (atomic_load(&h->aborted))
        return aborted_error(c, rank);
    return WSYNC_OK;
}

wsync_status_t wse_comm_check(wsync_engine_comm_t *c, int rank)
{
    if (atomic_load(&c->head->aborted))
        return aborted_error(c, rank);
    for (int r = 0; r < c->tp; r++) {
        pid_t pid = atomic_load(&c->head->pids[r]);
        if (r == rank || pid <= 0 || !process_gone(pid))
            continue;
        char why[160];
        snprintf(why, sizeof(why), "TP rank %d (pid %d) exited", r, (int)pid);
        wsync_engine_comm_abort(c, why);
        return wse_err(WSYNC_ERR_PEER_LOST, "TP rank %d: %s", rank, why);
    }
    return WSYNC_OK;
}

static uint8_t *slot(wsync_engine_comm_t *c, uint64_t op, int rank)
{
    return c->slots + ((size_t)(op & 1) * (size_t)c->tp + (size_t)rank) * c->slot_bytes;
}

wsync_status_t wse_comm_allreduce(wsync_engine_comm_t *c, int rank, float *x, size_t n)
{
    uint64_t op = c->ops++;
    wsync_status_t st;

    if (n * sizeof(float) > c->slot_bytes)
        return wse_err(WSYNC_ERR_INTERNAL, "all-reduce of %zu floats exceeds the slot", n);
    memcpy(slot(c, op, rank), x, n * sizeof(float));
    if ((st = wse_comm_barrier(c, rank)) != WSYNC_OK)
        return st;
    const float *s0 = (const float *)slot(c, op, 0);
    for (size_t i = 0; i < n; i++)
        x[i] = s0[i];
    for (int r = 1; r < c->tp; r++) {
        const float *sr = (const float *)slot(c, op, r);
        for (size_t i = 0; i < n; i++)
            x[i] += sr[i];
    }
    return WSYNC_OK;
}

wsync_status_t wse_comm_allgather(wsync_engine_comm_t *c, int rank, const void *in, size_t bytes,
                                  void *out)
{
    uint64_t op = c->ops++;
    wsync_status_t st;

    if (bytes > c->slot_bytes)
        return wse_err(WSYNC_ERR_INTERNAL, "all-gather of %zu bytes exceeds the slot", bytes);
    memcpy(slot(c, op, rank), in, bytes);
    if ((st = wse_comm_barrier(c, rank)) != WSYNC_OK)
        return st;
    for (int r = 0; r < c->tp; r++)
        memcpy((uint8_t *)out + (size_t)r * bytes, slot(c, op, r), bytes);
    return WSYNC_OK;
}

/* ---- launching the ranks ------------------------------------------------------------------ */

wsync_status_t wsync_engine_launch(int tp, wsync_engine_comm_t *comm, wsync_engine_rank_fn fn,
                                   void *arg, int timeout_s, int *codes)
{
    pid_t pids[WSYNC_ENGINE_MAX_TP];
    int done[WSYNC_ENGINE_MAX_TP] = {0}, code[WSYNC_ENGINE_MAX_TP], left, first_bad = -1;
    int64_t deadline;

    if (fn == NULL || tp < 1 || tp > WSYNC_ENGINE_MAX_TP || (tp > 1 && comm == NULL))
        return wse_err(WSYNC_ERR_INVALID, "wsync_engine_launch: bad argument (tp %d)", tp);
    fflush(NULL);
    for (int r = 0; r < tp; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            wsync_engine_comm_abort(comm, "fork failed");
            for (int k = 0; k < r; k++) {
                kill(pids[k], SIGKILL);
                waitpid(pids[k], NULL, 0);
            }
            return wse_err(WSYNC_ERR_IO, "fork: %s", strerror(errno));
        }
        if (pids[r] == 0) {
            int rc = fn(r, tp, comm, arg);
            fflush(NULL);
            _exit(rc);
        }
        /* a rank that dies before it joins must still be noticed by the others */
        if (comm != NULL)
            atomic_store(&comm->head->pids[r], (int32_t)pids[r]);
    }
    deadline = now_ms() + (int64_t)(timeout_s > 0 ? timeout_s : 3600) * 1000;
    left = tp;
    while (left > 0) {
        int status, progressed = 0;
        for (int r = 0; r < tp; r++) {
            if (done[r] || waitpid(pids[r], &status, WNOHANG) != pids[r])
                continue;
            done[r] = 1;
            left--;
            progressed = 1;
            code[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            if (code[r] != 0 && first_bad < 0) {
                char why[128];
                first_bad = r;
                snprintf(why, sizeof(why), "TP rank %d (pid %d) %s %d", r, (int)pids[r],
                         WIFEXITED(status) ? "exited with status" : "was killed by signal",
                         WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
                wsync_engine_comm_abort(comm, why);
            }
        }
        if (left == 0)
            break;
        if (now_ms() > deadline) {
            for (int r = 0; r < tp; r++) {
                if (done[r])
                    continue;
                kill(pids[r], SIGKILL);
                waitpid(pids[r], NULL, 0);
                code[r] = -1;
                if (first_bad < 0)
                    first_bad = r;
            }
            wsync_engine_comm_abort(comm, "deadline passed");
            break;
        }
        if (!progressed)
            usleep(2000);
    }
    if (codes != NULL)
        memcpy(codes, code, (size_t)tp * sizeof(int));
    if (first_bad >= 0)
        return wse_err(WSYNC_ERR_PEER_LOST, "TP rank %d failed (exit code %d)", first_bad,
                       code[first_bad]);
    return WSYNC_OK;
}
