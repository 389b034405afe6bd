/* The store's readers' per-tensor FP8 targets (schemes/store_amax.h): their sets told to sender 0
 * at setup, and a set some chunk of which no sender packed read plain and quantized here whole. */
#include "schemes/store_fp8_tensor.h"

#include <stdlib.h>
#include <string.h>

#include "core/relay.h"
#include "core/status.h"
#include "core/util.h"
#include "reshard/exec.h"
#include "schemes/store_amax.h"
#include "schemes/wire_amax.h"

/* A count written in place, little-endian. */
static void put_count(uint8_t *p, uint32_t n)
{
    for (int j = 0; j < 4; j++, n >>= 8)
        p[j] = (uint8_t)n;
}

/* Our per-tensor targets' sets (their chunks, keyed: schemes/store_amax.h), told to sender 0,
 * which has every sender agree on their amaxes from a version on. */
wsync_status_t wsync_store_frx_sets(wsync_receiver_t *r, store_frx_t *f)
{
    const wsync_plan_t *plan = r->m.plan;
    wsync_amax_sets_t sets;
    store_amax_member_t *mem = NULL;
    uint8_t *seen = NULL;
    uint32_t nmem = 0;
    wsync_wbuf_t b;
    wsync_status_t rc = wsync_amax_sets_build(plan, &sets);

    if (rc != WSYNC_OK || sets.nsets == 0)
        return rc;
    f->nsets = sets.nsets;
    f->ckey = calloc(plan->nchunks, sizeof(*f->ckey));
    f->cset = malloc((size_t)plan->nchunks * sizeof(*f->cset));
    f->set_plain = calloc(sets.nsets, 1);
    mem = malloc((size_t)(f->hi - f->lo + 1) * sizeof(*mem));
    seen = calloc(plan->nchunks, 1);
    wsync_wbuf_init(&b);
    if (f->ckey == NULL || f->cset == NULL || f->set_plain == NULL || mem == NULL || seen == NULL) {
        rc = wsync_err(WSYNC_ERR_NOMEM, "store: no memory for %u per-tensor sets", sets.nsets);
        goto out;
    }
    memcpy(f->cset, sets.set, (size_t)plan->nchunks * sizeof(*f->cset));
    /* each set's segments, by a counting sort on the set: a set's reads and its description walk
     * only its own, not all of ours per set (44k MoE sets x 200k segments otherwise) */
    f->set_off = calloc((size_t)sets.nsets + 1u, sizeof(*f->set_off));
    f->set_seg = malloc((size_t)(f->hi - f->lo + 1) * sizeof(*f->set_seg));
    if (f->set_off == NULL || f->set_seg == NULL) {
        rc = wsync_err(WSYNC_ERR_NOMEM, "store: no memory for %u per-tensor sets", sets.nsets);
        goto out;
    }
    for (uint32_t i = f->lo; i < f->hi; i++)
        if (sets.set[r->m.segs[i].chunk] < sets.nsets)
            f->set_off[sets.set[r->m.segs[i].chunk] + 1]++;
    for (uint32_t k = 0; k < sets.nsets; k++)
        f->set_off[k + 1] += f->set_off[k];
    for (uint32_t i = f->lo; i < f->hi; i++) {
        uint32_t k = sets.set[r->m.segs[i].chunk];
        if (k < sets.nsets)   /* set_off[k] ends at set k + 1's start: moved back below */
            f->set_seg[f->set_off[k]++] = i;
    }
    for (uint32_t k = sets.nsets; k > 0; k--)
        f->set_off[k] = f->set_off[k - 1];
    f->set_off[0] = 0;
    uint32_t nput = 0;
    wsync_put_u32(&b, 0);   /* the count, set below */
    for (uint32_t k = 0; k < sets.nsets && rc == WSYNC_OK; k++) {
        const wsync_wire_rule_t *rule = NULL;
        nmem = 0;
        for (uint32_t j = f->set_off[k]; j < f->set_off[k + 1]; j++) {
            uint32_t ch = r->m.segs[f->set_seg[j]].chunk;
            const wsync_chunk_t *c = &plan->chunks[ch];
            if (seen[ch])
                continue;
            seen[ch] = 1;
            rule = &plan->rules[c->rule - 1];
            mem[nmem++] = (store_amax_member_t){c->sender, c->shard, c->src};
        }
        if (nmem == 0)
            continue;   /* another receiver's (a plan of the whole group) */
        uint64_t key = wsync_store_amax_key(rule, mem, nmem);
        for (uint32_t j = f->set_off[k]; j < f->set_off[k + 1]; j++)
            f->ckey[r->m.segs[f->set_seg[j]].chunk] = key;
        if (b.len + 36u + (size_t)nmem * 40u > WSYNC_RELAY_MAX) {
            if (nput == 0) {
                rc = wsync_err(WSYNC_ERR_RANGE, "store: receiver %d: a per-tensor target of %u "
                               "chunks exceeds one relay", r->m.rank, nmem);
                break;
            }
            put_count(b.data, nput);
            rc = wsync_member_relay_send(&r->m, WSYNC_ROLE_SENDER, 0, STORE_AMAX_SETS_TAG, b.data,
                                         (uint32_t)b.len);
            b.len = 0;
            nput = 0;
            wsync_put_u32(&b, 0);
        }
        wsync_store_amax_put_set(&b, key, rule, mem, nmem);
        nput++;
    }
    if (rc == WSYNC_OK && b.err)
        rc = wsync_err(WSYNC_ERR_NOMEM, "store: no memory for per-tensor sets");
    if (rc == WSYNC_OK && nput > 0) {
        put_count(b.data, nput);
        rc = wsync_member_relay_send(&r->m, WSYNC_ROLE_SENDER, 0, STORE_AMAX_SETS_TAG, b.data,
                                     (uint32_t)b.len);
    }
out:
    wsync_wbuf_free(&b);
    wsync_amax_sets_free(&sets);
    free(mem);
    free(seen);
    return rc;
}

/* Per-tensor set k, some chunk of which no table holds: every chunk of it read plain, the
 * target's amax over them all, each quantized with it (the bytes its senders would have sent). */
wsync_status_t wsync_store_frx_tensor_plain(wsync_receiver_t *r, store_frx_t *f,
                                            const wsync_store_io_t *io,
                                            wsync_store_verified_fn verified, void *varg,
                                            const wsync_dir_entry_t *e, uint64_t v, uint32_t k,
                                            void *stream, uint64_t *bytes)
{
    const wsync_plan_t *plan = r->m.plan;
    uint64_t need = 0, used = 0;
    float amax = 0.0f;
    wsync_status_t rc;

    /* set k's segments only (set_seg, ascending as before) */
    for (uint32_t j = f->set_off[k]; j < f->set_off[k + 1]; j++) {
        const wsync_chunk_t *c = &plan->chunks[r->m.segs[f->set_seg[j]].chunk];
        if (c->rule != 0)
            need += wsync_store_frx_align(wsync_chunk_wire_bytes(c)) +
                    wsync_store_frx_align(c->src.rows * c->src.cols * wsync_dtype_size(c->dtype));
    }
    if ((rc = wsync_store_frx_batch_room(r, f, need)) != WSYNC_OK)
        return rc;
    f->nitems = 0;
    for (uint32_t j = f->set_off[k]; j < f->set_off[k + 1] && rc == WSYNC_OK; j++) {
        uint32_t i = f->set_seg[j];
        const wsync_chunk_t *c = &plan->chunks[r->m.segs[i].chunk];
        if (c->rule == 0)
            continue;
        uint64_t plain = c->src.rows * c->src.cols * wsync_dtype_size(c->dtype);
        store_frx_item_t *it = &f->items[f->nitems++];
        *it = (store_frx_item_t){i, used, used + wsync_store_frx_align(wsync_chunk_wire_bytes(c)), 0, 0.0f};
        rc = wsync_store_frx_get_plain(r, io, verified, varg, &e[c->sender], v, i, c, f->buf + it->plain);
        used += wsync_store_frx_align(wsync_chunk_wire_bytes(c)) + wsync_store_frx_align(plain);
        *bytes += plain;
        f->nlocal++;
    }
    if (rc == WSYNC_OK)
        rc = io->flush(io->arg);
    for (uint32_t j = 0; j < f->nitems && rc == WSYNC_OK; j++) {
        const wsync_segment_t *sg = &r->m.segs[f->items[j].seg];
        wsync_chunk_t pc = plan->chunks[sg->chunk];
        float a = 0.0f;
        pc.src = (wsync_region_t){0, pc.src.cols, pc.src.rows, pc.src.cols};
        rc = wsync_exec_amax_wire(plan, &pc, r->targets[sg->target].pieces[sg->piece].param.name,
                                  f->buf + f->items[j].plain, &a);
        amax = WSYNC_MAX(amax, a);
    }
    for (uint32_t j = 0; j < f->nitems; j++)
        f->items[j].amax = amax;
    if (rc != WSYNC_OK) {
        f->nitems = 0;
        return rc;
    }
    return wsync_store_frx_finish_batch(r, f, io, stream);
}
