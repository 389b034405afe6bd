/* Doorbells in a shared page (see doorbell.h): create, attach, ring and wait. */
#include "core/doorbell.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/fault.h"
#include "core/status.h"
#include "core/util.h"

static size_t page_bytes(uint32_t nsenders, uint32_t nreceivers)
{
    return sizeof(wsync_bell_hdr_t) + ((size_t)nsenders + nreceivers) * sizeof(wsync_bell_line_t);
}

int wsync_bells_wanted(void)
{
    const char *e = getenv("WSYNC_DOORBELL"), *f = getenv("WSYNC_FAULT");
    /* injected faults act on the messages (drop a COMMIT, fail a BEGIN): keep them */
    if (f != NULL && f[0] != '\0')
        return 0;
    return !(e != NULL && (strcmp(e, "0") == 0 || strcmp(e, "off") == 0));
}

wsync_status_t wsync_bells_create(uint32_t nsenders, uint32_t nreceivers, wsync_bells_t **out)
{
    size_t bytes = page_bytes(nsenders, nreceivers);
    wsync_bells_t *b = calloc(1, sizeof(*b));
    int fd;

    if (b == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "no memory for the doorbells");
    fd = memfd_create("wsync-doorbells", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        free(b);
        return wsync_err(WSYNC_ERR_IO, "doorbells: cannot make a %zu-byte memfd: %s", bytes,
                         strerror(e));
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(fd);
        free(b);
        return wsync_err(WSYNC_ERR_IO, "doorbells: cannot map %zu bytes: %s", bytes, strerror(e));
    }
    b->hdr = p;
    b->bytes = bytes;
    b->fd = fd;
    b->nsenders = nsenders;
    b->nreceivers = nreceivers;
    atomic_store(&b->hdr->nsenders, nsenders);
    atomic_store(&b->hdr->nreceivers, nreceivers);
    atomic_store(&b->hdr->magic, WSYNC_BELL_MAGIC);
    *out = b;
    return WSYNC_OK;
}

wsync_status_t wsync_bells_attach(uint32_t pid, int32_t fd, uint64_t bytes, uint32_t nsenders,
                                  uint32_t nreceivers, wsync_bells_t **out)
{
    char path[64];
    struct stat sb;
    wsync_bells_t *b;
    int f;

    if (bytes != page_bytes(nsenders, nreceivers) || fd < 0)
        return wsync_err(WSYNC_ERR_PROTOCOL, "doorbells: the coordinator offers a page of %llu "
                         "bytes (fd %d); %u senders and %u receivers need %zu",
                         (unsigned long long)bytes, fd, nsenders, nreceivers,
                         page_bytes(nsenders, nreceivers));
    snprintf(path, sizeof(path), "/proc/%u/fd/%d", pid, fd);
    f = open(path, O_RDWR | O_CLOEXEC);
    if (f < 0)
        return wsync_err(WSYNC_ERR_IO, "doorbells: cannot open %s: %s", path, strerror(errno));
    if (fstat(f, &sb) != 0 || (uint64_t)sb.st_size != bytes) {
        close(f);
        return wsync_err(WSYNC_ERR_PROTOCOL, "doorbells: %s is not the %llu-byte page offered",
                         path, (unsigned long long)bytes);
    }
    void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    close(f);   /* the mapping keeps the page */
    if (p == MAP_FAILED)
        return wsync_err(WSYNC_ERR_IO, "doorbells: cannot map %s: %s", path, strerror(errno));
    b = calloc(1, sizeof(*b));
    if (b == NULL) {
        munmap(p, (size_t)bytes);
        return wsync_err(WSYNC_ERR_NOMEM, "no memory for the doorbells");
    }
    b->hdr = p;
    b->bytes = (size_t)bytes;
    b->fd = -1;
    b->nsenders = nsenders;
    b->nreceivers = nreceivers;
    if (atomic_load(&b->hdr->magic) != WSYNC_BELL_MAGIC ||
        atomic_load(&b->hdr->nsenders) != nsenders ||
        atomic_load(&b->hdr->nreceivers) != nreceivers) {
        wsync_bells_free(b);
        return wsync_err(WSYNC_ERR_PROTOCOL, "doorbells: %s does not hold this group's page", path);
    }
    *out = b;
    return WSYNC_OK;
}

void wsync_bells_free(wsync_bells_t *b)
{
    if (b == NULL)
        return;
    if (b->hdr != NULL)
        munmap(b->hdr, b->bytes);
    if (b->fd >= 0)
        close(b->fd);
    free(b);
}

wsync_bell_line_t *wsync_bells_line(const wsync_bells_t *b, int sender, uint32_t rank)
{
    wsync_bell_line_t *lines = (wsync_bell_line_t *)(b->hdr + 1);
    return &lines[sender ? rank : b->nsenders + rank];
}

static long futex(_Atomic uint32_t *word, int op, uint32_t val, const struct timespec *ts)
{
    /* shared (not FUTEX_PRIVATE): the sleepers are in other processes */
    return syscall(SYS_futex, (uint32_t *)word, op, val, ts, NULL, 0);
}

void wsync_bell_ring(_Atomic uint32_t *word)
{
    futex(word, FUTEX_WAKE, INT_MAX, NULL);
}

void wsync_bells_kick(wsync_bells_t *b)
{
    if (b == NULL)
        return;
    wsync_bell_ring(&b->hdr->begin_seq);
    wsync_bell_ring(&b->hdr->done_seq);
}

/* Polls of the word before a waiter sleeps: a ring already on its way (the peer running on the
 * other core) is seen without a sleep and a wake. Few, and without sched_yield(): while other
 * tasks are runnable on its core, a yield puts the waiter behind them (EEVDF pushes the yielder's
 * deadline a slice further) and nothing wakes it when the peer rings, since it sleeps on no
 * futex: it runs again only at a tick, 4 ms at HZ=250. A futex sleeper is woken by the ring and
 * preempts the busy task at once, as a socket's reader does. Spinning longer only takes the core
 * from whoever is to ring (measured in docs/scale.md). */
#define WSYNC_BELL_POLLS 8

wsync_status_t wsync_bell_wait(_Atomic uint32_t *word, uint32_t target, int64_t deadline_ms,
                               wsync_inbox_t *inbox)
{
    for (uint32_t spin = 0;; spin++) {
        uint32_t cur = atomic_load(word);
        if ((int32_t)(cur - target) >= 0)
            return WSYNC_OK;
        if (spin < WSYNC_BELL_POLLS)
            continue;
        (void)WSYNC_FAULT(WSYNC_FAULT_BELL_WAIT);
        wsync_status_t st = wsync_inbox_failed(inbox);
        if (st != WSYNC_OK) {
            /* the word may have moved after the load above and before the failure came (the
             * coordinator rings DONE, its sender returns and closes the group): what was rung
             * first happened; only a wait the failure cut short fails */
            if ((int32_t)(atomic_load(word) - target) >= 0)
                return WSYNC_OK;
            return st;
        }
        int64_t left = deadline_ms - wsync_now_ms();
        if (left <= 0)
            return WSYNC_ERR_TIMEOUT;
        if (left > WSYNC_BELL_SLICE_MS)
            left = WSYNC_BELL_SLICE_MS;
        struct timespec ts = {(time_t)(left / 1000), (long)(left % 1000) * 1000000L};
        futex(word, FUTEX_WAIT, cur, &ts);   /* returns at once if *word moved from cur */
    }
}
