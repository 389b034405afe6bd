/* Model configs, sender boxes and vLLM TP targets, checked against references written here from
 * RESHARD_SPEC.md's formulas, independently of reshard/layout.c. */
#include "wsync/wsync.h"

#include "tests/support/check.h"
#include "tests/support/plan_sim.h"

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TESTDATA WSYNC_TESTDATA
#define UNSET 0xFFFFFFFFu          /* marks target elements no piece wrote */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(uint32_t n)    /* uniform-ish in [0, n) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

static const wsync_target_t *find_target(const wsync_target_t *t, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0)
            return &t[i];
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Config                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static wsync_status_t parse(const char *json, wsync_model_config_t *cfg)
{
    return wsync_model_config_parse(json, strlen(json), cfg);
}

static void config_qwen3_tiny(void)
{
    wsync_model_config_t c;
    CHECK_OK(wsync_model_config_load(TESTDATA "/hf_qwen3_tiny/config.json", &c));
    CHECK(c.model_type == WSYNC_MODEL_QWEN3);
    CHECK(strcmp(wsync_model_type_name(c.model_type), "qwen3") == 0);
    CHECK(c.hidden_size == 128);
    CHECK(c.num_hidden_layers == 2);
    CHECK(c.num_attention_heads == 4);
    CHECK(c.num_key_value_heads == 2);
    CHECK(c.head_dim == 32);
    CHECK(c.intermediate_size == 384);
    CHECK(c.vocab_size == 384);
    CHECK(c.max_position_embeddings == 256);
    CHECK(c.tie_word_embeddings == 0);
    CHECK(c.attention_bias == 0 && c.o_proj_bias == 0 && c.mlp_bias == 0);
    CHECK(c.qk_norm == 1);
    CHECK(c.rms_norm_eps == 1e-6);
    CHECK(c.rope_theta == 1e6);             /* from rope_parameters */
    CHECK(c.dtype == WSYNC_DTYPE_BF16);
}

static void config_llama_defaults(void)
{
    wsync_model_config_t c;
    /* v5 style: rope_parameters; every optional field absent */
    CHECK_OK(parse("{\"model_type\": \"llama\", \"hidden_size\": 256, \"num_hidden_layers\": 3,"
                   " \"num_attention_heads\": 8, \"intermediate_size\": 512, \"vocab_size\": 1000,"
                   " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500000.0}}",
                   &c));
    CHECK(c.model_type == WSYNC_MODEL_LLAMA);
    CHECK(c.num_key_value_heads == 8);      /* = H */
    CHECK(c.head_dim == 32);                /* Hd / H */
    CHECK(c.tie_word_embeddings == 0);
    CHECK(c.attention_bias == 0 && c.o_proj_bias == 0 && c.mlp_bias == 0 && c.qk_norm == 0);
    CHECK(c.rms_norm_eps == 1e-6);
    CHECK(c.rope_theta == 500000.0);
    CHECK(c.max_position_embeddings == 2048);
    CHECK(c.dtype == 0);

    /* v4 style: top-level integer rope_theta, family from architectures, everything explicit */
    CHECK_OK(parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 96,"
                   " \"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"num_key_value_heads\":"
                   " 2, \"head_dim\": 40, \"intermediate_size\": 64, \"vocab_size\": 77,"
                   " \"tie_word_embeddings\": true, \"attention_bias\": true, \"mlp_bias\": true,"
                   " \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000, \"torch_dtype\": \"float16\","
                   " \"max_position_embeddings\": 4096, \"rope_scaling\": null}",
                   &c));
    CHECK(c.model_type == WSYNC_MODEL_LLAMA);
    CHECK(c.num_key_value_heads == 2 && c.head_dim == 40);
    CHECK(c.tie_word_embeddings == 1);
    CHECK(c.attention_bias == 1 && c.o_proj_bias == 1 && c.mlp_bias == 1);
    CHECK(c.rms_norm_eps == 1e-5);
    CHECK(c.rope_theta == 10000.0);
    CHECK(c.dtype == WSYNC_DTYPE_F16);
    CHECK(c.max_position_embeddings == 4096);

    /* no rope anything: HF's default theta */
    CHECK_OK(parse("{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1,"
                   " \"num_attention_heads\": 2, \"intermediate_size\": 8, \"vocab_size\": 10}",
                   &c));
    CHECK(c.rope_theta == 10000.0);
}

static void config_qwen2_defaults(void)
{
    wsync_model_config_t c;
    CHECK_OK(parse("{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\","
                   " \"hidden_size\": 896, \"num_hidden_layers\": 24, \"num_attention_heads\": 14,"
                   " \"num_key_value_heads\": 2, \"intermediate_size\": 4864, \"vocab_size\":"
                   " 151936, \"rope_theta\": 1000000.0, \"tie_word_embeddings\": true,"
                   " \"torch_dtype\": \"bfloat16\", \"attention_bias\": false}",
                   &c));
    CHECK(c.model_type == WSYNC_MODEL_QWEN2);
    CHECK(c.head_dim == 64);
    CHECK(c.attention_bias == 1 && c.o_proj_bias == 0);   /* fixed in Qwen2Attention */
    CHECK(c.mlp_bias == 0 && c.qk_norm == 0);
    CHECK(c.tie_word_embeddings == 1);
    CHECK(c.rope_theta == 1e6);
    CHECK(c.rms_norm_eps == 1e-6);
    CHECK(c.max_position_embeddings == 32768);
    CHECK(c.dtype == WSYNC_DTYPE_BF16);

    /* Qwen2Config's num_key_value_heads default is the literal 32, not H */
    CHECK_OK(parse("{\"model_type\": \"qwen2\", \"hidden_size\": 512, \"num_hidden_layers\": 1,"
                   " \"num_attention_heads\": 64, \"intermediate_size\": 8, \"vocab_size\": 10}",
                   &c));
    CHECK(c.num_key_value_heads == 32 && c.head_dim == 8 && c.rope_theta == 10000.0);
    CHECK_ST(parse("{\"model_type\": \"qwen2\", \"hidden_size\": 512, \"num_hidden_layers\": 1,"
                   " \"num_attention_heads\": 16, \"intermediate_size\": 8, \"vocab_size\": 10}",
                   &c),
             WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("num_key_value_heads = 32");

    /* Qwen3Config's head_dim default is 128, whatever Hd / H is */
    CHECK_OK(parse("{\"model_type\": \"qwen3\", \"hidden_size\": 100, \"num_hidden_layers\": 1,"
                   " \"num_attention_heads\": 3, \"num_key_value_heads\": 1,"
                   " \"intermediate_size\": 8, \"vocab_size\": 10}",
                   &c));
    CHECK(c.head_dim == 128 && c.qk_norm == 1);
}

static void config_refusals(void)
{
    static const struct {
        const char *json;
        const char *needle[2];
    } bad[] = {
        {"{\"model_type\": \"llama\", \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
         " \"intermediate_size\": 8, \"vocab_size\": 10}",
         {"missing required field hidden_size", NULL}},
        {"{\"model_type\": \"llama\", \"hidden_size\": \"128\", \"num_hidden_layers\": 1,"
         " \"num_attention_heads\": 2, \"intermediate_size\": 8, \"vocab_size\": 10}",
         {"hidden_size", "\"128\""}},
        {"{\"model_type\": \"llama\", \"hidden_size\": 128.5, \"num_hidden_layers\": 1,"
         " \"num_attention_heads\": 2, \"intermediate_size\": 8, \"vocab_size\": 10}",
         {"hidden_size must be an integer", "128.5"}},
        {"{\"model_type\": \"llama\", \"hidden_size\": 128, \"num_hidden_layers\": 1,"
         " \"num_attention_heads\": 0, \"intermediate_size\": 8, \"vocab_size\": 10}",
         {"num_attention_heads = 0", NULL}},
        {"{\"model_type\": \"llama\", \"hidden_size\": 128, \"num_hidden_layers\": 1,"
         " \"num_attention_heads\": 2, \"intermediate_size\": 8, \"vocab_size\": -5}",
         {"vocab_size = -5", NULL}},
        {"{\"model_type\": \"llama\", \"hidden_size\": 120, \"num_hidden_layers\": 1,"
         " \"num_attention_heads\": 6, \"num_key_value_heads\": 4, \"intermediate_size\": 8,"
         " \"vocab_size\": 10}",
         {"num_attention_heads = 6", "num_key_value_heads = 4"}},
        {"{\"model_type\": \"llama\", \"hidden_size\": 100, \"num_hidden_layers\": 1,"
         " \"num_attention_heads\": 3, \"intermediate_size\": 8, \"vocab_size\": 10}",
         {"hidden_size = 100", "num_attention_heads = 3"}},
        {"{\"model_type\": \"llama\", \"hidden_size\": 128, ", {"malformed JSON", "line 1"}},
        {"[1, 2]", {"object", NULL}},
        {"{\"model_type\": \"gpt2\", \"hidden_size\": 128}", {"model_type", "gpt2"}},
        {"{\"hidden_size\": 128}", {"model_type", NULL}},
        {"{\"model_type\": \"llama\", \"hidden_size\": 128, \"num_hidden_layers\": 1,"
         " \"num_attention_heads\": 2, \"intermediate_size\": 8, \"vocab_size\": 10,"
         " \"tie_word_embeddings\": \"yes\"}",
         {"tie_word_embeddings", "\"yes\""}},
        {"{\"model_type\": \"llama\", \"hidden_size\": 128, \"num_hidden_layers\": 1,"
         " \"num_attention_heads\": 2, \"intermediate_size\": 8, \"vocab_size\": 10,"
         " \"rms_norm_eps\": \"1e-6\"}",
         {"rms_norm_eps must be a number", NULL}},
        {"{\"model_type\": \"llama\", \"hidden_size\": 128, \"num_hidden_layers\": 1,"
         " \"num_attention_heads\": 2, \"intermediate_size\": 8, \"vocab_size\": 10,"
         " \"rope_parameters\": {\"rope_theta\": -1}}",
         {"rope_parameters.rope_theta", "-1"}},
    };
    wsync_model_config_t c;
    memset(&c, 0x5a, sizeof(c));
    const wsync_model_config_t before = c;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        wsync_status_t st = parse(bad[i].json, &c);
        CHECK_MSG(st == WSYNC_ERR_CONFIG, "case %zu: %s", i, wsync_status_name(st));
        for (int k = 0; k < 2 && bad[i].needle[k] != NULL; k++)
            CHECK_MSG(strstr(wsync_last_error(), bad[i].needle[k]) != NULL,
                      "case %zu: \"%s\" lacks \"%s\"", i, wsync_last_error(), bad[i].needle[k]);
    }
    CHECK(memcmp(&c, &before, sizeof(c)) == 0);     /* outputs untouched on failure */

    CHECK_ST(wsync_model_config_load("/nonexistent/wsync/config.json", &c), WSYNC_ERR_IO);
    CHECK_ERR_HAS("/nonexistent/wsync/config.json");

    /* a hand-built config goes through the same checks */
    CHECK_OK(wsync_model_config_load(TESTDATA "/hf_qwen3_tiny/config.json", &c));
    c.num_key_value_heads = 3;
    CHECK_ST(wsync_model_config_check(&c), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("num_key_value_heads = 3");
    wsync_param_t *params;
    size_t n;
    CHECK_ST(wsync_model_params(&c, 0, &params, &n), WSYNC_ERR_CONFIG);
    c.num_key_value_heads = 2;
    c.intermediate_size = 0;
    CHECK_ST(wsync_model_config_check(&c), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("intermediate_size = 0");
}

/* ------------------------------------------------------------------------------------------ */
/* The naive reference: the model's params and their contents                                   */
/* ------------------------------------------------------------------------------------------ */

typedef enum { R_VOCAB, R_Q, R_KV, R_O, R_GATE_UP, R_DOWN, R_REPL } ref_role_t;

typedef struct {
    char name[96];
    int ndim;
    int64_t rows, cols;      /* cols = 1 for 1-D params */
    ref_role_t role;
    uint32_t *data;          /* value = f(param id, row, col) */
    int *cov;                /* how many (rank, piece) pairs read each element */
} ref_param_t;

typedef struct {
    ref_param_t p[512];
    int n;
} ref_model_t;

static void ref_add(ref_model_t *m, const char *name, int ndim, int64_t rows, int64_t cols,
                    ref_role_t role)
{
    ref_param_t *p = &m->p[m->n];
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->ndim = ndim;
    p->rows = rows;
    p->cols = ndim == 1 ? 1 : cols;
    p->role = role;
    p->data = NULL;
    p->cov = NULL;
    m->n++;
}

/* Straight from HF's modeling files: the params a checkpoint of this config has. */
static void ref_build(ref_model_t *m, const wsync_model_config_t *c, int with_data)
{
    const int64_t hd = c->hidden_size, q = c->num_attention_heads * c->head_dim;
    const int64_t kv = c->num_key_value_heads * c->head_dim, im = c->intermediate_size;
    char nm[96];
    m->n = 0;
    ref_add(m, "model.embed_tokens.weight", 2, c->vocab_size, hd, R_VOCAB);
    for (int64_t l = 0; l < c->num_hidden_layers; l++) {
#define L(suffix) (snprintf(nm, sizeof(nm), "model.layers.%" PRId64 "." suffix, l), nm)
        ref_add(m, L("input_layernorm.weight"), 1, hd, 1, R_REPL);
        ref_add(m, L("self_attn.q_proj.weight"), 2, q, hd, R_Q);
        if (c->attention_bias)
            ref_add(m, L("self_attn.q_proj.bias"), 1, q, 1, R_Q);
        ref_add(m, L("self_attn.k_proj.weight"), 2, kv, hd, R_KV);
        if (c->attention_bias)
            ref_add(m, L("self_attn.k_proj.bias"), 1, kv, 1, R_KV);
        ref_add(m, L("self_attn.v_proj.weight"), 2, kv, hd, R_KV);
        if (c->attention_bias)
            ref_add(m, L("self_attn.v_proj.bias"), 1, kv, 1, R_KV);
        ref_add(m, L("self_attn.o_proj.weight"), 2, hd, q, R_O);
        if (c->o_proj_bias)
            ref_add(m, L("self_attn.o_proj.bias"), 1, hd, 1, R_REPL);
        if (c->qk_norm) {
            ref_add(m, L("self_attn.q_norm.weight"), 1, c->head_dim, 1, R_REPL);
            ref_add(m, L("self_attn.k_norm.weight"), 1, c->head_dim, 1, R_REPL);
        }
        ref_add(m, L("post_attention_layernorm.weight"), 1, hd, 1, R_REPL);
        ref_add(m, L("mlp.gate_proj.weight"), 2, im, hd, R_GATE_UP);
        if (c->mlp_bias)
            ref_add(m, L("mlp.gate_proj.bias"), 1, im, 1, R_GATE_UP);
        ref_add(m, L("mlp.up_proj.weight"), 2, im, hd, R_GATE_UP);
        if (c->mlp_bias)
            ref_add(m, L("mlp.up_proj.bias"), 1, im, 1, R_GATE_UP);
        ref_add(m, L("mlp.down_proj.weight"), 2, hd, im, R_DOWN);
        if (c->mlp_bias)
            ref_add(m, L("mlp.down_proj.bias"), 1, hd, 1, R_REPL);
#undef L
    }
    ref_add(m, "model.norm.weight", 1, hd, 1, R_REPL);
    if (!c->tie_word_embeddings)
        ref_add(m, "lm_head.weight", 2, c->vocab_size, hd, R_VOCAB);
    if (!with_data)
        return;
    for (int i = 0; i < m->n; i++) {
        ref_param_t *p = &m->p[i];
        size_t ne = (size_t)(p->rows * p->cols);
        p->data = malloc(ne * sizeof(uint32_t));
        p->cov = calloc(ne, sizeof(int));
        for (int64_t r = 0; r < p->rows; r++)
            for (int64_t k = 0; k < p->cols; k++)
                p->data[r * p->cols + k] = ((uint32_t)(i + 1) << 22) | ((uint32_t)r << 11) |
                                           (uint32_t)k;
    }
}

static void ref_free(ref_model_t *m)
{
    for (int i = 0; i < m->n; i++) {
        free(m->p[i].data);
        free(m->p[i].cov);
    }
    m->n = 0;
}

static ref_param_t *ref_find(ref_model_t *m, const char *name)
{
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->p[i].name, name) == 0)
            return &m->p[i];
    return NULL;
}

static void model_params_match_reference(void)
{
    wsync_model_config_t cfgs[3];
    CHECK_OK(wsync_model_config_load(TESTDATA "/hf_qwen3_tiny/config.json", &cfgs[0]));
    CHECK_OK(parse("{\"model_type\": \"qwen2\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
                   " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\":"
                   " 96, \"vocab_size\": 100, \"tie_word_embeddings\": true}",
                   &cfgs[1]));
    CHECK_OK(parse("{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 3,"
                   " \"num_attention_heads\": 4, \"intermediate_size\": 96, \"vocab_size\": 100,"
                   " \"attention_bias\": true, \"mlp_bias\": true}",
                   &cfgs[2]));
    static ref_model_t ref;
    for (int c = 0; c < 3; c++) {
        wsync_param_t *p;
        size_t n;
        ref_build(&ref, &cfgs[c], 0);
        CHECK_OK(wsync_model_params(&cfgs[c], 0, &p, &n));
        CHECK_MSG(n == (size_t)ref.n, "config %d: %zu params, reference %d", c, n, ref.n);
        for (size_t i = 0; i < n && i < (size_t)ref.n; i++) {
            const ref_param_t *r = &ref.p[i];
            CHECK_MSG(strcmp(p[i].name, r->name) == 0, "param %zu: %s vs %s", i, p[i].name,
                      r->name);
            CHECK(p[i].ndim == r->ndim && p[i].shape[0] == r->rows);
            CHECK(r->ndim == 1 || p[i].shape[1] == r->cols);
            /* dtype 0: the config's, else bf16 */
            CHECK(p[i].dtype == (cfgs[c].dtype ? cfgs[c].dtype : WSYNC_DTYPE_BF16));
        }
        wsync_model_params_free(p, n);
    }
    /* the tiny Qwen3 checkpoint: 1 + 2 * 11 + 2 params, untied */
    wsync_param_t *p;
    size_t n;
    CHECK_OK(wsync_model_params(&cfgs[0], WSYNC_DTYPE_F32, &p, &n));
    CHECK(n == 25);
    CHECK(strcmp(p[n - 1].name, "lm_head.weight") == 0 && p[n - 1].dtype == WSYNC_DTYPE_F32);
    wsync_model_params_free(p, n);
    wsync_model_params_free(NULL, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* Sender layouts                                                                               */
/* ------------------------------------------------------------------------------------------ */

static void fsdp_boxes(void)
{
    /* hand-checked cases: short and empty last shards */
    static const struct {
        int64_t rows;
        int n;
        int64_t start[5], len[5];
    } cases[] = {
        {5, 4, {0, 2, 4, 5}, {2, 2, 1, 0}},
        {3, 4, {0, 1, 2, 3}, {1, 1, 1, 0}},
        {1, 3, {0, 1, 1}, {1, 0, 0}},
        {8, 4, {0, 2, 4, 6}, {2, 2, 2, 2}},
        {10, 4, {0, 3, 6, 9}, {3, 3, 3, 1}},
        {9, 5, {0, 2, 4, 6, 8}, {2, 2, 2, 2, 1}},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        wsync_param_t p = {"w", WSYNC_DTYPE_BF16, 2, {cases[c].rows, 7}};
        for (int r = 0; r < cases[c].n; r++) {
            wsync_box_t b;
            CHECK_OK(wsync_layout_shard_box(&p, 0, r, cases[c].n, &b));
            CHECK_MSG(b.start[0] == cases[c].start[r] && b.len[0] == cases[c].len[r],
                      "rows %" PRId64 " N %d rank %d: [%" PRId64 ", +%" PRId64 ")", cases[c].rows,
                      cases[c].n, r, b.start[0], b.len[0]);
            CHECK(b.start[1] == 0 && b.len[1] == 7);
        }
    }

    /* random shapes, dims and N: the boxes tile the param exactly once */
    for (int trial = 0; trial < 300; trial++) {
        int ndim = 1 + (int)rnd(3), nranks = 1 + (int)rnd(9);
        wsync_param_t p = {"p", WSYNC_DTYPE_F32, ndim, {0}};
        int64_t total = 1;
        for (int d = 0; d < ndim; d++) {
            p.shape[d] = 1 + rnd(11);
            total *= p.shape[d];
        }
        int dim = rnd(4) == 0 ? WSYNC_REPLICATE : (int)rnd((uint32_t)ndim);
        int *cov = calloc((size_t)total, sizeof(int));
        for (int r = 0; r < nranks; r++) {
            wsync_box_t b;
            CHECK_OK(wsync_layout_shard_box(&p, dim, r, nranks, &b));
            if (dim >= 0) {
                int64_t n = p.shape[dim], c = ceil_div(n, nranks);
                int64_t lo = r * c > n ? n : r * c, hi = (r + 1) * c > n ? n : (r + 1) * c;
                CHECK(b.start[dim] == lo && b.len[dim] == hi - lo);
            }
            int64_t idx[WSYNC_MAX_DIMS] = {0};
            int empty = 0;
            for (int d = 0; d < ndim; d++)
                empty |= b.len[d] == 0;
            while (!empty) {
                int64_t flat = 0;
                for (int d = 0; d < ndim; d++)
                    flat = flat * p.shape[d] + b.start[d] + idx[d];
                cov[flat]++;
                int d = ndim - 1;
                while (d >= 0 && ++idx[d] == b.len[d])
                    idx[d--] = 0;
                if (d < 0)
                    break;
            }
        }
        int want = dim == WSYNC_REPLICATE ? nranks : 1;
        for (int64_t e = 0; e < total; e++)
            CHECK_MSG(cov[e] == want, "trial %d elem %" PRId64 ": covered %d times", trial, e,
                      cov[e]);
        free(cov);
    }

    wsync_param_t p = {"model.norm.weight", WSYNC_DTYPE_BF16, 1, {16}};
    wsync_box_t b;
    CHECK_ST(wsync_layout_shard_box(&p, 1, 0, 2, &b), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("model.norm.weight");
    CHECK_ST(wsync_layout_shard_box(&p, 0, 2, 2, &b), WSYNC_ERR_INVALID);
    CHECK_ST(wsync_layout_shard_box(&p, 0, 0, 0, &b), WSYNC_ERR_INVALID);
}

static void fsdp_model_shards(void)
{
    wsync_model_config_t cfg;
    CHECK_OK(wsync_model_config_load(TESTDATA "/hf_qwen3_tiny/config.json", &cfg));
    static ref_model_t ref;
    ref_build(&ref, &cfg, 0);
    for (int nranks = 1; nranks <= 5; nranks++) {
        int64_t *covered = calloc((size_t)ref.n, sizeof(int64_t));
        for (int r = 0; r < nranks; r++) {
            wsync_shard_t *s;
            size_t n;
            CHECK_OK(wsync_layout_fsdp_shards(&cfg, WSYNC_DTYPE_F32, r, nranks, &s, &n));
            CHECK(n == (size_t)ref.n);
            for (size_t i = 0; i < n && i < (size_t)ref.n; i++) {
                CHECK(strcmp(s[i].param.name, ref.p[i].name) == 0);
                CHECK(s[i].param.dtype == WSYNC_DTYPE_F32 && s[i].data == NULL);
                CHECK(s[i].mem == WSYNC_MEM_HOST);
                CHECK(s[i].box.start[0] + s[i].box.len[0] <= ref.p[i].rows);
                CHECK(ref.p[i].ndim == 1 || s[i].box.len[1] == ref.p[i].cols);
                /* contiguous tiling: each rank starts where the previous ended */
                CHECK(s[i].box.start[0] == covered[i] || s[i].box.len[0] == 0);
                covered[i] += s[i].box.len[0];
            }
            wsync_layout_shards_free(s, n);
        }
        for (int i = 0; i < ref.n; i++)
            CHECK(covered[i] == ref.p[i].rows);
        free(covered);
    }
    wsync_layout_shards_free(NULL, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* TP targets against the spec's formulas                                                        */
/* ------------------------------------------------------------------------------------------ */

/* Copy rows [r0, r0+n) (all cols) of p to row d0 of out (cols wide), p->cols == cols. */
static void ref_rows(const ref_param_t *p, int64_t r0, int64_t n, uint32_t *out, int64_t d0)
{
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < p->cols; k++)
            out[(d0 + i) * p->cols + k] = p->data[(r0 + i) * p->cols + k];
}

/* What target `t` of rank r must hold, by RESHARD_SPEC's formulas, into out (UNSET where vLLM
 * has zero padding). Returns 0 if the target is not one the spec expects. */
static int ref_target(ref_model_t *m, const wsync_model_config_t *c, int r, int T, int64_t pad,
                      const char *name, int64_t rows_out, int64_t cols_out, uint32_t *out)
{
    const int64_t H = c->num_attention_heads, K = c->num_key_value_heads, D = c->head_dim;
    char base[96], nm[256];
    size_t ne = (size_t)(rows_out * cols_out);
    for (size_t e = 0; e < ne; e++)
        out[e] = UNSET;

    ref_param_t *p = ref_find(m, name);
    if (p != NULL && p->role == R_REPL) {
        if (rows_out != p->rows || cols_out != p->cols)
            return 0;
        ref_rows(p, 0, p->rows, out, 0);
        return 1;
    }
    if (p != NULL && p->role == R_VOCAB) {
        int64_t Vp = ceil_div(p->rows, pad) * pad, Vr = Vp / T;
        if (rows_out != Vr || cols_out != p->cols)
            return 0;
        for (int64_t i = 0; i < Vr; i++)
            if (r * Vr + i < p->rows)
                ref_rows(p, r * Vr + i, 1, out, i);
        return 1;
    }
    if (p != NULL && (p->role == R_O || p->role == R_DOWN)) {
        int64_t w = p->cols / T;
        if (rows_out != p->rows || cols_out != w)
            return 0;
        for (int64_t i = 0; i < p->rows; i++)
            for (int64_t k = 0; k < w; k++)
                out[i * w + k] = p->data[i * p->cols + r * w + k];
        return 1;
    }
    const char *s;
    if ((s = strstr(name, "self_attn.qkv_proj.")) != NULL) {
        snprintf(base, sizeof(base), "%.*s", (int)(s - name), name);
        const char *kind = s + strlen("self_attn.qkv_proj.");
        int64_t Hr = H / T, Kr = K >= T ? K / T : 1, rep = K >= T ? 1 : T / K, kr = r / rep;
        snprintf(nm, sizeof(nm), "%sself_attn.q_proj.%s", base, kind);
        ref_param_t *q = ref_find(m, nm);
        snprintf(nm, sizeof(nm), "%sself_attn.k_proj.%s", base, kind);
        ref_param_t *k = ref_find(m, nm);
        snprintf(nm, sizeof(nm), "%sself_attn.v_proj.%s", base, kind);
        ref_param_t *v = ref_find(m, nm);
        if (q == NULL || k == NULL || v == NULL || rows_out != (Hr + 2 * Kr) * D ||
            cols_out != q->cols)
            return 0;
        ref_rows(q, r * Hr * D, Hr * D, out, 0);
        ref_rows(k, kr * Kr * D, Kr * D, out, Hr * D);
        ref_rows(v, kr * Kr * D, Kr * D, out, Hr * D + Kr * D);
        return 1;
    }
    if ((s = strstr(name, "mlp.gate_up_proj.")) != NULL) {
        snprintf(base, sizeof(base), "%.*s", (int)(s - name), name);
        const char *kind = s + strlen("mlp.gate_up_proj.");
        int64_t Ir = c->intermediate_size / T;
        snprintf(nm, sizeof(nm), "%smlp.gate_proj.%s", base, kind);
        ref_param_t *g = ref_find(m, nm);
        snprintf(nm, sizeof(nm), "%smlp.up_proj.%s", base, kind);
        ref_param_t *u = ref_find(m, nm);
        if (g == NULL || u == NULL || rows_out != 2 * Ir || cols_out != g->cols)
            return 0;
        ref_rows(g, r * Ir, Ir, out, 0);
        ref_rows(u, r * Ir, Ir, out, Ir);
        return 1;
    }
    return 0;
}

/* The engine's target names, in the documented order. */
static int ref_target_names(const wsync_model_config_t *c, char names[][96])
{
    int n = 0;
    snprintf(names[n++], 96, "model.embed_tokens.weight");
    for (int64_t l = 0; l < c->num_hidden_layers; l++) {
#define N(suffix) snprintf(names[n++], 96, "model.layers.%" PRId64 "." suffix, l)
        N("input_layernorm.weight");
        N("self_attn.qkv_proj.weight");
        if (c->attention_bias)
            N("self_attn.qkv_proj.bias");
        N("self_attn.o_proj.weight");
        if (c->o_proj_bias)
            N("self_attn.o_proj.bias");
        if (c->qk_norm) {
            N("self_attn.q_norm.weight");
            N("self_attn.k_norm.weight");
        }
        N("post_attention_layernorm.weight");
        N("mlp.gate_up_proj.weight");
        if (c->mlp_bias)
            N("mlp.gate_up_proj.bias");
        N("mlp.down_proj.weight");
        if (c->mlp_bias)
            N("mlp.down_proj.bias");
#undef N
    }
    snprintf(names[n++], 96, "model.norm.weight");
    if (!c->tie_word_embeddings)
        snprintf(names[n++], 96, "lm_head.weight");
    return n;
}

/* Apply every piece of rank r's targets by a plain loop and compare with ref_target. */
static void check_rank_targets(ref_model_t *m, const wsync_model_config_t *c, int r, int T,
                               int64_t pad, const char *label)
{
    wsync_tp_options_t o = WSYNC_TP_OPTIONS_INIT;
    wsync_target_t *t;
    size_t n;
    static char names[512][96];
    o.param_dtype = WSYNC_DTYPE_F32;
    o.vocab_pad = pad;

    CHECK_OK(wsync_layout_tp_targets(c, r, T, &o, &t, &n));
    if (check_failures)
        return;
    int nn = ref_target_names(c, names);
    CHECK_MSG(n == (size_t)nn, "%s rank %d: %zu targets, expected %d", label, r, n, nn);
    for (size_t i = 0; i < n && i < (size_t)nn; i++) {
        const wsync_target_t *tg = &t[i];
        CHECK_MSG(strcmp(tg->name, names[i]) == 0, "%s: target %zu is %s, expected %s", label, i,
                  tg->name, names[i]);
        CHECK(tg->dtype == WSYNC_DTYPE_F32 && tg->data == NULL);
        CHECK(tg->quant.scheme == WSYNC_QUANT_NONE);
        int64_t rows = tg->shape[0], cols = tg->ndim == 2 ? tg->shape[1] : 1;
        CHECK(tg->ndim == 1 || tg->ndim == 2);
        CHECK(wsync_target_bytes(tg) == (size_t)(rows * cols) * 4);

        uint32_t *got = malloc((size_t)(rows * cols) * sizeof(uint32_t));
        uint32_t *want = malloc((size_t)(rows * cols) * sizeof(uint32_t));
        int *written = calloc((size_t)(rows * cols), sizeof(int));
        for (int64_t e = 0; e < rows * cols; e++)
            got[e] = UNSET;
        for (int k = 0; k < tg->npieces; k++) {
            const wsync_piece_t *pc = &tg->pieces[k];
            ref_param_t *p = ref_find(m, pc->param.name);
            CHECK_MSG(p != NULL, "%s: piece of %s names unknown param %s", label, tg->name,
                      pc->param.name);
            if (p == NULL)
                continue;
            CHECK(pc->param.ndim == p->ndim && pc->param.shape[0] == p->rows);
            CHECK(p->ndim == 1 || pc->param.shape[1] == p->cols);
            CHECK(pc->param.dtype == WSYNC_DTYPE_F32);
            int64_t s0 = pc->src.start[0], n0 = pc->src.len[0];
            int64_t s1 = p->ndim == 2 ? pc->src.start[1] : 0;
            int64_t n1 = p->ndim == 2 ? pc->src.len[1] : 1;
            int64_t d0 = pc->dst_start[0], d1 = tg->ndim == 2 ? pc->dst_start[1] : 0;
            int inside = s0 >= 0 && s0 + n0 <= p->rows && s1 >= 0 && s1 + n1 <= p->cols &&
                         d0 >= 0 && d0 + n0 <= rows && d1 >= 0 && d1 + n1 <= cols;
            CHECK_MSG(inside, "%s: piece %d of %s out of bounds", label, k, tg->name);
            if (!inside)
                continue;
            for (int64_t i = 0; i < n0; i++) {
                for (int64_t j = 0; j < n1; j++) {
                    int64_t de = (d0 + i) * cols + d1 + j, se = (s0 + i) * p->cols + s1 + j;
                    got[de] = p->data[se];
                    written[de]++;
                    p->cov[se]++;
                }
            }
        }
        for (int64_t e = 0; e < rows * cols; e++)
            CHECK_MSG(written[e] <= 1, "%s: %s element %" PRId64 " written %d times", label,
                      tg->name, e, written[e]);
        int known = ref_target(m, c, r, T, pad > 0 ? pad : 64, tg->name, rows, cols, want);
        CHECK_MSG(known, "%s: target %s [%" PRId64 ", %" PRId64 "] is not what the spec gives",
                  label, tg->name, rows, cols);
        if (known) {
            int64_t bad = -1;
            for (int64_t e = 0; e < rows * cols && bad < 0; e++)
                if (got[e] != want[e])
                    bad = e;
            CHECK_MSG(bad < 0, "%s rank %d: %s differs at element %" PRId64 ": %08x vs %08x",
                      label, r, tg->name, bad, got[bad], want[bad]);
        }
        free(got);
        free(want);
        free(written);
    }
    wsync_layout_targets_free(t, n);
}

/* After every rank: how often vLLM reads each param element across the TP group. */
static void check_coverage(ref_model_t *m, const wsync_model_config_t *c, int T, const char *label)
{
    const int64_t K = c->num_key_value_heads;
    for (int i = 0; i < m->n; i++) {
        const ref_param_t *p = &m->p[i];
        int want = 1;
        if (p->role == R_REPL)
            want = T;
        else if (p->role == R_KV)
            want = K >= T ? 1 : (int)(T / K);     /* each kv head on T / K ranks */
        for (int64_t e = 0; e < p->rows * p->cols; e++) {
            if (p->cov[e] != want) {
                CHECK_MSG(0, "%s: %s element %" PRId64 " read %d times, expected %d", label,
                          p->name, e, p->cov[e], want);
                break;
            }
        }
    }
}

/* A random model that vLLM accepts at TP size T, in the requested K regime. */
static void random_model(wsync_model_config_t *c, int T, int regime /* <0: K<T, 0: =, >0: > */)
{
    memset(c, 0, sizeof(*c));
    c->model_type = (wsync_model_type_t)(1 + rnd(3));
    int64_t K;
    if (regime < 0)
        K = (int64_t)T >> (1 + rnd(T == 2 ? 1 : T == 4 ? 2 : 3));   /* divides T, < T */
    else if (regime == 0)
        K = T;
    else
        K = (int64_t)T * (2 + rnd(2));
    int64_t g = 1 + rnd(3);
    if (K < T)
        g *= T / K;                           /* H % T == 0 */
    c->num_key_value_heads = K;
    c->num_attention_heads = K * g;
    c->head_dim = 1 + rnd(6);
    c->hidden_size = 2 + rnd(11);
    c->intermediate_size = (int64_t)T * (1 + rnd(4));
    do
        c->vocab_size = T + rnd(300);
    while (c->vocab_size % 64 == 0);
    c->num_hidden_layers = 1 + rnd(2);
    c->max_position_embeddings = 128;
    c->tie_word_embeddings = (int)rnd(2);
    c->qk_norm = c->model_type == WSYNC_MODEL_QWEN3;
    if (c->model_type == WSYNC_MODEL_QWEN2) {
        c->attention_bias = 1;
    } else {
        c->attention_bias = (int)rnd(2);
        c->o_proj_bias = c->attention_bias;
    }
    c->mlp_bias = c->model_type == WSYNC_MODEL_LLAMA && rnd(2);
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 10000.0;
}

static void tp_targets_match_spec(void)
{
    static const int sizes[] = {1, 2, 4, 8};
    static ref_model_t ref;
    int trials = 0;
    for (int si = 0; si < 4; si++) {
        int T = sizes[si];
        for (int regime = -1; regime <= 1; regime++) {
            if (regime < 0 && T == 1)
                continue;                     /* no K < 1 */
            for (int rep = 0; rep < 12; rep++) {
                wsync_model_config_t c;
                random_model(&c, T, regime);
                CHECK_OK(wsync_model_config_check(&c));
                /* vocab padding: vLLM's 64, or a smaller multiple of T */
                int64_t pad = rep % 3 == 0 ? 64 : (rep % 3 == 1 ? 0 : 8 * T);
                int64_t eff_pad = pad == 0 ? 64 : pad;
                char label[160];
                snprintf(label, sizeof(label),
                         "%s T=%d H=%" PRId64 " K=%" PRId64 " D=%" PRId64 " Hd=%" PRId64
                         " I=%" PRId64 " V=%" PRId64 " pad=%" PRId64 " tied=%d",
                         wsync_model_type_name(c.model_type), T, c.num_attention_heads,
                         c.num_key_value_heads, c.head_dim, c.hidden_size, c.intermediate_size,
                         c.vocab_size, eff_pad, c.tie_word_embeddings);
                ref_build(&ref, &c, 1);
                int before = check_failures;
                for (int r = 0; r < T; r++)
                    check_rank_targets(&ref, &c, r, T, pad, label);
                check_coverage(&ref, &c, T, label);
                ref_free(&ref);
                trials++;
                if (check_failures != before)
                    return;                   /* one failing model tells enough */
            }
        }
    }
    CHECK(trials == 4 * 12 * 3 - 12);
}

/* Dv != D and the single-target builders on their own. */
static void single_target_builders(void)
{
    wsync_param_t q = {"q", WSYNC_DTYPE_BF16, 2, {4 * 3, 10}};
    wsync_param_t k = {"k", WSYNC_DTYPE_BF16, 2, {2 * 3, 10}};
    wsync_param_t v = {"v", WSYNC_DTYPE_BF16, 2, {2 * 5, 10}};   /* Dv = 5 */
    wsync_target_t t;

    /* H = 4, K = 2, T = 4: Hr = 1, Kr = 1, rep = 2; rank 3 reads kv shard 1 */
    CHECK_OK(wsync_layout_qkv("qkv", &q, &k, &v, 4, 2, 3, 4, &t));
    CHECK(strcmp(t.name, "qkv") == 0 && t.ndim == 2);
    CHECK(t.shape[0] == 3 + 3 + 5 && t.shape[1] == 10);
    CHECK(t.npieces == 3);
    if (t.npieces == 3) {
        CHECK(t.pieces[0].src.start[0] == 9 && t.pieces[0].src.len[0] == 3);
        CHECK(t.pieces[0].dst_start[0] == 0);
        CHECK(t.pieces[1].src.start[0] == 3 && t.pieces[1].src.len[0] == 3);
        CHECK(t.pieces[1].dst_start[0] == 3);
        CHECK(t.pieces[2].src.start[0] == 5 && t.pieces[2].src.len[0] == 5);
        CHECK(t.pieces[2].dst_start[0] == 6);
        CHECK(t.pieces[2].src.len[1] == 10 && strcmp(t.pieces[2].param.name, "v") == 0);
    }
    CHECK(wsync_target_bytes(&t) == 11 * 10 * 2);
    wsync_layout_target_free(&t);
    CHECK(t.name == NULL && t.pieces == NULL);
    wsync_layout_target_free(NULL);

    CHECK_OK(wsync_layout_row_parallel(&q, 1, 2, &t));       /* columns [5, 10) */
    CHECK(t.shape[0] == 12 && t.shape[1] == 5 && t.npieces == 1);
    CHECK(t.pieces[0].src.start[1] == 5 && t.pieces[0].src.len[1] == 5);
    CHECK(t.pieces[0].src.start[0] == 0 && t.pieces[0].src.len[0] == 12);
    wsync_layout_target_free(&t);
    CHECK_ST(wsync_layout_row_parallel(&q, 0, 3, &t), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("q: row-parallel input size 10");

    CHECK_OK(wsync_layout_column_parallel(&q, 2, 3, &t));    /* rows [8, 12) */
    CHECK(t.shape[0] == 4 && t.pieces[0].src.start[0] == 8 && strcmp(t.name, "q") == 0);
    wsync_layout_target_free(&t);
    CHECK_ST(wsync_layout_column_parallel(&q, 0, 5, &t), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("12 output rows");
    CHECK_ST(wsync_layout_column_parallel(&q, 3, 3, &t), WSYNC_ERR_INVALID);

    wsync_param_t parts[2] = {{"gate", WSYNC_DTYPE_F32, 1, {8}}, {"up", WSYNC_DTYPE_F32, 1, {8}}};
    CHECK_OK(wsync_layout_merged_column("gate_up.bias", parts, 2, 1, 2, &t));
    CHECK(t.ndim == 1 && t.shape[0] == 8 && t.npieces == 2);
    CHECK(t.pieces[1].src.start[0] == 4 && t.pieces[1].dst_start[0] == 4);
    CHECK(wsync_target_bytes(&t) == 32);
    wsync_layout_target_free(&t);

    /* V = 100, pad 64 → Vp = 128, T = 2 → Vr = 64: rank 1 holds rows 64..99 and 28 zero rows */
    wsync_param_t e = {"embed", WSYNC_DTYPE_BF16, 2, {100, 6}};
    CHECK_OK(wsync_layout_vocab_parallel(&e, 0, 1, 2, &t));
    CHECK(t.shape[0] == 64 && t.npieces == 1);
    CHECK(t.pieces[0].src.start[0] == 64 && t.pieces[0].src.len[0] == 36);
    wsync_layout_target_free(&t);
    /* V = 10, pad 64, T = 4 → Vr = 16: ranks 1..3 hold only padding, so no piece at all */
    wsync_param_t e2 = {"embed", WSYNC_DTYPE_BF16, 2, {10, 6}};
    CHECK_OK(wsync_layout_vocab_parallel(&e2, 64, 2, 4, &t));
    CHECK(t.shape[0] == 16 && t.npieces == 0);
    wsync_layout_target_free(&t);

    CHECK_OK(wsync_layout_replicated(&e, &t));
    CHECK(t.shape[0] == 100 && t.shape[1] == 6 && t.npieces == 1);
    wsync_layout_target_free(&t);
}

static void tp_refusals(void)
{
    wsync_model_config_t c;
    wsync_target_t *t = NULL;
    size_t n = 0;
    memset(&c, 0, sizeof(c));
    c.model_type = WSYNC_MODEL_LLAMA;
    c.hidden_size = 64;
    c.num_hidden_layers = 2;
    c.head_dim = 4;
    c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e4;
    c.vocab_size = 1000;
    c.intermediate_size = 64;

    c.num_attention_heads = 12;
    c.num_key_value_heads = 4;
    CHECK_ST(wsync_layout_tp_targets(&c, 0, 8, NULL, &t, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("qkv_proj.weight");
    CHECK_ERR_HAS("H = 12");
    CHECK_ERR_HAS("T = 8");
    CHECK(t == NULL && n == 0);

    c.num_key_value_heads = 6;                   /* K >= T, K % T != 0 */
    CHECK_ST(wsync_layout_tp_targets(&c, 0, 4, NULL, &t, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("K = 6");
    CHECK_ERR_HAS("T = 4");

    c.num_key_value_heads = 3;                   /* K < T, T % K != 0 */
    CHECK_ST(wsync_layout_tp_targets(&c, 1, 4, NULL, &t, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("K = 3");
    CHECK_ERR_HAS("T = 4");

    c.num_key_value_heads = 2;
    c.intermediate_size = 10;                    /* I % T */
    CHECK_ST(wsync_layout_tp_targets(&c, 0, 4, NULL, &t, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("gate_up_proj.weight");
    CHECK_ERR_HAS("I = 10");

    c.intermediate_size = 64;
    c.vocab_size = 100;                          /* Vp = 100 with pad 10; 100 % 8 */
    c.num_attention_heads = 8;
    wsync_tp_options_t o = WSYNC_TP_OPTIONS_INIT;
    o.vocab_pad = 10;
    CHECK_ST(wsync_layout_tp_targets(&c, 0, 8, &o, &t, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("embed_tokens");
    CHECK_ERR_HAS("Vp = 100");
    CHECK_ERR_HAS("T = 8");
    CHECK_OK(wsync_layout_tp_targets(&c, 7, 8, NULL, &t, &n));   /* pad 64: Vp = 128 */
    wsync_layout_targets_free(t, n);
    t = NULL;
    n = 0;

    CHECK_ST(wsync_layout_tp_targets(&c, 8, 8, NULL, &t, &n), WSYNC_ERR_INVALID);
    CHECK_ST(wsync_layout_tp_targets(&c, 0, 0, NULL, &t, &n), WSYNC_ERR_INVALID);
    c.num_attention_heads = 0;
    CHECK_ST(wsync_layout_tp_targets(&c, 0, 1, NULL, &t, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("num_attention_heads = 0");
    CHECK(t == NULL && n == 0);
}

/* A Qwen2-7B-shaped model: linear weights turn FP8, the rest stays; block FP8 refusals. */
static void tp_fp8_targets(void)
{
    wsync_model_config_t c;
    /* Qwen2-0.5B: D = 64, so 7 heads per rank at T = 2 are 448 rows, 3.5 blocks */
    CHECK_OK(parse("{\"model_type\": \"qwen2\", \"hidden_size\": 896, \"num_hidden_layers\": 1,"
                   " \"num_attention_heads\": 14, \"num_key_value_heads\": 2,"
                   " \"intermediate_size\": 18944, \"vocab_size\": 152064,"
                   " \"torch_dtype\": \"bfloat16\"}",
                   &c));
    wsync_tp_options_t o = WSYNC_TP_OPTIONS_INIT;
    wsync_target_t *t;
    size_t n;
    o.quant.scheme = WSYNC_QUANT_BLOCK;
    CHECK_ST(wsync_layout_tp_targets(&c, 0, 8, &o, &t, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("H = 14");                      /* 14 heads do not split 8 ways at all */
    CHECK_ST(wsync_layout_tp_targets(&c, 1, 2, &o, &t, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("q_proj.weight");
    CHECK_ERR_HAS("H*D = 896 at T = 2 gives 448 rows per rank");
    /* a 7B-like shape: 4096 hidden, 32 heads of 128, 8 kv heads */
    c.head_dim = 128;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.hidden_size = 4096;
    CHECK_ST(wsync_layout_tp_targets(&c, 0, 8, &o, &t, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("gate_proj.weight");
    CHECK_ERR_HAS("I = 18944 at T = 8 gives 2368 rows per rank");
    CHECK_OK(wsync_layout_tp_targets(&c, 3, 4, &o, &t, &n));   /* 4736 = 37 blocks */
    if (check_failures == 0) {
        const wsync_target_t *qkv = find_target(t, n, "model.layers.0.self_attn.qkv_proj.weight");
        const wsync_target_t *qkvb = find_target(t, n, "model.layers.0.self_attn.qkv_proj.bias");
        const wsync_target_t *down = find_target(t, n, "model.layers.0.mlp.down_proj.weight");
        const wsync_target_t *emb = find_target(t, n, "model.embed_tokens.weight");
        const wsync_target_t *norm = find_target(t, n, "model.norm.weight");
        CHECK(qkv && qkvb && down && emb && norm);
        if (qkv && qkvb && down && emb && norm) {
            CHECK(qkv->dtype == WSYNC_DTYPE_F8E4M3FN && qkv->quant.scheme == WSYNC_QUANT_BLOCK);
            CHECK(qkv->quant.block_rows == 128 && qkv->quant.block_cols == 128);
            CHECK(qkv->quant.scales == NULL);
            CHECK(qkv->shape[0] == (8 + 2 * 2) * 128 && qkv->shape[1] == 4096);
            CHECK(wsync_target_scale_count(qkv) == 12 * 32);
            CHECK(wsync_target_bytes(qkv) == (size_t)12 * 128 * 4096);
            CHECK(down->dtype == WSYNC_DTYPE_F8E4M3FN && down->shape[1] == 4736);
            CHECK(wsync_target_scale_count(down) == 32 * 37);
            CHECK(qkvb->dtype == WSYNC_DTYPE_BF16 && qkvb->quant.scheme == WSYNC_QUANT_NONE);
            CHECK(emb->dtype == WSYNC_DTYPE_BF16 && norm->dtype == WSYNC_DTYPE_BF16);
            CHECK(emb->shape[0] == 152064 / 4);
        }
        wsync_layout_targets_free(t, n);
    }

    /* the tiny Qwen3: K*D = 64 rows cannot hold a 128-row block, whatever T */
    CHECK_OK(wsync_model_config_load(TESTDATA "/hf_qwen3_tiny/config.json", &c));
    CHECK_ST(wsync_layout_tp_targets(&c, 0, 1, &o, &t, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("k_proj.weight");
    CHECK_ERR_HAS("K*D = 64 at T = 1 gives 64 rows per rank");

    /* per-tensor and per-channel: no size rule; target dtype option for the rest */
    static const wsync_quant_scheme_t schemes[2] = {WSYNC_QUANT_TENSOR, WSYNC_QUANT_CHANNEL};
    for (int s = 0; s < 2; s++) {
        o.quant.scheme = schemes[s];
        o.dtype = WSYNC_DTYPE_F32;
        CHECK_OK(wsync_layout_tp_targets(&c, 1, 2, &o, &t, &n));
        if (check_failures)
            return;
        for (size_t i = 0; i < n; i++) {
            int linear = strstr(t[i].name, "_proj.weight") != NULL;
            CHECK_MSG(linear ? t[i].dtype == WSYNC_DTYPE_F8E4M3FN : t[i].dtype == WSYNC_DTYPE_F32,
                      "%s: dtype %s", t[i].name, wsync_dtype_name(t[i].dtype));
            CHECK(t[i].quant.scheme == (linear ? schemes[s] : WSYNC_QUANT_NONE));
            CHECK(t[i].npieces < 1 || t[i].pieces[0].param.dtype == WSYNC_DTYPE_BF16);
            if (linear)
                CHECK(wsync_target_scale_count(&t[i]) ==
                      (schemes[s] == WSYNC_QUANT_TENSOR ? 1 : (size_t)t[i].shape[0]));
        }
        wsync_layout_targets_free(t, n);
    }
    o.quant.scheme = WSYNC_QUANT_TENSOR;
    o.quant_dtype = WSYNC_DTYPE_BF16;
    CHECK_ST(wsync_layout_tp_targets(&c, 0, 1, &o, &t, &n), WSYNC_ERR_INVALID);
}

static void tied_embeddings(void)
{
    wsync_model_config_t c;
    CHECK_OK(wsync_model_config_load(TESTDATA "/hf_qwen3_tiny/config.json", &c));
    c.tie_word_embeddings = 1;
    wsync_param_t *p;
    size_t np;
    CHECK_OK(wsync_model_params(&c, 0, &p, &np));
    CHECK(np == 24);
    for (size_t i = 0; i < np; i++)
        CHECK(strcmp(p[i].name, "lm_head.weight") != 0);
    wsync_model_params_free(p, np);
    for (int r = 0; r < 2; r++) {
        wsync_target_t *t;
        size_t n;
        CHECK_OK(wsync_layout_tp_targets(&c, r, 2, NULL, &t, &n));
        CHECK(find_target(t, n, "lm_head.weight") == NULL);
        const wsync_target_t *e = find_target(t, n, "model.embed_tokens.weight");
        CHECK(e != NULL && e->shape[0] == 192 && e->npieces == 1);
        for (size_t i = 0; i < n; i++)
            for (int k = 0; k < t[i].npieces; k++)
                CHECK(strcmp(t[i].pieces[k].param.name, "lm_head.weight") != 0);
        wsync_layout_targets_free(t, n);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* End to end: FSDP-N shards with data → plan → TP targets, against the reference bytes          */
/* ------------------------------------------------------------------------------------------ */

static void fsdp_to_tp_through_plan(void)
{
    static const int sizes[] = {1, 2, 4, 8};
    static const uint64_t buckets[] = {256, 1000, 4096, 1u << 20};
    static ref_model_t ref;
    int empty_shards = 0, tied = 0, k_below_t = 0, runs = 0;

    for (int trial = 0; trial < 48; trial++) {
        int N = 1 + trial % 4, T = sizes[(trial / 4) % 4], R = 1 + (trial / 16) % 2;
        int regime = T == 1 ? (int)rnd(2) : (int)rnd(3) - 1;
        wsync_model_config_t c;
        random_model(&c, T, regime);
        if (trial % 5 == 0)
            c.tie_word_embeddings = 1;
        int64_t pad = trial % 3 == 0 ? 0 : 8 * T;
        uint64_t bucket = buckets[rnd(4)];
        char label[192];
        snprintf(label, sizeof(label),
                 "%s N=%d T=%d R=%d H=%" PRId64 " K=%" PRId64 " D=%" PRId64 " Hd=%" PRId64
                 " I=%" PRId64 " V=%" PRId64 " tied=%d bucket=%" PRIu64,
                 wsync_model_type_name(c.model_type), N, T, R, c.num_attention_heads,
                 c.num_key_value_heads, c.head_dim, c.hidden_size, c.intermediate_size,
                 c.vocab_size, c.tie_word_embeddings, bucket);
        ref_build(&ref, &c, 1);
        tied += c.tie_word_embeddings;
        k_below_t += c.num_key_value_heads < T;

        plan_sim_t *sim = plan_sim_new((uint32_t)N, (uint32_t)(T * R), bucket);
        CHECK(sim != NULL);
        wsync_shard_t *sh[4] = {NULL};
        size_t nsh[4] = {0};
        wsync_target_t *tg[16] = {NULL};
        size_t ntg[16] = {0};
        wsync_tp_options_t o = WSYNC_TP_OPTIONS_INIT;
        o.param_dtype = WSYNC_DTYPE_F32;
        o.vocab_pad = pad;

        /* senders: each FSDP box points into the reference param's rows */
        for (int s = 0; s < N && sim != NULL; s++) {
            CHECK_OK(wsync_layout_fsdp_shards(&c, WSYNC_DTYPE_F32, s, N, &sh[s], &nsh[s]));
            for (size_t i = 0; i < nsh[s]; i++) {
                ref_param_t *p = ref_find(&ref, sh[s][i].param.name);
                CHECK(p != NULL);
                if (p == NULL)
                    continue;
                if (sh[s][i].box.len[0] == 0)
                    empty_shards++;
                else
                    sh[s][i].data = p->data + sh[s][i].box.start[0] * p->cols;
                CHECK_OK(plan_sim_add_shard(sim, (uint32_t)s, &sh[s][i]));
            }
        }
        /* receivers: replica k of TP rank r is receiver k * T + r */
        for (int rv = 0; rv < T * R && sim != NULL; rv++) {
            CHECK_OK(wsync_layout_tp_targets(&c, rv % T, T, &o, &tg[rv], &ntg[rv]));
            for (size_t i = 0; i < ntg[rv]; i++) {
                size_t bytes = wsync_target_bytes(&tg[rv][i]);
                tg[rv][i].data = malloc(bytes);
                memset(tg[rv][i].data, 0xCD, bytes);     /* padding must come back zero */
                CHECK_OK(plan_sim_add_target(sim, (uint32_t)rv, &tg[rv][i]));
            }
        }
        if (sim != NULL && check_failures == 0) {
            plan_sim_stats_t stats;
            CHECK_OK(plan_sim_run(sim, &stats));
            if (check_failures)
                fprintf(stderr, "%s\n", label);
        }
        for (int rv = 0; rv < T * R && check_failures == 0; rv++) {
            for (size_t i = 0; i < ntg[rv]; i++) {
                const wsync_target_t *t = &tg[rv][i];
                int64_t rows = t->shape[0], cols = t->ndim == 2 ? t->shape[1] : 1;
                uint32_t *want = malloc((size_t)(rows * cols) * sizeof(uint32_t));
                int known = ref_target(&ref, &c, rv % T, T, pad > 0 ? pad : 64, t->name, rows,
                                       cols, want);
                CHECK_MSG(known, "%s: unexpected target %s", label, t->name);
                const uint32_t *got = t->data;
                for (int64_t e = 0; known && e < rows * cols; e++) {
                    uint32_t w = want[e] == UNSET ? 0 : want[e];
                    if (got[e] != w) {
                        CHECK_MSG(0, "%s receiver %d: %s element %" PRId64 ": %08x, expected %08x",
                                  label, rv, t->name, e, got[e], w);
                        break;
                    }
                }
                free(want);
            }
        }
        for (int rv = 0; rv < T * R; rv++) {
            for (size_t i = 0; i < ntg[rv]; i++)
                free(tg[rv][i].data);
            wsync_layout_targets_free(tg[rv], ntg[rv]);
        }
        for (int s = 0; s < N; s++)
            wsync_layout_shards_free(sh[s], nsh[s]);
        plan_sim_free(sim);
        ref_free(&ref);
        runs++;
        if (check_failures)
            return;
    }
    /* the cases the property is about did occur */
    CHECK(runs == 48);
    CHECK(empty_shards > 0);
    CHECK(tied > 0);
    CHECK(k_below_t > 0);
}

int main(void)
{
    RUN(config_qwen3_tiny);
    RUN(config_llama_defaults);
    RUN(config_qwen2_defaults);
    RUN(config_refusals);
    RUN(model_params_match_reference);
    RUN(fsdp_boxes);
    RUN(fsdp_model_shards);
    RUN(single_target_builders);
    RUN(tp_targets_match_spec);
    RUN(tp_refusals);
    RUN(tp_fp8_targets);
    RUN(tied_embeddings);
    RUN(fsdp_to_tp_through_plan);
    return check_summary();
}
