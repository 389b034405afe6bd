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
} wse_layer_t;

typedef struct {
    wse_mat_t embed, lm_head;    /* [Vr, Hd]; lm_head is embed when tied */
    wse_vec_t norm;
    wse_layer_t *layers;
} wse_weights_t;

#endif
