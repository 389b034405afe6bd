/* Internal: a scheme is *how* a version travels (ipc, nccl, store). Each file in schemes/ exports
 * one wsync_scheme_ops_t. The coordinator asks every scheme to score the group (0 = cannot serve,
 * with the reason) and picks by the rules in core/negotiate.c. Schemes know nothing of each other. */
#ifndef WSYNC_SCHEMES_SCHEME_H
#define WSYNC_SCHEMES_SCHEME_H

#include <stddef.h>

#include "core/proto.h"
#include "wsync/wsync.h"

typedef struct {
    uint32_t nsenders, nreceivers;
    const wsync_hello_t *senders;    /* [nsenders], by rank */
    const wsync_hello_t *receivers;  /* [nreceivers], by rank */
    unsigned mem_kinds;              /* bit (1 << wsync_mem_t) for each memory kind described */
    /* the UUID (16 bytes) of the GPU each participant's CUDA memory is on, NULL for none */
    const uint8_t *const *sender_gpu, *const *receiver_gpu;
    /* bytes the receivers take over the bytes the senders hold that anyone takes: above 1 when
     * several receivers need the same bytes (replicas) */
    double replication;
    /* [nsenders * nreceivers] bytes receiver r takes from sender s, at s * nreceivers + r (the
     * plan's pair_bytes), NULL when unknown: every pair then counts as one that carries bytes */
    const uint64_t *pair_bytes;
} wsync_group_info_t;

typedef struct wsync_scheme_ops {
    const char *name;
    int implemented;                 /* has a data path in this version */
    /* Versions are published, not delivered: push returns once every sender published, and
     * receivers fetch when they like (the coordinator keeps a directory, admits late joiners,
     * and evicts old versions); 0: push returns when every receiver committed. */
    int async;
    /* Carries delta versions (core/delta_state.h, docs/delta.md); 0: the group's delta mode
     * resolves off (auto) or the group is refused (on). */
    int delta;
    /* 0 if the scheme cannot serve the group, else a preference (higher first). Writes the
     * reason either way ("all 4 participants share host X" / "receiver 2 is on another host"). */
    int (*score)(const wsync_group_info_t *g, char *reason, size_t len);
    wsync_status_t (*sender_setup)(wsync_sender_t *s);
    wsync_status_t (*sender_push)(wsync_sender_t *s, uint64_t version);
    void (*sender_teardown)(wsync_sender_t *s);
    wsync_status_t (*receiver_setup)(wsync_receiver_t *r);
    /* Synchronous schemes: land version `version` (its BEGIN was seen) in the targets. */
    wsync_status_t (*receiver_recv)(wsync_receiver_t *r, uint64_t version);
    /* Async schemes: land `version` (0: the newest one newer than what the receiver holds),
     * waiting up to timeout_ms for it to be published; *got is the version landed. */
    wsync_status_t (*receiver_fetch)(wsync_receiver_t *r, uint64_t version, int timeout_ms,
                                     uint64_t *got);
    void (*receiver_teardown)(wsync_receiver_t *r);
} wsync_scheme_ops_t;

extern const wsync_scheme_ops_t wsync_scheme_ipc;
extern const wsync_scheme_ops_t wsync_scheme_nccl;
extern const wsync_scheme_ops_t wsync_scheme_store;

#endif
