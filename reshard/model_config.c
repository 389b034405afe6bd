/* HF config.json of the Llama, Qwen2 and Qwen3 families → wsync_model_config_t, and the list of
 * checkpoint params such a model has. Defaults follow transformers' configuration_llama.py,
 * configuration_qwen2.py and configuration_qwen3.py (v4.5x and v5 agree on every value used here);
 * the header lists them. */
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
                         "%s: model_type %s is not supported (llama, qwen2, qwen3)", src, shown);
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
                     "Qwen2ForCausalLM, Qwen3ForCausalLM)",
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

    if (c->model_type != WSYNC_MODEL_LLAMA && c->model_type != WSYNC_MODEL_QWEN2 &&
        c->model_type != WSYNC_MODEL_QWEN3)
        return wsync_err(WSYNC_ERR_CONFIG, "%s: model_type %d is not llama, qwen2 or qwen3", src,
                         (int)c->model_type);
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
    return WSYNC_OK;
}

wsync_status_t wsync_model_config_check(const wsync_model_config_t *cfg)
{
    if (cfg == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "model config is NULL");
    return check_config("config", cfg);
}

static wsync_status_t parse_root(const char *src, json_t *root, wsync_model_config_t *out)
{
    wsync_model_config_t c;
    wsync_status_t st;
    int found, has_kv, has_head_dim;

    memset(&c, 0, sizeof(c));
    if (!json_is_object(root))
        return wsync_err(WSYNC_ERR_CONFIG, "%s: the top level must be a JSON object", src);
    if ((st = get_family(src, root, &c.model_type)) != WSYNC_OK)
        return st;

    /* transformers' per-family defaults (see the header for the table) */
    int llama = c.model_type == WSYNC_MODEL_LLAMA;
    c.max_position_embeddings = llama ? 2048 : 32768;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 10000.0;
    c.qk_norm = c.model_type == WSYNC_MODEL_QWEN3;

    if ((st = get_size(src, root, "hidden_size", 1, &c.hidden_size, &found)) ||
        (st = get_size(src, root, "num_hidden_layers", 1, &c.num_hidden_layers, &found)) ||
        (st = get_size(src, root, "num_attention_heads", 1, &c.num_attention_heads, &found)) ||
        (st = get_size(src, root, "intermediate_size", 1, &c.intermediate_size, &found)) ||
        (st = get_size(src, root, "vocab_size", 1, &c.vocab_size, &found)) ||
        (st = get_size(src, root, "num_key_value_heads", 0, &c.num_key_value_heads, &has_kv)) ||
        (st = get_size(src, root, "head_dim", 0, &c.head_dim, &has_head_dim)) ||
        (st = get_size(src, root, "max_position_embeddings", 0, &c.max_position_embeddings,
                       &found)))
        return st;

    /* LlamaConfig.__post_init__ fills H; Qwen2Config/Qwen3Config declare the literal 32 and only
     * map an explicit null to H, so an absent key really means 32 there. */
    if (!has_kv)
        c.num_key_value_heads = llama ? c.num_attention_heads : 32;
    if (!has_head_dim) {
        if (c.model_type == WSYNC_MODEL_QWEN3) {
            c.head_dim = 128;           /* Qwen3Config: head_dim: int = 128 */
        } else {
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
    if (llama && (st = get_bool(src, root, "mlp_bias", &c.mlp_bias)) != WSYNC_OK)
        return st;

    if ((st = get_positive(src, root, "", "rms_norm_eps", &c.rms_norm_eps)) ||
        (st = get_rope_theta(src, root, &c.rope_theta)) ||
        (st = get_dtype(src, root, &c.dtype)))
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

static const char *const mp_names[WSYNC_MP_COUNT] = {
    [WSYNC_MP_EMBED] = "model.embed_tokens.weight",
    [WSYNC_MP_INPUT_NORM] = "input_layernorm.weight",
    [WSYNC_MP_Q] = "self_attn.q_proj.weight",
    [WSYNC_MP_Q_BIAS] = "self_attn.q_proj.bias",
    [WSYNC_MP_K] = "self_attn.k_proj.weight",
    [WSYNC_MP_K_BIAS] = "self_attn.k_proj.bias",
    [WSYNC_MP_V] = "self_attn.v_proj.weight",
    [WSYNC_MP_V_BIAS] = "self_attn.v_proj.bias",
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
    [WSYNC_MP_NORM] = "model.norm.weight",
    [WSYNC_MP_LM_HEAD] = "lm_head.weight",
};

int wsync_mp_per_layer(wsync_mp_kind_t kind)
{
    return kind != WSYNC_MP_EMBED && kind != WSYNC_MP_NORM && kind != WSYNC_MP_LM_HEAD;
}

int wsync_mp_present(const wsync_model_config_t *cfg, wsync_mp_kind_t kind)
{
    switch (kind) {
    case WSYNC_MP_Q_BIAS:
    case WSYNC_MP_K_BIAS:
    case WSYNC_MP_V_BIAS: return cfg->attention_bias != 0;
    case WSYNC_MP_O_BIAS: return cfg->o_proj_bias != 0;
    case WSYNC_MP_Q_NORM:
    case WSYNC_MP_K_NORM: return cfg->qk_norm != 0;
    case WSYNC_MP_GATE_BIAS:
    case WSYNC_MP_UP_BIAS:
    case WSYNC_MP_DOWN_BIAS: return cfg->mlp_bias != 0;
    case WSYNC_MP_LM_HEAD: return !cfg->tie_word_embeddings;
    default: return kind >= 0 && kind < WSYNC_MP_COUNT;
    }
}

wsync_dtype_t wsync_mp_dtype(const wsync_model_config_t *cfg, wsync_dtype_t dtype)
{
    if (dtype != 0)
        return dtype;
    return cfg->dtype != 0 ? cfg->dtype : WSYNC_DTYPE_BF16;
}

void wsync_mp_param(const wsync_model_config_t *cfg, wsync_mp_kind_t kind, int64_t layer,
                    wsync_dtype_t dtype, char buf[WSYNC_MP_NAME_MAX], wsync_param_t *p)
{
    const int64_t hd = cfg->hidden_size, qd = cfg->num_attention_heads * cfg->head_dim;
    const int64_t kvd = cfg->num_key_value_heads * cfg->head_dim, im = cfg->intermediate_size;

    if (wsync_mp_per_layer(kind))
        snprintf(buf, WSYNC_MP_NAME_MAX, "model.layers.%" PRId64 ".%s", layer, mp_names[kind]);
    else
        snprintf(buf, WSYNC_MP_NAME_MAX, "%s", mp_names[kind]);
    memset(p, 0, sizeof(*p));
    p->name = buf;
    p->dtype = dtype;
    p->ndim = 1;
    switch (kind) {
    case WSYNC_MP_EMBED:
    case WSYNC_MP_LM_HEAD: p->ndim = 2; p->shape[0] = cfg->vocab_size; p->shape[1] = hd; break;
    case WSYNC_MP_Q: p->ndim = 2; p->shape[0] = qd; p->shape[1] = hd; break;
    case WSYNC_MP_K:
    case WSYNC_MP_V: p->ndim = 2; p->shape[0] = kvd; p->shape[1] = hd; break;
    case WSYNC_MP_O: p->ndim = 2; p->shape[0] = hd; p->shape[1] = qd; break;
    case WSYNC_MP_GATE:
    case WSYNC_MP_UP: p->ndim = 2; p->shape[0] = im; p->shape[1] = hd; break;
    case WSYNC_MP_DOWN: p->ndim = 2; p->shape[0] = hd; p->shape[1] = im; break;
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

void wsync_model_params_free(wsync_param_t *params, size_t n)
{
    if (params == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        free((char *)params[i].name);
    free(params);
}

/* Calls fn for each param of the model in HF order; stops at the first error. */
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
        for (int k = WSYNC_MP_INPUT_NORM; k <= WSYNC_MP_DOWN_BIAS; k++) {
            if (!wsync_mp_present(cfg, (wsync_mp_kind_t)k))
                continue;
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
        for (int i = 0; i < cfg->nmlp_only_layers; i++)
            if (cfg->mlp_only_layers[i] == layer)
                return 0;
        return cfg->decoder_sparse_step > 0 && (layer + 1) % cfg->decoder_sparse_step == 0;
    case WSYNC_MODEL_DEEPSEEK_V2:
    case WSYNC_MODEL_DEEPSEEK_V3:
        return layer >= cfg->first_k_dense_replace &&
               (cfg->moe_layer_freq <= 1 || layer % cfg->moe_layer_freq == 0);
    default:
        return 0;
    }
}
