/*
 * Layout builders (part of the public API; included by wsync.h).
 *
 * Three layers, each usable alone:
 *  1. Model config: a HF `config.json` of the Llama, Qwen2, Qwen3, Qwen3-MoE or DeepSeek-V2/V3
 *     family read into a plain struct, and the list of checkpoint params (names, global shapes)
 *     it implies.
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
    WSYNC_MODEL_QWEN3_MOE = 4,     /* Qwen3MoeForCausalLM: Qwen3 attention, routed experts */
    WSYNC_MODEL_DEEPSEEK_V2 = 5,   /* DeepseekV2ForCausalLM: MLA, routed + shared experts */
    WSYNC_MODEL_DEEPSEEK_V3 = 6,   /* DeepseekV3ForCausalLM (also Kimi-K2): as V2, sigmoid router */
} wsync_model_type_t;

/* Most entries of qwen3_moe's `mlp_only_layers` a config may list. */
#define WSYNC_MODEL_MAX_MLP_ONLY 256

/* How a MoE router turns its logits into expert scores (DeepSeek `scoring_func`). */
typedef enum {
    WSYNC_ROUTER_SOFTMAX = 0,      /* qwen3_moe, deepseek_v2 */
    WSYNC_ROUTER_SIGMOID = 1,      /* deepseek_v3 */
} wsync_router_score_t;

/* How the top-k experts are picked from the scores (DeepSeek `topk_method`). */
typedef enum {
    WSYNC_TOPK_GREEDY = 0,         /* plain top-k (qwen3_moe; deepseek_v2 "greedy") */
    WSYNC_TOPK_GROUP_LIMITED = 1,  /* deepseek_v2 "group_limited_greedy": groups by max score */
    WSYNC_TOPK_NOAUX_TC = 2,       /* deepseek_v3 "noaux_tc": scores + e_score_correction_bias,
                                      groups by the sum of their top-2, weights without the bias */
} wsync_topk_method_t;

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

    /* Mixture of experts (qwen3_moe, deepseek_v2/v3); num_experts 0 for a dense model. Which
     * layers are MoE: wsync_model_layer_is_moe. A dense layer of a MoE model uses
     * intermediate_size. */
    int64_t num_experts;              /* E: qwen3_moe num_experts, deepseek n_routed_experts */
    int64_t num_experts_per_tok;      /* top-k */
    int64_t moe_intermediate_size;    /* I of one routed (and one shared) expert */
    int norm_topk_prob;               /* renormalise the top-k weights to sum 1 */
    int64_t decoder_sparse_step;      /* qwen3_moe: layer l is MoE when (l + 1) % step == 0 */
    int nmlp_only_layers;             /* qwen3_moe: layers listed in mlp_only_layers are dense */
    int32_t mlp_only_layers[WSYNC_MODEL_MAX_MLP_ONLY];
    int64_t n_shared_experts;         /* deepseek: a shared dense MLP of width n * moe_I; 0 none */
    int64_t first_k_dense_replace;    /* deepseek: layers < k are dense */
    int64_t moe_layer_freq;           /* deepseek: layer l >= k is MoE when l % freq == 0 */
    int64_t n_group, topk_group;      /* deepseek: experts in n_group groups, topk_group kept */
    double routed_scaling_factor;     /* deepseek: routed output scaled by this */
    wsync_router_score_t scoring_func;
    wsync_topk_method_t topk_method;
    int router_bias;                  /* mlp.gate.e_score_correction_bias [E] f32 exists */

    /* Multi-head latent attention (deepseek); kv_lora_rank 0 for GQA models. With MLA,
     * head_dim is qk_nope_head_dim + qk_rope_head_dim and num_key_value_heads is H. */
    int64_t q_lora_rank;              /* 0: no low-rank q (q_proj [H * (nope + rope), Hd]) */
    int64_t kv_lora_rank;
    int64_t qk_nope_head_dim;
    int64_t qk_rope_head_dim;
    int64_t v_head_dim;
    int rope_interleave;              /* rope on interleaved pairs (HF rope_interleave, default 1) */
} wsync_model_config_t;

/* 1 when layer `layer` of the model has routed experts (a FusedMoE MLP), 0 when its MLP is
 * dense (always 0 for dense families and layers outside [0, L)). qwen3_moe
 * (Qwen3MoeDecoderLayer): layer not in mlp_only_layers and (layer + 1) % decoder_sparse_step
 * == 0. deepseek_v3 (DeepseekV3DecoderLayer): layer >= first_k_dense_replace. deepseek_v2: also
 * layer % moe_layer_freq == 0, as vLLM and DeepSeek's code have it (transformers' V2 ignores
 * moe_layer_freq; published configs have 1). Thread-safe. */
int wsync_model_layer_is_moe(const wsync_model_config_t *cfg, int64_t layer);

/* "llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3"; "?" otherwise. Static
 * storage; thread-safe. */
const char *wsync_model_type_name(wsync_model_type_t type);

/* Parse a HF config.json held in memory (len bytes, need not be NUL-terminated).
 * The family comes from `model_type` (llama, qwen2, qwen3, qwen3_moe, deepseek_v2, deepseek_v3;
 * kimi_k2 = deepseek_v3, as Kimi-K2 publishes it), else from `architectures[0]`
 * (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM,
 * DeepseekV2ForCausalLM, DeepseekV3ForCausalLM). Keys wsync has no use for (rope_scaling's yarn
 * parameters, quantization_config, auto_map, num_nextn_predict_layers, ...) are ignored.
 * Required: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size
 * (HF would fill 7B-sized defaults; a checkpoint's config always states them, and guessing would
 * describe some other model); for deepseek_v2 also num_experts_per_tok (HF's None cannot route).
 * Absent or null optional fields take transformers' defaults for the family
 * (configuration_{llama,qwen2,qwen3}.py, v4.5x and v5; configuration_qwen3_moe.py,
 * configuration_deepseek_v2.py, configuration_deepseek_v3.py, v5):
 *   num_key_value_heads  llama: H;  qwen2, qwen3: 32 (the dataclass default, not H);
 *                        qwen3_moe: 4;  deepseek: always H (MLA; the key is ignored)
 *   head_dim             llama, qwen2, qwen3_moe: Hd / H;  qwen3: 128;
 *                        deepseek: always qk_nope_head_dim + qk_rope_head_dim (the dims of a q or
 *                        k head; transformers' own head_dim = qk_rope_head_dim is ignored)
 *   tie_word_embeddings  false
 *   attention_bias       llama, qwen3, qwen3_moe: false (applies to q, k, v and o);
 *                        qwen2: q, k, v always have biases and o never (fixed in Qwen2Attention);
 *                        deepseek: false, and true is refused (vLLM's MLA has no biases)
 *   mlp_bias             llama: false; deepseek_v2: false, true refused; others: none
 *   qk_norm              qwen3, qwen3_moe: always; others never
 *   rms_norm_eps         1e-6 for all
 *   rope_theta           rope_scaling.rope_theta, else rope_parameters.rope_theta, else the
 *                        top-level rope_theta, else 10000 for all
 *                        (RotaryEmbeddingConfigMixin.default_theta)
 *   max_position_embeddings  llama, deepseek_v2: 2048; deepseek_v3: 4096; qwen*: 32768
 * qwen3_moe (Qwen3MoeConfig):
 *   num_experts          128 (also read as num_local_experts, the name transformers 5 saves;
 *                        both present and different is an error)
 *   num_experts_per_tok 8, moe_intermediate_size 768, decoder_sparse_step 1,
 *   norm_topk_prob false, mlp_only_layers [] (entries must be layers in [0, L), at most
 *   WSYNC_MODEL_MAX_MLP_ONLY); scoring softmax, top-k greedy, no router bias.
 * deepseek_v2 / deepseek_v3 (DeepseekV2Config / DeepseekV3Config):
 *   q_lora_rank          1536 / 1536 (null: no low-rank q, stored 0, q_proj instead)
 *   kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64 (must be even), v_head_dim 128
 *   n_routed_experts     64 / 256 (-> num_experts; null, a dense DeepSeek, is refused)
 *   n_shared_experts     2 / 1 (null: none, stored 0)
 *   moe_intermediate_size  1407 / 2048
 *   num_experts_per_tok  required / 8
 *   first_k_dense_replace  0 / 3
 *   moe_layer_freq       1 / 1 (not in transformers' classes; DeepSeek's and vLLM's code use it;
 *                        deepseek_v3 refuses any other value, transformers ignoring it there)
 *   n_group, topk_group  1, 1 (V2's None: a single group) / 8, 4
 *   routed_scaling_factor  1.0 / 2.5
 *   norm_topk_prob       false / true
 *   scoring_func         "softmax" / "sigmoid" (also "softmax" or "sigmoid" when given)
 *   topk_method          "greedy" / "noaux_tc" ("greedy", "group_limited_greedy", "noaux_tc")
 *   rope_interleave      V2: always 1 (its rope is complex-pair); V3: true
 *   router_bias          V3: always 1 (transformers 5's DeepseekV3TopkRouter always holds
 *                        e_score_correction_bias); V2: 1 when topk_method is noaux_tc
 * Returns WSYNC_ERR_CONFIG for malformed JSON (line and column), an unknown family, a missing
 * required field, a wrong type (a string where a number belongs, a fraction where an integer
 * does), a size <= 0, or a contradiction (H % K, Hd % H when head_dim is absent, top-k > E,
 * n_group not dividing E, topk_group > n_group, top-k more than topk_group groups hold,
 * noaux_tc with one expert per group, an odd qk_rope_head_dim, mlp_only_layers out of range,
 * more than 65536 experts);
 * the message names the field and the value. Thread-safe. */
wsync_status_t wsync_model_config_parse(const char *json, size_t len, wsync_model_config_t *cfg);

/* Read and parse a config.json file. WSYNC_ERR_IO if the file cannot be read (the message names
 * the path), otherwise as wsync_model_config_parse (messages prefixed with the path). */
wsync_status_t wsync_model_config_load(const char *path, wsync_model_config_t *cfg);

/* Check a config's internal consistency (sizes >= 1, H % K == 0, eps and theta > 0, sizes small
 * enough that every shape fits in int64; for MoE/MLA families the checks the parser makes, plus
 * head_dim == qk_nope + qk_rope and K == H for MLA; dense families must have num_experts and
 * kv_lora_rank 0). WSYNC_ERR_CONFIG naming the field otherwise. */
wsync_status_t wsync_model_config_check(const wsync_model_config_t *cfg);

/* The checkpoint params of the model, as HF's save_pretrained writes them (names, shapes), in
 * this order: model.embed_tokens.weight [V, Hd]; for each layer i, model.layers.{i}.
 *   input_layernorm.weight [Hd],
 *   attention, GQA: self_attn.{q,k,v}_proj.weight [H*D | K*D | K*D, Hd] (+ .bias when
 *     attention_bias), self_attn.o_proj.weight [Hd, H*D] (+ bias), self_attn.{q,k}_norm.weight
 *     [D] (qk_norm);
 *   attention, MLA (deepseek; D = nope + rope): self_attn.q_a_proj.weight [q_lora, Hd],
 *     self_attn.q_a_layernorm.weight [q_lora], self_attn.q_b_proj.weight [H*D, q_lora] (without
 *     q_lora: self_attn.q_proj.weight [H*D, Hd] instead of those three),
 *     self_attn.kv_a_proj_with_mqa.weight [kv_lora + rope, Hd],
 *     self_attn.kv_a_layernorm.weight [kv_lora], self_attn.kv_b_proj.weight
 *     [H*(nope + v_head_dim), kv_lora], self_attn.o_proj.weight [Hd, H*v_head_dim];
 *   post_attention_layernorm.weight [Hd],
 *   a dense layer's MLP: mlp.{gate,up}_proj.weight [I, Hd], mlp.down_proj.weight [Hd, I]
 *     (+ biases when mlp_bias);
 *   a MoE layer's (wsync_model_layer_is_moe): mlp.gate.weight [E, Hd],
 *     mlp.gate.e_score_correction_bias [E] (router_bias), then expert by expert
 *     mlp.experts.{e}.gate_proj.weight [Im, Hd], .up_proj.weight [Im, Hd],
 *     .down_proj.weight [Hd, Im] (Im = moe_intermediate_size), then (deepseek, n_shared > 0)
 *     mlp.shared_experts.{gate,up}_proj.weight [S*Im, Hd], .down_proj.weight [Hd, S*Im];
 * model.norm.weight [Hd]; lm_head.weight [V, Hd] unless tie_word_embeddings.
 * Every param gets `dtype`; 0 means cfg->dtype, or bf16 if the config has none. (HF saves
 * e_score_correction_bias in the model's dtype, as the testdata models show; DeepSeek's own FP8
 * checkpoints hold it in f32: pass such a param's dtype on the shard, the library converts.)
 * Linear in the number of params (Kimi-K2: ~70,000).
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

/* Expert-parallel trainer shards (whole experts per rank, as Megatron's EP holds them) of every
 * param of the model (wsync_model_params order, `dtype` as there) for rank `rank` of `nranks`:
 * routed expert e's params (gate_proj, up_proj, down_proj) are held whole by the rank that owns
 * e under linear placement (E % nranks == 0 required, as Megatron asserts; WSYNC_ERR_CONFIG
 * otherwise) and are empty boxes elsewhere; every other param is split along dense_dim as by
 * wsync_layout_shards (0: FSDP dim-0, WSYNC_REPLICATE: whole on every rank). A dense model gets
 * what wsync_layout_shards gives. Ownership as wsync_layout_shards. Thread-safe. */
wsync_status_t wsync_layout_ep_shards(const wsync_model_config_t *cfg, wsync_dtype_t dtype,
                                      int rank, int nranks, int dense_dim,
                                      wsync_shard_t **shards, size_t *nshards);

/* The model's params as HF transformers 5.x holds them in memory (a trainer's state_dict()):
 * as wsync_model_params, except that each MoE layer's per-expert params are replaced by two
 * fused tensors, "model.layers.{L}.mlp.experts.gate_up_proj" [E, 2 * I, Hd] (expert e's gate
 * rows, then its up rows) and "model.layers.{L}.mlp.experts.down_proj" [E, Hd, I] (no .weight
 * suffix). Such params are for sender layouts only: shard them (wsync_layout_shard_box, FSDP
 * dim-0 or any dim), then give each shard to wsync_layout_unfuse_experts. Ownership as
 * wsync_model_params. Thread-safe. */
wsync_status_t wsync_model_fused_params(const wsync_model_config_t *cfg, wsync_dtype_t dtype,
                                        wsync_param_t **params, size_t *n);

/* A shard of a fused expert tensor (param named "...mlp.experts.gate_up_proj" [E, 2I, Hd] or
 * "...mlp.experts.down_proj" [E, Hd, I], any box, dense row-major at shard->data) as the shards
 * of the checkpoint's per-expert params it holds ("...mlp.experts.{e}.gate_proj.weight" and so
 * on), with data pointing into shard->data (a box of a dense box is dense whichever dims it
 * cuts), mem and device as the shard's; experts the box misses get no shard (an empty box gives
 * none at all), and shard->data NULL gives NULL pointers (a layout not yet given memory). Order:
 * by expert, gate_proj before up_proj. Any other param: one shard, a copy of *shard. The names
 * are owned by the array: wsync_layout_shards_free.
 * WSYNC_ERR_INVALID for a fused name whose shape is not [E, 2I, Hd] / [E, Hd, I] (3-D; 2I even)
 * or whose box exceeds it. Thread-safe. */
wsync_status_t wsync_layout_unfuse_experts(const wsync_shard_t *shard, wsync_shard_t **shards,
                                           size_t *nshards);

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

/* Number of fp32 scales an FP8 target needs, by quant.scheme, for the target as the matrix
 * [rows = prod(shape[0..ndim-2]), cols = shape[ndim-1]] (a 1-D target is one row; a 3-D
 * [E, r, c] target has E * r rows, as the receiver quantizes it): TENSOR 1; CHANNEL rows; BLOCK
 * ceil(rows/block_rows) * ceil(cols/block_cols) (0 block sizes mean 128); NONE 0. Thread-safe. */
size_t wsync_target_scale_count(const wsync_target_t *target);

/* ------------------------------------------------------------------------------------------ */
/* Receiver layouts: mixture-of-experts (vLLM FusedMoE; rules in docs/moe_layouts.md)            */
/* ------------------------------------------------------------------------------------------ */

/* Which experts an expert-parallel rank holds (vLLM determine_expert_map). */
typedef enum {
    WSYNC_EXPERT_LINEAR = 0,       /* a contiguous range; the first E % EP ranks one more each:
                                      start = r * floor(E / EP) + min(r, E % EP) */
    WSYNC_EXPERT_ROUND_ROBIN = 1,  /* experts r, r + EP, r + 2 EP, ... */
} wsync_expert_placement_t;

/* The global indices of the experts rank ep_rank of ep_size holds, in local order, into
 * experts[] (room for ceil(num_experts / ep_size)), and their count into *nlocal (0 when
 * ep_size > num_experts leaves the rank none). WSYNC_ERR_INVALID for a rank outside
 * [0, ep_size), num_experts < 1 or an unknown placement. Thread-safe. */
wsync_status_t wsync_layout_local_experts(int64_t num_experts, int ep_rank, int ep_size,
                                          wsync_expert_placement_t placement, int64_t *experts,
                                          int64_t *nlocal);

/* FusedMoE `w13_weight` of nlocal experts: gate[j] and up[j] are the [I, Hd] params of local
 * expert j (gate_proj, up_proj), all of one dtype and shape. vLLM's parameter is
 * [nlocal, 2 * I_p, Hd] with I_p = I / tp_size; the target is the same bytes seen as one matrix,
 * shape [nlocal * 2 * I_p, Hd] (pieces keep their params' two dims, as every piece must; view the
 * buffer as [nlocal, 2 * I_p, Hd]). Expert j's rows [j * 2 * I_p, j * 2 * I_p + I_p) are gate rows
 * [r * I_p, (r + 1) * I_p), the next I_p rows the same rows of up; 2 * nlocal pieces, gate then up
 * for each j. An FP8 target's scales are those of this matrix: with block rows dividing I_p they
 * are vLLM's w13_weight_scale_inv [nlocal, 2 * I_p / bn, ceil(Hd / bk)], in the same order.
 * tp_size 1 with whole experts is expert parallelism. WSYNC_ERR_CONFIG when I % tp_size != 0;
 * WSYNC_ERR_INVALID for NULLs, nlocal outside [1, 32768] (a target's pieces) or a param that
 * is not 2-D or differs from the others.
 * Named `name`. Free with wsync_layout_target_free. Thread-safe. */
wsync_status_t wsync_layout_moe_w13(const char *name, const wsync_param_t *gate,
                                    const wsync_param_t *up, int64_t nlocal, int tp_rank,
                                    int tp_size, wsync_target_t *target);

/* FusedMoE `w2_weight` of nlocal experts: down[j] is the [Hd, I] down_proj of local expert j.
 * vLLM's parameter is [nlocal, Hd, I_p]; the target is its matrix [nlocal * Hd, I_p]: rows
 * [j * Hd, (j + 1) * Hd) are columns [r * I_p, (r + 1) * I_p) of every row of down[j]. FP8 scales
 * as for w13: with Hd a multiple of the block rows, vLLM's [nlocal, Hd / bn, ceil(I_p / bk)].
 * Errors as wsync_layout_moe_w13. Named `name`. */
wsync_status_t wsync_layout_moe_w2(const char *name, const wsync_param_t *down, int64_t nlocal,
                                   int tp_rank, int tp_size, wsync_target_t *target);

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
    /* Expert parallelism of MoE layers (vLLM enable_expert_parallel). ep_size 0 or 1: off, every
     * rank holds every expert, split inside by TP (I_p = I / T). ep_size > 1: whole experts
     * spread over ep_size ranks (vLLM: EP = TP x DP, MoE-TP 1), this rank being ep_rank
     * (vLLM: dp_rank * T + tp_rank); attention stays split by tp_rank of tp_size. */
    int ep_size;
    int ep_rank;
    wsync_expert_placement_t expert_placement;
} wsync_tp_options_t;

/* dtype 0 means "unset" (casts keep the initializer valid C++) */
#define WSYNC_TP_OPTIONS_INIT                                                                 \
    {(wsync_dtype_t)0, (wsync_dtype_t)0, (wsync_dtype_t)0,                                    \
     {WSYNC_QUANT_NONE, 0, 0, 0.0f, 0, 0, NULL, WSYNC_MEM_HOST}, 0, 0, 0,                     \
     WSYNC_EXPERT_LINEAR}

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
 *
 * Mixture-of-experts families (qwen3_moe, deepseek_v2/v3): a MoE layer's MLP targets are, in
 * this order, mlp.gate.weight [E, Hd] (router, replicated, never quantized),
 * mlp.gate.e_score_correction_bias [E] (router_bias; replicated, f32 whatever options->dtype, as
 * vLLM holds it), mlp.experts.w13_weight and mlp.experts.w2_weight (FusedMoE, see
 * wsync_layout_moe_w13/w2: [E_l * 2 * I_p, Hd] and [E_l * Hd, I_p] matrices of vLLM's 3-D
 * parameters; without options->ep_size every rank holds all E experts, I_p = I / T; with
 * ep_size > 1 the E_l experts wsync_layout_local_experts gives ep_rank, whole, I_p = I), then for
 * deepseek with n_shared_experts > 0 mlp.shared_experts.gate_up_proj.weight (merged, width
 * n_shared * moe_I) and mlp.shared_experts.down_proj.weight (row-parallel). A dense layer of a
 * MoE model (wsync_model_layer_is_moe 0) is as above. DeepSeek's MLA attention replaces
 * qkv_proj..k_norm by, in order: self_attn.fused_qkv_a_proj.weight [q_lora + kv_lora + rope, Hd]
 * = [q_a_proj; kv_a_proj_with_mqa] replicated (without q_lora: self_attn.q_proj.weight
 * column-parallel by heads, then self_attn.kv_a_proj_with_mqa.weight replicated),
 * self_attn.q_a_layernorm.weight (with q_lora), self_attn.q_b_proj.weight (with q_lora;
 * column-parallel by heads), self_attn.kv_a_layernorm.weight, self_attn.kv_b_proj.weight
 * (column-parallel by heads), self_attn.o_proj.weight (row-parallel, [Hd, H * v_head_dim / T]).
 * With quant, w13/w2, the shared experts, fused_qkv_a_proj, q_proj, kv_a_proj_with_mqa (a
 * ReplicatedLinear that vLLM quantizes), q_b_proj, kv_b_proj and o_proj are quantized, each
 * target's scales being those of its matrix. The router and its bias stay unquantized.
 * Expert parallelism (options->ep_size > 1) follows vLLM's enable_expert_parallel: ep_size must be
 * a multiple of tp_size and ep_rank % tp_size == tp_rank (ep_rank = dp_rank * T + tp_rank;
 * WSYNC_ERR_INVALID otherwise, and for a dense model). WSYNC_ERR_CONFIG, beyond the dense checks:
 * MLA H % T; a dense layer's I % T; without EP moe_I % T; shared width % T; ep_size > E (a rank
 * would hold no expert); with block FP8: I_p % block rows and % block cols (vLLM's
 * Fp8MoEMethod.create_weights, asked of every T), Hd % block rows (a w2 block must not straddle
 * two experts of the matrix), q_lora_rank % block rows (only the parts of fused_qkv_a_proj before
 * the last need whole blocks: vLLM serves DeepSeek-V3's FP8 [q_a; kv_a] whose kv_a is 576 rows),
 * per-rank rows of q_proj / q_b_proj / kv_b_proj and o_proj's per-rank columns, shared experts
 * as a dense MLP. Rules and vLLM sources: docs/moe_layouts.md.
 * *targets (names and pieces included) is owned by the caller: wsync_layout_targets_free.
 * Thread-safe. */
wsync_status_t wsync_layout_tp_targets(const wsync_model_config_t *cfg, int tp_rank, int tp_size,
                                       const wsync_tp_options_t *options,
                                       wsync_target_t **targets, size_t *ntargets);

/* Free what wsync_layout_tp_targets returned (each target as wsync_layout_target_free, then the
 * array). NULL is a no-op. */
void wsync_layout_targets_free(wsync_target_t *targets, size_t ntargets);

/* ------------------------------------------------------------------------------------------ */
/* Sender layouts: Megatron-Core tensor and expert parallelism (docs/megatron_layouts.md)         */
/* ------------------------------------------------------------------------------------------ */

/* The tensors one rank of a Megatron-Core GPTModel (Transformer Engine layer spec, pipeline size
 * 1) holds, for a dense Llama / Qwen2 / Qwen3 or a Qwen3-MoE model: tensor-parallel rank tp_rank of
 * tp_size, expert-parallel rank ep_rank of ep_size, expert-tensor-parallel rank etp_rank of
 * etp_size (sizes 0 mean 1). Each tensor is a wsync_target_t used as a description: name as
 * Megatron-Core's state_dict has it, dtype, local shape, and pieces saying which box of which HF
 * checkpoint param (wsync_model_params(cfg, dtype) names and shapes) lies where in it; data NULL.
 * Rows no piece covers are vocab padding. Give a tensor its memory with
 * wsync_layout_tensor_shards. In order (G = K query groups, Gr = G/T, Im moe_intermediate_size):
 *   embedding.word_embeddings.weight [Vp/T, Hd]: rows [r*Vp/T, ...) below V of embed_tokens,
 *     Vp = ceil(V / (vocab_pad * T)) * vocab_pad * T (vocab_pad 0: 128, Megatron's
 *     make_vocab_size_divisible_by default; 1: only T's multiple);
 *   per layer l, "decoder.layers.{l}." +
 *     self_attention.linear_qkv.layer_norm_weight [Hd] = input_layernorm (replicated);
 *     self_attention.linear_qkv.weight [Gr*(H/G + 2)*D, Hd]: for each of the rank's groups
 *       g = r*Gr + j in turn, q_proj rows [g*(H/G)*D, +(H/G)*D), k_proj rows [g*D, +D), v_proj
 *       rows [g*D, +D); .bias alike from the q/k/v biases (attention_bias);
 *     self_attention.q_layernorm.weight, k_layernorm.weight [D] (qk_norm; replicated);
 *     self_attention.linear_proj.weight [Hd, H*D/T]: o_proj columns [r*H*D/T, ...)
 *       (+ linear_proj.bias [Hd], replicated, with o_proj_bias);
 *     a dense layer: mlp.linear_fc1.layer_norm_weight [Hd] = post_attention_layernorm;
 *       mlp.linear_fc1.weight [2*I/T, Hd] = [gate_proj rows r*I/T..; up_proj same rows]
 *       (+ .bias with mlp_bias); mlp.linear_fc2.weight [Hd, I/T] = down_proj columns r*I/T..
 *       (+ linear_fc2.bias, replicated);
 *     a MoE layer (wsync_model_layer_is_moe): pre_mlp_layernorm.weight [Hd] =
 *       post_attention_layernorm; mlp.router.weight [E, Hd] = mlp.gate.weight (replicated);
 *       for each local expert i < E/EP (TEGroupedMLP; global expert e = ep_rank*E/EP + i):
 *       mlp.experts.linear_fc1.weight{i} [2*Im/ETP, Hd] = [gate rows etp_rank*Im/ETP..; up same
 *       rows] of expert e; then for each i mlp.experts.linear_fc2.weight{i} [Hd, Im/ETP] =
 *       down_proj columns etp_rank*Im/ETP.. of expert e;
 *   decoder.final_layernorm.weight [Hd] = model.norm; output_layer.weight [Vp/T, Hd] as the
 *     embedding, from lm_head (absent when tie_word_embeddings).
 * WSYNC_ERR_CONFIG naming the numbers: H % T, G % T (Megatron never replicates query groups),
 * I % T (with a dense layer), E % EP, Im % ETP (with a MoE layer). WSYNC_ERR_UNSUPPORTED for
 * DeepSeek-V2/V3 (MLA). WSYNC_ERR_INVALID for NULLs, a rank outside its size, ep/etp sizes > 1
 * for a dense model, vocab_pad < 0. *tensors is owned by the caller: wsync_layout_targets_free.
 * Thread-safe. */
wsync_status_t wsync_layout_megatron_tensors(const wsync_model_config_t *cfg, wsync_dtype_t dtype,
                                             int tp_rank, int tp_size, int ep_rank, int ep_size,
                                             int etp_rank, int etp_size, int64_t vocab_pad,
                                             wsync_target_t **tensors, size_t *ntensors);

/* The shards a sender adds for a tensor described by pieces (a Megatron tensor of
 * wsync_layout_megatron_tensors, or any target-like description) whose dense row-major memory
 * [tensor->shape] of tensor->dtype is at `data` (mem, device): one shard per piece, param and
 * box the piece's, data = data + the byte offset of the piece's dst_start (NULL stays NULL).
 * Each piece must be contiguous in the tensor (whole trailing dims: whole rows of a matrix, or
 * the whole tensor), as every Megatron piece is; WSYNC_ERR_INVALID otherwise, or when a piece
 * leaves the tensor or differs from it in ndim or element size. A tensor without pieces gives
 * *nshards 0. *shards is owned by the caller: wsync_layout_shards_free. Thread-safe. */
wsync_status_t wsync_layout_tensor_shards(const wsync_target_t *tensor, const void *data,
                                          wsync_mem_t mem, int device, wsync_shard_t **shards,
                                          size_t *nshards);

#ifdef __cplusplus
}
#endif

#endif
