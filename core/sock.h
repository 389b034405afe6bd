/* Internal: socket helpers of the control plane. TCP addresses are "host:port" (IPv4 or a host
 * name; "[v6]:port" for IPv6); Unix addresses starting with '@' are abstract (Linux): they need
 * no file and vanish with the process. */
#ifndef WSYNC_CORE_SOCK_H
#define WSYNC_CORE_SOCK_H

#include <stddef.h>
#include <stdint.h>

#include "wsync/wsync.h"

/* Listen on addr (port 0 picks one). Writes the bound "host:port" into bound. */
wsync_status_t wsync_tcp_listen(const char *addr, int *fd, char *bound, size_t bound_len);
/* Connect, retrying while the listener is not up yet, until deadline_ms (wsync_now_ms clock). */
wsync_status_t wsync_tcp_connect(const char *addr, int64_t deadline_ms, int *fd);
/* Listen on a fresh abstract Unix address, written into name ("@wsync-<pid>-<n>-<rand>"). */
wsync_status_t wsync_unix_listen(char *name, size_t name_len, int *fd);
wsync_status_t wsync_unix_connect(const char *name, int *fd);
int wsync_sock_nonblock(int fd);

#endif
