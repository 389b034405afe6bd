/*
 * wsync — weight synchronization from RL trainers to inference workers.
 *
 * One public header. A *sender* (trainer rank) describes the shards it holds; a *receiver*
 * (inference rank) describes the buffers it wants filled (its *targets*, each made of *pieces* of
 * params). Sender rank 0 is the *coordinator*: every participant connects to it over TCP, it
 * compiles a plan that carries each needed byte once, picks a *scheme* (how bytes travel), and
 * orders each *version*. See docs/ and DESIGN.md for the vocabulary.
 *
 * Conventions (UCX/NCCL style):
 *  - Every function returns a wsync_status_t: 0 (WSYNC_OK) on success, a negative code otherwise.
 *    wsync_last_error() then holds a sentence naming what was wrong (which param, peer, field).
 *  - Output arguments are written only on success.
 *  - create/free pairs; freeing NULL is a no-op.
 *  - Objects (ctx, sender, receiver) may be used from any thread but by one thread at a time,
 *    except where a function says otherwise. A ctx may be shared by several senders/receivers of
 *    one process and must outlive them.
 *  - Params structs are initialized with their *_INIT macro; fields left at their "unset" value
 *    are taken from the WSYNC_* environment variable named beside them, else from the default.
 *    A value set in code wins over the environment.
 */
#ifndef WSYNC_H
#define WSYNC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WSYNC_VERSION_MAJOR 0
#define WSYNC_VERSION_MINOR 1
#define WSYNC_VERSION_PATCH 0

/* ------------------------------------------------------------------------------------------ */
/* Status                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* One table gives the enum, the names and the texts (libuv style). */
#define WSYNC_STATUS_MAP(X)                                                                   \
    X(OK, 0, "success")                                                                       \
    X(ERR_INVALID, -1, "invalid argument")                                                    \
    X(ERR_NOMEM, -2, "out of memory")                                                         \
    X(ERR_TIMEOUT, -3, "deadline passed")                                                     \
    X(ERR_PEER_LOST, -4, "a peer was lost")                                                   \
    X(ERR_PROTOCOL, -5, "malformed or unexpected message")                                    \
    X(ERR_MISMATCH, -6, "descriptions of senders and receivers do not match")                 \
    X(ERR_UNSUPPORTED, -7, "operation not supported")                                         \
    X(ERR_STATE, -8, "call not valid in the object's current state")                          \
    X(ERR_IO, -9, "system call failed")                                                       \
    X(ERR_ABORTED, -10, "the group was aborted")                                              \
    X(ERR_NOT_FOUND, -11, "not found")                                                        \
    X(ERR_RANGE, -12, "value out of range")                                                   \
    X(ERR_NONFINITE, -13, "non-finite value (NaN or Inf) in a source")                        \
    X(ERR_CONFIG, -14, "invalid model configuration")                                         \
    X(ERR_DEVICE, -15, "device (CUDA) error")                                                 \
    X(ERR_TRANSPORT, -16, "transport error")                                                  \
    X(ERR_INTEGRITY, -17, "data failed its integrity check")                                  \
    X(ERR_INTERNAL, -18, "internal error")

typedef enum {
#define WSYNC_STATUS_ENUM_(name, code, text) WSYNC_##name = code,
    WSYNC_STATUS_MAP(WSYNC_STATUS_ENUM_)
#undef WSYNC_STATUS_ENUM_
} wsync_status_t;

/* Short text of a status ("deadline passed"). Never NULL; static storage; thread-safe. */
const char *wsync_status_str(wsync_status_t status);

/* Name of a status ("WSYNC_ERR_TIMEOUT"). Never NULL; static storage; thread-safe. */
const char *wsync_status_name(wsync_status_t status);

/* Detail of the last failure on the calling thread: the status text followed by what was wrong
 * ("deadline passed: receiver 2 (pid 4121) sent nothing for 30000 ms"). Empty string if no call
 * on this thread has failed. Thread-local storage, valid until the next wsync call on the thread. */
const char *wsync_last_error(void);

/* ------------------------------------------------------------------------------------------ */
/* Basic types                                                                                  */
/* ------------------------------------------------------------------------------------------ */

typedef enum {
    WSYNC_DTYPE_BF16 = 1,
    WSYNC_DTYPE_F16 = 2,
    WSYNC_DTYPE_F32 = 3,
    WSYNC_DTYPE_F8E4M3FN = 4,
    WSYNC_DTYPE_F8E5M2 = 5,
    WSYNC_DTYPE_U8 = 6,
} wsync_dtype_t;

/* Bytes per element of dtype; 0 for an unknown dtype. Thread-safe. */
size_t wsync_dtype_size(wsync_dtype_t dtype);
/* "bf16", "f16", "f32", "f8e4m3fn", "f8e5m2", "u8"; "?" for an unknown dtype. Thread-safe. */
const char *wsync_dtype_name(wsync_dtype_t dtype);
/* Parse a dtype name as printed by wsync_dtype_name (also "bfloat16", "float32", ...).
 * Returns WSYNC_OK or WSYNC_ERR_INVALID. */
wsync_status_t wsync_dtype_parse(const char *name, wsync_dtype_t *dtype);

typedef enum {
    WSYNC_MEM_HOST = 0, /* ordinary host memory (malloc, mmap, pinned) */
    WSYNC_MEM_CUDA = 1, /* CUDA device memory on `device` */
} wsync_mem_t;

#define WSYNC_MAX_DIMS 4

/* One logical tensor of the model, by its checkpoint name. */
typedef struct {
    const char *name;                /* "model.layers.3.self_attn.q_proj.weight" */
    wsync_dtype_t dtype;             /* dtype as held by the senders */
    int ndim;                        /* 1..WSYNC_MAX_DIMS */
    int64_t shape[WSYNC_MAX_DIMS];   /* global shape */
} wsync_param_t;

/* A rectangular region of a param: start[d] .. start[d]+len[d] for d < ndim. */
typedef struct {
    int64_t start[WSYNC_MAX_DIMS];
    int64_t len[WSYNC_MAX_DIMS];
} wsync_box_t;

/* What one sender holds of one param: a box, stored dense and row-major at `data`. An empty box
 * (some len 0) is allowed and holds nothing (e.g. the last FSDP shard of a short param). */
typedef struct {
    wsync_param_t param;
    wsync_box_t box;
    const void *data;                /* [box.len[0], ..., box.len[ndim-1]] of param.dtype */
    wsync_mem_t mem;
    int device;                      /* CUDA device ordinal when mem == WSYNC_MEM_CUDA */
} wsync_shard_t;

/* One piece of a target: the box `src` of `param` lands at `dst_start` of the target buffer (same
 * lengths, same number of dims as the target). `param` states what the receiver expects the param
 * to be (dtype and global shape); a difference from the senders' description is an error. */
typedef struct {
    wsync_param_t param;
    wsync_box_t src;
    int64_t dst_start[WSYNC_MAX_DIMS];
} wsync_piece_t;

/* How a target is derived from its pieces when its dtype is FP8. */
typedef enum {
    WSYNC_QUANT_NONE = 0,     /* plain copy, or a cast when dtypes differ (bf16/f16/f32) */
    WSYNC_QUANT_TENSOR = 1,   /* one fp32 scale = amax/fmax over the whole target */
    WSYNC_QUANT_CHANNEL = 2,  /* one fp32 scale per row: [rows, 1] */
    WSYNC_QUANT_BLOCK = 3,    /* one fp32 scale per block_rows x block_cols block */
} wsync_quant_scheme_t;

typedef struct {
    wsync_quant_scheme_t scheme;
    int block_rows, block_cols;  /* WSYNC_QUANT_BLOCK: 0 → 128 x 128 */
    float eps;                   /* floor on a block's amax; <= 0 → 1e-4 (DeepGEMM, vLLM) */
    int ue8m0;                   /* round block scales up to powers of two */
    int no_saturate;             /* 1: overflow to NaN/Inf like PyTorch's plain cast; 0: clamp */
    float *scales;               /* fp32 dequantization multipliers (x ~= q * s), written at commit */
    wsync_mem_t scales_mem;
} wsync_quant_t;

/* One destination buffer of a receiver. Bytes of the buffer covered by no piece are zeroed once,
 * when the group is set up (vocab padding rows, for example). */
typedef struct {
    const char *name;                /* "model.layers.3.self_attn.qkv_proj.weight" */
    wsync_dtype_t dtype;
    int ndim;
    int64_t shape[WSYNC_MAX_DIMS];
    void *data;                      /* dense row-major, shape x dtype */
    wsync_mem_t mem;
    int device;
    const wsync_piece_t *pieces;     /* copied at add time */
    int npieces;
    wsync_quant_t quant;             /* used when dtype is FP8 */
} wsync_target_t;

/* ------------------------------------------------------------------------------------------ */
/* Context                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct wsync_ctx wsync_ctx_t;

typedef enum {
    WSYNC_LOG_UNSET = -1,
    WSYNC_LOG_ERROR = 0,
    WSYNC_LOG_WARN = 1,
    WSYNC_LOG_INFO = 2,
    WSYNC_LOG_DEBUG = 3,
} wsync_log_level_t;

typedef struct {
    wsync_log_level_t log_level;     /* WSYNC_LOG_LEVEL=error|warn|info|debug; default warn */
    int verify;                      /* 1: senders ship an xxh3-64 of every chunk of each version
                                        (of each 1 MiB block of each shard, with `store`) and
                                        receivers check the bytes as they land, before any cast
                                        or quantization: a mismatch refuses the version with
                                        WSYNC_ERR_INTEGRITY naming the param, sender, version and
                                        chunk. Costs one more read of every byte on each side.
                                        A receiver that verifies asks its ipc senders for the
                                        checksums; `store` senders must verify themselves.
                                        WSYNC_VERIFY=0|1; -1 = unset (0) */
} wsync_ctx_params_t;

#define WSYNC_CTX_PARAMS_INIT {WSYNC_LOG_UNSET, -1}

/* Create a context: reads the environment. Which transports work on this machine is probed later,
 * once each, when first needed: by a sender or receiver (only its scheme's transports when it asks
 * for one, through its param or WSYNC_SCHEME; all for auto) or by the info and explain calls.
 * params may be NULL (all defaults). *ctx is owned by the caller; free with wsync_ctx_free.
 * Thread-safe. */
wsync_status_t wsync_ctx_create(const wsync_ctx_params_t *params, wsync_ctx_t **ctx);

/* Free a context after every sender and receiver made from it. NULL is a no-op. */
void wsync_ctx_free(wsync_ctx_t *ctx);

/* Allocate `bytes` of host memory that same-node receivers can read in place. Shards that lie in
 * such memory are shared once with the receivers (a memfd passed over a Unix socket) and copied
 * straight into their targets: the ipc scheme then stages nothing on the sender. Any other host
 * memory works too, through staging buckets. Zero-filled. Free with wsync_mem_free before the ctx;
 * thread-safe. WSYNC_ERR_NOMEM when the memory cannot be had. */
wsync_status_t wsync_mem_alloc(wsync_ctx_t *ctx, size_t bytes, void **ptr);
/* Free memory from wsync_mem_alloc. Peers that mapped it keep their mapping until they let go.
 * NULL is a no-op. */
void wsync_mem_free(wsync_ctx_t *ctx, void *ptr);

/* What the library knows about one transport or scheme, for wsync-info. Strings are static or
 * owned by the ctx, valid while it lives. */
typedef struct {
    const char *name;        /* "shm", "ipc", ... */
    int compiled;            /* built into this library */
    int available;           /* usable on this machine now */
    const char *reason;      /* why not compiled/available, or what was found ("memfd ok") */
    const char *caps;        /* capability words, space separated ("host rma fd-pass") */
} wsync_component_info_t;

/* Number of transports (shm, tcp, cuda_ipc, nccl, ucx, ofi) known to the library. */
int wsync_transport_count(const wsync_ctx_t *ctx);
/* Describe transport i (0 <= i < count). Returns WSYNC_ERR_RANGE for a bad index. */
wsync_status_t wsync_transport_info(const wsync_ctx_t *ctx, int i, wsync_component_info_t *info);
/* Number of schemes (ipc, nccl, store) known to the library. */
int wsync_scheme_count(const wsync_ctx_t *ctx);
/* Describe scheme i. `available` tells whether it can run in this process at all. */
wsync_status_t wsync_scheme_info(const wsync_ctx_t *ctx, int i, wsync_component_info_t *info);

/* Explain which scheme a group of `nsenders` senders and `nreceivers` receivers, all on this
 * machine, with shards and targets in memory `mem`, would get, and why each other scheme would be
 * refused: the same negotiation the coordinator runs (wsync_sender_explain gives the real one).
 * Writes one line per scheme into buf. WSYNC_ERR_UNSUPPORTED (with the lines in buf and the last
 * error) when no scheme could serve. */
wsync_status_t wsync_ctx_explain(const wsync_ctx_t *ctx, wsync_mem_t mem, int nsenders,
                                 int nreceivers, char *buf, size_t len);

/* ------------------------------------------------------------------------------------------ */
/* Sender                                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef struct wsync_sender wsync_sender_t;

typedef struct {
    const char *coordinator;   /* "host:port" sender 0 listens on; WSYNC_COORDINATOR */
    int rank;                  /* sender rank in [0, nranks); WSYNC_SENDER_RANK; -1 = unset */
    int nranks;                /* number of senders; WSYNC_SENDERS; 0 = unset (1) */
    int nreceivers;            /* number of receivers; WSYNC_RECEIVERS; 0 = unset (1) */
    const char *scheme;        /* "auto", "ipc", "nccl", "store"; WSYNC_SCHEME; default auto */
    size_t bucket_bytes;       /* staging bucket size; WSYNC_BUCKET_BYTES (accepts K/M/G);
                                  default 256 MiB */
    int timeout_ms;            /* deadline of every wait; WSYNC_TIMEOUT_MS; default 60000 */
    int heartbeat_ms;          /* heartbeat period; WSYNC_HEARTBEAT_MS; default 1000 */
    int snapshot;              /* store: copy each version into registered memory so the trainer
                                  may step on at once (1), or publish the shards in place (0):
                                  registered once, no copy, but readers read the live shards, so
                                  change them only once the readers you care about have the
                                  version; WSYNC_SNAPSHOT; -1 = unset (1) */
    int keep_versions;         /* store: versions kept for readers (rank 0's value counts);
                                  WSYNC_KEEP_VERSIONS; 0 = unset (2) */
    int copy_shards;           /* 1: wsync keeps a private copy of this sender's shards, taken by
                                  each push (wsync_sender_push_begin) before it returns; the
                                  scheme reads only the copy, so the shards may change as soon
                                  as push_begin returned. Costs the shards' bytes once more, in
                                  their own kind of memory (host shards: one wsync_mem_alloc
                                  block, which same-node ipc receivers read in place; CUDA
                                  shards: one block of device memory on their device), allocated
                                  at setup, plus one memcpy (host) or device-to-device copy
                                  (CUDA) of every shard per push. 0: no copy; the shards are read
                                  in place, until the push completes (see
                                  wsync_sender_push_begin). WSYNC_COPY_SHARDS; -1 = unset (0) */
    const char *delta;         /* delta versions (docs/delta.md): "off", "on" or "auto". A
                                  receiver that holds the version this sender last sent gets only
                                  the changed elements of each chunk (checked against the new
                                  values' xxh3); any other receiver gets full bytes. The group's
                                  mode: any participant "off" -> off, else any "on" -> on, else
                                  (auto) on only where bytes are dear (nccl or store spanning
                                  hosts or namespaces); wsync_sender_explain says which and why.
                                  WSYNC_DELTA; NULL = unset ("auto") */
    const char *delta_baseline;/* where the sender keeps what it diffs against (its shards as of
                                  the last version sent) for CUDA shards: "device" (device memory
                                  on the shards' GPU) or "host" (pinned host memory); host shards
                                  always keep it in host memory. Costs the bytes of the shards
                                  with delta-capable chunks, allocated at setup when the group's
                                  mode is on. WSYNC_DELTA_BASELINE; NULL = unset ("device") */
    double delta_cutoff;       /* delta versions: a chunk travels plain when its encoding would
                                  take more than delta_cutoff x its plain bytes (the encoder
                                  stops there, so a dense chunk costs a partial pass, not a
                                  whole one). In (0, 1]; WSYNC_DELTA_CUTOFF; 0 = unset:
                                  WSYNC_DELTA_CUTOFF_HOST for host shards (the CPU codec's passes
                                  cost more than the bytes saved past that size, docs/delta.md),
                                  WSYNC_DELTA_CUTOFF_CUDA for CUDA shards (the GPU codec runs at
                                  HBM speed, far above any link). Other values (negative, above
                                  1, NaN) are refused */
    int fp8_wire;              /* FP8 on the wire (docs/fp8_wire.md): 1 lets senders quantize the
                                  chunks of FP8 targets with block or channel scales (and
                                  per-tensor ones on ipc and nccl, and through the store
                                  with 2 into host targets: the senders agree on each
                                  target's amax every version) and send
                                  codes and scales (about half the bytes; the receivers' codes
                                  and scales are the same bit for bit), where the plan allows it
                                  (whole cells), the scheme does (ipc, nccl and the store;
                                  groups with delta versions send plain values, quantized by the
                                  receivers) and it pays (ipc: not when colocated on fewer than
                                  4 GPUs, nor when its plan would move more than 0.9 x the
                                  bytes; colocated, in 2 GiB buckets unless bucket_bytes is
                                  other than the default);
                                  2: wherever the plan and scheme allow it; 0: always plain.
                                  Rank 0's value counts. WSYNC_FP8_WIRE=0|1|2; -1 = unset (1) */
} wsync_sender_params_t;

/* delta_cutoff's defaults (0 = unset), per the memory a chunk's shard is in. */
#define WSYNC_DELTA_CUTOFF_HOST 0.2
#define WSYNC_DELTA_CUTOFF_CUDA 1.0

#define WSYNC_SENDER_PARAMS_INIT {NULL, -1, 0, 0, NULL, 0, 0, 0, -1, 0, -1, NULL, NULL, 0.0, -1}

/* Create a sender. Rank 0 also starts the coordinator, listening on params->coordinator (port 0
 * picks a free port; see wsync_sender_coordinator). Other ranks connect to it, retrying until the
 * deadline. Returns WSYNC_ERR_INVALID for bad params (the message names the field),
 * WSYNC_ERR_IO if rank 0 cannot listen, WSYNC_ERR_TIMEOUT if the coordinator was not reached,
 * WSYNC_ERR_MISMATCH/ABORTED if the coordinator refused this sender (a rank claimed twice).
 * *sender is owned by the caller; free with wsync_sender_free. */
wsync_status_t wsync_sender_create(wsync_ctx_t *ctx, const wsync_sender_params_t *params,
                                   wsync_sender_t **sender);

/* Leave the group and free the sender. Shared memory it exported is released once every peer
 * unmapped it. NULL is a no-op. */
void wsync_sender_free(wsync_sender_t *sender);

/* Describe one shard this sender holds. The description (strings included) is copied; the
 * memory at shard->data is not, and must stay valid while the sender lives, and unchanged while
 * wsync reads it (during every push; with copy_shards, only inside push_begin). Only before
 * the first push or setup: WSYNC_ERR_STATE afterwards. WSYNC_ERR_INVALID names the bad field.
 * CUDA shards (mem = WSYNC_MEM_CUDA): data must be device memory of CUDA device `device` in this
 * process (WSYNC_ERR_INVALID otherwise), and all CUDA shards of one sender on one device
 * (WSYNC_ERR_UNSUPPORTED otherwise: one sender per GPU). Memory from cudaMalloc (PyTorch's
 * default allocator) or from cuMemCreate with the POSIX-fd handle type (PyTorch's expandable
 * segments) can be read in place by same-node receivers whose GPU can read this one; other device
 * memory (cudaMallocAsync pools, managed memory) is staged through bucket slots instead, with an
 * info log line. WSYNC_ERR_UNSUPPORTED when the library has no CUDA or the process no device. */
wsync_status_t wsync_sender_add_shard(wsync_sender_t *sender, const wsync_shard_t *shard);

/* Complete the group's setup now rather than at the first push: send the descriptions, wait (up
 * to the timeout) for every receiver's, receive the plan and the scheme, and set the scheme up.
 * Collective over all senders. Errors from plan compilation (an unknown param, an uncovered box,
 * a dtype or shape mismatch) arrive here, on every participant, as WSYNC_ERR_MISMATCH. */
wsync_status_t wsync_sender_setup(wsync_sender_t *sender);

/* Push version `version` (> every version pushed before) of the shards. Collective over the
 * senders (all push the same number). Returns when every receiver has committed the version —
 * or, with the `store` scheme, once every sender has published it (receivers read it later; in
 * snapshot mode the shards may change as soon as this returns).
 * Shard memory must not change until it returns (with copy_shards, only until its copy was taken:
 * see wsync_sender_push_begin). WSYNC_ERR_PEER_LOST names the lost peer;
 * WSYNC_ERR_TIMEOUT says what this sender waited for and on whom the coordinator waits;
 * WSYNC_ERR_INTEGRITY: a verifying receiver refused the version (verify in wsync_ctx_params_t).
 * After any error the group is unusable and every later call returns an error.
 * nccl: when a peer died mid-version, NCCL's kernels may wait on it for good and ncclCommAbort
 * need not return (NCCL wants every rank of a node to abort); the abort then goes on in a
 * thread of its own and may hold the CUDA driver's locks for good, so wsync makes no more CUDA
 * calls in this process (it leaks its device memory, and later wsync calls on CUDA memory fail
 * at once), and logs so. The process should then exit with _exit(), making no CUDA call of its
 * own: cudaFree waits for every kernel on the device, and any CUDA call may wait for the lock. */
wsync_status_t wsync_sender_push(wsync_sender_t *sender, uint64_t version);

/* The asynchronous push: wsync_sender_push split in two, so that the trainer computes while a
 * version travels. wsync_sender_push(s, v) does what push_begin(s, v) then push_wait(s, -1) do,
 * on the caller's thread (no thread of wsync's: the caller waits anyway).
 *
 * push_begin checks the version (WSYNC_ERR_INVALID as the push says) and the group (an earlier
 * failure is returned at once), takes the copy of the shards when copy_shards is on, then starts
 * the push of `version` on a thread of wsync's and returns WSYNC_OK; everything else the push does
 * (the first push's setup included) happens on that thread, and its outcome is push_wait's.
 * WSYNC_ERR_STATE when a push is in flight, i.e. begun and not yet reaped by a push_wait that
 * returned something other than WSYNC_ERR_TIMEOUT (the message names that version). A failure to
 * take the copy (device error, deadline) fails the group, like any push failure.
 *
 * When the trainer may write its shards again (the memory wsync_sender_add_shard described):
 *  - copy_shards = 1: as soon as push_begin returned (whatever it returned). push_begin copied
 *    every shard's bytes as they were when it was called (CUDA shards: as the device holds them:
 *    finish, or synchronize with, the work that writes them first, as for a blocking push); the
 *    copies are complete when it returns. The version the receivers get is those bytes, whatever
 *    the trainer writes afterwards.
 *  - copy_shards = 0: once push_wait returned something other than WSYNC_ERR_TIMEOUT. Until then
 *    wsync may read the shards at any moment (in place or while staging buckets), and a change
 *    may reach some receivers and not others. Reading them (a forward pass) is fine.
 *  - store scheme: its snapshot mode (the default) is a copy of its own, taken during the push;
 *    with copy_shards = 0 the rule above holds. With snapshot = 0 the store publishes the memory
 *    the scheme reads in place and readers read it after the push returned: without copy_shards
 *    that is the caller's memory (see snapshot); with it, wsync's copy, which changes only at the
 *    next push_begin.
 *
 * Between push_begin and the push_wait that reaps it, the sender belongs to wsync's thread: call
 * only push_wait and push_test on it (from one thread at a time); add_shard, setup, push,
 * push_begin and stats return WSYNC_ERR_STATE, and scheme/explain may not be called.
 * wsync_sender_free during a push aborts it (the group fails) and waits for the thread to stop.
 * Collective as the push is: every sender begins the same versions. */
wsync_status_t wsync_sender_push_begin(wsync_sender_t *sender, uint64_t version);

/* Wait up to timeout_ms (0: just look; < 0: until the push ends, which its own deadlines bound,
 * as a blocking push's) for the push begun by wsync_sender_push_begin. When it ended, returns
 * what wsync_sender_push would have returned, with the same wsync_last_error() text, and reaps
 * it (the next push may begin); on success *version (may be NULL) is the version every receiver
 * committed (store: every sender published). WSYNC_ERR_TIMEOUT only means "not yet": the push goes
 * on, nothing is reaped, wait again. WSYNC_ERR_STATE when no push is in flight. */
wsync_status_t wsync_sender_push_wait(wsync_sender_t *sender, int timeout_ms, uint64_t *version);

/* *done = 1 when the push in flight has ended (push_wait would return its outcome at once), else
 * 0. Reaps nothing. WSYNC_ERR_STATE when no push is in flight. */
wsync_status_t wsync_sender_push_test(wsync_sender_t *sender, int *done);

/* Name of the scheme chosen for the group ("ipc"), or NULL before setup. */
const char *wsync_sender_scheme(const wsync_sender_t *sender);

/* Why the scheme was chosen and why each other one was refused, one line each. Valid after
 * setup, until the sender is freed. */
const char *wsync_sender_explain(const wsync_sender_t *sender);

/* "host:port" the coordinator listens on (rank 0 only; NULL for other ranks). Useful with port 0. */
const char *wsync_sender_coordinator(const wsync_sender_t *sender);

/* Figures of the last successful push. */
typedef struct {
    uint64_t version;
    uint64_t bytes_packed;    /* bytes this sender staged into buckets */
    uint64_t bytes_delivered; /* bytes copied into all receivers' targets, from this sender
                                 (store: bytes published, which readers fetch later) */
    uint64_t buckets;         /* buckets this sender filled */
    double seconds;           /* push call to every receiver committed */
    /* Delta versions (all 0 when the group's delta mode is off). Bytes this sender's chunks put
     * on the wire for their receivers: encoded streams plus plain chunks, once per chunk a
     * receiver reads (ipc: once per chunk, however many receivers read the same slot). */
    uint64_t bytes_wire;      /* bytes_encoded + bytes_plain */
    uint64_t bytes_encoded;   /* encoded delta streams */
    uint64_t bytes_plain;     /* chunks that travelled plain (no base held, not delta-capable,
                                 or denser than the break-even point) */
    uint64_t base_version;    /* the version the delta streams were encoded against; 0: this
                                 version went full to every receiver */
} wsync_push_stats_t;

wsync_status_t wsync_sender_stats(const wsync_sender_t *sender, wsync_push_stats_t *stats);

/* ------------------------------------------------------------------------------------------ */
/* Receiver                                                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef struct wsync_receiver wsync_receiver_t;

/* Called on the thread inside wsync_receiver_wait as bytes of a version land. */
typedef void (*wsync_progress_fn)(void *arg, uint64_t version, uint64_t bytes_done,
                                  uint64_t bytes_total);

/* The per-version hook: called on the thread inside wsync_receiver_wait (or _fetch) once a
 * version has landed whole in the targets (FP8 quantized, checked), before the receiver reports
 * it committed, so that the senders' push returns only after it, and before wait returns the
 * version. An engine re-derives here what it computes from its weights after loading (MLA's
 * absorbed W_UK / W_UV, requantized or transposed copies). Return 0; anything else fails the
 * version on this receiver (WSYNC_ERR_ABORTED naming the hook's return value and the version),
 * the targets counting as torn (wsync_receiver_torn), the last committed version unchanged; the
 * group then fails as on any receiver's failure (the senders' push names this receiver). Under
 * the store scheme it runs inside wsync_receiver_fetch, after the push returned; a reader whose
 * hook failed leaves the store, which serves the others on. */
typedef int (*wsync_version_fn)(void *arg, uint64_t version);

typedef struct {
    const char *coordinator;   /* WSYNC_COORDINATOR */
    int rank;                  /* receiver rank in [0, nreceivers); WSYNC_RECEIVER_RANK */
    int nreceivers;            /* WSYNC_RECEIVERS; 0 = unset (1) */
    int timeout_ms;            /* WSYNC_TIMEOUT_MS; default 60000 */
    int heartbeat_ms;          /* WSYNC_HEARTBEAT_MS; default 1000 */
    wsync_progress_fn progress;
    void *progress_arg;
    wsync_version_fn on_version;   /* NULL: none */
    void *on_version_arg;
    const char *delta;         /* "off", "on" or "auto": this receiver's say in the group's delta
                                  mode (see wsync_sender_params_t.delta). A receiver takes a
                                  version as a delta only while its targets hold the previous one
                                  intact; wsync_receiver_set_target_data, a failed version and a
                                  new receiver take the next version in full. FP8 targets always
                                  take full bytes. WSYNC_DELTA; NULL = unset ("auto") */
} wsync_receiver_params_t;

#define WSYNC_RECEIVER_PARAMS_INIT {NULL, -1, 0, 0, 0, NULL, NULL, NULL, NULL, NULL}

/* Create a receiver and connect to the coordinator (retrying until the deadline).
 * *receiver is owned by the caller; free with wsync_receiver_free. */
wsync_status_t wsync_receiver_create(wsync_ctx_t *ctx, const wsync_receiver_params_t *params,
                                     wsync_receiver_t **receiver);

/* Leave the group and free the receiver. NULL is a no-op. */
void wsync_receiver_free(wsync_receiver_t *receiver);

/* Describe one destination buffer. The description and its pieces are copied; the buffer is
 * written by wsync_receiver_wait only. Only before setup: WSYNC_ERR_STATE afterwards.
 * CUDA targets (mem = WSYNC_MEM_CUDA): data is device memory of `device` in this process, every
 * CUDA target of one receiver on one device (WSYNC_ERR_UNSUPPORTED otherwise); an FP8 target's
 * scales may be in host or CUDA memory (quant.scales_mem; CUDA scales need a CUDA target). An FP8
 * target quantized here lands in a device staging buffer (the pieces' param dtype, or f32) that is
 * quantized on the GPU as soon as all of it has landed (at the latest at commit); where the ipc
 * scheme reads the senders' CUDA shards in place and a target's per-channel or block scale cells
 * each come whole from one sender, it is quantized straight from the shards instead, with the
 * same bytes and scales. Either way the FP8 buffer may change before the version commits (the
 * receiver reports torn if the version fails). Uncovered elements are zeroed on the device at
 * setup. */
wsync_status_t wsync_receiver_add_target(wsync_receiver_t *receiver, const wsync_target_t *target);

/* Point target `name` at another buffer (same shape and dtype), and for a quantized FP8 target at
 * another scales buffer (NULL keeps the current one), for the next versions. Only between waits.
 * This is how an engine double-buffers (shadow mode: land in the spare buffers, swap at commit)
 * or frees its weights while asleep and brings new ones on wake, without a new plan.
 * WSYNC_ERR_NOT_FOUND names an unknown target; WSYNC_ERR_INVALID for a NULL buffer. */
wsync_status_t wsync_receiver_set_target_data(wsync_receiver_t *receiver, const char *name,
                                              void *data, float *scales);

/* Wait up to timeout_ms (0: just look; < 0: the params' timeout) for the next version to begin,
 * then receive it into the targets and commit it (each step bounded by the params' timeout).
 * The first call also sends this receiver's description and sets the scheme up.
 * On success *version is the version now committed in the targets.
 * WSYNC_ERR_TIMEOUT: no version began; the targets are untouched.
 * WSYNC_ERR_PEER_LOST (a peer vanished, or stalled past the deadline in the middle of a version)
 * / WSYNC_ERR_ABORTED / WSYNC_ERR_MISMATCH / WSYNC_ERR_INTEGRITY (the bytes of the version did not
 * match the senders' checksums, with verification on): the group failed (the message says why
 * and who); a version that did not complete is never reported, and the targets may hold part of
 * it (wsync_receiver_torn says so). */
wsync_status_t wsync_receiver_wait(wsync_receiver_t *receiver, int timeout_ms, uint64_t *version);

/* Land a given version (or 0: the newest one newer than what the targets hold), waiting up to
 * timeout_ms for it to be published. `store` scheme only (elsewhere versions are pushed, and
 * wsync_receiver_wait takes them). WSYNC_ERR_NOT_FOUND when the version was evicted or never
 * published (the message says which versions the store keeps); WSYNC_ERR_TIMEOUT when it did not
 * appear in time (the targets are untouched); WSYNC_ERR_INTEGRITY when, with verification on, what
 * arrived did not match the senders' checksums: the version is refused (the targets may hold part
 * of it) and this reader may fetch again. Any other error ends this reader (not the store). */
wsync_status_t wsync_receiver_fetch(wsync_receiver_t *receiver, uint64_t version, int timeout_ms,
                                    uint64_t *got);

/* Last committed version, 0 if none. */
uint64_t wsync_receiver_version(const wsync_receiver_t *receiver);

/* 1 when a version began landing in the targets and did not complete: the targets hold neither
 * the last committed version nor a whole new one. */
int wsync_receiver_torn(const wsync_receiver_t *receiver);

/* Name of the scheme of the group, or NULL before setup. */
const char *wsync_receiver_scheme(const wsync_receiver_t *receiver);

#ifdef __cplusplus
}
#endif

#include "wsync/wsync_fp8.h"
#include "wsync/wsync_layout.h"
#include "wsync/wsync_plan.h"

#endif /* WSYNC_H */
