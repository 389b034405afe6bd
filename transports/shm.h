/* Internal: host shared memory without names. Segments are memfds: they have no path in
 * /dev/shm or anywhere, are passed to peers as file descriptors over Unix sockets, and vanish
 * when the last process holding a descriptor or mapping exits — also when it is killed. */
#ifndef WSYNC_TRANSPORTS_SHM_H
#define WSYNC_TRANSPORTS_SHM_H

#include <fcntl.h>
#include <stddef.h>

#include "wsync/wsync.h"

/* The seals of every segment: its size is fixed once made (F_SEAL_SEAL: for good). */
#define WSYNC_SHM_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

typedef struct {
    int fd;
    void *base;
    size_t bytes;
} wsync_shm_t;

/* Create and map (read-write) a segment of `bytes`, pages populated, sealed (WSYNC_SHM_SEALS). */
wsync_status_t wsync_shm_create(const char *label, size_t bytes, wsync_shm_t *shm);
/* Map a segment received as fd (read-only); checks that it carries WSYNC_SHM_SEALS (a segment
 * its owner can still shrink is WSYNC_ERR_PROTOCOL) and is at least `bytes` long. Takes fd.
 * what names the segment in errors ("ipc: receiver 2: sender 0's host slots"; NULL: "a peer's
 * shared segment"). */
wsync_status_t wsync_shm_map_fd(int fd, size_t bytes, const char *what, wsync_shm_t *shm);
void wsync_shm_release(wsync_shm_t *shm);

#endif
