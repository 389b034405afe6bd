/* Internal: the CUDA kernels behind one C header — pack/unpack of a bucket's segments in one
 * launch (with bf16/f16/f32 casts), amax, and FP8 quantization with every scale scheme.
 *
 * They give the same bytes as the CPU executor (reshard/exec.h) and the same bytes and scales as
 * wsync_quantize_f32 (reshard/fp8.h); tests/gpu/test_kernels.c holds them to it.
 *
 * Compiled only when WSYNC_HAVE_CUDA (the .cu files of kernels/); callers guard their use the same way.
 * Conventions:
 *  - every pointer named device-side is CUDA device memory of the *current* device (the caller
 *    sets it with cudaSetDevice); host-side arguments are read before the call returns;
 *  - `stream` is a cudaStream_t passed as void * (NULL: the legacy default stream); work is
 *    enqueued on it and the call returns without waiting, except where a function says it waits;
 *  - errors: WSYNC_ERR_INVALID for bad arguments (nothing enqueued), WSYNC_ERR_DEVICE for a CUDA
 *    failure, with wsync_last_error() naming the call and the CUDA error ("cudaMalloc:
 *    cudaErrorMemoryAllocation (out of memory)");
 *  - thread-safe: no state beyond the objects the caller holds (a batch may be launched from
 *    several threads, on streams of the device it was created on).
 */
#ifndef WSYNC_KERNELS_H
#define WSYNC_KERNELS_H

#include "reshard/plan.h"
#include "wsync/wsync.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Strided 2-D copies with casts: pack and unpack                                               */
/* ------------------------------------------------------------------------------------------ */

/* One copy, as wsync_exec_copy takes it: element (r, c) of the source, at
 * src + (src_off + r * src_pitch + c) * size(src_dtype), lands at
 * dst + (dst_off + r * dst_pitch + c) * size(dst_dtype), for r < rows, c < cols.
 * Identical dtypes (any, FP8 and u8 included) copy bytes; different ones must both be bf16, f16
 * or f32 and are converted as reshard/convert.h does (round to nearest even, NaN kept).
 * src and dst are device pointers; the destinations of one batch must not overlap each other or
 * any source. */
typedef struct {
    const void *src;
    void *dst;
    uint64_t src_off, src_pitch;       /* elements of src_dtype */
    uint64_t dst_off, dst_pitch;       /* elements of dst_dtype */
    uint64_t rows, cols;
    wsync_dtype_t src_dtype, dst_dtype;
} wsync_kcopy_t;

/* The copy wsync_exec_pack(chunk, shard_data, bucket) does: the chunk's region of the shard into
 * its dense place in the bucket. Fills *out; no device call. WSYNC_ERR_INVALID for NULL
 * arguments or an unknown dtype. */
wsync_status_t wsync_kernels_pack_desc(const wsync_chunk_t *chunk, const void *shard_data,
                                       void *bucket, wsync_kcopy_t *out);

/* The copy wsync_exec_unpack(seg, chunk, bucket, dst_dtype, target_data) does: the chunk's dense
 * place in the bucket into the segment's region of the target, cast to dst_dtype. Same errors as
 * wsync_exec_unpack (an FP8 target of another dtype is the quantizer's job: WSYNC_ERR_UNSUPPORTED;
 * a cast other than between bf16, f16 and f32: WSYNC_ERR_UNSUPPORTED). Fills *out; no device
 * call. */
wsync_status_t wsync_kernels_unpack_desc(const wsync_segment_t *seg, const wsync_chunk_t *chunk,
                                         const void *bucket, wsync_dtype_t dst_dtype,
                                         void *target_data, wsync_kcopy_t *out);

/* A batch: copy descriptors uploaded once to device memory (a plan is reused for every version,
 * so a scheme builds one batch per bucket and direction at setup), then run by one kernel launch
 * each time. Empty copies (rows or cols 0) are dropped. */
typedef struct wsync_kcopy_batch wsync_kcopy_batch_t;

/* Check every descriptor, lay out the work and upload it (synchronous: cudaMalloc, cudaMemcpy).
 * WSYNC_ERR_INVALID names the first bad descriptor (NULL pointer, unknown dtype, cols above
 * a pitch); WSYNC_ERR_UNSUPPORTED a cast between dtypes that have none; WSYNC_ERR_DEVICE;
 * WSYNC_ERR_NOMEM. n may be 0. *batch owned by the caller (wsync_kernels_batch_free). */
wsync_status_t wsync_kernels_batch_create(const wsync_kcopy_t *descs, uint32_t n,
                                          wsync_kcopy_batch_t **batch);

/* Enqueue the whole batch on `stream` as one kernel launch (none for an empty batch).
 * WSYNC_ERR_DEVICE if the launch fails. */
wsync_status_t wsync_kernels_batch_launch(const wsync_kcopy_batch_t *batch, void *stream);

/* Cap the batch's grid at max_blocks blocks (0: no cap, one block per unit of work; the kernel
 * loops over the rest). Copies on several streams at once (peer reads beside local copies) then
 * share the GPU instead of the first launch filling every SM until it drains. */
void wsync_kernels_batch_limit(wsync_kcopy_batch_t *batch, uint32_t max_blocks);

/* Bytes the batch reads and writes per launch, and its number of copies (for benchmarks and
 * logs). Any pointer may be NULL. */
void wsync_kernels_batch_info(const wsync_kcopy_batch_t *batch, uint64_t *bytes_read,
                              uint64_t *bytes_written, uint32_t *ncopies);

/* Free the batch (cudaFree: waits for the device). NULL is a no-op. */
void wsync_kernels_batch_free(wsync_kcopy_batch_t *batch);

/* Create, launch and free in one call, for copies that are not reused: the descriptors go up
 * with stream-ordered memory (cudaMallocAsync / cudaFreeAsync) on `stream`, so it does not wait
 * for the kernel. Errors as create and launch. */
wsync_status_t wsync_kernels_copy(const wsync_kcopy_t *descs, uint32_t n, void *stream);

/* ------------------------------------------------------------------------------------------ */
/* amax and FP8 quantization                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* Enqueue amax_out[0] = max |x| over the [rows, cols] matrix x (device; row i at
 * x + i * x_pitch elements of x_dtype: bf16, f16 or f32), as wsync_amax_f32 finds it: on the bit
 * patterns, so the result is +inf or NaN when x holds one, and 0 for an empty matrix.
 * amax_out is a device float. */
wsync_status_t wsync_kernels_amax(const void *x, wsync_dtype_t x_dtype, uint64_t rows,
                                  uint64_t cols, uint64_t x_pitch, float *amax_out, void *stream);

/* One quantization: the arguments of wsync_quantize_f32, on device memory, with an input dtype.
 * Elements are in units of the buffer's own dtype. */
typedef struct {
    const char *name;                  /* the target's name, for error messages; may be NULL */
    const void *x;                     /* device: [rows, cols] of x_dtype, row i at x + i * x_pitch */
    wsync_dtype_t x_dtype;             /* f32, or bf16 / f16 (exactly as if converted to f32 first) */
    uint64_t rows, cols, x_pitch;
    wsync_quant_t quant;               /* scheme, block_rows/cols, eps, ue8m0, no_saturate; the
                                          scales and scales_mem fields are not used */
    wsync_dtype_t fp8_dtype;           /* WSYNC_DTYPE_F8E4M3FN or WSYNC_DTYPE_F8E5M2 */
    uint8_t *out;                      /* device: row i at out + i * out_pitch */
    uint64_t out_pitch;
    float *scales;                     /* device: shape from wsync_quant_scales_shape, row-major */
    uint64_t row_base;                 /* rows of a larger matrix above x's first (x one slice of
                                          it): added to the row _finish names */
    const float *amax;                 /* per-tensor only, may be NULL: device, an amax agreed
                                          elsewhere (the whole target's, x one part of it: FP8 on
                                          the wire), whose scale wsync_fp8_tensor_scale gives is
                                          used instead of x's own amax (x read once); a
                                          non-finite one raises the workspace's flag. NULL: x's */
} wsync_kquant_t;

/* Many amaxes at once, for per-tensor FP8 on the wire (schemes/wire_amax.h): item i is a
 * [rows, cols] matrix as wsync_kernels_amax takes it, part of set `set`. */
typedef struct {
    const void *x;                     /* device: row i at x + i * x_pitch elements of x_dtype */
    wsync_dtype_t x_dtype;             /* bf16, f16 or f32 */
    uint64_t rows, cols, x_pitch;
    uint32_t set;                      /* < nsets */
} wsync_kamax_t;

/* Enqueue amax[k] = max |x| over every item of set k, for k < nsets (device floats, zeroed
 * first: a set without items gets 0), as wsync_kernels_amax finds it (on the bit patterns: +inf
 * or NaN where an item holds one). One amax kernel per non-empty item, each folding into its
 * set's word with atomic maxima. Every item is checked before anything is enqueued:
 * WSYNC_ERR_INVALID names the first bad one (NULL, dtype, pitch, set out of range);
 * WSYNC_ERR_DEVICE. n may be 0 (only the zeroing). */
wsync_status_t wsync_kernels_amax_many(const wsync_kamax_t *a, uint32_t n, float *amax,
                                       uint32_t nsets, void *stream);

/* Device workspace one quantization needs between launch and finish (the caller allocates it with
 * cudaMalloc; one per quantization in flight). */
#define WSYNC_KQUANT_WS_BYTES 16

/* Enqueue the quantization: the same bytes in out and the same scales as wsync_quantize_f32 would
 * write for the input converted to f32 (per-tensor: an amax kernel, then an encode kernel, so the
 * input is read twice; per-channel and block: one kernel that reads each scale cell once, except
 * cells too large for shared memory, read twice). Non-finite input is
 * only recorded in ws: wsync_kernels_quantize_finish reports it. Unlike the CPU quantizer, cells
 * free of NaN and Inf may already have been written when another holds one (the per-tensor path
 * writes nothing). WSYNC_ERR_INVALID for what wsync_quantize_f32 refuses (and an input dtype that
 * is not bf16, f16 or f32, or a NULL ws); WSYNC_ERR_DEVICE. */
wsync_status_t wsync_kernels_quantize_launch(const wsync_kquant_t *a, void *ws, void *stream);

/* Wait for `stream`, then report what the quantization launched with the same *a and ws found:
 * WSYNC_OK, or WSYNC_ERR_NONFINITE with the message wsync_quantize_f32 gives ("<name>: NaN at
 * row R, column C", the first bad element in row-major order); WSYNC_ERR_DEVICE for a CUDA error,
 * including one the kernels raised. */
wsync_status_t wsync_kernels_quantize_finish(const wsync_kquant_t *a, void *ws, void *stream);

/* Enqueue n quantizations at once, as n calls of _launch would, but with fewer kernels: those
 * with per-channel or block scales whose cells fit the register kernel go up to 12 a launch
 * (per input dtype and cell size class), the rest one by one. Each is checked as _launch checks it before anything is
 * enqueued. max_blocks caps each kernel's grid (0: one block per cell or group of cells), so
 * that it shares the GPU with work on other streams. ws[i] is quantization i's workspace, which, unlike _launch, this does not clear: the
 * caller keeps it zeroed (cleared once, it stays so while nothing non-finite is seen). */
wsync_status_t wsync_kernels_quantize_many(const wsync_kquant_t *a, uint32_t n, void *const *ws,
                                           uint32_t max_blocks, void *stream);

/* Search a's input for its first NaN or Inf (row-major), whatever the workspace's flag says,
 * and wait for it until deadline_ms (absolute, wsync_deadline_in; past it WSYNC_ERR_TIMEOUT):
 * WSYNC_OK when there is none, else WSYNC_ERR_NONFINITE with _finish's message
 * ("<name>: NaN at row R, column C", row_base added). ws: a workspace (its bytes 8..15 are used;
 * clear it before it serves a quantization again). For a per-tensor pack with an agreed amax,
 * whose flag cannot tell which part held the value. */
wsync_status_t wsync_kernels_find_nonfinite(const wsync_kquant_t *a, void *ws, void *stream,
                                            int64_t deadline_ms);

/* Launch, then finish. ws may be NULL here: a workspace is then allocated and freed on the
 * stream. */
wsync_status_t wsync_kernels_quantize(const wsync_kquant_t *a, void *ws, void *stream);

/* ------------------------------------------------------------------------------------------ */
/* FP8 on the wire: pack and unpack descriptors                                                 */
/* ------------------------------------------------------------------------------------------ */

/* FP8 on the wire (docs/fp8_wire.md; chunk->rule > 0). Descriptor builders only, in plain C
 * (kernels/wire.c, built with and without CUDA); they make no device call.
 *
 * Pack: the quantization of the chunk's region of the shard (x = shard_data + src.off elements of
 * the chunk's dtype, pitch src.pitch) under plan->rules[chunk->rule - 1], into the chunk's place in
 * the bucket: codes dense [rows, cols] at bucket + bucket_off, then its ncells f32 scales
 * row-major over the chunk's cell grid at bucket + bucket_off + wsync_wire_scales_off(rows, cols).
 * The plan lays the chunk on whole cells of every target it feeds, so these are the codes and
 * scales quantizing the whole target gives for those cells. name is NULL and row_base 0 (the caller
 * may set them for its messages). Launch with wsync_kernels_quantize_many: NaN and Inf land in the
 * workspaces, which the caller checks (wsync_dev_quantize_check) before sending. WSYNC_ERR_INVALID
 * for NULL arguments, a plain chunk, a rule out of the plan's table, a dtype that is not bf16, f16
 * or f32, a cell count that is not the rule's, or a misaligned bucket place. */
wsync_status_t wsync_kernels_pack_wire_desc(const wsync_plan_t *plan, const wsync_chunk_t *chunk,
                                            const void *shard_data, void *bucket,
                                            wsync_kquant_t *out);

/* Unpack a segment of an FP8 chunk: out[0] its codes, rows x cols bytes of t's FP8 dtype from the
 * bucket place into the segment's region of target_data; out[1] its scales, the chunk's cell grid
 * of f32 into t's scale matrix `scales` (wsync_quant_scales_shape of t, row-major) at the cells
 * the region covers (wsync_wire_scales_at; dst_pitch its columns). Both are ordinary copies for a
 * batch (wsync_kernels_batch_create). WSYNC_ERR_INVALID for NULL arguments, a plain chunk or
 * shapes that disagree; WSYNC_ERR_PROTOCOL (wsync_plan_check_wire_segment) when the chunk's rule
 * is not t's or the region is not whole cells of t. */
wsync_status_t wsync_kernels_unpack_wire_desc(const wsync_plan_t *plan,
                                              const wsync_segment_t *seg,
                                              const wsync_chunk_t *chunk, const void *bucket,
                                              const wsync_target_desc_t *t, void *target_data,
                                              float *scales, wsync_kcopy_t out[2]);

#ifdef __cplusplus
}
#endif

#endif
