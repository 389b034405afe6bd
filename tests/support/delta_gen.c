#include "tests/support/delta_gen.h"

#include <string.h>
#include <xxhash.h>

uint64_t dgen_mix(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t k[3] = {a, b, c};
    return XXH3_64bits(k, sizeof(k));
}

uint16_t dgen_start(uint64_t p, uint64_t e)
{
    float f = (float)((int)(dgen_mix(p, e, 0) % 2001) - 1000) / 1000.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

int dgen_flips(uint64_t p, uint64_t e, uint64_t v, unsigned permille)
{
    return v >= 2 && dgen_mix(p, e, v) % 1000 < permille;
}

uint64_t dgen_step(uint16_t *w, uint64_t n, uint64_t p, uint64_t e0, uint64_t v,
                   unsigned permille)
{
    uint64_t flipped = 0;
    for (uint64_t j = 0; j < n && v >= 2; j++)
        if (dgen_flips(p, e0 + j, v, permille)) {
            w[j] ^= 1;
            flipped++;
        }
    return flipped;
}

uint16_t dgen_value_at(uint64_t p, uint64_t e, uint64_t v, unsigned permille)
{
    uint16_t x = dgen_start(p, e);
    for (uint64_t w = 2; w <= v; w++)
        x ^= (uint16_t)dgen_flips(p, e, w, permille);
    return x;
}

uint64_t dgen_row_elems(const wsync_shard_t *sh)
{
    uint64_t n = 1;
    for (int d = 1; d < sh->param.ndim; d++)
        n *= (uint64_t)sh->param.shape[d];
    return n;
}

uint64_t dgen_shard_elems(const wsync_shard_t *sh)
{
    return sh->param.ndim == 0 ? 1 : (uint64_t)sh->box.len[0] * dgen_row_elems(sh);
}

uint64_t dgen_shard_first(const wsync_shard_t *sh)
{
    return sh->param.ndim == 0 ? 0 : (uint64_t)sh->box.start[0] * dgen_row_elems(sh);
}
