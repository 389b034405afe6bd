/* The tcp transport: the control plane (core/sock.c and core/loop.c carry it). */
#include <stdio.h>

#include "transports/transport.h"

static int tcp_probe(char *reason, size_t len)
{
    snprintf(reason, len, "TCP sockets (control plane)");
    return 1;
}

const wsync_transport_ops_t wsync_transport_tcp = {
    .name = "tcp",
    .compiled = 1,
    .caps = WSYNC_CAP_CONTROL | WSYNC_CAP_SAME_NODE | WSYNC_CAP_CROSS_NODE,
    .est_gbps = 1.0,
    .probe = tcp_probe,
};
