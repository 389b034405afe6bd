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

/* FP8 on the wire (chunk->rule > 0, docs/fp8_wire.md). Pack: quantize the chunk's region of
 * the shard under plan->rules[chunk->rule - 1], exactly as wsync_quantize_f32 quantizes those
 * cells of the target (the plan lays the chunk on whole cells), writing the codes dense
 * [rows, cols] at the chunk's place in the bucket, then its ncells fp32 scales row-major at
 * wsync_wire_scales_off(rows, cols). WSYNC_ERR_NONFINITE when the region holds a NaN or Inf:
 * the message names `param`, `sender` and the element's row and column in the chunk; nothing
 * is written then. */
wsync_status_t wsync_exec_pack_wire(const wsync_plan_t *plan, const wsync_chunk_t *chunk,
                                    const char *param, const void *shard_data, void *bucket);

/* Per-tensor rules (wsync_wire_rule_needs_amax): the chunk's part of the target's amax, max |x|
 * over its region of the shard (*amax, finite, written only on success), and its pack with the
 * amax its senders agreed on (`amax`: the target's, >= the chunk's own): codes x / s with s =
 * wsync_fp8_tensor_scale(amax), then that one scale. wsync_exec_pack_wire refuses such chunks
 * (it has no amax). NONFINITE as for wsync_exec_pack_wire (the amax pass finds it). */
wsync_status_t wsync_exec_amax_wire(const wsync_plan_t *plan, const wsync_chunk_t *chunk,
                                    const char *param, const void *shard_data, float *amax);
wsync_status_t wsync_exec_pack_wire_amax(const wsync_plan_t *plan, const wsync_chunk_t *chunk,
                                         const char *param, const void *shard_data, float amax,
                                         void *bucket);

/* Unpack a segment of an FP8 chunk: its codes into the segment's region of the target (FP8
 * bytes, target_data of t's dtype), its scales into the target's scale matrix `scales` (host
 * f32, wsync_quant_scales_shape of t) at the cells the region covers. */
wsync_status_t wsync_exec_unpack_wire(const wsync_plan_t *plan, const wsync_segment_t *seg,
                                      const wsync_chunk_t *chunk, const void *bucket,
                                      const wsync_target_desc_t *t, void *target_data,
                                      float *scales);

/* Zero every element of a target that no piece covers (vocab padding rows). */
void wsync_exec_zero_uncovered(const wsync_target_desc_t *target, void *target_data);

#endif
