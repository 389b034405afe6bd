/* The nccl scheme's FP8 on the wire (issue 18, docs/fp8_wire.md), split out of schemes/nccl.c.
 * Sender: the quantization of each chunk that travels as FP8 codes and scales straight into its
 * place in its step's staging slot (set up once here, launched by nccl.c's pack), the check of a
 * step's NaN/Inf flags after its pack (a hit refuses the version once every step went out), and
 * the PACKED relay to the receivers that could otherwise finish a version first (nc_state_t says
 * why). Receiver: the unpack of codes into the target and of scales where it keeps them, their
 * checksums under WSYNC_VERIFY, and the wait for those relays. Declared in schemes/nccl_state.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/objects.h"
#include "core/relay.h"
#include "core/util.h"
#include "core/wire.h"
#include "kernels/device.h"
#include "kernels/kernels.h"
#include "reshard/exec.h"
#include "reshard/plan.h"
#include "schemes/nccl_state.h"

/* FP8 on the wire: which (sender, receiver) pairs need a PACKED relay (nc_state_t says why),
 * from the plan alone: every pair with bytes whose sender has FP8 chunks (step k moves bucket
 * k; the sender relays after its last step with FP8 chunks). */
wsync_status_t wsync_nccl_wire_packed_pairs(nc_state_t *st, const wsync_plan_t *plan)
{
    uint32_t ns = plan->nsenders, nr = plan->nreceivers;
    int64_t *lastq = malloc(((size_t)ns + 1) * sizeof(int64_t));
    int64_t *last = malloc(((size_t)(st->role == WSYNC_ROLE_SENDER ? nr : ns) + 1) *
                           sizeof(int64_t));
    wsync_status_t rc = WSYNC_OK;

    st->last_qstep = -1;
    if (lastq == NULL || last == NULL) {
        rc = wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory");
        goto out;
    }
    for (uint32_t s = 0; s < ns; s++)
        lastq[s] = -1;
    for (uint32_t c = 0; c < plan->nchunks; c++) {
        const wsync_chunk_t *ch = &plan->chunks[c];
        if (ch->rule != 0 && (int64_t)ch->bucket > lastq[ch->sender])
            lastq[ch->sender] = ch->bucket;
    }
    if (st->role == WSYNC_ROLE_SENDER) {
        st->last_qstep = lastq[st->rank];
        if (st->last_qstep < 0)
            goto out;
        for (uint32_t r = 0; r < nr; r++)
            last[r] = -1;
        {
            uint32_t c0 = 0, c1;         /* our chunks, by bucket: a list's last one of them */
            while (c0 < plan->nchunks && plan->chunks[c0].sender < st->rank)
                c0++;
            for (c1 = c0; c1 < plan->nchunks && plan->chunks[c1].sender == st->rank; c1++)
                ;
            for (uint32_t r = 0; r < nr; r++)
                for (uint32_t k = plan->ref0[r]; k < plan->ref0[r + 1]; k++) {
                    uint32_t a, b;
                    wsync_plan_list_range(plan, plan->refs[k].list, c0, c1, &a, &b);
                    if (b > a && (int64_t)plan->chunks[plan->lsegs[b - 1].chunk].bucket > last[r])
                        last[r] = plan->chunks[plan->lsegs[b - 1].chunk].bucket;
                }
        }
        st->packed_to = calloc((size_t)nr + 1, 1);
        if (st->packed_to == NULL) {
            rc = wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory");
            goto out;
        }
        for (uint32_t r = 0; r < nr; r++)
            st->packed_to[r] = last[r] >= 0;
    } else {
        for (uint32_t s = 0; s < ns; s++)
            last[s] = -1;
        for (uint32_t g = st->seg_lo; g < st->seg_hi; g++) {
            const wsync_chunk_t *c = &plan->chunks[st->m->segs[g].chunk];
            if ((int64_t)c->bucket > last[c->sender])
                last[c->sender] = c->bucket;
        }
        st->packed_from = calloc((size_t)ns + 1, 1);
        if (st->packed_from == NULL) {
            rc = wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory");
            goto out;
        }
        for (uint32_t s = 0; s < ns; s++)
            st->packed_from[s] = last[s] >= 0 && lastq[s] >= 0;
    }
out:
    free(lastq);
    free(last);
    return rc;
}

/* ================================================================================================
 * Sender
 * ============================================================================================== */

/* FP8 on the wire: the quantization of every chunk that travels as FP8 codes and scales into
 * its place in its step's slot (the steps' counts and quant0 set), and their workspaces, zeroed
 * once (quantize_many keeps them so while every value is finite). */
wsync_status_t wsync_nccl_wire_sender_bind(wsync_sender_t *s, nc_state_t *st)
{
    const wsync_plan_t *plan = s->m.plan;
    wsync_status_t rc;
    uint32_t q = 0;

    /* per-tensor sets, once: sender 0 takes part in every exchange, FP8 chunks of its own or
     * not; a sender's packs of them take the amax agreed each version */
    if ((rc = wsync_amax_tx_build(&st->amax_tx, s)) != WSYNC_OK)
        return rc;
    if (st->nquant == 0)
        return WSYNC_OK;
    st->quant = calloc(st->nquant, sizeof(*st->quant));
    st->qws = calloc(st->nquant, sizeof(*st->qws));
    st->qchunk = calloc(st->nquant, sizeof(*st->qchunk));
    st->qoff = calloc(st->nquant, sizeof(*st->qoff));
    if (st->quant == NULL || st->qws == NULL || st->qchunk == NULL || st->qoff == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory for %u FP8 chunks", st->nquant);
    if ((rc = wsync_dev_malloc((size_t)st->nquant * WSYNC_KQUANT_WS_BYTES, &st->qws_dev)) !=
            WSYNC_OK ||
        (rc = wsync_dev_memset_async(st->qws_dev, 0, (size_t)st->nquant * WSYNC_KQUANT_WS_BYTES,
                                     st->xstream)) != WSYNC_OK ||
        (rc = wsync_dev_stream_sync(st->xstream, wsync_deadline_in(s->m.timeout_ms),
                                    "nccl: zeroing the FP8 workspaces")) != WSYNC_OK)
        return rc;
    for (uint32_t k = 0; k < st->sched->nsteps; k++) {
        const nc_step_t *step = &st->steps[k];
        for (uint32_t i = 0; i < step->nmyops; i++) {
            const nc_myop_t *o = &st->myops[step->myop0 + i];
            const wsync_nccl_op_t *op = &st->sched->ops[o->op];
            if (!o->staged)
                continue;
            for (uint32_t j = 0; j < op->nitems; j++) {
                const wsync_nccl_item_t *it = &st->sched->items[op->item0 + j];
                wsync_chunk_t c = plan->chunks[it->chunk];
                if (c.rule == 0)
                    continue;
                c.bucket_off = o->soff + it->off;   /* its place in the op's staging */
                if (q >= step->quant0 + step->nquant || q < step->quant0)
                    return wsync_err(WSYNC_ERR_INTERNAL, "nccl: sender %d: step %u: FP8 chunk "
                                     "count", s->m.rank, k);
                rc = wsync_kernels_pack_wire_desc(plan, &c, s->shard_data[c.shard],
                                                  st->slot[k % NC_SLOTS], &st->quant[q]);
                if (rc != WSYNC_OK)
                    return rc;
                st->quant[q].name = s->shards[c.shard].param.name;
                st->qws[q] = (uint8_t *)st->qws_dev + (size_t)q * WSYNC_KQUANT_WS_BYTES;
                st->qchunk[q] = it->chunk;
                st->qoff[q] = c.bucket_off;
                q++;
            }
        }
    }
    if (q != st->nquant)
        return wsync_err(WSYNC_ERR_INTERNAL, "nccl: sender %d: %u of %u FP8 chunks laid out",
                         s->m.rank, q, st->nquant);
    for (uint32_t i = 0; i < st->nquant && st->amax_tx.sets.nsets > 0; i++) {
        uint32_t k = st->amax_tx.sets.set[st->qchunk[i]];
        if (k != WSYNC_AMAX_NONE)
            st->quant[i].amax = st->amax_tx.dev + k;
    }
    return WSYNC_OK;
}

wsync_status_t wsync_nccl_wire_tensor_amax(wsync_sender_t *s, nc_state_t *st, uint64_t version)
{
    wsync_amax_tx_t *tx = &st->amax_tx;
    int64_t deadline = wsync_deadline_in(s->m.timeout_ms);
    uint64_t t0 = wsync_now_ns();
    wsync_status_t rc, bad;
    char text[1024] = "";

    if (tx->sets.nsets == 0 || (s->m.rank != 0 && !tx->sets.holds[s->m.rank]))
        return WSYNC_OK;
    /* a NaN or Inf: still in the exchange (so that the other senders pack and every step goes
     * out, as for the other rules), refused once the steps are done */
    bad = wsync_amax_tx_partials(tx, s, version, st->xstream, deadline);
    if (bad == WSYNC_ERR_NONFINITE)
        snprintf(text, sizeof(text), "nccl: sender %d: version %llu refused: %s (FP8 on the wire, "
                 "per-tensor)", s->m.rank, (unsigned long long)version, wsync_last_error());
    else if (bad != WSYNC_OK)
        return bad;
    if ((rc = wsync_amax_agree(&s->m, s->m.rank, &tx->sets, version, deadline, tx->amax)) !=
            WSYNC_OK ||
        (rc = wsync_amax_tx_upload(tx, st->xstream)) != WSYNC_OK)
        return rc;
    WSYNC_LOG_D("nccl: sender %d: version %llu: %u per-tensor amaxes agreed in %.3f ms",
                s->m.rank, (unsigned long long)version, tx->sets.nsets,
                (double)(wsync_now_ns() - t0) / 1e6);
    return bad == WSYNC_OK ? WSYNC_OK : wsync_err_set_text(bad, text);
}

/* xxh3 of an FP8 chunk's wire bytes at `place` (device): its codes, then its scales, without the
 * up to 3 bytes of alignment between them (which the pack does not write: two ops carrying one
 * chunk may differ there). Both sides hash it so. */
static wsync_status_t hash_wire(nc_state_t *st, const void *place, const wsync_chunk_t *c,
                                uint64_t *out)
{
    uint64_t ncodes = c->src.rows * c->src.cols, soff = wsync_wire_scales_off(c->src.rows,
                                                                                c->src.cols);
    uint64_t wire = wsync_chunk_wire_bytes(c), dense = ncodes + (uint64_t)c->ncells * 4u;
    wsync_status_t rc = wsync_nccl_host_room(st, (size_t)wire);

    if (rc == WSYNC_OK)
        rc = wsync_dev_copy_to_host(st->host, place, (size_t)wire, st->xstream,
                                    wsync_deadline_in(st->m->timeout_ms));
    if (rc != WSYNC_OK)
        return rc;
    memmove(st->host + ncodes, st->host + soff, (size_t)c->ncells * 4u);
    wsync_region_t r = {0, dense, 1, dense};
    *out = wsync_exec_hash(st->host, WSYNC_DTYPE_U8, &r);
    return WSYNC_OK;
}

/* 1 when element p (bf16, f16 or f32) is NaN or Inf (an all-ones exponent); *what says which. */
static int nonfinite_elem(const uint8_t *p, wsync_dtype_t dt, const char **what)
{
    uint32_t u, em, mm, sm;

    if (dt == WSYNC_DTYPE_F32) {
        memcpy(&u, p, 4);
        em = 0x7f800000u, mm = 0x007fffffu, sm = 0x80000000u;
    } else {
        uint16_t h;
        memcpy(&h, p, 2);
        u = h;
        em = dt == WSYNC_DTYPE_BF16 ? 0x7f80u : 0x7c00u;
        mm = dt == WSYNC_DTYPE_BF16 ? 0x007fu : 0x03ffu;
        sm = 0x8000u;
    }
    if ((u & em) != em)
        return 0;
    *what = (u & mm) ? "NaN" : (u & sm) ? "-Inf" : "Inf";
    return 1;
}

/* FP8 quantization q of this version met a NaN or Inf: find the first in its chunk's region
 * (row-major, through a host copy) and refuse the version naming the param, the element (row and
 * column of the param's [rows, last dim] matrix) and this sender. */
static wsync_status_t sender_wire_nonfinite(wsync_sender_t *s, nc_state_t *st, uint32_t q,
                                            uint64_t version)
{
    const wsync_chunk_t *c = &s->m.plan->chunks[st->qchunk[q]];
    const wsync_shard_desc_t *sh = &s->shards[c->shard];
    size_t esz = wsync_dtype_size(c->dtype), width = (size_t)(c->src.cols * esz);
    const char *what = NULL;
    uint64_t e = UINT64_MAX;
    wsync_status_t rc = wsync_nccl_host_room(st, width * (size_t)c->src.rows);

    if (rc == WSYNC_OK)
        rc = wsync_dev_memcpy2d_async(st->host, width, (const uint8_t *)s->shard_data[c->shard] +
                                      c->src.off * esz, (size_t)(c->src.pitch * esz), width,
                                      (size_t)c->src.rows, st->xstream);
    if (rc == WSYNC_OK)
        rc = wsync_dev_stream_sync(st->xstream, wsync_deadline_in(st->m->timeout_ms),
                                   "nccl: a copy to the host to find a non-finite value");
    if (rc != WSYNC_OK)
        return rc;
    for (uint64_t r = 0; r < c->src.rows && e == UINT64_MAX; r++)
        for (uint64_t k = 0; k < c->src.cols; k++)
            if (nonfinite_elem(st->host + (r * c->src.cols + k) * esz, c->dtype, &what)) {
                e = c->src.off + r * c->src.pitch + k;   /* element of the dense shard box */
                break;
            }
    if (e == UINT64_MAX)
        return wsync_err(WSYNC_ERR_INTERNAL, "nccl: sender %d: version %llu: the FP8 quantization "
                         "of param '%s' saw a non-finite value its region does not hold",
                         s->m.rank, (unsigned long long)version, sh->param.name);
    /* the element's coordinates in the param, then its row of the param's matrix */
    int nd = sh->param.ndim;
    uint64_t idx[WSYNC_MAX_DIMS] = {0}, rest = e, row = 0;
    for (int d = nd - 1; d >= 0; d--) {
        uint64_t len = (uint64_t)sh->box.len[d];
        idx[d] = (uint64_t)sh->box.start[d] + (len > 0 ? rest % len : 0);
        rest = len > 0 ? rest / len : 0;
    }
    for (int d = 0; d + 1 < nd; d++)
        row = row * (uint64_t)sh->param.shape[d] + idx[d];
    return wsync_err(WSYNC_ERR_NONFINITE, "nccl: sender %d: version %llu refused: %s: %s at row "
                     "%llu, column %llu (quantized by this sender: FP8 on the wire)", s->m.rank,
                     (unsigned long long)version, sh->param.name, what, (unsigned long long)row,
                     (unsigned long long)(nd > 0 ? idx[nd - 1] : 0));
}

/* After step k's pack, before its sends: did its FP8 quantizations meet a NaN or Inf (then the
 * version is refused, once every step went out: sender_push_steps)? With WSYNC_VERIFY, the
 * checksums of the FP8 chunks it packed. Waits for the pack. */
wsync_status_t wsync_nccl_wire_sender_check(wsync_sender_t *s, nc_state_t *st, uint32_t k,
                                            uint64_t version)
{
    const nc_step_t *step = &st->steps[k];
    size_t bad = step->nquant;
    wsync_status_t rc;

    if (step->nquant == 0)
        return WSYNC_OK;
    rc = wsync_dev_quantize_check(st->qws[step->quant0], step->nquant, st->xstream,
                                  wsync_deadline_in(s->m.timeout_ms), &bad);
    if (rc != WSYNC_OK)
        return rc;
    if (bad < step->nquant) {
        rc = sender_wire_nonfinite(s, st, step->quant0 + (uint32_t)bad, version);
        /* the flags stay set otherwise; the group fails with this version anyway */
        char text[1024];
        snprintf(text, sizeof(text), "%s", wsync_last_error());
        if (wsync_dev_memset_async(st->qws[step->quant0], 0,
                                   (size_t)step->nquant * WSYNC_KQUANT_WS_BYTES, st->xstream) !=
            WSYNC_OK)
            WSYNC_LOG_W("nccl: sender %d: %s", s->m.rank, wsync_last_error());
        return wsync_err_set_text(rc, text);
    }
    for (uint32_t i = 0; st->verify && i < step->nquant; i++) {
        uint32_t q = step->quant0 + i, c = st->qchunk[q];
        if (st->tx_have[c])
            continue;
        rc = hash_wire(st, (uint8_t *)st->slot[k % NC_SLOTS] + st->qoff[q], &s->m.plan->chunks[c],
                       &st->tx_sum[c]);
        if (rc != WSYNC_OK)
            return rc;
        st->tx_have[c] = 1;
    }
    return WSYNC_OK;
}

/* Every FP8 chunk of ours passed its check: tell the receivers that could otherwise finish the
 * version first (their last step from us comes earlier). Under WSYNC_VERIFY the checksums,
 * relayed after the packs, say it. */
wsync_status_t wsync_nccl_wire_send_packed(wsync_sender_t *s, nc_state_t *st, uint64_t version)
{
    uint8_t b[8];
    wsync_status_t rc = WSYNC_OK;

    for (int j = 0; j < 8; j++)
        b[j] = (uint8_t)(version >> (8 * j));
    for (uint32_t r = 0; st->packed_to != NULL && r < s->m.plan->nreceivers && rc == WSYNC_OK;
         r++)
        if (st->packed_to[r])
            rc = wsync_member_relay_send(&s->m, WSYNC_ROLE_RECEIVER, (int)r, NC_TAG_PACKED, b,
                                         sizeof(b));
    return rc;
}

/* ================================================================================================
 * Receiver
 * ============================================================================================== */

/* FP8 on the wire: the two copies of a segment whose chunk travels as FP8 codes and scales, from
 * its place `soff` in the slot: codes into the target itself (a wire target is its own landing
 * buffer and is never quantized here), scales where the receiver keeps that target's. */
wsync_status_t wsync_nccl_wire_unpack_descs(const wsync_receiver_t *r, const nc_state_t *st,
                                            const wsync_segment_t *sg, uint64_t soff, void *slot,
                                            wsync_kcopy_t out[2])
{
    const wsync_plan_t *plan = r->m.plan;
    wsync_chunk_t c = plan->chunks[sg->chunk];
    float *scales;

    if (r->wire == NULL || !r->wire[sg->target] ||
        r->land[sg->target] != r->target_data[sg->target])
        return wsync_err(WSYNC_ERR_PROTOCOL, "nccl: receiver %u: target '%s' is sent chunk %u as "
                         "FP8 codes and scales, but is not set up to take FP8 on the wire (every "
                         "segment FP8, landing in the target itself)", st->rank,
                         r->targets[sg->target].name, sg->chunk);
    scales = wsync_receiver_wire_scales(r, sg->target);
    c.bucket_off = soff;              /* its place in the op's staging */
    return wsync_kernels_unpack_wire_desc(plan, sg, &c, slot, &r->targets[sg->target],
                                          r->target_data[sg->target], scales, out);
}

/* xxh3 of what an FP8 segment landed: its codes in the target, then its scales in the target's
 * scale matrix, dense (hash_wire's bytes). */
wsync_status_t wsync_nccl_wire_hash_landed(const wsync_receiver_t *r, nc_state_t *st,
                                           const wsync_segment_t *sg, uint64_t *out)
{
    const wsync_plan_t *plan = r->m.plan;
    const wsync_chunk_t *c = &plan->chunks[sg->chunk];
    const wsync_wire_rule_t *rule = &plan->rules[c->rule - 1];
    const float *scales = wsync_receiver_wire_scales(r, sg->target);
    uint64_t ncodes = sg->dst.rows * sg->dst.cols, cr, cc, cell_row, cell_col, scale_cols;
    uint64_t dense = ncodes + (uint64_t)c->ncells * 4u;
    wsync_status_t rc = wsync_nccl_host_room(st, (size_t)dense);

    wsync_wire_cells(rule, c->src.rows, c->src.cols, &cr, &cc);
    wsync_wire_scales_at(rule, &r->targets[sg->target], &sg->dst, &cell_row, &cell_col,
                         &scale_cols);
    if (rc == WSYNC_OK)
        rc = wsync_dev_memcpy2d_async(st->host, (size_t)sg->dst.cols,
                                      (const uint8_t *)r->target_data[sg->target] + sg->dst.off,
                                      (size_t)sg->dst.pitch, (size_t)sg->dst.cols,
                                      (size_t)sg->dst.rows, st->xstream);
    if (rc == WSYNC_OK)
        rc = wsync_dev_memcpy2d_async(st->host + ncodes, (size_t)cc * 4u,
                                      scales + cell_row * scale_cols + cell_col,
                                      (size_t)scale_cols * 4u, (size_t)cc * 4u, (size_t)cr,
                                      st->xstream);
    if (rc == WSYNC_OK)
        rc = wsync_dev_stream_sync(st->xstream, wsync_deadline_in(st->m->timeout_ms),
                                   "nccl: a copy to the host for checksums");
    if (rc != WSYNC_OK)
        return rc;
    wsync_region_t d = {0, dense, 1, dense};
    *out = wsync_exec_hash(st->host, WSYNC_DTYPE_U8, &d);
    return WSYNC_OK;
}

/* FP8 on the wire: before the version may finish here, the PACKED relay of every sender whose
 * FP8 checks end after our last step from it (a NaN there refuses the version: the group's
 * failure comes instead). */
wsync_status_t wsync_nccl_wire_wait_packed(wsync_receiver_t *r, nc_state_t *st, uint64_t version)
{
    uint32_t ns = r->m.plan->nsenders, expect = 0, got = 0;
    uint8_t *seen = NULL;
    int64_t deadline = wsync_deadline_in(r->m.timeout_ms);
    wsync_status_t rc = WSYNC_OK;

    for (uint32_t s = 0; st->packed_from != NULL && s < ns; s++)
        expect += st->packed_from[s];
    if (expect == 0)
        return WSYNC_OK;
    if ((seen = calloc(ns, 1)) == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "nccl: no memory");
    while (got < expect) {
        wsync_msg_t *msg;
        wsync_relay_t rl;
        rc = wsync_member_relay_recv(&r->m, deadline, &msg, &rl);
        if (rc == WSYNC_ERR_TIMEOUT) {
            uint32_t s = 0;
            while (s < ns && (!st->packed_from[s] || seen[s]))
                s++;
            rc = wsync_err(rc, "nccl: receiver %d: version %llu: sender %u did not say within "
                           "%d ms that its FP8 chunks passed their NaN/Inf check", r->m.rank,
                           (unsigned long long)version, s, r->m.timeout_ms);
        }
        if (rc != WSYNC_OK)
            break;
        wsync_rbuf_t rb;
        wsync_rbuf_init(&rb, rl.data, rl.len);
        uint64_t v = wsync_get_u64(&rb);
        uint32_t s = (uint32_t)rl.rank;
        int bad = rb.err || wsync_rbuf_left(&rb) != 0 || rl.tag != NC_TAG_PACKED ||
                  rl.role != WSYNC_ROLE_SENDER || s >= ns || !st->packed_from[s] || seen[s] ||
                  v != version;
        wsync_msg_free(msg);
        if (bad) {
            rc = wsync_err(WSYNC_ERR_PROTOCOL, "nccl: receiver %d: unexpected relay (tag %u) from "
                           "%s %d while waiting for the FP8 checks of version %llu", r->m.rank,
                           rl.tag, rl.role == WSYNC_ROLE_SENDER ? "sender" : "receiver",
                           rl.rank, (unsigned long long)version);
            break;
        }
        seen[s] = 1;
        got++;
    }
    free(seen);
    return rc;
}

