/* References for the delta codec's benchmark (tests/gpu/test_delta_kernels.c): the least an
 * apply can cost, the changed values written at their positions and nothing else; and the least
 * an encode can, both versions read and compared in one pass. */
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

/* Both versions (bytes each, 16-byte aligned) read once in one grid-stride pass and compared,
 * nothing written: *out (device memory) gets the 16-byte vectors that differ. What an encoder's
 * reads cost with nothing else to do. 0, or -1 with the CUDA error printed. */
int delta_floor_compare(const void *a, const void *b, uint64_t bytes, unsigned long long *out);

#ifdef __cplusplus
}
#endif

#endif
