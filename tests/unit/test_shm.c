/* transports/shm.h: a segment is sealed against resizing once made (its owner can no longer
 * shrink it under a peer's mapping, which would make the peer's reads past the new end SIGBUS),
 * a peer maps a sealed one and reads what the owner wrote, and refuses, naming the segment and
 * why, one that is not sealed (or sealed only in part), not a memfd, or shorter than announced. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/support/check.h"
#include "transports/shm.h"
#include "wsync/wsync.h"

#define BYTES (3 * 4096 + 100)

static void case_sealed_and_mapped(void)
{
    wsync_shm_t own = {-1, NULL, 0}, peer = {-1, NULL, 0};
    CHECK_OK(wsync_shm_create("wsync-test", BYTES, &own));
    if (own.base == NULL)
        return;
    int seals = fcntl(own.fd, F_GET_SEALS);
    CHECK_MSG(seals >= 0 && (seals & WSYNC_SHM_SEALS) == WSYNC_SHM_SEALS, "seals 0x%x", seals);
    /* the owner itself can no longer resize it, nor take the seals off */
    errno = 0;
    CHECK(ftruncate(own.fd, 4096) != 0 && errno == EPERM);
    CHECK(ftruncate(own.fd, 2 * BYTES) != 0 && errno == EPERM);
    errno = 0;
    CHECK(fcntl(own.fd, F_ADD_SEALS, F_SEAL_WRITE) != 0 && errno == EPERM);   /* F_SEAL_SEAL */
    for (size_t i = 0; i < BYTES; i++)
        ((uint8_t *)own.base)[i] = (uint8_t)(i * 7 + 1);
    /* a peer gets its own descriptor, as over a Unix socket */
    int fd = dup(own.fd);
    CHECK(fd >= 0);
    CHECK_OK(wsync_shm_map_fd(fd, BYTES, "sender 0's test slots", &peer));
    CHECK(peer.base != NULL && peer.bytes == BYTES);
    if (peer.base != NULL) {
        CHECK(memcmp(peer.base, own.base, BYTES) == 0);
        ((uint8_t *)own.base)[BYTES - 1] = 0xAB;   /* shared, not a copy */
        CHECK(((const uint8_t *)peer.base)[BYTES - 1] == 0xAB);
    }
    wsync_shm_release(&peer);
    wsync_shm_release(&own);
    CHECK(own.fd == -1 && own.base == NULL);
}

static void case_unsealed_refused(void)
{
    wsync_shm_t peer = {-1, NULL, 0};
    /* what a peer that does not seal its slots would send: a plain memfd of the right size */
    int fd = memfd_create("wsync-test-unsealed", MFD_CLOEXEC);
    CHECK(fd >= 0 && ftruncate(fd, BYTES) == 0);
    CHECK_ST(wsync_shm_map_fd(fd, BYTES, "sender 3's host slots", &peer), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("sender 3's host slots is not sealed against resizing");
    CHECK(peer.base == NULL);
    /* sealed against growing only: it could still shrink */
    fd = memfd_create("wsync-test-grow", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    CHECK(fd >= 0 && ftruncate(fd, BYTES) == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_GROW) == 0);
    CHECK_ST(wsync_shm_map_fd(fd, BYTES, NULL, &peer), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("not sealed against resizing");
    /* its size fixed, but the seals not: its owner could still take F_SEAL_WRITE or more */
    fd = memfd_create("wsync-test-noseal", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    CHECK(fd >= 0 && ftruncate(fd, BYTES) == 0 &&
          fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
    CHECK_ST(wsync_shm_map_fd(fd, BYTES, NULL, &peer), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("not sealed against resizing");
    /* not a memfd at all: no seals to read */
    fd = dup(STDERR_FILENO);
    CHECK(fd >= 0);
    CHECK_ST(wsync_shm_map_fd(fd, BYTES, "sender 3's region 0", &peer), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("sender 3's region 0: not a sealable shared segment");
}

static void case_short_refused(void)
{
    wsync_shm_t own = {-1, NULL, 0}, peer = {-1, NULL, 0};
    CHECK_OK(wsync_shm_create("wsync-test-short", BYTES, &own));
    if (own.base == NULL)
        return;
    /* sealed, but smaller than the peer says */
    CHECK_ST(wsync_shm_map_fd(dup(own.fd), 2 * BYTES, "sender 1's delta slots", &peer),
             WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("sender 1's delta slots is 12388 bytes, the peer announced 24776");
    CHECK(peer.base == NULL);
    wsync_shm_release(&own);
}

int main(void)
{
    RUN(case_sealed_and_mapped);
    RUN(case_unsealed_refused);
    RUN(case_short_refused);
    return check_summary();
}
