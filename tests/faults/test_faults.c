/* The faults suite: every scheme this build has — ipc on host memory, store over UCX, store over
 * libfabric — with one participant of a group of two senders and two receivers made to misbehave
 * through WSYNC_FAULT (core/fault.h): killed, stopped, delayed past the deadline, cut off (a frame
 * dropped), failing, or corrupting what it sends or receives, at each point where that matters.
 * For every case:
 *  - every other participant ends as the case says: with an error whose status is not OK and
 *    whose text names the culprit, within the deadline — or, where the scheme is meant to shrug
 *    the fault off (a store reader's trouble is its own), with every version;
 *  - no process hangs (the parent's deadline), nothing new is left in /dev/shm;
 *  - a receiver reports only versions whose bytes it fully received (checked byte for byte
 *    against the test's own definition of each version), and at the end holds its last committed
 *    version or says it is torn.
 * Corruption with WSYNC_VERIFY=1 is refused with WSYNC_ERR_INTEGRITY naming the param; the same
 * corruption without it goes unseen by the library (the test's own comparison finds it), which
 * is why verification exists.
 *
 * Each case prints one markdown table row, after "MATRIX ", with what each participant saw;
 * docs/fault_matrix.md is `test_faults 2>/dev/null | sed -n 's/^MATRIX //p'`. FAULTS_ONLY=text
 * runs only the cases whose name holds the text ("ipc", "store/ofi commit", "verify").
 *
 * Built a second time with FAULTS_ON_CUDA (tests/gpu/test_faults_cuda, CMakeLists.txt), the same
 * cases run on CUDA memory: every shard and target lives on the process's GPU (process i on GPU i
 * given 4 GPUs, else GPU i mod G), and the schemes are ipc (peer reads over NVLink, or staged
 * buckets) and nccl (one rank per GPU: 4 GPUs). Deadlines are longer there (CUDA and NCCL set up
 * within them, and a survivor's NCCL abort is bounded by the timeout again). After an nccl
 * failure a process leaks its CUDA memory rather than cudaFree it: NCCL's kernels may still wait
 * on the dead peer, and cudaFree would wait for them (wsync.h says the same to users).
 *
 * usage: test_faults [--json PATH]   (PATH: a summary, for tests/gpu/run.sh) */
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/check.h"
#include "tests/support/proc.h"
#include "tests/support/transports.h"
#include "wsync/wsync.h"

#ifdef FAULTS_ON_CUDA
#include <cuda_runtime_api.h>
#define TIMEOUT_MS 3000
#define DELAY "8s"                     /* every delay case: well past every deadline */
#define DELAY_MS 8000
#define LIMIT_MS (2 * TIMEOUT_MS + 2500)   /* + an NCCL abort, bounded by the timeout */
#define CASE_MS 60000
#else
#define TIMEOUT_MS 2000
#define DELAY "5s"
#define DELAY_MS 5000
#define LIMIT_MS (TIMEOUT_MS + 2500)   /* the failing call of a survivor returns within this */
#define CASE_MS 30000                  /* the parent's deadline for a whole case */
#endif
#define HEARTBEAT_MS 200
#define NS 2                       /* senders: 0 hosts the coordinator */
#define NR 2                       /* receivers */
#define NPROCS (NS + NR)
#define NPARAMS 3
#define ROWS 256
#define COLS 1024                  /* bf16: 512 KiB a param, 256 KiB a sender's shard of it */
#define BUCKET (256 * 1024)        /* one shard fills a bucket: 3 buckets, 3 chunks per sender */
#define VERSIONS 3

/* ---- the weights: element i of param p in version v ------------------------------------------ */

static uint16_t value(int p, uint64_t v, size_t i)
{
    uint64_t x = ((uint64_t)(p + 1) << 56) ^ (v << 40) ^ i;
    x = (x ^ (x >> 31)) * 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    return (uint16_t)(x >> 40);
}

static const char *param_name(int p)
{
    static const char *names[NPARAMS] = {"model.layers.0.mlp.up_proj.weight",
                                         "model.layers.0.mlp.down_proj.weight",
                                         "model.layers.0.self_attn.o_proj.weight"};
    return names[p];
}

/* ---- what each participant saw, in memory shared with the parent ---------------------------- */

typedef struct {
    int started;
    int done;                      /* the record is final */
    int gone;                      /* set by the parent: exited or stopped */
    int status;                    /* first failure (WSYNC_OK: none) */
    char text[768];
    long long call_ms;             /* how long the failing call took */
    int versions_ok;               /* versions completed (pushed, or received and checked) */
    int timeouts;                  /* non-fatal WSYNC_ERR_TIMEOUTs along the way */
    uint64_t committed;            /* receivers: wsync_receiver_version at the end */
    int torn;
    unsigned wrong_mask;           /* receivers: bit v: version v reported with wrong bytes */
    int end_state_bad;             /* receivers: not torn, yet the targets are not `committed` */
    int later_ok;                  /* store readers: a version fetched after an error */
} result_t;

typedef struct {
    atomic_int ready;              /* processes set up, before the first version */
    atomic_int have_addr;
    char coord_addr[64];           /* where sender 0's coordinator listens (a port of its own) */
    result_t res[NPROCS];
} shared_t;

static shared_t *shared;

/* ---- one case ----------------------------------------------------------------------------- */

typedef enum { FATE_ALIVE, FATE_KILLED, FATE_STOPPED } fate_t;
/* END_WRONG: ok, with wrong bytes in version 2; END_SOME_WRONG: ok, with or without wrong bytes
 * in version 2, and some participant of the case with them (where the plan decides whom a
 * corrupted buffer reaches) */
typedef enum { END_ERROR, END_OK, END_WRONG, END_SOME_WRONG } end_t;

typedef struct {
    const char *scheme;            /* "ipc" or "store" */
    const char *transport;         /* store: "ucx" or "ofi" */
    int victim;                    /* 0, 1: senders; 2, 3: receivers */
    const char *fault;             /* WSYNC_FAULT of the victim */
    int verify;                    /* WSYNC_VERIFY of everyone */
    fate_t fate;                   /* what becomes of the victim */
    end_t victim_end;              /* a victim that lives: how it ends */
    end_t others_end;              /* how every other participant ends */
    const char *needles;           /* "a|b": an error text must hold one of them (NULL: the
                                      victim's name) */
    int integrity;                 /* errors must be WSYNC_ERR_INTEGRITY (those that occur) */
    const char *note;              /* for the matrix */
    unsigned variant;              /* V_*: other paths through the schemes */
} case_t;

enum {
    V_INPLACE = 1,                 /* senders' shards in wsync_mem_alloc memory (ipc: read in place) */
    V_CAST = 2,                    /* receiver 0's targets are f32: every segment is cast */
    V_SLICE = 4,                   /* receiver 1 takes columns [COLS/2, COLS) only (strided) */
    V_STAGED = 8,                  /* CUDA: shards in cudaMallocAsync memory, which no process
                                      can open: ipc stages them through buckets */
};

static const case_t *cur;
static int g_ngpu;                 /* FAULTS_ON_CUDA: GPUs visible (counted by a child) */

/* ---- where the weights live: host memory, or the process's GPU -------------------------------- */

#ifdef FAULTS_ON_CUDA
#define WMEM_KIND WSYNC_MEM_CUDA

static int gpu_of(int me) { return g_ngpu >= NPROCS ? me : me % g_ngpu; }

static int cuda_ok(cudaError_t e, const char *what)
{
    CHECK_MSG(e == cudaSuccess, "%s: %s", what, cudaGetErrorString(e));
    return e == cudaSuccess;
}

/* This process's GPU, its context made now: before the barrier, not inside a deadline. */
static int wmem_init(int me)
{
    return cuda_ok(cudaSetDevice(gpu_of(me)), "cudaSetDevice") && cuda_ok(cudaFree(NULL), "cudaFree(NULL)");
}
#else
#define WMEM_KIND WSYNC_MEM_HOST
static int gpu_of(int me) { (void)me; return 0; }
static int wmem_init(int me) { (void)me; return 1; }
#endif

/* `bytes` of weights: on the host (how V_INPLACE: from wsync_mem_alloc, which ipc reads in
 * place), or on the GPU (how V_STAGED: from cudaMallocAsync). NULL (and a failed check) when
 * there is none. */
static void *wmem_alloc(wsync_ctx_t *ctx, size_t bytes, unsigned how)
{
    void *p = NULL;
#ifdef FAULTS_ON_CUDA
    (void)ctx;
    if (how & V_STAGED) {
        if (cuda_ok(cudaMallocAsync(&p, bytes, 0), "cudaMallocAsync"))
            cuda_ok(cudaStreamSynchronize(0), "cudaStreamSynchronize");
    } else {
        cuda_ok(cudaMalloc(&p, bytes), "cudaMalloc");
    }
#else
    if (how & V_INPLACE)
        CHECK_OK(wsync_mem_alloc(ctx, bytes, &p));
    else
        p = malloc(bytes);
#endif
    return p;
}

static void wmem_free(wsync_ctx_t *ctx, void *p, unsigned how)
{
    if (p == NULL)
        return;
#ifdef FAULTS_ON_CUDA
    (void)ctx;
    if (how & V_STAGED) {
        cudaFreeAsync(p, 0);
        cudaStreamSynchronize(0);
    } else {
        cudaFree(p);
    }
#else
    if (how & V_INPLACE)
        wsync_mem_free(ctx, p);
    else
        free(p);
#endif
}

static void wmem_put(void *dst, const void *src, size_t bytes)
{
#ifdef FAULTS_ON_CUDA
    cuda_ok(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the GPU");
#else
    memcpy(dst, src, bytes);
#endif
}

static void wmem_get(void *dst, const void *src, size_t bytes)
{
#ifdef FAULTS_ON_CUDA
    cuda_ok(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy from the GPU");
#else
    memcpy(dst, src, bytes);
#endif
}

static void wmem_poison(void *p, size_t bytes)
{
#ifdef FAULTS_ON_CUDA
    cuda_ok(cudaMemset(p, 0xAB, bytes), "cudaMemset");
#else
    memset(p, 0xAB, bytes);
#endif
}

/* After an nccl failure NCCL's kernels may still wait on the dead peer, and cudaFree would wait
 * for them: leave the memory to the process's exit, as wsync.h tells users to. */
static int wmem_must_leak(const result_t *res)
{
    return strcmp(cur->scheme, "nccl") == 0 && res->status != WSYNC_OK;
}

static const char *who(int i, char *buf, size_t len)
{
    snprintf(buf, len, "%s %d", i < NS ? "sender" : "receiver", i < NS ? i : i - NS);
    return buf;
}

static void record_error(result_t *res, wsync_status_t st, long long t0)
{
    if (res->status != WSYNC_OK)
        return;
    res->status = st;
    res->call_ms = proc_now_ms() - t0;
    snprintf(res->text, sizeof(res->text), "%s", wsync_last_error());
}

/* The coordinator's address: sender 0 listens on a port the kernel picks, so that no other
 * program on the machine can hold the port, then tells the others. */
static const char *coordinator(int me)
{
    long long until = proc_now_ms() + 15000;

    if (me == 0)
        return "127.0.0.1:0";
    while (!atomic_load(&shared->have_addr) && proc_now_ms() < until)
        usleep(1000);
    return shared->coord_addr;
}

/* Everyone set up before version 1, so that a slow start never passes for a fault. */
static void barrier(void)
{
    long long until = proc_now_ms() + 15000;

    atomic_fetch_add(&shared->ready, 1);
    while (atomic_load(&shared->ready) < NPROCS && proc_now_ms() < until)
        usleep(2000);
}

static wsync_ctx_t *make_ctx(int me, result_t *res)
{
    wsync_ctx_params_t cp = WSYNC_CTX_PARAMS_INIT;
    wsync_ctx_t *ctx = NULL;
    wsync_status_t st;

    if (me == cur->victim && cur->fault != NULL)
        setenv("WSYNC_FAULT", cur->fault, 1);
    else
        unsetenv("WSYNC_FAULT");
    if (cur->transport != NULL)
        setenv("WSYNC_STORE_TRANSPORT", cur->transport, 1);
    cp.verify = cur->verify;
    st = wsync_ctx_create(&cp, &ctx);
    if (st != WSYNC_OK) {
        record_error(res, st, proc_now_ms());
        return NULL;
    }
    return ctx;
}

static int sender_main(void *arg)
{
    int rank = (int)(intptr_t)arg;
    result_t *res = &shared->res[rank];
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    wsync_sender_t *s = NULL;
    void *shard[NPARAMS] = {NULL};
    int store = strcmp(cur->scheme, "store") == 0;
    size_t n = (size_t)ROWS / NS * COLS;
    uint16_t *next = malloc(n * 2);   /* a shard's next version, made on the host */
    wsync_status_t st;

    check_failures = 0;   /* the parent's, inherited through fork, are not ours */
    res->started = 1;
    wsync_ctx_t *ctx = wmem_init(rank) ? make_ctx(rank, res) : NULL;
    if (ctx == NULL)
        goto out;
    sp.coordinator = coordinator(rank);
    sp.rank = rank;
    sp.nranks = NS;
    sp.nreceivers = NR;
    sp.scheme = cur->scheme;
    sp.bucket_bytes = BUCKET;
    sp.timeout_ms = TIMEOUT_MS;
    sp.heartbeat_ms = HEARTBEAT_MS;
    sp.keep_versions = VERSIONS;   /* readers read every version, in their own time */
    /* the matrix is of the plain data paths (the store would resolve auto to delta versions,
     * whose own corruption cases are test_delta_store's and test_delta_ipc's) */
    sp.delta = "off";
    long long t0 = proc_now_ms();
    st = wsync_sender_create(ctx, &sp, &s);
    if (rank == 0 && st == WSYNC_OK) {
        snprintf(shared->coord_addr, sizeof(shared->coord_addr), "%s", wsync_sender_coordinator(s));
        atomic_store(&shared->have_addr, 1);
    }
    if (st != WSYNC_OK) {
        record_error(res, st, t0);
        goto out;
    }
    for (int p = 0; p < NPARAMS; p++) {
        /* FSDP: rows [rank * ROWS / NS, ...) of each param */
        wsync_shard_t sh = {{param_name(p), WSYNC_DTYPE_BF16, 2, {ROWS, COLS}},
                            {{rank * ROWS / NS, 0}, {ROWS / NS, COLS}}, NULL, WMEM_KIND,
                            gpu_of(rank)};
        shard[p] = wmem_alloc(ctx, n * 2, cur->variant);
        sh.data = shard[p];
        if (shard[p] != NULL)
            CHECK_OK(wsync_sender_add_shard(s, &sh));
    }
    barrier();
    for (int v = 1; v <= VERSIONS; v++) {
        /* a store's readers take each version before the next is published, so that a fault
         * in version 2 finds them holding version 1 */
        for (long long until = proc_now_ms() + 10000; store && v > 1 && proc_now_ms() < until;) {
            int behind = 0;
            for (int r = NS; r < NPROCS; r++)
                behind |= shared->res[r].versions_ok < v - 1 && !shared->res[r].done &&
                          !shared->res[r].gone;
            if (!behind)
                break;
            usleep(2000);
        }
        for (int p = 0; p < NPARAMS && shard[p] != NULL; p++) {
            for (size_t i = 0; i < n; i++)
                next[i] = value(p, (uint64_t)v, (size_t)rank * n + i);
            wmem_put(shard[p], next, n * 2);
        }
        t0 = proc_now_ms();
        st = wsync_sender_push(s, (uint64_t)v);
        if (st != WSYNC_OK) {
            record_error(res, st, t0);
            break;
        }
        res->versions_ok = v;
    }
    if (store && res->status == WSYNC_OK) {
        /* the store serves readers while its senders live: stay until they are through */
        long long until = proc_now_ms() + 15000;
        for (;;) {
            int busy = 0;
            for (int r = NS; r < NPROCS; r++)
                busy |= !shared->res[r].done && !shared->res[r].gone;
            if (!busy || proc_now_ms() > until)
                break;
            usleep(20000);
        }
    }
    wsync_sender_free(s);
    for (int p = 0; p < NPARAMS && !wmem_must_leak(res); p++)
        wmem_free(ctx, shard[p], cur->variant);
out:
    wsync_ctx_free(ctx);
    free(next);
    res->done = 1;
    return 0;
}

/* What receiver `rank` wants of each param: columns [*c0, *c0 + *nc), as bf16 or f32. */
static wsync_dtype_t wants(int rank, int *c0, int *nc)
{
    int slice = rank == 1 && (cur->variant & V_SLICE);
    *c0 = slice ? COLS / 2 : 0;
    *nc = slice ? COLS / 2 : COLS;
    return rank == 0 && (cur->variant & V_CAST) ? WSYNC_DTYPE_F32 : WSYNC_DTYPE_BF16;
}

/* 1 when the targets hold version v exactly (a bf16 -> f32 cast is exact: the bits move up). */
static int holds(int rank, void *const *buf, uint64_t v)
{
    int c0, nc, same = 1;
    wsync_dtype_t dt = wants(rank, &c0, &nc);
    size_t bytes = (size_t)ROWS * (size_t)nc * wsync_dtype_size(dt);
    void *have = malloc(bytes);

    for (int p = 0; p < NPARAMS && same && have != NULL; p++) {
        wmem_get(have, buf[p], bytes);
        for (size_t i = 0; i < ROWS && same; i++) {
            for (size_t j = 0; j < (size_t)nc; j++) {
                uint16_t want = value(p, v, i * COLS + (size_t)c0 + j);
                size_t k = i * (size_t)nc + j;
                if (dt == WSYNC_DTYPE_F32 ? ((const uint32_t *)have)[k] != (uint32_t)want << 16
                                          : ((const uint16_t *)have)[k] != want) {
                    same = 0;
                    break;
                }
            }
        }
    }
    free(have);
    return same && have != NULL;
}

static int receiver_main(void *arg)
{
    int rank = (int)(intptr_t)arg, me = NS + rank;
    result_t *res = &shared->res[me];
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    wsync_receiver_t *rv = NULL;
    void *buf[NPARAMS] = {NULL};
    int c0, nc;
    wsync_dtype_t dt = wants(rank, &c0, &nc);
    size_t bytes = (size_t)ROWS * (size_t)nc * wsync_dtype_size(dt);
    wsync_piece_t pieces[NPARAMS];
    int store = strcmp(cur->scheme, "store") == 0;
    wsync_status_t st;

    check_failures = 0;
    res->started = 1;
    wsync_ctx_t *ctx = wmem_init(me) ? make_ctx(me, res) : NULL;
    if (ctx == NULL)
        goto out;
    rp.coordinator = coordinator(me);
    rp.rank = rank;
    rp.nreceivers = NR;
    rp.timeout_ms = TIMEOUT_MS;
    rp.heartbeat_ms = HEARTBEAT_MS;
    rp.delta = "off";
    long long t0 = proc_now_ms();
    st = wsync_receiver_create(ctx, &rp, &rv);
    if (st != WSYNC_OK) {
        record_error(res, st, t0);
        goto out;
    }
    for (int p = 0; p < NPARAMS; p++) {
        pieces[p] = (wsync_piece_t){{param_name(p), WSYNC_DTYPE_BF16, 2, {ROWS, COLS}},
                                    {{0, c0}, {ROWS, nc}}, {0}};
        buf[p] = wmem_alloc(ctx, bytes, 0);
        if (buf[p] == NULL)
            continue;
        wmem_poison(buf[p], bytes);   /* poison: stale bytes cannot pass for data */
        wsync_target_t t = {param_name(p), dt, 2, {ROWS, nc}, buf[p], WMEM_KIND, gpu_of(me),
                            &pieces[p], 1, {0}};
        CHECK_OK(wsync_receiver_add_target(rv, &t));
    }
    barrier();
    for (int v = 1, tries = 0; v <= VERSIONS;) {
        uint64_t got = 0;
        t0 = proc_now_ms();
        st = store ? wsync_receiver_fetch(rv, (uint64_t)v, TIMEOUT_MS, &got)
                   : wsync_receiver_wait(rv, TIMEOUT_MS, &got);
        if (st == WSYNC_OK) {
            if (got != (uint64_t)v || !holds(rank, buf, got))
                res->wrong_mask |= 1u << (got < 31 ? got : 31);
            res->versions_ok = v;
            res->later_ok |= res->status != WSYNC_OK;
            v++;
            tries = 0;
            continue;
        }
        /* nothing began (or was published) in time: the group may still be alive */
        if ((st == WSYNC_ERR_TIMEOUT || st == WSYNC_ERR_NOT_FOUND) && ++tries <= 2) {
            res->timeouts++;
            continue;
        }
        record_error(res, st, t0);
        /* a store reader's bad copy is its own: it may fetch the version again */
        if (store && st == WSYNC_ERR_INTEGRITY && ++tries <= 2)
            continue;
        break;
    }
    res->committed = wsync_receiver_version(rv);
    res->torn = wsync_receiver_torn(rv);
    if (!res->torn && !holds(rank, buf, res->committed))
        res->end_state_bad = res->committed > 0 || res->versions_ok > 0;
    wsync_receiver_free(rv);
out:
    for (int p = 0; p < NPARAMS && !wmem_must_leak(res); p++)
        wmem_free(ctx, buf[p], 0);
    wsync_ctx_free(ctx);
    res->done = 1;
    return 0;
}

/* ---- the parent -------------------------------------------------------------------------------- */

/* A last error, short and the same from run to run: no pids, ports or status texts (the status
 * has a column of its own), no '|' (the matrix is a markdown table). */
static void shorten(const char *in, char *out, size_t len)
{
    size_t n = 0;

    for (const char *p = in; *p != '\0' && n + 1 < len;) {
        int skipped = 0;
        for (int st = -1; st >= WSYNC_ERR_INTERNAL && !skipped; st--) {
            const char *t = wsync_status_str((wsync_status_t)st);
            size_t k = strlen(t);
            if (strncmp(p, t, k) == 0 && p[k] == ':' && p[k + 1] == ' ') {
                p += k + 2;
                skipped = 1;
            }
        }
        if (skipped)
            continue;
        if (strncmp(p, " (pid ", 6) == 0 && strchr(p, ')') != NULL) {
            p = strchr(p, ')') + 1;
            continue;
        }
        if (strncmp(p, "127.0.0.1:", 10) == 0) {
            p += 10;
            while (*p >= '0' && *p <= '9')
                p++;
            n += (size_t)snprintf(out + n, len - n, "ADDR");
            continue;
        }
        out[n++] = *p == '|' ? '/' : *p;
        p++;
    }
    out[n < len ? n : len - 1] = '\0';
    if (strlen(out) > 230)
        strcpy(out + 227, "...");
}

static int has_needle(const char *text, const char *needles)
{
    char buf[256];

    snprintf(buf, sizeof(buf), "%s", needles);
    for (char *tok = strtok(buf, "|"); tok != NULL; tok = strtok(NULL, "|"))
        if (strstr(text, tok) != NULL)
            return 1;
    return 0;
}

/* 1 if name holds pid as a number of its own ("4242:0:0", "fi_4242"): how shared-memory files
 * (libfabric's shm provider's, say) are named after their process */
static int names_pid(const char *name, pid_t pid)
{
    char num[16];
    size_t k;

    k = (size_t)snprintf(num, sizeof(num), "%d", (int)pid);
    for (const char *p = strstr(name, num); p != NULL; p = strstr(p + 1, num))
        if ((p == name || p[-1] < '0' || p[-1] > '9') && (p[k] < '0' || p[k] > '9'))
            return 1;
    return 0;
}

/* New entries of /dev/shm that this group made: named after one of its processes, or after
 * wsync. Other programs on the machine (other tests) come and go; those are only shown. */
static void dev_shm_new(const char *before, const pid_t *pids, char *news, size_t len)
{
    char after[8192], wrapped[8200];
    size_t n = 0;

    snprintf(wrapped, sizeof(wrapped), "\n%s", before);
    proc_list_dev_shm(after, sizeof(after));
    news[0] = '\0';
    for (char *line = strtok(after, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char needle[300];
        int ours = strstr(line, "wsync") != NULL;
        snprintf(needle, sizeof(needle), "\n%s\n", line);
        if (strstr(wrapped, needle) != NULL)
            continue;
        for (int i = 0; i < NPROCS; i++)
            ours |= names_pid(line, pids[i]);
        if (!ours)
            fprintf(stderr, "   note: /dev/shm/%s appeared, not from this group\n", line);
        else if (n + 1 < len)
            n += (size_t)snprintf(news + n, len - n, "%s ", line);
    }
}

static void matrix_cell(int i, int code, int stopped, char *out, size_t len)
{
    const result_t *r = &shared->res[i];
    char text[256], extra[160] = "";

    if (stopped) {
        snprintf(out, len, "stopped (SIGSTOP)");
        return;
    }
    if (code == 128 + SIGKILL) {
        snprintf(out, len, "killed (SIGKILL)");
        return;
    }
    if (code != 0 && !r->done) {
        snprintf(out, len, "**died** (exit code %d) after v%d", code, r->versions_ok);
        return;
    }
    if (i >= NS) {
        size_t n = 0;
        if (r->timeouts)
            n += (size_t)snprintf(extra + n, sizeof(extra) - n, "; %d TIMEOUT%s first",
                                  r->timeouts, r->timeouts > 1 ? "s" : "");
        if (r->wrong_mask)
            n += (size_t)snprintf(extra + n, sizeof(extra) - n, "; **wrong bytes accepted as "
                                  "v%d**", __builtin_ctz(r->wrong_mask));
        if (r->status != WSYNC_OK)
            n += (size_t)snprintf(extra + n, sizeof(extra) - n, "; holds v%llu%s",
                                  (unsigned long long)r->committed, r->torn ? ", torn" : "");
        if (r->later_ok)
            n += (size_t)snprintf(extra + n, sizeof(extra) - n, "; fetched again: v%d",
                                  r->versions_ok);
    }
    if (r->status == WSYNC_OK) {
        snprintf(out, len, "ok v%d%s", r->versions_ok, extra);
        return;
    }
    shorten(r->text, text, sizeof(text));
    snprintf(out, len, "**%s** (%lld ms%s): %s", wsync_status_name(r->status) + 10, r->call_ms,
             extra, text);
}

/* Each case's outcome, for --json. */
typedef struct {
    char name[160];
    int ok;
    long long ms;
} outcome_t;

static outcome_t outcomes[160];
static size_t noutcomes;

static void run_case(const case_t *c)
{
    char before[8192], news[1024], victim[32], cells[NPROCS][512];
    pid_t pids[NPROCS];
    int codes[NPROCS], stopped[NPROCS] = {0}, exited[NPROCS] = {0};
    const char *needles = c->needles;
    long long t0 = proc_now_ms();
    int failures_before = check_failures;

    cur = c;
    memset(shared, 0, sizeof(*shared));
    who(c->victim, victim, sizeof(victim));
    if (needles == NULL)
        needles = victim;
    fprintf(stderr, "-- %s%s%s %s on %s%s\n", c->scheme, c->transport ? " over " : "",
            c->transport ? c->transport : "", c->fault ? c->fault : "no fault", victim,
            c->verify ? " (verify)" : "");
    proc_list_dev_shm(before, sizeof(before));
    for (int i = 0; i < NPROCS; i++)
        pids[i] = proc_spawn(i < NS ? sender_main : receiver_main, (void *)(intptr_t)(i % NS), 60);

    /* wait for every process; a stopped victim counts as finished (it is killed below) */
    for (int left = NPROCS; left > 0;) {
        for (int i = 0; i < NPROCS; i++) {
            int status;
            if (exited[i] || stopped[i] || waitpid(pids[i], &status, WNOHANG | WUNTRACED) != pids[i])
                continue;
            if (WIFSTOPPED(status)) {
                stopped[i] = 1;
            } else {
                exited[i] = 1;
                codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            }
            shared->res[i].gone = 1;
            left--;
        }
        if (left > 0 && proc_now_ms() - t0 > CASE_MS) {
            for (int i = 0; i < NPROCS; i++) {
                if (exited[i] || stopped[i])
                    continue;
                CHECK_MSG(0, "%s hung: killed after %d ms", who(i, victim, sizeof(victim)), CASE_MS);
                proc_on_hang(pids[i]);
                kill(pids[i], SIGKILL);
                waitpid(pids[i], NULL, 0);
                exited[i] = 1;
                codes[i] = -1;
            }
            break;
        }
        usleep(5000);
    }
    for (int i = 0; i < NPROCS; i++) {
        if (stopped[i]) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
        }
    }
    who(c->victim, victim, sizeof(victim));

    /* the victim's fate */
    if (c->fate == FATE_KILLED)
        CHECK_MSG(exited[c->victim] && codes[c->victim] == 128 + SIGKILL,
                  "%s was to be killed; exit code %d", victim, codes[c->victim]);
    if (c->fate == FATE_STOPPED)
        CHECK_MSG(stopped[c->victim], "%s was to stop", victim);
    for (int i = 0; i < NPROCS; i++)
        matrix_cell(i, exited[i] ? codes[i] : 0, stopped[i], cells[i], sizeof(cells[i]));
    /* every participant: also the senders whose store reader was killed mid-get (UCX's emulated
     * RMA used to abort them there; transports/ucx.c says why it no longer can) */
    for (int i = 0; i < NPROCS; i++) {
        const result_t *r = &shared->res[i];
        char name[32];
        int is_victim = i == c->victim;
        end_t want = is_victim ? c->victim_end : c->others_end;

        who(i, name, sizeof(name));
        if (is_victim && c->fate != FATE_ALIVE)
            continue;
        CHECK_MSG(exited[i] && codes[i] == 0 && r->done, "%s exited with %d (record %s)", name,
                  exited[i] ? codes[i] : -1, r->done ? "complete" : "incomplete");
        if (want == END_ERROR) {
            CHECK_MSG(r->status != WSYNC_OK, "%s: expected an error, completed %d versions", name,
                      r->versions_ok);
            if (r->status != WSYNC_OK) {
                CHECK_MSG(is_victim || has_needle(r->text, needles),
                          "%s: the error does not name %s: %s", name, needles, r->text);
                /* the delayed process itself also spends its own delay (5 s) in the call */
                CHECK_MSG(r->call_ms <= LIMIT_MS + (is_victim ? DELAY_MS : 0),
                          "%s: the error took %lld ms: %s", name, r->call_ms, r->text);
                CHECK_MSG(strlen(r->text) > 0 && r->status != WSYNC_ERR_INTERNAL,
                          "%s: no clear error: %s %s", name, wsync_status_name(r->status),
                          r->text);
            }
        } else {
            CHECK_MSG(r->status == WSYNC_OK || (c->integrity && r->later_ok),
                      "%s: expected to complete, got %s: %s", name, wsync_status_name(r->status),
                      r->text);
            CHECK_MSG(r->versions_ok == VERSIONS, "%s: completed %d versions of %d", name,
                      r->versions_ok, VERSIONS);
        }
        if (c->integrity && r->status != WSYNC_OK) {
            CHECK_MSG(r->status == WSYNC_ERR_INTEGRITY, "%s: %s, expected WSYNC_ERR_INTEGRITY: %s",
                      name, wsync_status_name(r->status), r->text);
            CHECK_MSG(strstr(r->text, "param 'model.layers.0.") != NULL,
                      "%s: the integrity error names no param: %s", name, r->text);
        }
        if (i >= NS) {
            /* never a version it did not fully receive, save where the case corrupts on purpose
             * without verification */
            if (want == END_WRONG)
                CHECK_MSG(r->wrong_mask == 1u << 2, "%s: expected version 2 reported with wrong "
                          "bytes (verification off), mask 0x%x", name, r->wrong_mask);
            else if (want == END_SOME_WRONG)
                CHECK_MSG((r->wrong_mask & ~(1u << 2)) == 0, "%s: wrong bytes reported outside "
                          "version 2 (mask 0x%x)", name, r->wrong_mask);
            else
                CHECK_MSG(r->wrong_mask == 0, "%s: reported versions with wrong bytes (mask "
                          "0x%x)", name, r->wrong_mask);
            CHECK_MSG(!r->end_state_bad, "%s: not torn, yet its targets are not version %llu",
                      name, (unsigned long long)r->committed);
            /* a version may be committed here and its acknowledgement lost with the group: the
             * targets then hold it whole, which end_state_bad has checked */
            if (r->status != WSYNC_OK && !r->later_ok)
                CHECK_MSG(r->committed == (uint64_t)r->versions_ok ||
                              r->committed == (uint64_t)r->versions_ok + 1,
                          "%s: holds version %llu after completing %d", name,
                          (unsigned long long)r->committed, r->versions_ok);
        }
    }
    if (c->others_end == END_SOME_WRONG) {
        int some = 0;
        for (int i = NS; i < NPROCS; i++)
            some |= i != c->victim && shared->res[i].wrong_mask != 0;
        CHECK_MSG(some, "no receiver got the corrupted bytes: did the fault fire?");
    }
    dev_shm_new(before, pids, news, sizeof(news));
    CHECK_MSG(news[0] == '\0', "left in /dev/shm: %s(the group's pids: %d %d %d %d)", news,
              (int)pids[0], (int)pids[1], (int)pids[2], (int)pids[3]);

    {
        char point[64] = "-", action[64];
        const char *colon = c->fault != NULL ? strchr(c->fault, ':') : NULL;
        if (colon != NULL)
            snprintf(point, sizeof(point), "%.*s", (int)(colon - c->fault), c->fault);
        snprintf(action, sizeof(action), "%s%s", colon != NULL ? colon + 1 : "none",
                 c->verify ? " +verify" : "");
        if (c->fault == NULL)
            snprintf(victim, sizeof(victim), "-");
        printf("MATRIX | `%s` | `%s` | %s | %s | %s | %s | %s | %s |\n", point, action, victim,
               cells[0], cells[1], cells[2], cells[3], c->note ? c->note : "");
        fflush(stdout);
    }
    fprintf(stderr, "   %s in %lld ms\n", check_failures > failures_before ? "FAILED" : "ok",
            proc_now_ms() - t0);
    if (noutcomes < sizeof(outcomes) / sizeof(outcomes[0])) {
        outcome_t *o = &outcomes[noutcomes++];
        snprintf(o->name, sizeof(o->name), "%s%s%s %s on %s%s", c->scheme,
                 c->transport ? " over " : "", c->transport ? c->transport : "",
                 c->fault ? c->fault : "no fault", victim, c->verify ? " (verify)" : "");
        o->ok = check_failures == failures_before;
        o->ms = proc_now_ms() - t0;
    }
}

/* ---- the cases ---------------------------------------------------------------------------- */

enum { S0 = 0, S1 = 1, R0 = 2, R1 = 3 };

#define KILLED(v, f, o, n) {NULL, NULL, v, f, 0, FATE_KILLED, END_ERROR, o, n, 0, NULL, 0}
#define STOPPED(v, f, o, n) {NULL, NULL, v, f, 0, FATE_STOPPED, END_ERROR, o, n, 0, NULL, 0}
#define ALIVE(v, f, ve, o, n) {NULL, NULL, v, f, 0, FATE_ALIVE, ve, o, n, 0, NULL, 0}

/* ipc, 3 buckets per sender per version, both receivers need all: per version a sender packs 3
 * buckets and sends 6 READYs, a receiver lands 6 buckets (sends 6 RELEASEs) and 1 COMMIT. Every
 * fault hits version 2. */
static const case_t ipc_cases[] = {
    KILLED(S1, "push.bucket:kill@5", END_ERROR, NULL),
    STOPPED(S1, "push.bucket:stop@5", END_ERROR, NULL),
    ALIVE(S1, "push.bucket:delay=" DELAY "@5", END_ERROR, END_ERROR, NULL),
    ALIVE(S1, "push.bucket:fail@5", END_ERROR, END_ERROR, NULL),
    KILLED(S0, "push.bucket:kill@5", END_ERROR, "sender 0|coordinator"),
    KILLED(R1, "recv.unpack:kill@8", END_ERROR, NULL),
    STOPPED(R1, "recv.unpack:stop@8", END_ERROR, NULL),
    ALIVE(R1, "recv.unpack:delay=" DELAY "@8", END_ERROR, END_ERROR, NULL),
    ALIVE(R1, "recv.unpack:fail@8", END_ERROR, END_ERROR, NULL),
    KILLED(R1, "commit:kill@2", END_ERROR, NULL),
    STOPPED(R1, "commit:stop@2", END_ERROR, NULL),
    ALIVE(R1, "commit:delay=" DELAY "@2", END_ERROR, END_ERROR, NULL),
    ALIVE(R1, "commit:fail@2", END_ERROR, END_ERROR, NULL),
    ALIVE(R1, "ctrl.send/COMMIT:drop@2", END_ERROR, END_ERROR, NULL),
    STOPPED(R1, "ctrl.send/COMMIT:stop@2", END_ERROR, NULL),
    ALIVE(R1, "ctrl.send/RELEASE:drop@8", END_ERROR, END_ERROR, "receiver 1|sender "),
    /* the sender waiting for that RELEASE holds its next bucket back: the other receiver names
     * that sender, the one it waits on */
    ALIVE(R1, "ctrl.send/RELEASE:delay=" DELAY "@8", END_ERROR, END_ERROR, "receiver 1|sender "),
    ALIVE(S1, "ctrl.send/READY:drop@8", END_ERROR, END_ERROR, "sender 1|receiver 1"),
    ALIVE(S1, "ctrl.send/PUSH_BEGIN:drop@2", END_ERROR, END_ERROR, NULL),
    KILLED(S1, "ctrl.send/READY:kill@8", END_ERROR, NULL),
    ALIVE(R1, "ctrl.recv/BEGIN:drop@2", END_ERROR, END_ERROR, NULL),
    ALIVE(R1, "ctrl.recv/READY:drop@8", END_ERROR, END_ERROR, "sender 1|sender 0|receiver 1"),
    ALIVE(S1, "ctrl.recv/DONE:drop@2", END_ERROR, END_ERROR, "sender 1"),
    ALIVE(S1, "ctrl.recv/RELEASE:delay=" DELAY "@8", END_ERROR, END_ERROR, NULL),
    KILLED(R1, "ctrl.recv/READY:kill@8", END_ERROR, NULL),
};

/* store, readers fetch versions 1, 2, 3 in turn: per version a sender publishes once, a reader
 * posts 6 gets (2 senders x 3 shards) and lands them in one batch (6 with verification, one per
 * get). A reader's trouble is its own: the senders and the other reader carry on. */
static const case_t store_cases[] = {
    KILLED(S1, "store.publish:kill@2", END_ERROR, NULL),
    STOPPED(S1, "store.publish:stop@2", END_ERROR, NULL),
    ALIVE(S1, "store.publish:delay=" DELAY "@2", END_ERROR, END_ERROR, NULL),
    ALIVE(S1, "store.publish:fail@2", END_ERROR, END_ERROR, NULL),
    KILLED(S0, "store.publish:kill@2", END_ERROR, "sender 0|coordinator"),
    ALIVE(S1, "ctrl.send/PUBLISH:drop@2", END_ERROR, END_ERROR, NULL),
    ALIVE(S1, "ctrl.recv/PUBLISHED:drop@2", END_ERROR, END_ERROR, "sender 1"),
    KILLED(R1, "store.get:kill@8", END_OK, NULL),
    STOPPED(R1, "store.get:stop@8", END_OK, NULL),
    ALIVE(R1, "store.get:delay=" DELAY "@8", END_OK, END_OK, NULL),
    ALIVE(R1, "store.get:fail@8", END_ERROR, END_OK, NULL),
    KILLED(R1, "recv.unpack:kill@2", END_OK, NULL),
    ALIVE(R1, "recv.unpack:fail@2", END_ERROR, END_OK, NULL),
    KILLED(R1, "commit:kill@2", END_OK, NULL),
    STOPPED(R1, "commit:stop@2", END_OK, NULL),
    ALIVE(R1, "commit:fail@2", END_ERROR, END_OK, NULL),
    ALIVE(R1, "ctrl.send/FETCH:drop@2", END_OK, END_OK, NULL),
    ALIVE(R1, "ctrl.recv/DIRECTORY:drop@2", END_OK, END_OK, NULL),
    ALIVE(R1, "ctrl.send/READ_DONE:drop@2", END_OK, END_OK, NULL),
};

/* Corruption: with verification the version is refused naming the param; without, the library
 * cannot tell (the test's own comparison can). */
static const case_t ipc_corrupt_cases[] = {
    {NULL, NULL, R1, "recv.unpack:corrupt@8", 1, FATE_ALIVE, END_ERROR, END_ERROR, NULL, 1,
     "refused by receiver 1", 0},
    {NULL, NULL, R1, "recv.unpack:corrupt@8", 0, FATE_ALIVE, END_WRONG, END_OK, NULL, 0,
     "unseen without verify", 0},
    {NULL, NULL, S1, "push.bucket:corrupt@5", 1, FATE_ALIVE, END_ERROR, END_ERROR,
     "receiver 0|receiver 1", 1, "refused by the receivers", 0},
    {NULL, NULL, S1, "push.bucket:corrupt@5", 0, FATE_ALIVE, END_OK, END_WRONG, NULL, 0,
     "unseen without verify", 0},
    {NULL, NULL, R1, "recv.unpack:corrupt@8", 1, FATE_ALIVE, END_ERROR, END_ERROR, NULL, 1,
     "refused by receiver 1; shards read in place", V_INPLACE},
};

static const case_t store_corrupt_cases[] = {
    {NULL, NULL, R1, "store.get:corrupt@8", 1, FATE_ALIVE, END_OK, END_OK, NULL, 1,
     "refused, then fetched again whole", 0},
    {NULL, NULL, R1, "store.get:corrupt@8", 0, FATE_ALIVE, END_WRONG, END_OK, NULL, 0,
     "unseen without verify", 0},
    {NULL, NULL, R1, "store.get:corrupt@8", 1, FATE_ALIVE, END_OK, END_OK, NULL, 1,
     "refused, then fetched again; receiver 1 reads half the columns, the flipped bit lies in "
     "the other half of its checksum block", V_SLICE},
};

/* On CUDA memory: ipc with the senders' GPUs read by the receivers' (peer access over NVLink; one
 * GPU: the same GPU), and nccl. Per version: ipc as on the host; nccl runs 3 steps (one bucket of
 * each sender), so a sender packs 3 and a receiver lands 3. The shards are 256 KiB rows, which
 * both schemes send straight from the shard: a sender's corruption needs staging, in
 * cudaMallocAsync memory (ipc) or for a strided slice (nccl: with V_SLICE each shard splits in
 * column halves for two receiver sets, 5 to 7 steps a version, so @8 falls in version 2; the
 * plan decides which receivers the corrupted op reaches). */
/* Both schemes; "@L" stands for the receiver's landing in version 2 that these faults hit (ipc
 * lands 6 buckets a version: @8; nccl 3 steps: @5), filled in by run_set_landing. */
static const case_t cuda_cases[] = {
    KILLED(S1, "push.bucket:kill@5", END_ERROR, NULL),
    STOPPED(S1, "push.bucket:stop@5", END_ERROR, NULL),
    ALIVE(S1, "push.bucket:fail@5", END_ERROR, END_ERROR, NULL),
    KILLED(S0, "push.bucket:kill@5", END_ERROR, "sender 0|coordinator"),
    KILLED(R1, "recv.unpack:kill@L", END_ERROR, NULL),
    STOPPED(R1, "recv.unpack:stop@L", END_ERROR, NULL),
    ALIVE(R1, "recv.unpack:delay=" DELAY "@L", END_ERROR, END_ERROR, NULL),
    ALIVE(R1, "recv.unpack:fail@L", END_ERROR, END_ERROR, NULL),
    KILLED(R1, "commit:kill@2", END_ERROR, NULL),
    ALIVE(R1, "commit:fail@2", END_ERROR, END_ERROR, NULL),
    ALIVE(R1, "ctrl.send/COMMIT:drop@2", END_ERROR, END_ERROR, NULL),
    ALIVE(R1, "ctrl.recv/BEGIN:drop@2", END_ERROR, END_ERROR, NULL),
    {NULL, NULL, R1, "recv.unpack:corrupt@L", 1, FATE_ALIVE, END_ERROR, END_ERROR, NULL, 1,
     "refused by receiver 1", 0},
    {NULL, NULL, R1, "recv.unpack:corrupt@L", 0, FATE_ALIVE, END_WRONG, END_OK, NULL, 0,
     "unseen without verify", 0},
};

/* ipc only: its per-bucket frames, and a sender's corruption of staged shards */
static const case_t cuda_ipc_cases[] = {
    ALIVE(R1, "ctrl.send/RELEASE:drop@8", END_ERROR, END_ERROR, "receiver 1|sender "),
    ALIVE(S1, "ctrl.send/READY:drop@8", END_ERROR, END_ERROR, "sender 1|receiver 1"),
    {NULL, NULL, S1, "push.bucket:corrupt@5", 1, FATE_ALIVE, END_ERROR, END_ERROR,
     "receiver 0|receiver 1", 1, "refused by the receivers; shards staged", V_STAGED},
    {NULL, NULL, S1, "push.bucket:corrupt@5", 0, FATE_ALIVE, END_OK, END_WRONG, NULL, 0,
     "unseen without verify; shards staged", V_STAGED},
};

/* nccl only: a sender's corruption of staged column halves */
static const case_t nccl_cases[] = {
    {NULL, NULL, S1, "push.bucket:corrupt@8", 1, FATE_ALIVE, END_ERROR, END_ERROR,
     "receiver 0|receiver 1", 1, "refused; receiver 1 takes half the columns (staged)", V_SLICE},
    {NULL, NULL, S1, "push.bucket:corrupt@8", 0, FATE_ALIVE, END_OK, END_SOME_WRONG, NULL, 0,
     "unseen without verify; receiver 1 takes half the columns (staged)", V_SLICE},
};

/* FAULTS_ONLY=text: only the cases whose "scheme[/transport] fault[ verify][ variant]" holds it. */
static int selected(const case_t *c)
{
    const char *only = getenv("FAULTS_ONLY");
    char name[160];

    snprintf(name, sizeof(name), "%s%s%s %s%s%s", c->scheme, c->transport ? "/" : "",
             c->transport ? c->transport : "", c->fault ? c->fault : "none",
             c->verify ? " verify" : "", c->variant ? " variant" : "");
    return only == NULL || strstr(name, only) != NULL;
}

static void run_set(const case_t *set, size_t n, const char *scheme, const char *transport)
{
    for (size_t i = 0; i < n; i++) {
        case_t c = set[i];
        c.scheme = scheme;
        c.transport = transport;
        if (selected(&c))
            run_case(&c);
    }
}

/* run_set for cuda_cases: "@L" in a fault becomes "@<landing>" */
static void run_set_landing(const case_t *set, size_t n, const char *scheme, int landing)
{
    for (size_t i = 0; i < n; i++) {
        case_t c = set[i];
        char fault[96];
        const char *at = c.fault != NULL ? strstr(c.fault, "@L") : NULL;
        if (at != NULL) {
            snprintf(fault, sizeof(fault), "%.*s@%d", (int)(at - c.fault), c.fault, landing);
            c.fault = fault;
        }
        run_set(&c, 1, scheme, NULL);
    }
}

/* A group with no fault, with and without verification, then verified through the other paths
 * (shards read in place, cast targets, column slices): the harness itself must see success, and
 * verification must never refuse good bytes. */
static void run_clean(const char *scheme, const char *transport)
{
    for (int verify = 0; verify <= 2; verify++) {
        case_t c = {scheme, transport, R1, NULL, verify > 0, FATE_ALIVE, END_OK, END_OK, NULL, 0,
                    "baseline", 0};
        if (verify == 2) {
#ifdef FAULTS_ON_CUDA
            /* CUDA shards are read in place wherever a peer can map them: stage them instead */
            c.variant = (strcmp(scheme, "ipc") == 0 ? V_STAGED : 0) | V_CAST | V_SLICE;
            c.note = strcmp(scheme, "ipc") == 0
                         ? "baseline: staged shards, receiver 0 casts to f32, receiver 1 takes "
                           "half the columns"
                         : "baseline: receiver 0 casts to f32, receiver 1 takes half the columns";
#else
            c.variant = V_INPLACE | V_CAST | V_SLICE;
            c.note = "baseline: in-place shards, receiver 0 casts to f32, receiver 1 takes half "
                     "the columns";
#endif
        }
        if (selected(&c))
            run_case(&c);
    }
}

/* The matrix is printed as markdown, each line after "MATRIX ": one table per scheme. */
static void matrix_header(const char *title)
{
    printf("MATRIX \nMATRIX ### %s\nMATRIX \n", title);
    printf("MATRIX | point | action | victim | sender 0 (coordinator) | sender 1 | receiver 0 | "
           "receiver 1 | note |\n");
    printf("MATRIX | --- | --- | --- | --- | --- | --- | --- | --- |\n");
}

static void case_ipc(void)
{
    matrix_header("ipc on host memory");
    run_clean("ipc", NULL);
    run_set(ipc_cases, sizeof(ipc_cases) / sizeof(ipc_cases[0]), "ipc", NULL);
    run_set(ipc_corrupt_cases, sizeof(ipc_corrupt_cases) / sizeof(ipc_corrupt_cases[0]), "ipc",
            NULL);
}

static void store_over(const char *transport)
{
    char title[64];

    snprintf(title, sizeof(title), "store over %s", strcmp(transport, "ucx") == 0 ? "UCX"
                                                                                  : "libfabric");
    matrix_header(title);
    if (!test_have_transport(transport)) {
        printf("MATRIX | - | - | - | skipped: %s is not in this build or not usable here |||||\n",
               transport);
        return;
    }
    run_clean("store", transport);
    run_set(store_cases, sizeof(store_cases) / sizeof(store_cases[0]), "store", transport);
    run_set(store_corrupt_cases, sizeof(store_corrupt_cases) / sizeof(store_corrupt_cases[0]),
            "store", transport);
}

static void case_store_ucx(void) { store_over("ucx"); }
static void case_store_ofi(void) { store_over("ofi"); }

static void case_cuda_ipc(void)
{
    char title[160];

    snprintf(title, sizeof(title), "ipc on CUDA memory (%s)",
             g_ngpu >= NPROCS ? "senders on GPUs 0, 1, receivers on GPUs 2, 3: peer reads"
                              : "processes share the GPUs");
    matrix_header(title);
    run_clean("ipc", NULL);
    run_set_landing(cuda_cases, sizeof(cuda_cases) / sizeof(cuda_cases[0]), "ipc", 8);
    run_set(cuda_ipc_cases, sizeof(cuda_ipc_cases) / sizeof(cuda_ipc_cases[0]), "ipc", NULL);
}

static void case_nccl(void)
{
    matrix_header("nccl on CUDA memory (one rank per GPU: senders on GPUs 0, 1, receivers on 2, 3)");
    if (g_ngpu < NPROCS) {
        printf("MATRIX | - | - | - | skipped: nccl needs %d GPUs, %d visible |||||\n", NPROCS,
               g_ngpu);
        return;
    }
    run_clean("nccl", NULL);
    run_set_landing(cuda_cases, sizeof(cuda_cases) / sizeof(cuda_cases[0]), "nccl", 5);
    run_set(nccl_cases, sizeof(nccl_cases) / sizeof(nccl_cases[0]), "nccl", NULL);
}

/* ---- WSYNC_FAULT itself --------------------------------------------------------------------- */

typedef struct {
    const char *value;
    const char *needle;            /* NULL: must be accepted */
} spec_t;

static int spec_main(void *arg)
{
    const spec_t *sp = arg;
    wsync_ctx_t *ctx = NULL;
    wsync_status_t st;

    setenv("WSYNC_FAULT", sp->value, 1);
    st = wsync_ctx_create(NULL, &ctx);
    if (sp->needle == NULL) {
        CHECK_MSG(st == WSYNC_OK, "WSYNC_FAULT='%s' refused: %s", sp->value, wsync_last_error());
    } else {
        CHECK_MSG(st == WSYNC_ERR_INVALID, "WSYNC_FAULT='%s' accepted", sp->value);
        CHECK_MSG(strstr(wsync_last_error(), sp->needle) != NULL &&
                      strstr(wsync_last_error(), "WSYNC_FAULT") != NULL,
                  "WSYNC_FAULT='%s': \"%s\" does not name '%s'", sp->value, wsync_last_error(),
                  sp->needle);
        /* read once per process: the same answer again */
        CHECK(wsync_ctx_create(NULL, &ctx) == WSYNC_ERR_INVALID);
    }
    wsync_ctx_free(ctx);
    return check_failures ? 1 : 0;
}

static void case_fault_specs(void)
{
    static const spec_t specs[] = {
        {"push.bucket:kill@3,ctrl.send/COMMIT:drop@2,recv.unpack:delay=200ms", NULL},
        {"store.get:corrupt,commit:fail@1,ctrl.recv/ready:delay=5s@7", NULL},
        {"push.bucket:kill@3,bogus.point:kill", "bogus.point:kill"},
        {"push.bucket", "'push.bucket'"},
        {"commit:explode@2", "commit:explode@2"},
        {"commit:kill@0", "commit:kill@0"},
        {"commit:kill@x", "commit:kill@x"},
        {"recv.unpack:drop@1", "recv.unpack:drop@1"},
        {"ctrl.send:corrupt@1", "ctrl.send:corrupt@1"},
        {"ctrl.send/NOPE:drop@1", "ctrl.send/NOPE:drop@1"},
        {"commit/COMMIT:kill", "commit/COMMIT:kill"},
        {"commit:delay=5", "commit:delay=5"},
        {"commit:delay=5h", "commit:delay=5h"},
    };
    for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
        pid_t pid = proc_spawn(spec_main, (void *)&specs[i], 30);
        int code;
        proc_wait_all(&pid, 1, 30000, &code);
        CHECK_MSG(code == 0, "WSYNC_FAULT='%s': child exited with %d", specs[i].value, code);
    }
}

#ifdef FAULTS_ON_CUDA
static int count_gpus(void *arg)
{
    (void)arg;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        return 0;
    return n > 100 ? 100 : n;
}
#endif

static void write_json(const char *path)
{
    FILE *f = fopen(path, "w");
    size_t failed = 0;

    if (f == NULL) {
        perror(path);
        return;
    }
    fprintf(f, "{\"ngpu\": %d, \"cases\": [", g_ngpu);
    for (size_t i = 0; i < noutcomes; i++) {
        failed += !outcomes[i].ok;
        fprintf(f, "%s\n  {\"name\": \"%s\", \"result\": \"%s\", \"seconds\": %.1f}", i ? "," : "",
                outcomes[i].name, outcomes[i].ok ? "pass" : "FAIL", (double)outcomes[i].ms / 1000.0);
    }
    fprintf(f, "\n], \"failed\": %zu}\n", failed);
    fclose(f);
}

int main(int argc, char **argv)
{
    const char *json = NULL;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
            json = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--json PATH]\n(FAULTS_ONLY=text: only the cases whose "
                            "name holds the text)\n", argv[0]);
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
#if defined(WSYNC_FAULTS) && WSYNC_FAULTS
    const int built_with_faults = 1;
#else
    const int built_with_faults = 0;
#endif
    if (!built_with_faults) {
        printf("skipped: this build has no fault injection (configure with -DWSYNC_FAULTS=ON)\n");
        return 77;
    }
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    shared = mmap(NULL, sizeof(*shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED)
        return 1;
    /* children print their injected faults and warnings; the matrix lines are what matters */
    if (getenv("WSYNC_LOG_LEVEL") == NULL)
        setenv("WSYNC_LOG_LEVEL", "error", 1);
#ifdef FAULTS_ON_CUDA
    /* the parent never initializes CUDA (its children fork from it): a child counts the GPUs */
    pid_t pid = proc_spawn(count_gpus, NULL, 60);
    int code = 0;
    proc_wait_all(&pid, 1, 60000, &code);
    g_ngpu = code > 0 && code < 128 ? code : 0;
    if (g_ngpu == 0) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    printf("test_faults_cuda: %d GPU(s)\n", g_ngpu);
    const int on_cuda = 1;
#else
    const int on_cuda = 0;
#endif
    /* the host build runs the first four, the CUDA build the last two */
    static const struct {
        const char *name;
        void (*fn)(void);
        int on_cuda;
    } suites[] = {
        {"case_fault_specs", case_fault_specs, 0}, {"case_ipc", case_ipc, 0},
        {"case_store_ucx", case_store_ucx, 0},     {"case_store_ofi", case_store_ofi, 0},
        {"case_cuda_ipc", case_cuda_ipc, 1},       {"case_nccl", case_nccl, 1},
    };
    for (size_t i = 0; i < sizeof(suites) / sizeof(suites[0]); i++)
        if (suites[i].on_cuda == on_cuda)
            check_run(suites[i].name, suites[i].fn);
    if (json != NULL)
        write_json(json);
    return check_summary();
}
