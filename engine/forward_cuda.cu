/* The engine's decoder step on one GPU per TP rank: the same arithmetic as forward.c (weights
 * times f32 activations with f32 accumulation, FP8 blocks dequantized on the fly, each block's
 * partial dot product times its scale), written as small kernels on one stream, no cuBLAS.
 * Compiled with --fmad=false (CMakeLists.txt) so that element-wise expressions round as the
 * CPU's do; only the order of the long sums differs (warp-parallel here).
 *
 * Attention is GQA (fused qkv, optional q/k norms, rotate-half RoPE) or MLA (DeepSeek: latent
 * projections and norms, RoPE on the rope part of q and of the shared k, the KV cache expanded
 * per local head). The MLP is dense SwiGLU, or MoE: the router's top-k picked on the GPU (one
 * thread, serially, as the CPU does), the picked experts this rank holds computed from the ids
 * in device memory (no host round trip), their outputs weighted and summed in expert order,
 * plus the shared experts. Decode is batch 1: simple kernels over speed. */
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
#define MAX_EXPERTS 1024   /* router scores held in shared memory */
#define MAX_TOPK 32
#define MAX_GROUPS 64

struct wse_cuda {
    int gpu;
    char name[256];
    cudaStream_t stream;
    cudaEvent_t done;
    wse_cuda_dims_t d;
    int mla;                      /* kv_lora > 0 */
    int64_t kdim, vdim;           /* KV cache floats per position and layer */
    int64_t rope_half;            /* RoPE table width: D/2, or rope/2 with MLA */
    /* run state [shapes as in struct wsync_engine] */
    float *x, *xb, *xb2, *xb3, *qkv, *att_out, *att, *logits_local, *logits;
    float *hb, *hb2;              /* dense / shared-expert MLP: [2 * mlp_cap], [mlp_cap] */
    int64_t mlp_cap;              /* grown when a layer's gate_up is wider (see mlp_room) */
    /* MLA: qkv_a's output [q_lora + kv_lora + rope], the normed q and kv latents, q_b's output
     * [Hr * (nope + rope)], kv_b's output [Hr * (nope + vd)] */
    float *mla_a, *mla_qn, *mla_kvn, *mla_q, *mla_kv;
    /* MoE: router logits [E]; per top-k slot: expert id (ascending), weight, w13 output
     * [topk, 2 Ip], activation [topk, Ip], w2 output [topk, Hd] */
    float *router, *topk_w, *moe_h, *moe_a, *moe_y;
    int *topk_ids;
    float *rope_cos, *rope_sin;   /* [max_seq, rope_half] */
    float *kcache, *vcache;       /* [L, max_seq, kdim], [L, max_seq, vdim] */
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

/* out[rows] = m[rows, cols] . x[cols] (+ bias): one warp per row.
 * With ids (routed experts): blockIdx.y is a top-k slot k, m holds e_local experts of `rows`
 * rows each (flattened, the FP8 scales those of the flattened matrix), and slot k computes
 * out[k * rows + r] = expert (ids[k] - e_first)'s row r . x[k * x_stride ..]; a slot whose
 * expert this rank lacks is left alone (never read). */
template <int DT>
__global__ void matvec_kernel(float *out, const void *w, const float *s, int64_t rows,
                              int64_t cols, int blk, const float *x, bool vec,
                              wsync_dtype_t bias_dt, const void *bias, const int *ids,
                              int64_t e_first, int64_t e_local, int64_t x_stride)
{
    int lane = threadIdx.x & 31;
    int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), base = 0;
    if (row >= rows)
        return;
    if (ids != NULL) {   /* uniform over the block: whole warps return */
        int64_t j = (int64_t)ids[blockIdx.y] - e_first;
        if (j < 0 || j >= e_local)
            return;
        base = j * rows;
        x += (int64_t)blockIdx.y * x_stride;
        out += (int64_t)blockIdx.y * rows;
    }
    float acc = DT == WSYNC_DTYPE_F8E4M3FN
                    ? row_dot_fp8((const unsigned char *)w, s, base + row, cols, blk, x, lane, vec)
                    : row_dot<DT>(w, base + row, cols, x, lane, vec);
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
 * q heads are qd wide (q + h * qd), k heads too, v heads vd wide; a position's keys and values
 * are kstride and vstride floats apart in the cache. Local q head h reads local kv head
 * (first_q + h) / group - first_kv (MLA: group 1, head h). att: [Hr, max_seq] scratch;
 * att_out [Hr, vd]. */
__global__ void attention_kernel(float *att_out, float *att, const float *q, const float *kc,
                                 const float *vc, int64_t qd, int64_t vd, int64_t kstride,
                                 int64_t vstride, int max_seq, int pos, int64_t first_q,
                                 int64_t group, int64_t first_kv, float scale)
{
    __shared__ float qs[MAX_HEAD_DIM];
    int64_t h = blockIdx.x;
    int64_t kvh = (first_q + h) / group - first_kv;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float *a = att + h * (int64_t)max_seq;

    for (int64_t i = threadIdx.x; i < qd; i += blockDim.x)
        qs[i] = q[h * qd + i];
    __syncthreads();
    for (int t = warp; t <= pos; t += nw) {
        const float *kt = kc + (int64_t)t * kstride + kvh * qd;
        float s = 0.0f;
        for (int64_t i = lane; i < qd; i += 32)
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
    for (int64_t i = threadIdx.x; i < vd; i += blockDim.x) {
        float o = 0.0f;
        for (int t = 0; t <= pos; t++)
            o += a[t] / sum * vc[(int64_t)t * vstride + kvh * vd + i];
        att_out[h * vd + i] = o;
    }
}

/* Rotate pair (a, b) = (v[i0], v[i1]) by the angle of (c, s). */
__device__ __forceinline__ void rotate_pair(float *v, int64_t i0, int64_t i1, float c, float s)
{
    float a = v[i0], b = v[i1];
    v[i0] = a * c - b * s;
    v[i1] = b * c + a * s;
}

/* MLA after the projections, one block per local head h: RoPE on q's rope part (in place in
 * q [Hr, nope + rope]); the cache at pos gets k = [kv's nope part of head h; the shared k_rope
 * rotated] and v = kv's v part of head h (kv [Hr, nope + vd]). Pairs are (2i, 2i + 1) with
 * interleave, else (i, i + rope/2); frequency i either way. */
__global__ void mla_rope_cache_kernel(float *q, const float *kv, const float *k_rope,
                                      int64_t nope, int64_t rope, int64_t vd, int interleave,
                                      const float *cs, const float *sn, float *kc_pos,
                                      float *vc_pos)
{
    const int64_t h = blockIdx.x, qk = nope + rope, half = rope / 2;
    float *qr = q + h * qk + nope;
    float *kh = kc_pos + h * qk;
    const float *kvh = kv + h * (nope + vd);

    for (int64_t i = threadIdx.x; i < nope; i += blockDim.x)
        kh[i] = kvh[i];
    for (int64_t i = threadIdx.x; i < rope; i += blockDim.x)
        kh[nope + i] = k_rope[i];
    for (int64_t i = threadIdx.x; i < vd; i += blockDim.x)
        vc_pos[h * vd + i] = kvh[nope + i];
    __syncthreads();   /* kh's rope part is read back below, by other threads */
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
        int64_t i0 = interleave ? 2 * i : i, i1 = interleave ? 2 * i + 1 : i + half;
        rotate_pair(qr, i0, i1, cs[i], sn[i]);
        rotate_pair(kh + nope, i0, i1, cs[i], sn[i]);
    }
}

/* The router's pick, one thread (E <= MAX_EXPERTS, serial, in forward.c's route order):
 * scores (softmax or sigmoid of the logits), choice = score (+ bias with NOAUX_TC), with
 * grouped top-k only the topk_group best groups' experts kept (the others' choice 0, as HF's
 * masked_fill), the topk best choices (ties to the lower id), sorted by expert id (the order
 * HF adds the experts' outputs in); their weights the scores without the bias, optionally
 * divided by their sum (+ 1e-20 for sigmoid scores, as HF's DeepSeek-V3), times scale. Group
 * score: NOAUX_TC the sum of the group's two best choices, GROUP_LIMITED its best. */
__global__ void route_kernel(int *ids, float *wts, const float *logits, wsync_dtype_t bias_dt,
                             const void *bias, int E, int topk, int n_group, int topk_group,
                             int scoring, int method, int norm, float scale)
{
    __shared__ float sc[MAX_EXPERTS], ch[MAX_EXPERTS];
    __shared__ unsigned char taken[MAX_EXPERTS];
    int id[MAX_TOPK];
    float wt[MAX_TOPK];

    if (threadIdx.x != 0 || blockIdx.x != 0)
        return;
    if (scoring == WSYNC_ROUTER_SIGMOID) {
        for (int e = 0; e < E; e++)
            sc[e] = 1.0f / (1.0f + expf(-logits[e]));
    } else {
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < E; e++)
            mx = logits[e] > mx ? logits[e] : mx;
        for (int e = 0; e < E; e++) {
            sc[e] = expf(logits[e] - mx);
            sum += sc[e];
        }
        for (int e = 0; e < E; e++)
            sc[e] = sc[e] / sum;
    }
    for (int e = 0; e < E; e++) {
        ch[e] = method == WSYNC_TOPK_NOAUX_TC && bias != NULL
                    ? sc[e] + load_elem(bias_dt, bias, (size_t)e)
                    : sc[e];
        taken[e] = 0;
    }
    if (method != WSYNC_TOPK_GREEDY && n_group > 1 && topk_group < n_group) {
        const int gsz = E / n_group;
        float gs[MAX_GROUPS];
        unsigned char keep[MAX_GROUPS];
        for (int g = 0; g < n_group; g++) {
            float m1 = -INFINITY, m2 = -INFINITY;
            for (int e = g * gsz; e < (g + 1) * gsz; e++) {
                if (ch[e] > m1) {
                    m2 = m1;
                    m1 = ch[e];
                } else if (ch[e] > m2) {
                    m2 = ch[e];
                }
            }
            gs[g] = method == WSYNC_TOPK_NOAUX_TC && gsz > 1 ? m1 + m2 : m1;
            keep[g] = 0;
        }
        for (int r = 0; r < topk_group; r++) {
            int best = -1;
            for (int g = 0; g < n_group; g++)
                if (!keep[g] && (best < 0 || gs[g] > gs[best]))
                    best = g;
            keep[best] = 1;
        }
        for (int e = 0; e < E; e++)
            if (!keep[e / gsz])
                ch[e] = 0.0f;
    }
    for (int r = 0; r < topk; r++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || ch[e] > ch[best]))
                best = e;
        taken[best] = 1;
        id[r] = best;
    }
    for (int r = 1; r < topk; r++)   /* insertion sort by expert id */
        for (int k = r; k > 0 && id[k - 1] > id[k]; k--) {
            int t = id[k];
            id[k] = id[k - 1];
            id[k - 1] = t;
        }
    float sum = 0.0f;   /* in id order, as forward.c */
    for (int r = 0; r < topk; r++) {
        wt[r] = sc[id[r]];
        sum += wt[r];
    }
    if (norm) {
        if (scoring == WSYNC_ROUTER_SIGMOID)
            sum += 1e-20f;
        for (int r = 0; r < topk; r++)
            wt[r] = wt[r] / sum;
    }
    for (int r = 0; r < topk; r++)
        wt[r] = wt[r] * scale;
    for (int r = 0; r < topk; r++) {
        ids[r] = id[r];
        wts[r] = wt[r];
    }
}

/* a[k, i] = silu(h[k, i]) * h[k, Ip + i] for the slots whose expert this rank holds;
 * h [topk, 2 Ip] (gate rows, then up rows), a [topk, Ip] */
__global__ void moe_swiglu_kernel(float *a, const float *h, int64_t Ip, int topk, const int *ids,
                                  int64_t e_first, int64_t e_local)
{
    for (int64_t n = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; n < topk * Ip;
         n += (int64_t)gridDim.x * blockDim.x) {
        int64_t k = n / Ip, i = n % Ip, j = (int64_t)ids[k] - e_first;
        if (j < 0 || j >= e_local)
            continue;
        float g = h[k * 2 * Ip + i];
        a[n] = g / (1.0f + expf(-g)) * h[k * 2 * Ip + Ip + i];
    }
}

/* out[i] = the sum, in slot (= expert id) order, of wts[k] * y[k, i] over the slots whose
 * expert this rank holds; 0 when it holds none of them. y [topk, Hd] */
__global__ void moe_combine_kernel(float *out, const float *y, const int *ids, const float *wts,
                                   int topk, int64_t Hd, int64_t e_first, int64_t e_local)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < Hd;
         i += (int64_t)gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int k = 0; k < topk; k++) {
            int64_t j = (int64_t)ids[k] - e_first;
            if (j >= 0 && j < e_local)
                acc += y[k * Hd + i] * wts[k];
        }
        out[i] = acc;
    }
}

/* hb2[i] = silu(gate[i]) * up[i], gate_up = [gate; up] (hb [2 Ir]) */
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

/* The matvec kernel for m's dtype over `slots` top-k slots (grid.y), each `rows` rows; with
 * ids NULL one plain matrix (rows = m->rows). */
static wsync_status_t launch_matvec(wse_cuda_t *c, float *out, const wse_mat_t *m, int64_t rows,
                                    const float *x, int64_t x_stride, const wse_vec_t *bias,
                                    const int *ids, int slots)
{
    const int64_t cols = m->cols;
    const dim3 grid((unsigned int)((rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK),
                    (unsigned int)slots);
    const void *b = bias != NULL ? bias->w : NULL;
    wsync_dtype_t bdt = bias != NULL ? bias->dtype : WSYNC_DTYPE_F32;
    size_t esz = m->dtype == WSYNC_DTYPE_F32 ? 4 : m->dtype == WSYNC_DTYPE_F8E4M3FN ? 1 : 2;
    int64_t group = m->dtype == WSYNC_DTYPE_F32 ? 4 : m->dtype == WSYNC_DTYPE_F8E4M3FN ? 16 : 8;
    const int64_t e_first = c->d.e_first, e_local = c->d.E_local;
    /* whole 16-byte loads of every row, and (FP8) groups that never straddle a block; every
     * slot's x 16-byte aligned too */
    bool vec = cols % group == 0 && ((size_t)cols * esz) % 16 == 0 && aligned16(m->w) &&
               aligned16(x) && (x_stride * (int64_t)sizeof(float)) % 16 == 0 &&
               (m->dtype != WSYNC_DTYPE_F8E4M3FN || m->blk % 16 == 0);

    if (rows == 0 || slots == 0)
        return WSYNC_OK;
    if (m->w == NULL)
        return wse_err(WSYNC_ERR_INTERNAL, "TP rank %d: a [%lld, %lld] weight the CUDA forward "
                       "needs has no data", c->d.tp_rank, (long long)m->rows, (long long)cols);
    switch (m->dtype) {
    case WSYNC_DTYPE_BF16:
        matvec_kernel<WSYNC_DTYPE_BF16><<<grid, WARPS_PER_BLOCK * 32, 0, c->stream>>>(
            out, m->w, m->s, rows, cols, m->blk, x, vec, bdt, b, ids, e_first, e_local, x_stride);
        break;
    case WSYNC_DTYPE_F16:
        matvec_kernel<WSYNC_DTYPE_F16><<<grid, WARPS_PER_BLOCK * 32, 0, c->stream>>>(
            out, m->w, m->s, rows, cols, m->blk, x, vec, bdt, b, ids, e_first, e_local, x_stride);
        break;
    case WSYNC_DTYPE_F32:
        matvec_kernel<WSYNC_DTYPE_F32><<<grid, WARPS_PER_BLOCK * 32, 0, c->stream>>>(
            out, m->w, m->s, rows, cols, m->blk, x, vec, bdt, b, ids, e_first, e_local, x_stride);
        break;
    case WSYNC_DTYPE_F8E4M3FN:
        if (m->s == NULL || m->blk < 1)
            return wse_err(WSYNC_ERR_INTERNAL, "an FP8 weight without block scales");
        matvec_kernel<WSYNC_DTYPE_F8E4M3FN><<<grid, WARPS_PER_BLOCK * 32, 0, c->stream>>>(
            out, m->w, m->s, rows, cols, m->blk, x, vec, bdt, b, ids, e_first, e_local, x_stride);
        break;
    default:
        return wse_err(WSYNC_ERR_UNSUPPORTED, "no CUDA matvec for %s weights",
                       wsync_dtype_name(m->dtype));
    }
    LAUNCHED("matvec_kernel", c->gpu);
    return WSYNC_OK;
}

static wsync_status_t matvec(wse_cuda_t *c, float *out, const wse_mat_t *m, const float *x,
                             const wse_vec_t *bias)
{
    return launch_matvec(c, out, m, m->rows, x, 0, bias, NULL, 1);
}

/* The routed experts' rows of one top-k slot: m is [E_local * rows, cols]. */
static wsync_status_t expert_matvec(wse_cuda_t *c, float *out, const wse_mat_t *m, int64_t rows,
                                    int64_t cols, const float *x, int64_t x_stride,
                                    const char *what)
{
    if (m->rows != c->d.E_local * rows || m->cols != cols)
        return wse_err(WSYNC_ERR_INTERNAL, "TP rank %d: the routed experts' %s is [%lld, %lld], "
                       "not [%lld * %lld, %lld] (E_local experts of Ip = %lld)", c->d.tp_rank,
                       what, (long long)m->rows, (long long)m->cols, (long long)c->d.E_local,
                       (long long)rows, (long long)cols, (long long)c->d.Ip);
    return launch_matvec(c, out, m, rows, x, x_stride, NULL, c->topk_ids, (int)c->d.topk);
}

static wsync_status_t rmsnorm_eps(wse_cuda_t *c, float *out, const float *x, const wse_vec_t *w,
                                  int64_t n, float eps)
{
    rmsnorm_kernel<<<1, NORM_THREADS, 0, c->stream>>>(out, x, w->dtype, w->w, n, eps);
    LAUNCHED("rmsnorm_kernel", c->gpu);
    return WSYNC_OK;
}

static wsync_status_t rmsnorm(wse_cuda_t *c, float *out, const float *x, const wse_vec_t *w,
                              int64_t n)
{
    return rmsnorm_eps(c, out, x, w, n, c->d.eps);
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
    const size_t per = (size_t)c->d.L * (size_t)c->d.max_seq * sizeof(float);
    wsync_status_t st;

    if (c->kcache != NULL)
        return WSYNC_OK;
    if ((st = wse_cuda_alloc(c, per * (size_t)c->kdim, (void **)&c->kcache)) != WSYNC_OK)
        return st;
    if ((st = wse_cuda_alloc(c, per * (size_t)c->vdim, (void **)&c->vcache)) != WSYNC_OK) {
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
    void *bufs[] = {c->x, c->xb, c->xb2, c->xb3, c->qkv, c->att_out, c->att, c->hb, c->hb2,
                    c->logits_local, c->logits, c->mla_a, c->mla_qn, c->mla_kvn, c->mla_q,
                    c->mla_kv, c->router, c->topk_w, c->moe_h, c->moe_a, c->moe_y, c->topk_ids,
                    c->rope_cos, c->rope_sin};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        wse_cuda_release(c, bufs[i]);
    wse_cuda_kv_free(c);
    if (c->done != NULL)
        cudaEventDestroy(c->done);
    if (c->stream != NULL)
        cudaStreamDestroy(c->stream);
    free(c);
}

/* The shapes the kernels can take, before anything is allocated. */
static wsync_status_t check_dims(const wse_cuda_dims_t *d)
{
    if (d->kv_lora > 0) {
        if (d->nope < 0 || d->rope < 2 || d->rope % 2 != 0 || d->vd < 1 || d->q_lora < 0)
            return wse_err(WSYNC_ERR_UNSUPPORTED, "MLA with qk_nope_head_dim %lld, "
                           "qk_rope_head_dim %lld (even, >= 2), v_head_dim %lld, q_lora_rank %lld",
                           (long long)d->nope, (long long)d->rope, (long long)d->vd,
                           (long long)d->q_lora);
        if (d->nope + d->rope > MAX_HEAD_DIM || d->vd > MAX_HEAD_DIM)
            return wse_err(WSYNC_ERR_UNSUPPORTED, "MLA heads of %lld (q, k) and %lld (v) dims "
                           "exceed the CUDA engine's %d", (long long)(d->nope + d->rope),
                           (long long)d->vd, MAX_HEAD_DIM);
    } else if (d->D > MAX_HEAD_DIM) {
        return wse_err(WSYNC_ERR_UNSUPPORTED, "head_dim %lld exceeds the CUDA engine's %d",
                       (long long)d->D, MAX_HEAD_DIM);
    }
    if (d->E > 0) {
        if (d->E > MAX_EXPERTS || d->topk < 1 || d->topk > MAX_TOPK || d->topk > d->E)
            return wse_err(WSYNC_ERR_UNSUPPORTED, "%lld experts, top %lld: the CUDA engine routes "
                           "up to %d experts, top 1 to %d", (long long)d->E, (long long)d->topk,
                           MAX_EXPERTS, MAX_TOPK);
        if (d->E_local < 0 || d->e_first < 0 || d->e_first + d->E_local > d->E || d->Ip < 1)
            return wse_err(WSYNC_ERR_INTERNAL, "experts %lld .. %lld of %lld, %lld wide, on TP "
                           "rank %d", (long long)d->e_first,
                           (long long)(d->e_first + d->E_local - 1), (long long)d->E,
                           (long long)d->Ip, d->tp_rank);
        if (d->topk_method != WSYNC_TOPK_GREEDY && d->n_group > 1 &&
            (d->n_group > MAX_GROUPS || d->E % d->n_group != 0 || d->topk_group < 1 ||
             d->topk_group > d->n_group))
            return wse_err(WSYNC_ERR_UNSUPPORTED, "grouped top-k with %lld experts in %lld groups "
                           "(%lld kept): the CUDA engine takes up to %d groups dividing the "
                           "experts", (long long)d->E, (long long)d->n_group,
                           (long long)d->topk_group, MAX_GROUPS);
    }
    return WSYNC_OK;
}

wsync_status_t wse_cuda_create(int gpu, const wse_cuda_dims_t *d, const float *rope_cos,
                               const float *rope_sin, wse_cuda_t **out)
{
    wse_cuda_t *c;
    wsync_status_t st;
    cudaDeviceProp prop;
    int n = 0;

    if ((st = check_dims(d)) != WSYNC_OK)
        return st;
    if ((st = wse_cuda_device_count(&n)) != WSYNC_OK)
        return st;
    c = (wse_cuda_t *)calloc(1, sizeof(*c));
    if (c == NULL)
        return wse_err(WSYNC_ERR_NOMEM, "no memory for the CUDA state");
    c->d = *d;
    c->gpu = (gpu < 0 ? d->tp_rank : gpu) % n;
    c->mla = d->kv_lora > 0;
    c->kdim = c->mla ? d->Hr * (d->nope + d->rope) : d->Kr * d->D;
    c->vdim = c->mla ? d->Hr * d->vd : d->Kr * d->D;
    c->rope_half = c->mla ? d->rope / 2 : d->D / 2;
    c->mlp_cap = d->Ir > d->Ip ? d->Ir : d->Ip;
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
        const size_t half = (size_t)c->rope_half, nq = (size_t)((d->Hr + 2 * d->Kr) * d->D);
        const int64_t vhd = c->mla ? d->vd : d->D, qk = d->nope + d->rope;
        const int mla = c->mla, moe = d->E > 0;
        /* every buffer float-sized (topk_ids are int); the MLA and MoE ones only where used */
        struct { void **p; size_t n; } bufs[] = {
            {(void **)&c->x, (size_t)d->Hd}, {(void **)&c->xb, (size_t)d->Hd},
            {(void **)&c->xb2, (size_t)d->Hd}, {(void **)&c->xb3, (size_t)d->Hd},
            {(void **)&c->qkv, mla ? 0 : nq}, {(void **)&c->att_out, (size_t)(d->Hr * vhd)},
            {(void **)&c->att, (size_t)d->Hr * (size_t)d->max_seq},
            {(void **)&c->hb, (size_t)(2 * c->mlp_cap)}, {(void **)&c->hb2, (size_t)c->mlp_cap},
            {(void **)&c->logits_local, (size_t)d->Vr},
            {(void **)&c->logits, (size_t)d->Vr * (size_t)d->tp_size},
            {(void **)&c->mla_a, mla ? (size_t)(d->q_lora + d->kv_lora + d->rope) : 0},
            {(void **)&c->mla_qn, mla ? (size_t)d->q_lora : 0},
            {(void **)&c->mla_kvn, mla ? (size_t)d->kv_lora : 0},
            {(void **)&c->mla_q, mla ? (size_t)(d->Hr * qk) : 0},
            {(void **)&c->mla_kv, mla ? (size_t)(d->Hr * (d->nope + d->vd)) : 0},
            {(void **)&c->router, moe ? (size_t)d->E : 0},
            {(void **)&c->topk_w, moe ? (size_t)d->topk : 0},
            {(void **)&c->topk_ids, moe ? (size_t)d->topk : 0},
            {(void **)&c->moe_h, moe ? (size_t)(d->topk * 2 * d->Ip) : 0},
            {(void **)&c->moe_a, moe ? (size_t)(d->topk * d->Ip) : 0},
            {(void **)&c->moe_y, moe ? (size_t)(d->topk * d->Hd) : 0},
            {(void **)&c->rope_cos, (size_t)d->max_seq * half},
            {(void **)&c->rope_sin, (size_t)d->max_seq * half},
        };
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
            if (bufs[i].n == 0)
                continue;
            if ((st = wse_cuda_alloc(c, bufs[i].n * sizeof(float), bufs[i].p)) != WSYNC_OK)
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

/* Room in hb/hb2 for a SwiGLU `width` wide (a dense layer's or the shared experts' gate_up
 * rows / 2, which the dims do not give): grown once, after the stream's work so far. */
static wsync_status_t mlp_room(wse_cuda_t *c, const wse_cuda_coll_t *coll, int64_t width)
{
    wsync_status_t st;
    if (width <= c->mlp_cap)
        return WSYNC_OK;
    if ((st = wait_stream(c, coll, "the work before growing the MLP buffers")) != WSYNC_OK)
        return st;
    wse_cuda_release(c, c->hb);
    wse_cuda_release(c, c->hb2);
    c->hb = c->hb2 = NULL;
    c->mlp_cap = 0;
    st = wse_cuda_alloc(c, (size_t)(2 * width) * sizeof(float), (void **)&c->hb);
    if (st != WSYNC_OK ||
        (st = wse_cuda_alloc(c, (size_t)width * sizeof(float), (void **)&c->hb2)) != WSYNC_OK)
        return st;
    c->mlp_cap = width;
    return WSYNC_OK;
}

/* GQA attention of layer l: x -> xb2 (this rank's part of o_proj's output). */
static wsync_status_t attention_gqa(wse_cuda_t *c, const wse_layer_t *ly, int64_t l, int pos)
{
    const wse_cuda_dims_t *d = &c->d;
    const int64_t D = d->D, Hr = d->Hr, Kr = d->Kr, half = c->rope_half;
    float *kc = c->kcache + (size_t)l * (size_t)d->max_seq * (size_t)c->kdim;
    float *vc = c->vcache + (size_t)l * (size_t)d->max_seq * (size_t)c->vdim;
    wsync_status_t st;

    if ((st = matvec(c, c->qkv, &ly->qkv, c->xb, ly->qkv_b.w != NULL ? &ly->qkv_b : NULL)) !=
        WSYNC_OK)
        return st;
    qk_norm_rope_kernel<<<(unsigned int)(Hr + 2 * Kr), HEAD_THREADS, 0, c->stream>>>(
        c->qkv, Hr, Kr, D, ly->q_norm.dtype, ly->q_norm.w, ly->k_norm.dtype, ly->k_norm.w,
        d->eps, c->rope_cos + (size_t)pos * (size_t)half,
        c->rope_sin + (size_t)pos * (size_t)half, kc + (size_t)pos * (size_t)c->kdim,
        vc + (size_t)pos * (size_t)c->vdim);
    LAUNCHED("qk_norm_rope_kernel", c->gpu);
    attention_kernel<<<(unsigned int)Hr, ATT_THREADS, 0, c->stream>>>(
        c->att_out, c->att, c->qkv, kc, vc, D, D, c->kdim, c->vdim, d->max_seq, pos,
        d->tp_rank * Hr, d->H / d->K, d->kr * Kr,
        d->attn_scale > 0.0f ? d->attn_scale : 1.0f / sqrtf((float)D));
    LAUNCHED("attention_kernel", c->gpu);
    return WSYNC_OK;
}

/* The latent norms of HF's DeepseekV2/V3 attention keep RMSNorm's default eps, not the config's
 * (as forward.c's MLA_NORM_EPS). */
#define MLA_NORM_EPS 1e-6f

/* MLA attention of layer l (HF DeepseekV3Attention): qkv_a . xb = [q latent (q_lora); kv latent
 * (kv_lora); k_rope (rope)] (no q latent without q_lora: q_b is then q_proj, on xb); q = q_b .
 * norm(q latent), kv = kv_b . norm(kv latent); RoPE, the cache, attention. */
static wsync_status_t attention_mla(wse_cuda_t *c, const wse_layer_t *ly, int64_t l, int pos)
{
    const wse_cuda_dims_t *d = &c->d;
    const int64_t Hr = d->Hr, ql = d->q_lora, kvl = d->kv_lora, qk = d->nope + d->rope;
    const int64_t half = c->rope_half, kv_at = ql > 0 ? ql : 0;
    const int64_t na = kv_at + kvl + d->rope;
    float *kc = c->kcache + (size_t)l * (size_t)d->max_seq * (size_t)c->kdim;
    float *vc = c->vcache + (size_t)l * (size_t)d->max_seq * (size_t)c->vdim;
    float scale = d->attn_scale > 0.0f ? d->attn_scale : 1.0f / sqrtf((float)qk);
    wsync_status_t st;

    if (ly->qkv_a.rows != na || ly->q_b.rows != Hr * qk || ly->kv_b.rows != Hr * (d->nope + d->vd))
        return wse_err(WSYNC_ERR_INTERNAL, "TP rank %d, layer %lld: MLA views of %lld, %lld and "
                       "%lld rows (qkv_a, q_b, kv_b), expected %lld, %lld and %lld", d->tp_rank,
                       (long long)l, (long long)ly->qkv_a.rows, (long long)ly->q_b.rows,
                       (long long)ly->kv_b.rows, (long long)na, (long long)(Hr * qk),
                       (long long)(Hr * (d->nope + d->vd)));
    if ((st = matvec(c, c->mla_a, &ly->qkv_a, c->xb, NULL)) != WSYNC_OK)
        return st;
    if (ql > 0) {
        if ((st = rmsnorm_eps(c, c->mla_qn, c->mla_a, &ly->q_a_norm, ql, MLA_NORM_EPS)) !=
                WSYNC_OK ||
            (st = matvec(c, c->mla_q, &ly->q_b, c->mla_qn, NULL)) != WSYNC_OK)
            return st;
    } else if ((st = matvec(c, c->mla_q, &ly->q_b, c->xb, NULL)) != WSYNC_OK) {
        return st;
    }
    if ((st = rmsnorm_eps(c, c->mla_kvn, c->mla_a + kv_at, &ly->kv_a_norm, kvl, MLA_NORM_EPS)) !=
            WSYNC_OK ||
        (st = matvec(c, c->mla_kv, &ly->kv_b, c->mla_kvn, NULL)) != WSYNC_OK)
        return st;
    mla_rope_cache_kernel<<<(unsigned int)Hr, HEAD_THREADS, 0, c->stream>>>(
        c->mla_q, c->mla_kv, c->mla_a + kv_at + kvl, d->nope, d->rope, d->vd, d->rope_interleave,
        c->rope_cos + (size_t)pos * (size_t)half, c->rope_sin + (size_t)pos * (size_t)half,
        kc + (size_t)pos * (size_t)c->kdim, vc + (size_t)pos * (size_t)c->vdim);
    LAUNCHED("mla_rope_cache_kernel", c->gpu);
    attention_kernel<<<(unsigned int)Hr, ATT_THREADS, 0, c->stream>>>(
        c->att_out, c->att, c->mla_q, kc, vc, qk, d->vd, c->kdim, c->vdim, d->max_seq, pos, 0, 1,
        0, scale);
    LAUNCHED("attention_kernel", c->gpu);
    return WSYNC_OK;
}

/* SwiGLU MLP over xb with gate_up = [gate; up] rows of this rank (a dense layer, or a MoE
 * layer's shared experts) into out; its width is gate_up's rows / 2. */
static wsync_status_t mlp_dense(wse_cuda_t *c, const wse_cuda_coll_t *coll, const wse_layer_t *ly,
                                float *out)
{
    const int64_t Iw = ly->gate_up.rows / 2;
    wsync_status_t st;

    if (ly->down.cols != Iw)
        return wse_err(WSYNC_ERR_INTERNAL, "TP rank %d: an MLP's gate_up has %lld rows, its down "
                       "%lld columns", c->d.tp_rank, (long long)ly->gate_up.rows,
                       (long long)ly->down.cols);
    if ((st = mlp_room(c, coll, Iw)) != WSYNC_OK ||
        (st = matvec(c, c->hb, &ly->gate_up, c->xb,
                     ly->gate_up_b.w != NULL ? &ly->gate_up_b : NULL)) != WSYNC_OK)
        return st;
    swiglu_kernel<<<ew_blocks(Iw), EW_THREADS, 0, c->stream>>>(c->hb2, c->hb, Iw);
    LAUNCHED("swiglu_kernel", c->gpu);
    /* a row-parallel bias is added once, before the all-reduce */
    return matvec(c, out, &ly->down, c->hb2,
                  c->d.tp_rank == 0 && ly->down_b.w != NULL ? &ly->down_b : NULL);
}

/* MoE MLP over xb into xb2: the routed experts this rank holds, weighted (zero when it holds
 * none of the picked ones), plus the shared experts' part (HF: routed + shared). */
static wsync_status_t mlp_moe(wse_cuda_t *c, const wse_cuda_coll_t *coll, const wse_layer_t *ly)
{
    const wse_cuda_dims_t *d = &c->d;
    const int64_t Hd = d->Hd, Ip = d->Ip, topk = d->topk;
    wsync_status_t st;

    if (ly->router.rows != d->E)
        return wse_err(WSYNC_ERR_INTERNAL, "TP rank %d: a router of %lld rows for %lld experts",
                       d->tp_rank, (long long)ly->router.rows, (long long)d->E);
    if ((st = matvec(c, c->router, &ly->router, c->xb, NULL)) != WSYNC_OK)
        return st;
    route_kernel<<<1, 1, 0, c->stream>>>(c->topk_ids, c->topk_w, c->router, ly->router_bias.dtype,
                                         ly->router_bias.w, (int)d->E, (int)topk, (int)d->n_group,
                                         (int)d->topk_group, d->scoring, d->topk_method,
                                         d->norm_topk, d->routed_scale);
    LAUNCHED("route_kernel", c->gpu);
    if (d->E_local > 0) {
        if ((st = expert_matvec(c, c->moe_h, &ly->w13, 2 * Ip, Hd, c->xb, 0, "w13")) != WSYNC_OK)
            return st;
        moe_swiglu_kernel<<<ew_blocks(topk * Ip), EW_THREADS, 0, c->stream>>>(
            c->moe_a, c->moe_h, Ip, (int)topk, c->topk_ids, d->e_first, d->E_local);
        LAUNCHED("moe_swiglu_kernel", c->gpu);
        if ((st = expert_matvec(c, c->moe_y, &ly->w2, Hd, Ip, c->moe_a, Ip, "w2")) != WSYNC_OK)
            return st;
    }
    moe_combine_kernel<<<ew_blocks(Hd), EW_THREADS, 0, c->stream>>>(
        c->xb2, c->moe_y, c->topk_ids, c->topk_w, (int)topk, Hd, d->e_first, d->E_local);
    LAUNCHED("moe_combine_kernel", c->gpu);
    if (ly->gate_up.w != NULL) {
        if ((st = mlp_dense(c, coll, ly, c->xb3)) != WSYNC_OK ||
            (st = add(c, c->xb2, c->xb3, Hd)) != WSYNC_OK)
            return st;
    }
    return WSYNC_OK;
}

wsync_status_t wse_cuda_forward(wse_cuda_t *c, const wse_weights_t *w, int32_t token, int pos,
                                const wse_cuda_coll_t *coll, float *logits)
{
    const wse_cuda_dims_t *d = &c->d;
    const int64_t Hd = d->Hd;
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

        /* attention */
        if ((st = rmsnorm(c, c->xb, c->x, &ly->in_norm, Hd)) != WSYNC_OK)
            return st;
        st = c->mla ? attention_mla(c, ly, l, pos) : attention_gqa(c, ly, l, pos);
        if (st != WSYNC_OK)
            return st;
        /* a row-parallel bias is added once, before the all-reduce */
        if ((st = matvec(c, c->xb2, &ly->o, c->att_out,
                         d->tp_rank == 0 && ly->o_b.w != NULL ? &ly->o_b : NULL)) != WSYNC_OK)
            return st;
        if (tp && (st = coll->allreduce(coll->arg, c->xb2, (size_t)Hd)) != WSYNC_OK)
            return st;
        if ((st = add(c, c->x, c->xb2, Hd)) != WSYNC_OK)
            return st;

        /* MLP: dense SwiGLU, or MoE on layers with a router */
        if ((st = rmsnorm(c, c->xb, c->x, &ly->post_norm, Hd)) != WSYNC_OK)
            return st;
        if (ly->router.w != NULL) {
            if (d->E < 1)
                return wse_err(WSYNC_ERR_INTERNAL, "TP rank %d, layer %lld: a router, but no "
                               "experts in the CUDA engine's dims", d->tp_rank, (long long)l);
            st = mlp_moe(c, coll, ly);
        } else {
            st = mlp_dense(c, coll, ly, c->xb2);
        }
        if (st != WSYNC_OK)
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
