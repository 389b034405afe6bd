/* The delta codec on the CPU (core/delta.h has the wire form; docs/delta.md the why).
 *
 * Everything runs block by block (WSYNC_DELTA_BLOCK elements): a block of new and old values is
 * compared, encoded and hashed while it sits in L1/L2, so encode reads each version once, and
 * apply writes only the changed elements and then reads the block once for its hash. A region
 * is walked as spans (the part of one row inside one block); a dense region is one long row. */
#include "core/delta.h"

#include <inttypes.h>
#include <string.h>

#include "core/hash.h"
#include "core/status.h"
#include "core/util.h"

/* The wire is little-endian and the codec loads and stores words as the host lays them out. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "core/delta.c assumes a little-endian host"
#endif

#define LEAF_BATCH 128u             /* leaves hashed into the chunk hash per update */
#define DENSE_FRACTION 16u          /* past 1/16 of a block changed, the next one diffs into bits */

static inline uint64_t align8(uint64_t x) { return (x + 7) & ~(uint64_t)7; }

static inline uint64_t ld64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint32_t ld32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline void st32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void st64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static inline int esize_ok(uint32_t es) { return es == 1 || es == 2 || es == 4 || es == 8; }

static inline unsigned esize_shift(uint32_t es) { return es == 1 ? 0 : es == 2 ? 1 : es == 4 ? 2 : 3; }

/* Copy one element of es bytes (constant sizes, so that each becomes one move). */
static inline void copy_elem(uint8_t *d, const uint8_t *s, uint32_t es)
{
    switch (es) {
    case 1: *d = *s; break;
    case 2: memcpy(d, s, 2); break;
    case 4: memcpy(d, s, 4); break;
    default: memcpy(d, s, 8); break;
    }
}

static const char *mode_name(uint32_t mode)
{
    static const char *const names[] = {"SAME", "SPARSE", "BITMAP", "PLAIN"};
    return names[mode & 3];
}

/* ---- regions -------------------------------------------------------------------------------- */

/* A region seen as rows of cols elements, pitch apart; a dense region (pitch == cols, or one row)
 * becomes one row of n elements so that every block is one span. */
typedef struct {
    uint8_t *base;                  /* byte address of element (0, 0) */
    uint64_t pitch_bytes;
    uint64_t cols;
    uint32_t es;
} view_t;

/* Position of an element inside the view. */
typedef struct {
    uint64_t r, c;
} cursor_t;

static view_t make_view(const void *base, const wsync_region_t *reg, uint32_t es)
{
    view_t v;
    v.base = (uint8_t *)base + reg->off * es;
    v.es = es;
    if (reg->pitch == reg->cols || reg->rows == 1) {
        v.cols = reg->rows * reg->cols;
        v.pitch_bytes = 0;
    } else {
        v.cols = reg->cols;
        v.pitch_bytes = reg->pitch * es;
    }
    return v;
}

static inline uint8_t *view_at(const view_t *v, cursor_t at)
{
    return v->base + at.r * v->pitch_bytes + at.c * v->es;
}

/* Move `at` forward by d elements (a division only when a row is crossed). */
static inline void cursor_add(const view_t *v, cursor_t *at, uint64_t d)
{
    at->c += d;
    if (at->c >= v->cols) {
        at->r += at->c / v->cols;
        at->c %= v->cols;
    }
}

/* Elements left in the row from `at`, at most m. */
static inline uint64_t span_len(const view_t *v, cursor_t at, uint64_t m)
{
    uint64_t left = v->cols - at.c;
    return left < m ? left : m;
}

/* Leaf hash of the len elements from `at` (the block's values, dense). */
static uint64_t hash_block(const view_t *v, cursor_t at, uint64_t len)
{
    uint64_t first = span_len(v, at, len);
    XXH3_state_t st;

    if (first == len)
        return XXH3_64bits(view_at(v, at), len * v->es);
    XXH3_64bits_reset(&st);
    while (len > 0) {
        uint64_t m = span_len(v, at, len);
        XXH3_64bits_update(&st, view_at(v, at), m * v->es);
        len -= m;
        at.r++;
        at.c = 0;
    }
    return XXH3_64bits_digest(&st);
}

/* The chunk hash: XXH3_64bits of the leaves as u64 little-endian, fed in batches. */
typedef struct {
    XXH3_state_t st;
    uint64_t leaves[LEAF_BATCH];
    uint32_t n;
} tree_t;

static void tree_init(tree_t *t)
{
    XXH3_64bits_reset(&t->st);
    t->n = 0;
}

static void tree_add(tree_t *t, uint64_t leaf)
{
    t->leaves[t->n++] = leaf;
    if (t->n == LEAF_BATCH) {
        XXH3_64bits_update(&t->st, t->leaves, sizeof(t->leaves));
        t->n = 0;
    }
}

static uint64_t tree_digest(tree_t *t)
{
    if (t->n > 0)
        XXH3_64bits_update(&t->st, t->leaves, (size_t)t->n * 8);
    return XXH3_64bits_digest(&t->st);
}

static int region_ok(const wsync_region_t *r, uint64_t *n)
{
    return r != NULL && r->rows >= 1 && r->cols >= 1 && r->pitch >= r->cols &&
           !wsync_mul_u64(r->rows, r->cols, n);
}

/* ---- sizes ---------------------------------------------------------------------------------- */

uint64_t wsync_delta_block_bytes(uint32_t len, uint32_t k, uint32_t e, uint32_t esize,
                                 uint32_t *mode)
{
    uint64_t vals = align8((uint64_t)k * esize);
    uint64_t sparse = align8((uint64_t)k + e) + vals;
    uint64_t bitmap = align8(((uint64_t)len + 7) / 8) + vals;
    uint64_t plain = align8((uint64_t)len * esize);
    uint32_t m = WSYNC_DELTA_SPARSE;
    uint64_t best = sparse;

    if (k == 0) {
        if (mode != NULL)
            *mode = WSYNC_DELTA_SAME;
        return 0;
    }
    if (bitmap < best) {
        best = bitmap;
        m = WSYNC_DELTA_BITMAP;
    }
    if (plain < best) {
        best = plain;
        m = WSYNC_DELTA_PLAIN;
    }
    if (mode != NULL)
        *mode = m;
    return best;
}

/* The payload bytes of a block in a given mode (what its table entry says). */
static uint64_t mode_bytes(uint32_t mode, uint32_t len, uint32_t k, uint32_t e, uint32_t es)
{
    switch (mode) {
    case WSYNC_DELTA_SPARSE:
        return align8((uint64_t)k + e) + align8((uint64_t)k * es);
    case WSYNC_DELTA_BITMAP:
        return align8(((uint64_t)len + 7) / 8) + align8((uint64_t)k * es);
    case WSYNC_DELTA_PLAIN:
        return align8((uint64_t)len * es);
    default:
        return 0;
    }
}

uint64_t wsync_delta_max_bytes(uint64_t n, uint32_t esize)
{
    uint64_t nb = wsync_delta_nblocks(n), plain, total;

    if (n == 0)
        return WSYNC_DELTA_HEADER;
    /* every block but the last is a whole multiple of 8 bytes; the last pads to 8 */
    if (wsync_mul_u64(n, esize, &plain) || wsync_add_u64(plain, 7, &plain) ||
        wsync_mul_u64(nb, 8, &total) || wsync_add_u64(total, WSYNC_DELTA_HEADER, &total) ||
        wsync_add_u64(total, plain & ~(uint64_t)7, &total))
        return UINT64_MAX;
    return total;
}

/* ---- encode --------------------------------------------------------------------------------- */

/* Append to idx[k..] the block indices (base + element) of the elements of a span that differ
 * (a: new, b: old, cnt elements); returns the new k. Compares 32 bytes, then 8, at a time, and
 * walks the set bits of the words that differ: the fast way for sparse changes. */
static uint32_t diff_span_idx(const uint8_t *a, const uint8_t *b, uint64_t cnt, uint32_t es,
                              uint32_t base, uint16_t *idx, uint32_t k)
{
    const unsigned sh = esize_shift(es), bsh = 3 + sh;   /* element of a bit: bit >> bsh */
    const uint64_t emask = es == 8 ? ~(uint64_t)0 : ((uint64_t)1 << (8 * es)) - 1;
    const uint64_t bytes = cnt * es;
    uint64_t i = 0;

#define WORD_DIFFS(x, at)                                                                     \
    do {                                                                                      \
        uint64_t x_ = (x);                                                                    \
        while (x_ != 0) {                                                                     \
            unsigned t_ = (unsigned)__builtin_ctzll(x_) >> bsh;                               \
            idx[k++] = (uint16_t)(base + ((at) >> sh) + t_);                                  \
            x_ &= ~(emask << (t_ << bsh));                                                    \
        }                                                                                     \
    } while (0)

    for (; i + 32 <= bytes; i += 32) {
        uint64_t x0 = ld64(a + i) ^ ld64(b + i), x1 = ld64(a + i + 8) ^ ld64(b + i + 8);
        uint64_t x2 = ld64(a + i + 16) ^ ld64(b + i + 16), x3 = ld64(a + i + 24) ^ ld64(b + i + 24);
        if ((x0 | x1 | x2 | x3) == 0)
            continue;
        WORD_DIFFS(x0, i);
        WORD_DIFFS(x1, i + 8);
        WORD_DIFFS(x2, i + 16);
        WORD_DIFFS(x3, i + 24);
    }
    for (; i + 8 <= bytes; i += 8)
        WORD_DIFFS(ld64(a + i) ^ ld64(b + i), i);
#undef WORD_DIFFS
    for (; i < bytes; i += es)      /* fewer than 8 bytes left, whole elements */
        if (memcmp(a + i, b + i, es) != 0)
            idx[k++] = (uint16_t)(base + (i >> sh));
    return k;
}

/* One bit per element of an 8-byte XOR word of es-byte lanes: bit t set when lane t is non-zero.
 * A lane's high bit gets the carry of (low bits + all ones below the high bit), or'ed with the
 * lane itself; a multiply then gathers the lanes' high bits into the top bits of the product (the
 * constant's terms land at distinct positions, so nothing carries into them). Branch-free, so
 * that dense changes cost per word, not per element. */
static inline uint64_t lane_bits(uint64_t x, uint32_t es)
{
    uint64_t low, hi;

    switch (es) {
    case 1:
        low = 0x7f7f7f7f7f7f7f7full;
        hi = (((x & low) + low) | x) & ~low;
        return ((hi >> 7) * 0x0102040810204080ull) >> 56;
    case 2:
        low = 0x7fff7fff7fff7fffull;
        hi = (((x & low) + low) | x) & ~low;
        return ((hi >> 15) * 0x1000200040008000ull) >> 60;
    case 4:
        low = 0x7fffffff7fffffffull;
        hi = (((x & low) + low) | x) & ~low;
        return (hi >> 31 & 1) | (hi >> 62);
    default:
        return x != 0;
    }
}

/* Or `nb` bits v into the block bitmap bm at bit p (p + nb <= the block's length). */
static inline void put_bits(uint64_t *bm, uint32_t p, uint64_t v, uint32_t nb)
{
    uint32_t sh = p & 63;
    bm[p >> 6] |= v << sh;
    if (sh + nb > 64)
        bm[(p >> 6) + 1] |= v >> (64 - sh);
}

/* Set in the block bitmap bm the bits (base + element) of the elements of a span that differ (a:
 * new, b: old, cnt elements). Compares 32 bytes at a time and skips equal groups; a group that
 * differs costs a few operations per 8-byte word whatever its number of changes: the fast way
 * for dense changes. */
static void diff_span_bits(const uint8_t *a, const uint8_t *b, uint64_t cnt, uint32_t es,
                      uint32_t base, uint64_t *bm)
{
    const unsigned sh = esize_shift(es);
    const uint32_t per = 8 >> sh;                       /* elements per word */
    const uint64_t bytes = cnt * es;
    uint64_t i = 0;

    for (; i + 32 <= bytes; i += 32) {
        uint64_t x0 = ld64(a + i) ^ ld64(b + i), x1 = ld64(a + i + 8) ^ ld64(b + i + 8);
        uint64_t x2 = ld64(a + i + 16) ^ ld64(b + i + 16), x3 = ld64(a + i + 24) ^ ld64(b + i + 24);
        uint32_t p = base + (uint32_t)(i >> sh);
        if ((x0 | x1 | x2 | x3) == 0)
            continue;
        put_bits(bm, p, lane_bits(x0, es) | lane_bits(x1, es) << per |
                 lane_bits(x2, es) << 2 * per | lane_bits(x3, es) << 3 * per, 4 * per);
    }
    for (; i + 8 <= bytes; i += 8)
        put_bits(bm, base + (uint32_t)(i >> sh), lane_bits(ld64(a + i) ^ ld64(b + i), es), per);
    for (; i < bytes; i += es)      /* fewer than 8 bytes left, whole elements */
        if (memcmp(a + i, b + i, es) != 0)
            put_bits(bm, base + (uint32_t)(i >> sh), 1, 1);
}

/* The set bits of the block bitmap bm (len bits), ascending, into idx; returns their count. */
static uint32_t bits_to_idx(const uint64_t *bm, uint32_t len, uint16_t *idx)
{
    uint32_t k = 0;
    for (uint32_t w = 0; w < (len + 63) / 64; w++)
        for (uint64_t x = bm[w]; x != 0; x &= x - 1)
            idx[k++] = (uint16_t)(w * 64 + (uint32_t)__builtin_ctzll(x));
    return k;
}

/* Copy the values of the elements of a span (src, m elements from block index p) whose bits are
 * set in bm to dst from slot q on; returns the next slot. Branch-free (each element is stored, the
 * slot moves by its bit), for dense changes; a store lands at slot q only while a set bit remains
 * ahead, so the caller stops before the block's last change and copies that one itself, and no
 * store passes dst's k slots. */
static inline uint32_t compress_span(const uint8_t *src, uint32_t m, uint32_t p,
                                     const uint64_t *bm, uint8_t *dst, uint32_t q, uint32_t es)
{
    for (uint32_t i = 0; i < m; i++, p++) {
        copy_elem(dst + (uint64_t)q * es, src + (uint64_t)i * es, es);
        q += (uint32_t)(bm[p >> 6] >> (p & 63)) & 1u;
    }
    return q;
}

/* Copy the values of the elements whose bits are set in bm (at least one; a block of len from
 * `at` of v) into dst, in block order. */
static void gather_bits(const view_t *v, cursor_t at, const uint64_t *bm, uint32_t len,
                        uint8_t *dst)
{
    uint32_t last = 0, q = 0, p = 0;

    for (uint32_t w = (len + 63) / 64; w-- > 0;)
        if (bm[w] != 0) {
            last = w * 64 + 63 - (uint32_t)__builtin_clzll(bm[w]);
            break;
        }
    while (p < last) {
        uint32_t m = (uint32_t)span_len(v, at, last - p);
        const uint8_t *src = view_at(v, at);
        switch (v->es) {              /* constant sizes: one move per element */
        case 1: q = compress_span(src, m, p, bm, dst, q, 1); break;
        case 2: q = compress_span(src, m, p, bm, dst, q, 2); break;
        case 4: q = compress_span(src, m, p, bm, dst, q, 4); break;
        default: q = compress_span(src, m, p, bm, dst, q, 8); break;
        }
        p += m;
        cursor_add(v, &at, m);
    }
    /* q == k - 1 here: the last change takes the last slot */
    copy_elem(dst + (uint64_t)q * v->es, view_at(v, at), v->es);
}

/* Copy the values of the k (ascending) block indices idx from the block at `at` of v into dst. */
static void gather(const view_t *v, cursor_t at, const uint16_t *idx, uint32_t k, uint8_t *dst)
{
    uint32_t prev = 0;
    for (uint32_t j = 0; j < k; j++) {
        cursor_add(v, &at, idx[j] - prev);
        prev = idx[j];
        copy_elem(dst + (uint64_t)j * v->es, view_at(v, at), v->es);
    }
}

/* Copy the len values from `at` of v, dense, into dst. */
static void copy_out(const view_t *v, cursor_t at, uint64_t len, uint8_t *dst)
{
    while (len > 0) {
        uint64_t m = span_len(v, at, len);
        memcpy(dst, view_at(v, at), m * v->es);
        dst += m * v->es;
        len -= m;
        at.r++;
        at.c = 0;
    }
}

/* Write the SPARSE index stream of the k ascending block indices idx to q (room for k + 16
 * bytes); returns its length, k + e. Each gap is floor(gap / 255) bytes 0xFF, then the rest. */
static uint32_t make_stream(const uint16_t *idx, uint32_t k, uint8_t *q)
{
    uint32_t next = 0, n = 0;                   /* first position the next gap skips */
    for (uint32_t j = 0; j < k; j++) {
        uint32_t d = idx[j] - next;
        for (; d >= WSYNC_DELTA_ESC; d -= WSYNC_DELTA_ESC)
            q[n++] = (uint8_t)WSYNC_DELTA_ESC;
        q[n++] = (uint8_t)d;
        next = idx[j] + 1u;
    }
    return n;
}

/* The element's bits at d as an unsigned integer (es bytes, the host little-endian). */
static inline uint64_t elem_bits(const uint8_t *d, uint32_t es)
{
    uint64_t v = 0;
    switch (es) {
    case 1: v = *d; break;
    case 2: memcpy(&v, d, 2); break;
    case 4: memcpy(&v, d, 4); break;
    default: memcpy(&v, d, 8); break;
    }
    return v;
}

/* Format 4: the element at d moved one step (code 0: +1, else -1), modulo 2^(8 es). */
static inline void step_elem(uint8_t *d, uint32_t es, uint32_t code)
{
    uint64_t v = elem_bits(d, es) + (code == 0 ? 1u : UINT64_MAX);
    copy_elem(d, (const uint8_t *)&v, es);     /* its low es bytes: the host is little-endian */
}

/* Format 4: the step values of the k changed elements idx (ascending) of the block at `at` (new
 * values in nv, old in ov) into out (room for align8(ceil(k / 4)) + align8(k * es)): the codes,
 * zero-padded to 8, then the literals, zero-padded to 8. Returns its bytes. */
static uint64_t make_steps(const view_t *nv, const view_t *ov, cursor_t at, const uint16_t *idx,
                           uint32_t k, uint8_t *out)
{
    const uint32_t es = nv->es;
    const uint64_t mask = es == 8 ? UINT64_MAX : ((uint64_t)1 << (8 * es)) - 1;
    uint64_t cb = align8(((uint64_t)k + 3) / 4), nl = 0;
    uint8_t *lit = out + cb;
    uint32_t prev = 0;

    memset(out, 0, cb);
    for (uint32_t j = 0; j < k; j++) {
        cursor_add(nv, &at, idx[j] - prev);
        prev = idx[j];
        const uint8_t *np = view_at(nv, at), *op = view_at(ov, at);
        uint64_t d = (elem_bits(np, es) - elem_bits(op, es)) & mask;
        uint32_t code = d == 1 ? 0u : d == mask ? 1u : 2u;
        if (code == 2)
            copy_elem(lit + nl++ * es, np, es);
        out[j >> 2] |= (uint8_t)(code << (2 * (j & 3)));
    }
    memset(lit + nl * es, 0, align8(nl * es) - nl * es);
    return cb + align8(nl * es);
}

/* Write block payload (mode, k of len changed, their bitmap bm, and for SPARSE their indices
 * idx, escape count e and index stream) at p, bytes long. steps (format 4, NULL: plain values):
 * the block's step values, which follow its index stream or bitmap in place of its values. */
static void write_payload(uint8_t *p, uint64_t bytes, uint32_t mode, const view_t *nv,
                          cursor_t at, uint32_t len, const uint64_t *bm, const uint16_t *idx,
                          uint32_t k, uint32_t e, const uint8_t *stream, const uint8_t *steps)
{
    uint64_t head;

    memset(p + (bytes >= 8 ? bytes - 8 : 0), 0, bytes >= 8 ? 8 : bytes);   /* tail padding */
    switch (mode) {
    case WSYNC_DELTA_SPARSE:
        head = align8((uint64_t)k + e);
        memset(p + head - 8, 0, 8);
        memcpy(p, stream, (size_t)k + e);
        if (steps != NULL)
            memcpy(p + head, steps, bytes - head);
        else
            gather(nv, at, idx, k, p + head);
        break;
    case WSYNC_DELTA_BITMAP:
        head = align8(((uint64_t)len + 7) / 8);
        memset(p + head - 8, 0, 8);
        memcpy(p, bm, ((uint64_t)len + 7) / 8);         /* u64 words little-endian, as the host */
        if (steps != NULL)
            memcpy(p + head, steps, bytes - head);
        else
            gather_bits(nv, at, bm, len, p + head);
        break;
    case WSYNC_DELTA_PLAIN:
        copy_out(nv, at, len, p);
        break;
    default:
        break;
    }
}

wsync_status_t wsync_delta_encode(const void *new_base, const void *old_base,
                                  const wsync_region_t *src, uint32_t esize, void *out,
                                  uint64_t cap, uint64_t *len, uint64_t *hash, uint64_t *changed)
{
    return wsync_delta_encode_format(WSYNC_DELTA_FORMAT, new_base, old_base, src, esize, out, cap,
                                     len, hash, changed);
}

wsync_status_t wsync_delta_encode_format(uint32_t format, const void *new_base,
                                         const void *old_base, const wsync_region_t *src,
                                         uint32_t esize, void *out, uint64_t cap, uint64_t *len,
                                         uint64_t *hash, uint64_t *changed)
{
    uint64_t bm[WSYNC_DELTA_BLOCK / 64];    /* the block's changed elements, bit per element */
    uint16_t idx[WSYNC_DELTA_BLOCK];        /* or as indices */
    uint8_t stream[WSYNC_DELTA_BLOCK + 16]; /* a SPARSE block's index stream: k + e bytes */
    /* format 4: a block's step values, codes then literals (8-byte words: es 8 stores align) */
    uint64_t steps[(WSYNC_DELTA_BLOCK / 4 + WSYNC_DELTA_BLOCK * 8) / 8];
    int dense = 0;                          /* diff into bm (else into idx) */
    uint64_t n, nb, table_end, pos = 0, nchanged = 0;
    view_t nv, ov;
    cursor_t at = {0, 0};
    uint8_t *o = out;
    tree_t tree;

    if (new_base == NULL || old_base == NULL || out == NULL || len == NULL || hash == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "delta encode: %s is NULL",
                         new_base == NULL ? "new_base" : old_base == NULL ? "old_base" :
                         out == NULL ? "out" : len == NULL ? "len" : "hash");
    if (!esize_ok(esize))
        return wsync_err(WSYNC_ERR_INVALID, "delta encode: esize %" PRIu32
                         " (1, 2, 4 or 8 bytes)", esize);
    if (format != WSYNC_DELTA_FORMAT && format != WSYNC_DELTA_FORMAT_STEPS)
        return wsync_err(WSYNC_ERR_INVALID, "delta encode: format %" PRIu32 " (%u or %u)",
                         format, WSYNC_DELTA_FORMAT, WSYNC_DELTA_FORMAT_STEPS);
    if (!region_ok(src, &n))
        return wsync_err(WSYNC_ERR_INVALID, "delta encode: src region %s",
                         src == NULL ? "is NULL" : "is empty, pitch < cols or overflows");
    if (n > UINT32_MAX / esize)
        return wsync_err(WSYNC_ERR_INVALID, "delta encode: %" PRIu64 " elements of %" PRIu32
                         " bytes exceed the format's 2^32 - 1 bytes: send the chunk plain",
                         n, esize);
    nb = wsync_delta_nblocks(n);
    table_end = WSYNC_DELTA_HEADER + 8 * nb;
    if (cap < table_end)
        return wsync_err(WSYNC_ERR_INVALID, "delta encode: cap %" PRIu64 " < the %" PRIu64
                         " bytes of header and block table", cap, table_end);

    st32(o, WSYNC_DELTA_MAGIC);
    o[4] = (uint8_t)format;
    o[5] = (uint8_t)esize;
    o[6] = o[7] = 0;
    st64(o + 8, n);
    nv = make_view(new_base, src, esize);
    ov = make_view(old_base, src, esize);
    tree_init(&tree);
    for (uint64_t j = 0; j < nb; j++) {
        uint32_t blen = (uint32_t)(j + 1 < nb ? WSYNC_DELTA_BLOCK : n - j * WSYNC_DELTA_BLOCK);
        uint32_t k = 0, e = 0, mode, flag = 0;
        uint64_t bytes;
        cursor_t s = at;

        if (dense)
            memset(bm, 0, sizeof(bm));
        for (uint32_t done = 0; done < blen;) {
            uint32_t m = (uint32_t)span_len(&nv, s, blen - done);
            if (dense)
                diff_span_bits(view_at(&nv, s), view_at(&ov, s), m, esize, done, bm);
            else
                k = diff_span_idx(view_at(&nv, s), view_at(&ov, s), m, esize, done, idx, k);
            done += m;
            s.r++;
            s.c = 0;
        }
        if (dense)
            for (uint32_t w = 0; w < WSYNC_DELTA_BLOCK / 64; w++)
                k += (uint32_t)__builtin_popcountll(bm[w]);
        /* e only moves a block from SPARSE to BITMAP or PLAIN (SPARSE alone grows with it), so
         * it is counted only where e = 0 would pick SPARSE */
        bytes = wsync_delta_block_bytes(blen, k, 0, esize, &mode);
        if (mode == WSYNC_DELTA_SPARSE) {
            if (dense)
                bits_to_idx(bm, blen, idx);
            e = make_stream(idx, k, stream) - k;
            if (e > 0)
                bytes = wsync_delta_block_bytes(blen, k, e, esize, &mode);
        }
        if (mode == WSYNC_DELTA_BITMAP && !dense) {
            memset(bm, 0, sizeof(bm));
            for (uint32_t i = 0; i < k; i++)
                bm[idx[i] >> 6] |= (uint64_t)1 << (idx[i] & 63);
        }
        if (format == WSYNC_DELTA_FORMAT_STEPS &&
            (mode == WSYNC_DELTA_SPARSE || mode == WSYNC_DELTA_BITMAP)) {
            uint64_t vals = align8((uint64_t)k * esize), sb;
            if (mode == WSYNC_DELTA_BITMAP && dense)
                bits_to_idx(bm, blen, idx);
            sb = make_steps(&nv, &ov, at, idx, k, (uint8_t *)steps);
            if (sb < vals) {            /* the steps only where they are smaller */
                flag = WSYNC_DELTA_STEPS_FLAG;
                bytes = bytes - vals + sb;
            }
        }
        /* the next block is diffed the way that suits this one's density (the output is the
         * same either way) */
        dense = k > blen / DENSE_FRACTION;
        if (cap - table_end < pos + bytes)
            return wsync_err(WSYNC_ERR_INVALID, "delta encode: cap %" PRIu64 " < the %" PRIu64
                             " bytes needed up to block %" PRIu64 " of %" PRIu64
                             " (wsync_delta_max_bytes gives %" PRIu64 ")", cap,
                             table_end + pos + bytes, j, nb, wsync_delta_max_bytes(n, esize));
        st32(o + WSYNC_DELTA_HEADER + 8 * j, (uint32_t)pos);
        if (mode != WSYNC_DELTA_SPARSE)
            e = 0;                      /* stored for SPARSE blocks only */
        st32(o + WSYNC_DELTA_HEADER + 8 * j + 4, wsync_delta_word(mode, e, k) | flag);
        if (bytes > 0)
            write_payload(o + table_end + pos, bytes, mode, &nv, at, blen, bm, idx, k, e, stream,
                          flag != 0 ? (const uint8_t *)steps : NULL);
        tree_add(&tree, hash_block(&nv, at, blen));
        pos += bytes;
        nchanged += k;
        cursor_add(&nv, &at, blen);
    }
    *len = table_end + pos;
    *hash = tree_digest(&tree);
    if (changed != NULL)
        *changed = nchanged;
    return WSYNC_OK;
}

/* ---- check ---------------------------------------------------------------------------------- */

static int all_zero(const uint8_t *p, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        if (p[i] != 0)
            return 0;
    return 1;
}

/* The escape count of the positions whose bits are set in the bitmap of a block of len. */
static uint32_t bitmap_escapes(const uint8_t *map, uint32_t len)
{
    uint64_t mbytes = ((uint64_t)len + 7) / 8, next = 0;
    uint32_t e = 0;

    for (uint64_t w = 0; w < mbytes; w += 8) {
        uint64_t bits = 0;
        memcpy(&bits, map + w, mbytes - w < 8 ? mbytes - w : 8);
        while (bits != 0) {
            uint64_t i = w * 8 + (uint64_t)__builtin_ctzll(bits);
            bits &= bits - 1;
            e += (uint32_t)((i - next) / WSYNC_DELTA_ESC);
            next = i + 1;
        }
    }
    return e;
}

/* The payload of block j (len elements, k changed, escape count e, mode), bytes long at p: index
 * stream, bitmap and padding, and a BITMAP block's mode against its positions' escape count.
 * vals: the bytes of its values after the index stream or bitmap, padding not counted (a STEPS
 * block's: its codes padded, then its literals). Returns WSYNC_OK or the INTEGRITY error naming
 * what and the block. */
static wsync_status_t check_payload(const uint8_t *p, uint64_t bytes, uint32_t mode, uint32_t len,
                                    uint32_t k, uint32_t e, uint32_t es, uint64_t vals,
                                    uint64_t j, const char *what)
{
    uint64_t head = 0;

    if (mode == WSYNC_DELTA_SAME)
        return WSYNC_OK;                /* no payload */
    if (mode == WSYNC_DELTA_SPARSE) {
        uint64_t sl = (uint64_t)k + e, nesc = 0, adv = 0;     /* k >= 1: the mode says so */
        head = align8(sl);
        if (p[sl - 1] == WSYNC_DELTA_ESC)
            return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta block %" PRIu64 ": SPARSE index "
                             "stream of %" PRIu64 " bytes ends in an escape byte 0xFF",
                             what, j, sl);
        for (uint64_t i = 0; i < sl; i++) {
            nesc += p[i] == WSYNC_DELTA_ESC;
            adv += p[i] == WSYNC_DELTA_ESC ? WSYNC_DELTA_ESC : (uint64_t)p[i] + 1;
        }
        if (sl - nesc != k)             /* then nesc != e as well: k + e bytes in all */
            return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta block %" PRIu64 ": SPARSE index "
                             "stream of %" PRIu64 " bytes holds %" PRIu64 " positions (bytes "
                             "< 0xFF) and %" PRIu64 " escapes (0xFF), the table says k %" PRIu32
                             " and e %" PRIu32, what, j, sl, sl - nesc, nesc, k, e);
        if (adv > len)                  /* adv - 1 is the last, and largest, position */
            return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta block %" PRIu64 ": SPARSE index "
                             "stream decodes to position %" PRIu64 " (entry %" PRIu32 ") >= the "
                             "block's %" PRIu32 " elements", what, j, adv - 1, k - 1, len);
        if (!all_zero(p + sl, head - sl))
            return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta block %" PRIu64 ": non-zero "
                             "padding after the %" PRIu64 "-byte SPARSE index stream",
                             what, j, sl);
    } else if (mode == WSYNC_DELTA_BITMAP) {
        uint64_t mbytes = ((uint64_t)len + 7) / 8, pop = 0;
        uint32_t want;
        head = align8(mbytes);
        for (uint64_t i = 0; i + 8 <= mbytes; i += 8)
            pop += (uint64_t)__builtin_popcountll(ld64(p + i));
        for (uint64_t i = mbytes & ~(uint64_t)7; i < mbytes; i++)
            pop += (uint64_t)__builtin_popcount(p[i]);
        if ((len & 7) != 0 && (p[mbytes - 1] >> (len & 7)) != 0)
            return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta block %" PRIu64 ": bitmap bits set "
                             "past the block's %" PRIu32 " elements (non-zero padding)",
                             what, j, len);
        if (pop != k)
            return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta block %" PRIu64 ": bitmap popcount "
                             "%" PRIu64 " != k %" PRIu32, what, j, pop, k);
        if (!all_zero(p + mbytes, head - mbytes))
            return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta block %" PRIu64 ": non-zero "
                             "padding after the bitmap", what, j);
        /* at e = 0 the choice may be SPARSE: then these positions' own e must push it here */
        wsync_delta_block_bytes(len, k, 0, es, &want);
        if (want != WSYNC_DELTA_BITMAP) {
            uint32_t be = bitmap_escapes(p, len);
            wsync_delta_block_bytes(len, k, be, es, &want);
            if (want != WSYNC_DELTA_BITMAP)
                return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta block %" PRIu64 ": mode BITMAP, "
                                 "but its k %" PRIu32 " positions of %" PRIu32 " elements have "
                                 "e %" PRIu32 ": %s", what, j, k, len, be, mode_name(want));
        }
    }
    if (!all_zero(p + head + vals, bytes - head - vals))
        return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta block %" PRIu64 ": non-zero padding "
                         "after the %s values", what, j, mode_name(mode));
    return WSYNC_OK;
}

/* Format 4: the step values of STEPS block j (k changed, its index stream or bitmap head bytes),
 * whose payload starts at p with room bytes before the payload area ends: the codes (none 3, the
 * padding zero) and that the steps are smaller than the plain values. *vals gets the values'
 * bytes (codes padded, then the literals), *bytes the payload's. */
static wsync_status_t check_steps(const uint8_t *p, uint64_t room, uint64_t head, uint32_t k,
                                  uint32_t es, uint64_t j, const char *what, uint64_t *vals,
                                  uint64_t *bytes)
{
    uint64_t cb = ((uint64_t)k + 3) / 4, nl = 0;
    const uint8_t *c = p + head;

    if (head + align8(cb) > room)
        return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta truncated: block %" PRIu64 "'s %" PRIu64
                         " bytes of step codes pass the end of the payload area", what, j, cb);
    /* 32 codes a word: the low and high bit of each; code 2 is high alone, 3 both */
    for (uint64_t i = 0; i < align8(cb); i += 8) {
        uint64_t x = ld64(c + i), left = (uint64_t)k - WSYNC_MIN((uint64_t)k, i * 4);
        uint64_t valid = left >= 32 ? UINT64_MAX : ((uint64_t)1 << (2 * left)) - 1;
        uint64_t lo = x & 0x5555555555555555ull, hi = (x >> 1) & 0x5555555555555555ull;
        if ((x & ~valid) != 0) {
            uint64_t bit = i * 8 + (uint64_t)__builtin_ctzll(x & ~valid);
            return wsync_err(WSYNC_ERR_INTEGRITY, bit < cb * 8 ?
                             "%s: delta block %" PRIu64 ": step code bits set past its %" PRIu32
                             " codes (non-zero padding)" : "%s: delta block %" PRIu64 ": non-zero "
                             "padding after the step codes (%" PRIu32 " codes)", what, j, k);
        }
        if ((hi & lo) != 0)
            return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta block %" PRIu64 ": step code 3 "
                             "(0: +1, 1: -1, 2: a value) for change %" PRIu64, what, j,
                             i * 4 + (uint64_t)__builtin_ctzll(hi & lo) / 2);
        nl += (uint64_t)__builtin_popcountll(hi & ~lo);
    }
    *vals = align8(cb) + nl * es;
    *bytes = head + align8(cb) + align8(nl * es);
    if (align8(cb) + align8(nl * es) >= align8((uint64_t)k * es))
        return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta block %" PRIu64 ": STEPS, but its %"
                         PRIu32 " codes and %" PRIu64 " values are not smaller than its plain "
                         "values", what, j, k, nl);
    if (*bytes > room)
        return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta truncated: block %" PRIu64 "'s STEPS "
                         "payload of %" PRIu64 " bytes passes the end of the payload area",
                         what, j, *bytes);
    return WSYNC_OK;
}

/* The header of a stream of len bytes for n elements of esize, and that its table fits: *nb and
 * *table_end for the blocks' check. */
static wsync_status_t check_header(const uint8_t *p, uint64_t len, uint64_t n, uint32_t esize,
                                   const char *what, uint64_t *nb_out, uint64_t *table_end_out)
{
    uint64_t nb, table_end;
    uint32_t magic;

    if (p == NULL && len > 0)
        return wsync_err(WSYNC_ERR_INVALID, "%s: delta check: enc is NULL", what);
    if (len < WSYNC_DELTA_HEADER)
        return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta truncated: %" PRIu64 " bytes, the "
                         "header alone is %u", what, len, WSYNC_DELTA_HEADER);
    magic = ld32(p);
    if (magic != WSYNC_DELTA_MAGIC)
        return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta bad magic 0x%08" PRIx32 " (expected "
                         "0x%08x)", what, magic, WSYNC_DELTA_MAGIC);
    if (p[4] != WSYNC_DELTA_FORMAT && p[4] != WSYNC_DELTA_FORMAT_STEPS)
        return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta format %u, expected %u or %u", what,
                         p[4], WSYNC_DELTA_FORMAT, WSYNC_DELTA_FORMAT_STEPS);
    if (p[5] != esize || !esize_ok(esize))
        return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta esize %u, expected %" PRIu32, what,
                         p[5], esize);
    if (p[6] != 0 || p[7] != 0)
        return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta header: non-zero padding (bytes 6-7: "
                         "0x%02x%02x)", what, p[7], p[6]);
    if (ld64(p + 8) != n)
        return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta header says %" PRIu64 " elements, the "
                         "region holds %" PRIu64, what, ld64(p + 8), n);
    if (n == 0 || n > UINT32_MAX / esize)
        return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta of %" PRIu64 " elements of %" PRIu32
                         " bytes (1 to 2^32 - 1 bytes)", what, n, esize);
    nb = wsync_delta_nblocks(n);
    table_end = WSYNC_DELTA_HEADER + 8 * nb;
    if (len < table_end)
        return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta truncated: %" PRIu64 " bytes, header "
                         "and block table of %" PRIu64 " blocks are %" PRIu64, what, len, nb,
                         table_end);
    *nb_out = nb;
    *table_end_out = table_end;
    return WSYNC_OK;
}

/* Blocks [b0, b1) of a stream whose header passed (nb blocks, table ending at table_end, len
 * bytes): *sum += their payloads' bytes. */
static wsync_status_t check_blocks(const uint8_t *p, uint64_t len, uint64_t n, uint32_t esize,
                                   uint64_t nb, uint64_t table_end, uint64_t b0, uint64_t b1,
                                   const char *what, uint64_t *sum)
{
    uint64_t area = len - table_end;
    for (uint64_t j = b0; j < b1; j++) {
        const uint8_t *t = p + WSYNC_DELTA_HEADER + 8 * j;
        uint32_t off = ld32(t), w = ld32(t + 4), want;
        uint32_t mode = wsync_delta_word_mode(w), e = wsync_delta_word_e(w);
        uint32_t k = wsync_delta_word_k(w), steps = wsync_delta_word_steps(w);
        uint32_t blen = (uint32_t)(j + 1 < nb ? WSYNC_DELTA_BLOCK : n - j * WSYNC_DELTA_BLOCK);
        uint64_t bytes, vals;
        wsync_status_t st;

        if (off % 8 != 0)
            return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta block %" PRIu64 ": misaligned "
                             "payload offset %" PRIu32 " (a multiple of 8)", what, j, off);
        if (off > area)
            return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta block %" PRIu64 ": payload offset "
                             "%" PRIu32 " out of range (payload area %" PRIu64 " bytes)",
                             what, j, off, area);
        if (k > blen)
            return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta block %" PRIu64 ": k %" PRIu32
                             " > the block's %" PRIu32 " elements", what, j, k, blen);
        if (mode != WSYNC_DELTA_SPARSE && e != 0)
            return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta block %" PRIu64 ": e %" PRIu32
                             " in a %s block (escape bytes belong to SPARSE blocks only)",
                             what, j, e, mode_name(mode));
        /* the choice is monotone in e: a SPARSE block is judged at its own e, another at the
         * largest e its k allows (a BITMAP block's own e is checked with its bitmap) */
        wsync_delta_block_bytes(blen, k, mode == WSYNC_DELTA_SPARSE ? e : (blen - k) /
                                WSYNC_DELTA_ESC, esize, &want);
        if (mode != want) {
            if (mode == WSYNC_DELTA_SPARSE)
                return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta block %" PRIu64 ": mode "
                                 "SPARSE, but k %" PRIu32 " and e %" PRIu32 " of %" PRIu32
                                 " elements is %s", what, j, k, e, blen, mode_name(want));
            return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta block %" PRIu64 ": mode %s, but k "
                             "%" PRIu32 " of %" PRIu32 " elements is %s", what, j,
                             mode_name(mode), k, blen, mode_name(want));
        }
        if (steps && (p[4] != WSYNC_DELTA_FORMAT_STEPS ||
                      (mode != WSYNC_DELTA_SPARSE && mode != WSYNC_DELTA_BITMAP)))
            return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta block %" PRIu64 ": the STEPS flag "
                             "on a %s block of format %u (format 4's SPARSE and BITMAP blocks "
                             "only)", what, j, mode_name(mode), p[4]);
        bytes = mode_bytes(mode, blen, k, e, esize);
        vals = mode == WSYNC_DELTA_PLAIN ? (uint64_t)blen * esize : (uint64_t)k * esize;
        if (steps) {
            st = check_steps(p + table_end + off, area - off, bytes - align8(vals), k, esize, j,
                             what, &vals, &bytes);
            if (st != WSYNC_OK)
                return st;
        }
        if (bytes > area - off)
            return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta truncated: block %" PRIu64 "'s %s "
                             "payload of %" PRIu64 " bytes at offset %" PRIu32 " passes the "
                             "end (payload area %" PRIu64 " bytes)", what, j, mode_name(mode),
                             bytes, off, area);
        st = check_payload(p + table_end + off, bytes, mode, blen, k, e, esize, vals, j, what);
        if (st != WSYNC_OK)
            return st;
        *sum += bytes;
    }
    return WSYNC_OK;
}

wsync_status_t wsync_delta_check_area(uint64_t len, uint64_t n, uint64_t payload,
                                      const char *what)
{
    uint64_t table_end = WSYNC_DELTA_HEADER + 8 * wsync_delta_nblocks(n), area;

    if (what == NULL)
        what = "delta chunk";
    if (len < table_end)
        return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta truncated: %" PRIu64 " bytes, header "
                         "and block table of %" PRIu64 " blocks are %" PRIu64, what, len,
                         wsync_delta_nblocks(n), table_end);
    area = len - table_end;
    if (payload != area)   /* bytes beside the payloads, or payloads overlapping */
        return wsync_err(WSYNC_ERR_INTEGRITY, "%s: delta payloads of %" PRIu64 " bytes in all, "
                         "the payload area holds %" PRIu64, what, payload, area);
    return WSYNC_OK;
}

wsync_status_t wsync_delta_check_blocks(const void *enc, uint64_t len, uint64_t n, uint32_t esize,
                                        uint64_t b0, uint64_t b1, const char *what,
                                        uint64_t *payload)
{
    uint64_t nb = 0, table_end = 0, sum = 0;
    wsync_status_t rc;

    if (what == NULL)
        what = "delta chunk";
    if ((rc = check_header(enc, len, n, esize, what, &nb, &table_end)) != WSYNC_OK)
        return rc;
    if (b0 > b1 || b1 > nb || payload == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: delta check_blocks: blocks [%" PRIu64 ", %"
                         PRIu64 ") of a stream of %" PRIu64 " blocks%s", what, b0, b1, nb,
                         payload == NULL ? ", payload is NULL" : "");
    if ((rc = check_blocks(enc, len, n, esize, nb, table_end, b0, b1, what, &sum)) != WSYNC_OK)
        return rc;
    *payload = sum;
    return WSYNC_OK;
}

wsync_status_t wsync_delta_check(const void *enc, uint64_t len, uint64_t n, uint32_t esize,
                                 const char *what)
{
    uint64_t nb = wsync_delta_nblocks(n), sum = 0;
    wsync_status_t rc = wsync_delta_check_blocks(enc, len, n, esize, 0, nb, what, &sum);

    return rc != WSYNC_OK ? rc : wsync_delta_check_area(len, n, sum, what);
}

/* ---- apply ---------------------------------------------------------------------------------- */

/* Land change j of a block at d: its value from *vals (advanced), or with codes (a STEPS block,
 * format 4) its step or the next of *vals. */
static inline void land(uint8_t *d, uint32_t es, const uint8_t *codes, uint32_t j,
                        const uint8_t **vals)
{
    uint32_t code = codes == NULL ? 2u : (codes[j >> 2] >> (2 * (j & 3))) & 3u;
    if (code == 2) {
        copy_elem(d, *vals, es);
        *vals += es;
    } else {
        step_elem(d, es, code);
    }
}

/* Land the changes at the positions the index stream q (sl bytes) names, in the block at `at`:
 * values from vals, or with codes (STEPS) steps and vals' literals. */
static void scatter_sparse(const view_t *v, cursor_t at, const uint8_t *q, uint64_t sl,
                           const uint8_t *codes, const uint8_t *vals)
{
    uint32_t skip = 0, j = 0;           /* elements to move past before the next byte's gap */
    for (uint64_t i = 0; i < sl; i++) {
        uint32_t b = q[i];
        if (b == WSYNC_DELTA_ESC) {
            skip += WSYNC_DELTA_ESC;
            continue;
        }
        cursor_add(v, &at, skip + b);
        land(view_at(v, at), v->es, codes, j++, &vals);
        skip = 1;
    }
}

/* Land the changes at the elements whose bits are set in the bitmap of a block of len (values
 * and codes as scatter_sparse). */
static void scatter_bitmap(const view_t *v, cursor_t at, const uint8_t *map, uint32_t len,
                           const uint8_t *codes, const uint8_t *vals)
{
    uint64_t mbytes = ((uint64_t)len + 7) / 8, prev = 0;
    uint32_t j = 0;

    for (uint64_t w = 0; w < mbytes; w += 8) {
        uint64_t bits = 0;
        memcpy(&bits, map + w, mbytes - w < 8 ? mbytes - w : 8);
        while (bits != 0) {
            uint64_t i = w * 8 + (uint64_t)__builtin_ctzll(bits);
            bits &= bits - 1;
            cursor_add(v, &at, i - prev);
            prev = i;
            land(view_at(v, at), v->es, codes, j++, &vals);
        }
    }
}

/* Copy len dense values from src into the block at `at`. */
static void copy_in(const view_t *v, cursor_t at, uint64_t len, const uint8_t *src)
{
    while (len > 0) {
        uint64_t m = span_len(v, at, len);
        memcpy(view_at(v, at), src, m * v->es);
        src += m * v->es;
        len -= m;
        at.r++;
        at.c = 0;
    }
}

/* The arguments of an apply checked, the stream's element count n, block count nb and the end
 * of its table into *n, *nb, *table_end. fn and out_name (the output's parameter): for the
 * errors. */
static wsync_status_t apply_args(const char *fn, const uint8_t *e, uint64_t len,
                                 const void *dst_base, const wsync_region_t *dst, uint32_t esize,
                                 const void *out, const char *out_name, uint64_t *n, uint64_t *nb,
                                 uint64_t *table_end)
{
    if (e == NULL || dst_base == NULL || out == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "%s: %s is NULL", fn,
                         e == NULL ? "enc" : dst_base == NULL ? "dst_base" : out_name);
    if (!esize_ok(esize))
        return wsync_err(WSYNC_ERR_INVALID, "%s: esize %" PRIu32 " (1, 2, 4 or 8 bytes)", fn,
                         esize);
    if (!region_ok(dst, n))
        return wsync_err(WSYNC_ERR_INVALID, "%s: dst region %s", fn,
                         dst == NULL ? "is NULL" : "is empty, pitch < cols or overflows");
    /* cheap guards against applying a stream meant for another region; the rest is the check's */
    if (len < WSYNC_DELTA_HEADER || ld64(e + 8) != *n || e[5] != esize)
        return wsync_err(WSYNC_ERR_INVALID, "%s: the stream (%" PRIu64 " bytes) is not a checked "
                         "delta of %" PRIu64 " elements of %" PRIu32 " bytes", fn, len, *n, esize);
    *nb = wsync_delta_nblocks(*n);
    *table_end = WSYNC_DELTA_HEADER + 8 * *nb;
    if (len < *table_end)
        return wsync_err(WSYNC_ERR_INVALID, "%s: %" PRIu64 " bytes hold no table of %" PRIu64
                         " blocks (run wsync_delta_check first)", fn, len, *nb);
    return WSYNC_OK;
}

/* Apply blocks [b0, b1) of a stream of n elements (nb blocks) to the view, each block's leaf
 * hash to the tree (tree != NULL) or to leaves[j - b0]. */
static void apply_range(const uint8_t *e, uint64_t table_end, uint64_t n, uint64_t nb,
                        const view_t *v, uint64_t b0, uint64_t b1, tree_t *tree,
                        uint64_t *leaves)
{
    cursor_t at = {0, 0};

    cursor_add(v, &at, b0 * WSYNC_DELTA_BLOCK);
    for (uint64_t j = b0; j < b1; j++) {
        const uint8_t *t = e + WSYNC_DELTA_HEADER + 8 * j;
        uint32_t off = ld32(t), w = ld32(t + 4), mode = wsync_delta_word_mode(w);
        uint32_t k = wsync_delta_word_k(w);
        uint64_t sl = (uint64_t)k + wsync_delta_word_e(w);
        uint32_t blen = (uint32_t)(j + 1 < nb ? WSYNC_DELTA_BLOCK : n - j * WSYNC_DELTA_BLOCK);
        const uint8_t *p = e + table_end + off, *vals;
        /* a STEPS block's values are its codes, then its literals */
        uint64_t cb = wsync_delta_word_steps(w) ? align8(((uint64_t)k + 3) / 4) : 0;

        switch (mode) {
        case WSYNC_DELTA_SPARSE:
            vals = p + align8(sl);
            scatter_sparse(v, at, p, sl, cb != 0 ? vals : NULL, vals + cb);
            break;
        case WSYNC_DELTA_BITMAP:
            vals = p + align8(((uint64_t)blen + 7) / 8);
            scatter_bitmap(v, at, p, blen, cb != 0 ? vals : NULL, vals + cb);
            break;
        case WSYNC_DELTA_PLAIN:
            copy_in(v, at, blen, p);
            break;
        default:
            break;
        }
        uint64_t leaf = hash_block(v, at, blen);
        if (tree != NULL)
            tree_add(tree, leaf);
        else
            leaves[j - b0] = leaf;
        cursor_add(v, &at, blen);
    }
}

wsync_status_t wsync_delta_apply(const void *enc, uint64_t len, void *dst_base,
                                 const wsync_region_t *dst, uint32_t esize, uint64_t *hash)
{
    uint64_t n, nb, table_end;
    wsync_status_t rc = apply_args("delta apply", enc, len, dst_base, dst, esize, hash, "hash",
                                   &n, &nb, &table_end);
    tree_t tree;

    if (rc != WSYNC_OK)
        return rc;
    view_t v = make_view(dst_base, dst, esize);
    tree_init(&tree);
    apply_range(enc, table_end, n, nb, &v, 0, nb, &tree, NULL);
    *hash = tree_digest(&tree);
    return WSYNC_OK;
}

wsync_status_t wsync_delta_apply_blocks(const void *enc, uint64_t len, void *dst_base,
                                        const wsync_region_t *dst, uint32_t esize, uint64_t b0,
                                        uint64_t b1, uint64_t *leaves)
{
    uint64_t n, nb, table_end;
    wsync_status_t rc = apply_args("delta apply_blocks", enc, len, dst_base, dst, esize, leaves,
                                   "leaves", &n, &nb, &table_end);

    if (rc != WSYNC_OK)
        return rc;
    if (b0 > b1 || b1 > nb)
        return wsync_err(WSYNC_ERR_INVALID, "delta apply_blocks: blocks [%" PRIu64 ", %" PRIu64
                         ") of a stream of %" PRIu64 " blocks", b0, b1, nb);
    view_t v = make_view(dst_base, dst, esize);
    apply_range(enc, table_end, n, nb, &v, b0, b1, NULL, leaves);
    return WSYNC_OK;
}

uint64_t wsync_delta_tree_hash(const uint64_t *leaves, uint64_t nb)
{
    tree_t tree;

    tree_init(&tree);
    for (uint64_t j = 0; j < nb; j++)
        tree_add(&tree, leaves[j]);
    return tree_digest(&tree);
}

uint64_t wsync_delta_hash(const void *base, const wsync_region_t *src, uint32_t esize)
{
    uint64_t n = 0, nb;
    view_t v;
    cursor_t at = {0, 0};
    tree_t tree;

    tree_init(&tree);
    if (base == NULL || !esize_ok(esize) || !region_ok(src, &n))
        return tree_digest(&tree);      /* nothing to hash: the hash of no leaves */
    v = make_view(base, src, esize);
    nb = wsync_delta_nblocks(n);
    for (uint64_t j = 0; j < nb; j++) {
        uint64_t blen = j + 1 < nb ? WSYNC_DELTA_BLOCK : n - j * WSYNC_DELTA_BLOCK;
        tree_add(&tree, hash_block(&v, at, blen));
        cursor_add(&v, &at, blen);
    }
    return tree_digest(&tree);
}
