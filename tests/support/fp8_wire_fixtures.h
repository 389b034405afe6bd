/* fp8_wire_fixtures: the descriptions of an FP8-on-the-wire group built by hand, shared by
 * test_fp8_wire_plan and test_fp8_wire_exec: [rows, cols] params, shards that are row ranges of
 * them, and targets (plain, block or channel scales) with their pieces. Only descriptions: no
 * data, no buffers; a test keeps those beside the group. Also the checks that
 * test_fp8_wire_kernels (descriptors carried out on the CPU) and tests/gpu/test_fp8_wire_gpu (the
 * kernels) share: a target's codes and scales against the reference, and the descriptors'
 * refusals.
 *
 *     fw_group_t d;
 *     memset(&d, 0, sizeof(d));
 *     fw_add_shard(&d, 0, "w", WSYNC_DTYPE_BF16, 512, 384, 0, 256);     // sender 0: rows 0..255
 *     fw_add_shard(&d, 1, "w", WSYNC_DTYPE_BF16, 512, 384, 256, 256);
 *     fw_add_target(&d, 0, "w.fp8", WSYNC_DTYPE_F8E4M3FN, 512, 384, WSYNC_QUANT_BLOCK, 128, 128,
 *                   0, 0);
 *     fw_add_piece(&d, "w", WSYNC_DTYPE_BF16, 512, 384, 0, 512, 0, 384, 0, 0);
 *     ... wsync_plan_compile_opts(d.s, d.ns, d.t, d.nt, ...)
 */
#ifndef WSYNC_TEST_FP8_WIRE_FIXTURES_H
#define WSYNC_TEST_FP8_WIRE_FIXTURES_H

#include "reshard/plan.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    wsync_shard_desc_t s[16];
    size_t ns;
    wsync_target_desc_t t[16];
    size_t nt;
    wsync_piece_desc_t p[32];
    size_t np;
} fw_group_t;

/* A 2-d param description; the name is borrowed, not copied. */
wsync_pdesc_t fw_pdesc(const char *name, wsync_dtype_t dt, int64_t rows, int64_t cols);

/* Sender `sender` holds rows [r0, r0 + nr) of the [rows, cols] param (host memory); its index is
 * the count of that sender's shards before it. */
wsync_shard_desc_t *fw_add_shard(fw_group_t *d, uint32_t sender, const char *name,
                                 wsync_dtype_t dt, int64_t rows, int64_t cols, int64_t r0,
                                 int64_t nr);

/* A [rows, cols] target of `receiver` (host memory), index as for shards; its pieces follow
 * with fw_add_piece. Block scales take br x bc cells, eps 1e-4 and ue8m0; channel and tensor
 * scales ignore br, bc and ue8m0. */
wsync_target_desc_t *fw_add_target(fw_group_t *d, uint32_t receiver, const char *name,
                                   wsync_dtype_t dt, int64_t rows, int64_t cols,
                                   wsync_quant_scheme_t quant, int br, int bc, int ue8m0,
                                   int no_saturate);

/* A piece of the last target: box [r0, r0 + nr) x [c0, c0 + nc) of the [prows, pcols] param,
 * at (dr, dc) of the target. */
void fw_add_piece(fw_group_t *d, const char *param, wsync_dtype_t dt, int64_t prows,
                  int64_t pcols, int64_t r0, int64_t nr, int64_t c0, int64_t nc, int64_t dr,
                  int64_t dc);

/* CHECKs that a [rows, cols] target's codes and its nscales scales equal the reference's
 * (wsync_quantize_f32 of the whole target), naming the first code that differs. */
void fw_check_codes(const char *name, const uint8_t *have, const uint8_t *want, uint64_t rows,
                    uint64_t cols, const float *have_s, const float *want_s, uint64_t nscales);

/* CHECKs the refusals of wsync_kernels_pack_wire_desc and _unpack_wire_desc (kernels/wire.c) for
 * the plan's first chunk and segment, whose target td (an FP8 wire target of the plan) has its
 * codes at `target` and its scales at `scales`; shard and bucket as the pack takes them. The
 * descriptors are only built, nothing is read or written: any memory, host or device. */
void fw_check_wire_desc_refusals(const wsync_plan_t *plan, const wsync_target_desc_t *td,
                                 const void *shard, uint8_t *bucket, uint8_t *target,
                                 float *scales);

#endif
