/* One version's landing on an ipc receiver: each READY taken (its delta part and checksums
 * read and checked), the bucket's segments into CUDA targets launched on the sender's stream
 * (copies, deltas, FP8 runs: ipc_cuda_rx.c) and those into host targets copied or applied by the
 * CPU, each bucket finished (fault point, checksums, RELEASE, progress) as soon as it landed:
 * GPU buckets when their event completes, polled in any order, every wait against the deadline.
 * Apart from ipc.c, which sets the receiver up and tears it down: this is the receiver's
 * per-version path, read and tuned on its own. */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fault.h"
#include "core/log.h"
#include "core/objects.h"
#include "core/util.h"
#include "kernels/device.h"
#include "reshard/exec.h"
#include "schemes/ipc_delta.h"
#include "schemes/ipc_internal.h"
#include "transports/cuda_ipc.h"

/* "sender 1 (pid 42): 2 buckets": whom a receiver still waits on in this version. */
static void waiting_on(const ipc_receiver_t *st, char *buf, size_t len)
{
    size_t n = 0;

    buf[0] = '\0';
    for (uint32_t s = 0; s < st->nsenders && n + 1 < len; s++) {
        const ipc_from_t *f = &st->from[s];
        uint32_t missing = 0;
        for (uint32_t k = 0; k < f->nbuckets; k++)
            missing += f->seg_start[k] < f->seg_start[k + 1] && !f->done[k];
        if (missing > 0)
            n += (size_t)snprintf(buf + n, len - n, "%ssender %u (pid %u): %u bucket%s",
                                  n ? ", " : "", s, f->pid, missing, missing == 1 ? "" : "s");
        else if (f->await_packed && !f->packed && n + 1 < len)
            n += (size_t)snprintf(buf + n, len - n, "%ssender %u (pid %u): the end of its FP8 "
                                  "packs", n ? ", " : "", s, f->pid);
    }
}

/* Where slot `slot` of a sender lies here, and whether on a device. */
static const uint8_t *from_slot(const ipc_from_t *f, uint32_t slot, int *on_device)
{
    *on_device = slot != NO_SLOT && slot >= DEV_SLOT0;
    if (slot == NO_SLOT)
        return NULL;
    if (slot >= DEV_SLOT0)
        return (const uint8_t *)wsync_cuda_import_base(f->cim, f->dslot_region, NULL) +
               (size_t)(slot - DEV_SLOT0) * f->dslot_bytes;
    return (const uint8_t *)f->shm.base + (size_t)slot * f->slot_bytes;
}

/* Check every segment of bucket k of sender s against the checksums READY brought: the bytes as
 * they landed when no cast came between, else the source bytes the cast read. */
static wsync_status_t verify_bucket(wsync_receiver_t *r, ipc_receiver_t *st, const ipc_from_t *f,
                                    uint32_t s, uint32_t k, uint64_t version, const uint64_t *sums,
                                    uint32_t slot)
{
    const wsync_plan_t *plan = r->m.plan;
    int slot_dev = 0;
    const uint8_t *base = from_slot(f, slot, &slot_dev);

    for (uint32_t i = f->seg_start[k]; i < f->seg_start[k + 1]; i++) {
        const wsync_segment_t *sg = &r->m.segs[i];
        const wsync_chunk_t *c = &plan->chunks[sg->chunk];
        const ipc_inplace_t *ip = &f->inplace[c->shard];
        uint64_t got = 0;
        wsync_status_t rc;
        if (c->rule != 0) {
            /* FP8 on the wire: the sender hashed the codes and scales it packed into the slot */
            wsync_region_t g = wire_region(c);
            rc = base == NULL ? wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: FP8 chunk %u of "
                                          "sender %u came without a slot", r->m.rank, sg->chunk, s)
                              : wsync_ipc_hash_any(base + c->bucket_off, slot_dev, WSYNC_DTYPE_U8,
                                                   &g, &st->scratch, &st->scratch_cap, st->stream,
                                                   r->m.timeout_ms, &got);
        } else if (r->land_dtype[sg->target] == c->dtype &&
                   (st->seg_run == NULL || st->seg_run[i] == 0)) {
            rc = wsync_ipc_hash_any(r->land[sg->target],
                                    r->targets[sg->target].mem == WSYNC_MEM_CUDA, c->dtype,
                                    &sg->dst, &st->scratch, &st->scratch_cap, st->stream,
                                    r->m.timeout_ms, &got);
        } else if (ip->region >= 0) {
            rc = wsync_ipc_hash_any((const uint8_t *)f->regions[ip->region].base + ip->offset, 0,
                                    c->dtype, &c->src, &st->scratch, &st->scratch_cap, st->stream,
                                    r->m.timeout_ms, &got);
        } else if (ip->cregion >= 0) {
            rc = wsync_ipc_hash_any((const uint8_t *)wsync_cuda_import_base(
                                        f->cim, (uint32_t)ip->cregion, NULL) + ip->offset,
                                    1, c->dtype, &c->src, &st->scratch, &st->scratch_cap,
                                    st->stream, r->m.timeout_ms, &got);
        } else {
            wsync_region_t dense = {0, c->src.cols, c->src.rows, c->src.cols};
            rc = wsync_ipc_hash_any(base + c->bucket_off, slot_dev, c->dtype, &dense,
                                    &st->scratch, &st->scratch_cap, st->stream, r->m.timeout_ms,
                                    &got);
        }
        if (rc != WSYNC_OK)
            return rc;
        uint64_t want = sums[sg->chunk - f->chunk_start[k]];
        if (got != want) {
            const wsync_target_desc_t *t = &r->targets[sg->target];
            char form[96] = "";
            if (c->rule != 0)   /* what was hashed: the bytes in the slot */
                snprintf(form, sizeof(form), ", sent as FP8 codes and scales: %llu bytes",
                         (unsigned long long)wsync_chunk_wire_bytes(c));
            return wsync_err(WSYNC_ERR_INTEGRITY, "receiver %d: version %llu refused: param '%s' "
                             "(target '%s') from sender %u (pid %u), chunk %u (bucket %u, %llu x "
                             "%llu %s%s): the sender's xxh3 is %016llx, what landed hashes to "
                             "%016llx", r->m.rank, (unsigned long long)version,
                             t->pieces[sg->piece].param.name, t->name, s, f->pid, sg->chunk, k,
                             (unsigned long long)c->src.rows, (unsigned long long)c->src.cols,
                             wsync_dtype_name(c->dtype), form, (unsigned long long)want,
                             (unsigned long long)got);
        }
    }
    return WSYNC_OK;
}

/* Bucket k of sender s has landed whole: fault point, checks, RELEASE, progress. */
static wsync_status_t finish_bucket(wsync_receiver_t *r, ipc_receiver_t *st, uint32_t s, uint32_t k,
                                    uint64_t version, uint32_t slot, uint64_t bytes,
                                    uint64_t *bytes_done)
{
    ipc_from_t *f = &st->from[s];
    wsync_status_t rc;

    switch (WSYNC_FAULT(WSYNC_FAULT_RECV_UNPACK)) {
    case WSYNC_FAULT_FAIL: {
        char where[128];
        snprintf(where, sizeof(where), "ipc receiver %d, bucket %u of sender %u, version %llu",
                 r->m.rank, k, s, (unsigned long long)version);
        return wsync_fault_err(WSYNC_FAULT_RECV_UNPACK, where);
    }
    case WSYNC_FAULT_CORRUPT: {   /* in the target, in the first row the bucket filled */
        /* a segment of a quantization run holds its FP8 codes in the target once the run has
         * finished: surely so when its last bucket is this one (launched before this bucket's
         * event, on its stream); a run launched after an earlier bucket may still run on the
         * other stream (WSYNC_IPC_STREAMS), and a later one has not started: skip those */
        uint32_t i = f->seg_start[k], run = 0;
        while (i < f->seg_start[k + 1] && st->seg_run != NULL && (run = st->seg_run[i]) != 0 &&
               st->qrun_last[run - 1] != k)
            i++;
        if (i == f->seg_start[k + 1]) {
            WSYNC_LOG_W("ipc: receiver %d: fault recv.unpack:corrupt injected nothing: bucket %u "
                        "of sender %u only feeds quantization runs that end in other buckets",
                        r->m.rank, k, s);
            break;
        }
        const wsync_segment_t *sg = &r->m.segs[i];
        size_t esz = run ? 1 : wsync_dtype_size(r->land_dtype[sg->target]);
        void *at = run ? r->target_data[sg->target] : r->land[sg->target];
        rc = wsync_ipc_flip_any((uint8_t *)at + sg->dst.off * esz,
                                r->targets[sg->target].mem == WSYNC_MEM_CUDA,
                                (size_t)sg->dst.cols * esz, st->stream, r->m.timeout_ms);
        if (rc != WSYNC_OK)
            return rc;
        break;
    }
    default:
        break;
    }
    /* the deltas applied on the GPU: their faults and tree hashes against the sender's */
    if (f->drx != NULL && (rc = wsync_ipc_drx_gpu_check(r, f->drx, k, version)) != WSYNC_OK)
        return rc;
    if (r->m.ctx->verify &&
        (rc = verify_bucket(r, st, f, s, k, version, st->sums, slot)) != WSYNC_OK)
        return rc;
    if ((rc = wsync_receiver_landed(r, f->seg_start[k], f->seg_start[k + 1])) != WSYNC_OK)
        return rc;
    {
        wsync_wbuf_t b;
        wsync_wbuf_init(&b);
        wsync_put_u64(&b, version);
        wsync_put_u32(&b, k);
        rc = wsync_conn_send(f->conn, WSYNC_MSG_RELEASE, b.data, (uint32_t)b.len, NULL, 0,
                             r->m.timeout_ms);
        wsync_wbuf_free(&b);
        if (rc != WSYNC_OK)
            return rc;
    }
    *bytes_done += bytes;
    if (r->progress != NULL)
        r->progress(r->progress_arg, version, *bytes_done, st->bytes_total);
    return WSYNC_OK;
}

/* Finish the buckets whose GPU copies are complete (each sender's on its own stream, so in any
 * order); *reaped counts them. */
static wsync_status_t reap(wsync_receiver_t *r, ipc_receiver_t *st, uint64_t version,
                           uint64_t *bytes_done, int64_t *last_ms, uint32_t *reaped)
{
    uint32_t keep = 0;
    wsync_status_t rc = WSYNC_OK;

    for (uint32_t i = 0; i < st->npend; i++) {
        struct ipc_pend p = st->pend[st->pend_head + i];
        int done = 0;
        if (rc == WSYNC_OK && (rc = wsync_dev_event_query(st->from[p.s].ev[p.k], &done)) == WSYNC_OK &&
            done && (rc = finish_bucket(r, st, p.s, p.k, version, NO_SLOT, p.bytes, bytes_done)) == WSYNC_OK) {
            (*reaped)++;
            *last_ms = wsync_now_ms();
            continue;
        }
        st->pend[st->pend_head + keep++] = p;   /* not done (or failed: keep it, nothing lost) */
    }
    st->npend = keep;
    return rc;
}

/* A short pause while GPU copies run and no READY is in: spin with yields first (copies of a
 * bucket take tens of microseconds to a few milliseconds; nanosleep costs at least the timer
 * slack, about 50 us), then naps of 10 us. */
/* A PACKED from sender s (ok: expected, for this version, well formed): marks it taken. */
static wsync_status_t take_packed(wsync_receiver_t *r, ipc_from_t *f, uint32_t s, int ok,
                                  uint64_t v, uint64_t version)
{
    if (!ok)
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: unexpected PACKED (version %llu) "
                         "from sender %u while receiving version %llu", r->m.rank,
                         (unsigned long long)v, s, (unsigned long long)version);
    f->packed = 1;
    return WSYNC_OK;
}

/* FP8 on the wire, a host target: the segment's codes into the target, its scales into the
 * target's scale matrix, from the chunk's place in a host slot (base; not_host: the chunk came
 * in place or in a device slot, which a sender never does with an FP8 chunk). */
static wsync_status_t unpack_wire_host(wsync_receiver_t *r, const wsync_plan_t *plan,
                                       const wsync_segment_t *sg, const uint8_t *base,
                                       int not_host)
{
    const wsync_chunk_t *c = &plan->chunks[sg->chunk];
    uint32_t t = sg->target;

    if (base == NULL || not_host || !wire_target(r, t))
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: FP8 chunk %u of sender %u for "
                         "target '%s' came %s", r->m.rank, sg->chunk, c->sender,
                         r->targets[t].name, !wire_target(r, t)
                                                 ? "for a target not set up for FP8 on the wire"
                                                 : "without a host slot");
    return wsync_exec_unpack_wire(plan, sg, c, base, &r->targets[t], r->target_data[t],
                                  wsync_receiver_wire_scales(r, t));
}

static void poll_pause(uint32_t idle)
{
    if (idle < 64) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 10000};
    nanosleep(&ts, NULL);
}

/* A READY frame as read: its version, bucket and slot, and its checksums (into st->sums) when
 * it carries them; a delta sender's stream lengths and hashes went to its delta receiver. */
typedef struct {
    uint64_t v;
    uint32_t k, slot, nsums;
    int has_sums, packed;            /* packed: a PACKED notice (k == the sender's nbuckets) */
} ipc_ready_t;

/* Read READY msg (freed here) from f's sender (NULL: not a sender of ours) while receiving
 * `version`: WSYNC_ERR_PROTOCOL for anything but the next bucket we need from it (or a PACKED
 * notice, checked by take_packed), WSYNC_ERR_INTEGRITY for a bucket without checksums when we
 * verify. */
static wsync_status_t read_ready(wsync_receiver_t *r, ipc_receiver_t *st, ipc_from_t *f,
                                 uint32_t s, wsync_msg_t *msg, uint64_t version, ipc_ready_t *y)
{
    wsync_rbuf_t rb;
    wsync_status_t rc;

    memset(y, 0, sizeof(*y));
    wsync_rbuf_init(&rb, msg->payload, msg->len);
    y->v = wsync_get_u64(&rb);
    y->k = wsync_get_u32(&rb);
    y->slot = wsync_get_u32(&rb);
    if (f != NULL && !rb.err && y->k == f->nbuckets) {
        /* PACKED: every FP8 chunk of this sender passed its check (ipc_internal.h) */
        int ok = f->await_packed && !f->packed && y->v == version && y->slot == NO_SLOT &&
                 wsync_rbuf_left(&rb) == 0;
        wsync_msg_free(msg);
        y->packed = 1;
        return take_packed(r, f, s, ok, y->v, version);
    }
    if (f != NULL && f->drx != NULL && !rb.err && y->k < f->nbuckets &&
        (rc = wsync_ipc_drx_ready(r, f->drx, &rb, y->k, f->chunk_start[y->k],
                                  f->chunk_start[y->k + 1], version)) != WSYNC_OK) {
        wsync_msg_free(msg);
        return rc;
    }
    y->has_sums = wsync_rbuf_left(&rb) > 0;
    if (y->has_sums) {
        y->nsums = wsync_get_count(&rb, 8);
        if (!rb.err && y->nsums > st->sums_cap) {
            uint64_t *nsp = realloc(st->sums, (size_t)y->nsums * sizeof(*nsp));
            if (nsp == NULL) {
                wsync_msg_free(msg);
                return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for %u checksums", y->nsums);
            }
            st->sums = nsp;
            st->sums_cap = y->nsums;
        }
        for (uint32_t i = 0; i < y->nsums && !rb.err; i++)
            st->sums[i] = wsync_get_u64(&rb);
    }
    wsync_msg_free(msg);
    const uint32_t k = y->k;
    if (f == NULL || rb.err || y->v != version || k >= f->nbuckets || y->slot != f->slot_of[k] ||
        f->done[k] || f->seg_start[k] == f->seg_start[k + 1] ||
        (y->has_sums && y->nsums != f->chunk_start[k + 1] - f->chunk_start[k]))
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: unexpected READY (version "
                         "%llu, bucket %u, slot %u) while receiving version %llu", r->m.rank,
                         (unsigned long long)y->v, k, y->slot, (unsigned long long)version);
    if (r->m.ctx->verify && !y->has_sums)
        return wsync_err(WSYNC_ERR_INTEGRITY, "ipc: receiver %d: version %llu refused: it "
                         "cannot be verified, sender %u (pid %u) sent bucket %u without "
                         "checksums", r->m.rank, (unsigned long long)version, s, f->pid, k);
    return WSYNC_OK;
}

/* Bucket k of f's sender into our CUDA targets: one launch (its copy batch, or the delta
 * batches, and the direct quantizations), finished when f->ev[k] completes. */
static wsync_status_t launch_bucket(wsync_receiver_t *r, ipc_receiver_t *st, ipc_from_t *f,
                                    uint32_t k, int gpu_times)
{
    wsync_kcopy_batch_t *batch = f->batch[st->cur][k];
    /* odd buckets on the second stream (sender_stream says why) */
    int two = f->stream2 != NULL && f->drx == NULL && (k & 1);
    void *strm = two ? f->stream2 : f->stream;
    wsync_status_t rc;
    if (gpu_times && (rc = wsync_ipc_gpu_times_mark(f, k, 0, strm)) != WSYNC_OK)
        return rc;
    if (f->drx != NULL && (rc = wsync_ipc_delta_batches(r, st, f, k, &batch)) != WSYNC_OK)
        return rc;
    if (batch != NULL && (rc = wsync_dev_batch_launch(batch, strm)) != WSYNC_OK)
        return rc;
    if (f->qrun_start != NULL && f->qrun_start[k + 1] > f->qrun_start[k] &&
        (rc = wsync_qdirect_launch(r, f->qrun_list + f->qrun_start[k],
                                   f->qrun_start[k + 1] - f->qrun_start[k], f->qblocks, strm)) !=
            WSYNC_OK)
        return rc;
    if (gpu_times && (rc = wsync_ipc_gpu_times_mark(f, k, 1, strm)) != WSYNC_OK)
        return rc;
    return wsync_dev_event_record(f->ev[k], strm);
}

/* Bucket k of f's sender (in `slot`) into our host targets, segment by segment: FP8 codes
 * unpacked, deltas applied and checked, the rest copied from the sender's shard in place or
 * from its host slot. *bytes: the bucket's bytes for us, CUDA targets' included. */
static wsync_status_t land_host(wsync_receiver_t *r, ipc_from_t *f, uint32_t k, uint32_t slot,
                                uint64_t version, uint64_t *bytes)
{
    const wsync_plan_t *plan = r->m.plan;
    int slot_dev = 0;
    const uint8_t *base = from_slot(f, slot, &slot_dev);
    wsync_status_t rc = WSYNC_OK;

    *bytes = 0;
    for (uint32_t i = f->seg_start[k]; i < f->seg_start[k + 1]; i++) {
        const wsync_segment_t *sg = &r->m.segs[i];
        const wsync_chunk_t *c = &plan->chunks[sg->chunk];
        const ipc_inplace_t *ip = &f->inplace[c->shard];
        void *dst = r->land[sg->target];
        wsync_dtype_t dst_dtype = r->land_dtype[sg->target];
        *bytes += c->rule != 0 ? wsync_chunk_wire_bytes(c)
                               : sg->dst.rows * sg->dst.cols * wsync_dtype_size(dst_dtype);
        if (r->targets[sg->target].mem == WSYNC_MEM_CUDA)
            continue;   /* in the batch */
        if (c->rule != 0) {
            if ((rc = unpack_wire_host(r, plan, sg, base, slot_dev || in_place(ip))) != WSYNC_OK)
                return rc;
            continue;
        }
        if (f->drx != NULL && wsync_ipc_drx_segment(r, f->drx, i, version, &rc)) {
            if (rc != WSYNC_OK)
                return rc;
            continue;   /* applied from the delta slot, checked against the sender's hash */
        }
        if (ip->region >= 0) {   /* straight from the sender's shard */
            const uint8_t *shard = (const uint8_t *)f->regions[ip->region].base + ip->offset;
            rc = wsync_exec_copy(shard, c->dtype, &c->src, dst, dst_dtype, &sg->dst);
        } else if (base == NULL || slot_dev || ip->cregion >= 0) {
            rc = wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: bucket %u of sender %u "
                           "came without a host slot", r->m.rank, k, c->sender);
        } else {
            rc = wsync_exec_unpack(sg, c, base, dst_dtype, dst);
        }
        if (rc != WSYNC_OK)
            return rc;
    }
    return WSYNC_OK;
}

/* One version, with the receiver in its device context when it has CUDA targets. */
wsync_status_t wsync_ipc_recv_body(wsync_receiver_t *r, ipc_receiver_t *st, uint64_t version)
{
    const uint16_t types[] = {WSYNC_MSG_READY};
    uint32_t remaining = 0, total, launched = 0, idle = 0;
    const int gpu_times = wsync_ipc_gpu_times_on();
    uint64_t bytes_done = 0, t_first = 0, t_last_ready = 0, t_cpu = 0;
    /* a quarter longer than a sender's wait for a RELEASE: a sender held up by another
     * receiver names that receiver before this wait blames the sender */
    int wait_ms = (int)WSYNC_MIN((int64_t)r->m.timeout_ms * 5 / 4, INT_MAX);
    int64_t last_ms;
    wsync_status_t rc;

    for (uint32_t s = 0; s < st->nsenders; s++) {
        remaining += st->from[s].needed + (uint32_t)st->from[s].await_packed;
        memset(st->from[s].done, 0, st->from[s].nbuckets);
        st->from[s].packed = 0;
    }
    total = remaining;
    st->pend_head = st->npend = 0;
    for (uint32_t s = 0; s < st->nsenders; s++)
        if (st->from[s].drx != NULL && st->from[s].needed > 0 &&
            (rc = wsync_ipc_drx_start(r, st->from[s].drx, st->from[s].conn, version)) != WSYNC_OK)
            return rc;
    if (st->gpu && (rc = wsync_ipc_select_batches(r, st)) != WSYNC_OK)
        return rc;
    uint64_t t0 = wsync_now_ns();
    last_ms = wsync_now_ms();
    while (remaining > 0 || st->npend > 0) {
        wsync_msg_t *msg;
        ipc_from_t *f = NULL;
        uint32_t s, reaped = 0;

        if (st->npend > 0 &&
            (rc = reap(r, st, version, &bytes_done, &last_ms, &reaped)) != WSYNC_OK)
            return rc;
        if (reaped > 0)
            idle = 0;
        if (remaining == 0) {
            /* only GPU work left: poll every pending bucket (they finish in any order) */
            if (st->npend > 0 && reaped == 0) {
                if (wsync_now_ms() >= last_ms + wait_ms) {
                    struct ipc_pend *p = &st->pend[st->pend_head];
                    return wsync_err(WSYNC_ERR_TIMEOUT, "ipc: receiver %d: version %llu: bucket %u "
                                     "of sender %u did not finish on the GPU within %d ms",
                                     r->m.rank, (unsigned long long)version, p->k, p->s, wait_ms);
                }
                poll_pause(idle++);
            }
            continue;
        }
        rc = wsync_inbox_pop(&r->m.inbox, types, 1, st->npend > 0 ? 0 : last_ms + wait_ms, &msg);
        if (rc == WSYNC_ERR_TIMEOUT && st->npend > 0) {
            struct ipc_pend *p = &st->pend[st->pend_head];
            if (wsync_now_ms() >= last_ms + wait_ms)
                return wsync_err(rc, "ipc: receiver %d: version %llu: bucket %u of sender %u did "
                                 "not finish on the GPU within %d ms", r->m.rank,
                                 (unsigned long long)version, p->k, p->s, wait_ms);
            if (reaped == 0)
                poll_pause(idle++);
            continue;
        }
        if (rc == WSYNC_ERR_TIMEOUT) {
            char who[512];
            waiting_on(st, who, sizeof(who));
            return wsync_err(rc, "ipc: receiver %d: version %llu: no bucket for %d ms (%u of %u "
                             "received; waiting on %s)", r->m.rank, (unsigned long long)version,
                             wait_ms, total - remaining, total, who);
        }
        if (rc != WSYNC_OK)
            return rc;
        idle = 0;
        t_last_ready = wsync_now_ns();
        if (t_first == 0)
            t_first = t_last_ready;
        for (s = 0; s < st->nsenders && f == NULL; s++)
            if (st->from[s].conn == msg->conn)
                f = &st->from[s];
        s--;
        ipc_ready_t y;
        if ((rc = read_ready(r, st, f, s, msg, version, &y)) != WSYNC_OK)
            return rc;
        if (y.packed) {
            remaining--;
            last_ms = wsync_now_ms();
            continue;
        }
        const uint32_t k = y.k, slot = y.slot;
        uint64_t bytes = 0;
        r->torn = 1;   /* the targets no longer hold only the last version */
        if (f->gpu[k]) {
            if ((rc = launch_bucket(r, st, f, k, gpu_times)) != WSYNC_OK)
                return rc;
            launched++;
        }
        uint64_t tc = wsync_now_ns();
        if ((rc = land_host(r, f, k, slot, version, &bytes)) != WSYNC_OK)
            return rc;
        t_cpu += wsync_now_ns() - tc;
        f->done[k] = 1;
        remaining--;
        last_ms = wsync_now_ms();
        if (f->gpu[k] && !r->m.ctx->verify) {
            st->pend[st->pend_head + st->npend++] = (struct ipc_pend){s, k, bytes};
            continue;
        }
        if (f->gpu[k]) {
            /* verifying: READY's checksums are this bucket's, so finish it before the next */
            char what[128];
            snprintf(what, sizeof(what), "ipc: receiver %d: version %llu: bucket %u of sender %u",
                     r->m.rank, (unsigned long long)version, k, s);
            if ((rc = wsync_dev_event_wait(f->ev[k], wsync_deadline_in(wait_ms), what)) != WSYNC_OK)
                return rc;
        }
        if ((rc = finish_bucket(r, st, s, k, version, slot, bytes, &bytes_done)) != WSYNC_OK)
            return rc;
    }
    uint64_t t_end = wsync_now_ns();
    if (gpu_times)
        wsync_ipc_gpu_times_report(r, st, version);
    double secs = (double)(t_end - t0) / 1e9;
    uint32_t nstreams = 0;   /* the senders' streams (two each by default: sender_stream) */
    for (uint32_t i = 0; i < st->nsenders; i++)
        nstreams += (st->from[i].stream != NULL) + (st->from[i].stream2 != NULL);
    WSYNC_LOG_D("ipc: receiver %d: version %llu: %llu bytes landed in %.4f s (%.2f GB/s; %u GPU "
                "batches on %u streams, %u buckets); stages: first READY after %.3f ms, last "
                "READY at %.3f ms, CPU copies %.3f ms, last RELEASE at %.3f ms (GPU tail after "
                "last READY %.3f ms)", r->m.rank, (unsigned long long)version,
                (unsigned long long)bytes_done, secs,
                secs > 0 ? (double)bytes_done / secs / 1e9 : 0.0, launched, nstreams, total,
                t_first ? (double)(t_first - t0) / 1e6 : 0.0,
                t_last_ready ? (double)(t_last_ready - t0) / 1e6 : 0.0, (double)t_cpu / 1e6,
                (double)(t_end - t0) / 1e6,
                t_last_ready ? (double)(t_end - t_last_ready) / 1e6 : 0.0);
    return WSYNC_OK;
}
