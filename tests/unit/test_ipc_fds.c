/* schemes/ipc_share.c's reading of a sender's DATA_FDS (wsync_ipc_take_data_fds), for a receiver
 * whose one host target is fed by one chunk (4 x 64 bf16, 512 bytes) of sender 0, staged in
 * bucket 0 at offset 0: the message as a sender writes it is taken (its slots mapped, the
 * sender's bytes readable there); every malformed one is refused with WSYNC_ERR_PROTOCOL naming
 * the sender and what is wrong; and the descriptors that came with it are closed either way.
 * The messages are written here, field by field, from the layout wsync_ipc_send_fds documents. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/objects.h"
#include "schemes/ipc_internal.h"
#include "tests/support/check.h"
#include "transports/shm.h"
#include "wsync/wsync.h"

#define CHUNK_BYTES 512

/* ---- a message ------------------------------------------------------------------------------ */

typedef struct {
    uint8_t b[512];
    uint32_t n;
} msg_t;

static void put32(msg_t *m, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        m->b[m->n++] = (uint8_t)(v >> (8 * i));
}

static void put64(msg_t *m, uint64_t v)
{
    put32(m, (uint32_t)v);
    put32(m, (uint32_t)(v >> 32));
}

/* The fields of a DATA_FDS message without CUDA memory: host slots, delta slots, host regions and
 * the host in-place shards' table, device slots, bucket slots. */
typedef struct {
    uint32_t nslots;
    uint64_t slot_bytes;
    uint32_t ndelta;
    uint64_t delta_bytes;
    uint32_t nregions;
    uint64_t region_bytes[2];
    uint32_t ninplace;               /* entries (shard 0, region 0, offset 0) */
    uint32_t nbuckets;
    uint32_t slot[2];
    uint32_t cuda;
} fields_t;

static fields_t good(void)
{
    fields_t f = {1, 4096, 0, 0, 0, {0, 0}, 0, 1, {0, 0}, 0};
    return f;
}

static msg_t encode(const fields_t *f)
{
    msg_t m = {{0}, 0};
    put32(&m, f->nslots);
    put64(&m, f->slot_bytes);
    put32(&m, f->ndelta);
    put64(&m, f->delta_bytes);
    put32(&m, f->nregions);
    for (uint32_t g = 0; g < f->nregions; g++)
        put64(&m, f->region_bytes[g]);
    put32(&m, f->ninplace);
    for (uint32_t i = 0; i < f->ninplace; i++) {
        put32(&m, 0);   /* shard */
        put32(&m, 0);   /* region */
        put64(&m, 0);   /* offset */
    }
    put32(&m, 0);       /* device slots */
    put64(&m, 0);
    put32(&m, 0);
    put32(&m, 0);       /* CUDA in-place shards */
    put32(&m, f->nbuckets);
    for (uint32_t k = 0; k < f->nbuckets; k++)
        put32(&m, f->slot[k]);
    put32(&m, f->cuda);
    return m;
}

/* ---- a receiver ----------------------------------------------------------------------------- */

static wsync_chunk_t chunk;
static wsync_segment_t seg;
static wsync_plan_t plan;
static wsync_piece_desc_t piece;
static wsync_target_desc_t target;
static wsync_receiver_t rx;
static wsync_conn_t conn;
static uint32_t seg_start[2] = {0, 1}, chunk_start[2] = {0, 1};

static void setup(void)
{
    wsync_region_t r = {0, 64, 4, 64};
    chunk = (wsync_chunk_t){0};
    chunk.dtype = WSYNC_DTYPE_BF16;
    chunk.src = r;
    seg = (wsync_segment_t){0, 0, 0, 0, r};
    plan = (wsync_plan_t){0};
    plan.nsenders = 1;
    plan.nreceivers = 1;
    plan.nchunks = 1;
    plan.chunks = &chunk;
    piece = (wsync_piece_desc_t){0};
    piece.param.name = "model.embed_tokens.weight";
    target = (wsync_target_desc_t){0};
    target.name = "embed";
    target.mem = WSYNC_MEM_HOST;
    target.npieces = 1;
    target.pieces = &piece;
    memset(&rx, 0, sizeof(rx));
    rx.m.rank = 0;
    rx.m.plan = &plan;
    rx.m.segs = &seg;
    rx.m.nsegs = 1;
    rx.targets = &target;
    rx.ntargets = 1;
    rx.device = -1;
    snprintf(conn.name, sizeof(conn.name), "sender 0");
}

static void fresh(ipc_from_t *f)
{
    memset(f, 0, sizeof(*f));
    f->conn = &conn;
    f->nbuckets = 1;
    f->seg_start = seg_start;
    f->chunk_start = chunk_start;
    f->flags = HELLO_HOST;
    f->shm.fd = -1;
}

static void release(ipc_from_t *f)
{
    wsync_shm_release(&f->shm);
    for (uint32_t g = 0; g < f->nregions; g++)
        wsync_shm_release(&f->regions[g]);
    free(f->inplace);
    free(f->slot_of);
}

static int closed(int fd)
{
    errno = 0;
    return fcntl(fd, F_GETFD) == -1 && errno == EBADF;
}

/* A sealed segment of `bytes` whose byte i is i * 3 + 1; its descriptor (the segment's own kept
 * in *own for the caller to release). */
static int segment(size_t bytes, wsync_shm_t *own)
{
    CHECK_OK(wsync_shm_create("wsync-test-fds", bytes, own));
    if (own->base == NULL)
        return -1;
    for (size_t i = 0; i < bytes; i++)
        ((uint8_t *)own->base)[i] = (uint8_t)(i * 3 + 1);
    return dup(own->fd);
}

/* Take message m with descriptors fds[0 .. n): the status; every descriptor taken, and when
 * refused, closed (taken ones are closed by release). */
static wsync_status_t take(ipc_from_t *f, const msg_t *m, int *fds, uint32_t n)
{
    int copy[4];
    memcpy(copy, fds, n * sizeof(*fds));
    wsync_status_t rc = wsync_ipc_take_data_fds(&rx, f, m->b, m->n, fds, n);
    for (uint32_t i = 0; i < n; i++)
        CHECK_MSG(fds[i] == -1 && (rc == WSYNC_OK || closed(copy[i])),
                  "descriptor %u of %u left open", i, n);
    return rc;
}

/* ---- cases ---------------------------------------------------------------------------------- */

static void case_taken(void)
{
    ipc_from_t f;
    wsync_shm_t own = {-1, NULL, 0};
    fields_t fl = good();
    msg_t m = encode(&fl);
    int fd = segment(4096, &own), given = fd;
    fresh(&f);
    CHECK_OK(take(&f, &m, &fd, 1));
    CHECK(f.nslots == 1 && f.slot_bytes == 4096 && f.slot_of != NULL && f.slot_of[0] == 0);
    CHECK(f.shm.base != NULL && f.shm.bytes == 4096);
    if (f.shm.base != NULL)
        CHECK(memcmp(f.shm.base, own.base, 4096) == 0);
    release(&f);
    CHECK_MSG(closed(given), "the slots' descriptor is still open after the release");
    wsync_shm_release(&own);
}

/* A message with one field made wrong, taken with the descriptors a sender would send for it;
 * the error must name the sender and `why`. */
static void refused(const fields_t *fl, const msg_t *m, uint32_t nfds, const char *why)
{
    ipc_from_t f;
    wsync_shm_t own[3] = {{-1, NULL, 0}, {-1, NULL, 0}, {-1, NULL, 0}};
    int fds[3];
    uint64_t sizes[3] = {fl->nslots * fl->slot_bytes, fl->nregions ? fl->region_bytes[0] : 0,
                         4096};
    for (uint32_t i = 0; i < nfds; i++)
        fds[i] = segment(sizes[i] > 0 && sizes[i] <= 16384 ? sizes[i] : 4096, &own[i]);
    fresh(&f);
    CHECK_ST(take(&f, m, fds, nfds), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("ipc: receiver 0");
    CHECK_ERR_HAS(why);
    release(&f);
    for (uint32_t i = 0; i < nfds; i++)
        wsync_shm_release(&own[i]);
}

static void case_malformed(void)
{
    fields_t fl;
    msg_t m;

    fl = good();
    m = encode(&fl);
    m.n = 10;
    refused(&fl, &m, 1, "malformed DATA_FDS from sender 0: truncated header");

    fl = good();
    fl.nslots = 3;
    m = encode(&fl);
    refused(&fl, &m, 1, "sender 0: too many host slots (3 host slots of 4096 bytes");

    fl = good();
    fl.slot_bytes = 0;
    m = encode(&fl);
    refused(&fl, &m, 1, "bad host slot size");

    fl = good();
    fl.ndelta = 1;
    fl.delta_bytes = 4096;
    m = encode(&fl);
    refused(&fl, &m, 2, "1 delta slots of 4096 bytes while the group's delta mode is off");

    fl = good();
    fl.slot[0] = 1;   /* one slot shared: slot 1 is not */
    m = encode(&fl);
    refused(&fl, &m, 1, "a bucket names a slot that was not shared");

    fl = good();
    fl.nbuckets = 2;
    m = encode(&fl);
    refused(&fl, &m, 1, "bucket count differs from the plan's (0 in-place, 0 CUDA in-place "
            "shards; 2 buckets, plan has 1");

    fl = good();
    m = encode(&fl);
    refused(&fl, &m, 0, "fewer descriptors than host memory needs (0 descriptors, 1 for host");

    fl = good();
    m = encode(&fl);
    refused(&fl, &m, 2, "2 descriptors for host memory that needs 1, and no CUDA memory");

    fl = good();
    m = encode(&fl);
    m.b[m.n++] = 0;
    refused(&fl, &m, 1, "malformed DATA_FDS table from sender 0: trailing bytes");

    fl = good();
    fl.cuda = 2;
    m = encode(&fl);
    refused(&fl, &m, 1, "bad CUDA flag");

    fl = good();
    fl.cuda = 1;   /* no segment from it lands in a CUDA target here (HELLO_GPU not sent) */
    m = encode(&fl);
    refused(&fl, &m, 1, "sender 0 shares CUDA memory, but no segment from it lands in a CUDA "
            "target here");

    fl = good();
    fl.ninplace = 1;   /* shard 0 in region 0, but no region shared */
    m = encode(&fl);
    refused(&fl, &m, 1, "host in-place shard in no region");
}

static void case_outside(void)
{
    fields_t fl = good();
    fl.slot_bytes = CHUNK_BYTES - 64;   /* the chunk's 512 bytes do not fit its slot */
    msg_t m = encode(&fl);
    refused(&fl, &m, 1, "sender 0's slots (448 bytes) cannot hold its plan");

    fl = good();
    fl.nslots = 0;        /* shard 0 read in place from region 0, which ends before it does */
    fl.nregions = 1;
    fl.region_bytes[0] = CHUNK_BYTES - 2;
    fl.ninplace = 1;
    fl.slot[0] = NO_SLOT;
    m = encode(&fl);
    refused(&fl, &m, 1, "sender 0's shard 0 lies outside the memory it shared");

    fl.region_bytes[0] = CHUNK_BYTES;   /* exactly its bytes: taken */
    m = encode(&fl);
    ipc_from_t f;
    wsync_shm_t own = {-1, NULL, 0};
    int fd = segment(CHUNK_BYTES, &own), given = fd;
    fresh(&f);
    CHECK_OK(take(&f, &m, &fd, 1));
    CHECK(f.nregions == 1 && f.inplace != NULL && f.inplace[0].region == 0 &&
          f.regions[0].base != NULL);
    release(&f);
    CHECK_MSG(closed(given), "the region's descriptor is still open after the release");
    wsync_shm_release(&own);
}

static void case_unsealed(void)
{
    fields_t fl = good();
    msg_t m = encode(&fl);
    ipc_from_t f;
    int fd = memfd_create("wsync-test-unsealed", MFD_CLOEXEC);
    CHECK(fd >= 0 && ftruncate(fd, 4096) == 0);
    fresh(&f);
    CHECK_ST(take(&f, &m, &fd, 1), WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("ipc: receiver 0: sender 0's host slots");
    CHECK(f.shm.base == NULL);
    release(&f);
}

int main(void)
{
    setup();
    RUN(case_taken);
    RUN(case_malformed);
    RUN(case_outside);
    RUN(case_unsealed);
    return check_summary();
}
