/* Internal: the params of a Llama-family model, described once so that the checkpoint param list
 * (wsync_model_params) and the TP targets (wsync_layout_tp_targets) cannot disagree on a name or
 * a shape. */
#ifndef WSYNC_RESHARD_MODEL_H
#define WSYNC_RESHARD_MODEL_H

#include "wsync/wsync.h"

typedef enum {
    WSYNC_MP_EMBED,            /* model.embed_tokens.weight          [V, Hd] */
    WSYNC_MP_INPUT_NORM,       /* per layer from here ...            [Hd] */
    WSYNC_MP_Q,                /*                                    [H*D, Hd] */
    WSYNC_MP_Q_BIAS,           /*                                    [H*D] */
    WSYNC_MP_K,                /*                                    [K*D, Hd] */
    WSYNC_MP_K_BIAS,
    WSYNC_MP_V,
    WSYNC_MP_V_BIAS,
    WSYNC_MP_O,                /*                                    [Hd, H*D] */
    WSYNC_MP_O_BIAS,           /*                                    [Hd] */
    WSYNC_MP_Q_NORM,           /*                                    [D] */
    WSYNC_MP_K_NORM,
    WSYNC_MP_POST_NORM,        /*                                    [Hd] */
    WSYNC_MP_GATE,             /*                                    [I, Hd] */
    WSYNC_MP_GATE_BIAS,
    WSYNC_MP_UP,
    WSYNC_MP_UP_BIAS,
    WSYNC_MP_DOWN,             /*                                    [Hd, I] */
    WSYNC_MP_DOWN_BIAS,        /* ... to here                        [Hd] */
    WSYNC_MP_NORM,             /* model.norm.weight                  [Hd] */
    WSYNC_MP_LM_HEAD,          /* lm_head.weight                     [V, Hd] */
    WSYNC_MP_COUNT
} wsync_mp_kind_t;

/* Longest name any kind formats to, layer numbers included. */
#define WSYNC_MP_NAME_MAX 96

/* 1 when the kind is per layer (its name takes a layer number). */
int wsync_mp_per_layer(wsync_mp_kind_t kind);

/* 1 when the model has this param (biases, q/k norms, untied lm_head). */
int wsync_mp_present(const wsync_model_config_t *cfg, wsync_mp_kind_t kind);

/* Fill *p (name into buf, which the caller keeps alive) for `kind` of `layer`. cfg is checked. */
void wsync_mp_param(const wsync_model_config_t *cfg, wsync_mp_kind_t kind, int64_t layer,
                    wsync_dtype_t dtype, char buf[WSYNC_MP_NAME_MAX], wsync_param_t *p);

/* dtype 0 → cfg->dtype, or bf16 when the config has none. */
wsync_dtype_t wsync_mp_dtype(const wsync_model_config_t *cfg, wsync_dtype_t dtype);

#endif
