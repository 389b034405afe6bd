/* Sender layouts of Megatron-Core trainers (issue 20): the tensors one tensor/expert-parallel rank
 * of a GPTModel (Transformer Engine layer spec) holds, each described as the boxes of HF
 * checkpoint params it is made of, and the split of such a tensor, given its memory, into the
 * wsync_shard_t a sender adds.
 *
 * A Megatron tensor is returned as a wsync_target_t: its pieces say which box of which HF param
 * sits where in it, exactly as a receiver's target says what lands in it. Every piece here covers
 * whole rows of its tensor (or the whole tensor), so each is contiguous in the tensor's memory and
 * becomes one shard read in place.
 *
 * Facts (read, not copied): Megatron-Bridge src/megatron/bridge/models/qwen/qwen3_moe_bridge.py
 * (names: embedding.word_embeddings, decoder.layers.*.self_attention.linear_qkv and its
 * layer_norm_weight,
 * q_layernorm / k_layernorm, linear_proj, pre_mlp_layernorm, mlp.router, TEGroupedMLP
 * mlp.experts.linear_fc1.weight<i> / linear_fc2.weight<i>, decoder.final_layernorm,
 * output_layer) and param_mapping.py (QKVMapping: per query group q heads, then k, then v;
 * GatedMLPMapping: each TP/ETP shard of linear_fc1 is [gate slice; up slice]); slime
 * update_weight/common.py and Megatron-Core's _vocab_size_with_padding (vocab padded to a multiple
 * of make_vocab_size_divisible_by * T, default 128); global expert = ep_rank * E / EP + i with
 * E % EP == 0 (Megatron-Core MoELayer). Rules: docs/megatron_layouts.md. */
#include "core/status.h"
#include "reshard/model.h"
#include "wsync/wsync.h"
#include "wsync/wsync_layout.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MEGATRON_NAME_MAX 128

/* A growable array of tensors (targets), each owning its name and pieces. */
typedef struct {
    wsync_target_t *v;
    size_t n, cap;
} tensor_vec_t;

/* Room for one more tensor; returns a zeroed slot at v[n] (n not yet advanced). */
static wsync_status_t vec_reserve(tensor_vec_t *a)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 64;
        wsync_target_t *v = realloc(a->v, cap * sizeof(*v));
        if (v == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "no memory for %zu Megatron tensors", cap);
        a->v = v;
        a->cap = cap;
    }
    memset(&a->v[a->n], 0, sizeof(a->v[a->n]));
    return WSYNC_OK;
}

/* What a builder needs besides the output: the config, dtype, ranks and sizes. */
typedef struct {
    const wsync_model_config_t *cfg;
    wsync_dtype_t dtype;
    int tp_rank, tp_size, ep_rank, ep_size, etp_rank, etp_size;
    int64_t vocab_pad;
} mg_ctx_t;

static void hf_param(const mg_ctx_t *c, wsync_mp_kind_t kind, int64_t layer, int64_t expert,
                     char buf[WSYNC_MP_NAME_MAX], wsync_param_t *p)
{
    wsync_mp_expert_param(c->cfg, kind, layer, expert, c->dtype, buf, p);
}

/* A tensor that is the whole of one HF param (norms, router; Megatron replicates them over TP). */
static wsync_status_t add_whole(tensor_vec_t *out, const mg_ctx_t *c, const char *name,
                                wsync_mp_kind_t kind, int64_t layer)
{
    char buf[WSYNC_MP_NAME_MAX];
    wsync_param_t p;
    wsync_status_t st = vec_reserve(out);

    if (st != WSYNC_OK)
        return st;
    hf_param(c, kind, layer, 0, buf, &p);
    st = wsync_lt_target_new(&out->v[out->n], name, p.dtype, p.ndim, p.shape, 1);
    if (st == WSYNC_OK)
        st = wsync_lt_target_piece(&out->v[out->n], &p, 0, p.shape[0], 0, 0, 0);
    if (st != WSYNC_OK) {
        wsync_layout_target_free(&out->v[out->n]);
        return st;
    }
    out->n++;
    return WSYNC_OK;
}

/* A row-parallel weight (linear_proj, linear_fc2): columns [r * N/T, (r + 1) * N/T) of every
 * row of the [rows, N] param; the tensor [rows, N/T] is that one box. */
static wsync_status_t add_row_parallel(tensor_vec_t *out, const mg_ctx_t *c, const char *name,
                                       wsync_mp_kind_t kind, int64_t layer, int64_t expert,
                                       int rank, int size)
{
    char buf[WSYNC_MP_NAME_MAX];
    wsync_param_t p;
    wsync_status_t st = vec_reserve(out);

    if (st != WSYNC_OK)
        return st;
    hf_param(c, kind, layer, expert, buf, &p);
    const int64_t cols = p.shape[1] / size;
    const int64_t shape[2] = {p.shape[0], cols};
    st = wsync_lt_target_new(&out->v[out->n], name, p.dtype, 2, shape, 1);
    if (st == WSYNC_OK)
        st = wsync_lt_target_piece(&out->v[out->n], &p, 0, p.shape[0], (int64_t)rank * cols,
                                   cols, 0);
    if (st != WSYNC_OK) {
        wsync_layout_target_free(&out->v[out->n]);
        return st;
    }
    out->n++;
    return WSYNC_OK;
}

/* linear_fc1 (weight or bias): rows [r * N/T, (r + 1) * N/T) of gate, then the same rows of up;
 * tensor [2 * N/T, ...]. */
static wsync_status_t add_gated(tensor_vec_t *out, const mg_ctx_t *c, const char *name,
                                wsync_mp_kind_t gate_kind, wsync_mp_kind_t up_kind, int64_t layer,
                                int64_t expert, int rank, int size)
{
    char gbuf[WSYNC_MP_NAME_MAX], ubuf[WSYNC_MP_NAME_MAX];
    wsync_param_t g, u;
    wsync_status_t st = vec_reserve(out);

    if (st != WSYNC_OK)
        return st;
    hf_param(c, gate_kind, layer, expert, gbuf, &g);
    hf_param(c, up_kind, layer, expert, ubuf, &u);
    const int64_t rows = g.shape[0] / size;
    int64_t shape[WSYNC_MAX_DIMS];
    memcpy(shape, g.shape, sizeof(shape));
    shape[0] = 2 * rows;
    wsync_target_t *t = &out->v[out->n];
    st = wsync_lt_target_new(t, name, g.dtype, g.ndim, shape, 2);
    if (st == WSYNC_OK)
        st = wsync_lt_target_piece(t, &g, (int64_t)rank * rows, rows, 0, 0, 0);
    if (st == WSYNC_OK)
        st = wsync_lt_target_piece(t, &u, (int64_t)rank * rows, rows, 0, 0, rows);
    if (st != WSYNC_OK) {
        wsync_layout_target_free(t);
        return st;
    }
    out->n++;
    return WSYNC_OK;
}

/* linear_qkv (weight or bias): query groups [r * G/T, (r + 1) * G/T) (G = K), each as its H/G q
 * heads, its k head, its v head; tensor [G/T * (H/G + 2) * D, ...]. */
static wsync_status_t add_qkv(tensor_vec_t *out, const mg_ctx_t *c, const char *name,
                              wsync_mp_kind_t qk, wsync_mp_kind_t kk, wsync_mp_kind_t vk,
                              int64_t layer)
{
    const wsync_model_config_t *cfg = c->cfg;
    char qb[WSYNC_MP_NAME_MAX], kb[WSYNC_MP_NAME_MAX], vb[WSYNC_MP_NAME_MAX];
    wsync_param_t q, k, v;
    wsync_status_t st = vec_reserve(out);

    if (st != WSYNC_OK)
        return st;
    hf_param(c, qk, layer, 0, qb, &q);
    hf_param(c, kk, layer, 0, kb, &k);
    hf_param(c, vk, layer, 0, vb, &v);
    const int64_t G = cfg->num_key_value_heads, D = cfg->head_dim;
    const int64_t qrows = cfg->num_attention_heads / G * D;   /* one group's q rows */
    const int64_t groups = G / c->tp_size;
    const int64_t group_rows = qrows + 2 * D;
    int64_t shape[WSYNC_MAX_DIMS];
    memcpy(shape, q.shape, sizeof(shape));
    shape[0] = groups * group_rows;
    wsync_target_t *t = &out->v[out->n];
    st = wsync_lt_target_new(t, name, q.dtype, q.ndim, shape, (int)(3 * groups));
    for (int64_t j = 0; j < groups && st == WSYNC_OK; j++) {
        const int64_t g = (int64_t)c->tp_rank * groups + j, at = j * group_rows;
        st = wsync_lt_target_piece(t, &q, g * qrows, qrows, 0, 0, at);
        if (st == WSYNC_OK)
            st = wsync_lt_target_piece(t, &k, g * D, D, 0, 0, at + qrows);
        if (st == WSYNC_OK)
            st = wsync_lt_target_piece(t, &v, g * D, D, 0, 0, at + qrows + D);
    }
    if (st != WSYNC_OK) {
        wsync_layout_target_free(t);
        return st;
    }
    out->n++;
    return WSYNC_OK;
}

/* embedding.word_embeddings / output_layer: Vp = ceil(V / (pad * T)) * pad * T rows split over
 * T; rank r's rows [r * Vp/T, (r + 1) * Vp/T) below V come from the param, the rest is padding no
 * piece covers. */
static wsync_status_t add_vocab(tensor_vec_t *out, const mg_ctx_t *c, const char *name,
                                wsync_mp_kind_t kind)
{
    char buf[WSYNC_MP_NAME_MAX];
    wsync_param_t p;
    wsync_status_t st = vec_reserve(out);

    if (st != WSYNC_OK)
        return st;
    hf_param(c, kind, 0, 0, buf, &p);
    const int64_t V = p.shape[0], mult = c->vocab_pad * c->tp_size;
    const int64_t Vr = (V + mult - 1) / mult * mult / c->tp_size;
    const int64_t r0 = (int64_t)c->tp_rank * Vr;
    const int64_t shape[2] = {Vr, p.shape[1]};
    wsync_target_t *t = &out->v[out->n];
    st = wsync_lt_target_new(t, name, p.dtype, 2, shape, 1);
    if (st == WSYNC_OK && r0 < V)
        st = wsync_lt_target_piece(t, &p, r0, (V - r0 < Vr ? V - r0 : Vr), 0, 0, 0);
    if (st != WSYNC_OK) {
        wsync_layout_target_free(t);
        return st;
    }
    out->n++;
    return WSYNC_OK;
}

static wsync_status_t check_sizes(const mg_ctx_t *c)
{
    const wsync_model_config_t *cfg = c->cfg;
    const int T = c->tp_size;
    int has_dense = 0, has_moe = 0;

    for (int64_t l = 0; l < cfg->num_hidden_layers; l++) {
        if (wsync_model_layer_is_moe(cfg, l))
            has_moe = 1;
        else
            has_dense = 1;
    }
    if (cfg->num_attention_heads % T != 0)
        return wsync_err(WSYNC_ERR_CONFIG, "megatron layout: num_attention_heads H = %" PRId64
                         " is not a multiple of tp_size T = %d (H %% T = %" PRId64 ")",
                         cfg->num_attention_heads, T, cfg->num_attention_heads % T);
    if (cfg->num_key_value_heads % T != 0)
        return wsync_err(WSYNC_ERR_CONFIG, "megatron layout: num_key_value_heads (query groups) "
                         "G = %" PRId64 " is not a multiple of tp_size T = %d (G %% T = %" PRId64
                         "; Megatron-Core splits whole query groups and never replicates them)",
                         cfg->num_key_value_heads, T, cfg->num_key_value_heads % T);
    if (has_dense && cfg->intermediate_size % T != 0)
        return wsync_err(WSYNC_ERR_CONFIG, "megatron layout: intermediate_size I = %" PRId64
                         " is not a multiple of tp_size T = %d (I %% T = %" PRId64 ")",
                         cfg->intermediate_size, T, cfg->intermediate_size % T);
    if (has_moe && cfg->num_experts % c->ep_size != 0)
        return wsync_err(WSYNC_ERR_CONFIG, "megatron layout: num_experts E = %" PRId64 " is not "
                         "a multiple of ep_size EP = %d (E %% EP = %" PRId64 ", which "
                         "Megatron-Core asserts to be 0)", cfg->num_experts, c->ep_size,
                         cfg->num_experts % c->ep_size);
    if (has_moe && cfg->moe_intermediate_size % c->etp_size != 0)
        return wsync_err(WSYNC_ERR_CONFIG, "megatron layout: moe_intermediate_size Im = %" PRId64
                         " is not a multiple of etp_size ETP = %d (Im %% ETP = %" PRId64 ")",
                         cfg->moe_intermediate_size, c->etp_size,
                         cfg->moe_intermediate_size % c->etp_size);
    if (c->vocab_pad > ((int64_t)1 << 30))
        return wsync_err(WSYNC_ERR_INVALID, "megatron layout: vocab_pad %" PRId64 " > 2^30",
                         c->vocab_pad);
    return WSYNC_OK;
}

/* "decoder.layers.<l>.<suffix>" into name (MEGATRON_NAME_MAX bytes). */
static const char *layer_name(char *name, int64_t l, const char *suffix)
{
    snprintf(name, MEGATRON_NAME_MAX, "decoder.layers.%" PRId64 ".%s", l, suffix);
    return name;
}

static wsync_status_t layer_tensors(tensor_vec_t *out, const mg_ctx_t *c, int64_t l)
{
    const wsync_model_config_t *cfg = c->cfg;
    const int moe = wsync_model_layer_is_moe(cfg, l);
    const int r = c->tp_rank, T = c->tp_size;
    char name[MEGATRON_NAME_MAX];
    wsync_status_t st;

#define LN(suffix) layer_name(name, l, suffix)
    st = add_whole(out, c, LN("self_attention.linear_qkv.layer_norm_weight"), WSYNC_MP_INPUT_NORM,
                   l);
    if (st == WSYNC_OK)
        st = add_qkv(out, c, LN("self_attention.linear_qkv.weight"), WSYNC_MP_Q, WSYNC_MP_K,
                     WSYNC_MP_V, l);
    if (st == WSYNC_OK && cfg->attention_bias)
        st = add_qkv(out, c, LN("self_attention.linear_qkv.bias"), WSYNC_MP_Q_BIAS,
                     WSYNC_MP_K_BIAS, WSYNC_MP_V_BIAS, l);
    if (st == WSYNC_OK && cfg->qk_norm)
        st = add_whole(out, c, LN("self_attention.q_layernorm.weight"), WSYNC_MP_Q_NORM, l);
    if (st == WSYNC_OK && cfg->qk_norm)
        st = add_whole(out, c, LN("self_attention.k_layernorm.weight"), WSYNC_MP_K_NORM, l);
    if (st == WSYNC_OK)
        st = add_row_parallel(out, c, LN("self_attention.linear_proj.weight"), WSYNC_MP_O, l, 0,
                              r, T);
    if (st == WSYNC_OK && cfg->o_proj_bias)
        st = add_whole(out, c, LN("self_attention.linear_proj.bias"), WSYNC_MP_O_BIAS, l);
    if (st == WSYNC_OK && !moe) {
        st = add_whole(out, c, LN("mlp.linear_fc1.layer_norm_weight"), WSYNC_MP_POST_NORM, l);
        if (st == WSYNC_OK)
            st = add_gated(out, c, LN("mlp.linear_fc1.weight"), WSYNC_MP_GATE, WSYNC_MP_UP, l, 0,
                           r, T);
        if (st == WSYNC_OK && cfg->mlp_bias)
            st = add_gated(out, c, LN("mlp.linear_fc1.bias"), WSYNC_MP_GATE_BIAS,
                           WSYNC_MP_UP_BIAS, l, 0, r, T);
        if (st == WSYNC_OK)
            st = add_row_parallel(out, c, LN("mlp.linear_fc2.weight"), WSYNC_MP_DOWN, l, 0, r, T);
        if (st == WSYNC_OK && cfg->mlp_bias)
            st = add_whole(out, c, LN("mlp.linear_fc2.bias"), WSYNC_MP_DOWN_BIAS, l);
    } else if (st == WSYNC_OK) {
        st = add_whole(out, c, LN("pre_mlp_layernorm.weight"), WSYNC_MP_POST_NORM, l);
        if (st == WSYNC_OK)
            st = add_whole(out, c, LN("mlp.router.weight"), WSYNC_MP_ROUTER, l);
    }
#undef LN
    if (st != WSYNC_OK || !moe)
        return st;
    /* TEGroupedMLP: local expert i of this EP rank is global expert ep_rank * E/EP + i; all
     * linear_fc1.weight<i>, then all linear_fc2.weight<i> */
    const int64_t nlocal = cfg->num_experts / c->ep_size;
    for (int pass = 0; pass < 2 && st == WSYNC_OK; pass++) {
        for (int64_t i = 0; i < nlocal && st == WSYNC_OK; i++) {
            const int64_t e = (int64_t)c->ep_rank * nlocal + i;
            snprintf(name, sizeof(name),
                     "decoder.layers.%" PRId64 ".mlp.experts.linear_fc%d.weight%" PRId64, l,
                     pass + 1, i);
            if (pass == 0)
                st = add_gated(out, c, name, WSYNC_MP_EXPERT_GATE, WSYNC_MP_EXPERT_UP, l, e,
                               c->etp_rank, c->etp_size);
            else
                st = add_row_parallel(out, c, name, WSYNC_MP_EXPERT_DOWN, l, e, c->etp_rank,
                                      c->etp_size);
        }
    }
    return st;
}

wsync_status_t wsync_layout_megatron_tensors(const wsync_model_config_t *cfg, wsync_dtype_t dtype,
                                             int tp_rank, int tp_size, int ep_rank, int ep_size,
                                             int etp_rank, int etp_size, int64_t vocab_pad,
                                             wsync_target_t **tensors, size_t *ntensors)
{
    mg_ctx_t c;
    tensor_vec_t out = {NULL, 0, 0};
    wsync_status_t st;

    if (cfg == NULL || tensors == NULL || ntensors == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_layout_megatron_tensors: NULL argument");
    st = wsync_model_config_check(cfg);
    if (st != WSYNC_OK)
        return st;
    if (wsync_mp_is_mla(cfg))
        return wsync_err(WSYNC_ERR_UNSUPPORTED, "megatron layout: %s uses multi-head latent "
                         "attention (and shared experts), whose Megatron-Core tensors "
                         "(linear_q_down_proj, linear_kv_up_proj, ...) wsync does not map yet",
                         wsync_model_type_name(cfg->model_type));
    if (ep_size == 0)
        ep_size = 1;
    if (etp_size == 0)
        etp_size = 1;
    st = wsync_lt_check_rank("megatron layout: tp_rank", tp_rank, tp_size);
    if (st == WSYNC_OK)
        st = wsync_lt_check_rank("megatron layout: ep_rank", ep_rank, ep_size);
    if (st == WSYNC_OK)
        st = wsync_lt_check_rank("megatron layout: etp_rank", etp_rank, etp_size);
    if (st != WSYNC_OK)
        return st;
    if (cfg->num_experts == 0 && (ep_size > 1 || etp_size > 1))
        return wsync_err(WSYNC_ERR_INVALID, "megatron layout: ep_size %d / etp_size %d given for "
                         "%s, a dense model without experts", ep_size, etp_size,
                         wsync_model_type_name(cfg->model_type));
    if (vocab_pad < 0)
        return wsync_err(WSYNC_ERR_INVALID, "megatron layout: vocab_pad %" PRId64 " < 0",
                         vocab_pad);
    c.cfg = cfg;
    c.dtype = wsync_mp_dtype(cfg, dtype);   /* 0: the config's, or bf16 */
    c.tp_rank = tp_rank;
    c.tp_size = tp_size;
    c.ep_rank = ep_rank;
    c.ep_size = ep_size;
    c.etp_rank = etp_rank;
    c.etp_size = etp_size;
    c.vocab_pad = vocab_pad == 0 ? 128 : vocab_pad;
    st = check_sizes(&c);
    if (st != WSYNC_OK)
        return st;

    st = add_vocab(&out, &c, "embedding.word_embeddings.weight", WSYNC_MP_EMBED);
    for (int64_t l = 0; l < cfg->num_hidden_layers && st == WSYNC_OK; l++)
        st = layer_tensors(&out, &c, l);
    if (st == WSYNC_OK)
        st = add_whole(&out, &c, "decoder.final_layernorm.weight", WSYNC_MP_NORM, 0);
    if (st == WSYNC_OK && !cfg->tie_word_embeddings)
        st = add_vocab(&out, &c, "output_layer.weight", WSYNC_MP_LM_HEAD);
    if (st != WSYNC_OK) {
        wsync_layout_targets_free(out.v, out.n);
        return st;
    }
    *tensors = out.v;
    *ntensors = out.n;
    return WSYNC_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* A described tensor with its memory -> shards                                                 */
/* ------------------------------------------------------------------------------------------ */

wsync_status_t wsync_layout_tensor_shards(const wsync_target_t *tensor, const void *data,
                                          wsync_mem_t mem, int device, wsync_shard_t **shards,
                                          size_t *nshards)
{
    wsync_shard_t *v = NULL;
    size_t esize;

    if (tensor == NULL || shards == NULL || nshards == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_layout_tensor_shards: NULL argument");
    const char *tname = tensor->name ? tensor->name : "(unnamed)";
    esize = wsync_dtype_size(tensor->dtype);
    if (esize == 0 || tensor->ndim < 1 || tensor->ndim > WSYNC_MAX_DIMS || tensor->npieces < 0 ||
        (tensor->npieces > 0 && tensor->pieces == NULL))
        return wsync_err(WSYNC_ERR_INVALID, "tensor %s: bad dtype %d, ndim %d or pieces", tname,
                         (int)tensor->dtype, tensor->ndim);
    if (tensor->npieces > 0) {
        v = calloc((size_t)tensor->npieces, sizeof(*v));
        if (v == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "tensor %s: %d shards", tname, tensor->npieces);
    }
    for (int i = 0; i < tensor->npieces; i++) {
        const wsync_piece_t *pc = &tensor->pieces[i];
        const int nd = tensor->ndim;
        int64_t off = 0, stride = 1;
        int k = -1;   /* the outermost dim the piece does not span */
        if (pc->param.ndim != nd || pc->param.name == NULL ||
            wsync_dtype_size(pc->param.dtype) != esize) {
            wsync_layout_shards_free(v, (size_t)i);
            return wsync_err(WSYNC_ERR_INVALID, "tensor %s: piece %d (%s) differs from the tensor "
                             "in ndim (%d vs %d) or element size", tname, i,
                             pc->param.name ? pc->param.name : "(unnamed)", pc->param.ndim, nd);
        }
        for (int d = nd - 1; d >= 0; d--) {
            if (pc->dst_start[d] < 0 || pc->src.len[d] < 0 ||
                pc->dst_start[d] + pc->src.len[d] > tensor->shape[d]) {
                wsync_layout_shards_free(v, (size_t)i);
                return wsync_err(WSYNC_ERR_INVALID, "tensor %s: piece %d (%s) exceeds the tensor "
                                 "along dim %d (%" PRId64 " + %" PRId64 " > %" PRId64 ")", tname,
                                 i, pc->param.name, d, pc->dst_start[d], pc->src.len[d],
                                 tensor->shape[d]);
            }
            if (k < 0 && pc->src.len[d] != tensor->shape[d])
                k = d;
            off += pc->dst_start[d] * stride;
            stride *= tensor->shape[d];
        }
        /* contiguous: dims after k whole, dims before k of length 1 */
        for (int d = 0; d < k; d++) {
            if (pc->src.len[d] != 1 && pc->src.len[k] != 0) {
                wsync_layout_shards_free(v, (size_t)i);
                return wsync_err(WSYNC_ERR_INVALID, "tensor %s: piece %d (%s) is not contiguous "
                                 "in the tensor (it spans part of dim %d and %" PRId64
                                 " entries of dim %d)", tname, i, pc->param.name, k,
                                 pc->src.len[d], d);
            }
        }
        v[i].param = pc->param;
        v[i].param.name = strdup(pc->param.name);
        if (v[i].param.name == NULL) {
            wsync_layout_shards_free(v, (size_t)i);
            return wsync_err(WSYNC_ERR_NOMEM, "tensor %s: piece name %s", tname, pc->param.name);
        }
        v[i].box = pc->src;
        v[i].data = data == NULL ? NULL : (const char *)data + (size_t)off * esize;
        v[i].mem = mem;
        v[i].device = device;
    }
    *shards = v;
    *nshards = (size_t)tensor->npieces;
    return WSYNC_OK;
}
