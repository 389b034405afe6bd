/* HF config.json of the Llama, Qwen2, Qwen3, Qwen3-MoE and DeepSeek-V2/V3 families →
 * wsync_model_config_t, and the list of checkpoint params such a model has. Defaults follow
 * transformers' configuration_llama.py, configuration_qwen2.py and configuration_qwen3.py (v4.5x
 * and v5 agree on every value used here), configuration_qwen3_moe.py, configuration_deepseek_v2.py
 * and configuration_deepseek_v3.py (v5; src/transformers/models/<family>/); the header lists
 * them. */
#include "reshard/model.h"

#include "core/status.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Sizes are capped so that any product of two (V * Hd, (H + 2K) * D) fits in int64. */
#define SIZE_MAX_ALLOWED INT32_MAX

/* Config files are small; anything this large is not a config. */
#define CONFIG_FILE_MAX (16u << 20)

/* Most routed experts a model may have (published models: 8 to 512); keeps the param list of any
 * accepted config listable. */
#define EXPERTS_MAX 65536

/* A fused expert target [E, 2 * Im, Hd] must stay far inside int64 elements (and bytes). */
#define EXPERT_ELEMS_MAX ((int64_t)1 << 56)

const char *wsync_model_type_name(wsync_model_type_t type)
{
    switch (type) {
    case WSYNC_MODEL_LLAMA: return "llama";
    case WSYNC_MODEL_QWEN2: return "qwen2";
    case WSYNC_MODEL_QWEN3: return "qwen3";
    case WSYNC_MODEL_QWEN3_MOE: return "qwen3_moe";
    case WSYNC_MODEL_DEEPSEEK_V2: return "deepseek_v2";
    case WSYNC_MODEL_DEEPSEEK_V3: return "deepseek_v3";
    }
    return "?";
}

/* ------------------------------------------------------------------------------------------ */
/* JSON fields                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/* A JSON value as it appeared, shortened, for error messages. */
static void show(const json_t *v, char *buf, size_t size)
{
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (s == NULL) {
        snprintf(buf, size, "?");
        return;
    }
    if (strlen(s) >= size && size > 4)
        snprintf(buf, size, "%.*s...", (int)(size - 4), s);
    else
        snprintf(buf, size, "%s", s);
    free(s);
}

/* An absent key and an explicit null both mean "use the default", as in HF. */
static json_t *field(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

/* Integer size field. *found tells whether the JSON had it. */
static wsync_status_t get_size(const char *src, json_t *root, const char *key, int required,
                               int64_t *out, int *found)
{
    char shown[64];
    json_t *v = field(root, key);

    *found = v != NULL;
    if (v == NULL) {
        if (required)
            return wsync_err(WSYNC_ERR_CONFIG, "%s: missing required field %s", src, key);
        return WSYNC_OK;
    }
    if (!json_is_integer(v)) {
        show(v, shown, sizeof(shown));
        return wsync_err(WSYNC_ERR_CONFIG, "%s: %s must be an integer, got %s", src, key, shown);
    }
    json_int_t x = json_integer_value(v);
    if (x < 1 || x > SIZE_MAX_ALLOWED)
        return wsync_err(WSYNC_ERR_CONFIG, "%s: %s = %" JSON_INTEGER_FORMAT " must be in [1, %d]",
                         src, key, x, SIZE_MAX_ALLOWED);
    *out = (int64_t)x;
    return WSYNC_OK;
}

static wsync_status_t get_bool(const char *src, json_t *root, const char *key, int *out)
{
    char shown[64];
    json_t *v = field(root, key);

    if (v == NULL)
        return WSYNC_OK;
    if (!json_is_boolean(v)) {
        show(v, shown, sizeof(shown));
        return wsync_err(WSYNC_ERR_CONFIG, "%s: %s must be true or false, got %s", src, key, shown);
    }
    *out = json_is_true(v);
    return WSYNC_OK;
}

/* Positive real field (integers accepted: "rope_theta": 10000 is common). */
static wsync_status_t get_positive(const char *src, json_t *obj, const char *where,
                                   const char *key, double *out)
{
    char shown[64];
    json_t *v = field(obj, key);

    if (v == NULL)
        return WSYNC_OK;
    if (!json_is_number(v)) {
        show(v, shown, sizeof(shown));
        return wsync_err(WSYNC_ERR_CONFIG, "%s: %s%s must be a number, got %s", src, where, key,
                         shown);
    }
    double x = json_number_value(v);
    if (!(x > 0.0) || !isfinite(x))
        return wsync_err(WSYNC_ERR_CONFIG, "%s: %s%s = %g must be > 0", src, where, key, x);
    *out = x;
    return WSYNC_OK;
}

static wsync_status_t get_family(const char *src, json_t *root, wsync_model_type_t *type)
{
    static const struct {
        const char *model_type, *architecture;
        wsync_model_type_t type;
    } families[] = {
        {"llama", "LlamaForCausalLM", WSYNC_MODEL_LLAMA},
        {"qwen2", "Qwen2ForCausalLM", WSYNC_MODEL_QWEN2},
        {"qwen3", "Qwen3ForCausalLM", WSYNC_MODEL_QWEN3},
        {"qwen3_moe", "Qwen3MoeForCausalLM", WSYNC_MODEL_QWEN3_MOE},
        {"deepseek_v2", "DeepseekV2ForCausalLM", WSYNC_MODEL_DEEPSEEK_V2},
        {"deepseek_v3", "DeepseekV3ForCausalLM", WSYNC_MODEL_DEEPSEEK_V3},
        /* Kimi-K2 publishes model_type "kimi_k2" on a DeepseekV3ForCausalLM checkpoint (its
         * README: "change model_type to deepseek_v3" for engines that lack the name) */
        {"kimi_k2", "DeepseekV3ForCausalLM", WSYNC_MODEL_DEEPSEEK_V3},
    };
    const size_t nfam = sizeof(families) / sizeof(families[0]);
    char shown[64];
    json_t *mt = field(root, "model_type");

    /* model_type is what AutoConfig dispatches on; architectures only when it is absent */
    if (mt != NULL) {
        if (!json_is_string(mt)) {
            show(mt, shown, sizeof(shown));
            return wsync_err(WSYNC_ERR_CONFIG, "%s: model_type must be a string, got %s", src,
                             shown);
        }
        for (size_t i = 0; i < nfam; i++) {
            if (strcmp(json_string_value(mt), families[i].model_type) == 0) {
                *type = families[i].type;
                return WSYNC_OK;
            }
        }
        show(mt, shown, sizeof(shown));
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: model_type %s is not supported (llama, qwen2, qwen3, qwen3_moe, "
                         "deepseek_v2, deepseek_v3, kimi_k2)",
                         src, shown);
    }
    json_t *arch = field(root, "architectures");
    json_t *a0 = json_is_array(arch) ? json_array_get(arch, 0) : NULL;
    if (!json_is_string(a0))
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: missing required field model_type (and no architectures[0] string)",
                         src);
    for (size_t i = 0; i < nfam; i++) {
        if (strcmp(json_string_value(a0), families[i].architecture) == 0) {
            *type = families[i].type;
            return WSYNC_OK;
        }
    }
    show(a0, shown, sizeof(shown));
    return wsync_err(WSYNC_ERR_CONFIG,
                     "%s: architectures[0] %s is not supported (LlamaForCausalLM, "
                     "Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, "
                     "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM)",
                     src, shown);
}

/* transformers v5: rope_parameters = rope_scaling or rope_parameters, whose rope_theta wins over
 * the top-level one (setdefault); v4 configs only have the top-level rope_theta. */
static wsync_status_t get_rope_theta(const char *src, json_t *root, double *theta)
{
    char shown[64];
    const char *names[2] = {"rope_scaling", "rope_parameters"};
    json_t *rope = NULL;
    const char *rope_name = NULL;

    for (int i = 0; i < 2 && rope == NULL; i++) {
        json_t *v = field(root, names[i]);
        if (v == NULL)
            continue;
        if (!json_is_object(v)) {
            show(v, shown, sizeof(shown));
            return wsync_err(WSYNC_ERR_CONFIG, "%s: %s must be an object, got %s", src, names[i],
                             shown);
        }
        rope = v;
        rope_name = names[i];
    }
    if (rope != NULL && field(rope, "rope_theta") != NULL) {
        char where[32];
        snprintf(where, sizeof(where), "%s.", rope_name);
        return get_positive(src, rope, where, "rope_theta", theta);
    }
    return get_positive(src, root, "", "rope_theta", theta);
}

static wsync_status_t get_dtype(const char *src, json_t *root, wsync_dtype_t *dtype)
{
    char shown[64];
    json_t *v = field(root, "dtype");          /* transformers v5 */

    if (v == NULL)
        v = field(root, "torch_dtype");         /* v4 */
    if (v == NULL)
        return WSYNC_OK;
    if (!json_is_string(v)) {
        show(v, shown, sizeof(shown));
        return wsync_err(WSYNC_ERR_CONFIG, "%s: dtype must be a string, got %s", src, shown);
    }
    wsync_dtype_t d;
    /* only float dtypes are checkpoint dtypes; anything else is left unknown, not an error,
     * since the dtype never changes a layout */
    if (wsync_dtype_parse(json_string_value(v), &d) == WSYNC_OK &&
        (d == WSYNC_DTYPE_BF16 || d == WSYNC_DTYPE_F16 || d == WSYNC_DTYPE_F32))
        *dtype = d;
    return WSYNC_OK;
}

/* Integer field in [lo, hi]; absent or null leaves *out (the default). */
static wsync_status_t get_int(const char *src, json_t *root, const char *key, int64_t lo,
                              int64_t hi, int64_t *out)
{
    char shown[64];
    json_t *v = field(root, key);

    if (v == NULL)
        return WSYNC_OK;
    if (!json_is_integer(v)) {
        show(v, shown, sizeof(shown));
        return wsync_err(WSYNC_ERR_CONFIG, "%s: %s must be an integer, got %s", src, key, shown);
    }
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: %s = %" JSON_INTEGER_FORMAT " must be in [%" PRId64 ", %" PRId64 "]",
                         src, key, x, lo, hi);
    *out = (int64_t)x;
    return WSYNC_OK;
}

/* A string field that must be one of names[]; *out = values[i]. Absent or null: default kept. */
static wsync_status_t get_choice(const char *src, json_t *root, const char *key,
                                 const char *const *names, const int *values, int n, int *out)
{
    char shown[64], list[160] = "";
    json_t *v = field(root, key);

    if (v == NULL)
        return WSYNC_OK;
    if (json_is_string(v))
        for (int i = 0; i < n; i++)
            if (strcmp(json_string_value(v), names[i]) == 0) {
                *out = values[i];
                return WSYNC_OK;
            }
    for (int i = 0; i < n; i++) {
        size_t used = strlen(list);
        snprintf(list + used, sizeof(list) - used, "%s%s", i ? ", " : "", names[i]);
    }
    show(v, shown, sizeof(shown));
    return wsync_err(WSYNC_ERR_CONFIG, "%s: %s = %s is not supported (%s)", src, key, shown, list);
}

/* qwen3_moe mlp_only_layers: a list of layer indices in [0, num_hidden_layers). */
static wsync_status_t get_mlp_only(const char *src, json_t *root, wsync_model_config_t *c)
{
    char shown[64];
    json_t *v = field(root, "mlp_only_layers");

    if (v == NULL)
        return WSYNC_OK;            /* Qwen3MoeConfig: None -> [] */
    if (!json_is_array(v)) {
        show(v, shown, sizeof(shown));
        return wsync_err(WSYNC_ERR_CONFIG, "%s: mlp_only_layers must be a list of integers, got %s",
                         src, shown);
    }
    if (json_array_size(v) > WSYNC_MODEL_MAX_MLP_ONLY)
        return wsync_err(WSYNC_ERR_CONFIG, "%s: mlp_only_layers has %zu entries, at most %d",
                         src, json_array_size(v), WSYNC_MODEL_MAX_MLP_ONLY);
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e)) {
            show(e, shown, sizeof(shown));
            return wsync_err(WSYNC_ERR_CONFIG, "%s: mlp_only_layers[%zu] must be an integer, got %s",
                             src, i, shown);
        }
        json_int_t x = json_integer_value(e);
        if (x < 0 || x >= c->num_hidden_layers)
            return wsync_err(WSYNC_ERR_CONFIG,
                             "%s: mlp_only_layers[%zu] = %" JSON_INTEGER_FORMAT
                             " is not a layer (num_hidden_layers = %" PRId64 ")",
                             src, i, x, c->num_hidden_layers);
        c->mlp_only_layers[i] = (int32_t)x;
    }
    c->nmlp_only_layers = (int)json_array_size(v);
    return WSYNC_OK;
}

static int is_mla_type(wsync_model_type_t t)
{
    return t == WSYNC_MODEL_DEEPSEEK_V2 || t == WSYNC_MODEL_DEEPSEEK_V3;
}

static int is_moe_type(wsync_model_type_t t)
{
    return t == WSYNC_MODEL_QWEN3_MOE || is_mla_type(t);
}

/* The MoE and MLA fields (families with routed experts). Sizes as in check_config. */
static wsync_status_t check_moe(const char *src, const wsync_model_config_t *c)
{
    const int mla = is_mla_type(c->model_type);
    const int64_t e = c->num_experts;
    const struct {
        const char *name;
        int64_t value, lo;
        int used;
    } ints[] = {
        {"num_experts", e, 1, 1},
        {"num_experts_per_tok", c->num_experts_per_tok, 1, 1},
        {"moe_intermediate_size", c->moe_intermediate_size, 1, 1},
        {"decoder_sparse_step", c->decoder_sparse_step, 1, !mla},
        {"n_shared_experts", c->n_shared_experts, 0, mla},
        {"first_k_dense_replace", c->first_k_dense_replace, 0, mla},
        {"moe_layer_freq", c->moe_layer_freq, 1, mla},
        {"n_group", c->n_group, 1, mla},
        {"topk_group", c->topk_group, 1, mla},
        {"q_lora_rank", c->q_lora_rank, 0, mla},
        {"kv_lora_rank", c->kv_lora_rank, 1, mla},
        {"qk_nope_head_dim", c->qk_nope_head_dim, 1, mla},
        {"qk_rope_head_dim", c->qk_rope_head_dim, 2, mla},
        {"v_head_dim", c->v_head_dim, 1, mla},
    };

    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
        if (ints[i].used && (ints[i].value < ints[i].lo || ints[i].value > SIZE_MAX_ALLOWED))
            return wsync_err(WSYNC_ERR_CONFIG, "%s: %s = %" PRId64 " must be in [%" PRId64 ", %d]",
                             src, ints[i].name, ints[i].value, ints[i].lo, SIZE_MAX_ALLOWED);
    if (e > EXPERTS_MAX)
        return wsync_err(WSYNC_ERR_CONFIG, "%s: %s = %" PRId64 " experts, at most %d", src,
                         mla ? "n_routed_experts" : "num_experts", e, EXPERTS_MAX);
    if (c->num_experts_per_tok > e)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: num_experts_per_tok = %" PRId64 " exceeds the %" PRId64 " experts",
                         src, c->num_experts_per_tok, e);
    if ((double)e * 2.0 * (double)c->moe_intermediate_size * (double)c->hidden_size >=
        (double)EXPERT_ELEMS_MAX)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: %" PRId64 " experts of moe_intermediate_size %" PRId64
                         " and hidden_size %" PRId64 " exceed 2^56 elements per layer",
                         src, e, c->moe_intermediate_size, c->hidden_size);
    if (c->norm_topk_prob != 0 && c->norm_topk_prob != 1)
        return wsync_err(WSYNC_ERR_CONFIG, "%s: norm_topk_prob = %d must be 0 or 1", src,
                         c->norm_topk_prob);
    if (c->nmlp_only_layers < 0 || c->nmlp_only_layers > WSYNC_MODEL_MAX_MLP_ONLY)
        return wsync_err(WSYNC_ERR_CONFIG, "%s: nmlp_only_layers = %d must be in [0, %d]", src,
                         c->nmlp_only_layers, WSYNC_MODEL_MAX_MLP_ONLY);
    for (int i = 0; i < c->nmlp_only_layers; i++)
        if (c->mlp_only_layers[i] < 0 || c->mlp_only_layers[i] >= c->num_hidden_layers)
            return wsync_err(WSYNC_ERR_CONFIG,
                             "%s: mlp_only_layers[%d] = %d is not a layer (num_hidden_layers = "
                             "%" PRId64 ")",
                             src, i, (int)c->mlp_only_layers[i], c->num_hidden_layers);
    if (!mla) {
        if (c->nmlp_only_layers != 0 && c->model_type != WSYNC_MODEL_QWEN3_MOE)
            return wsync_err(WSYNC_ERR_CONFIG, "%s: mlp_only_layers is a qwen3_moe field", src);
        if (c->router_bias || c->scoring_func != WSYNC_ROUTER_SOFTMAX ||
            c->topk_method != WSYNC_TOPK_GREEDY)
            return wsync_err(WSYNC_ERR_CONFIG,
                             "%s: qwen3_moe routes by softmax and plain top-k without a router "
                             "bias (router_bias %d, scoring_func %d, topk_method %d)",
                             src, c->router_bias, (int)c->scoring_func, (int)c->topk_method);
        return WSYNC_OK;
    }

    /* routing: experts split into n_group equal groups, topk_group of them kept */
    if (e % c->n_group != 0)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: n_group = %" PRId64 " does not divide n_routed_experts = %" PRId64,
                         src, c->n_group, e);
    if (c->topk_group > c->n_group)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: topk_group = %" PRId64 " exceeds n_group = %" PRId64, src,
                         c->topk_group, c->n_group);
    if (c->topk_method != WSYNC_TOPK_GREEDY &&
        c->num_experts_per_tok > c->topk_group * (e / c->n_group))
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: num_experts_per_tok = %" PRId64 " exceeds the %" PRId64
                         " experts of topk_group = %" PRId64 " groups",
                         src, c->num_experts_per_tok, c->topk_group * (e / c->n_group),
                         c->topk_group);
    /* noaux_tc scores a group by the sum of its best two experts (topk(2) per group) */
    if (c->topk_method == WSYNC_TOPK_NOAUX_TC && e / c->n_group < 2)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: topk_method noaux_tc needs >= 2 experts per group, n_group = %" PRId64
                         " leaves %" PRId64,
                         src, c->n_group, e / c->n_group);
    if ((unsigned)c->scoring_func > WSYNC_ROUTER_SIGMOID ||
        (unsigned)c->topk_method > WSYNC_TOPK_NOAUX_TC)
        return wsync_err(WSYNC_ERR_CONFIG, "%s: scoring_func %d or topk_method %d is unknown", src,
                         (int)c->scoring_func, (int)c->topk_method);
    if (!(c->routed_scaling_factor > 0.0) || !isfinite(c->routed_scaling_factor))
        return wsync_err(WSYNC_ERR_CONFIG, "%s: routed_scaling_factor = %g must be > 0", src,
                         c->routed_scaling_factor);
    if (c->router_bias != 0 && c->router_bias != 1)
        return wsync_err(WSYNC_ERR_CONFIG, "%s: router_bias = %d must be 0 or 1", src,
                         c->router_bias);

    /* sums and products that become one dim of a param or target stay sizes themselves, so
     * that a dim times another size still fits in int64 */
    const struct {
        const char *what;
        int64_t value;
    } derived[] = {
        {"n_shared_experts * moe_intermediate_size", c->n_shared_experts * c->moe_intermediate_size},
        {"qk_nope_head_dim + v_head_dim", c->qk_nope_head_dim + c->v_head_dim},
        {"q_lora_rank + kv_lora_rank + qk_rope_head_dim",
         c->q_lora_rank + c->kv_lora_rank + c->qk_rope_head_dim},
    };
    for (size_t i = 0; i < sizeof(derived) / sizeof(derived[0]); i++)
        if (derived[i].value > SIZE_MAX_ALLOWED)
            return wsync_err(WSYNC_ERR_CONFIG, "%s: %s = %" PRId64 " exceeds %d", src,
                             derived[i].what, derived[i].value, SIZE_MAX_ALLOWED);

    /* MLA: rope rotates pairs of dims; the derived sizes are what the params' shapes use */
    if (c->qk_rope_head_dim % 2 != 0)
        return wsync_err(WSYNC_ERR_CONFIG, "%s: qk_rope_head_dim = %" PRId64 " must be even", src,
                         c->qk_rope_head_dim);
    if (c->head_dim != c->qk_nope_head_dim + c->qk_rope_head_dim)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: head_dim = %" PRId64 " must be qk_nope_head_dim + qk_rope_head_dim "
                         "= %" PRId64 " for MLA",
                         src, c->head_dim, c->qk_nope_head_dim + c->qk_rope_head_dim);
    if (c->num_key_value_heads != c->num_attention_heads)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: num_key_value_heads = %" PRId64
                         " must equal num_attention_heads = %" PRId64 " for MLA",
                         src, c->num_key_value_heads, c->num_attention_heads);
    if (c->attention_bias || c->o_proj_bias || c->mlp_bias || c->qk_norm)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: %s has no attention or MLP biases and no q/k norms in vLLM "
                         "(attention_bias %d, mlp_bias %d, qk_norm %d)",
                         src, wsync_model_type_name(c->model_type), c->attention_bias, c->mlp_bias,
                         c->qk_norm);
    if (c->model_type == WSYNC_MODEL_DEEPSEEK_V3 && c->moe_layer_freq != 1)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: moe_layer_freq = %" PRId64
                         " is not supported for deepseek_v3 (transformers ignores it, vLLM does "
                         "not)",
                         src, c->moe_layer_freq);
    return WSYNC_OK;
}

static wsync_status_t check_config(const char *src, const wsync_model_config_t *c)
{
    const struct {
        const char *name;
        int64_t value;
    } sizes[] = {
        {"hidden_size", c->hidden_size},
        {"num_hidden_layers", c->num_hidden_layers},
        {"num_attention_heads", c->num_attention_heads},
        {"num_key_value_heads", c->num_key_value_heads},
        {"head_dim", c->head_dim},
        {"intermediate_size", c->intermediate_size},
        {"vocab_size", c->vocab_size},
        {"max_position_embeddings", c->max_position_embeddings},
    };

    if (c->model_type < WSYNC_MODEL_LLAMA || c->model_type > WSYNC_MODEL_DEEPSEEK_V3)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: model_type %d is not llama, qwen2, qwen3, qwen3_moe, deepseek_v2 or "
                         "deepseek_v3",
                         src, (int)c->model_type);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        if (sizes[i].value < 1 || sizes[i].value > SIZE_MAX_ALLOWED)
            return wsync_err(WSYNC_ERR_CONFIG, "%s: %s = %" PRId64 " must be in [1, %d]", src,
                             sizes[i].name, sizes[i].value, SIZE_MAX_ALLOWED);
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: num_attention_heads = %" PRId64
                         " is not a multiple of num_key_value_heads = %" PRId64,
                         src, c->num_attention_heads, c->num_key_value_heads);
    if (!(c->rms_norm_eps > 0.0) || !isfinite(c->rms_norm_eps))
        return wsync_err(WSYNC_ERR_CONFIG, "%s: rms_norm_eps = %g must be > 0", src,
                         c->rms_norm_eps);
    if (!(c->rope_theta > 0.0) || !isfinite(c->rope_theta))
        return wsync_err(WSYNC_ERR_CONFIG, "%s: rope_theta = %g must be > 0", src, c->rope_theta);
    if (c->dtype != 0 && wsync_dtype_size(c->dtype) == 0)
        return wsync_err(WSYNC_ERR_CONFIG, "%s: dtype %d is unknown", src, (int)c->dtype);
    if (is_moe_type(c->model_type))
        return check_moe(src, c);
    if (c->num_experts != 0 || c->kv_lora_rank != 0)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: %s is dense: num_experts = %" PRId64 " and kv_lora_rank = %" PRId64
                         " must be 0",
                         src, wsync_model_type_name(c->model_type), c->num_experts,
                         c->kv_lora_rank);
    return WSYNC_OK;
}

wsync_status_t wsync_model_config_check(const wsync_model_config_t *cfg)
{
    if (cfg == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "model config is NULL");
    return check_config("config", cfg);
}

/* Qwen3-MoE's routed experts (configuration_qwen3_moe.py defaults). */
static wsync_status_t parse_qwen3_moe(const char *src, json_t *root, wsync_model_config_t *c)
{
    wsync_status_t st;
    int64_t local = 0;

    c->num_experts = 128;
    c->num_experts_per_tok = 8;
    c->moe_intermediate_size = 768;
    c->decoder_sparse_step = 1;
    c->norm_topk_prob = 0;
    /* transformers 5 stores num_experts as num_local_experts (attribute_map), so configs it
     * saves carry the latter; older ones (Qwen3-30B-A3B) the former */
    if ((st = get_int(src, root, "num_experts", 1, SIZE_MAX_ALLOWED, &c->num_experts)) ||
        (st = get_int(src, root, "num_local_experts", 1, SIZE_MAX_ALLOWED, &local)))
        return st;
    if (local != 0) {
        if (field(root, "num_experts") != NULL && local != c->num_experts)
            return wsync_err(WSYNC_ERR_CONFIG,
                             "%s: num_experts = %" PRId64 " and num_local_experts = %" PRId64
                             " disagree",
                             src, c->num_experts, local);
        c->num_experts = local;
    }
    if ((st = get_int(src, root, "num_experts_per_tok", 1, SIZE_MAX_ALLOWED,
                      &c->num_experts_per_tok)) ||
        (st = get_int(src, root, "moe_intermediate_size", 1, SIZE_MAX_ALLOWED,
                      &c->moe_intermediate_size)) ||
        (st = get_int(src, root, "decoder_sparse_step", 1, SIZE_MAX_ALLOWED,
                      &c->decoder_sparse_step)) ||
        (st = get_bool(src, root, "norm_topk_prob", &c->norm_topk_prob)) ||
        (st = get_mlp_only(src, root, c)))
        return st;
    if (c->num_experts_per_tok > c->num_experts)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: num_experts_per_tok = %" PRId64 " exceeds num_experts = %" PRId64,
                         src, c->num_experts_per_tok, c->num_experts);
    return WSYNC_OK;
}

/* A size where an explicit null means "none" (0) rather than the default: DeepSeek's
 * q_lora_rank (no low-rank q) and n_shared_experts (no shared expert). */
static wsync_status_t get_size_or_none(const char *src, json_t *root, const char *key,
                                       int64_t *out)
{
    if (json_is_null(json_object_get(root, key))) {
        *out = 0;
        return WSYNC_OK;
    }
    return get_int(src, root, key, 0, SIZE_MAX_ALLOWED, out);
}

/* DeepSeek-V2/V3 (and Kimi-K2): MLA and routed + shared experts. */
static wsync_status_t parse_deepseek(const char *src, json_t *root, wsync_model_config_t *c)
{
    static const char *const score_names[] = {"softmax", "sigmoid"};
    static const int score_values[] = {WSYNC_ROUTER_SOFTMAX, WSYNC_ROUTER_SIGMOID};
    static const char *const topk_names[] = {"greedy", "group_limited_greedy", "noaux_tc"};
    static const int topk_values[] = {WSYNC_TOPK_GREEDY, WSYNC_TOPK_GROUP_LIMITED,
                                      WSYNC_TOPK_NOAUX_TC};
    const int v3 = c->model_type == WSYNC_MODEL_DEEPSEEK_V3;
    wsync_status_t st;
    int scoring = v3 ? WSYNC_ROUTER_SIGMOID : WSYNC_ROUTER_SOFTMAX;
    int topk = v3 ? WSYNC_TOPK_NOAUX_TC : WSYNC_TOPK_GREEDY;

    /* configuration_deepseek_v3.py / configuration_deepseek_v2.py */
    c->q_lora_rank = 1536;
    c->kv_lora_rank = 512;
    c->qk_nope_head_dim = 128;
    c->qk_rope_head_dim = 64;
    c->v_head_dim = 128;
    c->num_experts = v3 ? 256 : 64;
    c->n_shared_experts = v3 ? 1 : 2;
    c->moe_intermediate_size = v3 ? 2048 : 1407;
    c->num_experts_per_tok = v3 ? 8 : 0;        /* V2: None, no usable default */
    c->first_k_dense_replace = v3 ? 3 : 0;
    c->moe_layer_freq = 1;
    c->n_group = v3 ? 8 : 1;                     /* V2: None, i.e. one group of every expert */
    c->topk_group = v3 ? 4 : 1;
    c->routed_scaling_factor = v3 ? 2.5 : 1.0;
    c->norm_topk_prob = v3;
    c->rope_interleave = 1;

    if (json_is_null(json_object_get(root, "n_routed_experts")))
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: n_routed_experts = null (a dense DeepSeek) is not supported", src);
    if ((st = get_size_or_none(src, root, "q_lora_rank", &c->q_lora_rank)) ||
        (st = get_size_or_none(src, root, "n_shared_experts", &c->n_shared_experts)) ||
        (st = get_int(src, root, "kv_lora_rank", 1, SIZE_MAX_ALLOWED, &c->kv_lora_rank)) ||
        (st = get_int(src, root, "qk_nope_head_dim", 1, SIZE_MAX_ALLOWED,
                      &c->qk_nope_head_dim)) ||
        (st = get_int(src, root, "qk_rope_head_dim", 1, SIZE_MAX_ALLOWED,
                      &c->qk_rope_head_dim)) ||
        (st = get_int(src, root, "v_head_dim", 1, SIZE_MAX_ALLOWED, &c->v_head_dim)) ||
        (st = get_int(src, root, "n_routed_experts", 1, SIZE_MAX_ALLOWED, &c->num_experts)) ||
        (st = get_int(src, root, "moe_intermediate_size", 1, SIZE_MAX_ALLOWED,
                      &c->moe_intermediate_size)) ||
        (st = get_int(src, root, "num_experts_per_tok", 1, SIZE_MAX_ALLOWED,
                      &c->num_experts_per_tok)) ||
        (st = get_int(src, root, "first_k_dense_replace", 0, SIZE_MAX_ALLOWED,
                      &c->first_k_dense_replace)) ||
        (st = get_int(src, root, "moe_layer_freq", 1, SIZE_MAX_ALLOWED, &c->moe_layer_freq)) ||
        (st = get_int(src, root, "n_group", 1, SIZE_MAX_ALLOWED, &c->n_group)) ||
        (st = get_int(src, root, "topk_group", 1, SIZE_MAX_ALLOWED, &c->topk_group)) ||
        (st = get_positive(src, root, "", "routed_scaling_factor", &c->routed_scaling_factor)) ||
        (st = get_bool(src, root, "norm_topk_prob", &c->norm_topk_prob)) ||
        (st = get_choice(src, root, "scoring_func", score_names, score_values, 2, &scoring)) ||
        (st = get_choice(src, root, "topk_method", topk_names, topk_values, 3, &topk)) ||
        (v3 && (st = get_bool(src, root, "rope_interleave", &c->rope_interleave))))
        return st;
    if (c->num_experts_per_tok == 0)
        return wsync_err(WSYNC_ERR_CONFIG,
                         "%s: missing required field num_experts_per_tok (deepseek_v2 has no "
                         "default)",
                         src);
    c->scoring_func = (wsync_router_score_t)scoring;
    c->topk_method = (wsync_topk_method_t)topk;
    /* transformers 5's DeepseekV3TopkRouter always holds the bias; V2 (vLLM, DeepSeek's own
     * code) only for noaux_tc */
    c->router_bias = v3 || c->topk_method == WSYNC_TOPK_NOAUX_TC;
    /* MLA's attention heads: every head has its own k and v (from the latent), of
     * qk_nope + qk_rope dims for q and k; transformers' own head_dim (= qk_rope_head_dim) and
     * num_key_value_heads are not what the params' shapes use */
    c->head_dim = c->qk_nope_head_dim + c->qk_rope_head_dim;
    c->num_key_value_heads = c->num_attention_heads;
    return WSYNC_OK;
}

static wsync_status_t parse_root(const char *src, json_t *root, wsync_model_config_t *out)
{
    wsync_model_config_t c;
    wsync_status_t st;
    int found, has_kv = 0, has_head_dim = 0;

    memset(&c, 0, sizeof(c));
    if (!json_is_object(root))
        return wsync_err(WSYNC_ERR_CONFIG, "%s: the top level must be a JSON object", src);
    if ((st = get_family(src, root, &c.model_type)) != WSYNC_OK)
        return st;

    /* transformers' per-family defaults (see the header for the table) */
    const int llama = c.model_type == WSYNC_MODEL_LLAMA;
    const int mla = is_mla_type(c.model_type);
    switch (c.model_type) {
    case WSYNC_MODEL_LLAMA: c.max_position_embeddings = 2048; break;
    case WSYNC_MODEL_DEEPSEEK_V2: c.max_position_embeddings = 2048; break;
    case WSYNC_MODEL_DEEPSEEK_V3: c.max_position_embeddings = 4096; break;
    default: c.max_position_embeddings = 32768; break;
    }
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 10000.0;
    c.qk_norm = c.model_type == WSYNC_MODEL_QWEN3 || c.model_type == WSYNC_MODEL_QWEN3_MOE;

    if ((st = get_size(src, root, "hidden_size", 1, &c.hidden_size, &found)) ||
        (st = get_size(src, root, "num_hidden_layers", 1, &c.num_hidden_layers, &found)) ||
        (st = get_size(src, root, "num_attention_heads", 1, &c.num_attention_heads, &found)) ||
        (st = get_size(src, root, "intermediate_size", 1, &c.intermediate_size, &found)) ||
        (st = get_size(src, root, "vocab_size", 1, &c.vocab_size, &found)) ||
        (!mla && (st = get_size(src, root, "num_key_value_heads", 0, &c.num_key_value_heads,
                                &has_kv))) ||
        (!mla && (st = get_size(src, root, "head_dim", 0, &c.head_dim, &has_head_dim))) ||
        (st = get_size(src, root, "max_position_embeddings", 0, &c.max_position_embeddings,
                       &found)))
        return st;

    /* LlamaConfig.__post_init__ fills H; Qwen2Config/Qwen3Config declare the literal 32 and only
     * map an explicit null to H, so an absent key really means 32 there; Qwen3MoeConfig
     * declares 4. */
    if (!has_kv)
        c.num_key_value_heads = llama ? c.num_attention_heads
                                : c.model_type == WSYNC_MODEL_QWEN3_MOE ? 4 : 32;
    if (!has_head_dim && !mla) {
        if (c.model_type == WSYNC_MODEL_QWEN3) {
            c.head_dim = 128;           /* Qwen3Config: head_dim: int = 128 */
        } else {
            /* Llama, Qwen2, and Qwen3MoeAttention's getattr(config, "head_dim", Hd // H) */
            if (c.hidden_size % c.num_attention_heads != 0)
                return wsync_err(WSYNC_ERR_CONFIG,
                                 "%s: hidden_size = %" PRId64
                                 " is not a multiple of num_attention_heads = %" PRId64
                                 " and head_dim is absent",
                                 src, c.hidden_size, c.num_attention_heads);
            c.head_dim = c.hidden_size / c.num_attention_heads;
        }
    }

    if ((st = get_bool(src, root, "tie_word_embeddings", &c.tie_word_embeddings)) != WSYNC_OK)
        return st;
    if (c.model_type == WSYNC_MODEL_QWEN2) {
        /* Qwen2Attention hard-codes bias=True on q/k/v and False on o; no config key moves it */
        c.attention_bias = 1;
        c.o_proj_bias = 0;
    } else {
        if ((st = get_bool(src, root, "attention_bias", &c.attention_bias)) != WSYNC_OK)
            return st;
        c.o_proj_bias = c.attention_bias;
    }
    if ((llama || c.model_type == WSYNC_MODEL_DEEPSEEK_V2) &&
        (st = get_bool(src, root, "mlp_bias", &c.mlp_bias)) != WSYNC_OK)
        return st;

    if ((st = get_positive(src, root, "", "rms_norm_eps", &c.rms_norm_eps)) ||
        (st = get_rope_theta(src, root, &c.rope_theta)) ||
        (st = get_dtype(src, root, &c.dtype)))
        return st;

    if (c.model_type == WSYNC_MODEL_QWEN3_MOE)
        st = parse_qwen3_moe(src, root, &c);
    else if (mla)
        st = parse_deepseek(src, root, &c);
    if (st != WSYNC_OK)
        return st;

    if ((st = check_config(src, &c)) != WSYNC_OK)
        return st;
    *out = c;
    return WSYNC_OK;
}

static wsync_status_t parse_buffer(const char *src, const char *json, size_t len,
                                   wsync_model_config_t *cfg)
{
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);

    if (root == NULL)
        return wsync_err(WSYNC_ERR_CONFIG, "%s: malformed JSON at line %d column %d: %s", src,
                         jerr.line, jerr.column, jerr.text);
    wsync_status_t st = parse_root(src, root, cfg);
    json_decref(root);
    return st;
}

wsync_status_t wsync_model_config_parse(const char *json, size_t len, wsync_model_config_t *cfg)
{
    if (json == NULL || cfg == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_model_config_parse: json and cfg must be set");
    return parse_buffer("config", json, len, cfg);
}

wsync_status_t wsync_model_config_load(const char *path, wsync_model_config_t *cfg)
{
    if (path == NULL || cfg == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_model_config_load: path and cfg must be set");

    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return wsync_err(WSYNC_ERR_IO, "cannot open %s: %s", path, strerror(errno));

    /* read whole, then parse: jansson's file loader would merge "cannot open" into its
     * parse errors */
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    wsync_status_t st = WSYNC_OK;
    while (buf != NULL) {
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap)
            break;
        if (cap >= CONFIG_FILE_MAX) {
            st = wsync_err(WSYNC_ERR_CONFIG, "%s: larger than %u bytes, not a config", path,
                           CONFIG_FILE_MAX);
            break;
        }
        char *bigger = realloc(buf, cap * 2);
        if (bigger == NULL) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = bigger;
        cap *= 2;
    }
    if (buf == NULL)
        st = wsync_err(WSYNC_ERR_NOMEM, "reading %s", path);
    else if (st == WSYNC_OK && ferror(f))
        st = wsync_err(WSYNC_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    fclose(f);
    if (st == WSYNC_OK)
        st = parse_buffer(path, buf, len, cfg);
    free(buf);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Params                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* Names within a layer ("model.layers.{L}." is prepended; per-expert kinds take
 * "model.layers.{L}.mlp.experts.{e}." instead). */
static const char *const mp_names[WSYNC_MP_COUNT] = {
    [WSYNC_MP_EMBED] = "model.embed_tokens.weight",
    [WSYNC_MP_INPUT_NORM] = "input_layernorm.weight",
    [WSYNC_MP_Q] = "self_attn.q_proj.weight",
    [WSYNC_MP_Q_BIAS] = "self_attn.q_proj.bias",
    [WSYNC_MP_K] = "self_attn.k_proj.weight",
    [WSYNC_MP_K_BIAS] = "self_attn.k_proj.bias",
    [WSYNC_MP_V] = "self_attn.v_proj.weight",
    [WSYNC_MP_V_BIAS] = "self_attn.v_proj.bias",
    [WSYNC_MP_Q_A] = "self_attn.q_a_proj.weight",
    [WSYNC_MP_Q_A_NORM] = "self_attn.q_a_layernorm.weight",
    [WSYNC_MP_Q_B] = "self_attn.q_b_proj.weight",
    [WSYNC_MP_KV_A] = "self_attn.kv_a_proj_with_mqa.weight",
    [WSYNC_MP_KV_A_NORM] = "self_attn.kv_a_layernorm.weight",
    [WSYNC_MP_KV_B] = "self_attn.kv_b_proj.weight",
    [WSYNC_MP_O] = "self_attn.o_proj.weight",
    [WSYNC_MP_O_BIAS] = "self_attn.o_proj.bias",
    [WSYNC_MP_Q_NORM] = "self_attn.q_norm.weight",
    [WSYNC_MP_K_NORM] = "self_attn.k_norm.weight",
    [WSYNC_MP_POST_NORM] = "post_attention_layernorm.weight",
    [WSYNC_MP_GATE] = "mlp.gate_proj.weight",
    [WSYNC_MP_GATE_BIAS] = "mlp.gate_proj.bias",
    [WSYNC_MP_UP] = "mlp.up_proj.weight",
    [WSYNC_MP_UP_BIAS] = "mlp.up_proj.bias",
    [WSYNC_MP_DOWN] = "mlp.down_proj.weight",
    [WSYNC_MP_DOWN_BIAS] = "mlp.down_proj.bias",
    [WSYNC_MP_ROUTER] = "mlp.gate.weight",
    [WSYNC_MP_ROUTER_BIAS] = "mlp.gate.e_score_correction_bias",
    [WSYNC_MP_EXPERT_GATE] = "gate_proj.weight",
    [WSYNC_MP_EXPERT_UP] = "up_proj.weight",
    [WSYNC_MP_EXPERT_DOWN] = "down_proj.weight",
    [WSYNC_MP_SHARED_GATE] = "mlp.shared_experts.gate_proj.weight",
    [WSYNC_MP_SHARED_UP] = "mlp.shared_experts.up_proj.weight",
    [WSYNC_MP_SHARED_DOWN] = "mlp.shared_experts.down_proj.weight",
    [WSYNC_MP_NORM] = "model.norm.weight",
    [WSYNC_MP_LM_HEAD] = "lm_head.weight",
};

int wsync_mp_per_layer(wsync_mp_kind_t kind)
{
    return kind >= WSYNC_MP_FIRST_LAYER_KIND && kind <= WSYNC_MP_LAST_LAYER_KIND;
}

int wsync_mp_per_expert(wsync_mp_kind_t kind)
{
    return kind == WSYNC_MP_EXPERT_GATE || kind == WSYNC_MP_EXPERT_UP ||
           kind == WSYNC_MP_EXPERT_DOWN;
}

int wsync_mp_is_mla(const wsync_model_config_t *cfg)
{
    return is_mla_type(cfg->model_type);
}

int wsync_mp_is_moe_family(const wsync_model_config_t *cfg)
{
    return is_moe_type(cfg->model_type);
}

int wsync_mp_present(const wsync_model_config_t *cfg, wsync_mp_kind_t kind)
{
    const int mla = is_mla_type(cfg->model_type), moe = is_moe_type(cfg->model_type);

    switch (kind) {
    case WSYNC_MP_Q: return !mla || cfg->q_lora_rank == 0;
    case WSYNC_MP_K:
    case WSYNC_MP_V: return !mla;
    case WSYNC_MP_Q_BIAS:
    case WSYNC_MP_K_BIAS:
    case WSYNC_MP_V_BIAS: return !mla && cfg->attention_bias != 0;
    case WSYNC_MP_Q_A:
    case WSYNC_MP_Q_A_NORM:
    case WSYNC_MP_Q_B: return mla && cfg->q_lora_rank > 0;
    case WSYNC_MP_KV_A:
    case WSYNC_MP_KV_A_NORM:
    case WSYNC_MP_KV_B: return mla;
    case WSYNC_MP_O_BIAS: return cfg->o_proj_bias != 0;
    case WSYNC_MP_Q_NORM:
    case WSYNC_MP_K_NORM: return cfg->qk_norm != 0;
    case WSYNC_MP_GATE_BIAS:
    case WSYNC_MP_UP_BIAS:
    case WSYNC_MP_DOWN_BIAS: return cfg->mlp_bias != 0;
    case WSYNC_MP_ROUTER:
    case WSYNC_MP_EXPERT_GATE:
    case WSYNC_MP_EXPERT_UP:
    case WSYNC_MP_EXPERT_DOWN: return moe;
    case WSYNC_MP_ROUTER_BIAS: return moe && cfg->router_bias != 0;
    case WSYNC_MP_SHARED_GATE:
    case WSYNC_MP_SHARED_UP:
    case WSYNC_MP_SHARED_DOWN: return mla && cfg->n_shared_experts > 0;
    case WSYNC_MP_LM_HEAD: return !cfg->tie_word_embeddings;
    default: return kind >= 0 && kind < WSYNC_MP_COUNT;
    }
}

int wsync_mp_in_layer(const wsync_model_config_t *cfg, wsync_mp_kind_t kind, int is_moe)
{
    if (!wsync_mp_per_layer(kind) || !wsync_mp_present(cfg, kind))
        return 0;
    if (kind >= WSYNC_MP_GATE && kind <= WSYNC_MP_DOWN_BIAS)
        return !is_moe;             /* a dense MLP */
    if (kind >= WSYNC_MP_ROUTER && kind <= WSYNC_MP_SHARED_DOWN)
        return is_moe;
    return 1;
}

wsync_dtype_t wsync_mp_dtype(const wsync_model_config_t *cfg, wsync_dtype_t dtype)
{
    if (dtype != 0)
        return dtype;
    return cfg->dtype != 0 ? cfg->dtype : WSYNC_DTYPE_BF16;
}

static void shape2(wsync_param_t *p, int64_t rows, int64_t cols)
{
    p->ndim = 2;
    p->shape[0] = rows;
    p->shape[1] = cols;
}

void wsync_mp_expert_param(const wsync_model_config_t *cfg, wsync_mp_kind_t kind, int64_t layer,
                           int64_t expert, wsync_dtype_t dtype, char buf[WSYNC_MP_NAME_MAX],
                           wsync_param_t *p)
{
    const int64_t hd = cfg->hidden_size, h = cfg->num_attention_heads;
    const int64_t qd = h * cfg->head_dim, kvd = cfg->num_key_value_heads * cfg->head_dim;
    const int64_t im = cfg->intermediate_size, em = cfg->moe_intermediate_size;
    const int64_t sm = cfg->moe_intermediate_size * cfg->n_shared_experts;
    /* o_proj's input: every head's value; MLA values have v_head_dim dims, not head_dim */
    const int64_t od = is_mla_type(cfg->model_type) ? h * cfg->v_head_dim : qd;

    if (wsync_mp_per_expert(kind))
        snprintf(buf, WSYNC_MP_NAME_MAX, "model.layers.%" PRId64 ".mlp.experts.%" PRId64 ".%s",
                 layer, expert, mp_names[kind]);
    else if (wsync_mp_per_layer(kind))
        snprintf(buf, WSYNC_MP_NAME_MAX, "model.layers.%" PRId64 ".%s", layer, mp_names[kind]);
    else
        snprintf(buf, WSYNC_MP_NAME_MAX, "%s", mp_names[kind]);
    memset(p, 0, sizeof(*p));
    p->name = buf;
    p->dtype = dtype;
    p->ndim = 1;
    switch (kind) {
    case WSYNC_MP_EMBED:
    case WSYNC_MP_LM_HEAD: shape2(p, cfg->vocab_size, hd); break;
    case WSYNC_MP_Q: shape2(p, qd, hd); break;
    case WSYNC_MP_K:
    case WSYNC_MP_V: shape2(p, kvd, hd); break;
    case WSYNC_MP_Q_A: shape2(p, cfg->q_lora_rank, hd); break;
    case WSYNC_MP_Q_A_NORM: p->shape[0] = cfg->q_lora_rank; break;
    case WSYNC_MP_Q_B: shape2(p, qd, cfg->q_lora_rank); break;
    case WSYNC_MP_KV_A: shape2(p, cfg->kv_lora_rank + cfg->qk_rope_head_dim, hd); break;
    case WSYNC_MP_KV_A_NORM: p->shape[0] = cfg->kv_lora_rank; break;
    case WSYNC_MP_KV_B:
        shape2(p, h * (cfg->qk_nope_head_dim + cfg->v_head_dim), cfg->kv_lora_rank);
        break;
    case WSYNC_MP_O: shape2(p, hd, od); break;
    case WSYNC_MP_GATE:
    case WSYNC_MP_UP: shape2(p, im, hd); break;
    case WSYNC_MP_DOWN: shape2(p, hd, im); break;
    case WSYNC_MP_ROUTER: shape2(p, cfg->num_experts, hd); break;
    case WSYNC_MP_ROUTER_BIAS: p->shape[0] = cfg->num_experts; break;
    case WSYNC_MP_EXPERT_GATE:
    case WSYNC_MP_EXPERT_UP: shape2(p, em, hd); break;
    case WSYNC_MP_EXPERT_DOWN: shape2(p, hd, em); break;
    case WSYNC_MP_SHARED_GATE:
    case WSYNC_MP_SHARED_UP: shape2(p, sm, hd); break;
    case WSYNC_MP_SHARED_DOWN: shape2(p, hd, sm); break;
    case WSYNC_MP_Q_BIAS: p->shape[0] = qd; break;
    case WSYNC_MP_K_BIAS:
    case WSYNC_MP_V_BIAS: p->shape[0] = kvd; break;
    case WSYNC_MP_Q_NORM:
    case WSYNC_MP_K_NORM: p->shape[0] = cfg->head_dim; break;
    case WSYNC_MP_GATE_BIAS:
    case WSYNC_MP_UP_BIAS: p->shape[0] = im; break;
    case WSYNC_MP_INPUT_NORM:
    case WSYNC_MP_POST_NORM:
    case WSYNC_MP_O_BIAS:
    case WSYNC_MP_DOWN_BIAS:
    case WSYNC_MP_NORM:
    case WSYNC_MP_COUNT: p->shape[0] = hd; break;
    }
}

void wsync_mp_param(const wsync_model_config_t *cfg, wsync_mp_kind_t kind, int64_t layer,
                    wsync_dtype_t dtype, char buf[WSYNC_MP_NAME_MAX], wsync_param_t *p)
{
    wsync_mp_expert_param(cfg, kind, layer, 0, dtype, buf, p);
}

void wsync_model_params_free(wsync_param_t *params, size_t n)
{
    if (params == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        free((char *)params[i].name);
    free(params);
}

/* Calls fn for each param of the model in wsync_model_params order; stops at the first error.
 * Linear in the number of params (Kimi-K2: ~70,000). */
static wsync_status_t for_each_param(const wsync_model_config_t *cfg, wsync_dtype_t dtype,
                                     wsync_status_t (*fn)(void *, const wsync_param_t *),
                                     void *arg)
{
    char name[WSYNC_MP_NAME_MAX];
    wsync_param_t p;
    wsync_status_t st;

    wsync_mp_param(cfg, WSYNC_MP_EMBED, 0, dtype, name, &p);
    if ((st = fn(arg, &p)) != WSYNC_OK)
        return st;
    for (int64_t l = 0; l < cfg->num_hidden_layers; l++) {
        const int moe = wsync_model_layer_is_moe(cfg, l);
        for (int k = WSYNC_MP_FIRST_LAYER_KIND; k <= WSYNC_MP_LAST_LAYER_KIND; k++) {
            if (!wsync_mp_in_layer(cfg, (wsync_mp_kind_t)k, moe))
                continue;
            if (k == WSYNC_MP_EXPERT_GATE) {
                /* expert by expert: gate, up, down of expert 0, then of expert 1, ... */
                for (int64_t e = 0; e < cfg->num_experts; e++)
                    for (int j = WSYNC_MP_EXPERT_GATE; j <= WSYNC_MP_EXPERT_DOWN; j++) {
                        wsync_mp_expert_param(cfg, (wsync_mp_kind_t)j, l, e, dtype, name, &p);
                        if ((st = fn(arg, &p)) != WSYNC_OK)
                            return st;
                    }
                k = WSYNC_MP_EXPERT_DOWN;
                continue;
            }
            wsync_mp_param(cfg, (wsync_mp_kind_t)k, l, dtype, name, &p);
            if ((st = fn(arg, &p)) != WSYNC_OK)
                return st;
        }
    }
    wsync_mp_param(cfg, WSYNC_MP_NORM, 0, dtype, name, &p);
    if ((st = fn(arg, &p)) != WSYNC_OK)
        return st;
    if (wsync_mp_present(cfg, WSYNC_MP_LM_HEAD)) {
        wsync_mp_param(cfg, WSYNC_MP_LM_HEAD, 0, dtype, name, &p);
        if ((st = fn(arg, &p)) != WSYNC_OK)
            return st;
    }
    return WSYNC_OK;
}

typedef struct {
    wsync_param_t *params;
    size_t n;
} param_list_t;

static wsync_status_t count_param(void *arg, const wsync_param_t *p)
{
    (void)p;
    ((param_list_t *)arg)->n++;
    return WSYNC_OK;
}

static wsync_status_t copy_param(void *arg, const wsync_param_t *p)
{
    param_list_t *list = arg;
    char *name = strdup(p->name);
    if (name == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "param names");
    list->params[list->n] = *p;
    list->params[list->n].name = name;
    list->n++;
    return WSYNC_OK;
}

wsync_status_t wsync_model_params(const wsync_model_config_t *cfg, wsync_dtype_t dtype,
                                  wsync_param_t **params, size_t *n)
{
    wsync_status_t st;
    param_list_t list = {NULL, 0};

    if (params == NULL || n == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_model_params: params and n must be set");
    if ((st = wsync_model_config_check(cfg)) != WSYNC_OK)
        return st;
    dtype = wsync_mp_dtype(cfg, dtype);
    if (wsync_dtype_size(dtype) == 0)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_model_params: unknown dtype %d", (int)dtype);

    for_each_param(cfg, dtype, count_param, &list);
    size_t total = list.n;
    list.params = calloc(total, sizeof(*list.params));
    list.n = 0;
    if (list.params == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "%zu params", total);
    if ((st = for_each_param(cfg, dtype, copy_param, &list)) != WSYNC_OK) {
        wsync_model_params_free(list.params, list.n);
        return st;
    }
    *params = list.params;
    *n = list.n;
    return WSYNC_OK;
}

int wsync_model_layer_is_moe(const wsync_model_config_t *cfg, int64_t layer)
{
    if (cfg == NULL || cfg->num_experts <= 0 || layer < 0 || layer >= cfg->num_hidden_layers)
        return 0;
    switch (cfg->model_type) {
    case WSYNC_MODEL_QWEN3_MOE:
        /* Qwen3MoeDecoderLayer: not in mlp_only_layers and (layer + 1) % decoder_sparse_step */
        for (int i = 0; i < cfg->nmlp_only_layers && i < WSYNC_MODEL_MAX_MLP_ONLY; i++)
            if (cfg->mlp_only_layers[i] == layer)
                return 0;
        return cfg->decoder_sparse_step > 0 && (layer + 1) % cfg->decoder_sparse_step == 0;
    case WSYNC_MODEL_DEEPSEEK_V2:
        /* vLLM's DeepseekV2DecoderLayer and DeepSeek's own modeling code also need
         * layer % moe_layer_freq == 0 (transformers' DeepseekV2DecoderLayer ignores the key;
         * every published config has 1, where all three agree) */
        return layer >= cfg->first_k_dense_replace &&
               (cfg->moe_layer_freq <= 1 || layer % cfg->moe_layer_freq == 0);
    case WSYNC_MODEL_DEEPSEEK_V3:
        /* DeepseekV3DecoderLayer: layer_idx >= first_k_dense_replace (moe_layer_freq must be 1,
         * which the config check enforces) */
        return layer >= cfg->first_k_dense_replace;
    default:
        return 0;
    }
}
