/* Internal: the CPU executor — moves the bytes a plan describes, on host memory. The GPU kernels
 * (kernels/) are held to the same results. */
#ifndef WSYNC_RESHARD_EXEC_H
#define WSYNC_RESHARD_EXEC_H

#include "reshard/plan.h"

/* Copy a region of `src` (elements of src_dtype) to a region of `dst` (elements of dst_dtype),
 * converting between bf16, f16 and f32 when the dtypes differ (round to nearest even). Both
 * regions have the same rows and cols. Same dtype: a strided memcpy. */
wsync_status_t wsync_exec_copy(const void *src, wsync_dtype_t src_dtype, const wsync_region_t *src_region,
                               void *dst, wsync_dtype_t dst_dtype, const wsync_region_t *dst_region);

/* xxh3-64 of a region's bytes, row by row (each row's digest seeds the next): equal for the same
 * elements wherever they lie, so a chunk hashed in its shard and where it landed agree. */
uint64_t wsync_exec_hash(const void *base, wsync_dtype_t dtype, const wsync_region_t *region);

/* Pack a chunk from its shard's memory into its place in the bucket (dense [rows, cols]). */
void wsync_exec_pack(const wsync_chunk_t *chunk, const void *shard_data, void *bucket);

/* Unpack a segment from its chunk's place in the bucket into the target buffer, casting to the
 * target's dtype. FP8 targets are handled by the quantizer, not here. */
wsync_status_t wsync_exec_unpack(const wsync_segment_t *seg, const wsync_chunk_t *chunk,
                                 const void *bucket, wsync_dtype_t dst_dtype, void *target_data);

/* Zero every element of a target that no piece covers (vocab padding rows). */
void wsync_exec_zero_uncovered(const wsync_target_desc_t *target, void *target_data);

#endif
