/* ucx transport: one-sided RMA (get/put) between hosts through UCX, for the store scheme.
 * Only the run-time probe exists so far; endpoints, registration and the data path come with
 * the store scheme. */
#include "transports/transport.h"
#include "wsync_build_config.h"

#include <stdio.h>

#if WSYNC_HAVE_UCX
#include <ucp/api/ucp.h>

/* Creates and drops a UCP context asking for RMA. No worker and no endpoint are made, so nothing
 * touches the network; reading the devices may take a moment, which is acceptable here. */
static int ucx_probe(char *reason, size_t reason_len)
{
    unsigned major = 0, minor = 0, release = 0;
    ucp_get_version(&major, &minor, &release);

    ucp_config_t *config = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK) {
        snprintf(reason, reason_len, "UCX %u.%u.%u: ucp_config_read failed: %s", major, minor,
                 release, ucs_status_string(st));
        return 0;
    }
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES,
        .features = UCP_FEATURE_RMA,
    };
    ucp_context_h context = NULL;
    st = ucp_init(&params, config, &context);
    ucp_config_release(config);
    if (st != UCS_OK) {
        snprintf(reason, reason_len, "UCX %u.%u.%u: ucp_init with RMA failed: %s", major, minor,
                 release, ucs_status_string(st));
        return 0;
    }
    ucp_cleanup(context);
    snprintf(reason, reason_len, "UCX %u.%u.%u: initialised with RMA", major, minor, release);
    return 1;
}

#define UCX_COMPILED 1
#else
static int ucx_probe(char *reason, size_t reason_len)
{
    snprintf(reason, reason_len,
             "not compiled in: configure with -DWSYNC_WITH_UCX=ON (needs UCX headers and "
             "pkg-config file: libucx-dev)");
    return 0;
}

#define UCX_COMPILED 0
#endif

const wsync_transport_ops_t wsync_transport_ucx = {
    .name = "ucx",
    .compiled = UCX_COMPILED,
    /* No data path is wired in yet, so nothing is advertised (caps must match what works). */
    .caps = 0,
    .est_gbps = 0.0,
    .probe = ucx_probe,
};
