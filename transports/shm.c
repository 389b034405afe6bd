/* The shm transport: memfd segments shared by descriptor (see shm.h). */
#include "transports/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"
#include "transports/transport.h"

wsync_status_t wsync_shm_create(const char *label, size_t bytes, wsync_shm_t *shm)
{
    int fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    void *base;

    if (fd < 0)
        return wsync_err(WSYNC_ERR_IO, "memfd_create(%s): %s", label, strerror(errno));
    if (ftruncate(fd, (off_t)bytes) != 0) {
        int e = errno;
        close(fd);
        return wsync_err(WSYNC_ERR_NOMEM, "cannot size shared segment %s to %zu bytes: %s", label,
                         bytes, strerror(e));
    }
    /* its size is final: a peer that maps it can trust that no byte of the mapping goes away */
    if (fcntl(fd, F_ADD_SEALS, WSYNC_SHM_SEALS) != 0) {
        int e = errno;
        close(fd);
        return wsync_err(WSYNC_ERR_IO, "cannot seal shared segment %s: %s", label, strerror(e));
    }
    /* populate now: first-touch faults would otherwise land in the first push */
    base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base == MAP_FAILED) {
        int e = errno;
        close(fd);
        return wsync_err(WSYNC_ERR_NOMEM, "cannot map shared segment %s (%zu bytes): %s", label,
                         bytes, strerror(e));
    }
    shm->fd = fd;
    shm->base = base;
    shm->bytes = bytes;
    return WSYNC_OK;
}

wsync_status_t wsync_shm_map_fd(int fd, size_t bytes, const char *what, wsync_shm_t *shm)
{
    struct stat sb;
    void *base;
    int seals = fcntl(fd, F_GET_SEALS), e = errno;

    if (what == NULL)
        what = "a peer's shared segment";
    /* a segment its owner could still shrink would turn our reads past its new end into SIGBUS */
    if (seals < 0) {
        close(fd);
        return wsync_err(WSYNC_ERR_PROTOCOL, "%s: not a sealable shared segment (F_GET_SEALS: %s)",
                         what, strerror(e));
    }
    if ((seals & WSYNC_SHM_SEALS) != WSYNC_SHM_SEALS) {
        close(fd);
        return wsync_err(WSYNC_ERR_PROTOCOL, "%s is not sealed against resizing (seals 0x%x, want "
                         "0x%x; a peer built before its segments were sealed?)", what, seals,
                         WSYNC_SHM_SEALS);
    }
    if (fstat(fd, &sb) != 0) {
        e = errno;
        close(fd);
        return wsync_err(WSYNC_ERR_IO, "%s: fstat: %s", what, strerror(e));
    }
    if ((size_t)sb.st_size < bytes) {
        close(fd);
        return wsync_err(WSYNC_ERR_PROTOCOL, "%s is %lld bytes, the peer announced %zu", what,
                         (long long)sb.st_size, bytes);
    }
    base = mmap(NULL, bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base == MAP_FAILED) {
        e = errno;
        close(fd);
        return wsync_err(WSYNC_ERR_NOMEM, "cannot map %s (%zu bytes): %s", what, bytes,
                         strerror(e));
    }
    shm->fd = fd;
    shm->base = base;
    shm->bytes = bytes;
    return WSYNC_OK;
}

void wsync_shm_release(wsync_shm_t *shm)
{
    if (shm->base != NULL && shm->bytes > 0)
        munmap(shm->base, shm->bytes);
    if (shm->fd >= 0)
        close(shm->fd);
    shm->base = NULL;
    shm->bytes = 0;
    shm->fd = -1;
}

static int shm_probe(char *reason, size_t len)
{
    int fd = memfd_create("wsync-probe", MFD_CLOEXEC | MFD_ALLOW_SEALING);

    if (fd < 0) {
        snprintf(reason, len, "memfd_create failed: %s", strerror(errno));
        return 0;
    }
    if (fcntl(fd, F_ADD_SEALS, WSYNC_SHM_SEALS) != 0) {   /* every segment is sealed */
        snprintf(reason, len, "memfd sealing failed: %s", strerror(errno));
        close(fd);
        return 0;
    }
    close(fd);
    snprintf(reason, len, "memfd shared memory, descriptors passed over Unix sockets");
    return 1;
}

const wsync_transport_ops_t wsync_transport_shm = {
    .name = "shm",
    .compiled = 1,
    .caps = WSYNC_CAP_HOST_MEM | WSYNC_CAP_SAME_NODE | WSYNC_CAP_MAP,
    .est_gbps = 10.0,
    .probe = shm_probe,
};
