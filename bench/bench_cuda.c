/* wsync-bench's CUDA and NCCL calls: device memory for model runs, and the link probe that
 * measures, in the same run as the sync, what the floor is computed from. */
#include "bench/bench_cuda.h"

#include "wsync_build_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if WSYNC_HAVE_CUDA

#include <cuda_runtime_api.h>
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
int bcuda_probe(const bench_probe_req_t *req, bench_probe_res_t *res)
{
    (void)req;
    (void)res;
    return no_cuda();
}

#endif
