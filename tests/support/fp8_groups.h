/* fp8_groups: what the multi-process FP8 tests (test_fp8_wire_ipc, test_fp8_tensor_ipc) share:
 * bf16 values made from a hash, FSDP row ranges, a group of sender and receiver processes (each
 * a member with its rank and the coordinator's address) with results in shared memory, the
 * members' parameters, a sender with its rows of every param as host shards (filled per version
 * from the test's values), a receiver with poisoned targets and their references, and the
 * comparison of a target with its reference. The tests keep their own params, targets and cases.
 *
 *     static int sender_main(void *arg)
 *     {
 *         const fg_member_t *m = arg;
 *         const group_t *g = m->group;
 *         wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
 *         fg_sender_t fs;
 *         fg_sender_params(&sp, m, BUCKET, TIMEOUT_MS, g->store, 1);
 *         if (fg_sender_open(&fs, m, &sp, params, NPARAMS, value_bf16) != 0)
 *             return 1;
 *         for (uint64_t v = 1; v <= g->last; v++) {
 *             fg_sender_fill(&fs, v);
 *             ... wsync_sender_push(fs.snd, v) ...
 *         }
 *         return fg_sender_close(&fs, 0);
 *     }
 *     fg_run_group(&g, NSENDERS, sender_main, NRECV, receiver_main);
 */
#ifndef WSYNC_TEST_FP8_GROUPS_H
#define WSYNC_TEST_FP8_GROUPS_H

#include <stddef.h>
#include <stdint.h>

#include "tests/support/proc.h"
#include "wsync/wsync.h"

/* splitmix64's output for x: a hash of a param, an element and a version. */
uint64_t fg_splitmix64(uint64_t x);
/* x as bf16 bits, rounded to nearest even. */
uint16_t fg_f32_bf16(float x);
/* bf16 bits as f32 (exact). */
float fg_bf16_f32(uint16_t b);

/* A bf16 param; cols 0: 1-D of `rows` elements. The name is borrowed. */
wsync_param_t fg_bf16_param(const char *name, int64_t rows, int64_t cols);

/* A param of a test's model: bf16 [rows, cols]; cols 0: 1-D of `rows` elements. */
typedef struct {
    const char *name;
    int64_t rows, cols;
} fg_pspec_t;

/* Element (i, j) of param p in version v as bf16 bits (a 1-D param's element i: (0, i)). */
typedef uint16_t (*fg_value_fn)(int p, int64_t i, int64_t j, uint64_t v);

/* Rows [lo, hi) of param p that sender s of n holds: FSDP rows (fg_fsdp_rows), a 1-D param
 * whole on sender 0 (none on the others). */
void fg_param_rows(const fg_pspec_t *p, int s, int n, int64_t *lo, int64_t *hi);

/* One member of a group, as its process gets it. */
typedef struct {
    const void *group;               /* the test's description, the same for every member */
    int rank;                        /* among the senders, or among the receivers */
    int nsenders, nreceivers;
    char coordinator[64];            /* "127.0.0.1:port" */
} fg_member_t;

/* Runs a group on a free port: nsenders processes of sender(member), then nreceivers of
 * receiver(member); waits for them all (90 s) and CHECKs that every one exited 0, naming it.
 * Only the children create wsync objects. */
void fg_run_group(const void *group, int nsenders, proc_fn sender, int nreceivers,
                  proc_fn receiver);

/* size bytes of zeroed memory shared with the children fg_run_group forks afterwards (results
 * they write for the parent); NULL if mmap fails. Free with munmap. */
void *fg_shared(size_t size);

/* Member m's sender parameters: its rank of m->nsenders, m->nreceivers, heartbeat 200 ms, scheme
 * "ipc", or "store" over transport `store` (WSYNC_STORE_TRANSPORT, set here) with `snapshot`,
 * 4 versions kept and delta versions off (which would keep FP8 on the wire off). */
void fg_sender_params(wsync_sender_params_t *sp, const fg_member_t *m, uint64_t bucket_bytes,
                      int timeout_ms, const char *store, int snapshot);
/* Member m's receiver parameters: its rank of m->nreceivers, heartbeat 200 ms. */
void fg_receiver_params(wsync_receiver_params_t *rp, const fg_member_t *m, int timeout_ms);

#define FG_MAX_PARAMS 16

/* A sender process's sender, its params and its shards' memory. */
typedef struct {
    wsync_ctx_t *ctx;
    wsync_sender_t *snd;
    int rank, nsenders;
    const fg_pspec_t *params;        /* [nparams], the test's */
    int nparams;
    fg_value_fn value;
    uint16_t *data[FG_MAX_PARAMS];   /* host shard of param p: its rows (fg_param_rows); NULL:
                                        none */
} fg_sender_t;

/* Member m's sender (a context, then wsync_sender_create with sp: fg_sender_params's, then the
 * test's changes) with its rows of each of the
 * nparams params (at most FG_MAX_PARAMS) added as host shards. 0, or -1 after a failed CHECK
 * (fs is then closed). */
int fg_sender_open(fg_sender_t *fs, const fg_member_t *m, const wsync_sender_params_t *sp,
                   const fg_pspec_t *params, int nparams, fg_value_fn value);
/* Writes version v's values into every shard. */
void fg_sender_fill(fg_sender_t *fs, uint64_t v);
/* Push version v; a failure is noted: its status and text into *status and text[len], and, with
 * fail_ms given, how long the failed push took. Returns the push's status. */
wsync_status_t fg_push_noted(fg_sender_t *fs, uint64_t v, int *status, char *text, size_t len,
                             long long *fail_ms);
/* With `linger`, sender 0 (the coordinator's host) waits 1 s first, while the others hear why
 * the group failed. Frees the sender, its shards and context; returns the process's exit code
 * (1 if any CHECK failed in it). */
int fg_sender_close(fg_sender_t *fs, int linger);
/* 1 if sender snd's explanation holds `text`. */
int fg_explains(wsync_sender_t *snd, const char *text);

/* A receiver's target, with the buffers for its reference. */
typedef struct {
    const char *name;
    uint8_t *buf, *want;             /* [bytes]: what landed (poisoned before), the reference */
    float *scales, *want_scales;     /* [ns + 1]; scales[ns] a guard that must stay poisoned */
    size_t bytes, ns;                /* ns: 0 unless FP8 */
} fg_target_t;

/* A receiver (a context in *ctx, then wsync_receiver_create with rp: fg_receiver_params's, then
 * the test's changes), or NULL after a failed CHECK (nothing held then). */
wsync_receiver_t *fg_receiver_open(const wsync_receiver_params_t *rp, wsync_ctx_t **ctx);
/* Adds target wt to rv with its data (and, FP8, its scales) in buffers of ft's, poisoned (0xAB)
 * so that stale bytes cannot pass; wt.data and wt.quant.scales are ignored. 0, or -1 after a
 * failed CHECK. Free with fg_receiver_close. */
int fg_target_add(fg_target_t *ft, wsync_receiver_t *rv, wsync_target_t wt);
/* CHECKs that receiver r's target holds after version v its reference (want, want_scales, bit
 * for bit) and that nothing was written past its scales. */
void fg_target_check(const fg_target_t *ft, int r, uint64_t v);
/* *version = rv's version (if version is not NULL); frees rv, ctx and the nt targets' buffers;
 * returns the process's exit code (1 if any CHECK failed in it). */
int fg_receiver_close(wsync_receiver_t *rv, wsync_ctx_t *ctx, fg_target_t *ft, int nt,
                      uint64_t *version);

/* Waits until *count (shared with the other members) reaches want: 1, or 0 at timeout_ms. */
int fg_wait_count(const int *count, int want, int timeout_ms);

#endif
