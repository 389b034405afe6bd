/* Engine internals shared by the files of engine/ (never by tools or tests). */
#ifndef WSYNC_ENGINE_INTERNAL_H
#define WSYNC_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine/engine.h"

/* Set the thread's engine error ("<status text>: <detail>") and return st. */
wsync_status_t wse_err(wsync_status_t st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A wsync call failed with st: keep the library's detail, prefixed with what we were doing. */
wsync_status_t wse_err_wsync(wsync_status_t st, const char *what);

/* ---- element conversions ------------------------------------------------------------------ */

static inline float wse_bf16_to_f32(uint16_t b)
{
    union { uint32_t u; float f; } v = {(uint32_t)b << 16};
    return v.f;
}

/* round to nearest even; NaN stays NaN */
static inline uint16_t wse_f32_to_bf16(float f)
{
    union { float f; uint32_t u; } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((v.u >> 16) | 0x40);
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}

float wse_f16_to_f32(uint16_t h);
uint16_t wse_f32_to_f16(float f);

/* Element i of a bf16/f16/f32 array (possibly unaligned) as float. */
float wse_load(wsync_dtype_t dtype, const void *p, size_t i);
/* Store x as element i of a bf16/f16/f32 array. */
void wse_store(wsync_dtype_t dtype, void *p, size_t i, float x);

#include "engine/cuda.h"
#include "engine/views.h"

/* Where target i goes in wse_weights_t. */
typedef enum {
    WSE_EMBED, WSE_LM_HEAD, WSE_NORM, WSE_IN_NORM, WSE_POST_NORM, WSE_Q_NORM, WSE_K_NORM,
    WSE_QKV, WSE_QKV_B, WSE_O, WSE_O_B, WSE_GATE_UP, WSE_GATE_UP_B, WSE_DOWN, WSE_DOWN_B,
    /* MLA: fused [q_a; kv_a] (or kv_a alone), q_b (or q_proj), kv_b, the two latent norms */
    WSE_QKV_A, WSE_Q_B, WSE_KV_B, WSE_Q_A_NORM, WSE_KV_A_NORM,
    /* MoE: router, its correction bias, the routed experts, the shared experts */
    WSE_ROUTER, WSE_ROUTER_BIAS, WSE_W13, WSE_W2, WSE_SH_GATE_UP, WSE_SH_DOWN,
    WSE_NROLES
} wse_role_t;

typedef struct {
    wse_role_t role;
    int layer;            /* -1 for model-level targets */
    size_t offset;        /* of the data in a weight set */
    size_t bytes;
    size_t scales_offset; /* of the scales, when nscales > 0 */
    size_t nscales;
} wse_slot_t;

/* A block of target buffers: one allocation (anonymous mapping). */
typedef struct {
    uint8_t *base;        /* NULL while freed */
    uint64_t version;     /* what it holds */
    int valid;            /* holds a complete version */
} wse_set_t;

/* ---- the communicator ---------------------------------------------------------------------- */

wsync_status_t wse_comm_join(wsync_engine_comm_t *c, int rank);
wsync_status_t wse_comm_barrier(wsync_engine_comm_t *c, int rank);
/* x[n] := sum over ranks of every rank's x[n], in rank order (the same bits on every rank). */
wsync_status_t wse_comm_allreduce(wsync_engine_comm_t *c, int rank, float *x, size_t n);
/* out[r * n + i] := rank r's in[i]. */
wsync_status_t wse_comm_allgather(wsync_engine_comm_t *c, int rank, const void *in, size_t bytes,
                                  void *out);
size_t wse_comm_slot_bytes(const wsync_engine_comm_t *c);
/* WSYNC_ERR_PEER_LOST when the group was aborted or a peer process is gone (not collective). */
wsync_status_t wse_comm_check(wsync_engine_comm_t *c, int rank);
int wse_comm_timeout_ms(const wsync_engine_comm_t *c);

/* ---- CUDA engines (engine/cuda.h; engine/comm_cuda.c) --------------------------------------- */

/* The TP collectives of a CUDA engine: NCCL among the ranks' GPUs, set up collectively at the
 * first forward, or the host communicator through staging copies (no NCCL in the build, two
 * ranks on one GPU, or WSYNC_ENGINE_ALLREDUCE=shm). */
typedef struct wse_tpdev wse_tpdev_t;
wsync_status_t wse_tpdev_create(wsync_engine_t *e, wse_tpdev_t **out);
void wse_tpdev_free(wse_tpdev_t *t);
/* The collectives for forward; the first call (collective) sets NCCL up. */
wsync_status_t wse_tpdev_coll(wse_tpdev_t *t, wse_cuda_coll_t *coll);
/* A line for the logs when WSYNC_LOG_LEVEL is info or debug. */
void wse_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- the engine ---------------------------------------------------------------------------- */

struct wsync_engine {
    wsync_model_config_t cfg;
    wsync_engine_params_t p;
    int64_t Hd, H, K, D, I, V, Vp, Vr, Hr, Kr, Ir, kr, L;
    int blk;                        /* FP8 block, 0 without */
    int64_t rd;                     /* rotary dims: D, or qk_rope_head_dim with MLA */

    /* MLA (kv_lora > 0): per local head q and k have qk = nope + rope dims, v has vd */
    int64_t q_lora, kv_lora, nope, rope, vd, qk;
    int rope_interleave;
    float attn_scale;               /* multiplies q.k: 1/sqrt(D), or 1/sqrt(nope + rope) */
    int64_t kdim, vdim;             /* per position and layer in the KV cache: Kr*D (GQA) or
                                       Hr*qk and Hr*vd (MLA, expanded per local head) */

    /* MoE (E > 0): this rank's experts are e_first .. e_first + E_local - 1, Ip wide each
     * (moe_I / T inside TP, moe_I with expert parallelism); Is the shared experts' width here */
    int64_t E, E_local, e_first, Ip, Is, topk;
    int ep;                         /* expert-parallel size: 1 (off) or tp_size */
    int norm_topk;                  /* renormalise the top-k weights (HF's rule per family) */
    float routed_scale;             /* routed_scaling_factor, 1 for qwen3_moe */

    /* the rank's targets (layout order) and where each lives in a weight set */
    wsync_target_t *targets;
    size_t ntargets;
    wse_slot_t *slots;
    size_t set_bytes;
    wse_set_t sets[2];              /* [1] only in shadow mode */
    int nsets;
    int active;                     /* index of the set in use */
    wse_weights_t w;                /* views into sets[active] */
    wse_layer_t *layers;

    /* run state: allocated once; kv freed by sleep level >= 1 */
    float *x, *xb, *xb2, *qkv, *att_out, *att, *hb, *hb2, *logits_local, *logits;
    float *mla_a;                   /* [q_lora + kv_lora + rope]: qkv_a's output */
    float *mla_c;                   /* [max(q_lora, kv_lora)]: a latent, normed */
    float *mla_kv;                  /* [Hr * (nope + vd)]: kv_b's output */
    float *router;                  /* [4 E]: the router's scores and their scratch */
    float *moe_out, *moe_wt;        /* [Hd] the routed sum on this rank; [topk] weights */
    int64_t *moe_sel;               /* [topk] the chosen experts, ascending */
    float *rope_cos, *rope_sin;     /* [max_seq, rd/2] */
    float *kcache, *vcache;         /* [L, max_seq, kdim] and [L, max_seq, vdim] */
    size_t k_bytes, v_bytes;
    int max_seq;
    int sleeping;

    /* the source of the last load (descriptions only), for wake after level 2 */
    wsync_engine_tensor_t *src;
    size_t nsrc;
    char *src_names;
    wsync_engine_st_t **files;      /* checkpoint files opened by wsync_engine_open */
    size_t nfiles;

    /* CUDA (p.device): the GPU side, NULL on CPU; the weight sets are its device memory */
    wse_cuda_t *cuda;
    wse_tpdev_t *tpdev;             /* TP > 1 */

    wsync_engine_token_fn on_token;
    void *on_token_arg;

    /* wsync */
    wsync_ctx_t *ctx;
    wsync_receiver_t *rv;
    double sync_seconds;
    /* shadow mode: the receiver thread lands into sets[spare] */
    pthread_t thread;
    int thread_running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;                       /* the thread should exit */
    uint64_t pending;               /* version landed in the spare set, 0 if none */
    int repoint;                    /* the thread must point the targets at the spare set */
    wsync_status_t thread_st;       /* first failure of the thread */
    char thread_err[1024];
};

/* Point e->w at sets[e->active]. */
void wse_weights_bind(wsync_engine_t *e);
/* Point the receiver's targets at set s (from the thread that owns the receiver). */
wsync_status_t wse_targets_point(wsync_engine_t *e, int s);
wsync_status_t wse_set_alloc(wsync_engine_t *e, int s);
void wse_set_free(wsync_engine_t *e, int s);
wsync_status_t wse_load_into(wsync_engine_t *e, int s, const wsync_engine_tensor_t *t, size_t n);
/* Stop the shadow thread (if running) and wait for it. */
void wse_shadow_stop(wsync_engine_t *e);
wsync_status_t wse_shadow_start(wsync_engine_t *e);
/* Shadow mode: swap a version every rank has landed. Collective. *swapped set to 1 if done.
 * strict: a failure of any rank's receiver thread is an error (else it is left for update). */
wsync_status_t wse_shadow_take(wsync_engine_t *e, int strict, int *swapped);
wsync_status_t wse_kv_alloc(wsync_engine_t *e);
void wse_kv_free(wsync_engine_t *e);

#endif
