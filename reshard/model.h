/* Internal: the params of a Llama-family model (dense, Qwen3-MoE, DeepSeek-V2/V3), described once
 * so that the checkpoint param list (wsync_model_params) and the TP targets
 * (wsync_layout_tp_targets) cannot disagree on a name or a shape.
 *
 * Symbols: Hd hidden, H heads, K kv heads, D head_dim, I intermediate_size, V vocab; MoE: E
 * experts, Im moe_intermediate_size, S n_shared_experts; MLA: Lq q_lora_rank, Lkv kv_lora_rank,
 * N qk_nope_head_dim, R qk_rope_head_dim, Dv v_head_dim (D = N + R). */
#ifndef WSYNC_RESHARD_MODEL_H
#define WSYNC_RESHARD_MODEL_H

#include "wsync/wsync.h"

/* The per-layer kinds are listed in the order wsync_model_params gives them within a layer. */
typedef enum {
    WSYNC_MP_EMBED,            /* model.embed_tokens.weight                  [V, Hd] */
    WSYNC_MP_INPUT_NORM,       /* per layer from here ...                    [Hd] */
    WSYNC_MP_Q,                /* self_attn.q_proj (MLA: only without Lq)    [H*D, Hd] */
    WSYNC_MP_Q_BIAS,           /*                                            [H*D] */
    WSYNC_MP_K,                /*                                            [K*D, Hd] */
    WSYNC_MP_K_BIAS,
    WSYNC_MP_V,
    WSYNC_MP_V_BIAS,
    WSYNC_MP_Q_A,              /* MLA self_attn.q_a_proj                     [Lq, Hd] */
    WSYNC_MP_Q_A_NORM,         /* MLA self_attn.q_a_layernorm                [Lq] */
    WSYNC_MP_Q_B,              /* MLA self_attn.q_b_proj                     [H*(N+R), Lq] */
    WSYNC_MP_KV_A,             /* MLA self_attn.kv_a_proj_with_mqa           [Lkv+R, Hd] */
    WSYNC_MP_KV_A_NORM,        /* MLA self_attn.kv_a_layernorm               [Lkv] */
    WSYNC_MP_KV_B,             /* MLA self_attn.kv_b_proj                    [H*(N+Dv), Lkv] */
    WSYNC_MP_O,                /*                                            [Hd, H*D] (MLA H*Dv) */
    WSYNC_MP_O_BIAS,           /*                                            [Hd] */
    WSYNC_MP_Q_NORM,           /*                                            [D] */
    WSYNC_MP_K_NORM,
    WSYNC_MP_POST_NORM,        /*                                            [Hd] */
    WSYNC_MP_GATE,             /* dense layers only                          [I, Hd] */
    WSYNC_MP_GATE_BIAS,
    WSYNC_MP_UP,
    WSYNC_MP_UP_BIAS,
    WSYNC_MP_DOWN,             /*                                            [Hd, I] */
    WSYNC_MP_DOWN_BIAS,        /*                                            [Hd] */
    WSYNC_MP_ROUTER,           /* MoE layers only: mlp.gate.weight           [E, Hd] */
    WSYNC_MP_ROUTER_BIAS,      /* mlp.gate.e_score_correction_bias           [E] */
    WSYNC_MP_EXPERT_GATE,      /* mlp.experts.{e}.gate_proj.weight           [Im, Hd] */
    WSYNC_MP_EXPERT_UP,        /* mlp.experts.{e}.up_proj.weight             [Im, Hd] */
    WSYNC_MP_EXPERT_DOWN,      /* mlp.experts.{e}.down_proj.weight           [Hd, Im] */
    WSYNC_MP_SHARED_GATE,      /* mlp.shared_experts.gate_proj.weight        [S*Im, Hd] */
    WSYNC_MP_SHARED_UP,        /* mlp.shared_experts.up_proj.weight          [S*Im, Hd] */
    WSYNC_MP_SHARED_DOWN,      /* ... to here: mlp.shared_experts.down_proj  [Hd, S*Im] */
    WSYNC_MP_NORM,             /* model.norm.weight                          [Hd] */
    WSYNC_MP_LM_HEAD,          /* lm_head.weight                             [V, Hd] */
    WSYNC_MP_COUNT
} wsync_mp_kind_t;

#define WSYNC_MP_FIRST_LAYER_KIND WSYNC_MP_INPUT_NORM
#define WSYNC_MP_LAST_LAYER_KIND WSYNC_MP_SHARED_DOWN

/* Longest name any kind formats to, layer and expert numbers included. */
#define WSYNC_MP_NAME_MAX 96

/* 1 when the kind is per layer (its name takes a layer number). */
int wsync_mp_per_layer(wsync_mp_kind_t kind);

/* 1 when the kind is per routed expert (its name also takes an expert number). */
int wsync_mp_per_expert(wsync_mp_kind_t kind);

/* 1 when some part of the model has this param (biases, q/k norms, MLA, MoE, untied lm_head). */
int wsync_mp_present(const wsync_model_config_t *cfg, wsync_mp_kind_t kind);

/* 1 when layer `layer` has this per-layer param; is_moe = wsync_model_layer_is_moe(cfg, layer),
 * passed in so that callers walking every param stay linear in their count. */
int wsync_mp_in_layer(const wsync_model_config_t *cfg, wsync_mp_kind_t kind, int is_moe);

/* Fill *p (name into buf, which the caller keeps alive) for `kind` of `layer` (and routed expert
 * `expert` for the per-expert kinds; ignored otherwise). cfg is checked. */
void wsync_mp_expert_param(const wsync_model_config_t *cfg, wsync_mp_kind_t kind, int64_t layer,
                           int64_t expert, wsync_dtype_t dtype, char buf[WSYNC_MP_NAME_MAX],
                           wsync_param_t *p);

/* wsync_mp_expert_param with expert 0 (every kind that is not per expert). */
void wsync_mp_param(const wsync_model_config_t *cfg, wsync_mp_kind_t kind, int64_t layer,
                    wsync_dtype_t dtype, char buf[WSYNC_MP_NAME_MAX], wsync_param_t *p);

/* dtype 0 → cfg->dtype, or bf16 when the config has none. */
wsync_dtype_t wsync_mp_dtype(const wsync_model_config_t *cfg, wsync_dtype_t dtype);

/* 1 for the families with multi-head latent attention (deepseek_v2/v3), 1 for those with routed
 * experts (qwen3_moe, deepseek_v2/v3). */
int wsync_mp_is_mla(const wsync_model_config_t *cfg);
int wsync_mp_is_moe_family(const wsync_model_config_t *cfg);

/* ------------------------------------------------------------------------------------------ */
/* Target building blocks shared by layout.c and layout_moe.c                                   */
/* ------------------------------------------------------------------------------------------ */

/* WSYNC_ERR_INVALID naming `what` unless 0 <= rank < size. */
wsync_status_t wsync_lt_check_rank(const char *what, int rank, int size);

/* WSYNC_ERR_INVALID unless p is a valid param with a name. */
wsync_status_t wsync_lt_named_param(const wsync_param_t *p);

/* *t = a target named `name` of the given shape with room for max_pieces pieces (mem host,
 * quant none, data NULL). */
wsync_status_t wsync_lt_target_new(wsync_target_t *t, const char *name, wsync_dtype_t dtype,
                                   int ndim, const int64_t *shape, int max_pieces);

/* Append a piece: rows [row0, row0 + nrows) of `param` (every other dim whole; dim 1 narrowed to
 * [col0, col0 + ncols) when ncols > 0) landing at row dst_row, column 0 of the target. */
wsync_status_t wsync_lt_target_piece(wsync_target_t *t, const wsync_param_t *param, int64_t row0,
                                     int64_t nrows, int64_t col0, int64_t ncols, int64_t dst_row);

#endif
