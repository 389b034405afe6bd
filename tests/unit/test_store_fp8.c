/* The store's FP8 tables (schemes/store_fp8.c): a sender's table as a reader decodes it (rows
 * checked against the directory entry's regions, malformed ones refused naming the sender), and
 * the lookup that finds the packed region holding a reader's FP8 chunk: exactly, or as whole
 * cell rows of a larger region (the second get's offsets), and never across a cell row, another
 * rule, other columns or two regions. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "schemes/store_fp8.h"
#include "tests/support/check.h"
#include "wsync/wsync.h"

#define BASE 0x100000ull
#define LEN (1ull << 20)

static const wsync_wire_rule_t block128 = {WSYNC_DTYPE_F8E4M3FN, WSYNC_QUANT_BLOCK, 128, 128,
                                           1e-12f, 0, 0};
static const wsync_wire_rule_t ue8m0_64 = {WSYNC_DTYPE_F8E4M3FN, WSYNC_QUANT_BLOCK, 64, 128,
                                           1e-12f, 1, 0};
static const wsync_wire_rule_t channel = {WSYNC_DTYPE_F8E4M3FN, WSYNC_QUANT_CHANNEL, 0, 0, 0.0f,
                                          0, 0};

typedef struct {
    uint32_t shard, region;
    uint64_t addr;
    wsync_region_t g;
    uint32_t ncells;
    const wsync_wire_rule_t *rule;
} trow_t;

/* A table in its wire form, written here field by field (schemes/store_fp8.h). */
static void put_table(wsync_wbuf_t *b, const trow_t *rows, uint32_t n, uint32_t row_bytes)
{
    wsync_put_u32(b, n);
    wsync_put_u32(b, row_bytes);
    for (uint32_t i = 0; i < n; i++) {
        const trow_t *x = &rows[i];
        uint32_t eps;
        memcpy(&eps, &x->rule->eps, 4);
        wsync_put_u32(b, x->shard);
        wsync_put_u32(b, x->region);
        wsync_put_u64(b, x->addr);
        wsync_put_u64(b, x->g.off);
        wsync_put_u64(b, x->g.rows);
        wsync_put_u64(b, x->g.cols);
        wsync_put_u64(b, x->g.pitch);
        wsync_put_u32(b, x->ncells);
        wsync_put_u32(b, (uint32_t)x->rule->fp8_dtype);
        wsync_put_u32(b, (uint32_t)x->rule->scheme);
        wsync_put_i32(b, x->rule->block_rows);
        wsync_put_i32(b, x->rule->block_cols);
        wsync_put_u32(b, eps);
        wsync_put_u32(b, (x->rule->ue8m0 ? 1u : 0u) | (x->rule->no_saturate ? 2u : 0u));
        wsync_put_u64(b, 0);
    }
}

/* A directory entry with one region [BASE, BASE + LEN) and two shards. */
static void entry(wsync_dir_entry_t *e, struct wsync_dir_region *rg, struct wsync_dir_shard *sh)
{
    memset(e, 0, sizeof(*e));
    memset(rg, 0, sizeof(*rg));
    rg->base = BASE;
    rg->len = LEN;
    sh[0] = (struct wsync_dir_shard){0, BASE};
    sh[1] = (struct wsync_dir_shard){0, BASE};
    e->sender = 3;
    e->nregions = 1;
    e->regions = rg;
    e->nshards = 2;
    e->shards = sh;
}

/* The table of rows[0, n) as sender 3's entry() holds it, decoded; its count said as `said`. */
static wsync_status_t decode_said(const trow_t *rows, uint32_t n, uint32_t said,
                                  uint32_t row_bytes, store_fp8_table_t *t)
{
    wsync_dir_entry_t e;
    struct wsync_dir_region rg;
    struct wsync_dir_shard sh[2];
    wsync_wbuf_t b;
    wsync_rbuf_t rb;

    entry(&e, &rg, sh);
    wsync_wbuf_init(&b);
    put_table(&b, rows, n, row_bytes);
    for (int i = 0; i < 4 && !b.err; i++)   /* the count in place, little-endian */
        b.data[i] = (uint8_t)(said >> (8 * i));
    wsync_rbuf_init(&rb, b.data, b.len);
    wsync_status_t st = wsync_store_fp8_table_decode(&rb, 3, &e, t);
    wsync_wbuf_free(&b);
    return st;
}

static wsync_status_t decode(const trow_t *rows, uint32_t n, uint32_t row_bytes,
                             store_fp8_table_t *t)
{
    return decode_said(rows, n, n, row_bytes, t);
}

/* shard 0 [256, 512] bf16: a 128 x 128 region of its left half's 256 rows, and two channel
 * regions of 128 rows (columns 0..255 and 256..511); shard 1 [256, 256]: UE8M0 64 x 128 regions
 * of rows 0..63 and 64..255. Listed out of order: the decode sorts. */
static const trow_t rows5[] = {
    {1, 0, BASE + 0x40000, {64 * 256, 256, 192, 256}, 6, &ue8m0_64},
    {0, 0, BASE, {0, 512, 256, 256}, 4, &block128},
    {0, 0, BASE + 0x20000, {256, 512, 128, 256}, 128, &channel},
    {0, 0, BASE + 0x10000, {0, 512, 128, 256}, 128, &channel},
    {1, 0, BASE + 0x30000, {0, 256, 64, 256}, 2, &ue8m0_64},
};

static void expect(const store_fp8_table_t *t, uint32_t shard, wsync_region_t src,
                   const wsync_wire_rule_t *rule, uint64_t want_addr, uint64_t want_dr,
                   const char *what)
{
    uint64_t dr = UINT64_MAX;
    const store_fp8_row_t *x = wsync_store_fp8_find(t, shard, &src, rule, &dr);
    if (want_addr == 0) {
        CHECK_MSG(x == NULL, "%s: found the region at %#llx (row %llu), expected none", what,
                  x ? (unsigned long long)x->addr : 0ull, (unsigned long long)dr);
        return;
    }
    CHECK_MSG(x != NULL && x->addr == want_addr && dr == want_dr, "%s: found %#llx row %llu, "
              "expected %#llx row %llu", what, x ? (unsigned long long)x->addr : 0ull,
              (unsigned long long)dr, (unsigned long long)want_addr,
              (unsigned long long)want_dr);
}

static void case_lookup(void)
{
    store_fp8_table_t t;
    CHECK_OK(decode(rows5, 5, STORE_FP8_ROW, &t));
    CHECK(t.n == 5);
    wsync_wire_rule_t eps2 = block128;
    eps2.eps = 1e-6f;
    expect(&t, 0, (wsync_region_t){0, 512, 256, 256}, &block128, BASE, 0, "the region itself");
    expect(&t, 0, (wsync_region_t){128 * 512, 512, 128, 256}, &block128, BASE, 128,
           "its second cell row");
    expect(&t, 0, (wsync_region_t){64 * 512, 512, 64, 256}, &block128, 0, 0,
           "rows starting inside a cell row");
    expect(&t, 0, (wsync_region_t){0, 512, 100, 256}, &block128, 0, 0,
           "rows ending inside a cell row, before the region's end");
    expect(&t, 0, (wsync_region_t){128 * 512, 512, 200, 256}, &block128, 0, 0,
           "rows past the region's end");
    expect(&t, 0, (wsync_region_t){0, 512, 256, 256}, &eps2, 0, 0, "another eps");
    expect(&t, 0, (wsync_region_t){0, 512, 256, 256}, &ue8m0_64, 0, 0, "another rule");
    expect(&t, 0, (wsync_region_t){5 * 512, 512, 10, 256}, &channel, BASE + 0x10000, 5,
           "channel rows 5..14 of the left columns");
    expect(&t, 0, (wsync_region_t){256 + 5 * 512, 512, 10, 256}, &channel, BASE + 0x20000, 5,
           "channel rows 5..14 of the right columns");
    expect(&t, 0, (wsync_region_t){128 + 5 * 512, 512, 10, 256}, &channel, 0, 0,
           "other columns");
    expect(&t, 0, (wsync_region_t){5 * 512, 512, 10, 128}, &channel, 0, 0, "fewer columns");
    expect(&t, 1, (wsync_region_t){128 * 256, 256, 64, 256}, &ue8m0_64, BASE + 0x40000, 64,
           "UE8M0 rows 128..191, in the second region");
    expect(&t, 1, (wsync_region_t){0, 256, 64, 256}, &ue8m0_64, BASE + 0x30000, 0,
           "UE8M0 rows 0..63, the first region");
    expect(&t, 1, (wsync_region_t){0, 256, 128, 256}, &ue8m0_64, 0, 0, "rows across two regions");
    expect(&t, 1, (wsync_region_t){0, 512, 256, 256}, &block128, 0, 0, "another shard's region");
    wsync_store_fp8_table_clear(&t);

    /* an empty table finds nothing */
    CHECK_OK(decode(NULL, 0, STORE_FP8_ROW, &t));
    expect(&t, 0, (wsync_region_t){0, 512, 256, 256}, &block128, 0, 0, "an empty table");
    wsync_store_fp8_table_clear(&t);
}

static void refused(const trow_t *row, uint32_t row_bytes, const char *what)
{
    store_fp8_table_t t;
    wsync_status_t st = decode(row, 1, row_bytes, &t);
    CHECK_MSG(st == WSYNC_ERR_PROTOCOL, "%s: decode returned %s", what, wsync_status_name(st));
    if (st == WSYNC_ERR_PROTOCOL)
        CHECK_ERR_HAS("sender 3");
    else
        wsync_store_fp8_table_clear(&t);
}

static void case_malformed(void)
{
    trow_t r = rows5[1];   /* 256 x 256 codes and 4 scales: 65,552 bytes */
    wsync_wire_rule_t zero = block128, bad_dtype = block128;
    zero.block_rows = 0;
    bad_dtype.fp8_dtype = WSYNC_DTYPE_BF16;

    refused(&r, STORE_FP8_ROW - 4, "rows of another size");
    r.region = 1;
    refused(&r, STORE_FP8_ROW, "a region the entry does not have");
    r = rows5[1];
    r.addr = BASE + LEN - 65552 + 1;
    refused(&r, STORE_FP8_ROW, "codes and scales one byte past the region");
    r.addr = BASE + LEN - 65552;
    store_fp8_table_t t;
    CHECK_OK(decode(&r, 1, STORE_FP8_ROW, &t));   /* ending at the region's last byte */
    wsync_store_fp8_table_clear(&t);
    r.addr = BASE - 64;
    refused(&r, STORE_FP8_ROW, "an address before the region");
    r = rows5[1];
    r.ncells = 5;
    refused(&r, STORE_FP8_ROW, "a cell count that is not the rule's");
    r = rows5[1];
    r.rule = &zero;
    refused(&r, STORE_FP8_ROW, "blocks of 0 rows");
    r.rule = &bad_dtype;
    refused(&r, STORE_FP8_ROW, "codes of bf16");
    r = rows5[1];
    r.g.pitch = 128;
    refused(&r, STORE_FP8_ROW, "a pitch under the columns");
    r = rows5[1];
    r.shard = 2;
    refused(&r, STORE_FP8_ROW, "a shard the entry does not have");

    /* more rows said than the bytes hold */
    CHECK_ST(decode_said(rows5, 2, 3, STORE_FP8_ROW, &t), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("sender 3");
}

int main(void)
{
    RUN(case_lookup);
    RUN(case_malformed);
    return check_summary();
}
