/* The 'store' scheme: registered so that negotiation can explain it; its data path comes later. */
#include <stdio.h>

#include "core/status.h"
#include "schemes/scheme.h"

static int store_score(const wsync_group_info_t *g, char *reason, size_t len)
{
    (void)g;
    snprintf(reason, len, "no data path in this version of wsync");
    return 0;
}

static wsync_status_t store_sender_setup(wsync_sender_t *s)
{
    (void)s;
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "scheme 'store' has no data path in this version");
}

static wsync_status_t store_sender_push(wsync_sender_t *s, uint64_t version)
{
    (void)s;
    (void)version;
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "scheme 'store' has no data path in this version");
}

static void store_sender_teardown(wsync_sender_t *s)
{
    (void)s;
}

static wsync_status_t store_receiver_setup(wsync_receiver_t *r)
{
    (void)r;
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "scheme 'store' has no data path in this version");
}

static wsync_status_t store_receiver_recv(wsync_receiver_t *r, uint64_t version)
{
    (void)r;
    (void)version;
    return wsync_err(WSYNC_ERR_UNSUPPORTED, "scheme 'store' has no data path in this version");
}

static void store_receiver_teardown(wsync_receiver_t *r)
{
    (void)r;
}

const wsync_scheme_ops_t wsync_scheme_store = {
    .name = "store",
    .implemented = 0,
    .score = store_score,
    .sender_setup = store_sender_setup,
    .sender_push = store_sender_push,
    .sender_teardown = store_sender_teardown,
    .receiver_setup = store_receiver_setup,
    .receiver_recv = store_receiver_recv,
    .receiver_teardown = store_receiver_teardown,
};
