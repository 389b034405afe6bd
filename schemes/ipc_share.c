/* What an ipc sender shares with its receivers, and how they take it: where each chunk is read
 * from (its shard in place, in a host region or through cuda_ipc, or staged into a host or device
 * bucket slot), the slots' allocation and export and the sender's pack batches; the DATA_FDS
 * message that describes it all (written by wsync_ipc_send_fds, its descriptors counted by
 * wsync_ipc_fds_wanted, read by wsync_ipc_take_data_fds); and the receiver's side of it: every
 * read its plan makes checked to stay inside what was shared, then the memory mapped and, for
 * its kernels, pinned. Apart from ipc.c because it is the scheme's memory layout and its one
 * set-up message, both ends side by side, so that a change to the format is made in one place. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/delta_state.h"
#include "core/log.h"
#include "core/objects.h"
#include "core/util.h"
#include "kernels/device.h"
#include "schemes/ipc_delta.h"
#include "schemes/ipc_internal.h"
#include "transports/cuda_ipc.h"
#include "transports/shm.h"

/* DATA_FDS's table of shards read in place: a count, then (shard, region, offset) for each shard
 * in a host region (cuda 0) or a CUDA region (cuda 1). */
static void put_inplace_table(wsync_wbuf_t *b, const ipc_inplace_t *ip, size_t nshards,
                              uint32_t count, int cuda)
{
    wsync_put_u32(b, count);
    for (size_t i = 0; i < nshards; i++) {
        int32_t region = cuda ? ip[i].cregion : ip[i].region;
        if (region < 0)
            continue;
        wsync_put_u32(b, (uint32_t)i);
        wsync_put_u32(b, (uint32_t)region);
        wsync_put_u64(b, ip[i].offset);
    }
}

/* CUDA shards: which are read in place (exported), which are staged where. Needs every
 * receiver's DATA_HELLO. Fills want_inplace and stage_host per shard. */
static wsync_status_t plan_cuda_shards(wsync_sender_t *s, ipc_sender_t *st, uint8_t *want_inplace,
                                       uint8_t *stage_host)
{
    const wsync_plan_t *plan = s->m.plan;
    uint32_t me = (uint32_t)s->m.rank;
    uint8_t *noreach = calloc(s->nshards + 1, 1);
    wsync_status_t rc = WSYNC_OK;

    if (noreach == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
    /* our chunks are one range: each receiver's records of them in its lists */
    for (uint32_t rv = 0; rv < plan->nreceivers; rv++)
        for (uint32_t k = plan->ref0[rv]; k < plan->ref0[rv + 1]; k++) {
            uint32_t a, b;
            wsync_plan_list_range(plan, plan->refs[k].list, st->chunk_start[0],
                                  st->chunk_start[st->nbuckets], &a, &b);
            for (; a < b; a++) {
                const wsync_chunk_t *c = &plan->chunks[plan->lsegs[a].chunk];
                if (st->rflags[rv] & HELLO_HOST)
                    stage_host[c->shard] = 1;
                if (!(st->rflags[rv] & HELLO_GPU) || !st->rreach[rv])
                    noreach[c->shard] = 1;
            }
        }
    for (size_t i = 0; i < s->nshards && rc == WSYNC_OK; i++) {
        const wsync_shard_desc_t *d = &s->shards[i];
        uint64_t bytes = shard_bytes(d);
        char what[WSYNC_NAME_MAX + 16];
        if (d->mem != WSYNC_MEM_CUDA || bytes == 0)
            continue;
        stage_host[i] |= noreach[i];
        if (stage_host[i] || st->wire_shard[i])
            continue;   /* FP8 on the wire: the pack makes its bytes, into a device slot */
        snprintf(what, sizeof(what), "param '%s'", d->param.name);
        rc = wsync_cuda_export_add(st->cex, s->shard_data[i], bytes, what);
        if (rc == WSYNC_OK) {
            want_inplace[i] = 1;
        } else if (rc == WSYNC_ERR_UNSUPPORTED) {
            WSYNC_LOG_I("ipc: sender %u: staged through device buckets instead of read in place: "
                        "%s", me, wsync_last_error());
            rc = WSYNC_OK;
        }
    }
    free(noreach);
    return rc;
}

/* Where bucket slot `slot` starts as the sender's kernels see it (device slots, or the host slots
 * through their registered address). */
static uint8_t *slot_dev_base(const ipc_sender_t *st, uint32_t slot)
{
    return slot >= DEV_SLOT0 ? (uint8_t *)st->dslots + (size_t)(slot - DEV_SLOT0) * st->dslot_bytes
                             : (uint8_t *)st->shm_dev + (size_t)slot * st->slot_bytes;
}

/* FP8 on the wire, CUDA shards: one quantization per chunk of rule != 0, from the shard into its
 * codes and scales in the bucket (kernels/kernels.h), grouped by bucket to be launched with the
 * bucket's pack; each with a workspace of its own, zeroed here, whose non-finite flag the push
 * reads before READY. */
static wsync_status_t plan_wire_packs(wsync_sender_t *s, ipc_sender_t *st)
{
    const wsync_plan_t *plan = s->m.plan;
    uint32_t n = 0;
    wsync_status_t rc = WSYNC_OK;

    for (uint32_t c = st->chunk_start[0]; c < st->chunk_start[st->nbuckets]; c++)
        n += plan->chunks[c].rule != 0 && s->shards[plan->chunks[c].shard].mem == WSYNC_MEM_CUDA;
    if (n == 0)
        return WSYNC_OK;
    st->wq_start = calloc(st->nbuckets + 1, sizeof(*st->wq_start));
    st->wq = calloc(n, sizeof(*st->wq));
    st->wq_ws = calloc(n, sizeof(*st->wq_ws));
    if (st->wq_start == NULL || st->wq == NULL || st->wq_ws == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for %u FP8 packs", n);
    if ((rc = wsync_dev_malloc((size_t)n * WSYNC_KQUANT_WS_BYTES, &st->wq_mem)) != WSYNC_OK ||
        (rc = wsync_dev_memset_async(st->wq_mem, 0, (size_t)n * WSYNC_KQUANT_WS_BYTES,
                                     st->stream)) != WSYNC_OK ||
        (rc = wsync_dev_stream_sync(st->stream, wsync_deadline_in(s->m.timeout_ms),
                                    "zeroing the FP8 packs' workspaces")) != WSYNC_OK)
        return rc;
    for (uint32_t k = 0; k < st->nbuckets && rc == WSYNC_OK; k++) {
        st->wq_start[k] = st->nwq;
        for (uint32_t c = st->chunk_start[k]; c < st->chunk_start[k + 1] && rc == WSYNC_OK; c++) {
            const wsync_chunk_t *ch = &plan->chunks[c];
            if (ch->rule == 0 || s->shards[ch->shard].mem != WSYNC_MEM_CUDA)
                continue;
            if (st->slot_of[k] == NO_SLOT)
                return wsync_err(WSYNC_ERR_INTERNAL, "ipc: sender %d: bucket %u has an FP8 chunk "
                                 "but no slot", s->m.rank, k);
            rc = wsync_kernels_pack_wire_desc(plan, ch, s->shard_data[ch->shard],
                                              slot_dev_base(st, st->slot_of[k]), &st->wq[st->nwq]);
            if (rc == WSYNC_OK) {
                /* NONFINITE names the param and, for a matrix, the row in the param's rows */
                const wsync_shard_desc_t *d = &s->shards[ch->shard];
                wsync_kquant_t *q = &st->wq[st->nwq];
                q->name = d->param.name;
                if (d->param.ndim == 2 && ch->src.pitch > 0)
                    q->row_base = (uint64_t)d->box.start[0] + ch->src.off / ch->src.pitch;
                st->wq_ws[st->nwq] = (uint8_t *)st->wq_mem + (size_t)st->nwq * WSYNC_KQUANT_WS_BYTES;
                st->nwq++;
            }
        }
    }
    st->wq_start[st->nbuckets] = st->nwq;
    return rc;
}

/* Decide where every chunk is read from, assign bucket slots, allocate and share them, and (with
 * CUDA shards) build the pack batches. */
wsync_status_t wsync_ipc_plan_slots(wsync_sender_t *s, ipc_sender_t *st)
{
    const wsync_plan_t *plan = s->m.plan;
    uint32_t me = (uint32_t)s->m.rank, nhost = 0, ndev = 0;
    uint8_t *want_inplace = calloc(s->nshards + 1, 1), *stage_host = calloc(s->nshards + 1, 1);
    wsync_status_t rc = WSYNC_OK;

    if (want_inplace == NULL || stage_host == NULL) {
        rc = wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
        goto out;
    }
    if (st->device >= 0) {
        if ((rc = wsync_dev_stream_create(&st->stream)) != WSYNC_OK ||
            (rc = wsync_dev_event_create(0, &st->ev)) != WSYNC_OK ||
            (rc = wsync_cuda_exporter_create(st->device, &st->cex)) != WSYNC_OK ||
            (rc = plan_cuda_shards(s, st, want_inplace, stage_host)) != WSYNC_OK)
            goto out;
    }
    for (uint32_t k = 0; k < st->nbuckets; k++) {
        int host = 0, dev = 0;
        for (uint32_t c = st->chunk_start[k]; c < st->chunk_start[k + 1]; c++) {
            uint32_t sh = plan->chunks[c].shard;
            if (st->inplace[sh].region >= 0 || want_inplace[sh])
                continue;
            if (s->shards[sh].mem == WSYNC_MEM_CUDA && !stage_host[sh])
                dev = 1;
            else
                host = 1;
        }
        st->staged[k] = (uint8_t)(host || dev);
        st->slot_of[k] = NO_SLOT;
        if (host) {
            st->slot_of[k] = nhost++ % IPC_SLOTS;
            st->slot_bytes = WSYNC_MAX(st->slot_bytes, plan->bucket_used[st->first_bucket + k]);
        } else if (dev) {
            st->slot_of[k] = DEV_SLOT0 + ndev++ % IPC_SLOTS;
            st->dslot_bytes = WSYNC_MAX(st->dslot_bytes, plan->bucket_used[st->first_bucket + k]);
        }
    }
    st->slot_bytes = (st->slot_bytes + PAGE - 1) / PAGE * PAGE;
    st->dslot_bytes = (st->dslot_bytes + PAGE - 1) / PAGE * PAGE;
    st->nslots = WSYNC_MIN(nhost, IPC_SLOTS);
    st->ndslots = WSYNC_MIN(ndev, IPC_SLOTS);
    st->dslot_region = NO_SLOT;
    if (st->nslots > 0) {
        char label[64];
        snprintf(label, sizeof(label), "wsync-sender-%u", me);
        rc = wsync_shm_create(label, (size_t)st->nslots * st->slot_bytes, &st->shm);
        if (rc != WSYNC_OK)
            goto out;
    }
    if (st->device < 0)
        goto out;
    /* delta versions: the delta slots now, since device ones share the device slots' export */
    if (s->m.planmsg.delta == WSYNC_DELTA_MODE_ON && st->dtx == NULL &&
        (rc = wsync_ipc_dtx_create(s, st->nbuckets, st->chunk_start, IPC_SLOTS, &st->dtx)) != WSYNC_OK)
        goto out;
    uint32_t nddelta = 0, ndelta_host = 0;
    uint64_t ddelta_bytes = 0;
    if (st->dtx != NULL) {
        int fd = -1;
        nddelta = wsync_ipc_dtx_plan_device(s, st->dtx, stage_host);
        wsync_ipc_dtx_slots(st->dtx, &ndelta_host, &ddelta_bytes, &fd);
    }
    size_t dev_bytes = (size_t)st->ndslots * st->dslot_bytes + (size_t)nddelta * ddelta_bytes;

    /* CUDA shards: host slots the kernels write, device slots, exports, pack batches */
    if (st->nslots > 0) {
        rc = wsync_dev_host_register(st->shm.base, st->shm.bytes, 0, &st->shm_registered);
        if (rc == WSYNC_OK)
            rc = wsync_dev_host_device_ptr(st->shm.base, &st->shm_dev);
        if (rc != WSYNC_OK)
            goto out;
    }
    if (dev_bytes > 0) {
        if ((rc = wsync_dev_malloc(dev_bytes, &st->dslots)) != WSYNC_OK ||
            (rc = wsync_cuda_export_add(st->cex, st->dslots, dev_bytes, "the device bucket slots")) != WSYNC_OK)
            goto out;
        if (nddelta > 0)
            st->ddelta = (uint8_t *)st->dslots + (size_t)st->ndslots * st->dslot_bytes;
    }
    if ((rc = wsync_cuda_export_finish(st->cex)) != WSYNC_OK)
        goto out;
    if (dev_bytes > 0) {
        uint64_t off = 0;
        if (!wsync_cuda_export_find(st->cex, st->dslots, dev_bytes, &st->dslot_region, &off) ||
            off != 0) {
            rc = wsync_err(WSYNC_ERR_INTERNAL, "ipc: sender %u: the device slots were not exported",
                           me);
            goto out;
        }
    }
    for (size_t i = 0; i < s->nshards; i++) {
        uint32_t g;
        uint64_t off;
        if (!want_inplace[i])
            continue;
        if (!wsync_cuda_export_find(st->cex, s->shard_data[i], shard_bytes(&s->shards[i]), &g,
                                    &off)) {
            rc = wsync_err(WSYNC_ERR_INTERNAL, "ipc: sender %u: param '%s' was not exported", me,
                           s->shards[i].param.name);
            goto out;
        }
        st->inplace[i].cregion = (int32_t)g;
        st->inplace[i].offset = off;
    }
    st->pack = calloc(st->nbuckets + 1, sizeof(*st->pack));
    if (st->pack == NULL) {
        rc = wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
        goto out;
    }
    if ((rc = plan_wire_packs(s, st)) != WSYNC_OK)
        goto out;
    {
        wsync_kcopy_t *descs = NULL;
        uint32_t cap = 0;
        for (uint32_t k = 0; k < st->nbuckets && rc == WSYNC_OK; k++) {
            uint32_t n = 0, slot = st->slot_of[k];
            uint8_t *base;
            if (slot == NO_SLOT)
                continue;
            base = slot_dev_base(st, slot);
            for (uint32_t c = st->chunk_start[k]; c < st->chunk_start[k + 1]; c++) {
                const wsync_chunk_t *ch = &plan->chunks[c];
                if (s->shards[ch->shard].mem != WSYNC_MEM_CUDA ||
                    in_place(&st->inplace[ch->shard]) || ch->rule != 0)
                    continue;   /* FP8 chunks: quantized by plan_wire_packs' kernels */
                if ((rc = wsync_kcopy_reserve(&descs, &cap, n + 1)) != WSYNC_OK)
                    break;
                descs[n++] = (wsync_kcopy_t){s->shard_data[ch->shard], base + ch->bucket_off,
                                             ch->src.off, ch->src.pitch, 0, ch->src.cols,
                                             ch->src.rows, ch->src.cols, ch->dtype, ch->dtype};
            }
            if (rc == WSYNC_OK && n > 0)
                rc = wsync_dev_batch_create(descs, n, &st->pack[k]);
        }
        free(descs);
    }
out:
    free(want_inplace);
    free(stage_host);
    return rc;
}

/* Delta versions, when the group's mode is on: baselines and delta slots (after
 * wsync_ipc_plan_slots). */
wsync_status_t wsync_ipc_plan_delta(wsync_sender_t *s, ipc_sender_t *st)
{
    wsync_status_t rc = WSYNC_OK;

    if (s->m.planmsg.delta != WSYNC_DELTA_MODE_ON)
        return WSYNC_OK;
    /* (a sender with CUDA shards made them in wsync_ipc_plan_slots) */
    if (st->dtx == NULL)
        rc = wsync_ipc_dtx_create(s, st->nbuckets, st->chunk_start, IPC_SLOTS, &st->dtx);
    /* CUDA shards: encoded on the device into device or pinned host delta slots */
    if (rc == WSYNC_OK && st->device >= 0)
        rc = wsync_ipc_dtx_cuda(s, st->dtx, st->ddelta);
    return rc;
}

/* DATA_FDS to one receiver: payload: host slots (u32 nslots, u64 slot_bytes), delta slots (u32 n,
 * u64 bytes: delta versions only, else 0 and 0), host regions (u32 n,
 * u64 bytes each), host in-place shards (u32 n, then u32 shard, u32 region, u64 offset each);
 * device slots (u32 n, u64 bytes, u32 region); CUDA in-place shards (as the host ones); the
 * schedule's slots (u32 nbuckets, u32 slot each); u32 1 and the cuda_ipc description, or u32 0.
 * Descriptors: the host slots' memfd, the delta slots', the regions', then cuda_ipc's, MAX_FDS per frame (frames
 * after the first carry only FDS_MORE). */
wsync_status_t wsync_ipc_send_fds(wsync_sender_t *s, ipc_sender_t *st, uint32_t rank)
{
    wsync_wbuf_t b;
    int fds[MAX_FDS];
    const int *cfds = NULL;
    uint32_t nfds = 0, ncfds = 0, ninplace = 0, ncinplace = 0, sent = 0;
    int cuda = st->cex != NULL && wsync_cuda_export_count(st->cex) > 0 &&
               (st->rflags[rank] & HELLO_GPU) && st->rreach[rank];
    wsync_status_t rc = WSYNC_OK;

    uint32_t ndelta = 0;
    uint64_t delta_bytes = 0;
    int delta_fd = -1;
    wsync_ipc_dtx_slots(st->dtx, &ndelta, &delta_bytes, &delta_fd);
    wsync_wbuf_init(&b);
    wsync_put_u32(&b, st->nslots);
    wsync_put_u64(&b, st->slot_bytes);
    wsync_put_u32(&b, ndelta);
    wsync_put_u64(&b, delta_bytes);
    wsync_put_u32(&b, st->nregions);
    for (uint32_t g = 0; g < st->nregions; g++)
        wsync_put_u64(&b, st->region_bytes[g]);
    for (size_t i = 0; i < s->nshards; i++) {
        ninplace += st->inplace[i].region >= 0;
        ncinplace += st->inplace[i].cregion >= 0;
    }
    put_inplace_table(&b, st->inplace, s->nshards, ninplace, 0);
    wsync_put_u32(&b, st->ndslots);
    wsync_put_u64(&b, st->dslot_bytes);
    wsync_put_u32(&b, st->dslot_region);
    put_inplace_table(&b, st->inplace, s->nshards, ncinplace, 1);
    wsync_put_u32(&b, st->nbuckets);
    for (uint32_t k = 0; k < st->nbuckets; k++)
        wsync_put_u32(&b, st->slot_of[k]);
    wsync_put_u32(&b, (uint32_t)cuda);
    if (cuda)
        wsync_cuda_export_encode(st->cex, &b, &cfds, &ncfds);
    if (st->nslots > 0)
        fds[nfds++] = st->shm.fd;
    if (ndelta > 0)
        fds[nfds++] = delta_fd;
    for (uint32_t g = 0; g < st->nregions; g++)
        fds[nfds++] = st->region_fds[g];
    /* fill the first frame up with CUDA descriptors, then send the rest MAX_FDS at a time */
    while (nfds < MAX_FDS && sent < ncfds)
        fds[nfds++] = cfds[sent++];
    rc = b.err ? wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory")
               : wsync_conn_send(st->rconn[rank], WSYNC_MSG_DATA_FDS, b.data, (uint32_t)b.len, fds,
                                 (int)nfds, s->m.timeout_ms);
    wsync_wbuf_free(&b);
    while (rc == WSYNC_OK && sent < ncfds) {
        uint8_t more[4] = {0xff, 0xff, 0xff, 0xff};
        uint32_t n = WSYNC_MIN(ncfds - sent, (uint32_t)MAX_FDS);
        rc = wsync_conn_send(st->rconn[rank], WSYNC_MSG_DATA_FDS, more, sizeof(more), cfds + sent,
                             (int)n, s->m.timeout_ms);
        sent += n;
    }
    return rc;
}

/* Descriptors a DATA_FDS payload comes with (all frames together); UINT32_MAX if malformed, with
 * *why saying which part. */
uint32_t wsync_ipc_fds_wanted(const uint8_t *payload, uint32_t len, const char **why)
{
    wsync_rbuf_t rb;
    uint32_t nslots, nregions, n, host, cuda = 0;

    wsync_rbuf_init(&rb, payload, len);
    nslots = wsync_get_u32(&rb);
    (void)wsync_get_u64(&rb);
    uint32_t ndelta = wsync_get_u32(&rb);
    (void)wsync_get_u64(&rb);
    nregions = wsync_get_u32(&rb);
    if (rb.err) {
        *why = "truncated header";
        return UINT32_MAX;
    }
    if (nregions >= MAX_FDS) {
        *why = "too many host regions";
        return UINT32_MAX;
    }
    host = (nslots > 0) + (ndelta > 0) + nregions;
    for (uint32_t g = 0; g < nregions; g++)
        (void)wsync_get_u64(&rb);
    n = wsync_get_count(&rb, 16);
    for (uint32_t i = 0; i < n && !rb.err; i++)
        (void)wsync_get_bytes(&rb, 16);
    (void)wsync_get_u32(&rb);
    (void)wsync_get_u64(&rb);
    (void)wsync_get_u32(&rb);
    if (rb.err) {
        *why = "truncated host regions or host in-place shards";
        return UINT32_MAX;
    }
    n = wsync_get_count(&rb, 16);
    for (uint32_t i = 0; i < n && !rb.err; i++)
        (void)wsync_get_bytes(&rb, 16);
    n = wsync_get_count(&rb, 4);
    for (uint32_t i = 0; i < n && !rb.err; i++)
        (void)wsync_get_u32(&rb);
    if (rb.err) {
        *why = "truncated CUDA in-place shards or bucket slots";
        return UINT32_MAX;
    }
    uint32_t has_cuda = wsync_get_u32(&rb);
    if (rb.err || has_cuda > 1) {
        *why = "bad CUDA flag";
        return UINT32_MAX;
    }
    if (has_cuda) {
        /* 0 descriptors is fine: cudaMalloc memory travels as IPC handles in the payload */
        cuda = wsync_cuda_import_nfds(&rb);
        if (cuda == UINT32_MAX) {
            *why = "malformed CUDA memory description";
            return UINT32_MAX;
        }
    }
    if (host + cuda > (1u << 20)) {
        *why = "too many descriptors";
        return UINT32_MAX;
    }
    return host + cuda;
}

/* A DATA_FDS message's host memory as decoded: the bucket slots, the delta slots, the regions
 * shared whole, and how many descriptors they take (in that order, before any CUDA memory's). */
typedef struct {
    uint32_t nslots, ndelta, nregions, host_fds;
    uint64_t slot_bytes, delta_bytes;
    uint64_t region_bytes[MAX_FDS];
} ipc_shared_t;

/* DATA_FDS's header into *h, and its tables into f (in-place shards, device slots, each bucket's
 * slot) and, with CUDA memory, f->cim from fds[h->host_fds .. nfds): every field checked against
 * the plan and the descriptors that came. */
static wsync_status_t decode_data_fds(wsync_receiver_t *r, ipc_from_t *f, const uint8_t *payload,
                                      uint32_t len, int *fds, uint32_t nfds, ipc_shared_t *h)
{
    const wsync_plan_t *plan = r->m.plan;
    const int me = r->m.rank;
    wsync_rbuf_t rb;

    wsync_rbuf_init(&rb, payload, len);
    h->nslots = wsync_get_u32(&rb);
    h->slot_bytes = wsync_get_u64(&rb);
    h->ndelta = wsync_get_u32(&rb);
    h->delta_bytes = wsync_get_u64(&rb);
    h->nregions = wsync_get_u32(&rb);
    if (!rb.err && (h->ndelta > IPC_SLOTS || h->delta_bytes > (1ull << 40) ||
                    (h->ndelta > 0 && (h->delta_bytes == 0 || f->drx == NULL))))
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: malformed DATA_FDS from %s: %u "
                         "delta slots of %llu bytes%s", me, f->conn->name, h->ndelta,
                         (unsigned long long)h->delta_bytes,
                         f->drx == NULL ? " while the group's delta mode is off" : "");
    if (rb.err || h->nslots > IPC_SLOTS || h->nregions >= MAX_FDS ||
        (h->nslots > 0 && h->slot_bytes == 0) || h->slot_bytes > (1ull << 40))
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: malformed DATA_FDS from %s: %s "
                         "(%u host slots of %llu bytes, %u host regions)", me, f->conn->name,
                         rb.err ? "truncated header" : h->nslots > IPC_SLOTS ? "too many host slots"
                         : h->nregions >= MAX_FDS ? "too many host regions" : "bad host slot size",
                         h->nslots, (unsigned long long)h->slot_bytes, h->nregions);
    for (uint32_t g = 0; g < h->nregions; g++)
        h->region_bytes[g] = wsync_get_u64(&rb);
    uint32_t ninplace = wsync_get_count(&rb, 16);
    const char *why = rb.err ? "truncated host regions or host in-place shard count" : NULL;
    uint32_t maxshard = 0;
    for (uint32_t i = f->seg_start[0]; i < f->seg_start[f->nbuckets]; i++)
        maxshard = WSYNC_MAX(maxshard, plan->chunks[r->m.segs[i].chunk].shard + 1);
    f->ninplace_slots = maxshard;
    f->inplace = calloc(maxshard + 1, sizeof(*f->inplace));
    f->slot_of = calloc(f->nbuckets + 1, sizeof(*f->slot_of));
    if (f->inplace == NULL || f->slot_of == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
    for (uint32_t i = 0; i < maxshard; i++) {
        f->inplace[i].region = -1;
        f->inplace[i].cregion = -1;
    }
    for (uint32_t i = 0; i < ninplace; i++) {
        uint32_t shard = wsync_get_u32(&rb), g = wsync_get_u32(&rb);
        uint64_t off = wsync_get_u64(&rb);
        if (rb.err || g >= h->nregions) {
            why = rb.err ? "truncated host in-place shards" : "host in-place shard in no region";
            rb.err = 1;
            break;
        }
        if (shard < maxshard) {
            f->inplace[shard].region = (int32_t)g;
            f->inplace[shard].offset = off;
        }
    }
    f->ndslots = wsync_get_u32(&rb);
    f->dslot_bytes = wsync_get_u64(&rb);
    f->dslot_region = wsync_get_u32(&rb);
    if (rb.err && why == NULL)
        why = "truncated device slots";
    uint32_t ncinplace = wsync_get_count(&rb, 16);
    if (rb.err && why == NULL)
        why = "truncated CUDA in-place shard count";
    for (uint32_t i = 0; i < ncinplace && !rb.err; i++) {
        uint32_t shard = wsync_get_u32(&rb), g = wsync_get_u32(&rb);
        uint64_t off = wsync_get_u64(&rb);
        if (rb.err) {
            why = "truncated CUDA in-place shards";
        } else if (g >= (1u << 24)) {
            why = "CUDA in-place shard in an impossible region";
            rb.err = 1;
        } else if (shard < maxshard && f->inplace[shard].region < 0) {
            f->inplace[shard].cregion = (int32_t)g;
            f->inplace[shard].offset = off;
        }
    }
    uint32_t nb = wsync_get_u32(&rb);
    if (rb.err || nb != f->nbuckets || f->ndslots > IPC_SLOTS || f->dslot_bytes > (1ull << 40) ||
        (f->ndslots > 0 && f->dslot_bytes == 0))
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: malformed DATA_FDS table from %s: "
                         "%s (%u in-place, %u CUDA in-place shards; %u buckets, plan has %u; %u "
                         "device slots of %llu bytes)", me, f->conn->name,
                         why != NULL ? why : rb.err ? "truncated bucket count"
                         : nb != f->nbuckets ? "bucket count differs from the plan's"
                         : f->ndslots > IPC_SLOTS ? "too many device slots" : "bad device slot size",
                         ninplace, ncinplace, nb, f->nbuckets, f->ndslots,
                         (unsigned long long)f->dslot_bytes);
    for (uint32_t b = 0; b < nb && !rb.err; b++) {
        uint32_t slot = wsync_get_u32(&rb);
        if (rb.err) {
            why = "truncated bucket slots";
        } else if (slot != NO_SLOT && slot >= h->nslots &&
                   (slot < DEV_SLOT0 || slot - DEV_SLOT0 >= f->ndslots)) {
            why = "a bucket names a slot that was not shared";
            rb.err = 1;
        }
        f->slot_of[b] = slot;
    }
    uint32_t has_cuda = wsync_get_u32(&rb);
    h->host_fds = (h->nslots > 0) + (h->ndelta > 0) + h->nregions;
    if (rb.err || has_cuda > 1 || nfds < h->host_fds)
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: malformed DATA_FDS table from %s: "
                         "%s (%u descriptors, %u for host memory)", me, f->conn->name,
                         why != NULL ? why : rb.err ? "truncated CUDA flag"
                         : has_cuda > 1 ? "bad CUDA flag"
                         : "fewer descriptors than host memory needs", nfds, h->host_fds);
    if (has_cuda) {
        if (!(f->flags & HELLO_GPU))
            return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: %s shares CUDA memory, but "
                             "no segment from it lands in a CUDA target here", me, f->conn->name);
        wsync_status_t rc = wsync_cuda_import_open(&rb, fds + h->host_fds, nfds - h->host_fds,
                                                   r->device, f->conn->name, &f->cim);
        if (rc != WSYNC_OK)
            return rc;
    } else if (nfds != h->host_fds) {
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: malformed DATA_FDS table from %s: "
                         "%u descriptors for host memory that needs %u, and no CUDA memory", me,
                         f->conn->name, nfds, h->host_fds);
    }
    if (rb.err || wsync_rbuf_left(&rb) != 0)
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: malformed DATA_FDS table from %s: "
                         "%s", me, f->conn->name, rb.err ? "truncated CUDA memory description"
                         : "trailing bytes");
    return WSYNC_OK;
}

/* Every read our plan makes from what f's sender shared (h, f's tables) stays inside the slot
 * or region it comes from, and device memory is read only into CUDA targets. */
static wsync_status_t check_reads(wsync_receiver_t *r, ipc_from_t *f, const ipc_shared_t *h)
{
    const wsync_plan_t *plan = r->m.plan;
    const int me = r->m.rank;
    uint64_t dslots_have = 0;
    void *dslots = f->ndslots > 0 ? wsync_cuda_import_base(f->cim, f->dslot_region, &dslots_have)
                                  : NULL;
    if (f->ndslots > 0 && (dslots == NULL || dslots_have < f->ndslots * f->dslot_bytes))
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: %s's device slots are not among "
                         "the memory it shared", me, f->conn->name);
    for (uint32_t i = f->seg_start[0]; i < f->seg_start[f->nbuckets]; i++) {
        const wsync_segment_t *sg = &r->m.segs[i];
        const wsync_chunk_t *c = &plan->chunks[sg->chunk];
        const ipc_inplace_t *ip = &f->inplace[c->shard];
        uint64_t esz = wsync_dtype_size(c->dtype), limit = 0;
        uint32_t slot = f->slot_of[c->bucket];
        int dev_src = 0;
        if (in_place(ip) && c->rule != 0)
            return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: sender %u offers its shard %u "
                             "in place, but chunk %u of it travels as FP8 codes its pack makes",
                             me, c->sender, c->shard, sg->chunk);
        if (in_place(ip)) {
            /* end = offset + (off + (rows - 1) * pitch + cols) * esz, refusing any wrap: the
             * plan only promises the element count fits, not the byte count */
            uint64_t end = 0;
            int wrap = c->src.rows == 0 ||
                       wsync_mul_u64(c->src.rows - 1, c->src.pitch, &end) != 0 ||
                       wsync_add_u64(end, c->src.off, &end) != 0 ||
                       wsync_add_u64(end, c->src.cols, &end) != 0 ||
                       wsync_mul_u64(end, esz, &end) != 0 ||
                       wsync_add_u64(end, ip->offset, &end) != 0;
            if (ip->region >= 0) {
                limit = h->region_bytes[ip->region];
            } else if (wsync_cuda_import_base(f->cim, (uint32_t)ip->cregion, &limit) == NULL) {
                wrap = 1;
            }
            dev_src = ip->cregion >= 0;
            if (wrap || end > limit)
                return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: sender %u's shard %u lies "
                                 "outside the memory it shared", me, c->sender, c->shard);
        } else if (slot == NO_SLOT ||
                   (slot < DEV_SLOT0 && c->bucket_off + chunk_bytes(c) > h->slot_bytes) ||
                   (slot >= DEV_SLOT0 && c->bucket_off + chunk_bytes(c) > f->dslot_bytes)) {
            return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: sender %u's slots (%llu bytes) "
                             "cannot hold its plan", me, c->sender,
                             (unsigned long long)(slot >= DEV_SLOT0 && slot != NO_SLOT
                                                      ? f->dslot_bytes : h->slot_bytes));
        } else {
            dev_src = slot >= DEV_SLOT0;
        }
        if (dev_src && r->targets[sg->target].mem != WSYNC_MEM_CUDA)
            return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: sender %u offers param '%s' "
                             "in device memory for host target '%s'", me, c->sender,
                             r->targets[sg->target].pieces[sg->piece].param.name,
                             r->targets[sg->target].name);
    }
    return WSYNC_OK;
}

/* Map the host memory h describes from fds[0 .. h->host_fds): the bucket slots, the delta slots,
 * each region. A descriptor is taken (set to -1) as it is tried, mapped or not. */
static wsync_status_t map_host(wsync_receiver_t *r, ipc_from_t *f, const ipc_shared_t *h,
                               int *fds)
{
    char what[160];                  /* the segment being mapped, for its errors */
    const int me = r->m.rank;
    uint32_t k = 0;
    wsync_status_t rc;

    if (h->nslots > 0) {
        snprintf(what, sizeof(what), "ipc: receiver %d: %s's host slots", me, f->conn->name);
        rc = wsync_shm_map_fd(fds[k], (size_t)h->nslots * h->slot_bytes, what, &f->shm);
        fds[k++] = -1;
        if (rc != WSYNC_OK)
            return rc;
    }
    f->nslots = h->nslots;
    f->slot_bytes = h->slot_bytes;
    if (h->ndelta > 0) {
        snprintf(what, sizeof(what), "ipc: receiver %d: %s's delta slots", me, f->conn->name);
        rc = wsync_ipc_drx_map(f->drx, fds[k], h->ndelta, h->delta_bytes, what);
        fds[k++] = -1;
        if (rc != WSYNC_OK)
            return rc;
    }
    for (uint32_t g = 0; g < h->nregions; g++) {
        snprintf(what, sizeof(what), "ipc: receiver %d: %s's shared region %u", me,
                 f->conn->name, g);
        rc = wsync_shm_map_fd(fds[k], h->region_bytes[g], what, &f->regions[g]);
        fds[k++] = -1;
        if (rc != WSYNC_OK)
            return rc;
        f->nregions++;
    }
    return WSYNC_OK;
}

/* Our kernels read the mapped host memory too: pin it (read-only: it is mapped PROT_READ), and
 * hand the delta receiver the sender's delta slots (its device ones follow its device bucket
 * slots in their region; the host ones are pinned). */
static wsync_status_t pin_for_device(ipc_from_t *f)
{
    wsync_status_t rc;
    if (f->nslots > 0 &&
        ((rc = wsync_dev_host_register(f->shm.base, f->shm.bytes, 1, &f->shm_registered)) != WSYNC_OK ||
         (rc = wsync_dev_host_device_ptr(f->shm.base, &f->shm_dev)) != WSYNC_OK))
        return rc;
    for (uint32_t g = 0; g < f->nregions; g++) {
        int reg = 0;
        if ((rc = wsync_dev_host_register(f->regions[g].base, f->regions[g].bytes, 1, &reg)) != WSYNC_OK)
            return rc;
        f->region_registered[g] = (uint8_t)reg;
        if ((rc = wsync_dev_host_device_ptr(f->regions[g].base, &f->region_dev[g])) != WSYNC_OK)
            return rc;
    }
    uint64_t dhave = 0, dskip = (uint64_t)f->ndslots * f->dslot_bytes;
    const uint8_t *dbase = wsync_cuda_import_base(f->cim, f->dslot_region, &dhave);
    if (f->drx != NULL)
        return wsync_ipc_drx_cuda(f->drx, f->nbuckets,
                                  dbase != NULL && dhave > dskip ? dbase + dskip : NULL,
                                  dbase != NULL && dhave > dskip ? dhave - dskip : 0);
    return WSYNC_OK;
}

/* Map what a sender shared (bucket slots, in-place regions, CUDA memory) and check that every
 * read our plan makes from it stays inside. Takes fds[0..nfds) (closed or kept, never leaked). */
wsync_status_t wsync_ipc_take_data_fds(wsync_receiver_t *r, ipc_from_t *f,
                                        const uint8_t *payload, uint32_t len, int *fds,
                                        uint32_t nfds)
{
    ipc_shared_t h;
    wsync_status_t rc;

    memset(&h, 0, sizeof(h));
    if (f->nslots != 0 || f->nregions != 0 || f->inplace != NULL)
        rc = wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: unexpected DATA_FDS", r->m.rank);
    else if ((rc = decode_data_fds(r, f, payload, len, fds, nfds, &h)) == WSYNC_OK &&
             (rc = check_reads(r, f, &h)) == WSYNC_OK &&
             (rc = map_host(r, f, &h, fds)) == WSYNC_OK && (f->flags & HELLO_GPU))
        rc = pin_for_device(f);
    for (uint32_t i = 0; i < nfds; i++)
        if (fds[i] >= 0) {
            close(fds[i]);
            fds[i] = -1;
        }
    return rc;
}
