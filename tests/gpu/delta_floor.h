/* A reference for the delta codec's benchmark (tests/gpu/test_delta_kernels.c): the least an
 * apply can cost, the changed values written at their positions and nothing else. */
#ifndef WSYNC_TESTS_GPU_DELTA_FLOOR_H
#define WSYNC_TESTS_GPU_DELTA_FLOOR_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst[pos[i]] = val[i] for i < n (2-byte elements, pos ascending), on the default stream: no
 * format to read, no checks, no hash. 0, or -1 with the CUDA error printed. */
int delta_floor_scatter(uint16_t *dst, const uint32_t *pos, const uint16_t *val, uint64_t n);

/* Each of the n 32-byte sectors sec[i] of dst read and written back whole (a measurement: what
 * the same changes cost as whole-sector writes, each sector read first). */
int delta_floor_sectors(uint16_t *dst, const uint32_t *sec, uint64_t n);

#ifdef __cplusplus
}
#endif

#endif
