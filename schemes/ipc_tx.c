/* One version's push on an ipc sender: for each bucket of its schedule, the delta encode, the
 * slot's refill once the bucket that used it last was released, the GPU and CPU packs, READY to
 * each receiver that needs the bucket (with the chunks' checksums when verifying, and the fault
 * points), then every RELEASE. Apart from ipc.c, which sets the sender up and tears it down: this
 * is the sender's per-version path, read and tuned on its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fault.h"
#include "core/log.h"
#include "core/objects.h"
#include "core/util.h"
#include "kernels/device.h"
#include "reshard/exec.h"
#include "schemes/ipc_delta.h"
#include "schemes/ipc_internal.h"
#include "schemes/wire_amax.h"

/* The receiver on data connection c (its tag, set when it said DATA_HELLO), -1 if none: one
 * lookup per RELEASE, not a scan of every receiver (quadratic with hundreds of them). */
static int rank_of_conn(const ipc_sender_t *st, uint32_t nr, wsync_conn_t *c)
{
    uint32_t t = atomic_load(&c->tag);
    if (t == 0 || t > nr || st->rconn[t - 1] != c)
        return -1;
    return (int)(t - 1);
}

/* Take RELEASE messages until bucket k has none due. */
static wsync_status_t await_release(wsync_sender_t *s, ipc_sender_t *st, uint64_t version, uint32_t k)
{
    const uint16_t types[] = {WSYNC_MSG_RELEASE};
    uint32_t nr = s->m.plan->nreceivers;

    while (st->pending[k] > 0) {
        wsync_msg_t *msg;
        wsync_rbuf_t r;
        wsync_status_t rc = wsync_inbox_pop(&s->m.inbox, types, 1,
                                            wsync_deadline_in(s->m.timeout_ms), &msg);
        if (rc == WSYNC_ERR_TIMEOUT) {
            char who[512] = "";
            size_t n = 0;
            for (uint32_t i = 0; i < nr; i++) {
                if (!st->owed[(size_t)k * nr + i] || n + 1 >= sizeof(who))
                    continue;
                pthread_mutex_lock(&st->rconn[i]->send_lock);   /* its name may be rewritten */
                n += (size_t)snprintf(who + n, sizeof(who) - n, "%s%s", n ? ", " : "",
                                      st->rconn[i]->name);
                pthread_mutex_unlock(&st->rconn[i]->send_lock);
            }
            return wsync_err(rc, "ipc: sender %d: version %llu: bucket %u not released within %d ms "
                             "by %s", s->m.rank, (unsigned long long)version, k, s->m.timeout_ms,
                             who);
        }
        if (rc != WSYNC_OK)
            return rc;
        wsync_rbuf_init(&r, msg->payload, msg->len);
        uint64_t v = wsync_get_u64(&r);
        uint32_t b = wsync_get_u32(&r);
        int rank = rank_of_conn(st, nr, msg->conn);
        wsync_msg_free(msg);
        if (r.err || v != version || b >= st->nbuckets || rank < 0 ||
            !st->need[(size_t)b * nr + (uint32_t)rank] || st->pending[b] == 0)
            return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: sender %d: unexpected RELEASE of bucket %u "
                             "version %llu from receiver %d", s->m.rank, b, (unsigned long long)v,
                             rank);
        st->pending[b]--;
        st->owed[(size_t)b * nr + (uint32_t)rank] = 0;
    }
    return WSYNC_OK;
}

/* Where slot `slot`'s bytes start, as the CPU (host slots) or kernels (device slots) see them. */
static uint8_t *slot_base(const ipc_sender_t *st, uint32_t slot)
{
    if (slot >= DEV_SLOT0)
        return (uint8_t *)st->dslots + (size_t)(slot - DEV_SLOT0) * st->dslot_bytes;
    return (uint8_t *)st->shm.base + (size_t)slot * st->slot_bytes;
}

/* A version refused by this sender's pack (FP8 on the wire: a NaN or Inf in a shard): rc with
 * the pack's message (param, sender, element), prefixed with the version. */
static wsync_status_t refused(const wsync_sender_t *s, uint64_t version, wsync_status_t rc)
{
    char text[1024];
    snprintf(text, sizeof(text), "ipc sender %d: version %llu refused: %s", s->m.rank,
             (unsigned long long)version, wsync_last_error());
    return wsync_err_set_text(rc, text);
}

/* FP8 on the wire, CUDA shards: the quantizations of bucket k's FP8 chunks, on the pack's
 * stream (their workspaces cleared first after a version that may have flagged one). */
static wsync_status_t wire_pack_launch(ipc_sender_t *st, uint32_t k, uint32_t n)
{
    wsync_status_t rc;

    if (st->wq_dirty) {
        rc = wsync_dev_memset_async(st->wq_mem, 0, (size_t)st->nwq * WSYNC_KQUANT_WS_BYTES,
                                    st->stream);
        if (rc != WSYNC_OK)
            return rc;
        st->wq_dirty = 0;
    }
    return wsync_dev_quantize_many(st->wq + st->wq_start[k], n, st->wq_ws + st->wq_start[k], 0,
                                   st->stream);
}

/* After bucket k's pack completed: NONFINITE (param, sender, element) when one of its FP8
 * chunks held a NaN or Inf, before READY goes out. */
static wsync_status_t wire_pack_check(wsync_sender_t *s, ipc_sender_t *st, uint64_t version,
                                      uint32_t k, uint32_t n)
{
    size_t bad = n;
    uint32_t i0 = st->wq_start[k];
    wsync_status_t rc = wsync_dev_quantize_check(st->wq_ws[i0], n, st->stream,
                                                 wsync_deadline_in(s->m.timeout_ms), &bad);

    if (rc != WSYNC_OK || bad >= n)
        return rc;
    st->wq_dirty = 1;
    const wsync_chunk_t *ch = NULL;
    uint32_t seen = 0;
    for (uint32_t c = st->chunk_start[k]; c < st->chunk_start[k + 1] && ch == NULL; c++) {
        const wsync_chunk_t *x = &s->m.plan->chunks[c];
        if (x->rule != 0 && s->shards[x->shard].mem == WSYNC_MEM_CUDA && seen++ == bad)
            ch = x;
    }
    rc = wsync_dev_quantize_finish(&st->wq[i0 + bad], st->wq_ws[i0 + bad], st->stream);
    if (rc == WSYNC_OK)   /* the flag said otherwise: name it anyway */
        rc = wsync_err(WSYNC_ERR_NONFINITE, "non-finite value");
    char text[1024];
    snprintf(text, sizeof(text), "ipc sender %d: version %llu refused: sender %d: param '%s', its "
             "chunk from column %llu, quantized for the wire: %s", s->m.rank,
             (unsigned long long)version, s->m.rank,
             ch != NULL ? s->shards[ch->shard].param.name : "?",
             ch != NULL && ch->src.pitch > 0 ? (unsigned long long)(ch->src.off % ch->src.pitch)
                                             : 0ull, wsync_last_error());
    return wsync_err_set_text(rc, text);
}

/* FP8 on the wire: every FP8 chunk of ours passed its check in this version: PACKED (a READY
 * of bucket nbuckets, no slot, nothing to release) to the receivers that need none of our
 * buckets from the last FP8 one on, which wait for it before committing (ipc_internal.h). */
static wsync_status_t send_packed(wsync_sender_t *s, ipc_sender_t *st, uint64_t version)
{
    wsync_wbuf_t b;
    wsync_status_t rc = WSYNC_OK;

    wsync_wbuf_init(&b);
    wsync_put_u64(&b, version);
    wsync_put_u32(&b, st->nbuckets);
    wsync_put_u32(&b, NO_SLOT);
    if (b.err)
        rc = wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for PACKED");
    for (uint32_t r = 0; r < s->m.plan->nreceivers && rc == WSYNC_OK; r++)
        if (st->notify[r])
            rc = wsync_conn_send(st->rconn[r], WSYNC_MSG_READY, b.data, (uint32_t)b.len, NULL, 0,
                                 s->m.timeout_ms);
    wsync_wbuf_free(&b);
    return rc;
}

/* The sets, once (wsync_amax_tx_build), and the CUDA packs of their chunks pointed at the
 * agreed amaxes on the device (wq in plan_wire_packs' order: bucket by bucket, chunks of rule != 0
 * from CUDA shards). */
static wsync_status_t tensor_setup(wsync_sender_t *s, ipc_sender_t *st)
{
    const wsync_plan_t *plan = s->m.plan;
    wsync_amax_tx_t *tx = &st->amax_tx;
    wsync_status_t rc;
    uint32_t q = 0;

    if (tx->built)
        return WSYNC_OK;
    if ((rc = wsync_amax_tx_build(tx, s)) != WSYNC_OK || tx->sets.nsets == 0 ||
        st->wq_start == NULL)
        return rc;
    for (uint32_t k = 0; k < st->nbuckets; k++)
        for (uint32_t c = st->chunk_start[k]; c < st->chunk_start[k + 1]; c++) {
            const wsync_chunk_t *ch = &plan->chunks[c];
            if (ch->rule == 0 || s->shards[ch->shard].mem != WSYNC_MEM_CUDA)
                continue;
            if (q >= st->nwq)
                return wsync_err(WSYNC_ERR_INTERNAL, "ipc: sender %d: %u FP8 packs, more chunks",
                                 s->m.rank, st->nwq);
            if (tx->sets.set[c] != WSYNC_AMAX_NONE)
                st->wq[q].amax = tx->dev + tx->sets.set[c];
            q++;
        }
    return WSYNC_OK;
}

/* Per-tensor FP8 on the wire (schemes/wire_amax.h): this sender's partial amax of each
 * per-tensor target it holds chunks of (host shards on the CPU, CUDA shards by the amax kernels),
 * then the max its senders agree on (st->amax_tx.amax, and on the device for the CUDA packs);
 * nothing when the plan has none. A NaN or Inf refuses the version here, before its amax is sent
 * and before any READY. */
static wsync_status_t tensor_amax(wsync_sender_t *s, ipc_sender_t *st, uint64_t version)
{
    int64_t deadline = wsync_deadline_in(s->m.timeout_ms);
    wsync_amax_tx_t *tx = &st->amax_tx;
    wsync_status_t rc;

    if ((rc = tensor_setup(s, st)) != WSYNC_OK || tx->sets.nsets == 0)
        return rc;
    if (!tx->sets.holds[s->m.rank] && s->m.rank != 0)
        return WSYNC_OK;             /* nothing to send, nothing to pack */
    rc = wsync_amax_tx_partials(tx, s, version, st->stream, deadline);
    if (rc == WSYNC_ERR_NONFINITE)
        return refused(s, version, rc);
    if (rc == WSYNC_OK)
        rc = wsync_amax_agree(&s->m, s->m.rank, &tx->sets, version, deadline, tx->amax);
    if (rc == WSYNC_OK)
        rc = wsync_amax_tx_upload(tx, st->stream);   /* before the packs on the same stream */
    return rc;
}

static wsync_status_t push_buckets(wsync_sender_t *s, ipc_sender_t *st, uint64_t version,
                                   const wsync_amax_sets_t *sets, const float *amax);

/* One version, with the sender in its device context when it has CUDA shards. */
wsync_status_t wsync_ipc_push_body(wsync_sender_t *s, ipc_sender_t *st, uint64_t version)
{
    uint64_t t0 = wsync_now_ns();
    wsync_status_t rc = tensor_amax(s, st, version);

    if (rc == WSYNC_OK && st->amax_tx.sets.nsets > 0)
        WSYNC_LOG_D("ipc: sender %d: version %llu: %u per-tensor amaxes agreed in %.3f ms",
                    s->m.rank, (unsigned long long)version, st->amax_tx.sets.nsets,
                    (double)(wsync_now_ns() - t0) / 1e6);
    if (rc == WSYNC_OK)
        rc = push_buckets(s, st, version, &st->amax_tx.sets, st->amax_tx.amax);
    return rc;
}

/* Bucket k into its staging slot, once the slot's previous bucket was released by all who
 * needed it: CUDA chunks by the pack kernels (FP8 ones quantized), host chunks by the CPU meanwhile
 * (per-tensor FP8 ones with the agreed amax), then the GPU's packs waited for. */
static wsync_status_t stage_bucket(wsync_sender_t *s, ipc_sender_t *st, uint64_t version,
                                   uint32_t k, uint32_t slot, const wsync_amax_sets_t *sets,
                                   const float *amax)
{
    const wsync_plan_t *plan = s->m.plan;
    wsync_status_t rc;

    if (st->last_in_slot[slot] >= 0 &&
        (rc = await_release(s, st, version, (uint32_t)st->last_in_slot[slot])) != WSYNC_OK)
        return rc;
    st->last_in_slot[slot] = k;
    uint8_t *base = slot_base(st, slot);
    uint32_t nwq = st->wq_start != NULL ? st->wq_start[k + 1] - st->wq_start[k] : 0;
    int gpu = (st->pack != NULL && st->pack[k] != NULL) || nwq > 0;
    if (gpu) {
        /* CUDA chunks first, so that the CPU packs below overlap them */
        if ((st->pack != NULL && st->pack[k] != NULL &&
             (rc = wsync_dev_batch_launch(st->pack[k], st->stream)) != WSYNC_OK) ||
            (nwq > 0 && (rc = wire_pack_launch(st, k, nwq)) != WSYNC_OK) ||
            (rc = wsync_dev_event_record(st->ev, st->stream)) != WSYNC_OK)
            return rc;
    }
    for (uint32_t c = st->chunk_start[k]; c < st->chunk_start[k + 1]; c++) {
        const wsync_chunk_t *ch = &plan->chunks[c];
        if (in_place(&st->inplace[ch->shard]) || wsync_ipc_dtx_skip_plain(st->dtx, c))
            continue;
        if (s->shards[ch->shard].mem == WSYNC_MEM_HOST && ch->rule != 0) {
            /* FP8 on the wire: a NaN or Inf refuses the version before READY */
            if (sets->nsets > 0 && sets->set[c] != WSYNC_AMAX_NONE)
                rc = wsync_exec_pack_wire_amax(plan, ch, s->shards[ch->shard].param.name,
                                               s->shard_data[ch->shard],
                                               amax[sets->set[c]], base);
            else
                rc = wsync_exec_pack_wire(plan, ch, s->shards[ch->shard].param.name,
                                          s->shard_data[ch->shard], base);
            if (rc != WSYNC_OK)
                return refused(s, version, rc);
        } else if (s->shards[ch->shard].mem == WSYNC_MEM_HOST) {
            wsync_exec_pack(ch, s->shard_data[ch->shard], base);
        }
        s->stats.bytes_packed += chunk_bytes(ch);
    }
    if (gpu) {
        char what[96];
        uint64_t t0 = wsync_now_ns();
        snprintf(what, sizeof(what), "ipc sender %d: packing bucket %u of version %llu",
                 s->m.rank, k, (unsigned long long)version);
        rc = wsync_dev_event_wait(st->ev, wsync_deadline_in(s->m.timeout_ms), what);
        if (rc == WSYNC_OK && nwq > 0)
            rc = wire_pack_check(s, st, version, k, nwq);
        if (rc != WSYNC_OK)
            return rc;
        st->gpu_pack_ns += wsync_now_ns() - t0;
    }
    s->stats.buckets++;
    return WSYNC_OK;
}

/* WSYNC_VERIFY: bucket k's checksums into its READY, one per chunk: of the shard itself (whatever
 * happens to the bytes after this, the receiver sees), or for FP8 on the wire of the codes and
 * scales the pack wrote, as the receiver reads them from the slot. */
static wsync_status_t put_bucket_sums(wsync_sender_t *s, ipc_sender_t *st, uint32_t k,
                                      uint32_t slot, wsync_wbuf_t *b)
{
    const wsync_plan_t *plan = s->m.plan;
    wsync_status_t rc;

    wsync_put_u32(b, st->chunk_start[k + 1] - st->chunk_start[k]);
    for (uint32_t c = st->chunk_start[k]; c < st->chunk_start[k + 1]; c++) {
        const wsync_chunk_t *ch = &plan->chunks[c];
        uint64_t h = 0;
        if (ch->rule != 0) {
            wsync_region_t g = wire_region(ch);
            rc = wsync_ipc_hash_any(slot_base(st, slot) + ch->bucket_off,
                                    slot >= DEV_SLOT0, WSYNC_DTYPE_U8, &g, &st->scratch,
                                    &st->scratch_cap, st->stream, s->m.timeout_ms, &h);
        } else {
            rc = wsync_ipc_hash_any(s->shard_data[ch->shard],
                                    s->shards[ch->shard].mem == WSYNC_MEM_CUDA, ch->dtype,
                                    &ch->src, &st->scratch, &st->scratch_cap,
                                    st->stream, s->m.timeout_ms, &h);
        }
        if (rc != WSYNC_OK)
            return rc;
        wsync_put_u64(b, h);
    }
    return WSYNC_OK;
}

static wsync_status_t push_buckets(wsync_sender_t *s, ipc_sender_t *st, uint64_t version,
                                   const wsync_amax_sets_t *sets, const float *amax)
{
    const wsync_plan_t *plan = s->m.plan;
    uint32_t nr = plan->nreceivers;
    wsync_status_t rc;

    uint64_t t0 = wsync_now_ns(), t_ready;
    uint32_t nready = 0;

    for (uint32_t i = 0; i < 2 * IPC_SLOTS; i++)
        st->last_in_slot[i] = -1;
    st->gpu_pack_ns = 0;
    if (st->dtx != NULL &&
        (rc = wsync_ipc_dtx_begin(s, st->dtx, version, st->rconn, st->needs_any)) != WSYNC_OK)
        return rc;
    for (uint32_t k = 0; k < st->nbuckets; k++) {
        uint32_t slot = st->slot_of[k];
        wsync_wbuf_t b;

        if (st->dtx != NULL) {
            /* encode first: a chunk whose encoding does not pay travels plain, staged below */
            int64_t prev = wsync_ipc_dtx_reuse(st->dtx, k);
            if ((prev >= 0 && (rc = await_release(s, st, version, (uint32_t)prev)) != WSYNC_OK) ||
                (rc = wsync_ipc_dtx_bucket(s, st->dtx, k, version, st->stream)) != WSYNC_OK)
                return rc;
        }
        if (slot != NO_SLOT && (rc = stage_bucket(s, st, version, k, slot, sets, amax)) != WSYNC_OK)
            return rc;
        wsync_wbuf_init(&b);
        wsync_put_u64(&b, version);
        wsync_put_u32(&b, k);
        wsync_put_u32(&b, slot);
        if (st->dtx != NULL)
            wsync_ipc_dtx_put_ready(st->dtx, k, &b);
        if (st->verify && (rc = put_bucket_sums(s, st, k, slot, &b)) != WSYNC_OK) {
            wsync_wbuf_free(&b);
            return rc;
        }
        switch (WSYNC_FAULT(WSYNC_FAULT_PUSH_BUCKET)) {
        case WSYNC_FAULT_FAIL: {
            char where[128];
            snprintf(where, sizeof(where), "ipc sender %d, bucket %u of version %llu", s->m.rank,
                     k, (unsigned long long)version);
            wsync_wbuf_free(&b);
            return wsync_fault_err(WSYNC_FAULT_PUSH_BUCKET, where);
        }
        case WSYNC_FAULT_CORRUPT:   /* in the staging slot: what the receivers copy from */
            for (uint32_t c = st->chunk_start[k]; c < st->chunk_start[k + 1] && slot != NO_SLOT; c++) {
                if (in_place(&st->inplace[plan->chunks[c].shard]))
                    continue;
                rc = wsync_ipc_flip_any(slot_base(st, slot) + plan->chunks[c].bucket_off,
                                        slot >= DEV_SLOT0, chunk_bytes(&plan->chunks[c]),
                                        st->stream, s->m.timeout_ms);
                if (rc != WSYNC_OK) {
                    wsync_wbuf_free(&b);
                    return rc;
                }
                break;
            }
            if (slot == NO_SLOT)
                WSYNC_LOG_W("ipc: sender %d: bucket %u is read in place: nothing staged to "
                            "corrupt", s->m.rank, k);
            break;
        default:
            break;
        }
        if (b.err) {
            wsync_wbuf_free(&b);
            return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for READY");
        }
        for (uint32_t r = 0; r < nr; r++) {
            if (!st->need[(size_t)k * nr + r])
                continue;
            rc = wsync_conn_send(st->rconn[r], WSYNC_MSG_READY, b.data, (uint32_t)b.len, NULL, 0,
                                 s->m.timeout_ms);
            if (rc != WSYNC_OK) {
                wsync_wbuf_free(&b);
                return rc;
            }
            st->pending[k]++;
            st->owed[(size_t)k * nr + r] = 1;
            nready++;
        }
        wsync_wbuf_free(&b);
        if ((int64_t)k == st->wire_last && (rc = send_packed(s, st, version)) != WSYNC_OK)
            return rc;
    }
    t_ready = wsync_now_ns();
    for (uint32_t k = 0; k < st->nbuckets; k++)
        if ((rc = await_release(s, st, version, k)) != WSYNC_OK)
            return rc;
    for (uint32_t r = 0; r < nr; r++)
        s->stats.bytes_delivered += plan->pair_bytes[(size_t)s->m.rank * nr + r];
    if (st->dtx != NULL && (rc = wsync_ipc_dtx_finish(s, st->dtx, version, st->stream)) != WSYNC_OK)
        return rc;
    uint64_t t_end = wsync_now_ns();
    WSYNC_LOG_D("ipc: sender %d: version %llu: %u READY (%u buckets) sent by %.3f ms, last RELEASE "
                "at %.3f ms after the push began; %.3f ms waiting for GPU packs", s->m.rank,
                (unsigned long long)version, nready, st->nbuckets, (double)(t_ready - t0) / 1e6,
                (double)(t_end - t0) / 1e6, (double)st->gpu_pack_ns / 1e6);
    return WSYNC_OK;
}
