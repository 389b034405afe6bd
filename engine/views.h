/* Views of an engine's weights (non-owning pointers into a weight set, host or device memory),
 * shared by the engine's C files and its CUDA kernels: plain C, no C11-only headers. */
#ifndef WSYNC_ENGINE_VIEWS_H
#define WSYNC_ENGINE_VIEWS_H

#include <stdint.h>

#include <wsync/wsync.h>

typedef struct {
    wsync_dtype_t dtype;    /* bf16, f16, f32 or F8E4M3FN */
    const void *w;          /* [rows, cols] */
    const float *s;         /* FP8: [ceil(rows/blk), ceil(cols/blk)] */
    int64_t rows, cols;
    int blk;
} wse_mat_t;

typedef struct {
    wsync_dtype_t dtype;
    const void *w;          /* NULL when the model has no such vector */
} wse_vec_t;

typedef struct {
    wse_vec_t in_norm, post_norm, q_norm, k_norm;
    wse_mat_t qkv, o, gate_up, down;
    wse_vec_t qkv_b, o_b, gate_up_b, down_b;

    /* MLA (deepseek; qkv.w is NULL then). With q_lora: qkv_a = fused [q_a_proj;
     * kv_a_proj_with_mqa] [q_lora + kv_lora + rope, Hd] and q_b = q_b_proj [Hr * (nope + rope),
     * q_lora]; without: qkv_a = kv_a_proj_with_mqa [kv_lora + rope, Hd] and q_b = q_proj
     * [Hr * (nope + rope), Hd]. kv_b [Hr * (nope + v), kv_lora]; o is [Hd, Hr * v]. */
    wse_mat_t qkv_a, q_b, kv_b;
    wse_vec_t q_a_norm, kv_a_norm;

    /* Routed experts (router.w != NULL on a MoE layer). gate_up / down then hold the shared
     * experts (w NULL when the model has none). The FP8 scales of w13 / w2 are those of the
     * flattened matrices given here. */
    wse_mat_t router;       /* [E, Hd], every expert */
    wse_vec_t router_bias;  /* [E] (f32 e_score_correction_bias), or w NULL */
    wse_mat_t w13;          /* [E_local * 2 * Ip, Hd]: local expert j's gate rows at j * 2 * Ip,
                               its up rows at j * 2 * Ip + Ip */
    wse_mat_t w2;           /* [E_local * Hd, Ip]: local expert j's down at rows j * Hd */
} wse_layer_t;

typedef struct {
    wse_mat_t embed, lm_head;    /* [Vr, Hd]; lm_head is embed when tied */
    wse_vec_t norm;
    wse_layer_t *layers;
} wse_weights_t;

#endif
