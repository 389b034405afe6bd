/* Network namespaces on one bridge for the multi-host tests (see netns.h). */
#include "tests/support/netns.h"

#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

const char *netns_unavailable(void)
{
    if (geteuid() != 0)
        return "network namespaces need root";
    if (access("/usr/sbin/ip", X_OK) != 0 && access("/sbin/ip", X_OK) != 0 &&
        system("command -v ip > /dev/null 2>&1") != 0)
        return "iproute2's ip is not installed";
    return NULL;
}

static int sh(const char *cmd)
{
    int rc = system(cmd);

    if (rc != 0)
        fprintf(stderr, "netns: '%s' failed (%d)\n", cmd, rc);
    return rc;
}

int netns_lan_up(netns_lan_t *lan, int n, const char *tag)
{
    char cmd[1024];
    int pid = (int)getpid();
    /* a /24 of 10.232.0.0/16 per process, so that parallel tests do not meet */
    int net = pid % 250 + 1;

    if (n < 1 || n > NETNS_MAX) {
        fprintf(stderr, "netns: %d hosts asked for, 1..%d possible\n", n, NETNS_MAX);
        return -1;
    }
    memset(lan, 0, sizeof(*lan));
    snprintf(lan->sw, sizeof(lan->sw), "ws%s%dsw", tag, pid);
    snprintf(cmd, sizeof(cmd), "ip netns add %s && ip -n %s link add br0 type bridge && "
                               "ip -n %s link set br0 up && ip -n %s link set lo up",
             lan->sw, lan->sw, lan->sw, lan->sw);
    if (sh(cmd) != 0) {
        snprintf(cmd, sizeof(cmd), "ip netns del %s 2>/dev/null", lan->sw);
        if (system(cmd) != 0)
            fprintf(stderr, "netns: could not remove %s\n", lan->sw);
        lan->sw[0] = '\0';
        return -1;
    }
    for (int i = 0; i < n; i++) {
        snprintf(lan->ns[i], sizeof(lan->ns[i]), "ws%s%dh%d", tag, pid, i);
        snprintf(lan->addr[i], sizeof(lan->addr[i]), "10.232.%d.%d", net, i + 1);
        lan->n = i + 1;
        /* the device is made in the namespaces directly: no name is ever taken in this one */
        snprintf(cmd, sizeof(cmd),
                 "ip netns add %s && ip link add %s netns %s type veth peer name p%d netns %s && "
                 "ip -n %s link set p%d master br0 up && ip -n %s addr add %s/24 dev %s && "
                 "ip -n %s link set %s up && ip -n %s link set lo up",
                 lan->ns[i], NETNS_DEV, lan->ns[i], i, lan->sw, lan->sw, i, lan->ns[i],
                 lan->addr[i], NETNS_DEV, lan->ns[i], NETNS_DEV, lan->ns[i]);
        if (sh(cmd) != 0) {
            netns_lan_down(lan);
            return -1;
        }
    }
    return 0;
}

void netns_lan_down(netns_lan_t *lan)
{
    char cmd[96];

    for (int i = 0; i < lan->n; i++) {
        snprintf(cmd, sizeof(cmd), "ip netns del %s 2>/dev/null", lan->ns[i]);
        if (lan->ns[i][0] != '\0' && system(cmd) != 0)
            fprintf(stderr, "netns: could not remove %s\n", lan->ns[i]);
        lan->ns[i][0] = '\0';
    }
    snprintf(cmd, sizeof(cmd), "ip netns del %s 2>/dev/null", lan->sw);
    if (lan->sw[0] != '\0' && system(cmd) != 0)
        fprintf(stderr, "netns: could not remove %s\n", lan->sw);
    lan->sw[0] = '\0';
    lan->n = 0;
}

int netns_enter(const netns_lan_t *lan, int i)
{
    char path[128];
    int fd;

    if (i < 0 || i >= lan->n) {
        fprintf(stderr, "netns: host %d of %d\n", i, lan->n);
        return -1;
    }
    snprintf(path, sizeof(path), "/var/run/netns/%s", lan->ns[i]);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
        perror(path);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    if (unshare(CLONE_NEWNS) != 0 || mount("", "/", NULL, MS_SLAVE | MS_REC, NULL) != 0 ||
        umount2("/sys", MNT_DETACH) != 0 || mount(lan->ns[i], "/sys", "sysfs", 0, NULL) != 0) {
        perror("netns: remounting /sys in the namespace");
        return -1;
    }
    setenv("UCX_NET_DEVICES", NETNS_DEV, 1);
    setenv("FI_TCP_IFACE", NETNS_DEV, 1);
    return 0;
}
