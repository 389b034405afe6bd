/* Internal: a transport moves bytes (libfabric-provider style). Each file in transports/ exports
 * one wsync_transport_ops_t; the registry (core/registry.c) lists them. Transports know nothing of
 * schemes. An operation a transport lacks is a function returning WSYNC_ERR_UNSUPPORTED, never a
 * NULL pointer, and `caps` advertises only what is wired in. */
#ifndef WSYNC_TRANSPORTS_TRANSPORT_H
#define WSYNC_TRANSPORTS_TRANSPORT_H

#include <stddef.h>
#include "wsync/wsync.h"

enum {
    WSYNC_CAP_HOST_MEM = 1u << 0,   /* moves host memory */
    WSYNC_CAP_CUDA_MEM = 1u << 1,   /* moves CUDA device memory */
    WSYNC_CAP_SAME_NODE = 1u << 2,  /* peers must share a node (and network namespace) */
    WSYNC_CAP_CROSS_NODE = 1u << 3, /* peers may be on other nodes */
    WSYNC_CAP_MAP = 1u << 4,        /* exports memory a peer maps and reads in place */
    WSYNC_CAP_RMA = 1u << 5,        /* one-sided get/put */
    WSYNC_CAP_COLLECTIVE = 1u << 6, /* send/recv and broadcast groups */
    WSYNC_CAP_CONTROL = 1u << 7,    /* carries the control plane */
};

typedef struct wsync_transport_ops {
    const char *name;
    int compiled;                   /* built into this library */
    unsigned caps;
    double est_gbps;                /* rough bandwidth estimate, for ranking only */
    /* Can it run on this machine now? Writes a short reason (either way) into reason. */
    int (*probe)(char *reason, size_t reason_len);
} wsync_transport_ops_t;

extern const wsync_transport_ops_t wsync_transport_shm;
extern const wsync_transport_ops_t wsync_transport_tcp;
extern const wsync_transport_ops_t wsync_transport_cuda_ipc;
extern const wsync_transport_ops_t wsync_transport_nccl;
extern const wsync_transport_ops_t wsync_transport_ucx;
extern const wsync_transport_ops_t wsync_transport_ofi;

/* Words for caps bits ("host cuda same-node map"), into buf. */
void wsync_caps_str(unsigned caps, char *buf, size_t len);

#endif
