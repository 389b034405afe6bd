/* The ipc receiver's GPU work for its CUDA targets, built at setup and reused every version:
 * per sender and bucket, one batch-kernel launch of the copies from where the sender's bytes lie
 * to where ours land (two sets kept, for the targets' last two pointer sets), the copies less the
 * segments that come as deltas, the FP8 targets quantized straight from the senders' shards
 * (plan_qruns), and each sender's stream and grid cap. Apart from ipc.c because none of it is
 * the protocol: it only turns the plan and what the senders shared into kernel launches, which
 * the receiver's version loop then issues. */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/objects.h"
#include "core/util.h"
#include "kernels/device.h"
#include "schemes/ipc_delta.h"
#include "schemes/ipc_internal.h"
#include "transports/cuda_ipc.h"

/* How one sender's copies share our GPU with the other senders' (each has its own stream):
 * a grid of at most one block per SM for its batch kernels, so that no launch fills every SM
 * until it drains, and peer reads (bound by NVLink latency, not by SMs) on a higher-priority
 * stream so their blocks start first and the local copies fill in around them. On 4x H200,
 * colocated FSDP-4 -> TP-4 (Qwen3-8B shape) took 6.44 ms with neither, 5.03 ms with both
 * (tests/gpu/tune.sh sweeps them). Tunable from the environment: WSYNC_IPC_BLOCKS_LOCAL and
 * WSYNC_IPC_BLOCKS_PEER (blocks per SM, 0: no cap; the peer default is shared, below),
 * WSYNC_IPC_PEER_PRIORITY (0 or 1),
 * WSYNC_IPC_STREAMS (1 or 2 streams per sender: see sender_stream). */
static double env_double(const char *name, double dflt)
{
    const char *v = getenv(name);
    char *end = NULL;
    double d = v != NULL && *v ? strtod(v, &end) : dflt;
    return v != NULL && *v && end != NULL && *end == '\0' && d >= 0 && d < 1e6 ? d : dflt;
}

/* The local copies' cap when no peer read shares the GPU: the one-block-per-SM cap is for sharing
 * with peer reads; alone, nothing to share with, so no cap (0). Measured on one H200 of a
 * 4 x H200 machine (2026-11-27, tests/gpu/tune.sh coloc1ab, Qwen3-8B shape, colocated ipc,
 * FSDP-1 -> TP-1, 3 rounds alternating, the senders' blocks in multiples of 2 MiB): uncapped
 * 1.039-1.051 x the floor, 2 blocks per SM 1.108-1.118, 4 1.113-1.122, one stream uncapped
 * 1.061-1.078; fp8-block in place 0.848 x the floor uncapped against 0.881 at 2; FSDP-2 -> TP-2
 * (two receivers on the GPU) 1.282 against 1.258, one run each; one H100 1.012-1.021 against
 * 1.054-1.064 (FSDP-2 -> TP-2 1.171 against 1.170). (Before wsync-bench's senders
 * allocated in multiples of 2 MiB the receivers read their memory a quarter slower, and 2 per SM
 * won: one H100 1.14 x against 1.17 uncapped.) */
#define IPC_BLOCKS_LOCAL_ALONE 0.0

/* Whether src, read by our kernels, is in our GPU's memory: device memory the sender shared from
 * our GPU. cudaPointerGetAttributes reports every pointer opened from another process on the
 * importing GPU, so where the sender's memory lives comes from its UUID (transports/cuda_ipc.h). */
static wsync_status_t src_local(const wsync_receiver_t *r, const ipc_from_t *f, const void *src,
                                int *local)
{
    wsync_dev_ptr_t pi = {WSYNC_DEV_PTR_HOST, -1};
    wsync_status_t rc = src != NULL ? wsync_dev_ptr_info(src, &pi) : WSYNC_OK;

    *local = rc == WSYNC_OK && pi.kind == WSYNC_DEV_PTR_DEVICE && pi.device == r->device &&
             (f->cim == NULL || wsync_cuda_import_on_device(f->cim));
    return rc;
}

/* The peer reads of all senders share this many blocks per SM (unless WSYNC_IPC_BLOCKS_PEER sets
 * each one's): each peer sender's cap is min(1, IPC_PEER_BLOCKS_TOTAL / peer senders). NVLink,
 * not SMs, bounds peer reads, so more of their blocks only take SMs from the local copies.
 * Measured on 4 x H200 (Qwen3-8B shape, ipc, byte-checked, rounds alternating, ms (x floor)):
 * colocated FSDP-4 -> TP-4 (3 peer senders) bf16 at 1 block per SM each 5.41-5.57 (1.42-1.47),
 * at 0.5 4.18-4.44 (1.10-1.17), fp8-block at 0.5 4.27-4.65 (0.98-1.08 x bf16's); FSDP-2 -> TP-2
 * colocated (1 peer) 5.96-5.99 at 1, 6.05-6.13 at 0.5; disaggregated FSDP-2 -> TP-2 (2 peers)
 * 22.81-23.02 at 1, 23.04-23.12 at 0.5 (tests/gpu/tune.sh sweep4; docs/benchmarks.md). */
#define IPC_PEER_BLOCKS_TOTAL 1.5

/* Senders whose CUDA memory is on another GPU than ours. */
static uint32_t peer_senders(const wsync_receiver_t *r)
{
    const ipc_receiver_t *st = r->m.scheme_state;
    uint32_t n = 0;

    for (uint32_t s = 0; st != NULL && s < st->nsenders; s++) {
        const ipc_from_t *f = &st->from[s];
        n += (f->flags & HELLO_GPU) && f->cim != NULL && !wsync_cuda_import_on_device(f->cim);
    }
    return n;
}

static wsync_status_t sender_stream(wsync_receiver_t *r, ipc_from_t *f, const void *src,
                                    uint32_t *max_blocks, int *peer)
{
    int sms = 0, local = 0;
    wsync_status_t rc = src_local(r, f, src, &local);

    if (rc == WSYNC_OK)
        rc = wsync_dev_sm_count(r->device, &sms);
    if (rc != WSYNC_OK)
        return rc;
    if (peer != NULL && src != NULL)
        *peer |= !local;
    const uint32_t np = local ? 0 : peer_senders(r);
    const double share = np > IPC_PEER_BLOCKS_TOTAL ? IPC_PEER_BLOCKS_TOTAL / np : 1.0;
    *max_blocks = (uint32_t)(sms * env_double(local ? "WSYNC_IPC_BLOCKS_LOCAL" : "WSYNC_IPC_BLOCKS_PEER",
                                              local ? 1.0 : share) + 0.5);
    int prio = !local && env_double("WSYNC_IPC_PEER_PRIORITY", 1) > 0;
    if (f->stream == NULL)
        rc = prio ? wsync_dev_stream_create_prio(&f->stream, 1) : wsync_dev_stream_create(&f->stream);
    /* a second stream for every sender, its odd buckets (ipc_rx.c; WSYNC_IPC_STREAMS=1: one),
     * so that one bucket's kernels fill the GPU while the last blocks of the one before drain.
     * Qwen3-8B shape colocated, 2 x H100, 2 rounds each, ms (x floor), one stream -> two: on
     * one GPU FSDP-1 -> TP-1 bf16 12.37-12.40 (1.13) -> 11.86-11.90 (1.09), fp8-block
     * 11.46 -> 10.82-10.87; FSDP-2 -> TP-2 on 2 GPUs bf16 7.83-7.85 -> 6.96-6.99 (0.90),
     * fp8-block 7.70-7.83 -> 6.81-6.88. (Before peer reads were told apart, every sender here
     * had the alone cap of 2 blocks per SM, and two streams slowed bf16: 2 x H100 7.43 -> 8.09
     * ms, 4 x H200 FSDP-4 -> TP-4 4.90 -> 5.48-5.68: not measured again on 4 GPUs.) */
    const char *sv = getenv("WSYNC_IPC_STREAMS");
    int streams = sv != NULL && *sv ? (int)env_double("WSYNC_IPC_STREAMS", 2) : 2;
    if (rc == WSYNC_OK && f->stream2 == NULL && streams >= 2)
        rc = prio ? wsync_dev_stream_create_prio(&f->stream2, 1) : wsync_dev_stream_create(&f->stream2);
    return rc;
}

/* One run being formed: the rows of target t so far from the current sender's one shard. */
typedef struct {
    int open;
    wsync_qrun_t q;
    uint32_t last_k, index;
} qrun_acc_t;

/* Close a run: pass 0 drops its target when the rows are not whole scale cells; pass 1 notes
 * the bucket it launches after. */
static void qrun_close(wsync_receiver_t *r, ipc_receiver_t *st, qrun_acc_t *a, uint8_t *cand,
                       int pass)
{
    if (!a->open)
        return;
    a->open = 0;
    if (pass == 0 && !wsync_qdirect_fits(r, a->q.target, a->q.row0, a->q.rows))
        cand[a->q.target] = 0;
    if (pass == 1) {
        r->qruns[a->index].rows = a->q.rows;
        st->qrun_last[a->index] = a->last_k;
    }
}

/* Which staged CUDA FP8 targets to quantize straight from the senders' shards, and their runs
 * (core/quant_direct.c): a target qualifies when every segment of it reads a CUDA shard in place
 * (never a bucket slot: a slot is refilled before our commit) in bf16, f16 or f32, whole rows of
 * the target, and each sender's contiguous rows of it (merged across the bucket ends the plan
 * split them at) are whole rows of scale cells. Pass 0 decides, pass 1 adds the runs. A run
 * launches on its sender's stream after the copies of its last bucket, so that bucket's event,
 * and the version, complete only after it. WSYNC_IPC_QUANT_DIRECT=0 keeps every target staged
 * (to measure one path against the other), as verification does. */
static wsync_status_t plan_qruns(wsync_receiver_t *r, ipc_receiver_t *st)
{
    const wsync_plan_t *plan = r->m.plan;
    uint8_t *cand = NULL;
    qrun_acc_t *acc = calloc(r->ntargets + 1, sizeof(*acc));
    uint32_t *run_s = NULL, ndirect = 0;
    wsync_status_t rc = acc != NULL ? WSYNC_OK : wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");

    if (rc == WSYNC_OK && st->seg_run == NULL &&
        (st->seg_run = calloc(r->m.nsegs + (size_t)1, sizeof(*st->seg_run))) == NULL)
        rc = wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
    if (rc == WSYNC_OK)
        rc = wsync_qdirect_begin(r, &cand);
    /* verifying hashes what landed, which for a run is only the shard it read: stage instead */
    if (rc == WSYNC_OK && (r->m.ctx->verify || env_double("WSYNC_IPC_QUANT_DIRECT", 1) <= 0))
        memset(cand, 0, r->ntargets);
    /* FP8 on the wire: its senders quantized it already */
    for (uint32_t t = 0; rc == WSYNC_OK && t < r->ntargets; t++)
        if (wire_target(r, t))
            cand[t] = 0;
    for (int pass = 0; pass < 2 && rc == WSYNC_OK; pass++) {
        for (uint32_t s = 0; s < st->nsenders && rc == WSYNC_OK; s++) {
            ipc_from_t *f = &st->from[s];
            memset(acc, 0, r->ntargets * sizeof(*acc));
            for (uint32_t k = 0; f->gpu != NULL && k < f->nbuckets && rc == WSYNC_OK; k++) {
                for (uint32_t i = f->seg_start[k]; i < f->seg_start[k + 1] && rc == WSYNC_OK; i++) {
                    const wsync_segment_t *sg = &r->m.segs[i];
                    const wsync_chunk_t *ch = &plan->chunks[sg->chunk];
                    const ipc_inplace_t *ip = &f->inplace[ch->shard];
                    uint32_t t = sg->target;
                    if (t >= r->ntargets || !cand[t])
                        continue;
                    const wsync_target_desc_t *td = &r->targets[t];
                    uint64_t tcols = td->ndim > 0 ? (uint64_t)td->shape[td->ndim - 1] : 1;
                    int ok = (f->flags & HELLO_GPU) && ip->cregion >= 0 &&
                             (ch->dtype == WSYNC_DTYPE_BF16 || ch->dtype == WSYNC_DTYPE_F16 ||
                              ch->dtype == WSYNC_DTYPE_F32) &&
                             sg->dst.cols == tcols && sg->dst.off % tcols == 0 &&
                             (sg->dst.rows <= 1 || sg->dst.pitch == tcols);
                    if (!ok) {
                        cand[t] = 0;   /* pass 0 only: pass 1 sees the same segments */
                        continue;
                    }
                    size_t esz = wsync_dtype_size(ch->dtype);
                    const uint8_t *src =
                        (const uint8_t *)wsync_cuda_import_base(f->cim, (uint32_t)ip->cregion, NULL) +
                        ip->offset + ch->src.off * esz;
                    uint64_t pitch = ch->src.pitch, row0 = sg->dst.off / tcols;
                    qrun_acc_t *a = &acc[t];
                    if (a->open && a->q.src_dtype == ch->dtype && a->q.src_pitch == pitch &&
                        a->q.row0 + a->q.rows == row0 &&
                        (const uint8_t *)a->q.src + a->q.rows * pitch * esz == src) {
                        a->q.rows += sg->dst.rows;   /* the rows continue past a bucket end */
                    } else {
                        qrun_close(r, st, a, cand, pass);
                        a->q = (wsync_qrun_t){t, row0, sg->dst.rows, src, pitch, ch->dtype};
                        if (pass == 1) {
                            uint32_t *q = NULL, *rs = NULL;
                            if ((rc = wsync_qdirect_add(r, &a->q, &a->index)) != WSYNC_OK)
                                break;
                            if ((q = realloc(st->qrun_last, (size_t)r->qruns_cap * sizeof(*q))) != NULL)
                                st->qrun_last = q;
                            if ((rs = realloc(run_s, (size_t)r->qruns_cap * sizeof(*rs))) != NULL)
                                run_s = rs;
                            if (q == NULL || rs == NULL) {
                                rc = wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
                                break;
                            }
                            run_s[a->index] = s;
                        }
                        a->open = 1;
                    }
                    a->last_k = k;
                    if (pass == 1)
                        st->seg_run[i] = a->index + 1;
                }
            }
            for (size_t t = 0; t < r->ntargets && rc == WSYNC_OK; t++)
                qrun_close(r, st, &acc[t], cand, pass);
        }
    }
    /* each sender's runs by the bucket they launch after */
    for (uint32_t s = 0; s < st->nsenders && rc == WSYNC_OK; s++) {
        ipc_from_t *f = &st->from[s];
        for (uint32_t j = 0; j < r->nqruns && rc == WSYNC_OK; j++)
            if (run_s[j] == s) {   /* the grid cap for a local or a peer source, and the stream */
                int peer = 0;
                rc = sender_stream(r, f, r->qruns[j].src, &f->qblocks, &peer);
                int local = !peer;
                /* peer reads quantized on half the copies' grid left more of the GPU to the
                 * local runs: 3% faster on 4 H200 (FSDP-4 -> TP-4 colocated, Qwen3-8B shape) */
                double q = local ? env_double("WSYNC_IPC_QUANT_BLOCKS_LOCAL", 1.0)
                                 : env_double("WSYNC_IPC_QUANT_BLOCKS_PEER", 0.5);
                /* alone on the GPU (no peer reads; the batch set built at setup tells), the
                 * runs get the copies' cap for that case (none: one H200, Qwen3-8B shape, FP8
                 * block, FSDP-1 -> TP-1 0.848 x the floor uncapped, 0.881 at 2 per SM) */
                const char *lv = getenv("WSYNC_IPC_BLOCKS_LOCAL");
                int sms = 0;
                if (local && !st->peer_reads && (lv == NULL || *lv == '\0') &&
                    wsync_dev_sm_count(r->device, &sms) == WSYNC_OK && sms > 0)
                    f->qblocks = (uint32_t)(sms * IPC_BLOCKS_LOCAL_ALONE + 0.5);
                if (f->qblocks > 0 && q > 0)   /* 0 (copies' or ours): no cap */
                    f->qblocks = WSYNC_MAX((uint32_t)(f->qblocks * q + 0.5), 1u);
                else
                    f->qblocks = 0;
                break;
            }
        if (rc != WSYNC_OK)
            break;
        free(f->qrun_start);
        free(f->qrun_list);
        f->qrun_start = calloc(f->nbuckets + 2, sizeof(*f->qrun_start));
        f->qrun_list = calloc(r->nqruns + 1, sizeof(*f->qrun_list));
        if (f->qrun_start == NULL || f->qrun_list == NULL) {
            rc = wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
            break;
        }
        for (uint32_t j = 0; j < r->nqruns; j++)
            if (run_s[j] == s)
                f->qrun_start[st->qrun_last[j] + 2]++;
        for (uint32_t k = 0; k < f->nbuckets; k++)
            f->qrun_start[k + 2] += f->qrun_start[k + 1];
        for (uint32_t j = 0; j < r->nqruns; j++)
            if (run_s[j] == s)
                f->qrun_list[f->qrun_start[st->qrun_last[j] + 1]++] = j;
    }
    if (rc == WSYNC_OK)
        rc = wsync_qdirect_commit(r, cand);
    for (size_t t = 0; rc == WSYNC_OK && t < r->ntargets; t++)
        ndirect += cand[t];
    if (rc == WSYNC_OK && ndirect > 0)
        WSYNC_LOG_D("ipc: receiver %d: %u FP8 targets quantized straight from the senders' shards "
                    "(%u runs)", r->m.rank, ndirect, r->nqruns);
    if (rc != WSYNC_OK && st->seg_run != NULL)
        memset(st->seg_run, 0, (r->m.nsegs + (size_t)1) * sizeof(*st->seg_run));
    free(run_s);
    free(cand);
    free(acc);
    return rc;
}

/* FP8 on the wire: the two copies of a segment of an FP8 chunk (its codes into the target, its
 * scales into the target's scale matrix, kernels/kernels.h), appended to (*descs)[*n]. The chunk
 * is always staged: its slot holds what the sender's pack made. */
static wsync_status_t wire_descs(wsync_receiver_t *r, const ipc_from_t *f,
                                 const wsync_segment_t *sg, const wsync_chunk_t *ch,
                                 wsync_kcopy_t **descs, uint32_t *cap, uint32_t *n)
{
    uint32_t slot = f->slot_of[ch->bucket];
    wsync_status_t rc;

    if (!wire_target(r, sg->target) || slot == NO_SLOT || in_place(&f->inplace[ch->shard]))
        return wsync_err(WSYNC_ERR_PROTOCOL, "ipc: receiver %d: FP8 chunk %u of sender %u for "
                         "target '%s' came %s", r->m.rank, sg->chunk, ch->sender,
                         r->targets[sg->target].name,
                         !wire_target(r, sg->target) ? "for a target not set up for FP8 on the wire"
                                                     : "without a slot");
    if ((rc = wsync_kcopy_reserve(descs, cap, *n + 2)) != WSYNC_OK)
        return rc;
    const uint8_t *bucket =
        slot >= DEV_SLOT0 ? (const uint8_t *)wsync_cuda_import_base(f->cim, f->dslot_region, NULL) +
                                (size_t)(slot - DEV_SLOT0) * f->dslot_bytes
                          : (const uint8_t *)f->shm_dev + (size_t)slot * f->slot_bytes;
    rc = wsync_kernels_unpack_wire_desc(r->m.plan, sg, ch, bucket, &r->targets[sg->target],
                                        r->target_data[sg->target],
                                        wsync_receiver_wire_scales(r, sg->target), *descs + *n);
    if (rc == WSYNC_OK)
        *n += 2;
    return rc;
}

/* The copies of bucket k of sender f into our CUDA targets, as they land now, into (*descs)[0,
 * *n) (grown as needed): from where the sender's bytes lie to where ours land. skip_delta: leave
 * out the segments that come as deltas in the READY at hand (applied by kernels/delta). */
static wsync_status_t bucket_descs(wsync_receiver_t *r, ipc_receiver_t *st, ipc_from_t *f,
                                   uint32_t k, int skip_delta, wsync_kcopy_t **descs,
                                   uint32_t *cap, uint32_t *n)
{
    const wsync_plan_t *plan = r->m.plan;
    uint32_t slot = f->slot_of[k];
    wsync_status_t rc = WSYNC_OK;

    *n = 0;
    for (uint32_t i = f->seg_start[k]; i < f->seg_start[k + 1]; i++) {
        const wsync_segment_t *sg = &r->m.segs[i];
        const wsync_chunk_t *ch = &plan->chunks[sg->chunk];
        const ipc_inplace_t *ip = &f->inplace[ch->shard];
        const uint8_t *src;
        uint64_t src_off = ch->src.off, src_pitch = ch->src.pitch;
        if (r->targets[sg->target].mem != WSYNC_MEM_CUDA || (st->seg_run != NULL && st->seg_run[i] != 0))
            continue;   /* host targets: the CPU's; runs: quantized from the shard (none
                           planned yet: batches built at setup) */
        if (skip_delta && wsync_ipc_drx_seg_delta(r, f->drx, i))
            continue;   /* applied from the delta slot */
        if (ch->rule != 0) {
            if ((rc = wire_descs(r, f, sg, ch, descs, cap, n)) != WSYNC_OK)
                break;
            continue;
        }
        if (ip->region >= 0) {
            src = (const uint8_t *)f->region_dev[ip->region] + ip->offset;
        } else if (ip->cregion >= 0) {
            src = (const uint8_t *)wsync_cuda_import_base(f->cim, (uint32_t)ip->cregion, NULL) +
                  ip->offset;
        } else {
            src = slot >= DEV_SLOT0
                      ? (const uint8_t *)wsync_cuda_import_base(f->cim, f->dslot_region, NULL) +
                            (size_t)(slot - DEV_SLOT0) * f->dslot_bytes
                      : (const uint8_t *)f->shm_dev + (size_t)slot * f->slot_bytes;
            src += ch->bucket_off;
            src_off = 0;
            src_pitch = ch->src.cols;
        }
        if ((rc = wsync_kcopy_reserve(descs, cap, *n + 1)) != WSYNC_OK)
            break;
        (*descs)[(*n)++] = (wsync_kcopy_t){src, r->land[sg->target], src_off, src_pitch,
                                           sg->dst.off, sg->dst.pitch, sg->dst.rows, sg->dst.cols,
                                           ch->dtype, r->land_dtype[sg->target]};
    }
    return rc;
}

/* Build batch set c: for every bucket with segments into CUDA targets, one kernel launch's worth
 * of copies from where the sender's bytes lie to where ours land now. */
static wsync_status_t build_batches(wsync_receiver_t *r, ipc_receiver_t *st, int c)
{
    wsync_kcopy_t *descs = NULL;
    uint32_t cap = 0, nbatches = 0, max_blocks = 0;
    uint64_t t0 = wsync_now_ns();
    wsync_status_t rc = WSYNC_OK;
    int peer = 0;   /* some source is on another GPU */

    for (uint32_t s = 0; s < st->nsenders && rc == WSYNC_OK; s++) {
        ipc_from_t *f = &st->from[s];
        if (!(f->flags & HELLO_GPU))
            continue;
        if (f->batch[c] == NULL && (f->batch[c] = calloc(f->nbuckets + 1, sizeof(void *))) == NULL) {
            rc = wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
            break;
        }
        for (uint32_t k = 0; k < f->nbuckets && rc == WSYNC_OK; k++) {
            uint32_t n = 0;
            wsync_dev_batch_free(f->batch[c][k]);
            f->batch[c][k] = NULL;
            if (!f->gpu[k])
                continue;
            rc = bucket_descs(r, st, f, k, 0, &descs, &cap, &n);
            if (rc == WSYNC_OK && n > 0 && (rc = wsync_dev_batch_create(descs, n, &f->batch[c][k])) == WSYNC_OK)
                nbatches++;
            if (rc == WSYNC_OK && n > 0 && (rc = sender_stream(r, f, descs[0].src, &max_blocks, &peer)) == WSYNC_OK)
                wsync_dev_batch_limit(f->batch[c][k], max_blocks);
        }
        if (rc == WSYNC_OK && f->stream == NULL)
            rc = sender_stream(r, f, NULL, &max_blocks, NULL);
    }
    st->peer_reads = peer;
    WSYNC_LOG_D("ipc: receiver %d: %s", r->m.rank, peer ? "some senders' memory is on another "
                "GPU (peer reads)" : "every sender's memory is on this GPU");
    /* every source on our GPU: the local copies get the cap for a GPU they do not share with peer
     * reads (unless WSYNC_IPC_BLOCKS_LOCAL says otherwise) */
    const char *lv = getenv("WSYNC_IPC_BLOCKS_LOCAL");
    int sms = 0;
    if (rc == WSYNC_OK && !peer && (lv == NULL || *lv == '\0') &&
        wsync_dev_sm_count(r->device, &sms) == WSYNC_OK)
        for (uint32_t s = 0; s < st->nsenders; s++)
            for (uint32_t k = 0; st->from[s].batch[c] != NULL && k < st->from[s].nbuckets; k++)
                if (st->from[s].batch[c][k] != NULL)
                    wsync_dev_batch_limit(st->from[s].batch[c][k],
                                          (uint32_t)(sms * IPC_BLOCKS_LOCAL_ALONE + 0.5));
    free(descs);
    if (rc != WSYNC_OK) {
        st->cache_stamp[c] = 0;
        return rc;
    }
    for (size_t i = 0; i < r->ntargets; i++) {
        st->cache_land[c][i] = r->land[i];
        st->cache_scales[c][i] =
            wire_target(r, (uint32_t)i) ? wsync_receiver_wire_scales(r, i) : NULL;
    }
    WSYNC_LOG_D("ipc: receiver %d: %u copy batches built (set %d) in %.3f ms", r->m.rank, nbatches,
                c, (double)(wsync_now_ns() - t0) / 1e6);
    return WSYNC_OK;
}

/* The batch set for the targets' current pointers: one of the two kept, or a rebuilt one. */
wsync_status_t wsync_ipc_select_batches(wsync_receiver_t *r, ipc_receiver_t *st)
{
    int hit = -1;

    /* the runs need q_need, which a version's start sets up (core/receiver.c): batches built at
     * setup, before any version, go without them, and are built again once the runs are known
     * (planning them at setup found no candidate, so no FP8 target was ever quantized in place) */
    if (!st->qruns_planned && r->q_need != NULL) {
        wsync_status_t rc = plan_qruns(r, st);
        if (rc != WSYNC_OK)
            return rc;
        st->qruns_planned = 1;
        if (r->nqruns > 0)
            st->cache_stamp[0] = st->cache_stamp[1] = 0;
    }
    /* FP8 on the wire: a target's scales may move without its data (set_target_data) */
    int scales_same = 1;
    for (size_t i = 0; i < r->ntargets && scales_same && st->cache_stamp[st->cur] != 0; i++)
        scales_same = !wire_target(r, (uint32_t)i) || r->targets[i].mem != WSYNC_MEM_CUDA ||
                      st->cache_scales[st->cur][i] == wsync_receiver_wire_scales(r, i);
    if (st->cache_stamp[st->cur] != 0 && r->land_gen == st->seen_gen && scales_same) {
        st->cache_stamp[st->cur] = ++st->stamp;
        return WSYNC_OK;
    }
    for (int c = 0; c < 2 && hit < 0; c++) {
        int same = st->cache_stamp[c] != 0;
        for (size_t i = 0; i < r->ntargets && same; i++)
            same = r->targets[i].mem != WSYNC_MEM_CUDA ||
                   (st->cache_land[c][i] == r->land[i] &&
                    (!wire_target(r, (uint32_t)i) ||
                     st->cache_scales[c][i] == wsync_receiver_wire_scales(r, i)));
        if (same)
            hit = c;
    }
    if (hit < 0) {
        wsync_status_t rc;
        hit = st->cache_stamp[0] <= st->cache_stamp[1] ? 0 : 1;
        if ((rc = build_batches(r, st, hit)) != WSYNC_OK)
            return rc;
    }
    st->cur = hit;
    st->seen_gen = r->land_gen;
    st->cache_stamp[hit] = ++st->stamp;
    return WSYNC_OK;
}

/* Delta versions, bucket k of sender f into CUDA targets: when some of its segments come as deltas
 * in the READY at hand, launch their apply on the sender's stream and point *batch at the copies
 * of the others (rebuilt only when that set, or where the targets land, changed); else leave
 * *batch, the precomputed copies of every segment. */
wsync_status_t wsync_ipc_delta_batches(wsync_receiver_t *r, ipc_receiver_t *st, ipc_from_t *f,
                                       uint32_t k, wsync_kcopy_batch_t **batch)
{
    wsync_kcopy_t *descs = NULL;
    uint32_t cap = 0, n = 0, max_blocks = 0;
    int rebuilt = 0, any = 0;
    wsync_status_t rc;

    for (uint32_t i = f->seg_start[k]; i < f->seg_start[k + 1] && !any; i++)
        any = r->targets[r->m.segs[i].target].mem == WSYNC_MEM_CUDA &&
              wsync_ipc_drx_seg_delta(r, f->drx, i);
    if (!any)
        return WSYNC_OK;
    rc = wsync_ipc_drx_gpu_launch(r, f->drx, k, f->seg_start[k], f->seg_start[k + 1], f->stream,
                                  &rebuilt);
    if (rc != WSYNC_OK)
        return rc;
    if (f->dcopy == NULL && (f->dcopy = calloc(f->nbuckets + 1, sizeof(*f->dcopy))) == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory");
    if (rebuilt) {
        wsync_dev_batch_free(f->dcopy[k]);
        f->dcopy[k] = NULL;
        rc = bucket_descs(r, st, f, k, 1, &descs, &cap, &n);
        if (rc == WSYNC_OK && n > 0)
            rc = wsync_dev_batch_create(descs, n, &f->dcopy[k]);
        if (rc == WSYNC_OK && n > 0 && (rc = sender_stream(r, f, descs[0].src, &max_blocks, NULL)) == WSYNC_OK)
            wsync_dev_batch_limit(f->dcopy[k], max_blocks);
        free(descs);
        if (rc != WSYNC_OK)
            return rc;
    }
    *batch = f->dcopy[k];
    return WSYNC_OK;
}
