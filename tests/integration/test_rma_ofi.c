/* The libfabric RMA transport (transports/ofi.c) between two processes, an owner that registers
 * memory and a reader that reads and writes it, with no wsync control plane: the owner's address,
 * region and packed key travel over a socketpair. For each provider libfabric offers here (tcp,
 * shm; one it does not offer is skipped, saying why):
 *   - 64 MiB in 1 MiB reads all in flight, and 3 bytes at an odd address, checked against bytes
 *     the reader generates itself; the same with local buffers registered (the FI_MR_LOCAL path);
 *   - writes, checked by the owner in its own memory, then read back;
 *   - reads outside the region (refused by get), and reads only the provider can judge (a forged
 *     length, a stale key, a wrong key, an unmapped address): each answers within a deadline, and
 *     fails with a message naming the read where the provider checks (tcp: all; shm: unmapped
 *     memory only, it checks no keys), and a good read works again afterwards;
 *   - an owner SIGKILLed with reads posted: flush answers within its deadline, and reads from the
 *     dead owner fail within theirs.
 * The provider outcomes are printed, for the record. */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/util.h"
#include "tests/support/check.h"
#include "tests/support/proc.h"
#include "transports/rma.h"
#include "wsync/wsync.h"

#define MiB ((size_t)1 << 20)
#define REGION (64 * MiB)
#define CHILD_LIMIT_S 120
#define WAIT_MS 150000
#define FLUSH_MS 20000       /* generous: a loaded CI machine */
#define FAIL_FLUSH_MS 10000  /* failure cases: the error must come before this */

static const wsync_rma_ops_t *ops;
static const char *hint;     /* provider under test */

/* ---- the bytes ------------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Byte `off + i` of the test's pattern `seed`, for i < n. */
static void fill(uint8_t *dst, size_t off, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        size_t b = off + i;
        dst[i] = (uint8_t)(splitmix64(seed ^ (b / 8)) >> (8 * (b % 8)));
    }
}

static uint64_t pattern_hash(size_t off, size_t n, uint64_t seed)
{
    uint8_t *tmp = malloc(n);
    if (!tmp)
        return 0;
    fill(tmp, off, n, seed);
    uint64_t h = XXH3_64bits(tmp, n);
    free(tmp);
    return h;
}

/* ---- a tiny framing over the socketpair ---------------------------------------------------- */

static int send_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

static int recv_all(int fd, void *p, size_t n, int timeout_ms)
{
    uint8_t *b = p;
    int64_t deadline = wsync_deadline_in(timeout_ms);
    while (n) {
        struct pollfd pfd = {fd, POLLIN, 0};
        int r = poll(&pfd, 1, wsync_ms_left(deadline));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        ssize_t got = recv(fd, b, n, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return -1;
        b += got;
        n -= (size_t)got;
    }
    return 0;
}

static int send_blob(int fd, const void *p, uint32_t n)
{
    return send_all(fd, &n, sizeof(n)) || send_all(fd, p, n) ? -1 : 0;
}

static int recv_blob(int fd, void *p, size_t cap, size_t *n)
{
    uint32_t len;
    if (recv_all(fd, &len, sizeof(len), WAIT_MS / 2) || len > cap)
        return -1;
    *n = len;
    return recv_all(fd, p, len, WAIT_MS / 2);
}

/* What the owner publishes. */
typedef struct {
    uint8_t addr[WSYNC_RMA_BLOB_MAX];
    size_t addr_len;
    uint64_t base, len;
    uint8_t key[WSYNC_RMA_BLOB_MAX];
    size_t key_len;
    uint8_t stale_key[WSYNC_RMA_BLOB_MAX]; /* of a region registered, then deregistered */
    size_t stale_key_len;
    uint64_t stale_base;
} published_t;

/* Owner → reader request codes, reader → owner. */
enum { MSG_DONE = 'D', MSG_CHECK = 'H' };

typedef struct {
    int fd;                  /* this child's end of the socketpair */
    int other_fd;            /* the other child's end: closed, so that a death shows as EOF */
    pid_t owner_pid;         /* for the reader that kills its owner */
    void (*reader)(wsync_rma_t *, wsync_rma_peer_t *, const published_t *, int fd, pid_t owner);
} pair_t;

/* ---- the owner ------------------------------------------------------------------------------ */

static int owner_main(void *arg)
{
    const pair_t *p = arg;
    wsync_rma_t *ctx = NULL;
    wsync_rma_mr_t *mr = NULL, *stale = NULL;
    published_t pub;
    char info[256];
    memset(&pub, 0, sizeof(pub));
    close(p->other_fd);

    CHECK_OK(ops->open(hint, info, sizeof(info), &ctx));
    if (!ctx)
        return 1;
    uint8_t *region = aligned_alloc(4096, REGION);
    uint8_t *other = aligned_alloc(4096, MiB);
    if (!region || !other)
        return 1;
    fill(region, 0, REGION, 1);
    memset(other, 0x5a, MiB);

    pub.addr_len = sizeof(pub.addr);
    CHECK_OK(ops->address(ctx, pub.addr, &pub.addr_len));
    /* A region gone before the real one comes: its key is stale, and the serving thread stops
     * with the last registration and starts again with the next. */
    pub.stale_key_len = sizeof(pub.stale_key);
    CHECK_OK(ops->reg(ctx, other, MiB, &stale, pub.stale_key, &pub.stale_key_len));
    pub.stale_base = (uint64_t)(uintptr_t)other;
    ops->dereg(stale);
    pub.key_len = sizeof(pub.key);
    CHECK_OK(ops->reg(ctx, region, REGION, &mr, pub.key, &pub.key_len));
    pub.base = (uint64_t)(uintptr_t)region;
    pub.len = REGION;

    if (send_blob(p->fd, pub.addr, (uint32_t)pub.addr_len) ||
        send_all(p->fd, &pub.base, 8) || send_all(p->fd, &pub.len, 8) ||
        send_blob(p->fd, pub.key, (uint32_t)pub.key_len) ||
        send_blob(p->fd, pub.stale_key, (uint32_t)pub.stale_key_len) ||
        send_all(p->fd, &pub.stale_base, 8)) {
        fprintf(stderr, "owner: publishing failed\n");
        return 1;
    }

    /* Serve until the reader is done; checks of what it wrote use our own view of the bytes. */
    for (;;) {
        uint8_t code;
        if (recv_all(p->fd, &code, 1, WAIT_MS)) {
            fprintf(stderr, "owner: reader went away without saying done\n");
            break;
        }
        if (code == MSG_DONE)
            break;
        if (code == MSG_CHECK) {
            uint64_t q[3]; /* offset, length, expected hash */
            if (recv_all(p->fd, q, sizeof(q), WAIT_MS))
                break;
            uint8_t ok = q[0] + q[1] <= REGION && XXH3_64bits(region + q[0], q[1]) == q[2];
            CHECK_MSG(ok, "owner: bytes written at offset %llu (%llu bytes) differ",
                      (unsigned long long)q[0], (unsigned long long)q[1]);
            if (send_all(p->fd, &ok, 1))
                break;
        }
    }
    ops->dereg(mr);
    ops->close(ctx);
    free(region);
    free(other);
    return 0;
}

/* ---- the reader ----------------------------------------------------------------------------- */

static int reader_main(void *arg)
{
    const pair_t *p = arg;
    wsync_rma_t *ctx = NULL;
    wsync_rma_peer_t *peer = NULL;
    published_t pub;
    char info[256];
    memset(&pub, 0, sizeof(pub));
    close(p->other_fd);

    if (recv_blob(p->fd, pub.addr, sizeof(pub.addr), &pub.addr_len) ||
        recv_all(p->fd, &pub.base, 8, WAIT_MS) || recv_all(p->fd, &pub.len, 8, WAIT_MS) ||
        recv_blob(p->fd, pub.key, sizeof(pub.key), &pub.key_len) ||
        recv_blob(p->fd, pub.stale_key, sizeof(pub.stale_key), &pub.stale_key_len) ||
        recv_all(p->fd, &pub.stale_base, 8, WAIT_MS)) {
        fprintf(stderr, "reader: the owner published nothing\n");
        return 1;
    }
    CHECK_OK(ops->open(hint, info, sizeof(info), &ctx));
    if (!ctx)
        return 1;
    if (getenv("WSYNC_OFI_MR_LOCAL"))
        CHECK_MSG(strstr(info, "registered per op") != NULL, "not forced: %s", info);
    CHECK_OK(ops->connect(ctx, pub.addr, pub.addr_len, &peer));
    if (peer)
        p->reader(ctx, peer, &pub, p->fd, p->owner_pid);
    uint8_t done = MSG_DONE;
    send_all(p->fd, &done, 1);
    if (peer)
        ops->disconnect(peer);
    int64_t t0 = wsync_now_ms();
    ops->close(ctx);
    CHECK_MSG(wsync_now_ms() - t0 < 5000, "close took %lld ms",
              (long long)(wsync_now_ms() - t0));
    return 0;
}

/* libfabric's shm provider keeps each endpoint in /dev/shm/<pid>:<n>:<m> and unlinks it on
 * close: a SIGKILLed owner leaves its file behind, which we remove. */
static void remove_shm_leftovers(pid_t pid)
{
    char prefix[32], path[300];
    snprintf(prefix, sizeof(prefix), "%d:", (int)pid);
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
            unlink(path);
        }
    closedir(d);
}

/* Owner and reader, each in its own process; both must exit 0. */
static void run_pair(void (*reader)(wsync_rma_t *, wsync_rma_peer_t *, const published_t *, int,
                                    pid_t),
                     int owner_may_die)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        CHECK_MSG(0, "socketpair: %s", strerror(errno));
        return;
    }
    pair_t po = {.fd = sv[0], .other_fd = sv[1]};
    pair_t pr = {.fd = sv[1], .other_fd = sv[0], .reader = reader};
    pid_t pids[2];
    pids[0] = proc_spawn(owner_main, &po, CHILD_LIMIT_S);
    pr.owner_pid = pids[0];
    pids[1] = proc_spawn(reader_main, &pr, CHILD_LIMIT_S);
    close(sv[0]);
    close(sv[1]);
    int codes[2];
    proc_wait_all(pids, 2, WAIT_MS, codes);
    if (owner_may_die) {
        CHECK_MSG(codes[0] == 128 + SIGKILL, "owner exit %d, expected SIGKILL", codes[0]);
        remove_shm_leftovers(pids[0]);
    }
    else
        CHECK_MSG(codes[0] == 0, "owner exit %d", codes[0]);
    CHECK_MSG(codes[1] == 0, "reader exit %d", codes[1]);
}

static wsync_rma_rkey_t *import(wsync_rma_peer_t *peer, const void *blob, size_t len)
{
    wsync_rma_rkey_t *k = NULL;
    CHECK_OK(ops->rkey_import(peer, blob, len, &k));
    return k;
}

/* (1) 64 MiB in 64 reads of 1 MiB, all in flight, and 3 bytes at an odd address into an odd
 * destination. */
static void read_bulk(wsync_rma_t *ctx, wsync_rma_peer_t *peer, const published_t *pub, int fd,
                      pid_t owner)
{
    (void)fd;
    (void)owner;
    wsync_rma_rkey_t *k = import(peer, pub->key, pub->key_len);
    uint8_t *dst = aligned_alloc(4096, REGION);
    uint8_t small[8] = {0};
    if (!k || !dst)
        return;
    memset(dst, 0, REGION);
    for (size_t off = 0; off < REGION; off += MiB)
        CHECK_OK(ops->get(peer, k, pub->base + off, dst + off, MiB));
    CHECK_OK(ops->get(peer, k, pub->base + 12345677, small + 1, 3));
    CHECK_OK(ops->flush(ctx, wsync_deadline_in(FLUSH_MS)));
    CHECK_MSG(XXH3_64bits(dst, REGION) == pattern_hash(0, REGION, 1),
              "64 MiB read differs from the pattern");
    uint8_t want[3];
    fill(want, 12345677, 3, 1);
    CHECK(memcmp(small + 1, want, 3) == 0);
    CHECK(small[0] == 0 && small[4] == 0);
    /* A flush with nothing posted returns at once. */
    int64_t t0 = wsync_now_ms();
    CHECK_OK(ops->flush(ctx, wsync_deadline_in(FLUSH_MS)));
    CHECK(wsync_now_ms() - t0 < 1000);
    ops->rkey_free(k);
    free(dst);
}

static int owner_check(int fd, size_t off, size_t len, uint64_t hash)
{
    uint8_t code = MSG_CHECK, ok = 0;
    uint64_t q[3] = {off, len, hash};
    if (send_all(fd, &code, 1) || send_all(fd, q, sizeof(q)) || recv_all(fd, &ok, 1, WAIT_MS))
        return 0;
    return ok;
}

/* (2) writes, then reads of what was written; the owner checks its memory too. */
static void write_read(wsync_rma_t *ctx, wsync_rma_peer_t *peer, const published_t *pub, int fd,
                       pid_t owner)
{
    (void)owner;
    const size_t off = 3 * MiB + 7, len = 8 * MiB + 13;
    wsync_rma_rkey_t *k = import(peer, pub->key, pub->key_len);
    uint8_t *src = malloc(len), *back = malloc(len);
    if (!k || !src || !back)
        return;
    fill(src, 0, len, 2);
    memset(back, 0, len);
    for (size_t at = 0; at < len; at += MiB)
        CHECK_OK(ops->put(peer, k, pub->base + off + at, src + at, WSYNC_MIN(MiB, len - at)));
    CHECK_OK(ops->flush(ctx, wsync_deadline_in(FLUSH_MS)));
    CHECK_MSG(owner_check(fd, off, len, XXH3_64bits(src, len)),
              "owner's memory lacks what was written");
    CHECK_OK(ops->get(peer, k, pub->base + off, back, len));
    /* The bytes around the write are the owner's original pattern. */
    uint8_t edge[2];
    CHECK_OK(ops->get(peer, k, pub->base + off - 1, &edge[0], 1));
    CHECK_OK(ops->get(peer, k, pub->base + off + len, &edge[1], 1));
    CHECK_OK(ops->flush(ctx, wsync_deadline_in(FLUSH_MS)));
    CHECK(memcmp(src, back, len) == 0);
    uint8_t want[1];
    fill(want, off - 1, 1, 1);
    CHECK(edge[0] == want[0]);
    fill(want, off + len, 1, 1);
    CHECK(edge[1] == want[0]);
    ops->rkey_free(k);
    free(src);
    free(back);
}

/* Copies of a packed key with fields replaced. ofi.c's format ends with key, base, length (8
 * bytes each, little-endian): a forged base or length lets a read the transport would refuse
 * through to the provider, which is how we learn what the provider itself does. */
enum { FIELD_KEY, FIELD_BASE, FIELD_LEN };

static void patch(uint8_t *blob, size_t len, int field, uint64_t value)
{
    size_t at = len - 24 + 8 * (size_t)field;
    for (int i = 0; i < 8; i++)
        blob[at + i] = (uint8_t)(value >> (8 * i));
}

/* The owner's key with one field replaced, into out. */
static void forge(const published_t *pub, uint8_t *out, int field, uint64_t value)
{
    memcpy(out, pub->key, pub->key_len);
    patch(out, pub->key_len, field, value);
}

/* Reads a good MiB until it works: after a failure tcp;ofi_rxm has dropped the connection and
 * opens a new one only once it has processed the shutdown, so the first tries may fail. */
static void expect_recovery(wsync_rma_t *ctx, wsync_rma_peer_t *peer, wsync_rma_rkey_t *k,
                            const published_t *pub, const char *after)
{
    static uint8_t dst[1 << 20];
    int64_t t0 = wsync_now_ms(), deadline = wsync_deadline_in(FAIL_FLUSH_MS);
    wsync_status_t st;
    int tries = 0;
    do {
        tries++;
        memset(dst, 0, sizeof(dst));
        st = ops->get(peer, k, pub->base + 5 * MiB, dst, MiB);
        if (st == WSYNC_OK)
            st = ops->flush(ctx, deadline);
        if (st != WSYNC_OK)
            usleep(20000);
    } while (st != WSYNC_OK && wsync_now_ms() < deadline);
    if (tries > 1)
        fprintf(stderr, "  good read after %s over %s: %s after %d tries, %lld ms\n", after, hint,
                wsync_status_name(st), tries, (long long)(wsync_now_ms() - t0));
    CHECK_MSG(st == WSYNC_OK, "no good read after %s: %s", after, wsync_last_error());
    CHECK(XXH3_64bits(dst, MiB) == pattern_hash(5 * MiB, MiB, 1));
}

/* One bad read. must_fail: an error from get or flush, naming the read, before the deadline;
 * otherwise (what shm does, see below) only that the answer came in time. Prints the outcome. */
static void bad_read(wsync_rma_t *ctx, wsync_rma_peer_t *peer, wsync_rma_rkey_t *k,
                     uint64_t addr, size_t len, const char *what, int must_fail)
{
    uint8_t *dst = malloc(len);
    if (!dst)
        return;
    int64_t t0 = wsync_now_ms();
    wsync_status_t st = ops->get(peer, k, addr, dst, len);
    const char *where = "get";
    if (st == WSYNC_OK) {
        where = "flush";
        st = ops->flush(ctx, wsync_deadline_in(FAIL_FLUSH_MS));
    }
    int64_t ms = wsync_now_ms() - t0;
    fprintf(stderr, "  %s over %s: %s from %s after %lld ms%s%s\n", what, hint,
            wsync_status_name(st), where, (long long)ms, st ? ": " : "",
            st ? wsync_last_error() : "");
    CHECK_MSG(st != WSYNC_ERR_TIMEOUT, "%s: no answer before the deadline", what);
    CHECK_MSG(ms < FAIL_FLUSH_MS + 1000, "%s: took %lld ms", what, (long long)ms);
    if (must_fail) {
        CHECK_MSG(st != WSYNC_OK, "%s: succeeded", what);
        if (st != WSYNC_OK)
            CHECK_MSG(strstr(wsync_last_error(), "get") && strstr(wsync_last_error(), "bytes"),
                      "%s: message \"%s\" does not name the read", what, wsync_last_error());
    }
    free(dst);
}

/* (3) reads outside the region and with wrong keys fail, and the context works after each. */
static void bad_reads(wsync_rma_t *ctx, wsync_rma_peer_t *peer, const published_t *pub, int fd,
                      pid_t owner)
{
    (void)fd;
    (void)owner;
    wsync_rma_rkey_t *k = import(peer, pub->key, pub->key_len);
    if (!k)
        return;
    /* shm (libfabric 1.17) copies with process_vm_readv from the reader, checking neither keys
     * nor registrations: only memory the owner does not map at all fails. */
    int checks_keys = strcmp(hint, "shm") != 0;

    /* Caught by the transport from the region the owner published. */
    bad_read(ctx, peer, k, pub->base + pub->len - 100, 4096, "read across the end", 1);
    CHECK_ERR_HAS("outside the registered region");
    bad_read(ctx, peer, k, pub->base - 4096, 16, "read before the start", 1);
    CHECK_ERR_HAS("outside the registered region");
    bad_read(ctx, peer, k, UINT64_MAX - 8, 16, "read wrapping around", 1);

    /* What the provider does with what only it can catch. */
    uint8_t forged[WSYNC_RMA_BLOB_MAX];
    struct {
        const char *what;
        const uint8_t *blob;
        size_t len;
        int field;
        uint64_t value, addr;
        int must_fail;
    } cases[] = {
        {"provider: read across the end", NULL, 0, FIELD_LEN, pub->len + 16 * MiB,
         pub->base + pub->len - 2048, checks_keys},
        {"provider: read wholly past the end", NULL, 0, FIELD_LEN, pub->len + 16 * MiB,
         pub->base + pub->len + 8 * MiB, checks_keys},
        {"provider: stale key", pub->stale_key, pub->stale_key_len, -1, 0, pub->stale_base,
         checks_keys},
        {"provider: wrong key", NULL, 0, FIELD_KEY, 0x5eed0000beefull, pub->base, checks_keys},
        /* Only where targets are virtual addresses; tcp takes offsets into the region. */
        {"provider: unmapped address", NULL, 0, FIELD_BASE, 0, 4096, 1},
    };
    for (size_t i = 0; i < WSYNC_ARRAY_SIZE(cases); i++) {
        if (cases[i].field == FIELD_BASE && checks_keys)
            continue;
        const uint8_t *blob = cases[i].blob;
        size_t n = cases[i].len;
        if (!blob) {
            forge(pub, forged, cases[i].field, cases[i].value);
            if (cases[i].field == FIELD_BASE) /* base 0: the length reaches the region's end */
                patch(forged, pub->key_len, FIELD_LEN, pub->base + pub->len);
            blob = forged;
            n = pub->key_len;
        }
        wsync_rma_rkey_t *bad = import(peer, blob, n);
        if (!bad)
            continue;
        bad_read(ctx, peer, bad, cases[i].addr, 4096, cases[i].what, cases[i].must_fail);
        ops->rkey_free(bad);
        expect_recovery(ctx, peer, k, pub, cases[i].what);
    }

    /* Malformed blobs are refused by rkey_import and connect. */
    wsync_rma_rkey_t *bad = NULL;
    CHECK_ST(ops->rkey_import(peer, pub->key, pub->key_len - 1, &bad), WSYNC_ERR_INVALID);
    CHECK(bad == NULL);
    CHECK_ST(ops->rkey_import(peer, pub->addr, pub->addr_len, &bad), WSYNC_ERR_INVALID);
    CHECK(bad == NULL);
    forge(pub, forged, FIELD_LEN, 0);
    CHECK_ST(ops->rkey_import(peer, forged, pub->key_len, &bad), WSYNC_ERR_INVALID);
    forge(pub, forged, FIELD_BASE, UINT64_MAX - 8);
    CHECK_ST(ops->rkey_import(peer, forged, pub->key_len, &bad), WSYNC_ERR_INVALID);
    wsync_rma_peer_t *nowhere = NULL;
    CHECK_ST(ops->connect(ctx, pub->key, pub->key_len, &nowhere), WSYNC_ERR_INVALID);
    CHECK(nowhere == NULL);
    CHECK_ST(ops->connect(ctx, pub->addr, pub->addr_len - 1, &nowhere), WSYNC_ERR_INVALID);
    ops->rkey_free(k);
}

/* Whether the other end of fd closed (its process is gone) within timeout_ms. */
static int wait_eof(int fd, int timeout_ms)
{
    uint8_t c;
    int64_t deadline = wsync_deadline_in(timeout_ms);
    while (wsync_now_ms() < deadline) {
        struct pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, wsync_ms_left(deadline)) > 0 && recv(fd, &c, 1, 0) == 0)
            return 1;
    }
    return 0;
}

/* (4) the owner is stopped, reads are posted, the owner is SIGKILLed: flush answers within its
 * deadline (an error, or success if the provider had finished the reads: shm copies at once),
 * and reads posted once the owner is gone fail within theirs. */
static void owner_killed(wsync_rma_t *ctx, wsync_rma_peer_t *peer, const published_t *pub,
                         int fd, pid_t owner)
{
    wsync_rma_rkey_t *k = import(peer, pub->key, pub->key_len);
    uint8_t *dst = aligned_alloc(4096, REGION);
    if (!k || !dst)
        return;
    /* One good read first, so that the connection exists when the owner dies. */
    CHECK_OK(ops->get(peer, k, pub->base, dst, MiB));
    CHECK_OK(ops->flush(ctx, wsync_deadline_in(FLUSH_MS)));

    kill(owner, SIGSTOP);
    memset(dst, 0, REGION);
    for (size_t off = 0; off < REGION; off += MiB)
        CHECK_OK(ops->get(peer, k, pub->base + off, dst + off, MiB));
    kill(owner, SIGKILL);
    int64_t t0 = wsync_now_ms();
    wsync_status_t st = ops->flush(ctx, wsync_deadline_in(FAIL_FLUSH_MS));
    int64_t ms = wsync_now_ms() - t0;
    fprintf(stderr, "  killed with reads posted, over %s: %s after %lld ms%s%s\n", hint,
            wsync_status_name(st), (long long)ms, st ? ": " : "", st ? wsync_last_error() : "");
    CHECK_MSG(ms < FAIL_FLUSH_MS + 1000, "flush took %lld ms", (long long)ms);
    if (st == WSYNC_OK)
        CHECK_MSG(XXH3_64bits(dst, REGION) == pattern_hash(0, REGION, 1),
                  "flush succeeded but the bytes are wrong");
    else
        CHECK_MSG(strstr(wsync_last_error(), "get (fi_read)") != NULL, "message: %s",
                  wsync_last_error());

    CHECK_MSG(wait_eof(fd, 10000), "the owner did not die");
    t0 = wsync_now_ms();
    st = ops->get(peer, k, pub->base, dst, MiB);
    if (st == WSYNC_OK)
        st = ops->flush(ctx, wsync_deadline_in(3000));
    ms = wsync_now_ms() - t0;
    fprintf(stderr, "  read from the dead owner over %s: %s after %lld ms%s%s\n", hint,
            wsync_status_name(st), (long long)ms, st ? ": " : "", st ? wsync_last_error() : "");
    CHECK_MSG(st != WSYNC_OK, "a read from the dead owner succeeded");
    CHECK_MSG(ms < 4000, "took %lld ms", (long long)ms);
    ops->rkey_free(k);
    free(dst);
}

static void case_bulk(void) { run_pair(read_bulk, 0); }
/* The FI_MR_LOCAL path (each local buffer registered for its operation), which tcp and shm do
 * not demand: forced, so that it runs somewhere. */
static void case_bulk_local_mr(void)
{
    setenv("WSYNC_OFI_MR_LOCAL", "1", 1);
    run_pair(read_bulk, 0);
    run_pair(write_read, 0);
    unsetenv("WSYNC_OFI_MR_LOCAL");
}
static void case_write_read(void) { run_pair(write_read, 0); }
static void case_bad_reads(void) { run_pair(bad_reads, 0); }
static void case_owner_killed(void) { run_pair(owner_killed, 1); }

/* Whether the provider opens here; in a child, so the parent never holds libfabric state when it
 * forks. Prints why not. */
static int probe_main(void *arg)
{
    (void)arg;
    wsync_rma_t *ctx = NULL;
    char info[256];
    wsync_status_t st = ops->open(hint, info, sizeof(info), &ctx);
    if (st != WSYNC_OK) {
        printf("skipping provider %s: %s\n", hint, wsync_last_error());
        return 77;
    }
    printf("provider %s: %s\n", hint, info);
    ops->close(ctx);
    return 0;
}

/* The transport refuses what it cannot use, without a provider. */
static void case_refusals(void)
{
    wsync_rma_t *ctx = NULL;
    char info[256];
    CHECK_ST(ops->open("no-such-provider", info, sizeof(info), &ctx), WSYNC_ERR_UNSUPPORTED);
    CHECK_ERR_HAS("no-such-provider");
    CHECK(ctx == NULL);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    ops = wsync_rma_ofi();
    if (!ops) {
        printf("skipped: built without libfabric\n");
        return 0;
    }
    static const char *const providers[] = {"tcp", "shm"};
    int tried = 0;
    for (size_t i = 0; i < WSYNC_ARRAY_SIZE(providers); i++) {
        hint = providers[i];
        const char *only = getenv("WSYNC_TEST_OFI_PROVIDER"); /* to debug one provider */
        if (only && strcmp(only, hint) != 0)
            continue;
        pid_t pid = proc_spawn(probe_main, NULL, 60);
        int code;
        proc_wait_all(&pid, 1, 60000, &code);
        if (code != 0) {
            if (code != 77)
                printf("provider %s: probe exited %d\n", hint, code);
            continue;
        }
        tried++;
        char name[64];
        snprintf(name, sizeof(name), "%s: bulk reads", hint);
        check_run(name, case_bulk);
        snprintf(name, sizeof(name), "%s: writes read back", hint);
        check_run(name, case_write_read);
        snprintf(name, sizeof(name), "%s: local buffers registered (FI_MR_LOCAL)", hint);
        check_run(name, case_bulk_local_mr);
        snprintf(name, sizeof(name), "%s: bad addresses and keys", hint);
        check_run(name, case_bad_reads);
        snprintf(name, sizeof(name), "%s: owner killed", hint);
        check_run(name, case_owner_killed);
    }
    RUN(case_refusals);
    if (!tried)
        printf("no libfabric provider worked here (see above)\n");
    return check_summary();
}
