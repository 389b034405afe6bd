/* The engine's CUDA side (engine/forward_cuda.cu), behind plain C so that the engine's C files
 * never include a CUDA header. Built without CUDA (engine/cuda_stub.c), every function that
 * could do something returns WSYNC_ERR_UNSUPPORTED ("built without CUDA").
 *
 * One wse_cuda_t per engine: its GPU, one non-blocking stream on which every kernel, copy and
 * NCCL collective of the engine runs in order, the run state and the KV cache in device memory.
 * Errors: WSYNC_ERR_DEVICE naming the CUDA call, the GPU and the CUDA error (set with wse_err).
 * Functions act on the engine's GPU whatever the calling thread's current device was (they make
 * it current). */
#ifndef WSYNC_ENGINE_CUDA_H
#define WSYNC_ENGINE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/views.h"

#ifdef __cplusplus
extern "C" {
#endif

/* engine/util.c */
wsync_status_t wse_err(wsync_status_t st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

typedef struct wse_cuda wse_cuda_t;

/* The shapes forward needs (as in struct wsync_engine). */
typedef struct {
    int64_t Hd, H, K, D, Hr, Kr, kr, Ir, Vr, L;
    int tp_rank, tp_size, max_seq;
    float eps;

    /* MLA (kv_lora > 0; qkv views NULL, qkv_a/q_b/kv_b set). Each local head's q and k have
     * nope + rope dims (rope last), v has vd. The KV cache holds them expanded per local head:
     * k [L, max_seq, Hr * (nope + rope)], v [L, max_seq, Hr * vd]. RoPE tables are
     * [max_seq, rope / 2]; rope_interleave rotates pairs (2i, 2i + 1) with frequency i (HF's
     * de-interleave then rotate_half gives the same dot products), else pairs (i, i + rope/2).
     * attn_scale multiplies q.k (1/sqrt(nope + rope)). */
    int64_t q_lora, kv_lora, nope, rope, vd;
    int rope_interleave;
    float attn_scale;

    /* MoE (E > 0 on layers whose views have router.w): E experts routed, top `topk`; this rank
     * holds E_local experts, global e_first .. e_first + E_local - 1 (linear placement), each of
     * width Ip (I / T, or I under expert parallelism). Routed outputs of experts this rank lacks
     * are zero here: the TP all-reduce after the MLP sums the ranks' parts. Shared experts (the
     * layer's gate_up/down views) and dense layers take their width from the view's rows. */
    int64_t E, E_local, e_first, Ip, topk, n_group, topk_group;
    int scoring;          /* wsync_router_score_t */
    int topk_method;      /* wsync_topk_method_t */
    int norm_topk;        /* renormalise the top-k weights (divided by their sum + 1e-20) */
    float routed_scale;   /* routed_scaling_factor (1 for qwen3_moe): multiplies every top-k
                             weight, after the renormalisation if any */
    /* The CUDA routing (forward_cuda.cu route_kernel) as HF: scores = softmax or sigmoid of the
     * router's logits; choice = scores + router_bias; grouped top-k (topk_method not GREEDY,
     * n_group > 1): the topk_group best groups (NOAUX_TC: sum of a group's top-2 choices,
     * GROUP_LIMITED: its best) kept, the other experts' choice set to 0 (HF's masked_fill);
     * the topk best choices, ties to the lower expert id; weights from the scores. The routed
     * outputs are summed in expert-id order, then the shared experts' output added. Dense
     * layers and shared experts take their width from gate_up's rows / 2. */
} wse_cuda_dims_t;

/* The TP collectives forward calls between its kernels; they enqueue on (or wait for) the
 * engine's stream. x, in and out are device memory. */
typedef struct {
    /* x[n] := the sum over ranks of x[n] */
    wsync_status_t (*allreduce)(void *arg, float *x, size_t n);
    /* out[r * n + i] := rank r's in[i] */
    wsync_status_t (*allgather)(void *arg, const float *in, size_t n, float *out);
    /* called while waiting for the GPU: non-OK stops the wait (a failed NCCL communicator) */
    wsync_status_t (*check)(void *arg);
    void *arg;
    int timeout_ms;   /* longest wait for the GPU (a peer that stopped shows up as a hung kernel) */
} wse_cuda_coll_t;

/* cudaGetDeviceCount; 0 devices is WSYNC_ERR_DEVICE "no CUDA device (...)". */
wsync_status_t wse_cuda_device_count(int *count);

/* Pick GPU (gpu mod count; gpu < 0: tp_rank mod count), create the stream, the run state (the
 * RoPE tables copied from rope_cos/sin [max_seq, D/2], or [max_seq, rope/2] with MLA) and the
 * KV cache. WSYNC_ERR_UNSUPPORTED for shapes the kernels cannot take (heads over 1024 dims,
 * over 1024 experts, top-k over 32, over 64 groups or groups that do not divide E). */
wsync_status_t wse_cuda_create(int gpu, const wse_cuda_dims_t *dims, const float *rope_cos,
                               const float *rope_sin, wse_cuda_t **out);
void wse_cuda_free(wse_cuda_t *c);
/* The ordinal of the engine's GPU, its name ("NVIDIA H100 80GB HBM3"), its stream (cudaStream_t). */
int wse_cuda_gpu(const wse_cuda_t *c);
const char *wse_cuda_gpu_name(const wse_cuda_t *c);
void *wse_cuda_stream(const wse_cuda_t *c);
/* cudaSetDevice(the engine's GPU) on the calling thread. */
wsync_status_t wse_cuda_enter(const wse_cuda_t *c);

/* Device memory of the engine's GPU (cudaMalloc; freed with wse_cuda_release, NULL a no-op). */
wsync_status_t wse_cuda_alloc(wse_cuda_t *c, size_t bytes, void **ptr);
void wse_cuda_release(wse_cuda_t *c, void *ptr);
/* Copy host -> device / device -> host on the engine's stream and wait for it. */
wsync_status_t wse_cuda_upload(wse_cuda_t *c, void *dst, const void *src, size_t bytes);
wsync_status_t wse_cuda_download(wse_cuda_t *c, void *dst, const void *src, size_t bytes);
/* cudaMemset(dst, 0, bytes) on the engine's stream, and wait. */
wsync_status_t wse_cuda_zero(wse_cuda_t *c, void *dst, size_t bytes);

/* KV cache: freed by a sleep, allocated again by wake. */
wsync_status_t wse_cuda_kv_alloc(wse_cuda_t *c);
void wse_cuda_kv_free(wse_cuda_t *c);

/* One decoder step, as forward.c's forward_step, with the weights' views w pointing into device
 * memory; the gathered logits (tp_size * Vr floats) are copied to host `logits`. */
wsync_status_t wse_cuda_forward(wse_cuda_t *c, const wse_weights_t *w, int32_t token, int pos,
                                const wse_cuda_coll_t *coll, float *logits);

#ifdef __cplusplus
}
#endif

#endif
