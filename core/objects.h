/* Internal: the sender, receiver and context objects, shared by core/ and the schemes. */
#ifndef WSYNC_CORE_OBJECTS_H
#define WSYNC_CORE_OBJECTS_H

#include "core/loop.h"
#include "core/proto.h"
#include "core/registry.h"
#include "core/util.h"
#include "reshard/plan.h"

typedef struct {
    void *base;
    size_t bytes;
    int fd;                          /* memfd behind the mapping */
} wsync_alloc_t;

struct wsync_ctx {
    wsync_log_level_t log_level;
    int verify;                      /* checksum every chunk of every version (WSYNC_VERIFY) */
    pthread_mutex_t allocs_mu;       /* wsync_mem_alloc may be called from any thread */
    wsync_alloc_t *allocs;
    size_t nallocs, allocs_cap;
    /* Transports are probed on first need (wsync_ctx_probe), once each: UCX and libfabric cost
     * 0.1-0.2 s of CPU, which hundreds of participants asking for ipc need not pay. */
    pthread_mutex_t probe_mu;
    uint32_t probed_mask;            /* bit i: transport i probed; under probe_mu */
    int transport_available[WSYNC_NTRANSPORTS];   /* these three: once probed */
    char transport_reason[WSYNC_NTRANSPORTS][256];
    char transport_caps[WSYNC_NTRANSPORTS][128];
    uint32_t transport_mask;         /* bit i: transport i probed and available; under probe_mu */
};

typedef struct wsync_coord wsync_coord_t;

typedef enum {
    WSYNC_STATE_CONNECTED = 0,       /* HELLO accepted */
    WSYNC_STATE_DESCRIBED = 1,       /* DESCRIBE sent */
    WSYNC_STATE_READY = 2,           /* plan received, scheme set up */
} wsync_obj_state_t;

/* What sender and receiver share: the control connection, the inbox, the plan. */
typedef struct {
    wsync_ctx_t *ctx;
    wsync_role_t role;
    int rank;
    int nsenders, nreceivers;
    int timeout_ms, heartbeat_ms;
    char *coordinator;
    wsync_loop_t *loop;
    wsync_conn_t *ctrl;              /* to the coordinator */
    wsync_inbox_t inbox;
    wsync_obj_state_t state;
    wsync_plan_t *plan;
    const wsync_segment_t *segs;     /* a receiver's own segments, in chunk order (the plan
                                        keeps them: wsync_plan_segments); NULL for a sender */
    uint32_t nsegs;
    wsync_plan_msg_t planmsg;        /* scheme, explanation, peers */
    uint8_t *plan_payload;           /* keeps planmsg.plan alive */
    const wsync_scheme_ops_t *scheme;
    void *scheme_state;
    /* doorbells (core/doorbell.h): the coordinator's page, if this member mapped it; bells_on
     * once the plan said the group uses it; bell_k counts the versions since then */
    struct wsync_bells *_Atomic bells;
    int bells_on;
    uint32_t bell_k;
} wsync_member_t;

struct wsync_sender {
    wsync_member_t m;
    char *scheme_choice;
    uint64_t bucket_bytes;
    int snapshot;                    /* store: copy each version into registered memory */
    int keep_versions;
    wsync_coord_t *coord;            /* rank 0 only */
    int data_listen_fd;
    char data_addr[108];
    wsync_shard_desc_t *shards;
    const void **shard_data;         /* [nshards] the caller's memory */
    size_t nshards, cap;
    uint64_t last_version;
    wsync_push_stats_t stats;
    int device;                      /* CUDA device of the CUDA shards; -1: none (host only) */
    /* copy_shards: shard_data[i] points into a private copy that push_begin refreshes from
     * user_data[i]; the scheme, set up on the copy, never reads the caller's memory. Host shards
     * in one wsync_mem_alloc block (read in place by same-node ipc receivers), CUDA shards in
     * one device block on `device`; each shard at a 256-byte aligned offset. */
    int copy_shards;
    const void **user_data;          /* [nshards] the caller's memory; NULL until the copy exists */
    void *copy_host, *copy_dev;      /* the blocks; NULL: no shard of that kind (or none yet) */
    void *copy_stream;               /* CUDA stream of the device copies */
    /* The push in flight, between push_begin and the push_wait that reaps it: run by
     * push_thread, which owns every field of the sender but job_* while job_state is RUNNING. */
    pthread_mutex_t job_mu;
    pthread_cond_t job_cv;
    pthread_t job_thread;
    int job_state;                   /* WSYNC_JOB_IDLE / RUNNING / FINISHED (not yet reaped) */
    uint64_t job_version;
    uint64_t job_t0;                 /* wsync_now_ns() at push_begin */
    wsync_status_t job_status;
    char job_text[1024];             /* wsync_last_error() of the push thread, when it failed */
    /* Delta versions (core/delta_state.h): this sender's choice (WSYNC_DELTA_MODE_*), where CUDA
     * shards' baselines live, and the baselines once a scheme set them up (group mode on). */
    uint32_t delta_choice;
    int delta_baseline_host;
    double delta_cutoff;             /* params.delta_cutoff: 0 = the default per memory kind */
    struct wsync_delta_tx *delta_tx;
};

enum { WSYNC_JOB_IDLE = 0, WSYNC_JOB_RUNNING = 1, WSYNC_JOB_FINISHED = 2 };

/* Rows [row0, row0 + rows) of a staged CUDA FP8 target, whole scale cells, whose values lie
 * in device memory the receiver's GPU reads (the sender's shard, in place): quantized from there
 * into the target by one kernel (core/quant_direct.c). */
typedef struct {
    uint32_t target;
    uint64_t row0, rows;
    const void *src;                 /* row i at src + i * src_pitch elements of src_dtype */
    uint64_t src_pitch;
    wsync_dtype_t src_dtype;
} wsync_qrun_t;

struct wsync_receiver {
    wsync_member_t m;
    wsync_target_desc_t *targets;
    void **target_data;              /* [ntargets] the caller's buffers */
    /* Where a target's bytes land during a version (Contract 2 of issue 4): its own buffer, or
     * for an FP8 target that is quantized here, a staging buffer quantized into the target at
     * commit: host f32 for a host target; for a CUDA target, device memory in its pieces' param
     * dtype when they share one of bf16/f16/f32, else f32. Always in the target's memory kind
     * (targets[i].mem, on targets[i].device). */
    void **land;                     /* [ntargets] */
    wsync_dtype_t *land_dtype;       /* [ntargets] */
    /* Bumped whenever some land[i] changes (wsync_receiver_set_target_data): a scheme that built
     * anything from the land pointers (copy batches) rebuilds it when this moved. */
    uint64_t land_gen;
    wsync_quant_t *quant;            /* [ntargets] the caller's quantization (scales pointer) */
    /* FP8 on the wire (docs/fp8_wire.md): wire[i] = 1 for a target whose every segment comes as
     * FP8 codes and scales its senders made (wsync_plan_wire_targets, set once the plan is
     * known): it lands in its own buffer (land[i] = target_data[i], land_dtype[i] its FP8
     * dtype), is never quantized here, and its scales land where wsync_receiver_wire_scales
     * says. NULL until the plan is known. */
    uint8_t *wire;
    size_t ntargets, cap;
    uint64_t version;                /* last committed */
    int torn;
    wsync_progress_fn progress;
    void *progress_arg;
    wsync_version_fn on_version;     /* the per-version hook, NULL: none (runs before COMMIT) */
    void *on_version_arg;
    /* CUDA targets (one device per receiver) */
    int device;                      /* CUDA device of the CUDA targets; -1: none */
    void *dev_stream;                /* receiver.c's stream: zeroing and quantizing */
    float **dev_scales;              /* [ntargets] device scales of a CUDA FP8 target whose scales
                                        are in host memory (copied out at commit), else NULL */
    void *dev_ws;                    /* [ntargets] quantization workspaces, WSYNC_KQUANT_WS_BYTES each */
    /* Staged CUDA FP8 targets start quantizing as soon as their last segment has landed
     * (wsync_receiver_landed), while other buckets still arrive; commit quantizes the rest. */
    uint64_t *q_need;                /* [ntargets] elements the plan lands in it per version; 0:
                                        not a staged CUDA FP8 target */
    uint64_t *q_got;                 /* [ntargets] of those, landed in this version */
    uint8_t *q_started;              /* [ntargets] quantization launched in this version */
    /* Staged CUDA FP8 targets a scheme quantizes straight from the sender's memory, run by run,
     * leaving the staging buffer unused (core/quant_direct.c). */
    uint8_t *q_direct;               /* [ntargets] 1: quantized by runs, not from land[i] */
    wsync_qrun_t *qruns;
    uint32_t nqruns, qruns_cap;
    void *qrun_ws;                   /* [nqruns] workspaces, WSYNC_KQUANT_WS_BYTES each */
    int qrun_dirty;                  /* a flag in qrun_ws may be set: clear before launching */
    /* Delta versions (core/delta_state.h): this receiver's choice (WSYNC_DELTA_MODE_*); the
     * version its targets hold intact (0: none: at start, after set_target_data, after a failed
     * version); what a scheme set up for applying deltas (group mode on). */
    uint32_t delta_choice;
    uint64_t delta_holds;
    struct wsync_delta_rx *delta_rx;
};

/* Where target i's scales land when it takes FP8 on the wire (r->wire[i]): its device staging
 * of host scales (dev_scales[i], copied out at commit) when it has one, else the caller's
 * quant.scales (host for a host target; host or device for a CUDA one, as scales_mem says). */
static inline float *wsync_receiver_wire_scales(const wsync_receiver_t *r, size_t i)
{
    return r->dev_scales != NULL && r->dev_scales[i] != NULL ? r->dev_scales[i]
                                                             : r->quant[i].scales;
}

/* An FP8 target filled by quantizing float values (rather than copying FP8 bytes). */
static inline int wsync_target_quantized(wsync_dtype_t dtype, wsync_quant_scheme_t quant)
{
    return (dtype == WSYNC_DTYPE_F8E4M3FN || dtype == WSYNC_DTYPE_F8E5M2) &&
           quant != WSYNC_QUANT_NONE;
}

/* core/receiver.c: the scheme's copies of m.segs[first, end) (its own) are complete (for CUDA
 * targets: on the device, as an event the host saw complete proves). Launches the quantization
 * of each staged CUDA FP8 target that this completes, on r->dev_stream; call it on r->device. */
wsync_status_t wsync_receiver_landed(wsync_receiver_t *r, uint32_t first, uint32_t end);

/* core/quant_direct.c: FP8 targets quantized straight from the sender's memory. A scheme that
 * reads shards in place calls begin, then for each target it can serve whole: add one run per
 * contiguous piece (checked with fits), then commit; launch each run on the stream that orders it
 * after nothing it depends on (the data is the sender's, unchanged until the commit). The
 * receiver then neither quantizes those targets from land[i] nor waits for them beyond the
 * scheme's own completion, but checks the runs' non-finite flags at commit like the rest.
 * candidates (begin): [ntargets], 1 for a staged CUDA FP8 target with per-channel or block scales
 * whose every element the plan lands each version, from q_need (so after the version's start has
 * set it up; caller frees). Call on r->device. */
wsync_status_t wsync_qdirect_begin(wsync_receiver_t *r, uint8_t **candidates);
/* Rows [row0, row0 + rows) of target t are whole rows of scale cells. */
int wsync_qdirect_fits(const wsync_receiver_t *r, uint32_t t, uint64_t row0, uint64_t rows);
wsync_status_t wsync_qdirect_add(wsync_receiver_t *r, const wsync_qrun_t *run, uint32_t *index);
/* direct[t]: every run of target t was added; workspaces for the runs. */
wsync_status_t wsync_qdirect_commit(wsync_receiver_t *r, const uint8_t *direct);
/* Runs index[0 .. n) on `stream` (few kernels for many runs, each of at most max_blocks blocks,
 * 0: no cap). */
wsync_status_t wsync_qdirect_launch(wsync_receiver_t *r, const uint32_t *index, uint32_t n,
                                    uint32_t max_blocks, void *stream);
/* At the start of a version: clear the runs' flags if the last version left them unchecked. */
wsync_status_t wsync_qdirect_clear(wsync_receiver_t *r);
/* At commit, after the scheme's streams completed: NONFINITE naming the target and the element
 * when a run saw NaN or Inf. */
wsync_status_t wsync_qdirect_check(wsync_receiver_t *r);
void wsync_qdirect_free(wsync_receiver_t *r);

/* core/member.c: connecting, HELLO, DESCRIBE and PLAN, shared by sender and receiver. */
wsync_status_t wsync_member_connect(wsync_member_t *m, const wsync_hello_t *hello);
wsync_status_t wsync_member_describe(wsync_member_t *m, const wsync_wbuf_t *desc);
/* DESCRIBE's trailer, after the shards or targets: the UUID of the GPU they are on (u32 count, 0
 * or 1, then 16 bytes), so that the coordinator can tell which participants share a GPU when it
 * picks the scheme. device < 0 (host memory only) or no CUDA: count 0. */
void wsync_member_put_gpu(wsync_wbuf_t *desc, int device);
/* Wait (until deadline) for the plan; decodes it into m->plan and m->planmsg. */
wsync_status_t wsync_member_await_plan(wsync_member_t *m, int64_t deadline_ms);
/* Record a local failure as the group's, tell the coordinator, and return st. */
wsync_status_t wsync_member_fail(wsync_member_t *m, wsync_status_t st);
void wsync_member_close(wsync_member_t *m);
/* Send a u64 (version) message to the coordinator. */
wsync_status_t wsync_member_send_u64(wsync_member_t *m, uint16_t type, uint64_t v);
/* "sender 1" / "receiver 0", for messages. */
const char *wsync_member_who(const wsync_member_t *m, char *buf, size_t len);

/* core/ctx.c: the shareable allocation holding [ptr, ptr + bytes), copied into *out; 0 if any. */
int wsync_ctx_find_alloc(wsync_ctx_t *ctx, const void *ptr, size_t bytes, wsync_alloc_t *out);

/* Probe the transports in `want` that this ctx has not probed yet (thread-safe; each is probed
 * once per ctx). Returns the bits of `want` whose transports are available. The ctx is const for
 * the public info calls: the probes fill a cache of the machine's state, under probe_mu. */
uint32_t wsync_ctx_probe(const wsync_ctx_t *ctx, uint32_t want);
/* Bits of the transports probed so far (for tests). */
uint32_t wsync_ctx_probed(const wsync_ctx_t *ctx);
/* WSYNC_SCHEME when it names a scheme (a receiver has no param for it), else NULL. */
const char *wsync_ctx_env_scheme(void);
/* core/coordinator.c */
/* fp8_wire: rank 0's param (0 off, 1 where it pays, 2 wherever the scheme and plan allow). */
wsync_status_t wsync_coord_create(const char *addr, int nsenders, int nreceivers,
                                  int heartbeat_ms, int timeout_ms, int fp8_wire,
                                  wsync_coord_t **coord);
const char *wsync_coord_address(const wsync_coord_t *coord);
void wsync_coord_free(wsync_coord_t *coord);

/* core/config.c: params resolved from code, then environment, then defaults. */
wsync_status_t wsync_config_sender(const wsync_sender_params_t *in, wsync_sender_params_t *out);
wsync_status_t wsync_config_receiver(const wsync_receiver_params_t *in, wsync_receiver_params_t *out);

#endif
