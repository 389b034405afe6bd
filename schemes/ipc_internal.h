/* Internal: what the ipc scheme's files (schemes/ipc*.c) share: the slot numbering, the
 * DATA_HELLO flags, the sender's and the receiver's state, and the functions one file calls in
 * another. ipc.c holds the scheme's table and the flow of setup and teardown; the other files each
 * hold one part of it that reads on its own (their header comments say which). */
#ifndef WSYNC_SCHEMES_IPC_INTERNAL_H
#define WSYNC_SCHEMES_IPC_INTERNAL_H

#include <stdint.h>

#include "core/objects.h"
#include "kernels/device.h"
#include "schemes/ipc_delta.h"
#include "schemes/wire_amax.h"
#include "transports/cuda_ipc.h"
#include "transports/shm.h"

#define IPC_SLOTS 2
#define DEV_SLOT0 IPC_SLOTS          /* slot numbers from here on name device slots */
#define PAGE 4096u
#define NO_SLOT UINT32_MAX
/* descriptors in one DATA_FDS frame: the bucket memfd and up to this many minus one regions;
 * shards in further regions are staged instead. CUDA descriptors follow in more frames. */
#define MAX_FDS WSYNC_MSG_MAX_FDS
#define FDS_MORE 0xffffffffu         /* a DATA_FDS frame that only brings more descriptors */

/* DATA_HELLO flags */
#define HELLO_VERIFY 1u              /* send me checksums */
#define HELLO_HOST 2u                /* segments from you land in my host targets */
#define HELLO_GPU 4u                 /* ... in my CUDA targets; the UUIDs my GPU reads follow */
#define MAX_UUIDS 64

typedef struct {
    int32_t region;                  /* index into the shared host regions, -1: not there */
    int32_t cregion;                 /* index into the shared CUDA regions, -1: not there */
    uint64_t offset;                 /* byte offset of the shard in its region */
} ipc_inplace_t;

static inline int in_place(const ipc_inplace_t *ip) { return ip->region >= 0 || ip->cregion >= 0; }

typedef struct {
    wsync_shm_t shm;
    uint32_t nslots;
    uint64_t slot_bytes;
    ipc_inplace_t *inplace;          /* [nshards] */
    int region_fds[MAX_FDS];         /* memfds of wsync_mem_alloc regions (not owned) */
    uint64_t region_bytes[MAX_FDS];
    uint32_t nregions;
    uint8_t *staged;                 /* [nbuckets] bucket has chunks to pack */
    uint32_t *slot_of;               /* [nbuckets] NO_SLOT, a host slot, or DEV_SLOT0 + device slot */
    int64_t last_in_slot[2 * IPC_SLOTS]; /* bucket whose bytes a slot holds, -1 if none */
    uint32_t nbuckets;
    uint32_t first_bucket;           /* index of this sender's bucket 0 in plan->bucket_used */
    uint32_t *chunk_start;           /* [nbuckets + 1] chunk ranges per bucket */
    uint8_t *need;                   /* [nbuckets * nreceivers] receiver r needs bucket k */
    uint32_t *pending;               /* [nbuckets] releases still due */
    uint8_t *owed;                   /* [nbuckets * nreceivers] READY sent, RELEASE not yet in */
    wsync_conn_t **rconn;            /* [nreceivers] data connections */
    uint8_t *needs_any;              /* [nreceivers] */
    int verify;                      /* READY carries the chunks' checksums */
    /* CUDA shards */
    uint32_t *rflags;                /* [nreceivers] DATA_HELLO flags */
    uint8_t *rreach;                 /* [nreceivers] its GPU can read ours */
    int device;                      /* -1: no CUDA shard */
    void *stream, *ev;
    wsync_cuda_exporter_t *cex;      /* shards read in place and the device slots */
    void *dslots;                    /* device slots, cudaMalloc (then the device delta slots) */
    void *ddelta;                    /* the device delta slots in dslots, or NULL */
    uint32_t ndslots, dslot_region;
    uint64_t dslot_bytes;
    void *shm_dev;                   /* the host slots as kernels see them (registered), or NULL */
    int shm_registered;
    wsync_kcopy_batch_t **pack;      /* [nbuckets] GPU pack of the bucket's staged CUDA chunks */
    uint8_t *scratch;                /* host copy of device bytes, for checksums */
    size_t scratch_cap;
    uint64_t gpu_pack_ns;            /* this push: time waiting for GPU packs */
    ipc_dtx_t *dtx;                  /* delta versions (schemes/ipc_delta.h), NULL: mode off */
    /* FP8 on the wire (docs/fp8_wire.md): shards with a chunk of rule != 0 are always staged */
    uint8_t *wire_shard;             /* [nshards] 1: some chunk of ours from it travels as FP8 */
    uint32_t *wq_start;              /* [nbuckets + 1] ranges of wq: CUDA chunks quantized into
                                      * the bucket by the pack, NULL: none */
    wsync_kquant_t *wq;              /* their quantizations (kernels/kernels.h) */
    void **wq_ws;                    /* [nwq] each one's device workspace, in wq_mem */
    void *wq_mem;                    /* nwq * WSYNC_KQUANT_WS_BYTES, cudaMalloc, kept zeroed */
    uint32_t nwq;
    int wq_dirty;                    /* a workspace may hold a non-finite flag: clear first */
    int64_t wire_last;               /* our last bucket with an FP8 chunk, -1: none */
    uint8_t *notify;                 /* [nreceivers] gets PACKED once wire_last passed its check:
                                      * it needs none of our buckets from wire_last on */
    /* per-tensor FP8 on the wire (schemes/wire_amax.h): the sets, built at the first version and
     * kept; the wq entries of their CUDA chunks read the agreed amaxes from amax_tx.dev */
    wsync_amax_tx_t amax_tx;
} ipc_sender_t;

typedef struct {
    wsync_conn_t *conn;
    wsync_shm_t shm;
    uint32_t nslots;
    uint64_t slot_bytes;
    wsync_shm_t regions[MAX_FDS];    /* the sender's shards, mapped read-only */
    uint32_t nregions;
    ipc_inplace_t *inplace;          /* [ninplace_slots] by the sender's shard index */
    uint32_t ninplace_slots;
    uint32_t nbuckets;               /* the sender's schedule length */
    uint32_t *seg_start;             /* [nbuckets + 1] ranges of r->m.segs per bucket */
    uint32_t *chunk_start;           /* [nbuckets + 1] ranges of plan->chunks per bucket */
    uint8_t *done;                   /* [nbuckets] landed in this version */
    uint32_t needed;                 /* buckets with segments of ours */
    int await_packed;                /* its pack quantizes FP8 chunks after our last bucket: wait
                                      * for its PACKED before committing (wire_packed_notice) */
    int packed;                      /* PACKED came in this version */
    uint32_t pid;
    /* CUDA */
    uint32_t flags;                  /* what DATA_HELLO said */
    uint32_t *slot_of;               /* [nbuckets] as the sender assigned them */
    uint32_t ndslots, dslot_region;
    uint64_t dslot_bytes;
    wsync_cuda_import_t *cim;        /* the sender's CUDA regions, opened on our device */
    void *shm_dev;                   /* host slots as our kernels see them (registered) */
    int shm_registered;
    void *region_dev[MAX_FDS];
    uint8_t region_registered[MAX_FDS];
    uint8_t *gpu;                    /* [nbuckets] bucket has segments into CUDA targets */
    wsync_kcopy_batch_t **batch[2];  /* [nbuckets] per cached set of target pointers */
    void **ev;                       /* [nbuckets] */
    void **tev;                      /* WSYNC_IPC_GPU_TIMES=1: [2 * nbuckets] timing events
                                      * around each bucket's GPU work, made at first use */
    void *stream;                    /* this sender's copies: its own stream, so that local copies
                                      * and peer reads from several senders overlap on the GPU */
    void *stream2;                   /* a second stream for its odd buckets (WSYNC_IPC_STREAMS=1: none),
                                      * so that one bucket's kernels fill the GPU while the last
                                      * blocks of the one before drain (no delta versions) */
    uint32_t *qrun_start;            /* [nbuckets + 1] ranges of qrun_list: the quantization runs
                                      * launched after bucket k's copies (their last bucket) */
    uint32_t *qrun_list;             /* run indices (r->qruns) */
    uint32_t qblocks;                /* their kernels' grid cap, as the copies' (sender_stream) */
    ipc_drx_t *drx;                  /* delta versions (schemes/ipc_delta.h), NULL: mode off */
    wsync_kcopy_batch_t **dcopy;     /* [nbuckets] the bucket's copies less its segments applied
                                      * as deltas (built when the apply's set changes) */
    /* DATA_FDS reassembly during setup */
    wsync_msg_t *first;
    int *xfds;
    uint32_t nxfds, want_fds;
} ipc_from_t;

typedef struct {
    uint32_t nsenders;
    ipc_from_t *from;                /* [nsenders] */
    uint64_t bytes_total;            /* bytes landing in our targets per version */
    uint64_t *sums;                  /* the checksums of the READY at hand */
    uint32_t sums_cap;
    /* CUDA targets */
    int gpu;                         /* some segment lands in a CUDA target */
    void *stream;
    void **cache_land[2];            /* [ntargets] the land pointers each batch set was built from */
    float **cache_scales[2];         /* [ntargets] and the wire targets' scales pointers */
    uint64_t cache_stamp[2];         /* last use, 0: empty */
    int cur;                         /* the batch set in use */
    int qruns_planned;               /* plan_qruns ran (the runs do not depend on the batch set) */
    int peer_reads;                  /* the last batch set read some source on another GPU */
    uint32_t *seg_run;               /* [m.nsegs] 1 + the run a segment is part of, or 0 */
    uint32_t *qrun_last;             /* [r->nqruns] the bucket after whose copies a run launches */
    uint64_t seen_gen, stamp;
    struct ipc_pend {
        uint32_t s, k;
        uint64_t bytes;
    } *pend;                         /* buckets launched on the GPU, not yet released (launch
                                      * order; streams per sender finish them in any order) */
    uint32_t pend_head, npend, pend_cap;
    uint8_t *scratch;
    size_t scratch_cap;
} ipc_receiver_t;

/* Bytes of a chunk in its bucket slot: its FP8 codes and scales when it travels as FP8. */
static inline uint64_t chunk_bytes(const wsync_chunk_t *c)
{
    return wsync_chunk_wire_bytes(c);
}

/* A wire chunk's bytes in its bucket, as one row of u8: what both sides hash when verifying
 * (the sender's pack made them; the shard holds something else). */
static inline wsync_region_t wire_region(const wsync_chunk_t *c)
{
    uint64_t n = wsync_chunk_wire_bytes(c);
    wsync_region_t g = {0, n, 1, n};
    return g;
}

/* Receiver: 1 when target t takes its codes and scales as its senders made them. */
static inline int wire_target(const wsync_receiver_t *r, uint32_t t)
{
    return r->wire != NULL && t < r->ntargets && r->wire[t];
}

static inline uint64_t shard_bytes(const wsync_shard_desc_t *d)
{
    uint64_t bytes = wsync_dtype_size(d->param.dtype);
    for (int k = 0; k < d->param.ndim; k++)
        bytes *= (uint64_t)d->box.len[k];
    return bytes;
}

/* FP8 on the wire: a NaN or Inf that a sender's pack finds refuses the version, so no receiver
 * may commit it before every pack that could find one is done. A receiver whose last bucket
 * from a sender comes before that sender's last bucket with an FP8 chunk would; the sender
 * sends it PACKED (a READY of bucket nbuckets, slot NO_SLOT, nothing to release) once that
 * bucket passed its check, and the receiver waits for it. Both sides find the pairs from the
 * plan: last[s] = -1 when sender s has no FP8 chunk among chunks [c0, c1), else its last bucket
 * with one (last has nsenders entries). */
static inline void wire_last_buckets(const wsync_plan_t *plan, uint32_t c0, uint32_t c1,
                                     int64_t *last)
{
    for (uint32_t s = 0; s < plan->nsenders; s++)
        last[s] = -1;
    for (uint32_t c = c0; c < c1 && c < plan->nchunks; c++)
        if (plan->chunks[c].rule != 0 && plan->chunks[c].sender < plan->nsenders)
            last[plan->chunks[c].sender] = WSYNC_MAX(last[plan->chunks[c].sender],
                                                     (int64_t)plan->chunks[c].bucket);
}

/* ---- the receiver's GPU work (ipc_cuda_rx.c) ---- */

/* The copy batch set for the targets' current pointers (one of the two kept, or a rebuilt one);
 * plans the FP8 runs quantized straight from the shards the first time. */
wsync_status_t wsync_ipc_select_batches(wsync_receiver_t *r, ipc_receiver_t *st);
/* schemes/ipc_gpu_times.c. WSYNC_IPC_GPU_TIMES=1 (read once): time every bucket's GPU work with
 * events and log, after each version, its span and the batches' times (what the debug log's
 * "GPU tail" cannot tell apart: slow kernels or gaps between them). */
int wsync_ipc_gpu_times_on(void);
/* Record the start (end 0) or end (end 1) of bucket k's GPU work of sender f on stream strm. */
wsync_status_t wsync_ipc_gpu_times_mark(ipc_from_t *f, uint32_t k, int end, void *strm);
/* After a version whose GPU work has all finished: the log line. */
void wsync_ipc_gpu_times_report(const wsync_receiver_t *r, const ipc_receiver_t *st,
                                uint64_t version);
/* Bucket k of sender f, delta versions: launch the apply of its segments that come as deltas and
 * point *batch at the copies of the others (*batch unchanged when none does). */
wsync_status_t wsync_ipc_delta_batches(wsync_receiver_t *r, ipc_receiver_t *st, ipc_from_t *f,
                                       uint32_t k, wsync_kcopy_batch_t **batch);

/* ---- what a sender shares and how receivers take it (ipc_share.c) ---- */

/* Sender: decide where every chunk is read from, assign bucket slots, allocate and share them,
 * and (with CUDA shards) build the pack batches; with CUDA shards, needs every DATA_HELLO. */
wsync_status_t wsync_ipc_plan_slots(wsync_sender_t *s, ipc_sender_t *st);
/* Sender, delta versions (group mode on): baselines and delta slots, after _plan_slots. */
wsync_status_t wsync_ipc_plan_delta(wsync_sender_t *s, ipc_sender_t *st);
/* Sender: DATA_FDS (the description of what it shares, and the descriptors) to receiver `rank`. */
wsync_status_t wsync_ipc_send_fds(wsync_sender_t *s, ipc_sender_t *st, uint32_t rank);
/* Receiver: descriptors a DATA_FDS payload comes with (all frames together); UINT32_MAX if
 * malformed, with *why saying which part. */
uint32_t wsync_ipc_fds_wanted(const uint8_t *payload, uint32_t len, const char **why);
/* Receiver: map what sender f shared and check that every read our plan makes from it stays
 * inside. Takes fds[0..nfds) (closed or kept, never leaked). */
wsync_status_t wsync_ipc_take_data_fds(wsync_receiver_t *r, ipc_from_t *f,
                                       const uint8_t *payload, uint32_t len, int *fds,
                                       uint32_t nfds);

/* ---- the sender's version (ipc_tx.c) ---- */

/* One version: every bucket staged and announced (READY), every RELEASE in; in the sender's
 * device context when it has CUDA shards (ipc_sender_push enters it). */
wsync_status_t wsync_ipc_push_body(wsync_sender_t *s, ipc_sender_t *st, uint64_t version);

/* ---- the receiver's version (ipc_rx.c) ---- */

/* One version landed in the targets and every bucket released; in the receiver's device context
 * when it has CUDA targets (ipc_receiver_recv enters it). */
wsync_status_t wsync_ipc_recv_body(wsync_receiver_t *r, ipc_receiver_t *st, uint64_t version);

/* ---- helpers of both sides' versions (ipc.c) ---- */

/* xxh3 of a region of memory that may be on a device: copied to the host first (into *scratch,
 * grown as needed), then hashed as wsync_exec_hash does. */
wsync_status_t wsync_ipc_hash_any(const void *base, int on_device, wsync_dtype_t dtype,
                                  const wsync_region_t *g, uint8_t **scratch, size_t *cap,
                                  void *stream, int timeout_ms, uint64_t *out);
/* One bit flipped in the middle of [p, p + len), on the host or a device (fault injection). */
wsync_status_t wsync_ipc_flip_any(void *p, int on_device, size_t len, void *stream,
                                  int timeout_ms);

#endif
