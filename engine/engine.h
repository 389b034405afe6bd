/*
 * The bundled inference engine: a Llama / Qwen2 / Qwen3 decoder, and the mixture-of-experts
 * Qwen3-MoE and DeepSeek-V2/V3 (multi-head latent attention, routed and shared experts), on CPU
 * or CUDA, tensor-parallel (and expert-parallel) across processes, whose weights are wsync
 * receiver targets. It uses the public wsync API only.
 *
 * Shape (llama2.c's): a config (wsync_model_config_t plus these params), weights that are
 * non-owning views into one block of target buffers (a *weight set*; two in shadow mode), and a
 * run state allocated once; forward allocates nothing.
 *
 * On CUDA (params.device) the same model runs on one GPU per TP rank: the weight sets are
 * device memory registered as WSYNC_MEM_CUDA targets, the kernels mirror the CPU arithmetic
 * (bf16/FP8 weights times f32 activations, f32 accumulation), and only the logits come back to
 * the host (wsync_engine_forward's pointer is host memory either way).
 *
 * Weights are held exactly as wsync_layout_tp_targets lays them out for TP rank r of T: fused
 * qkv_proj and gate_up_proj, row-parallel o_proj and down_proj, vocab-parallel embed_tokens and
 * lm_head padded to a multiple of vocab_pad, replicated norms; MoE layers as vLLM's FusedMoE
 * (router replicated, w13 / w2 of the rank's experts, shared experts as a dense MLP), MLA as
 * vLLM's (fused q_a / kv_a replicated, q_b and kv_b by heads); bf16 (or the checkpoint's
 * f16/f32) with f32 accumulation, or FP8-E4M3 with fp32 block scales for the linear weights,
 * dequantized on the fly block by block.
 *
 * The arithmetic is HF transformers' (5.x) float32 forward: MLA computes every head's k and v
 * from kv_b_proj and caches them expanded (nothing is derived from the weights after a load or
 * a version, so no per-version hook is needed); routing is the family's (softmax top-k,
 * renormalised when norm_topk_prob, for Qwen3-MoE; sigmoid scores plus
 * e_score_correction_bias, grouped top-k on the sum of each group's best two, weights from the
 * scores, renormalised, times routed_scaling_factor for DeepSeek-V3; softmax with greedy or
 * group_limited_greedy, times the scaling factor and never renormalised, for DeepSeek-V2).
 * Only the default RoPE is computed: wsync_engine_open refuses a config.json asking for
 * another (YaRN, ...).
 *
 * Conventions: as wsync.h. Every function returns a wsync_status_t, writes outputs only on
 * success, and leaves the detail of a failure in wsync_engine_last_error(). An engine is used by
 * one thread at a time (its shadow receiver thread is its own business). Functions marked
 * *collective* must be called by every TP rank of the engine, in the same order.
 */
#ifndef WSYNC_ENGINE_H
#define WSYNC_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include <wsync/wsync.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WSYNC_ENGINE_MAX_TP 64

/* Detail of the last engine failure on this thread ("invalid argument: ..."); "" if none.
 * Thread-local; valid until the next engine call on the thread. */
const char *wsync_engine_last_error(void);

/* ------------------------------------------------------------------------------------------ */
/* safetensors: a strict reader over a read-only mapping                                        */
/* ------------------------------------------------------------------------------------------ */

/* One tensor of a checkpoint, or of any in-memory source given to wsync_engine_load. */
typedef struct {
    const char *name;
    wsync_dtype_t dtype;           /* 0 when the file's dtype is one wsync has no name for */
    const char *dtype_name;        /* as the file spells it ("BF16", "I64"); may be NULL in
                                      sources built in memory */
    int ndim;                      /* 0..WSYNC_MAX_DIMS */
    int64_t shape[WSYNC_MAX_DIMS];
    const void *data;              /* row-major, not necessarily aligned */
    size_t nbytes;
} wsync_engine_tensor_t;

typedef struct wsync_engine_st wsync_engine_st_t;

/* Map `path` read-only and parse its header. Strict: the header must be one JSON object (no
 * duplicate keys) whose entries have exactly dtype, shape and data_offsets; offsets must lie in
 * the file, agree with shape x dtype, neither overlap nor leave holes, and end where the file
 * ends. Dtypes are those of the safetensors format (BF16, F16, F32, F8_E4M3, ..., I64); others
 * are refused. WSYNC_ERR_IO (the path), WSYNC_ERR_INVALID (the tensor or field and why).
 * Nothing is copied: tensors point into the mapping, which lives until wsync_engine_st_close. */
wsync_status_t wsync_engine_st_open(const char *path, wsync_engine_st_t **st);

/* Parse a safetensors image held in memory (len bytes), with the same checks. The buffer is
 * not copied and must outlive the result. */
wsync_status_t wsync_engine_st_parse(const void *buf, size_t len, wsync_engine_st_t **st);

size_t wsync_engine_st_count(const wsync_engine_st_t *st);
/* The tensors, in file order (by offset). */
const wsync_engine_tensor_t *wsync_engine_st_tensors(const wsync_engine_st_t *st);
/* The tensor called `name`, or NULL. */
const wsync_engine_tensor_t *wsync_engine_st_find(const wsync_engine_st_t *st, const char *name);
/* Unmap and free. NULL is a no-op. */
void wsync_engine_st_close(wsync_engine_st_t *st);

/* ------------------------------------------------------------------------------------------ */
/* Tensor-parallel communicator: shared memory among the T processes of one engine              */
/* ------------------------------------------------------------------------------------------ */

typedef struct wsync_engine_comm wsync_engine_comm_t;

/* Create, BEFORE forking the T rank processes, a communicator for TP size tp (1..64) large
 * enough for model cfg (vocab padded to vocab_pad, 0: 64): an anonymous shared mapping holding a
 * barrier and the all-reduce slots. Every wait on it ends within timeout_ms (<= 0: 120000) or
 * sooner, with WSYNC_ERR_PEER_LOST, when a peer process is gone or the group was aborted.
 * Each child inherits the object; each process frees its own copy. */
wsync_status_t wsync_engine_comm_create(int tp, const wsync_model_config_t *cfg, int64_t vocab_pad,
                                        int timeout_ms, wsync_engine_comm_t **comm);
void wsync_engine_comm_free(wsync_engine_comm_t *comm);
/* Mark the group failed (any process may): every rank's next or current wait returns
 * WSYNC_ERR_PEER_LOST with `why`. */
void wsync_engine_comm_abort(wsync_engine_comm_t *comm, const char *why);

/* Fork tp processes; process r runs fn(r, tp, comm, arg) and exits with its return value. The
 * caller waits: when a rank fails (non-zero exit or a signal), the communicator is aborted so
 * that the others stop within their current wait; after timeout_s (> 0) every rank still
 * running is killed. codes[r] (may be NULL) gets each exit code (128 + signal; -1 killed at the
 * deadline). Fork before creating any wsync object. Returns WSYNC_OK when every rank exited 0,
 * WSYNC_ERR_PEER_LOST (naming the first rank that failed) otherwise. */
typedef int (*wsync_engine_rank_fn)(int rank, int tp, wsync_engine_comm_t *comm, void *arg);
wsync_status_t wsync_engine_launch(int tp, wsync_engine_comm_t *comm, wsync_engine_rank_fn fn,
                                   void *arg, int timeout_s, int *codes);

/* ------------------------------------------------------------------------------------------ */
/* The engine                                                                                   */
/* ------------------------------------------------------------------------------------------ */

typedef struct wsync_engine wsync_engine_t;

typedef enum {
    WSYNC_ENGINE_QUANT_NONE = 0,       /* linear weights in the targets' dtype (bf16) */
    WSYNC_ENGINE_QUANT_FP8_BLOCK = 1,  /* linear weights F8E4M3FN with fp32 block scales */
} wsync_engine_quant_t;

typedef enum {
    WSYNC_ENGINE_IN_PLACE = 0,  /* versions land in the weights in use; generation pauses */
    WSYNC_ENGINE_SHADOW = 1,    /* versions land in spare weights on a thread; swap at commit */
} wsync_engine_mode_t;

/* Where an engine's weights, KV cache and arithmetic live. */
typedef enum {
    WSYNC_ENGINE_CPU = 0,
    WSYNC_ENGINE_CUDA = 1,   /* one GPU per TP rank; weights are WSYNC_MEM_CUDA targets, the TP
                                all-reduce goes through NCCL (host shared memory without NCCL,
                                or with more ranks than GPUs, or WSYNC_ENGINE_ALLREDUCE=shm) */
} wsync_engine_device_t;

typedef struct {
    int tp_rank, tp_size;            /* 0 of 1 by default */
    wsync_engine_comm_t *comm;       /* required when tp_size > 1 */
    wsync_engine_quant_t quant;
    int fp8_block;                   /* block rows = cols of FP8 scales; 0: 128 */
    int64_t vocab_pad;               /* 0: 64 */
    int max_seq;                     /* KV cache positions; 0: min(max_position_embeddings, 4096) */
    wsync_engine_mode_t mode;
    wsync_dtype_t param_dtype;       /* dtype the trainers send; 0: the config's, else bf16 */
    wsync_dtype_t dtype;             /* dtype of unquantized weights; 0: bf16 */
    wsync_engine_device_t device;    /* CPU by default */
    int gpu;                         /* CUDA: device ordinal, taken modulo the number of visible
                                        devices; < 0: tp_rank (the default) */
    int ep;                          /* expert parallelism of MoE layers: 0 or 1, every rank
                                        holds every expert, split inside by TP (I / tp_size
                                        wide); tp_size, whole experts spread over the TP ranks
                                        (vLLM's enable_expert_parallel with DP 1: EP rank =
                                        tp_rank, linear placement), attention still split by
                                        TP; any other value is refused */
} wsync_engine_params_t;

#define WSYNC_ENGINE_PARAMS_INIT                                                              \
    {0, 1, NULL, WSYNC_ENGINE_QUANT_NONE, 0, 0, 0, WSYNC_ENGINE_IN_PLACE, (wsync_dtype_t)0,    \
     (wsync_dtype_t)0, WSYNC_ENGINE_CPU, -1, 0}

/* Number of CUDA devices this process sees. WSYNC_ERR_UNSUPPORTED when built without CUDA;
 * WSYNC_ERR_DEVICE "no CUDA device (...)" when there is none (no GPU, or no driver). It
 * initializes CUDA in the calling process: call it in the processes that use the GPUs, never
 * before a fork() whose children will. Thread-safe. */
wsync_status_t wsync_engine_cuda_devices(int *count);

/* Create an engine for model cfg: the rank's targets (wsync_layout_tp_targets), one weight set
 * (two in shadow mode), zeroed, and the run state. No weights yet: load them, or take a version.
 * WSYNC_ERR_CONFIG when the layout refuses the model at this TP size, EP size or block size (the
 * message names the param and the numbers); WSYNC_ERR_INVALID for an ep that is neither 0, 1
 * nor tp_size. With device CUDA, the sets, the run state and the KV cache
 * are device memory of the rank's GPU (made current on the calling thread): WSYNC_ERR_UNSUPPORTED
 * when built without CUDA, WSYNC_ERR_DEVICE naming the CUDA call otherwise ("no CUDA device"). */
wsync_status_t wsync_engine_create(const wsync_model_config_t *cfg,
                                   const wsync_engine_params_t *params, wsync_engine_t **engine);

/* Fill the weights from full (unsharded) tensors named as in the HF checkpoint: this rank's
 * slices are copied once into its targets (cast, or FP8-quantized). The engine copies the
 * descriptions (not the data) to reload after a level-2 sleep when it has no wsync group, so
 * the tensors' data must outlive the engine or its next load. The weights become version 0.
 * Not while attached in shadow mode (WSYNC_ERR_STATE). Not collective.
 * WSYNC_ERR_NOT_FOUND names a missing tensor; WSYNC_ERR_CONFIG a tensor whose shape is not
 * what the config implies; WSYNC_ERR_UNSUPPORTED a dtype the engine cannot read. */
wsync_status_t wsync_engine_load(wsync_engine_t *engine, const wsync_engine_tensor_t *tensors,
                                 size_t ntensors);

/* config.json and model.safetensors (or model.safetensors.index.json and its shards) of an HF
 * directory: wsync_model_config_load, wsync_engine_create, then wsync_engine_load from the mapped
 * files (kept mapped by the engine). */
wsync_status_t wsync_engine_open(const char *dir, const wsync_engine_params_t *params,
                                 wsync_engine_t **engine);

/* Stop the shadow thread, leave the group, unmap, free. NULL is a no-op. */
void wsync_engine_free(wsync_engine_t *engine);

const wsync_model_config_t *wsync_engine_config(const wsync_engine_t *engine);

/* One decoder step for `token` at position `pos` (0-based; positions must be fed in order from
 * 0). *logits (may be NULL) points at vocab_size floats in the run state, valid until the next
 * step. Collective. Allocates nothing. WSYNC_ERR_RANGE for a token outside the vocabulary or a
 * position past max_seq; WSYNC_ERR_STATE without weights; WSYNC_ERR_PEER_LOST when a TP peer is
 * gone. */
wsync_status_t wsync_engine_forward(wsync_engine_t *engine, int32_t token, int pos,
                                    const float **logits);

/* What one generation did. */
typedef struct {
    uint64_t version;      /* version of the weights every step used (0: loaded from files) */
    int ntokens;           /* tokens written to out */
    uint64_t logits_hash;  /* XXH3-64 of the last step's logits (vocab_size floats) */
    double seconds;        /* wall time of the generation */
} wsync_engine_result_t;

/* Called on the engine's thread after each generated token; non-zero stops the generation
 * (with TP, every rank's callback must decide alike, since the steps are collective). */
typedef int (*wsync_engine_token_fn)(void *arg, int index, int32_t token);
void wsync_engine_set_token_callback(wsync_engine_t *engine, wsync_engine_token_fn fn, void *arg);

/* Greedy generation: feed the prompt from position 0, then take the argmax (lowest id on ties)
 * max_new times, writing the tokens to out[max_new]. In shadow mode a version that every rank
 * has landed is swapped in first; the whole generation then uses that one set of weights.
 * Collective. */
wsync_status_t wsync_engine_generate(wsync_engine_t *engine, const int32_t *prompt, int nprompt,
                                     int max_new, int32_t *out, wsync_engine_result_t *result);

/* Version of the weights in use: 0 loaded from files, > 0 from wsync. */
uint64_t wsync_engine_version(const wsync_engine_t *engine);

/* ------------------------------------------------------------------------------------------ */
/* Weights as targets                                                                           */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    const char *name;          /* target name ("model.layers.0.self_attn.qkv_proj.weight") */
    wsync_dtype_t dtype;
    int ndim;
    int64_t shape[WSYNC_MAX_DIMS];
    void *data;                /* in the weight set in use */
    size_t bytes;
    float *scales;             /* FP8 block scales, or NULL */
    size_t nscales;
    int block;                 /* FP8 block size, 0 when not quantized */
    wsync_mem_t mem;           /* where data and scales are: CUDA memory of `device` for a
                                  CUDA engine, else host */
    int device;
} wsync_engine_weight_t;

size_t wsync_engine_weight_count(const wsync_engine_t *engine);
/* Target i (layout order) of the weights in use. WSYNC_ERR_RANGE for a bad index,
 * WSYNC_ERR_STATE while the weights are freed (level-2 sleep). */
wsync_status_t wsync_engine_weight(const wsync_engine_t *engine, size_t i,
                                   wsync_engine_weight_t *weight);

/* Copy target i of the weights in use into host memory: data[bytes] and, when not NULL and the
 * target is quantized, scales[nscales] (sizes as wsync_engine_weight says). Works on CPU and
 * CUDA engines alike (the way to inspect a CUDA engine's weights). Errors as
 * wsync_engine_weight, and WSYNC_ERR_DEVICE for a failed copy. */
wsync_status_t wsync_engine_weight_read(const wsync_engine_t *engine, size_t i, void *data,
                                        float *scales);

/* Block-quantize a [rows, cols] float32 matrix to F8E4M3FN the way the engines (and wsync's
 * receivers) do: per block, s = max(amax, 1e-4) / 448 (1 if that underflows), q = sat(x * (1/s))
 * in float32, round to nearest even. scales: ceil(rows/block) x ceil(cols/block).
 * WSYNC_ERR_NONFINITE naming `name` and the element for NaN or Inf. Thread-safe. */
wsync_status_t wsync_engine_quantize_block(const char *name, const float *x, int64_t rows,
                                           int64_t cols, int block, uint8_t *q, float *scales);

/* ------------------------------------------------------------------------------------------ */
/* wsync inside                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Make this TP rank a receiver of the group at rp->coordinator, its targets being the engine's
 * weight buffers. rp->rank < 0 means tp_rank and rp->nreceivers 0 means tp_size (one replica).
 * In shadow mode the versions will land in the spare set, on a thread started here.
 * ctx must outlive the engine. Not collective. */
wsync_status_t wsync_engine_attach(wsync_engine_t *engine, wsync_ctx_t *ctx,
                                   const wsync_receiver_params_t *rp);

/* Take the next version. In place: wait up to timeout_ms (< 0: the receiver's timeout) for it to
 * begin, and land it in the weights in use. Shadow: wait until every rank has landed one in its
 * spare set, and swap. TP ranks agree: a rank that saw no version in time waits for one another
 * rank took, so every rank ends on the same version. *version (may be NULL) gets it.
 * WSYNC_ERR_TIMEOUT when no rank got one. Collective. */
wsync_status_t wsync_engine_update(wsync_engine_t *engine, int timeout_ms, uint64_t *version);

/* 1 when a version has landed in the spare set and waits to be swapped in (shadow mode). */
int wsync_engine_pending(const wsync_engine_t *engine);

/* Wall time of the receiver wait that delivered the last version (in place, that includes
 * waiting for it to begin; the trainers' wsync_sender_stats time the sync itself). 0 if none. */
double wsync_engine_sync_seconds(const wsync_engine_t *engine);

/* Sleep: level 1 frees the KV cache; level 2 also frees the weights (every set). The shadow
 * thread stops first (a version it is landing completes). Generation fails with
 * WSYNC_ERR_STATE until wake. Not collective. */
wsync_status_t wsync_engine_sleep(wsync_engine_t *engine, int level);

/* Wake: the KV cache comes back; after level 2 fresh weight buffers too, the receiver's targets
 * are re-pointed at them (wsync_receiver_set_target_data), and they hold weights again after
 * the next version (or at once, reloaded from the tensors of the last load when the engine has
 * no receiver). Not collective. */
wsync_status_t wsync_engine_wake(wsync_engine_t *engine);

/* Sleep level now (0 awake). */
int wsync_engine_sleeping(const wsync_engine_t *engine);

#ifdef __cplusplus
}
#endif

#endif /* WSYNC_ENGINE_H */
