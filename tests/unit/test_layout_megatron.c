/* Megatron-Core sender layouts (wsync_layout_megatron_tensors, wsync_layout_tensor_shards),
 * checked against tensors built here another way: the test holds every HF param with distinct
 * values, builds each rank's Megatron tensors by Megatron's own rules (the full interleaved QKV
 * [G, (H/G + 2) * D, Hd] chunked by TP, linear_fc1 = [gate.chunk(T)[r]; up.chunk(T)[r]], dim-1
 * chunks, a zero-padded vocabulary chunked on dim 0, TEGroupedMLP experts ep_rank * E/EP + i),
 * maps every rank's tensors to shards with the library and reassembles the HF params from the
 * bytes those shards point at: every element must come back, from every rank that holds it. */
#include "wsync/wsync.h"
#include "wsync/wsync_layout.h"

#include "tests/support/check.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MOE_CONFIG WSYNC_TESTDATA "/hf_qwen3_moe_tiny/config.json"
#define DENSE_CONFIG WSYNC_TESTDATA "/hf_qwen3_tiny/config.json"
#define DEEPSEEK_CONFIG WSYNC_TESTDATA "/hf_deepseek_v3_tiny/config.json"

/* The HF model, element values distinct per (param, element); f32 params held as uint32. */
typedef struct {
    wsync_model_config_t cfg;
    wsync_param_t *params;
    size_t nparams;
    uint32_t **full;       /* full[p]: the whole param p */
    uint32_t **back;       /* back[p]: reassembled from the shards */
    uint8_t **hit;         /* hit[p][i]: element i came back at least once */
} model_t;

static uint32_t value_of(size_t p, int64_t i)
{
    uint64_t z = ((uint64_t)p << 32 | (uint64_t)i) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)(z ^ (z >> 31));
}

static int64_t numel(const wsync_param_t *p)
{
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++)
        n *= p->shape[d];
    return n;
}

static void model_init(model_t *m, const wsync_model_config_t *cfg)
{
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    CHECK_OK(wsync_model_params(cfg, WSYNC_DTYPE_F32, &m->params, &m->nparams));
    m->full = calloc(m->nparams, sizeof(*m->full));
    m->back = calloc(m->nparams, sizeof(*m->back));
    m->hit = calloc(m->nparams, sizeof(*m->hit));
    for (size_t p = 0; p < m->nparams; p++) {
        const int64_t n = numel(&m->params[p]);
        m->full[p] = malloc((size_t)n * 4);
        m->back[p] = calloc((size_t)n, 4);
        m->hit[p] = calloc((size_t)n, 1);
        for (int64_t i = 0; i < n; i++)
            m->full[p][i] = value_of(p, i);
    }
}

static void model_free(model_t *m)
{
    for (size_t p = 0; p < m->nparams; p++) {
        free(m->full[p]);
        free(m->back[p]);
        free(m->hit[p]);
    }
    free(m->full);
    free(m->back);
    free(m->hit);
    wsync_model_params_free(m->params, m->nparams);
}

static size_t find(const model_t *m, const char *name)
{
    for (size_t p = 0; p < m->nparams; p++)
        if (strcmp(m->params[p].name, name) == 0)
            return p;
    fprintf(stderr, "no HF param %s\n", name);
    abort();
}

/* Row `row` (all columns) of HF param `name`, viewed as a matrix [shape[0], rest]. */
static const uint32_t *hf_row(const model_t *m, const char *name, int64_t row, int64_t *cols)
{
    size_t p = find(m, name);
    *cols = numel(&m->params[p]) / m->params[p].shape[0];
    return m->full[p] + row * *cols;
}

/* Copy row `row` of HF param `name` to dst (the argument order of memcpy(dst, hf_row(..., &n),
 * n) would leave n unset when read first). */
static void copy_row(const model_t *m, const char *name, int64_t row, uint32_t *dst)
{
    int64_t n = 0;
    const uint32_t *src = hf_row(m, name, row, &n);
    memcpy(dst, src, (size_t)n * 4);
}

typedef struct {
    int tp_rank, tp, ep_rank, ep, etp_rank, etp;
    int64_t vocab_pad;
} ranks_t;

/* One Megatron tensor by name, built by Megatron's rules from the HF params: *rows x *cols
 * uint32 (a 1-D tensor [n] is n x 1), malloc'd; NULL for a name Megatron does not have. */
static uint32_t *megatron_tensor(const model_t *m, const ranks_t *rk, const char *name,
                                 int64_t *rows, int64_t *cols)
{
    const wsync_model_config_t *c = &m->cfg;
    const int64_t H = c->num_attention_heads, G = c->num_key_value_heads, D = c->head_dim;
    const int T = rk->tp;
    char hf[160], rest[96], hfq[160], hfk[160], hfv[160];
    int64_t l = -1, i = -1, cc = 0;
    int n = 0;

    if (strcmp(name, "embedding.word_embeddings.weight") == 0 ||
        strcmp(name, "output_layer.weight") == 0) {
        const char *src = name[0] == 'e' ? "model.embed_tokens.weight" : "lm_head.weight";
        const int64_t V = c->vocab_size, mult = rk->vocab_pad * T;
        const int64_t Vp = (V + mult - 1) / mult * mult;   /* zero rows appended up to Vp */
        *rows = Vp / T;
        *cols = c->hidden_size;
        uint32_t *t = calloc((size_t)(*rows * *cols), 4);
        for (int64_t r = 0; r < *rows; r++) {
            const int64_t g = rk->tp_rank * *rows + r;
            if (g < V)
                copy_row(m, src, g, t + r * *cols);
        }
        return t;
    }
    if (strcmp(name, "decoder.final_layernorm.weight") == 0) {
        *rows = c->hidden_size;   /* a 1-D tensor is [n] x 1 */
        *cols = 1;
        uint32_t *t = malloc((size_t)*rows * 4);
        memcpy(t, m->full[find(m, "model.norm.weight")], (size_t)*rows * 4);
        return t;
    }
    if (sscanf(name, "decoder.layers.%" SCNd64 ".%95s%n", &l, rest, &n) != 2 ||
        n != (int)strlen(name))
        return NULL;
    const char *whole = NULL;
    if (strcmp(rest, "self_attention.linear_qkv.layer_norm_weight") == 0)
        whole = "input_layernorm.weight";
    else if (strcmp(rest, "self_attention.q_layernorm.weight") == 0)
        whole = "self_attn.q_norm.weight";
    else if (strcmp(rest, "self_attention.k_layernorm.weight") == 0)
        whole = "self_attn.k_norm.weight";
    else if (strcmp(rest, "self_attention.linear_proj.bias") == 0)
        whole = "self_attn.o_proj.bias";
    else if (strcmp(rest, "mlp.linear_fc1.layer_norm_weight") == 0 ||
             strcmp(rest, "pre_mlp_layernorm.weight") == 0)
        whole = "post_attention_layernorm.weight";
    else if (strcmp(rest, "mlp.linear_fc2.bias") == 0)
        whole = "mlp.down_proj.bias";
    else if (strcmp(rest, "mlp.router.weight") == 0)
        whole = "mlp.gate.weight";
    if (whole != NULL) {
        snprintf(hf, sizeof(hf), "model.layers.%" PRId64 ".%s", l, whole);
        size_t p = find(m, hf);
        const int64_t ne = numel(&m->params[p]);
        *rows = m->params[p].shape[0];
        *cols = ne / *rows;
        uint32_t *t = malloc((size_t)ne * 4);
        memcpy(t, m->full[p], (size_t)ne * 4);
        return t;
    }
    if (strncmp(rest, "self_attention.linear_qkv.", 26) == 0) {
        const char *sfx = rest + 26;   /* "weight" or "bias" */
        snprintf(hfq, sizeof(hfq), "model.layers.%" PRId64 ".self_attn.q_proj.%s", l, sfx);
        snprintf(hfk, sizeof(hfk), "model.layers.%" PRId64 ".self_attn.k_proj.%s", l, sfx);
        snprintf(hfv, sizeof(hfv), "model.layers.%" PRId64 ".self_attn.v_proj.%s", l, sfx);
        /* the full fused weight: q.view(G, H/G*D, ..), k.view(G, D, ..), v.view(G, D, ..)
         * concatenated on dim 1, flattened to rows; rank r holds its T-th chunk of rows */
        const int64_t per = (H / G + 2) * D, all = G * per;
        *rows = all / T;
        hf_row(m, hfq, 0, cols);
        uint32_t *t = malloc((size_t)(*rows * *cols) * 4);
        for (int64_t r = 0; r < *rows; r++) {
            const int64_t f = rk->tp_rank * *rows + r, g = f / per, w = f % per;
            const uint32_t *src;
            if (w < H / G * D)
                src = hf_row(m, hfq, g * (H / G * D) + w, &cc);
            else if (w < H / G * D + D)
                src = hf_row(m, hfk, g * D + (w - H / G * D), &cc);
            else
                src = hf_row(m, hfv, g * D + (w - H / G * D - D), &cc);
            memcpy(t + r * *cols, src, (size_t)cc * 4);
        }
        return t;
    }
    /* gated: [gate.chunk(S)[s]; up.chunk(S)[s]]; row-parallel: dim-1 chunk s of S */
    const char *gate = NULL, *up = NULL, *down = NULL;
    int s = rk->tp_rank, S = T;
    char g_name[160], u_name[160], d_name[160];
    if (strcmp(rest, "mlp.linear_fc1.weight") == 0 || strcmp(rest, "mlp.linear_fc1.bias") == 0) {
        const char *sfx = rest + 15;
        snprintf(g_name, sizeof(g_name), "model.layers.%" PRId64 ".mlp.gate_proj.%s", l, sfx);
        snprintf(u_name, sizeof(u_name), "model.layers.%" PRId64 ".mlp.up_proj.%s", l, sfx);
        gate = g_name;
        up = u_name;
    } else if (strcmp(rest, "mlp.linear_fc2.weight") == 0) {
        snprintf(d_name, sizeof(d_name), "model.layers.%" PRId64 ".mlp.down_proj.weight", l);
        down = d_name;
    } else if (strcmp(rest, "self_attention.linear_proj.weight") == 0) {
        snprintf(d_name, sizeof(d_name), "model.layers.%" PRId64 ".self_attn.o_proj.weight", l);
        down = d_name;
    } else if (sscanf(rest, "mlp.experts.linear_fc1.weight%" SCNd64 "%n", &i, &n) == 1 &&
               n == (int)strlen(rest)) {
        const int64_t e = rk->ep_rank * (c->num_experts / rk->ep) + i;
        if (i >= c->num_experts / rk->ep)
            return NULL;
        snprintf(g_name, sizeof(g_name), "model.layers.%" PRId64 ".mlp.experts.%" PRId64
                 ".gate_proj.weight", l, e);
        snprintf(u_name, sizeof(u_name), "model.layers.%" PRId64 ".mlp.experts.%" PRId64
                 ".up_proj.weight", l, e);
        gate = g_name;
        up = u_name;
        s = rk->etp_rank;
        S = rk->etp;
    } else if (sscanf(rest, "mlp.experts.linear_fc2.weight%" SCNd64 "%n", &i, &n) == 1 &&
               n == (int)strlen(rest)) {
        const int64_t e = rk->ep_rank * (c->num_experts / rk->ep) + i;
        if (i >= c->num_experts / rk->ep)
            return NULL;
        snprintf(d_name, sizeof(d_name), "model.layers.%" PRId64 ".mlp.experts.%" PRId64
                 ".down_proj.weight", l, e);
        down = d_name;
        s = rk->etp_rank;
        S = rk->etp;
    } else {
        return NULL;
    }
    if (gate != NULL) {
        size_t pg = find(m, gate);
        const int64_t N = m->params[pg].shape[0], per = N / S;
        *rows = 2 * per;
        hf_row(m, gate, 0, cols);
        uint32_t *t = malloc((size_t)(*rows * *cols) * 4);
        for (int64_t r = 0; r < per; r++) {
            copy_row(m, gate, s * per + r, t + r * *cols);
            copy_row(m, up, s * per + r, t + (per + r) * *cols);
        }
        return t;
    }
    size_t pd = find(m, down);
    const int64_t R = m->params[pd].shape[0], N = m->params[pd].shape[1], per = N / S;
    *rows = R;
    *cols = per;
    uint32_t *t = malloc((size_t)(R * per) * 4);
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < per; j++)
            t[r * per + j] = m->full[pd][r * N + s * per + j];
    return t;
}

/* Tensors Megatron-Core's state dict has for one rank, counted from the config. */
static size_t expected_count(const wsync_model_config_t *c, int ep)
{
    size_t n = 2 + (c->tie_word_embeddings ? 0 : 1);
    for (int64_t l = 0; l < c->num_hidden_layers; l++) {
        n += 3 + (c->attention_bias ? 1 : 0) + (c->qk_norm ? 2 : 0) + (c->o_proj_bias ? 1 : 0);
        if (wsync_model_layer_is_moe(c, l))
            n += 2 + 2 * (size_t)(c->num_experts / ep);
        else
            n += 3 + (c->mlp_bias ? 2 : 0);
    }
    return n;
}

/* Every rank of (T, EP, ETP): the library's tensors match Megatron's by name and shape, their
 * shards point at exactly the HF elements the test's tensors hold there, and together the ranks
 * give back every element of every HF param. */
static void check_layout(const wsync_model_config_t *cfg, int T, int EP, int ETP, int64_t pad)
{
    model_t m;
    model_init(&m, cfg);
    for (int tr = 0; tr < T; tr++)
        for (int er = 0; er < EP; er++)
            for (int xr = 0; xr < ETP; xr++) {
                ranks_t rk = {tr, T, er, EP, xr, ETP, pad == 0 ? 128 : pad};
                wsync_target_t *ts = NULL;
                size_t nt = 0;
                CHECK_OK(wsync_layout_megatron_tensors(cfg, WSYNC_DTYPE_F32, tr, T, er, EP, xr,
                                                       ETP, pad, &ts, &nt));
                CHECK_MSG(nt == expected_count(cfg, EP), "T%d EP%d ETP%d: %zu tensors, "
                          "expected %zu", T, EP, ETP, nt, expected_count(cfg, EP));
                for (size_t k = 0; k < nt; k++) {
                    const wsync_target_t *t = &ts[k];
                    int64_t rows = 0, cols = 0;
                    uint32_t *mt = megatron_tensor(&m, &rk, t->name, &rows, &cols);
                    CHECK_MSG(mt != NULL, "T%d rank %d/%d/%d: Megatron has no tensor %s", T, tr,
                              er, xr, t->name);
                    if (mt == NULL)
                        continue;
                    CHECK_MSG(t->shape[0] == rows && (t->ndim == 1 ? 1 : t->shape[1]) == cols,
                              "%s: shape [%" PRId64 ", ...], Megatron's %" PRId64 " x %" PRId64,
                              t->name, t->shape[0], rows, cols);
                    CHECK(t->dtype == WSYNC_DTYPE_F32 && t->data == NULL);
                    wsync_shard_t *sh = NULL;
                    size_t ns = 0;
                    CHECK_OK(wsync_layout_tensor_shards(t, mt, WSYNC_MEM_HOST, 0, &sh, &ns));
                    for (size_t j = 0; j < ns; j++) {
                        const wsync_shard_t *s = &sh[j];
                        size_t p = find(&m, s->param.name);
                        const wsync_param_t *hp = &m.params[p];
                        CHECK(s->param.ndim == hp->ndim && s->param.shape[0] == hp->shape[0]);
                        const int64_t C = hp->ndim == 1 ? 1 : hp->shape[1];
                        const int64_t bc = hp->ndim == 1 ? 1 : s->box.len[1];
                        const int64_t c0 = hp->ndim == 1 ? 0 : s->box.start[1];
                        const uint32_t *d = s->data;
                        int bad = 0;
                        for (int64_t r = 0; r < s->box.len[0]; r++)
                            for (int64_t q = 0; q < bc; q++) {
                                const int64_t at = (s->box.start[0] + r) * C + c0 + q;
                                const uint32_t got = d[r * bc + q];
                                if (m.hit[p][at] && m.back[p][at] != got)
                                    bad++;   /* two ranks disagree on a replicated element */
                                m.back[p][at] = got;
                                m.hit[p][at] = 1;
                            }
                        CHECK_MSG(bad == 0, "%s: %d elements differ between ranks", hp->name, bad);
                    }
                    wsync_layout_shards_free(sh, ns);
                    free(mt);
                }
                wsync_layout_targets_free(ts, nt);
            }
    for (size_t p = 0; p < m.nparams; p++) {
        const int64_t n = numel(&m.params[p]);
        int64_t missing = 0, wrong = 0;
        for (int64_t i = 0; i < n; i++) {
            missing += !m.hit[p][i];
            wrong += m.hit[p][i] && m.back[p][i] != m.full[p][i];
        }
        CHECK_MSG(missing == 0 && wrong == 0, "T%d EP%d ETP%d: %s: %" PRId64 " of %" PRId64
                  " elements missing, %" PRId64 " wrong", T, EP, ETP, m.params[p].name, missing,
                  n, wrong);
    }
    model_free(&m);
}

static void load(const char *path, wsync_model_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    CHECK_OK(wsync_model_config_load(path, cfg));
}

static void test_dense_qwen3(void)
{
    wsync_model_config_t cfg;
    load(DENSE_CONFIG, &cfg);
    check_layout(&cfg, 1, 1, 1, 0);
    check_layout(&cfg, 2, 1, 1, 0);      /* V 384 -> Vp 512: rank 1 holds 128 padding rows */
    check_layout(&cfg, 2, 1, 1, 1);      /* no padding beyond T's multiple */
}

/* H 8, G 4 (two q heads per group, two groups per rank at T 2), biases everywhere, tied. */
static void test_dense_llama_biases(void)
{
    wsync_model_config_t cfg;
    load(DENSE_CONFIG, &cfg);
    cfg.model_type = WSYNC_MODEL_LLAMA;
    cfg.qk_norm = 0;
    cfg.num_attention_heads = 8;
    cfg.num_key_value_heads = 4;
    cfg.head_dim = 16;
    cfg.attention_bias = 1;
    cfg.o_proj_bias = 1;
    cfg.mlp_bias = 1;
    cfg.tie_word_embeddings = 1;
    CHECK_OK(wsync_model_config_check(&cfg));
    check_layout(&cfg, 2, 1, 1, 0);
    check_layout(&cfg, 4, 1, 1, 0);
}

static void test_moe_ep_etp(void)
{
    wsync_model_config_t cfg;
    load(MOE_CONFIG, &cfg);
    check_layout(&cfg, 2, 1, 1, 0);      /* every rank holds all 8 experts whole (ETP 1) */
    check_layout(&cfg, 2, 2, 1, 0);      /* EP-2 */
    check_layout(&cfg, 2, 2, 2, 0);      /* EP-2 x ETP-2 */
    check_layout(&cfg, 1, 4, 2, 0);
    cfg.mlp_only_layers[0] = 0;          /* layer 0 dense, layer 1 MoE */
    cfg.nmlp_only_layers = 1;
    check_layout(&cfg, 2, 2, 2, 0);
}

static void test_errors(void)
{
    wsync_model_config_t cfg, ds;
    wsync_target_t *ts = NULL;
    size_t nt = 0;
    load(MOE_CONFIG, &cfg);
    CHECK_ST(wsync_layout_megatron_tensors(&cfg, 0, 0, 4, 0, 1, 0, 1, 0, &ts, &nt),
             WSYNC_ERR_CONFIG);   /* G 2 over T 4 */
    CHECK_ERR_HAS("G = 2 is not a multiple of tp_size T = 4");
    CHECK_ST(wsync_layout_megatron_tensors(&cfg, 0, 0, 1, 0, 3, 0, 1, 0, &ts, &nt),
             WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("E = 8 is not a multiple of ep_size EP = 3");
    CHECK_ST(wsync_layout_megatron_tensors(&cfg, 0, 0, 1, 0, 1, 0, 128, 0, &ts, &nt),
             WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("Im = 64 is not a multiple of etp_size ETP = 128");
    CHECK_ST(wsync_layout_megatron_tensors(&cfg, 0, 2, 2, 0, 1, 0, 1, 0, &ts, &nt),
             WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("tp_rank: rank 2 of 2");
    load(DENSE_CONFIG, &cfg);
    cfg.intermediate_size = 385;
    CHECK_ST(wsync_layout_megatron_tensors(&cfg, 0, 0, 2, 0, 1, 0, 1, 0, &ts, &nt),
             WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("I = 385 is not a multiple of tp_size T = 2");
    load(DENSE_CONFIG, &cfg);
    CHECK_ST(wsync_layout_megatron_tensors(&cfg, 0, 0, 1, 0, 2, 0, 1, 0, &ts, &nt),
             WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("dense model without experts");
    load(DEEPSEEK_CONFIG, &ds);
    CHECK_ST(wsync_layout_megatron_tensors(&ds, 0, 0, 1, 0, 1, 0, 1, 0, &ts, &nt),
             WSYNC_ERR_UNSUPPORTED);
    CHECK_ERR_HAS("deepseek_v3 uses multi-head latent attention");
    CHECK(ts == NULL && nt == 0);

    /* a piece that is not whole rows of its tensor cannot be one shard */
    wsync_piece_t pc;
    memset(&pc, 0, sizeof(pc));
    pc.param = (wsync_param_t){"w", WSYNC_DTYPE_F32, 2, {4, 8}};
    pc.src.len[0] = 2;
    pc.src.len[1] = 4;
    wsync_target_t t = {"x", WSYNC_DTYPE_F32, 2, {4, 8}, NULL, WSYNC_MEM_HOST, 0, &pc, 1,
                        {WSYNC_QUANT_NONE, 0, 0, 0.0f, 0, 0, NULL, WSYNC_MEM_HOST}};
    wsync_shard_t *sh = NULL;
    size_t ns = 0;
    CHECK_ST(wsync_layout_tensor_shards(&t, NULL, WSYNC_MEM_HOST, 0, &sh, &ns), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("piece 0 (w) is not contiguous");
    pc.src.len[1] = 8;
    pc.dst_start[0] = 2;   /* whole rows 2..3: 16 floats in */
    float buf[32];
    CHECK_OK(wsync_layout_tensor_shards(&t, buf, WSYNC_MEM_HOST, 0, &sh, &ns));
    CHECK(ns == 1 && sh[0].data == (const void *)(buf + 16) && sh[0].box.len[0] == 2);
    wsync_layout_shards_free(sh, ns);
    pc.dst_start[0] = 3;
    CHECK_ST(wsync_layout_tensor_shards(&t, buf, WSYNC_MEM_HOST, 0, &sh, &ns), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("exceeds the tensor along dim 0 (3 + 2 > 4)");
}

int main(void)
{
    RUN(test_dense_qwen3);
    RUN(test_dense_llama_biases);
    RUN(test_moe_ep_etp);
    RUN(test_errors);
    return check_summary();
}
