/* Per-tensor FP8 on the wire: the senders agree on each per-tensor target's amax every version
 * (schemes/wire_amax.h, docs/fp8_wire.md section 5). */
#include "schemes/wire_amax.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/relay.h"
#include "core/status.h"
#include "core/util.h"

#define AMAX_TAG 0x414d5831u         /* relay tag "AMX1": partial amaxes, or the agreed ones */
#define AMAX_HDR 12u                 /* u64 version, u32 set count */

static uint32_t uf_find(uint32_t *up, uint32_t x)
{
    while (up[x] != x) {
        up[x] = up[up[x]];
        x = up[x];
    }
    return x;
}

static int tensor_chunk(const wsync_plan_t *plan, uint32_t c)
{
    uint32_t r = plan->chunks[c].rule;
    return r != 0 && r <= plan->nrules && wsync_wire_rule_needs_amax(&plan->rules[r - 1]);
}

void wsync_amax_sets_free(wsync_amax_sets_t *sets)
{
    if (sets == NULL)
        return;
    free(sets->set);
    free(sets->first_seg);
    free(sets->holds);
    memset(sets, 0, sizeof(*sets));
}

wsync_status_t wsync_amax_sets_build(const wsync_plan_t *plan, wsync_amax_sets_t *out)
{
    uint32_t nc = plan->nchunks, nr = plan->nreceivers, *up = NULL, *tmax = NULL, *first = NULL;
    size_t *base = NULL, nslots = 0, cap = 0;
    wsync_segment_t *segs = NULL;    /* one receiver's */
    wsync_amax_sets_t s = {0};
    wsync_status_t st = WSYNC_OK;
    int any = 0;

    memset(out, 0, sizeof(*out));
    for (uint32_t c = 0; c < nc && !any; c++)
        any = tensor_chunk(plan, c);
    if (!any)
        return WSYNC_OK;
    up = malloc((size_t)nc * sizeof(*up));
    tmax = calloc((size_t)nr + 1, sizeof(*tmax));
    base = calloc((size_t)nr + 1, sizeof(*base));
    s.set = malloc((size_t)nc * sizeof(*s.set));
    s.holds = calloc(plan->nsenders, 1);
    if (up == NULL || tmax == NULL || base == NULL || s.set == NULL || s.holds == NULL)
        goto nomem;
    /* the chunks of one (receiver, target) are one set: union-find over them, through a table
     * of each such target's first chunk (targets numbered per receiver) */
    for (uint32_t c = 0; c < nc; c++)
        up[c] = c;
    /* every receiver's segments, one receiver at a time (the plan holds them as lists) */
    for (uint32_t r = 0; r < nr; r++) {
        uint32_t n = 0;
        if (wsync_plan_segments_into(plan, r, &segs, &cap, &n) != WSYNC_OK)
            goto nomem;
        for (uint32_t i = 0; i < n; i++) {
            const wsync_segment_t *sg = &segs[i];
            if (tensor_chunk(plan, sg->chunk) && sg->target + 1 > tmax[r])
                tmax[r] = sg->target + 1;
        }
    }
    for (uint32_t r = 0; r < nr; r++) {
        base[r] = nslots;
        nslots += tmax[r];
    }
    first = malloc((nslots ? nslots : 1) * sizeof(*first));
    if (first == NULL)
        goto nomem;
    for (size_t k = 0; k < nslots; k++)
        first[k] = WSYNC_AMAX_NONE;
    for (uint32_t r = 0; r < nr; r++) {
        uint32_t n = 0;
        if (wsync_plan_segments_into(plan, r, &segs, &cap, &n) != WSYNC_OK)
            goto nomem;
        for (uint32_t i = 0; i < n; i++) {
            const wsync_segment_t *sg = &segs[i];
            uint32_t *f;
            if (!tensor_chunk(plan, sg->chunk))
                continue;
            f = &first[base[r] + sg->target];
            if (*f == WSYNC_AMAX_NONE) {
                *f = sg->chunk;
            } else {
                uint32_t a = uf_find(up, *f), b = uf_find(up, sg->chunk);
                if (a != b)
                    up[b] = a;
            }
        }
    }
    /* sets numbered in order of their first chunk (the root's entry is its set's number from
     * the first chunk of the set on) */
    for (uint32_t c = 0; c < nc; c++)
        s.set[c] = WSYNC_AMAX_NONE;
    for (uint32_t c = 0; c < nc; c++) {
        uint32_t root;
        if (!tensor_chunk(plan, c))
            continue;
        root = uf_find(up, c);
        if (s.set[root] == WSYNC_AMAX_NONE)
            s.set[root] = s.nsets++;
        s.set[c] = s.set[root];
        if (plan->chunks[c].sender < plan->nsenders)
            s.holds[plan->chunks[c].sender] = 1;
    }
    s.first_seg = malloc((s.nsets ? s.nsets : 1) * sizeof(*s.first_seg));
    if (s.first_seg == NULL)
        goto nomem;
    for (uint32_t k = 0; k < s.nsets; k++)
        s.first_seg[k] = UINT32_MAX;
    /* numbered in the plan's order: every receiver's segments before the next one's */
    for (uint32_t r = 0, at = 0; r < nr; r++) {
        uint32_t n = 0;
        if (wsync_plan_segments_into(plan, r, &segs, &cap, &n) != WSYNC_OK)
            goto nomem;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t k = s.set[segs[i].chunk];
            if (k != WSYNC_AMAX_NONE && s.first_seg[k] == UINT32_MAX)
                s.first_seg[k] = at + i;
        }
        at += n;
    }
    *out = s;
    goto out;
nomem:
    st = wsync_err(WSYNC_ERR_NOMEM, "FP8 per-tensor sets of %u chunks", nc);
    wsync_amax_sets_free(&s);
out:
    free(up);
    free(tmax);
    free(base);
    free(first);
    free(segs);
    return st;
}

uint32_t wsync_amax_msg_bytes(uint32_t nsets)
{
    return AMAX_HDR + 4u * nsets;
}

void wsync_amax_msg_encode(uint64_t version, uint32_t nsets, const float *amax, uint8_t *buf)
{
    memcpy(buf, &version, 8);
    memcpy(buf + 8, &nsets, 4);
    memcpy(buf + AMAX_HDR, amax, (size_t)nsets * 4u);
}

wsync_status_t wsync_amax_msg_reduce(const uint8_t *buf, uint32_t len, uint64_t version,
                                     uint32_t nsets, const char *from, float *acc)
{
    uint64_t v;
    uint32_t n;

    if (len < AMAX_HDR)
        return wsync_err(WSYNC_ERR_PROTOCOL, "FP8 per-tensor amax from %s: %u bytes", from, len);
    memcpy(&v, buf, 8);
    memcpy(&n, buf + 8, 4);
    if (v != version || n != nsets || len != wsync_amax_msg_bytes(nsets))
        return wsync_err(WSYNC_ERR_PROTOCOL, "FP8 per-tensor amax from %s: version %" PRIu64
                         ", %u sets in %u bytes; expected version %" PRIu64 ", %u sets", from,
                         v, n, len, version, nsets);
    for (uint32_t k = 0; k < nsets; k++) {
        float a;
        memcpy(&a, buf + AMAX_HDR + 4u * k, 4);
        if (!(a >= 0.0f) || a > 3.4028235e38f)
            return wsync_err(WSYNC_ERR_PROTOCOL, "FP8 per-tensor amax from %s: set %u's amax %g "
                             "is not finite and >= 0", from, k, (double)a);
        acc[k] = a > acc[k] ? a : acc[k];
    }
    return WSYNC_OK;
}

/* The version of a relay's payload (0 when too short: never a version pushed). */
static uint64_t msg_version(const wsync_relay_t *rl)
{
    uint64_t v = 0;
    if (rl->len >= 8)
        memcpy(&v, rl->data, 8);
    return v;
}

/* The next AMAX relay of this version from the sender `want` (-1: any sender), skipping those of
 * older versions (left by a version that failed). */
static wsync_status_t recv_amax(wsync_member_t *m, int rank, uint64_t version, int want,
                                int64_t deadline_ms, wsync_msg_t **msg, wsync_relay_t *rl)
{
    for (;;) {
        wsync_status_t st = wsync_member_relay_recv(m, deadline_ms, msg, rl);
        if (st != WSYNC_OK)
            return st;
        if (rl->tag == AMAX_TAG && rl->role == WSYNC_ROLE_SENDER && msg_version(rl) < version) {
            wsync_msg_free(*msg);
            continue;
        }
        if (rl->tag != AMAX_TAG || rl->role != WSYNC_ROLE_SENDER ||
            (want >= 0 && rl->rank != want)) {
            st = wsync_err(WSYNC_ERR_PROTOCOL, "sender %d: version %" PRIu64 ": relay of tag "
                           "%08x from %s %d where FP8 per-tensor amaxes were due", rank, version,
                           rl->tag, rl->role == WSYNC_ROLE_SENDER ? "sender" : "receiver",
                           rl->rank);
            wsync_msg_free(*msg);
            return st;
        }
        return WSYNC_OK;
    }
}

/* Sender 0: every holder's partials, their max, sent back to each. */
static wsync_status_t reduce_at_root(wsync_member_t *m, const wsync_amax_sets_t *sets,
                                     uint32_t nsenders, uint64_t version, int64_t deadline_ms,
                                     float *acc, uint8_t *buf)
{
    uint8_t *heard = calloc(nsenders, 1);
    uint32_t due = 0, bytes = wsync_amax_msg_bytes(sets->nsets);
    wsync_status_t st = WSYNC_OK;

    if (heard == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "FP8 per-tensor amax: %u senders", nsenders);
    for (uint32_t s = 1; s < nsenders; s++)
        due += sets->holds[s];
    while (due > 0 && st == WSYNC_OK) {
        wsync_msg_t *msg = NULL;
        wsync_relay_t rl;
        char from[32];
        st = recv_amax(m, 0, version, -1, deadline_ms, &msg, &rl);
        if (st == WSYNC_ERR_TIMEOUT) {
            char who[256] = "";
            size_t n = 0;
            for (uint32_t s = 1; s < nsenders && n + 16 < sizeof(who); s++)
                if (sets->holds[s] && !heard[s])
                    n += (size_t)snprintf(who + n, sizeof(who) - n, "%s%u", n ? ", " : "", s);
            st = wsync_err(WSYNC_ERR_TIMEOUT, "sender 0: version %" PRIu64 ": no FP8 per-tensor "
                           "amax from sender %s by the version's deadline", version, who);
            break;
        }
        if (st != WSYNC_OK)
            break;
        snprintf(from, sizeof(from), "sender %d", (int)rl.rank);
        if (rl.rank <= 0 || (uint32_t)rl.rank >= nsenders || !sets->holds[rl.rank] ||
            heard[rl.rank])
            st = wsync_err(WSYNC_ERR_PROTOCOL, "sender 0: version %" PRIu64 ": FP8 per-tensor "
                           "amax from %s, which owes none", version, from);
        else
            st = wsync_amax_msg_reduce(rl.data, rl.len, version, sets->nsets, from, acc);
        if (st == WSYNC_OK) {
            heard[rl.rank] = 1;
            due--;
        }
        wsync_msg_free(msg);
    }
    free(heard);
    if (st != WSYNC_OK)
        return st;
    wsync_amax_msg_encode(version, sets->nsets, acc, buf);
    for (uint32_t s = 1; s < nsenders && st == WSYNC_OK; s++)
        if (sets->holds[s])
            st = wsync_member_relay_send(m, WSYNC_ROLE_SENDER, (int)s, AMAX_TAG, buf, bytes);
    return st;
}

wsync_status_t wsync_amax_agree(wsync_member_t *m, int rank, const wsync_amax_sets_t *sets,
                                uint64_t version, int64_t deadline_ms, float *amax)
{
    uint32_t nsenders = m->plan->nsenders, bytes;
    uint8_t *buf;
    float *acc;
    wsync_status_t st;

    if (sets->nsets == 0)
        return WSYNC_OK;
    if (rank != 0 && ((uint32_t)rank >= nsenders || !sets->holds[rank]))
        return WSYNC_OK;             /* nothing to send, nothing to pack */
    bytes = wsync_amax_msg_bytes(sets->nsets);
    if (bytes > WSYNC_RELAY_MAX || sets->nsets > (WSYNC_RELAY_MAX - AMAX_HDR) / 4u)
        return wsync_err(WSYNC_ERR_RANGE, "FP8 per-tensor amax: %u targets exceed one relay",
                         sets->nsets);
    buf = malloc(bytes);
    acc = malloc((size_t)sets->nsets * sizeof(*acc));
    if (buf == NULL || acc == NULL) {
        free(buf);
        free(acc);
        return wsync_err(WSYNC_ERR_NOMEM, "FP8 per-tensor amax: %u targets", sets->nsets);
    }
    memcpy(acc, amax, (size_t)sets->nsets * sizeof(*acc));
    if (rank == 0) {
        st = reduce_at_root(m, sets, nsenders, version, deadline_ms, acc, buf);
    } else {
        wsync_amax_msg_encode(version, sets->nsets, acc, buf);
        st = wsync_member_relay_send(m, WSYNC_ROLE_SENDER, 0, AMAX_TAG, buf, bytes);
        if (st == WSYNC_OK) {
            wsync_msg_t *msg = NULL;
            wsync_relay_t rl;
            st = recv_amax(m, rank, version, 0, deadline_ms, &msg, &rl);
            if (st == WSYNC_ERR_TIMEOUT)
                st = wsync_err(st, "sender %d: version %" PRIu64 ": no FP8 per-tensor amax from "
                               "sender 0 by the version's deadline", rank, version);
            if (st == WSYNC_OK) {
                /* the agreed max replaces ours: start from 0 so that a malformed reply is
                 * caught, not hidden by our own partials */
                memset(acc, 0, (size_t)sets->nsets * sizeof(*acc));
                st = wsync_amax_msg_reduce(rl.data, rl.len, version, sets->nsets, "sender 0",
                                           acc);
                wsync_msg_free(msg);
            }
        }
    }
    if (st == WSYNC_OK)
        memcpy(amax, acc, (size_t)sets->nsets * sizeof(*acc));
    free(buf);
    free(acc);
    return st;
}
