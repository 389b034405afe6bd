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

int main(void)
{
    RUN(test_ring_immediate);
    RUN(test_ring_deferred);
    RUN(test_errors);
    return check_summary();
}
