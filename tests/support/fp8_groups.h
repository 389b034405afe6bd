/* fp8_groups: what the multi-process FP8 tests (test_fp8_wire_ipc, test_fp8_tensor_ipc) share:
 * bf16 values made from a hash, FSDP row ranges, a group of sender and receiver processes (each
 * a member with its rank and the coordinator's address) with results in shared memory, the
 * members' parameters and shards, and the receivers' comparison of a target with its reference.
 * The tests keep their own params, targets and cases.
 *
 *     static int sender_main(void *arg)
 *     {
 *         const fg_member_t *m = arg;
 *         const group_t *g = m->group;
 *         fg_sender_params(&sp, m, BUCKET, TIMEOUT_MS, g->store, 1);
 *         ...
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
/* Rows [lo, hi) of `rows` that FSDP sender s of n holds. */
void fg_fsdp_rows(int64_t rows, int s, int n, int64_t *lo, int64_t *hi);

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

/* Adds to snd the host shard of rows [lo, hi) of bf16 param `param` (1-D: elements) and returns
 * its buffer (malloc'd, uninitialized, the caller's to fill and free); NULL if the range is empty
 * or on failure (CHECKed). */
uint16_t *fg_add_rows(wsync_sender_t *snd, wsync_param_t param, int64_t lo, int64_t hi);

/* CHECKs that receiver r's target `name` holds after version v the n bytes `want` and the ns
 * scales `want_s`, naming the first byte or scale that differs. */
void fg_check_target(int r, uint64_t v, const char *name, const uint8_t *have,
                     const uint8_t *want, size_t n, const float *have_s, const float *want_s,
                     size_t ns);

#endif
