/* One participant of tests/gpu/netns_nccl.sh: a sender, a receiver, or a rank of the raw NCCL
 * baseline, started by the script inside its own network namespace (`ip netns exec`), so that
 * the group spans simulated hosts the way processes on separate machines do: nothing shared but
 * the files in --dir (used only for a start barrier and the raw baseline's NCCL unique id).
 *
 *   netns_member --role sender|receiver --rank I --senders N --receivers R --coord HOST:PORT
 *                --mem cuda|host --device D --scheme nccl|store|auto --layout tp|fanout
 *                --bytes B [--params P] [--warmup W] [--iters K] --dir DIR [--name RUN]
 *   netns_member --role raw --op send|bcast --rank I --nranks N --device D --bytes B
 *                [--iters K] --dir DIR [--name RUN]
 *
 * The model: P params "w<p>" [rows, 4096] bf16 of B bytes in all. Senders hold FSDP dim-0 row
 * shards; receivers take column slices (layout tp: receiver r of R, as tensor parallelism does)
 * or whole params (layout fanout: replicas). Versions 1..W+K are pushed; every receiver checks
 * every element of the first and last versions against value(), which it computes itself, then
 * says "receiver r: versions ... checked, 0 elements differ". Between the warm-up and the timed
 * versions the senders wait for every receiver's check (files in DIR), so no check is timed.
 * Sender 0 and raw rank 0 end with one JSON line: the median seconds and GB/s (1e9 bytes). */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "wsync/wsync.h"

#ifdef NETNS_CUDA
#include <cuda_runtime.h>
#endif
#ifdef NETNS_NCCL
#include <nccl.h>
#endif

#define COLS 4096
#define MAXP 64

typedef struct {
    const char *role, *coord, *mem, *scheme, *layout, *dir, *op, *name;
    int rank, senders, receivers, nranks, device, params, warmup, iters;
    uint64_t bytes;
} opts_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Element i (row-major over param p) of version v: a hash, so a stale or misplaced one shows. */
static uint16_t value(uint64_t v, int p, uint64_t i)
{
    uint64_t x = (v << 48) ^ ((uint64_t)p << 40) ^ (i * 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    /* bf16 with exponent bits never all ones: no NaN, so any cast would keep it */
    return (uint16_t)((x >> 40) & 0x7f7f);
}

static int median_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), median_cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Wait until DIR/name exists, up to limit_s; 0 when it does. */
static int wait_file(const char *dir, const char *name, double limit_s)
{
    char path[512];
    double end = now_s() + limit_s;
    struct stat sb;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    while (stat(path, &sb) != 0) {
        if (now_s() > end) {
            fprintf(stderr, "netns_member: %s did not appear within %.0f s\n", path, limit_s);
            return -1;
        }
        usleep(2000);
    }
    return 0;
}

/* Write DIR/name whole (through a temporary and a rename: readers never see half of it). */
static int put_file(const char *dir, const char *name, const void *data, size_t len)
{
    char tmp[512], path[512];
    snprintf(tmp, sizeof(tmp), "%s/.%s.%d", dir, name, (int)getpid());
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(tmp, "wb");
    if (f == NULL || fwrite(data, 1, len, f) != len || fclose(f) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "netns_member: writing %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* ---- memory: CUDA or host, the same calls ------------------------------------------------ */

static int is_cuda(const opts_t *o) { return strcmp(o->mem, "cuda") == 0; }

static void *buf_alloc(const opts_t *o, size_t bytes)
{
    void *p = NULL;
#ifdef NETNS_CUDA
    if (is_cuda(o)) {
        if (cudaSetDevice(o->device) != cudaSuccess || cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
            fprintf(stderr, "netns_member: cudaMalloc of %zu bytes on device %d failed\n", bytes,
                    o->device);
            return NULL;
        }
        return p;
    }
#endif
    if (is_cuda(o)) {
        fprintf(stderr, "netns_member: built without CUDA: --mem cuda is not possible\n");
        return NULL;
    }
    p = calloc(1, bytes ? bytes : 1);
    return p;
}

static int buf_put(const opts_t *o, void *dst, const void *src, size_t bytes)
{
#ifdef NETNS_CUDA
    if (is_cuda(o))
        return cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
#endif
    (void)o;
    memcpy(dst, src, bytes);
    return 0;
}

static int buf_get(const opts_t *o, void *dst, const void *src, size_t bytes)
{
#ifdef NETNS_CUDA
    if (is_cuda(o))
        return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
#endif
    (void)o;
    memcpy(dst, src, bytes);
    return 0;
}

/* ---- the model ---------------------------------------------------------------------------- */

typedef struct {
    int64_t rows;                    /* of each param */
    int64_t row0, nrows;             /* a sender's shard */
    int64_t col0, ncols;             /* a receiver's slice */
} shape_t;

static int model_shape(const opts_t *o, shape_t *m)
{
    /* rows a multiple of the senders, columns of the receivers' slices */
    int64_t per = (int64_t)(o->bytes / (uint64_t)o->params / (COLS * 2));
    int tp = strcmp(o->layout, "tp") == 0;
    m->rows = per - per % o->senders;
    if (m->rows < o->senders || (tp && COLS % o->receivers != 0)) {
        fprintf(stderr, "netns_member: %llu bytes in %d params of %d columns cannot be split over "
                        "%d senders and %d receivers\n", (unsigned long long)o->bytes, o->params,
                COLS, o->senders, o->receivers);
        return -1;
    }
    m->nrows = m->rows / o->senders;
    m->row0 = m->nrows * o->rank;
    m->ncols = tp ? COLS / o->receivers : COLS;
    m->col0 = tp ? m->ncols * o->rank : 0;
    return 0;
}

static int run_sender(const opts_t *o, wsync_ctx_t *ctx)
{
    shape_t m;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    wsync_sender_t *s;
    wsync_status_t st;
    void *shard[MAXP];
    uint16_t *host;
    double times[256];
    int nt = 0, total = o->warmup + o->iters;

    if (model_shape(o, &m) != 0)
        return 2;
    size_t n = (size_t)m.nrows * COLS;
    host = malloc(n * 2 + 2);
    sp.coordinator = o->coord;
    sp.rank = o->rank;
    sp.nranks = o->senders;
    sp.nreceivers = o->receivers;
    sp.scheme = o->scheme;
    st = wsync_sender_create(ctx, &sp, &s);
    if (st != WSYNC_OK || host == NULL) {
        fprintf(stderr, "sender %d: create: %s: %s\n", o->rank, wsync_status_name(st),
                wsync_last_error());
        return 1;
    }
    for (int p = 0; p < o->params; p++) {
        char name[16];
        snprintf(name, sizeof(name), "w%d", p);
        if ((shard[p] = buf_alloc(o, n * 2)) == NULL)
            return 1;
        wsync_shard_t sh = {{name, WSYNC_DTYPE_BF16, 2, {m.rows, COLS}},
                            {{m.row0, 0}, {m.nrows, COLS}}, shard[p],
                            is_cuda(o) ? WSYNC_MEM_CUDA : WSYNC_MEM_HOST, o->device};
        if ((st = wsync_sender_add_shard(s, &sh)) != WSYNC_OK) {
            fprintf(stderr, "sender %d: add_shard: %s\n", o->rank, wsync_last_error());
            return 1;
        }
    }
    for (int v = 1; v <= total; v++) {
        for (int p = 0; p < o->params; p++) {
            for (size_t i = 0; i < n; i++)
                host[i] = value((uint64_t)v, p, (uint64_t)m.row0 * COLS + i);
            if (buf_put(o, shard[p], host, n * 2) != 0)
                return 1;
        }
        if (v == o->warmup + 1)
            /* every receiver checked the warm-up version: no check runs while timed */
            for (int r = 0; r < o->receivers; r++) {
                char f[32];
                snprintf(f, sizeof(f), "checked.%d", r);
                if (wait_file(o->dir, f, 300) != 0)
                    return 1;
            }
        double t0 = now_s();
        st = wsync_sender_push(s, (uint64_t)v);
        double dt = now_s() - t0;
        if (st != WSYNC_OK) {
            fprintf(stderr, "sender %d: push %d: %s: %s\n", o->rank, v, wsync_status_name(st),
                    wsync_last_error());
            return 1;
        }
        if (v > o->warmup && nt < 256)
            times[nt++] = dt;
    }
    if (o->rank == 0) {
        /* bytes each receiver takes, and all that moves */
        double per_recv = (double)m.rows * (double)m.ncols * 2 * o->params;
        double sec = median(times, nt);
        const char *ex = wsync_sender_explain(s);
        fprintf(stderr, "sender 0: scheme %s\n%s", wsync_sender_scheme(s), ex);
        printf("{\"run\": \"%s\", \"kind\": \"wsync\", \"scheme\": \"%s\", \"mem\": \"%s\", "
               "\"senders\": %d, \"receivers\": %d, \"layout\": \"%s\", \"bytes\": %llu, "
               "\"bytes_per_receiver\": %.0f, \"iters\": %d, \"seconds\": %.6f, "
               "\"gbps_per_receiver\": %.3f, \"gbps_total\": %.3f}\n",
               o->name, wsync_sender_scheme(s), o->mem, o->senders, o->receivers, o->layout,
               (unsigned long long)((uint64_t)m.rows * COLS * 2 * (uint64_t)o->params), per_recv,
               nt, sec, per_recv / sec / 1e9, per_recv * o->receivers / sec / 1e9);
        fflush(stdout);
    }
    /* a store publisher stays until its readers are done */
    if (strcmp(wsync_sender_scheme(s), "store") == 0)
        for (int r = 0; r < o->receivers; r++) {
            char f[32];
            snprintf(f, sizeof(f), "done.%d", r);
            if (wait_file(o->dir, f, 300) != 0)
                break;
        }
    wsync_sender_free(s);
    free(host);
    return 0;
}

/* Elements of version v that differ in the receiver's slices. */
static size_t count_bad(const opts_t *o, const shape_t *m, void *const *tgt, uint16_t *host,
                        uint64_t v)
{
    size_t bad = 0, n = (size_t)m->rows * (size_t)m->ncols;

    for (int p = 0; p < o->params; p++) {
        if (buf_get(o, host, tgt[p], n * 2) != 0)
            return n;
        for (int64_t i = 0; i < m->rows; i++)
            for (int64_t j = 0; j < m->ncols; j++)
                bad += host[i * m->ncols + j] != value(v, p, (uint64_t)(i * COLS + m->col0 + j));
    }
    return bad;
}

static int run_receiver(const opts_t *o, wsync_ctx_t *ctx)
{
    shape_t m;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    wsync_receiver_t *rv;
    wsync_status_t st;
    void *tgt[MAXP];
    uint16_t *host;
    uint64_t got = 0, last = (uint64_t)(o->warmup + o->iters);
    size_t bad_all = 0;
    int checked = 0;

    if (model_shape(o, &m) != 0)
        return 2;
    size_t n = (size_t)m.rows * (size_t)m.ncols;
    host = malloc(n * 2 + 2);
    rp.coordinator = o->coord;
    rp.rank = o->rank;
    rp.nreceivers = o->receivers;
    st = wsync_receiver_create(ctx, &rp, &rv);
    if (st != WSYNC_OK || host == NULL) {
        fprintf(stderr, "receiver %d: create: %s: %s\n", o->rank, wsync_status_name(st),
                wsync_last_error());
        return 1;
    }
    for (int p = 0; p < o->params; p++) {
        char name[16];
        snprintf(name, sizeof(name), "w%d", p);
        if ((tgt[p] = buf_alloc(o, n * 2)) == NULL)
            return 1;
        wsync_piece_t pc = {{name, WSYNC_DTYPE_BF16, 2, {m.rows, COLS}},
                            {{0, m.col0}, {m.rows, m.ncols}}, {0}};
        wsync_target_t t = {name, WSYNC_DTYPE_BF16, 2, {m.rows, m.ncols}, tgt[p],
                            is_cuda(o) ? WSYNC_MEM_CUDA : WSYNC_MEM_HOST, o->device, &pc, 1, {0}};
        if ((st = wsync_receiver_add_target(rv, &t)) != WSYNC_OK) {
            fprintf(stderr, "receiver %d: add_target: %s\n", o->rank, wsync_last_error());
            return 1;
        }
    }
    while (got < last) {
        st = wsync_receiver_wait(rv, 300000, &got);
        if (st != WSYNC_OK) {
            fprintf(stderr, "receiver %d: wait: %s: %s\n", o->rank, wsync_status_name(st),
                    wsync_last_error());
            return 1;
        }
        /* the first version landed and the last: every element */
        if (got == 1 || got == last) {
            size_t bad = count_bad(o, &m, tgt, host, got);
            bad_all += bad;
            checked++;
            if (bad != 0)
                fprintf(stderr, "receiver %d: version %llu: %zu of %zu elements differ\n",
                        o->rank, (unsigned long long)got, bad, n * (size_t)o->params);
        }
        if (got >= (uint64_t)o->warmup && got < last) {
            char f[32];
            snprintf(f, sizeof(f), "checked.%d", o->rank);
            struct stat sb;
            char path[512];
            snprintf(path, sizeof(path), "%s/%s", o->dir, f);
            if (stat(path, &sb) != 0 && put_file(o->dir, f, "1", 1) != 0)
                return 1;
        }
    }
    char f[32];
    snprintf(f, sizeof(f), "done.%d", o->rank);
    put_file(o->dir, f, "1", 1);
    printf("receiver %d (%s, scheme %s): versions 1 and %llu checked (%d checks, %zu elements "
           "each), %zu elements differ\n", o->rank, o->name, wsync_receiver_scheme(rv),
           (unsigned long long)last, checked, n * (size_t)o->params, bad_all);
    fflush(stdout);
    wsync_receiver_free(rv);
    free(host);
    return bad_all == 0 && checked >= 1 ? 0 : 1;
}

/* ---- raw NCCL over the same namespaces and transport ----------------------------------------- */

static int run_raw(const opts_t *o)
{
#if defined(NETNS_NCCL) && defined(NETNS_CUDA)
    ncclUniqueId id;
    ncclComm_t comm;
    cudaStream_t stream;
    void *buf, *one;
    double times[256];
    int nt = 0, send = strcmp(o->op, "send") == 0;

    if (send && o->nranks != 2) {
        fprintf(stderr, "raw send: 2 ranks, not %d\n", o->nranks);
        return 2;
    }
    if (cudaSetDevice(o->device) != cudaSuccess || cudaMalloc(&buf, o->bytes) != cudaSuccess ||
        cudaMalloc(&one, 4) != cudaSuccess || cudaStreamCreate(&stream) != cudaSuccess) {
        fprintf(stderr, "raw rank %d: CUDA set-up on device %d failed\n", o->rank, o->device);
        return 1;
    }
    cudaMemset(buf, o->rank, o->bytes);
    if (o->rank == 0) {
        if (ncclGetUniqueId(&id) != ncclSuccess || put_file(o->dir, "nccl.id", &id, sizeof(id)) != 0)
            return 1;
    } else {
        char path[512];
        if (wait_file(o->dir, "nccl.id", 120) != 0)
            return 1;
        snprintf(path, sizeof(path), "%s/nccl.id", o->dir);
        FILE *f = fopen(path, "rb");
        if (f == NULL || fread(&id, 1, sizeof(id), f) != sizeof(id)) {
            fprintf(stderr, "raw rank %d: cannot read %s\n", o->rank, path);
            return 1;
        }
        fclose(f);
    }
    ncclResult_t nr = ncclCommInitRank(&comm, o->nranks, id, o->rank);
    if (nr != ncclSuccess) {
        fprintf(stderr, "raw rank %d: ncclCommInitRank: %s\n", o->rank, ncclGetErrorString(nr));
        return 1;
    }
    for (int it = 0; it < 1 + o->iters; it++) {
        /* start together, end when every rank has its bytes (the small all-reduce) */
        ncclAllReduce(one, one, 1, ncclFloat, ncclSum, comm, stream);
        cudaStreamSynchronize(stream);
        double t0 = now_s();
        if (send) {
            if (o->rank == 0)
                nr = ncclSend(buf, o->bytes, ncclChar, 1, comm, stream);
            else
                nr = ncclRecv(buf, o->bytes, ncclChar, 0, comm, stream);
        } else {
            nr = ncclBroadcast(buf, buf, o->bytes, ncclChar, 0, comm, stream);
        }
        if (nr == ncclSuccess)
            nr = ncclAllReduce(one, one, 1, ncclFloat, ncclSum, comm, stream);
        if (nr != ncclSuccess || cudaStreamSynchronize(stream) != cudaSuccess) {
            fprintf(stderr, "raw rank %d: %s failed: %s\n", o->rank, o->op, ncclGetErrorString(nr));
            return 1;
        }
        if (it > 0 && nt < 256)
            times[nt++] = now_s() - t0;
    }
    /* what arrived is rank 0's bytes */
    unsigned char probe[2] = {7, 7};
    cudaMemcpy(&probe[0], buf, 1, cudaMemcpyDeviceToHost);
    cudaMemcpy(&probe[1], (char *)buf + o->bytes - 1, 1, cudaMemcpyDeviceToHost);
    if (probe[0] != 0 || probe[1] != 0) {
        fprintf(stderr, "raw rank %d: received bytes %u %u, not rank 0's 0\n", o->rank, probe[0],
                probe[1]);
        return 1;
    }
    if (o->rank == 0) {
        double sec = median(times, nt);
        printf("{\"run\": \"%s\", \"kind\": \"raw\", \"op\": \"%s\", \"ranks\": %d, \"bytes\": %llu, "
               "\"iters\": %d, \"seconds\": %.6f, \"gbps_per_receiver\": %.3f}\n",
               o->name, send ? "ncclSend" : "ncclBroadcast", o->nranks,
               (unsigned long long)o->bytes, nt, sec, (double)o->bytes / sec / 1e9);
        fflush(stdout);
    }
    ncclCommDestroy(comm);
    cudaFree(buf);
    return 0;
#else
    (void)o;
    fprintf(stderr, "netns_member: built without NCCL: no raw baseline\n");
    return 77;
#endif
}

static int parse(int argc, char **argv, opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->mem = "cuda";
    o->scheme = "nccl";
    o->layout = "tp";
    o->op = "send";
    o->name = "netns";
    o->senders = o->receivers = o->nranks = 1;
    o->params = 8;
    o->warmup = 1;
    o->iters = 5;
    o->bytes = 256u << 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL) {
            fprintf(stderr, "netns_member: %s needs a value\n", a);
            return -1;
        }
        i++;
        if (!strcmp(a, "--role")) o->role = v;
        else if (!strcmp(a, "--coord")) o->coord = v;
        else if (!strcmp(a, "--mem")) o->mem = v;
        else if (!strcmp(a, "--scheme")) o->scheme = v;
        else if (!strcmp(a, "--layout")) o->layout = v;
        else if (!strcmp(a, "--dir")) o->dir = v;
        else if (!strcmp(a, "--op")) o->op = v;
        else if (!strcmp(a, "--name")) o->name = v;
        else if (!strcmp(a, "--rank")) o->rank = atoi(v);
        else if (!strcmp(a, "--senders")) o->senders = atoi(v);
        else if (!strcmp(a, "--receivers")) o->receivers = atoi(v);
        else if (!strcmp(a, "--nranks")) o->nranks = atoi(v);
        else if (!strcmp(a, "--device")) o->device = atoi(v);
        else if (!strcmp(a, "--params")) o->params = atoi(v);
        else if (!strcmp(a, "--warmup")) o->warmup = atoi(v);
        else if (!strcmp(a, "--iters")) o->iters = atoi(v);
        else if (!strcmp(a, "--bytes")) o->bytes = strtoull(v, NULL, 10);
        else {
            fprintf(stderr, "netns_member: unknown option %s\n", a);
            return -1;
        }
    }
    if (o->role == NULL || o->dir == NULL || o->senders < 1 || o->receivers < 1 ||
        o->params < 1 || o->params > MAXP || o->warmup < 1 || o->iters < 1 || o->iters > 255 ||
        o->bytes == 0 || (strcmp(o->role, "raw") != 0 && o->coord == NULL)) {
        fprintf(stderr, "netns_member: --role and --dir needed (and --coord but for raw); "
                        "params 1..%d, warmup >= 1, iters 1..255\n", MAXP);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    opts_t o;
    wsync_ctx_t *ctx;
    int rc;

    if (parse(argc, argv, &o) != 0)
        return 2;
    if (strcmp(o.role, "raw") == 0)
        return run_raw(&o);
    if (wsync_ctx_create(NULL, &ctx) != WSYNC_OK) {
        fprintf(stderr, "netns_member: context: %s\n", wsync_last_error());
        return 1;
    }
    if (strcmp(o.role, "sender") == 0)
        rc = run_sender(&o, ctx);
    else if (strcmp(o.role, "receiver") == 0)
        rc = run_receiver(&o, ctx);
    else {
        fprintf(stderr, "netns_member: --role sender, receiver or raw, not %s\n", o.role);
        rc = 2;
    }
    wsync_ctx_free(ctx);
    return rc;
}
