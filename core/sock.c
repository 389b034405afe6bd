#include "core/sock.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "core/status.h"
#include "core/util.h"

int wsync_sock_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static wsync_status_t split_addr(const char *addr, char *host, size_t hl, char *port, size_t pl)
{
    const char *colon;

    if (addr == NULL || *addr == '\0')
        return wsync_err(WSYNC_ERR_INVALID, "coordinator address is empty (set WSYNC_COORDINATOR "
                                            "or params.coordinator to host:port)");
    if (addr[0] == '[') {
        const char *close = strchr(addr, ']');
        if (close == NULL || close[1] != ':')
            return wsync_err(WSYNC_ERR_INVALID, "address '%s': expected [v6addr]:port", addr);
        snprintf(host, hl, "%.*s", (int)(close - addr - 1), addr + 1);
        colon = close + 1;
    } else {
        colon = strrchr(addr, ':');
        if (colon == NULL)
            return wsync_err(WSYNC_ERR_INVALID, "address '%s': expected host:port", addr);
        snprintf(host, hl, "%.*s", (int)(colon - addr), addr);
    }
    snprintf(port, pl, "%s", colon + 1);
    char *end;
    long p = strtol(port, &end, 10);
    if (*port == '\0' || *end != '\0' || p < 0 || p > 65535)
        return wsync_err(WSYNC_ERR_INVALID, "address '%s': bad port '%s'", addr, port);
    return WSYNC_OK;
}

static wsync_status_t resolve(const char *addr, int passive, struct addrinfo **res)
{
    char host[256], port[16];
    struct addrinfo hints;
    wsync_status_t st = split_addr(addr, host, sizeof(host), port, sizeof(port));
    int rc;

    if (st != WSYNC_OK)
        return st;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    rc = getaddrinfo(host[0] ? host : NULL, port, &hints, res);
    if (rc != 0)
        return wsync_err(WSYNC_ERR_INVALID, "address '%s': %s", addr, gai_strerror(rc));
    return WSYNC_OK;
}

/* Listening sockets take the system's largest backlog (net.core.somaxconn, 4096 on current
 * kernels): with hundreds of participants connecting at once, a backlog of 128 dropped SYNs,
 * which TCP retries only after a second (tests/scale). */
wsync_status_t wsync_tcp_listen(const char *addr, int *fd_out, char *bound, size_t bound_len)
{
    struct addrinfo *res, *ai;
    wsync_status_t st = resolve(addr, 1, &res);
    int fd = -1, one = 1, err = 0;

    if (st != WSYNC_OK)
        return st;
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0)
            break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return wsync_err(WSYNC_ERR_IO, "coordinator cannot listen on %s: %s", addr, strerror(err));
    if (bound != NULL) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        char h[NI_MAXHOST], p[NI_MAXSERV];
        getsockname(fd, (struct sockaddr *)&ss, &sl);
        if (getnameinfo((struct sockaddr *)&ss, sl, h, sizeof(h), p, sizeof(p),
                        NI_NUMERICHOST | NI_NUMERICSERV) == 0)
            snprintf(bound, bound_len, ss.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", h, p);
        else
            snprintf(bound, bound_len, "%s", addr);
    }
    wsync_sock_nonblock(fd);
    *fd_out = fd;
    return WSYNC_OK;
}

wsync_status_t wsync_tcp_connect(const char *addr, int64_t deadline_ms, int *fd_out)
{
    int err = 0;

    for (;;) {
        struct addrinfo *res, *ai;
        wsync_status_t st = resolve(addr, 0, &res);
        if (st != WSYNC_OK)
            return st;
        for (ai = res; ai != NULL; ai = ai->ai_next) {
            int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
            if (fd < 0) {
                err = errno;
                continue;
            }
            if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                freeaddrinfo(res);
                *fd_out = fd;
                return WSYNC_OK;
            }
            err = errno;
            close(fd);
        }
        freeaddrinfo(res);
        /* the coordinator may simply not be listening yet: retry until the deadline */
        if (wsync_now_ms() >= deadline_ms)
            break;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return wsync_err(WSYNC_ERR_TIMEOUT, "could not reach the coordinator at %s before the deadline: %s",
                     addr, strerror(err));
}

static socklen_t unix_addr(const char *name, struct sockaddr_un *sa)
{
    size_t n = strlen(name);

    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    if (n > sizeof(sa->sun_path) - 1)
        n = sizeof(sa->sun_path) - 1;
    memcpy(sa->sun_path, name, n);
    if (name[0] == '@')
        sa->sun_path[0] = '\0';      /* abstract namespace */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
}

wsync_status_t wsync_unix_listen(char *name, size_t name_len, int *fd_out)
{
    static atomic_uint counter;
    struct sockaddr_un sa;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0)
        return wsync_err(WSYNC_ERR_IO, "socket(AF_UNIX): %s", strerror(errno));
    for (int tries = 0; tries < 8; tries++) {
        snprintf(name, name_len, "@wsync-%d-%u-%08x", (int)getpid(), atomic_fetch_add(&counter, 1),
                 (unsigned)(wsync_now_ns() * 2654435761u));
        socklen_t sl = unix_addr(name, &sa);
        if (bind(fd, (struct sockaddr *)&sa, sl) == 0 && listen(fd, SOMAXCONN) == 0) {
            wsync_sock_nonblock(fd);
            *fd_out = fd;
            return WSYNC_OK;
        }
    }
    int e = errno;
    close(fd);
    return wsync_err(WSYNC_ERR_IO, "cannot listen on an abstract Unix socket: %s", strerror(e));
}

wsync_status_t wsync_unix_connect(const char *name, int *fd_out)
{
    struct sockaddr_un sa;
    socklen_t sl;
    int fd;

    if (name == NULL || name[0] != '@')
        return wsync_err(WSYNC_ERR_PROTOCOL, "bad data address '%s'", name ? name : "(none)");
    sl = unix_addr(name, &sa);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return wsync_err(WSYNC_ERR_IO, "socket(AF_UNIX): %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&sa, sl) != 0) {
        int e = errno;
        close(fd);
        return wsync_err(WSYNC_ERR_IO, "cannot connect to %s: %s (is the sender on this host and "
                                       "network namespace?)", name, strerror(e));
    }
    *fd_out = fd;
    return WSYNC_OK;
}
