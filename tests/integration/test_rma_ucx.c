/* The ucx RMA transport (transports/rma.h) between two processes, with no wsync control plane: an
 * owner registers a region and hands its address, key and region to a reader over a socketpair;
 * the reader gets (and puts) and compares hashes with what the owner computes over its own
 * memory. Then the failures: ranges outside the region, corrupted or foreign blobs, an owner
 * killed or stopped while gets are in flight (or their replies), readers killed or stopped while
 * the owner serves them. Each must come back as an error naming the op and the peer, within a
 * deadline, and crash nothing. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/util.h"
#include "tests/support/check.h"
#include "tests/support/proc.h"
#include "transports/rma.h"
#include "wsync/wsync.h"

#define MiB ((size_t)1024 * 1024)
#define REGION (64 * MiB)
#define MSG_MS 30000 /* any one message between the test's processes */

static const wsync_rma_ops_t *ops;

/* ---- messages between the test's processes: u32 length, then bytes ---------------------------- */

static int io_full(int fd, void *p, size_t n, int writing, int64_t deadline)
{
    uint8_t *b = p;
    while (n > 0) {
        struct pollfd pfd = {fd, writing ? POLLOUT : POLLIN, 0};
        int left = wsync_ms_left(deadline);
        if (poll(&pfd, 1, left) <= 0)
            return -1;
        ssize_t r = writing ? write(fd, b, n) : read(fd, b, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

static int send_msg(int fd, const void *p, size_t n)
{
    uint32_t len = (uint32_t)n;
    int64_t deadline = wsync_deadline_in(MSG_MS);
    if (io_full(fd, &len, sizeof(len), 1, deadline) != 0)
        return -1;
    return n ? io_full(fd, (void *)(uintptr_t)p, n, 1, deadline) : 0;
}

/* Returns the length received, or -1 on EOF, error, timeout or a message over cap. */
static long recv_msg(int fd, void *p, size_t cap, int timeout_ms)
{
    uint32_t len;
    int64_t deadline = wsync_deadline_in(timeout_ms);
    if (io_full(fd, &len, sizeof(len), 0, deadline) != 0 || len > cap)
        return -1;
    if (len && io_full(fd, p, len, 0, deadline) != 0)
        return -1;
    return (long)len;
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w = splitmix64(seed ^ i);
        memcpy(p + i, &w, n - i < 8 ? n - i : 8);
    }
}

/* ---- the owner ------------------------------------------------------------------------------- */

typedef struct {
    const char *hint;
    int fds[2];            /* one socket per reader, served in turn (-1: none) */
    int close_fds[4];      /* the other processes' ends, closed in this child (-1: none) */
    int foreign_key;       /* also send a key made by a second context */
} owner_cfg_t;

typedef struct {
    uint64_t base, len, hash;
} region_meta_t;

static void close_list(const int *fds, int n)
{
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* Serves one reader: hashes of slices of its own memory on request, until 'Q' or EOF. */
static int owner_serve(int fd, const uint8_t *region, size_t len)
{
    uint8_t cmd[32];
    for (;;) {
        long n = recv_msg(fd, cmd, sizeof(cmd), 120000);
        if (n < 0)
            return 0; /* the reader left (or was killed) */
        if (n == 1 && cmd[0] == 'Q')
            return 1;
        if (n == 17 && cmd[0] == 'H') {
            uint64_t off, sz, h = 0;
            memcpy(&off, cmd + 1, 8);
            memcpy(&sz, cmd + 9, 8);
            if (off <= len && sz <= len - off)
                h = XXH3_64bits(region + off, sz);
            send_msg(fd, &h, sizeof(h));
        }
    }
}

static int owner_main(void *arg)
{
    const owner_cfg_t *cfg = arg;
    wsync_rma_t *ctx = NULL, *ctx2 = NULL;
    wsync_rma_mr_t *mr = NULL, *mr2 = NULL;
    uint8_t addr[WSYNC_RMA_BLOB_MAX], key[WSYNC_RMA_BLOB_MAX], key2[WSYNC_RMA_BLOB_MAX];
    size_t addr_len = sizeof(addr), key_len = sizeof(key), key2_len = 0;
    char info[256];
    static uint8_t small[4096];

    close_list(cfg->close_fds, 4);
    uint8_t *region = aligned_alloc(4096, REGION);
    CHECK(region != NULL);
    if (region == NULL)
        return 1;
    fill(region, REGION, 0x0123);
    CHECK_OK(ops->open(cfg->hint, info, sizeof(info), &ctx));
    if (ctx == NULL)
        return 1;
    fprintf(stderr, "owner %d: %s\n", (int)getpid(), info);
    CHECK_OK(ops->address(ctx, addr, &addr_len));
    CHECK_OK(ops->reg(ctx, region, REGION, &mr, key, &key_len));
    if (cfg->foreign_key) {
        key2_len = sizeof(key2);
        CHECK_OK(ops->open(cfg->hint, NULL, 0, &ctx2));
        CHECK_OK(ops->reg(ctx2, small, sizeof(small), &mr2, key2, &key2_len));
    }
    region_meta_t meta = {(uint64_t)(uintptr_t)region, REGION, XXH3_64bits(region, REGION)};
    for (int r = 0; r < 2 && cfg->fds[r] >= 0; r++) {
        int fd = cfg->fds[r];
        CHECK(send_msg(fd, addr, addr_len) == 0);
        CHECK(send_msg(fd, key, key_len) == 0);
        CHECK(send_msg(fd, &meta, sizeof(meta)) == 0);
        CHECK(send_msg(fd, key2, key2_len) == 0);
        owner_serve(fd, region, REGION);
    }
    ops->dereg(mr2);
    ops->close(ctx2);
    ops->dereg(mr);
    ops->close(ctx);
    free(region);
    return 0;
}

/* ---- the reader ------------------------------------------------------------------------------ */

enum { R_BULK, R_PUT, R_BAD, R_OWNER_KILLED, R_OWNER_STOPPED, R_OWNER_STOPPED_MID, R_KILLED };

typedef struct {
    const char *hint;
    int mode;
    int fd;                /* to the owner */
    int ctl;               /* to the test (kill/stop cases), else -1 */
    int close_fds[4];
    int owner_pid;
} reader_cfg_t;

typedef struct {
    wsync_rma_t *ctx;
    wsync_rma_peer_t *peer;
    wsync_rma_rkey_t *rkey;
    uint8_t addr[WSYNC_RMA_BLOB_MAX], key[WSYNC_RMA_BLOB_MAX], key2[WSYNC_RMA_BLOB_MAX];
    long addr_len, key_len, key2_len;
    region_meta_t meta;
} reader_t;

/* The owner's blobs, as it sends them to each reader. */
static int reader_recv_blobs(int fd, reader_t *r)
{
    memset(r, 0, sizeof(*r));
    r->addr_len = recv_msg(fd, r->addr, sizeof(r->addr), MSG_MS);
    r->key_len = recv_msg(fd, r->key, sizeof(r->key), MSG_MS);
    CHECK(recv_msg(fd, &r->meta, sizeof(r->meta), MSG_MS) == sizeof(r->meta));
    r->key2_len = recv_msg(fd, r->key2, sizeof(r->key2), MSG_MS);
    CHECK(r->addr_len > 0 && r->key_len > 0 && r->key2_len >= 0);
    return r->addr_len > 0 && r->key_len > 0 ? 0 : -1;
}

/* Opens a context, connects to the owner and imports its key. */
static int reader_connect(const char *hint, reader_t *r)
{
    char info[256];
    CHECK_OK(ops->open(hint, info, sizeof(info), &r->ctx));
    if (r->ctx == NULL)
        return -1;
    fprintf(stderr, "reader %d: %s\n", (int)getpid(), info);
    CHECK_OK(ops->connect(r->ctx, r->addr, (size_t)r->addr_len, &r->peer));
    if (r->peer == NULL)
        return -1;
    CHECK_OK(ops->rkey_import(r->peer, r->key, (size_t)r->key_len, &r->rkey));
    return r->rkey ? 0 : -1;
}

static int reader_setup(const reader_cfg_t *cfg, reader_t *r)
{
    if (reader_recv_blobs(cfg->fd, r) != 0)
        return -1;
    return reader_connect(cfg->hint, r);
}

static void reader_teardown(const reader_cfg_t *cfg, reader_t *r)
{
    if (cfg->fd >= 0)
        send_msg(cfg->fd, "Q", 1);
    ops->rkey_free(r->rkey);
    ops->disconnect(r->peer);
    ops->close(r->ctx);
}

/* The owner's hash of its bytes [off, off + len). */
static uint64_t owner_hash(int fd, uint64_t off, uint64_t len)
{
    uint8_t cmd[17] = {'H'};
    uint64_t h = 0;
    memcpy(cmd + 1, &off, 8);
    memcpy(cmd + 9, &len, 8);
    CHECK(send_msg(fd, cmd, sizeof(cmd)) == 0);
    CHECK(recv_msg(fd, &h, sizeof(h), MSG_MS) == sizeof(h));
    return h;
}

/* The whole region in 1 MiB gets, all in flight before one flush, and a 3-byte unaligned get. */
static void read_region(const reader_cfg_t *cfg, reader_t *r)
{
    uint8_t *dst = malloc(REGION), small[8];
    CHECK(dst != NULL);
    if (dst == NULL)
        return;
    memset(dst, 0xee, REGION);
    for (size_t off = 0; off < REGION; off += MiB)
        CHECK_OK(ops->get(r->peer, r->rkey, r->meta.base + off, dst + off, MiB));
    CHECK_OK(ops->get(r->peer, r->rkey, r->meta.base + 12345, small + 1, 3));
    long long t0 = proc_now_ms();
    CHECK_OK(ops->flush(r->ctx, wsync_deadline_in(60000)));
    fprintf(stderr, "reader: 64 MiB in %lld ms\n", proc_now_ms() - t0);
    CHECK_MSG(XXH3_64bits(dst, REGION) == r->meta.hash, "64 MiB differ from the owner's");
    CHECK_MSG(XXH3_64bits(small + 1, 3) == owner_hash(cfg->fd, 12345, 3),
              "3 bytes at offset 12345 differ from the owner's");
    free(dst);
}

static void reader_bulk(const reader_cfg_t *cfg, reader_t *r)
{
    read_region(cfg, r);
}

/* Puts at an unaligned offset, then gets them back; the owner confirms its memory changed there
 * and only there. */
static void reader_put(const reader_cfg_t *cfg, reader_t *r)
{
    const size_t n = 4 * MiB, piece = 256 * 1024;
    const uint64_t off = MiB + 7;
    uint8_t *src = malloc(n), *back = malloc(n);
    CHECK(src != NULL && back != NULL);
    if (src == NULL || back == NULL)
        return;
    fill(src, n, 0xfeed);
    memset(back, 0, n);
    uint64_t before_lo = owner_hash(cfg->fd, 0, off);
    uint64_t before_hi = owner_hash(cfg->fd, off + n, REGION - off - n);
    for (size_t i = 0; i < n; i += piece)
        CHECK_OK(ops->put(r->peer, r->rkey, r->meta.base + off + i, src + i, piece));
    CHECK_OK(ops->flush(r->ctx, wsync_deadline_in(30000)));
    for (size_t i = 0; i < n; i += piece)
        CHECK_OK(ops->get(r->peer, r->rkey, r->meta.base + off + i, back + i, piece));
    CHECK_OK(ops->flush(r->ctx, wsync_deadline_in(30000)));
    CHECK_MSG(memcmp(src, back, n) == 0, "bytes read back differ from those put");
    CHECK_MSG(owner_hash(cfg->fd, off, n) == XXH3_64bits(src, n),
              "the owner's memory does not hold what was put");
    CHECK_MSG(owner_hash(cfg->fd, 0, off) == before_lo &&
                  owner_hash(cfg->fd, off + n, REGION - off - n) == before_hi,
              "a put changed the owner's memory outside its range");
    free(src);
    free(back);
}

/* Everything wrong a reader can hand the transport; then a good get must still work. */
static void reader_bad(const reader_cfg_t *cfg, reader_t *r)
{
    uint8_t buf[8192], blob[WSYNC_RMA_BLOB_MAX];
    wsync_rma_rkey_t *rk = NULL;
    wsync_rma_peer_t *peer = NULL;
    const uint64_t end = r->meta.base + r->meta.len;
    long long t0 = proc_now_ms();

    /* ranges: past the end, before the start, larger than the region, a put past the end */
    CHECK_ST(ops->get(r->peer, r->rkey, end - 100, buf, 4096), WSYNC_ERR_RANGE);
    CHECK_ERR_HAS("get of 4096 bytes");
    CHECK_ERR_HAS("outside the registered region");
    CHECK_ST(ops->get(r->peer, r->rkey, end, buf, 1), WSYNC_ERR_RANGE);
    CHECK_ST(ops->get(r->peer, r->rkey, r->meta.base - 1, buf, 8), WSYNC_ERR_RANGE);
    CHECK_ST(ops->get(r->peer, r->rkey, r->meta.base + 1, buf, (size_t)r->meta.len),
             WSYNC_ERR_RANGE);
    CHECK_ST(ops->get(r->peer, r->rkey, UINT64_MAX - 10, buf, 100), WSYNC_ERR_RANGE);
    CHECK_ST(ops->put(r->peer, r->rkey, end - 1, buf, 2), WSYNC_ERR_RANGE);
    CHECK_ERR_HAS("put of 2 bytes");

    /* key blobs: flipped UCX bytes, truncated, zeroed, junk, empty, from another context */
    memcpy(blob, r->key, (size_t)r->key_len);
    for (long i = r->key_len - 8; i < r->key_len; i++)
        blob[i] ^= 0x5a;
    CHECK_ST(ops->rkey_import(r->peer, blob, (size_t)r->key_len, &rk), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("checksum");
    CHECK(rk == NULL);
    CHECK_ST(ops->rkey_import(r->peer, r->key, (size_t)r->key_len - 1, &rk), WSYNC_ERR_INVALID);
    memset(blob, 0, sizeof(blob));
    CHECK_ST(ops->rkey_import(r->peer, blob, (size_t)r->key_len, &rk), WSYNC_ERR_INVALID);
    fill(blob, sizeof(blob), 99);
    CHECK_ST(ops->rkey_import(r->peer, blob, sizeof(blob), &rk), WSYNC_ERR_INVALID);
    CHECK_ST(ops->rkey_import(r->peer, blob, 0, &rk), WSYNC_ERR_INVALID);
    CHECK_ST(ops->rkey_import(r->peer, r->addr, (size_t)r->addr_len, &rk), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("magic");
    CHECK(r->key2_len > 0);
    if (r->key2_len > 0) {
        CHECK_ST(ops->rkey_import(r->peer, r->key2, (size_t)r->key2_len, &rk),
                 WSYNC_ERR_INVALID);
        CHECK_ERR_HAS("another context");
    }
    CHECK(rk == NULL);

    /* address blobs: flipped, truncated, a key instead */
    memcpy(blob, r->addr, (size_t)r->addr_len);
    blob[r->addr_len / 2] ^= 1;
    CHECK_ST(ops->connect(r->ctx, blob, (size_t)r->addr_len, &peer), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("checksum");
    CHECK_ST(ops->connect(r->ctx, r->addr, 10, &peer), WSYNC_ERR_INVALID);
    CHECK_ST(ops->connect(r->ctx, r->key, (size_t)r->key_len, &peer), WSYNC_ERR_INVALID);
    CHECK(peer == NULL);

    /* none of that was posted; the connection still works */
    CHECK_OK(ops->flush(r->ctx, wsync_deadline_in(10000)));
    CHECK_MSG(proc_now_ms() - t0 < 10000, "the failures took %lld ms", proc_now_ms() - t0);
    CHECK_OK(ops->get(r->peer, r->rkey, end - 4096, buf, 4096));
    CHECK_OK(ops->flush(r->ctx, wsync_deadline_in(10000)));
    CHECK(XXH3_64bits(buf, 4096) == owner_hash(cfg->fd, r->meta.len - 4096, 4096));
}

/* Posts 256 MiB of gets (the region four times over) into one 64 MiB buffer. */
static uint8_t *post_many(reader_t *r)
{
    uint8_t *dst = malloc(REGION);
    CHECK(dst != NULL);
    if (dst == NULL)
        return NULL;
    for (int round = 0; round < 4; round++)
        for (size_t off = 0; off < REGION; off += MiB)
            CHECK_OK(ops->get(r->peer, r->rkey, r->meta.base + off, dst + off, MiB));
    return dst;
}

static void reader_owner_gone(const reader_cfg_t *cfg, reader_t *r)
{
    char c = 0, pid[32];
    int stopped = cfg->mode != R_OWNER_KILLED;
    if (cfg->mode == R_OWNER_STOPPED) { /* the test stops the owner first, then we post */
        CHECK(send_msg(cfg->ctl, "R", 1) == 0);
        CHECK(recv_msg(cfg->ctl, &c, 1, MSG_MS) == 1 && c == 'S');
    }
    uint8_t *dst = post_many(r);
    if (!stopped) { /* the test kills the owner while our gets are posted */
        CHECK(send_msg(cfg->ctl, "P", 1) == 0);
        CHECK(recv_msg(cfg->ctl, &c, 1, MSG_MS) == 1 && c == 'K');
    }
    if (cfg->mode == R_OWNER_STOPPED_MID) /* ... stops it while the bytes flow, in our flush */
        CHECK(send_msg(cfg->ctl, "R", 1) == 0);
    int limit = stopped ? 1500 : 20000;
    long long t0 = proc_now_ms();
    wsync_status_t st = ops->flush(r->ctx, wsync_deadline_in(limit));
    long long took = proc_now_ms() - t0;
    if (cfg->mode == R_OWNER_STOPPED_MID)
        CHECK(recv_msg(cfg->ctl, &c, 1, MSG_MS) == 1 && c == 'S');
    fprintf(stderr, "reader: flush with the owner %s: %s after %lld ms: %s\n",
            stopped ? "stopped" : "killed", wsync_status_name(st), took, wsync_last_error());
    if (stopped)
        CHECK_ST(st, WSYNC_ERR_TIMEOUT);
    else
        CHECK_MSG(st == WSYNC_ERR_PEER_LOST || st == WSYNC_ERR_TRANSPORT ||
                      st == WSYNC_ERR_TIMEOUT, "flush returned %s", wsync_status_name(st));
    /* the deadline, plus what cancelling the rest may take */
    CHECK_MSG(took < limit + 3000, "flush took %lld ms with a %d ms deadline", took, limit);
    snprintf(pid, sizeof(pid), ":%d", cfg->owner_pid);
    CHECK_ERR_HAS(pid);
    CHECK_ERR_HAS(stopped ? "deadline" : "get");
    /* the peer is done for: a new get says so at once, and flush has nothing left */
    CHECK_ST(ops->get(r->peer, r->rkey, r->meta.base, dst, 64), WSYNC_ERR_PEER_LOST);
    CHECK_ERR_HAS(pid);
    CHECK_OK(ops->flush(r->ctx, wsync_deadline_in(1000)));
    free(dst);
}

static int reader_main(void *arg)
{
    const reader_cfg_t *cfg = arg;
    reader_t r;
    close_list(cfg->close_fds, 4);
    if (reader_setup(cfg, &r) != 0)
        return 1;
    switch (cfg->mode) {
    case R_BULK: reader_bulk(cfg, &r); break;
    case R_PUT: reader_put(cfg, &r); break;
    case R_BAD: reader_bad(cfg, &r); break;
    case R_OWNER_KILLED:
    case R_OWNER_STOPPED:
    case R_OWNER_STOPPED_MID: reader_owner_gone(cfg, &r); break;
    case R_KILLED: {
        char c;
        post_many(&r);
        CHECK(send_msg(cfg->ctl, "P", 1) == 0);
        recv_msg(cfg->ctl, &c, 1, MSG_MS); /* killed while waiting here */
        return 1;
    }
    }
    reader_teardown(cfg, &r);
    return check_failures ? 1 : 0;
}

/* ---- cases ----------------------------------------------------------------------------------- */

static void pair(int sv[2])
{
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        perror("socketpair");
        exit(2);
    }
}

/* One owner, one reader in `mode`. */
static void run_pair(const char *hint, int mode, int foreign_key)
{
    int sv[2];
    pair(sv);
    owner_cfg_t o = {hint, {sv[0], -1}, {sv[1], -1, -1, -1}, foreign_key};
    pid_t pids[2];
    int codes[2];
    pids[0] = proc_spawn(owner_main, &o, 120);
    reader_cfg_t rc = {hint, mode, sv[1], -1, {sv[0], -1, -1, -1}, (int)pids[0]};
    pids[1] = proc_spawn(reader_main, &rc, 120);
    close(sv[0]);
    close(sv[1]);
    proc_wait_all(pids, 2, 150000, codes);
    CHECK_MSG(codes[0] == 0, "owner exited with %d", codes[0]);
    CHECK_MSG(codes[1] == 0, "reader exited with %d", codes[1]);
}

static void case_bulk_get(void)
{
    run_pair(NULL, R_BULK, 0);
}

static void case_put_get_round_trip(void)
{
    run_pair(NULL, R_PUT, 0);
}

static void case_bad_ranges_and_keys(void)
{
    run_pair(NULL, R_BAD, 1);
}

static void case_bulk_get_tcp(void)
{
    run_pair("tcp", R_BULK, 0);
}

/* The owner is killed (or stopped) while the reader has gets posted (mode R_OWNER_*). */
static void owner_gone(int mode)
{
    int sv[2], ctl[2];
    char c = 0;
    pair(sv);
    pair(ctl);
    owner_cfg_t o = {NULL, {sv[0], -1}, {sv[1], ctl[0], ctl[1], -1}, 0};
    pid_t pids[2];
    int codes[2];
    pids[0] = proc_spawn(owner_main, &o, 120);
    reader_cfg_t rc = {NULL, mode, sv[1], ctl[1], {sv[0], ctl[0], -1, -1}, (int)pids[0]};
    pids[1] = proc_spawn(reader_main, &rc, 120);
    close(sv[0]);
    close(sv[1]);
    close(ctl[1]);
    if (mode != R_OWNER_KILLED) {
        CHECK(recv_msg(ctl[0], &c, 1, MSG_MS) == 1 && c == 'R');
        if (mode == R_OWNER_STOPPED_MID)
            usleep(10000); /* a few of 256 MiB have come: the owner stops mid-reply */
        kill(pids[0], SIGSTOP);
        CHECK(send_msg(ctl[0], "S", 1) == 0);
    } else {
        CHECK(recv_msg(ctl[0], &c, 1, MSG_MS) == 1 && c == 'P');
        kill(pids[0], SIGKILL);
        CHECK(send_msg(ctl[0], "K", 1) == 0);
    }
    proc_wait_all(&pids[1], 1, 60000, &codes[1]);
    CHECK_MSG(codes[1] == 0, "reader exited with %d", codes[1]);
    kill(pids[0], SIGKILL);
    proc_wait_all(pids, 1, 10000, codes);
    close(ctl[0]);
}

static void case_owner_killed(void)
{
    owner_gone(R_OWNER_KILLED);
}

static void case_owner_stopped_deadline(void)
{
    owner_gone(R_OWNER_STOPPED);
}

/* Stopped while replies flow: at the deadline some are half landed in the reader's buffer, and
 * flush must still return with nothing in flight. */
static void case_owner_stopped_mid_reply(void)
{
    owner_gone(R_OWNER_STOPPED_MID);
}

/* A reader killed with gets in flight leaves the owner serving: a second reader reads it all. */
static void case_reader_killed(void)
{
    int sv1[2], sv2[2], ctl[2];
    char c = 0;
    pair(sv1);
    pair(sv2);
    pair(ctl);
    owner_cfg_t o = {NULL, {sv1[0], sv2[0]}, {sv1[1], sv2[1], ctl[0], ctl[1]}, 0};
    pid_t pids[3];
    int codes[3];
    pids[0] = proc_spawn(owner_main, &o, 120);
    reader_cfg_t r1 = {NULL, R_KILLED, sv1[1], ctl[1], {sv1[0], sv2[0], sv2[1], ctl[0]},
                       (int)pids[0]};
    pids[1] = proc_spawn(reader_main, &r1, 120);
    close(sv1[0]);
    close(sv1[1]);
    close(ctl[1]);
    CHECK(recv_msg(ctl[0], &c, 1, MSG_MS) == 1 && c == 'P');
    kill(pids[1], SIGKILL);
    proc_wait_all(&pids[1], 1, 10000, &codes[1]);
    reader_cfg_t r2 = {NULL, R_BULK, sv2[1], -1, {sv2[0], ctl[0], -1, -1}, (int)pids[0]};
    pids[2] = proc_spawn(reader_main, &r2, 120);
    close(sv2[0]);
    close(sv2[1]);
    close(ctl[0]);
    proc_wait_all(&pids[2], 1, 120000, &codes[2]);
    proc_wait_all(pids, 1, 30000, codes);
    CHECK_MSG(codes[1] == 128 + SIGKILL, "the first reader exited with %d", codes[1]);
    CHECK_MSG(codes[2] == 0, "the second reader exited with %d", codes[2]);
    CHECK_MSG(codes[0] == 0, "owner exited with %d", codes[0]);
}

/* Connects, reads once (so the connection is up both ways), posts gets and then kills (or stops)
 * itself at once: the owner then serves requests of a process that is gone (or does not read). */
typedef struct {
    reader_t blobs;
    int sig;               /* SIGKILL or SIGSTOP */
} self_killer_t;

static int self_killer_main(void *arg)
{
    const self_killer_t *k = arg;
    reader_t r = k->blobs;
    uint8_t *dst = malloc(8 * MiB);
    if (dst == NULL || reader_connect(NULL, &r) != 0)
        return 1;
    CHECK_OK(ops->get(r.peer, r.rkey, r.meta.base, dst, 4096));
    CHECK_OK(ops->flush(r.ctx, wsync_deadline_in(MSG_MS)));
    for (size_t off = 0; off < 8 * MiB; off += MiB / 4)
        CHECK_OK(ops->get(r.peer, r.rkey, r.meta.base + off, dst + off, MiB / 4));
    if (check_failures)
        return 1;
    raise(k->sig);
    return 1;
}

/* Readers killed just after posting gets, one after another: each time a reply of the owner's
 * may find its reader gone. The owner must carry on (UCX 1.13's software RMA aborted it here:
 * "unexpected error: Endpoint timeout" in ucp_get_req_handler), and a last reader reads it all. */
static void case_readers_killed_mid_get(void)
{
    int sv1[2], sv2[2], codes[3];
    self_killer_t k = {.sig = SIGKILL};
    pid_t pids[3];
    pair(sv1);
    pair(sv2);
    owner_cfg_t o = {NULL, {sv1[0], sv2[0]}, {sv1[1], sv2[1], -1, -1}, 0};
    pids[0] = proc_spawn(owner_main, &o, 120);
    close(sv1[0]);
    close(sv2[0]);
    CHECK(reader_recv_blobs(sv1[1], &k.blobs) == 0);
    int status, owner_died = 0;
    for (int i = 0; i < 20 && !owner_died; i++) {
        pid_t pid = proc_spawn(self_killer_main, &k, 60);
        proc_wait_all(&pid, 1, 60000, &codes[1]);
        CHECK_MSG(codes[1] == 128 + SIGKILL, "reader %d exited with %d", i, codes[1]);
        usleep(50000); /* time for the owner to answer the dead reader */
        owner_died = waitpid(pids[0], &status, WNOHANG) == pids[0];
        CHECK_MSG(!owner_died, "the owner died (wait status 0x%x) after reader %d was killed "
                  "with gets in flight", status, i);
    }
    send_msg(sv1[1], "Q", 1);
    close(sv1[1]);
    if (owner_died) {
        close(sv2[1]);
        return;
    }
    reader_cfg_t r = {NULL, R_BULK, sv2[1], -1, {-1, -1, -1, -1}, (int)pids[0]};
    pids[2] = proc_spawn(reader_main, &r, 120);
    close(sv2[1]);
    proc_wait_all(&pids[2], 1, 120000, &codes[2]);
    proc_wait_all(pids, 1, 30000, codes);
    CHECK_MSG(codes[2] == 0, "the last reader exited with %d", codes[2]);
    CHECK_MSG(codes[0] == 0, "owner exited with %d", codes[0]);
}

/* A reader stops with gets in flight: the owner's replies wait on it. Dereg and close must still
 * return, within their bounds, and leave nothing that aborts the owner (UCX asserts in
 * ucp_worker_destroy on a rendezvous still pending). */
static void case_reader_stopped_mid_get(void)
{
    int sv[2], code, status;
    self_killer_t k = {.sig = SIGSTOP};
    pair(sv);
    owner_cfg_t o = {NULL, {sv[0], -1}, {sv[1], -1, -1, -1}, 0};
    pid_t owner = proc_spawn(owner_main, &o, 120);
    close(sv[0]);
    CHECK(reader_recv_blobs(sv[1], &k.blobs) == 0);
    pid_t reader = proc_spawn(self_killer_main, &k, 60);
    CHECK(waitpid(reader, &status, WUNTRACED) == reader && WIFSTOPPED(status));
    usleep(100000); /* the owner's replies are posted, and stuck */
    long long t0 = proc_now_ms();
    send_msg(sv[1], "Q", 1); /* the owner deregisters and closes */
    close(sv[1]);
    proc_wait_all(&owner, 1, 30000, &code);
    long long took = proc_now_ms() - t0;
    fprintf(stderr, "owner: dereg and close with a stopped reader took %lld ms\n", took);
    CHECK_MSG(code == 0, "owner exited with %d", code);
    CHECK_MSG(took < 10000, "dereg and close took %lld ms", took);
    kill(reader, SIGKILL);
    waitpid(reader, NULL, 0);
}

/* A transport list UCX does not know fails open with a sentence, no context. */
static int bad_hint_main(void *arg)
{
    (void)arg;
    wsync_rma_t *ctx = NULL;
    char info[128];
    wsync_status_t st = ops->open("no-such-transport", info, sizeof(info), &ctx);
    CHECK_MSG(st == WSYNC_ERR_UNSUPPORTED || st == WSYNC_ERR_INVALID, "open returned %s",
              wsync_status_name(st));
    CHECK_ERR_HAS("no-such-transport");
    CHECK(ctx == NULL);
    return check_failures ? 1 : 0;
}

static void case_unknown_hint(void)
{
    int code;
    pid_t pid = proc_spawn(bad_hint_main, NULL, 60);
    proc_wait_all(&pid, 1, 60000, &code);
    CHECK_MSG(code == 0, "child exited with %d", code);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    ops = wsync_rma_ucx();
    if (ops == NULL) {
        printf("skipped: built without UCX\n");
        return 0;
    }
    RUN(case_bulk_get);
    RUN(case_put_get_round_trip);
    RUN(case_bad_ranges_and_keys);
    RUN(case_owner_killed);
    RUN(case_bulk_get_tcp);
    RUN(case_owner_stopped_deadline);
    RUN(case_owner_stopped_mid_reply);
    RUN(case_reader_killed);
    RUN(case_readers_killed_mid_get);
    RUN(case_reader_stopped_mid_get);
    RUN(case_unknown_hint);
    return check_summary();
}
