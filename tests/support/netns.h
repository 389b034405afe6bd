/* Simulated hosts for multi-process tests: network namespaces joined by one bridge, as machines
 * on one switch. Each host namespace has one device, named alike in all of them (NETNS_DEV), and
 * an address on a private /24; the bridge lives in a namespace of its own. Needs root and
 * iproute2's `ip`; netns_unavailable() says why not, and such a test exits NETNS_SKIP (ctest's
 * SKIP_RETURN_CODE for tests named test_multihost_*). The namespaces are removed by
 * netns_lan_down, and the parent must not create wsync objects before forking into them. */
#ifndef WSYNC_TEST_NETNS_H
#define WSYNC_TEST_NETNS_H

#define NETNS_MAX 8
#define NETNS_DEV "wsnet0"
#define NETNS_SKIP 77

typedef struct {
    int n;                           /* host namespaces */
    char sw[32];                     /* the namespace holding the bridge */
    char ns[NETNS_MAX][32];          /* host i's namespace, as `ip netns` names it */
    char addr[NETNS_MAX][32];        /* host i's IPv4 address on the bridge */
} netns_lan_t;

/* Why namespaces cannot be made here (not root, no `ip`), or NULL when they can. */
const char *netns_unavailable(void);
/* Make n (1..NETNS_MAX) host namespaces on one bridge; tag (a few letters) names them. 0 on
 * success; -1 after printing the failing command, with whatever was made removed. */
int netns_lan_up(netns_lan_t *lan, int n, const char *tag);
/* Remove every namespace (and so every device) of the LAN; harmless twice. */
void netns_lan_down(netns_lan_t *lan);
/* Move this process into host i's namespace for good, with a /sys of that namespace (as `ip netns
 * exec` does: UCX looks for devices there) and UCX_NET_DEVICES / FI_TCP_IFACE set to its device,
 * so the transports use the bridge and not the loopback. 0 on success; -1 after perror. */
int netns_enter(const netns_lan_t *lan, int i);

#endif
