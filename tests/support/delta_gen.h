/* The delta tests' versions of a weight (tests/integration/test_delta_*.c): every process makes
 * version v of any element on its own from (param, element, version). An element starts at a
 * value of its (param, index); each version from 2 on flips its lowest bit when a hash of
 * (param, index, version) draws under permille / 1000. Both parts are counter-based, so a
 * sender's shard and a receiver's target step their own copies and agree bit for bit.
 * (wsync-bench --delta has its own generator, fp32 masters stepped by lr: bench/bench_delta.c,
 * since the bench does not link tests/support.) */
#ifndef WSYNC_TEST_DELTA_GEN_H
#define WSYNC_TEST_DELTA_GEN_H

#include "wsync/wsync.h"

#include <stdint.h>

/* The generators' hash of (a, b, c): XXH3 of the three words. */
uint64_t dgen_mix(uint64_t a, uint64_t b, uint64_t c);

/* Start value of element e of param p: the bf16 (f32 truncated) of a multiple of 1/1000 in
 * [-1, 1]. */
uint16_t dgen_start(uint64_t p, uint64_t e);

/* 1 when element e of param p flips at version v: v >= 2 and its draw is under permille. */
int dgen_flips(uint64_t p, uint64_t e, uint64_t v, unsigned permille);

/* Version v - 1 to v of elements [e0, e0 + n) of param p, held at w[0, n): flips the lowest bit
 * of those dgen_flips picks (none for v < 2). Returns how many it flipped. */
uint64_t dgen_step(uint16_t *w, uint64_t n, uint64_t p, uint64_t e0, uint64_t v,
                   unsigned permille);

/* Element e of param p at version v: dgen_start with every flip of versions 2..v. */
uint16_t dgen_value_at(uint64_t p, uint64_t e, uint64_t v, unsigned permille);

/* A dim-0 shard (an FSDP box, as wsync_layout_fsdp_shards gives them) of a row-major param:
 * elements of one row (the product of dims 1..), elements of the shard, and its first
 * element's index in the whole param (0 for a scalar). */
uint64_t dgen_row_elems(const wsync_shard_t *sh);
uint64_t dgen_shard_elems(const wsync_shard_t *sh);
uint64_t dgen_shard_first(const wsync_shard_t *sh);

#endif
