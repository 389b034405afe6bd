/* Mixture-of-experts and MLA models (qwen3_moe, deepseek_v2/v3): config parsing checked field by
 * field against the JSON (read here with jansson), the param list against the tiny models'
 * safetensors headers, and every TP/EP rank's targets reassembled by vLLM's rules (written here
 * from docs/moe_layouts.md, independently of reshard/) into the checkpoint params, element by
 * element. */
#include "wsync/wsync.h"

#include "tests/support/check.h"
#include "tests/support/plan_sim.h"
#include "tests/support/safetensors_min.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TESTDATA WSYNC_TESTDATA
#define QWEN_MOE TESTDATA "/hf_qwen3_moe_tiny"
#define DEEPSEEK TESTDATA "/hf_deepseek_v3_tiny"

static wsync_status_t parse(const char *json, wsync_model_config_t *cfg)
{
    return wsync_model_config_parse(json, strlen(json), cfg);
}

/* ------------------------------------------------------------------------------------------ */
/* Config: field by field against the JSON                                                      */
/* ------------------------------------------------------------------------------------------ */

static int64_t jint(json_t *root, const char *key)
{
    json_t *v = json_object_get(root, key);
    CHECK_MSG(json_is_integer(v), "%s is not an integer in the JSON", key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

static int jbool(json_t *root, const char *key)
{
    json_t *v = json_object_get(root, key);
    CHECK_MSG(json_is_boolean(v), "%s is not a boolean in the JSON", key);
    return json_is_true(v);
}

static json_t *load_json(const char *path)
{
    json_error_t e;
    json_t *root = json_load_file(path, 0, &e);
    CHECK_MSG(root != NULL, "%s: %s", path, e.text);
    return root;
}

#define CHECK_FIELD(c, root, field, key)                                                      \
    CHECK_MSG((c).field == jint(root, key), "%s: %" PRId64 " vs JSON %" PRId64, key,           \
              (int64_t)(c).field, jint(root, key))

static void config_qwen3_moe_tiny(void)
{
    wsync_model_config_t c;
    json_t *j = load_json(QWEN_MOE "/config.json");
    if (j == NULL)
        return;
    CHECK_OK(wsync_model_config_load(QWEN_MOE "/config.json", &c));
    CHECK(c.model_type == WSYNC_MODEL_QWEN3_MOE);
    CHECK(strcmp(wsync_model_type_name(c.model_type), "qwen3_moe") == 0);
    CHECK_FIELD(c, j, hidden_size, "hidden_size");
    CHECK_FIELD(c, j, num_hidden_layers, "num_hidden_layers");
    CHECK_FIELD(c, j, num_attention_heads, "num_attention_heads");
    CHECK_FIELD(c, j, num_key_value_heads, "num_key_value_heads");
    CHECK_FIELD(c, j, head_dim, "head_dim");
    CHECK_FIELD(c, j, intermediate_size, "intermediate_size");
    CHECK_FIELD(c, j, vocab_size, "vocab_size");
    CHECK_FIELD(c, j, max_position_embeddings, "max_position_embeddings");
    /* transformers 5 saves num_experts under its attribute_map name */
    CHECK_FIELD(c, j, num_experts, "num_local_experts");
    CHECK_FIELD(c, j, num_experts_per_tok, "num_experts_per_tok");
    CHECK_FIELD(c, j, moe_intermediate_size, "moe_intermediate_size");
    CHECK_FIELD(c, j, decoder_sparse_step, "decoder_sparse_step");
    CHECK(c.norm_topk_prob == jbool(j, "norm_topk_prob"));
    CHECK(c.tie_word_embeddings == jbool(j, "tie_word_embeddings"));
    CHECK(c.attention_bias == jbool(j, "attention_bias") && c.o_proj_bias == c.attention_bias);
    CHECK((size_t)c.nmlp_only_layers == json_array_size(json_object_get(j, "mlp_only_layers")));
    CHECK(c.rms_norm_eps == json_number_value(json_object_get(j, "rms_norm_eps")));
    CHECK(c.rope_theta ==
          json_number_value(json_object_get(json_object_get(j, "rope_parameters"), "rope_theta")));
    CHECK(c.dtype == WSYNC_DTYPE_BF16);
    CHECK(c.qk_norm == 1 && c.mlp_bias == 0);
    CHECK(c.scoring_func == WSYNC_ROUTER_SOFTMAX && c.topk_method == WSYNC_TOPK_GREEDY);
    CHECK(c.router_bias == 0 && c.n_shared_experts == 0 && c.kv_lora_rank == 0);
    for (int64_t l = 0; l < c.num_hidden_layers; l++)
        CHECK(wsync_model_layer_is_moe(&c, l) == 1);
    json_decref(j);
}

static void config_deepseek_v3_tiny(void)
{
    wsync_model_config_t c;
    json_t *j = load_json(DEEPSEEK "/config.json");
    if (j == NULL)
        return;
    CHECK_OK(wsync_model_config_load(DEEPSEEK "/config.json", &c));
    CHECK(c.model_type == WSYNC_MODEL_DEEPSEEK_V3);
    CHECK(strcmp(wsync_model_type_name(c.model_type), "deepseek_v3") == 0);
    CHECK_FIELD(c, j, hidden_size, "hidden_size");
    CHECK_FIELD(c, j, num_hidden_layers, "num_hidden_layers");
    CHECK_FIELD(c, j, num_attention_heads, "num_attention_heads");
    CHECK_FIELD(c, j, intermediate_size, "intermediate_size");
    CHECK_FIELD(c, j, vocab_size, "vocab_size");
    CHECK_FIELD(c, j, max_position_embeddings, "max_position_embeddings");
    CHECK_FIELD(c, j, num_experts, "n_routed_experts");
    CHECK_FIELD(c, j, num_experts_per_tok, "num_experts_per_tok");
    CHECK_FIELD(c, j, moe_intermediate_size, "moe_intermediate_size");
    CHECK_FIELD(c, j, n_shared_experts, "n_shared_experts");
    CHECK_FIELD(c, j, first_k_dense_replace, "first_k_dense_replace");
    CHECK_FIELD(c, j, n_group, "n_group");
    CHECK_FIELD(c, j, topk_group, "topk_group");
    CHECK_FIELD(c, j, q_lora_rank, "q_lora_rank");
    CHECK_FIELD(c, j, kv_lora_rank, "kv_lora_rank");
    CHECK_FIELD(c, j, qk_nope_head_dim, "qk_nope_head_dim");
    CHECK_FIELD(c, j, qk_rope_head_dim, "qk_rope_head_dim");
    CHECK_FIELD(c, j, v_head_dim, "v_head_dim");
    /* MLA: head_dim is q's/k's (nope + rope, the JSON's qk_head_dim; its head_dim is rope's) */
    CHECK_FIELD(c, j, head_dim, "qk_head_dim");
    CHECK(c.head_dim != jint(j, "head_dim"));
    CHECK(c.num_key_value_heads == c.num_attention_heads);
    CHECK(c.norm_topk_prob == jbool(j, "norm_topk_prob"));
    CHECK(c.rope_interleave == jbool(j, "rope_interleave"));
    CHECK(c.routed_scaling_factor ==
          json_number_value(json_object_get(j, "routed_scaling_factor")));
    CHECK(c.tie_word_embeddings == jbool(j, "tie_word_embeddings"));
    CHECK(c.rms_norm_eps == json_number_value(json_object_get(j, "rms_norm_eps")));
    CHECK(c.rope_theta ==
          json_number_value(json_object_get(json_object_get(j, "rope_parameters"), "rope_theta")));
    CHECK(c.dtype == WSYNC_DTYPE_BF16);
    /* DeepseekV3Config has no scoring_func / topk_method: sigmoid, noaux_tc, always a bias */
    CHECK(c.scoring_func == WSYNC_ROUTER_SIGMOID && c.topk_method == WSYNC_TOPK_NOAUX_TC);
    CHECK(c.router_bias == 1 && c.moe_layer_freq == 1);
    CHECK(c.qk_norm == 0 && c.attention_bias == 0 && c.mlp_bias == 0);
    CHECK(wsync_model_layer_is_moe(&c, 0) == 0);
    CHECK(wsync_model_layer_is_moe(&c, 1) == 1 && wsync_model_layer_is_moe(&c, 2) == 1);
    CHECK(wsync_model_layer_is_moe(&c, 3) == 0 && wsync_model_layer_is_moe(&c, -1) == 0);
    json_decref(j);
}

/* DeepSeek-V3's published config (abridged; the keys wsync ignores kept) */
#define DSV3_JSON(model_type, experts, group, topk_group, dense)                              \
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"" model_type "\","     \
    " \"auto_map\": {\"AutoConfig\": \"configuration_deepseek.DeepseekV3Config\"},"           \
    " \"attention_bias\": false, \"aux_loss_alpha\": 0.001, \"ep_size\": 1,"                   \
    " \"first_k_dense_replace\": " dense ", \"hidden_act\": \"silu\", \"hidden_size\": 7168,"  \
    " \"intermediate_size\": 18432, \"kv_lora_rank\": 512, \"max_position_embeddings\": 163840," \
    " \"moe_intermediate_size\": 2048, \"moe_layer_freq\": 1, \"n_group\": " group ","         \
    " \"n_routed_experts\": " experts ", \"n_shared_experts\": 1, \"norm_topk_prob\": true,"   \
    " \"num_attention_heads\": 128, \"num_experts_per_tok\": 8, \"num_hidden_layers\": 61,"    \
    " \"num_key_value_heads\": 128, \"num_nextn_predict_layers\": 1, \"q_lora_rank\": 1536,"  \
    " \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"quantization_config\":"          \
    " {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\", \"quant_method\": \"fp8\","     \
    " \"weight_block_size\": [128, 128]}, \"rms_norm_eps\": 1e-06, \"rope_scaling\":"         \
    " {\"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 40, \"mscale\": 1.0, \"mscale_all_dim\":" \
    " 1.0, \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"}, \"rope_theta\":"  \
    " 10000, \"routed_scaling_factor\": 2.5, \"scoring_func\": \"sigmoid\", \"seq_aux\": true," \
    " \"tie_word_embeddings\": false, \"topk_group\": " topk_group ", \"topk_method\":"        \
    " \"noaux_tc\", \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.33.1\","     \
    " \"use_cache\": true, \"v_head_dim\": 128, \"vocab_size\": 129280}"

/* A published config the repository keeps in tools/configs, found from this source file's path
 * (CMake compiles it by its absolute path). */
static const char *published(const char *file)
{
    static char path[1024];
    const char *tail = strstr(__FILE__, "tests/unit/test_layout_moe.c");
    int root = tail != NULL ? (int)(tail - __FILE__) : 0;
    snprintf(path, sizeof(path), "%.*stools/configs/%s", root, __FILE__, file);
    return path;
}

static size_t count_params(const wsync_model_config_t *c)
{
    wsync_param_t *p = NULL;
    size_t n = 0;
    CHECK_OK(wsync_model_params(c, 0, &p, &n));
    wsync_model_params_free(p, n);
    return n;
}

static void config_deepseek_published(void)
{
    wsync_model_config_t c;

    CHECK_OK(parse(DSV3_JSON("deepseek_v3", "256", "8", "4", "3"), &c));
    CHECK(c.model_type == WSYNC_MODEL_DEEPSEEK_V3);
    CHECK(c.hidden_size == 7168 && c.num_hidden_layers == 61 && c.num_attention_heads == 128);
    CHECK(c.num_key_value_heads == 128 && c.head_dim == 192);
    CHECK(c.q_lora_rank == 1536 && c.kv_lora_rank == 512 && c.v_head_dim == 128);
    CHECK(c.num_experts == 256 && c.num_experts_per_tok == 8 && c.n_shared_experts == 1);
    CHECK(c.n_group == 8 && c.topk_group == 4 && c.first_k_dense_replace == 3);
    CHECK(c.routed_scaling_factor == 2.5 && c.norm_topk_prob == 1 && c.router_bias == 1);
    CHECK(c.rope_theta == 10000.0 && c.rope_interleave == 1 && c.dtype == WSYNC_DTYPE_BF16);
    CHECK(c.max_position_embeddings == 163840);
    /* per layer: 2 norms + 7 MLA params; dense 3 MLP params; MoE router + bias + 3 E + 3 shared */
    CHECK(count_params(&c) == 3 + 3 * (9 + 3) + 58 * (9 + 2 + 3 * 256 + 3));

    /* Kimi-K2: DeepSeek-V3 with 384 experts in one group, one dense layer; both its published
     * model_type and the deepseek_v3 engines ask for */
    CHECK_OK(parse(DSV3_JSON("deepseek_v3", "384", "1", "1", "1"), &c));
    CHECK(c.num_experts == 384 && c.n_group == 1 && c.topk_group == 1);
    CHECK(count_params(&c) == 3 + 1 * (9 + 3) + 60 * (9 + 2 + 3 * 384 + 3));   /* 69,975 */
    CHECK_OK(parse(DSV3_JSON("kimi_k2", "384", "1", "1", "1"), &c));
    CHECK(c.model_type == WSYNC_MODEL_DEEPSEEK_V3 && c.num_experts == 384);

    /* the configs the repository keeps, as published */
    CHECK_OK(wsync_model_config_load(published("deepseek-v3.json"), &c));
    CHECK(c.num_experts == 256 && c.q_lora_rank == 1536 && c.topk_method == WSYNC_TOPK_NOAUX_TC);
    CHECK_OK(wsync_model_config_load(published("kimi-k2.json"), &c));
    CHECK(c.num_experts == 384 && c.rope_theta == 50000.0 && c.routed_scaling_factor == 2.827);
    CHECK(count_params(&c) == 69975);
    CHECK_OK(wsync_model_config_load(published("qwen3-30b-a3b.json"), &c));
    CHECK(c.model_type == WSYNC_MODEL_QWEN3_MOE && c.num_experts == 128);
    CHECK(c.num_experts_per_tok == 8 && c.moe_intermediate_size == 768 && c.head_dim == 128);
    CHECK(c.num_key_value_heads == 4 && c.norm_topk_prob == 1 && c.nmlp_only_layers == 0);
    CHECK_OK(wsync_model_config_load(published("qwen3-235b-a22b.json"), &c));
    CHECK(c.num_experts == 128 && c.num_hidden_layers == 94);
}

static void config_moe_defaults(void)
{
    wsync_model_config_t c;

    /* Qwen3MoeConfig's defaults; head_dim from Qwen3MoeAttention's Hd / H fallback */
    CHECK_OK(parse("{\"model_type\": \"qwen3_moe\", \"hidden_size\": 256, \"num_hidden_layers\": 4,"
                   " \"num_attention_heads\": 8, \"intermediate_size\": 64, \"vocab_size\": 100}",
                   &c));
    CHECK(c.num_experts == 128 && c.num_experts_per_tok == 8 && c.moe_intermediate_size == 768);
    CHECK(c.decoder_sparse_step == 1 && c.norm_topk_prob == 0 && c.nmlp_only_layers == 0);
    CHECK(c.num_key_value_heads == 4 && c.head_dim == 32 && c.qk_norm == 1);
    CHECK(c.max_position_embeddings == 32768 && c.rope_theta == 10000.0);

    /* which layers are MoE: Qwen3MoeDecoderLayer */
    CHECK_OK(parse("{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 64,"
                   " \"num_hidden_layers\": 6, \"num_attention_heads\": 4, \"intermediate_size\":"
                   " 64, \"vocab_size\": 100, \"num_experts\": 4, \"num_experts_per_tok\": 2,"
                   " \"decoder_sparse_step\": 2, \"mlp_only_layers\": [3, 4]}",
                   &c));
    CHECK(c.model_type == WSYNC_MODEL_QWEN3_MOE && c.nmlp_only_layers == 2);
    CHECK(c.mlp_only_layers[0] == 3 && c.mlp_only_layers[1] == 4);
    const int want[6] = {0, 1, 0, 0, 0, 1};
    for (int l = 0; l < 6; l++)
        CHECK_MSG(wsync_model_layer_is_moe(&c, l) == want[l], "layer %d", l);

    /* DeepseekV3Config's defaults */
    CHECK_OK(parse("{\"model_type\": \"deepseek_v3\", \"hidden_size\": 512, \"num_hidden_layers\":"
                   " 5, \"num_attention_heads\": 4, \"intermediate_size\": 64, \"vocab_size\": 99}",
                   &c));
    CHECK(c.num_experts == 256 && c.num_experts_per_tok == 8 && c.moe_intermediate_size == 2048);
    CHECK(c.n_shared_experts == 1 && c.first_k_dense_replace == 3 && c.n_group == 8);
    CHECK(c.topk_group == 4 && c.routed_scaling_factor == 2.5 && c.norm_topk_prob == 1);
    CHECK(c.q_lora_rank == 1536 && c.kv_lora_rank == 512 && c.qk_nope_head_dim == 128);
    CHECK(c.qk_rope_head_dim == 64 && c.v_head_dim == 128 && c.head_dim == 192);
    CHECK(c.rope_interleave == 1 && c.max_position_embeddings == 4096 && c.router_bias == 1);
    CHECK(c.num_key_value_heads == 4);

    /* DeepseekV2Config's defaults; q_lora_rank null: q_proj; moe_layer_freq honoured */
    CHECK_OK(parse("{\"architectures\": [\"DeepseekV2ForCausalLM\"], \"hidden_size\": 512,"
                   " \"num_hidden_layers\": 6, \"num_attention_heads\": 4, \"intermediate_size\":"
                   " 64, \"vocab_size\": 99, \"num_experts_per_tok\": 6, \"q_lora_rank\": null,"
                   " \"first_k_dense_replace\": 1, \"moe_layer_freq\": 2}",
                   &c));
    CHECK(c.model_type == WSYNC_MODEL_DEEPSEEK_V2 && c.q_lora_rank == 0);
    CHECK(c.num_experts == 64 && c.n_shared_experts == 2 && c.moe_intermediate_size == 1407);
    CHECK(c.n_group == 1 && c.topk_group == 1 && c.routed_scaling_factor == 1.0);
    CHECK(c.scoring_func == WSYNC_ROUTER_SOFTMAX && c.topk_method == WSYNC_TOPK_GREEDY);
    CHECK(c.router_bias == 0 && c.norm_topk_prob == 0 && c.max_position_embeddings == 2048);
    const int want2[6] = {0, 0, 1, 0, 1, 0};
    for (int l = 0; l < 6; l++)
        CHECK_MSG(wsync_model_layer_is_moe(&c, l) == want2[l], "layer %d", l);
    /* V2 with noaux_tc has the correction bias; null shared experts: none */
    CHECK_OK(parse("{\"model_type\": \"deepseek_v2\", \"hidden_size\": 512, \"num_hidden_layers\":"
                   " 2, \"num_attention_heads\": 4, \"intermediate_size\": 64, \"vocab_size\": 99,"
                   " \"num_experts_per_tok\": 2, \"n_routed_experts\": 8, \"n_group\": 4,"
                   " \"topk_group\": 2, \"topk_method\": \"noaux_tc\", \"scoring_func\":"
                   " \"sigmoid\", \"n_shared_experts\": null}",
                   &c));
    CHECK(c.router_bias == 1 && c.n_shared_experts == 0 && c.topk_method == WSYNC_TOPK_NOAUX_TC);
    CHECK(c.scoring_func == WSYNC_ROUTER_SIGMOID);
}

/* A config that must be refused with WSYNC_ERR_CONFIG and a message holding `needle`. */
static void refuse(const char *json, const char *needle)
{
    wsync_model_config_t c;
    memset(&c, 0x5A, sizeof(c));
    wsync_model_config_t before = c;
    CHECK_ST(parse(json, &c), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS(needle);
    CHECK(memcmp(&c, &before, sizeof(c)) == 0);     /* outputs only on success */
}

#define QMOE(extra)                                                                           \
    "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, \"num_hidden_layers\": 4,"           \
    " \"num_attention_heads\": 4, \"intermediate_size\": 64, \"vocab_size\": 100" extra "}"
/* a small deepseek_v3: E experts in G groups, TG of them kept, top-K */
#define DSV3R(e, g, tg, k, extra)                                                             \
    "{\"model_type\": \"deepseek_v3\", \"hidden_size\": 64, \"num_hidden_layers\": 4,"         \
    " \"num_attention_heads\": 4, \"intermediate_size\": 64, \"vocab_size\": 100,"             \
    " \"n_routed_experts\": " e ", \"n_group\": " g ", \"topk_group\": " tg ","                 \
    " \"num_experts_per_tok\": " k extra "}"
#define DSV3(extra) DSV3R("8", "2", "1", "2", extra)

static void config_moe_refusals(void)
{
    refuse(QMOE(", \"num_experts\": \"8\""), "num_experts must be an integer, got \"8\"");
    refuse(QMOE(", \"num_experts\": 8.5"), "num_experts must be an integer, got 8.5");
    refuse(QMOE(", \"num_experts\": 0"), "num_experts = 0 must be in [1,");
    refuse(QMOE(", \"num_experts\": 8, \"num_experts_per_tok\": 9"),
           "num_experts_per_tok = 9 exceeds num_experts = 8");
    refuse(QMOE(", \"num_experts\": 8, \"num_local_experts\": 16"),
           "num_experts = 8 and num_local_experts = 16 disagree");
    refuse(QMOE(", \"mlp_only_layers\": [1, 4]"), "mlp_only_layers[1] = 4 is not a layer");
    refuse(QMOE(", \"mlp_only_layers\": [-1]"), "mlp_only_layers[0] = -1 is not a layer");
    refuse(QMOE(", \"mlp_only_layers\": 3"), "mlp_only_layers must be a list of integers, got 3");
    refuse(QMOE(", \"mlp_only_layers\": [\"0\"]"), "mlp_only_layers[0] must be an integer");
    refuse(QMOE(", \"decoder_sparse_step\": 0"), "decoder_sparse_step = 0 must be in [1,");
    refuse(QMOE(", \"norm_topk_prob\": 1"), "norm_topk_prob must be true or false, got 1");

    /* more entries than WSYNC_MODEL_MAX_MLP_ONLY */
    char big[8192];
    int n = snprintf(big, sizeof(big),
                     "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, \"num_hidden_layers\":"
                     " 1000, \"num_attention_heads\": 4, \"intermediate_size\": 64, \"vocab_size\":"
                     " 100, \"mlp_only_layers\": [0");
    for (int i = 1; i <= WSYNC_MODEL_MAX_MLP_ONLY; i++)
        n += snprintf(big + n, sizeof(big) - (size_t)n, ", %d", i);
    snprintf(big + n, sizeof(big) - (size_t)n, "]}");
    refuse(big, "mlp_only_layers has 257 entries, at most 256");

    refuse(DSV3R("8", "3", "1", "2", ""), "n_group = 3 does not divide n_routed_experts = 8");
    refuse(DSV3R("8", "2", "3", "2", ""), "topk_group = 3 exceeds n_group = 2");
    refuse(DSV3R("8", "2", "1", "9", ""), "num_experts_per_tok = 9 exceeds the 8 experts");
    refuse(DSV3R("8", "2", "1", "5", ""),
           "num_experts_per_tok = 5 exceeds the 4 experts of topk_group = 1 groups");
    refuse(DSV3R("8", "8", "8", "2", ""), "topk_method noaux_tc needs >= 2 experts per group");
    refuse(DSV3(", \"qk_rope_head_dim\": 33"), "qk_rope_head_dim = 33 must be even");
    refuse(DSV3(", \"scoring_func\": \"relu\""), "scoring_func = \"relu\" is not supported");
    refuse(DSV3(", \"topk_method\": \"gready\""), "topk_method = \"gready\" is not supported");
    refuse(DSV3(", \"q_lora_rank\": -1"), "q_lora_rank = -1 must be in [0,");
    refuse(DSV3(", \"kv_lora_rank\": true"), "kv_lora_rank must be an integer, got true");
    refuse(DSV3(", \"routed_scaling_factor\": 0"), "routed_scaling_factor = 0 must be > 0");
    refuse(DSV3(", \"attention_bias\": true"), "no attention or MLP biases");
    refuse(DSV3(", \"n_shared_experts\": 2147483647, \"moe_intermediate_size\": 2"),
           "n_shared_experts * moe_intermediate_size = 4294967294 exceeds 2147483647");
    refuse(DSV3R("65537", "1", "1", "2", ""), "n_routed_experts = 65537 experts, at most 65536");
    refuse(DSV3(", \"moe_layer_freq\": 2"), "moe_layer_freq = 2 is not supported for deepseek_v3");
    refuse(DSV3R("null", "2", "1", "2", ""), "n_routed_experts = null");
    refuse("{\"model_type\": \"deepseek_v2\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
           " \"num_attention_heads\": 4, \"intermediate_size\": 64, \"vocab_size\": 100}",
           "missing required field num_experts_per_tok");
    refuse("{\"model_type\": \"mixtral\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
           " \"num_attention_heads\": 4, \"intermediate_size\": 64, \"vocab_size\": 100}",
           "model_type \"mixtral\" is not supported");
    refuse("{\"architectures\": [\"DeepseekV4ForCausalLM\"], \"hidden_size\": 64,"
           " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 64,"
           " \"vocab_size\": 100}",
           "architectures[0] \"DeepseekV4ForCausalLM\" is not supported");

    /* a hand-written config goes through the same checks */
    wsync_model_config_t c;
    CHECK_OK(parse(DSV3(""), &c));
    c.head_dim = 64;
    CHECK_ST(wsync_model_config_check(&c), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("head_dim = 64 must be qk_nope_head_dim + qk_rope_head_dim = 192");
    CHECK_OK(parse(QMOE(""), &c));
    c.nmlp_only_layers = WSYNC_MODEL_MAX_MLP_ONLY + 1;
    CHECK_ST(wsync_model_config_check(&c), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("nmlp_only_layers = 257");
    CHECK_OK(parse("{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
                   " \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"intermediate_size\":"
                   " 64, \"vocab_size\": 100}",
                   &c));
    c.num_experts = 8;
    CHECK_ST(wsync_model_config_check(&c), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("qwen3 is dense: num_experts = 8");
}

/* ------------------------------------------------------------------------------------------ */
/* Params against the safetensors headers                                                       */
/* ------------------------------------------------------------------------------------------ */

static const char *st_dtype_of(wsync_dtype_t d)
{
    switch (d) {
    case WSYNC_DTYPE_BF16: return "BF16";
    case WSYNC_DTYPE_F16: return "F16";
    case WSYNC_DTYPE_F32: return "F32";
    default: return "?";
    }
}

static void params_match_safetensors(const char *dir)
{
    char path[512], err[256];
    wsync_model_config_t c;
    st_file_t *f = NULL;
    wsync_param_t *p = NULL;
    size_t n = 0;

    snprintf(path, sizeof(path), "%s/config.json", dir);
    CHECK_OK(wsync_model_config_load(path, &c));
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    CHECK_MSG(st_open(path, &f, err, sizeof(err)) == 0, "%s: %s", path, err);
    if (f == NULL)
        return;
    CHECK_OK(wsync_model_params(&c, 0, &p, &n));
    CHECK_MSG(n == st_count(f), "%s: %zu params listed, %zu in the checkpoint", dir, n,
              st_count(f));
    for (size_t i = 0; i < n; i++) {
        const st_tensor_t *t = st_find(f, p[i].name);
        CHECK_MSG(t != NULL, "%s: %s is not in the checkpoint", dir, p[i].name);
        if (t == NULL)
            continue;
        CHECK_MSG(strcmp(t->dtype, st_dtype_of(p[i].dtype)) == 0, "%s: %s is %s, listed %s", dir,
                  p[i].name, t->dtype, st_dtype_of(p[i].dtype));
        int same = t->ndim == p[i].ndim;
        for (int d = 0; same && d < t->ndim; d++)
            same = t->shape[d] == p[i].shape[d];
        CHECK_MSG(same, "%s: %s shape differs from the checkpoint's", dir, p[i].name);
        for (size_t k = 0; k < i; k++)
            CHECK_MSG(strcmp(p[k].name, p[i].name) != 0, "%s listed twice", p[i].name);
    }
    wsync_model_params_free(p, n);
    st_close(f);
}

static void params_tiny_models(void)
{
    params_match_safetensors(QWEN_MOE);
    params_match_safetensors(DEEPSEEK);

    /* the order within a layer: as the header documents, MoE experts expert by expert */
    wsync_model_config_t c;
    wsync_param_t *p = NULL;
    size_t n = 0;
    CHECK_OK(wsync_model_config_load(DEEPSEEK "/config.json", &c));
    CHECK_OK(wsync_model_params(&c, WSYNC_DTYPE_F32, &p, &n));
    const char *want[] = {
        "model.embed_tokens.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_a_proj.weight",
        "model.layers.0.self_attn.q_a_layernorm.weight",
        "model.layers.0.self_attn.q_b_proj.weight",
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
        "model.layers.0.self_attn.kv_a_layernorm.weight",
        "model.layers.0.self_attn.kv_b_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.1.input_layernorm.weight",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]) && i < n; i++)
        CHECK_MSG(strcmp(p[i].name, want[i]) == 0, "param %zu is %s, not %s", i, p[i].name,
                  want[i]);
    CHECK(n > 30 && strcmp(p[22].name, "model.layers.1.mlp.gate.weight") == 0);
    CHECK(strcmp(p[23].name, "model.layers.1.mlp.gate.e_score_correction_bias") == 0);
    CHECK(strcmp(p[24].name, "model.layers.1.mlp.experts.0.gate_proj.weight") == 0);
    CHECK(strcmp(p[26].name, "model.layers.1.mlp.experts.0.down_proj.weight") == 0);
    CHECK(strcmp(p[27].name, "model.layers.1.mlp.experts.1.gate_proj.weight") == 0);
    CHECK(strcmp(p[48].name, "model.layers.1.mlp.shared_experts.gate_proj.weight") == 0);
    CHECK(p[0].dtype == WSYNC_DTYPE_F32 && p[23].dtype == WSYNC_DTYPE_F32);
    wsync_model_params_free(p, n);

    /* without q_lora: q_proj [H * (nope + rope), Hd] in place of q_a / q_a_layernorm / q_b */
    CHECK_OK(parse(DSV3(", \"q_lora_rank\": null, \"n_shared_experts\": 2,"
                        " \"moe_intermediate_size\": 24, \"kv_lora_rank\": 16,"
                        " \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 6,"
                        " \"first_k_dense_replace\": 0"),
                   &c));
    CHECK_OK(wsync_model_params(&c, 0, &p, &n));
    CHECK(n == 3 + 4 * (2 + 5 + 2 + 3 * 8 + 3));    /* norms, MLA, router + bias, experts, shared */
    CHECK(strcmp(p[2].name, "model.layers.0.self_attn.q_proj.weight") == 0);
    CHECK(p[2].shape[0] == 4 * 12 && p[2].shape[1] == 64);
    CHECK(strcmp(p[3].name, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight") == 0);
    CHECK(p[3].shape[0] == 16 + 4);
    CHECK(strcmp(p[5].name, "model.layers.0.self_attn.kv_b_proj.weight") == 0);
    CHECK(p[5].shape[0] == 4 * (8 + 6) && p[5].shape[1] == 16);
    CHECK(strcmp(p[6].name, "model.layers.0.self_attn.o_proj.weight") == 0);
    CHECK(p[6].shape[0] == 64 && p[6].shape[1] == 4 * 6);
    CHECK(strcmp(p[10].name, "model.layers.0.mlp.experts.0.gate_proj.weight") == 0);
    CHECK(p[10].shape[0] == 24 && p[10].shape[1] == 64);
    CHECK(strcmp(p[36].name, "model.layers.0.mlp.shared_experts.down_proj.weight") == 0);
    CHECK(p[36].shape[0] == 64 && p[36].shape[1] == 48);
    wsync_model_params_free(p, n);
}

/* ------------------------------------------------------------------------------------------ */
/* Layouts: every rank's targets reassembled into the params                                    */
/* ------------------------------------------------------------------------------------------ */

/* The params with distinct element ids: element i of param k holds base[k] + i (ids from 1; 0
 * marks a target element no piece wrote). */
typedef struct {
    wsync_param_t *p;
    size_t n;
    uint32_t *base;
    uint8_t **seen;        /* per param element: reassembled from some rank */
    size_t last;           /* the last param find_param found */
} model_t;

static int model_new(model_t *m, const wsync_model_config_t *c)
{
    memset(m, 0, sizeof(*m));
    if (wsync_model_params(c, 0, &m->p, &m->n) != WSYNC_OK)
        return -1;
    m->base = calloc(m->n, sizeof(*m->base));
    m->seen = calloc(m->n, sizeof(*m->seen));
    uint64_t next = 1;
    for (size_t k = 0; k < m->n; k++) {
        uint64_t vol = 1;
        for (int d = 0; d < m->p[k].ndim; d++)
            vol *= (uint64_t)m->p[k].shape[d];
        m->base[k] = (uint32_t)next;
        m->seen[k] = calloc(vol, 1);
        next += vol;
    }
    CHECK(next < UINT32_MAX);
    return 0;
}

static void model_free(model_t *m)
{
    for (size_t k = 0; k < m->n; k++)
        free(m->seen[k]);
    free(m->seen);
    free(m->base);
    wsync_model_params_free(m->p, m->n);
}

static int64_t find_param(model_t *m, const char *name)
{
    /* consecutive lookups mostly ask for the same param: try the last answer first */
    if (m->last < m->n && strcmp(m->p[m->last].name, name) == 0)
        return (int64_t)m->last;
    for (size_t k = 0; k < m->n; k++)
        if (strcmp(m->p[k].name, name) == 0) {
            m->last = k;
            return (int64_t)k;
        }
    return -1;
}

/* The target's content as ids, from its pieces (applied here, not by the library). */
static uint32_t *apply_pieces(model_t *m, const wsync_target_t *t, uint64_t *vol)
{
    uint64_t v = 1;
    for (int d = 0; d < t->ndim; d++)
        v *= (uint64_t)t->shape[d];
    uint32_t *buf = calloc(v, sizeof(*buf));
    *vol = v;
    const int64_t tcols = t->ndim == 2 ? t->shape[1] : 1;
    for (int i = 0; i < t->npieces; i++) {
        const wsync_piece_t *pc = &t->pieces[i];
        int64_t k = find_param(m, pc->param.name);
        CHECK_MSG(k >= 0, "target %s: piece of unknown param %s", t->name, pc->param.name);
        if (k < 0)
            continue;
        const wsync_param_t *p = &m->p[k];
        CHECK_MSG(pc->param.ndim == t->ndim && p->ndim == t->ndim && pc->param.dtype == p->dtype,
                  "target %s: piece %s keeps neither dims nor dtype", t->name, p->name);
        CHECK(pc->param.shape[0] == p->shape[0] && (p->ndim < 2 || pc->param.shape[1] == p->shape[1]));
        const int64_t pcols = p->ndim == 2 ? p->shape[1] : 1;
        const int64_t rows = pc->src.len[0], cols = p->ndim == 2 ? pc->src.len[1] : 1;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t cc = 0; cc < cols; cc++) {
                int64_t sr = pc->src.start[0] + r, sc = (p->ndim == 2 ? pc->src.start[1] : 0) + cc;
                int64_t dr = pc->dst_start[0] + r, dc = (t->ndim == 2 ? pc->dst_start[1] : 0) + cc;
                CHECK(sr < p->shape[0] && sc < pcols && dr < t->shape[0] && dc < tcols);
                if (sr < p->shape[0] && sc < pcols && dr < t->shape[0] && dc < tcols)
                    buf[dr * tcols + dc] = m->base[k] + (uint32_t)(sr * pcols + sc);
            }
    }
    return buf;
}

/* Where one rank is: TP rank r of T, and (EP) its experts. */
typedef struct {
    const wsync_model_config_t *c;
    int r, t;
    int ep;                  /* experts whole (EP) */
    int64_t experts[512];
    int64_t nlocal;
    int64_t vocab_pad;
} rank_t;

/* vLLM's determine_expert_map, written again here. */
static void experts_of(int64_t e, int rank, int size, wsync_expert_placement_t pl, int64_t *out,
                       int64_t *n)
{
    *n = 0;
    if (pl == WSYNC_EXPERT_ROUND_ROBIN) {
        for (int64_t g = rank; g < e; g += size)
            out[(*n)++] = g;
        return;
    }
    int64_t base = e / size, extra = e % size;
    int64_t count = base + (rank < extra ? 1 : 0);
    int64_t start = rank * base + (rank < extra ? rank : extra);
    for (int64_t j = 0; j < count; j++)
        out[(*n)++] = start + j;
}

/* The checkpoint param element (name into pname, row pr, column pc) that vLLM puts at row `row`,
 * column `col` of the target; 0 when none (vocab padding). */
static int source_of(const rank_t *k, const wsync_target_t *t, int64_t row, int64_t col,
                     char *pname, size_t len, int64_t *pr, int64_t *pcl)
{
    const wsync_model_config_t *c = k->c;
    const char *name = t->name;
    const char *suffix = name;
    char layer[64] = "";
    const int64_t hd = c->hidden_size;

    if (strncmp(name, "model.layers.", 13) == 0) {
        const char *dot = strchr(name + 13, '.');
        size_t n = (size_t)(dot - name) + 1;
        memcpy(layer, name, n);
        layer[n] = 0;
        suffix = dot + 1;
    }
    *pr = row;
    *pcl = col;
#define SRC(fmt, ...) snprintf(pname, len, "%s" fmt, layer, __VA_ARGS__)
    if (strcmp(name, "model.embed_tokens.weight") == 0 || strcmp(name, "lm_head.weight") == 0) {
        int64_t pad = k->vocab_pad, vp = (c->vocab_size + pad - 1) / pad * pad, vr = vp / k->t;
        *pr = k->r * vr + row;
        snprintf(pname, len, "%s", name);
        return *pr < c->vocab_size;
    }
    if (strcmp(suffix, "self_attn.qkv_proj.weight") == 0) {
        int64_t h = c->num_attention_heads, kv = c->num_key_value_heads, d = c->head_dim;
        int64_t hr = h / k->t, kr = kv >= k->t ? kv / k->t : 1;
        int64_t kvrank = kv >= k->t ? k->r : k->r / (k->t / kv);
        if (row < hr * d) {
            *pr = k->r * hr * d + row;
            SRC("%s", "self_attn.q_proj.weight");
        } else if (row < hr * d + kr * d) {
            *pr = kvrank * kr * d + row - hr * d;
            SRC("%s", "self_attn.k_proj.weight");
        } else {
            *pr = kvrank * kr * d + row - hr * d - kr * d;
            SRC("%s", "self_attn.v_proj.weight");
        }
        return 1;
    }
    if (strcmp(suffix, "self_attn.o_proj.weight") == 0 ||
        strcmp(suffix, "mlp.down_proj.weight") == 0 ||
        strcmp(suffix, "mlp.shared_experts.down_proj.weight") == 0) {
        *pcl = k->r * t->shape[1] + col;               /* row-parallel: input columns */
        SRC("%s", suffix);
        return 1;
    }
    if (strcmp(suffix, "mlp.gate_up_proj.weight") == 0 ||
        strcmp(suffix, "mlp.shared_experts.gate_up_proj.weight") == 0) {
        int64_t w = t->shape[0] / 2;
        int shared = strstr(suffix, "shared") != NULL;
        *pr = k->r * w + (row < w ? row : row - w);
        SRC("mlp.%s%s_proj.weight", shared ? "shared_experts." : "", row < w ? "gate" : "up");
        return 1;
    }
    if (strcmp(suffix, "self_attn.fused_qkv_a_proj.weight") == 0) {
        if (row < c->q_lora_rank) {
            SRC("%s", "self_attn.q_a_proj.weight");
        } else {
            *pr = row - c->q_lora_rank;
            SRC("%s", "self_attn.kv_a_proj_with_mqa.weight");
        }
        return 1;
    }
    if (strcmp(suffix, "self_attn.q_b_proj.weight") == 0 ||
        strcmp(suffix, "self_attn.kv_b_proj.weight") == 0 ||
        strcmp(suffix, "self_attn.q_proj.weight") == 0) {
        *pr = k->r * t->shape[0] + row;                /* by heads: rows evenly */
        SRC("%s", suffix);
        return 1;
    }
    if (strcmp(suffix, "mlp.experts.w13_weight") == 0) {
        int64_t ip = t->shape[0] / (2 * k->nlocal), j = row / (2 * ip), i = row % (2 * ip);
        int rr = k->ep ? 0 : k->r;
        *pr = rr * ip + (i < ip ? i : i - ip);
        SRC("mlp.experts.%" PRId64 ".%s_proj.weight", k->experts[j], i < ip ? "gate" : "up");
        return 1;
    }
    if (strcmp(suffix, "mlp.experts.w2_weight") == 0) {
        int64_t ip = t->shape[1], j = row / hd;
        int rr = k->ep ? 0 : k->r;
        *pr = row % hd;
        *pcl = rr * ip + col;
        SRC("mlp.experts.%" PRId64 ".down_proj.weight", k->experts[j]);
        return 1;
    }
    /* norms, router, its bias, kv_a_proj_with_mqa without q_lora: whole on every rank */
    snprintf(pname, len, "%s", name);
#undef SRC
    return 1;
}

/* Check one rank's targets against the rule and mark what they reassemble. */
static void check_rank(model_t *m, const rank_t *k, const wsync_target_t *ts, size_t nt)
{
    char pn[160];
    for (size_t i = 0; i < nt; i++) {
        const wsync_target_t *t = &ts[i];
        uint64_t vol = 0;
        uint32_t *buf = apply_pieces(m, t, &vol);
        const int64_t cols = t->ndim == 2 ? t->shape[1] : 1;
        int bad = 0;
        /* every rule maps a target row into one param row, columns in order: name the source
         * of column 0, the rest follow */
        for (int64_t row = 0; row < t->shape[0] && bad < 3; row++) {
            int64_t pr, pc0, p = -1;
            int has = source_of(k, t, row, 0, pn, sizeof(pn), &pr, &pc0);
            if (has && (p = find_param(m, pn)) < 0) {
                CHECK_MSG(0, "%s: rule names %s, not a param", t->name, pn);
                bad++;
                continue;
            }
            const int64_t pcols = has && m->p[p].ndim == 2 ? m->p[p].shape[1] : 1;
            for (int64_t col = 0; col < cols && bad < 3; col++) {
                uint32_t got = buf[row * cols + col];
                if (!has) {
                    if (got != 0) {
                        CHECK_MSG(0, "%s [%" PRId64 ", %" PRId64 "] should be padding", t->name,
                                  row, col);
                        bad++;
                    }
                    continue;
                }
                uint64_t idx = (uint64_t)(pr * pcols + pc0 + col);
                if (got != m->base[p] + idx) {
                    CHECK_MSG(0, "%s [%" PRId64 ", %" PRId64 "] (T %d r %d%s) holds id %u, vLLM's "
                                 "rule says %s [%" PRId64 ", %" PRId64 "]",
                              t->name, row, col, k->t, k->r, k->ep ? " EP" : "", got, pn, pr,
                              pc0 + col);
                    bad++;
                    continue;
                }
                m->seen[p][idx] = 1;
            }
        }
        free(buf);
    }
}

/* Every param element reassembled from some rank. */
static void check_covered(const model_t *m, const char *what)
{
    for (size_t p = 0; p < m->n; p++) {
        uint64_t vol = 1;
        for (int d = 0; d < m->p[p].ndim; d++)
            vol *= (uint64_t)m->p[p].shape[d];
        uint64_t missing = 0;
        for (uint64_t i = 0; i < vol; i++)
            missing += !m->seen[p][i];
        CHECK_MSG(missing == 0, "%s: %" PRIu64 " elements of %s are on no rank", what, missing,
                  m->p[p].name);
    }
}

/* All ranks of TP size t (EP size ep: 0 none) reassembled. */
static void reassemble(const wsync_model_config_t *c, int t, int ep, wsync_expert_placement_t pl,
                       const char *what)
{
    model_t m;
    if (model_new(&m, c) != 0) {
        CHECK_MSG(0, "%s: params: %s", what, wsync_last_error());
        return;
    }
    const int nranks = ep > 1 ? ep : t;
    for (int g = 0; g < nranks; g++) {
        rank_t k;
        memset(&k, 0, sizeof(k));
        k.c = c;
        k.t = t;
        k.r = g % t;
        k.ep = ep > 1;
        k.vocab_pad = 64;
        if (k.ep)
            experts_of(c->num_experts, g, ep, pl, k.experts, &k.nlocal);
        else
            experts_of(c->num_experts, 0, 1, pl, k.experts, &k.nlocal);

        wsync_tp_options_t o = WSYNC_TP_OPTIONS_INIT;
        o.ep_size = ep;
        o.ep_rank = g;
        o.expert_placement = pl;
        wsync_target_t *ts = NULL;
        size_t nt = 0;
        wsync_status_t st = wsync_layout_tp_targets(c, k.r, t, &o, &ts, &nt);
        CHECK_MSG(st == WSYNC_OK, "%s rank %d: %s", what, g, wsync_last_error());
        if (st != WSYNC_OK)
            continue;
        check_rank(&m, &k, ts, nt);

        /* the library's own expert map agrees with determine_expert_map as written here */
        if (k.ep) {
            int64_t lib[512], n = 0;
            CHECK_OK(wsync_layout_local_experts(c->num_experts, g, ep, pl, lib, &n));
            CHECK(n == k.nlocal && memcmp(lib, k.experts, (size_t)n * sizeof(int64_t)) == 0);
        }
        wsync_layout_targets_free(ts, nt);
    }
    check_covered(&m, what);
    model_free(&m);
}

/* A small DeepSeek-V2 without q_lora and 10 experts, two dense layers (one by moe_layer_freq). */
#define DSV2_NOQ                                                                              \
    "{\"model_type\": \"deepseek_v2\", \"hidden_size\": 32, \"num_hidden_layers\": 4,"         \
    " \"num_attention_heads\": 4, \"intermediate_size\": 48, \"vocab_size\": 100,"             \
    " \"q_lora_rank\": null, \"kv_lora_rank\": 8, \"qk_nope_head_dim\": 6, \"qk_rope_head_dim\":" \
    " 2, \"v_head_dim\": 4, \"n_routed_experts\": 10, \"n_shared_experts\": 2,"                \
    " \"moe_intermediate_size\": 8, \"num_experts_per_tok\": 2, \"first_k_dense_replace\": 1,"  \
    " \"moe_layer_freq\": 2, \"topk_method\": \"noaux_tc\", \"n_group\": 2, \"topk_group\": 1}"

static void layouts_reassemble(void)
{
    wsync_model_config_t q, d, v2, qd;
    CHECK_OK(wsync_model_config_load(QWEN_MOE "/config.json", &q));
    CHECK_OK(wsync_model_config_load(DEEPSEEK "/config.json", &d));
    CHECK_OK(parse(DSV2_NOQ, &v2));
    /* Qwen3-MoE with a dense layer (mlp_only_layers) */
    CHECK_OK(parse("{\"model_type\": \"qwen3_moe\", \"hidden_size\": 32, \"num_hidden_layers\": 2,"
                   " \"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"head_dim\": 8,"
                   " \"intermediate_size\": 16, \"vocab_size\": 90, \"num_experts\": 6,"
                   " \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 12,"
                   " \"mlp_only_layers\": [1], \"tie_word_embeddings\": true}",
                   &qd));

    const int tps[3] = {1, 2, 4};
    for (int i = 0; i < 3; i++) {
        char what[64];
        snprintf(what, sizeof(what), "qwen3_moe tiny TP %d", tps[i]);
        reassemble(&q, tps[i], 0, WSYNC_EXPERT_LINEAR, what);
        snprintf(what, sizeof(what), "deepseek_v3 tiny TP %d", tps[i]);
        reassemble(&d, tps[i], 0, WSYNC_EXPERT_LINEAR, what);
        snprintf(what, sizeof(what), "deepseek_v2 no-q_lora TP %d", tps[i]);
        reassemble(&v2, tps[i], 0, WSYNC_EXPERT_LINEAR, what);
        snprintf(what, sizeof(what), "qwen3_moe with a dense layer TP %d", tps[i]);
        reassemble(&qd, tps[i], 0, WSYNC_EXPERT_LINEAR, what);
    }
    /* EP = TP x DP: (T, EP) = (1, 2), (2, 2), (1, 4), (2, 4), (4, 4) */
    const int eps[][2] = {{1, 2}, {2, 2}, {1, 4}, {2, 4}, {4, 4}};
    for (size_t i = 0; i < sizeof(eps) / sizeof(eps[0]); i++)
        for (int pl = 0; pl < 2; pl++) {
            char what[80];
            snprintf(what, sizeof(what), "qwen3_moe tiny T %d EP %d placement %d", eps[i][0],
                     eps[i][1], pl);
            reassemble(&q, eps[i][0], eps[i][1], (wsync_expert_placement_t)pl, what);
            snprintf(what, sizeof(what), "deepseek_v3 tiny T %d EP %d placement %d", eps[i][0],
                     eps[i][1], pl);
            reassemble(&d, eps[i][0], eps[i][1], (wsync_expert_placement_t)pl, what);
        }
    /* E not divisible by EP: 10 experts over 4 (3, 3, 2, 2), 8 over 3, 6 over 4 */
    for (int pl = 0; pl < 2; pl++) {
        reassemble(&v2, 1, 4, (wsync_expert_placement_t)pl, "deepseek_v2 E 10 EP 4");
        reassemble(&v2, 2, 4, (wsync_expert_placement_t)pl, "deepseek_v2 E 10 T 2 EP 4");
        reassemble(&d, 1, 3, (wsync_expert_placement_t)pl, "deepseek_v3 tiny EP 3");
        reassemble(&qd, 1, 4, (wsync_expert_placement_t)pl, "qwen3_moe E 6 EP 4");
    }
}

static void local_experts(void)
{
    int64_t e[8], n = -1;
    const int64_t lin[4][3] = {{0, 1, 2}, {3, 4, 5}, {6, 7, -1}, {8, 9, -1}};
    const int64_t rr[4][3] = {{0, 4, 8}, {1, 5, 9}, {2, 6, -1}, {3, 7, -1}};
    for (int r = 0; r < 4; r++) {
        CHECK_OK(wsync_layout_local_experts(10, r, 4, WSYNC_EXPERT_LINEAR, e, &n));
        CHECK(n == (r < 2 ? 3 : 2));
        for (int j = 0; j < n; j++)
            CHECK(e[j] == lin[r][j]);
        CHECK_OK(wsync_layout_local_experts(10, r, 4, WSYNC_EXPERT_ROUND_ROBIN, e, &n));
        CHECK(n == (r < 2 ? 3 : 2));
        for (int j = 0; j < n; j++)
            CHECK(e[j] == rr[r][j]);
    }
    CHECK_OK(wsync_layout_local_experts(2, 3, 4, WSYNC_EXPERT_LINEAR, e, &n));
    CHECK(n == 0);                               /* more ranks than experts */
    n = 77;
    CHECK_ST(wsync_layout_local_experts(8, 4, 4, WSYNC_EXPERT_LINEAR, e, &n), WSYNC_ERR_INVALID);
    CHECK(n == 77);
    CHECK_ST(wsync_layout_local_experts(0, 0, 1, WSYNC_EXPERT_LINEAR, e, &n), WSYNC_ERR_INVALID);
    CHECK_ST(wsync_layout_local_experts(8, 0, 1, (wsync_expert_placement_t)7, e, &n),
             WSYNC_ERR_INVALID);
}

static void expert_builders(void)
{
    wsync_param_t g[2], u[2], dn[2];
    wsync_target_t t;
    const char *gn[2] = {"e0.gate", "e1.gate"}, *un[2] = {"e0.up", "e1.up"};
    const char *dnn[2] = {"e0.down", "e1.down"};
    for (int j = 0; j < 2; j++) {
        memset(&g[j], 0, sizeof(g[j]));
        g[j].name = gn[j];
        g[j].dtype = WSYNC_DTYPE_BF16;
        g[j].ndim = 2;
        g[j].shape[0] = 12;
        g[j].shape[1] = 8;
        u[j] = g[j];
        u[j].name = un[j];
        dn[j] = g[j];
        dn[j].name = dnn[j];
        dn[j].shape[0] = 8;
        dn[j].shape[1] = 12;
    }
    CHECK_OK(wsync_layout_moe_w13("w13", g, u, 2, 1, 3, &t));
    CHECK(t.ndim == 2 && t.shape[0] == 2 * 2 * 4 && t.shape[1] == 8 && t.npieces == 4);
    CHECK(strcmp(t.pieces[1].param.name, "e0.up") == 0 && t.pieces[1].src.start[0] == 4);
    CHECK(t.pieces[1].src.len[0] == 4 && t.pieces[1].dst_start[0] == 4);
    CHECK(strcmp(t.pieces[2].param.name, "e1.gate") == 0 && t.pieces[2].dst_start[0] == 8);
    /* FP8 block scales of the matrix = vLLM's [E_l, 2 I_p / bn, ceil(Hd / bk)] */
    t.dtype = WSYNC_DTYPE_F8E4M3FN;
    t.quant.scheme = WSYNC_QUANT_BLOCK;
    t.quant.block_rows = 4;
    t.quant.block_cols = 8;
    CHECK(wsync_target_scale_count(&t) == 2 * (8 / 4) * 1);
    wsync_layout_target_free(&t);
    CHECK_OK(wsync_layout_moe_w2("w2", dn, 2, 2, 3, &t));
    CHECK(t.ndim == 2 && t.shape[0] == 16 && t.shape[1] == 4 && t.npieces == 2);
    CHECK(t.pieces[1].src.start[1] == 8 && t.pieces[1].src.len[1] == 4);
    CHECK(t.pieces[1].dst_start[0] == 8);
    wsync_layout_target_free(&t);

    /* a 3-D FP8 target's scales are its [prod(leading), last] matrix's */
    wsync_target_t x;
    memset(&x, 0, sizeof(x));
    x.dtype = WSYNC_DTYPE_F8E4M3FN;
    x.ndim = 3;
    x.shape[0] = 8;
    x.shape[1] = 128;
    x.shape[2] = 96;
    x.quant.scheme = WSYNC_QUANT_BLOCK;
    x.quant.block_rows = 16;
    x.quant.block_cols = 32;
    CHECK(wsync_target_scale_count(&x) == 8 * (128 / 16) * (96 / 32));
    x.quant.scheme = WSYNC_QUANT_CHANNEL;
    CHECK(wsync_target_scale_count(&x) == 8 * 128);

    memset(&t, 0x33, sizeof(t));
    wsync_target_t before = t;
    CHECK_ST(wsync_layout_moe_w13("w13", g, u, 2, 0, 5, &t), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("w13: moe_intermediate_size I = 12 is not divisible by tp_size 5");
    CHECK(memcmp(&t, &before, sizeof(t)) == 0);
    CHECK_ST(wsync_layout_moe_w2("w2", dn, 2, 0, 5, &t), WSYNC_ERR_CONFIG);
    u[1].shape[0] = 6;
    CHECK_ST(wsync_layout_moe_w13("w13", g, u, 2, 0, 1, &t), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("e1.up");
    CHECK_ST(wsync_layout_moe_w13("w13", g, u, 0, 0, 1, &t), WSYNC_ERR_INVALID);
    CHECK_ST(wsync_layout_moe_w2("w2", dn, 2, 3, 3, &t), WSYNC_ERR_INVALID);

    /* rows of the fused matrices past int64 (caller-made params): refused, not wrapped */
    u[1].shape[0] = 12;
    for (int j = 0; j < 2; j++) {
        g[j].shape[0] = u[j].shape[0] = (int64_t)1 << 62;
        dn[j].shape[0] = (int64_t)1 << 62;
    }
    CHECK_ST(wsync_layout_moe_w13("w13", g, u, 2, 0, 1, &t), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("w13: 2 experts of 2 x 4611686018427387904 rows overflow int64");
    CHECK(memcmp(&t, &before, sizeof(t)) == 0);
    CHECK_ST(wsync_layout_moe_w2("w2", dn, 2, 0, 1, &t), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("w2: 2 experts of 4611686018427387904 rows overflow int64");
    CHECK(memcmp(&t, &before, sizeof(t)) == 0);
}

/* The target list of the tiny DeepSeek at TP 2 (order, names, shapes, dtypes). */
static void deepseek_target_order(void)
{
    wsync_model_config_t c;
    wsync_target_t *t = NULL;
    size_t n = 0;
    CHECK_OK(wsync_model_config_load(DEEPSEEK "/config.json", &c));
    wsync_tp_options_t o = WSYNC_TP_OPTIONS_INIT;
    o.quant.scheme = WSYNC_QUANT_BLOCK;
    o.quant.block_rows = 16;
    o.quant.block_cols = 32;
    CHECK_OK(wsync_layout_tp_targets(&c, 1, 2, &o, &t, &n));
    const struct {
        const char *name;
        int64_t r, c;
        wsync_dtype_t dtype;
    } want[] = {
        {"model.embed_tokens.weight", 192, 128, WSYNC_DTYPE_BF16},
        {"model.layers.0.input_layernorm.weight", 128, 0, WSYNC_DTYPE_BF16},
        {"model.layers.0.self_attn.fused_qkv_a_proj.weight", 64 + 32 + 16, 128,
         WSYNC_DTYPE_F8E4M3FN},
        {"model.layers.0.self_attn.q_a_layernorm.weight", 64, 0, WSYNC_DTYPE_BF16},
        {"model.layers.0.self_attn.q_b_proj.weight", 2 * 48, 64, WSYNC_DTYPE_F8E4M3FN},
        {"model.layers.0.self_attn.kv_a_layernorm.weight", 32, 0, WSYNC_DTYPE_BF16},
        {"model.layers.0.self_attn.kv_b_proj.weight", 2 * 64, 32, WSYNC_DTYPE_F8E4M3FN},
        {"model.layers.0.self_attn.o_proj.weight", 128, 64, WSYNC_DTYPE_F8E4M3FN},
        {"model.layers.0.post_attention_layernorm.weight", 128, 0, WSYNC_DTYPE_BF16},
        {"model.layers.0.mlp.gate_up_proj.weight", 256, 128, WSYNC_DTYPE_F8E4M3FN},
        {"model.layers.0.mlp.down_proj.weight", 128, 128, WSYNC_DTYPE_F8E4M3FN},
        {"model.layers.1.input_layernorm.weight", 128, 0, WSYNC_DTYPE_BF16},
        {"model.layers.1.self_attn.fused_qkv_a_proj.weight", 112, 128, WSYNC_DTYPE_F8E4M3FN},
        {"model.layers.1.self_attn.q_a_layernorm.weight", 64, 0, WSYNC_DTYPE_BF16},
        {"model.layers.1.self_attn.q_b_proj.weight", 96, 64, WSYNC_DTYPE_F8E4M3FN},
        {"model.layers.1.self_attn.kv_a_layernorm.weight", 32, 0, WSYNC_DTYPE_BF16},
        {"model.layers.1.self_attn.kv_b_proj.weight", 128, 32, WSYNC_DTYPE_F8E4M3FN},
        {"model.layers.1.self_attn.o_proj.weight", 128, 64, WSYNC_DTYPE_F8E4M3FN},
        {"model.layers.1.post_attention_layernorm.weight", 128, 0, WSYNC_DTYPE_BF16},
        {"model.layers.1.mlp.gate.weight", 8, 128, WSYNC_DTYPE_BF16},
        {"model.layers.1.mlp.gate.e_score_correction_bias", 8, 0, WSYNC_DTYPE_F32},
        {"model.layers.1.mlp.experts.w13_weight", 8 * 2 * 32, 128, WSYNC_DTYPE_F8E4M3FN},
        {"model.layers.1.mlp.experts.w2_weight", 8 * 128, 32, WSYNC_DTYPE_F8E4M3FN},
        {"model.layers.1.mlp.shared_experts.gate_up_proj.weight", 64, 128, WSYNC_DTYPE_F8E4M3FN},
        {"model.layers.1.mlp.shared_experts.down_proj.weight", 128, 32, WSYNC_DTYPE_F8E4M3FN},
        {"model.layers.2.input_layernorm.weight", 128, 0, WSYNC_DTYPE_BF16},
    };
    const size_t nw = sizeof(want) / sizeof(want[0]);
    CHECK(n == 1 + 10 + 2 * 14 + 2);
    for (size_t i = 0; i < nw && i < n; i++) {
        CHECK_MSG(strcmp(t[i].name, want[i].name) == 0, "target %zu is %s, not %s", i, t[i].name,
                  want[i].name);
        CHECK_MSG(t[i].shape[0] == want[i].r && (want[i].c == 0 ? t[i].ndim == 1
                                                                : t[i].shape[1] == want[i].c),
                  "%s: shape", t[i].name);
        CHECK_MSG(t[i].dtype == want[i].dtype, "%s: dtype %s", t[i].name,
                  wsync_dtype_name(t[i].dtype));
    }
    /* w13's scales: vLLM's [8, 2 * 32 / 16, 128 / 32] */
    CHECK(n > 21 && wsync_target_scale_count(&t[21]) == 8 * 4 * 4);
    /* fused_qkv_a: kv_a's 48 rows end in a partial block, allowed as the last part */
    CHECK(wsync_target_scale_count(&t[2]) == 7 * 4);
    wsync_layout_targets_free(t, n);
}

static void tp_moe_refusals(void)
{
    wsync_model_config_t q, d, c;
    wsync_target_t *t = (wsync_target_t *)0x1, *t0 = t;
    size_t n = 99;
    wsync_tp_options_t o = WSYNC_TP_OPTIONS_INIT;
    CHECK_OK(wsync_model_config_load(QWEN_MOE "/config.json", &q));
    CHECK_OK(wsync_model_config_load(DEEPSEEK "/config.json", &d));

    CHECK_ST(wsync_layout_tp_targets(&d, 0, 8, NULL, &t, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("num_attention_heads H = 4 is not divisible by tp_size T = 8");
    CHECK(t == t0 && n == 99);

    /* experts split inside by TP need moe_I % T; with EP they do not */
    CHECK_OK(parse("{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, \"num_hidden_layers\": 1,"
                   " \"num_attention_heads\": 8, \"num_key_value_heads\": 8, \"intermediate_size\":"
                   " 64, \"vocab_size\": 128, \"num_experts\": 16, \"num_experts_per_tok\": 2,"
                   " \"moe_intermediate_size\": 36}",
                   &c));
    CHECK_ST(wsync_layout_tp_targets(&c, 0, 8, NULL, &t, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("model.layers.0.mlp.experts.w13_weight: moe_intermediate_size I = 36 is not "
                  "divisible by tp_size T = 8");
    o.ep_size = 8;
    o.ep_rank = 3;
    CHECK_OK(wsync_layout_tp_targets(&c, 3, 8, &o, &t, &n));
    wsync_layout_targets_free(t, n);

    /* the shared experts stay split by TP under EP */
    CHECK_OK(parse("{\"model_type\": \"deepseek_v3\", \"hidden_size\": 64, \"num_hidden_layers\":"
                   " 1, \"num_attention_heads\": 8, \"intermediate_size\": 64, \"vocab_size\": 128,"
                   " \"n_routed_experts\": 16, \"n_group\": 1, \"topk_group\": 1,"
                   " \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 36,"
                   " \"first_k_dense_replace\": 0, \"q_lora_rank\": 32, \"kv_lora_rank\": 16,"
                   " \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 8, \"v_head_dim\": 8}",
                   &c));
    CHECK_ST(wsync_layout_tp_targets(&c, 3, 8, &o, &t, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("model.layers.0.mlp.shared_experts.gate_proj.weight: n_shared_experts * "
                  "moe_intermediate_size = 36 is not divisible by tp_size T = 8");

    /* EP size and rank */
    o.ep_size = 16;
    o.ep_rank = 1;
    CHECK_ST(wsync_layout_tp_targets(&q, 1, 2, &o, &t, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("ep_size 16 exceeds the 8 experts");
    o.ep_size = 3;
    o.ep_rank = 1;
    CHECK_ST(wsync_layout_tp_targets(&q, 1, 2, &o, &t, &n), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("ep_size 3 and ep_rank 1 do not fit tp_rank 1 of 2");
    o.ep_size = 4;
    o.ep_rank = 2;
    CHECK_ST(wsync_layout_tp_targets(&q, 1, 2, &o, &t, &n), WSYNC_ERR_INVALID);
    o.ep_rank = 4;
    CHECK_ST(wsync_layout_tp_targets(&q, 0, 2, &o, &t, &n), WSYNC_ERR_INVALID);
    wsync_model_config_t dense;
    CHECK_OK(wsync_model_config_load(TESTDATA "/hf_qwen3_tiny/config.json", &dense));
    o.ep_rank = 1;
    CHECK_ST(wsync_layout_tp_targets(&dense, 1, 2, &o, &t, &n), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("no experts");

    /* block FP8: the experts' partitions must be whole blocks */
    wsync_tp_options_t f = WSYNC_TP_OPTIONS_INIT;
    f.quant.scheme = WSYNC_QUANT_BLOCK;
    f.quant.block_rows = 32;
    f.quant.block_cols = 32;
    CHECK_ST(wsync_layout_tp_targets(&q, 0, 4, &f, &t, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("model.layers.0.mlp.experts.w13_weight: block FP8 32x32: moe_intermediate_size"
                  " = 64 at T = 4 gives 16 gate and up rows per rank, not a multiple of 32");
    CHECK_OK(wsync_layout_tp_targets(&q, 0, 2, &f, &t, &n));
    wsync_layout_targets_free(t, n);
    f.ep_size = 4;                               /* whole experts: I_p = 64 */
    f.ep_rank = 3;
    CHECK_OK(wsync_layout_tp_targets(&q, 3, 4, &f, &t, &n));
    wsync_layout_targets_free(t, n);
    f.ep_size = 0;
    f.quant.block_rows = 128;
    f.quant.block_cols = 128;
    /* DeepSeek: q_lora 64 rows of [q_a; kv_a] are not whole 128-row blocks */
    CHECK_ST(wsync_layout_tp_targets(&d, 0, 1, &f, &t, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("fused_qkv_a_proj.weight: block FP8 128x128: q_lora_rank = 64");
    f.quant.block_rows = 16;
    f.quant.block_cols = 64;
    /* w2's columns: I_p = 32 at T = 2 */
    CHECK_ST(wsync_layout_tp_targets(&d, 0, 2, &f, &t, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("model.layers.1.mlp.experts.w2_weight: block FP8 16x64: moe_intermediate_size ="
                  " 64 at T = 2 gives 32 columns per rank, not a multiple of 64");
    /* o_proj's columns: 4 heads of v_head_dim 32 at T = 4 */
    CHECK_ST(wsync_layout_tp_targets(&d, 0, 4, &f, &t, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("model.layers.0.self_attn.o_proj.weight: block FP8 16x64: H*v_head_dim = 128 at"
                  " T = 4 gives 32 columns per rank, not a multiple of 64");

    /* vocab */
    t = t0;
    n = 99;
    wsync_tp_options_t v = WSYNC_TP_OPTIONS_INIT;
    v.vocab_pad = 129;
    CHECK_ST(wsync_layout_tp_targets(&d, 0, 2, &v, &t, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("model.embed_tokens.weight: padded vocab Vp = 387");
    CHECK(t == t0 && n == 99);
}

/* FSDP-2 senders to TP-2 and EP-2 receivers of the tiny DeepSeek through the plan compiler and
 * executor (plan_sim): every target byte equals the one vLLM's rule names. */
static void deepseek_through_plan(void)
{
    wsync_model_config_t c;
    CHECK_OK(wsync_model_config_load(DEEPSEEK "/config.json", &c));
    model_t m;
    if (model_new(&m, &c) != 0)
        return;
    /* the param values: f32 holding the element ids (exact up to 2^24) */
    wsync_shard_t *sh = NULL;
    size_t nsh0 = 0, nsh1 = 0;
    wsync_shard_t *s0 = NULL, *s1 = NULL;
    CHECK_OK(wsync_layout_fsdp_shards(&c, WSYNC_DTYPE_F32, 0, 2, &s0, &nsh0));
    CHECK_OK(wsync_layout_fsdp_shards(&c, WSYNC_DTYPE_F32, 1, 2, &s1, &nsh1));
    if (s0 == NULL || s1 == NULL)
        goto out;
    size_t nsh = nsh0 + nsh1;
    sh = calloc(nsh, sizeof(*sh));
    uint32_t *ss = calloc(nsh, sizeof(*ss));
    float **data = calloc(nsh, sizeof(*data));
    for (size_t i = 0; i < nsh; i++) {
        sh[i] = i < nsh0 ? s0[i] : s1[i - nsh0];
        ss[i] = i < nsh0 ? 0 : 1;
        int64_t k = find_param(&m, sh[i].param.name);
        const int64_t cols = sh[i].param.ndim == 2 ? sh[i].param.shape[1] : 1;
        const int64_t rows = sh[i].box.len[0];
        data[i] = calloc((size_t)(rows * cols) + 1, sizeof(float));
        for (int64_t r = 0; r < rows; r++)
            for (int64_t cc = 0; cc < cols; cc++)
                data[i][r * cols + cc] =
                    (float)(m.base[k] + (uint32_t)((sh[i].box.start[0] + r) * cols + cc));
        sh[i].data = data[i];
    }
    CHECK(m.base[m.n - 1] < (1u << 24));

    for (int mode = 0; mode < 2; mode++) {           /* TP 2, then T 1 x EP 2 */
        wsync_target_t *ts[2] = {NULL, NULL};
        size_t nts[2] = {0, 0};
        rank_t k[2];
        for (int r = 0; r < 2; r++) {
            wsync_tp_options_t o = WSYNC_TP_OPTIONS_INIT;
            o.param_dtype = WSYNC_DTYPE_F32;
            memset(&k[r], 0, sizeof(k[r]));
            k[r].c = &c;
            k[r].vocab_pad = 64;
            if (mode == 0) {
                k[r].t = 2;
                k[r].r = r;
                experts_of(c.num_experts, 0, 1, WSYNC_EXPERT_LINEAR, k[r].experts, &k[r].nlocal);
                CHECK_OK(wsync_layout_tp_targets(&c, r, 2, &o, &ts[r], &nts[r]));
            } else {
                o.ep_size = 2;
                o.ep_rank = r;
                k[r].t = 1;
                k[r].ep = 1;
                experts_of(c.num_experts, r, 2, WSYNC_EXPERT_LINEAR, k[r].experts, &k[r].nlocal);
                CHECK_OK(wsync_layout_tp_targets(&c, 0, 1, &o, &ts[r], &nts[r]));
            }
        }
        size_t nt = nts[0] + nts[1];
        wsync_target_t *all = calloc(nt + 1, sizeof(*all));
        uint32_t *tr = calloc(nt + 1, sizeof(*tr));
        for (size_t i = 0; i < nt; i++) {
            all[i] = i < nts[0] ? ts[0][i] : ts[1][i - nts[0]];
            tr[i] = i < nts[0] ? 0 : 1;
            all[i].dtype = WSYNC_DTYPE_F32;
            all[i].data = calloc(wsync_target_bytes(&all[i]) / 4 + 1, sizeof(float));
        }
        wsync_status_t st = plan_sim_run_all(sh, ss, nsh, all, tr, nt, 2, 2, 1u << 16, NULL, NULL);
        CHECK_MSG(st == WSYNC_OK, "plan %s: %s", mode ? "EP 2" : "TP 2", wsync_last_error());
        char pn[160];
        int bad = 0;
        for (size_t i = 0; st == WSYNC_OK && i < nt && bad < 3; i++) {
            const rank_t *kr = &k[tr[i]];
            const int64_t cols = all[i].ndim == 2 ? all[i].shape[1] : 1;
            const float *v = all[i].data;
            for (int64_t row = 0; row < all[i].shape[0] && bad < 3; row++)
                for (int64_t col = 0; col < cols; col++) {
                    int64_t pr, pc;
                    float want = 0.0f;
                    if (source_of(kr, &all[i], row, col, pn, sizeof(pn), &pr, &pc)) {
                        int64_t p = find_param(&m, pn);
                        const int64_t pcols = m.p[p].ndim == 2 ? m.p[p].shape[1] : 1;
                        want = (float)(m.base[p] + (uint32_t)(pr * pcols + pc));
                    }
                    if (v[row * cols + col] != want) {
                        CHECK_MSG(0, "%s %s [%" PRId64 ", %" PRId64 "]: %g, want %g",
                                  mode ? "EP" : "TP", all[i].name, row, col,
                                  (double)v[row * cols + col], (double)want);
                        bad++;
                        break;
                    }
                }
        }
        for (size_t i = 0; i < nt; i++)
            free(all[i].data);
        free(all);
        free(tr);
        wsync_layout_targets_free(ts[0], nts[0]);
        wsync_layout_targets_free(ts[1], nts[1]);
    }
    for (size_t i = 0; i < nsh; i++)
        free(data[i]);
    free(data);
    free(ss);
    free(sh);
out:
    wsync_layout_shards_free(s0, nsh0);
    wsync_layout_shards_free(s1, nsh1);
    model_free(&m);
}

int main(void)
{
    RUN(config_qwen3_moe_tiny);
    RUN(config_deepseek_v3_tiny);
    RUN(config_deepseek_published);
    RUN(config_moe_defaults);
    RUN(config_moe_refusals);
    RUN(params_tiny_models);
    RUN(local_experts);
    RUN(expert_builders);
    RUN(layouts_reassemble);
    RUN(deepseek_target_order);
    RUN(tp_moe_refusals);
    RUN(deepseek_through_plan);
    return check_summary();
}
