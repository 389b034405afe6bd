/* Prints, as one JSON object, what the C compiler makes of the public headers (wsync.h and those it includes): the size,
 * alignment and every field's offset and size of each public struct (nested fields as
 * "outer.inner"), the value of each enum constant and macro, and what the *_INIT initializers
 * hold. tests/python/test_abi.py compares it with python/wsync/_cdefs.py. */
#include <stddef.h>
#include <stdio.h>

#include "wsync/wsync.h"

static int first;

static void item(const char *key)
{
    printf("%s\"%s\": ", first ? "" : ", ", key);
    first = 0;
}

static void begin(const char *key)
{
    item(key);
    printf("{");
    first = 1;
}

static void end(void)
{
    printf("}");
    first = 0;
}

static void num(const char *key, long long v)
{
    item(key);
    printf("%lld", v);
}

static void real(const char *key, double v)
{
    item(key);
    printf("%.9g", v);
}

static void pair(const char *key, size_t a, size_t b)
{
    item(key);
    printf("[%zu, %zu]", a, b);
}

#define FIELD(T, f) pair(#f, offsetof(T, f), sizeof(((T *)0)->f))
#define STRUCT_BEGIN(T)                                                                       \
    do {                                                                                      \
        begin(#T);                                                                            \
        num("size", (long long)sizeof(T));                                                    \
        num("align", (long long)_Alignof(T));                                                 \
        begin("fields");                                                                      \
    } while (0)
#define STRUCT_END()                                                                          \
    do {                                                                                      \
        end();                                                                                \
        end();                                                                                \
    } while (0)

#define PARAM_FIELDS(T, p)                                                                    \
    FIELD(T, p.name);                                                                         \
    FIELD(T, p.dtype);                                                                        \
    FIELD(T, p.ndim);                                                                         \
    FIELD(T, p.shape)
#define BOX_FIELDS(T, b)                                                                      \
    FIELD(T, b.start);                                                                        \
    FIELD(T, b.len)
#define QUANT_FIELDS(T, q)                                                                    \
    FIELD(T, q.scheme);                                                                       \
    FIELD(T, q.block_rows);                                                                   \
    FIELD(T, q.block_cols);                                                                   \
    FIELD(T, q.eps);                                                                          \
    FIELD(T, q.ue8m0);                                                                        \
    FIELD(T, q.no_saturate);                                                                  \
    FIELD(T, q.scales);                                                                       \
    FIELD(T, q.scales_mem)

static void structs(void)
{
    begin("structs");

    STRUCT_BEGIN(wsync_param_t);
    FIELD(wsync_param_t, name);
    FIELD(wsync_param_t, dtype);
    FIELD(wsync_param_t, ndim);
    FIELD(wsync_param_t, shape);
    STRUCT_END();

    STRUCT_BEGIN(wsync_box_t);
    FIELD(wsync_box_t, start);
    FIELD(wsync_box_t, len);
    STRUCT_END();

    STRUCT_BEGIN(wsync_shard_t);
    FIELD(wsync_shard_t, param);
    PARAM_FIELDS(wsync_shard_t, param);
    FIELD(wsync_shard_t, box);
    BOX_FIELDS(wsync_shard_t, box);
    FIELD(wsync_shard_t, data);
    FIELD(wsync_shard_t, mem);
    FIELD(wsync_shard_t, device);
    STRUCT_END();

    STRUCT_BEGIN(wsync_piece_t);
    FIELD(wsync_piece_t, param);
    PARAM_FIELDS(wsync_piece_t, param);
    FIELD(wsync_piece_t, src);
    BOX_FIELDS(wsync_piece_t, src);
    FIELD(wsync_piece_t, dst_start);
    STRUCT_END();

    STRUCT_BEGIN(wsync_quant_t);
    FIELD(wsync_quant_t, scheme);
    FIELD(wsync_quant_t, block_rows);
    FIELD(wsync_quant_t, block_cols);
    FIELD(wsync_quant_t, eps);
    FIELD(wsync_quant_t, ue8m0);
    FIELD(wsync_quant_t, no_saturate);
    FIELD(wsync_quant_t, scales);
    FIELD(wsync_quant_t, scales_mem);
    STRUCT_END();

    STRUCT_BEGIN(wsync_target_t);
    FIELD(wsync_target_t, name);
    FIELD(wsync_target_t, dtype);
    FIELD(wsync_target_t, ndim);
    FIELD(wsync_target_t, shape);
    FIELD(wsync_target_t, data);
    FIELD(wsync_target_t, mem);
    FIELD(wsync_target_t, device);
    FIELD(wsync_target_t, pieces);
    FIELD(wsync_target_t, npieces);
    FIELD(wsync_target_t, quant);
    QUANT_FIELDS(wsync_target_t, quant);
    STRUCT_END();

    STRUCT_BEGIN(wsync_ctx_params_t);
    FIELD(wsync_ctx_params_t, log_level);
    FIELD(wsync_ctx_params_t, verify);
    STRUCT_END();

    STRUCT_BEGIN(wsync_component_info_t);
    FIELD(wsync_component_info_t, name);
    FIELD(wsync_component_info_t, compiled);
    FIELD(wsync_component_info_t, available);
    FIELD(wsync_component_info_t, reason);
    FIELD(wsync_component_info_t, caps);
    STRUCT_END();

    STRUCT_BEGIN(wsync_sender_params_t);
    FIELD(wsync_sender_params_t, coordinator);
    FIELD(wsync_sender_params_t, rank);
    FIELD(wsync_sender_params_t, nranks);
    FIELD(wsync_sender_params_t, nreceivers);
    FIELD(wsync_sender_params_t, scheme);
    FIELD(wsync_sender_params_t, bucket_bytes);
    FIELD(wsync_sender_params_t, timeout_ms);
    FIELD(wsync_sender_params_t, heartbeat_ms);
    FIELD(wsync_sender_params_t, snapshot);
    FIELD(wsync_sender_params_t, keep_versions);
    FIELD(wsync_sender_params_t, copy_shards);
    FIELD(wsync_sender_params_t, delta);
    FIELD(wsync_sender_params_t, delta_baseline);
    FIELD(wsync_sender_params_t, delta_cutoff);
    FIELD(wsync_sender_params_t, fp8_wire);
    STRUCT_END();

    STRUCT_BEGIN(wsync_push_stats_t);
    FIELD(wsync_push_stats_t, version);
    FIELD(wsync_push_stats_t, bytes_packed);
    FIELD(wsync_push_stats_t, bytes_delivered);
    FIELD(wsync_push_stats_t, buckets);
    FIELD(wsync_push_stats_t, seconds);
    FIELD(wsync_push_stats_t, bytes_wire);
    FIELD(wsync_push_stats_t, bytes_encoded);
    FIELD(wsync_push_stats_t, bytes_plain);
    FIELD(wsync_push_stats_t, base_version);
    STRUCT_END();

    STRUCT_BEGIN(wsync_receiver_params_t);
    FIELD(wsync_receiver_params_t, coordinator);
    FIELD(wsync_receiver_params_t, rank);
    FIELD(wsync_receiver_params_t, nreceivers);
    FIELD(wsync_receiver_params_t, timeout_ms);
    FIELD(wsync_receiver_params_t, heartbeat_ms);
    FIELD(wsync_receiver_params_t, progress);
    FIELD(wsync_receiver_params_t, progress_arg);
    FIELD(wsync_receiver_params_t, on_version);
    FIELD(wsync_receiver_params_t, on_version_arg);
    FIELD(wsync_receiver_params_t, delta);
    STRUCT_END();

    STRUCT_BEGIN(wsync_model_config_t);
    FIELD(wsync_model_config_t, model_type);
    FIELD(wsync_model_config_t, hidden_size);
    FIELD(wsync_model_config_t, num_hidden_layers);
    FIELD(wsync_model_config_t, num_attention_heads);
    FIELD(wsync_model_config_t, num_key_value_heads);
    FIELD(wsync_model_config_t, head_dim);
    FIELD(wsync_model_config_t, intermediate_size);
    FIELD(wsync_model_config_t, vocab_size);
    FIELD(wsync_model_config_t, max_position_embeddings);
    FIELD(wsync_model_config_t, tie_word_embeddings);
    FIELD(wsync_model_config_t, attention_bias);
    FIELD(wsync_model_config_t, o_proj_bias);
    FIELD(wsync_model_config_t, mlp_bias);
    FIELD(wsync_model_config_t, qk_norm);
    FIELD(wsync_model_config_t, rms_norm_eps);
    FIELD(wsync_model_config_t, rope_theta);
    FIELD(wsync_model_config_t, dtype);
    FIELD(wsync_model_config_t, num_experts);
    FIELD(wsync_model_config_t, num_experts_per_tok);
    FIELD(wsync_model_config_t, moe_intermediate_size);
    FIELD(wsync_model_config_t, norm_topk_prob);
    FIELD(wsync_model_config_t, decoder_sparse_step);
    FIELD(wsync_model_config_t, nmlp_only_layers);
    FIELD(wsync_model_config_t, mlp_only_layers);
    FIELD(wsync_model_config_t, n_shared_experts);
    FIELD(wsync_model_config_t, first_k_dense_replace);
    FIELD(wsync_model_config_t, moe_layer_freq);
    FIELD(wsync_model_config_t, n_group);
    FIELD(wsync_model_config_t, topk_group);
    FIELD(wsync_model_config_t, routed_scaling_factor);
    FIELD(wsync_model_config_t, scoring_func);
    FIELD(wsync_model_config_t, topk_method);
    FIELD(wsync_model_config_t, router_bias);
    FIELD(wsync_model_config_t, q_lora_rank);
    FIELD(wsync_model_config_t, kv_lora_rank);
    FIELD(wsync_model_config_t, qk_nope_head_dim);
    FIELD(wsync_model_config_t, qk_rope_head_dim);
    FIELD(wsync_model_config_t, v_head_dim);
    FIELD(wsync_model_config_t, rope_interleave);
    STRUCT_END();

    STRUCT_BEGIN(wsync_tp_options_t);
    FIELD(wsync_tp_options_t, param_dtype);
    FIELD(wsync_tp_options_t, dtype);
    FIELD(wsync_tp_options_t, quant_dtype);
    FIELD(wsync_tp_options_t, quant);
    QUANT_FIELDS(wsync_tp_options_t, quant);
    FIELD(wsync_tp_options_t, vocab_pad);
    FIELD(wsync_tp_options_t, ep_size);
    FIELD(wsync_tp_options_t, ep_rank);
    FIELD(wsync_tp_options_t, expert_placement);
    STRUCT_END();

    STRUCT_BEGIN(wsync_plan_summary_t);
    FIELD(wsync_plan_summary_t, nsenders);
    FIELD(wsync_plan_summary_t, nreceivers);
    FIELD(wsync_plan_summary_t, bucket_bytes);
    FIELD(wsync_plan_summary_t, pair_bytes);
    FIELD(wsync_plan_summary_t, bytes_per_receiver);
    FIELD(wsync_plan_summary_t, bytes_landed_per_receiver);
    FIELD(wsync_plan_summary_t, bytes_per_sender);
    FIELD(wsync_plan_summary_t, staged_bytes_per_sender);
    FIELD(wsync_plan_summary_t, buckets_per_sender);
    FIELD(wsync_plan_summary_t, total_bytes);
    FIELD(wsync_plan_summary_t, total_landed_bytes);
    FIELD(wsync_plan_summary_t, total_staged_bytes);
    FIELD(wsync_plan_summary_t, nchunks);
    FIELD(wsync_plan_summary_t, nsegments);
    FIELD(wsync_plan_summary_t, fingerprint);
    FIELD(wsync_plan_summary_t, wire_bytes);
    FIELD(wsync_plan_summary_t, wire_checked);
    FIELD(wsync_plan_summary_t, wire_check_seconds);
    FIELD(wsync_plan_summary_t, fp8_wire);
    FIELD(wsync_plan_summary_t, fp8_wire_bytes);
    FIELD(wsync_plan_summary_t, form_bytes);
    FIELD(wsync_plan_summary_t, form_param_bytes);
    FIELD(wsync_plan_summary_t, total_param_bytes);
    FIELD(wsync_plan_summary_t, ntargets);
    FIELD(wsync_plan_summary_t, target_form);
    FIELD(wsync_plan_summary_t, target_bytes);
    FIELD(wsync_plan_summary_t, target_param_bytes);
    STRUCT_END();

    end();
}

#define ENUM(name) num(#name, (long long)(name))

static void enums(void)
{
    begin("enums");
    begin("wsync_status_t");
#define X_(name, code, text) num("WSYNC_" #name, (long long)WSYNC_##name);
    WSYNC_STATUS_MAP(X_)
#undef X_
    end();
    begin("wsync_dtype_t");
    ENUM(WSYNC_DTYPE_BF16);
    ENUM(WSYNC_DTYPE_F16);
    ENUM(WSYNC_DTYPE_F32);
    ENUM(WSYNC_DTYPE_F8E4M3FN);
    ENUM(WSYNC_DTYPE_F8E5M2);
    ENUM(WSYNC_DTYPE_U8);
    end();
    begin("wsync_mem_t");
    ENUM(WSYNC_MEM_HOST);
    ENUM(WSYNC_MEM_CUDA);
    end();
    begin("wsync_quant_scheme_t");
    ENUM(WSYNC_QUANT_NONE);
    ENUM(WSYNC_QUANT_TENSOR);
    ENUM(WSYNC_QUANT_CHANNEL);
    ENUM(WSYNC_QUANT_BLOCK);
    end();
    begin("wsync_log_level_t");
    ENUM(WSYNC_LOG_UNSET);
    ENUM(WSYNC_LOG_ERROR);
    ENUM(WSYNC_LOG_WARN);
    ENUM(WSYNC_LOG_INFO);
    ENUM(WSYNC_LOG_DEBUG);
    end();
    begin("wsync_model_type_t");
    ENUM(WSYNC_MODEL_LLAMA);
    ENUM(WSYNC_MODEL_QWEN2);
    ENUM(WSYNC_MODEL_QWEN3);
    ENUM(WSYNC_MODEL_QWEN3_MOE);
    ENUM(WSYNC_MODEL_DEEPSEEK_V2);
    ENUM(WSYNC_MODEL_DEEPSEEK_V3);
    end();
    begin("wsync_router_score_t");
    ENUM(WSYNC_ROUTER_SOFTMAX);
    ENUM(WSYNC_ROUTER_SIGMOID);
    end();
    begin("wsync_topk_method_t");
    ENUM(WSYNC_TOPK_GREEDY);
    ENUM(WSYNC_TOPK_GROUP_LIMITED);
    ENUM(WSYNC_TOPK_NOAUX_TC);
    end();
    begin("wsync_expert_placement_t");
    ENUM(WSYNC_EXPERT_LINEAR);
    ENUM(WSYNC_EXPERT_ROUND_ROBIN);
    end();
    begin("wsync_wire_form_t");
    ENUM(WSYNC_WIRE_PLAIN);
    ENUM(WSYNC_WIRE_FP8);
    ENUM(WSYNC_WIRE_CUT_CELLS);
    ENUM(WSYNC_WIRE_SHARED);
    ENUM(WSYNC_WIRE_PER_TENSOR);
    ENUM(WSYNC_WIRE_OFF);
    ENUM(WSYNC_WIRE_UNCOVERED);
    ENUM(WSYNC_WIRE_NFORMS);
    end();
    end();

    begin("enum_sizes");
    num("wsync_status_t", (long long)sizeof(wsync_status_t));
    num("wsync_dtype_t", (long long)sizeof(wsync_dtype_t));
    num("wsync_mem_t", (long long)sizeof(wsync_mem_t));
    num("wsync_quant_scheme_t", (long long)sizeof(wsync_quant_scheme_t));
    num("wsync_log_level_t", (long long)sizeof(wsync_log_level_t));
    num("wsync_model_type_t", (long long)sizeof(wsync_model_type_t));
    end();

    begin("macros");
    ENUM(WSYNC_VERSION_MAJOR);
    ENUM(WSYNC_VERSION_MINOR);
    ENUM(WSYNC_VERSION_PATCH);
    ENUM(WSYNC_MAX_DIMS);
    ENUM(WSYNC_REPLICATE);
    ENUM(WSYNC_MODEL_MAX_MLP_ONLY);
    end();
}

/* pointers print as 0 (NULL) or 1 */
#define PTR(key, p) num(key, (p) != NULL)

static void inits(void)
{
    wsync_ctx_params_t cp = WSYNC_CTX_PARAMS_INIT;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    wsync_tp_options_t tp = WSYNC_TP_OPTIONS_INIT;

    begin("inits");
    num("wsync_ctx_params_t.log_level", cp.log_level);
    num("wsync_ctx_params_t.verify", cp.verify);

    PTR("wsync_sender_params_t.coordinator", sp.coordinator);
    num("wsync_sender_params_t.rank", sp.rank);
    num("wsync_sender_params_t.nranks", sp.nranks);
    num("wsync_sender_params_t.nreceivers", sp.nreceivers);
    PTR("wsync_sender_params_t.scheme", sp.scheme);
    num("wsync_sender_params_t.bucket_bytes", (long long)sp.bucket_bytes);
    num("wsync_sender_params_t.timeout_ms", sp.timeout_ms);
    num("wsync_sender_params_t.heartbeat_ms", sp.heartbeat_ms);
    num("wsync_sender_params_t.snapshot", sp.snapshot);
    num("wsync_sender_params_t.keep_versions", sp.keep_versions);
    num("wsync_sender_params_t.copy_shards", sp.copy_shards);
    PTR("wsync_sender_params_t.delta", sp.delta);
    PTR("wsync_sender_params_t.delta_baseline", sp.delta_baseline);
    real("wsync_sender_params_t.delta_cutoff", sp.delta_cutoff);
    num("wsync_sender_params_t.fp8_wire", sp.fp8_wire);

    PTR("wsync_receiver_params_t.coordinator", rp.coordinator);
    num("wsync_receiver_params_t.rank", rp.rank);
    num("wsync_receiver_params_t.nreceivers", rp.nreceivers);
    num("wsync_receiver_params_t.timeout_ms", rp.timeout_ms);
    num("wsync_receiver_params_t.heartbeat_ms", rp.heartbeat_ms);
    num("wsync_receiver_params_t.progress", rp.progress != NULL);
    PTR("wsync_receiver_params_t.progress_arg", rp.progress_arg);
    num("wsync_receiver_params_t.on_version", rp.on_version != NULL);
    PTR("wsync_receiver_params_t.on_version_arg", rp.on_version_arg);
    PTR("wsync_receiver_params_t.delta", rp.delta);

    num("wsync_tp_options_t.param_dtype", tp.param_dtype);
    num("wsync_tp_options_t.dtype", tp.dtype);
    num("wsync_tp_options_t.quant_dtype", tp.quant_dtype);
    num("wsync_tp_options_t.quant.scheme", tp.quant.scheme);
    num("wsync_tp_options_t.quant.block_rows", tp.quant.block_rows);
    num("wsync_tp_options_t.quant.block_cols", tp.quant.block_cols);
    real("wsync_tp_options_t.quant.eps", tp.quant.eps);
    num("wsync_tp_options_t.quant.ue8m0", tp.quant.ue8m0);
    num("wsync_tp_options_t.quant.no_saturate", tp.quant.no_saturate);
    PTR("wsync_tp_options_t.quant.scales", tp.quant.scales);
    num("wsync_tp_options_t.quant.scales_mem", tp.quant.scales_mem);
    num("wsync_tp_options_t.vocab_pad", (long long)tp.vocab_pad);
    num("wsync_tp_options_t.ep_size", tp.ep_size);
    num("wsync_tp_options_t.ep_rank", tp.ep_rank);
    num("wsync_tp_options_t.expert_placement", tp.expert_placement);
    end();
}

int main(void)
{
    first = 1;
    printf("{");
    structs();
    enums();
    inits();
    printf("}\n");
    return 0;
}
