/* The 'nccl' scheme: registered so that negotiation can explain it; its data path comes later. */
#include <stdio.h>

#include "core/status.h"
#include "schemes/scheme.h"

static int nccl_score(const wsync_group_info_t *g, char *reason, size_t len)
{
    (void)g;
    snprintf(reason, len, "no data path in this version of wsync");
    return 0;
}

static wsync_status_t nccl_sender_setup(wsync_sender_t *s)
{
    (void)s;
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "scheme 'nccl' has no data path in this version");
}

static wsync_status_t nccl_sender_push(wsync_sender_t *s, uint64_t version)
{
    (void)s;
    (void)version;
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "scheme 'nccl' has no data path in this version");
}

static void nccl_sender_teardown(wsync_sender_t *s)
{
    (void)s;
}

static wsync_status_t nccl_receiver_setup(wsync_receiver_t *r)
{
    (void)r;
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "scheme 'nccl' has no data path in this version");
}

static wsync_status_t nccl_receiver_recv(wsync_receiver_t *r, uint64_t version)
{
    (void)r;
    (void)version;
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "scheme 'nccl' has no data path in this version");
}

static void nccl_receiver_teardown(wsync_receiver_t *r)
{
    (void)r;
}

static wsync_status_t nccl_receiver_fetch(wsync_receiver_t *r, uint64_t version, int timeout_ms,
                                         uint64_t *got)
{
    (void)version;
    (void)timeout_ms;
    (void)got;
    (void)r;
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "scheme 'nccl' has no data path in this version");
}

const wsync_scheme_ops_t wsync_scheme_nccl = {
    .name = "nccl",
    .implemented = 0,
    .score = nccl_score,
    .sender_setup = nccl_sender_setup,
    .sender_push = nccl_sender_push,
    .sender_teardown = nccl_sender_teardown,
    .receiver_setup = nccl_receiver_setup,
    .receiver_recv = nccl_receiver_recv,
    .receiver_fetch = nccl_receiver_fetch,
    .receiver_teardown = nccl_receiver_teardown,
};
