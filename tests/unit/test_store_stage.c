/* The store's staging ring (schemes/store_stage.c) driven with host memory: a fake network whose
 * gets land only when the ring asks (land), and copiers that copy at once or only when waited
 * for. Rows of a source go through a ring of a few small slots to a pitched destination, and
 * must equal the rows copied straight; a ring that started a slot's copies before its gets
 * landed, or refilled a slot before its copies were done, would leave other bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "tests/support/check.h"
#include "schemes/store_stage.h"
#include "wsync/wsync.h"

#define MAXQ 4096

typedef struct {
    void *dst;
    const void *src;
    size_t len;
} get_t;

typedef struct {
    int slot;
    void *dst;
    size_t dpitch;
    const void *src;
    size_t spitch, width, rows;
} copy_t;

typedef struct {
    get_t gets[MAXQ];                /* posted, not yet landed */
    int ngets;
    int lands;
    int fail_land_at;                /* land number that fails (0: none) */
    copy_t copies[MAXQ];             /* held back until their slot is waited for */
    int ncopies;
    int deferred;                    /* 1: copies run at wait, 0: at once */
    int marks, waits;
} fake_t;

static void run_copy(const copy_t *c)
{
    for (size_t k = 0; k < c->rows; k++)
        memcpy((uint8_t *)c->dst + k * c->dpitch, (const uint8_t *)c->src + k * c->spitch,
               c->width);
}

static wsync_status_t fake_copy(void *arg, int slot, void *dst, size_t dpitch, const void *src,
                                size_t spitch, size_t width, size_t rows)
{
    fake_t *f = arg;
    copy_t c = {slot, dst, dpitch, src, spitch, width, rows};
    if (!f->deferred) {
        run_copy(&c);
        return WSYNC_OK;
    }
    if (f->ncopies == MAXQ)
        return WSYNC_ERR_NOMEM;
    f->copies[f->ncopies++] = c;
    return WSYNC_OK;
}

static wsync_status_t fake_mark(void *arg, int slot)
{
    (void)slot;
    ((fake_t *)arg)->marks++;
    return WSYNC_OK;
}

static wsync_status_t fake_wait(void *arg, int slot, int64_t deadline_ms)
{
    fake_t *f = arg;
    int keep = 0;
    (void)deadline_ms;
    f->waits++;
    for (int i = 0; i < f->ncopies; i++) {
        if (f->copies[i].slot == slot)
            run_copy(&f->copies[i]);
        else
            f->copies[keep++] = f->copies[i];
    }
    f->ncopies = keep;
    return WSYNC_OK;
}

static wsync_status_t fake_land(void *arg)
{
    fake_t *f = arg;
    if (++f->lands == f->fail_land_at)
        return wsync_err(WSYNC_ERR_PEER_LOST, "fake: land %d failed", f->lands);
    for (int i = 0; i < f->ngets; i++)
        memcpy(f->gets[i].dst, f->gets[i].src, f->gets[i].len);
    f->ngets = 0;
    return WSYNC_OK;
}

static void post(fake_t *f, void *dst, const void *src, size_t len)
{
    if (f->ngets < MAXQ)
        f->gets[f->ngets++] = (get_t){dst, src, len};
    else
        check_failures++;
}

/* rows x row bytes of src (pitch spitch) to dst (pitch dpitch), through the ring as the store
 * does: whole rows per take, or rows longer than a slot in slot-sized pieces. */
static wsync_status_t stage_rows(wsync_stage_t *sg, fake_t *f, const uint8_t *src, size_t spitch,
                                 uint8_t *dst, size_t dpitch, size_t row, size_t rows)
{
    wsync_status_t rc = WSYNC_OK;
    uint8_t *p;
    if (row <= sg->slot_bytes) {
        size_t per = sg->slot_bytes / row;
        for (size_t r0 = 0; r0 < rows && rc == WSYNC_OK; r0 += per) {
            size_t n = rows - r0 < per ? rows - r0 : per;
            if ((rc = wsync_stage_take(sg, n * row, 0, &p)) != WSYNC_OK)
                return rc;
            for (size_t k = 0; k < n; k++)
                post(f, p + k * row, src + (r0 + k) * spitch, row);
            rc = wsync_stage_move(sg, p, row, dst + r0 * dpitch, dpitch, row, n);
        }
        return rc;
    }
    for (size_t k = 0; k < rows && rc == WSYNC_OK; k++) {
        for (size_t o = 0; o < row && rc == WSYNC_OK; o += sg->slot_bytes) {
            size_t n = row - o < sg->slot_bytes ? row - o : sg->slot_bytes;
            if ((rc = wsync_stage_take(sg, n, 0, &p)) == WSYNC_OK) {
                post(f, p, src + k * spitch + o, n);
                rc = wsync_stage_move(sg, p, n, dst + k * dpitch + o, n, n, 1);
            }
        }
    }
    return rc;
}

typedef struct {
    size_t row, rows, spitch, dpitch;
} shape_t;

static void roundtrip(int deferred, int nslots, size_t slot)
{
    /* a column slice, rows longer than a slot, a 1-row tensor, tiny rows packed many per slot */
    const shape_t shapes[] = {{48, 20, 96, 64}, {700, 3, 700, 800}, {1000, 1, 1000, 1000},
                              {8, 300, 8, 16}, {256, 7, 512, 256}};
    enum { NS = sizeof(shapes) / sizeof(shapes[0]) };
    uint8_t *src[NS], *dst[NS], *ref[NS];
    uint8_t *mem = malloc((size_t)nslots * slot);
    uint8_t *slots[8];
    fake_t *f = calloc(1, sizeof(*f));
    wsync_stage_t sg;
    unsigned seed = 12345;

    CHECK(mem != NULL && f != NULL);
    if (mem == NULL || f == NULL)
        return;
    f->deferred = deferred;
    for (int i = 0; i < nslots; i++)
        slots[i] = mem + (size_t)i * slot;
    wsync_stage_copier_t cp = {fake_copy, fake_mark, fake_wait, f};
    CHECK_OK(wsync_stage_init(&sg, slots, nslots, slot, &cp, fake_land, f));
    for (int s = 0; s < NS; s++) {
        const shape_t *h = &shapes[s];
        size_t sb = h->spitch * h->rows, db = h->dpitch * h->rows;
        src[s] = malloc(sb);
        dst[s] = malloc(db);
        ref[s] = malloc(db);
        for (size_t i = 0; i < sb; i++)
            src[s][i] = (uint8_t)((seed = seed * 1103515245u + 12345u) >> 16);
        memset(dst[s], 0xEE, db);
        memset(ref[s], 0xEE, db);
        for (size_t k = 0; k < h->rows; k++)
            memcpy(ref[s] + k * h->dpitch, src[s] + k * h->spitch, h->row);
    }
    for (int s = 0; s < NS; s++)
        CHECK_OK(stage_rows(&sg, f, src[s], shapes[s].spitch, dst[s], shapes[s].dpitch,
                            shapes[s].row, shapes[s].rows));
    CHECK_OK(wsync_stage_finish(&sg, 0));
    for (int s = 0; s < NS; s++) {
        CHECK_MSG(memcmp(dst[s], ref[s], shapes[s].dpitch * shapes[s].rows) == 0,
                  "shape %d (%zu rows of %zu bytes) differs after the ring (%d slots of %zu, %s "
                  "copies)", s, shapes[s].rows, shapes[s].row, nslots, slot,
                  deferred ? "deferred" : "immediate");
        free(src[s]);
        free(dst[s]);
        free(ref[s]);
    }
    CHECK(f->ngets == 0 && f->ncopies == 0);
    CHECK_MSG(sg.sealed > (uint64_t)nslots, "%llu slots sealed: the ring never went round",
              (unsigned long long)sg.sealed);
    CHECK(f->marks == (int)sg.sealed);
    wsync_stage_free(&sg);
    free(mem);
    free(f);
}

static void test_ring_immediate(void)
{
    roundtrip(0, 3, 512);
}

static void test_ring_deferred(void)
{
    roundtrip(1, 3, 512);
    roundtrip(1, 1, 640);   /* one slot: every take after a seal waits for its copies */
}

static void test_errors(void)
{
    fake_t *f = calloc(1, sizeof(*f));
    uint8_t buf[256], *slots[2] = {buf, buf + 128}, *p = NULL;
    wsync_stage_copier_t cp = {fake_copy, fake_mark, fake_wait, f};
    wsync_stage_t sg;

    CHECK_ST(wsync_stage_init(&sg, slots, 0, 128, &cp, fake_land, f), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("0 slots of 128 bytes");
    CHECK_OK(wsync_stage_init(&sg, slots, 2, 128, &cp, fake_land, f));
    CHECK_ST(wsync_stage_take(&sg, 129, 0, &p), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("129 bytes asked of slots of 128");
    CHECK_ST(wsync_stage_take(&sg, 0, 0, &p), WSYNC_ERR_INVALID);
    CHECK_OK(wsync_stage_take(&sg, 100, 0, &p));
    CHECK(p == buf);
    CHECK_ST(wsync_stage_move(&sg, p, 50, buf, 50, 50, 3), WSYNC_ERR_INTERNAL);
    CHECK_ERR_HAS("outside the 100 bytes taken");
    /* a failed land comes back from the take that sealed the slot, naming what failed */
    f->fail_land_at = 1;
    CHECK_ST(wsync_stage_take(&sg, 100, 0, &p), WSYNC_ERR_PEER_LOST);
    CHECK_ERR_HAS("fake: land 1 failed");
    wsync_stage_abandon(&sg, 0);
    CHECK(f->ncopies == 0);
    wsync_stage_free(&sg);
    free(f);
}

/* ---- spans: rows with small gaps read as one get each span (wsync_stage_rows) -------------- */

typedef struct {
    fake_t *f;
    const uint8_t *lo, *hi;          /* the source's bytes: a get outside them is a defect */
    int ngets;
    size_t lens[MAXQ];
} spans_net_t;

static wsync_status_t spans_get(void *arg, uint64_t from, uint8_t *dst, size_t len)
{
    spans_net_t *n = arg;
    const uint8_t *src = (const uint8_t *)(uintptr_t)from;
    if (src < n->lo || len > (size_t)(n->hi - src))
        return wsync_err(WSYNC_ERR_RANGE, "spans test: a get of %zu bytes at source offset %td "
                         "runs past the %td source bytes", len, src - n->lo, n->hi - n->lo);
    if (n->ngets < MAXQ)
        n->lens[n->ngets++] = len;
    post(n->f, dst, src, len);
    return WSYNC_OK;
}

typedef struct {
    size_t width, spitch, rows, dpitch;
    size_t gets;                     /* expected gets */
    size_t first_len;                /* expected length of the first get */
} span_case_t;

/* One column slice through a ring of one or more slots: the bytes equal a per-row memcpy, every
 * get stays inside the source (which ends where the last row ends), and the gets are as many and
 * as long as the rule says. */
static void span_case(const span_case_t *c, int nslots, size_t slot, size_t gap_max, int deferred)
{
    size_t sbytes = (c->rows - 1) * c->spitch + c->width, dbytes = c->rows * c->dpitch;
    uint8_t *src = malloc(sbytes), *dst = malloc(dbytes), *ref = malloc(dbytes);
    uint8_t *mem = malloc((size_t)nslots * slot), *slots[8];
    fake_t *f = calloc(1, sizeof(*f));
    spans_net_t *n = calloc(1, sizeof(*n));
    unsigned seed = 777u + (unsigned)c->spitch;
    wsync_stage_t sg;

    CHECK(src && dst && ref && mem && f && n);
    if (!(src && dst && ref && mem && f && n))
        return;
    for (size_t i = 0; i < sbytes; i++)
        src[i] = (uint8_t)((seed = seed * 1103515245u + 12345u) >> 16);
    memset(dst, 0xEE, dbytes);
    memset(ref, 0xEE, dbytes);
    for (size_t k = 0; k < c->rows; k++)
        memcpy(ref + k * c->dpitch, src + k * c->spitch, c->width);
    f->deferred = deferred;
    n->f = f;
    n->lo = src;
    n->hi = src + sbytes;
    for (int i = 0; i < nslots; i++)
        slots[i] = mem + (size_t)i * slot;
    wsync_stage_copier_t cp = {fake_copy, fake_mark, fake_wait, f};
    CHECK_OK(wsync_stage_init(&sg, slots, nslots, slot, &cp, fake_land, f));
    CHECK_OK(wsync_stage_rows(&sg, spans_get, n, (uint64_t)(uintptr_t)src, c->spitch, c->width,
                              c->rows, dst, c->dpitch, gap_max, 0));
    CHECK_OK(wsync_stage_finish(&sg, 0));
    CHECK_MSG(memcmp(dst, ref, dbytes) == 0, "%zu rows of %zu bytes, %zu apart (gap limit %zu, "
              "%d slots of %zu): the bytes differ from a copy row by row", c->rows, c->width,
              c->spitch, gap_max, nslots, slot);
    CHECK_MSG((size_t)n->ngets == c->gets && n->lens[0] == c->first_len,
              "%zu rows of %zu bytes, %zu apart (gap limit %zu, slot %zu): %d gets, the first "
              "of %zu bytes; expected %zu, the first of %zu", c->rows, c->width, c->spitch,
              gap_max, slot, n->ngets, n->lens[0], c->gets, c->first_len);
    wsync_stage_free(&sg);
    free(src);
    free(dst);
    free(ref);
    free(mem);
    free(f);
    free(n);
}

static void test_span_rule(void)
{
    CHECK(wsync_stage_spans(100, 100, 0) == 1);       /* contiguous rows always span */
    CHECK(wsync_stage_spans(100, 164, 64) == 1);      /* a gap of exactly the limit */
    CHECK(wsync_stage_spans(100, 165, 64) == 0);      /* one byte more */
    CHECK(wsync_stage_spans(100, 99, 64) == 0);       /* overlapping rows: never */
    CHECK(wsync_stage_span_rows(100, 164, 10, 100) == 1);
    CHECK(wsync_stage_span_rows(100, 164, 10, 99) == 0);
    CHECK(wsync_stage_span_rows(100, 164, 10, 427) == 2);    /* 164 + 100 + 163 */
    CHECK(wsync_stage_span_rows(100, 164, 10, 428) == 3);    /* 2 * 164 + 100 exactly */
    CHECK(wsync_stage_span_rows(100, 164, 2, 4096) == 2);    /* no more rows than there are */
    CHECK(wsync_stage_span_rows(100, 164, 0, 4096) == 0);
}

static void test_spans(void)
{
    /* gap limit 64 bytes, slots of 1024 */
    const span_case_t cases[] = {
        /* TP-2 of a row shard: gap = width = 64, at the limit: spans of (1024 - 64) / 128 + 1
         * = 8 rows (960 bytes), 20 rows in 3 gets, the last ending at the last row's end */
        {64, 128, 20, 64, 3, 960},
        /* gap 65, one byte over: one get per row */
        {64, 129, 20, 64, 20, 64},
        /* a single row: one get of its width, pitch ignored */
        {64, 4096, 1, 64, 1, 64},
        /* contiguous rows into a pitched target: 1024 / 100 = 10 rows a get */
        {100, 100, 25, 300, 3, 1000},
        /* spans that fill their slot exactly: 15 x 68 + 4 = 1024, 40 rows as 16 + 16 + 8 */
        {4, 68, 40, 4, 3, 1024},
        /* rows longer than a slot, small gap: slot-sized pieces, no spans (3 rows x 2 pieces) */
        {1500, 1520, 3, 1500, 6, 1024},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        span_case(&cases[i], 2, 1024, 64, 0);
        span_case(&cases[i], 2, 1024, 64, 1);
        span_case(&cases[i], 1, 1024, 64, 1);
    }
    /* gap limit 0: a column slice goes row by row, contiguous rows still as spans */
    const span_case_t off = {64, 128, 20, 64, 20, 64}, contiguous = {100, 100, 25, 300, 3, 1000};
    span_case(&off, 2, 1024, 0, 1);
    span_case(&contiguous, 2, 1024, 0, 1);
}

static void test_span_errors(void)
{
    fake_t *f = calloc(1, sizeof(*f));
    uint8_t buf[256], *slots[1] = {buf}, src[64], dst[64];
    spans_net_t *n = calloc(1, sizeof(*n));
    wsync_stage_copier_t cp = {fake_copy, fake_mark, fake_wait, f};
    wsync_stage_t sg;

    n->f = f;
    n->lo = src;
    n->hi = src + sizeof(src);
    CHECK_OK(wsync_stage_init(&sg, slots, 1, sizeof(buf), &cp, fake_land, f));
    CHECK_ST(wsync_stage_rows(&sg, spans_get, n, (uint64_t)(uintptr_t)src, 8, 16, 2, dst, 16, 64,
                              0), WSYNC_ERR_INTERNAL);
    CHECK_ERR_HAS("rows of 16 bytes 8 bytes apart overlap");
    /* a get's failure comes back as it is */
    CHECK_ST(wsync_stage_rows(&sg, spans_get, n, (uint64_t)(uintptr_t)src, 48, 32, 2, dst, 32, 64,
                              0), WSYNC_ERR_RANGE);
    CHECK_ERR_HAS("a get of 80 bytes at source offset 0 runs past the 64 source bytes");
    wsync_stage_abandon(&sg, 0);
    wsync_stage_free(&sg);
    free(f);
    free(n);
}

int main(void)
{
    RUN(test_span_rule);
    RUN(test_spans);
    RUN(test_span_errors);
    RUN(test_ring_immediate);
    RUN(test_ring_deferred);
    RUN(test_errors);
    return check_summary();
}
