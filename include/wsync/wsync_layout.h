/*
 * Layout builders (part of the public API; included by wsync.h).
 *
 * Three layers, each usable alone:
 *  1. Model config: a HF `config.json` of the Llama, Qwen2 or Qwen3 family read into a plain
 *     struct, and the list of checkpoint params (names, global shapes) it implies.
 *  2. Sender layouts: which box of each param a trainer rank holds (FSDP dim-0, Shard(d) over a
 *     1-D mesh, replicated), as wsync_shard_t arrays ready for wsync_sender_add_shard once the
 *     caller sets each `data` pointer.
 *  3. Receiver layouts: vLLM's tensor-parallel layouts (column, row, fused QKV, merged gate_up,
 *     vocab-parallel, replicated), one target at a time or a whole model at once, as
 *     wsync_target_t arrays ready for wsync_receiver_add_target once the caller sets each `data`.
 *
 * Conventions:
 *  - Functions return WSYNC_OK or a negative status and write their outputs only on success;
 *    wsync_last_error() then names the field, param or number that was wrong.
 *    WSYNC_ERR_CONFIG: the model (or a layout of it) is one the engines refuse;
 *    WSYNC_ERR_INVALID: a bad argument (NULL, rank out of range, a dim the param lacks).
 *  - Everything returned is owned by the caller and freed with the free function named beside
 *    it (strings and pieces included); freeing NULL is a no-op.
 *  - No function keeps state: all are thread-safe on distinct outputs.
 *
 * Symbols as in RESHARD_SPEC: Hd hidden size, H query heads, K kv heads, D head dim, I
 * intermediate size, V vocab size, T tensor-parallel size, r TP rank.
 */
#ifndef WSYNC_LAYOUT_H
#define WSYNC_LAYOUT_H

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Model config                                                                                 */
/* ------------------------------------------------------------------------------------------ */

typedef enum {
    WSYNC_MODEL_LLAMA = 1,
    WSYNC_MODEL_QWEN2 = 2,
    WSYNC_MODEL_QWEN3 = 3,
} wsync_model_type_t;

/* A decoder of the Llama family. Plain values, no allocation: copy it freely. A config written
 * by hand (tests, tools) should go through wsync_model_config_check before use; every builder
 * below checks it again. */
typedef struct {
    wsync_model_type_t model_type;
    int64_t hidden_size;              /* Hd */
    int64_t num_hidden_layers;
    int64_t num_attention_heads;      /* H */
    int64_t num_key_value_heads;      /* K */
    int64_t head_dim;                 /* D */
    int64_t intermediate_size;        /* I */
    int64_t vocab_size;               /* V */
    int64_t max_position_embeddings;
    int tie_word_embeddings;          /* lm_head is embed_tokens: no lm_head.weight param */
    int attention_bias;               /* q_proj, k_proj, v_proj have biases */
    int o_proj_bias;                  /* o_proj has a bias */
    int mlp_bias;                     /* gate_proj, up_proj, down_proj have biases */
    int qk_norm;                      /* self_attn.q_norm / k_norm, each [D] (Qwen3) */
    double rms_norm_eps;
    double rope_theta;
    wsync_dtype_t dtype;              /* "dtype" / "torch_dtype" of the checkpoint; 0 if absent
                                         or not bf16/f16/f32 */
} wsync_model_config_t;

/* "llama", "qwen2", "qwen3"; "?" otherwise. Static storage; thread-safe. */
const char *wsync_model_type_name(wsync_model_type_t type);

/* Parse a HF config.json held in memory (len bytes, need not be NUL-terminated).
 * The family comes from `model_type` (llama, qwen2, qwen3), else from `architectures[0]`
 * (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM).
 * Required: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size
 * (HF would fill 7B-sized defaults; a checkpoint's config always states them, and guessing would
 * describe some other model). Absent or null optional fields take transformers' defaults for the
 * family (configuration_{llama,qwen2,qwen3}.py, v4.5x and v5):
 *   num_key_value_heads  llama: H;  qwen2, qwen3: 32 (the dataclass default, not H)
 *   head_dim             llama, qwen2: Hd / H;  qwen3: 128
 *   tie_word_embeddings  false
 *   attention_bias       llama, qwen3: false (applies to q, k, v and o);
 *                        qwen2: q, k, v always have biases and o never (fixed in Qwen2Attention)
 *   mlp_bias             llama: false; qwen2, qwen3: none
 *   rms_norm_eps         1e-6 for all three
 *   rope_theta           rope_scaling.rope_theta, else rope_parameters.rope_theta, else the
 *                        top-level rope_theta, else 10000 for all three
 *                        (RotaryEmbeddingConfigMixin.default_theta)
 *   max_position_embeddings  llama: 2048; qwen2, qwen3: 32768
 * Returns WSYNC_ERR_CONFIG for malformed JSON (line and column), an unknown family, a missing
 * required field, a wrong type (a string where a number belongs, a fraction where an integer
 * does), a size <= 0, or a contradiction (H % K, Hd % H when head_dim is absent); the message
 * names the field and the value. Thread-safe. */
wsync_status_t wsync_model_config_parse(const char *json, size_t len, wsync_model_config_t *cfg);

/* Read and parse a config.json file. WSYNC_ERR_IO if the file cannot be read (the message names
 * the path), otherwise as wsync_model_config_parse (messages prefixed with the path). */
wsync_status_t wsync_model_config_load(const char *path, wsync_model_config_t *cfg);

/* Check a config's internal consistency (sizes >= 1, H % K == 0, eps and theta > 0, sizes small
 * enough that every shape fits in int64). WSYNC_ERR_CONFIG naming the field otherwise. */
wsync_status_t wsync_model_config_check(const wsync_model_config_t *cfg);

/* The checkpoint params of the model, in HF order: model.embed_tokens.weight [V, Hd]; for each
 * layer i, model.layers.{i}.input_layernorm.weight [Hd], self_attn.{q,k,v}_proj.weight
 * [H*D | K*D | K*D, Hd] (+ .bias when attention_bias), self_attn.o_proj.weight [Hd, H*D]
 * (+ bias), self_attn.{q,k}_norm.weight [D] (qk_norm), post_attention_layernorm.weight [Hd],
 * mlp.{gate,up}_proj.weight [I, Hd], mlp.down_proj.weight [Hd, I] (+ biases when mlp_bias);
 * model.norm.weight [Hd]; lm_head.weight [V, Hd] unless tie_word_embeddings.
 * Every param gets `dtype`; 0 means cfg->dtype, or bf16 if the config has none.
 * *params (an array of *n, names included) is owned by the caller: wsync_model_params_free.
 * Thread-safe. */
wsync_status_t wsync_model_params(const wsync_model_config_t *cfg, wsync_dtype_t dtype,
                                  wsync_param_t **params, size_t *n);

/* Free what wsync_model_params returned. NULL is a no-op. */
void wsync_model_params_free(wsync_param_t *params, size_t n);

/* ------------------------------------------------------------------------------------------ */
/* Sender layouts                                                                               */
/* ------------------------------------------------------------------------------------------ */

/* `dim` value meaning "every rank holds the whole param". */
#define WSYNC_REPLICATE (-1)

/* The box rank `rank` of `nranks` holds of `param` when it is split along `dim` the way FSDP
 * and DTensor's Shard(dim) split it: with c = ceil(n / nranks) for n = shape[dim], the rank
 * holds [rank*c, min(n, (rank+1)*c)) along dim and everything along the other dims. The last
 * ranks may hold fewer rows, or none (len 0, start clamped to n: an empty box, still a valid
 * shard).
 * dim = 0 is FSDP; dim = WSYNC_REPLICATE gives the whole param.
 * WSYNC_ERR_INVALID for nranks < 1, rank outside [0, nranks), dim >= param->ndim or a bad param.
 * Thread-safe. */
wsync_status_t wsync_layout_shard_box(const wsync_param_t *param, int dim, int rank, int nranks,
                                      wsync_box_t *box);

/* One shard per param (empty boxes included, so every rank gets the same count and order) for
 * rank `rank` of `nranks`, each split along `dim` as by wsync_layout_shard_box. Shards have
 * data = NULL, mem = WSYNC_MEM_HOST, device 0: the caller sets them before adding the shard.
 * The param names are copies owned by the array. *shards is owned by the caller:
 * wsync_layout_shards_free. Thread-safe. */
wsync_status_t wsync_layout_shards(const wsync_param_t *params, size_t nparams, int dim, int rank,
                                   int nranks, wsync_shard_t **shards, size_t *nshards);

/* FSDP (dim-0) shards of every param of the model (wsync_model_params order, `dtype` as
 * there) for rank `rank` of `nranks`. Ownership as wsync_layout_shards. Thread-safe. */
wsync_status_t wsync_layout_fsdp_shards(const wsync_model_config_t *cfg, wsync_dtype_t dtype,
                                        int rank, int nranks, wsync_shard_t **shards,
                                        size_t *nshards);

/* Free what wsync_layout_shards / wsync_layout_fsdp_shards returned. NULL is a no-op. */
void wsync_layout_shards_free(wsync_shard_t *shards, size_t nshards);

/* ------------------------------------------------------------------------------------------ */
/* Receiver layouts: one target                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Each builder writes *target: name and pieces owned by it (free with wsync_layout_target_free),
 * dtype = the params' dtype, data = NULL, mem = WSYNC_MEM_HOST, quant.scheme = NONE. The caller
 * may change dtype, mem, device and quant, then allocates wsync_target_bytes(target) bytes.
 * Tensor-parallel builders take rank tp_rank of tp_size (WSYNC_ERR_INVALID when outside
 * [0, tp_size)); they refuse, with WSYNC_ERR_CONFIG naming the param and the numbers, what vLLM
 * refuses. Thread-safe. */

/* Every rank holds the whole param (norms; a row-parallel layer's bias). Name = param name. */
wsync_status_t wsync_layout_replicated(const wsync_param_t *param, wsync_target_t *target);

/* Rows [r*N/T, (r+1)*N/T) of an output-split weight or bias, N = shape[0]; needs N % T == 0.
 * Target [N/T, ...]; name = param name. */
wsync_status_t wsync_layout_column_parallel(const wsync_param_t *param, int tp_rank, int tp_size,
                                            wsync_target_t *target);

/* Columns [r*N/T, (r+1)*N/T) of every row of a 2-D input-split weight (o_proj, down_proj),
 * N = shape[1]; needs N % T == 0. Target [shape[0], N/T]; name = param name. */
wsync_status_t wsync_layout_row_parallel(const wsync_param_t *param, int tp_rank, int tp_size,
                                         wsync_target_t *target);

/* vLLM's MergedColumnParallelLinear (gate_up_proj = [gate; up]): each of the nparts params is
 * split by rows as by column_parallel, and the rank's slices are stacked in order:
 * [part0 rows r*N0/T..; part1 rows r*N1/T..; ...]. Parts share dtype, ndim and trailing dims.
 * Target named `name`. */
wsync_status_t wsync_layout_merged_column(const char *name, const wsync_param_t *parts, int nparts,
                                          int tp_rank, int tp_size, wsync_target_t *target);

/* vLLM's QKVParallelLinear, for weights [rows, Hd] and biases [rows] alike. With D =
 * q.rows / H and Dv = v.rows / K (k.rows must be K*D): needs H % T == 0, and K % T == 0 when
 * K >= T or T % K == 0 when K < T. Hr = H/T; Kr = K/T, rep = 1 when K >= T, else Kr = 1,
 * rep = T/K; kr = r / rep. Target [Hr*D + Kr*D + Kr*Dv, ...]:
 *   q rows [r*Hr*D, (r+1)*Hr*D), then k rows [kr*Kr*D, (kr+1)*Kr*D), then v rows
 *   [kr*Kr*Dv, (kr+1)*Kr*Dv). Target named `name`. */
wsync_status_t wsync_layout_qkv(const char *name, const wsync_param_t *q, const wsync_param_t *k,
                                const wsync_param_t *v, int64_t num_heads, int64_t num_kv_heads,
                                int tp_rank, int tp_size, wsync_target_t *target);

/* vLLM's VocabParallelEmbedding / ParallelLMHead: Vp = ceil(V / vocab_pad) * vocab_pad, needs
 * Vp % T == 0; Vr = Vp / T. Target [Vr, ...]; rank r's rows [r*Vr, (r+1)*Vr) that are < V come
 * from the param (one piece, or none when the rank holds only padding); rows >= V are covered
 * by no piece, so the library zeroes them. vocab_pad <= 0 means 64 (vLLM's default).
 * Name = param name. */
wsync_status_t wsync_layout_vocab_parallel(const wsync_param_t *param, int64_t vocab_pad,
                                           int tp_rank, int tp_size, wsync_target_t *target);

/* Free the name and pieces a builder allocated, and clear *target (the struct itself and its
 * data buffer stay the caller's). NULL is a no-op. */
void wsync_layout_target_free(wsync_target_t *target);

/* Bytes of the target's buffer: product of shape times the dtype's size; 0 for a bad dtype or
 * ndim. Thread-safe. */
size_t wsync_target_bytes(const wsync_target_t *target);

/* Number of fp32 scales an FP8 target needs, by quant.scheme: TENSOR 1; CHANNEL rows
 * (shape[0]); BLOCK ceil(rows/block_rows) * ceil(cols/block_cols) of a 2-D target (0 block
 * sizes mean 128); NONE 0. Thread-safe. */
size_t wsync_target_scale_count(const wsync_target_t *target);

/* ------------------------------------------------------------------------------------------ */
/* Receiver layouts: a whole model                                                              */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    wsync_dtype_t param_dtype;   /* dtype the senders hold; 0: cfg->dtype, or bf16 if none */
    wsync_dtype_t dtype;         /* dtype of every target not quantized; 0: param_dtype */
    wsync_dtype_t quant_dtype;   /* dtype of quantized targets; 0: WSYNC_DTYPE_F8E4M3FN */
    /* quant.scheme != NONE turns the linear weights (qkv_proj, o_proj, gate_up_proj,
     * down_proj) into quant_dtype targets carrying a copy of this struct (block sizes 0 become
     * 128; scales must be NULL here: the caller gives each target its own,
     * wsync_target_scale_count floats). Embeddings, lm_head, norms and biases are never
     * quantized. */
    wsync_quant_t quant;
    int64_t vocab_pad;           /* vocab padding multiple; 0: 64 */
} wsync_tp_options_t;

/* dtype 0 means "unset" (casts keep the initializer valid C++) */
#define WSYNC_TP_OPTIONS_INIT                                                                 \
    {(wsync_dtype_t)0, (wsync_dtype_t)0, (wsync_dtype_t)0,                                    \
     {WSYNC_QUANT_NONE, 0, 0, 0.0f, 0, 0, NULL, WSYNC_MEM_HOST}, 0}

/* Every target of TP rank tp_rank of tp_size, as vLLM lays a Llama/Qwen2/Qwen3 model out, in
 * the order: model.embed_tokens.weight (vocab-parallel); per layer input_layernorm.weight
 * (replicated), self_attn.qkv_proj.weight (fused QKV) [+ qkv_proj.bias], self_attn.o_proj.weight
 * (row-parallel) [+ o_proj.bias, replicated], self_attn.{q,k}_norm.weight (replicated),
 * post_attention_layernorm.weight, mlp.gate_up_proj.weight (merged [gate; up])
 * [+ gate_up_proj.bias], mlp.down_proj.weight (row-parallel) [+ down_proj.bias, replicated];
 * model.norm.weight; lm_head.weight (vocab-parallel) unless tie_word_embeddings, in which case
 * the engine uses embed_tokens and there is no lm_head target at all.
 * Pieces name the HF checkpoint params of wsync_model_params(cfg, param_dtype).
 * options may be NULL (WSYNC_TP_OPTIONS_INIT).
 * WSYNC_ERR_CONFIG, naming the target and the numbers, when vLLM would refuse the model at this
 * size: H % T, K % T (K >= T) or T % K (K < T), I % T, Vp % T; and with block FP8, when a TP
 * partition of a separate weight (q, k, v, gate, up along their output rows; o, down along
 * their input columns) is not a multiple of the block size ("I = 18944 at T = 8 gives 2368 rows
 * per rank"), which keeps every scale block inside one weight of one rank. (vLLM's own check
 * skips the last part of a merged weight at T = 1 or with replicated kv heads, and row-parallel
 * inputs at T = 1; wsync asks the same of every T, so no block ever straddles q and k, or gate
 * and up, and quantizing before or after slicing gives the same bits.)
 * *targets (names and pieces included) is owned by the caller: wsync_layout_targets_free.
 * Thread-safe. */
wsync_status_t wsync_layout_tp_targets(const wsync_model_config_t *cfg, int tp_rank, int tp_size,
                                       const wsync_tp_options_t *options,
                                       wsync_target_t **targets, size_t *ntargets);

/* Free what wsync_layout_tp_targets returned (each target as wsync_layout_target_free, then the
 * array). NULL is a no-op. */
void wsync_layout_targets_free(wsync_target_t *targets, size_t ntargets);

#ifdef __cplusplus
}
#endif

#endif
