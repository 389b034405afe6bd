/* What the example trainer writes into its shards and the example worker expects in its targets:
 * element i (row-major index in the param's global shape) of param `name` at version v is a bf16
 * in +-[1, 2) drawn from a hash of (name, i, v). Both sides compute it on their own, so the worker
 * checks every byte it received without seeing the trainer's memory. A real trainer has its
 * weights instead; a real worker has nothing to check against, and serves.
 * examples/python/receiver.py computes the same function. */
#ifndef WSYNC_EXAMPLE_WEIGHTS_H
#define WSYNC_EXAMPLE_WEIGHTS_H

#include <stdint.h>
#include <string.h>

#include <wsync/wsync.h>
#include <wsync/wsync_layout.h>

/* FNV-1a of the param name */
static inline uint64_t example_name_hash(const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return h;
}

/* bf16 bit pattern of element `index` of the param whose name hashes to `name_hash` */
static inline uint16_t example_value(uint64_t name_hash, uint64_t index, uint64_t version)
{
    uint64_t h = name_hash ^ (index * 0x9e3779b97f4a7c15ull) ^ (version * 0xc2b2ae3d27d4eb4full);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    /* 0x3f80 is 1.0: 7 random mantissa bits and a random sign */
    return (uint16_t)(0x3f80u | (h & 0x7fu) | (((h >> 7) & 1u) << 15));
}

/* Row-major offset (in elements) of point `at` of a tensor of `shape`. */
static inline int64_t example_offset(const int64_t *at, const int64_t *shape, int ndim)
{
    int64_t off = 0;
    for (int d = 0; d < ndim; d++)
        off = off * shape[d] + at[d];
    return off;
}

/* Step `i` (ndim counters, each in [0, len[d])) to the next point of a box, last dim fastest;
 * 0 once every point was visited. */
static inline int example_next(int64_t *i, const int64_t *len, int ndim)
{
    for (int d = ndim - 1; d >= 0; d--) {
        if (++i[d] < len[d])
            return 1;
        i[d] = 0;
    }
    return 0;
}

/* A small Qwen3-shaped model, used when no config.json is given: 2 layers, hidden 64, 4 query
 * and 2 kv heads of 16, MLP 128, vocab 200 (vLLM pads it to 256: those rows stay zero). */
static inline void example_builtin_config(wsync_model_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->model_type = WSYNC_MODEL_QWEN3;
    cfg->hidden_size = 64;
    cfg->num_hidden_layers = 2;
    cfg->num_attention_heads = 4;
    cfg->num_key_value_heads = 2;
    cfg->head_dim = 16;
    cfg->intermediate_size = 128;
    cfg->vocab_size = 200;
    cfg->max_position_embeddings = 256;
    cfg->qk_norm = 1;
    cfg->rms_norm_eps = 1e-6;
    cfg->rope_theta = 1e6;
    cfg->dtype = WSYNC_DTYPE_BF16;
}

/* The model both sides agree on: config.json at `path` when one is given (what
 * wsync_model_config_load returns, its error included), else the built-in one above. */
static inline wsync_status_t example_config(const char *path, wsync_model_config_t *cfg)
{
    if (path)
        return wsync_model_config_load(path, cfg);
    example_builtin_config(cfg);
    return WSYNC_OK;
}

#endif
