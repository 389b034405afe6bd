/* The engine's decoder step on one GPU per TP rank: the same arithmetic as forward.c (weights
 * times f32 activations with f32 accumulation, FP8 blocks dequantized on the fly, each block's
 * partial dot product times its scale), written as small kernels on one stream, no cuBLAS.
 * Compiled with --fmad=false (CMakeLists.txt) so that element-wise expressions round as the
 * CPU's do; only the order of the long sums differs (warp-parallel here). */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/cuda.h"

#define WARPS_PER_BLOCK 8
#define NORM_THREADS 512
#define HEAD_THREADS 128
#define ATT_THREADS 256
#define EW_THREADS 256
#define MAX_HEAD_DIM 1024

struct wse_cuda {
    int gpu;
    char name[256];
    cudaStream_t stream;
    cudaEvent_t done;
    wse_cuda_dims_t d;
    /* run state [shapes as in struct wsync_engine] */
    float *x, *xb, *xb2, *qkv, *att_out, *att, *hb, *hb2, *logits_local, *logits;
    float *rope_cos, *rope_sin;   /* [max_seq, D/2] */
    float *kcache, *vcache;       /* [L, max_seq, Kr * D] */
    size_t kv_bytes;
};

/* ---- errors -------------------------------------------------------------------------------- */

static wsync_status_t cu_fail(const char *call, int gpu, cudaError_t err)
{
    return wse_err(WSYNC_ERR_DEVICE, "%s on GPU %d: %s: %s", call, gpu, cudaGetErrorName(err),
                   cudaGetErrorString(err));
}

#define CU(call, gpu)                                                                         \
    do {                                                                                      \
        cudaError_t err_ = (call);                                                            \
        if (err_ != cudaSuccess)                                                              \
            return cu_fail(#call, (gpu), err_);                                               \
    } while (0)

/* After a launch: the configuration error, if any, names the kernel. */
#define LAUNCHED(name, gpu)                                                                   \
    do {                                                                                      \
        cudaError_t err_ = cudaGetLastError();                                                \
        if (err_ != cudaSuccess)                                                              \
            return cu_fail("launching " name, (gpu), err_);                                   \
    } while (0)

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- element loads ------------------------------------------------------------------------- */

__device__ __forceinline__ float bf16_to_f32(unsigned short b)
{
    return __uint_as_float((unsigned int)b << 16);
}

__device__ __forceinline__ float f16_to_f32(unsigned short h)
{
    return __half2float(__ushort_as_half(h));
}

/* F8E4M3FN, exactly: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits, no infinities, S.1111.111
 * is NaN; subnormals m * 2^-9 */
__device__ __forceinline__ float fp8_to_f32(unsigned int q)
{
    unsigned int sign = (q & 0x80u) << 24, e = (q >> 3) & 0xfu, m = q & 7u;
    if (e == 0) {
        float f = (float)m * 0x1p-9f;
        return sign ? -f : f;
    }
    if (e == 15 && m == 7)
        return __uint_as_float(sign | 0x7fc00000u);
    return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
}

__device__ __forceinline__ float load_elem(wsync_dtype_t dt, const void *p, size_t i)
{
    switch (dt) {
    case WSYNC_DTYPE_BF16: return bf16_to_f32(((const unsigned short *)p)[i]);
    case WSYNC_DTYPE_F16: return f16_to_f32(((const unsigned short *)p)[i]);
    case WSYNC_DTYPE_F32: return ((const float *)p)[i];
    default: return 0.0f;
    }
}

/* ---- reductions ---------------------------------------------------------------------------- */

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Every thread of the block gets the sum (max); blockDim.x a multiple of 32, <= 1024. */
__device__ float block_sum(float v)
{
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();   /* part may still be read by a previous call */
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : 0.0f;
    return warp_sum(v);
}

__device__ float block_max(float v)
{
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : -INFINITY;
    return warp_max(v);
}

/* ---- kernels ------------------------------------------------------------------------------- */

/* x[Hd] = row (token - lo) of the rank's embedding slice, or zeros when another rank holds it */
__global__ void embed_kernel(float *x, wsync_dtype_t dt, const void *emb, int64_t Hd,
                             int64_t row, int have)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < Hd;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = have ? load_elem(dt, emb, (size_t)(row * Hd + i)) : 0.0f;
}

/* out[n] = w[n] * (x[n] * r), r = 1 / sqrt(mean(x^2) + eps): HF's RMSNorm, one block */
__global__ void rmsnorm_kernel(float *out, const float *x, wsync_dtype_t dt, const void *w,
                               int64_t n, float eps)
{
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        ss += x[i] * x[i];
    ss = block_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        out[i] = load_elem(dt, w, (size_t)i) * (x[i] * r);
}

/* Partial dot product of one lane over a row: groups of 8 (16-byte loads) when `vec`, else one
 * element at a time. */
template <int DT>
__device__ __forceinline__ float row_dot(const void *w, int64_t row, int64_t cols,
                                         const float *x, int lane, bool vec)
{
    float acc = 0.0f;
    if (DT == WSYNC_DTYPE_F32) {
        const float *r = (const float *)w + row * cols;
        if (vec) {
            for (int64_t j = (int64_t)lane * 4; j < cols; j += 32 * 4) {
                float4 a = *(const float4 *)(r + j), b = *(const float4 *)(x + j);
                acc += a.x * b.x;
                acc += a.y * b.y;
                acc += a.z * b.z;
                acc += a.w * b.w;
            }
        } else {
            for (int64_t j = lane; j < cols; j += 32)
                acc += r[j] * x[j];
        }
        return acc;
    }
    const unsigned short *r = (const unsigned short *)w + row * cols;
    if (vec) {
        for (int64_t j = (int64_t)lane * 8; j < cols; j += 32 * 8) {
            uint4 q = *(const uint4 *)(r + j);
            float4 b0 = *(const float4 *)(x + j), b1 = *(const float4 *)(x + j + 4);
            unsigned int u[4] = {q.x, q.y, q.z, q.w};
            float xs[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                unsigned short lo = (unsigned short)(u[k] & 0xffffu), hi = (unsigned short)(u[k] >> 16);
                float wl = DT == WSYNC_DTYPE_BF16 ? bf16_to_f32(lo) : f16_to_f32(lo);
                float wh = DT == WSYNC_DTYPE_BF16 ? bf16_to_f32(hi) : f16_to_f32(hi);
                acc += wl * xs[2 * k];
                acc += wh * xs[2 * k + 1];
            }
        }
    } else {
        for (int64_t j = lane; j < cols; j += 32)
            acc += (DT == WSYNC_DTYPE_BF16 ? bf16_to_f32(r[j]) : f16_to_f32(r[j])) * x[j];
    }
    return acc;
}

/* FP8 row: each group of 16 (vec: 16-byte loads, blk a multiple of 16) or each element lies in
 * one block; its partial dot product is multiplied by that block's scale. */
__device__ __forceinline__ float row_dot_fp8(const unsigned char *w, const float *s, int64_t row,
                                             int64_t cols, int blk, const float *x, int lane,
                                             bool vec)
{
    const unsigned char *r = w + row * cols;
    const float *sr = s + (row / blk) * ((cols + blk - 1) / blk);
    float acc = 0.0f;
    if (vec) {
        for (int64_t j = (int64_t)lane * 16; j < cols; j += 32 * 16) {
            uint4 q = *(const uint4 *)(r + j);
            unsigned int u[4] = {q.x, q.y, q.z, q.w};
            float part = 0.0f;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float4 b = *(const float4 *)(x + j + 4 * k);
                part += fp8_to_f32(u[k] & 0xffu) * b.x;
                part += fp8_to_f32((u[k] >> 8) & 0xffu) * b.y;
                part += fp8_to_f32((u[k] >> 16) & 0xffu) * b.z;
                part += fp8_to_f32(u[k] >> 24) * b.w;
            }
            acc += part * sr[j / blk];
        }
    } else {
        for (int64_t j = lane; j < cols; j += 32)
            acc += fp8_to_f32(r[j]) * x[j] * sr[j / blk];
    }
    return acc;
}

/* out[rows] = m[rows, cols] . x[cols] (+ bias): one warp per row */
template <int DT>
__global__ void matvec_kernel(float *out, const void *w, const float *s, int64_t rows,
                              int64_t cols, int blk, const float *x, bool vec,
                              wsync_dtype_t bias_dt, const void *bias)
{
    int lane = threadIdx.x & 31;
    int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows)
        return;
    float acc = DT == WSYNC_DTYPE_F8E4M3FN
                    ? row_dot_fp8((const unsigned char *)w, s, row, cols, blk, x, lane, vec)
                    : row_dot<DT>(w, row, cols, x, lane, vec);
    acc = warp_sum(acc);
    if (lane == 0)
        out[row] = bias != NULL ? acc + load_elem(bias_dt, bias, (size_t)row) : acc;
}

/* q heads [0, Hr) and k heads [Hr, Hr + Kr) of qkv: optional RMSNorm over the head, then RoPE
 * (rotate-half, pairs (i, i + D/2)); k and v heads [Hr + Kr, Hr + 2 Kr) are written to the
 * cache at pos. One block per head. */
__global__ void qk_norm_rope_kernel(float *qkv, int64_t Hr, int64_t Kr, int64_t D,
                                    wsync_dtype_t qn_dt, const void *qn, wsync_dtype_t kn_dt,
                                    const void *kn, float eps, const float *cs, const float *sn,
                                    float *kc_pos, float *vc_pos)
{
    __shared__ float buf[MAX_HEAD_DIM];
    int64_t h = blockIdx.x, half = D / 2;
    float *v = qkv + h * D;

    if (h >= Hr + Kr) {   /* a v head: to the cache as is */
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x)
            vc_pos[(h - Hr - Kr) * D + i] = v[i];
        return;
    }
    const void *nw = h < Hr ? qn : kn;
    wsync_dtype_t nd = h < Hr ? qn_dt : kn_dt;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x)
        buf[i] = v[i];
    __syncthreads();
    if (nw != NULL) {
        float ss = 0.0f;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x)
            ss += buf[i] * buf[i];
        ss = block_sum(ss);
        float r = 1.0f / sqrtf(ss / (float)D + eps);
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x)
            buf[i] = load_elem(nd, nw, (size_t)i) * (buf[i] * r);
        __syncthreads();
    }
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
        float a = buf[i], b = buf[i + half];
        float lo = a * cs[i] - b * sn[i], hi = b * cs[i] + a * sn[i];
        v[i] = lo;
        v[i + half] = hi;
        if (h >= Hr) {
            kc_pos[(h - Hr) * D + i] = lo;
            kc_pos[(h - Hr) * D + i + half] = hi;
        }
    }
}

/* One block per local q head: scores against positions 0..pos, softmax, weighted sum of v.
 * att: [Hr, max_seq] scratch. */
__global__ void attention_kernel(float *att_out, float *att, const float *q, const float *kc,
                                 const float *vc, int64_t D, int64_t kvd, int max_seq, int pos,
                                 int64_t first_q, int64_t group, int64_t first_kv, float scale)
{
    __shared__ float qs[MAX_HEAD_DIM];
    int64_t h = blockIdx.x;
    int64_t kvh = (first_q + h) / group - first_kv;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float *a = att + h * (int64_t)max_seq;

    for (int64_t i = threadIdx.x; i < D; i += blockDim.x)
        qs[i] = q[h * D + i];
    __syncthreads();
    for (int t = warp; t <= pos; t += nw) {
        const float *kt = kc + (int64_t)t * kvd + kvh * D;
        float s = 0.0f;
        for (int64_t i = lane; i < D; i += 32)
            s += qs[i] * kt[i];
        s = warp_sum(s);
        if (lane == 0)
            a[t] = s * scale;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int t = threadIdx.x; t <= pos; t += blockDim.x)
        mx = fmaxf(mx, a[t]);
    mx = block_max(mx);
    float sum = 0.0f;
    for (int t = threadIdx.x; t <= pos; t += blockDim.x) {
        float e = expf(a[t] - mx);
        a[t] = e;
        sum += e;
    }
    sum = block_sum(sum);   /* its barriers also publish a[] to the block */
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
        float o = 0.0f;
        for (int t = 0; t <= pos; t++)
            o += a[t] / sum * vc[(int64_t)t * kvd + kvh * D + i];
        att_out[h * D + i] = o;
    }
}

/* hb2[i] = silu(gate[i]) * up[i], gate_up = [gate; up] */
__global__ void swiglu_kernel(float *hb2, const float *hb, int64_t Ir)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < Ir;
         i += (int64_t)gridDim.x * blockDim.x) {
        float g = hb[i];
        hb2[i] = g / (1.0f + expf(-g)) * hb[Ir + i];
    }
}

__global__ void add_kernel(float *x, const float *y, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

/* ---- host side ----------------------------------------------------------------------------- */

static unsigned int ew_blocks(int64_t n)
{
    int64_t b = (n + EW_THREADS - 1) / EW_THREADS;
    return (unsigned int)(b < 1 ? 1 : b > 4096 ? 4096 : b);
}

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

static wsync_status_t matvec(wse_cuda_t *c, float *out, const wse_mat_t *m, const float *x,
                             const wse_vec_t *bias)
{
    const int64_t rows = m->rows, cols = m->cols;
    const unsigned int blocks = (unsigned int)((rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK);
    const void *b = bias != NULL ? bias->w : NULL;
    wsync_dtype_t bdt = bias != NULL ? bias->dtype : WSYNC_DTYPE_F32;
    size_t esz = m->dtype == WSYNC_DTYPE_F32 ? 4 : m->dtype == WSYNC_DTYPE_F8E4M3FN ? 1 : 2;
    int64_t group = m->dtype == WSYNC_DTYPE_F32 ? 4 : m->dtype == WSYNC_DTYPE_F8E4M3FN ? 16 : 8;
    /* whole 16-byte loads of every row, and (FP8) groups that never straddle a block */
    bool vec = cols % group == 0 && ((size_t)cols * esz) % 16 == 0 && aligned16(m->w) &&
               aligned16(x) && (m->dtype != WSYNC_DTYPE_F8E4M3FN || m->blk % 16 == 0);

    if (rows == 0)
        return WSYNC_OK;
    switch (m->dtype) {
    case WSYNC_DTYPE_BF16:
        matvec_kernel<WSYNC_DTYPE_BF16><<<blocks, WARPS_PER_BLOCK * 32, 0, c->stream>>>(
            out, m->w, m->s, rows, cols, m->blk, x, vec, bdt, b);
        break;
    case WSYNC_DTYPE_F16:
        matvec_kernel<WSYNC_DTYPE_F16><<<blocks, WARPS_PER_BLOCK * 32, 0, c->stream>>>(
            out, m->w, m->s, rows, cols, m->blk, x, vec, bdt, b);
        break;
    case WSYNC_DTYPE_F32:
        matvec_kernel<WSYNC_DTYPE_F32><<<blocks, WARPS_PER_BLOCK * 32, 0, c->stream>>>(
            out, m->w, m->s, rows, cols, m->blk, x, vec, bdt, b);
        break;
    case WSYNC_DTYPE_F8E4M3FN:
        if (m->s == NULL || m->blk < 1)
            return wse_err(WSYNC_ERR_INTERNAL, "an FP8 weight without block scales");
        matvec_kernel<WSYNC_DTYPE_F8E4M3FN><<<blocks, WARPS_PER_BLOCK * 32, 0, c->stream>>>(
            out, m->w, m->s, rows, cols, m->blk, x, vec, bdt, b);
        break;
    default:
        return wse_err(WSYNC_ERR_UNSUPPORTED, "no CUDA matvec for %s weights",
                       wsync_dtype_name(m->dtype));
    }
    LAUNCHED("matvec_kernel", c->gpu);
    return WSYNC_OK;
}

static wsync_status_t rmsnorm(wse_cuda_t *c, float *out, const float *x, const wse_vec_t *w,
                              int64_t n)
{
    rmsnorm_kernel<<<1, NORM_THREADS, 0, c->stream>>>(out, x, w->dtype, w->w, n, c->d.eps);
    LAUNCHED("rmsnorm_kernel", c->gpu);
    return WSYNC_OK;
}

static wsync_status_t add(wse_cuda_t *c, float *x, const float *y, int64_t n)
{
    add_kernel<<<ew_blocks(n), EW_THREADS, 0, c->stream>>>(x, y, n);
    LAUNCHED("add_kernel", c->gpu);
    return WSYNC_OK;
}

/* Wait for the stream's work so far, polling (a peer that is gone leaves an NCCL kernel spinning
 * forever: coll->check and the deadline end the wait). */
static wsync_status_t wait_stream(wse_cuda_t *c, const wse_cuda_coll_t *coll, const char *what)
{
    long long deadline = now_ms() + (coll != NULL && coll->timeout_ms > 0 ? coll->timeout_ms
                                                                             : 120000);
    long long next_check = now_ms() + 10;
    cudaError_t err;

    CU(cudaEventRecord(c->done, c->stream), c->gpu);
    for (unsigned long spins = 0;; spins++) {
        err = cudaEventQuery(c->done);
        if (err == cudaSuccess)
            return WSYNC_OK;
        if (err != cudaErrorNotReady)
            return cu_fail(what, c->gpu, err);
        if (spins < 2000) {
            sched_yield();
            continue;
        }
        long long t = now_ms();
        if (coll != NULL && coll->check != NULL && t >= next_check) {
            wsync_status_t st = coll->check(coll->arg);
            if (st != WSYNC_OK)
                return st;
            next_check = t + 10;
        }
        if (t >= deadline)
            return wse_err(WSYNC_ERR_TIMEOUT, "TP rank %d: %s did not finish on GPU %d within %d "
                           "ms (a TP peer stopped?)", c->d.tp_rank, what, c->gpu,
                           coll != NULL && coll->timeout_ms > 0 ? coll->timeout_ms : 120000);
        struct timespec ts = {0, 50 * 1000};
        nanosleep(&ts, NULL);
    }
}

extern "C" {

wsync_status_t wse_cuda_device_count(int *count)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n < 1) {
        if (err != cudaSuccess)
            (void)cudaGetLastError();   /* not sticky; clear it */
        return wse_err(WSYNC_ERR_DEVICE, "no CUDA device (cudaGetDeviceCount: %s)",
                       err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    }
    *count = n;
    return WSYNC_OK;
}

int wse_cuda_gpu(const wse_cuda_t *c)
{
    return c->gpu;
}

const char *wse_cuda_gpu_name(const wse_cuda_t *c)
{
    return c->name;
}

void *wse_cuda_stream(const wse_cuda_t *c)
{
    return (void *)c->stream;
}

wsync_status_t wse_cuda_enter(const wse_cuda_t *c)
{
    CU(cudaSetDevice(c->gpu), c->gpu);
    return WSYNC_OK;
}

wsync_status_t wse_cuda_alloc(wse_cuda_t *c, size_t bytes, void **ptr)
{
    void *p = NULL;
    cudaError_t err;

    CU(cudaSetDevice(c->gpu), c->gpu);
    err = cudaMalloc(&p, bytes ? bytes : 1);
    if (err != cudaSuccess)
        return wse_err(WSYNC_ERR_DEVICE, "cudaMalloc(%zu bytes) on GPU %d: %s: %s", bytes, c->gpu,
                       cudaGetErrorName(err), cudaGetErrorString(err));
    *ptr = p;
    return WSYNC_OK;
}

void wse_cuda_release(wse_cuda_t *c, void *ptr)
{
    cudaError_t err;
    if (ptr == NULL)
        return;
    cudaSetDevice(c->gpu);
    err = cudaFree(ptr);
    if (err != cudaSuccess)
        fprintf(stderr, "wsync engine: cudaFree on GPU %d: %s\n", c->gpu, cudaGetErrorString(err));
}

wsync_status_t wse_cuda_upload(wse_cuda_t *c, void *dst, const void *src, size_t bytes)
{
    CU(cudaSetDevice(c->gpu), c->gpu);
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), c->gpu);
    return wait_stream(c, NULL, "a host-to-device copy");
}

wsync_status_t wse_cuda_zero(wse_cuda_t *c, void *dst, size_t bytes)
{
    CU(cudaSetDevice(c->gpu), c->gpu);
    CU(cudaMemsetAsync(dst, 0, bytes, c->stream), c->gpu);
    return wait_stream(c, NULL, "zeroing device memory");
}

wsync_status_t wse_cuda_download(wse_cuda_t *c, void *dst, const void *src, size_t bytes)
{
    wsync_status_t st;
    CU(cudaSetDevice(c->gpu), c->gpu);
    /* wait for the producers with a deadline first: a copy to pageable memory blocks */
    if ((st = wait_stream(c, NULL, "the work before a device-to-host copy")) != WSYNC_OK)
        return st;
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream), c->gpu);
    CU(cudaStreamSynchronize(c->stream), c->gpu);
    return WSYNC_OK;
}

wsync_status_t wse_cuda_kv_alloc(wse_cuda_t *c)
{
    wsync_status_t st;
    if (c->kcache != NULL)
        return WSYNC_OK;
    c->kv_bytes = (size_t)c->d.L * (size_t)c->d.max_seq * (size_t)(c->d.Kr * c->d.D) * sizeof(float);
    if ((st = wse_cuda_alloc(c, c->kv_bytes, (void **)&c->kcache)) != WSYNC_OK)
        return st;
    if ((st = wse_cuda_alloc(c, c->kv_bytes, (void **)&c->vcache)) != WSYNC_OK) {
        wse_cuda_release(c, c->kcache);
        c->kcache = NULL;
        return st;
    }
    return WSYNC_OK;
}

void wse_cuda_kv_free(wse_cuda_t *c)
{
    wse_cuda_release(c, c->kcache);
    wse_cuda_release(c, c->vcache);
    c->kcache = c->vcache = NULL;
}

void wse_cuda_free(wse_cuda_t *c)
{
    if (c == NULL)
        return;
    cudaSetDevice(c->gpu);
    if (c->stream != NULL)
        cudaStreamSynchronize(c->stream);
    float *bufs[] = {c->x, c->xb, c->xb2, c->qkv, c->att_out, c->att, c->hb, c->hb2,
                     c->logits_local, c->logits, c->rope_cos, c->rope_sin};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        wse_cuda_release(c, bufs[i]);
    wse_cuda_kv_free(c);
    if (c->done != NULL)
        cudaEventDestroy(c->done);
    if (c->stream != NULL)
        cudaStreamDestroy(c->stream);
    free(c);
}

wsync_status_t wse_cuda_create(int gpu, const wse_cuda_dims_t *d, const float *rope_cos,
                               const float *rope_sin, wse_cuda_t **out)
{
    wse_cuda_t *c;
    wsync_status_t st;
    cudaDeviceProp prop;
    int n = 0;

    if (d->D > MAX_HEAD_DIM)
        return wse_err(WSYNC_ERR_UNSUPPORTED, "head_dim %lld exceeds the CUDA engine's %d",
                       (long long)d->D, MAX_HEAD_DIM);
    if ((st = wse_cuda_device_count(&n)) != WSYNC_OK)
        return st;
    c = (wse_cuda_t *)calloc(1, sizeof(*c));
    if (c == NULL)
        return wse_err(WSYNC_ERR_NOMEM, "no memory for the CUDA state");
    c->d = *d;
    c->gpu = (gpu < 0 ? d->tp_rank : gpu) % n;
    if (cudaGetDeviceProperties(&prop, c->gpu) == cudaSuccess)
        snprintf(c->name, sizeof(c->name), "%s", prop.name);
    else
        snprintf(c->name, sizeof(c->name), "?");
#define FAIL_IF(call)                                                                         \
    do {                                                                                      \
        cudaError_t err_ = (call);                                                            \
        if (err_ != cudaSuccess) {                                                            \
            st = cu_fail(#call, c->gpu, err_);                                                \
            goto err;                                                                         \
        }                                                                                     \
    } while (0)
    FAIL_IF(cudaSetDevice(c->gpu));
    FAIL_IF(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    FAIL_IF(cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming));
#undef FAIL_IF
    {
        size_t half = (size_t)(d->D / 2), nq = (size_t)((d->Hr + 2 * d->Kr) * d->D);
        struct { float **p; size_t n; } bufs[] = {
            {&c->x, (size_t)d->Hd}, {&c->xb, (size_t)d->Hd}, {&c->xb2, (size_t)d->Hd},
            {&c->qkv, nq}, {&c->att_out, (size_t)(d->Hr * d->D)},
            {&c->att, (size_t)d->Hr * (size_t)d->max_seq}, {&c->hb, (size_t)(2 * d->Ir)},
            {&c->hb2, (size_t)d->Ir}, {&c->logits_local, (size_t)d->Vr},
            {&c->logits, (size_t)d->Vr * (size_t)d->tp_size},
            {&c->rope_cos, (size_t)d->max_seq * half}, {&c->rope_sin, (size_t)d->max_seq * half},
        };
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
            if ((st = wse_cuda_alloc(c, bufs[i].n * sizeof(float), (void **)bufs[i].p)) != WSYNC_OK)
                goto err;
            cudaError_t err = cudaMemsetAsync(*bufs[i].p, 0, bufs[i].n * sizeof(float), c->stream);
            if (err != cudaSuccess) {
                st = cu_fail("cudaMemsetAsync(run state)", c->gpu, err);
                goto err;
            }
        }
        if ((st = wse_cuda_upload(c, c->rope_cos, rope_cos,
                                  (size_t)d->max_seq * half * sizeof(float))) != WSYNC_OK ||
            (st = wse_cuda_upload(c, c->rope_sin, rope_sin,
                                  (size_t)d->max_seq * half * sizeof(float))) != WSYNC_OK)
            goto err;
    }
    if ((st = wse_cuda_kv_alloc(c)) != WSYNC_OK)
        goto err;
    *out = c;
    return WSYNC_OK;
err:
    wse_cuda_free(c);
    return st;
}

wsync_status_t wse_cuda_forward(wse_cuda_t *c, const wse_weights_t *w, int32_t token, int pos,
                                const wse_cuda_coll_t *coll, float *logits)
{
    const wse_cuda_dims_t *d = &c->d;
    const int64_t Hd = d->Hd, D = d->D, Hr = d->Hr, Kr = d->Kr, Ir = d->Ir, kvd = Kr * D;
    const int64_t half = D / 2, group = d->H / d->K;
    const float scale = 1.0f / sqrtf((float)D);
    const bool tp = d->tp_size > 1;
    wsync_status_t st;

    if (c->kcache == NULL)
        return wse_err(WSYNC_ERR_STATE, "TP rank %d: the KV cache is freed (asleep)", d->tp_rank);
    CU(cudaSetDevice(c->gpu), c->gpu);

    /* embedding: the rank holding the row contributes it, the others zeros */
    {
        int64_t lo = d->tp_rank * d->Vr;
        int have = token >= lo && token < lo + d->Vr;
        embed_kernel<<<ew_blocks(Hd), EW_THREADS, 0, c->stream>>>(
            c->x, w->embed.dtype, w->embed.w, Hd, have ? token - lo : 0, have);
        LAUNCHED("embed_kernel", c->gpu);
        if (tp && (st = coll->allreduce(coll->arg, c->x, (size_t)Hd)) != WSYNC_OK)
            return st;
    }

    for (int64_t l = 0; l < d->L; l++) {
        const wse_layer_t *ly = &w->layers[l];
        float *kc = c->kcache + (size_t)l * (size_t)d->max_seq * (size_t)kvd;
        float *vc = c->vcache + (size_t)l * (size_t)d->max_seq * (size_t)kvd;

        /* attention */
        if ((st = rmsnorm(c, c->xb, c->x, &ly->in_norm, Hd)) != WSYNC_OK ||
            (st = matvec(c, c->qkv, &ly->qkv, c->xb, ly->qkv_b.w != NULL ? &ly->qkv_b : NULL)) !=
                WSYNC_OK)
            return st;
        qk_norm_rope_kernel<<<(unsigned int)(Hr + 2 * Kr), HEAD_THREADS, 0, c->stream>>>(
            c->qkv, Hr, Kr, D, ly->q_norm.dtype, ly->q_norm.w, ly->k_norm.dtype, ly->k_norm.w,
            d->eps, c->rope_cos + (size_t)pos * (size_t)half,
            c->rope_sin + (size_t)pos * (size_t)half, kc + (size_t)pos * (size_t)kvd,
            vc + (size_t)pos * (size_t)kvd);
        LAUNCHED("qk_norm_rope_kernel", c->gpu);
        attention_kernel<<<(unsigned int)Hr, ATT_THREADS, 0, c->stream>>>(
            c->att_out, c->att, c->qkv, kc, vc, D, kvd, d->max_seq, pos, d->tp_rank * Hr, group,
            d->kr * Kr, scale);
        LAUNCHED("attention_kernel", c->gpu);
        /* a row-parallel bias is added once, before the all-reduce */
        if ((st = matvec(c, c->xb2, &ly->o, c->att_out,
                         d->tp_rank == 0 && ly->o_b.w != NULL ? &ly->o_b : NULL)) != WSYNC_OK)
            return st;
        if (tp && (st = coll->allreduce(coll->arg, c->xb2, (size_t)Hd)) != WSYNC_OK)
            return st;
        if ((st = add(c, c->x, c->xb2, Hd)) != WSYNC_OK)
            return st;

        /* SwiGLU MLP: gate_up = [gate; up] rows of this rank */
        if ((st = rmsnorm(c, c->xb, c->x, &ly->post_norm, Hd)) != WSYNC_OK ||
            (st = matvec(c, c->hb, &ly->gate_up, c->xb,
                         ly->gate_up_b.w != NULL ? &ly->gate_up_b : NULL)) != WSYNC_OK)
            return st;
        swiglu_kernel<<<ew_blocks(Ir), EW_THREADS, 0, c->stream>>>(c->hb2, c->hb, Ir);
        LAUNCHED("swiglu_kernel", c->gpu);
        if ((st = matvec(c, c->xb2, &ly->down, c->hb2,
                         d->tp_rank == 0 && ly->down_b.w != NULL ? &ly->down_b : NULL)) !=
            WSYNC_OK)
            return st;
        if (tp && (st = coll->allreduce(coll->arg, c->xb2, (size_t)Hd)) != WSYNC_OK)
            return st;
        if ((st = add(c, c->x, c->xb2, Hd)) != WSYNC_OK)
            return st;
    }

    if ((st = rmsnorm(c, c->xb, c->x, &w->norm, Hd)) != WSYNC_OK ||
        (st = matvec(c, c->logits_local, &w->lm_head, c->xb, NULL)) != WSYNC_OK)
        return st;
    if (tp && (st = coll->allgather(coll->arg, c->logits_local, (size_t)d->Vr, c->logits)) !=
                  WSYNC_OK)
        return st;
    /* a hung collective or a faulting kernel shows here, with a deadline */
    if ((st = wait_stream(c, coll, "a decoder step")) != WSYNC_OK)
        return st;
    CU(cudaMemcpyAsync(logits, tp ? c->logits : c->logits_local,
                       (size_t)d->Vr * (size_t)d->tp_size * sizeof(float), cudaMemcpyDeviceToHost,
                       c->stream), c->gpu);
    CU(cudaStreamSynchronize(c->stream), c->gpu);
    return WSYNC_OK;
}

}   /* extern "C" */
