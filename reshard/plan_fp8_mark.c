/* Pass 2b of the plan compiler (plan.c), FP8 on the wire: which logical chunks their senders
 * quantize (lchunk_t.rule) and the distinct rules those name (compile_t.rules). What the pass
 * asks of one target or one region is in plan_quant.c (docs/fp8_wire.md). */
#include "reshard/plan.h"
#include "reshard/plan_internal.h"

#include "core/status.h"

#include <stdlib.h>

#define RULE_BAD UINT32_MAX

/* The rule's number in c->rules, plus one (added when new); 0 when out of memory. */
static uint32_t intern_rule(compile_t *c, const wsync_wire_rule_t *r)
{
    for (uint32_t k = 0; k < c->nrules; k++)
        if (wsync_wire_rule_eq(&c->rules[k], r))
            return k + 1;
    if (c->nrules >= UINT16_MAX)
        return 0;                    /* so many distinct rules: the rest travel plain */
    if (c->nrules == c->cap_rules) {
        uint32_t cap = c->cap_rules ? 2 * c->cap_rules : 4;
        wsync_wire_rule_t *p = realloc(c->rules, cap * sizeof(*p));
        if (p == NULL)
            return 0;
        c->rules = p;
        c->cap_rules = cap;
    }
    c->rules[c->nrules++] = *r;
    return c->nrules;
}

static uint32_t uf_find(uint32_t *up, uint32_t x)
{
    while (up[x] != x) {
        up[x] = up[up[x]];
        x = up[x];
    }
    return x;
}

/* Per-tensor targets (one scale from the amax over every chunk of the target): a chunk carries
 * one scale, so every target it feeds must be made of exactly the same chunks (replicas of one
 * slice do; a chunk shared by two different slices would need two scales). Chunks of targets
 * still taking a per-tensor rule are joined into sets (union-find); a target with fewer distinct
 * chunks than its set is dropped (trule 0). Returns how many were dropped, or -1 when out of
 * memory. */
static int tensor_closed(compile_t *c, uint32_t *trule)
{
    size_t nl = c->nlchunks;
    uint32_t *up = NULL, *count = NULL, *stamp = NULL;
    int any = 0, dropped = 0;

    for (size_t i = 0; i < c->ntargets && !any; i++)
        any = trule[i] != 0 && wsync_wire_rule_needs_amax(&c->rules[trule[i] - 1]);
    if (!any)
        return 0;
    up = malloc(nl * sizeof(*up));
    count = calloc(nl, sizeof(*count));
    stamp = calloc(nl, sizeof(*stamp));
    if (up == NULL || count == NULL || stamp == NULL) {
        dropped = -1;
        goto out;
    }
    for (size_t j = 0; j < nl; j++)
        up[j] = (uint32_t)j;
    for (size_t i = 0; i < c->ntargets; i++) {
        const tref_t *tr = &c->trefs[i];
        if (trule[i] == 0 || !wsync_wire_rule_needs_amax(&c->rules[trule[i] - 1]) || tr->nlseg == 0)
            continue;
        uint32_t a = uf_find(up, c->lsegs[tr->lseg0].lchunk);
        for (uint32_t k = 1; k < tr->nlseg; k++) {
            uint32_t b = uf_find(up, c->lsegs[tr->lseg0 + k].lchunk);
            if (b != a)
                up[b] = a;
        }
    }
    /* a set's size: its distinct chunks (stamp: the first target seen holding one) */
    for (size_t i = 0; i < c->ntargets; i++) {
        const tref_t *tr = &c->trefs[i];
        if (trule[i] == 0 || !wsync_wire_rule_needs_amax(&c->rules[trule[i] - 1]))
            continue;
        for (uint32_t k = 0; k < tr->nlseg; k++) {
            uint32_t l = c->lsegs[tr->lseg0 + k].lchunk;
            if (stamp[l] == 0) {
                stamp[l] = 1;
                count[uf_find(up, l)]++;
            }
        }
    }
    for (size_t i = 0; i < c->ntargets; i++) {
        const tref_t *tr = &c->trefs[i];
        uint32_t distinct = 0;
        if (trule[i] == 0 || !wsync_wire_rule_needs_amax(&c->rules[trule[i] - 1]) || tr->nlseg == 0)
            continue;
        for (uint32_t k = 0; k < tr->nlseg; k++) {      /* stamp 2 + i: seen for this target */
            uint32_t l = c->lsegs[tr->lseg0 + k].lchunk;
            if (stamp[l] != (uint32_t)(2 + i)) {
                stamp[l] = (uint32_t)(2 + i);
                distinct++;
            }
        }
        if (distinct != count[uf_find(up, c->lsegs[tr->lseg0].lchunk)]) {
            trule[i] = 0;
            dropped++;
        }
    }
out:
    free(up);
    free(count);
    free(stamp);
    return dropped;
}

/* Which logical chunks travel as FP8 (lchunk_t.rule). A target takes chunks quantized by their
 * senders only whole: when it may (wsync_wire_rule_of), every one of its chunks lands on whole
 * cells and fits a bucket by rows of cells, and no chunk of it also feeds a target that does not
 * take FP8 or takes another rule. Dropping a target can drop chunks it shares with another
 * target (fan-out replicas of different kinds), which can drop that one: repeated until nothing
 * changes (twice in practice). Per-tensor targets (c->fp8_tensor) also need their chunk sets
 * closed (tensor_closed). */
wsync_status_t wsync_plan_mark_wire(compile_t *c)
{
    uint32_t *trule;
    size_t n = c->ntargets;
    int changed = 1;

    if (!c->fp8_wire || n == 0)
        return WSYNC_OK;
    trule = calloc(n, sizeof(*trule));
    if (trule == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "plan: %zu targets", n);
    for (size_t i = 0; i < n; i++) {
        const tref_t *tr = &c->trefs[i];
        wsync_wire_rule_t r;
        int ok;
        if (!wsync_wire_rule_of(tr->desc, &r) ||
            (wsync_wire_rule_needs_amax(&r) && !c->fp8_tensor))
            continue;
        ok = 1;
        for (uint32_t k = 0; k < tr->nlseg && ok; k++) {
            const lseg_t *ls = &c->lsegs[tr->lseg0 + k];
            const lchunk_t *l = &c->lchunks[ls->lchunk];
            ok = wsync_wire_region_whole(&r, tr->desc, ls->dst_off, ls->dst_pitch, l->src.rows,
                                         l->src.cols) &&
                 wsync_wire_cellrow_fits(&r, l->src.cols, c->bucket_bytes);
        }
        if (ok && (trule[i] = intern_rule(c, &r)) == 0 && c->nrules < UINT16_MAX) {
            free(trule);
            return wsync_err(WSYNC_ERR_NOMEM, "plan: FP8 rules");
        }
    }
    if (c->nrules == 0) {            /* no target may take FP8: every chunk travels plain,
                                        without walking every target's segments again */
        for (size_t j = 0; j < c->nlchunks; j++)
            c->lchunks[j].rule = 0;
        free(trule);
        return WSYNC_OK;
    }
    while (changed) {
        int dropped = tensor_closed(c, trule);
        if (dropped < 0) {
            free(trule);
            return wsync_err(WSYNC_ERR_NOMEM, "plan: FP8 per-tensor sets of %zu chunks",
                             c->nlchunks);
        }
        changed = 0;
        for (size_t j = 0; j < c->nlchunks; j++)
            c->lchunks[j].rule = 0;
        for (size_t i = 0; i < n; i++) {
            const tref_t *tr = &c->trefs[i];
            for (uint32_t k = 0; k < tr->nlseg; k++) {
                lchunk_t *l = &c->lchunks[c->lsegs[tr->lseg0 + k].lchunk];
                if (trule[i] == 0)
                    l->rule = RULE_BAD;
                else if (l->rule == 0)
                    l->rule = trule[i];
                else if (l->rule != trule[i])
                    l->rule = RULE_BAD;
            }
        }
        for (size_t i = 0; i < n; i++) {
            const tref_t *tr = &c->trefs[i];
            for (uint32_t k = 0; k < tr->nlseg && trule[i] != 0; k++)
                if (c->lchunks[c->lsegs[tr->lseg0 + k].lchunk].rule == RULE_BAD) {
                    trule[i] = 0;
                    changed = 1;
                }
        }
    }
    for (size_t j = 0; j < c->nlchunks; j++)
        if (c->lchunks[j].rule == RULE_BAD)
            c->lchunks[j].rule = 0;
    free(trule);
    return WSYNC_OK;
}
