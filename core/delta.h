/* Internal: delta versions (issue 17) — the encoding of one chunk's new values against the values
 * the receiver already holds (the previous version), and its check.
 *
 * The plan still says which bytes each receiver needs (reshard/plan.h: chunks and segments); this
 * layer only decides how a chunk's bytes travel. A chunk is rows x cols elements of one dtype,
 * taken in row-major order of its region (the order in which wsync_exec_pack lays them dense in a
 * bucket); elements compare as raw bit patterns of their size (so 0.0 vs -0.0 and NaN payloads
 * count as changes: a delta version is bit-exact, never "numerically equal").
 *
 * Wire form of one encoded chunk, format 3 (all integers little-endian), for n elements of esize
 * bytes (esize 1, 2, 4 or 8), and format 4, the same with step-coded values (below). The check
 * refuses the others: format 1 (u16 SPARSE indices) and format 2 (the same bytes as 3, but
 * payloads contiguous in block order: the GPU encoder then had to find each block's offset from
 * its predecessors', a look-back that cost it 10 % of its time at 5 % changed on an H100,
 * docs/delta.md, session 39).
 *
 *   header   16 bytes   u32 magic WSYNC_DELTA_MAGIC, u8 format WSYNC_DELTA_FORMAT, u8 esize,
 *                       u16 zero, u64 n
 *   blocks   8 * nb     nb = ceil(n / WSYNC_DELTA_BLOCK); block j covers elements
 *                       [j * BLOCK, min(n, (j + 1) * BLOCK)), len_j of them; per block:
 *                       u32 payload offset in bytes from the start of the payload area (a
 *                       multiple of 8), then u32 w = (mode << 30) | (s << 29) | (e << 16) | k:
 *                       k (bits 0..15) = elements that changed (<= len_j <= 4096),
 *                       e (bits 16..28) = escape bytes of a SPARSE block's index stream (below;
 *                       0 in every other mode), s (bit 29) = STEPS (format 4 only, SPARSE and
 *                       BITMAP blocks only; below), mode (bits 30..31)
 *   payloads            from byte 16 + 8 * nb, each block's at its offset, in any order, each
 *                       starting 8-byte aligned, with zero bytes as padding
 *
 * Each block's bytes (its entry word and its payload) are a function of (old, new) alone, so that
 * encoders agree on them and the check can demand them; where the payloads lie is the encoder's
 * choice (the CPU encoder lays them in block order, the GPU encoder in the order its blocks
 * finish):
 *  - each payload lies inside the payload area, and the payloads' sizes add up to the area's
 *    length (len = 16 + 8 * nb + the sum of payloads; a SAME block's offset is any multiple of 8
 *    up to the area's end). That payloads do not overlap is not checked: it would take the
 *    offsets sorted, and a block decodes from its own offset whatever lies beside it.
 *  - a block's mode is the one wsync_delta_block_bytes picks for (len_j, k, e, esize), where e is
 *    the escape count of the block's changed positions (defined below) WHATEVER the mode: the
 *    encoder computes e from the positions of every changed block, though only a SPARSE block
 *    stores it (the others store e = 0). k counts the elements whose bit patterns differ, in
 *    every mode (PLAIN included).
 *  - every padding byte is zero: the u16 after esize, index-stream and value padding, and in a
 *    BITMAP the bits of the last bitmap byte past len_j.
 *  - n * esize <= UINT32_MAX (so that every u32 offset fits): wsync_delta_encode refuses larger
 *    chunks (WSYNC_ERR_INVALID) and they travel plain; the check refuses such a header.
 *
 * The escape count e of a block: its changed positions in ascending order i_1 < ... < i_k (block
 * indices, 0 <= i < len_j), gaps d_1 = i_1 and d_m = i_m - i_{m-1} - 1 (the unchanged elements
 * skipped before each change), e = sum over m of floor(d_m / 255) (<= floor((len_j - k) / 255),
 * so <= 16 in a block of 4096).
 *
 * Block modes (the smallest payload wins; on a tie the lower mode number):
 *   SAME    0  k = 0, no payload
 *   SPARSE  1  the index stream of k + e bytes, zero-padded to 8, then the k new values (esize
 *              each, in index order), zero-padded to 8: align8(k + e) + align8(k * esize) bytes.
 *              The index stream writes each gap d_m, in order, as floor(d_m / 255) bytes 0xFF
 *              followed by one byte d_m mod 255 (< 0xFF). Read back: a byte 0xFF advances the
 *              position by 255 (an escape: "skip 255 elements"); a byte b < 0xFF advances it by b
 *              and names the element there as changed, then the position moves one past it. So
 *              it holds exactly e bytes 0xFF and k bytes < 0xFF, and its last byte is < 0xFF.
 *   BITMAP  2  ceil(len_j / 8) bytes of bitmap (bit i of byte i / 8, LSB first: element i
 *              changed), zero-padded to 8, then the k new values in index order, zero-padded to 8:
 *              align8(ceil(len_j / 8)) + align8(k * esize) bytes
 *   PLAIN   3  all len_j new values: align8(len_j * esize) bytes
 * (k = 0 is always SAME; a block with k > 0 is never SAME.) The rule is monotone in e (only
 * SPARSE's size grows with it), and it never weighs PLAIN against SPARSE with e mattering: for
 * every len_j <= 4096, k and esize, the choice at e = 0 is PLAIN exactly when it is at every
 * possible e (tests/unit/test_delta.c checks all of them), so a PLAIN block is canonical whatever
 * its positions. Around the SPARSE/BITMAP break-even e does decide (e.g. bf16, len 4096, k 500:
 * SPARSE for e <= 12, BITMAP for e >= 13).
 *
 * Format 4, step-coded values (docs/delta.md, "Steps"): at RL learning rates most changed
 * elements move by one unit in the last place, which is +1 or -1 of the element's bits read as an
 * unsigned little-endian integer of esize bytes (modulo 2^(8 esize)). Format 4 is format 3 (the
 * same header but for the format byte, table, modes and mode rule, index streams and bitmaps)
 * except that a SPARSE or BITMAP block may carry the flag s, and then its k new values are
 * replaced by: k 2-bit codes, value i's at bits 2 (i mod 4) of byte i / 4, zero-padded to 8
 * bytes, then the L values whose code is 2 (esize each, in index order), zero-padded to 8:
 * align8(ceil(k / 4)) + align8(L * esize) bytes. Code 0: new = old + 1; 1: new = old - 1;
 * 2: new is the next of the L values; 3 is refused. A block has s set exactly when that is
 * smaller than its k values (align8(k * esize)), so format 4 is never longer than format 3 and
 * wsync_delta_max_bytes bounds it too. The check can verify that rule for a block with s set (it
 * counts L), not for one without (that needs the old values: the tree hash covers the result).
 * Only the CPU codec reads and writes format 4; the CUDA kernels take format 3 alone, so a
 * sender uses format 4 only toward receivers that apply on the CPU (the store, for readers of
 * host targets).
 *
 * Decoding a SPARSE index stream in parallel (the GPU's way): each byte b contributes a position
 * advance (b == 0xFF ? 255 : b + 1) and an element count (b != 0xFF); inclusive scans of both give,
 * for each byte b < 0xFF, its element's position (advance sum - 1) and its value slot (count - 1).
 *
 * The CPU encoder here and the CUDA encoder (kernels/delta.h) write the same header, table words
 * and payloads (the offsets aside), and either decoder applies what either wrote. When the
 * encoded chunk is not smaller than the plain bytes (n * esize), the chunk travels plain: callers
 * compare wsync_delta_encode's *len with the plain size (the break-even point at chunk level;
 * blocks already take PLAIN past theirs).
 *
 * Check: the xxh3 tree hash of the chunk's NEW values: leaf j = XXH3_64bits of block j's new
 * values (len_j * esize bytes, dense), and the chunk hash = XXH3_64bits of the nb leaves as u64
 * little-endian. The sender computes it from the new values while encoding; the receiver computes
 * it from its target after applying, and a mismatch fails the version (WSYNC_ERR_INTEGRITY). A
 * tree, so that the GPU hashes blocks in parallel and gives the same value as the CPU.
 */
#ifndef WSYNC_CORE_DELTA_H
#define WSYNC_CORE_DELTA_H

#include <stddef.h>
#include <stdint.h>

#include "reshard/plan.h"
#include "wsync/wsync.h"

#define WSYNC_DELTA_MAGIC 0x4c445357u   /* "WSDL" */
#define WSYNC_DELTA_FORMAT 3u
#define WSYNC_DELTA_FORMAT_STEPS 4u     /* format 3 with step-coded values (CPU codec only) */
#define WSYNC_DELTA_BLOCK 4096u         /* elements per block */
#define WSYNC_DELTA_HEADER 16u

enum { WSYNC_DELTA_SAME = 0, WSYNC_DELTA_SPARSE = 1, WSYNC_DELTA_BITMAP = 2, WSYNC_DELTA_PLAIN = 3 };

/* Blocks of a chunk of n elements. */
static inline uint64_t wsync_delta_nblocks(uint64_t n)
{
    return (n + WSYNC_DELTA_BLOCK - 1) / WSYNC_DELTA_BLOCK;
}

#define WSYNC_DELTA_ESC 0xFFu             /* the escape byte of a SPARSE index stream */

/* A block table entry's second word, and its fields. */
static inline uint32_t wsync_delta_word(uint32_t mode, uint32_t e, uint32_t k)
{
    return mode << 30 | e << 16 | k;
}
static inline uint32_t wsync_delta_word_mode(uint32_t w) { return w >> 30; }
static inline uint32_t wsync_delta_word_e(uint32_t w) { return (w >> 16) & 0x1fffu; }
static inline uint32_t wsync_delta_word_steps(uint32_t w) { return (w >> 29) & 1u; }
#define WSYNC_DELTA_STEPS_FLAG (1u << 29)
static inline uint32_t wsync_delta_word_k(uint32_t w) { return w & 0xffffu; }

/* The payload bytes of a block of len elements of which k changed, with escape count e (the
 * block's, whatever the mode: see above), in the mode the rules above pick; *mode (may be NULL)
 * gets that mode. */
uint64_t wsync_delta_block_bytes(uint32_t len, uint32_t k, uint32_t e, uint32_t esize,
                                 uint32_t *mode);

/* The most bytes wsync_delta_encode may write for n elements of esize: header, block table and
 * every block PLAIN. Size encode buffers with it. */
uint64_t wsync_delta_max_bytes(uint64_t n, uint32_t esize);

/* A 2-D region of a dense row-major buffer (reshard/plan.h's wsync_region_t: element (r, c) at
 * off + r * pitch + c) holding a chunk's elements in row-major order. */

/* Encode the chunk whose new values are region `src` of new_base and whose previous values are
 * the same region of old_base (both host memory, esize-byte elements), into out[0, cap).
 * *len gets the encoded bytes, *hash the tree hash of the new values, *changed (may be NULL) the
 * number of elements that differ. WSYNC_ERR_INVALID (naming the argument) for a bad esize, an
 * empty region or cap < the bytes needed (wsync_delta_max_bytes is always enough), and for
 * n * esize > UINT32_MAX. On failure *len, *hash and *changed are untouched and out[0, cap) may
 * hold a partial encoding. The encoder stops at the first block that does not fit, so a cap of
 * the plain size (n * esize) bounds the work on a chunk that should travel plain (the failure
 * still sets the thread's last error). Thread-safe (no shared state); new and old are only
 * read. */
wsync_status_t wsync_delta_encode(const void *new_base, const void *old_base,
                                  const wsync_region_t *src, uint32_t esize, void *out,
                                  uint64_t cap, uint64_t *len, uint64_t *hash, uint64_t *changed);

/* wsync_delta_encode in a given format: WSYNC_DELTA_FORMAT (3) or WSYNC_DELTA_FORMAT_STEPS (4,
 * for a receiver that applies with this CPU codec); WSYNC_ERR_INVALID naming any other. */
wsync_status_t wsync_delta_encode_format(uint32_t format, const void *new_base,
                                         const void *old_base, const wsync_region_t *src,
                                         uint32_t esize, void *out, uint64_t cap, uint64_t *len,
                                         uint64_t *hash, uint64_t *changed);

/* The format byte of an encoded chunk of len bytes (0 when len holds no header). */
static inline uint32_t wsync_delta_format(const void *enc, uint64_t len)
{
    return len >= WSYNC_DELTA_HEADER ? ((const uint8_t *)enc)[4] : 0;
}

/* Check an encoded chunk's structure before applying it: magic, format (3 or 4; formats 1 and 2
 * are refused), esize, n equal to the region's elements, offsets aligned and inside len,
 * k <= len_j, e = 0 outside SPARSE, each block's payload size that of its mode and its mode the
 * one wsync_delta_block_bytes picks for (len_j, k, e) (SPARSE: the table's e; BITMAP: the e of
 * the bitmap's positions, which the check computes; PLAIN: any e, see above), a SPARSE index
 * stream with exactly e bytes 0xFF and k bytes < 0xFF, a last byte < 0xFF and every decoded
 * position < len_j, a BITMAP's popcount equal to k, padding zero, the payloads' sizes adding up to
 * the payload area (no bytes beside them); in format 4 a STEPS block's codes (none is 3, padding
 * zero, L counted) and that its step values are smaller than its plain ones; in format 3 no s.
 * WSYNC_ERR_INTEGRITY naming `what` (e.g. "chunk 12 from sender 1") and the first fault found.
 * Never reads outside enc[0, len). */
wsync_status_t wsync_delta_check(const void *enc, uint64_t len, uint64_t n, uint32_t esize,
                                 const char *what);

/* wsync_delta_check in parts, so that threads check one stream's block ranges at once: the
 * header and blocks [b0, b1) as wsync_delta_check does (the same errors), *payload getting the
 * bytes of their payloads; then, once every range passed, wsync_delta_check_area with the ranges'
 * payloads added up, which must be the payload area (the error wsync_delta_check gives).
 * WSYNC_ERR_INVALID for a range outside the stream's blocks or a NULL payload. */
wsync_status_t wsync_delta_check_blocks(const void *enc, uint64_t len, uint64_t n, uint32_t esize,
                                        uint64_t b0, uint64_t b1, const char *what,
                                        uint64_t *payload);
wsync_status_t wsync_delta_check_area(uint64_t len, uint64_t n, uint64_t payload,
                                      const char *what);

/* Apply a checked encoded chunk to region `dst` of dst_base, which holds the previous values:
 * afterwards the region holds the new values. *hash gets the tree hash of the region's values
 * after applying (compare it with the sender's). WSYNC_ERR_INVALID for bad arguments, and for a
 * stream whose header names another element count or size than dst's; the caller runs
 * wsync_delta_check first (this does not re-validate: an unchecked stream may write anywhere).
 * Writes only the changed elements (PLAIN blocks: all of theirs), then reads the region once for
 * the hash. Thread-safe for disjoint regions. */
wsync_status_t wsync_delta_apply(const void *enc, uint64_t len, void *dst_base,
                                 const wsync_region_t *dst, uint32_t esize, uint64_t *hash);

/* Apply blocks [b0, b1) of a checked encoded chunk to region `dst` of dst_base, as
 * wsync_delta_apply does for all of them, and write their leaf hashes (above) to
 * leaves[0 .. b1 - b0). Threads may apply disjoint block ranges of one stream at once; the tree
 * hash of the region is then wsync_delta_tree_hash of its nb leaves in block order. The same
 * errors as wsync_delta_apply, and WSYNC_ERR_INVALID for a range that is not inside the
 * stream's blocks. */
wsync_status_t wsync_delta_apply_blocks(const void *enc, uint64_t len, void *dst_base,
                                        const wsync_region_t *dst, uint32_t esize, uint64_t b0,
                                        uint64_t b1, uint64_t *leaves);

/* The chunk hash of nb leaf hashes, in block order: XXH3_64bits of them as u64 little-endian. */
uint64_t wsync_delta_tree_hash(const uint64_t *leaves, uint64_t nb);

/* The tree hash of region `src` of base (esize-byte elements), as defined above: what a receiver
 * of a plain chunk may compare, and what a test computes independently of the codec. */
uint64_t wsync_delta_hash(const void *base, const wsync_region_t *src, uint32_t esize);

#endif
