/* The store's staging ring (see store_stage.h). */
#include "schemes/store_stage.h"

#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "core/util.h"

wsync_status_t wsync_stage_init(wsync_stage_t *sg, uint8_t *const *slots, int nslots,
                                size_t slot_bytes, const wsync_stage_copier_t *cp,
                                wsync_stage_land_fn land, void *land_arg)
{
    if (sg == NULL || slots == NULL || cp == NULL || cp->copy == NULL || cp->mark == NULL ||
        cp->wait == NULL || land == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "store stage: NULL argument");
    if (nslots < 1 || slot_bytes == 0)
        return wsync_err(WSYNC_ERR_INVALID, "store stage: %d slots of %zu bytes (needs at least "
                         "one slot of at least one byte)", nslots, slot_bytes);
    for (int i = 0; i < nslots; i++)
        if (slots[i] == NULL)
            return wsync_err(WSYNC_ERR_INVALID, "store stage: slot %d of %d is NULL", i, nslots);
    uint8_t *busy = calloc((size_t)nslots, 1);
    if (busy == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store stage: no memory");
    memset(sg, 0, sizeof(*sg));
    sg->slots = slots;
    sg->nslots = nslots;
    sg->slot_bytes = slot_bytes;
    sg->cp = *cp;
    sg->land = land;
    sg->land_arg = land_arg;
    sg->busy = busy;
    return WSYNC_OK;
}

void wsync_stage_free(wsync_stage_t *sg)
{
    if (sg == NULL)
        return;
    free(sg->busy);
    free(sg->moves);
    memset(sg, 0, sizeof(*sg));
}

/* The current slot's gets landed: start its moves, and mark them for the slot's next user. */
static wsync_status_t seal(wsync_stage_t *sg)
{
    wsync_status_t rc;

    if (sg->used == 0 && sg->nmoves == 0)
        return WSYNC_OK;
    if ((rc = sg->land(sg->land_arg)) != WSYNC_OK)
        return rc;
    for (size_t i = 0; i < sg->nmoves; i++) {
        const wsync_stage_move_t *m = &sg->moves[i];
        rc = sg->cp.copy(sg->cp.arg, sg->cur, m->dst, m->dpitch, m->src, m->spitch, m->width,
                         m->rows);
        if (rc != WSYNC_OK)
            return rc;
    }
    /* marked even when nothing was copied, so that wait() always has something to wait for */
    if ((rc = sg->cp.mark(sg->cp.arg, sg->cur)) != WSYNC_OK)
        return rc;
    sg->busy[sg->cur] = 1;
    sg->nmoves = 0;
    sg->used = 0;
    sg->sealed++;
    return WSYNC_OK;
}

wsync_status_t wsync_stage_take(wsync_stage_t *sg, size_t bytes, int64_t deadline_ms,
                                uint8_t **out)
{
    wsync_status_t rc;

    if (bytes == 0 || bytes > sg->slot_bytes)
        return wsync_err(WSYNC_ERR_INVALID, "store stage: %zu bytes asked of slots of %zu",
                         bytes, sg->slot_bytes);
    if (sg->slot_bytes - sg->used < bytes) {
        if ((rc = seal(sg)) != WSYNC_OK)
            return rc;
        sg->cur = (sg->cur + 1) % sg->nslots;
    }
    if (sg->busy[sg->cur]) {
        /* its copies of last time read it still: the network must not overwrite it yet */
        if ((rc = sg->cp.wait(sg->cp.arg, sg->cur, deadline_ms)) != WSYNC_OK)
            return rc;
        sg->busy[sg->cur] = 0;
    }
    *out = sg->slots[sg->cur] + sg->used;
    sg->used += bytes;
    return WSYNC_OK;
}

wsync_status_t wsync_stage_move(wsync_stage_t *sg, uint8_t *src, size_t spitch, void *dst,
                                size_t dpitch, size_t width, size_t rows)
{
    uint8_t *slot = sg->slots[sg->cur];

    if (rows == 0 || width == 0)
        return WSYNC_OK;
    if (src < slot || spitch < width || (size_t)(src - slot) > sg->used ||
        (rows - 1) * spitch + width > sg->used - (size_t)(src - slot))
        return wsync_err(WSYNC_ERR_INTERNAL, "store stage: a move of %zu rows of %zu bytes "
                         "(pitch %zu) at slot offset %td lies outside the %zu bytes taken",
                         rows, width, spitch, src - slot, sg->used);
    if (sg->nmoves == sg->cap) {
        size_t cap = sg->cap ? sg->cap * 2 : 64;
        wsync_stage_move_t *m = realloc(sg->moves, cap * sizeof(*m));
        if (m == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "store stage: no memory for %zu moves", cap);
        sg->moves = m;
        sg->cap = cap;
    }
    sg->moves[sg->nmoves++] = (wsync_stage_move_t){src, spitch, dst, dpitch, width, rows};
    return WSYNC_OK;
}

int wsync_stage_spans(size_t width, size_t spitch, size_t gap_max)
{
    return spitch >= width && spitch - width <= gap_max;
}

uint64_t wsync_stage_span_rows(size_t width, size_t spitch, uint64_t rows, size_t room)
{
    if (rows == 0 || width == 0 || width > room)
        return 0;
    if (spitch == 0)                 /* only one row can be meant */
        return 1;
    return WSYNC_MIN(rows, 1 + (uint64_t)((room - width) / spitch));
}

wsync_status_t wsync_stage_rows(wsync_stage_t *sg, wsync_stage_get_fn get, void *get_arg,
                                uint64_t from, size_t spitch, size_t width, uint64_t rows,
                                uint8_t *dst, size_t dpitch, size_t gap_max, int64_t deadline_ms)
{
    size_t slot = sg->slot_bytes;
    wsync_status_t rc = WSYNC_OK;
    uint8_t *p;

    if (rows == 0 || width == 0)
        return WSYNC_OK;
    if (rows == 1)
        spitch = width;              /* a single row has no pitch to speak of */
    if (spitch < width)
        return wsync_err(WSYNC_ERR_INTERNAL, "store stage: rows of %zu bytes %zu bytes apart "
                         "overlap", width, spitch);
    if (width <= slot && wsync_stage_spans(width, spitch, gap_max)) {
        for (uint64_t r0 = 0; r0 < rows && rc == WSYNC_OK;) {
            uint64_t n = wsync_stage_span_rows(width, spitch, rows - r0, slot);
            size_t span = (size_t)(n - 1) * spitch + width;
            if ((rc = wsync_stage_take(sg, span, deadline_ms, &p)) == WSYNC_OK &&
                (rc = get(get_arg, from + r0 * spitch, p, span)) == WSYNC_OK)
                rc = wsync_stage_move(sg, p, spitch, dst + r0 * dpitch, dpitch, width, (size_t)n);
            r0 += n;
        }
        return rc;
    }
    if (width <= slot) {
        uint64_t per = slot / width;
        for (uint64_t r0 = 0; r0 < rows && rc == WSYNC_OK; r0 += per) {
            uint64_t n = WSYNC_MIN(per, rows - r0);
            if ((rc = wsync_stage_take(sg, (size_t)n * width, deadline_ms, &p)) != WSYNC_OK)
                return rc;
            for (uint64_t k = 0; k < n && rc == WSYNC_OK; k++)
                rc = get(get_arg, from + (r0 + k) * spitch, p + k * width, width);
            if (rc == WSYNC_OK)
                rc = wsync_stage_move(sg, p, width, dst + r0 * dpitch, dpitch, width, (size_t)n);
        }
        return rc;
    }
    for (uint64_t k = 0; k < rows && rc == WSYNC_OK; k++) {
        for (size_t o = 0; o < width && rc == WSYNC_OK; o += slot) {
            size_t n = WSYNC_MIN(slot, width - o);
            if ((rc = wsync_stage_take(sg, n, deadline_ms, &p)) == WSYNC_OK &&
                (rc = get(get_arg, from + k * spitch + o, p, n)) == WSYNC_OK)
                rc = wsync_stage_move(sg, p, n, dst + k * dpitch + o, n, n, 1);
        }
    }
    return rc;
}

wsync_status_t wsync_stage_finish(wsync_stage_t *sg, int64_t deadline_ms)
{
    wsync_status_t rc = seal(sg);

    if (rc != WSYNC_OK)
        return rc;
    for (int i = 0; i < sg->nslots; i++) {
        if (!sg->busy[i])
            continue;
        if ((rc = sg->cp.wait(sg->cp.arg, i, deadline_ms)) != WSYNC_OK)
            return rc;
        sg->busy[i] = 0;
    }
    sg->cur = (sg->cur + 1) % sg->nslots;
    return WSYNC_OK;
}

void wsync_stage_abandon(wsync_stage_t *sg, int64_t deadline_ms)
{
    sg->nmoves = 0;
    sg->used = 0;
    for (int i = 0; i < sg->nslots; i++) {
        if (sg->busy[i])
            (void)sg->cp.wait(sg->cp.arg, i, deadline_ms);
        sg->busy[i] = 0;
    }
}
