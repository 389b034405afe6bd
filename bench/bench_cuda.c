/* wsync-bench's CUDA and NCCL calls: device memory for model runs, and the link probe that
 * measures, in the same run as the sync, what the floor is computed from. */
#include "bench/bench_cuda.h"

#include "wsync_build_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if WSYNC_HAVE_CUDA

#include <cuda_runtime_api.h>
#include <stdarg.h>

#include "core/delta.h"
#include "kernels/delta.h"
#include "kernels/kernels.h"
#if WSYNC_HAVE_NCCL
#include <nccl.h>
#endif

static int cuda_failed(const char *call, cudaError_t e)
{
    int dev = -1;
    cudaGetDevice(&dev);
    fprintf(stderr, PROG ": %s on GPU %d failed: %s (%s)\n", call, dev, cudaGetErrorString(e),
            cudaGetErrorName(e));
    return -1;
}

#define CU(call, text)                                                                        \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess)                                                                \
            return cuda_failed(text, e_);                                                     \
    } while (0)

int bcuda_compiled(void) { return 1; }
int bcuda_nccl_compiled(void) { return WSYNC_HAVE_NCCL; }

int bcuda_device_count(int *n)
{
    int c = 0;
    cudaError_t e = cudaGetDeviceCount(&c);
    if (e != cudaSuccess) {
        fprintf(stderr, PROG ": cudaGetDeviceCount failed: %s (no CUDA device or driver?)\n",
                cudaGetErrorString(e));
        return -1;
    }
    *n = c;
    return 0;
}

int bcuda_set_device(int dev)
{
    char call[48];
    snprintf(call, sizeof(call), "cudaSetDevice(%d)", dev);
    CU(cudaSetDevice(dev), call);
    CU(cudaFree(NULL), "cudaFree(NULL) (context creation)");
    return 0;
}

int bcuda_device_name(int dev, char *buf, size_t len)
{
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
    snprintf(buf, len, "%s", prop.name);
    return 0;
}

int bcuda_mem_info(int dev, size_t *free_bytes, size_t *total_bytes)
{
    char call[48];
    size_t f = 0, t = 0;
    snprintf(call, sizeof(call), "cudaSetDevice(%d)", dev);
    CU(cudaSetDevice(dev), call);
    CU(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
    *free_bytes = f;
    *total_bytes = t;
    return 0;
}

int bcuda_malloc(void **p, size_t bytes)
{
    char call[64];
    snprintf(call, sizeof(call), "cudaMalloc(%zu bytes)", bytes);
    CU(cudaMalloc(p, bytes ? bytes : 256), call);
    return 0;
}

void bcuda_free(void *p)
{
    if (p)
        cudaFree(p);
}

int bcuda_memset(void *p, int byte, size_t bytes)
{
    CU(cudaMemset(p, byte, bytes), "cudaMemset");
    CU(cudaDeviceSynchronize(), "cudaDeviceSynchronize after cudaMemset");
    return 0;
}

int bcuda_h2d(void *dst, const void *src, size_t bytes)
{
    CU(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy host to device");
    return 0;
}

int bcuda_d2h(void *dst, const void *src, size_t bytes)
{
    CU(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy device to host");
    return 0;
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int bcuda_d2d(void *dst, const void *src, size_t bytes)
{
    CU(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy device to device");
    return 0;
}

/* ---- --delta: the codec's times ---------------------------------------------------------- */

#define CODEC_BATCH_BYTES ((size_t)256 << 20)
#define CODEC_MAX_REPS 32

static uint64_t align8(uint64_t v) { return (v + 7) & ~(uint64_t)7; }

static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_dbl);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

typedef struct {
    cudaStream_t s;
    cudaEvent_t a, b;
} codec_timer_t;

/* Chunks [i, *j) of c: as many as fit in CODEC_BATCH_BYTES of span (one at least); *span their
 * bytes from c[i].off, *out the encode buffers they need. */
static void codec_batch(const bench_codec_chunk_t *c, size_t n, size_t i, size_t *j, size_t *span,
                        uint64_t *out)
{
    size_t k = i;
    *out = 0;
    do {
        *span = c[k].off + c[k].n * c[k].esize - c[i].off;
        *out += align8(wsync_delta_max_bytes(c[k].n, c[k].esize));
        k++;
    } while (k < n && c[k].off + c[k].n * c[k].esize - c[i].off <= CODEC_BATCH_BYTES);
    *j = k;
}

/* The stage a batch runs `reps` times (after one untimed): 0 encode, 1 apply, 2 copy, 3 amax. */
typedef struct {
    int what;
    wsync_kdelta_batch_t *batch;
    const uint64_t *lens;
    char *dcopy;
    const char *dnew, *dold;
    size_t span;
    float *damax;
} codec_stage_t;

/* 0 with *median, 1 when the amax reference could not run (*median 0), -1 told. */
static int codec_time(codec_timer_t *t, const codec_stage_t *st, int reps, double *median)
{
    double v[CODEC_MAX_REPS];
    for (int r = 0; r <= reps; r++) {
        wsync_status_t ws = WSYNC_OK;
        if (st->what == 1) /* apply onto a fresh copy of the old values each time, untimed */
            CU(cudaMemcpyAsync(st->dcopy, st->dold, st->span, cudaMemcpyDeviceToDevice, t->s),
               "cudaMemcpyAsync (the old values' copy)");
        CU(cudaEventRecord(t->a, t->s), "cudaEventRecord");
        switch (st->what) {
        case 0: ws = wsync_kdelta_launch(st->batch, NULL, t->s); break;
        case 1: ws = wsync_kdelta_launch(st->batch, st->lens, t->s); break;
        case 2:
            CU(cudaMemcpyAsync(st->dcopy, st->dnew, st->span, cudaMemcpyDeviceToDevice, t->s),
               "cudaMemcpyAsync (device to device)");
            break;
        default:
            ws = wsync_kernels_amax(st->dold, WSYNC_DTYPE_BF16, 1, st->span / 2, st->span / 2,
                                    st->damax, t->s);
            if (ws == WSYNC_OK)
                ws = wsync_kernels_amax(st->dnew, WSYNC_DTYPE_BF16, 1, st->span / 2,
                                        st->span / 2, st->damax, t->s);
        }
        if (ws != WSYNC_OK && st->what == 3) { /* a reference only: go on without it */
            fprintf(stderr, PROG ": the amax reference failed (%s); reading both versions is "
                            "timed by the copy alone\n", wsync_last_error());
            return 1;
        }
        if (ws != WSYNC_OK) {
            fprintf(stderr, PROG ": the delta codec's %s launch failed: %s\n",
                    st->what == 0 ? "encode" : "apply", wsync_last_error());
            return -1;
        }
        CU(cudaEventRecord(t->b, t->s), "cudaEventRecord");
        CU(cudaEventSynchronize(t->b), "cudaEventSynchronize");
        float ms = 0;
        CU(cudaEventElapsedTime(&ms, t->a, t->b), "cudaEventElapsedTime");
        if (r > 0)
            v[r - 1] = ms / 1e3;
    }
    *median = median_of(v, reps);
    return 0;
}

static void codec_wrong(bench_codec_res_t *res, const char *fmt, ...)
{
    if (!res->correct)
        return;
    res->correct = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res->wrong, sizeof(res->wrong), fmt, ap);
    va_end(ap);
}

int bcuda_delta_codec(const char *dnew, const char *dold, const bench_codec_chunk_t *c, size_t n,
                      int reps, bench_codec_res_t *res)
{
    codec_timer_t t = {NULL, NULL, NULL};
    char *dcopy = NULL, *dout = NULL, *hnew = NULL, *hgot = NULL;
    float *damax = NULL;
    wsync_kdelta_enc_t *ec = calloc(n ? n : 1, sizeof(*ec));
    wsync_kdelta_app_t *ac = calloc(n ? n : 1, sizeof(*ac));
    uint64_t *lens = calloc(n ? n : 1, sizeof(*lens)), *hashes = calloc(n ? n : 1, sizeof(*hashes));
    wsync_kdelta_batch_t *eb = NULL, *ab = NULL;
    size_t most_span = 0;
    uint64_t most_out = 0;
    int rc = -1, amax_ok = 1;

    memset(res, 0, sizeof(*res));
    res->correct = 1;
    if (reps < 1 || reps > CODEC_MAX_REPS) {
        fprintf(stderr, PROG ": bcuda_delta_codec: reps %d is not in [1, %d]\n", reps,
                CODEC_MAX_REPS);
        goto out;
    }
    if (!ec || !ac || !lens || !hashes) {
        fprintf(stderr, PROG ": the delta codec's figures: out of host memory\n");
        goto out;
    }
    for (size_t i = 0, j = 0; i < n; i = j) {
        size_t span;
        uint64_t o;
        codec_batch(c, n, i, &j, &span, &o);
        most_span = span > most_span ? span : most_span;
        most_out = o > most_out ? o : most_out;
    }
    if (n == 0) {
        rc = 0;
        goto out;
    }
    if (!(hnew = malloc(most_span)) || !(hgot = malloc(most_span))) {
        fprintf(stderr, PROG ": the delta codec's check: no host memory for 2 x %zu bytes\n",
                most_span);
        goto out;
    }
#define CUGO(call, text)                                                                      \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            cuda_failed(text, e_);                                                            \
            goto out;                                                                         \
        }                                                                                     \
    } while (0)
    CUGO(cudaStreamCreateWithFlags(&t.s, cudaStreamNonBlocking), "cudaStreamCreate");
    CUGO(cudaEventCreate(&t.a), "cudaEventCreate");
    CUGO(cudaEventCreate(&t.b), "cudaEventCreate");
    CUGO(cudaMalloc((void **)&dcopy, most_span), "cudaMalloc (the codec's copy)");
    CUGO(cudaMalloc((void **)&dout, most_out), "cudaMalloc (the codec's encode buffers)");
    CUGO(cudaMalloc((void **)&damax, sizeof(float)), "cudaMalloc (amax)");

    for (size_t i = 0, j = 0; i < n; i = j) {
        size_t span, lo = c[i].off;
        uint64_t o, at = 0;
        wsync_status_t ws;
        codec_batch(c, n, i, &j, &span, &o);
        for (size_t k = i; k < j; k++) {
            uint64_t cap = wsync_delta_max_bytes(c[k].n, c[k].esize);
            wsync_region_t r = {0, c[k].n, 1, c[k].n};
            ec[k - i] = (wsync_kdelta_enc_t){dnew + c[k].off, (void *)(dold + c[k].off), r,
                                             c[k].esize, dout + at, cap};
            ac[k - i] = (wsync_kdelta_app_t){dout + at, cap, dcopy + (c[k].off - lo), r,
                                             c[k].esize};
            at += align8(cap);
        }
        /* encode: what a sender runs each version (the old values stay as they are: update_old
         * off, so every launch does the same work) */
        if ((ws = wsync_kdelta_encode_create(ec, (uint32_t)(j - i), 0, &eb)) != WSYNC_OK) {
            fprintf(stderr, PROG ": wsync_kdelta_encode_create failed: %s\n", wsync_last_error());
            goto out;
        }
        codec_stage_t st = {0, eb, NULL, dcopy, dnew + lo, dold + lo, span, damax};
        double e_s, a_s, c_s, m_s;
        if (codec_time(&t, &st, reps, &e_s) != 0)
            goto out;
        const wsync_kdelta_result_t *er = wsync_kdelta_results(eb);
        for (size_t k = i; k < j; k++) {
            uint64_t plain = c[k].n * c[k].esize;
            lens[k - i] = er[k - i].len;
            hashes[k - i] = er[k - i].hash;
            res->changed += er[k - i].changed;
            res->sent += er[k - i].len < plain ? er[k - i].len : plain;
            if (er[k - i].len > ec[k - i].cap)
                codec_wrong(res, "chunk at byte %zu: encoded %llu bytes, above the bound %llu",
                            c[k].off, (unsigned long long)er[k - i].len,
                            (unsigned long long)ec[k - i].cap);
        }
        /* apply, with the hash: what a receiver runs */
        if ((ws = wsync_kdelta_apply_create(ac, (uint32_t)(j - i), 1, &ab)) != WSYNC_OK) {
            fprintf(stderr, PROG ": wsync_kdelta_apply_create failed: %s\n", wsync_last_error());
            goto out;
        }
        st.what = 1;
        st.batch = ab;
        st.lens = lens;
        if (codec_time(&t, &st, reps, &a_s) != 0)
            goto out;
        const wsync_kdelta_result_t *ar = wsync_kdelta_results(ab);
        for (size_t k = i; k < j; k++) {
            if (ar[k - i].fault != WSYNC_KDELTA_NO_FAULT)
                codec_wrong(res, "chunk at byte %zu: the apply found fault %llu (block %llu)",
                            c[k].off, (unsigned long long)(ar[k - i].fault & 0xFF),
                            (unsigned long long)(ar[k - i].fault >> 8));
            else if (ar[k - i].hash != hashes[k - i])
                codec_wrong(res, "chunk at byte %zu: hash after applying %016llx, the "
                            "encoder's %016llx", c[k].off, (unsigned long long)ar[k - i].hash,
                            (unsigned long long)hashes[k - i]);
        }
        /* dcopy holds the last apply's result: byte for byte the new values? */
        CUGO(cudaMemcpy(hgot, dcopy, span, cudaMemcpyDeviceToHost), "cudaMemcpy (applied)");
        CUGO(cudaMemcpy(hnew, dnew + lo, span, cudaMemcpyDeviceToHost), "cudaMemcpy (new)");
        for (size_t k = i; k < j; k++) {
            size_t at2 = c[k].off - lo, len = (size_t)(c[k].n * c[k].esize);
            if (memcmp(hgot + at2, hnew + at2, len) != 0)
                codec_wrong(res, "chunk at byte %zu (%llu elements): the applied bytes differ "
                            "from the new ones", c[k].off, (unsigned long long)c[k].n);
        }
        wsync_kdelta_free(ab);
        ab = NULL;
        wsync_kdelta_free(eb);
        eb = NULL;
        /* reading both versions once: a copy of one (reads and writes a version's bytes), and
         * an amax over each */
        st.what = 2;
        if (codec_time(&t, &st, reps, &c_s) != 0)
            goto out;
        st.what = 3;
        int amax_rc = codec_time(&t, &st, reps, &m_s);
        if (amax_rc < 0)
            goto out;
        if (amax_rc > 0)
            amax_ok = 0;
        res->encode_s += e_s;
        res->apply_s += a_s;
        res->copy_s += c_s;
        res->amax_s += m_s;
    }
#undef CUGO
    if (!amax_ok)
        res->amax_s = 0; /* not measured in every batch: no figure */
    rc = 0;
out:
    wsync_kdelta_free(ab);
    wsync_kdelta_free(eb);
    if (t.a)
        cudaEventDestroy(t.a);
    if (t.b)
        cudaEventDestroy(t.b);
    if (t.s)
        cudaStreamDestroy(t.s);
    if (dcopy)
        cudaFree(dcopy);
    if (dout)
        cudaFree(dout);
    if (damax)
        cudaFree(damax);
    free(hnew);
    free(hgot);
    free(ec);
    free(ac);
    free(lens);
    free(hashes);
    return rc;
}

enum { PROBE_RUNS = 5 };

/* Median seconds of PROBE_RUNS copies src (on src_dev) -> dst (on dst_dev), one untimed first,
 * each timed with events on a stream of the source device. */
static int time_copy(int src_dev, void *src, int dst_dev, void *dst, size_t bytes, double *sec)
{
    cudaStream_t s;
    cudaEvent_t a, b;
    float ms[PROBE_RUNS];
    double v[PROBE_RUNS];
    CU(cudaSetDevice(src_dev), "cudaSetDevice");
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    CU(cudaEventCreate(&a), "cudaEventCreate");
    CU(cudaEventCreate(&b), "cudaEventCreate");
    for (int r = -1; r < PROBE_RUNS; r++) {
        CU(cudaEventRecord(a, s), "cudaEventRecord");
        if (src_dev == dst_dev)
            CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s),
               "cudaMemcpyAsync device to device");
        else
            CU(cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, bytes, s), "cudaMemcpyPeerAsync");
        CU(cudaEventRecord(b, s), "cudaEventRecord");
        CU(cudaEventSynchronize(b), "cudaEventSynchronize");
        if (r >= 0)
            CU(cudaEventElapsedTime(&ms[r], a, b), "cudaEventElapsedTime");
    }
    for (int r = 0; r < PROBE_RUNS; r++)
        v[r] = ms[r] * 1e-3;
    qsort(v, PROBE_RUNS, sizeof(double), cmp_dbl);
    *sec = v[PROBE_RUNS / 2];
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaStreamDestroy(s);
    return 0;
}

/* Every pair of req copying at once: pair p copies copy_bytes / ngpus from a[src] into its own
 * slice of b[dst] (slice = the source's index, so no two copies write the same bytes), four
 * times over on a stream of its own, all started together; the median over PROBE_RUNS timed
 * runs after one untimed of the host time from the start to the last GPU's end. A GPU's load
 * is the larger of the bytes it sends and receives: the busiest GPU's load over that time is
 * what a GPU's links give when every peer uses them at once. The single-pair copies above
 * measure one link alone, which an all-to-all pattern (a colocated group's peer reads) may not
 * reach on every link at once. */
enum { PROBE_ALL_ROUNDS = 4 };

static int time_pairs_at_once(const bench_probe_req_t *req, void *const *a, void *const *b,
                              bench_probe_res_t *res)
{
    cudaStream_t st[MODEL_MAX_GPUS * MODEL_MAX_GPUS] = {0};
    size_t slice = req->copy_bytes / (size_t)req->ngpus / 256 * 256;
    uint64_t in[MODEL_MAX_GPUS] = {0}, out[MODEL_MAX_GPUS] = {0}, busiest = 0;
    int si[MODEL_MAX_GPUS * MODEL_MAX_GPUS], di[MODEL_MAX_GPUS * MODEL_MAX_GPUS];
    double v[PROBE_RUNS];
    int rc = -1;
    for (int p = 0; p < req->npairs; p++) {
        si[p] = di[p] = -1;
        for (int i = 0; i < req->ngpus; i++) {
            if (req->gpus[i] == req->pair_src[p])
                si[p] = i;
            if (req->gpus[i] == req->pair_dst[p])
                di[p] = i;
        }
        if (si[p] < 0 || di[p] < 0)
            continue;
        out[si[p]] += (uint64_t)slice * PROBE_ALL_ROUNDS;
        in[di[p]] += (uint64_t)slice * PROBE_ALL_ROUNDS;
        if (cudaSetDevice(req->pair_src[p]) != cudaSuccess ||
            cudaStreamCreateWithFlags(&st[p], cudaStreamNonBlocking) != cudaSuccess) {
            cuda_failed("cudaStreamCreate for the all-pairs probe", cudaGetLastError());
            goto out;
        }
    }
    for (int i = 0; i < req->ngpus; i++) {
        if (in[i] > busiest)
            busiest = in[i];
        if (out[i] > busiest)
            busiest = out[i];
    }
    for (int r = -1; r < PROBE_RUNS; r++) {
        struct timespec t0, t1;
        for (int i = 0; i < req->ngpus; i++)
            if (cudaSetDevice(req->gpus[i]) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
                cuda_failed("cudaDeviceSynchronize before the all-pairs probe", cudaGetLastError());
                goto out;
            }
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int k = 0; k < PROBE_ALL_ROUNDS; k++)
            for (int p = 0; p < req->npairs; p++) {
                if (st[p] == NULL)
                    continue;
                cudaError_t e = cudaMemcpyPeerAsync((char *)b[di[p]] + (size_t)si[p] * slice,
                                                    req->pair_dst[p], a[si[p]], req->pair_src[p],
                                                    slice, st[p]);
                if (e != cudaSuccess) {
                    cuda_failed("cudaMemcpyPeerAsync (all pairs at once)", e);
                    goto out;
                }
            }
        for (int p = 0; p < req->npairs; p++)
            if (st[p] != NULL && cudaStreamSynchronize(st[p]) != cudaSuccess) {
                cuda_failed("cudaStreamSynchronize (all pairs at once)", cudaGetLastError());
                goto out;
            }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (r >= 0)
            v[r] = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    }
    qsort(v, PROBE_RUNS, sizeof(double), cmp_dbl);
    res->peer_all_s = v[PROBE_RUNS / 2];
    res->peer_all_gbps = (double)busiest / res->peer_all_s / 1e9;
    rc = 0;
out:
    for (int p = 0; p < req->npairs; p++)
        if (st[p] != NULL) {
            cudaSetDevice(req->pair_src[p]);
            cudaStreamDestroy(st[p]);
        }
    return rc;
}

static void probe_broadcast(const bench_probe_req_t *req, bench_probe_res_t *res)
{
#if WSYNC_HAVE_NCCL
    int n = req->ngpus, root = 0, ok = 0;
    ncclComm_t comms[MODEL_MAX_GPUS] = {0};
    void *buf[MODEL_MAX_GPUS] = {0};
    cudaStream_t st[MODEL_MAX_GPUS] = {0};
    double v[PROBE_RUNS];
    ncclResult_t nr;
    for (int i = 0; i < n; i++)
        if (req->gpus[i] == req->bcast_root)
            root = i;
    if ((nr = ncclCommInitAll(comms, n, req->gpus)) != ncclSuccess) {
        snprintf(res->bcast_note, sizeof(res->bcast_note), "ncclCommInitAll over %d GPUs: %s", n,
                 ncclGetErrorString(nr));
        return;
    }
    for (int i = 0; i < n; i++) {
        cudaError_t e;
        if ((e = cudaSetDevice(req->gpus[i])) != cudaSuccess ||
            (e = cudaMalloc(&buf[i], req->bcast_bytes)) != cudaSuccess ||
            (e = cudaMemset(buf[i], i == root ? 0x3C : 0, req->bcast_bytes)) != cudaSuccess ||
            (e = cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking)) != cudaSuccess) {
            snprintf(res->bcast_note, sizeof(res->bcast_note),
                     "broadcast buffer of %zu bytes on GPU %d: %s", req->bcast_bytes,
                     req->gpus[i], cudaGetErrorString(e));
            goto out;
        }
    }
    for (int r = -1; r < PROBE_RUNS; r++) {
        for (int i = 0; i < n; i++) {
            cudaSetDevice(req->gpus[i]);
            cudaDeviceSynchronize();
        }
        double t0 = bench_now_s();
        if ((nr = ncclGroupStart()) != ncclSuccess)
            goto nccl_err;
        for (int i = 0; i < n; i++) {
            cudaSetDevice(req->gpus[i]);
            nr = ncclBroadcast(buf[i], buf[i], req->bcast_bytes, ncclInt8, root, comms[i], st[i]);
            if (nr != ncclSuccess) {
                ncclGroupEnd();
                goto nccl_err;
            }
        }
        if ((nr = ncclGroupEnd()) != ncclSuccess)
            goto nccl_err;
        for (int i = 0; i < n; i++) {
            cudaError_t e = cudaStreamSynchronize(st[i]);
            if (e != cudaSuccess) {
                snprintf(res->bcast_note, sizeof(res->bcast_note),
                         "cudaStreamSynchronize after ncclBroadcast on GPU %d: %s", req->gpus[i],
                         cudaGetErrorString(e));
                goto out;
            }
        }
        if (r >= 0)
            v[r] = bench_now_s() - t0;
    }
    qsort(v, PROBE_RUNS, sizeof(double), cmp_dbl);
    res->bcast_s = v[PROBE_RUNS / 2];
    res->bcast_gbps = (double)req->bcast_bytes / res->bcast_s / 1e9;
    snprintf(res->bcast_note, sizeof(res->bcast_note),
             "ncclBroadcast of %zu bytes from GPU %d over %d GPUs, one process, median of %d",
             req->bcast_bytes, req->bcast_root, n, PROBE_RUNS);
    ok = 1;
    goto out;
nccl_err:
    snprintf(res->bcast_note, sizeof(res->bcast_note), "ncclBroadcast: %s",
             ncclGetErrorString(nr));
out:
    for (int i = 0; i < n; i++) {
        cudaSetDevice(req->gpus[i]);
        if (st[i])
            cudaStreamDestroy(st[i]);
        if (buf[i])
            cudaFree(buf[i]);
        if (comms[i])
            ncclCommDestroy(comms[i]);
    }
    if (!ok)
        res->bcast_gbps = 0;
#else
    (void)req;
    snprintf(res->bcast_note, sizeof(res->bcast_note), "not measured: built without NCCL");
#endif
}

int bcuda_probe(const bench_probe_req_t *req, bench_probe_res_t *res)
{
    void *a[MODEL_MAX_GPUS] = {0}, *b[MODEL_MAX_GPUS] = {0};
    int rc = -1;
    memset(res, 0, sizeof(*res));
    for (int i = 0; i < req->ngpus; i++) {
        char call[80];
        snprintf(call, sizeof(call), "cudaMalloc(2 x %zu bytes) for the link probe",
                 req->copy_bytes);
        if (bcuda_set_device(req->gpus[i]) != 0)
            goto out;
        cudaError_t e = cudaMalloc(&a[i], req->copy_bytes);
        if (e == cudaSuccess)
            e = cudaMalloc(&b[i], req->copy_bytes);
        if (e == cudaSuccess)
            e = cudaMemset(a[i], 0x5A, req->copy_bytes);
        if (e != cudaSuccess) {
            cuda_failed(call, e);
            goto out;
        }
        /* peer access where the pair allows it, as a sync between those GPUs would use */
        for (int j = 0; j < req->ngpus; j++) {
            int can = 0;
            if (j != i && cudaDeviceCanAccessPeer(&can, req->gpus[i], req->gpus[j]) ==
                              cudaSuccess && can) {
                e = cudaDeviceEnablePeerAccess(req->gpus[j], 0);
                if (e == cudaErrorPeerAccessAlreadyEnabled)
                    cudaGetLastError();
                else if (e != cudaSuccess) {
                    cuda_failed("cudaDeviceEnablePeerAccess", e);
                    goto out;
                }
            }
        }
    }
    for (int i = 0; i < req->ngpus; i++) {
        double s;
        if (time_copy(req->gpus[i], a[i], req->gpus[i], b[i], req->copy_bytes, &s) != 0)
            goto out;
        res->d2d_gbps[i] = (double)req->copy_bytes / s / 1e9;
        fprintf(stderr, PROG ": probe: device-to-device copy on GPU %d: %.1f GB/s\n",
                req->gpus[i], res->d2d_gbps[i]);
    }
    for (int p = 0; p < req->npairs; p++) {
        int si = -1, di = -1;
        double s;
        for (int i = 0; i < req->ngpus; i++) {
            if (req->gpus[i] == req->pair_src[p])
                si = i;
            if (req->gpus[i] == req->pair_dst[p])
                di = i;
        }
        if (si < 0 || di < 0)
            continue;
        if (time_copy(req->pair_src[p], a[si], req->pair_dst[p], b[di], req->copy_bytes, &s) !=
            0)
            goto out;
        res->peer_gbps[p] = (double)req->copy_bytes / s / 1e9;
        fprintf(stderr, PROG ": probe: peer copy GPU %d -> GPU %d: %.1f GB/s\n",
                req->pair_src[p], req->pair_dst[p], res->peer_gbps[p]);
    }
    if (req->npairs > 1) {
        if (time_pairs_at_once(req, a, b, res) != 0)
            goto out;
        fprintf(stderr, PROG ": probe: all %d peer pairs at once: %.1f GB/s on the busiest GPU "
                        "(the larger of its bytes in and out, over %.2f ms)\n",
                req->npairs, res->peer_all_gbps, res->peer_all_s * 1e3);
    }
    rc = 0;
out:
    for (int i = 0; i < req->ngpus; i++) {
        cudaSetDevice(req->gpus[i]);
        if (a[i])
            cudaFree(a[i]);
        if (b[i])
            cudaFree(b[i]);
    }
    if (rc != 0)
        return rc;
    if (req->ngpus < 2)
        snprintf(res->bcast_note, sizeof(res->bcast_note), "not measured: one GPU");
    else
        probe_broadcast(req, res);
    if (res->bcast_gbps > 0)
        fprintf(stderr, PROG ": probe: %s: %.1f GB/s\n", res->bcast_note, res->bcast_gbps);
    else
        fprintf(stderr, PROG ": probe: broadcast %s\n", res->bcast_note);
    return 0;
}

#else /* !WSYNC_HAVE_CUDA */

static int no_cuda(void)
{
    fprintf(stderr, PROG ": built without CUDA (configure with -DWSYNC_WITH_CUDA=ON)\n");
    return -1;
}

int bcuda_compiled(void) { return 0; }
int bcuda_nccl_compiled(void) { return 0; }
int bcuda_device_count(int *n) { (void)n; return no_cuda(); }
int bcuda_set_device(int dev) { (void)dev; return no_cuda(); }
int bcuda_device_name(int dev, char *buf, size_t len)
{
    (void)dev;
    (void)buf;
    (void)len;
    return no_cuda();
}
int bcuda_mem_info(int dev, size_t *free_bytes, size_t *total_bytes)
{
    (void)dev;
    (void)free_bytes;
    (void)total_bytes;
    return no_cuda();
}
int bcuda_malloc(void **p, size_t bytes)
{
    (void)p;
    (void)bytes;
    return no_cuda();
}
void bcuda_free(void *p) { (void)p; }
int bcuda_memset(void *p, int byte, size_t bytes)
{
    (void)p;
    (void)byte;
    (void)bytes;
    return no_cuda();
}
int bcuda_h2d(void *dst, const void *src, size_t bytes)
{
    (void)dst;
    (void)src;
    (void)bytes;
    return no_cuda();
}
int bcuda_d2h(void *dst, const void *src, size_t bytes)
{
    (void)dst;
    (void)src;
    (void)bytes;
    return no_cuda();
}
int bcuda_d2d(void *dst, const void *src, size_t bytes)
{
    (void)dst;
    (void)src;
    (void)bytes;
    return no_cuda();
}
int bcuda_delta_codec(const char *dnew, const char *dold, const bench_codec_chunk_t *c, size_t n,
                      int reps, bench_codec_res_t *res)
{
    (void)dnew;
    (void)dold;
    (void)c;
    (void)n;
    (void)reps;
    (void)res;
    return no_cuda();
}
int bcuda_probe(const bench_probe_req_t *req, bench_probe_res_t *res)
{
    (void)req;
    (void)res;
    return no_cuda();
}

#endif
