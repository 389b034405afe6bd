/* Internal: small helpers every module uses (time, deadlines, checked arithmetic). */
#ifndef WSYNC_CORE_UTIL_H
#define WSYNC_CORE_UTIL_H

#include <stddef.h>
#include <stdint.h>

#define WSYNC_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define WSYNC_MIN(a, b) ((a) < (b) ? (a) : (b))
#define WSYNC_MAX(a, b) ((a) > (b) ? (a) : (b))

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

/* Identity of this machine *and* network namespace (boot id + netns inode): participants with
 * equal host ids can share memory and reach each other's abstract Unix sockets. */
const char *wsync_host_id(void);

#endif
