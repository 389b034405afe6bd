/* Internal: small helpers every module uses (time, deadlines, checked arithmetic). */
#ifndef WSYNC_CORE_UTIL_H
#define WSYNC_CORE_UTIL_H

#include <stddef.h>
#include <stdint.h>

#define WSYNC_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define WSYNC_MIN(a, b) ((a) < (b) ? (a) : (b))
#define WSYNC_MAX(a, b) ((a) > (b) ? (a) : (b))

/* v rounded up to a multiple of a (a > 0). */
static inline uint64_t wsync_align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

/* Monotonic clock in nanoseconds / milliseconds. */
uint64_t wsync_now_ns(void);
static inline int64_t wsync_now_ms(void) { return (int64_t)(wsync_now_ns() / 1000000u); }

/* A deadline `ms` from now (ms < 0: now). */
static inline int64_t wsync_deadline_in(int ms) { return wsync_now_ms() + (ms < 0 ? 0 : ms); }
/* Milliseconds left until deadline, clamped to [0, INT32_MAX]. */
int wsync_ms_left(int64_t deadline_ms);

/* How long a control peer may stay silent before it is lost: shorter than the operation deadline,
 * so that when a stalled peer holds everyone up, its loss (naming it) is what everyone reports,
 * not their own waits timing out. At least three heartbeats. */
static inline int wsync_peer_timeout_ms(int timeout_ms, int heartbeat_ms)
{
    int t = timeout_ms / 2;
    if (heartbeat_ms <= 200000000 && t > 10 * heartbeat_ms)
        t = 10 * heartbeat_ms;
    if (heartbeat_ms <= 700000000 && t < 3 * heartbeat_ms)
        t = 3 * heartbeat_ms;
    return t;
}

/* strdup that returns NULL for NULL. */
char *wsync_strdup(const char *s);

/* a * b into *out; 0 on success, -1 on overflow. */
static inline int wsync_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}
static inline int wsync_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

/* Parse a byte size: "4096", "256M", "1G", "64KiB". 0 on success. */
int wsync_parse_size(const char *text, uint64_t *out);

/* Identity of this machine *and* network namespace, "<host>/<netns>": the host is the kernel's
 * boot id (what containers on one machine share, and what CUDA IPC and memfd need; the hostname
 * where /proc has none; $WSYNC_HOST_ID replaces it, for machines whose boot ids collide or to
 * simulate hosts), the netns "net:[inode]" of /proc/self/ns/net (abstract Unix sockets, which the
 * ipc scheme's data connections use, do not cross it). Participants with equal host ids can share
 * memory and reach each other's abstract Unix sockets. Read once per process; thread-safe. */
const char *wsync_host_id(void);

/* The parts of a host id as it travels in HELLO and PLAN (NULL reads as ""): the host (before the
 * first '/') and the network namespace (after it, "" if none). The netns part points into id. */
size_t wsync_host_len(const char *id);
const char *wsync_host_netns(const char *id);
/* 1 when a and b are on one host (their network namespaces may differ), else 0. */
int wsync_host_same(const char *a, const char *b);
/* 1 when a and b are on one host and in one network namespace, else 0. */
int wsync_host_same_netns(const char *a, const char *b);
/* Distinct hosts and distinct (host, namespace) pairs among ids[0..n) (NULL entries count as ""),
 * in O(n log n). 0 on success, -1 when out of memory (outputs untouched). */
int wsync_host_count(const char *const *ids, size_t n, uint32_t *hosts, uint32_t *spaces);

/* A target's shape as the quantizers take it: [rows, cols], cols its last dimension, rows the
 * product of the others (a scalar: [1, 1]). */
static inline void wsync_shape_matrix(int ndim, const int64_t *shape, uint64_t *rows,
                                      uint64_t *cols)
{
    *rows = 1;
    *cols = ndim > 0 ? (uint64_t)shape[ndim - 1] : 1;
    for (int d = 0; d < ndim - 1; d++)
        *rows *= (uint64_t)shape[d];
}

#endif
